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

use std::collections::{BTreeMap, HashMap};
use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use anyhow::{Context, Result, bail};
use etcd_client::{Client, ConnectOptions, WatchOptions, WatchRequestSender, WatchResponseStream};
use etcdrs_proto::etcdserverpb::compare::{CompareResult, CompareTarget, TargetUnion};
use etcdrs_proto::etcdserverpb::response_op::Response;
use etcdrs_proto::etcdserverpb::{
    CompactionRequest, CompactionResponse, Compare, DeleteRangeRequest, LeaseGrantRequest,
    LeaseGrantResponse, PutRequest, RangeRequest, RangeResponse, RequestOp, TxnRequest,
    TxnResponse, request_op,
};
use etcdrs_proto::keys::prefix_end;
use prost::Message;
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use serde_json::{Value, json};
use tokio::sync::watch;
use tokio::task::JoinSet;
use tokio::time::Instant;

use crate::cli::{Budget, GlobalOpts, KubeOpts};
use crate::driver::{STOP, Tickets};
use crate::grpc::{Conn, KV_COMPACT, KV_RANGE, KV_TXN, LEASE_GRANT, Unary};
use crate::report::Recorder;

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

/// The resources the workload writes; each has its own value-size distribution.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Resource {
    Node,
    Pod,
    Event,
}

impl Resource {
    /// A value size: nodes 6-10 KiB (status with images and conditions), pods 1-10 KiB, events
    /// about 1 KiB; uniform within each range.
    fn value_size(self, rng: &mut SmallRng) -> usize {
        match self {
            Resource::Node => rng.random_range(6 * 1024..=MAX_VALUE),
            Resource::Pod => rng.random_range(1024..=MAX_VALUE),
            Resource::Event => rng.random_range(900..=1200),
        }
    }
}

fn node_key(i: usize) -> Vec<u8> {
    format!("{NODES}node-{i:05}").into_bytes()
}

/// Pod slot `slot` in its `generation`: every churn of a slot gives its pod a new name.
fn pod_key(namespaces: usize, slot: usize, generation: u64) -> Vec<u8> {
    let ns = slot % namespaces;
    format!("{PODS}ns-{ns:04}/pod-{slot:06}-{generation}").into_bytes()
}

fn event_key(namespaces: usize, n: u64) -> Vec<u8> {
    let ns = n as usize % namespaces;
    format!("{EVENTS}ns-{ns:04}/event-{n:08x}").into_bytes()
}

// --- requests --------------------------------------------------------------------------------

fn mod_revision_is(key: &[u8], revision: i64) -> Compare {
    Compare {
        result: CompareResult::Equal as i32,
        target: CompareTarget::Mod as i32,
        key: key.to_vec(),
        range_end: Vec::new(),
        target_union: Some(TargetUnion::ModRevision(revision)),
    }
}

fn put_op(key: &[u8], value: Vec<u8>, lease: i64) -> RequestOp {
    RequestOp {
        request: Some(request_op::Request::RequestPut(PutRequest {
            key: key.to_vec(),
            value,
            lease,
            ..Default::default()
        })),
    }
}

fn get_op(key: &[u8]) -> RequestOp {
    RequestOp {
        request: Some(request_op::Request::RequestRange(RangeRequest {
            key: key.to_vec(),
            ..Default::default()
        })),
    }
}

fn delete_op(key: &[u8]) -> RequestOp {
    RequestOp {
        request: Some(request_op::Request::RequestDeleteRange(
            DeleteRangeRequest {
                key: key.to_vec(),
                ..Default::default()
            },
        )),
    }
}

/// What a guarded Txn did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Guarded {
    /// It succeeded at this revision.
    Done(i64),
    /// Its compare failed; the key's mod revision as its `Else Range` read it, `None` when the
    /// key does not exist (or, for a create, when there was no `Else`).
    Conflict(Option<i64>),
}

fn guarded(resp: &TxnResponse) -> Guarded {
    if resp.succeeded {
        return Guarded::Done(resp.header.as_ref().map_or(0, |h| h.revision));
    }
    let current = resp.responses.first().and_then(|op| match &op.response {
        Some(Response::ResponseRange(range)) => range.kvs.first().map(|kv| kv.mod_revision),
        _ => None,
    });
    Guarded::Conflict(current)
}

/// One unary call, bounded by the request timeout.
async fn call<Req: Message, Resp: Message + Default>(
    unary: &mut Unary,
    req: &Req,
    timeout: Duration,
) -> Result<Resp, String> {
    match tokio::time::timeout(timeout, unary.call(req)).await {
        Ok(r) => r,
        Err(_) => Err("request timed out (bench --request-timeout)".to_owned()),
    }
}

