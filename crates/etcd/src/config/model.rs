//! The typed result of parsing: [`EtcdConfig`] with etcd 3.5's defaults, the enums derived
//! from flags ([`ClusterState`], [`AutoCompaction`]), the list of flags that have a typed
//! field ([`MODELED`]; the others land in [`EtcdConfig::extra`]) and the helpers the
//! server start-up reads the configuration through. It parses no flags itself.

use std::collections::BTreeMap;
use std::time::Duration;

use url::Url;

use super::goparse::{self, quote, to_std_duration};
use super::gourl;

/// etcd's default backend quota (used when `--quota-backend-bytes` is 0).
pub const DEFAULT_QUOTA_BACKEND_BYTES: u64 = 2 * 1024 * 1024 * 1024;

/// `--initial-cluster-state`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ClusterState {
    New,
    Existing,
}

/// Auto compaction as etcd derives it from `--auto-compaction-mode` and
/// `--auto-compaction-retention`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AutoCompaction {
    Off,
    /// Keep this much history; compaction runs periodically.
    Periodic(Duration),
    /// Keep this many revisions.
    Revision(u64),
}

impl AutoCompaction {
    /// etcd's `parseCompactionRetention` plus the compactor's mode check: a bare integer
    /// means hours in periodic mode and revisions in revision mode; anything else must be a
    /// Go duration (which, in revision mode, etcd then uses as a count of nanoseconds).
    /// `0` (or a negative duration) turns compaction off.
    pub fn parse(mode: &str, retention: &str) -> Result<AutoCompaction, String> {
        let retention = if retention.is_empty() { "0" } else { retention };
        let amount: i64 = match go_atoi(retention) {
            Some(n) if n >= 0 => match mode {
                "revision" => n,
                "periodic" => n.saturating_mul(3_600_000_000_000),
                _ => 0,
            },
            _ => goparse::parse_duration(retention)
                .map_err(|err| format!("error parsing CompactionRetention: {err}"))?,
        };
        if amount <= 0 {
            return Ok(AutoCompaction::Off);
        }
        match mode {
            "periodic" => Ok(AutoCompaction::Periodic(to_std_duration(amount))),
            "revision" => Ok(AutoCompaction::Revision(amount.unsigned_abs())),
            other => Err(format!("unsupported compaction mode {other}")),
        }
    }
}

/// Go's `strconv.Atoi`: optional sign, decimal digits.
fn go_atoi(s: &str) -> Option<i64> {
    let digits = s.strip_prefix(['+', '-']).unwrap_or(s);
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    s.parse::<i64>().ok()
}

