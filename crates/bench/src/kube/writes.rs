//! The writers of `bench kube`: the shared state of the simulated cluster's objects, the paced
//! write mix (node heartbeats, pod updates and churn, events with leases, gets), and the
//! population of every object before the mix starts.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use anyhow::Result;
use etcdrs_proto::etcdserverpb::{LeaseGrantRequest, LeaseGrantResponse, RangeRequest};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use tokio::task::JoinSet;
use tokio::time::Instant;

use super::objects::{Guarded, Kv, Resource, call, event_key, node_key, pod_key};
use super::report::Stats;
use super::watch::Acks;
use super::{LEASE_MAX_OBJECTS, LEASE_REUSE, MAX_ATTEMPTS};
use crate::driver::{STOP, Tickets};

/// One pod slot: the pod that lives in it now (its name's generation) and its last known mod
/// revision; `busy` while a churn deletes and recreates it.
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct PodSlot {
    pub(super) generation: u64,
    pub(super) revision: i64,
    pub(super) busy: bool,
}

/// The events lease in use: kube-apiserver's `leaseManager`.
#[derive(Debug, Default)]
pub(super) struct EventLease {
    pub(super) id: i64,
    pub(super) granted: Option<Instant>,
    pub(super) objects: u64,
}

/// What the workers share: every object's last known revision, the watch bookkeeping, the
/// events lease.
pub(super) struct Cluster {
    pub(super) nodes: Vec<Mutex<i64>>,
    pub(super) pods: Vec<Mutex<PodSlot>>,
    pub(super) namespaces: usize,
    /// Random bytes every value is cut from.
    pub(super) pad: Vec<u8>,
    pub(super) acks: Acks,
    pub(super) next_event: AtomicU64,
    pub(super) event_lease: tokio::sync::Mutex<EventLease>,
    pub(super) event_ttl: i64,
}

pub(super) fn locked<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl Cluster {
    pub(super) fn value(&self, resource: Resource, rng: &mut SmallRng) -> Vec<u8> {
        let size = resource.value_size(rng);
        let start = rng.random_range(0..=self.pad.len() - size);
        self.pad[start..start + size].to_vec()
    }

    /// The events lease: the current one while it is younger than 60 s and has served fewer
    /// than 1,000 events, else a new one granted for `--event-ttl` + 60 s.
    pub(super) async fn event_lease(&self, kv: &mut Kv, stats: &mut Stats) -> Result<i64, String> {
        let mut lease = self.event_lease.lock().await;
        if let Some(at) = lease.granted
            && at.elapsed() < LEASE_REUSE
            && lease.objects < LEASE_MAX_OBJECTS
        {
            lease.objects += 1;
            return Ok(lease.id);
        }
        let started = Instant::now();
        let req = LeaseGrantRequest {
            ttl: self.event_ttl + LEASE_REUSE.as_secs() as i64,
            id: 0,
        };
        let resp: LeaseGrantResponse = call(&mut kv.lease, &req, kv.timeout).await?;
        if !resp.error.is_empty() {
            return Err(format!("lease grant: {}", resp.error));
        }
        stats.ok("lease-grant", started);
        *lease = EventLease {
            id: resp.id,
            granted: Some(started),
            objects: 1,
        };
        Ok(resp.id)
    }
}

/// Updates `key` from `revision`, retrying on conflict with the revision the Txn read; the
/// revision it ended at, `None` when it failed or the object is gone.
pub(super) async fn update_with_retry(
    cluster: &Cluster,
    kv: &mut Kv,
    stats: &mut Stats,
    name: &'static str,
    (key, resource): (&[u8], Resource),
    mut revision: i64,
    rng: &mut SmallRng,
) -> Option<i64> {
    for _ in 0..MAX_ATTEMPTS {
        let started = Instant::now();
        match kv.update(key, cluster.value(resource, rng), revision).await {
            Err(e) => {
                stats.error(name, &e);
                return None;
            }
            Ok(Guarded::Done(rev)) => {
                stats.ok(name, started);
                cluster.acks.acked(rev);
                return Some(rev);
            }
            Ok(Guarded::Conflict(Some(current))) => {
                stats.conflict(name, started);
                revision = current;
            }
            Ok(Guarded::Conflict(None)) => {
                // Deleted meanwhile (a churn won the race): NotFound, as kube-apiserver says.
                stats.conflict(name, started);
                return None;
            }
        }
    }
    None
}

