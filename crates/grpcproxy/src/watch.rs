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
mod state;

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

/// The cluster stream of one identity.
struct UpStream {
    /// Connection generation: responses of an older connection are ignored.
    generation: u64,
    /// Requests for the current connection (none while reconnecting). Entries are bounded by
    /// the s-watchers (one create and one cancel each) and the progress waiters.
    req_tx: Option<mpsc::UnboundedSender<WatchRequest>>,
    /// The cluster's watch ids on the current connection.
    ids: HashMap<i64, SwId>,
    /// s-watchers whose create was sent and not yet answered, in order.
    pending: VecDeque<SwId>,
    sws: HashSet<SwId>,
    /// Events of fragmented responses, by the cluster's watch id, until the last fragment.
    partial: HashMap<i64, Vec<Event>>,
    progress_waiters: VecDeque<ClientId>,
    /// Wakes the stream's task when it has no s-watcher left.
    idle: Arc<Notify>,
}

impl UpStream {
    fn send(&self, request: WatchRequest) {
        if let Some(tx) = &self.req_tx {
            let _ = tx.send(request);
        }
    }
}

fn cancel_request(watch_id: i64) -> WatchRequest {
    WatchRequest {
        request_union: Some(watch_request::RequestUnion::CancelRequest(
            WatchCancelRequest { watch_id },
        )),
    }
}

