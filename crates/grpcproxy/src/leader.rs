//! Whether the cluster has a leader, as the proxy sees it (etcd `grpcproxy/leader.go`), for
//! etcd's require-leader contract (`etcdrs_serve::leader`) on the proxy's own listener.
//!
//! The proxy's watches on the cluster are shared by many clients, so a client's `hasleader`
//! cannot ride along on them. Instead, task `grpc-proxy leader monitor` keeps one watch of its
//! own on the cluster, opened with `hasleader: true` on the key etcd's proxy uses
//! (`__lostleader`): the member ends it with "etcdserver: no leader" once it has lost its
//! leader. The monitor then moves to another endpoint; only when every endpoint in turn has
//! failed does the proxy consider the leader lost: it refuses new require-leader requests and
//! ends the open require-leader streams (a client is not told about a member the proxy can
//! leave for another). The proxy's own cluster streams also ask for a leader, so they move
//! away from a member that lost its quorum instead of stalling there.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use etcdrs_proto::etcdserverpb::watch_client::WatchClient;
use etcdrs_proto::etcdserverpb::{WatchCreateRequest, WatchRequest, watch_request};
use etcdrs_serve::leader::{HAS_LEADER, LeaderLoss, LeaderSource, REQUIRE_LEADER_KEY};
use futures::StreamExt;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tonic::Request;
use tonic::metadata::MetadataValue;

use crate::upstream::Upstream;

/// The key the monitor watches (etcd's proxy watches the same one).
const LOST_LEADER_KEY: &[u8] = b"__lostleader";
/// Pause between attempts, so a cluster without a leader is asked at most 10 times a second
/// (etcd's proxy: `retryPerSecond`).
const RETRY: Duration = Duration::from_millis(100);

/// The proxy's view of the cluster's leader.
pub struct ProxyLeader {
    has_leader: AtomicBool,
    loss: LeaderLoss,
}

impl LeaderSource for ProxyLeader {
    fn has_leader(&self) -> bool {
        self.has_leader.load(Ordering::Acquire)
    }

    fn losses(&self) -> watch::Receiver<u64> {
        self.loss.subscribe()
    }
}

impl ProxyLeader {
    /// A leader is assumed until the monitor learns otherwise.
    pub fn new() -> Arc<Self> {
        Arc::new(ProxyLeader {
            has_leader: AtomicBool::new(true),
            loss: LeaderLoss::default(),
        })
    }

    fn set(&self, has_leader: bool) {
        let had = self.has_leader.swap(has_leader, Ordering::AcqRel);
        if had && !has_leader {
            tracing::warn!("gRPC proxy lost the cluster's leader on every endpoint");
            self.loss.lost();
        } else if !had && has_leader {
            tracing::info!("gRPC proxy found the cluster's leader again");
        }
    }

    /// Task `grpc-proxy leader monitor` (see the module docs), until `stop`.
    pub async fn monitor(self: Arc<Self>, upstream: Upstream, stop: CancellationToken) {
        let mut failures = 0usize;
        loop {
            let (idx, channel) = upstream.current();
            let mut client = WatchClient::new(channel);
            let create = WatchRequest {
                request_union: Some(watch_request::RequestUnion::CreateRequest(
                    WatchCreateRequest {
                        key: LOST_LEADER_KEY.to_vec(),
                        ..Default::default()
                    },
                )),
            };
            // The request side stays open: closing it would end the watch.
            let requests = futures::stream::iter([create]).chain(futures::stream::pending());
            let request = require_leader(Request::new(requests));
            let watched = async {
                let mut stream = client.watch(request).await?.into_inner();
                // Created: the member has a leader.
                if stream.message().await?.is_some() {
                    self.set(true);
                    failures = 0;
                    // Events on the key do not matter; the stream's end does.
                    while stream.message().await?.is_some() {}
                }
                Ok::<(), tonic::Status>(())
            };
            let ended = tokio::select! {
                _ = stop.cancelled() => return,
                ended = watched => ended,
            };
            if let Err(status) = &ended {
                tracing::debug!(error = %status.message(), "gRPC proxy leader watch ended");
            }
            upstream.failed(idx);
            failures += 1;
            if failures >= upstream.len() {
                self.set(false);
                failures = 0;
            }
            tokio::select! {
                _ = stop.cancelled() => return,
                _ = tokio::time::sleep(RETRY) => {}
            }
        }
    }
}

/// `request` with etcd's require-leader metadata.
pub fn require_leader<M>(mut request: Request<M>) -> Request<M> {
    request
        .metadata_mut()
        .insert(REQUIRE_LEADER_KEY, MetadataValue::from_static(HAS_LEADER));
    request
}
