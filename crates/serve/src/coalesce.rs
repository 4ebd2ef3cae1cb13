//! Fewer, larger writes to a connection's socket ([`Coalesced`]).
//!
//! hyper's HTTP/2 connection flushes each time its task runs, and its task runs as soon as
//! one response is ready: when a raft batch completes a hundred requests at once, their
//! answers would leave in as many small writes, and on loopback each write costs the
//! sender's CPU a whole trip through the network stack and a wake-up of the receiver. That
//! cost was the largest single item of the member's CPU per put.
//!
//! [`Coalesced`] keeps what the connection writes in a buffer and, at the first flush of a
//! buffer, lets the connection's task go to the back of the runtime's queue once before the
//! bytes leave: the other answers completed at the same moment get written into the same
//! buffer in the meantime, and leave together in one write. It costs one extra poll of the
//! connection per flush, and no wait: the task is run again as soon as the tasks already
//! queued have run.
//!
//! The buffer is bounded ([`BUFFER_LIMIT`]): past it, a write waits for the socket as it
//! would without the buffer. A write larger than the bound, with nothing buffered, goes to
//! the socket without being copied.
//!
//! Acknowledgements of the client's pings wait for the next answer, for at most
//! [`PONG_HOLD`]. grpc-go's flow control (its BDP estimator, on in etcd's clients and
//! load generator) pings the server with nearly every answer it reads; the acknowledgement
//! left alone, a put cost the member two sends (the 17-byte acknowledgement, then the answer
//! to the next request a few milliseconds later) and the client two wake-ups. Held back, it
//! leaves in the same write as that answer. HTTP/2 asks that a ping be answered promptly, not
//! at once; a connection that sends nothing else gets it after the hold.

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::task::{Context, Poll, ready};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::time::Sleep;

/// The most bytes held back from the socket.
pub const BUFFER_LIMIT: usize = 64 * 1024;
/// The longest a ping's acknowledgement waits for an answer to leave with (module docs).
pub const PONG_HOLD: Duration = Duration::from_millis(10);
/// An HTTP/2 frame's header: length (3 bytes), type, flags, stream (4 bytes).
const FRAME_HEADER: usize = 9;
/// HTTP/2's PING frame type, its ACK flag and its payload's length.
const PING: u8 = 0x6;
const ACK: u8 = 0x1;
const PING_PAYLOAD: usize = 8;

/// A connection whose writes are gathered until its task has let others run (module docs).
pub struct Coalesced<IO> {
    io: IO,
    buf: Vec<u8>,
    /// Bytes of `buf` already written to `io`.
    written: usize,
    /// The task has been sent to the back of the queue for what `buf` holds.
    yielded: bool,
    /// When held ping acknowledgements leave on their own ([`PONG_HOLD`]).
    hold: Option<Pin<Box<Sleep>>>,
}

impl<IO> Coalesced<IO> {
    /// Wraps `io`.
    pub fn new(io: IO) -> Self {
        Coalesced {
            io,
            buf: Vec::new(),
            written: 0,
            yielded: false,
            hold: None,
        }
    }

    fn pending(&self) -> usize {
        self.buf.len() - self.written
    }

    /// Whether what waits to leave is only acknowledgements of pings.
    fn only_pongs(&self) -> bool {
        let mut rest = &self.buf[self.written..];
        if rest.is_empty() {
            return false;
        }
        while !rest.is_empty() {
            let Some(frame) = rest.get(..FRAME_HEADER + PING_PAYLOAD) else {
                return false;
            };
            let len =
                usize::from(frame[0]) << 16 | usize::from(frame[1]) << 8 | usize::from(frame[2]);
            let stream = &frame[5..FRAME_HEADER];
            if len != PING_PAYLOAD
                || frame[3] != PING
                || frame[4] & ACK == 0
                || stream.iter().any(|b| *b != 0)
            {
                return false;
            }
            rest = &rest[FRAME_HEADER + PING_PAYLOAD..];
        }
        true
    }
}

impl<IO: AsyncWrite + Unpin> Coalesced<IO> {
    /// Writes out everything buffered.
    fn poll_drain(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        while self.written < self.buf.len() {
            let n = ready!(Pin::new(&mut self.io).poll_write(cx, &self.buf[self.written..]))?;
            if n == 0 {
                return Poll::Ready(Err(io::ErrorKind::WriteZero.into()));
            }
            self.written += n;
        }
        self.buf.clear();
        self.written = 0;
        self.yielded = false;
        self.hold = None;
        // A burst's large buffer is not kept by an idle connection.
        if self.buf.capacity() > BUFFER_LIMIT {
            self.buf = Vec::new();
        }
        Poll::Ready(Ok(()))
    }

