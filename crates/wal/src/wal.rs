//! The [`Wal`] handle: create, open (replay and torn-tail repair), group-committed saves,
//! snapshot marks and segment release.
//!
//! Port of etcd `wal/wal.go` (`Create`, `Open`/`ReadAll`, `Save`, `SaveSnapshot`, `cut`,
//! `ReleaseLockTo`) and `wal/repair.go`. Unlike etcd, the snapshot mark is recovered from the
//! log itself rather than passed in by the caller, and every segment repeats the mark and
//! hard state in its header so that any suffix of segments replays correctly.

use std::fs::{self, File, OpenOptions, TryLockError};
use std::io::{BufReader, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};

use crate::error::{CorruptReason, Error, Result};
use crate::record::{self, Damage, Decoded, Extent, Record, SegmentReader};
use crate::segment::{self, HEADER_RECORDS, SegmentHeader, SegmentName};
use crate::types::{EntryRecord, HardState, SnapshotMark, WalState};

/// Default size after which the tail segment is cut (etcd `SegmentSizeBytes`).
pub const DEFAULT_SEGMENT_SIZE: u64 = 64 * 1024 * 1024;

/// The write buffer keeps at most this much capacity between saves, so one huge batch does
/// not pin its memory forever while ordinary batches never reallocate.
const RETAINED_BUFFER_CAPACITY: usize = 4 << 20;

/// Read buffer size used while replaying a segment.
const REPLAY_READ_BUFFER: usize = 1 << 16;

/// Tuning knobs. Plain data; `Default` is what production uses.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Options {
    /// Once the tail segment has reached this many bytes, the next write goes to a new
    /// segment. A single batch is never split, so a segment may exceed this size.
    pub segment_size: u64,
    /// etcd's `--unsafe-no-fsync`: saves are written but not fdatasynced, so a power loss
    /// (not a process crash) may lose acknowledged writes. For tests and throwaway clusters.
    pub unsafe_no_fsync: bool,
}

impl Default for Options {
    fn default() -> Options {
        Options {
            segment_size: DEFAULT_SEGMENT_SIZE,
            unsafe_no_fsync: false,
        }
    }
}

/// An open write-ahead log. Exactly one `Wal` may be open per directory (enforced with an
/// advisory lock on the directory); it owns the tail segment's file handle for its lifetime.
pub struct Wal {
    dir: PathBuf,
    /// Holds the directory lock and is used to fsync the directory.
    dir_handle: File,
    options: Options,
    metadata: Vec<u8>,
    /// Live segments, oldest first. Invariant: never empty; the last one is the tail.
    segments: Vec<SegmentName>,
    /// The tail segment, positioned at its end.
    tail: File,
    /// Length of the tail segment; every byte below it is a complete, synced record.
    tail_len: u64,
    /// What replay would report as the last index: the last live entry's index, or the
    /// snapshot mark's index when no entry follows the mark.
    last_index: u64,
    hard_state: HardState,
    snapshot: SnapshotMark,
    /// Reused encoding buffer: one `save` is one `write_all` of this buffer.
    buf: Vec<u8>,
    /// Set when a write-path operation failed; the tail is then in an unknown state.
    poisoned: bool,
    /// What the writes of this handle cost so far, for the caller's metrics.
    stats: WriteStats,
}

/// What a [`Wal`]'s writes cost so far (etcd's `etcd_disk_wal_write_bytes_total`,
/// `etcd_disk_wal_write_duration_seconds`, `etcd_disk_wal_fsync_duration_seconds`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct WriteStats {
    /// Record bytes written to segments by this handle.
    pub bytes_written: u64,
    /// How long the last write (without its sync) took.
    pub last_write: std::time::Duration,
    /// How long the last fdatasync took.
    pub last_sync: std::time::Duration,
}

impl std::fmt::Debug for Wal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Wal")
            .field("dir", &self.dir)
            .field("segments", &self.segments)
            .field("tail_len", &self.tail_len)
            .field("last_index", &self.last_index)
            .field("hard_state", &self.hard_state)
            .field("snapshot", &self.snapshot)
            .field("poisoned", &self.poisoned)
            .finish_non_exhaustive()
    }
}

impl Wal {
    /// Create a new WAL in `dir` (must not exist or be empty) with opaque metadata (node id, cluster id).
    pub fn create(dir: &Path, metadata: &[u8]) -> Result<Wal> {
        Wal::create_with_options(dir, metadata, Options::default())
    }

    /// [`Wal::create`] with explicit [`Options`].
    ///
    /// Leftover `*.wal.tmp` files from an interrupted earlier `create` are removed; any
    /// other file in `dir` makes this fail with [`Error::AlreadyExists`].
    pub fn create_with_options(dir: &Path, metadata: &[u8], options: Options) -> Result<Wal> {
        create_dir_all_synced(dir)?;
        sync_parent_dir(dir)?;
        let dir_handle = segment::open_dir(dir)?;
        lock_dir(&dir_handle, dir)?;
        let listing = segment::list(dir)?;
        if !listing.segments.is_empty() || listing.has_other_files {
            return Err(Error::AlreadyExists {
                dir: dir.to_path_buf(),
            });
        }
        remove_stale_tmp(dir, &dir_handle, &listing.stale_tmp)?;

        let first = SegmentName {
            seq: 0,
            first_index: 0,
        };
        let header = SegmentHeader {
            metadata,
            snapshot: SnapshotMark::default(),
            hard_state: HardState::default(),
        };
        let (tail, tail_len) = segment::create(dir, &dir_handle, first, &header)?;
        Ok(Wal {
            dir: dir.to_path_buf(),
            dir_handle,
            options,
            metadata: metadata.to_vec(),
            segments: vec![first],
            tail,
            tail_len,
            last_index: 0,
            hard_state: HardState::default(),
            snapshot: SnapshotMark::default(),
            buf: Vec::new(),
            poisoned: false,
            stats: WriteStats::default(),
        })
    }

    /// Open an existing WAL, replay it, repair a torn tail, and return the state to restore raft from.
    pub fn open(dir: &Path) -> Result<(Wal, WalState)> {
        Wal::open_with_options(dir, Options::default())
    }

