//! `EtcdServer`: the member's core (etcd `server/etcdserver/server.go`). It turns client
//! requests into raft proposals and waits for their results, applies committed entries to
//! the MVCC store (the one writer), serves linearizable reads through ReadIndex, expires
//! leases and runs auto-compaction.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering as AtomicOrdering};
use std::time::{Duration, Instant};

use etcdrs_backend::{Backend, Bucket};
use etcdrs_mvcc::{KvStore, META_CONF_STATE, WatchHub, WriteBatch};
use etcdrs_proto::etcdserverpb::alarm_request::AlarmAction;
use etcdrs_proto::etcdserverpb::{
    AlarmMember, AlarmRequest, AlarmResponse, AlarmType, CompactionResponse, DeleteRangeResponse,
    LeaseGrantResponse, LeaseRevokeResponse, PutResponse, ResponseHeader, TxnResponse,
};
use etcdrs_proto::rpctypes;
use etcdrs_raftnode::eraftpb::{ConfChange, ConfChangeType, EntryType};
use etcdrs_raftnode::{
    Applied, Apply, NodeConfig, RaftNodeHandle, Start, StateMachine, task::TaskResult,
};
use futures::StreamExt;
use parking_lot::{Mutex, RwLock};
use prost::Message as _;
use protobuf_free::{
    decode_conf_change, decode_conf_change_v2, decode_conf_state, encode_conf_state,
};
use tokio::sync::{oneshot, watch};
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

use crate::apply;
use crate::compactor::Plan;
use crate::config::ServerConfig;
use crate::error::{Result, ServerError};
use crate::idgen::IdGenerator;
use crate::membership::{self, Member};
use crate::peer::PeerTransport;
use crate::request::{InternalRaftRequest, MemberAttributes, Op};

/// raft-rs messages are rust-protobuf types; these helpers keep that crate's API in one place.
mod protobuf_free {
    use etcdrs_raftnode::eraftpb::{ConfChange, ConfState};
    use protobuf::Message;

    pub(super) fn decode_conf_change(bytes: &[u8]) -> Option<ConfChange> {
        let mut change = ConfChange::default();
        change.merge_from_bytes(bytes).ok()?;
        Some(change)
    }

    pub(super) fn decode_conf_change_v2(
        bytes: &[u8],
    ) -> Option<etcdrs_raftnode::eraftpb::ConfChangeV2> {
        let mut change = etcdrs_raftnode::eraftpb::ConfChangeV2::default();
        change.merge_from_bytes(bytes).ok()?;
        Some(change)
    }

    pub(super) fn decode_conf_state(bytes: &[u8]) -> Option<ConfState> {
        let mut state = ConfState::default();
        state.merge_from_bytes(bytes).ok()?;
        Some(state)
    }

    pub(super) fn encode_conf_state(state: &ConfState) -> Vec<u8> {
        state.write_to_bytes().unwrap_or_default()
    }
}

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
const META_MEMBER_ID: &[u8] = b"memberID";
const META_CLUSTER_ID: &[u8] = b"clusterID";

struct Inner {
    config: ServerConfig,
    member_id: u64,
    cluster_id: u64,
    store: Arc<KvStore>,
    raft: RaftNodeHandle,
    waiters: Mutex<HashMap<u64, Waiter>>,
    applied: watch::Sender<u64>,
    ids: IdGenerator,
    members: RwLock<BTreeMap<u64, Member>>,
    alarms: RwLock<Vec<AlarmMember>>,
    published: AtomicBool,
    /// Set when this member's removal is applied: it must stop serving.
    removed: AtomicBool,
    /// Ids of members removed from the cluster: their peer messages are refused, which tells
    /// a removed member that missed its own removal to stop (etcd answers them 410 Gone).
    removed_members: RwLock<std::collections::HashSet<u64>>,
    removed_notify: tokio::sync::Notify,
    watch_hub: WatchHub,
    transport: Arc<PeerTransport>,
    /// A snapshot image received from the leader, waiting for raft to install it: (index, file).
    pending_snapshot: Mutex<Option<(u64, std::path::PathBuf)>>,
    /// Wakes the watch sync task when a watcher falls behind or starts from history.
    watch_sync: tokio::sync::Notify,
    leader_changes: AtomicU64,
    /// Changes when require-leader streams must end (see `leader`).
    leader_losses: tokio::sync::watch::Receiver<u64>,
    request_timeout: Duration,
    /// Users, roles, permissions and tokens.
    auth: crate::auth::AuthStore,
}

/// The member's core. Cheap to clone.
#[derive(Clone)]
pub struct EtcdServer {
    inner: Arc<Inner>,
}

