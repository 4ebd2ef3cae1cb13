//! The crate's one error type: why a client's byte stream could not be filtered
//! ([`crate::h2authority`]). The accept loop has no errors of its own to report: it logs a
//! failed accept or handshake and goes on with the next connection.

use std::io;

/// Why a client's HTTP/2 byte stream cannot be filtered; the connection is closed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A header block failed to decode (RFC 7541).
    #[error(transparent)]
    Hpack(#[from] etcdrs_hpack::Error),
    /// A header block (HEADERS plus CONTINUATIONs) is larger than we buffer.
    #[error("http2: header block on stream {stream} exceeds {limit} bytes")]
    HeaderBlockTooLarge {
        /// The stream the block belongs to.
        stream: u32,
        /// The bound.
        limit: usize,
    },
    /// A HEADERS frame's padding or priority fields do not fit its payload.
    #[error("http2: malformed HEADERS frame on stream {stream}")]
    MalformedHeaders {
        /// The stream the frame belongs to.
        stream: u32,
    },
    /// Another frame arrived while a header block awaited its CONTINUATION.
    #[error(
        "http2: expected CONTINUATION on stream {expected}, got frame type {frame_type} on stream {stream}"
    )]
    ExpectedContinuation {
        /// The stream whose header block is open.
        expected: u32,
        /// The type of the frame that arrived.
        frame_type: u8,
        /// The stream of the frame that arrived.
        stream: u32,
    },
    /// An earlier read failed; the filter's state is lost.
    #[error("http2: connection filter failed earlier")]
    FilterFailed,
}

/// The crate's result type.
pub type Result<T, E = Error> = std::result::Result<T, E>;

impl From<Error> for io::Error {
    fn from(e: Error) -> Self {
        io::Error::new(io::ErrorKind::InvalidData, e)
    }
}
