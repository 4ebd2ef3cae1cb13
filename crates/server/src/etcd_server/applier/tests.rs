//! The applier on its own: real entries, as raft hands them over, applied to a real store in
//! a temporary directory, with no raft node and no network. What each kind of entry changes,
//! what its proposer is told, and that a refused entry changes nothing.

use etcdrs_backend::Backend;
use etcdrs_mvcc::KvStore;
use etcdrs_mvcc::{KeyRange, RangeParams};
use etcdrs_proto::etcdserverpb::{
    AuthEnableRequest, AuthRoleAddRequest, AuthUserAddRequest, AuthUserGrantRoleRequest,
    DeleteRangeRequest, PutRequest,
};
use etcdrs_raftnode::RaftView;
use etcdrs_raftnode::eraftpb::Entry;
use etcdrs_schema::layout::Layout;
use tokio::sync::oneshot;
use tokio_util::sync::CancellationToken;

use super::*;
use crate::config::ServerConfig;
use crate::etcd_server::peer_host::{PeerTransport, transport_config};
use crate::request::PublishForm;

const LOCAL: u64 = 0x1;

/// An applier over a fresh store, and the log position it has reached.
struct Harness {
    applier: Applier,
    index: u64,
    term: u64,
    raft: RaftView,
    _dir: tempfile::TempDir,
    /// The runtime the peer transport is built in (it takes the current runtime's handle for
    /// its links); the tests themselves run no task, so they are plain tests.
    _runtime: tokio::runtime::Runtime,
}

impl Harness {
    fn new() -> Harness {
        let dir = tempfile::tempdir().expect("temp dir");
        let mut config = ServerConfig::with_defaults();
        config.data_dir = dir.path().to_path_buf();
        let layout = Layout::resolve(&config.data_dir, None);
        let backend = Backend::open(&layout.backend_path).expect("open backend");
        let store = Arc::new(KvStore::open(backend, config.min_lease_ttl()).expect("open store"));
        let runtime = tokio::runtime::Builder::new_current_thread()
            .build()
            .expect("a runtime");
        let (transport, _links) = {
            let _entered = runtime.enter();
            PeerTransport::new(
                transport_config(&config, LOCAL, 0x2, etcdrs_rafthttp::PeerClient::new(None)),
                CancellationToken::new(),
            )
        };
        let inner = Inner::load(config, layout, LOCAL, 0x2, store, transport).expect("load state");
        Harness {
            applier: Applier {
                inner: Arc::new(inner),
                last_leader: 0,
                unflushed: Default::default(),
            },
            index: 0,
            term: 2,
            raft: RaftView {
                is_leader: true,
                term: 2,
                leader: LOCAL,
            },
            _dir: dir,
            _runtime: runtime,
        }
    }

    fn inner(&self) -> &Inner {
        &self.applier.inner
    }

    fn entry(&mut self, entry_type: EntryType, data: Vec<u8>) -> Entry {
        self.index += 1;
        let mut entry = Entry::default();
        entry.set_entry_type(entry_type);
        entry.index = self.index;
        entry.term = self.term;
        entry.data = data.into();
        entry
    }

    /// Applies `entries` as one batch and returns what each waiting proposer was told.
    fn apply_entries(&mut self, entries: Vec<Entry>, ids: &[u64]) -> Vec<Result<ApplyOutput>> {
        let mut answers = Vec::new();
        for id in ids {
            let (done, answer) = oneshot::channel();
            self.inner().waiters.lock().insert(*id, done);
            answers.push(answer);
        }
        let applied = self
            .applier
            .apply(Apply {
                entries,
                conf_state: None,
                raft: self.raft,
            })
            .expect("apply");
        assert_eq!(applied.index, self.index);
        assert_eq!(applied.term, self.term);
        answers
            .into_iter()
            .map(|mut answer| answer.try_recv().expect("the proposer is answered"))
            .collect()
    }

    /// Applies one request as proposer `id` (under `proposer`'s identity, if any).
    fn apply_as(
        &mut self,
        id: u64,
        proposer: Option<crate::request::Proposer>,
        op: Op,
    ) -> Result<ApplyOutput> {
        let data = crate::request::encode(id, proposer.as_ref(), op, PublishForm::V3);
        let entry = self.entry(EntryType::EntryNormal, data);
        self.apply_entries(vec![entry], &[id]).remove(0)
    }

    fn apply_op(&mut self, id: u64, op: Op) -> Result<ApplyOutput> {
        self.apply_as(id, None, op)
    }

    fn conf_change(&mut self, id: u64, kind: ChangeKind, member: &Member) -> Result<ApplyOutput> {
        let context = match kind {
            ChangeKind::RemoveNode => None,
            _ => Some(
                serde_json::to_vec(&ConfigChangeContext {
                    member: member.clone(),
                    is_promote: false,
                })
                .expect("encode context"),
            ),
        };
        let change = EtcdConfChange {
            id,
            kind,
            node_id: member.id,
            context,
        };
        let entry = self.entry(EntryType::EntryConfChange, change.encode());
        self.apply_entries(vec![entry], &[id]).remove(0)
    }

