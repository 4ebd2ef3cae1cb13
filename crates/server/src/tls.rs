//! TLS for the client and peer ports, with rustls (etcd `client/pkg/transport`'s `TLSInfo`).
//!
//! Owns: turning etcd's TLS settings (certificate, key, trusted CA, client-certificate auth, CRL,
//! cipher suites, protocol versions, allowed peer CN/hostname) into rustls configurations; the
//! self-signed certificates of `--auto-tls`/`--peer-auto-tls`; reading the identity (common name)
//! a client certificate carries. It does not own sockets: `http` wraps accepted connections with
//! [`TlsServer::acceptor`], `peer` dials with [`TlsClient::config`].
//!
//! Certificate rotation: as etcd re-reads its files on every handshake, a [`TlsServer`] and a
//! [`TlsClient`] look at the files' modification times and sizes for each new connection and
//! rebuild their configuration when one changed. A rebuild that fails (a half-written file) keeps
//! the previous configuration and logs a warning.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::SystemTime;

use parking_lot::Mutex;
use rustls::crypto::CryptoProvider;
use rustls::crypto::ring::cipher_suite as suites;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, CertificateRevocationListDer, PrivateKeyDer, ServerName};
use rustls::{RootCertStore, SupportedCipherSuite};

use crate::error::{Result, ServerError};

/// A TLS protocol version etcd lets one pin (`--tls-min-version`, `--tls-max-version`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum TlsVersion {
    /// TLS 1.2.
    Tls12,
    /// TLS 1.3.
    Tls13,
}

impl TlsVersion {
    /// etcd's names: `TLS1.2`, `TLS1.3` (the empty string means no limit, `None`). TLS 1.0 and
    /// 1.1, which etcd still accepts by name, are not offered by rustls.
    pub fn parse(name: &str) -> Result<Option<TlsVersion>> {
        match name {
            "" => Ok(None),
            "TLS1.2" => Ok(Some(TlsVersion::Tls12)),
            "TLS1.3" => Ok(Some(TlsVersion::Tls13)),
            other => Err(tls_error(format!(
                "unexpected TLS version {other:?} (must be one of: TLS1.2, TLS1.3)"
            ))),
        }
    }
}

/// One port's TLS settings, as etcd's `TLSInfo`.
#[derive(Clone, Debug, Default)]
pub struct TlsInfo {
    /// The certificate this side presents (PEM).
    pub cert_file: PathBuf,
    /// Its private key (PEM).
    pub key_file: PathBuf,
    /// CA certificates that verify the other side (PEM); `None`: the system's roots.
    pub trusted_ca_file: Option<PathBuf>,
    /// Require and verify a client certificate (`--client-cert-auth`).
    pub client_cert_auth: bool,
    /// Revoked certificates (`--client-crl-file`, `--peer-crl-file`).
    pub crl_file: Option<PathBuf>,
    /// A client certificate must have one of these common names (`--peer-cert-allowed-cn`).
    pub allowed_cn: Vec<String>,
    /// A client certificate must be valid for one of these host names
    /// (`--peer-cert-allowed-hostname`).
    pub allowed_hostname: Vec<String>,
    /// Go names of the TLS 1.2 cipher suites allowed, in order; empty: rustls' defaults.
    pub cipher_suites: Vec<String>,
    /// Lowest protocol version accepted.
    pub min_version: Option<TlsVersion>,
    /// Highest protocol version accepted.
    pub max_version: Option<TlsVersion>,
    /// The certificate is self-signed (auto TLS): when dialling, do not verify the other side's
    /// chain (etcd's `InsecureSkipVerify` for auto TLS).
    pub self_signed: bool,
    /// Certificate and key presented when dialling, if not `cert_file`/`key_file`
    /// (`--peer-client-cert-file`, `--peer-client-key-file`).
    pub dial_cert: Option<(PathBuf, PathBuf)>,
    /// When dialling, verify the other side's certificate for this name instead of the host
    /// dialled (etcd's `TLSInfo.ServerName`; set by DNS SRV bootstrap to the SRV domain).
    pub server_name: Option<String>,
}

