//! `etcd gateway start`: the stateless L4 TCP proxy in front of a cluster's client endpoints.
//!
//! Owns endpoint selection (round robin, health, SRV re-resolution) and byte relaying; it never
//! reads or alters the bytes it carries.
