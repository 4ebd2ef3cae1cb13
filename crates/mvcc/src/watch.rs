//! Watchers and event delivery (etcd `server/storage/mvcc/watchable_store.go`).
//!
//! The [`WatchHub`] keeps every watcher in one of two groups:
//! - *synced* watchers have received every event up to the last revision the hub was told
//!   about ([`WatchHub::notify`], called by the one writer after each commit) and get new
//!   events as they are committed;
//! - *unsynced* watchers are behind: they asked for history, or their stream's buffer was full
//!   when an event came. [`WatchHub::sync_round`] catches them up from the store's history,
//!   a bounded slice at a time, and moves them to synced once they reach the head.
//!
//! Delivery never blocks the writer: each watch stream has one bounded channel and the hub
//! only `try_send`s into it. A watcher whose channel is full becomes unsynced and is caught up
//! later from history (etcd's victims), or canceled with the compacted revision if that
//! history is gone. Every event reaches a watcher exactly once and in revision order.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};

use bytes::Bytes;
use etcdrs_proto::mvccpb::{Event, KeyValue, event::EventType};
use parking_lot::Mutex;
use prost::Message;
use tokio::sync::mpsc;

use crate::Result;
use crate::kvstore::KvStore;

/// A watch id, unique within its stream.
pub type WatchId = i64;

/// Identifies a watch stream (one gRPC Watch call).
pub type StreamId = u64;

/// Most revisions a catch-up reads in one round (etcd's `watchBatchMaxRevs`).
pub const MAX_REVS_PER_SYNC: i64 = 1000;
/// Most unsynced watchers handled in one round (etcd's `maxWatchersPerSync`).
pub const MAX_WATCHERS_PER_SYNC: usize = 512;

/// One committed event as the hub hands it to watchers: one copy shared by every watcher that
/// gets it, encoded (by [`SharedEvent::encoded`]) at most once without and once with its
/// previous value, however many watchers it goes to.
#[derive(Debug)]
pub struct SharedEvent {
    event: Event,
    encoded: OnceLock<Bytes>,
    with_prev: OnceLock<Bytes>,
}

impl SharedEvent {
    /// Shares `event`.
    pub fn new(event: Event) -> Arc<SharedEvent> {
        Arc::new(SharedEvent {
            event,
            encoded: OnceLock::new(),
            with_prev: OnceLock::new(),
        })
    }

    /// The event.
    pub fn event(&self) -> &Event {
        &self.event
    }

    /// The event encoded as an `mvccpb.Event`.
    pub fn encoded(&self) -> Bytes {
        self.encoded
            .get_or_init(|| Bytes::from(self.event.encode_to_vec()))
            .clone()
    }

    /// The event encoded with `prev_kv` filled by `prev` (called at most once per event).
    pub fn encoded_with_prev(&self, prev: impl FnOnce(&Event) -> Option<KeyValue>) -> Bytes {
        self.with_prev
            .get_or_init(|| {
                let mut event = self.event.clone();
                event.prev_kv = prev(&event);
                Bytes::from(event.encode_to_vec())
            })
            .clone()
    }
}

/// What a watcher's stream receives from the hub.
#[derive(Debug)]
pub enum HubMsg {
    /// Events for one watcher, in revision order.
    Events {
        /// The watcher.
        watch_id: WatchId,
        /// The events, shared with the other watchers that get them.
        events: Vec<Arc<SharedEvent>>,
        /// The store revision the batch brings the watcher to.
        revision: i64,
        /// Counts the events as pending until the message is dropped.
        pending: crate::metrics::Pending,
    },
    /// The watcher asked for history that compaction removed; it is canceled.
    Compacted {
        /// The watcher.
        watch_id: WatchId,
        /// The store's compacted revision.
        compact_revision: i64,
    },
}

/// Which keys a watcher follows, in etcd's encoding.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WatchRange {
    /// First key.
    pub key: Vec<u8>,
    /// Empty: just `key`; `[0]`: every key >= `key`; otherwise `[key, end)`.
    pub end: Vec<u8>,
}

impl WatchRange {
    /// Whether the range holds `key`.
    pub fn contains(&self, key: &[u8]) -> bool {
        if self.end.is_empty() {
            return key == self.key.as_slice();
        }
        key >= self.key.as_slice() && (self.end == [0] || key < self.end.as_slice())
    }

    /// Whether the range is empty (etcd refuses such a watch).
    pub fn is_empty_range(&self) -> bool {
        !self.end.is_empty() && self.end != [0] && self.end.as_slice() <= self.key.as_slice()
    }
}

