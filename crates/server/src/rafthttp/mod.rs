//! Member-to-member traffic as etcd 3.4/3.5 speak it (etcd `etcdserver/api/rafthttp`, the
//! peer half of `etcdhttp`, `lease/leasehttp`, the peer `hashkv`): the transport that carries
//! raft messages to peers, and the HTTP handlers that receive them ([`handler`]).
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
//! **Bounds.** The raft thread never waits: [`PeerTransport::send`] only `try_send`s into a
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

pub mod calls;
pub mod client;
pub mod codec;
pub mod handler;
mod link;

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use etcdrs_raftnode::Transport;
use etcdrs_raftnode::eraftpb::{Message, MessageType};
use parking_lot::RwLock;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use crate::membership::id_hex;

pub use client::set_client_tls;

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

/// The oldest cluster version this member works with (etcd 3.4/3.5's `MinClusterVersion`).
pub const MIN_CLUSTER_VERSION: &str = "3.0.0";

/// What a member that learns of its own removal says (etcd's `errMemberRemoved`).
pub const MEMBER_REMOVED: &str = "the member has been permanently removed from the cluster";

/// Messages a stream writer holds before new ones are dropped (etcd's `streamBufSize`).
const STREAM_BUF: usize = 4096;
/// Messages the pipeline holds (etcd's `pipelineBufSize`).
const PIPELINE_BUF: usize = 64;

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

/// This member, as it presents itself to peers.
struct Local {
    id: u64,
    cluster_id: u64,
    /// The advertised peer URLs (`X-PeerURLs`).
    urls: Vec<String>,
}

impl Local {
    /// The headers of every request to a peer (etcd's `createPostRequest`).
    fn stamp(&self, builder: axum::http::request::Builder) -> axum::http::request::Builder {
        let mut builder = builder
            .header(FROM_HEADER, id_hex(self.id))
            .header(SERVER_VERSION_HEADER, crate::version::SERVER_VERSION)
            .header(MIN_CLUSTER_VERSION_HEADER, MIN_CLUSTER_VERSION)
            .header(CLUSTER_ID_HEADER, id_hex(self.cluster_id));
        if !self.urls.is_empty() {
            builder = builder.header(PEER_URLS_HEADER, self.urls.join(","));
        }
        builder
    }
}

/// What links need once the store and raft exist: where snapshots come from, where received
/// messages go, and whom to tell that this member was removed.
#[derive(Clone)]
struct LinkContext {
    store: Arc<etcdrs_mvcc::KvStore>,
    raft: etcdrs_raftnode::RaftNodeHandle,
    /// Cancelled when a peer says this member was removed.
    removed: CancellationToken,
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
    stop: CancellationToken,
}

/// The raft transport over etcd's rafthttp.
pub struct PeerTransport {
    local: Arc<Local>,
    peers: RwLock<HashMap<u64, Peer>>,
    shutdown: CancellationToken,
    /// The runtime link tasks run on (membership changes arrive on the apply thread).
    runtime: tokio::runtime::Handle,
    context: Arc<std::sync::OnceLock<LinkContext>>,
}

impl PeerTransport {
    /// A transport for member `local_id` of `cluster_id`, advertising `local_urls`; its link
    /// tasks run on the current runtime and stop with `shutdown`.
    pub fn new(
        local_id: u64,
        cluster_id: u64,
        local_urls: Vec<String>,
        shutdown: CancellationToken,
    ) -> Arc<Self> {
        Arc::new(PeerTransport {
            local: Arc::new(Local {
                id: local_id,
                cluster_id,
                urls: local_urls,
            }),
            peers: RwLock::new(HashMap::new()),
            shutdown,
            runtime: tokio::runtime::Handle::current(),
            context: Arc::new(std::sync::OnceLock::new()),
        })
    }

    /// Give links what they need once the store and raft exist: snapshot images, the raft
    /// node that received messages go to, and the token a removal cancels. Readers dial only
    /// from then on.
    pub fn set_snapshot_source(
        &self,
        store: Arc<etcdrs_mvcc::KvStore>,
        raft: etcdrs_raftnode::RaftNodeHandle,
        removed: CancellationToken,
    ) {
        let _ = self.context.set(LinkContext {
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
        let mut peers = self.peers.write();
        let mut previous_urls: HashMap<u64, Vec<String>> = HashMap::new();
        peers.retain(|id, peer| {
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
            if *id == self.local.id || peers.contains_key(id) || urls.is_empty() {
                continue;
            }
            let mut dial = urls.clone();
            for old in previous_urls.remove(id).unwrap_or_default() {
                if !dial.contains(&old) {
                    dial.push(old);
                }
            }
            let peer = link::start(
                &self.runtime,
                link::LinkConfig {
                    to: *id,
                    local: self.local.clone(),
                    context: self.context.clone(),
                    dial: dial.clone(),
                    stop: self.shutdown.child_token(),
                },
            );
            peers.insert(
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
            .get(&id)
            .is_some_and(|peer| peer.active.load(Ordering::Relaxed))
    }

    /// Member `id`'s peer URLs, as the links dial them.
    pub fn urls(&self, id: u64) -> Option<Vec<String>> {
        self.peers.read().get(&id).map(|peer| peer.dial.clone())
    }

    /// Whether member `id` has a link (etcd's `peerGetter.Get` is not nil).
    pub fn has_peer(&self, id: u64) -> bool {
        self.peers.read().contains_key(&id)
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
            let Some(peer) = peers.get(&from) else {
                return false;
            };
            match kind {
                StreamType::MsgAppV2 => peer.msgapp.connc.clone(),
                StreamType::Message => peer.message.connc.clone(),
            }
        };
        connc.send(conn).await.is_ok()
    }

    /// This member's id.
    pub fn local_id(&self) -> u64 {
        self.local.id
    }

    /// The headers this member's requests to peers carry.
    pub(crate) fn stamp(
        &self,
        builder: axum::http::request::Builder,
    ) -> axum::http::request::Builder {
        self.local.stamp(builder)
    }
}

impl Transport for PeerTransport {
    fn send(&self, messages: Vec<Message>) {
        let peers = self.peers.read();
        for message in messages {
            let to = message.to;
            let Some(peer) = peers.get(&to) else {
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
                crate::metrics::PEER_SENT_FAILURES
                    .with_label_values(&[id_hex(to).as_str()])
                    .inc();
                if kind == MessageType::MsgHeartbeat {
                    crate::metrics::HEARTBEAT_SEND_FAILURES.inc();
                }
            }
        }
    }
}
