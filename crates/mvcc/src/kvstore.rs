//! The revisioned key-value store (etcd `server/storage/mvcc/kvstore.go`, `kvstore_txn.go`).//!
//! Layout: the store, its loading and its reads are here; `write` holds [`WriteBatch`] and
//! [`Txn`], the write path.

use std::ops::Bound;
use std::time::Instant;

use etcdrs_backend::{Backend, BatchTx, Bucket, ReadTx};
use etcdrs_proto::mvccpb::{Event, KeyValue, event::EventType};
use parking_lot::{RwLock, RwLockWriteGuard};
use prost::Message;

use self::index::Index;
use crate::lease::{LeaseId, LeaseRecord, Lessor, NO_LEASE};
use crate::revision::Revision;
use crate::{Error, Result};
mod compaction;
mod index;
mod load;
mod recent;
mod write;

use self::compaction::Compaction;
pub use self::compaction::CompactionStep;
pub use self::load::{BuiltIndex, LoadedStore, StoreLoader};
use self::recent::RecentValues;
pub use self::write::{Txn, WriteBatch};

/// `meta` key of the raft index of the last applied entry (etcd's `consistent_index`).
pub const META_CONSISTENT_INDEX: &[u8] = b"consistent_index";
/// `meta` key of the raft term of the last applied entry.
pub const META_TERM: &[u8] = b"term";
/// `meta` key of the raft membership (`ConfState`) as of the consistent index.
pub const META_CONF_STATE: &[u8] = b"confState";
const META_FINISHED_COMPACT: &[u8] = b"finishedCompactRev";
const META_SCHEDULED_COMPACT: &[u8] = b"scheduledCompactRev";

/// Lower and upper bounds of a key range, for `BTreeMap::range`.
type KeyBounds<'a> = (Bound<&'a [u8]>, Bound<&'a [u8]>);

/// A key range in etcd's encoding: `end` empty means the single key `key`; `end == [0]` means
/// every key >= `key`; otherwise `[key, end)`.
#[derive(Clone, Copy, Debug)]
pub struct KeyRange<'a> {
    /// First key.
    pub key: &'a [u8],
    /// End, in etcd's encoding.
    pub end: &'a [u8],
}

impl<'a> KeyRange<'a> {
    /// A range from etcd's `key`/`range_end` pair.
    pub fn new(key: &'a [u8], end: &'a [u8]) -> Self {
        KeyRange { key, end }
    }

    fn bounds(&self) -> Option<KeyBounds<'a>> {
        if self.end.is_empty() {
            return Some((Bound::Included(self.key), Bound::Included(self.key)));
        }
        if self.end == [0] {
            return Some((Bound::Included(self.key), Bound::Unbounded));
        }
        if self.end <= self.key {
            return None;
        }
        Some((Bound::Included(self.key), Bound::Excluded(self.end)))
    }
}

/// How to read a range.
#[derive(Clone, Copy, Debug, Default)]
pub struct RangeParams {
    /// Revision to read at; <= 0 means the current revision.
    pub rev: i64,
    /// Most keys to return; <= 0 means no limit.
    pub limit: i64,
    /// Count only: return no key-values.
    pub count_only: bool,
}

/// The result of a range read.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct RangeResult {
    /// The key-values, in key order, at most `limit`.
    pub kvs: Vec<KeyValue>,
    /// The revision the range was read at.
    pub rev: i64,
    /// How many keys the range holds at that revision, regardless of the limit.
    pub count: i64,
}

/// How to read one page of a range: the unit in which a streamed range (etcd 3.7's
/// RangeStream) reads a result of any size, so that no read holds more than a page.
#[derive(Clone, Copy, Debug)]
pub struct PageParams {
    /// Revision to read at; <= 0 means the current revision.
    pub rev: i64,
    /// Most keys in the page; 0 counts as 1.
    pub max_keys: usize,
    /// The page ends before a key-value once its key-values' encoded size has reached this;
    /// the first key-value is always taken, so a page holds less than this plus one.
    pub max_bytes: usize,
    /// Drop each value as it is read (etcd's `keys_only`); the size counts without it.
    pub keys_only: bool,
}

