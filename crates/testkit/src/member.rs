//! One server process: a single-member cluster by default, or one member of a [`crate::Cluster`].

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use etcd_client::{Certificate, Client, ConnectOptions, Identity, TlsOptions};
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

use crate::bin::EtcdBin;
use crate::certs::CertFiles;
use crate::etcdctl::Etcdctl;
use crate::http::{HttpResponse, http_get, https_get};
use crate::ports::{self, PortLease};

/// Lines of log included in readiness errors.
const LOG_TAIL_LINES: usize = 40;
/// Attempts to find ports nobody outside the testkit grabs between our check and the server's bind.
pub(crate) const PORT_ATTEMPTS: usize = 5;
/// `--heartbeat-interval` of [`MemberOpts::fast_timers`], in milliseconds.
pub const FAST_HEARTBEAT_MS: u64 = 50;
/// `--election-timeout` of [`MemberOpts::fast_timers`], in milliseconds (10 heartbeats, as etcd's
/// defaults; etcd requires at least 5).
pub const FAST_ELECTION_MS: u64 = 500;

/// What `--initial-cluster` a member is started with.
#[derive(Clone, Debug)]
enum InitialCluster {
    /// Only the member itself: `<name>=<advertised peer URL>`.
    Own,
    /// The member itself first, then these `(name, peer URL)` pairs.
    WithPeers(Vec<(String, String)>),
    /// Exactly this string.
    Exact(String),
}

/// TLS on a member's client port: `https` client URLs with `--cert-file` and `--key-file`. The testkit's probes, its
/// `etcd-client` connections and its etcdctl runners trust `ca_file` and present `client`.
#[derive(Clone, Debug)]
pub struct ClientTls {
    /// The CA that signed the server certificate (and, for client-cert auth, the clients').
    pub ca_file: PathBuf,
    /// The server's certificate and key.
    pub server: CertFiles,
    /// The certificate the testkit presents as a client, if any.
    pub client: Option<CertFiles>,
    /// Pass `--client-cert-auth` and `--trusted-ca-file` (etcd requires client certificates as
    /// soon as it has a trusted CA, so the CA goes with client-certificate auth only).
    pub client_cert_auth: bool,
}

/// TLS on a member's peer port: `https` peer URLs with `--peer-cert-file`, `--peer-key-file`,
/// `--peer-trusted-ca-file` (and `--peer-client-cert-auth` when set).
#[derive(Clone, Debug)]
pub struct PeerTls {
    /// The CA that signed the peer certificates; empty: no `--peer-trusted-ca-file`.
    pub ca_file: PathBuf,
    /// The member's peer certificate (used to serve and to dial).
    pub cert: CertFiles,
    /// Pass `--peer-client-cert-auth`.
    pub client_cert_auth: bool,
}

/// How to start a [`Member`]. Built with chained setters:
///
/// ```no_run
/// # fn demo(bin: &etcdrs_testkit::EtcdBin) {
/// use etcdrs_testkit::MemberOpts;
/// let opts = MemberOpts::new(bin).name("n1").args(["--max-txn-ops", "4"]).env("GOMAXPROCS", "1");
/// # }
/// ```
#[derive(Clone, Debug)]
pub struct MemberOpts {
    bin: EtcdBin,
    name: Option<String>,
    host: Ipv4Addr,
    initial_cluster: InitialCluster,
    advertise_peer_urls: Option<String>,
    token: Option<String>,
    settings: Vec<(String, String)>,
    via_env: bool,
    require_health: bool,
    args: Vec<String>,
    env: Vec<(String, String)>,
    ready_timeout: Duration,
    client_tls: Option<ClientTls>,
    peer_tls: Option<PeerTls>,
    peer_auto_tls: bool,
}

