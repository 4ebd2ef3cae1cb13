//! Disk faults on real filesystems (issue 20): a member whose WAL filesystem or backend
//! filesystem fills up stops with the error that names the file, as etcd does (no retry
//! behind a failed write, fsync or commit), loses no acknowledged write, and starts again
//! once there is room, with every acknowledged write and nothing half-written.
//!
//! A slow disk rather than a failing one (issue 41) is `disk::stall`.
//!
//! Damage on a stopped member's disk (a flipped bit in a WAL record or in a backend page) makes
//! it refuse to start with an error that names the file.
//!
//! The full filesystems are tmpfs mounts of a few MiB, grown (remounted, contents kept) to
//! make room; mounting needs root, as CI has. Ours only: etcd 3.4 preallocates 64 MiB
//! WAL segments, so the same sizes test something else there.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use etcd_client::GetOptions;
use etcdrs_testkit::Member;

use crate::{opts, ours, pairs};

mod stall;

const WAIT: Duration = Duration::from_secs(20);
/// Values big enough to fill a few MiB in a few dozen puts.
const VALUE_BYTES: usize = 60 * 1024;
/// Puts tried before the test gives up on filling the filesystem.
const MAX_PUTS: usize = 400;

/// A tmpfs of `size` MiB mounted on a fresh directory, unmounted when dropped.
struct Tmpfs {
    _dir: tempfile::TempDir,
    path: PathBuf,
}

impl Tmpfs {
    fn mount(size_mib: u64) -> Tmpfs {
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join("fs");
        std::fs::create_dir(&path).expect("mount point");
        let status = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size_mib}m"), "tmpfs"])
            .arg(&path)
            .status()
            .expect("run mount");
        assert!(status.success(), "mounting a tmpfs needs root: {status}");
        Tmpfs { _dir: dir, path }
    }

    fn path(&self) -> &Path {
        &self.path
    }

    /// Grows the filesystem to `size` MiB, keeping what it holds.
    fn grow(&self, size_mib: u64) {
        let status = Command::new("mount")
            .args(["-o", &format!("remount,size={size_mib}m")])
            .arg(&self.path)
            .status()
            .expect("run mount");
        assert!(status.success(), "remount: {status}");
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.path).status();
    }
}

/// Fills the member's filesystem with puts until one fails; then the member must stop by
/// itself naming the full device, and after `make_room` start again with every
/// acknowledged put.
async fn fill_stop_and_recover(mut member: Member, make_room: impl FnOnce()) {
    let mut client = member.client().await.expect("client");
    let mut acked = Vec::new();
    let mut refused = None;
    for i in 0..MAX_PUTS {
        let (key, value) = (
            format!("fill/{i:04}"),
            format!("{i:04}").repeat(VALUE_BYTES / 4),
        );
        match client.put(key.clone(), value.clone(), None).await {
            Ok(_) => acked.push((key, value)),
            Err(e) => {
                refused = Some(e.to_string());
                break;
            }
        }
    }
    let refused = refused.expect("the filesystem filled up");
    let status = member
        .wait_exit(WAIT)
        .await
        .expect("the member stops by itself");
    let log = member.log();
    assert!(!status.success(), "exit status {status}; log:\n{log}");
    assert!(
        log.contains("No space left on device"),
        "the log names the full device; the put got {refused:?}:\n{}",
        member.log_tail(15)
    );
    assert!(acked.len() > 10, "only {} puts acknowledged", acked.len());

    make_room();
    member.restart().await.expect("the member starts again");
    let mut client = member.client().await.expect("client");
    let keys = client
        .get(
            "fill/",
            Some(GetOptions::new().with_prefix().with_keys_only()),
        )
        .await
        .expect("list");
    let keys: Vec<String> = pairs(keys.kvs()).into_iter().map(|(k, _)| k).collect();
    // Every acknowledged put, and at most the one in flight when the disk filled.
    assert!(
        keys.len() == acked.len() || keys.len() == acked.len() + 1,
        "{} stored, {} acknowledged",
        keys.len(),
        acked.len()
    );
    for (key, value) in &acked {
        let got = client.get(key.as_str(), None).await.expect("read");
        assert_eq!(
            pairs(got.kvs()),
            vec![(key.clone(), value.clone())],
            "acknowledged {key}"
        );
    }
    client
        .put("after", "room", None)
        .await
        .expect("writes again");
}

