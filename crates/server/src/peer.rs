//! Member-to-member traffic (etcd `server/etcdserver/api/rafthttp`): the transport that
//! carries raft messages to peers, and the peer service that receives them.
//!
//! Each remote member has a *link*: a bounded queue of outgoing raft messages and one task that
//! sends them, in order and batched, over a lazily connected HTTP/2 channel. A full queue drops
//! messages (raft retransmits), so a slow or dead peer never blocks the raft loop. Every call
//! carries the sender's cluster id; a member of another cluster is refused and logged.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use etcdrs_proto::etcdserverpb::{
    HashKvRequest, HashKvResponse, LeaseTimeToLiveRequest, LeaseTimeToLiveResponse,
    Member as MemberPb,
};
use etcdrs_proto::peerpb::peer_client::PeerClient;
use etcdrs_proto::peerpb::peer_server::Peer;
use etcdrs_proto::peerpb::{
    LeaseRenewRequest, LeaseRenewResponse, MembersRequest, MembersResponse, PeerAck, RaftBatch,
    SnapshotChunk,
};
use etcdrs_raftnode::Transport;
use etcdrs_raftnode::eraftpb::{Message, MessageType};
use parking_lot::RwLock;
use protobuf::Message as _;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use tonic::transport::{Channel, Endpoint};
use tonic::{Request, Response, Status, Streaming};

use crate::EtcdServer;
use crate::membership::id_hex;
use crate::tls::TlsClient;

/// Metadata key carrying the sender's cluster id (hex), as etcd's `X-Etcd-Cluster-ID`.
pub const CLUSTER_ID_HEADER: &str = "x-etcd-cluster-id";
/// Metadata key carrying the sender's member id (hex).
pub const FROM_HEADER: &str = "x-server-from";

/// What a member tells a removed member that still sends it messages.
const MEMBER_REMOVED: &str = "the member has been permanently removed from the cluster";

/// Outgoing messages queued per peer before new ones are dropped.
const LINK_QUEUE: usize = 4096;
/// Messages sent in one call.
const MAX_BATCH: usize = 512;
/// How long one send may take before the peer counts as unreachable.
const SEND_TIMEOUT: Duration = Duration::from_secs(5);
/// How often a link probes its peer with an empty batch (etcd's prober runs every few
/// seconds too): followers send each other nothing, yet each must know whether the other is
/// reachable (`etcd_network_active_peers`), and probes time the round trip.
const PROBE_INTERVAL: Duration = Duration::from_secs(5);

struct Link {
    /// The member's peer URLs, as the membership lists them.
    urls: Vec<String>,
    /// Where the link dials: `urls`, then URLs the member had before an update.
    dial: Vec<String>,
    tx: mpsc::Sender<Message>,
    stop: CancellationToken,
    /// Whether the peer answers (its last probe or send succeeded).
    active: Arc<std::sync::atomic::AtomicBool>,
}

/// The raft transport over the peer protocol.
pub struct PeerTransport {
    local_id: u64,
    cluster_id: u64,
    links: RwLock<HashMap<u64, Link>>,
    shutdown: CancellationToken,
    /// The runtime link tasks run on (membership changes arrive on the apply thread, whose
    /// own runtime is busy applying).
    runtime: tokio::runtime::Handle,
    /// What snapshot messages carry: the store's image; raft hears whether it arrived.
    snapshots: Arc<std::sync::OnceLock<SnapshotSource>>,
}

/// Where a link gets a snapshot image and whom it tells about delivery.
#[derive(Clone)]
struct SnapshotSource {
    store: Arc<etcdrs_mvcc::KvStore>,
    raft: etcdrs_raftnode::RaftNodeHandle,
    /// Cancelled when a peer says this member was removed.
    removed: CancellationToken,
}

/// How long a snapshot upload may go without a chunk.
const SNAPSHOT_IDLE_TIMEOUT: Duration = Duration::from_secs(30);

/// A snapshot being received, removed unless it arrived whole.
struct PartialFile(Option<std::path::PathBuf>);

impl Drop for PartialFile {
    fn drop(&mut self) {
        if let Some(path) = self.0.take() {
            let _ = std::fs::remove_file(path);
        }
    }
}

