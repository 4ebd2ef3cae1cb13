//! Accept HTTP/2 requests whose `:authority` is a full URL.
//!
//! etcd 3.4's `etcdctl` (grpc-go 1.2x) dials `passthrough:///http://127.0.0.1:2379` and sends
//! `:authority: http://127.0.0.1:2379`. etcd's Go server accepts that; the `h2` crate behind
//! hyper rejects it as a malformed authority and resets the stream with `PROTOCOL_ERROR`.
//!
//! [`LenientAuthority`] sits between the socket and hyper and filters the bytes the client
//! sends. After the HTTP/2 client preface it walks the frames: every frame except HEADERS and
//! their CONTINUATIONs goes through byte-for-byte (DATA is streamed, never buffered). Each header
//! block is HPACK-decoded with a decoder that tracks the client's encoder (RFC 7541), a
//! URL-shaped `:authority` becomes `host:port`, and the block is re-encoded with literal
//! representations that never touch the dynamic table, so the server's decoder table stays
//! empty and consistent whatever the client's encoder does. Only the first header block of a
//! connection is always decoded: if it carries no URL-shaped `:authority` (any client but
//! etcd 3.4's etcdctl), it is forwarded as encoded and the connection passes through from
//! then on, so ordinary clients pay nothing per request. Connections that do not start with
//! the HTTP/2 preface (HTTP/1.x) pass through untouched. Writes are never filtered.

use std::collections::VecDeque;
use std::io;
use std::pin::Pin;
use std::sync::OnceLock;
use std::task::{Context, Poll, ready};

use bytes::{Buf, BytesMut};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// The HTTP/2 client connection preface (RFC 9113 §3.4).
const PREFACE: &[u8; 24] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
/// Length of an HTTP/2 frame header.
const FRAME_HEADER_LEN: usize = 9;
const TYPE_HEADERS: u8 = 0x1;
const TYPE_CONTINUATION: u8 = 0x9;
const FLAG_END_STREAM: u8 = 0x1;
const FLAG_END_HEADERS: u8 = 0x4;
const FLAG_PADDED: u8 = 0x8;
const FLAG_PRIORITY: u8 = 0x20;
/// Largest frame payload we emit: the default SETTINGS_MAX_FRAME_SIZE, which a server can
/// only raise.
const MAX_EMIT_FRAME: usize = 16_384;
/// Largest encoded header block (HEADERS plus CONTINUATIONs) we buffer.
const MAX_HEADER_BLOCK: usize = 1 << 20;
/// Largest decoded header list (RFC 7541 sizes: name + value + 32 per field) we accept.
const MAX_HEADER_LIST: usize = 1 << 20;
/// The server's SETTINGS_HEADER_TABLE_SIZE: hyper leaves it at the protocol default.
const HEADER_TABLE_SIZE: usize = 4096;
/// How much we read from the socket at a time when we have to look at the bytes.
const READ_CHUNK: usize = 16 * 1024;
/// Per-entry overhead in the HPACK table size accounting (RFC 7541 §4.1).
const ENTRY_OVERHEAD: usize = 32;

/// Why a header block could not be decoded (RFC 7541).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
enum HpackError {
    /// The block ended inside a representation.
    #[error("hpack: truncated header block")]
    Truncated,
    /// An integer does not fit the sizes we accept.
    #[error("hpack: integer overflow")]
    IntegerOverflow,
    /// An index is 0 or beyond the static and dynamic tables.
    #[error("hpack: invalid table index {0}")]
    InvalidIndex(usize),
    /// A Huffman string holds the EOS symbol.
    #[error("hpack: huffman string contains EOS")]
    HuffmanEos,
    /// A Huffman string's padding is longer than 7 bits or not all ones.
    #[error("hpack: invalid huffman padding")]
    HuffmanPadding,
    /// A dynamic table size update above the limit the server advertised.
    #[error("hpack: dynamic table size update to {requested} exceeds {limit}")]
    TableSizeTooLarge {
        /// The size the client asked for.
        requested: usize,
        /// The server's SETTINGS_HEADER_TABLE_SIZE.
        limit: usize,
    },
    /// A dynamic table size update after the first header field of a block.
    #[error("hpack: dynamic table size update after a header field")]
    LateTableSizeUpdate,
    /// The decoded header list is larger than we accept.
    #[error("hpack: decoded header list exceeds {limit} bytes")]
    HeaderListTooLarge {
        /// The bound.
        limit: usize,
    },
}

/// Why the client's byte stream cannot be filtered; the connection is closed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
enum FilterError {
    /// A header block failed to decode.
    #[error(transparent)]
    Hpack(#[from] HpackError),
    /// A header block (HEADERS plus CONTINUATIONs) is larger than we buffer.
    #[error("http2: header block on stream {stream} exceeds {limit} bytes")]
    HeaderBlockTooLarge {
        /// The stream the block belongs to.
        stream: u32,
        /// The bound.
        limit: usize,
    },
    /// A HEADERS frame's padding or priority fields do not fit its payload.
    #[error("http2: malformed HEADERS frame on stream {stream}")]
    MalformedHeaders {
        /// The stream the frame belongs to.
        stream: u32,
    },
    /// Another frame arrived while a header block awaited its CONTINUATION.
    #[error(
        "http2: expected CONTINUATION on stream {expected}, got frame type {frame_type} on stream {stream}"
    )]
    ExpectedContinuation {
        /// The stream whose header block is open.
        expected: u32,
        /// The type of the frame that arrived.
        frame_type: u8,
        /// The stream of the frame that arrived.
        stream: u32,
    },
    /// An earlier read failed; the filter's state is lost.
    #[error("http2: connection filter failed earlier")]
    Failed,
}

impl From<FilterError> for io::Error {
    fn from(e: FilterError) -> Self {
        io::Error::new(io::ErrorKind::InvalidData, e)
    }
}

/// Wraps a server-side connection; rewrites a client's HTTP/2 `:authority` that is a full URL
/// (`scheme://host:port[/...]`) to `host:port` before hyper sees it. Everything else passes
/// through byte-for-byte; HTTP/1.x connections (no HTTP/2 preface) pass through untouched.
///
/// The connection's first header block decides. If it has no URL-shaped `:authority`, it is
/// forwarded as encoded and the rest of the connection passes through unfiltered (a client
/// sends one authority per connection). Otherwise every header block is re-encoded (same
/// fields, same order) with literal representations that do not index, so hyper's HPACK
/// decoder never grows a dynamic table.
/// PRIORITY fields and padding of HEADERS frames are dropped. A header block over 1 MiB, or
/// one that does not decode, fails the read with an [`io::Error`] and so closes the connection.
pub struct LenientAuthority<IO> {
    io: IO,
    phase: Phase,
    /// Bytes read from `io` and not yet filtered.
    inbuf: BytesMut,
    /// Filtered bytes not yet handed to the reader.
    out: BytesMut,
    /// `io` reported end of stream.
    eof: bool,
}

/// Where the connection is.
enum Phase {
    /// Matching the first bytes against the HTTP/2 preface.
    Preface,
    /// Not HTTP/2: everything passes through.
    Passthrough,
    /// HTTP/2: filtering frames.
    Frames(Box<FrameFilter>),
    /// A read failed; the state is lost.
    Failed,
}

