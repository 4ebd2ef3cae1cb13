//! Round trips through real files: [`Writer`] output read back by [`Db`], plus the reader's
//! errors on damaged files. Files written by Go's bbolt (through etcd) are in
//! `tests/etcd.rs`.

use std::collections::BTreeMap;
use std::fs::{File, OpenOptions};
use std::io::{BufWriter, Read, Seek, SeekFrom, Write};
use std::path::Path;

use super::*;
use crate::page::{BUCKET_LEAF_FLAG, LEAF_PAGE_FLAG, PageHeader, u32_at, u64_at};

type Buckets = BTreeMap<Vec<u8>, BTreeMap<Vec<u8>, Vec<u8>>>;

fn write_file(path: &Path, buckets: &Buckets) -> u64 {
    let file = File::create(path).unwrap();
    let mut writer = Writer::new(BufWriter::new(file)).unwrap();
    for (name, keys) in buckets {
        writer.bucket(name).unwrap();
        for (key, value) in keys {
            writer.put(key, value).unwrap();
        }
    }
    let (out, len) = writer.finish().unwrap();
    drop(out);
    len
}

fn read_all(db: &Db) -> Buckets {
    let mut buckets = Buckets::new();
    for name in db.bucket_names().unwrap() {
        let mut keys = BTreeMap::new();
        db.for_each(&name, |key, value| -> Result<()> {
            keys.insert(key.to_vec(), value.to_vec());
            Ok(())
        })
        .unwrap();
        buckets.insert(name, keys);
    }
    buckets
}

/// Checks bbolt's `tx.Check` rules on a file: every page below the high-water mark is a
/// meta, the freelist, or reached exactly once from the root; reachable pages are leaves or
/// branches; and branch keys equal their child's first key.
fn check_pages(path: &Path) {
    let mut bytes = Vec::new();
    File::open(path).unwrap().read_to_end(&mut bytes).unwrap();
    let page = |id: u64| &bytes[id as usize * 4096..];
    let meta = page::Meta::parse(&page(0)[16..]).unwrap();
    assert_eq!(
        bytes.len() as u64,
        meta.pgid * 4096,
        "file length = pgid * page size"
    );
    let mut seen = vec![0u32; meta.pgid as usize];
    seen[0] += 1;
    seen[1] += 1;
    let freelist = PageHeader::parse(page(meta.freelist)).unwrap();
    assert_eq!(freelist.flags, page::FREELIST_PAGE_FLAG);
    assert_eq!(freelist.count, 0);
    seen[meta.freelist as usize] += 1;

    // Walks a tree, returning its first key.
    fn visit(bytes: &[u8], id: u64, seen: &mut Vec<u32>, is_root: bool) -> Vec<u8> {
        let buf = &bytes[id as usize * 4096..];
        let header = PageHeader::parse(buf).unwrap();
        assert_eq!(header.id, id);
        for n in 0..=u64::from(header.overflow) {
            seen[(id + n) as usize] += 1;
        }
        let mut first = Vec::new();
        for index in 0..usize::from(header.count) {
            let at = 16 + index * 16;
            if header.flags == LEAF_PAGE_FLAG {
                let flags = u32_at(buf, at).unwrap();
                let pos = u32_at(buf, at + 4).unwrap() as usize;
                let ksize = u32_at(buf, at + 8).unwrap() as usize;
                let vsize = u32_at(buf, at + 12).unwrap() as usize;
                let key = &buf[at + pos..at + pos + ksize];
                let value = &buf[at + pos + ksize..at + pos + ksize + vsize];
                if index == 0 {
                    first = key.to_vec();
                }
                if is_root {
                    assert_eq!(flags, BUCKET_LEAF_FLAG);
                    let child = u64_at(value, 0).unwrap();
                    if child != 0 {
                        visit(bytes, child, seen, false);
                    }
                }
            } else {
                assert_eq!(header.flags, page::BRANCH_PAGE_FLAG);
                let pos = u32_at(buf, at).unwrap() as usize;
                let ksize = u32_at(buf, at + 4).unwrap() as usize;
                let child = u64_at(buf, at + 8).unwrap();
                let key = buf[at + pos..at + pos + ksize].to_vec();
                let child_first = visit(bytes, child, seen, is_root);
                assert_eq!(key, child_first, "branch key is the child's first key");
                if index == 0 {
                    first = key;
                }
            }
        }
        first
    }
    visit(&bytes, meta.root, &mut seen, true);
    for (id, count) in seen.iter().enumerate() {
        assert_eq!(*count, 1, "page {id} referenced {count} times");
    }
}

