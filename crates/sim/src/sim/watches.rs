//! Watchers, compaction requests and reads of history, and the checks on what they get.
//!
//! Real: the member's [`WatchHub`](etcdrs_mvcc::WatchHub), which the server's applier tells
//! of every applied batch (synced watchers get events as they apply; watchers that start in
//! the past or whose channel was full are caught up from the store's history by
//! `sync_round`, or canceled as compacted); the store's compaction (applied through raft,
//! then carried out by `compaction_step`) and its refusal of reads below it.
//!
//! Glue, standing for the server's watch stream (`server::rpc::watch`, which needs a gRPC
//! stream and a runtime the simulator does not have) and for the clients: a client opens a
//! stream and one watcher on it (a key or a prefix, with or without `prev_kv` and progress
//! notifications, from now or from an old revision), reads its channel a few messages at a
//! time, fills `prev_kv` as the stream does (a read at the event's revision - 1), asks for
//! progress (answered once the stream is synced, after draining the channel, as the stream
//! answers it), and resumes from the revision after the last it was delivered when its
//! member stops or its watch breaks, or from the compacted revision after a compacted cancel.
//! The loops of the server that drive the hub and the compactor (`run_watch_sync`, the
//! compactor's steps) run as events here. Every response is checked as it comes against the
//! history every member's applies recorded ([`crate::watch_check`]).

use etcdrs_mvcc::{CompactionStep, Filters, HubMsg, StreamId, WatchRange};
use etcdrs_proto::etcdserverpb::CompactionRequest;
use etcdrs_proto::mvccpb::Event as KvEvent;
use tokio::sync::mpsc;

use super::*;
use crate::watch_check::{KeyRange as WatchKeys, Watch};

/// A planted bug in the watchers' delivery path, for tests that the checks catch one.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WatchFault {
    /// Now and then a response's last event is left out.
    DropEvent,
    /// Now and then a response is delivered twice.
    DuplicateResponse,
    /// Progress is reported at the store's head at once, without waiting for the stream to be
    /// synced and its channel drained.
    EarlyProgress,
}

/// Most watchers in a run.
const MAX_WATCHERS: usize = 4;
/// How often a progress-notify watcher is due a notification, virtual ms (etcd's
/// `--experimental-watch-progress-notify-interval`, 10 minutes by default, shortened).
const PROGRESS_NOTIFY_MS: u64 = 200;

/// A client's watcher and the stream it is open on.
pub(super) struct SimWatch {
    range: WatchKeys,
    prev_kv: bool,
    progress_notify: bool,
    /// The member it is open on, with the stream and its channel.
    open: Option<OpenWatch>,
    /// What it was delivered, checked.
    check: Option<Watch>,
    /// Bumped whenever it closes: events scheduled for an earlier opening are stale.
    generation: u64,
    progress_pending: bool,
    sent_since_tick: bool,
    last_tick: u64,
}

pub(super) struct OpenWatch {
    member: usize,
    stream: StreamId,
    rx: mpsc::Receiver<HubMsg>,
}

/// What the watchers, compactions and reads of history did in a run.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct WatchStats {
    /// Watches opened (first openings and resumptions).
    pub opened: u64,
    /// Resumptions after a member stopped or a watch broke, from the next revision.
    pub resumed: u64,
    /// Compacted cancels (each then resumed from the compacted revision).
    pub compacted_cancels: u64,
    /// Responses with events checked.
    pub responses: u64,
    /// Events checked.
    pub events: u64,
    /// `prev_kv`s checked.
    pub prev_kvs: u64,
    /// Progress notifications checked (asked for and periodic).
    pub progress: u64,
    /// Deletions at the compacted revision a watcher from there missed (etcd issue 18089,
    /// tolerated: see [`crate::watch_check::lost_to_compaction`]).
    pub compacted_tombstones: u64,
    /// Compaction requests answered as applied.
    pub compactions: u64,
    /// Reads at a past revision: answered, refused as compacted, refused as future.
    pub history_reads: (u64, u64, u64),
    /// Revisions and events in the history every member's applies recorded.
    pub history: (usize, usize),
}

