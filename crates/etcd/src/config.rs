//! The `etcd` binary's configuration: command-line flags, `ETCD_*` environment variables
//! and `--config-file` YAML, parsed the way etcd 3.5 parses them (Go `flag` semantics, the
//! same defaults, the same validation order and the same error text and exit codes), into
//! a typed [`EtcdConfig`]. Also the `--version` and `--help` texts.
//!
//! Owns: flag table and parser (`config/flags.rs`), Go-compatible number/duration/URL
//! parsing (`config/goparse.rs`, `config/gourl.rs`), the YAML decoder (`config/file.rs`)
//! and the help text (`config/help.rs`). It reads nothing from the process itself:
//! arguments and environment come in as parameters, and only [`from_config_file`] touches
//! the file system.
//!
//! Error output: [`ConfigError::message`] is what etcd writes to stderr, and
//! [`ConfigError::exit_code`] its exit status: 2 for flag syntax errors (message, then the
//! usage text), 1 for validation errors (etcd logs those as a zap JSON line; the message
//! is that line without `ts`/`caller`), 2 for the few cases where etcd panics.

pub(crate) mod effect;
mod file;
mod flags;
pub(crate) mod goparse;
pub(crate) mod gourl;
mod help;
pub(crate) mod pflag;

use std::collections::BTreeMap;
use std::fmt;
use std::time::Duration;

use url::Url;

use self::flags::{FlagSet, Group, ParseStop, Value};
use self::goparse::{duration_string, json_escape, quote, quote_list, to_std_duration};
use self::gourl::GoUrl;

/// What the command line asks for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Command {
    /// Start a member with this configuration.
    Run(Box<EtcdConfig>),
    /// `--version`: print [`version_text`] on stdout, exit 0.
    Version,
    /// `-h` / `--help`: print [`usage_text`] on stderr and [`help_text`] plus a newline on
    /// stdout (etcd's `fmt.Println`), exit 0.
    Help,
    /// `etcd gateway ...`: the arguments after `gateway`.
    Gateway(Vec<String>),
    /// `etcd grpc-proxy ...`: the arguments after `grpc-proxy`.
    GrpcProxy(Vec<String>),
    /// `etcd snapshot ...` (etcd-rs's `etcdutl snapshot`): the arguments after `snapshot`.
    Snapshot(Vec<String>),
}

/// A successful parse and what etcd would have logged on the way.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Parsed {
    pub command: Command,
    /// Warn-level lines etcd logs: unrecognized `ETCD_*` variables, ignored legacy flags,
    /// `'data-dir' was empty; using default`, ...
    pub warnings: Vec<String>,
    /// Info-level lines: environment variables used, "loaded server configuration ...".
    pub infos: Vec<String>,
}

/// A configuration error, carrying etcd's output and exit code.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigError {
    /// Write this to stderr verbatim (it ends with a newline).
    pub message: String,
    /// Exit with this status.
    pub exit_code: i32,
    /// The bare error text (what etcd puts in the `"error"` field), for logging it yourself.
    pub error: String,
}

impl ConfigError {
    /// A Go `flag` parse error: the error line, then the usage text. Exit 2.
    fn usage(error: String) -> ConfigError {
        ConfigError {
            message: format!("{error}\n{}\n", usage_text()),
            exit_code: 2,
            error,
        }
    }

    /// etcd's `failed to verify flags` path. Exit 1.
    fn verify(error: String) -> ConfigError {
        let mut message = zap_line("warn", "failed to verify flags", &[("error", &error)]);
        if error == ERR_UNSET_ADVERTISE_CLIENT_URLS {
            message.push_str(&zap_line(
                "warn",
                "advertise client URLs are not set",
                &[("error", &error)],
            ));
        }
        ConfigError {
            message,
            exit_code: 1,
            error,
        }
    }

    /// An error etcd prints with `fmt.Fprintf(os.Stderr, ...)` or `log.Fatalf`. Exit 1.
    fn plain(error: String) -> ConfigError {
        ConfigError {
            message: format!("{error}\n"),
            exit_code: 1,
            error,
        }
    }

    /// A Go panic (etcd panics on a bad `--log-level`). Exit 2.
    fn panic(error: String) -> ConfigError {
        ConfigError {
            message: format!("panic: {error}\n"),
            exit_code: 2,
            error,
        }
    }

    /// A failure etcd hits while starting the server (after flag verification). Exit 1.
    fn start(error: String) -> ConfigError {
        let mut message = zap_line("warn", "failed to start etcd", &[("error", &error)]);
        message.push_str(&zap_line("fatal", "discovery failed", &[("error", &error)]));
        ConfigError {
            message,
            exit_code: 1,
            error,
        }
    }
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.error)
    }
}

impl std::error::Error for ConfigError {}

