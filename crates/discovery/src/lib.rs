//! Finding etcd endpoints: DNS SRV lookups with etcd's rules (shared by member bootstrap, the L4
//! gateway and the gRPC proxy) and cluster bootstrap through a discovery service (v2 and v3
//! protocols).
//!
//! Owns name resolution and the discovery protocols; it knows nothing of Raft or the store.
pub mod srv;