impl Sim {
    /// The watchers a run starts with, their first openings scheduled.
    pub(super) fn start_watchers(&mut self) {
        let n = self.rng.random_range(1..=MAX_WATCHERS);
        for w in 0..n {
            let range = match self.rng.random_range(0..4) {
                0 => WatchKeys {
                    key: vec![0],
                    end: vec![0],
                },
                1 => WatchKeys::prefix(b"key-"),
                _ => WatchKeys {
                    key: key_bytes(self.rng.random_range(0..self.cfg.keys)),
                    end: Vec::new(),
                },
            };
            self.watches.push(SimWatch {
                range,
                prev_kv: self.rng.random_bool(0.5),
                progress_notify: self.rng.random_bool(0.5),
                open: None,
                check: None,
                generation: 0,
                progress_pending: false,
                sent_since_tick: false,
                last_tick: 0,
            });
            let at = self.rng.random_range(0..300);
            self.schedule(at, Event::WatchOpen(w, 0));
        }
        for i in 0..self.members.len() {
            let phase = self.rng.random_range(1..=50);
            self.schedule(phase, Event::WatchSync(i));
        }
    }

    /// Client `w` opens its watch on a member that serves clients: from now or an old
    /// revision the first time, from where it left off after that.
    pub(super) fn open_watch(&mut self, w: usize, generation: u64) -> Step {
        if self.watches[w].generation != generation || self.watches[w].open.is_some() {
            return Ok(());
        }
        let up: Vec<usize> = (0..self.members.len())
            .filter(|&i| {
                let m = &self.members[i];
                m.node.is_some() && m.paused_until <= self.now && !m.learner
            })
            .collect();
        if up.is_empty() {
            self.schedule(20, Event::WatchOpen(w, generation));
            return Ok(());
        }
        let i = up[self.rng.random_range(0..up.len())];
        let Some(state) = self.members[i].state.as_ref() else {
            return Ok(());
        };
        let store = state.store();
        let (current, compacted) = (store.current_rev(), store.compact_rev());
        let start = match &self.watches[w].check {
            Some(check) => check.next_rev(),
            None if self.rng.random_bool(0.5) => current + 1,
            None => self.rng.random_range(1..=current.max(1)),
        };
        let hub = state.watch_hub();
        let stream = hub.new_stream();
        // Small channels, so that watchers fall behind and are caught up from history.
        let (tx, rx) = mpsc::channel(self.rng.random_range(1..=8));
        let watch = &mut self.watches[w];
        let range = WatchRange {
            key: watch.range.key.clone(),
            end: watch.range.end.clone(),
        };
        hub.watch(stream, 0, range, Filters::default(), start, tx);
        let resumed = watch.check.is_some();
        watch.check = Some(Watch::new(
            watch.range.clone(),
            watch.prev_kv,
            start,
            compacted,
        ));
        watch.open = Some(OpenWatch {
            member: i,
            stream,
            rx,
        });
        watch.progress_pending = false;
        watch.last_tick = self.now;
        self.watch_stats.opened += 1;
        self.watch_stats.resumed += u64::from(resumed);
        let id = self.members[i].id;
        self.note("watch-open", w as u64, id, start as u64);
        let after = self.rng.random_range(1..=20);
        self.schedule(after, Event::WatchPoll(w, generation));
        Ok(())
    }

    /// The watch of client `w` closes (its member stopped, or the client canceled it or saw
    /// its stream break); it resumes a little later.
    pub(super) fn close_watch(&mut self, w: usize) {
        let watch = &mut self.watches[w];
        let Some(open) = watch.open.take() else {
            return;
        };
        watch.generation += 1;
        let generation = watch.generation;
        if let Some(state) = self.members[open.member].state.as_ref() {
            state.watch_hub().cancel(open.stream, 0);
            state.watch_hub().close_stream(open.stream);
        }
        self.note("watch-close", w as u64, open.member as u64 + 1, 0);
        let after = self.rng.random_range(10..=300);
        self.schedule(after, Event::WatchOpen(w, generation));
    }

