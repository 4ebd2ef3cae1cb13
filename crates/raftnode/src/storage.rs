//! The raft log's storage: raft-rs's in-memory log, which answers raft (`NodeStorage`), and
//! the WAL under it, to which the `Ready`s' entries and hard state are persisted with one
//! fsync per batch (`crate::wal_sync`; raft counts them persisted only then), plus snapshot
//! marks and the log import and export the server's conversion and tests use. Entries are stored as their `eraftpb` encoding: the
//! WAL knows nothing of raft types.

use std::path::Path;
use std::sync::Arc;

use etcdrs_wal::{EntryPayload, EntryRecord, HardState as WalHardState, SnapshotMark, Wal};
use protobuf::Message as _;
use raft::eraftpb::{ConfState, Entry, HardState};
use raft::storage::MemStorage;

use crate::error::{Error, Result};
use crate::metrics;

/// raft-rs' in-memory log, whose snapshots stand for the state machine's last applied entry:
/// a snapshot sent to a follower is the state machine's image taken after that entry, so the
/// image is never older than the snapshot's index (the follower skips what it already holds).
/// Public only as the storage type of [`crate::Node::raw`]'s raft node.
#[derive(Clone)]
pub struct NodeStorage {
    pub(crate) mem: MemStorage,
    /// (index, term) of the last entry the state machine applied.
    pub(crate) applied: Arc<parking_lot::Mutex<(u64, u64)>>,
    /// The membership raft is using (raft-rs leaves keeping it to the application).
    pub(crate) conf_state: Arc<parking_lot::Mutex<ConfState>>,
}

impl raft::Storage for NodeStorage {
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
        let (index, term) = *self.applied.lock();
        if index == 0 || index < request_index {
            return Err(raft::Error::Store(
                raft::StorageError::SnapshotTemporarilyUnavailable,
            ));
        }
        let mut snapshot = raft::eraftpb::Snapshot::default();
        let meta = snapshot.mut_metadata();
        meta.index = index;
        meta.term = term;
        meta.set_conf_state(self.conf_state.lock().clone());
        Ok(snapshot)
    }
}

/// Write a new WAL in `wal_dir` for a raft log that comes from elsewhere (an etcd member's,
/// translated into our entries, by the server's data-directory conversion): `metadata` (node
/// and cluster id, opaque here), a snapshot mark at `snapshot` (index, term) when past 0, then
/// `entries` (all after the mark) and `hard_state`, with one fsync. A member then starts from
/// it with [`Start::Restart`], as from its own log.
pub fn write_imported_log(
    wal_dir: &Path,
    metadata: &[u8],
    snapshot: (u64, u64),
    hard_state: &HardState,
    entries: &[Entry],
) -> Result<()> {
    if let Some(entry) = entries.first()
        && entry.index != snapshot.0 + 1
    {
        return Err(Error::Corrupt(format!(
            "imported log starts at index {} after a snapshot at {}",
            entry.index, snapshot.0
        )));
    }
    let mut wal = Wal::create(wal_dir, metadata)?;
    if snapshot.0 > 0 {
        wal.save_snapshot_mark(SnapshotMark {
            index: snapshot.0,
            term: snapshot.1,
        })?;
    }
    let records = wal_entries(entries);
    let hard_state = WalHardState {
        term: hard_state.term,
        vote: hard_state.vote,
        commit: hard_state.commit,
    };
    wal.save(Some(hard_state), &records)?;
    Ok(())
}

/// Every entry of the WAL in `wal_dir` after its last snapshot mark, as raft entries: a stopped
/// member's log, for tools and tests that look at what a member wrote.
pub fn read_log(wal_dir: &Path) -> Result<Vec<Entry>> {
    let (_, state) = Wal::open(wal_dir)?;
    state.entries.iter().map(decode_entry).collect()
}

/// A raft entry as the WAL stores it: its `eraftpb` encoding, written straight into the WAL's
/// write buffer ([`etcdrs_wal::EntryPayload`]).
pub(crate) struct WalEntry<'a>(&'a Entry);

/// `entries` as the WAL saves them.
pub(crate) fn wal_entries(entries: &[Entry]) -> Vec<WalEntry<'_>> {
    entries.iter().map(WalEntry).collect()
}

impl EntryPayload for WalEntry<'_> {
    fn index(&self) -> u64 {
        self.0.index
    }

    fn term(&self) -> u64 {
        self.0.term
    }

    fn payload_len(&self) -> usize {
        self.0.compute_size() as usize
    }

    fn write_payload(&self, buf: &mut Vec<u8>) -> std::result::Result<(), String> {
        self.0.write_to_vec(buf).map_err(|e| e.to_string())
    }
}

