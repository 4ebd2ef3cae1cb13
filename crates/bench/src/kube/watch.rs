//! The watch side of `bench kube`: one stream with a watcher per resource (as kube-apiserver's
//! watch cache opens it), its deliveries counted and matched with acknowledged writes to time
//! the watch delay, and the progress requests' answers.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use anyhow::{Context, Result, bail};
use etcd_client::{Client, ConnectOptions, WatchOptions, WatchRequestSender, WatchResponseStream};
use tokio::sync::watch;
use tokio::time::Instant;

use super::writes::{Cluster, locked};
use crate::cli::GlobalOpts;
use crate::report::Recorder;

/// What is known of one watched write's revision: its acknowledgement, or its event, whichever
/// came first.
#[derive(Debug, Clone, Copy)]
pub(super) enum Seen {
    Acked(Instant),
    Event,
}

/// Matches acknowledged writes with their watch events to time the watch delay.
#[derive(Debug, Default)]
pub(super) struct Acks {
    pub(super) inner: Mutex<AcksInner>,
}

#[derive(Debug, Default)]
pub(super) struct AcksInner {
    pub(super) pending: HashMap<i64, Seen>,
    pub(super) delay: Recorder,
    pub(super) acked: u64,
    pub(super) events: u64,
}

impl Acks {
    pub(super) fn lock(&self) -> MutexGuard<'_, AcksInner> {
        // A poisoned lock only means another task panicked; the numbers are still counts.
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A watched write was acknowledged at `revision`.
    pub(super) fn acked(&self, revision: i64) {
        let now = Instant::now();
        let mut inner = self.lock();
        inner.acked += 1;
        match inner.pending.remove(&revision) {
            Some(Seen::Event) => inner.delay.record(Duration::ZERO),
            Some(Seen::Acked(_)) | None => {
                inner.pending.insert(revision, Seen::Acked(now));
            }
        }
    }

    /// An event of `revision` arrived at `now`.
    pub(super) fn event(&self, revision: i64, now: Instant) {
        let mut inner = self.lock();
        inner.events += 1;
        match inner.pending.remove(&revision) {
            Some(Seen::Acked(at)) => inner.delay.record(now.saturating_duration_since(at)),
            Some(Seen::Event) | None => {
                inner.pending.insert(revision, Seen::Event);
            }
        }
    }

    /// Acknowledged writes whose event has not arrived.
    pub(super) fn waiting(&self) -> usize {
        self.lock()
            .pending
            .values()
            .filter(|s| matches!(s, Seen::Acked(_)))
            .count()
    }
}

/// When the last progress request was sent, for the watcher to time its answer.
pub(super) type ProgressSent = Arc<Mutex<Option<Instant>>>;

/// The watch stream's request side. It stays open until the watcher stops, as clientv3's does:
/// a client that half-closes a watch stream is not what kube-apiserver is.
pub(super) type SharedSender = Arc<tokio::sync::Mutex<WatchRequestSender>>;

/// Counts of what the watch stream delivered.
#[derive(Debug, Default)]
pub(super) struct WatchCounts {
    pub(super) puts: u64,
    pub(super) deletes: u64,
    /// Events of updates and deletes that carried the previous value (`prev_kv`).
    pub(super) with_prev_kv: u64,
    /// Events of updates and deletes (which should carry it).
    pub(super) want_prev_kv: u64,
    /// Answers to progress requests (watch id -1).
    pub(super) progress: u64,
    /// Other responses without events: a watcher's own progress notifications.
    pub(super) notify: u64,
    pub(super) errors: Recorder,
}

