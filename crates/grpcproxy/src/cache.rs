//! The serializable-range cache (etcd `server/proxy/grpcproxy/cache`), without etcd's defects:
//!
//! - **Never stale.** A watch on the whole (namespaced) keyspace runs against the cluster and
//!   drops every cached range an event touches, so writes made through other proxies or
//!   directly to the cluster are seen, not only writes through this proxy. While that watch is
//!   not established the cache is empty and bypassed. A response is stored only if its revision
//!   is at least the newest invalidation seen (`floor`), so a range read before a concurrent
//!   write cannot be stored after the write's invalidation.
//! - **Keyed by auth identity**: the `token` is part of the key, so one user's permitted read is
//!   never answered to another.
//! - **Under auth without an identity of its own** (password auth, and a proxy with no client
//!   certificate, or one whose user may not watch everything), the keyspace watch is refused.
//!   Then each entry is watched instead, with the token of the client it answered (who may read
//!   the range, so may watch it), from the revision after its answer, so no change in between
//!   is missed ([`Mode::PerEntry`]). An entry is served only once its watch is established, and
//!   dropped at its first event, at the watch's end (an expired token, a compaction, a failed
//!   member) or at its eviction, which cancels the watch. One watch stream per identity (task
//!   `grpc-proxy cache identity watch`), ended when the identity has no entry left.
//! - **Permissions re-checked**: an entry answers for at most [`MAX_AGE`]; then the next read
//!   goes to the cluster, which checks the client's permission again. A permission revoked at
//!   the cluster (which no watch reports) holds through the proxy within that time.
//! - **Bounded** in entries and in bytes (least recently used first out).
//! - **Cheap hits.** An entry holds the response as the client receives it: one gRPC message
//!   (length prefix included), already stripped of the namespace, so a hit is a lookup and a
//!   reference count. Recency is a tick stamped on the entry; the least recently used entry is
//!   found by a scan when a store must evict (stores follow a round trip to the cluster).
//! - **Open ends**: a `"\0"` range end means "every key from `key` on", and invalidation
//!   treats it so.
//!
//! Only serializable ranges at the current revision are served from here; linearizable
//! ranges always go to the cluster.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use etcdrs_proto::etcdserverpb::watch_client::WatchClient;
use etcdrs_proto::etcdserverpb::{
    RangeRequest, WatchCancelRequest, WatchCreateRequest, WatchRequest, WatchResponse,
    watch_request,
};
use etcdrs_proto::rpctypes;
use parking_lot::Mutex;
use prost::Message;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::metrics::Metrics;
use crate::namespace::Namespace;
use crate::upstream::Upstream;

/// Bounds of the cache.
#[derive(Clone, Copy, Debug)]
pub struct CacheConfig {
    /// Most cached ranges (etcd: 2048).
    pub max_entries: usize,
    /// Most bytes of cached responses (encoded size).
    pub max_bytes: usize,
}

impl Default for CacheConfig {
    fn default() -> Self {
        CacheConfig {
            max_entries: 2048,
            max_bytes: 64 << 20,
        }
    }
}

/// The cache. Cheap to clone.
#[derive(Clone)]
pub struct RangeCache {
    inner: Arc<Mutex<State>>,
    metrics: Metrics,
    config: CacheConfig,
}

/// How the cache learns that an answer is out of date.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
enum Mode {
    /// It cannot: nothing is stored or served.
    #[default]
    Off,
    /// The proxy's own watch on the whole keyspace stands.
    Keyspace,
    /// The proxy may not watch the keyspace: each entry is watched with its client's token.
    PerEntry,
}

/// How long an entry answers before a read goes to the cluster again, so that the client's
/// permission to read is checked again.
pub const MAX_AGE: Duration = Duration::from_secs(1);

/// Entries an identity's watch task may have queued for it (creates and cancels); a store that
/// finds the queue full is not made.
const IDENTITY_QUEUE: usize = 64;

