//! The store's Prometheus series, with etcd's names (etcd `server/storage/mvcc/metrics.go`,
//! `metrics_txn.go`, `server/lease/metrics.go`), in the process-wide default registry.
//!
//! Counting follows etcd's `metricsTxnWrite`: every transaction (a read of the committed store,
//! or a write transaction inside a batch) tallies its ranges, puts and deletes and adds them
//! when it ends; a transaction of more than one operation also counts as a txn.

use std::sync::LazyLock;

use etcdrs_metrics::register;
use prometheus::{Histogram, HistogramOpts, IntCounter, IntGauge};

fn histogram(name: &str, help: &str, start: f64, count: usize) -> prometheus::Result<Histogram> {
    Histogram::with_opts(
        HistogramOpts::new(name, help).buckets(etcdrs_metrics::exponential(start, 2.0, count)),
    )
}

macro_rules! counter {
    ($(#[$doc:meta])* $static:ident, $name:literal, $help:literal) => {
        $(#[$doc])*
        pub static $static: LazyLock<IntCounter> =
            LazyLock::new(|| register(IntCounter::new($name, $help)));
    };
}

counter!(
    /// `etcd_mvcc_range_total` (3.4 also as `etcd_debugging_mvcc_range_total`).
    RANGES,
    "etcd_mvcc_range_total",
    "Total number of ranges seen by this member."
);
counter!(
    /// `etcd_mvcc_put_total` (3.4 also as `etcd_debugging_mvcc_put_total`).
    PUTS,
    "etcd_mvcc_put_total",
    "Total number of puts seen by this member."
);
counter!(
    /// `etcd_mvcc_delete_total`: delete-range operations (3.4 also as
    /// `etcd_debugging_mvcc_delete_total`).
    DELETES,
    "etcd_mvcc_delete_total",
    "Total number of deletes seen by this member."
);
counter!(
    /// `etcd_mvcc_txn_total`: transactions of more than one operation (3.4 also as
    /// `etcd_debugging_mvcc_txn_total`).
    TXNS,
    "etcd_mvcc_txn_total",
    "Total number of txns seen by this member."
);
counter!(
    /// `etcd_debugging_mvcc_events_total`: events handed to watchers.
    EVENTS,
    "etcd_debugging_mvcc_events_total",
    "Total number of events sent by this member."
);
counter!(
    /// `etcd_debugging_mvcc_db_compaction_keys_total`: values compaction deleted.
    COMPACTION_KEYS,
    "etcd_debugging_mvcc_db_compaction_keys_total",
    "Total number of db keys compacted."
);
counter!(
    /// `etcd_debugging_lease_granted_total`.
    LEASES_GRANTED,
    "etcd_debugging_lease_granted_total",
    "The total number of granted leases."
);
counter!(
    /// `etcd_debugging_lease_revoked_total`: revoked by request or expired.
    LEASES_REVOKED,
    "etcd_debugging_lease_revoked_total",
    "The total number of revoked leases."
);
counter!(
    /// `etcd_debugging_lease_renewed_total`: keep-alives the leader honoured.
    LEASES_RENEWED,
    "etcd_debugging_lease_renewed_total",
    "The number of renewed leases seen by the leader."
);

/// `etcd_debugging_mvcc_total_put_size_in_bytes` (a gauge in etcd): key and value bytes of
/// every put.
pub static PUT_BYTES: LazyLock<IntGauge> = LazyLock::new(|| {
    register(IntGauge::new(
        "etcd_debugging_mvcc_total_put_size_in_bytes",
        "The total size of put kv pairs seen by this member.",
    ))
});

/// `etcd_debugging_mvcc_pending_events_total`: events handed to watch streams that the
/// streams have not taken yet.
pub static PENDING_EVENTS: LazyLock<IntGauge> = LazyLock::new(|| {
    register(IntGauge::new(
        "etcd_debugging_mvcc_pending_events_total",
        "Total number of pending events to be sent.",
    ))
});

/// `etcd_debugging_mvcc_watch_stream_total`: open watch streams.
pub static WATCH_STREAMS: LazyLock<IntGauge> = LazyLock::new(|| {
    register(IntGauge::new(
        "etcd_debugging_mvcc_watch_stream_total",
        "Total number of watch streams.",
    ))
});

/// `etcd_debugging_mvcc_db_compaction_last` (etcd 3.5): unix time of the last compaction.
pub static COMPACTION_LAST: LazyLock<IntGauge> = LazyLock::new(|| {
    register(IntGauge::new(
        "etcd_debugging_mvcc_db_compaction_last",
        "The unix time of the last db compaction. Resets to 0 on start.",
    ))
});

/// `etcd_debugging_mvcc_index_compaction_pause_duration_milliseconds`: compacting the index.
pub static INDEX_COMPACTION_PAUSE_MS: LazyLock<Histogram> = LazyLock::new(|| {
    register(histogram(
        "etcd_debugging_mvcc_index_compaction_pause_duration_milliseconds",
        "Bucketed histogram of index compaction pause duration.",
        0.5,
        14,
    ))
});

/// `etcd_debugging_mvcc_db_compaction_pause_duration_milliseconds`: one step of deleting
/// compacted values (a batch of `--experimental-compaction-batch-limit` revisions, as etcd's).
pub static DB_COMPACTION_PAUSE_MS: LazyLock<Histogram> = LazyLock::new(|| {
    register(histogram(
        "etcd_debugging_mvcc_db_compaction_pause_duration_milliseconds",
        "Bucketed histogram of db compaction pause duration.",
        1.0,
        13,
    ))
});

/// `etcd_debugging_mvcc_db_compaction_total_duration_milliseconds`: a whole compaction.
pub static DB_COMPACTION_TOTAL_MS: LazyLock<Histogram> = LazyLock::new(|| {
    register(histogram(
        "etcd_debugging_mvcc_db_compaction_total_duration_milliseconds",
        "Bucketed histogram of db compaction total duration.",
        100.0,
        14,
    ))
});

/// `etcd_mvcc_hash_duration_seconds`: hashing the whole backend (Maintenance.Hash).
pub static HASH_SECONDS: LazyLock<Histogram> = LazyLock::new(|| {
    register(histogram(
        "etcd_mvcc_hash_duration_seconds",
        "The latency distribution of storage hash operation.",
        0.01,
        15,
    ))
});

/// `etcd_mvcc_hash_rev_duration_seconds`: hashing the keyspace up to a revision (HashKV).
pub static HASH_REV_SECONDS: LazyLock<Histogram> = LazyLock::new(|| {
    register(histogram(
        "etcd_mvcc_hash_rev_duration_seconds",
        "The latency distribution of storage hash by revision operation.",
        0.01,
        15,
    ))
});

/// `etcd_debugging_lease_ttl_total`: the TTL of each granted lease.
pub static LEASE_TTLS: LazyLock<Histogram> = LazyLock::new(|| {
    register(histogram(
        "etcd_debugging_lease_ttl_total",
        "Bucketed histogram of lease TTLs.",
        1.0,
        24,
    ))
});

/// Creates every series of the store, so that they show (at zero) before their first event.
pub fn init() {
    for counter in [
        &RANGES,
        &PUTS,
        &DELETES,
        &TXNS,
        &EVENTS,
        &COMPACTION_KEYS,
        &LEASES_GRANTED,
        &LEASES_REVOKED,
        &LEASES_RENEWED,
    ] {
        LazyLock::force(counter);
    }
    for gauge in [
        &PUT_BYTES,
        &PENDING_EVENTS,
        &WATCH_STREAMS,
        &COMPACTION_LAST,
    ] {
        LazyLock::force(gauge);
    }
    for histogram in [
        &INDEX_COMPACTION_PAUSE_MS,
        &DB_COMPACTION_PAUSE_MS,
        &DB_COMPACTION_TOTAL_MS,
        &HASH_SECONDS,
        &HASH_REV_SECONDS,
        &LEASE_TTLS,
    ] {
        LazyLock::force(histogram);
    }
}

/// One transaction's operations, added to the counters when it ends.
#[derive(Debug, Default)]
pub(crate) struct TxnTally {
    pub(crate) ranges: std::cell::Cell<u64>,
    pub(crate) puts: u64,
    pub(crate) deletes: u64,
    pub(crate) put_bytes: u64,
}

impl TxnTally {
    /// Add this transaction to the counters (etcd's `metricsTxnWrite.End`).
    pub(crate) fn end(&self) {
        let ranges = self.ranges.get();
        if ranges + self.puts + self.deletes > 1 {
            TXNS.inc();
        }
        if ranges > 0 {
            RANGES.inc_by(ranges);
        }
        if self.puts > 0 {
            PUTS.inc_by(self.puts);
            PUT_BYTES.add(i64::try_from(self.put_bytes).unwrap_or(i64::MAX));
        }
        if self.deletes > 0 {
            DELETES.inc_by(self.deletes);
        }
    }
}

/// Events waiting in a watch stream's channel: counted in
/// `etcd_debugging_mvcc_pending_events_total` until the message is dropped (taken by the
/// stream, or discarded with its channel).
#[derive(Debug)]
pub struct Pending(i64);

impl Pending {
    pub(crate) fn new(events: usize) -> Pending {
        let n = i64::try_from(events).unwrap_or(i64::MAX);
        PENDING_EVENTS.add(n);
        Pending(n)
    }
}

impl Drop for Pending {
    fn drop(&mut self) {
        PENDING_EVENTS.sub(self.0);
    }
}
