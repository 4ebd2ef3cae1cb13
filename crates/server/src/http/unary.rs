//! KV calls answered without tonic's per-call machinery: the request's one message is read
//! and decoded here, the `Kv` method called, and its answer written as one framed message and
//! a `grpc-status: 0` trailer.
//!
//! Why: tonic serves a unary call through a 2 KiB boxed future, a streaming decoder, an
//! encoder with an 8 KiB buffer per response and a header map built per trailer. A KV call
//! needs none of it: answered here, a put under `etcd-benchmark put` with 1000 clients costs
//! the member 2-6% less CPU (three sets of alternating rounds; the rate moved within this
//! machine's noise).
//!
//! The answers are tonic's, byte for byte where a client can see it: the same headers
//! (`content-type: application/grpc`), the same frames (one DATA frame, then the trailers), and
//! an error is tonic's own `Status::into_http` (a trailers-only answer) with the size rewrite
//! the router gives. Anything but the plain case, a compressed or oversized message, a body
//! that is not exactly one message, a message that does not decode, trailers or a broken
//! stream from the client, an unknown method, goes to tonic with the bytes read so far put
//! back in front of the rest of the body ([`Replay`](etcdrs_serve::unary::Replay)), so that its refusal is tonic's.

use std::convert::Infallible;

use axum::body::Body;
use axum::response::Response;
use bytes::{BufMut, Bytes, BytesMut};
use etcdrs_proto::etcdserverpb::kv_server::{Kv, KvServer};
use etcdrs_serve::unary::{PREFIX, one_message, read_whole};
use http_body::Body as HttpBody;
use prost::Message;
use tower::Service;

use crate::rpc::Rpc;

/// Paths of the KV service's methods start so (`/etcdserverpb.KV/Put`, …).
pub(super) const KV_PREFIX: &str = "/etcdserverpb.KV/";

/// The unary KV methods, by the last part of their path. `RangeStream` (etcd 3.7) streams its
/// answer, so it is not here: like an unknown method, it goes to tonic's KV service.
#[derive(Clone, Copy)]
enum Method {
    Range,
    Put,
    DeleteRange,
    Txn,
    Compact,
}

impl Method {
    fn of(path: &str) -> Option<Method> {
        Some(match path.strip_prefix(KV_PREFIX)? {
            "Range" => Method::Range,
            "Put" => Method::Put,
            "DeleteRange" => Method::DeleteRange,
            "Txn" => Method::Txn,
            "Compact" => Method::Compact,
            _ => return None,
        })
    }
}

/// The KV service served directly, with tonic's for everything but the plain case.
#[derive(Clone)]
pub(super) struct DirectKv {
    rpc: Rpc,
    tonic: KvServer<Rpc>,
    /// Largest message accepted (tonic's `max_decoding_message_size`, the same limit).
    max_message: usize,
}

impl DirectKv {
    pub(super) fn new(rpc: Rpc, tonic: KvServer<Rpc>, max_message: usize) -> DirectKv {
        DirectKv {
            rpc,
            tonic,
            max_message,
        }
    }

