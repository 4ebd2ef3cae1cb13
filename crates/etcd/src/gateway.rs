//! `etcd gateway` subcommand: flags, then the L4 proxy's run loop (`etcdrs_gateway::run`).
//!
//! etcd builds this command with cobra, so its flags follow spf13/pflag rather than Go's `flag`:
//! only `--name` is a long flag (`-h` is the one shorthand), `--name=value` or `--name value`,
//! flags and arguments may interleave, `--endpoints` is a comma list that replaces the default
//! the first time and appends after. Errors print cobra's way (`Error: <why>`, the usage, the
//! error again) and exit 1; `--help` prints the usage on stdout. etcd's gateway reads no
//! `ETCD_*` variables, so neither does this one. Values are parsed with the Go-compatible
//! scalar parsers the member's flags use (`config::goparse`, `config::gourl`).
//!
//! Flags beyond etcd's (`--metrics-addr`, the health check, SRV refresh and shutdown bounds) are
//! listed in the same help; their defaults keep etcd's behaviour where etcd has one.

use std::process::ExitCode;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use crate::config::goparse::{self, quote};
use crate::config::gourl;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Str,
    Bool,
    Duration,
    Strings,
}

impl Kind {
    fn type_name(self) -> &'static str {
        match self {
            Kind::Str => "string",
            Kind::Bool => "",
            Kind::Duration => "duration",
            Kind::Strings => "strings",
        }
    }
}

struct FlagDef {
    name: &'static str,
    kind: Kind,
    default: &'static str,
    usage: &'static str,
}

/// `etcd gateway start`'s flags, in `--help` order (pflag sorts them by name).
static FLAGS: &[FlagDef] = &[
    FlagDef {
        name: "dial-timeout",
        kind: Kind::Duration,
        default: "1s",
        usage: "timeout for dialing an endpoint, for clients' connections and health probes (etcd-rs)",
    },
    FlagDef {
        name: "discovery-srv",
        kind: Kind::Str,
        default: "",
        usage: "DNS domain used to bootstrap initial cluster",
    },
    FlagDef {
        name: "discovery-srv-name",
        kind: Kind::Str,
        default: "",
        usage: "service name to query when using DNS discovery",
    },
    FlagDef {
        name: "discovery-srv-refresh",
        kind: Kind::Duration,
        default: "30s",
        usage: "how often SRV records are looked up again; 0 looks them up only at start (etcd-rs)",
    },
    FlagDef {
        name: "endpoints",
        kind: Kind::Strings,
        default: "127.0.0.1:2379",
        usage: "comma separated etcd cluster endpoints",
    },
    FlagDef {
        name: "health-check-interval",
        kind: Kind::Duration,
        default: "5s",
        usage: "how often endpoints in rotation are probed (GET /version, or a TLS handshake); 0 disables the active check (etcd-rs)",
    },
    FlagDef {
        name: "health-check-timeout",
        kind: Kind::Duration,
        default: "3s",
        usage: "how long a health probe waits for an answer before the endpoint is marked down (etcd-rs)",
    },
    FlagDef {
        name: "help",
        kind: Kind::Bool,
        default: "",
        usage: "help for start",
    },
    FlagDef {
        name: "insecure-discovery",
        kind: Kind::Bool,
        default: "",
        usage: "accept insecure SRV records",
    },
    FlagDef {
        name: "listen-addr",
        kind: Kind::Str,
        default: "127.0.0.1:23790",
        usage: "listen address",
    },
    FlagDef {
        name: "metrics-addr",
        kind: Kind::Str,
        default: "",
        usage: "serve Prometheus /metrics and /health on this host:port (etcd-rs)",
    },
    FlagDef {
        name: "retry-delay",
        kind: Kind::Duration,
        default: "1m0s",
        usage: "duration of delay before retrying failed endpoints",
    },
    FlagDef {
        name: "shutdown-timeout",
        kind: Kind::Duration,
        default: "5s",
        usage: "on SIGTERM, how long open connections may take to finish (etcd-rs)",
    },
    FlagDef {
        name: "trusted-ca-file",
        kind: Kind::Str,
        default: "",
        usage: "path to the client server TLS CA file for verifying the discovered endpoints when discovery-srv is provided.",
    },
];