/// One zap JSON log line as etcd prints it, minus `ts` and `caller`.
fn zap_line(level: &str, msg: &str, fields: &[(&str, &str)]) -> String {
    let mut line = format!(
        "{{\"level\":\"{}\",\"msg\":\"{}\"",
        json_escape(level),
        json_escape(msg)
    );
    for (key, value) in fields {
        line.push_str(&format!(
            ",\"{}\":\"{}\"",
            json_escape(key),
            json_escape(value)
        ));
    }
    line.push_str("}\n");
    line
}

const ERR_UNSET_ADVERTISE_CLIENT_URLS: &str =
    "--advertise-client-urls is required when --listen-client-urls is set explicitly";
const ERR_CONFLICT_BOOTSTRAP_FLAGS: &str = "multiple discovery or bootstrap flags are set. Choose one of \"initial-cluster\", \"discovery\" or \"discovery-srv\"";
const DEFAULT_NAME: &str = "default";
const DEFAULT_INITIAL_CLUSTER: &str = "default=http://localhost:2380";
const MAX_ELECTION_MS: u64 = 50_000;
const RAFT_MIN_TIMEOUT_NS: i64 = 5_000_000_000;
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
const MODELED: &[&str] = &[
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

/// `etcd --version`.
pub fn version_text() -> String {
    use etcdrs_server::version::{ETCDRS_VERSION, SERVER_VERSION};
    let git_sha = option_env!("ETCDRS_GIT_SHA").unwrap_or("Not provided");
    format!(
        "etcd Version: {SERVER_VERSION}\nGit SHA: {git_sha}\nGo Version: (none: etcd-rs {ETCDRS_VERSION}, Rust)\nGo OS/Arch: {}/{}\n",
        go_os(),
        go_arch()
    )
}

fn go_os() -> &'static str {
    match std::env::consts::OS {
        "macos" => "darwin",
        other => other,
    }
}

fn go_arch() -> &'static str {
    match std::env::consts::ARCH {
        "x86_64" => "amd64",
        "x86" => "386",
        "aarch64" => "arm64",
        "loongarch64" => "loong64",
        "powerpc64" if cfg!(target_endian = "little") => "ppc64le",
        "powerpc64" => "ppc64",
        other => other,
    }
}

/// The flag listing for `--help` (etcd prints it on stdout).
pub fn help_text() -> String {
    help::flags_text()
}

/// The usage block (etcd prints it on stderr for `--help` and after flag errors).
pub fn usage_text() -> String {
    help::usage_text()
}

/// Parses `etcd`'s arguments (without argv\[0\]) and environment, as etcd 3.5 does.
pub fn parse(args: &[String], env: &[(String, String)]) -> Result<Parsed, ConfigError> {
    let mut report = Report::default();
    match args.first().map(String::as_str) {
        Some("gateway") => return Ok(report.finish(Command::Gateway(args[1..].to_vec()))),
        Some("grpc-proxy") => return Ok(report.finish(Command::GrpcProxy(args[1..].to_vec()))),
        Some("snapshot") => return Ok(report.finish(Command::Snapshot(args[1..].to_vec()))),
        _ => {}
    }
    let mut flags = FlagSet::new();
    let rest = match flags.parse_args(args) {
        Ok(rest) => rest,
        Err(ParseStop::Help) => return Ok(report.finish(Command::Help)),
        Err(ParseStop::Error(error)) => return Err(ConfigError::usage(error)),
    };
    report.warnings.append(&mut flags.warnings);
    if let Some(first) = rest.first() {
        return Err(ConfigError::verify(format!(
            "'{first}' is not a valid flag"
        )));
    }
    if flags.boolean("version") {
        return Ok(report.finish(Command::Version));
    }
    let mut path = flags.string("config-file");
    if path.is_empty() {
        path = getenv(env, "ETCD_CONFIG_FILE").unwrap_or_default();
    }
    let config = if path.is_empty() {
        from_command_line(flags, env, &mut report)?
    } else {
        load_config_file(&path, &mut report)?
    };
    Ok(report.finish(Command::Run(Box::new(config))))
}

/// Loads a `--config-file` as etcd does (flags and environment play no part).
#[cfg(test)]
pub fn from_config_file(path: &str) -> Result<EtcdConfig, ConfigError> {
    load_config_file(path, &mut Report::default())
}

#[derive(Debug, Default)]
struct Report {
    warnings: Vec<String>,
    infos: Vec<String>,
}

impl Report {
    fn finish(self, command: Command) -> Parsed {
        Parsed {
            command,
            warnings: self.warnings,
            infos: self.infos,
        }
    }
}

/// `os.Getenv`: the first entry with that key.
fn getenv(env: &[(String, String)], key: &str) -> Option<String> {
    env.iter().find(|(k, _)| k == key).map(|(_, v)| v.clone())
}

