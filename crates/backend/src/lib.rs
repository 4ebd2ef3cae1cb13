//! The transactional byte key-value store under the MVCC layer: bbolt's role in etcd
//! (etcd `server/storage/backend`).
//!
//! It owns one redb database file (`member/snap/db`) holding named buckets of byte keys and
//! values, a single writer and many snapshot-isolated readers. It knows nothing of revisions,
//! leases or raft: the `mvcc` crate decides what the bytes mean.
//!
//! # Durability
//!
//! Like etcd's batched backend, the store's writes ([`BatchTx`]) are held in memory, where
//! every reader sees them, and reach the file together in one commit (the `batch` module);
//! that commit is durable, made once `batch_interval` has passed since the last durable one or
//! once `batch_limit` writes wait (etcd's `--backend-batch-interval` and
//! `--backend-batch-limit`, 100ms and 10000 by default), or on request. A [`WriteTx`] writes the
//! file directly (the offline tools, imports), after taking in the batches waiting; its commits
//! are durable on request or by the same schedule ([`Durability::None`] otherwise).
//! That is safe because the raft WAL is the source of truth: on restart the server replays
//! every entry after the consistent index recorded in the last durable commit.
//!
//! # Integrity
//!
//! The file is opened with redb's integrity check: every page of the committed trees is
//! read and checked against its checksum, so a file damaged on the disk is refused
//! ([`Error::Damaged`], naming it) instead of read as data. What it costs at start, on top of
//! a plain open of a file that was closed cleanly (redb 4.6, release build): about 40 ms for
//! a 34 MiB file (100,000 values of 256 bytes) and 1.2 s for 272 MiB (1,000,000), with the
//! file in the page cache; 0.1 s and 2 to 4.6 s from a cold cache. A start after a crash
//! pays it anyway: redb's recovery verifies the same checksums.
//!
//! When only the newest commit fails the check (its pages cut short by a power cut before its
//! fsync finished, or damaged since), redb opens the previous commit instead. That is not an
//! error (the server's WAL replays what the lost commit held), but it is logged as a warning
//! naming the file, and [`Backend::opened_previous_commit`] tells it.
//!
//! # Hashes and snapshots
//!
//! [`ReadTx::hash`] is etcd's backend hash (CRC-32C, [`crc32c`], over every bucket's name and
//! pairs). [`Backend::snapshot`] copies the last commit into a temporary file for
//! `Maintenance.Snapshot`, and [`restore_image`] turns a saved snapshot back into a database
//! file; the image format is documented in the `snapshot` module.

#![deny(missing_docs)]

/// CRC-32C, re-exported for the backend's users (mvcc's hashes).
pub use etcdrs_crc32c as crc32c;
mod batch;
mod defrag;
mod dirsync;
mod error;
mod file;
#[cfg(test)]
mod fuzz;
pub mod metrics;
mod pages;
mod pieces;
mod snapshot;
pub mod transfer;

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use redb::{
    Durability, ReadableDatabase, ReadableTable, ReadableTableMetadata, TableDefinition,
    TableHandle,
};

pub use batch::{BatchTx, HARD_LIMIT_BYTES, SOFT_LIMIT_BYTES};
pub use dirsync::{create_dir_all_synced, sync_dir, write_file_synced};
pub use error::{Error, Result};
pub use snapshot::{HashCheck, ImageDigest, SHA256_LEN, Snapshot, restore_image};

/// Where the backend, and the store above it, read the time that decides behaviour (when a
/// batch of commits is due to become durable, when a lease was granted): the system's
/// monotonic clock in a member ([`SystemClock`]), a virtual one in the deterministic
/// simulator. Durations that are only measured (metrics) stay on the system clock.
pub trait Clock: Send + Sync + 'static {
    /// The current instant.
    fn now(&self) -> Instant;
}

/// The system's monotonic clock.
#[derive(Clone, Copy, Debug, Default)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now(&self) -> Instant {
        Instant::now()
    }
}

/// Bytes of database pages redb keeps in memory. Pages past it are read from the OS page
/// cache (a `pread` and redb's own lookup per page: about 45% of the member's CPU in a LIST of
/// 5,000 values of 6-10 KiB when they did not fit). etcd keeps its database out of its heap
/// (mmap), and a member's idle memory is what operators compare, so the cache holds the upper
/// levels of the trees and a hot working set, not the data. Measured (issue 38, `bench list`,
/// 200 paginated LISTs of those 5,000 values beside puts at 390/s): p50 95-116 ms with 16 MiB,
/// 41-68 ms with 64 MiB (etcd 3.4: 89-146 ms), member CPU down 40%; 128 MiB gained nothing
/// more. The cost: about 40 MB more at peak there (etcd: 390-530 MB), and an idle member of
/// 100,000 keys at 99-100 MiB instead of 72-73 MiB (etcd 3.4: 111 MiB).
const CACHE_BYTES: usize = 64 * 1024 * 1024;

/// A named table, etcd's bucket.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Bucket(&'static str);

impl Bucket {
    /// Revision -> encoded `mvccpb.KeyValue` (etcd's `key` bucket).
    pub const KEY: Bucket = Bucket("key");
    /// Bookkeeping: consistent index, term, compaction marks, conf state (etcd's `meta`).
    pub const META: Bucket = Bucket("meta");
    /// Lease id -> encoded lease (etcd's `lease`).
    pub const LEASE: Bucket = Bucket("lease");
    /// Member id -> member JSON (etcd's `members`).
    pub const MEMBERS: Bucket = Bucket("members");
    /// Removed member ids (etcd's `members_removed`).
    pub const MEMBERS_REMOVED: Bucket = Bucket("members_removed");
    /// Raised alarms (etcd's `alarm`).
    pub const ALARM: Bucket = Bucket("alarm");
    /// Cluster-wide settings such as the cluster version (etcd's `cluster`).
    pub const CLUSTER: Bucket = Bucket("cluster");
    /// Auth settings, users and roles (etcd's `auth`, `authUsers`, `authRoles`).
    pub const AUTH: Bucket = Bucket("auth");

    /// Every bucket, created when the database is opened.
    pub const ALL: [Bucket; 8] = [
        Bucket::KEY,
        Bucket::META,
        Bucket::LEASE,
        Bucket::MEMBERS,
        Bucket::MEMBERS_REMOVED,
        Bucket::ALARM,
        Bucket::CLUSTER,
        Bucket::AUTH,
    ];

    fn table(self) -> TableDefinition<'static, &'static [u8], &'static [u8]> {
        TableDefinition::new(self.0)
    }

    /// The bucket's name.
    pub fn name(self) -> &'static str {
        self.0
    }
}

/// The backend's own table (not a bucket: no hash, snapshot, copy or export sees it): the
/// stored bytes of every bucket as of the commit that wrote it ([`STORED_BYTES`]), so that an
/// open does not read every pair again to learn [`Backend::size_in_use`].
const STATS: TableDefinition<'static, &'static [u8], &'static [u8]> =
    TableDefinition::new("etcd-rs.stats");
/// Under [`STATS`]: the stored bytes, then the number of pairs over every bucket when they
/// were counted (two big-endian u64). The pair count is checked against the buckets' own on
/// open (redb keeps each table's length, so the check reads nothing): a file changed by a
/// writer that does not keep this record (an older etcd-rs) has other counts and is counted
/// again.
const STORED_BYTES: &[u8] = b"stored_bytes";
/// Under [`STATS`]: the last fill a walk of the file measured (`pages`), trusted with the
/// stored bytes beside it.
const PAGE_FILL: &[u8] = b"page_fill";

/// The bytes of every key and value in `bucket`'s `table`, read one by one (a value stored in
/// pieces counted whole).
fn table_bytes(
    bucket: Bucket,
    table: &impl ReadableTable<&'static [u8], &'static [u8]>,
) -> Result<u64> {
    let mut total = 0u64;
    for item in table.iter().map_err(Error::storage)? {
        let (key, value) = item.map_err(Error::storage)?;
        total += (key.value().len() + pieces::stored_len(bucket, value.value())) as u64;
    }
    Ok(total)
}

/// Pairs over every bucket (redb keeps each table's length: nothing is read).
fn pair_count(tx: &redb::WriteTransaction) -> Result<u64> {
    let mut pairs = 0;
    for bucket in Bucket::ALL {
        let table = tx.open_table(bucket.table()).map_err(Error::storage)?;
        pairs += table.len().map_err(Error::storage)?;
    }
    Ok(pairs)
}

