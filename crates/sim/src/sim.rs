//! The simulator: one seed drives the members, the network, the clock and the clients.
//! This file holds the state and the event loop; by seam: `config` (the configuration a seed
//! picks and the report),
//! `members` (starts, crashes, faults), `membership` (membership changes at run time),
//! `network`, `ready` (each member's Ready step and the checks after it), `leases`,
//! `checkpoints` (lease checkpoints across leader changes),
//! `clients`, `invariants` and `storage` (what stands for the disk, the clock and the
//! network).
//!
//! # What is real and what is glue
//!
//! - Real, the member's own code: `raftnode`'s node ([`etcdrs_raftnode::Node`], the loop body
//!   the raft thread runs: proposals, ReadIndex, the Ready step in its order, membership
//!   changes from a new cluster's `AddNode` entries and from run-time changes proposed by
//!   the leader (etcd's MemberAdd --learner, MemberPromote, MemberRemove), snapshot
//!   installation, the snapshot marks
//!   and log compaction every `--snapshot-count` entries); the server's applier behind it
//!   ([`etcdrs_server::StandaloneMember`]: request decoding, one backend transaction per
//!   batch, the consistent index, the lessor promoted on the leader and demoted elsewhere,
//!   membership, the install of a leader's snapshot image, the waiters that answer
//!   proposers); the MVCC store on a redb `Backend` (restart from the backend,
//!   `Backend::snapshot` images); etcd's `InternalRaftRequest` as the entry payload.
//! - Glue: the log store (`SimLog`, memory that survives a crash as the fsynced WAL
//!   does, read back on restart as the WAL replays), the network and the snapshot images it
//!   carries, the clients and the server's request side they stand for (a waiter registered
//!   before a proposal, a ReadIndex read served once the apply reaches its index, a
//!   keep-alive renewed on the leader's lessor, and with checkpoints its clear of a
//!   checkpointed remainder), and the lease loops (the server's `run_lease_expiry`: expired
//!   leases revoked through raft; `run_lease_checkpoints`: remainders checkpointed through
//!   raft).
//!
//! # Time and durability
//!
//! Virtual milliseconds. A member ticks every [`TICK_MS`]; elections take
//! [`ELECTION_TICK`]..2x ticks (raft-rs draws that timeout from the thread's RNG, so after every
//! step the simulator redraws it from the seed wherever raft has just reset it). Each member's
//! backend reads a virtual clock ([`etcdrs_backend::Clock`]), and so do its lessor and the
//! applier's promotion: no wall-clock time decides anything. The backend commits durably once
//! [`Config::backend_batch_ms`] have passed since its last durable commit: in the batch that
//! finds it due, or, with [`Config::background_flush`] (as in a member), at the next poll of
//! its flush, so that raft hears of durability later than the apply; a crash is a clean
//! stop or a power cut, which puts back the database as of its last durable commit (raft's log
//! is durable at every Ready, as the WAL is), so raft replays what the backend lost.
//!
//! # Invariants, checked as the run goes
//!
//! - at most one leader per term, and a new leader's log holds every entry applied anywhere
//!   while the cluster's highest term was below its own (leader completeness);
//! - every member applies the same entry at each index (term and payload), with no gap;
//! - at equal applied index, equal MVCC revision, and (sampled every [`HASH_EVERY`] entries,
//!   and at the end) equal `HashKV`;
//! - a snapshot's backend image is never older than the snapshot;
//! - raft's configuration and the applier's membership name the same members;
//! - no lease is revoked before its TTL has run since its grant and every renewal its leader
//!   knew of;
//! - no lease on a leader's lessor expires later than its last keep-alive or grant there plus
//!   its TTL, or, from the promotion, the extension plus the last checkpoint that member applied
//!   (`checkpoints`);
//! - at the end, with the faults over: every member converges to the same applied index,
//!   revision, `HashKV` and backend hash, and the clients' history is linearizable.

use std::cmp::Ordering;
use std::collections::{BTreeMap, BinaryHeap, VecDeque};
use std::hash::{DefaultHasher, Hash, Hasher};
use std::path::PathBuf;
use std::time::{Duration, Instant};

use std::sync::atomic::{AtomicU64, Ordering as AtomicOrdering};
use std::sync::{Arc, Mutex};

