//! Long values of the `key` bucket, kept in pieces that fill the file's pages.
//!
//! redb keeps a value inside a B-tree leaf and allocates each leaf as a power of two pages,
//! so a value longer than a page gets a leaf of its own: a revision of 10 KiB took a 16 KiB
//! leaf, where bbolt puts it in three contiguous 4 KiB pages, and the file was 1.34x etcd's
//! for the same 10 KiB values (1.61x the data). So a value of the `key` bucket longer than
//! 1,988 bytes ([`cut`]) is stored as a *head* at its key (a marker byte that no encoded
//! `mvccpb.KeyValue` begins with, as protobuf has no field 0, then the value's length: nine
//! bytes) and its bytes, cut in order, under the key followed by each piece's number
//! (big-endian `u32`), in two tables beside the bucket ([`Cut`]):
//!
//! - *large* pieces ([`LARGE`]), each exactly filling a leaf of 2, 4, 8 or 16 pages of its
//!   own (redb keeps a leaf of one pair whatever its size, and only that), the longest that
//!   fits what is left, while at least two pages' worth is left;
//! - then *small* pieces ([`TABLE`]) of what is left, sized so that one to eight of them fill a
//!   leaf exactly, the size that puts that rest in the fewest leaves ([`piece_len`]). The small
//!   pieces of consecutive revisions are consecutive keys of their table, so the rest of one
//!   value shares a leaf with the next one's, and only part of one slot per value is lost.
//!
//! (redb 4.6's leaf: a 4-byte header, then two `u32` end offsets per pair, then the keys and
//! values: `RawLeafBuilder::required_bytes`.) 2,000 revisions of 10 KiB take 1.038x their bytes
//! in pages (whole, 1.6x). A value of 10 KiB is then read in two or three page reads (a leaf of
//! two pages, and the rest's) rather than the four of small pieces alone: redb reads each
//! page it does not cache with a call of its own, and a range of such values spent most of its
//! time there. Readers join pieces without knowing their sizes (every key in the value's
//! range, in order, large ones first), and removals take those whole ranges, so the choice of
//! sizes can change without a new format.
//!
//! Above the tables nothing sees a piece: the batches held in memory keep whole values, and
//! every read of the file (gets, ranges, hashes, transfers, the bbolt export, `last`) joins
//! the pieces again; only the paths of `lib.rs` that open the bucket's table, the
//! defragmentation's copy of changed keys and the page walk know of them. The stored bytes
//! (the quota's measure) count the whole value under its key, as before. A file written
//! before pieces existed has no heads and reads as it did; a whole value in it is cut when it
//! is next written.

use redb::{ReadableTable, TableDefinition};

use crate::{Bucket, Error, Result};

/// The small pieces of every long value (several to a leaf), under its key and the piece's
/// number.
pub(crate) const TABLE: TableDefinition<'static, &'static [u8], &'static [u8]> =
    TableDefinition::new("etcd-rs.pieces");
/// The large pieces of every long value (each a leaf of its own), under its key and the
/// piece's number.
pub(crate) const LARGE: TableDefinition<'static, &'static [u8], &'static [u8]> =
    TableDefinition::new("etcd-rs.large");

/// The first byte of a head (an encoded `mvccpb.KeyValue` begins with its field 1's tag).
const MARK: u8 = 0;
/// A head: the marker, then the value's length (big-endian `u64`).
const HEAD_LEN: usize = 9;
/// The piece's number after the key.
const NUMBER_LEN: usize = 4;
/// redb 4.6's leaf page, less its 4-byte header.
const LEAF_ROOM: usize = 4096 - 4;
/// redb's end offsets of a pair's key and value in a leaf.
const SLOT_OVERHEAD: usize = 8;
/// The most pieces a leaf holds (each value's choice ranges from one to this many).
const MAX_PER_LEAF: usize = 8;
/// The most pages of a leaf that holds a large piece alone.
const LARGE_MAX_PAGES: usize = 16;
/// Keys longer than this keep their values whole (a revision's key is 17 or 18 bytes).
const MAX_KEY: usize = 64;

/// The bytes of a piece's key under a revision's key (17 bytes), with its number.
pub(crate) const REVISION_PIECE_KEY_LEN: u64 = 17 + NUMBER_LEN as u64;

/// The most bytes a join reserves ahead (a damaged head's length is not trusted further).
const RESERVE_MAX: usize = 16 << 20;