impl EtcdServer {
    /// Open storage, start raft and the background tasks (on `tasks`, stopped by `shutdown`).
    pub async fn start(
        config: ServerConfig,
        tasks: &mut JoinSet<TaskResult>,
        shutdown: CancellationToken,
    ) -> Result<EtcdServer> {
        let fatal =
            |what: &str, e: &dyn std::fmt::Display| ServerError::Fatal(format!("{what}: {e}"));
        std::fs::create_dir_all(&config.data_dir).map_err(|e| fatal("create data dir", &e))?;
        let mut backend =
            Backend::open(&config.backend_path()).map_err(|e| fatal("open backend", &e))?;
        backend.set_batching(config.backend_batch_interval, config.backend_batch_limit);
        tracing::info!(path = %config.backend_path().display(), "opened backend db");
        let store = Arc::new(KvStore::open(backend, config.min_lease_ttl())?);

        let wal_dir = config.wal_dir();
        let wal_exists = etcdrs_wal::Wal::exists(&wal_dir);
        let mut remote_members: Vec<(u64, Vec<String>)> = Vec::new();
        let (member_id, cluster_id, start) = if wal_exists {
            let member_id = read_u64(store.meta(META_MEMBER_ID)?);
            let cluster_id = read_u64(store.meta(META_CLUSTER_ID)?);
            let conf_state = store
                .meta(META_CONF_STATE)?
                .and_then(|b| decode_conf_state(&b))
                .unwrap_or_default();
            tracing::info!(
                local_member_id = %membership::id_hex(member_id),
                commit_index = store.consistent_index(),
                "restarting local member"
            );
            let start = Start::Restart {
                applied: store.consistent_index(),
                conf_state,
                force_new_cluster: config.force_new_cluster,
            };
            (member_id, cluster_id, start)
        } else if config.new_cluster {
            bootstrap(&config, &store)?
        } else {
            let (member_id, cluster_id, start, remote) = join_existing(&config, &store).await?;
            remote_members = remote;
            (member_id, cluster_id, start)
        };
        let start_members = load_members(&store)?;
        let alarms = load_alarms(&store)?;
        let auth = crate::auth::AuthStore::load(&store, config.auth.clone())?;
        let transport = PeerTransport::new(member_id, cluster_id, shutdown.clone());
        let initial_peers: Vec<(u64, Vec<String>)> = if !remote_members.is_empty() {
            remote_members
        } else if start_members.is_empty() {
            // A new member: its peers are the initial cluster (their AddNode entries apply soon).
            config
                .initial_cluster
                .iter()
                .map(|(_, urls)| {
                    let urls: Vec<String> = urls.iter().map(url_string).collect();
                    (
                        membership::member_id(&urls, &config.initial_cluster_token),
                        urls,
                    )
                })
                .collect()
        } else {
            start_members
                .values()
                .map(|m| (m.id, m.peer_urls.clone()))
                .collect()
        };
        transport.set_peers(&initial_peers);

        let node_config = NodeConfig {
            id: member_id,
            wal_dir,
            tick_interval: config.heartbeat_interval,
            election_tick: config.election_ticks(),
            heartbeat_tick: 1,
            pre_vote: config.pre_vote,
            snapshot_count: config.snapshot_count,
            catch_up_entries: config.snapshot_catchup_entries.max(1),
            unsafe_no_fsync: config.unsafe_no_fsync,
        };
        let (raft, starter) = etcdrs_raftnode::start(
            node_config,
            start,
            transport.clone(),
            tasks,
            shutdown.clone(),
        )?;
        let request_timeout = Duration::from_secs(5) + 2 * config.election_timeout;
        let config_election_timeout = config.election_timeout;
        let leader_loss = etcdrs_serve::leader::LeaderLoss::default();
        let (applied, _) = watch::channel(store.consistent_index());
        let server = EtcdServer {
            inner: Arc::new(Inner {
                config,
                member_id,
                cluster_id,
                store: store.clone(),
                raft,
                waiters: Mutex::new(HashMap::new()),
                applied,
                ids: IdGenerator::new(member_id),
                members: RwLock::new(start_members),
                alarms: RwLock::new(alarms),
                published: AtomicBool::new(false),
                removed: AtomicBool::new(false),
                removed_members: RwLock::new(load_removed(&store)?),
                removed_notify: tokio::sync::Notify::new(),
                watch_hub: WatchHub::new(store.current_rev()),
                transport: transport.clone(),
                pending_snapshot: Mutex::new(None),
                watch_sync: tokio::sync::Notify::new(),
                leader_changes: AtomicU64::new(0),
                leader_losses: leader_loss.subscribe(),
                request_timeout,
                auth,
            }),
        };

        let removed = CancellationToken::new();
        transport.set_snapshot_source(store.clone(), server.inner.raft.clone(), removed.clone());
        let told = server.clone();
        let stop = shutdown.clone();
        tasks.spawn(async move {
            tokio::select! {
                _ = stop.cancelled() => {}
                _ = removed.cancelled() => {
                    told.removed_by_peer();
                    stop.cancelled().await;
                }
            }
            ("removal notice", Ok(()))
        });
        // The one writer is the raft thread itself: committed entries are applied inline.
        starter.start(Box::new(Applier {
            server: server.clone(),
            last_leader: 0,
        }));
        let lessor = server.clone();
        let stop = shutdown.clone();
        tasks.spawn(async move {
            lessor.run_lease_expiry(stop).await;
            ("lease expiry", Ok(()))
        });
        let watcher = server.clone();
        let stop = shutdown.clone();
        tasks.spawn(async move {
            tokio::select! {
                _ = stop.cancelled() => ("removal watch", Ok(())),
                _ = watcher.wait_removed() => (
                    "removal watch",
                    Err("the member has been permanently removed from the cluster".to_string()),
                ),
            }
        });
        if server.inner.config.corrupt_check_time > Duration::ZERO {
            let checker = server.clone();
            let stop = shutdown.clone();
            let interval = server.inner.config.corrupt_check_time;
            tasks.spawn(async move {
                crate::corrupt::run_periodic(checker, interval, stop).await;
                ("corruption check", Ok(()))
            });
        }
        let syncer = server.clone();
        let stop = shutdown.clone();
        tasks.spawn(async move {
            let result = syncer.run_watch_sync(stop).await;
            ("watch sync", result.map_err(|e| e.to_string()))
        });
        let compactor = server.clone();
        let stop = shutdown.clone();
        tasks.spawn(async move {
            compactor.run_auto_compaction(stop).await;
            ("auto compaction", Ok(()))
        });
        let observed = server.clone();
        let stop = shutdown.clone();
        let election = config_election_timeout;
        tasks.spawn(async move {
            let has_leader = move || etcdrs_serve::leader::LeaderSource::has_leader(&observed);
            leader_loss.monitor(election, has_leader, stop).await;
            ("leader monitor", Ok(()))
        });
        Ok(server)
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
        self.inner.raft.status()
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
            raft_term: self.inner.raft.status().term,
        }
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
        while !self.inner.published.load(AtomicOrdering::Acquire) {
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
        self.inner.published.store(true, AtomicOrdering::Release);
        self.inner.applied.send_modify(|_| {});
        tracing::info!(cluster_version = "3.5", "enabled capabilities for version");
        Ok(())
    }

