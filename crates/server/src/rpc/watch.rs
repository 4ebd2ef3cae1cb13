//! The Watch service (etcd `api/v3rpc/watch.go`): one bidirectional stream carries many
//! watchers. Creates, cancels and progress requests arrive on the request side; events come
//! from the [`WatchHub`](etcdrs_mvcc::WatchHub) through the stream's one bounded channel.
//!
//! The response stream is a state machine driven by the gRPC layer's polling (no task per
//! stream): control responses are queued in an outbox that is always drained before more
//! events are taken from the channel, so a watcher's `created` response precedes its events
//! and a progress report follows every event it covers.
//!
//! The hub names in one message every watcher of the stream that gets the same events. The
//! stream answers each of them with its own response, made when it is sent, and merges the
//! messages already waiting in the channel: a stream that fell behind answers each watcher
//! once for all of them (etcd's catch-up too sends many revisions in one response), so the
//! work per event shrinks as the load grows instead of the stream falling further behind.
//!
//! A busy stream (more than 25,000 events a second delivered, counted per watcher) also holds
//! a hot watcher's next events until 20 ms after it was last sent some, or until the channel
//! is half full, so that they go in one response. A client pays for each response (a Go
//! client about 6 µs: decoding and three goroutine hand-offs) more than for each event; etcd
//! reaches the same shape only by falling behind, when its slow watchers are caught up every
//! 100 ms. A quiet stream, or a watcher that has not been sent events within the hold, is
//! answered at once.

use std::collections::{HashMap, VecDeque};
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use etcdrs_mvcc::{
    Filters, HubMsg, KeyRange, RangeParams, SharedEvent, StreamId, WatchId, WatchRange,
};
use etcdrs_proto::etcdserverpb::watch_create_request::FilterType;
use etcdrs_proto::etcdserverpb::watch_request::RequestUnion;
use etcdrs_proto::etcdserverpb::{WatchCreateRequest, WatchRequest, WatchResponse};
use etcdrs_proto::fanout::watch_server::Watch;
use etcdrs_proto::fanout::{WatchOut, frame_events};
use etcdrs_proto::mvccpb::{Event, KeyValue, event::EventType};
use futures::{Stream, StreamExt};
use tokio::sync::mpsc;
use tonic::{Request, Response, Status, Streaming};

use super::Rpc;
use crate::EtcdServer;

/// Capacity of a stream's channel, in responses (etcd's `chanBufLen`).
const STREAM_CHANNEL: usize = 128;
/// How often a stream re-checks a deferred progress request.
const PROGRESS_POLL: Duration = Duration::from_millis(50);
/// etcd's id for responses that belong to no watcher.
const INVALID_WATCH_ID: WatchId = -1;
/// Most hub messages merged into one round of responses (`StreamState::take_hub`): the
/// channel's capacity, so a stream that fell behind by a whole channel catches up at once.
const MAX_MERGED_MESSAGES: usize = STREAM_CHANNEL;
/// Most events merged into one watcher's response (etcd's catch-up sends at most 1000
/// revisions at a time), which bounds a merged response's size.
const MAX_MERGED_EVENTS: usize = 1000;

/// How long a busy stream's watchers wait for more events after they were sent some (see
/// [`StreamLoad`]).
const HOT_WATCHER_HOLD: Duration = Duration::from_millis(20);
/// A stream is busy once it delivered this many events per second (counted once per
/// watcher that got them) over the last [`HOT_WATCHER_HOLD`].
const BUSY_EVENTS_PER_SEC: u64 = 25_000;
/// How often a held stream looks at how full its channel is.
const HOLD_POLL: Duration = Duration::from_millis(2);

/// How many events a stream delivered lately: whether it is busy enough that its watchers'
/// events are better sent in fewer, larger responses.
struct StreamLoad {
    window_start: tokio::time::Instant,
    events: u64,
    busy: bool,
}

impl StreamLoad {
    fn new(now: tokio::time::Instant) -> StreamLoad {
        StreamLoad {
            window_start: now,
            events: 0,
            busy: false,
        }
    }

