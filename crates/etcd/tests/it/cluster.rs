//! Multi-member clusters (issue 4): static bootstrap from `--initial-cluster` (flags and `ETCD_*`
//! variables), reads and writes on every member, leader loss under writes, a full restart,
//! clusters that must not merge, bootstrap misconfigurations, and watch and lease on followers.
//!
//! Every member is a real process on its own loopback address (`testkit::Cluster`: member `i`
//! is `m<i>` on `127.0.0.<i + 2>`) with fast raft timers (`--heartbeat-interval 50
//! --election-timeout 500`). Validated against etcd 3.4.23:
//!
//! ```text
//! ETCDRS_TEST_ETCD_BIN=/usr/bin/etcd cargo nextest run -p etcdrs --test it cluster
//! ```

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use etcd_client::{Client, EventType, GetOptions, PutOptions, WatchOptions};
use etcdrs_testkit::{
    Cluster, ClusterOpts, Code, FAST_ELECTION_MS, Member, MemberOpts, assert_grpc_error,
    poll_until, ports,
};
use serde_json::Value;

use crate::{bin, pairs};

/// Deadline for every state the tests wait for (generous: 2 cores, several clusters at once).
const WAIT: Duration = Duration::from_secs(20);

fn cluster_opts() -> ClusterOpts {
    ClusterOpts::new(&bin())
}

async fn start(n: usize) -> Cluster {
    Cluster::start(n, cluster_opts())
        .await
        .unwrap_or_else(|e| panic!("{n}-member cluster starts: {e:#}"))
}

/// One client per member, by index.
async fn member_clients(c: &Cluster) -> Vec<Client> {
    let mut clients = Vec::new();
    for m in c.members() {
        clients.push(m.client().await.expect("client connects"));
    }
    clients
}

fn parse_json(out: &str) -> Result<Value, String> {
    serde_json::from_str(out).map_err(|e| format!("not JSON ({e}): {out:?}"))
}

/// Whether a log holds `msg` verbatim (etcd 3.4's capnslog lines) or as a JSON string (zap / our
/// JSON lines escape its quotes).
fn log_has(log: &str, msg: &str) -> bool {
    let json = serde_json::to_string(msg).expect("a string serializes");
    log.contains(msg) || log.contains(&json[1..json.len() - 1])
}

/// `etcdctl member list -w json` (retried until it answers), as the raw JSON.
async fn member_list_json(c: &Cluster) -> Value {
    let ctl = c.etcdctl();
    poll_until(WAIT, || async {
        let out = ctl
            .run(&["member", "list", "-w", "json"])
            .await
            .map_err(|e| format!("{e:#}"))?;
        if !out.success() {
            return Err(format!("member list failed: {}", out.stderr));
        }
        parse_json(&out.stdout)
    })
    .await
    .expect("member list")
}

/// One `member list` entry: `(name, peerURLs, clientURLs)`.
type MemberRow = (String, Vec<String>, Vec<String>);

/// `(name, peerURLs, clientURLs)` of every member, sorted, plus name -> ID.
fn members_of(list: &Value) -> (Vec<MemberRow>, BTreeMap<String, u64>) {
    let strings = |v: &Value| -> Vec<String> {
        v.as_array()
            .map(|a| {
                a.iter()
                    .filter_map(|s| s.as_str().map(str::to_owned))
                    .collect()
            })
            .unwrap_or_default()
    };
    let mut rows = Vec::new();
    let mut ids = BTreeMap::new();
    for m in list["members"].as_array().expect("members array") {
        let name = m["name"].as_str().unwrap_or_default().to_owned();
        ids.insert(name.clone(), m["ID"].as_u64().expect("member ID"));
        rows.push((name, strings(&m["peerURLs"]), strings(&m["clientURLs"])));
    }
    rows.sort();
    (rows, ids)
}

/// What `member list` must show for the cluster.
fn expected_members(c: &Cluster) -> Vec<MemberRow> {
    let mut rows: Vec<_> = c
        .members()
        .iter()
        .map(|m| (m.name().to_owned(), vec![m.peer_url()], vec![m.endpoint()]))
        .collect();
    rows.sort();
    rows
}