use etcdrs_backend::{Backend, Clock};
use etcdrs_mvcc::lease::Renewal;
use etcdrs_mvcc::{KeyRange, KvStore, RangeParams};
use etcdrs_proto::etcdserverpb::compare::{CompareResult, CompareTarget, TargetUnion};
use etcdrs_proto::etcdserverpb::request_op::Request;
use etcdrs_proto::etcdserverpb::{
    Compare, DeleteRangeRequest, LeaseGrantRequest, LeaseRevokeRequest, PutRequest, RequestOp,
    TxnRequest,
};
use etcdrs_proto::raft_internal::{InternalRaftRequest, RequestHeader};
use etcdrs_raftnode::confchange::EtcdConfChange;
use etcdrs_raftnode::eraftpb::{ConfState, Entry, EntryType, HardState, Message, MessageType};
use etcdrs_raftnode::{
    Applied, Apply, LogStore, Node, NodeConfig, Recovered, StateMachine, Transport,
};
use etcdrs_server::{ApplyOutput, StandaloneMember};
use prost::Message as _;
use raft::StateRole;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use tokio::sync::oneshot;

use crate::checker::{Checker, Kind, Operation};

mod auth;
mod checkpoints;
mod clients;
mod config;
mod invariants;
mod leases;
mod members;
mod membership;
mod network;
mod ready;
mod storage;
mod watches;

pub use auth::AuthStats;
pub use checkpoints::LeaseStats;
pub use config::{Config, Report};
pub use watches::{WatchFault, WatchStats};

use storage::{Observations, Observed, Outbox, Recorder, SimLog, VirtualClock, lock};

/// One raft tick, virtual milliseconds.
pub const TICK_MS: u64 = 10;
/// Ticks of the election timeout (etcd's 1000 ms over its 100 ms heartbeat).
pub const ELECTION_TICK: usize = 10;
/// Ticks between heartbeats.
pub const HEARTBEAT_TICK: usize = 1;
/// How long a client waits for an answer before it gives up (its write's outcome is then
/// unknown).
pub const CLIENT_TIMEOUT_MS: u64 = 1500;
/// `HashKV` is compared whenever a batch ends at a multiple of this index.
pub const HASH_EVERY: u64 = 4;
/// The leader looks for expired leases this often (the server's lease-expiry loop).
pub const LEASE_EXPIRY_MS: u64 = 500;
/// A new leader's lessor restarts every lease's clock this far ahead (the election timeout,
/// as the applier's promotion passes it).
pub const LEASE_EXTEND_MS: u64 = ELECTION_TICK as u64 * TICK_MS;
/// Events kept for a failure's report.
const TRACE_TAIL: usize = 80;
/// How often a member's background flush looks for batches due (with
/// [`Config::background_flush`]), virtual ms.
pub const FLUSH_POLL_MS: u64 = 20;
/// The simulated cluster's id.
const CLUSTER_ID: u64 = 0x5eed;

/// A run that broke an invariant (or could not run).
#[derive(Clone, Debug)]
pub struct Failure {
    /// The seed that replays it.
    pub seed: u64,
    /// What broke.
    pub message: String,
    /// The last events before it, oldest first.
    pub trace: Vec<String>,
}

impl std::fmt::Display for Failure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        writeln!(f, "seed {}: {}", self.seed, self.message)?;
        writeln!(f, "last events (virtual ms):")?;
        for line in &self.trace {
            writeln!(f, "  {line}")?;
        }
        write!(
            f,
            "replay: ETCDRS_SIM_SEED={} cargo test -p etcdrs-sim --test seeds seeds_keep",
            self.seed
        )
    }
}

/// Run the simulation `config` describes.
pub fn run(config: &Config) -> Result<Report, Failure> {
    run_traced(config, TRACE_TAIL).0
}

/// [`run`], returning also the last `keep` events of the run (to compare two runs).
pub fn run_traced(config: &Config, keep: usize) -> (Result<Report, Failure>, Vec<String>) {
    let mut sim = match Sim::new(config.clone(), keep) {
        Ok(sim) => sim,
        Err(message) => {
            let failure = Failure {
                seed: config.seed,
                message,
                trace: Vec::new(),
            };
            return (Err(failure), Vec::new());
        }
    };
    let outcome = sim.run();
    let trace: Vec<String> = sim.trace.tail.iter().map(|n| n.to_string()).collect();
    let outcome = outcome.map_err(|message| Failure {
        seed: config.seed,
        message,
        trace: trace[trace.len().saturating_sub(TRACE_TAIL)..].to_vec(),
    });
    (outcome, trace)
}

