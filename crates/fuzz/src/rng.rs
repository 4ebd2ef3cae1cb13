//! The fuzzer's random numbers: SplitMix64, small, seedable and the same on every platform,
//! so that a seed and an iteration name one input forever.

/// A SplitMix64 generator (Steele, Lea and Flood, "Fast splittable pseudorandom number
/// generators"). Not for cryptography; for choosing mutations reproducibly.
#[derive(Clone, Debug)]
pub struct Rng {
    state: u64,
}

impl Rng {
    /// A generator whose whole sequence is decided by `seed`.
    pub fn new(seed: u64) -> Rng {
        Rng { state: seed }
    }

    /// The generator of one iteration: a function of the run's seed and the iteration only,
    /// so that any iteration replays without running the ones before it.
    pub fn for_iteration(seed: u64, iteration: u64) -> Rng {
        let mut mixer = Rng::new(seed ^ iteration.wrapping_mul(0xa076_1d64_78bd_642f));
        Rng::new(mixer.next_u64())
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.state = self.state.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut mixed = self.state;
        mixed = (mixed ^ (mixed >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        mixed = (mixed ^ (mixed >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        mixed ^ (mixed >> 31)
    }

    /// A number in `0..bound`; `bound` must not be zero.
    pub fn below(&mut self, bound: usize) -> usize {
        debug_assert!(bound > 0, "below(0) has no value to return");
        // The modulo bias is irrelevant for choosing mutations.
        (self.next_u64() % bound.max(1) as u64) as usize
    }

    /// True with probability `1 / n`.
    pub fn one_in(&mut self, n: usize) -> bool {
        self.below(n) == 0
    }

    /// One element of a non-empty slice.
    pub fn pick<'a, T>(&mut self, items: &'a [T]) -> &'a T {
        &items[self.below(items.len())]
    }
}

/// FNV-1a over `bytes`: the default seed of a target is a function of its name, so that CI
/// runs the same inputs every time and a failure there replays anywhere.
pub fn fnv1a(bytes: &[u8]) -> u64 {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for byte in bytes {
        hash ^= u64::from(*byte);
        hash = hash.wrapping_mul(0x0100_0000_01b3);
    }
    hash
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sequence_is_fixed_by_the_seed() {
        let mut first = Rng::new(7);
        let mut second = Rng::new(7);
        let a: Vec<u64> = (0..4).map(|_| first.next_u64()).collect();
        let b: Vec<u64> = (0..4).map(|_| second.next_u64()).collect();
        assert_eq!(a, b);
        assert_ne!(
            Rng::for_iteration(1, 2).next_u64(),
            Rng::for_iteration(1, 3).next_u64()
        );
    }

    #[test]
    fn below_stays_in_range() {
        let mut rng = Rng::new(1);
        assert!((0..1000).all(|_| rng.below(3) < 3));
    }
}
