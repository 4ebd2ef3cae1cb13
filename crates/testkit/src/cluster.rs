//! A multi-member cluster of real server processes, bootstrapped statically from
//! `--initial-cluster` the way etcd's clustering guide does it.

use std::net::Ipv4Addr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use anyhow::{Context, bail};
use etcd_client::Client;

use crate::bin::EtcdBin;
use crate::etcdctl::Etcdctl;
use crate::member::{ClientTls, Member, MemberOpts, PORT_ATTEMPTS, PeerTls};
use crate::poll::poll_until;
use crate::ports::{self, PortLease};

/// How long [`Cluster::leader`] polls for a leader.
const LEADER_TIMEOUT: Duration = Duration::from_secs(20);
/// Lines of each member's log in [`Cluster::log_tails`] errors.
const LOG_TAIL_LINES: usize = 30;

/// How to start a [`Cluster`]. Built with chained setters:
///
/// ```no_run
/// # fn demo(bin: &etcdrs_testkit::EtcdBin) {
/// use etcdrs_testkit::ClusterOpts;
/// let opts = ClusterOpts::new(bin).via_env().args(["--snapshot-count", "100"]);
/// # }
/// ```
#[derive(Clone, Debug)]
pub struct ClusterOpts {
    bin: EtcdBin,
    token: Option<String>,
    fast_timers: bool,
    via_env: bool,
    args: Vec<String>,
    env: Vec<(String, String)>,
    ready_timeout: Duration,
    client_tls: Option<ClientTls>,
    peer_tls: Option<PeerTls>,
    peer_auto_tls: bool,
}

impl ClusterOpts {
    /// Defaults: a token unique to this cluster, fast timers ([`MemberOpts::fast_timers`]),
    /// configuration as flags, no extra args or env, 20 s readiness deadline.
    pub fn new(bin: &EtcdBin) -> Self {
        Self {
            bin: bin.clone(),
            token: None,
            fast_timers: true,
            via_env: false,
            args: Vec::new(),
            env: Vec::new(),
            ready_timeout: Duration::from_secs(20),
            client_tls: None,
            peer_tls: None,
            peer_auto_tls: false,
        }
    }

    /// Members talk to each other over TLS with self-signed certificates
    /// ([`MemberOpts::peer_auto_tls`]).
    pub fn peer_auto_tls(mut self) -> Self {
        self.peer_auto_tls = true;
        self
    }

    /// Every member serves clients over TLS with these files ([`MemberOpts::client_tls`]); the
    /// server certificate must be valid for every member's address (e.g.
    /// `TestCa::issue_loopback`).
    pub fn client_tls(mut self, tls: ClientTls) -> Self {
        self.client_tls = Some(tls);
        self
    }

    /// Members talk to each other over TLS with these files ([`MemberOpts::peer_tls`]).
    pub fn peer_tls(mut self, tls: PeerTls) -> Self {
        self.peer_tls = Some(tls);
        self
    }

    /// `--initial-cluster-token` for every member (default: unique per [`Cluster::start`]).
    pub fn token(mut self, token: impl Into<String>) -> Self {
        self.token = Some(token.into());
        self
    }

    /// Keep the server's default `--heartbeat-interval` and `--election-timeout`.
    pub fn default_timers(mut self) -> Self {
        self.fast_timers = false;
        self
    }

    /// Pass the whole standard configuration as `ETCD_*` variables ([`MemberOpts::via_env`]).
    pub fn via_env(mut self) -> Self {
        self.via_env = true;
        self
    }

    /// Appends one extra command-line argument for every member.
    pub fn arg(mut self, arg: impl Into<String>) -> Self {
        self.args.push(arg.into());
        self
    }

    /// Appends extra command-line arguments for every member.
    pub fn args<I, S>(mut self, args: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        self.args.extend(args.into_iter().map(Into::into));
        self
    }

    /// Sets an environment variable for every member.
    pub fn env(mut self, key: impl Into<String>, value: impl Into<String>) -> Self {
        self.env.push((key.into(), value.into()));
        self
    }

    /// How long [`Cluster::start`] and the restarts wait for every member to be healthy.
    pub fn ready_timeout(mut self, timeout: Duration) -> Self {
        self.ready_timeout = timeout;
        self
    }
}

/// A token no other cluster started by any test process uses.
fn unique_token() -> String {
    static SEQ: AtomicU64 = AtomicU64::new(0);
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or_default();
    format!(
        "etcdrs-test-{}-{}-{nanos}",
        std::process::id(),
        SEQ.fetch_add(1, Ordering::Relaxed)
    )
}

