//! The MVCC layer's errors.

/// Errors from the MVCC store. `Compacted` and `FutureRevision` are answers to a request;
/// `Backend` and `Corrupt` are fatal to the writer.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The requested revision has been compacted away.
    #[error("mvcc: required revision has been compacted")]
    Compacted {
        /// The revision asked for.
        requested: i64,
        /// The store's compacted revision.
        compacted: i64,
    },
    /// The requested revision is newer than the store.
    #[error("mvcc: required revision is a future revision")]
    FutureRevision {
        /// The revision asked for.
        requested: i64,
        /// The store's current revision.
        current: i64,
    },
    /// A put named a lease that does not exist.
    #[error("lease not found")]
    LeaseNotFound(i64),
    /// A grant named a lease id that already exists.
    #[error("lease already exists")]
    LeaseExists(i64),
    /// The backend failed.
    #[error(transparent)]
    Backend(#[from] etcdrs_backend::Error),
    /// Stored data could not be decoded.
    #[error("mvcc: corrupt data: {0}")]
    Corrupt(String),
}

/// The MVCC result type.
pub type Result<T, E = Error> = std::result::Result<T, E>;
