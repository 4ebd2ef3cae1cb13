//! The gRPC services (etcd `server/etcdserver/api/v3rpc`): thin adapters that validate a
//! request, hand it to [`EtcdServer`](crate::EtcdServer) and fill the response header.

pub mod auth;
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

    /// Who `request` comes from, when auth is on (etcd's `AuthInfoFromCtx`): the user of its
    /// token (gRPC metadata `token`, or `authorization` as the JSON gateway passes it), else
    /// the common name of its verified client certificate.
    pub fn auth_info<T>(
        &self,
        request: &tonic::Request<T>,
    ) -> Result<Option<crate::auth::AuthInfo>, tonic::Status> {
        let metadata = request.metadata();
        let token = metadata
            .get("token")
            .or_else(|| metadata.get("authorization"))
            .and_then(|v| v.to_str().ok());
        let common_name = request
            .extensions()
            .get::<crate::http::ClientIdentity>()
            .and_then(|id| id.common_name.as_deref());
        Ok(self.server.auth().auth_info(token, common_name)?)
    }
}