/// The member's configuration, with etcd 3.5's defaults. Field names follow the flags;
/// URLs are validated with etcd's rules (render them with [`url_string`], not
/// `Url::to_string`, to print them as etcd does). Flags without a field here are kept,
/// as given, in [`EtcdConfig::extra`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EtcdConfig {
    // Member
    /// `--name` (default "default").
    pub name: String,
    /// `--data-dir`; "${name}.etcd" when empty.
    pub data_dir: String,
    /// `--wal-dir` ("" = inside the data dir).
    pub wal_dir: String,
    pub snapshot_count: u64,
    /// `--heartbeat-interval`, milliseconds.
    pub heartbeat_interval: u64,
    /// `--election-timeout`, milliseconds.
    pub election_timeout: u64,
    pub initial_election_tick_advance: bool,
    pub listen_peer_urls: Vec<Url>,
    pub listen_client_urls: Vec<Url>,
    pub listen_client_http_urls: Vec<Url>,
    pub max_snapshots: u64,
    pub max_wals: u64,
    /// Raw value: 0 means the 2 GiB default, negative disables the quota
    /// (see [`EtcdConfig::backend_quota`]).
    pub quota_backend_bytes: i64,
    pub backend_batch_interval: Duration,
    pub backend_batch_limit: i64,
    pub max_txn_ops: u64,
    pub max_request_bytes: u64,
    pub max_concurrent_streams: u32,
    pub grpc_keepalive_min_time: Duration,
    pub grpc_keepalive_interval: Duration,
    pub grpc_keepalive_timeout: Duration,
    pub socket_reuse_port: bool,
    pub socket_reuse_address: bool,
    /// At least 5s, as etcd enforces.
    pub raft_read_timeout: Duration,
    pub raft_write_timeout: Duration,

    // Clustering
    pub initial_advertise_peer_urls: Vec<Url>,
    /// Empty only when etcd would accept that (v2 proxy setups).
    pub advertise_client_urls: Vec<Url>,
    /// `--initial-cluster` as text ("" when a discovery method replaces it); see
    /// [`EtcdConfig::initial_cluster_members`].
    pub initial_cluster: String,
    pub initial_cluster_state: ClusterState,
    pub initial_cluster_token: String,
    /// v2 discovery URL.
    pub discovery: String,
    /// "proxy" or "exit".
    pub discovery_fallback: String,
    pub discovery_proxy: String,
    pub discovery_srv: String,
    pub discovery_srv_name: String,
    /// Set by DNS SRV bootstrap when the peers are https and no `--peer-trusted-ca-file` is
    /// given: peer certificates are then verified against this name, the SRV domain (etcd
    /// PR #6084); empty otherwise.
    pub peer_tls_server_name: String,
    /// v3 discovery (etcd 3.6 flags).
    pub discovery_token: String,
    pub discovery_endpoints: Vec<String>,
    pub strict_reconfig_check: bool,
    pub pre_vote: bool,
    pub enable_v2: bool,
    /// "periodic", "revision", or "" (config file without the key).
    pub auto_compaction_mode: String,
    /// As given.
    pub auto_compaction_retention: String,
    /// What the two fields above mean.
    pub auto_compaction: AutoCompaction,

    // Client TLS
    pub cert_file: String,
    pub key_file: String,
    pub client_cert_file: String,
    pub client_key_file: String,
    pub client_cert_auth: bool,
    pub client_crl_file: String,
    pub client_cert_allowed_hostname: Vec<String>,
    pub trusted_ca_file: String,
    pub auto_tls: bool,
    // Peer TLS
    pub peer_cert_file: String,
    pub peer_key_file: String,
    pub peer_client_cert_file: String,
    pub peer_client_key_file: String,
    pub peer_client_cert_auth: bool,
    pub peer_trusted_ca_file: String,
    pub peer_crl_file: String,
    pub peer_cert_allowed_cn: Vec<String>,
    pub peer_cert_allowed_hostname: Vec<String>,
    pub peer_auto_tls: bool,
    pub experimental_peer_skip_client_san_verification: bool,
    /// Years.
    pub self_signed_cert_validity: u64,
    pub cipher_suites: Vec<String>,
    /// "TLS1.2", "TLS1.3" or "" (no limit).
    pub tls_min_version: String,
    pub tls_max_version: String,
    /// CORS origins ("*" allows all), sorted.
    pub cors: Vec<String>,
    /// Accepted Host headers ("*" allows all), sorted.
    pub host_whitelist: Vec<String>,

    // Auth
    pub auth_token: String,
    pub bcrypt_cost: u64,
    /// Seconds.
    pub auth_token_ttl: u64,

    // Monitoring
    pub enable_pprof: bool,
    /// "basic" or "extensive" (etcd does not check).
    pub metrics: String,
    pub listen_metrics_urls: Vec<Url>,
    pub enable_grpc_gateway: bool,

    // Logging
    /// "zap".
    pub logger: String,
    /// "default" (= stderr), "stderr", "stdout", "systemd/journal" or file paths.
    pub log_outputs: Vec<String>,
    /// Lower-cased: debug, info, warn, error, dpanic, panic or fatal.
    pub log_level: String,

    // Experimental
    pub experimental_initial_corrupt_check: bool,
    /// Zero disables the periodic check.
    pub experimental_corrupt_check_time: Duration,
    pub experimental_compact_hash_check_enabled: bool,
    pub experimental_compact_hash_check_time: Duration,
    pub experimental_enable_lease_checkpoint: bool,
    pub experimental_enable_lease_checkpoint_persist: bool,
    /// Zero means etcd's built-in 1000.
    pub experimental_compaction_batch_limit: i64,
    /// Zero means etcd's built-in 10 ms.
    pub experimental_compaction_sleep_interval: Duration,
    /// Zero means etcd's built-in 10 minutes.
    pub experimental_watch_progress_notify_interval: Duration,
    pub experimental_warning_apply_duration: Duration,
    pub experimental_snapshot_catchup_entries: u64,
    pub experimental_max_learners: i64,

    // Unsafe
    pub force_new_cluster: bool,
    pub unsafe_no_fsync: bool,

    /// v2 proxy mode ("off", "readonly", "on"); etcd-rs runs only "off".
    pub proxy: String,
    /// The `--config-file` this came from, if any.
    pub config_file: Option<String>,
    /// Every other accepted flag, by flag name, in etcd's `Value.String()` form.
    pub extra: BTreeMap<String, String>,
}

