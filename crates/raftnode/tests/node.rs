//! The raft node through its public API, with a state machine that records what it is given:
//! a member of one over a real WAL in a temporary directory, driven through `start`,
//! `propose`, `read_index` and a restart. What the node promises its state machine: entries
//! in log order, each once, with raft's view of the moment, and after a restart only what
//! the state machine had not applied.

use std::sync::Arc;
use std::time::Duration;

use etcdrs_raftnode::confchange::EtcdConfChange;
use etcdrs_raftnode::eraftpb::{ConfState, EntryType};
use etcdrs_raftnode::task::TaskResult;
use etcdrs_raftnode::{
    Applied, Apply, NoPeers, NodeConfig, RaftNodeHandle, RaftView, Start, StateMachine,
};
use parking_lot::Mutex;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

/// What the recording state machine saw: (index, term, data) of every normal entry with
/// data, and the view each batch came with.
#[derive(Default)]
struct Seen {
    entries: Vec<(u64, u64, Vec<u8>)>,
    views: Vec<RaftView>,
    conf_changes: Vec<u64>,
}

/// Records what it is given in `seen`, and bumps `batches` after each batch.
struct Recorder {
    seen: Arc<Mutex<Seen>>,
    batches: tokio::sync::watch::Sender<u64>,
}

impl StateMachine for Recorder {
    fn apply(&mut self, batch: Apply) -> Result<Applied, String> {
        let applied = self.record(batch);
        self.batches.send_modify(|n| *n += 1);
        Ok(applied)
    }

    fn conf_change_allowed(&mut self, _index: u64, _change: &EtcdConfChange) -> bool {
        true
    }

    fn restore(
        &mut self,
        _index: u64,
        _term: u64,
        _conf: &ConfState,
        _data: &[u8],
    ) -> Result<(), String> {
        Err("a member of one gets no snapshot".into())
    }
}

impl Recorder {
    fn record(&mut self, batch: Apply) -> Applied {
        let mut seen = self.seen.lock();
        seen.views.push(batch.raft);
        let (mut index, mut term) = (0, 0);
        for entry in &batch.entries {
            if let Some((last, _, _)) = seen.entries.last() {
                assert!(entry.index > *last, "entries in log order, each once");
            }
            (index, term) = (entry.index, entry.term);
            match entry.get_entry_type() {
                EntryType::EntryNormal if !entry.data.is_empty() => {
                    seen.entries
                        .push((entry.index, entry.term, entry.data.to_vec()));
                }
                EntryType::EntryConfChange => seen.conf_changes.push(entry.index),
                _ => {}
            }
        }
        Applied {
            index,
            term,
            durable: Some((index, term)),
            compact_log: false,
        }
    }
}

fn config(dir: &std::path::Path) -> NodeConfig {
    NodeConfig {
        id: 1,
        wal_dir: dir.join("wal"),
        tick_interval: Duration::from_millis(10),
        election_tick: 10,
        heartbeat_tick: 1,
        pre_vote: true,
        snapshot_count: 10_000,
        catch_up_entries: 100,
        unsafe_no_fsync: false,
    }
}

struct Running {
    raft: RaftNodeHandle,
    seen: Arc<Mutex<Seen>>,
    batches: tokio::sync::watch::Receiver<u64>,
    tasks: JoinSet<TaskResult>,
    shutdown: CancellationToken,
}

fn run(dir: &std::path::Path, start: Start) -> Running {
    let seen = Arc::new(Mutex::new(Seen::default()));
    let (batches, batches_rx) = tokio::sync::watch::channel(0);
    let mut tasks = JoinSet::new();
    let shutdown = CancellationToken::new();
    let raft = etcdrs_raftnode::start(
        config(dir),
        start,
        Arc::new(NoPeers),
        Box::new(Recorder {
            seen: seen.clone(),
            batches,
        }),
        &mut tasks,
        shutdown.clone(),
    )
    .expect("start the node");
    Running {
        raft,
        seen,
        batches: batches_rx,
        tasks,
        shutdown,
    }
}

