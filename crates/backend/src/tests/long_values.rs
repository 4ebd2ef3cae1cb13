//! The backend's tests of long values kept in pieces (the `pieces` module): every read path
//! sees whole values, every write path leaves no piece behind, and the pieces fill their
//! pages.

use super::*;

/// A revision's key in the `key` bucket (etcd's: main, `_`, sub).
fn revision_key(main: u64) -> Vec<u8> {
    let mut key = main.to_be_bytes().to_vec();
    key.push(b'_');
    key.extend_from_slice(&0u64.to_be_bytes());
    key
}

/// A value whose every byte depends on its place and on `seed`: pieces joined out of order
/// or from another value do not match it.
fn patterned(seed: u32, len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| (seed.wrapping_mul(31) as usize + i * 7 + i / 251) as u8)
        .collect()
}

/// Checks that the tables of pieces hold exactly the pieces of the heads in the `key`
/// bucket's file table (none left behind by an overwrite or a removal); returns how many
/// large and small pieces they hold.
fn pieces_match_heads(backend: &Backend) -> (u64, u64) {
    let read = backend.read().unwrap();
    let table = read.tx.open_table(Bucket::KEY.table()).unwrap();
    let tables = pieces::ReadPieces::open(&read.tx).unwrap().unwrap();
    let mut expected = (0u64, 0u64);
    let mut joined = Vec::new();
    for item in table.iter().unwrap() {
        let (key, value) = item.unwrap();
        if let Some(len) = pieces::head_len(Bucket::KEY, value.value()) {
            let (large, small) = pieces::count(key.value().len(), len);
            expected.0 += u64::from(large);
            expected.1 += u64::from(small);
            tables.join_into(key.value(), len, &mut joined).unwrap();
        }
    }
    let held = (
        read.tx.open_table(pieces::LARGE).unwrap().len().unwrap(),
        read.tx.open_table(pieces::TABLE).unwrap().len().unwrap(),
    );
    assert_eq!(held, expected, "pieces without a head");
    expected
}

/// The bytes of keys and values the file holds, counted again from its tables.
fn counted_stored_bytes(backend: &Backend) -> u64 {
    let tx = backend.write().unwrap();
    let counted = tx.count_stored_bytes().unwrap();
    drop(tx);
    counted
}

/// CRC-32C of etcd's backend hash over `pairs` of the `key` bucket alone (every other bucket
/// empty).
fn key_bucket_hash(pairs: &std::collections::BTreeMap<Vec<u8>, Vec<u8>>) -> u32 {
    let mut names: Vec<&str> = Bucket::ALL.iter().map(|b| b.name()).collect();
    names.sort();
    let mut crc = crc32c::Crc32c::new();
    for name in names {
        crc.update(name.as_bytes());
        if name == Bucket::KEY.name() {
            for (key, value) in pairs {
                crc.update(key);
                crc.update(value);
            }
        }
    }
    crc.sum()
}

