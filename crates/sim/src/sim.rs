//! The simulator: one seed drives the members, the network, the clock and the clients.
//!
//! # What is real and what is glue
//!
//! - Real: raft-rs's `RawNode` with `raftnode`'s configuration (check quorum, pre-vote as the
//!   seed picks, the default safe ReadIndex); the MVCC store (`KvStore` over a redb `Backend`:
//!   write batches, transactions, revisions, the lessor, `HashKV` and the backend hash, restart
//!   from the backend, `Backend::snapshot` images and `KvStore::install_snapshot`); etcd's
//!   `InternalRaftRequest` as the entry payload.
//! - Glue, because the real pieces cannot be driven without threads, tokio or files, or are
//!   private to their crates: the Ready handling mirrors `raftnode`'s `NodeCore::on_ready`
//!   (messages, snapshot, committed entries, read states, persist, persisted messages, advance,
//!   light ready) and its `on_applied` log compaction, over raft-rs's `MemStorage` standing for
//!   the WAL (it survives a crash) wrapped as `raftnode`'s `NodeStorage` is (snapshots at the
//!   applied index); the applier mirrors `server`'s `apply_batch` for Put, DeleteRange,
//!   LeaseGrant and LeaseRevoke (skip entries at or below the consistent index, one backend
//!   transaction per batch, consistent index recorded, commit, the lessor promoted on the
//!   leader and demoted elsewhere), and the lease-expiry loop, the server's.
//!
//! # Time and durability
//!
//! Virtual milliseconds. A member ticks every [`TICK_MS`]; elections take
//! [`ELECTION_TICK`]..2x ticks (raft-rs draws that timeout from the thread's RNG, so after every
//! step the simulator redraws it from the seed wherever raft has just reset it). The lessor
//! gets virtual instants. The backend commits durably every [`Config::backend_batch_ms`]; a crash is a
//! clean stop or a power cut, which puts back the database as of its last durable commit (raft's
//! log is durable at every Ready, as the WAL is), so raft replays what the backend lost.
//!
//! # Invariants, checked as the run goes
//!
//! - at most one leader per term, and a new leader's log holds every entry applied anywhere
//!   while the cluster's highest term was below its own (leader completeness);
//! - every member applies the same entry at each index (term and payload), with no gap;
//! - at equal applied index, equal MVCC revision, and (sampled every [`HASH_EVERY`] entries,
//!   and at the end) equal `HashKV`;
//! - a snapshot's backend image is never older than the snapshot;
//! - no lease is revoked before its TTL has run since its grant and every renewal its leader
//!   knew of;
//! - at the end, with the faults over: every member converges to the same applied index,
//!   revision, `HashKV` and backend hash, and the clients' history is linearizable.

use std::cmp::Ordering;
use std::collections::{BTreeMap, BinaryHeap, VecDeque};
use std::hash::{DefaultHasher, Hash, Hasher};
use std::path::PathBuf;
use std::time::{Duration, Instant};

use etcdrs_backend::Backend;
use etcdrs_mvcc::lease::Renewal;
use etcdrs_mvcc::{KeyRange, KvStore, RangeParams};
use etcdrs_proto::etcdserverpb::compare::{CompareResult, CompareTarget, TargetUnion};
use etcdrs_proto::etcdserverpb::request_op::Request;
use etcdrs_proto::etcdserverpb::{
    Compare, DeleteRangeRequest, LeaseGrantRequest, LeaseRevokeRequest, PutRequest, RequestOp,
    TxnRequest,
};
use etcdrs_proto::raft_internal::{InternalRaftRequest, RequestHeader};
use prost::Message as _;
use raft::eraftpb::{ConfState, Entry, EntryType, Message, MessageType};
use raft::storage::MemStorage;
use raft::{RawNode, StateRole};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use crate::checker::{Checker, Kind, Operation};

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
/// Events kept for a failure's report.
const TRACE_TAIL: usize = 80;

/// What one run simulates; [`Config::from_seed`] picks it all from the seed.
#[derive(Clone, Debug)]
pub struct Config {
    /// The seed of everything.
    pub seed: u64,
    /// Members (voters).
    pub members: usize,
    /// Clients, each with one operation outstanding at a time.
    pub clients: usize,
    /// Keys the clients use.
    pub keys: u64,
    /// Virtual milliseconds during which faults happen and clients run.
    pub fault_ms: u64,
    /// Virtual milliseconds after that within which the cluster must converge.
    pub settle_ms: u64,
    /// Raft messages dropped, per mille, while faults happen.
    pub drop_per_mille: u32,
    /// Raft messages delivered twice, per mille, while faults happen.
    pub duplicate_per_mille: u32,
    /// Longest ordinary delivery delay, ms (a few messages take much longer: reordering).
    pub max_delay_ms: u64,
    /// Whether members crash and restart.
    pub crashes: bool,
    /// The backend commits durably at most this often, virtual ms (etcd's
    /// `--backend-batch-interval`, 100 ms by default); in between, a power cut loses commits.
    pub backend_batch_ms: u64,
    /// Whether the network partitions.
    pub partitions: bool,
    /// Whether members stall (a process paused: no ticks, no messages handled, for a while)
    /// and leaders are asked to hand over leadership (etcd's MoveLeader).
    pub pauses: bool,
    /// raft's pre-vote.
    pub pre_vote: bool,
    /// Whether forwarded proposals (`MsgPropose`) may be duplicated too. Off by default: a
    /// duplicated proposal is appended twice and its write applied twice (neither raft nor
    /// etcd's applier deduplicates), which etcd's TCP transport never causes.
    pub duplicate_proposals: bool,
    /// Reads served from the member's own store at once, without ReadIndex (a serializable
    /// read passed off as linearizable): a planted bug, for tests that the checks catch one.
    pub local_reads: bool,
    /// The leader looks for expired leases as if its clock ran this many ms ahead: a planted
    /// bug (0: none), for tests that the lease invariant catches one.
    pub lease_clock_ahead_ms: u64,
    /// Log compaction as `raftnode` does it: after this many applied entries (etcd's
    /// `--snapshot-count`) and a durable backend commit, the log before the last
    /// `catch_up` entries goes, so a member that lags further gets a snapshot: the leader's
    /// backend image (`Backend::snapshot`), installed with `KvStore::install_snapshot`.
    pub compaction: Option<(u64, u64)>,
}