/// `n` members started from one static `--initial-cluster`.
///
/// Member `i` is named `m<i>` and listens on its own loopback address `127.0.0.<i + 2>`
/// ([`Cluster::host`]) with a client and a peer port from the testkit's port range. Every member
/// gets `--name --data-dir --listen-client-urls --advertise-client-urls --listen-peer-urls
/// --initial-advertise-peer-urls --initial-cluster --initial-cluster-token` (or the `ETCD_*`
/// variables, see [`ClusterOpts::via_env`]), fast timers unless disabled, then the extra args.
/// Members are started in parallel; the cluster is ready when every member's `/health` says
/// `true`. Dropping the cluster SIGKILLs every member.
#[derive(Debug)]
pub struct Cluster {
    opts: ClusterOpts,
    token: String,
    initial_cluster: String,
    members: Vec<Member>,
}

impl Cluster {
    /// The loopback address of member `i`: `127.0.0.<i + 2>`.
    pub fn host(i: usize) -> Ipv4Addr {
        let last = u8::try_from(i + 2).expect("member index below 254");
        Ipv4Addr::new(127, 0, 0, last)
    }

    /// The name of member `i`: `m<i>`.
    pub fn name(i: usize) -> String {
        format!("m{i}")
    }

    /// Starts `n` members in parallel and waits until every one is healthy.
    ///
    /// If a member fails because a port was taken after we checked it ("address already in use"
    /// in its log), the whole cluster is started again on fresh ports.
    pub async fn start(n: usize, opts: ClusterOpts) -> anyhow::Result<Cluster> {
        let mut last_err = None;
        for _ in 0..PORT_ATTEMPTS {
            let mut cluster = Self::spawn(n, opts.clone())?;
            match cluster.wait_ready().await {
                Ok(()) => return Ok(cluster),
                Err(e)
                    if cluster
                        .members
                        .iter()
                        .any(|m| m.current_log().contains("address already in use")) =>
                {
                    last_err = Some(e);
                }
                Err(e) => return Err(e),
            }
        }
        Err(last_err.unwrap_or_else(|| anyhow::anyhow!("no start attempt made")))
            .context("ports kept being taken")
    }

    /// Launches `n` members without waiting for them (see [`Cluster::wait_ready`]).
    pub fn spawn(n: usize, opts: ClusterOpts) -> anyhow::Result<Cluster> {
        let token = opts.token.clone().unwrap_or_else(unique_token);
        let leases: Vec<(PortLease, PortLease)> = (0..n)
            .map(|i| {
                Ok((
                    ports::reserve_on(Self::host(i))?,
                    ports::reserve_on(Self::host(i))?,
                ))
            })
            .collect::<anyhow::Result<_>>()?;
        let initial_cluster = leases
            .iter()
            .enumerate()
            .map(|(i, (_, peer))| {
                let scheme = if opts.peer_tls.is_some() || opts.peer_auto_tls {
                    "https"
                } else {
                    "http"
                };
                format!(
                    "{}={scheme}://{}:{}",
                    Self::name(i),
                    Self::host(i),
                    peer.port()
                )
            })
            .collect::<Vec<_>>()
            .join(",");
        let mut members = Vec::with_capacity(n);
        for (i, (client, peer)) in leases.into_iter().enumerate() {
            let mut member_opts = MemberOpts::new(&opts.bin)
                .name(Self::name(i))
                .host(Self::host(i))
                .initial_cluster(initial_cluster.clone())
                .initial_cluster_token(token.clone())
                .require_health()
                .ready_timeout(opts.ready_timeout)
                .args(opts.args.iter().cloned());
            if opts.fast_timers {
                member_opts = member_opts.fast_timers();
            }
            if let Some(tls) = &opts.client_tls {
                member_opts = member_opts.client_tls(tls.clone());
            }
            if let Some(tls) = &opts.peer_tls {
                member_opts = member_opts.peer_tls(tls.clone());
            }
            if opts.peer_auto_tls {
                member_opts = member_opts.peer_auto_tls();
            }
            if opts.via_env {
                member_opts = member_opts.via_env();
            }
            for (k, v) in &opts.env {
                member_opts = member_opts.env(k.clone(), v.clone());
            }
            members.push(Member::spawn_on(member_opts, client, peer)?);
        }
        Ok(Cluster {
            opts,
            token,
            initial_cluster,
            members,
        })
    }

    /// Polls every running member in parallel until all are healthy
    /// ([`Member::wait_ready`]); fails as soon as one fails.
    pub async fn wait_ready(&mut self) -> anyhow::Result<()> {
        wait_all_ready(&mut self.members).await
    }

    /// Number of members.
    pub fn len(&self) -> usize {
        self.members.len()
    }

    /// Whether the cluster has no members.
    pub fn is_empty(&self) -> bool {
        self.members.is_empty()
    }

    /// All members, by index.
    pub fn members(&self) -> &[Member] {
        &self.members
    }

    /// Member `i`.
    pub fn member(&self, i: usize) -> &Member {
        &self.members[i]
    }

    /// Member `i`, mutably (to stop or restart it directly).
    pub fn member_mut(&mut self, i: usize) -> &mut Member {
        &mut self.members[i]
    }