/// etcd's Go cipher suite names (`tlsutil.cipherSuites`) and the rustls suite for each one rustls
/// implements. Suites rustls does not implement (CBC, RC4, 3DES, static RSA key exchange) are
/// known names without a suite.
const GO_CIPHER_SUITES: &[(&str, Option<SupportedCipherSuite>)] = &[
    ("TLS_RSA_WITH_RC4_128_SHA", None),
    ("TLS_RSA_WITH_3DES_EDE_CBC_SHA", None),
    ("TLS_RSA_WITH_AES_128_CBC_SHA", None),
    ("TLS_RSA_WITH_AES_256_CBC_SHA", None),
    ("TLS_RSA_WITH_AES_128_CBC_SHA256", None),
    ("TLS_RSA_WITH_AES_128_GCM_SHA256", None),
    ("TLS_RSA_WITH_AES_256_GCM_SHA384", None),
    ("TLS_ECDHE_ECDSA_WITH_RC4_128_SHA", None),
    ("TLS_ECDHE_ECDSA_WITH_AES_128_CBC_SHA", None),
    ("TLS_ECDHE_ECDSA_WITH_AES_256_CBC_SHA", None),
    ("TLS_ECDHE_RSA_WITH_RC4_128_SHA", None),
    ("TLS_ECDHE_RSA_WITH_3DES_EDE_CBC_SHA", None),
    ("TLS_ECDHE_RSA_WITH_AES_128_CBC_SHA", None),
    ("TLS_ECDHE_RSA_WITH_AES_256_CBC_SHA", None),
    ("TLS_ECDHE_ECDSA_WITH_AES_128_CBC_SHA256", None),
    ("TLS_ECDHE_RSA_WITH_AES_128_CBC_SHA256", None),
    (
        "TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256",
        Some(suites::TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256),
    ),
    (
        "TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256",
        Some(suites::TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256),
    ),
    (
        "TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384",
        Some(suites::TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384),
    ),
    (
        "TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384",
        Some(suites::TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384),
    ),
    (
        "TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305",
        Some(suites::TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305_SHA256),
    ),
    (
        "TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305",
        Some(suites::TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256),
    ),
    (
        "TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305_SHA256",
        Some(suites::TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305_SHA256),
    ),
    (
        "TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256",
        Some(suites::TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256),
    ),
];

fn tls_error(text: String) -> ServerError {
    ServerError::Tls(text)
}

/// Checks `--cipher-suites` as etcd does at start-up: an unknown name is refused with etcd's
/// text. Returns the names etcd knows that rustls does not implement (they are left out).
pub fn check_cipher_suites(names: &[String]) -> Result<Vec<String>> {
    let mut unsupported = Vec::new();
    for name in names {
        match GO_CIPHER_SUITES.iter().find(|(go, _)| go == name) {
            None => {
                return Err(tls_error(format!("unexpected TLS cipher suite {name:?}")));
            }
            Some((_, None)) => unsupported.push(name.clone()),
            Some((_, Some(_))) => {}
        }
    }
    Ok(unsupported)
}

impl TlsInfo {
    /// The crypto provider: ring, with the configured TLS 1.2 suites (TLS 1.3 suites are not
    /// configurable, as in Go).
    fn provider(&self) -> Result<Arc<CryptoProvider>> {
        let mut provider = rustls::crypto::ring::default_provider();
        if !self.cipher_suites.is_empty() {
            check_cipher_suites(&self.cipher_suites)?;
            let mut chosen: Vec<SupportedCipherSuite> = provider
                .cipher_suites
                .iter()
                .copied()
                .filter(|s| s.version() == &rustls::version::TLS13)
                .collect();
            let mut tls12 = 0;
            for name in &self.cipher_suites {
                if let Some((_, Some(suite))) = GO_CIPHER_SUITES.iter().find(|(go, _)| go == name)
                    && !chosen.contains(suite)
                {
                    chosen.push(*suite);
                    tls12 += 1;
                }
            }
            if tls12 == 0 && self.min_version != Some(TlsVersion::Tls13) {
                return Err(tls_error(
                    "none of the configured TLS cipher suites is supported".to_string(),
                ));
            }
            provider.cipher_suites = chosen;
        }
        Ok(Arc::new(provider))
    }