fn bucket_of(pairs: impl IntoIterator<Item = (Vec<u8>, Vec<u8>)>) -> BTreeMap<Vec<u8>, Vec<u8>> {
    pairs.into_iter().collect()
}

#[test]
fn round_trip_empty_file_and_empty_buckets() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("db");
    let len = write_file(&path, &Buckets::new());
    assert_eq!(
        len,
        4 * 4096,
        "two metas, an empty root leaf and the freelist"
    );
    let db = Db::open(&path).unwrap();
    assert_eq!(db.bucket_names().unwrap(), Vec::<Vec<u8>>::new());
    assert_eq!(db.page_size(), 4096);
    assert_eq!(db.tx_id(), 2);
    check_pages(&path);

    let mut buckets = Buckets::new();
    buckets.insert(b"a".to_vec(), BTreeMap::new());
    buckets.insert(b"b".to_vec(), BTreeMap::new());
    write_file(&path, &buckets);
    let db = Db::open(&path).unwrap();
    assert_eq!(read_all(&db), buckets);
    assert_eq!(db.len(b"a").unwrap(), 0);
    assert_eq!(db.get(b"a", b"x").unwrap(), None);
    check_pages(&path);
}

#[test]
fn round_trip_one_key_and_an_overflow_value() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("db");
    let mut buckets = Buckets::new();
    buckets.insert(b"one".to_vec(), bucket_of([(b"k".to_vec(), b"v".to_vec())]));
    let big: Vec<u8> = (0..20_000u32).map(|i| (i % 251) as u8).collect();
    buckets.insert(
        b"two".to_vec(),
        bucket_of([
            (b"a".to_vec(), b"small".to_vec()),
            (b"b".to_vec(), big.clone()),
            (b"c".to_vec(), vec![1; 4090]),
            (b"d".to_vec(), Vec::new()),
        ]),
    );
    write_file(&path, &buckets);
    check_pages(&path);
    let db = Db::open(&path).unwrap();
    assert_eq!(read_all(&db), buckets);
    assert_eq!(db.get(b"one", b"k").unwrap(), Some(b"v".to_vec()));
    assert_eq!(db.get(b"two", b"b").unwrap(), Some(big));
    assert_eq!(db.get(b"two", b"d").unwrap(), Some(Vec::new()));
    assert_eq!(db.get(b"two", b"e").unwrap(), None);
    assert!(matches!(
        db.get(b"three", b"k"),
        Err(Error::BucketNotFound { .. })
    ));
}

#[test]
fn round_trip_100k_keys_of_varied_length_across_buckets() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("db");
    let mut buckets = Buckets::new();
    let mut n_keys = 0;
    for (bucket_idx, name) in [&b"key"[..], b"lease", b"meta", b"tiny"].iter().enumerate() {
        let count = [70_000, 29_000, 990, 10][bucket_idx];
        let mut keys = BTreeMap::new();
        for key_idx in 0..count {
            let mut key = format!("{key_idx:08}").into_bytes();
            key.extend(std::iter::repeat_n(b'k', key_idx % 97));
            let value = vec![(key_idx % 256) as u8; (key_idx * 7) % 300];
            keys.insert(key, value);
            n_keys += 1;
        }
        buckets.insert(name.to_vec(), keys);
    }
    assert_eq!(n_keys, 100_000);
    write_file(&path, &buckets);
    check_pages(&path);
    let db = Db::open(&path).unwrap();
    assert_eq!(read_all(&db), buckets);
    assert_eq!(db.len(b"key").unwrap(), 70_000);
    for (name, keys) in &buckets {
        for (key, value) in keys.iter().step_by(997) {
            assert_eq!(db.get(name, key).unwrap().as_ref(), Some(value));
        }
        assert_eq!(db.get(name, b"zzzz").unwrap(), None);
        assert_eq!(db.get(name, b"\0").unwrap(), None);
    }
}

#[test]
fn many_buckets_make_a_branching_root() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("db");
    let mut buckets = Buckets::new();
    for bucket_idx in 0..2_000 {
        let name = format!("bucket-{bucket_idx:05}").into_bytes();
        let keys = (0..bucket_idx % 5)
            .map(|key_idx| (vec![b'a' + key_idx as u8], vec![7; bucket_idx % 300]))
            .collect();
        buckets.insert(name, keys);
    }
    write_file(&path, &buckets);
    check_pages(&path);
    let db = Db::open(&path).unwrap();
    assert_eq!(read_all(&db), buckets);
}

