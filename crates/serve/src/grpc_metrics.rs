//! gRPC calls on the listeners that serve etcd's services (the server's client port, the gRPC
//! proxy's): go-grpc-prometheus's `grpc_server_*` series, with its labels, and the etcd series
//! counted where the messages pass (`etcd_network_client_grpc_*_bytes_total`,
//! `etcd_server_client_requests_total`), all in the process-wide default registry. [`wire`]
//! counts; this module holds the series, resolved once per method so that counting a call
//! hashes no labels.

use std::sync::LazyLock;
use std::time::Instant;

use etcdrs_metrics::register;
use prometheus::{HistogramOpts, IntCounter, IntCounterVec, Opts};

pub mod wire;

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
        | ("etcdserverpb.KV", "RangeStream")
        | ("v3electionpb.Election", "Observe")
        | ("grpc.health.v1.Health", "Watch") => "server_stream",
        _ => "unary",
    }
}

/// gRPC's name for a status code, as go-grpc-prometheus writes it.
#[cfg(test)]
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
pub const MEMBER_METHODS: &[(&str, &str)] = &[
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

/// Methods etcd serves beside those, registered after go-grpc-prometheus took its list: their
/// series appear with their first call. Also etcd 3.7's `KV.RangeStream`: etcd 3.7 shows its
/// series from start-up, but the etcd 3.5 that members report being has no such method.
pub const LATE_METHODS: &[(&str, &str)] = &[
    ("etcdserverpb.KV", "RangeStream"),
    ("v3lockpb.Lock", "Lock"),
    ("v3lockpb.Lock", "Unlock"),
    ("v3electionpb.Election", "Campaign"),
    ("v3electionpb.Election", "Proclaim"),
    ("v3electionpb.Election", "Leader"),
    ("v3electionpb.Election", "Observe"),
    ("v3electionpb.Election", "Resign"),
];

/// `grpc_server_msg_received_total`.
static GRPC_MSG_RECEIVED: LazyLock<IntCounterVec> = LazyLock::new(|| {
    register(IntCounterVec::new(
        Opts::new(
            "grpc_server_msg_received_total",
            "Total number of RPC stream messages received on the server.",
        ),
        &["grpc_method", "grpc_service", "grpc_type"],
    ))
});

/// `grpc_server_msg_sent_total`.
static GRPC_MSG_SENT: LazyLock<IntCounterVec> = LazyLock::new(|| {
    register(IntCounterVec::new(
        Opts::new(
            "grpc_server_msg_sent_total",
            "Total number of gRPC stream messages sent by the server.",
        ),
        &["grpc_method", "grpc_service", "grpc_type"],
    ))
});

/// `etcd_network_client_grpc_received_bytes_total`: request message bytes, as decoded.
pub(crate) static GRPC_RECEIVED_BYTES: LazyLock<IntCounter> = LazyLock::new(|| {
    register(IntCounter::new(
        "etcd_network_client_grpc_received_bytes_total",
        "The total number of bytes received from grpc clients.",
    ))
});

/// `etcd_network_client_grpc_sent_bytes_total`: response message bytes, as encoded.
pub(crate) static GRPC_SENT_BYTES: LazyLock<IntCounter> = LazyLock::new(|| {
    register(IntCounter::new(
        "etcd_network_client_grpc_sent_bytes_total",
        "The total number of bytes sent to grpc clients.",
    ))
});

/// `etcd_server_client_requests_total{type, client_api_version}`.
static CLIENT_REQUESTS: LazyLock<IntCounterVec> = LazyLock::new(|| {
    register(IntCounterVec::new(
        Opts::new(
            "etcd_server_client_requests_total",
            "The total number of client requests per client version.",
        ),
        &["type", "client_api_version"],
    ))
});

/// The client API versions counted by name (etcd's clients send their major.minor as
/// `client-api-version`); any other value counts as "unknown", as a missing one does in
/// etcd, so that clients cannot create series.
const CLIENT_API_VERSIONS: [&str; 8] = ["3.0", "3.1", "3.2", "3.3", "3.4", "3.5", "3.6", "3.7"];

/// `etcd_server_client_requests_total` series, `[unary, stream]` per version, "unknown"
/// last; each created with its first request, as etcd's appear.
static CLIENT_REQUEST_SERIES: LazyLock<Vec<[std::sync::OnceLock<IntCounter>; 2]>> =
    LazyLock::new(|| {
        (0..=CLIENT_API_VERSIONS.len())
            .map(|_| [std::sync::OnceLock::new(), std::sync::OnceLock::new()])
            .collect()
    });

/// Count one client call of a streaming (or unary) method with this `client-api-version`.
pub(crate) fn count_client_request(streaming: bool, version: Option<&[u8]>) {
    let known = version.and_then(|v| CLIENT_API_VERSIONS.iter().position(|k| k.as_bytes() == v));
    let at = known.unwrap_or(CLIENT_API_VERSIONS.len());
    let label = CLIENT_API_VERSIONS.get(at).copied().unwrap_or("unknown");
    let kind = if streaming { "stream" } else { "unary" };
    CLIENT_REQUEST_SERIES[at][usize::from(streaming)]
        .get_or_init(|| CLIENT_REQUESTS.with_label_values(&[kind, label]))
        .inc();
}

/// One method's series, resolved once so that counting a call hashes no labels.
pub(crate) struct MethodSeries {
    started: IntCounter,
    /// `grpc_server_handled_total` by code, indexed as [`CODE_NAMES`].
    handled: Vec<IntCounter>,
    /// Only with `--metrics=extensive`, as etcd.
    handling: Option<prometheus::Histogram>,
    pub(crate) msg_received: IntCounter,
    pub(crate) msg_sent: IntCounter,
    /// Whether the method streams (etcd's `type="stream"` of client requests).
    pub(crate) streaming: bool,
}

impl MethodSeries {
    /// Count a call of the method as started; returns when, if its duration is observed.
    pub(crate) fn count_started(&self) -> Option<Instant> {
        self.started.inc();
        self.handling.as_ref().map(|_| Instant::now())
    }

    /// Count a call as handled with gRPC code `code`, started at `started` (if timed).
    pub(crate) fn count_handled(&self, code: usize, started: Option<Instant>) {
        let code = if code < CODE_NAMES.len() { code } else { 2 };
        self.handled[code].inc();
        if let (Some(handling), Some(started)) = (&self.handling, started) {
            handling.observe(started.elapsed().as_secs_f64());
        }
    }

    fn new(service: &str, method: &str) -> Self {
        let kind = grpc_type(service, method);
        let labels = [method, service, kind];
        MethodSeries {
            started: GRPC_STARTED.with_label_values(&labels),
            handled: CODE_NAMES
                .iter()
                .map(|code| GRPC_HANDLED.with_label_values(&[code, method, service, kind]))
                .collect(),
            handling: EXTENSIVE
                .load(std::sync::atomic::Ordering::Relaxed)
                .then(|| GRPC_HANDLING.with_label_values(&labels)),
            msg_received: GRPC_MSG_RECEIVED.with_label_values(&labels),
            msg_sent: GRPC_MSG_SENT.with_label_values(&labels),
            streaming: kind != "unary",
        }
    }
}

/// A method's series, created at start-up or with its first call.
struct MethodEntry {
    service: &'static str,
    method: &'static str,
    series: std::sync::OnceLock<MethodSeries>,
}

/// etcd's methods by request path (`/service/method`); no other path gets series.
static METHOD_SERIES: LazyLock<std::collections::HashMap<String, MethodEntry>> =
    LazyLock::new(|| {
        MEMBER_METHODS
            .iter()
            .chain(LATE_METHODS)
            .map(|&(service, method)| {
                let entry = MethodEntry {
                    service,
                    method,
                    series: std::sync::OnceLock::new(),
                };
                (format!("/{service}/{method}"), entry)
            })
            .collect()
    });

/// The series of the method at `path`, if it is one of etcd's.
pub(crate) fn method_series(path: &str) -> Option<&'static MethodSeries> {
    let entry = METHOD_SERIES.get(path)?;
    Some(
        entry
            .series
            .get_or_init(|| MethodSeries::new(entry.service, entry.method)),
    )
}

/// Creates the series of `methods` (at zero), as go-grpc-prometheus shows the methods a
/// server registered before it, plus the byte counters.
pub fn init_series(methods: &[(&str, &str)]) {
    for (service, method) in methods {
        let _ = method_series(&format!("/{service}/{method}"));
    }
    LazyLock::force(&GRPC_RECEIVED_BYTES);
    LazyLock::force(&GRPC_SENT_BYTES);
    LazyLock::force(&CLIENT_REQUESTS);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grpc_labels() {
        assert_eq!(grpc_type("etcdserverpb.Watch", "Watch"), "bidi_stream");
        assert_eq!(grpc_type("etcdserverpb.KV", "Range"), "unary");
        assert_eq!(grpc_type("etcdserverpb.KV", "RangeStream"), "server_stream");
        assert_eq!(code_name("3"), "InvalidArgument");
        assert_eq!(code_name("0"), "OK");
        for (i, name) in CODE_NAMES.iter().enumerate() {
            assert_eq!(code_name(&i.to_string()), *name);
        }
        assert_eq!(grpc_type("grpc.health.v1.Health", "Watch"), "server_stream");
    }
}
