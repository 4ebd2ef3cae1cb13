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
//! - **Open ends**: a `"\0"` range end means "every key from `key` on", and invalidation
//!   treats it so.
//!
//! Only serializable ranges at the current revision are served from here; linearizable
//! ranges always go to the cluster.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::Duration;

use etcdrs_proto::etcdserverpb::watch_client::WatchClient;
use etcdrs_proto::etcdserverpb::{
    RangeRequest, RangeResponse, WatchCreateRequest, WatchRequest, watch_request,
};
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
    response: RangeResponse,
    bytes: usize,
    /// Its place in `recency`.
    tick: u64,
}

#[derive(Default)]
struct State {
    /// Whether the invalidating watch is established (else nothing is stored or served).
    enabled: bool,
    /// The newest revision whose changes have been applied to the cache.
    floor: i64,
    entries: HashMap<(String, Vec<u8>), Entry>,
    /// Least recently used first.
    recency: BTreeMap<u64, (String, Vec<u8>)>,
    next_tick: u64,
    bytes: usize,
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

    /// The cached answer to `req` (already namespaced) for `token`.
    pub fn get(&self, token: &str, req: &RangeRequest) -> Option<RangeResponse> {
        let key = (token.to_owned(), req.encode_to_vec());
        let mut state = self.inner.lock();
        if !state.enabled {
            return None;
        }
        let tick = state.next_tick;
        let old_tick = {
            let entry = state.entries.get_mut(&key)?;
            let old = entry.tick;
            entry.tick = tick;
            old
        };
        state.next_tick += 1;
        state.recency.remove(&old_tick);
        let response = state.entries.get(&key).map(|e| e.response.clone());
        state.recency.insert(tick, key);
        response
    }

    /// Stores `resp` as the answer to `req` for `token`, unless a change newer than it has
    /// already been seen.
    pub fn put(&self, token: &str, req: &RangeRequest, resp: &RangeResponse) {
        let revision = resp.header.as_ref().map_or(0, |h| h.revision);
        let bytes = resp.encoded_len() + req.encoded_len() + token.len();
        if bytes > self.config.max_bytes || self.config.max_entries == 0 {
            return;
        }
        let key = (token.to_owned(), req.encode_to_vec());
        let mut state = self.inner.lock();
        if !state.enabled || revision < state.floor {
            return;
        }
        if let Some(old) = state.entries.remove(&key) {
            state.recency.remove(&old.tick);
            state.bytes -= old.bytes;
        }
        while state.entries.len() >= self.config.max_entries
            || state.bytes + bytes > self.config.max_bytes
        {
            let Some((_, oldest)) = state.recency.pop_first() else {
                break;
            };
            if let Some(old) = state.entries.remove(&oldest) {
                state.bytes -= old.bytes;
            }
        }
        let tick = state.next_tick;
        state.next_tick += 1;
        state.recency.insert(tick, key.clone());
        state.bytes += bytes;
        state.entries.insert(
            key,
            Entry {
                key: req.key.clone(),
                end: req.range_end.clone(),
                response: resp.clone(),
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
        let stale: Vec<(String, Vec<u8>)> = state
            .entries
            .iter()
            .filter(|(_, e)| keys.iter().any(|k| covers(&e.key, &e.end, k)))
            .map(|(k, _)| k.clone())
            .collect();
        for key in stale {
            if let Some(old) = state.entries.remove(&key) {
                state.recency.remove(&old.tick);
                state.bytes -= old.bytes;
            }
        }
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
        let stale: Vec<(String, Vec<u8>)> = state
            .entries
            .iter()
            .filter(|(_, e)| overlaps(e))
            .map(|(k, _)| k.clone())
            .collect();
        for key in stale {
            if let Some(old) = state.entries.remove(&key) {
                state.recency.remove(&old.tick);
                state.bytes -= old.bytes;
            }
        }
        self.metrics.set_cache_keys(state.entries.len());
    }

    /// Empties the cache and serves (`enabled`) or bypasses it from now on; `floor` is the
    /// revision from which changes are known.
    fn reset(&self, enabled: bool, floor: i64) {
        let mut state = self.inner.lock();
        state.enabled = enabled;
        state.floor = floor;
        state.entries.clear();
        state.recency.clear();
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
                r = client.watch(tokio_stream::wrappers::ReceiverStream::new(req_rx)) => r,
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
    use etcdrs_proto::etcdserverpb::ResponseHeader;

    use super::*;

    fn resp(rev: i64) -> RangeResponse {
        RangeResponse {
            header: Some(ResponseHeader {
                revision: rev,
                ..Default::default()
            }),
            ..Default::default()
        }
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
        cache.put("", &r, &resp(5));
        assert!(cache.get("", &r).is_some());
        cache.invalidate([b"a".as_slice()], 6);
        assert!(cache.get("", &r).is_some());
        cache.invalidate([b"zz".as_slice()], 7);
        assert!(cache.get("", &r).is_none());
    }

    #[test]
    fn responses_older_than_an_invalidation_are_not_stored() {
        let cache = RangeCache::new(CacheConfig::default(), Metrics::new());
        cache.reset(true, 1);
        cache.invalidate([b"k".as_slice()], 10);
        let r = req(b"k", b"");
        cache.put("", &r, &resp(9));
        assert!(cache.get("", &r).is_none());
        cache.put("", &r, &resp(10));
        assert!(cache.get("", &r).is_some());
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
        cache.put("alice", &r, &resp(5));
        assert!(cache.get("bob", &r).is_none());
        cache.put("bob", &r, &resp(5));
        cache.put("carol", &r, &resp(5));
        assert!(
            cache.get("alice", &r).is_none(),
            "least recently used went first"
        );
        assert!(cache.get("carol", &r).is_some());
    }

    #[test]
    fn disabled_cache_serves_nothing() {
        let cache = RangeCache::new(CacheConfig::default(), Metrics::new());
        let r = req(b"k", b"");
        cache.put("", &r, &resp(5));
        assert!(cache.get("", &r).is_none());
    }
}
