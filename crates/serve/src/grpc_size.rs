//! grpc-go's answer to a request message over the size limit, which etcd's clients see: tonic
//! refuses one with OutOfRange and its own text; grpc-go (and so etcd, and etcd's gRPC proxy)
//! with ResourceExhausted "grpc: received message larger than max (N vs. M)". A response
//! mapping for the routers of the server and of the proxy.

/// Rewrite tonic's size refusal in `response` as grpc-go's.
pub async fn grpc_size_error(mut response: axum::response::Response) -> axum::response::Response {
    rewrite_size_error(response.headers_mut());
    response
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
