//! The backend's unit tests: the integrity check on open, batched durability, reads, writes and
//! reopening, defragmentation, snapshot readers and hashes.

use super::*;

/// Flips one bit in every copy of `needle` in the file at `path`; returns how many.
fn flip_every(path: &Path, needle: &[u8]) -> usize {
    let mut bytes = std::fs::read(path).unwrap();
    let mut flipped = 0;
    let mut at = 0;
    while let Some(found) = bytes[at..].windows(needle.len()).position(|w| w == needle) {
        bytes[at + found + needle.len() / 2] ^= 0x10;
        flipped += 1;
        at += found + needle.len();
    }
    std::fs::write(path, bytes).unwrap();
    flipped
}

#[test]
fn a_flipped_bit_in_a_page_fails_the_integrity_check_on_open() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("db");
    let needle = b"a value that the test finds in the file";
    {
        let backend = Backend::open(&path).unwrap();
        let tx = backend.write().unwrap();
        for i in 0..100u32 {
            tx.put(Bucket::KEY, &i.to_be_bytes(), needle).unwrap();
        }
        tx.commit(true).unwrap();
    }
    let clean = dir.path().join("clean");
    std::fs::copy(&path, &clean).unwrap();
    assert!(flip_every(&path, needle) > 0);
    let Err(err) = Backend::open(&path) else {
        panic!("a damaged file opened");
    };
    assert!(matches!(err, Error::Damaged { .. }), "{err:?}");
    let message = err.to_string();
    assert!(
        message.starts_with(&format!(
            "database file `{}` is damaged: failed the integrity check",
            path.display()
        )),
        "{message}"
    );
    // The untouched copy opens, with its data.
    let backend = Backend::open(&clean).unwrap();
    let read = backend.read().unwrap();
    assert_eq!(
        read.get(Bucket::KEY, &7u32.to_be_bytes())
            .unwrap()
            .as_deref(),
        Some(&needle[..])
    );
}

#[test]
fn damage_to_the_newest_commit_only_opens_the_previous_commit_and_says_so() {
    // redb falls back to the previous commit when only the newest one fails its checksums
    // (the pages of a commit that a power cut stopped short look the same). The backend
    // opens, reports it, and has exactly the previous commit's data. The file is what a
    // crash right after the newest commit leaves (copied while the database is open: a clean
    // close ends with a two-phase commit, after which redb refuses damage instead).
    let dir = tempfile::tempdir().unwrap();
    let live = dir.path().join("live");
    let path = dir.path().join("db");
    let older = b"a value the older commit holds";
    let newest = b"a value only the newest commit wrote";
    {
        let backend = Backend::open(&live).unwrap();
        assert!(!backend.opened_previous_commit());
        let tx = backend.write().unwrap();
        for i in 0..50u32 {
            tx.put(Bucket::KEY, &i.to_be_bytes(), older).unwrap();
        }
        tx.commit(true).unwrap();
        let tx = backend.write().unwrap();
        for i in 100..150u32 {
            tx.put(Bucket::KEY, &i.to_be_bytes(), newest).unwrap();
        }
        tx.commit(true).unwrap();
        std::fs::copy(&live, &path).unwrap();
    }
    // Undamaged, the file opens at its newest commit (on a copy: an open commits too).
    let clean = dir.path().join("clean");
    std::fs::copy(&path, &clean).unwrap();
    let backend = Backend::open(&clean).unwrap();
    assert!(!backend.opened_previous_commit());
    assert_eq!(backend.read().unwrap().len(Bucket::KEY).unwrap(), 100);
    drop(backend);

    assert!(flip_every(&path, newest) > 0);
    let backend = Backend::open(&path).unwrap();
    assert!(backend.opened_previous_commit());
    let read = backend.read().unwrap();
    assert_eq!(read.len(Bucket::KEY).unwrap(), 50);
    assert_eq!(
        read.get(Bucket::KEY, &49u32.to_be_bytes())
            .unwrap()
            .as_deref(),
        Some(&older[..])
    );
    assert_eq!(read.get(Bucket::KEY, &100u32.to_be_bytes()).unwrap(), None);
    drop(read);
    drop(backend);
    // The open repaired the file: the next open finds nothing to fall back from.
    let backend = Backend::open(&path).unwrap();
    assert!(!backend.opened_previous_commit());
    assert_eq!(backend.read().unwrap().len(Bucket::KEY).unwrap(), 50);
}

