//! Dialing an etcd cluster as a gRPC client: what the gRPC proxy (towards `--endpoints`) and
//! v3 discovery (towards `--discovery-endpoints`) share, so that both read an endpoint list,
//! connect and fail over by one set of rules (the dialing half of etcd's `clientv3`).
//!
//! # Layout
//! - [`endpoint`]: an endpoint as etcd's flags give it (`host:port`, `http://`, `https://`,
//!   `unix://`, `unixs://`) read into a [`Target`], and the tonic [`tonic::transport::Endpoint`]
//!   built from it with a caller's [`DialOptions`] (connect timeout, TCP_NODELAY, HTTP/2
//!   keep-alive).
//! - [`tls`]: the tonic connector that opens TCP, then TLS over rustls, and the TLS handshake
//!   it shares with plain HTTP clients of a member.
//! - [`set`]: the [`EndpointSet`]: one lazily connected channel per endpoint, one of them
//!   current, and the failover rule that picks the next one ([`Pick`]).
//!
//! This crate is *not* a KV client: it knows no etcd service, holds no retry policy of its own
//! (which failures move to another endpoint is the caller's decision), logs nothing (the
//! callers keep their own messages), reads no flags and links no server crate.

#![deny(missing_docs)]

pub mod endpoint;
pub mod error;
pub mod set;
pub mod tls;

pub use endpoint::{DialOptions, Target};
pub use error::{Error, Result};
pub use set::{EndpointSet, Pick};
