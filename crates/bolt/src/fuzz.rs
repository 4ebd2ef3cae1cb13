//! Fuzzing of the bbolt reader (issue 20): [`Db`] opens files etcd-rs did not write (etcd's
//! `member/snap/db`, a snapshot a user hands to `etcd snapshot restore`), so every walk over a
//! damaged file must end in an error: no panic, no page read trusted past the file, no cycle
//! of pages followed forever. Corpus: `crates/bolt/fuzz-corpus/db/`, etcd 3.4's backend
//! (`scripts/fuzz-corpus-etcd34`) plus a file from [`Writer`] with inline buckets and overflow
//! pages. Runner and knobs: `etcdrs-fuzz`.

use std::io::Cursor;

use etcdrs_fuzz::Fuzz;

use crate::page::{META_CHECKSUMMED, PAGE_HEADER_SIZE, fnv1a64};
use crate::{Db, Writer, etcd_status_hash};

/// A small file of our writer's: an empty bucket (inline), a bucket with a value that spans
/// overflow pages, and one with enough keys for a branch page.
fn written_db() -> Vec<u8> {
    let mut writer = Writer::new(Cursor::new(Vec::new())).expect("start a file");
    writer.bucket(b"alarm").expect("bucket");
    writer.bucket(b"big").expect("bucket");
    writer.put(b"k", &[0x5a; 5000]).expect("put");
    writer.bucket(b"key").expect("bucket");
    for n_key in 0..200u32 {
        writer
            .put(format!("{n_key:08}").as_bytes(), b"value")
            .expect("put");
    }
    let (out, _) = writer.finish().expect("finish the file");
    out.into_inner()
}

/// Makes the mutated meta pages' checksums right again on some inputs (chosen by a hash of
/// the input, so the choice replays), so that the walk behind them is reached; the others
/// test the checksum itself.
fn fix_meta_checksums(input: &mut [u8]) {
    if fnv1a64(input).is_multiple_of(2) {
        return;
    }
    let page_size = input
        .get(PAGE_HEADER_SIZE + 8..PAGE_HEADER_SIZE + 12)
        .map_or(4096, |raw| {
            u32::from_le_bytes([raw[0], raw[1], raw[2], raw[3]]) as usize
        });
    for meta_page in [0, page_size] {
        let start = meta_page.saturating_add(PAGE_HEADER_SIZE);
        let Some(covered) = input.get(start..start + META_CHECKSUMMED) else {
            continue;
        };
        let sum = fnv1a64(covered).to_le_bytes();
        let at = start + META_CHECKSUMMED;
        if let Some(slot) = input.get_mut(at..at + 8) {
            slot.copy_from_slice(&sum);
        }
    }
}

/// Everything a caller may do with an opened file.
fn walk(db: &Db) {
    let _ = etcd_status_hash(db);
    let Ok(names) = db.bucket_names() else {
        return;
    };
    for name in names {
        let _ = db.len(&name);
        let _ = db.get(&name, b"k");
        let _ = db.get(&name, b"00000100");
        let _ = db.for_each(&name, |_, _| -> crate::Result<()> { Ok(()) });
    }
}

#[test]
fn fuzz_bolt_db() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("db");
    Fuzz::new("bolt-db")
        .corpus_dir(concat!(env!("CARGO_MANIFEST_DIR"), "/fuzz-corpus/db"))
        .input("written-inline-overflow-branch", written_db())
        .max_len(128 * 1024)
        .iterations(800)
        .run(|input| {
            let mut input = input.to_vec();
            fix_meta_checksums(&mut input);
            std::fs::write(&path, &input).expect("write the mutated file");
            if let Ok(db) = Db::open(&path) {
                walk(&db);
            }
        });
}