#[test]
fn commits_become_durable_by_batch_interval_and_limit() {
    let dir = tempfile::tempdir().unwrap();
    let mut backend = Backend::open(&dir.path().join("db")).unwrap();
    // A long interval: only the limit (3 writes waiting) makes a commit durable.
    backend.set_batching(Duration::from_secs(3600), 3);
    fn commit_keys(backend: &Backend, keys: &[u8]) -> bool {
        let tx = backend.write().unwrap();
        for k in keys {
            tx.put(Bucket::KEY, &[*k], b"v").unwrap();
        }
        tx.commit(false).unwrap()
    }
    let commit = |keys: &[u8]| commit_keys(&backend, keys);
    assert!(!commit(&[1]));
    assert!(!commit(&[2]));
    assert!(commit(&[3]), "the third waiting write reaches the limit");
    assert!(
        !commit(&[4]),
        "the count starts again after a durable commit"
    );
    assert!(commit(&[5, 6, 7]));
    // A zero interval: every commit is durable.
    backend.set_batching(Duration::from_nanos(1), 10_000);
    assert!(commit_keys(&backend, &[8]));
}

#[test]
fn put_get_range_delete_and_reopen() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("member/snap/db");
    {
        let backend = Backend::open(&path).unwrap();
        let tx = backend.write().unwrap();
        for i in 0u8..10 {
            tx.put(Bucket::KEY, &[i], &[i, i]).unwrap();
        }
        tx.put(Bucket::META, b"consistent_index", b"7").unwrap();
        assert!(tx.commit(true).unwrap());
        let tx = backend.write().unwrap();
        assert_eq!(tx.delete_range(Bucket::KEY, &[2], &[5]).unwrap(), 3);
        tx.commit(true).unwrap();
    }
    let backend = Backend::open(&path).unwrap();
    let read = backend.read().unwrap();
    let mut seen = Vec::new();
    read.for_each_in(Bucket::KEY, &[0], None, |k, v| {
        seen.push((k[0], v.len()));
        true
    })
    .unwrap();
    assert_eq!(
        seen.iter().map(|s| s.0).collect::<Vec<_>>(),
        vec![0, 1, 5, 6, 7, 8, 9]
    );
    assert_eq!(
        read.get(Bucket::META, b"consistent_index")
            .unwrap()
            .unwrap(),
        b"7"
    );
    assert_eq!(read.len(Bucket::KEY).unwrap(), 7);
    assert!(backend.size() > 0);
    // Keys 0, 1, 5..9 (1 byte + 2 bytes) and the meta record.
    assert_eq!(backend.stored_bytes(), 7 * 3 + 16 + 1);
}

/// The stored bytes are recorded with each commit and read back on open, not counted (a
/// record whose pair count still matches is trusted as it is); a file whose buckets another
/// writer changed (the pair count differs), or one without the record, is counted; a
/// defragmented file and a hash leave the record out.
#[test]
fn the_stored_bytes_are_recorded_with_each_commit_and_read_on_open() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("db");
    let expected = {
        let backend = Backend::open(&path).unwrap();
        let tx = backend.write().unwrap();
        for i in 0u32..100 {
            tx.put(Bucket::KEY, &i.to_be_bytes(), &[1u8; 60]).unwrap();
        }
        tx.put(Bucket::META, b"m", b"v").unwrap();
        tx.commit(false).unwrap();
        // A published batch, flushed by the close.
        let batch = backend.batch();
        batch
            .put(Bucket::KEY, &7u32.to_be_bytes(), &[2u8; 10])
            .unwrap();
        batch.commit(false).unwrap();
        let hash = backend.read().unwrap().hash(&[]).unwrap();
        backend.defragment().unwrap();
        assert_eq!(backend.read().unwrap().hash(&[]).unwrap(), hash);
        backend.stored_bytes()
    };
    assert_eq!(expected, 99 * (4 + 60) + (4 + 10) + 2);
    assert_eq!(Backend::open(&path).unwrap().stored_bytes(), expected);

    // A value shortened behind the backend's back, the pair count kept: the record is read,
    // not the pairs.
    type KeyTable<'t> = redb::Table<'t, &'static [u8], &'static [u8]>;
    let raw = |change: &dyn Fn(&mut KeyTable<'_>)| {
        let db = redb::Database::create(&path).unwrap();
        let tx = db.begin_write().unwrap();
        change(&mut tx.open_table(Bucket::KEY.table()).unwrap());
        tx.commit().unwrap();
    };
    raw(&|table| {
        table
            .insert(&1u32.to_be_bytes()[..], &[3u8; 20][..])
            .unwrap();
    });
    assert_eq!(Backend::open(&path).unwrap().stored_bytes(), expected);
    // One pair more: counted anew (the shortened value with it).
    raw(&|table| {
        table.insert(&b"another"[..], &b"pair"[..]).unwrap();
    });
    let recounted = expected - 40 + (7 + 4);
    assert_eq!(Backend::open(&path).unwrap().stored_bytes(), recounted);
    // The record without its table: counted.
    {
        let db = redb::Database::create(&path).unwrap();
        let tx = db.begin_write().unwrap();
        assert!(tx.delete_table(STATS).unwrap());
        tx.commit().unwrap();
    }
    assert_eq!(Backend::open(&path).unwrap().stored_bytes(), recounted);
}

