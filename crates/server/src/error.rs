//! The server's error type: every failure a request can meet, mapped to gRPC in one place
//! (`rpc::status`).

use etcdrs_proto::rpctypes::EtcdError;

/// Errors from the server.
#[derive(Debug, thiserror::Error)]
pub enum ServerError {
    /// One of etcd's request errors, answered with its exact code and message.
    #[error("{}", .0.message)]
    Etcd(&'static EtcdError),
    /// The MVCC store refused or failed.
    #[error(transparent)]
    Mvcc(#[from] etcdrs_mvcc::Error),
    /// The raft node refused or stopped.
    #[error(transparent)]
    Raft(#[from] etcdrs_raftnode::Error),
    /// The server is stopping.
    #[error("etcdserver: server stopped")]
    Stopped,
    /// etcd's `ErrUnknownMethod` (a downgrade action it does not know): not in etcd's gRPC
    /// error table, so it reaches the client as `Unknown` with this text.
    #[error("etcdserver: unknown method")]
    UnknownMethod,
    /// A fatal storage failure.
    #[error("fatal: {0}")]
    Fatal(String),
    /// TLS settings that cannot be used (a bad file, an unknown cipher suite), with etcd's text
    /// where etcd has one.
    #[error("{0}")]
    Tls(String),
    /// An etcd database file that cannot be read or translated (`etcd_db`).
    #[error("{0}")]
    EtcdDb(String),
    /// The bbolt file codec failed.
    #[error(transparent)]
    Bolt(#[from] etcdrs_bolt::Error),
    /// A peer sent bytes that are not etcd's rafthttp framing or raftpb (etcd's text).
    #[error("{0}")]
    PeerMessage(String),
    /// A call to a peer's HTTP endpoint failed (unreachable, refused, or an answer etcd's
    /// peers would not give).
    #[error("{0}")]
    Peer(String),
    /// `--auth-token` cannot be used (etcd's "auth: invalid auth options", ...).
    #[error("{0}")]
    AuthOptions(&'static str),
}

impl From<etcdrs_backend::Error> for ServerError {
    fn from(e: etcdrs_backend::Error) -> Self {
        ServerError::Mvcc(e.into())
    }
}

impl From<etcdrs_schema::Error> for ServerError {
    fn from(e: etcdrs_schema::Error) -> Self {
        match e {
            etcdrs_schema::Error::EtcdDb(what) => ServerError::EtcdDb(what),
            etcdrs_schema::Error::Mvcc(e) => ServerError::Mvcc(e),
            etcdrs_schema::Error::Bolt(e) => ServerError::Bolt(e),
        }
    }
}

impl From<&'static EtcdError> for ServerError {
    fn from(e: &'static EtcdError) -> Self {
        ServerError::Etcd(e)
    }
}

/// The server's result type.
pub type Result<T, E = ServerError> = std::result::Result<T, E>;