/// The stored bytes the last commit of `tx`'s file recorded ([`STORED_BYTES`]), if the record
/// is there and its pair count is the buckets' own.
fn recorded_stored_bytes(tx: &redb::WriteTransaction) -> Result<Option<u64>> {
    let record = {
        let table = tx.open_table(STATS).map_err(Error::storage)?;
        let stored = table.get(STORED_BYTES).map_err(Error::storage)?;
        stored.map(|record| record.value().to_vec())
    };
    let Some(record) = record else {
        return Ok(None);
    };
    let (Some(bytes), Some(pairs)) = (
        record.get(..8).and_then(|b| <[u8; 8]>::try_from(b).ok()),
        record.get(8..16).and_then(|b| <[u8; 8]>::try_from(b).ok()),
    ) else {
        return Ok(None);
    };
    Ok((u64::from_be_bytes(pairs) == pair_count(tx)?).then(|| u64::from_be_bytes(bytes)))
}

/// Records `bytes` as the stored bytes as of `tx`'s commit, with the pair count.
fn record_stored_bytes(tx: &redb::WriteTransaction, bytes: u64) -> Result<()> {
    let mut record = [0u8; 16];
    record[..8].copy_from_slice(&bytes.to_be_bytes());
    record[8..].copy_from_slice(&pair_count(tx)?.to_be_bytes());
    let mut table = tx.open_table(STATS).map_err(Error::storage)?;
    table
        .insert(STORED_BYTES, record.as_slice())
        .map_err(Error::storage)?;
    Ok(())
}

/// etcd's default `--backend-batch-interval`.
const DEFAULT_BATCH_INTERVAL: Duration = Duration::from_millis(100);
/// etcd's default `--backend-batch-limit`.
const DEFAULT_BATCH_LIMIT: u64 = 10_000;

/// The backend: one database file, one writer at a time.
pub struct Backend {
    /// The open database file. Each transaction holds the one it began on; a
    /// defragmentation swaps in the rewritten file (`defrag`), and the old one closes when
    /// its last reader is done.
    db: RwLock<Arc<redb::Database>>,
    /// The switch of the file in `db`, thrown when another is swapped in (`file`).
    retire: Mutex<file::Retire>,
    /// Keys written while a defragmentation copies the file (`defrag`).
    tracker: defrag::Tracker,
    /// Held by the one defragmentation running.
    defragmenting: Mutex<()>,
    path: PathBuf,
    /// When the last durable commit happened (only the writer updates it).
    last_durable: Mutex<Instant>,
    batch_interval: Duration,
    /// Writes committed since the last durable commit, and how many may wait.
    pending_writes: AtomicU64,
    batch_limit: u64,
    /// Bytes of keys and values stored, over every bucket, as of the last commit.
    logical_bytes: AtomicU64,
    clock: std::sync::Arc<dyn Clock>,
    /// The open found the newest commit damaged and opened the one before it.
    opened_previous_commit: bool,
    /// Batches committed but not yet in the file, oldest first (`batch`): readers take the
    /// list with their read transaction of the file, under this lock.
    layers: RwLock<Arc<batch::Published>>,
    /// Held by the one [`BatchTx`] at a time.
    batch_writer: Mutex<()>,
    /// Held by a [`WriteTx`] from its beginning (when it takes in the published layers) to its
    /// end: one flush at a time.
    flush_lock: Mutex<()>,
    /// The generation the next published layer gets.
    next_generation: AtomicU64,
    /// The newest generation the file holds (committed, maybe not durably).
    flushed_generation: AtomicU64,
    /// The newest generation a durable commit holds.
    durable_generation: AtomicU64,
    /// Bytes of keys and values in the published layers.
    layer_bytes: AtomicU64,
    /// Whether flushes are left to the owner's task (`set_background_flush`).
    background_flush: AtomicBool,
    /// A flush was asked for and has not begun.
    flush_requested: AtomicBool,
    /// Called when a flush is asked for (the owner's task wakes).
    flush_waker: Mutex<Option<FlushWaker>>,
    /// Bytes waiting in layers past which a flush is asked for, and past which a batch flushes
    /// itself ([`SOFT_LIMIT_BYTES`], [`HARD_LIMIT_BYTES`]; smaller in tests).
    layer_limits: (u64, u64),
    /// The pages in use: the last fill measured, and the walk that measures the next.
    pages: pages::PageCount,
}

/// What wakes the task that flushes in the background.
pub type FlushWaker = Box<dyn Fn() + Send + Sync>;

/// A repair callback for redb that sets `fell_back` when the repair falls back to the
/// previous commit. redb 4.6 (`Database::do_repair`) calls the callback at progress 0.0 when
/// a repair starts (every open with the integrity check), then at 0.3 only when the newest
/// commit's trees failed their checksums and it is about to fall back to the previous
/// commit, then at 0.6 and 0.9. An open that then succeeds has fallen back. The backend's
/// tests hold this reading to redb's behaviour.
fn note_fall_back(fell_back: Arc<AtomicBool>) -> impl Fn(&mut redb::RepairSession) + 'static {
    move |session| {
        if (0.2..0.5).contains(&session.progress()) {
            fell_back.store(true, Ordering::Relaxed);
        }
    }
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Runs `f`, which opens and reads the database file `path`, turning a panic of the storage
/// engine into [`Error::Damaged`]. redb trusts its file: on some damage it indexes past a
/// page (found by fuzzing; `crates/backend/fuzz-corpus/image/`). Whatever `f` had opened is
/// dropped during the unwind, and a write transaction it had begun is aborted.
fn contain_engine_panics<T>(path: &Path, f: impl FnOnce() -> Result<T>) -> Result<T> {
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)).unwrap_or_else(|payload| {
        let reason = payload
            .downcast_ref::<String>()
            .cloned()
            .or_else(|| payload.downcast_ref::<&str>().map(|text| text.to_string()))
            .unwrap_or_else(|| "the storage engine panicked".to_string());
        Err(Error::Damaged {
            path: path.to_path_buf(),
            reason,
        })
    })
}

impl Backend {
    /// Open (or create) the database at `path` and make sure every bucket exists. The file
    /// passes redb's integrity check (every page's checksum) and every key is read once (the
    /// logical size), so a damaged file is [`Error::Damaged`] here rather than wrong data or
    /// a panic later.
    pub fn open(path: &Path) -> Result<Backend> {
        contain_engine_panics(path, || Backend::open_unguarded(path))
    }

    fn open_unguarded(path: &Path) -> Result<Backend> {
        let parent = path
            .parent()
            .filter(|p| !p.as_os_str().is_empty())
            .unwrap_or(Path::new("."));
        create_dir_all_synced(parent).map_err(Error::Io)?;
        snapshot::remove_stale(path);
        // A copy a defragmentation left when the process stopped (the file itself is whole).
        let _ = std::fs::remove_file(defrag::copy_path(path));
        // redb caches pages in memory, 1 GiB by default; the OS page cache serves what does not
        // fit, so a small cache keeps the server's memory lean at little cost.
        // Every page of the committed trees is checked against its checksum on open, so a
        // file damaged since it was written (a flipped bit on the disk) is refused here rather
        // than read as data; an unclean shutdown costs the same full read anyway.
        let fell_back = Arc::new(AtomicBool::new(false));
        let mut builder = redb::Builder::new();
        builder
            .set_cache_size(CACHE_BYTES)
            .set_check_integrity_on_open(true)
            .set_repair_callback(note_fall_back(fell_back.clone()));
        let (db, retire) = file::open(&builder, path, true).map_err(|e| match e {
            redb::DatabaseError::Storage(redb::StorageError::Corrupted(reason)) => Error::Damaged {
                path: path.to_path_buf(),
                reason: format!("failed the integrity check ({reason})"),
            },
            e => Error::storage(e),
        })?;
        // The file's name is durable from here on (also one a crash left unsynced), before
        // the first durable commit relies on it.
        sync_dir(parent).map_err(Error::Io)?;
        let opened_previous_commit = fell_back.load(Ordering::Relaxed);
        if opened_previous_commit {
            tracing::warn!(
                path = %path.display(),
                "the newest commit of the database file failed the integrity check (cut short \
                 by a crash or damaged on the disk); opened the previous commit"
            );
        }
        let backend = Backend {
            db: RwLock::new(Arc::new(db)),
            retire: Mutex::new(retire),
            tracker: defrag::Tracker::default(),
            defragmenting: Mutex::new(()),
            path: path.to_path_buf(),
            last_durable: Mutex::new(Instant::now()),
            batch_interval: DEFAULT_BATCH_INTERVAL,
            pending_writes: AtomicU64::new(0),
            batch_limit: DEFAULT_BATCH_LIMIT,
            logical_bytes: AtomicU64::new(0),
            clock: std::sync::Arc::new(SystemClock),
            opened_previous_commit,
            layers: RwLock::new(Arc::new(batch::Published::default())),
            batch_writer: Mutex::new(()),
            flush_lock: Mutex::new(()),
            next_generation: AtomicU64::new(1),
            flushed_generation: AtomicU64::new(0),
            durable_generation: AtomicU64::new(0),
            layer_bytes: AtomicU64::new(0),
            background_flush: AtomicBool::new(false),
            flush_requested: AtomicBool::new(false),
            flush_waker: Mutex::new(None),
            layer_limits: (SOFT_LIMIT_BYTES, HARD_LIMIT_BYTES),
            pages: pages::PageCount::default(),
        };
        let tx = backend.write()?;
        for bucket in Bucket::ALL {
            tx.tx.open_table(bucket.table()).map_err(Error::storage)?;
        }
        pieces::WritePieces::open(&tx.tx)?;
        let stored = match tx.recorded_stored_bytes()? {
            Some(bytes) => {
                match tx.recorded_fill()? {
                    Some(fill) => backend.pages.set_fill(fill),
                    None => backend.pages.want_after(0),
                }
                bytes
            }
            None => {
                backend.pages.want_after(0);
                tx.count_stored_bytes()?
            }
        };
        backend.logical_bytes.store(stored, Ordering::Relaxed);
        // The count is recorded by this commit (and every one after it).
        tx.commit(true)?;
        Ok(backend)
    }