    /// Makes room for `len` more bytes, or says they should go straight to the socket.
    fn poll_room(&mut self, cx: &mut Context<'_>, len: usize) -> Poll<io::Result<bool>> {
        if self.pending() + len > BUFFER_LIMIT {
            ready!(self.poll_drain(cx))?;
        }
        Poll::Ready(Ok(len <= BUFFER_LIMIT))
    }
}

impl<IO: AsyncRead + Unpin> AsyncRead for Coalesced<IO> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_read(cx, buf)
    }
}

impl<IO: AsyncWrite + Unpin> AsyncWrite for Coalesced<IO> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        if !ready!(this.poll_room(cx, buf.len()))? {
            return Pin::new(&mut this.io).poll_write(cx, buf);
        }
        this.buf.extend_from_slice(buf);
        Poll::Ready(Ok(buf.len()))
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let len = bufs.iter().map(|b| b.len()).sum();
        if !ready!(this.poll_room(cx, len))? {
            return Pin::new(&mut this.io).poll_write_vectored(cx, bufs);
        }
        for b in bufs {
            this.buf.extend_from_slice(b);
        }
        Poll::Ready(Ok(len))
    }

    fn is_write_vectored(&self) -> bool {
        true
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if this.only_pongs() {
            let hold = this
                .hold
                .get_or_insert_with(|| Box::pin(tokio::time::sleep(PONG_HOLD)));
            // Once elapsed, the hold stays until the acknowledgements have left.
            if hold.as_mut().poll(cx).is_pending() {
                return Poll::Pending;
            }
        }
        if this.pending() > 0 && !this.yielded {
            // Woken from its own poll, the task is queued behind those already waiting.
            this.yielded = true;
            cx.waker().wake_by_ref();
            return Poll::Pending;
        }
        ready!(this.poll_drain(cx))?;
        Pin::new(&mut this.io).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        ready!(this.poll_drain(cx))?;
        Pin::new(&mut this.io).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};

    use tokio::io::{AsyncReadExt, AsyncWriteExt, DuplexStream};

    use super::*;

    /// One end of an in-memory pipe that counts the writes reaching it.
    struct Counting {
        io: DuplexStream,
        writes: Arc<AtomicUsize>,
    }

    impl AsyncWrite for Counting {
        fn poll_write(
            self: Pin<&mut Self>,
            cx: &mut Context<'_>,
            buf: &[u8],
        ) -> Poll<io::Result<usize>> {
            let this = self.get_mut();
            this.writes.fetch_add(1, Ordering::SeqCst);
            Pin::new(&mut this.io).poll_write(cx, buf)
        }

        fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
            Pin::new(&mut self.get_mut().io).poll_flush(cx)
        }

        fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
            Pin::new(&mut self.get_mut().io).poll_shutdown(cx)
        }
    }

    fn pipe() -> (Coalesced<Counting>, DuplexStream, Arc<AtomicUsize>) {
        let (ours, theirs) = tokio::io::duplex(4 * BUFFER_LIMIT);
        let writes = Arc::new(AtomicUsize::new(0));
        let io = Counting {
            io: ours,
            writes: writes.clone(),
        };
        (Coalesced::new(io), theirs, writes)
    }

    #[tokio::test]
    async fn writes_before_a_flush_leave_in_one_write_after_the_task_yields_once() {
        let (mut io, mut peer, writes) = pipe();
        for part in [&b"first "[..], b"second ", b"third"] {
            io.write_all(part).await.unwrap();
        }
        assert_eq!(
            writes.load(Ordering::SeqCst),
            0,
            "nothing leaves before a flush"
        );

        // The first poll of the flush only yields; the second writes everything at once.
        let mut cx = Context::from_waker(std::task::Waker::noop());
        assert!(Pin::new(&mut io).poll_flush(&mut cx).is_pending());
        assert_eq!(writes.load(Ordering::SeqCst), 0);
        io.flush().await.unwrap();
        assert_eq!(writes.load(Ordering::SeqCst), 1);

        let mut got = vec![0; b"first second third".len()];
        peer.read_exact(&mut got).await.unwrap();
        assert_eq!(got, b"first second third");

        // A flush with nothing buffered neither yields nor writes.
        assert!(Pin::new(&mut io).poll_flush(&mut cx).is_ready());
        assert_eq!(writes.load(Ordering::SeqCst), 1);
    }

    #[tokio::test]
    async fn the_buffer_is_bounded_and_a_large_write_is_not_copied() {
        let (mut io, mut peer, writes) = pipe();
        io.write_all(&[1; 1000]).await.unwrap();
        // Past the bound, what is buffered goes first, and the large write goes as is.
        let large = vec![2; BUFFER_LIMIT + 1];
        io.write_all(&large).await.unwrap();
        assert!(io.buf.is_empty(), "the large write was not buffered");
        assert_eq!(writes.load(Ordering::SeqCst), 2);
        io.write_all(&[3; 10]).await.unwrap();
        assert!(io.pending() <= BUFFER_LIMIT);
        io.shutdown().await.unwrap();

        let mut got = Vec::new();
        peer.read_to_end(&mut got).await.unwrap();
        let mut want = vec![1; 1000];
        want.extend_from_slice(&large);
        want.extend_from_slice(&[3; 10]);
        assert_eq!(got, want, "shutdown wrote what was buffered, in order");
    }

    /// An HTTP/2 PING frame with `flags`.
    fn ping(flags: u8) -> Vec<u8> {
        let mut frame = vec![0, 0, 8, PING, flags, 0, 0, 0, 0];
        frame.extend_from_slice(b"opaque!!");
        frame
    }

    #[tokio::test(start_paused = true)]
    async fn a_pings_acknowledgement_waits_for_the_next_answer_and_leaves_with_it() {
        let (mut io, mut peer, writes) = pipe();
        let mut cx = Context::from_waker(std::task::Waker::noop());
        io.write_all(&ping(ACK)).await.unwrap();
        for _ in 0..3 {
            assert!(Pin::new(&mut io).poll_flush(&mut cx).is_pending());
        }
        assert_eq!(
            writes.load(Ordering::SeqCst),
            0,
            "the acknowledgement left alone"
        );
        // The answer comes before the hold ends: both leave in one write.
        tokio::time::advance(PONG_HOLD / 2).await;
        io.write_all(b"answer").await.unwrap();
        io.flush().await.unwrap();
        assert_eq!(writes.load(Ordering::SeqCst), 1);
        let mut want = ping(ACK);
        want.extend_from_slice(b"answer");
        let mut got = vec![0; want.len()];
        peer.read_exact(&mut got).await.unwrap();
        assert_eq!(got, want);
    }

    #[tokio::test(start_paused = true)]
    async fn a_lone_acknowledgement_leaves_after_the_hold() {
        let (mut io, mut peer, writes) = pipe();
        let mut cx = Context::from_waker(std::task::Waker::noop());
        io.write_all(&ping(ACK)).await.unwrap();
        io.write_all(&ping(ACK)).await.unwrap();
        assert!(Pin::new(&mut io).poll_flush(&mut cx).is_pending());
        tokio::time::advance(PONG_HOLD - Duration::from_millis(1)).await;
        assert!(Pin::new(&mut io).poll_flush(&mut cx).is_pending());
        assert_eq!(writes.load(Ordering::SeqCst), 0);
        let started = tokio::time::Instant::now();
        io.flush().await.unwrap();
        assert!(
            started.elapsed() >= Duration::from_millis(1),
            "left before the hold ended"
        );
        assert_eq!(writes.load(Ordering::SeqCst), 1);
        let mut got = vec![0; 2 * (FRAME_HEADER + PING_PAYLOAD)];
        peer.read_exact(&mut got).await.unwrap();
        assert_eq!(got, [ping(ACK), ping(ACK)].concat());
        // The next acknowledgement is held again.
        io.write_all(&ping(ACK)).await.unwrap();
        assert!(Pin::new(&mut io).poll_flush(&mut cx).is_pending());
        assert!(Pin::new(&mut io).poll_flush(&mut cx).is_pending());
        assert_eq!(writes.load(Ordering::SeqCst), 1);
    }

    #[tokio::test(start_paused = true)]
    async fn other_frames_are_not_held() {
        for bytes in [
            ping(0),
            b"not a frame".to_vec(),
            [ping(ACK), vec![0]].concat(),
        ] {
            let (mut io, _peer, writes) = pipe();
            io.write_all(&bytes).await.unwrap();
            let started = tokio::time::Instant::now();
            io.flush().await.unwrap();
            assert_eq!(started.elapsed(), Duration::ZERO, "{bytes:?} was held");
            assert_eq!(writes.load(Ordering::SeqCst), 1);
        }
    }
}
