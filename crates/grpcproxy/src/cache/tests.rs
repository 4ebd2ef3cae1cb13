//! The cache's tests: bounds, invalidation (keys, ranges, open ends, floors), identities
//! kept apart, per-entry watches confirming and dropping entries, and the age limit.

use super::watch::refused_for_auth;
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
    let upstream = Upstream::new(&["127.0.0.1:1".to_owned()], None, 4 << 20).expect("an upstream");
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