/// One page of a range, read by [`KvStore::range_page`].
#[derive(Clone, Debug, Default, PartialEq)]
pub struct RangePage {
    /// The range's first key-values at `read_rev`, in key order.
    pub kvs: Vec<KeyValue>,
    /// The revision read at: the next pages of the same result read at it too.
    pub read_rev: i64,
    /// The store's current revision when the page was read.
    pub current_rev: i64,
    /// Whether the range holds more keys at `read_rev` after the page's last.
    pub more: bool,
}

/// A range read whose key-values are handed out as the store holds them, each an encoded
/// `mvccpb.KeyValue` (the bytes a `RangeResponse` carries), so that an answer is written
/// without decoding and encoding each one again: [`KvStore::range_encoded`].
pub struct EncodedRange {
    /// Begun under the index's read lock: every revision listed is committed in it.
    read: Option<ReadTx>,
    revs: Vec<Revision>,
    /// The values of `revs` the store keeps in memory (`recent`).
    kept: recent::Kept,
    /// The store's current revision when read (the answer's header revision).
    pub rev: i64,
    /// How many keys the range holds at the revision read, regardless of the limit.
    pub count: i64,
}

impl EncodedRange {
    /// Key-values read (at most the limit asked for).
    pub fn len(&self) -> usize {
        self.revs.len()
    }

    /// Whether none was read.
    pub fn is_empty(&self) -> bool {
        self.revs.is_empty()
    }

    /// Hands `visit` the first `take` key-values, encoded, in key order.
    pub fn for_each(&self, take: usize, mut visit: impl FnMut(&[u8])) -> Result<()> {
        self.for_each_from(0, take, |kv| {
            visit(kv);
            true
        })
        .map(|_| ())
    }

    /// Hands `visit` the key-values from the `from`-th up to (not including) the `take`-th,
    /// encoded, in key order, until it returns `false`; returns the position after the last
    /// one it was handed (where to go on from).
    pub fn for_each_from(
        &self,
        from: usize,
        take: usize,
        mut visit: impl FnMut(&[u8]) -> bool,
    ) -> Result<usize> {
        let Some(read) = &self.read else {
            return Ok(from);
        };
        let take = take.min(self.revs.len());
        // Those not kept in memory are read from the backend in one pass (every one, when
        // none is kept); the kept ones before each are handed over first, in key order.
        let from_backend = (from..take).filter(|&i| self.kept.get(i).is_none());
        let mut positions = from_backend.clone();
        let mut next = from;
        let mut stopped = false;
        let mut missing = None;
        read.get_each(
            Bucket::KEY,
            from_backend.map(|i| self.revs[i].to_bytes()),
            |key, value| {
                let Some(at) = positions.next() else {
                    return false;
                };
                // Every one between is kept (the backend's are in `positions`).
                while next < at {
                    let i = next;
                    next += 1;
                    if let Some(kept) = self.kept.get(i)
                        && !visit(kept)
                    {
                        stopped = true;
                        return false;
                    }
                }
                next = at + 1;
                match value {
                    Some(value) => {
                        stopped = !visit(value);
                        !stopped
                    }
                    None => {
                        missing = Some(key.to_vec());
                        false
                    }
                }
            },
        )?;
        if let Some(key) = missing {
            return Err(Error::Corrupt(format!("revision {key:?} missing")));
        }
        if stopped {
            return Ok(next);
        }
        for i in next..take {
            if let Some(kept) = self.kept.get(i)
                && !visit(kept)
            {
                return Ok(i + 1);
            }
        }
        Ok(take.max(from))
    }
}

