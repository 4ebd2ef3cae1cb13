//! A lean gRPC client for the unary workloads (put, range, txn-put): the HTTP/2 framing (RFC 9113)
//! a unary call needs, written for the load generator, with one task per connection and nothing
//! between a client's call and its connection. On a machine with few cores the load generator's
//! own cost per request caps the rate it can measure, the same for every target; this keeps that
//! cap high.
//!
//! Still an honest client: each call is a full gRPC request on a stream of its own (the same
//! protobuf message etcd's client sends, `content-type: application/grpc`, `te: trailers`), and
//! each response is read whole, its `:status` and `grpc-status` checked (trailers-only answers
//! included) and its message decoded. The connection follows the protocol: the peer's settings
//! (concurrent streams, frame size, initial window), flow control both ways, PING and GOAWAY.
//! Response headers are decoded with `etcdrs_hpack` (dynamic table, Huffman). Request headers are
//! encoded here as real clients (Go's gRPC, `h2`) encode them: each field enters the connection's
//! dynamic table once and is sent as an index from then on ([`HeadEncoder`]).
//!
//! State shared by a connection's callers and its task sits behind one mutex that no one holds
//! across an `.await`.

use std::collections::HashMap;
use std::future::poll_fn;
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use anyhow::{Context as _, Result, bail};
use bytes::{Buf, BufMut, Bytes, BytesMut};
// HPACK's default dynamic table size, which the server's settings may only lower, and the
// static table's size (dynamic indices start after it).
use etcdrs_hpack::{DEFAULT_TABLE_SIZE, STATIC_ENTRIES};
use prost::Message;
use tokio::io::AsyncWrite;
use tokio::net::TcpStream;

/// gRPC paths of the KV calls the workloads make.
pub const KV_RANGE: &str = "/etcdserverpb.KV/Range";
pub const KV_PUT: &str = "/etcdserverpb.KV/Put";
pub const KV_TXN: &str = "/etcdserverpb.KV/Txn";

/// Largest response message a call accepts (etcd's default client limit is larger than any
/// response these workloads provoke).
const MAX_RESPONSE: usize = 64 << 20;

/// The client connection preface.
const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

// Frame types.
const DATA: u8 = 0;
const HEADERS: u8 = 1;
const RST_STREAM: u8 = 3;
const SETTINGS: u8 = 4;
const PUSH_PROMISE: u8 = 5;
const PING: u8 = 6;
const GOAWAY: u8 = 7;
const WINDOW_UPDATE: u8 = 8;
const CONTINUATION: u8 = 9;

// Frame flags.
const END_STREAM: u8 = 0x1;
const ACK: u8 = 0x1;
const END_HEADERS: u8 = 0x4;
const PADDED: u8 = 0x8;
const PRIORITY: u8 = 0x20;

// Settings.
const SETTINGS_HEADER_TABLE_SIZE: u16 = 0x1;
const SETTINGS_ENABLE_PUSH: u16 = 0x2;
const SETTINGS_MAX_CONCURRENT_STREAMS: u16 = 0x3;
const SETTINGS_INITIAL_WINDOW_SIZE: u16 = 0x4;
const SETTINGS_MAX_FRAME_SIZE: u16 = 0x5;

/// The error code of a stream we give up on.
const CANCEL: u32 = 0x8;
/// Flow-control windows before any setting or update says otherwise.
const DEFAULT_WINDOW: i64 = 65_535;
/// The largest frame we accept: we do not raise it from the protocol's default.
const MAX_RECV_FRAME: usize = 16_384;
/// The receive window of each stream we open, the largest HTTP/2 allows: a response never
/// waits for a stream-level WINDOW_UPDATE.
const STREAM_WINDOW: u32 = (1 << 31) - 1;
/// The connection's receive window; topped up whenever half of it has been received.
const CONN_WINDOW: u32 = 16 << 20;
/// Streams a connection opens at once until the server's settings arrive (RFC 9113 §6.5.2
/// asks servers to allow at least 100).
const STREAMS_BEFORE_SETTINGS: usize = 100;
/// Bytes read from the socket at a time.
const READ_CHUNK: usize = 64 * 1024;

