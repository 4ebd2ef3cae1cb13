//! Migration both ways through etcd's snapshot format: a snapshot saved from etcd 3.4 restores
//! into etcd-rs, and one saved from etcd-rs restores into etcd 3.4 with etcd's own `etcdctl
//! snapshot restore`, each side serving the same keys, revisions, history, leases, users and
//! roles, with the same `endpoint hashkv`; `etcdctl snapshot status` and ours agree on every
//! file.
//!
//! And the other way in: etcd-rs started on a stopped etcd member's data directory comes up as
//! that member (a single member, and every member of a 3-member cluster), leaving etcd's own
//! files as they were, so etcd starts on them again.
//!
//! The same against etcd 3.5.1 (`ETCDRS_TEST_ETCD35`): its data directory with a separate WAL
//! dir and `.snap` files, and its snapshots both ways with `etcdutl`.
//!
//! These tests always run both servers, ours and `/usr/bin/etcd` (3.4), so they are skipped
//! when the suite itself runs against etcd (`ETCDRS_TEST_ETCD_BIN`).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use etcd_client::{Compare, CompareOp, LeaseGrantOptions, PutOptions, Txn, TxnOp, WatchOptions};
use etcdrs_testkit::{Cluster, ClusterOpts, EtcdBin, Etcdctl, Member, MemberOpts};
use serde_json::Value;
use sha2::{Digest, Sha256};

use crate::ours;

const ROOT: &str = "root:rootpw";

fn etcd34() -> EtcdBin {
    EtcdBin::at("/usr/bin/etcd")
}

fn our_bin() -> EtcdBin {
    EtcdBin::at(env!("CARGO_BIN_EXE_etcd"))
}

/// `etcdctl` as root.
fn root_ctl(m: &Member) -> Etcdctl {
    m.etcdctl().with_user(ROOT)
}

/// Runs `etcd snapshot <args>` of our binary.
fn our_snapshot(args: &[&str]) -> std::process::Output {
    our_bin()
        .command()
        .arg("snapshot")
        .args(args)
        .output()
        .expect("run etcd snapshot")
}

/// Runs etcdctl 3.4's offline `snapshot <args>`.
fn ctl_snapshot(args: &[&str]) -> std::process::Output {
    Command::new(Etcdctl::new("").bin())
        .env("ETCDCTL_API", "3")
        .arg("snapshot")
        .args(args)
        .output()
        .expect("run etcdctl snapshot")
}

