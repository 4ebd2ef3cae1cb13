//! HPACK, the header compression of HTTP/2 (RFC 7541): the one codec of the workspace.
//!
//! Two users need it below what `h2` exposes (h2 keeps its codec private):
//! `etcdrs_serve::h2authority`, which re-encodes header blocks on their way into hyper, and the
//! load generator's own HTTP/2 client (`bench::grpc`), which encodes requests and decodes
//! responses. Both sit on a per-request path, so the decoder borrows what it can (raw strings
//! from the block, indexed fields from its table), decodes Huffman strings with a tree built
//! once per process, and stops at the first error.
//!
//! # Layout
//! - [`Decoder`]: follows one peer encoder's dynamic table (insertions, evictions, size
//!   updates up to the limit that side advertised); [`Decoder::decode_with`] hands each field
//!   to a callback, [`Decoder::decode`] collects them.
//! - Encoding primitives for encoders that choose their own representations:
//!   [`encode_int`], [`encode_string`] (raw, never Huffman), [`encode_literal`] (a field as a
//!   literal that never enters the peer's table, naming a static entry where one matches).
//!
//! This crate knows no HTTP/2 framing: callers hand it whole header blocks (HEADERS plus
//! CONTINUATIONs). It depends on nothing of ours.

#![deny(missing_docs)]

use std::borrow::Cow;
use std::collections::VecDeque;
use std::sync::OnceLock;

use bytes::BufMut;

pub mod error;
mod tables;

pub use error::{Error, Result};
use tables::{HUFFMAN_CODES, STATIC_TABLE};

/// The protocol's default SETTINGS_HEADER_TABLE_SIZE (RFC 9113 §6.5.2).
pub const DEFAULT_TABLE_SIZE: usize = 4096;
/// Largest decoded header list (RFC 7541 sizes: name + value + 32 per field) a decoder
/// accepts; a block of one-byte indexes can otherwise decode to thousands of times its size.
pub const MAX_HEADER_LIST: usize = 1 << 20;
/// Number of entries in the static table; the dynamic table starts at index 62.
pub const STATIC_ENTRIES: usize = 61;
/// Per-entry overhead in the table size accounting (RFC 7541 §4.1).
const ENTRY_OVERHEAD: usize = 32;

/// One decoded header field, as the decoder lends it to [`Decoder::decode_with`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Field<'a> {
    /// The name, as sent (HPACK does not check it).
    pub name: &'a [u8],
    /// The value.
    pub value: &'a [u8],
    /// Sent as a "never indexed" literal (RFC 7541 §6.2.3): an intermediary re-encoding it
    /// must keep that representation.
    pub never_indexed: bool,
}

/// One decoded header field, owned.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HeaderField {
    /// The name.
    pub name: Vec<u8>,
    /// The value.
    pub value: Vec<u8>,
    /// See [`Field::never_indexed`].
    pub never_indexed: bool,
}

impl From<Field<'_>> for HeaderField {
    fn from(field: Field<'_>) -> Self {
        HeaderField {
            name: field.name.to_vec(),
            value: field.value.to_vec(),
            never_indexed: field.never_indexed,
        }
    }
}

/// A literal's name and value: borrowed from the block or the table, or Huffman-decoded.
type Literal<'a> = (Cow<'a, [u8]>, Cow<'a, [u8]>);

/// A decoder tracking one peer encoder's dynamic table (RFC 7541 §2.3, §4).
#[derive(Debug)]
pub struct Decoder {
    /// Newest entry first.
    table: VecDeque<(Vec<u8>, Vec<u8>)>,
    /// Current size of `table` per RFC 7541 §4.1.
    size: usize,
    /// Current maximum size, set by the encoder's size updates.
    max_size: usize,
    /// The bound on `max_size`: the SETTINGS_HEADER_TABLE_SIZE the encoder works under.
    limit: usize,
}

impl Decoder {
    /// A decoder for an encoder working under a SETTINGS_HEADER_TABLE_SIZE of `limit` (the
    /// table starts at that size, as RFC 7541 §4.2 has it).
    pub fn new(limit: usize) -> Self {
        Decoder {
            table: VecDeque::new(),
            size: 0,
            max_size: limit,
            limit,
        }
    }

