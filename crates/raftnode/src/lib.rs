//! Drives one raft-rs [`RawNode`]: ticks, proposals, the `Ready` loop, persistence to the WAL
//! (etcd `server/etcdserver/raft.go`).
//!
//! It knows nothing of keys or the MVCC store: proposals are opaque bytes, and committed
//! entries go out, in order, on the apply channel. One task owns the `RawNode`; everything
//! else talks to it through a cloneable [`RaftNodeHandle`].
//!
//! # The Ready contract, as this loop keeps it
//!
//! Persistence is asynchronous (raft-rs's `advance_append_async` and `on_persist_ready`): the
//! WAL is written and fsynced on the `wal-sync` thread (`raftnode::wal_sync`), so ticks,
//! heartbeats, votes and appends never wait behind a slow disk (a member alone in its cluster,
//! which has none of those to lose, writes on the raft thread until a second node joins).
//!
//! 1. `Ready::messages` (a leader's) go to peers at once: a leader sends its appends before
//!    its own fsync and commits on a quorum of acknowledgements, which may be its followers'
//!    alone (the Raft thesis, 10.2.1).
//! 2. A snapshot to install waits for everything before it to be durable, then the state
//!    machine restores it and its mark is made durable before raft's log restarts after it.
//! 3. Committed entries go to the state machine; raft hands over only entries this member
//!    has persisted itself, so a member never applies (nor acknowledges to a client) what its
//!    own WAL does not hold. Configuration changes among them are applied to raft here, before
//!    the batch leaves, and the resulting `ConfState` travels with it.
//! 4. The `Ready`'s entries and hard state go into raft's in-memory log at once and into the
//!    batch gathering for the next fsync, with its `persisted_messages` (a non-leader's
//!    answers and votes); the `Ready` is advanced without waiting. One batch is written at a
//!    time: every `Ready` that comes during an fsync shares the next one (group commit).
//! 5. When a batch is durable, raft is told (`on_persist_ready`) and only then are the
//!    batch's messages sent: a follower acknowledges only what it holds durably, and no answer
//!    to a vote reaches raft before raft knows the log behind it is persisted.
//! 6. While the gathering batch is over its bound, no new local proposal is taken (peers'
//!    messages and ticks still are).
//!
//! Snapshots and peers arrive with the cluster work; a single voter runs the same path.

#![deny(missing_docs)]

pub mod conf_state;
pub mod confchange;
mod error;
mod logger;
pub mod metrics;
mod node;
mod node_loop;
mod reads;
mod storage;
mod wal_sync;

#[cfg(test)]
mod stall_tests;

use confchange::{ChangeKind, EtcdConfChange};
use node_loop::NodeCore;

use std::collections::VecDeque;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use etcdrs_wal::Wal;
use parking_lot::RwLock;
use protobuf::Message as _;
use raft::eraftpb::{
    ConfChangeType, ConfChangeV2, ConfState, Entry, EntryType, HardState, Message,
};
use raft::storage::MemStorage;
use raft::{RawNode, StateRole, Storage};
use tokio::sync::{mpsc, oneshot};
use tokio_util::sync::CancellationToken;

pub use error::{Error, Result};
pub use node::Node;
pub use raft::eraftpb;
use storage::persist;
pub use storage::{LogStore, NodeStorage, Recovered, read_log, write_imported_log};
use wal_sync::{Persistence, SyncBatch};

/// How the node runs.
#[derive(Clone, Debug)]
pub struct NodeConfig {
    /// This member's id.
    pub id: u64,
    /// Directory of the WAL (etcd's `member/wal`).
    pub wal_dir: PathBuf,
    /// One tick (etcd's `--heartbeat-interval`).
    pub tick_interval: Duration,
    /// Ticks without a leader before an election (etcd's election timeout / heartbeat).
    pub election_tick: usize,
    /// Ticks between heartbeats.
    pub heartbeat_tick: usize,
    /// Whether to pre-vote before campaigning (etcd's `--pre-vote`).
    pub pre_vote: bool,
    /// Applied entries between WAL snapshot marks (etcd's `--snapshot-count`).
    pub snapshot_count: u64,
    /// Entries kept in memory behind a snapshot mark for lagging followers
    /// (etcd's `SnapshotCatchUpEntries`).
    pub catch_up_entries: u64,
    /// etcd's `--unsafe-no-fsync`: the WAL is written without fdatasync.
    pub unsafe_no_fsync: bool,
}

