//! Persistence off the raft thread: the `wal-sync` thread that writes and fsyncs the WAL
//! while the raft thread goes on ticking, heartbeating and replicating (raft-rs's
//! asynchronous `Ready`: `advance_append_async`, then `on_persist_ready` once durable).
//!
//! The raft thread gathers what each `Ready` must make durable (entries, hard state, the
//! messages that may leave only after them) into one [`SyncBatch`]; while the thread is
//! writing the previous batch the next one grows, so every `Ready` that comes during an fsync
//! shares the next fsync (group commit). At most one batch is in flight and one is gathering:
//! that, and the raft thread's refusal to take new proposals while the gathering batch is over
//! [`MAX_UNSYNCED_BYTES`] or [`MAX_UNSYNCED_ENTRIES`], bounds what waits for the disk.
//!
//! The thread only writes: it sends no message and touches no raft state. It reports each
//! batch back, and the raft thread then tells raft (`on_persist_ready`) and only after that
//! sends the batch's messages, so no answer to them can reach raft before raft knows what they
//! depended on is durable (raft-rs asserts that a new leader's log is all persisted).
//!
//! [`Persistence::Inline`] is the same contract without the thread, for the node's start and
//! the simulator: a batch is written where it is handed over; [`Persistence::Deferred`] lets
//! the simulator decide when each batch reaches its disk.
//!
//! A member that is its cluster's only node ([`Persistence::Alone`]) writes inline too, until
//! a second node appears: the thread is there so that a slow fsync costs no election and holds
//! up no quorum, and a lone voter has neither to lose, while each batch handed to the thread
//! costs two thread switches. Measured with etcd's benchmark (put, 256 B, fresh members,
//! alternated, `scripts/bench-put.sh`): 100 clients over 10 connections 28.5-30.6k puts/s and
//! 27.2-29.5 us of member CPU per put inline against 25.3-27.6k and 31.2-31.3 us on the
//! thread; one client 2,179-2,290 against 1,819-2,005; 1,000 clients and 10 KiB values the
//! same within noise. A lone member whose disk stalls then answers nothing until the fsync
//! returns, as etcd's own raft loop, which fsyncs where it runs, does.

use std::sync::Arc;
use std::sync::mpsc as std_mpsc;

use raft::eraftpb::{Entry, HardState};
use tokio::sync::Notify;

use crate::error::{Error, Result};
use crate::storage::LogStore;

/// Bytes of entries gathered for the next fsync beyond which the raft thread takes no new
/// local proposals (peers' messages and ticks go on): a disk that stalls holds at most about
/// this much of the log in memory twice over (the batch in flight and the one gathering).
pub(crate) const MAX_UNSYNCED_BYTES: u64 = 64 << 20;
/// Entries gathered for the next fsync beyond which the raft thread takes no new local
/// proposals.
pub(crate) const MAX_UNSYNCED_ENTRIES: usize = 100_000;

/// What one fsync makes durable: everything a run of `Ready`s asked for, in order.
#[derive(Default)]
pub(crate) struct SyncBatch {
    /// The last `Ready` the batch covers: once the batch is durable, so is every `Ready` up to
    /// this one (raft-rs's `on_persist_ready` implies all earlier numbers).
    pub(crate) number: u64,
    /// The latest hard state of those `Ready`s.
    pub(crate) hard_state: Option<HardState>,
    /// Their entries; a later `Ready`'s entries replace those at their indexes and after, as
    /// the log store does.
    pub(crate) entries: Vec<Entry>,
    /// A snapshot mark (index, term) to record after the entries: the state machine holds
    /// everything up to it durably, and a restart reads the log from after it.
    pub(crate) mark: Option<(u64, u64)>,
    /// Entries up to here may leave the log store (after the mark).
    pub(crate) release_to: Option<u64>,
    /// Bytes of `entries`' data.
    pub(crate) bytes: u64,
}

impl SyncBatch {
    /// Adds a `Ready`'s share.
    pub(crate) fn add(&mut self, number: u64, hard_state: Option<HardState>, entries: Vec<Entry>) {
        self.number = self.number.max(number);
        if hard_state.is_some() {
            self.hard_state = hard_state;
        }
        if let Some(first) = entries.first() {
            // A follower's log may be overwritten by a new leader's entries.
            let keep = self.entries.partition_point(|e| e.index < first.index);
            self.entries.truncate(keep);
            self.bytes = self.entries.iter().map(entry_bytes).sum();
            self.bytes += entries.iter().map(entry_bytes).sum::<u64>();
            self.entries.extend(entries);
        }
    }

