//! Large values written lately, kept in memory for the reads that follow them
//! ([`RecentValues`]).
//!
//! A stored key-value of a few KiB or more has a page of the backend to itself (redb's pages
//! come in powers of two: an 8 KiB Kubernetes node takes 16 KiB), and the backend's page cache
//! keeps pages by how lately they were read. One LIST of a large resource (150,000 pods, most
//! of a GiB) goes through that cache and leaves nothing else in it, so the LIST of the 5,000
//! nodes that follows reads every node's page from the file again: a read system call, a
//! zeroed buffer and a copy per node, where etcd's bbolt reads its memory-mapped file in place.
//!
//! The objects such LISTs and watchers read most are the ones written lately (in the kube mix
//! of `bench kube`, each node's status every half minute; kubelets report it every 10 s, or in
//! recent Kubernetes when it changes and every 5 minutes). This keeps the last [`BUDGET`] bytes of large
//! key-values the writer stored, by revision, in the order they were written, whatever is read
//! meanwhile: a scan of older data cannot push them out. A revision's stored bytes never change
//! (a compaction only removes them, and then no index lookup names them), so an entry is never
//! stale; the oldest go first once the budget is reached.
//!
//! Small values are not kept: several share a page, which the backend's cache serves well.
//!
//! Memory: the values are copied into chunks of [`CHUNK`] bytes, filled in revision order and
//! freed whole once their last value is dropped (values go oldest first, so a chunk's go
//! together): kept one allocation each among the writer's short-lived ones of the same size,
//! they held twice their bytes in the allocator's partly used slabs. And a value goes after
//! [`MAX_AGE`] whatever the budget, at the first commit after that or the store's next periodic
//! commit round (every batch interval, writes or not), so that a member whose writes of large
//! values, or all its writes, have stopped gives the memory back.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use parking_lot::RwLock;

use crate::revision::Revision;

/// Stored key-values of at least this many bytes are kept: about where two no longer fit one
/// 4 KiB page of the backend.
pub(crate) const LARGE: usize = 2048;
/// Bytes of key-values kept at most (each counted with [`ENTRY_OVERHEAD`]). At the write mix of
/// 5,000 Kubernetes nodes (about 2 MB/s of large values) this holds the last half minute, one
/// round of node status updates.
pub(crate) const BUDGET: usize = 64 << 20;
/// How long a value is kept at most.
pub(crate) const MAX_AGE: Duration = Duration::from_secs(60);
/// Bytes of one chunk of kept values; a value larger than a quarter of it is kept on its own.
const CHUNK: usize = 1 << 20;
/// Bytes counted for an entry beside its value: the revision, the handle, the time.
const ENTRY_OVERHEAD: usize = 64;

/// What [`RecentValues::lookup`] found: the kept value of each revision asked for, by its
/// position. Empty when none is kept (the common case of small values), so a range of many
/// keys allocates nothing for it.
#[derive(Default)]
pub(crate) struct Kept(Vec<Option<Bytes>>);

impl Kept {
    /// The kept value of the `i`-th revision asked for.
    pub(crate) fn get(&self, i: usize) -> Option<&Bytes> {
        self.0.get(i).and_then(Option::as_ref)
    }

    /// Whether no revision asked for is kept.
    #[cfg(test)]
    pub(crate) fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

/// Large key-values by revision, the latest [`BUDGET`] bytes of them (module docs).
#[derive(Default)]
pub(crate) struct RecentValues {
    inner: RwLock<Entries>,
}

#[derive(Default)]
struct Entries {
    /// In revision order, oldest first, each with when it was kept.
    values: VecDeque<(Revision, Bytes, Instant)>,
    /// Bytes counted for `values`.
    bytes: usize,
    /// The chunk values are copied into: its free capacity, the chunk shared with the values
    /// already in it.
    chunk: BytesMut,
}

impl Entries {
    /// `value` copied into the current chunk (a new one when it has no room).
    fn copy(&mut self, value: &[u8]) -> Bytes {
        if value.len() > CHUNK / 4 {
            return Bytes::copy_from_slice(value);
        }
        if self.chunk.capacity() < value.len() {
            self.chunk = BytesMut::with_capacity(CHUNK);
        }
        self.chunk.extend_from_slice(value);
        self.chunk.split().freeze()
    }

