//! The Lock service (etcd `server/etcdserver/api/v3lock`, with the mutex recipe of
//! `clientv3/concurrency/mutex.go` run inside the server).
//!
//! A lock named `name` is the set of keys under `name/`: each contender puts
//! `name/<lease in hex>` with its lease, and the key with the lowest create revision holds the
//! lock. A waiter watches the deletion of the next-older contender only (no thundering herd);
//! a holder loses the lock when its key is deleted, by Unlock or by its lease expiring.
//!
//! Every wait is a future of the RPC: when the client goes away the future is dropped, its
//! watcher leaves the [`WatchHub`](etcdrs_mvcc::WatchHub) and, as etcd does on a canceled
//! context, the waiter's key is deleted (a [`CleanupOnDrop`] issues that one delete).
//!
//! The helpers here (waiting for deletes, the one-key watcher, key naming) are shared with
//! [`election`](super::election), which runs the same recipe.

use etcdrs_mvcc::{Filters, HubMsg, StreamId, WatchRange};
use etcdrs_proto::etcdserverpb::compare::{CompareResult, CompareTarget, TargetUnion};
use etcdrs_proto::etcdserverpb::kv_server::Kv;
use etcdrs_proto::etcdserverpb::lease_server::Lease;
use etcdrs_proto::etcdserverpb::range_request::{SortOrder, SortTarget};
use etcdrs_proto::etcdserverpb::request_op::Request as OpRequest;
use etcdrs_proto::etcdserverpb::response_op::Response as OpResponse;
use etcdrs_proto::etcdserverpb::{
    Compare, DeleteRangeRequest, LeaseGrantRequest, PutRequest, RangeRequest, RangeResponse,
    RequestOp, ResponseHeader, TxnRequest, TxnResponse,
};
use etcdrs_proto::keys::prefix_end;
use etcdrs_proto::mvccpb::{Event, KeyValue};
use etcdrs_proto::rpctypes;
use etcdrs_proto::v3lockpb::lock_server::Lock;
use etcdrs_proto::v3lockpb::{LockRequest, LockResponse, UnlockRequest, UnlockResponse};
use tokio::sync::mpsc;
use tonic::{Request, Response, Status};

use super::Rpc;
use crate::EtcdServer;

/// TTL of the lease etcd's session grants when a request names no lease (`defaultSessionTTL`).
const DEFAULT_SESSION_TTL: i64 = 60;
/// Capacity of a one-key watcher's channel; a full channel only makes the watcher catch up
/// from history, so a small bound is enough.
const WATCHER_CHANNEL: usize = 16;

/// `prefix` followed by the lease id as Go's `%x` prints an `int64` (lower-case hex, a minus
/// sign for negative ids).
pub(super) fn contender_key(prefix: &[u8], lease: i64) -> Vec<u8> {
    let hex = if lease < 0 {
        format!("-{:x}", lease.unsigned_abs())
    } else {
        format!("{lease:x}")
    };
    let mut key = prefix.to_vec();
    key.extend_from_slice(hex.as_bytes());
    key
}

/// `name/`: the prefix under which the contenders for `name` live.
pub(super) fn contender_prefix(name: &[u8]) -> Vec<u8> {
    let mut prefix = name.to_vec();
    prefix.push(b'/');
    prefix
}

/// The contender's lease: `lease`, or a fresh lease with etcd's default session TTL when the
/// request names none (etcd's `concurrency.NewSession` grants one in that case).
pub(super) async fn session_lease(rpc: &Rpc, lease: i64) -> Result<i64, Status> {
    if lease != 0 {
        return Ok(lease);
    }
    let req = LeaseGrantRequest {
        ttl: DEFAULT_SESSION_TTL,
        id: 0,
    };
    let resp = <Rpc as Lease>::lease_grant(rpc, Request::new(req))
        .await
        .map_err(client_error)?;
    Ok(resp.into_inner().id)
}

/// A linearizable range over the contenders under `prefix`, ordered by create revision
/// (`ascending`: the oldest first), at most one, with create revision at most
/// `max_create_revision` (0: no bound).
pub(super) async fn range_by_create(
    rpc: &Rpc,
    prefix: &[u8],
    ascending: bool,
    max_create_revision: i64,
) -> Result<RangeResponse, Status> {
    let req = by_create_request(prefix, ascending, max_create_revision);
    let resp = <Rpc as Kv>::range(rpc, Request::new(req))
        .await
        .map_err(client_error)?;
    Ok(resp.into_inner())
}