/// The pages in use (etcd's `dbSizeInUse`) are the pages the data takes, not its bytes: 1 KiB
/// values fill a 4 KiB page three at a time. A defragmented file is about all in use, the
/// measure is recorded and read on open, and a compaction's removals are measured again.
#[test]
fn the_pages_in_use_are_measured_by_a_walk_and_recorded() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("db");
    let put_all = |backend: &Backend, from: u32, to: u32| {
        let tx = backend.write().unwrap();
        for i in from..to {
            tx.put(Bucket::KEY, &i.to_be_bytes(), &[9u8; 1024]).unwrap();
        }
        tx.commit(true).unwrap();
    };
    let fill = {
        let backend = Backend::open(&path).unwrap();
        // Only a member's backend (flushed in the background) measures.
        backend.defragment().unwrap();
        assert!(backend.pages.fill().is_none());
        backend.set_background_flush(Box::new(|| {}));
        backend.pages.wait();
        put_all(&backend, 0, 3000);
        backend.defragment().unwrap();
        backend.pages.wait();
        let (stored, in_use, size) = (
            backend.stored_bytes(),
            backend.size_in_use(),
            backend.size(),
        );
        assert_eq!(stored, 3000 * (4 + 1024));
        // Three values to a 4 KiB page.
        assert!((1000 * 4096..=1100 * 4096).contains(&in_use), "{in_use}");
        assert!(size <= in_use + in_use / 10, "file {size}, in use {in_use}");
        // Later writes count at the measured fill until the next walk.
        put_all(&backend, 3000, 3300);
        let grown = backend.size_in_use();
        assert!(
            grown > in_use + 300 * 1028 && grown <= backend.size(),
            "{grown} after {in_use}"
        );
        backend.pages.fill().unwrap()
    };
    // Recorded with the commits: an open reads it and walks nothing.
    let backend = Backend::open(&path).unwrap();
    backend.set_background_flush(Box::new(|| {}));
    assert_eq!(backend.pages.fill(), Some(fill));
    assert!(!backend.pages.walking());
    // A compaction removes most pairs: measured again once its removals are durable.
    let tx = backend.write().unwrap();
    tx.delete_range(Bucket::KEY, &0u32.to_be_bytes(), &3000u32.to_be_bytes())
        .unwrap();
    tx.commit(false).unwrap();
    backend.count_pages_again();
    backend.pages.rest_over();
    backend.write().unwrap().commit(true).unwrap();
    backend.pages.wait();
    let after = backend.pages.fill().unwrap();
    assert_eq!(after.stored_bytes, 300 * (4 + 1024));
    assert!(
        after.page_bytes < fill.page_bytes / 4,
        "{after:?} after {fill:?}"
    );
}

#[test]
fn defragment_shrinks_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let backend = Backend::open(&dir.path().join("db")).unwrap();
    let tx = backend.write().unwrap();
    for i in 0u32..2000 {
        tx.put(Bucket::KEY, &i.to_be_bytes(), &[7u8; 512]).unwrap();
    }
    tx.commit(true).unwrap();
    let tx = backend.write().unwrap();
    tx.delete_range(Bucket::KEY, &0u32.to_be_bytes(), &2000u32.to_be_bytes())
        .unwrap();
    tx.commit(true).unwrap();
    let before = backend.size();
    backend.defragment().unwrap();
    assert!(backend.size() < before, "{} !< {before}", backend.size());
    assert_eq!(backend.read().unwrap().len(Bucket::KEY).unwrap(), 0);
}

/// A defragmentation while a writer commits without pause and a reader holds an old
/// snapshot: every committed write is in the new file (and after a reopen), deletions too,
/// the old reader still reads its snapshot, and the writer committed during the rewrite.
/// Defragments `backend` while a thread commits one write transaction after another, each
/// made by `write` with its number, from before the rewrite begins until it is over and at
/// least `at_least` were made; returns how many were, and how many committed during the
/// rewrite.
pub(super) fn defragment_beside_a_writer(
    backend: &std::sync::Arc<Backend>,
    at_least: u32,
    write: impl Fn(&WriteTx<'_>, u32) + Send + 'static,
) -> (u32, u32) {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, AtomicU32};
    let stop = Arc::new(AtomicBool::new(false));
    let written = Arc::new(AtomicU32::new(0));
    let writer = {
        let (backend, stop, written) = (backend.clone(), stop.clone(), written.clone());
        std::thread::spawn(move || {
            let mut n = 0u32;
            while !stop.load(Ordering::Acquire) || n < at_least {
                let tx = backend.write().unwrap();
                write(&tx, n);
                tx.commit(false).unwrap();
                n += 1;
                written.store(n, Ordering::Release);
            }
            n
        })
    };
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while written.load(Ordering::Acquire) < 10 {
        assert!(
            std::time::Instant::now() < deadline,
            "the writer made no commit"
        );
        std::thread::yield_now();
    }
    let at_start = written.load(Ordering::Acquire);
    backend.defragment().unwrap();
    let at_end = written.load(Ordering::Acquire);
    stop.store(true, Ordering::Release);
    (writer.join().unwrap(), at_end - at_start)
}

