//! The applier: what the raft thread runs for each batch of committed entries (one backend batch per batch of entries, published in memory at its commit and flushed to the file by the backend commit task; the watch hub and the proposers hear of it just before that commit), membership and alarm changes as they apply, snapshot installation, and the `StateMachine` the raft node calls.

use std::sync::Arc;
use std::sync::atomic::Ordering as AtomicOrdering;
use std::time::Instant;

use etcdrs_backend::Bucket;
use etcdrs_mvcc::{META_CONF_STATE, WriteBatch};
use etcdrs_proto::etcdserverpb::alarm_request::AlarmAction;
use etcdrs_proto::etcdserverpb::{
    AlarmMember, AlarmRequest, AlarmResponse, AlarmType, CompactionResponse, LeaseGrantResponse,
    LeaseRevokeResponse, ResponseHeader,
};
use etcdrs_proto::raft_internal::ConfigChangeContext;
use etcdrs_proto::rpctypes;
use etcdrs_raftnode::confchange::{ChangeKind, EtcdConfChange};
use etcdrs_raftnode::eraftpb::EntryType;
use etcdrs_raftnode::{Applied, Apply, StateMachine};
use prost::Message as _;

use etcdrs_schema::conf_state::encode_conf_state;
use etcdrs_schema::keys::{
    META_CLUSTER_ID, META_CLUSTER_VERSION, META_DOWNGRADE, META_MEMBER_ID, alarm_key,
};
use etcdrs_schema::load::{
    load_alarms, load_cluster_version, load_downgrade, load_downgrade_known_to_etcd35, load_members,
};
use etcdrs_schema::membership;
use etcdrs_schema::membership::Member;

use super::received::ReceivedImage;
use super::{ApplyOutput, Inner};
use crate::apply;
use crate::error::{Result, ServerError};
use crate::request::{Decoded, Op};

/// The server's state machine, called by the raft thread: it owns the writes to the member's
/// state ([`Inner`]) and reaches nothing of the server's request side, the raft node's handle
/// least of all; what it needs of raft comes with each batch.
pub(super) struct Applier {
    pub(super) inner: Arc<Inner>,
    pub(super) last_leader: u64,
    /// Each applied batch's backend generation with its last entry, until a durable flush
    /// of the backend holds it (`durable_through`).
    pub(super) unflushed: std::collections::VecDeque<(u64, u64, u64)>,
}

/// The membership an etcd snapshot's v2 store holds (`/0/members`, `/0/removed_members`,
/// `/0/version`).
struct V2Membership {
    members: Vec<Member>,
    removed: Vec<u64>,
    cluster_version: Option<String>,
}

/// The membership in `data`, a raft snapshot's v2 store JSON; `None` when `data` is not one
/// or holds no members (then the database's membership stands).
fn v2_membership(data: &[u8]) -> Option<V2Membership> {
    let store = etcdrs_etcddir::v2store::V2Store::parse(data).ok()?;
    let members = match store.members() {
        Ok(members) if !members.is_empty() => members,
        Ok(_) => return None,
        Err(e) => {
            tracing::warn!(error = %e, "the snapshot's v2 store has a member etcd-rs cannot read; keeping the database's membership");
            return None;
        }
    };
    Some(V2Membership {
        members,
        removed: store.removed_member_ids(),
        cluster_version: store.cluster_version(),
    })
}

