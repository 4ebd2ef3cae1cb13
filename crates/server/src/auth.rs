//! Authentication and authorisation (etcd `server/auth`): users, roles and key permissions,
//! the auth revision, simple tokens, and the permission checks every request goes through.
//!
//! Owns: the auth state (replicated: changed only by applying raft entries, persisted in the
//! backend's `auth` bucket in the same batch, reloaded on start and after a snapshot install),
//! the simple-token table (per member: every member applies `Authenticate` and records the
//! token, which then lives `--auth-token-ttl` after its last use), password hashing (bcrypt at
//! `--bcrypt-cost`, done by the member that receives the request, before proposing: only hashes
//! are replicated) and etcd's checks and their errors. Not owned: where requests carry their
//! token (`rpc`), and when checks run (`rpc` for reads and watches, the apply step for writes,
//! as etcd's `authApplierV3`).
//!
//! The auth revision grows with every change of the auth state. A request proposed under an
//! older revision than the one in force when it applies is refused with etcd's "revision of
//! auth store is old", so a permission revoked meanwhile is never bypassed.//!
//! Layout: the state, its loading and reads are here; `check` holds the permission checks,
//! `apply` the replicated changes, `jwt` the JWT token provider.

use std::collections::{BTreeMap, HashMap};
use std::time::{Duration, Instant};

use etcdrs_backend::Bucket;
use etcdrs_mvcc::KvStore;
use etcdrs_proto::authpb::{Permission, Role, User};
use etcdrs_proto::rpctypes::{self, EtcdError};
use etcdrs_schema::keys::{AUTH_ENABLED, AUTH_REVISION, AUTH_ROLE_PREFIX, AUTH_USER_PREFIX};
use parking_lot::{Mutex, RwLock};
use prost::Message;
use rand::Rng;

use crate::error::{Result, ServerError};

mod apply;
mod check;
mod jwt;

pub use self::apply::AuthChange;

/// How tokens are made and checked (`--auth-token`).
enum TokenProvider {
    /// Random tokens each member records when it applies Authenticate.
    Simple,
    /// Signed tokens any member verifies.
    Jwt(Box<jwt::Jwt>),
}

impl TokenProvider {
    /// etcd's `NewTokenProvider`: `simple`, or `jwt,<options>`.
    fn parse(spec: &str) -> Result<TokenProvider> {
        let mut parts = spec.split(',');
        match parts.next().unwrap_or_default() {
            "simple" => Ok(TokenProvider::Simple),
            "jwt" => {
                let options: Vec<&str> = parts.collect();
                jwt::Jwt::from_options(&options)
                    .map(|jwt| TokenProvider::Jwt(Box::new(jwt)))
                    .map_err(|e| ServerError::AuthOptions(e.message()))
            }
            other => {
                tracing::error!(token_type = other, "unknown token type");
                Err(ServerError::AuthOptions("auth: invalid auth options"))
            }
        }
    }
}

/// The user and role every check lets through.
pub const ROOT: &str = "root";

/// Simple tokens kept at most; the oldest expiring ones go first when full.
const MAX_SIMPLE_TOKENS: usize = 100_000;

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

/// Who a request comes from, as its token or client certificate says (etcd's `AuthInfo`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct AuthInfo {
    /// The user; empty for a request that carries neither a token nor a certificate.
    pub username: String,
    /// The auth revision the identity was established under.
    pub revision: u64,
    /// The revision is the store's at the time of the request, not one the caller carries:
    /// simple tokens and client certificates, as in etcd (a JWT carries its own). A write
    /// refused as "revision of auth store is old" is then proposed again under the new one, as
    /// etcd's `raftRequest` does, since the caller did nothing stale.
    pub live: bool,
}

/// The replicated part.
#[derive(Debug, Default)]
struct AuthState {
    enabled: bool,
    revision: u64,
    users: BTreeMap<String, User>,
    roles: BTreeMap<String, Role>,
}

/// One simple token.
struct SimpleToken {
    username: String,
    expires: Instant,
}

/// The auth store of a member.
pub struct AuthStore {
    config: AuthConfig,
    provider: TokenProvider,
    state: RwLock<AuthState>,
    tokens: Mutex<HashMap<String, SimpleToken>>,
}

/// The `hashed_password` of a `UserAdd` or `UserChangePassword` request for the bcrypt hash
/// `bcrypt_hash`: the hash in standard base64, as etcd 3.5 and later propose it and their
/// applier decodes it (`selectPassword`); the `authUsers` bucket stores the hash itself.
pub fn hashed_password_field(bcrypt_hash: &str) -> String {
    use base64::Engine as _;
    base64::engine::general_purpose::STANDARD.encode(bcrypt_hash)
}