    fn versions(&self) -> Vec<&'static rustls::SupportedProtocolVersion> {
        let min = self.min_version.unwrap_or(TlsVersion::Tls12);
        let max = self.max_version.unwrap_or(TlsVersion::Tls13);
        let mut versions = Vec::new();
        if min <= TlsVersion::Tls12 && TlsVersion::Tls12 <= max {
            versions.push(&rustls::version::TLS12);
        }
        if min <= TlsVersion::Tls13 && TlsVersion::Tls13 <= max {
            versions.push(&rustls::version::TLS13);
        }
        versions
    }

    /// The files whose changes make a rebuild.
    fn watched_files(&self) -> Vec<&Path> {
        let mut files = vec![self.cert_file.as_path(), self.key_file.as_path()];
        if let Some((cert, key)) = &self.dial_cert {
            files.extend([cert.as_path(), key.as_path()]);
        }
        files.extend(self.trusted_ca_file.as_deref());
        files.extend(self.crl_file.as_deref());
        files
    }

    fn stamp(&self) -> Vec<Option<(SystemTime, u64)>> {
        self.watched_files()
            .into_iter()
            .map(|path| {
                let meta = std::fs::metadata(path).ok()?;
                Some((meta.modified().ok()?, meta.len()))
            })
            .collect()
    }

    /// The certificates of `--trusted-ca-file` (none when unset or unreadable: the webpki
    /// verifier built from the same file reports that).
    fn trusted_ca_certs(&self) -> Vec<CertificateDer<'static>> {
        self.trusted_ca_file
            .as_deref()
            .and_then(|file| read_certs(file).ok())
            .unwrap_or_default()
    }

    fn roots(&self) -> Result<RootCertStore> {
        let mut roots = RootCertStore::empty();
        let ca_file = match &self.trusted_ca_file {
            Some(file) => file.clone(),
            // Go falls back to the system pool: `SSL_CERT_FILE` if set, else Debian's bundle.
            None => std::env::var_os("SSL_CERT_FILE")
                .filter(|f| !f.is_empty())
                .map_or_else(
                    || PathBuf::from("/etc/ssl/certs/ca-certificates.crt"),
                    PathBuf::from,
                ),
        };
        let certs = read_certs(&ca_file);
        match certs {
            Ok(certs) => {
                for cert in certs {
                    roots
                        .add(cert)
                        .map_err(|e| tls_error(format!("{}: {e}", ca_file.display())))?;
                }
            }
            Err(e) if self.trusted_ca_file.is_some() => return Err(e),
            Err(_) => {}
        }
        Ok(roots)
    }

    fn server_config(&self) -> Result<rustls::ServerConfig> {
        let provider = self.provider()?;
        let builder = rustls::ServerConfig::builder_with_provider(provider.clone())
            .with_protocol_versions(&self.versions())
            .map_err(|e| tls_error(e.to_string()))?;
        // As etcd: a trusted CA alone already makes client certificates required.
        let builder = if self.client_cert_auth || self.trusted_ca_file.is_some() {
            let mut verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(
                Arc::new(self.roots()?),
                provider.clone(),
            );
            let crls = match &self.crl_file {
                Some(crl_file) => read_crls(crl_file)?,
                None => Vec::new(),
            };
            if !crls.is_empty() {
                verifier = verifier.with_crls(crls.clone());
            }
            let webpki = verifier.build().map_err(|e| tls_error(e.to_string()))?;
            let verifier: Arc<dyn rustls::server::danger::ClientCertVerifier> =
                Arc::new(V1ClientCerts {
                    inner: webpki,
                    cas: self.trusted_ca_certs(),
                    crls,
                    algorithms: provider.signature_verification_algorithms,
                });
            if self.allowed_cn.is_empty() && self.allowed_hostname.is_empty() {
                builder.with_client_cert_verifier(verifier)
            } else {
                builder.with_client_cert_verifier(Arc::new(AllowedNames {
                    inner: verifier,
                    info: self.clone(),
                }))
            }
        } else {
            builder.with_no_client_auth()
        };
        let mut config = builder
            .with_single_cert(read_certs(&self.cert_file)?, read_key(&self.key_file)?)
            .map_err(|e| tls_error(format!("{}: {e}", self.cert_file.display())))?;
        // gRPC needs h2 through ALPN; HTTP/1.1 serves /health, /metrics and the JSON gateway.
        config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
        Ok(config)
    }

    fn client_config(&self) -> Result<rustls::ClientConfig> {
        let provider = self.provider()?;
        let builder = rustls::ClientConfig::builder_with_provider(provider.clone())
            .with_protocol_versions(&self.versions())
            .map_err(|e| tls_error(e.to_string()))?;
        let builder = if self.self_signed && self.trusted_ca_file.is_none() {
            builder
                .dangerous()
                .with_custom_certificate_verifier(etcdrs_tls::AnyServerCert::new(provider))
        } else {
            builder.with_root_certificates(self.roots()?)
        };
        let (cert_file, key_file) = match &self.dial_cert {
            Some((cert, key)) => (cert.as_path(), key.as_path()),
            None => (self.cert_file.as_path(), self.key_file.as_path()),
        };
        let mut config = builder
            .with_client_auth_cert(read_certs(cert_file)?, read_key(key_file)?)
            .map_err(|e| tls_error(format!("{}: {e}", self.cert_file.display())))?;
        config.alpn_protocols = vec![b"h2".to_vec()];
        Ok(config)
    }

    /// Whether a verified client certificate passes `allowed_cn` and `allowed_hostname`.
    pub fn allows(&self, cert: Option<&CertificateDer<'_>>) -> bool {
        if self.allowed_cn.is_empty() && self.allowed_hostname.is_empty() {
            return true;
        }
        let Some(cert) = cert else {
            return false;
        };
        let Ok((_, parsed)) = x509_parser::parse_x509_certificate(cert.as_ref()) else {
            return false;
        };
        if !self.allowed_cn.is_empty() {
            let cn = common_name_of(&parsed);
            if !self
                .allowed_cn
                .iter()
                .any(|allowed| Some(allowed.as_str()) == cn.as_deref())
            {
                return false;
            }
        }
        if !self.allowed_hostname.is_empty() {
            let names = subject_names(&parsed);
            if !self.allowed_hostname.iter().any(|host| {
                names
                    .iter()
                    .any(|name| host_matches(name, &host.to_ascii_lowercase()))
            }) {
                return false;
            }
        }
        true
    }

    /// Writes (or reuses) a self-signed certificate and key in `dir` for `hosts`, valid for
    /// `validity_years`, as etcd's `SelfCert` does for `--auto-tls`; returns the settings with
    /// those files.
    pub fn self_signed_in(
        mut self,
        dir: &Path,
        hosts: &[String],
        validity_years: u64,
    ) -> Result<TlsInfo> {
        let cert_file = dir.join("cert.pem");
        let key_file = dir.join("key.pem");
        self.self_signed = true;
        if cert_file.exists() && key_file.exists() {
            self.cert_file = cert_file;
            self.key_file = key_file;
            return Ok(self);
        }
        // Durable names and data: a power cut after the member served with these files
        // must not leave them missing (a new certificate its peers and clients have not seen)
        // or empty (a member that cannot start).
        etcdrs_backend::create_dir_all_synced(dir)
            .map_err(|e| tls_error(format!("cannot generate cert: {e}")))?;
        let make = || -> std::result::Result<(String, String), rcgen::Error> {
            let mut params = rcgen::CertificateParams::new(hosts.to_vec())?;
            params
                .distinguished_name
                .push(rcgen::DnType::OrganizationName, "etcd");
            params.key_usages = vec![
                rcgen::KeyUsagePurpose::DigitalSignature,
                rcgen::KeyUsagePurpose::KeyEncipherment,
            ];
            params.extended_key_usages = vec![
                rcgen::ExtendedKeyUsagePurpose::ServerAuth,
                rcgen::ExtendedKeyUsagePurpose::ClientAuth,
            ];
            // Valid from now for `validity_years` (etcd's --self-signed-cert-validity).
            let now = SystemTime::now()
                .duration_since(SystemTime::UNIX_EPOCH)
                .map(|d| d.as_secs())
                .unwrap_or(0);
            let year = 1970 + i32::try_from(now / 31_556_952).unwrap_or(0);
            let years = i32::try_from(validity_years.max(1)).unwrap_or(1).min(100);
            params.not_before = rcgen::date_time_ymd(year - 1, 1, 1);
            params.not_after = rcgen::date_time_ymd(year + years, 12, 31);
            let key = rcgen::KeyPair::generate()?;
            let cert = params.self_signed(&key)?;
            Ok((cert.pem(), key.serialize_pem()))
        };
        let (cert, key) = make().map_err(|e| tls_error(format!("cannot generate cert: {e}")))?;
        // A cut between the two leaves one file of the pair, and the next start makes a new
        // pair. The key is readable by its owner only, as etcd creates it.
        etcdrs_backend::write_file_synced(&key_file, key.as_bytes(), 0o600)
            .map_err(|e| tls_error(format!("cannot generate cert: {e}")))?;
        etcdrs_backend::write_file_synced(&cert_file, cert.as_bytes(), 0o644)
            .map_err(|e| tls_error(format!("cannot generate cert: {e}")))?;
        tracing::info!(path = %cert_file.display(), "created cert file");
        tracing::info!(path = %key_file.display(), "created key file");
        self.cert_file = cert_file;
        self.key_file = key_file;
        Ok(self)
    }
}

