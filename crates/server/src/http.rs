//! The client port: gRPC and etcd's plain HTTP endpoints (`/health`, `/version`, `/metrics`)
//! served on one listener, as etcd's cmux does (etcd `embed/serve.go`).

use std::time::Duration;

use axum::Router;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::IntoResponse;
use axum::routing::get;
use etcdrs_proto::etcdserverpb::cluster_server::ClusterServer;
use etcdrs_proto::etcdserverpb::kv_server::KvServer;
use etcdrs_proto::etcdserverpb::lease_server::LeaseServer;
use etcdrs_proto::etcdserverpb::maintenance_server::MaintenanceServer;
use etcdrs_proto::etcdserverpb::watch_server::WatchServer;
use etcdrs_proto::v3electionpb::election_server::ElectionServer;
use etcdrs_proto::v3lockpb::lock_server::LockServer;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::service::TowerToHyperService;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use crate::EtcdServer;
use crate::h2authority::LenientAuthority;
use crate::metrics;
use crate::rpc::Rpc;
use crate::version::{CLUSTER_VERSION, SERVER_VERSION};

/// gRPC allows this much on top of `--max-request-bytes` for message framing, as etcd does.
const GRPC_OVERHEAD_BYTES: usize = 512 * 1024;

/// The router serving gRPC and HTTP for `server`.
pub fn router(server: EtcdServer) -> Router {
    let rpc = Rpc::new(server.clone());
    let gateway = crate::gateway::router(rpc.clone());
    let max = server.config().max_request_bytes as usize + GRPC_OVERHEAD_BYTES;
    let (health_reporter, health_service) = tonic_health::server::health_reporter();
    drop(health_reporter);
    let grpc =
        tonic::service::Routes::new(KvServer::new(rpc.clone()).max_decoding_message_size(max))
            .add_service(LeaseServer::new(rpc.clone()).max_decoding_message_size(max))
            .add_service(ClusterServer::new(rpc.clone()).max_decoding_message_size(max))
            .add_service(WatchServer::new(rpc.clone()).max_decoding_message_size(max))
            .add_service(LockServer::new(rpc.clone()).max_decoding_message_size(max))
            .add_service(ElectionServer::new(rpc.clone()).max_decoding_message_size(max))
            .add_service(MaintenanceServer::new(rpc).max_decoding_message_size(max))
            .add_service(health_service)
            .prepare()
            .into_axum_router();
    let http = Router::new()
        .route("/health", get(health))
        .route("/version", get(version))
        .route("/metrics", get(metrics_text))
        .with_state(server);
    grpc.merge(http)
        .merge(gateway)
        .fallback(not_found)
        .layer(axum::middleware::map_response(grpc_size_error))
        .layer(axum::middleware::from_fn(crate::metrics::grpc_metrics))
}

