//! The Maintenance service as `etcdctl` and clients use it: `endpoint hashkv`, `snapshot
//! save` and restoring the saved file, `defrag`, `alarm list` / `alarm disarm`.
//!
//! Everything here runs against etcd 3.4 too (`ETCDRS_TEST_ETCD_BIN=/usr/bin/etcd`) except the
//! parts that run our binary's `etcd snapshot restore|status` subcommand, which etcd 3.4 does
//! not have: those check [`ours`] first and say so. The restore round trip itself runs on both,
//! using `etcdctl snapshot restore` for etcd (its bolt snapshots are not ours to read).

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use etcd_client::{CompactionOptions, DeleteOptions, GetOptions};
use etcdrs_testkit::{Code, EtcdBin, Etcdctl, Member, assert_grpc_error, poll_until};
use serde_json::Value;
use sha2::{Digest, Sha256};

use crate::ours;
use crate::{dump, opts, revision, start, start_with};

/// `etcdctl` pointed at `m`.
fn ctl(m: &Member) -> Etcdctl {
    m.etcdctl()
}

/// `etcdctl endpoint hashkv [--rev]` of `m`: (hash, compact revision, header revision).
async fn hashkv(m: &Member, rev: i64) -> (u64, i64, i64) {
    let rev_flag = format!("--rev={rev}");
    let out = ctl(m)
        .ok(&["endpoint", "hashkv", &rev_flag, "-w", "json"])
        .await;
    let json: Value = serde_json::from_str(&out).expect("hashkv json");
    let hashkv = &json[0]["HashKV"];
    (
        hashkv["hash"].as_u64().expect("hash"),
        hashkv["compact_revision"]
            .as_i64()
            .expect("compact_revision"),
        hashkv["header"]["revision"].as_i64().expect("revision"),
    )
}

async fn db_size(m: &Member) -> u64 {
    let out = ctl(m).ok(&["endpoint", "status", "-w", "json"]).await;
    let json: Value = serde_json::from_str(&out).expect("status json");
    json[0]["Status"]["dbSize"].as_u64().expect("dbSize")
}

#[tokio::test]
async fn hashkv_equal_for_equal_histories() {
    let ((a, mut ca), (b, mut cb)) = tokio::join!(start(), start());
    for c in [&mut ca, &mut cb] {
        c.put("a", "b", None).await.unwrap();
        c.put("c", "d", None).await.unwrap();
    }
    // Both members, and etcd 3.4.23 after the same two puts on a fresh member.
    let expected = (3_424_965_703, -1, 3);
    assert_eq!(hashkv(&a, 0).await, expected);
    assert_eq!(hashkv(&b, 0).await, expected);
    // The plain form prints the endpoint and the hash.
    let plain = ctl(&a).ok(&["endpoint", "hashkv"]).await;
    assert_eq!(plain, format!("{}, 3424965703\n", ctl(&a).endpoints()));

    // A different write changes the hash; the history before it still hashes the same.
    cb.put("c", "other", None).await.unwrap();
    ca.put("c", "d", None).await.unwrap();
    assert_ne!(hashkv(&a, 0).await.0, hashkv(&b, 0).await.0);
    assert_eq!(hashkv(&a, 3).await.0, hashkv(&b, 3).await.0);
    assert_eq!(hashkv(&a, 3).await.0, 3_424_965_703);

    // The whole-backend hash is stable while nothing is written and moves with a write.
    let h1 = ca.hash().await.unwrap();
    assert_eq!(h1.header().unwrap().revision(), 4);
    assert_eq!(ca.hash().await.unwrap().hash(), h1.hash());
    ca.put("e", "f", None).await.unwrap();
    assert_ne!(ca.hash().await.unwrap().hash(), h1.hash());
}