    /// Decodes one complete header block, updating the table, and hands each field in order
    /// to `field`. On an error the table may hold part of the block: the connection is over.
    pub fn decode_with(&mut self, block: &[u8], mut field: impl FnMut(Field<'_>)) -> Result<()> {
        let mut src = block;
        let mut seen_field = false;
        let mut list_size = 0usize;
        let mut count = |name: &[u8], value: &[u8]| {
            list_size += name.len() + value.len() + ENTRY_OVERHEAD;
            if list_size > MAX_HEADER_LIST {
                return Err(Error::HeaderListTooLarge {
                    limit: MAX_HEADER_LIST,
                });
            }
            Ok(())
        };
        while let Some(&first) = src.first() {
            if first & 0x80 != 0 {
                // Indexed field (§6.1).
                let index = decode_int(&mut src, 7)?;
                let (name, value) = self.lookup(index)?;
                count(name, value)?;
                field(Field {
                    name,
                    value,
                    never_indexed: false,
                });
            } else if first & 0xc0 == 0x40 {
                // Literal with incremental indexing (§6.2.1).
                let (name, value) = self.literal(&mut src, 6)?;
                count(&name, &value)?;
                field(Field {
                    name: &name,
                    value: &value,
                    never_indexed: false,
                });
                let (name, value) = (name.into_owned(), value.into_owned());
                self.insert(name, value);
            } else if first & 0xe0 == 0x20 {
                // Dynamic table size update (§6.3): only before the block's first field.
                if seen_field {
                    return Err(Error::LateTableSizeUpdate);
                }
                let requested = decode_int(&mut src, 5)?;
                if requested > self.limit {
                    return Err(Error::TableSizeTooLarge {
                        requested,
                        limit: self.limit,
                    });
                }
                self.max_size = requested;
                self.evict(0);
                continue;
            } else {
                // Literal without indexing (§6.2.2) or never indexed (§6.2.3).
                let never_indexed = first & 0x10 != 0;
                let (name, value) = self.literal(&mut src, 4)?;
                count(&name, &value)?;
                field(Field {
                    name: &name,
                    value: &value,
                    never_indexed,
                });
            }
            seen_field = true;
        }
        Ok(())
    }

    /// Decodes one complete header block into its fields (see [`Decoder::decode_with`]).
    pub fn decode(&mut self, block: &[u8]) -> Result<Vec<HeaderField>> {
        let mut fields = Vec::new();
        self.decode_with(block, |field| fields.push(field.into()))?;
        Ok(fields)
    }

    /// A literal representation whose name index has a `prefix`-bit prefix: name and value.
    fn literal<'a, 'b: 'a>(&'a self, src: &mut &'b [u8], prefix: u8) -> Result<Literal<'a>> {
        let index = decode_int(src, prefix)?;
        let name = if index == 0 {
            decode_string(src)?
        } else {
            Cow::Borrowed(self.lookup(index)?.0)
        };
        let value = decode_string(src)?;
        Ok((name, value))
    }

    /// The entry at `index` in the combined static and dynamic index space.
    fn lookup(&self, index: usize) -> Result<(&[u8], &[u8])> {
        if let Some(&(name, value)) = index.checked_sub(1).and_then(|i| STATIC_TABLE.get(i)) {
            return Ok((name.as_bytes(), value.as_bytes()));
        }
        index
            .checked_sub(STATIC_ENTRIES + 1)
            .and_then(|i| self.table.get(i))
            .map(|(name, value)| (name.as_slice(), value.as_slice()))
            .ok_or(Error::InvalidIndex(index))
    }

    /// Adds an entry (RFC 7541 §4.4): one larger than the table empties it.
    fn insert(&mut self, name: Vec<u8>, value: Vec<u8>) {
        let entry = name.len() + value.len() + ENTRY_OVERHEAD;
        if entry > self.max_size {
            self.table.clear();
            self.size = 0;
            return;
        }
        self.evict(entry);
        self.size += entry;
        self.table.push_front((name, value));
    }

    /// Evicts the oldest entries until `room` more bytes fit.
    fn evict(&mut self, room: usize) {
        while self.size + room > self.max_size {
            match self.table.pop_back() {
                Some((name, value)) => self.size -= name.len() + value.len() + ENTRY_OVERHEAD,
                None => break,
            }
        }
    }
}

/// Decodes an integer with a `prefix`-bit prefix (RFC 7541 §5.1), advancing `src`.
fn decode_int(src: &mut &[u8], prefix: u8) -> Result<usize> {
    let (&first, rest) = src.split_first().ok_or(Error::Truncated)?;
    *src = rest;
    let max = (1usize << prefix) - 1;
    let mut value = usize::from(first) & max;
    if value < max {
        return Ok(value);
    }
    let mut shift = 0;
    loop {
        let (&byte, rest) = src.split_first().ok_or(Error::Truncated)?;
        *src = rest;
        if shift > 21 {
            // More than 28 bits: far beyond any size we accept.
            return Err(Error::IntegerOverflow);
        }
        value += usize::from(byte & 0x7f) << shift;
        shift += 7;
        if byte & 0x80 == 0 {
            return Ok(value);
        }
    }
}

/// Decodes a string literal (RFC 7541 §5.2), advancing `src`; a raw string is borrowed.
fn decode_string<'a>(src: &mut &'a [u8]) -> Result<Cow<'a, [u8]>> {
    let huffman = src.first().ok_or(Error::Truncated)? & 0x80 != 0;
    let len = decode_int(src, 7)?;
    if len > src.len() {
        return Err(Error::Truncated);
    }
    let (data, rest) = src.split_at(len);
    *src = rest;
    if huffman {
        huffman_decode(data).map(Cow::Owned)
    } else {
        Ok(Cow::Borrowed(data))
    }
}