    /// Wait until every write committed before this call is applied (ReadIndex).
    pub async fn linearizable_barrier(&self) -> Result<()> {
        // raft silently drops a read index that a new leader cannot serve yet; etcd retries
        // every 500 ms (`readIndexRetryTime`), and so do we, within the request timeout.
        let deadline = Instant::now() + self.inner.request_timeout;
        loop {
            let attempt =
                tokio::time::timeout(READ_INDEX_RETRY, self.inner.raft.read_index()).await;
            match attempt {
                Ok(Ok(index)) => return self.wait_applied(index).await,
                Ok(Err(etcdrs_raftnode::Error::ProposalDropped)) | Err(_) => {
                    if attempt.is_err() {
                        crate::metrics::SLOW_READ_INDEXES.inc();
                    }
                    if Instant::now() >= deadline {
                        crate::metrics::READ_INDEXES_FAILED.inc();
                        return Err(ServerError::Etcd(&rpctypes::TIMEOUT));
                    }
                    if attempt.is_ok() {
                        // No leader yet: wait a heartbeat before asking again.
                        tokio::time::sleep(self.inner.config.heartbeat_interval).await;
                    }
                }
                Ok(Err(e)) => {
                    crate::metrics::READ_INDEXES_FAILED.inc();
                    return Err(e.into());
                }
            }
        }
    }

    async fn wait_applied(&self, index: u64) -> Result<()> {
        let mut applied = self.inner.applied.subscribe();
        let wait = applied.wait_for(|applied| *applied >= index);
        match tokio::time::timeout(self.inner.request_timeout, wait).await {
            Ok(Ok(_)) => Ok(()),
            Ok(Err(_)) => Err(ServerError::Stopped),
            Err(_) => Err(ServerError::Etcd(&rpctypes::TIMEOUT)),
        }
    }

    /// Whether a write of about `cost` bytes fits the quota; raises the NOSPACE alarm when not.
    pub async fn check_quota(&self, cost: u64) -> Result<()> {
        if self.has_alarm(AlarmType::Nospace) {
            return Err(ServerError::Etcd(&rpctypes::NO_SPACE));
        }
        // etcd compares the file size; redb's file starts larger and grows in bigger steps than
        // bbolt's, so the quota is checked against the data actually stored.
        let size = self.inner.store.backend().size_in_use();
        if size.saturating_add(cost + KV_OVERHEAD) <= self.inner.config.quota_bytes() {
            return Ok(());
        }
        tracing::warn!(
            quota_size = self.inner.config.quota_bytes(),
            db_size = size,
            "database space exceeded; raising NOSPACE alarm"
        );
        let activate = AlarmRequest {
            action: AlarmAction::Activate as i32,
            member_id: self.inner.member_id,
            alarm: AlarmType::Nospace as i32,
        };
        let _ = self.propose(Op::Alarm(activate)).await;
        Err(ServerError::Etcd(&rpctypes::NO_SPACE))
    }

    fn has_alarm(&self, alarm: AlarmType) -> bool {
        self.inner
            .alarms
            .read()
            .iter()
            .any(|a| a.alarm == alarm as i32)
    }

    /// The auth store.
    pub fn auth(&self) -> &crate::auth::AuthStore {
        &self.inner.auth
    }

    /// Propose a request through raft and wait for its applied result.
    pub async fn propose(&self, op: Op) -> Result<ApplyOutput> {
        self.propose_as(op, None).await
    }

    /// Propose a request on behalf of `auth` (checked against its permissions when applied).
    /// An identity whose revision is live and that an auth change overtook between the check
    /// and the apply is proposed again under the new revision (etcd's `raftRequest` loop), at
    /// most [`MAX_AUTH_RETRIES`] times.
    pub async fn propose_as(
        &self,
        op: Op,
        auth: Option<&crate::auth::AuthInfo>,
    ) -> Result<ApplyOutput> {
        let Some(info) = auth.filter(|info| info.live) else {
            return self.propose_once(op, auth).await;
        };
        let mut info = info.clone();
        let mut tries = 0;
        loop {
            let outcome = self.propose_once(op.clone(), Some(&info)).await;
            let current = self.inner.auth.revision();
            match outcome {
                Err(ServerError::Etcd(e))
                    if *e == rpctypes::AUTH_OLD_REVISION
                        && current > info.revision
                        && tries < MAX_AUTH_RETRIES =>
                {
                    info.revision = current;
                    tries += 1;
                }
                outcome => return outcome,
            }
        }
    }

    async fn propose_once(
        &self,
        op: Op,
        auth: Option<&crate::auth::AuthInfo>,
    ) -> Result<ApplyOutput> {
        let status = self.inner.raft.status();
        if status.commit > status.applied + MAX_GAP_APPLY_COMMIT {
            return Err(ServerError::Etcd(&rpctypes::TOO_MANY_REQUESTS));
        }
        let id = self.inner.ids.next();
        let auth = auth.map(|info| crate::request::AuthHeader {
            username: info.username.clone(),
            auth_revision: info.revision,
        });
        let data = InternalRaftRequest {
            id,
            op: Some(op),
            auth,
        }
        .encode_to_vec();
        if data.len() as u64 > self.inner.config.max_request_bytes {
            return Err(ServerError::Etcd(&rpctypes::REQUEST_TOO_LARGE));
        }
        let (done, result) = oneshot::channel();
        self.inner.waiters.lock().insert(id, done);
        crate::metrics::PROPOSALS_PENDING.inc();
        let outcome = self.wait_proposal(id, data, result).await;
        crate::metrics::PROPOSALS_PENDING.dec();
        let failed = matches!(
            &outcome,
            Err(ServerError::Etcd(e)) if **e == rpctypes::TIMEOUT || **e == rpctypes::NO_LEADER
        );
        if failed {
            crate::metrics::PROPOSALS_FAILED.inc();
        }
        outcome
    }