impl<IO: AsyncRead + AsyncWrite + Unpin> LenientAuthority<IO> {
    /// Wraps `io`, a freshly accepted connection on which nothing has been read yet.
    pub fn new(io: IO) -> Self {
        LenientAuthority {
            io,
            phase: Phase::Preface,
            inbuf: BytesMut::new(),
            out: BytesMut::new(),
            eof: false,
        }
    }

    /// Filters what `inbuf` holds into `out`, as far as whole units allow.
    fn process(&mut self) -> Result<(), FilterError> {
        match &mut self.phase {
            Phase::Preface => {
                let n = self.inbuf.len().min(PREFACE.len());
                if self.inbuf[..n] != PREFACE[..n] {
                    self.out.extend_from_slice(&self.inbuf);
                    self.inbuf.clear();
                    self.phase = Phase::Passthrough;
                } else if n == PREFACE.len() {
                    self.out.extend_from_slice(&self.inbuf[..n]);
                    self.inbuf.advance(n);
                    self.phase = Phase::Frames(Box::new(FrameFilter::new()));
                    return self.process();
                }
                Ok(())
            }
            Phase::Passthrough => {
                self.out.extend_from_slice(&self.inbuf);
                self.inbuf.clear();
                Ok(())
            }
            Phase::Frames(filter) => {
                if filter.process(&mut self.inbuf, &mut self.out)? == Verdict::Clean {
                    // The client's first request named a plain authority: so will the rest
                    // (one channel, one target), and the server's decoder is in step with
                    // the client's encoder, so the bytes need no more looking at.
                    self.phase = Phase::Passthrough;
                    self.out.extend_from_slice(&self.inbuf);
                    self.inbuf.clear();
                }
                Ok(())
            }
            Phase::Failed => Err(FilterError::Failed),
        }
    }

    /// Reads more bytes from `io` into `inbuf`; sets `eof` when there are none.
    fn poll_fill(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let start = self.inbuf.len();
        self.inbuf.resize(start + READ_CHUNK, 0);
        let mut read = ReadBuf::new(&mut self.inbuf[start..]);
        let polled = Pin::new(&mut self.io).poll_read(cx, &mut read);
        let n = read.filled().len();
        self.inbuf.truncate(start + n);
        ready!(polled)?;
        if n == 0 {
            self.eof = true;
        }
        Poll::Ready(Ok(()))
    }
}

impl<IO: AsyncRead + AsyncWrite + Unpin> AsyncRead for LenientAuthority<IO> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if buf.remaining() == 0 {
            return Poll::Ready(Ok(()));
        }
        loop {
            if !this.out.is_empty() {
                let n = this.out.len().min(buf.remaining());
                buf.put_slice(&this.out[..n]);
                this.out.advance(n);
                return Poll::Ready(Ok(()));
            }
            if this.inbuf.is_empty() && !this.eof {
                // Fast paths that read straight into the caller's buffer.
                match &mut this.phase {
                    Phase::Passthrough => return Pin::new(&mut this.io).poll_read(cx, buf),
                    Phase::Frames(filter) if filter.forward >= buf.remaining() => {
                        let before = buf.filled().len();
                        ready!(Pin::new(&mut this.io).poll_read(cx, buf))?;
                        let n = buf.filled().len() - before;
                        filter.forward -= n;
                        return Poll::Ready(Ok(()));
                    }
                    _ => {}
                }
            }
            if let Err(e) = this.process() {
                this.phase = Phase::Failed;
                return Poll::Ready(Err(e.into()));
            }
            if !this.out.is_empty() {
                continue;
            }
            if this.eof {
                if matches!(this.phase, Phase::Preface) && !this.inbuf.is_empty() {
                    // A short stream that looked like the preface so far: not HTTP/2.
                    this.phase = Phase::Passthrough;
                    continue;
                }
                // End of stream; a frame cut short by it is dropped.
                return Poll::Ready(Ok(()));
            }
            ready!(this.poll_fill(cx))?;
        }
    }
}

impl<IO: AsyncWrite + Unpin> AsyncWrite for LenientAuthority<IO> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().io).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().io).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_shutdown(cx)
    }
}

/// The HTTP/2 frame walker for one connection.
struct FrameFilter {
    /// Payload bytes of the current pass-through frame still to forward.
    forward: usize,
    /// A header block waiting for CONTINUATION frames.
    pending: Option<PendingBlock>,
    /// Tracks the client's HPACK encoder.
    decoder: Decoder,
    /// Whether a complete header block has been seen (the first one decides).
    seen_block: bool,
}

/// What the first header block of a connection showed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Verdict {
    /// No complete header block seen yet, or one that needed rewriting: keep filtering.
    Filtering,
    /// The first header block had no URL-shaped `:authority` and went through unchanged.
    Clean,
}

/// A header block collected so far.
struct PendingBlock {
    stream: u32,
    end_stream: bool,
    fragment: Vec<u8>,
}