#[test]
fn defragment_while_writes_go_on_loses_nothing() {
    use std::sync::Arc;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("db");
    let backend = Arc::new(Backend::open(&path).unwrap());
    let tx = backend.write().unwrap();
    for i in 0u32..20_000 {
        tx.put(Bucket::KEY, &i.to_be_bytes(), &[7u8; 512]).unwrap();
    }
    tx.commit(true).unwrap();
    let tx = backend.write().unwrap();
    tx.delete_range(Bucket::KEY, &0u32.to_be_bytes(), &10_000u32.to_be_bytes())
        .unwrap();
    tx.commit(true).unwrap();
    let old_reader = backend.read().unwrap();

    let (n, during) = defragment_beside_a_writer(&backend, 100, |tx, n| {
        tx.put(
            Bucket::META,
            format!("w{n:08}").as_bytes(),
            &n.to_be_bytes(),
        )
        .unwrap();
        // Deletes and overwrites of the copied keys too.
        tx.delete(Bucket::KEY, &(10_000 + n % 10_000).to_be_bytes())
            .unwrap();
        tx.put(Bucket::KEY, &(n % 10_000).to_be_bytes(), &n.to_be_bytes())
            .unwrap();
    });
    assert!(during > 0, "no write committed during the rewrite");

    let check = |backend: &Backend| {
        let read = backend.read().unwrap();
        for i in 0..n {
            assert_eq!(
                read.get(Bucket::META, format!("w{i:08}").as_bytes())
                    .unwrap(),
                Some(i.to_be_bytes().to_vec()),
                "write {i} of {n}"
            );
        }
        let deleted = n.min(10_000);
        assert_eq!(
            read.len(Bucket::KEY).unwrap(),
            u64::from(n.min(10_000) + (10_000 - deleted)),
        );
        let last = n - 1;
        assert_eq!(
            read.get(Bucket::KEY, &(last % 10_000).to_be_bytes())
                .unwrap(),
            Some(last.to_be_bytes().to_vec())
        );
    };
    check(&backend);
    // The old snapshot is still whole: key 15,000 (deleted since, if the writer got there)
    // and key 0 before any overwrite.
    assert_eq!(
        old_reader
            .get(Bucket::KEY, &15_000u32.to_be_bytes())
            .unwrap(),
        Some(vec![7u8; 512])
    );
    assert_eq!(
        old_reader.get(Bucket::KEY, &0u32.to_be_bytes()).unwrap(),
        None
    );
    drop(old_reader);
    let backend = Arc::into_inner(backend).unwrap();
    drop(backend);
    let reopened = Backend::open(&path).unwrap();
    check(&reopened);
}

#[test]
fn readers_see_a_snapshot() {
    let dir = tempfile::tempdir().unwrap();
    let backend = Backend::open(&dir.path().join("db")).unwrap();
    let before = backend.read().unwrap();
    let tx = backend.write().unwrap();
    tx.put(Bucket::KEY, b"a", b"1").unwrap();
    tx.commit(false).unwrap();
    assert_eq!(before.get(Bucket::KEY, b"a").unwrap(), None);
    assert_eq!(
        backend
            .read()
            .unwrap()
            .get(Bucket::KEY, b"a")
            .unwrap()
            .unwrap(),
        b"1"
    );
}

#[test]
fn a_failing_visitor_ends_the_walk_with_its_error() {
    #[derive(Debug, PartialEq)]
    enum Stop {
        At(Vec<u8>),
        Backend,
    }
    impl From<Error> for Stop {
        fn from(_: Error) -> Stop {
            Stop::Backend
        }
    }
    let dir = tempfile::tempdir().unwrap();
    let backend = Backend::open(&dir.path().join("db")).unwrap();
    let tx = backend.write().unwrap();
    for key in [b"a", b"b", b"c", b"d"] {
        tx.put(Bucket::KEY, key, b"v").unwrap();
    }
    tx.commit(false).unwrap();
    // One more held in a published batch: the walk goes over both.
    let batch = backend.batch();
    batch.put(Bucket::KEY, b"bb", b"v").unwrap();
    batch.commit(false).unwrap();
    let read = backend.read().unwrap();
    let mut seen = Vec::new();
    let failed = read.try_for_each_in(Bucket::KEY, b"b", None, |key, _| {
        seen.push(key.to_vec());
        if key == b"c" {
            return Err(Stop::At(key.to_vec()));
        }
        Ok(true)
    });
    assert_eq!(failed, Err(Stop::At(b"c".to_vec())));
    assert_eq!(seen, [&b"b"[..], b"bb", b"c"]);
    // `Ok(false)` ends it without an error.
    let mut seen = 0;
    let ended = read.try_for_each_in(Bucket::KEY, &[], None, |_, _| {
        seen += 1;
        Ok::<_, Stop>(seen < 2)
    });
    assert_eq!(ended, Ok(()));
    assert_eq!(seen, 2);
}