impl EncodedRange {
    /// The sum of `weigh` over the lengths of the encoded key-values from the `from`-th up to
    /// (not including) the `take`-th: what a large answer's length is counted from before it
    /// is written. Their values' lengths are read in revision order (the order does not change
    /// a sum): by one scan of the backend when their revisions lie close together there (a
    /// range written in key order), each looked up otherwise; a long value's length is in
    /// its head, and its pieces are not read.
    pub fn sum_lens_from(
        &self,
        from: usize,
        take: usize,
        weigh: impl Fn(usize) -> usize,
    ) -> Result<usize> {
        let Some(read) = &self.read else {
            return Ok(0);
        };
        let take = take.min(self.revs.len());
        let mut total = 0;
        let mut wanted = Vec::new();
        for i in from..take {
            match self.kept.get(i) {
                Some(kept) => total += weigh(kept.len()),
                None => wanted.push(self.revs[i]),
            }
        }
        let (Some(&first), Some(&last)) = (wanted.iter().min(), wanted.iter().max()) else {
            return Ok(total);
        };
        wanted.sort_unstable();
        let mut found = 0;
        let span = last.main.saturating_sub(first.main).unsigned_abs();
        if span < 2 * wanted.len() as u64 {
            let mut next = wanted.iter().map(|rev| rev.to_bytes()).peekable();
            let end = Revision::new(last.main, last.sub.saturating_add(1)).to_bytes();
            read.for_each_len_in(Bucket::KEY, &first.to_bytes(), Some(&end), |key, len| {
                while next.next_if(|want| want.as_slice() < key).is_some() {}
                if next.next_if(|want| want.as_slice() == key).is_some() {
                    total += weigh(len);
                    found += 1;
                }
                next.peek().is_some()
            })?;
        } else {
            read.get_each_len(
                Bucket::KEY,
                wanted.iter().map(|rev| rev.to_bytes()),
                |_, len| match len {
                    Some(len) => {
                        total += weigh(len);
                        found += 1;
                        true
                    }
                    None => false,
                },
            )?;
        }
        if found != wanted.len() {
            return Err(Error::Corrupt(format!(
                "{} of {} revisions missing",
                wanted.len() - found,
                wanted.len()
            )));
        }
        Ok(total)
    }
}

/// One change a transaction made, in etcd's watch-event form.
pub type Change = Event;

struct State {
    index: Index,
    current_rev: i64,
    compact_rev: i64,
    consistent_index: u64,
}

impl State {
    /// The revisions of keys visible in `range` at `rev`, at most `limit` of them (<= 0: no
    /// limit), with the count of all of them: past the limit, counted by the index's chunks
    /// ([`Index::count`]), so that a page costs its keys and not the rest of the range.
    fn visible(&self, range: KeyRange<'_>, rev: i64, limit: i64) -> (Vec<Revision>, i64) {
        let Some(bounds) = range.bounds() else {
            return (Vec::new(), 0);
        };
        let take = usize::try_from(limit)
            .ok()
            .filter(|&limit| limit > 0)
            .unwrap_or(usize::MAX);
        let revs: Vec<Revision> = self
            .index
            .range(bounds)
            .filter_map(|(_, key_index)| key_index.get(rev).map(|found| found.modified))
            .take(take)
            .collect();
        let count = if revs.len() < take {
            // The walk went through the whole range.
            revs.len() as i64
        } else {
            self.index.count(bounds, rev)
        };
        (revs, count)
    }

    /// What a range read as `params` asks (its revision `rev` already checked) finds in the
    /// index: the revisions of its key-values and its count. A count-only read walks no keys
    /// but those of the range's partial chunks.
    fn read_range(
        &self,
        range: KeyRange<'_>,
        rev: i64,
        params: RangeParams,
    ) -> (Vec<Revision>, i64) {
        if !params.count_only {
            return self.visible(range, rev, params.limit);
        }
        let count = match range.bounds() {
            Some(bounds) => self.index.count(bounds, rev),
            None => 0,
        };
        (Vec::new(), count)
    }

    /// The revisions of the first `n` keys visible in `range` at `rev`; unlike
    /// [`Self::visible`], the walk stops there, so its cost is the page's, not the range's.
    fn visible_first(&self, range: KeyRange<'_>, rev: i64, n: usize) -> Vec<Revision> {
        let Some(bounds) = range.bounds() else {
            return Vec::new();
        };
        self.index
            .range(bounds)
            .filter_map(|(_, key_index)| key_index.get(rev).map(|found| found.modified))
            .take(n)
            .collect()
    }

    fn check_rev(&self, rev: i64) -> Result<i64> {
        if rev <= 0 {
            return Ok(self.current_rev);
        }
        if rev > self.current_rev {
            return Err(Error::FutureRevision {
                requested: rev,
                current: self.current_rev,
            });
        }
        if rev < self.compact_rev {
            return Err(Error::Compacted {
                requested: rev,
                compacted: self.compact_rev,
            });
        }
        Ok(rev)
    }
}

fn decode_kv(bytes: &[u8]) -> Result<KeyValue> {
    KeyValue::decode(bytes).map_err(|e| Error::Corrupt(format!("key-value: {e}")))
}

