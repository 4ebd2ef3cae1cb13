//! Plain data the WAL stores and returns. None of it knows raft: an entry is an index,
//! a term and opaque bytes that the raftnode crate encodes and decodes.

/// Raft's persistent vote state (raft `HardState`). The last one written wins on replay.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct HardState {
    /// Current term.
    pub term: u64,
    /// Candidate voted for in `term` (0 = none).
    pub vote: u64,
    /// Highest index known to be committed.
    pub commit: u64,
}

/// One raft log entry as the WAL sees it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EntryRecord {
    /// Raft log index.
    pub index: u64,
    /// Term of the entry.
    pub term: u64,
    /// The encoded raft entry; opaque to the WAL.
    pub data: Vec<u8>,
}

/// Records that a snapshot covering the log up to `index` (at `term`) exists, so entries
/// with `index <= mark.index` are not needed on replay (etcd `walpb.Snapshot`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SnapshotMark {
    /// Last index included in the snapshot.
    pub index: u64,
    /// Term of that index.
    pub term: u64,
}

/// Everything `Wal::open` recovered: restore raft from this.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct WalState {
    /// The opaque metadata given to `Wal::create`.
    pub metadata: Vec<u8>,
    /// The last hard state written (default if none was saved).
    pub hard_state: HardState,
    /// The latest snapshot mark (default if none was saved).
    pub snapshot: SnapshotMark,
    /// Entries with `index > snapshot.index`, contiguous and in index order.
    pub entries: Vec<EntryRecord>,
}
