//! The gRPC services (etcd `server/etcdserver/api/v3rpc`): thin adapters that validate a
//! request, hand it to [`EtcdServer`](crate::EtcdServer) and fill the response header.

pub mod auth;
pub mod cluster;
pub mod election;
pub mod encoded_range;
pub mod kv;
pub mod lease;
pub mod lock;
pub mod maintenance;
pub mod range_stream;
pub mod status;
pub mod watch;

use crate::EtcdServer;

/// Who is at the other end of a connection, as TLS established it: every request on the
/// connection carries it as an extension. Auth takes the user from the common name of a
/// verified client certificate, as etcd does.
#[derive(Clone, Debug, Default)]
pub struct ClientIdentity {
    /// The common name of the client certificate, when one was verified.
    pub common_name: Option<String>,
    /// The connection is TLS (etcd checks the Host header of plain-text requests only).
    pub secure: bool,
}

/// Shared by every service.
#[derive(Clone)]
pub struct Rpc {
    pub(crate) server: EtcdServer,
    /// The credentials of the client a service acts for when it calls other services itself
    /// (v3lock and v3election over KV, lease and watch, as etcd's run over a client that
    /// forwards the caller's token).
    caller: Caller,
}

/// A client's credentials: its token and its certificate's common name.
#[derive(Clone, Debug, Default)]
struct Caller {
    token: Option<String>,
    common_name: Option<String>,
}

impl Rpc {
    /// The services over `server`.
    pub fn new(server: EtcdServer) -> Self {
        Rpc {
            server,
            caller: Caller::default(),
        }
    }

    /// These services, acting with the credentials `request` carries.
    pub(crate) fn as_caller<T>(&self, request: &tonic::Request<T>) -> Rpc {
        let token = request_token(request).map(str::to_owned);
        let common_name = request
            .extensions()
            .get::<ClientIdentity>()
            .and_then(|id| id.common_name.clone());
        Rpc {
            server: self.server.clone(),
            caller: Caller { token, common_name },
        }
    }

    /// Defragment, Hash, HashKV and Snapshot need the root role. etcd's maintenance server
    /// returns the auth store's own errors there, unconverted: code Unknown and an `auth: `
    /// text (`auth: permission denied`).
    pub(crate) fn check_maintenance_admin<T>(
        &self,
        request: &tonic::Request<T>,
    ) -> Result<(), tonic::Status> {
        let checked = self
            .auth_info(request)
            .and_then(|info| Ok(self.server.auth().check_admin(info.as_ref())?));
        checked.map_err(|status| {
            let text = status.message();
            match text.strip_prefix("etcdserver: ") {
                Some(rest) if etcdrs_proto::rpctypes::from_message(text).is_some() => {
                    tonic::Status::unknown(format!("auth: {rest}"))
                }
                _ => status,
            }
        })
    }

    /// Who `request` comes from, when auth is on (etcd's `AuthInfoFromCtx`): the user of its
    /// token (gRPC metadata `token`, or `authorization` as the JSON gateway passes it), else
    /// the common name of its verified client certificate.
    pub fn auth_info<T>(
        &self,
        request: &tonic::Request<T>,
    ) -> Result<Option<crate::auth::AuthInfo>, tonic::Status> {
        let token = request_token(request).or(self.caller.token.as_deref());
        let common_name = request
            .extensions()
            .get::<ClientIdentity>()
            .and_then(|id| id.common_name.as_deref())
            .or(self.caller.common_name.as_deref());
        Ok(self.server.auth().auth_info(token, common_name)?)
    }
}

/// The auth token `request` carries: gRPC metadata `token`, or `authorization` as the JSON
/// gateway passes it.
fn request_token<T>(request: &tonic::Request<T>) -> Option<&str> {
    let headers = request.metadata().as_ref();
    headers
        .get(etcdrs_serve::names::TOKEN)
        .or_else(|| headers.get(axum::http::header::AUTHORIZATION))
        .and_then(|v| v.to_str().ok())
}
