//! Request checks made before a request is proposed or served (etcd
//! `server/etcdserver/api/v3rpc/key.go`): empty keys, conflicting options, txn size and the
//! rule that one txn may not write a key twice.

use etcdrs_proto::etcdserverpb::range_request::{SortOrder, SortTarget};
use etcdrs_proto::etcdserverpb::request_op::Request;
use etcdrs_proto::etcdserverpb::{
    DeleteRangeRequest, PutRequest, RangeRequest, RequestOp, TxnRequest,
};

use etcdrs_proto::rpctypes::{self, EtcdError};

type Check = Result<(), &'static EtcdError>;

/// Check a RangeRequest.
pub fn range(req: &RangeRequest) -> Check {
    if req.key.is_empty() {
        return Err(&rpctypes::EMPTY_KEY);
    }
    Ok(())
}

/// Check a RangeRequest for etcd 3.7's RangeStream (its `checkRangeStreamRequest`): Range's
/// checks with 3.7's sort-option check, then the refusals of what a stream in key order cannot
/// give: a sort other than by key ascending, and revision filters (Unimplemented, so that the
/// client uses Range).
pub fn range_stream(req: &RangeRequest) -> Check {
    range(req)?;
    let (Ok(order), Ok(target)) = (
        SortOrder::try_from(req.sort_order),
        SortTarget::try_from(req.sort_target),
    ) else {
        return Err(&rpctypes::INVALID_SORT_OPTION);
    };
    // etcd's `IsDefaultOrdering`. A target other than the key with no order passes, as in etcd,
    // though Range sorts ascending by that target then; the stream keeps key order.
    if !(order == SortOrder::None || (target == SortTarget::Key && order == SortOrder::Ascend)) {
        return Err(&rpctypes::RANGE_STREAM_SORT);
    }
    if req.min_mod_revision != 0
        || req.max_mod_revision != 0
        || req.min_create_revision != 0
        || req.max_create_revision != 0
    {
        return Err(&rpctypes::RANGE_STREAM_FILTERS);
    }
    Ok(())
}

/// Check a PutRequest.
pub fn put(req: &PutRequest) -> Check {
    if req.key.is_empty() {
        return Err(&rpctypes::EMPTY_KEY);
    }
    if req.ignore_value && !req.value.is_empty() {
        return Err(&rpctypes::VALUE_PROVIDED);
    }
    if req.ignore_lease && req.lease != 0 {
        return Err(&rpctypes::LEASE_PROVIDED);
    }
    Ok(())
}

/// Check a DeleteRangeRequest.
pub fn delete_range(req: &DeleteRangeRequest) -> Check {
    if req.key.is_empty() {
        return Err(&rpctypes::EMPTY_KEY);
    }
    Ok(())
}

/// Check a TxnRequest against `max_ops` (etcd's `--max-txn-ops`).
pub fn txn(req: &TxnRequest, max_ops: usize) -> Check {
    txn_ops(req, max_ops)?;
    writes_of(&req.success)?;
    writes_of(&req.failure)?;
    Ok(())
}

/// The size and key checks, recursively. As in etcd, a nested txn gets the budget its parent
/// left: `max_ops` less the parent's widest list (compares, success or failure ops).
fn txn_ops(req: &TxnRequest, max_ops: usize) -> Check {
    let widest = req
        .compare
        .len()
        .max(req.success.len())
        .max(req.failure.len());
    if widest > max_ops {
        return Err(&rpctypes::TOO_MANY_OPS);
    }
    for compare in &req.compare {
        if compare.key.is_empty() {
            return Err(&rpctypes::EMPTY_KEY);
        }
    }
    for op in req.success.iter().chain(req.failure.iter()) {
        match &op.request {
            Some(Request::RequestRange(r)) => range(r)?,
            Some(Request::RequestPut(p)) => put(p)?,
            Some(Request::RequestDeleteRange(d)) => delete_range(d)?,
            Some(Request::RequestTxn(t)) => txn_ops(t, max_ops - widest)?,
            // etcd's `checkRequestOp`: an empty op is refused with this error.
            None => return Err(&rpctypes::KEY_NOT_FOUND),
        }
    }
    Ok(())
}

/// A deleted key range, in etcd's encoding (empty end: one key; `[0]`: to the end).
struct Deleted {
    key: Vec<u8>,
    end: Vec<u8>,
}

impl Deleted {
    /// Whether the range covers `key`. As in etcd's interval check, the range is `[key, end)`
    /// compared as bytes, so a from-key delete (`end == [0]`) covers nothing here.
    fn contains(&self, key: &[u8]) -> bool {
        if self.end.is_empty() {
            return key == self.key.as_slice();
        }
        key >= self.key.as_slice() && key < self.end.as_slice()
    }
}

