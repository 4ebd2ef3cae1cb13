//! The objects and requests of `bench kube`: kube-apiserver's key layout, value sizes, and
//! the guarded Txns its `storage/etcd3` store sends (create, update, delete, get), on one
//! worker's callers.

use std::time::Duration;

use anyhow::Result;
use etcdrs_proto::etcdserverpb::compare::{CompareResult, CompareTarget, TargetUnion};
use etcdrs_proto::etcdserverpb::response_op::Response;
use etcdrs_proto::etcdserverpb::{
    Compare, DeleteRangeRequest, PutRequest, RangeRequest, RangeResponse, RequestOp, TxnRequest,
    TxnResponse, request_op,
};
use prost::Message;
use rand::Rng;
use rand::rngs::SmallRng;

use super::{EVENTS, MAX_VALUE, NODES, PODS};
use crate::grpc::{Conn, KV_COMPACT, KV_RANGE, KV_TXN, LEASE_GRANT, Unary};

/// The resources the workload writes; each has its own value-size distribution.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Resource {
    Node,
    Pod,
    Event,
}

impl Resource {
    /// A value size: nodes 6-10 KiB (status with images and conditions), pods 1-10 KiB, events
    /// about 1 KiB; uniform within each range.
    pub(super) fn value_size(self, rng: &mut SmallRng) -> usize {
        match self {
            Resource::Node => rng.random_range(6 * 1024..=MAX_VALUE),
            Resource::Pod => rng.random_range(1024..=MAX_VALUE),
            Resource::Event => rng.random_range(900..=1200),
        }
    }
}

pub(super) fn node_key(i: usize) -> Vec<u8> {
    format!("{NODES}node-{i:05}").into_bytes()
}

/// Pod slot `slot` in its `generation`: every churn of a slot gives its pod a new name.
pub(super) fn pod_key(namespaces: usize, slot: usize, generation: u64) -> Vec<u8> {
    let ns = slot % namespaces;
    format!("{PODS}ns-{ns:04}/pod-{slot:06}-{generation}").into_bytes()
}

pub(super) fn event_key(namespaces: usize, n: u64) -> Vec<u8> {
    let ns = n as usize % namespaces;
    format!("{EVENTS}ns-{ns:04}/event-{n:08x}").into_bytes()
}

// --- requests --------------------------------------------------------------------------------

pub(super) fn mod_revision_is(key: &[u8], revision: i64) -> Compare {
    Compare {
        result: CompareResult::Equal as i32,
        target: CompareTarget::Mod as i32,
        key: key.to_vec(),
        range_end: Vec::new(),
        target_union: Some(TargetUnion::ModRevision(revision)),
    }
}

pub(super) fn put_op(key: &[u8], value: Vec<u8>, lease: i64) -> RequestOp {
    RequestOp {
        request: Some(request_op::Request::RequestPut(PutRequest {
            key: key.to_vec(),
            value: value.into(),
            lease,
            ..Default::default()
        })),
    }
}

pub(super) fn get_op(key: &[u8]) -> RequestOp {
    RequestOp {
        request: Some(request_op::Request::RequestRange(RangeRequest {
            key: key.to_vec(),
            ..Default::default()
        })),
    }
}

pub(super) fn delete_op(key: &[u8]) -> RequestOp {
    RequestOp {
        request: Some(request_op::Request::RequestDeleteRange(
            DeleteRangeRequest {
                key: key.to_vec(),
                ..Default::default()
            },
        )),
    }
}

/// What a guarded Txn did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Guarded {
    /// It succeeded at this revision.
    Done(i64),
    /// Its compare failed; the key's mod revision as its `Else Range` read it, `None` when the
    /// key does not exist (or, for a create, when there was no `Else`).
    Conflict(Option<i64>),
}

pub(super) fn guarded(resp: &TxnResponse) -> Guarded {
    if resp.succeeded {
        return Guarded::Done(resp.header.as_ref().map_or(0, |h| h.revision));
    }
    let current = resp.responses.first().and_then(|op| match &op.response {
        Some(Response::ResponseRange(range)) => range.kvs.first().map(|kv| kv.mod_revision),
        _ => None,
    });
    Guarded::Conflict(current)
}

/// One unary call, bounded by the request timeout.
pub(super) async fn call<Req: Message, Resp: Message + Default>(
    unary: &mut Unary,
    req: &Req,
    timeout: Duration,
) -> Result<Resp, String> {
    match tokio::time::timeout(timeout, unary.call(req)).await {
        Ok(r) => r,
        Err(_) => Err("request timed out (bench --request-timeout)".to_owned()),
    }
}

