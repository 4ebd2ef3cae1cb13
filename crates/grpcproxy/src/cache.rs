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
use etcdrs_proto::etcdserverpb::{RangeRequest, WatchCreateRequest, WatchRequest, watch_request};
use parking_lot::Mutex;
use prost::Message;
use tokio_util::sync::CancellationToken;

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

struct Entry {
    /// The range the entry answers: `[key, end)` as the cluster reads it.
    key: Vec<u8>,
    end: Vec<u8>,
    /// The response as sent to the client: one length-prefixed gRPC message.
    wire: Bytes,
    bytes: usize,
    /// When it was last used (larger is more recent).
    tick: u64,
}

#[derive(Default)]
struct State {
    /// Whether the invalidating watch is established (else nothing is stored or served).
    enabled: bool,
    /// The newest revision whose changes have been applied to the cache.
    floor: i64,
    /// By [`RangeCache::key`]: the identity and the request.
    entries: HashMap<Vec<u8>, Entry>,
    next_tick: u64,
    bytes: usize,
}

impl State {
    fn remove(&mut self, key: &[u8]) {
        if let Some(old) = self.entries.remove(key) {
            self.bytes -= old.bytes;
        }
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
        let before = self.entries.len();
        let mut freed = 0;
        self.entries.retain(|_, e| {
            let keep = !stale(e);
            if !keep {
                freed += e.bytes;
            }
            keep
        });
        if self.entries.len() != before {
            self.bytes -= freed;
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
        if !state.enabled {
            return None;
        }
        let tick = state.next_tick;
        let entry = state.entries.get_mut(key)?;
        entry.tick = tick;
        let wire = entry.wire.clone();
        state.next_tick += 1;
        Some(wire)
    }

    /// Stores `wire` (one gRPC message) as the answer to `req` under `key`, unless a change
    /// newer than `revision` (the response's) has already been seen.
    pub fn put(&self, key: Vec<u8>, req: &RangeRequest, revision: i64, wire: Bytes) {
        let bytes = wire.len() + key.len() + req.key.len() + req.range_end.len();
        if bytes > self.config.max_bytes || self.config.max_entries == 0 {
            return;
        }
        let mut state = self.inner.lock();
        if !state.enabled || revision < state.floor {
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
            },
        );
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

    /// Empties the cache and serves (`enabled`) or bypasses it from now on; `floor` is the
    /// revision from which changes are known.
    fn reset(&self, enabled: bool, floor: i64) {
        let mut state = self.inner.lock();
        state.enabled = enabled;
        state.floor = floor;
        state.entries.clear();
        state.bytes = 0;
        self.metrics.set_cache_keys(0);
    }

    /// The invalidating watch (task `grpc-proxy cache watch`): runs until `shutdown`, reconnecting
    /// to whichever member is current; the cache is enabled only while the watch stands.
    pub async fn run_invalidation(
        self,
        upstream: Upstream,
        ns: Namespace,
        shutdown: CancellationToken,
    ) {
        let (key, end) = ns.range(&[0], &[0]);
        let mut backoff = Duration::from_millis(100);
        loop {
            self.reset(false, 0);
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
                            // Compaction or a permission error: start over.
                            break;
                        }
                        if resp.created {
                            backoff = Duration::from_millis(100);
                            self.reset(true, revision);
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
            self.reset(false, 0);
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
        cache.put(RangeCache::key(token, r), r, rev, wire);
    }

    fn get(cache: &RangeCache, token: &str, r: &RangeRequest) -> Option<Bytes> {
        cache.get(&RangeCache::key(token, r))
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
        let cache = RangeCache::new(CacheConfig::default(), Metrics::new());
        cache.reset(true, 1);
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
        let cache = RangeCache::new(CacheConfig::default(), Metrics::new());
        cache.reset(true, 1);
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
        let cache = RangeCache::new(config, Metrics::new());
        cache.reset(true, 1);
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
        let cache = RangeCache::new(CacheConfig::default(), Metrics::new());
        cache.reset(true, 1);
        put(&cache, "", &req(b"a", b""), 5);
        put(&cache, "", &req(b"b", b""), 5);
        cache.invalidate([b"a".as_slice()], 6);
        cache.invalidate_range(b"b", b"c", 7);
        let state = cache.inner.lock();
        assert_eq!((state.entries.len(), state.bytes), (0, 0));
    }

    #[test]
    fn disabled_cache_serves_nothing() {
        let cache = RangeCache::new(CacheConfig::default(), Metrics::new());
        let r = req(b"k", b"");
        put(&cache, "", &r, 5);
        assert!(get(&cache, "", &r).is_none());
    }
}
