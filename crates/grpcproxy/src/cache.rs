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
//!
//! Layout: the entries, their bounds and invalidation are here; `watch` runs the watches
//! that invalidate them.

mod watch;

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

use self::watch::{Command, IDENTITY_QUEUE, Identity, WatchContext};

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
}

#[cfg(test)]
mod tests;
