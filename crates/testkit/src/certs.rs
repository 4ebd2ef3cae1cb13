//! Real X.509 certificates for TLS tests: a CA and certificates it signs, written as PEM files.
//!
//! Everything is generated per test with rcgen (ECDSA P-256), so no key material lives in the
//! repository. Certificates carry the extended key usages Go's TLS stack checks (etcd, etcdctl).

use std::path::{Path, PathBuf};

use anyhow::Context;
use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DnType, ExtendedKeyUsagePurpose, IsCa,
    KeyPair, KeyUsagePurpose,
};

/// What a certificate may be used for (its extended key usage).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Usage {
    /// TLS server only.
    Server,
    /// TLS client only.
    Client,
    /// Both (what etcd peers and most etcd test certificates use).
    Both,
}

/// A certificate and its private key, as PEM files.
#[derive(Clone, Debug)]
pub struct CertFiles {
    /// The certificate (PEM).
    pub cert: PathBuf,
    /// The private key (PEM, PKCS#8).
    pub key: PathBuf,
}

/// A certificate authority whose files live in `dir`.
pub struct TestCa {
    dir: PathBuf,
    name: String,
    issuer: CertifiedIssuer<'static, KeyPair>,
    /// Serial number of each issued certificate, by certificate file (for CRLs).
    serials: std::sync::Mutex<Vec<(PathBuf, u64)>>,
}

impl TestCa {
    /// A new self-signed CA named `name`; writes `<dir>/<name>.crt`.
    pub fn new(dir: &Path, name: &str) -> anyhow::Result<Self> {
        let mut params = CertificateParams::new(Vec::<String>::new())?;
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.distinguished_name.push(DnType::CommonName, name);
        params.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        let issuer = CertifiedIssuer::self_signed(params, KeyPair::generate()?)?;
        std::fs::create_dir_all(dir)?;
        let ca = Self {
            dir: dir.to_path_buf(),
            name: name.to_string(),
            issuer,
            serials: std::sync::Mutex::new(Vec::new()),
        };
        std::fs::write(ca.ca_file(), ca.issuer.pem()).context("write CA")?;
        Ok(ca)
    }

    /// Path of the CA certificate (PEM), for `--trusted-ca-file` / `--cacert`.
    pub fn ca_file(&self) -> PathBuf {
        self.dir.join(format!("{}.crt", self.name))
    }

    /// Issues a certificate with common name `cn` and subject alternative names `sans` (IP
    /// addresses or DNS names); writes `<dir>/<file>.crt` and `<dir>/<file>.key`.
    pub fn issue(
        &self,
        file: &str,
        cn: &str,
        sans: &[&str],
        usage: Usage,
    ) -> anyhow::Result<CertFiles> {
        let sans: Vec<String> = sans.iter().map(|s| s.to_string()).collect();
        let mut params = CertificateParams::new(sans)?;
        params.distinguished_name.push(DnType::CommonName, cn);
        params.key_usages = vec![
            KeyUsagePurpose::DigitalSignature,
            KeyUsagePurpose::KeyEncipherment,
        ];
        params.extended_key_usages = match usage {
            Usage::Server => vec![ExtendedKeyUsagePurpose::ServerAuth],
            Usage::Client => vec![ExtendedKeyUsagePurpose::ClientAuth],
            Usage::Both => vec![
                ExtendedKeyUsagePurpose::ServerAuth,
                ExtendedKeyUsagePurpose::ClientAuth,
            ],
        };
        let serial = {
            let mut serials = self
                .serials
                .lock()
                .map_err(|_| anyhow::anyhow!("serials lock"))?;
            let serial = 1000 + serials.len() as u64;
            serials.push((self.dir.join(format!("{file}.crt")), serial));
            serial
        };
        params.serial_number = Some(rcgen::SerialNumber::from(serial));
        let key = KeyPair::generate()?;
        let cert = params.signed_by(&key, &self.issuer)?;
        let files = CertFiles {
            cert: self.dir.join(format!("{file}.crt")),
            key: self.dir.join(format!("{file}.key")),
        };
        std::fs::write(&files.cert, cert.pem()).context("write certificate")?;
        std::fs::write(&files.key, key.serialize_pem()).context("write key")?;
        Ok(files)
    }

