//! The member's state machine standing alone: the server's own applier over a store, with no
//! raft node, listener or peer link, for callers that drive `raftnode::Node` themselves (the
//! deterministic simulator, `crates/sim`). What a member's request side does around it
//! (registering a waiter before proposing, handing over a received snapshot image, choosing
//! the raft start from the store) is what this handle offers, each through the same code the
//! server runs.

use std::sync::Arc;

use etcdrs_mvcc::KvStore;
use etcdrs_raftnode::{Start, StateMachine};
use etcdrs_schema::layout::Layout;
use etcdrs_schema::membership::Member;
use tokio::sync::oneshot;
use tokio_util::sync::CancellationToken;

use super::applier::Applier;
use super::bootstrap::{new_cluster_start, restart_start, wal_metadata};
use super::{ApplyOutput, Inner};
use crate::config::ServerConfig;
use crate::error::{Result, ServerError};
use crate::etcd_server::peer_host::{PeerTransport, transport_config};

/// One member's applied state without its server: build it with [`StandaloneMember::open`],
/// hand the state machine it returns to a `raftnode::Node`, and register a waiter
/// ([`StandaloneMember::wait`]) before proposing a request whose answer matters.
pub struct StandaloneMember {
    inner: Arc<Inner>,
    /// The peer transport wants a runtime to spawn links on; its links never start here (no
    /// member is handed to its `Starter`), and this runtime is never driven.
    _runtime: tokio::runtime::Runtime,
}

impl StandaloneMember {
    /// The state of member `member_id` of cluster `cluster_id` as `store` holds it, and the
    /// applier that changes it (the `StateMachine` the raft node calls).
    pub fn open(
        config: ServerConfig,
        member_id: u64,
        cluster_id: u64,
        store: Arc<KvStore>,
    ) -> Result<(StandaloneMember, Box<dyn StateMachine>)> {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .build()
            .map_err(|e| ServerError::Fatal(format!("runtime: {e}")))?;
        let transport = {
            let _entered = runtime.enter();
            PeerTransport::new(
                transport_config(
                    &config,
                    member_id,
                    cluster_id,
                    etcdrs_rafthttp::PeerClient::new(None),
                ),
                CancellationToken::new(),
            )
            .0
        };
        let layout = Layout::resolve(&config.data_dir, config.wal_dir.as_deref());
        let inner = Arc::new(Inner::load(
            config, layout, member_id, cluster_id, store, transport,
        )?);
        let applier = Applier {
            inner: inner.clone(),
            last_leader: 0,
            unflushed: Default::default(),
        };
        let member = StandaloneMember {
            inner,
            _runtime: runtime,
        };
        Ok((member, Box::new(applier)))
    }

    /// A new cluster of `members`' raft start (their `AddNode` entries), as the server
    /// bootstraps one.
    pub fn new_cluster(members: Vec<Member>, member_id: u64, cluster_id: u64) -> Result<Start> {
        new_cluster_start(members, member_id, cluster_id)
    }

    /// The raft start of a member added to a running cluster: an empty log that the leader
    /// fills, as the server joins one.
    pub fn join(member_id: u64, cluster_id: u64) -> Start {
        Start::Join {
            metadata: wal_metadata(member_id, cluster_id),
        }
    }

    /// The raft start of a restart from what the store holds, as the server restarts.
    pub fn restart(&self) -> Result<Start> {
        restart_start(&self.inner.store, false)
    }

    /// The store.
    pub fn store(&self) -> &Arc<KvStore> {
        &self.inner.store
    }

    /// Register for the answer to the request with id `id` (its header's id); the applier
    /// answers when the entry applies on this member.
    pub fn wait(&self, id: u64) -> oneshot::Receiver<Result<ApplyOutput>> {
        let (done, answer) = oneshot::channel();
        self.inner.waiters.lock().insert(id, done);
        answer
    }

    /// The snapshot image for raft index `index` has arrived, as the peer handler hands it
    /// over: raft may install it.
    pub fn snapshot_received(&self, index: u64, path: std::path::PathBuf) {
        self.inner.snapshot_received(index, path);
    }

    /// The watch hub the applier tells of every applied batch (the server's watch streams
    /// read from it).
    pub fn watch_hub(&self) -> &etcdrs_mvcc::WatchHub {
        &self.inner.watch_hub
    }

    /// A probe of the applied auth state, for a caller beside the applier: whether `user` may
    /// write (`write`) or read `key` now, under the store's current auth revision, as a
    /// request of a live session is checked (anyone may while auth is off).
    pub fn auth_probe(&self) -> impl Fn(&str, &[u8], bool) -> bool + Send + Sync + 'static {
        let inner = self.inner.clone();
        move |user: &str, key: &[u8], write: bool| {
            let info = crate::auth::AuthInfo {
                username: user.to_owned(),
                revision: inner.auth.revision(),
                live: true,
            };
            inner.auth.check_range(Some(&info), key, &[], write).is_ok()
        }
    }

    /// The applied auth state: whether auth is on, and its revision.
    pub fn auth_state(&self) -> (bool, u64) {
        (self.inner.auth.is_enabled(), self.inner.auth.revision())
    }

    /// The members as applied.
    pub fn members(&self) -> Vec<Member> {
        self.inner.members.read().values().cloned().collect()
    }
}
