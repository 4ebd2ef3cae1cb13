//! A slow disk under a three-member cluster of raft threads in one process (issue 41): each
//! member's log store sleeps before it returns from a save when told to (the fsync of a
//! stalled disk), and the members talk through channels.
//!
//! Before the `wal-sync` thread, the raft thread saved inline: a leader whose saves took
//! longer than the election timeout sent no heartbeat meanwhile and was deposed. Now a slow
//! leader keeps its term while its followers go on committing, and a slow follower does not
//! hold up the leader's commits. A lone member has neither to lose: it saves on its raft
//! thread until a second node joins. Also here, with the same threads: read indexes asked on
//! every member at once, and a snapshot mark taken after the writes stop.

use super::*;
use std::collections::HashMap;

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

const TICK: Duration = Duration::from_millis(50);
const ELECTION_TICKS: usize = 10;
/// 1.5x the election timeout.
const STALL: Duration = Duration::from_millis(750);
const WAIT: Duration = Duration::from_secs(20);

/// A log store in memory whose saves take `delay_ms` when it is set.
struct SlowLog {
    delay_ms: Arc<AtomicU64>,
}

impl LogStore for SlowLog {
    fn save(&mut self, _hard_state: Option<&HardState>, _entries: &[Entry]) -> Result<()> {
        let delay = self.delay_ms.load(Ordering::Relaxed);
        if delay > 0 {
            std::thread::sleep(Duration::from_millis(delay));
        }
        Ok(())
    }
    fn mark_snapshot(&mut self, _index: u64, _term: u64) -> Result<()> {
        Ok(())
    }
    fn release_to(&mut self, _index: u64) -> Result<()> {
        Ok(())
    }
}

/// Counts the non-empty normal entries it applies. It makes nothing durable while it
/// applies; with `flushed`, what it applied becomes durable later, when told, as the server's
/// backend flushes in the background.
struct Counter {
    applied: Arc<AtomicU64>,
    last: (u64, u64),
    flushed: Option<Arc<std::sync::atomic::AtomicBool>>,
}

impl Counter {
    fn new(applied: Arc<AtomicU64>) -> Counter {
        Counter {
            applied,
            last: (0, 0),
            flushed: None,
        }
    }
}

impl StateMachine for Counter {
    fn apply(&mut self, batch: Apply) -> std::result::Result<Applied, String> {
        for entry in &batch.entries {
            if entry.get_entry_type() == EntryType::EntryNormal && !entry.data.is_empty() {
                self.applied.fetch_add(1, Ordering::Relaxed);
            }
            self.last = (entry.index, entry.term);
        }
        Ok(Applied {
            index: self.last.0,
            term: self.last.1,
            durable: None,
            compact_log: false,
        })
    }
    fn durable(&mut self) -> Option<(u64, u64)> {
        let flushed = self.flushed.as_ref()?;
        flushed.swap(false, Ordering::Relaxed).then_some(self.last)
    }
    fn conf_change_allowed(&mut self, _index: u64, _change: &EtcdConfChange) -> bool {
        true
    }
    fn restore(
        &mut self,
        _: u64,
        _: u64,
        _: &ConfState,
        _: &[u8],
    ) -> std::result::Result<(), String> {
        Err("no snapshots here".into())
    }
}

/// Delivers messages to the members' peer channels.
#[derive(Default)]
struct Net {
    peers: RwLock<HashMap<u64, mpsc::Sender<NodeMsg>>>,
}

impl Transport for Arc<Net> {
    fn send(&self, messages: Vec<Message>) {
        let peers = self.peers.read();
        for message in messages {
            if let Some(peer) = peers.get(&message.to) {
                let _ = peer.try_send(NodeMsg::Step(Box::new(message)));
            }
        }
    }
}

struct Member {
    handle: RaftNodeHandle,
    applied: Arc<AtomicU64>,
    delay_ms: Arc<AtomicU64>,
}

struct Cluster {
    members: Vec<Member>,
    _tasks: tokio::task::JoinSet<task::TaskResult>,
    shutdown: CancellationToken,
}

impl Drop for Cluster {
    fn drop(&mut self) {
        self.shutdown.cancel();
    }
}

fn cluster() -> Cluster {
    let net = Arc::new(Net::default());
    let mut tasks = tokio::task::JoinSet::new();
    let shutdown = CancellationToken::new();
    let peers: Vec<(u64, Vec<u8>)> = (1..=3).map(|id| (id, Vec::new())).collect();
    let mut members = Vec::new();
    for id in 1..=3u64 {
        let config = NodeConfig {
            id,
            wal_dir: PathBuf::from("unused"),
            tick_interval: TICK,
            election_tick: ELECTION_TICKS,
            heartbeat_tick: 1,
            pre_vote: true,
            snapshot_count: 1_000_000,
            catch_up_entries: 100,
            unsafe_no_fsync: false,
        };
        let delay_ms = Arc::new(AtomicU64::new(0));
        let applied = Arc::new(AtomicU64::new(0));
        let start = Start::New {
            metadata: Vec::new(),
            peers: peers.clone(),
        };
        let core = NodeCore::new(
            config,
            start,
            Box::new(SlowLog {
                delay_ms: delay_ms.clone(),
            }),
            Recovered::default(),
            Arc::new(net.clone()),
            Box::new(Counter::new(applied.clone())),
        )
        .expect("node");
        let handle = spawn(core, &mut tasks, shutdown.clone()).expect("spawn");
        net.peers.write().insert(id, handle.peer_tx.clone());
        members.push(Member {
            handle,
            applied,
            delay_ms,
        });
    }
    Cluster {
        members,
        _tasks: tasks,
        shutdown,
    }
}

