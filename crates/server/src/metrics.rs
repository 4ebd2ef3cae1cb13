//! Prometheus metrics with etcd's names, types and labels (etcd `server/etcdserver/metrics.go`,
//! `server/storage/mvcc/metrics.go`, go-grpc-prometheus, the Go client's process collector).
//!
//! Two kinds: state read at scrape time (leader, sizes, revisions, watchers) is rendered from
//! a fresh registry on each scrape; events counted as they happen (proposals, gRPC calls, WAL
//! fsyncs, backend commits, peer traffic) live in the process-wide default registry, where the
//! raft node and the backend register theirs too.

use std::sync::LazyLock;

use etcdrs_metrics::register;
use etcdrs_serve::process::{counter, gauge};
use prometheus::{
    Encoder, GaugeVec, HistogramOpts, IntCounter, IntCounterVec, IntGauge, IntGaugeVec, Opts,
    Registry, TextEncoder,
};

use etcdrs_schema::version::SERVER_VERSION;
pub use etcdrs_serve::grpc_metrics::set_extensive;

use crate::EtcdServer;

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
static SCRAPES: LazyLock<IntCounterVec> = LazyLock::new(|| {
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
static SCRAPES_IN_FLIGHT: LazyLock<IntGauge> = LazyLock::new(|| {
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

fn labelled(registry: &Registry, name: &str, help: &str, label: &str, value: &str) {
    if let Ok(g) = GaugeVec::new(Opts::new(name, help), &[label]) {
        g.with_label_values(&[value]).set(1.0);
        let _ = registry.register(Box::new(g));
    }
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

/// The metrics text for `server`.
pub fn render(server: &EtcdServer) -> String {
    SCRAPES_IN_FLIGHT.inc();
    let text = render_families(server);
    SCRAPES_IN_FLIGHT.dec();
    SCRAPES.with_label_values(&["200"]).inc();
    text
}

fn render_families(server: &EtcdServer) -> String {
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
        &etcdrs_schema::membership::id_hex(server.member_id()),
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
    // etcd 3.4 exports these under their debugging names too (3.5 dropped all but range).
    gauge(
        &registry,
        "etcd_debugging_mvcc_db_total_size_in_bytes",
        "Total size of the underlying database physically allocated in bytes.",
        backend.size() as f64,
    );
    use etcdrs_mvcc::metrics as mvcc;
    for (name, help, value) in [
        (
            "etcd_debugging_mvcc_range_total",
            "Total number of ranges seen by this member.",
            mvcc::RANGES.get(),
        ),
        (
            "etcd_debugging_mvcc_put_total",
            "Total number of puts seen by this member.",
            mvcc::PUTS.get(),
        ),
        (
            "etcd_debugging_mvcc_delete_total",
            "Total number of deletes seen by this member.",
            mvcc::DELETES.get(),
        ),
        (
            "etcd_debugging_mvcc_txn_total",
            "Total number of txns seen by this member.",
            mvcc::TXNS.get(),
        ),
    ] {
        counter(&registry, name, help, value as f64);
    }
    gauge(
        &registry,
        "etcd_mvcc_db_open_read_transactions",
        "The number of currently open read transactions",
        etcdrs_backend::metrics::open_read_transactions() as f64,
    );
    gauge(
        &registry,
        "etcd_debugging_auth_revision",
        "The current revision of auth store.",
        server.auth().revision() as f64,
    );
    // etcd links its gRPC proxy's package into the member, whose series it then exports at
    // zero; dashboards written for both find them here too.
    for (name, help) in [
        (
            "etcd_grpc_proxy_cache_hits_total",
            "Total number of cache hits",
        ),
        (
            "etcd_grpc_proxy_cache_misses_total",
            "Total number of cache misses",
        ),
        (
            "etcd_grpc_proxy_cache_keys_total",
            "Total number of keys/ranges cached",
        ),
        (
            "etcd_grpc_proxy_watchers_coalescing_total",
            "Total number of current watchers coalescing",
        ),
    ] {
        gauge(&registry, name, help, 0.0);
    }
    counter(
        &registry,
        "etcd_grpc_proxy_events_coalescing_total",
        "Total number of events coalescing",
        0.0,
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
    if let Some(version) = server.cluster_version() {
        labelled(
            &registry,
            "etcd_cluster_version",
            "Which version is running. 1 for 'cluster_version' label with current cluster version",
            "cluster_version",
            etcdrs_schema::version::major_minor(&version),
        );
    }
    let (open_fds, max_fds) = etcdrs_serve::process::register_families(&registry);
    // etcd's own pair (`pkg/runtime`), from the same sources.
    gauge(
        &registry,
        "os_fd_used",
        "The number of used file descriptors.",
        open_fds,
    );
    gauge(
        &registry,
        "os_fd_limit",
        "The file descriptor limit.",
        max_fds,
    );
    // Touch the event series so they are present (at zero) before the first event.
    LazyLock::force(&PROPOSALS_PENDING);
    LazyLock::force(&PROPOSALS_FAILED);
    LazyLock::force(&HEALTH_SUCCESS);
    LazyLock::force(&HEALTH_FAILURES);
    etcdrs_serve::grpc_metrics::init_series(etcdrs_serve::grpc_metrics::MEMBER_METHODS);
    init();
    let mut families = registry.gather();
    families.extend(prometheus::gather());
    families.sort_by(|a, b| a.name().cmp(b.name()));
    let mut out = Vec::new();
    let _ = TextEncoder::new().encode(&families, &mut out);
    String::from_utf8(out).unwrap_or_default()
}