type Step<T = ()> = Result<T, String>;

#[derive(Debug)]
enum Event {
    Tick(usize),
    LeaseExpiry(usize),
    Deliver {
        from: u64,
        msg: Box<Message>,
        image: Option<PathBuf>,
    },
    SnapshotReport {
        leader: usize,
        to: u64,
        ok: bool,
    },
    Client {
        client: usize,
        generation: u64,
    },
    Fault,
    Crash(usize),
    Restart(usize),
    /// A member's disk finishes writing the batch its node handed over.
    DiskWrite(usize),
    Heal,
    EndFaults,
    /// A client opens (or resumes) its watch; the generation of its watch it is for.
    WatchOpen(usize, u64),
    /// A client reads its watch stream.
    WatchPoll(usize, u64),
    /// A member's watch catch-up and compactor loops take a turn.
    WatchSync(usize),
    /// The administrator sets auth up, or revokes or grants the clients' permission.
    AuthAdmin,
    /// A member's lease-checkpoint loop takes a turn.
    LeaseCheckpoint(usize),
    /// A member's backend task flushes what is due ([`Config::background_flush`]).
    BackendFlush(usize),
}

struct Scheduled {
    time: u64,
    seq: u64,
    event: Event,
}

impl PartialEq for Scheduled {
    fn eq(&self, other: &Self) -> bool {
        (self.time, self.seq) == (other.time, other.seq)
    }
}

impl Eq for Scheduled {}

impl PartialOrd for Scheduled {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for Scheduled {
    /// Reversed: the heap pops the earliest event, ties in scheduling order.
    fn cmp(&self, other: &Self) -> Ordering {
        (other.time, other.seq).cmp(&(self.time, self.seq))
    }
}

struct Note {
    time: u64,
    what: &'static str,
    a: u64,
    b: u64,
    c: u64,
}

impl std::fmt::Display for Note {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{:>6} {} {} {} {}",
            self.time, self.what, self.a, self.b, self.c
        )
    }
}

#[derive(Default)]
struct Trace {
    hasher: DefaultHasher,
    tail: VecDeque<Note>,
    keep: usize,
    events: u64,
}

/// One member: its raft node and state while it runs, its durable raft log always.
struct Member {
    id: u64,
    /// The raft log as persisted: what the WAL holds; survives crashes.
    log: SimLog,
    /// `raftnode`'s node, over the log, with the server's applier as its state machine.
    node: Option<Node>,
    /// The server's state beside it: the store, the waiters, the received snapshot image.
    state: Option<StandaloneMember>,
    /// Messages the node sent, for the network.
    outbox: Outbox,
    /// What its applier and log reported.
    observed: Observations,
    db: PathBuf,
    /// A copy of `db` as of its last durable commit: what a power cut leaves.
    durable_db: PathBuf,
    /// Index of the last entry applied to the store.
    applied: u64,
    /// Proposals by request id, waiting for their apply on this member: the operation and
    /// the applier's answer.
    waiters: BTreeMap<u64, (usize, oneshot::Receiver<etcdrs_server::Result<ApplyOutput>>)>,
    /// ReadIndex requests waiting for their read state: the operation and raft's answer.
    reads: Vec<(usize, oneshot::Receiver<etcdrs_raftnode::Result<u64>>)>,
    /// Reads with their read index, waiting for the apply to reach it.
    read_waits: Vec<(u64, usize)>,
    /// Compaction requests waiting for their apply: the revision and the applier's answer.
    compactions: Vec<(i64, oneshot::Receiver<etcdrs_server::Result<ApplyOutput>>)>,
    /// When its lessor last became primary (virtual ms), while it is.
    promoted_at: Option<u64>,
    /// While it leads: the latest expiry (virtual ms) each lease may have on its lessor, from
    /// its promotion (the checkpoint it applied, else the full TTL, plus the extension), the
    /// keep-alives it renewed, and the grants it applied.
    lease_allowance: BTreeMap<i64, u64>,
    /// Leases its lessor renewed, with its applied index at the renewal: a renewal clears the
    /// lessor's checkpointed remainder at once (its clear goes through raft after), so only a
    /// checkpoint entry above that index stands for the lease on this member again. Gone with
    /// the lessor (a restart, a snapshot's install).
    renewed_at: BTreeMap<i64, u64>,
    /// The checkpoints its lessor holds are those of the entries it applied after this index
    /// (since its start, or since a snapshot's install, unless checkpoints persist).
    checkpoint_floor: u64,
    /// Its applied index when it last started: checkpoints at or below it came back from
    /// its backend (when they persist).
    started_at: u64,
    /// Stalled until then (virtual ms): its events wait.
    paused_until: u64,
    /// Its disk writes nothing until then (virtual ms).
    disk_stalled_until: u64,
    /// A `DiskWrite` is scheduled for it.
    disk_write_scheduled: bool,
    /// Its tick interval: clocks drift apart a little.
    tick_ms: u64,
    /// Removed from the cluster: stopped for good.
    removed: bool,
    /// A learner not promoted yet: clients do not use it (etcd's learners serve no client).
    learner: bool,
    /// Added, but no member has applied the addition yet: not started, not a member.
    awaiting_addition: bool,
    /// The applied index at which raft's configuration and the applier's membership were
    /// last compared.
    membership_checked: u64,
}

