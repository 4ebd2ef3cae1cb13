//! The history of one key (etcd `server/storage/mvcc/key_index.go`).
//!
//! A key lives through *generations*: a generation starts when the key is created and ends
//! with the tombstone that deletes it. Each generation lists the revisions that modified the
//! key. The last generation is the current one; it is empty while the key does not exist.
//!
//! Invariants:
//! - revisions strictly increase across all generations;
//! - every generation but the last is non-empty and ends with its tombstone;
//! - the last generation never holds a tombstone.

use crate::revision::Revision;

#[derive(Clone, Debug, Default, PartialEq, Eq)]
struct Generation {
    /// Number of revisions made in this generation (its tombstone included), counted from its
    /// creation, even those compacted away: the key's `version` at its newest put.
    version: i64,
    /// The revision that created the key in this generation.
    created: Revision,
    /// Revisions of the modifications still kept; the last of a closed generation is its
    /// tombstone.
    revs: Vec<Revision>,
}

/// What [`KeyIndex::get`] finds for a key at a revision.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Found {
    /// The revision that last modified the key at or before the asked revision.
    pub modified: Revision,
    /// The revision that created the key's generation.
    pub created: Revision,
    /// The key's version at that point.
    pub version: i64,
}

/// Push onto a vector that starts with room for one element: most keys are written once or a
/// few times, and the index holds one of these per key, so the default first allocation (room
/// for four) would multiply the index's memory.
fn push_compact<T>(v: &mut Vec<T>, item: T) {
    if v.capacity() == 0 {
        v.reserve_exact(1);
    }
    v.push(item);
}

/// One key's modification history.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct KeyIndex {
    generations: Vec<Generation>,
    /// The main revision of the newest modification, negated when it deleted the key (0 while
    /// nothing is recorded): whether the key exists at or after it is read here, beside the
    /// index map's own nodes, without following the generations' pointers (counting a range
    /// of ten million keys, a page of a paginated scan, took a second that way).
    newest: i64,
}

impl KeyIndex {
    /// Record a put at `rev`.
    pub fn put(&mut self, rev: Revision) {
        if self.generations.is_empty() {
            push_compact(&mut self.generations, Generation::default());
        }
        let Some(current) = self.generations.last_mut() else {
            return;
        };
        if current.revs.is_empty() {
            current.created = rev;
        }
        push_compact(&mut current.revs, rev);
        current.version += 1;
        self.newest = rev.main;
    }

    /// Rebuild state while restoring from the backend: a put at `rev` of a value that records
    /// its own create revision and version (earlier revisions may have been compacted away).
    pub fn restore(&mut self, rev: Revision, created: Revision, version: i64) {
        if self.generations.is_empty() {
            push_compact(&mut self.generations, Generation::default());
        }
        let Some(current) = self.generations.last_mut() else {
            return;
        };
        if current.revs.is_empty() {
            current.created = created;
        }
        push_compact(&mut current.revs, rev);
        current.version = version;
        self.newest = rev.main;
    }

    /// Record the deletion of the key at `rev`. Returns false (and changes nothing) when the
    /// key does not currently exist.
    pub fn tombstone(&mut self, rev: Revision) -> bool {
        match self.generations.last() {
            Some(current) if !current.revs.is_empty() => {}
            _ => return false,
        }
        self.put(rev);
        self.generations.push(Generation::default());
        self.newest = -rev.main;
        true
    }

    /// Rebuild state while restoring from the backend: the deletion of the key at `rev`. A
    /// tombstone whose generation's puts are gone (a compaction stopped midway, after
    /// deleting them and before deleting it) is kept as a generation of its own, so that the
    /// compaction, finished on open, drops it too (etcd's restore keeps it likewise).
    pub fn restore_tombstone(&mut self, rev: Revision) {
        if self.tombstone(rev) {
            return;
        }
        self.put(rev);
        self.generations.push(Generation::default());
        self.newest = -rev.main;
    }

    /// Whether the key exists at the newest revision.
    pub fn is_live(&self) -> bool {
        self.newest > 0
    }

    /// Whether the key exists at revision `at` (`get(at).is_some()`), without a walk of its
    /// history when `at` is at or after its newest modification.
    pub fn visible_at(&self, at: i64) -> bool {
        if self.newest != 0 && at >= self.newest.abs() {
            return self.newest > 0;
        }
        self.get(at).is_some()
    }