#[tokio::test]
async fn a_full_wal_filesystem_stops_the_member_and_loses_no_acknowledged_write() {
    if !ours() {
        return;
    }
    let fs = Tmpfs::mount(5);
    let wal = fs.path().join("wal");
    let member = Member::start(opts().arg(format!("--wal-dir={}", wal.display())))
        .await
        .expect("member starts");
    fill_stop_and_recover(member, || fs.grow(64)).await;
}

#[tokio::test]
async fn a_full_backend_filesystem_stops_the_member_and_loses_no_acknowledged_write() {
    if !ours() {
        return;
    }
    // The WAL is elsewhere: the backend's file is what fills the tmpfs.
    let fs = Tmpfs::mount(7);
    let data = fs.path().join("data");
    let wal_dir = tempfile::tempdir().expect("wal dir");
    let member = Member::start(opts().setting("data-dir", data.display().to_string()).arg(
        format!("--wal-dir={}", wal_dir.path().join("wal").display()),
    ))
    .await
    .expect("member starts");
    fill_stop_and_recover(member, || fs.grow(64)).await;
}

/// A shared library that makes every `fsync` and `fdatasync` of the process it is preloaded
/// into fail with EIO once `$ETCDRS_FAULT_TRIGGER` names a file that exists: a disk whose
/// flushes start failing, at the syscall boundary of the real binary. Built with the
/// machine's C compiler.
fn fsync_fault_library(dir: &Path) -> PathBuf {
    let source = dir.join("fsync_fault.c");
    let library = dir.join("fsync_fault.so");
    std::fs::write(
        &source,
        r#"#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <stdlib.h>
#include <unistd.h>

static int failing(void) {
    const char *trigger = getenv("ETCDRS_FAULT_TRIGGER");
    return trigger != NULL && access(trigger, F_OK) == 0;
}

int fdatasync(int fd) {
    static int (*real)(int);
    if (failing()) { errno = EIO; return -1; }
    if (real == NULL) real = (int (*)(int))dlsym(RTLD_NEXT, "fdatasync");
    return real(fd);
}

int fsync(int fd) {
    static int (*real)(int);
    if (failing()) { errno = EIO; return -1; }
    if (real == NULL) real = (int (*)(int))dlsym(RTLD_NEXT, "fsync");
    return real(fd);
}
"#,
    )
    .expect("write the library's source");
    let status = Command::new("gcc")
        .args(["-shared", "-fPIC", "-O2", "-o"])
        .arg(&library)
        .arg(&source)
        .arg("-ldl")
        .status()
        .expect("run gcc");
    assert!(status.success(), "gcc: {status}");
    library
}

