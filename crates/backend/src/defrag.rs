//! Defragmentation while the member serves (etcd's `Maintenance.Defragment`, without its
//! pause).
//!
//! etcd rewrites its bbolt file into a new one while every transaction waits. Here the new
//! file is written beside the old one while readers and the writer go on, the way a running
//! virtual machine's memory is copied to another host:
//!
//! 1. A barrier (the writer taken and released) starts the [`Tracker`]: from then on every
//!    committed write transaction hands it the keys it changed. A read transaction begun right
//!    after the barrier is copied whole into `<db>.defrag` (`snapshot::copy_tables`).
//! 2. Rounds: the keys changed meanwhile are taken, and each is copied again from a newer read
//!    transaction (or removed from the copy when it is gone), until few are left.
//! 3. The writer is held (the applier waits here, for the last few keys only: every commit of
//!    the copy before was durable, so this one writes only them): the last changes are
//!    copied, the copy is committed durably, renamed over the database, its directory synced,
//!    and swapped in. A writer that was waiting for the old file sees the swap and begins
//!    again on the new one; readers of the old file finish on it, and it closes when the last
//!    of them is done.
//!
//! A write transaction hands its keys over just before its commit, while it holds the writer,
//! and a round takes them and begins its read transaction while it holds the writer itself
//! (for that instant only), so the keys taken are exactly those of the commits the read sees.
//! A change to a whole bucket (`clear`, a snapshot installed meanwhile) starts the copy again.
//! The fresh file holds the pages in key order, full, and grows no further than they need.

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

use redb::{Durability, TableDefinition};

use crate::{Backend, Bucket, Error, Result, lock, pieces};

/// Keys changed by one write transaction, or by every transaction since a round began.
#[derive(Debug, Default)]
pub(crate) struct Changes {
    /// `(bucket, key)`, sorted by bucket so that a round opens each table once.
    pub(crate) keys: BTreeSet<(&'static str, Vec<u8>)>,
    /// A whole bucket changed: the copy starts again.
    pub(crate) everything: bool,
}

impl Changes {
    /// `key` of `bucket` changed.
    pub(crate) fn key(&mut self, bucket: Bucket, key: &[u8]) {
        if !self.everything {
            self.keys.insert((bucket.name(), key.to_vec()));
        }
    }

    /// More than keys changed (a bucket was cleared).
    pub(crate) fn everything(&mut self) {
        self.everything = true;
        self.keys.clear();
    }

    fn merge(&mut self, other: Changes) {
        if other.everything {
            self.everything();
        } else if !self.everything {
            self.keys.extend(other.keys);
        }
    }
}

/// What committed write transactions changed while a defragmentation runs.
#[derive(Debug, Default)]
pub(crate) struct Tracker {
    on: AtomicBool,
    changes: std::sync::Mutex<Changes>,
}

impl Tracker {
    /// Whether a transaction beginning now must keep its keys.
    pub(crate) fn active(&self) -> bool {
        self.on.load(Ordering::Acquire)
    }

    /// A write transaction committed `changes`.
    pub(crate) fn record(&self, changes: Changes) {
        if self.active() {
            lock(&self.changes).merge(changes);
        }
    }

    fn start(&self) {
        *lock(&self.changes) = Changes::default();
        self.on.store(true, Ordering::Release);
    }

    fn take(&self) -> Changes {
        std::mem::take(&mut *lock(&self.changes))
    }

    #[cfg(test)]
    pub(crate) fn start_for_test(&self) {
        self.start();
    }

    #[cfg(test)]
    pub(crate) fn take_for_test(&self) -> Changes {
        self.take()
    }

    fn stop(&self) {
        self.on.store(false, Ordering::Release);
        *lock(&self.changes) = Changes::default();
    }
}

/// Rounds of changes copied without stopping the writer, at most.
const MAX_ROUNDS: usize = 16;
/// Changed keys few enough to copy while the writer waits.
const FINAL_KEYS: usize = 2_000;
/// Whole copies begun again (a bucket cleared meanwhile) before giving up.
const MAX_ATTEMPTS: usize = 3;

/// Where the copy of the database at `path` is written.
pub(crate) fn copy_path(path: &std::path::Path) -> PathBuf {
    let mut name = path.as_os_str().to_owned();
    name.push(".defrag");
    PathBuf::from(name)
}

impl Backend {
    fn defrag_path(&self) -> PathBuf {
        copy_path(&self.path)
    }