impl Member {
    /// Member `id`, not started, its files in `dir`; `added` for one added at run time (a
    /// learner whose addition is not applied yet).
    fn new(id: u64, dir: &std::path::Path, added: bool) -> Member {
        let observed = Observations::default();
        Member {
            id,
            log: SimLog::new(observed.clone()),
            node: None,
            state: None,
            outbox: Outbox::default(),
            observed,
            db: dir.join(format!("member-{id}.redb")),
            durable_db: dir.join(format!("member-{id}.durable")),
            applied: 0,
            waiters: BTreeMap::new(),
            reads: Vec::new(),
            read_waits: Vec::new(),
            compactions: Vec::new(),
            promoted_at: None,
            lease_allowance: BTreeMap::new(),
            renewed_at: BTreeMap::new(),
            checkpoint_floor: 0,
            started_at: 0,
            paused_until: 0,
            disk_stalled_until: 0,
            disk_write_scheduled: false,
            tick_ms: TICK_MS,
            removed: false,
            membership_checked: 0,
            learner: added,
            awaiting_addition: added,
        }
    }

    /// What a stopped member's process held goes with it: requests waiting on it, messages
    /// not sent, reports not read, its lessor's promotion.
    fn forget_process(&mut self) {
        self.waiters.clear();
        self.reads.clear();
        self.read_waits.clear();
        self.compactions.clear();
        lock(&self.outbox.0).clear();
        lock(&self.observed).clear();
        self.promoted_at = None;
        self.lease_allowance.clear();
        self.renewed_at.clear();
        self.disk_write_scheduled = false;
    }

    fn store(&self) -> Option<&Arc<KvStore>> {
        self.state.as_ref().map(StandaloneMember::store)
    }

    /// Part of the cluster: not removed, and not an addition still waiting to commit.
    fn is_member(&self) -> bool {
        !self.removed && !self.awaiting_addition
    }
}

/// What the clients did with a lease, for the TTL invariant.
struct LeaseLog {
    ttl: i64,
    granted_at: u64,
    /// Successful renewals: when, on which member, and from when a later leader knows of it
    /// (at once without checkpoints; with them, once the checkpoint it cleared is cleared
    /// everywhere, and never if an older checkpoint lands after it).
    renewals: Vec<Renewed>,
}

/// A keep-alive the leader's lessor renewed.
struct Renewed {
    at: u64,
    on: usize,
    known_from: Option<u64>,
}