#[tokio::test]
async fn a_failing_fsync_stops_the_member_without_retrying_and_loses_no_acknowledged_write() {
    if !ours() {
        return;
    }
    let dir = tempfile::tempdir().expect("temp dir");
    let library = fsync_fault_library(dir.path());
    let trigger = dir.path().join("fail-fsync-now");
    let mut member = Member::start(
        opts()
            .env("LD_PRELOAD", library.display().to_string())
            .env("ETCDRS_FAULT_TRIGGER", trigger.display().to_string()),
    )
    .await
    .expect("member starts");
    let mut client = member.client().await.expect("client");
    let mut acked = Vec::new();
    for i in 0..20 {
        let key = format!("sync/{i:02}");
        client.put(key.clone(), "v", None).await.expect("put");
        acked.push(key);
    }
    std::fs::write(&trigger, b"").expect("trigger");
    let refused = client.put("sync/never", "v", None).await;
    assert!(
        refused.is_err(),
        "a put whose fsync failed was acknowledged"
    );
    let status = member
        .wait_exit(WAIT)
        .await
        .expect("the member stops by itself");
    assert!(!status.success(), "exit status {status}");
    let log = member.log();
    assert!(
        log.contains("Input/output error") && log.contains(".wal"),
        "the log names the failed fsync and its file:\n{}",
        member.log_tail(15)
    );

    // Flushes work again: every acknowledged put is there.
    std::fs::remove_file(&trigger).expect("remove trigger");
    member.restart().await.expect("the member starts again");
    let mut client = member.client().await.expect("client");
    let got = client
        .get(
            "sync/",
            Some(GetOptions::new().with_prefix().with_keys_only()),
        )
        .await
        .expect("read");
    let keys: Vec<String> = pairs(got.kvs()).into_iter().map(|(k, _)| k).collect();
    for key in &acked {
        assert!(
            keys.contains(key),
            "acknowledged {key} is missing: {keys:?}"
        );
    }
}

/// The WAL segments of a member's data dir, in name order.
fn wal_segments(data_dir: &Path) -> Vec<PathBuf> {
    let mut segments: Vec<PathBuf> = std::fs::read_dir(data_dir.join("member/wal"))
        .expect("wal dir")
        .map(|e| e.expect("entry").path())
        .filter(|p| p.extension().is_some_and(|x| x == "wal"))
        .collect();
    segments.sort();
    segments
}

/// A member started with `opts()`, given `count` puts of `<prefix>/NN` = `value`, and stopped
/// cleanly: the data dir a fault is then applied to.
async fn stopped_after_puts(prefix: &str, count: usize, value: impl Into<Vec<u8>>) -> Member {
    let mut member = Member::start(opts()).await.expect("member starts");
    let mut client = member.client().await.expect("client");
    let value: Vec<u8> = value.into();
    for i in 0..count {
        client
            .put(format!("{prefix}/{i:02}"), value.clone(), None)
            .await
            .expect("put");
    }
    member.stop().await.expect("stop");
    member
}

/// Restarts `member`, which must refuse: it exits by itself, non-zero. Returns its log.
async fn refused_restart(member: &mut Member, what: &str) -> String {
    let failed = member.restart().await;
    assert!(failed.is_err(), "{what}: the member started");
    let status = member
        .wait_exit(WAIT)
        .await
        .expect("the member exits by itself");
    assert!(!status.success(), "{what}: exit status {status}");
    member.current_log()
}

/// How many keys under `prefix` the (running) member serves.
async fn served_under(member: &Member, prefix: &str) -> usize {
    let mut client = member.client().await.expect("client");
    client
        .get(prefix, Some(GetOptions::new().with_prefix()))
        .await
        .expect("read")
        .kvs()
        .len()
}

#[tokio::test]
async fn a_bit_flip_in_a_wal_record_refuses_to_start_naming_the_file_and_offset() {
    if !ours() {
        return;
    }
    let member = stopped_after_puts("flip", 50, "x".repeat(100)).await;
    let segment = wal_segments(member.data_dir())
        .pop()
        .expect("a WAL segment");
    let mut bytes = std::fs::read(&segment).expect("read segment");
    // Inside the records, well before the tail: damage, not a torn write. The zeros after
    // the last record are preallocated room, not records.
    let used = bytes
        .iter()
        .rposition(|b| *b != 0)
        .map_or(0, |last| last + 1);
    let at = used / 2;
    bytes[at] ^= 0x40;
    std::fs::write(&segment, &bytes).expect("write segment");

    let mut member = member;
    let log = refused_restart(&mut member, "a damaged WAL").await;
    let name = segment
        .file_name()
        .and_then(|n| n.to_str())
        .expect("segment name");
    assert!(
        log.contains(name) && log.contains("offset"),
        "the refusal names {name} and the offset:\n{}",
        member.log_tail(10)
    );
}