/// Checks a freshly bootstrapped cluster through etcdctl: `member list -w json` names every
/// member with its peer and client URLs (polled: a member's client URLs appear once it has
/// published itself), and `endpoint status --cluster -w json` answers for every member with
/// exactly one leader and one raft term (polled: an election may still be settling).
async fn check_bootstrapped(c: &Cluster) {
    let expected = expected_members(c);
    let ctl = c.etcdctl();
    let ids = poll_until(WAIT, || async {
        let out = ctl
            .run(&["member", "list", "-w", "json"])
            .await
            .map_err(|e| format!("{e:#}"))?;
        let list = parse_json(&out.stdout)?;
        let (rows, ids) = members_of(&list);
        if rows != expected {
            return Err(format!("member list {rows:?}, want {expected:?}"));
        }
        Ok(ids)
    })
    .await
    .unwrap_or_else(|e| panic!("{e}\n{}", c.log_tails()));
    let distinct: BTreeSet<u64> = ids.values().copied().collect();
    assert_eq!(distinct.len(), c.len(), "member IDs are distinct: {ids:?}");
    assert!(!distinct.contains(&0), "{ids:?}");

    let by_endpoint: BTreeMap<String, u64> = c
        .members()
        .iter()
        .map(|m| (m.endpoint(), ids[m.name()]))
        .collect();
    let (leader, term) = poll_until(WAIT, || async {
        let out = ctl
            .run(&["endpoint", "status", "--cluster", "-w", "json"])
            .await
            .map_err(|e| format!("{e:#}"))?;
        let rows = parse_json(&out.stdout)?;
        let rows = rows.as_array().ok_or("not an array")?;
        let mut seen = BTreeMap::new();
        let mut leaders = BTreeSet::new();
        let mut terms = BTreeSet::new();
        let mut clusters = BTreeSet::new();
        for r in rows {
            let endpoint = r["Endpoint"].as_str().unwrap_or_default().to_owned();
            let s = &r["Status"];
            seen.insert(endpoint, s["header"]["member_id"].as_u64().unwrap_or(0));
            leaders.insert(s["leader"].as_u64().unwrap_or(0));
            terms.insert(s["raftTerm"].as_u64().unwrap_or(0));
            clusters.insert(s["header"]["cluster_id"].as_u64().unwrap_or(0));
        }
        if seen != by_endpoint {
            return Err(format!("status of {seen:?}, want {by_endpoint:?}"));
        }
        if leaders.len() != 1 || terms.len() != 1 || clusters.len() != 1 {
            return Err(format!(
                "leaders {leaders:x?}, terms {terms:?}, cluster ids {clusters:x?}"
            ));
        }
        let leader = *leaders.first().expect("one leader");
        if !distinct.contains(&leader) {
            return Err(format!("leader {leader:x} is not a member ({ids:?})"));
        }
        if clusters.contains(&0) {
            return Err("cluster id 0".to_owned());
        }
        Ok((leader, *terms.first().expect("one term")))
    })
    .await
    .unwrap_or_else(|e| panic!("{e}\n{}", c.log_tails()));
    assert!(term >= 2, "a bootstrapped cluster elected at term {term}");
    // The leader etcdctl names is the one the testkit finds.
    let li = c.leader().await.expect("leader");
    assert_eq!(ids[c.member(li).name()], leader);
}

#[tokio::test]
async fn three_members_bootstrap() {
    let c = start(3).await;
    check_bootstrapped(&c).await;
}

#[tokio::test]
async fn five_members_bootstrap() {
    let c = start(5).await;
    check_bootstrapped(&c).await;
}

#[tokio::test]
async fn seven_members_bootstrap() {
    let c = start(7).await;
    check_bootstrapped(&c).await;
}

/// The same bootstrap with the whole configuration in `ETCD_*` variables and no flag at all.
#[tokio::test]
async fn three_members_bootstrap_from_env() {
    let c = Cluster::start(3, cluster_opts().via_env())
        .await
        .expect("cluster starts from ETCD_* variables");
    for (i, m) in c.members().iter().enumerate() {
        let pid = m.pid().expect("running");
        let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).expect("cmdline");
        let argv: Vec<&[u8]> = cmdline
            .split(|b| *b == 0)
            .filter(|a| !a.is_empty())
            .collect();
        assert_eq!(argv.len(), 1, "m{i} got command-line arguments: {argv:?}");
        let environ = std::fs::read(format!("/proc/{pid}/environ")).expect("environ");
        let environ = String::from_utf8_lossy(&environ);
        for var in [
            format!("ETCD_NAME=m{i}"),
            format!("ETCD_INITIAL_CLUSTER={}", c.initial_cluster()),
            format!("ETCD_INITIAL_CLUSTER_TOKEN={}", c.token()),
            format!("ETCD_INITIAL_ADVERTISE_PEER_URLS={}", m.peer_url()),
            format!("ETCD_ADVERTISE_CLIENT_URLS={}", m.endpoint()),
            format!("ETCD_ELECTION_TIMEOUT={FAST_ELECTION_MS}"),
        ] {
            assert!(environ.split('\0').any(|v| v == var), "m{i} lacks {var}");
        }
    }
    check_bootstrapped(&c).await;
}

/// A write made on any member is read back, linearizably, from every member; a serializable read
/// on a follower catches up with a write on the leader.
#[tokio::test]
async fn writes_on_any_member_are_read_on_every_member() {
    let c = start(3).await;
    let mut clients = member_clients(&c).await;
    let mut revs = Vec::new();
    for (i, client) in clients.iter_mut().enumerate() {
        let r = client
            .put(format!("rw/{i}"), format!("from-m{i}"), None)
            .await
            .unwrap_or_else(|e| panic!("put on m{i}: {e}"));
        revs.push(r.header().expect("header").revision());
    }
    assert_eq!(revs, [2, 3, 4], "each put is the next revision");
    let want: Vec<(String, String)> = (0..3)
        .map(|i| (format!("rw/{i}"), format!("from-m{i}")))
        .collect();
    for (j, client) in clients.iter_mut().enumerate() {
        let r = client
            .get("rw/", Some(GetOptions::new().with_prefix()))
            .await
            .unwrap_or_else(|e| panic!("linearizable get on m{j}: {e}"));
        assert_eq!(pairs(r.kvs()), want, "linearizable read on m{j}");
        assert_eq!(r.header().expect("header").revision(), 4, "m{j}");
    }

    let leader = c.leader().await.expect("leader");
    let rev = clients[leader]
        .put("rw/late", "on-leader", None)
        .await
        .expect("put on leader")
        .header()
        .expect("header")
        .revision();
    for f in (0..3).filter(|f| *f != leader) {
        let client = &clients[f];
        poll_until(WAIT, || {
            let mut client = client.clone();
            async move {
                let r = client
                    .get("rw/late", Some(GetOptions::new().with_serializable()))
                    .await
                    .map_err(|e| e.to_string())?;
                let got = pairs(r.kvs());
                let at = r.header().map(|h| h.revision()).unwrap_or(0);
                if got == [("rw/late".to_owned(), "on-leader".to_owned())] && at == rev {
                    Ok(())
                } else {
                    Err(format!(
                        "serializable read on m{f}: {got:?} at revision {at}"
                    ))
                }
            }
        })
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    }
}

