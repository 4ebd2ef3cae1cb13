//! gRPC error inspection for `etcd_client` results.

use std::fmt::Debug;

/// gRPC status code (re-exported from tonic so tests need no tonic dependency).
pub use tonic::Code;

/// The gRPC code and message if `err` is a gRPC status from the server; `None` for transport,
/// client-side argument and other errors.
pub fn grpc_error(err: &etcd_client::Error) -> Option<(Code, String)> {
    match err {
        etcd_client::Error::GRpcStatus(status) => {
            Some((status.code(), status.message().to_owned()))
        }
        _ => None,
    }
}

/// Asserts that `res` failed with exactly this gRPC `code` and `message`.
///
/// Messages are compared byte for byte: etcd clients map errors back to typed errors by message
/// (`rpctypes.errStringToError`).
#[track_caller]
pub fn assert_grpc_error<T: Debug>(res: Result<T, etcd_client::Error>, code: Code, message: &str) {
    match res {
        Ok(v) => panic!("expected gRPC error {code:?} {message:?}, got Ok({v:?})"),
        Err(e) => match grpc_error(&e) {
            Some((c, m)) => {
                assert_eq!(
                    (c, m.as_str()),
                    (code, message),
                    "wrong gRPC error (got code {c:?} message {m:?})"
                );
            }
            None => panic!("expected gRPC error {code:?} {message:?}, got non-gRPC error {e:?}"),
        },
    }
}
