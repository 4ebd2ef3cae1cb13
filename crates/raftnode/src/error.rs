//! The raft node's errors.

/// Errors from the raft node.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The node's task has stopped (shutdown or a fatal error).
    #[error("raft node stopped")]
    Stopped,
    /// The proposal was dropped: there is no leader to take it.
    #[error("proposal dropped: no leader")]
    ProposalDropped,
    /// The write-ahead log failed: fatal.
    #[error(transparent)]
    Wal(#[from] etcdrs_wal::Error),
    /// raft-rs refused an operation.
    #[error("raft: {0}")]
    Raft(#[from] raft::Error),
    /// The state machine failed to apply committed entries: fatal.
    #[error("apply: {0}")]
    Apply(String),
    /// The state machine holds entries the WAL no longer has: a disk that lost writes it
    /// had synced (or `--unsafe-no-fsync`). Starting would serve state that the log cannot
    /// reproduce and that peers may not share.
    #[error(
        "the backend has applied raft entry {applied} but the WAL in {dir} ends at entry {last}: applied entries are missing from the WAL (a disk that lost synced writes, or --unsafe-no-fsync); refusing to start"
    )]
    LostEntries {
        /// The state machine's applied index.
        applied: u64,
        /// The WAL's last index.
        last: u64,
        /// The WAL directory.
        dir: String,
    },
    /// The raft configuration read back at a restart breaks raft's invariants (see
    /// [`crate::conf_state::check`]): a damaged backend.
    #[error("the raft configuration in the backend is invalid: {0}; refusing to start")]
    InvalidConfState(String),
    /// An entry in the log could not be decoded.
    #[error("corrupt raft entry: {0}")]
    Corrupt(String),
}

/// The raft node's result type.
pub type Result<T, E = Error> = std::result::Result<T, E>;
