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
    LeaseTimeToLiveRequest, LeaseTimeToLiveResponse, Member as MemberPb,
};
use etcdrs_proto::peerpb::peer_client::PeerClient;
use etcdrs_proto::peerpb::peer_server::Peer;
use etcdrs_proto::peerpb::{
    LeaseRenewRequest, LeaseRenewResponse, MembersRequest, MembersResponse, PeerAck, RaftBatch,
    SnapshotChunk,
};
use etcdrs_raftnode::Transport;
use etcdrs_raftnode::eraftpb::Message;
use parking_lot::RwLock;
use protobuf::Message as _;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use tonic::transport::{Channel, Endpoint};
use tonic::{Request, Response, Status, Streaming};

use crate::EtcdServer;
use crate::membership::id_hex;

/// Metadata key carrying the sender's cluster id (hex), as etcd's `X-Etcd-Cluster-ID`.
pub const CLUSTER_ID_HEADER: &str = "x-etcd-cluster-id";
/// Metadata key carrying the sender's member id (hex).
pub const FROM_HEADER: &str = "x-server-from";

/// Outgoing messages queued per peer before new ones are dropped.
const LINK_QUEUE: usize = 4096;
/// Messages sent in one call.
const MAX_BATCH: usize = 512;
/// How long one send may take before the peer counts as unreachable.
const SEND_TIMEOUT: Duration = Duration::from_secs(5);

struct Link {
    urls: Vec<String>,
    tx: mpsc::Sender<Message>,
    stop: CancellationToken,
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
}

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
        })
    }

    /// Make the links match `members` (id and peer URLs); the local member is skipped.
    pub fn set_peers(&self, members: &[(u64, Vec<String>)]) {
        let mut links = self.links.write();
        links.retain(|id, link| {
            let keep = members
                .iter()
                .any(|(m, urls)| m == id && *urls == link.urls);
            if !keep {
                link.stop.cancel();
            }
            keep
        });
        for (id, urls) in members {
            if *id == self.local_id || links.contains_key(id) || urls.is_empty() {
                continue;
            }
            let (tx, rx) = mpsc::channel(LINK_QUEUE);
            let stop = self.shutdown.child_token();
            let worker = LinkWorker {
                to: *id,
                urls: urls.clone(),
                local_id: self.local_id,
                cluster_id: self.cluster_id,
            };
            // The link lives as long as its token: removal or shutdown cancels it.
            self.runtime.spawn(worker.run(rx, stop.clone()));
            links.insert(
                *id,
                Link {
                    urls: urls.clone(),
                    tx,
                    stop,
                },
            );
        }
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
                // A full queue means the peer is not keeping up: raft will retransmit.
                let _ = link.tx.try_send(message);
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

/// A lazily connected client for a peer URL.
pub fn peer_client(url: &str) -> Result<PeerClient<Channel>, tonic::transport::Error> {
    let endpoint = Endpoint::from_shared(url.to_string())?
        .connect_timeout(Duration::from_secs(1))
        .tcp_nodelay(true)
        .http2_keep_alive_interval(Duration::from_secs(10))
        .keep_alive_timeout(Duration::from_secs(5));
    Ok(PeerClient::new(endpoint.connect_lazy()))
}

struct LinkWorker {
    to: u64,
    urls: Vec<String>,
    local_id: u64,
    cluster_id: u64,
}

impl LinkWorker {
    async fn run(self, mut rx: mpsc::Receiver<Message>, stop: CancellationToken) {
        let mut url_index = 0;
        let Ok(mut client) = peer_client(&self.urls[url_index]) else {
            tracing::warn!(remote_peer_id = %id_hex(self.to), urls = ?self.urls, "invalid peer URL");
            return;
        };
        let mut active = false;
        loop {
            let first = tokio::select! {
                _ = stop.cancelled() => return,
                message = rx.recv() => match message {
                    Some(message) => message,
                    None => return,
                },
            };
            let mut batch = Vec::with_capacity(16);
            batch.push(first.write_to_bytes().unwrap_or_default());
            while batch.len() < MAX_BATCH {
                match rx.try_recv() {
                    Ok(message) => batch.push(message.write_to_bytes().unwrap_or_default()),
                    Err(_) => break,
                }
            }
            let mut request = Request::new(RaftBatch { messages: batch });
            stamp(&mut request, self.cluster_id, self.local_id);
            let result = tokio::time::timeout(SEND_TIMEOUT, client.raft(request)).await;
            match result {
                Ok(Ok(_)) => {
                    if !active {
                        active = true;
                        tracing::info!(remote_peer_id = %id_hex(self.to), "peer became active");
                    }
                }
                Ok(Err(status)) if status.code() == tonic::Code::FailedPrecondition => {
                    tracing::error!(
                        remote_peer_id = %id_hex(self.to),
                        error = %status.message(),
                        "peer refused messages"
                    );
                    active = false;
                    tokio::time::sleep(Duration::from_secs(1)).await;
                }
                Ok(Err(_)) | Err(_) => {
                    if active {
                        active = false;
                        tracing::warn!(remote_peer_id = %id_hex(self.to), "peer became inactive (message send to peer failed)");
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
        for bytes in request.into_inner().messages {
            let mut message = Message::default();
            if message.merge_from_bytes(&bytes).is_err() {
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
        Err(Status::unimplemented("snapshots are not supported yet"))
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