/// How a watcher filters events.
#[derive(Clone, Copy, Debug, Default)]
pub struct Filters {
    /// Drop put events.
    pub no_put: bool,
    /// Drop delete events.
    pub no_delete: bool,
}

struct Watcher {
    range: WatchRange,
    filters: Filters,
    /// The lowest revision not yet delivered.
    next_rev: i64,
    tx: mpsc::Sender<HubMsg>,
}

impl Watcher {
    fn wants(&self, event: &Event) -> bool {
        let Some(kv) = &event.kv else { return false };
        if kv.mod_revision < self.next_rev || !self.range.contains(&kv.key) {
            return false;
        }
        let is_put = event.r#type == EventType::Put as i32;
        !(is_put && self.filters.no_put || !is_put && self.filters.no_delete)
    }
}

type Key = (StreamId, WatchId);

/// The synced watchers, indexed the way events find them (etcd's watcher groups): a
/// single-key watcher by its key, so an event looks at the watchers of its own key only;
/// range and prefix watchers in a set that every event looks through.
#[derive(Default)]
struct Synced {
    watchers: HashMap<Key, Watcher>,
    by_key: HashMap<Vec<u8>, HashSet<Key>>,
    ranged: HashSet<Key>,
}

impl Synced {
    fn insert(&mut self, key: Key, watcher: Watcher) {
        // A watch id reused within its stream replaces the old watcher and its index entry.
        self.remove(&key);
        if watcher.range.end.is_empty() {
            self.by_key
                .entry(watcher.range.key.clone())
                .or_default()
                .insert(key);
        } else {
            self.ranged.insert(key);
        }
        self.watchers.insert(key, watcher);
    }

    fn unindex(&mut self, key: Key, range: &WatchRange) {
        if range.end.is_empty() {
            if let Some(keys) = self.by_key.get_mut(&range.key) {
                keys.remove(&key);
                if keys.is_empty() {
                    self.by_key.remove(&range.key);
                }
            }
        } else {
            self.ranged.remove(&key);
        }
    }

    fn remove(&mut self, key: &Key) -> Option<Watcher> {
        let watcher = self.watchers.remove(key)?;
        self.unindex(*key, &watcher.range);
        Some(watcher)
    }

    fn remove_stream(&mut self, stream: StreamId) {
        let keys: Vec<Key> = self
            .watchers
            .keys()
            .filter(|k| k.0 == stream)
            .copied()
            .collect();
        for key in keys {
            self.remove(&key);
        }
    }

    fn drain(&mut self) -> Vec<(Key, Watcher)> {
        self.by_key.clear();
        self.ranged.clear();
        self.watchers.drain().collect()
    }

    fn len(&self) -> usize {
        self.watchers.len()
    }

    fn is_empty(&self) -> bool {
        self.watchers.is_empty()
    }

    /// The watchers an event on `key` may concern: those of `key`, and every ranged one.
    fn candidates<'a>(&'a self, key: &[u8]) -> impl Iterator<Item = &'a Key> + 'a {
        self.by_key
            .get(key)
            .into_iter()
            .flatten()
            .chain(self.ranged.iter())
    }
}

#[derive(Default)]
struct Groups {
    synced: Synced,
    unsynced: HashMap<Key, Watcher>,
    /// The last revision the writer notified.
    notified_rev: i64,
}

/// The registry of watchers.
pub struct WatchHub {
    groups: Mutex<Groups>,
    next_stream: AtomicU64,
}

impl Default for WatchHub {
    fn default() -> Self {
        WatchHub::new(0)
    }
}

impl WatchHub {
    /// A hub whose head is `current_rev`.
    pub fn new(current_rev: i64) -> Self {
        WatchHub {
            groups: Mutex::new(Groups {
                notified_rev: current_rev,
                ..Groups::default()
            }),
            next_stream: AtomicU64::new(1),
        }
    }

    /// A fresh stream id.
    pub fn new_stream(&self) -> StreamId {
        crate::metrics::WATCH_STREAMS.inc();
        self.next_stream.fetch_add(1, Ordering::Relaxed)
    }

    /// The last revision delivered to synced watchers.
    pub fn notified_rev(&self) -> i64 {
        self.groups.lock().notified_rev
    }

    /// Add a watcher that wants events from `start_rev` on. Returns whether it starts synced.
    pub fn watch(
        &self,
        stream: StreamId,
        id: WatchId,
        range: WatchRange,
        filters: Filters,
        start_rev: i64,
        tx: mpsc::Sender<HubMsg>,
    ) -> bool {
        let mut groups = self.groups.lock();
        let watcher = Watcher {
            range,
            filters,
            next_rev: start_rev,
            tx,
        };
        if start_rev > groups.notified_rev {
            groups.synced.insert((stream, id), watcher);
            true
        } else {
            groups.unsynced.insert((stream, id), watcher);
            false
        }
    }