    /// Whether the open found the newest commit damaged (it failed redb's integrity check)
    /// and opened the previous one: the writes of the newest commit are not in this backend.
    pub fn opened_previous_commit(&self) -> bool {
        self.opened_previous_commit
    }

    /// etcd's `--backend-batch-interval` and `--backend-batch-limit` (zero: etcd's defaults).
    pub fn set_batching(&mut self, interval: Duration, limit: u64) {
        self.batch_interval = if interval.is_zero() {
            DEFAULT_BATCH_INTERVAL
        } else {
            interval
        };
        self.batch_limit = if limit == 0 {
            DEFAULT_BATCH_LIMIT
        } else {
            limit
        };
    }

    /// Read the time from `clock` from now on (the batch interval restarts at its now).
    pub fn set_clock(&mut self, clock: std::sync::Arc<dyn Clock>) {
        *lock(&self.last_durable) = clock.now();
        self.clock = clock;
    }

    /// The backend's clock's now.
    pub fn now(&self) -> Instant {
        self.clock.now()
    }

    /// Writes committed since the last durable commit (kept in memory, not yet on disk).
    pub fn pending_writes(&self) -> u64 {
        self.pending_writes.load(Ordering::Relaxed)
    }

    /// etcd's periodic batch commit: when writes wait and the last durable commit is a batch
    /// interval old, or a flush was asked for (the batch limit, or the layers' memory), flush
    /// every published batch to the file and commit durably. Returns whether it committed.
    pub fn commit_if_due(&self) -> Result<bool> {
        let requested = self.flush_requested.swap(false, Ordering::AcqRel);
        let due = self.pending_writes() > 0
            && (requested
                || self
                    .now()
                    .saturating_duration_since(*lock(&self.last_durable))
                    >= self.batch_interval);
        if due {
            self.write()?.commit(true)?;
        }
        Ok(due)
    }

    /// Whether the writes waiting for the owner's next flush have reached the batch limit
    /// (background flushes only; a backend that flushes inline never waits). A bulk writer
    /// that may defer its work (the compaction's deletions) holds its next batch while this
    /// is so; the flush is asked for. Without that hold a flush slowed by the disk (deletions
    /// read their pages first, which at tens of GiB are not all cached) lets the next flush
    /// take in hundreds of thousands of deletions, and one redb transaction that rewrites so
    /// many pages takes them all from the end of the file: redb reuses a page freed by a
    /// commit only once a later commit is durable, so the file grows by about two
    /// transactions' pages (1.1 GiB during a compaction of 5,000,000 revisions at
    /// 10,000,000 keys of 1 KiB).
    pub fn flush_backlogged(&self) -> bool {
        if !self.background_flush.load(Ordering::Acquire)
            || self.pending_writes() < self.batch_limit
        {
            return false;
        }
        self.request_flush();
        true
    }

    /// Leave flushes to the owner (a task calling [`Backend::commit_if_due`] every batch
    /// interval, and when `waker` is called): a [`BatchTx`] commit then never writes the file
    /// itself, unless asked to be durable or the layers outgrow [`HARD_LIMIT_BYTES`].
    /// The pages in use are measured from then on (see the `pages` module), at once when the
    /// open found no measure recorded.
    pub fn set_background_flush(&self, waker: FlushWaker) {
        *lock(&self.flush_waker) = Some(waker);
        self.background_flush.store(true, Ordering::Release);
        self.pages.enable();
        self.pages.after_durable(
            self.current(),
            self.durable_generation(),
            self.stored_bytes(),
            self.now(),
        );
    }

    /// Asks the owner's task for a flush (once until it begins).
    fn request_flush(&self) {
        if !self.flush_requested.swap(true, Ordering::AcqRel)
            && let Some(wake) = lock(&self.flush_waker).as_ref()
        {
            wake();
        }
    }

    /// The generation of the newest batch committed (published) so far: it is durable once
    /// [`Backend::durable_generation`] reaches it.
    pub fn published_generation(&self) -> u64 {
        self.next_generation.load(Ordering::Acquire) - 1
    }

    /// The newest batch generation a durable commit holds.
    pub fn durable_generation(&self) -> u64 {
        self.durable_generation.load(Ordering::Acquire)
    }

    /// Bytes of keys and values committed in batches and not yet in the file.
    pub fn unflushed_bytes(&self) -> u64 {
        self.layer_bytes.load(Ordering::Relaxed)
    }

    /// Makes `layer` visible to every reader (the commit of a [`BatchTx`]).
    fn publish(&self, mut layer: batch::Layer) {
        let mut layers = self
            .layers
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        layer.generation = self.next_generation.fetch_add(1, Ordering::AcqRel);
        self.layer_bytes.fetch_add(layer.bytes, Ordering::Relaxed);
        let mut next = Vec::with_capacity(layers.len() + 1);
        next.extend(layers.iter().cloned());
        next.push(Arc::new(layer));
        *layers = Arc::new(batch::Published::new(next));
    }

    /// The published layers, oldest first.
    fn published(&self) -> Arc<batch::Published> {
        self.layers
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }

    /// Forgets the layers up to generation `through` (the file holds them now, or they were
    /// replaced); returns the writes the remaining ones hold.
    fn drop_layers_through(&self, through: u64) -> u64 {
        let mut layers = self
            .layers
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let keep = layers.partition_point(|l| l.generation <= through);
        let gone: u64 = layers[..keep].iter().map(|l| l.bytes).sum();
        let _ = self
            .layer_bytes
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |v| {
                Some(v.saturating_sub(gone))
            });
        let rest: Vec<_> = layers[keep..].to_vec();
        let writes = rest.iter().map(|l| l.writes).sum();
        *layers = Arc::new(batch::Published::new(rest));
        writes
    }

    /// The interval at which commits become durable (`--backend-batch-interval`).
    pub fn batch_interval(&self) -> Duration {
        self.batch_interval
    }

    /// The path of the database file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Puts `new` in the place of the database file, which it was renamed over: the file
    /// replaced syncs nothing from now on (`file`). Its handles close it.
    fn swap_file(&self, new: redb::Database, retire: file::Retire) {
        *self
            .db
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = Arc::new(new);
        std::mem::replace(&mut *lock(&self.retire), retire).now();
    }

    /// The database file in use now.
    fn current(&self) -> Arc<redb::Database> {
        self.db
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }

    /// Begin the (single) write transaction of the file. It begins by taking in every
    /// batch published so far (a flush: see [`BatchTx`]), so it sees what readers see.
    pub fn write(&self) -> Result<WriteTx<'_>> {
        let flush = lock(&self.flush_lock);
        let (db, tx) = loop {
            let db = self.current();
            let tx = db.begin_write().map_err(Error::storage)?;
            // A defragmentation may have swapped the file while this waited for the writer:
            // a transaction of the old file would write where nobody reads.
            if !Arc::ptr_eq(&db, &self.current()) {
                continue;
            }
            break (db, tx);
        };
        let mut write = WriteTx {
            tx,
            _db: db,
            backend: self,
            delta: std::cell::Cell::new(0),
            writes: std::cell::Cell::new(0),
            puts: std::cell::RefCell::new(Puts::default()),
            changed: self.tracker.active().then(std::cell::RefCell::default),
            absorbed: 0,
            _flush: flush,
        };
        write.absorb()?;
        Ok(write)
    }

    /// Begin a batch of writes held in memory until a flush (see [`BatchTx`]): the store's
    /// apply step. One at a time.
    pub fn batch(&self) -> BatchTx<'_> {
        BatchTx::begin(self)
    }

    /// Begin a read transaction: a consistent point-in-time view of every committed batch.
    pub fn read(&self) -> Result<ReadTx> {
        let layers = self
            .layers
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let db = self.current();
        let tx = db.begin_read().map_err(Error::storage)?;
        let layers = layers.clone();
        Ok(ReadTx {
            tx,
            layers,
            _db: db,
            _open: metrics::OpenRead::begin(),
        })
    }

    /// Bytes the database file takes on the disk (etcd's `dbSize`). redb extends its file
    /// ahead of need, doubling it up to 4 GiB and then a 4 GiB region at a time, and the
    /// extension stays a hole until pages are written there: the file's length overstates what
    /// it holds by up to half, so the blocks allocated to it are counted when fewer (as etcd's
    /// `dbSize` is bbolt's high-water mark of pages, not the length it truncated the file to).
    pub fn size(&self) -> u64 {
        use std::os::unix::fs::MetadataExt;
        std::fs::metadata(&self.path)
            .map(|m| m.len().min(m.blocks().saturating_mul(512)))
            .unwrap_or(0)
    }

    /// Bytes of keys and values stored over every bucket, as of the last commit: what the
    /// quota is checked against. Cheap: kept up to date by the writer rather than measured,
    /// and recorded with each commit, so that an open reads it rather than every pair (a file
    /// without the record, or whose record another writer left behind, is counted on open).
    pub fn stored_bytes(&self) -> u64 {
        self.logical_bytes.load(Ordering::Relaxed)
    }

    /// Bytes of the pages the stored data takes (etcd's `dbSizeInUse`): the stored bytes at
    /// the fill of the file's pages last measured (see the `pages` module), at most the
    /// file's size; the stored bytes alone until a first measure.
    pub fn size_in_use(&self) -> u64 {
        let stored = self.stored_bytes();
        let Some(fill) = self.pages.fill() else {
            return stored;
        };
        // Never less than the keys and values themselves, nor more than the file.
        fill.pages_for(stored).min(self.size()).max(stored)
    }

    /// Asks for the pages in use to be measured again once the batches published so far are
    /// durable (a compaction removed many of their pairs), when the last walk's rest is over
    /// (see the `pages` module).
    pub fn count_pages_again(&self) {
        self.pages.want_after(self.published_generation());
    }

    /// Rewrite the file to reclaim free space (etcd's defragment) while transactions go on:
    /// see the `defrag` module. Writers wait only for the last changes to be copied.
    pub fn defragment(&self) -> Result<()> {
        metrics::DEFRAG_INFLIGHT.set(1);
        let timer = metrics::DEFRAG_SECONDS.start_timer();
        let result = self.rewrite_file();
        timer.observe_duration();
        metrics::DEFRAG_INFLIGHT.set(0);
        result
    }
}