    pub(crate) fn rewrite_file(&self) -> Result<()> {
        let _one = lock(&self.defragmenting);
        // The batches committed before the call are in the file that is copied (what they
        // removed is not copied): a flush first, as etcd's defragment commits its batch
        // transaction first.
        self.write()?.commit(true)?;
        let copy_path = self.defrag_path();
        let result = (|| {
            for attempt in 1..=MAX_ATTEMPTS {
                if self.try_rewrite(&copy_path)? {
                    return Ok(());
                }
                tracing::info!(
                    attempt,
                    "a bucket was replaced during defragmentation; copying again"
                );
            }
            Err(Error::DefragRestarted(MAX_ATTEMPTS))
        })();
        self.tracker.stop();
        if result.is_err() {
            let _ = std::fs::remove_file(&copy_path);
        }
        result
    }

    /// One attempt; `false` when a bucket was replaced meanwhile.
    fn try_rewrite(&self, copy_path: &std::path::Path) -> Result<bool> {
        let started = Instant::now();
        match std::fs::remove_file(copy_path) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(Error::Io(e)),
        }
        // The barrier: no write transaction is in flight when tracking starts, so each one
        // after it keeps its keys, and the read below holds every one before it.
        let snapshot = {
            let barrier = self.current().begin_write().map_err(Error::storage)?;
            self.tracker.start();
            let read = self.read()?;
            barrier.abort().map_err(Error::storage)?;
            read
        };
        let mut builder = redb::Database::builder();
        builder.set_cache_size(crate::CACHE_BYTES);
        let (copy, retire) =
            crate::file::open(&builder, copy_path, true).map_err(Error::storage)?;
        // Each commit of the copy durable: its pages reach the disk 16 MiB at a time, not all
        // at once in the commit made with the writer held, which then writes only the last
        // changes (with the copy's rounds not durable, puts waited up to a third of a second
        // at 300,000 keys; why the flush of a file of its own slowed the applier's commits and
        // the WAL's syncs as well was not found).
        crate::snapshot::copy_tables(&snapshot.tx, &copy, Durability::Immediate)?;
        drop(snapshot);
        let copied = started.elapsed();

        // Rounds while the writer goes on.
        let mut rounds = 0;
        let mut pending = Changes::default();
        loop {
            // A look without the writer, to decide whether to go on: what is taken here is
            // only copied after a cut below, whose read holds it.
            pending.merge(self.tracker.take());
            if pending.everything {
                return Ok(false);
            }
            if pending.keys.len() <= FINAL_KEYS || rounds == MAX_ROUNDS {
                break;
            }
            let read = {
                let barrier = self.current().begin_write().map_err(Error::storage)?;
                pending.merge(self.tracker.take());
                let read = self.read()?;
                barrier.abort().map_err(Error::storage)?;
                read
            };
            if pending.everything {
                return Ok(false);
            }
            copy_changes(
                &read.tx,
                &copy,
                &std::mem::take(&mut pending),
                Durability::Immediate,
            )?;
            rounds += 1;
        }

        // The last changes, with the writer held.
        let held = Instant::now();
        let old = self.current();
        let writer = old.begin_write().map_err(Error::storage)?;
        pending.merge(self.tracker.take());
        if pending.everything {
            return Ok(false);
        }
        let read = self.read()?;
        let last = pending.keys.len();
        copy_changes(&read.tx, &copy, &pending, Durability::Immediate)?;
        drop(read);
        std::fs::rename(copy_path, &self.path).map_err(Error::Io)?;
        let parent = self
            .path
            .parent()
            .filter(|p| !p.as_os_str().is_empty())
            .unwrap_or(std::path::Path::new("."));
        crate::sync_dir(parent).map_err(Error::Io)?;
        // Everything committed to the file so far is durable in the new file (set while no
        // commit can come: the old file's writer is held, and the new one is not in use yet);
        // the batches published since wait for the next flush.
        let waiting: u64 = self.published().iter().map(|l| l.writes).sum();
        self.pending_writes.store(waiting, Ordering::Relaxed);
        let flushed = self.flushed_generation.load(Ordering::Acquire);
        self.durable_generation.fetch_max(flushed, Ordering::AcqRel);
        *lock(&self.last_durable) = self.now();
        self.swap_file(copy, retire);
        self.tracker.stop();
        // The old file's writer, given up: the applier waiting behind it begins again on the
        // new file.
        writer.abort().map_err(Error::storage)?;
        close_retired(old);
        tracing::info!(
            copy = ?copied,
            rounds,
            last_keys = last,
            writer_held = ?held.elapsed(),
            took = ?started.elapsed(),
            "rewrote the database file"
        );
        self.pages.file_replaced(self.current(), self.now());
        Ok(true)
    }
}

