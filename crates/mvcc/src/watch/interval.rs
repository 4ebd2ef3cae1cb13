//! A map from distinct key ranges `[start, end)` to values that answers "which ranges hold this
//! key" without looking at the others (etcd's `pkg/adt` interval tree, used by its watcher
//! groups for range and prefix watchers).
//!
//! It is a treap ordered by `(start, end)`, each node also keeping the greatest `end` of its
//! subtree: a stab for key `p` skips every subtree whose ranges all end at or before `p`, and
//! every right subtree once a node starts after `p`, so it visits O(k log n) nodes for k hits.
//! Priorities come from a fixed sequence (splitmix64 of a counter), so the shape is the same
//! from run to run and expected depth stays logarithmic whatever order ranges come in.

use std::cmp::Ordering;

/// The end of a range: a key (exclusive), or no end (etcd's `"\0"` range end: every key from
/// the start on). `Key(..) < Unbounded`.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum End {
    /// Keys below this one.
    Key(Vec<u8>),
    /// Every key.
    Unbounded,
}

impl End {
    /// Whether the range ends after `key`, so it holds `key` if it starts at or before it.
    fn above(&self, key: &[u8]) -> bool {
        match self {
            End::Key(end) => end.as_slice() > key,
            End::Unbounded => true,
        }
    }
}

struct Node<T> {
    start: Vec<u8>,
    end: End,
    /// The greatest `end` in this node's subtree.
    max_end: End,
    priority: u64,
    value: T,
    left: Link<T>,
    right: Link<T>,
}

type Link<T> = Option<Box<Node<T>>>;

impl<T> Node<T> {
    fn order(&self, start: &[u8], end: &End) -> Ordering {
        (self.start.as_slice(), &self.end).cmp(&(start, end))
    }

    fn update(&mut self) {
        let mut max = &self.end;
        for child in [&self.left, &self.right].into_iter().flatten() {
            if child.max_end > *max {
                max = &child.max_end;
            }
        }
        if *max != self.max_end {
            self.max_end = max.clone();
        }
    }
}

/// Distinct ranges and a value for each (see the module docs).
pub(crate) struct IntervalMap<T> {
    root: Link<T>,
    len: usize,
    next_priority: u64,
}

impl<T> Default for IntervalMap<T> {
    fn default() -> Self {
        IntervalMap {
            root: None,
            len: 0,
            next_priority: 0,
        }
    }
}

impl<T> IntervalMap<T> {
    /// Number of ranges.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// Whether the map holds no range.
    pub(crate) fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The value of `[start, end)`, inserted by `make` if the range is new.
    pub(crate) fn get_or_insert_with(
        &mut self,
        start: &[u8],
        end: &End,
        make: impl FnOnce() -> T,
    ) -> &mut T {
        if self.get_mut(start, end).is_none() {
            self.next_priority = self.next_priority.wrapping_add(1);
            let node = Box::new(Node {
                start: start.to_vec(),
                end: end.clone(),
                max_end: end.clone(),
                priority: splitmix64(self.next_priority),
                value: make(),
                left: None,
                right: None,
            });
            let (below, above) = split(self.root.take(), start, end);
            self.root = merge(merge(below, Some(node)), above);
            self.len += 1;
        }
        self.get_mut(start, end)
            .expect("the range is in the map: found or inserted just now")
    }

    /// The value of `[start, end)`.
    pub(crate) fn get_mut(&mut self, start: &[u8], end: &End) -> Option<&mut T> {
        let mut link = &mut self.root;
        while let Some(node) = link {
            match node.order(start, end) {
                Ordering::Equal => return Some(&mut node.value),
                Ordering::Greater => link = &mut node.left,
                Ordering::Less => link = &mut node.right,
            }
        }
        None
    }

    /// Removes `[start, end)`, returning its value.
    pub(crate) fn remove(&mut self, start: &[u8], end: &End) -> Option<T> {
        let value = remove(&mut self.root, start, end)?;
        self.len -= 1;
        Some(value)
    }

