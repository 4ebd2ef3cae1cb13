//! The pages the stored data takes in the file (etcd's `dbSizeInUse`).
//!
//! etcd reports as in use every page of the file that is not on bbolt's freelist: the keys
//! and values with the room their pages leave unfilled. An operator compares it with the
//! file's size to know what a defragmentation would give back, and tools act on the
//! difference (a defragmentation when the file is some hundreds of MiB past what is in use).
//! Counting keys and values alone would show a freshly defragmented file of 1 KiB values as
//! a quarter free (a 4 KiB page holds three of them), and such a tool would defragment it
//! again and again.
//!
//! redb keeps no running count of the pages its trees hold that a user can read: the count
//! is a walk of every page of every tree (about 3 us a page from the page cache: a second a
//! GiB). So a walk measures the *fill*, the bytes of pages per stored byte of keys and
//! values, and between walks the pages in use are the stored bytes (kept up to date by every
//! commit) at that fill. A walk runs on a thread of its own, over a read transaction of the
//! file, so no writer or reader waits for it; it is started after a durable commit when
//! asked for (a compaction finished, an open that found no recorded fill) or when the stored
//! bytes moved by half since the last one, and never sooner after the last one than
//! [`REST_FACTOR`] times what that one took (a walk of a 10 GiB file costs about ten seconds
//! of one core: walks take at most about 1% of a core, and a small file is measured often).
//! A file rewritten (defragmented) or replaced (a snapshot installed) is walked at once. The
//! last fill is recorded with each commit beside the stored bytes, so that an open does not
//! walk the file again. Only a member's backend walks (the offline tools and the simulator
//! never do), and closing the backend waits for the walk under way.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use redb::{ReadableDatabase, ReadableTableMetadata, TableHandle};

use crate::{Bucket, Error, Result, lock};

/// After a walk, the next waits at least this many times as long as it took...
const REST_FACTOR: u32 = 100;
/// ... and at least this long.
const MIN_REST: Duration = Duration::from_secs(1);

/// What a walk of the file's trees found: the bytes of the pages they take and the bytes of
/// keys and values in them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Fill {
    pub(crate) page_bytes: u64,
    pub(crate) stored_bytes: u64,
}

impl Fill {
    /// The bytes of pages that `stored` bytes of keys and values take at this fill (the
    /// stored bytes themselves before anything was measured).
    pub(crate) fn pages_for(&self, stored: u64) -> u64 {
        if self.stored_bytes == 0 {
            return stored;
        }
        let scaled =
            u128::from(stored) * u128::from(self.page_bytes) / u128::from(self.stored_bytes);
        u64::try_from(scaled).unwrap_or(u64::MAX)
    }

    /// Whether `stored` has moved by half of what this fill was measured on (any growth from
    /// an empty file).
    fn drifted(&self, stored: u64) -> bool {
        stored.abs_diff(self.stored_bytes).saturating_mul(2) > self.stored_bytes
    }

    /// The record kept in the backend's own table: page bytes, then stored bytes.
    pub(crate) fn encode(&self) -> [u8; 16] {
        let mut record = [0u8; 16];
        record[..8].copy_from_slice(&self.page_bytes.to_be_bytes());
        record[8..].copy_from_slice(&self.stored_bytes.to_be_bytes());
        record
    }

    pub(crate) fn decode(record: &[u8]) -> Option<Fill> {
        let page_bytes = record.get(..8).and_then(|b| <[u8; 8]>::try_from(b).ok())?;
        let stored_bytes = record
            .get(8..16)
            .and_then(|b| <[u8; 8]>::try_from(b).ok())?;
        Some(Fill {
            page_bytes: u64::from_be_bytes(page_bytes),
            stored_bytes: u64::from_be_bytes(stored_bytes),
        })
    }
}

/// The backend's count of its pages in use: the last fill, and the walk that measures the
/// next one.
#[derive(Default)]
pub(crate) struct PageCount {
    state: Arc<Mutex<State>>,
    /// The walk under way (or done and not yet joined).
    walk: Mutex<Option<JoinHandle<()>>>,
    /// Bumped when the file is rewritten or replaced: a walk of the file before does not
    /// count.
    file: Arc<AtomicU64>,
}

#[derive(Default)]
struct State {
    fill: Option<Fill>,
    /// When the last walk began, and how long the next waits after that.
    walked_at: Option<Instant>,
    rest: Duration,
    /// A walk is wanted once the batches up to this generation are durable.
    wanted_after: Option<u64>,
    /// Walks may start: the backend serves a member (it flushes in the background). The
    /// offline tools and the simulator never walk.
    enabled: bool,
    /// No walk starts any more (the backend is closing).
    closed: bool,
}

impl PageCount {
    /// The last fill known.
    pub(crate) fn fill(&self) -> Option<Fill> {
        lock(&self.state).fill
    }

    /// Takes the fill an open read from the file's record.
    pub(crate) fn set_fill(&self, fill: Fill) {
        lock(&self.state).fill = Some(fill);
    }

    /// Lets walks start from now on.
    pub(crate) fn enable(&self) {
        lock(&self.state).enabled = true;
    }

    /// Asks for a walk once the batches published up to `generation` are durable.
    pub(crate) fn want_after(&self, generation: u64) {
        let mut state = lock(&self.state);
        state.wanted_after = Some(state.wanted_after.map_or(generation, |g| g.max(generation)));
    }