/// Reads the watch stream until told to stop: events go to [`Acks`], progress answers are
/// timed against the last request.
pub(super) async fn watch_loop(
    mut stream: WatchResponseStream,
    cluster: Arc<Cluster>,
    progress_sent: ProgressSent,
    mut stop: watch::Receiver<bool>,
) -> (WatchCounts, Recorder) {
    let mut counts = WatchCounts::default();
    let mut progress = Recorder::new();
    loop {
        let msg = tokio::select! {
            _ = stop.wait_for(|s| *s) => break,
            msg = stream.message() => msg,
        };
        let resp = match msg {
            Ok(Some(resp)) => resp,
            Ok(None) => {
                counts.errors.record_error("watch stream closed");
                break;
            }
            Err(e) => {
                counts.errors.record_error(&e.to_string());
                break;
            }
        };
        let now = Instant::now();
        if resp.canceled() {
            counts
                .errors
                .record_error(&format!("watch canceled: {}", resp.cancel_reason()));
            break;
        }
        if resp.created() {
            continue;
        }
        let events = resp.events();
        if events.is_empty() && resp.compact_revision() == 0 {
            // etcd answers a progress request with watch id -1 (clientv3's
            // `InvalidWatchID`); a watcher's periodic notification carries its own id.
            if resp.watch_id() == -1 {
                counts.progress += 1;
                if let Some(sent) = locked(&progress_sent).take() {
                    progress.record(now.saturating_duration_since(sent));
                }
            } else {
                counts.notify += 1;
            }
            continue;
        }
        for ev in events {
            let Some(kv) = ev.kv() else { continue };
            let is_delete = ev.event_type() == etcd_client::EventType::Delete;
            if is_delete {
                counts.deletes += 1;
            } else {
                counts.puts += 1;
            }
            if is_delete || kv.version() > 1 {
                counts.want_prev_kv += 1;
                if ev.prev_kv().is_some() {
                    counts.with_prev_kv += 1;
                }
            }
            cluster.acks.event(kv.mod_revision(), now);
        }
    }
    (counts, progress)
}

/// Opens the watch stream (with `hasleader`) and one watcher per resource from its LIST's
/// revision + 1; returns once all three are created.
pub(super) async fn open_watch(
    global: &GlobalOpts,
    from: [(&str, i64); 3],
) -> Result<(Client, WatchRequestSender, WatchResponseStream)> {
    let opts = ConnectOptions::new()
        .with_connect_timeout(global.dial_timeout)
        .with_require_leader(true);
    let client = Client::connect(&global.endpoints, Some(opts))
        .await
        .with_context(|| format!("connecting to {}", global.endpoints.join(",")))?;
    let options = |rev: i64| {
        WatchOptions::new()
            .with_prefix()
            .with_start_revision(rev + 1)
            .with_prev_key()
            .with_progress_notify()
    };
    let mut watch_client = client.watch_client().max_decoding_message_size(usize::MAX);
    let (first, rest) = from.split_first().context("no resource to watch")?;
    let stream = watch_client
        .watch(first.0, Some(options(first.1)))
        .await
        .context("opening the watch stream")?;
    let (mut sender, mut responses) = stream.split();
    for (prefix, rev) in rest {
        sender.watch(*prefix, Some(options(*rev))).await?;
    }
    let mut created = 0;
    while created < from.len() {
        let resp = tokio::time::timeout(global.request_timeout, responses.message())
            .await
            .context("creating the watchers timed out")??
            .context("the watch stream closed while creating watchers")?;
        if resp.canceled() {
            bail!("watch create canceled: {}", resp.cancel_reason());
        }
        if resp.created() {
            created += 1;
        }
    }
    Ok((client, sender, responses))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn watch_delay_counts_from_the_later_of_ack_and_event() {
        let acks = Acks::default();
        acks.acked(5);
        assert_eq!(acks.waiting(), 1);
        acks.event(5, Instant::now());
        // An event before its acknowledgement is a delay of zero.
        acks.event(6, Instant::now());
        acks.acked(6);
        assert_eq!(acks.waiting(), 0);
        let inner = acks.lock();
        assert_eq!((inner.acked, inner.events), (2, 2));
        assert_eq!(inner.delay.summary("", Duration::from_secs(1)).count, 2);
    }
}
