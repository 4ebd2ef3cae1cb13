//! rustls configurations from PEM files: the proxy's server side (`--cert-file`,
//! `--key-file`, `--trusted-ca-file`: client certificates required when a CA is given, as
//! etcd's `ClientCertAuth`) and its client side towards the cluster (`--cert`, `--key`,
//! `--cacert`, `--insecure-skip-tls-verify`).

use std::path::Path;
use std::sync::Arc;

use rustls::RootCertStore;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};

use crate::Error;

/// The system's CA bundle (Debian's path), used when no `--cacert` is given.
const SYSTEM_CA_BUNDLE: &str = "/etc/ssl/certs/ca-certificates.crt";

use etcdrs_tls::provider;

fn tls_error(path: &Path, reason: impl std::fmt::Display) -> Error {
    Error::Tls {
        path: path.display().to_string(),
        reason: reason.to_string(),
    }
}

fn certs(path: &Path) -> Result<Vec<CertificateDer<'static>>, Error> {
    let certs: Vec<_> = CertificateDer::pem_file_iter(path)
        .map_err(|e| tls_error(path, e))?
        .collect::<Result<_, _>>()
        .map_err(|e| tls_error(path, e))?;
    if certs.is_empty() {
        return Err(tls_error(path, "no certificate found"));
    }
    Ok(certs)
}

fn key(path: &Path) -> Result<PrivateKeyDer<'static>, Error> {
    PrivateKeyDer::from_pem_file(path).map_err(|e| tls_error(path, e))
}

fn roots(path: &Path) -> Result<RootCertStore, Error> {
    let mut store = RootCertStore::empty();
    for cert in certs(path)? {
        store.add(cert).map_err(|e| tls_error(path, e))?;
    }
    Ok(store)
}

/// The server side: `cert`/`key`, and when `client_ca` is given, client certificates signed by
/// it are required. ALPN offers HTTP/2 and HTTP/1.1 (gRPC and `/metrics` on one port).
pub fn server_config(
    cert: &Path,
    key_file: &Path,
    client_ca: Option<&Path>,
) -> Result<Arc<rustls::ServerConfig>, Error> {
    let builder = rustls::ServerConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(|e| tls_error(cert, e))?;
    let builder = match client_ca {
        Some(ca) => {
            let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(
                Arc::new(roots(ca)?),
                provider(),
            )
            .build()
            .map_err(|e| tls_error(ca, e))?;
            builder.with_client_cert_verifier(verifier)
        }
        None => builder.with_no_client_auth(),
    };
    let mut config = builder
        .with_single_cert(certs(cert)?, key(key_file)?)
        .map_err(|e| tls_error(cert, e))?;
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok(Arc::new(config))
}

/// The client side towards the cluster.
pub fn client_config(
    cert: Option<&Path>,
    key_file: Option<&Path>,
    ca: Option<&Path>,
    insecure_skip_verify: bool,
) -> Result<Arc<rustls::ClientConfig>, Error> {
    let builder = rustls::ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(|e| tls_error(Path::new("tls"), e))?;
    let builder = if insecure_skip_verify {
        builder
            .dangerous()
            .with_custom_certificate_verifier(etcdrs_tls::AnyServerCert::new(provider()))
    } else {
        let store = match ca {
            Some(ca) => roots(ca)?,
            None => roots(Path::new(SYSTEM_CA_BUNDLE)).unwrap_or_else(|_| RootCertStore::empty()),
        };
        builder.with_root_certificates(store)
    };
    let mut config = match (cert, key_file) {
        (Some(cert), Some(key_file)) => builder
            .with_client_auth_cert(certs(cert)?, key(key_file)?)
            .map_err(|e| tls_error(cert, e))?,
        _ => builder.with_no_client_auth(),
    };
    config.alpn_protocols = vec![b"h2".to_vec()];
    Ok(Arc::new(config))
}
