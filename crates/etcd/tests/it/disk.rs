//! Disk faults on real filesystems (issue 20): a member whose WAL filesystem or backend
//! filesystem fills up stops with the error that names the file, as etcd does (no retry
//! behind a failed write, fsync or commit), loses no acknowledged write, and starts again
//! once there is room, with every acknowledged write and nothing half-written.
//!
//! The full filesystems are tmpfs mounts of a few MiB with a filler file that is removed
//! to make room; mounting needs root, as CI has. Ours only: etcd 3.4 preallocates 64 MiB
//! WAL segments, so the same sizes test something else there.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use etcd_client::GetOptions;
use etcdrs_testkit::Member;

use crate::{opts, ours, pairs};

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
    let fs = Tmpfs::mount(6);
    let filler = fs.path().join("filler");
    std::fs::write(&filler, vec![0u8; 1 << 20]).expect("filler");
    let wal = fs.path().join("wal");
    let member = Member::start(opts().arg(format!("--wal-dir={}", wal.display())))
        .await
        .expect("member starts");
    fill_stop_and_recover(member, || {
        std::fs::remove_file(&filler).expect("remove filler");
    })
    .await;
}

#[tokio::test]
async fn a_full_backend_filesystem_stops_the_member_and_loses_no_acknowledged_write() {
    if !ours() {
        return;
    }
    // The WAL is elsewhere: the backend's file is what fills the tmpfs.
    let fs = Tmpfs::mount(8);
    let filler = fs.path().join("filler");
    std::fs::write(&filler, vec![0u8; 1 << 20]).expect("filler");
    let data = fs.path().join("data");
    let wal_dir = tempfile::tempdir().expect("wal dir");
    let member = Member::start(opts().setting("data-dir", data.display().to_string()).arg(
        format!("--wal-dir={}", wal_dir.path().join("wal").display()),
    ))
    .await
    .expect("member starts");
    fill_stop_and_recover(member, || {
        std::fs::remove_file(&filler).expect("remove filler");
    })
    .await;
}
