//! The Election service (etcd `server/etcdserver/api/v3election`, with the election recipe of
//! `clientv3/concurrency/election.go` run inside the server).
//!
//! An election named `name` is the lock recipe of [`lock`](super::lock) with a value: each
//! candidate puts `name/<lease in hex>` holding its value, and the key with the lowest create
//! revision is the leader. A leader is identified by a [`LeaderKey`] (its key and that key's
//! create revision), so Proclaim and Resign act only while that very key still exists.
//!
//! Observe follows the leader with the server's watch machinery: it reads the current leader
//! (or waits for the first candidate), streams every value the leader proclaims, and starts over
//! when the leader's key is deleted. The stream owns its watchers, so a client going away
//! (dropping the stream) leaves nothing behind.

use std::collections::VecDeque;
use std::pin::Pin;

use etcdrs_mvcc::WatchRange;
use etcdrs_proto::etcdserverpb::{RangeRequest, ResponseHeader, TxnRequest};
use etcdrs_proto::mvccpb::{KeyValue, event::EventType};
use etcdrs_proto::v3electionpb::election_server::Election;
use etcdrs_proto::v3electionpb::{
    CampaignRequest, CampaignResponse, LeaderKey, LeaderRequest, LeaderResponse, ProclaimRequest,
    ProclaimResponse, ResignRequest, ResignResponse,
};
use futures::Stream;
use tonic::{Request, Response, Status};

use super::Rpc;
use super::lock::{
    CleanupOnDrop, KeyWatcher, contender_key, contender_prefix, create_revision_is, delete_op,
    put_op, range_by_create, range_kvs, range_op, session_lease, txn, wait_deletes,
};

type ObserveStream = Pin<Box<dyn Stream<Item = Result<LeaderResponse, Status>> + Send>>;

// These three are errors of etcd's client library, which etcd's election server runs; gRPC
// turns such plain Go errors into code Unknown with the error text, and clients match the text.

/// etcd's `concurrency.ErrElectionNotLeader`.
fn not_leader() -> Status {
    Status::unknown("election: not leader")
}

/// etcd's `concurrency.ErrElectionNoLeader`.
fn no_leader() -> Status {
    Status::unknown("election: no leader")
}

/// etcd's `v3election.ErrMissingLeaderKey`.
fn missing_leader_key() -> Status {
    Status::unknown("\"leader\" field must be provided")
}

/// Puts `value` on the leader key if it is still the key created at `rev` (etcd's `Proclaim`).
/// Returns the txn's header.
async fn proclaim(
    rpc: &Rpc,
    key: &[u8],
    rev: i64,
    lease: i64,
    value: &[u8],
) -> Result<Option<ResponseHeader>, Status> {
    let resp = txn(
        rpc,
        TxnRequest {
            compare: vec![create_revision_is(key, rev)],
            success: vec![put_op(key, value, lease)],
            failure: Vec::new(),
        },
    )
    .await?;
    if !resp.succeeded {
        return Err(not_leader());
    }
    Ok(resp.header)
}

/// Deletes the leader key if it is still the key created at `rev` (etcd's `Resign`).
fn resign_txn(key: &[u8], rev: i64) -> TxnRequest {
    TxnRequest {
        compare: vec![create_revision_is(key, rev)],
        success: vec![delete_op(key)],
        failure: Vec::new(),
    }
}

/// Where an Observe stream is.
enum ObservePhase {
    /// Read the leader, or wait for the first candidate if there is none.
    FindLeader,
    /// Stream the leader's proclamations until its key is deleted.
    FollowLeader(KeyWatcher),
}

struct ObserveState {
    rpc: Rpc,
    prefix: Vec<u8>,
    phase: ObservePhase,
    outbox: VecDeque<LeaderResponse>,
}

impl ObserveState {
    /// The next response, or `None` when the stream ends (etcd ends it on any error).
    async fn next_response(&mut self) -> Option<LeaderResponse> {
        loop {
            if let Some(resp) = self.outbox.pop_front() {
                return Some(resp);
            }
            let step = match &mut self.phase {
                ObservePhase::FindLeader => self.find_leader().await,
                ObservePhase::FollowLeader(watcher) => follow(watcher, &self.rpc, &mut self.outbox)
                    .await
                    .map(|deleted| deleted.then_some(ObservePhase::FindLeader)),
            };
            match step {
                Ok(Some(next)) => self.phase = next,
                Ok(None) => {}
                Err(_) => return None,
            }
        }
    }

    /// Queues the current leader and starts following it.
    async fn find_leader(&mut self) -> Result<Option<ObservePhase>, Status> {
        let resp = range_by_create(&self.rpc, &self.prefix, true, 0).await?;
        let (header, kv) = match resp.kvs.into_iter().next() {
            Some(kv) => (resp.header, kv),
            None => {
                let from = resp.header.as_ref().map_or(0, |h| h.revision);
                self.first_candidate(from).await?
            }
        };
        let revision = header.as_ref().map_or(0, |h| h.revision);
        let range = WatchRange {
            key: kv.key.clone(),
            end: Vec::new(),
        };
        let watcher = KeyWatcher::new(&self.rpc.server, range, revision + 1, false);
        self.outbox.push_back(LeaderResponse {
            header,
            kv: Some(kv),
        });
        Ok(Some(ObservePhase::FollowLeader(watcher)))
    }

