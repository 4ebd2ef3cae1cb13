//! The multi-version key-value store (etcd `server/storage/mvcc` and `server/lease`).
//!
//! It owns the revisioned key space: an in-memory index from key to its history
//! ([`key_index::KeyIndex`]) over values stored by revision in the backend's `key` bucket,
//! the current and compacted revisions, and the leases that keys are attached to.
//!
//! It is *not* replicated and knows nothing of raft or gRPC: the server applies committed
//! raft entries to it through [`KvStore::write`], the one writer, while any number of readers
//! call [`KvStore::range`].
//!
//! # Consistency between index and backend
//!
//! A write batch holds the index's write lock from its first change until its backend commit,
//! so readers, who begin their backend read transaction under the read lock, never see an
//! index entry whose value is not committed.

#![deny(missing_docs)]

mod error;
pub mod hash;
pub mod key_index;
mod kvstore;
pub mod lease;
pub mod metrics;
pub mod revision;
pub mod watch;

pub use error::{Error, Result};
pub use kvstore::{
    BuiltIndex, Change, CompactionStep, EncodedRange, KeyRange, KvStore, LoadedStore,
    META_CONF_STATE, META_CONSISTENT_INDEX, META_TERM, PageParams, RangePage, RangeParams,
    RangeResult, StoreLoader, Txn, WriteBatch,
};
pub use lease::{Lease, LeaseId, LeaseRecord, Lessor, NO_LEASE};
pub use revision::Revision;
pub use watch::{Filters, HubMsg, SharedEvent, StreamId, WatchHub, WatchId, WatchRange};
