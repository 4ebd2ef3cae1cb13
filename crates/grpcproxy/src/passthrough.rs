//! The services the proxy forwards as they are (with endpoint failover and the client's
//! metadata): Maintenance, Auth, Lock and Election (etcd `grpcproxy/maintenance.go`,
//! `auth.go`, `lock.go`, `election.go`). Lock names, election names and the keys they return
//! go through `--namespace` like any other key.

use std::pin::Pin;

use etcdrs_proto::etcdserverpb::auth_client::AuthClient;
use etcdrs_proto::etcdserverpb::auth_server::Auth;
use etcdrs_proto::etcdserverpb::maintenance_client::MaintenanceClient;
use etcdrs_proto::etcdserverpb::maintenance_server::Maintenance;
use etcdrs_proto::etcdserverpb::*;
use etcdrs_proto::v3electionpb::election_client::ElectionClient;
use etcdrs_proto::v3electionpb::election_server::Election;
use etcdrs_proto::v3electionpb::{
    CampaignRequest, CampaignResponse, LeaderKey, LeaderRequest, LeaderResponse, ProclaimRequest,
    ProclaimResponse, ResignRequest, ResignResponse,
};
use etcdrs_proto::v3lockpb::lock_client::LockClient;
use etcdrs_proto::v3lockpb::lock_server::Lock;
use etcdrs_proto::v3lockpb::{LockRequest, LockResponse, UnlockRequest, UnlockResponse};
use futures::{Stream, StreamExt};
use tonic::{Request, Response, Status};

use crate::namespace::Namespace;
use crate::upstream::{Upstream, forward};

/// Forwards one unary call of `$client` (a tonic client type) with failover.
macro_rules! unary {
    ($self:ident, $client:ident, $method:ident, $request:ident, $req:expr) => {{
        let req = $req;
        $self
            .upstream
            .unary(|ch| {
                let mut client =
                    $client::new(ch).max_decoding_message_size($self.upstream.max_decoding());
                let req = forward(&$request, req.clone());
                async move { client.$method(req).await }
            })
            .await
    }};
    ($self:ident, $client:ident, $method:ident, $request:ident) => {{
        let req = $request.get_ref().clone();
        unary!($self, $client, $method, $request, req)
    }};
}

/// Maintenance, Auth, Lock and Election, forwarded.
#[derive(Clone)]
pub struct Passthrough {
    upstream: Upstream,
    ns: Namespace,
}

impl Passthrough {
    /// The services over `upstream`.
    pub fn new(upstream: Upstream, ns: Namespace) -> Self {
        Passthrough { upstream, ns }
    }

    fn leader_key_in(&self, leader: &mut Option<LeaderKey>) {
        if let Some(l) = leader.as_mut() {
            l.name = self.ns.key(&l.name);
            l.key = self.ns.key(&l.key);
        }
    }

    fn leader_key_out(&self, leader: &mut Option<LeaderKey>) {
        if let Some(l) = leader.as_mut() {
            self.ns.strip_owned(&mut l.name);
            self.ns.strip_owned(&mut l.key);
        }
    }
}

type BoxStream<T> = Pin<Box<dyn Stream<Item = Result<T, Status>> + Send + 'static>>;

