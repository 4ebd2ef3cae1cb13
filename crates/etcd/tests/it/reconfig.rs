//! Runtime reconfiguration and faults of multi-member clusters (issue 4): MemberAdd (learner),
//! MemberPromote and MemberRemove under a stream of writes, MemberUpdate and the membership
//! errors, catch-up of a member behind the compacted log by a database snapshot, a network
//! partition of the leader, and MoveLeader.
//!
//! Every member is a real process (`testkit::Cluster`: member `i` is `m<i>` on `127.0.0.<i + 2>`,
//! fast raft timers). The partition test runs its peer traffic through `testkit::Relay`s
//! (`testkit::RelayedCluster`). Validated against etcd 3.4.23:
//!
//! ```text
//! ETCDRS_TEST_ETCD_BIN=/usr/bin/etcd cargo nextest run -p etcdrs --test it reconfig
//! ```

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use etcd_client::{Client, ConnectOptions, GetOptions};
use etcdrs_testkit::{
    Cluster, ClusterOpts, Code, Etcdctl, Member, MemberOpts, RelayedCluster, assert_grpc_error,
    grpc_error, poll_until, ports,
};
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use serde_json::Value;
use tokio::task::JoinHandle;

use crate::{bin, pairs};

/// Deadline for every state the tests wait for (generous: 2 cores, several clusters at once).
const WAIT: Duration = Duration::from_secs(20);

async fn start(n: usize) -> Cluster {
    Cluster::start(n, ClusterOpts::new(&bin()))
        .await
        .unwrap_or_else(|e| panic!("{n}-member cluster starts: {e:#}"))
}

fn hex(id: u64) -> String {
    format!("{id:x}")
}

/// `s` with every run of whitespace made one space: etcdctl prints IDs as `%16x`, padded with
/// spaces when shorter.
fn squash(s: &str) -> String {
    s.split_whitespace().collect::<Vec<_>>().join(" ")
}

fn parse_json(out: &str) -> Result<Value, String> {
    serde_json::from_str(out).map_err(|e| format!("not JSON ({e}): {out:?}"))
}

/// etcd's strict reconfiguration check (`--strict-reconfig-check`, on by default) refuses
/// MemberAdd and MemberRemove with this until every voter has been connected to the member that
/// got the request for 5 s (`HealthInterval`): a freshly started or just restarted cluster. It
/// is checked before anything else, so clients retry it.
const UNHEALTHY: &str = "etcdserver: unhealthy cluster";

/// Runs a membership command until etcdctl gives an answer other than [`UNHEALTHY`]:
/// `Ok(stdout)` if it succeeded, `Err(stderr)` if it failed otherwise.
async fn reconfig(ctl: &Etcdctl, args: &[&str]) -> Result<String, String> {
    poll_until(WAIT, || async {
        let out = ctl.run(args).await.map_err(|e| format!("{e:#}"))?;
        match out.success() {
            true => Ok(Ok(out.stdout)),
            false if out.stderr.contains(UNHEALTHY) => Err(out.stderr),
            false => Ok(Err(out.stderr)),
        }
    })
    .await
    .unwrap_or_else(|e| panic!("etcdctl {args:?}: {e}"))
}

/// Calls `op` until its result is not the [`UNHEALTHY`] error.
async fn past_unhealthy<T, F, Fut>(mut op: F) -> Result<T, etcd_client::Error>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, etcd_client::Error>>,
{
    poll_until(WAIT, || {
        let call = op();
        async move {
            match call.await {
                Err(e) if grpc_error(&e).is_some_and(|(_, m)| m == UNHEALTHY) => Err(e.to_string()),
                other => Ok(other),
            }
        }
    })
    .await
    .unwrap_or_else(|e| panic!("{e}"))
}

/// A client of one endpoint with short timeouts, for probes that must fail fast.
async fn probe_client(endpoint: &str) -> Result<Client, String> {
    let opts = ConnectOptions::new()
        .with_connect_timeout(Duration::from_secs(1))
        .with_timeout(Duration::from_secs(2));
    Client::connect([endpoint], Some(opts))
        .await
        .map_err(|e| format!("connect {endpoint}: {e}"))
}

/// One row of `member list -w json`.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
struct Row {
    name: String,
    id: u64,
    peer_urls: Vec<String>,
    client_urls: Vec<String>,
    learner: bool,
}

fn strings(v: &Value) -> Vec<String> {
    v.as_array()
        .map(|a| {
            a.iter()
                .filter_map(|s| s.as_str().map(str::to_owned))
                .collect()
        })
        .unwrap_or_default()
}

/// `etcdctl member list -w json`, one attempt, rows sorted by name.
async fn member_rows(ctl: &Etcdctl) -> Result<Vec<Row>, String> {
    let out = ctl
        .run(&["member", "list", "-w", "json"])
        .await
        .map_err(|e| format!("{e:#}"))?;
    if !out.success() {
        return Err(format!("member list failed: {}", out.stderr));
    }
    let list = parse_json(&out.stdout)?;
    let mut rows: Vec<Row> = list["members"]
        .as_array()
        .ok_or_else(|| format!("no members array: {list}"))?
        .iter()
        .map(|m| Row {
            name: m["name"].as_str().unwrap_or_default().to_owned(),
            id: m["ID"].as_u64().unwrap_or(0),
            peer_urls: strings(&m["peerURLs"]),
            client_urls: strings(&m["clientURLs"]),
            learner: m["isLearner"].as_bool().unwrap_or(false),
        })
        .collect();
    rows.sort();
    Ok(rows)
}

/// Member name -> ID, from `member list` (retried until it answers).
async fn member_ids(ctl: &Etcdctl) -> BTreeMap<String, u64> {
    let rows = poll_until(WAIT, || member_rows(ctl))
        .await
        .unwrap_or_else(|e| panic!("member list: {e}"));
    rows.into_iter().map(|r| (r.name, r.id)).collect()
}