    /// Answers one KV call.
    pub(super) async fn call<B>(mut self, request: axum::http::Request<B>) -> Response
    where
        B: HttpBody<Data = Bytes> + Send + Unpin + 'static,
        B::Error: Into<Box<dyn std::error::Error + Send + Sync>> + Send,
    {
        let method = Method::of(request.uri().path());
        // A compressed body is tonic's to refuse (no compression is accepted).
        let encoded = request
            .headers()
            .get(etcdrs_serve::names::GRPC_ENCODING)
            .is_some_and(|v| v.as_bytes() != b"identity");
        let (parts, body) = request.into_parts();
        let Some(method) = method.filter(|_| !encoded) else {
            return self.replay(parts, body).await;
        };
        // The whole body, up to one largest message and its prefix.
        let replay = read_whole(body, self.max_message + PREFIX).await;
        let Some(message) = replay
            .whole()
            .and_then(|body| one_message(&body, self.max_message))
        else {
            return self.replay(parts, replay).await;
        };
        let rpc = self.rpc.clone();
        macro_rules! answer {
            ($request:ty, $method:ident) => {
                match <$request>::decode(message) {
                    Ok(decoded) => {
                        let request = tonic::Request::from_http(axum::http::Request::from_parts(
                            parts, decoded,
                        ));
                        respond(Kv::$method(&rpc, request).await)
                    }
                    Err(_) => self.replay(parts, replay).await,
                }
            };
        }
        use etcdrs_proto::etcdserverpb as pb;
        match method {
            // A plain range is written from the key-values as stored.
            Method::Range => match pb::RangeRequest::decode(message) {
                Ok(decoded) => {
                    let plain = crate::rpc::encoded_range::is_plain(&decoded);
                    let request =
                        tonic::Request::from_http(axum::http::Request::from_parts(parts, decoded));
                    if !plain {
                        return respond(Kv::range(&rpc, request).await);
                    }
                    match rpc.range_framed(request).await {
                        Ok(crate::rpc::encoded_range::Framed::Chunks(chunks)) => {
                            etcdrs_serve::unary::answer_chunks(chunks)
                        }
                        Ok(crate::rpc::encoded_range::Framed::Produced(chunks)) => {
                            etcdrs_serve::unary::answer_produced(chunks)
                        }
                        Err(status) => respond::<pb::RangeResponse>(Err(status)),
                    }
                }
                Err(_) => self.replay(parts, replay).await,
            },
            Method::Put => answer!(pb::PutRequest, put),
            Method::DeleteRange => answer!(pb::DeleteRangeRequest, delete_range),
            Method::Txn => answer!(pb::TxnRequest, txn),
            Method::Compact => answer!(pb::CompactionRequest, compact),
        }
    }

    /// Hands the call to tonic, with its body as it is left (a [`Replay`](etcdrs_serve::unary::Replay) of what was read).
    async fn replay<B>(&mut self, parts: axum::http::request::Parts, body: B) -> Response
    where
        B: HttpBody<Data = Bytes> + Send + 'static,
        B::Error: Into<Box<dyn std::error::Error + Send + Sync>> + Send,
    {
        let Ok(response) = self
            .tonic
            .call(axum::http::Request::from_parts(parts, body))
            .await;
        into_axum(Ok(response)).unwrap_or_else(|e| match e {})
    }
}

/// A handler's answer as tonic gives it.
fn respond<M: Message>(answer: Result<tonic::Response<M>, tonic::Status>) -> Response {
    let response = match answer {
        Ok(response) => response,
        Err(status) => {
            let mut response = status.into_http::<Body>();
            etcdrs_serve::grpc_size::rewrite_size_error(response.headers_mut());
            return response;
        }
    };
    let (metadata, message, extensions) = response.into_parts();
    let len = message.encoded_len();
    let mut data = BytesMut::with_capacity(PREFIX + len);
    data.put_u8(0);
    // gRPC frames a message with a 32-bit length: 4 GiB or more cannot be sent.
    let Ok(len32) = u32::try_from(len) else {
        let status = tonic::Status::resource_exhausted("answer too large for one gRPC message");
        return status.into_http::<Body>();
    };
    data.put_u32(len32);
    message.encode_raw(&mut data);
    let mut response = etcdrs_serve::unary::answer(data.freeze());
    // The handler's metadata (none for KV today), under tonic's content type.
    let mut headers = metadata.into_headers();
    headers.extend(std::mem::take(response.headers_mut()));
    *response.headers_mut() = headers;
    *response.extensions_mut() = extensions;
    response
}

/// A tonic answer as axum's, with a size error's status rewritten as grpc-go words it.
pub(super) fn into_axum(
    answered: Result<axum::http::Response<tonic::body::Body>, Infallible>,
) -> Result<Response, Infallible> {
    let Ok(mut response) = answered;
    etcdrs_serve::grpc_size::rewrite_size_error(response.headers_mut());
    Ok(response.map(Body::new))
}
