//! Our binary under the name `etcdutl` (a symlink): etcd's offline tool's commands, flags and
//! output. The reference is etcd 3.4's tools: `etcdctl snapshot status` prints what
//! `etcdutl snapshot status` of etcd 3.5 prints (the same columns and texts, compared by hand
//! with etcdutl 3.5.1), `etcdctl endpoint hashkv` of a member is what `etcdutl hashkv` of its
//! snapshot must say, and etcd 3.4 itself starts on a data directory `etcdutl defrag`
//! rewrote. The error texts and exit codes asserted here are etcdutl 3.5.1's.
//!
//! These tests always run both servers, ours and `/usr/bin/etcd` (3.4), so they are skipped
//! when the suite itself runs against etcd (`ETCDRS_TEST_ETCD_BIN`).

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use etcd_client::{LeaseGrantOptions, PutOptions};
use etcdrs_testkit::{EtcdBin, Etcdctl, Member, MemberOpts};
use serde_json::Value;

use crate::ours;

/// Our binary linked as `<dir>/etcdutl`.
fn etcdutl_in(dir: &Path) -> PathBuf {
    let link = dir.join("etcdutl");
    std::os::unix::fs::symlink(env!("CARGO_BIN_EXE_etcd"), &link).expect("link etcdutl");
    link
}

fn run(etcdutl: &Path, args: &[&str]) -> Output {
    Command::new(etcdutl)
        .args(args)
        .output()
        .expect("run etcdutl")
}