    fn value(&self, key: &[u8]) -> Option<Vec<u8>> {
        let range = self
            .inner()
            .store
            .range(KeyRange { key, end: &[] }, RangeParams::default())
            .expect("range");
        range.kvs.first().map(|kv| kv.value.clone())
    }
}

fn put(key: &str, value: &str) -> Op {
    Op::Put(PutRequest {
        key: key.as_bytes().to_vec(),
        value: value.as_bytes().to_vec().into(),
        ..Default::default()
    })
}

fn etcd_error(outcome: Result<ApplyOutput>) -> &'static str {
    match outcome {
        Err(ServerError::Etcd(e)) => e.message,
        other => panic!("expected one of etcd's errors, got {other:?}"),
    }
}

fn member(id: u64, url: &str) -> Member {
    Member {
        id,
        peer_urls: vec![url.to_owned()],
        ..Default::default()
    }
}

#[test]
fn a_put_applies_once_and_answers_its_proposer() {
    let mut h = Harness::new();
    let Ok(ApplyOutput::Put(response)) = h.apply_op(7, put("k", "v")) else {
        panic!("a put answers with a PutResponse");
    };
    assert_eq!(response.header.map(|h| h.revision), Some(2));
    assert_eq!(h.value(b"k").as_deref(), Some(&b"v"[..]));
    assert_eq!(h.inner().store.consistent_index(), 1);

    // The same entry again (a replay after a restart) is skipped: no second revision, and
    // nobody waiting on it is answered twice.
    let data = crate::request::encode(7, None, put("k", "w"), PublishForm::V3);
    let mut entry = Entry::default();
    entry.set_entry_type(EntryType::EntryNormal);
    entry.index = 1;
    entry.term = h.term;
    entry.data = data.into();
    let (done, mut answer) = oneshot::channel();
    h.inner().waiters.lock().insert(8, done);
    h.applier
        .apply(Apply {
            entries: vec![entry],
            conf_state: None,
            raft: h.raft,
        })
        .expect("apply");
    assert!(answer.try_recv().is_err(), "a skipped entry answers nobody");
    assert_eq!(h.inner().store.current_rev(), 2);
    assert_eq!(h.value(b"k").as_deref(), Some(&b"v"[..]));
}

#[test]
fn the_nospace_alarm_refuses_puts_until_it_is_cleared_but_not_deletes() {
    let mut h = Harness::new();
    h.apply_op(1, put("a", "1")).expect("put");
    let alarm = |action: AlarmAction| {
        Op::Alarm(AlarmRequest {
            action: action as i32,
            member_id: LOCAL,
            alarm: AlarmType::Nospace as i32,
        })
    };
    let Ok(ApplyOutput::Alarm(raised)) = h.apply_op(2, alarm(AlarmAction::Activate)) else {
        panic!("an alarm answers with an AlarmResponse");
    };
    assert_eq!(raised.alarms.len(), 1);
    assert_eq!(
        etcd_error(h.apply_op(3, put("b", "2"))),
        "etcdserver: mvcc: database space exceeded"
    );
    assert_eq!(h.value(b"b"), None);
    let deleted = h.apply_op(
        4,
        Op::DeleteRange(DeleteRangeRequest {
            key: b"a".to_vec(),
            ..Default::default()
        }),
    );
    assert!(matches!(deleted, Ok(ApplyOutput::DeleteRange(r)) if r.deleted == 1));
    h.apply_op(5, alarm(AlarmAction::Deactivate))
        .expect("clear the alarm");
    h.apply_op(6, put("b", "2")).expect("put after the alarm");
    assert_eq!(h.value(b"b").as_deref(), Some(&b"2"[..]));
}

#[test]
fn membership_changes_that_lost_a_race_change_nothing() {
    let mut h = Harness::new();
    let m = member(0x10, "http://127.0.0.1:2480");
    assert!(matches!(
        h.conf_change(1, ChangeKind::AddNode, &m),
        Ok(ApplyOutput::MembersChanged)
    ));
    assert!(h.inner().members.read().contains_key(&0x10));
    assert_eq!(
        etcd_error(h.conf_change(2, ChangeKind::AddNode, &m)),
        "etcdserver: member ID already exist"
    );
    let same_url = member(0x11, "http://127.0.0.1:2480");
    assert_eq!(
        etcd_error(h.conf_change(3, ChangeKind::AddNode, &same_url)),
        "etcdserver: Peer URLs already exists"
    );
    assert_eq!(h.inner().members.read().len(), 1);
    assert!(matches!(
        h.conf_change(4, ChangeKind::RemoveNode, &m),
        Ok(ApplyOutput::MembersChanged)
    ));
    assert!(h.inner().members.read().is_empty());
    // A removed id never comes back.
    assert_eq!(
        etcd_error(h.conf_change(5, ChangeKind::AddNode, &m)),
        "etcdserver: member not found"
    );
    assert!(h.inner().members.read().is_empty());
    assert!(!h.inner().removed.load(AtomicOrdering::Acquire));
}

