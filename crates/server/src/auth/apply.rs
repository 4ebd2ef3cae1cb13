//! The replicated side of auth: [`AuthChange`], the raft entry's auth operations, and
//! [`AuthStore::apply`], which applies one to the auth state and writes it to the backend's
//! `auth` bucket in the apply batch, bumping the auth revision. Every member runs this for
//! every committed change, so it must be deterministic (no clock, no randomness: tokens and
//! password hashes come made by the proposer).

use etcdrs_backend::Bucket;
use etcdrs_mvcc::WriteBatch;
use etcdrs_proto::authpb::{Role, User, UserAddOptions};
use etcdrs_proto::etcdserverpb::{
    AuthRoleGrantPermissionRequest, AuthRoleRevokePermissionRequest, AuthUserAddRequest,
    AuthUserChangePasswordRequest, AuthUserGrantRoleRequest, AuthUserRevokeRoleRequest,
};
use etcdrs_proto::rpctypes;
use etcdrs_schema::keys::{AUTH_ENABLED, AUTH_REVISION, AUTH_ROLE_PREFIX, AUTH_USER_PREFIX};
use prost::Message as _;

use super::{AuthInfo, AuthStore, ROOT, TokenProvider, etcd};
use crate::error::Result;

impl AuthStore {
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
                batch.bucket_put(Bucket::AUTH, AUTH_ENABLED, &[1])?;
                self.tokens.lock().clear();
                tracing::info!("enabled authentication");
            }
            AuthChange::Disable => {
                if !state.enabled {
                    return Ok(token);
                }
                state.enabled = false;
                batch.bucket_put(Bucket::AUTH, AUTH_ENABLED, &[0])?;
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
                let password = if no_password {
                    Vec::new()
                } else {
                    // etcd answers its unmapped `ErrNoPasswordUser` here; only a malformed
                    // proposal, never one of etcd's or etcd-rs's, gets this far.
                    super::password_from_field(&req.hashed_password)
                        .ok_or_else(|| etcd(&rpctypes::AUTH_FAILED))?
                };
                let user = User {
                    name: req.name.clone().into_bytes(),
                    password,
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
                user.password = super::password_from_field(&req.hashed_password)
                    .ok_or_else(|| etcd(&rpctypes::AUTH_FAILED))?;
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
        batch.bucket_put(Bucket::AUTH, AUTH_REVISION, &state.revision.to_be_bytes())?;
        Ok(token)
    }
}

fn user_key(name: &str) -> Vec<u8> {
    [AUTH_USER_PREFIX, name.as_bytes()].concat()
}

fn role_key(name: &str) -> Vec<u8> {
    [AUTH_ROLE_PREFIX, name.as_bytes()].concat()
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