#[test]
fn hash_last_total_and_clear() {
    let dir = tempfile::tempdir().unwrap();
    let backend = Backend::open(&dir.path().join("db")).unwrap();
    let empty = backend.read().unwrap().hash(&[]).unwrap();
    let mut expected = crc32c::Crc32c::new();
    let mut names: Vec<&str> = Bucket::ALL.iter().map(|b| b.name()).collect();
    names.sort();
    for name in names {
        expected.update(name.as_bytes());
    }
    assert_eq!(empty, expected.sum());

    let tx = backend.write().unwrap();
    tx.put(Bucket::KEY, b"a", b"1").unwrap();
    tx.put(Bucket::KEY, b"b", b"2").unwrap();
    tx.put(Bucket::MEMBERS, b"m", b"3").unwrap();
    tx.put(Bucket::META, b"consistent_index", b"9").unwrap();
    tx.commit(false).unwrap();
    let read = backend.read().unwrap();
    let all = read.hash(&[]).unwrap();
    let ignoring = read.hash(&[(Bucket::META, b"consistent_index")]).unwrap();
    assert_ne!(all, ignoring);
    assert_eq!(read.total_len().unwrap(), 4);
    assert_eq!(
        read.last(Bucket::KEY).unwrap(),
        Some((b"b".to_vec(), b"2".to_vec()))
    );
    assert_eq!(read.last(Bucket::LEASE).unwrap(), None);
    drop(read);

    let tx = backend.write().unwrap();
    tx.put(Bucket::META, b"consistent_index", b"10").unwrap();
    assert_eq!(tx.clear(Bucket::MEMBERS).unwrap(), 1);
    tx.commit(false).unwrap();
    let read = backend.read().unwrap();
    assert_eq!(read.len(Bucket::MEMBERS).unwrap(), 0);
    // Only the ignored key changed besides the cleared bucket.
    let tx = backend.write().unwrap();
    tx.put(Bucket::MEMBERS, b"m", b"3").unwrap();
    tx.commit(false).unwrap();
    let again = backend.read().unwrap();
    assert_eq!(
        again.hash(&[(Bucket::META, b"consistent_index")]).unwrap(),
        ignoring
    );
    assert_eq!(backend.stored_bytes(), 1 + 1 + 1 + 1 + 1 + 1 + 16 + 2);
}

#[test]
fn a_transaction_sees_its_held_puts_in_order_and_an_abort_drops_them() {
    let dir = tempfile::tempdir().unwrap();
    let backend = Backend::open(&dir.path().join("db")).unwrap();
    let tx = backend.write().unwrap();
    tx.put(Bucket::KEY, b"a", b"1").unwrap();
    tx.put(Bucket::KEY, b"a", b"22").unwrap();
    // A read, a put into another bucket and a delete each come after the held puts.
    assert_eq!(tx.get(Bucket::KEY, b"a").unwrap().unwrap(), b"22");
    tx.put(Bucket::KEY, b"b", b"3").unwrap();
    tx.put(Bucket::META, b"m", b"4").unwrap();
    tx.put(Bucket::KEY, b"c", b"5").unwrap();
    tx.delete(Bucket::KEY, b"b").unwrap();
    tx.put(Bucket::KEY, b"b", b"6").unwrap();
    tx.commit(false).unwrap();
    let read = backend.read().unwrap();
    let mut seen = Vec::new();
    read.for_each_in(Bucket::KEY, b"", None, |k, v| {
        seen.push((k.to_vec(), v.to_vec()));
        true
    })
    .unwrap();
    let pairs = |p: &[(&str, &str)]| -> Vec<(Vec<u8>, Vec<u8>)> {
        p.iter()
            .map(|(k, v)| (k.as_bytes().to_vec(), v.as_bytes().to_vec()))
            .collect()
    };
    assert_eq!(seen, pairs(&[("a", "22"), ("b", "6"), ("c", "5")]));
    assert_eq!(read.get(Bucket::META, b"m").unwrap().unwrap(), b"4");
    // Bytes in use count each pair once, overwrites replacing what they overwrote.
    assert_eq!(backend.stored_bytes(), 3 + 2 + 2 + 2);
    drop(read);
    let tx = backend.write().unwrap();
    tx.put(Bucket::KEY, b"d", b"7").unwrap();
    drop(tx);
    let read = backend.read().unwrap();
    assert_eq!(read.get(Bucket::KEY, b"d").unwrap(), None);
    assert_eq!(backend.stored_bytes(), 9);
}

