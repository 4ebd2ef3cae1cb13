//! Dialing endpoints and probing their health.
//!
//! etcd's gateway only notices an endpoint that refuses connections; a member that accepts and
//! never answers (a stopped process, a hung machine whose kernel still completes handshakes)
//! keeps getting clients (etcd issue #7593). The probe here asks for an answer:
//!
//! - plain endpoints: dial with a timeout, send `GET /version` (etcd and etcd-rs both answer it on
//!   the client port) and wait for the first byte of any answer. `/version` rather than `/health`:
//!   it is answered by the member's HTTP stack without a raft round trip, so it tells a hung
//!   process from a live one without taking every member out of rotation while the cluster is
//!   busy or between leaders (a member's `/health` then takes a second or more, or fails; clients
//!   with `RequireLeader` handle that case, and a gateway could not help them). An endpoint that closes without
//!   a byte gets a second chance as a TLS endpoint (`--endpoints` does not say which endpoints
//!   speak TLS, and a TLS server drops a plain request): a TLS hello that is answered proves a
//!   live server. Nothing of that handshake is trusted or kept;
//! - TLS endpoints found through `_etcd-client-ssl`: a full handshake verified against
//!   `--trusted-ca-file` with the SRV domain as server name, as etcd validates them.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use rustls::ClientConfig;
use rustls::pki_types::{CertificateDer, ServerName};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio_rustls::TlsConnector;

/// The most bytes of a probe answer ever read.
const ANSWER_BYTES: usize = 64;

/// How probes reach endpoints.
#[derive(Clone)]
pub(crate) struct Prober {
    pub(crate) dial_timeout: Duration,
    pub(crate) answer_timeout: Duration,
    /// Verifies against `--trusted-ca-file`; `None` without one.
    pub(crate) verified: Option<(Arc<ClientConfig>, ServerName<'static>)>,
    /// Accepts any certificate: only used to see that a TLS server answers.
    pub(crate) liveness: Arc<ClientConfig>,
}

impl Prober {
    pub(crate) fn new(
        dial_timeout: Duration,
        answer_timeout: Duration,
        verified: Option<(Arc<ClientConfig>, ServerName<'static>)>,
    ) -> Result<Prober, rustls::Error> {
        let provider = etcdrs_tls::provider();
        let liveness = ClientConfig::builder_with_provider(provider.clone())
            .with_safe_default_protocol_versions()?
            .dangerous()
            .with_custom_certificate_verifier(etcdrs_tls::AnyServerCert::new(provider))
            .with_no_client_auth();
        Ok(Prober {
            dial_timeout,
            answer_timeout,
            verified,
            liveness: Arc::new(liveness),
        })
    }

    /// Plain or TLS-verified probe of one endpoint.
    pub(crate) async fn probe(&self, addrs: &[SocketAddr], tls: bool) -> Result<(), String> {
        if tls {
            let Some((config, name)) = &self.verified else {
                return Err("no --trusted-ca-file to verify the TLS endpoint with".to_string());
            };
            let stream = dial(addrs, self.dial_timeout).await?;
            return handshake(stream, config.clone(), name.clone(), self.answer_timeout).await;
        }
        let mut stream = dial(addrs, self.dial_timeout).await?;
        let request = b"GET /version HTTP/1.1\r\nHost: etcd\r\nUser-Agent: etcd-gateway\r\nConnection: close\r\n\r\n";
        let mut answer = [0u8; ANSWER_BYTES];
        let exchange = async {
            stream.write_all(request).await?;
            stream.read(&mut answer).await
        };
        let first = match tokio::time::timeout(self.answer_timeout, exchange).await {
            Err(_) => return Err(format!("no answer within {:?}", self.answer_timeout)),
            Ok(Ok(n)) if n > 0 => return Ok(()),
            Ok(Ok(_)) => "closed".to_string(),
            Ok(Err(e)) => e.to_string(),
        };
        // Closed or reset without a byte: perhaps a TLS-only endpoint dropping plain text.
        let stream = dial(addrs, self.dial_timeout).await?;
        let name = ServerName::try_from("etcd").map_err(|e| e.to_string())?;
        handshake(stream, self.liveness.clone(), name, self.answer_timeout)
            .await
            .map_err(|e| format!("closed without answering ({first}; TLS hello: {e})"))
    }
}

/// Connects to the first of `addrs` that accepts within `timeout` each.
pub(crate) async fn dial(addrs: &[SocketAddr], timeout: Duration) -> Result<TcpStream, String> {
    let mut last = String::from("no address to dial");
    for addr in addrs {
        match tokio::time::timeout(timeout, TcpStream::connect(addr)).await {
            Ok(Ok(stream)) => return Ok(stream),
            Ok(Err(e)) => last = format!("dial tcp {addr}: {e}"),
            Err(_) => last = format!("dial tcp {addr}: i/o timeout"),
        }
    }
    Err(last)
}

async fn handshake(
    stream: TcpStream,
    config: Arc<ClientConfig>,
    name: ServerName<'static>,
    timeout: Duration,
) -> Result<(), String> {
    let connector = TlsConnector::from(config);
    match tokio::time::timeout(timeout, connector.connect(name, stream)).await {
        Err(_) => Err(format!("TLS handshake not answered within {timeout:?}")),
        Ok(Err(e)) => Err(e.to_string()),
        Ok(Ok(_)) => Ok(()),
    }
}

/// A client configuration that trusts the CA certificates in `path` (PEM).
pub(crate) fn trusted_ca_config(path: &std::path::Path) -> Result<Arc<ClientConfig>, String> {
    use rustls::pki_types::pem::PemObject;
    let mut roots = rustls::RootCertStore::empty();
    let certs = CertificateDer::pem_file_iter(path).map_err(|e| e.to_string())?;
    for cert in certs {
        let cert = cert.map_err(|e| e.to_string())?;
        roots.add(cert).map_err(|e| e.to_string())?;
    }
    if roots.is_empty() {
        return Err("no certificate found".to_string());
    }
    let provider = etcdrs_tls::provider();
    let config = ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| e.to_string())?
        .with_root_certificates(roots)
        .with_no_client_auth();
    Ok(Arc::new(config))
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::net::TcpListener;

