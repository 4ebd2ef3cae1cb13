//! The crate's one error type: why an endpoint list or its TLS files cannot be used. Callers
//! map it into their own errors, whose texts their users see.

/// Why an endpoint set cannot be built.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The endpoint list is empty.
    #[error("no endpoints given")]
    NoEndpoints,
    /// An endpoint is not a usable address.
    #[error("invalid endpoint {endpoint:?}: {reason}")]
    BadEndpoint {
        /// The endpoint as given.
        endpoint: String,
        /// Why it is not usable (tonic's explanation).
        reason: String,
    },
    /// A certificate, key or CA file could not be read or used (`path` is `tls` when the
    /// TLS library itself refuses the configuration).
    #[error("{path}: {reason}")]
    Tls {
        /// The file.
        path: String,
        /// Why.
        reason: String,
    },
}

/// Result of this crate's operations.
pub type Result<T, E = Error> = std::result::Result<T, E>;