    async fn wait_proposal(
        &self,
        id: u64,
        data: Vec<u8>,
        result: oneshot::Receiver<Result<ApplyOutput>>,
    ) -> Result<ApplyOutput> {
        let inner = self.inner.clone();
        let on_refused = move |e: etcdrs_raftnode::Error| {
            if let Some(waiter) = inner.waiters.lock().remove(&id) {
                let _ = waiter.send(Err(match e {
                    etcdrs_raftnode::Error::ProposalDropped => {
                        ServerError::Etcd(&rpctypes::NO_LEADER)
                    }
                    e => e.into(),
                }));
            }
        };
        if let Err(e) = self.inner.raft.propose(data, on_refused).await {
            self.inner.waiters.lock().remove(&id);
            return Err(e.into());
        }
        match tokio::time::timeout(self.inner.request_timeout, result).await {
            Ok(Ok(output)) => output,
            Ok(Err(_)) => Err(ServerError::Stopped),
            Err(_) => {
                self.inner.waiters.lock().remove(&id);
                Err(ServerError::Etcd(&rpctypes::TIMEOUT))
            }
        }
    }

    /// Propose a membership change through raft and wait until it is applied.
    async fn propose_conf_change(&self, mut change: ConfChange) -> Result<()> {
        // One membership change at a time: raft refuses a change while the previous one's
        // joint configuration has not been left.
        self.wait_not_joint().await?;
        let id = self.inner.ids.next();
        change.id = id;
        let (done, result) = oneshot::channel();
        self.inner.waiters.lock().insert(id, done);
        // The raft thread may hold the proposal back until the previous change is done; the
        // whole wait is bounded by the request timeout (a proposal given up is not made).
        let deadline = tokio::time::Instant::now() + self.inner.request_timeout;
        let proposed =
            tokio::time::timeout_at(deadline, self.inner.raft.propose_conf_change(change)).await;
        let failed = match proposed {
            Ok(Ok(())) => None,
            Ok(Err(etcdrs_raftnode::Error::ProposalDropped)) => {
                Some(ServerError::Etcd(&rpctypes::NO_LEADER))
            }
            Ok(Err(e)) => Some(e.into()),
            Err(_) => Some(ServerError::Etcd(&rpctypes::TIMEOUT)),
        };
        if let Some(e) = failed {
            self.inner.waiters.lock().remove(&id);
            return Err(e);
        }
        match tokio::time::timeout_at(deadline, result).await {
            Ok(Ok(output)) => output.map(|_| ()),
            Ok(Err(_)) => Err(ServerError::Stopped),
            Err(_) => {
                self.inner.waiters.lock().remove(&id);
                Err(ServerError::Etcd(&rpctypes::TIMEOUT))
            }
        }
    }

    /// Wait until the configuration is not joint (bounded by the request timeout).
    async fn wait_not_joint(&self) -> Result<()> {
        let deadline = Instant::now() + self.inner.request_timeout;
        while self.inner.raft.status().joint {
            if Instant::now() >= deadline {
                return Err(ServerError::Etcd(&rpctypes::TIMEOUT));
            }
            tokio::time::sleep(self.inner.config.heartbeat_interval / 4).await;
        }
        Ok(())
    }

    /// Add a member (etcd's MemberAdd): a voter, or a learner.
    pub async fn add_member(&self, peer_urls: Vec<String>, is_learner: bool) -> Result<Member> {
        {
            let members = self.inner.members.read();
            if members
                .values()
                .any(|m| m.peer_urls.iter().any(|u| peer_urls.contains(u)))
            {
                return Err(ServerError::Etcd(&rpctypes::PEER_URL_EXIST));
            }
            let learners = members.values().filter(|m| m.is_learner).count();
            if is_learner && learners >= self.inner.config.max_learners {
                return Err(ServerError::Etcd(&rpctypes::TOO_MANY_LEARNERS));
            }
            if !is_learner && self.inner.config.strict_reconfig_check {
                // etcd's strict reconfiguration check: the started voters must still form a
                // quorum of the grown cluster.
                let voters = members.values().filter(|m| !m.is_learner).count();
                let started = members
                    .values()
                    .filter(|m| !m.is_learner && !m.name.is_empty())
                    .count();
                let grown = voters + 1;
                // Growing a one-member cluster to two is allowed (restoring a cluster from
                // one member's data starts that way), as in etcd.
                let one_to_two = started == 1 && grown == 2;
                if !one_to_two && started < grown / 2 + 1 {
                    return Err(ServerError::Etcd(&rpctypes::MEMBER_NOT_ENOUGH_STARTED));
                }
            }
        }
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or(0);
        let seed = format!("{}{now}", self.inner.config.initial_cluster_token);
        let member = Member {
            id: membership::member_id(&peer_urls, &seed),
            name: String::new(),
            peer_urls,
            client_urls: Vec::new(),
            is_learner,
        };
        let mut change = ConfChange::default();
        change.set_change_type(if is_learner {
            ConfChangeType::AddLearnerNode
        } else {
            ConfChangeType::AddNode
        });
        change.node_id = member.id;
        change.context = serde_json::to_vec(&member)
            .map_err(|e| ServerError::Fatal(format!("encode member: {e}")))?
            .into();
        self.propose_conf_change(change).await?;
        Ok(member)
    }

    /// Remove a member (etcd's MemberRemove).
    pub async fn remove_member(&self, id: u64) -> Result<()> {
        if !self.inner.members.read().contains_key(&id) {
            return Err(ServerError::Etcd(&rpctypes::MEMBER_NOT_FOUND));
        }
        let mut change = ConfChange::default();
        change.set_change_type(ConfChangeType::RemoveNode);
        change.node_id = id;
        self.propose_conf_change(change).await
    }