    /// [`Wal::open`] with explicit [`Options`].
    ///
    /// Replays every segment in order. A truncated or CRC-bad record at the tail of the
    /// last segment (a crash mid-`save`) is cut off, synced and logged; damage anywhere
    /// else is [`Error::Corrupt`].
    pub fn open_with_options(dir: &Path, options: Options) -> Result<(Wal, WalState)> {
        let dir_handle = match File::open(dir) {
            Ok(handle) => handle,
            Err(err) if err.kind() == std::io::ErrorKind::NotFound => {
                return Err(Error::NotFound {
                    dir: dir.to_path_buf(),
                });
            }
            Err(err) => return Err(Error::io(dir)(err)),
        };
        lock_dir(&dir_handle, dir)?;
        let listing = segment::list(dir)?;
        remove_stale_tmp(dir, &dir_handle, &listing.stale_tmp)?;
        let segments = listing.segments;
        let Some((tail_name, earlier)) = segments.split_last() else {
            return Err(Error::NotFound {
                dir: dir.to_path_buf(),
            });
        };
        check_consecutive(dir, &segments)?;

        let mut replay = Replay::default();
        for name in earlier {
            let path = name.path(dir);
            let file = File::open(&path).map_err(Error::io(&path))?;
            if let Some(damage) = replay_segment(&mut replay, &path, &file, false)? {
                return Err(corrupt(&path, damage));
            }
        }

        let tail_path = tail_name.path(dir);
        let mut tail = OpenOptions::new()
            .read(true)
            .write(true)
            .open(&tail_path)
            .map_err(Error::io(&tail_path))?;
        let tail_len = match replay_segment(&mut replay, &tail_path, &tail, true)? {
            None => file_len(&tail, &tail_path)?,
            Some(damage) => {
                tracing::warn!(
                    path = %tail_path.display(),
                    offset = damage.offset,
                    reason = %damage.reason,
                    "wal: cutting off torn tail record(s) left by a crash"
                );
                tail.set_len(damage.offset).map_err(Error::io(&tail_path))?;
                tail.sync_all().map_err(Error::io(&tail_path))?;
                damage.offset
            }
        };
        tail.seek(SeekFrom::Start(tail_len))
            .map_err(Error::io(&tail_path))?;

        let oldest_path = segments[0].path(dir);
        let state = replay.finish(&oldest_path)?;
        let last_index = state
            .entries
            .last()
            .map_or(state.snapshot.index, |entry| entry.index);
        let wal = Wal {
            dir: dir.to_path_buf(),
            dir_handle,
            options,
            metadata: state.metadata.clone(),
            segments,
            tail,
            tail_len,
            last_index,
            hard_state: state.hard_state,
            snapshot: state.snapshot,
            buf: Vec::new(),
            poisoned: false,
            stats: WriteStats::default(),
        };
        Ok((wal, state))
    }

    /// Whether `dir` holds at least one WAL segment (etcd `wal.Exist`).
    pub fn exists(dir: &Path) -> bool {
        segment::list(dir).is_ok_and(|listing| !listing.segments.is_empty())
    }

    /// Append entries and/or a hard state and fsync ONCE (group commit: raftnode calls this once per Ready).
    ///
    /// Entries are written before the hard state, all with a single `write` followed by a
    /// single `fdatasync`. When this returns `Ok`, everything passed is durable.
    ///
    /// The batch must be contiguous and start at or below `last_index() + 1`; a lower start
    /// overwrites the conflicting tail, as raft does. Otherwise this fails with
    /// [`Error::IndexGap`] and writes nothing. Calling with nothing to save is a no-op.
    pub fn save(&mut self, hard_state: Option<HardState>, entries: &[EntryRecord]) -> Result<()> {
        self.ensure_writable()?;
        if hard_state.is_none() && entries.is_empty() {
            return Ok(());
        }
        check_continuity(self.last_index, entries)?;
        self.buf.clear();
        for entry in entries {
            record::encode_entry(&mut self.buf, entry)?;
        }
        if let Some(hard_state) = &hard_state {
            record::encode_hard_state(&mut self.buf, hard_state)?;
        }
        self.write_buffered()?;

        // Mirror replay: entries at or below the snapshot mark are skipped there.
        if let Some(last) = entries.last()
            && last.index > self.snapshot.index
        {
            self.last_index = last.index;
        }
        if let Some(hard_state) = hard_state {
            self.hard_state = hard_state;
        }
        Ok(())
    }

    /// What this handle's writes cost so far.
    pub fn write_stats(&self) -> WriteStats {
        self.stats
    }

    /// Record that a snapshot at (index, term) exists; entries up to index are no longer needed on replay.
    ///
    /// Write the mark before the entries that follow the snapshot (etcd saves the snapshot
    /// record before `Save`), otherwise those entries are rejected as an [`Error::IndexGap`].
    /// Marks must not go backwards ([`Error::SnapshotMarkRegression`]). Synced before returning.
    pub fn save_snapshot_mark(&mut self, mark: SnapshotMark) -> Result<()> {
        self.ensure_writable()?;
        if mark.index < self.snapshot.index {
            return Err(Error::SnapshotMarkRegression {
                current: self.snapshot,
                requested: mark,
            });
        }
        self.buf.clear();
        record::encode_snapshot_mark(&mut self.buf, &mark)?;
        self.write_buffered()?;
        self.snapshot = mark;
        self.last_index = self.last_index.max(mark.index);
        Ok(())
    }

    /// Delete whole segment files whose entries are all <= index (never the one being written).
    ///
    /// `index` is clamped to the latest snapshot mark, so releasing can never remove an
    /// entry that replay still needs. Segments are removed oldest first and the directory
    /// is synced, so a crash part-way leaves a consecutive run of segments.
    pub fn release_to(&mut self, index: u64) -> Result<()> {
        self.ensure_writable()?;
        let index = index.min(self.snapshot.index);
        // Every live entry of segment k is below segments[k + 1].first_index.
        let mut n_release = 0;
        while n_release + 1 < self.segments.len()
            && self.segments[n_release + 1].first_index <= index.saturating_add(1)
        {
            n_release += 1;
        }
        if n_release == 0 {
            return Ok(());
        }
        let mut n_removed = 0;
        let mut result = Ok(());
        for name in &self.segments[..n_release] {
            let path = name.path(&self.dir);
            if let Err(err) = fs::remove_file(&path) {
                result = Err(Error::io(path)(err));
                break;
            }
            n_removed += 1;
        }
        self.segments.drain(..n_removed);
        if n_removed > 0 {
            tracing::debug!(dir = %self.dir.display(), n_removed, index, "wal: released segments");
            segment::sync_dir(&self.dir_handle, &self.dir)?;
        }
        result
    }

