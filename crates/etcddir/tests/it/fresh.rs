//! A fresh single member: the WAL holds everything etcd ever did (no snapshot yet).

use etcdrs_etcddir::request::{
    ConfChangeType, Payload, decode_conf_change, decode_conf_change_member, decode_entry,
};
use raft::eraftpb::EntryType;

use crate::harness::{ctl_json, reported_ids, start_etcd};

#[tokio::test]
async fn fresh_member_reads_back() {
    let mut etcd = start_etcd(&[]).await;
    let ctl = etcd.etcdctl();
    for n in 1..=3 {
        ctl.ok(&["put", &format!("k{n}"), &format!("v{n}")]).await;
    }
    let lease = ctl_json(&etcd, &["lease", "grant", "600"]).await;
    let lease_id = lease["ID"].as_i64().expect("lease id");
    ctl.ok(&["put", "leased", "v", "--lease", &format!("{lease_id:x}")])
        .await;
    ctl.ok(&["user", "add", "root:pw"]).await;
    ctl.ok(&["put", "last", "v"]).await;
    let reported = reported_ids(&etcd).await;
    let peer_url = etcd.peer_url();
    let client_url = etcd.endpoint();
    etcd.stop().await.expect("stop etcd");

    let member = etcdrs_etcddir::read(etcd.data_dir()).expect("read the data directory");
    assert_eq!(member.node_id, reported.member_id);
    assert_eq!(member.cluster_id, reported.cluster_id);
    assert!(member.snapshot.is_none());
    assert_eq!(member.wal_snapshot, (0, 0));
    assert_eq!(member.version, None);
    assert!(member.torn_tail.is_none());
    assert!(member.db_path.ends_with("member/snap/db") && member.db_path.is_file());

    // Entries are consecutive from index 1.
    for (n, entry) in member.entries.iter().enumerate() {
        assert_eq!(entry.index, n as u64 + 1);
    }

    // The bootstrap: one ConfChange AddNode at index 1, term 1, with the member's JSON.
    let first = &member.entries[0];
    assert_eq!(first.get_entry_type(), EntryType::EntryConfChange);
    assert_eq!((first.index, first.term), (1, 1));
    let change = decode_conf_change(&first.data).expect("a raftpb.ConfChange");
    assert_eq!(change.r#type(), ConfChangeType::ConfChangeAddNode);
    assert_eq!(change.node_id, member.node_id);
    let joined = decode_conf_change_member(&change.context).expect("member JSON");
    assert_eq!(joined.id, member.node_id);
    assert_eq!(joined.peer_urls, [peer_url]);
    assert_eq!(joined.name, "m1");
    assert!(!joined.is_learner);

    // Then, before any client request: the new leader's empty entry (term 2), the v2
    // publish of the member's attributes, and the v2 cluster version. The testkit's readiness
    // probe (HTTP `/health`, a v2 `QGET` through raft in etcd 3.4) may land among them.
    let kinds: Vec<_> = member.entries[1..]
        .iter()
        .filter(|entry| !is_health_probe(entry))
        .take(3)
        .map(|entry| match decode_entry(&entry.data) {
            Ok(Payload::Noop) => format!("noop@{}", entry.term),
            Ok(Payload::V2(v2)) => format!("{} {}", v2.method, v2.path),
            other => format!("{other:?}"),
        })
        .collect();
    assert_eq!(
        kinds,
        [
            "noop@2".to_string(),
            format!("PUT /0/members/{:x}/attributes", member.node_id),
            "PUT /0/version".to_string()
        ]
    );

    let mut v2_paths = Vec::new();
    let mut put_keys = Vec::new();
    let mut last_put_index = 0;
    let mut leased_put = None;
    let mut lease_grant = None;
    let mut user_add = None;
    let mut noops = 0;
    let mut health_probes = 0;
    for entry in member
        .entries
        .iter()
        .filter(|e| e.get_entry_type() == EntryType::EntryNormal)
    {
        match decode_entry(&entry.data).expect("a payload") {
            Payload::Noop => noops += 1,
            Payload::V2(v2) if v2.method == "QGET" => {
                assert_eq!((v2.path.as_str(), v2.val.as_str()), ("", ""));
                health_probes += 1;
            }
            Payload::V2(v2) => {
                if v2.path == format!("/0/members/{:x}/attributes", member.node_id) {
                    let attributes: serde_json::Value =
                        serde_json::from_str(&v2.val).expect("attributes JSON");
                    assert_eq!(attributes["name"], "m1");
                    assert_eq!(attributes["clientURLs"][0], client_url.as_str());
                }
                if v2.path == "/0/version" {
                    assert_eq!(v2.val, "3.4.0");
                }
                assert_eq!(v2.method, "PUT");
                v2_paths.push(v2.path);
            }
            Payload::V3(v3) => {
                if let Some(put) = &v3.put {
                    put_keys.push(String::from_utf8(put.key.clone()).expect("UTF-8 key"));
                    last_put_index = entry.index;
                    if put.key == b"leased" {
                        leased_put = Some(put.lease);
                    }
                }
                if let Some(grant) = &v3.lease_grant {
                    lease_grant = Some((grant.id, grant.ttl));
                }
                if let Some(add) = &v3.auth_user_add {
                    user_add = Some((add.name.clone(), add.password.clone()));
                }
            }
        }
    }
    assert_eq!(noops, 1, "one leader no-op after the election");
    assert!(
        health_probes >= 1,
        "the member answered /health before it was used"
    );
    assert_eq!(
        v2_paths,
        [
            format!("/0/members/{:x}/attributes", member.node_id),
            "/0/version".to_string()
        ]
    );
    assert_eq!(put_keys, ["k1", "k2", "k3", "leased", "last"]);
    assert_eq!(leased_put, Some(lease_id));
    assert_eq!(lease_grant, Some((lease_id, 600)));
    assert_eq!(user_add, Some(("root".to_string(), "pw".to_string())));
    assert!(member.hard_state.commit >= last_put_index);
    assert_eq!(member.hard_state.vote, member.node_id);
    assert_eq!(member.cluster_version().as_deref(), Some("3.4.0"));
    // The v2 store's membership, from the bootstrap change and the publish; before the
    // publish the member has no client URL yet.
    let v2 = member
        .v2_members(member.hard_state.commit)
        .expect("v2 members");
    let m1 = &v2[&member.node_id];
    assert_eq!(
        (m1.name.as_str(), m1.client_urls.as_slice()),
        ("m1", &[client_url.clone()][..])
    );
    assert!(!m1.is_learner);
    let before_publish = member.v2_members(1).expect("v2 members");
    assert!(before_publish[&member.node_id].client_urls.is_empty());
}

/// A v2 `QGET`: what etcd 3.4's HTTP `/health` proposes (the testkit's readiness probe).
fn is_health_probe(entry: &raft::eraftpb::Entry) -> bool {
    matches!(decode_entry(&entry.data), Ok(Payload::V2(v2)) if v2.method == "QGET")
}
