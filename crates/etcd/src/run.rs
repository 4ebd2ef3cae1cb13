//! Running a member: bind the listeners, start the server, publish, serve, and shut down in
//! order on SIGINT/SIGTERM or when a task fails (etcd `embed/etcd.go`, `etcdmain/etcd.go`).

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, bail};
use etcdrs_server::tls::{TlsClient, TlsServer};
use etcdrs_server::{EtcdServer, ServerConfig, TaskResult};
use tokio::net::{TcpListener, TcpSocket};
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;
use url::Url;

/// The address a `http://host:port` URL names, resolved for binding.
fn bind_addr(url: &Url) -> anyhow::Result<SocketAddr> {
    match url.scheme() {
        "http" | "https" => {}
        "unix" | "unixs" => bail!("unix socket listeners are not supported yet: {url}"),
        other => bail!("unsupported URL scheme {other:?} in {url}"),
    }
    let host = url.host_str().context("URL without host")?;
    let port = url.port_or_known_default().context("URL without port")?;
    let host = if host == "localhost" {
        "127.0.0.1"
    } else {
        host
    };
    let host = host.trim_start_matches('[').trim_end_matches(']');
    format!("{host}:{port}")
        .parse::<SocketAddr>()
        .or_else(|_| {
            use std::net::ToSocketAddrs;
            (host, port)
                .to_socket_addrs()?
                .next()
                .ok_or_else(|| std::io::Error::other("no address"))
        })
        .with_context(|| format!("cannot resolve {url}"))
}

/// A listener on `addr`. SO_REUSEADDR is set, as Go's (and so etcd's) listeners set it on
/// Unix whatever `--socket-reuse-address` says; SO_REUSEPORT only with `--socket-reuse-port`.
fn listen(addr: SocketAddr, reuse_port: bool) -> anyhow::Result<TcpListener> {
    let socket = if addr.is_ipv4() {
        TcpSocket::new_v4()
    } else {
        TcpSocket::new_v6()
    }
    .with_context(|| format!("listen tcp {addr}: socket"))?;
    socket
        .set_reuseaddr(true)
        .with_context(|| format!("listen tcp {addr}: SO_REUSEADDR"))?;
    if reuse_port {
        socket
            .set_reuseport(true)
            .with_context(|| format!("listen tcp {addr}: SO_REUSEPORT"))?;
    }
    socket
        .bind(addr)
        .with_context(|| format!("listen tcp {addr}: bind: address already in use"))?;
    socket
        .listen(LISTEN_BACKLOG)
        .with_context(|| format!("listen tcp {addr}: listen"))
}

/// The accept queue of each listener (Linux's default `somaxconn`, which Go's listeners use).
const LISTEN_BACKLOG: u32 = 4096;

/// The TLS a listener on `url` serves with: `https` needs certificates (etcd's error when they
/// are missing); `http` ignores them, with etcd's warning.
fn listener_tls(
    url: &Url,
    tls: Option<&Arc<TlsServer>>,
    flags: &str,
    kind: &str,
) -> anyhow::Result<Option<Arc<TlsServer>>> {
    match (url.scheme(), tls) {
        ("https", Some(tls)) => Ok(Some(tls.clone())),
        ("https", None) => bail!(
            "TLS key/cert ({flags}) must be provided for {kind} url {} with HTTPS scheme",
            etcdrs_server::url_string(url)
        ),
        (_, Some(_)) => {
            tracing::warn!(
                url = %etcdrs_server::url_string(url),
                "scheme is HTTP while key and cert files are present; ignoring key and cert files"
            );
            Ok(None)
        }
        (_, None) => Ok(None),
    }
}

/// How a member's run ended.
pub enum Stopped {
    /// By this signal, after a clean shutdown; the process re-raises it, as etcd does.
    Signal(i32),
    /// The member was removed from the cluster. etcd exits 0 then, so that a supervisor does
    /// not restart it into a loop of refused starts.
    Removed,
}

