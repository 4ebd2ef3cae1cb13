//! The raft node's metrics, with etcd's names, in the process-wide Prometheus registry.

use std::sync::LazyLock;

use etcdrs_metrics::{exponential, register};
use prometheus::{Gauge, Histogram, HistogramOpts, IntGauge};

/// etcd's `etcd_disk_wal_fsync_duration_seconds`: how long each WAL fdatasync took.
pub static WAL_FSYNC_SECONDS: LazyLock<Histogram> = LazyLock::new(|| {
    let opts = HistogramOpts::new(
        "etcd_disk_wal_fsync_duration_seconds",
        "The latency distributions of fsync called by WAL.",
    )
    .buckets(exponential(0.001, 2.0, 14));
    register(Histogram::with_opts(opts))
});

/// etcd's `etcd_disk_wal_write_duration_seconds` (etcd 3.5): each WAL write, without its sync.
pub static WAL_WRITE_SECONDS: LazyLock<Histogram> = LazyLock::new(|| {
    let opts = HistogramOpts::new(
        "etcd_disk_wal_write_duration_seconds",
        "The latency distributions of write called by WAL.",
    )
    .buckets(exponential(0.001, 2.0, 14));
    register(Histogram::with_opts(opts))
});

/// etcd's `etcd_disk_wal_write_bytes_total`: record bytes written to the WAL (a gauge in etcd).
pub static WAL_WRITE_BYTES: LazyLock<Gauge> = LazyLock::new(|| {
    register(Gauge::new(
        "etcd_disk_wal_write_bytes_total",
        "Total number of bytes written in WAL.",
    ))
});

/// etcd's `etcd_server_snapshot_apply_in_progress_total`: 1 while a snapshot from the leader
/// is being installed.
pub static SNAPSHOT_APPLY_IN_PROGRESS: LazyLock<IntGauge> = LazyLock::new(|| {
    register(IntGauge::new(
        "etcd_server_snapshot_apply_in_progress_total",
        "1 if the server is applying the incoming snapshot. 0 if none.",
    ))
});

fn histogram(name: &str, help: &str, start: f64, count: usize) -> Histogram {
    etcdrs_metrics::histogram(name, help, exponential(start, 2.0, count))
}

/// etcd's `etcd_debugging_snap_save_total_duration_seconds`: each snapshot save (here: the
/// WAL's snapshot mark, written and synced).
pub static SNAP_SAVE_SECONDS: LazyLock<Histogram> = LazyLock::new(|| {
    histogram(
        "etcd_debugging_snap_save_total_duration_seconds",
        "The total latency distributions of save called by snapshot.",
        0.001,
        14,
    )
});

/// etcd's `etcd_debugging_snap_save_marshalling_duration_seconds`: writing the snapshot
/// record, without its sync.
pub static SNAP_MARSHALLING_SECONDS: LazyLock<Histogram> = LazyLock::new(|| {
    histogram(
        "etcd_debugging_snap_save_marshalling_duration_seconds",
        "The marshalling cost distributions of save called by snapshot.",
        0.001,
        14,
    )
});

/// etcd's `etcd_snap_fsync_duration_seconds`: the sync of each snapshot save.
pub static SNAP_FSYNC_SECONDS: LazyLock<Histogram> = LazyLock::new(|| {
    histogram(
        "etcd_snap_fsync_duration_seconds",
        "The latency distributions of fsync called by snap.",
        0.001,
        14,
    )
});

/// Creates the raft node's series, so that they show (at zero) before their first event.
pub fn init() {
    LazyLock::force(&WAL_FSYNC_SECONDS);
    LazyLock::force(&WAL_WRITE_SECONDS);
    LazyLock::force(&WAL_WRITE_BYTES);
    LazyLock::force(&SNAPSHOT_APPLY_IN_PROGRESS);
    LazyLock::force(&SNAP_SAVE_SECONDS);
    LazyLock::force(&SNAP_MARSHALLING_SECONDS);
    LazyLock::force(&SNAP_FSYNC_SECONDS);
}
