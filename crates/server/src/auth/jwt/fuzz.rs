//! Fuzzing of JWT token verification (issue 20): a client's `token` metadata is any string,
//! and `Jwt::verify` must answer with an identity or `None` for it, never panic. A mutated
//! token rarely keeps a valid signature, so each input is also taken as a signing input
//! (`<header>.<claims>`, base64url) and signed with the test's key before it is verified:
//! the header and claims checks then see every mutation. Corpus:
//! `crates/server/fuzz-corpus/jwt/`, signing inputs as a member makes them and variants of
//! their claims (`ETCDRS_FUZZ_REGEN=1` rewrites them). Runner and knobs: `etcdrs-fuzz`.

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use etcdrs_fuzz::Fuzz;

use super::Jwt;

/// An ES256 provider with a fresh key pair, its files in `dir`.
pub(super) fn es256_provider(dir: &std::path::Path) -> Jwt {
    let key = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).expect("key");
    let private = dir.join("key.pem");
    let public = dir.join("key.pub");
    std::fs::write(&private, key.serialize_pem()).expect("write the private key");
    std::fs::write(&public, key.public_key_pem()).expect("write the public key");
    let options = [
        format!("pub-key={}", public.display()),
        format!("priv-key={}", private.display()),
        "sign-method=ES256".to_owned(),
    ];
    let options: Vec<&str> = options.iter().map(String::as_str).collect();
    Jwt::from_options(&options).expect("JWT options")
}

/// The signing input of a token with `header` and `claims` (JSON texts).
fn signing_input(header: &str, claims: &str) -> String {
    format!(
        "{}.{}",
        URL_SAFE_NO_PAD.encode(header),
        URL_SAFE_NO_PAD.encode(claims)
    )
}

/// Seeds: what `Jwt::sign` makes, then claims of the wrong types and out of range.
fn seeds() -> Vec<(&'static str, String)> {
    let header = r#"{"alg":"ES256","typ":"JWT"}"#;
    vec![
        (
            "signed-claims",
            signing_input(
                header,
                r#"{"exp":4102444800,"revision":7,"username":"alice"}"#,
            ),
        ),
        (
            "expired",
            signing_input(header, r#"{"exp":1,"revision":7,"username":"alice"}"#),
        ),
        (
            "float-and-huge",
            signing_input(
                header,
                r#"{"exp":1e308,"revision":-1.5e300,"username":"\u0000\ud83d\ude00"}"#,
            ),
        ),
        (
            "wrong-types",
            signing_input(
                r#"{"alg":["ES256"],"typ":null}"#,
                r#"{"exp":"4102444800","revision":{},"username":7}"#,
            ),
        ),
        (
            "other-alg",
            signing_input(
                r#"{"alg":"none"}"#,
                r#"{"exp":4102444800,"revision":18446744073709551615,"username":""}"#,
            ),
        ),
        ("not-base64", "e30.%%%.@@".to_owned()),
    ]
}

#[test]
fn fuzz_jwt_tokens() {
    let dir = tempfile::tempdir().expect("temp dir");
    let jwt = es256_provider(dir.path());
    let mut fuzz = Fuzz::new("jwt")
        .corpus_dir(concat!(env!("CARGO_MANIFEST_DIR"), "/fuzz-corpus/jwt"))
        .dictionary(&[b".", b"eyJ", b"fQ", b"In0", b"LCJ", b"=", b"+", b"/"])
        .max_len(4096)
        .iterations(1500);
    for (name, input) in seeds() {
        fuzz = fuzz.input(name, input);
    }
    let mut verified = 0u64;
    fuzz.run(|input| {
        let text = String::from_utf8_lossy(input);
        // As a client's token, and as a signing input the member's key signed.
        let _ = jwt.verify(&text);
        if let Some(token) = jwt.sign_input(&text)
            && jwt.verify(&token).is_some()
        {
            verified += 1;
        }
    });
    // The seeds with good claims verify once signed, so the claims checks were reached.
    assert!(verified > 0, "no signed input verified");
}