impl NodeConfig {
    fn wal_options(&self) -> etcdrs_wal::Options {
        etcdrs_wal::Options {
            unsafe_no_fsync: self.unsafe_no_fsync,
            ..etcdrs_wal::Options::default()
        }
    }
}

/// How the node starts.
#[derive(Clone, Debug)]
pub enum Start {
    /// A brand-new member of a new cluster: the WAL is created and the initial membership is
    /// written as the first entries, as etcd's bootstrap does.
    New {
        /// WAL metadata (node id, cluster id), opaque here.
        metadata: Vec<u8>,
        /// Initial members: id and the context (member JSON) of its `AddNode` change.
        peers: Vec<(u64, Vec<u8>)>,
    },
    /// A new member joining an existing cluster: an empty log; the leader sends what it needs.
    Join {
        /// WAL metadata (node id, cluster id), opaque here.
        metadata: Vec<u8>,
    },
    /// A restart from an existing WAL.
    Restart {
        /// Index of the last entry the state machine has applied durably.
        applied: u64,
        /// Membership as of `applied`.
        conf_state: ConfState,
        /// etcd's `--force-new-cluster`: drop the uncommitted tail of the log and commit the
        /// removal of every other member, so this member comes up as a cluster of one with
        /// everything that was committed.
        force_new_cluster: bool,
    },
}

/// A batch of committed entries for the state machine, in log order.
#[derive(Debug)]
pub struct Apply {
    /// The entries.
    pub entries: Vec<Entry>,
    /// Membership after the batch's configuration changes, if it had any.
    pub conf_state: Option<ConfState>,
    /// Raft's view as the batch is handed over: the state machine needs no status read back
    /// from the node (which would be a turn old).
    pub raft: RaftView,
}

/// Raft's role, term and leader as the raft thread sees them at a moment.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RaftView {
    /// Whether this member leads.
    pub is_leader: bool,
    /// The current term (which may be ahead of the entries' own).
    pub term: u64,
    /// The leader this member knows of, 0 for none.
    pub leader: u64,
}

/// What the state machine reports after applying a batch.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Applied {
    /// Index of the last entry applied.
    pub index: u64,
    /// Its term.
    pub term: u64,
    /// The newest applied entry (index and term) that is durable in the state machine's own
    /// storage, when that moved with this batch: the WAL may drop everything up to it. It may
    /// be behind `index`: the state machine makes its writes durable in the background.
    pub durable: Option<(u64, u64)>,
    /// Whether the log up to here must go at the next durable point, keeping no catch-up
    /// entries: it holds entries that members joining later must not replay (a cluster
    /// version that etcd members of the lowered version refuse), so they get a snapshot.
    pub compact_log: bool,
}

/// The replicated state machine. The raft thread calls it inline, in log order, right after
/// the entries commit: no hand-off to another thread on the write path. An error is fatal.
pub trait StateMachine: Send + 'static {
    /// Apply committed entries.
    fn apply(&mut self, batch: Apply) -> std::result::Result<Applied, String>;

    /// Whether the committed membership change at `index` may take effect (etcd's
    /// `ValidateConfigurationChange`), asked after every entry before it was applied and
    /// before raft applies the change. A change refused here leaves raft's configuration as
    /// it was (etcd applies it with `NodeID = None`); the state machine, applying the entry
    /// next, refuses it alike and tells its proposer why.
    fn conf_change_allowed(&mut self, index: u64, change: &EtcdConfChange) -> bool;

    /// The newest applied entry the state machine has come to hold durably since it last said
    /// (in [`Applied::durable`] or here), if any. A state machine that makes its writes durable
    /// in the background learns of them after its last apply: the raft thread asks on each
    /// turn, so that a member whose writes stopped still takes the snapshot mark they made due
    /// (releasing raft's log held in memory and the WAL's old segments) rather than waiting
    /// for the next write.
    fn durable(&mut self) -> Option<(u64, u64)> {
        None
    }

    /// Replace the state with the leader's snapshot taken at or after entry `index`; the
    /// membership at that point is `conf_state`, and `data` is the snapshot's own payload
    /// (etcd's: the v2 store's JSON, where etcd 3.4 and 3.5 keep the membership they recover).
    fn restore(
        &mut self,
        index: u64,
        term: u64,
        conf_state: &ConfState,
        data: &[u8],
    ) -> std::result::Result<(), String>;
}

/// Sends raft messages to peers. The cluster issue supplies a network transport.
pub trait Transport: Send + Sync + 'static {
    /// Send messages; delivery is best effort (raft retries).
    fn send(&self, messages: Vec<Message>);
}

/// A transport for a cluster of one: there is nobody to talk to.
pub struct NoPeers;

