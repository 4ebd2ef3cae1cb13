//! Client-side TLS towards a discovery service: rustls configurations from
//! `--discovery-cert`, `--discovery-key`, `--discovery-cacert` and
//! `--discovery-insecure-skip-tls-verify`, built by `etcdrs_client::tls` (which also owns the
//! handshake and the tonic connector that use them), its errors in this crate's words.

use crate::error::{Error, Result};

pub use etcdrs_client::tls::TlsFiles;

/// A client configuration offering `alpn` (`h2` for gRPC, `http/1.1` for the v2 keys API).
pub fn client_config(files: &TlsFiles, alpn: &[u8]) -> Result<etcdrs_client::tls::ClientTls> {
    etcdrs_client::tls::client_config(files, alpn).map_err(|e| Error::Config(e.to_string()))
}
