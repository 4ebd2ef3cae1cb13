//! Cluster bootstrap through a discovery service (issue 8): etcd 3.6's v3 discovery
//! (`--discovery-token`, `--discovery-endpoints`) and the v2 protocol (`--discovery <url>`),
//! with the discovery service being our own server and etcd 3.4 (`/usr/bin/etcd`, with
//! `--enable-v2` for the v2 protocol). Our server hosting v2 discovery (the v2 keys subset and
//! `/new?size=N`) is driven with the clustering guide's curl commands.
//!
//! Members are real processes, `m<i>` on `127.0.0.<i + 2>`, with fast raft timers. Each test
//! prints the bootstrap time of its 3-member cluster (spawn of the first member to all three
//! ready): `cargo nextest run -p etcdrs --test it discovery --no-capture`.
//!
//! v3 discovery is etcd 3.6's, which etcd 3.4 does not have: those tests run our members only.
//! The v2 tests also pass with `ETCDRS_TEST_ETCD_BIN=/usr/bin/etcd` as the members, except
//! where a comment says etcd 3.4 would fall back to proxy mode.

use std::time::{Duration, Instant};

use etcdrs_testkit::{EtcdBin, Member, MemberOpts, poll_until};

use crate::bin;

/// Deadline for every state the tests wait for (2 cores, several clusters at once).
const WAIT: Duration = Duration::from_secs(25);

/// etcd 3.4, the reference discovery service.
fn etcd34() -> EtcdBin {
    EtcdBin::at("/usr/bin/etcd")
}

/// A single-member discovery service: ours, or etcd 3.4 with the v2 API on.
async fn service(reference: bool) -> Member {
    let opts = if reference {
        MemberOpts::new(&etcd34()).arg("--enable-v2")
    } else {
        MemberOpts::new(&bin())
    };
    Member::start(opts.name("disc").fast_timers())
        .await
        .expect("discovery service starts")
}

/// Options of discovery member `i`: no `--initial-cluster`, the discovery flags instead.
fn member_opts(i: usize, discovery: &[String]) -> MemberOpts {
    MemberOpts::new(&bin())
        .name(format!("m{i}"))
        .host(std::net::Ipv4Addr::new(
            127,
            0,
            0,
            u8::try_from(i + 2).expect("small"),
        ))
        .initial_cluster("")
        .fast_timers()
        .args(discovery.iter().cloned())
        .ready_timeout(WAIT)
}

fn v3_flags(service: &Member, token: &str) -> Vec<String> {
    vec![
        format!("--discovery-token={token}"),
        format!("--discovery-endpoints={}", service.endpoint()),
    ]
}

fn v2_flags(url: &str) -> Vec<String> {
    vec![format!("--discovery={url}")]
}

/// Spawns `n` members at once and waits until each is ready; returns them with the time it
/// took.
async fn bootstrap(n: usize, discovery: &[String]) -> (Vec<Member>, Duration) {
    let started = Instant::now();
    let mut members: Vec<Member> = (0..n)
        .map(|i| Member::spawn(member_opts(i, discovery)).expect("member spawns"))
        .collect();
    for m in &mut members {
        m.wait_ready().await.expect("member becomes ready");
    }
    (members, started.elapsed())
}

/// The member names the cluster reports, sorted, once every member has published its name.
async fn member_names(member: &Member, n: usize) -> Vec<String> {
    poll_until(WAIT, || async {
        let mut client = member.client().await?;
        let resp = client.member_list().await?;
        let mut names: Vec<String> = resp.members().iter().map(|m| m.name().to_owned()).collect();
        names.sort();
        anyhow::ensure!(
            names.len() == n && names.iter().all(|n| !n.is_empty()),
            "members so far: {names:?}"
        );
        Ok(names)
    })
    .await
    .expect("every member published")
}