    /// Calls `visit` with the value of every range that holds `key`.
    pub(crate) fn stab_mut(&mut self, key: &[u8], visit: &mut impl FnMut(&mut T)) {
        stab(&mut self.root, key, visit);
    }

    /// Removes every range, returning them in order.
    pub(crate) fn drain(&mut self) -> Vec<(Vec<u8>, End, T)> {
        let mut out = Vec::with_capacity(self.len);
        let mut stack = Vec::new();
        let mut link = self.root.take();
        loop {
            while let Some(mut node) = link {
                link = node.left.take();
                stack.push(node);
            }
            let Some(mut node) = stack.pop() else { break };
            link = node.right.take();
            out.push((node.start, node.end, node.value));
        }
        self.len = 0;
        out
    }
}

fn splitmix64(n: u64) -> u64 {
    let mut z = n.wrapping_mul(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// Joins two treaps, every range of `low` ordered before every range of `high`.
fn merge<T>(low: Link<T>, high: Link<T>) -> Link<T> {
    match (low, high) {
        (None, high) => high,
        (low, None) => low,
        (Some(mut low), Some(mut high)) => {
            if low.priority > high.priority {
                low.right = merge(low.right.take(), Some(high));
                low.update();
                Some(low)
            } else {
                high.left = merge(Some(low), high.left.take());
                high.update();
                Some(high)
            }
        }
    }
}

/// Splits a treap into the ranges ordered before `(start, end)` and the others.
fn split<T>(link: Link<T>, start: &[u8], end: &End) -> (Link<T>, Link<T>) {
    let Some(mut node) = link else {
        return (None, None);
    };
    if node.order(start, end) == Ordering::Less {
        let (below, above) = split(node.right.take(), start, end);
        node.right = below;
        node.update();
        (Some(node), above)
    } else {
        let (below, above) = split(node.left.take(), start, end);
        node.left = above;
        node.update();
        (below, Some(node))
    }
}

fn remove<T>(link: &mut Link<T>, start: &[u8], end: &End) -> Option<T> {
    let order = link.as_ref()?.order(start, end);
    let node = link.as_mut()?;
    let value = match order {
        Ordering::Greater => remove(&mut node.left, start, end)?,
        Ordering::Less => remove(&mut node.right, start, end)?,
        Ordering::Equal => {
            let mut found = link.take()?;
            *link = merge(found.left.take(), found.right.take());
            return Some(found.value);
        }
    };
    node.update();
    Some(value)
}

fn stab<T>(link: &mut Link<T>, key: &[u8], visit: &mut impl FnMut(&mut T)) {
    let Some(node) = link else { return };
    if !node.max_end.above(key) {
        return;
    }
    stab(&mut node.left, key, visit);
    if node.start.as_slice() <= key {
        if node.end.above(key) {
            visit(&mut node.value);
        }
        stab(&mut node.right, key, visit);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn end(e: &str) -> End {
        End::Key(e.as_bytes().to_vec())
    }

    fn hits(map: &mut IntervalMap<u32>, key: &str) -> Vec<u32> {
        let mut got = Vec::new();
        map.stab_mut(key.as_bytes(), &mut |v| got.push(*v));
        got.sort_unstable();
        got
    }

    #[test]
    fn a_stab_finds_exactly_the_ranges_that_hold_the_key() {
        let mut map = IntervalMap::default();
        *map.get_or_insert_with(b"a", &end("c"), || 0) = 1;
        *map.get_or_insert_with(b"b", &end("b\0"), || 0) = 2; // one key, as a range
        *map.get_or_insert_with(b"b", &End::Unbounded, || 0) = 3; // from-key
        *map.get_or_insert_with(b"\0", &End::Unbounded, || 0) = 4; // every key
        *map.get_or_insert_with(b"ab", &end("ac"), || 0) = 5; // prefix "ab"
        *map.get_or_insert_with(b"a", &end("z"), || 0) = 6; // overlaps 1 and 5
        assert_eq!(map.len(), 6);
        assert_eq!(hits(&mut map, "a"), vec![1, 4, 6]);
        assert_eq!(hits(&mut map, "ab"), vec![1, 4, 5, 6]);
        assert_eq!(hits(&mut map, "abc"), vec![1, 4, 5, 6]);
        assert_eq!(hits(&mut map, "b"), vec![1, 2, 3, 4, 6]);
        assert_eq!(hits(&mut map, "b\0"), vec![1, 3, 4, 6]);
        assert_eq!(hits(&mut map, "c"), vec![3, 4, 6]);
        assert_eq!(hits(&mut map, "z"), vec![3, 4]);
        assert_eq!(hits(&mut map, ""), Vec::<u32>::new());
        // The same range again is the same entry.
        assert_eq!(*map.get_or_insert_with(b"a", &end("c"), || 9), 1);
        assert_eq!(map.len(), 6);
    }

    #[test]
    fn removed_ranges_are_no_longer_found() {
        let mut map = IntervalMap::default();
        *map.get_or_insert_with(b"a", &end("c"), || 0) = 1;
        *map.get_or_insert_with(b"a", &end("d"), || 0) = 2;
        *map.get_or_insert_with(b"b", &End::Unbounded, || 0) = 3;
        assert_eq!(map.remove(b"a", &end("d")), Some(2));
        assert_eq!(map.remove(b"a", &end("d")), None);
        assert_eq!(hits(&mut map, "c"), vec![3]);
        assert_eq!(hits(&mut map, "b"), vec![1, 3]);
        assert_eq!(map.remove(b"b", &End::Unbounded), Some(3));
        assert_eq!(hits(&mut map, "zzz"), Vec::<u32>::new());
        assert_eq!(map.remove(b"a", &end("c")), Some(1));
        assert!(map.is_empty());
        assert_eq!(hits(&mut map, "b"), Vec::<u32>::new());
    }

    /// Many overlapping ranges inserted and removed in a scrambled order, every stab checked
    /// against a scan of the ranges still present.
    #[test]
    fn stabs_agree_with_a_scan_through_inserts_and_removals() {
        let key = |n: u64| format!("k{:03}", n % 200).into_bytes();
        let mut ranges: Vec<(Vec<u8>, End)> = Vec::new();
        for i in 0..300u64 {
            let a = splitmix64(i) % 200;
            let len = splitmix64(i + 1000) % 40;
            let e = if i % 17 == 0 {
                End::Unbounded
            } else {
                End::Key(key(a + len + 1))
            };
            let range = (key(a), e);
            if !ranges.contains(&range) && range.1.above(&range.0) {
                ranges.push(range);
            }
        }
        let mut map = IntervalMap::default();
        for (i, (start, e)) in ranges.iter().enumerate() {
            *map.get_or_insert_with(start, e, || 0) = i;
        }
        let check = |map: &mut IntervalMap<usize>, present: &[bool]| {
            for p in 0..210u64 {
                let point = key(p);
                let mut got = Vec::new();
                map.stab_mut(&point, &mut |v| got.push(*v));
                got.sort_unstable();
                let want: Vec<usize> = ranges
                    .iter()
                    .enumerate()
                    .filter(|(i, (start, e))| {
                        present[*i] && start.as_slice() <= point.as_slice() && e.above(&point)
                    })
                    .map(|(i, _)| i)
                    .collect();
                assert_eq!(got, want, "key {}", String::from_utf8_lossy(&point));
            }
        };
        let mut present = vec![true; ranges.len()];
        check(&mut map, &present);
        for round in 0..3u64 {
            for (i, (start, e)) in ranges.iter().enumerate() {
                if splitmix64(i as u64 + round * 7919).is_multiple_of(3) && present[i] {
                    assert_eq!(map.remove(start, e), Some(i));
                    present[i] = false;
                }
            }
            check(&mut map, &present);
        }
        let left = map.drain();
        assert_eq!(left.len(), present.iter().filter(|p| **p).count());
        assert!(
            left.windows(2)
                .all(|w| (&w[0].0, &w[0].1) < (&w[1].0, &w[1].1))
        );
        assert!(map.is_empty());
    }
}