/// Closes the file a defragmentation replaced once its last reader is done, on a thread of its
/// own. Closing a redb file records its allocator state (its syncs are off once the file is
/// retired, see the `file` module, but the writes remain: a tenth of a second or more on a big
/// file); whoever drops the last handle does it, and that was often the applier (its
/// transaction begun on the old file, given up and begun again on the new one), so every
/// write waited for it.
pub(crate) fn close_retired(old: Arc<redb::Database>) {
    let closer = std::thread::Builder::new()
        .name("retired db closer".into())
        .spawn(move || {
            let mut old = old;
            loop {
                match Arc::try_unwrap(old) {
                    Ok(db) => {
                        drop(db);
                        return;
                    }
                    // Readers of the old file are still at work; they finish on it.
                    Err(shared) => {
                        old = shared;
                        std::thread::sleep(std::time::Duration::from_millis(20));
                    }
                }
            }
        });
    if let Err(e) = closer {
        // The handle was dropped with the closure: the file closes wherever its last reader
        // lets go, as before.
        tracing::warn!(error = %e, "could not start a thread to close the replaced database file");
    }
}

/// Copies each of `changes` as `read` sees it into `copy` (removed when `read` lacks it), in
/// one transaction of `durability`.
fn copy_changes(
    read: &redb::ReadTransaction,
    copy: &redb::Database,
    changes: &Changes,
    durability: Durability,
) -> Result<()> {
    let mut tx = copy.begin_write().map_err(Error::storage)?;
    tx.set_durability(durability).map_err(Error::storage)?;
    let mut keys = changes.keys.iter().peekable();
    while let Some((bucket, _)) = keys.peek() {
        let bucket = *bucket;
        let definition: TableDefinition<'_, &[u8], &[u8]> = TableDefinition::new(bucket);
        let source = match read.open_table(definition) {
            Ok(table) => Some(table),
            Err(redb::TableError::TableDoesNotExist(_)) => None,
            Err(e) => return Err(Error::storage(e)),
        };
        let mut target = tx.open_table(definition).map_err(Error::storage)?;
        // The `key` bucket's long values: a changed key's pieces are copied with its head.
        let (source_pieces, mut target_pieces) = if bucket == Bucket::KEY.name() {
            (
                pieces::ReadPieces::open(read)?,
                Some(pieces::WritePieces::open(&tx)?),
            )
        } else {
            (None, None)
        };
        while let Some((_, key)) = keys.next_if(|(b, _)| *b == bucket) {
            let value = match &source {
                Some(table) => {
                    redb::ReadableTable::get(table, key.as_slice()).map_err(Error::storage)?
                }
                None => None,
            };
            let new_len = value
                .as_ref()
                .and_then(|value| pieces::head_len(Bucket::KEY, value.value()));
            let old = match value {
                Some(value) => target
                    .insert(key.as_slice(), value.value())
                    .map_err(Error::storage)?,
                None => target.remove(key.as_slice()).map_err(Error::storage)?,
            };
            let had_pieces =
                old.is_some_and(|old| pieces::head_len(Bucket::KEY, old.value()).is_some());
            let Some(target_pieces) = target_pieces.as_mut() else {
                continue;
            };
            if had_pieces {
                target_pieces.remove(key)?;
            }
            if let Some(len) = new_len {
                let Some(source_pieces) = &source_pieces else {
                    return Err(Error::MissingPieces { len, found: 0 });
                };
                let mut joined = Vec::new();
                source_pieces.join_into(key, len, &mut joined)?;
                target_pieces.insert(key, &joined)?;
            }
        }
    }
    tx.commit().map_err(Error::storage)?;
    Ok(())
}
