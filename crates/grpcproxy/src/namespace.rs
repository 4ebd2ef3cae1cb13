//! `--namespace`: every key a client names gets the prefix on the way in and loses it on the
//! way out (etcd `client/v3/namespace`), so a client sees the prefix as the whole keyspace and
//! nothing outside it: open-ended ranges (`"\0"` range ends) are clamped to the prefix, and
//! keys the cluster returns from outside it (a lease's attached keys) are dropped.

use etcdrs_proto::etcdserverpb::{
    Compare, DeleteRangeRequest, DeleteRangeResponse, PutRequest, PutResponse, RangeRequest,
    RangeResponse, RequestOp, ResponseOp, TxnRequest, TxnResponse, request_op, response_op,
};
use etcdrs_proto::keys::prefix_end;
use etcdrs_proto::mvccpb::KeyValue;

/// A key prefix (empty: no namespace, every function is the identity).
#[derive(Clone, Debug, Default)]
pub struct Namespace {
    prefix: Vec<u8>,
}

impl Namespace {
    /// A namespace of `prefix`.
    pub fn new(prefix: impl Into<Vec<u8>>) -> Namespace {
        Namespace {
            prefix: prefix.into(),
        }
    }

    /// The prefix.
    pub fn prefix(&self) -> &[u8] {
        &self.prefix
    }

    /// Whether there is no namespace.
    pub fn is_empty(&self) -> bool {
        self.prefix.is_empty()
    }

    /// `key` inside the namespace.
    pub fn key(&self, key: &[u8]) -> Vec<u8> {
        if self.prefix.is_empty() {
            return key.to_vec();
        }
        let mut out = Vec::with_capacity(self.prefix.len() + key.len());
        out.extend_from_slice(&self.prefix);
        out.extend_from_slice(key);
        out
    }

    /// The range `[key, end)` inside the namespace. An empty `end` is one key; `"\0"` (all keys
    /// from `key` on) ends at the end of the prefix instead of the end of the keyspace.
    pub fn range(&self, key: &[u8], end: &[u8]) -> (Vec<u8>, Vec<u8>) {
        if self.prefix.is_empty() {
            return (key.to_vec(), end.to_vec());
        }
        if end.is_empty() {
            return (self.key(key), Vec::new());
        }
        if end == [0] {
            let start = if key == [0] {
                self.prefix.clone()
            } else {
                self.key(key)
            };
            return (start, prefix_end(&self.prefix));
        }
        (self.key(key), self.key(end))
    }

