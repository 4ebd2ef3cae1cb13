//! The on-disk layout shared by the reader and the writer: page headers, page elements, the
//! meta page and its checksum, the bucket header. Layout as in bbolt's `page.go`, `db.go`
//! (meta) and `bucket.go`; all integers are little-endian (bbolt writes native order, and
//! every platform etcd ships for is little-endian). See `crates/bolt/FORMAT.md`.

/// bbolt's magic number, first field of the meta.
pub(crate) const MAGIC: u32 = 0xED0C_DAED;
/// The only file format version bbolt writes.
pub(crate) const VERSION: u32 = 2;
/// Page header: id u64, flags u16, count u16, overflow u32.
pub(crate) const PAGE_HEADER_SIZE: usize = 16;
/// Leaf element: flags u32, pos u32, ksize u32, vsize u32.
pub(crate) const LEAF_ELEMENT_SIZE: usize = 16;
/// Branch element: pos u32, ksize u32, pgid u64.
pub(crate) const BRANCH_ELEMENT_SIZE: usize = 16;
/// Bucket header stored as a bucket's value: root pgid u64, sequence u64.
pub(crate) const BUCKET_HEADER_SIZE: usize = 16;
/// Bytes of the meta covered by its checksum (every field before `checksum`).
pub(crate) const META_CHECKSUMMED: usize = 56;
/// The whole meta, checksum included.
pub(crate) const META_SIZE: usize = 64;

pub(crate) const BRANCH_PAGE_FLAG: u16 = 0x01;
pub(crate) const LEAF_PAGE_FLAG: u16 = 0x02;
pub(crate) const META_PAGE_FLAG: u16 = 0x04;
pub(crate) const FREELIST_PAGE_FLAG: u16 = 0x10;
/// Leaf element flag: the value is a bucket header (plus an inline page), not a value.
pub(crate) const BUCKET_LEAF_FLAG: u32 = 0x01;

/// bbolt's `MaxKeySize`.
pub(crate) const MAX_KEY_SIZE: usize = 32768;
/// bbolt's `MaxValueSize`.
pub(crate) const MAX_VALUE_SIZE: usize = (1 << 31) - 2;

pub(crate) fn u16_at(buf: &[u8], off: usize) -> Option<u16> {
    let bytes = buf.get(off..off + 2)?;
    Some(u16::from_le_bytes([bytes[0], bytes[1]]))
}

pub(crate) fn u32_at(buf: &[u8], off: usize) -> Option<u32> {
    let bytes: [u8; 4] = buf.get(off..off + 4)?.try_into().ok()?;
    Some(u32::from_le_bytes(bytes))
}

pub(crate) fn u64_at(buf: &[u8], off: usize) -> Option<u64> {
    let bytes: [u8; 8] = buf.get(off..off + 8)?.try_into().ok()?;
    Some(u64::from_le_bytes(bytes))
}

/// A page header as read from the first 16 bytes of a page.
#[derive(Debug, Clone, Copy)]
pub(crate) struct PageHeader {
    pub(crate) id: u64,
    pub(crate) flags: u16,
    pub(crate) count: u16,
    pub(crate) overflow: u32,
}

impl PageHeader {
    /// Parses a header; `None` if `buf` is shorter than a header.
    pub(crate) fn parse(buf: &[u8]) -> Option<PageHeader> {
        Some(PageHeader {
            id: u64_at(buf, 0)?,
            flags: u16_at(buf, 8)?,
            count: u16_at(buf, 10)?,
            overflow: u32_at(buf, 12)?,
        })
    }

    pub(crate) fn encode(&self, buf: &mut [u8]) {
        buf[0..8].copy_from_slice(&self.id.to_le_bytes());
        buf[8..10].copy_from_slice(&self.flags.to_le_bytes());
        buf[10..12].copy_from_slice(&self.count.to_le_bytes());
        buf[12..16].copy_from_slice(&self.overflow.to_le_bytes());
    }
}

/// The meta record of page 0 or 1 (it follows the page header).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Meta {
    pub(crate) magic: u32,
    pub(crate) version: u32,
    pub(crate) page_size: u32,
    pub(crate) flags: u32,
    /// The root bucket's root page.
    pub(crate) root: u64,
    /// The root bucket's sequence (unused by bbolt, kept for the checksum).
    pub(crate) root_sequence: u64,
    pub(crate) freelist: u64,
    /// The high-water mark: the number of pages in use.
    pub(crate) pgid: u64,
    pub(crate) txid: u64,
    pub(crate) checksum: u64,
}

