//! The Auth service (etcd `api/v3rpc/auth.go` and the auth half of `v3_server.go`): enabling
//! auth, Authenticate, and user and role management. Changes go through raft; management
//! needs the root role once auth is on; passwords are hashed here, before proposing, so only
//! hashes are replicated and stored.

use etcdrs_proto::etcdserverpb::auth_server::Auth;
use etcdrs_proto::etcdserverpb::{
    AuthDisableRequest, AuthDisableResponse, AuthEnableRequest, AuthEnableResponse,
    AuthRoleAddRequest, AuthRoleAddResponse, AuthRoleDeleteRequest, AuthRoleDeleteResponse,
    AuthRoleGetRequest, AuthRoleGetResponse, AuthRoleGrantPermissionRequest,
    AuthRoleGrantPermissionResponse, AuthRoleListRequest, AuthRoleListResponse,
    AuthRoleRevokePermissionRequest, AuthRoleRevokePermissionResponse, AuthStatusRequest,
    AuthStatusResponse, AuthUserAddRequest, AuthUserAddResponse, AuthUserChangePasswordRequest,
    AuthUserChangePasswordResponse, AuthUserDeleteRequest, AuthUserDeleteResponse,
    AuthUserGetRequest, AuthUserGetResponse, AuthUserGrantRoleRequest, AuthUserGrantRoleResponse,
    AuthUserListRequest, AuthUserListResponse, AuthUserRevokeRoleRequest,
    AuthUserRevokeRoleResponse, AuthenticateRequest, AuthenticateResponse, ResponseHeader,
};
use tonic::{Request, Response, Status};

use super::Rpc;
use crate::auth::{AuthInfo, AuthStore};
use crate::request::{InternalAuthenticateRequest, Op};

impl Rpc {
    /// Propose an auth change as `auth`, after checking it may manage auth; returns the
    /// change's output (Authenticate's token) and a filled header.
    async fn auth_change(
        &self,
        op: Op,
        auth: Option<&AuthInfo>,
        admin: bool,
    ) -> Result<(String, Option<ResponseHeader>), Status> {
        self.server.check_not_learner()?;
        if admin {
            self.server.auth().check_admin(auth)?;
        }
        let token = self.server.request_auth(op, auth).await?;
        let mut header = None;
        self.server.fill_header(&mut header);
        Ok((token, header))
    }

    fn header(&self) -> Option<ResponseHeader> {
        let mut header = None;
        self.server.fill_header(&mut header);
        header
    }

    /// bcrypt off the runtime's threads.
    async fn hash(&self, password: String) -> Result<String, Status> {
        let server = self.server.clone();
        tokio::task::spawn_blocking(move || server.auth().hash_password(&password))
            .await
            .map_err(|e| Status::internal(e.to_string()))?
            .map_err(Status::from)
    }
}

#[tonic::async_trait]
impl Auth for Rpc {
    async fn auth_enable(
        &self,
        request: Request<AuthEnableRequest>,
    ) -> Result<Response<AuthEnableResponse>, Status> {
        let auth = self.auth_info(&request)?;
        let op = Op::AuthEnable(request.into_inner());
        let (_, header) = self.auth_change(op, auth.as_ref(), true).await?;
        Ok(Response::new(AuthEnableResponse { header }))
    }

    async fn auth_disable(
        &self,
        request: Request<AuthDisableRequest>,
    ) -> Result<Response<AuthDisableResponse>, Status> {
        let auth = self.auth_info(&request)?;
        let op = Op::AuthDisable(request.into_inner());
        let (_, header) = self.auth_change(op, auth.as_ref(), true).await?;
        Ok(Response::new(AuthDisableResponse { header }))
    }

    async fn auth_status(
        &self,
        _request: Request<AuthStatusRequest>,
    ) -> Result<Response<AuthStatusResponse>, Status> {
        let store = self.server.auth();
        Ok(Response::new(AuthStatusResponse {
            header: self.header(),
            enabled: store.is_enabled(),
            auth_revision: store.revision(),
        }))
    }

    async fn authenticate(
        &self,
        request: Request<AuthenticateRequest>,
    ) -> Result<Response<AuthenticateResponse>, Status> {
        let req = request.into_inner();
        let server = self.server.clone();
        let name = req.name.clone();
        // bcrypt is slow on purpose: keep it off the runtime's threads.
        tokio::task::spawn_blocking(move || server.auth().check_password(&name, &req.password))
            .await
            .map_err(|e| Status::internal(e.to_string()))?
            .map_err(Status::from)?;
        // etcd puts the password into the entry too; its applier never reads it (the password
        // was checked here), so etcd-rs leaves it out of the log.
        let op = Op::Authenticate(InternalAuthenticateRequest {
            name: req.name,
            password: String::new(),
            simple_token: AuthStore::token_prefix(),
        });
        let (token, header) = self.auth_change(op, None, false).await?;
        Ok(Response::new(AuthenticateResponse { header, token }))
    }

    async fn user_add(
        &self,
        request: Request<AuthUserAddRequest>,
    ) -> Result<Response<AuthUserAddResponse>, Status> {
        let auth = self.auth_info(&request)?;
        let mut req = request.into_inner();
        self.server.auth().check_admin(auth.as_ref())?;
        let no_password = req.options.as_ref().is_some_and(|o| o.no_password);
        if self.server.proposes_hashed_passwords() {
            if !no_password && req.hashed_password.is_empty() {
                req.hashed_password = self.hash(std::mem::take(&mut req.password)).await?;
            }
            req.password.clear();
        }
        let (_, header) = self
            .auth_change(Op::UserAdd(req), auth.as_ref(), true)
            .await?;
        Ok(Response::new(AuthUserAddResponse { header }))
    }

