//! Against real bbolt: files written by etcd 3.4 (`/usr/bin/etcd`, Go's bbolt) are read with
//! [`Db`], and a copy made with [`Writer`] is checked by Go's bbolt through `etcdctl snapshot
//! status` (which runs bbolt's `tx.Check`) and `etcdctl snapshot restore`, then served by
//! etcd 3.4 itself.

use std::collections::BTreeSet;
use std::fs::File;
use std::io::BufWriter;
use std::path::Path;
use std::process::{Command, Output};

use etcdrs_bolt::{Db, Error, Writer, etcd_status_hash};
use etcdrs_testkit::{EtcdBin, Etcdctl, Member, MemberOpts};

const ETCD: &str = "/usr/bin/etcd";
const N_SMALL_KEYS: usize = 2_000;
const N_LARGE_KEYS: usize = 5;
/// Puts per `etcdctl txn`: etcd's `--max-txn-ops` default is 128.
const TXN_BATCH: usize = 100;

/// A single-member etcd 3.4 on its own data dir and ports, ready to serve.
async fn start_etcd() -> Member {
    Member::start(MemberOpts::new(&EtcdBin::at(ETCD)))
        .await
        .expect("start etcd 3.4")
}

/// `etcdctl <args>` with no endpoint (the offline `snapshot status` and `snapshot restore`).
fn offline_ctl(args: &[&str]) -> Output {
    Command::new(Etcdctl::new("").bin())
        .env("ETCDCTL_API", "3")
        .args(args)
        .output()
        .expect("run etcdctl")
}

/// `etcdctl snapshot status -w json`: (hash, revision, totalKey, totalSize).
fn snapshot_status(file: &Path) -> (u32, i64, u64, u64) {
    let out = offline_ctl(&["snapshot", "status", path_str(file), "-w", "json"]);
    assert!(out.status.success(), "snapshot status {file:?}: {out:?}");
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).expect("etcdctl prints JSON");
    (
        json["hash"].as_u64().expect("a number in the status JSON") as u32,
        json["revision"]
            .as_i64()
            .expect("a number in the status JSON"),
        json["totalKey"]
            .as_u64()
            .expect("a number in the status JSON"),
        json["totalSize"]
            .as_u64()
            .expect("a number in the status JSON"),
    )
}

fn path_str(path: &Path) -> &str {
    path.to_str().expect("temporary paths are UTF-8")
}

fn small_key(idx: usize) -> String {
    format!("key-{idx:05}")
}

fn large_key(idx: usize) -> String {
    format!("large-{idx}")
}

/// The key of an `mvccpb.KeyValue`: field 1, length-delimited, written first by Go's
/// protobuf.
fn kv_key(value: &[u8]) -> Vec<u8> {
    assert_eq!(value[0], 0x0a, "KeyValue starts with field 1 (key)");
    let (mut len, mut at, mut shift) = (0usize, 1, 0);
    loop {
        let byte = value[at];
        len |= usize::from(byte & 0x7f) << shift;
        at += 1;
        if byte & 0x80 == 0 {
            break;
        }
        shift += 7;
    }
    value[at..at + len].to_vec()
}

/// Checks an etcd-written file: buckets, the `key` bucket's contents, `meta` and `lease`.
fn check_etcd_file(path: &Path, expected_keys: &BTreeSet<Vec<u8>>, lease_id: &str) -> Db {
    let db = Db::open(path).expect("open the etcd-written file");
    assert_eq!(db.page_size(), 4096);
    let names: Vec<String> = db
        .bucket_names()
        .expect("list buckets")
        .into_iter()
        .map(|name| String::from_utf8(name).expect("etcd bucket names are UTF-8"))
        .collect();
    assert_eq!(
        names,
        [
            "alarm",
            "auth",
            "authRoles",
            "authUsers",
            "cluster",
            "key",
            "lease",
            "members",
            "members_removed",
            "meta"
        ],
        "{path:?}"
    );
    let mut seen = BTreeSet::new();
    let mut n_revisions = 0;
    db.for_each(b"key", |revision, value| -> Result<(), Error> {
        assert_eq!(revision.len(), 17, "a revision key: main, '_', sub");
        let key = kv_key(value);
        let value_has_key = value.windows(key.len()).filter(|w| *w == key).count() >= 1;
        assert!(value_has_key);
        if key.starts_with(b"large-") {
            assert!(value.len() > 10_000, "the 10 KB value is whole");
        }
        seen.insert(key);
        n_revisions += 1;
        Ok(())
    })
    .expect("walk the key bucket");
    assert_eq!(&seen, expected_keys);
    assert_eq!(n_revisions, expected_keys.len());
    assert_eq!(
        db.len(b"key").expect("count the key bucket"),
        expected_keys.len() as u64
    );

    let consistent_index = db
        .get(b"meta", b"consistent_index")
        .expect("read the meta bucket")
        .expect("etcd stores consistent_index");
    assert_eq!(consistent_index.len(), 8);
    assert!(u64::from_be_bytes(consistent_index.try_into().expect("8 bytes")) > 0);
    // The lease bucket's key is the lease id, big-endian.
    let lease_key = u64::from_str_radix(lease_id, 16)
        .expect("a hex lease id")
        .to_be_bytes();
    assert!(
        db.get(b"lease", &lease_key)
            .expect("read the lease bucket")
            .is_some()
    );
    assert_eq!(db.len(b"lease").expect("count the lease bucket"), 1);
    assert!(db.len(b"members").expect("count the members bucket") >= 1);
    db
}

