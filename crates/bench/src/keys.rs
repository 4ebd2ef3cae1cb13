//! Keys and values as etcd's benchmark makes them: a zeroed buffer of `--key-size` bytes with
//! the key number written at the front as a Go `binary.PutVarint` (zig-zag varint).

use anyhow::{Result, bail};

/// Go's `binary.PutVarint` into the front of `buf`; returns the bytes written.
pub fn put_varint(buf: &mut [u8], v: i64) -> usize {
    let mut u = ((v << 1) ^ (v >> 63)) as u64;
    let mut i = 0;
    while u >= 0x80 {
        buf[i] = (u as u8) | 0x80;
        u >>= 7;
        i += 1;
    }
    buf[i] = u as u8;
    i + 1
}

/// Bytes the varint of `v` takes.
pub fn varint_len(v: i64) -> usize {
    let mut buf = [0u8; 10];
    put_varint(&mut buf, v)
}

/// Makes the keys numbered `0..key_space_size`, each `key_size` bytes.
#[derive(Debug, Clone)]
pub struct KeyMaker {
    key_size: usize,
}

impl KeyMaker {
    /// Fails when `key_size` is too small to keep the `key_space_size` keys distinct.
    pub fn new(key_size: usize, key_space_size: u64) -> Result<Self> {
        let largest = i64::try_from(key_space_size.saturating_sub(1)).unwrap_or(i64::MAX);
        let need = varint_len(largest);
        if key_size < need {
            bail!(
                "--key-size {key_size} is too small for --key-space-size {key_space_size} (needs {need} bytes)"
            );
        }
        Ok(Self { key_size })
    }

    pub fn key(&self, n: u64) -> Vec<u8> {
        let mut k = vec![0u8; self.key_size];
        put_varint(&mut k, i64::try_from(n).unwrap_or(i64::MAX));
        k
    }
}

/// `n` random bytes (etcd uses one random value for a whole run).
pub fn random_bytes(n: usize) -> Vec<u8> {
    let mut v = vec![0u8; n];
    rand::fill(&mut v[..]);
    v
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn varint_matches_go() {
        let cases: [(i64, &[u8]); 6] = [
            (0, &[0x00]),
            (1, &[0x02]),
            (-1, &[0x01]),
            (63, &[0x7e]),
            (64, &[0x80, 0x01]),
            (1_000_000, &[0x80, 0x89, 0x7a]),
        ];
        for (v, want) in cases {
            let mut buf = [0u8; 10];
            let n = put_varint(&mut buf, v);
            assert_eq!(&buf[..n], want, "varint of {v}");
        }
    }

    #[test]
    fn keys_are_padded_and_distinct() {
        let km = KeyMaker::new(8, 1000).expect("8 bytes hold 1000 keys");
        assert_eq!(km.key(0), vec![0; 8]);
        assert_eq!(km.key(64), vec![0x80, 0x01, 0, 0, 0, 0, 0, 0]);
        let keys: std::collections::BTreeSet<_> = (0..1000).map(|i| km.key(i)).collect();
        assert_eq!(keys.len(), 1000);
    }

    #[test]
    fn key_size_must_hold_the_key_space() {
        assert!(KeyMaker::new(1, 64).is_ok());
        assert!(KeyMaker::new(1, 65).is_err());
        assert!(KeyMaker::new(0, 1).is_err());
        assert!(KeyMaker::new(3, 1_000_000).is_ok());
    }

    #[test]
    fn random_values_have_the_size() {
        assert_eq!(random_bytes(256).len(), 256);
        assert!(random_bytes(0).is_empty());
    }
}