const KILL_WRITERS: usize = 6;
const ACKS_BEFORE_KILL: usize = 150;
const ACKS_AFTER_KILL: usize = 150;

fn kill_key(writer: usize, i: usize) -> String {
    format!("kill/{writer}/{i:06}")
}

fn kill_value(writer: usize, i: usize) -> String {
    format!("w{writer}-{i}-{}", "v".repeat(i % 30))
}

/// SIGKILL the leader of a 3-member cluster while writers stream puts through every member.
///
/// Each writer sends put `i + 1` only after put `i` was acknowledged; a put that fails or times
/// out is retried, same key and value, on the next member. After the kill a new leader must be
/// elected within a few election timeouts and writes continue; every acknowledged put is then on
/// both survivors, and once the killed member is back all three report the same HashKV at the
/// same revision.
#[tokio::test]
async fn leader_sigkill_under_writes_loses_no_acknowledged_put() {
    let mut c = start(3).await;
    let old = c.leader().await.expect("leader");
    let clients = member_clients(&c).await;
    let old_term = clients[old]
        .clone()
        .status()
        .await
        .expect("status")
        .raft_term();

    let killed = Arc::new(AtomicBool::new(false));
    let stop = Arc::new(AtomicBool::new(false));
    let acked: Arc<Mutex<Vec<(String, String)>>> = Arc::default();
    let before = Arc::new(AtomicUsize::new(0));
    let after = Arc::new(AtomicUsize::new(0));
    let mut writers = Vec::new();
    for w in 0..KILL_WRITERS {
        let mut clients = clients.clone();
        let (killed, stop, acked) = (killed.clone(), stop.clone(), acked.clone());
        let (before, after) = (before.clone(), after.clone());
        writers.push(tokio::spawn(async move {
            let mut at = w % clients.len();
            let mut i = 0;
            while !stop.load(Ordering::SeqCst) {
                let post_kill = killed.load(Ordering::SeqCst);
                let (k, v) = (kill_key(w, i), kill_value(w, i));
                let put = clients[at].put(k.clone(), v.clone(), None);
                match tokio::time::timeout(Duration::from_secs(3), put).await {
                    Ok(Ok(_)) => {
                        acked.lock().expect("lock").push((k, v));
                        let counter = if post_kill { &after } else { &before };
                        counter.fetch_add(1, Ordering::SeqCst);
                        i += 1;
                    }
                    _ => {
                        // Unknown outcome: retry the same put elsewhere. The pause only paces
                        // retries against a dead endpoint; nothing waits on it.
                        at = (at + 1) % clients.len();
                        tokio::time::sleep(Duration::from_millis(20)).await;
                    }
                }
            }
            i
        }));
    }
    poll_until(Duration::from_secs(30), || async {
        let n = before.load(Ordering::SeqCst);
        if n >= ACKS_BEFORE_KILL {
            Ok(())
        } else {
            Err(format!("{n} acks before the kill"))
        }
    })
    .await
    .unwrap_or_else(|e| panic!("{e}\n{}", c.log_tails()));

    killed.store(true, Ordering::SeqCst);
    let killed_at = Instant::now();
    c.kill9(old).expect("SIGKILL the leader");
    let new = c
        .leader()
        .await
        .unwrap_or_else(|e| panic!("a new leader: {e}\n{}", c.log_tails()));
    let elected_in = killed_at.elapsed();
    eprintln!("new leader m{new} elected {elected_in:?} after SIGKILL of leader m{old}");
    assert_ne!(new, old);
    let new_term = clients[new]
        .clone()
        .status()
        .await
        .expect("status")
        .raft_term();
    assert!(new_term > old_term, "term {old_term} -> {new_term}");
    assert!(
        elected_in < Duration::from_millis(10 * FAST_ELECTION_MS),
        "new leader only after {elected_in:?} (election timeout {FAST_ELECTION_MS} ms)"
    );

    poll_until(Duration::from_secs(30), || async {
        let n = after.load(Ordering::SeqCst);
        if n >= ACKS_AFTER_KILL {
            Ok(())
        } else {
            Err(format!("{n} acks after the kill"))
        }
    })
    .await
    .unwrap_or_else(|e| panic!("writes continue after the kill: {e}\n{}", c.log_tails()));
    stop.store(true, Ordering::SeqCst);
    let mut acked_per_writer = Vec::new();
    for w in writers {
        acked_per_writer.push(w.await.expect("writer task"));
    }
    let acked = std::mem::take(&mut *acked.lock().expect("lock"));
    assert_eq!(acked.len(), acked_per_writer.iter().sum::<usize>());

    let check = |who: usize, stored: &BTreeMap<String, String>| {
        let missing: Vec<&String> = acked
            .iter()
            .filter(|(k, v)| stored.get(k) != Some(v))
            .map(|(k, _)| k)
            .collect();
        assert!(
            missing.is_empty(),
            "m{who}: {} of {} acknowledged puts missing or wrong, e.g. {:?}",
            missing.len(),
            acked.len(),
            &missing[..missing.len().min(5)]
        );
        // Per writer: keys 0..n with no gap, n = acked or acked + 1 (the last put may have
        // been applied without its acknowledgement reaching the writer).
        for (w, &n) in acked_per_writer.iter().enumerate() {
            let prefix = format!("kill/{w}/");
            let idx: Vec<usize> = stored
                .keys()
                .filter_map(|k| k.strip_prefix(&prefix))
                .map(|i| i.parse().expect("index"))
                .collect();
            assert!(
                idx.len() == n || idx.len() == n + 1,
                "m{who}: writer {w} has {} keys, {n} acknowledged",
                idx.len()
            );
            assert_eq!(
                idx,
                (0..idx.len()).collect::<Vec<_>>(),
                "m{who}: writer {w} gaps"
            );
            for i in idx {
                assert_eq!(stored[&kill_key(w, i)], kill_value(w, i), "m{who}");
            }
        }
    };
    for s in (0..3).filter(|s| *s != old) {
        let r = clients[s]
            .clone()
            .get("kill/", Some(GetOptions::new().with_prefix()))
            .await
            .unwrap_or_else(|e| panic!("linearizable read on survivor m{s}: {e}"));
        check(s, &pairs(r.kvs()).into_iter().collect());
    }

    c.restart(old)
        .await
        .unwrap_or_else(|e| panic!("restart the killed leader: {e:#}\n{}", c.log_tails()));
    let ctl = c.etcdctl();
    let endpoints: BTreeSet<String> = c.endpoints().into_iter().collect();
    let (rev, hash) = poll_until(WAIT, || async {
        let out = ctl
            .run(&["endpoint", "hashkv", "--cluster", "-w", "json"])
            .await
            .map_err(|e| format!("{e:#}"))?;
        let rows = parse_json(&out.stdout)?;
        let rows = rows.as_array().ok_or("not an array")?;
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
        let seen: BTreeSet<String> = got.keys().cloned().collect();
        if seen != endpoints || distinct.len() != 1 {
            return Err(format!("hashkv {got:?}"));
        }
        Ok(*distinct.first().expect("one"))
    })
    .await
    .unwrap_or_else(|e| panic!("{e}\n{}", c.log_tails()));
    assert!(
        rev > i64::try_from(acked.len()).expect("fits"),
        "revision {rev} (hash {hash}) below {} acknowledged puts",
        acked.len()
    );
    let mut back = c.member(old).client().await.expect("client");
    let r = back
        .get("kill/", Some(GetOptions::new().with_prefix()))
        .await
        .expect("read on the restarted member");
    check(old, &pairs(r.kvs()).into_iter().collect());
}

