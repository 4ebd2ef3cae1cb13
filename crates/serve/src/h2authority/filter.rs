//! The frame walker behind [`LenientAuthority`](super::LenientAuthority): it splits the
//! client's bytes into frames, forwards every frame but HEADERS/CONTINUATION as it is, and
//! HPACK-decodes each header block to turn a URL-shaped `:authority` into `host:port`,
//! re-encoding the block with literals that never touch the server's dynamic table. It does
//! no I/O: bytes in, bytes out.

use bytes::{Buf, BytesMut};
use etcdrs_hpack::{Decoder, HeaderField};

use super::*;
use crate::error::{Error, Result};

/// The HTTP/2 frame walker for one connection.
pub(super) struct FrameFilter {
    /// Payload bytes of the current pass-through frame still to forward.
    pub(super) forward: usize,
    /// A header block waiting for CONTINUATION frames.
    pending: Option<PendingBlock>,
    /// Tracks the client's HPACK encoder.
    decoder: Decoder,
    /// Whether a complete header block has been seen (the first one decides).
    seen_block: bool,
}

/// What the first header block of a connection showed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Verdict {
    /// No complete header block seen yet, or one that needed rewriting: keep filtering.
    Filtering,
    /// The first header block had no URL-shaped `:authority` and went through unchanged.
    Clean,
}

/// A header block collected so far.
pub(super) struct PendingBlock {
    stream: u32,
    end_stream: bool,
    fragment: Vec<u8>,
}

impl FrameFilter {
    pub(super) fn new() -> Self {
        FrameFilter {
            forward: 0,
            pending: None,
            decoder: Decoder::new(HEADER_TABLE_SIZE),
            seen_block: false,
        }
    }

    /// Moves whole units from `inbuf` to `out`: pass-through bytes as they come, header
    /// blocks once complete. Returns [`Verdict::Clean`] right after the connection's first
    /// header block if that block needed no rewriting; it was then forwarded as the client
    /// encoded it, and the caller may stop filtering.
    pub(super) fn process(&mut self, inbuf: &mut BytesMut, out: &mut BytesMut) -> Result<Verdict> {
        loop {
            if self.forward > 0 {
                let n = self.forward.min(inbuf.len());
                if n == 0 {
                    return Ok(Verdict::Filtering);
                }
                out.extend_from_slice(&inbuf[..n]);
                inbuf.advance(n);
                self.forward -= n;
                continue;
            }
            if inbuf.len() < FRAME_HEADER_LEN {
                return Ok(Verdict::Filtering);
            }
            let len =
                usize::from(inbuf[0]) << 16 | usize::from(inbuf[1]) << 8 | usize::from(inbuf[2]);
            let frame_type = inbuf[3];
            let flags = inbuf[4];
            let stream = u32::from_be_bytes([inbuf[5], inbuf[6], inbuf[7], inbuf[8]]) & 0x7fff_ffff;
            let buffered = match &self.pending {
                Some(p) if frame_type != TYPE_CONTINUATION || p.stream != stream => {
                    return Err(Error::ExpectedContinuation {
                        expected: p.stream,
                        frame_type,
                        stream,
                    });
                }
                Some(p) => p.fragment.len(),
                // A stray CONTINUATION is the server's protocol error to report.
                None if frame_type != TYPE_HEADERS => {
                    out.extend_from_slice(&inbuf[..FRAME_HEADER_LEN]);
                    inbuf.advance(FRAME_HEADER_LEN);
                    self.forward = len;
                    continue;
                }
                None => 0,
            };
            if buffered + len > MAX_HEADER_BLOCK {
                return Err(Error::HeaderBlockTooLarge {
                    stream,
                    limit: MAX_HEADER_BLOCK,
                });
            }
            if inbuf.len() < FRAME_HEADER_LEN + len {
                inbuf.reserve(FRAME_HEADER_LEN + len - inbuf.len());
                return Ok(Verdict::Filtering);
            }
            let frame = inbuf.split_to(FRAME_HEADER_LEN + len);
            let payload = &frame[FRAME_HEADER_LEN..];
            let block = match self.pending.take() {
                Some(mut p) => {
                    p.fragment.extend_from_slice(payload);
                    p
                }
                None => PendingBlock {
                    stream,
                    end_stream: flags & FLAG_END_STREAM != 0,
                    fragment: headers_fragment(flags, payload, stream)?.to_vec(),
                },
            };
            if flags & FLAG_END_HEADERS == 0 {
                self.pending = Some(block);
                continue;
            }
            let mut fields = self.decoder.decode(&block.fragment)?;
            let first = !self.seen_block;
            self.seen_block = true;
            if first && !fields.iter().any(needs_rewrite) {
                // Forward the block exactly as encoded, so the server's HPACK decoder
                // follows the client's encoder from here on without us.
                emit_header_frames(block.stream, block.end_stream, &block.fragment, out);
                return Ok(Verdict::Clean);
            }
            rewrite_authority(&mut fields);
            let mut encoded = Vec::with_capacity(block.fragment.len() * 2);
            for field in &fields {
                etcdrs_hpack::encode_literal(&mut encoded, field);
            }
            emit_header_frames(block.stream, block.end_stream, &encoded, out);
        }
    }
}