impl MemberOpts {
    /// Defaults: `--name test` on `127.0.0.1`, a single-member `--initial-cluster`, etcd's
    /// default token and timers, configuration as flags, no extra args or env, 20 s readiness
    /// deadline.
    pub fn new(bin: &EtcdBin) -> Self {
        Self {
            bin: bin.clone(),
            name: Some("test".to_owned()),
            host: Ipv4Addr::LOCALHOST,
            initial_cluster: InitialCluster::Own,
            advertise_peer_urls: None,
            token: None,
            settings: Vec::new(),
            via_env: false,
            require_health: false,
            args: Vec::new(),
            env: Vec::new(),
            ready_timeout: Duration::from_secs(20),
            client_tls: None,
            peer_tls: None,
            peer_auto_tls: false,
        }
    }

    /// `https` peer URLs with `--peer-auto-tls`: self-signed peer certificates.
    pub fn peer_auto_tls(mut self) -> Self {
        self.peer_auto_tls = true;
        self
    }

    /// Serve clients over TLS (see [`ClientTls`]).
    pub fn client_tls(mut self, tls: ClientTls) -> Self {
        self.client_tls = Some(tls);
        self
    }

    /// Talk to peers over TLS (see [`PeerTls`]).
    pub fn peer_tls(mut self, tls: PeerTls) -> Self {
        self.peer_tls = Some(tls);
        self
    }

    /// The client TLS settings, if any.
    pub fn client_tls_settings(&self) -> Option<&ClientTls> {
        self.client_tls.as_ref()
    }

    /// Member name passed as `--name` and used in `--initial-cluster`.
    pub fn name(mut self, name: impl Into<String>) -> Self {
        self.name = Some(name.into());
        self
    }

    /// Pass no `--name` at all, so the server uses its default name. `--initial-cluster` then
    /// names the member `default`, which is etcd's default.
    pub fn without_name(mut self) -> Self {
        self.name = None;
        self
    }

    /// The loopback address the member listens on and advertises (default `127.0.0.1`).
    pub fn host(mut self, host: Ipv4Addr) -> Self {
        self.host = host;
        self
    }

    /// `--initial-cluster` lists the member itself first, then these `(name, peer URL)` pairs.
    pub fn initial_peers<I, N, U>(mut self, peers: I) -> Self
    where
        I: IntoIterator<Item = (N, U)>,
        N: Into<String>,
        U: Into<String>,
    {
        let peers = peers
            .into_iter()
            .map(|(n, u)| (n.into(), u.into()))
            .collect();
        self.initial_cluster = InitialCluster::WithPeers(peers);
        self
    }

    /// `--initial-cluster` is exactly `value` (the member itself need not appear in it).
    pub fn initial_cluster(mut self, value: impl Into<String>) -> Self {
        self.initial_cluster = InitialCluster::Exact(value.into());
        self
    }

    /// `--initial-advertise-peer-urls` is `value` instead of the member's own peer URL (which
    /// `--listen-peer-urls` keeps using).
    pub fn initial_advertise_peer_urls(mut self, value: impl Into<String>) -> Self {
        self.advertise_peer_urls = Some(value.into());
        self
    }

    /// `--initial-cluster-token` (not passed by default, so the server uses `etcd-cluster`).
    pub fn initial_cluster_token(mut self, token: impl Into<String>) -> Self {
        self.token = Some(token.into());
        self
    }

    /// A configuration setting passed like the standard ones: `--<flag> <value>`, or
    /// `ETCD_<FLAG>=<value>` with [`MemberOpts::via_env`]. `flag` is the flag name without dashes
    /// in front, e.g. `"snapshot-count"`.
    pub fn setting(mut self, flag: impl Into<String>, value: impl Into<String>) -> Self {
        self.settings.push((flag.into(), value.into()));
        self
    }

    /// Fast raft timers for tests: `--heartbeat-interval 50 --election-timeout 500`
    /// ([`FAST_HEARTBEAT_MS`], [`FAST_ELECTION_MS`]).
    pub fn fast_timers(self) -> Self {
        self.setting("heartbeat-interval", FAST_HEARTBEAT_MS.to_string())
            .setting("election-timeout", FAST_ELECTION_MS.to_string())
    }

    /// Pass the standard configuration (name, data dir, URLs, initial cluster, token and every
    /// [`MemberOpts::setting`]) as `ETCD_*` environment variables instead of flags. Extra
    /// [`MemberOpts::arg`]s stay on the command line.
    pub fn via_env(mut self) -> Self {
        self.via_env = true;
        self
    }