/// The common name of a certificate's subject.
fn common_name_of(cert: &x509_parser::certificate::X509Certificate<'_>) -> Option<String> {
    cert.subject()
        .iter_common_name()
        .next()
        .and_then(|cn| cn.as_str().ok())
        .map(str::to_owned)
}

/// The DNS names and IP addresses a certificate is valid for (lower-cased).
fn subject_names(cert: &x509_parser::certificate::X509Certificate<'_>) -> Vec<String> {
    let mut names = Vec::new();
    if let Ok(Some(san)) = cert.subject_alternative_name() {
        for name in &san.value.general_names {
            match name {
                x509_parser::extensions::GeneralName::DNSName(dns) => {
                    names.push(dns.to_ascii_lowercase());
                }
                x509_parser::extensions::GeneralName::IPAddress(bytes) => match bytes.len() {
                    4 => {
                        let octets: [u8; 4] = [bytes[0], bytes[1], bytes[2], bytes[3]];
                        names.push(std::net::Ipv4Addr::from(octets).to_string());
                    }
                    16 => {
                        let mut octets = [0u8; 16];
                        octets.copy_from_slice(bytes);
                        names.push(std::net::Ipv6Addr::from(octets).to_string());
                    }
                    _ => {}
                },
                _ => {}
            }
        }
    }
    names
}

