//! etcd-rs's L7 gRPC proxy (`etcd grpc-proxy start`; etcd `server/proxy/grpcproxy`).
//!
//! The proxy serves every etcd v3 service and forwards to the cluster as a gRPC client only:
//! it never links the server. What it adds on the way:
//!
//! | module | role |
//! |---|---|
//! | [`upstream`] | channels to `--endpoints`, one current at random, failover on `Unavailable` |
//! | [`kv`] | KV, with the serializable-range [`cache`] (watch-invalidated, per identity, bounded) |
//! | [`watch`] | Watch with coalescing, exact-revision opt-out, RequestProgress |
//! | [`leader`] | whether the cluster has a leader, for clients' require-leader requests |
//! | [`lease`] | Lease with keep-alive coalescing onto one cluster stream |
//! | [`cluster`] | MemberList as the registered proxies; `--resolver-prefix` self-registration |
//! | [`passthrough`] | Maintenance, Auth, Lock, Election as they are |
//! | [`namespace`] | `--namespace` on every key in and out |
//! | [`serve`] | gRPC + HTTP/1.1 (`/health`, `/metrics`) on one port, plain or TLS |
//! | [`tls`] | rustls configurations from PEM files |
//! | [`metrics`] | etcd's `etcd_grpc_proxy_*` series |
//!
//! Tasks: [`run`] owns a [`TaskTracker`] holding every task the proxy spawns (listeners,
//! the cache's invalidating watch, the lease keep-alive stream, watch streams, client
//! readers, registration); one [`CancellationToken`] stops them, listeners first.
#![deny(missing_docs)]

pub mod cache;
pub mod cluster;
pub mod kv;
pub mod leader;
pub mod lease;
pub mod metrics;
pub mod namespace;
pub mod passthrough;
pub mod serve;
pub mod tls;
pub mod upstream;
pub mod watch;

use std::sync::Arc;

use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

pub use cache::CacheConfig;

/// What can go wrong setting the proxy up.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// `--endpoints` cannot be dialed (empty, or an endpoint that is no address); the
    /// client crate's texts ("no endpoints given", "invalid endpoint ...").
    #[error(transparent)]
    Endpoints(#[from] etcdrs_client::Error),
    /// A certificate, key or CA file could not be read or used.
    #[error("{path}: {reason}")]
    Tls {
        /// The file.
        path: String,
        /// Why.
        reason: String,
    },
}

/// The proxy's configuration (from `etcd grpc-proxy start`'s flags).
#[derive(Clone, Debug, Default)]
pub struct ProxyConfig {
    /// `--endpoints`: the cluster's client URLs (with or without scheme).
    pub endpoints: Vec<String>,
    /// `--advertise-client-url`.
    pub advertise_client_url: String,
    /// `--resolver-prefix` (empty: no self-registration).
    pub resolver_prefix: String,
    /// `--resolver-ttl`, seconds.
    pub resolver_ttl: i64,
    /// `--namespace`: bytes, as etcd takes any (Go strings are bytes).
    pub namespace: Vec<u8>,
    /// `--max-recv-bytes`.
    pub max_recv_bytes: usize,
    /// `--max-send-bytes`.
    pub max_send_bytes: usize,
    /// `--max-concurrent-streams`: HTTP/2 streams per client connection.
    pub max_concurrent_streams: u32,
    /// Bounds of the range cache.
    pub cache: CacheConfig,
}

/// The proxy's services, ready to serve.
#[derive(Clone)]
pub struct Proxy {
    upstream: upstream::Upstream,
    metrics: metrics::Metrics,
    kv: kv::KvProxy,
    watch: watch::WatchProxy,
    lease: lease::LeaseProxy,
    cluster: cluster::ClusterProxy,
    passthrough: passthrough::Passthrough,
    leader: Arc<leader::ProxyLeader>,
    max_recv_bytes: usize,
    max_send_bytes: usize,
    max_concurrent_streams: u32,
}