    /// Promote a learner to a voter (etcd's MemberPromote), once it has caught up.
    pub async fn promote_member(&self, id: u64) -> Result<()> {
        let Some(mut member) = self.inner.members.read().get(&id).cloned() else {
            return Err(ServerError::Etcd(&rpctypes::MEMBER_NOT_FOUND));
        };
        if !member.is_learner {
            return Err(ServerError::Etcd(&rpctypes::MEMBER_NOT_LEARNER));
        }
        let status = self.inner.raft.status();
        if status.is_leader {
            // etcd's readiness rule: the learner's log matches at least 90% of the leader's.
            let leader_match = status.commit;
            let learner_match = status
                .matched
                .iter()
                .find(|(m, _)| *m == id)
                .map(|(_, matched)| *matched)
                .unwrap_or(0);
            if (learner_match as f64) < 0.9 * leader_match as f64 {
                crate::metrics::LEARNER_PROMOTE_FAILURES
                    .with_label_values(&[rpctypes::LEARNER_NOT_READY.message])
                    .inc();
                return Err(ServerError::Etcd(&rpctypes::LEARNER_NOT_READY));
            }
        }
        member.is_learner = false;
        let mut change = ConfChange::default();
        change.set_change_type(ConfChangeType::AddNode);
        change.node_id = id;
        change.context = serde_json::to_vec(&member)
            .map_err(|e| ServerError::Fatal(format!("encode member: {e}")))?
            .into();
        self.propose_conf_change(change).await?;
        if status.is_leader {
            crate::metrics::LEARNER_PROMOTE_SUCCESSES.inc();
        }
        Ok(())
    }

    /// Change a member's peer URLs (etcd's MemberUpdate).
    pub async fn update_member(&self, id: u64, peer_urls: Vec<String>) -> Result<()> {
        {
            let members = self.inner.members.read();
            if !members.contains_key(&id) {
                return Err(ServerError::Etcd(&rpctypes::MEMBER_NOT_FOUND));
            }
            if members
                .values()
                .any(|m| m.id != id && m.peer_urls.iter().any(|u| peer_urls.contains(u)))
            {
                return Err(ServerError::Etcd(&rpctypes::PEER_URL_EXIST));
            }
        }
        let update = crate::request::MemberPeerUrls {
            member_id: id,
            peer_urls,
        };
        self.propose(Op::UpdatePeerUrls(update)).await.map(|_| ())
    }

    /// Ask raft to move leadership to `to` (etcd's MoveLeader).
    pub async fn move_leader(&self, to: u64) -> Result<()> {
        let status = self.inner.raft.status();
        if !status.is_leader {
            return Err(ServerError::Etcd(&rpctypes::NOT_LEADER));
        }
        if !status.voters.contains(&to) {
            return Err(ServerError::Etcd(&rpctypes::BAD_LEADER_TRANSFEREE));
        }
        self.inner.raft.transfer_leader(to).await?;
        let deadline = Instant::now() + self.inner.request_timeout;
        while Instant::now() < deadline {
            if self.inner.raft.status().leader == to {
                return Ok(());
            }
            tokio::time::sleep(self.inner.config.heartbeat_interval).await;
        }
        Err(ServerError::Etcd(&rpctypes::TIMEOUT))
    }

    /// A fresh lease id (etcd picks one when the client asks for 0).
    pub fn new_lease_id(&self) -> i64 {
        loop {
            let id = (self.inner.ids.next() & (i64::MAX as u64)) as i64;
            if id != 0 && !self.inner.store.lessor().contains(id) {
                return id;
            }
        }
    }

    /// Where a snapshot image for raft index `index` is received.
    pub fn snapshot_receive_path(&self, index: u64) -> std::path::PathBuf {
        self.inner
            .config
            .backend_path()
            .with_file_name(format!("{index:016x}.snap.recv"))
    }

    /// The image for raft index `index` has arrived: raft may install it.
    pub fn snapshot_received(&self, index: u64, path: std::path::PathBuf) {
        let previous = self.inner.pending_snapshot.lock().replace((index, path));
        if let Some((_, old)) = previous {
            let _ = std::fs::remove_file(old);
        }
    }

    /// Replace the store with the leader's snapshot image for `index` (called by raft).
    fn install_snapshot(
        &self,
        index: u64,
        conf_state: &etcdrs_raftnode::eraftpb::ConfState,
    ) -> Result<()> {
        let Some((received, path)) = self.inner.pending_snapshot.lock().take() else {
            return Err(ServerError::Fatal(format!(
                "no snapshot image received for index {index}"
            )));
        };
        if received != index {
            let _ = std::fs::remove_file(&path);
            return Err(ServerError::Fatal(format!(
                "snapshot image is for index {received}, raft installs {index}"
            )));
        }
        let store = &self.inner.store;
        store.install_snapshot(&path, &[META_MEMBER_ID, META_CLUSTER_ID])?;
        let _ = std::fs::remove_file(&path);
        let mut batch = store.write()?;
        batch.bucket_put(
            Bucket::META,
            META_CONF_STATE,
            &encode_conf_state(conf_state),
        )?;
        batch.commit(true)?;
        *self.inner.members.write() = load_members(store)?;
        *self.inner.alarms.write() = load_alarms(store)?;
        self.inner.auth.reload(store)?;
        self.refresh_peers();
        self.inner.watch_hub.store_replaced(store.current_rev());
        self.inner.watch_sync.notify_one();
        self.inner.applied.send_replace(store.consistent_index());
        tracing::info!(
            index,
            revision = store.current_rev(),
            "restored backend from the leader's snapshot"
        );
        Ok(())
    }

    /// Apply one batch of committed entries and wake everyone waiting on it.
    fn apply_committed(&self, batch: Apply, last_leader: &mut u64) -> Result<Applied> {
        tracing::debug!(entries = batch.entries.len(), "applying batch");
        let (index, term, durable, results) = self.apply_batch(batch)?;
        // etcd promotes the lessor once the leader has applied an entry of its own term
        // (so every earlier term is applied): every lease restarts, extended by the
        // election timeout. A member that loses leadership stops expiring leases.
        let status = self.inner.raft.status();
        let lessor = self.inner.store.lessor();
        if status.is_leader && term == status.term && !lessor.is_primary() {
            lessor.promote(Instant::now(), self.inner.config.election_timeout);
        } else if !status.is_leader && lessor.is_primary() {
            lessor.demote();
        }
        for (id, output) in results {
            if let Some(waiter) = self.inner.waiters.lock().remove(&id) {
                let _ = waiter.send(output);
            }
        }
        if self.inner.removed.load(AtomicOrdering::Acquire) {
            tracing::warn!("the member has been permanently removed from the cluster");
            return Err(ServerError::Fatal(
                "the member has been permanently removed from the cluster".into(),
            ));
        }
        self.inner.applied.send_replace(index);
        if status.leader != *last_leader && status.leader != 0 {
            self.inner
                .leader_changes
                .fetch_add(1, AtomicOrdering::Relaxed);
            *last_leader = status.leader;
        }
        Ok(Applied {
            index,
            term,
            durable,
        })
    }

