//! Resolution of the server binary under test.

use std::path::{Path, PathBuf};
use std::process::Command;

/// The `etcd` server binary that tests start.
///
/// `ETCDRS_TEST_ETCD_BIN`, when set and non-empty, overrides the default the caller passes. That is
/// how the suite is validated against the stock etcd: `ETCDRS_TEST_ETCD_BIN=/usr/bin/etcd`.
#[derive(Clone, Debug)]
pub struct EtcdBin {
    path: PathBuf,
}

impl EtcdBin {
    /// Environment variable naming a server binary to use instead of the default.
    pub const ENV: &'static str = "ETCDRS_TEST_ETCD_BIN";

    /// `$ETCDRS_TEST_ETCD_BIN` if set and non-empty, else `default`
    /// (integration tests pass `env!("CARGO_BIN_EXE_etcd")`).
    pub fn resolve(default: impl Into<PathBuf>) -> Self {
        let path = match std::env::var_os(Self::ENV) {
            Some(p) if !p.is_empty() => PathBuf::from(p),
            _ => default.into(),
        };
        Self { path }
    }

    /// Exactly this binary, ignoring the environment.
    pub fn at(path: impl Into<PathBuf>) -> Self {
        Self { path: path.into() }
    }

    /// Path of the binary.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// A bare `Command` for the binary (for one-shot runs such as `--version`).
    pub fn command(&self) -> Command {
        Command::new(&self.path)
    }
}
