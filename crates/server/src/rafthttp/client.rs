//! The HTTP/1.1 client members call each other with (etcd's peer round trippers, which speak
//! HTTP/1.1 over plain TCP or TLS): one connection pool for the process, dialled by
//! [`PeerConnector`], which adds the peer TLS (`--peer-cert-file`, ...) for `https` URLs.
//! Dials time out after a second (TLS handshakes after three), as etcd's `DialTimeout`.

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::{Arc, OnceLock};
use std::task::{Context, Poll};
use std::time::Duration;

use axum::body::Body;
use axum::http::Uri;
use hyper_util::client::legacy::connect::{Connected, Connection};
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;

use crate::tls::TlsClient;

/// How long dialling a peer may take (TCP connect).
const DIAL_TIMEOUT: Duration = Duration::from_secs(1);
/// How long dialling plus the TLS handshake may take.
const TLS_DIAL_TIMEOUT: Duration = Duration::from_secs(3);

/// The TLS peers dial `https` peer URLs with; set once at start-up, before any link exists.
static CLIENT_TLS: OnceLock<Arc<TlsClient>> = OnceLock::new();

/// Use `tls` to dial `https` peer URLs.
pub fn set_client_tls(tls: Arc<TlsClient>) {
    let _ = CLIENT_TLS.set(tls);
}

/// The process's peer client.
pub type PeerClient = hyper_util::client::legacy::Client<PeerConnector, Body>;

/// The one pooled client for every peer call.
pub fn client() -> &'static PeerClient {
    static CLIENT: OnceLock<PeerClient> = OnceLock::new();
    CLIENT.get_or_init(|| {
        hyper_util::client::legacy::Client::builder(TokioExecutor::new())
            .pool_idle_timeout(Duration::from_secs(30))
            .pool_max_idle_per_host(4)
            .build(PeerConnector)
    })
}

/// Dials peer URLs: plain TCP for `http`, the peer TLS for `https`.
#[derive(Clone, Copy, Debug)]
pub struct PeerConnector;

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
        Box::pin(async move { dial(uri).await.map(TokioIo::new) })
    }
}

async fn dial(uri: Uri) -> io::Result<PeerStream> {
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
    let tls = CLIENT_TLS
        .get()
        .cloned()
        .ok_or_else(|| io::Error::other("no peer TLS configured for an https peer URL"))?;
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
