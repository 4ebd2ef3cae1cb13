//! A plain Range answered from the key-values as the store holds them (each an encoded
//! `mvccpb.KeyValue`, the very bytes a `RangeResponse` carries), framed for gRPC in chunks.
//!
//! The general path decodes every key-value into a `KeyValue`, then encodes the whole
//! response into one buffer: a reader of a large result holds it twice (and, while the buffer
//! grows, up to three times), and spends its CPU on decoding and encoding again. Here each
//! stored key-value is copied once, into chunks of [`CHUNK`] bytes that the connection sends
//! and frees one after the other, so a reader holds at most the response's size, and less as
//! it goes out. An answer of more than [`PRODUCED_PAST`] key-values is not held at all: its
//! length is counted in a first pass over the values (the prefix needs it), then a blocking
//! thread writes the chunks a few ahead of the connection ([`Framed::Produced`]), so that a
//! reader of 200,000 values of 1 KiB holds a few MiB instead of 200. The bytes are the same
//! as the general path's: prost writes a message's fields in field order and leaves out
//! those at their default, and so does [`encode`].
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

/// A plain range's answer, one gRPC message (prefix included) in chunks.
pub enum Framed {
    /// The whole message, held.
    Chunks(Vec<Bytes>),
    /// The message as a blocking thread writes it, a few chunks ahead of the connection (a
    /// large answer): the reader never holds it whole. An error ends it with its text.
    Produced(tokio::sync::mpsc::Receiver<std::result::Result<Bytes, String>>),
}

/// Key-values past which the answer is produced as the connection takes it
/// ([`Framed::Produced`]): its length is counted in a first pass over the values, then the
/// chunks are written in a second.
const PRODUCED_PAST: usize = 1024;
/// Chunks a produced answer is written ahead of the connection.
const CHUNKS_AHEAD: usize = 4;

/// The answer to the plain range `req`; `header` makes the response header for the revision
/// read. `None` when the answer does not fit one gRPC message (4 GiB).
pub fn encode(
    store: &KvStore,
    req: &RangeRequest,
    header: impl FnOnce(i64) -> ResponseHeader,
) -> Result<Option<Framed>> {
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
    let answer = Answer {
        header: header(range.rev),
        more: take < range.len(),
        count: range.count,
        take,
        range,
    };
    if take <= PRODUCED_PAST {
        let mut chunks = Vec::new();
        let total = answer.write(0, &mut |chunk| {
            chunks.push(chunk);
            true
        })?;
        let Ok(len) = u32::try_from(total) else {
            return Ok(None);
        };
        if let Some(first) = chunks.first_mut() {
            first[1..PREFIX].copy_from_slice(&len.to_be_bytes());
        }
        return Ok(Some(Framed::Chunks(
            chunks.into_iter().map(BytesMut::freeze).collect(),
        )));
    }
    let Ok(len) = u32::try_from(answer.len()?) else {
        return Ok(None);
    };
    let (tx, rx) = tokio::sync::mpsc::channel(CHUNKS_AHEAD);
    tokio::task::spawn_blocking(move || {
        let written = answer.write(len, &mut |chunk| {
            tx.blocking_send(Ok(chunk.freeze())).is_ok()
        });
        let failure = match written {
            Ok(total) if total == len as usize => return,
            // The connection went away.
            Ok(_) if tx.is_closed() => return,
            Ok(total) => format!("range answer of {total} bytes where {len} were counted"),
            Err(e) => e.to_string(),
        };
        tracing::warn!(error = %failure, "failed to write a range answer");
        let _ = tx.blocking_send(Err(failure));
    });
    Ok(Some(Framed::Produced(rx)))
}

/// What a plain range answers, before it is written.
struct Answer {
    range: etcdrs_mvcc::EncodedRange,
    header: ResponseHeader,
    /// Key-values it carries.
    take: usize,
    more: bool,
    count: i64,
}

impl Answer {
    /// The message's length (without the prefix): one pass over the key-values' lengths.
    fn len(&self) -> Result<usize> {
        let header = self.header.encoded_len();
        let mut total = 1 + encoded_len_varint(header as u64) + header;
        self.range.for_each(self.take, |kv| {
            total += 1 + encoded_len_varint(kv.len() as u64) + kv.len();
        })?;
        Ok(total + self.tail_len())
    }

    /// Bytes of `more` and the count, at the end.
    fn tail_len(&self) -> usize {
        let more = if self.more { 2 } else { 0 };
        let count = if self.count != 0 {
            1 + encoded_len_varint(self.count as u64)
        } else {
            0
        };
        more + count
    }

    /// Writes the message, its prefix saying `len`, in chunks of about [`CHUNK`] bytes handed
    /// to `emit` as each fills (the last too), until `emit` returns false; returns the
    /// message's length (without the prefix) as far as it was written.
    fn write(&self, len: u32, emit: &mut dyn FnMut(BytesMut) -> bool) -> Result<usize> {
        let mut current = BytesMut::with_capacity(CHUNK);
        current.put_u8(0);
        current.put_u32(len);
        encode_key(1, WireType::LengthDelimited, &mut current);
        encode_varint(self.header.encoded_len() as u64, &mut current);
        self.header.encode_raw(&mut current);
        let mut total = current.len() - PREFIX;
        let mut open = true;
        self.range.for_each(self.take, |kv| {
            if !open {
                return;
            }
            let field = 1 + encoded_len_varint(kv.len() as u64) + kv.len();
            if !current.is_empty() && current.len() + field > current.capacity() {
                let full =
                    std::mem::replace(&mut current, BytesMut::with_capacity(CHUNK.max(field)));
                open = emit(full);
            }
            write_kv(&mut current, kv);
            total += field;
        })?;
        if !open {
            return Ok(total);
        }
        if self.more {
            prost::encoding::bool::encode(3, &self.more, &mut current);
        }
        if self.count != 0 {
            prost::encoding::int64::encode(4, &self.count, &mut current);
        }
        total += self.tail_len();
        emit(current);
        Ok(total)
    }
}

/// `kvs` (field 2) holding the encoded key-value `kv`.
fn write_kv(buf: &mut BytesMut, kv: &[u8]) {
    encode_key(2, WireType::LengthDelimited, buf);
    encode_varint(kv.len() as u64, buf);
    buf.put_slice(kv);
}
