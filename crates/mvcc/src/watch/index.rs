//! The synced watchers, indexed the way events find them (etcd's `watcherGroup`): single-key
//! watchers in a map by key, range watchers in an [`IntervalMap`] by their distinct ranges,
//! so an event looks only at the watchers of its own key and of the ranges that hold it.
//! Within a key or range the watchers are grouped by stream, so that the hub can hand one
//! stream all its watchers that want an event in one message.

use std::collections::HashMap;

use etcdrs_proto::mvccpb::{Event, event::EventType};

use super::interval::{End, IntervalMap};
use super::{Filters, StreamId, WatchId, WatchRange, Watcher};

/// A synced watcher as its group keeps it.
#[derive(Clone, Copy, Debug)]
pub(super) struct Slot {
    pub(super) id: WatchId,
    pub(super) filters: Filters,
    /// The lowest revision not yet delivered (later than the hub's head for a watcher that
    /// starts in the future).
    pub(super) next_rev: i64,
}

impl Slot {
    /// Whether the watcher wants `event` of revision `rev` (its key is in the watcher's range:
    /// the index found it).
    pub(super) fn wants(&self, event: &Event, rev: i64) -> bool {
        if rev < self.next_rev {
            return false;
        }
        let is_put = event.r#type == EventType::Put as i32;
        !(is_put && self.filters.no_put || !is_put && self.filters.no_delete)
    }
}

/// One stream's watchers of one key or range.
pub(super) struct StreamSlots {
    pub(super) stream: StreamId,
    pub(super) slots: Vec<Slot>,
    /// Where each watcher is in `slots`.
    pos: HashMap<WatchId, usize>,
}

/// The watchers of one key or range, by stream.
#[derive(Default)]
pub(super) struct Group {
    pub(super) streams: Vec<StreamSlots>,
    /// Where each stream is in `streams`.
    pos: HashMap<StreamId, usize>,
}

impl Group {
    fn insert(&mut self, stream: StreamId, slot: Slot) {
        let at = *self.pos.entry(stream).or_insert_with(|| {
            self.streams.push(StreamSlots {
                stream,
                slots: Vec::new(),
                pos: HashMap::new(),
            });
            self.streams.len() - 1
        });
        let entry = &mut self.streams[at];
        entry.pos.insert(slot.id, entry.slots.len());
        entry.slots.push(slot);
    }

    fn remove(&mut self, stream: StreamId, id: WatchId) -> Option<Slot> {
        let at = *self.pos.get(&stream)?;
        let entry = &mut self.streams[at];
        let i = entry.pos.remove(&id)?;
        let slot = entry.slots.swap_remove(i);
        if let Some(moved) = entry.slots.get(i) {
            entry.pos.insert(moved.id, i);
        }
        if entry.slots.is_empty() {
            self.remove_stream(stream);
        }
        Some(slot)
    }

    fn remove_stream(&mut self, stream: StreamId) -> Vec<Slot> {
        let Some(at) = self.pos.remove(&stream) else {
            return Vec::new();
        };
        let entry = self.streams.swap_remove(at);
        if let Some(moved) = self.streams.get(at) {
            self.pos.insert(moved.stream, at);
        }
        entry.slots
    }

    /// The slot of watcher `id` of `stream`.
    pub(super) fn slot_mut(&mut self, stream: StreamId, id: WatchId) -> Option<&mut Slot> {
        let entry = &mut self.streams[*self.pos.get(&stream)?];
        let i = *entry.pos.get(&id)?;
        entry.slots.get_mut(i)
    }

    fn is_empty(&self) -> bool {
        self.streams.is_empty()
    }
}

/// A range watcher's key in the interval map.
fn range_end(range: &WatchRange) -> End {
    if range.end == [0] {
        End::Unbounded
    } else {
        End::Key(range.end.clone())
    }
}

/// The synced watchers (see the module docs).
#[derive(Default)]
pub(super) struct Synced {
    /// Each stream's watchers and the range each is indexed under.
    located: HashMap<StreamId, HashMap<WatchId, WatchRange>>,
    by_key: HashMap<Vec<u8>, Group>,
    by_range: IntervalMap<Group>,
    len: usize,
}

impl Synced {
    /// Adds a watcher; a watch id reused within its stream replaces the old watcher.
    pub(super) fn insert(&mut self, stream: StreamId, id: WatchId, watcher: Watcher) {
        self.remove(stream, id);
        let slot = Slot {
            id,
            filters: watcher.filters,
            next_rev: watcher.next_rev,
        };
        if watcher.range.end.is_empty() {
            self.by_key
                .entry(watcher.range.key.clone())
                .or_default()
                .insert(stream, slot);
        } else {
            self.by_range
                .get_or_insert_with(
                    &watcher.range.key,
                    &range_end(&watcher.range),
                    Group::default,
                )
                .insert(stream, slot);
        }
        self.located
            .entry(stream)
            .or_default()
            .insert(id, watcher.range);
        self.len += 1;
    }

