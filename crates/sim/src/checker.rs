//! A linearizability checker for a history of single-key register operations (puts, deletes,
//! compare-and-sets and reads of one key each), in the manner of Wing & Gong's search with Lowe's memoization
//! (the algorithm Porcupine implements).
//!
//! Keys are independent registers, so the history is checked one key at a time (a history is
//! linearizable iff each key's sub-history is). For one key the search linearizes, one at a
//! time, an operation that no unlinearized operation strictly precedes (its invocation comes
//! before every unlinearized completion), if the register allows it from the state reached;
//! states already explored (the set of linearized operations and the register's value) are
//! remembered and not explored again. A write whose outcome is unknown (its client gave up)
//! has no completion: it may take effect at any point after its invocation, or never.
//!
//! The search is bounded: past [`Checker::budget`] explored states of one key it gives up and
//! says so ([`KeyVerdict::GaveUp`]) rather than run for ever.

use std::collections::{BTreeMap, HashSet};

/// What an operation did to, or saw of, its key.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Kind {
    /// Wrote this value.
    Put(u64),
    /// Deleted the key.
    Delete,
    /// Read the key and saw this value (`None`: no key).
    Get(Option<u64>),
    /// Wrote `new` if the key held `expect` (`None`: no key): a transaction comparing the
    /// value. `succeeded` is what it answered; `None` when unknown (no completion).
    Cas {
        /// The value compared against.
        expect: Option<u64>,
        /// The value written on success.
        new: u64,
        /// Whether the comparison held, as answered.
        succeeded: Option<bool>,
    },
}

/// One client operation of the history.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Operation {
    /// The client that ran it (for reports only).
    pub client: u64,
    /// The key.
    pub key: u64,
    /// What it did.
    pub kind: Kind,
    /// When it was invoked.
    pub invoke: u64,
    /// When it completed; `None` when its outcome is unknown (only writes may lack it).
    pub complete: Option<u64>,
}

/// The outcome for one key.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum KeyVerdict {
    /// A linearization exists.
    Linearizable,
    /// None exists.
    NotLinearizable,
    /// The search hit its budget.
    GaveUp,
}

/// A key whose history has no linearization.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Violation {
    /// The key.
    pub key: u64,
    /// Its operations, by invocation.
    pub operations: Vec<Operation>,
}

impl std::fmt::Display for Violation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        writeln!(f, "key {} has no linearization:", self.key)?;
        for op in &self.operations {
            let complete = op
                .complete
                .map_or_else(|| "?".to_string(), |c| c.to_string());
            writeln!(
                f,
                "  client {} {:?} [{}, {}]",
                op.client, op.kind, op.invoke, complete
            )?;
        }
        Ok(())
    }
}

/// What a whole check found.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Summary {
    /// Keys checked.
    pub keys: usize,
    /// Operations checked (reads without a completion are left out).
    pub operations: usize,
    /// Keys whose search hit the budget.
    pub gave_up: Vec<u64>,
    /// Explored states, over every key.
    pub states: usize,
}

/// The checker.
#[derive(Clone, Copy, Debug)]
pub struct Checker {
    /// Most states explored per key before giving up.
    pub budget: usize,
}

impl Default for Checker {
    fn default() -> Self {
        Checker { budget: 1_000_000 }
    }
}

impl Checker {
    /// Check a whole history. Reads without a completion say nothing and are left out.
    pub fn check(&self, history: &[Operation]) -> Result<Summary, Box<Violation>> {
        let mut by_key: BTreeMap<u64, Vec<Operation>> = BTreeMap::new();
        for op in history {
            if matches!(op.kind, Kind::Get(_)) && op.complete.is_none() {
                continue;
            }
            by_key.entry(op.key).or_default().push(op.clone());
        }
        let mut summary = Summary {
            keys: by_key.len(),
            ..Summary::default()
        };
        for (key, mut ops) in by_key {
            ops.sort_by_key(|op| (op.invoke, op.complete));
            summary.operations += ops.len();
            let (verdict, states) = self.check_key(&ops);
            summary.states += states;
            match verdict {
                KeyVerdict::Linearizable => {}
                KeyVerdict::GaveUp => summary.gave_up.push(key),
                KeyVerdict::NotLinearizable => {
                    return Err(Box::new(Violation {
                        key,
                        operations: ops,
                    }));
                }
            }
        }
        Ok(summary)
    }

    /// Check one key's operations, sorted by invocation; returns the verdict and the states
    /// explored.
    pub fn check_key(&self, ops: &[Operation]) -> (KeyVerdict, usize) {
        let mut search = Search {
            ops,
            done: vec![0u64; ops.len().div_ceil(64)],
            seen: HashSet::new(),
            budget: self.budget,
            completed_left: ops.iter().filter(|op| op.complete.is_some()).count(),
        };
        let verdict = match search.dfs(None) {
            Some(true) => KeyVerdict::Linearizable,
            Some(false) => KeyVerdict::NotLinearizable,
            None => KeyVerdict::GaveUp,
        };
        (verdict, search.seen.len())
    }
}