fn snapshot_too_large(limit: u64) -> Status {
    tracing::warn!(
        limit,
        "rejected a snapshot larger than twice the backend quota"
    );
    Status::resource_exhausted(format!(
        "etcdserver: snapshot larger than {limit} bytes (twice the backend quota)"
    ))
}

/// Bytes per snapshot chunk on the wire.
const SNAPSHOT_CHUNK: usize = 1 << 20;
/// How long sending one snapshot may take.
const SNAPSHOT_TIMEOUT: Duration = Duration::from_secs(300);

impl PeerTransport {
    /// A transport for member `local_id` of `cluster_id`; its link tasks run on the current
    /// runtime and stop with `shutdown`.
    pub fn new(local_id: u64, cluster_id: u64, shutdown: CancellationToken) -> Arc<Self> {
        Arc::new(PeerTransport {
            local_id,
            cluster_id,
            links: RwLock::new(HashMap::new()),
            shutdown,
            runtime: tokio::runtime::Handle::current(),
            snapshots: Arc::new(std::sync::OnceLock::new()),
        })
    }

    /// Give links what they need to send snapshots (once the store and raft exist).
    pub fn set_snapshot_source(
        &self,
        store: Arc<etcdrs_mvcc::KvStore>,
        raft: etcdrs_raftnode::RaftNodeHandle,
        removed: CancellationToken,
    ) {
        let _ = self.snapshots.set(SnapshotSource {
            store,
            raft,
            removed,
        });
    }

    /// Make the links match `members` (id and peer URLs); the local member is skipped. A
    /// member whose URLs changed (MemberUpdate) is dialled at its new URLs first and at its old
    /// ones after them: until it restarts on the new address, only the old one reaches it,
    /// and it must still hear that the change committed.
    pub fn set_peers(&self, members: &[(u64, Vec<String>)]) {
        let mut links = self.links.write();
        let mut previous_urls: HashMap<u64, Vec<String>> = HashMap::new();
        links.retain(|id, link| {
            let keep = members
                .iter()
                .any(|(m, urls)| m == id && *urls == link.urls);
            if !keep {
                link.stop.cancel();
                previous_urls.insert(*id, link.dial.clone());
            }
            keep
        });
        for (id, urls) in members {
            if *id == self.local_id || links.contains_key(id) || urls.is_empty() {
                continue;
            }
            let mut dial = urls.clone();
            for old in previous_urls.remove(id).unwrap_or_default() {
                if !dial.contains(&old) {
                    dial.push(old);
                }
            }
            let (tx, rx) = mpsc::channel(LINK_QUEUE);
            let stop = self.shutdown.child_token();
            let active = Arc::new(std::sync::atomic::AtomicBool::new(false));
            let worker = LinkWorker {
                to: *id,
                urls: dial.clone(),
                local_id: self.local_id,
                cluster_id: self.cluster_id,
                snapshots: self.snapshots.clone(),
                active: active.clone(),
            };
            // The link lives as long as its token: removal or shutdown cancels it.
            self.runtime.spawn(worker.run(rx, stop.clone()));
            links.insert(
                *id,
                Link {
                    urls: urls.clone(),
                    dial,
                    tx,
                    stop,
                    active,
                },
            );
        }
    }

    /// Whether member `id` answers this member (etcd's `ActiveSince` is not zero).
    pub fn is_active(&self, id: u64) -> bool {
        self.links
            .read()
            .get(&id)
            .is_some_and(|link| link.active.load(std::sync::atomic::Ordering::Relaxed))
    }

    /// A client for the first reachable URL of member `id`.
    pub fn client(&self, id: u64) -> Option<PeerClient<Channel>> {
        let links = self.links.read();
        let url = links.get(&id)?.urls.first()?.clone();
        peer_client(&url).ok()
    }

    /// Metadata every call carries.
    pub fn stamp<T>(&self, request: &mut Request<T>) {
        stamp(request, self.cluster_id, self.local_id);
    }
}