/// `endpoint status --cluster -w json`, one attempt: the leader, if the members answering are
/// exactly `members` and all name the same leader, one of them.
async fn one_leader(ctl: &Etcdctl, members: &BTreeSet<u64>) -> Result<u64, String> {
    let out = ctl
        .run(&["endpoint", "status", "--cluster", "-w", "json"])
        .await
        .map_err(|e| format!("{e:#}"))?;
    let rows = parse_json(&out.stdout)?;
    let rows = rows
        .as_array()
        .ok_or_else(|| format!("not an array: {rows}"))?;
    let mut seen = BTreeSet::new();
    let mut leaders = BTreeSet::new();
    for r in rows {
        seen.insert(r["Status"]["header"]["member_id"].as_u64().unwrap_or(0));
        leaders.insert(r["Status"]["leader"].as_u64().unwrap_or(0));
    }
    if &seen != members {
        return Err(format!("status of {seen:x?}, want {members:x?}"));
    }
    match leaders.iter().collect::<Vec<_>>()[..] {
        [&l] if members.contains(&l) => Ok(l),
        _ => Err(format!("leaders {leaders:x?} among {members:x?}")),
    }
}

/// Polls `endpoint hashkv --cluster -w json` until `n` members report the same hash at the same
/// revision; returns that `(revision, hash)`.
async fn hashkv_converged(ctl: &Etcdctl, n: usize) -> Result<(i64, u64), String> {
    poll_until(WAIT, || async {
        let out = ctl
            .run(&["endpoint", "hashkv", "--cluster", "-w", "json"])
            .await
            .map_err(|e| format!("{e:#}"))?;
        let rows = parse_json(&out.stdout)?;
        let rows = rows
            .as_array()
            .ok_or_else(|| format!("not an array: {rows}"))?;
        let got: BTreeMap<String, (i64, u64)> = rows
            .iter()
            .map(|r| {
                (
                    r["Endpoint"].as_str().unwrap_or_default().to_owned(),
                    (
                        r["HashKV"]["header"]["revision"].as_i64().unwrap_or(0),
                        r["HashKV"]["hash"].as_u64().unwrap_or(0),
                    ),
                )
            })
            .collect();
        let distinct: BTreeSet<(i64, u64)> = got.values().copied().collect();
        match distinct.iter().collect::<Vec<_>>()[..] {
            [&one] if got.len() == n => Ok(one),
            _ => Err(format!("hashkv {got:?}")),
        }
    })
    .await
    .map_err(|e| e.to_string())
}

/// Errors a client retries: the request may or may not have been applied, and the cluster is
/// expected to answer again (leader changes, timeouts, overload).
fn is_transient(err: &etcd_client::Error) -> bool {
    const MESSAGES: [&str; 7] = [
        "etcdserver: leader changed",
        "etcdserver: no leader",
        "etcdserver: request timed out",
        "etcdserver: request timed out, possibly due to previous leader failure",
        "etcdserver: request timed out, possibly due to connection lost",
        "etcdserver: too many requests",
        "Timeout expired",
    ];
    match grpc_error(err) {
        Some((Code::Unavailable | Code::DeadlineExceeded, _)) => true,
        Some((_, msg)) => MESSAGES.contains(&msg.as_str()),
        None => false,
    }
}

fn write_key(i: usize) -> String {
    format!("w/{i:06}")
}

fn write_value(i: usize) -> String {
    format!("v{i}-{}", "x".repeat(i % 40))
}

/// A task putting `w/000000`, `w/000001`, … one after the other through one client. A put that
/// fails is retried with the same key and value; every error is recorded.
struct Writer {
    stop: Arc<AtomicBool>,
    acked: Arc<AtomicUsize>,
    task: JoinHandle<(usize, Vec<String>)>,
}

impl Writer {
    fn spawn(mut client: Client) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let acked = Arc::new(AtomicUsize::new(0));
        let task = tokio::spawn({
            let (stop, acked) = (stop.clone(), acked.clone());
            async move {
                let mut errors = Vec::new();
                let mut i = 0;
                while !stop.load(Ordering::SeqCst) {
                    match client.put(write_key(i), write_value(i), None).await {
                        Ok(_) => {
                            i += 1;
                            acked.store(i, Ordering::SeqCst);
                        }
                        Err(e) if !is_transient(&e) => {
                            // Not retried: the caller fails on it.
                            errors.push(format!("NOT TRANSIENT: put {}: {e:?}", write_key(i)));
                            break;
                        }
                        Err(e) => {
                            errors.push(format!("put {}: {e}", write_key(i)));
                            // Pace the retries of a cluster in the middle of a change.
                            tokio::time::sleep(Duration::from_millis(20)).await;
                        }
                    }
                }
                (i, errors)
            }
        });
        Writer { stop, acked, task }
    }

    fn acked(&self) -> usize {
        self.acked.load(Ordering::SeqCst)
    }

    /// Polls until `n` more puts than now are acknowledged.
    async fn wait_for_more(&self, n: usize, what: &str) {
        let target = self.acked() + n;
        poll_until(WAIT, || async {
            let acked = self.acked();
            if acked >= target {
                Ok(())
            } else if self.task.is_finished() {
                Err(format!("the writer stopped at {acked} puts"))
            } else {
                Err(format!("{acked} of {target} puts acknowledged"))
            }
        })
        .await
        .unwrap_or_else(|e| panic!("writes continue {what}: {e}"));
    }

    /// Stops the writer: `(acknowledged puts, errors seen)`.
    async fn finish(self) -> (usize, Vec<String>) {
        self.stop.store(true, Ordering::SeqCst);
        self.task.await.expect("writer task")
    }
}

/// Checks that member `who` (linearizable read) has the writer's keys `0..acked` with their
/// values and no gap; key `acked` may be there too (applied, acknowledgement not received).
async fn check_writes(who: &str, client: &mut Client, acked: usize) {
    let r = client
        .get("w/", Some(GetOptions::new().with_prefix()))
        .await
        .unwrap_or_else(|e| panic!("linearizable read on {who}: {e}"));
    let stored = pairs(r.kvs());
    assert!(
        stored.len() == acked || stored.len() == acked + 1,
        "{who} has {} writer keys, {acked} acknowledged",
        stored.len()
    );
    for (i, (k, v)) in stored.iter().enumerate() {
        assert_eq!(
            (k.as_str(), v.as_str()),
            (write_key(i).as_str(), write_value(i).as_str()),
            "{who}: key {i}"
        );
    }
}

/// A member joining the cluster that `etcdctl member add` just grew: its `--initial-cluster`
/// is what etcdctl printed.
fn joining(name: &str, host: std::net::Ipv4Addr, initial: String, token: &str) -> MemberOpts {
    MemberOpts::new(&bin())
        .name(name)
        .host(host)
        .initial_cluster(initial)
        .initial_cluster_token(token)
        .setting("initial-cluster-state", "existing")
        .fast_timers()
}

