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
//!
//! Layout: this module holds the callers' side ([`Conn`], [`Unary`]); `state` what callers
//! and the connection task share; `driver` the task itself; `frame` the HTTP/2 framing;
//! `head` the request-header encoder.

mod driver;
mod frame;
mod head;
mod state;

use std::collections::HashMap;
use std::future::poll_fn;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{Context as _, Result, bail};
use bytes::{Buf, BufMut, Bytes, BytesMut};
use etcdrs_hpack::DEFAULT_TABLE_SIZE;
use prost::Message;
use tokio::net::TcpStream;

use self::driver::Driver;
use self::frame::{
    CANCEL, CONN_WINDOW, DEFAULT_WINDOW, MAX_RECV_FRAME, PREFACE, READ_CHUNK, SETTINGS,
    SETTINGS_ENABLE_PUSH, SETTINGS_INITIAL_WINDOW_SIZE, STREAM_WINDOW, STREAMS_BEFORE_SETTINGS,
    frame_head, rst_stream, window_update,
};
use self::head::{HeadEncoder, RequestFields};
use self::state::{Shared, State};

/// gRPC paths of the unary calls the workloads make.
pub const KV_RANGE: &str = "/etcdserverpb.KV/Range";
pub const KV_PUT: &str = "/etcdserverpb.KV/Put";
pub const KV_TXN: &str = "/etcdserverpb.KV/Txn";
pub const KV_COMPACT: &str = "/etcdserverpb.KV/Compact";
pub const LEASE_GRANT: &str = "/etcdserverpb.Lease/LeaseGrant";

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
}