/// A parsed value.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Value {
    Str(String),
    Bool(bool),
    /// Nanoseconds.
    Dur(i64),
    Strings(Vec<String>),
}

/// The parsed flags.
struct Flags {
    values: Vec<(&'static FlagDef, Value, bool)>,
}

impl Flags {
    fn new() -> Flags {
        let values = FLAGS
            .iter()
            .map(|def| {
                let value = match def.kind {
                    Kind::Str => Value::Str(def.default.to_string()),
                    Kind::Bool => Value::Bool(false),
                    Kind::Duration => Value::Dur(goparse::parse_duration(def.default).unwrap_or(0)),
                    Kind::Strings => Value::Strings(split_list(def.default)),
                };
                (def, value, false)
            })
            .collect();
        Flags { values }
    }

    fn find(&mut self, name: &str) -> Option<&mut (&'static FlagDef, Value, bool)> {
        self.values.iter_mut().find(|(def, _, _)| def.name == name)
    }

    /// pflag's `Set`; the error is the text after `invalid argument ... flag: `.
    fn set(&mut self, name: &str, text: &str) -> Result<(), String> {
        let Some((def, value, set)) = self.find(name) else {
            return Err(format!("unknown flag: --{name}"));
        };
        *value = match def.kind {
            Kind::Str => Value::Str(text.to_string()),
            Kind::Bool => Value::Bool(goparse::parse_bool(text).ok_or_else(|| {
                format!("strconv.ParseBool: parsing {}: invalid syntax", quote(text))
            })?),
            Kind::Duration => Value::Dur(goparse::parse_duration(text)?),
            Kind::Strings => {
                let mut items = split_list(text);
                if *set && let Value::Strings(existing) = value {
                    let mut all = existing.clone();
                    all.append(&mut items);
                    items = all;
                }
                Value::Strings(items)
            }
        };
        *set = true;
        Ok(())
    }

    fn get(&self, name: &str) -> (&Value, bool) {
        match self.values.iter().find(|(def, _, _)| def.name == name) {
            Some((_, value, set)) => (value, *set),
            None => panic!("gateway flag table has no {name:?}"),
        }
    }

    fn string(&self, name: &str) -> String {
        match self.get(name).0 {
            Value::Str(s) => s.clone(),
            other => panic!("flag {name} is not a string: {other:?}"),
        }
    }

    fn boolean(&self, name: &str) -> bool {
        matches!(self.get(name).0, Value::Bool(true))
    }

    fn duration(&self, name: &str) -> i64 {
        match self.get(name).0 {
            Value::Dur(d) => *d,
            other => panic!("flag {name} is not a duration: {other:?}"),
        }
    }