    /// Whether nothing at all is recorded (the key can be dropped from the index).
    pub fn is_empty(&self) -> bool {
        self.generations.iter().all(|g| g.revs.is_empty())
    }

    /// The newest modification of the key (put or tombstone), if any.
    pub fn last_modified(&self) -> Option<Revision> {
        self.generations
            .iter()
            .rev()
            .find_map(|g| g.revs.last().copied())
    }

    /// The state of the key as of revision `at` (`at` >= 1), or None when it did not exist then.
    pub fn get(&self, at: i64) -> Option<Found> {
        let last = self.generations.len().checked_sub(1)?;
        for (i, generation) in self.generations.iter().enumerate().rev() {
            let Some(first) = generation.revs.first() else {
                continue;
            };
            if i != last {
                // A closed generation: its last revision is the tombstone.
                let tombstone = generation.revs.last()?;
                if tombstone.main <= at {
                    return None;
                }
            }
            if first.main > at {
                continue;
            }
            // The newest revision at or before `at` in this generation.
            let pos = generation.revs.partition_point(|r| r.main <= at);
            // `version` counts every revision of the generation, the tombstone included.
            let newer = (generation.revs.len() - pos) as i64;
            let modified = generation.revs[pos - 1];
            return Some(Found {
                modified,
                created: generation.created,
                version: generation.version - newer,
            });
        }
        None
    }

