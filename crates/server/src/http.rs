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
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use crate::EtcdServer;
use crate::metrics;
use crate::rpc::Rpc;
use crate::version::{CLUSTER_VERSION, SERVER_VERSION};

/// gRPC allows this much on top of `--max-request-bytes` for message framing, as etcd does.
const GRPC_OVERHEAD_BYTES: usize = 512 * 1024;

/// The router serving gRPC and HTTP for `server`.
pub fn router(server: EtcdServer) -> Router {
    let rpc = Rpc::new(server.clone());
    let max = server.config().max_request_bytes as usize + GRPC_OVERHEAD_BYTES;
    let (health_reporter, health_service) = tonic_health::server::health_reporter();
    drop(health_reporter);
    let grpc =
        tonic::service::Routes::new(KvServer::new(rpc.clone()).max_decoding_message_size(max))
            .add_service(LeaseServer::new(rpc.clone()).max_decoding_message_size(max))
            .add_service(ClusterServer::new(rpc.clone()).max_decoding_message_size(max))
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
}

/// Serve clients on `listener` until `shutdown`.
pub async fn serve(
    server: EtcdServer,
    listener: TcpListener,
    shutdown: CancellationToken,
) -> std::io::Result<()> {
    axum::serve(listener, router(server))
        .with_graceful_shutdown(shutdown.cancelled_owned())
        .await
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