    fn strings(&self, name: &str) -> (Vec<String>, bool) {
        match self.get(name) {
            (Value::Strings(list), set) => (list.clone(), set),
            (other, _) => panic!("flag {name} is not a list: {other:?}"),
        }
    }
}

/// pflag's string-slice reading of one value: comma separated, empty input is an empty list.
fn split_list(text: &str) -> Vec<String> {
    if text.is_empty() {
        return Vec::new();
    }
    text.split(',').map(|s| s.trim().to_string()).collect()
}

/// How parsing ended short of a configuration.
enum Stop {
    Help,
    Error(String),
}

/// pflag's `Parse` of `etcd gateway start`'s arguments.
fn parse(args: &[String]) -> Result<Flags, Stop> {
    let mut flags = Flags::new();
    let help = crate::config::pflag::scan(
        args,
        |name| {
            FLAGS
                .iter()
                .find(|d| d.name == name)
                .map(|d| d.kind == Kind::Bool)
        },
        |name, text| {
            flags.set(name, text).map_err(|why| {
                format!(
                    "invalid argument {} for \"--{name}\" flag: {why}",
                    quote(text)
                )
            })
        },
    )
    .map_err(Stop::Error)?;
    if help {
        return Err(Stop::Help);
    }
    Ok(flags)
}

/// pflag's `FlagUsages`: one line per flag, descriptions aligned.
fn flag_usages() -> String {
    let lines: Vec<(String, String)> = FLAGS
        .iter()
        .map(|def| {
            let short = if def.name == "help" {
                "  -h, "
            } else {
                "      "
            };
            let mut left = format!("{short}--{}", def.name);
            if !def.kind.type_name().is_empty() {
                left.push(' ');
                left.push_str(def.kind.type_name());
            }
            let mut usage = def.usage.to_string();
            if !def.default.is_empty() {
                let shown = match def.kind {
                    Kind::Str => quote(def.default),
                    Kind::Strings => format!("[{}]", def.default),
                    _ => def.default.to_string(),
                };
                usage.push_str(&format!(" (default {shown})"));
            }
            (left, usage)
        })
        .collect();
    let width = lines.iter().map(|(l, _)| l.len()).max().unwrap_or(0);
    lines
        .iter()
        .map(|(left, usage)| format!("{left:<width$}   {usage}\n"))
        .collect()
}

fn start_usage() -> String {
    format!(
        "Usage:\n  etcd gateway start [flags]\n\nFlags:\n{}",
        flag_usages()
    )
}

fn start_help() -> String {
    format!("start the gateway\n\n{}", start_usage())
}

fn gateway_usage() -> String {
    "Usage:\n  etcd gateway [command]\n\nAvailable Commands:\n  start       start the gateway\n\nFlags:\n  -h, --help   help for gateway\n\nUse \"etcd gateway [command] --help\" for more information about a command.\n".to_string()
}

/// cobra's failure output: `Error: <why>`, the usage, then the error again.
fn usage_error(why: &str, usage: &str) -> ExitCode {
    eprint!("Error: {why}\n{usage}\n{why}\n");
    ExitCode::from(1)
}

/// Runs `etcd gateway <args>`; returns the process exit code.
pub fn main(args: &[String]) -> ExitCode {
    let is_bool = |name: &str| FLAGS.iter().any(|d| d.name == name && d.kind == Kind::Bool);
    // As cobra, `start`'s flags may stand before or after the word `start`.
    if let Some((command, start_args)) = crate::config::pflag::split_subcommand(args, is_bool)
        && command == "start"
    {
        return start(&start_args);
    }
    match args.first().map(String::as_str) {
        Some(flag) if flag.starts_with('-') && flag != "-h" && flag != "--help" => {
            let why = if flag.starts_with("--") {
                format!("unknown flag: {}", flag.split('=').next().unwrap_or(flag))
            } else {
                format!(
                    "unknown shorthand flag: '{}' in {flag}",
                    flag.chars().nth(1).unwrap_or('-')
                )
            };
            usage_error(&why, &gateway_usage())
        }
        // No subcommand, help, or an unknown one: cobra prints the command's help.
        _ => {
            print!("gateway related command\n\n{}", gateway_usage());
            ExitCode::SUCCESS
        }
    }
}

/// Runs `etcd gateway start` with its flags.
fn start(start_args: &[String]) -> ExitCode {
    let flags = match parse(start_args) {
        Ok(flags) => flags,
        Err(Stop::Help) => {
            print!("{}", start_help());
            return ExitCode::SUCCESS;
        }
        Err(Stop::Error(why)) => return usage_error(&why, &start_usage()),
    };
    let config = match config_from(&flags) {
        Ok(config) => config,
        Err(why) => {
            eprintln!("{why}");
            return ExitCode::from(1);
        }
    };
    crate::logging::init("info", &[]);
    // One thread runs everything (accept, relays, probes, metrics). A relayed request costs a
    // few microseconds of CPU, almost all of it in the kernel (the two socket calls and the
    // wakeup), so one thread relays far more than a cluster serves; what more worker threads add
    // is wakeups: on a 2-core host shared with the load and a member, the multi-thread runtime
    // used ~17% more CPU per relayed put (more syscalls and context switches per request)
    // than this one, and the gateway's CPU is taken from its neighbours.
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("cannot start runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let outcome = runtime.block_on(async move {
        let stop = CancellationToken::new();
        let on_signal = stop.clone();
        // Task: waits for SIGTERM/SIGINT and starts the graceful shutdown.
        tokio::spawn(async move {
            let signal = crate::run::shutdown_signal().await;
            tracing::info!(
                signal = crate::run::signal_name(signal),
                "received signal; shutting down"
            );
            on_signal.cancel();
        });
        // The resolver is built only for SRV discovery, as before.
        let resolver = if config.discovery_srv.is_empty() {
            None
        } else {
            match crate::dns::resolver() {
                Ok(resolver) => Some(resolver),
                Err(e) => return Err(etcdrs_gateway::Error::Resolver(e.to_string())),
            }
        };
        etcdrs_gateway::run(config, resolver, stop).await
    });
    match outcome {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!(error = %e, "failed to start the gateway");
            ExitCode::from(1)
        }
    }
}