/// What `etcdctl member add` printed: the new member's ID, the cluster ID and the
/// `ETCD_*` lines.
fn parse_member_add(out: &str) -> (u64, u64, BTreeMap<String, String>) {
    let first = out.lines().next().unwrap_or_default();
    let words: Vec<&str> = first.split_whitespace().collect();
    let (id, cluster) = match words[..] {
        ["Member", id, "added", "to", "cluster", cluster] => (id, cluster),
        _ => panic!("unexpected member add output: {out:?}"),
    };
    let parse = |h: &str| u64::from_str_radix(h, 16).unwrap_or_else(|e| panic!("{h}: {e}"));
    let vars = out
        .lines()
        .filter_map(|l| l.split_once('='))
        .map(|(k, v)| (k.to_owned(), v.trim_matches('"').to_owned()))
        .collect();
    (parse(id), parse(cluster), vars)
}

/// A 3-member cluster under a stream of writes through m0 gets a fourth member: added as a
/// learner with `etcdctl member add --learner`, started with `--initial-cluster-state existing`
/// and the `ETCD_INITIAL_CLUSTER` etcdctl printed, promoted once it has caught up, and then an
/// original follower (not m0) is removed. The removed process exits; the writer only ever sees
/// errors it may retry; every acknowledged put is on every remaining member; `member list` and
/// `endpoint status` show the final membership with one leader.
#[tokio::test]
async fn add_promote_and_remove_members_while_writing() {
    let mut c = start(3).await;
    let ctl = c.etcdctl();
    let ids = member_ids(&ctl).await;
    let writer = Writer::spawn(c.member(0).client().await.expect("client"));
    writer.wait_for_more(20, "before the change").await;

    // MemberAdd, as a learner.
    let host = Cluster::host(3);
    let client_port = ports::reserve_on(host).expect("port");
    let peer_port = ports::reserve_on(host).expect("port");
    let peer_url = format!("http://{host}:{}", peer_port.port());
    let peer_flag = format!("--peer-urls={peer_url}");
    let out = reconfig(&ctl, &["member", "add", "n4", "--learner", &peer_flag])
        .await
        .unwrap_or_else(|e| panic!("member add --learner: {e}"));
    let (n4_id, cluster_id, vars) = parse_member_add(&out);
    let mut want_initial: Vec<String> = (0..3)
        .map(|i| format!("{}={}", Cluster::name(i), c.member(i).peer_url()))
        .chain([format!("n4={peer_url}")])
        .collect();
    want_initial.sort();
    let initial = vars
        .get("ETCD_INITIAL_CLUSTER")
        .unwrap_or_else(|| panic!("no ETCD_INITIAL_CLUSTER in {out:?}"))
        .clone();
    let mut got_initial: Vec<String> = initial.split(',').map(str::to_owned).collect();
    got_initial.sort();
    assert_eq!(got_initial, want_initial, "{out}");
    assert_eq!(vars.get("ETCD_NAME").map(String::as_str), Some("n4"));
    assert_eq!(
        vars.get("ETCD_INITIAL_ADVERTISE_PEER_URLS"),
        Some(&peer_url)
    );
    assert_eq!(
        vars.get("ETCD_INITIAL_CLUSTER_STATE").map(String::as_str),
        Some("existing")
    );
    let rows = member_rows(&ctl).await.expect("member list");
    let added: Vec<&Row> = rows.iter().filter(|r| r.id == n4_id).collect();
    assert!(
        matches!(&added[..], [r] if r.learner && r.name.is_empty() && r.peer_urls == [peer_url.clone()] && r.client_urls.is_empty()),
        "the unstarted learner in member list: {rows:?}"
    );

    // The learner starts from the printed configuration and catches up.
    let n4_opts = joining("n4", host, initial, c.token());
    let mut n4 = Member::spawn_on(n4_opts, client_port, peer_port).expect("spawn n4");
    let recent = writer.acked() - 1;
    poll_until(WAIT, || async {
        let mut client = probe_client(&n4.endpoint()).await?;
        let r = client
            .get(
                write_key(recent),
                Some(GetOptions::new().with_serializable()),
            )
            .await
            .map_err(|e| format!("serializable get on n4: {e}"))?;
        if pairs(r.kvs()) == [(write_key(recent), write_value(recent))] {
            Ok(())
        } else {
            Err(format!("n4 has {:?}", pairs(r.kvs())))
        }
    })
    .await
    .unwrap_or_else(|e| panic!("{e}\n{}\n--- n4 ---\n{}", c.log_tails(), n4.log_tail(30)));
    // Checked at the end, so that a wrong answer here does not hide the rest.
    let mut n4_client = n4.client().await.expect("client");
    let learner_status = n4_client.status().await.map(|s| s.is_learner());
    // etcd: a learner serves serializable reads only.
    let learner_read = n4_client.get(write_key(recent), None).await;
    // etcd 3.7 refuses a learner every stream but Snapshot: RangeStream too, even serializable.
    let learner_stream = {
        let channel = tonic::transport::Endpoint::from_shared(n4.endpoint())
            .expect("endpoint")
            .connect()
            .await
            .expect("connect to n4");
        let request = etcdrs_proto::etcdserverpb::RangeRequest {
            key: write_key(recent).into_bytes(),
            serializable: true,
            ..Default::default()
        };
        etcdrs_proto::etcdserverpb::kv_client::KvClient::new(channel)
            .range_stream(request)
            .await
            .err()
            .map(|status| (status.code(), status.message().to_owned()))
    };

    // MemberPromote, retried while the leader says the learner is not caught up yet.
    let n4_hex = hex(n4_id);
    let promoted = poll_until(WAIT, || async {
        let out = ctl
            .run(&["member", "promote", &n4_hex])
            .await
            .map_err(|e| format!("{e:#}"))?;
        if out.success() {
            Ok(Ok(out.stdout))
        } else if out
            .stderr
            .contains("etcdserver: can only promote a learner member which is in sync with leader")
        {
            Err(out.stderr)
        } else {
            Ok(Err(out.stderr))
        }
    })
    .await
    .unwrap_or_else(|e| panic!("promote n4: {e}"));
    match promoted {
        Ok(out) => assert!(
            squash(&out).contains(&format!(
                "Member {n4_hex} promoted in cluster {}",
                hex(cluster_id)
            )),
            "{out}"
        ),
        Err(stderr) => panic!("promote failed: {stderr}"),
    }
    let rows = member_rows(&ctl).await.expect("member list");
    assert!(
        rows.iter().all(|r| !r.learner) && rows.len() == 4,
        "after promote: {rows:?}"
    );
    writer.wait_for_more(20, "after the promotion").await;

    // MemberRemove of an original follower other than m0, paused (SIGSTOP) so that it misses
    // its own removal: once resumed it must learn from its peers that it was removed, and exit.
    let leader = c.leader().await.expect("leader");
    let removed = if leader == 1 { 2 } else { 1 };
    let kept = 3 - removed;
    let removed_id = ids[&Cluster::name(removed)];
    let removed_pid =
        Pid::from_raw(i32::try_from(c.member(removed).pid().expect("running")).expect("pid fits"));
    kill(removed_pid, Signal::SIGSTOP).expect("SIGSTOP");
    let w_ctl = c.member(0).etcdctl();
    let removal = reconfig(&w_ctl, &["member", "remove", &hex(removed_id)]).await;
    kill(removed_pid, Signal::SIGCONT).expect("SIGCONT");
    let out = removal.unwrap_or_else(|e| panic!("member remove: {e}"));
    assert!(
        squash(&out).contains(&format!(
            "Member {} removed from cluster {}",
            hex(removed_id),
            hex(cluster_id)
        )),
        "{out}"
    );
    let exit = c
        .member_mut(removed)
        .wait_exit(WAIT)
        .await
        .unwrap_or_else(|e| panic!("the removed member exits: {e:#}"));
    // etcd exits 0 once removed, so a supervisor does not restart it into a loop.
    assert!(
        exit.success(),
        "the removed member m{removed} exited with {exit}"
    );
    let served = async {
        let mut client = probe_client(&c.member(removed).endpoint()).await?;
        client
            .get("w/", Some(GetOptions::new().with_serializable()))
            .await
            .map_err(|e| e.to_string())
    };
    if let Ok(Ok(r)) = tokio::time::timeout(Duration::from_secs(3), served).await {
        panic!("the removed member still serves: {r:?}");
    }
    writer.wait_for_more(20, "after the removal").await;

    let (acked, errors) = writer.finish().await;
    eprintln!("writer: {acked} puts acknowledged, errors: {errors:?}");
    assert!(
        errors.iter().all(|e| !e.starts_with("NOT TRANSIENT")),
        "the writer failed: {errors:?}"
    );
    let live = [0, kept];
    let mut clients = Vec::new();
    for i in live {
        clients.push((
            Cluster::name(i),
            c.member(i).client().await.expect("client"),
        ));
    }
    clients.push(("n4".to_owned(), n4_client));
    for (who, client) in &mut clients {
        check_writes(who, client, acked).await;
    }

    // The final membership: m0, the kept original and n4, all voters, one leader.
    let live_ctl = Etcdctl::new(
        [
            c.member(0).endpoint(),
            c.member(kept).endpoint(),
            n4.endpoint(),
        ]
        .join(","),
    );
    let mut want: Vec<Row> = live
        .iter()
        .map(|&i| Row {
            name: Cluster::name(i),
            id: ids[&Cluster::name(i)],
            peer_urls: vec![c.member(i).peer_url()],
            client_urls: vec![c.member(i).endpoint()],
            learner: false,
        })
        .chain([Row {
            name: "n4".to_owned(),
            id: n4_id,
            peer_urls: vec![peer_url.clone()],
            client_urls: vec![n4.endpoint()],
            learner: false,
        }])
        .collect();
    want.sort();
    poll_until(WAIT, || async {
        let rows = member_rows(&live_ctl).await?;
        if rows == want {
            Ok(())
        } else {
            Err(format!("member list {rows:?}, want {want:?}"))
        }
    })
    .await
    .unwrap_or_else(|e| panic!("{e}"));
    let members: BTreeSet<u64> = want.iter().map(|r| r.id).collect();
    poll_until(WAIT, || one_leader(&live_ctl, &members))
        .await
        .unwrap_or_else(|e| panic!("{e}\n{}\n--- n4 ---\n{}", c.log_tails(), n4.log_tail(30)));
    n4.kill9().expect("kill n4");

    let learner_read = learner_read.map_err(|e| grpc_error(&e));
    let want_read = Some((
        Code::Unavailable,
        "etcdserver: rpc not supported for learner".to_owned(),
    ));
    assert!(
        matches!(learner_status, Ok(true)) && learner_read.as_ref().err() == Some(&want_read),
        "while n4 was a learner: Status is_learner {learner_status:?} (want Ok(true)); \
         linearizable get {learner_read:?} (want the error {want_read:?})"
    );
    if crate::ours() {
        assert_eq!(
            learner_stream, want_read,
            "while n4 was a learner: RangeStream"
        );
    } else {
        // etcd 3.4 has no RangeStream at all.
        let code = learner_stream.map(|(code, _)| code);
        assert_eq!(code, Some(Code::Unimplemented), "RangeStream on etcd 3.4");
    }
}