    /// The index replay would end at: the last live entry, or the snapshot mark's index
    /// when no entry follows it. The next `save` may start at most one above this.
    pub fn last_index(&self) -> u64 {
        self.last_index
    }

    fn ensure_writable(&self) -> Result<()> {
        if self.poisoned {
            return Err(Error::Poisoned);
        }
        Ok(())
    }

    fn tail_name(&self) -> SegmentName {
        *self
            .segments
            .last()
            .expect("invariant: a Wal always has its tail segment")
    }

    fn tail_path(&self) -> PathBuf {
        self.tail_name().path(&self.dir)
    }

    /// The options this log was opened with.
    pub fn options(&self) -> &Options {
        &self.options
    }

    /// Writes `self.buf` to the tail with one write and one fdatasync, cutting a new
    /// segment first if the tail is full. Any failure poisons the handle.
    fn write_buffered(&mut self) -> Result<()> {
        let result = self.write_buffered_unpoisoned();
        if result.is_err() {
            self.poisoned = true;
        }
        self.buf.clear();
        self.buf.shrink_to(RETAINED_BUFFER_CAPACITY);
        result
    }

    fn write_buffered_unpoisoned(&mut self) -> Result<()> {
        if self.tail_len >= self.options.segment_size {
            self.cut()?;
        }
        // The path is only built on error: the hot path allocates nothing.
        let started = std::time::Instant::now();
        self.tail.write_all(&self.buf).map_err(|source| Error::Io {
            path: self.tail_path(),
            source,
        })?;
        let written = std::time::Instant::now();
        self.stats.last_write = written - started;
        self.stats.bytes_written += self.buf.len() as u64;
        if !self.options.unsafe_no_fsync {
            self.tail.sync_data().map_err(|source| Error::Io {
                path: self.tail_path(),
                source,
            })?;
        }
        self.stats.last_sync = written.elapsed();
        self.tail_len += self.buf.len() as u64;
        Ok(())
    }

    /// Starts a new tail segment named after the next expected index (etcd `cut`). The old
    /// tail was synced by the save that filled it, so it can simply be closed.
    fn cut(&mut self) -> Result<()> {
        let name = SegmentName {
            seq: self.tail_name().seq + 1,
            first_index: self.last_index.saturating_add(1),
        };
        let header = SegmentHeader {
            metadata: &self.metadata,
            snapshot: self.snapshot,
            hard_state: self.hard_state,
        };
        let (tail, tail_len) = segment::create(&self.dir, &self.dir_handle, name, &header)?;
        self.tail = tail;
        self.tail_len = tail_len;
        self.segments.push(name);
        tracing::debug!(dir = %self.dir.display(), file = %name.file_name(), "wal: cut new segment");
        Ok(())
    }
}

/// Takes the directory lock, or reports who holds it.
fn lock_dir(dir_handle: &File, dir: &Path) -> Result<()> {
    match dir_handle.try_lock() {
        Ok(()) => Ok(()),
        Err(TryLockError::WouldBlock) => Err(Error::Locked {
            dir: dir.to_path_buf(),
        }),
        Err(TryLockError::Error(err)) => Err(Error::io(dir)(err)),
    }
}

/// `create_dir_all` whose result survives a power cut: the parent of each directory it makes
/// is synced after it (a new name is durable only once its directory is).
fn create_dir_all_synced(dir: &Path) -> Result<()> {
    if dir.as_os_str().is_empty() || dir.is_dir() {
        return Ok(());
    }
    if let Some(parent) = dir.parent().filter(|p| !p.as_os_str().is_empty()) {
        create_dir_all_synced(parent)?;
    }
    match fs::create_dir(dir) {
        Ok(()) => sync_parent_dir(dir),
        Err(err) if err.kind() == std::io::ErrorKind::AlreadyExists && dir.is_dir() => Ok(()),
        Err(err) => Err(Error::io(dir)(err)),
    }
}

/// Makes the creation of `dir` itself durable.
fn sync_parent_dir(dir: &Path) -> Result<()> {
    let Some(parent) = dir.parent() else {
        return Ok(());
    };
    let parent = if parent.as_os_str().is_empty() {
        Path::new(".")
    } else {
        parent
    };
    let parent_handle = segment::open_dir(parent)?;
    segment::sync_dir(&parent_handle, parent)
}

fn remove_stale_tmp(dir: &Path, dir_handle: &File, stale_tmp: &[PathBuf]) -> Result<()> {
    for path in stale_tmp {
        tracing::warn!(path = %path.display(), "wal: removing segment left half-created by a crash");
        fs::remove_file(path).map_err(Error::io(path))?;
    }
    if !stale_tmp.is_empty() {
        segment::sync_dir(dir_handle, dir)?;
    }
    Ok(())
}

/// Segment sequence numbers must be consecutive; a hole means a segment was lost.
fn check_consecutive(dir: &Path, segments: &[SegmentName]) -> Result<()> {
    for pair in segments.windows(2) {
        if pair[1].seq != pair[0].seq.saturating_add(1) {
            return Err(Error::Corrupt {
                path: pair[1].path(dir),
                offset: 0,
                reason: CorruptReason::MissingSegment {
                    expected: pair[0].seq.saturating_add(1),
                },
            });
        }
    }
    Ok(())
}

/// A batch must be contiguous and must not leave a hole after `last_index`.
fn check_continuity(last_index: u64, entries: &[EntryRecord]) -> Result<()> {
    let Some(first) = entries.first() else {
        return Ok(());
    };
    if first.index > last_index.saturating_add(1) {
        return Err(Error::IndexGap {
            last_index,
            found: first.index,
        });
    }
    for pair in entries.windows(2) {
        if pair[1].index != pair[0].index.saturating_add(1) {
            return Err(Error::IndexGap {
                last_index: pair[0].index,
                found: pair[1].index,
            });
        }
    }
    Ok(())
}

