//! Mixed clusters (issue 17): etcd 3.4 members (`/usr/bin/etcd`) and etcd-rs members in one
//! raft group, for a rolling migration with no downtime and the same path back; and the same
//! with etcd 3.5.1 members (issue 42; `ETCDRS_TEST_ETCD35`, which `scripts/test` sets).
//!
//! A 3-member etcd 3.4 cluster has its members replaced one by one: `member add` of an
//! etcd-rs member, its start with `--initial-cluster-state existing`, its catch-up (by log
//! replication, or, with compacted logs, through the leader's snapshot), `member remove`
//! of an etcd member; leadership is moved across implementations while that goes on, and a
//! SIGKILLed leader of each kind is replaced by election and restarted; then the
//! etcd-rs members are replaced by etcd 3.4 members again. A writer puts keys throughout on
//! whichever members are up; after every step every member has the same `hashkv` at one
//! revision, and at the end every acknowledged put is read linearizably on every member.
//!
//! The cluster version follows the lowest member: 3.4 while an etcd member is in, 3.5 once
//! only etcd-rs members are, and etcd's downgrade (validated and enabled through the JSON
//! gateway) takes it back to 3.4 before etcd 3.4 members can join again, also for a cluster
//! that etcd-rs started. Also: auth changes made through an etcd-rs member hold on its etcd
//! peers, and a member converted in place (etcd-rs started on its etcd data directory) rejoins
//! them and leads them.
//!
//! What differs with etcd 3.5.1: no downgrade is needed either way (the cluster runs at 3.5);
//! 3.5.1 keeps members' published attributes and promotions in its v2 store only (its
//! database's `members` bucket holds each member as added), so a snapshot from a 3.5.1 leader,
//! or a 3.5.1 data directory converted in place, gives the membership from the v2 store, as
//! etcd itself recovers it (before that fix the first etcd-rs member that joined was listed
//! nameless and `unstarted` once the 3.5.1 members were gone); and 3.5 proposes a new
//! password as `hashed_password`, the bcrypt hash in base64.
//! The initial corruption check (`--experimental-initial-corrupt-check`) asks peers of either
//! kind for their `hashkv` and refuses to start, in etcd's words, beside an altered member.

use std::collections::BTreeMap;
use std::net::Ipv4Addr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use etcd_client::{Client, GetOptions, LeaseTimeToLiveOptions, MemberAddOptions, PutOptions};
use etcdrs_testkit::{EtcdBin, Member, MemberOpts, http_request, poll_until, ports};

use crate::{ours, pairs};

const WAIT: Duration = Duration::from_secs(40);
const TOKEN: &str = "mixed-cluster";

fn etcd34() -> EtcdBin {
    EtcdBin::at("/usr/bin/etcd")
}

fn etcdrs() -> EtcdBin {
    EtcdBin::at(env!("CARGO_BIN_EXE_etcd"))
}

fn is_etcd34(bin: &EtcdBin) -> bool {
    bin.path() == etcd34().path()
}

fn is_etcdrs(bin: &EtcdBin) -> bool {
    bin.path() == etcdrs().path()
}

/// A member of the test's cluster: its process, raft id and whether it is etcd-rs.
struct Node {
    member: Member,
    id: u64,
    rs: bool,
}

/// Options of member `name` on `host`, one of the cluster `initial` (`name=url,…`).
fn opts(
    bin: &EtcdBin,
    name: &str,
    host: Ipv4Addr,
    initial: &str,
    existing: bool,
    compacted: bool,
) -> MemberOpts {
    let mut opts = MemberOpts::new(bin)
        .name(name)
        .host(host)
        .initial_cluster(initial)
        .initial_cluster_token(TOKEN)
        .fast_timers()
        .ready_timeout(WAIT);
    if existing {
        opts = opts.setting("initial-cluster-state", "existing");
    }
    // Compacted: etcd compacts its raft log often, so a late etcd-rs member needs etcd's
    // snapshot.
    if compacted && !is_etcdrs(bin) {
        opts = opts.setting("snapshot-count", "1000");
    }
    opts
}

fn host(i: u8) -> Ipv4Addr {
    Ipv4Addr::new(127, 0, 0, 40 + i)
}

/// The writer's view: the endpoints to write to, and what was acknowledged.
#[derive(Default)]
struct Writes {
    endpoints: Vec<String>,
    acked: Vec<(String, String)>,
    errors: Vec<String>,
    /// Linearizable reads, each through another member than the put it follows.
    reads: usize,
    read_errors: Vec<String>,
    /// Reads that did not see a put acknowledged before they began.
    stale: Vec<String>,
}

/// Puts `mixed/<n>` one at a time on the live endpoints (the next one on an error) until
/// `stop`; after each acknowledged put, reads the key back (linearizable) through the next
/// endpoint, which must see it.
fn writer(state: Arc<Mutex<Writes>>, stop: Arc<AtomicBool>) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let mut clients: BTreeMap<String, Client> = BTreeMap::new();
        let mut turn = 0usize;
        let mut n = 0u64;
        while !stop.load(Ordering::SeqCst) {
            let endpoints = state.lock().expect("lock").endpoints.clone();
            let endpoint = endpoints[turn % endpoints.len()].clone();
            if !clients.contains_key(&endpoint) {
                match Client::connect([endpoint.as_str()], None).await {
                    Ok(client) => {
                        clients.insert(endpoint.clone(), client);
                    }
                    Err(_) => {
                        turn += 1;
                        continue;
                    }
                }
            }
            let (key, value) = (format!("mixed/{n:06}"), format!("v{n}"));
            let client = clients.get_mut(&endpoint).expect("connected");
            let put = client.put(key.clone(), value.clone(), None);
            match tokio::time::timeout(Duration::from_secs(10), put).await {
                Ok(Ok(_)) => {
                    state
                        .lock()
                        .expect("lock")
                        .acked
                        .push((key.clone(), value.clone()));
                    n += 1;
                    // Through the next member that is up (a killed one stays listed
                    // until it is back).
                    for step in 1..endpoints.len().max(2) {
                        let other = &endpoints[(turn + step) % endpoints.len()];
                        if read_back(&mut clients, other, &key, &value, &state).await {
                            break;
                        }
                    }
                }
                Ok(Err(e)) => {
                    state.lock().expect("lock").errors.push(e.to_string());
                    clients.remove(&endpoint);
                    turn += 1;
                }
                Err(_) => {
                    state
                        .lock()
                        .expect("lock")
                        .errors
                        .push("timeout".to_owned());
                    clients.remove(&endpoint);
                    turn += 1;
                }
            }
        }
    })
}