    /// Remove a watcher; returns whether it existed.
    pub fn cancel(&self, stream: StreamId, id: WatchId) -> bool {
        let mut groups = self.groups.lock();
        groups.synced.remove(&(stream, id)).is_some()
            || groups.unsynced.remove(&(stream, id)).is_some()
    }

    /// Remove every watcher of a stream.
    pub fn close_stream(&self, stream: StreamId) {
        crate::metrics::WATCH_STREAMS.dec();
        let mut groups = self.groups.lock();
        groups.synced.remove_stream(stream);
        groups.unsynced.retain(|k, _| k.0 != stream);
    }

    /// Whether every watcher of `stream` is synced (so a progress report is truthful).
    pub fn stream_synced(&self, stream: StreamId) -> bool {
        !self.groups.lock().unsynced.keys().any(|k| k.0 == stream)
    }

    /// The revision a progress report for `stream` may carry: the hub's head, if every watcher
    /// of the stream is synced (every event up to it has been handed to the stream's channel).
    pub fn progress_rev(&self, stream: StreamId) -> Option<i64> {
        let groups = self.groups.lock();
        if groups.unsynced.keys().any(|k| k.0 == stream) {
            return None;
        }
        Some(groups.notified_rev)
    }

    /// Number of watchers (synced, unsynced).
    pub fn counts(&self) -> (usize, usize) {
        let groups = self.groups.lock();
        (groups.synced.len(), groups.unsynced.len())
    }

    /// Deliver committed events (in revision order) to synced watchers; the store's head is now
    /// `rev`. Never blocks: a watcher whose channel is full falls back to unsynced. Returns
    /// whether some watcher fell behind.
    pub fn notify(&self, events: &[Event], rev: i64) -> bool {
        let mut groups = self.groups.lock();
        groups.notified_rev = groups.notified_rev.max(rev);
        if events.is_empty() || groups.synced.is_empty() {
            return false;
        }
        // Each event is copied once, for all watchers.
        let shared: Vec<Arc<SharedEvent>> = events.iter().cloned().map(SharedEvent::new).collect();
        // Split the batch by revision: one response per revision, as etcd sends them.
        let mut by_rev: Vec<(i64, &[Arc<SharedEvent>])> = Vec::new();
        let mut start = 0;
        let rev_of = |e: &Arc<SharedEvent>| e.event.kv.as_ref().map_or(0, |kv| kv.mod_revision);
        for i in 1..=shared.len() {
            if i == shared.len() || rev_of(&shared[i]) != rev_of(&shared[start]) {
                by_rev.push((rev_of(&shared[start]), &shared[start..i]));
                start = i;
            }
        }
        // Per revision: each event goes to the watchers its key can concern, gathered per
        // watcher so that a watcher gets one message per revision.
        let mut fell_behind: HashSet<Key> = HashSet::new();
        let mut batch: HashMap<Key, Vec<Arc<SharedEvent>>> = HashMap::new();
        for (event_rev, slice) in &by_rev {
            for shared_event in slice.iter() {
                let Some(kv) = &shared_event.event.kv else {
                    continue;
                };
                for key in groups.synced.candidates(&kv.key) {
                    if fell_behind.contains(key) {
                        continue;
                    }
                    if groups.synced.watchers[key].wants(&shared_event.event) {
                        batch.entry(*key).or_default().push(shared_event.clone());
                    }
                }
            }
            for (key, wanted) in batch.drain() {
                let Some(watcher) = groups.synced.watchers.get_mut(&key) else {
                    continue;
                };
                let n_events = wanted.len();
                let msg = HubMsg::Events {
                    watch_id: key.1,
                    pending: crate::metrics::Pending::new(n_events),
                    events: wanted,
                    revision: *event_rev,
                };
                match watcher.tx.try_send(msg) {
                    Ok(()) => {
                        watcher.next_rev = event_rev + 1;
                        crate::metrics::EVENTS.inc_by(n_events as u64);
                    }
                    Err(
                        mpsc::error::TrySendError::Full(_) | mpsc::error::TrySendError::Closed(_),
                    ) => {
                        fell_behind.insert(key);
                    }
                }
            }
        }
        let any_behind = !fell_behind.is_empty();
        for key in fell_behind {
            if let Some(watcher) = groups.synced.remove(&key) {
                if watcher.tx.is_closed() {
                    continue;
                }
                groups.unsynced.insert(key, watcher);
            }
        }
        any_behind
    }

