//! The watch guarantees, checked against the key-value history (etcd's API guarantees page;
//! its robustness suite's `validate/watch.go`).
//!
//! [`History`] holds every event of every revision as the store committed it. A [`Watch`]
//! follows what one watcher was delivered, response by response, and checks each against
//! the history as it comes:
//!
//! - **ordered**: events come in revision order, never before one already delivered;
//! - **unique**: no event twice (a key at most once per revision, no revision again);
//! - **atomic**: a response holds all of its revisions' events of the watched range;
//! - **reliable**: no gap: a response holds every event of the range from the watcher's next
//!   revision on up to its last one (a resumed watcher starts at the revision after the last
//!   it was delivered, so resumptions leave no gap either);
//! - **bookmarkable**: a progress notification's revision is never behind a delivered event
//!   and never ahead of an undelivered one;
//! - **consistent**: every event is the history's own (type, key, value, revisions, version,
//!   lease), and its `prev_kv` is the key's value just before it;
//! - **compaction**: a watcher is canceled as compacted exactly when it wants history below
//!   the compacted revision.
//!
//! The simulator and the process test (`crates/etcd/tests/it/watch_guarantees.rs`) share it.

use std::collections::BTreeMap;

use etcdrs_proto::mvccpb::{Event, KeyValue, event::EventType};

/// Which guarantee a delivery broke.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Guarantee {
    /// Events out of revision order.
    Ordered,
    /// An event delivered twice.
    Unique,
    /// A revision's events split over responses.
    Atomic,
    /// An event of the range never delivered (a gap).
    Reliable,
    /// A progress notification behind a delivered event or ahead of an undelivered one.
    Bookmarkable,
    /// An event (or its `prev_kv`) that is not the history's.
    Consistent,
    /// A compacted cancel that was not due, or a watch from a compacted revision that was not
    /// canceled.
    Compaction,
}

/// A broken guarantee, with what shows it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WatchViolation {
    /// The guarantee.
    pub guarantee: Guarantee,
    /// What was delivered against what the history holds.
    pub message: String,
}

impl std::fmt::Display for WatchViolation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "watch guarantee {:?} broken: {}",
            self.guarantee, self.message
        )
    }
}

fn violation(guarantee: Guarantee, message: String) -> WatchViolation {
    WatchViolation { guarantee, message }
}

/// Every revision's events, as committed.
#[derive(Clone, Debug, Default)]
pub struct History {
    by_rev: BTreeMap<i64, Vec<Event>>,
    /// Each key's value after each revision that changed it (`None`: deleted).
    by_key: BTreeMap<Vec<u8>, BTreeMap<i64, Option<KeyValue>>>,
    /// The newest revision known committed (a store starts at revision 1, with no event).
    head: i64,
}

impl History {
    /// An empty history.
    pub fn new() -> History {
        History::default()
    }

