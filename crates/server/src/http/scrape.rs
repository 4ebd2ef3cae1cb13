//! The `/metrics` page: the state read at scrape time (leader, sizes, revisions, watchers),
//! rendered from a fresh registry on each scrape, followed by the process-wide event series
//! (`crate::metrics`, which holds the statics and knows nothing of the server).

use std::sync::LazyLock;

use etcdrs_schema::version::SERVER_VERSION;
use etcdrs_serve::process::{counter, gauge};
use prometheus::{Encoder, GaugeVec, Opts, Registry, TextEncoder};

use crate::EtcdServer;
use crate::metrics::{
    HEALTH_FAILURES, HEALTH_SUCCESS, PROPOSALS_FAILED, PROPOSALS_PENDING, SCRAPES,
    SCRAPES_IN_FLIGHT, init,
};

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

fn labelled(registry: &Registry, name: &str, help: &str, label: &str, value: &str) {
    if let Ok(g) = GaugeVec::new(Opts::new(name, help), &[label]) {
        g.with_label_values(&[value]).set(1.0);
        let _ = registry.register(Box::new(g));
    }
}