/// Reads `key` through `endpoint` and records whether it held the acknowledged `value`;
/// false, recording nothing, when nothing listens there (a member that is down).
async fn read_back(
    clients: &mut BTreeMap<String, Client>,
    endpoint: &str,
    key: &str,
    value: &str,
    state: &Mutex<Writes>,
) -> bool {
    if !clients.contains_key(endpoint) {
        match Client::connect([endpoint], None).await {
            Ok(client) => {
                clients.insert(endpoint.to_owned(), client);
            }
            Err(_) => return false,
        }
    }
    let client = clients.get_mut(endpoint).expect("connected");
    let got = tokio::time::timeout(Duration::from_secs(10), client.get(key, None)).await;
    if matches!(&got, Ok(Err(e)) if e.to_string().contains("tcp connect error")) {
        clients.remove(endpoint);
        return false;
    }
    let mut state = state.lock().expect("lock");
    match got {
        Ok(Ok(resp)) => {
            let seen = resp.kvs().first().map(|kv| kv.value().to_vec());
            if seen.as_deref() == Some(value.as_bytes()) {
                state.reads += 1;
            } else {
                state
                    .stale
                    .push(format!("{key} through {endpoint}: {seen:?}"));
            }
        }
        Ok(Err(e)) => {
            state.read_errors.push(e.to_string());
            clients.remove(endpoint);
        }
        Err(_) => {
            state.read_errors.push("timeout".to_owned());
            clients.remove(endpoint);
        }
    }
    true
}

/// Waits until every node reports the same `hashkv` at the revision one of them is at now.
async fn same_hashkv(nodes: &[Node]) -> (i64, u32) {
    let mut client = nodes[0].member.client().await.expect("client");
    let rev = client
        .get("mixed/", Some(GetOptions::new().with_count_only()))
        .await
        .expect("revision")
        .header()
        .expect("header")
        .revision();
    poll_until(WAIT, || async {
        let mut hashes = Vec::new();
        for node in nodes {
            let mut c = node.member.client().await.map_err(|e| e.to_string())?;
            let h = c.hash_kv(rev).await.map_err(|e| e.to_string())?;
            hashes.push(h.hash());
        }
        if hashes.windows(2).all(|w| w[0] == w[1]) {
            Ok((rev, hashes[0]))
        } else {
            Err(format!("hashkv at {rev}: {hashes:?}"))
        }
    })
    .await
    .unwrap_or_else(|e| panic!("{e}"))
}

/// The leader's raft id, as a member reports it.
async fn leader(nodes: &[Node]) -> u64 {
    poll_until(WAIT, || async {
        for node in nodes {
            if let Ok(mut c) = node.member.client().await
                && let Ok(status) = c.status().await
                && status.leader() != 0
            {
                return Ok(status.leader());
            }
        }
        Err("no leader")
    })
    .await
    .expect("a leader")
}

/// Replaces `nodes[old]` by a fresh member of the other implementation (etcd-rs, or the
/// etcd of `etcd`), started on `host`: member add, start, catch-up, member remove.
async fn replace(
    etcd: &EtcdBin,
    nodes: &mut Vec<Node>,
    old: usize,
    name: &str,
    host: Ipv4Addr,
    writes: &Arc<Mutex<Writes>>,
    compacted: bool,
) {
    let rs = !nodes[old].rs;
    let client_port = ports::reserve_on(host).expect("port");
    let peer_port = ports::reserve_on(host).expect("port");
    let peer_url = format!("http://{host}:{}", peer_port.port());
    let admin = nodes[(old + 1) % nodes.len()]
        .member
        .client()
        .await
        .expect("client");
    // With compacted logs the newcomer catches up through a snapshot of the other
    // implementation's: the leader is moved to a member of it first.
    if compacted {
        let from = leader(nodes).await;
        let lead = nodes.iter().find(|n| n.id == from).expect("leader node");
        if lead.rs == rs {
            let to = nodes
                .iter()
                .find(|n| n.rs != rs)
                .expect("a member of the other kind");
            let mut c = lead.member.client().await.expect("client");
            c.move_leader(to.id).await.expect("move leader");
            assert_eq!(leader(nodes).await, to.id, "leadership moved");
        }
    }
    // The first etcd-rs member to join an etcd 3.5 cluster joins as a learner, promoted by an
    // etcd member once it has caught up: etcd 3.5.1 keeps the promotion in its v2 store only,
    // and the members that join later through its snapshot must list a voter.
    let learner = rs && !is_etcd34(etcd) && nodes.iter().all(|n| !n.rs);
    let added = poll_until(WAIT, || async {
        admin
            .clone()
            .member_add(
                vec![peer_url.clone()],
                learner.then(|| MemberAddOptions::new().with_is_learner()),
            )
            .await
            .map_err(|e| e.to_string())
    })
    .await
    .expect("member add");
    let id = added.member().expect("added member").id();
    let mut initial: Vec<String> = added
        .member_list()
        .iter()
        .filter(|m| !m.name().is_empty())
        .map(|m| format!("{}={}", m.name(), m.peer_urls()[0]))
        .collect();
    initial.push(format!("{name}={peer_url}"));
    let bin = if rs { etcdrs() } else { etcd.clone() };
    let mut member = Member::spawn_on(
        opts(&bin, name, host, &initial.join(","), true, compacted),
        client_port,
        peer_port,
    )
    .expect("spawn");
    member
        .wait_ready()
        .await
        .unwrap_or_else(|e| panic!("{name} joins: {e:#}\n{}", member.log_tail(30)));
    if learner {
        // etcd refuses to promote a learner that has not caught up yet.
        poll_until(WAIT, || async {
            admin
                .clone()
                .member_promote(id)
                .await
                .map_err(|e| e.to_string())
        })
        .await
        .expect("promote the learner");
    }
    writes
        .lock()
        .expect("lock")
        .endpoints
        .push(member.endpoint());
    nodes.push(Node { member, id, rs });
    same_hashkv(nodes).await;

    // Take the old member out; first move leadership away from it, if it leads.
    let gone = nodes[old].id;
    if leader(nodes).await == gone {
        let mut c = nodes[old].member.client().await.expect("client");
        c.move_leader(id)
            .await
            .expect("move leader off the member to remove");
    }
    let removed_endpoint = nodes[old].member.endpoint();
    writes
        .lock()
        .expect("lock")
        .endpoints
        .retain(|e| *e != removed_endpoint);
    let admin = nodes[nodes.len() - 1]
        .member
        .client()
        .await
        .expect("client");
    poll_until(WAIT, || async {
        admin
            .clone()
            .member_remove(gone)
            .await
            .map_err(|e| e.to_string())
    })
    .await
    .expect("member remove");
    let mut old_node = nodes.remove(old);
    let status = old_node
        .member
        .wait_exit(WAIT)
        .await
        .expect("the removed member exits");
    assert_eq!(status.code(), Some(0), "a removed member exits 0");
    same_hashkv(nodes).await;
}

