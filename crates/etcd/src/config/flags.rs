//! The flag table (every flag etcd 3.5 accepts, plus the 3.6 v3-discovery flags) and a
//! parser with Go `flag.FlagSet` semantics: `-f` and `--f`, `--f=v` and `--f v`, bool flags
//! only as `--f` or `--f=<bool>`, parsing stops at the first non-flag argument, and `--`
//! ends the flags. `ETCD_<FLAG>` environment variables are applied the way etcd's
//! `pkg/flags.SetFlagsFromEnv` does it.

use std::collections::{BTreeMap, BTreeSet};

use super::goparse::{self, quote};
use super::gourl::{self, GoUrl};

/// How a flag's value is parsed (which Go `flag.Value` etcd uses for it).
#[derive(Debug, Clone, Copy)]
pub(crate) enum Kind {
    Str,
    Bool,
    /// Go `uint` (64-bit).
    Uint,
    Uint64,
    /// Go `int` (64-bit).
    Int,
    Int64,
    /// etcd's `uint32Value`, whose error is the raw `strconv` text.
    Uint32,
    Duration,
    /// etcd's `UniqueURLs` with one allowed non-URL exception (`""` or `"*"`).
    Urls {
        exception: &'static str,
    },
    /// etcd's `UniqueStringsValue`: a comma list kept as a sorted set.
    UniqueStrings,
    /// etcd's `StringsValue`: a comma list kept in order.
    Strings,
    /// etcd's `SelectiveStringValue`.
    Select(&'static [&'static str]),
    /// etcd's `SelectiveStringsValue` (appends, sorted).
    SelectMulti(&'static [&'static str]),
    /// etcd's `IgnoredFlag`: accepted like a bool, warned about, otherwise ignored.
    Ignored,
    /// etcd 3.6's `--feature-gates`: `Name=bool` pairs, checked on set, each set adding to
    /// the pairs before it (`config::renamed`).
    FeatureGates,
}

/// The `--help` section a flag is listed under.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Group {
    Member,
    Clustering,
    V3Discovery,
    Security,
    Auth,
    Profiling,
    Logging,
    Tracing,
    V2Proxy,
    Experimental,
    Unsafe,
    /// Accepted but not listed (`--config-file`, `--version`, ignored legacy flags).
    Hidden,
}

/// One flag: its name, parser, Go default (as Go would print it) and help text.
#[derive(Debug)]
pub(crate) struct FlagDef {
    pub(crate) name: &'static str,
    pub(crate) kind: Kind,
    pub(crate) default: &'static str,
    pub(crate) group: Group,
    pub(crate) help: &'static str,
}

const fn flag(
    name: &'static str,
    kind: Kind,
    default: &'static str,
    group: Group,
    help: &'static str,
) -> FlagDef {
    FlagDef {
        name,
        kind,
        default,
        group,
        help,
    }
}

const NO_URL_EXCEPTION: Kind = Kind::Urls { exception: "" };

pub(crate) const CLUSTER_STATES: &[&str] = &["new", "existing"];
pub(crate) const FALLBACKS: &[&str] = &["proxy", "exit"];
pub(crate) const PROXY_MODES: &[&str] = &["off", "readonly", "on"];
pub(crate) const V2_DEPRECATION_STAGES: &[&str] =
    &["not-yet", "write-only", "write-only-drop-data", "gone"];

/// etcd's default for `--log-rotation-config-json`.
pub(crate) const DEFAULT_LOG_ROTATION_CONFIG: &str =
    r#"{"maxsize": 100, "maxage": 0, "maxbackups": 0, "localtime": false, "compress": false}"#;

use Group as G;
use Kind as K;