/// URL lists as validation sees them (Go spelling kept for the messages).
struct UrlLists {
    listen_peer: Vec<GoUrl>,
    listen_client: Vec<GoUrl>,
    listen_client_http: Vec<GoUrl>,
    advertise_peer: Vec<GoUrl>,
    /// `None` is Go's nil: `--listen-client-urls` given without `--advertise-client-urls`.
    advertise_client: Option<Vec<GoUrl>>,
    listen_metrics: Vec<GoUrl>,
}

impl UrlLists {
    fn from_flags(flags: &FlagSet) -> UrlLists {
        UrlLists {
            listen_peer: flags.urls("listen-peer-urls"),
            listen_client: flags.urls("listen-client-urls"),
            listen_client_http: flags.urls("listen-client-http-urls"),
            advertise_peer: flags.urls("initial-advertise-peer-urls"),
            advertise_client: Some(flags.urls("advertise-client-urls")),
            listen_metrics: flags.urls("listen-metrics-urls"),
        }
    }
}

/// etcd's `configFromCmdLine`.
fn from_command_line(
    mut flags: FlagSet,
    env: &[(String, String)],
    report: &mut Report,
) -> Result<EtcdConfig, ConfigError> {
    let mut env: Vec<(String, String)> = env.to_vec();
    if let Some(value) = getenv(&env, "ETCD_VERSION").filter(|v| !v.is_empty()) {
        report.warnings.push(format!(
            "cannot set special environment variable key=ETCD_VERSION value={value}"
        ));
        env.retain(|(key, _)| key != "ETCD_VERSION");
    }
    let outcome = flags.apply_env(&env);
    report.warnings.append(&mut flags.warnings);
    report.infos.extend(outcome.used);
    if let Some(key) = outcome.conflict {
        let mut message = String::new();
        for line in &outcome.unrecognized {
            message.push_str(&zap_line("warn", line, &[]));
        }
        let msg = "conflicting environment variable is shadowed by corresponding command-line flag (either unset environment variable or disable flag))";
        message.push_str(&zap_line("fatal", msg, &[("environment-variable", &key)]));
        return Err(ConfigError {
            message,
            exit_code: 1,
            error: format!(
                "conflicting environment variable {} is shadowed by corresponding command-line flag (either unset environment variable or disable flag)",
                quote(&key)
            ),
        });
    }
    report.warnings.extend(outcome.unrecognized);
    if let Some(error) = outcome.error {
        return Err(ConfigError::verify(error));
    }

    for name in ["raft-read-timeout", "raft-write-timeout"] {
        if flags.duration(name) < RAFT_MIN_TIMEOUT_NS {
            *flags.value_mut(name) = Value::Dur(RAFT_MIN_TIMEOUT_NS);
            report.infos.push(format!(
                "{name} increased to minimum value: {}",
                duration_string(RAFT_MIN_TIMEOUT_NS)
            ));
        }
    }

    let mut urls = UrlLists::from_flags(&flags);
    let may_be_proxy = flags.string("proxy") != "off"
        || (!flags.string("discovery").is_empty() && flags.string("discovery-fallback") == "proxy");
    let missing_advertise_client =
        flags.is_set("listen-client-urls") && !flags.is_set("advertise-client-urls");
    if !may_be_proxy && missing_advertise_client {
        urls.advertise_client = None;
    }
    let discovery_set = !flags.string("discovery").is_empty()
        || !flags.string("discovery-srv").is_empty()
        || !flags.string("discovery-srv-name").is_empty()
        || !flags.strings("discovery-endpoints").is_empty();
    if discovery_set && !flags.is_set("initial-cluster") {
        *flags.value_mut("initial-cluster") = Value::Str(String::new());
    }
    let cluster_state = flags.string("initial-cluster-state");
    validate(&flags, &urls, &cluster_state, may_be_proxy, report)?;
    finish(flags, urls, &cluster_state, None, report)
}

