//! `etcd gateway start`, the L4 TCP proxy (issue 5), driven from outside like its users drive
//! it: our `etcd` binary runs the gateway in front of real members (etcd 3.4 and our own), and
//! the stock `etcdctl` and the `etcd-client` crate talk through it.
//!
//! - `etcd34_cluster_through_gateway` / `own_cluster_through_gateway`: put/get, a SIGSTOPped
//!   member taken out of rotation by the health check and back after `--retry-delay`, a
//!   long-lived watch and a lease keep-alive that survive two of three endpoints dying, and a
//!   graceful SIGTERM. The gateway's endpoints are `testkit::Relay`s in front of the members, so
//!   an endpoint can die (its port closes) while the member behind it keeps the quorum.
//! - `srv_priorities_weights_and_new_records`: a real DNS server (`testkit::dns`) with SRV
//!   records of several priorities and weights, one added while the gateway runs.
//! - `srv_tls_validation_and_passthrough`: etcd's SRV rules for TLS targets, TLS carried end to
//!   end through the gateway, and the non-zero exit where etcd silently falls back.
//! - `bad_flags_fail_like_etcd`: flag errors compared with etcd 3.4's own.
//! - `url_endpoints_lose_their_scheme`: `--endpoints http://host:port,...` served as etcd's
//!   gateway serves it (the scheme stripped).
//! - `startup_refusals`: an endpoint that is the gateway itself, SRV names that do not exist.

use std::net::{Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::Duration;

use etcd_client::{Client, ConnectOptions, EventType, GetOptions};
use etcdrs_testkit::certs::{TestCa, Usage};
use etcdrs_testkit::dns::DnsServer;
use etcdrs_testkit::ports::{self, PortLease};
use etcdrs_testkit::{
    Cluster, ClusterOpts, EtcdBin, Etcdctl, Member, MemberOpts, Relay, http_get, poll_until,
};
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

/// Deadline for every state the tests wait for (2 cores, several clusters at once).
const WAIT: Duration = Duration::from_secs(15);

fn our_etcd() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_etcd"))
}

fn etcd34() -> EtcdBin {
    EtcdBin::at("/usr/bin/etcd")
}

/// Our gateway process (`etcd gateway start`), logging to a file; SIGKILLed on drop.
struct Gateway {
    child: Option<Child>,
    log: PathBuf,
    addr: String,
    metrics: String,
    _dir: tempfile::TempDir,
    _ports: [PortLease; 2],
}

impl Gateway {
    /// Spawns the gateway with `--listen-addr` and `--metrics-addr` on free ports plus `args`.
    fn spawn(args: &[&str], env: &[(&str, String)]) -> Gateway {
        let listen = ports::reserve().expect("port");
        let metrics = ports::reserve().expect("port");
        let addr = format!("127.0.0.1:{}", listen.port());
        let metrics_addr = format!("127.0.0.1:{}", metrics.port());
        let dir = tempfile::tempdir().expect("temp dir");
        let log = dir.path().join("gateway.log");
        let file = std::fs::File::create(&log).expect("log file");
        let mut cmd = Command::new(our_etcd());
        cmd.args([
            "gateway",
            "start",
            "--listen-addr",
            &addr,
            "--metrics-addr",
            &metrics_addr,
        ])
        .args(args)
        .env_remove("ETCDRS_DNS_SERVER")
        .stdin(Stdio::null())
        .stdout(file.try_clone().expect("log file"))
        .stderr(file);
        for (k, v) in env {
            cmd.env(k, v);
        }
        let child = cmd.spawn().expect("gateway spawns");
        Gateway {
            child: Some(child),
            log,
            addr,
            metrics: metrics_addr,
            _dir: dir,
            _ports: [listen, metrics],
        }
    }

    /// Spawns and waits until it logs that it is ready.
    async fn start(args: &[&str], env: &[(&str, String)]) -> Gateway {
        let gw = Gateway::spawn(args, env);
        poll_until(WAIT, || async {
            if gw.log().contains("ready to proxy client requests") {
                Ok(())
            } else {
                Err(format!("gateway not ready; log:\n{}", gw.log()))
            }
        })
        .await
        .expect("gateway ready");
        gw
    }

    fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    fn etcdctl(&self) -> Etcdctl {
        Etcdctl::new(self.addr.clone())
    }

    async fn client(&self) -> Client {
        let opts = ConnectOptions::new()
            .with_connect_timeout(Duration::from_secs(5))
            .with_timeout(Duration::from_secs(10));
        Client::connect([self.addr.clone()], Some(opts))
            .await
            .expect("etcd-client connects through the gateway")
    }

    /// The value of one series of the gateway's `/metrics` (exact name and labels).
    async fn metric(&self, series: &str) -> Option<f64> {
        let resp = http_get(&self.metrics, "/metrics").await.ok()?;
        resp.body.lines().find_map(|line| {
            let rest = line.strip_prefix(series)?.strip_prefix(' ')?;
            rest.trim().parse().ok()
        })
    }

    async fn wait_metric(&self, series: &str, want: f64) {
        poll_until(WAIT, || async {
            match self.metric(series).await {
                Some(v) if v == want => Ok(()),
                other => Err(format!("{series} = {other:?}, want {want}\n{}", self.log())),
            }
        })
        .await
        .expect("metric reaches its value");
    }

    fn pid(&self) -> Pid {
        let id = self.child.as_ref().map(Child::id).expect("running");
        Pid::from_raw(i32::try_from(id).expect("pid"))
    }

    async fn wait_exit(&mut self, timeout: Duration) -> ExitStatus {
        let child = self.child.as_mut().expect("running");
        match etcdrs_testkit::wait_child(child, timeout).await {
            Ok(status) => {
                self.child = None;
                status
            }
            Err(e) => panic!(
                "gateway still running after {timeout:?} ({e:#}); log:\n{}",
                std::fs::read_to_string(&self.log).unwrap_or_default()
            ),
        }
    }
}