    fn reset(&mut self) {
        self.values.clear();
        self.bytes = 0;
    }

    fn pop_oldest(&mut self) {
        if let Some((_, value, _)) = self.values.pop_front() {
            self.bytes -= value.len() + ENTRY_OVERHEAD;
        }
    }

    fn oldest_expired(&self, now: Instant) -> bool {
        self.values
            .front()
            .is_some_and(|(_, _, kept)| now.saturating_duration_since(*kept) >= MAX_AGE)
    }
}

impl RecentValues {
    /// `value` copied into the chunk kept values share (module docs), for [`record`]. The
    /// writer copies each large value here as it stores it, and hands the stored bytes
    /// themselves to the backend: one copy instead of two.
    ///
    /// [`record`]: RecentValues::record
    pub(crate) fn keep(&self, value: &[u8]) -> Bytes {
        self.inner.write().copy(value)
    }

    /// Keeps `written` (in revision order, all after what is kept; each value from
    /// [`keep`](RecentValues::keep)), dropping the oldest beyond the budget and those kept
    /// longer than [`MAX_AGE`]. Called with each commit, also one that wrote no large value.
    pub(crate) fn record(&self, written: &[(Revision, Bytes)]) {
        self.record_at(written, Instant::now());
    }

    /// Drops the values kept longer than [`MAX_AGE`] at `now` (the store's periodic commit
    /// calls it, so that values go when writes have stopped too).
    pub(crate) fn expire(&self, now: Instant) {
        self.record_at(&[], now);
    }

    fn record_at(&self, written: &[(Revision, Bytes)], now: Instant) {
        if written.is_empty() && !self.inner.read().oldest_expired(now) {
            return;
        }
        let mut inner = self.inner.write();
        for (rev, value) in written {
            // Revisions only grow; a store replaced under us starts over.
            if inner.values.back().is_some_and(|(last, _, _)| last >= rev) {
                inner.reset();
            }
            inner.bytes += value.len() + ENTRY_OVERHEAD;
            inner.values.push_back((*rev, value.clone(), now));
        }
        while inner.bytes > BUDGET || inner.oldest_expired(now) {
            inner.pop_oldest();
        }
    }

    /// The kept value of each of `revs`, under one short lock.
    pub(crate) fn lookup(&self, revs: &[Revision]) -> Kept {
        let inner = self.inner.read();
        let Some((oldest, _, _)) = inner.values.front() else {
            return Kept::default();
        };
        if !revs.iter().any(|rev| rev >= oldest) {
            return Kept::default();
        }
        Kept(
            revs.iter()
                .map(|rev| {
                    inner
                        .values
                        .binary_search_by(|(kept, _, _)| kept.cmp(rev))
                        .ok()
                        .map(|at| inner.values[at].1.clone())
                })
                .collect(),
        )
    }

    /// Forgets everything (the store's contents were replaced).
    pub(crate) fn clear(&self) {
        let mut inner = self.inner.write();
        inner.reset();
        inner.chunk = BytesMut::new();
    }