    /// Waits for the first put under the prefix from revision `from` on; the header carries
    /// that put's revision.
    async fn first_candidate(
        &mut self,
        from: i64,
    ) -> Result<(Option<ResponseHeader>, KeyValue), Status> {
        let range = WatchRange {
            end: etcdrs_proto::keys::prefix_end(&self.prefix),
            key: self.prefix.clone(),
        };
        let mut watcher = KeyWatcher::new(&self.rpc.server, range, from, false);
        loop {
            let (events, _) = watcher.next().await?;
            let put = events
                .into_iter()
                .find(|event| event.r#type == EventType::Put as i32)
                .and_then(|event| event.kv);
            if let Some(kv) = put {
                return Ok((Some(self.rpc.server.header(kv.mod_revision)), kv));
            }
        }
    }
}

/// Queues the leader's new values from the next batch of events; returns whether its key was
/// deleted (events after the delete are dropped, as etcd does).
async fn follow(
    watcher: &mut KeyWatcher,
    rpc: &Rpc,
    outbox: &mut VecDeque<LeaderResponse>,
) -> Result<bool, Status> {
    let (events, revision) = watcher.next().await?;
    for event in events {
        if event.r#type == EventType::Delete as i32 {
            return Ok(true);
        }
        outbox.push_back(LeaderResponse {
            header: Some(rpc.server.header(revision)),
            kv: event.kv,
        });
    }
    Ok(false)
}

#[tonic::async_trait]
impl Election for Rpc {
    type ObserveStream = ObserveStream;

    async fn campaign(
        &self,
        request: Request<CampaignRequest>,
    ) -> Result<Response<CampaignResponse>, Status> {
        // The KV, lease and watch calls below act with the caller's credentials.
        let caller = self.as_caller(&request);
        let req = request.into_inner();
        let lease = session_lease(&caller, req.lease).await?;
        let prefix = contender_prefix(&req.name);
        let key = contender_key(&prefix, lease);
        let resp = txn(
            &caller,
            TxnRequest {
                compare: vec![create_revision_is(&key, 0)],
                success: vec![put_op(&key, &req.value, lease)],
                failure: vec![range_op(RangeRequest {
                    key: key.clone(),
                    ..RangeRequest::default()
                })],
            },
        )
        .await?;
        let mut rev = resp.header.as_ref().map_or(0, |h| h.revision);
        if !resp.succeeded {
            // This lease is already a candidate: keep its place and update its value.
            let (create_revision, value) = range_kvs(&resp, 0)
                .first()
                .map_or((0, Vec::new()), |kv| (kv.create_revision, kv.value.clone()));
            rev = create_revision;
            if value != req.value
                && let Err(status) = proclaim(&caller, &key, rev, lease, &req.value).await
            {
                let _ = txn(&caller, resign_txn(&key, rev)).await;
                return Err(status);
            }
        }
        // Canceled while waiting: resign, as etcd does. Another error leaves the key.
        let resign = CleanupOnDrop::new(&caller, resign_txn(&key, rev));
        let waited = wait_deletes(&caller, &prefix, rev - 1).await;
        resign.disarm();
        waited?;
        Ok(Response::new(CampaignResponse {
            header: resp.header,
            leader: Some(LeaderKey {
                name: req.name,
                key,
                rev,
                lease,
            }),
        }))
    }

    async fn proclaim(
        &self,
        request: Request<ProclaimRequest>,
    ) -> Result<Response<ProclaimResponse>, Status> {
        // The KV, lease and watch calls below act with the caller's credentials.
        let caller = self.as_caller(&request);
        let req = request.into_inner();
        let leader = req.leader.ok_or_else(missing_leader_key)?;
        let lease = session_lease(&caller, leader.lease).await?;
        let header = proclaim(&caller, &leader.key, leader.rev, lease, &req.value).await?;
        Ok(Response::new(ProclaimResponse { header }))
    }

    async fn leader(
        &self,
        request: Request<LeaderRequest>,
    ) -> Result<Response<LeaderResponse>, Status> {
        // The KV, lease and watch calls below act with the caller's credentials.
        let caller = self.as_caller(&request);
        let req = request.into_inner();
        let prefix = contender_prefix(&req.name);
        let resp = range_by_create(&caller, &prefix, true, 0).await?;
        let kv = resp.kvs.into_iter().next().ok_or_else(no_leader)?;
        Ok(Response::new(LeaderResponse {
            header: resp.header,
            kv: Some(kv),
        }))
    }

    async fn observe(
        &self,
        request: Request<LeaderRequest>,
    ) -> Result<Response<Self::ObserveStream>, Status> {
        // The KV, lease and watch calls below act with the caller's credentials.
        let caller = self.as_caller(&request);
        let req = request.into_inner();
        let state = ObserveState {
            rpc: caller.clone(),
            prefix: contender_prefix(&req.name),
            phase: ObservePhase::FindLeader,
            outbox: VecDeque::new(),
        };
        let stream = futures::stream::unfold(state, |mut state| async move {
            let resp = state.next_response().await?;
            Some((Ok(resp), state))
        });
        Ok(Response::new(Box::pin(stream)))
    }

    async fn resign(
        &self,
        request: Request<ResignRequest>,
    ) -> Result<Response<ResignResponse>, Status> {
        // The KV, lease and watch calls below act with the caller's credentials.
        let caller = self.as_caller(&request);
        let req = request.into_inner();
        let leader = req.leader.ok_or_else(missing_leader_key)?;
        let resp = txn(&caller, resign_txn(&leader.key, leader.rev)).await?;
        Ok(Response::new(ResignResponse {
            header: resp.header,
        }))
    }
}