impl Applier {
    /// Replace the store with the leader's snapshot image for `index` (called by raft);
    /// `data` is the raft snapshot's payload, etcd's v2 store JSON.
    pub(super) fn install_snapshot(
        &self,
        index: u64,
        conf_state: &etcdrs_raftnode::eraftpb::ConfState,
        data: &[u8],
    ) -> Result<()> {
        let Some((received, image)) = self.inner.pending_snapshot.lock().take() else {
            return Err(ServerError::Fatal(format!(
                "no snapshot image received for index {index}"
            )));
        };
        if received != index {
            image.discard();
            return Err(ServerError::Fatal(format!(
                "snapshot image is for index {received}, raft installs {index}"
            )));
        }
        let store = &self.inner.store;
        let started = Instant::now();
        tracing::info!(index, "applying snapshot");
        // An etcd leader sends its bbolt database (and so does ours to an etcd member), an
        // etcd-rs leader to us a stream of its pairs: either was read into an image of ours
        // and indexed as it arrived (`received`).
        let (image, cluster_version, loaded) = match image {
            ReceivedImage::Imported {
                path,
                cluster_version,
                downgrade,
                loaded,
            } => (path, Some((cluster_version, downgrade)), Some(loaded)),
            ReceivedImage::Streamed { path, loaded } => (path, None, Some(loaded)),
            ReceivedImage::Ours { path } => (path, None, None),
            ReceivedImage::Failed(e) => {
                return Err(ServerError::Fatal(format!(
                    "cannot read the snapshot database for index {index}: {e}"
                )));
            }
        };
        // etcd recovers the membership and the cluster version from the snapshot's v2 store
        // (3.4's and 3.5's `RaftCluster.Recover`), not from its database, and so does etcd-rs
        // when an etcd leader sends the snapshot: etcd 3.5.1's database keeps every member as
        // it was added (its `unsafeSaveMemberToBackend` writes no member the `members` bucket
        // already holds, so `UpdateAttributes` and `PromoteMember` never reach it), and a
        // member's name, client URLs and promotion live in its v2 store only.
        let v2 = match &cluster_version {
            Some(_) => v2_membership(data),
            None => None,
        };
        let cluster_version = match (cluster_version, &v2) {
            (Some((version, downgrade)), Some(v2)) => {
                Some((v2.cluster_version.clone().or(version), downgrade))
            }
            (cluster_version, _) => cluster_version,
        };
        let keep = [META_MEMBER_ID, META_CLUSTER_ID];
        match loaded {
            // The import is a backend file of ours, whole, closed and indexed: swapped in,
            // not copied.
            Some(loaded) => store.install_loaded(&image, &keep, loaded)?,
            None => store.install_snapshot(&image, &keep)?,
        }
        let _ = std::fs::remove_file(&image);
        let from_db = match &v2 {
            Some(_) => load_members(store)?,
            None => Default::default(),
        };
        let mut batch = store.write()?;
        if let Some(v2) = &v2 {
            for id in from_db.keys() {
                batch.bucket_delete(Bucket::MEMBERS, &id.to_be_bytes())?;
            }
            for member in &v2.members {
                let json = serde_json::to_vec(member)
                    .map_err(|e| ServerError::Fatal(format!("encode member: {e}")))?;
                batch.bucket_put(Bucket::MEMBERS, &member.id.to_be_bytes(), &json)?;
            }
            for id in &v2.removed {
                batch.bucket_put(Bucket::MEMBERS_REMOVED, &id.to_be_bytes(), b"removed")?;
            }
        }
        // etcd's database carries its cluster version and downgrade record in its own
        // bucket; what it lacks is none.
        if let Some((version, downgrade)) = &cluster_version {
            match version {
                Some(version) => {
                    batch.bucket_put(Bucket::META, META_CLUSTER_VERSION, version.as_bytes())?
                }
                None => batch.bucket_delete(Bucket::META, META_CLUSTER_VERSION)?,
            }
            match downgrade {
                Some(info) => batch.bucket_put(
                    Bucket::META,
                    META_DOWNGRADE,
                    &etcdrs_schema::version::DowngradeInfo::from_etcd(info, version.as_deref()),
                )?,
                None => batch.bucket_delete(Bucket::META, META_DOWNGRADE)?,
            }
        }
        batch.bucket_put(
            Bucket::META,
            META_CONF_STATE,
            &encode_conf_state(conf_state),
        )?;
        batch.commit(true)?;
        *self.inner.members.write() = load_members(store)?;
        *self.inner.alarms.write() = load_alarms(store)?;
        *self.inner.cluster_version.write() = load_cluster_version(store)?;
        *self.inner.downgrade.write() = load_downgrade(store)?;
        self.inner.downgrade_known_to_etcd35.store(
            load_downgrade_known_to_etcd35(store)?,
            AtomicOrdering::Release,
        );
        self.inner.auth.reload(store)?;
        // Only a follower installs a leader's snapshot: its lessor stops being primary, as
        // etcd's demotes on losing leadership. Kept primary (the install restarts every lease
        // at its full TTL), a member leading again before it applied a batch was not
        // promoted afresh, and held leases past their checkpoints and its keep-alives (the
        // simulator's lease checks, seed 3767).
        store.lessor().demote();
        // The install finished the image's compactions: a physical Compact waiting on a
        // compaction the image covers is answered.
        self.inner.note_compacted(store.finished_compact_rev());
        self.refresh_peers();
        self.inner.watch_hub.store_replaced(store.current_rev());
        self.inner.watch_sync.notify_one();
        self.inner.applied.send_replace(store.consistent_index());
        tracing::info!(
            index,
            revision = store.current_rev(),
            took = ?started.elapsed(),
            "restored backend from the leader's snapshot"
        );
        Ok(())
    }