    /// Writes a CRL (PEM) revoking `revoked` (certificates this CA issued) to `<dir>/<file>.crl`
    /// and returns its path, for `--client-crl-file`.
    pub fn crl(&self, file: &str, revoked: &[&CertFiles]) -> anyhow::Result<PathBuf> {
        let serials = self
            .serials
            .lock()
            .map_err(|_| anyhow::anyhow!("serials lock"))?;
        let mut revoked_certs = Vec::new();
        for cert in revoked {
            let serial = serials
                .iter()
                .find(|(path, _)| *path == cert.cert)
                .map(|(_, serial)| *serial)
                .context("certificate not issued by this CA")?;
            revoked_certs.push(rcgen::RevokedCertParams {
                serial_number: rcgen::SerialNumber::from(serial),
                revocation_time: rcgen::date_time_ymd(2024, 1, 1),
                reason_code: Some(rcgen::RevocationReason::KeyCompromise),
                invalidity_date: None,
            });
        }
        let params = rcgen::CertificateRevocationListParams {
            this_update: rcgen::date_time_ymd(2024, 1, 1),
            next_update: rcgen::date_time_ymd(2100, 1, 1),
            crl_number: rcgen::SerialNumber::from(1u64),
            issuing_distribution_point: None,
            revoked_certs,
            key_identifier_method: rcgen::KeyIdMethod::Sha256,
        };
        let crl = params.signed_by(&self.issuer)?;
        let path = self.dir.join(format!("{file}.crl"));
        std::fs::write(&path, crl.pem()?).context("write CRL")?;
        Ok(path)
    }

    /// A server-and-client certificate for loopback use: SANs `127.0.0.1`..`127.0.0.9`, `::1`
    /// and `localhost`.
    pub fn issue_loopback(&self, file: &str, cn: &str) -> anyhow::Result<CertFiles> {
        let ips: Vec<String> = (1..=9).map(|i| format!("127.0.0.{i}")).collect();
        let mut sans: Vec<&str> = ips.iter().map(String::as_str).collect();
        sans.extend(["::1", "localhost"]);
        self.issue(file, cn, &sans, Usage::Both)
    }

    /// An X.509 version 1 client certificate with common name `cn`: no extensions at all, as
    /// `openssl x509 -req` makes one without an extensions file (the usual recipe for a
    /// `CN=root` client certificate), which Go's TLS stack accepts. rcgen writes version 3 only,
    /// so the certificate is encoded here (ECDSA P-256 with SHA-256, valid 2020-2049) and
    /// signed with the CA's key. Writes `<dir>/<file>.crt` and `<dir>/<file>.key`.
    pub fn issue_v1(&self, file: &str, cn: &str) -> anyhow::Result<CertFiles> {
        use rcgen::{PublicKeyData, SigningKey};
        let serial = {
            let mut serials = self
                .serials
                .lock()
                .map_err(|_| anyhow::anyhow!("serials lock"))?;
            let serial = 1000 + serials.len() as u64;
            serials.push((self.dir.join(format!("{file}.crt")), serial));
            serial
        };
        let key = KeyPair::generate()?;
        let ecdsa_sha256 = der::tlv(
            0x30,
            &der::tlv(0x06, &[0x2a, 0x86, 0x48, 0xce, 0x3d, 0x04, 0x03, 0x02]),
        );
        let issuer =
            der::ca_subject(self.issuer.der().as_ref()).context("the CA certificate's subject")?;
        let common_name = der::tlv(
            0x30,
            &[
                der::tlv(0x06, &[0x55, 0x04, 0x03]),
                der::tlv(0x0c, cn.as_bytes()),
            ]
            .concat(),
        );
        let subject = der::tlv(0x30, &der::tlv(0x31, &common_name));
        let validity = der::tlv(
            0x30,
            &[
                der::tlv(0x17, b"200101000000Z"),
                der::tlv(0x17, b"491231235959Z"),
            ]
            .concat(),
        );
        // No [0] version field: version 1.
        let tbs = der::tlv(
            0x30,
            &[
                der::tlv(0x02, &serial.to_be_bytes()[6..]),
                ecdsa_sha256.clone(),
                issuer,
                validity,
                subject,
                key.subject_public_key_info(),
            ]
            .concat(),
        );
        let signature = self.issuer.key().sign(&tbs)?;
        let cert = der::tlv(
            0x30,
            &[
                tbs,
                ecdsa_sha256,
                der::tlv(0x03, &[&[0u8][..], &signature].concat()),
            ]
            .concat(),
        );
        let files = CertFiles {
            cert: self.dir.join(format!("{file}.crt")),
            key: self.dir.join(format!("{file}.key")),
        };
        std::fs::write(&files.cert, der::pem("CERTIFICATE", &cert)).context("write certificate")?;
        std::fs::write(&files.key, key.serialize_pem()).context("write key")?;
        Ok(files)
    }
}

