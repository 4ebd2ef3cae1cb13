//! The schema's error type: a file that cannot be read or translated, or the storage below
//! failing.

/// Errors from reading or translating stored state.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// An etcd database file that cannot be read or translated ([`crate::etcd_db`]).
    #[error("{0}")]
    EtcdDb(String),
    /// The MVCC store (or the backend below it) failed.
    #[error(transparent)]
    Mvcc(#[from] etcdrs_mvcc::Error),
    /// The bbolt file codec failed.
    #[error(transparent)]
    Bolt(#[from] etcdrs_bolt::Error),
}

impl From<etcdrs_backend::Error> for Error {
    fn from(e: etcdrs_backend::Error) -> Self {
        Error::Mvcc(e.into())
    }
}

/// The schema's result type.
pub type Result<T, E = Error> = std::result::Result<T, E>;