    /// `key` as the client sees it: without the prefix (`None` when outside the namespace).
    pub fn strip<'a>(&self, key: &'a [u8]) -> Option<&'a [u8]> {
        key.strip_prefix(self.prefix.as_slice())
    }

    /// Strips the prefix from a key the cluster returned (it is inside the namespace by
    /// construction; a key outside keeps its name, which cannot happen for ranges we clamp).
    pub fn strip_owned(&self, key: &mut Vec<u8>) {
        if !self.prefix.is_empty() && key.starts_with(&self.prefix) {
            key.drain(..self.prefix.len());
        }
    }

    /// Strips the prefix from a key-value's key.
    pub fn strip_kv(&self, kv: &mut KeyValue) {
        self.strip_owned(&mut kv.key);
    }

    /// A range request, prefixed.
    pub fn range_request(&self, req: &mut RangeRequest) {
        if self.prefix.is_empty() {
            return;
        }
        let (key, end) = self.range(&req.key, &req.range_end);
        req.key = key;
        req.range_end = end;
        // The revision bounds and limit are about the whole request; nothing else names keys.
    }

    /// A range response, stripped.
    pub fn range_response(&self, resp: &mut RangeResponse) {
        if self.prefix.is_empty() {
            return;
        }
        resp.kvs.iter_mut().for_each(|kv| self.strip_kv(kv));
    }

    /// A put request, prefixed.
    pub fn put_request(&self, req: &mut PutRequest) {
        if !self.prefix.is_empty() {
            req.key = self.key(&req.key);
        }
    }

    /// A put response, stripped.
    pub fn put_response(&self, resp: &mut PutResponse) {
        if let Some(kv) = resp.prev_kv.as_mut() {
            self.strip_kv(kv);
        }
    }

    /// A delete request, prefixed.
    pub fn delete_request(&self, req: &mut DeleteRangeRequest) {
        if self.prefix.is_empty() {
            return;
        }
        let (key, end) = self.range(&req.key, &req.range_end);
        req.key = key;
        req.range_end = end;
    }

    /// A delete response, stripped.
    pub fn delete_response(&self, resp: &mut DeleteRangeResponse) {
        resp.prev_kvs.iter_mut().for_each(|kv| self.strip_kv(kv));
    }

    fn compare(&self, cmp: &mut Compare) {
        let (key, end) = self.range(&cmp.key, &cmp.range_end);
        cmp.key = key;
        cmp.range_end = end;
    }

    fn request_op(&self, op: &mut RequestOp) {
        match op.request.as_mut() {
            Some(request_op::Request::RequestRange(r)) => self.range_request(r),
            Some(request_op::Request::RequestPut(r)) => self.put_request(r),
            Some(request_op::Request::RequestDeleteRange(r)) => self.delete_request(r),
            Some(request_op::Request::RequestTxn(r)) => self.txn_request(r),
            None => {}
        }
    }

    fn response_op(&self, op: &mut ResponseOp) {
        match op.response.as_mut() {
            Some(response_op::Response::ResponseRange(r)) => self.range_response(r),
            Some(response_op::Response::ResponsePut(r)) => self.put_response(r),
            Some(response_op::Response::ResponseDeleteRange(r)) => self.delete_response(r),
            Some(response_op::Response::ResponseTxn(r)) => self.txn_response(r),
            None => {}
        }
    }

    /// A txn request (compares and every op, nested txns included), prefixed.
    pub fn txn_request(&self, req: &mut TxnRequest) {
        if self.prefix.is_empty() {
            return;
        }
        req.compare.iter_mut().for_each(|c| self.compare(c));
        req.success.iter_mut().for_each(|op| self.request_op(op));
        req.failure.iter_mut().for_each(|op| self.request_op(op));
    }

    /// A txn response, stripped.
    pub fn txn_response(&self, resp: &mut TxnResponse) {
        if self.prefix.is_empty() {
            return;
        }
        resp.responses
            .iter_mut()
            .for_each(|op| self.response_op(op));
    }

    /// The keys attached to a lease as the client may see them: inside the namespace, stripped.
    pub fn lease_keys(&self, keys: Vec<Vec<u8>>) -> Vec<Vec<u8>> {
        if self.prefix.is_empty() {
            return keys;
        }
        keys.into_iter()
            .filter_map(|k| self.strip(&k).map(<[u8]>::to_vec))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn open_ranges_are_clamped() {
        let ns = Namespace::new("ns/");
        assert_eq!(ns.range(b"a", b""), (b"ns/a".to_vec(), vec![]));
        assert_eq!(ns.range(b"a", b"c"), (b"ns/a".to_vec(), b"ns/c".to_vec()));
        assert_eq!(ns.range(b"a", b"\0"), (b"ns/a".to_vec(), b"ns0".to_vec()));
        assert_eq!(ns.range(b"\0", b"\0"), (b"ns/".to_vec(), b"ns0".to_vec()));
        let none = Namespace::default();
        assert_eq!(none.range(b"\0", b"\0"), (vec![0], vec![0]));
    }

    #[test]
    fn lease_keys_outside_are_hidden() {
        let ns = Namespace::new("ns/");
        assert_eq!(
            ns.lease_keys(vec![b"ns/a".to_vec(), b"other".to_vec()]),
            vec![b"a".to_vec()]
        );
    }
}