/// How an operation completed.
#[derive(Clone, Copy, Debug)]
enum Outcome {
    Written,
    Read(Option<u64>),
    Cas(bool),
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum OpState {
    Open,
    Done,
    Failed,
    Abandoned,
}

struct SimOp {
    op: Operation,
    state: OpState,
}

#[derive(Default)]
struct Client {
    busy: Option<usize>,
    generation: u64,
}

struct Sim {
    cfg: Config,
    rng: StdRng,
    now: u64,
    seq: u64,
    queue: BinaryHeap<Scheduled>,
    members: Vec<Member>,
    /// While partitioned, each member's side.
    groups: Option<Vec<u8>>,
    faults: bool,
    clients: Vec<Client>,
    ops: Vec<SimOp>,
    /// The history's logical clock: one step per invocation or completion.
    clock: u64,
    next_request: u64,
    next_value: u64,
    trace: Trace,
    /// The leader of each term seen.
    leaders: BTreeMap<u64, u64>,
    /// (term, payload hash) of every entry applied anywhere, by index - 1.
    log: Vec<(u64, u64)>,
    /// For each of those, the highest term any member had reached when it was first applied:
    /// it was committed in that term or an earlier one, so every leader of a later term holds
    /// it (raft's leader completeness; a leader of an earlier term may still appear late, its
    /// votes delayed, and lack it).
    eras: Vec<u64>,
    /// The highest term any member has reached.
    max_term: u64,
    /// MVCC revision after applying up to each batch-ending index.
    revisions: BTreeMap<u64, i64>,
    /// `HashKV` at sampled applied indexes.
    hashes: BTreeMap<u64, u32>,
    crashes: u32,
    partitions: u32,
    pauses: u32,
    disk_stalls: u32,
    transfers: u32,
    /// The instant virtual time 0 stands for (only differences of instants are used).
    base: Instant,
    /// `now`, as the members' clocks read it.
    now_ms: Arc<AtomicU64>,
    leases: BTreeMap<i64, LeaseLog>,
    next_lease: i64,
    /// The lease checkpoints of every entry applied anywhere that holds some, by index: (lease,
    /// remaining TTL, 0 clearing it).
    checkpoint_log: BTreeMap<u64, Vec<(i64, i64)>>,
    /// Checkpoint requests proposed, by request id: what each was for.
    checkpoint_requests: BTreeMap<u64, checkpoints::Proposed>,
    lease_stats: LeaseStats,
    lease_revokes: u32,
    replayed: u64,
    /// The last value a client put (or deleted: `None`) on each key, for compare-and-sets.
    last_put: BTreeMap<u64, Option<u64>>,
    snapshots: u32,
    late_leaders: u32,
    /// Members the leader proposed to remove, and how many of them are gone.
    removal_targets: Vec<u64>,
    removed: u32,
    /// Learners added at run time, and of them promoted (their promotion proposed).
    added: u32,
    added_voters: u32,
    promoted: u32,
    /// Every revision's events, as the members' applies recorded them.
    history: crate::watch_check::History,
    /// The compacted revision after applying up to each batch-ending index.
    compacted: BTreeMap<u64, i64>,
    watches: Vec<watches::SimWatch>,
    watch_stats: WatchStats,
    auth_stats: AuthStats,
    /// For each write of the clients' user applied anywhere: whether its permission held when
    /// its batch applied (`None`: the batch changed it).
    auth_verdicts: BTreeMap<u64, Option<bool>>,
    // Dropped last: the stores above live in it.
    _dir: tempfile::TempDir,
}

fn key_bytes(key: u64) -> Vec<u8> {
    format!("key-{key}").into_bytes()
}

/// A compare-and-set as a client writes it: put `new` if the key holds `expect` (if it does
/// not exist, for `None`).
fn cas_request(key: u64, expect: Option<u64>, new: u64) -> TxnRequest {
    let compare = match expect {
        Some(value) => Compare {
            result: CompareResult::Equal as i32,
            target: CompareTarget::Value as i32,
            key: key_bytes(key),
            target_union: Some(TargetUnion::Value(value.to_string().into_bytes())),
            ..Compare::default()
        },
        None => Compare {
            result: CompareResult::Equal as i32,
            target: CompareTarget::Version as i32,
            key: key_bytes(key),
            target_union: Some(TargetUnion::Version(0)),
            ..Compare::default()
        },
    };
    TxnRequest {
        compare: vec![compare],
        success: vec![RequestOp {
            request: Some(Request::RequestPut(PutRequest {
                key: key_bytes(key),
                value: new.to_string().into_bytes().into(),
                ..PutRequest::default()
            })),
        }],
        failure: Vec::new(),
    }
}

fn payload_hash(entry: &Entry) -> u64 {
    let mut hasher = DefaultHasher::new();
    (entry.get_entry_type() as i32).hash(&mut hasher);
    entry.data.as_ref().hash(&mut hasher);
    hasher.finish()
}

impl Sim {
    fn new(cfg: Config, keep: usize) -> Step<Sim> {
        let shm = std::path::Path::new("/dev/shm");
        let dir = if shm.is_dir() {
            tempfile::Builder::new()
                .prefix("etcdrs-sim")
                .tempdir_in(shm)
        } else {
            tempfile::Builder::new().prefix("etcdrs-sim").tempdir()
        }
        .map_err(|e| format!("temporary directory: {e}"))?;
        let voters: Vec<u64> = (1..=cfg.members as u64).collect();
        let members = voters
            .iter()
            .map(|&id| Member::new(id, dir.path(), false))
            .collect();
        let mut sim = Sim {
            rng: StdRng::seed_from_u64(cfg.seed),
            now: 0,
            seq: 0,
            queue: BinaryHeap::new(),
            members,
            groups: None,
            faults: true,
            clients: (0..cfg.clients).map(|_| Client::default()).collect(),
            ops: Vec::new(),
            clock: 0,
            next_request: 1,
            next_value: 1,
            trace: Trace {
                keep,
                ..Trace::default()
            },
            leaders: BTreeMap::new(),
            log: Vec::new(),
            eras: Vec::new(),
            max_term: 0,
            revisions: BTreeMap::new(),
            hashes: BTreeMap::new(),
            crashes: 0,
            partitions: 0,
            pauses: 0,
            disk_stalls: 0,
            transfers: 0,
            base: Instant::now(),
            now_ms: Arc::default(),
            leases: BTreeMap::new(),
            next_lease: 1,
            checkpoint_log: BTreeMap::new(),
            checkpoint_requests: BTreeMap::new(),
            lease_stats: LeaseStats::default(),
            lease_revokes: 0,
            replayed: 0,
            last_put: BTreeMap::new(),
            snapshots: 0,
            late_leaders: 0,
            removal_targets: Vec::new(),
            removed: 0,
            added: 0,
            added_voters: 0,
            promoted: 0,
            history: crate::watch_check::History::new(),
            compacted: BTreeMap::new(),
            watches: Vec::new(),
            watch_stats: WatchStats::default(),
            auth_stats: AuthStats::default(),
            auth_verdicts: BTreeMap::new(),
            _dir: dir,
            cfg,
        };
        for i in 0..sim.members.len() {
            sim.members[i].tick_ms = sim.rng.random_range(TICK_MS - 1..=TICK_MS + 1);
            sim.start_member(i)?;
            let phase = sim.rng.random_range(1..=TICK_MS);
            sim.schedule(phase, Event::Tick(i));
            let phase = sim.rng.random_range(1..=LEASE_EXPIRY_MS);
            sim.schedule(phase, Event::LeaseExpiry(i));
            if let Some(interval) = sim.cfg.lease_checkpoint_ms {
                let phase = sim.rng.random_range(1..=interval);
                sim.schedule(phase, Event::LeaseCheckpoint(i));
            }
            if sim.cfg.background_flush {
                sim.schedule(1 + i as u64, Event::BackendFlush(i));
            }
        }
        for client in 0..sim.clients.len() {
            let at = sim.rng.random_range(0..20);
            sim.schedule(
                at,
                Event::Client {
                    client,
                    generation: 0,
                },
            );
        }
        if sim.cfg.crashes || sim.cfg.partitions {
            let at = sim.rng.random_range(100..400);
            sim.schedule(at, Event::Fault);
        }
        sim.schedule(sim.cfg.fault_ms, Event::EndFaults);
        if sim.cfg.watches {
            sim.start_watchers();
        }
        if sim.cfg.auth {
            let at = sim.rng.random_range(50..300);
            sim.schedule(at, Event::AuthAdmin);
        }
        // Before the first tick: a tick would move the election clock off zero.
        sim.pin_election_timeouts();
        Ok(sim)
    }