/// Checks the cluster works end to end: names, and a write on one member read on another.
async fn check_cluster(members: &[Member]) {
    let names = member_names(&members[0], members.len()).await;
    assert_eq!(names, ["m0", "m1", "m2"]);
    let mut first = members[0].client().await.expect("client");
    first.put("discovered", "yes", None).await.expect("put");
    let mut last = members[members.len() - 1].client().await.expect("client");
    let got = last.get("discovered", None).await.expect("get");
    assert_eq!(got.kvs()[0].value(), b"yes");
}

/// Whether the members are ours (not `ETCDRS_TEST_ETCD_BIN`). etcd 3.4 logs with capnslog
/// (other texts) and leaves a `member` directory behind a failed discovery.
fn ours() -> bool {
    std::env::var_os("ETCDRS_TEST_ETCD_BIN").is_none()
}

/// A member that must fail at start: exit status 1, these log lines, and no data dir.
async fn expect_refused(opts: MemberOpts, messages: &[&str]) {
    let mut member = Member::spawn(opts).expect("member spawns");
    let status = member
        .wait_exit(WAIT)
        .await
        .expect("member exits by itself");
    let log = member.log();
    assert_eq!(status.code(), Some(1), "exit status; log:\n{log}");
    if !ours() {
        return;
    }
    for message in messages {
        assert!(log.contains(message), "log lacks {message:?}:\n{log}");
    }
    // Nothing half-bootstrapped that a restart could misread.
    assert!(
        !member.data_dir().join("member").exists(),
        "a failed bootstrap left {}",
        member.data_dir().display()
    );
}

async fn v3_three_members_then_full(reference: bool) {
    let service = service(reference).await;
    let token = format!("v3-{}", std::process::id());
    let mut client = service.client().await.expect("client");
    client
        .put(format!("/_etcd/registry/{token}/_config/size"), "3", None)
        .await
        .expect("size");
    let flags = v3_flags(&service, &token);
    let (members, took) = bootstrap(3, &flags).await;
    eprintln!(
        "bootstrap time, 3 members, v3 discovery on {}: {} ms",
        if reference { "etcd 3.4" } else { "etcd-rs" },
        took.as_millis()
    );
    check_cluster(&members).await;
    // The registry holds the three, by member id.
    let registered = client
        .get(
            format!("/_etcd/registry/{token}/members/"),
            Some(etcd_client::GetOptions::new().with_prefix()),
        )
        .await
        .expect("registry");
    assert_eq!(registered.kvs().len(), 3);

    // A fourth member finds the cluster full, before registering.
    expect_refused(
        member_opts(3, &flags),
        &[
            "discovery: cluster is full",
            "failed to bootstrap; discovery token was already used",
            "do not reuse discovery token; generate a new one to bootstrap a cluster",
        ],
    )
    .await;
    let after = client
        .get(
            format!("/_etcd/registry/{token}/members/"),
            Some(etcd_client::GetOptions::new().with_prefix()),
        )
        .await
        .expect("registry");
    assert_eq!(after.kvs().len(), 3, "the refused member did not register");
}

#[tokio::test]
async fn v3_discovery_through_our_server_bootstraps_three_and_refuses_a_fourth() {
    v3_three_members_then_full(false).await;
}

#[tokio::test]
async fn v3_discovery_through_etcd34_bootstraps_three_and_refuses_a_fourth() {
    v3_three_members_then_full(true).await;
}

#[tokio::test]
async fn v3_discovery_token_without_size_fails() {
    let service = service(false).await;
    expect_refused(
        member_opts(0, &v3_flags(&service, "no-size")),
        &["discovery: size key not found", "discovery failed"],
    )
    .await;
}

#[tokio::test]
async fn v3_discovery_reused_token_fails_for_a_new_cluster() {
    // A token that bootstrapped a cluster once cannot bootstrap another: the new members
    // (other addresses, so other ids) find it full.
    let service = service(true).await;
    let token = format!("reuse-{}", std::process::id());
    let mut client = service.client().await.expect("client");
    client
        .put(format!("/_etcd/registry/{token}/_config/size"), "1", None)
        .await
        .expect("size");
    let flags = v3_flags(&service, &token);
    let mut first = Member::spawn(member_opts(0, &flags)).expect("spawn");
    first
        .wait_ready()
        .await
        .expect("single-member cluster from discovery");
    expect_refused(
        member_opts(1, &flags).name("m0"),
        &["discovery: cluster is full"],
    )
    .await;
}