/// One worker's callers, all on one connection.
struct Kv {
    txn: Unary,
    range: Unary,
    lease: Unary,
    compact: Unary,
    timeout: Duration,
}

impl Kv {
    fn new(conn: &Conn, timeout: Duration) -> Result<Kv> {
        Ok(Kv {
            txn: conn.unary(KV_TXN)?,
            range: conn.unary(KV_RANGE)?,
            lease: conn.unary(LEASE_GRANT)?,
            compact: conn.unary(KV_COMPACT)?,
            timeout,
        })
    }

    async fn txn(&mut self, req: &TxnRequest) -> Result<TxnResponse, String> {
        call(&mut self.txn, req, self.timeout).await
    }

    async fn range(&mut self, req: &RangeRequest) -> Result<RangeResponse, String> {
        call(&mut self.range, req, self.timeout).await
    }

    /// `Txn If(mod_revision(k) == 0) Then Put(k, v[, lease])`.
    async fn create(&mut self, key: &[u8], value: Vec<u8>, lease: i64) -> Result<Guarded, String> {
        let req = TxnRequest {
            compare: vec![mod_revision_is(key, 0)],
            success: vec![put_op(key, value, lease)],
            failure: Vec::new(),
        };
        self.txn(&req).await.map(|r| guarded(&r))
    }

    /// `Txn If(mod_revision(k) == rev) Then Put(k, v) Else Range(k)`.
    async fn update(&mut self, key: &[u8], value: Vec<u8>, rev: i64) -> Result<Guarded, String> {
        let req = TxnRequest {
            compare: vec![mod_revision_is(key, rev)],
            success: vec![put_op(key, value, 0)],
            failure: vec![get_op(key)],
        };
        self.txn(&req).await.map(|r| guarded(&r))
    }

    /// `Txn If(mod_revision(k) == rev) Then DeleteRange(k) Else Range(k)`.
    async fn delete(&mut self, key: &[u8], rev: i64) -> Result<Guarded, String> {
        let req = TxnRequest {
            compare: vec![mod_revision_is(key, rev)],
            success: vec![delete_op(key)],
            failure: vec![get_op(key)],
        };
        self.txn(&req).await.map(|r| guarded(&r))
    }
}

// --- results ---------------------------------------------------------------------------------

/// The numbers of one operation kind.
#[derive(Debug, Clone, Default)]
struct OpStats {
    /// Latency of every request that got an answer, conflicts included.
    rec: Recorder,
    conflicts: u64,
}

/// Per-operation results of one task; the tasks' merge into one at the end.
#[derive(Debug, Default)]
struct Stats {
    ops: BTreeMap<&'static str, OpStats>,
    /// Keys read by LISTs.
    listed_keys: u64,
}

impl Stats {
    fn op(&mut self, name: &'static str) -> &mut OpStats {
        self.ops.entry(name).or_default()
    }

    fn ok(&mut self, name: &'static str, started: Instant) {
        self.op(name).rec.record(started.elapsed());
    }

    fn conflict(&mut self, name: &'static str, started: Instant) {
        let op = self.op(name);
        op.rec.record(started.elapsed());
        op.conflicts += 1;
    }

    fn error(&mut self, name: &'static str, message: &str) {
        self.op(name).rec.record_error(message);
    }

    fn merge(&mut self, other: &Stats) {
        for (name, op) in &other.ops {
            let mine = self.op(name);
            mine.rec.merge(&op.rec);
            mine.conflicts += op.conflicts;
        }
        self.listed_keys += other.listed_keys;
    }
}

/// What is known of one watched write's revision: its acknowledgement, or its event, whichever
/// came first.
#[derive(Debug, Clone, Copy)]
enum Seen {
    Acked(Instant),
    Event,
}

/// Matches acknowledged writes with their watch events to time the watch delay.
#[derive(Debug, Default)]
struct Acks {
    inner: Mutex<AcksInner>,
}

#[derive(Debug, Default)]
struct AcksInner {
    pending: HashMap<i64, Seen>,
    delay: Recorder,
    acked: u64,
    events: u64,
}

