//! `etcd`: the etcd-rs binary. With no subcommand it runs a member; `etcd gateway start` and
//! `etcd grpc-proxy start` run the proxies (etcd `etcdmain`); `etcd snapshot restore|status`
//! works on saved snapshots (etcd's `etcdutl snapshot`). Started under the name `etcdutl`, it
//! is etcd's `etcdutl` (`etcdutl` module).

mod config;
mod discovery;
mod dns;
mod etcdutl;
mod gateway;
mod grpcproxy;
mod idle_memory;
mod logging;
mod run;
mod snapshot;

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::anyhow;
use etcdrs_server::tls::{TlsInfo, TlsVersion};
use etcdrs_server::{AutoCompaction, ServerConfig};

use crate::config::{ClusterState, Command, EtcdConfig};

/// jemalloc: the request path allocates and frees many small buffers across threads, which
/// glibc's malloc serves with lock contention and periodic consolidation.
#[global_allocator]
static GLOBAL: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

/// The server's configuration from the parsed command line.
fn server_config(cfg: &EtcdConfig) -> anyhow::Result<ServerConfig> {
    // As etcd, --initial-cluster matters only when bootstrapping: a member with data restarts
    // with the membership its data directory records.
    let wal_dir = if cfg.wal_dir.is_empty() {
        PathBuf::from(&cfg.data_dir).join("member").join("wal")
    } else {
        PathBuf::from(&cfg.wal_dir)
    };
    let restarting = wal_dir.is_dir();
    let discovered;
    let cfg = if !restarting && discovery::wanted(cfg) {
        discovered = discovery::bootstrap(cfg)?;
        &discovered
    } else {
        cfg
    };
    let members = match cfg.initial_cluster_members() {
        Ok(members) => members,
        Err(_) if restarting => Vec::new(),
        Err(e) => return Err(anyhow!(e)),
    };
    if !restarting {
        cfg.check_local_member(&members).map_err(|e| anyhow!(e))?;
    }
    let loopback = |url: &url::Url| match url.host() {
        Some(url::Host::Domain(d)) => d == "localhost",
        Some(url::Host::Ipv4(ip)) => ip.is_loopback(),
        Some(url::Host::Ipv6(ip)) => ip.is_loopback(),
        None => false,
    };
    let peers: std::collections::BTreeSet<&str> = members.iter().map(|(n, _)| n.as_str()).collect();
    if peers.len() > 1 && cfg.advertise_client_urls.iter().any(loopback) {
        // Other members publish and hand out these URLs: a loopback one reaches nobody else.
        tracing::warn!(
            advertise_client_urls = ?cfg.advertise_client_urls.iter().map(etcdrs_server::url_string).collect::<Vec<_>>(),
            "advertising a localhost client URL to a multi-member cluster; clients on other hosts cannot reach it"
        );
    }
    let mut initial_cluster: Vec<(String, Vec<url::Url>)> = Vec::new();
    for (name, url) in members {
        match initial_cluster.iter_mut().find(|(n, _)| *n == name) {
            Some((_, urls)) => urls.push(url),
            None => initial_cluster.push((name, vec![url])),
        }
    }
    let auto_compaction = match cfg.auto_compaction {
        config::AutoCompaction::Off => AutoCompaction::Off,
        config::AutoCompaction::Periodic(d) => AutoCompaction::Periodic(d),
        config::AutoCompaction::Revision(n) => AutoCompaction::Revision(n),
    };
    let wal_dir = (!cfg.wal_dir.is_empty()).then(|| PathBuf::from(&cfg.wal_dir));
    Ok(ServerConfig {
        name: cfg.name.clone(),
        data_dir: PathBuf::from(&cfg.data_dir),
        wal_dir,
        listen_client_urls: cfg.listen_client_urls.clone(),
        listen_client_http_urls: cfg.listen_client_http_urls.clone(),
        advertise_client_urls: cfg.advertise_client_urls.clone(),
        listen_peer_urls: cfg.listen_peer_urls.clone(),
        initial_advertise_peer_urls: cfg.initial_advertise_peer_urls.clone(),
        initial_cluster,
        initial_cluster_token: cfg.initial_cluster_token.clone(),
        new_cluster: cfg.initial_cluster_state == ClusterState::New,
        // A negative quota disables the check, as in etcd.
        quota_backend_bytes: cfg.backend_quota().unwrap_or(u64::MAX),
        max_request_bytes: cfg.max_request_bytes,
        max_txn_ops: cfg.max_txn_ops as usize,
        auto_compaction,
        heartbeat_interval: std::time::Duration::from_millis(cfg.heartbeat_interval),
        election_timeout: std::time::Duration::from_millis(cfg.election_timeout),
        snapshot_count: cfg.snapshot_count,
        pre_vote: cfg.pre_vote,
        snapshot_catchup_entries: cfg.experimental_snapshot_catchup_entries,
        listen_metrics_urls: cfg.listen_metrics_urls.clone(),
        // etcd's default of 0 stands for its built-in ten minutes.
        watch_progress_notify_interval: Some(cfg.experimental_watch_progress_notify_interval)
            .filter(|d| !d.is_zero())
            .unwrap_or(std::time::Duration::from_secs(600)),
        client_tls: client_tls(cfg)?,
        peer_tls: peer_tls(cfg)?,
        auth: etcdrs_server::auth::AuthConfig {
            token: cfg.auth_token.clone(),
            bcrypt_cost: u32::try_from(cfg.bcrypt_cost).unwrap_or(u32::MAX),
            token_ttl: std::time::Duration::from_secs(cfg.auth_token_ttl),
        },
        strict_reconfig_check: cfg.strict_reconfig_check,
        max_learners: usize::try_from(cfg.experimental_max_learners).unwrap_or(0),
        force_new_cluster: cfg.force_new_cluster,
        unsafe_no_fsync: cfg.unsafe_no_fsync,
        socket_reuse_port: cfg.socket_reuse_port,
        enable_v2: cfg.enable_v2,
        enable_grpc_gateway: cfg.enable_grpc_gateway,
        backend_batch_interval: cfg.backend_batch_interval,
        backend_batch_limit: u64::try_from(cfg.backend_batch_limit).unwrap_or(0),
        cors: cfg.cors.clone(),
        host_whitelist: cfg.host_whitelist.clone(),
        max_concurrent_streams: cfg.max_concurrent_streams,
        grpc_keepalive_min_time: cfg.grpc_keepalive_min_time,
        grpc_keepalive_interval: cfg.grpc_keepalive_interval,
        grpc_keepalive_timeout: cfg.grpc_keepalive_timeout,
        initial_corrupt_check: cfg.experimental_initial_corrupt_check,
        corrupt_check_time: cfg.experimental_corrupt_check_time,
        lease_checkpoint: cfg.experimental_enable_lease_checkpoint,
        lease_checkpoint_persist: cfg.experimental_enable_lease_checkpoint_persist,
        lease_checkpoint_interval: lease_checkpoint_interval(),
        compaction_batch_limit: usize::try_from(cfg.experimental_compaction_batch_limit)
            .ok()
            .filter(|limit| *limit > 0)
            .unwrap_or(etcdrs_server::config::DEFAULT_COMPACTION_BATCH_LIMIT),
        compaction_sleep_interval: Some(cfg.experimental_compaction_sleep_interval)
            .filter(|pause| !pause.is_zero())
            .unwrap_or(etcdrs_server::config::DEFAULT_COMPACTION_SLEEP_INTERVAL),
    })
}

