//! The member's database file as redb sees it (its `StorageBackend`): redb's own file
//! backend, with one switch, [`Retire`], thrown when the file has been replaced.
//!
//! A defragmentation's copy, or an imported snapshot's image, is renamed over the database
//! and swapped in; the file it replaced is unlinked, and closes once its last reader is done.
//! redb's close of a file opened for writing records the allocator state and trims the file,
//! each step synced: several fsyncs, and on a big fragmented file a large state to write.
//! Nobody will open that file again, yet each of those fsyncs made the device flush, and a WAL
//! fsync issued meanwhile waited with it: during a defragmentation of 1,000,000 keys under one
//! client putting 500 times a second, the raft thread woke at the same instants as the thread
//! closing the old file, three times about 25 ms apart, and a put took 52 ms (`perf sched
//! timehist`). Once retired, the file's syncs do nothing; its writes still land in the page
//! cache (redb may read back what it wrote), and the kernel drops them with the unlinked file.

use std::fs::{File, OpenOptions};
use std::ops::Bound;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use redb::backends::FileBackend;
use redb::{BackendError, StorageBackend};

/// The switch of one open database file: [`Retire::now`] once the file was replaced.
#[derive(Debug, Default)]
pub(crate) struct Retire(Arc<AtomicBool>);

impl Retire {
    /// The file is no longer the database (it was renamed over): nothing it holds needs to
    /// reach the disk any more.
    pub(crate) fn now(&self) {
        self.0.store(true, Ordering::Release);
    }

    /// Another handle on the same switch.
    #[cfg(test)]
    pub(crate) fn share(&self) -> Retire {
        Retire(self.0.clone())
    }

    /// Whether the file was retired.
    #[cfg(test)]
    pub(crate) fn thrown(&self) -> bool {
        self.0.load(Ordering::Acquire)
    }
}

/// redb's file backend, whose syncs stop once the file is retired.
#[derive(Debug)]
struct DbFile {
    inner: FileBackend,
    retired: Arc<AtomicBool>,
}

/// Opens (or creates, when `create`) the database file at `path` with `builder`'s settings.
/// Without `create`, a missing or empty file is an error, as redb's `open` has it.
pub(crate) fn open(
    builder: &redb::Builder,
    path: &Path,
    create: bool,
) -> std::result::Result<(redb::Database, Retire), redb::DatabaseError> {
    let file = OpenOptions::new()
        .read(true)
        .write(true)
        .create(create)
        .truncate(false)
        .open(path)?;
    if !create && file.metadata()?.len() == 0 {
        return Err(redb::StorageError::Corrupted("the database file is empty".into()).into());
    }
    let (backend, retire) = DbFile::new(file)?;
    Ok((builder.create_with_backend(backend)?, retire))
}

impl DbFile {
    fn new(file: File) -> std::result::Result<(Self, Retire), redb::DatabaseError> {
        let retire = Retire::default();
        let backend = Self {
            inner: FileBackend::new(file)?,
            retired: retire.0.clone(),
        };
        Ok((backend, retire))
    }
}

impl StorageBackend for DbFile {
    fn len(&self) -> Result<u64, std::io::Error> {
        self.inner.len()
    }

    fn read(&self, offset: u64, out: &mut [u8]) -> Result<(), std::io::Error> {
        self.inner.read(offset, out)
    }

    fn set_len(&self, len: u64) -> Result<(), std::io::Error> {
        self.inner.set_len(len)
    }

    fn sync_data(&self) -> Result<(), std::io::Error> {
        if self.retired.load(Ordering::Acquire) {
            return Ok(());
        }
        self.inner.sync_data()
    }

    fn write(&self, offset: u64, data: &[u8]) -> Result<(), std::io::Error> {
        self.inner.write(offset, data)
    }

    fn close(&self) -> Result<(), std::io::Error> {
        self.inner.close()
    }

    fn try_lock_range(&self, start: Bound<u64>, end: Bound<u64>) -> Result<bool, BackendError> {
        self.inner.try_lock_range(start, end)
    }

    fn try_lock_shared_range(
        &self,
        start: Bound<u64>,
        end: Bound<u64>,
    ) -> Result<bool, BackendError> {
        self.inner.try_lock_shared_range(start, end)
    }

    fn lock_range(&self, start: Bound<u64>, end: Bound<u64>) -> Result<(), BackendError> {
        self.inner.lock_range(start, end)
    }

    fn lock_shared_range(&self, start: Bound<u64>, end: Bound<u64>) -> Result<(), BackendError> {
        self.inner.lock_shared_range(start, end)
    }

    fn unlock_range(&self, start: Bound<u64>, end: Bound<u64>) -> Result<(), BackendError> {
        self.inner.unlock_range(start, end)
    }

    fn query_lock_range(&self, start: Bound<u64>, end: Bound<u64>) -> Result<bool, BackendError> {
        self.inner.query_lock_range(start, end)
    }
}