/// etcd's `configFromFile` (embed's `ConfigFromFile`, then the proxy settings).
fn load_config_file(path: &str, report: &mut Report) -> Result<EtcdConfig, ConfigError> {
    let text = read_file(path).map_err(ConfigError::verify)?;
    let doc = file::parse_yaml(&text).map_err(ConfigError::verify)?;
    let mut values = file::decode_config(&doc).map_err(ConfigError::verify)?;

    // URL keys, in etcd's order; a bad one is printed and exits 1 outside the logger.
    const URL_KEYS: &[(&str, &str)] = &[
        ("listen-peer-urls", "listen-peer-urls"),
        ("listen-client-urls", "listen-client-urls"),
        ("listen-client-http-urls", "listen-client-http-urls"),
        ("initial-advertise-peer-urls", "initial-advertise-peer-urls"),
        // etcd's message names the wrong key here; kept as is.
        ("advertise-client-urls", "advertise-peer-urls"),
        ("listen-metrics-urls", "listen-metrics-urls"),
    ];
    for (flag, label) in URL_KEYS {
        let Some(raw) = values.url_lists.get(flag).filter(|raw| !raw.is_empty()) else {
            continue;
        };
        let parsed = gourl::new_urls_from_list(raw).map_err(|err| {
            ConfigError::plain(format!("unexpected error setting up {label}: {err}"))
        })?;
        *values.flags.value_mut(flag) = Value::Urls {
            values: parsed.iter().map(GoUrl::to_go_string).collect(),
            urls: parsed,
        };
    }
    if !values.cors.is_empty() {
        let cors = if values.cors == "*" {
            Value::Urls {
                values: ["*".to_string()].into_iter().collect(),
                urls: Vec::new(),
            }
        } else {
            let parsed = gourl::new_urls_from_list(&values.cors).map_err(|err| {
                ConfigError::panic(format!("new UniqueURLs should never fail: {err}"))
            })?;
            Value::Urls {
                values: parsed.iter().map(GoUrl::to_go_string).collect(),
                urls: parsed,
            }
        };
        *values.flags.value_mut("cors") = cors;
    }
    if !values.host_whitelist.is_empty() {
        *values.flags.value_mut("host-whitelist") = Value::StrSet(
            values
                .host_whitelist
                .split(',')
                .map(str::to_string)
                .collect(),
        );
    }
    let flags = &mut values.flags;
    if (!flags.string("discovery").is_empty() || !flags.string("discovery-srv").is_empty())
        && flags.string("initial-cluster") == DEFAULT_INITIAL_CLUSTER
    {
        *flags.value_mut("initial-cluster") = Value::Str(String::new());
    }
    if values.cluster_state.is_empty() {
        values.cluster_state = "new".to_string();
    }
    let client = &values.client_security;
    let peer = &values.peer_security;
    let tls: [(&str, Value); 16] = [
        ("cert-file", Value::Str(client.cert_file.clone())),
        ("key-file", Value::Str(client.key_file.clone())),
        (
            "client-cert-file",
            Value::Str(client.client_cert_file.clone()),
        ),
        (
            "client-key-file",
            Value::Str(client.client_key_file.clone()),
        ),
        ("client-cert-auth", Value::Bool(client.client_cert_auth)),
        (
            "trusted-ca-file",
            Value::Str(client.trusted_ca_file.clone()),
        ),
        ("auto-tls", Value::Bool(client.auto_tls)),
        (
            "client-cert-allowed-hostname",
            Value::StrList(client.allowed_hostname.clone()),
        ),
        ("peer-cert-file", Value::Str(peer.cert_file.clone())),
        ("peer-key-file", Value::Str(peer.key_file.clone())),
        (
            "peer-client-cert-file",
            Value::Str(peer.client_cert_file.clone()),
        ),
        (
            "peer-client-key-file",
            Value::Str(peer.client_key_file.clone()),
        ),
        ("peer-client-cert-auth", Value::Bool(peer.client_cert_auth)),
        (
            "peer-trusted-ca-file",
            Value::Str(peer.trusted_ca_file.clone()),
        ),
        ("peer-auto-tls", Value::Bool(peer.auto_tls)),
        (
            "peer-cert-allowed-cn",
            Value::StrList(peer.allowed_cn.clone()),
        ),
    ];
    for (name, value) in tls {
        *flags.value_mut(name) = value;
    }
    *flags.value_mut("peer-cert-allowed-hostname") = Value::StrList(peer.allowed_hostname.clone());
    if flags.unsigned("self-signed-cert-validity") == 0 {
        *flags.value_mut("self-signed-cert-validity") = Value::U64(1);
    }
    let urls = UrlLists::from_flags(flags);
    validate(flags, &urls, &values.cluster_state, false, report)?;

    let proxy = file::decode_proxy(&doc, flags).map_err(ConfigError::verify)?;
    if !proxy.discovery_fallback.is_empty() {
        if !flags::FALLBACKS.contains(&proxy.discovery_fallback.as_str()) {
            return Err(ConfigError::plain(
                "unexpected error setting up discovery-fallback flag: invalid value".to_string(),
            ));
        }
        *flags.value_mut("discovery-fallback") = Value::Str(proxy.discovery_fallback);
    }
    if !proxy.proxy.is_empty() {
        if !flags::PROXY_MODES.contains(&proxy.proxy.as_str()) {
            return Err(ConfigError::plain(
                "unexpected error setting up proxyFlag: invalid value".to_string(),
            ));
        }
        *flags.value_mut("proxy") = Value::Str(proxy.proxy);
    }
    report.infos.push(format!(
        "loaded server configuration, other configuration command line flags and environment variables will be ignored if provided path={path}"
    ));
    let cluster_state = values.cluster_state.clone();
    finish(
        values.flags,
        urls,
        &cluster_state,
        Some(path.to_string()),
        report,
    )
}