    /// Records `events` (as watch events: revisions from their `kv`, in commit order). A
    /// revision recorded before must be recorded again with the same events (another member,
    /// or a replay after a crash); otherwise this says what differs.
    pub fn record(&mut self, events: &[Event]) -> Result<(), String> {
        let mut at = 0;
        while at < events.len() {
            let rev = mod_rev(&events[at]);
            let mut end = at + 1;
            while end < events.len() && mod_rev(&events[end]) == rev {
                end += 1;
            }
            let slice = &events[at..end];
            match self.by_rev.get(&rev) {
                Some(known) if known.as_slice() != slice => {
                    return Err(format!(
                        "revision {rev} committed as {} and as {}",
                        describe(known),
                        describe(slice)
                    ));
                }
                Some(_) => {}
                None => {
                    for event in slice {
                        let Some(kv) = &event.kv else { continue };
                        let value = (event.r#type == EventType::Put as i32).then(|| kv.clone());
                        self.by_key
                            .entry(kv.key.clone())
                            .or_default()
                            .insert(rev, value);
                    }
                    self.by_rev.insert(rev, slice.to_vec());
                    self.head = self.head.max(rev);
                }
            }
            at = end;
        }
        Ok(())
    }

    /// Revision `rev` is committed (with its events recorded, if it has any).
    pub fn committed(&mut self, rev: i64) {
        self.head = self.head.max(rev);
    }

    /// The newest revision committed.
    pub fn head(&self) -> i64 {
        self.head
    }

    /// Revisions recorded.
    pub fn revisions(&self) -> usize {
        self.by_rev.len()
    }

    /// Events recorded.
    pub fn events(&self) -> usize {
        self.by_rev.values().map(Vec::len).sum()
    }

    /// `key`'s value as of revision `rev` (`None`: no such key then).
    pub fn value_at(&self, key: &[u8], rev: i64) -> Option<&KeyValue> {
        self.by_key
            .get(key)?
            .range(..=rev)
            .next_back()
            .and_then(|(_, v)| v.as_ref())
    }

    /// The events of `range` with revisions in `[from, to]`, in order.
    pub fn events_in<'a>(
        &'a self,
        range: &'a KeyRange,
        from: i64,
        to: i64,
    ) -> impl Iterator<Item = &'a Event> + 'a {
        // An empty span when `to < from` (a half-open range from `from` to itself).
        let span = (
            std::ops::Bound::Included(from),
            if to < from {
                std::ops::Bound::Excluded(from)
            } else {
                std::ops::Bound::Included(to)
            },
        );
        self.by_rev
            .range(span)
            .flat_map(|(_, events)| events.iter())
            .filter(move |e| e.kv.as_ref().is_some_and(|kv| range.contains(&kv.key)))
    }

    fn event(&self, rev: i64, key: &[u8]) -> Option<&Event> {
        self.by_rev
            .get(&rev)?
            .iter()
            .find(|e| e.kv.as_ref().is_some_and(|kv| kv.key == key))
    }
}

/// The keys a watcher follows, in etcd's encoding.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KeyRange {
    /// First key.
    pub key: Vec<u8>,
    /// Empty: `key` alone; `[0]`: every key from `key` on; otherwise `[key, end)`.
    pub end: Vec<u8>,
}

impl KeyRange {
    /// Whether `key` is in the range.
    pub fn contains(&self, key: &[u8]) -> bool {
        if self.end.is_empty() {
            return key == self.key.as_slice();
        }
        key >= self.key.as_slice() && (self.end == [0] || key < self.end.as_slice())
    }

    /// Every key starting with `prefix` (clientv3's `WithPrefix`).
    pub fn prefix(prefix: &[u8]) -> KeyRange {
        let mut end = prefix.to_vec();
        while let Some(last) = end.pop() {
            if last < 0xff {
                end.push(last + 1);
                return KeyRange {
                    key: prefix.to_vec(),
                    end,
                };
            }
        }
        KeyRange {
            key: prefix.to_vec(),
            end: vec![0],
        }
    }
}

fn mod_rev(event: &Event) -> i64 {
    event.kv.as_ref().map_or(0, |kv| kv.mod_revision)
}

fn key_of(event: &Event) -> &[u8] {
    event.kv.as_ref().map_or(&[], |kv| kv.key.as_slice())
}

fn describe(events: &[Event]) -> String {
    let parts: Vec<String> = events.iter().map(describe_one).collect();
    format!("[{}]", parts.join(", "))
}

fn describe_one(event: &Event) -> String {
    let kind = if event.r#type == EventType::Put as i32 {
        "put"
    } else {
        "delete"
    };
    let (key, value) = event
        .kv
        .as_ref()
        .map_or((String::new(), String::new()), |kv| {
            (
                String::from_utf8_lossy(&kv.key).into_owned(),
                String::from_utf8_lossy(&kv.value).into_owned(),
            )
        });
    format!("{kind} {key}={value}@{}", mod_rev(event))
}

/// One watcher's deliveries, checked as they come.
#[derive(Clone, Debug)]
pub struct Watch {
    range: KeyRange,
    prev_kv: bool,
    /// The lowest revision not delivered yet: every event of the range below it has been.
    next_rev: i64,
    /// Opened from a revision below the store's compacted revision then: the first response
    /// must be the compacted cancel.
    must_compact: Option<i64>,
    /// Canceled as compacted: nothing more may come.
    canceled: bool,
    /// Events and progress notifications checked.
    pub checked: Counts,
}

