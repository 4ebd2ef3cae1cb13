//! The raft node's metrics, with etcd's names, in the process-wide Prometheus registry.

use std::sync::LazyLock;

use prometheus::{Histogram, HistogramOpts, IntCounter};

/// etcd's `etcd_disk_wal_fsync_duration_seconds`: how long each WAL save (write and fsync) took.
pub static WAL_FSYNC_SECONDS: LazyLock<Histogram> = LazyLock::new(|| {
    let opts = HistogramOpts::new(
        "etcd_disk_wal_fsync_duration_seconds",
        "The latency distributions of fsync called by WAL.",
    )
    .buckets(exponential(0.001, 2.0, 14));
    register(Histogram::with_opts(opts))
});

/// etcd's `etcd_server_snapshot_apply_in_progress_total` is a gauge; this counts snapshots
/// installed from a leader (`etcd_debugging_server_snapshots_installed_total`).
pub static SNAPSHOTS_INSTALLED: LazyLock<IntCounter> = LazyLock::new(|| {
    register(IntCounter::new(
        "etcd_debugging_server_snapshots_installed_total",
        "The total number of snapshots installed from the leader.",
    ))
});

/// Buckets `start`, `start*factor`, ... (`count` of them), as Go's `ExponentialBuckets`.
pub fn exponential(start: f64, factor: f64, count: usize) -> Vec<f64> {
    let mut buckets = Vec::with_capacity(count);
    let mut next = start;
    for _ in 0..count {
        buckets.push(next);
        next *= factor;
    }
    buckets
}

fn register<M: prometheus::core::Collector + Clone + 'static>(metric: prometheus::Result<M>) -> M {
    let metric = metric.expect("static metric definitions are valid");
    // Registering twice (tests that start several nodes) is harmless: the first one wins.
    let _ = prometheus::default_registry().register(Box::new(metric.clone()));
    metric
}
