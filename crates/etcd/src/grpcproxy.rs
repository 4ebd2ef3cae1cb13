//! `etcd grpc-proxy start` (etcd `etcdmain/grpc_proxy.go`): the command line as etcd's cobra
//! command reads it (pflag syntax: `--flag value`, `--flag=value`, comma-separated lists;
//! etcd's help and error texts), then the proxy of `etcdrs_grpcproxy` on its listeners.
//!
//! `--discovery-srv` finds the endpoints in DNS SRV (see `discover_endpoints`), falling back
//! to `--endpoints` when it finds none, as etcd does.

use std::path::Path;
use std::process::ExitCode;
use std::sync::atomic::{AtomicI32, Ordering};

use etcdrs_grpcproxy::{CacheConfig, Listeners, ProxyConfig};
use tokio_util::sync::CancellationToken;

use crate::config::goparse;

/// The signal that stopped the proxy (0: none).
static STOPPED_BY: AtomicI32 = AtomicI32::new(0);

/// `etcd grpc-proxy --help` (and `etcd grpc-proxy` with no or an unknown subcommand).
const GROUP_HELP: &str = "grpc-proxy related command

Usage:
  etcd grpc-proxy [command]

Available Commands:
  start       start the grpc proxy

Flags:
  -h, --help   help for grpc-proxy

Use \"etcd grpc-proxy [command] --help\" for more information about a command.
";

/// The usage of `etcd grpc-proxy start`, as cobra prints it after an error and in `--help`.
const START_USAGE: &str = "Usage:
  etcd grpc-proxy start [flags]

Flags:
FLAGS";

/// The kind of value a flag takes (pflag's types).
#[derive(Clone, Copy, PartialEq, Eq)]
enum Kind {
    Str,
    Bool,
    Strings,
    Int,
    Uint32,
}

/// Every flag of `etcd grpc-proxy start`, with its kind.
const FLAGS: &[(&str, Kind)] = &[
    ("advertise-client-url", Kind::Str),
    ("auto-tls", Kind::Bool),
    ("cacert", Kind::Str),
    ("cert", Kind::Str),
    ("cert-file", Kind::Str),
    ("client-crl-file", Kind::Str),
    ("data-dir", Kind::Str),
    ("debug", Kind::Bool),
    ("discovery-srv", Kind::Str),
    ("discovery-srv-name", Kind::Str),
    ("enable-pprof", Kind::Bool),
    ("endpoints", Kind::Strings),
    ("experimental-leasing-prefix", Kind::Str),
    ("experimental-serializable-ordering", Kind::Bool),
    ("help", Kind::Bool),
    ("insecure-discovery", Kind::Bool),
    ("insecure-skip-tls-verify", Kind::Bool),
    ("key", Kind::Str),
    ("key-file", Kind::Str),
    ("listen-addr", Kind::Str),
    ("listen-cipher-suites", Kind::Strings),
    ("max-concurrent-streams", Kind::Uint32),
    ("max-recv-bytes", Kind::Int),
    ("max-send-bytes", Kind::Int),
    ("metrics-addr", Kind::Str),
    ("namespace", Kind::Str),
    ("resolver-prefix", Kind::Str),
    ("resolver-ttl", Kind::Int),
    ("trusted-ca-file", Kind::Str),
];

/// The flags `etcd grpc-proxy start` accepts without acting on them, with what the proxy does
/// instead; given one, the proxy says so at start.
const NO_EFFECT: &[(&str, &str)] = &[
    ("enable-pprof", "there is no /debug/pprof"),
    (
        "experimental-leasing-prefix",
        "leases are not used to cache keys at the proxy",
    ),
    (
        "experimental-serializable-ordering",
        "serializable reads are not checked for revisions older than the last one seen",
    ),
    (
        "listen-cipher-suites",
        "the listener offers rustls's TLS 1.2 and 1.3 suites",
    ),
];