    /// Whether there is nothing to write (its number may still need reporting).
    pub(crate) fn nothing_to_write(&self) -> bool {
        self.hard_state.is_none()
            && self.entries.is_empty()
            && self.mark.is_none()
            && self.release_to.is_none()
    }

    /// Whether the batch has grown past the bound on what waits for the disk.
    pub(crate) fn over_bound(&self) -> bool {
        self.bytes >= MAX_UNSYNCED_BYTES || self.entries.len() >= MAX_UNSYNCED_ENTRIES
    }
}

fn entry_bytes(entry: &Entry) -> u64 {
    entry.data.len() as u64 + entry.context.len() as u64
}

/// Writes a batch: entries and hard state with one fsync, then the mark and the release.
fn write(log: &mut dyn LogStore, batch: &SyncBatch) -> Result<()> {
    if batch.hard_state.is_some() || !batch.entries.is_empty() {
        log.save(batch.hard_state.as_ref(), &batch.entries)?;
    }
    if let Some((index, term)) = batch.mark {
        log.mark_snapshot(index, term)?;
    }
    if let Some(index) = batch.release_to {
        log.release_to(index)?;
    }
    Ok(())
}

/// A batch's outcome, reported by the sync thread: its number, or the fatal error.
type Done = Result<u64>;

/// The `wal-sync` thread, owned by the raft thread: dropping it closes the thread's queue,
/// and the drop waits for the batch in flight to finish and the log store to close, so a
/// stopped node leaves no write behind it (a restart in the same process reopens the WAL).
pub(crate) struct SyncThread {
    /// Batches to write; at most one is ever queued or being written.
    jobs: Option<std_mpsc::SyncSender<SyncBatch>>,
    /// Outcomes, in batch order.
    done: std_mpsc::Receiver<Done>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl SyncThread {
    fn spawn(mut log: Box<dyn LogStore>, wake: Arc<Notify>) -> Result<SyncThread> {
        let (jobs, job_rx) = std_mpsc::sync_channel::<SyncBatch>(1);
        let (done_tx, done) = std_mpsc::channel();
        let waker = wake;
        let thread = std::thread::Builder::new()
            .name("wal-sync".into())
            .spawn(move || {
                // Ends when the raft thread drops its sender, or after a failed write: a
                // failed fsync is never retried (the node stops).
                while let Ok(batch) = job_rx.recv() {
                    let outcome = write(log.as_mut(), &batch).map(|()| batch.number);
                    let failed = outcome.is_err();
                    let _ = done_tx.send(outcome);
                    waker.notify_one();
                    if failed {
                        break;
                    }
                }
            })
            .map_err(|e| Error::Corrupt(format!("cannot start the wal-sync thread: {e}")))?;
        Ok(SyncThread {
            jobs: Some(jobs),
            done,
            thread: Some(thread),
        })
    }
}

impl Drop for SyncThread {
    fn drop(&mut self) {
        drop(self.jobs.take());
        if let Some(thread) = self.thread.take()
            && thread.join().is_err()
        {
            tracing::error!("the wal-sync thread panicked");
        }
    }
}

/// Where the raft thread's batches go.
pub(crate) enum Persistence {
    /// Written where handed over (the simulator; a node before its thread starts).
    Inline(Box<dyn LogStore>),
    /// Written where handed over while the member is its cluster's only node; moved to a
    /// thread ([`Persistence::company_arrived`]) once it is not.
    Alone(Box<dyn LogStore>),
    /// Written on the `wal-sync` thread; `in_flight` while a batch is there.
    Thread {
        /// The thread.
        sync: SyncThread,
        /// The number of the batch being written, if one is.
        in_flight: Option<u64>,
    },
    /// Written when the caller says ([`crate::Node::write_to_disk`]): the simulator's disk,
    /// whose writes take the time its seed gives them. What is not written when the node goes
    /// (a crash) is lost, as a batch in the `wal-sync` thread's hands is.
    Deferred {
        /// The log store.
        log: Box<dyn LogStore>,
        /// The batch handed over and not written yet.
        queued: Option<SyncBatch>,
        /// The number of the batch written and not reported yet.
        written: Option<u64>,
    },
    /// Between the two (only while [`Persistence::start_thread`] runs).
    Moving,
}

impl Persistence {
    /// Moves the log store to a `wal-sync` thread of its own, which wakes `wake` after each
    /// batch.
    pub(crate) fn start_thread(&mut self, wake: Arc<Notify>) -> Result<()> {
        let log = match std::mem::replace(self, Persistence::Moving) {
            Persistence::Inline(log) | Persistence::Alone(log) => log,
            other => {
                *self = other;
                return Ok(());
            }
        };
        *self = Persistence::Thread {
            sync: SyncThread::spawn(log, wake)?,
            in_flight: None,
        };
        Ok(())
    }