    /// One response carrying `events` events went out at `now`.
    fn sent(&mut self, events: usize, now: tokio::time::Instant) {
        let window = HOT_WATCHER_HOLD;
        let elapsed = now.saturating_duration_since(self.window_start);
        if elapsed >= window {
            let threshold = BUSY_EVENTS_PER_SEC * window.as_millis() as u64 / 1000;
            self.busy = elapsed < window * 2 && self.events >= threshold;
            self.window_start = now;
            self.events = 0;
        }
        self.events = self.events.saturating_add(events as u64);
    }

    /// Whether the last full window was busy (and is recent).
    fn busy(&self, now: tokio::time::Instant) -> bool {
        self.busy && now.saturating_duration_since(self.window_start) < HOT_WATCHER_HOLD * 2
    }
}

type WatchStream = Pin<Box<dyn Stream<Item = Result<WatchOut, Status>> + Send>>;

#[derive(Clone, Copy, Default)]
struct WatchOpts {
    prev_kv: bool,
    fragment: bool,
    progress_notify: bool,
    /// Events were sent since the last progress tick (etcd skips the next notification).
    sent_since_tick: bool,
    /// When the watcher was last sent events.
    last_events: Option<tokio::time::Instant>,
}

struct StreamState {
    server: EtcdServer,
    stream: StreamId,
    requests: Streaming<WatchRequest>,
    tx: mpsc::Sender<HubMsg>,
    rx: mpsc::Receiver<HubMsg>,
    watches: HashMap<WatchId, WatchOpts>,
    next_id: WatchId,
    /// What to send, in order: responses, and batches of events answered one watcher at a
    /// time as they are sent (so a message naming many watchers costs one response's memory
    /// at a time), events pre-encoded (`proto::fanout`): an event going to many watchers is
    /// encoded once.
    outbox: VecDeque<Queued>,
    /// A message taken from the hub's channel while draining it up to a progress report's
    /// revision, past that revision: handled before any other, after the report.
    held: Option<HubMsg>,
    progress_tick: tokio::time::Interval,
    progress_poll: tokio::time::Interval,
    progress_pending: bool,
    /// Some watcher of the stream asked for progress notifications (so receiving events
    /// marks watchers as sent to since the last tick).
    any_progress_notify: bool,
    /// The client closed its sending side: no more requests, but the watchers go on.
    requests_done: bool,
    /// Events delivered lately, which decides whether hot watchers' events wait to be
    /// batched ([`StreamState::hold_until`]).
    load: StreamLoad,
    /// Who opened the stream (auth on): every watch it creates must be readable by them. An
    /// invalid token makes every create fail the permission check, as in etcd (the stream
    /// itself stays open).
    auth: Result<Option<crate::auth::AuthInfo>, Status>,
}

impl Drop for StreamState {
    fn drop(&mut self) {
        self.server.watch_hub().close_stream(self.stream);
    }
}

/// An entry of a stream's outbox.
enum Queued {
    /// A response as it goes out.
    Ready(WatchOut),
    /// The same events for each of some watchers.
    Events(EventBatch),
    /// A watcher canceled because its history was compacted, answered after the events
    /// queued before it.
    Compacted {
        watch_id: WatchId,
        compact_revision: i64,
    },
}

/// Events for some watchers, each answered with one response when the outbox reaches it.
struct EventBatch {
    /// The revision of the responses' header.
    revision: i64,
    /// The watchers still to answer.
    watch_ids: std::vec::IntoIter<WatchId>,
    events: Vec<Arc<SharedEvent>>,
    /// `events` encoded and framed for every response (`WatchOut::framed_events`), without
    /// and with previous values, each made when first needed.
    plain: Option<Bytes>,
    with_prev: Option<Bytes>,
}

/// Consecutive hub messages naming the same watchers, their events joined.
struct Run {
    watch_ids: Vec<WatchId>,
    events: Vec<Arc<SharedEvent>>,
}

enum Step {
    Request(Option<Result<WatchRequest, Status>>),
    Hub(Option<HubMsg>),
    ProgressTick,
    ProgressPoll,
}

impl StreamState {
    fn header(&self, revision: i64) -> Option<etcdrs_proto::etcdserverpb::ResponseHeader> {
        Some(self.server.header(revision.max(1)))
    }

    fn control(&mut self, watch_id: WatchId, revision: i64) -> WatchResponse {
        WatchResponse {
            header: self.header(revision),
            watch_id,
            ..WatchResponse::default()
        }
    }

