//! The raft transport between members as etcd 3.4/3.5 speak it (etcd `etcdserver/api/rafthttp`):
//! the links that carry raft messages to peers, and the HTTP handlers that receive them
//! ([`routes`]). It knows raft messages and HTTP, nothing of keys, MVCC or the server: what it
//! needs of the member is the [`Raft`] trait the server implements (etcd's `rafthttp.Raft`).
//!
//! **One gate.** Every message a peer sends, whichever path brought it (a stream this member's
//! reader dialled, a pipeline post, a snapshot upload), goes through the same check before raft
//! sees it (etcd's `EtcdServer.Process`): a removed member's message is refused, raft's local
//! message types are dropped, the rest is stepped. A peer that says this member was removed
//! (410 on a stream dial, 403 on a post) is reported through [`Raft::removed`].
//!
//! **Set up before it starts.** [`Transport::new`] gives the transport raft sends into and a
//! [`Starter`]; the links' tasks run only once [`Starter::start`] hands them the member
//! ([`Raft`]). Until then what raft sends waits in the links' queues: nothing is dropped for
//! being early.
//!
//! **Who dials whom.** Every member keeps, for every peer, two *stream readers* that dial the
//! peer (`GET /raft/stream/msgapp/<own id>` and `GET /raft/stream/message/<own id>`): the peer
//! answers 200 and keeps the response open, and that response body carries the peer's
//! messages *to* the dialler. So what a member sends goes out through the *stream writers*
//! its peers' readers attached to it, framed by [`codec`]: MsgApp on `msgappv2`, everything
//! else on `message`. While no stream from a peer is attached, messages go by the *pipeline*,
//! one `POST /raft` each; snapshots go by `POST /raft/snapshot` (the raft message, then the
//! database image). Every request carries etcd's headers (`X-Server-From`,
//! `X-Server-Version`, `X-Min-Cluster-Version`, `X-Etcd-Cluster-ID`, `X-PeerURLs`, and
//! `X-Raft-To` on streams), and every handler checks version and cluster id as etcd does.
//!
//! **Snapshots between etcd-rs members.** An etcd-rs member's requests also carry
//! [`SNAPSHOT_FORMAT_HEADER`] (etcd ignores headers it does not know): a peer whose stream
//! reader dialled with it takes a snapshot as a stream of the leader's backend pairs, which
//! both sides walk as it goes (`etcdrs_backend::transfer`), instead of etcd's bbolt file that
//! the leader would write out whole first and the member read back into its own format. The
//! upload says which it carries with the same header; an etcd member, which never sends the
//! header, always gets etcd's file.
//!
//! **Bounds.** The raft thread never waits: `Transport::send` only `try_send`s into a
//! per-peer bounded queue (4096 per stream writer, as etcd's `streamBufSize`; 64 for the
//! pipeline, etcd's `pipelineBufSize`), dropping when full (raft retransmits). A stream writer
//! waits at most 5 s for its connection (etcd's `ConnWriteTimeout`), and a reader gives up on
//! a connection silent for 5 s (`ConnReadTimeout`); writers send a link heartbeat every 5/3 s so
//! that idle streams stay up.
//!
//! **Activity.** A peer is active while its streams work (a reader or writer attached, a
//! pipeline post answered) and inactive after a failure, as etcd's `peerStatus`; `is_active`
//! feeds MemberRemove's quorum check and `etcd_network_active_peers`. A prober times
//! `GET /raft/probing` every 5 s for `etcd_network_peer_round_trip_time_seconds`.

#![deny(missing_docs)]

pub mod alert;
pub mod client;
pub mod codec;
mod error;
mod handler;
mod link;
pub mod metrics;
mod receive;

use std::collections::HashMap;
use std::future::Future;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use etcdrs_raftnode::eraftpb::{Message, MessageType};
use parking_lot::RwLock;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

pub use client::{PeerClient, PeerTls};
pub use error::{Error, Result};
pub use handler::{go_error, method_not_allowed, routes};