/// Recursively copies directory `from` to `to` (created).
fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).expect("create dir");
    for entry in std::fs::read_dir(from).expect("read dir") {
        let entry = entry.expect("dir entry");
        let dest = to.join(entry.file_name());
        if entry.file_type().expect("file type").is_dir() {
            copy_dir(&entry.path(), &dest);
        } else {
            std::fs::copy(entry.path(), &dest).expect("copy file");
        }
    }
}

/// The membership errors, through etcdctl and through etcd-client on a follower and on the
/// leader: adding an existing peer URL, removing or updating an unknown ID, promoting a voter;
/// none changes the membership. Then MemberUpdate moves a follower to a new peer URL: the member
/// is restarted from its data on the new peer (and client) port and keeps serving; `member
/// list` shows the new URLs.
#[tokio::test]
async fn member_update_and_membership_errors() {
    let mut c = start(3).await;
    let ctl = c.etcdctl();
    let ids = member_ids(&ctl).await;
    let members: BTreeSet<u64> = ids.values().copied().collect();
    let leader = c.leader().await.expect("leader");
    let f = (leader + 1) % 3;
    let other = (leader + 2) % 3;
    let f_name = Cluster::name(f);
    let f_id = ids[&f_name];

    // Errors, first through etcdctl.
    let taken = format!("--peer-urls={}", c.member(other).peer_url());
    let err = reconfig(&ctl, &["member", "add", "dup", &taken])
        .await
        .expect_err("member add with a taken peer URL");
    assert!(
        err.contains("etcdserver: Peer URLs already exists"),
        "{err}"
    );
    let err = reconfig(&ctl, &["member", "remove", "abcdef12345"])
        .await
        .expect_err("member remove of an unknown ID");
    assert!(err.contains("etcdserver: member not found"), "{err}");
    let unknown_update = [
        "member",
        "update",
        "abcdef12345",
        "--peer-urls=http://127.0.0.1:1",
    ];
    let err = ctl.fail(&unknown_update).await;
    assert!(err.contains("etcdserver: member not found"), "{err}");
    let err = ctl.fail(&["member", "promote", &hex(f_id)]).await;
    assert!(
        err.contains("etcdserver: can only promote a learner member"),
        "{err}"
    );
    // Then with the gRPC codes, through etcd-client on a follower and on the leader.
    let mut leader_client = c.member(leader).client().await.expect("client");
    let mut f_client = c.member(f).client().await.expect("client");
    for (who, client) in [("follower", &mut f_client), ("leader", &mut leader_client)] {
        eprintln!("membership errors through the {who}");
        let taken = c.member(other).peer_url();
        assert_grpc_error(
            past_unhealthy(|| {
                let (mut client, taken) = (client.clone(), taken.clone());
                async move { client.member_add([taken], None).await }
            })
            .await,
            Code::FailedPrecondition,
            "etcdserver: Peer URLs already exists",
        );
        assert_grpc_error(
            past_unhealthy(|| {
                let mut client = client.clone();
                async move { client.member_remove(0xabcdef12345).await }
            })
            .await,
            Code::NotFound,
            "etcdserver: member not found",
        );
        assert_grpc_error(
            client
                .member_update(0xabcdef12345, vec!["http://127.0.0.1:1".to_owned()])
                .await,
            Code::NotFound,
            "etcdserver: member not found",
        );
        assert_grpc_error(
            client.member_promote(ids[&Cluster::name(other)]).await,
            Code::FailedPrecondition,
            "etcdserver: can only promote a learner member",
        );
    }
    let rows = member_rows(&ctl).await.expect("member list");
    assert_eq!(
        rows.iter().map(|r| r.id).collect::<BTreeSet<_>>(),
        members,
        "the failed changes left the membership alone: {rows:?}"
    );

    // MemberUpdate of a follower's peer URL.
    let host = Cluster::host(f);
    let new_client = ports::reserve_on(host).expect("port");
    let new_peer = ports::reserve_on(host).expect("port");
    let new_peer_url = format!("http://{host}:{}", new_peer.port());
    let flag = format!("--peer-urls={new_peer_url}");
    // Sent to the member being moved: it must learn that the change committed although the
    // others now address it at a URL nobody listens on yet.
    let out = c
        .member(f)
        .etcdctl()
        .ok(&["member", "update", &hex(f_id), &flag])
        .await;
    assert!(
        squash(&out).contains(&format!("Member {} updated in cluster", hex(f_id))),
        "{out}"
    );
    let rows = member_rows(&ctl).await.expect("member list");
    let row = rows.iter().find(|r| r.id == f_id).expect("updated member");
    assert_eq!(row.peer_urls, std::slice::from_ref(&new_peer_url));

    // Restart the member from its data on the new ports. A fresh testkit member fails at
    // once (its name is not in its --initial-cluster), gets a copy of the data dir, and is
    // started again: with a data dir, etcd ignores --initial-cluster.
    drop(f_client);
    c.member_mut(f).stop().await.expect("stop the member");
    let moved_opts = MemberOpts::new(&bin())
        .name(f_name.clone())
        .host(host)
        .initial_cluster(format!("not-{f_name}={new_peer_url}"))
        .fast_timers()
        .require_health();
    let mut moved = Member::spawn_on(moved_opts, new_client, new_peer).expect("spawn");
    moved
        .wait_exit(WAIT)
        .await
        .expect("the placeholder start fails");
    if moved.data_dir().exists() {
        std::fs::remove_dir_all(moved.data_dir()).expect("clear data dir");
    }
    copy_dir(c.member(f).data_dir(), moved.data_dir());
    moved
        .restart()
        .await
        .unwrap_or_else(|e| panic!("restart on the new peer URL: {e:#}\n{}", c.log_tails()));

    leader_client
        .put("moved/k", "v1", None)
        .await
        .expect("put on the leader");
    let mut moved_client = moved.client().await.expect("client");
    let r = moved_client
        .get("moved/k", None)
        .await
        .expect("linearizable get on the moved member");
    assert_eq!(pairs(r.kvs()), [("moved/k".into(), "v1".into())]);
    assert_eq!(r.header().expect("header").member_id(), f_id);
    moved_client
        .put("moved/k", "v2", None)
        .await
        .expect("put on the moved member");
    let r = leader_client.get("moved/k", None).await.expect("get");
    assert_eq!(pairs(r.kvs()), [("moved/k".into(), "v2".into())]);

    let live_ctl = Etcdctl::new(
        [
            c.member(leader).endpoint(),
            c.member(other).endpoint(),
            moved.endpoint(),
        ]
        .join(","),
    );
    poll_until(WAIT, || async {
        let rows = member_rows(&live_ctl).await?;
        match rows.iter().find(|r| r.id == f_id) {
            Some(r)
                if r.name == f_name
                    && r.peer_urls == [new_peer_url.clone()]
                    && r.client_urls == [moved.endpoint()] =>
            {
                Ok(())
            }
            _ => Err(format!("member list {rows:?}")),
        }
    })
    .await
    .unwrap_or_else(|e| panic!("{e}"));
    poll_until(WAIT, || one_leader(&live_ctl, &members))
        .await
        .unwrap_or_else(|e| panic!("{e}\n{}\n{}", c.log_tails(), moved.log_tail(30)));
}

