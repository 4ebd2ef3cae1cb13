//! The rustls pieces every TLS user in etcd-rs shares: the server's listeners and peer links,
//! discovery clients, the gateway's probes and the gRPC proxy.
//!
//! Owns the choice of crypto provider (ring, so no C toolchain beyond the one rustls already
//! needs) and the verifier behind etcd's "skip TLS verification" options. It knows nothing of
//! etcd's flags or files: each user builds its own configurations from these.

use std::sync::Arc;

use rustls::DigitallySignedStruct;
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::CryptoProvider;
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};

/// The crypto provider every configuration is built with.
pub fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// Accepts any server certificate: etcd's `--insecure-skip-tls-verify`,
/// `--discovery-insecure-skip-tls-verify` and auto-TLS peers, and liveness probes. The
/// handshake's signatures are still checked against the certificate presented, so the session
/// itself is sound; only who the peer is goes unchecked.
#[derive(Debug)]
pub struct AnyServerCert(Arc<CryptoProvider>);

impl AnyServerCert {
    /// A verifier checking signatures with `provider`'s algorithms.
    pub fn new(provider: Arc<CryptoProvider>) -> Arc<Self> {
        Arc::new(AnyServerCert(provider))
    }
}

impl ServerCertVerifier for AnyServerCert {
    fn verify_server_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}
