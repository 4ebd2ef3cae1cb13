//! The write-ahead log for the raft log: port of etcd `wal/`.
//!
//! # What this crate owns
//!
//! The durable, append-only record of everything raft must not forget: log entries, the
//! hard state (term, vote, commit), snapshot marks, and opaque metadata (node and cluster
//! id) given at creation. On restart, [`Wal::open`] replays it into a [`WalState`] to
//! restore raft from.
//!
//! # What it is not
//!
//! It knows nothing of raft types: an entry is an index, a term and opaque bytes encoded by
//! the `raftnode` crate. It does not store snapshots themselves (only marks saying one
//! exists), and it has no dependency on raft, tonic or the network.
//!
//! # Layout
//!
//! - `wal`: the [`Wal`] handle: create, save, cut, release; `wal::replay` reads the
//!   segments back on open (torn-tail rule), `wal::dir` locks and durably creates the
//!   directory.
//! - `record`: record framing, encode and decode.
//! - `segment`: segment file names, listing, atomic creation.
//! - `error`: [`Error`], [`CorruptReason`].
//! - The on-disk format and its invariants are in `crates/wal/FORMAT.md`.
//!
//! # Durability contract
//!
//! 1. When [`Wal::save`] or [`Wal::save_snapshot_mark`] returns `Ok`, every record passed
//!    is on stable storage (one `write`, then one `fdatasync`) and `open` will replay it,
//!    whatever happens afterwards.
//! 2. A crash during a save loses at most that save. Replay stops at the first bad record,
//!    so it sees a prefix of the records written. Within a save, entries are written
//!    before the hard state, so a replayed hard state implies all of its batch's entries.
//! 3. Creating and removing segment files is made durable with a directory fsync before
//!    the call returns. A new segment becomes visible only once its header is synced.
//! 4. `open` repairs only a torn tail: a truncated or CRC-bad record at the end of the last
//!    segment, followed by nothing or by zeros. It truncates the file there, fsyncs, and
//!    logs a warning. Any other damage is [`Error::Corrupt`]; the node must not start.
//! 5. Every error from a write call is fatal. After a failed write or sync the handle is
//!    poisoned ([`Error::Poisoned`]), because the tail is in an unknown state.
//! 6. One `Wal` per directory: a lock on the directory enforces it ([`Error::Locked`]).
//!
//! Callers: save the snapshot mark before the entries that follow a snapshot, and call
//! [`Wal::release_to`] with the snapshot index (it is clamped to the latest mark anyway).
#![deny(missing_docs)]

mod error;
#[cfg(test)]
mod fuzz;
mod record;
mod segment;
mod types;
mod wal;

pub use error::{CorruptReason, Error, Result};
pub use types::{EntryPayload, EntryRecord, HardState, SnapshotMark, WalState};
pub use wal::{DEFAULT_SEGMENT_SIZE, Options, Wal, WriteStats};
