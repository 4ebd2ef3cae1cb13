//! The answer for a path no route serves, on every listener of the server and the gRPC proxy.

use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};

/// grpc-go's message for a path no service serves: the service part of `/service/method`,
/// or the whole path quoted when it has no method part.
fn unknown_grpc_path(path: &str) -> String {
    let method = path.strip_prefix('/').unwrap_or(path);
    match method.rsplit_once('/') {
        Some((service, _)) => format!("unknown service {service}"),
        None => format!("malformed method name: {path:?}"),
    }
}

/// Unknown paths: gRPC's "unimplemented" for gRPC requests (as grpc-go answers an unknown
/// service), Go's plain 404 for the rest (as Go's `http.ServeMux` does).
pub async fn not_found(request: axum::extract::Request) -> Response {
    let is_grpc = request
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("application/grpc"));
    if is_grpc {
        return tonic::Status::unimplemented(unknown_grpc_path(request.uri().path())).into_http();
    }
    (
        StatusCode::NOT_FOUND,
        [(header::CONTENT_TYPE, "text/plain; charset=utf-8")],
        "404 page not found\n",
    )
        .into_response()
}

#[cfg(test)]
mod tests {
    use super::unknown_grpc_path;

    #[test]
    fn names_the_service_as_grpc_go_does() {
        assert_eq!(
            unknown_grpc_path("/v3lockpb.Lock/Lock"),
            "unknown service v3lockpb.Lock"
        );
        assert_eq!(unknown_grpc_path("/a.b.C/D"), "unknown service a.b.C");
        assert_eq!(
            unknown_grpc_path("/nomethod"),
            "malformed method name: \"/nomethod\""
        );
    }
}