    /// Member `i` stops: the watches open on it break.
    pub(super) fn member_watches_break(&mut self, i: usize) {
        for w in 0..self.watches.len() {
            if self.watches[w].open.as_ref().is_some_and(|o| o.member == i) {
                self.close_watch(w);
            }
        }
    }

    /// Client `w` reads a few of its stream's messages, maybe asks for progress or cancels.
    pub(super) fn poll_watch(&mut self, w: usize, generation: u64) -> Step {
        let Some(open) = self.watches[w].open.as_ref() else {
            return Ok(());
        };
        if self.watches[w].generation != generation {
            return Ok(());
        }
        // A stalled member sends nothing meanwhile.
        let paused_until = self.members[open.member].paused_until;
        if paused_until > self.now {
            self.schedule(paused_until - self.now, Event::WatchPoll(w, generation));
            return Ok(());
        }
        let n = self.rng.random_range(1..=4);
        for _ in 0..n {
            if !self.take_message(w)? {
                break;
            }
        }
        if self.watches[w].open.is_none() {
            return Ok(());
        }
        if self.rng.random_range(0..12) == 0 {
            self.watches[w].progress_pending = true;
        }
        self.try_progress(w)?;
        if self.watches[w].progress_notify
            && self.now >= self.watches[w].last_tick + PROGRESS_NOTIFY_MS
        {
            self.watches[w].last_tick = self.now;
            if std::mem::take(&mut self.watches[w].sent_since_tick) {
                // etcd skips a notification after events were sent since the last one.
            } else {
                self.progress_notification(w, false)?;
            }
        }
        if self.faults && self.rng.random_range(0..150) == 0 {
            self.note("watch-cancel", w as u64, 0, 0);
            self.close_watch(w);
            return Ok(());
        }
        let after = self.rng.random_range(1..=30);
        self.schedule(after, Event::WatchPoll(w, generation));
        Ok(())
    }

    /// Answers a pending progress request of `w` once its stream is synced.
    fn try_progress(&mut self, w: usize) -> Step {
        if !self.watches[w].progress_pending {
            return Ok(());
        }
        if self.progress_notification(w, true)? {
            self.watches[w].progress_pending = false;
        }
        Ok(())
    }

    /// A progress notification for `w`, as the stream makes one: the hub's head if every
    /// watcher of the stream is synced, sent after every message already in the channel.
    /// Returns whether one was sent.
    fn progress_notification(&mut self, w: usize, requested: bool) -> Step<bool> {
        let Some(open) = self.watches[w].open.as_ref() else {
            return Ok(false);
        };
        let Some(state) = self.members[open.member].state.as_ref() else {
            return Ok(false);
        };
        let compacted = state.store().compact_rev();
        let revision = if self.cfg.watch_fault == Some(WatchFault::EarlyProgress) {
            state.store().current_rev()
        } else {
            state.store().wait_committed();
            let Some(revision) = state.watch_hub().progress_rev(open.stream) else {
                return Ok(false);
            };
            while self.take_message(w)? {}
            // A compacted cancel among them ended the watch: no progress follows it.
            if self.watches[w].open.is_none() {
                return Ok(false);
            }
            revision
        };
        let Some(check) = self.watches[w].check.as_mut() else {
            return Ok(false);
        };
        let lost = check.checked.compacted_tombstones;
        check
            .progress(&self.history, revision, compacted)
            .map_err(|v| format!("watcher {w}: {v}"))?;
        self.watch_stats.compacted_tombstones += check.checked.compacted_tombstones - lost;
        self.watch_stats.progress += 1;
        self.note(
            "watch-progress",
            w as u64,
            u64::from(requested),
            revision as u64,
        );
        Ok(true)
    }

