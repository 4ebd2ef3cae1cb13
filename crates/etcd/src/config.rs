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
//!
//! Layout: [`parse`] (here) picks the command and the source; `load` fills the flag set
//! from the command line and environment or from a config file; `validate` runs etcd's
//! checks; `finish` builds the typed `model::EtcdConfig`; `error` formats what etcd prints.

pub(crate) mod effect;
mod error;
mod file;
mod finish;
mod flags;
pub(crate) mod goparse;
pub(crate) mod gourl;
mod help;
mod load;
mod model;
pub(crate) mod pflag;
mod renamed;
mod validate;

pub use self::error::ConfigError;
pub use self::model::{AutoCompaction, ClusterState, EtcdConfig};

use self::flags::{FlagSet, ParseStop};
use self::load::{from_command_line, load_config_file};

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

/// `etcd --version`.
pub fn version_text() -> String {
    use etcdrs_schema::version::{ETCDRS_VERSION, SERVER_VERSION};
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

#[cfg(test)]
mod tests;
