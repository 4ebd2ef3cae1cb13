//! TLS towards a member over rustls: the handshake on an open TCP connection, and the tonic
//! connector that dials TCP and then TLS for a channel. The rustls configuration (certificates,
//! trust, ALPN) is the caller's, since each caller reads it from its own flags.

use std::future::Future;
use std::sync::Arc;

use hyper_util::rt::TokioIo;
use rustls::pki_types::ServerName;
use tokio::net::TcpStream;
use tokio_rustls::client::TlsStream;
use tonic::transport::Uri;

/// A client configuration for TLS to the cluster.
pub type ClientTls = Arc<rustls::ClientConfig>;

/// The port dialed when an endpoint names none (etcd's client port).
const DEFAULT_PORT: u16 = 2379;

fn invalid(what: &str) -> std::io::Error {
    std::io::Error::new(std::io::ErrorKind::InvalidInput, what.to_owned())
}

/// `host` without the brackets of an IPv6 literal.
fn unbracketed(host: &str) -> &str {
    host.trim_start_matches('[').trim_end_matches(']')
}

/// TLS with `config` over `tcp`, an open connection to `host` (a name or an IP literal,
/// bracketed or not), whose certificate must be for `host`.
pub async fn handshake(
    config: ClientTls,
    host: &str,
    tcp: TcpStream,
) -> std::io::Result<TlsStream<TcpStream>> {
    let name = ServerName::try_from(unbracketed(host).to_owned())
        .map_err(|_| invalid("endpoint host is not a valid TLS server name"))?;
    tokio_rustls::TlsConnector::from(config)
        .connect(name, tcp)
        .await
}

/// A tonic connector: TCP (with TCP_NODELAY) to the URI's host and port, then TLS with
/// `config`.
pub fn connector(
    config: ClientTls,
) -> impl tower::Service<
    Uri,
    Response = TokioIo<TlsStream<TcpStream>>,
    Error = std::io::Error,
    Future = impl Future<Output = std::io::Result<TokioIo<TlsStream<TcpStream>>>> + Send,
> + Clone
+ Send
+ 'static {
    tower::service_fn(move |uri: Uri| {
        let config = config.clone();
        async move {
            let host = uri.host().ok_or_else(|| invalid("endpoint has no host"))?;
            let port = uri.port_u16().unwrap_or(DEFAULT_PORT);
            let tcp = TcpStream::connect((unbracketed(host), port)).await?;
            let _ = tcp.set_nodelay(true);
            Ok(TokioIo::new(handshake(config, host, tcp).await?))
        }
    })
}
