//! The WAL's error type.
//!
//! Every error returned while writing (`save`, `save_snapshot_mark`, `release_to`) is fatal
//! to the node: the caller must stop rather than retry, because the state of the tail on disk
//! is no longer known. After a write-path I/O error the [`crate::Wal`] refuses further writes
//! with [`Error::Poisoned`]. Errors from `open` describe why the log cannot be replayed.

use std::io;
use std::path::PathBuf;

use crate::types::SnapshotMark;

/// What can go wrong in the WAL.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A filesystem operation failed.
    #[error("wal: io error on {path}: {source}")]
    Io {
        /// The file or directory the operation was about.
        path: PathBuf,
        /// The underlying error.
        #[source]
        source: io::Error,
    },
    /// `create` was called on a directory that already holds files (etcd `os.ErrExist`).
    #[error("wal: directory {dir} already exists and is not empty")]
    AlreadyExists {
        /// The directory passed to `create`.
        dir: PathBuf,
    },
    /// `open` found no segment files (etcd `ErrFileNotFound`).
    #[error("wal: no wal segments found in {dir}")]
    NotFound {
        /// The directory passed to `open`.
        dir: PathBuf,
    },
    /// Another `Wal` (in this or another process) holds the directory lock.
    #[error("wal: directory {dir} is locked by another writer")]
    Locked {
        /// The locked directory.
        dir: PathBuf,
    },
    /// The log is damaged somewhere a crash cannot explain (etcd `ErrCRCMismatch`
    /// and friends): the node must not start from it without operator intervention.
    #[error("wal: corrupt segment {path} at offset {offset}: {reason}")]
    Corrupt {
        /// The damaged segment file.
        path: PathBuf,
        /// Byte offset of the first bad record in that file.
        offset: u64,
        /// What exactly is wrong.
        reason: CorruptReason,
    },
    /// A segment carries different metadata than the first one (etcd `ErrMetadataConflict`).
    #[error("wal: metadata in {path} conflicts with the first segment")]
    MetadataConflict {
        /// The segment whose metadata differs.
        path: PathBuf,
    },
    /// `save` was given entries that do not continue the log (etcd `ErrSliceOutOfRange`).
    /// The first entry of a batch must be `<= last_index + 1` and a batch must be contiguous.
    #[error("wal: entry index {found} does not follow index {last_index}")]
    IndexGap {
        /// The index the entry should have followed.
        last_index: u64,
        /// The offending entry index.
        found: u64,
    },
    /// `save_snapshot_mark` was given a mark older than the one already recorded.
    #[error("wal: snapshot mark {requested:?} is older than the recorded {current:?}")]
    SnapshotMarkRegression {
        /// The mark already in the log.
        current: SnapshotMark,
        /// The rejected mark.
        requested: SnapshotMark,
    },
    /// A single record would exceed the format's maximum payload size.
    #[error("wal: record payload of {len} bytes exceeds the maximum of {max} bytes")]
    RecordTooLarge {
        /// Payload size that was requested.
        len: usize,
        /// The format limit, see FORMAT.md.
        max: u32,
    },
    /// An entry's payload could not be encoded, or did not have the length it announced.
    #[error("wal: entry {index} could not be encoded: {reason}")]
    EntryEncoding {
        /// The entry's index.
        index: u64,
        /// What went wrong.
        reason: String,
    },
    /// An earlier write or sync failed; the tail is in an unknown state and this handle
    /// accepts no more writes. Reopen the WAL (which repairs the tail) after a restart.
    #[error("wal: an earlier write failed; this wal accepts no more writes")]
    Poisoned,
}

/// Why a segment was judged corrupt.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum CorruptReason {
    /// Fewer bytes than a record header remain.
    #[error("record header is truncated")]
    TruncatedHeader,
    /// The length field and its complement disagree, or the length exceeds the maximum.
    #[error("record length field is damaged")]
    BadLength,
    /// The header is intact but the payload extends past the end of the file.
    #[error("record extends past the end of the segment")]
    TruncatedRecord,
    /// The CRC over type and payload does not match.
    #[error("crc mismatch: stored {stored:#010x}, computed {computed:#010x}")]
    CrcMismatch {
        /// CRC stored in the record header.
        stored: u32,
        /// CRC computed over the bytes read.
        computed: u32,
    },
    /// A CRC-valid record has a type this version does not know.
    #[error("unknown record type {0}")]
    UnknownType(u8),
    /// A CRC-valid record has a payload of the wrong size for its type.
    #[error("malformed {record} record payload of {len} bytes")]
    BadPayload {
        /// Record type name.
        record: &'static str,
        /// Payload length found.
        len: usize,
    },
    /// The segment does not start with metadata, snapshot mark, hard state (in that order).
    #[error("segment header is incomplete or out of order at record {position}")]
    BadSegmentHeader {
        /// Zero-based position of the offending record in the segment.
        position: usize,
    },
    /// A snapshot mark older than an earlier one.
    #[error("snapshot mark regressed from index {from} to {to}")]
    SnapshotMarkRegression {
        /// Index of the earlier mark.
        from: u64,
        /// Index of the later, older mark.
        to: u64,
    },
    /// An entry does not continue the replayed log.
    #[error("entry index {found} does not follow index {last_index}")]
    IndexGap {
        /// The index the entry should have followed.
        last_index: u64,
        /// The offending entry index.
        found: u64,
    },
    /// Segment sequence numbers are not consecutive: a segment file is missing.
    #[error("segment with sequence {expected:#x} is missing")]
    MissingSegment {
        /// The sequence number that should have come next.
        expected: u64,
    },
}

impl Error {
    /// Builds a closure that wraps an `io::Error` with the path it concerns.
    pub(crate) fn io(path: impl Into<PathBuf>) -> impl FnOnce(io::Error) -> Error {
        let path = path.into();
        move |source| Error::Io { path, source }
    }

    /// Whether this error is [`Error::Corrupt`]; convenient for callers and tests.
    pub fn is_corrupt(&self) -> bool {
        matches!(self, Error::Corrupt { .. })
    }
}

/// The WAL's result type.
pub type Result<T, E = Error> = std::result::Result<T, E>;
