//! Physical compaction in steps (etcd `server/storage/mvcc/kvstore_compaction.go`).
//!
//! Applying a compaction ([`WriteBatch::compact`]) only raises the compacted revision and
//! records it as scheduled: from then on reads below it are refused, and nothing else waits.
//! The work of forgetting history (dropping revisions from the key index and deleting their
//! values from the backend) is done afterwards by [`KvStore::compaction_step`], called in a
//! loop by the server's compactor. The index is compacted a bounded run of keys at a time
//! under its lock; the revisions it drops are gathered (up to a bound), sorted, and their
//! values deleted oldest first, `--experimental-compaction-batch-limit` of them per backend
//! transaction of their own. Readers and the one writer (the applier) wait for at most one
//! run or one batch, never for the whole compaction. Deleting in revision order (as etcd's
//! walk of the key bucket does) keeps a batch on neighbouring pages: the index yields
//! revisions in key order, scattered over the whole bucket. While the backend's background
//! flush is a batch limit behind, the deletions wait for it (as etcd's compaction commits each
//! of its batches): otherwise one flush would take in a disk-bound backlog of deletions and
//! rewrite so many pages in one redb transaction that the file grows by them
//! ([`Backend::flush_backlogged`]).
//!
//! Why this is safe: a revision that compacting at `rev` drops is visible to no read at `rev`
//! or later, and every read below `rev` is refused once the compaction is applied, so whether
//! a dropped revision is still in the index or the backend changes no answer. A crash midway
//! leaves `scheduledCompactRev` ahead of `finishedCompactRev`, and the next open finishes the
//! compaction before serving (as etcd's restore does). `HashKV` counts revisions at or below
//! the scheduled compaction only when they survive it, so a member midway hashes as one done.
//!
//! A snapshot installed from the leader replaces the store under a running pass: the pass
//! belongs to an epoch that the install ends, and a step of an ended epoch deletes nothing.

use super::*;

/// What one [`KvStore::compaction_step`] did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CompactionStep {
    /// No compaction is waiting to be done.
    Idle,
    /// A part of the pending compaction was done; more remains.
    Progress,
    /// The compaction at this revision is finished: its history is gone from the index and the
    /// backend, and `finishedCompactRev` says so.
    Finished(i64),
}

/// The store's compaction bookkeeping.
#[derive(Debug, Default)]
pub(super) struct Compaction {
    /// The newest compaction applied (the scheduled revision), 0 if none.
    target: i64,
    /// The newest compaction finished.
    finished: i64,
    /// The pass in progress.
    pass: Option<Pass>,
    /// Bumped when the store's contents are replaced: a step begun before does nothing.
    epoch: u64,
}

#[derive(Debug)]
struct Pass {
    /// The revision this pass compacts at (a newer compaction applied meanwhile gets a pass
    /// of its own after this one).
    rev: i64,
    /// The last key whose index entry was compacted; the next index chunk starts after it.
    after: Option<Vec<u8>>,
    /// Whether every key's index entry is compacted.
    index_done: bool,
    /// Revisions dropped from the index whose values are not yet deleted; newest first once
    /// `draining`, so that each batch deleted is the oldest left.
    dropped: Vec<(Revision, bool)>,
    /// Whether the pass is deleting what it holds (rather than taking more from the index).
    draining: bool,
    started: Instant,
    /// Values deleted so far.
    deleted: u64,
    /// Time spent holding the index lock so far.
    index_pause: std::time::Duration,
}

impl Pass {
    fn new(rev: i64) -> Pass {
        Pass {
            rev,
            after: None,
            index_done: false,
            dropped: Vec::new(),
            draining: false,
            started: Instant::now(),
            deleted: 0,
            index_pause: std::time::Duration::ZERO,
        }
    }
}

/// What one index chunk left the pass with.
enum Chunk {
    /// More keys remain and the pass holds room for their revisions.
    More,
    /// The pass holds enough revisions, or every key is done: time to delete.
    Full,
    /// The pass ended under it (the store was replaced).
    Ended,
}