impl Drop for Backend {
    /// A backend closed in order keeps every batch it committed, as a file whose last
    /// commits were not durable does when it is closed: they are flushed durably now (a crash
    /// loses them instead, and raft replays them).
    fn drop(&mut self) {
        self.pages.close();
        if self.published().is_empty() {
            return;
        }
        if let Err(e) = self.write().and_then(|tx| tx.commit(true)) {
            tracing::warn!(path = %self.path.display(), error = %e, "could not commit the last batches when closing the database");
        }
    }
}

impl Backend {
    /// Replace the contents of every bucket with those of the database image at `image` (a
    /// redb file, as [`Backend::snapshot`] writes), in one durable transaction, keeping the
    /// current values of the `meta` keys in `keep_meta`.
    /// A damaged image is [`Error::Damaged`]; the buckets are then as they were.
    pub fn replace_with_image(&self, image: &Path, keep_meta: &[&[u8]]) -> Result<()> {
        contain_engine_panics(image, || self.replace_unguarded(image, keep_meta))
    }

    /// Replace the database with the file at `image` (a redb file this process wrote and
    /// closed, as the import of an etcd leader's snapshot does), keeping the current values
    /// of the `meta` keys in `keep_meta`: the file is renamed over the database and swapped in
    /// with the writer held, as a defragmentation's copy is, rather than copied key by key (a
    /// tenth of the time for a database of a million keys). `image` must be on the
    /// database's file system; it is gone afterwards. A file that does not open is
    /// [`Error::Damaged`], and the database is then as it was.
    pub fn replace_with_file(&self, image: &Path, keep_meta: &[&[u8]]) -> Result<()> {
        contain_engine_panics(image, || self.swap_unguarded(image, keep_meta))
    }

    fn swap_unguarded(&self, image: &Path, keep_meta: &[&[u8]]) -> Result<()> {
        let mut builder = redb::Builder::new();
        builder.set_cache_size(CACHE_BYTES);
        let (new, retire) = file::open(&builder, image, false).map_err(|e| Error::Damaged {
            path: image.to_path_buf(),
            reason: e.to_string(),
        })?;
        // The writer held from here to the swap: no commit lands in the old file meanwhile.
        // It takes in the batches published so far, so the kept keys are their newest values;
        // the rest of them the image replaces.
        let writer = self.write()?;
        let old = writer._db.clone();
        let mut kept = Vec::with_capacity(keep_meta.len());
        for key in keep_meta {
            kept.push((*key, writer.get(Bucket::META, key)?));
        }
        let mut tx = new.begin_write().map_err(Error::storage)?;
        tx.set_durability(redb::Durability::Immediate)
            .map_err(Error::storage)?;
        for bucket in Bucket::ALL {
            tx.open_table(bucket.table()).map_err(Error::storage)?;
        }
        pieces::WritePieces::open(&tx)?;
        // An image our backend wrote (a received snapshot's import) records its stored bytes:
        // they are read, with the kept keys' change, rather than every pair of the image
        // counted here (a second of a member's apply per GiB, which its peers would see as
        // silence).
        let mut stored = recorded_stored_bytes(&tx)?;
        {
            let mut table = tx
                .open_table(Bucket::META.table())
                .map_err(Error::storage)?;
            for (key, value) in &kept {
                let old = match value {
                    Some(value) => table.insert(*key, value.as_slice()),
                    None => table.remove(*key),
                }
                .map_err(Error::storage)?;
                let old_len = old.map_or(0, |v| key.len() + v.value().len()) as u64;
                let new_len = value.as_ref().map_or(0, |v| key.len() + v.len()) as u64;
                stored = stored.map(|bytes| (bytes + new_len).saturating_sub(old_len));
            }
        }
        if let Some(bytes) = stored {
            record_stored_bytes(&tx, bytes)?;
        }
        tx.commit().map_err(Error::storage)?;
        // Every bucket is replaced: a defragmentation under way copies everything again.
        let mut everything = defrag::Changes::default();
        everything.everything();
        self.tracker.record(everything);
        std::fs::rename(image, &self.path).map_err(Error::Io)?;
        let parent = self
            .path
            .parent()
            .filter(|p| !p.as_os_str().is_empty())
            .unwrap_or(Path::new("."));
        sync_dir(parent).map_err(Error::Io)?;
        *lock(&self.last_durable) = self.now();
        self.swap_file(new, retire);
        // Set while the writer is held: no flush can add to the count meanwhile.
        if let Some(bytes) = stored {
            self.logical_bytes.store(bytes, Ordering::Relaxed);
        }
        writer.abandon()?;
        defrag::close_retired(old);
        if stored.is_none() {
            self.recount_logical_bytes()?;
        }
        self.pages.file_replaced(self.current(), self.now());
        Ok(())
    }

    /// Counts the bytes of every key and value anew (after the contents were replaced).
    /// The file is read as of a moment no flush is under way, and the count kept then: each
    /// flush after it adds its own change to the count, so the walk's total replaces only
    /// what the walk saw (the batches not yet flushed are counted by their flush).
    fn recount_logical_bytes(&self) -> Result<()> {
        let (read, before) = {
            let _flush = lock(&self.flush_lock);
            let read = self.current().begin_read().map_err(Error::storage)?;
            (read, self.logical_bytes.load(Ordering::Relaxed))
        };
        let mut total = 0u64;
        for bucket in Bucket::ALL {
            let table = match read.open_table(bucket.table()) {
                Ok(table) => table,
                Err(redb::TableError::TableDoesNotExist(_)) => continue,
                Err(e) => return Err(Error::storage(e)),
            };
            total += table_bytes(bucket, &table)?;
        }
        let _ = self
            .logical_bytes
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |now| {
                let counted = i128::from(now) - i128::from(before) + i128::from(total);
                Some(u64::try_from(counted.max(0)).unwrap_or(u64::MAX))
            });
        Ok(())
    }

    fn replace_unguarded(&self, image: &Path, keep_meta: &[&[u8]]) -> Result<()> {
        let source = redb::ReadOnlyDatabase::open(image).map_err(Error::storage)?;
        let source_tx = source.begin_read().map_err(Error::storage)?;
        let tx = self.write()?;
        let kept: Vec<(Vec<u8>, Option<Vec<u8>>)> = keep_meta
            .iter()
            .map(|key| Ok((key.to_vec(), tx.get(Bucket::META, key)?)))
            .collect::<Result<_>>()?;
        // Every bucket is replaced: a defragmentation under way copies everything again.
        if let Some(changed) = &tx.changed {
            changed.borrow_mut().everything();
        }
        let mut joined = Vec::new();
        let mut walk = None;
        for bucket in Bucket::ALL {
            tx.clear(bucket)?;
            let source_table = match source_tx.open_table(bucket.table()) {
                Ok(table) => table,
                Err(redb::TableError::TableDoesNotExist(_)) => continue,
                Err(e) => return Err(Error::storage(e)),
            };
            for item in source_table.iter().map_err(Error::storage)? {
                let (key, value) = item.map_err(Error::storage)?;
                let value = whole(
                    || pieces::ReadPieces::open(&source_tx),
                    &mut walk,
                    bucket,
                    key.value(),
                    value.value(),
                    &mut joined,
                )?;
                tx.put(bucket, key.value(), value)?;
            }
        }
        for (key, value) in kept {
            match value {
                Some(value) => tx.put(Bucket::META, &key, &value)?,
                None => tx.delete(Bucket::META, &key)?,
            }
        }
        // The byte count restarts from what the image holds.
        tx.delta.set(0);
        tx.commit(true)?;
        self.recount_logical_bytes()?;
        self.pages.file_replaced(self.current(), self.now());
        Ok(())
    }
}

