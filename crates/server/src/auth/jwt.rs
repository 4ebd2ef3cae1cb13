//! JWT auth tokens (etcd `server/auth/jwt.go`, `--auth-token jwt,...`): tokens signed with the
//! member's private key, carrying the user, the auth revision and an expiry, and verified with
//! the public key by any member, so no member keeps a token table.
//!
//! Options as etcd takes them: `pub-key=<PEM file>`, `priv-key=<PEM file>` (optional: without
//! it the member only verifies), `sign-method=<RS256|RS384|RS512|PS256|PS384|PS512|ES256|ES384|
//! EdDSA>` (EdDSA as etcd 3.5) and `ttl=<Go duration>` (default 5m). The public key may be a
//! `PUBLIC KEY`, an `RSA PUBLIC KEY` or a `CERTIFICATE` (its subject's key, as etcd's own
//! fixtures use it); the private key PKCS#8, PKCS#1 (RSA) or SEC1 (`EC PRIVATE KEY`). A key that
//! cannot be read, does not suit the method, or does not verify what its pair signs is refused
//! at start with the reason logged, never by refusing every token later.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use ring::signature::{self, EcdsaKeyPair, Ed25519KeyPair, RsaKeyPair, UnparsedPublicKey};
use rustls::pki_types::PrivateKeyDer;
use rustls::pki_types::pem::PemObject;
use x509_parser::prelude::FromDer;

use super::AuthInfo;

/// Why `--auth-token` cannot be used; the texts are etcd's.
#[derive(Debug)]
pub enum JwtOptionsError {
    /// "auth: invalid auth options" (a bad option or an unreadable file).
    Invalid,
    /// "auth: missing key data" (no public key).
    MissingKey,
}

impl JwtOptionsError {
    /// etcd's text.
    pub fn message(&self) -> &'static str {
        match self {
            JwtOptionsError::Invalid => "auth: invalid auth options",
            JwtOptionsError::MissingKey => "auth: missing key data",
        }
    }
}

/// The signing algorithms etcd accepts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Method {
    Rs(u16),
    Ps(u16),
    Es(u16),
    EdDsa,
}

impl Method {
    fn parse(name: &str) -> Option<Method> {
        Some(match name {
            "RS256" => Method::Rs(256),
            "RS384" => Method::Rs(384),
            "RS512" => Method::Rs(512),
            "PS256" => Method::Ps(256),
            "PS384" => Method::Ps(384),
            "PS512" => Method::Ps(512),
            "ES256" => Method::Es(256),
            "ES384" => Method::Es(384),
            "EdDSA" => Method::EdDsa,
            _ => return None,
        })
    }

    fn name(self) -> String {
        match self {
            Method::Rs(bits) => format!("RS{bits}"),
            Method::Ps(bits) => format!("PS{bits}"),
            Method::Es(bits) => format!("ES{bits}"),
            Method::EdDsa => "EdDSA".to_owned(),
        }
    }

    fn verification(self) -> &'static dyn signature::VerificationAlgorithm {
        match self {
            Method::Rs(256) => &signature::RSA_PKCS1_2048_8192_SHA256,
            Method::Rs(384) => &signature::RSA_PKCS1_2048_8192_SHA384,
            Method::Rs(_) => &signature::RSA_PKCS1_2048_8192_SHA512,
            Method::Ps(256) => &signature::RSA_PSS_2048_8192_SHA256,
            Method::Ps(384) => &signature::RSA_PSS_2048_8192_SHA384,
            Method::Ps(_) => &signature::RSA_PSS_2048_8192_SHA512,
            Method::Es(256) => &signature::ECDSA_P256_SHA256_FIXED,
            Method::Es(_) => &signature::ECDSA_P384_SHA384_FIXED,
            Method::EdDsa => &signature::ED25519,
        }
    }
}

enum Signer {
    Rsa(RsaKeyPair, &'static dyn signature::RsaEncoding),
    Ecdsa(EcdsaKeyPair),
    Ed25519(Ed25519KeyPair),
}

/// A JWT token provider.
pub struct Jwt {
    method: Method,
    public_key: Vec<u8>,
    signer: Option<Signer>,
    ttl: Duration,
}

impl std::fmt::Debug for Jwt {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Jwt")
            .field("method", &self.method)
            .field("ttl", &self.ttl)
            .finish_non_exhaustive()
    }
}