/// Header: the sender's cluster id (hex).
pub const CLUSTER_ID_HEADER: &str = "X-Etcd-Cluster-ID";
/// Header: the sender's member id (hex).
pub const FROM_HEADER: &str = "X-Server-From";
/// Header: the sender's server version.
pub const SERVER_VERSION_HEADER: &str = "X-Server-Version";
/// Header: the sender's minimum cluster version.
pub const MIN_CLUSTER_VERSION_HEADER: &str = "X-Min-Cluster-Version";
/// Header: the member a stream is opened to (hex).
pub const RAFT_TO_HEADER: &str = "X-Raft-To";
/// Header: the sender's peer URLs, comma-separated.
pub const PEER_URLS_HEADER: &str = "X-PeerURLs";
/// Header, etcd-rs's own: on any request, that the sender takes a snapshot as a stream of
/// pairs ([`PAIRS_FORMAT`]); on a snapshot upload, that its image is one.
pub const SNAPSHOT_FORMAT_HEADER: &str = "X-Etcd-Rs-Snapshot-Format";
/// The value of [`SNAPSHOT_FORMAT_HEADER`]: `etcdrs_backend::transfer`'s stream, version 1.
pub const PAIRS_FORMAT: &str = "pairs-1";

/// The oldest cluster version this member works with (etcd 3.4/3.5's `MinClusterVersion`).
pub const MIN_CLUSTER_VERSION: &str = "3.0.0";

/// What a member that learns of its own removal says (etcd's `errMemberRemoved`).
pub const MEMBER_REMOVED: &str = "the member has been permanently removed from the cluster";

/// Messages a stream writer holds before new ones are dropped (etcd's `streamBufSize`).
const STREAM_BUF: usize = 4096;
/// Messages the pipeline holds (etcd's `pipelineBufSize`).
const PIPELINE_BUF: usize = 64;

/// A member id as etcd writes it in headers, paths and labels: lower-case hex.
pub fn id_hex(id: u64) -> String {
    format!("{id:x}")
}

/// What the transport needs of the member (etcd's `rafthttp.Raft`, plus the snapshot image
/// and inbox, which etcd's transport reaches through its snapshotter).
pub trait Raft: Send + Sync + 'static {
    /// Hand a peer's message to raft; called only for messages the gate let through.
    fn step(&self, message: Message) -> impl Future<Output = Result<(), Stopped>> + Send;
    /// Tell raft whether the snapshot sent to member `to` arrived.
    fn report_snapshot(&self, to: u64, ok: bool) -> impl Future<Output = ()> + Send;
    /// Whether member `id` was removed from the cluster (its messages are refused).
    fn is_removed(&self, id: u64) -> bool;
    /// Whether member `id` is a member now (labels of per-peer series, snapshot senders).
    fn is_member(&self, id: u64) -> bool;
    /// A peer said that this member was removed from the cluster.
    fn removed(&self);
    /// The snapshot at raft index `index`: the data the raft snapshot carries and the
    /// database image sent after it, in etcd's form, or as a stream of pairs when `pairs`
    /// (the peer takes one) and the member can. Called on a blocking thread.
    fn snapshot_image(&self, index: u64, pairs: bool)
    -> std::result::Result<SnapshotImage, String>;
    /// Where a database image received for raft index `index` is written.
    fn snapshot_inbox(&self, index: u64) -> PathBuf;
    /// The image for raft index `index` is whole at `path`; raft gets its message next, once
    /// this returns. Called on a blocking thread: the member may make the image ready to
    /// install here (etcd-rs reads etcd's layout into its own and indexes it).
    fn snapshot_received(&self, index: u64, path: PathBuf);
    /// An image for raft index `index` that arrives as a stream of pairs: read `body` to its
    /// end as it arrives and make the image ready to install; raft gets its message once this
    /// returns `Ok`. Called on a blocking thread.
    fn snapshot_streamed(
        &self,
        index: u64,
        body: &mut (dyn std::io::Read + Send),
    ) -> std::result::Result<(), String>;
}

/// Raft has stopped: nothing more can be stepped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Stopped;

/// A snapshot as a link sends it (etcd's `snap.Message`).
pub struct SnapshotImage {
    /// The raft snapshot's data (etcd's: the v2 store as JSON).
    pub data: Vec<u8>,
    /// The database image, read to its end once.
    pub body: Box<dyn std::io::Read + Send>,
    /// Whether `body` is a stream of pairs ([`PAIRS_FORMAT`]) rather than etcd's file.
    pub pairs: bool,
}