/// The write transaction. Dropping it without [`WriteTx::commit`] aborts it.
pub struct WriteTx<'a> {
    tx: redb::WriteTransaction,
    /// The file it writes (dropped after `tx`).
    _db: Arc<redb::Database>,
    backend: &'a Backend,
    /// Change in stored bytes made by this transaction.
    delta: std::cell::Cell<i64>,
    /// Keys written or removed by this transaction.
    writes: std::cell::Cell<u64>,
    /// Puts not yet in their table (see [`Puts`]).
    puts: std::cell::RefCell<Puts>,
    /// Keys it changed, kept while a defragmentation copies the file.
    changed: Option<std::cell::RefCell<defrag::Changes>>,
    /// The newest batch generation it took in.
    absorbed: u64,
    /// One flush at a time (dropped after `tx`).
    _flush: std::sync::MutexGuard<'a, ()>,
}

/// Consecutive puts into one bucket, held until another operation (or the commit) needs the
/// table: redb's `open_table` looks the table up and, when the handle is dropped, writes its
/// root back, which cost more than the insert itself when every put opened the table. The
/// pairs sit end to end in one buffer that is reused, so holding them allocates nothing in
/// the steady state. Every other operation applies them first, so the transaction sees its
/// own writes in order.
#[derive(Default)]
struct Puts {
    bucket: Option<Bucket>,
    /// Keys and values, end to end.
    bytes: Vec<u8>,
    /// Length of each key and of its value, in order.
    lens: Vec<(usize, usize)>,
}

/// Buffered puts past this many bytes are applied at once.
const PUTS_FLUSH_BYTES: usize = 4 << 20;

/// The fewest bytes of pairs appended past a table's end that go in through a cursor
/// ([`WriteTx::insert_all`]). The cursor may leave one leaf part full where the run ends
/// (about a ninth of a page on average with 1 KiB values), and one branch page holds about
/// 110 children when filled against 55 when split in its middle: the run saves more than it
/// may waste from about 12 leaves on; 16 pages' worth, for a margin.
const APPEND_RUN_MIN_BYTES: usize = 64 << 10;

/// A key and its value, borrowed from wherever they are held.
type Pair<'a> = (&'a [u8], &'a [u8]);

/// Pairs gathered for one [`WriteTx::insert_all`], and their bytes.
#[derive(Default)]
struct Run<'a> {
    pairs: Vec<Pair<'a>>,
    bytes: usize,
}

/// The pairs laid end to end in `bytes`, `lens` giving each key's and value's length.
fn pairs_in<'a>(bytes: &'a [u8], lens: &[(usize, usize)]) -> Vec<Pair<'a>> {
    let mut at = 0;
    lens.iter()
        .map(|&(key_len, value_len)| {
            let key = &bytes[at..at + key_len];
            let value = &bytes[at + key_len..at + key_len + value_len];
            at += key_len + value_len;
            (key, value)
        })
        .collect()
}

/// The value `stored` under `key` of `bucket` stands for: itself, or when it is a head its
/// pieces joined in `joined` through `walk` (begun at the first head met, on the tables that
/// `open` gives): for readers that meet many keys in order, or one.
fn whole<'v>(
    open: impl FnOnce() -> Result<Option<pieces::ReadPieces>>,
    walk: &mut Option<pieces::Walk>,
    bucket: Bucket,
    key: &[u8],
    stored: &'v [u8],
    joined: &'v mut Vec<u8>,
) -> Result<&'v [u8]> {
    let Some(len) = pieces::head_len(bucket, stored) else {
        return Ok(stored);
    };
    let walk = match walk {
        Some(walk) => walk,
        None => {
            let Some(tables) = open()? else {
                return Err(Error::MissingPieces { len, found: 0 });
            };
            walk.insert(pieces::Walk::new(tables))
        }
    };
    walk.join_into(key, len, joined)?;
    Ok(joined.as_slice())
}

