//! The Watch service with coalescing (etcd `grpcproxy/watch.go`, `watch_broadcast.go`).
//!
//! Vocabulary: a *c-watcher* is a client's watch on the proxy; an *s-watcher* is a watch the
//! proxy holds on the cluster. All s-watchers of one auth identity (`token`) share one watch
//! stream to the cluster (task `grpc-proxy watch upstream`), and an identity's watches are
//! never served from another identity's s-watchers (etcd#19296).
//!
//! **Coalescing.** c-watchers of the same range (and `prev_kv` choice) that start "now"
//! share one *live* s-watcher, whose events go to every member. Each s-watcher remembers
//! `next_rev`: every event below it has been delivered. A c-watcher asking for a start
//! revision `S` joins the live s-watcher when nothing at or above `S` has been delivered yet
//! (`next_rev <= S`) and then drops events below `S`; otherwise it gets a private s-watcher
//! from `S`, which hands its c-watcher over to the live one as soon as the live one has not
//! delivered anything the private one has not (`live.next_rev <= private.next_rev`): no event
//! is lost or repeated. Filters and `prev_kv` stripping are applied per c-watcher.
//!
//! **Exact revisions.** A watch stream opened with the metadata `etcdrs-watch-exact: true`
//! bypasses coalescing: each of its c-watchers has its own s-watcher, created when it asks,
//! so created headers and start points are exactly the cluster's (the opt-out etcd's
//! documentation promised and never shipped).
//!
//! **Progress.** A client's RequestProgress is sent on its identity's cluster stream and
//! answered when the cluster answers: the cluster has then sent, and the proxy has passed on,
//! every event up to that revision for every s-watcher of the stream. Per-watcher progress
//! notifications are passed to the c-watchers that asked for them.
//!
//! **Fragments.** s-watchers ask the cluster for fragments and join them, so a large revision
//! arrives whole whatever the member's limits; a c-watcher that asked for fragments gets
//! responses of [`FRAGMENT_BYTES`] at most, as a member would send them.
//!
//! **Failures.** When the cluster stream breaks, it is reopened on another endpoint and every
//! s-watcher is re-created from its `next_rev`, so clients see no gap and no repeat. A
//! cancel from the cluster (compaction, permission) is passed to every member with its
//! compact revision and reason.
//!
//! **Bounds.** Each client stream has a queue of [`CLIENT_QUEUE`] responses. When a client
//! reads too slowly for its queue, each of its c-watchers that cannot take an event leaves
//! its s-watcher and is *paused* at the revision of the first event it missed (as etcd's
//! server turns a slow watcher into an unsynced one); once the client has drained its queue,
//! the paused c-watchers get private s-watchers from that revision, catch up from the
//! cluster's history and join the live one again. A slow reader thus holds a bounded amount of
//! memory and never slows the others down. Only a client that lets even the room kept for
//! control responses fill up is cut off with an error.
//!
//! Layout: the hub's types are here; `requests` turns a client's requests into hub
//! operations, `deliver` hands the cluster's responses to c-watchers, `state` holds the
//! operations on the state under the hub's lock, `upstream` runs the cluster streams and
//! `client` the client streams and the gRPC service.

use std::collections::{HashMap, HashSet, VecDeque};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use etcdrs_proto::etcdserverpb::watch_client::WatchClient;
use etcdrs_proto::etcdserverpb::{
    ResponseHeader, WatchCancelRequest, WatchCreateRequest, WatchProgressRequest, WatchRequest,
    WatchResponse, watch_request,
};
use etcdrs_proto::fanout::watch_server::Watch;
use etcdrs_proto::fanout::{WatchOut, encode_event};
use etcdrs_proto::mvccpb::{Event, event::EventType};
use futures::Stream;
use parking_lot::Mutex;
use tokio::sync::{Notify, mpsc, oneshot};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tonic::{Request, Response, Status, Streaming};

use crate::leader::require_leader;
use crate::metrics::Metrics;
use crate::namespace::Namespace;
use crate::upstream::{Upstream, token_of, with_token};

mod client;
mod deliver;
mod requests;
mod state;
mod upstream;

use self::upstream::{UpStream, cancel_request, progress_request, run_upstream};