/// What a [`Watch`] has checked.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Counts {
    /// Responses with events.
    pub responses: u64,
    /// Events.
    pub events: u64,
    /// Events with a `prev_kv` checked.
    pub prev_kvs: u64,
    /// Progress notifications.
    pub progress: u64,
    /// Compacted cancels.
    pub compacted: u64,
    /// Deletions at the compacted revision that a watcher from there was not delivered
    /// ([`lost_to_compaction`]).
    pub compacted_tombstones: u64,
}

impl Watch {
    /// A watcher of `range` that wants events from revision `start` on (the revision after
    /// the head at its creation, for a watch without a start revision). `compacted` is the
    /// store's compacted revision when it was created: a start below it must be answered by
    /// the compacted cancel.
    pub fn new(range: KeyRange, prev_kv: bool, start: i64, compacted: i64) -> Watch {
        Watch {
            range,
            prev_kv,
            next_rev: start.max(1),
            must_compact: (start < compacted).then_some(compacted),
            canceled: false,
            checked: Counts::default(),
        }
    }

    /// The revision to resume from: the one after the last delivered (or covered by a
    /// progress notification).
    pub fn next_rev(&self) -> i64 {
        self.next_rev
    }

    /// Whether the watcher was canceled as compacted.
    pub fn canceled(&self) -> bool {
        self.canceled
    }

    /// A response of `events`, its header at `header_rev`. `compacted_below`: the member's
    /// compacted revision when `prev_kv`s were read (a `prev_kv` whose revision it compacted
    /// cannot be read, and is left out, as in etcd).
    pub fn events(
        &mut self,
        history: &History,
        header_rev: i64,
        events: &[Event],
        compacted_below: i64,
    ) -> Result<(), WatchViolation> {
        if self.canceled {
            return Err(violation(
                Guarantee::Compaction,
                format!("events {} after the compacted cancel", describe(events)),
            ));
        }
        if let Some(compacted) = self.must_compact {
            return Err(violation(
                Guarantee::Compaction,
                format!(
                    "a watch from revision {} (compacted at {compacted}) was delivered {} instead of the compacted cancel",
                    self.next_rev,
                    describe(events)
                ),
            ));
        }
        let Some(last) = events.last() else {
            return Ok(());
        };
        let last_rev = mod_rev(last);
        if header_rev < last_rev {
            return Err(violation(
                Guarantee::Consistent,
                format!(
                    "a response at revision {header_rev} holds {}",
                    describe(events)
                ),
            ));
        }
        // Ordered and unique, within the response and against what came before.
        for (at, event) in events.iter().enumerate() {
            let (rev, key) = (mod_rev(event), key_of(event));
            if rev < self.next_rev {
                let again =
                    self.range.contains(key) && history.event(rev, key) == Some(&strip(event));
                let (guarantee, what) = if again {
                    (Guarantee::Unique, "delivered twice")
                } else {
                    (Guarantee::Ordered, "out of order")
                };
                return Err(violation(
                    guarantee,
                    format!(
                        "{} {what}: the watcher was past revision {} already",
                        describe_one(event),
                        self.next_rev - 1
                    ),
                ));
            }
            let earlier = &events[..at];
            if earlier.iter().any(|e| mod_rev(e) > rev) {
                return Err(violation(
                    Guarantee::Ordered,
                    format!(
                        "{} out of order in {}",
                        describe_one(event),
                        describe(events)
                    ),
                ));
            }
            if earlier
                .iter()
                .any(|e| mod_rev(e) == rev && key_of(e) == key)
            {
                return Err(violation(
                    Guarantee::Unique,
                    format!(
                        "{} delivered twice in {}",
                        describe_one(event),
                        describe(events)
                    ),
                ));
            }
        }
        // Consistent: each event is the history's, with the value before it.
        for event in events {
            let (rev, key) = (mod_rev(event), key_of(event));
            if !self.range.contains(key) {
                return Err(violation(
                    Guarantee::Consistent,
                    format!("{} is outside the watched range", describe_one(event)),
                ));
            }
            match history.event(rev, key) {
                Some(known) if *known == strip(event) => {}
                Some(known) => {
                    return Err(violation(
                        Guarantee::Consistent,
                        format!(
                            "{} delivered, the history has {}",
                            describe_one(event),
                            describe_one(known)
                        ),
                    ));
                }
                None => {
                    return Err(violation(
                        Guarantee::Consistent,
                        format!("{} is not in the history", describe_one(event)),
                    ));
                }
            }
            self.check_prev_kv(history, event, compacted_below)?;
        }
        // Reliable and atomic: nothing of the range from the next revision to the last one is
        // missing.
        for want in history.events_in(&self.range, self.next_rev, last_rev) {
            let (rev, key) = (mod_rev(want), key_of(want));
            if events.iter().any(|e| mod_rev(e) == rev && key_of(e) == key) {
                continue;
            }
            if lost_to_compaction(want, compacted_below) {
                self.checked.compacted_tombstones += 1;
                continue;
            }
            let (guarantee, what) = if rev == last_rev {
                (
                    Guarantee::Atomic,
                    "left out of a response that holds its revision",
                )
            } else {
                (Guarantee::Reliable, "never delivered (a gap)")
            };
            return Err(violation(
                guarantee,
                format!(
                    "{} {what}; the watcher was at revision {} and was delivered {}",
                    describe_one(want),
                    self.next_rev,
                    describe(events)
                ),
            ));
        }
        self.next_rev = last_rev + 1;
        self.checked.responses += 1;
        self.checked.events += events.len() as u64;
        Ok(())
    }