#[tokio::test]
async fn hashkv_at_compacted_or_future_revision_fails() {
    let (m, mut c) = start().await;
    for i in 0..5 {
        c.put("k", format!("v{i}"), None).await.unwrap();
    }
    c.delete("k", None).await.unwrap();
    let before = hashkv(&m, 0).await;
    assert_eq!((before.1, before.2), (-1, 7));
    c.compact(4, None).await.unwrap();

    // etcd refuses the compacted revision itself, not only older ones.
    for rev in ["--rev=2", "--rev=4"] {
        let err = ctl(&m).fail(&["endpoint", "hashkv", rev]).await;
        assert!(
            err.contains("etcdserver: mvcc: required revision has been compacted"),
            "{err}"
        );
    }
    let err = ctl(&m).fail(&["endpoint", "hashkv", "--rev=8"]).await;
    assert!(
        err.contains("etcdserver: mvcc: required revision is a future revision"),
        "{err}"
    );
    assert_grpc_error(
        c.hash_kv(3).await,
        Code::OutOfRange,
        "etcdserver: mvcc: required revision has been compacted",
    );
    assert_grpc_error(
        c.hash_kv(9).await,
        Code::OutOfRange,
        "etcdserver: mvcc: required revision is a future revision",
    );

    // After the compaction point the hash reports it; the current revision is unchanged.
    let after = hashkv(&m, 5).await;
    assert_eq!((after.1, after.2), (4, 7));
    let resp = c.hash_kv(0).await.unwrap();
    assert_eq!(resp.compact_version(), 4);
    assert_eq!(resp.header().unwrap().revision(), 7);
}

#[tokio::test]
async fn snapshot_stream_is_chunked_and_ends_with_its_sha256() {
    let (_m, mut c) = start().await;
    // A few hundred KiB, so the stream has many messages.
    for i in 0..64 {
        c.put(format!("k{i:03}"), vec![b'v'; 8 * 1024], None)
            .await
            .unwrap();
    }
    let mut stream = c.snapshot().await.unwrap();
    let mut messages = Vec::new();
    while let Some(message) = stream.message().await.unwrap() {
        messages.push((message.remaining_bytes(), message.blob().to_vec()));
    }
    let (last_remaining, sha) = messages.pop().expect("the digest message");
    assert_eq!(last_remaining, 0);
    assert_eq!(sha.len(), 32);
    let data: Vec<u8> = messages.iter().flat_map(|(_, blob)| blob.clone()).collect();
    assert!(data.len() > 512 * 1024, "{} bytes", data.len());
    assert_eq!(Sha256::digest(&data).as_slice(), sha.as_slice());
    // etcdctl recognises a digest by the total size.
    assert_eq!((data.len() + sha.len()) % 512, 32);
    // 32 KiB messages, each telling how many bytes are still to come.
    let mut sent = 0;
    for (remaining, blob) in &messages {
        assert!(blob.len() <= 32 * 1024);
        sent += blob.len();
        assert_eq!(*remaining as usize, data.len() - sent);
    }
    assert_eq!(messages[0].1.len(), 32 * 1024);
}

/// Runs `etcd snapshot <args>` (our binary; etcd 3.4 has no such subcommand).
fn our_snapshot_cmd(args: &[&str]) -> std::process::Output {
    EtcdBin::at(env!("CARGO_BIN_EXE_etcd"))
        .command()
        .arg("snapshot")
        .args(args)
        .output()
        .expect("run etcd snapshot")
}

/// Restore `file` into `m`'s (removed) data dir for `m`'s name and peer URL.
fn restore_into(m: &Member, file: &Path, extra: &[&str]) -> std::process::Output {
    let cluster = format!("{}={}", m.name(), m.peer_url());
    let data_dir = m.data_dir().display().to_string();
    let file = file.display().to_string();
    let mut args = vec![
        "restore",
        &file,
        "--data-dir",
        &data_dir,
        "--name",
        m.name(),
        "--initial-cluster",
        &cluster,
        "--initial-advertise-peer-urls",
    ];
    let peer_url = m.peer_url();
    args.push(&peer_url);
    args.extend_from_slice(extra);
    if ours() {
        our_snapshot_cmd(&args)
    } else {
        // etcd's own restore for etcd's snapshots (same flags in etcdctl 3.4).
        Command::new(ctl(m).bin())
            .env("ETCDCTL_API", "3")
            .arg("snapshot")
            .args(&args)
            .output()
            .expect("run etcdctl snapshot restore")
    }
}