/// One worker's callers, all on one connection.
pub(super) struct Kv {
    pub(super) txn: Unary,
    pub(super) range: Unary,
    pub(super) lease: Unary,
    pub(super) compact: Unary,
    pub(super) timeout: Duration,
}

impl Kv {
    pub(super) fn new(conn: &Conn, timeout: Duration) -> Result<Kv> {
        Ok(Kv {
            txn: conn.unary(KV_TXN)?,
            range: conn.unary(KV_RANGE)?,
            lease: conn.unary(LEASE_GRANT)?,
            compact: conn.unary(KV_COMPACT)?,
            timeout,
        })
    }

    pub(super) async fn txn(&mut self, req: &TxnRequest) -> Result<TxnResponse, String> {
        call(&mut self.txn, req, self.timeout).await
    }

    pub(super) async fn range(&mut self, req: &RangeRequest) -> Result<RangeResponse, String> {
        call(&mut self.range, req, self.timeout).await
    }

    /// `Txn If(mod_revision(k) == 0) Then Put(k, v[, lease])`.
    pub(super) async fn create(
        &mut self,
        key: &[u8],
        value: Vec<u8>,
        lease: i64,
    ) -> Result<Guarded, String> {
        let req = TxnRequest {
            compare: vec![mod_revision_is(key, 0)],
            success: vec![put_op(key, value, lease)],
            failure: Vec::new(),
        };
        self.txn(&req).await.map(|r| guarded(&r))
    }

    /// `Txn If(mod_revision(k) == rev) Then Put(k, v) Else Range(k)`.
    pub(super) async fn update(
        &mut self,
        key: &[u8],
        value: Vec<u8>,
        rev: i64,
    ) -> Result<Guarded, String> {
        let req = TxnRequest {
            compare: vec![mod_revision_is(key, rev)],
            success: vec![put_op(key, value, 0)],
            failure: vec![get_op(key)],
        };
        self.txn(&req).await.map(|r| guarded(&r))
    }

    /// `Txn If(mod_revision(k) == rev) Then DeleteRange(k) Else Range(k)`.
    pub(super) async fn delete(&mut self, key: &[u8], rev: i64) -> Result<Guarded, String> {
        let req = TxnRequest {
            compare: vec![mod_revision_is(key, rev)],
            success: vec![delete_op(key)],
            failure: vec![get_op(key)],
        };
        self.txn(&req).await.map(|r| guarded(&r))
    }
}

#[cfg(test)]
mod tests {
    use rand::SeedableRng;

    use super::super::MAX_VALUE;
    use super::*;
    use etcdrs_proto::etcdserverpb::RangeResponse;

    #[test]
    fn keys_follow_kube_apiserver_layout() {
        assert_eq!(node_key(7), b"/registry/minions/node-00007");
        assert_eq!(pod_key(100, 205, 3), b"/registry/pods/ns-0005/pod-000205-3");
        assert_eq!(
            event_key(10, 0x1f),
            b"/registry/events/ns-0001/event-0000001f"
        );
    }

    #[test]
    fn value_sizes_stay_in_their_ranges() {
        let mut rng = SmallRng::seed_from_u64(1);
        for _ in 0..1000 {
            let n = Resource::Node.value_size(&mut rng);
            assert!((6 * 1024..=MAX_VALUE).contains(&n));
            let p = Resource::Pod.value_size(&mut rng);
            assert!((1024..=MAX_VALUE).contains(&p));
            let e = Resource::Event.value_size(&mut rng);
            assert!((900..=1200).contains(&e));
        }
    }

    #[test]
    fn a_failed_guard_reports_the_revision_it_read() {
        let resp = TxnResponse {
            succeeded: false,
            responses: vec![etcdrs_proto::etcdserverpb::ResponseOp {
                response: Some(Response::ResponseRange(RangeResponse {
                    kvs: vec![etcdrs_proto::mvccpb::KeyValue {
                        mod_revision: 42,
                        ..Default::default()
                    }],
                    ..Default::default()
                })),
            }],
            ..Default::default()
        };
        assert_eq!(guarded(&resp), Guarded::Conflict(Some(42)));
        let gone = TxnResponse {
            succeeded: false,
            responses: vec![etcdrs_proto::etcdserverpb::ResponseOp {
                response: Some(Response::ResponseRange(RangeResponse::default())),
            }],
            ..Default::default()
        };
        assert_eq!(guarded(&gone), Guarded::Conflict(None));
        let ok = TxnResponse {
            succeeded: true,
            header: Some(etcdrs_proto::etcdserverpb::ResponseHeader {
                revision: 9,
                ..Default::default()
            }),
            ..Default::default()
        };
        assert_eq!(guarded(&ok), Guarded::Done(9));
    }
}