/// The parsed flags of `etcd grpc-proxy start`, with etcd's defaults.
#[derive(Clone, Debug)]
struct StartFlags {
    advertise_client_url: String,
    auto_tls: bool,
    cacert: String,
    cert: String,
    cert_file: String,
    client_crl_file: String,
    data_dir: String,
    debug: bool,
    discovery_srv: String,
    discovery_srv_name: String,
    endpoints: Vec<String>,
    /// Whether `--endpoints` was given (a later one appends, as pflag's string slices do).
    endpoints_set: bool,
    help: bool,
    insecure_discovery: bool,
    insecure_skip_tls_verify: bool,
    key: String,
    key_file: String,
    listen_addr: String,
    max_concurrent_streams: u32,
    max_recv_bytes: i64,
    max_send_bytes: i64,
    metrics_addr: String,
    /// `--namespace`, as bytes: Go takes any bytes on its command line (see [`main_os`]).
    namespace: Vec<u8>,
    /// The arguments that were not UTF-8, each standing in the arguments as
    /// [`raw_placeholder`] (see [`main_os`]).
    raw_args: Vec<Vec<u8>>,
    resolver_prefix: String,
    resolver_ttl: i64,
    trusted_ca_file: String,
    /// Flags given that have no effect (see [`NO_EFFECT`]), with the values given.
    without_effect: Vec<(&'static str, String)>,
}

impl Default for StartFlags {
    fn default() -> Self {
        StartFlags {
            advertise_client_url: "127.0.0.1:23790".into(),
            auto_tls: false,
            cacert: String::new(),
            cert: String::new(),
            cert_file: String::new(),
            client_crl_file: String::new(),
            data_dir: "default.proxy".into(),
            debug: false,
            discovery_srv: String::new(),
            discovery_srv_name: String::new(),
            endpoints: vec!["127.0.0.1:2379".into()],
            endpoints_set: false,
            help: false,
            insecure_discovery: false,
            insecure_skip_tls_verify: false,
            key: String::new(),
            key_file: String::new(),
            listen_addr: "127.0.0.1:23790".into(),
            max_concurrent_streams: u32::MAX,
            max_recv_bytes: i64::from(i32::MAX),
            max_send_bytes: 1572864,
            metrics_addr: String::new(),
            namespace: Vec::new(),
            raw_args: Vec::new(),
            resolver_prefix: String::new(),
            resolver_ttl: 0,
            trusted_ca_file: String::new(),
            without_effect: Vec::new(),
        }
    }
}

/// pflag's text for a value its type rejects.
fn invalid(value: &str, flag: &str, why: String) -> String {
    format!(
        "invalid argument {} for \"--{flag}\" flag: {why}",
        goparse::quote(value)
    )
}

/// Splits a string-slice value as pflag does (CSV, surrounding spaces kept).
fn csv(value: &str) -> Vec<String> {
    if value.is_empty() {
        return Vec::new();
    }
    value.split(',').map(str::to_owned).collect()
}

impl StartFlags {
    fn set(&mut self, name: &str, value: &str) -> Result<(), String> {
        let kind = FLAGS
            .iter()
            .find(|(n, _)| *n == name)
            .map(|(_, k)| *k)
            .ok_or_else(|| format!("unknown flag: --{name}"))?;
        if let Some((flag, _)) = NO_EFFECT.iter().find(|(n, _)| *n == name) {
            self.without_effect.push((flag, value.to_owned()));
        }
        let boolean = || {
            goparse::parse_bool(value).ok_or_else(|| {
                invalid(
                    value,
                    name,
                    goparse::NumError::Syntax.strconv_text("ParseBool", value),
                )
            })
        };
        let int = || {
            goparse::parse_int(value, 64)
                .map_err(|e| invalid(value, name, e.strconv_text("ParseInt", value)))
        };
        match kind {
            Kind::Bool => {
                let v = boolean()?;
                match name {
                    "auto-tls" => self.auto_tls = v,
                    "debug" => self.debug = v,
                    "help" => self.help = v,
                    "insecure-discovery" => self.insecure_discovery = v,
                    "insecure-skip-tls-verify" => self.insecure_skip_tls_verify = v,
                    _ => {}
                }
            }
            Kind::Int => {
                let v = int()?;
                match name {
                    "max-recv-bytes" => self.max_recv_bytes = v,
                    "max-send-bytes" => self.max_send_bytes = v,
                    "resolver-ttl" => self.resolver_ttl = v,
                    _ => {}
                }
            }
            Kind::Uint32 => {
                let v = goparse::parse_uint(value, 32)
                    .map_err(|e| invalid(value, name, e.strconv_text("ParseUint", value)))?;
                self.max_concurrent_streams = u32::try_from(v).unwrap_or(u32::MAX);
            }
            Kind::Strings => {
                if name == "endpoints" {
                    if self.endpoints_set {
                        self.endpoints.extend(csv(value));
                    } else {
                        self.endpoints = csv(value);
                        self.endpoints_set = true;
                    }
                }
            }
            Kind::Str => {
                // A placeholder stands for an argument that is not UTF-8: the namespace takes
                // its bytes, any other flag (a path, an address) refuses it.
                if let Some(raw) = raw_index(value).and_then(|i| self.raw_args.get(i)) {
                    if name == "namespace" {
                        self.namespace = raw.clone();
                        return Ok(());
                    }
                    let shown = String::from_utf8_lossy(raw).into_owned();
                    return Err(invalid(&shown, name, "not valid UTF-8".to_string()));
                }
                let v = value.to_owned();
                match name {
                    "advertise-client-url" => self.advertise_client_url = v,
                    "cacert" => self.cacert = v,
                    "cert" => self.cert = v,
                    "cert-file" => self.cert_file = v,
                    "client-crl-file" => self.client_crl_file = v,
                    "data-dir" => self.data_dir = v,
                    "discovery-srv" => self.discovery_srv = v,
                    "discovery-srv-name" => self.discovery_srv_name = v,
                    "key" => self.key = v,
                    "key-file" => self.key_file = v,
                    "listen-addr" => self.listen_addr = v,
                    "metrics-addr" => self.metrics_addr = v,
                    "namespace" => self.namespace = v.into_bytes(),
                    "resolver-prefix" => self.resolver_prefix = v,
                    "trusted-ca-file" => self.trusted_ca_file = v,
                    _ => {}
                }
            }
        }
        Ok(())
    }
}

/// The argument standing for the `i`-th argument that is not UTF-8. A real argument never
/// holds a NUL byte (the kernel passes C strings), so it is never taken for one.
fn raw_placeholder(i: usize) -> String {
    format!("\0raw-argument-{i}\0")
}

/// Which argument that is not UTF-8 `value` stands for, if it is a placeholder.
fn raw_index(value: &str) -> Option<usize> {
    value
        .strip_prefix("\0raw-argument-")?
        .strip_suffix('\0')?
        .parse()
        .ok()
}

/// Parses `start`'s arguments as pflag does. Positional arguments are ignored, as etcd's
/// `start` command does.
#[cfg(test)]
fn parse_start(args: &[String]) -> Result<StartFlags, String> {
    parse_start_raw(args, Vec::new())
}

/// [`parse_start`], with the arguments that were not UTF-8 (see [`main_os`]).
fn parse_start_raw(args: &[String], raw_args: Vec<Vec<u8>>) -> Result<StartFlags, String> {
    let mut flags = StartFlags {
        raw_args,
        ..StartFlags::default()
    };
    let help = crate::config::pflag::scan(
        args,
        |name| {
            FLAGS
                .iter()
                .find(|(n, _)| *n == name)
                .map(|(_, k)| *k == Kind::Bool)
        },
        |name, value| flags.set(name, value),
    )?;
    flags.help |= help;
    Ok(flags)
}

/// etcd's argument checks (`checkArgs`), with its texts.
fn check(flags: &StartFlags) -> Result<(), String> {
    if !flags.resolver_prefix.is_empty() && flags.resolver_ttl < 1 {
        return Err(format!("invalid resolver-ttl {}", flags.resolver_ttl));
    }
    if flags.resolver_prefix.is_empty() && flags.resolver_ttl > 0 {
        return Err(format!(
            "invalid resolver-prefix {}",
            goparse::quote(&flags.resolver_prefix)
        ));
    }
    if !flags.resolver_prefix.is_empty()
        && flags.resolver_ttl > 0
        && flags.advertise_client_url.is_empty()
    {
        return Err(format!(
            "invalid advertise-client-url {}",
            goparse::quote(&flags.advertise_client_url)
        ));
    }
    if !flags.discovery_srv.is_empty() && !valid_domain(&flags.discovery_srv) {
        return Err(format!(
            "invalid discovery-srv {}",
            goparse::quote(&flags.discovery_srv)
        ));
    }
    // etcd (`TLSInfo.EmptyCN`): the cluster would take a client certificate's Common Name as
    // the user of every request the proxy forwards, whoever its client is.
    if let Some(cn) = (!flags.cert.is_empty())
        .then(|| etcdrs_server::tls::file_common_name(Path::new(&flags.cert)))
        .flatten()
        .filter(|cn| !cn.is_empty())
    {
        return Err(format!(
            "cert has non empty Common Name ({cn}): {}",
            flags.cert
        ));
    }
    Ok(())
}

/// Whether `name` is a DNS domain name (labels of letters, digits and hyphens).
fn valid_domain(name: &str) -> bool {
    let name = name.strip_suffix('.').unwrap_or(name);
    !name.is_empty()
        && name.len() <= 253
        && name.split('.').all(|label| {
            !label.is_empty()
                && label.len() <= 63
                && !label.starts_with('-')
                && !label.ends_with('-')
                && label
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
        })
}

/// `host:port` of `--metrics-addr`, which etcd takes as a URL (`http://host:port`).
fn metrics_host(addr: &str) -> Result<String, String> {
    let rest = addr
        .strip_prefix("http://")
        .or_else(|| addr.strip_prefix("https://"))
        .ok_or_else(|| format!("invalid metrics-addr {}", goparse::quote(addr)))?;
    Ok(rest.trim_end_matches('/').to_owned())
}

/// Runs `etcd grpc-proxy <args>`; returns the process exit code.
/// `etcd grpc-proxy ...` with the arguments as the OS gave them. etcd (Go) takes any bytes
/// there, so `--namespace` given bytes that are not UTF-8 prefixes the keys with those bytes;
/// any other flag given such bytes is refused with pflag's error. An argument that is not
/// UTF-8 goes through the flag scan as a placeholder (`--namespace=<bytes>` keeps its name).
pub fn main_os(args: &[std::ffi::OsString]) -> ExitCode {
    use std::os::unix::ffi::OsStrExt;
    let mut raw_args = Vec::new();
    let args: Vec<String> = args
        .iter()
        .map(|arg| {
            if let Some(text) = arg.to_str() {
                return text.to_string();
            }
            let bytes = arg.as_bytes();
            let (name, value) = match bytes.iter().position(|&b| b == b'=') {
                Some(at) if bytes.starts_with(b"--") => (&bytes[..=at], &bytes[at + 1..]),
                _ => (&b""[..], bytes),
            };
            match std::str::from_utf8(name) {
                Ok(name) => {
                    raw_args.push(value.to_vec());
                    format!("{name}{}", raw_placeholder(raw_args.len() - 1))
                }
                // A flag name that is not UTF-8 is no flag of ours: pflag's "unknown flag".
                Err(_) if bytes.starts_with(b"--") => arg.to_string_lossy().into_owned(),
                Err(_) => {
                    raw_args.push(bytes.to_vec());
                    raw_placeholder(raw_args.len() - 1)
                }
            }
        })
        .collect();
    run_main(&args, raw_args)
}

/// `etcd grpc-proxy ...`.
pub fn main(args: &[String]) -> ExitCode {
    run_main(args, Vec::new())
}

fn run_main(args: &[String], raw_args: Vec<Vec<u8>>) -> ExitCode {
    let usage = START_USAGE.replace("FLAGS", START_FLAGS);
    // As cobra, `start`'s flags may stand before or after the word `start`.
    let is_bool = |name: &str| FLAGS.iter().any(|(n, k)| *n == name && *k == Kind::Bool);
    let start_args = match crate::config::pflag::split_subcommand(args, is_bool) {
        Some((command, rest)) if command == "start" => rest,
        _ => {
            print!("{GROUP_HELP}");
            return ExitCode::SUCCESS;
        }
    };
    let flags = match parse_start_raw(&start_args, raw_args) {
        Ok(flags) => flags,
        Err(e) => {
            eprint!("Error: {e}\n{usage}\n{e}");
            return ExitCode::from(1);
        }
    };
    if flags.help {
        print!("start the grpc proxy\n\n{usage}");
        return ExitCode::SUCCESS;
    }
    if let Err(e) = check(&flags) {
        eprintln!("{e}");
        return ExitCode::from(1);
    }
    // Listeners are bound first, as etcd does: a taken port is reported plainly and exits 1.
    let main_listener = match bind(&flags.listen_addr) {
        Ok(l) => l,
        Err(e) => {
            eprintln!("{e}");
            return ExitCode::from(1);
        }
    };
    let metrics_listener = if flags.metrics_addr.is_empty() {
        None
    } else {
        match metrics_host(&flags.metrics_addr).and_then(|host| bind(&host)) {
            Ok(l) => Some(l),
            Err(e) => {
                eprintln!("{e}");
                return ExitCode::from(1);
            }
        }
    };
    crate::logging::init(if flags.debug { "debug" } else { "info" }, &[]);
    for (flag, value) in &flags.without_effect {
        if let Some((_, why)) = NO_EFFECT.iter().find(|(n, _)| n == flag) {
            tracing::warn!("--{flag}={value} has no effect in etcd-rs: {why}");
        }
    }
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
    match runtime.block_on(run(flags, main_listener, metrics_listener)) {
        Ok(()) => {
            drop(runtime);
            // Die by the signal that stopped us, as etcd's proxy does (Go's default handling).
            let signal = STOPPED_BY.load(Ordering::Relaxed);
            if signal != 0 {
                let _ = signal_hook::low_level::emulate_default_handler(signal);
            }
            ExitCode::SUCCESS
        }
        Err(e) => {
            tracing::error!(error = %format!("{e:#}"), "gRPC proxy failed");
            ExitCode::FAILURE
        }
    }
}

fn optional(path: &str) -> Option<&Path> {
    (!path.is_empty()).then(|| Path::new(path))
}

/// Binds `addr` (`host:port`), with Go's error text (`listen tcp <addr>: bind: <reason>`).
fn bind(addr: &str) -> Result<std::net::TcpListener, String> {
    let listener = std::net::TcpListener::bind(addr).map_err(|e| {
        let text = e.to_string();
        let text = text.split(" (os error").next().unwrap_or_default();
        let mut reason = text.to_owned();
        if let Some(first) = reason.get(..1) {
            reason = first.to_lowercase() + &reason[1..];
        }
        if e.raw_os_error().is_some() {
            format!("listen tcp {addr}: bind: {reason}")
        } else {
            format!("listen tcp: address {addr}: {reason}")
        }
    })?;
    listener
        .set_nonblocking(true)
        .map_err(|e| format!("listen tcp {addr}: {e}"))?;
    Ok(listener)
}

/// The cluster's client URLs from DNS SRV (`--discovery-srv`, `--discovery-srv-name`), by
/// etcd's rules (`etcdmain.discoverEndpoints`): both `_etcd-client-ssl._tcp` and
/// `_etcd-client._tcp` are looked up, and failing both is fatal. Without `--insecure-discovery`
/// only the TLS targets are kept; unlike etcd they are not dialled here first: one that fails
/// its handshake is skipped by the proxy's failover. Empty: fall back to `--endpoints`.
async fn discover_endpoints(flags: &StartFlags) -> anyhow::Result<Vec<String>> {
    use etcdrs_discovery::srv;
    let resolver = crate::dns::resolver()?;
    let targets = srv::client_targets(&resolver, &flags.discovery_srv, &flags.discovery_srv_name)
        .await
        .map_err(|e| anyhow::anyhow!(e))?;
    let secure = targets
        .secure
        .iter()
        .map(|t| format!("https://{}", t.host_port()));
    let plain = targets
        .insecure
        .iter()
        .map(|t| format!("http://{}", t.host_port()));
    let found: Vec<String> = secure.clone().chain(plain.clone()).collect();
    tracing::info!(srv_server = %flags.discovery_srv, endpoints = ?found, "discovered cluster from SRV");
    if flags.insecure_discovery {
        return Ok(found);
    }
    let insecure: Vec<String> = plain.map(|u| format!("{u:?} is insecure")).collect();
    let kept: Vec<String> = secure.collect();
    if !insecure.is_empty() {
        tracing::warn!(
            srv_server = %flags.discovery_srv,
            endpoints = ?kept,
            error = %insecure.join(","),
            "failed to validate discovered endpoints"
        );
    }
    Ok(kept)
}

/// The host of `--listen-addr` (`host:port`, IPv6 in brackets), for the self-signed certificate.
fn listen_host(addr: &str) -> String {
    let host = addr.rsplit_once(':').map_or(addr, |(host, _)| host);
    host.trim_start_matches('[')
        .trim_end_matches(']')
        .to_owned()
}

async fn run(
    flags: StartFlags,
    main_listener: std::net::TcpListener,
    metrics_listener: Option<std::net::TcpListener>,
) -> anyhow::Result<()> {
    let mut flags = flags;
    if !flags.discovery_srv.is_empty() {
        let found = discover_endpoints(&flags).await?;
        if !found.is_empty() {
            flags.endpoints = found;
        }
    }
    let main_tls = if !flags.cert_file.is_empty() || !flags.key_file.is_empty() {
        tracing::info!(
            tls_info = %format!(
                "cert = {}, key = {}, trusted-ca = {}, client-cert-auth = {}, crl-file = {}",
                flags.cert_file,
                flags.key_file,
                flags.trusted_ca_file,
                !flags.trusted_ca_file.is_empty(),
                flags.client_crl_file
            ),
            "gRPC proxy server TLS"
        );
        Some(etcdrs_grpcproxy::tls::server_config(
            Path::new(&flags.cert_file),
            Path::new(&flags.key_file),
            optional(&flags.trusted_ca_file),
        )?)
    } else if flags.auto_tls {
        // etcd: a self-signed certificate for the listen address, kept under the data dir.
        let dir = Path::new(&flags.data_dir).join("fixtures").join("proxy");
        let host = listen_host(&flags.listen_addr);
        let info = etcdrs_server::tls::TlsInfo::default().self_signed_in(&dir, &[host], 1)?;
        tracing::info!(
            tls_info = %format!(
                "cert = {}, key = {}, trusted-ca = , client-cert-auth = false, crl-file = ",
                info.cert_file.display(),
                info.key_file.display()
            ),
            "gRPC proxy server TLS"
        );
        Some(etcdrs_grpcproxy::tls::server_config(
            &info.cert_file,
            &info.key_file,
            None,
        )?)
    } else {
        None
    };
    let any_https = flags.endpoints.iter().any(|e| e.starts_with("https://"));
    let cluster_tls = if !flags.cert.is_empty()
        || !flags.key.is_empty()
        || !flags.cacert.is_empty()
        || flags.insecure_skip_tls_verify
        || any_https
    {
        Some(etcdrs_grpcproxy::tls::client_config(
            optional(&flags.cert),
            optional(&flags.key),
            optional(&flags.cacert),
            flags.insecure_skip_tls_verify,
        )?)
    } else {
        None
    };
    let main = tokio::net::TcpListener::from_std(main_listener)?;
    tracing::info!(address = %flags.listen_addr, "listening for gRPC proxy client requests");
    let metrics = match metrics_listener {
        None => None,
        Some(listener) => {
            tracing::info!(address = %flags.metrics_addr, "gRPC proxy listening for metrics");
            Some(tokio::net::TcpListener::from_std(listener)?)
        }
    };
    let config = ProxyConfig {
        endpoints: flags.endpoints.clone(),
        advertise_client_url: flags.advertise_client_url.clone(),
        resolver_prefix: flags.resolver_prefix.clone(),
        resolver_ttl: flags.resolver_ttl,
        namespace: flags.namespace.clone(),
        max_recv_bytes: usize::try_from(flags.max_recv_bytes).unwrap_or(usize::MAX),
        max_send_bytes: usize::try_from(flags.max_send_bytes).unwrap_or(usize::MAX),
        max_concurrent_streams: flags.max_concurrent_streams,
        cache: CacheConfig::default(),
    };
    let shutdown = CancellationToken::new();
    let signals = shutdown.clone();
    // Task `grpc-proxy signals`: SIGINT/SIGTERM stop the proxy.
    tokio::spawn(async move {
        let mut term =
            match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
                Ok(s) => s,
                Err(_) => return,
            };
        tokio::select! {
            _ = tokio::signal::ctrl_c() => STOPPED_BY.store(signal_hook::consts::SIGINT, Ordering::Relaxed),
            _ = term.recv() => STOPPED_BY.store(signal_hook::consts::SIGTERM, Ordering::Relaxed),
        }
        signals.cancel();
    });
    tracing::info!(address = %flags.listen_addr, "started gRPC proxy");
    let listeners = Listeners {
        main,
        main_tls,
        metrics,
    };
    etcdrs_grpcproxy::run(config, cluster_tls, listeners, shutdown).await?;
    Ok(())
}