impl Transport for PeerTransport {
    fn send(&self, messages: Vec<Message>) {
        let links = self.links.read();
        for message in messages {
            if let Some(link) = links.get(&message.to) {
                let is_heartbeat = message.get_msg_type() == MessageType::MsgHeartbeat;
                // A full queue means the peer is not keeping up: raft will retransmit.
                if link.tx.try_send(message).is_err() && is_heartbeat {
                    crate::metrics::HEARTBEAT_SEND_FAILURES.inc();
                }
            }
        }
    }
}

fn stamp<T>(request: &mut Request<T>, cluster_id: u64, from: u64) {
    if let Ok(value) = id_hex(cluster_id).parse() {
        request.metadata_mut().insert(CLUSTER_ID_HEADER, value);
    }
    if let Ok(value) = id_hex(from).parse() {
        request.metadata_mut().insert(FROM_HEADER, value);
    }
}

/// The TLS peers dial `https` peer URLs with (`--peer-cert-file`, ...); set once at start-up,
/// before any link exists, and shared by every link and one-off peer call.
static CLIENT_TLS: std::sync::OnceLock<Arc<TlsClient>> = std::sync::OnceLock::new();

/// Use `tls` to dial `https` peer URLs.
pub fn set_client_tls(tls: Arc<TlsClient>) {
    let _ = CLIENT_TLS.set(tls);
}

/// A lazily connected client for a peer URL; `https` URLs are dialled with the peer TLS.
pub fn peer_client(url: &str) -> Result<PeerClient<Channel>, tonic::transport::Error> {
    let (endpoint_url, tls) = match url.strip_prefix("https://") {
        // tonic dials plain TCP through our connector, which adds TLS itself.
        Some(rest) => (format!("http://{rest}"), CLIENT_TLS.get().cloned()),
        None => (url.to_string(), None),
    };
    let endpoint = Endpoint::from_shared(endpoint_url)?
        .connect_timeout(Duration::from_secs(1))
        .tcp_nodelay(true)
        .http2_keep_alive_interval(Duration::from_secs(10))
        .keep_alive_timeout(Duration::from_secs(5));
    let Some(tls) = tls else {
        return Ok(PeerClient::new(endpoint.connect_lazy()));
    };
    let connector = tower::service_fn(move |uri: tonic::codegen::http::Uri| {
        let tls = tls.clone();
        async move {
            let host = uri.host().unwrap_or_default().to_owned();
            let port = uri.port_u16().unwrap_or(443);
            let name = tls
                .server_name_for(&host)
                .ok_or_else(|| std::io::Error::other(format!("invalid host name {host:?}")))?;
            let connector = tls.connector();
            let connect = async {
                let addr = host.trim_start_matches('[').trim_end_matches(']');
                let tcp = tokio::net::TcpStream::connect((addr, port)).await?;
                let _ = tcp.set_nodelay(true);
                connector.connect(name, tcp).await
            };
            let stream = tokio::time::timeout(Duration::from_secs(3), connect)
                .await
                .map_err(|_| std::io::Error::new(std::io::ErrorKind::TimedOut, "dial timeout"))??;
            Ok::<_, std::io::Error>(hyper_util::rt::TokioIo::new(stream))
        }
    });
    Ok(PeerClient::new(
        endpoint.connect_with_connector_lazy(connector),
    ))
}

struct LinkWorker {
    to: u64,
    urls: Vec<String>,
    local_id: u64,
    cluster_id: u64,
    snapshots: Arc<std::sync::OnceLock<SnapshotSource>>,
    active: Arc<std::sync::atomic::AtomicBool>,
}