/// Go's `VerifyHostname` matching: exact, or a `*.` wildcard standing for one label.
fn host_matches(name: &str, host: &str) -> bool {
    if name == host {
        return true;
    }
    match (name.strip_prefix("*."), host.split_once('.')) {
        (Some(suffix), Some((_, rest))) => suffix == rest,
        _ => false,
    }
}

/// `--peer-cert-allowed-cn`/`--peer-cert-allowed-hostname` (and the client port's twins),
/// checked inside the handshake as etcd's `VerifyPeerCertificate` does: a refused member
/// receives a `bad_certificate` alert and can say why (`etcdrs_rafthttp::alert`), rather
/// than seeing its connection close.
#[derive(Debug)]
struct AllowedNames {
    inner: Arc<dyn rustls::server::danger::ClientCertVerifier>,
    info: TlsInfo,
}

/// etcd's text for a client certificate that its CN/hostname allow-lists refuse.
#[derive(Debug, thiserror::Error)]
#[error("client certificate authentication failed")]
struct NotAllowed;

impl rustls::server::danger::ClientCertVerifier for AllowedNames {
    fn offer_client_auth(&self) -> bool {
        self.inner.offer_client_auth()
    }

    fn client_auth_mandatory(&self) -> bool {
        self.inner.client_auth_mandatory()
    }

    fn root_hint_subjects(&self) -> &[rustls::DistinguishedName] {
        self.inner.root_hint_subjects()
    }

    fn verify_client_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        now: rustls::pki_types::UnixTime,
    ) -> std::result::Result<rustls::server::danger::ClientCertVerified, rustls::Error> {
        let verified = self
            .inner
            .verify_client_cert(end_entity, intermediates, now)?;
        if self.info.allows(Some(end_entity)) {
            Ok(verified)
        } else {
            // rustls answers this one with the bad_certificate alert, as Go's server does.
            tracing::warn!(error = %NotAllowed, "rejected a client certificate");
            Err(rustls::Error::InvalidCertificate(
                rustls::CertificateError::NotValidForName,
            ))
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> std::result::Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        self.inner.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> std::result::Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        self.inner.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
        self.inner.supported_verify_schemes()
    }
}