    /// The file was rewritten or replaced: a walk of the old one under way does not count,
    /// and the new one is walked now.
    pub(crate) fn file_replaced(&self, db: Arc<redb::Database>, now: Instant) {
        self.file.fetch_add(1, Ordering::AcqRel);
        lock(&self.state).wanted_after = Some(0);
        // A walk of the old file is let finish (its fill is not kept) rather than left to
        // hold the new walk back.
        if let Some(walk) = lock(&self.walk).take() {
            let _ = walk.join();
        }
        self.after_durable(db, 0, 0, now);
    }

    /// After a durable commit holding the batches up to `durable` with `stored` bytes of keys
    /// and values: starts a walk if one is wanted or the stored bytes drifted, none runs, and
    /// the last one's rest is over (see the module docs).
    pub(crate) fn after_durable(
        &self,
        db: Arc<redb::Database>,
        durable: u64,
        stored: u64,
        now: Instant,
    ) {
        let mut walk = lock(&self.walk);
        if walk.as_ref().is_some_and(|w| !w.is_finished()) {
            return;
        }
        {
            let mut state = lock(&self.state);
            if state.closed || !state.enabled {
                return;
            }
            let asked = state.wanted_after.is_some_and(|g| durable >= g);
            let drifted = state.fill.is_none_or(|f| f.drifted(stored));
            let rested = state
                .walked_at
                .is_none_or(|at| now.saturating_duration_since(at) >= state.rest);
            // A wholesale change of the file (`wanted_after == 0`) does not wait.
            let at_once = state.wanted_after == Some(0);
            if !(at_once || (rested && (asked || drifted))) {
                return;
            }
            state.wanted_after = None;
            state.walked_at = Some(now);
            // Until it ends, no other starts (the handle says so) and its rest is unknown.
            state.rest = Duration::MAX;
        }
        if let Some(done) = walk.take() {
            let _ = done.join();
        }
        let state = self.state.clone();
        let file = self.file.clone();
        let epoch = file.load(Ordering::Acquire);
        let spawned = std::thread::Builder::new()
            .name("backend-pages".into())
            .spawn(move || {
                let started = Instant::now();
                tracing::debug!(stored, "counting the database's pages in use");
                let measured = measure(&db);
                let took = started.elapsed();
                let mut state = lock(&state);
                state.rest = took.saturating_mul(REST_FACTOR).max(MIN_REST);
                match measured {
                    Ok(fill) if file.load(Ordering::Acquire) == epoch => {
                        tracing::debug!(
                            ?took,
                            page_bytes = fill.page_bytes,
                            stored_bytes = fill.stored_bytes,
                            "counted the database's pages in use"
                        );
                        state.fill = Some(fill);
                    }
                    Ok(_) => {}
                    Err(e) => {
                        tracing::warn!(error = %e, "could not count the database's pages in use");
                    }
                }
            });
        match spawned {
            Ok(handle) => *walk = Some(handle),
            Err(e) => {
                lock(&self.state).rest = MIN_REST;
                tracing::warn!(error = %e, "could not start counting the database's pages in use");
            }
        }
    }

    /// No walk starts from now on, and the one under way is waited for.
    pub(crate) fn close(&self) {
        lock(&self.state).closed = true;
        if let Some(walk) = lock(&self.walk).take() {
            let _ = walk.join();
        }
    }

    /// Waits for the walk under way, if any (tests).
    #[cfg(test)]
    pub(crate) fn wait(&self) {
        if let Some(walk) = lock(&self.walk).take() {
            let _ = walk.join();
        }
    }

    /// Whether a walk is under way (tests).
    #[cfg(test)]
    pub(crate) fn walking(&self) -> bool {
        lock(&self.walk).as_ref().is_some_and(|w| !w.is_finished())
    }

    /// Ends the last walk's rest now (tests).
    #[cfg(test)]
    pub(crate) fn rest_over(&self) {
        lock(&self.state).rest = Duration::ZERO;
    }
}

/// Walks every bucket's tree in the file's last commit.
fn measure(db: &redb::Database) -> Result<Fill> {
    let read = db.begin_read().map_err(Error::storage)?;
    let mut fill = Fill {
        page_bytes: 0,
        stored_bytes: 0,
    };
    let tables = Bucket::ALL
        .into_iter()
        .map(Bucket::table)
        .chain([crate::pieces::TABLE, crate::pieces::LARGE]);
    for definition in tables {
        let table = match read.open_table(definition) {
            Ok(table) => table,
            Err(redb::TableError::TableDoesNotExist(_)) => continue,
            Err(e) => return Err(Error::storage(e)),
        };
        let stats = table.stats().map_err(Error::storage)?;
        fill.page_bytes += stats.stored_bytes() + stats.metadata_bytes() + stats.fragmented_bytes();
        // The stored bytes the fill is applied to count a long value whole under its key: its
        // pieces' keys are pages' overhead here (a revision's key and the piece's number).
        let overhead = if definition.name() == crate::pieces::TABLE.name()
            || definition.name() == crate::pieces::LARGE.name()
        {
            table.len().map_err(Error::storage)? * crate::pieces::REVISION_PIECE_KEY_LEN
        } else {
            0
        };
        fill.stored_bytes += stats.stored_bytes().saturating_sub(overhead);
    }
    Ok(fill)
}
