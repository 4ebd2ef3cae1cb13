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
//! Both publish the member with the same v2 request (etcd 3.5 does too; `cluster_member_attr_set`
//! waits for 3.6, since etcd 3.4 panics on it, which the second test below found), and both set
//! the cluster version with a v2 `PUT /0/version` (3.4.0 and 3.5.0). Where the two differ:
//! etcd 3.4 proposes v2 reads and `SYNC` requests (its v2 store's TTL sweep), which etcd-rs,
//! keeping no v2 store, does not.
//!
//! And the other way: etcd 3.4 started on etcd-rs's entries (copied into a WAL in etcd's
//! format, the only thing in an otherwise empty data directory) replays them into its own
//! store and comes up as the same member of the same cluster, with the same keys, revision,
//! auth role and membership.
//!
//! And the rules by which entries apply: a committed membership change that etcd refuses
//! (etcd's `ValidateConfigurationChange`) is refused by etcd-rs too, the same crafted log leaving
//! the same members under both.
//!
//! Skipped when the suite runs against etcd itself (`ETCDRS_TEST_ETCD_BIN`).

use std::path::Path;

use etcdrs_etcddir::request::{self as etcd, Payload};
use etcdrs_raftnode::confchange::{ChangeKind, EtcdConfChange};
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
    ctl.ok(&["put", "k2", "v2"]).await;
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
    /// Its v2 request, with the request id set aside.
    publish: Vec<u8>,
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
                        let mut normalized = v2.clone();
                        normalized.id = 0;
                        log.publish = normalized.encode_to_vec();
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
    assert_eq!(
        mine.publish, theirs.publish,
        "the same publish request, byte for byte"
    );
    assert_eq!(theirs.cluster_version.as_deref(), Some("3.4.0"));
    // Each leader sets its cluster version with the same v2 request: etcd 3.4's own, and
    // etcd-rs's, whose members alone run at 3.5.
    assert_eq!(mine.cluster_version.as_deref(), Some("3.5.0"));
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
    assert_eq!(theirs.requests.len(), 9, "{:#?}", show(&theirs));
}

/// etcd's `walpb.Record`.
#[derive(Clone, PartialEq, prost::Message)]
struct WalRecord {
    #[prost(int64, tag = "1")]
    r#type: i64,
    #[prost(uint32, tag = "2")]
    crc: u32,
    #[prost(bytes = "vec", tag = "3")]
    data: Vec<u8>,
}

/// etcd's WAL record types (`wal.go`).
const METADATA: i64 = 1;
const ENTRY: i64 = 2;
const STATE: i64 = 3;
const CRC: i64 = 4;
const SNAPSHOT: i64 = 5;

fn put_varint(out: &mut Vec<u8>, mut value: u64) {
    while value >= 0x80 {
        out.push((value as u8) | 0x80);
        value >>= 7;
    }
    out.push(value as u8);
}

/// A message of varint fields, every one written (gogoproto's non-nullable fields).
fn varints(fields: &[(u8, u64)]) -> Vec<u8> {
    let mut out = Vec::new();
    for (field, value) in fields {
        out.push(field << 3);
        put_varint(&mut out, *value);
    }
    out
}

/// One segment of etcd's WAL holding `entries`, framed as etcd's encoder frames records: a
/// little-endian length word (padding flagged in its top byte), the record, padding to 8 bytes,
/// and a CRC-32C rolled over every record's data.
fn etcd_wal_segment(member_id: u64, cluster_id: u64, entries: &[Entry]) -> Vec<u8> {
    let mut bytes = Vec::new();
    let mut crc = 0u32;
    let mut record = |r#type: i64, data: Vec<u8>| {
        if r#type != CRC {
            crc = etcdrs_crc32c::update(crc, &data);
        }
        let encoded = WalRecord { r#type, crc, data }.encode_to_vec();
        let pad = (8 - encoded.len() % 8) % 8;
        let mut word = encoded.len() as u64;
        if pad != 0 {
            word |= (0x80 | pad as u64) << 56;
        }
        bytes.extend_from_slice(&word.to_le_bytes());
        bytes.extend_from_slice(&encoded);
        bytes.extend(std::iter::repeat_n(0u8, pad));
    };
    record(CRC, Vec::new());
    // etcdserverpb.Metadata{NodeID, ClusterID}.
    record(METADATA, varints(&[(1, member_id), (2, cluster_id)]));
    // walpb.Snapshot{Index: 0, Term: 0}: the log starts at the beginning.
    record(SNAPSHOT, varints(&[(1, 0), (2, 0)]));
    for entry in entries {
        // raftpb.Entry{Type, Term, Index, Data}.
        let mut data = varints(&[
            (1, entry.entry_type as u64),
            (2, entry.term),
            (3, entry.index),
        ]);
        data.push(0x22);
        put_varint(&mut data, entry.data.len() as u64);
        data.extend_from_slice(&entry.data);
        record(ENTRY, data);
    }
    let last = entries.last().expect("a log with entries");
    // raftpb.HardState{Term, Vote, Commit}: everything committed, the member voted for itself.
    record(
        STATE,
        varints(&[(1, last.term), (2, member_id), (3, last.index)]),
    );
    bytes
}

