//! Prometheus metrics with etcd's names, types and labels (etcd `server/etcdserver/metrics.go`,
//! `server/storage/mvcc/metrics.go`, go-grpc-prometheus, the Go client's process collector).
//!
//! Two kinds: state read at scrape time (leader, sizes, revisions, watchers) is rendered from
//! a fresh registry on each scrape; events counted as they happen (proposals, gRPC calls, WAL
//! fsyncs, backend commits, peer traffic) live in the process-wide default registry, where the
//! raft node and the backend register theirs too.

use std::sync::LazyLock;
use std::time::Instant;

use axum::extract::Request;
use axum::middleware::Next;
use axum::response::Response;
use prometheus::{
    Counter, Encoder, Gauge, GaugeVec, HistogramOpts, IntCounter, IntCounterVec, IntGauge, Opts,
    Registry, TextEncoder,
};

use crate::EtcdServer;
use crate::version::{CLUSTER_VERSION, SERVER_VERSION};

fn register<M: prometheus::core::Collector + Clone + 'static>(metric: prometheus::Result<M>) -> M {
    let metric = metric.expect("static metric definitions are valid");
    let _ = prometheus::default_registry().register(Box::new(metric.clone()));
    metric
}

/// `etcd_server_health_success`: `/health` checks that found the member healthy.
pub static HEALTH_SUCCESS: LazyLock<IntCounter> = LazyLock::new(|| {
    register(IntCounter::new(
        "etcd_server_health_success",
        "The total number of successful health checks",
    ))
});

/// `etcd_server_health_failures`: `/health` checks that found the member unhealthy.
pub static HEALTH_FAILURES: LazyLock<IntCounter> = LazyLock::new(|| {
    register(IntCounter::new(
        "etcd_server_health_failures",
        "The total number of failed health checks",
    ))
});

/// `etcd_server_proposals_pending`: proposals waiting to be committed.
pub static PROPOSALS_PENDING: LazyLock<IntGauge> = LazyLock::new(|| {
    register(IntGauge::new(
        "etcd_server_proposals_pending",
        "The current number of pending proposals to commit.",
    ))
});

/// `etcd_server_proposals_failed_total`.
pub static PROPOSALS_FAILED: LazyLock<IntCounter> = LazyLock::new(|| {
    register(IntCounter::new(
        "etcd_server_proposals_failed_total",
        "The total number of failed proposals seen.",
    ))
});

/// `grpc_server_started_total`, as go-grpc-prometheus labels it.
static GRPC_STARTED: LazyLock<IntCounterVec> = LazyLock::new(|| {
    register(IntCounterVec::new(
        Opts::new(
            "grpc_server_started_total",
            "Total number of RPCs started on the server.",
        ),
        &["grpc_method", "grpc_service", "grpc_type"],
    ))
});

/// `grpc_server_handled_total`.
static GRPC_HANDLED: LazyLock<IntCounterVec> = LazyLock::new(|| {
    register(IntCounterVec::new(
        Opts::new(
            "grpc_server_handled_total",
            "Total number of RPCs completed on the server, regardless of success or failure.",
        ),
        &["grpc_code", "grpc_method", "grpc_service", "grpc_type"],
    ))
});

/// `grpc_server_handling_seconds` (etcd exports it with `--metrics=extensive`).
static GRPC_HANDLING: LazyLock<prometheus::HistogramVec> = LazyLock::new(|| {
    register(prometheus::HistogramVec::new(
        HistogramOpts::new(
            "grpc_server_handling_seconds",
            "Histogram of response latency (seconds) of gRPC that had been application-level handled by the server.",
        ),
        &["grpc_method", "grpc_service", "grpc_type"],
    ))
});

/// `etcd_network_peer_sent_bytes_total{To}`.
pub static PEER_SENT_BYTES: LazyLock<IntCounterVec> = LazyLock::new(|| {
    register(IntCounterVec::new(
        Opts::new(
            "etcd_network_peer_sent_bytes_total",
            "The total number of bytes sent to peers.",
        ),
        &["To"],
    ))
});

/// `etcd_network_peer_received_bytes_total{From}`.
pub static PEER_RECEIVED_BYTES: LazyLock<IntCounterVec> = LazyLock::new(|| {
    register(IntCounterVec::new(
        Opts::new(
            "etcd_network_peer_received_bytes_total",
            "The total number of bytes received from peers.",
        ),
        &["From"],
    ))
});

