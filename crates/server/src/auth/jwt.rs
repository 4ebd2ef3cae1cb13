//! JWT auth tokens (etcd `server/auth/jwt.go`, `--auth-token jwt,...`): tokens signed with the
//! member's private key, carrying the user, the auth revision and an expiry, and verified with
//! the public key by any member, so no member keeps a token table.
//!
//! Options as etcd takes them: `pub-key=<PEM file>`, `priv-key=<PEM file>` (optional: without
//! it the member only verifies), `sign-method=<RS256|RS384|RS512|PS256|PS384|PS512|ES256|ES384>`
//! and `ttl=<Go duration>` (default 5m). Keys are PEM files: public keys as `PUBLIC KEY` (or
//! `RSA PUBLIC KEY`), private keys as PKCS#8 (or PKCS#1 for RSA).

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use ring::signature::{self, EcdsaKeyPair, RsaKeyPair, UnparsedPublicKey};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{PrivateKeyDer, SubjectPublicKeyInfoDer};
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
            _ => return None,
        })
    }

    fn name(self) -> String {
        match self {
            Method::Rs(bits) => format!("RS{bits}"),
            Method::Ps(bits) => format!("PS{bits}"),
            Method::Es(bits) => format!("ES{bits}"),
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
        }
    }
}

enum Signer {
    Rsa(RsaKeyPair, &'static dyn signature::RsaEncoding),
    Ecdsa(EcdsaKeyPair),
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
        let pem = std::fs::read(&public_key_file).map_err(|_| JwtOptionsError::Invalid)?;
        let public_key = public_key_bits(&pem).ok_or(JwtOptionsError::Invalid)?;
        let signer = match private_key_file {
            Some(file) => {
                let key =
                    PrivateKeyDer::from_pem_file(&file).map_err(|_| JwtOptionsError::Invalid)?;
                Some(signer(method, &key).ok_or(JwtOptionsError::Invalid)?)
            }
            None => None,
        };
        Ok(Jwt {
            method,
            public_key,
            signer,
            ttl,
        })
    }

    /// A token for `username` at auth `revision`; `None` without a private key.
    pub fn sign(&self, username: &str, revision: u64) -> Option<String> {
        let signer = self.signer.as_ref()?;
        let header = serde_json::json!({ "alg": self.method.name(), "typ": "JWT" });
        let exp = SystemTime::now()
            .checked_add(self.ttl)?
            .duration_since(UNIX_EPOCH)
            .ok()?
            .as_secs();
        let claims = serde_json::json!({ "exp": exp, "revision": revision, "username": username });
        let signing_input = format!(
            "{}.{}",
            URL_SAFE_NO_PAD.encode(header.to_string()),
            URL_SAFE_NO_PAD.encode(claims.to_string())
        );
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
        };
        Some(format!(
            "{signing_input}.{}",
            URL_SAFE_NO_PAD.encode(signature)
        ))
    }

    /// The identity a valid, unexpired token carries.
    pub fn verify(&self, token: &str) -> Option<AuthInfo> {
        let (signing_input, signature) = token.rsplit_once('.')?;
        let (header, claims) = signing_input.split_once('.')?;
        let signature = URL_SAFE_NO_PAD.decode(signature).ok()?;
        UnparsedPublicKey::new(self.method.verification(), &self.public_key)
            .verify(signing_input.as_bytes(), &signature)
            .ok()?;
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
        })
    }
}

/// The key bits of a PEM public key: the subjectPublicKey of a `PUBLIC KEY`, or a whole
/// `RSA PUBLIC KEY` (PKCS#1), which is what ring verifies with.
fn public_key_bits(pem: &[u8]) -> Option<Vec<u8>> {
    if let Ok(spki) = SubjectPublicKeyInfoDer::from_pem_slice(pem) {
        let (_, parsed) = x509_parser::x509::SubjectPublicKeyInfo::from_der(spki.as_ref()).ok()?;
        return Some(parsed.subject_public_key.data.to_vec());
    }
    let text = std::str::from_utf8(pem).ok()?;
    let body: String = text
        .lines()
        .skip_while(|l| !l.starts_with("-----BEGIN RSA PUBLIC KEY-----"))
        .skip(1)
        .take_while(|l| !l.starts_with("-----END"))
        .collect();
    base64::engine::general_purpose::STANDARD.decode(body).ok()
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
            let PrivateKeyDer::Pkcs8(der) = key else {
                return None;
            };
            let alg = if bits == 256 {
                &signature::ECDSA_P256_SHA256_FIXED_SIGNING
            } else {
                &signature::ECDSA_P384_SHA384_FIXED_SIGNING
            };
            EcdsaKeyPair::from_pkcs8(alg, der.secret_pkcs8_der(), &rng)
                .ok()
                .map(Signer::Ecdsa)
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
mod tests {
    use super::*;

    #[test]
    fn es256_tokens_round_trip_and_expire() {
        let dir = tempfile::tempdir().expect("dir");
        let key = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).expect("key");
        let private = dir.path().join("key.pem");
        let public = dir.path().join("key.pub");
        std::fs::write(&private, key.serialize_pem()).expect("write");
        std::fs::write(&public, key.public_key_pem()).expect("write");
        let options = [
            format!("pub-key={}", public.display()),
            format!("priv-key={}", private.display()),
            "sign-method=ES256".to_owned(),
        ];
        let options: Vec<&str> = options.iter().map(String::as_str).collect();
        let jwt = Jwt::from_options(&options).expect("options");
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