/// `ioutil.ReadFile` with Go's error text (`open <path>: no such file or directory`).
fn read_file(path: &str) -> Result<String, String> {
    use std::io::Read as _;
    fn go_text(err: &std::io::Error) -> String {
        let text = err.to_string();
        let text = text.split(" (os error").next().unwrap_or(&text);
        let mut chars = text.chars();
        match chars.next() {
            Some(first) => first.to_lowercase().chain(chars).collect(),
            None => String::new(),
        }
    }
    let mut file =
        std::fs::File::open(path).map_err(|err| format!("open {path}: {}", go_text(&err)))?;
    let mut bytes = Vec::new();
    file.read_to_end(&mut bytes)
        .map_err(|err| format!("read {path}: {}", go_text(&err)))?;
    Ok(String::from_utf8_lossy(&bytes).into_owned())
}

/// Why validation stopped.
enum Invalid {
    Verify(String),
    Panic(String),
}

impl From<Invalid> for ConfigError {
    fn from(invalid: Invalid) -> ConfigError {
        match invalid {
            Invalid::Verify(error) => ConfigError::verify(error),
            Invalid::Panic(error) => ConfigError::panic(error),
        }
    }
}

/// zap's `Level.UnmarshalText`: case-insensitive, "" is info.
fn zap_level(level: &str) -> Option<&'static str> {
    match level.to_ascii_lowercase().as_str() {
        "debug" => Some("debug"),
        "info" | "" => Some("info"),
        "warn" => Some("warn"),
        "error" => Some("error"),
        "dpanic" => Some("dpanic"),
        "panic" => Some("panic"),
        "fatal" => Some("fatal"),
        _ => None,
    }
}

fn tls_version(version: &str) -> Result<u16, String> {
    match version {
        "" => Ok(0),
        "TLS1.2" => Ok(0x0303),
        "TLS1.3" => Ok(0x0304),
        other => Err(format!(
            "unexpected TLS version {} (must be one of: TLS1.2, TLS1.3)",
            quote(other)
        )),
    }
}

/// etcd's `embed.Config.Validate` (3.5), in its order. `allow_missing_advertise_client`
/// is etcdmain's exemption for setups that may become a v2 proxy.
fn validate(
    flags: &FlagSet,
    urls: &UrlLists,
    cluster_state: &str,
    allow_missing_advertise_client: bool,
    report: &mut Report,
) -> Result<(), ConfigError> {
    validate_inner(
        flags,
        urls,
        cluster_state,
        allow_missing_advertise_client,
        report,
    )
    .map_err(ConfigError::from)
}

