//! The KV service (etcd `api/v3rpc/key.go`); etcd 3.7's streamed range is
//! [`range_stream`](super::range_stream).

use etcdrs_proto::etcdserverpb::kv_server::Kv;
use etcdrs_proto::etcdserverpb::request_op::Request as OpRequest;
use etcdrs_proto::etcdserverpb::{
    CompactionRequest, CompactionResponse, DeleteRangeRequest, DeleteRangeResponse, PutRequest,
    PutResponse, RangeRequest, RangeResponse, TxnRequest, TxnResponse,
};
use tonic::{Request, Response, Status};

use super::Rpc;
use super::encoded_range;
use super::range_stream::RangeStream;
use crate::apply;
use crate::validate;

/// Bytes a txn's puts would add, for the quota check.
fn txn_put_bytes(req: &TxnRequest) -> u64 {
    req.success
        .iter()
        .chain(req.failure.iter())
        .map(|op| match &op.request {
            Some(OpRequest::RequestPut(p)) => (p.key.len() + p.value.len()) as u64,
            Some(OpRequest::RequestTxn(t)) => txn_put_bytes(t),
            _ => 0,
        })
        .sum()
}

impl Rpc {
    /// A Range's checks, in etcd's order: validation, the linearizable barrier, then auth.
    async fn range_allowed(&self, request: Request<RangeRequest>) -> Result<RangeRequest, Status> {
        validate::range(request.get_ref()).map_err(|e| e.to_status())?;
        if !request.get_ref().serializable {
            self.server.check_not_learner()?;
            self.server.linearizable_barrier().await?;
        }
        // After the barrier, as etcd: a token or permission change applied before the read
        // index is in force for this read.
        let auth = self.auth_info(&request)?;
        let req = request.into_inner();
        self.server
            .auth()
            .check_range_request(auth.as_ref(), &req)?;
        Ok(req)
    }

    /// Range for the direct KV path: a plain range ([`encoded_range::is_plain`]) answered as
    /// its framed gRPC message in chunks, from the key-values as stored; `None` for a request
    /// that is not plain (the caller answers it with [`Kv::range`]).
    pub(crate) async fn range_framed(
        &self,
        request: Request<RangeRequest>,
    ) -> Result<encoded_range::Framed, Status> {
        let req = self.range_allowed(request).await?;
        let server = &self.server;
        match encoded_range::encode(server.store(), &req, |rev| server.header(rev))? {
            Some(framed) => Ok(framed),
            None => Err(Status::resource_exhausted(
                "answer too large for one gRPC message",
            )),
        }
    }
}

#[tonic::async_trait]
impl Kv for Rpc {
    async fn range(
        &self,
        request: Request<RangeRequest>,
    ) -> Result<Response<RangeResponse>, Status> {
        let req = self.range_allowed(request).await?;
        let mut resp = apply::range(self.server.store(), &req)?;
        self.server.fill_header(&mut resp.header);
        Ok(Response::new(resp))
    }

    type RangeStreamStream = RangeStream;

    async fn range_stream(
        &self,
        request: Request<RangeRequest>,
    ) -> Result<Response<RangeStream>, Status> {
        // etcd's stream interceptor refuses a learner every stream but Snapshot, before the
        // handler's checks.
        self.server.check_not_learner()?;
        validate::range_stream(request.get_ref()).map_err(|e| e.to_status())?;
        if !request.get_ref().serializable {
            self.server.linearizable_barrier().await?;
        }
        // After the barrier, and once for the whole stream, as etcd (and as Range).
        let auth = self.auth_info(&request)?;
        let req = request.into_inner();
        self.server
            .auth()
            .check_range_request(auth.as_ref(), &req)?;
        Ok(Response::new(RangeStream::start(self.server.clone(), req)?))
    }

    async fn put(&self, request: Request<PutRequest>) -> Result<Response<PutResponse>, Status> {
        let auth = self.auth_info(&request)?;
        let req = request.into_inner();
        self.server.check_not_learner()?;
        validate::put(&req).map_err(|e| e.to_status())?;
        self.server
            .check_quota((req.key.len() + req.value.len()) as u64)
            .await?;
        let mut resp = self.server.request(req, auth.as_ref()).await?;
        self.server.fill_header(&mut resp.header);
        Ok(Response::new(resp))
    }

    async fn delete_range(
        &self,
        request: Request<DeleteRangeRequest>,
    ) -> Result<Response<DeleteRangeResponse>, Status> {
        let auth = self.auth_info(&request)?;
        let req = request.into_inner();
        self.server.check_not_learner()?;
        validate::delete_range(&req).map_err(|e| e.to_status())?;
        let mut resp = self.server.request(req, auth.as_ref()).await?;
        self.server.fill_header(&mut resp.header);
        Ok(Response::new(resp))
    }

    async fn txn(&self, request: Request<TxnRequest>) -> Result<Response<TxnResponse>, Status> {
        self.server.check_not_learner()?;
        validate::txn(request.get_ref(), self.server.config().max_txn_ops)
            .map_err(|e| e.to_status())?;
        let read_only = apply::txn_is_read_only(request.get_ref());
        if read_only {
            // Checked after the barrier, as a range is.
            self.server.linearizable_barrier().await?;
        }
        let auth = self.auth_info(&request)?;
        let req = request.into_inner();
        if read_only {
            self.server.auth().check_txn(auth.as_ref(), &req)?;
            let mut resp = apply::txn_read(self.server.store(), &req)?;
            self.server.fill_header(&mut resp.header);
            return Ok(Response::new(resp));
        }
        let put_bytes = txn_put_bytes(&req);
        if put_bytes > 0 {
            self.server.check_quota(put_bytes).await?;
        }
        let mut resp = self.server.request(req, auth.as_ref()).await?;
        self.server.fill_header(&mut resp.header);
        Ok(Response::new(resp))
    }

    async fn compact(
        &self,
        request: Request<CompactionRequest>,
    ) -> Result<Response<CompactionResponse>, Status> {
        // Compaction drops history for every client: with auth on, etcd takes it from anyone,
        // even without a token; here the caller must at least be a user.
        let info = self.auth_info(&request)?;
        self.server.auth().check_user(info.as_ref())?;
        let req = request.into_inner();
        self.server.check_not_learner()?;
        let (rev, physical) = (req.revision, req.physical);
        let mut resp = self.server.request(req, None).await?;
        if physical {
            // As etcd: answered once the history is gone from the backend, however long
            // that takes (the client's deadline bounds the wait, no server timeout).
            self.server.wait_compacted(rev).await?;
        }
        self.server.fill_header(&mut resp.header);
        Ok(Response::new(resp))
    }
}
