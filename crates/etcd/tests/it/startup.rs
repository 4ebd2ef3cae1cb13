//! Startup: flags, log milestones, default member name, `--version`, SIGTERM and restart.

use std::time::Duration;

use etcdrs_testkit::{Member, poll_until};

use crate::{bin, opts};

#[tokio::test]
async fn default_name_and_log_milestones() {
    // Only data dir and URL/port flags: no --name.
    let m = Member::start(opts().without_name())
        .await
        .expect("member starts");
    poll_until(Duration::from_secs(10), || async {
        for milestone in [
            "ready to serve client requests",
            "enabled capabilities for version",
        ] {
            if !m.log_contains(milestone) {
                return Err(format!("log lacks {milestone:?}"));
            }
        }
        Ok(())
    })
    .await
    .unwrap_or_else(|e| panic!("{e}\n{}", m.log_tail(30)));

    let mut c = m.client().await.unwrap();
    let list = c.member_list().await.unwrap();
    let members = list.members();
    assert_eq!(members.len(), 1);
    assert_eq!(members[0].name(), "default");
    assert_eq!(members[0].peer_urls(), [m.peer_url()]);
    assert_eq!(members[0].client_urls(), [m.endpoint()]);
    assert!(!members[0].is_learner());
    let out = m.etcdctl().ok(&["member", "list"]).await;
    assert_eq!(
        out,
        format!(
            "{:x}, started, default, {}, {}, false\n",
            members[0].id(),
            m.peer_url(),
            m.endpoint()
        )
    );
}

#[tokio::test]
async fn version_flag() {
    let mut cmd = tokio::process::Command::from(bin().command());
    cmd.arg("--version").kill_on_drop(true);
    let out = tokio::time::timeout(Duration::from_secs(10), cmd.output())
        .await
        .expect("--version exits within 10 s")
        .expect("runs");
    assert!(out.status.success(), "{out:?}");
    let stdout = String::from_utf8(out.stdout).unwrap();
    let lines: Vec<&str> = stdout.lines().collect();
    assert_eq!(lines.len(), 4, "{stdout}");
    let prefixes = [
        "etcd Version: ",
        "Git SHA: ",
        "Go Version: ",
        "Go OS/Arch: ",
    ];
    for (line, prefix) in lines.iter().zip(prefixes) {
        assert!(
            line.starts_with(prefix),
            "{line:?} should start with {prefix:?}"
        );
    }
    let version = &lines[0]["etcd Version: ".len()..];
    let parts: Vec<&str> = version.split('.').collect();
    assert!(
        parts.len() == 3 && parts[0] == "3" && parts.iter().all(|p| p.parse::<u32>().is_ok()),
        "{version}"
    );
    assert!(
        lines[3]["Go OS/Arch: ".len()..].contains('/'),
        "{}",
        lines[3]
    );
}

#[tokio::test]
async fn sigterm_then_restart_keeps_data_and_identity() {
    let mut m = Member::start(opts()).await.expect("member starts");
    let mut c = m.client().await.unwrap();
    c.put("persist", "me", None).await.unwrap();
    let before = c.status().await.unwrap();
    let member_id = before.header().unwrap().member_id();
    let cluster_id = before.header().unwrap().cluster_id();
    drop(c);

    let status = m
        .stop()
        .await
        .expect("stops on SIGTERM")
        .expect("was running");
    // etcd re-raises SIGTERM after cleanup, so it dies *by the signal* (no exit code).
    {
        use std::os::unix::process::ExitStatusExt;
        assert_eq!(status.signal(), Some(15), "{status:?}");
    }
    assert!(!m.is_running());

    m.restart().await.expect("restarts");
    let mut c = m.client().await.unwrap();
    let r = c.get("persist", None).await.unwrap();
    assert_eq!(crate::pairs(r.kvs()), [("persist".into(), "me".into())]);
    let h = r.header().unwrap();
    assert_eq!(
        (h.member_id(), h.cluster_id(), h.revision()),
        (member_id, cluster_id, 2)
    );
    // The term moves on: the restarted member held a new election.
    assert!(c.status().await.unwrap().raft_term() > before.raft_term());
    assert_eq!(m.starts(), 2);
    assert!(m.current_log().contains("ready to serve client requests"));
}