    fn check_prev_kv(
        &mut self,
        history: &History,
        event: &Event,
        compacted_below: i64,
    ) -> Result<(), WatchViolation> {
        if !self.prev_kv {
            if event.prev_kv.is_some() {
                return Err(violation(
                    Guarantee::Consistent,
                    format!("{} carries a prev_kv nobody asked for", describe_one(event)),
                ));
            }
            return Ok(());
        }
        let Some(kv) = &event.kv else { return Ok(()) };
        let want = history.value_at(&kv.key, kv.mod_revision - 1);
        match (&event.prev_kv, want) {
            (Some(got), Some(want)) if got == want => {}
            // Unreadable once compacted.
            (None, _) if kv.mod_revision - 1 < compacted_below => {}
            (None, None) => {}
            (got, want) => {
                return Err(violation(
                    Guarantee::Consistent,
                    format!(
                        "{} has prev_kv {:?}, the key held {:?} before it",
                        describe_one(event),
                        got.as_ref()
                            .map(|kv| String::from_utf8_lossy(&kv.value).into_owned()),
                        want.map(|kv| String::from_utf8_lossy(&kv.value).into_owned())
                    ),
                ));
            }
        }
        self.checked.prev_kvs += 1;
        Ok(())
    }

    /// A progress notification at `rev`: every event of the range up to it has been
    /// delivered, and none after it. `compacted`: the member's compacted revision then (see
    /// [`lost_to_compaction`]).
    pub fn progress(
        &mut self,
        history: &History,
        rev: i64,
        compacted: i64,
    ) -> Result<(), WatchViolation> {
        if self.canceled {
            return Ok(());
        }
        if rev < self.next_rev - 1 {
            return Err(violation(
                Guarantee::Bookmarkable,
                format!(
                    "progress at revision {rev} behind the delivered revision {}",
                    self.next_rev - 1
                ),
            ));
        }
        if rev > history.head() {
            return Err(violation(
                Guarantee::Bookmarkable,
                format!(
                    "progress at revision {rev}, past the last committed revision {}",
                    history.head()
                ),
            ));
        }
        if let Some(compacted) = self.must_compact {
            return Err(violation(
                Guarantee::Bookmarkable,
                format!(
                    "progress at revision {rev} ahead of the undelivered compacted cancel (the watch starts at {}, compacted at {compacted})",
                    self.next_rev
                ),
            ));
        }
        if let Some(missing) = history
            .events_in(&self.range, self.next_rev, rev)
            .find(|e| !lost_to_compaction(e, compacted))
        {
            return Err(violation(
                Guarantee::Bookmarkable,
                format!(
                    "progress at revision {rev} ahead of the undelivered {}",
                    describe_one(missing)
                ),
            ));
        }
        self.next_rev = self.next_rev.max(rev + 1);
        self.checked.progress += 1;
        Ok(())
    }

