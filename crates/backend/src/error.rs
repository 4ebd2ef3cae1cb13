//! The backend's error type.

/// What can go wrong in the backend. Every variant is fatal to the caller that was writing:
/// the server stops rather than retrying a failed commit.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The storage engine failed (I/O, corruption, a transaction error).
    #[error("backend storage: {0}")]
    Storage(#[from] redb::Error),
    /// A filesystem operation around the database failed.
    #[error("backend io: {0}")]
    Io(std::io::Error),
}

impl Error {
    pub(crate) fn storage(e: impl Into<redb::Error>) -> Error {
        Error::Storage(e.into())
    }
}

/// The backend's result type.
pub type Result<T, E = Error> = std::result::Result<T, E>;