/// The flag lines of `etcd grpc-proxy start --help`, as etcd 3.4 prints them.
const START_FLAGS: &str = r#"      --advertise-client-url string          advertise address to register (must be reachable by client) (default "127.0.0.1:23790")
      --auto-tls                             proxy TLS using generated certificates
      --cacert string                        verify certificates of TLS-enabled secure etcd servers using this CA bundle
      --cert string                          identify secure connections with etcd servers using this TLS certificate file
      --cert-file string                     identify secure connections to the proxy using this TLS certificate file
      --client-crl-file string               proxy client certificate revocation list file.
      --data-dir string                      Data directory for persistent data (default "default.proxy")
      --debug                                Enable debug-level logging for grpc-proxy.
      --discovery-srv string                 domain name to query for SRV records describing cluster endpoints
      --discovery-srv-name string            service name to query when using DNS discovery
      --enable-pprof                         Enable runtime profiling data via HTTP server. Address is at client URL + "/debug/pprof/"
      --endpoints strings                    comma separated etcd cluster endpoints (default [127.0.0.1:2379])
      --experimental-leasing-prefix string   leasing metadata prefix for disconnected linearized reads.
      --experimental-serializable-ordering   Ensure serializable reads have monotonically increasing store revisions across endpoints.
  -h, --help                                 help for start
      --insecure-discovery                   accept insecure SRV records
      --insecure-skip-tls-verify             skip authentication of etcd server TLS certificates (CAUTION: this option should be enabled only for testing purposes)
      --key string                           identify secure connections with etcd servers using this TLS key file
      --key-file string                      identify secure connections to the proxy using this TLS key file
      --listen-addr string                   listen address (default "127.0.0.1:23790")
      --listen-cipher-suites strings         Comma-separated list of supported TLS cipher suites between client/proxy (empty will be auto-populated by Go).
      --max-concurrent-streams uint32        Maximum concurrent streams that each client can open at a time. (default 4294967295)
      --max-recv-bytes int                   message receive limits in bytes (default value is math.MaxInt32) (default 2147483647)
      --max-send-bytes int                   message send limits in bytes (default value is 1.5 MiB) (default 1572864)
      --metrics-addr string                  listen for endpoint /metrics requests on an additional interface
      --namespace string                     string to prefix to all keys for namespacing requests
      --resolver-prefix string               prefix to use for registering proxy (must be shared with other grpc-proxy members)
      --resolver-ttl int                     specify TTL, in seconds, when registering proxy endpoints
      --trusted-ca-file string               verify certificates of TLS-enabled secure proxy using this CA bundle