    fn group_mut(&mut self, range: &WatchRange) -> Option<&mut Group> {
        if range.end.is_empty() {
            self.by_key.get_mut(&range.key)
        } else {
            self.by_range.get_mut(&range.key, &range_end(range))
        }
    }

    fn drop_group_if_empty(&mut self, range: &WatchRange) {
        if !self.group_mut(range).is_some_and(|g| g.is_empty()) {
            return;
        }
        if range.end.is_empty() {
            self.by_key.remove(&range.key);
        } else {
            self.by_range.remove(&range.key, &range_end(range));
        }
    }

    /// Removes a watcher, returning it.
    pub(super) fn remove(&mut self, stream: StreamId, id: WatchId) -> Option<Watcher> {
        let watchers = self.located.get_mut(&stream)?;
        let range = watchers.remove(&id)?;
        if watchers.is_empty() {
            self.located.remove(&stream);
        }
        let slot = self.group_mut(&range)?.remove(stream, id)?;
        self.drop_group_if_empty(&range);
        self.len -= 1;
        Some(Watcher {
            range,
            filters: slot.filters,
            next_rev: slot.next_rev,
        })
    }

    /// Removes every watcher of `stream`.
    pub(super) fn remove_stream(&mut self, stream: StreamId) {
        let Some(watchers) = self.located.remove(&stream) else {
            return;
        };
        self.len -= watchers.len();
        // All of the stream's watchers of one key or range leave their group at once.
        let mut ranges: Vec<WatchRange> = watchers.into_values().collect();
        ranges.sort_unstable_by(|a, b| (&a.key, &a.end).cmp(&(&b.key, &b.end)));
        ranges.dedup();
        for range in ranges {
            if let Some(group) = self.group_mut(&range) {
                group.remove_stream(stream);
            }
            self.drop_group_if_empty(&range);
        }
    }

    /// Removes every watcher.
    pub(super) fn drain(&mut self) -> Vec<((StreamId, WatchId), Watcher)> {
        let mut out = Vec::with_capacity(self.len);
        let mut take = |range: &WatchRange, group: Group| {
            for entry in group.streams {
                for slot in entry.slots {
                    let watcher = Watcher {
                        range: range.clone(),
                        filters: slot.filters,
                        next_rev: slot.next_rev,
                    };
                    out.push(((entry.stream, slot.id), watcher));
                }
            }
        };
        for (key, group) in self.by_key.drain() {
            take(
                &WatchRange {
                    key,
                    end: Vec::new(),
                },
                group,
            );
        }
        for (key, end, group) in self.by_range.drain() {
            let end = match end {
                End::Key(end) => end,
                End::Unbounded => vec![0],
            };
            take(&WatchRange { key, end }, group);
        }
        self.located.clear();
        self.len = 0;
        out
    }

    pub(super) fn len(&self) -> usize {
        self.len
    }

    pub(super) fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Calls `visit` with every group an event on `key` concerns: the key's own, then each
    /// range that holds it.
    pub(super) fn for_each_group(&mut self, key: &[u8], mut visit: impl FnMut(&mut Group)) {
        if let Some(group) = self.by_key.get_mut(key) {
            visit(group);
        }
        if !self.by_range.is_empty() {
            self.by_range.stab_mut(key, &mut visit);
        }
    }

    /// The slot of a synced watcher.
    pub(super) fn slot_mut(&mut self, stream: StreamId, id: WatchId) -> Option<&mut Slot> {
        let range = self.located.get(&stream)?.get(&id)?.clone();
        self.group_mut(&range)?.slot_mut(stream, id)
    }

    /// The highest next revision among `stream`'s synced watchers (0 if it has none).
    pub(super) fn highest_next_rev(&mut self, stream: StreamId) -> i64 {
        let ids: Vec<WatchId> = self
            .located
            .get(&stream)
            .map(|watchers| watchers.keys().copied().collect())
            .unwrap_or_default();
        ids.into_iter()
            .filter_map(|id| self.slot_mut(stream, id).map(|slot| slot.next_rev))
            .max()
            .unwrap_or(0)
    }