impl LinkWorker {
    async fn run(self, mut rx: mpsc::Receiver<Message>, stop: CancellationToken) {
        let mut url_index = 0;
        let Ok(mut client) = peer_client(&self.urls[url_index]) else {
            tracing::warn!(remote_peer_id = %id_hex(self.to), urls = ?self.urls, "invalid peer URL");
            return;
        };
        let mut active =
            crate::metrics::PeerActivity::new(self.local_id, self.to, self.active.clone());
        let mut probe = tokio::time::interval(PROBE_INTERVAL);
        probe.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        // The last failure logged: a link that keeps failing the same way logs it once.
        let mut last_error = String::new();
        loop {
            let first = tokio::select! {
                _ = stop.cancelled() => return,
                _ = probe.tick() => {
                    if !self.probe(&mut client, &mut active).await {
                        url_index = (url_index + 1) % self.urls.len();
                        if let Ok(next) = peer_client(&self.urls[url_index]) {
                            client = next;
                        }
                    }
                    continue;
                }
                message = rx.recv() => match message {
                    Some(message) => message,
                    None => return,
                },
            };
            if first.get_msg_type() == MessageType::MsgSnapshot {
                self.send_snapshot(&mut client, first).await;
                continue;
            }
            let mut batch = Vec::with_capacity(16);
            batch.push(first.write_to_bytes().unwrap_or_default());
            while batch.len() < MAX_BATCH {
                match rx.try_recv() {
                    // A snapshot goes alone, on its own call; raft sends it again if needed.
                    Ok(message) if message.get_msg_type() == MessageType::MsgSnapshot => {
                        self.send_snapshot(&mut client, message).await;
                        break;
                    }
                    Ok(message) => batch.push(message.write_to_bytes().unwrap_or_default()),
                    Err(_) => break,
                }
            }
            let bytes: usize = batch.iter().map(Vec::len).sum();
            let mut request = Request::new(RaftBatch { messages: batch });
            stamp(&mut request, self.cluster_id, self.local_id);
            let to = id_hex(self.to);
            let started = std::time::Instant::now();
            let result = tokio::time::timeout(SEND_TIMEOUT, client.raft(request)).await;
            if matches!(result, Ok(Ok(_))) {
                crate::metrics::PEER_SENT_BYTES
                    .with_label_values(&[to.as_str()])
                    .inc_by(bytes as u64);
                crate::metrics::PEER_RTT
                    .with_label_values(&[to.as_str()])
                    .observe(started.elapsed().as_secs_f64());
            } else {
                crate::metrics::PEER_SENT_FAILURES
                    .with_label_values(&[to.as_str()])
                    .inc();
            }
            match result {
                Ok(Ok(_)) => {
                    if active.up() {
                        tracing::info!(remote_peer_id = %id_hex(self.to), "peer became active");
                    }
                }
                Ok(Err(status))
                    if status.code() == tonic::Code::PermissionDenied
                        && status.message() == MEMBER_REMOVED =>
                {
                    if let Some(source) = self.snapshots.get() {
                        source.removed.cancel();
                    }
                    return;
                }
                Ok(Err(status)) if status.code() == tonic::Code::FailedPrecondition => {
                    tracing::error!(
                        remote_peer_id = %id_hex(self.to),
                        error = %status.message(),
                        "peer refused messages"
                    );
                    active.down();
                    tokio::time::sleep(Duration::from_secs(1)).await;
                }
                failed => {
                    // etcd logs why, in Go's words for TLS alerts
                    // (`remote error: tls: bad certificate` for a refused certificate).
                    let error = match &failed {
                        Ok(Err(status)) => crate::tls::transport_error_text(status),
                        _ => "timed out".to_owned(),
                    };
                    let was_active = active.down();
                    if was_active || error != last_error {
                        tracing::warn!(remote_peer_id = %id_hex(self.to), error = %error, "peer became inactive (message send to peer failed)");
                        last_error = error;
                    }
                    // Try the member's next URL after a short pause; raft retransmits.
                    url_index = (url_index + 1) % self.urls.len();
                    if let Ok(next) = peer_client(&self.urls[url_index]) {
                        client = next;
                    }
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            }
        }
    }
}

impl LinkWorker {
    /// Probe the peer with an empty batch: marks the link active or not and times the round
    /// trip. Returns whether the peer answered.
    async fn probe(
        &self,
        client: &mut PeerClient<Channel>,
        active: &mut crate::metrics::PeerActivity,
    ) -> bool {
        let mut request = Request::new(RaftBatch {
            messages: Vec::new(),
        });
        stamp(&mut request, self.cluster_id, self.local_id);
        let started = std::time::Instant::now();
        let answered = matches!(
            tokio::time::timeout(SEND_TIMEOUT, client.raft(request)).await,
            Ok(Ok(_))
        );
        if answered {
            crate::metrics::PEER_RTT
                .with_label_values(&[id_hex(self.to).as_str()])
                .observe(started.elapsed().as_secs_f64());
            if active.up() {
                tracing::info!(remote_peer_id = %id_hex(self.to), "peer became active");
            }
        } else if active.down() {
            tracing::warn!(remote_peer_id = %id_hex(self.to), "peer became inactive (probe failed)");
        }
        answered
    }

