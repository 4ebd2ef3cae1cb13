//! Cluster bootstrap without a static `--initial-cluster` (issue 8), by the clustering
//! guide's other two methods:
//!
//! - a discovery service: etcd 3.6's v3 discovery (`--discovery-token`,
//!   `--discovery-endpoints`, plain, mutual TLS, user/password) and the v2 protocol
//!   (`--discovery <url>`, also through `ETCD_DISCOVERY_PROXY`), with the service being our
//!   own server (a single member or a 3-member cluster) and etcd 3.4 (`/usr/bin/etcd`, with
//!   `--enable-v2` for the v2 protocol). Our server hosting v2 discovery (the v2 keys subset and
//!   `/new?size=N`) is driven with the guide's curl commands. Full tokens, reused tokens,
//!   missing size keys and refused credentials fail with exit status 1 and leave no data dir.
//! - DNS SRV (`--discovery-srv`, `--discovery-srv-name`), with a real DNS server on loopback
//!   (`testkit::dns::DnsServer`, reached through `ETCDRS_DNS_SERVER`).
//!
//! Members are real processes, `m<i>` on `127.0.0.<i + 2>`, with fast raft timers. Tests print
//! the bootstrap time of their cluster (spawn of the first member to all ready):
//! `cargo nextest run -p etcdrs --test it discovery --no-capture`.
//!
//! v3 discovery is etcd 3.6's and the SRV resolver override is ours, so with
//! `ETCDRS_TEST_ETCD_BIN=/usr/bin/etcd` those tests return early; the v2 tests pass with etcd
//! 3.4 members too (log texts and data-dir checks are then skipped: etcd 3.4 logs with capnslog
//! and leaves a `member` directory behind a failed discovery).

use std::time::{Duration, Instant};

use etcdrs_testkit::{
    Captured, Cluster, ClusterOpts, EtcdBin, Member, MemberOpts, Relay, poll_until,
};

use crate::bin;
use crate::ours;

/// Deadline for every state the tests wait for (2 cores, several clusters at once).
const WAIT: Duration = Duration::from_secs(25);

/// etcd 3.4, the reference discovery service.
fn etcd34() -> EtcdBin {
    EtcdBin::at("/usr/bin/etcd")
}

/// Our server, whatever `ETCDRS_TEST_ETCD_BIN` says (as the discovery service).
fn etcdrs() -> EtcdBin {
    EtcdBin::at(env!("CARGO_BIN_EXE_etcd"))
}

/// A single-member discovery service, ours or etcd 3.4, with the v2 API on (`--enable-v2`).
async fn service(reference: bool) -> Member {
    // Members here ping their watches every 1 s (`--discovery-keepalive-time=1s`), faster
    // than the 5 s etcd's policy allows: the service allows it, as it must for them.
    service_pinged_every(reference, "500ms").await
}

