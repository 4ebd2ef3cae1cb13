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
//!
//! Layout: the I/O wrapper is here; `filter` walks the frames and rewrites header blocks.

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll, ready};

use bytes::{Buf, BytesMut};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

use self::filter::{FrameFilter, Verdict};
use crate::error::{Error, Result};

mod filter;
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

#[cfg(test)]
mod tests;