#[tokio::test]
async fn etcd_34_applies_the_entries_etcd_rs_writes() {
    if !ours() {
        return;
    }
    let mut m = Member::start(MemberOpts::new(&our_bin()))
        .await
        .expect("etcd-rs starts");
    make_requests(&m).await;
    let status = |m: &Member| {
        let ctl = m.etcdctl();
        async move {
            let json: serde_json::Value =
                serde_json::from_str(&ctl.ok(&["endpoint", "status", "-w", "json"]).await)
                    .expect("status json");
            let header = json[0]["Status"]["header"].clone();
            (
                header["cluster_id"].as_u64().expect("cluster id"),
                header["member_id"].as_u64().expect("member id"),
                header["revision"].as_i64().expect("revision"),
            )
        }
    };
    let (cluster_id, member_id, revision) = status(&m).await;
    m.stop().await.expect("etcd-rs stops");
    let mut entries = our_log(m.data_dir());
    assert_eq!(entries.first().map(|e| e.index), Some(1), "the whole log");
    // A member alone runs its cluster at 3.5, which etcd 3.4 refuses to replay ("cluster
    // cannot be downgraded"), as it refuses an etcd 3.5 log: the version entry becomes the
    // one an etcd-rs member of a 3.4 cluster applies, the same v2 `PUT` with 3.4.0.
    let mut versions = 0;
    for entry in &mut entries {
        if entry.get_entry_type() == EntryType::EntryNormal
            && let Ok(Payload::V2(mut v2)) = etcd::decode_entry(&entry.data)
            && v2.path == "/0/version"
        {
            assert_eq!(v2.val, "3.5.0");
            v2.val = "3.4.0".into();
            entry.data = v2.encode_to_vec().into();
            versions += 1;
        }
    }
    assert_eq!(versions, 1, "etcd-rs set the cluster version once");

    std::fs::remove_dir_all(m.data_dir()).expect("clear the data dir");
    let wal_dir = m.data_dir().join("member").join("wal");
    std::fs::create_dir_all(&wal_dir).expect("create etcd's WAL dir");
    std::fs::write(
        wal_dir.join("0000000000000000-0000000000000000.wal"),
        etcd_wal_segment(member_id, cluster_id, &entries),
    )
    .expect("write etcd's WAL");
    m.set_bin(&etcd34());
    m.restart()
        .await
        .unwrap_or_else(|e| panic!("etcd 3.4 starts on etcd-rs's log: {e}"));

    assert_eq!(status(&m).await, (cluster_id, member_id, revision));
    let ctl = m.etcdctl();
    assert_eq!(
        ctl.ok(&["get", "k2", "--print-value-only"]).await.trim(),
        "v2"
    );
    assert_eq!(ctl.ok(&["get", "k"]).await.trim(), "");
    assert_eq!(ctl.ok(&["role", "list"]).await.trim(), "r1");
    let members: serde_json::Value =
        serde_json::from_str(&ctl.ok(&["member", "list", "-w", "json"]).await)
            .expect("member list json");
    let members = members["members"].as_array().expect("members").clone();
    assert_eq!(members.len(), 1, "the learner came and went: {members:?}");
    assert_eq!(members[0]["ID"].as_u64(), Some(member_id));
    assert_eq!(members[0]["name"].as_str(), Some(m.name()));
    let log = m.log();
    assert!(!log.contains("panic"), "{}", m.log_tail(40));
}

