//! A member that has taken snapshots (`--snapshot-count 50`, 220 puts): the WAL is read from
//! the newest snapshot, whose data is the v2 store's JSON with the membership.
//!
//! etcd 3.4 snapshots when more than `--snapshot-count` entries were applied since the last
//! one: with 4 entries before the first put (the bootstrap ConfChange, the leader's no-op,
//! the publish and the cluster version), 200 puts would end exactly on a snapshot (index
//! 204) and leave no entries after it; 220 leave some (and the one or few v2 `QGET`s of the
//! readiness probe, HTTP `/health`, only move the end further from the next snapshot at 255).

use etcdrs_etcddir::request::{Payload, decode_entry};
use etcdrs_etcddir::v2store::V2Store;

use crate::harness::{reported_ids, start_etcd};

#[tokio::test]
async fn snapshot_and_entries_after_it() {
    let mut etcd = start_etcd(&[("snapshot-count", "50")]).await;
    let ctl = etcd.etcdctl();
    for n in 0..220 {
        ctl.ok(&["put", &format!("key-{n:03}"), "value"]).await;
    }
    let reported = reported_ids(&etcd).await;
    let client_url = etcd.endpoint();
    let peer_url = etcd.peer_url();
    etcd.stop().await.expect("stop etcd");

    let snap_files: Vec<_> = std::fs::read_dir(etcd.data_dir().join("member/snap"))
        .expect("list member/snap")
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().ends_with(".snap"))
        .collect();
    assert!(!snap_files.is_empty(), "etcd wrote .snap files");

    let member = etcdrs_etcddir::read(etcd.data_dir()).expect("read the data directory");
    assert_eq!(
        (member.node_id, member.cluster_id),
        (reported.member_id, reported.cluster_id)
    );
    let snapshot = member.snapshot.as_ref().expect("a snapshot");
    assert!(snapshot.index > 0);
    assert_eq!(member.wal_snapshot, (snapshot.index, snapshot.term));
    assert!(member.skipped_snapshots.is_empty());
    // The newest file is the one chosen (its name is term-index).
    let newest = snap_files
        .iter()
        .map(|e| e.file_name())
        .max()
        .expect("a name");
    assert!(snapshot.path.ends_with(&newest));
    assert_eq!(
        newest.to_string_lossy(),
        format!("{:016x}-{:016x}.snap", snapshot.term, snapshot.index)
    );
    assert_eq!(snapshot.conf_state.voters, [member.node_id]);
    assert!(snapshot.index <= member.hard_state.commit);

    // The data is the v2 store's JSON, holding the membership and the cluster version.
    let store = V2Store::parse(&snapshot.data).expect("v2 store JSON");
    let members = store.members().expect("members");
    assert_eq!(members.len(), 1);
    assert_eq!(members[0].id, member.node_id);
    assert_eq!(members[0].name, "m1");
    assert_eq!(members[0].peer_urls, [peer_url]);
    assert_eq!(members[0].client_urls, [client_url]);
    assert_eq!(member.version.as_deref(), Some("3.4.0"));
    assert_eq!(member.cluster_version().as_deref(), Some("3.4.0"));
    let v2 = member
        .v2_members(member.hard_state.commit)
        .expect("v2 members");
    assert_eq!(v2.values().cloned().collect::<Vec<_>>(), members);

    // Entries start right after the snapshot and run consecutively.
    let first = member.entries.first().expect("entries after the snapshot");
    assert_eq!(first.index, snapshot.index + 1);
    for pair in member.entries.windows(2) {
        assert_eq!(pair[1].index, pair[0].index + 1);
    }
    let last_key = member
        .entries
        .iter()
        .rev()
        .find_map(|entry| match decode_entry(&entry.data) {
            Ok(Payload::V3(v3)) => v3.put.map(|put| put.key),
            _ => None,
        });
    assert_eq!(last_key.as_deref(), Some(&b"key-219"[..]));
}