    /// The watcher was canceled as compacted at `compact_rev`: due only if it wanted history
    /// below it. A client resumes from `compact_rev` (what it lost before is gone).
    pub fn compacted(&mut self, compact_rev: i64) -> Result<(), WatchViolation> {
        if self.canceled {
            return Err(violation(
                Guarantee::Compaction,
                "canceled as compacted twice".to_string(),
            ));
        }
        if self.next_rev >= compact_rev {
            return Err(violation(
                Guarantee::Compaction,
                format!(
                    "canceled as compacted at {compact_rev} although it wants revision {} on",
                    self.next_rev
                ),
            ));
        }
        if let Some(compacted) = self.must_compact
            && compact_rev < compacted
        {
            return Err(violation(
                Guarantee::Compaction,
                format!(
                    "canceled as compacted at {compact_rev}, the store had compacted at {compacted}"
                ),
            ));
        }
        self.canceled = true;
        self.checked.compacted += 1;
        Ok(())
    }
}

/// Whether `event` may be missing from a watcher's catch-up because the store compacted at
/// `compacted`: a deletion at the compacted revision itself. Compacting at a revision drops
/// the tombstones at it, so a watcher that starts there (not below, so not canceled) misses
/// them: etcd did the same until 3.5.15 and 3.4.33 (etcd issues 17780 and 18089, fixed by
/// keeping such tombstones, etcd PR 18274); etcd-rs's key index still drops them. Tolerated
/// and counted, so that the other checks run; the day the store keeps them this goes.
pub fn lost_to_compaction(event: &Event, compacted: i64) -> bool {
    event.r#type == EventType::Delete as i32 && mod_rev(event) <= compacted
}