    /// Readiness means HTTP `GET /health` answers `"health":"true"`, with no fallback to gRPC
    /// `Status` (see [`Member::wait_ready`]).
    pub fn require_health(mut self) -> Self {
        self.require_health = true;
        self
    }

    /// Appends one extra command-line argument (after the standard flags).
    pub fn arg(mut self, arg: impl Into<String>) -> Self {
        self.args.push(arg.into());
        self
    }

    /// Appends extra command-line arguments (after the standard flags).
    pub fn args<I, S>(mut self, args: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        self.args.extend(args.into_iter().map(Into::into));
        self
    }

    /// Sets an environment variable for the server process.
    pub fn env(mut self, key: impl Into<String>, value: impl Into<String>) -> Self {
        self.env.push((key.into(), value.into()));
        self
    }

    /// How long [`Member::start`] / [`Member::restart`] wait for readiness.
    pub fn ready_timeout(mut self, timeout: Duration) -> Self {
        self.ready_timeout = timeout;
        self
    }

    fn cluster_name(&self) -> &str {
        self.name.as_deref().unwrap_or("default")
    }
}

/// A running (or stopped) server process with its own data dir and ports.
///
/// The data dir, log file and ports stay the same for the whole life of the `Member`, across
/// [`Member::kill9`], [`Member::stop`] and [`Member::restart`]. Dropping it SIGKILLs the process and
/// deletes the temp dir (unless `ETCDRS_TEST_KEEP` is set).
#[derive(Debug)]
pub struct Member {
    opts: MemberOpts,
    dir: Option<tempfile::TempDir>,
    root: PathBuf,
    data_dir: PathBuf,
    log_path: PathBuf,
    client_port: PortLease,
    peer_port: PortLease,
    child: Option<Child>,
    starts: u32,
    log_offset: u64,
}

impl Member {
    /// Starts the server and waits until it is ready (see [`Member::wait_ready`]).
    ///
    /// If the server fails because a port was taken after we checked it ("address already in
    /// use" in the log), it is retried on fresh ports with a fresh data dir.
    pub async fn start(opts: MemberOpts) -> anyhow::Result<Member> {
        let mut last_err = None;
        for _ in 0..PORT_ATTEMPTS {
            let mut member = Self::spawn(opts.clone())?;
            match member.wait_ready().await {
                Ok(()) => return Ok(member),
                Err(e) if member.current_log().contains("address already in use") => {
                    member.kill9()?;
                    last_err = Some(e);
                }
                Err(e) => return Err(e),
            }
        }
        Err(last_err.unwrap_or_else(|| anyhow::anyhow!("no start attempt made")))
            .context("ports kept being taken")
    }

    /// Starts the server without waiting for readiness (for tests of startup failures, or to
    /// call [`Member::wait_ready`] later).
    pub fn spawn(opts: MemberOpts) -> anyhow::Result<Member> {
        let client_port = ports::reserve_on(opts.host)?;
        let peer_port = ports::reserve_on(opts.host)?;
        Self::spawn_on(opts, client_port, peer_port)
    }

    /// Like [`Member::spawn`] on ports the caller reserved on `opts`' host.
    pub fn spawn_on(
        opts: MemberOpts,
        client_port: PortLease,
        peer_port: PortLease,
    ) -> anyhow::Result<Member> {
        let dir = tempfile::Builder::new()
            .prefix("etcdrs-member-")
            .tempdir()
            .context("creating member temp dir")?;
        let root = dir.path().to_path_buf();
        let mut member = Member {
            data_dir: root.join("data"),
            log_path: root.join("etcd.log"),
            root,
            dir: Some(dir),
            client_port,
            peer_port,
            opts,
            child: None,
            starts: 0,
            log_offset: 0,
        };
        member.launch()?;
        Ok(member)
    }

    /// `http://<host>:<client port>` (host `127.0.0.1` unless set with [`MemberOpts::host`]);
    /// `https://` with [`MemberOpts::client_tls`].
    pub fn endpoint(&self) -> String {
        let scheme = if self.opts.client_tls.is_some() {
            "https"
        } else {
            "http"
        };
        format!("{scheme}://{}:{}", self.opts.host, self.client_port.port())
    }