/// Reads every pair of the `key` bucket back by each way a reader has, and checks it against
/// `pairs`.
fn reads_whole(backend: &Backend, pairs: &std::collections::BTreeMap<Vec<u8>, Vec<u8>>) {
    let read = backend.read().unwrap();
    for (key, value) in pairs {
        assert_eq!(
            read.get(Bucket::KEY, key).unwrap().as_ref(),
            Some(value),
            "get of a {}-byte value",
            value.len()
        );
    }
    let mut seen = Vec::new();
    read.for_each_in(Bucket::KEY, &[], None, |key, value| {
        seen.push((key.to_vec(), value.to_vec()));
        true
    })
    .unwrap();
    let expected: Vec<(Vec<u8>, Vec<u8>)> =
        pairs.iter().map(|(k, v)| (k.clone(), v.clone())).collect();
    assert!(seen == expected, "a range read other values");
    let mut each = Vec::new();
    read.get_each(Bucket::KEY, pairs.keys(), |key, value| {
        each.push((key.to_vec(), value.map(<[u8]>::to_vec).unwrap_or_default()));
        true
    })
    .unwrap();
    assert!(each == expected, "get_each read other values");
    // Keys behind the walk, and far ahead of it.
    let mut order: Vec<&Vec<u8>> = pairs.keys().rev().collect();
    order.extend(pairs.keys().step_by(20));
    let mut each = Vec::new();
    read.get_each(Bucket::KEY, order.iter(), |_, value| {
        each.push(value.map(<[u8]>::to_vec));
        true
    })
    .unwrap();
    let wanted: Vec<Option<Vec<u8>>> = order.iter().map(|key| pairs.get(*key).cloned()).collect();
    assert!(each == wanted, "get_each out of order read other values");
    let mut lens = Vec::new();
    read.for_each_len_in(Bucket::KEY, &[], None, |key, len| {
        lens.push((key.to_vec(), len));
        true
    })
    .unwrap();
    let mut each_len = Vec::new();
    read.get_each_len(Bucket::KEY, pairs.keys(), |key, len| {
        each_len.push((key.to_vec(), len.unwrap_or(usize::MAX)));
        true
    })
    .unwrap();
    let wanted: Vec<(Vec<u8>, usize)> = pairs.iter().map(|(k, v)| (k.clone(), v.len())).collect();
    assert!(
        lens == wanted && each_len == wanted,
        "lengths read other values'"
    );
    assert_eq!(
        read.last(Bucket::KEY).unwrap(),
        pairs.last_key_value().map(|(k, v)| (k.clone(), v.clone()))
    );
    assert_eq!(read.len(Bucket::KEY).unwrap(), pairs.len() as u64);
    assert_eq!(read.hash(&[]).unwrap(), key_bucket_hash(pairs));
    // A write transaction takes the batches in, and reads them whole from its own tables.
    let tx = backend.write().unwrap();
    for (key, value) in pairs.iter().rev().take(3) {
        assert_eq!(tx.get(Bucket::KEY, key).unwrap().as_ref(), Some(value));
    }
    tx.commit(true).unwrap();
    pieces_match_heads(backend);
    assert_eq!(backend.stored_bytes(), counted_stored_bytes(backend));
    let bytes: usize = pairs.iter().map(|(k, v)| k.len() + v.len()).sum();
    assert_eq!(backend.stored_bytes(), bytes as u64);
}

#[test]
fn long_values_are_kept_in_pieces_and_read_whole() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("db");
    let backend = Backend::open(&path).unwrap();
    let lens = [1_988, 1_989, 2_500, 10_240, 100_000, 40, 3_977];
    let mut pairs = std::collections::BTreeMap::new();
    // One at a time through a write transaction.
    let tx = backend.write().unwrap();
    for (i, len) in lens.into_iter().enumerate() {
        let (key, value) = (revision_key(i as u64 + 1), patterned(i as u32, len));
        tx.put(Bucket::KEY, &key, &value).unwrap();
        pairs.insert(key, value);
    }
    tx.commit(true).unwrap();
    // Many, appended past the last through the cursor, from batches a flush takes in.
    for batch in 0..10u64 {
        let tx = backend.batch();
        for n in 0..20u64 {
            let main = 100 + batch * 20 + n;
            let len = [10_240, 3_000, 700, 25_000][(main % 4) as usize];
            let (key, value) = (revision_key(main), patterned(main as u32, len));
            tx.put(Bucket::KEY, &key, &value).unwrap();
            pairs.insert(key, value);
        }
        tx.commit(false).unwrap();
    }
    // The batches' values read whole before they reach the file, and after.
    reads_whole(&backend, &pairs);
    backend.write().unwrap().commit(true).unwrap();
    reads_whole(&backend, &pairs);
    let cut = pieces_match_heads(&backend);
    // Large and small: 1,989 (0, 1), 2,500 (0, 2), 10,240 (1, 4), 100,000 (2, 1: of 16 and
    // 8 pages), 3,977 (0, 1); 50 of 10,240, 50 of 3,000 (0, 4), 50 of 25,000 (2, 1).
    assert_eq!(cut, (3 + 50 * 3, 9 + 50 * (4 + 4 + 1)));

    // A snapshot, a restored image and a stream of pairs carry them whole.
    let snapshot = backend.snapshot().unwrap();
    let restored = dir.path().join("restored/db");
    std::fs::create_dir_all(restored.parent().unwrap()).unwrap();
    restore_image(snapshot.path(), &restored, HashCheck::Skip).unwrap();
    let restored = Backend::open(&restored).unwrap();
    reads_whole(&restored, &pairs);
    let mut stream = Vec::new();
    transfer::send(&backend.read().unwrap(), &mut stream).unwrap();
    let received = Backend::open(&dir.path().join("received/db")).unwrap();
    transfer::receive(&mut stream.as_slice(), &received, |_| {}).unwrap();
    reads_whole(&received, &pairs);

    drop(backend);
    let reopened = Backend::open(&path).unwrap();
    reads_whole(&reopened, &pairs);
}