#[tokio::test]
async fn snapshot_save_then_restore_into_a_new_member() {
    let (a, mut ca) = start().await;
    let lease = ca.lease_grant(600, None).await.unwrap().id();
    ca.put("a", "1", None).await.unwrap();
    ca.put("b", "1", None).await.unwrap();
    ca.put("a", "2", None).await.unwrap();
    ca.delete("b", None).await.unwrap();
    ca.put(
        "leased",
        "x",
        Some(etcd_client::PutOptions::new().with_lease(lease)),
    )
    .await
    .unwrap();
    ca.compact(3, None).await.unwrap();
    ca.put("c", "3", None).await.unwrap();
    let rev = revision(&mut ca).await;
    let keys = dump(&mut ca).await;
    let source_hash = hashkv(&a, 0).await;

    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("snap.db");
    let file_arg = file.display().to_string();
    let out = ctl(&a).ok(&["snapshot", "save", &file_arg]).await;
    assert_eq!(out, format!("Snapshot saved at {file_arg}\n"));
    // Writes after the snapshot are not in it.
    ca.put("late", "x", None).await.unwrap();

    if ours() {
        // `etcd snapshot status` is ours only: the revision is the snapshot's.
        let status = our_snapshot_cmd(&["status", &file_arg, "-w", "json"]);
        assert!(status.status.success(), "{status:?}");
        let json: Value = serde_json::from_slice(&status.stdout).unwrap();
        assert_eq!(json["revision"].as_i64(), Some(rev));
        assert!(json["totalKey"].as_u64().unwrap() >= 5);
        let size = json["totalSize"].as_u64().unwrap();
        assert_eq!(
            (size + 32) as usize,
            std::fs::metadata(&file).unwrap().len() as usize
        );
        let table = our_snapshot_cmd(&["status", &file_arg, "-w", "table"]);
        let table = String::from_utf8_lossy(&table.stdout).into_owned();
        // The HASH column is as wide as the hash's hex digits (no zero padding, as etcdutl
        // prints it), so compare the header with its padding collapsed.
        let squashed = table.split_whitespace().collect::<Vec<_>>().join(" ");
        assert!(
            squashed.contains("| HASH | REVISION | TOTAL KEYS | TOTAL SIZE |"),
            "{table}"
        );
    }

    // A new member: start it once for its ports, then replace its data dir by the restore.
    let mut b = Member::start(opts()).await.unwrap();
    b.stop().await.unwrap();
    std::fs::remove_dir_all(b.data_dir()).unwrap();
    let out = restore_into(&b, &file, &[]);
    assert!(out.status.success(), "{out:?}");
    // The data dir now exists: restoring again is refused.
    let again = restore_into(&b, &file, &[]);
    assert!(!again.status.success());
    assert!(
        String::from_utf8_lossy(&again.stderr).contains("exists"),
        "{again:?}"
    );
    b.restart().await.unwrap();
    let mut cb = b.client().await.unwrap();

    assert_eq!(dump(&mut cb).await, keys);
    assert_eq!(revision(&mut cb).await, rev);
    assert_eq!(hashkv(&b, 0).await, source_hash);
    // History and the compaction mark came along.
    let old = cb
        .get("a", Some(GetOptions::new().with_revision(4)))
        .await
        .unwrap();
    assert_eq!(old.kvs()[0].value(), b"2");
    assert_grpc_error(
        cb.get("a", Some(GetOptions::new().with_revision(2))).await,
        Code::OutOfRange,
        "etcdserver: mvcc: required revision has been compacted",
    );
    // The member is a fresh single-member cluster that takes writes.
    let members = cb.member_list().await.unwrap();
    assert_eq!(members.members().len(), 1);
    assert_eq!(members.members()[0].name(), b.name());
    let leases = cb.leases().await.unwrap();
    assert_eq!(
        leases.leases().iter().map(|l| l.id()).collect::<Vec<_>>(),
        [lease]
    );
    let put = cb.put("after", "restore", None).await.unwrap();
    assert_eq!(put.header().unwrap().revision(), rev + 1);
}

#[tokio::test]
async fn restore_refuses_a_corrupt_snapshot() {
    // Our subcommand only; etcdctl 3.4's restore has the same checks and messages.
    if !ours() {
        return;
    }
    let (a, _ca) = start().await;
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("snap.db");
    let file_arg = file.display().to_string();
    ctl(&a).ok(&["snapshot", "save", &file_arg]).await;
    let mut image = std::fs::read(&file).unwrap();
    image[100] ^= 0xff;
    let bad = dir.path().join("bad.db");
    std::fs::write(&bad, &image).unwrap();

    let target = dir.path().join("restored");
    let target_arg = target.display().to_string();
    let bad_arg = bad.display().to_string();
    let out = our_snapshot_cmd(&["restore", &bad_arg, "--data-dir", &target_arg]);
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("Error: expected sha256 ["), "{stderr}");
    assert!(!target.exists(), "a failed restore leaves no data dir");

    // A file without the digest (etcd's `hasChecksum`) needs --skip-hash-check.
    std::fs::write(&bad, &image[..image.len() - 32]).unwrap();
    let out = our_snapshot_cmd(&["restore", &bad_arg, "--data-dir", &target_arg]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("Error: snapshot missing hash but --skip-hash-check=false"),
        "{stderr}"
    );
    std::fs::write(&bad, &std::fs::read(&file).unwrap()[..image.len() - 32]).unwrap();
    let out = our_snapshot_cmd(&[
        "restore",
        &bad_arg,
        "--data-dir",
        &target_arg,
        "--skip-hash-check",
    ]);
    assert!(out.status.success(), "{out:?}");
    assert!(target.join("member/snap/db").exists());
}