/// What a defragmentation under way hears of the writes: each key put or deleted, and, for a
/// whole database replaced by an image (a snapshot installed from the leader), everything, so
/// that the copy starts again rather than keep keys the image does not have.
#[test]
fn defragmentation_tracks_keys_and_replacements() {
    let dir = tempfile::tempdir().unwrap();
    let backend = Backend::open(&dir.path().join("db")).unwrap();
    let tx = backend.write().unwrap();
    tx.put(Bucket::KEY, b"old", b"1").unwrap();
    tx.commit(true).unwrap();
    let image = backend.snapshot().unwrap();

    backend.tracker.start_for_test();
    let tx = backend.write().unwrap();
    tx.put(Bucket::KEY, b"a", b"1").unwrap();
    tx.delete(Bucket::KEY, b"old").unwrap();
    tx.delete_all(Bucket::META, [b"x".as_slice()]).unwrap();
    tx.commit(false).unwrap();
    let changes = backend.tracker.take_for_test();
    assert!(!changes.everything);
    let keys: Vec<(&str, &[u8])> = changes
        .keys
        .iter()
        .map(|(bucket, key)| (*bucket, key.as_slice()))
        .collect();
    assert_eq!(
        keys,
        [("key", b"a".as_slice()), ("key", b"old"), ("meta", b"x")]
    );

    backend.replace_with_image(image.path(), &[]).unwrap();
    assert!(backend.tracker.take_for_test().everything);
}

/// A file swapped in that our backend wrote (a received snapshot's import) brings its
/// recorded stored bytes: they are read, not counted again pair by pair on the applying
/// thread. A file without the record is counted.
#[test]
fn a_file_swapped_in_brings_its_recorded_stored_bytes() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("db");
    let backend = Backend::open(&path).unwrap();
    let image = dir.path().join("image");
    let write_image = || {
        let other = Backend::open(&image).unwrap();
        let tx = other.write().unwrap();
        for i in 0u32..100 {
            tx.put(Bucket::KEY, &i.to_be_bytes(), &[5u8; 50]).unwrap();
        }
        tx.put(Bucket::META, b"member", b"them").unwrap();
        tx.commit(true).unwrap();
    };
    // One value shortened behind the record's back, the pair count kept: a count would see
    // 40 bytes fewer than the record says.
    let shorten = || {
        let db = redb::Database::create(&image).unwrap();
        let tx = db.begin_write().unwrap();
        tx.open_table(Bucket::KEY.table())
            .unwrap()
            .insert(&1u32.to_be_bytes()[..], &[6u8; 10][..])
            .unwrap();
        tx.commit().unwrap();
    };
    let recorded = 100 * (4 + 50) + (6 + 4);
    write_image();
    shorten();
    backend.replace_with_file(&image, &[b"member"]).unwrap();
    assert_eq!(
        backend
            .read()
            .unwrap()
            .get(Bucket::META, b"member")
            .unwrap(),
        None
    );
    assert_eq!(backend.stored_bytes(), recorded - (6 + 4));
    // The kept key's change is in the record of the file swapped in.
    drop(backend);
    assert_eq!(
        Backend::open(&path).unwrap().stored_bytes(),
        recorded - (6 + 4)
    );

    // Without the record: counted.
    let backend = Backend::open(&path).unwrap();
    write_image();
    shorten();
    {
        let db = redb::Database::create(&image).unwrap();
        let tx = db.begin_write().unwrap();
        assert!(tx.delete_table(STATS).unwrap());
        tx.commit().unwrap();
    }
    backend.replace_with_file(&image, &[b"member"]).unwrap();
    assert_eq!(backend.stored_bytes(), recorded - (6 + 4) - 40);
}

