//! The backend's Prometheus series, with etcd's names (etcd `server/storage/backend/metrics.go`),
//! in the process-wide default registry.

use std::sync::LazyLock;
use std::sync::atomic::{AtomicI64, Ordering};

use etcdrs_metrics::histogram;
use prometheus::{Histogram, IntGauge};

/// Buckets `start`, `start*2`, ... (`count` of them), as Go's `ExponentialBuckets(start, 2, n)`.
fn doubling(start: f64, count: usize) -> Vec<f64> {
    etcdrs_metrics::exponential(start, 2.0, count)
}

/// `etcd_disk_backend_commit_duration_seconds`: each durable commit (etcd's batch commit).
pub(crate) static COMMIT_SECONDS: LazyLock<Histogram> = LazyLock::new(|| {
    histogram(
        "etcd_disk_backend_commit_duration_seconds",
        "The latency distributions of commit called by backend.",
        doubling(0.001, 14),
    )
});

/// `etcd_debugging_disk_backend_commit_write_duration_seconds`: the write phase of each
/// durable commit. bbolt's commit rebalances and spills its tree, then writes the dirty pages
/// and the meta page with their fsyncs (this phase); redb's commit is only that writing (its
/// tree is rebalanced and its pages split during the inserts), so the phase is the whole
/// `Transaction::commit`, and bbolt's other two phases have no counterpart.
pub(crate) static COMMIT_WRITE_SECONDS: LazyLock<Histogram> = LazyLock::new(|| {
    histogram(
        "etcd_debugging_disk_backend_commit_write_duration_seconds",
        "The latency distributions of commit.write called by bboltdb backend.",
        doubling(0.001, 14),
    )
});

/// `etcd_disk_backend_defrag_duration_seconds`: each defragmentation, start to end.
pub(crate) static DEFRAG_SECONDS: LazyLock<Histogram> = LazyLock::new(|| {
    histogram(
        "etcd_disk_backend_defrag_duration_seconds",
        "The latency distribution of backend defragmentation.",
        doubling(0.1, 13),
    )
});

/// `etcd_disk_backend_snapshot_duration_seconds`: how long each snapshot image lived, from
/// taking it to releasing it after it was sent (etcd observes it when the snapshot closes).
pub(crate) static SNAPSHOT_SECONDS: LazyLock<Histogram> = LazyLock::new(|| {
    histogram(
        "etcd_disk_backend_snapshot_duration_seconds",
        "The latency distribution of backend snapshots.",
        doubling(0.01, 17),
    )
});

/// `etcd_disk_defrag_inflight`: 1 while a defragmentation runs.
pub(crate) static DEFRAG_INFLIGHT: LazyLock<IntGauge> = LazyLock::new(|| {
    let gauge = IntGauge::new(
        "etcd_disk_defrag_inflight",
        "Whether or not defrag is active on the member. 1 means active, 0 means not.",
    )
    .expect("static metric definition is valid");
    let _ = prometheus::default_registry().register(Box::new(gauge.clone()));
    gauge
});

/// Read transactions currently open, in every backend of the process.
static OPEN_READS: AtomicI64 = AtomicI64::new(0);

/// Counts one open read transaction for as long as it lives.
pub(crate) struct OpenRead(std::time::Instant);

/// A read transaction held longer than this is logged (at debug) when it ends: while it lives,
/// no page freed after it began can be reused, and the file grows instead.
const LONG_READ: std::time::Duration = std::time::Duration::from_secs(1);

impl OpenRead {
    pub(crate) fn begin() -> OpenRead {
        OPEN_READS.fetch_add(1, Ordering::Relaxed);
        OpenRead(std::time::Instant::now())
    }
}

impl Drop for OpenRead {
    fn drop(&mut self) {
        OPEN_READS.fetch_sub(1, Ordering::Relaxed);
        let held = self.0.elapsed();
        if held > LONG_READ {
            tracing::debug!(took = ?held, "long read transaction ended");
        }
    }
}

/// The number of read transactions open now (etcd's `etcd_mvcc_db_open_read_transactions`).
pub fn open_read_transactions() -> i64 {
    OPEN_READS.load(Ordering::Relaxed)
}

/// Creates the backend's series, so that they show (at zero) before their first event, as
/// Go's registered histograms do.
pub fn init() {
    LazyLock::force(&COMMIT_SECONDS);
    LazyLock::force(&COMMIT_WRITE_SECONDS);
    LazyLock::force(&DEFRAG_SECONDS);
    LazyLock::force(&SNAPSHOT_SECONDS);
    LazyLock::force(&DEFRAG_INFLIGHT);
}