impl Jwt {
    /// The provider for the options after `jwt,` in `--auth-token`.
    pub fn from_options(options: &[&str]) -> Result<Jwt, JwtOptionsError> {
        let mut public_key_file = None;
        let mut private_key_file = None;
        let mut method = None;
        let mut ttl = Duration::from_secs(300);
        for option in options {
            let Some((name, value)) = option.split_once('=') else {
                return Err(JwtOptionsError::Invalid);
            };
            match name {
                "pub-key" => public_key_file = Some(value.to_owned()),
                "priv-key" => private_key_file = Some(value.to_owned()),
                "sign-method" => {
                    method = Some(Method::parse(value).ok_or(JwtOptionsError::Invalid)?);
                }
                "ttl" => ttl = parse_go_duration(value).ok_or(JwtOptionsError::Invalid)?,
                _ => return Err(JwtOptionsError::Invalid),
            }
        }
        let method = method.ok_or(JwtOptionsError::Invalid)?;
        let Some(public_key_file) = public_key_file else {
            return Err(JwtOptionsError::MissingKey);
        };
        let refuse = |file: &str, why: &str| {
            tracing::error!(
                path = file,
                sign_method = %method.name(),
                error = why,
                "failed to load a JWT key"
            );
            JwtOptionsError::Invalid
        };
        let pem = std::fs::read(&public_key_file)
            .map_err(|e| refuse(&public_key_file, &e.to_string()))?;
        let public_key = public_key_bits(&pem).ok_or_else(|| {
            refuse(
                &public_key_file,
                "no PUBLIC KEY, RSA PUBLIC KEY or CERTIFICATE block",
            )
        })?;
        let signer = match private_key_file {
            Some(file) => {
                let key = PrivateKeyDer::from_pem_file(&file)
                    .map_err(|e| refuse(&file, &format!("no private key: {e}")))?;
                Some(signer(method, &key).ok_or_else(|| {
                    refuse(&file, "the private key does not suit the sign method")
                })?)
            }
            None => None,
        };
        let jwt = Jwt {
            method,
            public_key,
            signer,
            ttl,
        };
        // A public key that is not the private key's pair would refuse every token it signs.
        if let Some(token) = jwt.sign("", 0)
            && jwt.verify_signature(&token).is_none()
        {
            return Err(refuse(
                &public_key_file,
                "the public key does not verify what the private key signs",
            ));
        }
        Ok(jwt)
    }

    /// A token for `username` at auth `revision`; `None` without a private key.
    pub fn sign(&self, username: &str, revision: u64) -> Option<String> {
        let header = serde_json::json!({ "alg": self.method.name(), "typ": "JWT" });
        let exp = SystemTime::now()
            .checked_add(self.ttl)?
            .duration_since(UNIX_EPOCH)
            .ok()?
            .as_secs();
        let claims = serde_json::json!({ "exp": exp, "revision": revision, "username": username });
        self.sign_input(&format!(
            "{}.{}",
            URL_SAFE_NO_PAD.encode(header.to_string()),
            URL_SAFE_NO_PAD.encode(claims.to_string())
        ))
    }

    /// `signing_input` (the encoded header and claims) with its signature appended: a token.
    fn sign_input(&self, signing_input: &str) -> Option<String> {
        let signer = self.signer.as_ref()?;
        let rng = ring::rand::SystemRandom::new();
        let signature = match signer {
            Signer::Rsa(key, encoding) => {
                let mut signature = vec![0; key.public().modulus_len()];
                key.sign(*encoding, &rng, signing_input.as_bytes(), &mut signature)
                    .ok()?;
                signature
            }
            Signer::Ecdsa(key) => key
                .sign(&rng, signing_input.as_bytes())
                .ok()?
                .as_ref()
                .to_vec(),
            Signer::Ed25519(key) => key.sign(signing_input.as_bytes()).as_ref().to_vec(),
        };
        Some(format!(
            "{signing_input}.{}",
            URL_SAFE_NO_PAD.encode(signature)
        ))
    }

