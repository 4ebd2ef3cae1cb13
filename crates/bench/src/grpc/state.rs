//! The state a connection's callers and its task share ([`Shared`], one mutex never held
//! across an `.await`): the queue of frames to write, the table of open streams and what has
//! arrived on each, the peer's settings and both flow-control windows, and the request-header
//! encoder. Callers open streams and collect responses here; the connection task
//! ([`Driver`](super::driver::Driver)) fills them in. No I/O happens here.

use std::collections::HashMap;
use std::sync::{Mutex, MutexGuard};
use std::task::{Context, Poll, Waker};

use bytes::{BufMut, Bytes, BytesMut};

use super::frame::{DATA, END_HEADERS, END_STREAM, HEADERS, frame_head};
use super::head::{HeadEncoder, RequestFields};

/// The state a connection's callers and its task share.
pub(super) struct Shared {
    pub(super) state: Mutex<State>,
}

pub(super) struct State {
    /// Frames ready to be written, in order.
    pub(super) out: BytesMut,
    /// The connection task, woken when `out` gains frames or the callers are gone.
    pub(super) writer: Option<Waker>,
    /// Why the connection can take no more calls (GOAWAY, an error, the socket closed).
    pub(super) failed: Option<String>,
    /// Every handle is gone.
    pub(super) closed: bool,
    /// The next stream identifier (odd: client-initiated).
    pub(super) next_id: u32,
    /// Streams open now, by identifier.
    pub(super) streams: HashMap<u32, Stream>,
    /// Callers waiting for the number of open streams to drop below `max_concurrent`.
    pub(super) waiting: Vec<Waker>,
    /// The server's SETTINGS_MAX_CONCURRENT_STREAMS.
    pub(super) max_concurrent: usize,
    /// The server's first SETTINGS frame has arrived.
    pub(super) got_settings: bool,
    /// The server's SETTINGS_MAX_FRAME_SIZE: the largest DATA frame we send.
    pub(super) max_frame: usize,
    /// The server's SETTINGS_INITIAL_WINDOW_SIZE: a new stream's send window.
    pub(super) initial_window: i64,
    /// The connection's send window.
    pub(super) send_window: i64,
    /// The request headers' dynamic table. Header blocks are encoded and queued under one
    /// lock, so the server decodes them in the order they were encoded.
    pub(super) encoder: HeadEncoder,
}

/// One request and its response as they arrive.
#[derive(Default)]
pub(super) struct Stream {
    /// Request body not sent yet (waiting for flow-control window).
    pub(super) body: Bytes,
    /// The stream's send window.
    pub(super) send_window: i64,
    pub(super) head: Option<Fields>,
    pub(super) trailers: Option<Fields>,
    pub(super) data: BytesMut,
    /// The server ended the stream (or reset it: `error`).
    pub(super) done: bool,
    pub(super) error: Option<String>,
    pub(super) waker: Option<Waker>,
}

/// What a call needs from a header block.
#[derive(Default)]
pub(super) struct Fields {
    pub(super) status: Option<u16>,
    pub(super) grpc_status: Option<Vec<u8>>,
    pub(super) grpc_message: Option<Vec<u8>>,
}

impl Fields {
    pub(super) fn from_block(
        hpack: &mut etcdrs_hpack::Decoder,
        block: &[u8],
    ) -> Result<Self, String> {
        let mut f = Fields::default();
        hpack
            .decode_with(block, |field| match field.name {
                b":status" => {
                    f.status = std::str::from_utf8(field.value)
                        .ok()
                        .and_then(|s| s.parse().ok());
                }
                b"grpc-status" => f.grpc_status = Some(field.value.to_vec()),
                b"grpc-message" => f.grpc_message = Some(field.value.to_vec()),
                _ => {}
            })
            .map_err(|e| format!("decoding response headers: {e}"))?;
        Ok(f)
    }

    /// `Ok` unless the fields hold a `grpc-status` other than 0 (OK).
    pub(super) fn grpc_ok(&self) -> Result<(), String> {
        let Some(status) = &self.grpc_status else {
            return Ok(());
        };
        if status.as_slice() == b"0" {
            return Ok(());
        }
        let message = self
            .grpc_message
            .as_deref()
            .map(etcdrs_proto::rpctypes::decode_grpc_message)
            .unwrap_or_default();
        Err(format!(
            "grpc-status {}: {message}",
            String::from_utf8_lossy(status)
        ))
    }
}

