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

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll, ready};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// The most bytes held back from the socket.
pub const BUFFER_LIMIT: usize = 64 * 1024;

/// A connection whose writes are gathered until its task has let others run (module docs).
pub struct Coalesced<IO> {
    io: IO,
    buf: Vec<u8>,
    /// Bytes of `buf` already written to `io`.
    written: usize,
    /// The task has been sent to the back of the queue for what `buf` holds.
    yielded: bool,
}

impl<IO> Coalesced<IO> {
    /// Wraps `io`.
    pub fn new(io: IO) -> Self {
        Coalesced {
            io,
            buf: Vec::new(),
            written: 0,
            yielded: false,
        }
    }

    fn pending(&self) -> usize {
        self.buf.len() - self.written
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
}