struct Entry {
    /// The range the entry answers: `[key, end)` as the cluster reads it.
    key: Vec<u8>,
    end: Vec<u8>,
    /// The response as sent to the client: one length-prefixed gRPC message.
    wire: Bytes,
    bytes: usize,
    /// When it was last used (larger is more recent).
    tick: u64,
    /// When it was stored: it answers until [`MAX_AGE`] after.
    stored: std::time::Instant,
    /// [`Mode::PerEntry`]: the client's token, the identity watch that watches the entry (its
    /// [`Identity::id`]; 0 in [`Mode::Keyspace`]), and the watch once established. Served only
    /// when [`Entry::live`].
    token: String,
    identity: u64,
    watch_id: Option<i64>,
}

impl Entry {
    /// Whether the entry may be served: the keyspace watch covers it, or its own watch stands.
    fn live(&self) -> bool {
        self.identity == 0 || self.watch_id.is_some()
    }
}

/// An identity's watch task, as the cache sees it.
struct Identity {
    /// Requests to the task.
    tx: mpsc::Sender<Command>,
    /// Tells this task from a later one of the same token.
    id: u64,
    /// Entries watched by the task; the task ends when there are none.
    entries: usize,
}

/// A request to an identity's watch task.
#[derive(Debug)]
enum Command {
    /// Watch `[key, end)` from revision `from` for the entry under cache key `entry`.
    Watch {
        entry: Vec<u8>,
        key: Vec<u8>,
        end: Vec<u8>,
        from: i64,
    },
    /// The entry is gone: cancel its watch.
    Cancel(i64),
}

/// What identity watch tasks need: set once the invalidation task runs.
#[derive(Clone)]
struct WatchContext {
    upstream: Upstream,
    tasks: TaskTracker,
    shutdown: CancellationToken,
}

#[derive(Default)]
struct State {
    /// How changes are learned (`Off`: nothing is stored or served).
    mode: Mode,
    /// The newest revision whose changes have been applied to the cache.
    floor: i64,
    /// By [`RangeCache::key`]: the identity and the request.
    entries: HashMap<Vec<u8>, Entry>,
    next_tick: u64,
    bytes: usize,
    /// [`Mode::PerEntry`]: the watch task of each token that has entries.
    identities: HashMap<String, Identity>,
    next_identity: u64,
    context: Option<WatchContext>,
}

impl State {
    fn remove(&mut self, key: &[u8]) {
        if let Some(old) = self.entries.remove(key) {
            self.bytes -= old.bytes;
            self.release(&old);
        }
    }

    /// The entry `e` is gone: its watch is cancelled, and an identity left with no entry is
    /// forgotten (its task ends when it sees its queue closed).
    fn release(&mut self, e: &Entry) {
        if e.identity == 0 {
            return;
        }
        let Some(identity) = self.identities.get_mut(&e.token) else {
            return;
        };
        if identity.id != e.identity {
            return;
        }
        if let Some(id) = e.watch_id {
            // A full queue leaves the watch to the task: an event for an unknown watch
            // cancels it there.
            let _ = identity.tx.try_send(Command::Cancel(id));
        }
        identity.entries -= 1;
        if identity.entries == 0 {
            self.identities.remove(&e.token);
        }
    }

    /// Empties the cache and learns of changes by `mode` from now on.
    fn clear(&mut self, mode: Mode, floor: i64) {
        self.mode = mode;
        self.floor = floor;
        self.entries.clear();
        self.bytes = 0;
        self.identities.clear();
    }

    /// Drops the least recently used entry; false when there is none.
    fn evict_one(&mut self) -> bool {
        let oldest = self
            .entries
            .iter()
            .min_by_key(|(_, e)| e.tick)
            .map(|(k, _)| k.clone());
        match oldest {
            Some(key) => {
                self.remove(&key);
                true
            }
            None => false,
        }
    }

    /// Drops every entry `stale` says is stale.
    fn remove_where(&mut self, stale: impl Fn(&Entry) -> bool) {
        let keys: Vec<Vec<u8>> = self
            .entries
            .iter()
            .filter(|(_, e)| stale(e))
            .map(|(k, _)| k.clone())
            .collect();
        for key in keys {
            self.remove(&key);
        }
    }
}