struct Search<'a> {
    ops: &'a [Operation],
    /// Bit set of linearized operations.
    done: Vec<u64>,
    /// Explored (linearized set, register value) pairs that led nowhere.
    seen: HashSet<(Vec<u64>, Option<u64>)>,
    budget: usize,
    /// Completed operations not linearized yet.
    completed_left: usize,
}

impl Search<'_> {
    fn is_done(&self, i: usize) -> bool {
        self.done[i / 64] & (1 << (i % 64)) != 0
    }

    fn flip(&mut self, i: usize) {
        self.done[i / 64] ^= 1 << (i % 64);
    }

    /// Some(true): a linearization of the rest exists from `state`; Some(false): none; None:
    /// out of budget.
    fn dfs(&mut self, state: Option<u64>) -> Option<bool> {
        // Writes of unknown outcome may never have happened.
        if self.completed_left == 0 {
            return Some(true);
        }
        if !self.seen.insert((self.done.clone(), state)) {
            return Some(false);
        }
        if self.seen.len() > self.budget {
            return None;
        }
        // No operation may go before one that completed before it was invoked.
        let horizon = (0..self.ops.len())
            .filter(|&i| !self.is_done(i))
            .filter_map(|i| self.ops[i].complete)
            .min()
            .unwrap_or(u64::MAX);
        for i in 0..self.ops.len() {
            let op = &self.ops[i];
            if op.invoke > horizon {
                // Sorted by invocation: nothing later is a candidate either.
                break;
            }
            if self.is_done(i) {
                continue;
            }
            let next = match op.kind {
                Kind::Put(value) => Some(value),
                Kind::Delete => None,
                Kind::Get(seen) if seen == state => state,
                Kind::Get(_) => continue,
                Kind::Cas {
                    expect,
                    new,
                    succeeded,
                } => match (succeeded, expect == state) {
                    (Some(true) | None, true) => Some(new),
                    (Some(false) | None, false) => state,
                    (Some(true), false) | (Some(false), true) => continue,
                },
            };
            let completed = op.complete.is_some();
            self.flip(i);
            if completed {
                self.completed_left -= 1;
            }
            let found = self.dfs(next);
            self.flip(i);
            if completed {
                self.completed_left += 1;
            }
            match found {
                Some(false) => {}
                other => return other,
            }
        }
        Some(false)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn op(client: u64, kind: Kind, invoke: u64, complete: Option<u64>) -> Operation {
        Operation {
            client,
            key: 1,
            kind,
            invoke,
            complete,
        }
    }

    fn verdict(ops: &[Operation]) -> bool {
        Checker::default().check(ops).is_ok()
    }

    #[test]
    fn accepts_a_sequential_history() {
        let ops = [
            op(1, Kind::Get(None), 0, Some(1)),
            op(1, Kind::Put(1), 2, Some(3)),
            op(2, Kind::Get(Some(1)), 4, Some(5)),
            op(1, Kind::Delete, 6, Some(7)),
            op(2, Kind::Get(None), 8, Some(9)),
        ];
        assert!(verdict(&ops));
    }

    #[test]
    fn accepts_concurrent_reads_that_see_either_side_of_a_write() {
        // The write runs [0, 10]; one read sees the old value, a later-invoked one the new,
        // and a read that follows the write's completion sees the new value.
        let ops = [
            op(1, Kind::Put(7), 0, Some(10)),
            op(2, Kind::Get(None), 1, Some(3)),
            op(3, Kind::Get(Some(7)), 4, Some(6)),
            op(2, Kind::Get(Some(7)), 11, Some(12)),
        ];
        assert!(verdict(&ops));
    }

    #[test]
    fn rejects_a_stale_read_after_a_completed_write() {
        let ops = [
            op(1, Kind::Put(1), 0, Some(1)),
            op(1, Kind::Put(2), 2, Some(3)),
            // Invoked after the second write completed, yet sees the first.
            op(2, Kind::Get(Some(1)), 4, Some(5)),
        ];
        assert!(!verdict(&ops));
    }

    #[test]
    fn rejects_two_reads_that_see_two_writes_in_opposite_orders() {
        // Two concurrent writes; client 3 sees 1 then 2, client 4 sees 2 then 1, and every
        // read overlaps both writes. No single order of the writes explains both.
        let ops = [
            op(1, Kind::Put(1), 0, Some(100)),
            op(2, Kind::Put(2), 0, Some(100)),
            op(3, Kind::Get(Some(1)), 10, Some(20)),
            op(3, Kind::Get(Some(2)), 30, Some(40)),
            op(4, Kind::Get(Some(2)), 10, Some(20)),
            op(4, Kind::Get(Some(1)), 30, Some(40)),
        ];
        assert!(!verdict(&ops));
        // Either reader alone is fine.
        assert!(verdict(&ops[..4]));
        let other = [
            ops[0].clone(),
            ops[1].clone(),
            ops[4].clone(),
            ops[5].clone(),
        ];
        assert!(verdict(&other));
    }

    #[test]
    fn rejects_a_value_nobody_wrote_and_a_read_from_the_future() {
        assert!(!verdict(&[op(1, Kind::Get(Some(9)), 0, Some(1))]));
        // The read completes before the write is invoked.
        let ops = [
            op(2, Kind::Get(Some(1)), 0, Some(1)),
            op(1, Kind::Put(1), 2, Some(3)),
        ];
        assert!(!verdict(&ops));
    }

    #[test]
    fn a_write_of_unknown_outcome_may_or_may_not_have_happened() {
        // Seen by a read: it happened.
        let seen = [
            op(1, Kind::Put(1), 0, None),
            op(2, Kind::Get(Some(1)), 5, Some(6)),
        ];
        assert!(verdict(&seen));
        // Not seen by any read: it may never have happened.
        let unseen = [
            op(1, Kind::Put(1), 0, None),
            op(2, Kind::Get(None), 5, Some(6)),
            op(2, Kind::Get(None), 7, Some(8)),
        ];
        assert!(verdict(&unseen));
        // But once seen it cannot be unseen without another write.
        let flicker = [
            op(1, Kind::Put(1), 0, None),
            op(2, Kind::Get(Some(1)), 5, Some(6)),
            op(2, Kind::Get(None), 7, Some(8)),
        ];
        assert!(!verdict(&flicker));
        // Nor can it take effect before it was invoked.
        let early = [
            op(2, Kind::Get(Some(1)), 0, Some(1)),
            op(1, Kind::Put(1), 2, None),
        ];
        assert!(!verdict(&early));
    }

    #[test]
    fn reads_without_a_completion_are_ignored_and_keys_are_independent() {
        let mut ops = vec![
            op(1, Kind::Put(1), 0, Some(1)),
            op(2, Kind::Get(Some(5)), 2, None),
        ];
        let mut other = op(3, Kind::Put(3), 0, Some(1));
        other.key = 2;
        ops.push(other);
        let mut read = op(3, Kind::Get(Some(3)), 2, Some(3));
        read.key = 2;
        ops.push(read);
        let summary = Checker::default().check(&ops).expect("linearizable");
        assert_eq!(summary.keys, 2);
        assert_eq!(summary.operations, 3);
        // A violation names its key.
        let mut stale = op(3, Kind::Get(None), 4, Some(5));
        stale.key = 2;
        ops.push(stale);
        let violation = Checker::default()
            .check(&ops)
            .expect_err("stale read on key 2");
        assert_eq!(violation.key, 2);
        assert!(violation.to_string().contains("key 2 has no linearization"));
    }

    #[test]
    fn compare_and_set_answers_must_match_the_register() {
        let cas = |expect, new, succeeded| Kind::Cas {
            expect,
            new,
            succeeded,
        };
        let ok = [
            op(1, Kind::Put(1), 0, Some(1)),
            op(1, cas(Some(1), 2, Some(true)), 2, Some(3)),
            op(2, cas(Some(1), 3, Some(false)), 4, Some(5)),
            op(2, Kind::Get(Some(2)), 6, Some(7)),
        ];
        assert!(verdict(&ops_of(&ok)));
        // A success although the key held another value.
        let lying = [
            op(1, Kind::Put(1), 0, Some(1)),
            op(1, cas(Some(5), 2, Some(true)), 2, Some(3)),
        ];
        assert!(!verdict(&lying));
        // A failure that wrote anyway.
        let leaky = [
            op(1, Kind::Put(1), 0, Some(1)),
            op(1, cas(Some(5), 2, Some(false)), 2, Some(3)),
            op(2, Kind::Get(Some(2)), 4, Some(5)),
        ];
        assert!(!verdict(&leaky));
        // Two successful compare-and-sets from the same value cannot both have happened.
        let both = [
            op(1, Kind::Put(1), 0, Some(1)),
            op(2, cas(Some(1), 2, Some(true)), 2, Some(10)),
            op(3, cas(Some(1), 3, Some(true)), 2, Some(10)),
        ];
        assert!(!verdict(&both));
        // One of unknown outcome may have happened, or not.
        let unknown = [
            op(1, Kind::Put(1), 0, Some(1)),
            op(2, cas(Some(1), 2, None), 2, None),
            op(3, Kind::Get(Some(2)), 4, Some(5)),
        ];
        assert!(verdict(&unknown));
        let unseen = [
            op(1, Kind::Put(1), 0, Some(1)),
            op(2, cas(Some(1), 2, None), 2, None),
            op(3, Kind::Get(Some(1)), 4, Some(5)),
        ];
        assert!(verdict(&unseen));
    }

    fn ops_of(ops: &[Operation]) -> Vec<Operation> {
        ops.to_vec()
    }

    #[test]
    fn a_tiny_budget_gives_up_instead_of_answering() {
        // Many concurrent writes and reads: more states than a budget of 3 allows.
        let mut ops: Vec<Operation> = (0..8).map(|i| op(i, Kind::Put(i), 0, Some(100))).collect();
        ops.push(op(9, Kind::Get(Some(0)), 101, Some(102)));
        let (verdict, _) = Checker { budget: 3 }.check_key(&ops);
        assert_eq!(verdict, KeyVerdict::GaveUp);
        let (verdict, _) = Checker::default().check_key(&ops);
        assert_eq!(verdict, KeyVerdict::Linearizable);
    }
}