const SNAP_PUTS: usize = 7000;
const SNAP_WORKERS: usize = 16;

/// `--snapshot-count 1000`: a follower SIGKILLed while 7000 puts are made is more than the 5000
/// entries the leader keeps after a snapshot behind, so after its restart it can only catch up
/// from a database snapshot streamed by the leader (between etcd-rs members, as a stream of
/// pairs). It ends with the same HashKV at the same revision as the others and serves the
/// latest put.
#[tokio::test]
async fn follower_behind_compacted_log_catches_up_by_snapshot() {
    let mut c = Cluster::start(
        3,
        ClusterOpts::new(&bin()).args(["--snapshot-count", "1000"]),
    )
    .await
    .expect("cluster starts");
    let leader = c.leader().await.expect("leader");
    let f = (leader + 1) % 3;
    c.kill9(f).expect("kill -9 the follower");

    let client = c.member(leader).client().await.expect("client");
    let mut workers = tokio::task::JoinSet::new();
    for w in 0..SNAP_WORKERS {
        let mut client = client.clone();
        workers.spawn(async move {
            let mut revs = Vec::new();
            for i in (w..SNAP_PUTS).step_by(SNAP_WORKERS) {
                let (k, v) = (
                    format!("snap/{i:05}"),
                    format!("value-{i}-{}", "s".repeat(64)),
                );
                let rev = client
                    .put(k.clone(), v.clone(), None)
                    .await
                    .unwrap_or_else(|e| panic!("put {k}: {e}"))
                    .header()
                    .expect("header")
                    .revision();
                revs.push((rev, k, v));
            }
            revs
        });
    }
    let mut all = Vec::new();
    while let Some(revs) = workers.join_next().await {
        all.extend(revs.expect("put worker"));
    }
    all.sort();
    let (last_rev, last_key, last_value) = all.last().cloned().expect("puts");
    assert_eq!(all.len(), SNAP_PUTS);

    c.restart(f)
        .await
        .unwrap_or_else(|e| panic!("restart the follower: {e:#}\n{}", c.log_tails()));
    let (rev, hash) = hashkv_converged(&c.etcdctl(), 3)
        .await
        .unwrap_or_else(|e| panic!("{e}\n{}", c.log_tails()));
    assert!(
        rev >= last_rev,
        "converged at revision {rev} (hash {hash}), last put at {last_rev}"
    );
    let mut fc = c.member(f).client().await.expect("client");
    let r = fc
        .get(
            last_key.clone(),
            Some(GetOptions::new().with_serializable()),
        )
        .await
        .expect("serializable get on the follower");
    assert_eq!(pairs(r.kvs()), [(last_key, last_value)]);
    assert_eq!(r.kvs()[0].mod_revision(), last_rev);
    let r = fc
        .get(
            "snap/",
            Some(
                GetOptions::new()
                    .with_prefix()
                    .with_count_only()
                    .with_serializable(),
            ),
        )
        .await
        .expect("count on the follower");
    assert_eq!(r.count(), i64::try_from(SNAP_PUTS).expect("fits"));
    // It was a snapshot, not a log replay: etcd logs "received and saved database snapshot"
    // (3.4) / "received database snapshot", we log "received database snapshot".
    let log = c.member(f).current_log();
    assert!(
        log.lines()
            .any(|l| l.contains("received") && l.contains("database snapshot")),
        "the follower's log shows no received database snapshot:\n{}",
        c.member(f).log_tail(40)
    );
    // Between etcd-rs members the image is a stream of the leader's pairs, written into the
    // follower's backend as it arrived (an etcd member gets etcd's file: it-mixed).
    if crate::ours() {
        assert!(
            log.contains("read the leader's snapshot stream and indexed it"),
            "the follower did not take a stream of pairs:\n{}",
            c.member(f).log_tail(40)
        );
    }
}

