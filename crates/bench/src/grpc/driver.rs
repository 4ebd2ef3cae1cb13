//! The connection's task (`bench h2 connection`): it writes the frames callers queue and
//! reads the peer's frames, handing each to the stream it belongs to: response headers and
//! trailers (decoded with `etcdrs_hpack`, CONTINUATION included), DATA with flow control,
//! SETTINGS, PING, GOAWAY and RST_STREAM. It ends, failing every open call, when the socket
//! fails or the peer breaks the protocol, and quietly once every caller is gone.

use std::future::poll_fn;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::{Buf, BufMut, BytesMut};
use tokio::io::AsyncWrite;
use tokio::net::TcpStream;

use super::frame::*;
use super::state::{Fields, Shared};

/// A header block that continues in CONTINUATION frames.
pub(super) struct Continuation {
    id: u32,
    end_stream: bool,
    block: Vec<u8>,
}

/// The connection's task: writes what callers queue, reads frames and hands their contents to
/// the streams they belong to.
pub(super) struct Driver {
    pub(super) io: TcpStream,
    pub(super) shared: Arc<Shared>,
    pub(super) rbuf: BytesMut,
    /// Frames being written (taken from `State::out`).
    pub(super) wbuf: BytesMut,
    pub(super) hpack: etcdrs_hpack::Decoder,
    /// DATA bytes received since the connection's window was last topped up.
    pub(super) received: u32,
    pub(super) continuation: Option<Continuation>,
}

impl Driver {
    pub(super) async fn run(mut self) {
        if let Err(why) = poll_fn(|cx| self.poll_io(cx)).await {
            self.shared.lock().fail(why);
        }
    }

    /// Reads and writes until neither can go on; `Ready(Ok)` once every handle is gone.
    fn poll_io(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), String>> {
        loop {
            let mut progress = false;
            if self.rbuf.capacity() - self.rbuf.len() < MAX_RECV_FRAME {
                self.rbuf.reserve(READ_CHUNK);
            }
            match tokio_util::io::poll_read_buf(Pin::new(&mut self.io), cx, &mut self.rbuf) {
                Poll::Ready(Ok(0)) => {
                    return Poll::Ready(Err("connection closed by the server".to_owned()));
                }
                Poll::Ready(Ok(_)) => {
                    self.on_read()?;
                    progress = true;
                }
                Poll::Ready(Err(e)) => return Poll::Ready(Err(format!("reading: {e}"))),
                Poll::Pending => {}
            }
            if self.wbuf.is_empty() {
                self.wbuf.clear();
                let mut st = self.shared.lock();
                if st.closed {
                    return Poll::Ready(Ok(()));
                }
                std::mem::swap(&mut st.out, &mut self.wbuf);
                if !st.writer.as_ref().is_some_and(|w| w.will_wake(cx.waker())) {
                    st.writer = Some(cx.waker().clone());
                }
            }
            if !self.wbuf.is_empty() {
                match Pin::new(&mut self.io).poll_write(cx, &self.wbuf) {
                    Poll::Ready(Ok(n)) => {
                        self.wbuf.advance(n);
                        progress = true;
                    }
                    Poll::Ready(Err(e)) => return Poll::Ready(Err(format!("writing: {e}"))),
                    Poll::Pending => {}
                }
            }
            if !progress {
                return Poll::Pending;
            }
        }
    }

