//! `etcd grpc-proxy start`: our proxy binary in front of our server and in front of etcd 3.4,
//! driven by the stock etcdctl and the etcd-client crate. Each test checks what the cluster
//! sees (its own metrics, its own keys) as well as what clients get.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use etcd_client::{
    Client, Compare, CompareOp, ConnectOptions, GetOptions, PutOptions, Txn, TxnOp, WatchOptions,
};
use etcdrs_testkit::certs::TestCa;
use etcdrs_testkit::ports::{PortLease, reserve};
use etcdrs_testkit::{
    Cluster, ClusterOpts, EtcdBin, Etcdctl, Member, MemberOpts, http_get, poll_until,
};
use tokio::process::{Child, Command};

/// Our binary: the proxy under test, always.
fn proxy_bin() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_etcd"))
}

/// The two clusters the proxy must work in front of: the server under test (ours, unless
/// `ETCDRS_TEST_ETCD_BIN` names another) and etcd 3.4.
fn backends() -> [EtcdBin; 2] {
    [crate::bin(), EtcdBin::at("/usr/bin/etcd")]
}

/// A running `etcd grpc-proxy start` process.
struct Proxy {
    child: Child,
    addr: String,
    metrics_addr: String,
    log: PathBuf,
    _dir: tempfile::TempDir,
    _ports: (PortLease, PortLease),
}

impl Proxy {
    /// Starts our proxy in front of `endpoints` with extra flags; waits until `/health` is OK.
    async fn start(endpoints: &[String], extra: &[&str]) -> anyhow::Result<Proxy> {
        Self::start_with(endpoints, extra, None).await
    }

    async fn start_with(
        endpoints: &[String],
        extra: &[&str],
        tls_ca: Option<&Path>,
    ) -> anyhow::Result<Proxy> {
        Self::start_env(endpoints, extra, tls_ca, &[]).await
    }

    /// [`Proxy::start_with`], with extra environment variables for the proxy process.
    async fn start_env(
        endpoints: &[String],
        extra: &[&str],
        tls_ca: Option<&Path>,
        env: &[(&str, String)],
    ) -> anyhow::Result<Proxy> {
        let mut proxy = Self::spawn(endpoints, extra, env)?;
        if tls_ca.is_none() {
            let metrics = proxy.metrics_addr.clone();
            let waited = poll_until(Duration::from_secs(10), || async {
                let resp = http_get(&metrics, "/health").await?;
                if resp.status == 200 {
                    Ok(())
                } else {
                    bail!("health {}: {}", resp.status, resp.body)
                }
            })
            .await;
            if let Err(e) = waited {
                let _ = proxy.child.start_kill();
                bail!("proxy not healthy: {e:#}\n{}", proxy.log_text());
            }
        }
        Ok(proxy)
    }

    /// Starts the proxy process without waiting for it to be healthy (it is not, in front of
    /// a cluster with password auth: its health read has no identity, as etcd's has none).
    fn spawn(
        endpoints: &[String],
        extra: &[&str],
        env: &[(&str, String)],
    ) -> anyhow::Result<Proxy> {
        Self::spawn_bin(&proxy_bin(), endpoints, extra, env)
    }

    /// Starts the proxy of another `etcd` binary (etcd 3.4's, for comparison) and waits until
    /// `/health` is OK.
    async fn start_bin(bin: &Path, endpoints: &[String]) -> anyhow::Result<Proxy> {
        let proxy = Self::spawn_bin(bin, endpoints, &[], &[])?;
        let metrics = proxy.metrics_addr.clone();
        poll_until(Duration::from_secs(10), || async {
            let resp = http_get(&metrics, "/health").await?;
            anyhow::ensure!(resp.status == 200, "health {}: {}", resp.status, resp.body);
            Ok(())
        })
        .await?;
        Ok(proxy)
    }

    fn spawn_bin(
        bin: &Path,
        endpoints: &[String],
        extra: &[&str],
        env: &[(&str, String)],
    ) -> anyhow::Result<Proxy> {
        let dir = tempfile::tempdir()?;
        let ports = (reserve()?, reserve()?);
        let addr = format!("127.0.0.1:{}", ports.0.port());
        let metrics_addr = format!("127.0.0.1:{}", ports.1.port());
        let log = dir.path().join("proxy.log");
        let file = std::fs::File::create(&log)?;
        let child = Command::new(bin)
            .args(["grpc-proxy", "start"])
            .arg(format!("--endpoints={}", endpoints.join(",")))
            .arg(format!("--listen-addr={addr}"))
            .arg(format!("--advertise-client-url={addr}"))
            .arg(format!("--metrics-addr=http://{metrics_addr}"))
            .args(extra)
            .envs(env.iter().map(|(k, v)| (*k, v.as_str())))
            .stdout(Stdio::null())
            .stderr(file)
            .kill_on_drop(true)
            .spawn()
            .context("spawn proxy")?;
        Ok(Proxy {
            child,
            addr,
            metrics_addr,
            log,
            _dir: dir,
            _ports: ports,
        })
    }

    fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    fn endpoint(&self) -> String {
        format!("http://{}", self.addr)
    }

    async fn client(&self) -> Client {
        let opts = ConnectOptions::new()
            .with_connect_timeout(Duration::from_secs(5))
            .with_timeout(Duration::from_secs(10));
        Client::connect([self.endpoint()], Some(opts))
            .await
            .expect("client connects to the proxy")
    }

    fn etcdctl(&self) -> Etcdctl {
        Etcdctl::new(self.endpoint())
    }

    /// A series of the proxy's own (`/proxy/metrics`; `/metrics` relays a member's).
    async fn metric(&self, name: &str) -> f64 {
        let body = http_get(&self.metrics_addr, "/proxy/metrics")
            .await
            .expect("proxy metrics")
            .body;
        metric_value(&body, name, None)
    }

    async fn kill(&mut self) {
        let _ = self.child.kill().await;
    }

    /// Reads `key` serializably through `client` until it reads `value` and the proxy's cache
    /// has answered a read since the call (its watch on the cluster is up only some time after
    /// the proxy starts; an answer is cached again only after a read that missed).
    async fn until_cached(&self, client: &Client, key: &str, value: &str) {
        let before = self.metric("etcd_grpc_proxy_cache_hits_total").await;
        poll_until(Duration::from_secs(10), || async {
            read_is(client, key, value).await?;
            let hits = self.metric("etcd_grpc_proxy_cache_hits_total").await;
            anyhow::ensure!(hits > before, "no cache hit yet");
            Ok(())
        })
        .await
        .expect("a read served from the cache");
    }
}

/// Reads `key` serializably through `client`; `Err` unless it reads `value`.
async fn read_is(client: &Client, key: &str, value: &str) -> anyhow::Result<()> {
    let got = client
        .clone()
        .get(key, Some(GetOptions::new().with_serializable()))
        .await?;
    anyhow::ensure!(
        got.kvs().first().map(|kv| kv.value()) == Some(value.as_bytes()),
        "stale or missing: {got:?}"
    );
    Ok(())
}

/// Reads `key` through the proxy until a value written around it (directly to the cluster)
/// shows: the cache may hold the old one only until its watch reports the write.
async fn until_fresh(client: &Client, key: &str, value: &str) {
    poll_until(Duration::from_secs(2), || read_is(client, key, value))
        .await
        .expect("fresh after a direct write");
}