/// Every flag, in `--help` order.
#[rustfmt::skip]
pub(crate) static FLAGS: &[FlagDef] = &[
    // Member
    flag("name", K::Str, "default", G::Member, "This member's human-readable name; it must appear in --initial-cluster."),
    flag("data-dir", K::Str, "", G::Member, "Directory for the member's data (default '${name}.etcd')."),
    flag("wal-dir", K::Str, "", G::Member, "Put the write-ahead log in this directory instead of inside --data-dir."),
    flag("snapshot-count", K::Uint64, "100000", G::Member, "Take a snapshot after this many committed entries."),
    flag("heartbeat-interval", K::Uint, "100", G::Member, "Leader heartbeat period, in milliseconds."),
    flag("election-timeout", K::Uint, "1000", G::Member, "How long a follower waits for a heartbeat before it campaigns, in milliseconds."),
    flag("initial-election-tick-advance", K::Bool, "true", G::Member, "Skip most of the first election timeout after boot so a leader is chosen sooner."),
    flag("listen-peer-urls", K::Urls { exception: "" }, "http://localhost:2380", G::Member, "Comma-separated URLs to accept peer (raft) connections on."),
    flag("listen-client-urls", NO_URL_EXCEPTION, "http://localhost:2379", G::Member, "Comma-separated URLs to serve clients on (gRPC, and HTTP unless --listen-client-http-urls is given)."),
    flag("listen-client-http-urls", NO_URL_EXCEPTION, "", G::Member, "Comma-separated URLs that serve only the HTTP endpoints; when set, --listen-client-urls serves gRPC only."),
    flag("max-snapshots", K::Uint, "5", G::Member, "How many snapshot files to keep (0 keeps all)."),
    flag("max-wals", K::Uint, "5", G::Member, "How many WAL files to keep (0 keeps all)."),
    flag("quota-backend-bytes", K::Int64, "0", G::Member, "Raise a NOSPACE alarm when the backend grows past this many bytes (0 means the 2 GiB default)."),
    flag("backend-bbolt-freelist-type", K::Str, "", G::Member, "Backend freelist layout, 'map' or 'array' (empty means 'map'); kept for compatibility."),
    flag("backend-batch-interval", K::Duration, "0s", G::Member, "Longest time a backend write batch stays open before it is committed."),
    flag("backend-batch-limit", K::Int, "0", G::Member, "Most operations in one backend write batch before it is committed."),
    flag("max-txn-ops", K::Uint, "128", G::Member, "Most operations a single transaction may contain."),
    flag("max-request-bytes", K::Uint, "1572864", G::Member, "Largest client request, in bytes, the server accepts."),
    flag("max-concurrent-streams", K::Uint32, "4294967295", G::Member, "Most concurrent gRPC streams one client connection may open."),
    flag("grpc-keepalive-min-time", K::Duration, "5s", G::Member, "Shortest interval a client may use between keepalive pings."),
    flag("grpc-keepalive-interval", K::Duration, "2h0m0s", G::Member, "How often the server pings an idle client connection (0 disables)."),
    flag("grpc-keepalive-timeout", K::Duration, "20s", G::Member, "How long to wait for a ping reply before closing the connection (0 disables)."),
    flag("socket-reuse-port", K::Bool, "false", G::Member, "Set SO_REUSEPORT on listeners."),
    flag("socket-reuse-address", K::Bool, "false", G::Member, "Set SO_REUSEADDR on listeners."),
    flag("raft-read-timeout", K::Duration, "5s", G::Member, "Read timeout on peer connections (never below 5s)."),
    flag("raft-write-timeout", K::Duration, "5s", G::Member, "Write timeout on peer connections (never below 5s)."),
    // Clustering
    flag("initial-advertise-peer-urls", NO_URL_EXCEPTION, "http://localhost:2380", G::Clustering, "Peer URLs this member announces to the rest of the cluster."),
    flag("initial-cluster", K::Str, "default=http://localhost:2380", G::Clustering, "Bootstrap membership as name=peerURL pairs, comma-separated."),
    flag("initial-cluster-state", K::Select(CLUSTER_STATES), "new", G::Clustering, "'new' to bootstrap a cluster, 'existing' to join one; ignored once the member has data."),
    flag("initial-cluster-token", K::Str, "etcd-cluster", G::Clustering, "Token that keeps separately bootstrapped clusters from mixing up their members."),
    flag("advertise-client-urls", NO_URL_EXCEPTION, "http://localhost:2379", G::Clustering, "Client URLs this member publishes; clients use them to reach it."),
    flag("discovery", K::Str, "", G::Clustering, "v2 discovery service URL to bootstrap from."),
    flag("discovery-fallback", K::Select(FALLBACKS), "proxy", G::Clustering, "What to do when discovery fails: 'exit' or 'proxy'."),
    flag("discovery-proxy", K::Str, "", G::Clustering, "HTTP proxy for talking to the discovery service."),
    flag("discovery-srv", K::Str, "", G::Clustering, "DNS domain whose SRV records list the bootstrap peers."),
    flag("discovery-srv-name", K::Str, "", G::Clustering, "Suffix added to the SRV service names that are queried."),
    flag("strict-reconfig-check", K::Bool, "true", G::Clustering, "Refuse membership changes that would lose quorum."),
    flag("pre-vote", K::Bool, "true", G::Clustering, "Run raft's pre-vote phase before real elections."),
    flag("auto-compaction-retention", K::Str, "0", G::Clustering, "How much history to keep when compacting automatically (0 turns it off)."),
    flag("auto-compaction-mode", K::Str, "periodic", G::Clustering, "How to read --auto-compaction-retention: 'periodic' (a duration, bare numbers are hours) or 'revision' (a revision count)."),
    flag("enable-v2", K::Bool, "false", G::Clustering, "Serve the v2 API (deprecated)."),
    flag("experimental-enable-v2v3", K::Str, "", G::Clustering, "Prefix under which v2 requests are emulated on the v3 store (deprecated)."),
    flag("v2-deprecation", K::SelectMulti(V2_DEPRECATION_STAGES), "", G::Clustering, "v2 store deprecation stage: not-yet, write-only, write-only-drop-data or gone."),
    // v3 discovery (etcd 3.6)
    flag("discovery-endpoints", K::UniqueStrings, "", G::V3Discovery, "gRPC endpoints of the etcd cluster used for v3 discovery."),
    flag("discovery-token", K::Str, "", G::V3Discovery, "Token naming the cluster being bootstrapped through v3 discovery."),
    flag("discovery-dial-timeout", K::Duration, "2s", G::V3Discovery, "Dial timeout towards the discovery cluster."),
    flag("discovery-request-timeout", K::Duration, "5s", G::V3Discovery, "Per-request timeout towards the discovery cluster."),
    flag("discovery-keepalive-time", K::Duration, "2s", G::V3Discovery, "Keepalive interval towards the discovery cluster."),
    flag("discovery-keepalive-timeout", K::Duration, "6s", G::V3Discovery, "Keepalive timeout towards the discovery cluster."),
    flag("discovery-insecure-transport", K::Bool, "true", G::V3Discovery, "Talk to the discovery cluster without TLS."),
    flag("discovery-insecure-skip-tls-verify", K::Bool, "false", G::V3Discovery, "Do not verify the discovery cluster's certificate (testing only)."),
    flag("discovery-cert", K::Str, "", G::V3Discovery, "Client certificate for the discovery cluster."),
    flag("discovery-key", K::Str, "", G::V3Discovery, "Client key for the discovery cluster."),
    flag("discovery-cacert", K::Str, "", G::V3Discovery, "CA bundle that signs the discovery cluster's certificates."),
    flag("discovery-user", K::Str, "", G::V3Discovery, "username[:password] for the discovery cluster."),
    flag("discovery-password", K::Str, "", G::V3Discovery, "Password for the discovery cluster."),
    // Security
    flag("cert-file", K::Str, "", G::Security, "Certificate served to clients."),
    flag("key-file", K::Str, "", G::Security, "Key for --cert-file."),
    flag("client-cert-auth", K::Bool, "false", G::Security, "Require clients to present a certificate signed by --trusted-ca-file."),
    flag("client-cert-file", K::Str, "", G::Security, "Certificate this member presents when it acts as a client (defaults to --cert-file)."),
    flag("client-key-file", K::Str, "", G::Security, "Key for --client-cert-file."),
    flag("client-crl-file", K::Str, "", G::Security, "Revocation list checked against client certificates."),
    flag("client-cert-allowed-hostname", K::Strings, "", G::Security, "Comma-separated SAN hostnames a client certificate must carry."),
    flag("trusted-ca-file", K::Str, "", G::Security, "CA bundle for verifying client certificates."),
    flag("auto-tls", K::Bool, "false", G::Security, "Serve clients with a generated self-signed certificate."),
    flag("peer-cert-file", K::Str, "", G::Security, "Certificate served to peers."),
    flag("peer-key-file", K::Str, "", G::Security, "Key for --peer-cert-file."),
    flag("peer-client-cert-auth", K::Bool, "false", G::Security, "Require peers to present a certificate signed by --peer-trusted-ca-file."),
    flag("peer-trusted-ca-file", K::Str, "", G::Security, "CA bundle for verifying peer certificates."),
    flag("peer-cert-allowed-cn", K::Strings, "", G::Security, "Comma-separated common names a peer certificate may carry."),
    flag("peer-cert-allowed-hostname", K::Strings, "", G::Security, "Comma-separated SAN hostnames a peer certificate may carry."),
    flag("peer-auto-tls", K::Bool, "false", G::Security, "Use a generated self-signed certificate between peers when no peer certificate is given."),
    flag("peer-client-cert-file", K::Str, "", G::Security, "Certificate presented when dialing peers (defaults to --peer-cert-file)."),
    flag("peer-client-key-file", K::Str, "", G::Security, "Key for --peer-client-cert-file."),
    flag("self-signed-cert-validity", K::Uint, "1", G::Security, "Lifetime in years of certificates generated by --auto-tls and --peer-auto-tls."),
    flag("peer-crl-file", K::Str, "", G::Security, "Revocation list checked against peer certificates."),
    flag("cipher-suites", K::Strings, "", G::Security, "Comma-separated TLS cipher suites for clients and peers (empty picks defaults)."),
    flag("cors", K::Urls { exception: "*" }, "*", G::Security, "Comma-separated CORS origins ('*' allows any)."),
    flag("host-whitelist", K::UniqueStrings, "*", G::Security, "Comma-separated Host header values accepted on plain-HTTP client requests ('*' accepts any)."),
    flag("tls-min-version", K::Str, "TLS1.2", G::Security, "Lowest TLS version accepted: TLS1.2 or TLS1.3."),
    flag("tls-max-version", K::Str, "", G::Security, "Highest TLS version accepted: TLS1.2 or TLS1.3 (empty means the newest supported)."),
    flag("experimental-peer-skip-client-san-verification", K::Bool, "false", G::Security, "Do not check the SAN of client certificates presented by peers."),
    flag("peer-skip-client-san-verification", K::Bool, "false", G::Security, "etcd 3.6's name for --experimental-peer-skip-client-san-verification."),
    // Auth
    flag("auth-token", K::Str, "simple", G::Auth, "Auth token type and options: 'simple' or 'jwt,...'."),
    flag("bcrypt-cost", K::Uint, "10", G::Auth, "bcrypt cost for hashing user passwords (4 to 31)."),
    flag("auth-token-ttl", K::Uint, "300", G::Auth, "Lifetime of a simple auth token, in seconds."),
    // Profiling and monitoring
    flag("enable-pprof", K::Bool, "false", G::Profiling, "Expose profiling endpoints under /debug/pprof/ on the client URLs."),
    flag("metrics", K::Str, "basic", G::Profiling, "Metrics detail: 'basic', or 'extensive' to add gRPC latency histograms."),
    flag("listen-metrics-urls", NO_URL_EXCEPTION, "", G::Profiling, "Extra URLs that serve only /metrics and /health (https ones reuse the client TLS settings)."),
    flag("enable-grpc-gateway", K::Bool, "true", G::Profiling, "Serve the JSON/HTTP gateway to the v3 API."),
    // Logging
    flag("logger", K::Str, "zap", G::Logging, "Logger implementation; only 'zap' (structured) is supported."),
    flag("log-outputs", K::UniqueStrings, "default", G::Logging, "Where logs go: 'default' or 'stderr', 'stdout', 'systemd/journal', or file paths, comma-separated."),
    flag("log-level", K::Str, "info", G::Logging, "Lowest level logged: debug, info, warn, error, panic or fatal."),
    flag("enable-log-rotation", K::Bool, "false", G::Logging, "Rotate the single file named in --log-outputs."),
    flag("log-rotation-config-json", K::Str, DEFAULT_LOG_ROTATION_CONFIG, G::Logging, "Rotation settings as JSON (maxsize in MB, maxage in days, maxbackups, localtime, compress)."),
    // Tracing
    flag("experimental-enable-distributed-tracing", K::Bool, "false", G::Tracing, "Export OpenTelemetry traces."),
    flag("experimental-distributed-tracing-address", K::Str, "localhost:4317", G::Tracing, "Collector address for traces."),
    flag("experimental-distributed-tracing-service-name", K::Str, "etcd", G::Tracing, "Service name on exported traces; keep it the same on every member."),
    flag("experimental-distributed-tracing-instance-id", K::Str, "", G::Tracing, "Instance id on exported traces; unique per member."),
    flag("experimental-distributed-tracing-sampling-rate", K::Int, "0", G::Tracing, "Spans sampled per million (0 samples none)."),
    flag("enable-distributed-tracing", K::Bool, "false", G::Tracing, "etcd 3.6's name for --experimental-enable-distributed-tracing."),
    flag("distributed-tracing-address", K::Str, "localhost:4317", G::Tracing, "etcd 3.6's name for --experimental-distributed-tracing-address."),
    flag("distributed-tracing-service-name", K::Str, "etcd", G::Tracing, "etcd 3.6's name for --experimental-distributed-tracing-service-name."),
    flag("distributed-tracing-instance-id", K::Str, "", G::Tracing, "etcd 3.6's name for --experimental-distributed-tracing-instance-id."),
    flag("distributed-tracing-sampling-rate", K::Int, "0", G::Tracing, "etcd 3.6's name for --experimental-distributed-tracing-sampling-rate."),
    // v2 proxy
    flag("proxy", K::Select(PROXY_MODES), "off", G::V2Proxy, "v2 proxy mode: 'off', 'readonly' or 'on' (not supported by etcd-rs)."),
    flag("proxy-failure-wait", K::Uint, "5000", G::V2Proxy, "Milliseconds a failed endpoint stays out of rotation."),
    flag("proxy-refresh-interval", K::Uint, "30000", G::V2Proxy, "Milliseconds between endpoint refreshes."),
    flag("proxy-dial-timeout", K::Uint, "1000", G::V2Proxy, "Dial timeout in milliseconds (0 disables)."),
    flag("proxy-write-timeout", K::Uint, "5000", G::V2Proxy, "Write timeout in milliseconds (0 disables)."),
    flag("proxy-read-timeout", K::Uint, "0", G::V2Proxy, "Read timeout in milliseconds (0 disables)."),
    // Experimental
    flag("experimental-initial-corrupt-check", K::Bool, "false", G::Experimental, "Compare hashes with the peers before serving any traffic."),
    flag("experimental-corrupt-check-time", K::Duration, "0s", G::Experimental, "Period of the cluster-wide corruption check (0 disables)."),
    flag("experimental-compact-hash-check-enabled", K::Bool, "false", G::Experimental, "Let the leader compare compaction hashes with the followers."),
    flag("experimental-compact-hash-check-time", K::Duration, "1m0s", G::Experimental, "Period of the compaction hash check."),
    flag("experimental-enable-lease-checkpoint", K::Bool, "false", G::Experimental, "Have the leader checkpoint lease TTLs so a leader change does not reset them."),
    flag("experimental-enable-lease-checkpoint-persist", K::Bool, "false", G::Experimental, "Persist lease checkpoints (needs --experimental-enable-lease-checkpoint)."),
    flag("experimental-compaction-batch-limit", K::Int, "0", G::Experimental, "Most revisions deleted per compaction batch (0 means 1000)."),
    flag("experimental-compaction-sleep-interval", K::Duration, "0s", G::Experimental, "Pause between compaction batches (0 means 10ms)."),
    flag("experimental-watch-progress-notify-interval", K::Duration, "0s", G::Experimental, "Period of watch progress notifications (0 means 10m)."),
    flag("experimental-downgrade-check-time", K::Duration, "5s", G::Experimental, "Period of the downgrade status check."),
    flag("experimental-warning-apply-duration", K::Duration, "100ms", G::Experimental, "Log a warning when applying one request takes longer than this."),
    flag("experimental-memory-mlock", K::Bool, "false", G::Experimental, "Lock the process memory so the backend stays in RAM."),
    flag("experimental-txn-mode-write-with-shared-buffer", K::Bool, "true", G::Experimental, "Let write transactions reuse the shared read buffer for their read-only checks."),
    flag("experimental-stop-grpc-service-on-defrag", K::Bool, "false", G::Experimental, "Report the gRPC health service as not serving while defragmenting."),
    flag("experimental-bootstrap-defrag-threshold-megabytes", K::Uint, "0", G::Experimental, "Defragment at boot when that frees at least this many megabytes (0 disables)."),
    flag("experimental-max-learners", K::Int, "1", G::Experimental, "Most learner members the cluster may hold."),
    flag("experimental-snapshot-catchup-entries", K::Uint64, "5000", G::Experimental, "Entries kept after a snapshot so slow followers can catch up (handle with care)."),
    flag("experimental-warning-unary-request-duration", K::Duration, "0s", G::Experimental, "Log a warning when a unary request takes longer than this (0 means 300ms)."),
    // etcd 3.6's names for the experimental flags above, and its feature gates
    flag("corrupt-check-time", K::Duration, "0s", G::Experimental, "etcd 3.6's name for --experimental-corrupt-check-time."),
    flag("compact-hash-check-time", K::Duration, "1m0s", G::Experimental, "etcd 3.6's name for --experimental-compact-hash-check-time."),
    flag("compaction-batch-limit", K::Int, "0", G::Experimental, "etcd 3.6's name for --experimental-compaction-batch-limit."),
    flag("compaction-sleep-interval", K::Duration, "0s", G::Experimental, "etcd 3.6's name for --experimental-compaction-sleep-interval."),
    flag("watch-progress-notify-interval", K::Duration, "0s", G::Experimental, "etcd 3.6's name for --experimental-watch-progress-notify-interval."),
    flag("downgrade-check-time", K::Duration, "5s", G::Experimental, "etcd 3.6's name for --experimental-downgrade-check-time."),
    flag("warning-apply-duration", K::Duration, "100ms", G::Experimental, "etcd 3.6's name for --experimental-warning-apply-duration."),
    flag("warning-unary-request-duration", K::Duration, "0s", G::Experimental, "etcd 3.6's name for --experimental-warning-unary-request-duration."),
    flag("memory-mlock", K::Bool, "false", G::Experimental, "etcd 3.6's name for --experimental-memory-mlock."),
    flag("bootstrap-defrag-threshold-megabytes", K::Uint, "0", G::Experimental, "etcd 3.6's name for --experimental-bootstrap-defrag-threshold-megabytes."),
    flag("max-learners", K::Int, "1", G::Experimental, "etcd 3.6's name for --experimental-max-learners."),
    flag("snapshot-catchup-entries", K::Uint64, "5000", G::Experimental, "etcd 3.6's name for --experimental-snapshot-catchup-entries."),
    flag("feature-gates", K::FeatureGates, "", G::Experimental, "etcd 3.6's feature gates, Name=true|false comma-separated: CompactHashCheck, InitialCorruptCheck, LeaseCheckpoint, LeaseCheckpointPersist, SetMemberLocalAddr, StopGRPCServiceOnDefrag, TxnModeWriteWithSharedBuffer (AllAlpha, AllBeta)."),
    // Unsafe
    flag("force-new-cluster", K::Bool, "false", G::Unsafe, "Restart as a one-member cluster from the existing data, dropping the other members."),
    flag("unsafe-no-fsync", K::Bool, "false", G::Unsafe, "Never fsync; a crash can lose or corrupt data."),
    // Not listed
    flag("config-file", K::Str, "", G::Hidden, ""),
    flag("version", K::Bool, "false", G::Hidden, ""),
    flag("cluster-active-size", K::Ignored, "", G::Hidden, ""),
    flag("cluster-remove-delay", K::Ignored, "", G::Hidden, ""),
    flag("cluster-sync-interval", K::Ignored, "", G::Hidden, ""),
    flag("config", K::Ignored, "", G::Hidden, ""),
    flag("force", K::Ignored, "", G::Hidden, ""),
    flag("max-result-buffer", K::Ignored, "", G::Hidden, ""),
    flag("max-retry-attempts", K::Ignored, "", G::Hidden, ""),
    flag("peer-heartbeat-interval", K::Ignored, "", G::Hidden, ""),
    flag("peer-election-timeout", K::Ignored, "", G::Hidden, ""),
    flag("retry-interval", K::Ignored, "", G::Hidden, ""),
    flag("snapshot", K::Ignored, "", G::Hidden, ""),
    flag("v", K::Ignored, "", G::Hidden, ""),
    flag("vv", K::Ignored, "", G::Hidden, ""),
    flag("test.coverprofile", K::Ignored, "", G::Hidden, ""),
    flag("test.outputdir", K::Ignored, "", G::Hidden, ""),
];