    async fn user_get(
        &self,
        request: Request<AuthUserGetRequest>,
    ) -> Result<Response<AuthUserGetResponse>, Status> {
        let auth = self.auth_info(&request)?;
        let req = request.into_inner();
        self.server.linearizable_barrier().await?;
        let roles = self.server.auth().user_get(auth.as_ref(), &req.name)?;
        Ok(Response::new(AuthUserGetResponse {
            header: self.header(),
            roles,
        }))
    }

    async fn user_list(
        &self,
        request: Request<AuthUserListRequest>,
    ) -> Result<Response<AuthUserListResponse>, Status> {
        let auth = self.auth_info(&request)?;
        self.server.auth().check_admin(auth.as_ref())?;
        self.server.linearizable_barrier().await?;
        Ok(Response::new(AuthUserListResponse {
            header: self.header(),
            users: self.server.auth().user_list(),
        }))
    }

    async fn user_delete(
        &self,
        request: Request<AuthUserDeleteRequest>,
    ) -> Result<Response<AuthUserDeleteResponse>, Status> {
        let auth = self.auth_info(&request)?;
        let op = Op::UserDelete(request.into_inner());
        let (_, header) = self.auth_change(op, auth.as_ref(), true).await?;
        Ok(Response::new(AuthUserDeleteResponse { header }))
    }

    async fn user_change_password(
        &self,
        request: Request<AuthUserChangePasswordRequest>,
    ) -> Result<Response<AuthUserChangePasswordResponse>, Status> {
        let auth = self.auth_info(&request)?;
        let mut req = request.into_inner();
        self.server.auth().check_admin(auth.as_ref())?;
        if self.server.proposes_hashed_passwords() {
            if req.hashed_password.is_empty() {
                req.hashed_password = self.hash(std::mem::take(&mut req.password)).await?;
            }
            req.password.clear();
        }
        let op = Op::UserChangePassword(req);
        let (_, header) = self.auth_change(op, auth.as_ref(), true).await?;
        Ok(Response::new(AuthUserChangePasswordResponse { header }))
    }

    async fn user_grant_role(
        &self,
        request: Request<AuthUserGrantRoleRequest>,
    ) -> Result<Response<AuthUserGrantRoleResponse>, Status> {
        let auth = self.auth_info(&request)?;
        let op = Op::UserGrantRole(request.into_inner());
        let (_, header) = self.auth_change(op, auth.as_ref(), true).await?;
        Ok(Response::new(AuthUserGrantRoleResponse { header }))
    }

    async fn user_revoke_role(
        &self,
        request: Request<AuthUserRevokeRoleRequest>,
    ) -> Result<Response<AuthUserRevokeRoleResponse>, Status> {
        let auth = self.auth_info(&request)?;
        let op = Op::UserRevokeRole(request.into_inner());
        let (_, header) = self.auth_change(op, auth.as_ref(), true).await?;
        Ok(Response::new(AuthUserRevokeRoleResponse { header }))
    }

    async fn role_add(
        &self,
        request: Request<AuthRoleAddRequest>,
    ) -> Result<Response<AuthRoleAddResponse>, Status> {
        let auth = self.auth_info(&request)?;
        let op = Op::RoleAdd(request.into_inner());
        let (_, header) = self.auth_change(op, auth.as_ref(), true).await?;
        Ok(Response::new(AuthRoleAddResponse { header }))
    }

    async fn role_get(
        &self,
        request: Request<AuthRoleGetRequest>,
    ) -> Result<Response<AuthRoleGetResponse>, Status> {
        let auth = self.auth_info(&request)?;
        let req = request.into_inner();
        self.server.linearizable_barrier().await?;
        let perm = self.server.auth().role_get(auth.as_ref(), &req.role)?;
        Ok(Response::new(AuthRoleGetResponse {
            header: self.header(),
            perm,
        }))
    }

    async fn role_list(
        &self,
        request: Request<AuthRoleListRequest>,
    ) -> Result<Response<AuthRoleListResponse>, Status> {
        let auth = self.auth_info(&request)?;
        self.server.auth().check_admin(auth.as_ref())?;
        self.server.linearizable_barrier().await?;
        Ok(Response::new(AuthRoleListResponse {
            header: self.header(),
            roles: self.server.auth().role_list(),
        }))
    }

    async fn role_delete(
        &self,
        request: Request<AuthRoleDeleteRequest>,
    ) -> Result<Response<AuthRoleDeleteResponse>, Status> {
        let auth = self.auth_info(&request)?;
        let op = Op::RoleDelete(request.into_inner());
        let (_, header) = self.auth_change(op, auth.as_ref(), true).await?;
        Ok(Response::new(AuthRoleDeleteResponse { header }))
    }

    async fn role_grant_permission(
        &self,
        request: Request<AuthRoleGrantPermissionRequest>,
    ) -> Result<Response<AuthRoleGrantPermissionResponse>, Status> {
        let auth = self.auth_info(&request)?;
        let op = Op::RoleGrantPermission(request.into_inner());
        let (_, header) = self.auth_change(op, auth.as_ref(), true).await?;
        Ok(Response::new(AuthRoleGrantPermissionResponse { header }))
    }

    async fn role_revoke_permission(
        &self,
        request: Request<AuthRoleRevokePermissionRequest>,
    ) -> Result<Response<AuthRoleRevokePermissionResponse>, Status> {
        let auth = self.auth_info(&request)?;
        let op = Op::RoleRevokePermission(request.into_inner());
        let (_, header) = self.auth_change(op, auth.as_ref(), true).await?;
        Ok(Response::new(AuthRoleRevokePermissionResponse { header }))
    }
}
