//! The gateway's own Prometheus series and the optional `--metrics-addr` HTTP server
//! (`/metrics`, `/health`). etcd's gateway has neither; names follow etcd's
//! `etcd_<subsystem>_<name>` pattern under the `etcd_gateway` subsystem.

use std::net::SocketAddr;
use std::sync::Arc;

use axum::Router;
use axum::http::{StatusCode, header};
use axum::response::IntoResponse;
use axum::routing::get;
use prometheus::{Encoder, IntCounter, IntCounterVec, IntGauge, IntGaugeVec, Opts, Registry};
use tokio_util::sync::CancellationToken;

use crate::pool::Pool;

/// The gateway's metrics, in their own registry.
#[derive(Clone)]
pub(crate) struct Metrics {
    registry: Registry,
    pub(crate) connections: IntCounter,
    pub(crate) active: IntGauge,
    pub(crate) refused: IntCounter,
    pub(crate) dial_failures: IntCounterVec,
    pub(crate) bytes: IntCounterVec,
    pub(crate) probes: IntCounterVec,
    endpoint_up: IntGaugeVec,
}

impl Metrics {
    pub(crate) fn new() -> Result<Metrics, prometheus::Error> {
        let registry = Registry::new();
        let opts =
            |name: &str, help: &str| Opts::new(name, help).namespace("etcd").subsystem("gateway");
        let connections =
            IntCounter::with_opts(opts("connections_total", "Client connections accepted."))?;
        let active = IntGauge::with_opts(opts(
            "active_connections",
            "Client connections being relayed now.",
        ))?;
        let refused = IntCounter::with_opts(opts(
            "failed_connections_total",
            "Client connections closed because no endpoint could be dialed.",
        ))?;
        let dial_failures = IntCounterVec::new(
            opts("dial_failures_total", "Failed dials to an endpoint."),
            &["endpoint"],
        )?;
        let bytes = IntCounterVec::new(
            opts(
                "bytes_total",
                "Bytes relayed, counted when a connection closes, by direction.",
            ),
            &["direction"],
        )?;
        let probes = IntCounterVec::new(
            opts(
                "health_probes_total",
                "Active health probes by result (ok, fail).",
            ),
            &["result"],
        )?;
        let endpoint_up = IntGaugeVec::new(
            opts(
                "endpoint_up",
                "1 if the endpoint is in rotation, 0 if it is marked down.",
            ),
            &["endpoint"],
        )?;
        registry.register(Box::new(connections.clone()))?;
        registry.register(Box::new(active.clone()))?;
        registry.register(Box::new(refused.clone()))?;
        registry.register(Box::new(dial_failures.clone()))?;
        registry.register(Box::new(bytes.clone()))?;
        registry.register(Box::new(probes.clone()))?;
        registry.register(Box::new(endpoint_up.clone()))?;
        Ok(Metrics {
            registry,
            connections,
            active,
            refused,
            dial_failures,
            bytes,
            probes,
            endpoint_up,
        })
    }

    pub(crate) fn set_endpoint_up(&self, key: &str, up: bool) {
        self.endpoint_up
            .with_label_values(&[key])
            .set(i64::from(up));
    }

    pub(crate) fn remove_endpoint(&self, key: &str) {
        let _ = self.endpoint_up.remove_label_values(&[key]);
        let _ = self.dial_failures.remove_label_values(&[key]);
    }

    /// Counts a finished connection's bytes.
    pub(crate) fn add_bytes(&self, to_endpoint: u64, to_client: u64) {
        self.bytes
            .with_label_values(&["to_endpoint"])
            .inc_by(to_endpoint);
        self.bytes
            .with_label_values(&["to_client"])
            .inc_by(to_client);
    }

    fn render(&self) -> Vec<u8> {
        let mut out = Vec::new();
        // Encoding our own well-formed families into a Vec cannot fail.
        let _ = prometheus::TextEncoder::new().encode(&self.registry.gather(), &mut out);
        out
    }
}

/// Serves `/metrics` and `/health` on `listener` until `stop` is cancelled. `/health` is 200
/// `{"health":"true"}` while some endpoint is up, else 503 `{"health":"false"}`.
pub(crate) async fn serve(
    listener: tokio::net::TcpListener,
    metrics: Metrics,
    pool: Arc<Pool>,
    stop: CancellationToken,
) -> std::io::Result<()> {
    let local: Option<SocketAddr> = listener.local_addr().ok();
    let metrics_route = {
        let metrics = metrics.clone();
        move || {
            let body = metrics.render();
            async move {
                (
                    [(
                        header::CONTENT_TYPE,
                        "text/plain; version=0.0.4; charset=utf-8",
                    )],
                    body,
                )
                    .into_response()
            }
        }
    };
    let health_route = move || {
        let up = pool.any_up();
        async move {
            let (status, body) = if up {
                (StatusCode::OK, r#"{"health":"true"}"#)
            } else {
                (StatusCode::SERVICE_UNAVAILABLE, r#"{"health":"false"}"#)
            };
            (status, [(header::CONTENT_TYPE, "application/json")], body).into_response()
        }
    };
    let app = Router::new()
        .route("/metrics", get(metrics_route))
        .route("/health", get(health_route));
    tracing::info!(address = %local.map(|a| a.to_string()).unwrap_or_default(), "serving gateway metrics and health");
    axum::serve(listener, app)
        .with_graceful_shutdown(async move { stop.cancelled().await })
        .await
}