    /// The store was replaced (a raft snapshot): its head is now `rev`. Every watcher is
    /// caught up again from the new store's history, or canceled if that history is gone.
    pub fn store_replaced(&self, rev: i64) {
        let mut groups = self.groups.lock();
        groups.notified_rev = rev;
        let synced = groups.synced.drain();
        groups.unsynced.extend(synced);
    }

    /// Whether any watcher is behind.
    pub fn has_unsynced(&self) -> bool {
        !self.groups.lock().unsynced.is_empty()
    }

    /// One catch-up round: read history for up to [`MAX_WATCHERS_PER_SYNC`] unsynced watchers
    /// (at most [`MAX_REVS_PER_SYNC`] revisions) and deliver it; watchers that reach the head
    /// become synced. Returns how many watchers are still behind and how many advanced.
    pub fn sync_round(&self, store: &KvStore) -> Result<SyncOutcome> {
        let compact_rev = store.compact_rev();
        // Choose watchers and the revision window under the lock, read without it.
        let (chosen, from, to) = {
            let mut groups = self.groups.lock();
            let head = groups.notified_rev;
            let mut compacted = Vec::new();
            let mut chosen = Vec::new();
            let mut from = i64::MAX;
            for (key, watcher) in groups.unsynced.iter() {
                if watcher.tx.is_closed() {
                    compacted.push((*key, None));
                    continue;
                }
                if watcher.next_rev < compact_rev && watcher.next_rev > 0 {
                    compacted.push((*key, Some(compact_rev)));
                    continue;
                }
                // A watcher whose stream is not reading has no room: skip it this round
                // rather than read history it cannot take.
                if chosen.len() < MAX_WATCHERS_PER_SYNC && watcher.tx.capacity() > 0 {
                    chosen.push(*key);
                    from = from.min(watcher.next_rev.max(1));
                }
            }
            for (key, compact) in compacted {
                let Some(watcher) = groups.unsynced.remove(&key) else {
                    continue;
                };
                if let Some(compact_revision) = compact {
                    let msg = HubMsg::Compacted {
                        watch_id: key.1,
                        compact_revision,
                    };
                    if watcher.tx.try_send(msg).is_err() {
                        // No room for the cancel yet: keep it and retry next round.
                        groups.unsynced.insert(key, watcher);
                    }
                }
            }
            if chosen.is_empty() {
                return Ok(SyncOutcome {
                    behind: groups.unsynced.len(),
                    advanced: 0,
                });
            }
            let to = head.min(from.saturating_add(MAX_REVS_PER_SYNC - 1));
            (chosen, from, to)
        };
        let events: Vec<Arc<SharedEvent>> = if from <= to {
            store
                .events_between(from, to)?
                .into_iter()
                .map(SharedEvent::new)
                .collect()
        } else {
            Vec::new()
        };
        let mut groups = self.groups.lock();
        let head = groups.notified_rev;
        let mut advanced = 0;
        for key in chosen {
            let Some(watcher) = groups.unsynced.get_mut(&key) else {
                continue;
            };
            if watcher.next_rev <= to {
                let wanted: Vec<Arc<SharedEvent>> = events
                    .iter()
                    .filter(|e| {
                        e.event.kv.as_ref().is_some_and(|kv| kv.mod_revision <= to)
                            && watcher.wants(&e.event)
                    })
                    .cloned()
                    .collect();
                if !wanted.is_empty() {
                    let n_events = wanted.len();
                    let msg = HubMsg::Events {
                        watch_id: key.1,
                        pending: crate::metrics::Pending::new(n_events),
                        events: wanted,
                        revision: head,
                    };
                    if watcher.tx.try_send(msg).is_err() {
                        continue;
                    }
                    crate::metrics::EVENTS.inc_by(n_events as u64);
                }
                watcher.next_rev = to + 1;
                advanced += 1;
            }
            if watcher.next_rev > head
                && let Some(watcher) = groups.unsynced.remove(&key)
            {
                groups.synced.insert(key, watcher);
            }
        }
        Ok(SyncOutcome {
            behind: groups.unsynced.len(),
            advanced,
        })
    }
}

/// What a catch-up round did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SyncOutcome {
    /// Watchers still behind.
    pub behind: usize,
    /// Watchers that advanced this round.
    pub advanced: usize,
}

#[cfg(test)]
mod tests {
    use super::*;
    use etcdrs_proto::mvccpb::KeyValue;

    fn put(key: &str, rev: i64) -> Event {
        Event {
            r#type: EventType::Put as i32,
            kv: Some(KeyValue {
                key: key.as_bytes().to_vec(),
                mod_revision: rev,
                ..Default::default()
            }),
            prev_kv: None,
        }
    }