/// `event` as the history holds it: without `prev_kv`.
fn strip(event: &Event) -> Event {
    Event {
        prev_kv: None,
        ..event.clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn put(key: &str, value: &str, rev: i64, version: i64, create: i64) -> Event {
        Event {
            r#type: EventType::Put as i32,
            kv: Some(KeyValue {
                key: key.into(),
                value: value.into(),
                create_revision: create,
                mod_revision: rev,
                version,
                lease: 0,
            }),
            prev_kv: None,
        }
    }

    fn delete(key: &str, rev: i64) -> Event {
        Event {
            r#type: EventType::Delete as i32,
            kv: Some(KeyValue {
                key: key.into(),
                mod_revision: rev,
                ..KeyValue::default()
            }),
            prev_kv: None,
        }
    }

    /// a=1@2, b=1@2 (one txn), a=2@3, a deleted@4, b=2@5.
    fn history() -> History {
        let mut h = History::new();
        h.record(&[put("a", "1", 2, 1, 2), put("b", "1", 2, 1, 2)])
            .expect("record");
        h.record(&[
            put("a", "2", 3, 2, 2),
            delete("a", 4),
            put("b", "2", 5, 2, 2),
        ])
        .expect("record");
        h
    }

    fn all() -> KeyRange {
        KeyRange::prefix(b"")
    }

    #[test]
    fn a_faithful_delivery_passes_and_a_resumption_continues() {
        let h = history();
        let mut w = Watch::new(all(), false, 2, 0);
        w.events(&h, 3, &[put("a", "1", 2, 1, 2), put("b", "1", 2, 1, 2)], 0)
            .expect("rev 2");
        w.progress(&h, 3, 0).expect_err("rev 3 is not delivered");
        w.events(&h, 4, &[put("a", "2", 3, 2, 2), delete("a", 4)], 0)
            .expect("revs 3-4");
        w.progress(&h, 4, 0)
            .expect("progress at the last delivered");
        // Resumed elsewhere from the next revision.
        let mut resumed = Watch::new(all(), false, w.next_rev(), 0);
        resumed
            .events(&h, 5, &[put("b", "2", 5, 2, 2)], 0)
            .expect("rev 5");
        assert_eq!(resumed.checked.events, 1);
        // Only the key: its events alone.
        let mut one = Watch::new(
            KeyRange {
                key: b"b".to_vec(),
                end: Vec::new(),
            },
            true,
            1,
            0,
        );
        let mut with_prev = put("b", "2", 5, 2, 2);
        with_prev.prev_kv = h.value_at(b"b", 4).cloned();
        one.events(&h, 5, &[put("b", "1", 2, 1, 2), with_prev], 0)
            .expect("b's events with prev_kv");
    }

    #[test]
    fn each_broken_guarantee_is_named() {
        let h = history();
        let kind = |r: Result<(), WatchViolation>| r.expect_err("a violation").guarantee;
        // Atomic: one of revision 2's two events.
        let mut w = Watch::new(all(), false, 2, 0);
        assert_eq!(
            kind(w.events(&h, 2, &[put("a", "1", 2, 1, 2)], 0)),
            Guarantee::Atomic
        );
        // Reliable: revision 2 skipped.
        let mut w = Watch::new(all(), false, 2, 0);
        assert_eq!(
            kind(w.events(&h, 3, &[put("a", "2", 3, 2, 2)], 0)),
            Guarantee::Reliable
        );
        // Unique: revision 3 again.
        let mut w = Watch::new(all(), false, 3, 0);
        w.events(&h, 3, &[put("a", "2", 3, 2, 2)], 0)
            .expect("rev 3");
        assert_eq!(
            kind(w.events(&h, 3, &[put("a", "2", 3, 2, 2)], 0)),
            Guarantee::Unique
        );
        // Ordered: 4 before 3 in one response.
        let mut w = Watch::new(all(), false, 3, 0);
        assert_eq!(
            kind(w.events(&h, 4, &[delete("a", 4), put("a", "2", 3, 2, 2)], 0)),
            Guarantee::Ordered
        );
        // Consistent: a value the history does not hold, and a wrong prev_kv.
        let mut w = Watch::new(all(), false, 3, 0);
        assert_eq!(
            kind(w.events(&h, 3, &[put("a", "9", 3, 2, 2)], 0)),
            Guarantee::Consistent
        );
        let mut w = Watch::new(all(), true, 3, 0);
        let mut wrong = put("a", "2", 3, 2, 2);
        wrong.prev_kv = h.value_at(b"b", 2).cloned();
        assert_eq!(kind(w.events(&h, 3, &[wrong], 0)), Guarantee::Consistent);
        // A missing prev_kv is fine only once compacted.
        let mut w = Watch::new(all(), true, 3, 0);
        assert_eq!(
            kind(w.events(&h, 3, &[put("a", "2", 3, 2, 2)], 0)),
            Guarantee::Consistent
        );
        let mut w = Watch::new(all(), true, 3, 0);
        w.events(&h, 3, &[put("a", "2", 3, 2, 2)], 3)
            .expect("prev compacted");
        // Bookmarkable: behind a delivered event, ahead of an undelivered one.
        let mut w = Watch::new(all(), false, 3, 0);
        w.events(&h, 4, &[put("a", "2", 3, 2, 2), delete("a", 4)], 0)
            .expect("3-4");
        assert_eq!(kind(w.progress(&h, 2, 0)), Guarantee::Bookmarkable);
        assert_eq!(kind(w.progress(&h, 5, 0)), Guarantee::Bookmarkable);
        // Compaction: due only below the compacted revision; and a watch from a compacted
        // revision must get it.
        let mut w = Watch::new(all(), false, 4, 0);
        assert_eq!(kind(w.compacted(4)), Guarantee::Compaction);
        let mut w = Watch::new(all(), false, 3, 0);
        w.compacted(4).expect("due");
        assert!(w.canceled());
        let mut w = Watch::new(all(), false, 2, 4);
        assert_eq!(
            kind(w.events(&h, 5, &[put("b", "2", 5, 2, 2)], 0)),
            Guarantee::Compaction
        );
    }

    #[test]
    fn another_members_different_revision_is_refused() {
        let mut h = history();
        h.record(&[put("a", "2", 3, 2, 2)]).expect("the same again");
        h.record(&[put("a", "3", 3, 2, 2)])
            .expect_err("another value at revision 3");
        assert_eq!(h.head(), 5);
        assert_eq!(h.value_at(b"a", 4), None);
        assert_eq!(
            h.value_at(b"a", 3).map(|kv| kv.value.clone()),
            Some(b"2".to_vec())
        );
        assert_eq!(KeyRange::prefix(b"key-").end, b"key.".to_vec());
    }
}