/// Whether a watch was refused for want of an identity or a permission (the proxy's own
/// keyspace watch under auth; an identity's watch whose token expired).
fn refused_for_auth(reason: &str) -> bool {
    [
        &rpctypes::USER_EMPTY,
        &rpctypes::PERMISSION_DENIED,
        &rpctypes::INVALID_AUTH_TOKEN,
        &rpctypes::AUTH_OLD_REVISION,
    ]
    .iter()
    .any(|e| reason.contains(e.message))
}

/// An identity watch task's own books.
#[derive(Default)]
struct IdentityWatches {
    /// Entries whose watch is requested, in order: a member answers creates in order.
    pending: std::collections::VecDeque<Vec<u8>>,
    /// Entries by established watch.
    watched: HashMap<i64, Vec<u8>>,
}

impl IdentityWatches {
    /// Sends `command` on the stream; false when the stream's queue is full or closed.
    fn forward(&mut self, command: Command, req_tx: &mpsc::Sender<WatchRequest>) -> bool {
        let union = match command {
            Command::Watch {
                entry,
                key,
                end,
                from,
            } => {
                self.pending.push_back(entry);
                watch_request::RequestUnion::CreateRequest(WatchCreateRequest {
                    key,
                    range_end: end,
                    start_revision: from,
                    ..Default::default()
                })
            }
            Command::Cancel(watch_id) => {
                self.watched.remove(&watch_id);
                watch_request::RequestUnion::CancelRequest(WatchCancelRequest { watch_id })
            }
        };
        req_tx
            .try_send(WatchRequest {
                request_union: Some(union),
            })
            .is_ok()
    }

    /// Applies one response of the stream to `cache`; false when the stream must end.
    fn answer(
        &mut self,
        cache: &RangeCache,
        identity: u64,
        resp: WatchResponse,
        req_tx: &mpsc::Sender<WatchRequest>,
    ) -> bool {
        if resp.created {
            let Some(entry) = self.pending.pop_front() else {
                return false;
            };
            if resp.canceled {
                // Refused (the token expired, or no permission): the entry goes.
                cache.drop_watched(&entry, identity);
            } else if cache.confirm(&entry, identity, resp.watch_id) {
                self.watched.insert(resp.watch_id, entry);
            } else {
                // Gone while its watch was being made.
                return self.forward(Command::Cancel(resp.watch_id), req_tx);
            }
            return true;
        }
        let entry = self.watched.remove(&resp.watch_id);
        if resp.canceled {
            if let Some(entry) = entry {
                cache.drop_watched(&entry, identity);
            }
            return true;
        }
        // A change (or a progress report, which carries no events): any change ends the entry
        // and its watch.
        if resp.events.is_empty() && resp.compact_revision == 0 {
            if let Some(entry) = entry {
                self.watched.insert(resp.watch_id, entry);
            }
            return true;
        }
        if let Some(entry) = entry {
            cache.drop_watched(&entry, identity);
        }
        self.forward(Command::Cancel(resp.watch_id), req_tx)
    }
}

/// Whether `key` is in `[start, end)` as etcd reads ranges (empty end: one key; `"\0"`: open).
fn covers(start: &[u8], end: &[u8], key: &[u8]) -> bool {
    if end.is_empty() {
        return key == start;
    }
    if end == [0] {
        return key >= start;
    }
    key >= start && key < end
}

impl RangeCache {
    /// An empty, disabled cache.
    pub fn new(config: CacheConfig, metrics: Metrics) -> RangeCache {
        RangeCache {
            inner: Arc::new(Mutex::new(State::default())),
            metrics,
            config,
        }
    }

    /// Whether `req` may be answered from the cache.
    pub fn cacheable(req: &RangeRequest) -> bool {
        req.serializable && req.revision == 0
    }

    /// The cache key of `req` (already namespaced) for `token`: the token's length, the
    /// token, then the request's encoding, so no two (token, request) pairs share a key.
    pub fn key(token: &str, req: &RangeRequest) -> Vec<u8> {
        let mut key = Vec::with_capacity(4 + token.len() + req.encoded_len());
        key.extend_from_slice(&(token.len() as u32).to_le_bytes());
        key.extend_from_slice(token.as_bytes());
        req.encode_raw(&mut key);
        key
    }

