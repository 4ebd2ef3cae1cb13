//! The Lease service (etcd `api/v3rpc/lease.go` over `etcdserver/v3_server.go`).
//!
//! Grants and revocations go through raft. Keep-alives, time-to-live queries and the lease
//! list are answered by the lessor, which only the leader's is primary for (see
//! `etcdrs_mvcc::lease`): the core's lease requests (`etcd_server::lease`) answer them on the
//! leader and forward them there from a follower.
//!
//! Answers etcd gives that clients depend on:
//! - KeepAlive of a lease that does not exist answers TTL 0 (the stream stays open); one that
//!   expired but is not yet revoked is answered only once its revocation is applied, with TTL 0.
//! - TimeToLive of a lease that does not exist answers TTL -1, granted TTL 0, not an error.
//! - TTLs left are whole seconds truncated, as etcd's `int64(Remaining().Seconds())`.

use std::pin::Pin;

use etcdrs_mvcc::lease::MAX_LEASE_TTL;
use etcdrs_proto::etcdserverpb::lease_server::Lease;
use etcdrs_proto::etcdserverpb::{
    LeaseGrantRequest, LeaseGrantResponse, LeaseKeepAliveRequest, LeaseKeepAliveResponse,
    LeaseLeasesRequest, LeaseLeasesResponse, LeaseRevokeRequest, LeaseRevokeResponse, LeaseStatus,
    LeaseTimeToLiveRequest, LeaseTimeToLiveResponse,
};
use etcdrs_proto::rpctypes;
use futures::{Stream, StreamExt};
use tonic::{Request, Response, Status, Streaming};

use super::Rpc;
use crate::error::ServerError;

type KeepAliveStream = Pin<Box<dyn Stream<Item = Result<LeaseKeepAliveResponse, Status>> + Send>>;

/// etcd's lease quota cost (`leaseOverhead`): a grant is refused once the backend is this close
/// to its quota.
const LEASE_OVERHEAD: u64 = 64;

#[tonic::async_trait]
impl Lease for Rpc {
    async fn lease_grant(
        &self,
        request: Request<LeaseGrantRequest>,
    ) -> Result<Response<LeaseGrantResponse>, Status> {
        self.server.check_not_learner()?;
        let mut req = request.into_inner();
        // etcd checks the quota first (its quota server wraps the lease server), then the TTL.
        self.server.check_quota(LEASE_OVERHEAD).await?;
        if req.ttl > MAX_LEASE_TTL {
            return Err(ServerError::Etcd(&rpctypes::LEASE_TTL_TOO_LARGE).into());
        }
        if req.id == 0 {
            req.id = self.server.new_lease_id();
        }
        let mut resp = self.server.request(req, None).await?;
        self.server.fill_header(&mut resp.header);
        Ok(Response::new(resp))
    }

    async fn lease_revoke(
        &self,
        request: Request<LeaseRevokeRequest>,
    ) -> Result<Response<LeaseRevokeResponse>, Status> {
        self.server.check_not_learner()?;
        let auth = self.auth_info(&request)?;
        let req = request.into_inner();
        let mut resp = self.server.request(req, auth.as_ref()).await?;
        self.server.fill_header(&mut resp.header);
        Ok(Response::new(resp))
    }

    type LeaseKeepAliveStream = KeepAliveStream;

    async fn lease_keep_alive(
        &self,
        request: Request<Streaming<LeaseKeepAliveRequest>>,
    ) -> Result<Response<Self::LeaseKeepAliveStream>, Status> {
        self.server.check_not_learner()?;
        let server = self.server.clone();
        // One request at a time, in order, as etcd's receive loop; an error ends the stream.
        let stream = request.into_inner().then(move |req| {
            let server = server.clone();
            async move {
                let req = req
                    .inspect_err(|status| {
                        crate::metrics::stream_receive_failed("lease-keepalive", status);
                    })
                    .map_err(etcdrs_serve::grpc_size::grpc_go_status)?;
                // The header is taken before renewing, as etcd does, so its revision is never
                // newer than the renewal: a client cannot see a lease revoked at revision r
                // renewed at a later one.
                let header = Some(server.header(0));
                let ttl = server.lease_renew_anywhere(req.id).await?;
                Ok(LeaseKeepAliveResponse {
                    header,
                    id: req.id,
                    ttl,
                })
            }
        });
        Ok(Response::new(Box::pin(stream)))
    }

    async fn lease_time_to_live(
        &self,
        request: Request<LeaseTimeToLiveRequest>,
    ) -> Result<Response<LeaseTimeToLiveResponse>, Status> {
        self.server.check_not_learner()?;
        // etcd 3.5.9's fix of CVE-2023-32082: the caller must be able to read every key the
        // lease holds.
        let info = self.auth_info(&request)?;
        if info.is_some() {
            let keys = self
                .server
                .store()
                .lessor()
                .get(request.get_ref().id)
                .map(|l| l.keys)
                .unwrap_or_default();
            for key in &keys {
                self.server
                    .auth()
                    .check_range(info.as_ref(), key, &[], false)?;
            }
        }
        let req = request.into_inner();
        Ok(Response::new(self.server.lease_time_to_live(req).await?))
    }

    async fn lease_leases(
        &self,
        _request: Request<LeaseLeasesRequest>,
    ) -> Result<Response<LeaseLeasesResponse>, Status> {
        self.server.check_not_learner()?;
        let leases = self
            .server
            .store()
            .lessor()
            .ids_by_expiry()
            .into_iter()
            .map(|id| LeaseStatus { id })
            .collect();
        Ok(Response::new(LeaseLeasesResponse {
            header: Some(self.server.header(0)),
            leases,
        }))
    }
}
