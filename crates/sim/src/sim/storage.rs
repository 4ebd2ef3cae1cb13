//! The raft log's stand-in for the WAL.

use super::*;

/// raft-rs's in-memory log standing for the WAL, whose snapshots stand for the state machine's
/// last applied entry, as `raftnode`'s `NodeStorage` (private to its crate) answers them.
#[derive(Clone)]
pub(super) struct SimStorage {
    pub(super) mem: MemStorage,
    /// (index, term) of the last entry the store applied.
    pub(super) applied: std::rc::Rc<std::cell::Cell<(u64, u64)>>,
    pub(super) conf_state: ConfState,
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