    fn range(key: &str, end: &str) -> WatchRange {
        WatchRange {
            key: key.into(),
            end: end.into(),
        }
    }

    #[test]
    fn ranges() {
        assert!(range("a", "").contains(b"a"));
        assert!(!range("a", "").contains(b"ab"));
        assert!(range("a", "b").contains(b"ab"));
        assert!(!range("a", "b").contains(b"b"));
        assert!(range("a", "\0").contains(b"zzz"));
        assert!(range("b", "a").is_empty_range());
        assert!(!range("b", "\0").is_empty_range());
    }

    #[test]
    fn synced_watchers_get_events_and_full_channels_fall_behind() {
        let hub = WatchHub::new(1);
        let (tx, mut rx) = mpsc::channel(1);
        assert!(hub.watch(1, 0, range("k", ""), Filters::default(), 2, tx));
        hub.notify(&[put("k", 2), put("other", 2)], 2);
        match rx.try_recv().unwrap() {
            HubMsg::Events {
                events, revision, ..
            } => {
                assert_eq!(events.len(), 1);
                assert_eq!(revision, 2);
            }
            other => panic!("{other:?}"),
        }
        hub.notify(&[put("k", 3)], 3);
        // The channel (capacity 1) is now full: the next event makes the watcher unsynced.
        hub.notify(&[put("k", 4)], 4);
        assert_eq!(hub.counts(), (0, 1));
        assert!(!hub.stream_synced(1));
        hub.cancel(1, 0);
        assert_eq!(hub.counts(), (0, 0));
    }

    /// The keys of every event a stream received, by revision, from what is queued.
    fn received(rx: &mut mpsc::Receiver<HubMsg>) -> Vec<(WatchId, i64, Vec<String>)> {
        let mut got = Vec::new();
        while let Ok(msg) = rx.try_recv() {
            if let HubMsg::Events {
                watch_id,
                events,
                revision,
                ..
            } = msg
            {
                let keys = events
                    .iter()
                    .map(|e| {
                        let kv = e.event().kv.as_ref().expect("kv");
                        String::from_utf8_lossy(&kv.key).into_owned()
                    })
                    .collect();
                got.push((watch_id, revision, keys));
            }
        }
        got
    }

    #[test]
    fn events_reach_exactly_the_watchers_of_their_key_or_range() {
        let hub = WatchHub::new(1);
        let (tx, mut rx) = mpsc::channel(64);
        let f = Filters::default();
        // Two on one key, one on another, a prefix and a range.
        assert!(hub.watch(1, 0, range("a", ""), f, 2, tx.clone()));
        assert!(hub.watch(1, 1, range("a", ""), f, 2, tx.clone()));
        assert!(hub.watch(1, 2, range("b", ""), f, 2, tx.clone()));
        assert!(hub.watch(1, 3, range("a", "b"), f, 2, tx.clone()));
        assert!(hub.watch(1, 4, range("b", "\0"), f, 2, tx.clone()));
        hub.notify(&[put("a", 2), put("ab", 2), put("b", 3), put("c", 4)], 4);
        let mut got = received(&mut rx);
        got.sort();
        assert_eq!(
            got,
            vec![
                (0, 2, vec!["a".to_owned()]),
                (1, 2, vec!["a".to_owned()]),
                (2, 3, vec!["b".to_owned()]),
                (3, 2, vec!["a".to_owned(), "ab".to_owned()]),
                (4, 3, vec!["b".to_owned()]),
                (4, 4, vec!["c".to_owned()]),
            ]
        );

        // A canceled watcher leaves its key's index; the other one on the key stays.
        assert!(hub.cancel(1, 0));
        // A reused id takes the new range: watcher 2 now follows "c", not "b".
        assert!(hub.watch(1, 2, range("c", ""), f, 5, tx.clone()));
        hub.notify(&[put("a", 5), put("b", 5), put("c", 5)], 5);
        let mut got = received(&mut rx);
        got.sort();
        assert_eq!(
            got,
            vec![
                (1, 5, vec!["a".to_owned()]),
                (2, 5, vec!["c".to_owned()]),
                (3, 5, vec!["a".to_owned()]),
                (4, 5, vec!["b".to_owned(), "c".to_owned()]),
            ]
        );

        // Closing the stream empties every index.
        hub.close_stream(1);
        assert_eq!(hub.counts(), (0, 0));
        hub.notify(&[put("a", 6)], 6);
        assert!(received(&mut rx).is_empty());
        let groups = hub.groups.lock();
        assert!(groups.synced.by_key.is_empty() && groups.synced.ranged.is_empty());
    }
}