fn by_create_request(prefix: &[u8], ascending: bool, max_create_revision: i64) -> RangeRequest {
    let sort_order = if ascending {
        SortOrder::Ascend
    } else {
        SortOrder::Descend
    };
    RangeRequest {
        key: prefix.to_vec(),
        range_end: prefix_end(prefix),
        limit: 1,
        sort_order: sort_order as i32,
        sort_target: SortTarget::Create as i32,
        max_create_revision,
        ..RangeRequest::default()
    }
}

/// A compare `create_revision(key) == revision`.
pub(super) fn create_revision_is(key: &[u8], revision: i64) -> Compare {
    Compare {
        result: CompareResult::Equal as i32,
        target: CompareTarget::Create as i32,
        key: key.to_vec(),
        target_union: Some(TargetUnion::CreateRevision(revision)),
        ..Compare::default()
    }
}

pub(super) fn put_op(key: &[u8], value: &[u8], lease: i64) -> RequestOp {
    RequestOp {
        request: Some(OpRequest::RequestPut(PutRequest {
            key: key.to_vec(),
            value: bytes::Bytes::copy_from_slice(value),
            lease,
            ..PutRequest::default()
        })),
    }
}

pub(super) fn delete_op(key: &[u8]) -> RequestOp {
    RequestOp {
        request: Some(OpRequest::RequestDeleteRange(DeleteRangeRequest {
            key: key.to_vec(),
            ..DeleteRangeRequest::default()
        })),
    }
}

pub(super) fn range_op(req: RangeRequest) -> RequestOp {
    RequestOp {
        request: Some(OpRequest::RequestRange(req)),
    }
}

pub(super) async fn txn(rpc: &Rpc, req: TxnRequest) -> Result<TxnResponse, Status> {
    match <Rpc as Kv>::txn(rpc, Request::new(req)).await {
        Ok(resp) => Ok(resp.into_inner()),
        Err(status) => Err(client_error(status)),
    }
}

/// An error of a KV, Lease or Watch call as etcd's lock and election services return it.
///
/// etcd runs these services over its Go client, which turns every error of its error table into
/// a plain error with the same text; gRPC then sends that with code Unknown. Other statuses
/// pass through unchanged.
pub(super) fn client_error(status: Status) -> Status {
    match rpctypes::from_status(&status) {
        Some(known) => Status::unknown(known.message),
        None => status,
    }
}

/// The kvs of the `index`-th response of a txn, which must be a range.
pub(super) fn range_kvs(resp: &TxnResponse, index: usize) -> &[KeyValue] {
    match resp.responses.get(index).and_then(|r| r.response.as_ref()) {
        Some(OpResponse::ResponseRange(range)) => &range.kvs,
        _ => &[],
    }
}

/// Watches a range through the server's [`WatchHub`](etcdrs_mvcc::WatchHub) for as long as it
/// lives: dropping it removes the watcher.
pub(super) struct KeyWatcher {
    server: EtcdServer,
    stream: StreamId,
    rx: mpsc::Receiver<HubMsg>,
}

impl KeyWatcher {
    /// Events on `range` from revision `start_rev` on; `deletes_only` drops puts.
    pub(super) fn new(
        server: &EtcdServer,
        range: WatchRange,
        start_rev: i64,
        deletes_only: bool,
    ) -> Self {
        let (tx, rx) = mpsc::channel(WATCHER_CHANNEL);
        let hub = server.watch_hub();
        let stream = hub.new_stream();
        let filters = Filters {
            no_put: deletes_only,
            no_delete: false,
        };
        if !hub.watch(stream, 0, range, filters, start_rev, tx) {
            server.wake_watch_sync();
        }
        KeyWatcher {
            server: server.clone(),
            stream,
            rx,
        }
    }

    /// The next batch of events and the revision it brings the watcher to.
    pub(super) async fn next(&mut self) -> Result<(Vec<Event>, i64), Status> {
        match self.rx.recv().await {
            Some(HubMsg::Events {
                events, revision, ..
            }) => Ok((events.iter().map(|e| e.event().clone()).collect(), revision)),
            Some(HubMsg::Compacted { .. }) => Err(client_error(rpctypes::COMPACTED.to_status())),
            // The hub dropped the watcher: the server is stopping.
            None => Err(client_error(rpctypes::STOPPED.to_status())),
        }
    }
}

impl Drop for KeyWatcher {
    fn drop(&mut self) {
        self.server.watch_hub().close_stream(self.stream);
    }
}