impl Compaction {
    /// Bookkeeping for a store whose finished and scheduled compactions are these.
    pub(super) fn new(finished: i64, scheduled: i64) -> Compaction {
        Compaction {
            target: scheduled.max(finished),
            finished,
            pass: None,
            epoch: 0,
        }
    }

    /// A compaction at `rev` was applied.
    pub(super) fn schedule(&mut self, rev: i64) {
        self.target = self.target.max(rev);
    }

    /// The store was replaced by one with these compactions: any pass in progress is over.
    pub(super) fn reset(&mut self, finished: i64, scheduled: i64) {
        self.target = scheduled.max(finished);
        self.finished = finished;
        self.pass = None;
        self.epoch += 1;
    }
}

/// Keys whose index entries one index chunk looks at, at most, when they drop little.
const KEYS_PER_STEP_FACTOR: usize = 16;

/// Revisions a pass takes from the index before it deletes them (about 24 MiB). Sorted, the
/// revisions of one batch are neighbours in the key bucket, so a batch rewrites few pages: the
/// index yields them in key order, which scatters them over the whole bucket (the pages a
/// scattered batch rewrites made each one hold the writer for up to a quarter of a second).
const SORT_BUFFER: usize = 1 << 20;

impl KvStore {
    /// Do one step of the pending compaction. A step either takes dropped revisions from the
    /// index, a bounded run of keys at a time under the index lock (released between runs),
    /// until it holds [`SORT_BUFFER`] of them or the index is done, and sorts them; or it
    /// deletes the oldest `batch_limit` of those it holds in one backend transaction. The step
    /// that deletes the last of them after the index is done finishes the compaction and
    /// writes `finishedCompactRev` with its deletions.
    pub fn compaction_step(&self, batch_limit: usize) -> Result<CompactionStep> {
        let batch_limit = batch_limit.max(1);
        // One stepper at a time (the server's compactor, or an open or install finishing).
        let _stepping = self.stepping.lock();
        let (rev, epoch, draining) = {
            let mut compaction = self.compaction.lock();
            if compaction.pass.is_none() {
                if compaction.target <= compaction.finished {
                    return Ok(CompactionStep::Idle);
                }
                compaction.pass = Some(Pass::new(compaction.target));
            }
            let epoch = compaction.epoch;
            let pass = compaction.pass.as_ref().expect("a pass was just ensured");
            (pass.rev, epoch, pass.draining)
        };
        if !draining {
            loop {
                match self.compact_index_chunk(rev, epoch, batch_limit) {
                    Chunk::Ended => return Ok(CompactionStep::Progress),
                    Chunk::More => {}
                    Chunk::Full => break,
                }
            }
        }

        // The file's flush is behind: the deletions wait for it (`Backend::flush_backlogged`),
        // and the server's compactor comes back after its pause.
        if self.backend.flush_backlogged() {
            return Ok(CompactionStep::Progress);
        }
        // The oldest revisions held, in one backend transaction of their own.
        let deleting = Instant::now();
        let tx = self.backend.batch();
        let (batch, finishing) = {
            let mut compaction = self.compaction.lock();
            if compaction.epoch != epoch {
                // The store was replaced meanwhile: these revisions name nothing of the new one.
                return Ok(CompactionStep::Progress);
            }
            let Some(pass) = compaction.pass.as_mut() else {
                return Ok(CompactionStep::Progress);
            };
            let take = pass.dropped.len().min(batch_limit);
            let mut batch = pass.dropped.split_off(pass.dropped.len() - take);
            batch.reverse();
            let finishing = pass.index_done && pass.dropped.is_empty();
            if pass.dropped.is_empty() {
                pass.draining = false;
            }
            (batch, finishing)
        };
        let keys: Vec<Vec<u8>> = batch
            .iter()
            .map(|(revision, tombstone)| revision.to_key(*tombstone))
            .collect();
        tx.delete_all(Bucket::KEY, keys.iter().map(Vec::as_slice))?;
        if finishing {
            tx.put(Bucket::META, META_FINISHED_COMPACT, &rev.to_be_bytes())?;
        }
        tx.commit(false)?;
        crate::metrics::DB_COMPACTION_PAUSE_MS.observe(deleting.elapsed().as_secs_f64() * 1000.0);
        crate::metrics::COMPACTION_KEYS.inc_by(batch.len() as u64);

        let mut compaction = self.compaction.lock();
        if compaction.epoch != epoch {
            return Ok(CompactionStep::Progress);
        }
        let Some(pass) = compaction.pass.as_mut() else {
            return Ok(CompactionStep::Progress);
        };
        pass.deleted += batch.len() as u64;
        if !finishing {
            return Ok(CompactionStep::Progress);
        }
        let pass = compaction.pass.take().expect("the pass was just read");
        compaction.finished = compaction.finished.max(rev);
        drop(compaction);
        crate::metrics::INDEX_COMPACTION_PAUSE_MS.observe(pass.index_pause.as_secs_f64() * 1000.0);
        crate::metrics::DB_COMPACTION_TOTAL_MS
            .observe(pass.started.elapsed().as_secs_f64() * 1000.0);
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        crate::metrics::COMPACTION_LAST.set(i64::try_from(now).unwrap_or(i64::MAX));
        // What it removed left pages emptier: the pages in use are measured again.
        self.backend.count_pages_again();
        tracing::info!(
            compact_revision = rev,
            deleted = pass.deleted,
            took = ?pass.started.elapsed(),
            "finished scheduled compaction"
        );
        Ok(CompactionStep::Finished(rev))
    }

