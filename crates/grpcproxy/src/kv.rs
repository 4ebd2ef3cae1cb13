//! The KV service (etcd `grpcproxy/kv.go`): ranges, puts, deletes, txns and compaction go to
//! the cluster through [`Upstream`]; serializable ranges may be answered from the
//! [`RangeCache`]; writes through the proxy also drop what they touch from the cache at once.
//! The cache holds responses as encoded gRPC messages; [`KvProxy::cached_range`] is the hit
//! path the listener takes before any gRPC decoding of its own (see `serve`).
//!
//! etcd 3.7's `RangeStream` is answered Unimplemented, with etcd 3.7's proxy's text ("RangeStream
//! is not supported by the gRPC proxy"): that is what etcd's proxy does, and a client such as
//! kube-apiserver then falls back to paginated ranges, which the proxy serves (and caches).

use bytes::{BufMut, Bytes, BytesMut};

use etcdrs_proto::etcdserverpb::kv_client::KvClient;
use etcdrs_proto::etcdserverpb::kv_server::Kv;
use etcdrs_proto::etcdserverpb::{
    CompactionRequest, CompactionResponse, DeleteRangeRequest, DeleteRangeResponse, PutRequest,
    PutResponse, RangeRequest, RangeResponse, RequestOp, TxnRequest, TxnResponse, request_op,
};
use etcdrs_proto::rpctypes;
use prost::Message;
use tonic::{Request, Response, Status};

use crate::cache::RangeCache;
use crate::metrics::Metrics;
use crate::namespace::Namespace;
use crate::upstream::{Upstream, forward, forward_metadata, token_of};

/// The KV service of the proxy.
#[derive(Clone)]
pub struct KvProxy {
    upstream: Upstream,
    ns: Namespace,
    cache: RangeCache,
    metrics: Metrics,
}

impl KvProxy {
    /// The service over `upstream`.
    pub fn new(upstream: Upstream, ns: Namespace, cache: RangeCache, metrics: Metrics) -> Self {
        KvProxy {
            upstream,
            ns,
            cache,
            metrics,
        }
    }

    fn client(&self, channel: tonic::transport::Channel) -> KvClient<tonic::transport::Channel> {
        KvClient::new(channel).max_decoding_message_size(self.upstream.max_decoding())
    }

    /// Drops the cached ranges the ops of a txn may have written.
    fn invalidate_ops(&self, ops: &[RequestOp], revision: i64) {
        for op in ops {
            match op.request.as_ref() {
                Some(request_op::Request::RequestPut(p)) => {
                    self.cache.invalidate([p.key.as_slice()], revision)
                }
                Some(request_op::Request::RequestDeleteRange(d)) => {
                    self.cache.invalidate_range(&d.key, &d.range_end, revision)
                }
                Some(request_op::Request::RequestTxn(t)) => {
                    self.invalidate_ops(&t.success, revision);
                    self.invalidate_ops(&t.failure, revision);
                }
                Some(request_op::Request::RequestRange(_)) | None => {}
            }
        }
    }
}

/// `resp` as one uncompressed, length-prefixed gRPC message.
fn grpc_message(resp: &RangeResponse) -> Bytes {
    let len = resp.encoded_len();
    let mut buf = BytesMut::with_capacity(5 + len);
    buf.put_u8(0);
    buf.put_u32(len as u32);
    resp.encode_raw(&mut buf);
    buf.freeze()
}

impl KvProxy {
    /// The cached answer, as one encoded gRPC message, to the client's range `req` sent with
    /// auth `token`; `None` when it is not cacheable or not cached (the caller then takes the
    /// full path, which counts the miss).
    pub fn cached_range(&self, token: &str, mut req: RangeRequest) -> Option<Bytes> {
        if req.key.is_empty() || !RangeCache::cacheable(&req) {
            return None;
        }
        self.ns.range_request(&mut req);
        let wire = self.cache.get(&RangeCache::key(token, &req))?;
        self.metrics.cache_hit();
        Some(wire)
    }
}

fn revision_of(header: Option<&etcdrs_proto::etcdserverpb::ResponseHeader>) -> i64 {
    header.map_or(0, |h| h.revision)
}

