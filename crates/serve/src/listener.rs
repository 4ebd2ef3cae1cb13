//! The accept loop of a client-facing listener (the part of etcd's `embed/serve.go` that is
//! the same on every port), shared by the server's client, peer and metrics ports and by the
//! gRPC proxy's listeners.
//!
//! [`serve`] accepts TCP connections until its shutdown token fires, sets TCP_NODELAY on each
//! (small answers such as put acknowledgements and watch events must not wait for Nagle's
//! algorithm), and runs each connection as a task of its own [`tokio::task::JoinSet`]: first
//! the TLS handshake when the listener has TLS (bounded by [`HANDSHAKE_TIMEOUT`]), then the
//! write gathering of [`Coalesced`], then the handler's ping policy ([`Policed`]), then the
//! [`LenientAuthority`] filter, then the
//! caller's [`Handler`]. On shutdown it stops accepting,
//! asks every connection for a graceful close through the [`Watcher`] handed to the handler,
//! and aborts what is still open after [`SHUTDOWN_GRACE`].
//!
//! Connections are capped process-wide at the open-files limit less [`FD_RESERVE`]: a flood
//! of idle clients cannot take the descriptors the process needs for its own files (WAL
//! segments, the backend, snapshots) or for its peers. A connection over the cap is accepted
//! and closed at once (so the kernel's queue does not fill), with a warning at most once per
//! [`ACCEPT_BACKOFF`] burst.
//!
//! Connections come from an [`Incoming`]: a bound [`TcpListener`] in the member and the proxy,
//! or [`pipes`], in-memory connections a test dials without a socket.
//!
//! What differs between listeners stays with the caller's handler: hyper's settings, the
//! executor of a connection's streams, the router, and what a client certificate means.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use hyper_util::server::graceful::{GracefulShutdown, Watcher};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::{TcpListener, TcpStream};
use tokio_rustls::TlsAcceptor;
use tokio_rustls::rustls::pki_types::CertificateDer;
use tokio_util::sync::CancellationToken;

use crate::coalesce::Coalesced;
use crate::h2authority::LenientAuthority;
use crate::keepalive::{PingPolicy, Policed};

/// How long a client has to finish the TLS handshake.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// How long open connections have to close after shutdown before they are aborted.
pub const SHUTDOWN_GRACE: Duration = Duration::from_secs(2);
/// The pause after a failed accept (out of descriptors and the like), instead of spinning.
const ACCEPT_BACKOFF: Duration = Duration::from_millis(50);

/// Descriptors kept back from client connections for the process's own files and its peers.
pub const FD_RESERVE: u64 = 256;

/// Client connections open in the process, over every listener.
static OPEN_CONNECTIONS: AtomicUsize = AtomicUsize::new(0);

/// The most connections the process serves at once: its open-files limit less
/// [`FD_RESERVE`] (at least 64), read once.
fn connection_limit() -> usize {
    static LIMIT: OnceLock<usize> = OnceLock::new();
    *LIMIT.get_or_init(|| {
        let soft = nix::sys::resource::getrlimit(nix::sys::resource::Resource::RLIMIT_NOFILE)
            .map(|(soft, _)| soft)
            .unwrap_or(u64::MAX);
        usize::try_from(soft.saturating_sub(FD_RESERVE).max(64)).unwrap_or(usize::MAX)
    })
}

/// One counted connection; dropping it counts it out.
struct Slot;

impl Slot {
    /// A slot, unless the process is at its connection limit.
    fn take() -> Option<Slot> {
        let limit = connection_limit();
        OPEN_CONNECTIONS
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < limit).then_some(n + 1)
            })
            .ok()
            .map(|_| Slot)
    }
}

impl Slot {
    /// A slot past the cap (the peer port's connections are counted, not refused).
    fn always() -> Slot {
        OPEN_CONNECTIONS.fetch_add(1, Ordering::AcqRel);
        Slot
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        OPEN_CONNECTIONS.fetch_sub(1, Ordering::AcqRel);
    }
}

/// Where a listener's connections come from.
pub trait Incoming: Send + 'static {
    /// One connection.
    type Io: AsyncRead + AsyncWrite + Unpin + Send + 'static;

    /// The next connection and its remote address.
    fn accept(&mut self) -> impl Future<Output = std::io::Result<(Self::Io, SocketAddr)>> + Send;
}

impl Incoming for TcpListener {
    type Io = TcpStream;