impl Drop for Gateway {
    fn drop(&mut self) {
        if std::thread::panicking() {
            let log = self.log();
            let tail: Vec<&str> = log.lines().rev().take(60).collect();
            let tail: Vec<&str> = tail.into_iter().rev().collect();
            eprintln!("--- gateway log tail ---\n{}", tail.join("\n"));
        }
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

fn endpoint_up(key: &str) -> String {
    format!("etcd_gateway_endpoint_up{{endpoint=\"{key}\"}}")
}

fn signal(pid: Option<u32>, sig: Signal) {
    let pid = Pid::from_raw(i32::try_from(pid.expect("member running")).expect("pid"));
    kill(pid, sig).expect("signal");
}

/// The next event of a watch stream (skipping the creation response), within [`WAIT`].
async fn next_event(stream: &mut etcd_client::WatchStream) -> etcd_client::Event {
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        let resp = tokio::time::timeout_at(deadline, stream.message())
            .await
            .expect("watch event in time")
            .expect("watch stream")
            .expect("watch stream open");
        if let Some(event) = resp.events().first() {
            return event.clone();
        }
    }
}

/// The whole story against one 3-member cluster of `bin`.
async fn cluster_through_gateway(bin: EtcdBin) {
    let mut cluster = Cluster::start(3, ClusterOpts::new(&bin))
        .await
        .expect("cluster starts");
    let mut relays: Vec<Option<Relay>> = cluster
        .members()
        .iter()
        .map(|m| {
            let target: SocketAddr = m.client_addr().parse().expect("addr");
            Some(Relay::start(Ipv4Addr::LOCALHOST, target).expect("relay"))
        })
        .collect();
    let keys: Vec<String> = relays
        .iter()
        .flatten()
        .map(|r| r.addr().to_string())
        .collect();
    let mut gw = Gateway::start(
        &[
            "--endpoints",
            &keys.join(","),
            "--retry-delay",
            "1s",
            "--health-check-interval",
            "200ms",
            "--health-check-timeout",
            "1s",
            "--shutdown-timeout",
            "1s",
        ],
        &[],
    )
    .await;
    assert!(
        gw.log().contains(&keys[0]),
        "ready line names the endpoints"
    );
    let ctl = gw.etcdctl();
    ctl.ok(&["put", "k", "v"]).await;
    assert_eq!(
        ctl.ok(&["get", "k", "--print-value-only"]).await.trim(),
        "v"
    );

    gw.wait_metric("etcd_gateway_active_connections", 0.0).await;
    let to_endpoint = gw
        .metric("etcd_gateway_bytes_total{direction=\"to_endpoint\"}")
        .await;
    let to_client = gw
        .metric("etcd_gateway_bytes_total{direction=\"to_client\"}")
        .await;
    assert!(
        to_endpoint > Some(0.0) && to_client > Some(0.0),
        "{to_endpoint:?} {to_client:?}"
    );
    assert!(gw.metric("etcd_gateway_connections_total").await >= Some(2.0));
    let health = http_get(&gw.metrics, "/health").await.expect("/health");
    assert_eq!(
        (health.status, health.body.as_str()),
        (200, r#"{"health":"true"}"#)
    );

    // A hung member (stopped process: its kernel still accepts) leaves rotation, then every
    // new connection is served; it comes back once it answers again, after --retry-delay.
    let leader = cluster.leader().await.expect("leader");
    let hung = (leader + 1) % 3;
    signal(cluster.member(hung).pid(), Signal::SIGSTOP);
    gw.wait_metric(&endpoint_up(&keys[hung]), 0.0).await;
    for live in (0..3).filter(|i| *i != hung) {
        gw.wait_metric(&endpoint_up(&keys[live]), 1.0).await;
    }
    for _ in 0..6 {
        ctl.ok(&["--command-timeout=3s", "get", "k"]).await;
    }
    signal(cluster.member(hung).pid(), Signal::SIGCONT);
    gw.wait_metric(&endpoint_up(&keys[hung]), 1.0).await;
    assert!(gw.log().contains("deactivated endpoint") && gw.log().contains("\"activated\""));

    // A long-lived connection: a watch and a lease keep-alive.
    let mut client = gw.client().await;
    let mut events = client.watch("w", None).await.expect("watch");
    let lease = client.lease_grant(10, None).await.expect("grant").id();
    let (mut keeper, mut acks) = client.lease_keep_alive(lease).await.expect("keep-alive");
    client.put("w", "1", None).await.expect("put");
    let first = next_event(&mut events).await;
    assert_eq!(first.kv().expect("kv").value(), b"1");
    // The relay that carries it (probes through the others come and go).
    let carrier = poll_until(WAIT, || async {
        let open: Vec<usize> = relays
            .iter()
            .enumerate()
            .filter(|(_, r)| r.as_ref().is_some_and(|r| r.open_connections() > 0))
            .map(|(i, _)| i)
            .collect();
        match open.as_slice() {
            [one] => Ok(*one),
            other => Err(format!("relays with open connections: {other:?}")),
        }
    })
    .await
    .expect("one relay carries the client");

    // Kill one endpoint (and its member), then a second one (its member stays for quorum).
    // The member killed is a follower, so that the test is about endpoints, not elections.
    let leader = cluster.leader().await.expect("leader");
    let mut others: Vec<usize> = (0..3).filter(|i| *i != carrier).collect();
    if others[0] == leader {
        others.swap(0, 1);
    }
    cluster.kill9(others[0]).expect("kill");
    relays[others[0]] = None;
    for i in 0..6 {
        ctl.ok(&["put", &format!("k{i}"), "x"]).await;
    }
    relays[others[1]] = None;
    for _ in 0..6 {
        assert_eq!(
            ctl.ok(&["get", "k", "--print-value-only"]).await.trim(),
            "v"
        );
    }
    gw.wait_metric(&endpoint_up(&keys[others[0]]), 0.0).await;
    gw.wait_metric(&endpoint_up(&keys[others[1]]), 0.0).await;

    // The long-lived connection never noticed.
    client.put("w", "2", None).await.expect("put");
    let second = next_event(&mut events).await;
    assert_eq!(second.event_type(), EventType::Put);
    assert_eq!(second.kv().expect("kv").value(), b"2");
    keeper.keep_alive().await.expect("keep-alive request");
    let ack = acks
        .message()
        .await
        .expect("keep-alive stream")
        .expect("ack");
    assert!(ack.ttl() > 0, "lease still alive: {ack:?}");

    // SIGTERM: stop accepting, give the open connection the shutdown bound, exit 0.
    kill(gw.pid(), Signal::SIGTERM).expect("SIGTERM");
    let status = gw.wait_exit(Duration::from_secs(10)).await;
    assert!(status.success(), "gateway exit: {status:?}\n{}", gw.log());
    assert!(gw.log().contains("gateway stopped"));
}

#[tokio::test]
async fn etcd34_cluster_through_gateway() {
    cluster_through_gateway(etcd34()).await;
}

#[tokio::test]
async fn own_cluster_through_gateway() {
    cluster_through_gateway(EtcdBin::at(our_etcd())).await;
}

/// Keys under `prefix` on one member, read directly.
async fn count(member: &Member, prefix: &str) -> i64 {
    let mut client = member.client().await.expect("client");
    client
        .get(
            prefix,
            Some(GetOptions::new().with_prefix().with_count_only()),
        )
        .await
        .expect("count")
        .count()
}

async fn single_members(n: usize) -> Vec<Member> {
    let mut members: Vec<Member> = (0..n)
        .map(|_| Member::spawn(MemberOpts::new(&etcd34())).expect("spawn"))
        .collect();
    for m in &mut members {
        m.wait_ready().await.expect("member ready");
    }
    members
}

#[tokio::test]
async fn srv_priorities_weights_and_new_records() {
    let dns = DnsServer::start("example.test").expect("dns");
    let members = single_members(4).await;
    let names = ["a", "b", "c", "d"];
    for name in names {
        dns.add_a(name, Ipv4Addr::LOCALHOST).await.expect("A");
    }
    // With --discovery-srv-name prod, etcd looks up `_etcd-client-prod._tcp`.
    let srv = "_etcd-client-prod._tcp";
    dns.add_srv("_etcd-client._tcp", 0, 0, members[3].client_port(), "d")
        .await
        .expect("SRV");
    dns.add_srv(srv, 10, 3, members[0].client_port(), "a")
        .await
        .expect("SRV");
    dns.add_srv(srv, 10, 1, members[1].client_port(), "b")
        .await
        .expect("SRV");
    dns.add_srv(srv, 20, 0, members[2].client_port(), "c")
        .await
        .expect("SRV");
    let gw = Gateway::start(
        &[
            "--discovery-srv",
            "example.test",
            "--discovery-srv-name",
            "prod",
            "--insecure-discovery",
            "--discovery-srv-refresh",
            "200ms",
            "--retry-delay",
            "1s",
        ],
        &[("ETCDRS_DNS_SERVER", dns.addr().to_string())],
    )
    .await;
    let ctl = gw.etcdctl();

    // Weighted round robin over the best priority: 3:1, nothing to the backup.
    for i in 0..40 {
        ctl.ok(&["put", &format!("w/{i:02}"), "x"]).await;
    }
    assert_eq!(count(&members[0], "w/").await, 30);
    assert_eq!(count(&members[1], "w/").await, 10);
    assert_eq!(count(&members[2], "w/").await, 0);
    assert_eq!(
        count(&members[3], "w/").await,
        0,
        "unsuffixed records are not used"
    );

    // The best group dies: the backup takes every connection, no client sees a failure.
    let mut members = members;
    members[0].kill9().expect("kill");
    members[1].kill9().expect("kill");
    for i in 0..5 {
        ctl.ok(&["put", &format!("f/{i}"), "x"]).await;
    }
    assert_eq!(count(&members[2], "f/").await, 5);

    // A better record appears while the gateway runs: picked up without a restart.
    dns.add_srv(srv, 5, 1, members[3].client_port(), "d")
        .await
        .expect("SRV");
    poll_until(WAIT, || async {
        ctl.ok(&["put", "probe", "x"]).await;
        if count(&members[3], "probe").await > 0 {
            Ok(())
        } else {
            Err("new SRV target not used yet")
        }
    })
    .await
    .expect("re-resolution");
    for i in 0..5 {
        ctl.ok(&["put", &format!("n/{i}"), "x"]).await;
    }
    assert_eq!(count(&members[3], "n/").await, 5);
    assert!(
        gw.log()
            .contains("endpoints changed after SRV re-resolution")
    );
}

/// Starts an etcd 3.4 member serving clients only over TLS on `127.0.0.1`.
async fn tls_member(cert: &Path, key: &Path, ca: &Path) -> Member {
    let client = ports::reserve().expect("port");
    let peer = ports::reserve().expect("port");
    let url = format!("https://127.0.0.1:{}", client.port());
    let opts = MemberOpts::new(&etcd34())
        .arg(format!("--listen-client-urls={url}"))
        .arg(format!("--advertise-client-urls={url}"))
        .arg(format!("--cert-file={}", cert.display()))
        .arg(format!("--key-file={}", key.display()));
    let member = Member::spawn_on(opts, client, peer).expect("spawn");
    let ctl = Etcdctl::new(url);
    let ca = ca.display().to_string();
    poll_until(WAIT, || async {
        match ctl.run(&["--cacert", &ca, "endpoint", "health"]).await {
            Ok(out) if out.success() => Ok(()),
            Ok(out) => Err(out.stderr),
            Err(e) => Err(e.to_string()),
        }
    })
    .await
    .expect("TLS member ready");
    member
}

#[tokio::test]
async fn srv_tls_validation_and_passthrough() {
    let dir = tempfile::tempdir().expect("dir");
    let ca = TestCa::new(dir.path(), "ca").expect("CA");
    // etcd validates discovered TLS endpoints with the SRV domain as server name.
    let cert = ca
        .issue(
            "server",
            "etcd",
            &["example.test", "127.0.0.1", "localhost"],
            Usage::Both,
        )
        .expect("cert");
    let secure = tls_member(&cert.cert, &cert.key, &ca.ca_file()).await;
    let plain = Member::start(MemberOpts::new(&etcd34()))
        .await
        .expect("member");
    let dns = DnsServer::start("example.test").expect("dns");
    dns.add_a("t", Ipv4Addr::LOCALHOST).await.expect("A");
    dns.add_a("p", Ipv4Addr::LOCALHOST).await.expect("A");
    dns.add_srv("_etcd-client-ssl._tcp", 0, 0, secure.client_port(), "t")
        .await
        .expect("SRV");
    dns.add_srv("_etcd-client._tcp", 0, 0, plain.client_port(), "p")
        .await
        .expect("SRV");
    let env = [("ETCDRS_DNS_SERVER", dns.addr().to_string())];
    let ca_file = ca.ca_file().display().to_string();

    // Without --insecure-discovery only the verified TLS target is kept.
    let gw = Gateway::start(
        &[
            "--discovery-srv",
            "example.test",
            "--trusted-ca-file",
            &ca_file,
        ],
        &env,
    )
    .await;
    let log = gw.log();
    let secure_key = format!("t.example.test:{}", secure.client_port());
    let plain_key = format!("p.example.test:{}", plain.client_port());
    assert!(
        log.contains("is insecure") && log.contains(&plain_key),
        "{log}"
    );
    let ready = log
        .lines()
        .find(|l| l.contains("ready to proxy client requests"))
        .expect("ready line");
    assert!(
        ready.contains(&secure_key) && !ready.contains(&plain_key),
        "{ready}"
    );

    // TLS end to end: etcdctl verifies the member's certificate through the gateway.
    let tls_ctl = Etcdctl::new(format!("https://{}", gw.addr));
    tls_ctl
        .ok(&["--cacert", &ca_file, "put", "tls-key", "through"])
        .await;
    let direct = Etcdctl::new(format!("https://127.0.0.1:{}", secure.client_port()));
    let got = direct
        .ok(&["--cacert", &ca_file, "get", "tls-key", "--print-value-only"])
        .await;
    assert_eq!(got.trim(), "through");
    // The gateway does not terminate TLS: a plain-text client reaches a TLS server and fails.
    gw.etcdctl()
        .fail(&[
            "--dial-timeout=2s",
            "--command-timeout=2s",
            "get",
            "tls-key",
        ])
        .await;

    // A TLS-only endpoint given as plain --endpoints: the health probe's plain request is
    // dropped by the TLS server, the TLS hello that follows is answered, so it stays up.
    let static_tls = format!("127.0.0.1:{}", secure.client_port());
    let gw2 = Gateway::start(
        &[
            "--endpoints",
            &static_tls,
            "--health-check-interval",
            "100ms",
        ],
        &[],
    )
    .await;
    poll_until(WAIT, || async {
        match gw2
            .metric("etcd_gateway_health_probes_total{result=\"ok\"}")
            .await
        {
            Some(n) if n >= 3.0 => Ok(()),
            other => Err(format!("ok probes: {other:?}\n{}", gw2.log())),
        }
    })
    .await
    .expect("probes succeed");
    assert_eq!(
        gw2.metric("etcd_gateway_health_probes_total{result=\"fail\"}")
            .await,
        None
    );
    assert_eq!(gw2.metric(&endpoint_up(&static_tls)).await, Some(1.0));
    let tls_ctl2 = Etcdctl::new(format!("https://{}", gw2.addr));
    let got = tls_ctl2
        .ok(&["--cacert", &ca_file, "get", "tls-key", "--print-value-only"])
        .await;
    assert_eq!(got.trim(), "through");

    // The same endpoint given as an https:// URL: the scheme is dropped (etcd's
    // stripSchema) and TLS still passes through untouched.
    let url_tls = format!("https://127.0.0.1:{}", secure.client_port());
    let gw3 = Gateway::start(&["--endpoints", &url_tls], &[]).await;
    let ready = gw3
        .log()
        .lines()
        .find(|l| l.contains("ready to proxy client requests"))
        .map(str::to_string)
        .expect("ready line");
    assert!(
        ready.contains(&static_tls) && !ready.contains("https://"),
        "{ready}"
    );
    let tls_ctl3 = Etcdctl::new(format!("https://{}", gw3.addr));
    let got = tls_ctl3
        .ok(&["--cacert", &ca_file, "get", "tls-key", "--print-value-only"])
        .await;
    assert_eq!(got.trim(), "through");

    // Nothing verifies (wrong CA) and no --endpoints: etcd would fall back to 127.0.0.1:2379
    // without a word; ours says why and exits non-zero.
    let other = TestCa::new(dir.path(), "other").expect("CA");
    let other_file = other.ca_file().display().to_string();
    let mut bad = Gateway::spawn(
        &[
            "--discovery-srv",
            "example.test",
            "--trusted-ca-file",
            &other_file,
        ],
        &env,
    );
    let status = bad.wait_exit(WAIT).await;
    assert!(!status.success());
    assert!(
        bad.log().contains("no usable endpoint discovered"),
        "{}",
        bad.log()
    );
}

/// issue 40: `--endpoints` given as URLs (etcd's own gateway test starts it that way) are
/// served as `host:port`, as etcd 3.4's gateway serves them; ours refused them before.
#[tokio::test]
async fn url_endpoints_lose_their_scheme() {
    // One member (separate single members would answer a get from another's keys), named twice.
    let members = single_members(1).await;
    let port = members[0].client_port();
    let list = format!("http://127.0.0.1:{port},http://localhost:{port}");
    let gw = Gateway::start(&["--endpoints", &list], &[]).await;
    let log = gw.log();
    let ready = log
        .lines()
        .find(|l| l.contains("ready to proxy client requests"))
        .expect("ready line");
    for key in [format!("127.0.0.1:{port}"), format!("localhost:{port}")] {
        assert!(ready.contains(&key), "{ready}");
        assert_eq!(gw.metric(&endpoint_up(&key)).await, Some(1.0), "{log}");
    }
    assert!(!ready.contains("http://"), "{ready}");
    let ctl = gw.etcdctl();
    ctl.ok(&["put", "url-key", "v"]).await;
    let got = ctl.ok(&["get", "url-key", "--print-value-only"]).await;
    assert_eq!(got.trim(), "v");
}

/// Runs `etcd gateway start <args>` of `bin` and returns (exit code, stdout, stderr).
fn run_gateway(bin: &Path, args: &[&str]) -> (Option<i32>, String, String) {
    let out = Command::new(bin)
        .args(["gateway", "start"])
        .args(args)
        .stdin(Stdio::null())
        .output()
        .expect("runs");
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[tokio::test]
async fn bad_flags_fail_like_etcd() {
    let ours = our_etcd();
    let theirs = PathBuf::from("/usr/bin/etcd");
    for args in [
        &["--bogus"][..],
        &["--retry-delay", "123"],
        &["--insecure-discovery=maybe"],
        &["-endpoints", "127.0.0.1:2379"],
        &["--endpoints"],
    ] {
        let (our_code, _, our_err) = run_gateway(&ours, args);
        let (their_code, _, their_err) = run_gateway(&theirs, args);
        assert_eq!(our_code, Some(1), "{args:?}: {our_err}");
        assert_eq!(their_code, Some(1), "{args:?}: {their_err}");
        // First line (`Error: ...`) and last line (the error again) as etcd prints them.
        assert_eq!(our_err.lines().next(), their_err.lines().next(), "{args:?}");
        assert_eq!(
            our_err.trim_end().lines().last(),
            their_err.trim_end().lines().last(),
            "{args:?}"
        );
        assert!(our_err.contains("Usage:\n  etcd gateway start [flags]"));
    }

    // A URL loses its scheme first (etcd's stripSchema), so one without a port is refused
    // for what is left, as etcd refuses it.
    for bin in [&ours, &theirs] {
        let (code, out, err) = run_gateway(bin, &["--endpoints", "http://127.0.0.1"]);
        assert_eq!(code, Some(1), "{}", bin.display());
        assert!(
            format!("{out}{err}").contains("rror parsing endpoint \"127.0.0.1\""),
            "{}: {out}{err}",
            bin.display()
        );
    }
    let (code, _, err) = run_gateway(&ours, &["--endpoints", "127.0.0.1"]);
    assert_eq!(code, Some(1));
    assert!(
        err.contains("error parsing endpoint \"127.0.0.1\""),
        "{err}"
    );
    let (code, _, err) = run_gateway(&ours, &["--listen-addr", "nowhere"]);
    assert_eq!(code, Some(1));
    assert!(
        err.contains("failed to validate listen address: nowhere"),
        "{err}"
    );

    // --help: every flag etcd lists, with its type and default, on stdout; exit 0.
    let (code, our_help, _) = run_gateway(&ours, &["--help"]);
    let (_, their_help, _) = run_gateway(&theirs, &["--help"]);
    assert_eq!(code, Some(0));
    let ours_lines: Vec<Vec<&str>> = our_help
        .lines()
        .map(|l| l.split_whitespace().collect())
        .collect();
    for line in their_help.lines() {
        let words: Vec<&str> = line.split_whitespace().collect();
        assert!(
            ours_lines.contains(&words),
            "missing from our help: {line:?}\n{our_help}"
        );
    }
}

/// Startup checks that need a running process: an endpoint that is the gateway itself, and SRV
/// names that do not exist (etcd: `dns lookup errors: ... and ...`, exit 1).
#[tokio::test]
async fn startup_refusals() {
    let port = ports::reserve().expect("port");
    let addr = format!("127.0.0.1:{}", port.port());
    let out = Command::new(our_etcd())
        .args([
            "gateway",
            "start",
            "--listen-addr",
            &addr,
            "--endpoints",
            &addr,
        ])
        .stdin(Stdio::null())
        .output()
        .expect("runs");
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        err.contains("should not resolve to the gateway listen addr"),
        "{err}"
    );

    let dns = DnsServer::start("example.test").expect("dns");
    let env = [("ETCDRS_DNS_SERVER", dns.addr().to_string())];
    let mut gw = Gateway::spawn(
        &["--discovery-srv", "example.test", "--insecure-discovery"],
        &env,
    );
    let status = gw.wait_exit(WAIT).await;
    assert_eq!(status.code(), Some(1));
    let log = gw.log();
    assert!(
        log.contains("dns lookup errors")
            && log.contains("_etcd-client-ssl._tcp.example.test.")
            && log.contains("_etcd-client._tcp.example.test."),
        "{log}"
    );
}