    /// Apply one batch of committed entries and wake everyone waiting on it.
    pub(super) fn apply_committed(&mut self, batch: Apply) -> Result<Applied> {
        tracing::debug!(entries = batch.entries.len(), "applying batch");
        let status = batch.raft;
        let (index, term) = self.apply_batch(batch)?;
        let durable = self.durable_through(index, term);
        // etcd promotes the lessor once the leader has applied an entry of its own term
        // (so every earlier term is applied): every lease restarts, extended by the
        // election timeout. A member that loses leadership stops expiring leases.
        let lessor = self.inner.store.lessor();
        if status.is_leader && term == status.term && !lessor.is_primary() {
            lessor.promote(self.inner.store.now(), self.inner.config.election_timeout);
        } else if !status.is_leader && lessor.is_primary() {
            lessor.demote();
        }
        if self.inner.removed.load(AtomicOrdering::Acquire) {
            tracing::warn!("the member has been permanently removed from the cluster");
            return Err(ServerError::Fatal(
                "the member has been permanently removed from the cluster".into(),
            ));
        }
        if term > 0 {
            self.inner.set_applied_term(term);
        }
        self.inner.applied.send_replace(index);
        if status.leader != self.last_leader && status.leader != 0 {
            self.inner
                .leader_changes
                .fetch_add(1, AtomicOrdering::Relaxed);
            self.last_leader = status.leader;
        }
        Ok(Applied {
            index,
            term,
            durable,
            compact_log: self.inner.compact_log.swap(false, AtomicOrdering::AcqRel),
        })
    }

    /// The newest applied entry the backend holds durably, when that moved: the backend
    /// flushes its batches in the background, and each batch's generation waits here until
    /// [`etcdrs_backend::Backend::durable_generation`] reaches it.
    fn durable_through(&mut self, index: u64, term: u64) -> Option<(u64, u64)> {
        let generation = self.inner.store.backend().published_generation();
        self.unflushed.push_back((generation, index, term));
        self.newly_durable()
    }

    /// The newest applied entry that a durable flush of the backend has come to hold since
    /// the last report, if any.
    fn newly_durable(&mut self) -> Option<(u64, u64)> {
        if self.unflushed.is_empty() {
            return None;
        }
        let durable = self.inner.store.backend().durable_generation();
        let mut reached = None;
        while let Some(&(generation, index, term)) = self.unflushed.front() {
            if generation > durable {
                break;
            }
            reached = Some((index, term));
            self.unflushed.pop_front();
        }
        reached
    }

    pub(super) fn apply_batch(&self, apply: Apply) -> Result<(u64, u64)> {
        let store = &self.inner.store;
        // Read before the batch takes the store's write lock.
        let skip_below = store.consistent_index();
        let mut batch = store.write()?;
        let mut results = Vec::new();
        let (mut index, mut term) = (0, 0);
        for entry in &apply.entries {
            index = entry.index;
            term = entry.term;
            if entry.index <= skip_below {
                continue;
            }
            match entry.get_entry_type() {
                EntryType::EntryNormal => {
                    if entry.data.is_empty() {
                        continue;
                    }
                    let decoded = crate::request::decode(entry.data.clone())
                        .map_err(|e| ServerError::Fatal(format!("decode raft request: {e}")))?;
                    let (id, proposer, op) = match decoded {
                        Decoded::Noop => continue,
                        // Nothing etcd-rs keeps changes; a proposer waiting here (none of
                        // ours proposes such a request) is told, not left waiting.
                        Decoded::Ignored { id } => {
                            results
                                .push((id, Err(ServerError::Fatal("unknown raft request".into()))));
                            continue;
                        }
                        Decoded::Op { id, proposer, op } => (id, proposer, op),
                    };
                    // etcd's `authApplierV3`: every request with a header is checked under its
                    // user and auth revision (an empty user fails where a permission is
                    // needed), except Authenticate, whose password the proposer checked.
                    let auth = proposer
                        .filter(|_| !matches!(op, Op::Authenticate(_)))
                        .map(|p| crate::auth::AuthInfo {
                            username: p.username,
                            revision: p.auth_revision,
                            live: false,
                        });
                    let metric = op.metric_index();
                    let started = Instant::now();
                    let output = self.apply_op(&mut batch, op, auth.as_ref());
                    if let Some(metric) = metric {
                        // etcd counts a compaction of compacted history as a success.
                        let success = matches!(
                            &output,
                            Ok(_) | Err(ServerError::Mvcc(etcdrs_mvcc::Error::Compacted { .. }))
                        );
                        let took = started.elapsed();
                        if crate::metrics::observe_apply(metric, success, took) {
                            // etcd's `warnOfExpensiveRequest`, in its words.
                            tracing::warn!(
                                took = ?took,
                                expected_duration = ?crate::metrics::warning_apply_duration(),
                                request = crate::metrics::apply_op_name(metric),
                                "apply request took too long"
                            );
                        }
                    }
                    if let Err(ServerError::Mvcc(
                        e @ (etcdrs_mvcc::Error::Backend(_) | etcdrs_mvcc::Error::Corrupt(_)),
                    )) = &output
                    {
                        return Err(ServerError::Fatal(e.to_string()));
                    }
                    results.push((id, output));
                }
                EntryType::EntryConfChange => {
                    let change = EtcdConfChange::decode(&entry.data)
                        .map_err(|e| ServerError::Fatal(format!("entry {}: {e}", entry.index)))?;
                    // Refused exactly as the raft node refused it (`conf_change_allowed`).
                    match self.validate_conf_change(&change) {
                        Ok(()) => {
                            self.apply_conf_change(&mut batch, &change)?;
                            results.push((change.id, Ok(ApplyOutput::MembersChanged)));
                        }
                        Err(e) => results.push((change.id, Err(e))),
                    }
                }
                // Neither etcd nor etcd-rs writes these (etcd 3.4's server would not apply
                // them): a joint configuration has no membership record here.
                EntryType::EntryConfChangeV2 => {}
            }
        }
        if index > skip_below {
            batch.set_consistent_index(index, term)?;
        }
        if let Some(conf_state) = &apply.conf_state {
            batch.bucket_put(
                Bucket::META,
                META_CONF_STATE,
                &encode_conf_state(conf_state),
            )?;
        }
        // Watchers are told, then the proposers answered, before the backend's commit: the
        // entries are in the WAL, and the batch holds the store's index lock until the commit
        // is done, so a read that follows an answer or an event (a range, `current_rev`, a
        // watcher's catch-up, a progress report, and through `KvStore::wait_committed` the
        // hashes and snapshots) waits for it and sees the writes, and the watchers' events.
        // Watchers first, as etcd's store notifies them before its applier answers: a client
        // that writes and watches (kube-apiserver's watch cache) gets the event before or with
        // the acknowledgement, not a task hop later.
        let changes = batch.take_changes();
        if self.inner.watch_hub.notify(&changes, batch.current_rev()) {
            self.inner.watch_sync.notify_one();
        }
        self.answer(results);
        // A batch that asks for raft's log to go (a downgrade) commits durably, so the log
        // goes before the raft thread takes its next message: a member added after the
        // downgrade is applied gets a snapshot, never the entry that raised the version.
        let compact = self.inner.compact_log.load(AtomicOrdering::Acquire);
        batch.commit(compact)?;
        Ok((index, term))
    }