    async fn accept(&mut self) -> std::io::Result<(TcpStream, SocketAddr)> {
        let (tcp, addr) = TcpListener::accept(self).await?;
        // Best effort: a socket that refuses the option still works, only slower.
        let _ = tcp.set_nodelay(true);
        Ok((tcp, addr))
    }
}

/// In-memory connections: what [`PipeDialer::dial`] opens, [`PipeListener`] accepts.
pub fn pipes(backlog: usize) -> (PipeDialer, PipeListener) {
    let (tx, rx) = tokio::sync::mpsc::channel(backlog.max(1));
    (PipeDialer { tx }, PipeListener { rx })
}

/// Bytes buffered in each direction of a pipe.
const PIPE_BUFFER: usize = 64 * 1024;

/// Opens in-memory connections to a [`PipeListener`].
#[derive(Clone)]
pub struct PipeDialer {
    tx: tokio::sync::mpsc::Sender<(tokio::io::DuplexStream, SocketAddr)>,
}

impl PipeDialer {
    /// A connection that the listener sees as coming from `from`; `None` once the listener
    /// is gone.
    pub async fn dial(&self, from: SocketAddr) -> Option<tokio::io::DuplexStream> {
        let (client, server) = tokio::io::duplex(PIPE_BUFFER);
        self.tx.send((server, from)).await.ok()?;
        Some(client)
    }
}

/// Accepts what its [`PipeDialer`]s open; with every dialer gone it waits for shutdown.
pub struct PipeListener {
    rx: tokio::sync::mpsc::Receiver<(tokio::io::DuplexStream, SocketAddr)>,
}

impl Incoming for PipeListener {
    type Io = tokio::io::DuplexStream;

    async fn accept(&mut self) -> std::io::Result<(tokio::io::DuplexStream, SocketAddr)> {
        match self.rx.recv().await {
            Some(conn) => Ok(conn),
            None => std::future::pending().await,
        }
    }
}

/// Where a TLS listener gets the acceptor for a new connection.
pub trait Acceptor: Send + Sync + 'static {
    /// The acceptor for a connection accepted now. A source that reloads its certificates
    /// returns the newest configuration; connections already open keep theirs.
    fn acceptor(&self) -> TlsAcceptor;
}

impl Acceptor for TlsAcceptor {
    fn acceptor(&self) -> TlsAcceptor {
        self.clone()
    }
}

/// The other end of an accepted connection.
#[derive(Clone, Debug)]
pub struct Peer {
    /// The client's address.
    pub addr: SocketAddr,
    /// The first certificate the client presented in the TLS handshake, which the acceptor's
    /// verifier accepted; `None` without TLS or without a client certificate.
    pub certificate: Option<CertificateDer<'static>>,
}

/// What a listener does with each connection once it is accepted, handshaken and filtered.
pub trait Handler: Clone + Send + 'static {
    /// Serves one connection until it ends. `watcher` must watch the connection (hyper's
    /// graceful close), so that shutdown can close it cleanly.
    fn serve<IO>(
        self,
        io: LenientAuthority<Policed<IO>>,
        peer: Peer,
        watcher: Watcher,
    ) -> impl Future<Output = ()> + Send
    where
        IO: AsyncRead + AsyncWrite + Unpin + Send + 'static;

    /// How this listener polices its clients' HTTP/2 pings; `None`, the default, answers
    /// them all.
    fn ping_policy(&self) -> Option<PingPolicy> {
        None
    }
}

/// Whether a listener's connections count against the process's connection cap.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Admission {
    /// Clients: capped (module docs).
    Capped,
    /// The peer port: members are few, and part of what the reserve is kept for.
    Uncapped,
}