    /// Writes inline while the member is alone (see the module's doc), then on a thread.
    pub(crate) fn stay_inline_while_alone(&mut self) {
        if let Persistence::Inline(_) = self
            && let Persistence::Inline(log) = std::mem::replace(self, Persistence::Moving)
        {
            *self = Persistence::Alone(log);
        }
    }

    /// The member is no longer its cluster's only node: a log written inline while it was
    /// moves to its thread (no batch is ever in flight inline).
    pub(crate) fn company_arrived(&mut self, wake: Arc<Notify>) -> Result<()> {
        if let Persistence::Alone(_) = self {
            self.start_thread(wake)?;
        }
        Ok(())
    }

    /// Writes from now on wait for [`Persistence::write_deferred`] (inline only).
    pub(crate) fn defer(&mut self) {
        let log = match std::mem::replace(self, Persistence::Moving) {
            Persistence::Inline(log) => log,
            other => {
                *self = other;
                return;
            }
        };
        *self = Persistence::Deferred {
            log,
            queued: None,
            written: None,
        };
    }

    /// Writes the deferred batch, if one waits; whether one did.
    pub(crate) fn write_deferred(&mut self) -> Result<bool> {
        let Persistence::Deferred {
            log,
            queued,
            written,
        } = self
        else {
            return Ok(false);
        };
        let Some(batch) = queued.take() else {
            return Ok(false);
        };
        write(log.as_mut(), &batch)?;
        *written = Some(batch.number);
        Ok(true)
    }

    /// Whether a deferred batch waits to be written.
    pub(crate) fn deferred_waiting(&self) -> bool {
        matches!(
            self,
            Persistence::Deferred {
                queued: Some(_),
                ..
            }
        )
    }

    /// Whether a batch is being written (or written and not yet reported).
    pub(crate) fn busy(&self) -> bool {
        match self {
            Persistence::Thread { in_flight, .. } => in_flight.is_some(),
            Persistence::Deferred {
                queued, written, ..
            } => queued.is_some() || written.is_some(),
            Persistence::Inline(_) | Persistence::Alone(_) | Persistence::Moving => false,
        }
    }

    /// Hands `batch` over; the caller makes sure nothing is in flight ([`Persistence::busy`]).
    /// Returns the number now durable, if the batch was written on the spot (inline).
    pub(crate) fn submit(&mut self, batch: SyncBatch) -> Result<Option<u64>> {
        match self {
            Persistence::Inline(log) | Persistence::Alone(log) => {
                write(log.as_mut(), &batch)?;
                Ok(Some(batch.number))
            }
            Persistence::Thread { sync, in_flight } => {
                debug_assert!(in_flight.is_none(), "one batch in flight at a time");
                let number = batch.number;
                let jobs = sync.jobs.as_ref().ok_or(Error::Stopped)?;
                // The queue holds one batch and none is in flight: this never waits.
                jobs.send(batch).map_err(|_| Error::Stopped)?;
                *in_flight = Some(number);
                Ok(None)
            }
            Persistence::Deferred { queued, .. } => {
                debug_assert!(queued.is_none(), "one batch in flight at a time");
                *queued = Some(batch);
                Ok(None)
            }
            Persistence::Moving => Err(Error::Stopped),
        }
    }

