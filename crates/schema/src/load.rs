//! What a restart reads back from the backend: the membership, the removed members, the
//! alarms, and the version and downgrade records (each as the applier wrote it).

use std::collections::{BTreeMap, HashSet};

use etcdrs_backend::Bucket;
use etcdrs_mvcc::KvStore;
use etcdrs_proto::etcdserverpb::AlarmMember;
use prost::Message as _;

use crate::error::Result;
use crate::keys::{META_CLUSTER_VERSION, META_DOWNGRADE};
use crate::membership::Member;
use crate::version::DowngradeInfo;

/// An 8-byte big-endian stored number; 0 when absent or malformed.
pub fn read_u64(bytes: Option<Vec<u8>>) -> u64 {
    bytes
        .and_then(|b| <[u8; 8]>::try_from(b.as_slice()).ok())
        .map(u64::from_be_bytes)
        .unwrap_or(0)
}

/// The members in the `members` bucket, by id.
pub fn load_members(store: &KvStore) -> Result<BTreeMap<u64, Member>> {
    let read = store.backend().read().map_err(etcdrs_mvcc::Error::from)?;
    let mut members = BTreeMap::new();
    read.for_each_in(Bucket::MEMBERS, &[], None, |_, value| {
        if let Ok(member) = serde_json::from_slice::<Member>(value) {
            members.insert(member.id, member);
        }
        true
    })
    .map_err(etcdrs_mvcc::Error::from)?;
    Ok(members)
}

/// The cluster version in the backend's meta keys; `None` when none was ever applied.
pub fn load_cluster_version(store: &KvStore) -> Result<Option<String>> {
    Ok(store
        .meta(META_CLUSTER_VERSION)?
        .and_then(|v| String::from_utf8(v).ok()))
}

/// The target of the downgrade recorded in the backend's meta keys, if one is enabled.
pub fn load_downgrade(store: &KvStore) -> Result<Option<String>> {
    Ok(store
        .meta(META_DOWNGRADE)?
        .and_then(|v| DowngradeInfo::decode(&v)))
}

/// Whether etcd 3.5 members know of the recorded downgrade.
pub fn load_downgrade_known_to_etcd35(store: &KvStore) -> Result<bool> {
    Ok(store
        .meta(META_DOWNGRADE)?
        .is_some_and(|v| DowngradeInfo::decode_known_to_etcd35(&v)))
}

/// The ids in the `members_removed` bucket.
pub fn load_removed(store: &KvStore) -> Result<HashSet<u64>> {
    let read = store.backend().read().map_err(etcdrs_mvcc::Error::from)?;
    let mut removed = HashSet::new();
    read.for_each_in(Bucket::MEMBERS_REMOVED, &[], None, |key, _| {
        if let Ok(id) = <[u8; 8]>::try_from(key) {
            removed.insert(u64::from_be_bytes(id));
        }
        true
    })
    .map_err(etcdrs_mvcc::Error::from)?;
    Ok(removed)
}

/// The alarms in the `alarm` bucket.
pub fn load_alarms(store: &KvStore) -> Result<Vec<AlarmMember>> {
    let read = store.backend().read().map_err(etcdrs_mvcc::Error::from)?;
    let mut alarms = Vec::new();
    read.for_each_in(Bucket::ALARM, &[], None, |_, value| {
        if let Ok(alarm) = AlarmMember::decode(value) {
            alarms.push(alarm);
        }
        true
    })
    .map_err(etcdrs_mvcc::Error::from)?;
    Ok(alarms)
}
