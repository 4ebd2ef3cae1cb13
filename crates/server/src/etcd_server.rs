//! `EtcdServer`: the member's core (etcd `server/etcdserver/server.go`). It turns client
//! requests into raft proposals and waits for their results, applies committed entries to
//! the MVCC store (the one writer), serves linearizable reads through ReadIndex, expires
//! leases and runs auto-compaction.
//!
//! This file holds the server's state and its accessors; its start, in phases whose types
//! carry the order, is `start`. The state is in two halves: `Inner`, what the applier writes
//! and requests read, and `Core`, the request side's own (the raft handle): the applier is
//! built from the first and handed to the raft node, so nothing on the raft thread calls back
//! into raft; the rest lives by seam in submodules: `bootstrap` (new cluster, join, what a
//! restart needs), `propose` (proposals and their waiters, the ReadIndex barrier, the quota),
//! `members` (membership changes), `applier` (what the raft thread runs for committed entries
//! and snapshots), `lease` (lease requests answered by the leader's lessor), `corrupt` (the
//! corruption checks), `peer_host` (the member as the transport's host) and `loops` (the
//! background tasks).

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering as AtomicOrdering};
use std::time::{Duration, Instant};

use etcdrs_mvcc::{KvStore, WatchHub};
use etcdrs_proto::etcdserverpb::{
    AlarmMember, AlarmResponse, AlarmType, CompactionResponse, DeleteRangeResponse,
    LeaseGrantResponse, LeaseRevokeResponse, PutResponse, ResponseHeader, TxnResponse,
};
use etcdrs_proto::rpctypes;
use etcdrs_raftnode::{RaftNodeHandle, task::TaskResult};
use etcdrs_schema::layout::Layout;
use etcdrs_schema::load::{
    load_alarms, load_cluster_version, load_downgrade, load_downgrade_known_to_etcd35,
    load_members, load_removed, read_u64,
};
use etcdrs_schema::membership::{self, Member};
use parking_lot::{Mutex, RwLock};
use tokio::sync::{oneshot, watch};
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

use crate::config::ServerConfig;
use crate::error::{Result, ServerError};
use crate::idgen::IdGenerator;
use crate::request::{MemberAttributes, Op, PublishForm};
use peer_host::PeerTransport;

mod applier;
mod bootstrap;
pub mod corrupt;
mod lease;
mod loops;
mod members;
mod peer_host;
mod propose;
mod received;
mod standalone;
mod start;
mod versions;

pub use peer_host::PeerHost;
pub use standalone::StandaloneMember;

/// What applying a request produced.
#[derive(Debug)]
pub enum ApplyOutput {
    /// Put.
    Put(PutResponse),
    /// DeleteRange.
    DeleteRange(DeleteRangeResponse),
    /// Txn.
    Txn(TxnResponse),
    /// Compaction.
    Compaction(CompactionResponse),
    /// LeaseGrant.
    LeaseGrant(LeaseGrantResponse),
    /// LeaseRevoke.
    LeaseRevoke(LeaseRevokeResponse),
    /// Alarm.
    Alarm(AlarmResponse),
    /// Publish.
    Published,
    /// A membership change took effect.
    MembersChanged,
    /// Lease checkpoints were recorded.
    Checkpointed,
    /// An auth change took effect; Authenticate's token (empty for the others).
    Auth(String),
}

type Waiter = oneshot::Sender<Result<ApplyOutput>>;

/// How long one read index request may go unanswered before it is asked again.
const READ_INDEX_RETRY: Duration = Duration::from_millis(500);
/// etcd refuses new proposals when the applied index trails the committed index by this much.
const MAX_GAP_APPLY_COMMIT: u64 = 5000;

/// How often a write refused for an overtaken auth revision is proposed again ([`EtcdServer::propose_as`]).
const MAX_AUTH_RETRIES: u32 = 8;
/// Cost etcd's quota charges per key on top of its key and value.
const KV_OVERHEAD: u64 = 256;