/// Why the gate refused a peer's message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Refusal {
    /// The sender was removed from the cluster.
    Removed,
    /// Raft has stopped.
    Stopped,
}

/// Raft's local messages, which never come from a peer: etcd's raft ignores them, and they
/// are not stepped.
pub fn is_local(kind: MessageType) -> bool {
    matches!(
        kind,
        MessageType::MsgHup
            | MessageType::MsgBeat
            | MessageType::MsgUnreachable
            | MessageType::MsgSnapStatus
            | MessageType::MsgCheckQuorum
    )
}

/// The one gate of every message from a peer (etcd's `EtcdServer.Process`): refused when
/// its sender was removed, dropped when it is one of raft's local types, stepped otherwise.
pub(crate) async fn gate<H: Raft>(host: &H, message: Message) -> Result<(), Refusal> {
    if host.is_removed(message.from) {
        return Err(Refusal::Removed);
    }
    if is_local(message.get_msg_type()) {
        return Ok(());
    }
    host.step(message).await.map_err(|Stopped| Refusal::Stopped)
}

/// The two streams of etcd's rafthttp.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StreamType {
    /// `msgappv2`: MsgApp only, in the compact encoding (path `/raft/stream/msgapp`).
    MsgAppV2,
    /// `message`: every other message, length-prefixed raftpb (path `/raft/stream/message`).
    Message,
}

impl StreamType {
    /// The path a reader dials, without the id.
    pub fn endpoint(self) -> &'static str {
        match self {
            StreamType::MsgAppV2 => "/raft/stream/msgapp",
            StreamType::Message => "/raft/stream/message",
        }
    }

    /// etcd's name in logs.
    pub fn name(self) -> &'static str {
        match self {
            StreamType::MsgAppV2 => "stream MsgApp v2",
            StreamType::Message => "stream Message",
        }
    }
}

/// How a transport is set up: who this member is, and how it reaches peers.
pub struct Config {
    /// This member's id.
    pub id: u64,
    /// The cluster's id.
    pub cluster_id: u64,
    /// The advertised peer URLs (`X-PeerURLs`).
    pub urls: Vec<String>,
    /// The server version this member reports (`X-Server-Version`) and checks peers against.
    pub server_version: &'static str,
    /// The most bytes a snapshot upload may carry (the server: twice the backend quota).
    pub snapshot_limit: u64,
    /// The client links and calls dial peers with.
    pub client: PeerClient,
}

/// This member, as it presents itself to peers.
struct Local {
    id: u64,
    cluster_id: u64,
    /// The advertised peer URLs (`X-PeerURLs`).
    urls: Vec<String>,
    server_version: &'static str,
}

impl Local {
    /// The headers of every request to a peer (etcd's `createPostRequest`).
    fn stamp(&self, builder: axum::http::request::Builder) -> axum::http::request::Builder {
        let mut builder = builder
            .header(FROM_HEADER, id_hex(self.id))
            .header(SERVER_VERSION_HEADER, self.server_version)
            .header(MIN_CLUSTER_VERSION_HEADER, MIN_CLUSTER_VERSION)
            .header(CLUSTER_ID_HEADER, id_hex(self.cluster_id));
        if !self.urls.is_empty() {
            builder = builder.header(PEER_URLS_HEADER, self.urls.join(","));
        }
        builder.header(SNAPSHOT_FORMAT_HEADER, PAIRS_FORMAT)
    }
}

/// A stream writer's inputs.
struct WriterHandle {
    msgc: mpsc::Sender<Message>,
    /// Whether a peer's reader is attached (etcd's `writec` ok).
    working: Arc<AtomicBool>,
    /// Where the handler hands over a new attached connection.
    connc: mpsc::Sender<mpsc::Sender<bytes::Bytes>>,
}

