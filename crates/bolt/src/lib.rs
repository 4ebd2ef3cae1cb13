//! A reader and a writer of bbolt database files: the format of etcd's backend
//! (`member/snap/db`) and of etcd's snapshot files. Port of the file format of
//! `go.etcd.io/bbolt` (`page.go`, `node.go`, `bucket.go`, the meta in `db.go`,
//! `freelist.go`), not of its engine.
//!
//! # What this crate owns
//!
//! - [`Db`]: opens a bbolt file read-only, picks the valid meta with the higher txid, and
//!   walks top-level buckets in key order (inline buckets and overflow pages included) with
//!   positioned reads, so multi-GB files are never read whole.
//! - [`Writer`]: lays out a fresh, compact bbolt file from buckets and keys given in
//!   ascending order, streaming leaf pages out as keys arrive; it satisfies bbolt's
//!   `tx.Check` (every page below the high-water mark reachable exactly once, an empty
//!   freelist), so `etcdctl snapshot status/restore` and etcd 3.4 accept it.
//! - [`etcd_status_hash`]: the hash `etcdctl snapshot status` prints for a file.
//!
//! # What it is not
//!
//! Not a storage engine: no updates in place, no transactions, no freelist reuse. It knows
//! nothing of etcd's buckets or encodings (keys and values are bytes) and nothing of redb.
//! Nested buckets are not supported: the reader refuses them by name ([`Error::NestedBucket`]),
//! the writer cannot make them. etcd has none.
//!
//! # Layout
//!
//! - `page`: the on-disk structures (page header, elements, meta, FNV-1a checksum).
//! - `reader`: [`Db`].
//! - `writer`: [`Writer`].
//! - `error`: [`Error`], [`CorruptReason`].
//! - The page layout as implemented is in `crates/bolt/FORMAT.md`.
//!
//! # Why our own codec
//!
//! We tried `bbolt-rs` 1.3.10 (MIT, a port of bbolt 1.3.10) in a scratch project. It could
//! not open any file etcd 3.4 wrote: a snapshot, the same file without its SHA-256 trailer
//! and `member/snap/db` all failed with `InvalidDatabase(true)`, as did a 131 MiB file that
//! Go's bbolt checks clean (we did not debug why). It is a whole engine whose
//! normal dependencies resolve to 119 crates (clap, anyhow, fake, rand, bumpalo, ...).
//! Writing 1M keys of 100 bytes in one transaction took 1.8 s and 897 MB of RSS for a
//! 276 MB file, because a transaction holds every node in memory (its TODO: "almost 3x the
//! Go version"), so it cannot stream a file out; our [`Writer`] writes the same shape of
//! data in about 0.2 s, 2 MiB of RSS, 131 MiB of file (example `million`). This codec has
//! one dependency (thiserror) and no `unsafe`.

#![deny(missing_docs)]

mod error;
mod page;
mod reader;
mod writer;

pub use error::{CorruptReason, Error, Result};
pub use reader::Db;
pub use writer::Writer;

/// The hash `etcdctl snapshot status` reports for a file (etcd 3.4
/// `clientv3/snapshot.v3Manager.Status`): CRC-32 (Castagnoli) over, for each top-level
/// bucket in name order, the bucket name and then each key followed by its value.
pub fn etcd_status_hash(db: &Db) -> Result<u32> {
    let mut crc = Crc32c::new();
    for name in db.bucket_names()? {
        crc.update(&name);
        db.for_each(&name, |key, value| -> Result<()> {
            crc.update(key);
            crc.update(value);
            Ok(())
        })?;
    }
    Ok(crc.finish())
}

/// CRC-32C (Castagnoli, reflected polynomial 0x82F63B78), as Go's `crc32.MakeTable(Castagnoli)`.
/// Slicing by 8 tables: etcd hashes every byte of the file.
struct Crc32c {
    state: u32,
}

const CRC32C_TABLES: [[u32; 256]; 8] = crc32c_tables();

const fn crc32c_tables() -> [[u32; 256]; 8] {
    const POLY: u32 = 0x82F6_3B78;
    let mut tables = [[0u32; 256]; 8];
    let mut byte = 0;
    while byte < 256 {
        let mut crc = byte as u32;
        let mut bit = 0;
        while bit < 8 {
            crc = if crc & 1 == 1 {
                (crc >> 1) ^ POLY
            } else {
                crc >> 1
            };
            bit += 1;
        }
        tables[0][byte] = crc;
        byte += 1;
    }
    let mut table = 1;
    while table < 8 {
        let mut byte = 0;
        while byte < 256 {
            let previous = tables[table - 1][byte];
            tables[table][byte] = (previous >> 8) ^ tables[0][(previous & 0xFF) as usize];
            byte += 1;
        }
        table += 1;
    }
    tables
}

impl Crc32c {
    fn new() -> Crc32c {
        Crc32c { state: !0 }
    }

    fn update(&mut self, bytes: &[u8]) {
        let tables = &CRC32C_TABLES;
        let mut crc = self.state;
        let mut chunks = bytes.chunks_exact(8);
        for chunk in &mut chunks {
            let low = crc ^ u32::from_le_bytes([chunk[0], chunk[1], chunk[2], chunk[3]]);
            crc = tables[7][(low & 0xFF) as usize]
                ^ tables[6][((low >> 8) & 0xFF) as usize]
                ^ tables[5][((low >> 16) & 0xFF) as usize]
                ^ tables[4][(low >> 24) as usize]
                ^ tables[3][usize::from(chunk[4])]
                ^ tables[2][usize::from(chunk[5])]
                ^ tables[1][usize::from(chunk[6])]
                ^ tables[0][usize::from(chunk[7])];
        }
        for &byte in chunks.remainder() {
            crc = (crc >> 8) ^ tables[0][((crc ^ u32::from(byte)) & 0xFF) as usize];
        }
        self.state = crc;
    }

    fn finish(&self) -> u32 {
        !self.state
    }
}

#[cfg(test)]
mod tests;
