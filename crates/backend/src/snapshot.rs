//! Point-in-time snapshots of the backend and the snapshot file format (etcd
//! `server/storage/backend` `Snapshot`, and the checks of `etcdutl snapshot restore`).
//!
//! # Taking a snapshot
//!
//! [`Backend::snapshot`] opens one read transaction (redb's snapshot isolation: it sees the last
//! commit and nothing after) and copies every table into a fresh redb database in a temporary
//! file beside the live one (`db.snapshot-<pid>-<n>.tmp`). Readers and the writer keep going
//! meanwhile. The [`Snapshot`] guard deletes the file when dropped, whether the stream finished
//! or failed; files left by a crash are removed by the next [`Backend::open`].
//!
//! # The snapshot image
//!
//! What `Maintenance.Snapshot` streams, and what `etcdctl snapshot save` stores, is:
//!
//! ```text
//! +---------------------------+-------------------------+------------------+
//! | redb database file        | padding (only if needed) | SHA-256 (32 B)   |
//! +---------------------------+-------------------------+------------------+
//! |<-- multiple of 512 bytes ------------------------->|
//! ```
//!
//! etcd clients recognise a snapshot that carries its digest by its size: `size % 512 == 32`
//! (`hasChecksum` in etcd's snapshot code; `etcdctl snapshot save` refuses anything else). The
//! digest is the SHA-256 of every byte before it.
//!
//! redb files are a whole number of 4 KiB pages, so in practice there is no padding. Should a
//! database ever end off a 512-byte boundary, it is followed by zero bytes and a 16-byte trailer
//! (`etcdrsPD` then the database length, little-endian u64) ending on the boundary. redb
//! refuses files with trailing bytes, so [`restore_image`] cuts the trailer and padding off
//! again.
//!
//! **Invariants:** the image before the digest is a multiple of 512 bytes; it is a redb file
//! exactly when it does not end with a valid trailer.

use std::fs::{File, OpenOptions};
use std::io::{Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use redb::{ReadableTable, TableDefinition, TableHandle};
use sha2::{Digest, Sha256};

use crate::{Backend, Error, ReadTx, Result};

/// Length of the SHA-256 digest that ends a snapshot stream.
pub const SHA256_LEN: u64 = 32;
/// The image before the digest is a whole number of these.
const SECTOR: u64 = 512;
/// Marks the padding trailer.
const TRAILER_MAGIC: [u8; 8] = *b"etcdrsPD";
const TRAILER_LEN: u64 = 16;
/// Commit the copy every this many bytes so that one huge transaction does not pile up in
/// memory. Each durable commit sends that much to the disk at once, and a WAL fsync made
/// meanwhile waits for it: one client putting 500 times a second during a defragmentation of
/// 1,000,000 keys of 1 KiB saw a p99 of 18-22 ms with 16 MiB (the WAL's fsyncs slow once per
/// commit) and 7-10 ms with 4 MiB, but the defragmentation of the scale section's member
/// (`scripts/bench-compare`, `BENCH_SCALE=1`) took 12.1 s with 4 MiB against 6.1-6.3 s with
/// 16 MiB (etcd 3.4: 10.8 s, every request waiting).
const COPY_COMMIT_BYTES: u64 = 16 << 20;
/// Page cache for the copy: it is written once and read once, so a small one is enough.
const COPY_CACHE_BYTES: usize = 16 << 20;

/// Distinguishes temporary files of concurrent snapshots of one process.
static SNAPSHOT_SEQ: AtomicU64 = AtomicU64::new(0);

/// A snapshot image in a temporary file. Dropping it deletes the file.
#[derive(Debug)]
pub struct Snapshot {
    path: PathBuf,
    size: u64,
    /// When it was taken: its lifetime is observed in
    /// `etcd_disk_backend_snapshot_duration_seconds` when it is dropped.
    taken: std::time::Instant,
}

impl Snapshot {
    /// Bytes of the image (database and padding, without the digest the stream appends).
    pub fn size(&self) -> u64 {
        self.size
    }

    /// The temporary file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Open the image for reading from the start.
    pub fn open(&self) -> Result<File> {
        File::open(&self.path).map_err(Error::Io)
    }
}

impl Drop for Snapshot {
    fn drop(&mut self) {
        crate::metrics::SNAPSHOT_SECONDS.observe(self.taken.elapsed().as_secs_f64());
        if let Err(e) = std::fs::remove_file(&self.path)
            && e.kind() != std::io::ErrorKind::NotFound
        {
            tracing::warn!(path = %self.path.display(), error = %e, "failed to remove snapshot file");
        }
    }
}

/// The SHA-256 that ends a snapshot stream, computed over the bytes as they are sent.
#[derive(Clone, Debug, Default)]
pub struct ImageDigest(Sha256);

impl ImageDigest {
    /// An empty digest.
    pub fn new() -> Self {
        Self::default()
    }

    /// Feed the next bytes of the image.
    pub fn update(&mut self, bytes: &[u8]) {
        self.0.update(bytes);
    }

    /// The digest of everything fed.
    pub fn finish(self) -> [u8; SHA256_LEN as usize] {
        self.0.finalize().into()
    }
}

/// Whether [`restore_image`] checks the digest (`--skip-hash-check` turns it off, for a
/// database copied straight out of a data directory).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HashCheck {
    /// Require the digest and check it.
    Verify,
    /// Take the file as it is; drop a digest if there is one.
    Skip,
}

