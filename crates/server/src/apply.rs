//! Applying requests to the MVCC store (etcd `server/etcdserver/apply.go`, the v3 backend
//! applier): Range, Put, DeleteRange and Txn with etcd's exact semantics, plus compaction,
//! leases and alarms. Reads that do not go through raft use the same range code.

use std::cmp::Ordering;

use etcdrs_mvcc::{KeyRange, RangeParams, RangeResult, Txn, WriteBatch};
use etcdrs_proto::etcdserverpb::compare::{CompareResult, CompareTarget, TargetUnion};
use etcdrs_proto::etcdserverpb::range_request::{SortOrder, SortTarget};
use etcdrs_proto::etcdserverpb::request_op::Request;
use etcdrs_proto::etcdserverpb::response_op::Response;
use etcdrs_proto::etcdserverpb::{
    Compare, DeleteRangeRequest, DeleteRangeResponse, PutRequest, PutResponse, RangeRequest,
    RangeResponse, ResponseHeader, ResponseOp, TxnRequest, TxnResponse,
};
use etcdrs_proto::mvccpb::KeyValue;
use etcdrs_proto::rpctypes;

use crate::error::{Result, ServerError};

fn header(revision: i64) -> Option<ResponseHeader> {
    Some(ResponseHeader {
        revision,
        ..ResponseHeader::default()
    })
}