/// Runs the stock `curl -s` with `args`; returns its stdout.
fn curl(args: &[&str]) -> String {
    let out = std::process::Command::new("curl")
        .arg("-s")
        .args(args)
        .output()
        .expect("curl runs");
    assert!(out.status.success(), "curl {args:?}: {out:?}");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The registry directory of a v2 token URL, as JSON.
fn v2_registry(url: &str) -> serde_json::Value {
    serde_json::from_str(&curl(&[url])).expect("v2 JSON")
}

async fn v2_three_members_then_full(url: &str, service_name: &str) {
    let created = curl(&["-X", "PUT", &format!("{url}/_config/size"), "-d", "value=3"]);
    assert!(created.contains(r#""value":"3""#), "{created}");
    let flags = v2_flags(url);
    let (members, took) = bootstrap(3, &flags).await;
    eprintln!(
        "bootstrap time, 3 members, v2 discovery on {service_name}: {} ms",
        took.as_millis()
    );
    check_cluster(&members).await;
    let registry = v2_registry(url);
    let nodes = registry["node"]["nodes"].as_array().expect("nodes");
    // The three members; `_config` is hidden, as every v2 key starting with `_`.
    assert_eq!(nodes.len(), 3, "{registry}");

    // etcd 3.4 would fall back to a v2 proxy by default; with `exit` it stops.
    let mut full = flags.clone();
    full.push("--discovery-fallback=exit".to_owned());
    expect_refused(
        member_opts(3, &full),
        &[
            "discovery: cluster is full",
            "failed to bootstrap; discovery token was already used",
        ],
    )
    .await;
    let nodes = v2_registry(url)["node"]["nodes"]
        .as_array()
        .map_or(0, Vec::len);
    assert_eq!(nodes, 3, "the refused member did not register");
}

#[tokio::test]
async fn v2_discovery_through_etcd34_bootstraps_three_and_refuses_a_fourth() {
    let service = service(true).await;
    let url = format!(
        "{}/v2/keys/discovery/v2-{}",
        service.endpoint(),
        std::process::id()
    );
    v2_three_members_then_full(&url, "etcd 3.4").await;
}

#[tokio::test]
async fn v2_discovery_token_used_by_a_failed_attempt_is_refused() {
    // A member that registered and died before the cluster formed cannot use the token
    // again: its id is taken (etcd's "member has been registered with discovery service").
    let service = service(true).await;
    let url = format!(
        "{}/v2/keys/discovery/dup-{}",
        service.endpoint(),
        std::process::id()
    );
    curl(&["-X", "PUT", &format!("{url}/_config/size"), "-d", "value=2"]);
    let mut member = Member::spawn(member_opts(0, &v2_flags(&url))).expect("spawn");
    poll_until(WAIT, || async {
        let nodes = v2_registry(&url)["node"]["nodes"]
            .as_array()
            .map_or(0, Vec::len);
        anyhow::ensure!(nodes == 1, "{nodes} nodes");
        Ok(())
    })
    .await
    .expect("the member registers");
    member.kill9().expect("kill");
    assert!(!ours() || !member.data_dir().join("member").exists());
    assert!(
        member.restart().await.is_err(),
        "the second attempt must fail"
    );
    let status = member.wait_exit(WAIT).await.expect("exits");
    assert_eq!(status.code(), Some(1));
    if !ours() {
        return;
    }
    let log = member.log();
    for message in [
        "discovery: found duplicate id",
        "member has been registered with discovery service",
        "or use a new discovery token if previous bootstrap failed",
    ] {
        assert!(log.contains(message), "log lacks {message:?}:\n{log}");
    }
    assert!(!member.data_dir().join("member").exists());
}
