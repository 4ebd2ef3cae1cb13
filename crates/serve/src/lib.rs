//! Serving clients: what the etcd server's listeners and the gRPC proxy's share.
//!
//! # Layout
//! - [`listener`]: the accept loop of a client-facing listener: TCP_NODELAY, an optional TLS
//!   handshake with a deadline, the [`h2authority`] filter, one task per connection in the
//!   loop's own set, and a graceful close with a short grace period on shutdown. What a
//!   connection then serves (hyper's settings, the router, per-connection state) is the
//!   caller's [`listener::Handler`].
//! - [`h2authority`]: accepts etcd 3.4 etcdctl's URL-shaped HTTP/2 `:authority`, which hyper
//!   rejects, by rewriting it in the bytes the client sends (HPACK from `etcdrs_hpack`).
//! - [`coalesce`]: a connection's writes gathered into fewer socket writes (hyper flushes each
//!   time a connection's task runs, once per answer when a raft batch completes many).
//! - [`keepalive`]: etcd's keep-alive enforcement (`--grpc-keepalive-min-time`): a client that
//!   pings too often gets grpc-go's `GOAWAY` (`too_many_pings`) and is disconnected.
//! - [`leader`]: etcd's require-leader contract (`hasleader` metadata) as an axum middleware
//!   over a [`leader::LeaderSource`], which the server and the proxy each implement.
//! - [`not_found`]: the fallback for unknown paths (gRPC "unimplemented" or Go's 404).
//! - [`process`]: the `process_*` series of Go's process collector, for both `/metrics`.
//! - [`unary`]: a unary gRPC call answered before any router (the request's one message read
//!   whole, the answer's body), or handed on with what was read replayed.
//! - [`names`]: the header names looked up per request, parsed at compile time.
//! - [`grpc_metrics`]: go-grpc-prometheus's `grpc_server_*` series and etcd's message byte and
//!   client request counters, counted by [`grpc_metrics::wire::CountGrpc`] around a router.
//!
//! This crate is *not* the server or the proxy: it knows no etcd service (beyond the names of
//! their methods, which label the gRPC series), no raft, no store and no flags, so the gRPC
//! proxy can serve clients without linking the server.

#![deny(missing_docs)]

pub mod coalesce;
pub mod error;
mod fallback;
pub mod grpc_metrics;
pub mod grpc_size;
pub mod h2authority;
pub mod keepalive;
pub mod leader;
pub mod listener;
pub mod names;
pub mod process;
pub mod unary;
pub mod watch_limits;

pub use error::{Error, Result};
pub use fallback::not_found;