"#;

#[cfg(test)]
mod tests {
    use super::*;

    fn args(list: &[&str]) -> Vec<String> {
        list.iter().map(|s| s.to_string()).collect()
    }

    /// An argument that is not UTF-8 reaches `--namespace` as its bytes, in either form, and
    /// no other flag.
    #[test]
    fn raw_arguments_reach_the_namespace_only() {
        let raw = vec![b"a\xffb".to_vec(), b"\xfe".to_vec()];
        let with = |list: &[String]| parse_start_raw(list, raw.clone());
        let flags = with(&[
            "--namespace".to_string(),
            raw_placeholder(0),
            raw_placeholder(1),
        ])
        .expect("parses");
        assert_eq!(flags.namespace, b"a\xffb");
        let flags = with(&[format!("--namespace={}", raw_placeholder(1))]).expect("parses");
        assert_eq!(flags.namespace, b"\xfe");
        let e = with(&[format!("--cert={}", raw_placeholder(0))])
            .err()
            .unwrap_or_default();
        assert_eq!(
            e,
            "invalid argument \"a\u{fffd}b\" for \"--cert\" flag: not valid UTF-8"
        );
        assert_eq!(raw_index("\0raw-argument-x\0"), None);
        assert_eq!(raw_index("raw-argument-1"), None);
    }

