//! Starting a member (etcd's `NewServer` and `EtcdServer.Start`), in phases whose types carry
//! the order, each consuming the one before:
//!
//! 1. [`Storage::open`]: the data directory made, etcd's layout converted if it is one, where
//!    storage lives resolved (once, after the conversion), the backend and the store opened,
//!    and a WAL required where the backend has applied entries;
//! 2. [`Storage::identify`]: who this member is and how raft starts: a restart (ids from the
//!    backend), a new cluster, or a join (asking the peers for the membership);
//! 3. [`Identity::run`]: the transport built and given its peers before raft can send into
//!    it, the member's state loaded, raft started with the applier, then the transport's
//!    links started with the host they deliver to (nothing arrives before it exists);
//! 4. [`Started::spawn_tasks`]: the background tasks (removal, lease expiry and checkpoints,
//!    backend commits, corruption checks, watch sync, compaction, version and leader monitors).

use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::time::Duration;

use etcdrs_backend::Backend;
use etcdrs_mvcc::KvStore;
use etcdrs_rafthttp::PeerClient;
use etcdrs_raftnode::{NodeConfig, Start, task::TaskResult};
use etcdrs_schema::keys::{META_CLUSTER_ID, META_MEMBER_ID};
use etcdrs_schema::layout::Layout;
use etcdrs_schema::load::{load_members, read_u64};
use etcdrs_schema::membership;
use etcdrs_serve::leader::LeaderLoss;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

use super::applier::Applier;
use super::bootstrap::{bootstrap, join_existing, restart_start};
use super::peer_host::{PeerHost, PeerTransport, peer_client, transport_config};
use super::{Core, EtcdServer, Inner, corrupt, remove_received_snapshots, url_string};
use crate::config::ServerConfig;
use crate::error::{Result, ServerError};
use crate::idgen::IdGenerator;

/// A member's storage, open: the first phase.
pub(super) struct Storage {
    config: ServerConfig,
    layout: Layout,
    store: Arc<KvStore>,
    /// Whether the member has a WAL (it restarts) or not (it bootstraps or joins).
    wal_exists: bool,
}

/// Who the member is and how its raft starts: the second phase.
pub(super) struct Identity {
    storage: Storage,
    peer_client: PeerClient,
    member_id: u64,
    cluster_id: u64,
    start: Start,
    /// The membership a joining member was told by its peers (empty otherwise).
    remote_members: Vec<(u64, Vec<String>)>,
}

/// The member running, its tasks not yet spawned: the third phase.
pub(super) struct Started {
    server: EtcdServer,
    /// Cancelled when a peer says this member was removed.
    removed: CancellationToken,
    leader_loss: LeaderLoss,
    election_timeout: Duration,
}

impl Storage {
    pub(super) fn open(config: ServerConfig) -> Result<Storage> {
        let fatal =
            |what: &str, e: &dyn std::fmt::Display| ServerError::Fatal(format!("{what}: {e}"));
        etcdrs_backend::create_dir_all_synced(&config.data_dir)
            .map_err(|e| fatal("create data dir", &e))?;
        crate::convert::convert_if_etcd(&config.data_dir, config.wal_dir.as_deref())?;
        // Where storage lives is settled now that a conversion had its chance to run.
        let layout = Layout::resolve(&config.data_dir, config.wal_dir.as_deref());
        let mut backend =
            Backend::open(&layout.backend_path).map_err(|e| fatal("open backend", &e))?;
        remove_received_snapshots(&layout.backend_path);
        backend.set_batching(config.backend_batch_interval, config.backend_batch_limit);
        tracing::info!(path = %layout.backend_path.display(), "opened backend db");
        let store = Arc::new(KvStore::open(backend, config.min_lease_ttl())?);

        let wal_dir = layout.wal_dir.clone();
        let wal_exists = etcdrs_wal::Wal::exists(&wal_dir);
        // A backend that applied entries has a WAL they came from; without it (an operator
        // removed `member/wal`) bootstrapping would start a new member's log over the old
        // data, whose consistent index then hides the new entries. etcd 3.5 starts anyway;
        // we refuse, as etcd refuses a WAL without its database file. A restored snapshot
        // (`etcd snapshot restore`) has no consistent index and bootstraps as before.
        if !wal_exists && store.consistent_index() > 0 {
            return Err(ServerError::Fatal(format!(
                "database file ({} index {}) holds applied entries but the WAL directory ({}) has no WAL; \
                 refusing to start a new member over them (put the WAL back, or remove the data directory {} \
                 to join the cluster as a new member)",
                layout.backend_path.display(),
                store.consistent_index(),
                wal_dir.display(),
                config.data_dir.display()
            )));
        }
        Ok(Storage {
            config,
            layout,
            store,
            wal_exists,
        })
    }