#[tonic::async_trait]
impl Kv for KvProxy {
    async fn range(
        &self,
        request: Request<RangeRequest>,
    ) -> Result<Response<RangeResponse>, Status> {
        let (metadata, _, mut req) = request.into_parts();
        if req.key.is_empty() {
            return Err(rpctypes::EMPTY_KEY.to_status());
        }
        self.ns.range_request(&mut req);
        let token = token_of(&metadata);
        let cache_key = RangeCache::cacheable(&req).then(|| RangeCache::key(&token, &req));
        if let Some(key) = &cache_key {
            if let Some(wire) = self.cache.get(key) {
                self.metrics.cache_hit();
                // The cache holds what we encoded ourselves: one uncompressed message.
                let cached = RangeResponse::decode(wire.slice(5..))
                    .map_err(|e| Status::internal(format!("cached range response: {e}")))?;
                return Ok(Response::new(cached));
            }
            self.metrics.cache_miss();
        }
        let mut resp = self
            .upstream
            .unary(|ch| {
                let mut client = self.client(ch);
                let req = forward_metadata(&metadata, req.clone());
                async move { client.range(req).await }
            })
            .await?
            .into_inner();
        self.ns.range_response(&mut resp);
        if let Some(key) = cache_key {
            let revision = revision_of(resp.header.as_ref());
            self.cache
                .put(&token, key, &req, revision, grpc_message(&resp));
        }
        Ok(Response::new(resp))
    }

    type RangeStreamStream =
        futures::stream::Empty<Result<etcdrs_proto::etcdserverpb::RangeStreamResponse, Status>>;

    async fn range_stream(
        &self,
        _request: Request<RangeRequest>,
    ) -> Result<Response<Self::RangeStreamStream>, Status> {
        Err(rpctypes::RANGE_STREAM_PROXY.to_status())
    }

    async fn put(&self, request: Request<PutRequest>) -> Result<Response<PutResponse>, Status> {
        let mut req = request.get_ref().clone();
        if req.key.is_empty() {
            return Err(rpctypes::EMPTY_KEY.to_status());
        }
        self.ns.put_request(&mut req);
        let key = req.key.clone();
        let mut resp = self
            .upstream
            .unary(|ch| {
                let mut client = self.client(ch);
                let req = forward(&request, req.clone());
                async move { client.put(req).await }
            })
            .await?
            .into_inner();
        self.cache
            .invalidate([key.as_slice()], revision_of(resp.header.as_ref()));
        self.ns.put_response(&mut resp);
        Ok(Response::new(resp))
    }

    async fn delete_range(
        &self,
        request: Request<DeleteRangeRequest>,
    ) -> Result<Response<DeleteRangeResponse>, Status> {
        let mut req = request.get_ref().clone();
        if req.key.is_empty() {
            return Err(rpctypes::EMPTY_KEY.to_status());
        }
        self.ns.delete_request(&mut req);
        let mut resp = self
            .upstream
            .unary(|ch| {
                let mut client = self.client(ch);
                let req = forward(&request, req.clone());
                async move { client.delete_range(req).await }
            })
            .await?
            .into_inner();
        self.cache
            .invalidate_range(&req.key, &req.range_end, revision_of(resp.header.as_ref()));
        self.ns.delete_response(&mut resp);
        Ok(Response::new(resp))
    }

    async fn txn(&self, request: Request<TxnRequest>) -> Result<Response<TxnResponse>, Status> {
        let mut req = request.get_ref().clone();
        self.ns.txn_request(&mut req);
        let mut resp = self
            .upstream
            .unary(|ch| {
                let mut client = self.client(ch);
                let req = forward(&request, req.clone());
                async move { client.txn(req).await }
            })
            .await?
            .into_inner();
        let revision = revision_of(resp.header.as_ref());
        let ops = if resp.succeeded {
            &req.success
        } else {
            &req.failure
        };
        self.invalidate_ops(ops, revision);
        self.ns.txn_response(&mut resp);
        Ok(Response::new(resp))
    }

    async fn compact(
        &self,
        request: Request<CompactionRequest>,
    ) -> Result<Response<CompactionResponse>, Status> {
        let req = *request.get_ref();
        self.upstream
            .unary(|ch| {
                let mut client = self.client(ch);
                let req = forward(&request, req);
                async move { client.compact(req).await }
            })
            .await
    }
}
