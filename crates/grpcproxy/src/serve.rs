//! The proxy's listeners: gRPC and HTTP/1.1 (`/health`, `/metrics`, and their `/proxy/...`
//! aliases) on one port, plain or TLS (etcd's cmux on the grpc-proxy listener), and the
//! HTTP-only `--metrics-addr` listener.

use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::http::{StatusCode, header};
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
use etcdrs_server::h2authority::LenientAuthority;
use etcdrs_server::leader::LeaderSource;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::service::TowerToHyperService;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use crate::Proxy;
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
            etcdrs_server::leader::require_leader,
        ));
    grpc.merge(http_router(proxy)).fallback(not_found)
}

/// The HTTP endpoints: `/health` and `/metrics` (also as `/proxy/health`, `/proxy/metrics`).
pub fn http_router(proxy: &Proxy) -> Router {
    let state = HttpState {
        upstream: proxy.upstream.clone(),
        metrics: proxy.metrics.clone(),
    };
    Router::new()
        .route("/health", get(health))
        .route("/proxy/health", get(health))
        .route("/metrics", get(metrics))
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

/// Unknown paths: gRPC's "unimplemented" for gRPC requests, Go's plain 404 for the rest.
async fn not_found(request: axum::extract::Request) -> Response {
    let is_grpc = request
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("application/grpc"));
    if is_grpc {
        return tonic::Status::unimplemented(format!("unknown service {}", request.uri().path()))
            .into_http();
    }
    (
        StatusCode::NOT_FOUND,
        [(header::CONTENT_TYPE, "text/plain; charset=utf-8")],
        "404 page not found\n",
    )
        .into_response()
}

/// Serves `router` on `listener` until `shutdown`, HTTP/1.1 and HTTP/2 on one port, through
/// TLS when `tls` is set. Each connection is a task of this function's own set; on shutdown
/// connections get a graceful close and a short grace period.
pub async fn serve(
    router: Router,
    listener: TcpListener,
    tls: Option<Arc<rustls::ServerConfig>>,
    max_concurrent_streams: u32,
    shutdown: CancellationToken,
) {
    let mut builder = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new());
    // h2 buffers up to this much of a stream's responses beyond the client's flow-control
    // window; watch streams are already bounded by their own queues, so keep this small.
    builder
        .http2()
        .max_concurrent_streams(max_concurrent_streams)
        .max_send_buf_size(SEND_BUFFER_BYTES);
    let graceful = hyper_util::server::graceful::GracefulShutdown::new();
    let acceptor = tls.map(tokio_rustls::TlsAcceptor::from);
    let mut connections = tokio::task::JoinSet::new();
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => break,
            Some(_) = connections.join_next(), if !connections.is_empty() => {}
            accepted = listener.accept() => {
                let (tcp, _peer) = match accepted {
                    Ok(conn) => conn,
                    Err(e) => {
                        tracing::warn!(error = %e, "failed to accept gRPC proxy client connection");
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        continue;
                    }
                };
                let _ = tcp.set_nodelay(true);
                let service = TowerToHyperService::new(router.clone());
                match &acceptor {
                    None => {
                        // etcd 3.4's etcdctl sends a URL as `:authority`: see h2authority.
                        let io = TokioIo::new(LenientAuthority::new(tcp));
                        let conn = builder.serve_connection_with_upgrades(io, service).into_owned();
                        let conn = graceful.watch(conn);
                        // Task: one client connection.
                        connections.spawn(async move {
                            let _ = conn.await;
                        });
                    }
                    Some(acceptor) => {
                        let acceptor = acceptor.clone();
                        let builder = builder.clone();
                        let watcher = graceful.watcher();
                        // Task: one client connection (TLS handshake, then HTTP).
                        connections.spawn(async move {
                            let handshake = tokio::time::timeout(Duration::from_secs(10), acceptor.accept(tcp)).await;
                            let Ok(Ok(stream)) = handshake else {
                                return;
                            };
                            let io = TokioIo::new(LenientAuthority::new(stream));
                            let conn = builder.serve_connection_with_upgrades(io, service).into_owned();
                            let _ = watcher.watch(conn).await;
                        });
                    }
                }
            }
        }
    }
    drop(listener);
    if tokio::time::timeout(Duration::from_secs(2), graceful.shutdown())
        .await
        .is_err()
    {
        connections.abort_all();
    }
}