/// The keys a list of operations puts and the ranges it deletes, nested txns included;
/// errors when a key would be written twice. Both branches of a nested txn may put the same
/// key, since only one of them runs.
fn writes_of(ops: &[RequestOp]) -> Result<(Vec<Vec<u8>>, Vec<Deleted>), &'static EtcdError> {
    let mut deleted: Vec<Deleted> = ops
        .iter()
        .filter_map(|op| match &op.request {
            Some(Request::RequestDeleteRange(d)) => Some(Deleted {
                key: d.key.clone(),
                end: d.range_end.clone(),
            }),
            _ => None,
        })
        .collect();
    let mut puts: Vec<Vec<u8>> = Vec::new();
    let is_deleted = |deleted: &[Deleted], key: &[u8]| deleted.iter().any(|d| d.contains(key));
    for op in ops {
        let Some(Request::RequestTxn(inner)) = &op.request else {
            continue;
        };
        let (puts_then, dels_then) = writes_of(&inner.success)?;
        let (puts_else, dels_else) = writes_of(&inner.failure)?;
        for key in &puts_then {
            if puts.contains(key) || is_deleted(&deleted, key) {
                return Err(&rpctypes::DUPLICATE_KEY);
            }
            puts.push(key.clone());
        }
        for key in &puts_else {
            if (puts.contains(key) && !puts_then.contains(key)) || is_deleted(&deleted, key) {
                return Err(&rpctypes::DUPLICATE_KEY);
            }
            if !puts.contains(key) {
                puts.push(key.clone());
            }
        }
        deleted.extend(dels_then);
        deleted.extend(dels_else);
    }
    for op in ops {
        let Some(Request::RequestPut(put)) = &op.request else {
            continue;
        };
        if puts.contains(&put.key) || is_deleted(&deleted, &put.key) {
            return Err(&rpctypes::DUPLICATE_KEY);
        }
        puts.push(put.key.clone());
    }
    Ok((puts, deleted))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn put_op(key: &str) -> RequestOp {
        RequestOp {
            request: Some(Request::RequestPut(PutRequest {
                key: key.into(),
                ..Default::default()
            })),
        }
    }

    fn del_op(key: &str, end: &str) -> RequestOp {
        RequestOp {
            request: Some(Request::RequestDeleteRange(DeleteRangeRequest {
                key: key.into(),
                range_end: end.into(),
                ..Default::default()
            })),
        }
    }

    fn txn_op(success: Vec<RequestOp>, failure: Vec<RequestOp>) -> RequestOp {
        RequestOp {
            request: Some(Request::RequestTxn(TxnRequest {
                compare: vec![],
                success,
                failure,
            })),
        }
    }

    fn check(success: Vec<RequestOp>) -> Check {
        txn(
            &TxnRequest {
                compare: vec![],
                success,
                failure: vec![],
            },
            128,
        )
    }

    #[test]
    fn duplicate_keys() {
        assert!(check(vec![put_op("a"), put_op("b")]).is_ok());
        assert_eq!(
            check(vec![put_op("a"), put_op("a")]),
            Err(&rpctypes::DUPLICATE_KEY)
        );
        assert_eq!(
            check(vec![del_op("a", "c"), put_op("b")]),
            Err(&rpctypes::DUPLICATE_KEY)
        );
        assert!(check(vec![del_op("a", "c"), put_op("c")]).is_ok());
        assert!(check(vec![txn_op(vec![put_op("a")], vec![put_op("a")])]).is_ok());
        assert_eq!(
            check(vec![put_op("a"), txn_op(vec![put_op("a")], vec![])]),
            Err(&rpctypes::DUPLICATE_KEY)
        );
        assert_eq!(
            check(vec![txn_op(vec![del_op("a", "")], vec![]), put_op("a")]),
            Err(&rpctypes::DUPLICATE_KEY)
        );
        assert!(check(vec![del_op("a", ""), del_op("a", "")]).is_ok());
        // etcd quirk: a from-key delete does not conflict with puts.
        assert!(check(vec![del_op("a", "\0"), put_op("a")]).is_ok());
    }

    #[test]
    fn too_many_ops_and_empty_keys() {
        assert_eq!(
            check(vec![RequestOp { request: None }]),
            Err(&rpctypes::KEY_NOT_FOUND),
            "an empty op, as etcd"
        );
        let ops: Vec<RequestOp> = (0..129).map(|i| put_op(&format!("k{i}"))).collect();
        assert_eq!(check(ops), Err(&rpctypes::TOO_MANY_OPS));
        assert_eq!(check(vec![put_op("")]), Err(&rpctypes::EMPTY_KEY));
    }

    #[test]
    fn range_stream_takes_range_checks_and_refuses_sorts_and_filters() {
        let req = |edit: fn(&mut RangeRequest)| {
            let mut req = RangeRequest {
                key: b"k".to_vec(),
                ..Default::default()
            };
            edit(&mut req);
            range_stream(&req).err().map(|e| (e.code, e.message))
        };
        assert_eq!(req(|_| {}), None);
        assert_eq!(
            req(|r| r.key.clear()),
            Some((rpctypes::EMPTY_KEY.code, rpctypes::EMPTY_KEY.message))
        );
        let invalid = Some((
            tonic::Code::InvalidArgument,
            "etcdserver: invalid sort option",
        ));
        assert_eq!(req(|r| r.sort_order = 3), invalid);
        assert_eq!(req(|r| r.sort_target = 5), invalid);
        // etcd's default orderings: none (whatever the target), or by key ascending.
        assert_eq!(req(|r| r.sort_target = SortTarget::Value as i32), None);
        assert_eq!(req(|r| r.sort_order = SortOrder::Ascend as i32), None);
        let sort = Some((
            tonic::Code::Unimplemented,
            "RangeStream does not support custom sort orders",
        ));
        assert_eq!(req(|r| r.sort_order = SortOrder::Descend as i32), sort);
        assert_eq!(
            req(|r| {
                r.sort_order = SortOrder::Ascend as i32;
                r.sort_target = SortTarget::Mod as i32;
            }),
            sort
        );
        let filters = Some((
            tonic::Code::Unimplemented,
            "RangeStream does not support revision filters",
        ));
        assert_eq!(req(|r| r.min_mod_revision = 1), filters);
        assert_eq!(req(|r| r.max_mod_revision = 1), filters);
        assert_eq!(req(|r| r.min_create_revision = 1), filters);
        assert_eq!(req(|r| r.max_create_revision = 1), filters);
    }
}