/// How often the leader checkpoints leases: etcd's 5 minutes, which no flag changes; tests
/// shorten it with `ETCDRS_LEASE_CHECKPOINT_INTERVAL` (a Go duration; not an etcd setting).
fn lease_checkpoint_interval() -> std::time::Duration {
    std::env::var("ETCDRS_LEASE_CHECKPOINT_INTERVAL")
        .ok()
        .and_then(|text| config::goparse::parse_duration(&text).ok())
        .and_then(|nanos| u64::try_from(nanos).ok())
        .filter(|nanos| *nanos > 0)
        .map_or(
            std::time::Duration::from_secs(300),
            std::time::Duration::from_nanos,
        )
}

/// The settings both TLS ports share: cipher suites and protocol versions.
fn tls_common(cfg: &EtcdConfig) -> anyhow::Result<TlsInfo> {
    let unsupported = etcdrs_server::tls::check_cipher_suites(&cfg.cipher_suites)?;
    if !unsupported.is_empty() {
        tracing::warn!(cipher_suites = ?unsupported, "TLS cipher suites not implemented by rustls are left out");
    }
    Ok(TlsInfo {
        cipher_suites: cfg.cipher_suites.clone(),
        min_version: TlsVersion::parse(&cfg.tls_min_version)?,
        max_version: TlsVersion::parse(&cfg.tls_max_version)?,
        ..TlsInfo::default()
    })
}

/// The hosts a self-signed certificate is made for: those of the URLs it serves.
fn url_hosts(urls: &[url::Url]) -> Vec<String> {
    let mut hosts: Vec<String> = urls
        .iter()
        .filter_map(|u| u.host_str())
        .map(|h| h.trim_start_matches('[').trim_end_matches(']').to_owned())
        .collect();
    hosts.sort();
    hosts.dedup();
    hosts
}