    /// The outcome of the batch in flight: `Some(number)` once it is durable; `None` while it
    /// is still being written (unless `wait`, which blocks until it is) or if none is.
    pub(crate) fn poll(&mut self, wait: bool) -> Result<Option<u64>> {
        if let Persistence::Deferred { .. } = self {
            // Waiting for the disk is the disk finishing its write.
            if wait {
                self.write_deferred()?;
            }
            let Persistence::Deferred { written, .. } = self else {
                return Ok(None);
            };
            return Ok(written.take());
        }
        let Persistence::Thread { sync, in_flight } = self else {
            return Ok(None);
        };
        if in_flight.is_none() {
            return Ok(None);
        }
        let outcome = if wait {
            sync.done.recv().map_err(|_| Error::Stopped)?
        } else {
            match sync.done.try_recv() {
                Ok(outcome) => outcome,
                Err(std_mpsc::TryRecvError::Empty) => return Ok(None),
                Err(std_mpsc::TryRecvError::Disconnected) => return Err(Error::Stopped),
            }
        };
        *in_flight = None;
        outcome.map(Some)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(index: u64, term: u64, data: &[u8]) -> Entry {
        Entry {
            index,
            term,
            data: data.to_vec().into(),
            ..Default::default()
        }
    }

    #[test]
    fn a_later_ready_replaces_the_entries_from_its_first_index_on() {
        let mut batch = SyncBatch::default();
        batch.add(
            1,
            None,
            vec![entry(5, 1, b"a"), entry(6, 1, b"bb"), entry(7, 1, b"ccc")],
        );
        assert_eq!(batch.bytes, 6);
        let hard_state = HardState {
            term: 2,
            ..Default::default()
        };
        batch.add(2, Some(hard_state.clone()), vec![entry(6, 2, b"dddd")]);
        batch.add(3, None, Vec::new());
        let kept: Vec<(u64, u64)> = batch.entries.iter().map(|e| (e.index, e.term)).collect();
        assert_eq!(kept, [(5, 1), (6, 2)]);
        assert_eq!(batch.bytes, 5);
        assert_eq!(batch.number, 3);
        assert_eq!(batch.hard_state, Some(hard_state));
        assert!(!batch.nothing_to_write());
        assert!(SyncBatch::default().nothing_to_write());
    }

    /// A log store that records what it was asked, and can be told to fail.
    struct Recording {
        saved: Arc<parking_lot::Mutex<Vec<u64>>>,
        fail: bool,
    }

    impl LogStore for Recording {
        fn save(&mut self, _hard_state: Option<&HardState>, entries: &[Entry]) -> Result<()> {
            if self.fail {
                return Err(Error::Corrupt("disk gone".into()));
            }
            self.saved.lock().extend(entries.iter().map(|e| e.index));
            Ok(())
        }
        fn mark_snapshot(&mut self, _index: u64, _term: u64) -> Result<()> {
            Ok(())
        }
        fn release_to(&mut self, _index: u64) -> Result<()> {
            Ok(())
        }
    }

    #[test]
    fn the_thread_writes_one_batch_at_a_time_and_reports_a_failure() {
        let saved = Arc::default();
        let mut persistence = Persistence::Inline(Box::new(Recording {
            saved: Arc::clone(&saved),
            fail: false,
        }));
        persistence.start_thread(Arc::default()).expect("thread");
        assert!(!persistence.busy());
        let mut batch = SyncBatch::default();
        batch.add(4, None, vec![entry(1, 1, b"x")]);
        assert_eq!(persistence.submit(batch).expect("submit"), None);
        assert!(persistence.busy());
        assert_eq!(persistence.poll(true).expect("written"), Some(4));
        assert!(!persistence.busy());
        assert_eq!(persistence.poll(true).expect("nothing in flight"), None);
        assert_eq!(*saved.lock(), [1]);
        drop(persistence);

        let mut failing = Persistence::Inline(Box::new(Recording {
            saved: Arc::default(),
            fail: true,
        }));
        failing.start_thread(Arc::default()).expect("thread");
        let mut batch = SyncBatch::default();
        batch.add(1, None, vec![entry(1, 1, b"x")]);
        failing.submit(batch).expect("submit");
        assert!(failing.poll(true).is_err(), "the failure is reported");
        assert!(!failing.busy());
    }
}