/// Client certificates of X.509 version 1 (no extensions: what `openssl x509 -req` makes
/// without an extensions file, the usual recipe for a `CN=root` client certificate), which Go's
/// TLS stack and so etcd accept and webpki refuses outright (`UnsupportedCertVersion`): the
/// client saw every handshake fail and etcdctl retried until its timeout. Such a certificate is
/// checked here as Go checks it: signed by one of the `--trusted-ca-file` certificates (directly;
/// a chain through intermediates is left to webpki, which refuses it), within its validity, and
/// not on a CRL of its issuer; without extensions it has no key usage to check. Its handshake
/// signature is verified with its public key. Every other certificate goes to webpki unchanged.
#[derive(Debug)]
struct V1ClientCerts {
    inner: Arc<dyn rustls::server::danger::ClientCertVerifier>,
    cas: Vec<CertificateDer<'static>>,
    crls: Vec<CertificateRevocationListDer<'static>>,
    algorithms: rustls::crypto::WebPkiSupportedAlgorithms,
}

/// A certificate that parses and is X.509 version 1.
fn parse_v1(cert: &[u8]) -> Option<x509_parser::certificate::X509Certificate<'_>> {
    let (_, parsed) = x509_parser::parse_x509_certificate(cert).ok()?;
    (parsed.version() == x509_parser::x509::X509Version::V1).then_some(parsed)
}

fn bad_certificate(error: rustls::CertificateError) -> rustls::Error {
    rustls::Error::InvalidCertificate(error)
}

impl V1ClientCerts {
    /// Whether `signature` over `message` verifies with the subject public key of `key` under
    /// one of the provider's algorithms (an algorithm of the wrong key type just fails).
    fn signed_by(
        &self,
        key: &x509_parser::x509::SubjectPublicKeyInfo<'_>,
        message: &[u8],
        signature: &[u8],
    ) -> bool {
        let public_key = key.subject_public_key.data.as_ref();
        self.algorithms
            .all
            .iter()
            .any(|alg| alg.verify_signature(public_key, message, signature).is_ok())
    }

    fn verify_v1(
        &self,
        leaf: &x509_parser::certificate::X509Certificate<'_>,
        now: rustls::pki_types::UnixTime,
    ) -> std::result::Result<(), rustls::Error> {
        let now = i64::try_from(now.as_secs()).unwrap_or(i64::MAX);
        let validity = leaf.validity();
        if now < validity.not_before.timestamp() {
            return Err(bad_certificate(rustls::CertificateError::NotValidYet));
        }
        if now > validity.not_after.timestamp() {
            return Err(bad_certificate(rustls::CertificateError::Expired));
        }
        let issuer = self.cas.iter().find_map(|ca| {
            let (_, ca) = x509_parser::parse_x509_certificate(ca.as_ref()).ok()?;
            let issued = ca.subject().as_raw() == leaf.issuer().as_raw()
                && self.signed_by(
                    ca.public_key(),
                    leaf.tbs_certificate.as_ref(),
                    leaf.signature_value.data.as_ref(),
                );
            issued.then_some(ca)
        });
        let Some(issuer) = issuer else {
            return Err(bad_certificate(rustls::CertificateError::UnknownIssuer));
        };
        for crl in &self.crls {
            let Ok((_, crl)) = x509_parser::parse_x509_crl(crl.as_ref()) else {
                continue;
            };
            let from_issuer = crl.issuer().as_raw() == issuer.subject().as_raw()
                && self.signed_by(
                    issuer.public_key(),
                    crl.tbs_cert_list.as_ref(),
                    crl.signature_value.data.as_ref(),
                );
            if from_issuer
                && crl
                    .iter_revoked_certificates()
                    .any(|revoked| revoked.raw_serial() == leaf.raw_serial())
            {
                return Err(bad_certificate(rustls::CertificateError::Revoked));
            }
        }
        Ok(())
    }