/// The MVCC store: one writer, many readers.
pub struct KvStore {
    backend: Backend,
    state: RwLock<State>,
    lessor: Lessor,
    /// Applied compactions and the pass that carries them out (`compaction`).
    compaction: parking_lot::Mutex<Compaction>,
    /// Held by the one [`KvStore::compaction_step`] running.
    stepping: parking_lot::Mutex<()>,
    /// Large values written lately, for the reads that follow (`recent`).
    recent: RecentValues,
}

impl KvStore {
    /// Open the store over `backend`, rebuilding the index and the leases from it.
    pub fn open(backend: Backend, min_lease_ttl: i64) -> Result<KvStore> {
        let lessor = Lessor::new(min_lease_ttl);
        let loaded = load::load_store(&backend)?;
        loaded.fill(&lessor, backend.now());
        let (mut state, scheduled) = (loaded.state, loaded.scheduled);
        let compaction = Compaction::new(state.compact_rev, scheduled);
        state.compact_rev = state.compact_rev.max(scheduled);
        let store = KvStore {
            backend,
            state: RwLock::new(state),
            lessor,
            compaction: parking_lot::Mutex::new(compaction),
            stepping: parking_lot::Mutex::new(()),
            recent: RecentValues::default(),
        };
        // A compaction applied but not finished before a crash is finished now.
        store.finish_compactions()?;
        Ok(store)
    }

    /// Replace the whole store with the database image at `image` (a raft snapshot from the
    /// leader), keeping this member's own `meta` records named in `keep_meta`; the index and
    /// leases are rebuilt, and a compaction the image had not finished is finished. Readers
    /// wait meanwhile.
    pub fn install_snapshot(&self, image: &std::path::Path, keep_meta: &[&[u8]]) -> Result<()> {
        self.install_with(|backend| backend.replace_with_image(image, keep_meta))
    }

    /// As [`KvStore::install_snapshot`], for an image this process wrote as a backend of its
    /// own (an etcd leader's database, imported): the file is swapped in rather than copied,
    /// and is gone afterwards.
    pub fn install_snapshot_file(
        &self,
        image: &std::path::Path,
        keep_meta: &[&[u8]],
    ) -> Result<()> {
        self.install_with(|backend| backend.replace_with_file(image, keep_meta))
    }

    /// As [`KvStore::install_snapshot_file`], with the state already read from `image`
    /// ([`StoreLoader`], fed the image's `key` bucket while it was written): the install is a
    /// swap, with no pass over the keys.
    pub fn install_loaded(
        &self,
        image: &std::path::Path,
        keep_meta: &[&[u8]],
        loaded: LoadedStore,
    ) -> Result<()> {
        self.install_state(
            |backend| backend.replace_with_file(image, keep_meta),
            |_| Ok(loaded),
        )
    }

    fn install_with(
        &self,
        replace: impl FnOnce(&Backend) -> etcdrs_backend::Result<()>,
    ) -> Result<()> {
        self.install_state(replace, load::load_store)
    }

    fn install_state(
        &self,
        replace: impl FnOnce(&Backend) -> etcdrs_backend::Result<()>,
        load: impl FnOnce(&Backend) -> Result<LoadedStore>,
    ) -> Result<()> {
        let mut state = self.state.write();
        // A pass in progress ends here: its steps delete nothing from the new contents.
        self.compaction.lock().reset(i64::MAX, i64::MAX);
        self.recent.clear();
        replace(&self.backend)?;
        self.lessor.clear();
        let loaded = load(&self.backend)?;
        loaded.fill(&self.lessor, self.backend.now());
        let (mut loaded, scheduled) = (loaded.state, loaded.scheduled);
        self.compaction.lock().reset(loaded.compact_rev, scheduled);
        loaded.compact_rev = loaded.compact_rev.max(scheduled);
        *state = loaded;
        drop(state);
        self.finish_compactions()
    }

    /// The backend underneath (for sizes, snapshots and defragmentation).
    pub fn backend(&self) -> &Backend {
        &self.backend
    }

    /// The store's clock's now (its backend's [`etcdrs_backend::Clock`]): what lease
    /// grants, the lessor's promotion and expiry are measured against.
    pub fn now(&self) -> Instant {
        self.backend.now()
    }

    /// The lessor.
    pub fn lessor(&self) -> &Lessor {
        &self.lessor
    }