/// One HTTP/2 connection to an endpoint. Cheap to clone: clones share the connection.
#[derive(Clone)]
pub struct Conn {
    handle: Arc<Handle>,
    /// `host:port` of the endpoint, the `:authority` of every request.
    authority: String,
}

/// `host:port` of an endpoint given as `host:port` or `http://host:port`.
fn authority(endpoint: &str) -> Result<&str> {
    if endpoint.starts_with("https://") {
        bail!("{endpoint}: TLS endpoints are not supported by the unary workloads");
    }
    let hostport = endpoint.strip_prefix("http://").unwrap_or(endpoint);
    Ok(hostport.trim_end_matches('/'))
}

impl Conn {
    /// Dials `endpoint` and sends the connection preface and our settings; the connection's
    /// I/O runs on a task of its own (`bench h2 connection`) that ends when the last clone (and
    /// every caller made from one) is dropped.
    pub async fn connect(endpoint: &str, timeout: Duration) -> Result<Conn> {
        let hostport = authority(endpoint)?;
        let tcp = tokio::time::timeout(timeout, TcpStream::connect(hostport))
            .await
            .with_context(|| format!("connecting to {hostport}: timed out"))?
            .with_context(|| format!("connecting to {hostport}"))?;
        tcp.set_nodelay(true)
            .with_context(|| format!("connecting to {hostport}"))?;

        let mut out = BytesMut::with_capacity(READ_CHUNK);
        out.put_slice(PREFACE);
        frame_head(&mut out, 12, SETTINGS, 0, 0);
        out.put_u16(SETTINGS_ENABLE_PUSH);
        out.put_u32(0);
        out.put_u16(SETTINGS_INITIAL_WINDOW_SIZE);
        out.put_u32(STREAM_WINDOW);
        window_update(&mut out, 0, CONN_WINDOW - DEFAULT_WINDOW as u32);
        let shared = Arc::new(Shared {
            state: Mutex::new(State {
                out,
                writer: None,
                failed: None,
                closed: false,
                next_id: 1,
                streams: HashMap::new(),
                waiting: Vec::new(),
                max_concurrent: STREAMS_BEFORE_SETTINGS,
                got_settings: false,
                max_frame: MAX_RECV_FRAME,
                initial_window: DEFAULT_WINDOW,
                send_window: DEFAULT_WINDOW,
                encoder: HeadEncoder::default(),
            }),
        });
        let driver = Driver {
            io: tcp,
            shared: shared.clone(),
            rbuf: BytesMut::with_capacity(READ_CHUNK),
            wbuf: BytesMut::with_capacity(READ_CHUNK),
            hpack: etcdrs_hpack::Decoder::new(DEFAULT_TABLE_SIZE),
            received: 0,
            continuation: None,
        };
        // Task `bench h2 connection`: drives the connection until every handle is gone.
        tokio::spawn(driver.run());
        Ok(Conn {
            handle: Arc::new(Handle(shared)),
            authority: hostport.to_owned(),
        })
    }

    /// A caller of `path` over this connection.
    pub fn unary(&self, path: &str) -> Result<Unary> {
        if !path.starts_with('/') {
            bail!("{path}: a gRPC path starts with /");
        }
        Ok(Unary {
            handle: self.handle.clone(),
            path: Bytes::copy_from_slice(path.as_bytes()),
            authority: Bytes::copy_from_slice(self.authority.as_bytes()),
            head: None,
            buf: BytesMut::new(),
        })
    }
}

/// The callers' hold on a connection: when the last one goes, the connection's task ends.
struct Handle(Arc<Shared>);

impl Drop for Handle {
    fn drop(&mut self) {
        let mut st = self.0.lock();
        st.closed = true;
        st.wake_writer();
    }
}

/// One client's calls of one gRPC method, one at a time.
pub struct Unary {
    handle: Arc<Handle>,
    path: Bytes,
    authority: Bytes,
    /// The request's header block once every field in it is an index, with the
    /// [`HeadEncoder::generation`] it is valid for.
    head: Option<(u64, Bytes)>,
    /// Where request messages are encoded (reused).
    buf: BytesMut,
}