/// A new 3-member cluster of `bin` members named `names`, on hosts from `salt`, with their
/// raft ids.
async fn start_cluster(bin: &EtcdBin, names: [&str; 3], salt: u8, compacted: bool) -> Vec<Node> {
    let reserved: Vec<_> = (0..3)
        .map(|i| {
            let h = host(salt + i);
            (
                h,
                ports::reserve_on(h).expect("port"),
                ports::reserve_on(h).expect("port"),
            )
        })
        .collect();
    let initial: Vec<String> = names
        .iter()
        .zip(&reserved)
        .map(|(n, (h, _, p))| format!("{n}=http://{h}:{}", p.port()))
        .collect();
    let initial = initial.join(",");
    let rs = is_etcdrs(bin);
    let mut nodes = Vec::new();
    for (name, (h, c, p)) in names.iter().zip(reserved) {
        let member =
            Member::spawn_on(opts(bin, name, h, &initial, false, compacted), c, p).expect("spawn");
        nodes.push(Node { member, id: 0, rs });
    }
    for node in &mut nodes {
        node.member.wait_ready().await.expect("member ready");
    }
    let mut client = nodes[0].member.client().await.expect("client");
    for m in client.member_list().await.expect("members").members() {
        if let Some(node) = nodes.iter_mut().find(|n| n.member.name() == m.name()) {
            node.id = m.id();
        }
    }
    nodes
}

/// Waits until every node's `/version` reports cluster version `want`.
async fn wait_cluster_version(nodes: &[Node], want: &str) {
    poll_until(WAIT, || async {
        let mut seen = Vec::new();
        for node in nodes {
            let v = node
                .member
                .http_get("/version")
                .await
                .map_err(|e| e.to_string())?;
            let json = v.json().map_err(|e| e.to_string())?;
            seen.push(json["etcdcluster"].as_str().unwrap_or_default().to_owned());
        }
        if seen.iter().all(|v| v == want) {
            Ok(())
        } else {
            Err(format!("cluster versions {seen:?}, want {want}"))
        }
    })
    .await
    .unwrap_or_else(|e| panic!("{e}"));
}