    /// Send a snapshot message with the store's image (etcd's snapshot sender), and tell raft
    /// whether it arrived.
    async fn send_snapshot(&self, client: &mut PeerClient<Channel>, message: Message) {
        let Some(source) = self.snapshots.get().cloned() else {
            return;
        };
        let index = message.get_snapshot().get_metadata().index;
        tracing::info!(remote_peer_id = %id_hex(self.to), index, "sending database snapshot");
        let to = id_hex(self.to);
        let inflight = crate::metrics::SNAPSHOT_SEND_INFLIGHTS.with_label_values(&[to.as_str()]);
        inflight.inc();
        let started = std::time::Instant::now();
        let store = source.store.clone();
        let image = tokio::task::spawn_blocking(move || store.backend().snapshot()).await;
        let ok = match image {
            Ok(Ok(image)) => self.stream_snapshot(client, message, image).await,
            Ok(Err(e)) => {
                tracing::warn!(error = %e, "failed to take a database snapshot");
                false
            }
            Err(_) => false,
        };
        inflight.dec();
        if ok {
            tracing::info!(remote_peer_id = %id_hex(self.to), index, "sent database snapshot");
            crate::metrics::SNAPSHOT_SEND_SUCCESS
                .with_label_values(&[to.as_str()])
                .inc();
            crate::metrics::SNAPSHOT_SEND_SECONDS
                .with_label_values(&[to.as_str()])
                .observe(started.elapsed().as_secs_f64());
        } else {
            crate::metrics::SNAPSHOT_SEND_FAILURES
                .with_label_values(&[to.as_str()])
                .inc();
        }
        let _ = source.raft.report_snapshot(self.to, ok).await;
    }

    async fn stream_snapshot(
        &self,
        client: &mut PeerClient<Channel>,
        message: Message,
        image: etcdrs_backend::Snapshot,
    ) -> bool {
        let (tx, rx) = mpsc::channel::<SnapshotChunk>(4);
        let first = SnapshotChunk {
            message: message.write_to_bytes().unwrap_or_default(),
            data: Vec::new(),
        };
        let reader = tokio::task::spawn_blocking(move || -> bool {
            use std::io::Read;
            if tx.blocking_send(first).is_err() {
                return false;
            }
            let Ok(mut file) = image.open() else {
                return false;
            };
            let mut buf = vec![0u8; SNAPSHOT_CHUNK];
            loop {
                match file.read(&mut buf) {
                    Ok(0) => return true,
                    Ok(n) => {
                        let chunk = SnapshotChunk {
                            message: Vec::new(),
                            data: buf[..n].to_vec(),
                        };
                        if tx.blocking_send(chunk).is_err() {
                            return false;
                        }
                    }
                    Err(_) => return false,
                }
            }
        });
        let mut request = Request::new(tokio_stream::wrappers::ReceiverStream::new(rx));
        stamp(&mut request, self.cluster_id, self.local_id);
        let sent = tokio::time::timeout(SNAPSHOT_TIMEOUT, client.snapshot(request)).await;
        let read_ok = reader.await.unwrap_or(false);
        match sent {
            Ok(Ok(_)) => read_ok,
            Ok(Err(status)) => {
                tracing::warn!(remote_peer_id = %id_hex(self.to), error = %status.message(), "failed to send database snapshot");
                false
            }
            Err(_) => false,
        }
    }
}

/// The peer service: what other members call.
#[derive(Clone)]
pub struct PeerService {
    server: EtcdServer,
}

impl PeerService {
    /// The service for `server`.
    pub fn new(server: EtcdServer) -> Self {
        PeerService { server }
    }

