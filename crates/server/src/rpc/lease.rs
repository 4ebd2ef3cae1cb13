//! The Lease service (etcd `api/v3rpc/lease.go` over `etcdserver/v3_server.go`).
//!
//! Grants and revocations go through raft. Keep-alives, time-to-live queries and the lease
//! list are answered by this member's lessor, which only the leader's is primary for (see
//! `etcdrs_mvcc::lease`). etcd answers these on the leader and forwards them there from a
//! follower; a cluster of one is always its own leader, so a request that finds the lessor not
//! yet primary (the member has not yet applied an entry of its term) waits for its promotion,
//! bounded by the request timeout. FIXME: forward to the leader once members have peers.
//!
//! Answers etcd gives that clients depend on:
//! - KeepAlive of a lease that does not exist answers TTL 0 (the stream stays open); one that
//!   expired but is not yet revoked is answered only once its revocation is applied, with TTL 0.
//! - TimeToLive of a lease that does not exist answers TTL -1, granted TTL 0, not an error.
//! - TTLs left are whole seconds truncated, as etcd's `int64(Remaining().Seconds())`.

use std::pin::Pin;
use std::time::{Duration, Instant};

use etcdrs_mvcc::lease::{Lease as LeaseState, LeaseId, MAX_LEASE_TTL, Renewal};
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
use crate::EtcdServer;
use crate::error::ServerError;

type KeepAliveStream = Pin<Box<dyn Stream<Item = Result<LeaseKeepAliveResponse, Status>> + Send>>;

/// etcd's lease quota cost (`leaseOverhead`): a grant is refused once the backend is this close
/// to its quota.
const LEASE_OVERHEAD: u64 = 64;

/// etcd's `ReqTimeout()`: how long a lease request may wait for this member's lessor.
fn request_timeout(server: &EtcdServer) -> Duration {
    Duration::from_secs(5) + 2 * server.config().election_timeout
}

/// Waits for the next change of the lessor's state (a lease removed, a promotion or demotion),
/// failing with etcd's timeout error at `deadline`.
async fn wait_change(
    changes: &mut tokio::sync::watch::Receiver<u64>,
    deadline: Instant,
) -> Result<(), ServerError> {
    match tokio::time::timeout_at(deadline.into(), changes.changed()).await {
        Ok(Ok(())) => Ok(()),
        Ok(Err(_)) => Err(ServerError::Stopped),
        Err(_) => Err(ServerError::Etcd(&rpctypes::TIMEOUT)),
    }
}

/// etcd's `LeaseRenew` on the leader: the lease's TTL once renewed, or 0 when it does not exist
/// (never granted, revoked, or revoked after expiring while we waited).
pub(crate) async fn renew(server: &EtcdServer, id: LeaseId) -> Result<i64, ServerError> {
    let lessor = server.store().lessor();
    let deadline = Instant::now() + request_timeout(server);
    loop {
        // Subscribed before the check: a revocation between the two is not missed.
        let mut changes = lessor.subscribe();
        let checkpointed = lessor.get(id).is_some_and(|lease| lease.remaining_ttl > 0);
        match lessor.renew(id, server.store().now()) {
            Renewal::Renewed(ttl) => {
                if checkpointed && server.config().lease_checkpoint {
                    // As etcd 3.5: the members' checkpointed remainder is cleared too, or a
                    // new leader would restart the renewed lease from it.
                    server.clear_lease_checkpoint(id).await;
                }
                return Ok(ttl);
            }
            Renewal::NotFound => return Ok(0),
            Renewal::Expired | Renewal::NotPrimary => wait_change(&mut changes, deadline).await?,
        }
    }
}

/// Renew a lease wherever the keep-alive arrived: on the leader directly, on a follower by
/// forwarding to the leader (etcd's `LeaseRenew` through the leader's peer URL).
async fn renew_on_leader(server: &EtcdServer, id: LeaseId) -> Result<i64, ServerError> {
    let deadline = Instant::now() + request_timeout(server);
    loop {
        let status = server.raft_status();
        if status.is_leader {
            return renew(server, id).await;
        }
        if status.leader != 0 {
            let timeout = deadline.saturating_duration_since(Instant::now());
            let renewed =
                crate::peer::calls::renew_lease(server.transport(), status.leader, id, timeout);
            if let Some(ttl) = renewed.await {
                return Ok(ttl);
            }
        }
        if Instant::now() >= deadline {
            return Err(ServerError::Etcd(&rpctypes::TIMEOUT));
        }
        tokio::time::sleep(server.config().heartbeat_interval).await;
    }
}

/// TimeToLive answered by this member's lessor (it must be the primary one).
pub(crate) async fn time_to_live_local(
    server: &EtcdServer,
    req: LeaseTimeToLiveRequest,
) -> Result<LeaseTimeToLiveResponse, ServerError> {
    let lease = lookup(server, req.id).await?;
    let header = Some(server.header(0));
    let Some(lease) = lease else {
        return Ok(LeaseTimeToLiveResponse {
            header,
            id: req.id,
            ttl: -1,
            granted_ttl: 0,
            keys: Vec::new(),
        });
    };
    Ok(LeaseTimeToLiveResponse {
        header,
        id: req.id,
        ttl: lease.remaining(server.store().now()),
        granted_ttl: lease.ttl,
        keys: if req.keys {
            lease.keys.into_iter().collect()
        } else {
            Vec::new()
        },
    })
}

/// The lease as the primary lessor sees it (None if it does not exist).
async fn lookup(server: &EtcdServer, id: LeaseId) -> Result<Option<LeaseState>, ServerError> {
    let lessor = server.store().lessor();
    let deadline = Instant::now() + request_timeout(server);
    loop {
        let mut changes = lessor.subscribe();
        if lessor.is_primary() {
            return Ok(lessor.get(id));
        }
        wait_change(&mut changes, deadline).await?;
    }
}

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
                let ttl = renew_on_leader(&server, req.id).await?;
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
        let deadline = Instant::now() + request_timeout(&self.server);
        loop {
            let status = self.server.raft_status();
            if status.is_leader {
                return Ok(Response::new(time_to_live_local(&self.server, req).await?));
            }
            // etcd asks the leader's lessor: only it knows the remaining time.
            if status.leader != 0 {
                let timeout = deadline.saturating_duration_since(Instant::now());
                let asked = crate::peer::calls::lease_time_to_live(
                    self.server.transport(),
                    status.leader,
                    req,
                    timeout,
                );
                if let Some(mut resp) = asked.await {
                    resp.header = Some(self.server.header(0));
                    return Ok(Response::new(resp));
                }
            }
            if Instant::now() >= deadline {
                return Err(ServerError::Etcd(&rpctypes::TIMEOUT).into());
            }
            tokio::time::sleep(self.server.config().heartbeat_interval).await;
        }
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
