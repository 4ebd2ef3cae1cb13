//! The storage layout of a member: the one place that names our buckets' keys and knows
//! etcd's file layout (etcd `server/storage/schema`).
//!
//! - [`keys`]: the `meta`, `auth` and `alarm` keys the server reads and writes;
//! - [`layout`]: where a member's storage lives in its data directory (resolved once, after a
//!   conversion from etcd's layout);
//! - [`conf_state`]: the stored form of raft's configuration;
//! - [`membership`] and [`version`]: member ids and the version and downgrade records;
//! - [`load`]: readers of what a restart loads from the backend;
//! - [`etcd_db`]: etcd's bbolt file, both ways; [`v2snap`]: the v2 store JSON etcd 3.4 needs
//!   in a raft snapshot.
//!
//! It knows buckets and encodings, nothing of raft's progress, the server or the network: it
//! links no network crate of its own (checked by `testkit::layering`).

#![deny(missing_docs)]

pub mod conf_state;
pub mod error;
pub mod etcd_db;
pub mod keys;
pub mod layout;
pub mod load;
pub mod membership;
pub mod v2snap;
pub mod version;

pub use error::{Error, Result};