    /// Receive a database snapshot from the leader into its file and hand it to raft.
    async fn receive_snapshot(
        &self,
        request: Request<Streaming<SnapshotChunk>>,
    ) -> Result<Response<PeerAck>, Status> {
        use tokio::io::AsyncWriteExt;
        let mut stream = request.into_inner();
        let Some(first) = stream.message().await? else {
            return Err(Status::invalid_argument("empty snapshot stream"));
        };
        let mut message = Message::default();
        if message.merge_from_bytes(&first.message).is_err()
            || message.get_msg_type() != MessageType::MsgSnapshot
        {
            return Err(Status::invalid_argument("malformed snapshot message"));
        }
        let index = message.get_snapshot().get_metadata().index;
        let saving = std::time::Instant::now();
        let path = self.server.snapshot_receive_path(index);
        let io_error = |e: std::io::Error| Status::internal(format!("receiving snapshot: {e}"));
        let mut file = tokio::fs::File::create(&path).await.map_err(io_error)?;
        // From here on a failed upload leaves no file behind.
        let mut partial = PartialFile(Some(path.clone()));
        // Bounds: a leader's database stays within its quota (the NOSPACE alarm stops writes
        // at it), so an image over twice the quota is not one; and an upload that stalls or
        // drags on is dropped rather than holding the file.
        let limit = self.server.config().quota_bytes().saturating_mul(2);
        let deadline = tokio::time::Instant::now() + SNAPSHOT_TIMEOUT;
        let mut received = first.data.len() as u64;
        if received > limit {
            return Err(snapshot_too_large(limit));
        }
        file.write_all(&first.data).await.map_err(io_error)?;
        loop {
            let next = tokio::time::timeout_at(
                deadline.min(tokio::time::Instant::now() + SNAPSHOT_IDLE_TIMEOUT),
                stream.message(),
            )
            .await
            .map_err(|_| Status::deadline_exceeded("etcdserver: snapshot upload timed out"))??;
            let Some(chunk) = next else { break };
            received += chunk.data.len() as u64;
            if received > limit {
                return Err(snapshot_too_large(limit));
            }
            file.write_all(&chunk.data).await.map_err(io_error)?;
        }
        let syncing = std::time::Instant::now();
        file.sync_all().await.map_err(io_error)?;
        crate::metrics::SNAP_DB_FSYNC_SECONDS.observe(syncing.elapsed().as_secs_f64());
        drop(file);
        crate::metrics::SNAP_DB_SAVE_SECONDS.observe(saving.elapsed().as_secs_f64());
        tracing::info!(index, "received database snapshot");
        partial.0 = None;
        self.server.snapshot_received(index, path);
        self.server
            .raft_step(message)
            .await
            .map_err(|_| Status::unavailable("etcdserver: server stopped"))?;
        Ok(Response::new(PeerAck {}))
    }

    /// The label of the member with hex id `from` for per-peer series, if it is a member.
    fn member_label(&self, from: &str) -> Option<String> {
        let id = u64::from_str_radix(from, 16).ok()?;
        self.server.is_member(id).then(|| id_hex(id))
    }

    fn check_cluster<T>(&self, request: &Request<T>) -> Result<(), Status> {
        let remote = request
            .metadata()
            .get(CLUSTER_ID_HEADER)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| u64::from_str_radix(v, 16).ok());
        let local = self.server.cluster_id();
        match remote {
            Some(remote) if remote == local => Ok(()),
            remote => {
                let from = request
                    .metadata()
                    .get(FROM_HEADER)
                    .and_then(|v| v.to_str().ok())
                    .unwrap_or("unknown");
                tracing::warn!(
                    local_member_cluster_id = %id_hex(local),
                    remote_peer_cluster_id = %remote.map(id_hex).unwrap_or_default(),
                    remote_peer_id = from,
                    "request cluster ID mismatch"
                );
                Err(Status::failed_precondition("cluster ID mismatch"))
            }
        }
    }
}

