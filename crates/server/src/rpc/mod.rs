//! The gRPC services (etcd `server/etcdserver/api/v3rpc`): thin adapters that validate a
//! request, hand it to [`EtcdServer`](crate::EtcdServer) and fill the response header.

pub mod cluster;
pub mod election;
pub mod kv;
pub mod lease;
pub mod lock;
pub mod maintenance;
pub mod status;
pub mod watch;

use crate::EtcdServer;

/// Shared by every service.
#[derive(Clone)]
pub struct Rpc {
    pub(crate) server: EtcdServer,
}

impl Rpc {
    /// The services over `server`.
    pub fn new(server: EtcdServer) -> Self {
        Rpc { server }
    }
}