#[tonic::async_trait]
impl Maintenance for Passthrough {
    async fn alarm(
        &self,
        request: Request<AlarmRequest>,
    ) -> Result<Response<AlarmResponse>, Status> {
        unary!(self, MaintenanceClient, alarm, request)
    }
    async fn status(
        &self,
        request: Request<StatusRequest>,
    ) -> Result<Response<StatusResponse>, Status> {
        unary!(self, MaintenanceClient, status, request)
    }
    async fn defragment(
        &self,
        request: Request<DefragmentRequest>,
    ) -> Result<Response<DefragmentResponse>, Status> {
        unary!(self, MaintenanceClient, defragment, request)
    }
    async fn hash(&self, request: Request<HashRequest>) -> Result<Response<HashResponse>, Status> {
        unary!(self, MaintenanceClient, hash, request)
    }
    async fn hash_kv(
        &self,
        request: Request<HashKvRequest>,
    ) -> Result<Response<HashKvResponse>, Status> {
        unary!(self, MaintenanceClient, hash_kv, request)
    }
    type SnapshotStream = BoxStream<SnapshotResponse>;
    async fn snapshot(
        &self,
        request: Request<SnapshotRequest>,
    ) -> Result<Response<Self::SnapshotStream>, Status> {
        let stream = unary!(self, MaintenanceClient, snapshot, request)?.into_inner();
        Ok(Response::new(Box::pin(stream)))
    }
    async fn move_leader(
        &self,
        request: Request<MoveLeaderRequest>,
    ) -> Result<Response<MoveLeaderResponse>, Status> {
        unary!(self, MaintenanceClient, move_leader, request)
    }
    async fn downgrade(
        &self,
        request: Request<DowngradeRequest>,
    ) -> Result<Response<DowngradeResponse>, Status> {
        unary!(self, MaintenanceClient, downgrade, request)
    }
}

#[tonic::async_trait]
impl Auth for Passthrough {
    async fn auth_enable(
        &self,
        request: Request<AuthEnableRequest>,
    ) -> Result<Response<AuthEnableResponse>, Status> {
        unary!(self, AuthClient, auth_enable, request)
    }
    async fn auth_disable(
        &self,
        request: Request<AuthDisableRequest>,
    ) -> Result<Response<AuthDisableResponse>, Status> {
        unary!(self, AuthClient, auth_disable, request)
    }
    async fn auth_status(
        &self,
        request: Request<AuthStatusRequest>,
    ) -> Result<Response<AuthStatusResponse>, Status> {
        unary!(self, AuthClient, auth_status, request)
    }
    async fn authenticate(
        &self,
        request: Request<AuthenticateRequest>,
    ) -> Result<Response<AuthenticateResponse>, Status> {
        unary!(self, AuthClient, authenticate, request)
    }
    async fn user_add(
        &self,
        request: Request<AuthUserAddRequest>,
    ) -> Result<Response<AuthUserAddResponse>, Status> {
        unary!(self, AuthClient, user_add, request)
    }
    async fn user_get(
        &self,
        request: Request<AuthUserGetRequest>,
    ) -> Result<Response<AuthUserGetResponse>, Status> {
        unary!(self, AuthClient, user_get, request)
    }
    async fn user_list(
        &self,
        request: Request<AuthUserListRequest>,
    ) -> Result<Response<AuthUserListResponse>, Status> {
        unary!(self, AuthClient, user_list, request)
    }
    async fn user_delete(
        &self,
        request: Request<AuthUserDeleteRequest>,
    ) -> Result<Response<AuthUserDeleteResponse>, Status> {
        unary!(self, AuthClient, user_delete, request)
    }
    async fn user_change_password(
        &self,
        request: Request<AuthUserChangePasswordRequest>,
    ) -> Result<Response<AuthUserChangePasswordResponse>, Status> {
        unary!(self, AuthClient, user_change_password, request)
    }
    async fn user_grant_role(
        &self,
        request: Request<AuthUserGrantRoleRequest>,
    ) -> Result<Response<AuthUserGrantRoleResponse>, Status> {
        unary!(self, AuthClient, user_grant_role, request)
    }
    async fn user_revoke_role(
        &self,
        request: Request<AuthUserRevokeRoleRequest>,
    ) -> Result<Response<AuthUserRevokeRoleResponse>, Status> {
        unary!(self, AuthClient, user_revoke_role, request)
    }
    async fn role_add(
        &self,
        request: Request<AuthRoleAddRequest>,
    ) -> Result<Response<AuthRoleAddResponse>, Status> {
        unary!(self, AuthClient, role_add, request)
    }
    async fn role_get(
        &self,
        request: Request<AuthRoleGetRequest>,
    ) -> Result<Response<AuthRoleGetResponse>, Status> {
        unary!(self, AuthClient, role_get, request)
    }
    async fn role_list(
        &self,
        request: Request<AuthRoleListRequest>,
    ) -> Result<Response<AuthRoleListResponse>, Status> {
        unary!(self, AuthClient, role_list, request)
    }
    async fn role_delete(
        &self,
        request: Request<AuthRoleDeleteRequest>,
    ) -> Result<Response<AuthRoleDeleteResponse>, Status> {
        unary!(self, AuthClient, role_delete, request)
    }
    async fn role_grant_permission(
        &self,
        request: Request<AuthRoleGrantPermissionRequest>,
    ) -> Result<Response<AuthRoleGrantPermissionResponse>, Status> {
        // Permissions name keys: they live inside the namespace too.
        let mut req = request.get_ref().clone();
        if let Some(perm) = req.perm.as_mut() {
            let (key, end) = self.ns.range(&perm.key, &perm.range_end);
            perm.key = key;
            perm.range_end = end;
        }
        unary!(self, AuthClient, role_grant_permission, request, req)
    }
    async fn role_revoke_permission(
        &self,
        request: Request<AuthRoleRevokePermissionRequest>,
    ) -> Result<Response<AuthRoleRevokePermissionResponse>, Status> {
        let mut req = request.get_ref().clone();
        let (key, end) = self.ns.range(&req.key, &req.range_end);
        req.key = key;
        req.range_end = end;
        unary!(self, AuthClient, role_revoke_permission, request, req)
    }
}