    pub(super) async fn identify(self) -> Result<Identity> {
        let Storage {
            config,
            store,
            wal_exists,
            ..
        } = &self;
        let wal_exists = *wal_exists;
        let peer_client = peer_client(config)?;
        let mut remote_members: Vec<(u64, Vec<String>)> = Vec::new();
        let (member_id, cluster_id, start) = if wal_exists {
            let member_id = read_u64(store.meta(META_MEMBER_ID)?);
            let cluster_id = read_u64(store.meta(META_CLUSTER_ID)?);
            tracing::info!(
                local_member_id = %membership::id_hex(member_id),
                commit_index = store.consistent_index(),
                "restarting local member"
            );
            let start = restart_start(store, config.force_new_cluster)?;
            (member_id, cluster_id, start)
        } else if config.new_cluster {
            bootstrap(config, store)?
        } else {
            let (member_id, cluster_id, start, remote) =
                join_existing(config, store, &peer_client).await?;
            remote_members = remote;
            (member_id, cluster_id, start)
        };
        Ok(Identity {
            storage: self,
            peer_client,
            member_id,
            cluster_id,
            start,
            remote_members,
        })
    }
}

impl Identity {
    pub(super) fn run(
        self,
        tasks: &mut JoinSet<TaskResult>,
        shutdown: &CancellationToken,
    ) -> Result<Started> {
        let Identity {
            storage:
                Storage {
                    config,
                    layout,
                    store,
                    ..
                },
            peer_client,
            member_id,
            cluster_id,
            start,
            remote_members,
        } = self;
        let start_members = load_members(&store)?;
        // Raft may send into the transport from its start; the links run once the member
        // they deliver to exists (`links.start` below).
        let (transport, links) = PeerTransport::new(
            transport_config(&config, member_id, cluster_id, peer_client),
            shutdown.clone(),
        );
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
            wal_dir: layout.wal_dir.clone(),
            tick_interval: config.heartbeat_interval,
            election_tick: config.election_ticks(),
            heartbeat_tick: 1,
            pre_vote: config.pre_vote,
            snapshot_count: config.snapshot_count,
            catch_up_entries: config.snapshot_catchup_entries.max(1),
            unsafe_no_fsync: config.unsafe_no_fsync,
        };
        let request_timeout = Duration::from_secs(5) + 2 * config.election_timeout;
        let config_election_timeout = config.election_timeout;
        let leader_loss = etcdrs_serve::leader::LeaderLoss::default();
        let inner = Arc::new(Inner::load(
            config,
            layout,
            member_id,
            cluster_id,
            store.clone(),
            transport.clone(),
        )?);
        // The one writer is the raft thread itself: committed entries are applied inline.
        let applier = Applier {
            inner: inner.clone(),
            last_leader: 0,
            unflushed: Default::default(),
        };
        let raft = etcdrs_raftnode::start(
            node_config,
            start,
            transport.clone(),
            Box::new(applier),
            tasks,
            shutdown.clone(),
        )?;
        let removed = CancellationToken::new();
        let peer_link = links.start(Arc::new(PeerHost {
            inner: Arc::downgrade(&inner),
            raft: raft.clone(),
            removed: removed.clone(),
        }));
        let server = EtcdServer {
            inner,
            core: Arc::new(Core {
                raft,
                peer_link,
                ids: IdGenerator::new(member_id),
                version_decision: tokio::sync::Mutex::new(()),
                published: AtomicBool::new(false),
                leader_losses: leader_loss.subscribe(),
                request_timeout,
            }),
        };
        Ok(Started {
            server,
            removed,
            leader_loss,
            election_timeout: config_election_timeout,
        })
    }
}

impl Started {
    pub(super) fn spawn_tasks(
        self,
        tasks: &mut JoinSet<TaskResult>,
        shutdown: &CancellationToken,
    ) -> EtcdServer {
        let Started {
            server,
            removed,
            leader_loss,
            election_timeout: config_election_timeout,
        } = self;
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
        let lessor = server.clone();
        let stop = shutdown.clone();
        tasks.spawn(async move {
            lessor.run_lease_expiry(stop).await;
            ("lease expiry", Ok(()))
        });
        let committer = server.clone();
        let stop = shutdown.clone();
        tasks.spawn(async move { ("backend commit", committer.run_backend_commit(stop).await) });
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
        if server.inner.config.lease_checkpoint {
            let checkpointer = server.clone();
            let stop = shutdown.clone();
            let interval = server.inner.config.lease_checkpoint_interval;
            tasks.spawn(async move {
                checkpointer.run_lease_checkpoints(interval, stop).await;
                ("lease checkpoints", Ok(()))
            });
        }
        if server.inner.config.corrupt_check_time > Duration::ZERO {
            let checker = server.clone();
            let stop = shutdown.clone();
            let interval = server.inner.config.corrupt_check_time;
            tasks.spawn(async move {
                corrupt::run_periodic(checker, interval, stop).await;
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
        let compactor = server.clone();
        let stop = shutdown.clone();
        tasks.spawn(async move {
            let result = compactor.run_physical_compaction(stop).await;
            ("physical compaction", result)
        });
        let monitor = server.clone();
        let stop = shutdown.clone();
        tasks.spawn(async move {
            monitor.run_version_monitor(stop).await;
            ("version monitor", Ok(()))
        });
        let observed = server.clone();
        let stop = shutdown.clone();
        let election = config_election_timeout;
        tasks.spawn(async move {
            let has_leader = move || etcdrs_serve::leader::LeaderSource::has_leader(&observed);
            leader_loss.monitor(election, has_leader, stop).await;
            ("leader monitor", Ok(()))
        });
        server
    }
}