struct Peer {
    /// The member's peer URLs, as the membership lists them.
    urls: Vec<String>,
    /// Where the links dial: `urls`, then URLs the member had before an update.
    dial: Vec<String>,
    msgapp: WriterHandle,
    message: WriterHandle,
    pipeline: mpsc::Sender<Message>,
    snapshot: mpsc::Sender<Message>,
    active: Arc<AtomicBool>,
    /// Whether the peer takes a snapshot as a stream of pairs (its stream reader said so).
    takes_pairs: Arc<AtomicBool>,
    stop: CancellationToken,
}

/// The links and who runs them: before [`Starter::start`], links opened by `set_peers` wait
/// in `parked` with their queues; from then on they run at once.
struct Peers<H> {
    by_id: HashMap<u64, Peer>,
    host: Option<Arc<H>>,
    parked: Vec<link::Parked>,
}

/// The raft transport over etcd's rafthttp.
pub struct Transport<H> {
    local: Arc<Local>,
    client: PeerClient,
    snapshot_limit: u64,
    peers: RwLock<Peers<H>>,
    shutdown: CancellationToken,
    /// The runtime link tasks run on (membership changes arrive on the apply thread).
    runtime: tokio::runtime::Handle,
}

/// Starts a transport's links, once, with the member they deliver to.
#[must_use = "the links run only once started"]
pub struct Starter<H> {
    transport: Arc<Transport<H>>,
}

impl<H: Raft> Starter<H> {
    /// Run the links (those opened so far and every later one) for `host`: readers dial,
    /// queued messages go out. Returns what the peer port's [`routes`] serve.
    pub fn start(self, host: Arc<H>) -> Running<H> {
        let parked = {
            let mut peers = self.transport.peers.write();
            peers.host = Some(host.clone());
            std::mem::take(&mut peers.parked)
        };
        for parked in parked {
            link::spawn(&self.transport.runtime, host.clone(), parked);
        }
        Running {
            transport: self.transport,
            host,
        }
    }
}

/// A started transport and the member it delivers to: the state of the peer port's routes.
pub struct Running<H> {
    transport: Arc<Transport<H>>,
    host: Arc<H>,
}

impl<H> Clone for Running<H> {
    fn clone(&self) -> Self {
        Running {
            transport: self.transport.clone(),
            host: self.host.clone(),
        }
    }
}

impl<H: Raft> Running<H> {
    /// The transport.
    pub fn transport(&self) -> &Arc<Transport<H>> {
        &self.transport
    }
}

impl<H: Raft> Transport<H> {
    /// A transport for the member `config` describes, whose link tasks run on the current
    /// runtime and stop with `shutdown`; raft may send into it at once, and its links run
    /// once the returned [`Starter`] is started.
    pub fn new(config: Config, shutdown: CancellationToken) -> (Arc<Self>, Starter<H>) {
        let transport = Arc::new(Transport {
            local: Arc::new(Local {
                id: config.id,
                cluster_id: config.cluster_id,
                urls: config.urls,
                server_version: config.server_version,
            }),
            client: config.client,
            snapshot_limit: config.snapshot_limit,
            peers: RwLock::new(Peers {
                by_id: HashMap::new(),
                host: None,
                parked: Vec::new(),
            }),
            shutdown,
            runtime: tokio::runtime::Handle::current(),
        });
        let starter = Starter {
            transport: transport.clone(),
        };
        (transport, starter)
    }

    /// Make the links match `members` (id and peer URLs); the local member is skipped. A
    /// member whose URLs changed (MemberUpdate) is dialled at its new URLs first and at its old
    /// ones after them: until it restarts on the new address, only the old one reaches it,
    /// and it must still hear that the change committed.
    pub fn set_peers(&self, members: &[(u64, Vec<String>)]) {
        let mut guard = self.peers.write();
        let peers = &mut *guard;
        let mut previous_urls: HashMap<u64, Vec<String>> = HashMap::new();
        peers.by_id.retain(|id, peer| {
            let keep = members
                .iter()
                .any(|(m, urls)| m == id && *urls == peer.urls);
            if !keep {
                peer.stop.cancel();
                previous_urls.insert(*id, peer.dial.clone());
            }
            keep
        });
        for (id, urls) in members {
            if *id == self.local.id || peers.by_id.contains_key(id) || urls.is_empty() {
                continue;
            }
            let mut dial = urls.clone();
            for old in previous_urls.remove(id).unwrap_or_default() {
                if !dial.contains(&old) {
                    dial.push(old);
                }
            }
            let (peer, parked) = link::open(link::LinkConfig {
                to: *id,
                local: self.local.clone(),
                client: self.client.clone(),
                dial: dial.clone(),
                stop: self.shutdown.child_token(),
            });
            match &peers.host {
                Some(host) => link::spawn(&self.runtime, host.clone(), parked),
                None => peers.parked.push(parked),
            }
            peers.by_id.insert(
                *id,
                Peer {
                    urls: urls.clone(),
                    dial,
                    ..peer
                },
            );
        }
    }