    /// The cached response (one gRPC message, as the client receives it) under `key`.
    pub fn get(&self, key: &[u8]) -> Option<Bytes> {
        let mut state = self.inner.lock();
        if state.mode == Mode::Off {
            return None;
        }
        let tick = state.next_tick;
        let entry = state.entries.get_mut(key)?;
        if !entry.live() {
            return None;
        }
        if entry.stored.elapsed() <= MAX_AGE {
            entry.tick = tick;
            let wire = entry.wire.clone();
            state.next_tick += 1;
            return Some(wire);
        }
        // Too old: the client's permission is checked again by the cluster.
        state.remove(key);
        self.metrics.set_cache_keys(state.entries.len());
        None
    }

    /// Stores `wire` (one gRPC message) as the answer to `req` under `key` for the client
    /// whose auth token is `token`, unless a change newer than `revision` (the response's) has
    /// already been seen.
    pub fn put(&self, token: &str, key: Vec<u8>, req: &RangeRequest, revision: i64, wire: Bytes) {
        let bytes = wire.len() + key.len() + req.key.len() + req.range_end.len();
        if bytes > self.config.max_bytes || self.config.max_entries == 0 {
            return;
        }
        let mut state = self.inner.lock();
        if state.mode == Mode::Off || revision < state.floor {
            return;
        }
        state.remove(&key);
        while state.entries.len() >= self.config.max_entries
            || state.bytes + bytes > self.config.max_bytes
        {
            if !state.evict_one() {
                break;
            }
        }
        let mut spawn = None;
        let identity = match state.mode {
            Mode::PerEntry => {
                let Some(context) = state.context.clone() else {
                    return;
                };
                // A task that has ended (its stream broke) takes what it watched with it.
                if let Some(ended) = state
                    .identities
                    .get(token)
                    .filter(|i| i.tx.is_closed())
                    .map(|i| i.id)
                {
                    state.remove_where(|e| e.identity == ended);
                    state.identities.remove(token);
                }
                if !state.identities.contains_key(token) {
                    let (tx, rx) = mpsc::channel(IDENTITY_QUEUE);
                    state.next_identity += 1;
                    let id = state.next_identity;
                    let identity = Identity { tx, id, entries: 0 };
                    state.identities.insert(token.to_owned(), identity);
                    spawn = Some((context, id, rx));
                }
                let Some(identity) = state.identities.get_mut(token) else {
                    return;
                };
                let watch = Command::Watch {
                    entry: key.clone(),
                    key: req.key.clone(),
                    end: req.range_end.clone(),
                    from: revision + 1,
                };
                if identity.tx.try_send(watch).is_err() {
                    if identity.entries == 0 {
                        state.identities.remove(token);
                    }
                    return;
                }
                identity.entries += 1;
                identity.id
            }
            _ => 0,
        };
        let tick = state.next_tick;
        state.next_tick += 1;
        state.bytes += bytes;
        state.entries.insert(
            key,
            Entry {
                key: req.key.clone(),
                end: req.range_end.clone(),
                wire,
                bytes,
                tick,
                stored: std::time::Instant::now(),
                token: token.to_owned(),
                identity,
                watch_id: None,
            },
        );
        self.metrics.set_cache_keys(state.entries.len());
        drop(state);
        if let Some((context, id, rx)) = spawn {
            // Task `grpc-proxy cache identity watch`: watches this token's entries.
            context.tasks.spawn(self.clone().identity_watch(
                token.to_owned(),
                id,
                rx,
                context.clone(),
            ));
        }
    }

    /// The watch of the entry under `key` (watched by identity task `identity`) is established
    /// as `watch_id`: the entry may be served. False when the entry is gone (the caller then
    /// cancels the watch).
    fn confirm(&self, key: &[u8], identity: u64, watch_id: i64) -> bool {
        let mut state = self.inner.lock();
        match state.entries.get_mut(key) {
            Some(e) if e.identity == identity && e.watch_id.is_none() => {
                e.watch_id = Some(watch_id);
                true
            }
            _ => false,
        }
    }