/// Accepts connections from `listener` and serves each with a clone of `handler`, over TLS
/// when `tls` is given, until `shutdown` (see the module docs).
pub async fn serve<L: Incoming, H: Handler>(
    mut listener: L,
    tls: Option<Arc<dyn Acceptor>>,
    handler: H,
    admission: Admission,
    shutdown: CancellationToken,
) {
    let graceful = GracefulShutdown::new();
    let mut connections = tokio::task::JoinSet::new();
    let mut last_refusal: Option<std::time::Instant> = None;
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => break,
            Some(_) = connections.join_next(), if !connections.is_empty() => {}
            accepted = listener.accept() => {
                let (conn, addr) = match accepted {
                    Ok(conn) => conn,
                    Err(e) => {
                        tracing::warn!(error = %e, "failed to accept client connection");
                        tokio::time::sleep(ACCEPT_BACKOFF).await;
                        continue;
                    }
                };
                let slot = match admission {
                    Admission::Capped => Slot::take(),
                    Admission::Uncapped => Some(Slot::always()),
                };
                let Some(slot) = slot else {
                    let now = std::time::Instant::now();
                    if last_refusal.is_none_or(|at| now.duration_since(at) >= ACCEPT_BACKOFF) {
                        tracing::warn!(
                            remote_addr = %addr,
                            limit = connection_limit(),
                            "too many open connections; closing a new one"
                        );
                        last_refusal = Some(now);
                    }
                    drop(conn);
                    continue;
                };
                tracing::debug!(remote_addr = %addr, "accepted connection");
                let handler = handler.clone();
                let watcher = graceful.watcher();
                let tls = tls.clone();
                // Task: one client connection (the TLS handshake, then HTTP until either side
                // closes).
                let policy = handler.ping_policy();
                connections.spawn(async move {
                    let _slot = slot;
                    let Some(tls) = tls else {
                        let peer = Peer { addr, certificate: None };
                        let io = LenientAuthority::new(Policed::new(Coalesced::new(conn), policy, addr));
                        handler.serve(io, peer, watcher).await;
                        return;
                    };
                    let handshake = tls.acceptor().accept(conn);
                    let stream = match tokio::time::timeout(HANDSHAKE_TIMEOUT, handshake).await {
                        Ok(Ok(stream)) => stream,
                        Ok(Err(e)) => {
                            tracing::warn!(remote_addr = %addr, error = %e, "rejected connection");
                            return;
                        }
                        Err(_) => return,
                    };
                    let certificate = stream
                        .get_ref()
                        .1
                        .peer_certificates()
                        .and_then(|certs| certs.first())
                        .cloned();
                    let peer = Peer { addr, certificate };
                    let io = LenientAuthority::new(Policed::new(Coalesced::new(stream), policy, addr));
                    handler.serve(io, peer, watcher).await;
                });
            }
        }
    }
    drop(listener);
    if tokio::time::timeout(SHUTDOWN_GRACE, graceful.shutdown())
        .await
        .is_err()
    {
        connections.abort_all();
    }
}

#[cfg(test)]
mod tests {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    use super::*;

    /// Writes the client's address as the server saw it, then closes.
    #[derive(Clone)]
    struct EchoPeer;

    impl Handler for EchoPeer {
        async fn serve<IO>(
            self,
            mut io: LenientAuthority<Policed<IO>>,
            peer: Peer,
            watcher: Watcher,
        ) where
            IO: AsyncRead + AsyncWrite + Unpin + Send + 'static,
        {
            drop(watcher);
            let text = format!("{} {}", peer.addr, peer.certificate.is_some());
            io.write_all(text.as_bytes()).await.unwrap();
            io.shutdown().await.unwrap();
        }
    }

    #[tokio::test]
    async fn serves_each_connection_and_stops_on_shutdown() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let shutdown = CancellationToken::new();
        let server = tokio::spawn(serve(
            listener,
            None,
            EchoPeer,
            Admission::Capped,
            shutdown.clone(),
        ));
        for _ in 0..3 {
            let mut client = TcpStream::connect(addr).await.unwrap();
            let mut answer = String::new();
            client.read_to_string(&mut answer).await.unwrap();
            assert_eq!(answer, format!("{} false", client.local_addr().unwrap()));
        }
        shutdown.cancel();
        server.await.unwrap();
        assert!(TcpStream::connect(addr).await.is_err(), "listener closed");
    }

    #[tokio::test]
    async fn serves_in_memory_connections_as_tcp_ones() {
        let (dialer, listener) = pipes(4);
        let shutdown = CancellationToken::new();
        let server = tokio::spawn(serve(
            listener,
            None,
            EchoPeer,
            Admission::Capped,
            shutdown.clone(),
        ));
        for port in [1000, 1001] {
            let from: SocketAddr = ([127, 0, 0, 2], port).into();
            let mut client = dialer.dial(from).await.expect("the listener is up");
            let mut answer = String::new();
            client.read_to_string(&mut answer).await.unwrap();
            assert_eq!(answer, format!("{from} false"));
        }
        shutdown.cancel();
        server.await.unwrap();
        assert!(
            dialer.dial(([127, 0, 0, 2], 1002).into()).await.is_none(),
            "the listener is gone after shutdown"
        );
    }
}