/// File-name prefix of the temporary snapshot files beside `db_path`.
fn temp_prefix(db_path: &Path) -> String {
    let name = db_path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| "db".to_string());
    format!("{name}.snapshot-")
}

/// Remove snapshot files a previous process left beside `db_path` (it crashed mid-stream).
pub(crate) fn remove_stale(db_path: &Path) {
    let Some(dir) = db_path.parent() else { return };
    let prefix = temp_prefix(db_path);
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        if name.starts_with(&prefix) && name.ends_with(".tmp") {
            match std::fs::remove_file(entry.path()) {
                Ok(()) => {
                    tracing::info!(path = %entry.path().display(), "removed stale snapshot file")
                }
                Err(e) => {
                    tracing::warn!(path = %entry.path().display(), error = %e, "cannot remove stale snapshot file")
                }
            }
        }
    }
}

/// Padding to append to a database of `db_len` bytes so that it ends on a sector: nothing, or
/// zeros and the trailer.
fn padding(db_len: u64) -> Vec<u8> {
    if db_len.is_multiple_of(SECTOR) {
        return Vec::new();
    }
    let total = (db_len + TRAILER_LEN).div_ceil(SECTOR) * SECTOR;
    let mut pad = vec![0u8; (total - db_len) as usize];
    let at = pad.len() - TRAILER_LEN as usize;
    pad[at..at + 8].copy_from_slice(&TRAILER_MAGIC);
    pad[at + 8..].copy_from_slice(&db_len.to_le_bytes());
    pad
}

/// The database length inside an image of `image_len` bytes whose last 16 bytes are `tail`.
fn db_len(image_len: u64, tail: &[u8; TRAILER_LEN as usize]) -> u64 {
    if tail[..8] != TRAILER_MAGIC {
        return image_len;
    }
    let mut len_bytes = [0u8; 8];
    len_bytes.copy_from_slice(&tail[8..]);
    let len = u64::from_le_bytes(len_bytes);
    // A real trailer sits in the last sector after the database.
    if len <= image_len - TRAILER_LEN && image_len - len < SECTOR + TRAILER_LEN {
        len
    } else {
        image_len
    }
}

impl Backend {
    /// A guard for a new temporary snapshot file beside the database (not yet created).
    fn snapshot_guard(&self) -> Snapshot {
        let seq = SNAPSHOT_SEQ.fetch_add(1, Ordering::Relaxed);
        let name = format!(
            "{}{}-{seq}.tmp",
            temp_prefix(&self.path),
            std::process::id()
        );
        Snapshot {
            path: self.path.with_file_name(name),
            size: 0,
            taken: std::time::Instant::now(),
        }
    }