/// The header block fragment of a HEADERS frame payload, without padding and priority.
pub(super) fn headers_fragment(flags: u8, payload: &[u8], stream: u32) -> Result<&[u8]> {
    let malformed = Error::MalformedHeaders { stream };
    let mut rest = payload;
    let mut pad = 0;
    if flags & FLAG_PADDED != 0 {
        let (&n, tail) = rest.split_first().ok_or(malformed.clone())?;
        pad = usize::from(n);
        rest = tail;
    }
    if flags & FLAG_PRIORITY != 0 {
        rest = rest.get(5..).ok_or(malformed.clone())?;
    }
    let end = rest.len().checked_sub(pad).ok_or(malformed)?;
    Ok(&rest[..end])
}

/// Appends `block` to `out` as one HEADERS frame, followed by CONTINUATION frames if it does
/// not fit one.
pub(super) fn emit_header_frames(stream: u32, end_stream: bool, block: &[u8], out: &mut BytesMut) {
    let mut rest = block;
    let mut frame_type = TYPE_HEADERS;
    let mut flags = if end_stream { FLAG_END_STREAM } else { 0 };
    loop {
        let (chunk, tail) = rest.split_at(rest.len().min(MAX_EMIT_FRAME));
        rest = tail;
        if rest.is_empty() {
            flags |= FLAG_END_HEADERS;
        }
        let len = chunk.len().to_be_bytes();
        out.extend_from_slice(&len[len.len() - 3..]);
        out.extend_from_slice(&[frame_type, flags]);
        out.extend_from_slice(&stream.to_be_bytes());
        out.extend_from_slice(chunk);
        if rest.is_empty() {
            return;
        }
        frame_type = TYPE_CONTINUATION;
        flags = 0;
    }
}

/// Whether `field` is a URL-shaped `:authority` that hyper would refuse.
pub(super) fn needs_rewrite(field: &HeaderField) -> bool {
    field.name == b":authority" && url_authority(&field.value).is_some()
}

/// Rewrites a URL-shaped `:authority` to its `host[:port]`; drops it if that is empty.
pub(super) fn rewrite_authority(fields: &mut Vec<HeaderField>) {
    fields.retain_mut(|field| {
        if field.name != b":authority" {
            return true;
        }
        match url_authority(&field.value) {
            None => true,
            Some([]) => false,
            Some(host) => {
                field.value = host.to_vec();
                true
            }
        }
    });
}

/// The authority part of `scheme://authority[/path][?query][#fragment]`, or `None` if
/// `value` has no `://`.
pub(super) fn url_authority(value: &[u8]) -> Option<&[u8]> {
    let start = value.windows(3).position(|w| w == b"://")? + 3;
    let rest = &value[start..];
    let end = rest
        .iter()
        .position(|b| matches!(b, b'/' | b'?' | b'#'))
        .unwrap_or(rest.len());
    Some(&rest[..end])
}