impl Acks {
    fn lock(&self) -> MutexGuard<'_, AcksInner> {
        // A poisoned lock only means another task panicked; the numbers are still counts.
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A watched write was acknowledged at `revision`.
    fn acked(&self, revision: i64) {
        let now = Instant::now();
        let mut inner = self.lock();
        inner.acked += 1;
        match inner.pending.remove(&revision) {
            Some(Seen::Event) => inner.delay.record(Duration::ZERO),
            Some(Seen::Acked(_)) | None => {
                inner.pending.insert(revision, Seen::Acked(now));
            }
        }
    }

    /// An event of `revision` arrived at `now`.
    fn event(&self, revision: i64, now: Instant) {
        let mut inner = self.lock();
        inner.events += 1;
        match inner.pending.remove(&revision) {
            Some(Seen::Acked(at)) => inner.delay.record(now.saturating_duration_since(at)),
            Some(Seen::Event) | None => {
                inner.pending.insert(revision, Seen::Event);
            }
        }
    }

    /// Acknowledged writes whose event has not arrived.
    fn waiting(&self) -> usize {
        self.lock()
            .pending
            .values()
            .filter(|s| matches!(s, Seen::Acked(_)))
            .count()
    }
}

// --- the cluster's objects -----------------------------------------------------------------

/// One pod slot: the pod that lives in it now (its name's generation) and its last known mod
/// revision; `busy` while a churn deletes and recreates it.
#[derive(Debug, Clone, Copy, Default)]
struct PodSlot {
    generation: u64,
    revision: i64,
    busy: bool,
}

/// The events lease in use: kube-apiserver's `leaseManager`.
#[derive(Debug, Default)]
struct EventLease {
    id: i64,
    granted: Option<Instant>,
    objects: u64,
}

/// What the workers share: every object's last known revision, the watch bookkeeping, the
/// events lease.
struct Cluster {
    nodes: Vec<Mutex<i64>>,
    pods: Vec<Mutex<PodSlot>>,
    namespaces: usize,
    /// Random bytes every value is cut from.
    pad: Vec<u8>,
    acks: Acks,
    next_event: AtomicU64,
    event_lease: tokio::sync::Mutex<EventLease>,
    event_ttl: i64,
}

