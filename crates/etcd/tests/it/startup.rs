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

/// `--socket-reuse-port`: with it, another socket with SO_REUSEPORT can bind the member's
/// client and peer ports (and the member keeps serving); without it, it cannot.
#[tokio::test]
async fn socket_reuse_port_lets_another_socket_share_the_ports() {
    // etcd 3.5's flags; etcd 3.4 has neither.
    if !crate::ours() {
        return;
    }
    let try_bind = |port: u16| {
        let socket = tokio::net::TcpSocket::new_v4().expect("socket");
        socket.set_reuseport(true).expect("SO_REUSEPORT");
        let addr: std::net::SocketAddr = ([127, 0, 0, 1], port).into();
        socket.bind(addr).and_then(|()| socket.listen(16))
    };
    let (plain, _) = crate::start().await;
    assert!(try_bind(plain.client_port()).is_err());
    assert!(try_bind(plain.peer_port()).is_err());

    // SO_REUSEADDR is on whatever --socket-reuse-address says, as with Go's listeners.
    let (shared, mut client) =
        crate::start_with(&["--socket-reuse-port=true", "--socket-reuse-address=true"]).await;
    let client_twin = try_bind(shared.client_port()).expect("share the client port");
    let peer_twin = try_bind(shared.peer_port()).expect("share the peer port");
    drop((client_twin, peer_twin));
    client.put("still", "serving", None).await.unwrap();
}

/// `--logger=zap --log-outputs=<file> --log-level`: the JSON log goes to the file, and a level
/// above info leaves etcd's info milestones out.
#[tokio::test]
async fn log_outputs_and_log_level() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("member.log");
    let outputs = format!("--log-outputs={}", file.display());
    let (m, _c) = crate::start_with(&["--logger=zap", &outputs, "--log-level=info"]).await;
    // The line may follow the first answered request by a moment.
    poll_until(Duration::from_secs(10), || async {
        let written = std::fs::read_to_string(&file).unwrap_or_default();
        if written.contains("published local member to cluster") {
            Ok(())
        } else {
            Err(format!("not yet in {}", file.display()))
        }
    })
    .await
    .unwrap();
    assert!(
        !m.log().contains("published local member to cluster"),
        "{}",
        m.log()
    );

    let (quiet, _c) = crate::start_with(&["--logger=zap", "--log-level=warn"]).await;
    assert!(
        !quiet.log().contains("\"level\":\"info\""),
        "{}",
        quiet.log()
    );
}

/// `--config-file`: every setting comes from the YAML file (etcd then ignores the other
/// flags), and the member serves as the file says.
#[tokio::test]
async fn config_file_configures_the_member() {
    let dir = tempfile::tempdir().unwrap();
    let client = etcdrs_testkit::ports::reserve().unwrap();
    let peer = etcdrs_testkit::ports::reserve().unwrap();
    let client_url = format!("http://127.0.0.1:{}", client.port());
    let peer_url = format!("http://127.0.0.1:{}", peer.port());
    let yaml = format!(
        "name: from-file\ndata-dir: {}\nlisten-client-urls: {client_url}\nadvertise-client-urls: {client_url}\nlisten-peer-urls: {peer_url}\ninitial-advertise-peer-urls: {peer_url}\ninitial-cluster: from-file={peer_url}\nlogger: zap\n",
        dir.path().join("data").display()
    );
    let config = dir.path().join("etcd.yaml");
    std::fs::write(&config, yaml).unwrap();
    drop((client, peer));
    let mut child = bin()
        .command()
        .arg(format!("--config-file={}", config.display()))
        .arg("--name=ignored-because-of-the-file")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let ctl = etcdrs_testkit::Etcdctl::new(client_url.clone());
    let listed = poll_until(Duration::from_secs(20), || async {
        let out = ctl.run(&["member", "list"]).await?;
        if out.success() {
            Ok(out.stdout)
        } else {
            Err(anyhow::anyhow!("{}", out.stderr))
        }
    })
    .await;
    let _ = child.kill();
    let _ = child.wait();
    let listed = listed.unwrap();
    assert!(listed.contains(", from-file, "), "{listed}");
    assert!(listed.contains(&client_url), "{listed}");
}

/// Started with a soft open-files limit of 1,024 under a higher hard one (a common default),
/// the member raises it, as Go's runtime does for etcd: 1,100 idle client connections do not
/// lock the next client out.
#[tokio::test]
async fn many_idle_connections_do_not_exhaust_a_low_soft_open_files_limit() {
    let dir = tempfile::tempdir().unwrap();
    let hard = std::process::Command::new("sh")
        .args(["-c", "ulimit -H -n"])
        .output()
        .unwrap();
    let hard: u64 = String::from_utf8_lossy(&hard.stdout)
        .trim()
        .parse()
        .unwrap_or(0);
    if hard < 4096 {
        // Nothing to raise to here; the hard limit is the limit.
        return;
    }
    let m = start_under_ulimit(dir.path(), "-S -n 1024").await;
    let mut idle = Vec::new();
    for _ in 0..1100 {
        idle.push(
            tokio::net::TcpStream::connect(m.client_addr())
                .await
                .unwrap(),
        );
    }
    let ctl = m.etcdctl().with_arg("--command-timeout=5s");
    assert_eq!(ctl.ok(&["put", "after", "many-connections"]).await, "OK\n");
    drop(idle);
}

