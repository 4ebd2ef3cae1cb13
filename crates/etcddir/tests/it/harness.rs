//! A real etcd 3.4 (`/usr/bin/etcd`, Debian's) on free loopback ports, driven by the stock
//! `etcdctl`, and stopped with SIGTERM so that it leaves its data directory as it would in
//! production.

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const ETCD: &str = "/usr/bin/etcd";
const ETCDCTL: &str = "/usr/bin/etcdctl";

/// How long etcd may take to become healthy or to stop.
const DEADLINE: Duration = Duration::from_secs(60);

/// Pause between two readiness probes.
const PROBE_INTERVAL: Duration = Duration::from_millis(100);

fn free_port() -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind a free port");
    listener.local_addr().expect("local address").port()
}

/// A running single-member etcd.
pub struct Etcd {
    child: Option<Child>,
    /// The client URL.
    pub client_url: String,
    /// The peer URL.
    pub peer_url: String,
    /// Where its output goes.
    log: PathBuf,
}

impl Etcd {
    /// Starts member `m1` on `data_dir` with `extra` flags and waits until it is healthy.
    pub fn start(data_dir: &Path, log_dir: &Path, extra: &[&str]) -> Etcd {
        let client_url = format!("http://127.0.0.1:{}", free_port());
        let peer_url = format!("http://127.0.0.1:{}", free_port());
        let log = log_dir.join("etcd.log");
        let log_file = std::fs::File::create(&log).expect("create the log");
        let child = Command::new(ETCD)
            .arg("--name")
            .arg("m1")
            .arg("--data-dir")
            .arg(data_dir)
            .args([
                "--listen-client-urls",
                &client_url,
                "--advertise-client-urls",
                &client_url,
            ])
            .args([
                "--listen-peer-urls",
                &peer_url,
                "--initial-advertise-peer-urls",
                &peer_url,
            ])
            .arg("--initial-cluster")
            .arg(format!("m1={peer_url}"))
            .args(extra)
            .stdin(Stdio::null())
            .stdout(log_file.try_clone().expect("clone the log"))
            .stderr(log_file)
            .spawn()
            .expect("start /usr/bin/etcd");
        let mut etcd = Etcd {
            child: Some(child),
            client_url,
            peer_url,
            log,
        };
        etcd.wait_healthy();
        etcd
    }

    fn wait_healthy(&mut self) {
        let deadline = Instant::now() + DEADLINE;
        loop {
            let probe = Command::new(ETCDCTL)
                .env("ETCDCTL_API", "3")
                .args(["--endpoints", &self.client_url, "endpoint", "health"])
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status()
                .expect("run etcdctl");
            if probe.success() {
                return;
            }
            if let Some(child) = self.child.as_mut()
                && let Ok(Some(status)) = child.try_wait()
            {
                panic!("etcd exited with {status}: {}", self.log());
            }
            assert!(
                Instant::now() < deadline,
                "etcd not healthy in time: {}",
                self.log()
            );
            std::thread::sleep(PROBE_INTERVAL);
        }
    }

    /// etcd's output so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Runs `etcdctl` (v3 API) against this member; returns its stdout, panicking on failure.
    pub fn etcdctl(&self, args: &[&str]) -> String {
        let output = Command::new(ETCDCTL)
            .env("ETCDCTL_API", "3")
            .args(["--endpoints", &self.client_url])
            .args(args)
            .output()
            .expect("run etcdctl");
        assert!(
            output.status.success(),
            "etcdctl {args:?} failed: {}",
            String::from_utf8_lossy(&output.stderr)
        );
        String::from_utf8(output.stdout).expect("etcdctl prints UTF-8")
    }

    /// `etcdctl ... -w json`, parsed.
    pub fn etcdctl_json(&self, args: &[&str]) -> serde_json::Value {
        let mut args = args.to_vec();
        args.extend(["-w", "json"]);
        serde_json::from_str(&self.etcdctl(&args)).expect("etcdctl prints JSON")
    }

    /// Stops etcd with SIGTERM and waits for it to exit.
    pub fn stop(mut self) {
        self.terminate();
    }

    fn terminate(&mut self) {
        let Some(mut child) = self.child.take() else {
            return;
        };
        let status = Command::new("kill")
            .arg("-TERM")
            .arg(child.id().to_string())
            .status()
            .expect("run kill");
        assert!(status.success(), "kill -TERM failed");
        let deadline = Instant::now() + DEADLINE;
        loop {
            if child.try_wait().expect("wait for etcd").is_some() {
                return;
            }
            if Instant::now() >= deadline {
                let _ = child.kill();
                let _ = child.wait();
                panic!("etcd did not stop on SIGTERM: {}", self.log());
            }
            std::thread::sleep(PROBE_INTERVAL);
        }
    }
}

impl Drop for Etcd {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// A data directory and a place for etcd's log, removed at the end of the test.
pub struct Dirs {
    _root: tempfile::TempDir,
    /// The data directory given to etcd.
    pub data: PathBuf,
    /// Where logs go.
    pub logs: PathBuf,
}

impl Dirs {
    pub fn new() -> Dirs {
        let root = tempfile::tempdir().expect("temp dir");
        let data = root.path().join("data");
        let logs = root.path().join("logs");
        std::fs::create_dir_all(&logs).expect("create the log dir");
        Dirs {
            data,
            logs,
            _root: root,
        }
    }
}

/// What etcdctl reported about the member before it stopped.
pub struct Reported {
    pub member_id: u64,
    pub cluster_id: u64,
}

/// `endpoint status` and `member list`, cross-checked.
pub fn reported_ids(etcd: &Etcd) -> Reported {
    let status = etcd.etcdctl_json(&["endpoint", "status"]);
    let header = &status[0]["Status"]["header"];
    let member_id = header["member_id"].as_u64().expect("member_id");
    let cluster_id = header["cluster_id"].as_u64().expect("cluster_id");
    let members = etcd.etcdctl_json(&["member", "list"]);
    assert_eq!(members["header"]["cluster_id"].as_u64(), Some(cluster_id));
    assert_eq!(members["members"][0]["ID"].as_u64(), Some(member_id));
    Reported {
        member_id,
        cluster_id,
    }
}

/// Copies a directory tree (the data directory, for tests that damage a copy).
pub fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).expect("create the copy");
    for dir_entry in std::fs::read_dir(from).expect("list") {
        let dir_entry = dir_entry.expect("entry");
        let target = to.join(dir_entry.file_name());
        if dir_entry.file_type().expect("type").is_dir() {
            copy_dir(&dir_entry.path(), &target);
        } else {
            std::fs::copy(dir_entry.path(), &target).expect("copy");
        }
    }
}