/// Puts `count` values of `value_len` bytes under `prefix` (`prefix0000`, ...), deletes the
/// keys under `deleted` (which must be `expect_deleted` of them) and compacts physically at
/// the deletion's revision, which is returned.
async fn put_delete_compact(
    c: &mut etcd_client::Client,
    prefix: &str,
    count: usize,
    value_len: usize,
    deleted: &str,
    expect_deleted: i64,
) -> i64 {
    let value = vec![b'v'; value_len];
    for i in 0..count {
        c.put(format!("{prefix}{i:04}"), value.clone(), None)
            .await
            .expect("put");
    }
    let gone = c
        .delete(deleted, Some(DeleteOptions::new().with_prefix()))
        .await
        .expect("delete");
    assert_eq!(gone.deleted(), expect_deleted);
    let rev = gone.header().expect("a header").revision();
    c.compact(rev, Some(CompactionOptions::new().with_physical()))
        .await
        .expect("compact");
    rev
}

#[tokio::test]
async fn defrag_shrinks_the_database_after_deletes() {
    let (m, mut c) = start().await;
    let rev = put_delete_compact(&mut c, "bulk/", 1000, 4 * 1024, "bulk/", 1000).await;
    let before = db_size(&m).await;
    assert!(before > 4_000_000, "db is {before} bytes");

    let out = ctl(&m).ok(&["defrag"]).await;
    assert_eq!(
        out,
        format!(
            "Finished defragmenting etcd member[{}]\n",
            ctl(&m).endpoints()
        )
    );
    let after = db_size(&m).await;
    assert!(after < before / 4, "defrag: {before} -> {after} bytes");
    // Nothing was lost or changed by it.
    assert_eq!(revision(&mut c).await, rev);
    c.put("k", "v", None).await.unwrap();
    assert_eq!(dump(&mut c).await, [("k".to_owned(), "v".to_owned())]);
}

/// etcd's `dbSizeInUse` counts the pages the data takes, and a defragmented file is about all
/// in use: a tool that defragments when the file is well past what is in use (etcd-defrag's
/// rule) must not find a just-defragmented member worth defragmenting again. 1 KiB values fill
/// a 4 KiB page three at a time, so the pages in use are well past the keys' and values'
/// bytes.
#[tokio::test]
async fn after_a_defrag_the_file_is_about_all_in_use() {
    let (m, mut c) = start().await;
    put_delete_compact(&mut c, "page/", 1500, 1024, "page/0", 1000).await;
    ctl(&m).ok(&["defrag"]).await;
    // 500 keys of 9 bytes with their values, as stored (about 50 bytes of revisions and
    // encoding each).
    let stored = 500 * (9 + 1024 + 50);
    let (size, in_use) = poll_until(Duration::from_secs(10), || async {
        let out = ctl(&m).ok(&["endpoint", "status", "-w", "json"]).await;
        let json: Value = serde_json::from_str(&out).map_err(|e| e.to_string())?;
        let status = &json[0]["Status"];
        let size = status["dbSize"].as_u64().ok_or("no dbSize")?;
        let in_use = status["dbSizeInUse"].as_u64().ok_or("no dbSizeInUse")?;
        if size * 10 <= in_use * 11 && in_use >= stored * 5 / 4 {
            Ok((size, in_use))
        } else {
            Err(format!("dbSize {size}, dbSizeInUse {in_use}"))
        }
    })
    .await
    .unwrap();
    assert!(in_use <= size, "dbSize {size}, dbSizeInUse {in_use}");
}