/// The sum of the samples of `name` (with `label` in their labels, if given) in a scrape.
fn metric_value(body: &str, name: &str, label: Option<&str>) -> f64 {
    body.lines()
        .filter(|l| !l.starts_with('#'))
        .filter(|l| l.starts_with(name) && l[name.len()..].starts_with([' ', '{']))
        .filter(|l| label.is_none_or(|label| l.contains(label)))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

async fn member_metric(member: &Member, name: &str, label: Option<&str>) -> f64 {
    let body = member
        .http_get("/metrics")
        .await
        .expect("member metrics")
        .body;
    metric_value(&body, name, label)
}

/// Watchers the proxy holds on the cluster for itself: the range cache's invalidating watch and
/// the leader monitor's watch.
const PROXY_OWN_WATCHERS: f64 = 2.0;

/// Polls until the member counts `n` watchers (its own metric); `what` names the state.
async fn until_cluster_watchers(member: &Member, n: f64, what: &str) {
    poll_until(Duration::from_secs(5), || async {
        let have = member_metric(member, "etcd_debugging_mvcc_watcher_total", None).await;
        if have == n {
            Ok(())
        } else {
            Err(format!("{have} watchers"))
        }
    })
    .await
    .unwrap_or_else(|e| panic!("{what}: {e}"));
}

/// The next response of a watch stream (within 10 s).
async fn next(stream: &mut etcd_client::WatchStream) -> etcd_client::WatchResponse {
    tokio::time::timeout(Duration::from_secs(10), stream.message())
        .await
        .expect("watch response in time")
        .expect("watch stream ok")
        .expect("watch stream open")
}

async fn start_member(bin: &EtcdBin) -> Member {
    Member::start(MemberOpts::new(bin))
        .await
        .expect("member starts")
}

#[tokio::test]
async fn seed_commands_through_the_proxy() {
    for bin in backends() {
        let member = start_member(&bin).await;
        let proxy = Proxy::start(&[member.endpoint()], &[])
            .await
            .expect("proxy");
        let ctl = proxy.etcdctl();
        assert_eq!(ctl.ok(&["put", "foo", "bar"]).await.trim(), "OK");
        assert_eq!(ctl.ok(&["get", "foo"]).await, "foo\nbar\n");
        // Also with a scheme-less endpoint, as etcd's docs write it.
        let bare = Etcdctl::new(proxy.addr.clone());
        assert_eq!(
            bare.ok(&["get", "foo", "--print-value-only"]).await,
            "bar\n"
        );
        let table = ctl.ok(&["member", "list", "--write-out", "table"]).await;
        assert!(table.contains("CLIENT ADDRS"), "{table}");
        assert!(
            table.contains(&proxy.addr),
            "the proxy lists itself: {table}"
        );
        // The write reached the cluster.
        let mut direct = member.client().await.expect("direct client");
        let got = direct.get("foo", None).await.expect("direct get");
        assert_eq!(got.kvs()[0].value(), b"bar");
        // Every service answers through the proxy.
        let mut client = proxy.client().await;
        client.status().await.expect("maintenance status");
        let lease = client.lease_grant(30, None).await.expect("grant").id();
        let lock = client
            .lock(
                "seed-lock",
                Some(etcd_client::LockOptions::new().with_lease(lease)),
            )
            .await
            .expect("lock");
        assert!(lock.key().starts_with(b"seed-lock/"));
        client.unlock(lock.key()).await.expect("unlock");
        // v3election through the proxy: campaign, then the leader is the campaigner's value.
        let campaign = client
            .campaign("seed-election", "me", lease)
            .await
            .expect("campaign");
        let leader_key = campaign.leader().expect("a leader key").key().to_vec();
        let leader = client.leader("seed-election").await.expect("leader");
        assert_eq!(leader.kv().expect("the leader's kv").value(), b"me");
        client
            .resign(Some(
                etcd_client::ResignOptions::new().with_leader(
                    etcd_client::LeaderKey::new()
                        .with_name("seed-election")
                        .with_key(leader_key)
                        .with_lease(lease),
                ),
            ))
            .await
            .expect("resign");
        let txn = Txn::new()
            .when([Compare::value("foo", CompareOp::Equal, "bar")])
            .and_then([TxnOp::put("foo", "baz", None)]);
        assert!(client.txn(txn).await.expect("txn").succeeded());
    }
}

#[tokio::test]
async fn many_watchers_cost_the_cluster_one_watcher() {
    const CLIENTS: usize = 5;
    const PER_CLIENT: usize = 200;
    for bin in backends() {
        let member = start_member(&bin).await;
        let proxy = Proxy::start(&[member.endpoint()], &[])
            .await
            .expect("proxy");
        // The proxy's own watchers are there before clients come.
        until_cluster_watchers(&member, PROXY_OWN_WATCHERS, "the proxy's own watchers").await;
        let mut streams = Vec::new();
        let mut clients = Vec::new();
        for _ in 0..CLIENTS {
            let mut client = proxy.client().await;
            for _ in 0..PER_CLIENT {
                let mut stream = client.watch("hot", None).await.expect("watch");
                assert!(next(&mut stream).await.created());
                streams.push(stream);
            }
            clients.push(client);
        }
        let watchers = member_metric(&member, "etcd_debugging_mvcc_watcher_total", None).await;
        assert_eq!(
            watchers,
            PROXY_OWN_WATCHERS + 1.0,
            "{} c-watchers became one s-watcher",
            CLIENTS * PER_CLIENT
        );
        let coalescing = proxy
            .metric("etcd_grpc_proxy_watchers_coalescing_total")
            .await;
        assert_eq!(coalescing, (CLIENTS * PER_CLIENT - 1) as f64);
        let mut direct = member.client().await.expect("direct client");
        for i in 0..3 {
            direct.put("hot", format!("v{i}"), None).await.expect("put");
        }
        for stream in &mut streams {
            let mut got = Vec::new();
            while got.len() < 3 {
                let resp = tokio::time::timeout(Duration::from_secs(10), stream.message())
                    .await
                    .expect("events in time")
                    .expect("stream ok")
                    .expect("stream open");
                for event in resp.events() {
                    got.push(
                        event
                            .kv()
                            .expect("kv")
                            .value_str()
                            .expect("utf8")
                            .to_owned(),
                    );
                }
            }
            assert_eq!(got, ["v0", "v1", "v2"]);
        }
        drop(streams);
        drop(clients);
        // Clients gone: the s-watcher goes too.
        until_cluster_watchers(&member, PROXY_OWN_WATCHERS, "s-watcher released").await;
    }
}

#[tokio::test]
async fn watch_progress_and_compaction_pass_through() {
    for bin in backends() {
        let member = start_member(&bin).await;
        let proxy = Proxy::start(&[member.endpoint()], &[])
            .await
            .expect("proxy");
        let mut client = proxy.client().await;
        let first = client
            .put("w", "1", None)
            .await
            .expect("put")
            .header()
            .expect("h")
            .revision();
        client.put("w", "2", None).await.expect("put");
        // A watcher joining from history gets exactly the history it asked for.
        let mut live = client.watch("w", None).await.expect("live watch");
        assert!(next(&mut live).await.created());
        let mut old = client
            .watch("w", Some(WatchOptions::new().with_start_revision(first)))
            .await
            .expect("history watch");
        let mut seen = Vec::new();
        while seen.len() < 2 {
            let resp = old.message().await.expect("ok").expect("open");
            seen.extend(
                resp.events()
                    .iter()
                    .map(|e| e.kv().expect("kv").mod_revision()),
            );
        }
        assert_eq!(seen, [first, first + 1]);
        // RequestProgress is answered with the current revision.
        let rev = client
            .put("other", "x", None)
            .await
            .expect("put")
            .header()
            .expect("h")
            .revision();
        live.request_progress().await.expect("progress");
        let resp = tokio::time::timeout(Duration::from_secs(5), live.message())
            .await
            .expect("progress in time")
            .expect("ok")
            .expect("open");
        assert!(resp.events().is_empty());
        assert_eq!(
            resp.watch_id(),
            -1,
            "a stream-wide progress answer: {resp:?}"
        );
        assert!(resp.header().expect("h").revision() >= rev);
        // A watch from a compacted revision is cancelled with the compact revision.
        client.compact(rev, None).await.expect("compact");
        let mut compacted = client
            .watch("w", Some(WatchOptions::new().with_start_revision(first)))
            .await
            .expect("watch");
        let resp = tokio::time::timeout(Duration::from_secs(5), async {
            loop {
                let resp = compacted.message().await.expect("ok").expect("open");
                if resp.canceled() {
                    return resp;
                }
            }
        })
        .await
        .expect("cancel in time");
        assert_eq!(resp.compact_revision(), rev);
    }
}

#[tokio::test]
async fn keepalives_share_one_stream_and_leases_expire_at_their_ttl() {
    const CLIENTS: usize = 100;
    for bin in backends() {
        let member = start_member(&bin).await;
        let proxy = Proxy::start(&[member.endpoint()], &[])
            .await
            .expect("proxy");
        let label = Some("grpc_method=\"LeaseKeepAlive\"");
        let before = member_metric(&member, "grpc_server_started_total", label).await;
        let mut handles = Vec::new();
        for _ in 0..CLIENTS {
            let mut client = proxy.client().await;
            handles.push(tokio::spawn(async move {
                let lease = client.lease_grant(30, None).await.expect("grant").id();
                let (mut keeper, mut stream) = client.lease_keep_alive(lease).await.expect("ka");
                keeper.keep_alive().await.expect("send");
                let resp = stream.message().await.expect("ok").expect("answer");
                assert_eq!(resp.id(), lease);
                assert!(resp.ttl() > 0);
                (keeper, stream, client)
            }));
        }
        let mut alive = Vec::new();
        for h in handles {
            alive.push(h.await.expect("client task"));
        }
        let after = member_metric(&member, "grpc_server_started_total", label).await;
        assert_eq!(
            after - before,
            1.0,
            "{CLIENTS} keep-alive streams became one"
        );

        // One keep-alive, then the client closes its side: it still gets its answer.
        let mut client = proxy.client().await;
        let lease = client.lease_grant(3, None).await.expect("grant").id();
        let (mut keeper, mut stream) = client.lease_keep_alive(lease).await.expect("ka");
        keeper.keep_alive().await.expect("send");
        let sent = Instant::now();
        drop(keeper);
        let resp = stream
            .message()
            .await
            .expect("not cancelled")
            .expect("answer");
        assert_eq!(resp.ttl(), 3);
        // Nobody renews it since: it expires at its TTL, well before twice the TTL.
        poll_until(Duration::from_secs(6), || {
            let mut client = client.clone();
            async move {
                let ttl = client.lease_time_to_live(lease, None).await?.ttl();
                if ttl == -1 {
                    Ok(())
                } else {
                    Err(anyhow::anyhow!("ttl {ttl}"))
                }
            }
        })
        .await
        .expect("lease expires");
        assert!(
            sent.elapsed() < Duration::from_secs(6),
            "expired after {:?}",
            sent.elapsed()
        );
        drop(alive);
    }
}

#[tokio::test]
async fn the_cache_never_serves_a_value_written_directly_to_the_cluster_stale() {
    for bin in backends() {
        let member = start_member(&bin).await;
        let proxy = Proxy::start(&[member.endpoint()], &[])
            .await
            .expect("proxy");
        let mut client = proxy.client().await;
        let mut direct = member.client().await.expect("direct");
        direct.put("c", "old", None).await.expect("put");
        let serializable = || Some(GetOptions::new().with_serializable());
        proxy.until_cached(&client, "c", "old").await;
        assert!(proxy.metric("etcd_grpc_proxy_cache_keys_total").await >= 1.0);
        // Open-ended ranges are cached and invalidated too.
        let from_key = || Some(GetOptions::new().with_serializable().with_from_key());
        assert_eq!(
            client.get("c", from_key()).await.expect("get").kvs().len(),
            1
        );
        // Written around the proxy.
        direct.put("c", "new", None).await.expect("put");
        direct.put("d", "above", None).await.expect("put");
        // A linearizable read always goes to the cluster.
        let got = client.get("c", None).await.expect("get");
        assert_eq!(got.kvs()[0].value(), b"new");
        // The serializable one is corrected by the cache's watch, promptly.
        poll_until(Duration::from_secs(2), || {
            let mut client = client.clone();
            async move {
                let got = client.get("c", serializable()).await?;
                let n = client.get("c", from_key()).await?.kvs().len();
                if got.kvs()[0].value() == b"new" && n == 2 {
                    Ok(())
                } else {
                    Err(anyhow::anyhow!("stale: {:?} {n}", got.kvs()[0].value_str()))
                }
            }
        })
        .await
        .expect("fresh value");
        // And stays fresh.
        for _ in 0..5 {
            let got = client.get("c", serializable()).await.expect("get");
            assert_eq!(got.kvs()[0].value(), b"new");
        }
    }
}

#[tokio::test]
async fn namespace_confines_clients_to_the_prefix() {
    let bin = &backends()[0];
    let member = start_member(bin).await;
    let mut direct = member.client().await.expect("direct");
    direct.put("secret", "outside", None).await.expect("put");
    direct
        .put("ns0", "just past the prefix", None)
        .await
        .expect("put");
    let proxy = Proxy::start(&[member.endpoint()], &["--namespace=ns/"])
        .await
        .expect("proxy");
    let mut client = proxy.client().await;
    client.put("a", "inside", None).await.expect("put");
    let got = direct.get("ns/a", None).await.expect("get");
    assert_eq!(got.kvs()[0].value(), b"inside");
    // Open ranges, from "\0" and from a key, see only the namespace, without its prefix.
    let all = client
        .get("\0", Some(GetOptions::new().with_all_keys()))
        .await
        .expect("all");
    assert_eq!(crate::keys(all.kvs()), ["a"]);
    let from = client
        .get("a", Some(GetOptions::new().with_from_key()))
        .await
        .expect("from key");
    assert_eq!(crate::keys(from.kvs()), ["a"]);
    // A txn comparing an outside key sees a missing key in the namespace.
    let txn = Txn::new()
        .when([Compare::value("secret", CompareOp::Equal, "outside")])
        .and_then([TxnOp::put("won", "yes", None)])
        .or_else([TxnOp::get("secret", None)]);
    let resp = client.txn(txn).await.expect("txn");
    assert!(!resp.succeeded());
    // prev_kv comes back without the prefix.
    let put = client
        .put("a", "again", Some(PutOptions::new().with_prev_key()))
        .await
        .expect("put");
    assert_eq!(put.prev_key().expect("prev").key(), b"a");
    // Watching everything sees only the namespace.
    let mut stream = client
        .watch("\0", Some(WatchOptions::new().with_all_keys()))
        .await
        .expect("watch");
    assert!(next(&mut stream).await.created());
    direct.put("secret", "changed", None).await.expect("put");
    direct.put("ns/b", "inside", None).await.expect("put");
    let resp = tokio::time::timeout(Duration::from_secs(5), stream.message())
        .await
        .expect("event in time")
        .expect("ok")
        .expect("open");
    assert_eq!(
        crate::keys(
            &resp
                .events()
                .iter()
                .filter_map(|e| e.kv().cloned())
                .collect::<Vec<_>>()
        ),
        ["b"]
    );
    // A lease's attached keys: only those inside the namespace, without the prefix.
    let lease = client.lease_grant(60, None).await.expect("grant").id();
    client
        .put("leased", "1", Some(PutOptions::new().with_lease(lease)))
        .await
        .expect("put");
    direct
        .put(
            "leased-outside",
            "1",
            Some(PutOptions::new().with_lease(lease)),
        )
        .await
        .expect("put");
    let ttl = client
        .lease_time_to_live(
            lease,
            Some(etcd_client::LeaseTimeToLiveOptions::new().with_keys()),
        )
        .await
        .expect("ttl");
    assert_eq!(ttl.keys(), [b"leased".to_vec()]);
    // Deleting everything deletes only the namespace.
    client
        .delete(
            "\0",
            Some(etcd_client::DeleteOptions::new().with_all_keys()),
        )
        .await
        .expect("delete");
    assert_eq!(
        crate::dump(&mut direct).await,
        [
            ("leased-outside".to_owned(), "1".to_owned()),
            ("ns0".to_owned(), "just past the prefix".to_owned()),
            ("secret".to_owned(), "changed".to_owned())
        ]
    );
}

#[tokio::test]
async fn clients_continue_when_the_proxys_backend_dies() {
    let mut cluster = Cluster::start(3, ClusterOpts::new(&backends()[0]))
        .await
        .expect("cluster");
    let proxy = Proxy::start(&cluster.endpoints(), &[])
        .await
        .expect("proxy");
    let mut client = proxy.client().await;
    client.put("k", "before", None).await.expect("put");
    let mut stream = client.watch("k", None).await.expect("watch");
    assert!(next(&mut stream).await.created());
    // The member the proxy talks to answers Status.
    let serving = client
        .status()
        .await
        .expect("status")
        .header()
        .expect("h")
        .member_id();
    let mut victim = None;
    for i in 0..cluster.len() {
        let mut direct = cluster.member(i).client().await.expect("direct");
        let id = direct
            .status()
            .await
            .expect("status")
            .header()
            .expect("h")
            .member_id();
        if id == serving {
            victim = Some(i);
        }
    }
    let victim = victim.expect("the proxy's member is one of the cluster's");
    cluster.kill9(victim).expect("kill");
    poll_until(Duration::from_secs(15), || {
        let mut client = client.clone();
        async move { client.put("k", "after", None).await }
    })
    .await
    .expect("writes continue through another member");
    let value = tokio::time::timeout(Duration::from_secs(10), async {
        loop {
            let resp = stream.message().await.expect("ok").expect("open");
            if let Some(e) = resp.events().last() {
                return e.kv().expect("kv").value().to_vec();
            }
        }
    })
    .await
    .expect("the watch continues");
    assert_eq!(value, b"after");
    let now = client
        .status()
        .await
        .expect("status")
        .header()
        .expect("h")
        .member_id();
    assert_ne!(now, serving);
}

#[tokio::test]
async fn registered_proxies_are_the_member_list_and_leave_after_their_ttl() {
    let member = start_member(&backends()[0]).await;
    let flags = ["--resolver-prefix=proxies", "--resolver-ttl=2"];
    let a = Proxy::start(&[member.endpoint()], &flags)
        .await
        .expect("proxy a");
    let mut b = Proxy::start(&[member.endpoint()], &flags)
        .await
        .expect("proxy b");
    let mut client = a.client().await;
    let listed = |mut client: Client| async move {
        let members = client.member_list().await?;
        let mut urls: Vec<String> = members
            .members()
            .iter()
            .flat_map(|m| m.client_urls().to_vec())
            .collect();
        urls.sort();
        anyhow::Ok(urls)
    };
    let mut both = vec![a.addr.clone(), b.addr.clone()];
    both.sort();
    poll_until(Duration::from_secs(5), || {
        let client = client.clone();
        let both = both.clone();
        async move {
            let urls = listed(client).await?;
            if urls == both {
                Ok(())
            } else {
                Err(anyhow::anyhow!("{urls:?}"))
            }
        }
    })
    .await
    .expect("both proxies listed");
    b.kill().await;
    let killed = Instant::now();
    poll_until(Duration::from_secs(8), || {
        let client = client.clone();
        let a = a.addr.clone();
        async move {
            let urls = listed(client).await?;
            if urls == [a] {
                Ok(())
            } else {
                Err(anyhow::anyhow!("{urls:?}"))
            }
        }
    })
    .await
    .expect("the dead proxy leaves");
    assert!(
        killed.elapsed() >= Duration::from_millis(500),
        "it left by its lease, not at once"
    );
    let table = a.etcdctl().ok(&["member", "list", "-w", "table"]).await;
    assert!(table.contains(&a.addr), "{table}");
    client.put("still", "works", None).await.expect("put");
}

#[tokio::test]
async fn health_and_metrics_over_http1_on_both_listeners() {
    let member = start_member(&backends()[0]).await;
    let proxy = Proxy::start(&[member.endpoint()], &[])
        .await
        .expect("proxy");
    for addr in [&proxy.addr, &proxy.metrics_addr] {
        let health = http_get(addr, "/health").await.expect("health");
        assert_eq!(health.status, 200);
        assert_eq!(health.json().expect("json")["health"], "true");
        let metrics = http_get(addr, "/proxy/metrics").await.expect("metrics");
        assert_eq!(metrics.status, 200);
        for name in [
            "etcd_grpc_proxy_cache_hits_total",
            "etcd_grpc_proxy_cache_misses_total",
            "etcd_grpc_proxy_cache_keys_total",
            "etcd_grpc_proxy_watchers_coalescing_total",
            "etcd_grpc_proxy_events_coalescing_total",
        ] {
            assert!(metrics.body.contains(name), "{name} missing on {addr}");
        }
    }
    // With the cluster gone, the proxy reports unhealthy.
    drop(member);
    poll_until(Duration::from_secs(10), || async {
        let health = http_get(&proxy.metrics_addr, "/health").await?;
        if health.status == 503 {
            Ok(())
        } else {
            Err(anyhow::anyhow!("{}", health.status))
        }
    })
    .await
    .expect("unhealthy without a cluster");
}

#[tokio::test]
async fn flags_help_and_errors_read_as_etcds() {
    async fn run(bin: &Path, args: &[&str]) -> (Option<i32>, String, String) {
        let out = Command::new(bin).args(args).output().await.expect("run");
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    }
    for args in [
        &["grpc-proxy"][..],
        &["grpc-proxy", "start", "--help"],
        &["grpc-proxy", "start", "--foo"],
        &["grpc-proxy", "start", "--resolver-ttl", "abc"],
        &["grpc-proxy", "start", "--resolver-prefix", "x"],
        &["grpc-proxy", "start", "--resolver-ttl", "3"],
        &["grpc-proxy", "start", "--endpoints"],
    ] {
        let ours = run(&proxy_bin(), args).await;
        let etcd = run(Path::new("/usr/bin/etcd"), args).await;
        assert_eq!(ours, etcd, "etcd {args:?}");
    }
    // A taken port: a plain error and exit 1, before anything else.
    let taken = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let addr = format!("--listen-addr={}", taken.local_addr().expect("addr"));
    let args = ["grpc-proxy", "start", addr.as_str()];
    let ours = run(&proxy_bin(), &args).await;
    let etcd = run(Path::new("/usr/bin/etcd"), &args).await;
    assert_eq!(ours, etcd);
    assert_eq!(ours.0, Some(1));
}

/// issue 40: `--namespace` given bytes that are not UTF-8 panicked in `main`
/// (`std::env::args`); so did any environment variable that is not UTF-8 (`std::env::vars`).
/// Now the proxy prefixes keys with those bytes, as etcd's does (Go takes any bytes); another
/// proxy flag given such bytes is refused with pflag's error; the member and its other
/// subcommands refuse such an argument with one line; a variable that is not ours is ignored,
/// and a member's `ETCD_*` that is not UTF-8 is refused with one line.
#[tokio::test]
async fn arguments_and_environment_that_are_not_utf8_never_panic() {
    use std::ffi::OsStr;
    use std::os::unix::ffi::OsStrExt;
    let raw = OsStr::from_bytes(b"ns-\xff\xfe/");

    // The proxy serves under the raw namespace.
    let member = start_member(&crate::bin()).await;
    let ports = (reserve().expect("port"), reserve().expect("port"));
    let addr = format!("127.0.0.1:{}", ports.0.port());
    let metrics = format!("127.0.0.1:{}", ports.1.port());
    let mut child = Command::new(proxy_bin())
        .args(["grpc-proxy", "start"])
        .arg(format!("--endpoints={}", member.endpoint()))
        .arg(format!("--listen-addr={addr}"))
        .arg(format!("--metrics-addr=http://{metrics}"))
        .arg("--namespace")
        .arg(raw)
        .env("ETCDRS_UNRELATED", raw)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .expect("spawn proxy");
    poll_until(Duration::from_secs(10), || async {
        let resp = http_get(&metrics, "/health").await?;
        anyhow::ensure!(resp.status == 200, "health {}: {}", resp.status, resp.body);
        Ok(())
    })
    .await
    .expect("the proxy serves");
    let opts = ConnectOptions::new().with_connect_timeout(Duration::from_secs(5));
    let mut through = Client::connect([format!("http://{addr}")], Some(opts))
        .await
        .expect("client of the proxy");
    through
        .put("k", "v", None)
        .await
        .expect("put through the proxy");
    let got = through.get("k", None).await.expect("get through the proxy");
    assert_eq!(got.kvs().first().map(|kv| kv.value()), Some(&b"v"[..]));
    let mut direct = member.client().await.expect("client of the member");
    let got = direct
        .get(&b"ns-\xff\xfe/k"[..], None)
        .await
        .expect("get from the member");
    assert_eq!(got.kvs().first().map(|kv| kv.value()), Some(&b"v"[..]));
    let _ = child.start_kill();

    // Another proxy flag given such bytes: pflag's refusal, exit 1.
    let out = Command::new(proxy_bin())
        .args(["grpc-proxy", "start", "--data-dir"])
        .arg(raw)
        .stdin(Stdio::null())
        .output()
        .await
        .expect("run");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
    assert!(
        stderr.starts_with(
            "Error: invalid argument \"ns-\u{fffd}\u{fffd}/\" for \"--data-dir\" flag: not valid UTF-8"
        ),
        "{stderr}"
    );

    // The member takes its flags as UTF-8: one line, exit 1.
    let out = Command::new(proxy_bin())
        .arg("--name")
        .arg(raw)
        .stdin(Stdio::null())
        .output()
        .await
        .expect("run");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
    assert_eq!(stderr.trim_end().lines().count(), 1, "{stderr}");
    assert!(
        stderr.starts_with("invalid argument \"ns-\u{fffd}\u{fffd}/\": not valid UTF-8"),
        "{stderr}"
    );

    // A variable that is not etcd's, not UTF-8: nothing to say about it.
    let out = Command::new(proxy_bin())
        .arg("--version")
        .env("ETCDRS_UNRELATED", raw)
        .output()
        .await
        .expect("run");
    assert!(out.status.success(), "{:?}", out);
    assert!(String::from_utf8_lossy(&out.stdout).contains("etcd Version:"));

    // A member's ETCD_* that is not UTF-8: one line, exit 1, before anything starts.
    let dir = tempfile::tempdir().expect("dir");
    let out = Command::new(proxy_bin())
        .arg("--data-dir")
        .arg(dir.path().join("m"))
        .env("ETCD_NAME", raw)
        .stdin(Stdio::null())
        .output()
        .await
        .expect("run");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
    assert_eq!(
        stderr.trim_end(),
        "invalid environment variable ETCD_NAME: its value is not valid UTF-8 (etcd-rs reads ETCD_* as UTF-8)"
    );
    assert!(!dir.path().join("m").exists());
}

/// issue 40: a prefix claiming 4 GiB on a stream left open is refused from the prefix alone,
/// on the proxy's cached-range path as on tonic's, as etcd 3.4's proxy refuses it (its
/// `--max-recv-bytes` is 2 GiB - 1 by default).
#[tokio::test]
async fn a_prefix_claiming_4_gib_is_refused_before_its_body() {
    let member = start_member(&crate::bin()).await;
    let endpoints = [member.endpoint()];
    let ours = Proxy::start(&endpoints, &[]).await.expect("our proxy");
    let etcd = Proxy::start_bin(Path::new("/usr/bin/etcd"), &endpoints)
        .await
        .expect("etcd 3.4's proxy");
    for proxy in [&etcd, &ours] {
        let mut channel = tonic::transport::Endpoint::from_shared(proxy.endpoint())
            .expect("endpoint")
            .connect()
            .await
            .expect("connect");
        for path in [
            "/etcdserverpb.KV/Range",
            "/etcdserverpb.KV/Put",
            "/etcdserverpb.Lease/LeaseGrant",
            "/etcdserverpb.Watch/Watch",
            "/etcdserverpb.Lease/LeaseKeepAlive",
        ] {
            let answer =
                crate::kv::claim_4gib_and_wait(&mut channel, path, &[], Duration::from_secs(5))
                    .await;
            // etcd 3.4's proxy keeps grpc-go's default limit (4 MiB), ours 3.5's
            // `--max-recv-bytes` default (2 GiB - 1).
            assert_eq!(
                answer.grpc_status.as_deref(),
                Some("8"),
                "{path} through {}: {answer:?}",
                proxy.endpoint()
            );
            let message = answer.grpc_message.unwrap_or_default();
            assert!(
                message.starts_with("grpc: received message larger than max (4294967295 vs. "),
                "{path} through {}: {message}",
                proxy.endpoint()
            );
        }
    }
}

/// TLS end to end against etcd 3.4 requiring client certificates: the proxy presents its
/// certificate to the cluster and terminates TLS for its clients.
#[tokio::test]
async fn tls_to_clients_and_to_an_etcd_34_cluster() {
    let dir = tempfile::tempdir().expect("tempdir");
    let ca = TestCa::new(dir.path(), "ca").expect("ca");
    let server = ca.issue_loopback("server", "etcd").expect("server cert");
    // No Common Name: etcd's proxy refuses a client certificate that has one.
    let proxy_cert = ca.issue_loopback("proxy", "").expect("proxy cert");
    let client_port = reserve().expect("port");
    let peer_port = reserve().expect("port");
    let client_url = format!("https://127.0.0.1:{}", client_port.port());
    let peer_url = format!("http://127.0.0.1:{}", peer_port.port());
    let data = dir.path().join("data");
    let log = std::fs::File::create(dir.path().join("etcd.log")).expect("log");
    let _etcd = Command::new("/usr/bin/etcd")
        .arg(format!("--data-dir={}", data.display()))
        .arg(format!("--listen-client-urls={client_url}"))
        .arg(format!("--advertise-client-urls={client_url}"))
        .arg(format!("--listen-peer-urls={peer_url}"))
        .arg(format!("--initial-advertise-peer-urls={peer_url}"))
        .arg(format!("--initial-cluster=default={peer_url}"))
        .arg(format!("--cert-file={}", server.cert.display()))
        .arg(format!("--key-file={}", server.key.display()))
        .arg(format!("--trusted-ca-file={}", ca.ca_file().display()))
        .arg("--client-cert-auth")
        .stdout(Stdio::null())
        .stderr(log)
        .kill_on_drop(true)
        .spawn()
        .expect("etcd 3.4 with TLS");
    let s = |p: &Path| p.display().to_string();
    let flags = [
        format!("--cert={}", s(&proxy_cert.cert)),
        format!("--key={}", s(&proxy_cert.key)),
        format!("--cacert={}", s(&ca.ca_file())),
        format!("--cert-file={}", s(&server.cert)),
        format!("--key-file={}", s(&server.key)),
    ];
    let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
    let proxy = Proxy::start_with(
        std::slice::from_ref(&client_url),
        &flags,
        Some(&ca.ca_file()),
    )
    .await
    .expect("proxy");
    let ctl = |args: &[&str]| {
        let mut cmd = std::process::Command::new("/usr/bin/etcdctl");
        cmd.env("ETCDCTL_API", "3")
            .arg(format!("--endpoints=https://{}", proxy.addr))
            .arg(format!("--cacert={}", ca.ca_file().display()))
            .args(args);
        cmd
    };
    poll_until(Duration::from_secs(15), || async {
        let out = ctl(&["put", "tls", "yes"]).output()?;
        if out.status.success() {
            Ok(())
        } else {
            Err(anyhow::anyhow!("{}", String::from_utf8_lossy(&out.stderr)))
        }
    })
    .await
    .expect("put through TLS both ways");
    let out = ctl(&["get", "tls", "--print-value-only"])
        .output()
        .expect("get");
    assert_eq!(String::from_utf8_lossy(&out.stdout), "yes\n");
    // HTTP/1.1 over TLS on the main port, as curl --http1.1 does.
    let out = std::process::Command::new("curl")
        .args(["-s", "--http1.1", "--cacert"])
        .arg(ca.ca_file())
        .arg(format!("https://{}/health", proxy.addr))
        .output()
        .expect("curl");
    let body = String::from_utf8_lossy(&out.stdout);
    assert!(body.contains("\"health\":\"true\""), "{body}");
    // Plain clients are refused on the TLS port.
    let plain = Etcdctl::new(format!("http://{}", proxy.addr));
    let out = plain
        .run(&["--command-timeout=2s", "get", "tls"])
        .await
        .expect("run");
    assert!(!out.success());
}

/// A client that stops reading while events pour in is not cut off and loses nothing: its
/// watchers pause when its queue is full, catch up from the cluster's history when it reads
/// again, and then share the live cluster watcher again.
#[tokio::test]
async fn a_slow_reader_catches_up_without_gaps_and_rejoins() {
    const WATCHERS: usize = 50;
    const PUTS: usize = 300;
    let member = start_member(&backends()[0]).await;
    let proxy = Proxy::start(&[member.endpoint()], &[])
        .await
        .expect("proxy");
    let mut client = proxy.client().await;
    let mut stream = client.watch("slow", None).await.expect("watch");
    assert!(next(&mut stream).await.created());
    for _ in 1..WATCHERS {
        stream.watch("slow", None).await.expect("watch");
        assert!(next(&mut stream).await.created());
    }
    // Nobody reads while the events come.
    let mut direct = member.client().await.expect("direct");
    let value = "x".repeat(2048);
    let first = direct
        .put("slow", value.as_str(), None)
        .await
        .expect("put")
        .header()
        .expect("h")
        .revision();
    for _ in 1..PUTS {
        direct.put("slow", value.as_str(), None).await.expect("put");
    }
    let mut seen: std::collections::HashMap<i64, Vec<i64>> = std::collections::HashMap::new();
    while seen.values().map(Vec::len).sum::<usize>() < WATCHERS * PUTS {
        let resp = next(&mut stream).await;
        assert!(!resp.canceled(), "{resp:?}");
        let revs = seen.entry(resp.watch_id()).or_default();
        revs.extend(
            resp.events()
                .iter()
                .map(|e| e.kv().expect("kv").mod_revision()),
        );
    }
    let want: Vec<i64> = (first..first + PUTS as i64).collect();
    assert_eq!(seen.len(), WATCHERS);
    for (id, revs) in &seen {
        assert_eq!(revs, &want, "watcher {id}");
    }
    // Caught up: they all share one cluster watcher again (after the next event).
    direct.put("slow", "last", None).await.expect("put");
    until_cluster_watchers(
        &member,
        PROXY_OWN_WATCHERS + 1.0,
        "merged back into the live watcher",
    )
    .await;
}

/// More watchers of one key on one stream than the stream's queue holds: one event still
/// reaches every one of them (those without room catch up right after).
#[tokio::test]
async fn one_event_reaches_more_watchers_than_a_queue_holds() {
    const WATCHERS: usize = 300;
    let member = start_member(&backends()[0]).await;
    let proxy = Proxy::start(&[member.endpoint()], &[])
        .await
        .expect("proxy");
    let mut client = proxy.client().await;
    let mut stream = client.watch("wide", None).await.expect("watch");
    assert!(next(&mut stream).await.created());
    for _ in 1..WATCHERS {
        stream.watch("wide", None).await.expect("watch");
        assert!(next(&mut stream).await.created());
    }
    let rev = member
        .client()
        .await
        .expect("direct")
        .put("wide", "v", None)
        .await
        .expect("put")
        .header()
        .expect("h")
        .revision();
    let mut ids = std::collections::HashSet::new();
    while ids.len() < WATCHERS {
        let resp = next(&mut stream).await;
        for event in resp.events() {
            assert_eq!(event.kv().expect("kv").mod_revision(), rev);
        }
        assert!(
            ids.insert(resp.watch_id()),
            "one event per watcher: {resp:?}"
        );
    }
}

/// Watchers of one range share one s-watcher and its events, yet each sees what it asked for
/// (filters, prev_kv): every event list through the proxy is exactly what the same watcher
/// gets from the member itself.
#[tokio::test]
async fn shared_events_are_filtered_per_watcher_as_a_member_does() {
    let member = start_member(&backends()[0]).await;
    let proxy = Proxy::start(&[member.endpoint()], &[])
        .await
        .expect("proxy");
    let mut direct = member.client().await.expect("direct");
    let options = || {
        [
            WatchOptions::new().with_prefix(),
            WatchOptions::new()
                .with_prefix()
                .with_filters([etcd_client::WatchFilterType::NoPut]),
            WatchOptions::new()
                .with_prefix()
                .with_filters([etcd_client::WatchFilterType::NoDelete]),
            WatchOptions::new().with_prefix().with_prev_key(),
            WatchOptions::new().with_prefix(),
        ]
    };
    let mut via_proxy = proxy.client().await;
    let mut streams = Vec::new();
    for client in [&mut via_proxy, &mut direct] {
        let mut watches = Vec::new();
        for opts in options() {
            let mut stream = client.watch("fan/", Some(opts)).await.expect("watch");
            assert!(next(&mut stream).await.created());
            watches.push(stream);
        }
        streams.push(watches);
    }
    direct.put("fan/a", "1", None).await.expect("put");
    direct.put("fan/a", "2", None).await.expect("put");
    direct.put("other", "x", None).await.expect("put");
    direct.delete("fan/a", None).await.expect("delete");
    direct.put("fan/b", "3", None).await.expect("put");
    // Every watcher sees at least the last put (each filter lets puts or deletes through).
    let expected_counts = [4, 1, 3, 4, 4];
    let mut seen: Vec<Vec<Vec<String>>> = Vec::new();
    for watches in &mut streams {
        let mut per_watcher = Vec::new();
        for (stream, want) in watches.iter_mut().zip(expected_counts) {
            let mut events = Vec::new();
            while events.len() < want {
                for e in next(stream).await.events() {
                    let kv = e.kv().expect("kv");
                    let prev = e
                        .prev_kv()
                        .map(|p| (p.value_str().unwrap_or("?").to_string(), p.mod_revision()));
                    events.push(format!(
                        "{:?} {} {} @{} prev={prev:?}",
                        e.event_type(),
                        kv.key_str().unwrap_or("?"),
                        kv.value_str().unwrap_or("?"),
                        kv.mod_revision()
                    ));
                }
            }
            assert_eq!(events.len(), want, "{events:?}");
            per_watcher.push(events);
        }
        seen.push(per_watcher);
    }
    assert_eq!(seen[0], seen[1], "through the proxy vs from the member");
    assert!(
        seen[0][3][1].contains("prev=Some((\"1\""),
        "{:?}",
        seen[0][3]
    );
    assert!(
        seen[0][0].iter().all(|e| e.ends_with("prev=None")),
        "{:?}",
        seen[0][0]
    );
}

/// Require-leader through the proxy: a client's `hasleader` watch is served from the proxy's
/// shared cluster watch, yet once no endpoint has a leader it ends with etcd's "etcdserver:
/// no leader", new require-leader requests are refused, and other requests are still served.
#[tokio::test]
async fn require_leader_watches_end_when_the_cluster_loses_its_leader() {
    let mut cluster = Cluster::start(3, ClusterOpts::new(&backends()[0]))
        .await
        .expect("cluster");
    let proxy = Proxy::start(&cluster.endpoints(), &[])
        .await
        .expect("proxy");
    let opts = ConnectOptions::new()
        .with_connect_timeout(Duration::from_secs(5))
        .with_timeout(Duration::from_secs(10))
        .with_require_leader(true);
    let mut strict = Client::connect([proxy.endpoint()], Some(opts))
        .await
        .expect("connect");
    let mut stream = strict.watch("rl", None).await.expect("watch");
    assert!(next(&mut stream).await.created());
    strict
        .put("rl", "1", None)
        .await
        .expect("put with a leader");
    assert_eq!(next(&mut stream).await.events().len(), 1);
    // Serializable reads are served while there is a leader, from the cache too.
    proxy.until_cached(&strict, "rl", "1").await;

    cluster.kill9(1).expect("kill m1");
    cluster.kill9(2).expect("kill m2");
    let ended = tokio::time::timeout(Duration::from_secs(20), async {
        loop {
            match stream.message().await {
                Ok(Some(resp)) => assert!(resp.events().is_empty(), "{resp:?}"),
                other => return other,
            }
        }
    })
    .await
    .unwrap_or_else(|_| panic!("the watch did not end\n{}", proxy.log_text()));
    etcdrs_testkit::assert_grpc_error(
        ended,
        etcdrs_testkit::Code::Unavailable,
        "etcdserver: no leader",
    );
    etcdrs_testkit::assert_grpc_error(
        strict.watch("rl", None).await.map(|_| ()),
        etcdrs_testkit::Code::Unavailable,
        "etcdserver: no leader",
    );
    // Not from the cache either.
    etcdrs_testkit::assert_grpc_error(
        strict
            .get("rl", Some(GetOptions::new().with_serializable()))
            .await,
        etcdrs_testkit::Code::Unavailable,
        "etcdserver: no leader",
    );
    let mut lenient = proxy.client().await;
    let resp = lenient
        .get("rl", Some(GetOptions::new().with_serializable()))
        .await
        .expect("a serializable read without require-leader is served");
    assert_eq!(resp.kvs()[0].value(), b"1");
}

/// A revision too large for one response reaches a client that asked for fragments in pieces
/// of at most etcd's default `--max-request-bytes` (1.5 MiB), marked `fragment` but the last,
/// which together hold every event in order; a client that did not ask gets one response.
#[tokio::test]
async fn large_revisions_reach_fragmenting_clients_in_pieces() {
    use etcdrs_proto::etcdserverpb::watch_client::WatchClient;
    use etcdrs_proto::etcdserverpb::{WatchCreateRequest, WatchRequest, watch_request};
    use futures::StreamExt;

    const VALUES: usize = 5;
    const VALUE_BYTES: usize = 1 << 20;
    let member = Member::start(MemberOpts::new(&backends()[0]).arg("--max-request-bytes=8388608"))
        .await
        .expect("member");
    // The proxy may send (and so take from the cluster) messages of up to 64 MiB.
    let proxy = Proxy::start(&[member.endpoint()], &["--max-send-bytes=67108864"])
        .await
        .expect("proxy");
    let channel = tonic::transport::Channel::from_shared(proxy.endpoint())
        .expect("uri")
        .connect()
        .await
        .expect("connect");
    let mut streams = Vec::new();
    for fragment in [true, false] {
        let mut client = WatchClient::new(channel.clone()).max_decoding_message_size(64 << 20);
        let create = WatchRequest {
            request_union: Some(watch_request::RequestUnion::CreateRequest(
                WatchCreateRequest {
                    key: b"big/".to_vec(),
                    range_end: b"big0".to_vec(),
                    fragment,
                    ..Default::default()
                },
            )),
        };
        let requests = futures::stream::iter([create]).chain(futures::stream::pending());
        let mut stream = client.watch(requests).await.expect("watch").into_inner();
        let created = stream.message().await.expect("created").expect("open");
        assert!(created.created, "{created:?}");
        streams.push(stream);
    }
    let value = "v".repeat(VALUE_BYTES);
    let puts: Vec<TxnOp> = (0..VALUES)
        .map(|i| TxnOp::put(format!("big/{i}"), value.clone(), None))
        .collect();
    let mut direct = member.client().await.expect("direct");
    direct
        .txn(Txn::new().and_then(puts))
        .await
        .expect("one revision of 5 MiB");

    let mut fragments = Vec::new();
    let mut keys = Vec::new();
    loop {
        let resp = tokio::time::timeout(Duration::from_secs(10), streams[0].message())
            .await
            .expect("in time")
            .expect("ok")
            .expect("open");
        assert!(
            prost_len(&resp) <= 1536 * 1024,
            "a piece of {} bytes",
            prost_len(&resp)
        );
        fragments.push(resp.fragment);
        keys.extend(
            resp.events
                .iter()
                .filter_map(|e| e.kv.as_ref())
                .map(|kv| kv.key.clone()),
        );
        if !resp.fragment {
            break;
        }
    }
    assert_eq!(fragments.len(), VALUES, "{fragments:?}");
    assert!(fragments[..VALUES - 1].iter().all(|f| *f), "{fragments:?}");
    let want: Vec<Vec<u8>> = (0..VALUES)
        .map(|i| format!("big/{i}").into_bytes())
        .collect();
    assert_eq!(keys, want);

    let whole = tokio::time::timeout(Duration::from_secs(10), streams[1].message())
        .await
        .expect("in time")
        .expect("ok")
        .expect("open");
    assert!(!whole.fragment);
    assert_eq!(whole.events.len(), VALUES);
}

fn prost_len(resp: &etcdrs_proto::etcdserverpb::WatchResponse) -> usize {
    use prost::Message;
    resp.encoded_len()
}

/// `--auto-tls`: the proxy serves TLS with a self-signed certificate it keeps under
/// `<data-dir>/fixtures/proxy`, as etcd's proxy does; etcdctl reaches it with
/// `--insecure-transport=false --insecure-skip-tls-verify`, and the same certificate is reused after a restart.
#[tokio::test]
async fn auto_tls_serves_a_self_signed_certificate_from_the_data_dir() {
    let member = start_member(&backends()[0]).await;
    let dir = tempfile::tempdir().expect("tempdir");
    let data_dir = format!("--data-dir={}", dir.path().join("proxy").display());
    let cert = dir.path().join("proxy/fixtures/proxy/cert.pem");
    let mut first_cert = String::new();
    for round in 0..2 {
        let mut proxy = Proxy::start(&[member.endpoint()], &["--auto-tls", &data_dir])
            .await
            .expect("proxy");
        let ctl = |args: &[&str]| {
            let mut cmd = std::process::Command::new("/usr/bin/etcdctl");
            cmd.env("ETCDCTL_API", "3")
                .arg(format!("--endpoints=https://{}", proxy.addr))
                .args(["--insecure-transport=false", "--insecure-skip-tls-verify"])
                .args(args);
            cmd
        };
        let out = ctl(&["put", "auto", "tls"]).output().expect("etcdctl");
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let out = ctl(&["get", "auto", "--print-value-only"])
            .output()
            .expect("etcdctl");
        assert_eq!(String::from_utf8_lossy(&out.stdout), "tls\n");
        // Plain gRPC is not served on a TLS listener.
        let out = std::process::Command::new("/usr/bin/etcdctl")
            .env("ETCDCTL_API", "3")
            .arg(format!("--endpoints=http://{}", proxy.addr))
            .args(["--dial-timeout=1s", "--command-timeout=2s", "get", "auto"])
            .output()
            .expect("etcdctl");
        assert!(!out.status.success());
        let pem = std::fs::read_to_string(&cert).expect("the certificate is kept");
        if round == 0 {
            // etcd's words, which operators' scripts look for.
            let log = proxy.log_text();
            assert!(log.contains("created cert file"), "{log}");
            assert!(log.contains("created key file"), "{log}");
            first_cert = pem;
        } else {
            assert_eq!(pem, first_cert, "reused after a restart");
        }
        proxy.kill().await;
    }
}

/// A client certificate with a Common Name would make the cluster run every forwarded request
/// as that user, so etcd's proxy refuses to start with one (`cert has non empty Common Name`,
/// exit 1); ours and etcd 3.4's say the same. With an empty Common Name it serves.
#[tokio::test]
async fn a_client_certificate_with_a_common_name_is_refused_at_start() {
    use etcdrs_testkit::ClientTls;
    use etcdrs_testkit::certs::Usage;
    let dir = tempfile::tempdir().expect("tempdir");
    let ca = TestCa::new(dir.path(), "ca").expect("ca");
    let server = ca.issue_loopback("server", "server").expect("server cert");
    let root_cert = ca
        .issue("root", "root", &[], Usage::Client)
        .expect("root cert");
    let anonymous = ca
        .issue("anonymous", "", &[], Usage::Client)
        .expect("cert without a common name");
    let member = Member::start(MemberOpts::new(&backends()[0]).client_tls(ClientTls {
        ca_file: ca.ca_file(),
        server,
        client: Some(root_cert.clone()),
        client_cert_auth: true,
    }))
    .await
    .expect("member");
    let s = |p: &Path| p.display().to_string();
    let tls_flags = |cert: &etcdrs_testkit::certs::CertFiles| {
        vec![
            format!("--cert={}", s(&cert.cert)),
            format!("--key={}", s(&cert.key)),
            format!("--cacert={}", s(&ca.ca_file())),
        ]
    };
    for bin in [proxy_bin(), PathBuf::from("/usr/bin/etcd")] {
        let port = reserve().expect("port");
        let out = tokio::time::timeout(
            Duration::from_secs(20),
            Command::new(&bin)
                .args(["grpc-proxy", "start"])
                .arg(format!("--endpoints={}", member.endpoint()))
                .arg(format!("--listen-addr=127.0.0.1:{}", port.port()))
                .args(tls_flags(&root_cert))
                .output(),
        )
        .await
        .expect("the proxy exits")
        .expect("the proxy runs");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{}: {stderr}", bin.display());
        assert!(
            stderr.contains("cert has non empty Common Name (root)"),
            "{}: {stderr}",
            bin.display()
        );
    }
    let flags = tls_flags(&anonymous);
    let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
    let proxy = Proxy::start(&[member.endpoint()], &flags)
        .await
        .expect("proxy");
    let mut client = proxy.client().await;
    client
        .put("c", "v", None)
        .await
        .expect("put through the proxy");
    let got = client.get("c", None).await.expect("get");
    assert_eq!(got.kvs()[0].value(), b"v");
}

/// Password auth, and a proxy with no identity of its own: the keyspace watch is refused, so
/// each cached answer is watched with the token of the client it answered. The cache still
/// serves hits, a write made directly to the cluster is seen, and a user without permission is
/// refused rather than answered from another user's entry.
#[tokio::test]
async fn the_cache_serves_password_users_through_watches_of_their_own() {
    for bin in backends() {
        let member = Member::start(MemberOpts::new(&bin).setting("bcrypt-cost", "4"))
            .await
            .expect("member");
        let admin = member.etcdctl();
        for args in [
            &["user", "add", "root:rootpw"][..],
            &["user", "add", "alice:alicepw"],
            &["user", "add", "bob:bobpw"],
            &["role", "add", "reader"],
            &["role", "grant-permission", "reader", "readwrite", "c"],
            &["user", "grant-role", "alice", "reader"],
            &["auth", "enable"],
        ] {
            admin.ok(args).await;
        }
        let root = admin.clone().with_user("root:rootpw");
        root.ok(&["put", "c", "old"]).await;
        let proxy = Proxy::spawn(&[member.endpoint()], &[], &[]).expect("proxy");
        let as_user = |user: &'static str, password: &'static str| {
            let endpoint = proxy.endpoint();
            async move {
                poll_until(Duration::from_secs(10), || {
                    let endpoint = endpoint.clone();
                    async move {
                        let opts = ConnectOptions::new()
                            .with_user(user, password)
                            .with_connect_timeout(Duration::from_secs(2));
                        anyhow::Ok(Client::connect([endpoint], Some(opts)).await?)
                    }
                })
                .await
                .expect("a client logs in through the proxy")
            }
        };
        let mut alice = as_user("alice", "alicepw").await;
        let serializable = || Some(GetOptions::new().with_serializable());
        proxy.until_cached(&alice, "c", "old").await;

        root.ok(&["put", "c", "new"]).await;
        until_fresh(&alice, "c", "new").await;
        // Cached again, and served again.
        proxy.until_cached(&alice, "c", "new").await;

        let mut bob = as_user("bob", "bobpw").await;
        let refused = bob
            .get("c", serializable())
            .await
            .expect_err("bob may not read c");
        assert!(
            refused.to_string().contains("permission denied"),
            "{refused}"
        );
        let got = alice.get("c", serializable()).await.expect("alice reads");
        assert_eq!(got.kvs()[0].value(), b"new");

        // A permission revoked at the cluster holds through the proxy within the cache's
        // entry age, though alice's entry is still cached.
        root.ok(&["user", "revoke-role", "alice", "reader"]).await;
        poll_until(Duration::from_secs(5), || {
            let mut alice = alice.clone();
            async move {
                match alice.get("c", serializable()).await {
                    Err(e) if e.to_string().contains("permission denied") => Ok(()),
                    other => anyhow::bail!("still answered: {other:?}"),
                }
            }
        })
        .await
        .expect("alice's revoked permission holds");
    }
}

/// SIGTERM: the proxy closes its connections, revokes its registration (it leaves the list
/// at once, not after its TTL) and dies by the signal, as etcd's proxy does.
#[tokio::test]
async fn sigterm_unregisters_the_proxy_and_kills_it_by_the_signal() {
    use std::os::unix::process::ExitStatusExt;
    let member = start_member(&backends()[0]).await;
    let flags = ["--resolver-prefix=stop", "--resolver-ttl=30"];
    let mut proxy = Proxy::start(&[member.endpoint()], &flags)
        .await
        .expect("proxy");
    let mut direct = member.client().await.expect("direct");
    let registered = || {
        let mut direct = direct.clone();
        async move {
            let resp = direct
                .get("stop/", Some(GetOptions::new().with_prefix()))
                .await?;
            anyhow::Ok(resp.kvs().len())
        }
    };
    poll_until(Duration::from_secs(5), || async {
        match registered().await? {
            1 => Ok(()),
            n => Err(anyhow::anyhow!("{n} registrations")),
        }
    })
    .await
    .expect("registered");
    let pid = proxy.child.id().expect("pid");
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(i32::try_from(pid).expect("pid")),
        nix::sys::signal::Signal::SIGTERM,
    )
    .expect("signal");
    let status = tokio::time::timeout(Duration::from_secs(5), proxy.child.wait())
        .await
        .expect("stops in time")
        .expect("wait");
    assert_eq!(status.signal(), Some(15), "{status:?}");
    assert_eq!(
        registered().await.expect("get"),
        0,
        "revoked on the way out"
    );
    direct
        .put("k", "v", None)
        .await
        .expect("the cluster is fine");
}