/// `etcd_network_peer_sent_failures_total{To}`.
pub static PEER_SENT_FAILURES: LazyLock<IntCounterVec> = LazyLock::new(|| {
    register(IntCounterVec::new(
        Opts::new(
            "etcd_network_peer_sent_failures_total",
            "The total number of send failures from peers.",
        ),
        &["To"],
    ))
});

/// `etcd_network_peer_round_trip_time_seconds{To}`.
pub static PEER_RTT: LazyLock<prometheus::HistogramVec> = LazyLock::new(|| {
    register(prometheus::HistogramVec::new(
        HistogramOpts::new(
            "etcd_network_peer_round_trip_time_seconds",
            "Round-Trip-Time histogram between peers",
        )
        .buckets(etcdrs_raftnode::metrics::exponential(0.0001, 2.0, 14)),
        &["To"],
    ))
});

/// Whether `--metrics=extensive` asked for gRPC latency histograms.
static EXTENSIVE: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Turn on etcd's `--metrics=extensive` series.
pub fn set_extensive(on: bool) {
    EXTENSIVE.store(on, std::sync::atomic::Ordering::Relaxed);
}

/// gRPC's kind of call for each streaming method; everything else is unary.
fn grpc_type(service: &str, method: &str) -> &'static str {
    match (service, method) {
        ("etcdserverpb.Watch", "Watch") | ("etcdserverpb.Lease", "LeaseKeepAlive") => "bidi_stream",
        ("etcdserverpb.Maintenance", "Snapshot")
        | ("v3electionpb.Election", "Observe")
        | ("grpc.health.v1.Health", "Watch") => "server_stream",
        _ => "unary",
    }
}

/// gRPC's name for a status code, as go-grpc-prometheus writes it.
fn code_name(code: &str) -> &'static str {
    match code {
        "0" => "OK",
        "1" => "Canceled",
        "2" => "Unknown",
        "3" => "InvalidArgument",
        "4" => "DeadlineExceeded",
        "5" => "NotFound",
        "6" => "AlreadyExists",
        "7" => "PermissionDenied",
        "8" => "ResourceExhausted",
        "9" => "FailedPrecondition",
        "10" => "Aborted",
        "11" => "OutOfRange",
        "12" => "Unimplemented",
        "13" => "Internal",
        "14" => "Unavailable",
        "15" => "DataLoss",
        "16" => "Unauthenticated",
        _ => "Unknown",
    }
}

/// gRPC status codes in numeric order, as go-grpc-prometheus names them.
const CODE_NAMES: [&str; 17] = [
    "OK",
    "Canceled",
    "Unknown",
    "InvalidArgument",
    "DeadlineExceeded",
    "NotFound",
    "AlreadyExists",
    "PermissionDenied",
    "ResourceExhausted",
    "FailedPrecondition",
    "Aborted",
    "OutOfRange",
    "Unimplemented",
    "Internal",
    "Unavailable",
    "DataLoss",
    "Unauthenticated",
];

