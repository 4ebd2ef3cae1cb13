//! The proxy's listeners: gRPC and HTTP/1.1 (`/health`, `/metrics` relayed from a member,
//! `/proxy/health`, `/proxy/metrics` with the proxy's own series) on one port, plain or TLS
//! (etcd's cmux on the grpc-proxy listener), and the HTTP-only `--metrics-addr` listener.
//!
//! [`Front`] is what a connection serves: it answers a cached serializable range before any
//! routing or gRPC machinery (the request's one message decoded, the cache's encoded response
//! sent as it is), and hands every other request, and every range the cache cannot answer, to
//! the router with its body intact.
//!
//! The HTTP/2 streams of a connection run on that connection's own task ([`StreamExecutor`]),
//! not one task each: a response is written with the others that are ready, in one write,
//! without a wake-up of another thread between a stream and its connection.

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use axum::Router;
use axum::http::{Method, StatusCode, Version, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use etcdrs_proto::etcdserverpb::RangeRequest;
use etcdrs_proto::etcdserverpb::auth_server::AuthServer;
use etcdrs_proto::etcdserverpb::cluster_server::ClusterServer;
use etcdrs_proto::etcdserverpb::kv_client::KvClient;
use etcdrs_proto::etcdserverpb::kv_server::KvServer;
use etcdrs_proto::etcdserverpb::lease_server::LeaseServer;
use etcdrs_proto::etcdserverpb::maintenance_server::MaintenanceServer;
use etcdrs_proto::fanout::watch_server::WatchServer;
use etcdrs_proto::v3electionpb::election_server::ElectionServer;
use etcdrs_proto::v3lockpb::lock_server::LockServer;
use etcdrs_serve::grpc_metrics::wire::{CountGrpc, Counted};
use etcdrs_serve::h2authority::LenientAuthority;
use etcdrs_serve::keepalive::Policed;
use etcdrs_serve::leader::LeaderSource;
use etcdrs_serve::listener::{Handler, Peer};
use etcdrs_serve::unary;
use futures::StreamExt;
use futures::stream::FuturesUnordered;
use futures::task::AtomicWaker;
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use hyper_util::server::graceful::Watcher;
use hyper_util::service::TowerToHyperService;
use prost::Message;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use crate::Proxy;
use crate::kv::KvProxy;
use crate::metrics::Metrics;
use crate::upstream::Upstream;

/// Bytes h2 may buffer per stream for a client that is slower than we produce.
const SEND_BUFFER_BYTES: usize = 64 * 1024;

/// The router of the main listener: every v3 service plus the HTTP endpoints.
pub fn router(proxy: &Proxy) -> Router {
    let max_recv = proxy.max_recv_bytes;
    let max_send = proxy.max_send_bytes;
    macro_rules! svc {
        ($server:ident, $inner:expr) => {
            $server::new($inner)
                .max_decoding_message_size(max_recv)
                .max_encoding_message_size(max_send)
        };
    }
    let grpc = tonic::service::Routes::new(svc!(KvServer, proxy.kv.clone()))
        .add_service(svc!(WatchServer, proxy.watch.clone()))
        .add_service(svc!(LeaseServer, proxy.lease.clone()))
        .add_service(svc!(ClusterServer, proxy.cluster.clone()))
        .add_service(svc!(MaintenanceServer, proxy.passthrough.clone()))
        .add_service(svc!(AuthServer, proxy.passthrough.clone()))
        .add_service(svc!(LockServer, proxy.passthrough.clone()))
        .add_service(svc!(ElectionServer, proxy.passthrough.clone()))
        .prepare()
        .into_axum_router()
        .layer(axum::middleware::from_fn_with_state(
            proxy.leader.clone() as Arc<dyn LeaderSource>,
            etcdrs_serve::leader::require_leader,
        ))
        .layer(axum::middleware::map_response(
            etcdrs_serve::grpc_size::grpc_size_error,
        ));
    grpc.merge(http_router(proxy))
        .fallback(etcdrs_serve::not_found)
}

/// The main listener's [`Front`]: the router, with the cached-range path in front of it.
pub fn front(proxy: &Proxy) -> Front {
    Front(Arc::new(FrontInner {
        router: router(proxy),
        kv: Some(proxy.kv.clone()),
        max_recv: proxy.max_recv_bytes,
    }))
}

/// The gRPC path of KV.Range.
const RANGE_PATH: &str = "/etcdserverpb.KV/Range";

/// What a connection serves. Cheap to clone.
#[derive(Clone)]
pub struct Front(Arc<FrontInner>);

struct FrontInner {
    router: Router,
    /// Where cached ranges come from; `None`: no fast path.
    kv: Option<KvProxy>,
    /// `--max-recv-bytes`: a larger request message goes to the router, which refuses it.
    max_recv: usize,
}

impl From<Router> for Front {
    fn from(router: Router) -> Front {
        Front(Arc::new(FrontInner {
            router,
            kv: None,
            max_recv: 0,
        }))
    }
}

/// Header names the fast path reads.
const GRPC_ENCODING: header::HeaderName = header::HeaderName::from_static("grpc-encoding");
const TOKEN: header::HeaderName = header::HeaderName::from_static("token");

/// Whether `req` is a gRPC KV.Range the fast path may read: HTTP/2, uncompressed, and not
/// asking for a leader (the router's require-leader check answers those).
fn plain_grpc_range<B>(req: &axum::http::Request<B>) -> bool {
    let headers = req.headers();
    req.uri().path() == RANGE_PATH
        && !etcdrs_serve::leader::requires_leader(headers)
        && req.method() == Method::POST
        && req.version() == Version::HTTP_2
        && headers.get(header::CONTENT_TYPE).is_some_and(|v| {
            let v = v.as_bytes();
            v.starts_with(b"application/grpc") && !v.starts_with(b"application/grpc-web")
        })
        && headers
            .get(GRPC_ENCODING)
            .is_none_or(|v| v.as_bytes() == b"identity")
}

/// A request as [`Front`] gets it: its body's gRPC messages are counted as they are read.
type FrontRequest = axum::http::Request<Counted<Incoming>>;

impl tower::Service<FrontRequest> for Front {
    type Response = Response;
    type Error = Infallible;
    type Future = Pin<Box<dyn Future<Output = Result<Response, Infallible>> + Send>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: FrontRequest) -> Self::Future {
        let inner = self.0.clone();
        if inner.kv.is_some() && plain_grpc_range(&req) {
            return Box::pin(fast_range(inner, req));
        }
        Box::pin(tower::ServiceExt::oneshot(inner.router.clone(), req))
    }
}