/// A parsed flag value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Value {
    Str(String),
    Bool(bool),
    U64(u64),
    I64(i64),
    /// Nanoseconds, as Go's `time.Duration`.
    Dur(i64),
    Urls {
        /// The set etcd keeps for `UniqueURLs` (URL strings, or the allowed exception).
        values: BTreeSet<String>,
        urls: Vec<GoUrl>,
    },
    StrSet(BTreeSet<String>),
    StrList(Vec<String>),
    Ignored,
}

/// Why setting a value failed: the text after `...: ` in etcd's message.
struct SetError(String);

impl FlagDef {
    fn is_bool(&self) -> bool {
        matches!(self.kind, Kind::Bool | Kind::Ignored)
    }

    /// The environment variable etcd reads for this flag (`flags.FlagToEnv("ETCD", name)`).
    pub(crate) fn env_key(&self) -> String {
        format!("ETCD_{}", self.name.replace('-', "_").to_uppercase())
    }

    pub(crate) fn default_value(&self) -> Value {
        let mut value = Value::initial(self.kind);
        if !self.default.is_empty() {
            // Defaults are static and covered by a test; a bad one would show up there.
            let _ = value.set(self.kind, self.default);
        }
        value
    }
}

impl Value {
    fn initial(kind: Kind) -> Value {
        match kind {
            Kind::Str | Kind::Select(_) | Kind::FeatureGates => Value::Str(String::new()),
            Kind::Bool => Value::Bool(false),
            Kind::Uint | Kind::Uint64 | Kind::Uint32 => Value::U64(0),
            Kind::Int | Kind::Int64 => Value::I64(0),
            Kind::Duration => Value::Dur(0),
            Kind::Urls { .. } => Value::Urls {
                values: BTreeSet::new(),
                urls: Vec::new(),
            },
            Kind::UniqueStrings => Value::StrSet(BTreeSet::new()),
            Kind::Strings | Kind::SelectMulti(_) => Value::StrList(Vec::new()),
            Kind::Ignored => Value::Ignored,
        }
    }