impl FrameFilter {
    fn new() -> Self {
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
    fn process(
        &mut self,
        inbuf: &mut BytesMut,
        out: &mut BytesMut,
    ) -> Result<Verdict, FilterError> {
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
                    return Err(FilterError::ExpectedContinuation {
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
                return Err(FilterError::HeaderBlockTooLarge {
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
            encode_block(&fields, &mut encoded);
            emit_header_frames(block.stream, block.end_stream, &encoded, out);
        }
    }
}

/// The header block fragment of a HEADERS frame payload, without padding and priority.
fn headers_fragment(flags: u8, payload: &[u8], stream: u32) -> Result<&[u8], FilterError> {
    let malformed = FilterError::MalformedHeaders { stream };
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
fn emit_header_frames(stream: u32, end_stream: bool, block: &[u8], out: &mut BytesMut) {
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
fn needs_rewrite(field: &HeaderField) -> bool {
    field.name == b":authority" && url_authority(&field.value).is_some()
}

/// Rewrites a URL-shaped `:authority` to its `host[:port]`; drops it if that is empty.
fn rewrite_authority(fields: &mut Vec<HeaderField>) {
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
fn url_authority(value: &[u8]) -> Option<&[u8]> {
    let start = value.windows(3).position(|w| w == b"://")? + 3;
    let rest = &value[start..];
    let end = rest
        .iter()
        .position(|b| matches!(b, b'/' | b'?' | b'#'))
        .unwrap_or(rest.len());
    Some(&rest[..end])
}

/// One decoded header field.
#[derive(Debug, Clone, PartialEq, Eq)]
struct HeaderField {
    name: Vec<u8>,
    value: Vec<u8>,
    /// Sent as "never indexed" (RFC 7541 §6.2.3); kept so when re-encoding.
    never_indexed: bool,
}

/// An HPACK decoder (RFC 7541) tracking one peer encoder's dynamic table.
struct Decoder {
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
    fn new(limit: usize) -> Self {
        Decoder {
            table: VecDeque::new(),
            size: 0,
            max_size: limit,
            limit,
        }
    }

    /// Decodes one complete header block, updating the dynamic table.
    fn decode(&mut self, block: &[u8]) -> Result<Vec<HeaderField>, HpackError> {
        let mut src = block;
        let mut fields = Vec::new();
        let mut list_size = 0usize;
        while let Some(&first) = src.first() {
            let field = if first & 0x80 != 0 {
                let index = decode_int(&mut src, 7)?;
                let (name, value) = self.lookup(index)?;
                HeaderField {
                    name: name.to_vec(),
                    value: value.to_vec(),
                    never_indexed: false,
                }
            } else if first & 0xc0 == 0x40 {
                let field = self.literal(&mut src, 6, false)?;
                self.insert(field.name.clone(), field.value.clone());
                field
            } else if first & 0xe0 == 0x20 {
                if !fields.is_empty() {
                    return Err(HpackError::LateTableSizeUpdate);
                }
                let requested = decode_int(&mut src, 5)?;
                if requested > self.limit {
                    return Err(HpackError::TableSizeTooLarge {
                        requested,
                        limit: self.limit,
                    });
                }
                self.max_size = requested;
                self.evict(0);
                continue;
            } else {
                self.literal(&mut src, 4, first & 0x10 != 0)?
            };
            list_size += field.name.len() + field.value.len() + ENTRY_OVERHEAD;
            if list_size > MAX_HEADER_LIST {
                return Err(HpackError::HeaderListTooLarge {
                    limit: MAX_HEADER_LIST,
                });
            }
            fields.push(field);
        }
        Ok(fields)
    }

    /// A literal representation whose name index has a `prefix`-bit prefix.
    fn literal(
        &self,
        src: &mut &[u8],
        prefix: u8,
        never_indexed: bool,
    ) -> Result<HeaderField, HpackError> {
        let index = decode_int(src, prefix)?;
        let name = if index == 0 {
            decode_string(src)?
        } else {
            self.lookup(index)?.0.to_vec()
        };
        let value = decode_string(src)?;
        Ok(HeaderField {
            name,
            value,
            never_indexed,
        })
    }

    /// The entry at `index` in the combined static and dynamic index space.
    fn lookup(&self, index: usize) -> Result<(&[u8], &[u8]), HpackError> {
        if let Some(&(name, value)) = index.checked_sub(1).and_then(|i| STATIC_TABLE.get(i)) {
            return Ok((name.as_bytes(), value.as_bytes()));
        }
        index
            .checked_sub(STATIC_TABLE.len() + 1)
            .and_then(|i| self.table.get(i))
            .map(|(name, value)| (name.as_slice(), value.as_slice()))
            .ok_or(HpackError::InvalidIndex(index))
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
fn decode_int(src: &mut &[u8], prefix: u8) -> Result<usize, HpackError> {
    let (&first, rest) = src.split_first().ok_or(HpackError::Truncated)?;
    *src = rest;
    let max = (1usize << prefix) - 1;
    let mut value = usize::from(first) & max;
    if value < max {
        return Ok(value);
    }
    let mut shift = 0;
    loop {
        let (&byte, rest) = src.split_first().ok_or(HpackError::Truncated)?;
        *src = rest;
        if shift > 21 {
            // More than 28 bits: far beyond any size we accept.
            return Err(HpackError::IntegerOverflow);
        }
        value += usize::from(byte & 0x7f) << shift;
        shift += 7;
        if byte & 0x80 == 0 {
            return Ok(value);
        }
    }
}

/// Decodes a string literal (RFC 7541 §5.2), advancing `src`.
fn decode_string(src: &mut &[u8]) -> Result<Vec<u8>, HpackError> {
    let huffman = src.first().ok_or(HpackError::Truncated)? & 0x80 != 0;
    let len = decode_int(src, 7)?;
    if len > src.len() {
        return Err(HpackError::Truncated);
    }
    let (data, rest) = src.split_at(len);
    *src = rest;
    if huffman {
        huffman_decode(data)
    } else {
        Ok(data.to_vec())
    }
}

/// Encodes `fields` with literal-without-indexing (or never-indexed, as received)
/// representations and raw strings, naming a static table entry where one matches.
fn encode_block(fields: &[HeaderField], out: &mut Vec<u8>) {
    for field in fields {
        let tag = if field.never_indexed { 0x10 } else { 0x00 };
        match STATIC_TABLE
            .iter()
            .position(|(name, _)| name.as_bytes() == field.name.as_slice())
        {
            Some(i) => encode_int(out, tag, 4, i + 1),
            None => {
                encode_int(out, tag, 4, 0);
                encode_string(out, &field.name);
            }
        }
        encode_string(out, &field.value);
    }
}

/// Encodes an integer with a `prefix`-bit prefix after the bits in `tag` (RFC 7541 §5.1).
fn encode_int(out: &mut Vec<u8>, tag: u8, prefix: u8, value: usize) {
    let max = (1u8 << prefix) - 1;
    match u8::try_from(value) {
        Ok(v) if v < max => out.push(tag | v),
        _ => {
            out.push(tag | max);
            let mut rest = value - usize::from(max);
            while rest >= 0x80 {
                out.push(0x80 | (rest & 0x7f) as u8);
                rest >>= 7;
            }
            out.push(rest as u8);
        }
    }
}

/// Encodes a raw (non-Huffman) string literal.
fn encode_string(out: &mut Vec<u8>, s: &[u8]) {
    encode_int(out, 0x00, 7, s.len());
    out.extend_from_slice(s);
}

/// Marks a leaf in [`huffman_tree`] nodes; the low bits hold the symbol.
const HUFFMAN_LEAF: u16 = 0x8000;
/// The end-of-string symbol, which must never appear decoded.
const HUFFMAN_EOS: u16 = 256;

/// The Huffman decoding tree built from [`HUFFMAN_CODES`]: node 0 is the root, and each
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
fn huffman_decode(src: &[u8]) -> Result<Vec<u8>, HpackError> {
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
                    return Err(HpackError::HuffmanEos);
                }
                out.push(u8::try_from(symbol).map_err(|_| HpackError::HuffmanEos)?);
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
        return Err(HpackError::HuffmanPadding);
    }
    Ok(out)
}

/// The HPACK static table (RFC 7541 Appendix A); index 1 is the first entry.
static STATIC_TABLE: [(&str, &str); 61] = [
    (":authority", ""),
    (":method", "GET"),
    (":method", "POST"),
    (":path", "/"),
    (":path", "/index.html"),
    (":scheme", "http"),
    (":scheme", "https"),
    (":status", "200"),
    (":status", "204"),
    (":status", "206"),
    (":status", "304"),
    (":status", "400"),
    (":status", "404"),
    (":status", "500"),
    ("accept-charset", ""),
    ("accept-encoding", "gzip, deflate"),
    ("accept-language", ""),
    ("accept-ranges", ""),
    ("accept", ""),
    ("access-control-allow-origin", ""),
    ("age", ""),
    ("allow", ""),
    ("authorization", ""),
    ("cache-control", ""),
    ("content-disposition", ""),
    ("content-encoding", ""),
    ("content-language", ""),
    ("content-length", ""),
    ("content-location", ""),
    ("content-range", ""),
    ("content-type", ""),
    ("cookie", ""),
    ("date", ""),
    ("etag", ""),
    ("expect", ""),
    ("expires", ""),
    ("from", ""),
    ("host", ""),
    ("if-match", ""),
    ("if-modified-since", ""),
    ("if-none-match", ""),
    ("if-range", ""),
    ("if-unmodified-since", ""),
    ("last-modified", ""),
    ("link", ""),
    ("location", ""),
    ("max-forwards", ""),
    ("proxy-authenticate", ""),
    ("proxy-authorization", ""),
    ("range", ""),
    ("referer", ""),
    ("refresh", ""),
    ("retry-after", ""),
    ("server", ""),
    ("set-cookie", ""),
    ("strict-transport-security", ""),
    ("transfer-encoding", ""),
    ("user-agent", ""),
    ("vary", ""),
    ("via", ""),
    ("www-authenticate", ""),
];

/// The HPACK Huffman code (RFC 7541 Appendix B): `(code, bit length)` for symbols 0..=255
/// and EOS (256), codes right-aligned.
#[rustfmt::skip]
static HUFFMAN_CODES: [(u32, u8); 257] = [
    (0x1ff8, 13), (0x7fffd8, 23), (0xfffffe2, 28), (0xfffffe3, 28),
    (0xfffffe4, 28), (0xfffffe5, 28), (0xfffffe6, 28), (0xfffffe7, 28),
    (0xfffffe8, 28), (0xffffea, 24), (0x3ffffffc, 30), (0xfffffe9, 28),
    (0xfffffea, 28), (0x3ffffffd, 30), (0xfffffeb, 28), (0xfffffec, 28),
    (0xfffffed, 28), (0xfffffee, 28), (0xfffffef, 28), (0xffffff0, 28),
    (0xffffff1, 28), (0xffffff2, 28), (0x3ffffffe, 30), (0xffffff3, 28),
    (0xffffff4, 28), (0xffffff5, 28), (0xffffff6, 28), (0xffffff7, 28),
    (0xffffff8, 28), (0xffffff9, 28), (0xffffffa, 28), (0xffffffb, 28),
    (0x14, 6), (0x3f8, 10), (0x3f9, 10), (0xffa, 12),
    (0x1ff9, 13), (0x15, 6), (0xf8, 8), (0x7fa, 11),
    (0x3fa, 10), (0x3fb, 10), (0xf9, 8), (0x7fb, 11),
    (0xfa, 8), (0x16, 6), (0x17, 6), (0x18, 6),
    (0x0, 5), (0x1, 5), (0x2, 5), (0x19, 6),
    (0x1a, 6), (0x1b, 6), (0x1c, 6), (0x1d, 6),
    (0x1e, 6), (0x1f, 6), (0x5c, 7), (0xfb, 8),
    (0x7ffc, 15), (0x20, 6), (0xffb, 12), (0x3fc, 10),
    (0x1ffa, 13), (0x21, 6), (0x5d, 7), (0x5e, 7),
    (0x5f, 7), (0x60, 7), (0x61, 7), (0x62, 7),
    (0x63, 7), (0x64, 7), (0x65, 7), (0x66, 7),
    (0x67, 7), (0x68, 7), (0x69, 7), (0x6a, 7),
    (0x6b, 7), (0x6c, 7), (0x6d, 7), (0x6e, 7),
    (0x6f, 7), (0x70, 7), (0x71, 7), (0x72, 7),
    (0xfc, 8), (0x73, 7), (0xfd, 8), (0x1ffb, 13),
    (0x7fff0, 19), (0x1ffc, 13), (0x3ffc, 14), (0x22, 6),
    (0x7ffd, 15), (0x3, 5), (0x23, 6), (0x4, 5),
    (0x24, 6), (0x5, 5), (0x25, 6), (0x26, 6),
    (0x27, 6), (0x6, 5), (0x74, 7), (0x75, 7),
    (0x28, 6), (0x29, 6), (0x2a, 6), (0x7, 5),
    (0x2b, 6), (0x76, 7), (0x2c, 6), (0x8, 5),
    (0x9, 5), (0x2d, 6), (0x77, 7), (0x78, 7),
    (0x79, 7), (0x7a, 7), (0x7b, 7), (0x7ffe, 15),
    (0x7fc, 11), (0x3ffd, 14), (0x1ffd, 13), (0xffffffc, 28),
    (0xfffe6, 20), (0x3fffd2, 22), (0xfffe7, 20), (0xfffe8, 20),
    (0x3fffd3, 22), (0x3fffd4, 22), (0x3fffd5, 22), (0x7fffd9, 23),
    (0x3fffd6, 22), (0x7fffda, 23), (0x7fffdb, 23), (0x7fffdc, 23),
    (0x7fffdd, 23), (0x7fffde, 23), (0xffffeb, 24), (0x7fffdf, 23),
    (0xffffec, 24), (0xffffed, 24), (0x3fffd7, 22), (0x7fffe0, 23),
    (0xffffee, 24), (0x7fffe1, 23), (0x7fffe2, 23), (0x7fffe3, 23),
    (0x7fffe4, 23), (0x1fffdc, 21), (0x3fffd8, 22), (0x7fffe5, 23),
    (0x3fffd9, 22), (0x7fffe6, 23), (0x7fffe7, 23), (0xffffef, 24),
    (0x3fffda, 22), (0x1fffdd, 21), (0xfffe9, 20), (0x3fffdb, 22),
    (0x3fffdc, 22), (0x7fffe8, 23), (0x7fffe9, 23), (0x1fffde, 21),
    (0x7fffea, 23), (0x3fffdd, 22), (0x3fffde, 22), (0xfffff0, 24),
    (0x1fffdf, 21), (0x3fffdf, 22), (0x7fffeb, 23), (0x7fffec, 23),
    (0x1fffe0, 21), (0x1fffe1, 21), (0x3fffe0, 22), (0x1fffe2, 21),
    (0x7fffed, 23), (0x3fffe1, 22), (0x7fffee, 23), (0x7fffef, 23),
    (0xfffea, 20), (0x3fffe2, 22), (0x3fffe3, 22), (0x3fffe4, 22),
    (0x7ffff0, 23), (0x3fffe5, 22), (0x3fffe6, 22), (0x7ffff1, 23),
    (0x3ffffe0, 26), (0x3ffffe1, 26), (0xfffeb, 20), (0x7fff1, 19),
    (0x3fffe7, 22), (0x7ffff2, 23), (0x3fffe8, 22), (0x1ffffec, 25),
    (0x3ffffe2, 26), (0x3ffffe3, 26), (0x3ffffe4, 26), (0x7ffffde, 27),
    (0x7ffffdf, 27), (0x3ffffe5, 26), (0xfffff1, 24), (0x1ffffed, 25),
    (0x7fff2, 19), (0x1fffe3, 21), (0x3ffffe6, 26), (0x7ffffe0, 27),
    (0x7ffffe1, 27), (0x3ffffe7, 26), (0x7ffffe2, 27), (0xfffff2, 24),
    (0x1fffe4, 21), (0x1fffe5, 21), (0x3ffffe8, 26), (0x3ffffe9, 26),
    (0xffffffd, 28), (0x7ffffe3, 27), (0x7ffffe4, 27), (0x7ffffe5, 27),
    (0xfffec, 20), (0xfffff3, 24), (0xfffed, 20), (0x1fffe6, 21),
    (0x3fffe9, 22), (0x1fffe7, 21), (0x1fffe8, 21), (0x7ffff3, 23),
    (0x3fffea, 22), (0x3fffeb, 22), (0x1ffffee, 25), (0x1ffffef, 25),
    (0xfffff4, 24), (0xfffff5, 24), (0x3ffffea, 26), (0x7ffff4, 23),
    (0x3ffffeb, 26), (0x7ffffe6, 27), (0x3ffffec, 26), (0x3ffffed, 26),
    (0x7ffffe7, 27), (0x7ffffe8, 27), (0x7ffffe9, 27), (0x7ffffea, 27),
    (0x7ffffeb, 27), (0xffffffe, 28), (0x7ffffec, 27), (0x7ffffed, 27),
    (0x7ffffee, 27), (0x7ffffef, 27), (0x7fffff0, 27), (0x3ffffee, 26),
    (0x3fffffff, 30),
];

#[cfg(test)]
mod tests {
    use std::convert::Infallible;
    use std::net::SocketAddr;
    use std::time::Duration;

    use hyper::body::Incoming;
    use hyper::service::service_fn;
    use hyper::{Request, Response};
    use hyper_util::rt::{TokioExecutor, TokioIo};
    use hyper_util::server::conn::auto;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::{TcpListener, TcpStream};

    use super::*;

    fn hex(s: &str) -> Vec<u8> {
        let digits: Vec<u8> = s.bytes().filter(|b| !b.is_ascii_whitespace()).collect();
        digits
            .chunks(2)
            .map(|pair| u8::from_str_radix(std::str::from_utf8(pair).unwrap(), 16).unwrap())
            .collect()
    }

    fn fields(list: &[(&str, &str)]) -> Vec<HeaderField> {
        list.iter()
            .map(|(name, value)| HeaderField {
                name: name.as_bytes().to_vec(),
                value: value.as_bytes().to_vec(),
                never_indexed: false,
            })
            .collect()
    }

    fn table(decoder: &Decoder) -> Vec<(String, String)> {
        decoder
            .table
            .iter()
            .map(|(n, v)| {
                (
                    String::from_utf8(n.clone()).unwrap(),
                    String::from_utf8(v.clone()).unwrap(),
                )
            })
            .collect()
    }

    /// Test-only Huffman encoder over the same code table.
    fn huffman_encode(s: &[u8]) -> Vec<u8> {
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

    #[test]
    fn huffman_table_is_a_complete_canonical_code() {
        // Kraft sum exactly 1 (complete, so every bit string decodes) and canonical ordering
        // (codes consecutive in (length, symbol) order), which catches any mistyped entry.
        let kraft: u64 = HUFFMAN_CODES
            .iter()
            .map(|&(_, len)| 1u64 << (30 - len))
            .sum();
        assert_eq!(kraft, 1 << 30);
        let mut order: Vec<usize> = (0..HUFFMAN_CODES.len()).collect();
        order.sort_by_key(|&s| (HUFFMAN_CODES[s].1, s));
        let mut expected = 0u32;
        let mut prev_len = HUFFMAN_CODES[order[0]].1;
        for (i, &s) in order.iter().enumerate() {
            let (code, len) = HUFFMAN_CODES[s];
            if i > 0 {
                expected = (expected + 1) << (len - prev_len);
            }
            assert_eq!(code, expected, "symbol {s}");
            prev_len = len;
        }
        assert_eq!(HUFFMAN_CODES[256], (0x3fff_ffff, 30));
    }

    #[test]
    fn huffman_decodes_rfc7541_examples() {
        let cases = [
            // C.4
            ("f1e3 c2e5 f23a 6ba0 ab90 f4ff", "www.example.com"),
            ("a8eb 1064 9cbf", "no-cache"),
            ("25a8 49e9 5ba9 7d7f", "custom-key"),
            ("25a8 49e9 5bb8 e8b4 bf", "custom-value"),
            // C.6
            ("6402", "302"),
            ("aec3 771a 4b", "private"),
            (
                "d07a be94 1054 d444 a820 0595 040b 8166 e082 a62d 1bff",
                "Mon, 21 Oct 2013 20:13:21 GMT",
            ),
            (
                "9d29 ad17 1863 c78f 0b97 c8e9 ae82 ae43 d3",
                "https://www.example.com",
            ),
        ];
        for (code, text) in cases {
            assert_eq!(
                huffman_decode(&hex(code)).unwrap(),
                text.as_bytes(),
                "{text}"
            );
            assert_eq!(huffman_encode(text.as_bytes()), hex(code), "{text}");
        }
    }

    #[test]
    fn huffman_round_trips_every_byte() {
        let all: Vec<u8> = (0..=255).collect();
        assert_eq!(huffman_decode(&huffman_encode(&all)).unwrap(), all);
        assert_eq!(huffman_decode(&[]).unwrap(), b"");
    }

    #[test]
    fn huffman_rejects_bad_padding_and_eos() {
        // '0' is 00000; zero padding is not EOS's prefix.
        assert_eq!(huffman_decode(&[0x00]), Err(HpackError::HuffmanPadding));
        // A whole byte of padding.
        assert_eq!(
            huffman_decode(&[0x07, 0xff]),
            Err(HpackError::HuffmanPadding)
        );
        // EOS itself (30 ones).
        assert_eq!(
            huffman_decode(&[0xff, 0xff, 0xff, 0xff]),
            Err(HpackError::HuffmanEos)
        );
    }

    type Pairs<'a> = &'a [(&'a str, &'a str)];

    /// Decodes `(block, expected headers, expected dynamic table, expected table size)` in order.
    fn check_sequence(limit: usize, steps: &[(&str, Pairs<'_>, Pairs<'_>, usize)]) {
        let mut decoder = Decoder::new(limit);
        for (i, (block, headers, dynamic, size)) in steps.iter().enumerate() {
            assert_eq!(
                decoder.decode(&hex(block)).unwrap(),
                fields(headers),
                "step {i}"
            );
            let expected: Vec<(String, String)> = dynamic
                .iter()
                .map(|(n, v)| (n.to_string(), v.to_string()))
                .collect();
            assert_eq!(table(&decoder), expected, "step {i}");
            assert_eq!(decoder.size, *size, "step {i}");
        }
    }

    const REQ1: &[(&str, &str)] = &[
        (":method", "GET"),
        (":scheme", "http"),
        (":path", "/"),
        (":authority", "www.example.com"),
    ];
    const REQ2: &[(&str, &str)] = &[
        (":method", "GET"),
        (":scheme", "http"),
        (":path", "/"),
        (":authority", "www.example.com"),
        ("cache-control", "no-cache"),
    ];
    const REQ3: &[(&str, &str)] = &[
        (":method", "GET"),
        (":scheme", "https"),
        (":path", "/index.html"),
        (":authority", "www.example.com"),
        ("custom-key", "custom-value"),
    ];
    const TABLE1: &[(&str, &str)] = &[(":authority", "www.example.com")];
    const TABLE2: &[(&str, &str)] = &[
        ("cache-control", "no-cache"),
        (":authority", "www.example.com"),
    ];
    const TABLE3: &[(&str, &str)] = &[
        ("custom-key", "custom-value"),
        ("cache-control", "no-cache"),
        (":authority", "www.example.com"),
    ];

    #[test]
    fn decodes_rfc7541_c3_requests_without_huffman() {
        check_sequence(
            4096,
            &[
                (
                    "8286 8441 0f77 7777 2e65 7861 6d70 6c65 2e63 6f6d",
                    REQ1,
                    TABLE1,
                    57,
                ),
                ("8286 84be 5808 6e6f 2d63 6163 6865", REQ2, TABLE2, 110),
                (
                    "8287 85bf 400a 6375 7374 6f6d 2d6b 6579 0c63 7573 746f 6d2d 7661 6c75 65",
                    REQ3,
                    TABLE3,
                    164,
                ),
            ],
        );
    }

    #[test]
    fn decodes_rfc7541_c4_requests_with_huffman() {
        check_sequence(
            4096,
            &[
                (
                    "8286 8441 8cf1 e3c2 e5f2 3a6b a0ab 90f4 ff",
                    REQ1,
                    TABLE1,
                    57,
                ),
                ("8286 84be 5886 a8eb 1064 9cbf", REQ2, TABLE2, 110),
                (
                    "8287 85bf 4088 25a8 49e9 5ba9 7d7f 8925 a849 e95b b8e8 b4bf",
                    REQ3,
                    TABLE3,
                    164,
                ),
            ],
        );
    }

    #[test]
    fn decodes_rfc7541_c6_responses_with_eviction() {
        let date1 = "Mon, 21 Oct 2013 20:13:21 GMT";
        let date2 = "Mon, 21 Oct 2013 20:13:22 GMT";
        let loc = "https://www.example.com";
        let cookie = "foo=ASDJKHQKBZXOQWEOPIUAXQWEOIU; max-age=3600; version=1";
        check_sequence(
            256,
            &[
                (
                    "4882 6402 5885 aec3 771a 4b61 96d0 7abe 9410 54d4 44a8 2005 9504 0b81 66e0
                     82a6 2d1b ff6e 919d 29ad 1718 63c7 8f0b 97c8 e9ae 82ae 43d3",
                    &[
                        (":status", "302"),
                        ("cache-control", "private"),
                        ("date", date1),
                        ("location", loc),
                    ],
                    &[
                        ("location", loc),
                        ("date", date1),
                        ("cache-control", "private"),
                        (":status", "302"),
                    ],
                    222,
                ),
                (
                    "4883 640e ffc1 c0bf",
                    &[
                        (":status", "307"),
                        ("cache-control", "private"),
                        ("date", date1),
                        ("location", loc),
                    ],
                    &[
                        (":status", "307"),
                        ("location", loc),
                        ("date", date1),
                        ("cache-control", "private"),
                    ],
                    222,
                ),
                (
                    "88c1 6196 d07a be94 1054 d444 a820 0595 040b 8166 e084 a62d 1bff c05a 839b
                     d9ab 77ad 94e7 821d d7f2 e6c7 b335 dfdf cd5b 3960 d5af 2708 7f36 72c1 ab27
                     0fb5 291f 9587 3160 65c0 03ed 4ee5 b106 3d50 07",
                    &[
                        (":status", "200"),
                        ("cache-control", "private"),
                        ("date", date2),
                        ("location", loc),
                        ("content-encoding", "gzip"),
                        ("set-cookie", cookie),
                    ],
                    &[
                        ("set-cookie", cookie),
                        ("content-encoding", "gzip"),
                        ("date", date2),
                    ],
                    215,
                ),
            ],
        );
    }

    #[test]
    fn table_size_updates() {
        let mut decoder = Decoder::new(4096);
        decoder
            .decode(&hex("8286 8441 0f77 7777 2e65 7861 6d70 6c65 2e63 6f6d"))
            .unwrap();
        assert_eq!(decoder.size, 57);
        // Size update to 0 (empties the table), then back to 4096, then a field.
        assert_eq!(
            decoder.decode(&hex("20 3fe1 1f 82")).unwrap(),
            fields(&[(":method", "GET")])
        );
        assert_eq!((decoder.size, decoder.max_size), (0, 4096));
        assert_eq!(
            decoder.decode(&hex("be")),
            Err(HpackError::InvalidIndex(62))
        );
        // Above the server's limit.
        assert_eq!(
            decoder.decode(&hex("3fe2 1f")),
            Err(HpackError::TableSizeTooLarge {
                requested: 4097,
                limit: 4096
            })
        );
        // After a field.
        assert_eq!(
            decoder.decode(&hex("82 20")),
            Err(HpackError::LateTableSizeUpdate)
        );
        assert_eq!(decoder.decode(&hex("80")), Err(HpackError::InvalidIndex(0)));
        assert_eq!(decoder.decode(&hex("41 0f77")), Err(HpackError::Truncated));
        assert_eq!(
            decoder.decode(&hex("ff ff ff ff ff 0f")),
            Err(HpackError::IntegerOverflow)
        );
    }

    #[test]
    fn reencoding_rewrites_authority_and_never_indexes() {
        let mut decoder = Decoder::new(4096);
        let mut block = hex("8286 84");
        block.push(0x41);
        let url = b"http://127.0.0.1:2379";
        let coded = huffman_encode(url);
        block.push(0x80 | u8::try_from(coded.len()).unwrap());
        block.extend_from_slice(&coded);
        // A never-indexed custom field.
        block.extend_from_slice(&hex("10 01 78 01 79"));
        let mut decoded = decoder.decode(&block).unwrap();
        rewrite_authority(&mut decoded);
        let mut encoded = Vec::new();
        encode_block(&decoded, &mut encoded);

        let mut fresh = Decoder::new(4096);
        let mut expected = fields(&[
            (":method", "GET"),
            (":scheme", "http"),
            (":path", "/"),
            (":authority", "127.0.0.1:2379"),
            ("x", "y"),
        ]);
        expected[4].never_indexed = true;
        assert_eq!(fresh.decode(&encoded).unwrap(), expected);
        assert!(fresh.table.is_empty(), "re-encoded blocks must not index");
    }

    #[test]
    fn url_authorities() {
        let cases: [(&str, Option<&str>); 6] = [
            ("http://127.0.0.1:2379", Some("127.0.0.1:2379")),
            ("https://example.com:2379/x?y", Some("example.com:2379")),
            ("unix://localhost:2379", Some("localhost:2379")),
            ("unix:///tmp/sock", Some("")),
            ("127.0.0.1:2379", None),
            ("", None),
        ];
        for (input, want) in cases {
            assert_eq!(
                url_authority(input.as_bytes()),
                want.map(str::as_bytes),
                "{input}"
            );
        }
        let mut list = fields(&[(":authority", "unix:///tmp/sock"), (":path", "/")]);
        rewrite_authority(&mut list);
        assert_eq!(list, fields(&[(":path", "/")]));
    }

    /// Yields its bytes one per read, to exercise every split point.
    struct Trickle {
        data: Vec<u8>,
        pos: usize,
    }

    impl AsyncRead for Trickle {
        fn poll_read(
            self: Pin<&mut Self>,
            _: &mut Context<'_>,
            buf: &mut ReadBuf<'_>,
        ) -> Poll<io::Result<()>> {
            let this = self.get_mut();
            if let Some(&b) = this.data.get(this.pos) {
                buf.put_slice(&[b]);
                this.pos += 1;
            }
            Poll::Ready(Ok(()))
        }
    }

    impl AsyncWrite for Trickle {
        fn poll_write(
            self: Pin<&mut Self>,
            _: &mut Context<'_>,
            b: &[u8],
        ) -> Poll<io::Result<usize>> {
            Poll::Ready(Ok(b.len()))
        }
        fn poll_flush(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
            Poll::Ready(Ok(()))
        }
        fn poll_shutdown(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
            Poll::Ready(Ok(()))
        }
    }

    fn frame(frame_type: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
        let mut out = BytesMut::new();
        let len = payload.len().to_be_bytes();
        out.extend_from_slice(&len[len.len() - 3..]);
        out.extend_from_slice(&[frame_type, flags]);
        out.extend_from_slice(&stream.to_be_bytes());
        out.extend_from_slice(payload);
        out.to_vec()
    }

    async fn filtered(input: Vec<u8>, trickle: bool) -> io::Result<Vec<u8>> {
        let mut out = Vec::new();
        if trickle {
            let mut io = LenientAuthority::new(Trickle {
                data: input,
                pos: 0,
            });
            let mut small = [0u8; 3];
            loop {
                let n = io.read(&mut small).await?;
                if n == 0 {
                    return Ok(out);
                }
                out.extend_from_slice(&small[..n]);
            }
        }
        let (mut client, server) = tokio::io::duplex(64 * 1024);
        let writer = tokio::spawn(async move {
            // The reader may fail early and drop its end; that write error is expected.
            let _ = client.write_all(&input).await;
        });
        let read = LenientAuthority::new(server).read_to_end(&mut out).await;
        writer.await.unwrap();
        read.map(|_| out)
    }

    #[tokio::test]
    async fn frames_filter_byte_by_byte() {
        let settings = frame(0x4, 0, 0, &hex("0003 0000 0064"));
        let data = frame(0x0, 0x1, 1, &[7u8; 40_000]);
        let window = frame(0x8, 0, 0, &hex("0000 ffff"));
        // HEADERS with padding and priority, its block split over two CONTINUATIONs.
        let mut block = hex("8286 84 41");
        block.push(0x15);
        block.extend_from_slice(b"http://127.0.0.1:2379");
        let mut headers_payload = vec![3u8];
        headers_payload.extend_from_slice(&hex("0000 0000 0f"));
        headers_payload.extend_from_slice(&block[..2]);
        headers_payload.extend_from_slice(&[0, 0, 0]);
        let mut input = PREFACE.to_vec();
        input.extend(&settings);
        input.extend(frame(0x1, FLAG_PADDED | FLAG_PRIORITY, 1, &headers_payload));
        input.extend(frame(0x9, 0, 1, &block[2..5]));
        input.extend(frame(0x9, FLAG_END_HEADERS, 1, &block[5..]));
        input.extend(&data);
        // Second request on stream 3: the authority by dynamic index 62, END_STREAM.
        input.extend(frame(
            0x1,
            FLAG_END_HEADERS | FLAG_END_STREAM,
            3,
            &hex("8286 84be"),
        ));
        input.extend(&window);

        let mut rewritten = Vec::new();
        encode_block(
            &fields(&[
                (":method", "GET"),
                (":scheme", "http"),
                (":path", "/"),
                (":authority", "127.0.0.1:2379"),
            ]),
            &mut rewritten,
        );
        let mut expected = PREFACE.to_vec();
        expected.extend(&settings);
        expected.extend(frame(0x1, FLAG_END_HEADERS, 1, &rewritten));
        expected.extend(&data);
        expected.extend(frame(
            0x1,
            FLAG_END_HEADERS | FLAG_END_STREAM,
            3,
            &rewritten,
        ));
        expected.extend(&window);

        assert_eq!(filtered(input.clone(), true).await.unwrap(), expected);
        assert_eq!(filtered(input, false).await.unwrap(), expected);
    }

    #[tokio::test]
    async fn plain_authority_connections_pass_through_untouched() {
        let settings = frame(0x4, 0, 0, &hex("0003 0000 0064"));
        // First request: `:authority: 127.0.0.1:2379`, indexed into the client's table.
        let mut block = hex("8286 84 41 0e");
        block.extend_from_slice(b"127.0.0.1:2379");
        let mut input = PREFACE.to_vec();
        input.extend(&settings);
        input.extend(frame(0x1, FLAG_END_HEADERS, 1, &block));
        input.extend(frame(0x0, 0x1, 1, &[7u8; 20_000]));
        // Later requests reuse the table entry; the filter no longer looks, so even a
        // URL-shaped authority (which one client never mixes with a plain one) is not touched.
        input.extend(frame(
            0x1,
            FLAG_END_HEADERS | FLAG_END_STREAM,
            3,
            &hex("8286 84be"),
        ));
        let mut url_block = hex("8286 84 01 15");
        url_block.extend_from_slice(b"http://127.0.0.1:2379");
        input.extend(frame(
            0x1,
            FLAG_END_HEADERS | FLAG_END_STREAM,
            5,
            &url_block,
        ));

        assert_eq!(filtered(input.clone(), true).await.unwrap(), input);
        assert_eq!(filtered(input.clone(), false).await.unwrap(), input);
    }

    #[tokio::test]
    async fn large_blocks_split_into_continuations() {
        let value = "v".repeat(40_000);
        let mut block = hex("8286 84 00 01 78 7f");
        let mut len = Vec::new();
        encode_int(&mut len, 0, 7, value.len());
        block.extend_from_slice(&len[1..]);
        block.extend_from_slice(value.as_bytes());
        let mut input = PREFACE.to_vec();
        let mut pos = 0;
        for (i, chunk) in block.chunks(10_000).enumerate() {
            let last = pos + chunk.len() == block.len();
            let flags = if last { FLAG_END_HEADERS } else { 0 };
            input.extend(frame(if i == 0 { 0x1 } else { 0x9 }, flags, 1, chunk));
            pos += chunk.len();
        }
        let out = filtered(input, false).await.unwrap();
        let mut rest = &out[PREFACE.len()..];
        let mut reassembled = Vec::new();
        let mut types = Vec::new();
        while !rest.is_empty() {
            let len = usize::from(rest[0]) << 16 | usize::from(rest[1]) << 8 | usize::from(rest[2]);
            assert!(len <= MAX_EMIT_FRAME);
            types.push((rest[3], rest[4]));
            reassembled.extend_from_slice(&rest[9..9 + len]);
            rest = &rest[9 + len..];
        }
        assert_eq!(types, [(0x1, 0), (0x9, 0), (0x9, FLAG_END_HEADERS)]);
        let decoded = Decoder::new(4096).decode(&reassembled).unwrap();
        assert_eq!(decoded[3].value, value.as_bytes());
    }

    #[tokio::test]
    async fn bad_streams_fail_the_connection() {
        let mut huge = PREFACE.to_vec();
        huge.extend(frame(0x1, 0, 1, &vec![0x82; 600_000]));
        huge.extend(frame(0x9, FLAG_END_HEADERS, 1, &vec![0x82; 600_000]));
        let e = filtered(huge, false).await.unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::InvalidData);
        assert!(e.to_string().contains("exceeds"), "{e}");

        let mut bad = PREFACE.to_vec();
        bad.extend(frame(0x1, FLAG_END_HEADERS, 1, &hex("80")));
        let e = filtered(bad, true).await.unwrap_err();
        assert!(e.to_string().contains("invalid table index 0"), "{e}");

        let mut interleaved = PREFACE.to_vec();
        interleaved.extend(frame(0x1, 0, 1, &hex("82")));
        interleaved.extend(frame(0x0, 0, 1, b"x"));
        let e = filtered(interleaved, false).await.unwrap_err();
        assert!(e.to_string().contains("expected CONTINUATION"), "{e}");
    }

    #[tokio::test]
    async fn non_http2_passes_through() {
        for input in [
            b"GET / HTTP/1.1\r\nHost: x\r\n\r\n".to_vec(),
            b"PRI * HTTP/1.1\r\n\r\n".to_vec(),
            b"PRI * HTTP".to_vec(),
            Vec::new(),
        ] {
            assert_eq!(filtered(input.clone(), true).await.unwrap(), input);
            assert_eq!(filtered(input.clone(), false).await.unwrap(), input);
        }
    }

    /// An HTTP/1 + HTTP/2 hyper server answering 200 with the request's authority (or Host).
    async fn serve(lenient: bool) -> SocketAddr {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move {
            loop {
                let (stream, _) = listener.accept().await.unwrap();
                tokio::spawn(async move {
                    let service = service_fn(|req: Request<Incoming>| async move {
                        let authority = match req.uri().authority() {
                            Some(a) => a.to_string(),
                            None => req
                                .headers()
                                .get("host")
                                .and_then(|h| h.to_str().ok())
                                .unwrap_or_default()
                                .to_string(),
                        };
                        Ok::<_, Infallible>(Response::new(authority))
                    });
                    let builder = auto::Builder::new(TokioExecutor::new());
                    let _ = if lenient {
                        let io = TokioIo::new(LenientAuthority::new(stream));
                        builder.serve_connection(io, service).await
                    } else {
                        builder
                            .serve_connection(TokioIo::new(stream), service)
                            .await
                    };
                });
            }
        });
        addr
    }

    #[derive(Debug, PartialEq, Eq)]
    enum Outcome {
        Response { status: String, body: String },
        Reset(u32),
    }

    async fn read_frame(stream: &mut TcpStream) -> (u8, u8, u32, Vec<u8>) {
        let mut header = [0u8; 9];
        stream.read_exact(&mut header).await.unwrap();
        let len =
            usize::from(header[0]) << 16 | usize::from(header[1]) << 8 | usize::from(header[2]);
        let mut payload = vec![0u8; len];
        stream.read_exact(&mut payload).await.unwrap();
        let id = u32::from_be_bytes([header[5], header[6], header[7], header[8]]);
        (header[3], header[4], id, payload)
    }

    /// Sends GET requests on streams 1, 3, ... over one raw HTTP/2 connection, each with
    /// the header `blocks[i]`, and collects each outcome.
    async fn h2_requests(addr: SocketAddr, blocks: &[Vec<u8>]) -> Vec<Outcome> {
        let mut stream = TcpStream::connect(addr).await.unwrap();
        let mut hello = PREFACE.to_vec();
        hello.extend(frame(0x4, 0, 0, &[]));
        stream.write_all(&hello).await.unwrap();
        let mut decoder = Decoder::new(4096);
        let mut outcomes = Vec::new();
        for (i, block) in blocks.iter().enumerate() {
            let id = u32::try_from(2 * i + 1).unwrap();
            let flags = FLAG_END_HEADERS | FLAG_END_STREAM;
            stream
                .write_all(&frame(0x1, flags, id, block))
                .await
                .unwrap();
            let mut status = None;
            let mut body = Vec::new();
            let outcome = loop {
                let (frame_type, flags, sid, payload) = read_frame(&mut stream).await;
                match frame_type {
                    0x4 if flags & 1 == 0 => {
                        stream.write_all(&frame(0x4, 1, 0, &[])).await.unwrap();
                    }
                    0x1 => {
                        assert_eq!(sid, id);
                        let headers = decoder.decode(&payload).unwrap();
                        let s = headers.iter().find(|f| f.name == b":status").unwrap();
                        status = Some(String::from_utf8(s.value.clone()).unwrap());
                    }
                    0x0 if sid == id => body.extend_from_slice(&payload),
                    0x3 if sid == id => {
                        break Outcome::Reset(u32::from_be_bytes(payload[..4].try_into().unwrap()));
                    }
                    0x7 => panic!("GOAWAY: {payload:?}"),
                    _ => {}
                }
                if sid == id && flags & FLAG_END_STREAM != 0 {
                    break Outcome::Response {
                        status: status.clone().unwrap(),
                        body: String::from_utf8(body.clone()).unwrap(),
                    };
                }
            };
            outcomes.push(outcome);
        }
        outcomes
    }

    /// GET / with `:authority` as a literal with incremental indexing (Huffman-coded).
    fn indexing_request(authority: &str) -> Vec<u8> {
        let mut block = hex("8286 84 41");
        let coded = huffman_encode(authority.as_bytes());
        encode_int(&mut block, 0x80, 7, coded.len());
        block.extend_from_slice(&coded);
        block
    }

    #[tokio::test]
    async fn hyper_answers_url_authority() {
        tokio::time::timeout(Duration::from_secs(30), async {
            let addr = serve(true).await;
            let url = format!("http://{addr}");
            let plain = {
                let mut block = hex("8286 84 01");
                encode_string(&mut block, url.as_bytes());
                block
            };
            let outcomes = h2_requests(
                addr,
                &[
                    plain,
                    indexing_request(&url),
                    // The authority again, by dynamic index, as grpc-go sends it.
                    hex("8286 84be"),
                    indexing_request("127.0.0.1:2379"),
                ],
            )
            .await;
            let ok = |body: &str| Outcome::Response {
                status: "200".to_string(),
                body: body.to_string(),
            };
            let authority = addr.to_string();
            assert_eq!(
                outcomes,
                [
                    ok(&authority),
                    ok(&authority),
                    ok(&authority),
                    ok("127.0.0.1:2379")
                ]
            );

            // Control: without the wrapper, h2 resets the stream with PROTOCOL_ERROR (1).
            // If a newer h2 accepts URL authorities, this wrapper is no longer needed.
            let strict = serve(false).await;
            let outcomes =
                h2_requests(strict, &[indexing_request(&format!("http://{strict}"))]).await;
            assert_eq!(outcomes, [Outcome::Reset(1)]);
        })
        .await
        .unwrap();
    }

    #[tokio::test]
    async fn hyper_http1_passes_through() {
        tokio::time::timeout(Duration::from_secs(30), async {
            let addr = serve(true).await;
            let mut stream = TcpStream::connect(addr).await.unwrap();
            stream
                .write_all(b"GET / HTTP/1.1\r\nHost: example:2379\r\nConnection: close\r\n\r\n")
                .await
                .unwrap();
            let mut response = String::new();
            stream.read_to_string(&mut response).await.unwrap();
            assert!(response.starts_with("HTTP/1.1 200 OK\r\n"), "{response}");
            assert!(response.ends_with("\r\n\r\nexample:2379"), "{response}");
        })
        .await
        .unwrap();
    }
}