/// `(member_id, leader, raft_term)` from one member's `Status`, with short timeouts.
async fn status_of(m: &Member) -> Result<(u64, u64, u64), String> {
    let status = async {
        let s = probe_client(&m.endpoint())
            .await?
            .status()
            .await
            .map_err(|e| e.to_string())?;
        let id = s.header().ok_or("no header")?.member_id();
        Ok((id, s.leader(), s.raft_term()))
    };
    tokio::time::timeout(Duration::from_secs(3), status)
        .await
        .map_err(|_| "Status timed out".to_owned())?
}

/// Polls until the members `among` all report the same leader, one of `candidates`.
async fn agreed_leader(
    c: &RelayedCluster,
    among: &[usize],
    candidates: &BTreeSet<u64>,
) -> Result<u64, String> {
    poll_until(WAIT, || async {
        let mut leaders = BTreeSet::new();
        for &i in among {
            leaders.insert(status_of(c.member(i)).await?.1);
        }
        match leaders.iter().collect::<Vec<_>>()[..] {
            [&l] if candidates.contains(&l) => Ok(l),
            _ => Err(format!("leaders {leaders:x?}, want one of {candidates:x?}")),
        }
    })
    .await
    .map_err(|e| e.to_string())
}

/// A network partition: the leader of a 3-member cluster is cut off from both followers (peer
/// traffic runs through relays; the leader's inbound relay is blocked and the others refuse
/// the connections its process dials). The majority elects a new leader and takes writes; the
/// isolated member refuses linearizable reads and writes (etcdctl with `--command-timeout=2s`
/// fails) and does not see the majority's writes. After healing, the old leader rejoins as a
/// follower and all members converge (same HashKV at the same revision).
#[tokio::test]
async fn partitioned_leader_steps_aside_and_rejoins() {
    let c = RelayedCluster::start(3, &bin(), &[])
        .await
        .expect("cluster starts");
    let ctl = c.etcdctl();
    let rows = poll_until(WAIT, || member_rows(&ctl))
        .await
        .expect("member list");
    let advertised: BTreeSet<Vec<String>> = rows.iter().map(|r| r.peer_urls.clone()).collect();
    let relays: BTreeSet<Vec<String>> = (0..3).map(|i| vec![c.peer_url(i)]).collect();
    assert_eq!(advertised, relays, "members advertise their relays");
    let ids: BTreeMap<String, u64> = rows.iter().map(|r| (r.name.clone(), r.id)).collect();

    let mut client = c.client().await.expect("client");
    client.put("p/before", "1", None).await.expect("put before");
    let old = c.leader().await.expect("leader");
    let old_id = ids[&Cluster::name(old)];
    let majority: Vec<usize> = (0..3).filter(|i| *i != old).collect();
    let majority_ids: BTreeSet<u64> = majority.iter().map(|i| ids[&Cluster::name(*i)]).collect();

    c.isolate(old).expect("isolate the leader");
    let new_leader = agreed_leader(&c, &majority, &majority_ids)
        .await
        .unwrap_or_else(|e| panic!("the majority elects a leader: {e}\n{}", c.log_tails()));
    assert_ne!(new_leader, old_id);

    // The majority takes writes (retried while the election settles).
    let mut m0 = c.member(majority[0]).client().await.expect("client");
    let during_rev = poll_until(WAIT, || {
        let mut m0 = m0.clone();
        async move {
            m0.put("p/during", "2", None)
                .await
                .map(|r| r.header().map(|h| h.revision()).unwrap_or(0))
                .map_err(|e| e.to_string())
        }
    })
    .await
    .unwrap_or_else(|e| panic!("the majority takes writes: {e}\n{}", c.log_tails()));
    let mut m1 = c.member(majority[1]).client().await.expect("client");
    let r = m1.get("p/during", None).await.expect("linearizable get");
    assert_eq!(pairs(r.kvs()), [("p/during".into(), "2".into())]);

    // The isolated member refuses linearizable reads and writes.
    let isolated = c.member(old).etcdctl();
    let err = isolated
        .fail(&["get", "p/before", "--command-timeout=2s"])
        .await;
    eprintln!("linearizable get on the isolated member: {err}");
    let err = isolated
        .fail(&["put", "p/isolated", "x", "--command-timeout=2s"])
        .await;
    eprintln!("put on the isolated member: {err}");
    let mut iso = c.member(old).client().await.expect("client");
    let r = iso
        .get("p/during", Some(GetOptions::new().with_serializable()))
        .await
        .expect("serializable get on the isolated member");
    assert!(r.kvs().is_empty(), "the isolated member saw {r:?}");
    m0.put("p/during2", "3", None)
        .await
        .expect("the majority still takes writes");

    // Heal: the old leader rejoins as a follower and catches up.
    c.heal();
    let all: Vec<usize> = (0..3).collect();
    let healed_leader = agreed_leader(&c, &all, &majority_ids)
        .await
        .unwrap_or_else(|e| panic!("after healing: {e}\n{}", c.log_tails()));
    assert_ne!(
        healed_leader, old_id,
        "the old leader rejoined as a follower"
    );
    let (rev, _) = hashkv_converged(&ctl, 3)
        .await
        .unwrap_or_else(|e| panic!("{e}\n{}", c.log_tails()));
    assert!(
        rev > during_rev,
        "converged at {rev}, majority wrote at {during_rev}"
    );
    let r = poll_until(WAIT, || {
        let mut iso = iso.clone();
        async move {
            iso.get("p/", Some(GetOptions::new().with_prefix()))
                .await
                .map_err(|e| e.to_string())
        }
    })
    .await
    .expect("linearizable read on the old leader");
    let got: BTreeMap<String, String> = pairs(r.kvs()).into_iter().collect();
    assert_eq!(
        got.get("p/during2").map(String::as_str),
        Some("3"),
        "{got:?}"
    );
    assert_eq!(
        got.get("p/during").map(String::as_str),
        Some("2"),
        "{got:?}"
    );
}