#[test]
fn the_lessor_follows_the_role_each_batch_carries() {
    let mut h = Harness::new();
    let lessor = h.inner().store.lessor();
    assert!(!lessor.is_primary());
    // A leader whose term's entries apply expires leases from then on.
    h.apply_op(1, put("k", "v")).expect("put");
    assert!(h.inner().store.lessor().is_primary());
    assert_eq!(h.applier.last_leader, LOCAL);
    // A member that has lost the lead (another leads a later term) stops expiring them.
    h.raft = RaftView {
        is_leader: false,
        term: 3,
        leader: 0x9,
    };
    h.apply_op(2, put("k", "w")).expect("put");
    assert!(!h.inner().store.lessor().is_primary());
    assert_eq!(h.applier.last_leader, 0x9);
    assert_eq!(h.inner().leader_changes.load(AtomicOrdering::Relaxed), 2);
}

#[test]
fn with_auth_on_a_write_needs_a_user_with_permission() {
    let mut h = Harness::new();
    h.apply_op(
        1,
        Op::UserAdd(AuthUserAddRequest {
            name: "root".into(),
            password: "secret".into(),
            ..Default::default()
        }),
    )
    .expect("add root");
    h.apply_op(
        2,
        Op::RoleAdd(AuthRoleAddRequest {
            name: "root".into(),
        }),
    )
    .expect("add the root role");
    h.apply_op(
        3,
        Op::UserGrantRole(AuthUserGrantRoleRequest {
            user: "root".into(),
            role: "root".into(),
        }),
    )
    .expect("grant root");
    h.apply_op(4, Op::AuthEnable(AuthEnableRequest {}))
        .expect("enable auth");
    assert!(h.inner().auth.is_enabled());
    let revision = h.inner().auth.revision();
    let as_user = |name: &str, auth_revision: u64| {
        Some(crate::request::Proposer {
            username: name.into(),
            auth_revision,
        })
    };
    assert_eq!(
        etcd_error(h.apply_as(5, as_user("nobody", revision), put("k", "v"))),
        "etcdserver: permission denied"
    );
    assert_eq!(
        etcd_error(h.apply_as(6, as_user("root", revision - 1), put("k", "v"))),
        "etcdserver: revision of auth store is old"
    );
    assert_eq!(h.value(b"k"), None);
    h.apply_as(7, as_user("root", revision), put("k", "v"))
        .expect("root writes");
    assert_eq!(h.value(b"k").as_deref(), Some(&b"v"[..]));
}

/// A downgrade asks for raft's log to go, and its batch commits durably so that the raft
/// node drops the log at once (a member added next gets a snapshot, never the entry that
/// raised the version).
#[test]
fn a_downgrade_commits_durably_and_asks_for_the_log_to_go() {
    let mut h = Harness::new();
    let apply = |h: &mut Harness, version: &str| {
        let data = crate::request::encode(
            0,
            None,
            Op::ClusterVersionSet(version.to_owned()),
            PublishForm::V3,
        );
        let entry = h.entry(EntryType::EntryNormal, data);
        h.applier
            .apply(Apply {
                entries: vec![entry],
                conf_state: None,
                raft: h.raft,
            })
            .expect("apply")
    };
    let raised = apply(&mut h, "3.5.0");
    assert!(!raised.compact_log);
    let lowered = apply(&mut h, "3.4.0");
    assert!(lowered.compact_log);
    assert_eq!(lowered.durable, Some((lowered.index, lowered.term)));
    assert_eq!(h.inner().cluster_version.read().as_deref(), Some("3.4.0"));
}

/// Only a follower installs a leader's snapshot: the install demotes the lessor, so a member
/// that leads again before it applies a batch is promoted afresh (restarting each lease from
/// its checkpoint) rather than keeping the clocks the install restarted at full TTL.
#[test]
fn a_snapshot_install_demotes_the_lessor() {
    let mut h = Harness::new();
    h.apply_op(1, put("k", "v")).expect("put");
    assert!(h.inner().store.lessor().is_primary());
    // The image a leader's link sends (etcd's layout), received where a member receives it.
    let index = h.index + 5;
    let mut image =
        crate::etcd_server::peer_host::snapshot_image(&h.inner().store, h.index).expect("image");
    let path = h.inner().snapshot_receive_path(index);
    let mut file = std::fs::File::create(&path).expect("receive file");
    std::io::copy(&mut image.body, &mut file).expect("receive");
    drop(file);
    h.inner().snapshot_received(index, path);
    let conf_state = etcdrs_raftnode::eraftpb::ConfState {
        voters: vec![LOCAL],
        ..Default::default()
    };
    h.applier
        .install_snapshot(index, &conf_state, &image.data)
        .expect("install");
    assert!(!h.inner().store.lessor().is_primary());
}
