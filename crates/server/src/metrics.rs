//! Prometheus metrics with etcd's names, types and labels (etcd `server/etcdserver/metrics.go`,
//! `server/storage/mvcc/metrics.go`, go-grpc-prometheus, the Go client's process collector).
//!
//! Two kinds: state read at scrape time (leader, sizes, revisions, watchers) is rendered from
//! a fresh registry on each scrape, next to the HTTP code (`http::scrape`); events counted as
//! they happen (proposals, gRPC calls, WAL fsyncs, backend commits, peer traffic) are the
//! statics here, in the process-wide default registry, where the raft node and the backend
//! register theirs too. This module is a leaf: it names nothing else of the server.

use std::sync::LazyLock;

use etcdrs_metrics::register;
use prometheus::{HistogramOpts, IntCounter, IntCounterVec, IntGauge, IntGaugeVec, Opts};

pub use etcdrs_serve::grpc_metrics::set_extensive;

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

macro_rules! counter {
    ($(#[$doc:meta])* $static:ident, $name:literal, $help:literal) => {
        $(#[$doc])*
        pub static $static: LazyLock<IntCounter> =
            LazyLock::new(|| register(IntCounter::new($name, $help)));
    };
}

counter!(
    /// `etcd_server_slow_apply_total`: entries whose apply took longer than 100 ms (etcd's
    /// `warnApplyDuration`).
    SLOW_APPLIES,
    "etcd_server_slow_apply_total",
    "The total number of slow apply requests (likely overloaded from slow disk)."
);
counter!(
    /// `etcd_server_slow_read_indexes_total`: read index requests that timed out and were
    /// asked again.
    SLOW_READ_INDEXES,
    "etcd_server_slow_read_indexes_total",
    "The total number of pending read indexes not in sync with leader's or timed out read index requests."
);
counter!(
    /// `etcd_server_read_indexes_failed_total`: linearizable reads that got no read index.
    READ_INDEXES_FAILED,
    "etcd_server_read_indexes_failed_total",
    "The total number of failed read indexes seen."
);
counter!(
    /// `etcd_debugging_server_lease_expired_total`: leases revoked because they expired.
    LEASES_EXPIRED,
    "etcd_debugging_server_lease_expired_total",
    "The total number of expired leases."
);
counter!(
    /// `etcd_server_learner_promote_successes`: promotions this member made as leader.
    LEARNER_PROMOTE_SUCCESSES,
    "etcd_server_learner_promote_successes",
    "The total number of successful learner promotions while this member is leader."
);

/// `etcd_server_learner_promote_failures{Reason}`: refused promotions, by etcd's error text
/// (a fixed set).
pub static LEARNER_PROMOTE_FAILURES: LazyLock<IntCounterVec> = LazyLock::new(|| {
    register(IntCounterVec::new(
        Opts::new(
            "etcd_server_learner_promote_failures",
            "The total number of failed learner promotions (likely learner not ready) while this member is leader.",
        ),
        &["Reason"],
    ))
});

/// `etcd_server_apply_duration_seconds{version, op, success}` (etcd 3.5): each applied
/// request, by operation.
static APPLY_SECONDS: LazyLock<prometheus::HistogramVec> = LazyLock::new(|| {
    register(prometheus::HistogramVec::new(
        HistogramOpts::new(
            "etcd_server_apply_duration_seconds",
            "The latency distributions of v2 apply called by backend.",
        )
        .buckets(etcdrs_metrics::exponential(0.0001, 2.0, 20)),
        &["version", "op", "success"],
    ))
});

/// etcd 3.5's names of the operations it applies (the `op` label), in [`apply_op_index`]'s
/// order.
pub(crate) const APPLY_OPS: [&str; 23] = [
    "Range",
    "Put",
    "DeleteRange",
    "Txn",
    "Compaction",
    "LeaseGrant",
    "LeaseRevoke",
    "LeaseCheckpoint",
    "Alarm",
    "Authenticate",
    "AuthEnable",
    "AuthDisable",
    "AuthUserAdd",
    "AuthUserDelete",
    "AuthUserChangePassword",
    "AuthUserGrantRole",
    "AuthUserRevokeRole",
    "AuthRoleAdd",
    "AuthRoleGrantPermission",
    "AuthRoleRevokePermission",
    "AuthRoleDelete",
    "ClusterVersionSet",
    "ClusterMemberAttrSet",
];

/// `etcd_server_apply_duration_seconds` series, `[failed, succeeded]` per [`APPLY_OPS`]
/// entry; each created with its first apply, as etcd's appear.
static APPLY_SERIES: LazyLock<Vec<[std::sync::OnceLock<prometheus::Histogram>; 2]>> =
    LazyLock::new(|| {
        APPLY_OPS
            .iter()
            .map(|_| [std::sync::OnceLock::new(), std::sync::OnceLock::new()])
            .collect()
    });

/// `--experimental-warning-apply-duration` in nanoseconds (etcd's default: 100 ms): an apply
/// slower than this is counted as slow and logged.
static SLOW_APPLY_NANOS: std::sync::atomic::AtomicU64 =
    std::sync::atomic::AtomicU64::new(100_000_000);

/// Sets `--experimental-warning-apply-duration` (zero keeps etcd's 100 ms).
pub fn set_warning_apply_duration(duration: std::time::Duration) {
    if !duration.is_zero() {
        let nanos = u64::try_from(duration.as_nanos()).unwrap_or(u64::MAX);
        SLOW_APPLY_NANOS.store(nanos, std::sync::atomic::Ordering::Relaxed);
    }
}

/// The slow-apply threshold in force.
pub(crate) fn warning_apply_duration() -> std::time::Duration {
    std::time::Duration::from_nanos(SLOW_APPLY_NANOS.load(std::sync::atomic::Ordering::Relaxed))
}

/// The name etcd's apply metrics give operation `op` (an index into [`APPLY_OPS`]).
pub(crate) fn apply_op_name(op: usize) -> &'static str {
    APPLY_OPS.get(op).copied().unwrap_or("unknown")
}

/// Record one applied request: operation `op` (an index into [`APPLY_OPS`]) took `took`.
/// Returns whether it was slow (over `--experimental-warning-apply-duration`).
pub(crate) fn observe_apply(op: usize, success: bool, took: std::time::Duration) -> bool {
    if let (Some(series), Some(name)) = (APPLY_SERIES.get(op), APPLY_OPS.get(op)) {
        let outcome = if success { "true" } else { "false" };
        series[usize::from(success)]
            .get_or_init(|| APPLY_SECONDS.with_label_values(&["v3", name, outcome]))
            .observe(took.as_secs_f64());
    }
    let slow = took > warning_apply_duration();
    if slow {
        SLOW_APPLIES.inc();
    }
    slow
}

/// `promhttp_metric_handler_requests_total{code}`: scrapes of `/metrics`.
pub(crate) static SCRAPES: LazyLock<IntCounterVec> = LazyLock::new(|| {
    let scrapes = register(IntCounterVec::new(
        Opts::new(
            "promhttp_metric_handler_requests_total",
            "Total number of scrapes by HTTP status code.",
        ),
        &["code"],
    ));
    for code in ["200", "500", "503"] {
        let _ = scrapes.with_label_values(&[code]);
    }
    scrapes
});

/// `promhttp_metric_handler_requests_in_flight`: scrapes being served.
pub(crate) static SCRAPES_IN_FLIGHT: LazyLock<IntGauge> = LazyLock::new(|| {
    register(IntGauge::new(
        "promhttp_metric_handler_requests_in_flight",
        "Current number of scrapes being served.",
    ))
});

/// `etcd_network_server_stream_failures_total{Type, API}`.
static STREAM_FAILURES: LazyLock<IntCounterVec> = LazyLock::new(|| {
    register(IntCounterVec::new(
        Opts::new(
            "etcd_network_server_stream_failures_total",
            "The total number of stream failures from the local server.",
        ),
        &["Type", "API"],
    ))
});

/// A watch (`api` "watch") or keep-alive ("lease-keepalive") stream failed to receive: counted
/// unless the client canceled or timed out, as etcd counts.
pub(crate) fn stream_receive_failed(api: &'static str, status: &tonic::Status) {
    if !matches!(
        status.code(),
        tonic::Code::Cancelled | tonic::Code::DeadlineExceeded
    ) {
        STREAM_FAILURES.with_label_values(&["receive", api]).inc();
    }
}

/// `etcd_server_healthcheck{type, name}` (etcd 3.5.11): 1 if the last check passed.
static HEALTHCHECK: LazyLock<IntGaugeVec> = LazyLock::new(|| {
    register(IntGaugeVec::new(
        Opts::new(
            "etcd_server_healthcheck",
            "The result of each kind of healthcheck.",
        ),
        &["type", "name"],
    ))
});

/// `etcd_server_healthchecks_total{type, name, status}` (etcd 3.5.11).
static HEALTHCHECKS: LazyLock<IntCounterVec> = LazyLock::new(|| {
    register(IntCounterVec::new(
        Opts::new(
            "etcd_server_healthchecks_total",
            "The total number of each kind of healthcheck.",
        ),
        &["type", "name", "status"],
    ))
});

/// Record one `/livez` or `/readyz` check (`kind`), named by the server's fixed list.
pub(crate) fn record_healthcheck(kind: &str, name: &str, passed: bool) {
    HEALTHCHECK
        .with_label_values(&[kind, name])
        .set(i64::from(passed));
    let status = if passed { "success" } else { "error" };
    HEALTHCHECKS.with_label_values(&[kind, name, status]).inc();
}

/// Creates the event series of the server and the crates under it, so that they show (at
/// zero) before their first event, as etcd's registered series do.
pub fn init() {
    for counter in [
        &SLOW_APPLIES,
        &SLOW_READ_INDEXES,
        &READ_INDEXES_FAILED,
        &LEASES_EXPIRED,
        &LEARNER_PROMOTE_SUCCESSES,
    ] {
        LazyLock::force(counter);
    }
    LazyLock::force(&LEARNER_PROMOTE_FAILURES);
    LazyLock::force(&APPLY_SECONDS);
    LazyLock::force(&SCRAPES);
    LazyLock::force(&SCRAPES_IN_FLIGHT);
    etcdrs_mvcc::metrics::init();
    etcdrs_backend::metrics::init();
    etcdrs_raftnode::metrics::init();
    etcdrs_rafthttp::metrics::init();
}
