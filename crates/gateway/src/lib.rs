//! `etcd gateway start`: the stateless L4 TCP proxy in front of a cluster's client endpoints
//! (etcd `etcdmain/gateway.go` and `proxy/tcpproxy`).
//!
//! Owns endpoint selection (round robin, health, SRV re-resolution) and byte relaying; it never
//! reads or alters the bytes it carries and never terminates or starts TLS for clients. It is
//! not a gRPC proxy: it depends on no protocol crate.
//!
//! # Layout
//!
//! - [`run`]: binds, logs `ready to proxy client requests`, accepts and relays until the stop
//!   token fires, then drains connections within [`Config::shutdown_timeout`].
//! - `pool`: the endpoints, their up/down state and the weighted round robin pick.
//! - `probe`: dialing with a timeout and the active health probe.
//! - `discover`: DNS SRV endpoints with etcd's validation rules.
//! - `metrics`: Prometheus series and the `--metrics-addr` server.
//!
//! # Tasks
//!
//! All spawned by [`run`] and stopped by it, in this order: the accept loop (in `run` itself)
//! stops first; then connection tasks (tracked, drained up to the shutdown bound, then
//! cancelled); then the health monitor, the SRV refresher and the metrics server.
//!
//! # Cost
//!
//! A gateway usually shares its host with the clients (or a member), so what it must keep
//! small is its CPU per relayed request, and that is almost all kernel time: per segment one
//! wakeup, one `recv` and one `send` (the `send` runs the receiver's TCP input and wakeup on
//! loopback). The relay is therefore plain `copy_bidirectional`: a short read tells tokio the
//! socket is drained, so no read ends in `EAGAIN`, and the user-space copy is a few percent of
//! the cost. `splice(2)` through a pipe saves that copy but not the calls, and cannot tell a
//! drained socket from a full pipe (pipes count buffers, not bytes), so it needs one more call
//! per wakeup: measured, it made ~40% more syscalls and ~15% more CPU per relayed put. The
//! binary runs [`run`] on a current-thread runtime: extra worker threads only add wakeups.

mod discover;
mod metrics;
mod pool;
mod probe;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use etcdrs_discovery::srv::SrvResolver;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::discover::Discovery;
use crate::metrics::Metrics;
use crate::pool::{EndpointSpec, Pool, ProbeKind};
use crate::probe::Prober;

/// Buffer per direction of a relayed connection.
const RELAY_BUFFER: usize = 32 * 1024;
/// The most client connections relayed at once; more wait in the kernel's accept backlog.
/// Each costs two relay buffers, so this bounds the gateway's memory (about 1 GiB of buffers).
const MAX_CONNECTIONS: usize = 16 * 1024;
/// The most endpoints probed at once by the health monitor.
const MAX_PARALLEL_PROBES: usize = 64;

/// The gateway's configuration, validated by the binary.
#[derive(Debug, Clone)]
pub struct Config {
    /// `--listen-addr` (`host:port`).
    pub listen_addr: String,
    /// `--endpoints` as `host:port` (a URL's scheme already stripped, as etcd does).
    pub endpoints: Vec<String>,
    /// Whether `--endpoints` was given (the default is not a fallback for failed discovery).
    pub endpoints_set: bool,
    /// `--discovery-srv`.
    pub discovery_srv: String,
    /// `--discovery-srv-name`.
    pub discovery_srv_name: String,
    /// `--insecure-discovery`.
    pub insecure_discovery: bool,
    /// `--trusted-ca-file`.
    pub trusted_ca_file: Option<PathBuf>,
    /// `--retry-delay`: how long a failed endpoint stays out of rotation.
    pub retry_delay: Duration,
    /// How often endpoints in rotation are probed; zero turns the active check off.
    pub health_interval: Duration,
    /// Timeout of a dial (also for clients' connections).
    pub dial_timeout: Duration,
    /// How long a probe waits for an answer after connecting.
    pub health_timeout: Duration,
    /// How often SRV records are looked up again; zero: only at start.
    pub srv_refresh: Duration,
    /// `--metrics-addr`.
    pub metrics_addr: Option<String>,
    /// How long open connections may take to finish on shutdown.
    pub shutdown_timeout: Duration,
}