/// Whether the keys of a buffer of pairs strictly ascend.
fn ascending(pairs: &[Pair<'_>]) -> bool {
    pairs.windows(2).all(|pair| pair[0].0 < pair[1].0)
}

impl WriteTx<'_> {
    /// Takes in every published batch, oldest first (their writes were counted when they
    /// were published).
    ///
    /// Bucket by bucket: each bucket's writes keep their batches' order, and the puts of
    /// consecutive batches into one bucket (every put's new revision) reach its table as one
    /// run, which `insert_all` can append whole. Batch by batch, the `meta` bucket's
    /// consistent index between them cut the runs short. The tables are independent, so
    /// the order between buckets changes nothing. The pairs go in from the batches' own
    /// buffers, [`PUTS_FLUSH_BYTES`] at a time, never copied into the held puts.
    fn absorb(&mut self) -> Result<()> {
        let layers = self.backend.published();
        self.flush_puts()?;
        for name in Bucket::ALL {
            let mut run = Run::default();
            for bucket in layers.iter().filter_map(|layer| layer.bucket(name)) {
                if bucket.cleared {
                    self.insert_run(name, &mut run)?;
                    self.clear(bucket.bucket)?;
                }
                let mut removed = Vec::new();
                for (key, value) in &bucket.entries {
                    match value {
                        Some(value) => {
                            run.pairs.push((key, value));
                            run.bytes += key.len() + value.len();
                            if run.bytes >= PUTS_FLUSH_BYTES {
                                self.insert_run(name, &mut run)?;
                            }
                        }
                        None => removed.push(key.as_slice()),
                    }
                }
                if !removed.is_empty() {
                    self.insert_run(name, &mut run)?;
                    self.delete_all(bucket.bucket, removed)?;
                }
            }
            self.insert_run(name, &mut run)?;
        }
        if let Some(layer) = layers.last() {
            self.absorbed = layer.generation;
        }
        self.flush_puts()?;
        self.writes.set(0);
        Ok(())
    }

    /// Abort, and forget the batches it took in: the file is being replaced whole
    /// (`Backend::replace_with_file`).
    fn abandon(self) -> Result<()> {
        let absorbed = self.absorbed;
        let backend = self.backend;
        self.tx.abort().map_err(Error::storage)?;
        let left = backend.drop_layers_through(absorbed);
        backend.pending_writes.store(left, Ordering::Relaxed);
        Ok(())
    }

    /// Insert or overwrite `key` in `bucket`.
    pub fn put(&self, bucket: Bucket, key: &[u8], value: &[u8]) -> Result<()> {
        let held = {
            let puts = self.puts.borrow();
            puts.bucket
                .filter(|held| *held != bucket || puts.bytes.len() >= PUTS_FLUSH_BYTES)
                .is_some()
        };
        if held {
            self.flush_puts()?;
        }
        let mut puts = self.puts.borrow_mut();
        puts.bucket = Some(bucket);
        puts.bytes.extend_from_slice(key);
        puts.bytes.extend_from_slice(value);
        puts.lens.push((key.len(), value.len()));
        Ok(())
    }

    /// Insert or overwrite every pair of `batch` in its bucket, in order, from the batch's own
    /// buffer (no copy into the held puts).
    pub fn put_batch(&self, batch: &transfer::Batch) -> Result<()> {
        self.flush_puts()?;
        self.insert_all(batch.bucket, &pairs_in(&batch.bytes, &batch.lens))
    }

    /// The stored bytes recorded by the last commit ([`STATS`]), if its record is there and
    /// its pair count is the buckets' own.
    fn recorded_stored_bytes(&self) -> Result<Option<u64>> {
        recorded_stored_bytes(&self.tx)
    }

    /// Records the stored bytes as of this transaction's commit, with the pair count.
    fn record_stored_bytes(&self) -> Result<()> {
        let bytes = self
            .backend
            .logical_bytes
            .load(Ordering::Relaxed)
            .saturating_add_signed(self.delta.get());
        record_stored_bytes(&self.tx, bytes)?;
        let mut table = self.tx.open_table(STATS).map_err(Error::storage)?;
        if let Some(fill) = self.backend.pages.fill() {
            table
                .insert(PAGE_FILL, fill.encode().as_slice())
                .map_err(Error::storage)?;
        }
        Ok(())
    }

    /// The fill the last walk measured, as recorded beside the stored bytes.
    fn recorded_fill(&self) -> Result<Option<pages::Fill>> {
        let table = self.tx.open_table(STATS).map_err(Error::storage)?;
        let record = table.get(PAGE_FILL).map_err(Error::storage)?;
        Ok(record.and_then(|record| pages::Fill::decode(record.value())))
    }

    /// The keys' and values' bytes over every bucket, counted (on open, when no record is
    /// there to read).
    fn count_stored_bytes(&self) -> Result<u64> {
        self.flush_puts()?;
        let mut total = 0u64;
        for bucket in Bucket::ALL {
            let table = self.tx.open_table(bucket.table()).map_err(Error::storage)?;
            total += table_bytes(bucket, &table)?;
        }
        Ok(total)
    }

    /// Applies the held puts to their table, in order.
    fn flush_puts(&self) -> Result<()> {
        let mut puts = self.puts.borrow_mut();
        let Some(bucket) = puts.bucket.take() else {
            return Ok(());
        };
        let result = self.insert_all(bucket, &pairs_in(&puts.bytes, &puts.lens));
        puts.bytes.clear();
        puts.lens.clear();
        result
    }

    /// Inserts the pairs of `run` into `bucket` and empties it.
    fn insert_run(&self, bucket: Bucket, run: &mut Run<'_>) -> Result<()> {
        self.insert_all(bucket, &run.pairs)?;
        run.pairs.clear();
        run.bytes = 0;
        Ok(())
    }

    /// Inserts `pairs` into `bucket`, in order.
    ///
    /// Pairs that all lie past the table's greatest key, in ascending order, and are many
    /// (new revisions in the `key` bucket: a flush of a loaded member's puts, a restore's, a
    /// received snapshot's) go in through one cursor at the table's end, which redb packs
    /// into full leaves and full branch pages. One insert at a time leaves the leaves full but
    /// splits a full branch page in its middle, and as revisions only append, every left half
    /// stays half full: about 1% of the file at 1,000,000 values of 1 KiB, what made it larger
    /// than etcd's. Fewer pairs (a slow writer's flush) go one by one, because the cursor
    /// balances the last two leaves it builds when the last one would be nearly empty, which
    /// can leave a leaf two-thirds full per run. A long value of the `key` bucket goes in as
    /// its head and its pieces (the `pieces` module), the pieces through a cursor of their
    /// own on the same condition.
    fn insert_all(&self, bucket: Bucket, pairs: &[Pair<'_>]) -> Result<()> {
        if pairs.is_empty() {
            return Ok(());
        }
        let mut table = self.tx.open_table(bucket.table()).map_err(Error::storage)?;
        let mut appended = match (pairs.first(), table.last().map_err(Error::storage)?) {
            (Some(&(first, _)), Some((last, _))) => first > last.value(),
            (Some(_), None) => true,
            (None, _) => false,
        } && ascending(pairs)
            && pairs
                .iter()
                .map(|(key, value)| key.len() + value.len())
                .sum::<usize>()
                >= APPEND_RUN_MIN_BYTES;
        // The long values' pieces (see the `pieces` module) go in through a cursor of their
        // own, when they too lie past every piece there.
        // The first long value's key, and whether every long value's key has its length (the
        // pieces then ascend with the keys: a key that begins with another could put its
        // pieces among the other's).
        let (first_long, same_lengths) = {
            let mut first: Option<&[u8]> = None;
            let mut same = true;
            for &(key, value) in pairs {
                if pieces::cut(bucket, key, value) {
                    let first = *first.get_or_insert(key);
                    same &= first.len() == key.len();
                }
            }
            (first, same)
        };
        appended &= same_lengths;
        let mut pieces_tables = match first_long {
            Some(_) => Some(pieces::WritePieces::open(&self.tx)?),
            None => None,
        };
        if appended && let (Some(key), Some(tables)) = (first_long, &pieces_tables) {
            let first = pieces::PieceKey::new(key, 0);
            for table in [&tables.large, &tables.small] {
                if let Some((last, _)) = table.last().map_err(Error::storage)? {
                    appended &= first.as_slice() > last.value();
                }
            }
        }
        if appended {
            let (mut large_cursor, mut small_cursor) = match pieces_tables.as_mut() {
                Some(tables) => (
                    Some(
                        tables
                            .large
                            .upper_bound_mut(std::ops::Bound::<&[u8]>::Unbounded)
                            .map_err(Error::storage)?,
                    ),
                    Some(
                        tables
                            .small
                            .upper_bound_mut(std::ops::Bound::<&[u8]>::Unbounded)
                            .map_err(Error::storage)?,
                    ),
                ),
                None => (None, None),
            };
            let mut cursor = table
                .upper_bound_mut(std::ops::Bound::<&[u8]>::Unbounded)
                .map_err(Error::storage)?;
            for &(key, value) in pairs {
                self.note(bucket, key);
                match (large_cursor.as_mut(), small_cursor.as_mut()) {
                    (Some(large_cursor), Some(small_cursor)) if pieces::cut(bucket, key, value) => {
                        cursor
                            .insert_before(key, pieces::head(value.len()).as_slice())
                            .map_err(Error::storage)?;
                        let cut = pieces::Cut::new(key, value);
                        for (piece_key, piece) in cut.large() {
                            large_cursor
                                .insert_before(piece_key.as_slice(), piece)
                                .map_err(Error::storage)?;
                        }
                        for (piece_key, piece) in cut.small() {
                            small_cursor
                                .insert_before(piece_key.as_slice(), piece)
                                .map_err(Error::storage)?;
                        }
                    }
                    _ => cursor.insert_before(key, value).map_err(Error::storage)?,
                }
                self.add((key.len() + value.len()) as i64);
            }
            cursor.close().map_err(Error::storage)?;
            for pieces_cursor in [large_cursor, small_cursor].into_iter().flatten() {
                pieces_cursor.close().map_err(Error::storage)?;
            }
        } else {
            for &(key, value) in pairs {
                self.insert_one(&mut table, &mut pieces_tables, bucket, key, value)?;
            }
        }
        self.writes.set(self.writes.get() + pairs.len() as u64);
        Ok(())
    }

    /// Inserts or overwrites one pair (in pieces when long: `pieces`, the pieces' table,
    /// opened when first needed), counting the change in stored bytes.
    fn insert_one<'t>(
        &'t self,
        table: &mut redb::Table<'_, &'static [u8], &'static [u8]>,
        pieces: &mut Option<pieces::WritePieces<'t>>,
        bucket: Bucket,
        key: &[u8],
        value: &[u8],
    ) -> Result<()> {
        self.note(bucket, key);
        let old = pieces::insert(bucket, table, pieces, &self.tx, key, value)?;
        let old_len = old.map(|len| key.len() + len).unwrap_or(0);
        self.add((key.len() + value.len()) as i64 - old_len as i64);
        Ok(())
    }

    /// Removes the pieces of the value `key` had, when its `stored` value was a head;
    /// returns the whole value's length.
    fn remove_pieces<'t>(
        &'t self,
        pieces: &mut Option<pieces::WritePieces<'t>>,
        bucket: Bucket,
        key: &[u8],
        stored: &[u8],
    ) -> Result<usize> {
        let Some(len) = pieces::head_len(bucket, stored) else {
            return Ok(stored.len());
        };
        if pieces.is_none() {
            *pieces = Some(pieces::WritePieces::open(&self.tx)?);
        }
        if let Some(table) = pieces.as_mut() {
            table.remove(key)?;
        }
        Ok(len)
    }

    /// Remove `key` from `bucket`.
    pub fn delete(&self, bucket: Bucket, key: &[u8]) -> Result<()> {
        self.delete_all(bucket, [key])?;
        Ok(())
    }

    /// Remove each of `keys` from `bucket` under one open table (a compaction's batch);
    /// returns how many were there.
    pub fn delete_all<'k>(
        &self,
        bucket: Bucket,
        keys: impl IntoIterator<Item = &'k [u8]>,
    ) -> Result<u64> {
        self.flush_puts()?;
        let mut table = self.tx.open_table(bucket.table()).map_err(Error::storage)?;
        let mut pieces = None;
        let mut removed = 0;
        let mut bytes = 0i64;
        for key in keys {
            self.note(bucket, key);
            if let Some(old) = table.remove(key).map_err(Error::storage)? {
                removed += 1;
                let len = self.remove_pieces(&mut pieces, bucket, key, old.value())?;
                bytes += (key.len() + len) as i64;
            }
        }
        self.add(-bytes);
        self.writes.set(self.writes.get() + removed);
        Ok(removed)
    }

    /// Remove every key in `[start, end)` from `bucket`; returns how many were removed.
    pub fn delete_range(&self, bucket: Bucket, start: &[u8], end: &[u8]) -> Result<u64> {
        self.flush_puts()?;
        let mut table = self.tx.open_table(bucket.table()).map_err(Error::storage)?;
        let mut removed = 0;
        let mut bytes = 0i64;
        let mut heads = Vec::new();
        for item in table
            .extract_from_if(start..end, |_, _| true)
            .map_err(Error::storage)?
        {
            let (k, v) = item.map_err(Error::storage)?;
            self.note(bucket, k.value());
            removed += 1;
            bytes += (k.value().len() + pieces::stored_len(bucket, v.value())) as i64;
            if pieces::head_len(bucket, v.value()).is_some() {
                heads.push((k.value().to_vec(), v.value().to_vec()));
            }
        }
        let mut pieces = None;
        for (key, head) in heads {
            self.remove_pieces(&mut pieces, bucket, &key, &head)?;
        }
        self.add(-bytes);
        self.writes.set(self.writes.get() + removed);
        Ok(removed)
    }

    /// Remove every pair from `bucket`; returns how many were removed.
    pub fn clear(&self, bucket: Bucket) -> Result<u64> {
        self.flush_puts()?;
        if let Some(changed) = &self.changed {
            changed.borrow_mut().everything();
        }
        let mut table = self.tx.open_table(bucket.table()).map_err(Error::storage)?;
        let mut removed = 0;
        let mut bytes = 0i64;
        for item in table.extract_if(|_, _| true).map_err(Error::storage)? {
            let (k, v) = item.map_err(Error::storage)?;
            removed += 1;
            bytes += (k.value().len() + pieces::stored_len(bucket, v.value())) as i64;
        }
        if bucket == Bucket::KEY {
            pieces::WritePieces::open(&self.tx)?.clear()?;
        }
        self.add(-bytes);
        Ok(removed)
    }

    fn add(&self, bytes: i64) {
        self.delta.set(self.delta.get() + bytes);
    }

    /// Keeps `key` for a defragmentation under way, which copies it again.
    fn note(&self, bucket: Bucket, key: &[u8]) {
        if let Some(changed) = &self.changed {
            changed.borrow_mut().key(bucket, key);
        }
    }

    /// Read `key` as this transaction sees it.
    pub fn get(&self, bucket: Bucket, key: &[u8]) -> Result<Option<Vec<u8>>> {
        self.flush_puts()?;
        let table = self.tx.open_table(bucket.table()).map_err(Error::storage)?;
        let Some(stored) = table.get(key).map_err(Error::storage)? else {
            return Ok(None);
        };
        if pieces::head_len(bucket, stored.value()).is_none() {
            return Ok(Some(stored.value().to_vec()));
        }
        let mut joined = Vec::new();
        if let Some(len) = pieces::head_len(bucket, stored.value()) {
            pieces::WritePieces::open(&self.tx)?.join_into(key, len, &mut joined)?;
        }
        Ok(Some(joined))
    }

    /// Commit. With `durable == false` the commit is made durable anyway when the last durable
    /// commit is older than the backend's force-commit interval (etcd's `batch-interval`).
    /// Returns whether this commit was durable.
    pub fn commit(mut self, durable: bool) -> Result<bool> {
        self.flush_puts()?;
        let now = self.backend.now();
        let pending = self.backend.pending_writes.load(Ordering::Relaxed) + self.writes.get();
        let durable = durable
            || pending >= self.backend.batch_limit
            || now.saturating_duration_since(*lock(&self.backend.last_durable))
                >= self.backend.batch_interval;
        let level = if durable {
            Durability::Immediate
        } else {
            Durability::None
        };
        self.tx.set_durability(level).map_err(Error::storage)?;
        // Handed over while this transaction still holds the writer: a defragmentation takes
        // them only while it holds the writer itself, so it never takes keys whose commit it
        // cannot read, nor reads a commit whose keys it has not taken (a failed commit only
        // copies some keys again).
        if let Some(changed) = self.changed.take() {
            self.backend.tracker.record(changed.into_inner());
        }
        self.record_stored_bytes()?;
        let started = Instant::now();
        self.tx.commit().map_err(Error::storage)?;
        // etcd's commit is the periodic one that reaches the disk (every batch interval or
        // batch limit); ours in between stay in memory and are not counted.
        if durable {
            let seconds = started.elapsed().as_secs_f64();
            metrics::COMMIT_SECONDS.observe(seconds);
            metrics::COMMIT_WRITE_SECONDS.observe(seconds);
        }
        let backend = self.backend;
        if durable {
            *lock(&backend.last_durable) = now;
        }
        if self.absorbed > 0 {
            backend
                .flushed_generation
                .fetch_max(self.absorbed, Ordering::AcqRel);
        }
        let left = backend.drop_layers_through(self.absorbed);
        if durable {
            let flushed = backend.flushed_generation.load(Ordering::Acquire);
            backend
                .durable_generation
                .fetch_max(flushed, Ordering::AcqRel);
        }
        let waiting = if durable { left } else { pending };
        backend.pending_writes.store(waiting, Ordering::Relaxed);
        let delta = self.delta.get();
        let logical = &self.backend.logical_bytes;
        let _ = logical.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |v| {
            Some(v.saturating_add_signed(delta))
        });
        if durable {
            backend.pages.after_durable(
                backend.current(),
                backend.durable_generation(),
                backend.stored_bytes(),
                now,
            );
        }
        Ok(durable)
    }
}