    #[cfg(test)]
    pub(crate) fn bytes(&self) -> usize {
        self.inner.read().bytes
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn value(len: usize, fill: u8) -> Bytes {
        Bytes::from(vec![fill; len])
    }

    #[test]
    fn a_kept_value_is_found_by_its_revision_and_others_are_not() {
        let recent = RecentValues::default();
        recent.record(&[
            (Revision::new(5, 0), value(LARGE, 1)),
            (Revision::new(5, 1), value(LARGE, 2)),
            (Revision::new(7, 0), value(LARGE, 3)),
        ]);
        let found = recent.lookup(&[
            Revision::new(4, 0),
            Revision::new(5, 1),
            Revision::new(6, 0),
            Revision::new(7, 0),
            Revision::new(8, 0),
        ]);
        let fills: Vec<Option<u8>> = (0..5).map(|i| found.get(i).map(|b| b[0])).collect();
        assert_eq!(fills, vec![None, Some(2), None, Some(3), None]);
    }

    #[test]
    fn the_oldest_values_go_once_the_budget_is_reached() {
        let recent = RecentValues::default();
        let len = 1 << 20;
        let count = BUDGET / len + 8;
        for main in 1..=count as i64 {
            recent.record(&[(Revision::new(main, 0), value(len, main as u8))]);
        }
        assert!(recent.bytes() <= BUDGET, "{} kept", recent.bytes());
        let found = recent.lookup(&[Revision::new(1, 0), Revision::new(count as i64, 0)]);
        assert!(
            found.get(0).is_none(),
            "the first value outlived the budget"
        );
        assert_eq!(found.get(1).map(|b| b[0]), Some(count as u8));
    }

    #[test]
    fn a_revision_that_goes_back_starts_the_record_over() {
        let recent = RecentValues::default();
        recent.record(&[(Revision::new(9, 0), value(LARGE, 9))]);
        recent.record(&[(Revision::new(3, 0), value(LARGE, 3))]);
        let found = recent.lookup(&[Revision::new(9, 0), Revision::new(3, 0)]);
        assert!(found.get(0).is_none());
        assert_eq!(found.get(1).map(|b| b[0]), Some(3));
        recent.clear();
        assert!(recent.lookup(&[Revision::new(3, 0)]).get(0).is_none());
        assert_eq!(recent.bytes(), 0);
    }

    #[test]
    fn values_go_after_their_age_at_the_next_commit() {
        let recent = RecentValues::default();
        let start = Instant::now();
        recent.record_at(&[(Revision::new(2, 0), value(LARGE, 2))], start);
        recent.record_at(
            &[(Revision::new(3, 0), value(LARGE, 3))],
            start + MAX_AGE / 2,
        );
        // A commit without large values still lets the oldest go once it is old enough.
        recent.record_at(&[], start + MAX_AGE - Duration::from_millis(1));
        assert!(recent.lookup(&[Revision::new(2, 0)]).get(0).is_some());
        recent.record_at(&[], start + MAX_AGE);
        let found = recent.lookup(&[Revision::new(2, 0), Revision::new(3, 0)]);
        assert!(found.get(0).is_none(), "kept past its age");
        assert!(found.get(1).is_some());
        recent.record_at(&[], start + MAX_AGE * 2);
        assert_eq!(recent.bytes(), 0);
    }

    #[test]
    fn values_are_copied_whole_into_shared_chunks() {
        let recent = RecentValues::default();
        let revs: Vec<Revision> = (1..=40).map(|main| Revision::new(main, 0)).collect();
        // Values of several sizes, one larger than a chunk's quarter (kept on its own).
        let written: Vec<(Revision, Bytes)> = revs
            .iter()
            .map(|rev| {
                let len = if rev.main == 20 {
                    CHUNK / 2
                } else {
                    LARGE + 997 * rev.main as usize
                };
                (*rev, value(len, rev.main as u8))
            })
            .collect();
        let kept: Vec<(Revision, Bytes)> = written
            .iter()
            .map(|(rev, value)| (*rev, recent.keep(value)))
            .collect();
        recent.record(&kept);
        // The values of a chunk's quarter or less (under 1 MiB together) lie one after the
        // other in one chunk; the larger one is elsewhere.
        let small: Vec<&Bytes> = kept
            .iter()
            .filter(|(rev, _)| rev.main != 20)
            .map(|(_, value)| value)
            .collect();
        for pair in small.windows(2) {
            assert_eq!(
                pair[0].as_ptr() as usize + pair[0].len(),
                pair[1].as_ptr() as usize,
                "a value not right after its predecessor in their chunk"
            );
        }
        let found = recent.lookup(&revs);
        for (i, (_, want)) in written.iter().enumerate() {
            assert_eq!(found.get(i).map(|b| &b[..]), Some(&want[..]));
        }
        // Nothing asked for is kept: nothing is allocated for the answer.
        assert!(recent.lookup(&[Revision::new(0, 5)]).is_empty());
    }
}
