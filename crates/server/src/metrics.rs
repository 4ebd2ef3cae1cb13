//! Prometheus metrics with etcd's names (etcd `server/etcdserver/metrics.go`), gathered at
//! scrape time from the server's state.

use prometheus::{Encoder, Gauge, GaugeVec, Opts, Registry, TextEncoder};

use crate::EtcdServer;
use crate::version::{CLUSTER_VERSION, SERVER_VERSION};

fn gauge(registry: &Registry, name: &str, help: &str, value: f64) {
    if let Ok(g) = Gauge::new(name, help) {
        g.set(value);
        let _ = registry.register(Box::new(g));
    }
}

fn labelled(registry: &Registry, name: &str, help: &str, label: &str, value: &str) {
    if let Ok(g) = GaugeVec::new(Opts::new(name, help), &[label]) {
        g.with_label_values(&[value]).set(1.0);
        let _ = registry.register(Box::new(g));
    }
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
    gauge(
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
    gauge(
        &registry,
        "etcd_server_id",
        "Server or member ID in hexadecimal format. 1 for 'server_id' label with current ID.",
        1.0,
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
    let mut out = Vec::new();
    let _ = TextEncoder::new().encode(&registry.gather(), &mut out);
    String::from_utf8(out).unwrap_or_default()
}
