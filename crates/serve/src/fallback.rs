//! The answer for a path no route serves, on every listener of the server and the gRPC proxy.

use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};

/// Unknown paths: gRPC's "unimplemented" for gRPC requests (as grpc-go answers an unknown
/// service), Go's plain 404 for the rest (as Go's `http.ServeMux` does).
pub async fn not_found(request: axum::extract::Request) -> Response {
    let is_grpc = request
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("application/grpc"));
    if is_grpc {
        return tonic::Status::unimplemented(format!("unknown service {}", request.uri().path()))
            .into_http();
    }
    (
        StatusCode::NOT_FOUND,
        [(header::CONTENT_TYPE, "text/plain; charset=utf-8")],
        "404 page not found\n",
    )
        .into_response()
}