/// `(id, peer URLs, is learner)` of every member `member list` shows.
async fn member_list(m: &Member) -> Vec<(u64, Vec<String>, bool)> {
    let json: serde_json::Value =
        serde_json::from_str(&m.etcdctl().ok(&["member", "list", "-w", "json"]).await)
            .expect("member list json");
    let mut members: Vec<(u64, Vec<String>, bool)> = json["members"]
        .as_array()
        .expect("members")
        .iter()
        .map(|m| {
            let urls = m["peerURLs"]
                .as_array()
                .map(|urls| {
                    urls.iter()
                        .filter_map(|u| u.as_str().map(str::to_owned))
                        .collect()
                })
                .unwrap_or_default();
            (
                m["ID"].as_u64().expect("member id"),
                urls,
                m["isLearner"].as_bool().unwrap_or(false),
            )
        })
        .collect();
    members.sort();
    members
}

/// A committed membership change that etcd refuses when it applies it (here a second member
/// with a peer URL another member has, as two concurrent `member add`s can commit) takes no
/// effect under etcd-rs either: the same log, given to etcd 3.4 and to etcd-rs, leaves the
/// same members. The log is etcd 3.4's own, with two changes appended that etcd had not
/// applied when it stopped (so etcd-rs's conversion applies them, and etcd applies them when
/// it starts on its untouched files).
#[tokio::test]
async fn a_conflicting_membership_change_is_refused_as_etcd_refuses_it() {
    if !ours() {
        return;
    }
    let mut m = Member::start(MemberOpts::new(&etcd34()))
        .await
        .expect("etcd 3.4 starts");
    m.etcdctl().ok(&["put", "k", "v"]).await;
    m.stop().await.expect("etcd 3.4 stops");
    let member = etcdrs_etcddir::read(m.data_dir()).expect("etcd's WAL");
    let mut entries = member.entries.clone();
    assert_eq!(entries.first().map(|e| e.index), Some(1), "the whole log");
    let last = entries.last().expect("entries").clone();
    let url = "http://127.0.0.1:1".to_string();
    for (offset, (id, kind, is_learner)) in [
        (0x1111u64, ChangeKind::AddLearnerNode, true),
        (0x2222u64, ChangeKind::AddNode, false),
    ]
    .into_iter()
    .enumerate()
    {
        let context = serde_json::to_vec(&etcdrs_proto::raft_internal::Member {
            id,
            peer_urls: vec![url.clone()],
            is_learner,
            ..Default::default()
        })
        .expect("member JSON");
        let change = EtcdConfChange {
            id: 77 + offset as u64,
            kind,
            node_id: id,
            context: Some(context),
        };
        let mut entry = Entry::default();
        entry.set_entry_type(EntryType::EntryConfChange);
        entry.term = last.term;
        entry.index = last.index + 1 + offset as u64;
        entry.data = change.encode().into();
        entries.push(entry);
    }
    let wal_dir = m.data_dir().join("member").join("wal");
    std::fs::remove_dir_all(&wal_dir).expect("replace etcd's WAL");
    std::fs::create_dir_all(&wal_dir).expect("replace etcd's WAL");
    std::fs::write(
        wal_dir.join("0000000000000000-0000000000000000.wal"),
        etcd_wal_segment(member.node_id, member.cluster_id, &entries),
    )
    .expect("write etcd's WAL");

    m.set_bin(&our_bin());
    m.restart().await.expect("etcd-rs converts and starts");
    let ours_members = member_list(&m).await;
    m.stop().await.expect("etcd-rs stops");
    // etcd-rs wrote only under `etcd-rs/`: etcd starts on its own files as crafted.
    std::fs::remove_dir_all(m.data_dir().join("etcd-rs")).expect("drop etcd-rs's storage");
    m.set_bin(&etcd34());
    m.restart().await.expect("etcd 3.4 starts");
    let etcd_members = member_list(&m).await;

    assert_eq!(ours_members, etcd_members);
    assert_eq!(ours_members.len(), 2, "{ours_members:?}");
    assert!(
        ours_members
            .iter()
            .any(|(id, _, learner)| *id == 0x1111 && *learner),
        "the learner is added: {ours_members:?}"
    );
    assert!(
        ours_members.iter().all(|(id, _, _)| *id != 0x2222),
        "the second member with its peer URL is refused: {ours_members:?}"
    );
}
