//! The server's configuration: plain data, built by the `etcd` binary from flags,
//! environment and config file, validated here.

use std::path::PathBuf;
use std::time::Duration;

use url::Url;

/// When history is compacted automatically (etcd's `--auto-compaction-*`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum AutoCompaction {
    /// Never.
    #[default]
    Off,
    /// Keep this much time of history (etcd's periodic mode).
    Periodic(Duration),
    /// Keep this many revisions of history (etcd's revision mode).
    Revision(u64),
}

/// Everything the server needs to start.
#[derive(Clone, Debug)]
pub struct ServerConfig {
    /// Member name (`--name`).
    pub name: String,
    /// Data directory (`--data-dir`).
    pub data_dir: PathBuf,
    /// WAL directory (`--wal-dir`); `<data-dir>/member/wal` when None.
    pub wal_dir: Option<PathBuf>,
    /// URLs to serve clients on.
    pub listen_client_urls: Vec<Url>,
    /// `--listen-client-http-urls`: where the HTTP endpoints are served instead of on
    /// `listen_client_urls` (etcd 3.5).
    pub listen_client_http_urls: Vec<Url>,
    /// Client URLs advertised to the cluster.
    pub advertise_client_urls: Vec<Url>,
    /// URLs to listen on for peers.
    pub listen_peer_urls: Vec<Url>,
    /// Peer URLs advertised to the cluster.
    pub initial_advertise_peer_urls: Vec<Url>,
    /// The initial cluster: member name and peer URLs.
    pub initial_cluster: Vec<(String, Vec<Url>)>,
    /// Cluster token (`--initial-cluster-token`).
    pub initial_cluster_token: String,
    /// Whether the cluster is new (`--initial-cluster-state=new`).
    pub new_cluster: bool,
    /// Backend quota in bytes; 0 means etcd's default (2 GiB).
    pub quota_backend_bytes: u64,
    /// Largest request accepted, bytes.
    pub max_request_bytes: u64,
    /// Most operations in one txn.
    pub max_txn_ops: usize,
    /// Automatic compaction.
    pub auto_compaction: AutoCompaction,
    /// Raft tick (`--heartbeat-interval`).
    pub heartbeat_interval: Duration,
    /// Election timeout (`--election-timeout`).
    pub election_timeout: Duration,
    /// Applied entries between WAL snapshot marks (`--snapshot-count`).
    pub snapshot_count: u64,
    /// Pre-vote (`--pre-vote`).
    pub pre_vote: bool,
    /// Log entries kept after a snapshot for slow followers
    /// (`--experimental-snapshot-catchup-entries`).
    pub snapshot_catchup_entries: u64,
    /// Extra URLs serving only `/metrics` and `/health` (`--listen-metrics-urls`).
    pub listen_metrics_urls: Vec<Url>,
    /// How often idle watchers that asked for progress notifications get one
    /// (`--experimental-watch-progress-notify-interval`).
    pub watch_progress_notify_interval: Duration,
    /// TLS of the client port (`--cert-file`, ...); used by `https` client URLs.
    pub client_tls: Option<crate::tls::TlsInfo>,
    /// TLS of the peer port (`--peer-cert-file`, ...); used by `https` peer URLs, both to
    /// serve and to dial.
    pub peer_tls: Option<crate::tls::TlsInfo>,
    /// Authentication settings (`--auth-token`, `--bcrypt-cost`, `--auth-token-ttl`).
    pub auth: crate::auth::AuthConfig,
    /// `--strict-reconfig-check`: a voter is added only while the started voters would still
    /// form a quorum of the grown cluster.
    pub strict_reconfig_check: bool,
    /// `--experimental-max-learners` (etcd 3.5; 3.4 allows one).
    pub max_learners: usize,
    /// `--force-new-cluster`: a restarting member drops every other member (recovery from a
    /// lost quorum).
    pub force_new_cluster: bool,
    /// `--unsafe-no-fsync`: the WAL is not fsynced (a power loss may lose acknowledged writes).
    pub unsafe_no_fsync: bool,
    /// `--socket-reuse-port`: listeners are bound with SO_REUSEPORT.
    pub socket_reuse_port: bool,
    /// `--enable-v2`: serve the v2 keys API (the subset v2 discovery uses) and `/new`.
    pub enable_v2: bool,
    /// `--enable-grpc-gateway`: serve the JSON gateway under `/v3`.
    pub enable_grpc_gateway: bool,
    /// `--backend-batch-interval` (zero: etcd's 100ms): the longest a backend commit waits to
    /// be made durable.
    pub backend_batch_interval: Duration,
    /// `--backend-batch-limit` (zero: etcd's 10000): writes that may wait for a durable commit.
    pub backend_batch_limit: u64,
    /// `--cors`: origins the HTTP endpoints send CORS headers for (`*`: any).
    pub cors: Vec<String>,
    /// `--host-whitelist`: Host headers plain-text HTTP requests may carry (`*`: any).
    pub host_whitelist: Vec<String>,
    /// `--max-concurrent-streams`: HTTP/2 streams per client connection.
    pub max_concurrent_streams: u32,
    /// `--grpc-keepalive-min-time`: the shortest interval between a client's pings (while it
    /// has a stream open) that the client port tolerates.
    pub grpc_keepalive_min_time: Duration,
    /// `--grpc-keepalive-interval`: how often the server pings an idle client connection.
    pub grpc_keepalive_interval: Duration,
    /// `--grpc-keepalive-timeout`: how long a ping may go unanswered before the connection
    /// is closed.
    pub grpc_keepalive_timeout: Duration,
    /// `--experimental-initial-corrupt-check`: compare hashes with the peers before serving.
    pub initial_corrupt_check: bool,
    /// `--experimental-corrupt-check-time` (zero: off): how often the leader compares hashes.
    pub corrupt_check_time: Duration,
    /// `--experimental-enable-lease-checkpoint`: the leader checkpoints remaining TTLs.
    pub lease_checkpoint: bool,
    /// `--experimental-enable-lease-checkpoint-persist`: checkpoints are kept in the backend,
    /// so a restarted member goes on from them.
    pub lease_checkpoint_persist: bool,
    /// How often (etcd: 5 minutes, not a flag).
    pub lease_checkpoint_interval: Duration,
    /// `--experimental-compaction-batch-limit`: most revisions a compaction deletes in one
    /// backend transaction.
    pub compaction_batch_limit: usize,
    /// `--experimental-compaction-sleep-interval`: the pause between those transactions.
    pub compaction_sleep_interval: Duration,
}

