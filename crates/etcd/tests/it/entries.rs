//! The raft log etcd-rs writes is the one etcd 3.4 writes (issue 17, mixed clusters): the same
//! member, started once with `/usr/bin/etcd` and once with ours on the same name, ports and
//! cluster token, and given the same requests, leaves the same entries in its log, byte for
//! byte once the ids that each run draws afresh (request ids, a new member's id) are set aside.
//!
//! etcd's log is read with `etcddir` (etcd's WAL format) and ours with `raftnode::read_log`;
//! every payload is decoded by etcd's apply rule (`etcddir::request::decode_entry`) and conf
//! changes with `etcddir`'s own decoder of etcd's `raftpb.ConfChange`, which is independent of
//! the encoder etcd-rs writes with (`raftnode::confchange`). Each payload is also checked to be
//! the canonical encoding of what it decodes to, so that equal decoded requests mean equal
//! bytes.
//!
//! Where the two differ on purpose: etcd 3.4 publishes its member and the cluster version as v2
//! requests, etcd-rs (whose cluster version is 3.5) as etcd 3.5 does (`cluster_member_attr_set`);
//! the test checks that both publish the same attributes. etcd also proposes v2 reads and
//! `SYNC` requests (its v2 store's TTL sweep), which etcd-rs, keeping no v2 store, does not.
//!
//! Skipped when the suite runs against etcd itself (`ETCDRS_TEST_ETCD_BIN`).

use std::path::Path;

use etcdrs_etcddir::request::{self as etcd, Payload};
use etcdrs_raftnode::eraftpb::{Entry, EntryType};
use etcdrs_testkit::{EtcdBin, Member, MemberOpts};
use prost::Message;

use crate::ours;

fn etcd34() -> EtcdBin {
    EtcdBin::at("/usr/bin/etcd")
}

fn our_bin() -> EtcdBin {
    EtcdBin::at(env!("CARGO_BIN_EXE_etcd"))
}

/// The requests both runs make: writes, a compaction, an auth role, and a learner added,
/// moved and removed (never started: a single voter keeps its quorum).
async fn make_requests(m: &Member) {
    let ctl = m.etcdctl();
    ctl.ok(&["put", "k", "v"]).await;
    ctl.ok(&["put", "k", "v3"]).await;
    ctl.ok(&["del", "k"]).await;
    ctl.ok(&["compaction", "3"]).await;
    ctl.ok(&["role", "add", "r1"]).await;
    let added = ctl
        .ok(&[
            "member",
            "add",
            "l1",
            "--learner",
            "--peer-urls=http://127.0.0.1:1",
        ])
        .await;
    // "Member 5f2c... added to cluster ..."
    let id = added
        .split_whitespace()
        .nth(1)
        .expect("member add prints the new member's id")
        .to_owned();
    ctl.ok(&["member", "update", &id, "--peer-urls=http://127.0.0.1:2"])
        .await;
    ctl.ok(&["member", "remove", &id]).await;
}

/// A member's publish: its name and client URLs.
#[derive(Debug, PartialEq)]
struct Published {
    name: String,
    client_urls: Vec<String>,
}

/// What a log says, with the run's own ids set aside.
#[derive(Debug, Default)]
struct Log {
    /// The data of the first entry, the bootstrap `AddNode` of the member itself.
    bootstrap: Vec<u8>,
    /// The member's publish.
    published: Option<Published>,
    /// The cluster version a v2 request set (etcd 3.4 only).
    cluster_version: Option<String>,
    /// Every other entry: type and normalized data.
    requests: Vec<(i32, Vec<u8>)>,
}