/// A range through the cache: its message read whole (up to `max_recv`), answered from the
/// cache when it holds the answer, else handed to the router with the bytes read so far
/// (`etcdrs_serve::unary`).
async fn fast_range(inner: Arc<FrontInner>, req: FrontRequest) -> Result<Response, Infallible> {
    let (parts, body) = req.into_parts();
    let body = unary::read_whole(body, inner.max_recv.saturating_add(unary::PREFIX)).await;
    let message = body
        .whole()
        .and_then(|whole| unary::one_message(&whole, inner.max_recv));
    if let (Some(message), Some(kv)) = (message, &inner.kv)
        && let Ok(range) = RangeRequest::decode(message)
    {
        let token = parts
            .headers
            .get(TOKEN)
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default();
        if let Some(wire) = kv.cached_range(token, range) {
            return Ok(unary::answer(wire));
        }
    }
    let req = axum::http::Request::from_parts(parts, axum::body::Body::new(body));
    // Boxed: the router's future is large, and this one's state stays small for the hits.
    Box::pin(tower::ServiceExt::oneshot(inner.router.clone(), req)).await
}

/// The HTTP endpoints: `/health` (also as `/proxy/health`), `/metrics` (a member's, relayed,
/// as etcd's proxy does) and `/proxy/metrics` (the proxy's own series, etcd 3.5).
pub fn http_router(proxy: &Proxy) -> Router {
    let state = HttpState {
        upstream: proxy.upstream.clone(),
        metrics: proxy.metrics.clone(),
    };
    Router::new()
        .route("/health", get(health))
        .route("/proxy/health", get(health))
        .route("/metrics", get(member_metrics))
        .route("/proxy/metrics", get(metrics))
        .with_state(state)
}