/// The bytes of a piece under a key of `key_len` bytes such that `per_leaf` of them fill a
/// leaf: 994 for a revision's 17 bytes, four to a leaf.
fn filling(key_len: usize, per_leaf: usize) -> usize {
    LEAF_ROOM / per_leaf - SLOT_OVERHEAD - NUMBER_LEN - key_len
}

/// The bytes of each piece of a value of `len` bytes under a key of `key_len` bytes (its last
/// piece may be shorter, and takes a whole slot of its leaf): of the sizes that fill a leaf
/// (one to eight to a leaf), the one whose slots take the fewest leaves, and of those the
/// longest. 10,240 bytes: four to a leaf take 11 slots, 2.75 leaves; three to a leaf, 8
/// slots, 2.67; five to a leaf, 13 slots, 2.6 (the choice).
pub(crate) fn piece_len(key_len: usize, len: usize) -> usize {
    let mut best = (filling(key_len, 1), len.div_ceil(filling(key_len, 1)), 1);
    for per_leaf in 2..=MAX_PER_LEAF {
        let piece = filling(key_len, per_leaf);
        let slots = len.div_ceil(piece);
        // slots / per_leaf < best slots / best per_leaf
        if slots * best.2 < best.1 * per_leaf {
            best = (piece, slots, per_leaf);
        }
    }
    best.0
}

/// Whether `value`, under `key` of `bucket`, is stored in pieces: a value of the `key` bucket
/// longer than two pieces of four to a leaf (1,988 bytes under a revision's key). Shorter
/// ones share a leaf whole as well as in pieces (two of 1,988 bytes fill a leaf either way).
pub(crate) fn cut(bucket: Bucket, key: &[u8], value: &[u8]) -> bool {
    bucket == Bucket::KEY && key.len() <= MAX_KEY && value.len() > 2 * filling(key.len(), 4)
}

/// The head stored at the key of a value of `len` bytes.
pub(crate) fn head(len: usize) -> [u8; HEAD_LEN] {
    let mut head = [0u8; HEAD_LEN];
    head[0] = MARK;
    head[1..].copy_from_slice(&(len as u64).to_be_bytes());
    head
}

/// The length of the value `stored` stands for, when it is a head of the `key` bucket.
pub(crate) fn head_len(bucket: Bucket, stored: &[u8]) -> Option<usize> {
    if bucket != Bucket::KEY || stored.len() != HEAD_LEN || stored[0] != MARK {
        return None;
    }
    let len: [u8; 8] = stored[1..].try_into().ok()?;
    usize::try_from(u64::from_be_bytes(len)).ok()
}

/// The bytes a stored value stands for: its whole length for a head, else its own.
pub(crate) fn stored_len(bucket: Bucket, stored: &[u8]) -> usize {
    head_len(bucket, stored).unwrap_or(stored.len())
}

/// A piece's key: the value's key, then the piece's number.
pub(crate) struct PieceKey {
    bytes: [u8; MAX_KEY + NUMBER_LEN],
    len: usize,
}

impl PieceKey {
    /// The key of piece `number` of the value under `key` (at most [`MAX_KEY`] bytes).
    pub(crate) fn new(key: &[u8], number: u32) -> PieceKey {
        let mut bytes = [0u8; MAX_KEY + NUMBER_LEN];
        let key_len = key.len().min(MAX_KEY);
        bytes[..key_len].copy_from_slice(&key[..key_len]);
        bytes[key_len..key_len + NUMBER_LEN].copy_from_slice(&number.to_be_bytes());
        PieceKey {
            bytes,
            len: key_len + NUMBER_LEN,
        }
    }

    pub(crate) fn as_slice(&self) -> &[u8] {
        &self.bytes[..self.len]
    }
}

/// The bytes of a large piece under a key of `key_len` bytes that fills a leaf of `pages`
/// pages alone: 8,159 for a revision's key and two pages.
fn alone(key_len: usize, pages: usize) -> usize {
    pages * 4096 - 4 - SLOT_OVERHEAD - NUMBER_LEN - key_len
}

/// The longest large piece no longer than `left` bytes (a leaf of 2, 4, 8 or 16 pages alone),
/// if there is one.
fn large_len(key_len: usize, left: usize) -> Option<usize> {
    let mut best = None;
    let mut pages = 2;
    while pages <= LARGE_MAX_PAGES && alone(key_len, pages) <= left {
        best = Some(alone(key_len, pages));
        pages *= 2;
    }
    best
}