/// Why a meta record is not valid, in bbolt's order of checks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum MetaError {
    Magic,
    Version(u32),
    Checksum,
}

impl Meta {
    /// Parses the meta from the bytes that follow the page header.
    pub(crate) fn parse(buf: &[u8]) -> Option<Meta> {
        Some(Meta {
            magic: u32_at(buf, 0)?,
            version: u32_at(buf, 4)?,
            page_size: u32_at(buf, 8)?,
            flags: u32_at(buf, 12)?,
            root: u64_at(buf, 16)?,
            root_sequence: u64_at(buf, 24)?,
            freelist: u64_at(buf, 32)?,
            pgid: u64_at(buf, 40)?,
            txid: u64_at(buf, 48)?,
            checksum: u64_at(buf, 56)?,
        })
    }

    /// Encodes all 64 bytes, with the checksum computed over the first 56.
    pub(crate) fn encode(&self) -> [u8; META_SIZE] {
        let mut out = [0u8; META_SIZE];
        out[0..4].copy_from_slice(&self.magic.to_le_bytes());
        out[4..8].copy_from_slice(&self.version.to_le_bytes());
        out[8..12].copy_from_slice(&self.page_size.to_le_bytes());
        out[12..16].copy_from_slice(&self.flags.to_le_bytes());
        out[16..24].copy_from_slice(&self.root.to_le_bytes());
        out[24..32].copy_from_slice(&self.root_sequence.to_le_bytes());
        out[32..40].copy_from_slice(&self.freelist.to_le_bytes());
        out[40..48].copy_from_slice(&self.pgid.to_le_bytes());
        out[48..56].copy_from_slice(&self.txid.to_le_bytes());
        let sum = fnv1a64(&out[..META_CHECKSUMMED]);
        out[56..64].copy_from_slice(&sum.to_le_bytes());
        out
    }

    /// bbolt's `meta.validate`: magic, then version, then the checksum (a zero checksum
    /// is accepted, as bbolt does, for files from before checksums).
    pub(crate) fn validate(&self, raw: &[u8]) -> Result<(), MetaError> {
        if self.magic != MAGIC {
            return Err(MetaError::Magic);
        }
        if self.version != VERSION {
            return Err(MetaError::Version(self.version));
        }
        let Some(covered) = raw.get(..META_CHECKSUMMED) else {
            return Err(MetaError::Checksum);
        };
        if self.checksum != 0 && self.checksum != fnv1a64(covered) {
            return Err(MetaError::Checksum);
        }
        Ok(())
    }
}

/// FNV-1a, 64 bits: the meta checksum (Go's `hash/fnv.New64a`).
pub(crate) fn fnv1a64(bytes: &[u8]) -> u64 {
    const OFFSET_BASIS: u64 = 0xcbf2_9ce4_8422_2325;
    const PRIME: u64 = 0x0000_0100_0000_01b3;
    bytes.iter().fold(OFFSET_BASIS, |hash, &byte| {
        (hash ^ u64::from(byte)).wrapping_mul(PRIME)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fnv1a64_matches_known_vectors() {
        // Vectors from the FNV reference (draft-eastlake-fnv).
        assert_eq!(fnv1a64(b""), 0xcbf29ce484222325);
        assert_eq!(fnv1a64(b"a"), 0xaf63dc4c8601ec8c);
        assert_eq!(fnv1a64(b"foobar"), 0x85944171f73967e8);
    }

    #[test]
    fn meta_round_trips_and_validates() {
        let meta = Meta {
            magic: MAGIC,
            version: VERSION,
            page_size: 4096,
            flags: 0,
            root: 7,
            root_sequence: 0,
            freelist: 8,
            pgid: 9,
            txid: 2,
            checksum: 0,
        };
        let raw = meta.encode();
        let parsed = Meta::parse(&raw).unwrap();
        assert_eq!(parsed.root, 7);
        assert_eq!(parsed.validate(&raw), Ok(()));
        let mut bad = raw;
        bad[20] ^= 1;
        let parsed = Meta::parse(&bad).unwrap();
        assert_eq!(parsed.validate(&bad), Err(MetaError::Checksum));
    }
}