/// The member's state: what the applier (the one writer, on the raft thread) changes as
/// entries apply and the server reads to answer requests. It holds no raft handle: the
/// applier never calls back into the node that calls it.
struct Inner {
    config: ServerConfig,
    /// Where this member's storage lives, resolved once at start.
    layout: Layout,
    member_id: u64,
    cluster_id: u64,
    store: Arc<KvStore>,
    waiters: Mutex<HashMap<u64, Waiter>>,
    applied: watch::Sender<u64>,
    members: RwLock<BTreeMap<u64, Member>>,
    /// The cluster version as applied (etcd 3.4 and 3.5 set it through a v2 request, 3.6
    /// through `cluster_version_set`), `None` until the leader decides one; it picks the form
    /// of this member's publish.
    cluster_version: RwLock<Option<String>>,
    /// The target cluster version of a downgrade under way.
    downgrade: RwLock<Option<String>>,
    /// Whether etcd 3.5 members know of that downgrade (see `downgrade_known_to_etcd35`).
    downgrade_known_to_etcd35: AtomicBool,
    /// Set when a lowered cluster version applies: the raft log up to it raised the version
    /// above what members of the lowered version accept, so it goes (they get a snapshot).
    compact_log: AtomicBool,
    alarms: RwLock<Vec<AlarmMember>>,
    /// Set when this member's removal is applied: it must stop serving.
    removed: AtomicBool,
    /// Ids of members removed from the cluster: their peer messages are refused, which tells
    /// a removed member that missed its own removal to stop (etcd answers them 410 Gone).
    removed_members: RwLock<std::collections::HashSet<u64>>,
    removed_notify: tokio::sync::Notify,
    watch_hub: WatchHub,
    transport: Arc<PeerTransport>,
    /// A snapshot image received from the leader, waiting for raft to install it: its raft
    /// index and the image, made ready (`received`).
    pending_snapshot: Mutex<Option<(u64, received::ReceivedImage)>>,
    /// Wakes the watch sync task when a watcher falls behind or starts from history.
    watch_sync: tokio::sync::Notify,
    /// Wakes the compactor when a compaction is applied.
    compactor: tokio::sync::Notify,
    /// The newest compaction carried out to its end (a physical `Compact` waits for it).
    compacted: watch::Sender<i64>,
    leader_changes: AtomicU64,
    /// Term of the last applied entry: what etcd reports as the raft term (`EtcdServer.Term`,
    /// in response headers and `Status`), which does not move with elections that commit
    /// nothing. A watch, so that a proposal can wait for a leader change without being woken
    /// by every apply.
    applied_term: watch::Sender<u64>,
    /// Users, roles, permissions and tokens.
    auth: crate::auth::AuthStore,
}

impl Inner {
    /// Records that the compactions up to `rev` are carried out (it never goes back).
    fn note_compacted(&self, rev: i64) {
        self.compacted.send_if_modified(|done| {
            let raised = rev > *done;
            *done = (*done).max(rev);
            raised
        });
    }

    /// Records the term of the last applied entry; waiters are woken only when it changes.
    fn set_applied_term(&self, term: u64) {
        self.applied_term.send_if_modified(|applied| {
            let changed = *applied != term;
            *applied = term;
            changed
        });
    }

    /// The member's state as `store` holds it: membership, alarms, auth, versions.
    fn load(
        config: ServerConfig,
        layout: Layout,
        member_id: u64,
        cluster_id: u64,
        store: Arc<KvStore>,
        transport: Arc<PeerTransport>,
    ) -> Result<Inner> {
        let (applied, _) = watch::channel(store.consistent_index());
        Ok(Inner {
            auth: crate::auth::AuthStore::load(&store, config.auth.clone())?,
            config,
            layout,
            member_id,
            cluster_id,
            waiters: Mutex::new(HashMap::new()),
            applied,
            members: RwLock::new(load_members(&store)?),
            cluster_version: RwLock::new(load_cluster_version(&store)?),
            downgrade: RwLock::new(load_downgrade(&store)?),
            downgrade_known_to_etcd35: AtomicBool::new(load_downgrade_known_to_etcd35(&store)?),
            compact_log: AtomicBool::new(false),
            alarms: RwLock::new(load_alarms(&store)?),
            removed: AtomicBool::new(false),
            removed_members: RwLock::new(load_removed(&store)?),
            removed_notify: tokio::sync::Notify::new(),
            watch_hub: WatchHub::new(store.current_rev()),
            transport,
            pending_snapshot: Mutex::new(None),
            watch_sync: tokio::sync::Notify::new(),
            compactor: tokio::sync::Notify::new(),
            compacted: watch::Sender::new(store.finished_compact_rev()),
            leader_changes: AtomicU64::new(0),
            applied_term: watch::Sender::new(read_u64(store.meta(etcdrs_mvcc::META_TERM)?)),
            store,
        })
    }

    /// Where a snapshot image for raft index `index` is received.
    fn snapshot_receive_path(&self, index: u64) -> std::path::PathBuf {
        self.layout
            .backend_path
            .with_file_name(format!("{index:016x}.snap.recv"))
    }

    /// The image for raft index `index` has arrived: it is made ready to install here (read
    /// into our backend's format and indexed; this takes as long as the database is big), then
    /// waits for raft (an older one waiting is dropped).
    fn snapshot_received(&self, index: u64, path: std::path::PathBuf) {
        let image = received::prepare(index, path);
        self.snapshot_ready(index, image);
    }

