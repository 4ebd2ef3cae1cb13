//! CRC-32C (Castagnoli), the checksum of etcd's WAL records and snapshot files.
//!
//! Port of the role of Go's `hash/crc32` with `crc32.MakeTable(crc32.Castagnoli)` and etcd
//! `pkg/crc`: [`update`] continues a checksum, so `update(update(0, a), b)` is the checksum of
//! `a` followed by `b`. That is how the WAL's CRC rolls over every record's data and across
//! segments (each segment opens with a crc record carrying the previous segment's value).

/// The reflected Castagnoli polynomial.
const POLYNOMIAL: u32 = 0x82f6_3b78;

/// One byte-at-a-time lookup table, built at compile time.
const TABLE: [u32; 256] = build_table();

const fn build_table() -> [u32; 256] {
    let mut table = [0u32; 256];
    let mut byte = 0;
    while byte < 256 {
        let mut value = byte as u32;
        let mut bit = 0;
        while bit < 8 {
            value = if value & 1 == 1 {
                (value >> 1) ^ POLYNOMIAL
            } else {
                value >> 1
            };
            bit += 1;
        }
        table[byte] = value;
        byte += 1;
    }
    table
}

/// Continues the checksum `crc` (0 to start) over `data`, as Go's `crc32.Update`.
pub(crate) fn update(crc: u32, data: &[u8]) -> u32 {
    let mut value = !crc;
    for &byte in data {
        let slot = usize::from((value as u8) ^ byte);
        value = (value >> 8) ^ TABLE[slot];
    }
    !value
}

#[cfg(test)]
mod tests {
    use super::update;

    #[test]
    fn check_value() {
        // The standard check value of CRC-32C.
        assert_eq!(update(0, b"123456789"), 0xe306_9283);
        assert_eq!(update(0, b""), 0);
    }

    #[test]
    fn rolls_like_one_checksum() {
        assert_eq!(
            update(update(0, b"1234"), b"56789"),
            update(0, b"123456789")
        );
    }
}