#[tokio::test]
async fn discovery_srv_finds_the_cluster_in_dns() {
    // `_etcd-client._tcp.etcd.test` names the member (an address-shaped target); --endpoints
    // names a dead port, so requests succeed only through the SRV endpoint.
    let member = start_member(&crate::bin()).await;
    let dns = etcdrs_testkit::dns::DnsServer::start("etcd.test").expect("dns");
    dns.add_srv(
        "_etcd-client._tcp",
        0,
        0,
        member.client_port(),
        "127.0.0.1.",
    )
    .await
    .expect("SRV record");
    let dead = reserve().expect("port");
    let env = [("ETCDRS_DNS_SERVER", dns.addr().to_string())];
    let proxy = Proxy::start_env(
        &[format!("127.0.0.1:{}", dead.port())],
        &["--discovery-srv=etcd.test", "--insecure-discovery"],
        None,
        &env,
    )
    .await
    .expect("proxy");
    let mut client = proxy.client().await;
    client.put("srv", "found", None).await.expect("put");
    let got = client.get("srv", None).await.expect("get");
    assert_eq!(got.kvs()[0].value(), b"found");
    assert!(
        proxy.log_text().contains("discovered cluster from SRV"),
        "{}",
        proxy.log_text()
    );
    drop(dead);
}