/// The methods etcd registers with go-grpc-prometheus, whose series it shows (at zero) from
/// start-up: (service, method).
const ETCD_GRPC_METHODS: &[(&str, &str)] = &[
    ("etcdserverpb.KV", "Range"),
    ("etcdserverpb.KV", "Put"),
    ("etcdserverpb.KV", "DeleteRange"),
    ("etcdserverpb.KV", "Txn"),
    ("etcdserverpb.KV", "Compact"),
    ("etcdserverpb.Watch", "Watch"),
    ("etcdserverpb.Lease", "LeaseGrant"),
    ("etcdserverpb.Lease", "LeaseRevoke"),
    ("etcdserverpb.Lease", "LeaseKeepAlive"),
    ("etcdserverpb.Lease", "LeaseTimeToLive"),
    ("etcdserverpb.Lease", "LeaseLeases"),
    ("etcdserverpb.Cluster", "MemberAdd"),
    ("etcdserverpb.Cluster", "MemberRemove"),
    ("etcdserverpb.Cluster", "MemberUpdate"),
    ("etcdserverpb.Cluster", "MemberList"),
    ("etcdserverpb.Cluster", "MemberPromote"),
    ("etcdserverpb.Maintenance", "Alarm"),
    ("etcdserverpb.Maintenance", "Status"),
    ("etcdserverpb.Maintenance", "Defragment"),
    ("etcdserverpb.Maintenance", "Hash"),
    ("etcdserverpb.Maintenance", "HashKV"),
    ("etcdserverpb.Maintenance", "Snapshot"),
    ("etcdserverpb.Maintenance", "MoveLeader"),
    ("etcdserverpb.Auth", "AuthEnable"),
    ("etcdserverpb.Auth", "AuthDisable"),
    ("etcdserverpb.Auth", "Authenticate"),
    ("etcdserverpb.Auth", "UserAdd"),
    ("etcdserverpb.Auth", "UserGet"),
    ("etcdserverpb.Auth", "UserList"),
    ("etcdserverpb.Auth", "UserDelete"),
    ("etcdserverpb.Auth", "UserChangePassword"),
    ("etcdserverpb.Auth", "UserGrantRole"),
    ("etcdserverpb.Auth", "UserRevokeRole"),
    ("etcdserverpb.Auth", "RoleAdd"),
    ("etcdserverpb.Auth", "RoleGet"),
    ("etcdserverpb.Auth", "RoleList"),
    ("etcdserverpb.Auth", "RoleDelete"),
    ("etcdserverpb.Auth", "RoleGrantPermission"),
    ("etcdserverpb.Auth", "RoleRevokePermission"),
    ("grpc.health.v1.Health", "Check"),
    ("grpc.health.v1.Health", "Watch"),
];

/// One method's series, resolved once so that counting a call hashes no labels.
struct MethodSeries {
    started: IntCounter,
    /// `grpc_server_handled_total` by code, indexed as [`CODE_NAMES`].
    handled: Vec<IntCounter>,
    handling: prometheus::Histogram,
}

impl MethodSeries {
    fn new(service: &str, method: &str) -> Self {
        let kind = grpc_type(service, method);
        MethodSeries {
            started: GRPC_STARTED.with_label_values(&[method, service, kind]),
            handled: CODE_NAMES
                .iter()
                .map(|code| GRPC_HANDLED.with_label_values(&[code, method, service, kind]))
                .collect(),
            handling: GRPC_HANDLING.with_label_values(&[method, service, kind]),
        }
    }
}

/// Series of etcd's methods by request path (`/service/method`), created at start-up.
static METHOD_SERIES: LazyLock<std::collections::HashMap<String, MethodSeries>> =
    LazyLock::new(|| {
        ETCD_GRPC_METHODS
            .iter()
            .map(|(service, method)| {
                (
                    format!("/{service}/{method}"),
                    MethodSeries::new(service, method),
                )
            })
            .collect()
    });

/// Creates the gRPC series of etcd's methods (at zero), as etcd shows them from start-up.
pub fn init_grpc_series() {
    LazyLock::force(&METHOD_SERIES);
}

/// The code of a finished call: errors come back trailers-only, with the status among the
/// headers; a response whose status is in its trailers succeeded as far as the handler is
/// concerned.
fn response_code(response: &Response) -> Option<usize> {
    match response.headers().get("grpc-status") {
        None => Some(0),
        Some(v) => v.to_str().ok().and_then(|v| v.parse().ok()),
    }
}