    #[test]
    fn pflag_syntax_and_defaults() {
        let flags = parse_start(&args(&[
            "--endpoints=a:1,b:2",
            "--endpoints",
            "c:3",
            "--namespace",
            "ns/",
            "--insecure-skip-tls-verify",
            "--resolver-ttl=0x10",
        ]))
        .expect("parses");
        assert_eq!(flags.endpoints, ["a:1", "b:2", "c:3"]);
        assert_eq!(flags.namespace, b"ns/");
        assert!(flags.insecure_skip_tls_verify);
        assert_eq!(flags.resolver_ttl, 16);
        assert_eq!(flags.listen_addr, "127.0.0.1:23790");
        assert_eq!(
            parse_start(&[]).expect("parses").endpoints,
            ["127.0.0.1:2379"]
        );
    }

    /// issue 19 for `etcd grpc-proxy start`: each flag is set by an integration test or
    /// declared without effect (`crate::config::effect` has the member's walk).
    #[test]
    fn every_proxy_flag_is_tested_or_declared() {
        let sources = crate::config::effect::integration_test_sources();
        let unaccounted: Vec<&str> = FLAGS
            .iter()
            .map(|(name, _)| *name)
            .filter(|name| !NO_EFFECT.iter().any(|(n, _)| n == name))
            // `--help` is tested by the help-text test; the rest must be set somewhere.
            .filter(|name| *name != "help")
            .filter(|name| !crate::config::effect::sets_flag(&sources, name))
            .collect();
        assert!(
            unaccounted.is_empty(),
            "untested proxy flags: {unaccounted:?}"
        );
    }