    /// The identity a valid, unexpired token carries.
    pub fn verify(&self, token: &str) -> Option<AuthInfo> {
        let (header, claims) = self.verify_signature(token)?;
        let header: serde_json::Value =
            serde_json::from_slice(&URL_SAFE_NO_PAD.decode(header).ok()?).ok()?;
        if header["alg"].as_str() != Some(self.method.name().as_str()) {
            return None;
        }
        let claims: serde_json::Value =
            serde_json::from_slice(&URL_SAFE_NO_PAD.decode(claims).ok()?).ok()?;
        let now = SystemTime::now().duration_since(UNIX_EPOCH).ok()?.as_secs();
        let exp = claims["exp"].as_f64()?;
        if exp <= now as f64 {
            return None;
        }
        Some(AuthInfo {
            username: claims["username"].as_str()?.to_owned(),
            revision: claims["revision"].as_f64()? as u64,
            live: false,
        })
    }
}

impl Jwt {
    /// The header and claims parts of `token` if its signature is good.
    fn verify_signature<'t>(&self, token: &'t str) -> Option<(&'t str, &'t str)> {
        let (signing_input, signature) = token.rsplit_once('.')?;
        let signature = URL_SAFE_NO_PAD.decode(signature).ok()?;
        UnparsedPublicKey::new(self.method.verification(), &self.public_key)
            .verify(signing_input.as_bytes(), &signature)
            .ok()?;
        signing_input.split_once('.')
    }
}

/// The key bits of a PEM public key, as ring verifies with them: the subjectPublicKey of a
/// `PUBLIC KEY` or of a `CERTIFICATE`'s subject, or a whole `RSA PUBLIC KEY` (PKCS#1).
fn public_key_bits(pem: &[u8]) -> Option<Vec<u8>> {
    use rustls::pki_types::pem::SectionKind;
    for item in <(SectionKind, Vec<u8>)>::pem_slice_iter(pem) {
        let (kind, der) = item.ok()?;
        let bits = match kind {
            SectionKind::PublicKey => {
                let (_, spki) = x509_parser::x509::SubjectPublicKeyInfo::from_der(&der).ok()?;
                spki.subject_public_key.data.to_vec()
            }
            SectionKind::Certificate => {
                let (_, cert) = x509_parser::certificate::X509Certificate::from_der(&der).ok()?;
                cert.public_key().subject_public_key.data.to_vec()
            }
            _ => continue,
        };
        return (!bits.is_empty()).then_some(bits);
    }
    // pki-types knows no `RSA PUBLIC KEY` section.
    let text = std::str::from_utf8(pem).ok()?;
    let body: String = text
        .lines()
        .skip_while(|l| !l.starts_with("-----BEGIN RSA PUBLIC KEY-----"))
        .skip(1)
        .take_while(|l| !l.starts_with("-----END"))
        .collect();
    let bits = base64::engine::general_purpose::STANDARD
        .decode(body)
        .ok()?;
    (!bits.is_empty()).then_some(bits)
}

/// A SEC1 `ECPrivateKey` (`EC PRIVATE KEY`) as the PKCS#8 document ring reads: the same key,
/// wrapped with the EC algorithm and its curve.
fn sec1_to_pkcs8(sec1: &[u8], bits: u16) -> Vec<u8> {
    // ecPublicKey (1.2.840.10045.2.1), then prime256v1 (1.2.840.10045.3.1.7) or secp384r1 (1.3.132.0.34).
    const EC_PUBLIC_KEY: &[u8] = &[0x06, 0x07, 0x2a, 0x86, 0x48, 0xce, 0x3d, 0x02, 0x01];
    const P256: &[u8] = &[0x06, 0x08, 0x2a, 0x86, 0x48, 0xce, 0x3d, 0x03, 0x01, 0x07];
    const P384: &[u8] = &[0x06, 0x05, 0x2b, 0x81, 0x04, 0x00, 0x22];
    let curve = if bits == 256 { P256 } else { P384 };
    let algorithm = der(0x30, &[EC_PUBLIC_KEY, curve].concat());
    let body = [&[0x02, 0x01, 0x00][..], &algorithm, &der(0x04, sec1)].concat();
    der(0x30, &body)
}

/// One DER element: tag, definite length, contents.
fn der(tag: u8, contents: &[u8]) -> Vec<u8> {
    let len = contents.len();
    let mut out = vec![tag];
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
    out.extend_from_slice(contents);
    out
}

