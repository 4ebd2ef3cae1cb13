//! Keep-alive enforcement: the server side of gRPC's keep-alive contract, as grpc-go's
//! server applies it behind etcd's `--grpc-keepalive-min-time`.
//!
//! hyper answers every PING a client sends, at any rate, and gives no hook to refuse one. A
//! client that pings in a loop costs the member a write per ping for as long as it likes.
//! grpc-go's server (etcd's) polices pings instead, and [`Policed`] does the same between the
//! socket (after TLS) and hyper, by walking the HTTP/2 frame headers in both directions
//! (payloads are skipped, never copied or buffered):
//! - a PING from the client is a *strike* when it comes sooner than
//!   [`PingPolicy::min_time`] after the previous one while the connection has a stream open,
//!   or sooner than two hours after it while none is open (etcd sets `PermitWithoutStream`
//!   to false);
//! - a PING that follows a HEADERS or DATA frame the server wrote since the previous PING is
//!   forgiven and clears the strikes (a client that gets answers may ping after each);
//! - the third strike ends the connection: the server sends `GOAWAY` with
//!   `ENHANCE_YOUR_CALM` and the debug data `too_many_pings` (what grpc-go clients recognise
//!   and back off on), then closes.
//!
//! A stream is open from the client's HEADERS that starts it until the server ends it
//! (END_STREAM on its HEADERS or DATA) or either side resets it, as grpc-go counts active
//! streams. Connections that do not start with the HTTP/2 preface (HTTP/1.x) and listeners
//! without a policy pass through untouched.

use std::collections::HashSet;
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::task::{Context, Poll, Waker, ready};
use std::time::Duration;

use bytes::{Buf, BufMut, BytesMut};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::time::Instant;

/// The HTTP/2 client connection preface (RFC 9113 §3.4).
const PREFACE: &[u8; 24] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
const FRAME_HEADER_LEN: usize = 9;
const TYPE_DATA: u8 = 0x0;
const TYPE_HEADERS: u8 = 0x1;
const TYPE_RST_STREAM: u8 = 0x3;
const TYPE_PING: u8 = 0x6;
const TYPE_GOAWAY: u8 = 0x7;
const FLAG_END_STREAM: u8 = 0x1;
const FLAG_ACK: u8 = 0x1;
/// HTTP/2's ENHANCE_YOUR_CALM error code (RFC 9113 §7).
const ENHANCE_YOUR_CALM: u32 = 0xb;
/// The GOAWAY debug data grpc-go's server sends and its clients look for.
pub const TOO_MANY_PINGS: &[u8] = b"too_many_pings";
/// Strikes a connection may have; one more ends it (grpc-go's `maxPingStrikes`).
const MAX_STRIKES: u8 = 2;
/// How far apart pings must be while no stream is open (grpc-go's `defaultPingTimeout`).
const IDLE_MIN_TIME: Duration = Duration::from_secs(2 * 3600);
/// The most open streams tracked per connection. hyper refuses streams past
/// `--max-concurrent-streams` with RST_STREAM, which closes them here too; past this bound
/// new ones are simply not tracked (the connection still counts as having streams open).
const MAX_TRACKED_STREAMS: usize = 65_536;

/// How a listener polices its clients' pings.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PingPolicy {
    /// The shortest interval between a client's pings while it has a stream open
    /// (`--grpc-keepalive-min-time`).
    pub min_time: Duration,
}

impl PingPolicy {
    /// etcd's policy for `--grpc-keepalive-min-time=<min_time>`. Like etcd, which then
    /// passes no policy to grpc-go, zero means grpc-go's default of five minutes.
    pub fn etcd(min_time: Duration) -> PingPolicy {
        let min_time = if min_time.is_zero() {
            Duration::from_secs(5 * 60)
        } else {
            min_time
        };
        PingPolicy { min_time }
    }
}

/// A connection whose client pings are policed (module docs). Reads and writes pass through
/// to the inner connection; only frame headers are looked at.
pub struct Policed<IO> {
    io: IO,
    police: Option<Box<Police>>,
}

impl<IO> Policed<IO> {
    /// Wraps `io`, a connection on which nothing has been read yet, from the client at
    /// `peer`. With no policy the connection passes through untouched.
    pub fn new(io: IO, policy: Option<PingPolicy>, peer: SocketAddr) -> Self {
        let police = policy.map(|policy| Box::new(Police::new(policy, peer)));
        Policed { io, police }
    }
}

/// Where the HTTP/2 frame headers are in one direction of a connection.
#[derive(Default)]
struct FrameWalker {
    head: [u8; FRAME_HEADER_LEN],
    /// Bytes of `head` filled.
    have: usize,
    /// Payload bytes of the current frame still to skip.
    skip: usize,
}

/// One frame header.
#[derive(Clone, Copy, Debug)]
struct Head {
    kind: u8,
    flags: u8,
    stream: u32,
}