/// Flags with a typed field in [`EtcdConfig`]; the rest go to [`EtcdConfig::extra`].
pub(super) const MODELED: &[&str] = &[
    "name",
    "data-dir",
    "wal-dir",
    "snapshot-count",
    "heartbeat-interval",
    "election-timeout",
    "initial-election-tick-advance",
    "listen-peer-urls",
    "listen-client-urls",
    "listen-client-http-urls",
    "max-snapshots",
    "max-wals",
    "quota-backend-bytes",
    "backend-batch-interval",
    "backend-batch-limit",
    "max-txn-ops",
    "max-request-bytes",
    "max-concurrent-streams",
    "grpc-keepalive-min-time",
    "grpc-keepalive-interval",
    "grpc-keepalive-timeout",
    "socket-reuse-port",
    "socket-reuse-address",
    "raft-read-timeout",
    "raft-write-timeout",
    "initial-advertise-peer-urls",
    "advertise-client-urls",
    "initial-cluster",
    "initial-cluster-state",
    "initial-cluster-token",
    "discovery",
    "discovery-fallback",
    "discovery-proxy",
    "discovery-srv",
    "discovery-srv-name",
    "discovery-token",
    "discovery-endpoints",
    "strict-reconfig-check",
    "pre-vote",
    "enable-v2",
    "auto-compaction-mode",
    "auto-compaction-retention",
    "cert-file",
    "key-file",
    "client-cert-file",
    "client-key-file",
    "client-cert-auth",
    "client-crl-file",
    "client-cert-allowed-hostname",
    "trusted-ca-file",
    "auto-tls",
    "peer-cert-file",
    "peer-key-file",
    "peer-client-cert-file",
    "peer-client-key-file",
    "peer-client-cert-auth",
    "peer-trusted-ca-file",
    "peer-crl-file",
    "peer-cert-allowed-cn",
    "peer-cert-allowed-hostname",
    "peer-auto-tls",
    "experimental-peer-skip-client-san-verification",
    "self-signed-cert-validity",
    "cipher-suites",
    "tls-min-version",
    "tls-max-version",
    "cors",
    "host-whitelist",
    "auth-token",
    "bcrypt-cost",
    "auth-token-ttl",
    "enable-pprof",
    "metrics",
    "listen-metrics-urls",
    "enable-grpc-gateway",
    "logger",
    "log-outputs",
    "log-level",
    "experimental-initial-corrupt-check",
    "experimental-corrupt-check-time",
    "experimental-compact-hash-check-enabled",
    "experimental-compact-hash-check-time",
    "experimental-enable-lease-checkpoint",
    "experimental-enable-lease-checkpoint-persist",
    "experimental-compaction-batch-limit",
    "experimental-watch-progress-notify-interval",
    "experimental-warning-apply-duration",
    "experimental-snapshot-catchup-entries",
    "experimental-max-learners",
    "force-new-cluster",
    "unsafe-no-fsync",
    "proxy",
];

impl EtcdConfig {
    /// `--initial-cluster` as name/URL pairs, sorted by name then URL, as etcd's
    /// `types.NewURLsMap` reads it. etcd only parses it when bootstrapping a new member, so
    /// it is not checked at parse time; the error is etcd's startup message.
    pub fn initial_cluster_members(&self) -> Result<Vec<(String, Url)>, String> {
        let mut by_name: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
        for entry in self.initial_cluster.split(',') {
            if entry.is_empty() {
                continue;
            }
            let (name, url) = entry.split_once('=').unwrap_or((entry, ""));
            by_name.entry(name).or_default().push(url);
        }
        let mut members = Vec::new();
        for (name, raw_urls) in by_name {
            let urls = gourl::new_urls(&raw_urls)
                .map_err(|err| format!("error setting up initial cluster: {err}"))?;
            for url in &urls {
                let url = gourl::to_url(url)
                    .map_err(|err| format!("error setting up initial cluster: {err}"))?;
                members.push((name.to_string(), url));
            }
        }
        Ok(members)
    }

    /// etcd's check that this member is part of the bootstrap cluster.
    pub fn check_local_member(&self, members: &[(String, Url)]) -> Result<(), String> {
        if members.iter().any(|(name, _)| *name == self.name) {
            Ok(())
        } else {
            Err(format!(
                "couldn't find local name {} in the initial cluster configuration",
                quote(&self.name)
            ))
        }
    }

    /// The backend quota in bytes: `None` when disabled (negative), the 2 GiB default for 0.
    pub fn backend_quota(&self) -> Option<u64> {
        match self.quota_backend_bytes {
            n if n < 0 => None,
            0 => Some(DEFAULT_QUOTA_BACKEND_BYTES),
            n => Some(n.unsigned_abs()),
        }
    }

    /// A flag kept in [`EtcdConfig::extra`], read as a Go duration (the v3 discovery
    /// timeouts); `None` when absent or not a duration.
    pub fn extra_duration(&self, flag: &str) -> Option<Duration> {
        let text = self.extra.get(flag)?;
        goparse::parse_duration(text).ok().map(to_std_duration)
    }

    /// A flag kept in [`EtcdConfig::extra`], read as a Go bool.
    pub fn extra_bool(&self, flag: &str) -> Option<bool> {
        goparse::parse_bool(self.extra.get(flag)?)
    }
}