    fn prober() -> Prober {
        Prober::new(Duration::from_millis(500), Duration::from_millis(300), None).expect("prober")
    }

    /// A listener whose accepted connections get `behaviour` applied; returns its address.
    async fn server(behaviour: &'static str) -> SocketAddr {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr");
        // Task: the test server; ends with the test's runtime.
        tokio::spawn(async move {
            let mut held = Vec::new();
            while let Ok((mut conn, _)) = listener.accept().await {
                match behaviour {
                    "answer" => {
                        let mut buf = [0u8; 256];
                        let _ = conn.read(&mut buf).await;
                        let _ = conn.write_all(b"HTTP/1.1 200 OK\r\n\r\n").await;
                    }
                    "close" => drop(conn),
                    _ => held.push(conn),
                }
            }
        });
        addr
    }

    #[tokio::test]
    async fn answering_endpoint_is_alive() {
        let addr = server("answer").await;
        assert_eq!(prober().probe(&[addr], false).await, Ok(()));
    }

    #[tokio::test]
    async fn silent_endpoint_is_down() {
        let addr = server("hang").await;
        let err = prober().probe(&[addr], false).await.expect_err("down");
        assert!(err.contains("no answer"), "{err}");
    }

    #[tokio::test]
    async fn endpoint_that_closes_at_once_is_down() {
        let addr = server("close").await;
        let err = prober().probe(&[addr], false).await.expect_err("down");
        assert!(err.contains("closed without answering"), "{err}");
    }

    #[tokio::test]
    async fn refused_dial_is_down() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        let addr = listener.local_addr().expect("addr");
        drop(listener);
        let err = dial(&[addr], Duration::from_millis(500))
            .await
            .expect_err("refused");
        assert!(err.starts_with(&format!("dial tcp {addr}")), "{err}");
    }
}