    /// An image for raft index `index` arrives as an etcd-rs leader's stream of pairs: read
    /// into a backend file of ours as it comes and indexed, then it waits for raft as
    /// [`Self::snapshot_received`]'s do. A stream that fails leaves nothing waiting.
    fn snapshot_streamed(
        &self,
        index: u64,
        body: &mut (dyn std::io::Read + Send),
    ) -> Result<(), String> {
        let path = self
            .snapshot_receive_path(index)
            .with_extension("from-leader");
        match received::receive_pairs(index, path, body) {
            received::ReceivedImage::Failed(e) => Err(e),
            image => {
                self.snapshot_ready(index, image);
                Ok(())
            }
        }
    }

    /// `image` is ready for raft to install at `index` (an older one waiting is dropped).
    fn snapshot_ready(&self, index: u64, image: received::ReceivedImage) {
        let previous = self.pending_snapshot.lock().replace((index, image));
        if let Some((_, old)) = previous {
            old.discard();
        }
    }

    fn has_alarm(&self, alarm: AlarmType) -> bool {
        self.alarms.read().iter().any(|a| a.alarm == alarm as i32)
    }
}

/// What only the request side uses: the raft node's handle and the proposal machinery.
struct Core {
    raft: RaftNodeHandle,
    ids: IdGenerator,
    /// Held while the cluster version is decided and proposed, so that the monitor and a
    /// leader's publish do not both propose it.
    version_decision: tokio::sync::Mutex<()>,
    published: AtomicBool,
    /// Changes when require-leader streams must end (see `leader`).
    leader_losses: tokio::sync::watch::Receiver<u64>,
    request_timeout: Duration,
    /// The started peer transport, which the peer port's raft routes serve.
    peer_link: etcdrs_rafthttp::Running<PeerHost>,
}

/// The member's core. Cheap to clone.
#[derive(Clone)]
pub struct EtcdServer {
    inner: Arc<Inner>,
    core: Arc<Core>,
}

impl EtcdServer {
    /// Open storage, start raft and the background tasks (on `tasks`, stopped by `shutdown`).
    /// The phases are in `start`, each taking the one before.
    pub async fn start(
        config: ServerConfig,
        tasks: &mut JoinSet<TaskResult>,
        shutdown: CancellationToken,
    ) -> Result<EtcdServer> {
        let storage = start::Storage::open(config)?;
        let identity = storage.identify().await?;
        let started = identity.run(tasks, &shutdown)?;
        Ok(started.spawn_tasks(tasks, &shutdown))
    }

    /// This member's id.
    pub fn member_id(&self) -> u64 {
        self.inner.member_id
    }

    /// The cluster's id.
    pub fn cluster_id(&self) -> u64 {
        self.inner.cluster_id
    }

    /// The configuration.
    pub fn config(&self) -> &ServerConfig {
        &self.inner.config
    }

    /// The MVCC store.
    pub fn store(&self) -> &KvStore {
        &self.inner.store
    }

    /// The raft node's status.
    pub fn raft_status(&self) -> etcdrs_raftnode::NodeStatus {
        self.core.raft.status()
    }

    /// Members, by id.
    pub fn members(&self) -> Vec<Member> {
        self.inner.members.read().values().cloned().collect()
    }

    /// Whether member `id` was removed from the cluster.
    pub fn is_removed_member(&self, id: u64) -> bool {
        self.inner.removed_members.read().contains(&id)
    }

    /// Whether `id` is a member of the cluster now.
    pub fn is_member(&self, id: u64) -> bool {
        self.inner.members.read().contains_key(&id)
    }

    /// Whether this member has been removed from the cluster (by an applied membership
    /// change or by a peer's word); its process then exits with status 0, as etcd's does.
    pub fn is_removed(&self) -> bool {
        self.inner.removed.load(AtomicOrdering::Acquire)
    }

    /// This member learned from a peer that it was removed: it stops, as etcd does.
    pub fn removed_by_peer(&self) {
        if !self.inner.removed.swap(true, AtomicOrdering::AcqRel) {
            tracing::warn!("the member has been permanently removed from the cluster");
        }
        self.inner.removed_notify.notify_one();
    }

    /// Resolves when this member has been removed from the cluster.
    pub async fn wait_removed(&self) {
        while !self.inner.removed.load(AtomicOrdering::Acquire) {
            self.inner.removed_notify.notified().await;
        }
    }

