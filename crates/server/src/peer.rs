//! The member's side of the peer port (etcd `etcdhttp/peer.go`, `lease/leasehttp`, the peer
//! `hashkv`): the transport to peers (`etcdrs_rafthttp`, which owns the raft routes and
//! links), the member it delivers to ([`PeerHost`], the server's implementation of
//! `etcdrs_rafthttp::Raft`), the peer port's other handlers ([`handlers`]) and the one-off calls
//! this member makes to its peers ([`calls`]).
//!
//! This module is where the transport meets the storage formats: a snapshot a link sends is
//! the v2 store's JSON (`v2snap`) and the database in bbolt's form (`etcd_db`); the transport
//! itself knows neither.

pub mod calls;
pub mod handlers;

use std::io::Read;
use std::sync::Arc;

use axum::Router;
use etcdrs_mvcc::KvStore;
use etcdrs_rafthttp::{PeerClient, SnapshotImage};

use crate::EtcdServer;
use crate::config::ServerConfig;
use crate::tls::TlsClient;

pub use crate::etcd_server::PeerHost;

/// The transport this member's raft sends through.
pub type PeerTransport = etcdrs_rafthttp::Transport<PeerHost>;

/// The peer client for `config`: the peer TLS (`--peer-cert-file`, ...) for `https` URLs.
pub fn peer_client(config: &ServerConfig) -> Result<PeerClient, crate::ServerError> {
    let tls = match &config.peer_tls {
        Some(info) => {
            let tls: Arc<dyn etcdrs_rafthttp::PeerTls> = TlsClient::new(info.clone())?;
            Some(tls)
        }
        None => None,
    };
    Ok(PeerClient::new(tls))
}

/// The transport's configuration for member `member_id` of `cluster_id`.
pub(crate) fn transport_config(
    config: &ServerConfig,
    member_id: u64,
    cluster_id: u64,
    client: PeerClient,
) -> etcdrs_rafthttp::Config {
    etcdrs_rafthttp::Config {
        id: member_id,
        cluster_id,
        urls: config
            .initial_advertise_peer_urls
            .iter()
            .map(crate::url_string)
            .collect(),
        server_version: etcdrs_schema::version::SERVER_VERSION,
        // A leader's database stays within its quota (the NOSPACE alarm stops writes at it),
        // so an image over twice the quota is not one.
        snapshot_limit: config.quota_bytes().saturating_mul(2),
        client,
    }
}

/// A database image being sent, kept until it is read (dropping it removes its file).
struct ImageReader {
    _image: etcdrs_backend::Snapshot,
    file: std::fs::File,
}

impl Read for ImageReader {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        self.file.read(buf)
    }
}

/// The snapshot at raft index `index` as a link sends it, in etcd's form, which an etcd member
/// installs and so do we: the v2 store's JSON as the snapshot's data, and the database in
/// bbolt's format.
pub(crate) fn snapshot_image(store: &KvStore, index: u64) -> Result<SnapshotImage, String> {
    let data = etcdrs_schema::v2snap::from_store(store, index).map_err(|e| e.to_string())?;
    let image = etcdrs_schema::etcd_db::snapshot(store.backend()).map_err(|e| e.to_string())?;
    let file = image.open().map_err(|e| e.to_string())?;
    Ok(SnapshotImage {
        data,
        body: Box::new(ImageReader {
            _image: image,
            file,
        }),
    })
}

/// The peer port's routes (etcd's peer mux), `/version` aside: the transport's raft routes
/// and the member's own.
pub fn routes(server: &EtcdServer) -> Router<EtcdServer> {
    etcdrs_rafthttp::routes(server.peer_link().clone()).merge(handlers::routes())
}
