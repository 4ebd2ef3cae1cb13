//! etcd's `embed.Config.Validate` (3.5) and the checks etcdmain runs around it, in etcd's
//! order so that the first error reported is etcd's: logger, bind and advertise URLs,
//! bootstrap and discovery flags, election timing, compaction, lease checkpoints, TLS
//! versions, tracing. It only reads the [`FlagSet`]; turning it into an [`EtcdConfig`] is
//! [`finish`](super::finish)'s job.
//!
//! [`EtcdConfig`]: super::EtcdConfig

use super::Report;
use super::error::ConfigError;
use super::flags::FlagSet;
use super::goparse::{duration_string, quote, quote_list};
use super::gourl::{self, GoUrl};
use super::load::UrlLists;

pub(super) const ERR_UNSET_ADVERTISE_CLIENT_URLS: &str =
    "--advertise-client-urls is required when --listen-client-urls is set explicitly";
const ERR_CONFLICT_BOOTSTRAP_FLAGS: &str = "multiple discovery or bootstrap flags are set. Choose one of \"initial-cluster\", \"discovery\" or \"discovery-srv\"";
const MAX_ELECTION_MS: u64 = 50_000;

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
pub(super) fn zap_level(level: &str) -> Option<&'static str> {
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
pub(super) fn validate(
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