    /// etcd serves only Status and serializable ranges on a learner; anything else gets
    /// "etcdserver: rpc not supported for learner".
    pub fn check_not_learner(&self) -> Result<()> {
        let is_learner = self
            .inner
            .members
            .read()
            .get(&self.inner.member_id)
            .is_some_and(|m| m.is_learner);
        if is_learner {
            return Err(ServerError::Etcd(&rpctypes::GRPC_NOT_SUPPORTED_FOR_LEARNER));
        }
        Ok(())
    }

    /// Raised alarms.
    pub fn alarms(&self) -> Vec<AlarmMember> {
        self.inner.alarms.read().clone()
    }

    /// How many times the leader changed (for metrics).
    pub fn leader_changes(&self) -> u64 {
        self.inner.leader_changes.load(AtomicOrdering::Relaxed)
    }

    /// A response header as etcd fills it; `revision` 0 means the current revision.
    pub fn header(&self, revision: i64) -> ResponseHeader {
        ResponseHeader {
            cluster_id: self.inner.cluster_id,
            member_id: self.inner.member_id,
            revision: if revision == 0 {
                self.inner.store.current_rev()
            } else {
                revision
            },
            raft_term: self.applied_term(),
        }
    }

    /// Term of the last applied entry (etcd's `Term()`).
    pub fn applied_term(&self) -> u64 {
        *self.inner.applied_term.borrow()
    }

    /// The header etcd's Cluster service sends: no revision.
    pub fn cluster_header(&self) -> ResponseHeader {
        ResponseHeader {
            revision: 0,
            ..self.header(-1)
        }
    }

    /// Fill a header that the applier set only the revision of.
    pub fn fill_header(&self, header: &mut Option<ResponseHeader>) {
        let revision = header.as_ref().map(|h| h.revision).unwrap_or(0);
        *header = Some(self.header(revision));
    }

    /// Wait until this member has published itself and can serve clients.
    pub async fn wait_ready(&self) -> Result<()> {
        let mut applied = self.inner.applied.subscribe();
        while !self.core.published.load(AtomicOrdering::Acquire) {
            if applied.changed().await.is_err() {
                return Err(ServerError::Stopped);
            }
        }
        Ok(())
    }

    /// Publish this member's name and client URLs through raft (etcd's `publish`).
    pub async fn publish(&self) -> Result<()> {
        let attributes = MemberAttributes {
            member_id: self.inner.member_id,
            name: self.inner.config.name.clone(),
            client_urls: self
                .inner
                .config
                .advertise_client_urls
                .iter()
                .map(url_string)
                .collect(),
        };
        // As etcd, retry until it works (the caller stops us at shutdown): a member of a new
        // cluster cannot publish before a quorum of its peers is up.
        let mut last_warning = Instant::now();
        loop {
            // A leader with no cluster version decides one before its publish, so that a
            // member that is ready reports it (etcd's monitor runs at the first commit of the
            // term, which comes before the publish).
            if self.cluster_version().is_none() && self.raft_status().is_leader {
                self.update_cluster_version_if_needed().await;
            }
            match self.propose(Op::Publish(attributes.clone())).await {
                Ok(_) => break,
                Err(e) => {
                    if last_warning.elapsed() >= Duration::from_secs(5) {
                        tracing::warn!(error = %e, "failed to publish local member to cluster through raft");
                        last_warning = Instant::now();
                    }
                    tokio::time::sleep(self.inner.config.heartbeat_interval).await;
                }
            }
        }
        tracing::info!(
            local_member_id = %membership::id_hex(self.inner.member_id),
            cluster_id = %membership::id_hex(self.inner.cluster_id),
            "published local member to cluster through raft"
        );
        self.core.published.store(true, AtomicOrdering::Release);
        self.inner.applied.send_modify(|_| {});
        if let Some(version) = self.cluster_version() {
            tracing::info!(
                cluster_version = etcdrs_schema::version::major_minor(&version),
                "enabled capabilities for version"
            );
        }
        Ok(())
    }

    /// The form a publish takes at the applied cluster version (etcd's v2 `publish` below 3.6,
    /// `publishV3` from 3.6 on; the v2 one while no version is decided).
    pub(crate) fn publish_form(&self) -> PublishForm {
        self.inner
            .cluster_version
            .read()
            .as_deref()
            .map_or(PublishForm::V2, PublishForm::for_cluster_version)
    }

    /// The cluster version as last applied; `None` until the first leader decides it.
    pub fn cluster_version(&self) -> Option<String> {
        self.inner.cluster_version.read().clone()
    }

