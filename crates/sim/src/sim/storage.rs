//! What the simulator puts where a member has a disk, a clock and a network: the raft log's
//! store (memory that survives a crash, as the fsynced WAL does), the virtual clock the
//! backend and the lessor read, the transport that collects a member's outgoing messages, and
//! a recorder around the server's state machine that reports what each batch did for the
//! invariants.

use super::*;

/// The raft log as the WAL holds it: every entry after the last snapshot mark and the last
/// hard state. It outlives the member's process; a restart reads it back.
#[derive(Clone, Default)]
pub(super) struct SimLog {
    pub(super) state: Arc<Mutex<Recovered>>,
    observed: Observations,
}

impl SimLog {
    pub(super) fn new(observed: Observations) -> SimLog {
        SimLog {
            state: Arc::default(),
            observed,
        }
    }

    /// What a restart reads: `None` while nothing was ever written (a new member).
    pub(super) fn recovered(&self) -> Option<Recovered> {
        let state = lock(&self.state);
        let empty = state.entries.is_empty()
            && state.snapshot == (0, 0)
            && state.hard_state == HardState::default();
        (!empty).then(|| state.clone())
    }
}

impl LogStore for SimLog {
    fn save(
        &mut self,
        hard_state: Option<&HardState>,
        entries: &[Entry],
    ) -> etcdrs_raftnode::Result<()> {
        let mut state = lock(&self.state);
        if let Some(first) = entries.first() {
            // As the WAL replays: a later entry replaces the one at its index and every one
            // after it.
            state.entries.retain(|e| e.index < first.index);
            state.entries.extend_from_slice(entries);
        }
        if let Some(hard_state) = hard_state {
            state.hard_state = hard_state.clone();
        }
        Ok(())
    }

    fn mark_snapshot(&mut self, index: u64, term: u64) -> etcdrs_raftnode::Result<()> {
        let mut state = lock(&self.state);
        state.snapshot = (index, term);
        // A restart reads only what follows the last mark.
        state.entries.retain(|e| e.index > index);
        Ok(())
    }

    fn release_to(&mut self, index: u64) -> etcdrs_raftnode::Result<()> {
        lock(&self.observed).push(Observed::Released { index });
        Ok(())
    }
}

/// The simulation's clock: virtual milliseconds after a base instant.
pub(super) struct VirtualClock {
    pub(super) base: Instant,
    pub(super) now_ms: Arc<AtomicU64>,
}

impl Clock for VirtualClock {
    fn now(&self) -> Instant {
        self.base + Duration::from_millis(self.now_ms.load(AtomicOrdering::Relaxed))
    }
}

/// A member's outgoing raft messages, collected for the simulated network.
#[derive(Clone, Default)]
pub(super) struct Outbox(pub(super) Arc<Mutex<Vec<Message>>>);

impl Transport for Outbox {
    fn send(&self, messages: Vec<Message>) {
        lock(&self.0).extend(messages);
    }
}

/// A `LeaseCheckpoint` entry: its index, its request id, and its (lease, remaining TTL) pairs.
pub(super) type Checkpointed = (u64, u64, Vec<(i64, i64)>);

/// What a member's state machine and log reported, in order, since the simulator last looked.
pub(super) type Observations = Arc<Mutex<Vec<Observed>>>;

pub(super) enum Observed {
    /// A batch applied.
    Applied {
        /// (index, term, payload hash) of each entry handed over.
        entries: Vec<(u64, u64, u64)>,
        /// raft's term as the batch was handed over.
        raft_term: u64,
        /// The last entry's index.
        index: u64,
        /// The store's revision after it.
        revision: i64,
        /// Whether the store's consistent index is `index` (not ahead of it, from a snapshot).
        at_index: bool,
        /// `HashKV` after it, when sampled.
        hash: Option<u32>,
        /// Whether the backend's commit was durable.
        durable: bool,
        /// Leases the batch revoked.
        revoked: Vec<i64>,
        /// Whether the lessor is primary after it.
        primary: bool,
        /// The events of the revisions it made (when the run records them).
        events: Vec<etcdrs_proto::mvccpb::Event>,
        /// The store's compacted revision after it.
        compact_rev: i64,
        /// The lease checkpoints among its entries: index, request id, and (lease, remaining
        /// TTL) of each.
        checkpoints: Vec<Checkpointed>,
        /// The clients' user's writes in it, by request id: whether their permission held
        /// (`None`: the batch changed it).
        auth_verdicts: Vec<(u64, Option<bool>)>,
    },
    /// A leader's snapshot installed: its index, and the consistent index of the image.
    Restored { index: u64, consistent: u64 },
    /// The log released entries up to `index` (compaction after a durable commit).
    Released { index: u64 },
}

pub(super) fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|e| e.into_inner())
}

/// The server's applier, and around it what the invariants need: each batch's entries and
/// the store after it; the durable backend copy a power cut restores, taken at each durable
/// commit (the image as of the disk).
pub(super) struct Recorder {
    pub(super) machine: Box<dyn StateMachine>,
    pub(super) store: Arc<KvStore>,
    pub(super) observed: Observations,
    pub(super) db: PathBuf,
    pub(super) durable_db: PathBuf,
    /// Whether to read back the events of each batch's revisions (for the watch checks).
    pub(super) record_events: bool,
    /// Under auth: whether a user may write a key, as the applied auth state stands.
    pub(super) auth_probe: Option<AuthProbe>,
}