fn signer(method: Method, key: &PrivateKeyDer<'_>) -> Option<Signer> {
    let rng = ring::rand::SystemRandom::new();
    match method {
        Method::Rs(_) | Method::Ps(_) => {
            let pair = match key {
                PrivateKeyDer::Pkcs8(der) => RsaKeyPair::from_pkcs8(der.secret_pkcs8_der()).ok()?,
                PrivateKeyDer::Pkcs1(der) => RsaKeyPair::from_der(der.secret_pkcs1_der()).ok()?,
                _ => return None,
            };
            let encoding: &'static dyn signature::RsaEncoding = match method {
                Method::Rs(256) => &signature::RSA_PKCS1_SHA256,
                Method::Rs(384) => &signature::RSA_PKCS1_SHA384,
                Method::Rs(_) => &signature::RSA_PKCS1_SHA512,
                Method::Ps(256) => &signature::RSA_PSS_SHA256,
                Method::Ps(384) => &signature::RSA_PSS_SHA384,
                _ => &signature::RSA_PSS_SHA512,
            };
            Some(Signer::Rsa(pair, encoding))
        }
        Method::Es(bits) => {
            let pkcs8 = match key {
                PrivateKeyDer::Pkcs8(der) => der.secret_pkcs8_der().to_vec(),
                PrivateKeyDer::Sec1(der) => sec1_to_pkcs8(der.secret_sec1_der(), bits),
                _ => return None,
            };
            let alg = if bits == 256 {
                &signature::ECDSA_P256_SHA256_FIXED_SIGNING
            } else {
                &signature::ECDSA_P384_SHA384_FIXED_SIGNING
            };
            EcdsaKeyPair::from_pkcs8(alg, &pkcs8, &rng)
                .ok()
                .map(Signer::Ecdsa)
        }
        Method::EdDsa => {
            let PrivateKeyDer::Pkcs8(der) = key else {
                return None;
            };
            Ed25519KeyPair::from_pkcs8_maybe_unchecked(der.secret_pkcs8_der())
                .ok()
                .map(Signer::Ed25519)
        }
    }
}

/// A Go duration such as `5m`, `30s`, `1h30m` or `500ms`.
fn parse_go_duration(text: &str) -> Option<Duration> {
    let mut total = Duration::ZERO;
    let mut rest = text;
    if rest.is_empty() {
        return None;
    }
    while !rest.is_empty() {
        let digits = rest
            .find(|c: char| !c.is_ascii_digit() && c != '.')
            .unwrap_or(rest.len());
        let number: f64 = rest[..digits].parse().ok()?;
        rest = &rest[digits..];
        let unit_len = rest
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .unwrap_or(rest.len());
        let seconds = match &rest[..unit_len] {
            "h" => 3600.0,
            "m" => 60.0,
            "s" => 1.0,
            "ms" => 0.001,
            "us" | "µs" => 0.000_001,
            "ns" => 0.000_000_001,
            _ => return None,
        };
        rest = &rest[unit_len..];
        total += Duration::from_secs_f64(number * seconds);
    }
    Some(total)
}

#[cfg(test)]
mod fuzz;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn es256_tokens_round_trip_and_expire() {
        let dir = tempfile::tempdir().expect("dir");
        let jwt = super::fuzz::es256_provider(dir.path());
        let token = jwt.sign("alice", 7).expect("signed");
        let info = jwt.verify(&token).expect("valid");
        assert_eq!(info.username, "alice");
        assert_eq!(info.revision, 7);
        assert!(jwt.verify(&format!("{token}x")).is_none());
        let expired = Jwt {
            ttl: Duration::ZERO,
            ..jwt
        };
        let token = expired.sign("alice", 7).expect("signed");
        assert!(expired.verify(&token).is_none());
    }

    #[test]
    fn options_errors_as_etcd() {
        assert!(matches!(
            Jwt::from_options(&["sign-method=RS256"]),
            Err(JwtOptionsError::MissingKey)
        ));
        assert!(matches!(
            Jwt::from_options(&["pub-key=/nonexistent", "sign-method=RS256"]),
            Err(JwtOptionsError::Invalid)
        ));
        assert_eq!(parse_go_duration("1m30s"), Some(Duration::from_secs(90)));
    }
}