/// A read transaction: a snapshot of every committed batch at the time it began (the file's
/// last commit, with the batches published since over it).
pub struct ReadTx {
    tx: redb::ReadTransaction,
    /// Batches committed and not in `tx`'s commit of the file, oldest first.
    layers: Arc<batch::Published>,
    /// The file it reads (dropped after `tx`).
    _db: Arc<redb::Database>,
    /// Counted in `etcd_mvcc_db_open_read_transactions` while it lives.
    _open: metrics::OpenRead,
}

type Table = redb::ReadOnlyTable<&'static [u8], &'static [u8]>;

/// A value as a reader meets it: whole, from a batch not yet in the file, or as the file
/// stores it (maybe a head of pieces).
enum Met<'a> {
    Whole(&'a [u8]),
    Stored(&'a [u8]),
}

/// Joins the long values a reader meets (see [`whole`]), keeping its walk and its buffer from
/// one to the next.
#[derive(Default)]
struct Joiner {
    walk: Option<pieces::Walk>,
    joined: Vec<u8>,
}

impl Joiner {
    /// The whole value `met` under `key` stands for.
    fn value<'a>(
        &'a mut self,
        read: &ReadTx,
        bucket: Bucket,
        key: &[u8],
        met: Met<'a>,
    ) -> Result<&'a [u8]> {
        match met {
            Met::Whole(value) => Ok(value),
            Met::Stored(stored) => whole(
                || read.pieces(),
                &mut self.walk,
                bucket,
                key,
                stored,
                &mut self.joined,
            ),
        }
    }
}

impl Met<'_> {
    /// The length of the value it stands for.
    fn len(&self, bucket: Bucket) -> usize {
        match self {
            Met::Whole(value) => value.len(),
            Met::Stored(stored) => pieces::stored_len(bucket, stored),
        }
    }
}

impl ReadTx {
    fn table(&self, bucket: Bucket) -> Result<Table> {
        self.tx.open_table(bucket.table()).map_err(Error::storage)
    }

    /// The tables of long values' pieces (see the `pieces` module), if the file has them.
    fn pieces(&self) -> Result<Option<pieces::ReadPieces>> {
        pieces::ReadPieces::open(&self.tx)
    }

    /// Read `key`.
    pub fn get(&self, bucket: Bucket, key: &[u8]) -> Result<Option<Vec<u8>>> {
        match self.layers.lookup(bucket, key) {
            batch::Seen::Value(value) => return Ok(Some(value.to_vec())),
            batch::Seen::Gone => return Ok(None),
            batch::Seen::Unknown => {}
        }
        let table = self.table(bucket)?;
        let Some(stored) = table.get(key).map_err(Error::storage)? else {
            return Ok(None);
        };
        let mut joined = Vec::new();
        let value = whole(
            || self.pieces(),
            &mut None,
            bucket,
            key,
            stored.value(),
            &mut joined,
        )?;
        Ok(Some(value.to_vec()))
    }

    /// Look up each of `keys` in `bucket` under one open table, handing `visit` the key and
    /// its value (as stored, without a copy, unless it was stored in pieces), until `visit`
    /// returns `false`.
    pub fn get_each<K: AsRef<[u8]>>(
        &self,
        bucket: Bucket,
        keys: impl IntoIterator<Item = K>,
        mut visit: impl FnMut(&[u8], Option<&[u8]>) -> bool,
    ) -> Result<()> {
        let mut joiner = Joiner::default();
        self.get_each_met(bucket, keys, |key, met| {
            let value = match met {
                Some(met) => Some(joiner.value(self, bucket, key, met)?),
                None => None,
            };
            Ok(visit(key, value))
        })
    }