    fn create(&mut self, req: WatchCreateRequest) {
        let current = self.server.store().current_rev();
        let permitted = match &self.auth {
            Ok(auth) => self
                .server
                .auth()
                .check_range(auth.as_ref(), &req.key, &req.range_end, false)
                .map_err(Status::from),
            Err(status) => Err(status.clone()),
        };
        if let Err(status) = permitted {
            // etcd cancels the watch with the text of its gRPC error, status prefix included.
            let mut resp = self.control(INVALID_WATCH_ID, current);
            resp.created = true;
            resp.canceled = true;
            resp.cancel_reason = format!(
                "rpc error: code = {:?} desc = {}",
                status.code(),
                status.message()
            );
            self.outbox.push_back(Queued::Ready(resp.into()));
            return;
        }
        let key = if req.key.is_empty() { vec![0] } else { req.key };
        let range = WatchRange {
            key,
            end: req.range_end,
        };
        let refuse = |state: &mut StreamState, reason: &str| {
            let mut resp = state.control(INVALID_WATCH_ID, current);
            resp.created = true;
            resp.canceled = true;
            resp.cancel_reason = reason.to_string();
            state.outbox.push_back(Queued::Ready(resp.into()));
        };
        if range.is_empty_range() {
            refuse(self, "mvcc: watcher range is empty");
            return;
        }
        if self.watches.len() >= etcdrs_serve::watch_limits::WATCHERS_PER_STREAM {
            refuse(self, &etcdrs_serve::watch_limits::too_many_watchers());
            return;
        }
        let id = if req.watch_id == 0 {
            while self.watches.contains_key(&self.next_id) {
                self.next_id += 1;
            }
            let id = self.next_id;
            self.next_id += 1;
            id
        } else if self.watches.contains_key(&req.watch_id) {
            refuse(self, "mvcc: duplicate watch ID provided on the WatchStream");
            return;
        } else {
            req.watch_id
        };
        let filters = Filters {
            no_put: req.filters.contains(&(FilterType::Noput as i32)),
            no_delete: req.filters.contains(&(FilterType::Nodelete as i32)),
        };
        self.any_progress_notify |= req.progress_notify;
        self.watches.insert(
            id,
            WatchOpts {
                prev_kv: req.prev_kv,
                fragment: req.fragment,
                progress_notify: req.progress_notify,
                sent_since_tick: false,
                last_events: None,
            },
        );
        let mut resp = self.control(id, current);
        resp.created = true;
        self.outbox.push_back(Queued::Ready(resp.into()));
        let start = if req.start_revision > 0 {
            req.start_revision
        } else {
            current + 1
        };
        let synced =
            self.server
                .watch_hub()
                .watch(self.stream, id, range, filters, start, self.tx.clone());
        if !synced {
            self.server.wake_watch_sync();
        }
    }

    fn handle_request(&mut self, req: WatchRequest) {
        match req.request_union {
            Some(RequestUnion::CreateRequest(create)) => self.create(create),
            Some(RequestUnion::CancelRequest(cancel))
                if self.server.watch_hub().cancel(self.stream, cancel.watch_id) =>
            {
                self.watches.remove(&cancel.watch_id);
                let current = self.server.store().current_rev();
                let mut resp = self.control(cancel.watch_id, current);
                resp.canceled = true;
                self.outbox.push_back(Queued::Ready(resp.into()));
            }
            // Canceling an unknown watcher gets no answer, as in etcd.
            Some(RequestUnion::CancelRequest(_)) => {}
            Some(RequestUnion::ProgressRequest(_)) => {
                self.progress_pending = true;
                self.try_progress();
            }
            None => {}
        }
    }

    /// Answer a pending progress request once every watcher of the stream is synced, after
    /// every event its revision covers. The revision is at least that of every write
    /// answered before: a batch's proposers are answered just before its watchers are told,
    /// and both before its commit, which `wait_committed` waits for.
    fn try_progress(&mut self) {
        if !self.progress_pending {
            return;
        }
        self.server.store().wait_committed();
        let Some(revision) = self.server.watch_hub().progress_rev(self.stream) else {
            return;
        };
        self.drain_channel(revision);
        self.progress_pending = false;
        let resp = self.control(INVALID_WATCH_ID, revision);
        self.outbox.push_back(Queued::Ready(resp.into()));
    }

