//! Client-side TLS towards a discovery service: rustls configurations built from PEM files
//! (`--discovery-cert`, `--discovery-key`, `--discovery-cacert`,
//! `--discovery-insecure-skip-tls-verify`). The handshake and the tonic connector that use
//! them are `etcdrs_client::tls`'s.

use std::path::Path;
use std::sync::Arc;

use rustls::RootCertStore;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};

use crate::error::{Error, Result};

/// The system's CA bundle (Debian's path), trusted when no CA file is given.
const SYSTEM_CA_BUNDLE: &str = "/etc/ssl/certs/ca-certificates.crt";

/// What to present and trust when talking TLS to a discovery service.
#[derive(Clone, Debug, Default)]
pub struct TlsFiles {
    /// Client certificate (PEM).
    pub cert: Option<std::path::PathBuf>,
    /// Its key (PEM).
    pub key: Option<std::path::PathBuf>,
    /// CA bundle for the service's certificate; the system's when absent.
    pub cacert: Option<std::path::PathBuf>,
    /// Accept any server certificate.
    pub insecure_skip_verify: bool,
}

use etcdrs_tls::provider;

fn bad(path: &Path, reason: impl std::fmt::Display) -> Error {
    Error::Config(format!("{}: {reason}", path.display()))
}

fn certs(path: &Path) -> Result<Vec<CertificateDer<'static>>> {
    let certs: Vec<_> = CertificateDer::pem_file_iter(path)
        .map_err(|e| bad(path, e))?
        .collect::<Result<_, _>>()
        .map_err(|e| bad(path, e))?;
    if certs.is_empty() {
        return Err(bad(path, "no certificate found"));
    }
    Ok(certs)
}

fn roots(path: &Path) -> Result<RootCertStore> {
    let mut store = RootCertStore::empty();
    for cert in certs(path)? {
        store.add(cert).map_err(|e| bad(path, e))?;
    }
    Ok(store)
}

/// A client configuration offering `alpn` (`h2` for gRPC, `http/1.1` for the v2 keys API).
pub fn client_config(files: &TlsFiles, alpn: &[u8]) -> Result<Arc<rustls::ClientConfig>> {
    let builder = rustls::ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(|e| Error::Config(format!("tls: {e}")))?;
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
            .with_client_auth_cert(
                certs(cert)?,
                PrivateKeyDer::from_pem_file(key).map_err(|e| bad(key, e))?,
            )
            .map_err(|e| bad(cert, e))?,
        _ => builder.with_no_client_auth(),
    };
    config.alpn_protocols = vec![alpn.to_vec()];
    Ok(Arc::new(config))
}
