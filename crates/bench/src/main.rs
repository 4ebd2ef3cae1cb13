//! `bench`: a load generator for any etcd v3 endpoint, modelled on etcd's `tools/benchmark`.
//!
//! Every workload runs `--clients` closed-loop clients over `--conns` gRPC connections until
//! `--total` requests are done or `--duration` seconds have passed, then prints etcd's summary
//! (or one JSON object with `--output json`). The process exits non-zero when no request
//! succeeded.

mod cli;
mod driver;
mod grpc;
mod keys;
mod kube;
mod list;
mod report;
mod scan;
mod watch;
mod workloads;

use std::process::ExitCode;

use anyhow::Result;
use clap::Parser;

use crate::cli::{Cli, Command, Consistency, Output};

/// jemalloc, as the server uses: the load generator's own allocations should cost as little
/// as possible, so that what it measures is the server.
#[global_allocator]
static GLOBAL: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;
use crate::report::Summary;

fn main() -> ExitCode {
    let cli = Cli::parse();
    let runtime = match cli.global.threads {
        0 => tokio::runtime::Builder::new_multi_thread()
            .enable_all()
            .build(),
        1 => tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build(),
        n => tokio::runtime::Builder::new_multi_thread()
            .worker_threads(n)
            .enable_all()
            .build(),
    };
    let runtime = match runtime {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("bench: cannot start the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(run(cli)) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("bench: {e:#}");
            ExitCode::FAILURE
        }
    }
}

/// User + system CPU seconds this process has used so far (`/proc/self/stat`, in Linux's
/// 100 Hz user ticks); `None` where that file is not available.
fn cpu_seconds() -> Option<f64> {
    let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
    // Fields after the command name (which may hold spaces) start at field 3 (state).
    let rest = &stat[stat.rfind(')')? + 2..];
    let mut fields = rest.split_whitespace();
    let utime: u64 = fields.nth(11)?.parse().ok()?;
    let stime: u64 = fields.next()?.parse().ok()?;
    Some((utime + stime) as f64 / 100.0)
}

async fn run(cli: Cli) -> Result<ExitCode> {
    let g = &cli.global;
    for kind in [
        tokio::signal::unix::SignalKind::terminate(),
        tokio::signal::unix::SignalKind::interrupt(),
    ] {
        let mut signal = tokio::signal::unix::signal(kind)?;
        tokio::spawn(async move {
            if signal.recv().await.is_some() {
                driver::STOP.store(true, std::sync::atomic::Ordering::Relaxed);
            }
        });
    }
    let cpu0 = cpu_seconds();
    let text = g.output == Output::Text;
    let summary = match &cli.command {
        Command::Put(o) => workloads::put(g, o).await?,
        Command::Range(o) => {
            if text {
                match o.consistency {
                    Consistency::Linearizable => println!("bench with linearizable range"),
                    Consistency::Serializable => println!("bench with serializable range"),
                }
            }
            workloads::range(g, o).await?
        }
        Command::TxnPut(o) => workloads::txn_put(g, o).await?,
        Command::LeaseKeepalive(o) => workloads::lease_keepalive(g, o).await?,
        Command::WatchLatency(o) => watch::watch_latency(g, o).await?,
        Command::Scan(o) => {
            let mut v = scan::scan(g, o).await?;
            add_cpu(&mut v, cpu0);
            println!("{v}");
            return Ok(ExitCode::SUCCESS);
        }
        Command::Catchup(o) => {
            let mut v = scan::catchup(g, o).await?;
            add_cpu(&mut v, cpu0);
            println!("{v}");
            return Ok(ExitCode::SUCCESS);
        }
        Command::List(o) => {
            let mut v = list::list(g, o).await?;
            add_cpu(&mut v, cpu0);
            println!("{v}");
            return Ok(ExitCode::SUCCESS);
        }
        Command::Kube(o) => {
            let (mut v, text_report) = kube::kube(g, o).await?;
            if text {
                print!("{text_report}");
            } else {
                add_cpu(&mut v, cpu0);
                println!("{v}");
            }
            let worked = v["populated"].as_u64().unwrap_or(0) + v["writes"].as_u64().unwrap_or(0);
            return Ok(if worked == 0 {
                ExitCode::FAILURE
            } else {
                ExitCode::SUCCESS
            });
        }
        Command::Watch(o) => {
            let (create, events) = watch::watch(g, o).await?;
            if text {
                print!("Watch creation summary:{}", create.to_text());
                print!("\nWatch events received summary:{}", events.to_text());
            } else {
                let mut v = events.to_json();
                v["watch_create"] = create.to_json();
                add_cpu(&mut v, cpu0);
                println!("{v}");
            }
            return Ok(exit_code(&events));
        }
    };
    if text {
        println!("{}", summary.to_text());
    } else {
        let mut v = summary.to_json();
        add_cpu(&mut v, cpu0);
        println!("{v}");
    }
    Ok(exit_code(&summary))
}

/// `cpu_s`: the CPU seconds the bench itself spent since `cpu0` (connecting included), so a
/// comparison can tell the load generator's cost from the target's.
fn add_cpu(v: &mut serde_json::Value, cpu0: Option<f64>) {
    if let (Some(a), Some(b)) = (cpu0, cpu_seconds()) {
        v["cpu_s"] = serde_json::json!(((b - a) * 100.0).round() / 100.0);
    }
}

fn exit_code(s: &Summary) -> ExitCode {
    if s.count == 0 {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    }
}