/// Middleware counting gRPC calls by service, method and code.
pub async fn grpc_metrics(request: Request, next: Next) -> Response {
    let is_grpc = request
        .headers()
        .get(axum::http::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("application/grpc"));
    if !is_grpc {
        return next.run(request).await;
    }
    if let Some(series) = METHOD_SERIES.get(request.uri().path()) {
        series.started.inc();
        let started = Instant::now();
        let response = next.run(request).await;
        let code = response_code(&response).filter(|c| *c < CODE_NAMES.len());
        series.handled[code.unwrap_or(2)].inc();
        if EXTENSIVE.load(std::sync::atomic::Ordering::Relaxed) {
            series.handling.observe(started.elapsed().as_secs_f64());
        }
        return response;
    }
    let path = request.uri().path().trim_start_matches('/').to_string();
    let (service, method) = path.split_once('/').unwrap_or((path.as_str(), ""));
    let (service, method) = (service.to_string(), method.to_string());
    let kind = grpc_type(&service, &method);
    GRPC_STARTED
        .with_label_values(&[method.as_str(), service.as_str(), kind])
        .inc();
    let started = Instant::now();
    let response = next.run(request).await;
    // Errors come back trailers-only, with the status among the headers; a response whose
    // status is in its trailers succeeded as far as the handler is concerned.
    let code = response
        .headers()
        .get("grpc-status")
        .and_then(|v| v.to_str().ok())
        .map_or("OK", code_name);
    GRPC_HANDLED
        .with_label_values(&[code, method.as_str(), service.as_str(), kind])
        .inc();
    if EXTENSIVE.load(std::sync::atomic::Ordering::Relaxed) {
        GRPC_HANDLING
            .with_label_values(&[method.as_str(), service.as_str(), kind])
            .observe(started.elapsed().as_secs_f64());
    }
    response
}

fn gauge(registry: &Registry, name: &str, help: &str, value: f64) {
    if let Ok(g) = Gauge::new(name, help) {
        g.set(value);
        let _ = registry.register(Box::new(g));
    }
}

fn counter(registry: &Registry, name: &str, help: &str, value: f64) {
    if let Ok(c) = Counter::new(name, help) {
        c.inc_by(value);
        let _ = registry.register(Box::new(c));
    }
}

fn labelled(registry: &Registry, name: &str, help: &str, label: &str, value: &str) {
    if let Ok(g) = GaugeVec::new(Opts::new(name, help), &[label]) {
        g.with_label_values(&[value]).set(1.0);
        let _ = registry.register(Box::new(g));
    }
}

/// The `process_*` series of the Go client's process collector, from `/proc/self`.
fn process_metrics(registry: &Registry) {
    let Ok(stat) = std::fs::read_to_string("/proc/self/stat") else {
        return;
    };
    // Fields after the command name (which may hold spaces) start after the last ')'.
    let Some(rest) = stat.rsplit_once(')').map(|(_, rest)| rest) else {
        return;
    };
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let field = |i: usize| {
        fields
            .get(i)
            .and_then(|v| v.parse::<f64>().ok())
            .unwrap_or(0.0)
    };
    // Field numbers of proc(5), less the two before ')': utime 14, stime 15, starttime 22,
    // vsize 23, rss 24.
    let ticks = 100.0;
    let page = 4096.0;
    gauge(
        registry,
        "process_cpu_seconds_total",
        "Total user and system CPU time spent in seconds.",
        (field(11) + field(12)) / ticks,
    );
    gauge(
        registry,
        "process_virtual_memory_bytes",
        "Virtual memory size in bytes.",
        field(20),
    );
    gauge(
        registry,
        "process_resident_memory_bytes",
        "Resident memory size in bytes.",
        field(21) * page,
    );
    let boot = std::fs::read_to_string("/proc/stat")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("btime "))
                .and_then(|v| v.trim().parse::<f64>().ok())
        })
        .unwrap_or(0.0);
    gauge(
        registry,
        "process_start_time_seconds",
        "Start time of the process since unix epoch in seconds.",
        boot + field(19) / ticks,
    );
    let open_fds = std::fs::read_dir("/proc/self/fd")
        .map(|d| d.count())
        .unwrap_or(0);
    gauge(
        registry,
        "process_open_fds",
        "Number of open file descriptors.",
        open_fds as f64,
    );
    let max_fds = std::fs::read_to_string("/proc/self/limits")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("Max open files"))
                .and_then(|l| l.split_whitespace().nth(3))
                .and_then(|v| v.parse::<f64>().ok())
        })
        .unwrap_or(0.0);
    gauge(
        registry,
        "process_max_fds",
        "Maximum number of open file descriptors.",
        max_fds,
    );
}