fn read_log(entries: &[Entry]) -> Log {
    let mut log = Log::default();
    let mut new_member_ids: Vec<u64> = Vec::new();
    for entry in entries {
        if entry.index == 1 {
            assert_eq!(entry.get_entry_type(), EntryType::EntryConfChange);
            log.bootstrap = entry.data.to_vec();
            continue;
        }
        match entry.get_entry_type() {
            EntryType::EntryNormal => match etcd::decode_entry(&entry.data).expect("decodes") {
                Payload::Noop => {}
                Payload::V2(v2) => {
                    assert_eq!(v2.encode_to_vec(), *entry.data, "canonical v2 request");
                    if v2.method != "PUT" {
                        // Reads and the leader's TTL sweep (`QGET`, `SYNC`) of a v2 store
                        // etcd-rs does not keep.
                        continue;
                    }
                    if v2.path == "/0/version" {
                        log.cluster_version = Some(v2.val);
                    } else {
                        assert!(v2.path.ends_with("/attributes"), "{v2:?}");
                        let attributes: etcdrs_proto::raft_internal::MemberAttributes =
                            serde_json::from_str(&v2.val).expect("attributes");
                        log.published = Some(Published {
                            name: attributes.name,
                            client_urls: attributes.client_urls,
                        });
                    }
                }
                Payload::V3(mut request) => {
                    assert_eq!(request.encode_to_vec(), *entry.data, "canonical request");
                    if let Some(set) = request.cluster_member_attr_set.take() {
                        let attributes = set.member_attributes.expect("attributes");
                        log.published = Some(Published {
                            name: attributes.name,
                            client_urls: attributes.client_urls,
                        });
                        continue;
                    }
                    let header = request.header.as_mut().expect("a request header");
                    assert_ne!(header.id, 0, "the request id is in the header");
                    header.id = 0;
                    log.requests
                        .push((entry.entry_type as i32, request.encode_to_vec()));
                }
            },
            EntryType::EntryConfChange => {
                let mut change = etcd::decode_conf_change(&entry.data).expect("conf change");
                assert_eq!(change.encode_to_vec(), *entry.data, "canonical conf change");
                assert_ne!(change.id, 0, "the request id is the change's");
                change.id = 0;
                if !new_member_ids.contains(&change.node_id) {
                    new_member_ids.push(change.node_id);
                }
                // The new member's id is drawn from the clock: named by its order instead.
                let order = new_member_ids
                    .iter()
                    .position(|id| *id == change.node_id)
                    .expect("just pushed") as u64;
                let context = String::from_utf8(change.context.clone()).expect("JSON");
                change.context = context
                    .replace(&change.node_id.to_string(), &format!("member-{order}"))
                    .into_bytes();
                change.node_id = order;
                log.requests
                    .push((entry.entry_type as i32, change.encode_to_vec()));
            }
            EntryType::EntryConfChangeV2 => panic!("etcd writes no ConfChangeV2"),
        }
    }
    log
}

fn our_log(data_dir: &Path) -> Vec<Entry> {
    etcdrs_raftnode::read_log(&data_dir.join("member").join("wal")).expect("our WAL")
}

#[tokio::test]
async fn raft_entries_are_the_bytes_etcd_34_writes() {
    if !ours() {
        return;
    }
    let mut m = Member::start(MemberOpts::new(&etcd34()))
        .await
        .expect("etcd 3.4 starts");
    make_requests(&m).await;
    m.stop().await.expect("etcd 3.4 stops");
    let theirs = etcdrs_etcddir::read(m.data_dir()).expect("etcd's WAL");
    let theirs = read_log(&theirs.entries);

    // The same member, new, under etcd-rs.
    std::fs::remove_dir_all(m.data_dir()).expect("clear the data dir");
    std::fs::create_dir_all(m.data_dir()).expect("clear the data dir");
    m.set_bin(&our_bin());
    m.restart().await.expect("etcd-rs starts");
    make_requests(&m).await;
    m.stop().await.expect("etcd-rs stops");
    let mine = read_log(&our_log(m.data_dir()));

    assert_eq!(
        String::from_utf8_lossy(&mine.bootstrap),
        String::from_utf8_lossy(&theirs.bootstrap)
    );
    assert_eq!(mine.bootstrap, theirs.bootstrap, "the bootstrap entry");
    assert!(theirs.published.is_some(), "etcd published its member");
    assert_eq!(mine.published, theirs.published, "the same attributes");
    assert_eq!(theirs.cluster_version.as_deref(), Some("3.4.0"));
    let show = |log: &Log| -> Vec<String> {
        log.requests
            .iter()
            .map(|(kind, data)| format!("{kind}: {}", String::from_utf8_lossy(data)))
            .collect()
    };
    assert_eq!(show(&mine), show(&theirs));
    assert_eq!(
        mine.requests, theirs.requests,
        "the requests, byte for byte"
    );
    assert_eq!(theirs.requests.len(), 8, "{:#?}", show(&theirs));
}