    /// Write the last commit, as `write` lays it out, into a temporary file beside the
    /// database: `write` gets one read transaction and the new file, and returns the image's
    /// length, which must be a multiple of 512 bytes (the digest rule in the module docs). Runs
    /// in the caller's thread and does not block other transactions; the guard removes the
    /// file, also when `write` fails.
    pub fn snapshot_with<E: From<Error>>(
        &self,
        write: impl FnOnce(&ReadTx, File) -> std::result::Result<u64, E>,
    ) -> std::result::Result<Snapshot, E> {
        let mut snapshot = self.snapshot_guard();
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .open(&snapshot.path)
            .map_err(Error::Io)?;
        let read = self.read()?;
        let size = write(&read, file)?;
        drop(read);
        if !size.is_multiple_of(SECTOR) {
            return Err(Error::Io(std::io::Error::other(format!(
                "snapshot image of {size} bytes does not end on a {SECTOR}-byte boundary"
            )))
            .into());
        }
        snapshot.size = size;
        Ok(snapshot)
    }

    /// Copy the last commit into a snapshot image (a redb database, what members send each
    /// other) in a temporary file beside the database. Runs in the caller's thread and does
    /// not block other transactions.
    pub fn snapshot(&self) -> Result<Snapshot> {
        // From here on the guard removes the file, also when the copy fails.
        let mut snapshot = self.snapshot_guard();
        // The batches committed so far into the file first (durably, so that the file stays
        // what its last durable commit holds): the copy is of the file alone.
        self.write()?.commit(true)?;
        let read = self.read()?;
        {
            let copy = redb::Database::builder()
                .set_cache_size(COPY_CACHE_BYTES)
                .create(&snapshot.path)
                .map_err(Error::storage)?;
            copy_tables(&read.tx, &copy, redb::Durability::Immediate)?;
        }
        drop(read);
        let mut file = OpenOptions::new()
            .append(true)
            .open(&snapshot.path)
            .map_err(Error::Io)?;
        let db_len = file.metadata().map_err(Error::Io)?.len();
        let pad = padding(db_len);
        file.write_all(&pad).map_err(Error::Io)?;
        snapshot.size = db_len + pad.len() as u64;
        Ok(snapshot)
    }
}

/// Copy every table `read` sees into `copy`, committing at least once per table and every
/// [`COPY_COMMIT_BYTES`], each commit with `durability`; all but the backend's record of its
/// stored bytes ([`crate::STATS`]), which the copy could not keep true: the next commit of a
/// defragmented file records the count again, and a file opened or installed without one
/// is counted.
pub(crate) fn copy_tables(
    read: &redb::ReadTransaction,
    copy: &redb::Database,
    durability: redb::Durability,
) -> Result<()> {
    let names: Vec<String> = read
        .list_tables()
        .map_err(Error::storage)?
        .map(|t| t.name().to_string())
        .filter(|name| name != crate::STATS.name())
        .collect();
    for name in &names {
        let definition: TableDefinition<'_, &[u8], &[u8]> = TableDefinition::new(name);
        let source = read.open_table(definition).map_err(Error::storage)?;
        let mut entries = source.iter().map_err(Error::storage)?;
        loop {
            let mut tx = copy.begin_write().map_err(Error::storage)?;
            tx.set_durability(durability).map_err(Error::storage)?;
            let mut copied_all = true;
            {
                // Created even when the source is empty, so the copy has the same buckets.
                let mut target = tx.open_table(definition).map_err(Error::storage)?;
                // The pairs come in order, past everything copied before: through a cursor at
                // the table's end, redb packs them into full leaves and branch pages
                // (`WriteTx::insert_all` says why that matters).
                let mut cursor = target
                    .upper_bound_mut(std::ops::Bound::<&[u8]>::Unbounded)
                    .map_err(Error::storage)?;
                let mut pending = 0u64;
                for item in entries.by_ref() {
                    let (key, value) = item.map_err(Error::storage)?;
                    cursor
                        .insert_before(key.value(), value.value())
                        .map_err(Error::storage)?;
                    pending += (key.value().len() + value.value().len()) as u64;
                    if pending >= COPY_COMMIT_BYTES {
                        copied_all = false;
                        break;
                    }
                }
                cursor.close().map_err(Error::storage)?;
            }
            tx.commit().map_err(Error::storage)?;
            if copied_all {
                break;
            }
        }
    }
    Ok(())
}

