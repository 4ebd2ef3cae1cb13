//! The HTTP/1.1 client members call each other with (etcd's peer round trippers, which speak
//! HTTP/1.1 over plain TCP or TLS): one connection pool per [`PeerClient`], dialled by
//! [`PeerConnector`], which adds the peer TLS (`--peer-cert-file`, ...) for `https` URLs.
//! Dials time out after a second (TLS handshakes after three), as etcd's `DialTimeout`.
//!
//! The TLS comes from whoever builds the client (the server's configuration, which follows its
//! certificate files): this crate knows how to dial with it, not where it comes from.

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use axum::body::Body;
use axum::http::Uri;
use hyper_util::client::legacy::connect::{Connected, Connection};
use hyper_util::rt::{TokioExecutor, TokioIo};
use rustls::pki_types::ServerName;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;

/// How long dialling a peer may take (TCP connect).
const DIAL_TIMEOUT: Duration = Duration::from_secs(1);
/// How long dialling plus the TLS handshake may take.
const TLS_DIAL_TIMEOUT: Duration = Duration::from_secs(3);

/// The client side of the peer TLS: a connector for each new connection (so that renewed
/// certificate files apply) and the name to verify a peer's certificate for.
pub trait PeerTls: Send + Sync + 'static {
    /// The connector for a new connection.
    fn connector(&self) -> tokio_rustls::TlsConnector;
    /// The name to verify the certificate of `host` for (`None`: not a valid name).
    fn server_name_for(&self, host: &str) -> Option<ServerName<'static>>;
}

/// The pooled client for every call to peers: links, and the server's one-off calls. Cheap
/// to clone; clones share the pool.
#[derive(Clone)]
pub struct PeerClient {
    inner: hyper_util::client::legacy::Client<PeerConnector, Body>,
}

impl PeerClient {
    /// A client that dials `https` peer URLs with `tls` (without it, they fail to dial).
    pub fn new(tls: Option<Arc<dyn PeerTls>>) -> PeerClient {
        let inner = hyper_util::client::legacy::Client::builder(TokioExecutor::new())
            .pool_idle_timeout(Duration::from_secs(30))
            .pool_max_idle_per_host(4)
            .build(PeerConnector { tls });
        PeerClient { inner }
    }

    /// Send `request`, answering with the response's head (the body streams).
    pub fn request(
        &self,
        request: axum::http::Request<Body>,
    ) -> hyper_util::client::legacy::ResponseFuture {
        self.inner.request(request)
    }
}

/// Dials peer URLs: plain TCP for `http`, the peer TLS for `https`.
#[derive(Clone)]
pub struct PeerConnector {
    tls: Option<Arc<dyn PeerTls>>,
}

/// A connection to a peer.
pub enum PeerStream {
    /// Plain TCP.
    Plain(TcpStream),
    /// TLS over TCP.
    Tls(Box<tokio_rustls::client::TlsStream<TcpStream>>),
}

impl Connection for PeerStream {
    fn connected(&self) -> Connected {
        Connected::new()
    }
}

impl AsyncRead for PeerStream {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        match self.get_mut() {
            PeerStream::Plain(s) => Pin::new(s).poll_read(cx, buf),
            PeerStream::Tls(s) => Pin::new(s.as_mut()).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for PeerStream {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            PeerStream::Plain(s) => Pin::new(s).poll_write(cx, buf),
            PeerStream::Tls(s) => Pin::new(s.as_mut()).poll_write(cx, buf),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            PeerStream::Plain(s) => Pin::new(s).poll_flush(cx),
            PeerStream::Tls(s) => Pin::new(s.as_mut()).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            PeerStream::Plain(s) => Pin::new(s).poll_shutdown(cx),
            PeerStream::Tls(s) => Pin::new(s.as_mut()).poll_shutdown(cx),
        }
    }
}

impl tower::Service<Uri> for PeerConnector {
    type Response = TokioIo<PeerStream>;
    type Error = io::Error;
    type Future = Pin<Box<dyn Future<Output = io::Result<TokioIo<PeerStream>>> + Send>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, uri: Uri) -> Self::Future {
        let tls = self.tls.clone();
        Box::pin(async move { dial(uri, tls).await.map(TokioIo::new) })
    }
}

async fn dial(uri: Uri, tls: Option<Arc<dyn PeerTls>>) -> io::Result<PeerStream> {
    let host = uri
        .host()
        .ok_or_else(|| io::Error::other(format!("no host in {uri}")))?
        .to_owned();
    let secure = uri.scheme_str() == Some("https");
    let port = uri.port_u16().unwrap_or(if secure { 443 } else { 80 });
    let addr = host
        .trim_start_matches('[')
        .trim_end_matches(']')
        .to_owned();
    let timed_out = || io::Error::new(io::ErrorKind::TimedOut, "i/o timeout");
    if !secure {
        let tcp = tokio::time::timeout(DIAL_TIMEOUT, TcpStream::connect((addr.as_str(), port)))
            .await
            .map_err(|_| timed_out())??;
        let _ = tcp.set_nodelay(true);
        return Ok(PeerStream::Plain(tcp));
    }
    let tls =
        tls.ok_or_else(|| io::Error::other("no peer TLS configured for an https peer URL"))?;
    let name = tls
        .server_name_for(&host)
        .ok_or_else(|| io::Error::other(format!("invalid host name {host:?}")))?;
    let connect = async {
        let tcp = tokio::time::timeout(DIAL_TIMEOUT, TcpStream::connect((addr.as_str(), port)))
            .await
            .map_err(|_| timed_out())??;
        let _ = tcp.set_nodelay(true);
        tls.connector().connect(name, tcp).await
    };
    let stream = tokio::time::timeout(TLS_DIAL_TIMEOUT, connect)
        .await
        .map_err(|_| timed_out())??;
    Ok(PeerStream::Tls(Box::new(stream)))
}