impl Transport for NoPeers {
    fn send(&self, messages: Vec<Message>) {
        if !messages.is_empty() {
            tracing::debug!(n = messages.len(), "dropping raft messages: no peers");
        }
    }
}

/// The node's state as last seen by its loop.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct NodeStatus {
    /// This member's id.
    pub id: u64,
    /// The current leader (0 if none).
    pub leader: u64,
    /// The current term.
    pub term: u64,
    /// The commit index.
    pub commit: u64,
    /// Index of the last entry handed to the apply channel.
    pub applied: u64,
    /// Whether this member is the leader.
    pub is_leader: bool,
    /// Voters of the current configuration (shared: status is cloned on every request).
    pub voters: Arc<[u64]>,
    /// Learners of the current configuration.
    pub learners: Arc<[u64]>,
    /// On the leader: how far each member's log matches the leader's (raft progress).
    pub matched: Arc<[(u64, u64)]>,
    /// Whether the configuration is joint (a membership change is in progress).
    pub joint: bool,
}

/// The part of [`NodeStatus`] that a proposal checks ([`RaftNodeHandle::log_state`]). Not
/// raft's per-follower `Progress` (that is [`NodeStatus::matched`]).
#[derive(Clone, Copy, Debug)]
pub struct LogState {
    /// The current term.
    pub term: u64,
    /// The commit index.
    pub commit: u64,
    /// Index of the last entry handed to the apply channel.
    pub applied: u64,
}

enum NodeMsg {
    Propose {
        data: Vec<u8>,
        on_refused: RefusedHook,
    },
    ReadIndex {
        done: oneshot::Sender<Result<u64>>,
    },
    Step(Box<Message>),
    ProposeConfChange {
        change: EtcdConfChange,
        done: oneshot::Sender<Result<()>>,
    },
    TransferLeader {
        to: u64,
    },
    ReportSnapshot {
        to: u64,
        ok: bool,
    },
}

/// Called on the raft thread if raft refuses a proposal (no leader, a leader transfer in
/// progress); dropped unused once raft has taken it into its log.
pub type RefusedHook = Box<dyn FnOnce(Error) + Send>;

/// The cloneable handle to the raft node's task.
#[derive(Clone)]
pub struct RaftNodeHandle {
    /// Proposals, read indexes, membership changes and leader transfers.
    tx: mpsc::Sender<NodeMsg>,
    /// Messages from peers (and snapshot reports): a channel of their own that the loop
    /// serves first, so heartbeats and votes never queue behind client proposals.
    peer_tx: mpsc::Sender<NodeMsg>,
    status: Arc<RwLock<NodeStatus>>,
}

impl RaftNodeHandle {
    /// Propose opaque data. Ok means the proposal reached the raft node, not that it was
    /// accepted or committed: if raft refuses it, `on_refused` is called with the reason (on
    /// the raft thread; it must not block); otherwise the state machine reports the outcome
    /// when it applies the entry. Nothing waits for raft's answer, so a proposal costs one
    /// channel send and no wake-up on the way in.
    pub async fn propose(
        &self,
        data: Vec<u8>,
        on_refused: impl FnOnce(Error) + Send + 'static,
    ) -> Result<()> {
        self.tx
            .send(NodeMsg::Propose {
                data,
                on_refused: Box::new(on_refused),
            })
            .await
            .map_err(|_| Error::Stopped)
    }

    /// Ask for a read index (etcd's linearizable read): once the state machine has applied up
    /// to the returned index, a read reflects every write committed before this call.
    pub async fn read_index(&self) -> Result<u64> {
        let (done, rx) = oneshot::channel();
        self.tx
            .send(NodeMsg::ReadIndex { done })
            .await
            .map_err(|_| Error::Stopped)?;
        rx.await.map_err(|_| Error::Stopped)?
    }

    /// Propose a membership change, a single-step `EntryConfChange` written as etcd writes it
    /// ([`confchange`]). Ok means raft accepted it into its log.
    pub async fn propose_conf_change(&self, change: EtcdConfChange) -> Result<()> {
        let (done, rx) = oneshot::channel();
        self.tx
            .send(NodeMsg::ProposeConfChange { change, done })
            .await
            .map_err(|_| Error::Stopped)?;
        rx.await.map_err(|_| Error::Stopped)?
    }

    /// Ask the leader to hand leadership to `to` (etcd's MoveLeader).
    pub async fn transfer_leader(&self, to: u64) -> Result<()> {
        self.tx
            .send(NodeMsg::TransferLeader { to })
            .await
            .map_err(|_| Error::Stopped)
    }