/// Something ranges can be read from: the committed store, or a transaction in progress.
pub trait ReadView {
    /// Read a range.
    fn range(&self, range: KeyRange<'_>, params: RangeParams) -> Result<RangeResult>;
}

impl ReadView for etcdrs_mvcc::KvStore {
    fn range(&self, range: KeyRange<'_>, params: RangeParams) -> Result<RangeResult> {
        Ok(etcdrs_mvcc::KvStore::range(self, range, params)?)
    }
}

impl ReadView for Txn<'_, '_> {
    fn range(&self, range: KeyRange<'_>, params: RangeParams) -> Result<RangeResult> {
        Ok(Txn::range(self, range, params)?)
    }
}

/// Serve a RangeRequest from `view`.
pub fn range(view: &impl ReadView, req: &RangeRequest) -> Result<RangeResponse> {
    let sort_order = SortOrder::try_from(req.sort_order).unwrap_or(SortOrder::None);
    let sort_target = SortTarget::try_from(req.sort_target).unwrap_or(SortTarget::Key);
    let needs_all = sort_order != SortOrder::None
        || req.min_mod_revision != 0
        || req.max_mod_revision != 0
        || req.min_create_revision != 0
        || req.max_create_revision != 0;
    // One extra key tells whether there are more.
    let limit = if needs_all || req.limit <= 0 {
        0
    } else {
        req.limit + 1
    };
    let mut result = view.range(
        KeyRange::new(&req.key, &req.range_end),
        RangeParams {
            rev: req.revision,
            limit,
            count_only: req.count_only,
        },
    )?;
    let kvs = &mut result.kvs;
    if req.max_mod_revision != 0 {
        kvs.retain(|kv| kv.mod_revision <= req.max_mod_revision);
    }
    if req.min_mod_revision != 0 {
        kvs.retain(|kv| kv.mod_revision >= req.min_mod_revision);
    }
    if req.max_create_revision != 0 {
        kvs.retain(|kv| kv.create_revision <= req.max_create_revision);
    }
    if req.min_create_revision != 0 {
        kvs.retain(|kv| kv.create_revision >= req.min_create_revision);
    }
    // A sort target other than the key sorts ascending unless told otherwise.
    let order = if sort_target != SortTarget::Key && sort_order == SortOrder::None {
        SortOrder::Ascend
    } else {
        sort_order
    };
    if order != SortOrder::None {
        let by = |a: &KeyValue, b: &KeyValue| -> Ordering {
            match sort_target {
                SortTarget::Key => a.key.cmp(&b.key),
                SortTarget::Version => a.version.cmp(&b.version),
                SortTarget::Create => a.create_revision.cmp(&b.create_revision),
                SortTarget::Mod => a.mod_revision.cmp(&b.mod_revision),
                SortTarget::Value => a.value.cmp(&b.value),
            }
        };
        if order == SortOrder::Descend {
            kvs.sort_by(|a, b| by(b, a));
        } else {
            kvs.sort_by(by);
        }
    }
    let mut more = false;
    if req.limit > 0 && kvs.len() as i64 > req.limit {
        kvs.truncate(req.limit as usize);
        more = true;
    }
    if req.keys_only {
        for kv in kvs.iter_mut() {
            kv.value.clear();
        }
    }
    Ok(RangeResponse {
        header: header(result.rev),
        kvs: std::mem::take(&mut result.kvs),
        more,
        count: result.count,
    })
}

fn prev_of(txn: &Txn<'_, '_>, key: &[u8]) -> Result<Option<KeyValue>> {
    Ok(txn
        .range(KeyRange::new(key, &[]), RangeParams::default())?
        .kvs
        .pop())
}

/// Apply a put inside `txn`.
pub fn put(txn: &mut Txn<'_, '_>, req: &PutRequest) -> Result<PutResponse> {
    let mut value = &req.value[..];
    let mut lease = req.lease;
    let prev = if req.ignore_value || req.ignore_lease || req.prev_kv {
        prev_of(txn, &req.key)?
    } else {
        None
    };
    if req.ignore_value || req.ignore_lease {
        let Some(prev) = &prev else {
            return Err(ServerError::Etcd(&rpctypes::KEY_NOT_FOUND));
        };
        if req.ignore_value {
            value = &prev.value;
        }
        if req.ignore_lease {
            lease = prev.lease;
        }
    }
    put_value(txn, &req.key, value, lease)?;
    Ok(PutResponse {
        header: header(txn.rev()),
        prev_kv: if req.prev_kv { prev } else { None },
    })
}

/// [`put`] of a request the caller has no more use for: a plain put (no `ignore_value`,
/// `ignore_lease` or `prev_kv`) moves its value into the store instead of copying it.
pub fn put_owned(txn: &mut Txn<'_, '_>, mut req: PutRequest) -> Result<PutResponse> {
    if req.ignore_value || req.ignore_lease || req.prev_kv {
        return put(txn, &req);
    }
    put_value(txn, &req.key, std::mem::take(&mut req.value), req.lease)?;
    Ok(PutResponse {
        header: header(txn.rev()),
        prev_kv: None,
    })
}

/// The store's put, its missing lease answered with etcd's error.
fn put_value(
    txn: &mut Txn<'_, '_>,
    key: &[u8],
    value: impl Into<Vec<u8>>,
    lease: i64,
) -> Result<()> {
    match txn.put(key, value, lease) {
        Ok(()) => Ok(()),
        Err(etcdrs_mvcc::Error::LeaseNotFound(_)) => {
            Err(ServerError::Etcd(&rpctypes::LEASE_NOT_FOUND))
        }
        Err(e) => Err(e.into()),
    }
}

/// Apply a delete inside `txn`.
pub fn delete_range(
    txn: &mut Txn<'_, '_>,
    req: &DeleteRangeRequest,
) -> Result<DeleteRangeResponse> {
    let prev_kvs = if req.prev_kv {
        txn.range(
            KeyRange::new(&req.key, &req.range_end),
            RangeParams::default(),
        )?
        .kvs
    } else {
        Vec::new()
    };
    let deleted = txn.delete_range(KeyRange::new(&req.key, &req.range_end))?;
    let rev = if txn.has_changes() {
        txn.rev()
    } else {
        txn.rev() - 1
    };
    Ok(DeleteRangeResponse {
        header: header(rev),
        deleted: deleted.len() as i64,
        prev_kvs,
    })
}

/// Whether a txn only reads (then it is served without raft).
pub fn txn_is_read_only(req: &TxnRequest) -> bool {
    req.success
        .iter()
        .chain(req.failure.iter())
        .all(|op| match &op.request {
            Some(Request::RequestRange(_)) | None => true,
            Some(Request::RequestTxn(inner)) => txn_is_read_only(inner),
            Some(_) => false,
        })
}

fn compare_one(compare: &Compare, kv: &KeyValue) -> bool {
    let target = CompareTarget::try_from(compare.target).unwrap_or(CompareTarget::Version);
    let ordering = match (target, &compare.target_union) {
        (CompareTarget::Version, Some(TargetUnion::Version(v))) => kv.version.cmp(v),
        (CompareTarget::Create, Some(TargetUnion::CreateRevision(v))) => kv.create_revision.cmp(v),
        (CompareTarget::Mod, Some(TargetUnion::ModRevision(v))) => kv.mod_revision.cmp(v),
        (CompareTarget::Value, Some(TargetUnion::Value(v))) => {
            kv.value.as_slice().cmp(v.as_slice())
        }
        (CompareTarget::Lease, Some(TargetUnion::Lease(v))) => kv.lease.cmp(v),
        // A missing operand compares as its zero value, as in etcd.
        (CompareTarget::Version, _) => kv.version.cmp(&0),
        (CompareTarget::Create, _) => kv.create_revision.cmp(&0),
        (CompareTarget::Mod, _) => kv.mod_revision.cmp(&0),
        (CompareTarget::Value, _) => kv.value.as_slice().cmp(&[][..]),
        (CompareTarget::Lease, _) => kv.lease.cmp(&0),
    };
    match CompareResult::try_from(compare.result).unwrap_or(CompareResult::Equal) {
        CompareResult::Equal => ordering == Ordering::Equal,
        CompareResult::NotEqual => ordering != Ordering::Equal,
        CompareResult::Greater => ordering == Ordering::Greater,
        CompareResult::Less => ordering == Ordering::Less,
    }
}

fn compare(view: &impl ReadView, compare: &Compare) -> bool {
    let Ok(result) = view.range(
        KeyRange::new(&compare.key, &compare.range_end),
        RangeParams::default(),
    ) else {
        return false;
    };
    if result.kvs.is_empty() {
        // A value comparison against a missing key always fails: an empty value and no value
        // cannot be told apart otherwise.
        if compare.target == CompareTarget::Value as i32 {
            return false;
        }
        return compare_one(compare, &KeyValue::default());
    }
    result.kvs.iter().all(|kv| compare_one(compare, kv))
}

/// The branch each (nested) txn takes, decided before any operation runs, in visit order.
fn txn_path(view: &impl ReadView, req: &TxnRequest, path: &mut Vec<bool>) {
    let succeeded = req.compare.iter().all(|c| compare(view, c));
    path.push(succeeded);
    let ops = if succeeded {
        &req.success
    } else {
        &req.failure
    };
    for op in ops {
        if let Some(Request::RequestTxn(inner)) = &op.request {
            txn_path(view, inner, path);
        }
    }
}

/// Check the operations that will run before running any: leases of puts exist, keys of
/// ignore_value/ignore_lease puts exist, range revisions are readable.
fn check_ops(
    txn: &Txn<'_, '_>,
    lessor: &etcdrs_mvcc::Lessor,
    req: &TxnRequest,
    path: &[bool],
    at: &mut usize,
) -> Result<()> {
    let succeeded = path.get(*at).copied().unwrap_or(false);
    *at += 1;
    let ops = if succeeded {
        &req.success
    } else {
        &req.failure
    };
    for op in ops {
        match &op.request {
            Some(Request::RequestPut(put)) => {
                if put.ignore_value || put.ignore_lease {
                    if prev_of(txn, &put.key)?.is_none() {
                        return Err(ServerError::Etcd(&rpctypes::KEY_NOT_FOUND));
                    }
                } else if put.lease != 0 && !lessor.contains(put.lease) {
                    return Err(ServerError::Etcd(&rpctypes::LEASE_NOT_FOUND));
                }
            }
            Some(Request::RequestRange(range)) => {
                if range.revision > 0 {
                    txn.range(
                        KeyRange::new(&range.key, &range.range_end),
                        RangeParams {
                            rev: range.revision,
                            limit: 1,
                            count_only: true,
                        },
                    )?;
                }
            }
            Some(Request::RequestTxn(inner)) => check_ops(txn, lessor, inner, path, at)?,
            Some(Request::RequestDeleteRange(_)) | None => {}
        }
    }
    Ok(())
}

fn run_ops(
    txn: &mut Txn<'_, '_>,
    req: &mut TxnRequest,
    path: &[bool],
    at: &mut usize,
) -> Result<TxnResponse> {
    let succeeded = path.get(*at).copied().unwrap_or(false);
    *at += 1;
    // The branch's operations are taken out of the request: their values move into the store.
    let ops = std::mem::take(if succeeded {
        &mut req.success
    } else {
        &mut req.failure
    });
    let mut responses = Vec::with_capacity(ops.len());
    for op in ops {
        let response = match op.request {
            Some(Request::RequestRange(r)) => Some(Response::ResponseRange(range(&*txn, &r)?)),
            Some(Request::RequestPut(p)) => Some(Response::ResponsePut(put_owned(txn, p)?)),
            Some(Request::RequestDeleteRange(d)) => {
                Some(Response::ResponseDeleteRange(delete_range(txn, &d)?))
            }
            Some(Request::RequestTxn(mut inner)) => {
                Some(Response::ResponseTxn(run_ops(txn, &mut inner, path, at)?))
            }
            None => None,
        };
        responses.push(ResponseOp { response });
    }
    let rev = if txn.has_changes() {
        txn.rev()
    } else {
        txn.rev() - 1
    };
    Ok(TxnResponse {
        header: header(rev),
        succeeded,
        responses,
    })
}

/// Apply a txn inside `txn` (writes) — the whole txn is one revision. The request is consumed:
/// its puts' values move into the store.
pub fn txn_write(
    batch_txn: &mut Txn<'_, '_>,
    lessor: &etcdrs_mvcc::Lessor,
    mut req: TxnRequest,
) -> Result<TxnResponse> {
    let mut path = Vec::new();
    txn_path(&*batch_txn, &req, &mut path);
    check_ops(batch_txn, lessor, &req, &path, &mut 0)?;
    run_ops(batch_txn, &mut req, &path, &mut 0)
}

/// Serve a read-only txn from the committed store.
pub fn txn_read(store: &etcdrs_mvcc::KvStore, req: &TxnRequest) -> Result<TxnResponse> {
    let mut path = Vec::new();
    txn_path(store, req, &mut path);
    txn_read_ops(store, req, &path, &mut 0)
}

fn txn_read_ops(
    store: &etcdrs_mvcc::KvStore,
    req: &TxnRequest,
    path: &[bool],
    at: &mut usize,
) -> Result<TxnResponse> {
    let succeeded = path.get(*at).copied().unwrap_or(false);
    *at += 1;
    let ops = if succeeded {
        &req.success
    } else {
        &req.failure
    };
    let mut responses = Vec::with_capacity(ops.len());
    // All ranges read at one revision, so the txn sees one snapshot.
    let rev = store.current_rev();
    for op in ops {
        let response = match &op.request {
            Some(Request::RequestRange(r)) => {
                let mut pinned = r.clone();
                if pinned.revision <= 0 {
                    pinned.revision = rev;
                }
                let mut resp = range(store, &pinned)?;
                if let Some(h) = resp.header.as_mut() {
                    h.revision = rev;
                }
                Some(Response::ResponseRange(resp))
            }
            Some(Request::RequestTxn(inner)) => {
                Some(Response::ResponseTxn(txn_read_ops(store, inner, path, at)?))
            }
            _ => None,
        };
        responses.push(ResponseOp { response });
    }
    Ok(TxnResponse {
        header: header(rev),
        succeeded,
        responses,
    })
}

/// Compact in `batch`.
pub fn compact(batch: &mut WriteBatch<'_>, rev: i64) -> Result<i64> {
    batch.compact(rev)?;
    Ok(batch.current_rev())
}