    /// A handshake signature by a version 1 certificate's key, with the algorithms rustls maps
    /// `dss`'s scheme to (TLS 1.3: the first only, as rustls' own check).
    fn verify_v1_signature(
        &self,
        leaf: &x509_parser::certificate::X509Certificate<'_>,
        message: &[u8],
        dss: &rustls::DigitallySignedStruct,
        tls13: bool,
    ) -> std::result::Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        let candidates = self
            .algorithms
            .mapping
            .iter()
            .find(|(scheme, _)| *scheme == dss.scheme)
            .map(|(_, algs)| *algs)
            .unwrap_or_default();
        let candidates = if tls13 {
            &candidates[..candidates.len().min(1)]
        } else {
            candidates
        };
        let public_key = leaf.public_key().subject_public_key.data.as_ref();
        if candidates.iter().any(|alg| {
            alg.verify_signature(public_key, message, dss.signature())
                .is_ok()
        }) {
            Ok(rustls::client::danger::HandshakeSignatureValid::assertion())
        } else {
            Err(bad_certificate(rustls::CertificateError::BadSignature))
        }
    }
}

impl rustls::server::danger::ClientCertVerifier for V1ClientCerts {
    fn offer_client_auth(&self) -> bool {
        self.inner.offer_client_auth()
    }

    fn client_auth_mandatory(&self) -> bool {
        self.inner.client_auth_mandatory()
    }

    fn root_hint_subjects(&self) -> &[rustls::DistinguishedName] {
        self.inner.root_hint_subjects()
    }

    fn verify_client_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        now: rustls::pki_types::UnixTime,
    ) -> std::result::Result<rustls::server::danger::ClientCertVerified, rustls::Error> {
        match parse_v1(end_entity.as_ref()) {
            Some(leaf) => {
                self.verify_v1(&leaf, now)?;
                Ok(rustls::server::danger::ClientCertVerified::assertion())
            }
            None => self
                .inner
                .verify_client_cert(end_entity, intermediates, now),
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> std::result::Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        match parse_v1(cert.as_ref()) {
            Some(leaf) => self.verify_v1_signature(&leaf, message, dss, false),
            None => self.inner.verify_tls12_signature(message, cert, dss),
        }
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> std::result::Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        match parse_v1(cert.as_ref()) {
            Some(leaf) => self.verify_v1_signature(&leaf, message, dss, true),
            None => self.inner.verify_tls13_signature(message, cert, dss),
        }
    }

    fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
        self.inner.supported_verify_schemes()
    }
}

/// The common name of a DER certificate's subject (the user etcd's auth takes from a client
/// certificate).
pub fn common_name(cert: &CertificateDer<'_>) -> Option<String> {
    let (_, parsed) = x509_parser::parse_x509_certificate(cert.as_ref()).ok()?;
    common_name_of(&parsed)
}

/// The common name of the first certificate in a PEM file; `None` if it has none or the file
/// cannot be read (whoever loads the file reports that).
pub fn file_common_name(path: &Path) -> Option<String> {
    common_name(read_certs(path).ok()?.first()?)
}

fn read_certs(path: &Path) -> Result<Vec<CertificateDer<'static>>> {
    let certs = CertificateDer::pem_file_iter(path)
        .and_then(|iter| iter.collect::<std::result::Result<Vec<_>, _>>())
        .map_err(|e| tls_error(format!("{}: {e}", path.display())))?;
    if certs.is_empty() {
        return Err(tls_error(format!(
            "{}: no certificate found",
            path.display()
        )));
    }
    Ok(certs)
}

fn read_key(path: &Path) -> Result<PrivateKeyDer<'static>> {
    PrivateKeyDer::from_pem_file(path).map_err(|e| tls_error(format!("{}: {e}", path.display())))
}

fn read_crls(path: &Path) -> Result<Vec<CertificateRevocationListDer<'static>>> {
    let bytes = std::fs::read(path).map_err(|e| tls_error(format!("{}: {e}", path.display())))?;
    if bytes.starts_with(b"-----") {
        CertificateRevocationListDer::pem_slice_iter(&bytes)
            .collect::<std::result::Result<Vec<_>, _>>()
            .map_err(|e| tls_error(format!("{}: {e}", path.display())))
    } else {
        // etcd reads the CRL file as DER.
        Ok(vec![CertificateRevocationListDer::from(bytes)])
    }
}

/// Modification time and size of each watched file (`None`: unreadable).
type Stamp = Vec<Option<(SystemTime, u64)>>;