fn file_len(file: &File, path: &Path) -> Result<u64> {
    Ok(file.metadata().map_err(Error::io(path))?.len())
}

fn corrupt(path: &Path, damage: Damage) -> Error {
    Error::Corrupt {
        path: path.to_path_buf(),
        offset: damage.offset,
        reason: damage.reason,
    }
}

/// Replays one segment into `replay`. Returns the torn tail to cut off, if any; only the
/// last segment (`is_last`) may have one, and never inside its header, which
/// `segment::create` synced before the segment became visible.
fn replay_segment(
    replay: &mut Replay,
    path: &Path,
    file: &File,
    is_last: bool,
) -> Result<Option<Damage>> {
    let len = file_len(file, path)?;
    let mut reader = SegmentReader::new(BufReader::with_capacity(REPLAY_READ_BUFFER, file), len);
    let mut position = 0;
    loop {
        match reader.next().map_err(Error::io(path))? {
            Decoded::Record { offset, record } => {
                replay.apply(path, offset, position, record)?;
                position += 1;
            }
            Decoded::End => {
                if position < HEADER_RECORDS {
                    return Err(Error::Corrupt {
                        path: path.to_path_buf(),
                        offset: reader.offset(),
                        reason: CorruptReason::BadSegmentHeader { position },
                    });
                }
                return Ok(None);
            }
            Decoded::Damaged(damage) => {
                let torn = is_last
                    && position >= HEADER_RECORDS
                    && match damage.extent {
                        Extent::ReachesEof => true,
                        Extent::TornIfRestIsZero => {
                            reader.rest_is_zero().map_err(Error::io(path))?
                        }
                        Extent::Never => false,
                    };
                if torn {
                    return Ok(Some(damage));
                }
                return Err(corrupt(path, damage));
            }
        }
    }
}

/// Replay state, built record by record.
#[derive(Default)]
struct Replay {
    metadata: Option<Vec<u8>>,
    hard_state: HardState,
    snapshot: SnapshotMark,
    /// Invariant: contiguous indices, all above `snapshot.index`.
    entries: Vec<EntryRecord>,
}

impl Replay {
    /// Applies one record found at `offset`, the `position`-th record of segment `path`.
    fn apply(&mut self, path: &Path, offset: u64, position: usize, record: Record) -> Result<()> {
        let corrupt = |reason| Error::Corrupt {
            path: path.to_path_buf(),
            offset,
            reason,
        };
        let in_place = match (position, &record) {
            (0, Record::Metadata(_)) => true,
            (1, Record::SnapshotMark(_)) => true,
            (2, Record::HardState(_)) => true,
            (0..HEADER_RECORDS, _) => false,
            (_, Record::Metadata(_)) => false,
            _ => true,
        };
        if !in_place {
            return Err(corrupt(CorruptReason::BadSegmentHeader { position }));
        }
        match record {
            Record::Metadata(metadata) => match &self.metadata {
                None => self.metadata = Some(metadata),
                Some(first) if *first != metadata => {
                    return Err(Error::MetadataConflict {
                        path: path.to_path_buf(),
                    });
                }
                Some(_) => {}
            },
            Record::HardState(hard_state) => self.hard_state = hard_state,
            Record::SnapshotMark(mark) => {
                if mark.index < self.snapshot.index {
                    return Err(corrupt(CorruptReason::SnapshotMarkRegression {
                        from: self.snapshot.index,
                        to: mark.index,
                    }));
                }
                self.snapshot = mark;
                let n_covered = self
                    .entries
                    .iter()
                    .take_while(|entry| entry.index <= mark.index)
                    .count();
                self.entries.drain(..n_covered);
            }
            Record::Entry(entry) => self.push_entry(entry).map_err(corrupt)?,
        }
        Ok(())
    }

    /// Appends `entry`, first dropping any replayed entries at or above its index: raft
    /// only rewrites an index after discarding a conflicting tail.
    fn push_entry(&mut self, entry: EntryRecord) -> Result<(), CorruptReason> {
        if entry.index <= self.snapshot.index {
            return Ok(());
        }
        if let Some(first) = self.entries.first() {
            let first_index = first.index;
            let last_index = first_index + (self.entries.len() as u64 - 1);
            if entry.index > last_index.saturating_add(1) {
                return Err(CorruptReason::IndexGap {
                    last_index,
                    found: entry.index,
                });
            }
            let n_keep =
                usize::try_from(entry.index.saturating_sub(first_index)).unwrap_or(usize::MAX);
            self.entries.truncate(n_keep);
        }
        // An empty list accepts any index: after `release_to` the oldest remaining segment
        // may start above its header's (older) snapshot mark. `finish` checks the result.
        self.entries.push(entry);
        Ok(())
    }