#[derive(Clone)]
struct HttpState {
    upstream: Upstream,
    metrics: Metrics,
}

/// Healthy when the cluster answers a read through the proxy (a permission error counts:
/// the cluster answered), as etcd's proxy checks.
async fn health(axum::extract::State(state): axum::extract::State<HttpState>) -> Response {
    let req = RangeRequest {
        key: b"health".to_vec(),
        ..Default::default()
    };
    let read = state.upstream.unary(|ch| {
        let req = req.clone();
        async move { KvClient::new(ch).range(req).await }
    });
    let result = tokio::time::timeout(Duration::from_secs(5), read).await;
    let (healthy, reason) = match result {
        Ok(Ok(_)) => (true, String::new()),
        Ok(Err(status)) if status.code() == tonic::Code::PermissionDenied => (true, String::new()),
        Ok(Err(status)) => (false, format!("RANGE ERROR:{}", status.message())),
        Err(_) => (false, "RANGE ERROR:context deadline exceeded".to_owned()),
    };
    let body =
        serde_json::json!({ "health": if healthy { "true" } else { "false" }, "reason": reason })
            .to_string();
    let status = if healthy {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    (
        status,
        [(header::CONTENT_TYPE, "text/plain; charset=utf-8")],
        body,
    )
        .into_response()
}

/// `/metrics`: the current endpoint's `/metrics`, as it answered (etcd's `HandleMetrics`).
async fn member_metrics(axum::extract::State(state): axum::extract::State<HttpState>) -> Response {
    match state.upstream.http_get("/metrics").await {
        Ok((_, body)) => {
            ([(header::CONTENT_TYPE, "text/plain; version=0.0.4")], body).into_response()
        }
        Err(e) => {
            tracing::warn!(error = %e, "failed to fetch a member's metrics");
            (
                StatusCode::INTERNAL_SERVER_ERROR,
                [
                    (header::CONTENT_TYPE, "text/plain; charset=utf-8"),
                    (header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
                ],
                "Internal server error\n",
            )
                .into_response()
        }
    }
}

/// `/proxy/metrics`: the proxy's own series.
async fn metrics(axum::extract::State(state): axum::extract::State<HttpState>) -> Response {
    (
        [(
            header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        state.metrics.render(),
    )
        .into_response()
}

/// A stream's future, as hyper hands it over.
type StreamFuture = Pin<Box<dyn Future<Output = ()> + Send>>;

/// Runs the HTTP/2 streams hyper starts on one connection inside that connection's task
/// ([`drive`]): `execute` queues a stream and wakes the task.
#[derive(Clone, Default)]
struct StreamExecutor(Arc<StreamQueue>);

#[derive(Default)]
struct StreamQueue {
    /// Streams started since the task last looked (as many as the client's concurrent
    /// streams allow: `--max-concurrent-streams` bounds them).
    new: parking_lot::Mutex<Vec<StreamFuture>>,
    /// The connection's task.
    task: AtomicWaker,
}

impl<F: Future<Output = ()> + Send + 'static> hyper::rt::Executor<F> for StreamExecutor {
    fn execute(&self, stream: F) {
        self.0.new.lock().push(Box::pin(stream));
        self.0.task.wake();
    }
}

/// Drives `conn` and the streams it starts on `executor` until the connection ends (streams
/// still running then have lost their connection and are dropped).
async fn drive<C: Future>(conn: C, executor: StreamExecutor) {
    let queue = executor.0;
    let mut conn = std::pin::pin!(conn);
    let mut streams = FuturesUnordered::<StreamFuture>::new();
    std::future::poll_fn(|cx| {
        queue.task.register(cx.waker());
        // Read what arrived, and write what the streams produced last time round.
        if conn.as_mut().poll(cx).is_ready() {
            return Poll::Ready(());
        }
        loop {
            streams.extend(queue.new.lock().drain(..));
            // Every stream that can make progress does; FuturesUnordered yields on its own
            // after a round over all of them.
            while let Poll::Ready(Some(())) = streams.poll_next_unpin(cx) {}
            if queue.new.lock().is_empty() {
                break;
            }
        }
        // The streams' frames: written now rather than on the next wake-up.
        if conn.as_mut().poll(cx).is_ready() {
            return Poll::Ready(());
        }
        Poll::Pending
    })
    .await
}

/// A connection's byte stream, offering no vectored writes. h2 copies a DATA payload into its
/// write buffer up to 1 KiB with plain writes but only up to 256 bytes with vectored ones, and
/// a payload it does not copy ends the buffer: a typical small response (a range of one key
/// with its value) would then cost one `writev` each, where copying lets one write carry all
/// the responses that are ready.
///
/// The first write after new input first yields once to the other tasks that are ready: the
/// other connections' requests are read and answered before this answer is sent, so the
/// answers to a client with many connections leave back to back. On loopback, a write to a
/// peer that sleeps in `epoll_wait` pays for waking it (an inter-processor interrupt, costly
/// in a VM); one wake-up then serves many connections instead of one each. Never two yields
/// in a row: input that keeps arriving cannot hold answers back.
struct Unvectored<T> {
    io: T,
    /// Input arrived since the last write: the next write yields first.
    fresh_input: bool,
    /// The last write attempt yielded: the next one writes.
    yielded: bool,
}

impl<T> Unvectored<T> {
    fn new(io: T) -> Self {
        Unvectored {
            io,
            fresh_input: false,
            yielded: false,
        }
    }
}

impl<T: tokio::io::AsyncRead + Unpin> tokio::io::AsyncRead for Unvectored<T> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let before = buf.filled().len();
        let polled = Pin::new(&mut self.io).poll_read(cx, buf);
        if buf.filled().len() > before {
            self.fresh_input = true;
        }
        polled
    }
}

impl<T: tokio::io::AsyncWrite + Unpin> tokio::io::AsyncWrite for Unvectored<T> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        if self.fresh_input && !self.yielded {
            self.fresh_input = false;
            self.yielded = true;
            cx.waker().wake_by_ref();
            return Poll::Pending;
        }
        let written = Pin::new(&mut self.io).poll_write(cx, buf);
        if let Poll::Ready(Ok(_)) = written {
            self.fresh_input = false;
            self.yielded = false;
        }
        written
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.io).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.io).poll_shutdown(cx)
    }
}