/// Run a member until it is told to stop. Returns an error for a fatal failure.
pub async fn run(config: ServerConfig) -> anyhow::Result<Stopped> {
    tracing::info!(
        name = %config.name,
        data_dir = %config.data_dir.display(),
        advertise_client_urls = ?config.advertise_client_urls.iter().map(etcdrs_server::url_string).collect::<Vec<_>>(),
        "starting an etcd server"
    );
    // TLS settings load first: a bad certificate fails start-up before anything is bound.
    let client_tls = config.client_tls.clone().map(TlsServer::new).transpose()?;
    let peer_tls = config.peer_tls.clone().map(TlsServer::new).transpose()?;
    // The peer client's TLS (built again by the server for its transport) fails here too.
    if let Some(info) = &config.peer_tls {
        TlsClient::new(info.clone())?;
    }
    // Bind first, as etcd does: a port in use fails start-up before anything is written.
    let mut peer_listeners = Vec::new();
    for url in &config.listen_peer_urls {
        let tls = listener_tls(
            url,
            peer_tls.as_ref(),
            "--peer-cert-file, --peer-key-file",
            "peer",
        )?;
        let addr = bind_addr(url)?;
        let listener = listen(addr, config.socket_reuse_port)?;
        tracing::info!(address = %addr, "starting peer listener");
        peer_listeners.push((listener, tls));
    }
    // The gRPC (and, unless --listen-client-http-urls is given, HTTP) listeners, then the
    // HTTP-only ones.
    let mut client_listeners = Vec::new();
    let client_urls = config.listen_client_urls.iter().map(|url| (url, false));
    let http_urls = config.listen_client_http_urls.iter().map(|url| (url, true));
    for (url, http_only) in client_urls.chain(http_urls) {
        let tls = listener_tls(
            url,
            client_tls.as_ref(),
            "--cert-file, --key-file",
            "client",
        )?;
        let addr = bind_addr(url)?;
        let listener = listen(addr, config.socket_reuse_port)?;
        client_listeners.push((addr, listener, tls, http_only));
    }

    let mut metrics_listeners = Vec::new();
    for url in &config.listen_metrics_urls {
        // https metrics URLs serve with the client TLS, as etcd's.
        let tls = if url.scheme() == "https" {
            listener_tls(
                url,
                client_tls.as_ref(),
                "--cert-file, --key-file",
                "metrics",
            )?
        } else {
            None
        };
        let addr = bind_addr(url)?;
        let listener = listen(addr, config.socket_reuse_port)?;
        metrics_listeners.push((addr, listener, tls));
    }

    let shutdown = CancellationToken::new();
    let mut tasks: JoinSet<TaskResult> = JoinSet::new();
    let server = EtcdServer::start(config, &mut tasks, shutdown.clone()).await?;

    // Peers must reach us before we can publish: raft needs a quorum for that.
    for (listener, tls) in peer_listeners {
        let server = server.clone();
        let stop = shutdown.clone();
        tasks.spawn(async move {
            let result = etcdrs_server::http::serve_peers(server, listener, tls, stop).await;
            ("peer listener", result.map_err(|e| e.to_string()))
        });
    }
    // etcd checks its data against its peers' before it serves anyone.
    if server.config().initial_corrupt_check {
        etcdrs_server::corrupt::check_at_start(&server).await?;
    }
    tokio::select! {
        published = server.publish() => published?,
        Some(done) = tasks.join_next() => {
            shutdown.cancel();
            if server.is_removed() {
                drain(&mut tasks).await;
                return Ok(Stopped::Removed);
            }
            report(done)?;
        }
    }
    for (addr, listener, tls) in metrics_listeners {
        let server = server.clone();
        let stop = shutdown.clone();
        tracing::info!(address = %addr, "serving metrics");
        tasks.spawn(async move {
            let result = etcdrs_server::http::serve_metrics(server, listener, tls, stop).await;
            ("metrics listener", result.map_err(|e| e.to_string()))
        });
    }
    for (addr, listener, tls, http_only) in client_listeners {
        let server = server.clone();
        let stop = shutdown.clone();
        let secure = tls.is_some();
        tasks.spawn(async move {
            let result = if http_only {
                etcdrs_server::http::serve_http(server, listener, tls, stop).await
            } else {
                etcdrs_server::http::serve(server, listener, tls, stop).await
            };
            ("client listener", result.map_err(|e| e.to_string()))
        });
        tracing::info!("ready to serve client requests");
        if secure {
            tracing::info!(address = %addr, "serving client traffic securely");
        } else {
            tracing::warn!(
                address = %addr,
                "serving client traffic insecurely; this is strongly discouraged!"
            );
        }
    }

    let outcome = tokio::select! {
        signal = shutdown_signal() => {
            tracing::info!(signal = signal_name(signal), "received signal; shutting down");
            Ok(Stopped::Signal(signal))
        }
        Some(done) = tasks.join_next() => {
            if server.is_removed() {
                Ok(Stopped::Removed)
            } else {
                report(done).map(|()| Stopped::Signal(0))
            }
        }
    };
    shutdown.cancel();
    drain(&mut tasks).await;
    outcome
}

/// Waits (at most 10 s) for every task to stop once the shutdown token is cancelled.
async fn drain(tasks: &mut JoinSet<TaskResult>) {
    let all = async { while tasks.join_next().await.is_some() {} };
    if tokio::time::timeout(Duration::from_secs(10), all)
        .await
        .is_err()
    {
        tracing::warn!("tasks did not stop in time");
    }
    tracing::info!("stopped etcd server");
}

pub(crate) fn signal_name(signal: i32) -> &'static str {
    match signal {
        signal_hook::consts::SIGTERM => "terminated",
        signal_hook::consts::SIGINT => "interrupt",
        _ => "signal",
    }
}

fn report(done: Result<TaskResult, tokio::task::JoinError>) -> anyhow::Result<()> {
    match done {
        Ok((name, Ok(()))) => bail!("task {name} stopped unexpectedly"),
        Ok((name, Err(e))) => bail!("task {name} failed: {e}"),
        Err(e) => bail!("task panicked: {e}"),
    }
}

pub(crate) async fn shutdown_signal() -> i32 {
    use tokio::signal::unix::{SignalKind, signal};
    let (Ok(mut term), Ok(mut int)) = (
        signal(SignalKind::terminate()),
        signal(SignalKind::interrupt()),
    ) else {
        return std::future::pending::<i32>().await;
    };
    tokio::select! {
        _ = term.recv() => signal_hook::consts::SIGTERM,
        _ = int.recv() => signal_hook::consts::SIGINT,
    }
}
