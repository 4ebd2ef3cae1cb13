//! TLS towards a member over rustls: the client configuration from PEM files (the files each
//! caller names with its own flags: `--cert`/`--key`/`--cacert` for the proxy,
//! `--discovery-cert` and the like for discovery), the handshake on an open TCP connection,
//! and the tonic connector that dials TCP and then TLS for a channel. The PEM readers are
//! public for the callers' server sides, which read the same files the same way.

use std::future::Future;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use etcdrs_tls::provider;
use hyper_util::rt::TokioIo;
use rustls::RootCertStore;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use tokio::net::TcpStream;
use tokio_rustls::client::TlsStream;
use tonic::transport::Uri;

use crate::error::{Error, Result};

/// A client configuration for TLS to the cluster.
pub type ClientTls = Arc<rustls::ClientConfig>;

/// The port dialed when an endpoint names none (etcd's client port).
const DEFAULT_PORT: u16 = 2379;

/// The system's CA bundle (Debian's path), trusted when no CA file is given.
const SYSTEM_CA_BUNDLE: &str = "/etc/ssl/certs/ca-certificates.crt";

/// What to present and trust when talking TLS to a cluster.
#[derive(Clone, Debug, Default)]
pub struct TlsFiles {
    /// Client certificate (PEM).
    pub cert: Option<PathBuf>,
    /// Its key (PEM).
    pub key: Option<PathBuf>,
    /// CA bundle for the members' certificates; the system's when absent.
    pub cacert: Option<PathBuf>,
    /// Accept any server certificate.
    pub insecure_skip_verify: bool,
}

fn tls_error(path: &Path, reason: impl std::fmt::Display) -> Error {
    Error::Tls {
        path: path.display().to_string(),
        reason: reason.to_string(),
    }
}

/// Every certificate of the PEM file at `path` (at least one).
pub fn certs(path: &Path) -> Result<Vec<CertificateDer<'static>>> {
    let certs: Vec<_> = CertificateDer::pem_file_iter(path)
        .map_err(|e| tls_error(path, e))?
        .collect::<std::result::Result<_, _>>()
        .map_err(|e| tls_error(path, e))?;
    if certs.is_empty() {
        return Err(tls_error(path, "no certificate found"));
    }
    Ok(certs)
}

/// The private key of the PEM file at `path`.
pub fn private_key(path: &Path) -> Result<PrivateKeyDer<'static>> {
    PrivateKeyDer::from_pem_file(path).map_err(|e| tls_error(path, e))
}

/// The certificates of the PEM file at `path` as trust anchors.
pub fn roots(path: &Path) -> Result<RootCertStore> {
    let mut store = RootCertStore::empty();
    for cert in certs(path)? {
        store.add(cert).map_err(|e| tls_error(path, e))?;
    }
    Ok(store)
}

/// A client configuration from `files` offering `alpn` (`h2` for gRPC, `http/1.1` for plain
/// HTTP): a client certificate when both `cert` and `key` are given; trust in `cacert`, else
/// in the system's bundle (none if it cannot be read), or in anything with
/// `insecure_skip_verify` (the handshake's signatures are still checked).
pub fn client_config(files: &TlsFiles, alpn: &[u8]) -> Result<ClientTls> {
    let builder = rustls::ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(|e| tls_error(Path::new("tls"), e))?;
    let builder = if files.insecure_skip_verify {
        builder
            .dangerous()
            .with_custom_certificate_verifier(etcdrs_tls::AnyServerCert::new(provider()))
    } else {
        let store = match &files.cacert {
            Some(ca) => roots(ca)?,
            None => roots(Path::new(SYSTEM_CA_BUNDLE)).unwrap_or_else(|_| RootCertStore::empty()),
        };
        builder.with_root_certificates(store)
    };
    let mut config = match (&files.cert, &files.key) {
        (Some(cert), Some(key)) => builder
            .with_client_auth_cert(certs(cert)?, private_key(key)?)
            .map_err(|e| tls_error(cert, e))?,
        _ => builder.with_no_client_auth(),
    };
    config.alpn_protocols = vec![alpn.to_vec()];
    Ok(Arc::new(config))
}

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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unreadable_files_are_named() {
        let dir = std::env::temp_dir().join("etcdrs-client-no-such-dir");
        let missing = dir.join("ca.pem");
        let files = TlsFiles {
            cacert: Some(missing.clone()),
            ..TlsFiles::default()
        };
        let err = client_config(&files, b"h2").expect_err("the CA file does not exist");
        match &err {
            Error::Tls { path, .. } => assert_eq!(path, &missing.display().to_string()),
            other => panic!("unexpected {other:?}"),
        }
        assert!(
            err.to_string()
                .starts_with(&format!("{}: ", missing.display()))
        );
    }

    #[test]
    fn an_empty_pem_file_has_no_certificate() {
        let path =
            std::env::temp_dir().join(format!("etcdrs-client-empty-{}.pem", std::process::id()));
        std::fs::write(&path, "").expect("a temporary file");
        let err = certs(&path).expect_err("no certificate in it");
        let _ = std::fs::remove_file(&path);
        assert_eq!(
            err.to_string(),
            format!("{}: no certificate found", path.display())
        );
    }

    #[test]
    fn skipping_verification_needs_no_file_and_offers_the_alpn() {
        let files = TlsFiles {
            insecure_skip_verify: true,
            ..TlsFiles::default()
        };
        let config = client_config(&files, b"http/1.1").expect("no file to read");
        assert_eq!(config.alpn_protocols, vec![b"http/1.1".to_vec()]);
    }
}