#[test]
fn overwrites_and_removals_of_long_values_take_their_pieces_along() {
    let dir = tempfile::tempdir().unwrap();
    let backend = Backend::open(&dir.path().join("db")).unwrap();
    let mut pairs = std::collections::BTreeMap::new();
    let tx = backend.write().unwrap();
    for main in 1..=40u64 {
        let value = patterned(main as u32, 5_000 + main as usize);
        tx.put(Bucket::KEY, &revision_key(main), &value).unwrap();
        pairs.insert(revision_key(main), value);
    }
    tx.commit(true).unwrap();
    reads_whole(&backend, &pairs);

    let tx = backend.write().unwrap();
    // Long over long (shorter and longer), short over long, long over short.
    for (main, len) in [(1u64, 2_100usize), (2, 30_000), (3, 10), (4, 7_000)] {
        let value = patterned(main as u32 + 1_000, len);
        tx.put(Bucket::KEY, &revision_key(main), &value).unwrap();
        pairs.insert(revision_key(main), value);
    }
    let value = patterned(5, 9_000);
    tx.put(Bucket::KEY, &revision_key(3), &value).unwrap();
    pairs.insert(revision_key(3), value);
    tx.delete(Bucket::KEY, &revision_key(5)).unwrap();
    pairs.remove(&revision_key(5));
    let gone = [revision_key(6), revision_key(7), revision_key(99)];
    assert_eq!(
        tx.delete_all(Bucket::KEY, gone.iter().map(Vec::as_slice))
            .unwrap(),
        2
    );
    for key in &gone {
        pairs.remove(key);
    }
    assert_eq!(
        tx.delete_range(Bucket::KEY, &revision_key(10), &revision_key(20))
            .unwrap(),
        10
    );
    pairs.retain(|key, _| !(revision_key(10)..revision_key(20)).contains(key));
    tx.commit(true).unwrap();
    reads_whole(&backend, &pairs);

    // The same through batches and their flush.
    let tx = backend.batch();
    tx.put(Bucket::KEY, &revision_key(30), b"short").unwrap();
    pairs.insert(revision_key(30), b"short".to_vec());
    tx.delete(Bucket::KEY, &revision_key(31)).unwrap();
    pairs.remove(&revision_key(31));
    tx.commit(true).unwrap();
    reads_whole(&backend, &pairs);

    let tx = backend.write().unwrap();
    assert_eq!(tx.clear(Bucket::KEY).unwrap(), pairs.len() as u64);
    tx.commit(true).unwrap();
    pairs.clear();
    reads_whole(&backend, &pairs);
    assert_eq!(pieces_match_heads(&backend), (0, 0));
}

#[test]
fn a_whole_long_value_of_an_older_file_reads_as_it_was() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("db");
    drop(Backend::open(&path).unwrap());
    let old = patterned(1, 12_000);
    // As etcd-rs wrote it before pieces: the whole value at its key.
    {
        let db = redb::Database::open(&path).unwrap();
        let tx = db.begin_write().unwrap();
        tx.open_table(Bucket::KEY.table())
            .unwrap()
            .insert(revision_key(1).as_slice(), old.as_slice())
            .unwrap();
        tx.commit().unwrap();
    }
    let backend = Backend::open(&path).unwrap();
    let mut pairs = std::collections::BTreeMap::from([(revision_key(1), old)]);
    assert_eq!(
        backend
            .read()
            .unwrap()
            .get(Bucket::KEY, &revision_key(1))
            .unwrap()
            .as_ref(),
        pairs.get(&revision_key(1))
    );
    assert_eq!(pieces_match_heads(&backend), (0, 0));
    // Written again, it is cut.
    let new = patterned(2, 12_000);
    let tx = backend.write().unwrap();
    tx.put(Bucket::KEY, &revision_key(1), &new).unwrap();
    tx.commit(true).unwrap();
    pairs.insert(revision_key(1), new);
    backend.write().unwrap().commit(true).unwrap();
    reads_whole(&backend, &pairs);
    assert_eq!(pieces_match_heads(&backend), (1, 1));
}