impl Running {
    /// Waits, as batches are applied, until `done` holds of what the state machine saw.
    async fn until(&mut self, what: &str, done: impl Fn(&Seen) -> bool) {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        while !done(&self.seen.lock()) {
            match tokio::time::timeout_at(deadline, self.batches.changed()).await {
                Ok(Ok(())) => {}
                Ok(Err(_)) => panic!("the node stopped before {what}"),
                Err(_) => panic!("timed out waiting for {what}"),
            }
        }
    }

    /// Waits until a batch comes with the view that this member leads.
    async fn leader(&mut self) {
        self.until("a leader", |s| s.views.last().is_some_and(|v| v.is_leader))
            .await;
    }

    async fn stop(mut self) {
        self.shutdown.cancel();
        while let Some(done) = self.tasks.join_next().await {
            let (name, result) = done.expect("task");
            assert_eq!(result, Ok(()), "{name} stopped cleanly");
        }
    }
}

fn new_member() -> Start {
    Start::New {
        metadata: b"member 1".to_vec(),
        peers: vec![(1, br#"{"id":1}"#.to_vec())],
    }
}

#[tokio::test]
async fn a_member_of_one_applies_its_proposals_in_order_with_raft_s_view() {
    let dir = tempfile::tempdir().expect("temp dir");
    let mut node = run(dir.path(), new_member());
    node.leader().await;
    for n in 0..5u8 {
        node.raft
            .propose(vec![b'p', n], |e| panic!("refused: {e}"))
            .await
            .expect("propose");
    }
    node.until("five entries", |s| s.entries.len() == 5).await;
    let (entries, conf_changes, last) = {
        let seen = node.seen.lock();
        let last = *seen.views.last().expect("a view");
        (seen.entries.clone(), seen.conf_changes.clone(), last)
    };
    let data: Vec<Vec<u8>> = entries.iter().map(|e| e.2.clone()).collect();
    assert_eq!(data, (0..5u8).map(|n| vec![b'p', n]).collect::<Vec<_>>());
    // The bootstrap AddNode is entry 1; the leader's empty entry follows it.
    assert_eq!(conf_changes, [1]);
    let term = node.raft.status().term;
    assert!(entries.iter().all(|e| e.1 == term));
    // Each batch of the leader's own entries came with the view that it leads in that term.
    assert_eq!(
        last,
        RaftView {
            is_leader: true,
            term,
            leader: 1
        }
    );
    node.stop().await;
}

#[tokio::test]
async fn a_read_index_covers_every_write_applied_before_it() {
    let dir = tempfile::tempdir().expect("temp dir");
    let mut node = run(dir.path(), new_member());
    node.leader().await;
    node.raft
        .propose(b"w".to_vec(), |e| panic!("refused: {e}"))
        .await
        .expect("propose");
    node.until("the write", |s| s.entries.len() == 1).await;
    let written = node.seen.lock().entries[0].0;
    let read = node.raft.read_index().await.expect("read index");
    assert!(
        read >= written,
        "read index {read} before the write at {written}"
    );
    node.stop().await;
}

#[tokio::test]
async fn a_restart_replays_only_what_the_state_machine_had_not_applied() {
    let dir = tempfile::tempdir().expect("temp dir");
    let mut node = run(dir.path(), new_member());
    node.leader().await;
    for n in 0..4u8 {
        node.raft
            .propose(vec![n], |e| panic!("refused: {e}"))
            .await
            .expect("propose");
    }
    node.until("four entries", |s| s.entries.len() == 4).await;
    let first_run: Vec<(u64, u64, Vec<u8>)> = node.seen.lock().entries.clone();
    node.stop().await;

    // The state machine says it had applied up to the second write durably.
    let applied = first_run[1].0;
    let mut restarted = run(
        dir.path(),
        Start::Restart {
            applied,
            conf_state: ConfState {
                voters: vec![1],
                ..Default::default()
            },
            force_new_cluster: false,
        },
    );
    restarted
        .until("the replayed tail", |s| s.entries.len() >= 2)
        .await;
    let replayed = restarted.seen.lock().entries.clone();
    assert_eq!(replayed, first_run[2..]);
    restarted.leader().await;
    restarted
        .raft
        .propose(b"after".to_vec(), |e| panic!("refused: {e}"))
        .await
        .expect("propose");
    restarted
        .until("a new write", |s| s.entries.len() == 3)
        .await;
    assert_eq!(restarted.seen.lock().entries[2].2, b"after");
    restarted.stop().await;
}

/// A log kept in memory: what was saved, the snapshot marks and how far it was released.
#[derive(Default)]
struct MemLog {
    state: Arc<Mutex<MemLogState>>,
}

#[derive(Default)]
struct MemLogState {
    saved: u64,
    marks: Vec<u64>,
    released_to: u64,
}

impl etcdrs_raftnode::LogStore for MemLog {
    fn save(
        &mut self,
        _hard_state: Option<&etcdrs_raftnode::eraftpb::HardState>,
        entries: &[etcdrs_raftnode::eraftpb::Entry],
    ) -> etcdrs_raftnode::Result<()> {
        self.state.lock().saved += entries.len() as u64;
        Ok(())
    }

    fn mark_snapshot(&mut self, index: u64, _term: u64) -> etcdrs_raftnode::Result<()> {
        self.state.lock().marks.push(index);
        Ok(())
    }

    fn release_to(&mut self, index: u64) -> etcdrs_raftnode::Result<()> {
        self.state.lock().released_to = index;
        Ok(())
    }
}

#[test]
fn large_entries_bring_snapshot_marks_early_and_bound_the_log_held_in_memory() {
    // --snapshot-count 10,000 entries of 1 MiB would hold 10 GiB of log in memory; marks come
    // every 64 MiB of applied entries instead, and each keeps at most 32 MiB behind it.
    const ENTRY: usize = 1 << 20;
    let dir = tempfile::tempdir().expect("tempdir");
    let log = MemLog::default();
    let marks = log.state.clone();
    let seen = Arc::new(Mutex::new(Seen::default()));
    let (batches, _batches) = tokio::sync::watch::channel(0);
    let mut node = etcdrs_raftnode::Node::new(
        config(dir.path()),
        new_member(),
        Box::new(log),
        etcdrs_raftnode::Recovered::default(),
        Arc::new(NoPeers),
        Box::new(Recorder {
            seen: seen.clone(),
            batches,
        }),
    )
    .expect("node");
    for _ in 0..1000 {
        node.process().expect("process");
        if node.status().is_leader {
            break;
        }
        node.tick();
    }
    assert!(node.status().is_leader, "a member of one leads itself");
    let mut most_held = 0;
    for i in 0..300u32 {
        let mut data = vec![0u8; ENTRY];
        data[..4].copy_from_slice(&i.to_be_bytes());
        node.propose(data).expect("propose");
        node.process().expect("process");
        let log = &node.raw().raft.raft_log;
        use raft::Storage as _;
        let first = log.store.first_index().expect("first index");
        most_held = most_held.max(log.last_index() + 1 - first);
    }
    assert_eq!(seen.lock().entries.len(), 300, "every entry applied");
    let marks = marks.lock();
    assert!(
        marks.marks.len() >= 4,
        "300 MiB of entries: a mark every 64 MiB, got {:?}",
        marks.marks
    );
    assert_eq!(marks.released_to, *marks.marks.last().expect("a mark"));
    assert!(
        most_held <= 64 + 32 + 2,
        "at most 96 MiB of 1 MiB entries held in memory, held {most_held}"
    );
}
