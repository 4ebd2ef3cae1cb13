//! A plain Range answered from the key-values as the store holds them (each an encoded
//! `mvccpb.KeyValue`, the very bytes a `RangeResponse` carries), framed for gRPC in chunks.
//!
//! The general path decodes every key-value into a `KeyValue`, then encodes the whole
//! response into one buffer: a reader of a large result holds it twice (and, while the buffer
//! grows, up to three times), and spends its CPU on decoding and encoding again. Here each
//! stored key-value is copied once, into chunks of [`CHUNK`] bytes that the connection sends
//! and frees one after the other, so a reader holds at most the response's size, and less as
//! it goes out. The bytes are the same as the general path's: prost writes a message's fields
//! in field order and leaves out those at their default, and so do [`encode_body`] and
//! [`Body::framed`] (the header, field 1, is put in front of the rest when the answer is sent,
//! so that a page read ahead gets the header of the time it is sent: `read_ahead`).
//!
//! Only requests whose answer is the store's key order taken as it is go here
//! ([`is_plain`]): no sort other than by key ascending, no revision filters, not keys-only
//! nor count-only.

use bytes::{BufMut, Bytes, BytesMut};
use etcdrs_mvcc::{KeyRange, KvStore, RangeParams};
use etcdrs_proto::etcdserverpb::range_request::{SortOrder, SortTarget};
use etcdrs_proto::etcdserverpb::{RangeRequest, ResponseHeader};
use etcdrs_proto::mvccpb::KeyValue;
use prost::Message;
use prost::encoding::{WireType, encode_key, encode_varint, encoded_len_varint};

use crate::error::Result;

/// Bytes of a chunk of the answer.
const CHUNK: usize = 1 << 20;
/// gRPC's message prefix: the compressed flag and the 32-bit length.
const PREFIX: usize = 5;

/// Whether `req`'s answer is the store's key order as it is.
pub fn is_plain(req: &RangeRequest) -> bool {
    let order = SortOrder::try_from(req.sort_order).unwrap_or(SortOrder::None);
    let target = SortTarget::try_from(req.sort_target).unwrap_or(SortTarget::Key);
    target == SortTarget::Key
        && matches!(order, SortOrder::None | SortOrder::Ascend)
        && req.min_mod_revision == 0
        && req.max_mod_revision == 0
        && req.min_create_revision == 0
        && req.max_create_revision == 0
        && !req.keys_only
        && !req.count_only
}

/// A plain range's answer without its header: the `kvs`, `more` and `count` fields of a
/// `RangeResponse`, encoded, in chunks; [`Body::framed`] puts the header and gRPC's prefix in
/// front.
#[derive(Debug)]
pub struct Body {
    chunks: Vec<Bytes>,
    /// Bytes of `chunks`.
    len: usize,
    /// The store's current revision when read (the header of an answer read at revision 0).
    pub rev: i64,
    /// The revision the key-values were read at.
    pub read_rev: i64,
    /// Whether keys past the limit remain (the answer's `more`).
    pub more: bool,
    /// The key of the last key-value answered.
    pub last_key: Option<Vec<u8>>,
}

impl Body {
    /// Bytes of the key-values, `more` and `count`.
    pub fn bytes(&self) -> usize {
        self.len
    }

    /// The answer as one gRPC message (prefix included), in chunks, under `header`. `None`
    /// when it does not fit one gRPC message (4 GiB).
    pub fn framed(self, header: &ResponseHeader) -> Option<Vec<Bytes>> {
        let header_len = header.encoded_len();
        let field = 1 + encoded_len_varint(header_len as u64) + header_len;
        let len = u32::try_from(field + self.len).ok()?;
        let mut head = BytesMut::with_capacity(PREFIX + field);
        head.put_u8(0);
        head.put_u32(len);
        encode_key(1, WireType::LengthDelimited, &mut head);
        encode_varint(header_len as u64, &mut head);
        header.encode_raw(&mut head);
        let mut framed = Vec::with_capacity(self.chunks.len() + 1);
        framed.push(head.freeze());
        framed.extend(self.chunks);
        Some(framed)
    }
}

/// The key-values, `more` and `count` of the plain range `req`'s answer ([`Body`]).
pub fn encode_body(store: &KvStore, req: &RangeRequest) -> Result<Body> {
    debug_assert!(is_plain(req));
    // One extra key tells whether there are more.
    let limit = if req.limit <= 0 { 0 } else { req.limit + 1 };
    let range = store.range_encoded(
        KeyRange::new(&req.key, &req.range_end),
        RangeParams {
            rev: req.revision,
            limit,
            count_only: false,
        },
    )?;
    let take = if req.limit > 0 {
        range.len().min(req.limit as usize)
    } else {
        range.len()
    };
    let more = take < range.len();

    let mut chunks = Vec::new();
    let mut current = BytesMut::new();
    let mut len = 0;
    let mut seen = 0;
    let mut last_key = None;
    range.for_each(take, |kv| {
        let field = 1 + encoded_len_varint(kv.len() as u64) + kv.len();
        len += field;
        if current.len() + field > current.capacity() {
            if !current.is_empty() {
                chunks.push(std::mem::take(&mut current).freeze());
            }
            current = BytesMut::with_capacity(CHUNK.max(field));
        }
        write_kv(&mut current, kv);
        seen += 1;
        if seen == take {
            // The stored key-value's key, for the page after this one.
            last_key = KeyValue::decode(kv).ok().map(|kv| kv.key);
        }
    })?;
    if more {
        prost::encoding::bool::encode(3, &more, &mut current);
        len += 2;
    }
    if range.count != 0 {
        let before = current.len();
        prost::encoding::int64::encode(4, &range.count, &mut current);
        len += current.len() - before;
    }
    if !current.is_empty() {
        chunks.push(current.freeze());
    }
    Ok(Body {
        chunks,
        len,
        rev: range.rev,
        read_rev: range.read_rev,
        more,
        last_key,
    })
}

#[cfg(test)]
impl Body {
    /// A body of `len` bytes (none of them real) with these fields.
    pub(crate) fn for_test(
        more: bool,
        len: usize,
        read_rev: i64,
        last_key: Option<Vec<u8>>,
    ) -> Body {
        Body {
            chunks: Vec::new(),
            len,
            rev: read_rev,
            read_rev,
            more,
            last_key,
        }
    }
}

/// `kvs` (field 2) holding the encoded key-value `kv`.
fn write_kv(buf: &mut BytesMut, kv: &[u8]) {
    encode_key(2, WireType::LengthDelimited, buf);
    encode_varint(kv.len() as u64, buf);
    buf.put_slice(kv);
}
