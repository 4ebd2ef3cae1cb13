//! Accept HTTP/2 requests whose `:authority` is a full URL.
//!
//! etcd 3.4's `etcdctl` (grpc-go 1.2x) dials `passthrough:///http://127.0.0.1:2379` and sends
//! `:authority: http://127.0.0.1:2379`. etcd's Go server accepts that; the `h2` crate behind
//! hyper rejects it as a malformed authority and resets the stream with `PROTOCOL_ERROR`.
//!
//! [`LenientAuthority`] sits between the socket and hyper and filters the bytes the client
//! sends. After the HTTP/2 client preface it walks the frames: every frame except HEADERS and
//! their CONTINUATIONs goes through byte-for-byte (DATA is streamed, never buffered). Each header
//! block is HPACK-decoded (RFC 7541, with `etcdrs_hpack`, the codec the load generator uses
//! too) by a decoder that tracks the client's encoder, a URL-shaped `:authority` becomes
//! `host:port`, and the block is re-encoded with literal representations that never touch the
//! dynamic table (never-indexed fields stay never indexed), so the server's decoder table stays
//! empty and consistent whatever the client's encoder does. Only the first header block of a
//! connection is always decoded: if it carries no URL-shaped `:authority` (any client but
//! etcd 3.4's etcdctl), it is forwarded as encoded and the connection passes through from
//! then on, so ordinary clients pay nothing per request. Connections that do not start with
//! the HTTP/2 preface (HTTP/1.x) pass through untouched. Writes are never filtered.

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll, ready};

use bytes::{Buf, BytesMut};
use etcdrs_hpack::{Decoder, HeaderField};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

use crate::error::{Error, Result};

#[cfg(test)]
mod fuzz;

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
/// Largest encoded header block (HEADERS plus CONTINUATIONs) we buffer; the decoded list is
/// bounded too (`etcdrs_hpack::MAX_HEADER_LIST`).
const MAX_HEADER_BLOCK: usize = 1 << 20;
/// The SETTINGS_HEADER_TABLE_SIZE the client's encoder works under: hyper leaves the server's
/// at the protocol default.
const HEADER_TABLE_SIZE: usize = etcdrs_hpack::DEFAULT_TABLE_SIZE;
/// How much we read from the socket at a time when we have to look at the bytes.
const READ_CHUNK: usize = 16 * 1024;

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
/// one that does not decode, fails the read with an [`io::Error`] (kind `InvalidData`, the
/// source an [`Error`]) and so closes the connection.
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
    fn process(&mut self) -> Result<()> {
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
            Phase::Failed => Err(Error::FilterFailed),
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
    fn process(&mut self, inbuf: &mut BytesMut, out: &mut BytesMut) -> Result<Verdict> {
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
fn headers_fragment(flags: u8, payload: &[u8], stream: u32) -> Result<&[u8]> {
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

#[cfg(test)]
mod tests {
    use std::convert::Infallible;
    use std::net::SocketAddr;
    use std::time::Duration;

    use etcdrs_hpack::{encode_int, encode_literal, encode_string, huffman_encode};
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

    /// Appends `s` Huffman-coded, as grpc-go and h2 send most strings.
    fn huffman_string(out: &mut Vec<u8>, s: &str) {
        let coded = huffman_encode(s.as_bytes());
        encode_int(out, 0x80, 7, coded.len());
        out.extend_from_slice(&coded);
    }

    /// The block as re-encoded: every field a literal that does not index.
    fn literals(fields: &[HeaderField]) -> Vec<u8> {
        let mut out = Vec::new();
        for field in fields {
            encode_literal(&mut out, field);
        }
        out
    }

    #[test]
    fn rewriting_keeps_fields_order_and_never_indexed() {
        let mut decoder = Decoder::new(HEADER_TABLE_SIZE);
        let mut block = hex("8286 84 41");
        huffman_string(&mut block, "http://127.0.0.1:2379");
        // A never-indexed custom field.
        block.extend_from_slice(&hex("10 01 78 01 79"));
        let mut decoded = decoder.decode(&block).unwrap();
        assert!(decoded.iter().any(needs_rewrite));
        rewrite_authority(&mut decoded);
        let mut expected = fields(&[
            (":method", "GET"),
            (":scheme", "http"),
            (":path", "/"),
            (":authority", "127.0.0.1:2379"),
            ("x", "y"),
        ]);
        expected[4].never_indexed = true;
        assert_eq!(decoded, expected);
        // What hyper's decoder reads back, with nothing left in its table.
        let mut server = Decoder::new(HEADER_TABLE_SIZE);
        assert_eq!(server.decode(&literals(&decoded)).unwrap(), expected);
        assert_eq!(
            server.decode(&hex("be")),
            Err(etcdrs_hpack::Error::InvalidIndex(62))
        );
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
        // HEADERS with padding and priority, its block split over two CONTINUATIONs; the
        // authority Huffman-coded and indexed, as grpc-go sends it.
        let mut block = hex("8286 84 41");
        huffman_string(&mut block, "http://127.0.0.1:2379");
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

        let request = fields(&[
            (":method", "GET"),
            (":scheme", "http"),
            (":path", "/"),
            (":authority", "127.0.0.1:2379"),
        ]);
        let rewritten = literals(&request);
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
        let mut block = hex("8286 84 00 01 78");
        encode_string(&mut block, value.as_bytes());
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
        let decoded = Decoder::new(HEADER_TABLE_SIZE)
            .decode(&reassembled)
            .unwrap();
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

        // One 4,000-byte entry indexed 300 times: over 1 MiB decoded.
        let mut block = hex("40 01 78");
        encode_string(&mut block, &[b'v'; 4000]);
        block.extend(std::iter::repeat_n(0xbe, 300));
        let mut large = PREFACE.to_vec();
        large.extend(frame(0x1, FLAG_END_HEADERS, 1, &block));
        let e = filtered(large, false).await.unwrap_err();
        assert!(e.to_string().contains("header list exceeds"), "{e}");

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
        let mut decoder = Decoder::new(HEADER_TABLE_SIZE);
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
        huffman_string(&mut block, authority);
        block
    }

    #[tokio::test]
    async fn hyper_answers_url_authority() {
        tokio::time::timeout(Duration::from_secs(30), async {
            let addr = serve(true).await;
            // Literals without indexing, raw strings.
            let without_indexing = |authority: &str| {
                let mut block = hex("8286 84 01");
                encode_string(&mut block, authority.as_bytes());
                block
            };
            let outcomes = h2_requests(
                addr,
                &[
                    indexing_request("http://127.0.0.1:2379"),
                    // The authority again, by dynamic index, as grpc-go sends it.
                    hex("8286 84be"),
                    without_indexing(&format!("http://{addr}/")),
                    hex("8286 84be"),
                    indexing_request(&format!("http://{addr}")),
                    hex("8286 84be"),
                    // Plain authorities on a rewritten connection go through as they are.
                    indexing_request("127.0.0.1:2379"),
                    without_indexing("example:2379"),
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
                    ok("127.0.0.1:2379"),
                    ok("127.0.0.1:2379"),
                    ok(&authority),
                    ok("127.0.0.1:2379"),
                    ok(&authority),
                    ok(&authority),
                    ok("127.0.0.1:2379"),
                    ok("example:2379"),
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
