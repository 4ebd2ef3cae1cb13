//! The load generator's own HTTP/2 client ([`grpc`](../src/grpc.rs)) against real servers: etcd
//! 3.4 from Debian (Go's HTTP/2 server) and ours (hyper's). Each workload must finish with no
//! error, including bodies and responses larger than HTTP/2's default windows and frame size,
//! and a request the server refuses must count as an error with the server's message.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail, ensure};
use etcdrs_testkit::{EtcdBin, Member, MemberOpts};
use serde_json::Value;

/// Our `etcd` binary, built beside `bench` when the workspace's binaries are built.
fn ours() -> PathBuf {
    Path::new(env!("CARGO_BIN_EXE_bench")).with_file_name("etcd")
}

/// Runs `bench --endpoints ENDPOINT ARGS...` and returns whether it succeeded, and its stdout.
async fn run(endpoint: &str, args: &[&str]) -> Result<(bool, String)> {
    let out = tokio::process::Command::new(env!("CARGO_BIN_EXE_bench"))
        .arg("--endpoints")
        .arg(endpoint)
        .args(args)
        .output()
        .await
        .context("running bench")?;
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    Ok((out.status.success(), stdout))
}

/// Runs `bench --endpoints ENDPOINT ARGS...`, which must succeed, and returns its stdout.
async fn bench(endpoint: &str, args: &[&str]) -> Result<String> {
    let (ok, out) = run(endpoint, args).await?;
    ensure!(ok, "bench {args:?} failed: {out}");
    Ok(out)
}

/// Runs a workload with `--output json` and checks that all `total` requests succeeded.
async fn clean(endpoint: &str, total: u64, args: &[&str]) -> Result<()> {
    let total_arg = total.to_string();
    let mut all = vec!["--output", "json", "--total", total_arg.as_str()];
    all.extend_from_slice(args);
    let out = bench(endpoint, &all).await?;
    let report: Value =
        serde_json::from_str(out.trim()).with_context(|| format!("report {out}"))?;
    if report["errors"] != 0 || report["total"] != total {
        bail!("bench {args:?}: {report}");
    }
    Ok(())
}

async fn workloads_run_clean(bin: &EtcdBin) -> Result<()> {
    let member = Member::start(MemberOpts::new(bin)).await?;
    let ep = member.endpoint();
    let ep = ep.as_str();
    // Many clients over few connections: streams interleave on each connection.
    clean(
        ep,
        600,
        &[
            "--clients",
            "12",
            "--conns",
            "2",
            "put",
            "--key-space-size",
            "50",
        ],
    )
    .await?;
    for consistency in ["s", "l"] {
        clean(
            ep,
            600,
            &[
                "--clients",
                "12",
                "--conns",
                "3",
                "range",
                "",
                "--prefix",
                "--consistency",
                consistency,
            ],
        )
        .await?;
    }
    clean(
        ep,
        100,
        &[
            "--clients",
            "4",
            "txn-put",
            "--txn-ops",
            "4",
            "--key-space-size",
            "20",
        ],
    )
    .await?;

    // Request bodies of 200 KB, past the 64 KiB stream and connection windows a server starts
    // with and split into frames of at most 16 KiB; then responses of 30 such values (6 MB, in
    // many DATA frames), three at once over one connection, so that the connection's receive
    // window is topped up on the way.
    clean(
        ep,
        30,
        &[
            "--clients",
            "3",
            "put",
            "--val-size",
            "200000",
            "--key-space-size",
            "30",
            "--sequential-keys",
        ],
    )
    .await?;
    clean(
        ep,
        9,
        &[
            "--clients",
            "3",
            "range",
            "",
            "--prefix",
            "--consistency",
            "s",
        ],
    )
    .await?;

    // A request the server refuses: the client stops at its first error, which is reported
    // with the server's status and message, and the run fails since nothing succeeded.
    let (ok, out) = run(ep, &["--total", "2", "put", "--val-size", "1600000"]).await?;
    ensure!(
        !ok && out.contains("[1]\tgrpc-status 3: etcdserver: request is too large"),
        "the refusal is reported with etcd's message: {out}"
    );
    Ok(())
}

#[tokio::test]
async fn workloads_run_clean_against_etcd34() -> Result<()> {
    workloads_run_clean(&EtcdBin::at("/usr/bin/etcd")).await
}

#[tokio::test]
async fn workloads_run_clean_against_ours() -> Result<()> {
    let ours = ours();
    ensure!(
        ours.exists(),
        "{} is not built (cargo build --bins)",
        ours.display()
    );
    workloads_run_clean(&EtcdBin::resolve(ours)).await
}
