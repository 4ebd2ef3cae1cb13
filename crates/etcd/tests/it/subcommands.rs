//! The subcommands' command lines as cobra reads them: a subcommand's flags may stand before
//! its name (`etcd gateway --endpoints=... start`), as etcd's docs and operators' scripts write
//! them. Each case runs our binary and etcd 3.4's, and talks through what it started.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use etcdrs_testkit::{Etcdctl, Member, poll_until, ports};
use tokio::process::Command;

use crate::start;

const WAIT: Duration = Duration::from_secs(15);

fn binaries() -> [PathBuf; 2] {
    [
        PathBuf::from(env!("CARGO_BIN_EXE_etcd")),
        PathBuf::from("/usr/bin/etcd"),
    ]
}

/// Runs `bin <args>` in the background (killed on drop) and waits until `etcdctl` through
/// `addr` reads what `member` holds.
async fn serves_through(bin: &Path, args: &[String], addr: &str, member: &Member) {
    let mut child = Command::new(bin)
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("spawn");
    let ctl = Etcdctl::new(addr.to_owned());
    let read = poll_until(WAIT, || async {
        let got = ctl.ok(&["get", "k", "--print-value-only"]).await;
        anyhow::ensure!(got == "v\n", "read {got:?}");
        Ok(())
    })
    .await;
    if let Err(e) = read {
        let _ = child.start_kill();
        let out = child.wait_with_output().await.expect("output");
        panic!(
            "{} {args:?} in front of {}: {e:#}\n{}",
            bin.display(),
            member.endpoint(),
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

#[tokio::test]
async fn proxy_flags_before_the_start_subcommand() {
    let (member, mut client) = start().await;
    client.put("k", "v", None).await.expect("put");
    let endpoint = member.endpoint();
    let bare = endpoint.trim_start_matches("http://").to_owned();
    for bin in binaries() {
        let port = ports::reserve().expect("port");
        let addr = format!("127.0.0.1:{}", port.port());
        let args = [
            "gateway".to_owned(),
            format!("--endpoints={bare}"),
            "--listen-addr".to_owned(),
            addr.clone(),
            "start".to_owned(),
        ];
        serves_through(&bin, &args, &addr, &member).await;

        let port = ports::reserve().expect("port");
        let addr = format!("127.0.0.1:{}", port.port());
        let args = [
            "grpc-proxy".to_owned(),
            "--listen-addr".to_owned(),
            addr.clone(),
            "start".to_owned(),
            format!("--endpoints={endpoint}"),
        ];
        serves_through(&bin, &args, &addr, &member).await;
    }
}

/// `etcd snapshot --data-dir D restore FILE` (our etcdutl-style subcommand; etcd 3.4 has none).
#[tokio::test]
async fn snapshot_flags_before_the_restore_subcommand() {
    let (member, mut client) = start().await;
    client.put("k", "v", None).await.expect("put");
    let dir = tempfile::tempdir().expect("dir");
    let file = dir.path().join("snap.db");
    let file = file.to_str().expect("utf-8 path");
    member.etcdctl().ok(&["snapshot", "save", file]).await;
    let restored = dir.path().join("restored");
    let out = Command::new(env!("CARGO_BIN_EXE_etcd"))
        .arg("snapshot")
        .arg(format!("--data-dir={}", restored.display()))
        .args(["restore", file])
        .output()
        .await
        .expect("etcd snapshot runs");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(restored.join("member").is_dir(), "restored into --data-dir");
    let status = Command::new(env!("CARGO_BIN_EXE_etcd"))
        .args(["snapshot", "-w", "json", "status", file])
        .output()
        .await
        .expect("etcd snapshot runs");
    let text = String::from_utf8_lossy(&status.stdout);
    assert!(text.contains("\"revision\""), "{text}");
}