/// Flips one bit in every copy of `needle` in the file at `path`; returns how many.
fn flip_every(path: &Path, needle: &[u8]) -> usize {
    let mut bytes = std::fs::read(path).expect("read the file");
    let mut flipped = 0;
    let mut at = 0;
    while let Some(found) = bytes[at..]
        .windows(needle.len())
        .position(|window| window == needle)
    {
        bytes[at + found + needle.len() / 2] ^= 0x10;
        flipped += 1;
        at += found + needle.len();
    }
    std::fs::write(path, bytes).expect("write the file");
    flipped
}

#[tokio::test]
async fn a_bit_flip_in_the_backend_refuses_to_start_naming_the_file_and_a_clean_copy_starts() {
    // The backend file's pages carry checksums that redb checks on open (the member opens
    // with redb's integrity check): a member whose `db` was damaged while it was stopped
    // refuses to start rather than serve what the damaged page now says.
    if !ours() {
        return;
    }
    let value = "a value the test finds in the backend file";
    let mut member = stopped_after_puts("dbflip", 50, value).await;
    let db = member.data_dir().join("member/snap/db");
    let clean = member.data_dir().join("db.clean");
    std::fs::copy(&db, &clean).expect("copy the backend file");
    assert!(
        flip_every(&db, value.as_bytes()) > 0,
        "the values are in the file"
    );

    let log = refused_restart(&mut member, "a damaged backend").await;
    let refusal = format!(
        "database file `{}` is damaged: failed the integrity check",
        db.display()
    );
    assert!(
        log.contains(&refusal),
        "the refusal names the file ({refusal}):\n{}",
        member.log_tail(10)
    );

    // The copy taken before the damage starts, with every put.
    std::fs::rename(&clean, &db).expect("put the clean copy back");
    member.restart().await.expect("the clean copy starts");
    assert_eq!(served_under(&member, "dbflip/").await, 50);
}

#[tokio::test]
async fn a_member_whose_wal_was_removed_refuses_to_start_over_its_backend() {
    // An operator removed `member/wal` (or emptied it) and kept `member/snap/db`: starting
    // as a new member would begin a new log under data applied from the old one. The member
    // refuses, naming both paths, and starts again once the WAL is back.
    if !ours() {
        return;
    }
    let mut member = stopped_after_puts("nowal", 20, "x").await;
    let wal = member.data_dir().join("member/wal");
    let kept = member.data_dir().join("wal.kept");
    std::fs::rename(&wal, &kept).expect("move the WAL away");
    let db = member.data_dir().join("member/snap/db");
    for round in ["no WAL directory", "an empty WAL directory"] {
        if round == "an empty WAL directory" {
            std::fs::create_dir(&wal).expect("empty WAL directory");
        }
        let log = refused_restart(&mut member, round).await;
        assert!(
            log.contains(&format!("database file ({} index", db.display()))
                && log.contains(&format!("the WAL directory ({}) has no WAL", wal.display())),
            "{round}: the refusal names the database file and the WAL directory:\n{}",
            member.log_tail(10)
        );
    }
    std::fs::remove_dir(&wal).expect("remove the empty WAL directory");
    std::fs::rename(&kept, &wal).expect("put the WAL back");
    member.restart().await.expect("starts with its WAL back");
    assert_eq!(served_under(&member, "nowal/").await, 20);
}

