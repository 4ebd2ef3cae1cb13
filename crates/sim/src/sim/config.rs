//! What one run simulates ([`Config`], picked from the seed) and what it reports
//! ([`Report`]): the seed's choices of cluster, faults and workload, and the run's figures.

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use super::{AuthStats, LeaseStats, WatchFault, WatchStats};

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
    /// Whether the leader changes the membership at run time (etcd's MemberAdd --learner,
    /// MemberPromote, MemberRemove, and MemberAdd of a voter directly), five-member clusters
    /// only: at most one member added and two members removed.
    pub membership_changes: bool,
    /// Whether the members' disks take their time: each WAL batch is written a few ms after
    /// raft hands it over (raft goes on meanwhile, as with the `wal-sync` thread), and while
    /// faults happen a member's disk stalls now and then for 1.5-10 election timeouts; a
    /// crash loses the batch not yet written.
    pub slow_disks: bool,
    /// Whether clients watch members (checked against the watch guarantees), ask for
    /// compactions and read past revisions.
    pub watches: bool,
    /// A planted bug in the watchers' delivery path (none by default), for tests that the
    /// watch checks catch one.
    pub watch_fault: Option<WatchFault>,
    /// Lease checkpoints (etcd's `--experimental-enable-lease-checkpoint`): the leader
    /// checkpoints every lease's remaining TTL through raft this often, virtual ms (`None`:
    /// off).
    pub lease_checkpoint_ms: Option<u64>,
    /// Checkpoints are kept in the backend too (etcd 3.6's
    /// `--experimental-enable-lease-checkpoint-persist`), so a restart keeps them.
    pub lease_checkpoint_persist: bool,
    /// A new leader restarts every lease from its full TTL, as if no checkpoint stood: a
    /// planted bug, for tests that the lease checks catch one.
    pub ignore_lease_checkpoints: bool,
    /// A keep-alive on a lessor holding a checkpointed remainder does not clear it through
    /// raft (the server's `clear_lease_checkpoint` left out), so a later leader restarts the
    /// lease from the stale
    /// remainder: a planted bug, for tests that the revocation check catches one.
    pub renewal_keeps_checkpoint: bool,
    /// Whether auth is set up and the clients' permission revoked and granted again as they
    /// run.
    pub auth: bool,
    /// Reads are served without the member's permission check: a planted bug, for tests that
    /// the auth check catches a read allowed after its permission was revoked.
    pub read_after_revoke: bool,
    /// Whether the members' backends flush in the background, as a member's do (its
    /// `backend commit` task): a batch's commit only publishes it in memory, and a flush every
    /// [`super::FLUSH_POLL_MS`] writes what is due to the file durably (none while its disk
    /// stalls or its process is paused). Otherwise the batch that finds a flush due makes it.
    pub background_flush: bool,
}

impl Config {
    /// A configuration drawn from `seed`.
    pub fn from_seed(seed: u64) -> Config {
        let mut rng = StdRng::seed_from_u64(seed ^ 0x9e37_79b9_7f4a_7c15);
        // Drawn apart, so that the draws below are what they were before membership changes came.
        let membership_changes =
            StdRng::seed_from_u64(seed ^ 0x5eed_4e40_7e00_0001).random_bool(0.5);
        let slow_disks = StdRng::seed_from_u64(seed ^ 0x5eed_d15c_0041_0001).random_bool(0.5);
        let watches = StdRng::seed_from_u64(seed ^ 0x5eed_3a7c_0041_0002).random_bool(0.75);
        let auth = StdRng::seed_from_u64(seed ^ 0x5eed_a074_0041_0003).random_bool(0.5);
        let mut checkpoints = StdRng::seed_from_u64(seed ^ 0x5eed_1ea5_0041_0004);
        let lease_checkpoint_ms = checkpoints
            .random_bool(0.5)
            .then(|| checkpoints.random_range(200..=800));
        let lease_checkpoint_persist = checkpoints.random_bool(0.5);
        let background_flush = StdRng::seed_from_u64(seed ^ 0x5eed_f1a5_0041_0005).random_bool(0.5);
        let members = [3, 3, 5][rng.random_range(0..3)];
        Config {
            seed,
            members,
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
            membership_changes: membership_changes && members == 5,
            slow_disks,
            watches,
            watch_fault: None,
            lease_checkpoint_ms,
            lease_checkpoint_persist: lease_checkpoint_persist && lease_checkpoint_ms.is_some(),
            ignore_lease_checkpoints: false,
            renewal_keeps_checkpoint: false,
            auth,
            read_after_revoke: false,
            background_flush,
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
    /// Disk stalls (a member's WAL writes held for 1.5-10 election timeouts).
    pub disk_stalls: u32,
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
    /// Leaders first seen leading a term below the highest any member had reached: raft allows
    /// them (votes delivered late), and leader completeness does not cover them.
    pub late_leaders: u32,
    /// Members removed at run time.
    pub removed: u32,
    /// Members added at run time (learners and voters), and of the learners those promoted.
    pub added: (u32, u32),
    /// Of the members added, those added as voters directly.
    pub added_voters: u32,
    /// What the watchers, compactions and reads of history did.
    pub watches: WatchStats,
    /// What auth did.
    pub auth: AuthStats,
    /// What the lease checks saw of checkpoints and leader changes.
    pub lease_checks: LeaseStats,
}