    /// The client TLS the member runs with, if any.
    pub fn client_tls(&self) -> Option<&ClientTls> {
        self.opts.client_tls.as_ref()
    }

    /// `<host>:<client port>`.
    pub fn client_addr(&self) -> String {
        format!("{}:{}", self.opts.host, self.client_port.port())
    }

    /// `http://<host>:<peer port>`: the `--listen-peer-urls` (and, unless overridden, the
    /// advertised peer URL).
    pub fn peer_url(&self) -> String {
        let scheme = if self.opts.peer_tls.is_some() || self.opts.peer_auto_tls {
            "https"
        } else {
            "http"
        };
        format!("{scheme}://{}:{}", self.opts.host, self.peer_port.port())
    }

    /// The loopback address the member listens on.
    pub fn host(&self) -> Ipv4Addr {
        self.opts.host
    }

    /// The client port.
    pub fn client_port(&self) -> u16 {
        self.client_port.port()
    }

    /// The peer port.
    pub fn peer_port(&self) -> u16 {
        self.peer_port.port()
    }

    /// The member name used in `--initial-cluster` (`default` when started without `--name`).
    pub fn name(&self) -> &str {
        self.opts.cluster_name()
    }

    /// The `--data-dir`.
    pub fn data_dir(&self) -> &Path {
        &self.data_dir
    }

    /// The log file receiving the server's stdout and stderr (all starts, appended).
    pub fn log_path(&self) -> &Path {
        &self.log_path
    }

    /// OS process id of the current server process, if one is running.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// How many times the process has been launched (1 after `start`).
    pub fn starts(&self) -> u32 {
        self.starts
    }

    /// Whether the server process is alive (reaps it if it exited).
    pub fn is_running(&mut self) -> bool {
        match self.child.as_mut().map(Child::try_wait) {
            Some(Ok(None)) => true,
            Some(Ok(Some(_)) | Err(_)) | None => false,
        }
    }

    /// The whole log, over all starts. The testkit writes one `=== etcdrs-testkit: start #N …`
    /// line before each start.
    pub fn log(&self) -> String {
        std::fs::read(&self.log_path)
            .map(|b| String::from_utf8_lossy(&b).into_owned())
            .unwrap_or_default()
    }

    /// The log written since the latest start.
    pub fn current_log(&self) -> String {
        let all = std::fs::read(&self.log_path).unwrap_or_default();
        let from = usize::try_from(self.log_offset).unwrap_or(0).min(all.len());
        String::from_utf8_lossy(&all[from..]).into_owned()
    }

    /// Whether the whole log (all starts) contains `needle`.
    pub fn log_contains(&self, needle: &str) -> bool {
        self.log().contains(needle)
    }

    /// The last `lines` lines of the log.
    pub fn log_tail(&self, lines: usize) -> String {
        let log = self.log();
        let all: Vec<&str> = log.lines().collect();
        all[all.len().saturating_sub(lines)..].join("\n")
    }

    /// A connected `etcd_client::Client` (connect timeout 5 s, per-request timeout 10 s; over
    /// TLS with [`MemberOpts::client_tls`]).
    pub async fn client(&self) -> anyhow::Result<Client> {
        let opts = self.connect_options(None);
        Client::connect([self.endpoint()], Some(opts))
            .await
            .with_context(|| format!("connecting etcd-client to {}", self.endpoint()))
    }

    /// Connect options for this member: 5 s connect and 10 s request timeouts, the member's
    /// client TLS, and `user` (name, password) when given.
    pub fn connect_options(&self, user: Option<(&str, &str)>) -> ConnectOptions {
        let mut opts = ConnectOptions::new()
            .with_connect_timeout(Duration::from_secs(5))
            .with_timeout(Duration::from_secs(10));
        if let Some(tls) = &self.opts.client_tls {
            opts = opts.with_tls(client_tls_options(tls));
        }
        if let Some((name, password)) = user {
            opts = opts.with_user(name, password);
        }
        opts
    }

