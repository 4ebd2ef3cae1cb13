//! The keys of our buckets that the server names: the member's ids and versions in `meta`, the
//! auth store's records in `auth`, and the alarms in `alarm`. The MVCC store's own `meta` keys
//! (consistent index, term, compaction, conf state) are `etcdrs_mvcc`'s.

/// This member's id (etcd keeps it in its WAL only).
pub const META_MEMBER_ID: &[u8] = b"memberID";
/// The cluster's id (etcd keeps it in its WAL only).
pub const META_CLUSTER_ID: &[u8] = b"clusterID";
/// The cluster version last applied (etcd keeps it in its `cluster` bucket); absent until the
/// first leader decides it.
pub const META_CLUSTER_VERSION: &[u8] = b"clusterVersion";
/// A downgrade under way: etcd's `DowngradeInfo` JSON (etcd 3.5 keeps it in its `cluster`
/// bucket under `downgrade`); absent or disabled when there is none.
pub const META_DOWNGRADE: &[u8] = b"downgrade";

/// `auth`: whether auth is enabled (one byte).
pub const AUTH_ENABLED: &[u8] = b"enabled";
/// `auth`: the auth revision (8 bytes, big-endian).
pub const AUTH_REVISION: &[u8] = b"revision";
/// `auth`: prefix of a user's record (`authpb.User`), followed by its name.
pub const AUTH_USER_PREFIX: &[u8] = b"user/";
/// `auth`: prefix of a role's record (`authpb.Role`), followed by its name.
pub const AUTH_ROLE_PREFIX: &[u8] = b"role/";

/// The v2 path under which etcd-rs records a downgrade while the cluster version is below 3.6.
///
/// etcd 3.5 proposes `downgrade_info_set`, which etcd 3.4's applier cannot apply (it panics on
/// an `InternalRaftRequest` with none of its fields), and etcd 3.5 never lowers a cluster to
/// 3.4. etcd-rs does (a downgrade to 3.4 lets etcd 3.4 members join), so its record of the
/// downgrade must be an entry that etcd 3.4 members, which join afterwards and may replay it,
/// apply harmlessly: a plain v2 `PUT` into the v2 store's membership directory, next to
/// `/0/version`, which etcd 3.4 and 3.5 store and otherwise ignore.
pub const DOWNGRADE_PATH: &str = "/0/downgrade";

/// `alarm`: the key of one member's alarm, member id then alarm type, both big-endian.
pub fn alarm_key(member_id: u64, alarm: i32) -> Vec<u8> {
    let mut key = member_id.to_be_bytes().to_vec();
    key.extend_from_slice(&alarm.to_be_bytes());
    key
}
