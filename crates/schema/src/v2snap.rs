//! The `Data` of a raft snapshot as etcd 3.4 members need it: the v2 store's JSON (etcd's
//! `store.Save`), from which etcd 3.4 recovers the membership (`/0/members/<id>/…`,
//! `/0/removed_members/<id>`) and the cluster version (`/0/version`) when it installs a
//! snapshot. etcd-rs keeps no v2 store of its own: the JSON is made from the backend's
//! `members` and `members_removed` buckets and the applied cluster version when a snapshot
//! goes to a peer, and ignored when one comes in (our membership is in the backend image).
//!
//! Only the fields etcd's decoder sets are written (`Root`, `CurrentIndex`,
//! `CurrentVersion`): the watcher hub and the stats of the receiving store stay as they are.

use serde_json::{Map, Value, json};

use etcdrs_backend::Bucket;
use etcdrs_mvcc::KvStore;

use crate::keys::{DOWNGRADE_PATH, META_CLUSTER_VERSION, META_DOWNGRADE};
use crate::membership::Member;
use crate::version::DowngradeInfo;

/// etcd's `time.Time{}` in JSON: a node that never expires.
const NEVER: &str = "0001-01-01T00:00:00Z";

fn dir(path: &str, children: Map<String, Value>) -> Value {
    json!({
        "Path": path,
        "CreatedIndex": 0,
        "ModifiedIndex": 0,
        "ExpireTime": NEVER,
        "Value": "",
        "Children": children,
    })
}

fn file(path: &str, value: String, index: u64) -> Value {
    json!({
        "Path": path,
        "CreatedIndex": index,
        "ModifiedIndex": index,
        "ExpireTime": NEVER,
        "Value": value,
        "Children": null,
    })
}

/// The v2 store JSON of `members`, the `removed` member ids, `cluster_version` (none before
/// one is decided) and the `downgrade` record, at raft index `index`.
pub fn store_json(
    members: &[Member],
    removed: &[u64],
    cluster_version: Option<&str>,
    downgrade: Option<&str>,
    index: u64,
) -> Vec<u8> {
    let mut member_dirs = Map::new();
    for m in members {
        let id = format!("{:x}", m.id);
        let base = format!("/0/members/{id}");
        let mut raft = Map::new();
        raft.insert("peerURLs".into(), json!(m.peer_urls));
        if m.is_learner {
            raft.insert("isLearner".into(), json!(true));
        }
        let mut attrs = Map::new();
        if !m.name.is_empty() {
            attrs.insert("name".into(), json!(m.name));
        }
        if !m.client_urls.is_empty() {
            attrs.insert("clientURLs".into(), json!(m.client_urls));
        }
        let mut children = Map::new();
        children.insert(
            "raftAttributes".into(),
            file(
                &format!("{base}/raftAttributes"),
                Value::Object(raft).to_string(),
                index,
            ),
        );
        if !attrs.is_empty() {
            children.insert(
                "attributes".into(),
                file(
                    &format!("{base}/attributes"),
                    Value::Object(attrs).to_string(),
                    index,
                ),
            );
        }
        member_dirs.insert(id, dir(&base, children));
    }
    let mut removed_files = Map::new();
    for id in removed {
        let id = format!("{id:x}");
        removed_files.insert(
            id.clone(),
            file(&format!("/0/removed_members/{id}"), "removed".into(), index),
        );
    }
    let mut zero = Map::new();
    zero.insert("members".into(), dir("/0/members", member_dirs));
    zero.insert(
        "removed_members".into(),
        dir("/0/removed_members", removed_files),
    );
    if let Some(version) = cluster_version {
        zero.insert(
            "version".into(),
            file("/0/version", version.to_owned(), index),
        );
    }
    if let Some(target) = downgrade {
        let info = DowngradeInfo::new(Some(target)).encode();
        zero.insert(
            "downgrade".into(),
            file(
                DOWNGRADE_PATH,
                String::from_utf8_lossy(&info).into_owned(),
                index,
            ),
        );
    }
    let mut root = Map::new();
    root.insert("0".into(), dir("/0", zero));
    root.insert("1".into(), dir("/1", Map::new()));
    json!({
        "Root": dir("/", root),
        "CurrentIndex": index,
        "CurrentVersion": 2,
    })
    .to_string()
    .into_bytes()
}

/// [`store_json`] of what `store`'s backend holds, at raft index `index`.
pub fn from_store(store: &KvStore, index: u64) -> crate::Result<Vec<u8>> {
    let read = store.backend().read().map_err(etcdrs_mvcc::Error::from)?;
    let mut members = Vec::new();
    read.for_each_in(Bucket::MEMBERS, &[], None, |_, value| {
        if let Ok(member) = serde_json::from_slice::<Member>(value) {
            members.push(member);
        }
        true
    })
    .map_err(etcdrs_mvcc::Error::from)?;
    let mut removed = Vec::new();
    read.for_each_in(Bucket::MEMBERS_REMOVED, &[], None, |key, _| {
        if let Ok(id) = <[u8; 8]>::try_from(key) {
            removed.push(u64::from_be_bytes(id));
        }
        true
    })
    .map_err(etcdrs_mvcc::Error::from)?;
    drop(read);
    let version = store
        .meta(META_CLUSTER_VERSION)?
        .and_then(|v| String::from_utf8(v).ok());
    let downgrade = store
        .meta(META_DOWNGRADE)?
        .and_then(|v| DowngradeInfo::decode(&v));
    Ok(store_json(
        &members,
        &removed,
        version.as_deref(),
        downgrade.as_deref(),
        index,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn etcds_reader_of_the_v2_store_reads_it_back() {
        let members = vec![
            Member {
                id: 0x1a,
                peer_urls: vec!["http://127.0.0.1:2380".into()],
                is_learner: false,
                name: "a".into(),
                client_urls: vec!["http://127.0.0.1:2379".into()],
            },
            Member {
                id: 0x2b,
                peer_urls: vec!["http://127.0.0.2:2380".into()],
                is_learner: true,
                name: String::new(),
                client_urls: Vec::new(),
            },
        ];
        let data = store_json(&members, &[0x3c], Some("3.4.0"), None, 42);
        let store = etcdrs_etcddir::v2store::V2Store::parse(&data).unwrap();
        assert_eq!(store.cluster_version().as_deref(), Some("3.4.0"));
        assert_eq!(store.removed_member_ids(), vec![0x3c]);
        let mut read = store.members().unwrap();
        read.sort_by_key(|m| m.id);
        assert_eq!(read.len(), 2);
        assert_eq!(read[0].id, 0x1a);
        assert_eq!(read[0].name, "a");
        assert_eq!(read[0].peer_urls, members[0].peer_urls);
        assert_eq!(read[0].client_urls, members[0].client_urls);
        assert!(read[1].is_learner);
    }
}