impl Unary {
    /// Sends `req` and returns the decoded response, or the error as a message.
    pub async fn call<Req: Message, Resp: Message + Default>(
        &mut self,
        req: &Req,
    ) -> Result<Resp, String> {
        let len = req.encoded_len();
        self.buf.reserve(5 + len);
        self.buf.put_u8(0);
        self.buf.put_u32(len as u32);
        req.encode_raw(&mut self.buf);
        let mut message = Some(self.buf.split().freeze());

        let shared = &self.handle.0;
        let fields = RequestFields {
            path: &self.path,
            authority: &self.authority,
            cached: &mut self.head,
        };
        let mut fields = Some(fields);
        let id = poll_fn(|cx| shared.open(cx, &mut fields, &mut message)).await?;
        // Dropped before the response is in (a timeout): the stream is reset and forgotten.
        let mut guard = OpenStream {
            shared,
            id,
            armed: true,
        };
        let response = poll_fn(|cx| shared.poll_response(cx, id)).await;
        // The stream has left the table either way.
        guard.armed = false;
        let response = response?;

        let head = response.head.unwrap_or_default();
        match head.status {
            Some(200) => {}
            Some(status) => return Err(format!("HTTP status {status}")),
            None => return Err("response without :status".to_owned()),
        }
        // A trailers-only response carries the status in its headers.
        head.grpc_ok()?;
        match response.trailers {
            Some(trailers) if trailers.grpc_status.is_some() => trailers.grpc_ok()?,
            None if head.grpc_status.is_some() => {}
            _ => return Err("response without grpc-status".to_owned()),
        }
        decode_message(response.data.freeze())
    }
}

/// A stream whose response its caller still waits for; dropping it cancels the stream.
struct OpenStream<'a> {
    shared: &'a Shared,
    id: u32,
    armed: bool,
}

impl Drop for OpenStream<'_> {
    fn drop(&mut self) {
        if !self.armed {
            return;
        }
        let mut st = self.shared.lock();
        if st.streams.remove(&self.id).is_some() {
            let was_empty = st.out.is_empty();
            rst_stream(&mut st.out, self.id, CANCEL);
            if was_empty {
                st.wake_writer();
            }
            st.stream_ended();
        }
    }
}

/// The state a connection's callers and its task share.
struct Shared {
    state: Mutex<State>,
}

struct State {
    /// Frames ready to be written, in order.
    out: BytesMut,
    /// The connection task, woken when `out` gains frames or the callers are gone.
    writer: Option<Waker>,
    /// Why the connection can take no more calls (GOAWAY, an error, the socket closed).
    failed: Option<String>,
    /// Every handle is gone.
    closed: bool,
    /// The next stream identifier (odd: client-initiated).
    next_id: u32,
    /// Streams open now, by identifier.
    streams: HashMap<u32, Stream>,
    /// Callers waiting for the number of open streams to drop below `max_concurrent`.
    waiting: Vec<Waker>,
    /// The server's SETTINGS_MAX_CONCURRENT_STREAMS.
    max_concurrent: usize,
    /// The server's first SETTINGS frame has arrived.
    got_settings: bool,
    /// The server's SETTINGS_MAX_FRAME_SIZE: the largest DATA frame we send.
    max_frame: usize,
    /// The server's SETTINGS_INITIAL_WINDOW_SIZE: a new stream's send window.
    initial_window: i64,
    /// The connection's send window.
    send_window: i64,
    /// The request headers' dynamic table. Header blocks are encoded and queued under one
    /// lock, so the server decodes them in the order they were encoded.
    encoder: HeadEncoder,
}

/// One request and its response as they arrive.
#[derive(Default)]
struct Stream {
    /// Request body not sent yet (waiting for flow-control window).
    body: Bytes,
    /// The stream's send window.
    send_window: i64,
    head: Option<Fields>,
    trailers: Option<Fields>,
    data: BytesMut,
    /// The server ended the stream (or reset it: `error`).
    done: bool,
    error: Option<String>,
    waker: Option<Waker>,
}

