//! etcd's require-leader contract for gRPC requests (etcd `v3rpc/interceptor.go`).
//!
//! A client that sends the metadata `hasleader: true` (Go `clientv3.WithRequireLeader`, which
//! kube-apiserver uses for its watches) asks not to be served by a member that is cut off
//! from its cluster:
//! - a request or stream that starts while the member knows no leader is refused with
//!   `etcdserver: no leader` (Unavailable);
//! - a stream already open is ended with that error once the member has had no leader for
//!   [`NO_LEADER_TIMEOUTS`] election timeouts in a row (etcd is patient with open streams:
//!   reconnecting costs more than refusing a new request).
//!
//! Both the server and the gRPC proxy serve this contract; each supplies a [`LeaderSource`]
//! (the proxy learns about leader loss from a watch of its own). [`require_leader`] is the
//! axum middleware; the stream part wraps the response body so that it ends with the error
//! in its trailers, which is how a gRPC status reaches a client mid-stream.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::extract::{Request, State};
use axum::http::{HeaderMap, HeaderValue};
use axum::middleware::Next;
use axum::response::Response;
use etcdrs_proto::rpctypes;
use http_body::Frame;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

/// The metadata key and value of etcd's require-leader option.
pub const REQUIRE_LEADER_KEY: &str = "hasleader";
/// See [`REQUIRE_LEADER_KEY`].
pub const HAS_LEADER: &str = "true";
/// Election timeouts without a leader before open streams are ended (etcd's `maxNoLeaderCnt`).
pub const NO_LEADER_TIMEOUTS: u32 = 3;

/// Where [`require_leader`] learns whether there is a leader.
pub trait LeaderSource: Send + Sync + 'static {
    /// Whether a leader is known now.
    fn has_leader(&self) -> bool;
    /// Changes each time open require-leader streams must end (see [`LeaderLoss`]).
    fn losses(&self) -> watch::Receiver<u64>;
}

/// Counts leader losses: [`LeaderLoss::observe`] is called once per election timeout with
/// whether a leader is known, and after [`NO_LEADER_TIMEOUTS`] observations without one, every
/// observation without a leader ends the open streams.
pub struct LeaderLoss {
    tx: watch::Sender<u64>,
    leaderless: u32,
}

impl Default for LeaderLoss {
    fn default() -> Self {
        LeaderLoss {
            tx: watch::channel(0).0,
            leaderless: 0,
        }
    }
}

impl LeaderLoss {
    /// A receiver for [`LeaderSource::losses`].
    pub fn subscribe(&self) -> watch::Receiver<u64> {
        self.tx.subscribe()
    }

    /// One election timeout passed; `has_leader` is what was seen at its end.
    pub fn observe(&mut self, has_leader: bool) {
        if has_leader {
            self.leaderless = 0;
            return;
        }
        self.leaderless = self.leaderless.saturating_add(1);
        if self.leaderless >= NO_LEADER_TIMEOUTS {
            self.tx.send_modify(|n| *n += 1);
        }
    }

    /// Ends the open streams now (the proxy's own watch saw the cluster lose its leader).
    pub fn lost(&self) {
        self.tx.send_modify(|n| *n += 1);
    }

    /// Observes `source` every `election` until `stop` (task "leader monitor").
    pub async fn monitor(
        mut self,
        election: Duration,
        has_leader: impl Fn() -> bool,
        stop: CancellationToken,
    ) {
        loop {
            tokio::select! {
                _ = stop.cancelled() => return,
                _ = tokio::time::sleep(election) => self.observe(has_leader()),
            }
        }
    }
}

/// Whether the request asks for a leader (`hasleader: true`).
pub fn requires_leader(headers: &HeaderMap) -> bool {
    headers
        .get(REQUIRE_LEADER_KEY)
        .is_some_and(|v| v.as_bytes() == HAS_LEADER.as_bytes())
}

/// The gRPC methods that stream responses: these are ended when the leader is lost.
fn is_streaming(path: &str) -> bool {
    matches!(
        path,
        "/etcdserverpb.Watch/Watch"
            | "/etcdserverpb.Lease/LeaseKeepAlive"
            | "/etcdserverpb.Maintenance/Snapshot"
            | "/v3electionpb.Election/Observe"
    )
}

/// axum middleware: etcd's require-leader checks (see the module docs).
pub async fn require_leader(
    State(source): State<Arc<dyn LeaderSource>>,
    request: Request,
    next: Next,
) -> Response {
    if !requires_leader(request.headers()) {
        return next.run(request).await;
    }
    if !source.has_leader() {
        return no_leader_status().into_http();
    }
    if !is_streaming(request.uri().path()) {
        return next.run(request).await;
    }
    let mut losses = source.losses();
    losses.mark_unchanged();
    let response = next.run(request).await;
    let lost: LostFuture = Box::pin(async move {
        if losses.changed().await.is_err() {
            // The source is gone (shutting down): the stream ends some other way.
            std::future::pending::<()>().await;
        }
    });
    response.map(|inner| {
        Body::new(LeaderBound {
            inner,
            lost,
            ended: false,
        })
    })
}

fn no_leader_status() -> tonic::Status {
    tonic::Status::new(rpctypes::NO_LEADER.code, rpctypes::NO_LEADER.message)
}

type LostFuture = Pin<Box<dyn Future<Output = ()> + Send>>;

/// A streaming response body that ends with `etcdserver: no leader` when the leader is lost.
struct LeaderBound {
    inner: Body,
    lost: LostFuture,
    ended: bool,
}

impl http_body::Body for LeaderBound {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        if self.ended {
            return Poll::Ready(None);
        }
        if self.lost.as_mut().poll(cx).is_ready() {
            self.ended = true;
            let status = no_leader_status();
            let mut trailers = HeaderMap::new();
            trailers.insert("grpc-status", HeaderValue::from(status.code() as i32));
            if let Ok(message) = HeaderValue::from_str(status.message()) {
                trailers.insert("grpc-message", message);
            }
            return Poll::Ready(Some(Ok(Frame::trailers(trailers))));
        }
        let polled = Pin::new(&mut self.inner).poll_frame(cx);
        if let Poll::Ready(None) = polled {
            self.ended = true;
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.ended
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn streams_end_after_three_leaderless_timeouts_in_a_row() {
        let mut loss = LeaderLoss::default();
        let rx = loss.subscribe();
        loss.observe(false);
        loss.observe(false);
        loss.observe(true);
        loss.observe(false);
        loss.observe(false);
        assert_eq!(*rx.borrow(), 0);
        loss.observe(false);
        assert_eq!(*rx.borrow(), 1);
        loss.observe(false);
        assert_eq!(*rx.borrow(), 2);
    }

    #[test]
    fn only_hasleader_true_requires_a_leader() {
        let mut headers = HeaderMap::new();
        assert!(!requires_leader(&headers));
        headers.insert(REQUIRE_LEADER_KEY, HeaderValue::from_static("false"));
        assert!(!requires_leader(&headers));
        headers.insert(REQUIRE_LEADER_KEY, HeaderValue::from_static("true"));
        assert!(requires_leader(&headers));
    }
}