#[test]
fn writer_refuses_bad_input() {
    let mut writer = Writer::new(std::io::Cursor::new(Vec::new())).unwrap();
    assert!(matches!(writer.put(b"k", b"v"), Err(Error::NoBucket)));
    assert!(matches!(writer.bucket(b""), Err(Error::Required(_))));
    writer.bucket(b"b").unwrap();
    assert!(matches!(
        writer.bucket(b"a"),
        Err(Error::OutOfOrder { what: "bucket", .. })
    ));
    assert!(matches!(
        writer.bucket(b"b"),
        Err(Error::OutOfOrder { what: "bucket", .. })
    ));
    writer.put(b"k2", b"v").unwrap();
    let error = writer.put(b"k1", b"v").unwrap_err();
    assert_eq!(
        error.to_string(),
        "bolt: out of order: key \"k1\" does not sort after \"k2\""
    );
    assert!(matches!(
        writer.put(b"k2", b"v"),
        Err(Error::OutOfOrder { what: "key", .. })
    ));
    assert!(matches!(writer.put(b"", b"v"), Err(Error::Required(_))));
    assert!(matches!(
        writer.put(&[b'x'; 32769], b"v"),
        Err(Error::KeyTooLarge { .. })
    ));
    // Byte order, not length order: "k10" sorts before "k2" and after "k1".
    writer.bucket(b"c").unwrap();
    writer.put(b"k1", b"").unwrap();
    writer.put(b"k10", b"").unwrap();
    writer.put(b"k2", b"").unwrap();
}

fn sample_file(path: &Path) {
    let mut buckets = Buckets::new();
    buckets.insert(
        b"key".to_vec(),
        (0..1000u32)
            .map(|i| (i.to_be_bytes().to_vec(), vec![9; 50]))
            .collect(),
    );
    write_file(path, &buckets);
}

fn patch(path: &Path, offset: u64, bytes: &[u8]) {
    let mut file = OpenOptions::new().write(true).open(path).unwrap();
    file.seek(SeekFrom::Start(offset)).unwrap();
    file.write_all(bytes).unwrap();
}

#[test]
fn damaged_files_give_clear_errors() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("db");

    File::create(&path).unwrap().write_all(&[0; 100]).unwrap();
    let error = Db::open(&path).unwrap_err();
    assert!(
        matches!(error, Error::FileTooSmall { size: 100, .. }),
        "{error}"
    );
    assert!(error.to_string().contains("file size too small"), "{error}");
    assert!(error.to_string().contains(&path.display().to_string()));

    sample_file(&path);
    let full_len = std::fs::metadata(&path).unwrap().len();
    File::options()
        .write(true)
        .open(&path)
        .unwrap()
        .set_len(full_len - 4096)
        .unwrap();
    let error = Db::open(&path).unwrap_err();
    assert!(
        matches!(error, Error::FileTooSmall { needed, .. } if needed == full_len),
        "{error}"
    );

    // Bad magic in both metas.
    sample_file(&path);
    patch(&path, 16, &[0; 4]);
    patch(&path, 4096 + 16, &[0; 4]);
    let error = Db::open(&path).unwrap_err();
    assert!(matches!(error, Error::InvalidDatabase { .. }), "{error}");
    assert!(error.to_string().contains("invalid database"), "{error}");

    // A bad checksum in one meta falls back to the other (bbolt's rule) ...
    sample_file(&path);
    patch(&path, 16 + 20, &[0xFF]);
    let db = Db::open(&path).unwrap();
    assert_eq!(db.tx_id(), 1, "meta page 1 is used");
    assert_eq!(db.len(b"key").unwrap(), 1000);
    // ... and in both is an error.
    patch(&path, 4096 + 16 + 20, &[0xFF]);
    let error = Db::open(&path).unwrap_err();
    assert!(matches!(error, Error::Checksum { .. }), "{error}");
    assert!(error.to_string().contains("checksum"), "{error}");

    // Version 1.
    sample_file(&path);
    for meta in [0u64, 4096] {
        let mut raw = [0u8; 64];
        let mut file = File::open(&path).unwrap();
        file.seek(SeekFrom::Start(meta + 16)).unwrap();
        file.read_exact(&mut raw).unwrap();
        let mut parsed = page::Meta::parse(&raw).unwrap();
        parsed.version = 1;
        patch(&path, meta + 16, &parsed.encode());
    }
    let error = Db::open(&path).unwrap_err();
    assert!(
        matches!(error, Error::VersionMismatch { found: 1, .. }),
        "{error}"
    );

    // A leaf page whose header names another page.
    sample_file(&path);
    patch(&path, 2 * 4096, &99u64.to_le_bytes());
    let db = Db::open(&path).unwrap();
    let error = db.len(b"key").unwrap_err();
    assert!(
        matches!(
            error,
            Error::CorruptPage {
                page: 2,
                reason: CorruptReason::WrongId { found: 99 },
                ..
            }
        ),
        "{error}"
    );
}

