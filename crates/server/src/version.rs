//! Version strings this server reports: the etcd release it is compatible with (what
//! `etcdctl endpoint status`, `/version` and `--version` show) and the cluster version.

/// The etcd server version etcd-rs reports. Clients gate features on it, so it names the etcd
/// release whose API etcd-rs implements.
pub const SERVER_VERSION: &str = "3.5.17";

/// The cluster version (major.minor.0), as etcd publishes it once all members agree.
pub const CLUSTER_VERSION: &str = "3.5.0";

/// etcd-rs' own version (the crate version), shown beside etcd's in `--version`.
pub const ETCDRS_VERSION: &str = env!("CARGO_PKG_VERSION");