    /// Keys the index holds (live ones and those with history only), etcd's `keys_total`.
    pub fn key_count(&self) -> usize {
        self.state.read().index.len()
    }

    /// The current revision.
    pub fn current_rev(&self) -> i64 {
        self.state.read().current_rev
    }

    /// The compacted revision (0 if never compacted).
    pub fn compact_rev(&self) -> i64 {
        self.state.read().compact_rev
    }

    /// The raft index of the last applied entry, as of the last commit.
    pub fn consistent_index(&self) -> u64 {
        self.state.read().consistent_index
    }

    /// Read a range.
    pub fn range(&self, range: KeyRange<'_>, params: RangeParams) -> Result<RangeResult> {
        // A read transaction of one range, as etcd counts it.
        crate::metrics::RANGES.inc();
        let state = self.state.read();
        let rev = state.check_rev(params.rev)?;
        let (revs, count) = state.read_range(range, rev, params);
        if params.count_only {
            return Ok(RangeResult {
                kvs: Vec::new(),
                rev: state.current_rev,
                count,
            });
        }
        // Begun under the read lock: every revision the index names is committed.
        let read = self.backend.read()?;
        let current_rev = state.current_rev;
        drop(state);
        let kept = self.recent.lookup(&revs);
        let mut kvs = Vec::with_capacity(revs.len());
        for (i, rev) in revs.into_iter().enumerate() {
            if let Some(bytes) = kept.get(i) {
                kvs.push(decode_kv(bytes)?);
                continue;
            }
            let Some(bytes) = read.get(Bucket::KEY, &rev.to_bytes())? else {
                return Err(Error::Corrupt(format!("revision {rev:?} missing")));
            };
            kvs.push(decode_kv(&bytes)?);
        }
        Ok(RangeResult {
            kvs,
            rev: current_rev,
            count,
        })
    }

    /// Read the first keys of `range` at `params.rev`, at most `params.max_keys` of them and
    /// about `params.max_bytes` (see [`PageParams`]). A streamed range reads its result as a
    /// sequence of these, each from after the last key of the one before, at the first page's
    /// [`RangePage::read_rev`]: unlike one [`Self::range`] of the whole result, no read holds
    /// more than a page, neither the index's read lock nor a backend read transaction stays
    /// open between pages, and no page walks the rest of the range to count it. Errors as
    /// [`Self::range`]: a revision compacted meanwhile fails the next page.
    pub fn range_page(&self, range: KeyRange<'_>, params: PageParams) -> Result<RangePage> {
        // One read transaction per page, as etcd's RangeStream makes one range per chunk.
        crate::metrics::RANGES.inc();
        let max_keys = params.max_keys.max(1);
        let state = self.state.read();
        let read_rev = state.check_rev(params.rev)?;
        let current_rev = state.current_rev;
        // One key beyond the page tells whether more follow.
        let revs = state.visible_first(range, read_rev, max_keys.saturating_add(1));
        let mut page = RangePage {
            kvs: Vec::with_capacity(revs.len().min(max_keys)),
            read_rev,
            current_rev,
            more: false,
        };
        if revs.is_empty() {
            return Ok(page);
        }
        // Begun under the read lock: every revision the index names is committed.
        let read = self.backend.read()?;
        drop(state);
        let kept = self.recent.lookup(&revs);
        let mut bytes = 0usize;
        for (taken, rev) in revs.iter().enumerate() {
            if taken == max_keys || (taken > 0 && bytes >= params.max_bytes) {
                page.more = true;
                break;
            }
            let mut kv = match kept.get(taken) {
                Some(stored) => decode_kv(stored)?,
                None => match read.get(Bucket::KEY, &rev.to_bytes())? {
                    Some(stored) => decode_kv(&stored)?,
                    None => return Err(Error::Corrupt(format!("revision {rev:?} missing"))),
                },
            };
            if params.keys_only {
                kv.value = Vec::new();
            }
            bytes = bytes.saturating_add(kv.encoded_len());
            page.kvs.push(kv);
        }
        Ok(page)
    }