/// [`service`] with `--grpc-keepalive-min-time=<min_time>`.
async fn service_pinged_every(reference: bool, min_time: &str) -> Member {
    let bin = if reference { etcd34() } else { etcdrs() };
    let opts = MemberOpts::new(&bin)
        .arg("--enable-v2")
        .arg(format!("--grpc-keepalive-min-time={min_time}"));
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
    let expected: Vec<String> = (0..members.len()).map(|i| format!("m{i}")).collect();
    assert_eq!(names, expected);
    let mut first = members[0].client().await.expect("client");
    first.put("discovered", "yes", None).await.expect("put");
    let mut last = members[members.len() - 1].client().await.expect("client");
    let got = last.get("discovered", None).await.expect("get");
    assert_eq!(got.kvs()[0].value(), b"yes");
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
    if !ours() {
        return; // etcd 3.4 members have no v3 discovery.
    }
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

    // A bootstrapped member restarts from its data dir, without the discovery service.
    drop(client);
    drop(service);
    let mut members = members;
    members[0]
        .restart()
        .await
        .expect("restart without discovery");
    check_cluster(&members).await;
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
async fn v3_discovery_bootstraps_five_members() {
    if !ours() {
        return; // etcd 3.4 members have no v3 discovery.
    }
    let service = service(false).await;
    let token = format!("five-{}", std::process::id());
    let mut client = service.client().await.expect("client");
    client
        .put(format!("/_etcd/registry/{token}/_config/size"), "5", None)
        .await
        .expect("size");
    let (members, took) = bootstrap(5, &v3_flags(&service, &token)).await;
    eprintln!(
        "bootstrap time, 5 members, v3 discovery on etcd-rs: {} ms",
        took.as_millis()
    );
    check_cluster(&members).await;
}

#[tokio::test]
async fn v3_discovery_watches_again_at_once_when_the_service_ends_a_pinging_watch() {
    // A service with etcd's policy (5 s between pings while a call is open) and a member that
    // pings its watch every 1 s: the service sends the member's connection away at the third
    // strike (about 4 s in). The member watches again at once, with no back-off (clientv3's
    // watch re-establishes itself), and the cluster forms as the others come.
    if !ours() {
        return; // etcd 3.4 members have no v3 discovery.
    }
    let service = service_pinged_every(false, "5s").await;
    let token = format!("sent-away-{}", std::process::id());
    let mut client = service.client().await.expect("client");
    client
        .put(format!("/_etcd/registry/{token}/_config/size"), "3", None)
        .await
        .expect("size");
    let mut flags = v3_flags(&service, &token);
    flags.push("--discovery-keepalive-time=1s".into());
    let first = Member::spawn(member_opts(0, &flags)).expect("spawn");
    wait_log(
        &first,
        "the discovery service ended the watch; watching again",
    )
    .await;
    assert!(
        !first.log_contains("retry connecting to discovery service"),
        "{}",
        first.log_tail(20)
    );
    let mut members = vec![first];
    for i in 1..3 {
        members.push(Member::spawn(member_opts(i, &flags)).expect("spawn"));
    }
    for m in &mut members {
        m.wait_ready()
            .await
            .unwrap_or_else(|e| panic!("{e}\n{}", m.log_tail(30)));
    }
    check_cluster(&members).await;
}

#[tokio::test]
async fn v3_discovery_token_without_size_fails() {
    if !ours() {
        return; // etcd 3.4 members have no v3 discovery.
    }
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
    if !ours() {
        return; // etcd 3.4 members have no v3 discovery.
    }
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
    // Each registered under the id it runs with (derived, as in etcd, with the discovery URL
    // as the cluster token).
    let mut registered: Vec<String> = nodes
        .iter()
        .filter_map(|n| n["key"].as_str()?.rsplit('/').next().map(str::to_owned))
        .collect();
    registered.sort();
    let mut client = members[0].client().await.expect("client");
    let list = client.member_list().await.expect("member list");
    let mut running: Vec<String> = list
        .members()
        .iter()
        .map(|m| format!("{:x}", m.id()))
        .collect();
    running.sort();
    assert_eq!(registered, running);

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

#[tokio::test]
async fn v2_discovery_through_our_server_bootstraps_three_and_refuses_a_fourth() {
    let service = service(false).await;
    let url = format!(
        "{}/v2/keys/discovery/v2-{}",
        service.endpoint(),
        std::process::id()
    );
    v2_three_members_then_full(&url, "etcd-rs").await;
}

#[tokio::test]
async fn clustering_guide_curl_commands_against_our_server() {
    // The guide's "custom etcd discovery service" commands, verbatim but for the address,
    // answered as etcd 3.4 --enable-v2 answers them.
    let service = service(false).await;
    let base = service.endpoint();
    let token = "6c007a14875d53d9bf0ef5a6fc0257c817f0fb83";
    let set = curl(&[
        "-X",
        "PUT",
        &format!("{base}/v2/keys/discovery/{token}/_config/size"),
        "-d",
        "value=3",
    ]);
    let set: serde_json::Value = serde_json::from_str(&set).expect("JSON");
    assert_eq!(set["action"], "set");
    assert_eq!(
        set["node"]["key"],
        format!("/discovery/{token}/_config/size")
    );
    assert_eq!(set["node"]["value"], "3");
    let index = set["node"]["modifiedIndex"].as_i64().expect("index");
    assert_eq!(set["node"]["createdIndex"].as_i64(), Some(index));
    // Reading it back, with etcd's index header.
    let out = std::process::Command::new("curl")
        .args([
            "-s",
            "-i",
            &format!("{base}/v2/keys/discovery/{token}/_config/size"),
        ])
        .output()
        .expect("curl");
    let text = String::from_utf8_lossy(&out.stdout).to_lowercase();
    assert!(text.starts_with("http/1.1 200"), "{text}");
    assert!(text.contains(&format!("x-etcd-index: {index}")), "{text}");
    // A second create of the same key is refused with etcd's error.
    let member = format!("{base}/v2/keys/discovery/{token}/abc?prevExist=false");
    curl(&["-X", "PUT", &member, "-d", "value=m=http://127.0.0.1:1"]);
    let again: serde_json::Value = serde_json::from_str(&curl(&[
        "-X",
        "PUT",
        &member,
        "-d",
        "value=m=http://127.0.0.1:1",
    ]))
    .expect("JSON");
    assert_eq!(again["errorCode"], 105);
    assert_eq!(again["message"], "Key already exists");
    assert_eq!(again["cause"], format!("/discovery/{token}/abc"));
    // The public service's API: a fresh token URL for a size.
    let url = curl(&[&format!("{base}/new?size=3")]);
    assert!(
        url.starts_with(&format!("{base}/v2/keys/_etcd/registry/")),
        "{url}"
    );
    let (members, took) = bootstrap(3, &v2_flags(url.trim())).await;
    eprintln!(
        "bootstrap time, 3 members, v2 discovery (/new token) on etcd-rs: {} ms",
        took.as_millis()
    );
    check_cluster(&members).await;
}

#[tokio::test]
async fn v2_discovery_served_by_every_member_of_our_cluster() {
    // The registry is replicated: the size is set through one member of a 3-member discovery
    // cluster, the new members register through another, and a long poll on the third sees
    // their registrations. (Every new member must use the same URL: as in etcd, the URL is
    // the cluster token their ids derive from.)
    let service = Cluster::start(3, ClusterOpts::new(&etcdrs()).arg("--enable-v2"))
        .await
        .expect("discovery cluster starts");
    let token = format!("spread-{}", std::process::id());
    let url = |i: usize| format!("{}/v2/keys/discovery/{token}", service.member(i).endpoint());
    curl(&[
        "-X",
        "PUT",
        &format!("{}/_config/size", url(1)),
        "-d",
        "value=3",
    ]);
    let poll_url = format!("{}?wait=true&recursive=true", url(2));
    let poll = std::thread::spawn(move || curl(&[&poll_url]));
    let (members, took) = bootstrap(3, &v2_flags(&url(0))).await;
    eprintln!(
        "bootstrap time, 3 members, v2 discovery on a 3-member etcd-rs cluster: {} ms",
        took.as_millis()
    );
    check_cluster(&members).await;
    let event: serde_json::Value =
        serde_json::from_str(&poll.join().expect("long poll")).expect("JSON");
    assert_eq!(event["action"], "set", "{event}");
    assert!(
        event["node"]["value"]
            .as_str()
            .is_some_and(|v| v.starts_with('m') && v.contains("=http://127.0.0.")),
        "{event}"
    );
    let registry = v2_registry(&url(2));
    assert_eq!(
        registry["node"]["nodes"].as_array().map_or(0, Vec::len),
        3,
        "{registry}"
    );
}

/// etcd 3.4 serving clients over TLS and requiring client certificates signed by `ca`.
struct TlsService {
    endpoint: String,
    _child: tokio::process::Child,
    _ports: (
        etcdrs_testkit::ports::PortLease,
        etcdrs_testkit::ports::PortLease,
    ),
}

async fn tls_etcd34(dir: &std::path::Path, ca: &etcdrs_testkit::certs::TestCa) -> TlsService {
    let server = ca.issue_loopback("server", "etcd").expect("server cert");
    let client_port = etcdrs_testkit::ports::reserve().expect("port");
    let peer_port = etcdrs_testkit::ports::reserve().expect("port");
    let endpoint = format!("https://127.0.0.1:{}", client_port.port());
    let peer = format!("http://127.0.0.1:{}", peer_port.port());
    let log = std::fs::File::create(dir.join("service.log")).expect("log");
    let child = tokio::process::Command::new("/usr/bin/etcd")
        .arg(format!("--data-dir={}", dir.join("service").display()))
        .arg(format!("--listen-client-urls={endpoint}"))
        .arg(format!("--advertise-client-urls={endpoint}"))
        .arg(format!("--listen-peer-urls={peer}"))
        .arg(format!("--initial-advertise-peer-urls={peer}"))
        .arg(format!("--initial-cluster=default={peer}"))
        .arg(format!("--cert-file={}", server.cert.display()))
        .arg(format!("--key-file={}", server.key.display()))
        .arg(format!("--trusted-ca-file={}", ca.ca_file().display()))
        .arg("--client-cert-auth")
        .stdout(std::process::Stdio::null())
        .stderr(log)
        .kill_on_drop(true)
        .spawn()
        .expect("etcd 3.4 with TLS");
    TlsService {
        endpoint,
        _child: child,
        _ports: (client_port, peer_port),
    }
}

#[tokio::test]
async fn v3_discovery_over_tls_with_client_certificates() {
    if !ours() {
        return; // etcd 3.4 members have no v3 discovery.
    }
    let dir = tempfile::tempdir().expect("tempdir");
    let ca = etcdrs_testkit::certs::TestCa::new(dir.path(), "ca").expect("ca");
    let client = ca
        .issue_loopback("client", "discovery")
        .expect("client cert");
    let service = tls_etcd34(dir.path(), &ca).await;
    let token = format!("tls-{}", std::process::id());
    let tls_args = [
        format!("--cacert={}", ca.ca_file().display()),
        format!("--cert={}", client.cert.display()),
        format!("--key={}", client.key.display()),
    ];
    let ctl = etcdrs_testkit::Etcdctl::new(service.endpoint.clone());
    let size_key = format!("/_etcd/registry/{token}/_config/size");
    poll_until(WAIT, || async {
        let mut args: Vec<&str> = tls_args.iter().map(String::as_str).collect();
        args.extend(["put", &size_key, "3"]);
        let out = ctl.run(&args).await?;
        anyhow::ensure!(out.success(), "etcdctl put: {out:?}");
        Ok(())
    })
    .await
    .expect("size set over TLS");
    let mut flags = vec![
        format!("--discovery-token={token}"),
        format!("--discovery-endpoints={}", service.endpoint),
        format!("--discovery-cacert={}", ca.ca_file().display()),
    ];
    // Without a client certificate the service refuses the connection: discovery fails.
    expect_refused(
        member_opts(3, &flags),
        &["failed to bootstrap; discovery token was already used"],
    )
    .await;
    flags.push(format!("--discovery-cert={}", client.cert.display()));
    flags.push(format!("--discovery-key={}", client.key.display()));
    let (members, took) = bootstrap(3, &flags).await;
    eprintln!(
        "bootstrap time, 3 members, v3 discovery over mutual TLS on etcd 3.4: {} ms",
        took.as_millis()
    );
    check_cluster(&members).await;
}

#[tokio::test]
async fn v3_discovery_over_tls_to_our_server_with_client_certificates() {
    if !ours() {
        return; // etcd 3.4 members have no v3 discovery.
    }
    let dir = tempfile::tempdir().expect("tempdir");
    let ca = etcdrs_testkit::certs::TestCa::new(dir.path(), "ca").expect("ca");
    let server = ca.issue_loopback("server", "server").expect("server cert");
    let client = ca
        .issue_loopback("client", "discovery")
        .expect("client cert");
    let service = Member::start(
        MemberOpts::new(&etcdrs())
            .arg("--enable-v2")
            .name("disc")
            .fast_timers()
            .client_tls(etcdrs_testkit::ClientTls {
                ca_file: ca.ca_file(),
                server,
                client: Some(client.clone()),
                client_cert_auth: true,
            }),
    )
    .await
    .expect("TLS discovery service starts");
    assert!(service.endpoint().starts_with("https://"));
    let token = format!("tls-ours-{}", std::process::id());
    let size_key = format!("/_etcd/registry/{token}/_config/size");
    service.etcdctl().ok(&["put", &size_key, "3"]).await;
    let flags = vec![
        format!("--discovery-token={token}"),
        format!("--discovery-endpoints={}", service.endpoint()),
        format!("--discovery-cacert={}", ca.ca_file().display()),
        format!("--discovery-cert={}", client.cert.display()),
        format!("--discovery-key={}", client.key.display()),
    ];
    let (members, took) = bootstrap(3, &flags).await;
    eprintln!(
        "bootstrap time, 3 members, v3 discovery over mutual TLS on etcd-rs: {} ms",
        took.as_millis()
    );
    check_cluster(&members).await;
}

async fn v3_user_and_password(reference: bool) {
    if !ours() {
        return; // etcd 3.4 members have no v3 discovery.
    }
    let service = service(reference).await;
    let ctl = service.etcdctl();
    ctl.ok(&["user", "add", "root:secret"]).await;
    ctl.ok(&["auth", "enable"]).await;
    let token = format!("auth-{}", std::process::id());
    let size_key = format!("/_etcd/registry/{token}/_config/size");
    ctl.ok(&["--user=root:secret", "put", &size_key, "3"]).await;
    let base = v3_flags(&service, &token);
    let mut wrong = base.clone();
    wrong.extend([
        "--discovery-user=root".to_owned(),
        "--discovery-password=nope".to_owned(),
    ]);
    expect_refused(
        member_opts(3, &wrong),
        &[
            "authentication failed",
            "failed to bootstrap; discovery token was already used",
        ],
    )
    .await;
    // Without credentials the registry cannot be read: refused too.
    expect_refused(
        member_opts(3, &base),
        &["failed to bootstrap; discovery token was already used"],
    )
    .await;
    let mut flags = base;
    // `--discovery-user user:password` is accepted as well (etcd's "username[:password]").
    flags.push("--discovery-user=root:secret".to_owned());
    let (members, _) = bootstrap(3, &flags).await;
    check_cluster(&members).await;
}

#[tokio::test]
async fn v3_discovery_with_user_and_password_on_etcd34() {
    v3_user_and_password(true).await;
}

#[tokio::test]
async fn v3_discovery_with_user_and_password_on_our_server() {
    v3_user_and_password(false).await;
}

/// A plain HTTP forward proxy on a loopback port (what `--discovery-proxy` points at): each
/// connection's first request names its target in absolute form; the proxy dials it, sends
/// the request on in origin form and relays both ways. Counts the connections it relayed.
struct HttpProxy {
    addr: std::net::SocketAddr,
    forwarded: std::sync::Arc<std::sync::atomic::AtomicUsize>,
    task: tokio::task::JoinHandle<()>,
}

impl HttpProxy {
    async fn start() -> HttpProxy {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind proxy");
        let addr = listener.local_addr().expect("addr");
        let forwarded = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let count = forwarded.clone();
        // The accept loop; aborted when the proxy is dropped.
        let task = tokio::spawn(async move {
            while let Ok((mut client, _)) = listener.accept().await {
                let count = count.clone();
                // One relay per connection; it ends when either side closes.
                tokio::spawn(async move {
                    let mut head = Vec::new();
                    let mut buf = [0u8; 4096];
                    while !head.windows(4).any(|w| w == b"\r\n\r\n") && head.len() < 65536 {
                        match client.read(&mut buf).await {
                            Ok(0) | Err(_) => return,
                            Ok(n) => head.extend_from_slice(&buf[..n]),
                        }
                    }
                    let text = String::from_utf8_lossy(&head).into_owned();
                    let Some((line, rest)) = text.split_once("\r\n") else {
                        return;
                    };
                    let mut parts = line.split(' ');
                    let (Some(method), Some(target), Some(version)) =
                        (parts.next(), parts.next(), parts.next())
                    else {
                        return;
                    };
                    let Some(after) = target.strip_prefix("http://") else {
                        return;
                    };
                    let (authority, path) = after.split_at(after.find('/').unwrap_or(after.len()));
                    let Ok(mut upstream) = tokio::net::TcpStream::connect(authority).await else {
                        return;
                    };
                    count.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                    let path = if path.is_empty() { "/" } else { path };
                    let rewritten = format!("{method} {path} {version}\r\n{rest}");
                    if upstream.write_all(rewritten.as_bytes()).await.is_err() {
                        return;
                    }
                    let _ = tokio::io::copy_bidirectional(&mut client, &mut upstream).await;
                });
            }
        });
        HttpProxy {
            addr,
            forwarded,
            task,
        }
    }

    fn forwarded(&self) -> usize {
        self.forwarded.load(std::sync::atomic::Ordering::SeqCst)
    }
}

impl Drop for HttpProxy {
    fn drop(&mut self) {
        self.task.abort();
    }
}

#[tokio::test]
async fn v2_discovery_through_an_http_proxy() {
    // ETCD_DISCOVERY_PROXY without a scheme is read as http://<value>, as etcd does.
    let service = service(false).await;
    let proxy = HttpProxy::start().await;
    let url = format!(
        "{}/v2/keys/discovery/proxied-{}",
        service.endpoint(),
        std::process::id()
    );
    curl(&["-X", "PUT", &format!("{url}/_config/size"), "-d", "value=3"]);
    let started = Instant::now();
    let mut members: Vec<Member> = (0..3)
        .map(|i| {
            let opts =
                member_opts(i, &v2_flags(&url)).env("ETCD_DISCOVERY_PROXY", proxy.addr.to_string());
            Member::spawn(opts).expect("spawn")
        })
        .collect();
    for m in &mut members {
        m.wait_ready().await.expect("member becomes ready");
    }
    eprintln!(
        "bootstrap time, 3 members, v2 discovery through an HTTP proxy: {} ms",
        started.elapsed().as_millis()
    );
    check_cluster(&members).await;
    // Every member reached the service through the proxy (ours opens a connection per
    // request, etcd 3.4 keeps one alive: at least one each).
    assert!(
        proxy.forwarded() >= 3,
        "{} connections proxied",
        proxy.forwarded()
    );
    if ours() {
        assert!(members[0].log_contains("running proxy with discovery"));
    }
}

/// The HTTP/2 PING frames (acknowledgements aside) a client sent on one connection, each
/// with the time the relay received it.
fn client_pings(sent: &Captured) -> Vec<Instant> {
    const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
    let mut bytes = Vec::new();
    let mut arrivals = Vec::new();
    for (at, chunk) in sent {
        arrivals.push((bytes.len(), *at));
        bytes.extend_from_slice(chunk);
    }
    let arrived = |offset: usize| {
        arrivals
            .iter()
            .rev()
            .find(|(start, _)| *start <= offset)
            .map(|(_, at)| *at)
    };
    let mut pings = Vec::new();
    let mut pos = if bytes.starts_with(PREFACE) {
        PREFACE.len()
    } else {
        return pings;
    };
    while pos + 9 <= bytes.len() {
        let len = usize::from(bytes[pos]) << 16
            | usize::from(bytes[pos + 1]) << 8
            | usize::from(bytes[pos + 2]);
        let (kind, flags) = (bytes[pos + 3], bytes[pos + 4]);
        if kind == 0x6 && flags & 0x1 == 0 {
            pings.extend(arrived(pos));
        }
        pos += 9 + len;
    }
    pings
}

/// A v3 discovery member talking to `service` through `relay`, with `extra` flags.
fn relayed_v3(i: usize, relay: &Relay, token: &str, extra: &[&str]) -> MemberOpts {
    let mut flags = vec![
        format!("--discovery-token={token}"),
        format!("--discovery-endpoints={}", relay.url()),
    ];
    flags.extend(extra.iter().map(|f| (*f).to_owned()));
    member_opts(i, &flags)
}

/// A discovery service with a size-3 registry for a fresh token, behind a relay.
async fn relayed_service(name: &str) -> (Member, Relay, String) {
    let service = service(false).await;
    let token = format!("{name}-{}", std::process::id());
    let mut client = service.client().await.expect("client");
    client
        .put(format!("/_etcd/registry/{token}/_config/size"), "3", None)
        .await
        .expect("size");
    let target = service.client_addr().parse().expect("service address");
    let relay = Relay::start(std::net::Ipv4Addr::LOCALHOST, target).expect("relay");
    (service, relay, token)
}

async fn wait_log(member: &Member, needle: &str) {
    poll_until(WAIT, || async {
        anyhow::ensure!(member.log_contains(needle), "no {needle:?} yet");
        Ok(())
    })
    .await
    .unwrap_or_else(|e| panic!("{e}\n{}", member.log_tail(30)));
}

#[tokio::test]
async fn v3_discovery_keepalive_time_paces_the_pings_of_an_idle_connection() {
    // While a member waits for its peers, its connection to the service is idle but for
    // the watch: `--discovery-keepalive-time` is the PING cadence on it (etcd's default is
    // 2 s; 1 s here).
    if !ours() {
        return; // etcd 3.4 members have no v3 discovery.
    }
    let (_service, relay, token) = relayed_service("pings").await;
    relay.capture();
    let mut member = Member::spawn(relayed_v3(
        0,
        &relay,
        &token,
        &["--discovery-keepalive-time=1s"],
    ))
    .expect("spawn");
    wait_log(&member, "waiting for peers from discovery service").await;
    let pings = poll_until(WAIT, || async {
        let most = relay
            .captured()
            .iter()
            .map(client_pings)
            .max_by_key(Vec::len)
            .unwrap_or_default();
        anyhow::ensure!(most.len() >= 5, "{} pings so far", most.len());
        Ok(most)
    })
    .await
    .expect("the member pings its idle connection");
    let gaps: Vec<Duration> = pings.windows(2).map(|w| w[1] - w[0]).collect();
    assert!(
        gaps.iter()
            .all(|g| *g >= Duration::from_millis(700) && *g < Duration::from_millis(1800)),
        "gaps between pings with a 1 s keep-alive time: {gaps:?}"
    );
    assert!(member.is_running());
}

#[tokio::test]
async fn v3_discovery_times_out_a_silent_service_and_recovers() {
    // The service goes silent without a reset (a stalled relay). The keep-alive
    // (`--discovery-keepalive-time` 1 s + `--discovery-keepalive-timeout` 1 s, etcd's
    // defaults 2 s + 6 s) finds the watch's connection dead; the re-read of the registry
    // that follows gives up after `--discovery-request-timeout` (1 s, etcd's default 5 s)
    // with etcd's "context deadline exceeded" and is retried after the back-off; once the
    // service answers again the cluster forms.
    if !ours() {
        return; // etcd 3.4 members have no v3 discovery.
    }
    let (service, relay, token) = relayed_service("silent").await;
    let flags = [
        "--discovery-keepalive-time=1s",
        "--discovery-keepalive-timeout=1s",
        "--discovery-request-timeout=1s",
    ];
    let mut first = Member::spawn(relayed_v3(0, &relay, &token, &flags)).expect("spawn");
    wait_log(&first, "waiting for peers from discovery service").await;
    // The watch is up (the service holds it) before the service goes silent: a stall that
    // came before its creation was answered would end a watch that never settled, a failure
    // retried after the back-off rather than an interruption.
    poll_until(WAIT, || async {
        let body = service.http_get("/metrics").await?.body;
        let watchers = body
            .lines()
            .find_map(|l| l.strip_prefix("etcd_debugging_mvcc_watcher_total "))
            .and_then(|v| v.trim().parse::<f64>().ok())
            .unwrap_or(0.0);
        anyhow::ensure!(watchers >= 1.0, "the service holds {watchers} watchers");
        Ok(())
    })
    .await
    .expect("the member's watch reaches the service");

    relay.stall();
    let stalled = Instant::now();
    // The watch had been up for a while: its end is taken as an interruption (as a service
    // that sends a pinging connection away ends it) and the registry is read again at once.
    wait_log(
        &first,
        "the discovery service ended the watch; watching again",
    )
    .await;
    let noticed = stalled.elapsed();
    assert!(
        noticed < Duration::from_secs(5),
        "a dead connection noticed after {noticed:?}"
    );
    // The failure is logged as the keep-alive gives up; the socket is closed right after.
    poll_until(Duration::from_secs(3), || async {
        anyhow::ensure!(
            relay.dialer_closes() >= 1,
            "the dead connection is still open"
        );
        Ok(())
    })
    .await
    .expect("the member closed the dead connection");
    let reread = Instant::now();
    wait_log(&first, "failed to get cluster size from discovery service").await;
    let gave_up = reread.elapsed();
    let line = first
        .log()
        .lines()
        .find(|l| l.contains("failed to get cluster size from discovery service"))
        .map(str::to_owned)
        .unwrap_or_default();
    assert!(line.contains("context deadline exceeded"), "{line}");
    assert!(
        gave_up < Duration::from_millis(3500),
        "the re-read gave up {gave_up:?} after the watch ended"
    );
    wait_log(&first, "retry connecting to discovery service").await;

    relay.resume();
    let mut members = vec![
        Member::spawn(relayed_v3(1, &relay, &token, &flags)).expect("spawn"),
        Member::spawn(relayed_v3(2, &relay, &token, &flags)).expect("spawn"),
    ];
    first
        .wait_ready()
        .await
        .expect("the first member bootstraps");
    for m in &mut members {
        m.wait_ready().await.expect("member bootstraps");
    }
    members.insert(0, first);
    check_cluster(&members).await;
}

/// Members for DNS SRV bootstrap: ports reserved first so that the records can name them.
struct SrvMembers {
    opts: Vec<MemberOpts>,
    ports: Vec<(
        etcdrs_testkit::ports::PortLease,
        etcdrs_testkit::ports::PortLease,
    )>,
}

fn srv_members(n: usize, dns: &etcdrs_testkit::dns::DnsServer, srv_flags: &[String]) -> SrvMembers {
    let mut opts = Vec::new();
    let mut ports = Vec::new();
    for i in 0..n {
        let host = std::net::Ipv4Addr::new(127, 0, 0, u8::try_from(i + 2).expect("small"));
        let client = etcdrs_testkit::ports::reserve_on(host).expect("port");
        let peer = etcdrs_testkit::ports::reserve_on(host).expect("port");
        opts.push(
            member_opts(i, srv_flags).env(etcdrs_discovery_dns_env(), dns.addr().to_string()),
        );
        ports.push((client, peer));
    }
    SrvMembers { opts, ports }
}

/// The variable that points our resolver at the test DNS server.
fn etcdrs_discovery_dns_env() -> &'static str {
    "ETCDRS_DNS_SERVER"
}

impl SrvMembers {
    fn peer_port(&self, i: usize) -> u16 {
        self.ports[i].1.port()
    }

    /// SRV records `name` (relative to the zone) for every member: target `127.0.0.<i+2>.`
    /// (an address-shaped name, so that peers dial it without DNS) on its peer port.
    async fn publish(&self, dns: &etcdrs_testkit::dns::DnsServer, name: &str) {
        for i in 0..self.opts.len() {
            dns.add_srv(
                name,
                0,
                0,
                self.peer_port(i),
                &format!("127.0.0.{}.", i + 2),
            )
            .await
            .expect("SRV record");
        }
    }

    async fn start(self) -> (Vec<Member>, Duration) {
        let started = Instant::now();
        let mut members = Vec::new();
        for (opts, (client, peer)) in self.opts.into_iter().zip(self.ports) {
            members.push(Member::spawn_on(opts, client, peer).expect("spawn"));
        }
        for m in &mut members {
            m.wait_ready().await.expect("member becomes ready");
        }
        (members, started.elapsed())
    }
}

#[tokio::test]
async fn dns_srv_bootstrap_with_only_the_plain_record() {
    // etcd 3.4 failed here without an _etcd-server-ssl record (#11321); 3.5 and we do not.
    if !ours() {
        return;
    }
    let dns = etcdrs_testkit::dns::DnsServer::start("etcd.test").expect("dns");
    let members = srv_members(3, &dns, &["--discovery-srv=etcd.test".to_owned()]);
    members.publish(&dns, "_etcd-server._tcp").await;
    let (members, took) = members.start().await;
    eprintln!(
        "bootstrap time, 3 members, DNS SRV: {} ms",
        took.as_millis()
    );
    check_cluster(&members).await;
    assert!(members[0].log_contains("got bootstrap from DNS for etcd-server"));
}

#[tokio::test]
async fn dns_srv_bootstrap_with_a_service_name() {
    if !ours() {
        return;
    }
    let dns = etcdrs_testkit::dns::DnsServer::start("etcd.test").expect("dns");
    let flags = [
        "--discovery-srv=etcd.test".to_owned(),
        "--discovery-srv-name=prod".to_owned(),
    ];
    let members = srv_members(3, &dns, &flags);
    // A decoy under the unsuffixed name must not be used.
    dns.add_srv("_etcd-server._tcp", 0, 0, 1, "127.0.0.9.")
        .await
        .expect("decoy");
    members.publish(&dns, "_etcd-server-prod._tcp").await;
    let (members, _) = members.start().await;
    check_cluster(&members).await;
}

#[tokio::test]
async fn dns_srv_member_not_in_the_records_fails_clearly() {
    if !ours() {
        return;
    }
    let dns = etcdrs_testkit::dns::DnsServer::start("etcd.test").expect("dns");
    let members = srv_members(4, &dns, &["--discovery-srv=etcd.test".to_owned()]);
    // Records for the first three only.
    for i in 0..3 {
        dns.add_srv(
            "_etcd-server._tcp",
            0,
            0,
            members.peer_port(i),
            &format!("127.0.0.{}.", i + 2),
        )
        .await
        .expect("SRV record");
    }
    let SrvMembers {
        mut opts,
        mut ports,
    } = members;
    let opts = opts.pop().expect("fourth");
    let (client, peer) = ports.pop().expect("fourth");
    let mut member = Member::spawn_on(opts, client, peer).expect("spawn");
    let status = member.wait_exit(WAIT).await.expect("exits");
    let log = member.log();
    assert_eq!(status.code(), Some(1), "{log}");
    assert!(
        log.contains(r#"cannot find local etcd member \"m3\" in SRV records"#),
        "{log}"
    );
    assert!(!member.data_dir().join("member").exists());
}

#[tokio::test]
async fn dns_srv_ssl_record_for_a_plain_member_is_a_scheme_mismatch() {
    // The _etcd-server-ssl targets are https peers: a member advertising http at one of them
    // is refused (etcd's "scheme mismatch"), and nothing is bootstrapped.
    if !ours() {
        return;
    }
    let dns = etcdrs_testkit::dns::DnsServer::start("etcd.test").expect("dns");
    let members = srv_members(1, &dns, &["--discovery-srv=etcd.test".to_owned()]);
    members.publish(&dns, "_etcd-server-ssl._tcp").await;
    let SrvMembers {
        mut opts,
        mut ports,
    } = members;
    let (client, peer) = ports.pop().expect("one");
    let mut member = Member::spawn_on(opts.pop().expect("one"), client, peer).expect("spawn");
    let status = member.wait_exit(WAIT).await.expect("exits");
    let log = member.log();
    assert_eq!(status.code(), Some(1), "{log}");
    assert!(log.contains("scheme mismatch"), "{log}");
    assert!(!member.data_dir().join("member").exists());
}

#[tokio::test]
async fn dns_srv_bootstrap_over_peer_tls_with_the_ssl_record() {
    // Only `_etcd-server-ssl._tcp` exists: the peers are https, with certificates from a test
    // CA (given as --peer-trusted-ca-file, so they are verified against their own addresses).
    if !ours() {
        return;
    }
    let dir = tempfile::tempdir().expect("tempdir");
    let ca = etcdrs_testkit::certs::TestCa::new(dir.path(), "ca").expect("ca");
    let cert = ca.issue_loopback("peer", "peer").expect("peer cert");
    let dns = etcdrs_testkit::dns::DnsServer::start("etcd.test").expect("dns");
    let mut members = srv_members(3, &dns, &["--discovery-srv=etcd.test".to_owned()]);
    let tls = etcdrs_testkit::PeerTls {
        ca_file: ca.ca_file(),
        cert,
        client_cert_auth: true,
    };
    members.opts = members
        .opts
        .into_iter()
        .map(|o| o.peer_tls(tls.clone()))
        .collect();
    members.publish(&dns, "_etcd-server-ssl._tcp").await;
    let (members, took) = members.start().await;
    eprintln!(
        "bootstrap time, 3 members, DNS SRV with peer TLS: {} ms",
        took.as_millis()
    );
    check_cluster(&members).await;
    let mut client = members[0].client().await.expect("client");
    let list = client.member_list().await.expect("member list");
    assert!(
        list.members()
            .iter()
            .all(|m| m.peer_urls().iter().all(|u| u.starts_with("https://"))),
        "{:?}",
        list.members()
    );
}

#[tokio::test]
async fn dns_srv_peers_without_a_ca_are_verified_for_the_srv_domain() {
    // etcd PR #6084: https peers from `_etcd-server-ssl` with no --peer-trusted-ca-file are
    // checked, against the system's roots (here SSL_CERT_FILE, as Go reads it), for the SRV
    // domain. The certificates name only `etcd.test`, not the addresses dialled, so the
    // cluster forms only if the domain is what is verified.
    if !ours() {
        return;
    }
    let dir = tempfile::tempdir().expect("tempdir");
    let ca = etcdrs_testkit::certs::TestCa::new(dir.path(), "ca").expect("ca");
    let cert = ca
        .issue(
            "peer",
            "peer",
            &["etcd.test"],
            etcdrs_testkit::certs::Usage::Both,
        )
        .expect("peer cert");
    let dns = etcdrs_testkit::dns::DnsServer::start("etcd.test").expect("dns");
    let mut members = srv_members(3, &dns, &["--discovery-srv=etcd.test".to_owned()]);
    let tls = etcdrs_testkit::PeerTls {
        ca_file: std::path::PathBuf::new(),
        cert,
        client_cert_auth: false,
    };
    let ca_file = ca.ca_file().display().to_string();
    members.opts = members
        .opts
        .into_iter()
        .map(|o| {
            o.peer_tls(tls.clone())
                .env("SSL_CERT_FILE", ca_file.clone())
        })
        .collect();
    members.publish(&dns, "_etcd-server-ssl._tcp").await;
    let (members, _took) = members.start().await;
    check_cluster(&members).await;
}

#[tokio::test]
async fn v2_discovery_refuses_a_missing_size_and_duplicate_names() {
    let service = service(false).await;
    let base = format!("{}/v2/keys/discovery", service.endpoint());
    // No _config/size under the token.
    expect_refused(
        member_opts(0, &v2_flags(&format!("{base}/nosize"))),
        &["discovery: size key not found"],
    )
    .await;
    // Two members named alike fill a 2-member token: neither can start.
    let url = format!("{base}/dup-names");
    curl(&["-X", "PUT", &format!("{url}/_config/size"), "-d", "value=2"]);
    let mut twins: Vec<Member> = (0..2)
        .map(|i| Member::spawn(member_opts(i, &v2_flags(&url)).name("twin")).expect("spawn"))
        .collect();
    for twin in &mut twins {
        let status = twin.wait_exit(WAIT).await.expect("exits");
        assert_eq!(status.code(), Some(1));
        if ours() {
            let log = twin.log();
            for message in [
                "discovery: found duplicate name",
                "member with duplicated name has already been registered",
                "cURL the discovery token URL for details",
            ] {
                assert!(log.contains(message), "log lacks {message:?}:\n{log}");
            }
            assert!(!twin.data_dir().join("member").exists());
        }
    }
}

/// `--discovery-insecure-transport=false` and `--discovery-insecure-skip-tls-verify`: a
/// discovery service over TLS whose certificate the member cannot verify (no
/// `--discovery-cacert`) is refused, unless verification is skipped.
#[tokio::test]
async fn v3_discovery_insecure_skip_tls_verify() {
    if !ours() {
        return; // etcd 3.4 members have no v3 discovery.
    }
    let dir = tempfile::tempdir().expect("tempdir");
    let ca = etcdrs_testkit::certs::TestCa::new(dir.path(), "ca").expect("ca");
    let server = ca.issue_loopback("server", "server").expect("server cert");
    let service = Member::start(
        MemberOpts::new(&etcdrs())
            .name("disc")
            .fast_timers()
            .client_tls(etcdrs_testkit::ClientTls {
                ca_file: ca.ca_file(),
                server,
                client: None,
                client_cert_auth: false,
            }),
    )
    .await
    .expect("TLS discovery service starts");
    let ctl = etcdrs_testkit::Etcdctl::new(service.endpoint()).with_tls(&ca.ca_file(), None);
    for (token, size) in [("unverified", "1"), ("skipped", "1")] {
        let key = format!("/_etcd/registry/{token}/_config/size");
        ctl.ok(&["put", &key, size]).await;
    }
    let flags = |token: &str| {
        vec![
            format!("--discovery-token={token}"),
            format!("--discovery-endpoints={}", service.endpoint()),
            "--discovery-insecure-transport=false".to_string(),
        ]
    };
    expect_refused(member_opts(0, &flags("unverified")), &[]).await;
    let mut skipping = flags("skipped");
    skipping.push("--discovery-insecure-skip-tls-verify=true".to_string());
    let (members, _) = bootstrap(1, &skipping).await;
    check_cluster(&members).await;
}

/// `--discovery-dial-timeout`: against a discovery endpoint that accepts connections and never
/// answers, a member gives up after the dial timeout and exits: with 200 ms it is gone before a
/// member with 3 s can be.
#[tokio::test]
async fn v3_discovery_dial_timeout_bounds_an_unanswering_service() {
    if !ours() {
        return; // etcd 3.4 members have no v3 discovery.
    }
    // A service that takes connections and says nothing.
    let silent = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let endpoint = format!("http://{}", silent.local_addr().expect("addr"));
    let held = tokio::spawn(async move {
        let mut open = Vec::new();
        while let Ok((conn, _)) = silent.accept().await {
            open.push(conn);
        }
    });
    let gives_up_after = |timeout: &'static str| {
        let endpoint = endpoint.clone();
        async move {
            let flags = vec![
                "--discovery-token=silent".to_string(),
                format!("--discovery-endpoints={endpoint}"),
                format!("--discovery-dial-timeout={timeout}"),
            ];
            let started = std::time::Instant::now();
            let mut member = Member::spawn(member_opts(0, &flags)).expect("member spawns");
            let status = member
                .wait_exit(WAIT)
                .await
                .expect("member exits by itself");
            assert_eq!(status.code(), Some(1), "{}", member.log());
            started.elapsed()
        }
    };
    let short = gives_up_after("200ms").await;
    let long = gives_up_after("3s").await;
    held.abort();
    assert!(
        long >= Duration::from_secs(3),
        "gave up after {long:?} with a 3 s dial timeout"
    );
    assert!(
        short < Duration::from_secs(3),
        "gave up after {short:?} with a 200 ms dial timeout"
    );
}