/// Just enough DER for [`TestCa::issue_v1`].
mod der {
    /// A tag-length-value with `content`.
    pub fn tlv(tag: u8, content: &[u8]) -> Vec<u8> {
        let mut out = vec![tag];
        let len = content.len();
        if len < 0x80 {
            out.push(len as u8);
        } else {
            let bytes: Vec<u8> = len
                .to_be_bytes()
                .into_iter()
                .skip_while(|b| *b == 0)
                .collect();
            out.push(0x80 | bytes.len() as u8);
            out.extend(bytes);
        }
        out.extend_from_slice(content);
        out
    }

    /// One TLV: its whole bytes and its content.
    type Tlv<'a> = (&'a [u8], &'a [u8]);

    /// The first TLV of `der`, and the rest.
    fn next(der: &[u8]) -> Option<(Tlv<'_>, &[u8])> {
        let first = *der.get(1)?;
        let (len, header) = if first < 0x80 {
            (usize::from(first), 2)
        } else {
            let n = usize::from(first & 0x7f);
            let bytes = der.get(2..2 + n)?;
            (
                bytes
                    .iter()
                    .fold(0usize, |acc, b| (acc << 8) | usize::from(*b)),
                2 + n,
            )
        };
        let end = header + len;
        Some(((der.get(..end)?, der.get(header..end)?), der.get(end..)?))
    }

    /// The subject Name of a version 3 certificate, as its bytes.
    pub fn ca_subject(cert: &[u8]) -> Option<Vec<u8>> {
        let ((_, certificate), _) = next(cert)?;
        let ((_, tbs), _) = next(certificate)?;
        // version [0], serial, signature, issuer, validity, subject.
        let mut rest = tbs;
        let mut fields = Vec::new();
        for _ in 0..6 {
            let ((whole, _), after) = next(rest)?;
            fields.push(whole);
            rest = after;
        }
        Some(fields[5].to_vec())
    }

    /// PEM with a `label`.
    pub fn pem(label: &str, der: &[u8]) -> String {
        const ALPHABET: &[u8; 64] =
            b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
        let mut text = String::new();
        for chunk in der.chunks(3) {
            let b = [
                chunk[0],
                *chunk.get(1).unwrap_or(&0),
                *chunk.get(2).unwrap_or(&0),
            ];
            let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
            for i in 0..4 {
                if i <= chunk.len() {
                    text.push(char::from(ALPHABET[((n >> (18 - 6 * i)) & 63) as usize]));
                } else {
                    text.push('=');
                }
            }
        }
        let mut out = format!("-----BEGIN {label}-----\n");
        for line in text.as_bytes().chunks(64) {
            out.push_str(&String::from_utf8_lossy(line));
            out.push('\n');
        }
        out.push_str(&format!("-----END {label}-----\n"));
        out
    }
}

/// A fresh ECDSA P-256 key pair as PEM files `<dir>/<name>.key` (PKCS#8) and
/// `<dir>/<name>.pub` (SubjectPublicKeyInfo), e.g. for etcd's JWT auth tokens (`ES256`).
pub fn ec_key_pair(dir: &Path, name: &str) -> anyhow::Result<(PathBuf, PathBuf)> {
    let key = KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256)?;
    let private = dir.join(format!("{name}.key"));
    let public = dir.join(format!("{name}.pub"));
    std::fs::write(&private, key.serialize_pem()).context("write key")?;
    std::fs::write(&public, key.public_key_pem()).context("write public key")?;
    Ok((private, public))
}

/// The first certificate of a PEM file, as DER.
pub fn cert_der(path: &Path) -> anyhow::Result<Vec<u8>> {
    use rustls::pki_types::CertificateDer;
    use rustls::pki_types::pem::PemObject;
    let cert = CertificateDer::from_pem_file(path)
        .with_context(|| format!("reading {}", path.display()))?;
    Ok(cert.as_ref().to_vec())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn writes_pem_files_signed_by_the_ca() -> anyhow::Result<()> {
        let dir = tempfile::tempdir()?;
        let ca = TestCa::new(dir.path(), "ca")?;
        let files = ca.issue_loopback("server", "server")?;
        let ca_pem = std::fs::read_to_string(ca.ca_file())?;
        assert!(ca_pem.starts_with("-----BEGIN CERTIFICATE-----"));
        assert!(std::fs::read_to_string(&files.cert)?.starts_with("-----BEGIN CERTIFICATE-----"));
        assert!(std::fs::read_to_string(&files.key)?.contains("PRIVATE KEY"));
        // openssl, when present, confirms the chain as a Go client would check it.
        if let Ok(out) = std::process::Command::new("openssl")
            .arg("verify")
            .arg("-CAfile")
            .arg(ca.ca_file())
            .arg(&files.cert)
            .output()
        {
            assert!(
                out.status.success(),
                "{}",
                String::from_utf8_lossy(&out.stdout)
            );
        }
        Ok(())
    }
}