    /// Go's `flag.Value.Set` for each kind.
    fn set(&mut self, kind: Kind, text: &str) -> Result<(), SetError> {
        let parse_err = |e: goparse::NumError| SetError(e.flag_text().to_string());
        *self = match kind {
            Kind::Str => Value::Str(text.to_string()),
            Kind::Bool => Value::Bool(
                goparse::parse_bool(text).ok_or_else(|| SetError("parse error".to_string()))?,
            ),
            Kind::Uint | Kind::Uint64 => {
                Value::U64(goparse::parse_uint(text, 64).map_err(parse_err)?)
            }
            Kind::Int | Kind::Int64 => Value::I64(goparse::parse_int(text, 64).map_err(parse_err)?),
            Kind::Uint32 => Value::U64(
                goparse::parse_uint(text, 32)
                    .map_err(|e| SetError(e.strconv_text("ParseUint", text)))?,
            ),
            Kind::Duration => Value::Dur(
                goparse::parse_duration(text).map_err(|_| SetError("parse error".to_string()))?,
            ),
            Kind::Urls { exception } => {
                let Value::Urls { values, urls } = self else {
                    return Err(SetError("internal: not a URL flag".to_string()));
                };
                if values.contains(text) {
                    return Ok(());
                }
                if text == exception {
                    values.insert(text.to_string());
                    return Ok(());
                }
                let parsed = gourl::new_urls_from_list(text).map_err(SetError)?;
                *values = parsed.iter().map(GoUrl::to_go_string).collect();
                *urls = parsed;
                return Ok(());
            }
            Kind::UniqueStrings => Value::StrSet(text.split(',').map(str::to_string).collect()),
            Kind::Strings => Value::StrList(text.split(',').map(str::to_string).collect()),
            Kind::Select(valids) => {
                if !valids.contains(&text) {
                    return Err(SetError("invalid value".to_string()));
                }
                Value::Str(text.to_string())
            }
            Kind::SelectMulti(valids) => {
                let Value::StrList(current) = self else {
                    return Err(SetError("internal: not a list flag".to_string()));
                };
                for item in text.split(',') {
                    if !valids.contains(&item) {
                        return Err(SetError(format!("invalid value {}", quote(item))));
                    }
                    current.push(item.to_string());
                }
                current.sort();
                return Ok(());
            }
            Kind::Ignored => Value::Ignored,
            Kind::FeatureGates => {
                super::renamed::parse_gates(text).map_err(SetError)?;
                match self {
                    Value::Str(current) if !current.is_empty() && !text.is_empty() => {
                        Value::Str(format!("{current},{text}"))
                    }
                    Value::Str(current) if text.is_empty() => Value::Str(current.clone()),
                    _ => Value::Str(text.to_string()),
                }
            }
        };
        Ok(())
    }
}

