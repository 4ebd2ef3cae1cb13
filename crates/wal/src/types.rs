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

/// An entry as [`Wal::save`](crate::Wal::save) writes it: its place in the log and a payload
/// that encodes itself straight into the WAL's write buffer. The raftnode crate saves raft's
/// entries through it without first encoding each into a buffer of its own: with large values
/// that copy was the raft thread's largest single cost after the sync.
pub trait EntryPayload {
    /// Raft log index.
    fn index(&self) -> u64;
    /// Term of the entry.
    fn term(&self) -> u64;
    /// The length of the payload [`write_payload`](EntryPayload::write_payload) appends.
    fn payload_len(&self) -> usize;
    /// Appends the payload to `buf`; `Err` with a description when it cannot be encoded.
    fn write_payload(&self, buf: &mut Vec<u8>) -> std::result::Result<(), String>;
}

impl EntryPayload for EntryRecord {
    fn index(&self) -> u64 {
        self.index
    }

    fn term(&self) -> u64 {
        self.term
    }

    fn payload_len(&self) -> usize {
        self.data.len()
    }

    fn write_payload(&self, buf: &mut Vec<u8>) -> std::result::Result<(), String> {
        buf.extend_from_slice(&self.data);
        Ok(())
    }
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
