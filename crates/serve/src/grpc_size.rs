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
    if headers.get(crate::names::GRPC_STATUS).map(|v| v.as_bytes()) != Some(b"11") {
        return;
    }
    let Some(message) = headers
        .get(crate::names::GRPC_MESSAGE)
        .and_then(|v| v.to_str().ok())
    else {
        return;
    };
    let message = etcdrs_proto::rpctypes::decode_grpc_message(message.as_bytes());
    let Some(text) = grpc_go_text(&message) else {
        return;
    };
    if let Ok(value) = axum::http::HeaderValue::from_str(&text) {
        headers.insert("grpc-status", axum::http::HeaderValue::from_static("8"));
        headers.insert("grpc-message", value);
    }
}

/// grpc-go's text for tonic's size refusal `message`, if it is one.
fn grpc_go_text(message: &str) -> Option<String> {
    let rest = message.strip_prefix("Error, decoded message length too large: found ")?;
    let numbers: Vec<&str> = rest
        .split(|c: char| !c.is_ascii_digit())
        .filter(|s| !s.is_empty())
        .collect();
    let [found, limit] = numbers[..] else {
        return None;
    };
    Some(format!(
        "grpc: received message larger than max ({found} vs. {limit})"
    ))
}

/// A streaming handler's receive error as grpc-go's: tonic's size refusal of a request
/// message becomes ResourceExhausted with grpc-go's text (a stream's status goes out in its
/// trailers, which [`grpc_size_error`] does not see), anything else is left as it is. For
/// the handlers that end their stream with the error their requests gave, as etcd's Watch
/// and LeaseKeepAlive return their receive error.
pub fn grpc_go_status(status: tonic::Status) -> tonic::Status {
    if status.code() != tonic::Code::OutOfRange {
        return status;
    }
    match grpc_go_text(status.message()) {
        Some(text) => tonic::Status::resource_exhausted(text),
        None => status,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tonics_size_refusal_reads_as_grpc_gos() {
        let tonic = tonic::Status::out_of_range(
            "Error, decoded message length too large: found 4294967295 bytes, the limit is: 2097152 bytes",
        );
        let status = grpc_go_status(tonic);
        assert_eq!(status.code(), tonic::Code::ResourceExhausted);
        assert_eq!(
            status.message(),
            "grpc: received message larger than max (4294967295 vs. 2097152)"
        );
        let other = grpc_go_status(tonic::Status::out_of_range(
            "etcdserver: mvcc: required revision has been compacted",
        ));
        assert_eq!(other.code(), tonic::Code::OutOfRange);
    }
}