fn validate_inner(
    flags: &FlagSet,
    urls: &UrlLists,
    cluster_state: &str,
    allow_missing_advertise_client: bool,
    report: &mut Report,
) -> Result<(), Invalid> {
    let verify = Invalid::Verify;
    // setupLogging
    let logger = flags.string("logger");
    match logger.as_str() {
        "zap" => {}
        "capnslog" => return Err(verify("--logger=capnslog is removed in v3.5".to_string())),
        other => return Err(verify(format!("unknown logger option {}", quote(other)))),
    }
    let mut outputs = flags.strings("log-outputs");
    if outputs.is_empty() {
        outputs.push("default".to_string());
    }
    if outputs.len() > 1 && outputs.iter().any(|o| o == "default") {
        return Err(verify(format!(
            "multi logoutput for {} is not supported yet",
            quote("default")
        )));
    }
    if outputs.len() > 1 && outputs.iter().any(|o| o == "systemd/journal") {
        return Err(verify(format!(
            "running with systemd/journal but other '--log-outputs' values ({}) are configured with 'default'; override 'default' value with something else",
            quote_list(&outputs)
        )));
    }
    let level = flags.string("log-level");
    if zap_level(&level).is_none() {
        return Err(Invalid::Panic(format!(
            "unrecognized level: {}",
            quote(&level)
        )));
    }

    gourl::check_bind_urls(&urls.listen_peer).map_err(verify)?;
    gourl::check_bind_urls(&urls.listen_client).map_err(verify)?;
    gourl::check_bind_urls(&urls.listen_client_http).map_err(verify)?;
    if urls.listen_client_http.is_empty() {
        report.warnings.push(
            "Running http and grpc server on single port. This is not recommended for production."
                .to_string(),
        );
    }
    gourl::check_bind_urls(&urls.listen_metrics).map_err(verify)?;
    let joined = |list: &[GoUrl]| {
        list.iter()
            .map(GoUrl::to_go_string)
            .collect::<Vec<_>>()
            .join(",")
    };
    if let Err(err) = gourl::check_host_urls(&urls.advertise_peer) {
        return Err(verify(format!(
            "--initial-advertise-peer-urls {} must be \"host:port\" ({err})",
            quote(&joined(&urls.advertise_peer))
        )));
    }
    let advertise_client = urls.advertise_client.as_deref().unwrap_or(&[]);
    if let Err(err) = gourl::check_host_urls(advertise_client) {
        return Err(verify(format!(
            "--advertise-client-urls {} must be \"host:port\" ({err})",
            quote(&joined(advertise_client))
        )));
    }

    let discovery = flags.string("discovery");
    let endpoints = flags.strings("discovery-endpoints");
    let bootstrap_methods = [
        !discovery.is_empty(),
        !flags.string("initial-cluster").is_empty(),
        !flags.string("discovery-srv").is_empty(),
        !endpoints.is_empty(),
    ];
    if cluster_state != "new" && cluster_state != "existing" {
        return Err(verify(format!(
            "unexpected clusterState {}",
            quote(cluster_state)
        )));
    }
    if bootstrap_methods.iter().filter(|set| **set).count() > 1 {
        return Err(verify(ERR_CONFLICT_BOOTSTRAP_FLAGS.to_string()));
    }
    // etcd 3.6's v3 discovery checks.
    let token = flags.string("discovery-token");
    let v3_discovery = !endpoints.is_empty()
        || !token.is_empty()
        || !flags.string("discovery-cert").is_empty()
        || !flags.string("discovery-key").is_empty()
        || !flags.string("discovery-cacert").is_empty()
        || !flags.string("discovery-user").is_empty()
        || !flags.string("discovery-password").is_empty();
    if !flags.string("discovery-proxy").is_empty() && v3_discovery {
        return Err(verify("both v2 discovery settings (discovery, discovery-proxy) and v3 discovery settings (discovery-token, discovery-endpoints, discovery-cert, discovery-key, discovery-cacert, discovery-user, discovery-password) are set".to_string()));
    }
    if token.is_empty() != endpoints.is_empty() {
        return Err(verify(
            "both --discovery-token and --discovery-endpoints must be set".to_string(),
        ));
    }

    let tick = flags.unsigned("heartbeat-interval");
    let election = flags.unsigned("election-timeout");
    if tick == 0 {
        return Err(verify(format!(
            "--heartbeat-interval must be >0 (set to {tick}ms)"
        )));
    }
    if election == 0 {
        return Err(verify(format!(
            "--election-timeout must be >0 (set to {election}ms)"
        )));
    }
    if tick.saturating_mul(5) > election {
        return Err(verify(format!(
            "--election-timeout[{election}ms] should be at least as 5 times as --heartbeat-interval[{tick}ms]"
        )));
    }
    if election > MAX_ELECTION_MS {
        return Err(verify(format!(
            "--election-timeout[{election}ms] is too long, and should be set less than {MAX_ELECTION_MS}ms"
        )));
    }

    if urls.advertise_client.is_none() {
        if allow_missing_advertise_client {
            return Ok(());
        }
        return Err(verify(ERR_UNSET_ADVERTISE_CLIENT_URLS.to_string()));
    }

    let mode = flags.string("auto-compaction-mode");
    if !matches!(mode.as_str(), "" | "periodic" | "revision") {
        return Err(verify(format!(
            "unknown auto-compaction-mode {}",
            quote(&mode)
        )));
    }

    let checkpoint = flags.boolean("experimental-enable-lease-checkpoint");
    let persist = flags.boolean("experimental-enable-lease-checkpoint-persist");
    if checkpoint && !persist {
        report.warnings.push("Detected that checkpointing is enabled without persistence. Consider enabling experimental-enable-lease-checkpoint-persist".to_string());
    }
    if persist && !checkpoint {
        return Err(verify("setting experimental-enable-lease-checkpoint-persist requires experimental-enable-lease-checkpoint".to_string()));
    }

    let hash_check = flags.duration("experimental-compact-hash-check-time");
    if hash_check <= 0 {
        return Err(verify(format!(
            "--experimental-compact-hash-check-time must be >0 (set to {})",
            duration_string(hash_check)
        )));
    }

    let min_name = flags.string("tls-min-version");
    let max_name = flags.string("tls-max-version");
    let min_version = tls_version(&min_name).map_err(verify)?;
    let max_version = tls_version(&max_name).map_err(verify)?;
    if max_version != 0 && min_version > max_version {
        return Err(verify(format!(
            "min version ({min_name}) is greater than max version ({max_name})"
        )));
    }
    if min_version == 0x0304 && !flags.strings("cipher-suites").is_empty() {
        return Err(verify(
            "cipher suites cannot be configured when only TLS1.3 is enabled".to_string(),
        ));
    }

    if flags.boolean("experimental-enable-distributed-tracing") {
        let rate = flags.signed("experimental-distributed-tracing-sampling-rate");
        let problem = if rate < 0 {
            Some("tracing sampling rate must be positive")
        } else if rate > 1_000_000 {
            Some("tracing sampling rate must be less than 1000000")
        } else {
            None
        };
        if let Some(problem) = problem {
            return Err(verify(format!(
                "distributed tracing configurition is not valid: ({problem})"
            )));
        }
    }
    Ok(())
}