/// An acknowledged put: key, value, and when the acknowledgement came.
type Acked = (String, String, Instant);

/// A writer on a follower while the leader is SIGKILLed: how long it goes without an
/// acknowledged write (the client-visible stall). A proposal the dead leader took with it is
/// answered once the new leader's first entry applies without it (etcd's "request timed
/// out, possibly due to previous leader failure", which etcd gives only after its request
/// timeout, 5 s + 2 election timeouts); the writer then retries.
/// `--no-capture` prints the stall; with `ETCDRS_TEST_ETCD_BIN=/usr/bin/etcd` it is etcd's.
#[tokio::test]
async fn a_killed_leader_stalls_a_follower_s_writer_for_about_an_election() {
    let mut c = start(3).await;
    let leader = c.leader().await.expect("leader");
    let follower = (leader + 1) % 3;
    let mut client = c.member(follower).client().await.expect("client");
    let stop = Arc::new(AtomicBool::new(false));
    // (key, value, when acknowledged) of every acknowledged put; failures with their text.
    let acked: Arc<Mutex<Vec<Acked>>> = Arc::default();
    let failures: Arc<Mutex<Vec<String>>> = Arc::default();
    let writer = {
        let (stop, acked, failures) = (stop.clone(), acked.clone(), failures.clone());
        tokio::spawn(async move {
            let mut i = 0u64;
            while !stop.load(Ordering::SeqCst) {
                let (k, v) = (format!("stall/{i:06}"), format!("v{i}"));
                match client.put(k.clone(), v.clone(), None).await {
                    Ok(_) => {
                        acked.lock().expect("lock").push((k, v, Instant::now()));
                        i += 1;
                    }
                    Err(e) => {
                        failures.lock().expect("lock").push(e.to_string());
                        // Retry once the follower knows a leader again.
                        let _ = poll_until(WAIT, || {
                            let mut client = client.clone();
                            async move {
                                match client.status().await {
                                    Ok(s) if s.leader() != 0 => Ok(()),
                                    Ok(_) => Err("no leader".to_owned()),
                                    Err(e) => Err(e.to_string()),
                                }
                            }
                        })
                        .await;
                    }
                }
            }
        })
    };
    let acks = |acked: &Arc<Mutex<Vec<Acked>>>| acked.lock().expect("lock").len();
    poll_until(WAIT, || async {
        match acks(&acked) {
            n if n >= 50 => Ok(()),
            n => Err(format!("{n} acks")),
        }
    })
    .await
    .expect("writes before the kill");
    let before = acks(&acked);
    c.kill9(leader).expect("SIGKILL the leader");
    let killed_at = Instant::now();
    poll_until(WAIT, || async {
        match acks(&acked) - before {
            n if n >= 50 => Ok(()),
            n => Err(format!("{n} acks after the kill")),
        }
    })
    .await
    .unwrap_or_else(|e| panic!("writes go on after the kill: {e}\n{}", c.log_tails()));
    stop.store(true, Ordering::SeqCst);
    writer.await.expect("writer");
    let acked = std::mem::take(&mut *acked.lock().expect("lock"));
    let failures = std::mem::take(&mut *failures.lock().expect("lock"));
    // The stall: the longest time without an acknowledgement once the kill is near (the
    // writer's puts are sequential, so acknowledgements come in order).
    let times: Vec<Instant> = acked.iter().map(|(_, _, at)| *at).collect();
    let stall = times
        .windows(2)
        .filter(|w| w[1] > killed_at)
        .map(|w| w[1] - w[0])
        .max()
        .expect("acks around the kill");
    eprintln!(
        "writer on a follower: {stall:?} without an acknowledged put across the leader's SIGKILL \
         (election timeout {FAST_ELECTION_MS} ms); failures: {failures:?}"
    );
    // Every acknowledged put is there, read linearizably on the follower.
    let mut check = c.member(follower).client().await.expect("client");
    let stored: BTreeMap<String, String> = pairs(
        check
            .get("stall/", Some(GetOptions::new().with_prefix()))
            .await
            .expect("read")
            .kvs(),
    )
    .into_iter()
    .collect();
    for (k, v, _) in &acked {
        assert_eq!(stored.get(k), Some(v), "acknowledged {k}");
    }
    if !crate::ours() {
        return;
    }
    // Detection takes one to two election timeouts (raft's randomized timeout), the election
    // a few round trips; etcd's own stall is its request timeout, 6 s here.
    assert!(
        stall < Duration::from_millis(5 * FAST_ELECTION_MS),
        "a {stall:?} stall; failures: {failures:?}"
    );
    for failure in &failures {
        assert!(
            failure.contains("possibly due to previous leader failure")
                || failure.contains("no leader"),
            "{failure}"
        );
    }
}