/// etcd's default `--experimental-compaction-batch-limit`.
pub const DEFAULT_COMPACTION_BATCH_LIMIT: usize = 1000;
/// etcd's default `--experimental-compaction-sleep-interval`.
pub const DEFAULT_COMPACTION_SLEEP_INTERVAL: Duration = Duration::from_millis(10);

/// etcd's default backend quota: 2 GiB.
pub const DEFAULT_QUOTA_BYTES: u64 = 2 * 1024 * 1024 * 1024;

impl ServerConfig {
    /// A configuration with etcd's defaults for member `default`.
    pub fn with_defaults() -> Self {
        let peer = parse_url("http://localhost:2380");
        let client = parse_url("http://localhost:2379");
        ServerConfig {
            name: "default".into(),
            data_dir: PathBuf::from("default.etcd"),
            wal_dir: None,
            listen_client_urls: vec![client.clone()],
            listen_client_http_urls: Vec::new(),
            advertise_client_urls: vec![client],
            listen_peer_urls: vec![peer.clone()],
            initial_advertise_peer_urls: vec![peer.clone()],
            initial_cluster: vec![("default".into(), vec![peer])],
            initial_cluster_token: "etcd-cluster".into(),
            new_cluster: true,
            quota_backend_bytes: 0,
            max_request_bytes: 1_572_864,
            max_txn_ops: 128,
            auto_compaction: AutoCompaction::Off,
            heartbeat_interval: Duration::from_millis(100),
            election_timeout: Duration::from_millis(1000),
            snapshot_count: 100_000,
            pre_vote: true,
            snapshot_catchup_entries: 5000,
            listen_metrics_urls: Vec::new(),
            watch_progress_notify_interval: Duration::from_secs(600),
            client_tls: None,
            peer_tls: None,
            auth: crate::auth::AuthConfig::default(),
            strict_reconfig_check: true,
            max_learners: 1,
            force_new_cluster: false,
            unsafe_no_fsync: false,
            socket_reuse_port: false,
            enable_v2: false,
            enable_grpc_gateway: true,
            backend_batch_interval: Duration::ZERO,
            backend_batch_limit: 0,
            cors: vec!["*".into()],
            host_whitelist: vec!["*".into()],
            max_concurrent_streams: u32::MAX,
            grpc_keepalive_min_time: Duration::from_secs(5),
            grpc_keepalive_interval: Duration::from_secs(2 * 3600),
            grpc_keepalive_timeout: Duration::from_secs(20),
            initial_corrupt_check: false,
            corrupt_check_time: Duration::ZERO,
            lease_checkpoint: false,
            lease_checkpoint_persist: false,
            lease_checkpoint_interval: Duration::from_secs(300),
            compaction_batch_limit: DEFAULT_COMPACTION_BATCH_LIMIT,
            compaction_sleep_interval: DEFAULT_COMPACTION_SLEEP_INTERVAL,
        }
    }

    /// The backend quota in force.
    pub fn quota_bytes(&self) -> u64 {
        if self.quota_backend_bytes == 0 {
            DEFAULT_QUOTA_BYTES
        } else {
            self.quota_backend_bytes
        }
    }

    /// Election timeout in ticks.
    pub fn election_ticks(&self) -> usize {
        let hb = self.heartbeat_interval.as_millis().max(1);
        (self.election_timeout.as_millis() / hb).max(1) as usize
    }

    /// etcd's minimum lease TTL: 1.5 election timeouts, rounded up to whole seconds.
    pub fn min_lease_ttl(&self) -> i64 {
        let ticks = (3 * self.election_ticks()) / 2;
        let millis = ticks as u128 * self.heartbeat_interval.as_millis();
        millis.div_ceil(1000) as i64
    }
}

fn parse_url(s: &str) -> Url {
    Url::parse(s).expect("static default URL is valid")
}