impl Config {
    /// A configuration drawn from `seed`.
    pub fn from_seed(seed: u64) -> Config {
        let mut rng = StdRng::seed_from_u64(seed ^ 0x9e37_79b9_7f4a_7c15);
        Config {
            seed,
            members: [3, 3, 5][rng.random_range(0..3)],
            clients: rng.random_range(2..=6),
            keys: rng.random_range(1..=3),
            fault_ms: 3000,
            settle_ms: 5000,
            drop_per_mille: rng.random_range(0..=100),
            duplicate_per_mille: rng.random_range(0..=50),
            max_delay_ms: rng.random_range(1..=20),
            crashes: rng.random_bool(0.7),
            backend_batch_ms: rng.random_range(100..=500),
            partitions: rng.random_bool(0.7),
            pauses: rng.random_bool(0.5),
            pre_vote: rng.random_bool(0.5),
            duplicate_proposals: false,
            local_reads: false,
            lease_clock_ahead_ms: 0,
            compaction: rng
                .random_bool(0.5)
                .then(|| (rng.random_range(5..=40), rng.random_range(1..=10))),
        }
    }
}

/// What a run that kept every invariant did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Report {
    /// The seed.
    pub seed: u64,
    /// Hash of every event in order: equal for two runs of one seed.
    pub trace_hash: u64,
    /// Events handled.
    pub events: u64,
    /// Operations in the checked history.
    pub history: usize,
    /// Of those, the ones that completed.
    pub completed: usize,
    /// Writes whose outcome stayed unknown (client timeouts).
    pub unknown: usize,
    /// Compare-and-sets answered (succeeded, failed).
    pub cas: (usize, usize),
    /// The converged applied index.
    pub applied: u64,
    /// The converged MVCC revision.
    pub revision: i64,
    /// The highest term any member reached.
    pub term: u64,
    /// Member crashes.
    pub crashes: u32,
    /// Network partitions.
    pub partitions: u32,
    /// Member stalls.
    pub pauses: u32,
    /// Leader transfers asked for.
    pub transfers: u32,
    /// Virtual milliseconds simulated.
    pub simulated_ms: u64,
    /// States the linearizability checker explored.
    pub checker_states: usize,
    /// Keys on which the checker hit its budget.
    pub checker_gave_up: usize,
    /// Leases granted.
    pub leases: i64,
    /// Leases that expired and were revoked.
    pub lease_revokes: u32,
    /// Entries applied again after a restart, their backend commits lost in the crash.
    pub replayed: u64,
    /// Snapshots installed (the leader's backend image, on a member that lagged behind the
    /// compacted log).
    pub snapshots: u32,
}

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
    Heal,
    EndFaults,
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

/// raft-rs's in-memory log standing for the WAL, whose snapshots stand for the state machine's
/// last applied entry, as `raftnode`'s `NodeStorage` (private to its crate) answers them.
#[derive(Clone)]
struct SimStorage {
    mem: MemStorage,
    /// (index, term) of the last entry the store applied.
    applied: std::rc::Rc<std::cell::Cell<(u64, u64)>>,
    conf_state: ConfState,
}

impl raft::Storage for SimStorage {
    fn initial_state(&self) -> raft::Result<raft::RaftState> {
        self.mem.initial_state()
    }

    fn entries(
        &self,
        low: u64,
        high: u64,
        max_size: impl Into<Option<u64>>,
        context: raft::GetEntriesContext,
    ) -> raft::Result<Vec<Entry>> {
        self.mem.entries(low, high, max_size, context)
    }

    fn term(&self, idx: u64) -> raft::Result<u64> {
        self.mem.term(idx)
    }

    fn first_index(&self) -> raft::Result<u64> {
        self.mem.first_index()
    }

    fn last_index(&self) -> raft::Result<u64> {
        self.mem.last_index()
    }

    fn snapshot(&self, request_index: u64, _to: u64) -> raft::Result<raft::eraftpb::Snapshot> {
        let (index, term) = self.applied.get();
        if index == 0 || index < request_index {
            return Err(raft::Error::Store(
                raft::StorageError::SnapshotTemporarilyUnavailable,
            ));
        }
        let mut snapshot = raft::eraftpb::Snapshot::default();
        let meta = snapshot.mut_metadata();
        meta.index = index;
        meta.term = term;
        meta.set_conf_state(self.conf_state.clone());
        Ok(snapshot)
    }
}

/// One member: its raft node and store while it runs, its durable raft state always.
struct Member {
    id: u64,
    /// The raft log and hard state as persisted: what the WAL holds; survives crashes.
    storage: SimStorage,
    node: Option<RawNode<SimStorage>>,
    kv: Option<KvStore>,
    db: PathBuf,
    /// A copy of `db` as of its last durable commit: what a power cut leaves.
    durable_db: PathBuf,
    /// When the backend last committed durably (virtual ms).
    last_durable: u64,
    /// Index of the last entry applied to `kv`.
    applied: u64,
    /// Proposals by request id, waiting for their apply on this member: the operation.
    waiters: BTreeMap<u64, usize>,
    /// ReadIndex requests by context, waiting for their read state: the operation.
    reads: BTreeMap<u64, usize>,
    /// Reads with their read index, waiting for the apply to reach it.
    read_waits: Vec<(u64, usize)>,
    /// When its lessor last became primary (virtual ms), while it is.
    promoted_at: Option<u64>,
    /// Applied index of the last log compaction.
    last_mark: u64,
    /// Stalled until then (virtual ms): its events wait.
    paused_until: u64,
    /// Its tick interval: clocks drift apart a little.
    tick_ms: u64,
    /// Backend images received with snapshot messages, by snapshot index.
    images: BTreeMap<u64, PathBuf>,
}

/// What the clients did with a lease, for the TTL invariant.
struct LeaseLog {
    ttl: i64,
    granted_at: u64,
    /// Successful renewals: when, and on which member.
    renewals: Vec<(u64, usize)>,
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
    logger: slog::Logger,
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
    transfers: u32,
    /// The instant virtual time 0 stands for (only differences of instants are used).
    base: Instant,
    leases: BTreeMap<i64, LeaseLog>,
    next_lease: i64,
    lease_revokes: u32,
    replayed: u64,
    /// The last value a client put (or deleted: `None`) on each key, for compare-and-sets.
    last_put: BTreeMap<u64, Option<u64>>,
    snapshots: u32,
    // Dropped last: the stores above live in it.
    _dir: tempfile::TempDir,
}

fn raft_config(id: u64, applied: u64, pre_vote: bool) -> raft::Config {
    // As `raftnode::start` configures raft, with the simulation's tick counts.
    raft::Config {
        id,
        election_tick: ELECTION_TICK,
        heartbeat_tick: HEARTBEAT_TICK,
        applied,
        pre_vote,
        check_quorum: true,
        max_size_per_msg: 1024 * 1024,
        max_inflight_msgs: 256,
        ..Default::default()
    }
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
                value: new.to_string().into_bytes(),
                ..PutRequest::default()
            })),
        }],
        failure: Vec::new(),
    }
}