    /// [`Self::get_each`] handing `visit` each value's length only (a value stored in pieces
    /// is not read).
    pub fn get_each_len<K: AsRef<[u8]>>(
        &self,
        bucket: Bucket,
        keys: impl IntoIterator<Item = K>,
        mut visit: impl FnMut(&[u8], Option<usize>) -> bool,
    ) -> Result<()> {
        self.get_each_met(bucket, keys, |key, met| {
            Ok(visit(key, met.map(|met| met.len(bucket))))
        })
    }

    fn get_each_met<K: AsRef<[u8]>>(
        &self,
        bucket: Bucket,
        keys: impl IntoIterator<Item = K>,
        mut visit: impl FnMut(&[u8], Option<Met<'_>>) -> Result<bool>,
    ) -> Result<()> {
        let table = self.table(bucket)?;
        for key in keys {
            let key = key.as_ref();
            let go_on = match self.layers.lookup(bucket, key) {
                batch::Seen::Value(value) => visit(key, Some(Met::Whole(value)))?,
                batch::Seen::Gone => visit(key, None)?,
                batch::Seen::Unknown => match table.get(key).map_err(Error::storage)? {
                    Some(stored) => visit(key, Some(Met::Stored(stored.value())))?,
                    None => visit(key, None)?,
                },
            };
            if !go_on {
                break;
            }
        }
        Ok(())
    }

    /// Visit every pair in `[start, end)` in key order (`end == None`: to the end of the
    /// bucket) until `visit` returns `false`.
    pub fn for_each_in(
        &self,
        bucket: Bucket,
        start: &[u8],
        end: Option<&[u8]>,
        mut visit: impl FnMut(&[u8], &[u8]) -> bool,
    ) -> Result<()> {
        let mut joiner = Joiner::default();
        self.for_each_met_in(bucket, start, end, |key, met| {
            Ok(visit(key, joiner.value(self, bucket, key, met)?))
        })
    }

    /// [`Self::for_each_in`] handing `visit` each value's length only (a value stored in
    /// pieces is not read).
    pub fn for_each_len_in(
        &self,
        bucket: Bucket,
        start: &[u8],
        end: Option<&[u8]>,
        mut visit: impl FnMut(&[u8], usize) -> bool,
    ) -> Result<()> {
        self.for_each_met_in(bucket, start, end, |key, met| {
            Ok(visit(key, met.len(bucket)))
        })
    }

    fn for_each_met_in(
        &self,
        bucket: Bucket,
        start: &[u8],
        end: Option<&[u8]>,
        mut visit: impl FnMut(&[u8], Met<'_>) -> Result<bool>,
    ) -> Result<()> {
        let (newer, cleared) = batch::range(&self.layers, bucket, start, end);
        let mut newer = newer.into_iter().peekable();
        if !cleared {
            let table = self.table(bucket)?;
            let iter = match end {
                Some(end) => table.range(start..end),
                None => table.range(start..),
            }
            .map_err(Error::storage)?;
            for item in iter {
                let (key, value) = item.map_err(Error::storage)?;
                let key = key.value();
                // The batches' keys up to this one first; this one, when they wrote it, is
                // theirs.
                let mut theirs = false;
                while let Some((newer_key, newer_value)) = newer.next_if(|(k, _)| *k <= key) {
                    theirs |= newer_key == key;
                    if let Some(newer_value) = newer_value
                        && !visit(newer_key, Met::Whole(newer_value))?
                    {
                        return Ok(());
                    }
                }
                if theirs {
                    continue;
                }
                if !visit(key, Met::Stored(value.value()))? {
                    return Ok(());
                }
            }
        }
        for (key, value) in newer {
            if let Some(value) = value
                && !visit(key, Met::Whole(value))?
            {
                break;
            }
        }
        Ok(())
    }

    /// [`Self::for_each_in`] with a visitor that can fail: its first error ends the walk and
    /// is returned (as is the backend's, converted); `Ok(false)` ends it without one.
    pub fn try_for_each_in<E: From<Error>>(
        &self,
        bucket: Bucket,
        start: &[u8],
        end: Option<&[u8]>,
        mut visit: impl FnMut(&[u8], &[u8]) -> std::result::Result<bool, E>,
    ) -> std::result::Result<(), E> {
        let mut failure = None;
        self.for_each_in(bucket, start, end, |key, value| match visit(key, value) {
            Ok(go_on) => go_on,
            Err(e) => {
                failure = Some(e);
                false
            }
        })?;
        failure.map_or(Ok(()), Err)
    }

    /// Number of pairs in `bucket`.
    pub fn len(&self, bucket: Bucket) -> Result<u64> {
        let (newer, cleared) = batch::range(&self.layers, bucket, &[], None);
        if cleared {
            return Ok(newer.values().filter(|v| v.is_some()).count() as u64);
        }
        let table = self.table(bucket)?;
        let mut len = table.len().map_err(Error::storage)?;
        for (key, value) in newer {
            let on_file = table.get(key).map_err(Error::storage)?.is_some();
            match (on_file, value.is_some()) {
                (false, true) => len += 1,
                (true, false) => len = len.saturating_sub(1),
                _ => {}
            }
        }
        Ok(len)
    }

    /// The last pair of `bucket` in key order.
    pub fn last(&self, bucket: Bucket) -> Result<Option<(Vec<u8>, Vec<u8>)>> {
        let (newer, cleared) = batch::range(&self.layers, bucket, &[], None);
        let newest = newer
            .iter()
            .rev()
            .find_map(|(k, v)| v.map(|v| (k.to_vec(), v.to_vec())));
        if cleared {
            return Ok(newest);
        }
        let table = self.table(bucket)?;
        let mut on_file = None;
        for item in table.iter().map_err(Error::storage)?.rev() {
            let (key, value) = item.map_err(Error::storage)?;
            // A key the batches wrote is theirs: `newest` has it if it still exists.
            if newer.contains_key(key.value()) {
                continue;
            }
            let mut joined = Vec::new();
            let value = whole(
                || self.pieces(),
                &mut None,
                bucket,
                key.value(),
                value.value(),
                &mut joined,
            )?;
            on_file = Some((key.value().to_vec(), value.to_vec()));
            break;
        }
        Ok(match (newest, on_file) {
            (Some(a), Some(b)) => Some(if a.0 >= b.0 { a } else { b }),
            (a, b) => a.or(b),
        })
    }

    /// Names of every bucket in the database, sorted (bbolt's bucket order): every table but
    /// the backend's own [`STATS`].
    fn bucket_names(&self) -> Result<Vec<String>> {
        let mut names: Vec<String> = self
            .tx
            .list_tables()
            .map_err(Error::storage)?
            .map(|t| t.name().to_string())
            .filter(|name| {
                name != STATS.name() && name != pieces::TABLE.name() && name != pieces::LARGE.name()
            })
            .collect();
        names.sort();
        Ok(names)
    }

    /// Every bucket of the file with its name, in name order; `None` for a table that is not
    /// one of ours (read as it is on the file).
    fn buckets(&self) -> Result<Vec<(String, Option<Bucket>)>> {
        Ok(self
            .bucket_names()?
            .into_iter()
            .map(|name| {
                let ours = Bucket::ALL.into_iter().find(|b| b.name() == name);
                (name, ours)
            })
            .collect())
    }

    /// Number of pairs over every bucket (etcd's "total keys" of a snapshot).
    pub fn total_len(&self) -> Result<u64> {
        let mut total = 0;
        for (name, ours) in self.buckets()? {
            total += match ours {
                Some(bucket) => self.len(bucket)?,
                None => self
                    .tx
                    .open_table(TableDefinition::<&[u8], &[u8]>::new(&name))
                    .map_err(Error::storage)?
                    .len()
                    .map_err(Error::storage)?,
            };
        }
        Ok(total)
    }

    /// etcd's backend hash (`backend.Hash`): CRC-32C over, for every bucket in name order,
    /// the bucket's name and then each pair's key and value in key order, leaving out the
    /// pairs named in `ignore`.
    pub fn hash(&self, ignore: &[(Bucket, &[u8])]) -> Result<u32> {
        let mut crc = crc32c::Crc32c::new();
        for (name, ours) in self.buckets()? {
            crc.update(name.as_bytes());
            let mut add = |key: &[u8], value: &[u8]| {
                if !ignore.iter().any(|(b, k)| b.name() == name && *k == key) {
                    crc.update(key);
                    crc.update(value);
                }
                true
            };
            match ours {
                Some(bucket) => self.for_each_in(bucket, &[], None, add)?,
                None => {
                    let table = self
                        .tx
                        .open_table(TableDefinition::<&[u8], &[u8]>::new(&name))
                        .map_err(Error::storage)?;
                    for item in table.iter().map_err(Error::storage)? {
                        let (key, value) = item.map_err(Error::storage)?;
                        add(key.value(), value.value());
                    }
                }
            }
        }
        Ok(crc.sum())
    }
}

#[cfg(test)]
mod tests;