fn stdout_ok(out: &std::process::Output) -> String {
    assert!(out.status.success(), "{out:?}");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// A history with what a snapshot must carry: versions, a deletion, a compaction, a lease with
/// a key, a transaction, values over a page, enough keys for several pages, users, roles with
/// permissions, and auth enabled (the last step, so everything after runs as root).
async fn write_history(m: &Member) {
    let mut c = m.client().await.expect("client");
    c.put("a", "1", None).await.expect("writing the history");
    c.put("b", "2", None).await.expect("writing the history");
    c.put("a", "3", None).await.expect("writing the history");
    c.delete("b", None).await.expect("writing the history");
    for i in 0..400 {
        c.put(format!("/many/{i:04}"), format!("value-{i}"), None)
            .await
            .expect("writing the history");
    }
    c.put("big", "x".repeat(10_000), None)
        .await
        .expect("writing the history");
    let lease = c
        .lease_grant(900, None)
        .await
        .expect("writing the history")
        .id();
    c.put("leased", "l", Some(PutOptions::new().with_lease(lease)))
        .await
        .expect("writing the history");
    c.txn(
        Txn::new()
            .when([Compare::value("a", CompareOp::Equal, "3")])
            .and_then([TxnOp::put("t1", "x", None), TxnOp::put("t2", "y", None)]),
    )
    .await
    .expect("writing the history");
    c.compact(5, None).await.expect("writing the history");
    c.put("a", "4", None).await.expect("writing the history");
    let ctl = m.etcdctl();
    ctl.ok(&["user", "add", ROOT]).await;
    ctl.ok(&["role", "add", "r1"]).await;
    ctl.ok(&[
        "role",
        "grant-permission",
        "r1",
        "readwrite",
        "/many/",
        "--prefix",
    ])
    .await;
    ctl.ok(&["user", "add", "alice:alicepw"]).await;
    ctl.ok(&["user", "grant-role", "alice", "r1"]).await;
    ctl.ok(&["auth", "enable"]).await;
}

/// What must be equal on both sides of a migration.
#[derive(Debug, PartialEq)]
struct State {
    /// Every key with its value, revisions and version, as `etcdctl get -w json` prints them.
    kvs: Value,
    revision: i64,
    /// `endpoint hashkv`: hash and compact revision, now and at an older revision.
    hashkv: (u64, i64),
    hashkv_old: (u64, i64),
    /// An old value that survived the compaction.
    old_a: String,
    leases: String,
    lease_ttl: String,
    users: String,
    roles: String,
    role_r1: String,
    user_alice: String,
}

async fn hashkv(ctl: &Etcdctl, rev: i64) -> (u64, i64) {
    let rev = format!("--rev={rev}");
    let json: Value =
        serde_json::from_str(&ctl.ok(&["endpoint", "hashkv", &rev, "-w", "json"]).await)
            .expect("hashkv json");
    let h = &json[0]["HashKV"];
    (
        h["hash"].as_u64().expect("hash"),
        h["compact_revision"].as_i64().expect("compact revision"),
    )
}

async fn capture(m: &Member) -> State {
    let ctl = root_ctl(m);
    let json: Value = serde_json::from_str(&ctl.ok(&["get", "", "--from-key", "-w", "json"]).await)
        .expect("reading the state");
    let revision = json["header"]["revision"].as_i64().expect("revision");
    let leases = ctl.ok(&["lease", "list"]).await;
    let lease_id = leases.lines().nth(1).expect("a lease").trim().to_string();
    let ttl = ctl.ok(&["lease", "timetolive", &lease_id, "--keys"]).await;
    // The remaining TTL counts down: keep the granted TTL and the attached keys.
    let lease_ttl = ttl
        .split(", ")
        .filter(|part| !part.contains("remaining"))
        .collect::<Vec<_>>()
        .join(", ");
    State {
        kvs: json["kvs"].clone(),
        revision,
        hashkv: hashkv(&ctl, 0).await,
        hashkv_old: hashkv(&ctl, 8).await,
        old_a: ctl.ok(&["get", "a", "--rev=6", "--print-value-only"]).await,
        leases,
        lease_ttl,
        users: ctl.ok(&["user", "list"]).await,
        roles: ctl.ok(&["role", "list"]).await,
        role_r1: ctl.ok(&["role", "get", "r1"]).await,
        user_alice: ctl.ok(&["user", "get", "alice"]).await,
    }
}

/// Auth works after the move: alice's password (its bcrypt hash travelled) and her role's
/// permissions.
async fn check_alice(m: &Member) {
    let alice = m.etcdctl().with_user("alice:alicepw");
    assert_eq!(
        alice.ok(&["get", "/many/0001", "--print-value-only"]).await,
        "value-1\n"
    );
    let denied = alice.fail(&["put", "a", "nope"]).await;
    assert!(denied.contains("permission denied"), "{denied}");
    let wrong = m.etcdctl().with_user("alice:wrong");
    let refused = wrong.fail(&["get", "a"]).await;
    assert!(refused.contains("authentication failed"), "{refused}");
}

/// `snapshot status -w json` of `file` by etcdctl 3.4 and by our binary: the same numbers.
fn statuses_agree(file: &Path) -> Value {
    let file = file.display().to_string();
    let theirs: Value =
        serde_json::from_str(&stdout_ok(&ctl_snapshot(&["status", &file, "-w", "json"])))
            .expect("etcdctl status json");
    let mine: Value =
        serde_json::from_str(&stdout_ok(&our_snapshot(&["status", &file, "-w", "json"])))
            .expect("our status json");
    assert_eq!(mine, theirs, "snapshot status of {file}");
    theirs
}

/// A stopped member of `bin` whose data dir is gone, for a restore to fill: started once
/// for its ports and name.
async fn empty_member(bin: &EtcdBin) -> Member {
    let mut m = Member::start(MemberOpts::new(bin)).await.expect("member");
    m.stop().await.expect("preparing an empty member");
    std::fs::remove_dir_all(m.data_dir()).expect("preparing an empty member");
    m
}

fn restore_args(m: &Member, file: &Path) -> Vec<String> {
    vec![
        "restore".into(),
        file.display().to_string(),
        "--data-dir".into(),
        m.data_dir().display().to_string(),
        "--name".into(),
        m.name().into(),
        "--initial-cluster".into(),
        format!("{}={}", m.name(), m.peer_url()),
        "--initial-advertise-peer-urls".into(),
        m.peer_url(),
    ]
}

async fn save(m: &Member, dir: &Path) -> std::path::PathBuf {
    let file = dir.join("snap.db");
    let arg = file.display().to_string();
    root_ctl(m).ok(&["snapshot", "save", &arg]).await;
    file
}

/// The way in: etcd 3.4 → `etcdctl snapshot save` → our `etcd snapshot restore` → etcd-rs.
#[tokio::test]
async fn etcd_snapshot_restores_into_etcd_rs() {
    if !ours() {
        return;
    }
    let source = Member::start(MemberOpts::new(&etcd34())).await.unwrap();
    write_history(&source).await;
    let before = capture(&source).await;
    let dir = tempfile::tempdir().unwrap();
    let file = save(&source, dir.path()).await;
    let status = statuses_agree(&file);
    assert_eq!(status["revision"].as_i64(), Some(before.revision));

    let mut target = empty_member(&our_bin()).await;
    let args = restore_args(&target, &file);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    stdout_ok(&our_snapshot(&args));
    target.restart().await.unwrap();
    assert_eq!(capture(&target).await, before);
    check_alice(&target).await;
    // A new cluster of one that takes writes at the next revision.
    let put = root_ctl(&target)
        .ok(&["put", "after", "x", "-w", "json"])
        .await;
    let put: Value = serde_json::from_str(&put).unwrap();
    assert_eq!(
        put["header"]["revision"].as_i64(),
        Some(before.revision + 1)
    );
}

/// The way back out: etcd-rs → `etcdctl snapshot save` → etcdctl 3.4's `snapshot restore`
/// → etcd 3.4.
#[tokio::test]
async fn etcd_rs_snapshot_restores_into_etcd() {
    if !ours() {
        return;
    }
    let source = Member::start(MemberOpts::new(&our_bin())).await.unwrap();
    write_history(&source).await;
    let before = capture(&source).await;
    let dir = tempfile::tempdir().unwrap();
    let file = save(&source, dir.path()).await;
    let status = statuses_agree(&file);
    assert_eq!(status["revision"].as_i64(), Some(before.revision));
    assert_eq!(
        status["totalSize"].as_u64().map(|s| s + 32),
        Some(std::fs::metadata(&file).unwrap().len()),
        "the file is the database and its SHA-256"
    );

    let mut target = empty_member(&etcd34()).await;
    let args = restore_args(&target, &file);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    stdout_ok(&ctl_snapshot(&args));
    target.restart().await.unwrap();
    assert_eq!(capture(&target).await, before);
    check_alice(&target).await;

    // And back in again: etcd 3.4's snapshot of the restored member restores into etcd-rs
    // with the same state.
    std::fs::create_dir(dir.path().join("again")).unwrap();
    let file2 = save(&target, &dir.path().join("again")).await;
    let mut back = empty_member(&our_bin()).await;
    let args = restore_args(&back, &file2);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    stdout_ok(&our_snapshot(&args));
    back.restart().await.unwrap();
    assert_eq!(capture(&back).await, before);
}

/// A snapshot that is not a database, or a truncated one, is refused with a clear error and
/// leaves no data directory behind.
#[tokio::test]
async fn damaged_snapshots_are_refused_and_change_nothing() {
    if !ours() {
        return;
    }
    let source = Member::start(MemberOpts::new(&our_bin())).await.unwrap();
    source
        .client()
        .await
        .unwrap()
        .put("k", "v", None)
        .await
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("snap.db");
    let arg = file.display().to_string();
    source.etcdctl().ok(&["snapshot", "save", &arg]).await;
    let image = std::fs::read(&file).unwrap();
    let target = dir.path().join("restored");
    let target_arg = target.display().to_string();
    let cases: [(&str, Vec<u8>); 3] = [
        (
            "not a database",
            b"hello, this is not a database".repeat(100),
        ),
        ("truncated", image[..image.len() / 2].to_vec()),
        ("zeroed meta pages", {
            let mut zeroed = image.clone();
            zeroed[..8192].fill(0);
            zeroed
        }),
    ];
    for (what, bytes) in cases {
        let bad = dir.path().join("bad.db");
        std::fs::write(&bad, &bytes).unwrap();
        let bad_arg = bad.display().to_string();
        for args in [
            vec!["status", bad_arg.as_str()],
            vec![
                "restore",
                bad_arg.as_str(),
                "--data-dir",
                target_arg.as_str(),
                "--skip-hash-check",
            ],
        ] {
            let out = our_snapshot(&args);
            let stderr = String::from_utf8_lossy(&out.stderr);
            assert!(!out.status.success(), "{what} {args:?}: {out:?}");
            // The error is the last line (restore logs its steps before it).
            let error = stderr.lines().last().unwrap_or_default();
            assert!(error.starts_with("Error: "), "{what} {args:?}: {stderr}");
            assert!(
                error.contains("invalid database"),
                "{what} {args:?}: {stderr}"
            );
            assert!(
                !target.exists(),
                "{what}: a failed restore leaves no data dir"
            );
        }
    }
}

/// Every file under `dir` but our converted storage, with its length and SHA-256: etcd's files
/// as they are.
fn etcd_files(dir: &Path) -> BTreeMap<PathBuf, (u64, Vec<u8>)> {
    fn walk(dir: &Path, root: &Path, out: &mut BTreeMap<PathBuf, (u64, Vec<u8>)>) {
        for entry in std::fs::read_dir(dir).expect("read dir").flatten() {
            let path = entry.path();
            if path
                .strip_prefix(root)
                .is_ok_and(|p| p.starts_with("etcd-rs"))
            {
                continue;
            }
            if path.is_dir() {
                walk(&path, root, out);
            } else {
                let bytes = std::fs::read(&path).expect("read file");
                let digest = Sha256::digest(&bytes).to_vec();
                out.insert(path, (bytes.len() as u64, digest));
            }
        }
    }
    let mut out = BTreeMap::new();
    walk(dir, dir, &mut out);
    out
}

/// (cluster id, member id) as `endpoint status` reports them.
async fn ids(m: &Member) -> (u64, u64) {
    let json: Value =
        serde_json::from_str(&root_ctl(m).ok(&["endpoint", "status", "-w", "json"]).await)
            .expect("status json");
    let header = &json[0]["Status"]["header"];
    (
        header["cluster_id"].as_u64().expect("cluster id"),
        header["member_id"].as_u64().expect("member id"),
    )
}

/// The members as `member list` reports them.
async fn members(m: &Member) -> Value {
    let json: Value =
        serde_json::from_str(&root_ctl(m).ok(&["member", "list", "-w", "json"]).await)
            .expect("member list json");
    json["members"].clone()
}

/// A stopped etcd 3.4 member's data directory, started by etcd-rs with the same flags: the
/// same member, cluster, keys, history, leases and auth; etcd's files untouched, so etcd 3.4
/// starts on the directory again afterwards.
#[tokio::test]
async fn etcd_data_dir_starts_as_the_same_member() {
    data_dir_round_trip(&etcd34(), &[], false).await;
}

/// The same with etcd's snapshots taken every 50 entries, so that etcd's WAL starts after a
/// `.snap` file and the conversion starts the log from it.
#[tokio::test]
async fn etcd_data_dir_with_snapshots_starts_as_the_same_member() {
    data_dir_round_trip(&etcd34(), &["--snapshot-count=50"], true).await;
}

/// The same for a member whose WAL etcd kept outside the data dir (`--wal-dir`).
#[tokio::test]
async fn etcd_data_dir_with_a_separate_wal_dir_starts_as_the_same_member() {
    let wal = tempfile::tempdir().unwrap();
    let flag = format!("--wal-dir={}", wal.path().join("wal").display());
    data_dir_round_trip(&etcd34(), &[&flag], false).await;
    let wal_files = std::fs::read_dir(wal.path().join("wal")).unwrap().count();
    assert!(wal_files > 0, "etcd's WAL is where --wal-dir put it");
}

/// The same for an etcd 3.5.1 member, with its WAL outside the data dir and `.snap` files:
/// etcd 3.5.1's database holds each member as it was added (no client URLs: 3.5.1 writes a
/// member's published attributes to its v2 store only), so the membership comes from the
/// newest `.snap` file's v2 store and the publishes after it.
#[tokio::test]
async fn etcd_35_data_dir_with_snapshots_and_a_separate_wal_dir_starts_as_the_same_member() {
    if !ours() {
        return;
    }
    let wal = tempfile::tempdir().unwrap();
    let flag = format!("--wal-dir={}", wal.path().join("wal").display());
    data_dir_round_trip(&crate::etcd35(), &[&flag, "--snapshot-count=50"], true).await;
    let wal_files = std::fs::read_dir(wal.path().join("wal")).unwrap().count();
    assert!(wal_files > 0, "etcd's WAL is where --wal-dir put it");
}

/// An etcd 3.5.1 member young enough to have no `.snap` file: its WAL from the first entry.
#[tokio::test]
async fn etcd_35_data_dir_without_snapshots_starts_as_the_same_member() {
    if !ours() {
        return;
    }
    data_dir_round_trip(&crate::etcd35(), &[], false).await;
}

async fn data_dir_round_trip(etcd: &EtcdBin, args: &[&str], expect_snap_files: bool) {
    if !ours() {
        return;
    }
    let opts = MemberOpts::new(etcd).args(args.iter().copied());
    let mut m = Member::start(opts).await.expect("data dir round trip");
    write_history(&m).await;
    let before = capture(&m).await;
    let ids_before = ids(&m).await;
    let members_before = members(&m).await;
    m.stop().await.expect("data dir round trip");
    let files = etcd_files(m.data_dir());

    if expect_snap_files {
        let snaps = std::fs::read_dir(m.data_dir().join("member/snap"))
            .expect("data dir round trip")
            .flatten()
            .filter(|e| e.file_name().to_string_lossy().ends_with(".snap"))
            .count();
        assert!(snaps > 0, "etcd wrote no .snap file");
    }
    m.set_bin(&our_bin());
    m.restart().await.expect("data dir round trip");
    assert!(
        m.current_log().contains("converted etcd data directory"),
        "{}",
        m.log_tail(40)
    );
    assert_eq!(capture(&m).await, before);
    assert_eq!(ids(&m).await, ids_before);
    assert_eq!(members(&m).await, members_before);
    check_alice(&m).await;
    root_ctl(&m).ok(&["put", "written-by", "etcd-rs"]).await;
    // The next start is an ordinary restart of the converted member.
    m.restart().await.expect("data dir round trip");
    assert!(
        !m.current_log().contains("converting"),
        "{}",
        m.log_tail(40)
    );
    assert_eq!(
        root_ctl(&m)
            .ok(&["get", "written-by", "--print-value-only"])
            .await,
        "etcd-rs\n"
    );
    m.stop().await.expect("data dir round trip");
    assert_eq!(
        etcd_files(m.data_dir()),
        files,
        "etcd's files are untouched"
    );

    // Back to etcd: it starts from its own files, as it left them.
    m.set_bin(etcd);
    m.restart().await.expect("data dir round trip");
    assert_eq!(capture(&m).await, before);
}

/// All three members of a stopped etcd 3.4 cluster, started by etcd-rs: one etcd-rs cluster
/// with the same ids and the same state on every member, which elects a leader and takes
/// writes.
#[tokio::test]
async fn stopped_etcd_cluster_runs_as_an_etcd_rs_cluster() {
    stopped_cluster_runs_as_etcd_rs(&etcd34()).await;
}

/// The same for a stopped etcd 3.5.1 cluster, whose databases hold no member's client URLs:
/// every member lists them as etcd did.
#[tokio::test]
async fn stopped_etcd_35_cluster_runs_as_an_etcd_rs_cluster() {
    if !ours() {
        return;
    }
    stopped_cluster_runs_as_etcd_rs(&crate::etcd35()).await;
}

async fn stopped_cluster_runs_as_etcd_rs(etcd: &EtcdBin) {
    if !ours() {
        return;
    }
    let mut cluster = Cluster::start(3, ClusterOpts::new(etcd))
        .await
        .expect("the etcd cluster starts");
    write_history(cluster.member(0)).await;
    let before = capture(cluster.member(0)).await;
    let mut ids_before = Vec::new();
    for i in 0..3 {
        ids_before.push(ids(cluster.member(i)).await);
    }
    let members_before = members(cluster.member(0)).await;
    for i in 0..3 {
        cluster.member_mut(i).stop().await.expect("etcd stops");
        cluster.member_mut(i).set_bin(&our_bin());
    }
    cluster
        .restart_all()
        .await
        .expect("the converted cluster starts");
    for (i, ids_before) in ids_before.iter().enumerate() {
        let m = cluster.member(i);
        assert!(
            m.current_log().contains("converted etcd data directory"),
            "{}",
            m.log_tail(40)
        );
        assert_eq!(ids(m).await, *ids_before);
        assert_eq!(capture(m).await, before, "member {i}");
    }
    for i in 0..3 {
        assert_eq!(
            members(cluster.member(i)).await,
            members_before,
            "member {i}"
        );
    }
    check_alice(cluster.member(1)).await;
    root_ctl(cluster.member(2))
        .ok(&["put", "after", "conversion"])
        .await;
    for i in 0..3 {
        let got = root_ctl(cluster.member(i))
            .ok(&["get", "after", "--print-value-only"])
            .await;
        assert_eq!(got, "conversion\n", "member {i}");
    }
}

/// A conversion that did not finish (a crash before its last step) is refused with an error
/// that says what to do, and changes nothing.
#[tokio::test]
async fn a_half_finished_conversion_is_refused() {
    if !ours() {
        return;
    }
    let mut m = Member::start(MemberOpts::new(&etcd34())).await.unwrap();
    m.stop().await.unwrap();
    std::fs::create_dir(m.data_dir().join("etcd-rs.converting")).unwrap();
    m.set_bin(&our_bin());
    refused_unchanged(&mut m, "holds a conversion from etcd that did not finish").await;
}

/// `m` fails to start, logging `message`, and its data dir is as it was.
async fn refused_unchanged(m: &mut Member, message: &str) {
    let files = etcd_files(m.data_dir());
    assert!(m.restart().await.is_err());
    let log = m.current_log();
    assert!(log.contains(message), "{log}");
    assert_eq!(etcd_files(m.data_dir()), files);
}

/// A data directory whose database is neither etcd's nor ours is refused at start, and left as
/// it is.
#[tokio::test]
async fn an_unknown_database_is_refused() {
    if !ours() {
        return;
    }
    let mut m = Member::start(MemberOpts::new(&our_bin())).await.unwrap();
    m.stop().await.unwrap();
    let db = m.data_dir().join("member/snap/db");
    std::fs::write(&db, b"this is not a database of anybody's".repeat(200)).unwrap();
    refused_unchanged(
        &mut m,
        "is neither etcd's (bbolt) nor etcd-rs's (redb) database",
    )
    .await;
}

/// etcd killed (SIGKILL) right after its last acknowledged write: its backend may not have
/// every applied entry yet, so the conversion must replay etcd's WAL past the backend's
/// consistent index. Every acknowledged write is there after the conversion.
#[tokio::test]
async fn a_killed_etcd_converts_with_every_acknowledged_write() {
    if !ours() {
        return;
    }
    let mut m = Member::start(MemberOpts::new(&etcd34())).await.unwrap();
    let mut c = m.client().await.unwrap();
    let mut last_rev = 0;
    for i in 0..300 {
        let put = c
            .put(format!("k{i:03}"), format!("v{i}"), None)
            .await
            .unwrap();
        last_rev = put.header().unwrap().revision();
    }
    c.delete("k000", None).await.unwrap();
    m.kill9().unwrap();
    m.set_bin(&our_bin());
    m.restart().await.unwrap();
    // How far etcd's backend had got (its consistent index) against the WAL it left.
    let log = m.current_log();
    for line in log.lines().filter(|l| l.contains("converted etcd's")) {
        eprintln!("{line}");
    }
    let mut c = m.client().await.unwrap();
    let all = c
        .get("k", Some(etcd_client::GetOptions::new().with_prefix()))
        .await
        .unwrap();
    assert_eq!(all.kvs().len(), 299);
    assert_eq!(all.kvs()[0].key(), b"k001");
    assert_eq!(all.kvs()[298].value(), b"v299");
    assert_eq!(all.header().unwrap().revision(), last_rev + 1);
}

/// The compaction point of [`write_compacted_history`].
const COMPACTED_AT: i64 = 15;
/// Its last revision.
const HISTORY_END: i64 = 29;

/// Overwrites, deletions before and after a compaction, a key of a lease (with a fixed id, so
/// that two servers store the same bytes) revoked after it, and a key deleted and written
/// again after it: tombstones above the compacted revision, which `endpoint hashkv` counts.
async fn write_compacted_history(m: &Member) {
    let mut c = m.client().await.expect("client");
    for i in 1..=20 {
        c.put(format!("k{}", i % 5), format!("v{i}"), None)
            .await
            .expect("writing the history");
    }
    c.delete("k1", None).await.expect("writing the history"); // 22
    c.lease_grant(900, Some(LeaseGrantOptions::new().with_id(0x5eed)))
        .await
        .expect("writing the history");
    c.put("leased", "l", Some(PutOptions::new().with_lease(0x5eed)))
        .await
        .expect("writing the history"); // 23
    c.put("k2", "again", None)
        .await
        .expect("writing the history"); // 24
    c.compact(COMPACTED_AT, None)
        .await
        .expect("writing the history");
    c.delete("k3", None).await.expect("writing the history"); // 25
    c.put("k6", "new", None).await.expect("writing the history"); // 26
    c.lease_revoke(0x5eed).await.expect("writing the history"); // 27
    c.delete("k4", None).await.expect("writing the history"); // 28
    let last = c
        .put("k4", "reborn", None)
        .await
        .expect("writing the history");
    assert_eq!(last.header().map(|h| h.revision()), Some(HISTORY_END));
}

/// `endpoint hashkv` now and at revisions around the compaction and the later deletions.
async fn hashes(m: &Member) -> Vec<(u64, i64)> {
    let ctl = m.etcdctl();
    let mut out = Vec::new();
    for rev in [0, COMPACTED_AT + 1, 22, 25, 27] {
        out.push(hashkv(&ctl, rev).await);
    }
    out
}

/// Every event a watcher of all keys gets from just after the compaction to the end:
/// (type, key, mod revision), deletions included.
async fn history_events(m: &Member) -> Vec<(i32, String, i64)> {
    let mut c = m.client().await.expect("client");
    let options = WatchOptions::new()
        .with_all_keys()
        .with_start_revision(COMPACTED_AT + 1);
    let mut stream = c.watch("", Some(options)).await.expect("watch");
    let mut events = Vec::new();
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(10);
    while events.last().map(|(_, _, rev)| *rev) != Some(HISTORY_END) {
        let message = tokio::time::timeout_at(deadline, stream.message())
            .await
            .unwrap_or_else(|_| panic!("history in time; got {events:?}"))
            .expect("watch")
            .expect("watch open");
        for event in message.events() {
            let kv = event.kv().expect("event kv");
            events.push((
                event.event_type() as i32,
                String::from_utf8_lossy(kv.key()).into_owned(),
                kv.mod_revision(),
            ));
        }
    }
    events
}

/// Our snapshot, restored by etcd 3.4, hashes as ours, and etcd's restored by ours hashes as
/// etcd's, after a history whose compaction left tombstones above it. Each side with the
/// same history hashes the same to begin with, and a watcher from just after the compaction
/// sees the same events everywhere.
///
/// etcd-rs used to store a tombstone with its revision (`KeyValue { key, mod_revision }`)
/// where etcd stores `KeyValue { key }`; its own `HashKV` hashed etcd's form, but etcd
/// restored from our snapshot hashed the bytes it found: `endpoint hashkv` differed at the
/// same revision as soon as a deletion followed the compaction. And an etcd snapshot restored
/// into etcd-rs gave its watchers deletions with revision 0, which the catch-up dropped.
#[tokio::test]
async fn snapshot_after_compaction_hashes_the_same_both_ways() {
    if !ours() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let ours_source = Member::start(MemberOpts::new(&our_bin())).await.unwrap();
    let etcd_source = Member::start(MemberOpts::new(&etcd34())).await.unwrap();
    write_compacted_history(&ours_source).await;
    write_compacted_history(&etcd_source).await;
    let expected = hashes(&etcd_source).await;
    assert_eq!(expected[0].1, COMPACTED_AT);
    assert_eq!(hashes(&ours_source).await, expected, "the same history");
    let events = history_events(&etcd_source).await;
    assert_eq!(history_events(&ours_source).await, events);
    let deletions = events.iter().filter(|(kind, _, _)| *kind == 1).count();
    assert_eq!(deletions, 4, "{events:?}");

    // Ours → etcdctl snapshot restore → etcd 3.4.
    std::fs::create_dir(dir.path().join("ours")).unwrap();
    let file = save(&ours_source, &dir.path().join("ours")).await;
    let mut etcd_restored = empty_member(&etcd34()).await;
    let args = restore_args(&etcd_restored, &file);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    stdout_ok(&ctl_snapshot(&args));
    etcd_restored.restart().await.unwrap();
    assert_eq!(hashes(&etcd_restored).await, expected, "etcd restored ours");
    assert_eq!(history_events(&etcd_restored).await, events);

    // etcd 3.4 → our snapshot restore → ours.
    std::fs::create_dir(dir.path().join("etcd")).unwrap();
    let file = save(&etcd_source, &dir.path().join("etcd")).await;
    let mut ours_restored = empty_member(&our_bin()).await;
    let args = restore_args(&ours_restored, &file);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    stdout_ok(&our_snapshot(&args));
    ours_restored.restart().await.unwrap();
    assert_eq!(
        hashes(&ours_restored).await,
        expected,
        "ours restored etcd's"
    );
    assert_eq!(history_events(&ours_restored).await, events);
}

/// Runs etcd 3.5.1's `etcdutl` (`etcdctl` when `tool` says so) with `args`.
fn etcd35_tool(tool: &str, args: &[&str]) -> std::process::Output {
    Command::new(crate::etcd35_dir().join(tool))
        .args(args)
        .output()
        .expect("run an etcd 3.5.1 tool")
}

/// Both ways between etcd 3.5.1 and etcd-rs through snapshot files: etcd 3.5.1 →
/// `etcdctl snapshot save` 3.5.1 → our binary as `etcdutl snapshot restore` → etcd-rs, then
/// etcd-rs → `snapshot save` → `etcdutl snapshot restore` 3.5.1 → etcd 3.5.1; each member
/// serves the same keys, revisions, history, leases, users and roles with the same `endpoint
/// hashkv`, and `etcdutl snapshot status` 3.5.1 says of each file what ours says; and etcd
/// 3.5.1 starts on its data directory after our `etcdutl defrag --data-dir`.
#[tokio::test]
async fn etcd_35_snapshots_restore_into_etcd_rs_and_back_with_etcdutl() {
    if !ours() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let our_etcdutl = dir.path().join("etcdutl");
    std::os::unix::fs::symlink(env!("CARGO_BIN_EXE_etcd"), &our_etcdutl).unwrap();
    // The same output, byte for byte, in every format (protobuf: the same refusal).
    let status_agrees = |file: &Path| {
        let file = file.display().to_string();
        for format in ["simple", "table", "fields", "json", "protobuf"] {
            let args = ["snapshot", "status", file.as_str(), "-w", format];
            let theirs = etcd35_tool("etcdutl", &args);
            let mine = Command::new(&our_etcdutl).args(args).output().unwrap();
            assert_eq!(
                (mine.status.code(), &mine.stdout),
                (theirs.status.code(), &theirs.stdout),
                "snapshot status -w {format} of {file}: {mine:?} {theirs:?}"
            );
            if !theirs.status.success() {
                assert_eq!(mine.stderr, theirs.stderr, "-w {format}");
            }
        }
    };

    let mut source = Member::start(MemberOpts::new(&crate::etcd35()))
        .await
        .unwrap();
    write_history(&source).await;
    let before = capture(&source).await;
    let file = dir.path().join("etcd35.db");
    let file_arg = file.display().to_string();
    let endpoints = format!("--endpoints={}", source.endpoint());
    let user = format!("--user={ROOT}");
    stdout_ok(&etcd35_tool(
        "etcdctl",
        &[&endpoints, &user, "snapshot", "save", &file_arg],
    ));
    status_agrees(&file);
    // Our `etcdutl defrag --data-dir` on the stopped 3.5.1 member: etcd 3.5.1 starts on the
    // rewritten database with the same state.
    source.stop().await.unwrap();
    let data_dir = source.data_dir().display().to_string();
    let out = Command::new(&our_etcdutl)
        .args(["defrag", "--data-dir", &data_dir])
        .output()
        .unwrap();
    assert_eq!(stdout_ok(&out), "");
    source.restart().await.unwrap();
    assert_eq!(capture(&source).await, before);

    let mut ours_restored = empty_member(&our_bin()).await;
    let args = restore_args(&ours_restored, &file);
    let mut args: Vec<&str> = args.iter().map(String::as_str).collect();
    args.insert(0, "snapshot");
    let out = Command::new(&our_etcdutl).args(&args).output().unwrap();
    stdout_ok(&out);
    ours_restored.restart().await.unwrap();
    assert_eq!(capture(&ours_restored).await, before);
    check_alice(&ours_restored).await;

    std::fs::create_dir(dir.path().join("back")).unwrap();
    let back_file = save(&ours_restored, &dir.path().join("back")).await;
    status_agrees(&back_file);
    let mut theirs_restored = empty_member(&crate::etcd35()).await;
    let args = restore_args(&theirs_restored, &back_file);
    let mut args: Vec<&str> = args.iter().map(String::as_str).collect();
    args.insert(0, "snapshot");
    stdout_ok(&etcd35_tool("etcdutl", &args));
    theirs_restored.restart().await.unwrap();
    assert_eq!(capture(&theirs_restored).await, before);
    check_alice(&theirs_restored).await;
}
