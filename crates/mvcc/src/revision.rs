//! Revisions and their on-disk encoding (etcd `server/storage/mvcc/revision.go`).
//!
//! A revision is `(main, sub)`: `main` is the store revision a transaction committed at and
//! `sub` orders the changes inside that transaction. In the `key` bucket a revision is the
//! key: 8 bytes of `main` and 8 bytes of `sub`, big-endian, so byte order is revision order;
//! a tombstone carries one more byte, `t`.

/// A store revision with its sub-revision.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Revision {
    /// The transaction's revision.
    pub main: i64,
    /// The change's position inside the transaction.
    pub sub: i64,
}

/// Length of an encoded revision without the tombstone mark.
pub const REV_BYTES_LEN: usize = 16;
const TOMBSTONE_MARK: u8 = b't';

impl Revision {
    /// A revision from its parts.
    pub fn new(main: i64, sub: i64) -> Self {
        Revision { main, sub }
    }

    /// The backend key of a live value at this revision.
    pub fn to_bytes(self) -> [u8; REV_BYTES_LEN] {
        let mut out = [0u8; REV_BYTES_LEN];
        out[..8].copy_from_slice(&(self.main as u64).to_be_bytes());
        out[8..].copy_from_slice(&(self.sub as u64).to_be_bytes());
        out
    }

    /// The backend key of this revision, with the tombstone mark when `tombstone`.
    pub fn to_key(self, tombstone: bool) -> Vec<u8> {
        let mut key = self.to_bytes().to_vec();
        if tombstone {
            key.push(TOMBSTONE_MARK);
        }
        key
    }

    /// Decode a backend key: the revision and whether it marks a tombstone.
    pub fn from_key(key: &[u8]) -> Option<(Revision, bool)> {
        if key.len() < REV_BYTES_LEN {
            return None;
        }
        let main = u64::from_be_bytes(key[..8].try_into().ok()?) as i64;
        let sub = u64::from_be_bytes(key[8..16].try_into().ok()?) as i64;
        let tombstone = match key.get(REV_BYTES_LEN) {
            None => false,
            Some(&TOMBSTONE_MARK) if key.len() == REV_BYTES_LEN + 1 => true,
            Some(_) => return None,
        };
        Some((Revision { main, sub }, tombstone))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn encoding_orders_like_revisions_and_round_trips() {
        let revs = [
            Revision::new(1, 0),
            Revision::new(1, 2),
            Revision::new(2, 0),
            Revision::new(300, 1),
        ];
        for pair in revs.windows(2) {
            assert!(pair[0].to_bytes() < pair[1].to_bytes());
        }
        for rev in revs {
            assert_eq!(Revision::from_key(&rev.to_key(false)), Some((rev, false)));
            assert_eq!(Revision::from_key(&rev.to_key(true)), Some((rev, true)));
        }
        assert_eq!(Revision::from_key(b"short"), None);
    }
}