    /// Number of distinct keys and ranges with watchers (for tests).
    #[cfg(test)]
    pub(super) fn n_groups(&self) -> (usize, usize) {
        (self.by_key.len(), self.by_range.len())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use etcdrs_proto::mvccpb::KeyValue;

    fn watcher(key: &str, end: &str) -> Watcher {
        Watcher {
            range: WatchRange {
                key: key.into(),
                end: end.into(),
            },
            filters: Filters::default(),
            next_rev: 1,
        }
    }

    /// (stream, watch id) of every watcher an event on `key` reaches.
    fn reached(synced: &mut Synced, key: &str) -> Vec<(StreamId, WatchId)> {
        let mut got = Vec::new();
        synced.for_each_group(key.as_bytes(), |group| {
            for entry in &group.streams {
                got.extend(entry.slots.iter().map(|s| (entry.stream, s.id)));
            }
        });
        got.sort_unstable();
        got
    }

    #[test]
    fn events_find_their_key_prefix_from_key_and_overlapping_range_watchers() {
        let mut synced = Synced::default();
        synced.insert(1, 0, watcher("a", "")); // exact key
        synced.insert(2, 0, watcher("a", "")); // same key, another stream
        synced.insert(1, 1, watcher("a", "b")); // prefix "a"
        synced.insert(1, 2, watcher("ab", "")); // another key
        synced.insert(2, 1, watcher("a\0", "\0")); // from-key, after "a"
        synced.insert(3, 0, watcher("\0", "\0")); // every key
        synced.insert(3, 1, watcher("a", "b")); // the prefix again, another stream
        synced.insert(3, 2, watcher("aa", "ac")); // overlaps the prefix
        assert_eq!(synced.len(), 8);
        assert_eq!(synced.n_groups(), (2, 4));
        assert_eq!(
            reached(&mut synced, "a"),
            vec![(1, 0), (1, 1), (2, 0), (3, 0), (3, 1)]
        );
        assert_eq!(
            reached(&mut synced, "ab"),
            vec![(1, 1), (1, 2), (2, 1), (3, 0), (3, 1), (3, 2)]
        );
        assert_eq!(reached(&mut synced, "b"), vec![(2, 1), (3, 0)]);
        assert_eq!(reached(&mut synced, "\0"), vec![(3, 0)]);
    }

    #[test]
    fn removal_cancel_reuse_and_stream_close_leave_no_trace() {
        let mut synced = Synced::default();
        synced.insert(1, 0, watcher("a", ""));
        synced.insert(1, 1, watcher("a", ""));
        synced.insert(1, 2, watcher("a", "c"));
        synced.insert(2, 0, watcher("a", "c"));
        synced.insert(2, 1, watcher("b", "\0"));
        // A canceled watcher leaves; the other one of its key and stream stays.
        let gone = synced.remove(1, 0).expect("watcher 1/0");
        assert_eq!(gone.range, watcher("a", "").range);
        assert!(synced.remove(1, 0).is_none());
        assert_eq!(reached(&mut synced, "a"), vec![(1, 1), (1, 2), (2, 0)]);
        // A reused id moves the watcher to its new range.
        synced.insert(1, 1, watcher("z", ""));
        assert_eq!(reached(&mut synced, "a"), vec![(1, 2), (2, 0)]);
        assert_eq!(reached(&mut synced, "z"), vec![(1, 1), (2, 1)]);
        assert_eq!(synced.len(), 4);
        // Its slot is found and changed in place.
        synced.slot_mut(2, 1).expect("slot").next_rev = 9;
        assert_eq!(synced.remove(2, 1).map(|w| w.next_rev), Some(9));
        // Closing a stream removes all its watchers, and empty groups go with them.
        synced.remove_stream(1);
        assert_eq!(synced.len(), 1);
        assert_eq!(reached(&mut synced, "a"), vec![(2, 0)]);
        assert_eq!(synced.n_groups(), (0, 1));
        let drained = synced.drain();
        assert_eq!(drained.len(), 1);
        assert_eq!(drained[0].0, (2, 0));
        assert_eq!(drained[0].1.range, watcher("a", "c").range);
        assert!(synced.is_empty());
        assert_eq!(synced.n_groups(), (0, 0));
    }

    #[test]
    fn slots_filter_by_revision_and_event_type() {
        let put = Event {
            r#type: EventType::Put as i32,
            kv: Some(KeyValue::default()),
            prev_kv: None,
        };
        let delete = Event {
            r#type: EventType::Delete as i32,
            ..put.clone()
        };
        let mut slot = Slot {
            id: 0,
            filters: Filters::default(),
            next_rev: 5,
        };
        assert!(!slot.wants(&put, 4));
        assert!(slot.wants(&put, 5) && slot.wants(&delete, 6));
        slot.filters.no_put = true;
        assert!(!slot.wants(&put, 5) && slot.wants(&delete, 5));
        slot.filters = Filters {
            no_put: false,
            no_delete: true,
        };
        assert!(slot.wants(&put, 5) && !slot.wants(&delete, 5));
    }
}
