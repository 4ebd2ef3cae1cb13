//! The peer series (etcd `rafthttp/metrics.go`, and the `etcd_snap_db_*` series of the
//! snapshot receiver, `etcd_server_heartbeat_send_failures_total` of the sender), counted
//! where the event happens, in the process's default registry as every crate's series are.
//! Label values are member ids only.

use std::sync::LazyLock;

use etcdrs_metrics::register;
use prometheus::{HistogramOpts, IntCounter, IntCounterVec, IntGauge, IntGaugeVec, Opts};

use crate::id_hex;

/// `etcd_server_heartbeat_send_failures_total`: heartbeats the leader could not hand to a
/// peer's link (its queue was full: the peer or the network is not keeping up).
pub static HEARTBEAT_SEND_FAILURES: LazyLock<IntCounter> = LazyLock::new(|| {
    register(IntCounter::new(
        "etcd_server_heartbeat_send_failures_total",
        "The total number of leader heartbeat send failures (likely overloaded from slow disk).",
    ))
});

/// `etcd_snap_db_save_total_duration_seconds`: receiving and saving a database snapshot
/// from the leader.
pub static SNAP_DB_SAVE_SECONDS: LazyLock<prometheus::Histogram> = LazyLock::new(|| {
    register(prometheus::Histogram::with_opts(
        HistogramOpts::new(
            "etcd_snap_db_save_total_duration_seconds",
            "The total latency distributions of v3 snapshot save",
        )
        .buckets(etcdrs_metrics::exponential(0.1, 2.0, 10)),
    ))
});

/// `etcd_snap_db_fsync_duration_seconds`: syncing a received database snapshot. Registered
/// for etcd's exposition but not observed: the received file is not synced (`receive`).
pub static SNAP_DB_FSYNC_SECONDS: LazyLock<prometheus::Histogram> = LazyLock::new(|| {
    register(prometheus::Histogram::with_opts(
        HistogramOpts::new(
            "etcd_snap_db_fsync_duration_seconds",
            "The latency distributions of fsyncing .snap.db file",
        )
        .buckets(etcdrs_metrics::exponential(0.001, 2.0, 14)),
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
        // etcd 3.5's 16 buckets (3.4 had 14).
        .buckets(etcdrs_metrics::exponential(0.0001, 2.0, 16)),
        &["To"],
    ))
});

/// `etcd_network_peer_received_failures_total{From}`: malformed messages from a member.
pub static PEER_RECEIVED_FAILURES: LazyLock<IntCounterVec> = LazyLock::new(|| {
    register(IntCounterVec::new(
        Opts::new(
            "etcd_network_peer_received_failures_total",
            "The total number of receive failures from peers.",
        ),
        &["From"],
    ))
});

/// `etcd_network_active_peers{Local, Remote}`: 1 while the link to a peer works.
static ACTIVE_PEERS: LazyLock<IntGaugeVec> = LazyLock::new(|| {
    register(IntGaugeVec::new(
        Opts::new(
            "etcd_network_active_peers",
            "The current number of active peer connections.",
        ),
        &["Local", "Remote"],
    ))
});

/// `etcd_network_disconnected_peers_total{Local, Remote}`: links that stopped working.
static DISCONNECTED_PEERS: LazyLock<IntCounterVec> = LazyLock::new(|| {
    register(IntCounterVec::new(
        Opts::new(
            "etcd_network_disconnected_peers_total",
            "The total number of disconnected peers.",
        ),
        &["Local", "Remote"],
    ))
});

/// Whether one peer link works, reflected in `etcd_network_active_peers` and
/// `etcd_network_disconnected_peers_total` (etcd `rafthttp.peerStatus`).
pub struct PeerActivity {
    active: bool,
    /// The same, for the transport's readers (membership changes ask whether a peer is up).
    shared: std::sync::Arc<std::sync::atomic::AtomicBool>,
    gauge: IntGauge,
    disconnected: IntCounter,
}

impl PeerActivity {
    /// The link from member `local` to member `remote`, not yet active; `shared` follows it.
    pub fn new(
        local: u64,
        remote: u64,
        shared: std::sync::Arc<std::sync::atomic::AtomicBool>,
    ) -> PeerActivity {
        let labels = [id_hex(local), id_hex(remote)];
        let labels = [labels[0].as_str(), labels[1].as_str()];
        PeerActivity {
            active: false,
            shared,
            gauge: ACTIVE_PEERS.with_label_values(&labels),
            disconnected: DISCONNECTED_PEERS.with_label_values(&labels),
        }
    }