    /// Compacts the index of the next keys of the pass at `rev`, under the index lock, until
    /// they dropped `batch_limit` revisions or `KEYS_PER_STEP_FACTOR * batch_limit` keys were
    /// looked at, and adds what they dropped to the pass.
    fn compact_index_chunk(&self, rev: i64, epoch: u64, batch_limit: usize) -> Chunk {
        let locked = Instant::now();
        let mut state = self.state.write();
        let mut compaction = self.compaction.lock();
        if compaction.epoch != epoch {
            return Chunk::Ended;
        }
        let Some(pass) = compaction.pass.as_mut() else {
            return Chunk::Ended;
        };
        let lower = match &pass.after {
            Some(key) => Bound::Excluded(key.as_slice()),
            None => Bound::Unbounded,
        };
        let before = pass.dropped.len();
        let mut emptied = Vec::new();
        let mut last = None;
        let mut reached_end = true;
        let keys = state.index.compact_from(lower);
        for (looked, (key, key_index)) in keys.enumerate() {
            if looked > 0
                && (pass.dropped.len() - before >= batch_limit
                    || looked >= batch_limit * KEYS_PER_STEP_FACTOR)
            {
                reached_end = false;
                break;
            }
            pass.dropped.extend(key_index.compact(rev));
            if key_index.is_empty() {
                emptied.push(key.clone());
            }
            last = Some(key);
        }
        if let Some(key) = last {
            pass.after = Some(key.clone());
        }
        for key in emptied {
            state.index.remove(&key);
        }
        drop(state);
        pass.index_pause += locked.elapsed();
        pass.index_done = reached_end;
        if reached_end || pass.dropped.len() >= SORT_BUFFER {
            pass.dropped
                .sort_unstable_by_key(|(revision, _)| std::cmp::Reverse(*revision));
            pass.draining = true;
            Chunk::Full
        } else {
            Chunk::More
        }
    }

    /// Run the pending compaction to its end (at open, after a snapshot is installed, and in
    /// tools that need the store compacted before they go on).
    pub fn finish_compactions(&self) -> Result<()> {
        while self.compaction_step(FINISH_BATCH)? != CompactionStep::Idle {}
        Ok(())
    }

    /// Whether a compaction is applied but not yet finished.
    pub fn compaction_pending(&self) -> bool {
        let compaction = self.compaction.lock();
        compaction.target > compaction.finished
    }

    /// The newest finished compaction (0 if none).
    pub fn finished_compact_rev(&self) -> i64 {
        self.compaction.lock().finished
    }
}

/// Revisions per step when nothing else runs meanwhile.
const FINISH_BATCH: usize = 100_000;