    /// An [`Etcdctl`] runner pointed at this member (with `--cacert`, `--cert` and `--key` for
    /// a TLS member).
    pub fn etcdctl(&self) -> Etcdctl {
        let ctl = Etcdctl::new(self.endpoint());
        match &self.opts.client_tls {
            Some(tls) => ctl.with_tls(&tls.ca_file, tls.client.as_ref()),
            None => ctl,
        }
    }

    /// `GET path` on the client port: plain HTTP, or HTTPS for a TLS member.
    pub async fn http_get(&self, path: &str) -> anyhow::Result<HttpResponse> {
        match &self.opts.client_tls {
            Some(tls) => {
                https_get(&self.client_addr(), path, &tls.ca_file, tls.client.as_ref()).await
            }
            None => http_get(&self.client_addr(), path).await,
        }
    }

    /// Polls until the member serves: HTTP `GET /health` answers `"health":"true"`, or (for
    /// servers that are up but report unhealthy over HTTP, e.g. with an active NOSPACE alarm, and
    /// unless [`MemberOpts::require_health`]) gRPC `Maintenance.Status` reports a leader. Fails at
    /// once if the process exits, and after the readiness deadline; both errors include the log
    /// tail.
    pub async fn wait_ready(&mut self) -> anyhow::Result<()> {
        let timeout = self.opts.ready_timeout;
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(child) = self.child.as_mut() {
                if let Some(status) = child.try_wait()? {
                    bail!(
                        "server exited with {status} before becoming ready\n--- log tail ---\n{}",
                        self.log_tail(LOG_TAIL_LINES)
                    );
                }
            } else {
                bail!("server is not running");
            }
            let last = match self.probe().await {
                Ok(()) => return Ok(()),
                Err(e) => format!("{e:#}"),
            };
            if Instant::now() >= deadline {
                bail!(
                    "server not ready within {timeout:?} (last probe: {last})\n--- log tail ---\n{}",
                    self.log_tail(LOG_TAIL_LINES)
                );
            }
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
    }