/// The listeners of a running proxy.
pub struct Listeners {
    /// `--listen-addr`: gRPC and HTTP.
    pub main: TcpListener,
    /// TLS to clients on the main listener (`--cert-file`, `--key-file`, `--trusted-ca-file`).
    pub main_tls: Option<Arc<rustls::ServerConfig>>,
    /// `--metrics-addr`: HTTP only.
    pub metrics: Option<TcpListener>,
}

impl Proxy {
    /// Builds the services; background tasks go on `tasks` and stop with `shutdown`.
    pub fn new(
        config: &ProxyConfig,
        cluster_tls: Option<upstream::ClusterTls>,
        tasks: &TaskTracker,
        shutdown: &CancellationToken,
    ) -> Result<Proxy, Error> {
        // Messages from the cluster may be as large as a client may receive from us.
        let upstream = upstream::Upstream::new(
            &config.endpoints,
            cluster_tls,
            config.max_send_bytes.max(4 << 20),
        )?;
        let ns = namespace::Namespace::new(config.namespace.clone());
        let metrics = metrics::Metrics::new();
        let cache = cache::RangeCache::new(config.cache, metrics.clone());
        // Task `grpc-proxy cache watch`: keeps the cache from going stale.
        tasks.spawn(cache.clone().run_invalidation(
            upstream.clone(),
            ns.clone(),
            tasks.clone(),
            shutdown.clone(),
        ));
        let leader = leader::ProxyLeader::new();
        // Task `grpc-proxy leader monitor`.
        tasks.spawn(leader.clone().monitor(upstream.clone(), shutdown.clone()));
        if !config.resolver_prefix.is_empty() {
            // Task `grpc-proxy register`.
            tasks.spawn(cluster::register(
                upstream.clone(),
                config.resolver_prefix.clone(),
                config.advertise_client_url.clone(),
                config.resolver_ttl,
                shutdown.clone(),
            ));
        }
        Ok(Proxy {
            kv: kv::KvProxy::new(upstream.clone(), ns.clone(), cache, metrics.clone()),
            watch: watch::WatchProxy::new(
                upstream.clone(),
                ns.clone(),
                metrics.clone(),
                tasks,
                shutdown.clone(),
            ),
            lease: lease::LeaseProxy::new(upstream.clone(), ns.clone(), tasks, shutdown.clone()),
            cluster: cluster::ClusterProxy::new(
                upstream.clone(),
                config.resolver_prefix.clone(),
                config.advertise_client_url.clone(),
            ),
            passthrough: passthrough::Passthrough::new(upstream.clone(), ns),
            leader,
            upstream,
            metrics,
            max_recv_bytes: config.max_recv_bytes,
            max_send_bytes: config.max_send_bytes,
            max_concurrent_streams: config.max_concurrent_streams,
        })
    }
}

/// Runs the proxy on `listeners` until `shutdown`; returns when every task has stopped.
pub async fn run(
    config: ProxyConfig,
    cluster_tls: Option<upstream::ClusterTls>,
    listeners: Listeners,
    shutdown: CancellationToken,
) -> Result<(), Error> {
    let tasks = TaskTracker::new();
    let proxy = Proxy::new(&config, cluster_tls, &tasks, &shutdown)?;
    // Task `grpc-proxy serve`: the main listener.
    tasks.spawn(serve::serve(
        serve::front(&proxy),
        listeners.main,
        listeners.main_tls,
        proxy.max_concurrent_streams,
        shutdown.clone(),
    ));
    if let Some(listener) = listeners.metrics {
        // Task `grpc-proxy metrics`: the `--metrics-addr` listener.
        tasks.spawn(serve::serve(
            serve::http_router(&proxy),
            listener,
            None,
            proxy.max_concurrent_streams,
            shutdown.clone(),
        ));
    }
    drop(proxy);
    shutdown.cancelled().await;
    tasks.close();
    tasks.wait().await;
    Ok(())
}