impl FrameWalker {
    /// Calls `on_head` with each frame header that `bytes` completes.
    fn walk(&mut self, mut bytes: &[u8], mut on_head: impl FnMut(Head)) {
        while !bytes.is_empty() {
            if self.skip > 0 {
                let n = self.skip.min(bytes.len());
                self.skip -= n;
                bytes = &bytes[n..];
                continue;
            }
            let n = (FRAME_HEADER_LEN - self.have).min(bytes.len());
            self.head[self.have..self.have + n].copy_from_slice(&bytes[..n]);
            self.have += n;
            bytes = &bytes[n..];
            if self.have == FRAME_HEADER_LEN {
                self.have = 0;
                let h = &self.head;
                self.skip = usize::from(h[0]) << 16 | usize::from(h[1]) << 8 | usize::from(h[2]);
                on_head(Head {
                    kind: h[3],
                    flags: h[4],
                    stream: u32::from_be_bytes([h[5], h[6], h[7], h[8]]) & 0x7fff_ffff,
                });
            }
        }
    }

    /// Whether the bytes walked so far end exactly at a frame boundary.
    fn at_boundary(&self) -> bool {
        self.have == 0 && self.skip == 0
    }
}

/// Where the connection's GOAWAY is.
enum GoAway {
    /// None due.
    No,
    /// Due, to be written at the next frame boundary of the server's writes.
    Due,
    /// Being written: what is left of the frame.
    Writing(BytesMut),
    /// Written; flushing, then closing the write side.
    Flushing,
    /// Written and the write side closed: reads end, writes fail.
    Done,
}

/// The policing state of one HTTP/2 connection.
struct Police {
    policy: PingPolicy,
    peer: SocketAddr,
    /// Bytes of the client preface matched so far.
    preface: usize,
    reads: FrameWalker,
    writes: FrameWalker,
    /// Streams the client opened that the server has not ended.
    open: HashSet<u32>,
    /// The highest stream id the client opened.
    last_stream: u32,
    last_ping: Option<Instant>,
    strikes: u8,
    /// The server wrote HEADERS or DATA since the client's last ping.
    wrote: bool,
    goaway: GoAway,
    /// The reader waiting for the GOAWAY to be written.
    reader: Option<Waker>,
}

impl Police {
    fn new(policy: PingPolicy, peer: SocketAddr) -> Police {
        Police {
            policy,
            peer,
            preface: 0,
            reads: FrameWalker::default(),
            writes: FrameWalker::default(),
            open: HashSet::new(),
            last_stream: 0,
            last_ping: None,
            strikes: 0,
            wrote: false,
            goaway: GoAway::No,
            reader: None,
        }
    }

    /// Looks at bytes the client sent. `false`: the connection is not HTTP/2 and needs no
    /// policing.
    fn on_read(&mut self, mut bytes: &[u8]) -> bool {
        if self.preface < PREFACE.len() {
            let n = (PREFACE.len() - self.preface).min(bytes.len());
            if bytes[..n] != PREFACE[self.preface..self.preface + n] {
                return false;
            }
            self.preface += n;
            bytes = &bytes[n..];
        }
        let mut walker = std::mem::take(&mut self.reads);
        walker.walk(bytes, |head| self.on_client_frame(head));
        self.reads = walker;
        true
    }

    fn on_client_frame(&mut self, head: Head) {
        match head.kind {
            TYPE_HEADERS if head.stream % 2 == 1 && head.stream > self.last_stream => {
                self.last_stream = head.stream;
                if self.open.len() < MAX_TRACKED_STREAMS {
                    self.open.insert(head.stream);
                }
            }
            TYPE_RST_STREAM => {
                self.open.remove(&head.stream);
            }
            TYPE_PING if head.flags & FLAG_ACK == 0 => self.on_ping(Instant::now()),
            _ => {}
        }
    }

    /// grpc-go's `handlePing`, with the same arithmetic.
    fn on_ping(&mut self, now: Instant) {
        let last = self.last_ping.replace(now);
        if std::mem::take(&mut self.wrote) {
            self.strikes = 0;
            return;
        }
        let min_time = if self.open.is_empty() {
            IDLE_MIN_TIME
        } else {
            self.policy.min_time
        };
        if last.is_some_and(|last| now < last + min_time) {
            self.strikes = self.strikes.saturating_add(1);
        }
        if self.strikes > MAX_STRIKES && matches!(self.goaway, GoAway::No) {
            tracing::warn!(
                remote_addr = %self.peer,
                "transport: Got too many pings from the client, closing the connection."
            );
            self.goaway = GoAway::Due;
        }
    }

    /// Looks at bytes the server wrote.
    fn on_write(&mut self, bytes: &[u8]) {
        let mut walker = std::mem::take(&mut self.writes);
        walker.walk(bytes, |head| match head.kind {
            TYPE_DATA | TYPE_HEADERS => {
                self.wrote = true;
                if head.flags & FLAG_END_STREAM != 0 {
                    self.open.remove(&head.stream);
                }
            }
            TYPE_RST_STREAM => {
                self.open.remove(&head.stream);
            }
            _ => {}
        });
        self.writes = walker;
        if self.writes.at_boundary()
            && matches!(self.goaway, GoAway::Due)
            && let Some(reader) = self.reader.take()
        {
            reader.wake();
        }
    }