    /// Hands each proposer its entry's outcome (a proposer that gave up has left no waiter).
    fn answer(&self, results: Vec<(u64, Result<ApplyOutput>)>) {
        if results.is_empty() {
            return;
        }
        let waiting: Vec<_> = {
            let mut waiters = self.inner.waiters.lock();
            results
                .into_iter()
                .filter_map(|(id, output)| waiters.remove(&id).map(|waiter| (waiter, output)))
                .collect()
        };
        for (waiter, output) in waiting {
            let _ = waiter.send(output);
        }
    }

    /// etcd's `ValidateConfigurationChange`, on the membership as applied: a committed change
    /// that lost a race with another (two additions of one peer URL, a removal of a member
    /// already gone) takes no effect on any member, etcd or etcd-rs, and its proposer gets
    /// etcd's error.
    pub(super) fn validate_conf_change(&self, change: &EtcdConfChange) -> Result<()> {
        let id = change.node_id;
        if self.inner.removed_members.read().contains(&id) {
            return Err(ServerError::Etcd(&rpctypes::MEMBER_NOT_FOUND));
        }
        let members = self.inner.members.read();
        let context = change.context.as_deref().unwrap_or_default();
        let bad_context =
            |e: serde_json::Error| ServerError::Fatal(format!("decode member in conf change: {e}"));
        let url_taken = |urls: &[String]| {
            members
                .values()
                .filter(|m| m.id != id)
                .any(|m| m.peer_urls.iter().any(|u| urls.contains(u)))
        };
        match change.kind {
            ChangeKind::AddNode | ChangeKind::AddLearnerNode => {
                let ConfigChangeContext { member, is_promote } =
                    serde_json::from_slice(context).map_err(bad_context)?;
                if is_promote {
                    match members.get(&id) {
                        None => return Err(ServerError::Etcd(&rpctypes::MEMBER_NOT_FOUND)),
                        Some(m) if !m.is_learner => {
                            return Err(ServerError::Etcd(&rpctypes::MEMBER_NOT_LEARNER));
                        }
                        Some(_) => {}
                    }
                } else {
                    if members.contains_key(&id) {
                        return Err(ServerError::Etcd(&rpctypes::MEMBER_EXIST));
                    }
                    if url_taken(&member.peer_urls) {
                        return Err(ServerError::Etcd(&rpctypes::PEER_URL_EXIST));
                    }
                    let learners = members.values().filter(|m| m.is_learner).count();
                    if member.is_learner && learners + 1 > self.inner.config.max_learners {
                        return Err(ServerError::Etcd(&rpctypes::TOO_MANY_LEARNERS));
                    }
                }
            }
            ChangeKind::RemoveNode => {
                if !members.contains_key(&id) {
                    return Err(ServerError::Etcd(&rpctypes::MEMBER_NOT_FOUND));
                }
            }
            ChangeKind::UpdateNode => {
                if !members.contains_key(&id) {
                    return Err(ServerError::Etcd(&rpctypes::MEMBER_NOT_FOUND));
                }
                let update: Member = serde_json::from_slice(context).map_err(bad_context)?;
                if url_taken(&update.peer_urls) {
                    return Err(ServerError::Etcd(&rpctypes::PEER_URL_EXIST));
                }
            }
        }
        Ok(())
    }