    /// Takes one message from `w`'s channel and checks it; false if none was waiting.
    fn take_message(&mut self, w: usize) -> Step<bool> {
        let Some(open) = self.watches[w].open.as_mut() else {
            return Ok(false);
        };
        let member = open.member;
        let Ok(msg) = open.rx.try_recv() else {
            return Ok(false);
        };
        let Some(store) = self.members[member].store().cloned() else {
            return Ok(false);
        };
        match msg {
            HubMsg::Events {
                watch_ids,
                events,
                revision,
                ..
            } => {
                if watch_ids != [0] {
                    return Err(format!("watcher {w}: a message for watchers {watch_ids:?}"));
                }
                let compacted = store.compact_rev();
                let mut delivered: Vec<KvEvent> = events
                    .iter()
                    .map(|e| {
                        let mut event = e.event().clone();
                        if self.watches[w].prev_kv {
                            event.prev_kv = prev_kv(&store, &event);
                        }
                        event
                    })
                    .collect();
                let twice = match self.cfg.watch_fault {
                    Some(WatchFault::DropEvent) if self.rng.random_range(0..10) == 0 => {
                        delivered.pop();
                        false
                    }
                    Some(WatchFault::DuplicateResponse) => self.rng.random_range(0..10) == 0,
                    _ => false,
                };
                for _ in 0..=usize::from(twice) {
                    self.deliver_events(w, revision, &delivered, compacted)?;
                }
            }
            HubMsg::Compacted {
                watch_id,
                compact_revision,
            } => {
                if watch_id != 0 {
                    return Err(format!("watcher {w}: a cancel for watcher {watch_id}"));
                }
                let store_compacted = store.compact_rev();
                if compact_revision > store_compacted || compact_revision == 0 {
                    return Err(format!(
                        "watcher {w}: canceled as compacted at {compact_revision}, its member compacted at {store_compacted}"
                    ));
                }
                let Some(check) = self.watches[w].check.as_mut() else {
                    return Ok(true);
                };
                check
                    .compacted(compact_revision)
                    .map_err(|v| format!("watcher {w}: {v}"))?;
                self.watch_stats.compacted_cancels += 1;
                self.note("watch-compacted", w as u64, compact_revision as u64, 0);
                // The client starts again from what is left: the compacted revision.
                self.watches[w].check = Some(Watch::new(
                    self.watches[w].range.clone(),
                    self.watches[w].prev_kv,
                    compact_revision,
                    0,
                ));
                self.close_watch(w);
                return Ok(false);
            }
        }
        Ok(true)
    }

    fn deliver_events(
        &mut self,
        w: usize,
        revision: i64,
        events: &[KvEvent],
        compacted: i64,
    ) -> Step {
        if events.is_empty() {
            return Ok(());
        }
        let Some(check) = self.watches[w].check.as_mut() else {
            return Ok(());
        };
        let lost = check.checked.compacted_tombstones;
        check
            .events(&self.history, revision, events, compacted)
            .map_err(|v| format!("watcher {w}: {v}"))?;
        self.watch_stats.compacted_tombstones += check.checked.compacted_tombstones - lost;
        self.watches[w].sent_since_tick = true;
        self.watch_stats.responses += 1;
        self.watch_stats.events += events.len() as u64;
        self.watch_stats.prev_kvs += events.iter().filter(|e| e.prev_kv.is_some()).count() as u64;
        let last = events
            .last()
            .and_then(|e| e.kv.as_ref())
            .map_or(0, |kv| kv.mod_revision);
        self.note("watch-events", w as u64, events.len() as u64, last as u64);
        Ok(())
    }