/// HTTP/1.1 and HTTP/2 (by preface) for one connection whose streams run on `executor`.
fn http_builder(
    executor: StreamExecutor,
    max_concurrent_streams: u32,
) -> hyper_util::server::conn::auto::Builder<StreamExecutor> {
    let mut builder = hyper_util::server::conn::auto::Builder::new(executor);
    // h2 buffers up to this much of a stream's responses beyond the client's flow-control
    // window; watch streams are already bounded by their own queues, so keep this small.
    // No `date` on HTTP/2 responses: gRPC answers carry none from an etcd member (grpc-go
    // sends none), and it is a header to build and encode for every cached read.
    builder
        .http2()
        .max_concurrent_streams(max_concurrent_streams)
        .max_send_buf_size(SEND_BUFFER_BYTES)
        .auto_date_header(false);
    builder
}

/// Serves `front` on `listener` until `shutdown`, HTTP/1.1 and HTTP/2 on one port, through
/// TLS when `tls` is set (the accept loop, handshake and shutdown are `etcdrs_serve`'s).
pub async fn serve(
    front: impl Into<Front>,
    listener: TcpListener,
    tls: Option<Arc<rustls::ServerConfig>>,
    max_concurrent_streams: u32,
    shutdown: CancellationToken,
) {
    let handler = Connections {
        front: front.into(),
        max_concurrent_streams,
    };
    let acceptor = tls.map(|config| {
        Arc::new(tokio_rustls::TlsAcceptor::from(config))
            as Arc<dyn etcdrs_serve::listener::Acceptor>
    });
    etcdrs_serve::listener::serve(
        listener,
        acceptor,
        handler,
        etcdrs_serve::listener::Admission::Capped,
        shutdown,
    )
    .await;
}