/// `etcdctl defrag` while a client keeps writing and a watcher follows the writes: a put sent
/// while the member reports the defragmentation in flight (`etcd_disk_defrag_inflight`) is
/// answered while it still is (etcd holds every request until its rewrite is done), none
/// fails, the watcher gets every event once and in order, every write is readable afterwards,
/// and the file shrank.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn defrag_serves_writes_and_watches_while_it_runs() {
    let (m, mut c) = start().await;
    // 16 MiB of values, three quarters deleted: the rewrite has something to copy and to drop.
    let value = vec![b'd'; 2 * 1024];
    for batch in 0..80 {
        let ops: Vec<_> = (0..100)
            .map(|i| {
                etcd_client::TxnOp::put(format!("bulk/{batch:03}/{i:03}"), value.clone(), None)
            })
            .collect();
        c.txn(etcd_client::Txn::new().and_then(ops)).await.unwrap();
    }
    for batch in 0..60 {
        c.delete(
            format!("bulk/{batch:03}/"),
            Some(DeleteOptions::new().with_prefix()),
        )
        .await
        .unwrap();
    }
    let rev = revision(&mut c).await;
    c.compact(rev, Some(CompactionOptions::new().with_physical()))
        .await
        .unwrap();
    let before = db_size(&m).await;
    let mut events = c
        .watch("w/", Some(etcd_client::WatchOptions::new().with_prefix()))
        .await
        .unwrap();
    let inflight = || async {
        let scrape = m.http_get("/metrics").await.expect("GET /metrics");
        scrape
            .body
            .lines()
            .any(|l| l == "etcd_disk_defrag_inflight 1")
    };

    let mut puts = 0u32;
    let mut answered_inflight = 0;
    for _attempt in 0..10 {
        let defrag = {
            let mut c = c.clone();
            tokio::spawn(async move { c.defragment().await.map(|_| ()) })
        };
        while !defrag.is_finished() {
            let sent_inflight = inflight().await;
            c.put(format!("w/{puts:05}"), format!("{puts}"), None)
                .await
                .expect("put during defrag");
            puts += 1;
            if sent_inflight && inflight().await {
                answered_inflight += 1;
            }
        }
        defrag.await.expect("task").expect("defragment");
        if answered_inflight > 0 {
            break;
        }
    }
    assert!(
        answered_inflight > 0,
        "no put was answered while a defragmentation was in flight ({puts} puts)"
    );
    // Every event once, in order.
    let mut seen = 0u32;
    while seen < puts {
        let resp = tokio::time::timeout(Duration::from_secs(10), events.message())
            .await
            .expect("events in time")
            .expect("stream")
            .expect("open");
        assert!(!resp.canceled(), "{resp:?}");
        for event in resp.events() {
            let kv = event.kv().expect("kv");
            assert_eq!(kv.key(), format!("w/{seen:05}").as_bytes());
            seen += 1;
        }
    }
    let all = c
        .get(
            "w/",
            Some(GetOptions::new().with_prefix().with_count_only()),
        )
        .await
        .unwrap();
    assert_eq!(all.count(), i64::from(puts));
    let after = db_size(&m).await;
    assert!(after < before, "defrag: {before} -> {after} bytes");
}

/// Puts `keys` values of `value_len` bytes under `prefix`, 100 to a txn; the last revision.
async fn put_round(
    c: &mut etcd_client::Client,
    prefix: &str,
    keys: usize,
    value_len: usize,
) -> i64 {
    let value = vec![b'r'; value_len];
    let mut rev = 0;
    for first in (0..keys).step_by(100) {
        let ops: Vec<_> = (first..keys.min(first + 100))
            .map(|i| etcd_client::TxnOp::put(format!("{prefix}{i:05}"), value.clone(), None))
            .collect();
        let resp = c
            .txn(etcd_client::Txn::new().and_then(ops))
            .await
            .expect("txn");
        rev = resp.header().expect("a header").revision();
    }
    rev
}