/// A value built from TLS files, rebuilt when they change (see the module docs).
struct Reloading<T> {
    info: TlsInfo,
    build: fn(&TlsInfo) -> Result<T>,
    loaded: Mutex<(Stamp, T)>,
}

impl<T: Clone> Reloading<T> {
    fn new(info: TlsInfo, build: fn(&TlsInfo) -> Result<T>) -> Result<Self> {
        let stamp = info.stamp();
        let value = build(&info)?;
        Ok(Reloading {
            info,
            build,
            loaded: Mutex::new((stamp, value)),
        })
    }

    /// The value for a new connection: rebuilt first when a file changed since the last build.
    /// The build happens under the lock, so concurrent handshakes rebuild once.
    fn current(&self) -> T {
        let stamp = self.info.stamp();
        let mut loaded = self.loaded.lock();
        if loaded.0 != stamp {
            match (self.build)(&self.info) {
                Ok(value) => *loaded = (stamp, value),
                Err(e) => {
                    tracing::warn!(error = %e, "failed to reload TLS certificates; keeping the previous ones");
                }
            }
        }
        loaded.1.clone()
    }
}

/// A server side TLS configuration that follows its files.
pub struct TlsServer(Reloading<tokio_rustls::TlsAcceptor>);

impl TlsServer {
    /// Loads `info` now, so that bad files fail start-up.
    pub fn new(info: TlsInfo) -> Result<Arc<TlsServer>> {
        let reloading = Reloading::new(info, |info| {
            Ok(tokio_rustls::TlsAcceptor::from(Arc::new(
                info.server_config()?,
            )))
        })?;
        Ok(Arc::new(TlsServer(reloading)))
    }

    /// The settings.
    pub fn info(&self) -> &TlsInfo {
        &self.0.info
    }

    /// The acceptor for a new connection.
    pub fn acceptor(&self) -> tokio_rustls::TlsAcceptor {
        self.0.current()
    }
}

/// A client side TLS configuration (peers dialling peers) that follows its files.
pub struct TlsClient(Reloading<tokio_rustls::TlsConnector>);

impl TlsClient {
    /// Loads `info` now, so that bad files fail start-up.
    pub fn new(info: TlsInfo) -> Result<Arc<TlsClient>> {
        let reloading = Reloading::new(info, |info| {
            Ok(tokio_rustls::TlsConnector::from(Arc::new(
                info.client_config()?,
            )))
        })?;
        Ok(Arc::new(TlsClient(reloading)))
    }

    /// The connector for a new connection.
    pub fn connector(&self) -> tokio_rustls::TlsConnector {
        self.0.current()
    }

    /// The name to verify the other side's certificate for when dialling `host`: the
    /// configured override, else `host` itself.
    pub fn server_name_for(&self, host: &str) -> Option<ServerName<'static>> {
        server_name(self.0.info.server_name.as_deref().unwrap_or(host))
    }
}

impl etcdrs_rafthttp::PeerTls for TlsClient {
    fn connector(&self) -> tokio_rustls::TlsConnector {
        TlsClient::connector(self)
    }

    fn server_name_for(&self, host: &str) -> Option<ServerName<'static>> {
        TlsClient::server_name_for(self, host)
    }
}

/// The server name to verify when dialling `host`.
pub fn server_name(host: &str) -> Option<ServerName<'static>> {
    let host = host.trim_start_matches('[').trim_end_matches(']');
    ServerName::try_from(host.to_owned()).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cipher_suites_as_etcd_names_them() {
        assert!(check_cipher_suites(&["TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256".into()]).is_ok());
        let unsupported =
            check_cipher_suites(&["TLS_RSA_WITH_AES_128_CBC_SHA".into()]).unwrap_or_default();
        assert_eq!(
            unsupported,
            vec!["TLS_RSA_WITH_AES_128_CBC_SHA".to_string()]
        );
        let err = check_cipher_suites(&["FOO".into()])
            .err()
            .map(|e| e.to_string());
        assert_eq!(err.as_deref(), Some("unexpected TLS cipher suite \"FOO\""));
    }

    #[test]
    fn wildcard_host_names() {
        assert!(host_matches("*.example.com", "a.example.com"));
        assert!(!host_matches("*.example.com", "a.b.example.com"));
        assert!(host_matches("127.0.0.1", "127.0.0.1"));
    }
}
