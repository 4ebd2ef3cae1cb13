//! The Lease service (etcd `api/v3rpc/lease.go`). Grants and revocations go through raft;
//! keep-alives and TTL queries are answered by this member's lessor.

use std::pin::Pin;
use std::time::Instant;

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
use crate::etcd_server::ApplyOutput;
use crate::request::Op;

type KeepAliveStream = Pin<Box<dyn Stream<Item = Result<LeaseKeepAliveResponse, Status>> + Send>>;

#[tonic::async_trait]
impl Lease for Rpc {
    async fn lease_grant(
        &self,
        request: Request<LeaseGrantRequest>,
    ) -> Result<Response<LeaseGrantResponse>, Status> {
        let mut req = request.into_inner();
        if req.ttl > MAX_LEASE_TTL {
            return Err(rpctypes::LEASE_TTL_TOO_LARGE.to_status());
        }
        if req.id == 0 {
            req.id = self.server.new_lease_id();
        }
        self.server.check_quota(0).await?;
        match self.server.propose(Op::LeaseGrant(req)).await? {
            ApplyOutput::LeaseGrant(mut resp) => {
                self.server.fill_header(&mut resp.header);
                Ok(Response::new(resp))
            }
            _ => Err(Status::internal("etcdserver: unexpected apply result")),
        }
    }

    async fn lease_revoke(
        &self,
        request: Request<LeaseRevokeRequest>,
    ) -> Result<Response<LeaseRevokeResponse>, Status> {
        let req = request.into_inner();
        match self.server.propose(Op::LeaseRevoke(req)).await? {
            ApplyOutput::LeaseRevoke(mut resp) => {
                self.server.fill_header(&mut resp.header);
                Ok(Response::new(resp))
            }
            _ => Err(Status::internal("etcdserver: unexpected apply result")),
        }
    }

    type LeaseKeepAliveStream = KeepAliveStream;

    async fn lease_keep_alive(
        &self,
        request: Request<Streaming<LeaseKeepAliveRequest>>,
    ) -> Result<Response<Self::LeaseKeepAliveStream>, Status> {
        let server = self.server.clone();
        let stream = request.into_inner().map(move |req| {
            let req = req?;
            // A lease this member does not know renews to TTL 0, as etcd answers.
            let ttl = server
                .store()
                .lessor()
                .renew(req.id, Instant::now())
                .unwrap_or(0);
            Ok(LeaseKeepAliveResponse {
                header: Some(server.header(0)),
                id: req.id,
                ttl,
            })
        });
        Ok(Response::new(Box::pin(stream)))
    }

    async fn lease_time_to_live(
        &self,
        request: Request<LeaseTimeToLiveRequest>,
    ) -> Result<Response<LeaseTimeToLiveResponse>, Status> {
        let req = request.into_inner();
        let header = Some(self.server.header(0));
        let Some(lease) = self.server.store().lessor().get(req.id) else {
            return Ok(Response::new(LeaseTimeToLiveResponse {
                header,
                id: req.id,
                ttl: -1,
                granted_ttl: 0,
                keys: Vec::new(),
            }));
        };
        Ok(Response::new(LeaseTimeToLiveResponse {
            header,
            id: req.id,
            ttl: lease.remaining(Instant::now()),
            granted_ttl: lease.ttl,
            keys: if req.keys {
                lease.keys.into_iter().collect()
            } else {
                Vec::new()
            },
        }))
    }

    async fn lease_leases(
        &self,
        _request: Request<LeaseLeasesRequest>,
    ) -> Result<Response<LeaseLeasesResponse>, Status> {
        let leases = self
            .server
            .store()
            .lessor()
            .ids()
            .into_iter()
            .map(|id| LeaseStatus { id })
            .collect();
        Ok(Response::new(LeaseLeasesResponse {
            header: Some(self.server.header(0)),
            leases,
        }))
    }
}