    /// Handles every whole frame in the read buffer.
    fn on_read(&mut self) -> Result<(), String> {
        let Driver {
            shared,
            rbuf,
            hpack,
            received,
            continuation,
            ..
        } = self;
        let mut st = shared.lock();
        while rbuf.len() >= 9 {
            let len =
                (usize::from(rbuf[0]) << 16) | (usize::from(rbuf[1]) << 8) | usize::from(rbuf[2]);
            if len > MAX_RECV_FRAME {
                return Err(format!(
                    "the server sent a frame of {len} bytes (at most {MAX_RECV_FRAME})"
                ));
            }
            if rbuf.len() < 9 + len {
                break;
            }
            let (kind, flags) = (rbuf[3], rbuf[4]);
            let id = u32::from_be_bytes([rbuf[5], rbuf[6], rbuf[7], rbuf[8]]) & 0x7fff_ffff;
            let payload = &rbuf[9..9 + len];
            if continuation.is_some() && kind != CONTINUATION {
                return Err("a header block was interrupted by another frame".to_owned());
            }
            match kind {
                DATA => {
                    *received += len as u32;
                    if *received >= CONN_WINDOW / 2 {
                        window_update(&mut st.out, 0, *received);
                        *received = 0;
                    }
                    let data = unpad(flags, payload)?;
                    if let Some(s) = st.streams.get_mut(&id) {
                        if s.data.len() + data.len() > MAX_RESPONSE + 5 {
                            rst_stream(&mut st.out, id, CANCEL);
                            st.finish(
                                id,
                                Some(format!("response larger than {MAX_RESPONSE} bytes")),
                            );
                        } else {
                            s.data.extend_from_slice(data);
                            if flags & END_STREAM != 0 {
                                st.finish(id, None);
                            }
                        }
                    }
                }
                HEADERS => {
                    let mut block = unpad(flags, payload)?;
                    if flags & PRIORITY != 0 {
                        block = block
                            .get(5..)
                            .ok_or("HEADERS frame too short for its priority")?;
                    }
                    let end_stream = flags & END_STREAM != 0;
                    if flags & END_HEADERS != 0 {
                        let fields = Fields::from_block(hpack, block)?;
                        st.on_headers(id, fields, end_stream);
                    } else {
                        *continuation = Some(Continuation {
                            id,
                            end_stream,
                            block: block.to_vec(),
                        });
                    }
                }
                CONTINUATION => {
                    let Some(c) = continuation.as_mut() else {
                        return Err("CONTINUATION without a header block".to_owned());
                    };
                    if c.id != id {
                        return Err("CONTINUATION of another stream's header block".to_owned());
                    }
                    c.block.extend_from_slice(payload);
                    if flags & END_HEADERS != 0
                        && let Some(c) = continuation.take()
                    {
                        let fields = Fields::from_block(hpack, &c.block)?;
                        st.on_headers(c.id, fields, c.end_stream);
                    }
                }
                RST_STREAM => {
                    let code = be_u32(payload).ok_or("RST_STREAM frame too short")?;
                    st.finish(
                        id,
                        Some(format!("stream reset by the server (error code {code})")),
                    );
                }
                SETTINGS if flags & ACK == 0 => {
                    if payload.len() % 6 != 0 {
                        return Err("SETTINGS frame of a length not a multiple of 6".to_owned());
                    }
                    let mut unlimited = true;
                    for setting in payload.chunks_exact(6) {
                        let value =
                            u32::from_be_bytes([setting[2], setting[3], setting[4], setting[5]]);
                        match u16::from_be_bytes([setting[0], setting[1]]) {
                            SETTINGS_MAX_CONCURRENT_STREAMS => {
                                unlimited = false;
                                st.max_concurrent = value as usize;
                            }
                            SETTINGS_INITIAL_WINDOW_SIZE => {
                                let delta = i64::from(value) - st.initial_window;
                                st.initial_window = i64::from(value);
                                for s in st.streams.values_mut() {
                                    s.send_window += delta;
                                }
                            }
                            SETTINGS_HEADER_TABLE_SIZE => st.encoder.limit(value as usize),
                            SETTINGS_MAX_FRAME_SIZE => {
                                st.max_frame = (value as usize).max(MAX_RECV_FRAME)
                            }
                            _ => {}
                        }
                    }
                    if unlimited && !st.got_settings {
                        st.max_concurrent = usize::MAX;
                    }
                    st.got_settings = true;
                    frame_head(&mut st.out, 0, SETTINGS, ACK, 0);
                    st.send_bodies();
                    st.stream_ended();
                }
                PING if flags & ACK == 0 => {
                    frame_head(&mut st.out, payload.len(), PING, ACK, 0);
                    st.out.put_slice(payload);
                }
                GOAWAY => {
                    let last = be_u32(payload).ok_or("GOAWAY frame too short")? & 0x7fff_ffff;
                    let code = be_u32(payload.get(4..).unwrap_or_default()).unwrap_or_default();
                    let why =
                        format!("the server closed the connection (GOAWAY, error code {code})");
                    let refused: Vec<u32> =
                        st.streams.keys().copied().filter(|id| *id > last).collect();
                    for id in refused {
                        st.finish(id, Some(why.clone()));
                    }
                    st.failed.get_or_insert(why);
                    st.stream_ended();
                }
                WINDOW_UPDATE => {
                    let inc = i64::from(
                        be_u32(payload).ok_or("WINDOW_UPDATE frame too short")? & 0x7fff_ffff,
                    );
                    if id == 0 {
                        st.send_window += inc;
                    } else if let Some(s) = st.streams.get_mut(&id) {
                        s.send_window += inc;
                    }
                    st.send_bodies();
                }
                PUSH_PROMISE => return Err("PUSH_PROMISE although push is disabled".to_owned()),
                _ => {}
            }
            rbuf.advance(9 + len);
        }
        Ok(())
    }
}