    fn schedule(&mut self, after: u64, event: Event) {
        self.seq += 1;
        self.queue.push(Scheduled {
            time: self.now + after,
            seq: self.seq,
            event,
        });
    }

    fn note(&mut self, what: &'static str, a: u64, b: u64, c: u64) {
        let note = Note {
            time: self.now,
            what,
            a,
            b,
            c,
        };
        (note.time, note.what, a, b, c).hash(&mut self.trace.hasher);
        if self.trace.tail.len() >= self.trace.keep {
            self.trace.tail.pop_front();
        }
        self.trace.tail.push_back(note);
    }

    fn per_mille(&mut self, rate: u32) -> bool {
        rate > 0 && self.rng.random_range(0..1000) < rate
    }

    fn run(&mut self) -> Step<Report> {
        let deadline = self.cfg.fault_ms + self.cfg.settle_ms;
        while let Some(Scheduled { time, event, .. }) = self.queue.pop() {
            if time > deadline {
                return Err(format!(
                    "no convergence {} ms after the faults ended: {}",
                    self.cfg.settle_ms,
                    self.convergence()
                ));
            }
            self.now = time;
            self.now_ms.store(time, AtomicOrdering::Relaxed);
            self.trace.events += 1;
            self.handle(event)?;
            self.pin_election_timeouts();
            self.process_readies()?;
            self.retire_removed();
            self.start_added()?;
            self.check_membership()?;
            self.check_leaders()?;
            self.check_lease_allowances()?;
            if !self.faults && self.converged() {
                return self.finish();
            }
        }
        Err("the event queue ran dry".into())
    }

