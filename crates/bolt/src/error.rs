//! The crate's error type: why a file cannot be read, or why input cannot be written.
//!
//! Reader errors name the file and, where there is one, the page; names and keys are shown
//! with non-printable bytes escaped, because etcd's keys are binary.

use std::io;
use std::path::PathBuf;

/// What can go wrong reading or writing a bbolt file.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A read from the file failed.
    #[error("bolt: io error on {path}: {source}")]
    Io {
        /// The file being read.
        path: PathBuf,
        /// The underlying error.
        #[source]
        source: io::Error,
    },
    /// A write to the writer's output failed.
    #[error("bolt: write error: {0}")]
    Write(#[source] io::Error),
    /// The file is shorter than two pages, or than the pages its meta says it has
    /// (bbolt's "file size too small").
    #[error("bolt: {path}: file size too small: {size} bytes, need at least {needed}")]
    FileTooSmall {
        /// The file.
        path: PathBuf,
        /// Its length in bytes.
        size: u64,
        /// The length its meta page (or the minimum of two pages) requires.
        needed: u64,
    },
    /// Neither meta page has bbolt's magic number (bbolt's `ErrInvalid`).
    #[error("bolt: {path}: invalid database (no bbolt magic in either meta page)")]
    InvalidDatabase {
        /// The file.
        path: PathBuf,
    },
    /// The meta page has another format version than 2 (bbolt's `ErrVersionMismatch`).
    #[error("bolt: {path}: version mismatch: file has version {found}, expected 2")]
    VersionMismatch {
        /// The file.
        path: PathBuf,
        /// The version found.
        found: u32,
    },
    /// Both meta pages fail their FNV-1a checksum (bbolt's `ErrChecksum`).
    #[error("bolt: {path}: checksum error in meta page {page}")]
    Checksum {
        /// The file.
        path: PathBuf,
        /// The meta page (0 or 1) whose error is reported.
        page: u64,
    },
    /// The meta page names a page size this reader cannot use.
    #[error("bolt: {path}: invalid page size {page_size}")]
    InvalidPageSize {
        /// The file.
        path: PathBuf,
        /// The page size from the meta page.
        page_size: u32,
    },
    /// A page reference or page contents are inconsistent: the file is corrupt.
    #[error("bolt: {path}: corrupt page {page}: {reason}")]
    CorruptPage {
        /// The file.
        path: PathBuf,
        /// The page id.
        page: u64,
        /// What is wrong with it.
        reason: CorruptReason,
    },
    /// No top-level bucket has this name.
    #[error("bolt: {path}: bucket {bucket:?} not found")]
    BucketNotFound {
        /// The file.
        path: PathBuf,
        /// The bucket name, escaped.
        bucket: String,
    },
    /// A top-level bucket holds a nested bucket; this reader reads flat buckets only (etcd
    /// has none).
    #[error(
        "bolt: {path}: bucket {bucket:?} holds a nested bucket {key:?}, which is not supported"
    )]
    NestedBucket {
        /// The file.
        path: PathBuf,
        /// The top-level bucket, escaped.
        bucket: String,
        /// The nested bucket's key, escaped.
        key: String,
    },
    /// The root bucket holds a plain key/value where only buckets may be.
    #[error("bolt: {path}: root holds a key {key:?} that is not a bucket")]
    NotABucket {
        /// The file.
        path: PathBuf,
        /// The key, escaped.
        key: String,
    },
    /// Writer input out of order: buckets and keys must be strictly ascending.
    #[error("bolt: out of order: {what} {current:?} does not sort after {previous:?}")]
    OutOfOrder {
        /// `"bucket"` or `"key"`.
        what: &'static str,
        /// The previous name or key, escaped.
        previous: String,
        /// The name or key that came next, escaped.
        current: String,
    },
    /// Writer `put` before any `bucket` call.
    #[error("bolt: put before the first bucket")]
    NoBucket,
    /// An empty key or bucket name (bbolt's `ErrKeyRequired`, `ErrBucketNameRequired`).
    #[error("bolt: {0} required")]
    Required(&'static str),
    /// A key longer than bbolt's `MaxKeySize` (32768 bytes).
    #[error("bolt: key too large: {len} bytes")]
    KeyTooLarge {
        /// The key length.
        len: usize,
    },
    /// A value longer than bbolt's `MaxValueSize` (2^31 - 2 bytes).
    #[error("bolt: value too large: {len} bytes")]
    ValueTooLarge {
        /// The value length.
        len: usize,
    },
}

/// Why a page is corrupt.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CorruptReason {
    /// The page id is at or above the meta's high-water mark.
    #[error("page id beyond the high-water mark {high_water}")]
    OutOfBounds {
        /// The meta's page count.
        high_water: u64,
    },
    /// A tree points at page 0 or 1, which are the meta pages.
    #[error("a tree points at a meta page")]
    MetaPageReference,
    /// The page header names another page id.
    #[error("page header says id {found}")]
    WrongId {
        /// The id in the header.
        found: u64,
    },
    /// The page is neither a branch nor a leaf page where one was expected.
    #[error("unexpected page flags {flags:#04x}")]
    WrongType {
        /// The page flags.
        flags: u16,
    },
    /// An element points outside its page.
    #[error("element {index} lies outside the page")]
    ElementOutOfPage {
        /// The element index.
        index: usize,
    },
    /// An element has an empty key, which bbolt never writes.
    #[error("element {index} has an empty key")]
    EmptyKey {
        /// The element index.
        index: usize,
    },
    /// A bucket value is shorter than the 16-byte bucket header.
    #[error("bucket header of {key:?} is {len} bytes")]
    ShortBucketHeader {
        /// The bucket's key, escaped.
        key: String,
        /// The value length.
        len: usize,
    },
    /// Branch pages nest deeper than any real bbolt file (a loop in the tree).
    #[error("tree deeper than {max} levels")]
    TooDeep {
        /// The depth limit.
        max: usize,
    },
}

/// The crate's result type.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Shows bytes as text with non-printable bytes escaped, for error messages.
pub(crate) fn escape(bytes: &[u8]) -> String {
    bytes.escape_ascii().to_string()
}