/// The pages a physical compaction frees are written again without a defrag: once a round of
/// values is overwritten and compacted away, the next rounds of the same size go into the
/// freed pages and the file stops growing (bbolt reuses its freed pages too). Two rounds, each
/// compacted in turn, bring the file to the size it keeps; the four measured after them may
/// grow it by at most one round, as the storage engine extends its file in steps of one or two
/// megabytes. A store that only appended would grow by the four rounds, 16 MB here.
#[tokio::test]
async fn pages_a_compaction_frees_are_written_again() {
    const KEYS: usize = 4000;
    const VALUE: usize = 1024;
    const ROUNDS: usize = 4;
    let (m, mut c) = start().await;
    put_round(&mut c, "space/", KEYS, VALUE).await;
    for _ in 0..2 {
        round_and_compact(&mut c, KEYS, VALUE).await;
    }
    let before = db_size(&m).await;
    for _ in 0..ROUNDS {
        round_and_compact(&mut c, KEYS, VALUE).await;
    }
    let after = db_size(&m).await;
    assert!(
        after <= before + (KEYS * VALUE) as u64,
        "{ROUNDS} rounds of {} bytes grew the file from {before} to {after} bytes",
        KEYS * VALUE
    );
    // The rounds before the measure did grow it: the measure can see a round's bytes.
    assert!(before >= (2 * KEYS * VALUE) as u64, "dbSize {before}");
    let all = c
        .get(
            "space/",
            Some(GetOptions::new().with_prefix().with_count_only()),
        )
        .await
        .unwrap();
    assert_eq!(all.count(), KEYS as i64);
}

/// Overwrites every key of `space/` with `put_round`, then compacts physically at its revision.
async fn round_and_compact(c: &mut etcd_client::Client, keys: usize, value_len: usize) {
    let rev = put_round(c, "space/", keys, value_len).await;
    c.compact(rev, Some(CompactionOptions::new().with_physical()))
        .await
        .expect("compact");
}

/// etcd answers Defragment and MoveLeader with an empty message, no header (client libraries'
/// tests check it); Status and Hash carry one.
#[tokio::test]
async fn defragment_and_move_leader_answer_without_a_header() {
    let (_m, mut c) = start().await;
    let defrag = c.defragment().await.expect("defragment");
    assert!(defrag.header().is_none(), "{defrag:?}");
    let status = c.status().await.expect("status");
    let me = status.header().expect("status has a header").member_id();
    // A single member moving its leadership to itself: done at once, as in etcd.
    let moved = c.move_leader(me).await.expect("move leader");
    assert!(moved.header().is_none(), "{moved:?}");
    assert!(c.hash().await.expect("hash").header().is_some());
}

/// `etcdctl alarm list|disarm` after NOSPACE (the alarm's effects on requests are covered by
/// `errors::quota_exceeded_raises_nospace`).
#[tokio::test]
async fn alarm_disarm_with_etcdctl_round_trip() {
    let (m, mut c) = start_with(&["--quota-backend-bytes", "262144"]).await;
    let member_id = c.status().await.unwrap().header().unwrap().member_id();
    assert_eq!(ctl(&m).ok(&["alarm", "list"]).await, "");
    let value = vec![b'q'; 16 * 1024];
    let mut written = 0;
    while c
        .put(format!("big/{written:04}"), value.clone(), None)
        .await
        .is_ok()
    {
        written += 1;
        assert!(written < 500, "quota never hit");
    }
    let alarm_line = format!("memberID:{member_id} alarm:NOSPACE \n");
    assert_eq!(ctl(&m).ok(&["alarm", "list"]).await, alarm_line);
    // `endpoint status` reports the alarm among its errors.
    let out = ctl(&m).ok(&["endpoint", "status", "-w", "json"]).await;
    let json: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(
        json[0]["Status"]["errors"][0].as_str(),
        Some(alarm_line.trim_end_matches('\n'))
    );

    // Make room, then disarm: etcdctl prints the alarms it disarmed.
    let rev = c
        .delete("big/", Some(DeleteOptions::new().with_prefix()))
        .await
        .unwrap()
        .header()
        .unwrap()
        .revision();
    c.compact(rev, Some(CompactionOptions::new().with_physical()))
        .await
        .unwrap();
    ctl(&m).ok(&["defrag"]).await;
    assert_eq!(ctl(&m).ok(&["alarm", "disarm"]).await, alarm_line);
    assert_eq!(ctl(&m).ok(&["alarm", "list"]).await, "");
    // Disarming with nothing raised prints nothing.
    assert_eq!(ctl(&m).ok(&["alarm", "disarm"]).await, "");
    c.put("after", "ok", None).await.unwrap();
    poll_until(Duration::from_secs(5), || async {
        let h = m.http_get("/health").await?;
        anyhow::ensure!(h.status == 200, "health {} {}", h.status, h.body);
        anyhow::Ok(())
    })
    .await
    .unwrap();
}