    /// The member an event is for, if it is stalled now.
    fn stalled(&self, event: &Event) -> Option<u64> {
        let i = match event {
            Event::Tick(i)
            | Event::LeaseExpiry(i)
            | Event::WatchSync(i)
            | Event::LeaseCheckpoint(i)
            | Event::BackendFlush(i) => *i,
            Event::Deliver { msg, .. } => (msg.to as usize).checked_sub(1)?,
            Event::SnapshotReport { leader, .. } => *leader,
            _ => return None,
        };
        let until = self.members.get(i)?.paused_until;
        (until > self.now).then_some(until)
    }

    fn handle(&mut self, event: Event) -> Step {
        if let Some(until) = self.stalled(&event) {
            // A stalled process does these once it runs again.
            let after = until - self.now;
            self.schedule(after, event);
            return Ok(());
        }
        match event {
            Event::Tick(i) => {
                if let Some(node) = self.members[i].node.as_mut() {
                    node.tick();
                }
                let tick = self.members[i].tick_ms;
                self.schedule(tick, Event::Tick(i));
            }
            Event::LeaseExpiry(i) => {
                self.expire_leases(i)?;
                self.schedule(LEASE_EXPIRY_MS, Event::LeaseExpiry(i));
            }
            Event::LeaseCheckpoint(i) => {
                self.checkpoint_leases(i);
                if let Some(interval) = self.cfg.lease_checkpoint_ms {
                    self.schedule(interval, Event::LeaseCheckpoint(i));
                }
            }
            Event::BackendFlush(i) => {
                self.flush_backend(i)?;
                self.schedule(FLUSH_POLL_MS, Event::BackendFlush(i));
            }
            Event::Deliver { from, msg, image } => self.deliver(from, *msg, image),
            Event::SnapshotReport { leader, to, ok } => {
                if let Some(node) = self.members[leader].node.as_mut() {
                    node.report_snapshot(to, ok);
                }
            }
            Event::Client { client, generation } => self.client_wakes(client, generation)?,
            Event::Fault => self.fault()?,
            Event::Crash(i) => self.crash(i),
            Event::DiskWrite(i) => {
                self.members[i].disk_write_scheduled = false;
                if let Some(node) = self.members[i].node.as_mut() {
                    node.write_to_disk()
                        .map_err(|e| format!("member {}: disk write: {e}", i + 1))?;
                }
            }
            Event::WatchOpen(w, generation) => self.open_watch(w, generation)?,
            Event::WatchPoll(w, generation) => self.poll_watch(w, generation)?,
            Event::WatchSync(i) => self.sync_watchers(i)?,
            Event::AuthAdmin => self.auth_admin()?,
            Event::Restart(i) => {
                if self.members[i].node.is_none() && self.members[i].is_member() {
                    self.start_member(i)?;
                }
            }
            Event::Heal => {
                if self.groups.take().is_some() {
                    self.note("heal", 0, 0, 0);
                }
            }
            Event::EndFaults => {
                self.faults = false;
                self.groups = None;
                self.note("end-faults", 0, 0, 0);
                for i in 0..self.members.len() {
                    if self.members[i].node.is_none() && self.members[i].is_member() {
                        self.start_member(i)?;
                    }
                }
            }
        }
        Ok(())
    }

    /// raft-rs draws each new election timeout from the thread's RNG; draw it from the seed
    /// instead wherever raft has just reset its election clock, before the next tick reads it.
    fn pin_election_timeouts(&mut self) {
        for i in 0..self.members.len() {
            let Some(node) = self.members[i].node.as_ref() else {
                continue;
            };
            if node.raw().raft.election_elapsed != 0 {
                continue;
            }
            let timeout = self.rng.random_range(ELECTION_TICK..2 * ELECTION_TICK);
            if let Some(node) = self.members[i].node.as_mut() {
                node.raw_mut().raft.set_randomized_election_timeout(timeout);
            }
        }
    }
}
