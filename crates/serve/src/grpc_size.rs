//! grpc-go's answer to a request message over the size limit, which etcd's clients see: tonic
//! refuses one with OutOfRange and its own text; grpc-go (and so etcd, and etcd's gRPC proxy)
//! with ResourceExhausted "grpc: received message larger than max (N vs. M)". A response
//! mapping for the routers of the server and of the proxy.

use std::pin::Pin;
use std::task::{Context, Poll};

use http_body::{Body as HttpBody, Frame};

/// Rewrite tonic's size refusal in `response` as grpc-go's: in its headers when it is a
/// trailers-only answer, else in the trailers that end its body (a streaming call whose
/// handler ended with the refusal its request stream gave, as etcd's Watch and LeaseKeepAlive
/// return their receive error).
pub async fn grpc_size_error(mut response: axum::response::Response) -> axum::response::Response {
    rewrite_size_error(response.headers_mut());
    if response.headers().contains_key("grpc-status") {
        return response;
    }
    response.map(|body| axum::body::Body::new(SizeErrorTrailers(body)))
}

/// A response body whose trailers get [`rewrite_size_error`].
struct SizeErrorTrailers(axum::body::Body);

impl HttpBody for SizeErrorTrailers {
    type Data = bytes::Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<bytes::Bytes>, axum::Error>>> {
        Pin::new(&mut self.0).poll_frame(cx).map(|frame| {
            frame.map(|frame| {
                frame.map(|mut frame| {
                    if let Some(trailers) = frame.trailers_mut() {
                        rewrite_size_error(trailers);
                    }
                    frame
                })
            })
        })
    }

    fn is_end_stream(&self) -> bool {
        self.0.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.0.size_hint()
    }
}

/// [`grpc_size_error`] on the headers of a response (a trailers-only gRPC answer carries its
/// status there), for callers outside axum's middleware.
pub fn rewrite_size_error(headers: &mut axum::http::HeaderMap) {
    if headers.get("grpc-status").map(|v| v.as_bytes()) != Some(b"11") {
        return;
    }
    let Some(message) = headers.get("grpc-message").and_then(|v| v.to_str().ok()) else {
        return;
    };
    let message = etcdrs_proto::rpctypes::decode_grpc_message(message.as_bytes());
    let Some(rest) = message.strip_prefix("Error, decoded message length too large: found ") else {
        return;
    };
    let numbers: Vec<&str> = rest
        .split(|c: char| !c.is_ascii_digit())
        .filter(|s| !s.is_empty())
        .collect();
    let [found, limit] = numbers[..] else {
        return;
    };
    let text = format!("grpc: received message larger than max ({found} vs. {limit})");
    if let Ok(value) = axum::http::HeaderValue::from_str(&text) {
        headers.insert("grpc-status", axum::http::HeaderValue::from_static("8"));
        headers.insert("grpc-message", value);
    }
}
