//! `bench`: a load generator for any etcd v3 endpoint, modelled on etcd's `tools/benchmark`.
//!
//! Every workload runs `--clients` closed-loop clients over `--conns` gRPC connections until
//! `--total` requests are done or `--duration` seconds have passed, then prints etcd's summary
//! (or one JSON object with `--output json`). The process exits non-zero when no request
//! succeeded.

mod cli;
mod driver;
mod keys;
mod report;
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

#[tokio::main]
async fn main() -> ExitCode {
    let cli = Cli::parse();
    match run(cli).await {
        Ok(code) => code,
        Err(e) => {
            eprintln!("bench: {e:#}");
            ExitCode::FAILURE
        }
    }
}

async fn run(cli: Cli) -> Result<ExitCode> {
    let g = &cli.global;
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
        Command::Watch(o) => {
            let (create, events) = watch::watch(g, o).await?;
            if text {
                print!("Watch creation summary:{}", create.to_text());
                print!("\nWatch events received summary:{}", events.to_text());
            } else {
                let mut v = events.to_json();
                v["watch_create"] = create.to_json();
                println!("{v}");
            }
            return Ok(exit_code(&events));
        }
    };
    if text {
        println!("{}", summary.to_text());
    } else {
        println!("{}", summary.to_json());
    }
    Ok(exit_code(&summary))
}

fn exit_code(s: &Summary) -> ExitCode {
    if s.count == 0 {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    }
}