/// One flag's current value and whether the command line or environment set it.
#[derive(Debug, Clone)]
pub(crate) struct Slot {
    pub(crate) def: &'static FlagDef,
    pub(crate) value: Value,
    pub(crate) set: bool,
}

/// The flag set: every flag at its default until parsed.
#[derive(Debug, Clone)]
pub(crate) struct FlagSet {
    pub(crate) slots: BTreeMap<&'static str, Slot>,
    /// Warnings produced while setting values (ignored legacy flags).
    pub(crate) warnings: Vec<String>,
}

/// How parsing the command line ended, short of success.
#[derive(Debug)]
pub(crate) enum ParseStop {
    /// `-h`, `--help` or `-help=<anything>`.
    Help,
    /// A Go `flag` error: the text etcd prints before its usage.
    Error(String),
}

impl FlagSet {
    pub(crate) fn new() -> FlagSet {
        let slots = FLAGS
            .iter()
            .map(|def| {
                (
                    def.name,
                    Slot {
                        def,
                        value: def.default_value(),
                        set: false,
                    },
                )
            })
            .collect();
        FlagSet {
            slots,
            warnings: Vec::new(),
        }
    }

    /// Go's `FlagSet.Set`: parse `text` into the flag and mark it set.
    fn set(&mut self, name: &str, text: &str) -> Result<(), SetError> {
        let Some(slot) = self.slots.get_mut(name) else {
            return Err(SetError(format!("no such flag -{name}")));
        };
        slot.value.set(slot.def.kind, text)?;
        slot.set = true;
        if matches!(slot.def.kind, Kind::Ignored) {
            self.warnings.push(format!(
                "flag \"-{name}\" is no longer supported - ignoring."
            ));
        }
        Ok(())
    }