/// Copies every bucket of `source` into a new file with [`Writer`].
fn copy_with_writer(source: &Db, target: &Path) -> u64 {
    let out = BufWriter::new(File::create(target).expect("create the copy"));
    let mut writer = Writer::new(out).expect("start the copy");
    for name in source.bucket_names().expect("list buckets") {
        writer.bucket(&name).expect("buckets come in order");
        source
            .for_each(&name, |key, value| writer.put(key, value))
            .expect("copy a bucket");
    }
    let (out, len) = writer.finish().expect("finish the copy");
    out.into_inner()
        .expect("flush the copy")
        .sync_all()
        .expect("sync the copy");
    len
}

#[tokio::test]
async fn reads_etcd_files_and_etcd_accepts_the_writers_copy() {
    let dir = tempfile::tempdir().unwrap();
    let mut etcd = start_etcd().await;
    let ctl = etcd.etcdctl();

    let mut expected_keys = BTreeSet::new();
    for batch in (0..N_SMALL_KEYS).collect::<Vec<_>>().chunks(TXN_BATCH) {
        let mut txn = String::from("\n");
        for &idx in batch {
            txn.push_str(&format!("put {} value-{idx}\n", small_key(idx)));
            expected_keys.insert(small_key(idx).into_bytes());
        }
        // An empty line ends the success ops, another the (empty) failure ops.
        txn.push_str("\n\n");
        ctl.ok_stdin(&["txn"], &txn).await;
    }
    let large_value = "x".repeat(10 * 1024);
    for idx in 0..N_LARGE_KEYS {
        ctl.ok(&["put", &large_key(idx), "--", &large_value]).await;
        expected_keys.insert(large_key(idx).into_bytes());
    }
    let granted = ctl.ok(&["lease", "grant", "600"]).await;
    // "lease 694d7a6b1e3f2a0c granted with TTL(600s)"
    let lease_id = granted.split_whitespace().nth(1).unwrap().to_string();
    ctl.ok(&["put", "--lease", &lease_id, "leased", "v"]).await;
    expected_keys.insert(b"leased".to_vec());

    let snapshot = dir.path().join("snapshot.db");
    ctl.ok(&["snapshot", "save", path_str(&snapshot)]).await;
    // SIGTERM: etcd closes its backend on the way out.
    etcd.stop().await.unwrap();

    // etcd's snapshot file ends with a SHA-256 trailer after the last page.
    let from_snapshot = check_etcd_file(&snapshot, &expected_keys, &lease_id);
    assert_eq!(from_snapshot.file_size() % 512, 32);
    assert_eq!(from_snapshot.file_size(), from_snapshot.size() + 32);
    check_etcd_file(
        &etcd.data_dir().join("member/snap/db"),
        &expected_keys,
        &lease_id,
    );

    let (hash, revision, total_key, total_size) = snapshot_status(&snapshot);
    assert_eq!(etcd_status_hash(&from_snapshot).unwrap(), hash);
    assert_eq!(total_size, from_snapshot.size());
    assert!(revision > N_SMALL_KEYS as i64 / TXN_BATCH as i64);

    // The writer's copy passes bbolt's tx.Check and has the same content.
    let copy = dir.path().join("copy.db");
    let copy_len = copy_with_writer(&from_snapshot, &copy);
    let (copy_hash, copy_revision, copy_total_key, copy_total_size) = snapshot_status(&copy);
    assert_eq!(
        (copy_hash, copy_revision, copy_total_key),
        (hash, revision, total_key)
    );
    assert_eq!(copy_total_size, copy_len);
    assert_eq!(std::fs::metadata(&copy).unwrap().len(), copy_len);
    let reread = Db::open(&copy).unwrap();
    assert_eq!(etcd_status_hash(&reread).unwrap(), hash);

    // The strongest check: etcd 3.4 restores the copy into the member's data dir (same
    // name and peer URL) and serves its keys.
    std::fs::remove_dir_all(etcd.data_dir()).unwrap();
    let initial_cluster = format!("{}={}", etcd.name(), etcd.peer_url());
    let out = offline_ctl(&[
        "snapshot",
        "restore",
        path_str(&copy),
        "--data-dir",
        path_str(etcd.data_dir()),
        "--skip-hash-check",
        "--name",
        etcd.name(),
        "--initial-cluster",
        &initial_cluster,
        "--initial-advertise-peer-urls",
        &etcd.peer_url(),
    ]);
    assert!(out.status.success(), "snapshot restore: {out:?}");
    etcd.restart().await.unwrap();
    let ctl = etcd.etcdctl();
    let listed = ctl.ok(&["get", "--prefix", "", "--keys-only"]).await;
    let served: BTreeSet<Vec<u8>> = listed
        .lines()
        .filter(|line| !line.is_empty())
        .map(|line| line.as_bytes().to_vec())
        .collect();
    assert_eq!(served, expected_keys);
    let large = ctl.ok(&["get", &large_key(0), "--print-value-only"]).await;
    assert_eq!(large.trim_end(), large_value);
    etcd.stop().await.unwrap();
}