    /// The client URL of every member, by index (running or not).
    pub fn endpoints(&self) -> Vec<String> {
        self.members.iter().map(Member::endpoint).collect()
    }

    /// The `--initial-cluster-token` every member was started with.
    pub fn token(&self) -> &str {
        &self.token
    }

    /// The `--initial-cluster` every member was started with.
    pub fn initial_cluster(&self) -> &str {
        &self.initial_cluster
    }

    /// The options the cluster was started with.
    pub fn opts(&self) -> &ClusterOpts {
        &self.opts
    }

    /// Index of the leader: polls (20 s deadline) the running members' Maintenance `Status` until
    /// one reports itself as the leader (`leader == header.member_id`).
    pub async fn leader(&self) -> anyhow::Result<usize> {
        poll_until(LEADER_TIMEOUT, || async {
            let mut seen = Vec::new();
            for (i, m) in self.members.iter().enumerate() {
                if m.pid().is_none() {
                    continue;
                }
                match member_status(m).await {
                    Ok((id, leader)) if id == leader => return Ok(i),
                    Ok((_, leader)) => seen.push(format!("m{i}: leader {leader:x}")),
                    Err(e) => seen.push(format!("m{i}: {e:#}")),
                }
            }
            Err(format!(
                "no member reports itself leader ({})",
                seen.join("; ")
            ))
        })
        .await
    }

    /// SIGKILLs member `i` (no-op if it is not running).
    pub fn kill9(&mut self, i: usize) -> anyhow::Result<()> {
        self.members[i].kill9()
    }

    /// SIGKILLs every member.
    pub fn kill9_all(&mut self) -> anyhow::Result<()> {
        self.members.iter_mut().try_for_each(Member::kill9)
    }

    /// Starts member `i` again with the same flags, data dir and ports, and waits until it is
    /// healthy. A running member is stopped first (SIGTERM). A member that needs others to reach
    /// quorum only becomes healthy if enough of them run: to bring back a cluster whose members
    /// are all down, use [`Cluster::restart_all`].
    pub async fn restart(&mut self, i: usize) -> anyhow::Result<()> {
        self.members[i].restart().await
    }

    /// Starts every member that is not running again (same flags, data dirs and ports), in
    /// parallel, and waits until all are healthy.
    pub async fn restart_all(&mut self) -> anyhow::Result<()> {
        for m in &mut self.members {
            if !m.is_running() {
                m.kill9()?;
                m.launch()?;
            }
        }
        self.wait_ready().await
    }

    /// An `etcd_client::Client` connected to every member's endpoint (connect timeout 5 s,
    /// per-request timeout 10 s).
    pub async fn client(&self) -> anyhow::Result<Client> {
        let opts = self.members[0].connect_options(None);
        Client::connect(self.endpoints(), Some(opts))
            .await
            .with_context(|| format!("connecting etcd-client to {:?}", self.endpoints()))
    }

    /// An [`Etcdctl`] runner with `--endpoints` listing every member.
    pub fn etcdctl(&self) -> Etcdctl {
        let ctl = Etcdctl::new(self.endpoints().join(","));
        match &self.opts.client_tls {
            Some(tls) => ctl.with_tls(&tls.ca_file, tls.client.as_ref()),
            None => ctl,
        }
    }

    /// The last lines of every member's log, each under a header, for failure messages.
    pub fn log_tails(&self) -> String {
        self.members
            .iter()
            .enumerate()
            .map(|(i, m)| format!("--- m{i} log tail ---\n{}\n", m.log_tail(LOG_TAIL_LINES)))
            .collect()
    }
}

/// `(member_id, leader)` from one member's Maintenance `Status` (1 s timeouts).
async fn member_status(m: &Member) -> anyhow::Result<(u64, u64)> {
    let opts = m
        .connect_options(None)
        .with_connect_timeout(Duration::from_secs(1))
        .with_timeout(Duration::from_secs(1));
    let status = async {
        let mut client = Client::connect([m.endpoint()], Some(opts)).await?;
        let status = client.status().await?;
        let id = status.header().context("status has no header")?.member_id();
        anyhow::Ok((id, status.leader()))
    };
    match tokio::time::timeout(Duration::from_secs(2), status).await {
        Ok(r) => r,
        Err(_) => bail!("Status timed out"),
    }
}

/// Polls every running member of `members` in parallel until all are healthy
/// ([`Member::wait_ready`]); fails as soon as one fails, naming it.
pub(crate) async fn wait_all_ready(members: &mut [Member]) -> anyhow::Result<()> {
    let waits = members
        .iter_mut()
        .enumerate()
        .filter(|(_, m)| m.pid().is_some())
        .map(|(i, m)| async move {
            m.wait_ready()
                .await
                .with_context(|| format!("member {i} ({})", m.name()))
        });
    futures::future::try_join_all(waits).await?;
    Ok(())
}