impl Shared {
    pub(super) fn lock(&self) -> MutexGuard<'_, State> {
        // A panic while the lock was held leaves nothing half-done that matters to a bench run.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Opens a stream with the request's `fields` and sends `message` as its body, once the
    /// server's limit on concurrent streams allows.
    pub(super) fn open(
        &self,
        cx: &mut Context<'_>,
        fields: &mut Option<RequestFields<'_>>,
        message: &mut Option<Bytes>,
    ) -> Poll<Result<u32, String>> {
        let mut st = self.lock();
        if let Some(e) = &st.failed {
            return Poll::Ready(Err(e.clone()));
        }
        if st.streams.len() >= st.max_concurrent {
            st.waiting.push(cx.waker().clone());
            return Poll::Pending;
        }
        let id = st.next_id;
        if id > i32::MAX as u32 {
            return Poll::Ready(Err(
                "no stream identifiers left on the connection".to_owned()
            ));
        }
        st.next_id += 2;
        let body = message.take().unwrap_or_default();
        let head = match fields.take() {
            Some(f) => st.encoder.head(f),
            None => return Poll::Ready(Err("request sent twice".to_owned())),
        };
        let was_empty = st.out.is_empty();
        let flags = if body.is_empty() {
            END_HEADERS | END_STREAM
        } else {
            END_HEADERS
        };
        frame_head(&mut st.out, head.len(), HEADERS, flags, id);
        st.out.put_slice(&head);
        let send_window = st.initial_window;
        st.streams.insert(
            id,
            Stream {
                body,
                send_window,
                ..Default::default()
            },
        );
        st.send_body(id);
        if was_empty {
            st.wake_writer();
        }
        Poll::Ready(Ok(id))
    }

    /// The whole response of stream `id`, once the server has ended it.
    pub(super) fn poll_response(
        &self,
        cx: &mut Context<'_>,
        id: u32,
    ) -> Poll<Result<Stream, String>> {
        let mut st = self.lock();
        let Some(s) = st.streams.get_mut(&id) else {
            return Poll::Ready(Err("stream lost".to_owned()));
        };
        if !s.done {
            if !s.waker.as_ref().is_some_and(|w| w.will_wake(cx.waker())) {
                s.waker = Some(cx.waker().clone());
            }
            return Poll::Pending;
        }
        let s = st.streams.remove(&id).unwrap_or_default();
        st.stream_ended();
        Poll::Ready(match s.error {
            Some(e) => Err(e),
            None => Ok(s),
        })
    }
}

impl State {
    pub(super) fn wake_writer(&self) {
        if let Some(w) = &self.writer {
            w.wake_by_ref();
        }
    }

    /// A stream left the table: a caller waiting for room may open one.
    pub(super) fn stream_ended(&mut self) {
        for w in self.waiting.drain(..) {
            w.wake();
        }
    }

    /// Queues as much of stream `id`'s body as the windows allow.
    pub(super) fn send_body(&mut self, id: u32) {
        let State {
            out,
            streams,
            send_window,
            max_frame,
            ..
        } = self;
        let Some(s) = streams.get_mut(&id) else {
            return;
        };
        while !s.body.is_empty() {
            let n = (s.body.len() as i64)
                .min(s.send_window)
                .min(*send_window)
                .min(*max_frame as i64);
            if n <= 0 {
                return;
            }
            let chunk = s.body.split_to(n as usize);
            let flags = if s.body.is_empty() { END_STREAM } else { 0 };
            frame_head(out, chunk.len(), DATA, flags, id);
            out.put_slice(&chunk);
            s.send_window -= n;
            *send_window -= n;
        }
    }

    /// Queues what the windows now allow of every body still waiting.
    pub(super) fn send_bodies(&mut self) {
        let mut ids: Vec<u32> = self
            .streams
            .iter()
            .filter(|(_, s)| !s.body.is_empty())
            .map(|(id, _)| *id)
            .collect();
        ids.sort_unstable();
        for id in ids {
            self.send_body(id);
        }
    }

    /// Ends stream `id` (if a caller still waits for it) with what it has, or with `error`.
    pub(super) fn finish(&mut self, id: u32, error: Option<String>) {
        if let Some(s) = self.streams.get_mut(&id) {
            if s.done {
                return;
            }
            s.done = true;
            if s.error.is_none() {
                s.error = error;
            }
            if let Some(w) = s.waker.take() {
                w.wake();
            }
        }
    }

    /// The connection is unusable: every open call fails with `why`.
    pub(super) fn fail(&mut self, why: String) {
        let ids: Vec<u32> = self.streams.keys().copied().collect();
        for id in ids {
            self.finish(id, Some(why.clone()));
        }
        self.failed.get_or_insert(why);
        self.stream_ended();
    }
}

impl State {
    /// A header block of stream `id`: its response headers, then its trailers.
    pub(super) fn on_headers(&mut self, id: u32, fields: Fields, end_stream: bool) {
        if let Some(s) = self.streams.get_mut(&id) {
            if s.head.is_none() {
                s.head = Some(fields);
            } else {
                s.trailers = Some(fields);
            }
            if end_stream {
                self.finish(id, None);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    pub(super) fn statuses_other_than_ok_are_errors() {
        let mut f = Fields::default();
        assert!(f.grpc_ok().is_ok());
        f.grpc_status = Some(b"0".to_vec());
        assert!(f.grpc_ok().is_ok());
        f.grpc_status = Some(b"9".to_vec());
        f.grpc_message = Some(b"etcdserver: key not found".to_vec());
        assert_eq!(
            f.grpc_ok(),
            Err("grpc-status 9: etcdserver: key not found".to_owned())
        );
        f.grpc_message = Some(b"etcdserver:%20request%20is%20too%20large%".to_vec());
        assert_eq!(
            f.grpc_ok(),
            Err("grpc-status 9: etcdserver: request is too large%".to_owned())
        );
    }
}