fn to_urls(list: &[GoUrl]) -> Result<Vec<Url>, ConfigError> {
    list.iter()
        .map(|url| gourl::to_url(url).map_err(ConfigError::verify))
        .collect()
}

/// What etcd does between verifying flags and starting the server, then the typed result.
fn finish(
    flags: FlagSet,
    urls: UrlLists,
    cluster_state: &str,
    config_file: Option<String>,
    report: &mut Report,
) -> Result<EtcdConfig, ConfigError> {
    let name = flags.string("name");
    // UpdateDefaultClusterFromName (the part that does not need the default route).
    let mut initial_cluster = flags.string("initial-cluster");
    if name != DEFAULT_NAME && initial_cluster == DEFAULT_INITIAL_CLUSTER {
        let member = if name.is_empty() { DEFAULT_NAME } else { &name };
        initial_cluster = urls
            .advertise_peer
            .iter()
            .map(|url| format!("{member}={}", url.to_go_string()))
            .collect::<Vec<_>>()
            .join(",");
    }
    let mut data_dir = flags.string("data-dir");
    if data_dir.is_empty() {
        data_dir = format!("{name}.etcd");
        report.warnings.push(format!(
            "'data-dir' was empty; using default data-dir={data_dir}"
        ));
    }
    let auto_compaction_mode = flags.string("auto-compaction-mode");
    let auto_compaction_retention = flags.string("auto-compaction-retention");
    let auto_compaction = AutoCompaction::parse(&auto_compaction_mode, &auto_compaction_retention)
        .map_err(ConfigError::start)?;
    let log_level = zap_level(&flags.string("log-level"))
        .unwrap_or("info")
        .to_string();
    let dur = |name: &str| to_std_duration(flags.duration(name));

    for (name, why) in effect::NO_EFFECT {
        let slot = flags.slot(name);
        let value = flags::value_text(&slot.value);
        if value != flags::value_text(&slot.def.default_value()) {
            report
                .warnings
                .push(format!("--{name}={value} has no effect in etcd-rs: {why}"));
        }
    }

    let extra = flags::FLAGS
        .iter()
        .filter(|def| def.group != Group::Hidden && !MODELED.contains(&def.name))
        .map(|def| {
            (
                def.name.to_string(),
                flags::value_text(&flags.slot(def.name).value),
            )
        })
        .collect();

    Ok(EtcdConfig {
        name,
        data_dir,
        wal_dir: flags.string("wal-dir"),
        snapshot_count: flags.unsigned("snapshot-count"),
        heartbeat_interval: flags.unsigned("heartbeat-interval"),
        election_timeout: flags.unsigned("election-timeout"),
        initial_election_tick_advance: flags.boolean("initial-election-tick-advance"),
        listen_peer_urls: to_urls(&urls.listen_peer)?,
        listen_client_urls: to_urls(&urls.listen_client)?,
        listen_client_http_urls: to_urls(&urls.listen_client_http)?,
        max_snapshots: flags.unsigned("max-snapshots"),
        max_wals: flags.unsigned("max-wals"),
        quota_backend_bytes: flags.signed("quota-backend-bytes"),
        backend_batch_interval: dur("backend-batch-interval"),
        backend_batch_limit: flags.signed("backend-batch-limit"),
        max_txn_ops: flags.unsigned("max-txn-ops"),
        max_request_bytes: flags.unsigned("max-request-bytes"),
        max_concurrent_streams: u32::try_from(flags.unsigned("max-concurrent-streams"))
            .unwrap_or(u32::MAX),
        grpc_keepalive_min_time: dur("grpc-keepalive-min-time"),
        grpc_keepalive_interval: dur("grpc-keepalive-interval"),
        grpc_keepalive_timeout: dur("grpc-keepalive-timeout"),
        socket_reuse_port: flags.boolean("socket-reuse-port"),
        socket_reuse_address: flags.boolean("socket-reuse-address"),
        raft_read_timeout: dur("raft-read-timeout"),
        raft_write_timeout: dur("raft-write-timeout"),
        initial_advertise_peer_urls: to_urls(&urls.advertise_peer)?,
        advertise_client_urls: to_urls(urls.advertise_client.as_deref().unwrap_or(&[]))?,
        initial_cluster,
        initial_cluster_state: if cluster_state == "existing" {
            ClusterState::Existing
        } else {
            ClusterState::New
        },
        initial_cluster_token: flags.string("initial-cluster-token"),
        discovery: flags.string("discovery"),
        discovery_fallback: flags.string("discovery-fallback"),
        discovery_proxy: flags.string("discovery-proxy"),
        discovery_srv: flags.string("discovery-srv"),
        discovery_srv_name: flags.string("discovery-srv-name"),
        peer_tls_server_name: String::new(),
        discovery_token: flags.string("discovery-token"),
        discovery_endpoints: flags.strings("discovery-endpoints"),
        strict_reconfig_check: flags.boolean("strict-reconfig-check"),
        pre_vote: flags.boolean("pre-vote"),
        enable_v2: flags.boolean("enable-v2"),
        auto_compaction_mode,
        auto_compaction_retention,
        auto_compaction,
        cert_file: flags.string("cert-file"),
        key_file: flags.string("key-file"),
        client_cert_file: flags.string("client-cert-file"),
        client_key_file: flags.string("client-key-file"),
        client_cert_auth: flags.boolean("client-cert-auth"),
        client_crl_file: flags.string("client-crl-file"),
        client_cert_allowed_hostname: flags.strings("client-cert-allowed-hostname"),
        trusted_ca_file: flags.string("trusted-ca-file"),
        auto_tls: flags.boolean("auto-tls"),
        peer_cert_file: flags.string("peer-cert-file"),
        peer_key_file: flags.string("peer-key-file"),
        peer_client_cert_file: flags.string("peer-client-cert-file"),
        peer_client_key_file: flags.string("peer-client-key-file"),
        peer_client_cert_auth: flags.boolean("peer-client-cert-auth"),
        peer_trusted_ca_file: flags.string("peer-trusted-ca-file"),
        peer_crl_file: flags.string("peer-crl-file"),
        peer_cert_allowed_cn: flags.strings("peer-cert-allowed-cn"),
        peer_cert_allowed_hostname: flags.strings("peer-cert-allowed-hostname"),
        peer_auto_tls: flags.boolean("peer-auto-tls"),
        experimental_peer_skip_client_san_verification: flags
            .boolean("experimental-peer-skip-client-san-verification"),
        self_signed_cert_validity: flags.unsigned("self-signed-cert-validity"),
        cipher_suites: flags.strings("cipher-suites"),
        tls_min_version: flags.string("tls-min-version"),
        tls_max_version: flags.string("tls-max-version"),
        cors: flags.url_values("cors"),
        host_whitelist: flags.strings("host-whitelist"),
        auth_token: flags.string("auth-token"),
        bcrypt_cost: flags.unsigned("bcrypt-cost"),
        auth_token_ttl: flags.unsigned("auth-token-ttl"),
        enable_pprof: flags.boolean("enable-pprof"),
        metrics: flags.string("metrics"),
        listen_metrics_urls: to_urls(&urls.listen_metrics)?,
        enable_grpc_gateway: flags.boolean("enable-grpc-gateway"),
        logger: flags.string("logger"),
        log_outputs: flags.strings("log-outputs"),
        log_level,
        experimental_initial_corrupt_check: flags.boolean("experimental-initial-corrupt-check"),
        experimental_corrupt_check_time: dur("experimental-corrupt-check-time"),
        experimental_compact_hash_check_enabled: flags
            .boolean("experimental-compact-hash-check-enabled"),
        experimental_compact_hash_check_time: dur("experimental-compact-hash-check-time"),
        experimental_enable_lease_checkpoint: flags.boolean("experimental-enable-lease-checkpoint"),
        experimental_enable_lease_checkpoint_persist: flags
            .boolean("experimental-enable-lease-checkpoint-persist"),
        experimental_compaction_batch_limit: flags.signed("experimental-compaction-batch-limit"),
        experimental_watch_progress_notify_interval: dur(
            "experimental-watch-progress-notify-interval",
        ),
        experimental_warning_apply_duration: dur("experimental-warning-apply-duration"),
        experimental_snapshot_catchup_entries: flags
            .unsigned("experimental-snapshot-catchup-entries"),
        experimental_max_learners: flags.signed("experimental-max-learners"),
        force_new_cluster: flags.boolean("force-new-cluster"),
        unsafe_no_fsync: flags.boolean("unsafe-no-fsync"),
        proxy: flags.string("proxy"),
        config_file,
        extra,
    })
}

#[cfg(test)]
mod tests;