    /// Report whether a snapshot was delivered to member `to`.
    pub async fn report_snapshot(&self, to: u64, ok: bool) -> Result<()> {
        self.peer_tx
            .send(NodeMsg::ReportSnapshot { to, ok })
            .await
            .map_err(|_| Error::Stopped)
    }

    /// Hand a message from a peer to raft.
    pub async fn step(&self, message: Message) -> Result<()> {
        self.peer_tx
            .send(NodeMsg::Step(Box::new(message)))
            .await
            .map_err(|_| Error::Stopped)
    }

    /// The node's state as last seen by its loop.
    pub fn status(&self) -> NodeStatus {
        self.status.read().clone()
    }

    /// The term, commit index and applied index as last seen by the loop: what every proposal
    /// checks, read without cloning the membership lists (three shared counters that each
    /// clone would bump from every worker thread).
    pub fn log_state(&self) -> LogState {
        let status = self.status.read();
        LogState {
            term: status.term,
            commit: status.commit,
            applied: status.applied,
        }
    }
}

/// Capacity of the proposal/step channel: a bound on requests queued for the raft task.
const NODE_CHANNEL: usize = 4096;
/// Membership changes that may wait for the one in flight (more are refused).
const MAX_DEFERRED_CONF_CHANGES: usize = 64;
/// Messages handled per loop turn before the node builds a `Ready`.
const MAX_BATCH: usize = 1024;

/// `--force-new-cluster`'s entries (etcd's `createConfigChangeEnts`): one committed
/// `RemoveNode` for every member but `me` that the membership holds once the committed
/// entries after `applied` are applied, appended after the committed log in its last term.
fn standalone_removals(
    me: u64,
    conf_state: &ConfState,
    entries: &[Entry],
    applied: u64,
    hard_state: &HardState,
) -> Result<Vec<Entry>> {
    let mut members: std::collections::BTreeSet<u64> = conf_state
        .voters
        .iter()
        .chain(&conf_state.learners)
        .chain(&conf_state.voters_outgoing)
        .copied()
        .collect();
    let mut track = |kind: ConfChangeType, id: u64| match kind {
        ConfChangeType::AddNode | ConfChangeType::AddLearnerNode => {
            members.insert(id);
        }
        ConfChangeType::RemoveNode => {
            members.remove(&id);
        }
    };
    for entry in entries.iter().filter(|e| e.index > applied) {
        match entry.get_entry_type() {
            EntryType::EntryConfChange => {
                // An update changes no membership.
                if let Some(change) = EtcdConfChange::decode(&entry.data)?.to_raft() {
                    track(change.get_change_type(), change.node_id);
                }
            }
            EntryType::EntryConfChangeV2 => {
                let mut change = ConfChangeV2::default();
                change
                    .merge_from_bytes(&entry.data)
                    .map_err(|e| Error::Corrupt(e.to_string()))?;
                for single in change.get_changes() {
                    track(single.get_change_type(), single.node_id);
                }
            }
            EntryType::EntryNormal => {}
        }
    }
    let mut index = hard_state.commit;
    let mut removals = Vec::new();
    for id in members.into_iter().filter(|id| *id != me) {
        // etcd's `createConfigChangeEnts`: no request id, no context.
        let change = EtcdConfChange {
            id: 0,
            kind: ChangeKind::RemoveNode,
            node_id: id,
            context: None,
        };
        index += 1;
        let mut entry = Entry::default();
        entry.set_entry_type(EntryType::EntryConfChange);
        entry.term = hard_state.term.max(1);
        entry.index = index;
        entry.data = change.encode().into();
        removals.push(entry);
    }
    Ok(removals)
}

/// Start the node: opens or creates the WAL, restores raft from it and spawns the loop, which
/// applies committed entries to `state_machine`, on a thread of its own, represented on
/// `tasks`.
pub fn start(
    config: NodeConfig,
    start: Start,
    transport: Arc<dyn Transport>,
    state_machine: Box<dyn StateMachine>,
    tasks: &mut tokio::task::JoinSet<task::TaskResult>,
    shutdown: CancellationToken,
) -> Result<RaftNodeHandle> {
    let (wal, recovered) = match &start {
        Start::New { metadata, .. } | Start::Join { metadata } => (
            Wal::create_with_options(&config.wal_dir, metadata, config.wal_options())?,
            Recovered::default(),
        ),
        Start::Restart { .. } => {
            let (wal, state) = Wal::open_with_options(&config.wal_dir, config.wal_options())?;
            let recovered = Recovered::from_wal(&state)?;
            (wal, recovered)
        }
    };
    let core = NodeCore::new(
        config,
        start,
        Box::new(wal),
        recovered,
        transport,
        state_machine,
    )?;
    spawn(core, tasks, shutdown)
}

