//! A plain Range answered from the key-values as the store holds them (each an encoded
//! `mvccpb.KeyValue`, the very bytes a `RangeResponse` carries), framed for gRPC in chunks.
//!
//! The general path decodes every key-value into a `KeyValue`, then encodes the whole
//! response into one buffer: a reader of a large result holds it twice (and, while the buffer
//! grows, up to three times), and spends its CPU on decoding and encoding again. Here each
//! stored key-value is copied once, into chunks of [`CHUNK`] bytes that the connection sends
//! and frees one after the other, so a reader holds at most the response's size, and less as
//! it goes out. An answer larger than [`HELD_BYTES`] is not held whole: past that, the length
//! of the rest is counted in a pass over its values (the prefix needs it), then each further
//! chunk is written when the connection asks for it ([`Framed::Produced`]), so that a reader
//! of 200,000 values of 1 KiB holds about 9 MiB instead of 200, and one that stops reading
//! holds its read transaction and what was held. The bytes are the same
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
    /// A large answer, written a chunk at a time as the connection asks for the next one, so
    /// that the reader never holds it whole (`serve::unary::answer_produced`). A read error
    /// ends it with its text.
    Produced(Box<dyn FnMut() -> Option<std::result::Result<Bytes, String>> + Send>),
}

/// Bytes of an answer written before its length is known: an answer this size or smaller is
/// written in one pass and held whole (most are); a larger one holds this much, counts the
/// length of the rest in a pass over its values (the prefix needs the whole length), then
/// writes the rest a chunk at a time as the connection asks for it ([`Framed::Produced`]).
const HELD_BYTES: usize = 8 << 20;

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
    let mut answer = Answer {
        header: header(range.rev),
        more: take < range.len(),
        count: range.count,
        take,
        range,
        next: 0,
        begun: false,
        done: false,
        written: 0,
    };
    let mut held = Vec::new();
    let mut held_bytes = 0;
    while held_bytes < HELD_BYTES
        && let Some(chunk) = answer.next_chunk()?
    {
        held_bytes += chunk.len();
        held.push(chunk);
    }
    let whole = answer.done;
    let total = if whole {
        answer.written
    } else {
        answer.written + answer.rest_len()?
    };
    let Ok(len) = u32::try_from(total) else {
        return Ok(None);
    };
    if let Some(first) = held.first_mut() {
        first[1..PREFIX].copy_from_slice(&len.to_be_bytes());
    }
    let mut held: std::collections::VecDeque<Bytes> =
        held.into_iter().map(BytesMut::freeze).collect();
    if whole {
        return Ok(Some(Framed::Chunks(held.into())));
    }
    Ok(Some(Framed::Produced(Box::new(move || {
        if let Some(chunk) = held.pop_front() {
            return Some(Ok(chunk));
        }
        let failure = match answer.next_chunk() {
            Ok(Some(chunk)) => return Some(Ok(chunk.freeze())),
            Ok(None) if answer.written == total => return None,
            Ok(None) => format!(
                "range answer of {} bytes where {total} were counted",
                answer.written
            ),
            Err(e) => e.to_string(),
        };
        tracing::warn!(error = %failure, "failed to write a range answer");
        answer.done = true;
        Some(Err(failure))
    }))))
}

/// A plain range's answer as it is written, a chunk at a time.
struct Answer {
    range: etcdrs_mvcc::EncodedRange,
    header: ResponseHeader,
    /// Key-values it carries.
    take: usize,
    more: bool,
    count: i64,
    /// The next key-value to write.
    next: usize,
    /// Whether the prefix and header are written.
    begun: bool,
    /// Whether the last chunk is written.
    done: bool,
    /// Bytes of the message written so far (without the prefix).
    written: usize,
}

impl Answer {
    /// Bytes of the message not written yet: one pass over the rest of the key-values'
    /// lengths (in revision order: a scan of the backend where it can), then `more` and the
    /// count.
    fn rest_len(&self) -> Result<usize> {
        let total = self.range.sum_lens_from(self.next, self.take, |len| {
            1 + encoded_len_varint(len as u64) + len
        })?;
        let more = if self.more { 2 } else { 0 };
        let count = if self.count != 0 {
            1 + encoded_len_varint(self.count as u64)
        } else {
            0
        };
        Ok(total + more + count)
    }

    /// The next chunk of the message: about [`CHUNK`] bytes (it ends with the key-value that
    /// reached that size), the first with the prefix and header, the last with `more` and the
    /// count; `None` once the last was written.
    fn next_chunk(&mut self) -> Result<Option<BytesMut>> {
        if self.done {
            return Ok(None);
        }
        // Room for the key-value that takes it past the size without a reallocation (the
        // part never written is never touched).
        let mut chunk = BytesMut::with_capacity(2 * CHUNK);
        if !self.begun {
            self.begun = true;
            // The length goes in once it is known.
            chunk.put_bytes(0, PREFIX);
            encode_key(1, WireType::LengthDelimited, &mut chunk);
            encode_varint(self.header.encoded_len() as u64, &mut chunk);
            self.header.encode_raw(&mut chunk);
            self.written += chunk.len() - PREFIX;
        }
        let mut written = 0;
        self.next = self.range.for_each_from(self.next, self.take, |kv| {
            let before = chunk.len();
            write_kv(&mut chunk, kv);
            written += chunk.len() - before;
            chunk.len() < CHUNK
        })?;
        if self.next >= self.take {
            let before = chunk.len();
            if self.more {
                prost::encoding::bool::encode(3, &self.more, &mut chunk);
            }
            if self.count != 0 {
                prost::encoding::int64::encode(4, &self.count, &mut chunk);
            }
            written += chunk.len() - before;
            self.done = true;
        }
        self.written += written;
        Ok(Some(chunk))
    }
}

/// `kvs` (field 2) holding the encoded key-value `kv`.
fn write_kv(buf: &mut BytesMut, kv: &[u8]) {
    encode_key(2, WireType::LengthDelimited, buf);
    encode_varint(kv.len() as u64, buf);
    buf.put_slice(kv);
}