/// The write mix: one operation kind per ticket, drawn by rate.
#[derive(Debug, Clone, Copy)]
pub(super) struct Mix {
    /// Node updates, pod updates, pod churn, events, gets, per second.
    pub(super) rates: [f64; 5],
}

impl Mix {
    pub(super) fn total(&self) -> f64 {
        self.rates.iter().sum()
    }

    pub(super) fn pick(&self, rng: &mut SmallRng) -> usize {
        let mut x = rng.random_range(0.0..self.total());
        for (i, r) in self.rates.iter().enumerate() {
            if x < *r {
                return i;
            }
            x -= r;
        }
        self.rates.len() - 1
    }
}

/// One writer: takes tickets until the run ends and does the drawn operation.
pub(super) async fn write_loop(
    cluster: Arc<Cluster>,
    mut kv: Kv,
    tickets: Arc<Tickets>,
    mix: Mix,
) -> Stats {
    let mut rng = SmallRng::from_rng(&mut rand::rng());
    let mut stats = Stats::default();
    while tickets.next().await.is_some() {
        match mix.pick(&mut rng) {
            0 => node_update(&cluster, &mut kv, &mut stats, &mut rng).await,
            1 => pod_update(&cluster, &mut kv, &mut stats, &mut rng).await,
            2 => pod_churn(&cluster, &mut kv, &mut stats, &mut rng).await,
            3 => event_create(&cluster, &mut kv, &mut stats, &mut rng).await,
            _ => pod_get(&cluster, &mut kv, &mut stats, &mut rng).await,
        }
    }
    stats
}

pub(super) async fn node_update(
    cluster: &Cluster,
    kv: &mut Kv,
    stats: &mut Stats,
    rng: &mut SmallRng,
) {
    let idx = rng.random_range(0..cluster.nodes.len());
    let revision = *locked(&cluster.nodes[idx]);
    let key = node_key(idx);
    let target = (key.as_slice(), Resource::Node);
    if let Some(rev) =
        update_with_retry(cluster, kv, stats, "node-update", target, revision, rng).await
    {
        let mut known = locked(&cluster.nodes[idx]);
        *known = (*known).max(rev);
    }
}

/// A random pod slot not being churned, with its generation and revision.
pub(super) fn pick_pod(
    cluster: &Cluster,
    rng: &mut SmallRng,
    claim: bool,
) -> Option<(usize, PodSlot)> {
    if cluster.pods.is_empty() {
        return None;
    }
    for _ in 0..4 {
        let slot = rng.random_range(0..cluster.pods.len());
        let mut pod = locked(&cluster.pods[slot]);
        if !pod.busy {
            let seen = *pod;
            pod.busy = claim;
            return Some((slot, seen));
        }
    }
    None
}

pub(super) async fn pod_update(
    cluster: &Cluster,
    kv: &mut Kv,
    stats: &mut Stats,
    rng: &mut SmallRng,
) {
    let Some((slot, pod)) = pick_pod(cluster, rng, false) else {
        return;
    };
    let key = pod_key(cluster.namespaces, slot, pod.generation);
    let target = (key.as_slice(), Resource::Pod);
    if let Some(rev) =
        update_with_retry(cluster, kv, stats, "pod-update", target, pod.revision, rng).await
    {
        let mut now = locked(&cluster.pods[slot]);
        if now.generation == pod.generation {
            now.revision = now.revision.max(rev);
        }
    }
}

