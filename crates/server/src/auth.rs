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
//! auth store is old", so a permission revoked meanwhile is never bypassed.

use std::collections::{BTreeMap, HashMap};
use std::time::{Duration, Instant};

use etcdrs_backend::Bucket;
use etcdrs_mvcc::{KvStore, WriteBatch};
use etcdrs_proto::authpb::permission::Type as PermType;
use etcdrs_proto::authpb::{Permission, Role, User, UserAddOptions};
use etcdrs_proto::etcdserverpb::request_op::Request as OpRequest;
use etcdrs_proto::etcdserverpb::{
    AuthRoleGrantPermissionRequest, AuthRoleRevokePermissionRequest, AuthUserAddRequest,
    AuthUserChangePasswordRequest, AuthUserGrantRoleRequest, AuthUserRevokeRoleRequest,
    DeleteRangeRequest, PutRequest, RangeRequest, TxnRequest,
};
use etcdrs_proto::rpctypes::{self, EtcdError};
use parking_lot::{Mutex, RwLock};
use prost::Message;
use rand::Rng;

use crate::error::{Result, ServerError};

mod jwt;

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

pub(crate) const KEY_ENABLED: &[u8] = b"enabled";
pub(crate) const KEY_REVISION: &[u8] = b"revision";
pub(crate) const USER_PREFIX: &[u8] = b"user/";
pub(crate) const ROLE_PREFIX: &[u8] = b"role/";

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
            if key == KEY_ENABLED {
                state.enabled = value == [1];
            } else if key == KEY_REVISION {
                if let Ok(bytes) = <[u8; 8]>::try_from(value) {
                    state.revision = u64::from_be_bytes(bytes);
                }
            } else if let Some(name) = key.strip_prefix(USER_PREFIX) {
                if let Ok(user) = User::decode(value) {
                    state
                        .users
                        .insert(String::from_utf8_lossy(name).into_owned(), user);
                }
            } else if let Some(name) = key.strip_prefix(ROLE_PREFIX)
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

    /// Hash `password` at `--bcrypt-cost`, for a proposal.
    pub fn hash_password(&self, password: &str) -> Result<String> {
        bcrypt::hash(password, self.config.bcrypt_cost)
            .map_err(|e| ServerError::Fatal(format!("hash password: {e}")))
    }

    // --- checks -------------------------------------------------------------------------

    /// The caller must be an admin (have the root role) when auth is on.
    pub fn check_admin(&self, info: Option<&AuthInfo>) -> Result<()> {
        self.check_user(info)?;
        let Some(info) = info else { return Ok(()) };
        let state = self.state.read();
        if !state.enabled || state.is_admin(&info.username) {
            Ok(())
        } else {
            Err(etcd(&rpctypes::PERMISSION_DENIED))
        }
    }

    /// The caller must be a user (not the anonymous caller) when auth is on.
    pub fn check_user(&self, info: Option<&AuthInfo>) -> Result<()> {
        let state = self.state.read();
        let Some(info) = info else { return Ok(()) };
        if !state.enabled {
            return Ok(());
        }
        if info.username.is_empty() {
            return Err(etcd(&rpctypes::USER_EMPTY));
        }
        if info.revision < state.revision {
            return Err(etcd(&rpctypes::AUTH_OLD_REVISION));
        }
        if !state.users.contains_key(&info.username) {
            return Err(etcd(&rpctypes::USER_NOT_FOUND));
        }
        Ok(())
    }

    /// The caller may read (or write) `[key, range_end)` (etcd's `isOpPermitted`).
    pub fn check_range(
        &self,
        info: Option<&AuthInfo>,
        key: &[u8],
        range_end: &[u8],
        write: bool,
    ) -> Result<()> {
        let state = self.state.read();
        state.check(info, &[(key, range_end, write)])
    }

    /// Everything a Range needs.
    pub fn check_range_request(&self, info: Option<&AuthInfo>, req: &RangeRequest) -> Result<()> {
        self.check_range(info, &req.key, &req.range_end, false)
    }

    /// Everything a Put needs: write on the key, read for `prev_kv`, write on the keys of the
    /// lease it attaches to (etcd's `checkLeasePuts`).
    pub fn check_put(
        &self,
        info: Option<&AuthInfo>,
        req: &PutRequest,
        lease_keys: &[Vec<u8>],
    ) -> Result<()> {
        let state = self.state.read();
        let mut needs: Vec<(&[u8], &[u8], bool)> = vec![(&req.key, &[], true)];
        if req.prev_kv {
            needs.push((&req.key, &[], false));
        }
        for key in lease_keys {
            needs.push((key, &[], true));
        }
        state.check(info, &needs)
    }

    /// Everything a DeleteRange needs.
    pub fn check_delete(&self, info: Option<&AuthInfo>, req: &DeleteRangeRequest) -> Result<()> {
        let state = self.state.read();
        let mut needs: Vec<(&[u8], &[u8], bool)> = vec![(&req.key, &req.range_end, true)];
        if req.prev_kv {
            needs.push((&req.key, &req.range_end, false));
        }
        state.check(info, &needs)
    }

    /// Everything a Txn needs: read on every compared key, and what each operation of both
    /// branches needs, whichever branch runs (etcd's `checkTxnReqsPermission`).
    pub fn check_txn(&self, info: Option<&AuthInfo>, req: &TxnRequest) -> Result<()> {
        let state = self.state.read();
        let mut needs = Vec::new();
        collect_txn_needs(req, &mut needs);
        state.check(info, &needs)
    }

    /// Revoking a lease deletes its keys: write on each (etcd's `checkLeasePuts`).
    pub fn check_lease_keys(&self, info: Option<&AuthInfo>, keys: &[Vec<u8>]) -> Result<()> {
        let state = self.state.read();
        let needs: Vec<(&[u8], &[u8], bool)> =
            keys.iter().map(|k| (k.as_slice(), &[][..], true)).collect();
        state.check(info, &needs)
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

    // --- replicated changes ---------------------------------------------------------------

    /// Apply one replicated auth change in `batch`. `proposed` is the auth revision the
    /// proposer checked under.
    pub fn apply(
        &self,
        batch: &mut WriteBatch<'_>,
        change: &AuthChange,
        proposed: Option<&AuthInfo>,
    ) -> Result<String> {
        let mut state = self.state.write();
        if let Some(info) = proposed
            && state.enabled
            && info.revision < state.revision
        {
            return Err(etcd(&rpctypes::AUTH_OLD_REVISION));
        }
        let mut token = String::new();
        match change {
            AuthChange::Enable => {
                if state.enabled {
                    return Ok(token);
                }
                let Some(root) = state.users.get(ROOT) else {
                    return Err(etcd(&rpctypes::ROOT_USER_NOT_EXIST));
                };
                if !root.roles.iter().any(|r| r == ROOT) {
                    return Err(etcd(&rpctypes::ROOT_ROLE_NOT_EXIST));
                }
                state.enabled = true;
                batch.bucket_put(Bucket::AUTH, KEY_ENABLED, &[1])?;
                self.tokens.lock().clear();
                tracing::info!("enabled authentication");
            }
            AuthChange::Disable => {
                if !state.enabled {
                    return Ok(token);
                }
                state.enabled = false;
                batch.bucket_put(Bucket::AUTH, KEY_ENABLED, &[0])?;
                self.tokens.lock().clear();
                tracing::info!("disabled authentication");
            }
            AuthChange::Authenticate { name, token_prefix } => {
                if !state.enabled {
                    return Err(etcd(&rpctypes::AUTH_NOT_ENABLED));
                }
                if !state.users.contains_key(name) {
                    return Err(etcd(&rpctypes::AUTH_FAILED));
                }
                match &self.provider {
                    TokenProvider::Simple => {
                        token = format!("{token_prefix}.{}", state.revision);
                        self.assign_token(&token, name);
                    }
                    TokenProvider::Jwt(jwt) => {
                        // A member without the private key cannot sign (etcd fails the same).
                        token = jwt
                            .sign(name, state.revision)
                            .ok_or_else(|| etcd(&rpctypes::AUTH_FAILED))?;
                    }
                }
                // Authenticating changes nothing replicated: no revision bump.
                return Ok(token);
            }
            AuthChange::UserAdd(req) => {
                if req.name.is_empty() {
                    return Err(etcd(&rpctypes::USER_EMPTY));
                }
                if state.users.contains_key(&req.name) {
                    return Err(etcd(&rpctypes::USER_ALREADY_EXIST));
                }
                let no_password = req.options.as_ref().is_some_and(|o| o.no_password);
                let user = User {
                    name: req.name.clone().into_bytes(),
                    password: if no_password {
                        Vec::new()
                    } else {
                        req.hashed_password.clone().into_bytes()
                    },
                    roles: Vec::new(),
                    options: Some(UserAddOptions { no_password }),
                };
                put_user(batch, &user)?;
                state.users.insert(req.name.clone(), user);
                tracing::info!(user_name = %req.name, "added a user");
            }
            AuthChange::UserDelete(name) => {
                if state.enabled && name == ROOT {
                    return Err(etcd(&rpctypes::INVALID_AUTH_MGMT));
                }
                if state.users.remove(name).is_none() {
                    return Err(etcd(&rpctypes::USER_NOT_FOUND));
                }
                batch.bucket_delete(Bucket::AUTH, &user_key(name))?;
                self.invalidate_user(name);
                tracing::info!(user_name = %name, "deleted a user");
            }
            AuthChange::UserChangePassword(req) => {
                let Some(user) = state.users.get_mut(&req.name) else {
                    return Err(etcd(&rpctypes::USER_NOT_FOUND));
                };
                user.password = req.hashed_password.clone().into_bytes();
                user.options = Some(UserAddOptions { no_password: false });
                let user = user.clone();
                put_user(batch, &user)?;
                self.invalidate_user(&req.name);
                tracing::info!(user_name = %req.name, "changed a password of a user");
            }
            AuthChange::UserGrantRole(req) => {
                if req.role != ROOT && !state.roles.contains_key(&req.role) {
                    if !state.users.contains_key(&req.user) {
                        return Err(etcd(&rpctypes::USER_NOT_FOUND));
                    }
                    return Err(etcd(&rpctypes::ROLE_NOT_FOUND));
                }
                let Some(user) = state.users.get_mut(&req.user) else {
                    return Err(etcd(&rpctypes::USER_NOT_FOUND));
                };
                if user.roles.contains(&req.role) {
                    return Ok(token);
                }
                user.roles.push(req.role.clone());
                user.roles.sort();
                let user = user.clone();
                put_user(batch, &user)?;
                tracing::info!(user_name = %req.user, role_name = %req.role, "granted a role to a user");
            }
            AuthChange::UserRevokeRole(req) => {
                if state.enabled && req.name == ROOT && req.role == ROOT {
                    return Err(etcd(&rpctypes::INVALID_AUTH_MGMT));
                }
                let Some(user) = state.users.get_mut(&req.name) else {
                    return Err(etcd(&rpctypes::USER_NOT_FOUND));
                };
                let before = user.roles.len();
                user.roles.retain(|r| *r != req.role);
                if user.roles.len() == before {
                    return Err(etcd(&rpctypes::ROLE_NOT_GRANTED));
                }
                let user = user.clone();
                put_user(batch, &user)?;
                tracing::info!(user_name = %req.name, role_name = %req.role, "revoked a role from a user");
            }
            AuthChange::RoleAdd(name) => {
                if name.is_empty() {
                    return Err(etcd(&rpctypes::ROLE_EMPTY));
                }
                if state.roles.contains_key(name) {
                    return Err(etcd(&rpctypes::ROLE_ALREADY_EXIST));
                }
                let role = Role {
                    name: name.clone().into_bytes(),
                    key_permission: Vec::new(),
                };
                put_role(batch, &role)?;
                state.roles.insert(name.clone(), role);
                tracing::info!(role_name = %name, "created a role");
            }
            AuthChange::RoleDelete(name) => {
                if state.enabled && name == ROOT {
                    return Err(etcd(&rpctypes::INVALID_AUTH_MGMT));
                }
                if state.roles.remove(name).is_none() {
                    return Err(etcd(&rpctypes::ROLE_NOT_FOUND));
                }
                batch.bucket_delete(Bucket::AUTH, &role_key(name))?;
                // The role leaves every user that had it.
                let mut changed = Vec::new();
                for user in state.users.values_mut() {
                    let before = user.roles.len();
                    user.roles.retain(|r| r != name);
                    if user.roles.len() != before {
                        changed.push(user.clone());
                    }
                }
                for user in &changed {
                    put_user(batch, user)?;
                }
                tracing::info!(role_name = %name, "deleted a role");
            }
            AuthChange::RoleGrantPermission(req) => {
                let Some(role) = state.roles.get_mut(&req.name) else {
                    return Err(etcd(&rpctypes::ROLE_NOT_FOUND));
                };
                let Some(perm) = &req.perm else {
                    return Err(etcd(&rpctypes::PERMISSION_NOT_GIVEN));
                };
                match role
                    .key_permission
                    .iter_mut()
                    .find(|p| p.key == perm.key && p.range_end == perm.range_end)
                {
                    Some(existing) => existing.perm_type = perm.perm_type,
                    None => {
                        role.key_permission.push(perm.clone());
                        role.key_permission.sort_by(|a, b| a.key.cmp(&b.key));
                    }
                }
                let role = role.clone();
                put_role(batch, &role)?;
                tracing::info!(role_name = %req.name, "granted/updated a permission to a user");
            }
            AuthChange::RoleRevokePermission(req) => {
                let Some(role) = state.roles.get_mut(&req.role) else {
                    return Err(etcd(&rpctypes::ROLE_NOT_FOUND));
                };
                let before = role.key_permission.len();
                role.key_permission
                    .retain(|p| !(p.key == req.key && p.range_end == req.range_end));
                if role.key_permission.len() == before {
                    return Err(etcd(&rpctypes::PERMISSION_NOT_GRANTED));
                }
                let role = role.clone();
                put_role(batch, &role)?;
                tracing::info!(role_name = %req.role, "revoked a permission on range");
            }
        }
        state.revision += 1;
        batch.bucket_put(Bucket::AUTH, KEY_REVISION, &state.revision.to_be_bytes())?;
        Ok(token)
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

impl AuthState {
    fn is_admin(&self, username: &str) -> bool {
        self.users
            .get(username)
            .is_some_and(|u| u.roles.iter().any(|r| r == ROOT))
    }

    fn check_self_or_admin(&self, info: Option<&AuthInfo>, name: &str) -> Result<()> {
        let Some(info) = info else { return Ok(()) };
        if !self.enabled {
            return Ok(());
        }
        if info.username.is_empty() {
            return Err(etcd(&rpctypes::USER_EMPTY));
        }
        if info.username == name || self.is_admin(&info.username) {
            Ok(())
        } else {
            Err(etcd(&rpctypes::PERMISSION_DENIED))
        }
    }

    /// Every `(key, range_end, write)` must be permitted.
    fn check(&self, info: Option<&AuthInfo>, needs: &[(&[u8], &[u8], bool)]) -> Result<()> {
        let Some(info) = info else { return Ok(()) };
        if !self.enabled {
            return Ok(());
        }
        if info.username.is_empty() {
            return Err(etcd(&rpctypes::USER_EMPTY));
        }
        if info.revision < self.revision {
            return Err(etcd(&rpctypes::AUTH_OLD_REVISION));
        }
        let Some(user) = self.users.get(&info.username) else {
            return Err(etcd(&rpctypes::PERMISSION_DENIED));
        };
        if user.roles.iter().any(|r| r == ROOT) {
            return Ok(());
        }
        let perms: Vec<&Permission> = user
            .roles
            .iter()
            .filter_map(|r| self.roles.get(r))
            .flat_map(|r| r.key_permission.iter())
            .collect();
        for (key, range_end, write) in needs {
            let allowed: Vec<Interval> = perms
                .iter()
                .filter(|p| {
                    let kind = PermType::try_from(p.perm_type).unwrap_or(PermType::Read);
                    kind == PermType::Readwrite
                        || (*write && kind == PermType::Write)
                        || (!*write && kind == PermType::Read)
                })
                .map(|p| Interval::of(&p.key, &p.range_end))
                .collect();
            if !covers(&allowed, &Interval::of(key, range_end)) {
                return Err(etcd(&rpctypes::PERMISSION_DENIED));
            }
        }
        Ok(())
    }
}

/// A key interval: `[start, end)`, `end == None` meaning no end.
#[derive(Debug, Clone)]
struct Interval {
    start: Vec<u8>,
    end: Option<Vec<u8>>,
}

impl Interval {
    /// etcd's reading of a key and range end: empty end is the key alone, `"\0"` is every key
    /// from `key` on.
    fn of(key: &[u8], range_end: &[u8]) -> Interval {
        let end = if range_end.is_empty() {
            let mut next = key.to_vec();
            next.push(0);
            Some(next)
        } else if range_end == [0] {
            None
        } else {
            Some(range_end.to_vec())
        };
        Interval {
            start: key.to_vec(),
            end,
        }
    }
}

/// Whether the union of `allowed` covers all of `wanted`.
fn covers(allowed: &[Interval], wanted: &Interval) -> bool {
    if let Some(end) = &wanted.end
        && *end <= wanted.start
    {
        // An empty range asks for nothing.
        return true;
    }
    let mut covered_to = wanted.start.clone();
    // Each round extends the covered prefix by one interval; at most one round per interval.
    for _ in 0..=allowed.len() {
        let next = allowed
            .iter()
            .filter(|i| i.start <= covered_to && i.end.as_ref().is_none_or(|e| *e > covered_to))
            .map(|i| i.end.clone())
            .max_by(|a, b| match (a, b) {
                (None, None) => std::cmp::Ordering::Equal,
                (None, _) => std::cmp::Ordering::Greater,
                (_, None) => std::cmp::Ordering::Less,
                (Some(a), Some(b)) => a.cmp(b),
            });
        match next {
            None => return false,
            Some(None) => return true,
            Some(Some(end)) => {
                if wanted.end.as_ref().is_some_and(|w| end >= *w) {
                    return true;
                }
                covered_to = end;
            }
        }
    }
    false
}

fn collect_txn_needs<'a>(req: &'a TxnRequest, needs: &mut Vec<(&'a [u8], &'a [u8], bool)>) {
    for compare in &req.compare {
        needs.push((&compare.key, &compare.range_end, false));
    }
    for op in req.success.iter().chain(req.failure.iter()) {
        match &op.request {
            Some(OpRequest::RequestRange(r)) => needs.push((&r.key, &r.range_end, false)),
            Some(OpRequest::RequestPut(p)) => {
                needs.push((&p.key, &[], true));
                if p.prev_kv {
                    needs.push((&p.key, &[], false));
                }
            }
            Some(OpRequest::RequestDeleteRange(d)) => {
                needs.push((&d.key, &d.range_end, true));
                if d.prev_kv {
                    needs.push((&d.key, &d.range_end, false));
                }
            }
            Some(OpRequest::RequestTxn(t)) => collect_txn_needs(t, needs),
            None => {}
        }
    }
}

fn user_key(name: &str) -> Vec<u8> {
    [USER_PREFIX, name.as_bytes()].concat()
}

fn role_key(name: &str) -> Vec<u8> {
    [ROLE_PREFIX, name.as_bytes()].concat()
}

fn put_user(batch: &mut WriteBatch<'_>, user: &User) -> Result<()> {
    let name = String::from_utf8_lossy(&user.name).into_owned();
    batch.bucket_put(Bucket::AUTH, &user_key(&name), &user.encode_to_vec())?;
    Ok(())
}

fn put_role(batch: &mut WriteBatch<'_>, role: &Role) -> Result<()> {
    let name = String::from_utf8_lossy(&role.name).into_owned();
    batch.bucket_put(Bucket::AUTH, &role_key(&name), &role.encode_to_vec())?;
    Ok(())
}

/// A replicated auth change (the raft entry carries it as one of `request::Op`'s variants).
#[derive(Clone, Debug)]
pub enum AuthChange {
    /// AuthEnable.
    Enable,
    /// AuthDisable.
    Disable,
    /// Authenticate: record a token for the user.
    Authenticate {
        /// The user.
        name: String,
        /// The random part of the token, made by the proposer.
        token_prefix: String,
    },
    /// UserAdd (the password already hashed, in `hashed_password`).
    UserAdd(AuthUserAddRequest),
    /// UserDelete.
    UserDelete(String),
    /// UserChangePassword (the password already hashed, in `hashed_password`).
    UserChangePassword(AuthUserChangePasswordRequest),
    /// UserGrantRole.
    UserGrantRole(AuthUserGrantRoleRequest),
    /// UserRevokeRole.
    UserRevokeRole(AuthUserRevokeRoleRequest),
    /// RoleAdd.
    RoleAdd(String),
    /// RoleDelete.
    RoleDelete(String),
    /// RoleGrantPermission.
    RoleGrantPermission(AuthRoleGrantPermissionRequest),
    /// RoleRevokePermission.
    RoleRevokePermission(AuthRoleRevokePermissionRequest),
}

#[cfg(test)]
mod tests {
    use super::*;

    fn perm(key: &str, end: &str) -> Interval {
        Interval::of(key.as_bytes(), end.as_bytes())
    }

    #[test]
    fn intervals_cover_as_etcd_merges_permissions() {
        let prefix = [perm("a/", "a0")];
        assert!(covers(&prefix, &perm("a/x", "")));
        assert!(covers(&prefix, &perm("a/", "a0")));
        assert!(!covers(&prefix, &perm("a/", "b")));
        assert!(!covers(&prefix, &perm("b", "")));
        let pieces = [perm("a", "c"), perm("c", "e")];
        assert!(covers(&pieces, &perm("b", "d")));
        assert!(!covers(&pieces, &perm("b", "f")));
        let open = [perm("m", "\0")];
        assert!(covers(&[Interval::of(b"m", &[0])], &perm("z", "")));
        assert!(!covers(&open, &perm("a", "")));
        let single = [perm("k", "")];
        assert!(covers(&single, &perm("k", "")));
        assert!(!covers(&single, &perm("k", "l")));
    }
}