pub(crate) fn decode_entry(record: &EntryRecord) -> Result<Entry> {
    let mut entry = Entry::default();
    entry
        .merge_from_bytes(&record.data)
        .map_err(|e| Error::Corrupt(e.to_string()))?;
    Ok(entry)
}

/// Where the raft log is made durable: the WAL in a member ([`Wal`]), memory that survives a
/// simulated crash in the deterministic simulator. The node calls it in raft's order, from one
/// thread at a time (the `wal-sync` thread in a member); what `save` returns from is durable.
pub trait LogStore: Send + 'static {
    /// Append `entries` (each replacing the entry at its index and everything after it) and
    /// then record `hard_state`, durably (one fsync for both).
    fn save(&mut self, hard_state: Option<&HardState>, entries: &[Entry]) -> Result<()>;
    /// Record a snapshot at (`index`, `term`): a restart reads the log from after it.
    fn mark_snapshot(&mut self, index: u64, term: u64) -> Result<()>;
    /// Entries up to `index` are no longer needed (the state machine holds them durably).
    fn release_to(&mut self, index: u64) -> Result<()>;
}

/// A log as its store held it when it was opened: what a restart starts from.
#[derive(Clone, Debug, Default)]
pub struct Recovered {
    /// The last snapshot mark: (index, term), (0, 0) for none.
    pub snapshot: (u64, u64),
    /// The last hard state recorded.
    pub hard_state: HardState,
    /// Every entry after the snapshot mark, in index order.
    pub entries: Vec<Entry>,
}

impl Recovered {
    /// What the WAL replayed, as raft types.
    pub(crate) fn from_wal(state: &etcdrs_wal::WalState) -> Result<Recovered> {
        Ok(Recovered {
            snapshot: (state.snapshot.index, state.snapshot.term),
            hard_state: HardState {
                term: state.hard_state.term,
                vote: state.hard_state.vote,
                commit: state.hard_state.commit,
                ..Default::default()
            },
            entries: state
                .entries
                .iter()
                .map(decode_entry)
                .collect::<Result<Vec<_>>>()?,
        })
    }
}

impl LogStore for Wal {
    fn save(&mut self, hard_state: Option<&HardState>, entries: &[Entry]) -> Result<()> {
        let records = wal_entries(entries);
        let wal_hard_state = hard_state.map(|hs| WalHardState {
            term: hs.term,
            vote: hs.vote,
            commit: hs.commit,
        });
        let before = self.write_stats();
        Wal::save(self, wal_hard_state, &records)?;
        let after = self.write_stats();
        if after.bytes_written > before.bytes_written {
            metrics::WAL_WRITE_BYTES.add((after.bytes_written - before.bytes_written) as f64);
            metrics::WAL_WRITE_SECONDS.observe(after.last_write.as_secs_f64());
            // As etcd: without an fsync there is no fsync duration to record.
            if after.syncs > before.syncs {
                metrics::WAL_FSYNC_SECONDS.observe(after.last_sync.as_secs_f64());
            }
        }
        Ok(())
    }

    fn mark_snapshot(&mut self, index: u64, term: u64) -> Result<()> {
        save_snapshot_mark(self, SnapshotMark { index, term })
    }

    fn release_to(&mut self, index: u64) -> Result<()> {
        Ok(Wal::release_to(self, index)?)
    }
}

/// Persist entries and hard state to `log`, then to raft's in-memory log: the start's own
/// entries (a new cluster's members, `--force-new-cluster`'s removals), durable before raft
/// starts. The `Ready`s' go through `crate::wal_sync`.
pub(crate) fn persist(
    log: &mut dyn LogStore,
    storage: &MemStorage,
    hard_state: Option<&HardState>,
    entries: &[Entry],
) -> Result<()> {
    log.save(hard_state, entries)?;
    let mut core = storage.wl();
    if !entries.is_empty() {
        core.append(entries)?;
    }
    if let Some(hs) = hard_state {
        core.set_hardstate(hs.clone());
    }
    Ok(())
}

/// Record a snapshot in the WAL: our counterpart of etcd's `.snap` file save (the mark is
/// what etcd's snapshot file holds besides the conf state), timed as etcd times that save.
fn save_snapshot_mark(wal: &mut Wal, mark: SnapshotMark) -> Result<()> {
    let started = std::time::Instant::now();
    wal.save_snapshot_mark(mark)?;
    metrics::SNAP_SAVE_SECONDS.observe(started.elapsed().as_secs_f64());
    if !wal.options().unsafe_no_fsync {
        metrics::SNAP_FSYNC_SECONDS.observe(wal.write_stats().last_sync.as_secs_f64());
    }
    // The mark is a fixed-size record: encoding it is the whole of the marshalling cost.
    metrics::SNAP_MARSHALLING_SECONDS.observe(wal.write_stats().last_write.as_secs_f64());
    Ok(())
}