    #[test]
    fn flags_without_effect_are_kept_to_be_named() {
        let flags =
            parse_start(&args(&["--enable-pprof", "--listen-cipher-suites=X"])).expect("parses");
        assert_eq!(
            flags.without_effect,
            [
                ("enable-pprof", "true".to_owned()),
                ("listen-cipher-suites", "X".to_owned())
            ]
        );
        for (name, _) in NO_EFFECT {
            assert!(FLAGS.iter().any(|(n, _)| n == name), "{name}");
        }
    }

    #[test]
    fn errors_read_as_etcds() {
        let err = |list: &[&str]| parse_start(&args(list)).err().unwrap_or_default();
        assert_eq!(err(&["--foo"]), "unknown flag: --foo");
        assert_eq!(err(&["--endpoints"]), "flag needs an argument: --endpoints");
        assert_eq!(
            err(&["--resolver-ttl", "abc"]),
            "invalid argument \"abc\" for \"--resolver-ttl\" flag: strconv.ParseInt: parsing \"abc\": invalid syntax"
        );
        assert_eq!(
            err(&["--max-concurrent-streams", "-1"]),
            "invalid argument \"-1\" for \"--max-concurrent-streams\" flag: strconv.ParseUint: parsing \"-1\": invalid syntax"
        );
        let mut flags = StartFlags {
            resolver_prefix: "x".into(),
            ..Default::default()
        };
        assert_eq!(
            check(&flags).err().unwrap_or_default(),
            "invalid resolver-ttl 0"
        );
        flags.resolver_prefix.clear();
        flags.resolver_ttl = 3;
        assert_eq!(
            check(&flags).err().unwrap_or_default(),
            "invalid resolver-prefix \"\""
        );
    }
}