/// Write the database held in the snapshot image `image` to `db_path` (a new file), as
/// `etcdutl snapshot restore` does: a digest is recognised by the image's size (`% 512 ==
/// 32`), checked unless `check` is [`HashCheck::Skip`], and cut off; padding is cut off too.
/// Returns the database's length.
pub fn restore_image(image: &Path, db_path: &Path, check: HashCheck) -> Result<u64> {
    let mut source = File::open(image).map_err(Error::Io)?;
    let image_len = source.metadata().map_err(Error::Io)?.len();
    let has_digest = image_len % SECTOR == SHA256_LEN;
    if !has_digest && check == HashCheck::Verify {
        return Err(Error::SnapshotMissingHash);
    }
    let data_len = if has_digest {
        image_len - SHA256_LEN
    } else {
        image_len
    };
    let parent = db_path
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    crate::create_dir_all_synced(parent).map_err(Error::Io)?;
    let mut target = OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(db_path)
        .map_err(Error::Io)?;
    let mut digest = ImageDigest::new();
    let mut buf = vec![0u8; 64 * 1024];
    let mut left = data_len;
    while left > 0 {
        let want = buf.len().min(usize::try_from(left).unwrap_or(usize::MAX));
        source.read_exact(&mut buf[..want]).map_err(Error::Io)?;
        digest.update(&buf[..want]);
        target.write_all(&buf[..want]).map_err(Error::Io)?;
        left -= want as u64;
    }
    if has_digest && check == HashCheck::Verify {
        let mut expected = [0u8; SHA256_LEN as usize];
        source.read_exact(&mut expected).map_err(Error::Io)?;
        let got = digest.finish();
        if expected != got {
            return Err(Error::SnapshotHashMismatch {
                expected: expected.to_vec(),
                got: got.to_vec(),
            });
        }
    }
    let len = if data_len >= TRAILER_LEN {
        let mut tail = [0u8; TRAILER_LEN as usize];
        target.flush().map_err(Error::Io)?;
        let mut reader = File::open(db_path).map_err(Error::Io)?;
        reader
            .seek(SeekFrom::Start(data_len - TRAILER_LEN))
            .map_err(Error::Io)?;
        reader.read_exact(&mut tail).map_err(Error::Io)?;
        db_len(data_len, &tail)
    } else {
        data_len
    };
    target.set_len(len).map_err(Error::Io)?;
    target.sync_all().map_err(Error::Io)?;
    crate::sync_dir(parent).map_err(Error::Io)?;
    Ok(len)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Bucket;

    #[test]
    fn padding_ends_on_a_sector_and_round_trips() {
        for len in [4096u64, 1, 100, 495, 496, 497, 511, 513, 8191] {
            let pad = padding(len);
            assert_eq!((len + pad.len() as u64) % SECTOR, 0, "len {len}");
            if len % SECTOR == 0 {
                assert!(pad.is_empty());
                continue;
            }
            let image_len = len + pad.len() as u64;
            let mut tail = [0u8; 16];
            tail.copy_from_slice(&pad[pad.len() - 16..]);
            assert_eq!(db_len(image_len, &tail), len, "len {len}");
        }
        // Without the magic the image is the database.
        assert_eq!(db_len(4096, &[0u8; 16]), 4096);
        // A magic whose length cannot be right is not a trailer.
        let mut tail = [0u8; 16];
        tail[..8].copy_from_slice(&TRAILER_MAGIC);
        tail[8..].copy_from_slice(&7u64.to_le_bytes());
        assert_eq!(db_len(4096, &tail), 4096);
    }

    fn stream(snapshot: &Snapshot) -> Vec<u8> {
        let mut bytes = Vec::new();
        snapshot.open().unwrap().read_to_end(&mut bytes).unwrap();
        assert_eq!(bytes.len() as u64, snapshot.size());
        let mut digest = ImageDigest::new();
        digest.update(&bytes);
        bytes.extend_from_slice(&digest.finish());
        bytes
    }

    #[test]
    fn snapshot_is_point_in_time_and_restores() {
        let dir = tempfile::tempdir().unwrap();
        let backend = Backend::open(&dir.path().join("member/snap/db")).unwrap();
        let tx = backend.write().unwrap();
        // Over COPY_COMMIT_BYTES, so the copy commits more than once.
        for i in 0u32..20_000 {
            tx.put(Bucket::KEY, &i.to_be_bytes(), &[1u8; 1000]).unwrap();
        }
        tx.put(Bucket::META, b"m", b"v").unwrap();
        tx.commit(false).unwrap();
        let expected_hash = backend.read().unwrap().hash(&[]).unwrap();
        let snapshot = backend.snapshot().unwrap();
        // Later writes are not in the snapshot.
        let tx = backend.write().unwrap();
        tx.put(Bucket::KEY, b"later", b"x").unwrap();
        tx.commit(false).unwrap();

        let image = stream(&snapshot);
        assert_eq!(image.len() as u64 % SECTOR, SHA256_LEN);
        let temp = snapshot.path().to_path_buf();
        assert!(temp.exists());
        drop(snapshot);
        assert!(!temp.exists(), "the guard removes the file");

        let image_path = dir.path().join("snap.db");
        std::fs::write(&image_path, &image).unwrap();
        let restored = dir.path().join("restored/member/snap/db");
        restore_image(&image_path, &restored, HashCheck::Verify).unwrap();
        let copy = Backend::open(&restored).unwrap();
        let read = copy.read().unwrap();
        assert_eq!(read.len(Bucket::KEY).unwrap(), 20_000);
        assert_eq!(read.get(Bucket::KEY, b"later").unwrap(), None);
        assert_eq!(read.get(Bucket::META, b"m").unwrap().unwrap(), b"v");
        assert_eq!(read.hash(&[]).unwrap(), expected_hash);
    }

    #[test]
    fn restore_checks_the_digest() {
        let dir = tempfile::tempdir().unwrap();
        let backend = Backend::open(&dir.path().join("db")).unwrap();
        let snapshot = backend.snapshot().unwrap();
        let mut image = stream(&snapshot);
        let image_path = dir.path().join("snap.db");

        let last = image.len() - 1;
        image[last] ^= 1;
        std::fs::write(&image_path, &image).unwrap();
        let err = restore_image(&image_path, &dir.path().join("a"), HashCheck::Verify).unwrap_err();
        assert!(matches!(err, Error::SnapshotHashMismatch { .. }), "{err}");
        assert!(err.to_string().starts_with("expected sha256 ["), "{err}");
        // Skipping the check still cuts the digest off.
        let len = restore_image(&image_path, &dir.path().join("b"), HashCheck::Skip).unwrap();
        assert_eq!(len, snapshot.size());
        Backend::open(&dir.path().join("b")).unwrap();

        // A bare database file (copied from a data dir) needs --skip-hash-check.
        std::fs::write(&image_path, &image[..snapshot.size() as usize]).unwrap();
        let err = restore_image(&image_path, &dir.path().join("c"), HashCheck::Verify).unwrap_err();
        assert_eq!(
            err.to_string(),
            "snapshot missing hash but --skip-hash-check=false"
        );
        restore_image(&image_path, &dir.path().join("d"), HashCheck::Skip).unwrap();
        Backend::open(&dir.path().join("d")).unwrap();
    }

    #[test]
    fn open_removes_stale_snapshot_files() {
        let dir = tempfile::tempdir().unwrap();
        let db = dir.path().join("db");
        Backend::open(&db).unwrap();
        let stale = dir.path().join("db.snapshot-1-0.tmp");
        std::fs::write(&stale, b"junk").unwrap();
        let other = dir.path().join("keep.tmp");
        std::fs::write(&other, b"junk").unwrap();
        Backend::open(&db).unwrap();
        assert!(!stale.exists());
        assert!(other.exists());
    }
}