fn stdout_ok(out: &Output) -> String {
    assert!(out.status.success(), "{out:?}");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Overwrites, deletions before and after a compaction, and a leased key.
async fn write_history(m: &Member) {
    let mut c = m.client().await.expect("client");
    for i in 1..=12 {
        c.put(format!("k{}", i % 4), format!("v{i}"), None)
            .await
            .expect("writing the history");
    }
    c.delete("k1", None).await.expect("writing the history");
    c.lease_grant(600, Some(LeaseGrantOptions::new().with_id(0x77)))
        .await
        .expect("writing the history");
    c.put("leased", "l", Some(PutOptions::new().with_lease(0x77)))
        .await
        .expect("writing the history");
    c.compact(10, None).await.expect("writing the history");
    c.delete("k2", None).await.expect("writing the history");
    c.put("k5", "after", None)
        .await
        .expect("writing the history");
}

/// `etcdctl endpoint hashkv --rev` of `m`: (hash, hash revision, compact revision).
async fn member_hashkv(m: &Member, rev: i64) -> (u64, i64, i64) {
    let rev_flag = format!("--rev={rev}");
    let json: Value = serde_json::from_str(
        &m.etcdctl()
            .ok(&["endpoint", "hashkv", &rev_flag, "-w", "json"])
            .await,
    )
    .expect("hashkv json");
    let h = &json[0]["HashKV"];
    let header_rev = h["header"]["revision"].as_i64().expect("revision");
    (
        h["hash"].as_u64().expect("hash"),
        if rev == 0 { header_rev } else { rev },
        h["compact_revision"].as_i64().expect("compact revision"),
    )
}

/// `etcdutl hashkv` of `file`, in its JSON form.
fn file_hashkv(etcdutl: &Path, file: &Path, rev: i64) -> (u64, i64, i64) {
    let rev_flag = format!("--rev={rev}");
    let file = file.display().to_string();
    let out = stdout_ok(&run(etcdutl, &["hashkv", &file, &rev_flag, "-w", "json"]));
    let json: Value = serde_json::from_str(&out).expect("etcdutl hashkv json");
    (
        json["hash"].as_u64().expect("hash"),
        json["hashRevision"].as_i64().expect("hash revision"),
        json["compactRevision"].as_i64().expect("compact revision"),
    )
}

async fn save(m: &Member, file: &Path) {
    let arg = file.display().to_string();
    m.etcdctl().ok(&["snapshot", "save", &arg]).await;
}

fn etcd34() -> EtcdBin {
    EtcdBin::at("/usr/bin/etcd")
}

fn our_bin() -> EtcdBin {
    EtcdBin::at(env!("CARGO_BIN_EXE_etcd"))
}

/// `hashkv <file>` says what `endpoint hashkv` of the member said when the file was saved, at
/// the last revision and at older ones, for a snapshot of ours and of etcd 3.4, and for a
/// stopped member's own backend file (ours and etcd's); `snapshot status` prints what etcdctl
/// 3.4 prints, in every format; `version` and the argument errors are etcdutl's.
#[tokio::test]
async fn etcdutl_hashkv_status_and_version() {
    if !ours() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let etcdutl = etcdutl_in(dir.path());
    for (name, bin) in [("ours", our_bin()), ("etcd", etcd34())] {
        let mut m = Member::start(MemberOpts::new(&bin)).await.unwrap();
        write_history(&m).await;
        let file = dir.path().join(format!("{name}.db"));
        save(&m, &file).await;
        for rev in [0, 11, 13, 14] {
            let expected = member_hashkv(&m, rev).await;
            assert_eq!(
                file_hashkv(&etcdutl, &file, rev),
                expected,
                "{name} rev {rev}"
            );
        }
        let (hash, rev, compact) = member_hashkv(&m, 0).await;
        let file_arg = file.display().to_string();
        assert_eq!(
            stdout_ok(&run(&etcdutl, &["hashkv", &file_arg])),
            format!("{hash}, {rev}, {compact}\n")
        );
        assert_eq!(
            stdout_ok(&run(&etcdutl, &["hashkv", &file_arg, "-w", "fields"])),
            format!(
                "\"Hash\" : {hash}\n\"Hash revision\" : {rev}\n\"Compact revision\" : {compact}\n"
            )
        );
        let compacted = run(&etcdutl, &["hashkv", &file_arg, "--rev=3"]);
        assert_eq!(compacted.status.code(), Some(1));
        assert_eq!(
            String::from_utf8_lossy(&compacted.stderr),
            "Error: mvcc: required revision has been compacted\n"
        );

        for format in ["simple", "table", "json", "fields"] {
            let theirs = Command::new(Etcdctl::new("").bin())
                .env("ETCDCTL_API", "3")
                .args(["snapshot", "status", &file_arg, "-w", format])
                .output()
                .expect("etcdctl snapshot status");
            let mine = run(&etcdutl, &["snapshot", "status", &file_arg, "-w", format]);
            assert_eq!(stdout_ok(&mine), stdout_ok(&theirs), "{name} -w {format}");
        }

        // A stopped member's own backend file hashes as the member did.
        m.stop().await.unwrap();
        let db = backend_file(m.data_dir());
        assert_eq!(
            file_hashkv(&etcdutl, &db, 0),
            (hash, rev, compact),
            "{name} db"
        );
    }

    assert_eq!(
        stdout_ok(&run(&etcdutl, &["version"])),
        "etcdutl version: 3.5.17\nAPI version: 3.5\n"
    );
    for (args, code, stderr) in [
        (
            &["snapshot", "status"][..],
            128,
            "Error: snapshot status requires exactly one argument\n",
        ),
        (
            &["snapshot", "status", "x.db", "-w", "protobuf"],
            4,
            "Error: protobuf not supported as output format\n",
        ),
        (
            &["-w", "yaml", "snapshot", "status", "x.db"],
            4,
            "Error: unsupported output format\n",
        ),
        (
            &["snapshot", "status", "/nonexistent/x.db"],
            1,
            "Error: stat /nonexistent/x.db: no such file or directory\n",
        ),
        (
            &["nope"],
            1,
            "Error: unknown command \"nope\" for \"etcdutl\"\nRun 'etcdutl --help' for usage.\nError: unknown command \"nope\" for \"etcdutl\"\n",
        ),
    ] {
        let out = run(&etcdutl, args);
        assert_eq!(out.status.code(), Some(code), "{args:?}");
        assert_eq!(String::from_utf8_lossy(&out.stderr), stderr, "{args:?}");
        assert!(out.stdout.is_empty(), "{args:?}");
    }
    let out = run(&etcdutl, &["defrag"]);
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.starts_with(
            "Error: required flag(s) \"data-dir\" not set\nUsage:\n  etcdutl defrag [flags]\n\nFlags:\n      --data-dir string   Required. Defragments a data directory not in use by etcd.\n"
        ),
        "{stderr}"
    );
}

