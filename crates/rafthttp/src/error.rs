//! The transport's errors.

/// What can go wrong between members, in etcd's words (peers and operators read these texts).
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A peer sent bytes that are not etcd's rafthttp framing or raftpb, or a message could
    /// not be encoded (etcd's text).
    #[error("{0}")]
    Message(String),
}

/// The transport's result.
pub type Result<T, E = Error> = std::result::Result<T, E>;