/// A revision key as etcd's `key` bucket has them (`etcdctl snapshot status` parses them).
fn revision_key(main: u64, sub: u64) -> Vec<u8> {
    let mut key = main.to_be_bytes().to_vec();
    key.push(b'_');
    key.extend_from_slice(&sub.to_be_bytes());
    key
}

#[test]
fn go_bbolt_checks_the_writers_shapes_clean() {
    let dir = tempfile::tempdir().unwrap();

    // No buckets at all: the root is one empty leaf.
    let empty = dir.path().join("empty.db");
    let writer = Writer::new(File::create(&empty).unwrap()).unwrap();
    let (_, len) = writer.finish().unwrap();
    let (hash, revision, total_key, total_size) = snapshot_status(&empty);
    assert_eq!((revision, total_key, total_size), (0, 0, len));
    assert_eq!(etcd_status_hash(&Db::open(&empty).unwrap()).unwrap(), hash);

    // Empty and inline buckets, one bucket of exactly one non-inline leaf, values spanning
    // overflow pages, a three-level tree, and enough buckets for the root to branch.
    let shapes = dir.path().join("shapes.db");
    let mut writer = Writer::new(BufWriter::new(File::create(&shapes).unwrap())).unwrap();
    let mut n_keys = 0u64;
    writer.bucket(b"a-empty").unwrap();
    writer.bucket(b"b-one-leaf").unwrap();
    writer.put(b"only", &[3; 2000]).unwrap();
    n_keys += 1;
    for bucket_idx in 0..400u32 {
        writer
            .bucket(format!("c-{bucket_idx:04}").as_bytes())
            .unwrap();
        for key_idx in 0..bucket_idx % 4 {
            writer.put(&key_idx.to_be_bytes(), b"inline").unwrap();
            n_keys += 1;
        }
    }
    writer.bucket(b"key").unwrap();
    let last_main = 40_000u64;
    for main in 1..=last_main {
        let value_len = if main % 5_000 == 0 { 20_000 } else { 100 };
        writer
            .put(&revision_key(main, 0), &vec![(main % 256) as u8; value_len])
            .unwrap();
        n_keys += 1;
    }
    let (out, len) = writer.finish().unwrap();
    drop(out);
    let (hash, revision, total_key, total_size) = snapshot_status(&shapes);
    assert_eq!(
        (revision, total_key, total_size),
        (last_main as i64, n_keys, len)
    );
    let db = Db::open(&shapes).unwrap();
    assert_eq!(etcd_status_hash(&db).unwrap(), hash);
    assert_eq!(db.len(b"key").unwrap(), last_main);
    assert_eq!(
        db.get(b"key", &revision_key(5_000, 0))
            .unwrap()
            .unwrap()
            .len(),
        20_000
    );
}