    /// Queues what the hub sent up to `revision`, the revision of a progress report about to
    /// be queued: every event up to it goes before the report, and none after it (the hub may
    /// have sent later revisions since the report's revision was read; the first is held).
    fn drain_channel(&mut self, revision: i64) {
        while let Some(msg) = self.next_hub(Some(revision)) {
            self.take_hub(msg, Some(revision));
        }
    }

    /// The next message from the hub (the held one first), if there is one and it is not past
    /// `limit`; one past it is held.
    fn next_hub(&mut self, limit: Option<i64>) -> Option<HubMsg> {
        let msg = match self.held.take() {
            Some(msg) => msg,
            None => self.rx.try_recv().ok()?,
        };
        match (&msg, limit) {
            (HubMsg::Events { revision, .. }, Some(limit)) if *revision > limit => {
                self.held = Some(msg);
                None
            }
            _ => Some(msg),
        }
    }

    /// Queues `first` and the hub messages already waiting behind it (up to
    /// [`MAX_MERGED_MESSAGES`] and [`MAX_MERGED_EVENTS`]), merged: each watcher they name gets
    /// one response with its events of all of them, in order, as etcd's catch-up answers a
    /// watcher with many revisions at once. A stream that keeps up merges nothing; one that
    /// falls behind answers with fewer, larger responses instead of a response per revision.
    /// Messages past `limit` are not merged (see [`StreamState::drain_channel`]).
    fn take_hub(&mut self, first: HubMsg, limit: Option<i64>) {
        let mut runs: Vec<Run> = Vec::new();
        let mut revision = 0;
        let mut n_messages = 0;
        let mut n_events = 0;
        let mut next = Some(first);
        while let Some(msg) = next.take() {
            match msg {
                HubMsg::Events {
                    watch_ids,
                    events,
                    revision: msg_revision,
                    ..
                } => {
                    revision = revision.max(msg_revision);
                    n_messages += 1;
                    n_events += events.len();
                    if self.any_progress_notify {
                        for id in &watch_ids {
                            if let Some(opts) = self.watches.get_mut(id) {
                                opts.sent_since_tick = true;
                            }
                        }
                    }
                    // The hub names a key's watchers in the same order each revision, so
                    // consecutive messages to the same watchers are one run.
                    match runs.last_mut() {
                        Some(last) if last.watch_ids == watch_ids => last.events.extend(events),
                        _ => runs.push(Run { watch_ids, events }),
                    }
                }
                // A cancel goes after the events queued before it, and ends the merge.
                HubMsg::Compacted {
                    watch_id,
                    compact_revision,
                } => {
                    self.queue_runs(std::mem::take(&mut runs), revision);
                    self.outbox.push_back(Queued::Compacted {
                        watch_id,
                        compact_revision,
                    });
                    return;
                }
            }
            if n_messages < MAX_MERGED_MESSAGES && n_events < MAX_MERGED_EVENTS {
                next = self.next_hub(limit);
            }
        }
        self.queue_runs(runs, revision);
    }

    /// Queues the merged `runs` (see [`StreamState::take_hub`]): one [`EventBatch`] per set of
    /// watchers wanting the same events.
    fn queue_runs(&mut self, runs: Vec<Run>, revision: i64) {
        let batch = |watch_ids: Vec<WatchId>, events| {
            Queued::Events(EventBatch {
                revision,
                watch_ids: watch_ids.into_iter(),
                events,
                plain: None,
                with_prev: None,
            })
        };
        if runs.len() <= 1 {
            for run in runs {
                self.outbox.push_back(batch(run.watch_ids, run.events));
            }
            return;
        }
        // Which runs each watcher is in (in order), then the watchers with the same runs.
        let mut runs_of: HashMap<WatchId, Vec<usize>> = HashMap::new();
        for (i, run) in runs.iter().enumerate() {
            for id in &run.watch_ids {
                runs_of.entry(*id).or_default().push(i);
            }
        }
        let mut watchers_of: HashMap<Vec<usize>, Vec<WatchId>> = HashMap::new();
        for (id, indexes) in runs_of {
            watchers_of.entry(indexes).or_default().push(id);
        }
        for (indexes, mut watch_ids) in watchers_of {
            watch_ids.sort_unstable();
            let events = indexes
                .iter()
                .flat_map(|i| runs[*i].events.iter().cloned())
                .collect();
            self.outbox.push_back(batch(watch_ids, events));
        }
    }