impl Cluster {
    /// Index of the leader, once one leads and the others follow it.
    async fn leader(&self) -> usize {
        let deadline = Instant::now() + WAIT;
        loop {
            let statuses: Vec<NodeStatus> =
                self.members.iter().map(|m| m.handle.status()).collect();
            if let Some(i) = statuses.iter().position(|s| s.is_leader) {
                let id = statuses[i].id;
                if statuses.iter().all(|s| s.leader == id) {
                    return i;
                }
            }
            assert!(Instant::now() < deadline, "no leader: {statuses:?}");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    /// (leader, term) as each member sees it.
    fn views(&self) -> Vec<(u64, u64)> {
        self.members
            .iter()
            .map(|m| {
                let status = m.handle.status();
                (status.leader, status.term)
            })
            .collect()
    }
}

/// Polls `done` until it holds, failing with `what` after [`WAIT`].
async fn wait_for(what: &str, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + WAIT;
    while !done() {
        assert!(Instant::now() < deadline, "{what}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Waits until `member` has applied `n` entries; returns how long that took.
async fn applied(member: &Member, n: u64, what: &str) -> Duration {
    let started = Instant::now();
    loop {
        if member.applied.load(Ordering::Relaxed) >= n {
            return started.elapsed();
        }
        assert!(
            started.elapsed() < WAIT,
            "{what}: {} of {n} applied",
            member.applied.load(Ordering::Relaxed)
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

#[tokio::test]
async fn a_leader_whose_saves_outlast_the_election_timeout_keeps_its_term_and_the_followers_commit()
{
    let c = cluster();
    let leader = c.leader().await;
    let views = c.views();
    c.members[leader]
        .delay_ms
        .store(STALL.as_millis() as u64, Ordering::Relaxed);
    let started = Instant::now();
    let mut proposed = 0;
    // Four election timeouts' worth of stalled saves, proposals all along.
    while started.elapsed() < STALL * 3 {
        c.members[leader]
            .handle
            .propose(vec![1], |_| {})
            .await
            .expect("propose");
        proposed += 1;
        tokio::time::sleep(Duration::from_millis(10)).await;
        assert_eq!(
            c.views(),
            views,
            "the leader or a term changed under the stall"
        );
    }
    // The followers commit and apply without the leader's disk, well within one stall.
    for (i, member) in c.members.iter().enumerate().filter(|(i, _)| *i != leader) {
        let took = applied(member, proposed, "a follower").await;
        assert!(
            took < STALL,
            "follower {i} waited {took:?} for the slow leader"
        );
    }
    // The leader applies once its own saves are done.
    applied(&c.members[leader], proposed, "the slow leader").await;
    assert!(c.members[leader].handle.status().is_leader);
    assert_eq!(
        c.views(),
        views,
        "the leader or a term changed under the stall"
    );
}

#[tokio::test]
async fn a_follower_whose_saves_stall_does_not_hold_up_the_leaders_commits() {
    let c = cluster();
    let leader = c.leader().await;
    let views = c.views();
    let slow = (leader + 1) % 3;
    c.members[slow]
        .delay_ms
        .store(STALL.as_millis() as u64, Ordering::Relaxed);
    for n in 1..=50u64 {
        c.members[leader]
            .handle
            .propose(vec![1], |_| {})
            .await
            .expect("propose");
        // Each commits with the other follower, without a stalled save in its way.
        let took = applied(&c.members[leader], n, "the leader").await;
        assert!(took < STALL / 2, "entry {n} waited {took:?}");
    }
    assert_eq!(c.views(), views, "the leader or a term changed");
    c.members[slow].delay_ms.store(0, Ordering::Relaxed);
    applied(
        &c.members[slow],
        50,
        "the slow follower, its disk fast again",
    )
    .await;
}

/// Every member asks for a read index at the same moment, twenty times over: each member
/// numbers its requests from 1, so without its id in the context the leader would hold two
/// requests with one context and drop the second (raft-rs keeps pending reads by context).
#[tokio::test]
async fn read_indexes_asked_on_every_member_at_once_are_all_answered() {
    let c = cluster();
    let leader = c.leader().await;
    // A leader serves read indexes once it has committed in its term.
    c.members[leader]
        .handle
        .propose(vec![1], |_| {})
        .await
        .expect("propose");
    for member in &c.members {
        applied(member, 1, "the first entry").await;
    }
    let ask = |i: usize| tokio::time::timeout(STALL, c.members[i].handle.read_index());
    for round in 0..20 {
        let (a, b, d) = tokio::join!(ask(0), ask(1), ask(2));
        for (i, answer) in [a, b, d].into_iter().enumerate() {
            let index = answer
                .unwrap_or_else(|_| panic!("round {round}: member {i}'s read index never came"))
                .expect("read index");
            assert!(index >= 1, "round {round}: member {i} read at {index}");
        }
    }
}

/// Records the name of the thread each save ran on, and the snapshot marks.
#[derive(Default)]
struct Recording {
    threads: Arc<parking_lot::Mutex<Vec<String>>>,
    marks: Arc<parking_lot::Mutex<Vec<u64>>>,
}

impl LogStore for Recording {
    fn save(&mut self, _hard_state: Option<&HardState>, entries: &[Entry]) -> Result<()> {
        if !entries.is_empty() {
            let name = std::thread::current().name().unwrap_or("").to_string();
            self.threads.lock().push(name);
        }
        Ok(())
    }
    fn mark_snapshot(&mut self, index: u64, _term: u64) -> Result<()> {
        self.marks.lock().push(index);
        Ok(())
    }
    fn release_to(&mut self, _index: u64) -> Result<()> {
        Ok(())
    }
}

/// A cluster of one over `log` and `machine`, once it leads.
async fn lone_member(
    log: Recording,
    machine: Box<dyn StateMachine>,
    applied: Arc<AtomicU64>,
    snapshot_count: u64,
) -> (
    Member,
    tokio::task::JoinSet<task::TaskResult>,
    CancellationToken,
) {
    let net = Arc::new(Net::default());
    let mut tasks = tokio::task::JoinSet::new();
    let shutdown = CancellationToken::new();
    let config = NodeConfig {
        id: 1,
        wal_dir: PathBuf::from("unused"),
        tick_interval: TICK,
        election_tick: ELECTION_TICKS,
        heartbeat_tick: 1,
        pre_vote: true,
        snapshot_count,
        catch_up_entries: 100,
        unsafe_no_fsync: false,
    };
    let start = Start::New {
        metadata: Vec::new(),
        peers: vec![(1, Vec::new())],
    };
    let core = NodeCore::new(
        config,
        start,
        Box::new(log),
        Recovered::default(),
        Arc::new(net),
        machine,
    )
    .expect("node");
    let handle = spawn(core, &mut tasks, shutdown.clone()).expect("spawn");
    wait_for("the lone member never led", || handle.status().is_leader).await;
    let member = Member {
        handle,
        applied,
        delay_ms: Arc::default(),
    };
    (member, tasks, shutdown)
}

#[tokio::test]
async fn a_lone_member_saves_on_its_raft_thread_until_a_learner_joins() {
    let log = Recording::default();
    let threads = log.threads.clone();
    let count = Arc::new(AtomicU64::new(0));
    let machine = Box::new(Counter::new(count.clone()));
    let (member, _tasks, shutdown) = lone_member(log, machine, count, 1_000_000).await;
    let last_save = || threads.lock().last().cloned().unwrap_or_default();

    member
        .handle
        .propose(vec![1], |_| {})
        .await
        .expect("propose");
    applied(&member, 1, "alone").await;
    assert_eq!(last_save(), "raft", "alone, the raft thread saves");

    member
        .handle
        .propose_conf_change(EtcdConfChange {
            id: 0,
            kind: ChangeKind::AddLearnerNode,
            node_id: 2,
            context: None,
        })
        .await
        .expect("the learner is proposed");
    // Applied in order: once this entry is, so is the learner's addition.
    member
        .handle
        .propose(vec![1], |_| {})
        .await
        .expect("propose");
    applied(&member, 2, "with the learner added").await;
    member
        .handle
        .propose(vec![1], |_| {})
        .await
        .expect("propose");
    applied(&member, 3, "with a learner").await;
    assert_eq!(last_save(), "wal-sync", "with company, the thread saves");
    shutdown.cancel();
}

/// Writes that stop right after a snapshot mark falls due, before the state machine holds
/// them durably: the mark is taken once it does, with no write after them.
#[tokio::test]
async fn a_mark_due_when_writes_stop_is_taken_once_the_state_machine_holds_them() {
    let log = Recording::default();
    let marks = log.marks.clone();
    let count = Arc::new(AtomicU64::new(0));
    let flushed = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let machine = Box::new(Counter {
        flushed: Some(flushed.clone()),
        ..Counter::new(count.clone())
    });
    let (member, _tasks, shutdown) = lone_member(log, machine, count, 5).await;
    for _ in 0..6 {
        member
            .handle
            .propose(vec![1], |_| {})
            .await
            .expect("propose");
    }
    applied(&member, 6, "the writes").await;
    assert!(marks.lock().is_empty(), "nothing durable yet, no mark");
    flushed.store(true, Ordering::Relaxed);
    wait_for("no mark after the writes became durable", || {
        !marks.lock().is_empty()
    })
    .await;
    let mark = marks.lock().last().copied().unwrap_or(0);
    assert!(mark >= 6, "the mark covers the writes: {mark}");
    shutdown.cancel();
}
