//! `etcd grpc-proxy start`: the L7 proxy that serves etcd's v3 API in front of a cluster, with
//! watch and lease coalescing, a range cache that is never stale, namespaces and self-registration.
//!
//! Owns the proxy's services and their coalescing state; it talks to the cluster only as a client.
