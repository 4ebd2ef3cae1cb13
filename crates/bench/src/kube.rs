//! `bench kube`: the traffic kube-apiserver sends its etcd (its `k8s.io/apiserver` storage
//! layer, `storage/etcd3`), at a chosen cluster size, so that the mix most etcd clusters serve can
//! be measured as one workload.
//!
//! The run has three phases:
//! 1. **Population.** `--nodes` nodes (`/registry/minions/<name>`, cluster scoped as in
//!    Kubernetes) and `--nodes` x `--pods-per-node` pods (`/registry/pods/<namespace>/<name>`),
//!    each created by kube-apiserver's create Txn, `--clients` at a time.
//! 2. **Lists and the watch.** One paginated LIST per resource, then one watch per resource on a
//!    single gRPC stream opened with `hasleader: true` (clientv3's `WithRequireLeader`), each from
//!    its LIST's revision + 1, over the resource's prefix, with `prev_kv` and `progress_notify`.
//! 3. **The mix**, for `--duration` seconds: `--clients` writers share one paced stream of node
//!    status updates, pod updates, pod churn (delete, then create under a new name), event
//!    creates (with a lease reused for 60 s or 1,000 events, as kube-apiserver's lease manager
//!    does) and gets; beside them a LIST every `--list-interval` (all pods, then all nodes, pages
//!    of `--list-page-size` pinned to page one's revision), count-only and keys-only ranges per
//!    resource, a current-revision read with a progress request on the watch stream, and the
//!    compaction loop of kube-apiserver's `compact.go`.
//!
//! Updates and deletes are guarded by the object's last known mod revision and retried with the
//! revision the failed Txn's `Else Range` returns, as `GuaranteedUpdate` and `Delete` do; every
//! retry counts as a conflict. The watch delay is the time from a write's acknowledgement to its
//! event's arrival on the watch stream (zero when the event came first).

mod objects;
mod reads;
mod report;
mod watch;
mod writes;

use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{Context, Result};
use serde_json::Value;
use tokio::task::JoinSet;
use tokio::time::Instant;

use crate::cli::{Budget, GlobalOpts, KubeOpts};
use crate::driver::Tickets;
use crate::grpc::Conn;

use objects::Kv;
use reads::{compact_loop, list, list_loop, metadata_loop};
use report::{Report, Stats};
use watch::{Acks, ProgressSent, SharedSender, open_watch, watch_loop};
use writes::{Cluster, EventLease, Mix, PodSlot, populate, write_loop};

/// Key prefixes of the three resources, as kube-apiserver lays them out.
const NODES: &str = "/registry/minions/";
const PODS: &str = "/registry/pods/";
const EVENTS: &str = "/registry/events/";
/// The key kube-apiserver's compactors agree on (outside `/registry/`, unwatched).
const COMPACT_REV_KEY: &[u8] = b"compact_rev_key";

/// The cluster size the default rates were observed at.
const REFERENCE_NODES: f64 = 5000.0;
/// Per-second rates at [`REFERENCE_NODES`]: node updates, pod updates, pod churn, events, gets.
const DEFAULT_RATES: [f64; 5] = [158.0, 66.0, 56.0, 56.0, 16.0];
/// An events lease serves at most this many events, for at most [`LEASE_REUSE`].
const LEASE_MAX_OBJECTS: u64 = 1000;
const LEASE_REUSE: Duration = Duration::from_secs(60);
/// Txns of one update or delete before it gives up (each failed one is a conflict).
const MAX_ATTEMPTS: u32 = 5;
/// How long the run waits, after the writers stopped, for the events of acknowledged writes.
const WATCH_GRACE: Duration = Duration::from_secs(5);
/// Largest value of any resource, and the random bytes values are cut from.
const MAX_VALUE: usize = 10 * 1024;
// --- the run ---------------------------------------------------------------------------------

/// The write and get rates of the mix.
fn rates(opts: &KubeOpts) -> [f64; 5] {
    let scale = opts.nodes as f64 / REFERENCE_NODES;
    let given = [
        opts.node_rate,
        opts.pod_update_rate,
        opts.pod_churn_rate,
        opts.event_rate,
        opts.get_rate,
    ];
    let mut out = [0.0; 5];
    for (i, rate) in given.iter().enumerate() {
        out[i] = rate.unwrap_or(DEFAULT_RATES[i] * scale).max(0.0) * opts.rate_scale.max(0.0);
    }
    out
}

/// Writes per second the paced mix asks for: a churn is two (the delete and the create), a get
/// none.
fn offered_writes(rates: &[f64; 5]) -> f64 {
    rates[0] + rates[1] + 2.0 * rates[2] + rates[3]
}

/// The operations whose latencies make the write summary.
const WRITES: [&str; 5] = [
    "node-update",
    "pod-update",
    "pod-delete",
    "pod-create",
    "event-create",
];

