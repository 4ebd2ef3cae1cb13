//! The etcd server for one member (etcd `server/etcdserver` and `server/embed`).
//!
//! [`EtcdServer`] is the core: it proposes client writes through raft, applies committed
//! entries to the MVCC store (the only writer), answers linearizable reads after a
//! ReadIndex, and runs the lease and compaction loops. `rpc` holds the gRPC services and
//! the single place where errors become `tonic::Status`; [`http`] serves the client port.
//!
//! This is the only crate that joins raft's driver (`raftnode`, `rafthttp`) with the store
//! (`mvcc`, and `schema` for the layout of what it stores). Its modules form no import cycle
//! (`testkit::layering::modules`): `http` is on top, then the services (`rpc`, `gateway`,
//! `v2keys`), then the core (`etcd_server`), then what the core uses (`peer`'s one-off calls,
//! `convert`, `request`, `metrics`, ...).

#![deny(missing_docs)]

mod apply;
pub mod auth;
mod compactor;
pub mod config;
mod convert;
pub mod error;
mod etcd_server;
#[cfg(test)]
mod fuzz;
mod gateway;
pub mod http;
mod idgen;
pub mod metrics;
mod peer;
mod request;
mod rpc;
pub mod tls;
mod v2keys;
mod validate;

/// Members and their ids (the simulator builds its clusters' members with it).
pub use etcdrs_schema::membership;

pub use config::{AutoCompaction, ServerConfig};
pub use error::{Result, ServerError};
pub use etcd_server::{ApplyOutput, EtcdServer, StandaloneMember, corrupt, url_string};
pub use etcdrs_raftnode::task::TaskResult;