/// Family names and types of a text exposition (its `# TYPE` lines), the Go runtime's aside.
fn families(body: &str) -> std::collections::BTreeMap<String, String> {
    body.lines()
        .filter_map(|line| line.strip_prefix("# TYPE "))
        .filter_map(|rest| rest.split_once(' '))
        .filter(|(name, _)| !name.starts_with("go_"))
        .map(|(name, kind)| (name.to_owned(), kind.to_owned()))
        .collect()
}

/// The proxy's own families at `/proxy/metrics` (etcd 3.5's path), with etcd's types.
const PROXY_FAMILIES: &[(&str, &str)] = &[
    ("etcd_grpc_proxy_cache_hits_total", "gauge"),
    ("etcd_grpc_proxy_cache_keys_total", "gauge"),
    ("etcd_grpc_proxy_cache_misses_total", "gauge"),
    ("etcd_grpc_proxy_events_coalescing_total", "counter"),
    ("etcd_grpc_proxy_watchers_coalescing_total", "gauge"),
    ("grpc_server_handled_total", "counter"),
    ("grpc_server_msg_received_total", "counter"),
    ("grpc_server_msg_sent_total", "counter"),
    ("grpc_server_started_total", "counter"),
    ("process_cpu_seconds_total", "counter"),
    ("process_max_fds", "gauge"),
    ("process_open_fds", "gauge"),
    ("process_resident_memory_bytes", "gauge"),
    ("process_start_time_seconds", "gauge"),
    ("process_virtual_memory_bytes", "gauge"),
    ("process_virtual_memory_max_bytes", "gauge"),
    ("promhttp_metric_handler_requests_in_flight", "gauge"),
    ("promhttp_metric_handler_requests_total", "counter"),
];

