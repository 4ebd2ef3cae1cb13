//! Batches held in memory: every read (point, range, count, last, hash) agrees with a model
//! through batches, flushes, durable commits, aborts and readers that outlive flushes; a
//! batch not yet durable is gone after a reopen and its generation says so; in the
//! background mode a batch commit leaves the file alone and asks for a flush.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use crate::{Backend, Bucket};

/// xorshift64*: the test's own deterministic numbers.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

type Model = BTreeMap<(usize, Vec<u8>), Vec<u8>>;

const BUCKETS: [Bucket; 2] = [Bucket::KEY, Bucket::LEASE];

fn key(rng: &mut Rng) -> Vec<u8> {
    (rng.below(200) as u16).to_be_bytes().to_vec()
}

/// Every read of `backend` agrees with `model`.
fn check(backend: &Backend, model: &Model) {
    let read = backend.read().unwrap();
    for (b, bucket) in BUCKETS.iter().enumerate() {
        let want: Vec<(Vec<u8>, Vec<u8>)> = model
            .iter()
            .filter(|((mb, _), _)| *mb == b)
            .map(|((_, k), v)| (k.clone(), v.clone()))
            .collect();
        let mut got = Vec::new();
        read.for_each_in(*bucket, &[], None, |k, v| {
            got.push((k.to_vec(), v.to_vec()));
            true
        })
        .unwrap();
        if got != want {
            let diff: Vec<_> = got
                .iter()
                .filter(|g| !want.contains(g))
                .chain(want.iter().filter(|w| !got.contains(w)))
                .collect();
            panic!("bucket {}: differs at {diff:?}", bucket.name());
        }
        assert_eq!(read.len(*bucket).unwrap(), want.len() as u64);
        assert_eq!(read.last(*bucket).unwrap(), want.last().cloned());
        // A middle range, and point reads of every key that may exist.
        let (lo, hi) = (50u16.to_be_bytes(), 120u16.to_be_bytes());
        let mut part = Vec::new();
        read.for_each_in(*bucket, &lo, Some(&hi), |k, v| {
            part.push((k.to_vec(), v.to_vec()));
            true
        })
        .unwrap();
        let want_part: Vec<_> = want
            .iter()
            .filter(|(k, _)| k.as_slice() >= &lo[..] && k.as_slice() < &hi[..])
            .cloned()
            .collect();
        assert_eq!(part, want_part);
        let keys: Vec<Vec<u8>> = (0..200u16).map(|i| i.to_be_bytes().to_vec()).collect();
        let mut seen = 0;
        read.get_each(*bucket, &keys, |k, v| {
            assert_eq!(v, model.get(&(b, k.to_vec())).map(Vec::as_slice));
            seen += 1;
            true
        })
        .unwrap();
        assert_eq!(seen, keys.len());
    }
}

#[test]
fn reads_agree_with_a_model_through_batches_flushes_and_reopens() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("db");
    // The file as of its last durable commit: what a power cut leaves.
    let saved = dir.path().join("durable");
    let mut backend = Backend::open(&path).unwrap();
    backend.set_batching(std::time::Duration::from_secs(3600), u64::MAX);
    std::fs::copy(&path, &saved).unwrap();
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    // What readers see, and what the last durable commit holds.
    let mut model = Model::new();
    let mut durable = Model::new();
    let mut readers: Vec<(crate::ReadTx, Model)> = Vec::new();
    let (mut flushes, mut reopens) = (0, 0);
    for step in 0..600 {
        match rng.below(20) {
            0..=11 => {
                let tx = backend.batch();
                let mut next = model.clone();
                for _ in 0..rng.below(12) {
                    let b = rng.below(2) as usize;
                    let k = key(&mut rng);
                    if rng.below(3) == 0 {
                        tx.delete(BUCKETS[b], &k).unwrap();
                        next.remove(&(b, k));
                    } else {
                        let v = format!("v{step}-{}", rng.below(1000)).into_bytes();
                        tx.put(BUCKETS[b], &k, &v).unwrap();
                        next.insert((b, k), v);
                    }
                    // The batch reads its own writes.
                    let k = key(&mut rng);
                    assert_eq!(
                        tx.get(BUCKETS[b], &k).unwrap(),
                        next.get(&(b, k.clone())).cloned()
                    );
                }
                if rng.below(8) == 0 {
                    drop(tx);
                } else {
                    let made_durable = rng.below(10) == 0;
                    assert_eq!(tx.commit(made_durable).unwrap(), made_durable);
                    model = next;
                    if made_durable {
                        durable = model.clone();
                        std::fs::copy(&path, &saved).unwrap();
                        assert_eq!(backend.durable_generation(), backend.published_generation());
                    }
                }
            }
            12..=13 => {
                // A flush, durable or not.
                let made_durable = rng.below(2) == 0;
                backend.write().unwrap().commit(made_durable).unwrap();
                flushes += 1;
                if made_durable {
                    durable = model.clone();
                    std::fs::copy(&path, &saved).unwrap();
                }
            }
            14..=15 => readers.push((backend.read().unwrap(), model.clone())),
            16 if !readers.is_empty() => {
                // A reader begun long ago still sees its own moment.
                let (read, seen) = readers.remove(rng.below(readers.len() as u64) as usize);
                let mut got = Model::new();
                for (b, bucket) in BUCKETS.iter().enumerate() {
                    read.for_each_in(*bucket, &[], None, |k, v| {
                        got.insert((b, k.to_vec()), v.to_vec());
                        true
                    })
                    .unwrap();
                }
                assert_eq!(got, seen);
            }
            17 if rng.below(3) == 0 => {
                // A crash: what the last durable commit holds comes back.
                readers.clear();
                drop(backend);
                std::fs::copy(&saved, &path).unwrap();
                backend = Backend::open(&path).unwrap();
                backend.set_batching(std::time::Duration::from_secs(3600), u64::MAX);
                model = durable.clone();
                reopens += 1;
            }
            _ => {}
        }
        check(&backend, &model);
    }
    assert!(
        flushes > 20 && reopens > 2,
        "{flushes} flushes, {reopens} reopens"
    );
    // The hash of a flushed file equals the hash read through the batches.
    let through = backend.read().unwrap().hash(&[]).unwrap();
    backend.write().unwrap().commit(true).unwrap();
    assert_eq!(backend.read().unwrap().hash(&[]).unwrap(), through);
}

