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
//! The objects such LISTs and watchers read most are the ones written lately (nodes report
//! their status every few seconds to a minute). This keeps the last [`BUDGET`] bytes of large
//! key-values the writer stored, by revision, in the order they were written, whatever is read
//! meanwhile: a scan of older data cannot push them out. A revision's stored bytes never change
//! (a compaction only removes them, and then no index lookup names them), so an entry is never
//! stale; the oldest go first once the budget is reached.
//!
//! Small values are not kept: several share a page, which the backend's cache serves well.

use std::collections::VecDeque;

use bytes::Bytes;
use parking_lot::RwLock;

use crate::revision::Revision;

/// Stored key-values of at least this many bytes are kept: about where two no longer fit one
/// 4 KiB page of the backend.
pub(crate) const LARGE: usize = 2048;
/// Bytes of key-values kept at most (each counted with [`ENTRY_OVERHEAD`]). At the write mix of
/// 5,000 Kubernetes nodes (about 2 MB/s of large values) this holds the last half minute, one
/// round of node status updates.
pub(crate) const BUDGET: usize = 64 << 20;
/// Bytes counted for an entry beside its value: the revision, the handle, the allocation.
const ENTRY_OVERHEAD: usize = 64;

/// Large key-values by revision, the latest [`BUDGET`] bytes of them (module docs).
#[derive(Default)]
pub(crate) struct RecentValues {
    inner: RwLock<Entries>,
}

#[derive(Default)]
struct Entries {
    /// In revision order, oldest first.
    values: VecDeque<(Revision, Bytes)>,
    /// Bytes counted for `values`.
    bytes: usize,
}

impl RecentValues {
    /// Keeps `written` (in revision order, all after what is kept), dropping the oldest beyond
    /// the budget.
    pub(crate) fn record(&self, written: Vec<(Revision, Bytes)>) {
        if written.is_empty() {
            return;
        }
        let mut inner = self.inner.write();
        for (rev, value) in written {
            // Revisions only grow; a store replaced under us starts over.
            if inner.values.back().is_some_and(|(last, _)| *last >= rev) {
                inner.values.clear();
                inner.bytes = 0;
            }
            inner.bytes += value.len() + ENTRY_OVERHEAD;
            inner.values.push_back((rev, value));
        }
        while inner.bytes > BUDGET {
            let Some((_, value)) = inner.values.pop_front() else {
                break;
            };
            inner.bytes -= value.len() + ENTRY_OVERHEAD;
        }
    }

    /// The kept value of each of `revs` (`None` where it is not kept), under one short lock.
    pub(crate) fn lookup(&self, revs: &[Revision]) -> Vec<Option<Bytes>> {
        let inner = self.inner.read();
        let oldest = match inner.values.front() {
            Some((rev, _)) => *rev,
            None => return vec![None; revs.len()],
        };
        revs.iter()
            .map(|rev| {
                if *rev < oldest {
                    return None;
                }
                inner
                    .values
                    .binary_search_by(|(kept, _)| kept.cmp(rev))
                    .ok()
                    .map(|at| inner.values[at].1.clone())
            })
            .collect()
    }

    /// Forgets everything (the store's contents were replaced).
    pub(crate) fn clear(&self) {
        let mut inner = self.inner.write();
        inner.values.clear();
        inner.bytes = 0;
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
        recent.record(vec![
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
        let fills: Vec<Option<u8>> = found.iter().map(|v| v.as_ref().map(|b| b[0])).collect();
        assert_eq!(fills, vec![None, Some(2), None, Some(3), None]);
    }

    #[test]
    fn the_oldest_values_go_once_the_budget_is_reached() {
        let recent = RecentValues::default();
        let len = 1 << 20;
        let count = BUDGET / len + 8;
        for main in 1..=count as i64 {
            recent.record(vec![(Revision::new(main, 0), value(len, main as u8))]);
        }
        assert!(recent.bytes() <= BUDGET, "{} kept", recent.bytes());
        let found = recent.lookup(&[Revision::new(1, 0), Revision::new(count as i64, 0)]);
        assert!(found[0].is_none(), "the first value outlived the budget");
        assert_eq!(found[1].as_ref().map(|b| b[0]), Some(count as u8));
    }

    #[test]
    fn a_revision_that_goes_back_starts_the_record_over() {
        let recent = RecentValues::default();
        recent.record(vec![(Revision::new(9, 0), value(LARGE, 9))]);
        recent.record(vec![(Revision::new(3, 0), value(LARGE, 3))]);
        let found = recent.lookup(&[Revision::new(9, 0), Revision::new(3, 0)]);
        assert!(found[0].is_none());
        assert_eq!(found[1].as_ref().map(|b| b[0]), Some(3));
        recent.clear();
        assert!(recent.lookup(&[Revision::new(3, 0)])[0].is_none());
        assert_eq!(recent.bytes(), 0);
    }
}