/// etcd's proxy (3.4 and 3.5) answers `/metrics` with a member's metrics, fetched for each
/// scrape; 3.5 adds `/proxy/metrics` with the proxy's own. Ours and etcd 3.4's run side by
/// side in front of one member, with the same workload through each.
#[tokio::test]
async fn metrics_relay_a_members_and_proxy_metrics_are_the_proxys_own() {
    let member = start_member(&crate::bin()).await;
    let ours = Proxy::start(&[member.endpoint()], &[])
        .await
        .expect("our proxy");
    let theirs = Proxy::start_bin(Path::new("/usr/bin/etcd"), &[member.endpoint()])
        .await
        .expect("etcd 3.4's proxy");
    for proxy in [&ours, &theirs] {
        let mut client = proxy.client().await;
        client.put("pm", "v", None).await.expect("put");
        read_is(&client, "pm", "v").await.expect("read");
    }
    let member_families = families(&member.http_get("/metrics").await.expect("metrics").body);
    assert!(member_families.contains_key("etcd_server_has_leader"));
    for proxy in [&ours, &theirs] {
        for addr in [&proxy.addr, &proxy.metrics_addr] {
            let relayed = http_get(addr, "/metrics").await.expect("metrics");
            assert_eq!(relayed.status, 200);
            assert_eq!(families(&relayed.body), member_families, "{addr}");
        }
    }
    // etcd 3.4's proxy has no /proxy/metrics; ours serves etcd 3.5's.
    let none = http_get(&theirs.addr, "/proxy/metrics").await.expect("GET");
    assert_eq!(none.status, 404);

    let mut client = ours.client().await;
    ours.until_cached(&client, "pm", "v").await;
    let mut s1 = client.watch("pw", None).await.expect("watch");
    let mut s2 = client.watch("pw", None).await.expect("watch");
    for stream in [&mut s1, &mut s2] {
        assert!(
            stream
                .message()
                .await
                .expect("created")
                .expect("open")
                .created()
        );
    }
    client.put("pw", "x", None).await.expect("put");
    for stream in [&mut s1, &mut s2] {
        let event = stream.message().await.expect("event").expect("open");
        assert_eq!(event.events().len(), 1);
    }
    let own = poll_until(Duration::from_secs(5), || async {
        let body = http_get(&ours.metrics_addr, "/proxy/metrics").await?.body;
        let coalesced = metric_value(&body, "etcd_grpc_proxy_events_coalescing_total", None);
        anyhow::ensure!(coalesced >= 1.0, "no coalesced event yet");
        Ok(body)
    })
    .await
    .expect("coalescing counted");
    let expected: std::collections::BTreeMap<String, String> = PROXY_FAMILIES
        .iter()
        .map(|(name, kind)| (name.to_string(), kind.to_string()))
        .collect();
    assert_eq!(families(&own), expected);
    assert!(metric_value(&own, "etcd_grpc_proxy_cache_hits_total", None) >= 1.0);
    assert!(metric_value(&own, "etcd_grpc_proxy_cache_misses_total", None) >= 1.0);
    assert!(metric_value(&own, "etcd_grpc_proxy_cache_keys_total", None) >= 1.0);
    assert_eq!(
        metric_value(&own, "etcd_grpc_proxy_watchers_coalescing_total", None),
        1.0
    );
    // Its own gRPC server's calls, cached ranges among them.
    let range = Some(r#"grpc_method="Range""#);
    assert!(metric_value(&own, "grpc_server_started_total", range) >= 2.0);
    assert!(
        metric_value(
            &own,
            "grpc_server_handled_total",
            Some(r#"grpc_code="OK",grpc_method="Range""#)
        ) >= 2.0
    );
    assert!(metric_value(&own, "grpc_server_msg_sent_total", range) >= 2.0);
    let watch = Some(r#"grpc_method="Watch""#);
    assert!(metric_value(&own, "grpc_server_msg_received_total", watch) >= 2.0);
    assert!(metric_value(&own, "process_resident_memory_bytes", None) > 0.0);
    assert!(metric_value(&own, "process_open_fds", None) > 0.0);
}

/// The proxy's own limits and log level: `--max-recv-bytes` refuses a larger request with
/// gRPC's error, `--max-concurrent-streams` is announced to clients, `--debug` logs at debug
/// level.
#[tokio::test]
async fn max_recv_bytes_max_concurrent_streams_and_debug() {
    let member = start_member(&crate::bin()).await;
    let proxy = Proxy::start(
        &[member.endpoint()],
        &[
            "--max-recv-bytes=1024",
            "--max-concurrent-streams=5",
            "--debug",
        ],
    )
    .await
    .expect("proxy");
    let mut client = proxy.client().await;
    client.put("small", "v", None).await.expect("a small put");
    let err = client
        .put("big", "x".repeat(4096), None)
        .await
        .expect_err("a request over --max-recv-bytes");
    let (code, message) = etcdrs_testkit::grpc_error(&err).expect("a gRPC status");
    assert_eq!(code, etcdrs_testkit::Code::ResourceExhausted, "{message}");
    assert!(message.contains("larger than max"), "{message}");
    let mut direct = member.client().await.expect("direct client");
    assert!(direct.get("big", None).await.unwrap().kvs().is_empty());
    assert_eq!(
        crate::http::announced_max_streams(&proxy.addr).await,
        Some(5)
    );
    assert!(
        proxy.log_text().contains("\"level\":\"debug\""),
        "{}",
        proxy.log_text()
    );
}

/// Through `--namespace`, a lease that also holds a key outside the namespace cannot be
/// revoked (the revoke would delete that key); a lease whose keys are all inside can.
#[tokio::test]
async fn namespace_lease_revoke_cannot_delete_keys_outside() {
    let member = start_member(&crate::bin()).await;
    let proxy = Proxy::start(&[member.endpoint()], &["--namespace=/ns/"])
        .await
        .expect("proxy");
    let mut direct = member.client().await.expect("direct client");
    let mut client = proxy.client().await;
    let shared = direct.lease_grant(600, None).await.unwrap().id();
    direct
        .put(
            "/outside",
            "x",
            Some(etcd_client::PutOptions::new().with_lease(shared)),
        )
        .await
        .unwrap();
    client
        .put(
            "inside",
            "y",
            Some(etcd_client::PutOptions::new().with_lease(shared)),
        )
        .await
        .unwrap();
    let err = client.lease_revoke(shared).await.expect_err("refused");
    let (code, message) = etcdrs_testkit::grpc_error(&err).expect("a gRPC status");
    assert_eq!(code, etcdrs_testkit::Code::PermissionDenied, "{message}");
    assert_eq!(message, "etcdserver: permission denied");
    assert_eq!(direct.get("/outside", None).await.unwrap().kvs().len(), 1);
    assert_eq!(direct.get("/ns/inside", None).await.unwrap().kvs().len(), 1);

    let own = client.lease_grant(600, None).await.unwrap().id();
    client
        .put(
            "mine",
            "z",
            Some(etcd_client::PutOptions::new().with_lease(own)),
        )
        .await
        .unwrap();
    client
        .lease_revoke(own)
        .await
        .expect("a lease of the namespace's own keys");
    assert!(direct.get("/ns/mine", None).await.unwrap().kvs().is_empty());
}

/// etcd 3.7's RangeStream through the proxy is Unimplemented with etcd 3.7's proxy's text (its
/// `grpcproxy/kv.go`), the answer on which clients such as kube-apiserver fall back to ranges,
/// which the proxy serves.
#[tokio::test]
async fn range_stream_is_unimplemented_as_in_etcds_proxy() {
    use etcdrs_proto::etcdserverpb::kv_client::KvClient;
    use etcdrs_proto::etcdserverpb::{PutRequest, RangeRequest};

    let member = start_member(&crate::bin()).await;
    let proxy = Proxy::start(&[member.endpoint()], &[])
        .await
        .expect("proxy");
    let channel = tonic::transport::Endpoint::from_shared(proxy.endpoint())
        .expect("endpoint")
        .connect()
        .await
        .expect("connect to the proxy");
    let mut kv = KvClient::new(channel);
    let refused = kv
        .range_stream(RangeRequest {
            key: b"k".to_vec(),
            ..Default::default()
        })
        .await
        .expect_err("the proxy refuses RangeStream");
    assert_eq!(
        (refused.code(), refused.message()),
        (
            tonic::Code::Unimplemented,
            "RangeStream is not supported by the gRPC proxy"
        )
    );
    // The fallback: a range through the proxy.
    kv.put(PutRequest {
        key: b"k".to_vec(),
        value: b"v".to_vec().into(),
        ..Default::default()
    })
    .await
    .expect("put");
    let got = kv
        .range(RangeRequest {
            key: b"k".to_vec(),
            ..Default::default()
        })
        .await
        .expect("range")
        .into_inner();
    assert_eq!(got.kvs[0].value, b"v");
}