    /// Whether member `id` answers this member (etcd's `ActiveSince` is not zero).
    pub fn is_active(&self, id: u64) -> bool {
        self.peers
            .read()
            .by_id
            .get(&id)
            .is_some_and(|peer| peer.active.load(Ordering::Relaxed))
    }

    /// Member `id`'s peer URLs, as the links dial them.
    pub fn urls(&self, id: u64) -> Option<Vec<String>> {
        self.peers
            .read()
            .by_id
            .get(&id)
            .map(|peer| peer.dial.clone())
    }

    /// Whether member `id` has a link (etcd's `peerGetter.Get` is not nil).
    pub fn has_peer(&self, id: u64) -> bool {
        self.peers.read().by_id.contains_key(&id)
    }

    /// Attach a peer's stream reader to the writer of stream `kind` to member `from`: what is
    /// sent to `from` now goes into `conn`. False when there is no such link.
    pub async fn attach(
        &self,
        from: u64,
        kind: StreamType,
        conn: mpsc::Sender<bytes::Bytes>,
    ) -> bool {
        let connc = {
            let peers = self.peers.read();
            let Some(peer) = peers.by_id.get(&from) else {
                return false;
            };
            match kind {
                StreamType::MsgAppV2 => peer.msgapp.connc.clone(),
                StreamType::Message => peer.message.connc.clone(),
            }
        };
        connc.send(conn).await.is_ok()
    }

    /// Member `from` dialled a stream with (`true`) or without [`SNAPSHOT_FORMAT_HEADER`]:
    /// whether the snapshots sent to it may be streams of pairs.
    pub fn note_snapshot_format(&self, from: u64, takes_pairs: bool) {
        if let Some(peer) = self.peers.read().by_id.get(&from) {
            peer.takes_pairs.store(takes_pairs, Ordering::Relaxed);
        }
    }

    /// This member's id.
    pub fn local_id(&self) -> u64 {
        self.local.id
    }

    /// The cluster's id.
    pub fn cluster_id(&self) -> u64 {
        self.local.cluster_id
    }

    /// The client links dial with, for the member's one-off calls to peers.
    pub fn client(&self) -> &PeerClient {
        &self.client
    }

    /// The headers this member's requests to peers carry.
    pub fn stamp(&self, builder: axum::http::request::Builder) -> axum::http::request::Builder {
        self.local.stamp(builder)
    }
}

impl<H: Raft> etcdrs_raftnode::Transport for Transport<H> {
    fn send(&self, messages: Vec<Message>) {
        let peers = self.peers.read();
        for message in messages {
            let to = message.to;
            let Some(peer) = peers.by_id.get(&to) else {
                continue;
            };
            let kind = message.get_msg_type();
            // etcd's `peer.pick`.
            let queue = if kind == MessageType::MsgSnapshot {
                &peer.snapshot
            } else if kind == MessageType::MsgAppend && peer.msgapp.working.load(Ordering::Relaxed)
            {
                &peer.msgapp.msgc
            } else if peer.message.working.load(Ordering::Relaxed) {
                &peer.message.msgc
            } else {
                &peer.pipeline
            };
            // A full queue means the peer is not keeping up: raft will retransmit.
            if queue.try_send(message).is_err() {
                metrics::PEER_SENT_FAILURES
                    .with_label_values(&[id_hex(to).as_str()])
                    .inc();
                if kind == MessageType::MsgHeartbeat {
                    metrics::HEARTBEAT_SEND_FAILURES.inc();
                }
            }
        }
    }
}

#[cfg(test)]
mod tests;