    /// Go's `FlagSet.Parse`; returns the arguments left after the flags.
    pub(crate) fn parse_args(&mut self, args: &[String]) -> Result<Vec<String>, ParseStop> {
        let mut i = 0;
        while i < args.len() {
            let arg = &args[i];
            if arg.len() < 2 || !arg.starts_with('-') {
                break;
            }
            let mut minuses = 1;
            if arg.as_bytes()[1] == b'-' {
                minuses = 2;
                if arg.len() == 2 {
                    i += 1;
                    break;
                }
            }
            let body = &arg[minuses..];
            if body.is_empty() || body.starts_with('-') || body.starts_with('=') {
                return Err(ParseStop::Error(format!("bad flag syntax: {arg}")));
            }
            i += 1;
            let (name, inline_value) = match body[1..].find('=') {
                Some(eq) => (&body[..eq + 1], Some(&body[eq + 2..])),
                None => (body, None),
            };
            let Some(def) = self.slots.get(name).map(|slot| slot.def) else {
                if name == "help" || name == "h" {
                    return Err(ParseStop::Help);
                }
                return Err(ParseStop::Error(format!(
                    "flag provided but not defined: -{name}"
                )));
            };
            if def.is_bool() {
                let text = inline_value.unwrap_or("true");
                if let Err(SetError(why)) = self.set(name, text) {
                    return Err(ParseStop::Error(match inline_value {
                        Some(value) => {
                            format!("invalid boolean value {} for -{name}: {why}", quote(value))
                        }
                        None => format!("invalid boolean flag {name}: {why}"),
                    }));
                }
                continue;
            }
            let value = match inline_value {
                Some(value) => value.to_string(),
                None => {
                    let Some(next) = args.get(i) else {
                        return Err(ParseStop::Error(format!("flag needs an argument: -{name}")));
                    };
                    i += 1;
                    next.clone()
                }
            };
            if let Err(SetError(why)) = self.set(name, &value) {
                return Err(ParseStop::Error(format!(
                    "invalid value {} for flag -{name}: {why}",
                    quote(&value)
                )));
            }
        }
        Ok(args[i..].to_vec())
    }