/// `Maintenance.Downgrade` through the JSON gateway, as an operator without etcd 3.6's
/// etcdctl calls it: the status and the body.
async fn downgrade(node: &Node, action: &str, version: &str) -> (u16, serde_json::Value) {
    let body = format!(r#"{{"action":"{action}","version":"{version}"}}"#);
    let r = http_request(
        &node.member.client_addr(),
        "POST",
        "/v3/maintenance/downgrade",
        &[("Content-Type", "application/json")],
        body.as_bytes(),
    )
    .await
    .expect("downgrade request");
    (r.status, r.json().expect("JSON answer"))
}

/// The cluster of etcd-rs members only runs at 3.5; etcd's downgrade to 3.4 (validated,
/// enabled) lowers it to 3.4.0 on every member, so that etcd 3.4 members can join.
async fn downgrade_to_34(nodes: &[Node]) {
    wait_cluster_version(nodes, "3.5.0").await;
    let (status, body) = downgrade(&nodes[0], "VALIDATE", "3.3").await;
    assert_eq!(status, 400, "{body}");
    assert_eq!(
        body["message"],
        "etcdserver: invalid downgrade target version"
    );
    let (status, body) = downgrade(&nodes[1], "VALIDATE", "3.4").await;
    assert_eq!((status, &body["version"]), (200, &"3.5.0".into()), "{body}");
    let (status, body) = downgrade(&nodes[1], "ENABLE", "3.4").await;
    assert_eq!(status, 200, "{body}");
    let (status, body) = downgrade(&nodes[2], "ENABLE", "3.4").await;
    assert_eq!(
        (status, &body["message"]),
        (
            // FailedPrecondition, as etcd's gateway maps it.
            412,
            &"etcdserver: cluster has a downgrade job in progress".into()
        ),
        "{body}"
    );
    wait_cluster_version(nodes, "3.4.0").await;
    let peer = nodes[0]
        .member
        .peer_url()
        .trim_start_matches("http://")
        .to_owned();
    let enabled = http_request(&peer, "GET", "/downgrade/enabled", &[], b"")
        .await
        .expect("downgrade/enabled");
    assert_eq!(enabled.body, "true");
}

/// Every node lists exactly the nodes, each started (with its name, peer URL and client URL)
/// and a voter.
async fn check_member_list(nodes: &[Node]) {
    let mut want: Vec<(u64, String, String, String, bool)> = nodes
        .iter()
        .map(|n| {
            (
                n.id,
                n.member.name().to_owned(),
                n.member.peer_url(),
                n.member.endpoint(),
                false,
            )
        })
        .collect();
    want.sort();
    for node in nodes {
        let name = node.member.name().to_owned();
        let c = node.member.client().await.expect("client");
        poll_until(WAIT, || async {
            let list = c.clone().member_list().await.map_err(|e| e.to_string())?;
            let mut got: Vec<(u64, String, String, String, bool)> = list
                .members()
                .iter()
                .map(|m| {
                    (
                        m.id(),
                        m.name().to_owned(),
                        m.peer_urls().join(","),
                        m.client_urls().join(","),
                        m.is_learner(),
                    )
                })
                .collect();
            got.sort();
            if got == want {
                Ok(())
            } else {
                Err(format!(
                    "member list through {name}: {got:?}, want {want:?}"
                ))
            }
        })
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    }
}

/// Every acknowledged put of the writer is on every node, and the nodes agree on `hashkv`.
async fn check_writes(nodes: &[Node], writes: Writes, replacements: usize) {
    eprintln!(
        "{} puts acknowledged across {replacements} replacements; errors: {:?}; \
         {} linearizable reads through another member; read errors: {:?}",
        writes.acked.len(),
        writes.errors,
        writes.reads,
        writes.read_errors
    );
    assert!(
        writes.stale.is_empty(),
        "reads that missed an acknowledged put: {:?}",
        writes.stale
    );
    assert!(writes.reads > 50, "{} reads", writes.reads);
    assert!(
        writes.acked.len() > 50,
        "{} acknowledged",
        writes.acked.len()
    );
    // The errors a client sees are those of a leader change (etcd's retriable ones, from
    // either kind of member) or of a connection to a member that is going away, and few.
    const RETRIABLE: &[&str] = &[
        "etcdserver: no leader",
        "raft proposal dropped",
        "etcdserver: request timed out",
        "etcdserver: leader changed",
        "transport error",
        // A member that is down (killed or removed) while the endpoint list still names it,
        // or stopping as it is removed.
        "tcp connect error",
        "etcdserver: server stopped",
    ];
    for errors in [&writes.errors, &writes.read_errors] {
        for error in errors {
            assert!(
                RETRIABLE.iter().any(|r| error.contains(r)),
                "a client error beyond leader-change retries: {error}"
            );
        }
        assert!(
            errors.len() <= 2 * replacements + 4,
            "{} errors over {replacements} replacements: {errors:?}",
            errors.len(),
        );
    }
    for node in nodes {
        let mut c = node.member.client().await.expect("client");
        let stored: BTreeMap<String, String> = pairs(
            c.get("mixed/", Some(GetOptions::new().with_prefix()))
                .await
                .expect("read")
                .kvs(),
        )
        .into_iter()
        .collect();
        for (k, v) in &writes.acked {
            assert_eq!(
                stored.get(k),
                Some(v),
                "{}: acknowledged {k}",
                node.member.name()
            );
        }
    }
    same_hashkv(nodes).await;
}

/// The rolling migration: etcd 3.4 members replaced by etcd-rs ones, leadership moved
/// across implementations on the way and a leader of each kind SIGKILLed and restarted; with `back`, then replaced by etcd 3.4 members again.
/// `compacted`: the etcd members compact their log (`--snapshot-count 1000` after 6,000
/// puts), so the first etcd-rs member catches up through etcd's merged snapshot, and the
/// etcd 3.4 members on the way back through etcd-rs's (the v2 store's JSON and a bbolt
/// database, as etcd sends it).
async fn rolling_migration(etcd: &EtcdBin, compacted: bool, back: bool, salt: u8) {
    let mut nodes = start_cluster(etcd, ["e0", "e1", "e2"], salt, compacted).await;
    let client = nodes[0].member.client().await.expect("client");
    // More than etcd's 5000 catch-up entries: the first newcomer needs a snapshot.
    let mut load = Vec::new();
    for t in 0..if compacted { 20 } else { 1 } {
        let mut c = client.clone();
        load.push(tokio::spawn(async move {
            for i in 0..300 {
                c.put(format!("load/{t}/{i}"), "x".repeat(64), None)
                    .await
                    .expect("load put");
            }
        }));
    }
    for l in load {
        l.await.expect("load");
    }

    let writes = Arc::new(Mutex::new(Writes {
        endpoints: nodes.iter().map(|n| n.member.endpoint()).collect(),
        ..Writes::default()
    }));
    let stop = Arc::new(AtomicBool::new(false));
    let task = writer(writes.clone(), stop.clone());

    // etcd 3.4 -> etcd-rs, member by member.
    for (step, name) in ["r0", "r1", "r2"].iter().enumerate() {
        let old = nodes
            .iter()
            .position(|n| !n.rs)
            .expect("an etcd member left");
        replace(
            etcd,
            &mut nodes,
            old,
            name,
            host(salt + 3 + step as u8),
            &writes,
            compacted,
        )
        .await;
        if step == 0 {
            // Leadership across implementations, both ways, while writing.
            let rs = nodes.iter().find(|n| n.rs).map(|n| n.id).expect("rs");
            let etcd = nodes.iter().find(|n| !n.rs).map(|n| n.id).expect("etcd");
            for to in [rs, etcd, rs] {
                let from = leader(&nodes).await;
                if from != to {
                    let at = nodes.iter().find(|n| n.id == from).expect("leader node");
                    let mut c = at.member.client().await.expect("client");
                    c.move_leader(to).await.expect("move leader");
                }
                assert_eq!(leader(&nodes).await, to, "leadership moved");
            }
            // A SIGKILLed leader of either kind: the others elect a new one, the writer goes
            // on, and the killed member restarts from its data dir and catches up.
            for kill_rs in [true, false] {
                let target = nodes
                    .iter()
                    .find(|n| n.rs == kill_rs)
                    .map(|n| n.id)
                    .expect("node");
                let from = leader(&nodes).await;
                if from != target {
                    let at = nodes.iter().find(|n| n.id == from).expect("leader node");
                    let mut c = at.member.client().await.expect("client");
                    c.move_leader(target).await.expect("move leader");
                }
                assert_eq!(leader(&nodes).await, target);
                let i = nodes.iter().position(|n| n.id == target).expect("index");
                nodes[i].member.kill9().expect("SIGKILL the leader");
                poll_until(WAIT, || async {
                    for (j, node) in nodes.iter().enumerate() {
                        if j == i {
                            continue;
                        }
                        if let Ok(mut c) = node.member.client().await
                            && let Ok(status) = c.status().await
                            && status.leader() != 0
                            && status.leader() != target
                        {
                            return Ok(());
                        }
                    }
                    Err("no new leader")
                })
                .await
                .expect("a new leader after the SIGKILL");
                nodes[i]
                    .member
                    .restart()
                    .await
                    .unwrap_or_else(|e| panic!("restart the killed leader: {e:#}"));
                same_hashkv(&nodes).await;
            }
        }
    }
    assert!(nodes.iter().all(|n| n.rs));
    check_member_list(&nodes).await;
    if back {
        // And back: once the last etcd member has gone the cluster runs at 3.5, so it is
        // downgraded to 3.4 first; then etcd 3.4 members join the etcd-rs cluster and
        // replace it.
        if is_etcd34(etcd) {
            downgrade_to_34(&nodes).await;
        } else {
            // etcd 3.5 joins a cluster at 3.5 as it is.
            wait_cluster_version(&nodes, "3.5.0").await;
        }
        for (step, name) in ["b0", "b1", "b2"].iter().enumerate() {
            let old = nodes
                .iter()
                .position(|n| n.rs)
                .expect("an etcd-rs member left");
            replace(
                etcd,
                &mut nodes,
                old,
                name,
                host(salt + 6 + step as u8),
                &writes,
                compacted,
            )
            .await;
        }
        assert!(nodes.iter().all(|n| !n.rs));
        check_member_list(&nodes).await;
    }

    stop.store(true, Ordering::SeqCst);
    task.await.expect("writer");
    let writes = std::mem::take(&mut *writes.lock().expect("lock"));
    check_writes(&nodes, writes, if back { 6 } else { 3 }).await;
}

#[tokio::test]
async fn an_etcd_34_cluster_becomes_etcd_rs_and_back_member_by_member_while_writing() {
    if !ours() {
        return;
    }
    rolling_migration(&etcd34(), false, true, 0).await;
}

#[tokio::test]
async fn a_rolling_migration_with_compacted_logs_catches_up_through_snapshots_both_ways() {
    if !ours() {
        return;
    }
    rolling_migration(&etcd34(), true, true, 10).await;
}

/// The rolling migration of an etcd 3.5.1 cluster, its members catching up through snapshots
/// both ways. etcd 3.5 keeps its membership in both its v2 store and its v3 backend's `members`
/// bucket and hands both on in its snapshot; each member's published attributes (name, client
/// URLs) must survive every hand-over, whichever kind of member applied and sent them.
#[tokio::test]
async fn an_etcd_35_cluster_becomes_etcd_rs_and_back_through_snapshots_while_writing() {
    if !ours() {
        return;
    }
    rolling_migration(&crate::etcd35(), true, true, 50).await;
}

/// The reverse from the start: a new etcd-rs cluster runs at 3.5, which an etcd 3.4 member
/// refuses to join; downgraded to 3.4, it takes etcd 3.4 members, which replace it one by one
/// under a writer.
#[tokio::test]
async fn a_new_etcd_rs_cluster_downgrades_and_etcd_34_members_replace_it() {
    if !ours() {
        return;
    }
    let salt = 20;
    let mut nodes = start_cluster(&etcdrs(), ["r0", "r1", "r2"], salt, false).await;
    wait_cluster_version(&nodes, "3.5.0").await;

    // etcd 3.4 refuses a cluster at 3.5, as it refuses etcd 3.5's.
    let h = host(salt + 3);
    let (client_port, peer_port) = (
        ports::reserve_on(h).expect("port"),
        ports::reserve_on(h).expect("port"),
    );
    let peer_url = format!("http://{h}:{}", peer_port.port());
    let admin = nodes[0].member.client().await.expect("client");
    let added = admin
        .clone()
        .member_add(vec![peer_url.clone()], None)
        .await
        .expect("member add");
    let id = added.member().expect("added").id();
    let mut initial: Vec<String> = added
        .member_list()
        .iter()
        .filter(|m| !m.name().is_empty())
        .map(|m| format!("{}={}", m.name(), m.peer_urls()[0]))
        .collect();
    initial.push(format!("early={peer_url}"));
    let mut early = Member::spawn_on(
        opts(&etcd34(), "early", h, &initial.join(","), true, false),
        client_port,
        peer_port,
    )
    .expect("spawn");
    let status = early.wait_exit(WAIT).await.expect("etcd 3.4 gives up");
    assert_ne!(status.code(), Some(0));
    assert!(
        early.log_contains("incompatible with current running cluster"),
        "{}",
        early.log_tail(20)
    );
    admin
        .clone()
        .member_remove(id)
        .await
        .expect("member remove");

    downgrade_to_34(&nodes).await;
    let writes = Arc::new(Mutex::new(Writes {
        endpoints: nodes.iter().map(|n| n.member.endpoint()).collect(),
        ..Writes::default()
    }));
    let stop = Arc::new(AtomicBool::new(false));
    let task = writer(writes.clone(), stop.clone());
    for (step, name) in ["b0", "b1", "b2"].iter().enumerate() {
        let old = nodes
            .iter()
            .position(|n| n.rs)
            .expect("an etcd-rs member left");
        replace(
            &etcd34(),
            &mut nodes,
            old,
            name,
            host(salt + 4 + step as u8),
            &writes,
            false,
        )
        .await;
    }
    assert!(nodes.iter().all(|n| !n.rs));
    stop.store(true, Ordering::SeqCst);
    task.await.expect("writer");
    let writes = std::mem::take(&mut *writes.lock().expect("lock"));
    check_writes(&nodes, writes, 3).await;
}

/// Users added and passwords changed through an etcd-rs member of an etcd 3.4 cluster work on
/// the etcd 3.4 members too: below cluster version 3.5 etcd-rs proposes the password in clear
/// text, as etcd 3.4 does (etcd 3.4's applier knows no `hashed_password` and would hash an
/// empty password in its place).
#[tokio::test]
async fn auth_changes_through_an_etcd_rs_member_hold_on_its_etcd_34_peers() {
    if !ours() {
        return;
    }
    auth_changes_through_etcd_rs(&etcd34(), 30).await;
}

/// The same with etcd 3.5.1 peers, at cluster version 3.5: etcd-rs proposes the password
/// hashed (`hashed_password`), as etcd 3.5 does, and the 3.5.1 members' logins take it.
#[tokio::test]
async fn auth_changes_through_an_etcd_rs_member_hold_on_its_etcd_35_peers() {
    if !ours() {
        return;
    }
    auth_changes_through_etcd_rs(&crate::etcd35(), 70).await;
}

async fn auth_changes_through_etcd_rs(etcd: &EtcdBin, salt: u8) {
    let mut nodes = start_cluster(etcd, ["e0", "e1", "e2"], salt, false).await;
    let writes = Arc::new(Mutex::new(Writes::default()));
    replace(etcd, &mut nodes, 0, "r0", host(salt + 3), &writes, false).await;
    let rs = nodes.iter().find(|n| n.rs).expect("the etcd-rs member");
    let ctl = rs.member.etcdctl();
    for args in [
        &["user", "add", "root:rootpw"][..],
        &["user", "add", "alice:first"],
        &["role", "add", "reader"],
        &["role", "grant-permission", "reader", "read", "k"],
        &["user", "grant-role", "alice", "reader"],
        &["put", "k", "v"],
    ] {
        ctl.ok(args).await;
    }
    ctl.ok_stdin(
        &["user", "passwd", "alice", "--interactive=false"],
        "second\n",
    )
    .await;
    ctl.ok(&["auth", "enable"]).await;
    for node in &nodes {
        let name = node.member.name().to_owned();
        let ctl = node.member.etcdctl();
        poll_until(WAIT, || async {
            let out = ctl
                .clone()
                .with_user("alice:second")
                .run(&["get", "k", "--print-value-only"])
                .await
                .map_err(|e| e.to_string())?;
            if out.success() && out.stdout.trim() == "v" {
                Ok(())
            } else {
                Err(format!("{name}: {out:?}"))
            }
        })
        .await
        .unwrap_or_else(|e| panic!("{e}"));
        let refused = ctl
            .clone()
            .with_user("alice:first")
            .run(&["get", "k"])
            .await
            .expect("etcdctl runs");
        assert!(
            !refused.success()
                && refused
                    .stderr
                    .contains("authentication failed, invalid user ID or password"),
            "{name} (etcd-rs: {}): the old password: {refused:?}",
            node.rs
        );
        ctl.clone()
            .with_user("root:rootpw")
            .ok(&["put", "k", "v"])
            .await;
    }

    // And the other way: a user added and given a new password through an etcd member
    // (etcd 3.5 proposes the password hashed, base64-encoded) logs in through etcd-rs.
    let etcd_node = nodes.iter().find(|n| !n.rs).expect("an etcd member");
    let root = etcd_node.member.etcdctl().with_user("root:rootpw");
    root.ok(&["user", "add", "bob:one"]).await;
    root.ok(&["user", "grant-role", "bob", "reader"]).await;
    root.ok_stdin(&["user", "passwd", "bob", "--interactive=false"], "two\n")
        .await;
    for node in &nodes {
        let name = node.member.name().to_owned();
        let ctl = node.member.etcdctl();
        poll_until(WAIT, || async {
            let out = ctl
                .clone()
                .with_user("bob:two")
                .run(&["get", "k", "--print-value-only"])
                .await
                .map_err(|e| e.to_string())?;
            if out.success() && out.stdout.trim() == "v" {
                Ok(())
            } else {
                Err(format!("{name}: {out:?}"))
            }
        })
        .await
        .unwrap_or_else(|e| panic!("{e}"));
        let refused = ctl.clone().with_user("bob:one").fail(&["get", "k"]).await;
        assert!(
            refused.contains("authentication failed, invalid user ID or password"),
            "{name}: {refused}"
        );
    }

    // Writes under auth through every member apply on every member: each proposer's auth
    // revision is the one its peers are at.
    for (i, node) in nodes.iter().enumerate() {
        let root = node.member.etcdctl().with_user("root:rootpw");
        root.ok(&["put", &format!("through/{i}"), node.member.name()])
            .await;
    }
    for node in &nodes {
        let root = node.member.etcdctl().with_user("root:rootpw");
        let got = root
            .ok(&["get", "through/", "--prefix", "--print-value-only"])
            .await;
        let names: Vec<&str> = nodes.iter().map(|n| n.member.name()).collect();
        assert_eq!(
            got.lines().collect::<Vec<_>>(),
            names,
            "{}",
            node.member.name()
        );
    }
}

/// A member of an etcd 3.4 cluster converted in place (stopped, then started as etcd-rs on its
/// own data directory) rejoins its etcd peers as the same member, catches up on what they
/// wrote while it was down, and can lead them, while a writer goes on.
#[tokio::test]
async fn an_etcd_member_converted_in_place_rejoins_its_etcd_34_peers() {
    if !ours() {
        return;
    }
    converted_in_place(&etcd34(), 40).await;
}

/// The same in an etcd 3.5.1 cluster, whose members' database holds no published
/// attributes: the converted member still lists its peers with their names and client URLs.
#[tokio::test]
async fn an_etcd_member_converted_in_place_rejoins_its_etcd_35_peers() {
    if !ours() {
        return;
    }
    converted_in_place(&crate::etcd35(), 60).await;
}

async fn converted_in_place(etcd: &EtcdBin, salt: u8) {
    let mut nodes = start_cluster(etcd, ["e0", "e1", "e2"], salt, false).await;
    let writes = Arc::new(Mutex::new(Writes {
        endpoints: nodes.iter().map(|n| n.member.endpoint()).collect(),
        ..Writes::default()
    }));
    let stop = Arc::new(AtomicBool::new(false));
    let task = writer(writes.clone(), stop.clone());
    let acked = |at_least: usize| {
        let writes = writes.clone();
        poll_until(WAIT, move || {
            let n = writes.lock().expect("lock").acked.len();
            async move {
                if n >= at_least {
                    Ok(())
                } else {
                    Err(format!("{n} acknowledged"))
                }
            }
        })
    };
    acked(30).await.expect("writes before the conversion");

    let id = nodes[0].id;
    nodes[0].member.stop().await.expect("the etcd member stops");
    let before = writes.lock().expect("lock").acked.len();
    acked(before + 30)
        .await
        .expect("writes while the member is down");
    nodes[0].member.set_bin(&etcdrs());
    nodes[0]
        .member
        .restart()
        .await
        .unwrap_or_else(|e| panic!("etcd-rs on etcd's data dir: {e:#}"));
    nodes[0].rs = true;
    assert!(
        nodes[0]
            .member
            .log_contains("converted etcd data directory"),
        "{}",
        nodes[0].member.log_tail(30)
    );
    let mut c = nodes[1].member.client().await.expect("client");
    let list = c.member_list().await.expect("members");
    let ids: Vec<u64> = list.members().iter().map(|m| m.id()).collect();
    assert_eq!(ids.len(), 3, "no member added or lost: {ids:?}");
    assert!(ids.contains(&id), "the converted member keeps its id");
    same_hashkv(&nodes).await;
    check_member_list(&nodes).await;

    // The converted member leads its etcd peers while the writer goes on.
    let from = leader(&nodes).await;
    if from != id {
        let at = nodes.iter().find(|n| n.id == from).expect("leader node");
        let mut c = at.member.client().await.expect("client");
        c.move_leader(id).await.expect("move leader");
    }
    assert_eq!(leader(&nodes).await, id);
    let before = writes.lock().expect("lock").acked.len();
    acked(before + 30)
        .await
        .expect("writes under the converted leader");
    stop.store(true, Ordering::SeqCst);
    task.await.expect("writer");
    let writes = std::mem::take(&mut *writes.lock().expect("lock"));
    check_writes(&nodes, writes, 1).await;
}

/// Moves leadership to the node with raft id `to`.
async fn move_leadership(nodes: &[Node], to: u64) {
    let from = leader(nodes).await;
    if from != to {
        let at = nodes.iter().find(|n| n.id == from).expect("leader node");
        let mut c = at.member.client().await.expect("client");
        c.move_leader(to).await.expect("move leader");
    }
    assert_eq!(leader(nodes).await, to, "leadership moved");
}

/// Leases across implementations in an etcd 3.5.1 cluster, under a leader of each kind: a
/// lease granted through one kind of member is kept alive, read (`TimeToLive` with its keys,
/// which a follower forwards to the leader over the peer port's `/leases/internal`; keep-alives
/// over `/leases`) and revoked through the other, and its key goes with it.
#[tokio::test]
async fn leases_work_through_either_kind_of_member_in_an_etcd_35_cluster() {
    if !ours() {
        return;
    }
    let salt = 80;
    let etcd = crate::etcd35();
    let mut nodes = start_cluster(&etcd, ["e0", "e1", "e2"], salt, false).await;
    let writes = Arc::new(Mutex::new(Writes::default()));
    replace(&etcd, &mut nodes, 0, "r0", host(salt + 3), &writes, false).await;
    let rs = nodes.iter().position(|n| n.rs).expect("the etcd-rs member");
    let theirs = nodes.iter().position(|n| !n.rs).expect("an etcd member");
    let mut n = 0;
    for leader_kind in [theirs, rs] {
        move_leadership(&nodes, nodes[leader_kind].id).await;
        for (granter, other) in [(rs, theirs), (theirs, rs)] {
            let (granter, other) = (&nodes[granter].member, &nodes[other].member);
            let mut g = granter.client().await.expect("client");
            let mut o = other.client().await.expect("client");
            let lease = g.lease_grant(30, None).await.expect("grant").id();
            let key = format!("leased/{n}");
            n += 1;
            g.put(key.as_str(), "v", Some(PutOptions::new().with_lease(lease)))
                .await
                .expect("put with the lease");
            let (mut keeper, mut stream) = o.lease_keep_alive(lease).await.expect("keep alive");
            keeper.keep_alive().await.expect("keep alive");
            let kept = stream
                .message()
                .await
                .expect("keep-alive answer")
                .expect("a message");
            assert_eq!((kept.id(), kept.ttl()), (lease, 30));
            let ttl = o
                .lease_time_to_live(lease, Some(LeaseTimeToLiveOptions::new().with_keys()))
                .await
                .expect("time to live");
            assert_eq!(ttl.granted_ttl(), 30);
            assert!((1..=30).contains(&ttl.ttl()), "{}", ttl.ttl());
            assert_eq!(ttl.keys(), [key.as_bytes().to_vec()]);
            o.lease_revoke(lease).await.expect("revoke");
            let left = g
                .get(key.as_str(), Some(GetOptions::new().with_count_only()))
                .await
                .expect("read")
                .count();
            assert_eq!(left, 0, "the revoked lease's key is gone");
        }
    }
}

/// A downgrade that an etcd 3.5.1 member enables, under an etcd-rs leader: etcd 3.5 never
/// lowers the cluster version to the target, and its members exit as soon as it is lowered
/// while they know of the downgrade ("server version is not allowed to join when downgrade is
/// enabled"); etcd-rs, which lowers it at once for a downgrade it records itself, keeps it
/// here, so the etcd 3.5.1 members stay up; cancelled through etcd-rs, in the form etcd 3.5
/// applies, they restart (etcd 3.5.1 refuses to start while it knows of a downgrade to a
/// version other than its own). etcd 3.5.1 never answers a downgrade request itself (its
/// applier returns no result for `downgrade_info_set`, so the waiting request times out, as
/// in a cluster of etcd 3.5.1 alone); the test follows the entry, not the answer.
#[tokio::test]
async fn a_downgrade_enabled_by_etcd_35_keeps_the_cluster_version_under_an_etcd_rs_leader() {
    if !ours() {
        return;
    }
    let salt = 90;
    let etcd = crate::etcd35();
    let mut nodes = start_cluster(&etcd, ["e0", "e1", "e2"], salt, false).await;
    let writes = Arc::new(Mutex::new(Writes::default()));
    replace(&etcd, &mut nodes, 0, "r0", host(salt + 3), &writes, false).await;
    let rs = nodes.iter().position(|n| n.rs).expect("the etcd-rs member");
    let theirs = nodes.iter().position(|n| !n.rs).expect("an etcd member");
    move_leadership(&nodes, nodes[rs].id).await;
    wait_cluster_version(&nodes, "3.5.0").await;
    let addr = nodes[theirs].member.client_addr();
    let enable = http_request(
        &addr,
        "POST",
        "/v3/maintenance/downgrade",
        &[("Content-Type", "application/json")],
        br#"{"action":"ENABLE","version":"3.4"}"#,
    );
    // Whatever etcd 3.5.1 answers, if anything.
    let _ = tokio::time::timeout(Duration::from_secs(1), enable).await;
    // The leader's version monitor has decided with the downgrade applied.
    let leader = &nodes[rs].member;
    poll_until(WAIT, || async {
        if leader.log_contains("keeping the cluster version: etcd 3.5 members know") {
            Ok(())
        } else {
            Err("no decision yet")
        }
    })
    .await
    .unwrap_or_else(|e| panic!("{e}\n{}", leader.log_tail(20)));
    wait_cluster_version(&nodes, "3.5.0").await;
    same_hashkv(&nodes).await;
    let (status, body) = downgrade(&nodes[rs], "CANCEL", "").await;
    assert_eq!(status, 200, "{body}");
    for node in nodes.iter().filter(|n| !n.rs) {
        let peer = node
            .member
            .peer_url()
            .trim_start_matches("http://")
            .to_owned();
        poll_until(WAIT, || async {
            let enabled = http_request(&peer, "GET", "/downgrade/enabled", &[], b"")
                .await
                .map_err(|e| e.to_string())?;
            if enabled.body == "false" {
                Ok(())
            } else {
                Err(format!("{peer}: downgrade enabled: {}", enabled.body))
            }
        })
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    }
    for node in nodes.iter_mut().filter(|n| !n.rs) {
        node.member
            .restart()
            .await
            .unwrap_or_else(|e| panic!("etcd 3.5.1 restarts after the cancel: {e:#}"));
    }
    same_hashkv(&nodes).await;
}

/// `--experimental-initial-corrupt-check` between the two kinds: each asks the other's
/// `/members/hashkv` on the peer port before serving. With the data in agreement an etcd-rs
/// member and the etcd 3.5.1 members restart with the check and pass it; once one stored
/// value of the etcd-rs member is altered on disk (it restarts without the check), an etcd
/// 3.5.1 member that restarts with the check finds the difference and refuses to start in its
/// own words, and so does the etcd-rs member itself.
#[tokio::test]
async fn the_initial_corruption_check_compares_hashes_across_etcd_35_and_etcd_rs() {
    if !ours() {
        return;
    }
    let salt = 100;
    let etcd = crate::etcd35();
    // etcd 3.5.1 knows its peers at start from its last `.snap` file only (its v2 store): the
    // etcd members snapshot every 1,000 entries, and enough is written after the etcd-rs member
    // joined for their snapshot to list it.
    let mut nodes = start_cluster(&etcd, ["e0", "e1", "e2"], salt, true).await;
    let writes = Arc::new(Mutex::new(Writes::default()));
    replace(&etcd, &mut nodes, 0, "r0", host(salt + 3), &writes, true).await;
    let mut client = nodes[1].member.client().await.expect("client");
    for i in 0..1200 {
        client
            .put(format!("mixed/{i:04}"), "v", None)
            .await
            .expect("put");
    }
    same_hashkv(&nodes).await;
    let rs = nodes.iter().position(|n| n.rs).expect("the etcd-rs member");
    let theirs: Vec<usize> = (0..nodes.len()).filter(|i| *i != rs).collect();

    // In agreement: one member of each kind restarts with the check and passes it.
    for i in [rs, theirs[0]] {
        let m = &mut nodes[i].member;
        m.add_setting("experimental-initial-corrupt-check", "true");
        m.restart()
            .await
            .unwrap_or_else(|e| panic!("{} restarts with the check: {e:#}", m.name()));
        assert!(
            m.log_contains("initial corruption checking passed; no corruption"),
            "{}",
            m.log_tail(30)
        );
    }

    // The etcd-rs member's data altered on disk; it runs again without the check.
    let m = &mut nodes[rs].member;
    m.stop().await.expect("stop");
    crate::corrupt::alter_a_value(m.data_dir());
    m.remove_setting("experimental-initial-corrupt-check");
    m.restart()
        .await
        .expect("the altered member restarts without the check");

    // An etcd 3.5.1 member restarting with the check sees the etcd-rs member's hash differ.
    let m = &mut nodes[theirs[1]].member;
    m.add_setting("experimental-initial-corrupt-check", "true");
    assert!(
        m.restart().await.is_err(),
        "etcd 3.5.1 started beside an altered peer:\n{}",
        m.current_log()
            .lines()
            .filter(|l| l.contains("corrupt") || l.contains("hash"))
            .collect::<Vec<_>>()
            .join("\n")
    );
    let status = m.wait_exit(WAIT).await.expect("etcd 3.5.1 exits");
    assert!(!status.success());
    assert!(
        m.log_contains("found data inconsistency with peers")
            && m.log_contains("found different hash values from remote peer"),
        "{}",
        m.log_tail(20)
    );
    // It is started again without the check, so that the etcd-rs member has peers to ask.
    m.remove_setting("experimental-initial-corrupt-check");
    m.restart()
        .await
        .expect("etcd 3.5.1 restarts without the check");

    // The etcd-rs member with the check refuses too, its peers being etcd 3.5.1 members.
    let m = &mut nodes[rs].member;
    m.add_setting("experimental-initial-corrupt-check", "true");
    assert!(m.restart().await.is_err(), "the altered member started");
    let status = m.wait_exit(WAIT).await.expect("it exits");
    assert!(!status.success());
    assert!(
        m.log_contains("found data inconsistency with peers")
            && m.log_contains("found different hash values from remote peer"),
        "{}",
        m.log_tail(20)
    );
}