    /// Drops the entry under `key` if identity task `identity` watches it (its watch saw a
    /// change or ended).
    fn drop_watched(&self, key: &[u8], identity: u64) {
        let mut state = self.inner.lock();
        match state.entries.get_mut(key) {
            // Its watch is already gone: nothing to cancel.
            Some(e) if e.identity == identity => e.watch_id = None,
            _ => return,
        }
        state.remove(key);
        self.metrics.set_cache_keys(state.entries.len());
    }

    /// Identity task `identity` of `token` ended: every entry it watched goes.
    fn identity_ended(&self, token: &str, identity: u64) {
        let mut state = self.inner.lock();
        state.remove_where(|e| e.identity == identity);
        if state
            .identities
            .get(token)
            .is_some_and(|i| i.id == identity)
        {
            state.identities.remove(token);
        }
        self.metrics.set_cache_keys(state.entries.len());
    }

    /// Drops every entry whose range holds one of `keys`; `revision` is the change's revision.
    pub fn invalidate<'a>(&self, keys: impl IntoIterator<Item = &'a [u8]>, revision: i64) {
        let mut state = self.inner.lock();
        state.floor = state.floor.max(revision);
        let keys: Vec<&[u8]> = keys.into_iter().collect();
        if keys.is_empty() || state.entries.is_empty() {
            return;
        }
        state.remove_where(|e| keys.iter().any(|k| covers(&e.key, &e.end, k)));
        self.metrics.set_cache_keys(state.entries.len());
    }

    /// Drops every entry whose range overlaps `[start, end)` (a delete range through the
    /// proxy, whose deleted keys are not all known).
    pub fn invalidate_range(&self, start: &[u8], end: &[u8], revision: i64) {
        let mut state = self.inner.lock();
        state.floor = state.floor.max(revision);
        let overlaps = |e: &Entry| {
            if end.is_empty() {
                return covers(&e.key, &e.end, start);
            }
            if e.end.is_empty() {
                return covers(start, end, &e.key);
            }
            // Two ranges overlap unless one ends before the other starts.
            let e_before = e.end != [0] && e.end.as_slice() <= start;
            let before_e = end != [0] && end <= e.key.as_slice();
            !(e_before || before_e)
        };
        state.remove_where(overlaps);
        self.metrics.set_cache_keys(state.entries.len());
    }

    /// Empties the cache and learns of changes by `mode` from now on; `floor` is the revision
    /// from which changes are known.
    fn reset(&self, mode: Mode, floor: i64) {
        self.inner.lock().clear(mode, floor);
        self.metrics.set_cache_keys(0);
    }

    /// The keyspace watch was refused for auth: entries are watched one by one from now on
    /// (kept as they are if that was already so).
    fn per_entry(&self) {
        let mut state = self.inner.lock();
        if state.mode != Mode::PerEntry {
            state.clear(Mode::PerEntry, 0);
            self.metrics.set_cache_keys(0);
        }
    }

    /// The keyspace watch is gone: a cache that relied on it stops.
    fn keyspace_lost(&self) {
        let mut state = self.inner.lock();
        if state.mode == Mode::Keyspace {
            state.clear(Mode::Off, 0);
            self.metrics.set_cache_keys(0);
        }
    }

    /// Task `grpc-proxy cache identity watch`: one watch stream with `token`, on which each
    /// entry the cache hands over is watched; ends when the cache forgets the identity (no
    /// entry left) or the stream ends, dropping every entry it watched.
    async fn identity_watch(
        self,
        token: String,
        identity: u64,
        mut commands: mpsc::Receiver<Command>,
        context: WatchContext,
    ) {
        let upstream = &context.upstream;
        let (idx, channel) = upstream.current();
        // As bounded as the command queue it drains: a full one ends the task.
        let (req_tx, req_rx) = mpsc::channel::<WatchRequest>(IDENTITY_QUEUE);
        let request = crate::leader::require_leader(crate::upstream::with_token(
            &token,
            tokio_stream::wrappers::ReceiverStream::new(req_rx),
        ));
        let mut client =
            WatchClient::new(channel).max_decoding_message_size(upstream.max_decoding());
        let mut watches = IdentityWatches::default();
        // Requests made before the stream opens wait in `req_tx`'s queue.
        let mut ok = true;
        while let Ok(command) = commands.try_recv() {
            ok &= watches.forward(command, &req_tx);
        }
        if !ok {
            commands.close();
            self.identity_ended(&token, identity);
            return;
        }
        let opened = tokio::select! {
            _ = context.shutdown.cancelled() => return,
            r = client.watch(request) => r,
        };
        let mut stream = match opened {
            Ok(resp) => resp.into_inner(),
            Err(status) => {
                if crate::upstream::failover(&status) {
                    upstream.failed(idx);
                }
                commands.close();
                self.identity_ended(&token, identity);
                return;
            }
        };
        loop {
            tokio::select! {
                _ = context.shutdown.cancelled() => return,
                command = commands.recv() => {
                    let Some(command) = command else { break };
                    if !watches.forward(command, &req_tx) {
                        break;
                    }
                }
                message = stream.message() => {
                    let Ok(Some(resp)) = message else { break };
                    if !watches.answer(&self, identity, resp, &req_tx) {
                        break;
                    }
                }
            }
        }
        // Closed first: a store made from now on sees the task gone and starts another.
        commands.close();
        self.identity_ended(&token, identity);
    }

    /// The invalidating watch (task `grpc-proxy cache watch`): runs until `shutdown`, reconnecting
    /// to whichever member is current; the cache is enabled only while the watch stands.
    pub async fn run_invalidation(
        self,
        upstream: Upstream,
        ns: Namespace,
        tasks: TaskTracker,
        shutdown: CancellationToken,
    ) {
        self.inner.lock().context = Some(WatchContext {
            upstream: upstream.clone(),
            tasks,
            shutdown: shutdown.clone(),
        });
        let (key, end) = ns.range(&[0], &[0]);
        let mut backoff = Duration::from_millis(100);
        loop {
            self.keyspace_lost();
            let (idx, channel) = upstream.current();
            let (req_tx, req_rx) = tokio::sync::mpsc::channel::<WatchRequest>(1);
            let create = WatchRequest {
                request_union: Some(watch_request::RequestUnion::CreateRequest(
                    WatchCreateRequest {
                        key: key.clone(),
                        range_end: end.clone(),
                        ..Default::default()
                    },
                )),
            };
            let _ = req_tx.try_send(create);
            let mut client =
                WatchClient::new(channel).max_decoding_message_size(upstream.max_decoding());
            let opened = tokio::select! {
                _ = shutdown.cancelled() => return,
                // With a leader: a member cut off from its cluster ends the watch, so the cache
                // does not keep serving what that member last saw.
                r = client.watch(crate::leader::require_leader(tonic::Request::new(
                    tokio_stream::wrappers::ReceiverStream::new(req_rx),
                ))) => r,
            };
            let mut stream = match opened {
                Ok(resp) => resp.into_inner(),
                Err(status) => {
                    if crate::upstream::failover(&status) {
                        upstream.failed(idx);
                    }
                    if refused_for_auth(status.message()) {
                        self.per_entry();
                    }
                    tokio::select! {
                        _ = shutdown.cancelled() => return,
                        _ = tokio::time::sleep(backoff) => {}
                    }
                    backoff = (backoff * 2).min(Duration::from_secs(5));
                    continue;
                }
            };
            loop {
                let message = tokio::select! {
                    _ = shutdown.cancelled() => return,
                    m = stream.message() => m,
                };
                match message {
                    Ok(Some(resp)) => {
                        let revision = resp.header.as_ref().map_or(0, |h| h.revision);
                        if resp.canceled {
                            // Refused for auth: entries are watched one by one (and the
                            // keyspace watch is tried again now and then, in case an identity
                            // appears). Else a compaction: start over.
                            if refused_for_auth(&resp.cancel_reason) {
                                self.per_entry();
                            }
                            break;
                        }
                        if resp.created {
                            backoff = Duration::from_millis(100);
                            self.reset(Mode::Keyspace, revision);
                            continue;
                        }
                        let keys = resp
                            .events
                            .iter()
                            .filter_map(|e| e.kv.as_ref().map(|kv| kv.key.as_slice()));
                        self.invalidate(keys, revision);
                    }
                    Ok(None) => break,
                    Err(status) => {
                        if crate::upstream::failover(&status) {
                            upstream.failed(idx);
                        }
                        break;
                    }
                }
            }
            drop(req_tx);
            self.keyspace_lost();
            tokio::select! {
                _ = shutdown.cancelled() => return,
                _ = tokio::time::sleep(backoff) => {}
            }
            backoff = (backoff * 2).min(Duration::from_secs(5));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Stores a response of revision `rev` for (`token`, `r`).
    fn put(cache: &RangeCache, token: &str, r: &RangeRequest, rev: i64) {
        let wire = Bytes::from(format!("rev {rev}"));
        cache.put(token, RangeCache::key(token, r), r, rev, wire);
    }

    fn get(cache: &RangeCache, token: &str, r: &RangeRequest) -> Option<Bytes> {
        cache.get(&RangeCache::key(token, r))
    }

    /// A cache learning of changes from the keyspace watch (revision 1 on).
    fn keyspace_cache(config: CacheConfig) -> RangeCache {
        let cache = RangeCache::new(config, Metrics::new());
        cache.reset(Mode::Keyspace, 1);
        cache
    }

    fn req(key: &[u8], end: &[u8]) -> RangeRequest {
        RangeRequest {
            key: key.to_vec(),
            range_end: end.to_vec(),
            serializable: true,
            ..Default::default()
        }
    }

    #[test]
    fn open_ended_ranges_are_invalidated_by_keys_above_start() {
        let cache = keyspace_cache(CacheConfig::default());
        let r = req(b"b", b"\0");
        put(&cache, "", &r, 5);
        assert!(get(&cache, "", &r).is_some());
        cache.invalidate([b"a".as_slice()], 6);
        assert!(get(&cache, "", &r).is_some());
        cache.invalidate([b"zz".as_slice()], 7);
        assert!(get(&cache, "", &r).is_none());
    }

    #[test]
    fn responses_older_than_an_invalidation_are_not_stored() {
        let cache = keyspace_cache(CacheConfig::default());
        cache.invalidate([b"k".as_slice()], 10);
        let r = req(b"k", b"");
        put(&cache, "", &r, 9);
        assert!(get(&cache, "", &r).is_none());
        put(&cache, "", &r, 10);
        assert_eq!(get(&cache, "", &r), Some(Bytes::from("rev 10")));
    }

    #[test]
    fn identities_do_not_share_entries_and_bounds_hold() {
        let config = CacheConfig {
            max_entries: 2,
            max_bytes: 1 << 20,
        };
        let cache = keyspace_cache(config);
        let r = req(b"k", b"");
        put(&cache, "alice", &r, 5);
        assert!(get(&cache, "bob", &r).is_none());
        put(&cache, "bob", &r, 5);
        put(&cache, "carol", &r, 5);
        assert!(
            get(&cache, "alice", &r).is_none(),
            "least recently used went first"
        );
        assert!(get(&cache, "carol", &r).is_some());
    }

    #[test]
    fn invalidation_frees_bytes() {
        let cache = keyspace_cache(CacheConfig::default());
        put(&cache, "", &req(b"a", b""), 5);
        put(&cache, "", &req(b"b", b""), 5);
        cache.invalidate([b"a".as_slice()], 6);
        cache.invalidate_range(b"b", b"c", 7);
        let state = cache.inner.lock();
        assert_eq!((state.entries.len(), state.bytes), (0, 0));
    }

    /// A per-entry cache whose identity tasks stop at once (shutdown already requested), so
    /// the test plays the member's part by hand.
    fn per_entry_cache() -> RangeCache {
        let cache = RangeCache::new(CacheConfig::default(), Metrics::new());
        let shutdown = CancellationToken::new();
        shutdown.cancel();
        let upstream =
            Upstream::new(&["127.0.0.1:1".to_owned()], None, 4 << 20).expect("an upstream");
        cache.inner.lock().context = Some(WatchContext {
            upstream,
            tasks: TaskTracker::new(),
            shutdown,
        });
        cache.per_entry();
        cache
    }

    fn identity_of(cache: &RangeCache, key: &[u8]) -> u64 {
        cache
            .inner
            .lock()
            .entries
            .get(key)
            .map_or(0, |e| e.identity)
    }

    #[tokio::test]
    async fn per_entry_answers_wait_for_their_watch_and_go_with_it() {
        let cache = per_entry_cache();
        let r = req(b"k", b"");
        let key = RangeCache::key("alice", &r);
        put(&cache, "alice", &r, 5);
        assert!(
            get(&cache, "alice", &r).is_none(),
            "not before its watch stands"
        );
        let identity = identity_of(&cache, &key);
        assert_ne!(identity, 0);
        assert!(cache.confirm(&key, identity, 7));
        assert!(!cache.confirm(&key, identity, 8), "confirmed once");
        assert_eq!(get(&cache, "alice", &r), Some(Bytes::from("rev 5")));
        assert!(get(&cache, "bob", &r).is_none());

        // Its watch saw a change: the entry goes, and its identity with it.
        cache.drop_watched(&key, identity);
        assert!(get(&cache, "alice", &r).is_none());
        assert!(cache.inner.lock().identities.is_empty());

        // A write through the proxy drops a live entry too. The identity was forgotten with
        // its last entry, so the next store starts another.
        put(&cache, "alice", &r, 9);
        let again = identity_of(&cache, &key);
        assert_ne!(again, identity);
        assert!(cache.confirm(&key, again, 11));
        cache.invalidate([b"k".as_slice()], 12);
        assert!(get(&cache, "alice", &r).is_none());
        let state = cache.inner.lock();
        assert_eq!((state.entries.len(), state.bytes), (0, 0));
        assert!(state.identities.is_empty());
    }

    #[tokio::test]
    async fn an_ended_identity_takes_its_entries_and_no_other() {
        let cache = per_entry_cache();
        let (a, b) = (req(b"a", b""), req(b"b", b""));
        put(&cache, "alice", &a, 5);
        put(&cache, "bob", &b, 5);
        let alice = identity_of(&cache, &RangeCache::key("alice", &a));
        let bob = identity_of(&cache, &RangeCache::key("bob", &b));
        assert!(cache.confirm(&RangeCache::key("bob", &b), bob, 1));
        cache.identity_ended("alice", alice);
        assert!(get(&cache, "bob", &b).is_some());
        let state = cache.inner.lock();
        assert_eq!(state.entries.len(), 1);
        assert!(state.identities.contains_key("bob") && !state.identities.contains_key("alice"));
    }

    #[test]
    fn entries_answer_for_max_age_only() {
        let cache = keyspace_cache(CacheConfig::default());
        let r = req(b"k", b"");
        put(&cache, "alice", &r, 5);
        assert!(get(&cache, "alice", &r).is_some());
        if let Some(e) = cache.inner.lock().entries.values_mut().next() {
            e.stored = e
                .stored
                .checked_sub(MAX_AGE + Duration::from_millis(1))
                .expect("an instant a second ago");
        }
        assert!(get(&cache, "alice", &r).is_none());
        let state = cache.inner.lock();
        assert_eq!((state.entries.len(), state.bytes), (0, 0));
    }

    #[test]
    fn auth_refusals_are_told_from_other_cancels() {
        assert!(refused_for_auth("etcdserver: user name is empty"));
        assert!(refused_for_auth("rpc error: etcdserver: permission denied"));
        assert!(!refused_for_auth(
            "etcdserver: mvcc: required revision has been compacted"
        ));
    }

    #[test]
    fn disabled_cache_serves_nothing() {
        let cache = RangeCache::new(CacheConfig::default(), Metrics::new());
        let r = req(b"k", b"");
        put(&cache, "", &r, 5);
        assert!(get(&cache, "", &r).is_none());
    }
}
