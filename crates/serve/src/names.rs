//! The header names the request path looks up, parsed once at compile time: a lookup by a
//! `&str` parses and checks the name on every call, several times per request.

use axum::http::HeaderName;

/// gRPC's status trailer.
pub const GRPC_STATUS: HeaderName = HeaderName::from_static("grpc-status");
/// gRPC's error message trailer.
pub const GRPC_MESSAGE: HeaderName = HeaderName::from_static("grpc-message");
/// gRPC's message compression.
pub const GRPC_ENCODING: HeaderName = HeaderName::from_static("grpc-encoding");
/// etcd's auth token (gRPC metadata).
pub const TOKEN: HeaderName = HeaderName::from_static("token");
