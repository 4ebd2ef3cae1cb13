//! [`Error`]: every way reading an etcd data directory can fail.
//!
//! Messages start with etcd's own words where etcd has an error for the condition
//! (`wal: crc mismatch`, `walpb: crc mismatch`, `snap: crc mismatch`, `wal: file not found`,
//! ...), then name the file and, for records, the byte offset of the record's length word.

use std::io;
use std::path::PathBuf;

/// The result type of this crate.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Why an etcd data directory (or one of its files, or one entry payload) could not be read.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A file or directory could not be listed, opened or read.
    #[error("reading {path}: {source}")]
    Io {
        /// The file or directory.
        path: PathBuf,
        /// The operating system's error.
        source: io::Error,
    },

    /// The directory lacks `member/wal` with `.wal` files or `member/snap`.
    #[error("{path} is not an etcd data directory (no member/wal/*.wal or no member/snap)")]
    NotEtcdDataDir {
        /// The data directory given.
        path: PathBuf,
    },

    /// No WAL segment holds the index the WAL must be read from (etcd `ErrFileNotFound`).
    #[error("wal: file not found: no segment in {dir} starts at or before index {index}")]
    WalFileNotFound {
        /// The `member/wal` directory.
        dir: PathBuf,
        /// The snapshot index reading starts from.
        index: u64,
    },

    /// Segment sequence numbers are not consecutive (etcd `isValidSeq`, reported as
    /// `ErrFileNotFound`).
    #[error("wal: file not found: segment {next} does not follow {previous} (sequence gap)")]
    WalSequenceGap {
        /// The segment before the gap.
        previous: PathBuf,
        /// The segment after the gap.
        next: PathBuf,
    },

    /// A record's CRC does not match the rolling CRC of the records before it (etcd walpb
    /// `ErrCRCMismatch`).
    #[error(
        "walpb: crc mismatch in {path} at offset {offset}: record says {stored:#010x}, data gives {computed:#010x}"
    )]
    WalRecordCrcMismatch {
        /// The segment.
        path: PathBuf,
        /// Offset of the record's length word.
        offset: u64,
        /// The CRC stored in the record.
        stored: u32,
        /// The rolling CRC computed over the data.
        computed: u32,
    },

    /// A segment's leading CRC record does not carry the CRC the previous segment ended with
    /// (etcd wal `ErrCRCMismatch`).
    #[error(
        "wal: crc mismatch in {path} at offset {offset}: crc record says {stored:#010x}, previous segments end with {computed:#010x}"
    )]
    WalCrcMismatch {
        /// The segment.
        path: PathBuf,
        /// Offset of the record's length word.
        offset: u64,
        /// The CRC the crc record carries.
        stored: u32,
        /// The rolling CRC at that point.
        computed: u32,
    },

    /// A record is cut short or torn in a segment that is not the last one. etcd repairs
    /// only the last segment, so it refuses to start on this too.
    #[error(
        "unexpected EOF: torn or truncated record in {path} at offset {offset}, which is not the last segment"
    )]
    WalTornRecord {
        /// The segment.
        path: PathBuf,
        /// Offset of the record's length word.
        offset: u64,
    },

    /// A record (or the message in its data) is not valid protobuf.
    #[error("wal: cannot decode {what} in {path} at offset {offset}: {reason}")]
    WalDecode {
        /// The segment.
        path: PathBuf,
        /// Offset of the record's length word.
        offset: u64,
        /// What was being decoded (`walpb.Record`, `raftpb.Entry`, ...).
        what: &'static str,
        /// The decoder's message.
        reason: String,
    },

    /// A record type etcd does not know.
    #[error("unexpected block type {record_type} in {path} at offset {offset}")]
    WalUnexpectedRecordType {
        /// The segment.
        path: PathBuf,
        /// Offset of the record's length word.
        offset: u64,
        /// The type found.
        record_type: i64,
    },

    /// Two metadata records differ (etcd `ErrMetadataConflict`).
    #[error("wal: conflicting metadata found in {path} at offset {offset}")]
    WalMetadataConflict {
        /// The segment.
        path: PathBuf,
        /// Offset of the second, different record.
        offset: u64,
    },

    /// The WAL read holds no metadata record, so node and cluster id are unknown.
    #[error("wal: no metadata record in {dir}")]
    WalMetadataMissing {
        /// The `member/wal` directory.
        dir: PathBuf,
    },

    /// A snapshot record has the index the WAL is read from but another term (etcd
    /// `ErrSnapshotMismatch`).
    #[error(
        "wal: snapshot mismatch in {path} at offset {offset}: index {index} has term {found} in the WAL, {expected} in the snapshot"
    )]
    WalSnapshotMismatch {
        /// The segment.
        path: PathBuf,
        /// Offset of the record's length word.
        offset: u64,
        /// The snapshot index.
        index: u64,
        /// The term in the WAL's snapshot record.
        found: u64,
        /// The term of the snapshot.
        expected: u64,
    },

    /// No snapshot record matches the snapshot the WAL is read from (etcd
    /// `ErrSnapshotNotFound`).
    #[error("wal: snapshot not found: no record for index {index} term {term} in {dir}")]
    WalSnapshotNotFound {
        /// The `member/wal` directory.
        dir: PathBuf,
        /// The snapshot index.
        index: u64,
        /// The snapshot term.
        term: u64,
    },

    /// An entry's index leaves a hole after the entries before it (etcd `ErrSliceOutOfRange`).
    #[error(
        "wal: slice bounds out of range in {path} at offset {offset}: entry {index} after {entries} entries from index {start}"
    )]
    WalSliceOutOfRange {
        /// The segment.
        path: PathBuf,
        /// Offset of the record's length word.
        offset: u64,
        /// The entry's index.
        index: u64,
        /// The index the WAL is read from.
        start: u64,
        /// How many entries were kept before it.
        entries: usize,
    },

    /// A snapshot file is empty, or holds no data or a zero CRC (etcd `ErrEmptySnapshot`).
    #[error("snap: empty snapshot: {path}")]
    SnapEmpty {
        /// The `.snap` file.
        path: PathBuf,
    },

    /// A snapshot file's CRC does not match its data (etcd snap `ErrCRCMismatch`).
    #[error("snap: crc mismatch in {path}: file says {stored:#010x}, data gives {computed:#010x}")]
    SnapCrcMismatch {
        /// The `.snap` file.
        path: PathBuf,
        /// The CRC stored in the file.
        stored: u32,
        /// The CRC computed over the data.
        computed: u32,
    },

    /// A snapshot file is not valid protobuf.
    #[error("snap: cannot decode {what} in {path}: {reason}")]
    SnapDecode {
        /// The `.snap` file.
        path: PathBuf,
        /// What was being decoded (`snappb.Snapshot` or `raftpb.Snapshot`).
        what: &'static str,
        /// The decoder's message.
        reason: String,
    },

    /// The snapshot's data is not the v2 store's JSON.
    #[error("v2 store: snapshot data of {path} is not the store's JSON: {source}")]
    V2StoreJson {
        /// The `.snap` file.
        path: PathBuf,
        /// The JSON parser's error.
        source: serde_json::Error,
    },

    /// `member/snap/db`, the bbolt backend, is missing.
    #[error("backend database {path} does not exist")]
    DbNotFound {
        /// The expected path.
        path: PathBuf,
    },

    /// An entry payload is neither an `InternalRaftRequest` nor a v2 `Request`.
    #[error("cannot decode entry payload: {0}")]
    Payload(prost::DecodeError),

    /// A `ConfChange` entry is not a valid `raftpb.ConfChange`.
    #[error("cannot decode raftpb.ConfChange: {0}")]
    ConfChange(prost::DecodeError),

    /// A member's JSON (a `ConfChange` context or a v2 store value) is malformed.
    #[error("cannot decode member JSON: {0}")]
    MemberJson(serde_json::Error),
}