    /// The server's watch catch-up loop on member `i` (`run_watch_sync`): rounds while they
    /// make progress, up to a bound.
    pub(super) fn sync_watchers(&mut self, i: usize) -> Step {
        if let Some(state) = self.members[i].state.as_ref() {
            let hub = state.watch_hub();
            for _ in 0..16 {
                if !hub.has_unsynced() {
                    break;
                }
                let outcome = hub
                    .sync_round(state.store())
                    .map_err(|e| format!("member {}: watch catch-up: {e}", i + 1))?;
                if outcome.behind == 0 || outcome.advanced == 0 {
                    break;
                }
            }
            // The compactor's steps, on the same beat.
            let limit = self.rng.random_range(1..=20);
            for _ in 0..4 {
                match state.store().compaction_step(limit) {
                    Ok(CompactionStep::Progress) => {}
                    Ok(_) => break,
                    Err(e) => return Err(format!("member {}: compaction: {e}", i + 1)),
                }
            }
        }
        let after = self.rng.random_range(10..=100);
        self.schedule(after, Event::WatchSync(i));
        Ok(())
    }

    /// A client asks member `i` to compact at a revision: mostly one it holds, sometimes one
    /// already compacted or one in the future (refused, exactly then).
    pub(super) fn request_compaction(&mut self, i: usize) {
        let Some(store) = self.members[i].store() else {
            return;
        };
        let (current, compacted) = (store.current_rev(), store.compact_rev());
        let rev = match self.rng.random_range(0..10) {
            0 => compacted.max(1),
            1 => current + 5,
            _ => self.rng.random_range(compacted.max(1)..=current.max(1)),
        };
        let request_id = self.next_request;
        self.next_request += 1;
        let request = InternalRaftRequest {
            header: Some(self.admin_header(request_id, i)),
            compaction: Some(CompactionRequest {
                revision: rev,
                physical: false,
            }),
            ..InternalRaftRequest::default()
        };
        let member = &mut self.members[i];
        let (Some(node), Some(state)) = (member.node.as_mut(), member.state.as_ref()) else {
            return;
        };
        let answer = state.wait(request_id);
        if node.propose(request.encode_to_vec()).is_ok() {
            member.compactions.push((rev, answer));
            let id = member.id;
            self.note("compact-request", id, rev as u64, 0);
        }
    }

    /// Compaction requests answered on member `i`: success or ErrCompacted / ErrFutureRev,
    /// nothing else.
    pub(super) fn answer_compactions(&mut self, i: usize) -> Step {
        let member = &mut self.members[i];
        let id = member.id;
        let mut answered = Vec::new();
        member
            .compactions
            .retain_mut(|(rev, answer)| match answer.try_recv() {
                Ok(output) => {
                    answered.push((*rev, output));
                    false
                }
                Err(oneshot::error::TryRecvError::Empty) => true,
                Err(oneshot::error::TryRecvError::Closed) => false,
            });
        for (rev, output) in answered {
            match output {
                Ok(_) => {
                    self.watch_stats.compactions += 1;
                    self.note("compacted", id, rev as u64, 0);
                }
                Err(etcdrs_server::ServerError::Mvcc(
                    etcdrs_mvcc::Error::Compacted { .. }
                    | etcdrs_mvcc::Error::FutureRevision { .. },
                )) => {}
                Err(e) => {
                    return Err(format!("member {id}: compaction at {rev} answered {e}"));
                }
            }
        }
        Ok(())
    }