/// Why the gateway could not start.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// `--trusted-ca-file` is unreadable or holds no certificate.
    #[error("cannot load --trusted-ca-file {path}: {reason}")]
    TrustedCa {
        /// The file.
        path: String,
        /// What went wrong.
        reason: String,
    },
    /// No DNS resolver for SRV discovery (it could not be built).
    #[error("cannot configure the DNS resolver: {0}")]
    Resolver(String),
    /// Both SRV lookups failed (etcd's `dns lookup errors: ... and ...`).
    #[error("{0}")]
    DnsLookup(String),
    /// Discovery left no endpoint and no `--endpoints` were given to fall back to.
    #[error(
        "no usable endpoint discovered from SRV domain {domain:?} ({reason}); refusing to fall back to the default endpoint 127.0.0.1:2379 (pass --insecure-discovery to accept plain targets, --trusted-ca-file to verify TLS targets, or --endpoints to fall back to)"
    )]
    NothingDiscovered {
        /// The SRV domain.
        domain: String,
        /// Why targets were dropped, or that there were none.
        reason: String,
    },
    /// An endpoint's host does not resolve.
    #[error("failed to resolve endpoint host: {0}")]
    ResolveEndpoint(String),
    /// The listen host does not resolve.
    #[error("failed to resolve listen host: {0}")]
    ResolveListen(String),
    /// An endpoint is the gateway itself.
    #[error(
        "SRV or endpoint ({target}->{addr}) should not resolve to the gateway listen addr ({listen})"
    )]
    SelfLoop {
        /// The endpoint as given.
        target: String,
        /// What it resolved to.
        addr: SocketAddr,
        /// `--listen-addr`.
        listen: String,
    },
    /// Binding a listener failed.
    #[error("listen tcp {addr}: {source}")]
    Listen {
        /// The address.
        addr: String,
        /// The OS error.
        source: std::io::Error,
    },
    /// The TLS stack refused its configuration.
    #[error("TLS configuration: {0}")]
    Tls(#[from] rustls::Error),
    /// The metrics registry refused a series (a bug).
    #[error("metrics: {0}")]
    Metrics(#[from] prometheus::Error),
}

/// Resolves static `--endpoints` (`host:port`) to endpoint specs.
async fn static_specs(endpoints: &[String]) -> Result<Vec<EndpointSpec>, Error> {
    let mut specs = Vec::with_capacity(endpoints.len());
    for ep in endpoints {
        let addrs: Vec<SocketAddr> = match ep.parse::<SocketAddr>() {
            Ok(addr) => vec![addr],
            Err(_) => tokio::net::lookup_host(ep.as_str())
                .await
                .map_err(|_| Error::ResolveEndpoint(ep.clone()))?
                .collect(),
        };
        if addrs.is_empty() {
            return Err(Error::ResolveEndpoint(ep.clone()));
        }
        specs.push(EndpointSpec {
            key: ep.clone(),
            addrs,
            priority: 0,
            weight: 0,
            probe: ProbeKind::Plain,
        });
    }
    Ok(specs)
}

/// Runs the gateway until `stop` is cancelled; `Err` if it cannot start.
/// `resolver` is needed for `--discovery-srv` only.
pub async fn run(
    config: Config,
    resolver: Option<SrvResolver>,
    stop: CancellationToken,
) -> Result<(), Error> {
    let metrics = Metrics::new()?;
    let verified = match &config.trusted_ca_file {
        Some(path) => {
            let tls = probe::trusted_ca_config(path).map_err(|reason| Error::TrustedCa {
                path: path.display().to_string(),
                reason,
            })?;
            let name = rustls::pki_types::ServerName::try_from(
                config.discovery_srv.trim_end_matches('.').to_string(),
            )
            .ok();
            name.map(|n| (tls, n))
        }
        None => None,
    };
    let prober = Prober::new(config.dial_timeout, config.health_timeout, verified)?;

    // The endpoints: discovered, else the static list.
    let discovery = if config.discovery_srv.is_empty() {
        None
    } else {
        Some(Discovery {
            resolver: resolver
                .ok_or_else(|| Error::Resolver("no resolver given for SRV discovery".into()))?,
            domain: config.discovery_srv.clone(),
            srv_name: config.discovery_srv_name.clone(),
            insecure: config.insecure_discovery,
        })
    };
    let mut specs = Vec::new();
    if let Some(d) = &discovery {
        let (found, why) = d.discover(&prober, false).await.map_err(Error::DnsLookup)?;
        if found.is_empty() {
            let reason = why.unwrap_or_else(|| "no SRV targets".to_string());
            if !config.endpoints_set {
                return Err(Error::NothingDiscovered {
                    domain: d.domain.clone(),
                    reason,
                });
            }
            tracing::warn!(
                srv_server = %d.domain,
                reason = %reason,
                endpoints = ?config.endpoints,
                "no usable endpoint discovered; falling back to --endpoints"
            );
        }
        specs = found;
    }
    if specs.is_empty() {
        specs = static_specs(&config.endpoints).await?;
    }

    // etcd refuses endpoints that are the gateway itself.
    let listen_addrs: Vec<SocketAddr> = tokio::net::lookup_host(config.listen_addr.as_str())
        .await
        .map_err(|_| Error::ResolveListen(config.listen_addr.clone()))?
        .collect();
    for spec in &specs {
        for addr in &spec.addrs {
            let same_port = listen_addrs.iter().any(|l| l.port() == addr.port());
            let same = listen_addrs.iter().any(|l| {
                l == addr || (l.ip().is_unspecified() && same_port && addr.ip().is_loopback())
            });
            if same {
                return Err(Error::SelfLoop {
                    target: spec.key.clone(),
                    addr: *addr,
                    listen: config.listen_addr.clone(),
                });
            }
        }
    }

    let listener = TcpListener::bind(config.listen_addr.as_str())
        .await
        .map_err(|source| Error::Listen {
            addr: config.listen_addr.clone(),
            source,
        })?;
    let metrics_listener = match &config.metrics_addr {
        Some(addr) => {
            Some(
                TcpListener::bind(addr.as_str())
                    .await
                    .map_err(|source| Error::Listen {
                        addr: addr.clone(),
                        source,
                    })?,
            )
        }
        None => None,
    };
    let pool = Arc::new(Pool::new(
        specs,
        config.retry_delay,
        config.health_interval,
        metrics.clone(),
    ));
    tracing::info!(endpoints = ?pool.keys(), "ready to proxy client requests");

    // Background tasks, stopped after the connections drain.
    let background = CancellationToken::new();
    let mut tasks: JoinSet<&'static str> = JoinSet::new();
    {
        // Task: health monitor (probes due endpoints, marks them up or down).
        let (pool, prober, stop) = (pool.clone(), prober.clone(), background.clone());
        let metrics = metrics.clone();
        tasks.spawn(async move {
            health_monitor(pool, prober, metrics, stop).await;
            "health monitor"
        });
    }
    if let Some(d) = discovery.filter(|_| !config.srv_refresh.is_zero()) {
        // Task: SRV refresher (looks the records up again and updates the pool).
        let (pool, prober, stop) = (pool.clone(), prober.clone(), background.clone());
        let every = config.srv_refresh;
        tasks.spawn(async move {
            srv_refresher(d, pool, prober, every, stop).await;
            "SRV refresher"
        });
    }
    if let Some(listener) = metrics_listener {
        // Task: the --metrics-addr HTTP server.
        let (metrics, pool, stop) = (metrics.clone(), pool.clone(), background.clone());
        tasks.spawn(async move {
            if let Err(e) = metrics::serve(listener, metrics, pool, stop).await {
                tracing::warn!(error = %e, "metrics server stopped");
            }
            "metrics server"
        });
    }

    // The accept loop.
    let connections = TaskTracker::new();
    let cut = CancellationToken::new();
    let slots = Arc::new(tokio::sync::Semaphore::new(MAX_CONNECTIONS));
    loop {
        let slot = tokio::select! {
            _ = stop.cancelled() => break,
            slot = slots.clone().acquire_owned() => slot,
        };
        // The semaphore is never closed.
        let Ok(slot) = slot else { break };
        let accepted = tokio::select! {
            _ = stop.cancelled() => break,
            accepted = listener.accept() => accepted,
        };
        let client = match accepted {
            Ok((client, _)) => client,
            Err(e) => {
                // Out of descriptors or similar: back off briefly rather than spin.
                tracing::warn!(error = %e, "failed to accept a client connection");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        metrics.connections.inc();
        let (pool, metrics, cut) = (pool.clone(), metrics.clone(), cut.clone());
        let dial_timeout = config.dial_timeout;
        // Task: one client connection's relay; ends with either side or on `cut`.
        connections.spawn(async move {
            metrics.active.inc();
            tokio::select! {
                _ = relay(client, &pool, &metrics, dial_timeout) => {}
                _ = cut.cancelled() => {}
            }
            metrics.active.dec();
            drop(slot);
        });
    }
    drop(listener);
    connections.close();
    tracing::info!(
        open_connections = connections.len(),
        timeout = ?config.shutdown_timeout,
        "stopped accepting; waiting for open connections to finish"
    );
    if tokio::time::timeout(config.shutdown_timeout, connections.wait())
        .await
        .is_err()
    {
        tracing::warn!(
            open_connections = connections.len(),
            "closing connections still open after the shutdown timeout"
        );
        cut.cancel();
        connections.wait().await;
    }
    background.cancel();
    while let Some(done) = tasks.join_next().await {
        if let Ok(name) = done {
            tracing::debug!(task = name, "stopped");
        }
    }
    tracing::info!("gateway stopped");
    Ok(())
}

/// Relays one client connection: dial endpoints in pick order until one answers (each failure
/// marks that endpoint down), then copy bytes both ways until either side closes.
async fn relay(client: TcpStream, pool: &Pool, metrics: &Metrics, dial_timeout: Duration) {
    let _ = client.set_nodelay(true);
    let mut tried: Vec<String> = Vec::new();
    let (upstream, picked_key) = loop {
        let Some(picked) = pool.pick(&tried) else {
            metrics.refused.inc();
            tracing::warn!(tried = ?tried, "no endpoint available for a client connection");
            return;
        };
        match probe::dial(&picked.addrs, dial_timeout).await {
            Ok(stream) => break (stream, picked.key),
            Err(e) => {
                metrics
                    .dial_failures
                    .with_label_values(&[picked.key.as_str()])
                    .inc();
                pool.mark_down(&picked.key, &e);
                tried.push(picked.key);
            }
        }
    };
    tracing::debug!(endpoint = %picked_key, "relaying a client connection");
    let _ = upstream.set_nodelay(true);
    // Counted as read, so a relay that ends with an error (a reset) still counts its bytes.
    let mut client = Counted::new(client);
    let mut upstream = Counted::new(upstream);
    let _ = tokio::io::copy_bidirectional_with_sizes(
        &mut client,
        &mut upstream,
        RELAY_BUFFER,
        RELAY_BUFFER,
    )
    .await;
    metrics.add_bytes(client.read, upstream.read);
}

/// A relayed stream that counts the bytes read from it.
struct Counted<S> {
    inner: S,
    read: u64,
}

impl<S> Counted<S> {
    fn new(inner: S) -> Self {
        Counted { inner, read: 0 }
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for Counted<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let before = buf.filled().len();
        let polled = Pin::new(&mut self.inner).poll_read(cx, buf);
        self.read += (buf.filled().len() - before) as u64;
        polled
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Counted<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        data: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write(cx, data)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

/// Probes every endpoint that is due (see `Pool::due`), at most [`MAX_PARALLEL_PROBES`] at a
/// time, until `stop`.
async fn health_monitor(
    pool: Arc<Pool>,
    prober: Prober,
    metrics: Metrics,
    stop: CancellationToken,
) {
    let mut probes: JoinSet<(String, Result<(), String>)> = JoinSet::new();
    loop {
        let now = Instant::now();
        let (due, next) = pool.due(now);
        for check in due {
            while probes.len() >= MAX_PARALLEL_PROBES {
                if let Some(Ok((key, result))) = probes.join_next().await {
                    apply(&pool, &metrics, &key, result);
                }
            }
            let prober = prober.clone();
            // Task: one probe, joined by this loop.
            probes.spawn(async move {
                let result = prober
                    .probe(&check.addrs, check.probe == ProbeKind::Tls)
                    .await;
                (check.key, result)
            });
        }
        // Wake for the next due check, a finished probe, or at least once a second (a dial
        // failure on the client path may have scheduled an earlier check).
        let wake = next
            .unwrap_or(now + Duration::from_secs(1))
            .min(now + Duration::from_secs(1));
        tokio::select! {
            _ = stop.cancelled() => break,
            Some(Ok((key, result))) = probes.join_next(), if !probes.is_empty() => {
                apply(&pool, &metrics, &key, result);
            }
            _ = tokio::time::sleep_until(wake.into()) => {}
        }
    }
    probes.shutdown().await;
}

fn apply(pool: &Pool, metrics: &Metrics, key: &str, result: Result<(), String>) {
    let label = if result.is_ok() { "ok" } else { "fail" };
    metrics.probes.with_label_values(&[label]).inc();
    match result {
        Ok(()) => pool.mark_up(key),
        Err(e) => {
            pool.mark_down(key, &e);
        }
    }
}

/// Looks the SRV records up every `every` and replaces the pool's endpoints with the result;
/// keeps the current endpoints when the lookup fails or finds nothing usable.
async fn srv_refresher(
    discovery: Discovery,
    pool: Arc<Pool>,
    prober: Prober,
    every: Duration,
    stop: CancellationToken,
) {
    loop {
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tokio::time::sleep(every) => {}
        }
        let found = tokio::select! {
            _ = stop.cancelled() => return,
            found = discovery.discover(&prober, true) => found,
        };
        match found {
            Ok((specs, _)) if !specs.is_empty() => {
                if pool.replace(specs) {
                    tracing::info!(endpoints = ?pool.keys(), "endpoints changed after SRV re-resolution");
                }
            }
            Ok((_, why)) => tracing::warn!(
                srv_server = %discovery.domain,
                reason = %why.unwrap_or_else(|| "no SRV targets".to_string()),
                "SRV re-resolution found no usable endpoint; keeping the current ones"
            ),
            Err(e) => tracing::warn!(
                srv_server = %discovery.domain,
                error = %e,
                "SRV re-resolution failed; keeping the current endpoints"
            ),
        }
    }
}