/// etcd's `stripSchema`: an endpoint that parses as a URL with a host becomes that
/// `host[:port]`, whatever the scheme (`http://`, `https://`), since the gateway relays TCP and
/// a TLS client keeps speaking TLS through it to the member. Anything else is kept as written
/// (`127.0.0.1:2379` has no scheme for Go's parser, `localhost:2379` is opaque).
fn strip_scheme(endpoint: &str) -> String {
    match gourl::parse(endpoint) {
        Ok(url) if !url.host.is_empty() => url.host,
        _ => endpoint.to_string(),
    }
}

fn std_duration(flags: &Flags, name: &str) -> Result<Duration, String> {
    let d = flags.duration(name);
    if d < 0 {
        return Err(format!(
            "invalid --{name} {}: must not be negative",
            goparse::duration_string(d)
        ));
    }
    Ok(goparse::to_std_duration(d))
}

/// Validates the flags into the proxy's configuration (etcd's checks).
fn config_from(flags: &Flags) -> Result<etcdrs_gateway::Config, String> {
    let (endpoints, endpoints_set) = flags.strings("endpoints");
    let endpoints: Vec<String> = endpoints.iter().map(|ep| strip_scheme(ep)).collect();
    for ep in &endpoints {
        let (_, port) = gourl::split_host_port(ep)
            .map_err(|e| format!("error parsing endpoint {}: {e}", quote(ep)))?;
        if port.parse::<u16>().map_or(true, |p| p == 0) {
            return Err(format!(
                "error parsing endpoint {}: invalid port {}",
                quote(ep),
                quote(&port)
            ));
        }
    }
    let listen_addr = flags.string("listen-addr");
    if gourl::split_host_port(&listen_addr).is_err() {
        return Err(format!("failed to validate listen address: {listen_addr}"));
    }
    let discovery_srv = flags.string("discovery-srv");
    if endpoints.is_empty() && discovery_srv.is_empty() {
        return Err("no endpoints found".to_string());
    }
    let mut retry_delay = std_duration(flags, "retry-delay")?;
    if retry_delay.is_zero() {
        // etcd's tcpproxy treats an unset interval as five minutes.
        retry_delay = Duration::from_secs(300);
    }
    let metrics_addr = flags.string("metrics-addr");
    if !metrics_addr.is_empty() && gourl::split_host_port(&metrics_addr).is_err() {
        return Err(format!(
            "failed to validate metrics address: {metrics_addr}"
        ));
    }
    let trusted_ca_file = flags.string("trusted-ca-file");
    Ok(etcdrs_gateway::Config {
        listen_addr,
        endpoints,
        endpoints_set,
        discovery_srv,
        discovery_srv_name: flags.string("discovery-srv-name"),
        insecure_discovery: flags.boolean("insecure-discovery"),
        trusted_ca_file: (!trusted_ca_file.is_empty()).then(|| trusted_ca_file.into()),
        retry_delay,
        health_interval: std_duration(flags, "health-check-interval")?,
        dial_timeout: std_duration(flags, "dial-timeout")?,
        health_timeout: std_duration(flags, "health-check-timeout")?,
        srv_refresh: std_duration(flags, "discovery-srv-refresh")?,
        metrics_addr: (!metrics_addr.is_empty()).then_some(metrics_addr),
        shutdown_timeout: std_duration(flags, "shutdown-timeout")?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// issue 19 for `etcd gateway start`: each flag is set by an integration test.
    #[test]
    fn every_gateway_flag_is_tested() {
        let sources = crate::config::effect::integration_test_sources();
        let unaccounted: Vec<&str> = FLAGS
            .iter()
            .map(|def| def.name)
            .filter(|name| !crate::config::effect::sets_flag(&sources, name))
            .collect();
        assert!(
            unaccounted.is_empty(),
            "untested gateway flags: {unaccounted:?}"
        );
    }

    fn args(list: &[&str]) -> Vec<String> {
        list.iter().map(|s| s.to_string()).collect()
    }

    fn err(list: &[&str]) -> String {
        match parse(&args(list)) {
            Err(Stop::Error(e)) => e,
            Err(Stop::Help) => "help".into(),
            Ok(_) => "ok".into(),
        }
    }

    #[test]
    fn errors_read_like_pflag() {
        assert_eq!(err(&["--bogus"]), "unknown flag: --bogus");
        assert_eq!(
            err(&["-endpoints", "x"]),
            "unknown shorthand flag: 'e' in -endpoints"
        );
        assert_eq!(err(&["--endpoints"]), "flag needs an argument: --endpoints");
        assert_eq!(
            err(&["--retry-delay", "123"]),
            "invalid argument \"123\" for \"--retry-delay\" flag: time: missing unit in duration \"123\""
        );
        assert_eq!(
            err(&["--insecure-discovery=maybe"]),
            "invalid argument \"maybe\" for \"--insecure-discovery\" flag: strconv.ParseBool: parsing \"maybe\": invalid syntax"
        );
        assert_eq!(err(&["-h"]), "help");
        assert_eq!(err(&["x", "--help"]), "help");
    }

    #[test]
    fn endpoints_replace_then_append() -> Result<(), String> {
        let flags = parse(&args(&["--endpoints", "a:1,b:2", "--endpoints=c:3"]))
            .map_err(|_| "parse".to_string())?;
        assert_eq!(
            flags.strings("endpoints"),
            (vec!["a:1".into(), "b:2".into(), "c:3".into()], true)
        );
        let defaults = parse(&[]).map_err(|_| "parse".to_string())?;
        assert_eq!(
            defaults.strings("endpoints"),
            (vec!["127.0.0.1:2379".into()], false)
        );
        Ok(())
    }

    #[test]
    fn help_lines_are_aligned_like_pflag() {
        let text = flag_usages();
        assert!(text.contains("      --endpoints strings "));
        assert!(text.contains("(default [127.0.0.1:2379])"));
        assert!(text.contains("(default \"127.0.0.1:23790\")"));
        assert!(text.contains("(default 1m0s)"));
        let columns: std::collections::BTreeSet<Option<usize>> = FLAGS
            .iter()
            .zip(text.lines())
            .map(|(def, line)| line.find(def.usage))
            .collect();
        assert_eq!(columns.len(), 1, "{text}");
    }

    #[test]
    fn urls_lose_their_scheme_and_portless_endpoints_are_refused() -> Result<(), String> {
        let cfg = |list: &[&str]| -> Result<etcdrs_gateway::Config, String> {
            let flags = parse(&args(list)).map_err(|_| "parse".to_string())?;
            config_from(&flags)
        };
        let c = cfg(&[
            "--endpoints",
            "https://127.0.0.1:2379,http://[::1]:2380,127.0.0.1:2381,localhost:2382",
        ])?;
        assert_eq!(
            c.endpoints,
            [
                "127.0.0.1:2379",
                "[::1]:2380",
                "127.0.0.1:2381",
                "localhost:2382"
            ]
        );
        let e = cfg(&["--endpoints", "http://127.0.0.1"])
            .err()
            .unwrap_or_default();
        assert!(e.contains("error parsing endpoint \"127.0.0.1\""), "{e}");
        let e = cfg(&["--endpoints", "127.0.0.1"]).err().unwrap_or_default();
        assert!(e.contains("missing port in address"), "{e}");
        let c = cfg(&["--retry-delay", "0s"])?;
        assert_eq!(c.retry_delay, Duration::from_secs(300));
        Ok(())
    }
}