/// Whether a compare-and-set's comparisons hold, read inside its transaction (the server's
/// `apply::txn_write` compares the same way for these two targets).
fn cas_holds(txn: &etcdrs_mvcc::Txn<'_, '_>, request: &TxnRequest) -> Step<bool> {
    for compare in &request.compare {
        let found = txn
            .range(KeyRange::new(&compare.key, &[]), RangeParams::default())
            .map_err(|e| format!("txn range: {e}"))?;
        let kv = found.kvs.first();
        let held = match &compare.target_union {
            Some(TargetUnion::Value(value)) => kv.is_some_and(|kv| kv.value == *value),
            Some(TargetUnion::Version(version)) => kv.map_or(0, |kv| kv.version) == *version,
            _ => return Err("a comparison the clients never send".into()),
        };
        if !held {
            return Ok(false);
        }
    }
    Ok(true)
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
            .map(|&id| Member {
                id,
                storage: SimStorage {
                    mem: MemStorage::new_with_conf_state(ConfState::from((
                        voters.clone(),
                        Vec::<u64>::new(),
                    ))),
                    applied: Default::default(),
                    conf_state: ConfState::from((voters.clone(), Vec::<u64>::new())),
                },
                node: None,
                kv: None,
                db: dir.path().join(format!("member-{id}.redb")),
                durable_db: dir.path().join(format!("member-{id}.durable")),
                last_durable: 0,
                applied: 0,
                waiters: BTreeMap::new(),
                reads: BTreeMap::new(),
                read_waits: Vec::new(),
                promoted_at: None,
                last_mark: 0,
                images: BTreeMap::new(),
                paused_until: 0,
                tick_ms: TICK_MS,
            })
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
            logger: slog::Logger::root(slog::Discard, slog::o!()),
            leaders: BTreeMap::new(),
            log: Vec::new(),
            eras: Vec::new(),
            max_term: 0,
            revisions: BTreeMap::new(),
            hashes: BTreeMap::new(),
            crashes: 0,
            partitions: 0,
            pauses: 0,
            transfers: 0,
            // Virtual instants stay behind the wall clock (see `apply`'s grants).
            base: Instant::now()
                .checked_sub(Duration::from_secs(1000))
                .unwrap_or_else(Instant::now),
            leases: BTreeMap::new(),
            next_lease: 1,
            lease_revokes: 0,
            replayed: 0,
            last_put: BTreeMap::new(),
            snapshots: 0,
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
            self.trace.events += 1;
            self.handle(event)?;
            self.pin_election_timeouts();
            self.process_readies()?;
            self.check_leaders()?;
            if !self.faults && self.converged() {
                return self.finish();
            }
        }
        Err("the event queue ran dry".into())
    }

    /// The member an event is for, if it is stalled now.
    fn stalled(&self, event: &Event) -> Option<u64> {
        let i = match event {
            Event::Tick(i) | Event::LeaseExpiry(i) => *i,
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
            Event::Deliver { from, msg, image } => self.deliver(from, *msg, image),
            Event::SnapshotReport { leader, to, ok } => {
                if let Some(node) = self.members[leader].node.as_mut() {
                    let status = if ok {
                        raft::SnapshotStatus::Finish
                    } else {
                        raft::SnapshotStatus::Failure
                    };
                    node.report_snapshot(to, status);
                }
            }
            Event::Client { client, generation } => self.client_wakes(client, generation)?,
            Event::Fault => self.fault(),
            Event::Crash(i) => self.crash(i),
            Event::Restart(i) => {
                if self.members[i].node.is_none() {
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
                    if self.members[i].node.is_none() {
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
            if node.raft.election_elapsed != 0 {
                continue;
            }
            let timeout = self.rng.random_range(ELECTION_TICK..2 * ELECTION_TICK);
            if let Some(node) = self.members[i].node.as_mut() {
                node.raft.set_randomized_election_timeout(timeout);
            }
        }
    }

    // ---- members ----

    /// Start (or restart) member `i` from its raft storage and its backend, as a member
    /// restarts from its WAL and `member/snap/db`.
    fn start_member(&mut self, i: usize) -> Step {
        let member = &mut self.members[i];
        let mut backend = Backend::open(&member.db).map_err(|e| format!("open backend: {e}"))?;
        // Nothing becomes durable by the wall clock: only a clean stop makes it so.
        backend.set_batching(Duration::from_secs(1 << 40), u64::MAX);
        let kv = KvStore::open(backend, 1).map_err(|e| format!("open store: {e}"))?;
        kv.force_durable()
            .map_err(|e| format!("durable commit: {e}"))?;
        std::fs::copy(&member.db, &member.durable_db)
            .map_err(|e| format!("copy the durable backend: {e}"))?;
        member.last_durable = self.now;
        let applied = kv.consistent_index();
        // Entries applied before a crash whose backend commits it lost: raft replays them.
        self.replayed += member.applied.saturating_sub(applied);
        {
            // As `raftnode` restarts: entries the store applied were committed.
            let mut core = member.storage.mem.wl();
            let commit = core.hard_state().commit.max(applied);
            core.mut_hard_state().commit = commit;
        }
        let applied_term = raft::Storage::term(&member.storage, applied).unwrap_or(0);
        member.storage.applied.set((applied, applied_term));
        member.last_mark = member.last_mark.min(applied);
        let config = raft_config(member.id, applied, self.cfg.pre_vote);
        let node = RawNode::new(&config, member.storage.clone(), &self.logger)
            .map_err(|e| format!("start raft: {e}"))?;
        member.node = Some(node);
        member.kv = Some(kv);
        member.applied = applied;
        member.promoted_at = None;
        let id = member.id;
        self.note("start", id, applied, 0);
        // raft drew the new node's election timeout from the thread's RNG.
        self.pin_election_timeouts();
        Ok(())
    }

    fn crash(&mut self, i: usize) {
        let clean = self.rng.random_bool(0.5);
        let member = &mut self.members[i];
        if member.node.take().is_none() {
            return;
        }
        if let Some(kv) = member.kv.take() {
            if clean {
                // A clean stop: the backend's last commits reach the disk.
                let _ = kv.force_durable();
            }
            drop(kv);
            if !clean {
                // A power cut: what was committed since the last durable commit is lost, and
                // raft replays it from the log after the consistent index.
                let _ = std::fs::copy(&member.durable_db, &member.db);
            }
        }
        member.waiters.clear();
        member.reads.clear();
        member.read_waits.clear();
        member.images.clear();
        member.promoted_at = None;
        let id = member.id;
        self.crashes += 1;
        self.note("crash", id, u64::from(clean), 0);
        let after = self.rng.random_range(50..=800);
        self.schedule(after, Event::Restart(i));
    }

    fn fault(&mut self) {
        if !self.faults {
            return;
        }
        match self.rng.random_range(0..6) {
            0 | 1 if self.cfg.partitions && self.groups.is_none() => {
                let n = self.members.len();
                let groups: Vec<u8> = if self.rng.random_bool(0.5) {
                    let alone = self.rng.random_range(0..n);
                    (0..n).map(|i| u8::from(i == alone)).collect()
                } else {
                    (0..n).map(|_| self.rng.random_range(0..2)).collect()
                };
                let mask = groups
                    .iter()
                    .enumerate()
                    .fold(0u64, |m, (i, g)| m | (u64::from(*g) << i));
                self.groups = Some(groups);
                self.partitions += 1;
                self.note("partition", mask, 0, 0);
                let after = self.rng.random_range(100..=1500);
                self.schedule(after, Event::Heal);
            }
            4 if self.cfg.pauses => {
                let i = self.rng.random_range(0..self.members.len());
                let pause = self.rng.random_range(50..=600);
                self.members[i].paused_until = self.now + pause;
                let id = self.members[i].id;
                self.pauses += 1;
                self.note("pause", id, pause, 0);
            }
            5 if self.cfg.pauses => {
                let n = self.members.len() as u64;
                let to = self.rng.random_range(1..=n);
                let leader = self.members.iter_mut().find(|m| {
                    m.paused_until <= self.now
                        && m.node
                            .as_ref()
                            .is_some_and(|n| n.raft.state == StateRole::Leader)
                });
                if let Some(member) = leader
                    && member.id != to
                    && let Some(node) = member.node.as_mut()
                {
                    node.transfer_leader(to);
                    let id = member.id;
                    self.transfers += 1;
                    self.note("transfer-leader", id, to, 0);
                }
            }
            2 if self.cfg.crashes => {
                let up: Vec<usize> = (0..self.members.len())
                    .filter(|&i| self.members[i].node.is_some())
                    .collect();
                if !up.is_empty() {
                    let i = up[self.rng.random_range(0..up.len())];
                    self.schedule(0, Event::Crash(i));
                }
            }
            _ => {}
        }
        let after = self.rng.random_range(50..=500);
        self.schedule(after, Event::Fault);
    }

    // ---- network ----

    fn send(&mut self, from: u64, messages: Vec<Message>) -> Step {
        for msg in messages {
            let (kind, to, term, index) = (msg.get_msg_type() as u64, msg.to, msg.term, msg.index);
            let image = if msg.get_msg_type() == MessageType::MsgSnapshot {
                Some(self.snapshot_image(from, &msg)?)
            } else {
                None
            };
            if self.faults && self.per_mille(self.cfg.drop_per_mille) {
                self.note("drop", kind, from * 100 + to, term);
                if image.is_some() {
                    let leader = (from - 1) as usize;
                    self.schedule(
                        1,
                        Event::SnapshotReport {
                            leader,
                            to,
                            ok: false,
                        },
                    );
                }
                continue;
            }
            let may_duplicate =
                msg.get_msg_type() != MessageType::MsgPropose || self.cfg.duplicate_proposals;
            let copies =
                if self.faults && may_duplicate && self.per_mille(self.cfg.duplicate_per_mille) {
                    2
                } else {
                    1
                };
            for _ in 0..copies {
                let delay = if self.faults && self.rng.random_range(0..20) == 0 {
                    self.rng.random_range(20..=200)
                } else {
                    self.rng.random_range(1..=self.cfg.max_delay_ms)
                };
                self.note("send", kind, from * 100 + to, term * 1_000_000 + index);
                self.schedule(
                    delay,
                    Event::Deliver {
                        from,
                        msg: Box::new(msg.clone()),
                        image: image.clone(),
                    },
                );
            }
        }
        Ok(())
    }

    /// The backend image a snapshot message carries (rafthttp sends the database after the
    /// message): the sender's last commit, which must not be older than the snapshot.
    fn snapshot_image(&mut self, from: u64, msg: &Message) -> Step<PathBuf> {
        let index = msg.get_snapshot().get_metadata().index;
        let member = &self.members[(from - 1) as usize];
        let Some(kv) = member.kv.as_ref() else {
            return Err(format!("stopped member {from} sends a snapshot"));
        };
        let consistent = kv.consistent_index();
        if consistent < index {
            return Err(format!(
                "member {from} sends a snapshot at {index} with a backend image at {consistent}"
            ));
        }
        let image = kv
            .backend()
            .snapshot()
            .map_err(|e| format!("backend snapshot: {e}"))?;
        self.seq += 1;
        let path = self._dir.path().join(format!("image-{}.redb", self.seq));
        std::fs::copy(image.path(), &path).map_err(|e| format!("copy image: {e}"))?;
        self.note("snapshot-sent", from * 100 + msg.to, index, consistent);
        Ok(path)
    }

    fn deliver(&mut self, from: u64, msg: Message, image: Option<PathBuf>) {
        let to = msg.to;
        let kind = msg.get_msg_type() as u64;
        let Some(i) = (to as usize)
            .checked_sub(1)
            .filter(|&i| i < self.members.len())
        else {
            return;
        };
        let cut = self
            .groups
            .as_ref()
            .is_some_and(|g| g[(from - 1) as usize] != g[i]);
        let up = self.members[i].node.is_some();
        if let Some(image) = image {
            // The sender learns whether the snapshot arrived.
            let leader = (from - 1) as usize;
            let ok = up && !cut;
            self.schedule(1, Event::SnapshotReport { leader, to, ok });
            if ok {
                let index = msg.get_snapshot().get_metadata().index;
                self.members[i].images.insert(index, image);
            }
        }
        if cut {
            self.note("cut", kind, from * 100 + to, 0);
            return;
        }
        let Some(node) = self.members[i].node.as_mut() else {
            self.note("to-down", kind, from * 100 + to, 0);
            return;
        };
        let stepped = node.step(msg).is_ok();
        self.note("deliver", kind, from * 100 + to, u64::from(stepped));
    }

    // ---- the Ready loop ----

    fn process_readies(&mut self) -> Step {
        loop {
            let mut any = false;
            for i in 0..self.members.len() {
                any |= self.process(i)?;
            }
            self.pin_election_timeouts();
            if !any {
                return Ok(());
            }
        }
    }

    fn process(&mut self, i: usize) -> Step<bool> {
        let Some(mut node) = self.members[i].node.take() else {
            return Ok(false);
        };
        if !node.has_ready() {
            self.members[i].node = Some(node);
            return Ok(false);
        }
        let result = self.on_ready(i, &mut node);
        self.members[i].node = Some(node);
        result.map(|()| true)
    }

    /// `raftnode`'s `NodeCore::on_ready`, with the storage standing for the WAL.
    fn on_ready(&mut self, i: usize, node: &mut RawNode<SimStorage>) -> Step {
        let id = self.members[i].id;
        let mut ready = node.ready();
        self.send(id, ready.take_messages())?;
        if !ready.snapshot().is_empty() {
            self.install_snapshot(i, ready.snapshot().clone())?;
        }
        let leading = (node.raft.state == StateRole::Leader, node.raft.term);
        self.apply(i, ready.take_committed_entries(), leading)?;
        for state in ready.take_read_states() {
            let ctx = <[u8; 8]>::try_from(state.request_ctx.as_slice())
                .map(u64::from_be_bytes)
                .unwrap_or(u64::MAX);
            if let Some(op) = self.members[i].reads.remove(&ctx) {
                self.note("read-index", id, op as u64, state.index);
                self.members[i].read_waits.push((state.index, op));
            }
        }
        let storage = self.members[i].storage.mem.clone();
        let entries = ready.take_entries();
        if !entries.is_empty() {
            storage
                .wl()
                .append(&entries)
                .map_err(|e| format!("persist entries: {e}"))?;
        }
        if let Some(hs) = ready.hs() {
            storage.wl().set_hardstate(hs.clone());
        }
        self.send(id, ready.take_persisted_messages())?;
        let mut light = node.advance(ready);
        if let Some(commit) = light.commit_index() {
            storage.wl().mut_hard_state().commit = commit;
        }
        self.send(id, light.take_messages())?;
        let leading = (node.raft.state == StateRole::Leader, node.raft.term);
        self.apply(i, light.take_committed_entries(), leading)?;
        node.advance_apply();
        self.serve_reads(i)
    }

    /// `raftnode`'s `install_snapshot` with the server's: the store takes the leader's image,
    /// then the log restarts after the snapshot.
    fn install_snapshot(&mut self, i: usize, snapshot: raft::eraftpb::Snapshot) -> Step {
        let (index, term) = {
            let meta = snapshot.get_metadata();
            (meta.index, meta.term)
        };
        let member = &mut self.members[i];
        let id = member.id;
        let Some(image) = member.images.remove(&index) else {
            return Err(format!(
                "member {id} installs snapshot {index} without its image"
            ));
        };
        member.images.retain(|&at, _| at > index);
        let Some(kv) = member.kv.as_ref() else {
            return Err(format!("stopped member {id} installs a snapshot"));
        };
        kv.install_snapshot(&image, &[])
            .map_err(|e| format!("install snapshot: {e}"))?;
        let consistent = kv.consistent_index();
        if consistent < index {
            return Err(format!(
                "member {id} installed snapshot {index} from an image at {consistent}"
            ));
        }
        std::fs::copy(&member.db, &member.durable_db)
            .map_err(|e| format!("copy the durable backend: {e}"))?;
        member.last_durable = self.now;
        member
            .storage
            .mem
            .wl()
            .apply_snapshot(snapshot)
            .map_err(|e| format!("raft snapshot: {e}"))?;
        member.storage.applied.set((index, term));
        member.applied = index;
        member.last_mark = index;
        // Entries up to the image's consistent index are skipped by the applier.
        let _ = std::fs::remove_file(&image);
        self.snapshots += 1;
        self.note("snapshot-installed", id, index, consistent);
        Ok(())
    }

    /// `raftnode`'s `on_applied`: with a durable commit, every `snapshot_count` entries, the
    /// log before the catch-up entries goes.
    fn maybe_compact(&mut self, i: usize, index: u64, durable: bool) -> Step {
        let Some((count, catch_up)) = self.cfg.compaction else {
            return Ok(());
        };
        let member = &mut self.members[i];
        if !durable || index < member.last_mark + count {
            return Ok(());
        }
        member.last_mark = index;
        let keep_from = index.saturating_sub(catch_up);
        let first = raft::Storage::first_index(&member.storage).unwrap_or(1);
        if keep_from > first {
            member
                .storage
                .mem
                .wl()
                .compact(keep_from)
                .map_err(|e| format!("compact: {e}"))?;
            let id = member.id;
            self.note("compact", id, keep_from, 0);
        }
        Ok(())
    }

    /// `server`'s `apply_batch` for the requests the clients make, with the invariants on
    /// what was applied.
    fn apply(&mut self, i: usize, entries: Vec<Entry>, leading: (bool, u64)) -> Step {
        if entries.is_empty() {
            return Ok(());
        }
        let member = &mut self.members[i];
        let id = member.id;
        let Some(kv) = member.kv.as_ref() else {
            return Err(format!("member {id} applies while stopped"));
        };
        let skip_below = kv.consistent_index();
        let mut batch = kv.write().map_err(|e| format!("write batch: {e}"))?;
        let mut results = Vec::new();
        let mut granted = Vec::new();
        let mut revoked = Vec::new();
        let (mut index, mut term) = (0, 0);
        for entry in &entries {
            if entry.index != member.applied + 1 {
                return Err(format!(
                    "member {id} applies entry {} after {}",
                    entry.index, member.applied
                ));
            }
            member.applied = entry.index;
            index = entry.index;
            term = entry.term;
            // The same entry at the same index on every member.
            let seen = (entry.term, payload_hash(entry));
            match self.log.get(entry.index as usize - 1) {
                Some(first) if *first != seen => {
                    return Err(format!(
                        "member {id} applies entry {} of term {}, another member applied term {} there (or another payload)",
                        entry.index, entry.term, first.0
                    ));
                }
                Some(_) => {}
                None => {
                    self.log.push(seen);
                    self.eras.push(self.max_term.max(leading.1));
                }
            }
            if entry.index <= skip_below {
                continue;
            }
            if entry.get_entry_type() != EntryType::EntryNormal {
                return Err(format!(
                    "entry {} is a membership change: none is proposed",
                    entry.index
                ));
            }
            if entry.data.is_empty() {
                continue;
            }
            let request = InternalRaftRequest::decode(entry.data.as_ref())
                .map_err(|e| format!("decode entry: {e}"))?;
            let request_id = request.header.as_ref().map_or(request.id, |h| h.id);
            if let Some(grant) = &request.lease_grant {
                match batch.lease_grant(grant.id, grant.ttl) {
                    Ok(()) => granted.push(grant.id),
                    Err(etcdrs_mvcc::Error::LeaseExists(_)) => {}
                    Err(e) => return Err(format!("lease grant: {e}")),
                }
                continue;
            }
            if let Some(revoke) = &request.lease_revoke {
                match batch.lease_revoke(revoke.id) {
                    Ok(()) => revoked.push(revoke.id),
                    Err(etcdrs_mvcc::Error::LeaseNotFound(_)) => {}
                    Err(e) => return Err(format!("lease revoke: {e}")),
                }
                continue;
            }
            let mut txn = batch.txn();
            let mut succeeded = None;
            if let Some(request) = &request.txn {
                let held = cas_holds(&txn, request)?;
                let ops = if held {
                    &request.success
                } else {
                    &request.failure
                };
                for op in ops {
                    match &op.request {
                        Some(Request::RequestPut(put)) => {
                            txn.put(&put.key, &put.value, put.lease)
                                .map_err(|e| format!("txn put: {e}"))?;
                        }
                        _ => return Err("a txn op the clients never send".into()),
                    }
                }
                succeeded = Some(held);
            } else if let Some(put) = &request.put {
                match txn.put(&put.key, &put.value, put.lease) {
                    Ok(_) => {}
                    // etcd answers "requested lease not found"; nothing is written.
                    Err(etcdrs_mvcc::Error::LeaseNotFound(_)) => {}
                    Err(e) => return Err(format!("put: {e}")),
                }
            } else if let Some(delete) = &request.delete_range {
                txn.delete_range(KeyRange::new(&delete.key, &delete.range_end))
                    .map_err(|e| format!("delete: {e}"))?;
            } else {
                return Err(format!(
                    "entry {} holds no request the clients make",
                    entry.index
                ));
            }
            txn.end();
            results.push((request_id, succeeded));
        }
        if index > skip_below {
            batch
                .set_consistent_index(index, term)
                .map_err(|e| format!("consistent index: {e}"))?;
        }
        let durable = self.now >= member.last_durable + self.cfg.backend_batch_ms;
        batch.commit(durable).map_err(|e| format!("commit: {e}"))?;
        if durable {
            std::fs::copy(&member.db, &member.durable_db)
                .map_err(|e| format!("copy the durable backend: {e}"))?;
            member.last_durable = self.now;
        }
        // The server's applier: the leader's lessor becomes primary once it has applied an
        // entry of its own term, every lease restarting extended by the election timeout;
        // a member that lost leadership stops expiring leases.
        let lessor = kv.lessor();
        let vnow = self.base + Duration::from_millis(self.now);
        let (is_leader, leader_term) = leading;
        if is_leader && term == leader_term && !lessor.is_primary() {
            let election = Duration::from_millis(ELECTION_TICK as u64 * TICK_MS);
            lessor.promote(vnow, election);
            member.promoted_at = Some(self.now);
        } else if !is_leader && lessor.is_primary() {
            lessor.demote();
            member.promoted_at = None;
        }
        // A grant applied on a primary lessor starts its clock at the wall clock's now
        // (`WriteBatch::lease_grant` reads `Instant::now()` itself): restart it at the virtual
        // now, which is what the grant means. Virtual instants are behind the wall clock's,
        // so the grant is not yet expired and `renew` takes it.
        for id in granted {
            if lessor.is_primary() {
                lessor.renew(id, vnow);
            }
        }
        member.storage.applied.set((index, term));
        let revision = kv.current_rev();
        // A store whose image came from a snapshot past `index` is compared at its own index.
        let at_index = kv.consistent_index() == index;
        let hash = if at_index && index % HASH_EVERY == 0 {
            Some(kv.hash_kv(0).map_err(|e| format!("hash: {e}"))?.hash)
        } else {
            None
        };
        match self.revisions.get(&index) {
            _ if !at_index => {}
            Some(&first) if first != revision => {
                return Err(format!(
                    "member {id} is at revision {revision} after applying up to {index}, another member was at {first}"
                ));
            }
            Some(_) => {}
            None => {
                self.revisions.insert(index, revision);
            }
        }
        if let Some(hash) = hash {
            match self.hashes.get(&index) {
                Some(&first) if first != hash => {
                    return Err(format!(
                        "member {id} has HashKV {hash:08x} at applied index {index}, another member had {first:08x}"
                    ));
                }
                Some(_) => {}
                None => {
                    self.hashes.insert(index, hash);
                }
            }
        }
        self.note("apply", id, index, revision as u64);
        self.maybe_compact(i, index, durable)?;
        for lease in revoked {
            if self.leases.remove(&lease).is_some() {
                self.lease_revokes += 1;
                self.note("lease-revoked", id, lease as u64, 0);
            }
        }
        for (request_id, succeeded) in results {
            if let Some(op) = self.members[i].waiters.remove(&request_id) {
                let outcome = match succeeded {
                    Some(held) => Outcome::Cas(held),
                    None => Outcome::Written,
                };
                self.complete(op, outcome);
            }
        }
        Ok(())
    }

    /// Linearizable reads whose read index the apply has reached read the store.
    fn serve_reads(&mut self, i: usize) -> Step {
        let member = &mut self.members[i];
        if member.read_waits.is_empty() {
            return Ok(());
        }
        let applied = member.applied;
        let (ready, waiting): (Vec<_>, Vec<_>) = member
            .read_waits
            .drain(..)
            .partition(|(index, _)| *index <= applied);
        member.read_waits = waiting;
        for (_, op) in ready {
            let key = key_bytes(self.ops[op].op.key);
            let Some(kv) = self.members[i].kv.as_ref() else {
                return Err("read on a stopped member".into());
            };
            let result = kv
                .range(KeyRange::new(&key, &[]), RangeParams::default())
                .map_err(|e| format!("range: {e}"))?;
            let value = match result.kvs.first() {
                None => None,
                Some(kv) => Some(
                    std::str::from_utf8(&kv.value)
                        .ok()
                        .and_then(|v| v.parse::<u64>().ok())
                        .ok_or_else(|| format!("a value no client wrote: {:?}", kv.value))?,
                ),
            };
            self.complete(op, Outcome::Read(value));
        }
        Ok(())
    }

    // ---- invariants ----

    fn check_leaders(&mut self) -> Step {
        for member in &self.members {
            if let Some(node) = member.node.as_ref() {
                self.max_term = self.max_term.max(node.raft.term);
            }
        }
        for i in 0..self.members.len() {
            let Some(node) = self.members[i].node.as_ref() else {
                continue;
            };
            if node.raft.state != StateRole::Leader {
                continue;
            }
            let (id, term) = (node.raft.id, node.raft.term);
            match self.leaders.get(&term) {
                Some(&leader) if leader != id => {
                    return Err(format!("members {leader} and {id} both lead term {term}"));
                }
                Some(_) => {}
                None => {
                    // Leader completeness: every entry committed before its term is in its log.
                    for (at, (entry_term, _)) in self.log.iter().enumerate() {
                        let index = at as u64 + 1;
                        if self.eras[at] >= term {
                            continue;
                        }
                        // Compacted away: covered by the snapshot it holds.
                        if index < node.raft.raft_log.first_index() {
                            continue;
                        }
                        let held = node.raft.raft_log.term(index).unwrap_or(0);
                        if held != *entry_term {
                            return Err(format!(
                                "member {id} leads term {term} without entry {index} of term {entry_term} (holds term {held})"
                            ));
                        }
                    }
                    self.leaders.insert(term, id);
                    self.note("leader", id, term, 0);
                }
            }
        }
        Ok(())
    }

    fn leader(&self) -> Option<&RawNode<SimStorage>> {
        self.members
            .iter()
            .filter_map(|m| m.node.as_ref())
            .filter(|n| n.raft.state == StateRole::Leader)
            .max_by_key(|n| n.raft.term)
    }

    fn converged(&self) -> bool {
        if self.clients.iter().any(|c| c.busy.is_some()) {
            return false;
        }
        let Some(leader) = self.leader() else {
            return false;
        };
        let commit = leader.raft.raft_log.committed;
        commit == leader.raft.raft_log.last_index()
            && self
                .members
                .iter()
                .all(|m| m.node.is_some() && m.applied == commit)
    }

    fn convergence(&self) -> String {
        let members: Vec<String> = self
            .members
            .iter()
            .map(|m| match &m.node {
                None => format!("{}: down", m.id),
                Some(n) => format!(
                    "{}: {:?} term {} commit {} applied {}",
                    m.id, n.raft.state, n.raft.term, n.raft.raft_log.committed, m.applied
                ),
            })
            .collect();
        let busy = self.clients.iter().filter(|c| c.busy.is_some()).count();
        format!("{}; {busy} clients waiting", members.join(", "))
    }

    fn finish(&mut self) -> Step<Report> {
        let mut first: Option<(u64, i64, u32, u32)> = None;
        for member in &self.members {
            let Some(kv) = member.kv.as_ref() else {
                return Err(format!("member {} is down at the end", member.id));
            };
            let hash_kv = kv.hash_kv(0).map_err(|e| format!("hash: {e}"))?;
            let (hash, _) = kv.hash().map_err(|e| format!("hash: {e}"))?;
            let here = (member.applied, kv.current_rev(), hash_kv.hash, hash);
            match first {
                None => first = Some(here),
                Some(first) if first != here => {
                    return Err(format!(
                        "members diverge at the end: (applied, revision, HashKV, hash) {first:?} and {here:?} on member {}",
                        member.id
                    ));
                }
                Some(_) => {}
            }
        }
        let (applied, revision, hash_kv, _) = first.unwrap_or_default();
        self.note("end", applied, revision as u64, u64::from(hash_kv));
        let history: Vec<Operation> = self
            .ops
            .iter()
            .filter(|o| match o.state {
                OpState::Done => true,
                OpState::Open | OpState::Abandoned => !matches!(o.op.kind, Kind::Get(_)),
                OpState::Failed => false,
            })
            .map(|o| o.op.clone())
            .collect();
        let summary = Checker::default()
            .check(&history)
            .map_err(|violation| format!("the history is not linearizable: {violation}"))?;
        let term = self
            .members
            .iter()
            .filter_map(|m| m.node.as_ref())
            .map(|n| n.raft.term)
            .max()
            .unwrap_or(0);
        Ok(Report {
            seed: self.cfg.seed,
            trace_hash: self.trace.hasher.finish(),
            events: self.trace.events,
            history: history.len(),
            completed: history.iter().filter(|o| o.complete.is_some()).count(),
            unknown: history.iter().filter(|o| o.complete.is_none()).count(),
            cas: history.iter().fold((0, 0), |(yes, no), o| match o.kind {
                Kind::Cas {
                    succeeded: Some(true),
                    ..
                } => (yes + 1, no),
                Kind::Cas {
                    succeeded: Some(false),
                    ..
                } => (yes, no + 1),
                _ => (yes, no),
            }),
            applied,
            revision,
            term,
            crashes: self.crashes,
            partitions: self.partitions,
            pauses: self.pauses,
            transfers: self.transfers,
            simulated_ms: self.now,
            checker_states: summary.states,
            checker_gave_up: summary.gave_up.len(),
            leases: self.next_lease - 1,
            lease_revokes: self.lease_revokes,
            replayed: self.replayed,
            snapshots: self.snapshots,
        })
    }

    // ---- leases ----

    fn vnow(&self) -> Instant {
        self.base + Duration::from_millis(self.now)
    }

    /// The server's lease-expiry loop on member `i`: on the leader, expired leases are
    /// revoked through raft. Checks first that each has outlived its TTL since its grant and
    /// every renewal this leader knew of (those made on it, and any made anywhere before it
    /// took over: renewals are the leader's own, so one made on another member meanwhile is
    /// not its to honour, as in etcd).
    fn expire_leases(&mut self, i: usize) -> Step {
        let vnow = self.vnow() + Duration::from_millis(self.cfg.lease_clock_ahead_ms);
        let member = &self.members[i];
        let (Some(node), Some(kv)) = (member.node.as_ref(), member.kv.as_ref()) else {
            return Ok(());
        };
        if node.raft.state != StateRole::Leader {
            return Ok(());
        }
        let expired = kv.lessor().expired(vnow, 500);
        if expired.is_empty() {
            return Ok(());
        }
        let Some(promoted) = member.promoted_at else {
            return Err(format!(
                "member {} expires leases without having been promoted",
                member.id
            ));
        };
        for id in expired {
            let Some(log) = self.leases.get(&id) else {
                continue;
            };
            let known = log
                .renewals
                .iter()
                .filter(|(at, on)| *at <= promoted || *on == i)
                .map(|(at, _)| *at)
                .max()
                .unwrap_or(0)
                .max(log.granted_at);
            let due = known + log.ttl as u64 * 1000;
            if self.now < due {
                return Err(format!(
                    "member {} expires lease {id} (TTL {} s) at {} ms, before {due} ms: granted at {}, renewed at {:?}, promoted at {promoted}",
                    self.members[i].id, log.ttl, self.now, log.granted_at, log.renewals
                ));
            }
            let request = InternalRaftRequest {
                header: Some(RequestHeader {
                    id: self.next_request,
                    ..RequestHeader::default()
                }),
                lease_revoke: Some(LeaseRevokeRequest { id }),
                ..InternalRaftRequest::default()
            };
            self.next_request += 1;
            if let Some(node) = self.members[i].node.as_mut() {
                let _ = node.propose(Vec::new(), request.encode_to_vec());
            }
            let member_id = self.members[i].id;
            self.note("lease-expire", member_id, id as u64, 0);
        }
        Ok(())
    }

    /// A client grants a lease with a key on it, or renews one at the member it takes for
    /// the leader; neither waits, and neither enters the checked history.
    fn lease_action(&mut self, i: usize) {
        let renewable: Vec<i64> = self.leases.keys().copied().collect();
        if renewable.is_empty() || self.rng.random_bool(0.3) {
            let id = self.next_lease;
            self.next_lease += 1;
            let ttl = self.rng.random_range(1..=2);
            let grant = InternalRaftRequest {
                header: Some(RequestHeader {
                    id: self.next_request,
                    ..RequestHeader::default()
                }),
                lease_grant: Some(LeaseGrantRequest { ttl, id }),
                ..InternalRaftRequest::default()
            };
            let put = InternalRaftRequest {
                header: Some(RequestHeader {
                    id: self.next_request + 1,
                    ..RequestHeader::default()
                }),
                put: Some(PutRequest {
                    key: format!("lease-{id}").into_bytes(),
                    value: b"held".to_vec(),
                    lease: id,
                    ..PutRequest::default()
                }),
                ..InternalRaftRequest::default()
            };
            self.next_request += 2;
            let Some(node) = self.members[i].node.as_mut() else {
                return;
            };
            if node.propose(Vec::new(), grant.encode_to_vec()).is_ok() {
                let _ = node.propose(Vec::new(), put.encode_to_vec());
                self.leases.insert(
                    id,
                    LeaseLog {
                        ttl,
                        granted_at: self.now,
                        renewals: Vec::new(),
                    },
                );
                self.note("lease-grant", i as u64 + 1, id as u64, ttl as u64);
            }
            return;
        }
        let id = renewable[self.rng.random_range(0..renewable.len())];
        // A follower forwards a keep-alive to its leader; the renewal happens there.
        let leader = self.members[i]
            .node
            .as_ref()
            .map(|n| n.raft.leader_id)
            .unwrap_or(raft::INVALID_ID);
        let Some(at) = (leader as usize).checked_sub(1) else {
            return;
        };
        if at >= self.members.len() || self.members[at].paused_until > self.now {
            return;
        }
        let vnow = self.vnow();
        let Some(kv) = self.members[at].kv.as_ref() else {
            return;
        };
        if let Renewal::Renewed(_) = kv.lessor().renew(id, vnow) {
            if let Some(log) = self.leases.get_mut(&id) {
                log.renewals.push((self.now, at));
            }
            self.note("lease-renew", leader, id as u64, 0);
        }
    }

    // ---- clients ----

    fn client_wakes(&mut self, client: usize, generation: u64) -> Step {
        if self.clients[client].generation != generation {
            return Ok(());
        }
        if let Some(op) = self.clients[client].busy.take() {
            // Its deadline passed: the client gives up; a write's outcome stays unknown.
            if self.ops[op].state == OpState::Open {
                self.ops[op].state = OpState::Abandoned;
                self.note("give-up", client as u64, op as u64, 0);
            }
        }
        if self.faults {
            self.invoke(client)?;
        }
        Ok(())
    }

    fn take_value(&mut self) -> u64 {
        self.next_value += 1;
        self.next_value - 1
    }

    fn invoke(&mut self, client: usize) -> Step {
        // A stalled member takes no new requests (its clients time out on it instead).
        let up: Vec<usize> = (0..self.members.len())
            .filter(|&i| self.members[i].node.is_some() && self.members[i].paused_until <= self.now)
            .collect();
        self.clients[client].generation += 1;
        let generation = self.clients[client].generation;
        if up.is_empty() {
            self.schedule(10, Event::Client { client, generation });
            return Ok(());
        }
        let i = up[self.rng.random_range(0..up.len())];
        if self.rng.random_range(0..8) == 0 {
            self.lease_action(i);
        }
        let key = self.rng.random_range(0..self.cfg.keys);
        let roll = self.rng.random_range(0..10);
        let kind = match roll {
            0..3 => Kind::Put(self.take_value()),
            3 => Kind::Delete,
            4 => Kind::Cas {
                // Often the value last written there, so that some succeed.
                expect: if self.rng.random_bool(0.8) {
                    self.last_put.get(&key).copied().flatten()
                } else {
                    None
                },
                new: self.take_value(),
                succeeded: None,
            },
            _ => Kind::Get(None),
        };
        match kind {
            Kind::Put(value) => {
                self.last_put.insert(key, Some(value));
            }
            Kind::Delete => {
                self.last_put.insert(key, None);
            }
            _ => {}
        }
        self.clock += 1;
        let op = self.ops.len();
        self.ops.push(SimOp {
            op: Operation {
                client: client as u64,
                key,
                kind,
                invoke: self.clock,
                complete: None,
            },
            state: OpState::Open,
        });
        self.clients[client].busy = Some(op);
        let member = &mut self.members[i];
        let Some(node) = member.node.as_mut() else {
            return Err("invoke on a stopped member".into());
        };
        let accepted = match kind {
            Kind::Put(_) | Kind::Delete | Kind::Cas { .. } => {
                let request_id = self.next_request;
                self.next_request += 1;
                let mut request = InternalRaftRequest {
                    header: Some(RequestHeader {
                        id: request_id,
                        ..RequestHeader::default()
                    }),
                    ..InternalRaftRequest::default()
                };
                match kind {
                    Kind::Put(value) => {
                        request.put = Some(PutRequest {
                            key: key_bytes(key),
                            value: value.to_string().into_bytes(),
                            ..PutRequest::default()
                        })
                    }
                    Kind::Cas { expect, new, .. } => {
                        request.txn = Some(cas_request(key, expect, new))
                    }
                    _ => {
                        request.delete_range = Some(DeleteRangeRequest {
                            key: key_bytes(key),
                            ..DeleteRangeRequest::default()
                        })
                    }
                }
                let accepted = node.propose(Vec::new(), request.encode_to_vec()).is_ok();
                if accepted {
                    member.waiters.insert(request_id, op);
                }
                accepted
            }
            Kind::Get(_) => {
                if self.cfg.local_reads {
                    member.read_waits.push((0, op));
                    true
                } else if node.raft.leader_id == raft::INVALID_ID {
                    // As `raftnode`: without a leader the read is refused at once.
                    false
                } else {
                    let ctx = op as u64;
                    node.read_index(ctx.to_be_bytes().to_vec());
                    member.reads.insert(ctx, op);
                    true
                }
            }
        };
        let id = member.id;
        self.note("invoke", client as u64, op as u64, id);
        self.serve_reads(i)?;
        if accepted {
            self.schedule(CLIENT_TIMEOUT_MS, Event::Client { client, generation });
        } else {
            // Refused before it reached the log: it did not happen.
            self.ops[op].state = OpState::Failed;
            self.clients[client].busy = None;
            let after = self.rng.random_range(1..=20);
            self.schedule(after, Event::Client { client, generation });
        }
        Ok(())
    }

    /// Operation `op` completes now, with its outcome.
    fn complete(&mut self, op: usize, outcome: Outcome) {
        if self.ops[op].state != OpState::Open {
            return;
        }
        self.clock += 1;
        let entry = &mut self.ops[op];
        entry.state = OpState::Done;
        entry.op.complete = Some(self.clock);
        let value = match (outcome, &mut entry.op.kind) {
            (Outcome::Read(seen), kind) => {
                *kind = Kind::Get(seen);
                seen.unwrap_or(0)
            }
            (Outcome::Cas(held), Kind::Cas { succeeded, .. }) => {
                *succeeded = Some(held);
                u64::from(held)
            }
            _ => 0,
        };
        let client = entry.op.client as usize;
        self.note("complete", client as u64, op as u64, value);
        if self.clients[client].busy == Some(op) {
            self.clients[client].busy = None;
            self.clients[client].generation += 1;
            let generation = self.clients[client].generation;
            let after = self.rng.random_range(0..=10);
            self.schedule(after, Event::Client { client, generation });
        }
    }
}