    /// etcd's `applyConfChange` for the membership: an addition records the member of its
    /// context; a promotion (`AddNode` whose context says `isPromote`) turns the learner into a
    /// voter; an update replaces the member's peer URLs; a removal forgets the member for good.
    pub(super) fn apply_conf_change(
        &self,
        batch: &mut WriteBatch<'_>,
        change: &EtcdConfChange,
    ) -> Result<()> {
        let context = change.context.as_deref().unwrap_or_default();
        let bad_context =
            |e: serde_json::Error| ServerError::Fatal(format!("decode member in conf change: {e}"));
        let store_member = |batch: &mut WriteBatch<'_>, member: &Member| -> Result<()> {
            let json = serde_json::to_vec(member)
                .map_err(|e| ServerError::Fatal(format!("encode member: {e}")))?;
            batch.bucket_put(Bucket::MEMBERS, &member.id.to_be_bytes(), &json)?;
            Ok(())
        };
        match change.kind {
            ChangeKind::AddNode | ChangeKind::AddLearnerNode => {
                let ConfigChangeContext { member, is_promote } =
                    serde_json::from_slice(context).map_err(bad_context)?;
                if member.id != change.node_id {
                    return Err(ServerError::Fatal(format!(
                        "got different member ID: {} in the conf change, {} in its member",
                        membership::id_hex(change.node_id),
                        membership::id_hex(member.id)
                    )));
                }
                if is_promote {
                    let mut members = self.inner.members.write();
                    if let Some(known) = members.get_mut(&member.id) {
                        known.is_learner = false;
                        store_member(batch, known)?;
                    }
                    drop(members);
                    tracing::info!(promoted_member_id = %membership::id_hex(member.id), "promote member");
                    return Ok(());
                }
                store_member(batch, &member)?;
                tracing::info!(
                    added_peer_id = %membership::id_hex(member.id),
                    added_peer_peer_urls = ?member.peer_urls,
                    added_peer_is_learner = member.is_learner,
                    "added member"
                );
                self.inner.members.write().insert(member.id, member);
                self.refresh_peers();
            }
            ChangeKind::UpdateNode => {
                let update: Member = serde_json::from_slice(context).map_err(bad_context)?;
                let mut members = self.inner.members.write();
                if let Some(member) = members.get_mut(&change.node_id) {
                    member.peer_urls = update.peer_urls;
                    store_member(batch, member)?;
                    tracing::info!(updated_remote_peer_id = %membership::id_hex(member.id), "updated member");
                }
                drop(members);
                self.refresh_peers();
            }
            ChangeKind::RemoveNode => {
                tracing::info!(removed_remote_peer_id = %membership::id_hex(change.node_id), "removed member");
                if change.node_id == self.inner.member_id {
                    self.inner.removed.store(true, AtomicOrdering::Release);
                    self.inner.removed_notify.notify_one();
                }
                batch.bucket_delete(Bucket::MEMBERS, &change.node_id.to_be_bytes())?;
                self.inner.removed_members.write().insert(change.node_id);
                batch.bucket_put(
                    Bucket::MEMBERS_REMOVED,
                    &change.node_id.to_be_bytes(),
                    b"removed",
                )?;
                self.inner.members.write().remove(&change.node_id);
                self.refresh_peers();
            }
        }
        Ok(())
    }

    /// Point the transport at the current members.
    pub(super) fn refresh_peers(&self) {
        let peers: Vec<(u64, Vec<String>)> = self
            .inner
            .members
            .read()
            .values()
            .map(|m| (m.id, m.peer_urls.clone()))
            .collect();
        self.inner.transport.set_peers(&peers);
    }

    pub(super) fn capped(&self) -> bool {
        self.inner.has_alarm(AlarmType::Nospace)
    }

    pub(super) fn apply_op(
        &self,
        batch: &mut WriteBatch<'_>,
        op: Op,
        auth: Option<&crate::auth::AuthInfo>,
    ) -> Result<ApplyOutput> {
        let store = &self.inner.store;
        let auth_store = &self.inner.auth;
        let lease_keys = |id: i64| -> Vec<Vec<u8>> {
            store
                .lessor()
                .get(id)
                .map(|lease| lease.keys.into_iter().collect())
                .unwrap_or_default()
        };
        let op = match auth_change(op) {
            Ok(change) => {
                return auth_store
                    .apply(batch, &change, auth)
                    .map(ApplyOutput::Auth);
            }
            Err(op) => op,
        };
        // etcd's corrupt applier: while a CORRUPT alarm stands, no write is applied.
        if self.inner.has_alarm(AlarmType::Corrupt)
            && matches!(
                op,
                Op::Put(_)
                    | Op::DeleteRange(_)
                    | Op::Txn(_)
                    | Op::Compaction(_)
                    | Op::LeaseGrant(_)
                    | Op::LeaseRevoke(_)
            )
        {
            return Err(ServerError::Etcd(&rpctypes::CORRUPT));
        }
        match op {
            Op::AuthEnable(_)
            | Op::AuthDisable(_)
            | Op::Authenticate(_)
            | Op::UserAdd(_)
            | Op::UserDelete(_)
            | Op::UserChangePassword(_)
            | Op::UserGrantRole(_)
            | Op::UserRevokeRole(_)
            | Op::RoleAdd(_)
            | Op::RoleDelete(_)
            | Op::RoleGrantPermission(_)
            | Op::RoleRevokePermission(_) => Ok(ApplyOutput::Auth(String::new())),
            Op::Put(req) => {
                auth_store.check_put(auth, &req, &lease_keys(req.lease))?;
                if self.capped() {
                    return Err(ServerError::Etcd(&rpctypes::NO_SPACE));
                }
                let mut txn = batch.txn();
                let result = apply::put_owned(&mut txn, req);
                txn.end();
                result.map(ApplyOutput::Put)
            }
            Op::DeleteRange(req) => {
                auth_store.check_delete(auth, &req)?;
                let mut txn = batch.txn();
                let result = apply::delete_range(&mut txn, &req);
                txn.end();
                result.map(ApplyOutput::DeleteRange)
            }
            Op::Txn(req) => {
                auth_store.check_txn(auth, &req)?;
                if self.capped() && !apply::txn_is_read_only(&req) {
                    return Err(ServerError::Etcd(&rpctypes::NO_SPACE));
                }
                let mut txn = batch.txn();
                let result = apply::txn_write(&mut txn, store.lessor(), req);
                txn.end();
                result.map(ApplyOutput::Txn)
            }
            Op::Compaction(req) => {
                let rev = apply::compact(batch, req.revision)?;
                // Carried out by the compactor from the batch's commit on (it waits for the
                // store's index lock that this batch holds).
                self.inner.compactor.notify_one();
                Ok(ApplyOutput::Compaction(CompactionResponse {
                    header: Some(ResponseHeader {
                        revision: rev,
                        ..Default::default()
                    }),
                }))
            }
            Op::LeaseGrant(req) => {
                if self.capped() {
                    return Err(ServerError::Etcd(&rpctypes::NO_SPACE));
                }
                let ttl = store.lessor().effective_ttl(req.ttl);
                match batch.lease_grant(req.id, ttl) {
                    Ok(()) => {}
                    Err(etcdrs_mvcc::Error::LeaseExists(_)) => {
                        return Err(ServerError::Etcd(&rpctypes::LEASE_EXIST));
                    }
                    Err(e) => return Err(e.into()),
                }
                Ok(ApplyOutput::LeaseGrant(LeaseGrantResponse {
                    header: Some(ResponseHeader {
                        revision: batch.current_rev(),
                        ..Default::default()
                    }),
                    id: req.id,
                    ttl,
                    error: String::new(),
                }))
            }
            Op::LeaseRevoke(req) => {
                auth_store.check_lease_keys(auth, &lease_keys(req.id))?;
                match batch.lease_revoke(req.id) {
                    Ok(()) => {}
                    Err(etcdrs_mvcc::Error::LeaseNotFound(_)) => {
                        return Err(ServerError::Etcd(&rpctypes::LEASE_NOT_FOUND));
                    }
                    Err(e) => return Err(e.into()),
                }
                Ok(ApplyOutput::LeaseRevoke(LeaseRevokeResponse {
                    header: Some(ResponseHeader {
                        revision: batch.current_rev(),
                        ..Default::default()
                    }),
                }))
            }
            Op::Alarm(req) => self.apply_alarm(batch, req).map(ApplyOutput::Alarm),
            Op::LeaseCheckpoint(req) => {
                // Every member records the leader's remainders; only a promotion reads them
                // (and, kept in the backend, a restart).
                let persist = self.inner.config.lease_checkpoint_persist;
                for checkpoint in req.checkpoints {
                    store
                        .lessor()
                        .checkpoint(checkpoint.id, checkpoint.remaining_ttl);
                    if persist {
                        batch.persist_lease_checkpoint(checkpoint.id, checkpoint.remaining_ttl)?;
                    }
                }
                Ok(ApplyOutput::Checkpointed)
            }
            Op::ClusterVersionSet(version) => {
                self.apply_cluster_version(batch, version)?;
                Ok(ApplyOutput::Published)
            }
            Op::DowngradeInfoSet(target) => self.apply_downgrade(batch, target, false),
            Op::DowngradeInfoSetV3(target) => {
                let below_36 = self
                    .inner
                    .cluster_version
                    .read()
                    .as_deref()
                    .and_then(etcdrs_schema::version::Version::parse)
                    .is_none_or(|v| (v.major, v.minor) < (3, 6));
                self.apply_downgrade(batch, target, below_36)
            }
            Op::Publish(attributes) => {
                let mut members = self.inner.members.write();
                if let Some(member) = members.get_mut(&attributes.member_id) {
                    member.name = attributes.name;
                    member.client_urls = attributes.client_urls;
                    let json = serde_json::to_vec(&*member)
                        .map_err(|e| ServerError::Fatal(format!("encode member: {e}")))?;
                    batch.bucket_put(Bucket::MEMBERS, &member.id.to_be_bytes(), &json)?;
                }
                Ok(ApplyOutput::Published)
            }
        }
    }

    /// etcd's `RaftCluster.SetDowngradeInfo`; `from_etcd35`: etcd 3.5 members applied it too
    /// (`EtcdServer::downgrade_known_to_etcd35`).
    fn apply_downgrade(
        &self,
        batch: &mut WriteBatch<'_>,
        target: Option<String>,
        from_etcd35: bool,
    ) -> Result<ApplyOutput> {
        let mut info = etcdrs_schema::version::DowngradeInfo::new(target.as_deref());
        info.known_to_etcd35 = from_etcd35 && target.is_some();
        batch.bucket_put(Bucket::META, META_DOWNGRADE, &info.encode_stored())?;
        match &target {
            Some(t) if info.known_to_etcd35 => tracing::warn!(
                target_version = %t,
                "downgrade enabled by an etcd 3.5 member: the cluster version stays, as etcd 3.5 keeps it (its members exit once it is lowered)"
            ),
            Some(t) => tracing::info!(target_version = %t, "downgrade enabled"),
            None => tracing::info!("downgrade disabled"),
        }
        *self.inner.downgrade.write() = target;
        self.inner
            .downgrade_known_to_etcd35
            .store(info.known_to_etcd35, AtomicOrdering::Release);
        Ok(ApplyOutput::Published)
    }

    /// etcd's `RaftCluster.SetVersion`: record the version and log the change; a member whose
    /// own version is below the cluster's stops, as etcd's `mustDetectDowngrade` makes it.
    /// (etcd also stops a member that is not at the target of a downgrade under way; etcd-rs
    /// runs at a 3.4 cluster version as a 3.4-speaking member, so it keeps serving.)
    fn apply_cluster_version(&self, batch: &mut WriteBatch<'_>, version: String) -> Result<()> {
        let previous = self.inner.cluster_version.read().clone();
        if previous.as_deref() == Some(version.as_str()) {
            return Ok(());
        }
        let Some(parsed) = etcdrs_schema::version::Version::parse(&version) else {
            return Err(ServerError::Fatal(format!(
                "cannot apply cluster version {version:?}: not a version"
            )));
        };
        let local = etcdrs_schema::version::local().cluster();
        if local < parsed.cluster() {
            return Err(ServerError::Fatal(format!(
                "invalid downgrade; server version is lower than determined cluster version \
                 (current version: {} is lower than determined cluster version: {})",
                etcdrs_schema::version::SERVER_VERSION,
                etcdrs_schema::version::major_minor(&version)
            )));
        }
        batch.bucket_put(Bucket::META, META_CLUSTER_VERSION, version.as_bytes())?;
        let to = etcdrs_schema::version::major_minor(&version);
        match &previous {
            Some(from) => tracing::info!(
                from = etcdrs_schema::version::major_minor(from),
                to,
                "updated cluster version"
            ),
            None => tracing::info!(cluster_version = to, "set initial cluster version"),
        }
        tracing::info!(cluster_version = to, "enabled capabilities for version");
        // A downgrade: an etcd member of the lowered version would refuse the entry that
        // raised the version if it replayed the log, so the log goes and it gets a snapshot.
        if previous
            .as_deref()
            .and_then(etcdrs_schema::version::Version::parse)
            .is_some_and(|p| p.cluster() > parsed.cluster())
        {
            self.inner.compact_log.store(true, AtomicOrdering::Release);
        }
        *self.inner.cluster_version.write() = Some(version);
        Ok(())
    }

    pub(super) fn apply_alarm(
        &self,
        batch: &mut WriteBatch<'_>,
        req: AlarmRequest,
    ) -> Result<AlarmResponse> {
        let action = AlarmAction::try_from(req.action).unwrap_or(AlarmAction::Get);
        let mut alarms = self.inner.alarms.write();
        let key = alarm_key(req.member_id, req.alarm);
        let mut changed = Vec::new();
        match action {
            AlarmAction::Get => {}
            AlarmAction::Activate => {
                if req.alarm == AlarmType::None as i32 {
                    return Ok(AlarmResponse::default());
                }
                let member = AlarmMember {
                    member_id: req.member_id,
                    alarm: req.alarm,
                };
                if !alarms.contains(&member) {
                    batch.bucket_put(Bucket::ALARM, &key, &member.encode_to_vec())?;
                    alarms.push(member);
                    tracing::warn!(alarm = req.alarm, "alarm raised");
                }
                changed.push(member);
            }
            AlarmAction::Deactivate => {
                let before = alarms.len();
                alarms.retain(|a| !(a.member_id == req.member_id && a.alarm == req.alarm));
                if alarms.len() != before {
                    batch.bucket_delete(Bucket::ALARM, &key)?;
                    changed.push(AlarmMember {
                        member_id: req.member_id,
                        alarm: req.alarm,
                    });
                }
            }
        }
        Ok(AlarmResponse {
            header: Some(ResponseHeader {
                revision: batch.current_rev(),
                ..Default::default()
            }),
            alarms: if action == AlarmAction::Get {
                alarms.clone()
            } else {
                changed
            },
        })
    }
}