/// The bcrypt hash a request's `hashed_password` carries ([`hashed_password_field`]); `None`
/// when it is not base64, which etcd refuses (`ErrNoPasswordUser`). etcd-rs before it
/// followed etcd 3.5 here proposed the bare hash, which Go's bcrypt writes with `$` (never
/// base64): that form is still read, so such entries in etcd-rs's own WAL replay as they
/// applied.
pub fn password_from_field(field: &str) -> Option<Vec<u8>> {
    use base64::Engine as _;
    if field.starts_with("$2") {
        return Some(field.as_bytes().to_vec());
    }
    base64::engine::general_purpose::STANDARD.decode(field).ok()
}

fn etcd(e: &'static EtcdError) -> ServerError {
    ServerError::Etcd(e)
}

fn backend_error(e: impl std::fmt::Display) -> ServerError {
    ServerError::Fatal(format!("auth store: {e}"))
}

impl AuthStore {
    /// The auth store as `store`'s backend records it.
    pub fn load(store: &KvStore, config: AuthConfig) -> Result<AuthStore> {
        let provider = TokenProvider::parse(&config.token)?;
        let auth = AuthStore {
            provider,
            config,
            state: RwLock::new(AuthState::default()),
            tokens: Mutex::new(HashMap::new()),
        };
        auth.reload(store)?;
        Ok(auth)
    }

    /// Read the auth state again from the backend (after a snapshot replaced it).
    pub fn reload(&self, store: &KvStore) -> Result<()> {
        let read = store.backend().read().map_err(backend_error)?;
        let mut state = AuthState::default();
        read.for_each_in(Bucket::AUTH, &[], None, |key, value| {
            if key == AUTH_ENABLED {
                state.enabled = value == [1];
            } else if key == AUTH_REVISION {
                if let Ok(bytes) = <[u8; 8]>::try_from(value) {
                    state.revision = u64::from_be_bytes(bytes);
                }
            } else if let Some(name) = key.strip_prefix(AUTH_USER_PREFIX) {
                if let Ok(user) = User::decode(value) {
                    state
                        .users
                        .insert(String::from_utf8_lossy(name).into_owned(), user);
                }
            } else if let Some(name) = key.strip_prefix(AUTH_ROLE_PREFIX)
                && let Ok(role) = Role::decode(value)
            {
                state
                    .roles
                    .insert(String::from_utf8_lossy(name).into_owned(), role);
            }
            true
        })
        .map_err(backend_error)?;
        *self.state.write() = state;
        self.tokens.lock().clear();
        Ok(())
    }

    /// Whether auth is on.
    pub fn is_enabled(&self) -> bool {
        self.state.read().enabled
    }

    /// The current auth revision.
    pub fn revision(&self) -> u64 {
        self.state.read().revision
    }

    /// `--bcrypt-cost`.
    pub fn bcrypt_cost(&self) -> u32 {
        self.config.bcrypt_cost
    }

    // --- identities ---------------------------------------------------------------------

    /// Who a request comes from: `None` while auth is off; the user of `token` (an unknown or
    /// expired token is etcd's "invalid auth token"); else the common name of the client
    /// certificate; else the anonymous user (whose every check fails with "user name is
    /// empty").
    pub fn auth_info(
        &self,
        token: Option<&str>,
        common_name: Option<&str>,
    ) -> Result<Option<AuthInfo>> {
        let revision = {
            let state = self.state.read();
            if !state.enabled {
                return Ok(None);
            }
            state.revision
        };
        if let (Some(token), TokenProvider::Jwt(jwt)) = (token, &self.provider) {
            // A JWT carries the revision it was issued under: a stale one is "old revision".
            return match jwt.verify(token) {
                Some(info) => Ok(Some(info)),
                None => Err(etcd(&rpctypes::INVALID_AUTH_TOKEN)),
            };
        }
        if let Some(token) = token {
            let mut tokens = self.tokens.lock();
            let now = Instant::now();
            let Some(entry) = tokens.get_mut(token) else {
                return Err(etcd(&rpctypes::INVALID_AUTH_TOKEN));
            };
            if entry.expires <= now {
                tokens.remove(token);
                return Err(etcd(&rpctypes::INVALID_AUTH_TOKEN));
            }
            // Each use keeps a simple token alive for another TTL, as etcd's.
            entry.expires = now + self.config.token_ttl;
            return Ok(Some(AuthInfo {
                username: entry.username.clone(),
                revision,
                live: true,
            }));
        }
        Ok(Some(AuthInfo {
            username: common_name.unwrap_or_default().to_owned(),
            revision,
            live: true,
        }))
    }

    /// Checks a password before `Authenticate` is proposed (etcd's `CheckPassword`).
    pub fn check_password(&self, name: &str, password: &str) -> Result<()> {
        let hash = {
            let state = self.state.read();
            if !state.enabled {
                return Err(etcd(&rpctypes::AUTH_NOT_ENABLED));
            }
            let Some(user) = state.users.get(name) else {
                return Err(etcd(&rpctypes::AUTH_FAILED));
            };
            if user.options.as_ref().is_some_and(|o| o.no_password) {
                return Err(etcd(&rpctypes::AUTH_FAILED));
            }
            String::from_utf8_lossy(&user.password).into_owned()
        };
        match bcrypt::verify(password, &hash) {
            Ok(true) => Ok(()),
            _ => Err(etcd(&rpctypes::AUTH_FAILED)),
        }
    }

