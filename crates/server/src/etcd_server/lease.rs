//! Lease requests answered by the lessor (etcd `etcdserver/v3_server.go`'s `LeaseRenew` and
//! `LeaseTimeToLive`): on the leader by its lessor, from a follower by asking the leader over
//! the peer port (`peer::calls`). The Lease service (`rpc::lease`) and the peer handlers
//! (`http::peer`) both come here.
//!
//! A cluster of one is always its own leader, so a request that finds the lessor not yet
//! primary (the member has not yet applied an entry of its term) waits for its promotion,
//! bounded by the request timeout. TTLs left are whole seconds truncated, as etcd's
//! `int64(Remaining().Seconds())`.

use std::time::{Duration, Instant};

use etcdrs_mvcc::lease::{Lease as LeaseState, LeaseId, Renewal};
use etcdrs_proto::etcdserverpb::{LeaseTimeToLiveRequest, LeaseTimeToLiveResponse};
use etcdrs_proto::rpctypes;

use super::EtcdServer;
use crate::error::ServerError;

impl EtcdServer {
    /// etcd's `LeaseRenew` on the leader: the lease's TTL once renewed, or 0 when it does not
    /// exist. The peer handler of a follower's forwarded renewal.
    pub(crate) async fn lease_renew(&self, id: LeaseId) -> Result<i64, ServerError> {
        renew(self, id).await
    }

    /// Renew a lease wherever the keep-alive arrived: on the leader directly, on a follower by
    /// forwarding to the leader.
    pub(crate) async fn lease_renew_anywhere(&self, id: LeaseId) -> Result<i64, ServerError> {
        renew_anywhere(self, id).await
    }

    /// TimeToLive answered by this member's lessor (it must be the primary one): the peer
    /// handler of a follower's forwarded request.
    pub(crate) async fn lease_time_to_live_local(
        &self,
        req: LeaseTimeToLiveRequest,
    ) -> Result<LeaseTimeToLiveResponse, ServerError> {
        time_to_live_local(self, req).await
    }

    /// TimeToLive as the leader's lessor answers it (only it knows the remaining time).
    pub(crate) async fn lease_time_to_live(
        &self,
        req: LeaseTimeToLiveRequest,
    ) -> Result<LeaseTimeToLiveResponse, ServerError> {
        let server = self;
        let deadline = Instant::now() + request_timeout(server);
        loop {
            let status = server.raft_status();
            if status.is_leader {
                return time_to_live_local(server, req).await;
            }
            // etcd asks the leader's lessor: only it knows the remaining time.
            if status.leader != 0 {
                let timeout = deadline.saturating_duration_since(Instant::now());
                let asked = crate::peer::calls::lease_time_to_live(
                    server.transport(),
                    status.leader,
                    req,
                    timeout,
                );
                if let Some(mut resp) = asked.await {
                    resp.header = Some(server.header(0));
                    return Ok(resp);
                }
            }
            if Instant::now() >= deadline {
                return Err(ServerError::Etcd(&rpctypes::TIMEOUT));
            }
            tokio::time::sleep(server.config().heartbeat_interval).await;
        }
    }
}

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
async fn renew(server: &EtcdServer, id: LeaseId) -> Result<i64, ServerError> {
    let lessor = server.store().lessor();
    let deadline = Instant::now() + request_timeout(server);
    loop {
        // Subscribed before the check: a revocation between the two is not missed.
        let mut changes = lessor.subscribe();
        match lessor.renew(id, server.store().now()) {
            Renewal::Renewed {
                ttl,
                clear_checkpoint,
            } => {
                if clear_checkpoint && server.config().lease_checkpoint {
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
async fn renew_anywhere(server: &EtcdServer, id: LeaseId) -> Result<i64, ServerError> {
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
async fn time_to_live_local(
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