/// Deletes a pod (guarded by its revision, retried on conflict) and creates its successor
/// under a new name in the same slot.
pub(super) async fn pod_churn(
    cluster: &Cluster,
    kv: &mut Kv,
    stats: &mut Stats,
    rng: &mut SmallRng,
) {
    let Some((slot, pod)) = pick_pod(cluster, rng, true) else {
        return;
    };
    let key = pod_key(cluster.namespaces, slot, pod.generation);
    let mut revision = pod.revision;
    let mut deleted = false;
    for _ in 0..MAX_ATTEMPTS {
        let started = Instant::now();
        match kv.delete(&key, revision).await {
            Err(e) => {
                stats.error("pod-delete", &e);
                break;
            }
            Ok(Guarded::Done(rev)) => {
                stats.ok("pod-delete", started);
                cluster.acks.acked(rev);
                deleted = true;
                break;
            }
            Ok(Guarded::Conflict(Some(current))) => {
                stats.conflict("pod-delete", started);
                revision = current;
            }
            Ok(Guarded::Conflict(None)) => {
                stats.conflict("pod-delete", started);
                deleted = true;
                break;
            }
        }
    }
    let mut next = PodSlot { busy: false, ..pod };
    if deleted {
        next.generation += 1;
        next.revision = 0;
        let key = pod_key(cluster.namespaces, slot, next.generation);
        let started = Instant::now();
        match kv.create(&key, cluster.value(Resource::Pod, rng), 0).await {
            Err(e) => stats.error("pod-create", &e),
            Ok(Guarded::Done(rev)) => {
                stats.ok("pod-create", started);
                cluster.acks.acked(rev);
                next.revision = rev;
            }
            // AlreadyExists (left by an earlier run): updates learn its revision on conflict.
            Ok(Guarded::Conflict(_)) => stats.conflict("pod-create", started),
        }
    }
    *locked(&cluster.pods[slot]) = next;
}

pub(super) async fn event_create(
    cluster: &Cluster,
    kv: &mut Kv,
    stats: &mut Stats,
    rng: &mut SmallRng,
) {
    let lease = match cluster.event_lease(kv, stats).await {
        Ok(id) => id,
        Err(e) => {
            stats.error("lease-grant", &e);
            return;
        }
    };
    let n = cluster.next_event.fetch_add(1, Ordering::Relaxed);
    let key = event_key(cluster.namespaces, n);
    let started = Instant::now();
    match kv
        .create(&key, cluster.value(Resource::Event, rng), lease)
        .await
    {
        Err(e) => stats.error("event-create", &e),
        Ok(Guarded::Done(rev)) => {
            stats.ok("event-create", started);
            cluster.acks.acked(rev);
        }
        Ok(Guarded::Conflict(_)) => stats.conflict("event-create", started),
    }
}

pub(super) async fn pod_get(cluster: &Cluster, kv: &mut Kv, stats: &mut Stats, rng: &mut SmallRng) {
    let Some((slot, pod)) = pick_pod(cluster, rng, false) else {
        return;
    };
    let req = RangeRequest {
        key: pod_key(cluster.namespaces, slot, pod.generation),
        ..Default::default()
    };
    let started = Instant::now();
    match kv.range(&req).await {
        Ok(_) => stats.ok("get", started),
        Err(e) => stats.error("get", &e),
    }
}

/// Creates every node and pod, `clients` at a time.
pub(super) async fn populate(cluster: &Arc<Cluster>, kvs: Vec<Kv>) -> Stats {
    let n_nodes = cluster.nodes.len();
    let total = n_nodes + cluster.pods.len();
    let next = Arc::new(AtomicUsize::new(0));
    let mut set = JoinSet::new();
    for mut kv in kvs {
        let cluster = cluster.clone();
        let next = next.clone();
        set.spawn(async move {
            let mut stats = Stats::default();
            let mut rng = SmallRng::from_rng(&mut rand::rng());
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= total || STOP.load(Ordering::Relaxed) {
                    break;
                }
                let (key, resource) = if i < n_nodes {
                    (node_key(i), Resource::Node)
                } else {
                    (pod_key(cluster.namespaces, i - n_nodes, 0), Resource::Pod)
                };
                let started = Instant::now();
                match kv.create(&key, cluster.value(resource, &mut rng), 0).await {
                    Err(e) => stats.error("populate", &e),
                    Ok(Guarded::Done(rev)) => {
                        stats.ok("populate", started);
                        if i < n_nodes {
                            *locked(&cluster.nodes[i]) = rev;
                        } else {
                            locked(&cluster.pods[i - n_nodes]).revision = rev;
                        }
                    }
                    // Left by an earlier run: its revision is learnt on the first conflict.
                    Ok(Guarded::Conflict(_)) => stats.conflict("populate", started),
                }
            }
            stats
        });
    }
    let mut all = Stats::default();
    while let Some(res) = set.join_next().await {
        match res {
            Ok(stats) => all.merge(&stats),
            Err(e) => all.error("populate", &format!("task failed: {e}")),
        }
    }
    all
}