/// The file a defragmentation or an image replaced syncs no more (it is unlinked); the one
/// swapped in goes on syncing, and holds what was committed.
#[test]
fn a_replaced_file_is_retired_and_the_file_swapped_in_is_not() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("db");
    let backend = Backend::open(&path).unwrap();
    let first = lock(&backend.retire).share();
    let tx = backend.write().unwrap();
    tx.put(Bucket::KEY, b"k", b"1").unwrap();
    tx.commit(true).unwrap();
    assert!(!first.thrown());

    backend.defragment().unwrap();
    assert!(first.thrown());
    let second = lock(&backend.retire).share();
    assert!(!second.thrown());

    let image = dir.path().join("image");
    {
        let other = Backend::open(&image).unwrap();
        let tx = other.write().unwrap();
        tx.put(Bucket::KEY, b"k", b"2").unwrap();
        tx.commit(true).unwrap();
    }
    backend.replace_with_file(&image, &[]).unwrap();
    assert!(second.thrown());
    assert!(!lock(&backend.retire).thrown());
    let tx = backend.write().unwrap();
    tx.put(Bucket::KEY, b"j", b"3").unwrap();
    tx.commit(true).unwrap();
    drop(backend);
    let backend = Backend::open(&path).unwrap();
    let read = backend.read().unwrap();
    assert_eq!(read.get(Bucket::KEY, b"k").unwrap(), Some(b"2".to_vec()));
    assert_eq!(read.get(Bucket::KEY, b"j").unwrap(), Some(b"3".to_vec()));
}

#[test]
fn a_file_swapped_in_replaces_every_bucket_but_the_kept_meta_keys() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("db");
    let backend = Backend::open(&path).unwrap();
    let tx = backend.write().unwrap();
    tx.put(Bucket::KEY, b"old", b"1").unwrap();
    tx.put(Bucket::META, b"member", b"me").unwrap();
    tx.put(Bucket::META, b"index", b"1").unwrap();
    tx.commit(true).unwrap();
    let reader = backend.read().unwrap();

    let image = dir.path().join("image");
    {
        let other = Backend::open(&image).unwrap();
        let tx = other.write().unwrap();
        tx.put(Bucket::KEY, b"new", b"22").unwrap();
        tx.put(Bucket::META, b"member", b"them").unwrap();
        tx.put(Bucket::META, b"index", b"9").unwrap();
        tx.commit(true).unwrap();
    }
    backend.tracker.start_for_test();
    backend
        .replace_with_file(&image, &[b"member", b"absent"])
        .unwrap();
    assert!(backend.tracker.take_for_test().everything);
    assert!(!image.exists());
    let check = |backend: &Backend| {
        let read = backend.read().unwrap();
        assert_eq!(read.get(Bucket::KEY, b"old").unwrap(), None);
        assert_eq!(read.get(Bucket::KEY, b"new").unwrap(), Some(b"22".to_vec()));
        assert_eq!(
            read.get(Bucket::META, b"member").unwrap(),
            Some(b"me".to_vec())
        );
        assert_eq!(
            read.get(Bucket::META, b"index").unwrap(),
            Some(b"9".to_vec())
        );
        assert_eq!(backend.stored_bytes(), (3 + 2) + (6 + 2) + (5 + 1));
    };
    check(&backend);
    // A reader begun before goes on reading the old file.
    assert_eq!(
        reader.get(Bucket::KEY, b"old").unwrap(),
        Some(b"1".to_vec())
    );
    drop(reader);
    let tx = backend.write().unwrap();
    tx.put(Bucket::KEY, b"after", b"3").unwrap();
    tx.commit(true).unwrap();
    drop(backend);
    let backend = Backend::open(&path).unwrap();
    assert_eq!(
        backend.read().unwrap().get(Bucket::KEY, b"after").unwrap(),
        Some(b"3".to_vec())
    );
    let tx = backend.write().unwrap();
    tx.delete(Bucket::KEY, b"after").unwrap();
    tx.commit(true).unwrap();
    check(&backend);

    // A file that is no database changes nothing.
    std::fs::write(&image, b"not a database").unwrap();
    assert!(matches!(
        backend.replace_with_file(&image, &[]),
        Err(Error::Damaged { .. })
    ));
    check(&backend);
}

