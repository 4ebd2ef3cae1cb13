//! Times one page of a paginated range (kube-style LIST: `limit` keys from a start key at a
//! pinned revision, with the range's full count) near the start and near the end of the key
//! space, and a count-only range of everything: what a page costs beyond its own keys; quiet,
//! after writes, and after the store is reopened (how long that takes too).
//!
//! `cargo run --release -p etcdrs-mvcc --example paged_count -- [keys] [page]`
//! (defaults 1,000,000 keys, pages of 10,000; a third argument `load` stops after the load).
//! Not a test: it prints timings, asserts none.
//!
//! Measured on a shared 2-core machine (medians of 5; milliseconds), before the index
//! counted per chunk (`8c952aa`) and after:
//!
//! | keys | page near start | page near end | count-only of all | count-only, pinned, after writes |
//! |---|---|---|---|---|
//! | 1M before | 82 | 10 | 48 | 51 |
//! | 1M after | 21 | 20 | 0.01 | 0.02 |
//! | 10M before | 838 | 18 | 816 | 826 |
//! | 10M after | 16 | 13 | 0.37 | 0.87 |
//!
//! A page's 10,000 reads from the backend are what it costs now, wherever it starts.

use std::time::Instant;

use etcdrs_backend::Backend;
use etcdrs_mvcc::{KeyRange, KvStore, RangeParams};

fn key(i: u64) -> Vec<u8> {
    format!("/registry/pods/ns/pod-{i:010}").into_bytes()
}

/// Median milliseconds of `runs` calls of `f`.
fn time_ms(runs: usize, mut f: impl FnMut()) -> f64 {
    let mut all: Vec<f64> = (0..runs)
        .map(|_| {
            let start = Instant::now();
            f();
            start.elapsed().as_secs_f64() * 1000.0
        })
        .collect();
    all.sort_by(f64::total_cmp);
    all[runs / 2]
}

fn page_ms(store: &KvStore, from: u64, limit: i64, rev: i64, keys_only_count: bool) -> f64 {
    let start = key(from);
    let end = b"/registry/pods/nt".to_vec();
    time_ms(5, || {
        let params = RangeParams {
            rev,
            limit,
            count_only: keys_only_count,
        };
        let got = store
            .range(KeyRange::new(&start, &end), params)
            .expect("range");
        std::hint::black_box(got);
    })
}

fn report(store: &KvStore, keys: u64, page: i64, rev: i64, label: &str) {
    let near_start = page_ms(store, 0, page, rev, false);
    let middle = page_ms(store, keys / 2, page, rev, false);
    let near_end = page_ms(store, keys - page as u64 * 2, page, rev, false);
    let count_only = page_ms(store, 0, 0, rev, true);
    println!(
        "{label}: page of {page} near start {near_start:.2} ms, middle {middle:.2} ms, \
         near end {near_end:.2} ms; count-only of all {count_only:.2} ms"
    );
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let keys: u64 = args
        .next()
        .map(|a| a.parse())
        .transpose()?
        .unwrap_or(1_000_000);
    let page: i64 = args
        .next()
        .map(|a| a.parse())
        .transpose()?
        .unwrap_or(10_000);
    let dir = tempfile::tempdir()?;
    let store = KvStore::open(Backend::open(&dir.path().join("db"))?, 2)?;
    let loading = Instant::now();
    let per_batch = 10_000;
    let mut i = 0;
    while i < keys {
        let mut batch = store.write()?;
        for _ in 0..per_batch.min(keys - i) {
            let mut txn = batch.txn();
            txn.put(&key(i), b"v", 0)?;
            txn.end();
            i += 1;
        }
        batch.commit(false)?;
    }
    println!(
        "loaded {keys} keys in {:.1} s",
        loading.elapsed().as_secs_f64()
    );
    if args.next().as_deref() == Some("load") {
        return Ok(());
    }
    let pinned = store.current_rev();
    report(&store, keys, page, pinned, "quiet, at the current revision");

    // Writes after the pin: overwrites everywhere, and some creations and deletions.
    let mut batch = store.write()?;
    for j in 0..20_000u64 {
        let i = (j * 7_919) % keys;
        let mut txn = batch.txn();
        if j % 10 == 0 {
            txn.delete_range(KeyRange::new(&key(i), &[]))?;
        } else if j % 10 == 1 {
            let mut fresh = key(i);
            fresh.push(b'x');
            txn.put(&fresh, b"new", 0)?;
        } else {
            txn.put(&key(i), b"v2", 0)?;
        }
        txn.end();
    }
    batch.commit(false)?;
    report(
        &store,
        keys,
        page,
        pinned,
        "20,000 writes later, pinned revision",
    );
    report(
        &store,
        keys,
        page,
        0,
        "20,000 writes later, current revision",
    );

    // Reopened: the index is rebuilt from the backend (its counts per chunk too, if any).
    store.force_durable()?;
    drop(store);
    let reopening = Instant::now();
    let store = KvStore::open(Backend::open(&dir.path().join("db"))?, 2)?;
    println!("reopened in {:.2} s", reopening.elapsed().as_secs_f64());
    report(&store, keys, page, pinned, "reopened, pinned revision");
    Ok(())
}