    /// The GOAWAY frame: the last stream the client opened, ENHANCE_YOUR_CALM and
    /// `too_many_pings`.
    fn goaway_frame(&self) -> BytesMut {
        let len = 8 + TOO_MANY_PINGS.len();
        let mut frame = BytesMut::with_capacity(FRAME_HEADER_LEN + len);
        frame.put_uint(len as u64, 3);
        frame.put_u8(TYPE_GOAWAY);
        frame.put_u8(0);
        frame.put_u32(0);
        frame.put_u32(self.last_stream);
        frame.put_u32(ENHANCE_YOUR_CALM);
        frame.put_slice(TOO_MANY_PINGS);
        frame
    }

    /// Drives a due GOAWAY out on `io` and closes its write side. Ready once that is done
    /// (or failed: the connection is closing either way); pending while the server's writes
    /// are inside a frame.
    fn poll_goaway<IO: AsyncWrite + Unpin>(
        &mut self,
        io: &mut IO,
        cx: &mut Context<'_>,
    ) -> Poll<()> {
        loop {
            match &mut self.goaway {
                GoAway::No | GoAway::Done => return Poll::Ready(()),
                GoAway::Due => {
                    if !self.writes.at_boundary() {
                        self.reader = Some(cx.waker().clone());
                        return Poll::Pending;
                    }
                    self.goaway = GoAway::Writing(self.goaway_frame());
                }
                GoAway::Writing(frame) => {
                    while !frame.is_empty() {
                        match ready!(Pin::new(&mut *io).poll_write(cx, frame)) {
                            Ok(n) if n > 0 => frame.advance(n),
                            _ => {
                                self.goaway = GoAway::Done;
                                return Poll::Ready(());
                            }
                        }
                    }
                    self.goaway = GoAway::Flushing;
                }
                GoAway::Flushing => {
                    let _ = ready!(Pin::new(&mut *io).poll_flush(cx));
                    let _ = ready!(Pin::new(&mut *io).poll_shutdown(cx));
                    self.goaway = GoAway::Done;
                }
            }
        }
    }
}

fn closed() -> io::Error {
    io::Error::new(
        io::ErrorKind::BrokenPipe,
        "connection closed: too many pings",
    )
}

impl<IO: AsyncRead + AsyncWrite + Unpin> AsyncRead for Policed<IO> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let Some(police) = this.police.as_deref_mut() else {
            return Pin::new(&mut this.io).poll_read(cx, buf);
        };
        if !matches!(police.goaway, GoAway::No) {
            // Nothing more from the client reaches the server: the connection ends here.
            ready!(police.poll_goaway(&mut this.io, cx));
            return Poll::Ready(Ok(()));
        }
        let before = buf.filled().len();
        ready!(Pin::new(&mut this.io).poll_read(cx, buf))?;
        if !police.on_read(&buf.filled()[before..]) {
            this.police = None;
        }
        Poll::Ready(Ok(()))
    }
}

impl<IO: AsyncRead + AsyncWrite + Unpin> Policed<IO> {
    /// The GOAWAY is written and the write side closed.
    fn sent_away(&self) -> bool {
        self.police
            .as_deref()
            .is_some_and(|p| matches!(p.goaway, GoAway::Done))
    }

    /// Before a write: a due GOAWAY goes first when the server's writes are at a frame
    /// boundary, and after it nothing more is written.
    fn poll_before_write(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let Some(police) = self.police.as_deref_mut() else {
            return Poll::Ready(Ok(()));
        };
        match police.goaway {
            GoAway::No => Poll::Ready(Ok(())),
            GoAway::Due if !police.writes.at_boundary() => Poll::Ready(Ok(())),
            _ => {
                ready!(police.poll_goaway(&mut self.io, cx));
                Poll::Ready(Err(closed()))
            }
        }
    }
}

impl<IO: AsyncRead + AsyncWrite + Unpin> AsyncWrite for Policed<IO> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        ready!(this.poll_before_write(cx))?;
        let n = ready!(Pin::new(&mut this.io).poll_write(cx, buf))?;
        if let Some(police) = this.police.as_deref_mut() {
            police.on_write(&buf[..n]);
        }
        Poll::Ready(Ok(n))
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        ready!(this.poll_before_write(cx))?;
        let n = ready!(Pin::new(&mut this.io).poll_write_vectored(cx, bufs))?;
        if let Some(police) = this.police.as_deref_mut() {
            let mut left = n;
            for slice in bufs {
                if left == 0 {
                    break;
                }
                let take = left.min(slice.len());
                police.on_write(&slice[..take]);
                left -= take;
            }
        }
        Poll::Ready(Ok(n))
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if this.sent_away() {
            return Poll::Ready(Ok(()));
        }
        Pin::new(&mut this.io).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if this.sent_away() {
            return Poll::Ready(Ok(()));
        }
        Pin::new(&mut this.io).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests;