/// The metrics text for `server`.
pub fn render(server: &EtcdServer) -> String {
    let registry = Registry::new();
    let raft = server.raft_status();
    let backend = server.store().backend();
    gauge(
        &registry,
        "etcd_server_has_leader",
        "Whether or not a leader exists. 1 is existence, 0 is not.",
        f64::from(u8::from(raft.leader != 0)),
    );
    gauge(
        &registry,
        "etcd_server_is_leader",
        "Whether or not this member is a leader. 1 if is, 0 otherwise.",
        f64::from(u8::from(raft.is_leader)),
    );
    let is_learner = server
        .members()
        .iter()
        .any(|m| m.id == server.member_id() && m.is_learner);
    gauge(
        &registry,
        "etcd_server_is_learner",
        "Whether or not this member is a learner. 1 if is, 0 otherwise.",
        f64::from(u8::from(is_learner)),
    );
    counter(
        &registry,
        "etcd_server_leader_changes_seen_total",
        "The number of leader changes seen.",
        server.leader_changes() as f64,
    );
    gauge(
        &registry,
        "etcd_server_proposals_committed_total",
        "The total number of consensus proposals committed.",
        raft.commit as f64,
    );
    gauge(
        &registry,
        "etcd_server_proposals_applied_total",
        "The total number of consensus proposals applied.",
        raft.applied as f64,
    );
    labelled(
        &registry,
        "etcd_server_id",
        "Server or member ID in hexadecimal format. 1 for 'server_id' label with current ID.",
        "server_id",
        &crate::membership::id_hex(server.member_id()),
    );
    gauge(
        &registry,
        "etcd_mvcc_db_total_size_in_bytes",
        "Total size of the underlying database physically allocated in bytes.",
        backend.size() as f64,
    );
    gauge(
        &registry,
        "etcd_mvcc_db_total_size_in_use_in_bytes",
        "Total size of the underlying database logically in use in bytes.",
        backend.size_in_use() as f64,
    );
    gauge(
        &registry,
        "etcd_server_quota_backend_bytes",
        "Current backend storage quota size in bytes.",
        server.config().quota_bytes() as f64,
    );
    gauge(
        &registry,
        "etcd_debugging_mvcc_keys_total",
        "Total number of keys.",
        server.store().key_count() as f64,
    );
    gauge(
        &registry,
        "etcd_debugging_mvcc_current_revision",
        "The current revision of store.",
        server.store().current_rev() as f64,
    );
    gauge(
        &registry,
        "etcd_debugging_mvcc_compact_revision",
        "The revision of the last compaction in store.",
        server.store().compact_rev() as f64,
    );
    let (synced, unsynced) = server.watch_hub().counts();
    gauge(
        &registry,
        "etcd_debugging_mvcc_watcher_total",
        "Total number of watchers.",
        (synced + unsynced) as f64,
    );
    gauge(
        &registry,
        "etcd_debugging_mvcc_slow_watcher_total",
        "Total number of unsynced slow watchers.",
        unsynced as f64,
    );
    labelled(
        &registry,
        "etcd_server_version",
        "Which version is running. 1 for 'server_version' label with current version.",
        "server_version",
        SERVER_VERSION,
    );
    labelled(
        &registry,
        "etcd_cluster_version",
        "Which version is running. 1 for 'cluster_version' label with current cluster version",
        "cluster_version",
        &CLUSTER_VERSION[..3],
    );
    process_metrics(&registry);
    // Touch the event series so they are present (at zero) before the first event.
    LazyLock::force(&PROPOSALS_PENDING);
    LazyLock::force(&PROPOSALS_FAILED);
    LazyLock::force(&HEALTH_SUCCESS);
    LazyLock::force(&HEALTH_FAILURES);
    init_grpc_series();
    LazyLock::force(&etcdrs_raftnode::metrics::WAL_FSYNC_SECONDS);
    let mut families = registry.gather();
    families.extend(prometheus::gather());
    families.sort_by(|a, b| a.name().cmp(b.name()));
    let mut out = Vec::new();
    let _ = TextEncoder::new().encode(&families, &mut out);
    String::from_utf8(out).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grpc_labels() {
        assert_eq!(grpc_type("etcdserverpb.Watch", "Watch"), "bidi_stream");
        assert_eq!(grpc_type("etcdserverpb.KV", "Range"), "unary");
        assert_eq!(code_name("3"), "InvalidArgument");
        assert_eq!(code_name("0"), "OK");
        for (i, name) in CODE_NAMES.iter().enumerate() {
            assert_eq!(code_name(&i.to_string()), *name);
        }
        assert_eq!(grpc_type("grpc.health.v1.Health", "Watch"), "server_stream");
    }
}