    /// A client reads a key at a past revision on member `i` (a serializable read: the
    /// member's own store): refused as compacted exactly below the member's compacted
    /// revision, as future exactly past its head, and otherwise the history's value then.
    pub(super) fn read_history(&mut self, i: usize) -> Step {
        let Some(store) = self.members[i].store() else {
            return Ok(());
        };
        let (current, compacted) = (store.current_rev(), store.compact_rev());
        let rev = self.rng.random_range(1..=current + 1);
        let key = key_bytes(self.rng.random_range(0..self.cfg.keys));
        let params = RangeParams {
            rev,
            ..RangeParams::default()
        };
        let id = self.members[i].id;
        match store.range(KeyRange::new(&key, &[]), params) {
            Err(etcdrs_mvcc::Error::Compacted { compacted: c, .. }) if rev < compacted => {
                if c != compacted {
                    return Err(format!(
                        "member {id}: a read at {rev} refused as compacted at {c}, the store compacted at {compacted}"
                    ));
                }
                self.watch_stats.history_reads.1 += 1;
            }
            Err(etcdrs_mvcc::Error::FutureRevision { .. }) if rev > current => {
                self.watch_stats.history_reads.2 += 1;
            }
            Ok(result) if rev >= compacted && rev <= current => {
                let want = self.history.value_at(&key, rev);
                if result.kvs.first() != want {
                    return Err(format!(
                        "member {id}: a read of {} at revision {rev} got {:?}, the history holds {want:?}",
                        String::from_utf8_lossy(&key),
                        result.kvs.first()
                    ));
                }
                self.watch_stats.history_reads.0 += 1;
            }
            other => {
                return Err(format!(
                    "member {id}: a read at revision {rev} (compacted {compacted}, head {current}) answered {:?}",
                    other.map(|r| r.kvs)
                ));
            }
        }
        Ok(())
    }

    /// At the end, with the cluster converged: each open watcher is caught up, its channel
    /// drained, and a last progress notification checked (every event up to the head
    /// delivered); every member finishes its compactions.
    pub(super) fn finish_watches(&mut self) -> Step {
        for i in 0..self.members.len() {
            for _ in 0..10_000 {
                // Drain every stream of this member so that catch-up has room.
                for w in 0..self.watches.len() {
                    if self.watches[w].open.as_ref().is_some_and(|o| o.member == i) {
                        while self.take_message(w)? {}
                    }
                }
                let Some(state) = self.members[i].state.as_ref() else {
                    break;
                };
                let hub = state.watch_hub();
                if !hub.has_unsynced() {
                    break;
                }
                hub.sync_round(state.store())
                    .map_err(|e| format!("member {}: watch catch-up: {e}", i + 1))?;
            }
            let Some(state) = self.members[i].state.as_ref() else {
                continue;
            };
            // Until nothing waits: a pass that finishes may leave a later compaction to do.
            loop {
                match state.store().compaction_step(1000) {
                    Ok(CompactionStep::Progress | CompactionStep::Finished(_)) => {}
                    Ok(CompactionStep::Idle) => break,
                    Err(e) => return Err(format!("member {}: compaction: {e}", i + 1)),
                }
            }
        }
        for w in 0..self.watches.len() {
            if self.watches[w].open.is_some() && !self.progress_notification(w, true)? {
                return Err(format!("watcher {w}: still behind at the end"));
            }
            if let Some(check) = &self.watches[w].check
                && check.next_rev() <= self.history.head()
                && self.watches[w].open.is_some()
            {
                return Err(format!(
                    "watcher {w} is at revision {} at the end, the head is {}",
                    check.next_rev(),
                    self.history.head()
                ));
            }
        }
        self.watch_stats.history = (self.history.revisions(), self.history.events());
        Ok(())
    }
}

/// The value `event`'s key held just before it, as the server's watch stream reads it (none
/// for a creation, none if that revision is compacted).
fn prev_kv(store: &KvStore, event: &KvEvent) -> Option<etcdrs_proto::mvccpb::KeyValue> {
    let kv = event.kv.as_ref()?;
    let is_create =
        event.r#type == etcdrs_proto::mvccpb::event::EventType::Put as i32 && kv.version == 1;
    if is_create {
        return None;
    }
    let params = RangeParams {
        rev: kv.mod_revision - 1,
        ..RangeParams::default()
    };
    store
        .range(KeyRange::new(&kv.key, &[]), params)
        .ok()?
        .kvs
        .pop()
}