/// [`StandaloneMember::auth_probe`].
pub(super) type AuthProbe = Box<dyn Fn(&str, &[u8], bool) -> bool + Send + Sync>;

impl Recorder {
    fn save_durable(&self) -> Result<(), String> {
        std::fs::copy(&self.db, &self.durable_db)
            .map(|_| ())
            .map_err(|e| format!("copy the durable backend: {e}"))
    }
}

impl StateMachine for Recorder {
    fn apply(&mut self, batch: Apply) -> Result<Applied, String> {
        let entries: Vec<(u64, u64, u64)> = batch
            .entries
            .iter()
            .map(|e| (e.index, e.term, payload_hash(e)))
            .collect();
        let lessor = self.store.lessor();
        let revoking: Vec<i64> = batch
            .entries
            .iter()
            .filter(|e| e.get_entry_type() == EntryType::EntryNormal && !e.data.is_empty())
            .filter_map(|e| InternalRaftRequest::decode(e.data.as_ref()).ok())
            .filter_map(|r| r.lease_revoke.map(|revoke| revoke.id))
            .filter(|id| lessor.contains(*id))
            .collect();
        let checkpoints: Vec<Checkpointed> = batch
            .entries
            .iter()
            .filter(|e| e.get_entry_type() == EntryType::EntryNormal && !e.data.is_empty())
            .filter_map(|e| Some((e.index, InternalRaftRequest::decode(e.data.as_ref()).ok()?)))
            .filter_map(|(index, r)| {
                let request = r.lease_checkpoint?;
                let id = r.header.map_or(0, |h| h.id);
                let pairs = request
                    .checkpoints
                    .iter()
                    .map(|c| (c.id, c.remaining_ttl))
                    .collect();
                Some((index, id, pairs))
            })
            .collect();
        let raft_term = batch.raft.term;
        let before = self.store.current_rev();
        let permitted = |probe: &AuthProbe| probe(super::auth::CLIENT_USER, &key_bytes(0), true);
        let permitted_before = self.auth_probe.as_ref().map(permitted);
        // The clients' user's writes, by request id.
        let writes: Vec<u64> = if self.auth_probe.is_some() {
            batch
                .entries
                .iter()
                .filter(|e| e.get_entry_type() == EntryType::EntryNormal && !e.data.is_empty())
                .filter_map(|e| InternalRaftRequest::decode(e.data.as_ref()).ok())
                .filter(|r| r.put.is_some() || r.delete_range.is_some() || r.txn.is_some())
                .filter_map(|r| r.header)
                .filter(|h| h.username == super::auth::CLIENT_USER)
                .map(|h| h.id)
                .collect()
        } else {
            Vec::new()
        };
        let applied = self.machine.apply(batch)?;
        if applied.durable.is_some() {
            self.save_durable()?;
        }
        let store = &self.store;
        let index = applied.index;
        let at_index = store.consistent_index() == index;
        // Not while a compaction is being carried out: `HashKV` counts the revisions at or
        // below the compacted revision that the compaction will delete when no key is alive
        // there (etcd's `len(keep) > 0` rule), so a member midway hashes otherwise than one
        // done.
        let hash = if at_index && index % HASH_EVERY == 0 && !store.compaction_pending() {
            Some(store.hash_kv(0).map_err(|e| format!("hash: {e}"))?.hash)
        } else {
            None
        };
        let revoked = revoking
            .into_iter()
            .filter(|id| !lessor.contains(*id))
            .collect();
        let permitted_after = self.auth_probe.as_ref().map(permitted);
        let verdict = (permitted_before == permitted_after)
            .then_some(permitted_after)
            .flatten();
        let auth_verdicts = writes.into_iter().map(|id| (id, verdict)).collect();
        let revision = store.current_rev();
        // Read before any compaction step can run: the batch's revisions are all there.
        let events = if self.record_events && revision > before {
            store
                .events_between(before + 1, revision)
                .map_err(|e| format!("read the batch's events: {e}"))?
        } else {
            Vec::new()
        };
        lock(&self.observed).push(Observed::Applied {
            entries,
            raft_term,
            index,
            revision,
            at_index,
            hash,
            durable: applied.durable.is_some(),
            revoked,
            primary: lessor.is_primary(),
            events,
            compact_rev: store.compact_rev(),
            auth_verdicts,
            checkpoints,
        });
        Ok(applied)
    }

    fn conf_change_allowed(&mut self, index: u64, change: &EtcdConfChange) -> bool {
        self.machine.conf_change_allowed(index, change)
    }

    fn restore(
        &mut self,
        index: u64,
        term: u64,
        conf_state: &ConfState,
        data: &[u8],
    ) -> Result<(), String> {
        self.machine.restore(index, term, conf_state, data)?;
        // The install commits durably.
        self.save_durable()?;
        lock(&self.observed).push(Observed::Restored {
            index,
            consistent: self.store.consistent_index(),
        });
        Ok(())
    }
}
