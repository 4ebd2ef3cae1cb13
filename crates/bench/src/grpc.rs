//! A lean gRPC client for the unary workloads (put, range, txn-put): HTTP/2 straight from the
//! `h2` crate, one connection task per connection and nothing between a client's call and its
//! connection (no tower buffer, balancer or per-request task, as a tonic `Channel` has). On a
//! machine with few cores the load generator's own cost per request caps the rate it can
//! measure, the same for every target; this keeps that cap high.
//!
//! Still an honest client: each call is a full gRPC request (the same protobuf message etcd's
//! client sends, `content-type: application/grpc`, `te: trailers`), and each response is read
//! whole, its `grpc-status` checked (trailers-only answers included) and its message decoded.

use std::future::poll_fn;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use bytes::{Buf, BufMut, Bytes, BytesMut};
use h2::client::SendRequest;
use http::{HeaderValue, Method, Request, Uri, header};
use prost::Message;
use tokio::net::TcpStream;

/// gRPC paths of the KV calls the workloads make.
pub const KV_RANGE: &str = "/etcdserverpb.KV/Range";
pub const KV_PUT: &str = "/etcdserverpb.KV/Put";
pub const KV_TXN: &str = "/etcdserverpb.KV/Txn";

/// Largest response message a call accepts (etcd's default client limit is larger than any
/// response these workloads provoke).
const MAX_RESPONSE: usize = 64 << 20;

/// One HTTP/2 connection to an endpoint. Cheap to clone: clones share the connection.
#[derive(Clone)]
pub struct Conn {
    send: SendRequest<Bytes>,
    /// `http://host:port`, the base of every request's URI.
    base: String,
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
    /// Dials `endpoint` and completes the HTTP/2 handshake; the connection's I/O runs on a task
    /// of its own (`bench h2 connection`) that ends when the last clone is dropped.
    pub async fn connect(endpoint: &str, timeout: Duration) -> Result<Conn> {
        let hostport = authority(endpoint)?;
        let dial = async {
            let tcp = TcpStream::connect(hostport).await?;
            tcp.set_nodelay(true)?;
            h2::client::Builder::new()
                .handshake::<_, Bytes>(tcp)
                .await
                .map_err(std::io::Error::other)
        };
        let (send, connection) = tokio::time::timeout(timeout, dial)
            .await
            .with_context(|| format!("connecting to {hostport}: timed out"))?
            .with_context(|| format!("connecting to {hostport}"))?;
        // Task `bench h2 connection`: drives the connection until every handle is gone.
        tokio::spawn(async move {
            let _ = connection.await;
        });
        Ok(Conn {
            send,
            base: format!("http://{hostport}"),
        })
    }

    /// A caller of `path` over this connection.
    pub fn unary(&self, path: &str) -> Result<Unary> {
        let uri: Uri = format!("{}{path}", self.base)
            .parse()
            .with_context(|| format!("{}{path} is not a URI", self.base))?;
        Ok(Unary {
            send: self.send.clone(),
            uri,
            buf: BytesMut::new(),
        })
    }
}

/// One client's calls of one gRPC method, one at a time.
pub struct Unary {
    send: SendRequest<Bytes>,
    uri: Uri,
    /// Where request messages are encoded (reused).
    buf: BytesMut,
}

impl Unary {
    /// Sends `req` and returns the decoded response, or the error as a message.
    pub async fn call<Req: Message, Resp: Message + Default>(
        &mut self,
        req: &Req,
    ) -> Result<Resp, String> {
        let mut request = Request::new(());
        *request.method_mut() = Method::POST;
        *request.uri_mut() = self.uri.clone();
        let headers = request.headers_mut();
        headers.insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/grpc"),
        );
        headers.insert(header::TE, HeaderValue::from_static("trailers"));

        let len = req.encoded_len();
        self.buf.reserve(5 + len);
        self.buf.put_u8(0);
        self.buf.put_u32(len as u32);
        req.encode_raw(&mut self.buf);
        let message = self.buf.split().freeze();

        poll_fn(|cx| self.send.poll_ready(cx))
            .await
            .map_err(|e| format!("connection: {e}"))?;
        let (response, mut body) = self
            .send
            .send_request(request, false)
            .map_err(|e| format!("sending request: {e}"))?;
        body.send_data(message, true)
            .map_err(|e| format!("sending request: {e}"))?;
        let response = response.await.map_err(|e| format!("response: {e}"))?;
        if response.status() != http::StatusCode::OK {
            return Err(format!("HTTP status {}", response.status()));
        }
        let (parts, mut body) = response.into_parts();
        // A trailers-only response carries the status in its headers.
        status_ok(&parts.headers)?;
        let mut data = BytesMut::new();
        while let Some(chunk) = body.data().await {
            let chunk = chunk.map_err(|e| format!("response body: {e}"))?;
            let _ = body.flow_control().release_capacity(chunk.len());
            if data.len() + chunk.len() > MAX_RESPONSE + 5 {
                return Err(format!("response larger than {MAX_RESPONSE} bytes"));
            }
            data.extend_from_slice(&chunk);
        }
        match body.trailers().await {
            Ok(Some(trailers)) => status_ok(&trailers)?,
            Ok(None) if parts.headers.contains_key("grpc-status") => {}
            Ok(None) => return Err("response without grpc-status".to_owned()),
            Err(e) => return Err(format!("response trailers: {e}")),
        }
        decode_message(data.freeze())
    }
}

/// `Ok` unless `headers` hold a `grpc-status` other than 0 (OK).
fn status_ok(headers: &http::HeaderMap) -> Result<(), String> {
    let Some(status) = headers.get("grpc-status") else {
        return Ok(());
    };
    if status.as_bytes() == b"0" {
        return Ok(());
    }
    let message = headers
        .get("grpc-message")
        .map(|m| String::from_utf8_lossy(m.as_bytes()).into_owned())
        .unwrap_or_default();
    Err(format!(
        "grpc-status {}: {message}",
        String::from_utf8_lossy(status.as_bytes())
    ))
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
        let mut headers = http::HeaderMap::new();
        assert!(status_ok(&headers).is_ok());
        headers.insert("grpc-status", HeaderValue::from_static("0"));
        assert!(status_ok(&headers).is_ok());
        headers.insert("grpc-status", HeaderValue::from_static("9"));
        headers.insert(
            "grpc-message",
            HeaderValue::from_static("etcdserver: key not found"),
        );
        assert_eq!(
            status_ok(&headers),
            Err("grpc-status 9: etcdserver: key not found".to_owned())
        );
    }
}
