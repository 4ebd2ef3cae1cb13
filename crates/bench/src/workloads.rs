//! The closed-loop workloads: put, range, txn-put and lease-keepalive. The unary ones go
//! through the lean client of [`crate::grpc`]; lease keep-alive streams through `etcd-client`.

use std::sync::Arc;

use anyhow::{Context, Result};
use etcd_client::{LeaseClient, LeaseKeepAliveStream, LeaseKeeper};
use etcdrs_proto::etcdserverpb::{
    PutRequest, PutResponse, RangeRequest, RangeResponse, RequestOp, TxnRequest, TxnResponse,
    request_op,
};
use etcdrs_proto::keys::prefix_end;
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use tokio::task::JoinSet;

use crate::cli::{Consistency, GlobalOpts, LeaseKeepaliveOpts, PutOpts, RangeOpts, TxnPutOpts};
use crate::driver::{Worker, clients, run_workers, unary_clients};
use crate::grpc::{KV_PUT, KV_RANGE, KV_TXN, Unary};
use crate::keys::{KeyMaker, random_bytes};
use crate::report::Summary;

struct PutWorker {
    kv: Unary,
    keys: Arc<KeyMaker>,
    value: Arc<[u8]>,
    key_space: u64,
    sequential: bool,
    rng: SmallRng,
}

impl Worker for PutWorker {
    async fn call(&mut self, i: u64) -> Result<(), String> {
        let n = if self.sequential {
            i % self.key_space
        } else {
            self.rng.random_range(0..self.key_space)
        };
        let req = PutRequest {
            key: self.keys.key(n),
            value: self.value.to_vec().into(),
            ..Default::default()
        };
        self.kv.call::<_, PutResponse>(&req).await.map(drop)
    }
}

pub async fn put(global: &GlobalOpts, opts: &PutOpts) -> Result<Summary> {
    let keys = Arc::new(KeyMaker::new(opts.key_size, opts.key_space_size)?);
    let value: Arc<[u8]> = random_bytes(opts.val_size).into();
    let workers = unary_clients(global, KV_PUT)
        .await?
        .into_iter()
        .map(|kv| PutWorker {
            kv,
            keys: keys.clone(),
            value: value.clone(),
            key_space: opts.key_space_size,
            sequential: opts.sequential_keys,
            rng: SmallRng::from_rng(&mut rand::rng()),
        })
        .collect();
    let (rec, elapsed) =
        run_workers(workers, global.budget(), opts.rate, global.request_timeout).await;
    Ok(rec.summary("put", elapsed))
}

struct RangeWorker {
    kv: Unary,
    req: Arc<RangeRequest>,
}

impl Worker for RangeWorker {
    async fn call(&mut self, _i: u64) -> Result<(), String> {
        self.kv
            .call::<_, RangeResponse>(self.req.as_ref())
            .await
            .map(drop)
    }
}

pub async fn range(global: &GlobalOpts, opts: &RangeOpts) -> Result<Summary> {
    let mut key = opts.key.as_bytes().to_vec();
    let range_end = match (&opts.end, opts.prefix) {
        (Some(end), _) => end.as_bytes().to_vec(),
        // Every key: etcd's clients send "\0" as both key and end.
        (None, true) if key.is_empty() => {
            key = vec![0];
            vec![0]
        }
        (None, true) => prefix_end(&key),
        (None, false) => Vec::new(),
    };
    let req = Arc::new(RangeRequest {
        key,
        range_end,
        serializable: opts.consistency == Consistency::Serializable,
        ..Default::default()
    });
    let workers = unary_clients(global, KV_RANGE)
        .await?
        .into_iter()
        .map(|kv| RangeWorker {
            kv,
            req: req.clone(),
        })
        .collect();
    let (rec, elapsed) =
        run_workers(workers, global.budget(), opts.rate, global.request_timeout).await;
    let name = match opts.consistency {
        Consistency::Linearizable => "range-linearizable",
        Consistency::Serializable => "range-serializable",
    };
    Ok(rec.summary(name, elapsed))
}

