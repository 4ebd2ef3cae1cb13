//! Members and cluster identity (etcd `server/etcdserver/api/membership`).
//!
//! Ids are derived as etcd derives them, so a member started with the same flags as an etcd
//! member gets the same member and cluster ids: a member id is the first 8 bytes (big-endian)
//! of the SHA-1 of its sorted peer URLs concatenated with the cluster token; a cluster id is
//! the same over the sorted member ids.

use sha1::{Digest, Sha1};

/// One member of the cluster (etcd's `membership.Member`), stored as its JSON in the `members`
/// bucket, as etcd stores it, and carried in the context of its raft `AddNode` change.
pub use etcdrs_proto::raft_internal::Member;

fn first_u64(digest: &[u8]) -> u64 {
    let mut bytes = [0u8; 8];
    bytes.copy_from_slice(&digest[..8]);
    u64::from_be_bytes(bytes)
}

/// The id etcd gives a member of a new cluster.
pub fn member_id(peer_urls: &[String], cluster_token: &str) -> u64 {
    let mut urls = peer_urls.to_vec();
    urls.sort();
    let mut hasher = Sha1::new();
    hasher.update(urls.concat().as_bytes());
    hasher.update(cluster_token.as_bytes());
    first_u64(&hasher.finalize())
}

/// The cluster id etcd derives from its initial members.
pub fn cluster_id(member_ids: &[u64]) -> u64 {
    let mut ids = member_ids.to_vec();
    ids.sort_unstable();
    let mut hasher = Sha1::new();
    for id in ids {
        hasher.update(id.to_be_bytes());
    }
    first_u64(&hasher.finalize())
}

/// Render an id as etcd prints it: lower-case hex without leading zeros.
pub fn id_hex(id: u64) -> String {
    format!("{id:x}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_match_etcd_defaults() {
        // etcd with no flags: member 8e9e05c52164694d in cluster cdf818194e3a8c32.
        let id = member_id(&["http://localhost:2380".to_string()], "etcd-cluster");
        assert_eq!(id_hex(id), "8e9e05c52164694d");
        assert_eq!(id_hex(cluster_id(&[id])), "cdf818194e3a8c32");
    }
}