#[tonic::async_trait]
impl Lock for Passthrough {
    async fn lock(&self, request: Request<LockRequest>) -> Result<Response<LockResponse>, Status> {
        let mut req = request.get_ref().clone();
        req.name = self.ns.key(&req.name);
        let mut resp = unary!(self, LockClient, lock, request, req)?;
        self.ns.strip_owned(&mut resp.get_mut().key);
        Ok(resp)
    }
    async fn unlock(
        &self,
        request: Request<UnlockRequest>,
    ) -> Result<Response<UnlockResponse>, Status> {
        let mut req = request.get_ref().clone();
        req.key = self.ns.key(&req.key);
        unary!(self, LockClient, unlock, request, req)
    }
}

#[tonic::async_trait]
impl Election for Passthrough {
    async fn campaign(
        &self,
        request: Request<CampaignRequest>,
    ) -> Result<Response<CampaignResponse>, Status> {
        let mut req = request.get_ref().clone();
        req.name = self.ns.key(&req.name);
        let mut resp = unary!(self, ElectionClient, campaign, request, req)?;
        self.leader_key_out(&mut resp.get_mut().leader);
        Ok(resp)
    }
    async fn proclaim(
        &self,
        request: Request<ProclaimRequest>,
    ) -> Result<Response<ProclaimResponse>, Status> {
        let mut req = request.get_ref().clone();
        self.leader_key_in(&mut req.leader);
        unary!(self, ElectionClient, proclaim, request, req)
    }
    async fn leader(
        &self,
        request: Request<LeaderRequest>,
    ) -> Result<Response<LeaderResponse>, Status> {
        let mut req = request.get_ref().clone();
        req.name = self.ns.key(&req.name);
        let mut resp = unary!(self, ElectionClient, leader, request, req)?;
        if let Some(kv) = resp.get_mut().kv.as_mut() {
            self.ns.strip_kv(kv);
        }
        Ok(resp)
    }
    type ObserveStream = BoxStream<LeaderResponse>;
    async fn observe(
        &self,
        request: Request<LeaderRequest>,
    ) -> Result<Response<Self::ObserveStream>, Status> {
        let mut req = request.get_ref().clone();
        req.name = self.ns.key(&req.name);
        let stream = unary!(self, ElectionClient, observe, request, req)?.into_inner();
        let ns = self.ns.clone();
        let stream = stream.map(move |item| {
            item.map(|mut resp| {
                if let Some(kv) = resp.kv.as_mut() {
                    ns.strip_kv(kv);
                }
                resp
            })
        });
        Ok(Response::new(Box::pin(stream)))
    }
    async fn resign(
        &self,
        request: Request<ResignRequest>,
    ) -> Result<Response<ResignResponse>, Status> {
        let mut req = request.get_ref().clone();
        self.leader_key_in(&mut req.leader);
        unary!(self, ElectionClient, resign, request, req)
    }
}
