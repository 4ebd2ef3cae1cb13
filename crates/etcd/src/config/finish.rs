//! The last step of parsing: what etcd does between verifying flags and starting the
//! server (the default cluster from `--name`, the default data dir, auto-compaction
//! parsing, "has no effect" warnings), then the typed [`EtcdConfig`] built from the
//! validated [`FlagSet`]. Runs for both sources (command line and config file).

use url::Url;

use super::error::ConfigError;
use super::flags::{self, FlagSet, Group};
use super::goparse::to_std_duration;
use super::gourl::{self, GoUrl};
use super::load::{DEFAULT_INITIAL_CLUSTER, UrlLists};
use super::model::{AutoCompaction, ClusterState, EtcdConfig, MODELED};
use super::validate::zap_level;
use super::{Report, effect, renamed};

/// `--name`'s default.
const DEFAULT_NAME: &str = "default";

fn to_urls(list: &[GoUrl]) -> Result<Vec<Url>, ConfigError> {
    list.iter()
        .map(|url| gourl::to_url(url).map_err(ConfigError::verify))
        .collect()
}

/// What etcd does between verifying flags and starting the server, then the typed result.
pub(super) fn finish(
    mut flags: FlagSet,
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
    // Warned about under the names given, before the 3.6 names reach the 3.5 ones.
    for (name, why) in effect::NO_EFFECT {
        let slot = flags.slot(name);
        let value = flags::value_text(&slot.value);
        if value != flags::value_text(&slot.def.default_value()) {
            report
                .warnings
                .push(format!("--{name}={value} has no effect in etcd-rs: {why}"));
        }
    }
    report.warnings.extend(renamed::apply(&mut flags)?);
    let dur = |name: &str| to_std_duration(flags.duration(name));

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
        experimental_compaction_sleep_interval: dur("experimental-compaction-sleep-interval"),
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