#[test]
fn removals_in_a_batch_hide_the_files_keys_until_the_flush() {
    let dir = tempfile::tempdir().unwrap();
    let backend = Backend::open(&dir.path().join("db")).unwrap();
    let tx = backend.write().unwrap();
    tx.put(Bucket::MEMBERS, b"a", b"1").unwrap();
    tx.put(Bucket::MEMBERS, b"b", b"2").unwrap();
    tx.commit(true).unwrap();
    let tx = backend.batch();
    tx.delete_all(Bucket::MEMBERS, [&b"a"[..], &b"b"[..]])
        .unwrap();
    tx.put(Bucket::MEMBERS, b"c", b"3").unwrap();
    tx.commit(false).unwrap();
    let read = backend.read().unwrap();
    assert_eq!(read.len(Bucket::MEMBERS).unwrap(), 1);
    assert_eq!(
        read.last(Bucket::MEMBERS).unwrap(),
        Some((b"c".to_vec(), b"3".to_vec()))
    );
    assert_eq!(read.get(Bucket::MEMBERS, b"a").unwrap(), None);
    backend.write().unwrap().commit(true).unwrap();
    assert_eq!(backend.read().unwrap().len(Bucket::MEMBERS).unwrap(), 1);
    assert_eq!(backend.stored_bytes(), 2);
}

#[test]
fn in_the_background_mode_a_batch_asks_for_the_flush_and_the_owner_makes_it() {
    let dir = tempfile::tempdir().unwrap();
    let mut backend = Backend::open(&dir.path().join("db")).unwrap();
    backend.set_batching(std::time::Duration::from_secs(3600), 10);
    let woken = Arc::new(AtomicUsize::new(0));
    let count = woken.clone();
    backend.set_background_flush(Box::new(move || {
        count.fetch_add(1, Ordering::SeqCst);
    }));
    for i in 0..25u32 {
        let tx = backend.batch();
        tx.put(Bucket::KEY, &i.to_be_bytes(), b"value").unwrap();
        assert!(!tx.commit(false).unwrap(), "a batch wrote the file itself");
    }
    // Past the batch limit of 10 a flush was asked for, once until it begins.
    assert_eq!(woken.load(Ordering::SeqCst), 1);
    assert_eq!(backend.durable_generation(), 0);
    assert_eq!(backend.unflushed_bytes(), 25 * 9);
    assert!(backend.commit_if_due().unwrap());
    assert_eq!(backend.durable_generation(), backend.published_generation());
    assert_eq!(backend.unflushed_bytes(), 0);
    assert_eq!(backend.pending_writes(), 0);
    assert!(!backend.commit_if_due().unwrap(), "nothing waits");
    assert_eq!(backend.read().unwrap().len(Bucket::KEY).unwrap(), 25);
    // A batch asked to be durable is flushed at once.
    let tx = backend.batch();
    tx.put(Bucket::KEY, b"durable", b"now").unwrap();
    assert!(tx.commit(true).unwrap());
    assert_eq!(backend.durable_generation(), backend.published_generation());
}

#[test]
fn when_no_flush_comes_the_batches_memory_stays_bounded() {
    let dir = tempfile::tempdir().unwrap();
    let mut backend = Backend::open(&dir.path().join("db")).unwrap();
    backend.set_batching(std::time::Duration::from_secs(3600), u64::MAX);
    backend.layer_limits = (64 << 10, 256 << 10);
    // The owner's task never flushes (a disk that stalls): the batches flush themselves
    // once 256 KiB wait.
    backend.set_background_flush(Box::new(|| {}));
    let value = [7u8; 1000];
    let mut most = 0;
    for i in 0..2_000u32 {
        let tx = backend.batch();
        tx.put(Bucket::KEY, &i.to_be_bytes(), &value).unwrap();
        tx.commit(false).unwrap();
        most = most.max(backend.unflushed_bytes());
    }
    assert!(most < 256 << 10, "{most} bytes waited");
    assert!(backend.durable_generation() > 0, "no batch flushed itself");
    assert_eq!(backend.read().unwrap().len(Bucket::KEY).unwrap(), 2_000);
}
