//! The backend's error type.

/// What can go wrong in the backend. `Storage` and `Io` are fatal to the caller that was
/// writing: the server stops rather than retrying a failed commit. The `Snapshot*` variants
/// reject a snapshot image offered for restore.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The storage engine failed (I/O, corruption, a transaction error).
    #[error("backend storage: {0}")]
    Storage(#[from] redb::Error),
    /// A filesystem operation around the database failed.
    #[error("backend io: {0}")]
    Io(std::io::Error),
    /// The storage engine panicked on a database file: redb trusts its files, and a damaged
    /// one (an image restored with `--skip-hash-check`, a file from elsewhere) can make it
    /// panic rather than return an error.
    #[error("database file `{}` is damaged: {reason}", .path.display())]
    Damaged {
        /// The file.
        path: std::path::PathBuf,
        /// The engine's panic message.
        reason: String,
    },
    /// A defragmentation began its copy again this many times, each time undone by a bucket
    /// replaced meanwhile (a snapshot installed from the leader), and gave up.
    #[error("defragmentation gave up after {0} copies: the database was replaced during each")]
    DefragRestarted(usize),
    /// A value stored in pieces (see the `pieces` module) lacks some of them: the file was
    /// changed by something else, or damaged.
    #[error("a value of {len} bytes stored in pieces has only {found} bytes of them")]
    MissingPieces {
        /// The value's length its head records.
        len: usize,
        /// The bytes of the pieces found.
        found: usize,
    },
    /// A snapshot image to restore has no digest and the check was not skipped (etcd's
    /// message).
    #[error("snapshot missing hash but --skip-hash-check=false")]
    SnapshotMissingHash,
    /// A snapshot image's digest does not match its bytes (etcd's message, byte slices
    /// printed as Go prints them).
    #[error("expected sha256 {}, got {}", go_bytes(.expected), go_bytes(.got))]
    SnapshotHashMismatch {
        /// The digest stored at the end of the image.
        expected: Vec<u8>,
        /// The digest of the image's bytes.
        got: Vec<u8>,
    },
}

/// A byte slice as Go's `%v` prints it: `[1 2 3]`.
fn go_bytes(bytes: &[u8]) -> String {
    let items: Vec<String> = bytes.iter().map(u8::to_string).collect();
    format!("[{}]", items.join(" "))
}

impl Error {
    pub(crate) fn storage(e: impl Into<redb::Error>) -> Error {
        Error::Storage(e.into())
    }
}

/// The backend's result type.
pub type Result<T, E = Error> = std::result::Result<T, E>;