    #[allow(clippy::type_complexity)]
    fn apply_batch(
        &self,
        apply: Apply,
    ) -> Result<(u64, u64, bool, Vec<(u64, Result<ApplyOutput>)>)> {
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
                    let request = InternalRaftRequest::decode(entry.data.as_ref())
                        .map_err(|e| ServerError::Fatal(format!("decode raft request: {e}")))?;
                    let Some(op) = request.op else { continue };
                    let auth = request.auth.map(|h| crate::auth::AuthInfo {
                        username: h.username,
                        revision: h.auth_revision,
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
                        crate::metrics::observe_apply(metric, success, started.elapsed());
                    }
                    if let Err(ServerError::Mvcc(
                        e @ (etcdrs_mvcc::Error::Backend(_) | etcdrs_mvcc::Error::Corrupt(_)),
                    )) = &output
                    {
                        return Err(ServerError::Fatal(e.to_string()));
                    }
                    results.push((request.id, output));
                }
                EntryType::EntryConfChange => {
                    if let Some(change) = decode_conf_change(&entry.data) {
                        self.apply_conf_change(&mut batch, &change)?;
                        results.push((change.id, Ok(ApplyOutput::MembersChanged)));
                    }
                }
                EntryType::EntryConfChangeV2 => {
                    // Joint consensus: the context carries the proposer's request id and the
                    // member; the entry raft adds to leave the joint configuration has neither.
                    let Some(joint) = decode_conf_change_v2(&entry.data) else {
                        continue;
                    };
                    if joint.changes.is_empty() || joint.context.len() < 8 {
                        continue;
                    }
                    let mut id_bytes = [0u8; 8];
                    id_bytes.copy_from_slice(&joint.context[..8]);
                    let request_id = u64::from_be_bytes(id_bytes);
                    for single in joint.changes.iter() {
                        let mut change = ConfChange::default();
                        change.set_change_type(single.get_change_type());
                        change.node_id = single.node_id;
                        change.context = joint.context.slice(8..);
                        change.id = request_id;
                        self.apply_conf_change(&mut batch, &change)?;
                    }
                    results.push((request_id, Ok(ApplyOutput::MembersChanged)));
                }
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
        let (changes, durable) = batch.commit(false)?;
        // After the commit: a watcher that falls behind reads these events back from the store.
        if self.inner.watch_hub.notify(&changes, store.current_rev()) {
            self.inner.watch_sync.notify_one();
        }
        Ok((index, term, durable, results))
    }

