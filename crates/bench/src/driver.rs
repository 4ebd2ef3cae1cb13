//! Connections, clients and the closed loop that drives them: each client issues one request at
//! a time until the budget (`--total`, `--duration`) is spent; a client stops at its first error
//! after counting it.

use std::future::Future;
use std::io::IsTerminal;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use anyhow::{Context, Result};
use etcd_client::{Client, ConnectOptions};
use tokio::task::JoinSet;
use tokio::time::Instant;

use crate::cli::{Budget, GlobalOpts};
use crate::report::Recorder;

/// Opens `--conns` connections; each is one `etcd_client::Client` (one balanced gRPC channel).
pub async fn connect(global: &GlobalOpts, conns: u32) -> Result<Vec<Client>> {
    let mut out = Vec::with_capacity(conns as usize);
    for _ in 0..conns {
        let opts = ConnectOptions::new().with_connect_timeout(global.dial_timeout);
        let client = Client::connect(&global.endpoints, Some(opts))
            .await
            .with_context(|| format!("connecting to {}", global.endpoints.join(",")))?;
        out.push(client);
    }
    Ok(out)
}

/// `--clients` handles, sharing the connections round-robin as etcd's benchmark does.
pub async fn clients(global: &GlobalOpts) -> Result<Vec<Client>> {
    let conns = connect(global, global.conns.min(global.clients)).await?;
    Ok((0..global.clients as usize)
        .map(|i| conns[i % conns.len()].clone())
        .collect())
}

/// `--clients` callers of the unary gRPC method `path` over `--conns` lean HTTP/2 connections
/// ([`crate::grpc`]), the connections spread over the endpoints and shared round-robin.
pub async fn unary_clients(global: &GlobalOpts, path: &str) -> Result<Vec<crate::grpc::Unary>> {
    let mut conns = Vec::new();
    for i in 0..global.conns.min(global.clients) as usize {
        let endpoint = &global.endpoints[i % global.endpoints.len()];
        conns.push(crate::grpc::Conn::connect(endpoint, global.dial_timeout).await?);
    }
    (0..global.clients as usize)
        .map(|i| conns[i % conns.len()].unary(path))
        .collect()
}

/// Set when the process is asked to stop (SIGTERM or SIGINT): no request is issued after it,
/// and the run ends with the summary of what was done, so that a script can run a workload
/// for exactly as long as something else takes (`scripts/bench-compare`'s scale rows).
pub static STOP: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Hands out request numbers until the budget is spent, paced by an optional rate.
#[derive(Debug)]
pub struct Tickets {
    start: Instant,
    next: AtomicU64,
    total: Option<u64>,
    deadline: Option<Instant>,
    /// Seconds between two requests when rate limited.
    interval: Option<f64>,
}

impl Tickets {
    pub fn new(budget: Budget, rate: u64) -> Self {
        let start = Instant::now();
        Self {
            start,
            next: AtomicU64::new(0),
            total: budget.total,
            deadline: budget.duration.map(|d| start + d),
            interval: (rate > 0).then(|| 1.0 / rate as f64),
        }
    }

    /// The number of the next request to issue, or `None` when the budget is spent.
    pub async fn next(&self) -> Option<u64> {
        let i = self.next.fetch_add(1, Ordering::Relaxed);
        if STOP.load(Ordering::Relaxed) || self.total.is_some_and(|t| i >= t) {
            return None;
        }
        if let Some(interval) = self.interval {
            let at = self.start + Duration::from_secs_f64(interval * i as f64);
            if self.deadline.is_some_and(|d| at >= d) {
                return None;
            }
            tokio::time::sleep_until(at).await;
        }
        if self.deadline.is_some_and(|d| Instant::now() >= d) {
            return None;
        }
        Some(i)
    }

    pub fn total(&self) -> Option<u64> {
        self.total
    }

    pub fn deadline(&self) -> Option<Instant> {
        self.deadline
    }
}

/// One client's request loop body.
pub trait Worker: Send + 'static {
    /// Issues request number `i` and waits for its response; `Err` is the error message.
    fn call(&mut self, i: u64) -> impl Future<Output = Result<(), String>> + Send + '_;
}

