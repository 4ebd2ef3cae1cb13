//! A rough speed check, not a benchmark suite: writes 1M keys shaped like etcd's `key`
//! bucket (17-byte revision keys, 100-byte values) with `Writer`, then reads them back with
//! `Db::for_each`, `Db::get` and `etcd_status_hash`, and prints times, file size and the
//! process's peak RSS. Run with `cargo run --release -p etcdrs-bolt --example million
//! [PATH]`; with a PATH the file is kept there (e.g. for `etcdctl snapshot status PATH`).

use std::fs::File;
use std::io::BufWriter;
use std::time::Instant;

use etcdrs_bolt::{Db, Error, Writer, etcd_status_hash};

const N_KEYS: u64 = 1_000_000;

fn revision_key(main: u64) -> [u8; 17] {
    let mut key = [0u8; 17];
    key[..8].copy_from_slice(&main.to_be_bytes());
    key[8] = b'_';
    key
}

fn peak_rss_mib() -> String {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|status| {
            let line = status.lines().find(|line| line.starts_with("VmHWM:"))?;
            let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
            Some(format!("{} MiB", kib / 1024))
        })
        .unwrap_or_else(|| "unknown".to_string())
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let dir = tempfile::tempdir()?;
    let path = match std::env::args_os().nth(1) {
        Some(path) => path.into(),
        None => dir.path().join("million.db"),
    };
    let value = [0x5Au8; 100];

    let started = Instant::now();
    let mut writer = Writer::new(BufWriter::with_capacity(1 << 20, File::create(&path)?))?;
    writer.bucket(b"key")?;
    for main in 1..=N_KEYS {
        writer.put(&revision_key(main), &value)?;
    }
    writer.bucket(b"meta")?;
    writer.put(b"consistent_index", &N_KEYS.to_be_bytes())?;
    let (out, len) = writer.finish()?;
    out.into_inner()?.sync_all()?;
    let write_time = started.elapsed();
    println!(
        "write: {N_KEYS} keys in {write_time:?}, file {} MiB, peak RSS {}",
        len >> 20,
        peak_rss_mib()
    );

    let started = Instant::now();
    let db = Db::open(&path)?;
    let mut n_keys = 0u64;
    let mut n_bytes = 0usize;
    db.for_each(b"key", |key, value| -> Result<(), Error> {
        n_keys += 1;
        n_bytes += key.len() + value.len();
        Ok(())
    })?;
    println!(
        "for_each: {n_keys} keys ({n_bytes} bytes) in {:?}",
        started.elapsed()
    );

    let started = Instant::now();
    for main in (1..=N_KEYS).step_by(1000) {
        if db.get(b"key", &revision_key(main))?.is_none() {
            return Err(format!("key {main} missing").into());
        }
    }
    println!("get: 1000 lookups in {:?}", started.elapsed());

    let started = Instant::now();
    let hash = etcd_status_hash(&db)?;
    println!("etcd_status_hash: {hash:#010x} in {:?}", started.elapsed());
    println!("peak RSS {}", peak_rss_mib());
    Ok(())
}