/// Unknown paths: gRPC's "unimplemented" for gRPC requests, Go's plain 404 for the rest.
async fn not_found(request: axum::extract::Request) -> axum::response::Response {
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

/// tonic refuses an over-limit request message with OutOfRange and its own text; grpc-go (and
/// so etcd) answers ResourceExhausted "grpc: received message larger than max (N vs. M)".
async fn grpc_size_error(mut response: axum::response::Response) -> axum::response::Response {
    let headers = response.headers();
    if headers.get("grpc-status").map(|v| v.as_bytes()) != Some(b"11") {
        return response;
    }
    let Some(message) = headers.get("grpc-message").and_then(|v| v.to_str().ok()) else {
        return response;
    };
    let message = percent_decode(message);
    let Some(rest) = message.strip_prefix("Error, decoded message length too large: found ") else {
        return response;
    };
    let numbers: Vec<&str> = rest
        .split(|c: char| !c.is_ascii_digit())
        .filter(|s| !s.is_empty())
        .collect();
    let [found, limit] = numbers[..] else {
        return response;
    };
    let text = format!("grpc: received message larger than max ({found} vs. {limit})");
    if let Ok(value) = axum::http::HeaderValue::from_str(&text) {
        let headers = response.headers_mut();
        headers.insert("grpc-status", axum::http::HeaderValue::from_static("8"));
        headers.insert("grpc-message", value);
    }
    response
}

/// Serve clients on `listener` until `shutdown`: HTTP/1.1 and HTTP/2 (gRPC) on one port.
/// Each connection runs on this function's own task set; on shutdown, connections get a
/// graceful close and a short grace period.
pub async fn serve(
    server: EtcdServer,
    listener: TcpListener,
    shutdown: CancellationToken,
) -> std::io::Result<()> {
    serve_router(router(server), listener, shutdown).await
}

/// The router of the peer port: the peer service, plus etcd's `/version` and `/health`.
pub fn peer_router(server: EtcdServer) -> Router {
    let peer = crate::peer::PeerService::new(server.clone());
    let grpc = tonic::service::Routes::new(
        etcdrs_proto::peerpb::peer_server::PeerServer::new(peer)
            .max_decoding_message_size(64 * 1024 * 1024),
    )
    .prepare()
    .into_axum_router();
    let http = Router::new()
        .route("/version", get(version))
        .route("/health", get(health))
        .with_state(server);
    grpc.merge(http).fallback(not_found)
}

/// The router of `--listen-metrics-urls`: `/metrics` and `/health` only, as etcd serves there.
pub fn metrics_router(server: EtcdServer) -> Router {
    Router::new()
        .route("/metrics", get(metrics_text))
        .route("/health", get(health))
        .fallback(not_found)
        .with_state(server)
}

/// Serve `/metrics` and `/health` on `listener` until `shutdown`.
pub async fn serve_metrics(
    server: EtcdServer,
    listener: TcpListener,
    shutdown: CancellationToken,
) -> std::io::Result<()> {
    serve_router(metrics_router(server), listener, shutdown).await
}

/// Serve peers on `listener` until `shutdown`.
pub async fn serve_peers(
    server: EtcdServer,
    listener: TcpListener,
    shutdown: CancellationToken,
) -> std::io::Result<()> {
    serve_router(peer_router(server), listener, shutdown).await
}

/// Serve `router` on `listener` until `shutdown`.
async fn serve_router(
    router: Router,
    listener: TcpListener,
    shutdown: CancellationToken,
) -> std::io::Result<()> {
    let builder = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new());
    let graceful = hyper_util::server::graceful::GracefulShutdown::new();
    let mut connections = tokio::task::JoinSet::new();
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => break,
            Some(_) = connections.join_next(), if !connections.is_empty() => {}
            accepted = listener.accept() => {
                let (tcp, _peer) = match accepted {
                    Ok(conn) => conn,
                    Err(e) => {
                        // Out of descriptors and similar: back off instead of spinning.
                        tracing::warn!(error = %e, "failed to accept client connection");
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        continue;
                    }
                };
                // Small responses (put acks, watch events) must not wait for Nagle's algorithm.
                let _ = tcp.set_nodelay(true);
                // etcdctl 3.4 sends a full URL as `:authority` when given http:// endpoints;
                // etcd accepts that, hyper does not: rewrite it before hyper sees it.
                let io = TokioIo::new(LenientAuthority::new(tcp));
                let service = TowerToHyperService::new(router.clone());
                let conn = builder.serve_connection_with_upgrades(io, service).into_owned();
                let conn = graceful.watch(conn);
                connections.spawn(async move {
                    let _ = conn.await;
                });
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
    Ok(())
}

/// Decode a `grpc-message` header (percent-encoded, as the gRPC spec says).
fn percent_decode(text: &str) -> String {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let hex = |b: u8| (b as char).to_digit(16);
        if bytes[i] == b'%'
            && i + 2 < bytes.len()
            && let (Some(hi), Some(lo)) = (hex(bytes[i + 1]), hex(bytes[i + 2]))
        {
            out.push((hi * 16 + lo) as u8);
            i += 3;
            continue;
        }
        out.push(bytes[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

async fn health(State(server): State<EtcdServer>) -> impl IntoResponse {
    let (healthy, reason) = check_health(&server).await;
    let body =
        serde_json::json!({ "health": if healthy { "true" } else { "false" }, "reason": reason });
    let code = if healthy {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    (
        code,
        [(header::CONTENT_TYPE, "application/json")],
        body.to_string(),
    )
}

async fn check_health(server: &EtcdServer) -> (bool, String) {
    if let Some(alarm) = server.alarms().first() {
        return (
            false,
            format!("ALARM {}", crate::rpc::maintenance::alarm_name(alarm.alarm)),
        );
    }
    if server.raft_status().leader == 0 {
        return (false, "RAFT NO LEADER".into());
    }
    match tokio::time::timeout(Duration::from_secs(1), server.linearizable_barrier()).await {
        Ok(Ok(())) => (true, String::new()),
        _ => (false, "QGET ERROR".into()),
    }
}

async fn version() -> impl IntoResponse {
    let body = serde_json::json!({ "etcdserver": SERVER_VERSION, "etcdcluster": CLUSTER_VERSION });
    (
        [(header::CONTENT_TYPE, "application/json")],
        body.to_string(),
    )
}

async fn metrics_text(State(server): State<EtcdServer>) -> impl IntoResponse {
    (
        [(
            header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        metrics::render(&server),
    )
}