    /// The link works; returns whether it did not before.
    pub fn up(&mut self) -> bool {
        if self.active {
            return false;
        }
        self.active = true;
        self.shared
            .store(true, std::sync::atomic::Ordering::Relaxed);
        self.gauge.inc();
        true
    }

    /// The link failed; returns whether it worked before.
    pub fn down(&mut self) -> bool {
        if !self.active {
            return false;
        }
        self.active = false;
        self.shared
            .store(false, std::sync::atomic::Ordering::Relaxed);
        self.gauge.dec();
        self.disconnected.inc();
        true
    }
}

impl Drop for PeerActivity {
    fn drop(&mut self) {
        // A link that stops (the member left, or this one stops) is no longer active.
        if self.active {
            self.gauge.dec();
        }
    }
}

macro_rules! peer_vec {
    ($(#[$doc:meta])* $static:ident: $kind:ident, $name:literal, $help:literal, $label:literal) => {
        $(#[$doc])*
        pub static $static: LazyLock<$kind> = LazyLock::new(|| {
            register($kind::new(Opts::new($name, $help), &[$label]))
        });
    };
}

peer_vec!(
    /// `etcd_network_snapshot_send_success{To}`.
    SNAPSHOT_SEND_SUCCESS: IntCounterVec,
    "etcd_network_snapshot_send_success",
    "Total number of successful snapshot sends",
    "To"
);
peer_vec!(
    /// `etcd_network_snapshot_send_failures{To}`.
    SNAPSHOT_SEND_FAILURES: IntCounterVec,
    "etcd_network_snapshot_send_failures",
    "Total number of snapshot send failures",
    "To"
);
peer_vec!(
    /// `etcd_network_snapshot_send_inflights_total{To}`.
    SNAPSHOT_SEND_INFLIGHTS: IntGaugeVec,
    "etcd_network_snapshot_send_inflights_total",
    "Total number of inflight snapshot sends",
    "To"
);
peer_vec!(
    /// `etcd_network_snapshot_receive_success{From}`.
    SNAPSHOT_RECEIVE_SUCCESS: IntCounterVec,
    "etcd_network_snapshot_receive_success",
    "Total number of successful snapshot receives",
    "From"
);
peer_vec!(
    /// `etcd_network_snapshot_receive_failures{From}`.
    SNAPSHOT_RECEIVE_FAILURES: IntCounterVec,
    "etcd_network_snapshot_receive_failures",
    "Total number of snapshot receive failures",
    "From"
);
peer_vec!(
    /// `etcd_network_snapshot_receive_inflights_total{From}`.
    SNAPSHOT_RECEIVE_INFLIGHTS: IntGaugeVec,
    "etcd_network_snapshot_receive_inflights_total",
    "Total number of inflight snapshot receives",
    "From"
);

/// `etcd_network_snapshot_send_total_duration_seconds{To}`.
pub static SNAPSHOT_SEND_SECONDS: LazyLock<prometheus::HistogramVec> = LazyLock::new(|| {
    register(prometheus::HistogramVec::new(
        HistogramOpts::new(
            "etcd_network_snapshot_send_total_duration_seconds",
            "Total latency distributions of v3 snapshot sends",
        )
        .buckets(etcdrs_metrics::exponential(0.1, 2.0, 10)),
        &["To"],
    ))
});

/// `etcd_network_snapshot_receive_total_duration_seconds{From}`.
pub static SNAPSHOT_RECEIVE_SECONDS: LazyLock<prometheus::HistogramVec> = LazyLock::new(|| {
    register(prometheus::HistogramVec::new(
        HistogramOpts::new(
            "etcd_network_snapshot_receive_total_duration_seconds",
            "Total latency distributions of v3 snapshot receives",
        )
        .buckets(etcdrs_metrics::exponential(0.1, 2.0, 10)),
        &["From"],
    ))
});

/// Creates the series that etcd registers at start, so that they show (at zero) before
/// their first event.
pub fn init() {
    LazyLock::force(&HEARTBEAT_SEND_FAILURES);
    LazyLock::force(&SNAP_DB_SAVE_SECONDS);
    LazyLock::force(&SNAP_DB_FSYNC_SECONDS);
}