/// MoveLeader: refused by a follower ("etcdserver: not leader") and for a non-member
/// ("etcdserver: bad leader transferee"); `etcdctl move-leader` needs the leader among its
/// endpoints, and sent to it moves leadership to the target, which `endpoint status` then shows.
#[tokio::test]
async fn move_leader_transfers_leadership() {
    let c = start(3).await;
    let ctl = c.etcdctl();
    let ids = member_ids(&ctl).await;
    let members: BTreeSet<u64> = ids.values().copied().collect();
    let old = c.leader().await.expect("leader");
    let target = (old + 1) % 3;
    let (old_id, target_id) = (ids[&Cluster::name(old)], ids[&Cluster::name(target)]);

    let mut follower = c.member(target).client().await.expect("client");
    assert_grpc_error(
        follower.move_leader(target_id).await,
        Code::FailedPrecondition,
        "etcdserver: not leader",
    );
    let mut leader = c.member(old).client().await.expect("client");
    assert_grpc_error(
        leader.move_leader(0xabcdef12345).await,
        Code::FailedPrecondition,
        "etcdserver: bad leader transferee",
    );
    let err = c
        .member(target)
        .etcdctl()
        .fail(&["move-leader", &hex(old_id)])
        .await;
    assert!(err.contains("no leader endpoint given"), "{err}");

    let out = c
        .member(old)
        .etcdctl()
        .ok(&["move-leader", &hex(target_id)])
        .await;
    assert!(
        squash(&out).contains(&format!(
            "Leadership transferred from {} to {}",
            hex(old_id),
            hex(target_id)
        )),
        "{out}"
    );
    let now = poll_until(WAIT, || async {
        match one_leader(&ctl, &members).await? {
            l if l == target_id => Ok(l),
            l => Err(format!("leader is {l:x}")),
        }
    })
    .await
    .unwrap_or_else(|e| panic!("{e}\n{}", c.log_tails()));
    assert_eq!(now, target_id);
    assert_eq!(c.leader().await.expect("leader"), target);
    let mut client = c.client().await.expect("client");
    client
        .put("after-move", "ok", None)
        .await
        .expect("writes after the move");
}

/// etcd allows one learner at a time (3.4 always; 3.5 by default): a second `member add
/// --learner` is refused with etcd's error and changes nothing. etcd 3.5's
/// `--experimental-max-learners` raises the limit (ours only: etcd 3.4 has no such flag).
#[tokio::test]
async fn learners_are_limited_as_etcd_limits_them() {
    let peer = |port: u16| format!("--peer-urls=http://127.0.0.1:{port}");
    let (m, _c) = crate::start().await;
    let ctl = m.etcdctl();
    reconfig(&ctl, &["member", "add", "l1", "--learner", &peer(1)])
        .await
        .expect("the first learner is added");
    let refused = reconfig(&ctl, &["member", "add", "l2", "--learner", &peer(2)])
        .await
        .expect_err("a second learner is refused");
    assert!(
        refused.contains("etcdserver: too many learner members in cluster"),
        "{refused}"
    );
    assert_eq!(member_rows(&ctl).await.expect("member list").len(), 2);
    if !crate::ours() {
        return;
    }
    let (m, _c) = crate::start_with(&["--experimental-max-learners", "2"]).await;
    let ctl = m.etcdctl();
    for (name, port) in [("l1", 1), ("l2", 2)] {
        reconfig(&ctl, &["member", "add", name, "--learner", &peer(port)])
            .await
            .unwrap_or_else(|e| panic!("learner {name}: {e}"));
    }
    let refused = reconfig(&ctl, &["member", "add", "l3", "--learner", &peer(3)])
        .await
        .expect_err("a third learner is refused");
    assert!(refused.contains("too many learner members"), "{refused}");
}