/// Runs `bench kube`: the report as JSON and as text.
pub async fn kube(global: &GlobalOpts, opts: &KubeOpts) -> Result<(Value, String)> {
    let duration = global.duration.unwrap_or(Duration::from_secs(60));
    let n_nodes = usize::try_from(opts.nodes).context("--nodes")?;
    let n_pods = usize::try_from(opts.nodes.saturating_mul(opts.pods_per_node))
        .context("--pods-per-node")?;
    let mut pad = vec![0u8; MAX_VALUE];
    rand::fill(&mut pad[..]);
    let cluster = Arc::new(Cluster {
        nodes: (0..n_nodes).map(|_| Mutex::new(0)).collect(),
        pods: (0..n_pods)
            .map(|_| Mutex::new(PodSlot::default()))
            .collect(),
        namespaces: usize::try_from(opts.namespaces).context("--namespaces")?,
        pad,
        acks: Acks::default(),
        next_event: AtomicU64::new(0),
        event_lease: tokio::sync::Mutex::new(EventLease::default()),
        event_ttl: opts.event_ttl,
    });

    let mut conns = Vec::new();
    for i in 0..global.conns.min(global.clients) as usize {
        let endpoint = &global.endpoints[i % global.endpoints.len()];
        conns.push(Conn::connect(endpoint, global.dial_timeout).await?);
    }
    let kv = |i: usize| Kv::new(&conns[i % conns.len()], global.request_timeout);
    let clients = global.clients as usize;

    // Phase 1: the objects.
    let populate_started = Instant::now();
    let populate_stats = populate(&cluster, (0..clients).map(kv).collect::<Result<_>>()?).await;
    let populate_secs = populate_started.elapsed();

    // Phase 2: one LIST per resource, then the watch from each LIST's revision.
    let mut initial = Stats::default();
    let mut reader = kv(0)?;
    let mut from = [(NODES, 0), (PODS, 0), (EVENTS, 0)];
    for (prefix, rev) in &mut from {
        *rev = list(&mut reader, prefix, opts.list_page_size, &mut initial)
            .await
            .with_context(|| format!("the initial LIST of {prefix}"))?;
    }
    let (_watch_client, sender, responses) = open_watch(global, from).await?;

    // Phase 3: the mix.
    let mut stats = Stats::default();
    let start = Instant::now();
    let end = start + duration;
    let progress_sent: ProgressSent = Arc::default();
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let watcher = tokio::spawn(watch_loop(
        responses,
        cluster.clone(),
        progress_sent.clone(),
        stop_rx,
    ));
    let mix = Mix { rates: rates(opts) };
    let mut writers = JoinSet::new();
    let mut tasks = JoinSet::new();
    if mix.total() > 0.0 {
        // The ticket stream paces whole requests per second; below one a second, one. No
        // pace at all (rate 0) when unpaced.
        let rate = if opts.unpaced {
            0
        } else {
            mix.total().round().max(1.0) as u64
        };
        let budget = Budget {
            total: global.total,
            duration: Some(duration),
        };
        let tickets = Arc::new(Tickets::new(budget, rate));
        for i in 0..clients {
            writers.spawn(write_loop(cluster.clone(), kv(i)?, tickets.clone(), mix));
        }
    }
    tasks.spawn(list_loop(
        kv(clients)?,
        opts.list_interval,
        opts.list_page_size,
        end,
    ));
    let sender: SharedSender = Arc::new(tokio::sync::Mutex::new(sender));
    tasks.spawn(metadata_loop(
        kv(clients + 1)?,
        opts.clone(),
        sender.clone(),
        progress_sent,
        end,
    ));
    tasks.spawn(compact_loop(kv(clients + 2)?, opts.compact_interval, end));
    // The mix lasts as long as its writers: a LIST still running at the end (one of 150,000
    // pods takes seconds) is waited for, but does not stretch the time rates are taken over.
    let mut elapsed = None;
    for set in [&mut writers, &mut tasks] {
        while let Some(res) = set.join_next().await {
            match res {
                Ok(s) => stats.merge(&s),
                Err(e) => stats.error("task", &format!("task failed: {e}")),
            }
        }
        elapsed.get_or_insert_with(|| start.elapsed());
    }
    let elapsed = elapsed.unwrap_or_else(|| start.elapsed());
    let grace = Instant::now() + WATCH_GRACE;
    while cluster.acks.waiting() > 0 && Instant::now() < grace {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let _ = stop_tx.send(true);
    let (counts, progress) = watcher.await.context("the watch task")?;
    drop(sender);
    if progress.summary("", elapsed).count > 0 {
        stats.op("progress").rec.merge(&progress);
    }
    let missing = cluster.acks.waiting() as u64;
    let acks = cluster.acks.lock();
    let report = Report {
        opts,
        elapsed,
        populate: (populate_stats, populate_secs),
        stats,
        counts,
        delay: acks.delay.clone(),
        acked: acks.acked,
        events: acks.events,
        missing,
    };
    Ok((report.json(), report.text()))
}

#[cfg(test)]
mod tests {
    use rand::SeedableRng;
    use rand::rngs::SmallRng;

    use super::*;

    #[test]
    fn rates_scale_with_nodes_and_the_factor() {
        let cli = <crate::cli::Cli as clap::Parser>::try_parse_from([
            "bench",
            "kube",
            "--nodes",
            "500",
            "--event-rate",
            "3",
            "--rate-scale",
            "2",
        ])
        .expect("arguments parse");
        let crate::cli::Command::Kube(opts) = cli.command else {
            panic!("expected kube")
        };
        let r = rates(&opts);
        assert!((r[0] - 31.6).abs() < 1e-9, "{r:?}");
        assert!((r[1] - 13.2).abs() < 1e-9, "{r:?}");
        assert!((r[3] - 6.0).abs() < 1e-9, "{r:?}");
        assert!((offered_writes(&r) - (31.6 + 13.2 + 22.4 + 6.0)).abs() < 1e-9);
        let mix = Mix { rates: r };
        let mut rng = SmallRng::seed_from_u64(3);
        let mut seen = [0u32; 5];
        for _ in 0..10_000 {
            seen[mix.pick(&mut rng)] += 1;
        }
        // Node updates are the largest share: 31.6 of 65.2 per second, about 4,850 draws.
        assert!((4500..5200).contains(&seen[0]), "{seen:?}");
        assert!(seen.iter().all(|n| *n > 0), "{seen:?}");
    }
}