    /// The changes of the key's existence after revision `after`, oldest first: a creation at
    /// main revision `m` as `m`, a deletion as `-m`. What a chunk of the index keeps to count
    /// its keys at a past revision (`kvstore::index`). A generation's creation is known even
    /// when compaction dropped its revision; a tombstone compacted away is at or before the
    /// compacted revision, below any revision a range may read at.
    pub fn existence_changes_after(&self, after: i64) -> impl Iterator<Item = i64> + '_ {
        let last = self.generations.len().saturating_sub(1);
        self.generations
            .iter()
            .enumerate()
            .filter(|(_, generation)| !generation.revs.is_empty())
            .flat_map(move |(i, generation)| {
                let created = Some(generation.created.main).filter(|&m| m > after);
                let deleted = generation
                    .revs
                    .last()
                    .filter(|_| i != last)
                    .map(|tombstone| tombstone.main)
                    .filter(|&m| m > after)
                    .map(|m| -m);
                created.into_iter().chain(deleted)
            })
    }

    /// Every revision after `since` (exclusive) that modified the key, puts and tombstones,
    /// with whether each is a tombstone. Used by watch catch-up and hashing.
    pub fn revisions_since(&self, since: i64) -> Vec<(Revision, bool)> {
        let last = self.generations.len().saturating_sub(1);
        let mut out = Vec::new();
        for (i, generation) in self.generations.iter().enumerate() {
            let n = generation.revs.len();
            for (j, rev) in generation.revs.iter().enumerate() {
                if rev.main > since {
                    out.push((*rev, i != last && j + 1 == n));
                }
            }
        }
        out
    }

    /// Compact the history at revision `at`: keep, per key, only the newest revision at or
    /// before `at` of the generation alive at `at` and everything after; a generation whose
    /// tombstone is at or before `at` disappears with its tombstone. Returns the revisions
    /// dropped (with whether each was a tombstone) so their values can be deleted.
    pub fn compact(&mut self, at: i64) -> Vec<(Revision, bool)> {
        let mut dropped = Vec::new();
        let last = self.generations.len().saturating_sub(1);
        let mut keep_from_gen = 0;
        for (i, generation) in self.generations.iter().enumerate() {
            let closed_before = i != last
                && generation
                    .revs
                    .last()
                    .is_some_and(|tombstone| tombstone.main <= at);
            if closed_before {
                let n = generation.revs.len();
                for (j, rev) in generation.revs.iter().enumerate() {
                    dropped.push((*rev, j + 1 == n));
                }
                keep_from_gen = i + 1;
            } else {
                break;
            }
        }
        self.generations.drain(..keep_from_gen);
        if let Some(generation) = self.generations.first_mut() {
            let pos = generation.revs.partition_point(|r| r.main <= at);
            if pos > 1 {
                for rev in generation.revs.drain(..pos - 1) {
                    dropped.push((rev, false));
                }
                generation.revs.shrink_to_fit();
            }
        }
        if !dropped.is_empty() {
            self.generations.shrink_to_fit();
        }
        self.newest = match self.last_modified() {
            Some(rev) if self.generations.last().is_some_and(|g| !g.revs.is_empty()) => rev.main,
            Some(rev) => -rev.main,
            None => 0,
        };
        dropped
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rev(main: i64) -> Revision {
        Revision::new(main, 0)
    }

    /// put@2 put@4 del@6 put@8 put@10: two generations.
    fn sample() -> KeyIndex {
        let mut ki = KeyIndex::default();
        ki.put(rev(2));
        ki.put(rev(4));
        assert!(ki.tombstone(rev(6)));
        ki.put(rev(8));
        ki.put(rev(10));
        ki
    }

    #[test]
    fn visible_at_agrees_with_get_before_and_after_compaction() {
        let check = |ki: &KeyIndex| {
            for at in 0..=12 {
                assert_eq!(ki.visible_at(at), ki.get(at).is_some(), "at {at}: {ki:?}");
            }
            assert_eq!(ki.is_live(), ki.get(i64::MAX).is_some());
        };
        let mut ki = sample();
        check(&ki);
        ki.compact(5);
        check(&ki);
        ki.compact(9);
        check(&ki);
        let mut deleted = sample();
        assert!(deleted.tombstone(rev(11)));
        check(&deleted);
        deleted.compact(7);
        check(&deleted);
        check(&KeyIndex::default());
    }

    #[test]
    fn get_walks_generations() {
        let ki = sample();
        assert_eq!(ki.get(1), None);
        assert_eq!(
            ki.get(2),
            Some(Found {
                modified: rev(2),
                created: rev(2),
                version: 1
            })
        );
        assert_eq!(
            ki.get(5),
            Some(Found {
                modified: rev(4),
                created: rev(2),
                version: 2
            })
        );
        assert_eq!(ki.get(6), None);
        assert_eq!(ki.get(7), None);
        assert_eq!(
            ki.get(8),
            Some(Found {
                modified: rev(8),
                created: rev(8),
                version: 1
            })
        );
        assert_eq!(
            ki.get(100),
            Some(Found {
                modified: rev(10),
                created: rev(8),
                version: 2
            })
        );
        assert!(ki.is_live());
    }

    #[test]
    fn tombstone_of_missing_key_is_refused() {
        let mut ki = KeyIndex::default();
        assert!(!ki.tombstone(rev(1)));
        ki.put(rev(2));
        assert!(ki.tombstone(rev(3)));
        assert!(!ki.tombstone(rev(4)));
        assert!(!ki.is_live());
        assert_eq!(ki.last_modified(), Some(rev(3)));
    }

    #[test]
    fn compaction_keeps_what_is_visible() {
        let mut ki = sample();
        assert_eq!(ki.compact(3), vec![]);
        let mut ki4 = sample();
        assert_eq!(ki4.compact(4), vec![(rev(2), false)]);
        assert_eq!(ki4.get(4).map(|f| f.version), Some(2));
        let dropped = ki.compact(7);
        assert_eq!(
            dropped,
            vec![(rev(2), false), (rev(4), false), (rev(6), true)]
        );
        assert_eq!(
            ki.get(9),
            Some(Found {
                modified: rev(8),
                created: rev(8),
                version: 1
            })
        );
        let dropped = ki.compact(10);
        assert_eq!(dropped, vec![(rev(8), false)]);
        assert_eq!(ki.get(10).map(|f| f.version), Some(2));

        let mut deleted = KeyIndex::default();
        deleted.put(rev(1));
        deleted.tombstone(rev(2));
        assert_eq!(deleted.compact(2), vec![(rev(1), false), (rev(2), true)]);
        assert!(deleted.is_empty());
    }

    #[test]
    fn revisions_since_marks_tombstones() {
        let ki = sample();
        assert_eq!(
            ki.revisions_since(3),
            vec![
                (rev(4), false),
                (rev(6), true),
                (rev(8), false),
                (rev(10), false)
            ]
        );
    }
}
