//! `etcd grpc-proxy` subcommand: flags, then the proxy's run loop.

use std::process::ExitCode;

/// Runs `etcd grpc-proxy <args>`; returns the process exit code.
pub fn main(_args: &[String]) -> ExitCode {
    eprintln!("etcd-rs: this subcommand is not available yet");
    ExitCode::from(1)
}