/// Client TLS (`--cert-file`, `--key-file`, `--trusted-ca-file`, `--client-cert-auth`,
/// `--client-crl-file`, `--auto-tls`), or `None` when neither certificates nor auto TLS are set.
fn client_tls(cfg: &EtcdConfig) -> anyhow::Result<Option<TlsInfo>> {
    let mut info = tls_common(cfg)?;
    info.client_cert_auth = cfg.client_cert_auth;
    info.trusted_ca_file = non_empty_path(&cfg.trusted_ca_file);
    info.crl_file = non_empty_path(&cfg.client_crl_file);
    info.allowed_hostname = cfg.client_cert_allowed_hostname.clone();
    if !cfg.cert_file.is_empty() || !cfg.key_file.is_empty() {
        if cfg.auto_tls {
            tracing::warn!("ignoring client auto TLS since certs given");
        }
        info.cert_file = PathBuf::from(&cfg.cert_file);
        info.key_file = PathBuf::from(&cfg.key_file);
        return Ok(Some(info));
    }
    if !cfg.auto_tls {
        return Ok(None);
    }
    let dir = PathBuf::from(&cfg.data_dir).join("fixtures").join("client");
    let info = info.self_signed_in(
        &dir,
        &url_hosts(&cfg.listen_client_urls),
        cfg.self_signed_cert_validity,
    )?;
    Ok(Some(info))
}

/// Peer TLS (`--peer-*` TLS flags), or `None` when neither certificates nor auto TLS are set.
fn peer_tls(cfg: &EtcdConfig) -> anyhow::Result<Option<TlsInfo>> {
    let mut info = tls_common(cfg)?;
    info.client_cert_auth = cfg.peer_client_cert_auth;
    info.trusted_ca_file = non_empty_path(&cfg.peer_trusted_ca_file);
    info.crl_file = non_empty_path(&cfg.peer_crl_file);
    info.allowed_cn = cfg.peer_cert_allowed_cn.clone();
    info.allowed_hostname = cfg.peer_cert_allowed_hostname.clone();
    info.server_name = Some(cfg.peer_tls_server_name.clone()).filter(|n| !n.is_empty());
    if !cfg.peer_client_cert_file.is_empty() && !cfg.peer_client_key_file.is_empty() {
        info.dial_cert = Some((
            PathBuf::from(&cfg.peer_client_cert_file),
            PathBuf::from(&cfg.peer_client_key_file),
        ));
    }
    if !cfg.peer_cert_file.is_empty() || !cfg.peer_key_file.is_empty() {
        if cfg.peer_auto_tls {
            tracing::warn!("ignoring peer auto TLS since certs given");
        }
        info.cert_file = PathBuf::from(&cfg.peer_cert_file);
        info.key_file = PathBuf::from(&cfg.peer_key_file);
        return Ok(Some(info));
    }
    if !cfg.peer_auto_tls {
        return Ok(None);
    }
    let dir = PathBuf::from(&cfg.data_dir).join("fixtures").join("peer");
    let info = info.self_signed_in(
        &dir,
        &url_hosts(&cfg.listen_peer_urls),
        cfg.self_signed_cert_validity,
    )?;
    Ok(Some(info))
}

fn non_empty_path(path: &str) -> Option<PathBuf> {
    (!path.is_empty()).then(|| PathBuf::from(path))
}

/// As every Go program does at start on Linux (and so etcd, the proxies and etcdctl): the soft
/// limit on open files is raised to the hard one, so that a low default (often 1,024) does not
/// lock clients out after a thousand connections.
fn raise_open_files_limit() {
    use nix::sys::resource::{Resource, getrlimit, setrlimit};
    if let Ok((soft, hard)) = getrlimit(Resource::RLIMIT_NOFILE)
        && soft < hard
    {
        let _ = setrlimit(Resource::RLIMIT_NOFILE, hard, hard);
    }
}

/// The arguments as UTF-8. Go takes any bytes; the member's, the gateway's and the snapshot
/// tool's flags are UTF-8 strings here, so an argument that is not is refused with one line
/// naming it, where `std::env::args` would panic (the gRPC proxy takes bytes: `main_os`).
fn utf8_args(args: impl Iterator<Item = std::ffi::OsString>) -> Result<Vec<String>, String> {
    args.map(|arg| {
        arg.into_string().map_err(|raw| {
            format!(
                "invalid argument {}: not valid UTF-8 (etcd-rs takes its flags as UTF-8)",
                config::goparse::quote(&raw.to_string_lossy())
            )
        })
    })
    .collect()
}