#[tonic::async_trait]
impl Peer for PeerService {
    async fn raft(&self, request: Request<RaftBatch>) -> Result<Response<PeerAck>, Status> {
        self.check_cluster(&request)?;
        let from = request
            .metadata()
            .get(FROM_HEADER)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("unknown")
            .to_string();
        if u64::from_str_radix(&from, 16).is_ok_and(|id| self.server.is_removed_member(id)) {
            return Err(Status::permission_denied(MEMBER_REMOVED));
        }
        // Series are labelled by member only: a caller that is none gets no series.
        let label = self.member_label(&from);
        let bytes: usize = request.get_ref().messages.iter().map(Vec::len).sum();
        if let Some(label) = &label {
            crate::metrics::PEER_RECEIVED_BYTES
                .with_label_values(&[label.as_str()])
                .inc_by(bytes as u64);
        }
        for bytes in request.into_inner().messages {
            let mut message = Message::default();
            if message.merge_from_bytes(&bytes).is_err() {
                if let Some(label) = &label {
                    crate::metrics::PEER_RECEIVED_FAILURES
                        .with_label_values(&[label.as_str()])
                        .inc();
                }
                return Err(Status::invalid_argument("malformed raft message"));
            }
            self.server
                .raft_step(message)
                .await
                .map_err(|_| Status::unavailable("etcdserver: server stopped"))?;
        }
        Ok(Response::new(PeerAck {}))
    }

    async fn snapshot(
        &self,
        request: Request<Streaming<SnapshotChunk>>,
    ) -> Result<Response<PeerAck>, Status> {
        self.check_cluster(&request)?;
        let from = request
            .metadata()
            .get(FROM_HEADER)
            .and_then(|v| v.to_str().ok())
            .and_then(|from| self.member_label(from));
        // Only a member may replace this member's data (the leader sends snapshots).
        let Some(from) = from else {
            tracing::warn!("rejected a snapshot from a member not in the cluster");
            return Err(Status::permission_denied(
                "etcdserver: snapshot from a member not in the cluster",
            ));
        };
        let label = [from.as_str()];
        let inflight = crate::metrics::SNAPSHOT_RECEIVE_INFLIGHTS.with_label_values(&label);
        inflight.inc();
        let started = std::time::Instant::now();
        let received = self.receive_snapshot(request).await;
        inflight.dec();
        if received.is_ok() {
            crate::metrics::SNAPSHOT_RECEIVE_SUCCESS
                .with_label_values(&label)
                .inc();
            crate::metrics::SNAPSHOT_RECEIVE_SECONDS
                .with_label_values(&label)
                .observe(started.elapsed().as_secs_f64());
        } else {
            crate::metrics::SNAPSHOT_RECEIVE_FAILURES
                .with_label_values(&label)
                .inc();
        }
        received
    }

    async fn members(
        &self,
        _request: Request<MembersRequest>,
    ) -> Result<Response<MembersResponse>, Status> {
        // No cluster check: a joining member does not know the cluster id yet (etcd's
        // `/members` answers anyone, with the cluster id in a header).
        Ok(Response::new(MembersResponse {
            cluster_id: self.server.cluster_id(),
            members: self.server.members().into_iter().map(member_pb).collect(),
        }))
    }

    async fn lease_renew(
        &self,
        request: Request<LeaseRenewRequest>,
    ) -> Result<Response<LeaseRenewResponse>, Status> {
        self.check_cluster(&request)?;
        if !self.server.raft_status().is_leader {
            return Ok(Response::new(LeaseRenewResponse {
                ttl: 0,
                not_leader: true,
            }));
        }
        let ttl = crate::rpc::lease::renew(&self.server, request.into_inner().id).await?;
        Ok(Response::new(LeaseRenewResponse {
            ttl,
            not_leader: false,
        }))
    }

    async fn lease_time_to_live(
        &self,
        request: Request<LeaseTimeToLiveRequest>,
    ) -> Result<Response<LeaseTimeToLiveResponse>, Status> {
        self.check_cluster(&request)?;
        let resp =
            crate::rpc::lease::time_to_live_local(&self.server, request.into_inner()).await?;
        Ok(Response::new(resp))
    }

    async fn hash_kv(
        &self,
        request: Request<HashKvRequest>,
    ) -> Result<Response<HashKvResponse>, Status> {
        self.check_cluster(&request)?;
        let revision = request.into_inner().revision;
        Ok(Response::new(
            crate::corrupt::local_hash(&self.server, revision).await?,
        ))
    }
}

/// A member as the Cluster API shows it.
pub fn member_pb(m: crate::membership::Member) -> MemberPb {
    MemberPb {
        id: m.id,
        name: m.name,
        peer_ur_ls: m.peer_urls,
        client_ur_ls: m.client_urls,
        is_learner: m.is_learner,
    }
}