    async fn probe(&self) -> anyhow::Result<()> {
        let http_err = match self.http_get("/health").await {
            Ok(r) if r.status == 200 && r.body.contains(r#""health":"true""#) => return Ok(()),
            Ok(r) => anyhow::anyhow!("/health: {} {:?}", r.status, r.body),
            Err(e) => {
                // Nothing listening yet: no point trying gRPC on the same port.
                let refused = e.chain().any(|c| {
                    c.downcast_ref::<std::io::Error>()
                        .is_some_and(|io| io.kind() == std::io::ErrorKind::ConnectionRefused)
                });
                if refused {
                    return Err(e);
                }
                e
            }
        };
        if self.opts.require_health {
            return Err(http_err);
        }
        let mut opts = ConnectOptions::new()
            .with_connect_timeout(Duration::from_secs(1))
            .with_timeout(Duration::from_secs(1));
        if let Some(tls) = &self.opts.client_tls {
            opts = opts.with_tls(client_tls_options(tls));
        }
        let grpc = async {
            let mut client = Client::connect([self.endpoint()], Some(opts)).await?;
            let status = client.status().await?;
            anyhow::Ok(status.leader())
        };
        match tokio::time::timeout(Duration::from_secs(2), grpc).await {
            Ok(Ok(leader)) if leader != 0 => Ok(()),
            Ok(Ok(_)) => Err(http_err.context("gRPC Status: no leader")),
            Ok(Err(e)) => Err(http_err.context(format!("gRPC Status: {e:#}"))),
            Err(_) => Err(http_err.context("gRPC Status timed out")),
        }
    }

    /// Polls until the server process exits by itself and returns its status; an error if it is
    /// still running after `timeout` (it is left running) or was never started.
    pub async fn wait_exit(&mut self, timeout: Duration) -> anyhow::Result<ExitStatus> {
        let Some(child) = self.child.as_mut() else {
            bail!("server is not running");
        };
        match crate::poll::wait_child(child, timeout).await {
            Ok(status) => {
                self.child = None;
                Ok(status)
            }
            Err(e) => bail!(
                "server still running after {timeout:?} ({e:#})\n--- log tail ---\n{}",
                self.log_tail(LOG_TAIL_LINES)
            ),
        }
    }

    /// SIGKILLs the server and reaps it. No-op if it is not running.
    pub fn kill9(&mut self) -> anyhow::Result<()> {
        if let Some(mut child) = self.child.take() {
            if child.try_wait()?.is_none() {
                child.kill().context("SIGKILL")?;
            }
            child.wait().context("reaping killed server")?;
        }
        Ok(())
    }

    /// SIGTERMs the server and polls until it exits (10 s deadline, then SIGKILL and an
    /// error). Returns the exit status, or `None` if it was not running.
    pub async fn stop(&mut self) -> anyhow::Result<Option<ExitStatus>> {
        let Some(child) = self.child.as_mut() else {
            return Ok(None);
        };
        if let Some(status) = child.try_wait()? {
            self.child = None;
            return Ok(Some(status));
        }
        let pid = Pid::from_raw(i32::try_from(child.id()).context("pid out of range")?);
        kill(pid, Signal::SIGTERM).context("SIGTERM")?;
        match crate::poll::wait_child(child, Duration::from_secs(10)).await {
            Ok(status) => {
                self.child = None;
                Ok(Some(status))
            }
            Err(_) => {
                self.kill9()?;
                bail!(
                    "server did not exit within 10 s of SIGTERM (killed)\n--- log tail ---\n{}",
                    self.log_tail(LOG_TAIL_LINES)
                );
            }
        }
    }

    /// Runs `bin` from the next start on, on the same data dir, ports and flags: a member
    /// moved between etcd and etcd-rs.
    pub fn set_bin(&mut self, bin: &EtcdBin) {
        self.opts.bin = bin.clone();
    }

    /// Adds a setting (as [`MemberOpts::setting`]) for the next start, e.g. a recovery flag
    /// given to one restart.
    pub fn add_setting(&mut self, flag: impl Into<String>, value: impl Into<String>) {
        self.opts.settings.push((flag.into(), value.into()));
    }

    /// Drops every setting of `flag` added so far, for the next start.
    pub fn remove_setting(&mut self, flag: &str) {
        self.opts.settings.retain(|(f, _)| f != flag);
    }

    /// Starts the server again on the same data dir and ports and waits until ready. A running
    /// server is stopped first (SIGTERM).
    pub async fn restart(&mut self) -> anyhow::Result<()> {
        self.stop().await?;
        self.launch()?;
        self.wait_ready().await
    }

    /// The standard configuration as `(flag, value)` pairs.
    fn config(&self) -> Vec<(String, String)> {
        let name = self.opts.cluster_name().to_owned();
        let client_url = self.endpoint();
        let peer_url = self.peer_url();
        let advertised = self
            .opts
            .advertise_peer_urls
            .clone()
            .unwrap_or_else(|| peer_url.clone());
        let initial_cluster = match &self.opts.initial_cluster {
            InitialCluster::Own => format!("{name}={advertised}"),
            InitialCluster::WithPeers(peers) => std::iter::once(format!("{name}={advertised}"))
                .chain(peers.iter().map(|(n, u)| format!("{n}={u}")))
                .collect::<Vec<_>>()
                .join(","),
            InitialCluster::Exact(s) => s.clone(),
        };
        let mut config: Vec<(String, String)> = Vec::new();
        if let Some(n) = &self.opts.name {
            config.push(("name".to_owned(), n.clone()));
        }
        for (flag, value) in [
            ("data-dir", self.data_dir.display().to_string()),
            ("listen-client-urls", client_url.clone()),
            ("advertise-client-urls", client_url),
            ("listen-peer-urls", peer_url),
            ("initial-advertise-peer-urls", advertised),
            ("initial-cluster", initial_cluster),
        ] {
            config.push((flag.to_owned(), value));
        }
        if let Some(token) = &self.opts.token {
            config.push(("initial-cluster-token".to_owned(), token.clone()));
        }
        if let Some(tls) = &self.opts.client_tls {
            config.push((
                "cert-file".to_owned(),
                tls.server.cert.display().to_string(),
            ));
            config.push(("key-file".to_owned(), tls.server.key.display().to_string()));
            // etcd requires client certificates whenever it has a trusted CA: pass it only
            // with client-certificate auth.
            if tls.client_cert_auth {
                config.push((
                    "trusted-ca-file".to_owned(),
                    tls.ca_file.display().to_string(),
                ));
                config.push(("client-cert-auth".to_owned(), "true".to_owned()));
            }
        }
        if self.opts.peer_auto_tls {
            config.push(("peer-auto-tls".to_owned(), "true".to_owned()));
        }
        if let Some(tls) = &self.opts.peer_tls {
            config.push((
                "peer-cert-file".to_owned(),
                tls.cert.cert.display().to_string(),
            ));
            config.push((
                "peer-key-file".to_owned(),
                tls.cert.key.display().to_string(),
            ));
            // An empty CA path: no --peer-trusted-ca-file (peers are checked against the
            // system's roots).
            if !tls.ca_file.as_os_str().is_empty() {
                config.push((
                    "peer-trusted-ca-file".to_owned(),
                    tls.ca_file.display().to_string(),
                ));
            }
            if tls.client_cert_auth {
                config.push(("peer-client-cert-auth".to_owned(), "true".to_owned()));
            }
        }
        config.extend(self.opts.settings.iter().cloned());
        config
    }

    pub(crate) fn launch(&mut self) -> anyhow::Result<()> {
        let mut args: Vec<String> = Vec::new();
        let mut env: Vec<(String, String)> = Vec::new();
        for (flag, value) in self.config() {
            if self.opts.via_env {
                env.push((
                    format!("ETCD_{}", flag.replace('-', "_").to_uppercase()),
                    value,
                ));
            } else if value == "true" || value == "false" {
                // Go's boolean flags take their value only in the `--flag=value` form.
                args.push(format!("--{flag}={value}"));
            } else {
                args.extend([format!("--{flag}"), value]);
            }
        }
        args.extend(self.opts.args.iter().cloned());
        env.extend(self.opts.env.iter().cloned());

        let mut log = OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log_path)
            .with_context(|| format!("opening {}", self.log_path.display()))?;
        self.starts += 1;
        let env_text: Vec<String> = env.iter().map(|(k, v)| format!("{k}={v} ")).collect();
        writeln!(
            log,
            "=== etcdrs-testkit: start #{} {}{} {} ===",
            self.starts,
            env_text.concat(),
            self.opts.bin.path().display(),
            args.join(" ")
        )?;
        log.flush()?;
        self.log_offset = log.metadata()?.len();
        let stderr: File = log.try_clone()?;
        let mut cmd = Command::new(self.opts.bin.path());
        // An inherited ETCD_* variable would change the configuration, and etcd exits when one
        // shadows a flag given on the command line.
        for (key, _) in std::env::vars_os() {
            if key.to_string_lossy().starts_with("ETCD_") {
                cmd.env_remove(key);
            }
        }
        let child = cmd
            .args(&args)
            .envs(env)
            .current_dir(&self.root)
            .stdin(Stdio::null())
            .stdout(log)
            .stderr(stderr)
            .spawn()
            .with_context(|| format!("spawning {}", self.opts.bin.path().display()))?;
        self.child = Some(child);
        Ok(())
    }
}

/// etcd-client TLS options for a member's [`ClientTls`].
fn client_tls_options(tls: &ClientTls) -> TlsOptions {
    let mut options = TlsOptions::new();
    if let Ok(ca) = std::fs::read(&tls.ca_file) {
        options = options.ca_certificate(Certificate::from_pem(ca));
    }
    if let Some(client) = &tls.client
        && let (Ok(cert), Ok(key)) = (std::fs::read(&client.cert), std::fs::read(&client.key))
    {
        options = options.identity(Identity::from_pem(cert, key));
    }
    options
}

impl Drop for Member {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
        if std::env::var_os("ETCDRS_TEST_KEEP").is_some()
            && let Some(dir) = self.dir.take()
        {
            let kept = dir.keep();
            eprintln!("etcdrs-testkit: kept member dir {}", kept.display());
        }
    }
}