/// SIGKILL every member, start them all again with the same flags: data, member IDs, cluster ID
/// and membership come back, and the cluster takes writes again.
#[tokio::test]
async fn full_restart_keeps_data_and_membership() {
    let mut c = start(3).await;
    let mut client = c.client().await.expect("client");
    for i in 0..20 {
        client
            .put(format!("full/{i:02}"), format!("v{i}"), None)
            .await
            .expect("put");
    }
    let list = member_list_json(&c).await;
    let (rows, ids) = members_of(&list);
    assert_eq!(rows, expected_members(&c));
    let mut before = Vec::new();
    for (i, mut m) in member_clients(&c).await.into_iter().enumerate() {
        let r = m
            .get("full/", Some(GetOptions::new().with_prefix()))
            .await
            .expect("get");
        let h = r.header().expect("header");
        assert_eq!(h.member_id(), ids[&Cluster::name(i)]);
        before.push((h.cluster_id(), h.member_id(), h.revision(), pairs(r.kvs())));
    }
    assert_eq!(before[0].3.len(), 20);
    drop(client);

    c.kill9_all().expect("SIGKILL all");
    c.restart_all()
        .await
        .unwrap_or_else(|e| panic!("restart all: {e:#}\n{}", c.log_tails()));
    assert!(c.members().iter().all(|m| m.starts() == 2));

    let mut after = Vec::new();
    for mut m in member_clients(&c).await {
        let r = m
            .get("full/", Some(GetOptions::new().with_prefix()))
            .await
            .expect("linearizable get after restart");
        let h = r.header().expect("header");
        after.push((h.cluster_id(), h.member_id(), h.revision(), pairs(r.kvs())));
    }
    assert_eq!(
        after, before,
        "(cluster id, member id, revision, data) per member"
    );
    let (rows_after, ids_after) = members_of(&member_list_json(&c).await);
    assert_eq!((rows_after, ids_after), (rows, ids));

    let mut client = c.client().await.expect("client");
    let rev = client
        .put("full/after", "restart", None)
        .await
        .expect("put after restart")
        .header()
        .expect("header")
        .revision();
    assert_eq!(rev, before[0].2 + 1);
}