    fn apply_conf_change(&self, batch: &mut WriteBatch<'_>, change: &ConfChange) -> Result<()> {
        match change.get_change_type() {
            ConfChangeType::AddNode | ConfChangeType::AddLearnerNode => {
                let member: Member = serde_json::from_slice(&change.context).map_err(|e| {
                    ServerError::Fatal(format!("decode member in conf change: {e}"))
                })?;
                let json = serde_json::to_vec(&member)
                    .map_err(|e| ServerError::Fatal(format!("encode member: {e}")))?;
                batch.bucket_put(Bucket::MEMBERS, &member.id.to_be_bytes(), &json)?;
                let promoted = self
                    .inner
                    .members
                    .read()
                    .get(&member.id)
                    .is_some_and(|m| m.is_learner && !member.is_learner);
                if promoted {
                    tracing::info!(promoted_member_id = %membership::id_hex(member.id), "promote member");
                } else {
                    tracing::info!(
                        added_peer_id = %membership::id_hex(member.id),
                        added_peer_peer_urls = ?member.peer_urls,
                        added_peer_is_learner = member.is_learner,
                        "added member"
                    );
                }
                self.inner.members.write().insert(member.id, member);
                self.refresh_peers();
            }
            ConfChangeType::RemoveNode => {
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
    fn refresh_peers(&self) {
        let peers: Vec<(u64, Vec<String>)> = self
            .inner
            .members
            .read()
            .values()
            .map(|m| (m.id, m.peer_urls.clone()))
            .collect();
        self.inner.transport.set_peers(&peers);
    }

    fn capped(&self) -> bool {
        self.has_alarm(AlarmType::Nospace)
    }

    fn apply_op(
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
        if self.has_alarm(AlarmType::Corrupt)
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
                let result = apply::put(&mut txn, &req);
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
                let result = apply::txn_write(&mut txn, store.lessor(), &req);
                txn.end();
                result.map(ApplyOutput::Txn)
            }
            Op::Compaction(req) => {
                let rev = apply::compact(batch, req.revision)?;
                tracing::info!(
                    compact_revision = req.revision,
                    "finished scheduled compaction"
                );
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
            Op::UpdatePeerUrls(update) => {
                let mut members = self.inner.members.write();
                if let Some(member) = members.get_mut(&update.member_id) {
                    member.peer_urls = update.peer_urls;
                    let json = serde_json::to_vec(&*member)
                        .map_err(|e| ServerError::Fatal(format!("encode member: {e}")))?;
                    batch.bucket_put(Bucket::MEMBERS, &member.id.to_be_bytes(), &json)?;
                    tracing::info!(updated_remote_peer_id = %membership::id_hex(member.id), "updated member");
                }
                drop(members);
                self.refresh_peers();
                Ok(ApplyOutput::MembersChanged)
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

    fn apply_alarm(&self, batch: &mut WriteBatch<'_>, req: AlarmRequest) -> Result<AlarmResponse> {
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

    /// Hand a raft message from a peer to the raft node.
    pub async fn raft_step(&self, message: etcdrs_raftnode::eraftpb::Message) -> Result<()> {
        Ok(self.inner.raft.step(message).await?)
    }

    /// A client for member `id`'s peer service.
    pub fn peer_client(
        &self,
        id: u64,
    ) -> Option<etcdrs_proto::peerpb::peer_client::PeerClient<tonic::transport::Channel>> {
        self.inner.transport.client(id)
    }

    /// Stamp a peer request with this member's cluster and member ids.
    pub fn stamp_peer_request<T>(&self, request: &mut tonic::Request<T>) {
        self.inner.transport.stamp(request);
    }

    /// The watch hub.
    pub fn watch_hub(&self) -> &WatchHub {
        &self.inner.watch_hub
    }

    /// Ask the watch sync task to run a round soon.
    pub fn wake_watch_sync(&self) {
        self.inner.watch_sync.notify_one();
    }

    /// Catch up watchers that are behind, from the store's history (etcd's `syncWatchersLoop`).
    async fn run_watch_sync(&self, shutdown: CancellationToken) -> Result<()> {
        let mut ticker = tokio::time::interval(Duration::from_millis(100));
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = shutdown.cancelled() => return Ok(()),
                _ = ticker.tick() => {}
                _ = self.inner.watch_sync.notified() => {}
            }
            // Keep going while rounds make progress, up to a bound per wake-up.
            for _ in 0..16 {
                let hub = &self.inner.watch_hub;
                if !hub.has_unsynced() {
                    break;
                }
                let outcome = tokio::task::block_in_place(|| hub.sync_round(&self.inner.store))?;
                if outcome.behind == 0 || outcome.advanced == 0 {
                    break;
                }
                tokio::task::yield_now().await;
            }
        }
    }

    async fn run_lease_expiry(&self, shutdown: CancellationToken) {
        let mut ticker = tokio::time::interval(Duration::from_millis(500));
        loop {
            tokio::select! {
                _ = shutdown.cancelled() => return,
                _ = ticker.tick() => {}
            }
            if !self.inner.raft.status().is_leader {
                continue;
            }
            let expired = self.inner.store.lessor().expired(Instant::now(), 500);
            futures::stream::iter(expired)
                .for_each_concurrent(16, |id| async move {
                    let revoke = etcdrs_proto::etcdserverpb::LeaseRevokeRequest { id };
                    match self.propose(Op::LeaseRevoke(revoke)).await {
                        Ok(_) => crate::metrics::LEASES_EXPIRED.inc(),
                        Err(ServerError::Etcd(_)) => {}
                        Err(e) => {
                            tracing::warn!(lease_id = id, error = %e, "failed to revoke expired lease")
                        }
                    }
                })
                .await;
        }
    }

    async fn run_auto_compaction(&self, shutdown: CancellationToken) {
        let mut plan = Plan::new(self.inner.config.auto_compaction, Instant::now());
        let Some(interval) = plan.interval() else {
            shutdown.cancelled().await;
            return;
        };
        let mode = match plan {
            Plan::Periodic(_) => "periodic",
            _ => "revision",
        };
        let mut ticker = tokio::time::interval(interval);
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = shutdown.cancelled() => return,
                _ = ticker.tick() => {}
            }
            let Some(revision) = plan.tick(Instant::now(), self.inner.store.current_rev()) else {
                continue;
            };
            if !self.inner.raft.status().is_leader {
                continue;
            }
            tracing::info!(revision, "starting auto {mode} compaction");
            let request = etcdrs_proto::etcdserverpb::CompactionRequest {
                revision,
                physical: false,
            };
            match self.propose(Op::Compaction(request)).await {
                Ok(_) | Err(ServerError::Mvcc(etcdrs_mvcc::Error::Compacted { .. })) => {
                    tracing::info!(revision, "completed auto {mode} compaction");
                    plan.succeeded(revision, Instant::now());
                }
                Err(e) => tracing::warn!(revision, error = %e, "failed auto {mode} compaction"),
            }
        }
    }
}

/// The server's state machine, called by the raft thread.
struct Applier {
    server: EtcdServer,
    last_leader: u64,
}

impl StateMachine for Applier {
    fn apply(&mut self, batch: Apply) -> std::result::Result<Applied, String> {
        self.server
            .apply_committed(batch, &mut self.last_leader)
            .map_err(|e| e.to_string())
    }

    fn restore(
        &mut self,
        index: u64,
        _term: u64,
        conf_state: &etcdrs_raftnode::eraftpb::ConfState,
    ) -> std::result::Result<(), String> {
        self.server
            .install_snapshot(index, conf_state)
            .map_err(|e| e.to_string())
    }
}

fn alarm_key(member_id: u64, alarm: i32) -> Vec<u8> {
    let mut key = member_id.to_be_bytes().to_vec();
    key.extend_from_slice(&alarm.to_be_bytes());
    key
}

fn read_u64(bytes: Option<Vec<u8>>) -> u64 {
    bytes
        .and_then(|b| <[u8; 8]>::try_from(b.as_slice()).ok())
        .map(u64::from_be_bytes)
        .unwrap_or(0)
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

fn bootstrap(config: &ServerConfig, store: &KvStore) -> Result<(u64, u64, Start)> {
    let mut members = Vec::new();
    for (name, urls) in &config.initial_cluster {
        let peer_urls: Vec<String> = urls.iter().map(url_string).collect();
        let id = membership::member_id(&peer_urls, &config.initial_cluster_token);
        members.push(Member {
            id,
            name: name.clone(),
            peer_urls,
            client_urls: Vec::new(),
            is_learner: false,
        });
    }
    let Some(local) = members.iter().find(|m| m.name == config.name) else {
        return Err(ServerError::Fatal(format!(
            "couldn't find local name {:?} in the initial cluster configuration",
            config.name
        )));
    };
    // etcd refuses a member whose advertised peer URLs are not the ones the initial cluster
    // lists for it: the other members would dial somewhere else.
    let mut advertised: Vec<String> = config
        .initial_advertise_peer_urls
        .iter()
        .map(url_string)
        .collect();
    advertised.sort();
    let mut listed = local.peer_urls.clone();
    listed.sort();
    if advertised != listed {
        return Err(ServerError::Fatal(format!(
            "--initial-cluster has {}={} but missing from --initial-advertise-peer-urls={} (resolved urls: \"{}\" != \"{}\")",
            config.name,
            local.peer_urls.join(","),
            advertised.join(","),
            advertised.join(","),
            listed.join(","),
        )));
    }
    let member_id = local.id;
    let ids: Vec<u64> = members.iter().map(|m| m.id).collect();
    let cluster_id = membership::cluster_id(&ids);
    tracing::info!(
        local_member_id = %membership::id_hex(member_id),
        cluster_id = %membership::id_hex(cluster_id),
        "starting local member"
    );
    let mut batch = store.write()?;
    batch.bucket_put(Bucket::META, META_MEMBER_ID, &member_id.to_be_bytes())?;
    batch.bucket_put(Bucket::META, META_CLUSTER_ID, &cluster_id.to_be_bytes())?;
    batch.commit(true)?;
    let mut peers = Vec::new();
    for member in &members {
        let context = serde_json::to_vec(member)
            .map_err(|e| ServerError::Fatal(format!("encode member: {e}")))?;
        peers.push((member.id, context));
    }
    let mut metadata = member_id.to_be_bytes().to_vec();
    metadata.extend_from_slice(&cluster_id.to_be_bytes());
    Ok((member_id, cluster_id, Start::New { metadata, peers }))
}

/// Join an existing cluster (`--initial-cluster-state=existing`): ask the other members of
/// `--initial-cluster` who is in the cluster, find this member among them by its advertised
/// peer URLs (it must have been added with MemberAdd first), and start with an empty log.
async fn join_existing(
    config: &ServerConfig,
    store: &KvStore,
) -> Result<(u64, u64, Start, Vec<(u64, Vec<String>)>)> {
    let ours: Vec<String> = config
        .initial_advertise_peer_urls
        .iter()
        .map(url_string)
        .collect();
    let mut last_error = String::from("no other member in --initial-cluster");
    let mut found = None;
    for (name, urls) in &config.initial_cluster {
        if *name == config.name {
            continue;
        }
        for url in urls {
            let Ok(mut client) = crate::peer::peer_client(&url_string(url)) else {
                continue;
            };
            let call = client.members(etcdrs_proto::peerpb::MembersRequest {});
            match tokio::time::timeout(Duration::from_secs(2), call).await {
                Ok(Ok(resp)) => {
                    found = Some(resp.into_inner());
                    break;
                }
                Ok(Err(e)) => last_error = e.message().to_string(),
                Err(_) => last_error = format!("timed out asking {url}"),
            }
        }
        if found.is_some() {
            break;
        }
    }
    let Some(remote) = found else {
        return Err(ServerError::Fatal(format!(
            "cannot fetch cluster info from peer urls: {last_error}"
        )));
    };
    let Some(local) = remote
        .members
        .iter()
        .find(|m| m.peer_ur_ls.iter().any(|u| ours.contains(u)))
    else {
        return Err(ServerError::Fatal(format!(
            "error validating peerURLs: no member with peer URLs {ours:?} in the existing cluster (add it with member add first)"
        )));
    };
    let member_id = local.id;
    let cluster_id = remote.cluster_id;
    tracing::info!(
        local_member_id = %membership::id_hex(member_id),
        cluster_id = %membership::id_hex(cluster_id),
        "joining existing cluster"
    );
    let mut batch = store.write()?;
    batch.bucket_put(Bucket::META, META_MEMBER_ID, &member_id.to_be_bytes())?;
    batch.bucket_put(Bucket::META, META_CLUSTER_ID, &cluster_id.to_be_bytes())?;
    batch.commit(true)?;
    let mut metadata = member_id.to_be_bytes().to_vec();
    metadata.extend_from_slice(&cluster_id.to_be_bytes());
    let peers = remote
        .members
        .iter()
        .map(|m| (m.id, m.peer_ur_ls.clone()))
        .collect();
    Ok((member_id, cluster_id, Start::Join { metadata }, peers))
}

/// The auth change an entry carries, or the entry back when it is something else.
fn auth_change(op: Op) -> std::result::Result<crate::auth::AuthChange, Op> {
    use crate::auth::AuthChange;
    Ok(match op {
        Op::AuthEnable(_) => AuthChange::Enable,
        Op::AuthDisable(_) => AuthChange::Disable,
        Op::Authenticate(req) => AuthChange::Authenticate {
            name: req.name,
            token_prefix: req.simple_token,
        },
        Op::UserAdd(req) => AuthChange::UserAdd(req),
        Op::UserDelete(req) => AuthChange::UserDelete(req.name),
        Op::UserChangePassword(req) => AuthChange::UserChangePassword(req),
        Op::UserGrantRole(req) => AuthChange::UserGrantRole(req),
        Op::UserRevokeRole(req) => AuthChange::UserRevokeRole(req),
        Op::RoleAdd(req) => AuthChange::RoleAdd(req.name),
        Op::RoleDelete(req) => AuthChange::RoleDelete(req.role),
        Op::RoleGrantPermission(req) => AuthChange::RoleGrantPermission(req),
        Op::RoleRevokePermission(req) => AuthChange::RoleRevokePermission(req),
        other => return Err(other),
    })
}

fn load_members(store: &KvStore) -> Result<BTreeMap<u64, Member>> {
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

fn load_removed(store: &KvStore) -> Result<std::collections::HashSet<u64>> {
    let read = store.backend().read().map_err(etcdrs_mvcc::Error::from)?;
    let mut removed = std::collections::HashSet::new();
    read.for_each_in(Bucket::MEMBERS_REMOVED, &[], None, |key, _| {
        if let Ok(id) = <[u8; 8]>::try_from(key) {
            removed.insert(u64::from_be_bytes(id));
        }
        true
    })
    .map_err(etcdrs_mvcc::Error::from)?;
    Ok(removed)
}

fn load_alarms(store: &KvStore) -> Result<Vec<AlarmMember>> {
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

impl etcdrs_serve::leader::LeaderSource for EtcdServer {
    fn has_leader(&self) -> bool {
        self.inner.raft.status().leader != 0
    }

    fn losses(&self) -> tokio::sync::watch::Receiver<u64> {
        self.inner.leader_losses.clone()
    }
}
