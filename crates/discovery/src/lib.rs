//! Finding etcd endpoints: DNS SRV lookups with etcd's rules (shared by member bootstrap, the L4
//! gateway and the gRPC proxy) and cluster bootstrap through a discovery service (v2 and v3
//! protocols).
//!
//! Owns name resolution and the discovery protocols; it knows nothing of Raft or the store.
//!
//! | module | what |
//! |---|---|
//! | [`srv`] | SRV lookups with etcd's naming rules (`_etcd-server[-ssl]`, `_etcd-client[-ssl]`) |
//! | [`srv_cluster`] | DNS SRV bootstrap of a member: the initial cluster from `_etcd-server*` |
//! | [`v3`] | etcd 3.6's v3 discovery: a registry in another cluster's v3 keyspace, over gRPC |
//! | [`v2`] | etcd's v2 discovery: a registry in a v2 keys API, over HTTP (`--discovery <url>`) |
//! | [`registry`] | what both protocols share: ordering, "cluster is full", the cluster string |
//! | [`tls`] | client TLS towards a discovery service |
//! | [`error`] | the protocols' errors, with etcd's texts |
//!
//! The discovery protocols (`registry`, `tls`, `v2`, `v3`) come with the `registry` feature, on
//! by default. Without it the crate is the SRV lookups alone and links no HTTP or gRPC crate:
//! the L4 gateway uses it so.

pub mod error;
#[cfg(feature = "registry")]
pub mod registry;
pub mod srv;
pub mod srv_cluster;
#[cfg(feature = "registry")]
pub mod tls;
#[cfg(feature = "registry")]
pub mod v2;
#[cfg(feature = "registry")]
pub mod v3;

/// Fuzz dictionary tokens of what both discovery protocols read from the service: the
/// `name=url,...` cluster string of a registered member.
#[cfg(all(test, feature = "registry"))]
pub(crate) const CLUSTER_STRING_TOKENS: &[&[u8]] =
    &[b"=http://", b"=unix://", b"://[", b"]:", b",", b"%"];