/// Waits until no key under `prefix` has a create revision at most `max_create_rev`, one
/// deletion at a time, newest first (etcd's `waitDeletes`). Returns the header of the read
/// that found none left.
pub(super) async fn wait_deletes(
    rpc: &Rpc,
    prefix: &[u8],
    max_create_rev: i64,
) -> Result<Option<ResponseHeader>, Status> {
    loop {
        let resp = range_by_create(rpc, prefix, false, max_create_rev).await?;
        let Some(last) = resp.kvs.first() else {
            return Ok(resp.header);
        };
        let from = resp.header.as_ref().map_or(0, |h| h.revision);
        let range = WatchRange {
            key: last.key.clone(),
            end: Vec::new(),
        };
        // Only deletes pass the filter, so any event means the key is gone.
        let mut watcher = KeyWatcher::new(&rpc.server, range, from, true);
        while watcher.next().await?.0.is_empty() {}
    }
}

/// Runs a txn once when dropped while armed: undoes a contender's key if the RPC that made it
/// is canceled while waiting, as etcd does with the canceled request's context.
///
/// The txn is one proposal, so the task it spawns ends as soon as that proposal is applied (or
/// fails); it is not tied to the request because the request is gone.
pub(super) struct CleanupOnDrop {
    armed: Option<(Rpc, TxnRequest)>,
}

impl CleanupOnDrop {
    pub(super) fn new(rpc: &Rpc, req: TxnRequest) -> Self {
        CleanupOnDrop {
            armed: Some((rpc.clone(), req)),
        }
    }

    /// The wait ended normally: nothing to undo.
    pub(super) fn disarm(mut self) {
        self.armed = None;
    }
}

impl Drop for CleanupOnDrop {
    fn drop(&mut self) {
        let Some((rpc, req)) = self.armed.take() else {
            return;
        };
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        runtime.spawn(async move {
            if let Err(status) = txn(&rpc, req).await {
                tracing::warn!(%status, "failed to remove a canceled lock or election key");
            }
        });
    }
}

#[tonic::async_trait]
impl Lock for Rpc {
    async fn lock(&self, request: Request<LockRequest>) -> Result<Response<LockResponse>, Status> {
        // The KV, lease and watch calls below act with the caller's credentials.
        let caller = self.as_caller(&request);
        let req = request.into_inner();
        let lease = session_lease(&caller, req.lease).await?;
        let prefix = contender_prefix(&req.name);
        let key = contender_key(&prefix, lease);
        // Join the waiters unless this lease already did (then reuse its key), and read the
        // holder in the same txn so that the uncontended path takes one round trip.
        let owner = range_op(by_create_request(&prefix, true, 0));
        let resp = txn(
            &caller,
            TxnRequest {
                compare: vec![create_revision_is(&key, 0)],
                success: vec![put_op(&key, &[], lease), owner.clone()],
                failure: vec![
                    range_op(RangeRequest {
                        key: key.clone(),
                        ..RangeRequest::default()
                    }),
                    owner,
                ],
            },
        )
        .await?;
        let my_rev = if resp.succeeded {
            resp.header.as_ref().map_or(0, |h| h.revision)
        } else {
            range_kvs(&resp, 0)
                .first()
                .map_or(0, |kv| kv.create_revision)
        };
        let holds = range_kvs(&resp, 1)
            .first()
            .is_none_or(|holder| holder.create_revision == my_rev);
        if holds {
            return Ok(Response::new(LockResponse {
                header: resp.header,
                key,
            }));
        }
        let unlock = CleanupOnDrop::new(
            &caller,
            TxnRequest {
                success: vec![delete_op(&key)],
                ..TxnRequest::default()
            },
        );
        // On an error, as when the request is canceled, dropping `unlock` deletes the key
        // (etcd unlocks when the wait fails).
        let header = wait_deletes(&caller, &prefix, my_rev - 1).await?;
        unlock.disarm();
        Ok(Response::new(LockResponse { header, key }))
    }

    async fn unlock(
        &self,
        request: Request<UnlockRequest>,
    ) -> Result<Response<UnlockResponse>, Status> {
        // The KV, lease and watch calls below act with the caller's credentials.
        let caller = self.as_caller(&request);
        let req = request.into_inner();
        let delete = DeleteRangeRequest {
            key: req.key,
            ..DeleteRangeRequest::default()
        };
        let resp = <Rpc as Kv>::delete_range(&caller, Request::new(delete))
            .await
            .map_err(client_error)?;
        Ok(Response::new(UnlockResponse {
            header: resp.into_inner().header,
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_are_named_as_etcd_names_them() {
        assert_eq!(
            contender_key(b"l/", 0x694d_77aa_9e38_260f),
            b"l/694d77aa9e38260f"
        );
        assert_eq!(contender_key(b"l/", 0x1f), b"l/1f");
        assert_eq!(contender_key(b"l/", -2), b"l/-2");
        assert_eq!(contender_prefix(b"my"), b"my/");
    }
}
