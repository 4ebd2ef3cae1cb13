//! A plain Range answered from the key-values as the store holds them (each an encoded
//! `mvccpb.KeyValue`, the very bytes a `RangeResponse` carries), framed for gRPC in chunks.
//!
//! The general path decodes every key-value into a `KeyValue`, then encodes the whole
//! response into one buffer: a reader of a large result holds it twice (and, while the buffer
//! grows, up to three times), and spends its CPU on decoding and encoding again. Here each
//! stored key-value is copied once, into chunks of [`CHUNK`] bytes that the connection sends
//! and frees one after the other, so a reader holds at most the response's size, and less as
//! it goes out. The bytes are the same as the general path's: prost writes a message's fields
//! in field order and leaves out those at their default, and so does [`encode`].
//!
//! Only requests whose answer is the store's key order taken as it is go here
//! ([`is_plain`]): no sort other than by key ascending, no revision filters, not keys-only
//! nor count-only.

use bytes::{BufMut, Bytes, BytesMut};
use etcdrs_mvcc::{KeyRange, KvStore, RangeParams};
use etcdrs_proto::etcdserverpb::range_request::{SortOrder, SortTarget};
use etcdrs_proto::etcdserverpb::{RangeRequest, ResponseHeader};
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

/// The answer to the plain range `req` as one gRPC message (prefix included), in chunks;
/// `header` makes the response header for the revision read. `None` when the answer does not
/// fit one gRPC message (4 GiB).
pub fn encode(
    store: &KvStore,
    req: &RangeRequest,
    header: impl FnOnce(i64) -> ResponseHeader,
) -> Result<Option<Vec<Bytes>>> {
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
    let mut first = BytesMut::with_capacity(CHUNK);
    first.put_bytes(0, PREFIX);
    let header = header(range.rev);
    encode_key(1, WireType::LengthDelimited, &mut first);
    encode_varint(header.encoded_len() as u64, &mut first);
    header.encode_raw(&mut first);
    let mut current: Option<BytesMut> = None;
    let mut total = first.len() - PREFIX;
    range.for_each(take, |kv| {
        let field = 1 + encoded_len_varint(kv.len() as u64) + kv.len();
        total += field;
        let full = {
            let buf = current.as_ref().unwrap_or(&first);
            !buf.is_empty() && buf.len() + field > buf.capacity()
        };
        if full {
            // The first chunk keeps its place at the front (its prefix is written last).
            if let Some(full) = current.take() {
                chunks.push(full.freeze());
            }
            current = Some(BytesMut::with_capacity(CHUNK.max(field)));
        }
        write_kv(current.as_mut().unwrap_or(&mut first), kv);
    })?;
    let tail = current.as_mut().unwrap_or(&mut first);
    if more {
        prost::encoding::bool::encode(3, &more, tail);
        total += 2;
    }
    if range.count != 0 {
        let before = tail.len();
        prost::encoding::int64::encode(4, &range.count, tail);
        total += tail.len() - before;
    }
    let Ok(len) = u32::try_from(total) else {
        return Ok(None);
    };
    first[1..PREFIX].copy_from_slice(&len.to_be_bytes());
    let mut framed = Vec::with_capacity(chunks.len() + 2);
    framed.push(first.freeze());
    framed.extend(chunks);
    if let Some(last) = current {
        framed.push(last.freeze());
    }
    Ok(Some(framed))
}

/// `kvs` (field 2) holding the encoded key-value `kv`.
fn write_kv(buf: &mut BytesMut, kv: &[u8]) {
    encode_key(2, WireType::LengthDelimited, buf);
    encode_varint(kv.len() as u64, buf);
    buf.put_slice(kv);
}