    /// The next response to send: the outbox's front, a queued batch answering its next
    /// watcher (one response, or its fragments), or a queued cancel.
    fn next_out(&mut self) -> Option<WatchOut> {
        loop {
            match self.outbox.pop_front()? {
                Queued::Ready(resp) => return Some(resp),
                Queued::Compacted {
                    watch_id,
                    compact_revision,
                } => {
                    if self.watches.remove(&watch_id).is_none() {
                        continue;
                    }
                    let current = self.server.store().current_rev();
                    let mut resp = self.control(watch_id, current);
                    resp.canceled = true;
                    resp.compact_revision = compact_revision;
                    return Some(resp.into());
                }
                Queued::Events(mut batch) => {
                    let Some(watch_id) = batch.watch_ids.next() else {
                        continue;
                    };
                    let resp = self.answer(&mut batch, watch_id);
                    if resp.is_some() {
                        let now = tokio::time::Instant::now();
                        self.load.sent(batch.events.len(), now);
                        if let Some(opts) = self.watches.get_mut(&watch_id) {
                            opts.last_events = Some(now);
                        }
                    }
                    if batch.watch_ids.len() > 0 {
                        self.outbox.push_front(Queued::Events(batch));
                    }
                    let Some((resp, fragment)) = resp else {
                        continue;
                    };
                    if !fragment {
                        return Some(resp);
                    }
                    let max = self.server.config().max_request_bytes as usize;
                    let mut parts = resp.fragments(max).into_iter();
                    let first = parts.next();
                    for part in parts.rev() {
                        self.outbox.push_front(Queued::Ready(part));
                    }
                    if first.is_some() {
                        return first;
                    }
                }
            }
        }
    }

    /// `batch`'s response to `watch_id` (none for a watcher canceled since), and whether the
    /// watcher wants it in fragments. The events are encoded and framed once per batch, with
    /// and without previous values, each when first needed: a response costs its header, its
    /// watch id and one reference to the framed events.
    fn answer(&self, batch: &mut EventBatch, watch_id: WatchId) -> Option<(WatchOut, bool)> {
        let opts = self.watches.get(&watch_id)?;
        let events = if opts.prev_kv {
            batch.with_prev.get_or_insert_with(|| {
                let encoded: Vec<Bytes> = batch
                    .events
                    .iter()
                    .map(|e| e.encoded_with_prev(|event| prev_kv(&self.server, event)))
                    .collect();
                frame_events(&encoded)
            })
        } else {
            batch.plain.get_or_insert_with(|| {
                let encoded: Vec<Bytes> = batch.events.iter().map(|e| e.encoded()).collect();
                frame_events(&encoded)
            })
        };
        let resp = WatchOut {
            header: self.header(batch.revision),
            watch_id,
            framed_events: events.clone(),
            ..WatchOut::default()
        };
        Some((resp, opts.fragment))
    }

    fn progress_notifications(&mut self) {
        let synced = self.server.watch_hub().progress_rev(self.stream);
        let mut due = Vec::new();
        for (id, opts) in self.watches.iter_mut() {
            if !opts.progress_notify {
                continue;
            }
            if opts.sent_since_tick {
                opts.sent_since_tick = false;
            } else {
                due.push(*id);
            }
        }
        let Some(revision) = synced else { return };
        if due.is_empty() {
            return;
        }
        self.drain_channel(revision);
        due.sort_unstable();
        for id in due {
            let resp = self.control(id, revision);
            self.outbox.push_back(Queued::Ready(resp.into()));
        }
    }

    /// Until when events for the watchers `msg` names wait for more to join them: on a busy
    /// stream, a watcher sent events less than [`HOT_WATCHER_HOLD`] ago gets its next ones at
    /// most once per hold, all that came in between in one response. The stream's requests
    /// wait out the hold too (at most 20 ms), which keeps every response in order.
    fn hold_until(&self, msg: &HubMsg) -> Option<tokio::time::Instant> {
        let HubMsg::Events { watch_ids, .. } = msg else {
            return None;
        };
        let now = tokio::time::Instant::now();
        if !self.load.busy(now) {
            return None;
        }
        let last = self.watches.get(watch_ids.first()?)?.last_events?;
        let until = last + HOT_WATCHER_HOLD;
        (until > now).then_some(until)
    }