    /// etcd's `flags.SetFlagsFromEnv("ETCD", fs)`: every flag not set on the command line
    /// takes a non-empty `ETCD_<FLAG>` value. Returns the last bad value's error (etcd keeps
    /// the last one, flags visited in name order), the variables used, and the conflicts
    /// and unknown variables found while checking the environment.
    pub(crate) fn apply_env(&mut self, env: &[(String, String)]) -> EnvOutcome {
        let already_set: BTreeMap<String, &'static str> = self
            .slots
            .values()
            .filter(|slot| slot.set)
            .map(|slot| (slot.def.env_key(), slot.def.name))
            .collect();
        let mut outcome = EnvOutcome::default();
        let mut used: BTreeSet<String> = BTreeSet::new();
        let names: Vec<&'static str> = self.slots.keys().copied().collect();
        for name in names {
            let key = self.slots[name].def.env_key();
            if already_set.contains_key(&key) {
                continue;
            }
            // os.Getenv returns the first occurrence.
            let Some((_, value)) = env.iter().find(|(k, _)| *k == key) else {
                continue;
            };
            if value.is_empty() {
                continue;
            }
            used.insert(key.clone());
            match self.set(name, value) {
                Ok(()) => outcome.used.push(format!(
                    "recognized and used environment variable {key}={value}"
                )),
                Err(SetError(why)) => {
                    outcome.error =
                        Some(format!("invalid value {} for {key}: {why}", quote(value)));
                }
            }
        }
        for (key, value) in env {
            if used.contains(key) {
                continue;
            }
            if already_set.contains_key(key) {
                outcome.conflict = Some(key.clone());
                break;
            }
            if key.starts_with("ETCD_") {
                outcome
                    .unrecognized
                    .push(format!("unrecognized environment variable {key}={value}"));
            }
        }
        outcome
    }