#[test]
fn trailing_bytes_after_the_last_page_are_ignored() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("db");
    sample_file(&path);
    let before = std::fs::metadata(&path).unwrap().len();
    File::options()
        .append(true)
        .open(&path)
        .unwrap()
        .write_all(&[0xAB; 32])
        .unwrap();
    let db = Db::open(&path).unwrap();
    assert_eq!(db.file_size(), before + 32);
    assert_eq!(db.size(), before);
    assert_eq!(db.len(b"key").unwrap(), 1000);
}

#[test]
fn nested_buckets_are_refused_by_name() {
    // A hand-made inline child bucket inside an inline top-level bucket.
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("db");
    let mut child = vec![0u8; 16];
    child.extend_from_slice(&[0, 0, 0, 0, 0, 0, 0, 0, 2, 0, 0, 0, 0, 0, 0, 0]);
    let file = File::create(&path).unwrap();
    let mut writer = Writer::new(file).unwrap();
    writer.bucket(b"outer").unwrap();
    writer.put(b"plain", b"v").unwrap();
    writer.put(b"sub", &child).unwrap();
    writer.finish().unwrap();
    // Set the bucket flag on the second element of the inline page: find it by scanning
    // for the element of key "sub" in the root leaf.
    let mut bytes = std::fs::read(&path).unwrap();
    let position = bytes
        .windows(3)
        .rposition(|window| window == b"sub")
        .unwrap();
    // The element header: the inline page starts 16 bytes into outer's value; elements
    // start 16 bytes into it; "sub" is element 1 and its flags are its first field.
    let inline_page = bytes
        .windows(5)
        .position(|window| window == b"plain")
        .unwrap()
        - (16 + 2 * 16);
    let element = inline_page + 16 + 16;
    assert_eq!(u32_at(&bytes, element + 8), Some(3), "ksize of \"sub\"");
    assert!(position > element);
    bytes[element] = 1;
    std::fs::write(&path, &bytes).unwrap();
    let db = Db::open(&path).unwrap();
    let error = db.len(b"outer").unwrap_err();
    assert!(
        matches!(&error, Error::NestedBucket { bucket, key, .. } if bucket == "outer" && key == "sub"),
        "{error}"
    );
    assert!(matches!(
        db.get(b"outer", b"sub"),
        Err(Error::NestedBucket { .. })
    ));
    assert_eq!(db.get(b"outer", b"plain").unwrap(), Some(b"v".to_vec()));
}

#[test]
fn corrupt_bytes_give_errors_not_panics() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("db");
    let mut buckets = Buckets::new();
    buckets.insert(
        b"key".to_vec(),
        (0..3000u32)
            .map(|i| (i.to_be_bytes().to_vec(), vec![9; (i % 7) as usize * 700]))
            .collect(),
    );
    buckets.insert(
        b"small".to_vec(),
        bucket_of([(b"k".to_vec(), b"v".to_vec())]),
    );
    write_file(&path, &buckets);
    let pristine = std::fs::read(&path).unwrap();
    // A fixed xorshift sequence: the same corruptions every run.
    let mut state = 0x9E37_79B9_7F4A_7C15u64;
    let mut next = move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state
    };
    let corrupt_path = dir.path().join("corrupt");
    let mut n_errors = 0;
    for _ in 0..300 {
        let mut bytes = pristine.clone();
        for _ in 0..1 + next() % 8 {
            // Mostly page headers and element headers, where damage matters most.
            let page = (next() % (bytes.len() as u64 / 4096)) as usize;
            let offset = page * 4096 + (next() % 96) as usize;
            bytes[offset] = next() as u8;
        }
        std::fs::write(&corrupt_path, &bytes).unwrap();
        let outcome = Db::open(&corrupt_path).and_then(|db| {
            for name in db.bucket_names()? {
                db.len(&name)?;
                db.get(&name, &1500u32.to_be_bytes())?;
            }
            Ok(())
        });
        n_errors += usize::from(outcome.is_err());
    }
    assert!(n_errors > 0, "some corruptions are detected");
}