    async fn next_response(&mut self) -> Option<Result<WatchOut, Status>> {
        loop {
            if let Some(resp) = self.next_out() {
                return Some(Ok(resp));
            }
            if let Some(msg) = self.held.take() {
                self.take_hub(msg, None);
                self.try_progress();
                continue;
            }
            let step = tokio::select! {
                req = self.requests.next(), if !self.requests_done => Step::Request(req),
                msg = self.rx.recv() => Step::Hub(msg),
                _ = self.progress_tick.tick() => Step::ProgressTick,
                _ = self.progress_poll.tick(), if self.progress_pending => Step::ProgressPoll,
            };
            match step {
                Step::Request(Some(Ok(req))) => self.handle_request(req),
                // The stream broke or its message was refused (too large): the watch stream
                // ends with that status, as etcd's returns its receive error.
                Step::Request(Some(Err(status))) => {
                    crate::metrics::stream_receive_failed("watch", &status);
                    return Some(Err(etcdrs_serve::grpc_size::grpc_go_status(status)));
                }
                // The client closed its side (clientv3's CloseSend): as etcd's, the stream
                // goes on answering its watchers until the client goes away.
                Step::Request(None) => self.requests_done = true,
                Step::Hub(Some(msg)) => {
                    if let Some(until) = self.hold_until(&msg) {
                        // Until then, or until the channel is half full: a full one would
                        // send its watchers to catch-up from history, which is slower.
                        while self.rx.len() < STREAM_CHANNEL / 2 {
                            let now = tokio::time::Instant::now();
                            if now >= until {
                                break;
                            }
                            tokio::time::sleep_until(until.min(now + HOLD_POLL)).await;
                        }
                    }
                    self.take_hub(msg, None);
                    self.try_progress();
                }
                Step::Hub(None) => return None,
                Step::ProgressTick => self.progress_notifications(),
                Step::ProgressPoll => self.try_progress(),
            }
        }
    }
}

/// The value `event`'s key had just before it (none for a creation).
fn prev_kv(server: &EtcdServer, event: &Event) -> Option<KeyValue> {
    let kv = event.kv.as_ref()?;
    let is_create = event.r#type == EventType::Put as i32 && kv.version == 1;
    if is_create {
        return None;
    }
    let params = RangeParams {
        rev: kv.mod_revision - 1,
        ..RangeParams::default()
    };
    let mut prev = server
        .store()
        .range(KeyRange::new(&kv.key, &[]), params)
        .ok()?;
    prev.kvs.pop()
}

#[tonic::async_trait]
impl Watch for Rpc {
    type WatchStream = WatchStream;

    async fn watch(
        &self,
        request: Request<Streaming<WatchRequest>>,
    ) -> Result<Response<Self::WatchStream>, Status> {
        self.server.check_not_learner()?;
        let auth = self.auth_info(&request);
        let (tx, rx) = mpsc::channel(STREAM_CHANNEL);
        let interval = self
            .server
            .config()
            .watch_progress_notify_interval
            .max(Duration::from_millis(100));
        let mut progress_tick =
            tokio::time::interval_at(tokio::time::Instant::now() + interval, interval);
        progress_tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut progress_poll = tokio::time::interval(PROGRESS_POLL);
        progress_poll.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let state = StreamState {
            stream: self.server.watch_hub().new_stream(),
            server: self.server.clone(),
            requests: request.into_inner(),
            tx,
            rx,
            watches: HashMap::new(),
            next_id: 0,
            outbox: VecDeque::new(),
            held: None,
            progress_tick,
            progress_poll,
            progress_pending: false,
            any_progress_notify: false,
            requests_done: false,
            load: StreamLoad::new(tokio::time::Instant::now()),
            auth,
        };
        let stream = futures::stream::unfold(state, |mut state| async move {
            let item = state.next_response().await?;
            Some((item, state))
        });
        Ok(Response::new(Box::pin(stream)))
    }
}