/// The bytes of `len` that go in large pieces: each the longest that fits what is left.
fn large_bytes(key_len: usize, len: usize) -> usize {
    let mut at = 0;
    while let Some(piece) = large_len(key_len, len - at) {
        at += piece;
    }
    at
}

/// The piece after `key`'s template numbered `number`.
fn numbered(template: &PieceKey, number: usize) -> PieceKey {
    let mut key = PieceKey {
        bytes: template.bytes,
        len: template.len,
    };
    let at = template.len - NUMBER_LEN;
    key.bytes[at..template.len].copy_from_slice(&(number as u32).to_be_bytes());
    key
}

/// How a long value is cut: large pieces, each a leaf of its own (`LARGE`), then what is left
/// in small pieces (`TABLE`), both in order with their keys.
pub(crate) struct Cut<'v> {
    key: PieceKey,
    value: &'v [u8],
    large_end: usize,
}

impl<'v> Cut<'v> {
    /// The cut of `value` under `key` (at most [`MAX_KEY`] bytes).
    pub(crate) fn new(key: &[u8], value: &'v [u8]) -> Cut<'v> {
        let key = PieceKey::new(key, 0);
        let large_end = large_bytes(key.len - NUMBER_LEN, value.len());
        Cut {
            key,
            value,
            large_end,
        }
    }

    /// The large pieces.
    pub(crate) fn large(&self) -> impl Iterator<Item = (PieceKey, &'v [u8])> + '_ {
        let key_len = self.key.len - NUMBER_LEN;
        let value = self.value;
        let mut at = 0;
        let mut number = 0;
        std::iter::from_fn(move || {
            let piece = large_len(key_len, value.len() - at)?;
            let item = (numbered(&self.key, number), &value[at..at + piece]);
            at += piece;
            number += 1;
            Some(item)
        })
    }

    /// The small pieces (what the large ones leave).
    pub(crate) fn small(&self) -> impl Iterator<Item = (PieceKey, &'v [u8])> + '_ {
        let tail = &self.value[self.large_end..];
        let len = piece_len(self.key.len - NUMBER_LEN, tail.len()).max(1);
        tail.chunks(len)
            .enumerate()
            .map(|(number, piece)| (numbered(&self.key, number), piece))
    }
}

/// How many pieces, large and small, a value of `len` bytes under a key of `key_len` bytes is
/// cut into.
#[cfg(test)]
pub(crate) fn count(key_len: usize, len: usize) -> (u32, u32) {
    let value = vec![0u8; len];
    let key = vec![0u8; key_len];
    let cut = Cut::new(&key, &value);
    (cut.large().count() as u32, cut.small().count() as u32)
}

/// Appends the pieces of `table` under `key` to `out`, until it holds `until` bytes.
fn append_range(
    table: &impl ReadableTable<&'static [u8], &'static [u8]>,
    key: &[u8],
    out: &mut Vec<u8>,
    until: usize,
) -> Result<()> {
    let first = PieceKey::new(key, 0);
    let last = PieceKey::new(key, u32::MAX);
    let mut pieces = table
        .range(first.as_slice()..=last.as_slice())
        .map_err(Error::storage)?;
    // Not one step past the bytes expected: the next piece may be another leaf to read.
    while out.len() < until {
        let Some(item) = pieces.next() else {
            break;
        };
        let (piece_key, piece) = item.map_err(Error::storage)?;
        // A longer key that begins with this one has its pieces among these.
        if piece_key.value().len() == first.len {
            out.extend_from_slice(piece.value());
        }
    }
    Ok(())
}

/// Joins the pieces of the value of `len` bytes under `key` from the tables `large` and
/// `small` into `out` (cleared first). Each table is read up to the bytes the cut of today
/// puts there (a range stepping past them would read the next value's leaf), and both whole
/// when that does not join the value (pieces cut otherwise).
pub(crate) fn join_into(
    large: &impl ReadableTable<&'static [u8], &'static [u8]>,
    small: &impl ReadableTable<&'static [u8], &'static [u8]>,
    key: &[u8],
    len: usize,
    out: &mut Vec<u8>,
) -> Result<()> {
    out.clear();
    out.reserve(len.min(RESERVE_MAX));
    append_range(large, key, out, large_bytes(key.len(), len))?;
    append_range(small, key, out, len)?;
    if out.len() != len {
        out.clear();
        append_range(large, key, out, usize::MAX)?;
        append_range(small, key, out, usize::MAX)?;
    }
    if out.len() != len {
        return Err(Error::MissingPieces {
            len,
            found: out.len(),
        });
    }
    Ok(())
}

/// The two tables of pieces of a read transaction.
pub(crate) struct ReadPieces {
    large: redb::ReadOnlyTable<&'static [u8], &'static [u8]>,
    small: redb::ReadOnlyTable<&'static [u8], &'static [u8]>,
}

impl ReadPieces {
    /// Both tables of `tx`, when the file has them.
    pub(crate) fn open(tx: &redb::ReadTransaction) -> Result<Option<ReadPieces>> {
        let open = |definition| match tx.open_table(definition) {
            Ok(table) => Ok(Some(table)),
            Err(redb::TableError::TableDoesNotExist(_)) => Ok(None),
            Err(e) => Err(Error::storage(e)),
        };
        Ok(match (open(LARGE)?, open(TABLE)?) {
            (Some(large), Some(small)) => Some(ReadPieces { large, small }),
            _ => None,
        })
    }

    /// Joins the pieces of the value of `len` bytes under `key` into `out` (cleared first).
    pub(crate) fn join_into(&self, key: &[u8], len: usize, out: &mut Vec<u8>) -> Result<()> {
        join_into(&self.large, &self.small, key, len, out)
    }
}

/// One table's pieces in key order, from the pieces of a key joined on.
type Pieces = std::iter::Peekable<redb::Range<'static, &'static [u8], &'static [u8]>>;

/// Pieces of other keys a walk steps over in the table of small pieces before it seeks the
/// key's own instead (a descent of the table's tree; a few pieces share a leaf). In the
/// table of large pieces each step is a leaf to read: a key whose pieces are not next is
/// sought.
const SKIP_MAX: usize = 4;

/// Joins the pieces of the heads a reader meets in key order from one walk of each table of
/// pieces, rather than a lookup each, which would descend their trees again for every value
/// (every page a descent touches is a lookup in redb's cache, an atomic count and a lock: a
/// range of 10 KiB values spent a fifth of its time there). A member's start reads every
/// revision in order this way, a watch's catch-up and a hash too, and a range reads its
/// revisions in key order, which is theirs when the keys were written in order. A key
/// behind the walk, or far ahead of it, is sought.
pub(crate) struct Walk {
    tables: ReadPieces,
    large: Option<Pieces>,
    small: Option<Pieces>,
    /// The last key joined.
    last: Vec<u8>,
}

/// What [`take_pieces`] found.
enum Taken {
    /// The pieces under the key that the walk had next (maybe none).
    Here,
    /// More than [`SKIP_MAX`] pieces of other keys came first: the key is far ahead.
    Far,
}

/// Appends the pieces under `key` that `pieces` has next to `out`, skipping at most
/// `skip_max` before them, until `out` holds `until` bytes; stops at a piece of another key.
fn take_pieces(
    pieces: &mut Pieces,
    key: &[u8],
    out: &mut Vec<u8>,
    until: usize,
    skip_max: usize,
) -> Taken {
    let first = PieceKey::new(key, 0);
    let last = PieceKey::new(key, u32::MAX);
    let mut skipped = 0;
    while out.len() < until
        && let Some(Ok((piece_key, _))) = pieces.peek()
    {
        let piece_key = piece_key.value();
        if piece_key < first.as_slice() {
            if skipped == skip_max {
                return Taken::Far;
            }
            skipped += 1;
            pieces.next();
            continue;
        }
        if piece_key > last.as_slice() || piece_key.len() != first.len {
            break;
        }
        match pieces.next() {
            Some(Ok((_, piece))) => out.extend_from_slice(piece.value()),
            _ => break,
        }
    }
    Taken::Here
}

/// Appends the pieces under `key` of `table` to `out` through `walk`, which is sought to the
/// key first when there is none, or when the key is behind it or far ahead.
fn walk_to(
    table: &redb::ReadOnlyTable<&'static [u8], &'static [u8]>,
    walk: &mut Option<Pieces>,
    behind: bool,
    key: &[u8],
    out: &mut Vec<u8>,
    (until, skip_max): (usize, usize),
) -> Result<()> {
    let start = out.len();
    if !behind && let Some(pieces) = walk.as_mut() {
        match take_pieces(pieces, key, out, until, skip_max) {
            Taken::Here => return Ok(()),
            Taken::Far => out.truncate(start),
        }
    }
    let first = PieceKey::new(key, 0);
    let pieces = walk.insert(
        table
            .range(first.as_slice()..)
            .map_err(Error::storage)?
            .peekable(),
    );
    take_pieces(pieces, key, out, until, 0);
    Ok(())
}

impl Walk {
    /// A walk of `tables`, sought at its first key.
    pub(crate) fn new(tables: ReadPieces) -> Walk {
        Walk {
            tables,
            large: None,
            small: None,
            last: Vec::new(),
        }
    }

    /// Joins the pieces of the value of `len` bytes under `key` into `out` (cleared first).
    /// When the walk does not find them whole where it is (another key's pieces among them,
    /// an error), they are looked up.
    pub(crate) fn join_into(&mut self, key: &[u8], len: usize, out: &mut Vec<u8>) -> Result<()> {
        out.clear();
        out.reserve(len.min(RESERVE_MAX));
        let behind = key <= self.last.as_slice();
        let large = large_bytes(key.len(), len);
        walk_to(
            &self.tables.large,
            &mut self.large,
            behind,
            key,
            out,
            (large, 0),
        )?;
        walk_to(
            &self.tables.small,
            &mut self.small,
            behind,
            key,
            out,
            (len, SKIP_MAX),
        )?;
        self.last.clear();
        self.last.extend_from_slice(key);
        if out.len() != len {
            self.tables.join_into(key, len, out)?;
        }
        Ok(())
    }
}

/// Removes the pieces of the value under `key` from `table` (however they were cut).
fn remove_from(
    table: &mut redb::Table<'_, &'static [u8], &'static [u8]>,
    key: &[u8],
) -> Result<()> {
    let first = PieceKey::new(key, 0);
    let last = PieceKey::new(key, u32::MAX);
    // A longer key that begins with this one has its pieces among these.
    table
        .retain_in(first.as_slice()..=last.as_slice(), |piece_key, _| {
            piece_key.len() != first.len
        })
        .map_err(Error::storage)
}

/// The two tables of pieces, open in a write transaction.
pub(crate) struct WritePieces<'t> {
    pub(crate) large: redb::Table<'t, &'static [u8], &'static [u8]>,
    pub(crate) small: redb::Table<'t, &'static [u8], &'static [u8]>,
}

impl<'t> WritePieces<'t> {
    /// Both tables of `tx` (created when missing).
    pub(crate) fn open(tx: &'t redb::WriteTransaction) -> Result<WritePieces<'t>> {
        Ok(WritePieces {
            large: tx.open_table(LARGE).map_err(Error::storage)?,
            small: tx.open_table(TABLE).map_err(Error::storage)?,
        })
    }

    /// Removes the pieces of the value under `key`.
    pub(crate) fn remove(&mut self, key: &[u8]) -> Result<()> {
        remove_from(&mut self.large, key)?;
        remove_from(&mut self.small, key)
    }

    /// Inserts the pieces of `value` under `key`.
    pub(crate) fn insert(&mut self, key: &[u8], value: &[u8]) -> Result<()> {
        let cut = Cut::new(key, value);
        for (piece_key, piece) in cut.large() {
            self.large
                .insert(piece_key.as_slice(), piece)
                .map_err(Error::storage)?;
        }
        for (piece_key, piece) in cut.small() {
            self.small
                .insert(piece_key.as_slice(), piece)
                .map_err(Error::storage)?;
        }
        Ok(())
    }

    /// Joins the pieces of the value of `len` bytes under `key` into `out` (cleared first).
    pub(crate) fn join_into(&self, key: &[u8], len: usize, out: &mut Vec<u8>) -> Result<()> {
        join_into(&self.large, &self.small, key, len, out)
    }

    /// Removes every piece.
    pub(crate) fn clear(&mut self) -> Result<()> {
        self.large.retain(|_, _| false).map_err(Error::storage)?;
        self.small.retain(|_, _| false).map_err(Error::storage)
    }
}

/// Writes `value` under `key` into `table` (the bucket's, open for writing) and `pieces`
/// (opened from `tx` when first needed): a head and its pieces when it is long, else whole.
/// Returns the length of the value it replaced (its whole length when that was a head, whose
/// pieces are gone too).
pub(crate) fn insert<'t>(
    bucket: Bucket,
    table: &mut redb::Table<'_, &'static [u8], &'static [u8]>,
    pieces: &mut Option<WritePieces<'t>>,
    tx: &'t redb::WriteTransaction,
    key: &[u8],
    value: &[u8],
) -> Result<Option<usize>> {
    let long = cut(bucket, key, value);
    let old = if long {
        table.insert(key, head(value.len()).as_slice())
    } else {
        table.insert(key, value)
    }
    .map_err(Error::storage)?;
    let old = old.map(|old| (head_len(bucket, old.value()), old.value().len()));
    if long || matches!(old, Some((Some(_), _))) {
        if pieces.is_none() {
            *pieces = Some(WritePieces::open(tx)?);
        }
        if let Some(pieces) = pieces.as_mut() {
            if let Some((Some(_), _)) = old {
                pieces.remove(key)?;
            }
            if long {
                pieces.insert(key, value)?;
            }
        }
    }
    Ok(old.map(|(head, stored)| head.unwrap_or(stored)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pieces_fill_a_leaf_in_the_fewest_leaves() {
        let key_len = 17;
        for per_leaf in 1..=MAX_PER_LEAF {
            let pairs = per_leaf * (SLOT_OVERHEAD + key_len + NUMBER_LEN + filling(17, per_leaf));
            assert!(
                4 + pairs <= 4096 && 4096 - 4 - pairs < per_leaf,
                "{per_leaf}"
            );
        }
        assert_eq!(filling(key_len, 4), 994);
        // 10,240 bytes in small pieces alone: 13 of 789 (five to a leaf: 2.6 leaves), not 11
        // of 994 (four to a leaf: 2.75) nor 8 of 1,335 (2.67).
        assert_eq!(piece_len(key_len, 10_240), 789);
        // 4,000 bytes: one leaf, in one piece (the longest of the sizes that take one).
        assert_eq!(count(key_len, 4_000), (0, 1));
        // 2,500 bytes: two of three to a leaf.
        assert_eq!(piece_len(key_len, 2_500), 1_335);
    }

    #[test]
    fn large_pieces_fill_a_leaf_of_their_own() {
        let key_len = 17;
        for pages in [2, 4, 8, 16] {
            let pair = 4 + SLOT_OVERHEAD + key_len + NUMBER_LEN + alone(key_len, pages);
            assert_eq!(pair, pages * 4096);
        }
        // 10,240 bytes: 8,159 in a leaf of two pages, 2,081 in four small pieces of seven
        // to a leaf.
        let value = [5u8; 10_240];
        let cut = Cut::new(&[7u8; 17], &value);
        let large: Vec<usize> = cut.large().map(|(_, piece)| piece.len()).collect();
        let small: Vec<usize> = cut.small().map(|(_, piece)| piece.len()).collect();
        assert_eq!(large, [8_159]);
        assert_eq!(small, [555, 555, 555, 416]);
        // 100,000 bytes: leaves of 16 and 8 pages, then one small piece.
        assert_eq!(count(key_len, 100_000), (2, 1));
        // Exactly one large piece: no small one.
        assert_eq!(count(key_len, 8_159), (1, 0));
    }

    #[test]
    fn only_long_values_of_the_key_bucket_are_cut() {
        let key = [7u8; 17];
        assert!(!cut(Bucket::KEY, &key, &[1u8; 1988]));
        assert!(cut(Bucket::KEY, &key, &[1u8; 1989]));
        assert!(!cut(Bucket::LEASE, &key, &[1u8; 10_000]));
        assert!(!cut(Bucket::KEY, &[1u8; 65], &[1u8; 10_000]));
        let stored = head(10_240);
        assert_eq!(head_len(Bucket::KEY, &stored), Some(10_240));
        assert_eq!(head_len(Bucket::META, &stored), None);
        // An encoded KeyValue begins with field 1's tag.
        assert_eq!(head_len(Bucket::KEY, b"\x0a\x07abcdefg"), None);
        let value = [3u8; 2_500];
        let cut = Cut::new(&key, &value);
        assert_eq!(cut.large().count(), 0);
        let cut: Vec<(Vec<u8>, usize)> = cut
            .small()
            .map(|(k, piece)| (k.as_slice().to_vec(), piece.len()))
            .collect();
        assert_eq!(cut.len(), 2);
        assert_eq!(cut[1].0[17..], 1u32.to_be_bytes());
        assert_eq!(
            cut.iter().map(|(_, len)| *len).collect::<Vec<_>>(),
            [1_335, 1_165]
        );
    }
}