impl StateMachine for Applier {
    fn conf_change_allowed(&mut self, index: u64, change: &EtcdConfChange) -> bool {
        // Entries the store applied already (replayed after a restart) were judged then.
        if index <= self.inner.store.consistent_index() {
            return true;
        }
        match self.validate_conf_change(change) {
            Ok(()) => true,
            Err(e) => {
                tracing::warn!(error = %e, member_id = %membership::id_hex(change.node_id), "refused a membership change");
                false
            }
        }
    }

    fn apply(&mut self, batch: Apply) -> std::result::Result<Applied, String> {
        self.apply_committed(batch).map_err(|e| e.to_string())
    }

    fn durable(&mut self) -> Option<(u64, u64)> {
        self.newly_durable()
    }

    fn restore(
        &mut self,
        index: u64,
        term: u64,
        conf_state: &etcdrs_raftnode::eraftpb::ConfState,
        data: &[u8],
    ) -> std::result::Result<(), String> {
        self.install_snapshot(index, conf_state, data)
            .map_err(|e| e.to_string())?;
        // The batches before the image are gone with the store they wrote.
        self.unflushed.clear();
        self.inner.set_applied_term(term);
        Ok(())
    }
}

/// etcd's default `--bcrypt-cost`: what an etcd 3.4 member hashes a clear-text password with.
const ETCD_BCRYPT_COST: u32 = 10;

