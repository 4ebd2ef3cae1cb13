//! The Watch service (etcd `api/v3rpc/watch.go`): one bidirectional stream carries many
//! watchers. Creates, cancels and progress requests arrive on the request side; events come
//! from the [`WatchHub`](etcdrs_mvcc::WatchHub) through the stream's one bounded channel.
//!
//! The response stream is a state machine driven by the gRPC layer's polling (no task per
//! stream): control responses are queued in an outbox that is always drained before more
//! events are taken from the channel, so a watcher's `created` response precedes its events
//! and a progress report follows every event it covers.

use std::collections::{HashMap, VecDeque};
use std::pin::Pin;
use std::time::Duration;

use bytes::Bytes;
use etcdrs_mvcc::{Filters, HubMsg, KeyRange, RangeParams, StreamId, WatchId, WatchRange};
use etcdrs_proto::etcdserverpb::watch_create_request::FilterType;
use etcdrs_proto::etcdserverpb::watch_request::RequestUnion;
use etcdrs_proto::etcdserverpb::{WatchCreateRequest, WatchRequest, WatchResponse};
use etcdrs_proto::fanout::WatchOut;
use etcdrs_proto::fanout::watch_server::Watch;
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

type WatchStream = Pin<Box<dyn Stream<Item = Result<WatchOut, Status>> + Send>>;

#[derive(Clone, Copy, Default)]
struct WatchOpts {
    prev_kv: bool,
    fragment: bool,
    progress_notify: bool,
    /// Events were sent since the last progress tick (etcd skips the next notification).
    sent_since_tick: bool,
}

struct StreamState {
    server: EtcdServer,
    stream: StreamId,
    requests: Streaming<WatchRequest>,
    tx: mpsc::Sender<HubMsg>,
    rx: mpsc::Receiver<HubMsg>,
    watches: HashMap<WatchId, WatchOpts>,
    next_id: WatchId,
    /// Responses to send, events pre-encoded (`proto::fanout`): an event going to many
    /// watchers is encoded once.
    outbox: VecDeque<WatchOut>,
    progress_tick: tokio::time::Interval,
    progress_poll: tokio::time::Interval,
    progress_pending: bool,
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
            self.outbox.push_back(resp.into());
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
            state.outbox.push_back(resp.into());
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
        self.watches.insert(
            id,
            WatchOpts {
                prev_kv: req.prev_kv,
                fragment: req.fragment,
                progress_notify: req.progress_notify,
                sent_since_tick: false,
            },
        );
        let mut resp = self.control(id, current);
        resp.created = true;
        self.outbox.push_back(resp.into());
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
                self.outbox.push_back(resp.into());
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
    /// every event its revision covers.
    fn try_progress(&mut self) {
        if !self.progress_pending {
            return;
        }
        let Some(revision) = self.server.watch_hub().progress_rev(self.stream) else {
            return;
        };
        self.drain_channel();
        self.progress_pending = false;
        let resp = self.control(INVALID_WATCH_ID, revision);
        self.outbox.push_back(resp.into());
    }

    fn drain_channel(&mut self) {
        while let Ok(msg) = self.rx.try_recv() {
            self.handle_hub(msg);
        }
    }

    fn handle_hub(&mut self, msg: HubMsg) {
        match msg {
            HubMsg::Events {
                watch_ids,
                events,
                revision,
                ..
            } => {
                // One header and one list of encoded events for every watcher of the message
                // (with and without previous values, each made when first needed).
                let header = self.header(revision);
                let mut plain: Option<Vec<Bytes>> = None;
                let mut with_prev: Option<Vec<Bytes>> = None;
                let max = self.server.config().max_request_bytes as usize;
                for watch_id in watch_ids {
                    let Some(opts) = self.watches.get_mut(&watch_id) else {
                        continue;
                    };
                    opts.sent_since_tick = true;
                    let opts = *opts;
                    let encoded = if opts.prev_kv {
                        with_prev.get_or_insert_with(|| {
                            events
                                .iter()
                                .map(|e| e.encoded_with_prev(|event| self.prev_kv(event)))
                                .collect()
                        })
                    } else {
                        plain.get_or_insert_with(|| events.iter().map(|e| e.encoded()).collect())
                    };
                    let resp = WatchOut {
                        header,
                        watch_id,
                        events: encoded.clone(),
                        ..WatchOut::default()
                    };
                    if opts.fragment {
                        self.outbox.extend(resp.fragments(max));
                    } else {
                        self.outbox.push_back(resp);
                    }
                }
            }
            HubMsg::Compacted {
                watch_id,
                compact_revision,
            } => {
                if self.watches.remove(&watch_id).is_none() {
                    return;
                }
                let current = self.server.store().current_rev();
                let mut resp = self.control(watch_id, current);
                resp.canceled = true;
                resp.compact_revision = compact_revision;
                self.outbox.push_back(resp.into());
            }
        }
    }

    /// The value `event`'s key had just before it (none for a creation).
    fn prev_kv(&self, event: &Event) -> Option<KeyValue> {
        let kv = event.kv.as_ref()?;
        let is_create = event.r#type == EventType::Put as i32 && kv.version == 1;
        if is_create {
            return None;
        }
        let params = RangeParams {
            rev: kv.mod_revision - 1,
            ..RangeParams::default()
        };
        let mut prev = self
            .server
            .store()
            .range(KeyRange::new(&kv.key, &[]), params)
            .ok()?;
        prev.kvs.pop()
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
        self.drain_channel();
        due.sort_unstable();
        for id in due {
            let resp = self.control(id, revision);
            self.outbox.push_back(resp.into());
        }
    }

    async fn next_response(&mut self) -> Option<Result<WatchOut, Status>> {
        loop {
            if let Some(resp) = self.outbox.pop_front() {
                return Some(Ok(resp));
            }
            let step = tokio::select! {
                req = self.requests.next() => Step::Request(req),
                msg = self.rx.recv() => Step::Hub(msg),
                _ = self.progress_tick.tick() => Step::ProgressTick,
                _ = self.progress_poll.tick(), if self.progress_pending => Step::ProgressPoll,
            };
            match step {
                Step::Request(Some(Ok(req))) => self.handle_request(req),
                // The client closed its side or the stream broke: the watch stream ends.
                Step::Request(Some(Err(status))) => {
                    crate::metrics::stream_receive_failed("watch", &status);
                    return None;
                }
                Step::Request(None) => return None,
                Step::Hub(Some(msg)) => {
                    self.handle_hub(msg);
                    self.try_progress();
                }
                Step::Hub(None) => return None,
                Step::ProgressTick => self.progress_notifications(),
                Step::ProgressPoll => self.try_progress(),
            }
        }
    }
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
            progress_tick,
            progress_poll,
            progress_pending: false,
            auth,
        };
        let stream = futures::stream::unfold(state, |mut state| async move {
            let item = state.next_response().await?;
            Some((item, state))
        });
        Ok(Response::new(Box::pin(stream)))
    }
}