#[tokio::test]
async fn a_damaged_newest_backend_commit_is_logged_and_the_wal_replays_it() {
    // redb falls back to the previous commit when only the newest one fails its checksums
    // (what a crash in the middle of a commit can leave too). That happened without a word:
    // the member started and the WAL replayed what the lost commit held. Now the backend
    // logs it, naming the file. Each put is its own durable commit here
    // (`--backend-batch-limit 1`: the backend task flushes once one write waits), the last
    // put's value is in its commit's pages alone, and the member is killed once that commit
    // is in the file (a clean stop ends with a two-phase commit, after which redb refuses
    // damage: the test above).
    if !ours() {
        return;
    }
    let mut member = Member::start(opts().args(["--backend-batch-limit", "1"]))
        .await
        .expect("member starts");
    let mut client = member.client().await.expect("client");
    let older = "a value of the commits before the newest";
    let newest = "a value only the newest backend commit holds";
    for i in 0..20 {
        client
            .put(format!("fallback/{i:02}"), older, None)
            .await
            .expect("put");
    }
    client
        .put("fallback/last", newest, None)
        .await
        .expect("put");
    let db = member.data_dir().join("member/snap/db");
    // The put is answered once applied; its durable commit follows on the backend task.
    etcdrs_testkit::poll_until(Duration::from_secs(10), || {
        let db = db.clone();
        async move {
            let bytes = std::fs::read(&db).map_err(|e| e.to_string())?;
            if bytes.windows(newest.len()).any(|w| w == newest.as_bytes()) {
                Ok(())
            } else {
                Err("the newest value is not in the file yet".to_string())
            }
        }
    })
    .await
    .expect("the last put's commit reaches the file");
    member.kill9().expect("SIGKILL");
    assert!(
        flip_every(&db, newest.as_bytes()) > 0,
        "the newest commit's value is in the file"
    );

    member
        .restart()
        .await
        .unwrap_or_else(|e| panic!("the member starts on the previous commit: {e:#}"));
    let log = member.current_log();
    assert!(
        log.contains("opened the previous commit") && log.contains(&db.display().to_string()),
        "the fall-back is logged, naming {}:\n{}",
        db.display(),
        member.log_tail(20)
    );
    let mut client = member.client().await.expect("client");
    let got = client
        .get("fallback/", Some(GetOptions::new().with_prefix()))
        .await
        .expect("read");
    let got = pairs(got.kvs());
    assert_eq!(got.len(), 21, "every acknowledged put is served: {got:?}");
    for (key, value) in &got {
        let want = if key == "fallback/last" {
            newest
        } else {
            older
        };
        assert_eq!(value, want, "{key}");
    }
}

/// Rewrites the raft configuration in `data_dir`'s backend; returns what it held.
fn rewrite_conf_state(data_dir: &Path, rewrite: impl FnOnce(&[u8]) -> Vec<u8>) -> Vec<u8> {
    let path = data_dir.join("member/snap/db");
    let backend = etcdrs_backend::Backend::open(&path).expect("open the stopped member's backend");
    let held = backend
        .read()
        .expect("read")
        .get(etcdrs_backend::Bucket::META, etcdrs_mvcc::META_CONF_STATE)
        .expect("get")
        .expect("the member stored its raft configuration");
    let tx = backend.write().expect("write");
    tx.put(
        etcdrs_backend::Bucket::META,
        etcdrs_mvcc::META_CONF_STATE,
        &rewrite(&held),
    )
    .expect("put");
    tx.commit(true).expect("commit");
    held
}

#[tokio::test]
async fn a_backend_raft_configuration_listing_a_member_twice_refuses_to_start() {
    // A damaged or hand-edited `meta` bucket whose configuration lists this member twice:
    // raft-rs would panic restoring it; the member refuses, naming the member, and starts
    // again once the configuration is put back.
    if !ours() {
        return;
    }
    let mut member = stopped_after_puts("confstate", 5, "x").await;
    // A protobuf message written twice over decodes as one with every repeated field twice.
    let held = rewrite_conf_state(member.data_dir(), |held| [held, held].concat());
    let log = refused_restart(&mut member, "a configuration listing a member twice").await;
    assert!(
        log.contains("the raft configuration in the backend is invalid: member ")
            && log.contains(" is listed twice among the voters; refusing to start")
            && !log.contains("panicked"),
        "the refusal names the member listed twice:\n{}",
        member.log_tail(10)
    );
    rewrite_conf_state(member.data_dir(), |_| held);
    member
        .restart()
        .await
        .expect("starts with its configuration back");
    assert_eq!(served_under(&member, "confstate/").await, 5);
}