/// The environment as UTF-8 pairs, and the names of the `ETCD_*` variables that are not UTF-8
/// (a member refuses those; any other variable that is not UTF-8 is none of etcd's business).
fn utf8_env(
    vars: impl Iterator<Item = (std::ffi::OsString, std::ffi::OsString)>,
) -> (Vec<(String, String)>, Vec<std::ffi::OsString>) {
    use std::os::unix::ffi::OsStrExt;
    let mut env = Vec::new();
    let mut not_utf8 = Vec::new();
    for (name, value) in vars {
        match (name.into_string(), value.into_string()) {
            (Ok(name), Ok(value)) => env.push((name, value)),
            (Ok(name), Err(_)) if name.starts_with("ETCD_") => not_utf8.push(name.into()),
            (Err(name), _) if name.as_bytes().starts_with(b"ETCD_") => not_utf8.push(name),
            _ => {}
        }
    }
    (env, not_utf8)
}

/// Whether the binary was started under the name `etcdutl` (a symlink or a copy): then it is
/// etcd's offline tool (`etcdutl`), not the member.
fn invoked_as_etcdutl() -> bool {
    std::env::args_os()
        .next()
        .as_deref()
        .map(std::path::Path::new)
        .and_then(std::path::Path::file_name)
        .is_some_and(|name| name == "etcdutl")
}

fn main() -> ExitCode {
    raise_open_files_limit();
    idle_memory::start();
    let args_os: Vec<std::ffi::OsString> = std::env::args_os().skip(1).collect();
    let etcdutl = invoked_as_etcdutl();
    // The proxy takes its arguments as bytes (its --namespace may be any); it reads no env.
    if !etcdutl && args_os.first().is_some_and(|arg| arg == "grpc-proxy") {
        return grpcproxy::main_os(&args_os[1..]);
    }
    let args = match utf8_args(args_os.into_iter()) {
        Ok(args) => args,
        Err(e) => {
            eprintln!("{e}");
            return ExitCode::from(1);
        }
    };
    if etcdutl {
        return etcdutl::main(&args);
    }
    let (env, not_utf8_env) = utf8_env(std::env::vars_os());
    let parsed = match config::parse(&args, &env) {
        Ok(parsed) => parsed,
        Err(e) => {
            eprintln!("{}", e.message.trim_end_matches('\n'));
            return ExitCode::from(u8::try_from(e.exit_code).unwrap_or(1));
        }
    };
    let cfg = match parsed.command {
        Command::Version => {
            print!("{}", config::version_text());
            return ExitCode::SUCCESS;
        }
        Command::Help => {
            eprint!("{}", config::usage_text());
            println!("{}", config::help_text());
            return ExitCode::SUCCESS;
        }
        Command::Gateway(args) => return gateway::main(&args),
        Command::GrpcProxy(args) => return grpcproxy::main(&args),
        Command::Snapshot(args) => return snapshot::main(&args),
        Command::Run(cfg) => cfg,
    };
    // Only a member reads `ETCD_*`; one it cannot read is refused rather than ignored.
    if let Some(name) = not_utf8_env.first() {
        eprintln!(
            "invalid environment variable {}: its value is not valid UTF-8 (etcd-rs reads ETCD_* as UTF-8)",
            name.to_string_lossy()
        );
        return ExitCode::from(1);
    }
    logging::init(&cfg.log_level, &cfg.log_outputs);
    for line in &parsed.infos {
        tracing::info!("{line}");
    }
    for line in &parsed.warnings {
        tracing::warn!("{line}");
    }
    etcdrs_server::metrics::set_extensive(cfg.metrics == "extensive");
    etcdrs_server::metrics::set_warning_apply_duration(cfg.experimental_warning_apply_duration);
    let server_config = match server_config(&cfg) {
        Ok(c) => c,
        Err(e) => {
            tracing::error!(error = %format!("{e:#}"), "discovery failed");
            return ExitCode::from(1);
        }
    };
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("cannot start runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(run::run(server_config)) {
        Ok(run::Stopped::Signal(signal)) => {
            drop(runtime);
            // Die by the signal that stopped us, as etcd does, so supervisors see why.
            if signal != 0 {
                let _ = signal_hook::low_level::emulate_default_handler(signal);
            }
            ExitCode::SUCCESS
        }
        Ok(run::Stopped::Removed) => ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!(error = %format!("{e:#}"), "etcd server failed");
            ExitCode::FAILURE
        }
    }
}