    /// Whether UserAdd and UserChangePassword go into the log with the password hashed, as
    /// etcd 3.5 proposes them; below cluster version 3.5 they carry it in clear text, as
    /// etcd 3.4 proposes them, since etcd 3.4's applier knows no `hashed_password` and would
    /// hash the empty password in its place (every member hashes a clear one as it applies).
    pub fn proposes_hashed_passwords(&self) -> bool {
        self.cluster_version()
            .as_deref()
            .and_then(etcdrs_schema::version::Version::parse)
            .is_none_or(|v| (v.major, v.minor) >= (3, 5))
    }

    /// The target version of a downgrade under way, if one is.
    pub fn downgrade_target(&self) -> Option<String> {
        self.inner.downgrade.read().clone()
    }

    /// Whether etcd 3.5 members applied the downgrade under way: it came as a
    /// `downgrade_info_set` entry below cluster version 3.6, which only they propose (etcd-rs
    /// records its own downgrades as a v2 request there). etcd 3.5 never lowers the cluster
    /// version to a downgrade's target, and its members exit as soon as it is lowered while
    /// they know of the downgrade (`mustDetectDowngrade`: "server version is not allowed to
    /// join when downgrade is enabled"), so the leader keeps the version as etcd 3.5 does.
    pub fn downgrade_known_to_etcd35(&self) -> bool {
        self.inner
            .downgrade_known_to_etcd35
            .load(AtomicOrdering::Acquire)
    }

    fn has_alarm(&self, alarm: AlarmType) -> bool {
        self.inner.has_alarm(alarm)
    }

    /// The auth store.
    pub fn auth(&self) -> &crate::auth::AuthStore {
        &self.inner.auth
    }

    /// A fresh lease id (etcd picks one when the client asks for 0).
    pub fn new_lease_id(&self) -> i64 {
        loop {
            let id = (self.core.ids.next() & (i64::MAX as u64)) as i64;
            if id != 0 && !self.inner.store.lessor().contains(id) {
                return id;
            }
        }
    }

    /// The peer transport (links to the other members, and what their calls need).
    pub fn transport(&self) -> &PeerTransport {
        &self.inner.transport
    }

    /// The started peer transport with the member it delivers to (the peer port's raft routes).
    pub fn peer_link(&self) -> &etcdrs_rafthttp::Running<PeerHost> {
        &self.core.peer_link
    }

    /// The watch hub.
    pub fn watch_hub(&self) -> &WatchHub {
        &self.inner.watch_hub
    }

    /// Ask the watch sync task to run a round soon.
    pub fn wake_watch_sync(&self) {
        self.inner.watch_sync.notify_one();
    }
}

/// Removes the snapshot images a previous process received beside the backend
/// (`*.snap.recv`, `*.snap.from-etcd` read from an etcd leader's, `*.snap.from-leader` read
/// from an etcd-rs leader's stream of pairs): the image waiting for
/// raft lives only in memory (`pending_snapshot`), so such a file is never installed after a
/// restart, and a power cut can bring back one whose removal was not yet durable.
fn remove_received_snapshots(backend_path: &std::path::Path) {
    let Some(dir) = backend_path.parent() else {
        return;
    };
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name();
        let name = name.to_string_lossy();
        if [".snap.recv", ".snap.from-etcd", ".snap.from-leader"]
            .iter()
            .any(|end| name.ends_with(end))
        {
            match std::fs::remove_file(entry.path()) {
                Ok(()) => {
                    tracing::info!(path = %entry.path().display(), "removed a snapshot image left by an earlier start")
                }
                Err(e) => {
                    tracing::warn!(path = %entry.path().display(), error = %e, "cannot remove a snapshot image left by an earlier start")
                }
            }
        }
    }
}

/// A URL as etcd prints it and hashes it into member ids: scheme, host and port (the `url`
/// crate would drop a default port and add a trailing `/`), then any path and query.
pub fn url_string(url: &url::Url) -> String {
    let mut out = format!("{}://", url.scheme());
    if !url.username().is_empty() {
        out.push_str(url.username());
        if let Some(password) = url.password() {
            out.push(':');
            out.push_str(password);
        }
        out.push('@');
    }
    out.push_str(url.host_str().unwrap_or(""));
    if let Some(port) = url.port_or_known_default() {
        out.push_str(&format!(":{port}"));
    }
    if url.path() != "/" {
        out.push_str(url.path());
    }
    if let Some(query) = url.query() {
        out.push('?');
        out.push_str(query);
    }
    out
}

impl etcdrs_serve::leader::LeaderSource for EtcdServer {
    fn has_leader(&self) -> bool {
        self.core.raft.status().leader != 0
    }

    fn losses(&self) -> tokio::sync::watch::Receiver<u64> {
        self.core.leader_losses.clone()
    }
}