/// Runs `core` on the raft thread, its log store on the `wal-sync` thread (inline while the
/// member is alone: [`wal_sync::Persistence::Alone`]), represented on `tasks`.
fn spawn(
    mut core: NodeCore,
    tasks: &mut tokio::task::JoinSet<task::TaskResult>,
    shutdown: CancellationToken,
) -> Result<RaftNodeHandle> {
    if core.alone_at_start {
        core.persistence.stay_inline_while_alone();
    } else {
        core.persistence.start_thread(core.synced.clone())?;
    }
    let status = core.status.clone();
    let (tx, rx) = mpsc::channel(NODE_CHANNEL);
    let (peer_tx, peer_rx) = mpsc::channel(NODE_CHANNEL);
    // The node runs on a thread of its own: its fsyncs then block nobody else, and it needs no
    // hand-off of a shared runtime worker per `Ready`. The task on `tasks` stands for it.
    let (done_tx, done_rx) = oneshot::channel();
    // The WAL moves to the `wal-sync` thread, which the raft thread owns: it stops (after its
    // last batch) when the raft thread's loop ends, before the task below reports the end.
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| Error::Corrupt(format!("cannot start the raft thread's runtime: {e}")))?;
    std::thread::Builder::new()
        .name("raft".into())
        .spawn(move || {
            let result = runtime.block_on(core.run(rx, peer_rx, shutdown));
            let _ = done_tx.send(result);
        })
        .map_err(|e| Error::Corrupt(format!("cannot start the raft thread: {e}")))?;
    tasks.spawn(async move {
        let result = done_rx.await.unwrap_or(Err(Error::Stopped));
        if let Err(e) = &result {
            tracing::error!(error = %e, "raft node stopped");
        }
        ("raft node", result.map_err(|e| e.to_string()))
    });
    Ok(RaftNodeHandle {
        tx,
        peer_tx,
        status,
    })
}

/// What a named task returns to its owner's `JoinSet`: its name and its outcome.
pub mod task {
    /// A task's name and outcome (Err carries the fatal error's text).
    pub type TaskResult = (&'static str, Result<(), String>);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn conf_entry(index: u64, kind: ChangeKind, id: u64) -> Entry {
        let change = EtcdConfChange {
            id: 0,
            kind,
            node_id: id,
            context: None,
        };
        let mut entry = Entry::default();
        entry.set_entry_type(EntryType::EntryConfChange);
        entry.index = index;
        entry.term = 2;
        entry.data = change.encode().into();
        entry
    }

    fn removed_ids(entries: &[Entry]) -> Vec<u64> {
        entries
            .iter()
            .map(|e| {
                let change = EtcdConfChange::decode(&e.data).expect("decode");
                assert_eq!(change.kind, ChangeKind::RemoveNode);
                change.node_id
            })
            .collect()
    }

    #[test]
    fn force_new_cluster_removes_every_other_member_after_the_committed_log() {
        let conf_state = ConfState {
            voters: vec![1, 2, 3],
            learners: vec![4],
            ..Default::default()
        };
        // Applied up to 10; committed after it: member 5 added, member 3 removed (an update
        // changes no membership).
        let entries = [
            conf_entry(9, ChangeKind::RemoveNode, 1),
            conf_entry(10, ChangeKind::UpdateNode, 4),
            conf_entry(11, ChangeKind::AddNode, 5),
            conf_entry(12, ChangeKind::RemoveNode, 3),
        ];
        let hard_state = HardState {
            term: 3,
            commit: 12,
            ..Default::default()
        };
        let removals =
            standalone_removals(2, &conf_state, &entries, 10, &hard_state).expect("removals");
        // Entry 9 was applied already (it is part of conf_state), so 1 stays a member to remove.
        assert_eq!(removed_ids(&removals), [1, 4, 5]);
        let indexes: Vec<u64> = removals.iter().map(|e| e.index).collect();
        assert_eq!(indexes, [13, 14, 15]);
        assert!(removals.iter().all(|e| e.term == 3));
        // A member alone already has nothing to remove.
        let alone = ConfState {
            voters: vec![2],
            ..Default::default()
        };
        assert!(
            standalone_removals(2, &alone, &[], 0, &hard_state)
                .expect("removals")
                .is_empty()
        );
    }
}
