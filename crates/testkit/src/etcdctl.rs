//! Runner for the stock `etcdctl` (API v3).

use std::path::{Path, PathBuf};
use std::process::{ExitStatus, Stdio};
use std::time::Duration;

use anyhow::Context;
use tokio::io::AsyncWriteExt;
use tokio::process::Command;

/// What one `etcdctl` run produced.
#[derive(Debug)]
pub struct CtlOutput {
    /// Exit status.
    pub status: ExitStatus,
    /// Standard output (UTF-8, lossy).
    pub stdout: String,
    /// Standard error (UTF-8, lossy).
    pub stderr: String,
}

impl CtlOutput {
    /// Whether etcdctl exited with status 0.
    pub fn success(&self) -> bool {
        self.status.success()
    }

    /// The exit code (`None` if killed by a signal).
    pub fn code(&self) -> Option<i32> {
        self.status.code()
    }
}

/// Runs `etcdctl` against fixed endpoints with `ETCDCTL_API=3`.
///
/// The binary is `$ETCDRS_TEST_ETCDCTL` if set, else `/usr/bin/etcdctl` if it exists, else
/// `etcdctl` from `PATH`. Every run gets `--endpoints=<endpoints>` first; other `ETCDCTL_*`
/// variables of the test environment are removed so they cannot leak in. A run that takes longer
/// than 30 s is killed and reported as an error.
#[derive(Clone, Debug)]
pub struct Etcdctl {
    bin: PathBuf,
    endpoints: String,
    /// Global flags given to every run after `--endpoints` (TLS files, `--user`).
    global: Vec<String>,
}

impl Etcdctl {
    /// Environment variable naming the `etcdctl` binary.
    pub const ENV: &'static str = "ETCDRS_TEST_ETCDCTL";

    /// A runner for `endpoints` (comma-separated URLs, e.g. `"http://127.0.0.1:23790"`).
    pub fn new(endpoints: impl Into<String>) -> Self {
        let bin = match std::env::var_os(Self::ENV) {
            Some(p) if !p.is_empty() => PathBuf::from(p),
            _ if Path::new("/usr/bin/etcdctl").exists() => PathBuf::from("/usr/bin/etcdctl"),
            _ => PathBuf::from("etcdctl"),
        };
        Self {
            bin,
            endpoints: endpoints.into(),
            global: Vec::new(),
        }
    }

    /// Every run trusts `ca_file` (`--cacert`) and presents `client` (`--cert`, `--key`).
    pub fn with_tls(mut self, ca_file: &Path, client: Option<&crate::certs::CertFiles>) -> Self {
        self.global.push(format!("--cacert={}", ca_file.display()));
        if let Some(files) = client {
            self.global.push(format!("--cert={}", files.cert.display()));
            self.global.push(format!("--key={}", files.key.display()));
        }
        self
    }

    /// Every run authenticates as `user` (`name:password`, etcdctl's `--user`).
    pub fn with_user(mut self, user: &str) -> Self {
        self.global.push(format!("--user={user}"));
        self
    }

    /// Every run gets `arg` as a global flag, after `--endpoints`.
    pub fn with_arg(mut self, arg: impl Into<String>) -> Self {
        self.global.push(arg.into());
        self
    }

    /// The `etcdctl` binary in use.
    pub fn bin(&self) -> &Path {
        &self.bin
    }

    /// The `--endpoints` value passed to every run.
    pub fn endpoints(&self) -> &str {
        &self.endpoints
    }

    /// Runs `etcdctl --endpoints=… <args>` with no stdin.
    pub async fn run(&self, args: &[&str]) -> anyhow::Result<CtlOutput> {
        self.run_inner(args, None).await
    }

    /// Runs `etcdctl --endpoints=… <args>` feeding `stdin` (e.g. the `txn` mini-language).
    pub async fn run_stdin(&self, args: &[&str], stdin: &str) -> anyhow::Result<CtlOutput> {
        self.run_inner(args, Some(stdin)).await
    }

    /// Runs and returns stdout; panics with the exit status and stderr if etcdctl failed.
    #[track_caller]
    pub fn ok<'a>(&'a self, args: &'a [&'a str]) -> impl Future<Output = String> + 'a {
        let caller = std::panic::Location::caller();
        async move { expect_ok(caller, args, self.run(args).await) }
    }

    /// Like [`Etcdctl::ok`] with `stdin` fed to the process.
    #[track_caller]
    pub fn ok_stdin<'a>(
        &'a self,
        args: &'a [&'a str],
        stdin: &'a str,
    ) -> impl Future<Output = String> + 'a {
        let caller = std::panic::Location::caller();
        async move { expect_ok(caller, args, self.run_stdin(args, stdin).await) }
    }

    /// Runs and returns stderr; panics with stdout if etcdctl unexpectedly succeeded.
    #[track_caller]
    pub fn fail<'a>(&'a self, args: &'a [&'a str]) -> impl Future<Output = String> + 'a {
        let caller = std::panic::Location::caller();
        async move {
            match self.run(args).await {
                Ok(out) if !out.success() => out.stderr,
                Ok(out) => panic!(
                    "{caller}: etcdctl {args:?} succeeded but was expected to fail\nstdout:\n{}\nstderr:\n{}",
                    out.stdout, out.stderr
                ),
                Err(e) => panic!("{caller}: etcdctl {args:?} could not run: {e:#}"),
            }
        }
    }

    async fn run_inner(&self, args: &[&str], stdin: Option<&str>) -> anyhow::Result<CtlOutput> {
        let mut cmd = Command::new(&self.bin);
        for (key, _) in std::env::vars_os() {
            if key.to_string_lossy().starts_with("ETCDCTL_") {
                cmd.env_remove(key);
            }
        }
        cmd.env("ETCDCTL_API", "3")
            .arg(format!("--endpoints={}", self.endpoints))
            .args(&self.global)
            .args(args)
            .stdin(if stdin.is_some() {
                Stdio::piped()
            } else {
                Stdio::null()
            })
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true);
        let mut child = cmd
            .spawn()
            .with_context(|| format!("spawning {}", self.bin.display()))?;
        if let Some(input) = stdin {
            let mut pipe = child.stdin.take().context("stdin was piped")?;
            pipe.write_all(input.as_bytes()).await?;
            drop(pipe);
        }
        let out = tokio::time::timeout(Duration::from_secs(30), child.wait_with_output())
            .await
            .with_context(|| format!("etcdctl {args:?} did not finish within 30 s"))??;
        Ok(CtlOutput {
            status: out.status,
            stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
        })
    }
}

fn expect_ok(
    caller: &std::panic::Location<'_>,
    args: &[&str],
    res: anyhow::Result<CtlOutput>,
) -> String {
    match res {
        Ok(out) if out.success() => out.stdout,
        Ok(out) => panic!(
            "{caller}: etcdctl {args:?} failed with {}\nstdout:\n{}\nstderr:\n{}",
            out.status, out.stdout, out.stderr
        ),
        Err(e) => panic!("{caller}: etcdctl {args:?} could not run: {e:#}"),
    }
}