/// etcd's way out of a lost quorum: a 3-member cluster under writes loses two members for good
/// (SIGKILL, data gone); the survivor, restarted with `--force-new-cluster`, is a cluster of one
/// that holds every acknowledged write and takes new ones; then it grows back with `member add`
/// and a fresh member that catches up. Runs on etcd 3.4 too.
#[tokio::test]
async fn force_new_cluster_recovers_a_lost_quorum() {
    let mut c = start(3).await;
    let writer = Writer::spawn(c.member(0).client().await.expect("client"));
    writer.wait_for_more(30, "before the loss").await;
    let (acked, _) = writer.finish().await;
    c.kill9(1).expect("kill m1");
    c.kill9(2).expect("kill m2");
    for i in [1, 2] {
        let _ = std::fs::remove_dir_all(c.member(i).data_dir());
    }
    // Without a quorum the survivor cannot serve a linearizable read; with the flag it can.
    c.member_mut(0).add_setting("force-new-cluster", "true");
    c.restart(0)
        .await
        .unwrap_or_else(|e| panic!("the survivor restarts alone: {e:#}"));
    let survivor = c.member(0);
    if crate::ours() {
        // etcd's words (3.4 logs with capnslog, in others).
        assert!(
            survivor.log_contains("forcing restart member"),
            "{}",
            survivor.log_tail(20)
        );
    }
    let mut client = survivor.client().await.expect("client");
    check_writes("the survivor", &mut client, acked).await;
    client
        .put("after", "recovery", None)
        .await
        .expect("a new write");
    let ctl = survivor.etcdctl();
    let rows = member_rows(&ctl).await.expect("member list");
    assert_eq!(rows.len(), 1, "a cluster of one: {rows:?}");

    // It grows back: a new member (empty data dir) joins and catches up.
    let host = Cluster::host(3);
    let client_port = ports::reserve_on(host).expect("port");
    let peer_port = ports::reserve_on(host).expect("port");
    let peer_url = format!("http://{host}:{}", peer_port.port());
    let out = reconfig(
        &ctl,
        &["member", "add", "n4", &format!("--peer-urls={peer_url}")],
    )
    .await
    .expect("member add");
    let initial = out
        .lines()
        .find_map(|l| l.strip_prefix("ETCD_INITIAL_CLUSTER="))
        .map(|v| v.trim_matches('"').to_owned())
        .unwrap_or_else(|| panic!("no ETCD_INITIAL_CLUSTER in {out}"));
    let n4_opts = joining("n4", host, initial, c.token());
    let n4 = Member::spawn_on(n4_opts, client_port, peer_port).expect("spawn n4");
    poll_until(WAIT, || async {
        let mut client = probe_client(&n4.endpoint()).await?;
        let r = client
            .get("after", Some(GetOptions::new().with_serializable()))
            .await
            .map_err(|e| format!("serializable get on n4: {e}"))?;
        if pairs(r.kvs()) == [("after".to_owned(), "recovery".to_owned())] {
            Ok(())
        } else {
            Err(format!("n4 has {:?}", pairs(r.kvs())))
        }
    })
    .await
    .unwrap_or_else(|e| panic!("{e}\n--- n4 ---\n{}", n4.log_tail(30)));
    let mut n4_client = n4.client().await.expect("client");
    check_writes("n4", &mut n4_client, acked).await;
    assert_eq!(member_rows(&ctl).await.expect("member list").len(), 2);
}

/// etcd's `mayRemoveMember` (strict reconfiguration check, on by default): removing the only
/// voter is refused and the member keeps serving; with a voter down, removing a live one (which
/// would break the active quorum) is refused, while removing the one that is down is allowed.
#[tokio::test]
async fn member_remove_keeps_a_quorum_of_started_voters() {
    let single = start(1).await;
    let ctl = single.member(0).etcdctl();
    let ids = member_ids(&ctl).await;
    let only = hex(ids[single.member(0).name()]);
    let err = reconfig(&ctl, &["member", "remove", &only])
        .await
        .expect_err("removing the only voter");
    assert!(
        err.contains("etcdserver: re-configuration failed due to not enough started members"),
        "{err}"
    );
    assert_eq!(ctl.ok(&["put", "still", "serving"]).await, "OK\n");

    let mut cluster = start(3).await;
    let leader = cluster.leader().await.expect("a leader");
    let (down, live) = ((leader + 1) % 3, (leader + 2) % 3);
    let ctl = cluster.member(leader).etcdctl();
    let ids = member_ids(&ctl).await;
    let (down_id, live_id) = (
        hex(ids[cluster.member(down).name()]),
        hex(ids[cluster.member(live).name()]),
    );
    cluster.kill9(down).expect("kill");
    // The leader notices: its link to the killed member goes down.
    let leader_member = cluster.member(leader);
    poll_until(WAIT, || async {
        let body = leader_member
            .http_get("/metrics")
            .await
            .map_err(|e| format!("{e:#}"))?
            .body;
        let active: f64 = body
            .lines()
            .filter(|l| l.starts_with("etcd_network_active_peers"))
            .filter_map(|l| l.rsplit_once(' ')?.1.parse::<f64>().ok())
            .sum();
        if active <= 1.0 {
            Ok(())
        } else {
            Err(format!("{active} active peers"))
        }
    })
    .await
    .expect("the leader sees one peer down");
    let refused = ctl.fail(&["member", "remove", &live_id]).await;
    assert!(refused.contains(UNHEALTHY), "{refused}");
    let removed = reconfig(&ctl, &["member", "remove", &down_id])
        .await
        .expect("removing the member that is down");
    assert!(removed.contains("removed from cluster"), "{removed}");
    assert_eq!(ctl.ok(&["put", "after", "removal"]).await, "OK\n");
}