/// Appends an integer with a `prefix`-bit prefix (1 to 7 bits) after the bits in `tag` (RFC
/// 7541 §5.1).
pub fn encode_int(out: &mut impl BufMut, tag: u8, prefix: u8, value: usize) {
    let max = (1u8 << prefix) - 1;
    match u8::try_from(value) {
        Ok(v) if v < max => out.put_u8(tag | v),
        _ => {
            out.put_u8(tag | max);
            let mut rest = value - usize::from(max);
            while rest >= 0x80 {
                out.put_u8(0x80 | (rest & 0x7f) as u8);
                rest >>= 7;
            }
            out.put_u8(rest as u8);
        }
    }
}

/// Appends a raw (not Huffman-coded) string literal.
pub fn encode_string(out: &mut impl BufMut, s: &[u8]) {
    encode_int(out, 0x00, 7, s.len());
    out.put_slice(s);
}

/// The static table index of the first entry named `name`.
pub fn static_name_index(name: &[u8]) -> Option<usize> {
    STATIC_TABLE
        .iter()
        .position(|(n, _)| n.as_bytes() == name)
        .map(|i| i + 1)
}

/// Appends `field` as a literal that never enters the peer's table: without indexing, or
/// never indexed if it came so; the name by static index where one matches, raw strings.
pub fn encode_literal(out: &mut impl BufMut, field: &HeaderField) {
    let tag = if field.never_indexed { 0x10 } else { 0x00 };
    match static_name_index(&field.name) {
        Some(index) => encode_int(out, tag, 4, index),
        None => {
            encode_int(out, tag, 4, 0);
            encode_string(out, &field.name);
        }
    }
    encode_string(out, &field.value);
}

/// Marks a leaf in [`huffman_tree`] nodes; the low bits hold the symbol.
const HUFFMAN_LEAF: u16 = 0x8000;
/// The end-of-string symbol, which must never appear decoded.
const HUFFMAN_EOS: u16 = 256;

/// The Huffman decoding tree built once from [`HUFFMAN_CODES`]: node 0 is the root, and each
/// node's two children (bit 0, bit 1) are a node index or `HUFFMAN_LEAF | symbol`.
fn huffman_tree() -> &'static [[u16; 2]] {
    static TREE: OnceLock<Vec<[u16; 2]>> = OnceLock::new();
    TREE.get_or_init(|| {
        let mut nodes = vec![[0u16; 2]];
        for (symbol, &(code, len)) in (0u16..).zip(HUFFMAN_CODES.iter()) {
            let mut node = 0;
            for bit_pos in (0..len).rev() {
                let bit = usize::from(code >> bit_pos & 1 == 1);
                if bit_pos == 0 {
                    nodes[node][bit] = HUFFMAN_LEAF | symbol;
                } else if nodes[node][bit] == 0 {
                    nodes.push([0; 2]);
                    let next = nodes.len() - 1;
                    nodes[node][bit] =
                        u16::try_from(next).expect("a 257-symbol code has 256 inner nodes");
                    node = next;
                } else {
                    node = usize::from(nodes[node][bit]);
                }
            }
        }
        nodes
    })
}

/// Decodes a Huffman-coded string (RFC 7541 §5.2, Appendix B).
fn huffman_decode(src: &[u8]) -> Result<Vec<u8>> {
    let tree = huffman_tree();
    let mut out = Vec::with_capacity(src.len() * 8 / 5 + 1);
    let mut node = 0;
    // Bits read since the last symbol, and whether they were all ones.
    let mut pad_bits = 0;
    let mut pad_ones = true;
    for &byte in src {
        for bit_pos in (0..8).rev() {
            let bit = byte >> bit_pos & 1;
            let next = tree[node][usize::from(bit)];
            if next & HUFFMAN_LEAF != 0 {
                let symbol = next & !HUFFMAN_LEAF;
                if symbol == HUFFMAN_EOS {
                    return Err(Error::HuffmanEos);
                }
                out.push(u8::try_from(symbol).map_err(|_| Error::HuffmanEos)?);
                node = 0;
                pad_bits = 0;
                pad_ones = true;
            } else {
                node = usize::from(next);
                pad_bits += 1;
                pad_ones &= bit == 1;
            }
        }
    }
    if pad_bits > 7 || !pad_ones {
        return Err(Error::HuffmanPadding);
    }
    Ok(out)
}

/// A Huffman encoder over the same code, for tests that need what real clients send
/// (`h2` and Go's clients Huffman-code most strings).
pub fn huffman_encode(s: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    let mut acc: u64 = 0;
    let mut bits = 0;
    for &b in s {
        let (code, len) = HUFFMAN_CODES[usize::from(b)];
        acc = acc << len | u64::from(code);
        bits += u32::from(len);
        while bits >= 8 {
            bits -= 8;
            out.push((acc >> bits) as u8);
        }
    }
    if bits > 0 {
        out.push(((acc << (8 - bits)) as u8) | (0xff >> bits));
    }
    out
}

#[cfg(test)]
mod fuzz;
#[cfg(test)]
mod tests;