    /// A random prefix for a new simple token (etcd's `GenTokenPrefix`).
    pub fn token_prefix() -> String {
        const LETTERS: &[u8] = b"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ";
        let mut rng = rand::rng();
        (0..16)
            .map(|_| char::from(LETTERS[rng.random_range(0..LETTERS.len())]))
            .collect()
    }

    /// Hash `password` at `--bcrypt-cost`, for a proposal: its `hashed_password`, in the
    /// request's wire form ([`hashed_password_field`]).
    pub fn hash_password(&self, password: &str) -> Result<String> {
        bcrypt::hash(password, self.config.bcrypt_cost)
            .map(|hash| hashed_password_field(&hash))
            .map_err(|e| ServerError::Fatal(format!("hash password: {e}")))
    }

    // --- reads of the auth state ---------------------------------------------------------

    /// A user (etcd's UserGet): a user may read itself, an admin anyone.
    pub fn user_get(&self, info: Option<&AuthInfo>, name: &str) -> Result<Vec<String>> {
        let state = self.state.read();
        state.check_self_or_admin(info, name)?;
        state
            .users
            .get(name)
            .map(|u| u.roles.clone())
            .ok_or_else(|| etcd(&rpctypes::USER_NOT_FOUND))
    }

    /// Every user name, sorted (etcd's UserList).
    pub fn user_list(&self) -> Vec<String> {
        self.state.read().users.keys().cloned().collect()
    }

    /// A role's permissions (etcd's RoleGet): an admin, or a user holding the role.
    pub fn role_get(&self, info: Option<&AuthInfo>, name: &str) -> Result<Vec<Permission>> {
        let state = self.state.read();
        if let Some(info) = info
            && state.enabled
        {
            let holds = state
                .users
                .get(&info.username)
                .is_some_and(|u| u.roles.iter().any(|r| r == name));
            if !holds {
                drop(state);
                self.check_admin(Some(info))?;
                return self.role_get(None, name);
            }
        }
        if name == ROOT && !state.roles.contains_key(ROOT) {
            return Err(etcd(&rpctypes::ROLE_NOT_FOUND));
        }
        state
            .roles
            .get(name)
            .map(|r| r.key_permission.clone())
            .ok_or_else(|| etcd(&rpctypes::ROLE_NOT_FOUND))
    }

    /// Every role name, sorted (etcd's RoleList).
    pub fn role_list(&self) -> Vec<String> {
        self.state.read().roles.keys().cloned().collect()
    }

    fn assign_token(&self, token: &str, username: &str) {
        let mut tokens = self.tokens.lock();
        let now = Instant::now();
        if tokens.len() >= MAX_SIMPLE_TOKENS {
            tokens.retain(|_, t| t.expires > now);
            if tokens.len() >= MAX_SIMPLE_TOKENS
                && let Some(oldest) = tokens
                    .iter()
                    .min_by_key(|(_, t)| t.expires)
                    .map(|(k, _)| k.clone())
            {
                tokens.remove(&oldest);
            }
        }
        tokens.insert(
            token.to_owned(),
            SimpleToken {
                username: username.to_owned(),
                expires: now + self.config.token_ttl,
            },
        );
    }

    /// A deleted user, or one whose password changed, loses its tokens.
    fn invalidate_user(&self, username: &str) {
        self.tokens.lock().retain(|_, t| t.username != username);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// etcd 3.5's proposer writes `base64.StdEncoding.EncodeToString(bcrypt hash)`; its
    /// applier decodes it back (`selectPassword`).
    #[test]
    fn hashed_passwords_travel_in_base64_as_etcd_35_sends_them() {
        let hash = "$2a$10$Y8m3l7vV0pUo0q2yq8c3tOBnUoP1Vf6kq3K5h0V1hX2fQb0m7n8yG";
        let field = hashed_password_field(hash);
        assert_eq!(
            field,
            "JDJhJDEwJFk4bTNsN3ZWMHBVbzBxMnlxOGMzdE9CblVvUDFWZjZrcTNLNWgwVjFoWDJmUWIwbTduOHlH"
        );
        assert_eq!(
            password_from_field(&field).as_deref(),
            Some(hash.as_bytes())
        );
        // etcd-rs's own older entries carry the bare hash.
        assert_eq!(password_from_field(hash).as_deref(), Some(hash.as_bytes()));
        assert_eq!(password_from_field("not base64!"), None);
        // etcd decodes an empty field to an empty password.
        assert_eq!(password_from_field("").as_deref(), Some(&b""[..]));
    }
}