/// Runs every worker as a closed loop over one shared budget; returns the merged recorder and
/// the wall time of the run.
pub async fn run_workers<W: Worker>(
    workers: Vec<W>,
    budget: Budget,
    rate: u64,
    request_timeout: Duration,
) -> (Recorder, Duration) {
    let tickets = Arc::new(Tickets::new(budget, rate));
    let done = Arc::new(AtomicU64::new(0));
    let progress = Progress::start(done.clone(), tickets.total(), tickets.deadline());
    let start = Instant::now();
    let mut set = JoinSet::new();
    for mut w in workers {
        let tickets = tickets.clone();
        let done = done.clone();
        set.spawn(async move {
            let mut rec = Recorder::new();
            // One timer for all of this client's requests, re-armed for each (cheaper than a
            // fresh timeout per request).
            let timer = tokio::time::sleep(request_timeout);
            tokio::pin!(timer);
            while let Some(i) = tickets.next().await {
                let st = Instant::now();
                timer.as_mut().reset(st + request_timeout);
                let outcome = tokio::select! {
                    biased;
                    r = w.call(i) => Ok(r),
                    () = &mut timer => Err(()),
                };
                match outcome {
                    Ok(Ok(())) => {
                        rec.record(st.elapsed());
                        done.fetch_add(1, Ordering::Relaxed);
                    }
                    Ok(Err(e)) => {
                        rec.record_error(&e);
                        break;
                    }
                    Err(_) => {
                        rec.record_error("request timed out (bench --request-timeout)");
                        break;
                    }
                }
            }
            rec
        });
    }
    let mut all = Recorder::new();
    while let Some(res) = set.join_next().await {
        match res {
            Ok(rec) => all.merge(&rec),
            Err(e) => all.record_error(&format!("client task failed: {e}")),
        }
    }
    let elapsed = start.elapsed();
    progress.finish();
    (all, elapsed)
}

/// A progress line on stderr, only when stderr is a terminal.
pub struct Progress {
    task: Option<tokio::task::JoinHandle<()>>,
}

impl Progress {
    pub fn start(done: Arc<AtomicU64>, total: Option<u64>, deadline: Option<Instant>) -> Self {
        if !std::io::stderr().is_terminal() {
            return Self { task: None };
        }
        let task = tokio::spawn(async move {
            let start = Instant::now();
            let mut tick = tokio::time::interval(Duration::from_millis(200));
            loop {
                tick.tick().await;
                let n = done.load(Ordering::Relaxed);
                let rate = n as f64 / start.elapsed().as_secs_f64().max(1e-9);
                let of = match (total, deadline) {
                    (Some(t), _) => format!("/{t} ({:.0}%)", n as f64 * 100.0 / t as f64),
                    (None, Some(d)) => format!(
                        " ({:.0}s left)",
                        d.saturating_duration_since(Instant::now()).as_secs_f64()
                    ),
                    (None, None) => String::new(),
                };
                eprint!("\r\x1b[2K{n}{of}  {rate:.0}/s");
            }
        });
        Self { task: Some(task) }
    }

    pub fn finish(self) {
        if let Some(task) = self.task {
            task.abort();
            eprint!("\r\x1b[2K");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn tickets_stop_at_total() {
        let t = Tickets::new(
            Budget {
                total: Some(3),
                duration: None,
            },
            0,
        );
        let mut got = Vec::new();
        while let Some(i) = t.next().await {
            got.push(i);
        }
        assert_eq!(got, [0, 1, 2]);
        assert_eq!(t.next().await, None);
    }

    #[tokio::test]
    async fn a_rate_never_schedules_past_the_deadline() {
        // One per second for half a second: ticket 1 would start after the deadline, so the
        // run ends without waiting for it.
        let t = Tickets::new(
            Budget {
                total: None,
                duration: Some(Duration::from_millis(500)),
            },
            1,
        );
        assert_eq!(t.next().await, Some(0));
        assert_eq!(t.next().await, None);
    }

    struct Counting(Arc<AtomicU64>, u64);

    impl Worker for Counting {
        async fn call(&mut self, i: u64) -> Result<(), String> {
            self.0.fetch_add(1, Ordering::Relaxed);
            if i == self.1 {
                Err(format!("failed at {i}"))
            } else {
                Ok(())
            }
        }
    }

    #[tokio::test]
    async fn workers_share_the_budget_and_stop_on_error() {
        let calls = Arc::new(AtomicU64::new(0));
        let workers = (0..4).map(|_| Counting(calls.clone(), u64::MAX)).collect();
        let budget = Budget {
            total: Some(50),
            duration: None,
        };
        let (rec, _) = run_workers(workers, budget, 0, Duration::from_secs(5)).await;
        assert_eq!(rec.count(), 50);
        assert_eq!(calls.load(Ordering::Relaxed), 50);

        // A client stops at its first error, after counting it.
        let calls = Arc::new(AtomicU64::new(0));
        let workers = vec![Counting(calls.clone(), 5)];
        let (rec, _) = run_workers(workers, budget, 0, Duration::from_secs(5)).await;
        assert_eq!((rec.count(), rec.errors()), (5, 1));
    }
}