fn progress_request() -> WatchRequest {
    WatchRequest {
        request_union: Some(watch_request::RequestUnion::ProgressRequest(
            WatchProgressRequest {},
        )),
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

impl Hub {
    /// A response of the cluster stream of `token`, connection `generation`.
    fn on_response(self: &Arc<Self>, token: &str, generation: u64, mut resp: WatchResponse) {
        let mut guard = self.state.lock();
        let state = &mut *guard;
        let Some(stream) = state.streams.get_mut(token) else {
            return;
        };
        if stream.generation != generation {
            return;
        }
        if resp.fragment {
            stream
                .partial
                .entry(resp.watch_id)
                .or_default()
                .append(&mut resp.events);
            return;
        }
        if let Some(mut events) = stream.partial.remove(&resp.watch_id) {
            events.append(&mut resp.events);
            resp.events = events;
        }
        let header = resp.header.unwrap_or_default();
        if resp.created {
            let Some(sw_id) = stream.pending.pop_front() else {
                return;
            };
            if resp.canceled || resp.watch_id < 0 {
                // The cluster refused the watch: so do we, to everyone waiting on it.
                if let Some(sw) = state.remove_sw(sw_id) {
                    fail_members(state, sw, &resp, true);
                }
                return;
            }
            if !state.sws.contains_key(&sw_id) {
                stream.send(cancel_request(resp.watch_id));
                return;
            }
            stream.ids.insert(resp.watch_id, sw_id);
            let Some(sw) = state.sws.get_mut(&sw_id) else {
                return;
            };
            sw.upstream_id = Some(resp.watch_id);
            if sw.next_rev == 0 {
                sw.next_rev = if sw.start_rev > 0 {
                    sw.start_rev
                } else {
                    header.revision + 1
                };
            }
            sw.header = header;
            let live = sw.live;
            let waiting = std::mem::take(&mut sw.waiting);
            let next_rev = sw.next_rev;
            for mut w in waiting {
                if live {
                    w.member.min_rev = w.member.min_rev.max(next_rev);
                }
                let (client, watch_id) = (w.member.client, w.member.watch_id);
                state.join(&self.metrics, sw_id, w.member);
                state.send(client, created_response(&header, watch_id));
                let _ = w.done.send(());
            }
            return;
        }
        if resp.watch_id == -1 && !resp.canceled && resp.events.is_empty() {
            // The answer to RequestProgress: everything up to this revision was delivered.
            let waiters: Vec<ClientId> = stream.progress_waiters.drain(..).collect();
            // A client with paused watchers has not received everything up to this revision:
            // it waits until they are back on the cluster stream (see `resume`).
            let (deferred, waiters): (Vec<ClientId>, Vec<ClientId>) =
                waiters.into_iter().partition(|client| {
                    state
                        .clients
                        .get(client)
                        .is_some_and(|c| !c.paused.is_empty())
                });
            if let Some(stream) = state.streams.get_mut(token) {
                stream.progress_waiters.extend(deferred);
            }
            for client in waiters {
                let reply = WatchResponse {
                    header: Some(header),
                    watch_id: -1,
                    ..Default::default()
                };
                state.send(client, reply);
            }
            return;
        }
        let Some(&sw_id) = stream.ids.get(&resp.watch_id) else {
            return;
        };
        if resp.canceled {
            stream.ids.remove(&resp.watch_id);
            if let Some(sw) = state.sws.get_mut(&sw_id) {
                // The cluster already dropped it: nothing to cancel there.
                sw.upstream_id = None;
            }
            if let Some(sw) = state.remove_sw(sw_id) {
                fail_members(state, sw, &resp, false);
            }
            return;
        }
        // Events, or a per-watcher progress notification.
        if !self.ns.is_empty() {
            for event in &mut resp.events {
                if let Some(kv) = event.kv.as_mut() {
                    self.ns.strip_kv(kv);
                }
                if let Some(kv) = event.prev_kv.as_mut() {
                    self.ns.strip_kv(kv);
                }
            }
        }
        self.deliver(state, sw_id, &resp, header);
    }

    fn deliver(
        self: &Arc<Self>,
        state: &mut State,
        sw_id: SwId,
        resp: &WatchResponse,
        header: ResponseHeader,
    ) {
        let Some(sw) = state.sws.get_mut(&sw_id) else {
            return;
        };
        let last_rev = match resp.events.last().and_then(|e| e.kv.as_ref()) {
            Some(kv) => kv.mod_revision,
            None => header.revision,
        };
        // Each event is encoded once (twice if some member drops `prev_kv`); every member's
        // response shares those bytes.
        let mut encoded: Vec<EncodedEvent> = resp
            .events
            .iter()
            .map(|_| EncodedEvent::default())
            .collect();
        // (client, response, revision of its first event, fragments allowed)
        let mut out: Vec<(ClientId, WatchOut, i64, bool)> = Vec::with_capacity(sw.members.len());
        for m in &sw.members {
            if resp.events.is_empty() {
                if m.progress_notify && header.revision + 1 >= m.min_rev {
                    out.push((
                        m.client,
                        WatchOut {
                            header: Some(header),
                            watch_id: m.watch_id,
                            ..Default::default()
                        },
                        0,
                        false,
                    ));
                }
                continue;
            }
            let mut first = 0;
            let events: Vec<Bytes> = resp
                .events
                .iter()
                .zip(encoded.iter_mut())
                .filter(|(e, _)| e.kv.as_ref().is_some_and(|kv| kv.mod_revision >= m.min_rev))
                .filter(|(e, _)| {
                    let put = e.r#type == EventType::Put as i32;
                    !(put && m.no_put || !put && m.no_delete)
                })
                .map(|(e, enc)| {
                    if first == 0 {
                        first = e.kv.as_ref().map_or(0, |kv| kv.mod_revision);
                    }
                    enc.bytes(e, m.prev_kv)
                })
                .collect();
            if events.is_empty() {
                continue;
            }
            out.push((
                m.client,
                WatchOut {
                    header: Some(header),
                    watch_id: m.watch_id,
                    events,
                    ..Default::default()
                },
                first,
                m.fragment,
            ));
        }
        sw.next_rev = sw.next_rev.max(last_rev + 1);
        sw.header = header;
        let (live, mergeable, group, next_rev) =
            (sw.live, sw.mergeable, sw.group.clone(), sw.next_rev);
        if live && out.len() > 1 {
            self.metrics
                .add_events_coalescing((resp.events.len() * (out.len() - 1)) as u64);
        }
        let mut lagging: Vec<(ClientId, i64, i64)> = Vec::new();
        for (client, response, first, fragment) in out {
            if response.events.is_empty() {
                // A progress notification is advisory: a full queue just skips it.
                if state.has_room(client) {
                    state.send(client, response);
                }
                continue;
            }
            let watch_id = response.watch_id;
            let parts = if fragment {
                response.fragments(FRAGMENT_BYTES)
            } else {
                vec![response]
            };
            if state.room(client) > CONTROL_RESERVE + parts.len() - 1 {
                for part in parts {
                    state.send(client, part);
                }
            } else {
                let first = if first > 0 { first } else { next_rev };
                lagging.push((client, watch_id, first));
            }
        }
        if !lagging.is_empty() {
            self.pause_members(state, sw_id, &lagging);
        }
        if mergeable && state.sws.contains_key(&sw_id) {
            self.try_merge(state, sw_id, &group, next_rev);
        }
    }

    /// The queues of the clients an event response of the cluster stream of `token` goes to
    /// that have no room for it now, with the room each needs (its responses to this one, and
    /// the room kept for control responses).
    fn congested(
        &self,
        token: &str,
        generation: u64,
        resp: &WatchResponse,
    ) -> Vec<(ClientTx, usize)> {
        let state = self.state.lock();
        let Some(stream) = state.streams.get(token) else {
            return Vec::new();
        };
        if stream.generation != generation {
            return Vec::new();
        }
        let Some(sw) = stream
            .ids
            .get(&resp.watch_id)
            .and_then(|id| state.sws.get(id))
        else {
            return Vec::new();
        };
        let mut per_client: HashMap<ClientId, usize> = HashMap::new();
        for m in &sw.members {
            *per_client.entry(m.client).or_default() += 1;
        }
        per_client
            .into_iter()
            .filter_map(|(client, n)| {
                let c = state.clients.get(&client)?;
                let needed = n.min(CLIENT_QUEUE - CONTROL_RESERVE) + CONTROL_RESERVE;
                (c.tx.capacity() < needed).then(|| (c.tx.clone(), needed))
            })
            .collect()
    }

    /// Pauses the c-watchers of `sw_id` that had no room for their events: `(client,
    /// watch_id, revision of the first event they missed)`.
    fn pause_members(
        self: &Arc<Self>,
        state: &mut State,
        sw_id: SwId,
        lagging: &[(ClientId, i64, i64)],
    ) {
        let Some(sw) = state.sws.get_mut(&sw_id) else {
            return;
        };
        let first_of: HashMap<(ClientId, i64), i64> = lagging
            .iter()
            .map(|&(c, w, first)| ((c, w), first))
            .collect();
        let before = sw.members.len();
        let mut taken: HashMap<(ClientId, i64), Vec<Member>> = HashMap::new();
        let mut kept = Vec::with_capacity(before);
        for m in std::mem::take(&mut sw.members) {
            match first_of.get(&(m.client, m.watch_id)) {
                Some(&first) => taken.entry((m.client, first)).or_default().push(m),
                None => kept.push(m),
            }
        }
        sw.members = kept;
        if sw.live {
            let shared = |n: usize| n.saturating_sub(1) as i64;
            self.metrics
                .add_watchers_coalescing(shared(sw.members.len()) - shared(before));
        }
        // The c-watchers of one client that stopped at one revision share a paused watcher.
        let mut clients = HashSet::new();
        for ((client, first), members) in taken {
            state.pause(self, sw_id, client, members, first);
            clients.insert(client);
        }
        state.release_if_unused(sw_id);
        // A client that already drained its queue will not read again to wake its paused
        // watchers: resume them now. (The flag was set first, so a client still reading
        // sees it.)
        for client in clients {
            let drained = state
                .clients
                .get(&client)
                .is_some_and(|c| c.tx.max_capacity() - c.tx.capacity() < RESUME_BELOW);
            if drained {
                state.resume(self, client);
            }
        }
    }

    /// `client` drained its queue: its paused c-watchers catch up from where they stopped.
    fn resume(self: &Arc<Self>, client: ClientId) {
        let mut state = self.state.lock();
        state.resume(self, client);
    }

    /// Hands a private s-watcher's c-watchers to the live one when no event can be lost or
    /// repeated.
    fn try_merge(&self, state: &mut State, sw_id: SwId, group: &GroupKey, next_rev: i64) {
        let Some(&live_id) = state.live.get(group) else {
            return;
        };
        let Some(live) = state.sws.get(&live_id) else {
            return;
        };
        if !live.created() || live.next_rev > next_rev {
            return;
        }
        let Some(private) = state.remove_sw(sw_id) else {
            return;
        };
        for mut m in private.members {
            m.min_rev = m.min_rev.max(next_rev);
            state.join(&self.metrics, live_id, m);
        }
    }

    fn create(
        self: &Arc<Self>,
        client: ClientId,
        req: WatchCreateRequest,
    ) -> Option<oneshot::Receiver<()>> {
        let (key, end) = self.ns.range(&req.key, &req.range_end);
        let mut guard = self.state.lock();
        let state = &mut *guard;
        let c = state.clients.get_mut(&client)?;
        if c.watchers.len() >= etcdrs_serve::watch_limits::WATCHERS_PER_STREAM {
            let refused = WatchResponse {
                watch_id: -1,
                created: true,
                canceled: true,
                cancel_reason: etcdrs_serve::watch_limits::too_many_watchers(),
                ..Default::default()
            };
            state.send(client, refused);
            return None;
        }
        let watch_id = if req.watch_id > 0 && !c.watchers.contains_key(&req.watch_id) {
            req.watch_id
        } else {
            while c.watchers.contains_key(&c.next_watch_id) {
                c.next_watch_id += 1;
            }
            c.next_watch_id
        };
        c.next_watch_id = c.next_watch_id.max(watch_id + 1);
        let (token, exact) = (c.token.clone(), c.exact);
        let member = Member {
            client,
            watch_id,
            min_rev: req.start_revision,
            prev_kv: req.prev_kv,
            progress_notify: req.progress_notify,
            no_put: req.filters.contains(&0),
            no_delete: req.filters.contains(&1),
            fragment: req.fragment,
        };
        let group = GroupKey {
            token,
            key,
            end,
            prev_kv: req.prev_kv,
        };
        let start = req.start_revision;
        let live_id = state.live.get(&group).copied();
        if !exact && let Some(live_id) = live_id {
            let joinable = state.sws.get(&live_id).map(|sw| {
                let can = if start == 0 {
                    true
                } else {
                    sw.created() && sw.next_rev <= start
                };
                (can, sw.created(), sw.next_rev, sw.header)
            });
            if let Some((true, created, next_rev, header)) = joinable {
                if created {
                    let mut member = member;
                    member.min_rev = member.min_rev.max(next_rev);
                    let mut header = header;
                    header.revision = header.revision.max(next_rev - 1);
                    state.join(&self.metrics, live_id, member);
                    state.send(client, created_response(&header, watch_id));
                    return None;
                }
                let (done, wait) = oneshot::channel();
                if let Some(c) = state.clients.get_mut(&client) {
                    c.watchers.insert(watch_id, live_id);
                }
                if let Some(sw) = state.sws.get_mut(&live_id) {
                    sw.waiting.push(Waiting { member, done });
                }
                return Some(wait);
            }
        }
        let live = !exact && start == 0;
        let (done, wait) = oneshot::channel();
        let sw = SWatcher {
            group,
            start_rev: start,
            live,
            mergeable: !exact && start != 0,
            paused: false,
            upstream_id: None,
            next_rev: 0,
            header: ResponseHeader::default(),
            members: Vec::new(),
            waiting: vec![Waiting { member, done }],
        };
        let sw_id = state.add_sw(self, sw);
        if let Some(c) = state.clients.get_mut(&client) {
            c.watchers.insert(watch_id, sw_id);
        }
        Some(wait)
    }

    fn cancel(&self, client: ClientId, watch_id: i64) {
        let mut guard = self.state.lock();
        let state = &mut *guard;
        let Some(sw_id) = state
            .clients
            .get(&client)
            .and_then(|c| c.watchers.get(&watch_id).copied())
        else {
            return;
        };
        let header = state
            .sws
            .get(&sw_id)
            .map(|sw| sw.header)
            .unwrap_or_default();
        state.detach(&self.metrics, client, watch_id);
        state.send(
            client,
            WatchResponse {
                header: Some(header),
                watch_id,
                canceled: true,
                ..Default::default()
            },
        );
    }

    /// RequestProgress from `client`: asks the cluster on the client's stream. `false`: the
    /// client watches nothing there, and the cluster's current revision is the answer.
    fn progress(&self, client: ClientId) -> bool {
        let mut guard = self.state.lock();
        let state = &mut *guard;
        let Some(token) = state.clients.get(&client).map(|c| c.token.clone()) else {
            return true;
        };
        let Some(stream) = state.streams.get_mut(&token) else {
            return false;
        };
        if stream.sws.is_empty() {
            return false;
        }
        if stream.progress_waiters.len() >= PROGRESS_WAITERS {
            return true;
        }
        // While the stream reconnects, the request waits: the reconnection asks for progress
        // once every s-watcher is re-created, so the answer never runs ahead of an event.
        stream.progress_waiters.push_back(client);
        stream.send(progress_request());
        true
    }

    fn remove_client(&self, client: ClientId) {
        let mut guard = self.state.lock();
        let state = &mut *guard;
        let Some(c) = state.clients.get(&client) else {
            return;
        };
        let ids: Vec<i64> = c.watchers.keys().copied().collect();
        for watch_id in ids {
            state.detach(&self.metrics, client, watch_id);
        }
        state.clients.remove(&client);
    }

    /// (Re)connection of the cluster stream of `token`: a new generation, and every
    /// s-watcher asked for again from where it stopped. `None`: the stream has no s-watcher
    /// left and is gone.
    fn connect(&self, token: &str, req_tx: mpsc::UnboundedSender<WatchRequest>) -> Option<u64> {
        let mut guard = self.state.lock();
        let state = &mut *guard;
        let stream = state.streams.get_mut(token)?;
        if stream.sws.is_empty() {
            state.streams.remove(token);
            return None;
        }
        stream.generation += 1;
        stream.ids.clear();
        stream.partial.clear();
        stream.pending.clear();
        let mut ids: Vec<SwId> = stream.sws.iter().copied().collect();
        ids.sort_unstable();
        for id in ids {
            if let Some(sw) = state.sws.get_mut(&id) {
                sw.upstream_id = None;
                let _ = req_tx.send(sw.create_request());
                stream.pending.push_back(id);
            }
        }
        if !stream.progress_waiters.is_empty() {
            let _ = req_tx.send(progress_request());
        }
        stream.req_tx = Some(req_tx);
        Some(stream.generation)
    }

    fn disconnect(&self, token: &str, generation: u64) {
        let mut state = self.state.lock();
        if let Some(stream) = state.streams.get_mut(token)
            && stream.generation == generation
        {
            stream.req_tx = None;
        }
    }

    fn idle_notify(&self, token: &str) -> Option<Arc<Notify>> {
        self.state.lock().streams.get(token).map(|s| s.idle.clone())
    }

    /// Whether the stream of `token` has no s-watcher (it is then removed).
    fn remove_if_idle(&self, token: &str) -> bool {
        let mut state = self.state.lock();
        match state.streams.get(token) {
            Some(stream) if stream.sws.is_empty() => {
                state.streams.remove(token);
                true
            }
            Some(_) => false,
            None => true,
        }
    }
}

/// Tells every member and waiter of `sw` it was cancelled, with the cluster's reason.
/// One event of a cluster response, encoded on first use: as received, and without its
/// `prev_kv` for members that did not ask for it.
#[derive(Default)]
struct EncodedEvent {
    full: Option<Bytes>,
    without_prev: Option<Bytes>,
}

impl EncodedEvent {
    fn bytes(&mut self, event: &Event, prev_kv: bool) -> Bytes {
        if prev_kv || event.prev_kv.is_none() {
            self.full.get_or_insert_with(|| encode_event(event)).clone()
        } else {
            self.without_prev
                .get_or_insert_with(|| {
                    encode_event(&Event {
                        prev_kv: None,
                        ..event.clone()
                    })
                })
                .clone()
        }
    }
}

fn fail_members(state: &mut State, sw: SWatcher, resp: &WatchResponse, on_create: bool) {
    let header = resp.header.unwrap_or_default();
    let response = |watch_id: i64, created: bool| WatchResponse {
        header: Some(header),
        watch_id,
        created,
        canceled: true,
        compact_revision: resp.compact_revision,
        cancel_reason: resp.cancel_reason.clone(),
        ..Default::default()
    };
    for m in sw.members {
        if let Some(c) = state.clients.get_mut(&m.client) {
            c.watchers.remove(&m.watch_id);
        }
        state.send(m.client, response(m.watch_id, false));
    }
    for w in sw.waiting {
        if let Some(c) = state.clients.get_mut(&w.member.client) {
            c.watchers.remove(&w.member.watch_id);
        }
        state.send(w.member.client, response(w.member.watch_id, on_create));
        let _ = w.done.send(());
    }
}

/// Task `grpc-proxy watch upstream`: the cluster stream of one identity, reconnected to the
/// current endpoint whenever it breaks, until it has no s-watcher left or the proxy stops.
async fn run_upstream(hub: Arc<Hub>, token: String) {
    let mut backoff = Duration::from_millis(50);
    loop {
        if hub.shutdown.is_cancelled() {
            return;
        }
        let Some(idle) = hub.idle_notify(&token) else {
            return;
        };
        let (idx, channel) = hub.upstream.current();
        let (req_tx, req_rx) = mpsc::unbounded_channel();
        let Some(generation) = hub.connect(&token, req_tx) else {
            return;
        };
        let mut client =
            WatchClient::new(channel).max_decoding_message_size(hub.upstream.max_decoding());
        let requests = tokio_stream::wrappers::UnboundedReceiverStream::new(req_rx);
        let opened = tokio::select! {
            _ = hub.shutdown.cancelled() => return,
            r = client.watch(require_leader(with_token(&token, requests))) => r,
        };
        match opened {
            Ok(resp) => {
                let mut stream = resp.into_inner();
                loop {
                    let message = tokio::select! {
                        _ = hub.shutdown.cancelled() => return,
                        _ = idle.notified() => {
                            if hub.remove_if_idle(&token) {
                                return;
                            }
                            continue;
                        }
                        m = stream.message() => m,
                    };
                    match message {
                        Ok(Some(resp)) => {
                            backoff = Duration::from_millis(50);
                            if !resp.events.is_empty() {
                                // Bursts are absorbed by briefly holding the cluster stream
                                // (its flow control then slows the member down); clients
                                // still full after that are paused.
                                let full = hub.congested(&token, generation, &resp);
                                let deadline = tokio::time::Instant::now() + CONGESTION_WAIT;
                                for (tx, needed) in full {
                                    let room = tx.reserve_many(needed);
                                    let _ = tokio::time::timeout_at(deadline, room).await;
                                }
                            }
                            hub.on_response(&token, generation, resp);
                        }
                        Ok(None) => break,
                        Err(status) => {
                            if crate::upstream::failover(&status) {
                                hub.upstream.failed(idx);
                            }
                            tracing::warn!(error = %status.message(), "gRPC proxy watch stream to the cluster failed");
                            break;
                        }
                    }
                }
            }
            Err(status) => {
                if crate::upstream::failover(&status) {
                    hub.upstream.failed(idx);
                }
            }
        }
        hub.disconnect(&token, generation);
        tokio::select! {
            _ = hub.shutdown.cancelled() => return,
            _ = tokio::time::sleep(backoff) => {}
        }
        backoff = (backoff * 2).min(Duration::from_secs(1));
    }
}
