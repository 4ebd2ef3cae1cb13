//! Authentication and authorisation (etcd `server/auth`): users, roles, permissions, tokens.

use std::time::Duration;

/// The auth settings of the command line.
#[derive(Clone, Debug)]
pub struct AuthConfig {
    /// `--auth-token`: `simple`, or `jwt,pub-key=...,priv-key=...,sign-method=...`.
    pub token: String,
    /// `--bcrypt-cost`.
    pub bcrypt_cost: u32,
    /// `--auth-token-ttl`: how long an unused simple token lives.
    pub token_ttl: Duration,
}

impl Default for AuthConfig {
    fn default() -> Self {
        AuthConfig {
            token: "simple".to_owned(),
            bcrypt_cost: 10,
            token_ttl: Duration::from_secs(300),
        }
    }
}