struct TxnPutWorker {
    kv: Unary,
    keys: Arc<KeyMaker>,
    value: Arc<[u8]>,
    ops: u64,
    key_space: u64,
}

impl Worker for TxnPutWorker {
    async fn call(&mut self, i: u64) -> Result<(), String> {
        let success = (0..self.ops)
            .map(|j| {
                let n = (i.wrapping_mul(self.ops).wrapping_add(j)) % self.key_space;
                RequestOp {
                    request: Some(request_op::Request::RequestPut(PutRequest {
                        key: self.keys.key(n),
                        value: self.value.to_vec().into(),
                        ..Default::default()
                    })),
                }
            })
            .collect();
        let req = TxnRequest {
            success,
            ..Default::default()
        };
        self.kv.call::<_, TxnResponse>(&req).await.map(drop)
    }
}

pub async fn txn_put(global: &GlobalOpts, opts: &TxnPutOpts) -> Result<Summary> {
    if opts.txn_ops > opts.key_space_size {
        anyhow::bail!(
            "expected --txn-ops no larger than --key-space-size, got txn-ops({}) key-space-size({})",
            opts.txn_ops,
            opts.key_space_size
        );
    }
    let keys = Arc::new(KeyMaker::new(opts.key_size, opts.key_space_size)?);
    let value: Arc<[u8]> = random_bytes(opts.val_size).into();
    let workers = unary_clients(global, KV_TXN)
        .await?
        .into_iter()
        .map(|kv| TxnPutWorker {
            kv,
            keys: keys.clone(),
            value: value.clone(),
            ops: opts.txn_ops,
            key_space: opts.key_space_size,
        })
        .collect();
    let (rec, elapsed) =
        run_workers(workers, global.budget(), opts.rate, global.request_timeout).await;
    Ok(rec.summary("txn-put", elapsed))
}

/// One lease per client, kept alive over one LeaseKeepAlive stream: each request is a
/// keep-alive sent and its response received.
struct LeaseWorker {
    keeper: LeaseKeeper,
    stream: LeaseKeepAliveStream,
}

impl Worker for LeaseWorker {
    async fn call(&mut self, _i: u64) -> Result<(), String> {
        self.keeper.keep_alive().await.map_err(|e| e.to_string())?;
        match self.stream.message().await {
            Ok(Some(resp)) if resp.ttl() > 0 => Ok(()),
            Ok(Some(_)) => Err("lease not found (keep-alive TTL <= 0)".to_owned()),
            Ok(None) => Err("keep-alive stream closed".to_owned()),
            Err(e) => Err(e.to_string()),
        }
    }
}

async fn lease_worker(mut lease: LeaseClient, ttl: i64) -> Result<LeaseWorker> {
    let id = lease
        .grant(ttl, None)
        .await
        .context("granting a lease")?
        .id();
    let (keeper, stream) = lease
        .keep_alive(id)
        .await
        .context("opening a keep-alive stream")?;
    Ok(LeaseWorker { keeper, stream })
}

pub async fn lease_keepalive(global: &GlobalOpts, opts: &LeaseKeepaliveOpts) -> Result<Summary> {
    let mut set = JoinSet::new();
    for c in clients(global).await? {
        let ttl = opts.ttl;
        let timeout = global.request_timeout;
        set.spawn(async move {
            tokio::time::timeout(timeout, lease_worker(c.lease_client(), ttl))
                .await
                .context("lease setup timed out")?
        });
    }
    let mut workers = Vec::new();
    while let Some(res) = set.join_next().await {
        workers.push(res.context("lease setup task")??);
    }
    let (rec, elapsed) = run_workers(workers, global.budget(), 0, global.request_timeout).await;
    Ok(rec.summary("lease-keepalive", elapsed))
}