/// Asserts that the lone member `b` of another cluster is not healthy, has no leader and does
/// not serve A's key `a-key`. etcd 3.4 does not serve clients at all before it has joined a
/// cluster (connections hang), so every probe has a short deadline and only answers are checked.
async fn assert_isolated(b: &Member) {
    const PROBE: Duration = Duration::from_millis(1500);
    let connect = || async {
        let opts = etcd_client::ConnectOptions::new()
            .with_connect_timeout(PROBE)
            .with_timeout(PROBE);
        Client::connect([b.endpoint()], Some(opts)).await
    };
    let health = async {
        if let Ok(Ok(r)) = tokio::time::timeout(PROBE, b.http_get("/health")).await {
            assert!(
                !r.body.contains(r#""health":"true""#),
                "B reports itself healthy: {}",
                r.body
            );
        }
    };
    let get = |options: GetOptions| async move {
        let read = async { connect().await?.get("a-key", Some(options)).await };
        if let Ok(Ok(r)) = tokio::time::timeout(2 * PROBE, read).await {
            assert!(r.kvs().is_empty(), "B serves A's key: {:?}", pairs(r.kvs()));
        }
    };
    let status = async {
        let status = async { connect().await?.status().await };
        if let Ok(Ok(s)) = tokio::time::timeout(2 * PROBE, status).await {
            assert_eq!(s.leader(), 0, "B has a leader");
        }
    };
    tokio::join!(
        health,
        get(GetOptions::new().with_serializable()),
        get(GetOptions::new()),
        status
    );
}

/// Cluster B is one member whose `--initial-cluster` names A's members for the other two names,
/// with its own token. The token goes into the cluster ID, so A's members refuse B's raft
/// messages ("cluster ID mismatch" in their logs), B never gets a leader, never serves A's keys,
/// and A goes on unchanged.
#[tokio::test]
async fn clusters_with_different_tokens_do_not_merge() {
    let a = start(3).await;
    let mut a_client = a.client().await.expect("client");
    a_client.put("a-key", "a-value", None).await.expect("put");
    let (rows_before, ids_before) = members_of(&member_list_json(&a).await);

    let b_opts = MemberOpts::new(&bin())
        .name(Cluster::name(0))
        .host(Cluster::host(3))
        .initial_peers((1..3).map(|i| (Cluster::name(i), a.member(i).peer_url())))
        .initial_cluster_token(format!("other-{}", a.token()))
        .fast_timers()
        .require_health();
    let b = Member::spawn(b_opts).expect("spawn B");

    poll_until(WAIT, || async {
        if a.members()
            .iter()
            .any(|m| m.log_contains("cluster ID mismatch"))
        {
            Ok(())
        } else {
            Err("no member of A logged a cluster ID mismatch")
        }
    })
    .await
    .unwrap_or_else(|e| panic!("{e}\n{}\n--- B ---\n{}", a.log_tails(), b.log_tail(30)));
    // B's side says so too: etcd 3.4 `request sent was ignored (cluster ID mismatch: peer[<id>]=
    // <A's id>, local=<B's id>)`.
    poll_until(WAIT, || async {
        if b.log_contains("cluster ID mismatch") {
            Ok(())
        } else {
            Err("B did not log a cluster ID mismatch")
        }
    })
    .await
    .unwrap_or_else(|e| panic!("{e}\n--- B ---\n{}", b.log_tail(30)));

    assert_isolated(&b).await;

    // A is unaffected: same members, same data, healthy, takes writes.
    let (rows_after, ids_after) = members_of(&member_list_json(&a).await);
    assert_eq!((rows_after, ids_after), (rows_before, ids_before));
    for (i, mut m) in member_clients(&a).await.into_iter().enumerate() {
        let r = m.get("a-key", None).await.expect("linearizable get on A");
        assert_eq!(pairs(r.kvs()), [("a-key".into(), "a-value".into())], "m{i}");
        let list = m.member_list().await.expect("member list");
        assert_eq!(list.members().len(), 3, "m{i}");
        let health = a.member(i).http_get("/health").await.expect("/health");
        assert!(
            health.body.contains(r#""health":"true""#),
            "m{i}: {}",
            health.body
        );
    }
    a_client
        .put("a-key2", "still", None)
        .await
        .expect("A takes writes");
    assert_isolated(&b).await;
}

/// `--name` absent from `--initial-cluster`: etcd exits with status 1 and
/// `couldn't find local name "<name>" in the initial cluster configuration`.
#[tokio::test]
async fn name_missing_from_initial_cluster_fails_at_start() {
    let p1 = ports::reserve_on(Cluster::host(0)).expect("port");
    let p2 = ports::reserve_on(Cluster::host(1)).expect("port");
    let initial = format!(
        "a=http://{}:{},b=http://{}:{}",
        Cluster::host(0),
        p1.port(),
        Cluster::host(1),
        p2.port()
    );
    let opts = MemberOpts::new(&bin())
        .name("z")
        .host(Cluster::host(2))
        .initial_cluster(initial)
        .fast_timers();
    let mut m = Member::spawn(opts).expect("spawn");
    let status = m.wait_exit(WAIT).await.expect("exits by itself");
    assert_eq!(status.code(), Some(1), "{status:?}\n{}", m.log_tail(20));
    let msg = r#"couldn't find local name "z" in the initial cluster configuration"#;
    assert!(
        log_has(&m.log(), msg),
        "log lacks {msg:?}:\n{}",
        m.log_tail(20)
    );
}

/// The `--initial-cluster` entry for the member's name differs from its
/// `--initial-advertise-peer-urls`: etcd exits with status 1 and
/// `--initial-cluster has <name>=<url> but missing from --initial-advertise-peer-urls=<urls>
/// (resolved urls: "<advertised>" != "<in initial cluster>")`.
#[tokio::test]
async fn advertised_peer_url_not_in_initial_cluster_fails_at_start() {
    let host = Cluster::host(0);
    let other = ports::reserve_on(host).expect("port");
    let listed = format!("http://{host}:{}", other.port());
    let opts = MemberOpts::new(&bin())
        .name("a")
        .host(host)
        .initial_cluster(format!("a={listed}"))
        .fast_timers();
    let mut m = Member::spawn(opts).expect("spawn");
    let status = m.wait_exit(WAIT).await;
    let log = m.log();
    let status = status.unwrap_or_else(|e| panic!("{e:#}"));
    assert_eq!(status.code(), Some(1), "{status:?}\n{}", m.log_tail(20));
    let own = m.peer_url();
    let msg = format!(
        "--initial-cluster has a={listed} but missing from --initial-advertise-peer-urls={own} \
         (resolved urls: \"{own}\" != \"{listed}\")"
    );
    assert!(
        log_has(&log, &msg),
        "log lacks {msg:?}:\n{}",
        m.log_tail(20)
    );
}

/// A watch on a follower sees, in order and with their revisions, the writes made on the leader
/// and a delete made on the other follower.
#[tokio::test]
async fn watch_on_follower_sees_writes_on_leader() {
    let c = start(3).await;
    let leader = c.leader().await.expect("leader");
    let f1 = (leader + 1) % 3;
    let f2 = (leader + 2) % 3;
    let mut clients = member_clients(&c).await;
    let mut stream = clients[f1]
        .watch("w/", Some(WatchOptions::new().with_prefix()))
        .await
        .expect("watch on follower");
    let created = tokio::time::timeout(WAIT, stream.message())
        .await
        .expect("created in time")
        .expect("watch stream")
        .expect("open");
    assert!(created.created(), "{created:?}");

    let mut want = Vec::new();
    for i in 0..10 {
        let (k, v) = (format!("w/{i}"), format!("v{i}"));
        let rev = clients[leader]
            .put(k.clone(), v.clone(), None)
            .await
            .expect("put on leader")
            .header()
            .expect("header")
            .revision();
        want.push(("PUT", k, v, rev));
    }
    let rev = clients[f2]
        .delete("w/3", None)
        .await
        .expect("delete on the other follower")
        .header()
        .expect("header")
        .revision();
    want.push(("DELETE", "w/3".into(), String::new(), rev));

    let deadline = Instant::now() + WAIT;
    let mut got = Vec::new();
    while got.len() < want.len() {
        let left = deadline.saturating_duration_since(Instant::now());
        let resp = tokio::time::timeout(left, stream.message())
            .await
            .unwrap_or_else(|_| panic!("events so far: {got:?}"))
            .expect("watch stream")
            .expect("open");
        assert!(!resp.canceled(), "{resp:?}");
        for e in resp.events() {
            let kv = e.kv().expect("kv");
            let kind = match e.event_type() {
                EventType::Put => "PUT",
                EventType::Delete => "DELETE",
            };
            got.push((
                kind,
                String::from_utf8_lossy(kv.key()).into_owned(),
                String::from_utf8_lossy(kv.value()).into_owned(),
                kv.mod_revision(),
            ));
        }
    }
    assert_eq!(got, want);
}

const LEASE_TTL: i64 = 3;

/// Keys of `prefix` on member `m` (linearizable read).
async fn keys_on(client: &Client, prefix: &str) -> Result<Vec<String>, String> {
    let r = client
        .clone()
        .get(prefix, Some(GetOptions::new().with_prefix()))
        .await
        .map_err(|e| e.to_string())?;
    Ok(crate::keys(r.kvs()))
}

/// Two leases granted on followers. Lease A (keys put through the leader and the other follower)
/// is left alone: its keys are on every member until its TTL runs out and then vanish from every
/// member, and TimeToLive reports it gone. Lease B is kept alive by keep-alives sent to a
/// follower for more than twice its TTL: its key stays everywhere; once the keep-alives stop,
/// it expires too.
#[tokio::test]
async fn leases_expire_everywhere_and_follower_keep_alive_holds_them() {
    let c = start(3).await;
    let leader = c.leader().await.expect("leader");
    let f1 = (leader + 1) % 3;
    let f2 = (leader + 2) % 3;
    let clients = member_clients(&c).await;
    let mut cl = clients.clone();

    let granted_a = Instant::now();
    let lease_a = cl[f1]
        .lease_grant(LEASE_TTL, None)
        .await
        .expect("grant A")
        .id();
    let granted_b = Instant::now();
    let lease_b = cl[f2]
        .lease_grant(LEASE_TTL, None)
        .await
        .expect("grant B")
        .id();
    let with_a = Some(PutOptions::new().with_lease(lease_a));
    cl[leader]
        .put("lease/a/0", "x", with_a.clone())
        .await
        .expect("put A0");
    cl[f2].put("lease/a/1", "x", with_a).await.expect("put A1");
    cl[f1]
        .put("lease/b", "x", Some(PutOptions::new().with_lease(lease_b)))
        .await
        .expect("put B");

    let (mut keeper, mut responses) = cl[f1].lease_keep_alive(lease_b).await.expect("keep-alive");
    let keep = Arc::new(AtomicBool::new(true));
    let keeping = {
        let keep = keep.clone();
        tokio::spawn(async move {
            let mut renewals = 0;
            // Renew at a client's pace (every TTL / 3 or so), not to wait for a state.
            let mut pace = tokio::time::interval(Duration::from_millis(500));
            while keep.load(Ordering::SeqCst) {
                pace.tick().await;
                keeper.keep_alive().await.expect("send keep-alive");
                let r = tokio::time::timeout(Duration::from_secs(5), responses.message())
                    .await
                    .expect("keep-alive answered in time")
                    .expect("keep-alive stream")
                    .expect("a keep-alive response");
                assert_eq!(
                    (r.id(), r.ttl()),
                    (lease_b, LEASE_TTL),
                    "renewal {renewals}"
                );
                renewals += 1;
            }
            renewals
        })
    };

    for (i, client) in clients.iter().enumerate() {
        let keys = keys_on(client, "lease/").await.expect("read");
        assert_eq!(keys, ["lease/a/0", "lease/a/1", "lease/b"], "m{i}");
    }

    // Lease A's keys vanish from every member, not before the TTL.
    for (i, client) in clients.iter().enumerate() {
        poll_until(WAIT, || async {
            let keys = keys_on(client, "lease/a/").await?;
            if keys.is_empty() {
                Ok(())
            } else {
                Err(format!("m{i} still has {keys:?}"))
            }
        })
        .await
        .unwrap_or_else(|e| panic!("{e}\n{}", c.log_tails()));
    }
    let expired_in = granted_a.elapsed();
    eprintln!("lease A (TTL {LEASE_TTL} s) gone from every member after {expired_in:?}");
    let ttl = Duration::from_secs(LEASE_TTL.unsigned_abs());
    assert!(
        expired_in >= ttl,
        "lease A expired after only {expired_in:?}"
    );
    assert!(
        expired_in < ttl + Duration::from_secs(3),
        "lease A expired late: {expired_in:?}"
    );
    let r = cl[f2]
        .lease_time_to_live(lease_a, None)
        .await
        .expect("TimeToLive A");
    assert_eq!(r.ttl(), -1, "TimeToLive of the expired lease: {r:?}");
    for (i, client) in clients.iter().enumerate() {
        let keys = keys_on(client, "lease/").await.expect("read");
        assert_eq!(keys, ["lease/b"], "m{i} lost the kept-alive key");
    }

    // Keep B alive for more than twice its TTL in all, checking every member all along that its
    // key never goes (the property is about elapsed time, so it is watched until then).
    let until = granted_b + 2 * ttl + Duration::from_millis(500);
    poll_until(WAIT, || async {
        for (i, client) in clients.iter().enumerate() {
            let keys = keys_on(client, "lease/").await.expect("read");
            assert_eq!(keys, ["lease/b"], "m{i} after {:?}", granted_b.elapsed());
        }
        if Instant::now() >= until {
            Ok(())
        } else {
            Err("still within twice the TTL")
        }
    })
    .await
    .expect("kept alive past twice its TTL");
    let r = cl[leader]
        .lease_time_to_live(lease_b, None)
        .await
        .expect("TimeToLive B");
    assert!(r.ttl() > 0 && r.ttl() <= LEASE_TTL, "{r:?}");

    keep.store(false, Ordering::SeqCst);
    let renewals = keeping.await.expect("keep-alive task");
    assert!(renewals >= 10, "only {renewals} renewals");
    let stopped = Instant::now();
    for (i, client) in clients.iter().enumerate() {
        poll_until(WAIT, || async {
            let keys = keys_on(client, "lease/").await?;
            if keys.is_empty() {
                Ok(())
            } else {
                Err(format!("m{i} still has {keys:?}"))
            }
        })
        .await
        .unwrap_or_else(|e| panic!("{e}\n{}", c.log_tails()));
    }
    let gone_in = stopped.elapsed();
    assert!(
        gone_in < ttl + Duration::from_secs(3),
        "lease B outlived its last keep-alive by {gone_in:?}"
    );
}

/// etcd's require-leader contract (`hasleader: true`, Go's `WithRequireLeader`, as
/// kube-apiserver watches): once a member has lost its quorum, an open watch that asked for a
/// leader ends with "etcdserver: no leader" after three election timeouts, new requests that
/// ask for one are refused at once, and requests that do not ask are still served.
#[tokio::test]
async fn require_leader_streams_end_and_requests_are_refused_without_a_leader() {
    let mut c = start(3).await;
    let survivor = 0;
    let opts = c
        .member(survivor)
        .connect_options(None)
        .with_require_leader(true);
    let mut strict = Client::connect([c.member(survivor).endpoint()], Some(opts))
        .await
        .expect("connect with require-leader");
    let mut stream = strict.watch("rl", None).await.expect("watch");
    let created = tokio::time::timeout(WAIT, stream.message()).await;
    assert!(
        matches!(created, Ok(Ok(Some(ref r))) if r.created()),
        "{created:?}"
    );
    strict
        .put("rl", "1", None)
        .await
        .expect("put with a leader");
    let event = tokio::time::timeout(WAIT, stream.message()).await;
    assert!(
        matches!(event, Ok(Ok(Some(ref r))) if r.events().len() == 1),
        "{event:?}"
    );

    // Timed from before the kills: the survivor may lose its leader at the first signal (the
    // leader was m1), and each kill9 also waits for the process to be reaped.
    let lost = Instant::now();
    c.kill9(1).expect("kill m1");
    c.kill9(2).expect("kill m2");
    // The stream ends with etcd's error; no event is expected meanwhile.
    let ended = tokio::time::timeout(WAIT, async {
        loop {
            match stream.message().await {
                Ok(Some(resp)) => assert!(resp.events().is_empty(), "{resp:?}"),
                other => return other,
            }
        }
    })
    .await
    .unwrap_or_else(|_| panic!("the watch did not end\n{}", c.log_tails()));
    assert_grpc_error(ended, Code::Unavailable, "etcdserver: no leader");
    // Not at the first sign of trouble: the member notices the loss after an election timeout,
    // then counts three election-timeout ticks without a leader (the first may come early).
    let election = Duration::from_millis(FAST_ELECTION_MS);
    assert!(
        lost.elapsed() >= 2 * election,
        "ended after {:?}",
        lost.elapsed()
    );

    let refused = strict
        .get("rl", Some(GetOptions::new().with_serializable()))
        .await;
    assert_grpc_error(refused, Code::Unavailable, "etcdserver: no leader");
    let mut lenient = c.member(survivor).client().await.expect("connect");
    let resp = lenient
        .get("rl", Some(GetOptions::new().with_serializable()))
        .await
        .expect("a serializable read without require-leader is served");
    assert_eq!(resp.kvs()[0].value(), b"1");
}

/// `--pre-vote`: a member whose peers are gone campaigns over and over; with pre-vote it only
/// pre-campaigns (raft's "became pre-candidate", the term unchanged), without it every
/// campaign is a real election at a new term ("became candidate"). Read from raft's log lines,
/// which raft-rs and etcd's raft word alike: `endpoint status` reports the term of the last
/// applied entry, as etcd does, so it does not move while there is no leader.
#[tokio::test]
async fn pre_vote_keeps_a_lone_member_from_raising_its_term() {
    for pre_vote in [true, false] {
        let opts = etcdrs_testkit::ClusterOpts::new(&bin()).arg(format!("--pre-vote={pre_vote}"));
        let mut cluster = etcdrs_testkit::Cluster::start(3, opts).await.unwrap();
        let leader = cluster.leader().await.unwrap();
        let lone = (leader + 1) % 3;
        // Only what it logs from here on: the cluster's first election is in the log before.
        let mark = cluster.member(lone).current_log().len();
        for i in (0..3).filter(|i| *i != lone) {
            cluster.kill9(i).unwrap();
        }
        let m = cluster.member(lone);
        let since = || m.current_log().get(mark..).unwrap_or_default().to_string();
        let (expected, other) = if pre_vote {
            ("became pre-candidate at term", "became candidate at term")
        } else {
            ("became candidate at term", "became pre-candidate at term")
        };
        etcdrs_testkit::poll_until(Duration::from_secs(20), || async {
            let campaigns = since().matches(expected).count();
            if campaigns >= 3 {
                Ok(())
            } else {
                Err(format!("{campaigns} times {expected:?} so far"))
            }
        })
        .await
        .unwrap();
        let log = since();
        assert!(
            !log.contains(other),
            "pre-vote={pre_vote}: {other:?} in {log}"
        );
    }
}
