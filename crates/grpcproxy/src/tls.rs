//! rustls configurations from PEM files: the proxy's server side (`--cert-file`,
//! `--key-file`, `--trusted-ca-file`: client certificates required when a CA is given, as
//! etcd's `ClientCertAuth`) and its client side towards the cluster (`--cert`, `--key`,
//! `--cacert`, `--insecure-skip-tls-verify`). Reading the PEM files and the client side are
//! `etcdrs_client::tls`'s, shared with discovery; errors keep the proxy's `Error::Tls`.

use std::path::Path;
use std::sync::Arc;

use etcdrs_client::tls::{TlsFiles, certs, private_key, roots};
use etcdrs_tls::provider;

use crate::Error;

/// A TLS file error of the client crate as the proxy's [`Error::Tls`].
fn file_error(e: etcdrs_client::Error) -> Error {
    match e {
        etcdrs_client::Error::Tls { path, reason } => Error::Tls { path, reason },
        other => Error::Endpoints(other),
    }
}

fn tls_error(path: &Path, reason: impl std::fmt::Display) -> Error {
    Error::Tls {
        path: path.display().to_string(),
        reason: reason.to_string(),
    }
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
                Arc::new(roots(ca).map_err(file_error)?),
                provider(),
            )
            .build()
            .map_err(|e| tls_error(ca, e))?;
            builder.with_client_cert_verifier(verifier)
        }
        None => builder.with_no_client_auth(),
    };
    let mut config = builder
        .with_single_cert(
            certs(cert).map_err(file_error)?,
            private_key(key_file).map_err(file_error)?,
        )
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
    let files = TlsFiles {
        cert: cert.map(Path::to_path_buf),
        key: key_file.map(Path::to_path_buf),
        cacert: ca.map(Path::to_path_buf),
        insecure_skip_verify,
    };
    etcdrs_client::tls::client_config(&files, b"h2").map_err(file_error)
}