fn locked<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl Cluster {
    fn value(&self, resource: Resource, rng: &mut SmallRng) -> Vec<u8> {
        let size = resource.value_size(rng);
        let start = rng.random_range(0..=self.pad.len() - size);
        self.pad[start..start + size].to_vec()
    }

    /// The events lease: the current one while it is younger than 60 s and has served fewer
    /// than 1,000 events, else a new one granted for `--event-ttl` + 60 s.
    async fn event_lease(&self, kv: &mut Kv, stats: &mut Stats) -> Result<i64, String> {
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
async fn update_with_retry(
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
struct Mix {
    /// Node updates, pod updates, pod churn, events, gets, per second.
    rates: [f64; 5],
}

impl Mix {
    fn total(&self) -> f64 {
        self.rates.iter().sum()
    }

    fn pick(&self, rng: &mut SmallRng) -> usize {
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
async fn write_loop(cluster: Arc<Cluster>, mut kv: Kv, tickets: Arc<Tickets>, mix: Mix) -> Stats {
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

async fn node_update(cluster: &Cluster, kv: &mut Kv, stats: &mut Stats, rng: &mut SmallRng) {
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
fn pick_pod(cluster: &Cluster, rng: &mut SmallRng, claim: bool) -> Option<(usize, PodSlot)> {
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

async fn pod_update(cluster: &Cluster, kv: &mut Kv, stats: &mut Stats, rng: &mut SmallRng) {
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
async fn pod_churn(cluster: &Cluster, kv: &mut Kv, stats: &mut Stats, rng: &mut SmallRng) {
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

async fn event_create(cluster: &Cluster, kv: &mut Kv, stats: &mut Stats, rng: &mut SmallRng) {
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

async fn pod_get(cluster: &Cluster, kv: &mut Kv, stats: &mut Stats, rng: &mut SmallRng) {
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

// --- reads beside the writers --------------------------------------------------------------

/// The name a whole LIST of `prefix` is timed under.
fn list_name(prefix: &str) -> &'static str {
    match prefix {
        NODES => "list-nodes",
        PODS => "list-pods",
        _ => "list-events",
    }
}

/// A paginated LIST of `prefix`: page one at the current revision, the others pinned to it and
/// starting after the last key read; every page timed as `list-page`, the whole as
/// [`list_name`]. Returns page one's revision.
async fn list(kv: &mut Kv, prefix: &str, page_size: i64, stats: &mut Stats) -> Option<i64> {
    let started = Instant::now();
    let end = prefix_end(prefix.as_bytes());
    let mut key = prefix.as_bytes().to_vec();
    let mut revision = 0;
    loop {
        let req = RangeRequest {
            key: key.clone(),
            range_end: end.clone(),
            limit: page_size,
            revision,
            ..Default::default()
        };
        let page_started = Instant::now();
        let resp = match kv.range(&req).await {
            Ok(resp) => resp,
            Err(e) => {
                stats.error(list_name(prefix), &e);
                return None;
            }
        };
        stats.ok("list-page", page_started);
        if revision == 0 {
            revision = resp.header.as_ref().map_or(0, |h| h.revision);
        }
        stats.listed_keys += resp.kvs.len() as u64;
        match resp.kvs.last() {
            Some(last) if resp.more => {
                key = last.key.clone();
                key.push(0);
            }
            _ => break,
        }
    }
    stats.ok(list_name(prefix), started);
    Some(revision)
}

/// Sleeps until `at` or the end of the run; whether the run goes on.
async fn wait_until(at: Instant, end: Instant) -> bool {
    tokio::time::sleep_until(at.min(end)).await;
    running(end)
}

fn running(end: Instant) -> bool {
    !STOP.load(Ordering::Relaxed) && Instant::now() < end
}

/// LISTs of all pods and all nodes in turn, one every `--list-interval` at most.
async fn list_loop(mut kv: Kv, interval: Duration, page_size: i64, end: Instant) -> Stats {
    let mut stats = Stats::default();
    let mut next = Instant::now() + interval;
    for turn in 0u64.. {
        if !wait_until(next, end).await {
            break;
        }
        next = Instant::now().max(next) + interval;
        let prefix = if turn % 2 == 0 { PODS } else { NODES };
        list(&mut kv, prefix, page_size, &mut stats).await;
    }
    stats
}

/// When the last progress request was sent, for the watcher to time its answer.
type ProgressSent = Arc<Mutex<Option<Instant>>>;

/// The watch stream's request side. It stays open until the watcher stops, as clientv3's does:
/// a client that half-closes a watch stream is not what kube-apiserver is.
type SharedSender = Arc<tokio::sync::Mutex<WatchRequestSender>>;

/// Count-only and keys-only ranges per resource, and current-revision reads, each followed by
/// a progress request on the watch stream.
async fn metadata_loop(
    mut kv: Kv,
    opts: KubeOpts,
    sender: SharedSender,
    progress_sent: ProgressSent,
    end: Instant,
) -> Stats {
    let mut stats = Stats::default();
    let start = Instant::now();
    let mut next_count = start + opts.count_interval;
    let mut next_keys = start + opts.keys_only_interval;
    let mut next_progress = start + opts.progress_interval;
    loop {
        let at = next_count.min(next_keys).min(next_progress);
        if !wait_until(at, end).await {
            break;
        }
        let now = Instant::now();
        if now >= next_count {
            next_count = now + opts.count_interval;
            for prefix in [NODES, PODS, EVENTS] {
                let req = RangeRequest {
                    key: prefix.as_bytes().to_vec(),
                    range_end: prefix_end(prefix.as_bytes()),
                    count_only: true,
                    ..Default::default()
                };
                timed_range(&mut kv, &req, "count", &mut stats).await;
            }
        }
        if now >= next_keys {
            next_keys = now + opts.keys_only_interval;
            for prefix in [NODES, PODS, EVENTS] {
                let req = RangeRequest {
                    key: prefix.as_bytes().to_vec(),
                    range_end: prefix_end(prefix.as_bytes()),
                    keys_only: true,
                    ..Default::default()
                };
                timed_range(&mut kv, &req, "keys-only", &mut stats).await;
            }
        }
        if now >= next_progress {
            next_progress = now + opts.progress_interval;
            let req = RangeRequest {
                key: PODS.as_bytes().to_vec(),
                range_end: prefix_end(PODS.as_bytes()),
                limit: 1,
                ..Default::default()
            };
            if timed_range(&mut kv, &req, "current-rev", &mut stats).await {
                *locked(&progress_sent) = Some(Instant::now());
                if let Err(e) = sender.lock().await.request_progress().await {
                    stats.error("progress", &e.to_string());
                }
            }
        }
    }
    stats
}

async fn timed_range(
    kv: &mut Kv,
    req: &RangeRequest,
    name: &'static str,
    stats: &mut Stats,
) -> bool {
    let started = Instant::now();
    match kv.range(req).await {
        Ok(_) => {
            stats.ok(name, started);
            true
        }
        Err(e) => {
            stats.error(name, &e);
            false
        }
    }
}

/// kube-apiserver's compactor: every interval, `Txn If(version(compact_rev_key) == t) Then
/// Put(compact_rev_key, rev) Else Get(compact_rev_key)`; the winner compacts the revision it
/// saw one interval earlier (never on its first turn).
async fn compact_loop(mut kv: Kv, interval: Duration, end: Instant) -> Stats {
    let mut stats = Stats::default();
    let mut compact_time = 0i64;
    let mut rev = 0i64;
    let mut next = Instant::now() + interval;
    while wait_until(next, end).await {
        next += interval;
        let req = TxnRequest {
            compare: vec![Compare {
                result: CompareResult::Equal as i32,
                target: CompareTarget::Version as i32,
                key: COMPACT_REV_KEY.to_vec(),
                range_end: Vec::new(),
                target_union: Some(TargetUnion::Version(compact_time)),
            }],
            success: vec![put_op(COMPACT_REV_KEY, rev.to_string().into_bytes(), 0)],
            failure: vec![get_op(COMPACT_REV_KEY)],
        };
        let started = Instant::now();
        let resp = match kv.txn(&req).await {
            Ok(resp) => resp,
            Err(e) => {
                stats.error("compact-txn", &e);
                continue;
            }
        };
        let current_rev = resp.header.as_ref().map_or(0, |h| h.revision);
        if !resp.succeeded {
            stats.conflict("compact-txn", started);
            let version = resp.responses.first().and_then(|op| match &op.response {
                Some(Response::ResponseRange(range)) => range.kvs.first().map(|kv| kv.version),
                _ => None,
            });
            compact_time = version.unwrap_or(compact_time);
            rev = current_rev;
            continue;
        }
        stats.ok("compact-txn", started);
        compact_time += 1;
        let previous = std::mem::replace(&mut rev, current_rev);
        if previous == 0 {
            continue;
        }
        let started = Instant::now();
        let req = CompactionRequest {
            revision: previous,
            physical: false,
        };
        match call::<_, CompactionResponse>(&mut kv.compact, &req, kv.timeout).await {
            Ok(_) => stats.ok("compact", started),
            Err(e) => stats.error("compact", &e),
        }
    }
    stats
}

/// Counts of what the watch stream delivered.
#[derive(Debug, Default)]
struct WatchCounts {
    puts: u64,
    deletes: u64,
    /// Events of updates and deletes that carried the previous value (`prev_kv`).
    with_prev_kv: u64,
    /// Events of updates and deletes (which should carry it).
    want_prev_kv: u64,
    /// Answers to progress requests (watch id -1).
    progress: u64,
    /// Other responses without events: a watcher's own progress notifications.
    notify: u64,
    errors: Recorder,
}

/// Reads the watch stream until told to stop: events go to [`Acks`], progress answers are
/// timed against the last request.
async fn watch_loop(
    mut stream: WatchResponseStream,
    cluster: Arc<Cluster>,
    progress_sent: ProgressSent,
    mut stop: watch::Receiver<bool>,
) -> (WatchCounts, Recorder) {
    let mut counts = WatchCounts::default();
    let mut progress = Recorder::new();
    loop {
        let msg = tokio::select! {
            _ = stop.wait_for(|s| *s) => break,
            msg = stream.message() => msg,
        };
        let resp = match msg {
            Ok(Some(resp)) => resp,
            Ok(None) => {
                counts.errors.record_error("watch stream closed");
                break;
            }
            Err(e) => {
                counts.errors.record_error(&e.to_string());
                break;
            }
        };
        let now = Instant::now();
        if resp.canceled() {
            counts
                .errors
                .record_error(&format!("watch canceled: {}", resp.cancel_reason()));
            break;
        }
        if resp.created() {
            continue;
        }
        let events = resp.events();
        if events.is_empty() && resp.compact_revision() == 0 {
            // etcd answers a progress request with watch id -1 (clientv3's
            // `InvalidWatchID`); a watcher's periodic notification carries its own id.
            if resp.watch_id() == -1 {
                counts.progress += 1;
                if let Some(sent) = locked(&progress_sent).take() {
                    progress.record(now.saturating_duration_since(sent));
                }
            } else {
                counts.notify += 1;
            }
            continue;
        }
        for ev in events {
            let Some(kv) = ev.kv() else { continue };
            let is_delete = ev.event_type() == etcd_client::EventType::Delete;
            if is_delete {
                counts.deletes += 1;
            } else {
                counts.puts += 1;
            }
            if is_delete || kv.version() > 1 {
                counts.want_prev_kv += 1;
                if ev.prev_kv().is_some() {
                    counts.with_prev_kv += 1;
                }
            }
            cluster.acks.event(kv.mod_revision(), now);
        }
    }
    (counts, progress)
}

/// Opens the watch stream (with `hasleader`) and one watcher per resource from its LIST's
/// revision + 1; returns once all three are created.
async fn open_watch(
    global: &GlobalOpts,
    from: [(&str, i64); 3],
) -> Result<(Client, WatchRequestSender, WatchResponseStream)> {
    let opts = ConnectOptions::new()
        .with_connect_timeout(global.dial_timeout)
        .with_require_leader(true);
    let client = Client::connect(&global.endpoints, Some(opts))
        .await
        .with_context(|| format!("connecting to {}", global.endpoints.join(",")))?;
    let options = |rev: i64| {
        WatchOptions::new()
            .with_prefix()
            .with_start_revision(rev + 1)
            .with_prev_key()
            .with_progress_notify()
    };
    let mut watch_client = client.watch_client().max_decoding_message_size(usize::MAX);
    let (first, rest) = from.split_first().context("no resource to watch")?;
    let stream = watch_client
        .watch(first.0, Some(options(first.1)))
        .await
        .context("opening the watch stream")?;
    let (mut sender, mut responses) = stream.split();
    for (prefix, rev) in rest {
        sender.watch(*prefix, Some(options(*rev))).await?;
    }
    let mut created = 0;
    while created < from.len() {
        let resp = tokio::time::timeout(global.request_timeout, responses.message())
            .await
            .context("creating the watchers timed out")??
            .context("the watch stream closed while creating watchers")?;
        if resp.canceled() {
            bail!("watch create canceled: {}", resp.cancel_reason());
        }
        if resp.created() {
            created += 1;
        }
    }
    Ok((client, sender, responses))
}

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

/// Creates every node and pod, `clients` at a time.
async fn populate(cluster: &Arc<Cluster>, kvs: Vec<Kv>) -> Stats {
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
    let (stop_tx, stop_rx) = watch::channel(false);
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

/// Everything a run measured.
struct Report<'a> {
    opts: &'a KubeOpts,
    elapsed: Duration,
    populate: (Stats, Duration),
    stats: Stats,
    counts: WatchCounts,
    delay: Recorder,
    acked: u64,
    events: u64,
    missing: u64,
}

fn ms(secs: f64) -> f64 {
    (secs * 1e6).round() / 1e3
}

/// count, errors, conflicts, rate, latency of one operation kind.
fn op_json(op: &OpStats, elapsed: Duration) -> Value {
    let s = op.rec.summary("", elapsed);
    json!({
        "count": s.count,
        "errors": s.errors,
        "conflicts": op.conflicts,
        "per_sec": (s.rps * 100.0).round() / 100.0,
        "latency_ms": {
            "p50": ms(op.rec.percentile(50.0)),
            "p99": ms(op.rec.percentile(99.0)),
            "max": ms(s.slowest),
        },
    })
}

impl Report<'_> {
    fn writes(&self) -> OpStats {
        let mut all = OpStats::default();
        for name in WRITES {
            if let Some(op) = self.stats.ops.get(name) {
                all.rec.merge(&op.rec);
                all.conflicts += op.conflicts;
            }
        }
        all
    }

    fn json(&self) -> Value {
        let writes = self.writes();
        let w = writes.rec.summary("", self.elapsed);
        // Conflicting Txns are timed with the rest but are not writes done.
        let done = w.count.saturating_sub(writes.conflicts);
        let secs = self.elapsed.as_secs_f64().max(1e-9);
        let list_op = |name: &str| self.stats.ops.get(name).cloned().unwrap_or_default();
        let (list_pods, list_nodes) = (list_op("list-pods"), list_op("list-nodes"));
        let lists = [&list_pods, &list_nodes]
            .iter()
            .map(|op| op.rec.summary("", self.elapsed).count)
            .sum::<u64>();
        let (populate, populate_secs) = &self.populate;
        let populate_op = populate.ops.get("populate").cloned().unwrap_or_default();
        let p = populate_op.rec.summary("", *populate_secs);
        let ops: serde_json::Map<String, Value> = self
            .stats
            .ops
            .iter()
            .map(|(name, op)| ((*name).to_owned(), op_json(op, self.elapsed)))
            .collect();
        let errors: u64 = self
            .stats
            .ops
            .values()
            .map(|op| op.rec.summary("", self.elapsed).errors)
            .sum::<u64>()
            + p.errors;
        // Every answered request of the run (population included), for CPU per request.
        let requests: u64 = self
            .stats
            .ops
            .iter()
            .filter(|(name, _)| !name.starts_with("list-") || **name == "list-page")
            .map(|(_, op)| op.rec.summary("", self.elapsed).count)
            .sum::<u64>()
            + p.count;
        let mut error_kinds = BTreeMap::new();
        for (name, op) in self.stats.ops.iter().chain(populate.ops.iter()) {
            for (message, n) in op.rec.summary("", self.elapsed).error_kinds {
                error_kinds.insert(format!("{name}: {message}"), n);
            }
        }
        for (message, n) in self.counts.errors.summary("", self.elapsed).error_kinds {
            error_kinds.insert(format!("watch: {message}"), n);
        }
        json!({
            "workload": "kube",
            "nodes": self.opts.nodes,
            "pods": self.opts.nodes * self.opts.pods_per_node,
            "duration_s": (self.elapsed.as_secs_f64() * 1e3).round() / 1e3,
            "populated": p.count,
            "populate_s": (populate_secs.as_secs_f64() * 1e3).round() / 1e3,
            "populate_per_sec": p.rps.round(),
            "offered_writes_per_sec": if self.opts.unpaced {
                Value::Null
            } else {
                json!((offered_writes(&rates(self.opts)) * 100.0).round() / 100.0)
            },
            "writes": done,
            "writes_per_sec": (done as f64 / secs * 100.0).round() / 100.0,
            "write_p50_ms": ms(writes.rec.percentile(50.0)),
            "write_p99_ms": ms(writes.rec.percentile(99.0)),
            "write_max_ms": ms(w.slowest),
            "conflicts": writes.conflicts,
            "errors": errors,
            "requests": requests,
            "lists": lists,
            "list_pods_p50_ms": ms(list_pods.rec.percentile(50.0)),
            "list_pods_p99_ms": ms(list_pods.rec.percentile(99.0)),
            "list_nodes_p50_ms": ms(list_nodes.rec.percentile(50.0)),
            "list_nodes_p99_ms": ms(list_nodes.rec.percentile(99.0)),
            "listed_keys": self.stats.listed_keys,
            "watch_events": self.events,
            "watch_expected": self.acked,
            "watch_missing": self.missing,
            "watch_delay_p50_ms": ms(self.delay.percentile(50.0)),
            "watch_delay_p99_ms": ms(self.delay.percentile(99.0)),
            "watch_delay_max_ms": ms(self.delay.summary("", self.elapsed).slowest),
            "watch_puts": self.counts.puts,
            "watch_deletes": self.counts.deletes,
            "watch_prev_kv": self.counts.with_prev_kv,
            "watch_prev_kv_expected": self.counts.want_prev_kv,
            "watch_progress": self.counts.progress,
            "watch_progress_notify": self.counts.notify,
            "ops": ops,
            "populate": op_json(&populate_op, *populate_secs),
            "error_kinds": error_kinds,
        })
    }

    fn text(&self) -> String {
        let mut s = String::new();
        // Writing to a String cannot fail.
        let _ = self.write_text(&mut s);
        s
    }

    fn write_text(&self, s: &mut String) -> std::fmt::Result {
        let v = self.json();
        writeln!(
            s,
            "kube: {} nodes, {} pods; {} objects created in {:.1} s ({:.0}/s)",
            v["nodes"], v["pods"], v["populated"], v["populate_s"], v["populate_per_sec"]
        )?;
        match v["offered_writes_per_sec"].as_f64() {
            Some(offered) => writeln!(
                s,
                "mix for {:.1} s, {offered} writes offered per s:\n",
                self.elapsed.as_secs_f64()
            )?,
            None => writeln!(s, "mix for {:.1} s, unpaced:\n", self.elapsed.as_secs_f64())?,
        }
        writeln!(
            s,
            "{:<14} {:>9} {:>9} {:>7} {:>9} {:>9} {:>9} {:>9}",
            "operation", "count", "per s", "errors", "conflicts", "p50 ms", "p99 ms", "max ms"
        )?;
        let mut line = |name: &str, op: &Value| {
            writeln!(
                s,
                "{:<14} {:>9} {:>9.2} {:>7} {:>9} {:>9.3} {:>9.3} {:>9.3}",
                name,
                op["count"].as_u64().unwrap_or(0),
                op["per_sec"].as_f64().unwrap_or(0.0),
                op["errors"].as_u64().unwrap_or(0),
                op["conflicts"].as_u64().unwrap_or(0),
                op["latency_ms"]["p50"].as_f64().unwrap_or(0.0),
                op["latency_ms"]["p99"].as_f64().unwrap_or(0.0),
                op["latency_ms"]["max"].as_f64().unwrap_or(0.0),
            )
        };
        line("populate", &v["populate"])?;
        if let Some(ops) = v["ops"].as_object() {
            for (name, op) in ops {
                line(name, op)?;
            }
        }
        writeln!(
            s,
            "\nwrites: {} ({} per s), p50 {} ms, p99 {} ms, max {} ms, {} conflicts",
            v["writes"],
            v["writes_per_sec"],
            v["write_p50_ms"],
            v["write_p99_ms"],
            v["write_max_ms"],
            v["conflicts"]
        )?;
        writeln!(
            s,
            "watch: {} events ({} puts, {} deletes) for {} acknowledged writes, {} missing; \
             delay p50 {} ms, p99 {} ms, max {} ms; prev_kv on {} of {}; {} progress responses, \
             {} progress notifications",
            v["watch_events"],
            v["watch_puts"],
            v["watch_deletes"],
            v["watch_expected"],
            v["watch_missing"],
            v["watch_delay_p50_ms"],
            v["watch_delay_p99_ms"],
            v["watch_delay_max_ms"],
            v["watch_prev_kv"],
            v["watch_prev_kv_expected"],
            v["watch_progress"],
            v["watch_progress_notify"]
        )?;
        if let Some(kinds) = v["error_kinds"].as_object()
            && !kinds.is_empty()
        {
            writeln!(s, "\nerrors:")?;
            for (message, n) in kinds {
                writeln!(s, "  [{n}]\t{message}")?;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_follow_kube_apiserver_layout() {
        assert_eq!(node_key(7), b"/registry/minions/node-00007");
        assert_eq!(pod_key(100, 205, 3), b"/registry/pods/ns-0005/pod-000205-3");
        assert_eq!(
            event_key(10, 0x1f),
            b"/registry/events/ns-0001/event-0000001f"
        );
    }

    #[test]
    fn value_sizes_stay_in_their_ranges() {
        let mut rng = SmallRng::seed_from_u64(1);
        for _ in 0..1000 {
            let n = Resource::Node.value_size(&mut rng);
            assert!((6 * 1024..=MAX_VALUE).contains(&n));
            let p = Resource::Pod.value_size(&mut rng);
            assert!((1024..=MAX_VALUE).contains(&p));
            let e = Resource::Event.value_size(&mut rng);
            assert!((900..=1200).contains(&e));
        }
    }

    #[test]
    fn a_failed_guard_reports_the_revision_it_read() {
        let resp = TxnResponse {
            succeeded: false,
            responses: vec![etcdrs_proto::etcdserverpb::ResponseOp {
                response: Some(Response::ResponseRange(RangeResponse {
                    kvs: vec![etcdrs_proto::mvccpb::KeyValue {
                        mod_revision: 42,
                        ..Default::default()
                    }],
                    ..Default::default()
                })),
            }],
            ..Default::default()
        };
        assert_eq!(guarded(&resp), Guarded::Conflict(Some(42)));
        let gone = TxnResponse {
            succeeded: false,
            responses: vec![etcdrs_proto::etcdserverpb::ResponseOp {
                response: Some(Response::ResponseRange(RangeResponse::default())),
            }],
            ..Default::default()
        };
        assert_eq!(guarded(&gone), Guarded::Conflict(None));
        let ok = TxnResponse {
            succeeded: true,
            header: Some(etcdrs_proto::etcdserverpb::ResponseHeader {
                revision: 9,
                ..Default::default()
            }),
            ..Default::default()
        };
        assert_eq!(guarded(&ok), Guarded::Done(9));
    }

    #[test]
    fn watch_delay_counts_from_the_later_of_ack_and_event() {
        let acks = Acks::default();
        acks.acked(5);
        assert_eq!(acks.waiting(), 1);
        acks.event(5, Instant::now());
        // An event before its acknowledgement is a delay of zero.
        acks.event(6, Instant::now());
        acks.acked(6);
        assert_eq!(acks.waiting(), 0);
        let inner = acks.lock();
        assert_eq!((inner.acked, inner.events), (2, 2));
        assert_eq!(inner.delay.summary("", Duration::from_secs(1)).count, 2);
    }

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