#[test]
fn defragment_while_long_values_change_loses_nothing() {
    use std::sync::Arc;
    let dir = tempfile::tempdir().unwrap();
    let backend = Arc::new(Backend::open(&dir.path().join("db")).unwrap());
    let tx = backend.write().unwrap();
    for main in 0..2_000u64 {
        tx.put(
            Bucket::KEY,
            &revision_key(main),
            &patterned(main as u32, 6_000),
        )
        .unwrap();
    }
    tx.commit(true).unwrap();
    let (n, _) = defragment_beside_a_writer(&backend, 50, |tx, n| {
        let main = u64::from(n % 2_000);
        // Each change of a copied key: long over long, short over long, a removal.
        match n % 3 {
            0 => tx.put(Bucket::KEY, &revision_key(main), &patterned(n, 9_000)),
            1 => tx.put(Bucket::KEY, &revision_key(main), &n.to_be_bytes()),
            _ => tx.delete(Bucket::KEY, &revision_key(main)),
        }
        .unwrap();
    });
    let mut pairs = std::collections::BTreeMap::new();
    for main in 0..2_000u64 {
        pairs.insert(revision_key(main), patterned(main as u32, 6_000));
    }
    for i in 0..n {
        let key = revision_key(u64::from(i % 2_000));
        match i % 3 {
            0 => pairs.insert(key, patterned(i, 9_000)),
            1 => pairs.insert(key, i.to_be_bytes().to_vec()),
            _ => pairs.remove(&key),
        };
    }
    backend.write().unwrap().commit(true).unwrap();
    reads_whole(&backend, &pairs);
}

/// Long values in pieces take about their own size in pages: 2,000 values of 10 KiB appended
/// as a member's flushes append them (whole, each took a 16 KiB leaf: 1.6x).
#[test]
fn long_values_fill_their_pages() {
    let dir = tempfile::tempdir().unwrap();
    let mut backend = Backend::open(&dir.path().join("db")).unwrap();
    backend.set_batching(Duration::from_secs(3600), 1 << 30);
    let mut main = 1;
    for _ in 0..20 {
        for _ in 0..10 {
            let tx = backend.batch();
            for _ in 0..10 {
                tx.put(
                    Bucket::KEY,
                    &revision_key(main),
                    &patterned(main as u32, 10_240),
                )
                .unwrap();
                main += 1;
            }
            tx.put(Bucket::META, b"consistent_index", &main.to_be_bytes())
                .unwrap();
            tx.commit(false).unwrap();
        }
        backend.write().unwrap().commit(true).unwrap();
    }
    let read = backend.read().unwrap();
    // The bytes of their pages (a leaf of a large piece is several pages).
    let mut bytes = 0;
    for table in [Bucket::KEY.table(), pieces::TABLE, pieces::LARGE] {
        let stats = read.tx.open_table(table).unwrap().stats().unwrap();
        bytes += stats.stored_bytes() + stats.metadata_bytes() + stats.fragmented_bytes();
    }
    let data = 2_000 * (17 + 10_240);
    let ratio = bytes as f64 / data as f64;
    // A leaf of two pages and four small pieces of seven to a leaf: 2.57 pages a value
    // (1.03x), and the heads' and branch pages: 1.038x measured.
    assert!(
        ratio <= 1.05,
        "{bytes} bytes of pages for 2,000 values of 10 KiB: {ratio:.3}x"
    );
}

/// A range's walk joins each head's pieces from one pass over the pieces' table; where another
/// key's pieces lie among them (a key that begins with another: not a revision's, but the
/// bucket allows it) or a newer batch hides a head, it still reads every value whole.
#[test]
fn a_walk_joins_the_pieces_of_keys_that_begin_with_each_other() {
    let dir = tempfile::tempdir().unwrap();
    let backend = Backend::open(&dir.path().join("db")).unwrap();
    let keys: [&[u8]; 4] = [&[1, 2, 3], &[1, 2, 3, 0, 0, 0, 0], &[1, 2, 4], &[1, 2, 5]];
    let mut pairs = std::collections::BTreeMap::new();
    let tx = backend.write().unwrap();
    for (i, key) in keys.iter().enumerate() {
        let value = patterned(i as u32, [100_000, 9_000, 8_000, 7_000][i]);
        tx.put(Bucket::KEY, key, &value).unwrap();
        pairs.insert(key.to_vec(), value);
    }
    tx.commit(true).unwrap();
    // The first key's second large piece sorts after every large piece of the second.
    assert!(pieces::count(3, 100_000).0 > 1);
    reads_whole(&backend, &pairs);
    let batch = backend.batch();
    batch.put(Bucket::KEY, keys[2], b"newer").unwrap();
    batch.commit(false).unwrap();
    pairs.insert(keys[2].to_vec(), b"newer".to_vec());
    let mut seen = std::collections::BTreeMap::new();
    backend
        .read()
        .unwrap()
        .for_each_in(Bucket::KEY, &[1, 2, 3, 0], None, |key, value| {
            seen.insert(key.to_vec(), value.to_vec());
            true
        })
        .unwrap();
    pairs.remove(keys[0]);
    assert!(
        seen == pairs,
        "a walk from the second key read other values"
    );
}