fn no_password(req: &etcdrs_proto::etcdserverpb::AuthUserAddRequest) -> bool {
    req.options.as_ref().is_some_and(|o| o.no_password)
}

/// etcd 3.4 proposes a new password in clear text and every member hashes it as it applies
/// (3.5 and etcd-rs hash before proposing, and send `hashed_password`): applied here as 3.5's
/// applier does, hashing only when no hash came with the request. The clear text is dropped
/// either way; it is never stored.
fn hash_clear_password(password: &mut String, hashed: &mut String, no_password: bool) {
    if hashed.is_empty() && !password.is_empty() && !no_password {
        match bcrypt::hash(password.as_str(), ETCD_BCRYPT_COST) {
            Ok(hash) => *hashed = crate::auth::hashed_password_field(&hash),
            Err(e) => tracing::warn!(error = %e, "failed to hash a password"),
        }
    }
    password.clear();
}

/// The auth change an entry carries, or the entry back when it is something else.
pub(super) fn auth_change(op: Op) -> std::result::Result<crate::auth::AuthChange, Op> {
    use crate::auth::AuthChange;
    Ok(match op {
        Op::AuthEnable(_) => AuthChange::Enable,
        Op::AuthDisable(_) => AuthChange::Disable,
        Op::Authenticate(req) => AuthChange::Authenticate {
            name: req.name,
            token_prefix: req.simple_token,
        },
        Op::UserAdd(mut req) => {
            let no_password = no_password(&req);
            hash_clear_password(&mut req.password, &mut req.hashed_password, no_password);
            AuthChange::UserAdd(req)
        }
        Op::UserDelete(req) => AuthChange::UserDelete(req.name),
        Op::UserChangePassword(mut req) => {
            hash_clear_password(&mut req.password, &mut req.hashed_password, false);
            AuthChange::UserChangePassword(req)
        }
        Op::UserGrantRole(req) => AuthChange::UserGrantRole(req),
        Op::UserRevokeRole(req) => AuthChange::UserRevokeRole(req),
        Op::RoleAdd(req) => AuthChange::RoleAdd(req.name),
        Op::RoleDelete(req) => AuthChange::RoleDelete(req.role),
        Op::RoleGrantPermission(req) => AuthChange::RoleGrantPermission(req),
        Op::RoleRevokePermission(req) => AuthChange::RoleRevokePermission(req),
        other => return Err(other),
    })
}

#[cfg(test)]
mod tests;