/// What a proxy listener serves on each connection: [`Front`], with the connection's
/// streams on the connection's own task and writes through [`Unvectored`].
#[derive(Clone)]
struct Connections {
    front: Front,
    max_concurrent_streams: u32,
}

impl Handler for Connections {
    fn serve<IO>(
        self,
        io: LenientAuthority<Policed<IO>>,
        _peer: Peer,
        watcher: Watcher,
    ) -> impl Future<Output = ()> + Send
    where
        IO: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
    {
        // gRPC calls are counted around everything, the cached ranges too (etcd's proxy
        // counts its calls with go-grpc-prometheus's interceptors).
        let service = TowerToHyperService::new(CountGrpc::new(self.front));
        let executor = StreamExecutor::default();
        let builder = http_builder(executor.clone(), self.max_concurrent_streams);
        let io = TokioIo::new(Unvectored::new(io));
        let conn = builder
            .serve_connection_with_upgrades(io, service)
            .into_owned();
        drive(watcher.watch(conn), executor)
    }
}

#[cfg(test)]
mod tests {
    use std::task::{Context, Poll, Waker};

    use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt, ReadBuf};

    use super::*;

    fn read(io: &mut Unvectored<tokio::io::DuplexStream>, cx: &mut Context<'_>) -> usize {
        let mut buf = [0u8; 64];
        let mut rb = ReadBuf::new(&mut buf);
        match Pin::new(io).poll_read(cx, &mut rb) {
            Poll::Ready(Ok(())) => rb.filled().len(),
            other => panic!("read: {other:?}"),
        }
    }

    fn write(io: &mut Unvectored<tokio::io::DuplexStream>, cx: &mut Context<'_>) -> Poll<usize> {
        match Pin::new(io).poll_write(cx, b"answer") {
            Poll::Ready(Ok(n)) => Poll::Ready(n),
            Poll::Ready(Err(e)) => panic!("write: {e}"),
            Poll::Pending => Poll::Pending,
        }
    }

    #[tokio::test]
    async fn the_first_write_after_input_yields_once_and_never_twice_in_a_row() {
        let (ours, mut peer) = tokio::io::duplex(1024);
        let mut io = Unvectored::new(ours);
        let mut cx = Context::from_waker(Waker::noop());

        // No input yet: writes go straight through.
        assert_eq!(write(&mut io, &mut cx), Poll::Ready(6));

        // Input arrived: the next write yields once, then writes.
        peer.write_all(b"request").await.expect("peer writes");
        assert_eq!(read(&mut io, &mut cx), 7);
        assert_eq!(write(&mut io, &mut cx), Poll::Pending);
        assert_eq!(write(&mut io, &mut cx), Poll::Ready(6));
        assert_eq!(write(&mut io, &mut cx), Poll::Ready(6));

        // Input before every write attempt: every other attempt writes.
        for _ in 0..3 {
            peer.write_all(b"more").await.expect("peer writes");
            assert_eq!(read(&mut io, &mut cx), 4);
            assert_eq!(write(&mut io, &mut cx), Poll::Pending);
            peer.write_all(b"more").await.expect("peer writes");
            assert_eq!(read(&mut io, &mut cx), 4);
            assert_eq!(write(&mut io, &mut cx), Poll::Ready(6));
        }
    }
}