/// With a hard open-files limit of 1,024 (nothing to raise to), a flood of idle connections
/// takes at most the limit less a reserve: the member's own files keep their descriptors, so
/// a client that was connected before the flood still writes and can still take a snapshot
/// (a temporary file). etcd 3.4 has no such reserve: ours only.
#[tokio::test]
async fn a_connection_flood_leaves_the_member_its_own_descriptors() {
    if !crate::ours() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let m = start_under_ulimit(dir.path(), "-n 1024").await;
    let mut before = m.client().await.unwrap();
    // Its connection is open before the flood.
    before.put("before", "flood", None).await.unwrap();
    let mut flood = Vec::new();
    for _ in 0..1100 {
        if let Ok(conn) = tokio::net::TcpStream::connect(m.client_addr()).await {
            flood.push(conn);
        }
    }
    before.put("during", "flood", None).await.unwrap();
    // 2,000 more connections past the cap: each is accepted and closed at once, and the
    // member's memory stays where the cap left it.
    let pid = m.pid().expect("running");
    let at_cap = etcdrs_testkit::memory::rss_bytes(pid).expect("rss");
    for _ in 0..2000 {
        if let Ok(conn) = tokio::net::TcpStream::connect(m.client_addr()).await {
            drop(conn);
        }
    }
    before.put("after", "flood", None).await.unwrap();
    etcdrs_testkit::memory::assert_rss_flat(pid, at_cap, 8 << 20, "2,000 connections past the cap");
    let mut stream = before.snapshot().await.unwrap();
    let mut bytes = 0;
    while let Some(chunk) = stream.message().await.unwrap() {
        bytes += chunk.blob().len();
    }
    assert!(bytes > 0);
    assert!(
        m.log()
            .contains("too many open connections; closing a new one"),
        "{}",
        m.log_tail(20)
    );
    drop(flood);
}

/// A member of the server under test started through a wrapper script in `dir` that runs
/// `ulimit <limit>` and then execs the server.
async fn start_under_ulimit(dir: &std::path::Path, limit: &str) -> Member {
    let wrapper = dir.join("ulimit-wrapper");
    std::fs::write(
        &wrapper,
        format!(
            "#!/bin/sh\nulimit {limit}\nexec {} \"$@\"\n",
            bin().path().display()
        ),
    )
    .expect("write the wrapper");
    std::fs::set_permissions(
        &wrapper,
        std::os::unix::fs::PermissionsExt::from_mode(0o755),
    )
    .expect("make it executable");
    Member::start(etcdrs_testkit::MemberOpts::new(
        &etcdrs_testkit::EtcdBin::at(&wrapper),
    ))
    .await
    .expect("member starts")
}

/// issue 40: etcd 3.6's names for the renamed `--experimental-*` flags and its
/// `--feature-gates` start our member with the effects of the 3.5 names: progress
/// notifications at `--watch-progress-notify-interval`, no learner under `--max-learners 0`,
/// slow applies logged past `--warning-apply-duration`, the initial corruption check under
/// `InitialCorruptCheck=true`, and a gate without effect warned about at start.
/// (`--corrupt-check-time` and `--snapshot-catchup-entries` are set too; the config tests
/// show each 3.6 name reaching what its 3.5 name reaches, whose effect the corrupt and auth
/// tests show.)
#[tokio::test]
async fn etcd_36_flag_names_take_effect() {
    if !crate::ours() {
        // etcd 3.4 knows none of these names.
        return;
    }
    let m = Member::start(opts().args([
        "--watch-progress-notify-interval",
        "300ms",
        "--max-learners",
        "0",
        "--warning-apply-duration",
        "1us",
        "--corrupt-check-time",
        "1h",
        "--snapshot-catchup-entries",
        "50",
        "--feature-gates",
        "InitialCorruptCheck=true,StopGRPCServiceOnDefrag=true",
    ]))
    .await
    .expect("member starts");
    let mut c = m.client().await.expect("client");

    let mut stream = c
        .watch(
            "quiet",
            Some(etcd_client::WatchOptions::new().with_progress_notify()),
        )
        .await
        .expect("watch");
    let created = stream.message().await.expect("stream").expect("created");
    assert!(created.created());
    let progress = tokio::time::timeout(Duration::from_secs(5), stream.message())
        .await
        .expect("a progress notification within 5 s (the default interval is 10 min)")
        .expect("stream")
        .expect("open");
    assert!(
        progress.events().is_empty() && !progress.canceled(),
        "{progress:?}"
    );

    let refused = m
        .etcdctl()
        .fail(&[
            "member",
            "add",
            "l1",
            "--learner",
            "--peer-urls=http://127.0.0.1:1",
        ])
        .await;
    assert!(
        refused.contains("etcdserver: too many learner members in cluster"),
        "{refused}"
    );

    c.put("k", "v", None).await.expect("put");
    poll_until(Duration::from_secs(10), || async {
        for line in [
            "apply request took too long",
            "starting initial corruption check",
            "--feature-gates=StopGRPCServiceOnDefrag=true has no effect in etcd-rs",
        ] {
            if !m.log_contains(line) {
                return Err(format!("log lacks {line:?}"));
            }
        }
        Ok(())
    })
    .await
    .unwrap_or_else(|e| panic!("{e}\n{}", m.log_tail(30)));
}
