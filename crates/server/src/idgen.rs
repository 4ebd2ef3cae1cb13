//! Unique ids for requests and leases (etcd `pkg/idutil`): the member id's low 16 bits, then
//! a 40-bit millisecond timestamp taken at start, then an 8-bit counter that overflows into
//! the timestamp. Ids from different members, or from one member across restarts, differ.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

const TS_LEN: u32 = 40;
const CNT_LEN: u32 = 8;
const SUFFIX_LEN: u32 = TS_LEN + CNT_LEN;

/// Generates ids.
pub struct IdGenerator {
    prefix: u64,
    suffix: AtomicU64,
}

impl IdGenerator {
    /// A generator for `member_id`.
    pub fn new(member_id: u64) -> Self {
        let millis = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_millis() as u64)
            .unwrap_or(0);
        let prefix = (member_id & 0xffff) << SUFFIX_LEN;
        let suffix = (millis & ((1 << TS_LEN) - 1)) << CNT_LEN;
        IdGenerator {
            prefix,
            suffix: AtomicU64::new(suffix),
        }
    }

    /// The next id.
    pub fn next(&self) -> u64 {
        let suffix = self.suffix.fetch_add(1, Ordering::Relaxed) + 1;
        self.prefix | (suffix & ((1 << SUFFIX_LEN) - 1))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_are_unique_and_carry_the_member() {
        let generator = IdGenerator::new(0x8e9e05c52164694d);
        let a = generator.next();
        let b = generator.next();
        assert_ne!(a, b);
        assert_eq!(a >> 48, 0x694d);
    }
}