    pub(crate) fn slot(&self, name: &str) -> &Slot {
        match self.slots.get(name) {
            Some(slot) => slot,
            None => panic!("flag table has no {name:?}"),
        }
    }

    pub(crate) fn is_set(&self, name: &str) -> bool {
        self.slot(name).set
    }

    pub(crate) fn value_mut(&mut self, name: &str) -> &mut Value {
        match self.slots.get_mut(name) {
            Some(slot) => &mut slot.value,
            None => panic!("flag table has no {name:?}"),
        }
    }

    pub(crate) fn string(&self, name: &str) -> String {
        match &self.slot(name).value {
            Value::Str(s) => s.clone(),
            other => panic!("flag {name:?} is not a string: {other:?}"),
        }
    }

    pub(crate) fn boolean(&self, name: &str) -> bool {
        match &self.slot(name).value {
            Value::Bool(b) => *b,
            other => panic!("flag {name:?} is not a bool: {other:?}"),
        }
    }

    pub(crate) fn unsigned(&self, name: &str) -> u64 {
        match &self.slot(name).value {
            Value::U64(n) => *n,
            other => panic!("flag {name:?} is not unsigned: {other:?}"),
        }
    }

    pub(crate) fn signed(&self, name: &str) -> i64 {
        match &self.slot(name).value {
            Value::I64(n) => *n,
            other => panic!("flag {name:?} is not signed: {other:?}"),
        }
    }

    pub(crate) fn duration(&self, name: &str) -> i64 {
        match &self.slot(name).value {
            Value::Dur(d) => *d,
            other => panic!("flag {name:?} is not a duration: {other:?}"),
        }
    }

    pub(crate) fn urls(&self, name: &str) -> Vec<GoUrl> {
        match &self.slot(name).value {
            Value::Urls { urls, .. } => urls.clone(),
            other => panic!("flag {name:?} is not a URL list: {other:?}"),
        }
    }

    pub(crate) fn url_values(&self, name: &str) -> Vec<String> {
        match &self.slot(name).value {
            Value::Urls { values, .. } => values.iter().cloned().collect(),
            other => panic!("flag {name:?} is not a URL list: {other:?}"),
        }
    }

    pub(crate) fn strings(&self, name: &str) -> Vec<String> {
        match &self.slot(name).value {
            Value::StrSet(set) => set.iter().cloned().collect(),
            Value::StrList(list) => list.clone(),
            other => panic!("flag {name:?} is not a string list: {other:?}"),
        }
    }
}

/// What applying the environment produced.
#[derive(Debug, Default)]
pub(crate) struct EnvOutcome {
    /// `invalid value "<v>" for ETCD_<FLAG>: <why>` for the last bad value.
    pub(crate) error: Option<String>,
    /// An `ETCD_<FLAG>` present while `--<flag>` was given: etcd exits on it.
    pub(crate) conflict: Option<String>,
    /// Info lines for the variables used.
    pub(crate) used: Vec<String>,
    /// Warnings for `ETCD_*` variables that match no flag.
    pub(crate) unrecognized: Vec<String>,
}

/// Renders a value the way etcd's `Value.String()` would, for keeping unmodelled flags.
pub(crate) fn value_text(value: &Value) -> String {
    match value {
        Value::Str(s) => s.clone(),
        Value::Bool(b) => b.to_string(),
        Value::U64(n) => n.to_string(),
        Value::I64(n) => n.to_string(),
        Value::Dur(d) => goparse::duration_string(*d),
        Value::Urls { values, .. } => values.iter().cloned().collect::<Vec<_>>().join(","),
        Value::StrSet(set) => set.iter().cloned().collect::<Vec<_>>().join(","),
        Value::StrList(list) => list.join(","),
        Value::Ignored => String::new(),
    }
}
