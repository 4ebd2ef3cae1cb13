//! A cluster whose peer traffic goes through fault-injecting relays, for partition tests.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use anyhow::{Context, bail};
use etcd_client::{Client, ConnectOptions};

use crate::bin::EtcdBin;
use crate::cluster::Cluster;
use crate::etcdctl::Etcdctl;
use crate::member::{Member, MemberOpts, PORT_ATTEMPTS};
use crate::poll::poll_until;
use crate::ports;
use crate::relay::Relay;

/// How long [`RelayedCluster::leader`] polls for a leader.
const LEADER_TIMEOUT: Duration = Duration::from_secs(20);
/// How long [`RelayedCluster::start`] waits for every member to be healthy.
const READY_TIMEOUT: Duration = Duration::from_secs(20);

/// `n` members, like [`Cluster`], whose peers reach each other only through [`Relay`]s.
///
/// Member `i` is `m<i>` on `127.0.0.<i + 2>` ([`Cluster::name`], [`Cluster::host`]) and listens for
/// peers on its own port (`--listen-peer-urls`), but advertises relay `i`
/// (`--initial-advertise-peer-urls` and its `--initial-cluster` entry are the relay's URL), so
/// every connection another member dials to it goes through relay `i`. Fast timers, a unique
/// token; started in parallel and ready when every `/health` is true. Client traffic is direct.
///
/// [`RelayedCluster::isolate`] cuts one member off from the others in both directions;
/// [`RelayedCluster::heal`] ends every partition. Dropping the cluster SIGKILLs the members,
/// then stops the relays.
#[derive(Debug)]
pub struct RelayedCluster {
    members: Vec<Member>,
    relays: Vec<Relay>,
    token: String,
    initial_cluster: String,
}

impl RelayedCluster {
    /// Starts `n` members with `args` appended to the standard flags and waits until every one
    /// is healthy. Retried on fresh ports if a port was taken after we checked it.
    pub async fn start(n: usize, bin: &EtcdBin, args: &[&str]) -> anyhow::Result<Self> {
        let mut last_err = None;
        for _ in 0..PORT_ATTEMPTS {
            let mut cluster = Self::spawn(n, bin, args)?;
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

    fn spawn(n: usize, bin: &EtcdBin, args: &[&str]) -> anyhow::Result<Self> {
        static SEQ: AtomicU64 = AtomicU64::new(0);
        let nanos = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.subsec_nanos())
            .unwrap_or_default();
        let token = format!(
            "etcdrs-relayed-{}-{}-{nanos}",
            std::process::id(),
            SEQ.fetch_add(1, Ordering::Relaxed)
        );
        let mut ports_and_relays = Vec::with_capacity(n);
        for i in 0..n {
            let host = Cluster::host(i);
            let client = ports::reserve_on(host)?;
            let peer = ports::reserve_on(host)?;
            let relay = Relay::start(host, SocketAddr::from((host, peer.port())))?;
            ports_and_relays.push((client, peer, relay));
        }
        let initial_cluster = ports_and_relays
            .iter()
            .enumerate()
            .map(|(i, (_, _, relay))| format!("{}={}", Cluster::name(i), relay.url()))
            .collect::<Vec<_>>()
            .join(",");
        let mut members = Vec::with_capacity(n);
        let mut relays = Vec::with_capacity(n);
        for (i, (client, peer, relay)) in ports_and_relays.into_iter().enumerate() {
            let opts = MemberOpts::new(bin)
                .name(Cluster::name(i))
                .host(Cluster::host(i))
                .initial_cluster(initial_cluster.clone())
                .initial_advertise_peer_urls(relay.url())
                .initial_cluster_token(token.clone())
                .fast_timers()
                .require_health()
                .ready_timeout(READY_TIMEOUT)
                .args(args.iter().copied());
            members.push(Member::spawn_on(opts, client, peer)?);
            relays.push(relay);
        }
        Ok(Self {
            members,
            relays,
            token,
            initial_cluster,
        })
    }

    /// Polls every running member in parallel until all are healthy.
    pub async fn wait_ready(&mut self) -> anyhow::Result<()> {
        crate::cluster::wait_all_ready(&mut self.members).await
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

    /// Member `i`, mutably.
    pub fn member_mut(&mut self, i: usize) -> &mut Member {
        &mut self.members[i]
    }

    /// The relay in front of member `i`'s peer port.
    pub fn relay(&self, i: usize) -> &Relay {
        &self.relays[i]
    }

    /// Member `i`'s advertised peer URL: its relay's URL.
    pub fn peer_url(&self, i: usize) -> String {
        self.relays[i].url()
    }

    /// The client URL of every member, by index.
    pub fn endpoints(&self) -> Vec<String> {
        self.members.iter().map(Member::endpoint).collect()
    }

    /// The `--initial-cluster-token` of every member.
    pub fn token(&self) -> &str {
        &self.token
    }

    /// The `--initial-cluster` of every member (relay URLs).
    pub fn initial_cluster(&self) -> &str {
        &self.initial_cluster
    }

    /// An [`Etcdctl`] runner with `--endpoints` listing every member.
    pub fn etcdctl(&self) -> Etcdctl {
        Etcdctl::new(self.endpoints().join(","))
    }

    /// An `etcd_client::Client` connected to every member's endpoint (connect timeout 5 s,
    /// per-request timeout 10 s).
    pub async fn client(&self) -> anyhow::Result<Client> {
        let opts = ConnectOptions::new()
            .with_connect_timeout(Duration::from_secs(5))
            .with_timeout(Duration::from_secs(10));
        Client::connect(self.endpoints(), Some(opts))
            .await
            .with_context(|| format!("connecting etcd-client to {:?}", self.endpoints()))
    }

    /// Index of the leader: polls (20 s) the running members' Maintenance `Status` until one
    /// reports itself as the leader.
    pub async fn leader(&self) -> anyhow::Result<usize> {
        poll_until(LEADER_TIMEOUT, || async {
            let mut seen = Vec::new();
            for (i, m) in self.members.iter().enumerate() {
                if m.pid().is_none() {
                    continue;
                }
                match status(m).await {
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

    /// Cuts member `i` off from every other member, both ways: relay `i` drops and refuses
    /// every connection (nobody reaches `i`), and every other relay drops and refuses the
    /// connections member `i`'s process dials (`i` reaches nobody). Its client port stays
    /// reachable. Lasts until [`RelayedCluster::heal`]; a restarted process (new pid) is not
    /// cut off from the others' relays.
    pub fn isolate(&self, i: usize) -> anyhow::Result<()> {
        let Some(pid) = self.members[i].pid() else {
            bail!("member {i} is not running");
        };
        self.relays[i].block();
        for (j, relay) in self.relays.iter().enumerate() {
            if j != i {
                relay.block_from(pid);
            }
        }
        Ok(())
    }

    /// Ends every partition: all relays forward again.
    pub fn heal(&self) {
        self.relays.iter().for_each(Relay::heal);
    }

    /// The last lines of every member's log, each under a header, for failure messages.
    pub fn log_tails(&self) -> String {
        self.members
            .iter()
            .enumerate()
            .map(|(i, m)| format!("--- m{i} log tail ---\n{}\n", m.log_tail(30)))
            .collect()
    }
}

/// `(member_id, leader)` from one member's Maintenance `Status` (1 s timeouts).
async fn status(m: &Member) -> anyhow::Result<(u64, u64)> {
    let opts = ConnectOptions::new()
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