    /// Checks that the entries continue the snapshot and produces the final state.
    fn finish(self, oldest_path: &Path) -> Result<WalState> {
        if let Some(first) = self.entries.first()
            && first.index != self.snapshot.index.saturating_add(1)
        {
            return Err(Error::Corrupt {
                path: oldest_path.to_path_buf(),
                offset: 0,
                reason: CorruptReason::IndexGap {
                    last_index: self.snapshot.index,
                    found: first.index,
                },
            });
        }
        Ok(WalState {
            // Every segment's first record is metadata, and there is at least one segment.
            metadata: self.metadata.unwrap_or_default(),
            hard_state: self.hard_state,
            snapshot: self.snapshot,
            entries: self.entries,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(index: u64, term: u64) -> EntryRecord {
        EntryRecord {
            index,
            term,
            data: format!("entry-{index}-{term}").into_bytes(),
        }
    }

    fn entries(indexes: std::ops::RangeInclusive<u64>, term: u64) -> Vec<EntryRecord> {
        indexes.map(|index| entry(index, term)).collect()
    }

    fn hard_state(term: u64, vote: u64, commit: u64) -> HardState {
        HardState { term, vote, commit }
    }

    fn small_segments() -> Options {
        Options {
            segment_size: 256,
            ..Options::default()
        }
    }

    /// Segment files in `dir`, oldest first.
    fn segment_paths(dir: &Path) -> Vec<PathBuf> {
        segment::list(dir)
            .unwrap()
            .segments
            .iter()
            .map(|name| name.path(dir))
            .collect()
    }

    fn last_segment(dir: &Path) -> PathBuf {
        segment_paths(dir).pop().unwrap()
    }

    fn file_size(path: &Path) -> u64 {
        fs::metadata(path).unwrap().len()
    }

    /// A copy of the WAL directory `src` in a fresh temporary directory.
    fn copy_wal(src: &Path) -> tempfile::TempDir {
        let copy = tempfile::tempdir().unwrap();
        for dir_entry in fs::read_dir(src).unwrap() {
            let dir_entry = dir_entry.unwrap();
            fs::copy(dir_entry.path(), copy.path().join(dir_entry.file_name())).unwrap();
        }
        copy
    }

    fn truncate_file(path: &Path, len: u64) {
        OpenOptions::new()
            .write(true)
            .open(path)
            .unwrap()
            .set_len(len)
            .unwrap();
    }

    fn flip_byte(path: &Path, offset: u64) {
        let mut bytes = fs::read(path).unwrap();
        bytes[offset as usize] ^= 0xff;
        fs::write(path, bytes).unwrap();
    }

    fn expect_corrupt(dir: &Path) -> (PathBuf, u64, CorruptReason) {
        match Wal::open(dir) {
            Err(Error::Corrupt {
                path,
                offset,
                reason,
            }) => (path, offset, reason),
            Err(other) => panic!("expected Corrupt, got {other:?}"),
            Ok((_, state)) => panic!("expected Corrupt, replayed {state:?}"),
        }
    }

    #[test]
    fn round_trip() {
        let dir = tempfile::tempdir().unwrap();
        let mut wal = Wal::create(dir.path(), b"node=1,cluster=7").unwrap();
        wal.save(Some(hard_state(1, 1, 0)), &entries(1..=3, 1))
            .unwrap();
        wal.save(Some(hard_state(1, 1, 3)), &entries(4..=5, 1))
            .unwrap();
        wal.save(
            None,
            &[EntryRecord {
                index: 6,
                term: 1,
                data: Vec::new(),
            }],
        )
        .unwrap();
        assert_eq!(wal.last_index(), 6);
        drop(wal);

        let (wal, state) = Wal::open(dir.path()).unwrap();
        let mut expected = entries(1..=5, 1);
        expected.push(EntryRecord {
            index: 6,
            term: 1,
            data: Vec::new(),
        });
        assert_eq!(
            state,
            WalState {
                metadata: b"node=1,cluster=7".to_vec(),
                hard_state: hard_state(1, 1, 3),
                snapshot: SnapshotMark::default(),
                entries: expected,
            }
        );
        assert_eq!(wal.last_index(), 6);
    }

    #[test]
    fn fresh_wal_replays_empty_state() {
        let dir = tempfile::tempdir().unwrap();
        drop(Wal::create(dir.path(), b"meta").unwrap());
        let (wal, state) = Wal::open(dir.path()).unwrap();
        assert_eq!(
            state,
            WalState {
                metadata: b"meta".to_vec(),
                ..WalState::default()
            }
        );
        assert_eq!(wal.last_index(), 0);
    }

    #[test]
    fn conflicting_tail_is_overwritten() {
        let dir = tempfile::tempdir().unwrap();
        let mut wal = Wal::create(dir.path(), b"").unwrap();
        wal.save(None, &entries(1..=10, 1)).unwrap();
        // A new leader at term 2 overwrites 6 and 7; 8..=10 are gone.
        wal.save(None, &entries(6..=7, 2)).unwrap();
        assert_eq!(wal.last_index(), 7);
        drop(wal);

        let (mut wal, state) = Wal::open(dir.path()).unwrap();
        let mut expected = entries(1..=5, 1);
        expected.extend(entries(6..=7, 2));
        assert_eq!(state.entries, expected);

        // Overwrite again below the first overwrite, then continue appending.
        wal.save(None, &entries(3..=4, 3)).unwrap();
        wal.save(None, &entries(5..=5, 3)).unwrap();
        drop(wal);
        let (_, state) = Wal::open(dir.path()).unwrap();
        let mut expected = entries(1..=2, 1);
        expected.extend(entries(3..=5, 3));
        assert_eq!(state.entries, expected);
    }

    #[test]
    fn hard_state_last_wins() {
        let dir = tempfile::tempdir().unwrap();
        let mut wal = Wal::create(dir.path(), b"").unwrap();
        wal.save(Some(hard_state(1, 0, 0)), &entries(1..=2, 1))
            .unwrap();
        wal.save(Some(hard_state(2, 3, 2)), &[]).unwrap();
        wal.save(None, &entries(3..=3, 2)).unwrap();
        wal.save(Some(hard_state(2, 3, 1)), &[]).unwrap();
        drop(wal);
        let (_, state) = Wal::open(dir.path()).unwrap();
        // The last written wins, even when it is "smaller": the WAL does not interpret it.
        assert_eq!(state.hard_state, hard_state(2, 3, 1));
        assert_eq!(state.entries.len(), 3);
    }

    #[test]
    fn snapshot_mark_skips_old_entries() {
        let dir = tempfile::tempdir().unwrap();
        let mut wal = Wal::create(dir.path(), b"").unwrap();
        wal.save(Some(hard_state(1, 1, 8)), &entries(1..=10, 1))
            .unwrap();
        wal.save_snapshot_mark(SnapshotMark { index: 6, term: 1 })
            .unwrap();
        wal.save(None, &entries(11..=12, 1)).unwrap();
        drop(wal);

        let (mut wal, state) = Wal::open(dir.path()).unwrap();
        assert_eq!(state.snapshot, SnapshotMark { index: 6, term: 1 });
        assert_eq!(state.entries, entries(7..=12, 1));
        assert_eq!(state.hard_state, hard_state(1, 1, 8));

        // A snapshot beyond every entry (e.g. received from the leader) leaves no entries;
        // the next entry must follow the mark.
        wal.save_snapshot_mark(SnapshotMark { index: 20, term: 2 })
            .unwrap();
        assert_eq!(wal.last_index(), 20);
        assert!(matches!(
            wal.save(None, &entries(22..=22, 2)),
            Err(Error::IndexGap {
                last_index: 20,
                found: 22
            })
        ));
        wal.save(None, &entries(21..=22, 2)).unwrap();
        drop(wal);
        let (_, state) = Wal::open(dir.path()).unwrap();
        assert_eq!(state.snapshot, SnapshotMark { index: 20, term: 2 });
        assert_eq!(state.entries, entries(21..=22, 2));
    }

    #[test]
    fn entries_at_or_below_the_mark_are_ignored() {
        let dir = tempfile::tempdir().unwrap();
        let mut wal = Wal::create(dir.path(), b"").unwrap();
        wal.save(None, &entries(1..=5, 1)).unwrap();
        wal.save_snapshot_mark(SnapshotMark { index: 3, term: 1 })
            .unwrap();
        // Rewriting an index the snapshot covers changes nothing, on disk or in memory.
        wal.save(None, &entries(2..=2, 1)).unwrap();
        assert_eq!(wal.last_index(), 5);
        drop(wal);
        let (_, state) = Wal::open(dir.path()).unwrap();
        assert_eq!(state.entries, entries(4..=5, 1));
    }

    #[test]
    fn save_rejects_gaps_and_mark_regressions_without_writing() {
        let dir = tempfile::tempdir().unwrap();
        let mut wal = Wal::create(dir.path(), b"").unwrap();
        wal.save(None, &entries(1..=3, 1)).unwrap();
        let size_before = file_size(&last_segment(dir.path()));

        let gap_after_last = wal.save(None, &entries(5..=6, 1)).unwrap_err();
        assert!(matches!(
            gap_after_last,
            Error::IndexGap {
                last_index: 3,
                found: 5
            }
        ));
        let hole_in_batch = wal.save(None, &[entry(4, 1), entry(6, 1)]).unwrap_err();
        assert!(matches!(
            hole_in_batch,
            Error::IndexGap {
                last_index: 4,
                found: 6
            }
        ));

        wal.save_snapshot_mark(SnapshotMark { index: 2, term: 1 })
            .unwrap();
        let size_before_regression = file_size(&last_segment(dir.path()));
        let regression = wal
            .save_snapshot_mark(SnapshotMark { index: 1, term: 1 })
            .unwrap_err();
        assert!(matches!(regression, Error::SnapshotMarkRegression { .. }));
        assert_eq!(file_size(&last_segment(dir.path())), size_before_regression);
        assert!(size_before_regression > size_before);

        // The rejections did not poison the handle.
        wal.save(None, &entries(4..=4, 1)).unwrap();
    }

    #[test]
    fn empty_save_writes_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let mut wal = Wal::create(dir.path(), b"").unwrap();
        let size = file_size(&last_segment(dir.path()));
        wal.save(None, &[]).unwrap();
        assert_eq!(file_size(&last_segment(dir.path())), size);
    }

    #[test]
    fn one_save_appends_exactly_its_records() {
        let dir = tempfile::tempdir().unwrap();
        let mut wal = Wal::create(dir.path(), b"").unwrap();
        let batch = entries(1..=4, 1);
        let hs = hard_state(1, 1, 2);
        let mut expected = Vec::new();
        for entry in &batch {
            record::encode_entry(&mut expected, entry).unwrap();
        }
        record::encode_hard_state(&mut expected, &hs).unwrap();

        let path = last_segment(dir.path());
        let size_before = file_size(&path);
        wal.save(Some(hs), &batch).unwrap();
        let bytes = fs::read(&path).unwrap();
        assert_eq!(&bytes[size_before as usize..], &expected[..]);
    }

    #[test]
    fn rotation_across_segments_and_release_to() {
        let dir = tempfile::tempdir().unwrap();
        let mut wal = Wal::create_with_options(dir.path(), b"meta", small_segments()).unwrap();
        // The only hard state is written into the first segment; after releasing it, the
        // hard state must still come back from later segments' headers.
        wal.save(Some(hard_state(1, 1, 1)), &entries(1..=1, 1))
            .unwrap();
        for index in 2..=60 {
            wal.save(None, &entries(index..=index, 1)).unwrap();
        }
        drop(wal);

        let names = segment::list(dir.path()).unwrap().segments;
        assert!(names.len() >= 5, "expected rotation, got {names:?}");
        for (seq, name) in names.iter().enumerate() {
            assert_eq!(name.seq, seq as u64);
        }
        for path in segment_paths(dir.path()) {
            // A segment is cut once it reaches the limit, so none grows past limit + one save.
            assert!(file_size(&path) < 256 + 64, "{path:?}");
        }

        let (mut wal, state) = Wal::open_with_options(dir.path(), small_segments()).unwrap();
        assert_eq!(state.entries, entries(1..=60, 1));
        assert_eq!(state.metadata, b"meta");

        // release_to is clamped to the snapshot mark: with no mark nothing goes.
        wal.release_to(40).unwrap();
        assert_eq!(segment_paths(dir.path()).len(), names.len());

        wal.save_snapshot_mark(SnapshotMark { index: 40, term: 1 })
            .unwrap();
        wal.release_to(40).unwrap();
        let remaining = segment::list(dir.path()).unwrap().segments;
        assert!(remaining.len() < names.len());
        assert_eq!(remaining.last(), names.last());
        // Every released segment held only entries <= 40: the first remaining segment's
        // successor starts at or below 41 would have allowed releasing more.
        assert!(remaining[0].first_index <= 41);
        if let Some(second) = remaining.get(1) {
            assert!(second.first_index > 41);
        }
        drop(wal);

        let (mut wal, state) = Wal::open_with_options(dir.path(), small_segments()).unwrap();
        assert_eq!(state.snapshot, SnapshotMark { index: 40, term: 1 });
        assert_eq!(state.entries, entries(41..=60, 1));
        assert_eq!(state.hard_state, hard_state(1, 1, 1));
        assert_eq!(state.metadata, b"meta");

        // Releasing everything keeps the tail segment, and replay still works.
        wal.save_snapshot_mark(SnapshotMark { index: 60, term: 1 })
            .unwrap();
        wal.release_to(u64::MAX).unwrap();
        assert_eq!(segment_paths(dir.path()).len(), 1);
        wal.save(Some(hard_state(2, 2, 61)), &entries(61..=61, 2))
            .unwrap();
        drop(wal);
        let (_, state) = Wal::open_with_options(dir.path(), small_segments()).unwrap();
        assert_eq!(state.snapshot, SnapshotMark { index: 60, term: 1 });
        assert_eq!(state.entries, entries(61..=61, 2));
        assert_eq!(state.hard_state, hard_state(2, 2, 61));
    }

    #[test]
    fn overwrite_across_segments_then_release() {
        let dir = tempfile::tempdir().unwrap();
        let mut wal = Wal::create_with_options(dir.path(), b"", small_segments()).unwrap();
        for index in 1..=30 {
            wal.save(None, &entries(index..=index, 1)).unwrap();
        }
        // Overwrite from 10: the entries 10..=30 in older segments are dead.
        wal.save(None, &entries(10..=12, 2)).unwrap();
        for index in 13..=20 {
            wal.save(None, &entries(index..=index, 2)).unwrap();
        }
        wal.save_snapshot_mark(SnapshotMark { index: 15, term: 2 })
            .unwrap();
        wal.release_to(15).unwrap();
        drop(wal);
        let (_, state) = Wal::open_with_options(dir.path(), small_segments()).unwrap();
        assert_eq!(state.entries, entries(16..=20, 2));
    }

    #[test]
    fn torn_tail_at_every_offset_of_last_record_is_repaired() {
        let dir = tempfile::tempdir().unwrap();
        let mut wal = Wal::create(dir.path(), b"meta").unwrap();
        wal.save(Some(hard_state(1, 1, 2)), &entries(1..=3, 1))
            .unwrap();
        let path = last_segment(dir.path());
        let record_start = file_size(&path);
        wal.save(None, &entries(4..=4, 1)).unwrap();
        let record_end = file_size(&path);
        drop(wal);

        for cut in record_start..record_end {
            let copy = copy_wal(dir.path());
            let copy_path = last_segment(copy.path());
            truncate_file(&copy_path, cut);
            let (_, state) = Wal::open(copy.path()).unwrap();
            assert_eq!(state.entries, entries(1..=3, 1), "cut at {cut}");
            assert_eq!(state.hard_state, hard_state(1, 1, 2), "cut at {cut}");
            assert_eq!(file_size(&copy_path), record_start, "cut at {cut}");
        }
    }

    #[test]
    fn torn_batch_replays_a_prefix() {
        let dir = tempfile::tempdir().unwrap();
        let mut wal = Wal::create(dir.path(), b"").unwrap();
        wal.save(Some(hard_state(1, 1, 0)), &entries(1..=2, 1))
            .unwrap();
        let path = last_segment(dir.path());
        let batch_start = file_size(&path);
        wal.save(Some(hard_state(1, 1, 6)), &entries(3..=6, 1))
            .unwrap();
        let batch_end = file_size(&path);
        drop(wal);

        let mut n_entries_seen = 2;
        for cut in batch_start..batch_end {
            let copy = copy_wal(dir.path());
            truncate_file(&last_segment(copy.path()), cut);
            let (_, state) = Wal::open(copy.path()).unwrap();
            // Records survive in order, and the hard state (written last) never survives
            // without all of its batch's entries.
            assert!(state.entries.len() >= n_entries_seen, "cut at {cut}");
            n_entries_seen = state.entries.len();
            assert_eq!(state.entries, entries(1..=n_entries_seen as u64, 1));
            assert_eq!(state.hard_state, hard_state(1, 1, 0), "cut at {cut}");
        }
        assert_eq!(n_entries_seen, 6);
    }

    #[test]
    fn crc_bad_or_zero_filled_tail_is_repaired() {
        let dir = tempfile::tempdir().unwrap();
        let mut wal = Wal::create(dir.path(), b"").unwrap();
        wal.save(None, &entries(1..=3, 1)).unwrap();
        let path = last_segment(dir.path());
        let good_len = file_size(&path);
        wal.save(None, &entries(4..=4, 1)).unwrap();
        let full_len = file_size(&path);
        drop(wal);

        // The last record's payload is damaged (its sector never reached the disk).
        let copy = copy_wal(dir.path());
        flip_byte(&last_segment(copy.path()), full_len - 1);
        let (_, state) = Wal::open(copy.path()).unwrap();
        assert_eq!(state.entries, entries(1..=3, 1));
        assert_eq!(file_size(&last_segment(copy.path())), good_len);

        // The file grew but the new data is zeros (crash before the data blocks were written).
        let copy = copy_wal(dir.path());
        let copy_path = last_segment(copy.path());
        truncate_file(&copy_path, good_len);
        truncate_file(&copy_path, good_len + 100);
        let (_, state) = Wal::open(copy.path()).unwrap();
        assert_eq!(state.entries, entries(1..=3, 1));
        assert_eq!(file_size(&copy_path), good_len);

        // A damaged last record followed only by zeros is torn as well.
        let copy = copy_wal(dir.path());
        let copy_path = last_segment(copy.path());
        flip_byte(&copy_path, full_len - 1);
        truncate_file(&copy_path, full_len + 4096);
        let (_, state) = Wal::open(copy.path()).unwrap();
        assert_eq!(state.entries, entries(1..=3, 1));
        assert_eq!(file_size(&copy_path), good_len);
    }

    #[test]
    fn corrupted_byte_in_a_middle_record_is_corrupt() {
        let dir = tempfile::tempdir().unwrap();
        let mut wal = Wal::create(dir.path(), b"").unwrap();
        let path = last_segment(dir.path());
        let mut boundaries = vec![file_size(&path)];
        for index in 1..=5 {
            wal.save(None, &entries(index..=index, 1)).unwrap();
            boundaries.push(file_size(&path));
        }
        drop(wal);

        // Every byte of entry 3's record: length, its complement, CRC, type, payload.
        let (start, end) = (boundaries[2], boundaries[3]);
        for offset in start..end {
            let copy = copy_wal(dir.path());
            let copy_path = last_segment(copy.path());
            flip_byte(&copy_path, offset);
            let (corrupt_path, corrupt_offset, _) = expect_corrupt(copy.path());
            assert_eq!(corrupt_path, copy_path, "byte {offset}");
            assert_eq!(corrupt_offset, start, "byte {offset}");
            // Nothing was repaired behind our back.
            assert_eq!(file_size(&copy_path), boundaries[5]);
        }

        // Damage inside the segment header is never treated as a torn tail.
        let copy = copy_wal(dir.path());
        // Metadata is empty, so the header's snapshot mark record starts at byte 13.
        flip_byte(&last_segment(copy.path()), 20);
        let (_, offset, _) = expect_corrupt(copy.path());
        assert_eq!(offset, record::HEADER_LEN as u64);
    }

    #[test]
    fn damage_in_a_non_last_segment_is_corrupt() {
        let dir = tempfile::tempdir().unwrap();
        let mut wal = Wal::create_with_options(dir.path(), b"", small_segments()).unwrap();
        for index in 1..=30 {
            wal.save(None, &entries(index..=index, 1)).unwrap();
        }
        drop(wal);
        let first = segment_paths(dir.path()).remove(0);
        let first_len = file_size(&first);

        // A truncated tail of a segment that has a successor is lost data, not a torn write.
        let copy = copy_wal(dir.path());
        let copy_first = segment_paths(copy.path()).remove(0);
        truncate_file(&copy_first, first_len - 1);
        let (path, _, reason) = expect_corrupt(copy.path());
        assert_eq!(path, copy_first);
        assert_eq!(reason, CorruptReason::TruncatedRecord);

        let copy = copy_wal(dir.path());
        let copy_first = segment_paths(copy.path()).remove(0);
        flip_byte(&copy_first, first_len - 1);
        let (path, _, reason) = expect_corrupt(copy.path());
        assert_eq!(path, copy_first);
        assert!(matches!(reason, CorruptReason::CrcMismatch { .. }));
    }

    #[test]
    fn missing_segment_is_corrupt() {
        let dir = tempfile::tempdir().unwrap();
        let mut wal = Wal::create_with_options(dir.path(), b"", small_segments()).unwrap();
        for index in 1..=30 {
            wal.save(None, &entries(index..=index, 1)).unwrap();
        }
        drop(wal);
        let paths = segment_paths(dir.path());
        assert!(paths.len() >= 3);
        fs::remove_file(&paths[1]).unwrap();
        let (path, _, reason) = expect_corrupt(dir.path());
        assert_eq!(path, paths[2]);
        assert_eq!(reason, CorruptReason::MissingSegment { expected: 1 });
    }

    #[test]
    fn reopen_and_continue_appending_after_repair() {
        let dir = tempfile::tempdir().unwrap();
        let mut wal = Wal::create_with_options(dir.path(), b"m", small_segments()).unwrap();
        for index in 1..=10 {
            wal.save(
                Some(hard_state(1, 1, index - 1)),
                &entries(index..=index, 1),
            )
            .unwrap();
        }
        drop(wal);
        let path = last_segment(dir.path());
        truncate_file(&path, file_size(&path) - 3);

        let (mut wal, state) = Wal::open_with_options(dir.path(), small_segments()).unwrap();
        // The last batch lost its hard state record but kept its entry.
        assert_eq!(state.entries, entries(1..=10, 1));
        assert_eq!(state.hard_state, hard_state(1, 1, 8));
        for index in 11..=25 {
            wal.save(
                Some(hard_state(2, 2, index - 1)),
                &entries(index..=index, 2),
            )
            .unwrap();
        }
        drop(wal);

        let (_, state) = Wal::open_with_options(dir.path(), small_segments()).unwrap();
        let mut expected = entries(1..=10, 1);
        expected.extend(entries(11..=25, 2));
        assert_eq!(state.entries, expected);
        assert_eq!(state.hard_state, hard_state(2, 2, 24));
        assert_eq!(state.metadata, b"m");
    }

    #[test]
    fn create_open_and_exists_preconditions() {
        let root = tempfile::tempdir().unwrap();
        let dir = root.path().join("member").join("wal");
        assert!(!Wal::exists(&dir));
        assert!(matches!(Wal::open(&dir), Err(Error::NotFound { .. })));

        drop(Wal::create(&dir, b"").unwrap());
        assert!(Wal::exists(&dir));
        assert!(matches!(
            Wal::create(&dir, b""),
            Err(Error::AlreadyExists { .. })
        ));

        let empty = root.path().join("empty");
        fs::create_dir(&empty).unwrap();
        assert!(matches!(Wal::open(&empty), Err(Error::NotFound { .. })));
        drop(Wal::create(&empty, b"").unwrap());

        let other = root.path().join("other");
        fs::create_dir(&other).unwrap();
        fs::write(other.join("notes"), b"x").unwrap();
        assert!(matches!(
            Wal::create(&other, b""),
            Err(Error::AlreadyExists { .. })
        ));
    }

    #[test]
    fn one_wal_per_directory() {
        let dir = tempfile::tempdir().unwrap();
        let wal = Wal::create(dir.path(), b"").unwrap();
        assert!(matches!(Wal::open(dir.path()), Err(Error::Locked { .. })));
        drop(wal);
        let (_wal, _) = Wal::open(dir.path()).unwrap();
        assert!(matches!(Wal::open(dir.path()), Err(Error::Locked { .. })));
    }

    #[test]
    fn half_created_segment_is_removed_on_open() {
        let dir = tempfile::tempdir().unwrap();
        let mut wal = Wal::create(dir.path(), b"").unwrap();
        wal.save(None, &entries(1..=2, 1)).unwrap();
        drop(wal);
        let stale = dir.path().join("0000000000000001-0000000000000003.wal.tmp");
        fs::write(&stale, b"partial header").unwrap();

        let (_, state) = Wal::open(dir.path()).unwrap();
        assert_eq!(state.entries, entries(1..=2, 1));
        assert!(!stale.exists());
    }

    #[test]
    fn conflicting_metadata_is_rejected() {
        let dir = tempfile::tempdir().unwrap();
        let mut wal = Wal::create_with_options(dir.path(), b"a", small_segments()).unwrap();
        for index in 1..=10 {
            wal.save(None, &entries(index..=index, 1)).unwrap();
        }
        drop(wal);
        // Rewrite the last segment with a different metadata record but otherwise valid.
        let path = last_segment(dir.path());
        let mut buf = Vec::new();
        record::encode_metadata(&mut buf, b"b").unwrap();
        record::encode_snapshot_mark(&mut buf, &SnapshotMark::default()).unwrap();
        record::encode_hard_state(&mut buf, &HardState::default()).unwrap();
        fs::write(&path, buf).unwrap();
        assert!(matches!(
            Wal::open(dir.path()),
            Err(Error::MetadataConflict { .. })
        ));
    }
}