/// What a call needs from a header block.
#[derive(Default)]
struct Fields {
    status: Option<u16>,
    grpc_status: Option<Vec<u8>>,
    grpc_message: Option<Vec<u8>>,
}

impl Fields {
    fn from_block(hpack: &mut etcdrs_hpack::Decoder, block: &[u8]) -> Result<Self, String> {
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
    fn grpc_ok(&self) -> Result<(), String> {
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
    fn lock(&self) -> MutexGuard<'_, State> {
        // A panic while the lock was held leaves nothing half-done that matters to a bench run.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Opens a stream with the request's `fields` and sends `message` as its body, once the
    /// server's limit on concurrent streams allows.
    fn open(
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
    fn poll_response(&self, cx: &mut Context<'_>, id: u32) -> Poll<Result<Stream, String>> {
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
    fn wake_writer(&self) {
        if let Some(w) = &self.writer {
            w.wake_by_ref();
        }
    }

    /// A stream left the table: a caller waiting for room may open one.
    fn stream_ended(&mut self) {
        for w in self.waiting.drain(..) {
            w.wake();
        }
    }

    /// Queues as much of stream `id`'s body as the windows allow.
    fn send_body(&mut self, id: u32) {
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
    fn send_bodies(&mut self) {
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
    fn finish(&mut self, id: u32, error: Option<String>) {
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
    fn fail(&mut self, why: String) {
        let ids: Vec<u32> = self.streams.keys().copied().collect();
        for id in ids {
            self.finish(id, Some(why.clone()));
        }
        self.failed.get_or_insert(why);
        self.stream_ended();
    }
}

/// A header block that continues in CONTINUATION frames.
struct Continuation {
    id: u32,
    end_stream: bool,
    block: Vec<u8>,
}

/// The connection's task: writes what callers queue, reads frames and hands their contents to
/// the streams they belong to.
struct Driver {
    io: TcpStream,
    shared: Arc<Shared>,
    rbuf: BytesMut,
    /// Frames being written (taken from `State::out`).
    wbuf: BytesMut,
    hpack: etcdrs_hpack::Decoder,
    /// DATA bytes received since the connection's window was last topped up.
    received: u32,
    continuation: Option<Continuation>,
}

impl Driver {
    async fn run(mut self) {
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

impl State {
    /// A header block of stream `id`: its response headers, then its trailers.
    fn on_headers(&mut self, id: u32, fields: Fields, end_stream: bool) {
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

/// The payload of a DATA or HEADERS frame without its padding.
fn unpad(flags: u8, payload: &[u8]) -> Result<&[u8], String> {
    if flags & PADDED == 0 {
        return Ok(payload);
    }
    let pad = usize::from(*payload.first().ok_or("padded frame without a pad length")?);
    payload
        .get(1..payload.len().saturating_sub(pad))
        .filter(|_| pad < payload.len())
        .ok_or_else(|| "padding longer than the frame".to_owned())
}

fn be_u32(b: &[u8]) -> Option<u32> {
    Some(u32::from_be_bytes(b.get(..4)?.try_into().ok()?))
}

/// A frame's 9-byte header.
fn frame_head(out: &mut BytesMut, len: usize, kind: u8, flags: u8, id: u32) {
    out.put_uint(len as u64, 3);
    out.put_u8(kind);
    out.put_u8(flags);
    out.put_u32(id);
}

fn window_update(out: &mut BytesMut, id: u32, inc: u32) {
    frame_head(out, 4, WINDOW_UPDATE, 0, id);
    out.put_u32(inc);
}

fn rst_stream(out: &mut BytesMut, id: u32, code: u32) {
    frame_head(out, 4, RST_STREAM, 0, id);
    out.put_u32(code);
}

/// The fields of one request that vary by method and endpoint.
struct RequestFields<'a> {
    path: &'a Bytes,
    authority: &'a Bytes,
    /// The caller's copy of its last all-index header block.
    cached: &'a mut Option<(u64, Bytes)>,
}

/// Static-table entries (RFC 7541 Appendix A) the request headers use.
const STATIC_AUTHORITY: usize = 1;
const STATIC_METHOD_POST: usize = 3;
const STATIC_PATH: usize = 4;
const STATIC_SCHEME_HTTP: usize = 6;
const STATIC_CONTENT_TYPE: usize = 31;

/// The encoder side of a connection's request-header dynamic table (RFC 7541 §2.3). A field is
/// sent once as a literal with incremental indexing, then as an index. Entries are never
/// evicted: a field that no longer fits is sent as a literal without indexing, so an entry's
/// insertion number fixes its index.
struct HeadEncoder {
    /// Insertion number of each field in the table, by (static name index or 0, name, value).
    entries: HashMap<(usize, &'static str, Bytes), usize>,
    /// Entries inserted so far.
    inserted: usize,
    /// Bytes of the table in use (RFC 7541 §4.1).
    used: usize,
    /// The table's size; 0 once the server lowered it below what is in use.
    capacity: usize,
    /// The table was emptied: the next block starts with a size update to 0.
    size_update: bool,
    /// Changes whenever an index would change: a cached block of another generation is stale.
    generation: u64,
}

impl Default for HeadEncoder {
    fn default() -> Self {
        HeadEncoder {
            entries: HashMap::new(),
            inserted: 0,
            used: 0,
            capacity: DEFAULT_TABLE_SIZE,
            size_update: false,
            generation: 0,
        }
    }
}

impl HeadEncoder {
    /// The server's SETTINGS_HEADER_TABLE_SIZE. A limit below what the table holds empties it
    /// (with a size update to 0) and ends indexing on this connection.
    fn limit(&mut self, size: usize) {
        if size < self.capacity {
            self.entries.clear();
            self.used = 0;
            self.capacity = 0;
            self.size_update = true;
            self.generation += 1;
        }
    }

    /// The header block of a gRPC request: `:method POST` and `:scheme http` from the static
    /// table, then `:path`, `:authority`, `content-type: application/grpc` and `te: trailers`.
    fn head(&mut self, f: RequestFields<'_>) -> Bytes {
        if let Some((generation, block)) = f.cached.as_ref()
            && *generation == self.generation
        {
            return block.clone();
        }
        let mut b = BytesMut::with_capacity(64);
        let mut all_indexed = !std::mem::take(&mut self.size_update);
        if !all_indexed {
            hpack_int(&mut b, 5, 0x20, 0);
        }
        hpack_int(&mut b, 7, 0x80, STATIC_METHOD_POST);
        hpack_int(&mut b, 7, 0x80, STATIC_SCHEME_HTTP);
        all_indexed &= self.field(&mut b, STATIC_PATH, "", f.path);
        all_indexed &= self.field(&mut b, STATIC_AUTHORITY, "", f.authority);
        all_indexed &= self.field(&mut b, STATIC_CONTENT_TYPE, "", &CONTENT_TYPE_GRPC);
        all_indexed &= self.field(&mut b, 0, "te", &TE_TRAILERS);
        let block = b.freeze();
        if all_indexed {
            *f.cached = Some((self.generation, block.clone()));
        }
        block
    }

    /// One field: an index if the table has it (`true`), else a literal that enters the table
    /// if it fits, else a plain literal. `name_index` 0: the name is `name`, sent as a literal.
    fn field(
        &mut self,
        b: &mut BytesMut,
        name_index: usize,
        name: &'static str,
        value: &Bytes,
    ) -> bool {
        let key = (name_index, name, value.clone());
        if let Some(k) = self.entries.get(&key) {
            // The newest entry is index 62, the one before it 63, and so on.
            hpack_int(b, 7, 0x80, STATIC_ENTRIES + 1 + self.inserted - k);
            return true;
        }
        let (name_index, name, value) = key;
        let size = name.len().max(static_name_len(name_index)) + value.len() + 32;
        let index = self.used + size <= self.capacity;
        let (prefix, flags) = if index { (6, 0x40) } else { (4, 0x00) };
        hpack_int(b, prefix, flags, name_index);
        if name_index == 0 {
            hpack_string(b, name.as_bytes());
        }
        hpack_string(b, &value);
        if index {
            self.inserted += 1;
            self.used += size;
            self.generation += 1;
            self.entries
                .insert((name_index, name, value), self.inserted);
        }
        false
    }
}

static CONTENT_TYPE_GRPC: Bytes = Bytes::from_static(b"application/grpc");
static TE_TRAILERS: Bytes = Bytes::from_static(b"trailers");

/// Length of the name of static-table entry `index` (of those the request headers use).
fn static_name_len(index: usize) -> usize {
    match index {
        STATIC_AUTHORITY => ":authority".len(),
        STATIC_PATH => ":path".len(),
        STATIC_CONTENT_TYPE => "content-type".len(),
        _ => 0,
    }
}

/// A string literal, not Huffman-coded.
fn hpack_string(b: &mut BytesMut, s: &[u8]) {
    etcdrs_hpack::encode_string(b, s);
}

/// An integer with an N-bit prefix (RFC 7541 §5.1); `flags` fills the first byte's high bits.
fn hpack_int(b: &mut BytesMut, prefix_bits: u8, flags: u8, v: usize) {
    etcdrs_hpack::encode_int(b, flags, prefix_bits, v);
}

/// The one uncompressed message of a unary response body.
fn decode_message<M: Message + Default>(mut data: Bytes) -> Result<M, String> {
    if data.len() < 5 {
        return Err(format!("response body of {} bytes", data.len()));
    }
    let compressed = data.get_u8();
    let len = data.get_u32() as usize;
    if compressed != 0 {
        return Err("compressed response (none was asked for)".to_owned());
    }
    if len != data.len() {
        return Err(format!(
            "response message of {len} bytes in a body of {}",
            data.len()
        ));
    }
    M::decode(data).map_err(|e| format!("decoding the response: {e}"))
}

#[cfg(test)]
mod tests {
    use etcdrs_proto::etcdserverpb::RangeResponse;

    use super::*;

    #[test]
    fn endpoints_with_or_without_scheme() {
        assert_eq!(authority("127.0.0.1:2379").ok(), Some("127.0.0.1:2379"));
        assert_eq!(
            authority("http://127.0.0.1:2379/").ok(),
            Some("127.0.0.1:2379")
        );
        assert!(authority("https://127.0.0.1:2379").is_err());
    }

    #[test]
    fn messages_are_checked_for_framing() {
        let resp = RangeResponse {
            count: 3,
            ..Default::default()
        };
        let mut framed = BytesMut::new();
        framed.put_u8(0);
        framed.put_u32(resp.encoded_len() as u32);
        resp.encode_raw(&mut framed);
        let framed = framed.freeze();
        assert_eq!(decode_message::<RangeResponse>(framed.clone()), Ok(resp));
        assert!(decode_message::<RangeResponse>(framed.slice(..framed.len() - 1)).is_err());
        let mut compressed = framed.to_vec();
        compressed[0] = 1;
        assert!(decode_message::<RangeResponse>(compressed.into()).is_err());
    }

    #[test]
    fn statuses_other_than_ok_are_errors() {
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

    /// Header blocks `encoder` makes for `path`, decoded by an independent decoder that has
    /// seen every block before (as the server's has).
    fn decode_all(decoder: &mut etcdrs_hpack::Decoder, block: &[u8]) -> Vec<(String, String)> {
        decoder
            .decode(block)
            .expect("a valid header block")
            .into_iter()
            .map(|f| {
                (
                    String::from_utf8_lossy(&f.name).into_owned(),
                    String::from_utf8_lossy(&f.value).into_owned(),
                )
            })
            .collect()
    }

    fn request(path: &str, authority: &str) -> Vec<(String, String)> {
        [
            (":method", "POST"),
            (":scheme", "http"),
            (":path", path),
            (":authority", authority),
            ("content-type", "application/grpc"),
            ("te", "trailers"),
        ]
        .iter()
        .map(|(n, v)| ((*n).to_owned(), (*v).to_owned()))
        .collect()
    }

    #[test]
    fn request_heads_index_their_fields_and_stay_decodable() {
        let authority = Bytes::from_static(b"127.0.0.1:2379");
        let range = Bytes::from_static(KV_RANGE.as_bytes());
        let put = Bytes::from_static(KV_PUT.as_bytes());
        let mut encoder = HeadEncoder::default();
        let mut decoder = etcdrs_hpack::Decoder::new(DEFAULT_TABLE_SIZE);
        let (mut range_cache, mut put_cache) = (None, None);
        let head = |encoder: &mut HeadEncoder, path: &Bytes, cache: &mut Option<(u64, Bytes)>| {
            encoder.head(RequestFields {
                path,
                authority: &authority,
                cached: cache,
            })
        };

        // The first block inserts; the second is indexes only, and is cached.
        let first = head(&mut encoder, &range, &mut range_cache);
        assert!(range_cache.is_none());
        assert_eq!(
            decode_all(&mut decoder, &first),
            request(KV_RANGE, "127.0.0.1:2379")
        );
        let second = head(&mut encoder, &range, &mut range_cache);
        assert!(second.len() < 8, "{second:?} is not all indexes");
        assert_eq!(range_cache.as_ref().map(|c| &c.1), Some(&second));
        assert_eq!(
            decode_all(&mut decoder, &second),
            request(KV_RANGE, "127.0.0.1:2379")
        );

        // Another method inserts its path: every index moves, so the cached block is stale.
        let put_first = head(&mut encoder, &put, &mut put_cache);
        assert_eq!(
            decode_all(&mut decoder, &put_first),
            request(KV_PUT, "127.0.0.1:2379")
        );
        let third = head(&mut encoder, &range, &mut range_cache);
        assert_ne!(third, second);
        assert_eq!(
            decode_all(&mut decoder, &third),
            request(KV_RANGE, "127.0.0.1:2379")
        );

        // A table size lowered by the server empties the table; literals from then on.
        encoder.limit(0);
        let after = head(&mut encoder, &range, &mut range_cache);
        assert_eq!(after[0], 0x20, "a size update to 0 comes first");
        assert_eq!(
            decode_all(&mut decoder, &after),
            request(KV_RANGE, "127.0.0.1:2379")
        );
        let again = head(&mut encoder, &put, &mut put_cache);
        assert_eq!(
            decode_all(&mut decoder, &again),
            request(KV_PUT, "127.0.0.1:2379")
        );
    }

    #[test]
    fn fields_that_do_not_fit_are_sent_as_literals() {
        let authority = Bytes::from_static(b"127.0.0.1:2379");
        let long: Bytes = format!("/svc/{}", "m".repeat(5000)).into();
        let mut encoder = HeadEncoder::default();
        let mut decoder = etcdrs_hpack::Decoder::new(DEFAULT_TABLE_SIZE);
        let mut cache = None;
        for _ in 0..3 {
            let block = encoder.head(RequestFields {
                path: &long,
                authority: &authority,
                cached: &mut cache,
            });
            let want = request(
                std::str::from_utf8(&long).unwrap_or_default(),
                "127.0.0.1:2379",
            );
            assert_eq!(decode_all(&mut decoder, &block), want);
        }
        assert!(cache.is_none(), "a block with a literal is never cached");
    }

    #[test]
    fn integers_past_their_prefix_continue_in_7_bit_groups() {
        // RFC 7541 C.1.2: 1337 with a 5-bit prefix.
        let mut b = BytesMut::new();
        hpack_int(&mut b, 5, 0, 1337);
        assert_eq!(&b[..], [31, 154, 10]);
        // Static-table entry 31 (content-type) in a 4-bit prefix.
        let mut b = BytesMut::new();
        hpack_int(&mut b, 4, 0, 31);
        assert_eq!(&b[..], [15, 16]);
    }

    #[test]
    fn padding_is_removed_and_checked() {
        assert_eq!(unpad(0, b"abc"), Ok(&b"abc"[..]));
        assert_eq!(unpad(PADDED, b"\x02abcXX"), Ok(&b"abc"[..]));
        assert!(unpad(PADDED, b"\x05ab").is_err());
        assert!(unpad(PADDED, b"").is_err());
    }
}