    /// Read a range as [`Self::range`] does, keeping the key-values as stored
    /// ([`EncodedRange`]): the reader holds one copy of the answer, the one it writes.
    pub fn range_encoded(&self, range: KeyRange<'_>, params: RangeParams) -> Result<EncodedRange> {
        crate::metrics::RANGES.inc();
        let state = self.state.read();
        let rev = state.check_rev(params.rev)?;
        let (revs, count) = state.read_range(range, rev, params);
        if params.count_only || revs.is_empty() {
            return Ok(EncodedRange {
                read: None,
                revs: Vec::new(),
                kept: recent::Kept::default(),
                rev: state.current_rev,
                count,
            });
        }
        let read = self.backend.read()?;
        let current_rev = state.current_rev;
        drop(state);
        Ok(EncodedRange {
            read: Some(read),
            kept: self.recent.lookup(&revs),
            revs,
            rev: current_rev,
            count,
        })
    }

    /// Returns once every revision answered so far is committed to the backend. A batch's
    /// proposers may be answered before its commit (the server's applier does so), and the
    /// batch holds the index lock from before the answers until the commit: taking the lock
    /// waits for it. For readers of the backend itself (hashes, snapshots, watchers' catch-up)
    /// and of what the batch did before its commit (a progress report after the watch hub
    /// heard of it); ranges hold the lock anyway.
    pub fn wait_committed(&self) {
        drop(self.state.read());
    }

    /// A read transaction that holds every revision answered so far ([`Self::wait_committed`]).
    pub fn read_committed(&self) -> Result<ReadTx> {
        self.wait_committed();
        Ok(self.backend.read()?)
    }

    /// Every change with a revision in `[from, to]`, in revision order, as watch events
    /// (history a catching-up watcher needs). Revisions compacted away are simply absent.
    /// Waits for the batch in progress ([`Self::wait_committed`]): watchers hear of a batch
    /// before its commit.
    pub fn events_between(&self, from: i64, to: i64) -> Result<Vec<Change>> {
        let read = self.read_committed()?;
        let start = Revision::new(from, 0).to_bytes();
        let end = Revision::new(to.saturating_add(1), 0).to_bytes();
        let mut events = Vec::new();
        read.try_for_each_in(Bucket::KEY, &start, Some(&end), |key, value| {
            let (rev, tombstone) =
                Revision::from_key(key).ok_or_else(|| Error::Corrupt("bad revision key".into()))?;
            let mut kv = decode_kv(value)?;
            let kind = if tombstone {
                // A tombstone is stored as etcd stores it, the key alone: the deletion's
                // revision comes from the bucket key (etcd's `kvsToEvents`).
                kv.mod_revision = rev.main;
                EventType::Delete
            } else {
                EventType::Put
            };
            events.push(Event {
                r#type: kind as i32,
                kv: Some(kv),
                prev_kv: None,
            });
            Ok::<_, Error>(true)
        })?;
        Ok(events)
    }

    /// Begin the write batch. Only the apply loop writes; a batch holds the index's write lock
    /// until it commits.
    pub fn write(&self) -> Result<WriteBatch<'_>> {
        let state = self.state.write();
        let tx = self.backend.batch();
        Ok(WriteBatch {
            store: self,
            state,
            tx,
            changes: Vec::new(),
            large: Vec::new(),
        })
    }

    /// Make every commit so far durable (an empty durable commit).
    pub fn force_durable(&self) -> Result<()> {
        self.backend.write()?.commit(true)?;
        Ok(())
    }

    /// etcd's periodic batch commit, for a store that went quiet (`Backend::commit_if_due`).
    /// Also drops the large values kept in memory longer than `recent::MAX_AGE`, which
    /// otherwise go only with the next write: a member whose writes stopped gives them back.
    pub fn commit_pending(&self) -> Result<bool> {
        self.commit_pending_at(Instant::now())
    }

    fn commit_pending_at(&self, now: Instant) -> Result<bool> {
        self.recent.expire(now);
        Ok(self.backend.commit_if_due()?)
    }

    /// Read a `meta` value as last committed.
    pub fn meta(&self, key: &[u8]) -> Result<Option<Vec<u8>>> {
        Ok(self.backend.read()?.get(Bucket::META, key)?)
    }

    /// Read a value from any bucket as last committed.
    pub fn bucket_get(&self, bucket: Bucket, key: &[u8]) -> Result<Option<Vec<u8>>> {
        Ok(self.backend.read()?.get(bucket, key)?)
    }
}

#[cfg(test)]
mod tests;