/// Responses a client stream may have queued and not yet read.
pub const CLIENT_QUEUE: usize = 128;
/// Room kept in a client's queue for control responses (created, canceled, progress): events
/// stop being queued for a client once less than this is free.
const CONTROL_RESERVE: usize = 16;
/// How long the cluster stream waits for full client queues to make room before the
/// c-watchers that still have none are paused (etcd's proxy waits 50 ms, then cancels).
const CONGESTION_WAIT: Duration = Duration::from_millis(100);
/// A lagging client's watchers resume once its queue holds fewer responses than this.
const RESUME_BELOW: usize = CLIENT_QUEUE / 4;
/// Progress requests a cluster stream keeps waiting for answers.
const PROGRESS_WAITERS: usize = 1024;
/// Responses to clients that asked for fragments are split at this size: etcd's default
/// `--max-request-bytes`, at which a member fragments its own responses.
const FRAGMENT_BYTES: usize = 1536 * 1024;
/// The metadata key that opts a watch stream out of coalescing.
pub const EXACT_METADATA: &str = "etcdrs-watch-exact";

type ClientId = u64;
type SwId = u64;
/// A client's queue of responses (errors travel on its `kill` token instead, which keeps
/// the queue's slots small).
type ClientTx = mpsc::Sender<WatchOut>;

/// The Watch service of the proxy.
#[derive(Clone)]
pub struct WatchProxy {
    hub: Arc<Hub>,
}

struct Hub {
    upstream: Upstream,
    ns: Namespace,
    metrics: Metrics,
    shutdown: CancellationToken,
    tasks: TaskTracker,
    state: Mutex<State>,
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
struct GroupKey {
    token: String,
    key: Vec<u8>,
    end: Vec<u8>,
    prev_kv: bool,
}

#[derive(Default)]
struct State {
    clients: HashMap<ClientId, ClientState>,
    next_client: ClientId,
    sws: HashMap<SwId, SWatcher>,
    next_sw: SwId,
    /// The live (start "now") s-watcher of each group.
    live: HashMap<GroupKey, SwId>,
    /// Per group, the private s-watchers that will hand their c-watchers to the live one: the
    /// live one stays (even without members) while there are any.
    followers: HashMap<GroupKey, usize>,
    /// One cluster stream per identity.
    streams: HashMap<String, UpStream>,
}

struct ClientState {
    tx: ClientTx,
    token: String,
    exact: bool,
    /// Cut off the client (its queue overflowed).
    kill: CancellationToken,
    /// c-watcher id → its s-watcher.
    watchers: HashMap<i64, SwId>,
    next_watch_id: i64,
    /// Paused s-watchers of this client's lagging c-watchers.
    paused: Vec<SwId>,
    /// Set while `paused` is not empty: the client stream resumes them as it drains.
    lagging: Arc<std::sync::atomic::AtomicBool>,
}

/// A c-watcher, as its s-watcher holds it.
struct Member {
    client: ClientId,
    watch_id: i64,
    /// Events below this revision are not for this watcher.
    min_rev: i64,
    prev_kv: bool,
    progress_notify: bool,
    no_put: bool,
    no_delete: bool,
    /// The client accepts large responses in fragments.
    fragment: bool,
}

/// A c-watcher whose created response waits for its s-watcher's.
struct Waiting {
    member: Member,
    done: oneshot::Sender<()>,
}

struct SWatcher {
    group: GroupKey,
    /// Start revision asked of the cluster (0: now).
    start_rev: i64,
    /// Live s-watchers are shared; private ones belong to one c-watcher.
    live: bool,
    /// A private s-watcher that may hand its c-watcher to the live one.
    mergeable: bool,
    /// Not asked of the cluster yet: its c-watcher lags and waits for room in its queue.
    paused: bool,
    /// The cluster's id for it on the current stream connection, once created.
    upstream_id: Option<i64>,
    /// Every event below this revision has been delivered (0: not created yet).
    next_rev: i64,
    header: ResponseHeader,
    members: Vec<Member>,
    waiting: Vec<Waiting>,
}

impl SWatcher {
    fn created(&self) -> bool {
        self.next_rev > 0
    }

    fn create_request(&self) -> WatchRequest {
        let start_revision = if self.next_rev > 0 {
            self.next_rev
        } else {
            self.start_rev
        };
        WatchRequest {
            request_union: Some(watch_request::RequestUnion::CreateRequest(
                WatchCreateRequest {
                    key: self.group.key.clone(),
                    range_end: self.group.end.clone(),
                    start_revision,
                    progress_notify: true,
                    prev_kv: self.group.prev_kv,
                    // Large revisions come in pieces (joined in `on_response`), so no response
                    // of the cluster exceeds what the proxy accepts.
                    fragment: true,
                    ..Default::default()
                },
            )),
        }
    }
}

/// The response telling a c-watcher it was created, with `header`.
fn created_response(header: &ResponseHeader, watch_id: i64) -> WatchResponse {
    WatchResponse {
        header: Some(*header),
        watch_id,
        created: true,
        ..Default::default()
    }
}