/// The backend file of a stopped member's data dir: etcd's `member/snap/db`, or ours under
/// `etcd-rs/` once converted (not here: these members started fresh).
fn backend_file(data_dir: &Path) -> PathBuf {
    data_dir.join("member").join("snap").join("db")
}

/// `snapshot restore` into an empty directory that exists (etcdutl's rule; a directory with
/// anything in it is refused with etcdutl's text), the member started on it hashing as the
/// source; `defrag --data-dir` of a stopped member, ours and etcd 3.4's, after which each
/// starts again with the same `endpoint hashkv` and a smaller or equal file.
#[tokio::test]
async fn etcdutl_restore_and_defrag() {
    if !ours() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let etcdutl = etcdutl_in(dir.path());
    for (name, bin) in [("ours", our_bin()), ("etcd", etcd34())] {
        let mut m = Member::start(MemberOpts::new(&bin)).await.unwrap();
        write_history(&m).await;
        // Space to reclaim: a large value, deleted and compacted away.
        let mut c = m.client().await.unwrap();
        for i in 0..20 {
            c.put(format!("big{i}"), "x".repeat(50_000), None)
                .await
                .unwrap();
        }
        let last = c
            .delete("big", Some(etcd_client::DeleteOptions::new().with_prefix()))
            .await
            .unwrap();
        let rev = last.header().unwrap().revision();
        c.compact(rev, None).await.unwrap();
        let expected = member_hashkv(&m, 0).await;
        let file = dir.path().join(format!("{name}.db"));
        save(&m, &file).await;
        m.stop().await.unwrap();

        let db = backend_file(m.data_dir());
        let before = std::fs::metadata(&db).unwrap().len();
        let data_dir = m.data_dir().display().to_string();
        let out = run(&etcdutl, &["defrag", "--data-dir", &data_dir]);
        assert_eq!(stdout_ok(&out), "", "{name}");
        let after = std::fs::metadata(&db).unwrap().len();
        assert!(after <= before, "{name}: {before} -> {after} bytes");
        m.restart().await.unwrap();
        assert_eq!(member_hashkv(&m, 0).await, expected, "{name} after defrag");
        m.stop().await.unwrap();

        // Restored by etcdutl into an empty directory, started by our binary.
        let mut target = Member::start(MemberOpts::new(&our_bin())).await.unwrap();
        target.stop().await.unwrap();
        std::fs::remove_dir_all(target.data_dir()).unwrap();
        std::fs::create_dir(target.data_dir()).unwrap();
        let file_arg = file.display().to_string();
        let target_dir = target.data_dir().display().to_string();
        let cluster = format!("{}={}", target.name(), target.peer_url());
        let peer_url = target.peer_url();
        let restore = [
            "snapshot",
            "restore",
            &file_arg,
            "--data-dir",
            &target_dir,
            "--name",
            target.name(),
            "--initial-cluster",
            &cluster,
            "--initial-advertise-peer-urls",
            &peer_url,
        ];
        assert_eq!(stdout_ok(&run(&etcdutl, &restore)), "", "{name}");
        let again = run(&etcdutl, &restore);
        assert_eq!(again.status.code(), Some(1));
        assert_eq!(
            String::from_utf8_lossy(&again.stderr)
                .lines()
                .last()
                .unwrap_or_default(),
            format!("Error: data-dir {target_dir:?} not empty or could not be read")
        );
        target.restart().await.unwrap();
        assert_eq!(member_hashkv(&target, 0).await, expected, "{name} restored");
    }
}