/// A backend sent as a stream of pairs and received into a fresh one is the same backend
/// (every bucket, batches not yet in the file included, the stored bytes counted); a stream
/// cut short, changed, or with bytes after its end is refused.
#[test]
fn a_stream_of_pairs_carries_every_bucket_and_only_whole() {
    let dir = tempfile::tempdir().unwrap();
    let source = Backend::open(&dir.path().join("a/db")).unwrap();
    let tx = source.write().unwrap();
    for i in 0u32..2_000 {
        tx.put(Bucket::KEY, &i.to_be_bytes(), &[i as u8; 300])
            .unwrap();
    }
    tx.put(Bucket::META, b"consistent_index", &9u64.to_be_bytes())
        .unwrap();
    tx.put(Bucket::AUTH, b"enabled", &[1]).unwrap();
    tx.commit(true).unwrap();
    // A batch readers see that the file does not hold yet.
    let batch = source.batch();
    batch.put(Bucket::LEASE, b"lease", b"ttl").unwrap();
    batch
        .put(Bucket::KEY, &5u32.to_be_bytes(), b"newer")
        .unwrap();
    batch.commit(false).unwrap();

    let mut stream = Vec::new();
    let sent = transfer::send(&source.read().unwrap(), &mut stream).unwrap();
    assert_eq!(sent, 2_003);

    let copy = Backend::open(&dir.path().join("b/db")).unwrap();
    let mut keys = 0;
    let received = transfer::receive(&mut stream.as_slice(), &copy, |batch| {
        if batch.bucket == Bucket::KEY {
            keys += batch.pairs().count() as u64;
        }
    })
    .unwrap();
    assert_eq!((received, keys), (2_003, 2_000));
    assert_eq!(
        copy.read().unwrap().hash(&[]).unwrap(),
        source.read().unwrap().hash(&[]).unwrap()
    );
    assert_eq!(
        copy.read()
            .unwrap()
            .get(Bucket::KEY, &5u32.to_be_bytes())
            .unwrap(),
        Some(b"newer".to_vec())
    );
    // The source counts its batch once it reaches the file.
    source.write().unwrap().commit(true).unwrap();
    assert_eq!(copy.stored_bytes(), source.stored_bytes());

    let refused = |bytes: &[u8], name: &str| {
        let target = Backend::open(&dir.path().join(name).join("db")).unwrap();
        let error = transfer::receive(&mut &bytes[..], &target, |_| {}).unwrap_err();
        error.to_string()
    };
    assert!(refused(&stream[..stream.len() - 1], "c").contains("cut short"));
    assert!(refused(&stream[..stream.len() / 2], "d").contains("cut short"));
    let mut changed = stream.clone();
    changed[stream.len() / 2] ^= 1;
    assert!(refused(&changed, "e").contains("checksum mismatch"));
    let mut longer = stream.clone();
    longer.push(0);
    assert!(refused(&longer, "f").contains("bytes after the end"));
    assert!(refused(b"etcd-rs pairs 0\nxxxx", "g").contains("not a stream of pairs"));
}

/// The `key` bucket's tree after revisions appended as a member does: in batches of
/// `per_batch` puts, each with its consistent index in `meta`, `batches` of them to each flush
/// to the file; `(leaf, branch)` pages.
fn key_tree_pages(
    flushes: usize,
    batches: usize,
    per_batch: usize,
    value_len: usize,
) -> (u64, u64) {
    let dir = tempfile::tempdir().unwrap();
    let mut backend = Backend::open(&dir.path().join("db")).unwrap();
    backend.set_batching(Duration::from_secs(3600), 1 << 30);
    let value = vec![7u8; value_len];
    let mut revision = 1u64;
    for _ in 0..flushes {
        for batch in 0..batches {
            let tx = backend.batch();
            for _ in 0..per_batch {
                let mut key = revision.to_be_bytes().to_vec();
                key.push(b'_');
                key.extend_from_slice(&0u64.to_be_bytes());
                tx.put(Bucket::KEY, &key, &value).unwrap();
                revision += 1;
            }
            tx.put(Bucket::META, b"consistent_index", &revision.to_be_bytes())
                .unwrap();
            assert_eq!(
                tx.commit(batch == batches - 1).unwrap(),
                batch == batches - 1
            );
        }
    }
    let read = backend.read().unwrap();
    let total = flushes * batches * per_batch;
    assert_eq!(read.len(Bucket::KEY).unwrap(), total as u64);
    let table = read.tx.open_table(Bucket::KEY.table()).unwrap();
    let stats = table.stats().unwrap();
    (stats.leaf_pages(), stats.branch_pages())
}

/// Revisions appended by many puts to a flush (a loaded member's) fill the `key` bucket's
/// leaves and its branch pages; a few puts to a flush (a slow writer), the leaves are as
/// full. Inserted one at a time, redb splits a full branch page in its middle and an ascending
/// load leaves each left half half full (about twice the branch pages); the batches' own
/// order, with the consistent index between them, cut the runs as short.
#[test]
fn revisions_appended_in_large_commits_fill_leaves_and_branch_pages() {
    // 1 KiB values (with the key and redb's slot, three to a 4 KiB leaf): 12,000 of them,
    // 1,000 to a flush in batches of 10.
    let (leaves, branches) = key_tree_pages(12, 100, 10, 1024);
    assert!(
        leaves <= 4_000 + 12,
        "{leaves} leaves for 12,000 values of 1 KiB"
    );
    // A branch page holds about 100 children of 17-byte keys: 40 when full, 80 half full.
    assert!(
        branches <= 48,
        "{branches} branch pages over {leaves} leaves"
    );
    let (leaves, _) = key_tree_pages(1_200, 1, 10, 1024);
    assert!(
        leaves <= 4_000 + 12,
        "{leaves} leaves for 12,000 values of 1 KiB, 10 a flush"
    );
}

mod long_values;
