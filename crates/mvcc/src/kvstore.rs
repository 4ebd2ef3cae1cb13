//! The revisioned key-value store (etcd `server/storage/mvcc/kvstore.go`, `kvstore_txn.go`).

use std::collections::BTreeMap;
use std::ops::Bound;
use std::time::Instant;

use etcdrs_backend::{Backend, Bucket, WriteTx};
use etcdrs_proto::mvccpb::{Event, KeyValue, event::EventType};
use parking_lot::{RwLock, RwLockWriteGuard};
use prost::Message;

use crate::key_index::KeyIndex;
use crate::lease::{LeaseId, LeaseRecord, Lessor, NO_LEASE};
use crate::revision::Revision;
use crate::{Error, Result};

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

/// One change a transaction made, in etcd's watch-event form.
pub type Change = Event;

struct State {
    index: BTreeMap<Vec<u8>, KeyIndex>,
    current_rev: i64,
    compact_rev: i64,
    consistent_index: u64,
}

impl State {
    /// The revisions of keys visible in `range` at `rev`, with the total count.
    fn visible(&self, range: KeyRange<'_>, rev: i64, limit: i64) -> (Vec<Revision>, i64) {
        let Some(bounds) = range.bounds() else {
            return (Vec::new(), 0);
        };
        let mut revs = Vec::new();
        let mut count = 0;
        for (_, key_index) in self.index.range::<[u8], _>(bounds) {
            if let Some(found) = key_index.get(rev) {
                count += 1;
                if limit <= 0 || (revs.len() as i64) < limit {
                    revs.push(found.modified);
                }
            }
        }
        (revs, count)
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

fn read_i64(bytes: Option<Vec<u8>>) -> i64 {
    bytes
        .and_then(|b| <[u8; 8]>::try_from(b.as_slice()).ok())
        .map(i64::from_be_bytes)
        .unwrap_or(0)
}

/// Rebuild the in-memory state from `backend`, filling `lessor`. Returns the state and the
/// revision of a compaction that was scheduled but may not have finished.
fn load(backend: &Backend, lessor: &Lessor) -> Result<(State, i64)> {
    let read = backend.read()?;
    let consistent_index = read_i64(read.get(Bucket::META, META_CONSISTENT_INDEX)?) as u64;
    let compact_rev = read_i64(read.get(Bucket::META, META_FINISHED_COMPACT)?);
    let scheduled = read_i64(read.get(Bucket::META, META_SCHEDULED_COMPACT)?);

    let mut index: BTreeMap<Vec<u8>, KeyIndex> = BTreeMap::new();
    let mut leases_of_keys: BTreeMap<Vec<u8>, LeaseId> = BTreeMap::new();
    let mut current_rev = 0;
    let mut failure = None;
    read.for_each_in(Bucket::KEY, &[], None, |key, value| {
        let Some((rev, tombstone)) = Revision::from_key(key) else {
            failure = Some(Error::Corrupt("bad revision key".into()));
            return false;
        };
        let kv = match decode_kv(value) {
            Ok(kv) => kv,
            Err(e) => {
                failure = Some(e);
                return false;
            }
        };
        current_rev = current_rev.max(rev.main);
        let key_index = index.entry(kv.key.clone()).or_default();
        if tombstone {
            key_index.tombstone(rev);
            leases_of_keys.remove(&kv.key);
        } else {
            key_index.restore(rev, Revision::new(kv.create_revision, 0), kv.version);
            if kv.lease != NO_LEASE {
                leases_of_keys.insert(kv.key, kv.lease);
            } else {
                leases_of_keys.remove(&kv.key);
            }
        }
        true
    })?;
    if let Some(e) = failure {
        return Err(e);
    }
    // A new store is at revision 1, so the first write is revision 2, as in etcd.
    current_rev = current_rev.max(compact_rev).max(1);

    let now = Instant::now();
    let mut lease_failure = None;
    read.for_each_in(Bucket::LEASE, &[], None, |key, value| {
        match LeaseRecord::decode_stored(key, value) {
            Some(record) => {
                lessor.insert(record.id, record.ttl, now);
                // As etcd's lessor recovers it: a persisted checkpoint stands until renewed.
                if record.remaining_ttl > 0 {
                    lessor.checkpoint(record.id, record.remaining_ttl);
                }
                true
            }
            None => {
                lease_failure = Some(Error::Corrupt("bad lease record".into()));
                false
            }
        }
    })?;
    if let Some(e) = lease_failure {
        return Err(e);
    }
    for (key, lease) in &leases_of_keys {
        lessor.attach(*lease, key);
    }
    tracing::debug!(
        current_rev,
        compact_rev,
        consistent_index,
        "restored mvcc store"
    );
    Ok((
        State {
            index,
            current_rev,
            compact_rev,
            consistent_index,
        },
        scheduled,
    ))
}

/// The MVCC store: one writer, many readers.
pub struct KvStore {
    backend: Backend,
    state: RwLock<State>,
    lessor: Lessor,
}

impl KvStore {
    /// Open the store over `backend`, rebuilding the index and the leases from it.
    pub fn open(backend: Backend, min_lease_ttl: i64) -> Result<KvStore> {
        let lessor = Lessor::new(min_lease_ttl);
        let (state, scheduled) = load(&backend, &lessor)?;
        let store = KvStore {
            backend,
            state: RwLock::new(state),
            lessor,
        };
        store.finish_compaction(scheduled)?;
        Ok(store)
    }

    /// A compaction applied but not finished before a crash is finished now.
    fn finish_compaction(&self, scheduled: i64) -> Result<()> {
        if scheduled > self.compact_rev() {
            let mut batch = self.write()?;
            batch.compact(scheduled)?;
            batch.commit_meta_only(true)?;
        }
        Ok(())
    }

    /// Replace the whole store with the database image at `image` (a raft snapshot from the
    /// leader), keeping this member's own `meta` records named in `keep_meta`; the index and
    /// leases are rebuilt. Readers wait meanwhile.
    pub fn install_snapshot(&self, image: &std::path::Path, keep_meta: &[&[u8]]) -> Result<()> {
        let mut state = self.state.write();
        self.backend.replace_with_image(image, keep_meta)?;
        self.lessor.clear();
        let (loaded, scheduled) = load(&self.backend, &self.lessor)?;
        *state = loaded;
        drop(state);
        self.finish_compaction(scheduled)
    }

    /// The backend underneath (for sizes, snapshots and defragmentation).
    pub fn backend(&self) -> &Backend {
        &self.backend
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
        let limit = if params.count_only { 1 } else { params.limit };
        let (revs, count) = state.visible(range, rev, limit);
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
        let mut kvs = Vec::with_capacity(revs.len());
        for rev in revs {
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

    /// Every change with a revision in `[from, to]`, in revision order, as watch events
    /// (history a catching-up watcher needs). Revisions compacted away are simply absent.
    pub fn events_between(&self, from: i64, to: i64) -> Result<Vec<Change>> {
        let read = self.backend.read()?;
        let start = Revision::new(from, 0).to_bytes();
        let end = Revision::new(to.saturating_add(1), 0).to_bytes();
        let mut events = Vec::new();
        let mut failure = None;
        read.for_each_in(Bucket::KEY, &start, Some(&end), |key, value| {
            let Some((_, tombstone)) = Revision::from_key(key) else {
                failure = Some(Error::Corrupt("bad revision key".into()));
                return false;
            };
            match decode_kv(value) {
                Ok(kv) => {
                    let kind = if tombstone {
                        EventType::Delete
                    } else {
                        EventType::Put
                    };
                    events.push(Event {
                        r#type: kind as i32,
                        kv: Some(kv),
                        prev_kv: None,
                    });
                    true
                }
                Err(e) => {
                    failure = Some(e);
                    false
                }
            }
        })?;
        match failure {
            Some(e) => Err(e),
            None => Ok(events),
        }
    }

    /// Begin the write batch. Only the apply loop writes; a batch holds the index's write lock
    /// until it commits.
    pub fn write(&self) -> Result<WriteBatch<'_>> {
        let state = self.state.write();
        let tx = self.backend.write()?;
        Ok(WriteBatch {
            store: self,
            state,
            tx,
            changes: Vec::new(),
        })
    }

    /// Make every commit so far durable (an empty durable commit).
    pub fn force_durable(&self) -> Result<()> {
        self.backend.write()?.commit(true)?;
        Ok(())
    }

    /// etcd's periodic batch commit, for a store that went quiet (`Backend::commit_if_due`).
    pub fn commit_pending(&self) -> Result<bool> {
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

/// A batch of writes committed together: the apply loop's unit of work, one or more raft
/// entries. Dropping it without committing aborts the backend transaction, but changes
/// already made to the index stay: a failed batch is fatal to the server.
pub struct WriteBatch<'a> {
    store: &'a KvStore,
    state: RwLockWriteGuard<'a, State>,
    tx: WriteTx<'a>,
    changes: Vec<Change>,
}

impl<'a> WriteBatch<'a> {
    /// Begin a transaction: all its writes share one revision.
    pub fn txn(&mut self) -> Txn<'_, 'a> {
        let main = self.state.current_rev + 1;
        Txn {
            batch: self,
            main,
            sub: 0,
            tally: crate::metrics::TxnTally::default(),
        }
    }

    /// The current revision as this batch sees it.
    pub fn current_rev(&self) -> i64 {
        self.state.current_rev
    }

    /// The compacted revision.
    pub fn compact_rev(&self) -> i64 {
        self.state.compact_rev
    }

    /// The lessor.
    pub fn lessor(&self) -> &Lessor {
        &self.store.lessor
    }

    /// Compact history at `rev`: values no revision at or after `rev` needs are deleted.
    pub fn compact(&mut self, rev: i64) -> Result<()> {
        if rev <= self.state.compact_rev {
            return Err(Error::Compacted {
                requested: rev,
                compacted: self.state.compact_rev,
            });
        }
        if rev > self.state.current_rev {
            return Err(Error::FutureRevision {
                requested: rev,
                current: self.state.current_rev,
            });
        }
        let started = Instant::now();
        self.tx
            .put(Bucket::META, META_SCHEDULED_COMPACT, &rev.to_be_bytes())?;
        let mut dropped = Vec::new();
        self.state.index.retain(|_, key_index| {
            dropped.extend(key_index.compact(rev));
            !key_index.is_empty()
        });
        let index_done = Instant::now();
        crate::metrics::INDEX_COMPACTION_PAUSE_MS
            .observe((index_done - started).as_secs_f64() * 1000.0);
        crate::metrics::COMPACTION_KEYS.inc_by(dropped.len() as u64);
        for (revision, tombstone) in dropped {
            self.tx.delete(Bucket::KEY, &revision.to_key(tombstone))?;
        }
        // Values go in the same batch as the index: the pause and the whole compaction are
        // the same span here.
        crate::metrics::DB_COMPACTION_PAUSE_MS.observe(index_done.elapsed().as_secs_f64() * 1000.0);
        crate::metrics::DB_COMPACTION_TOTAL_MS.observe(started.elapsed().as_secs_f64() * 1000.0);
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        crate::metrics::COMPACTION_LAST.set(i64::try_from(now).unwrap_or(i64::MAX));
        self.tx
            .put(Bucket::META, META_FINISHED_COMPACT, &rev.to_be_bytes())?;
        self.state.compact_rev = rev;
        Ok(())
    }

    /// Grant a lease (already validated: id free, TTL within bounds).
    pub fn lease_grant(&mut self, id: LeaseId, ttl: i64) -> Result<()> {
        if self.store.lessor.contains(id) {
            return Err(Error::LeaseExists(id));
        }
        let record = LeaseRecord {
            id,
            ttl,
            remaining_ttl: 0,
        };
        self.tx
            .put(Bucket::LEASE, &id.to_be_bytes(), &record.encode_to_vec())?;
        self.store.lessor.insert(id, ttl, Instant::now());
        crate::metrics::LEASES_GRANTED.inc();
        crate::metrics::LEASE_TTLS.observe(ttl as f64);
        Ok(())
    }

    /// Revoke a lease: it is removed and every key attached to it is deleted, all in one
    /// revision.
    pub fn lease_revoke(&mut self, id: LeaseId) -> Result<()> {
        let Some(keys) = self.store.lessor.get(id).map(|l| l.keys) else {
            return Err(Error::LeaseNotFound(id));
        };
        let mut txn = self.txn();
        for key in &keys {
            txn.delete_range(KeyRange::new(key, &[]))?;
        }
        txn.end();
        self.tx.delete(Bucket::LEASE, &id.to_be_bytes())?;
        self.store.lessor.remove(id);
        crate::metrics::LEASES_REVOKED.inc();
        Ok(())
    }

    /// Keep a lease's checkpointed remainder in its record (etcd's
    /// `--experimental-enable-lease-checkpoint-persist`; 0 clears it), so that a restarted
    /// member goes on from it rather than from the full TTL. A lease that is gone is skipped.
    pub fn persist_lease_checkpoint(&mut self, id: LeaseId, remaining_ttl: i64) -> Result<()> {
        let Some(ttl) = self.store.lessor.ttl(id) else {
            return Ok(());
        };
        let record = LeaseRecord {
            id,
            ttl,
            remaining_ttl: remaining_ttl.max(0),
        };
        self.tx
            .put(Bucket::LEASE, &id.to_be_bytes(), &record.encode_to_vec())?;
        Ok(())
    }

    /// Write a value to a bucket inside this batch (membership, alarms, meta...).
    pub fn bucket_put(&mut self, bucket: Bucket, key: &[u8], value: &[u8]) -> Result<()> {
        self.tx.put(bucket, key, value)?;
        Ok(())
    }

    /// Delete a value from a bucket inside this batch.
    pub fn bucket_delete(&mut self, bucket: Bucket, key: &[u8]) -> Result<()> {
        self.tx.delete(bucket, key)?;
        Ok(())
    }

    /// Record the raft position this batch brings the store to.
    pub fn set_consistent_index(&mut self, index: u64, term: u64) -> Result<()> {
        self.tx
            .put(Bucket::META, META_CONSISTENT_INDEX, &index.to_be_bytes())?;
        self.tx.put(Bucket::META, META_TERM, &term.to_be_bytes())?;
        self.state.consistent_index = index;
        Ok(())
    }

    /// Take the changes made so far (for watchers), in revision order.
    pub fn take_changes(&mut self) -> Vec<Change> {
        std::mem::take(&mut self.changes)
    }

    /// Commit the batch; `durable` forces an fsync (otherwise the backend decides by time).
    /// Returns the batch's changes and whether the commit was durable.
    pub fn commit(self, durable: bool) -> Result<(Vec<Change>, bool)> {
        let WriteBatch {
            state, tx, changes, ..
        } = self;
        let durable = tx.commit(durable)?;
        // The index lock is released only now: readers never see uncommitted revisions.
        drop(state);
        Ok((changes, durable))
    }

    fn commit_meta_only(self, durable: bool) -> Result<()> {
        self.commit(durable).map(|_| ())
    }
}

/// A transaction inside a batch: every write gets the same main revision. Reads see the
/// transaction's own earlier writes.
pub struct Txn<'b, 'a> {
    batch: &'b mut WriteBatch<'a>,
    main: i64,
    sub: i64,
    /// Its operations, counted when it ends (dropped).
    tally: crate::metrics::TxnTally,
}

impl Drop for Txn<'_, '_> {
    fn drop(&mut self) {
        self.tally.end();
    }
}

impl Txn<'_, '_> {
    /// The revision the transaction's writes get.
    pub fn rev(&self) -> i64 {
        self.main
    }

    /// Whether this transaction has written anything.
    pub fn has_changes(&self) -> bool {
        self.sub > 0
    }

    /// Read a range as this transaction sees it.
    pub fn range(&self, range: KeyRange<'_>, params: RangeParams) -> Result<RangeResult> {
        self.tally.ranges.set(self.tally.ranges.get() + 1);
        let state = &self.batch.state;
        let read_rev = if self.sub > 0 {
            self.main
        } else {
            state.current_rev
        };
        let rev = if params.rev <= 0 {
            read_rev
        } else if params.rev > read_rev {
            return Err(Error::FutureRevision {
                requested: params.rev,
                current: read_rev,
            });
        } else if params.rev < state.compact_rev {
            return Err(Error::Compacted {
                requested: params.rev,
                compacted: state.compact_rev,
            });
        } else {
            params.rev
        };
        let limit = if params.count_only { 1 } else { params.limit };
        let (revs, count) = state.visible(range, rev, limit);
        let mut kvs = Vec::new();
        if !params.count_only {
            for rev in revs {
                let Some(bytes) = self.batch.tx.get(Bucket::KEY, &rev.to_bytes())? else {
                    return Err(Error::Corrupt(format!("revision {rev:?} missing")));
                };
                kvs.push(decode_kv(&bytes)?);
            }
        }
        Ok(RangeResult {
            kvs,
            rev: read_rev,
            count,
        })
    }

    /// Put `key` = `value` attached to `lease` (0 for none). The lease must exist.
    pub fn put(&mut self, key: &[u8], value: &[u8], lease: LeaseId) -> Result<KeyValue> {
        if lease != NO_LEASE && !self.batch.store.lessor.contains(lease) {
            return Err(Error::LeaseNotFound(lease));
        }
        self.tally.puts += 1;
        self.tally.put_bytes += (key.len() + value.len()) as u64;
        let rev = Revision::new(self.main, self.sub);
        let key_index = self.batch.state.index.entry(key.to_vec()).or_default();
        let (create_revision, version) = match key_index.get(i64::MAX) {
            Some(found) => (found.created.main, found.version + 1),
            None => (self.main, 1),
        };
        let kv = KeyValue {
            key: key.to_vec(),
            create_revision,
            mod_revision: self.main,
            version,
            value: value.to_vec(),
            lease,
        };
        self.batch
            .tx
            .put(Bucket::KEY, &rev.to_bytes(), &kv.encode_to_vec())?;
        key_index.put(rev);
        let lessor = &self.batch.store.lessor;
        let old_lease = lessor.lease_of(key);
        if old_lease != lease {
            lessor.detach(key);
        }
        if lease != NO_LEASE {
            lessor.attach(lease, key);
        }
        self.sub += 1;
        self.batch.changes.push(Event {
            r#type: EventType::Put as i32,
            kv: Some(kv.clone()),
            prev_kv: None,
        });
        Ok(kv)
    }

    /// Delete every key in `range`; returns the deleted keys, in key order.
    pub fn delete_range(&mut self, range: KeyRange<'_>) -> Result<Vec<Vec<u8>>> {
        self.tally.deletes += 1;
        let Some(bounds) = range.bounds() else {
            return Ok(Vec::new());
        };
        let live: Vec<Vec<u8>> = self
            .batch
            .state
            .index
            .range::<[u8], _>(bounds)
            .filter(|(_, key_index)| key_index.is_live())
            .map(|(key, _)| key.clone())
            .collect();
        for key in &live {
            let rev = Revision::new(self.main, self.sub);
            let tombstone = KeyValue {
                key: key.clone(),
                mod_revision: self.main,
                ..KeyValue::default()
            };
            self.batch
                .tx
                .put(Bucket::KEY, &rev.to_key(true), &tombstone.encode_to_vec())?;
            if let Some(key_index) = self.batch.state.index.get_mut(key) {
                key_index.tombstone(rev);
            }
            self.batch.store.lessor.detach(key);
            self.sub += 1;
            self.batch.changes.push(Event {
                r#type: EventType::Delete as i32,
                kv: Some(tombstone),
                prev_kv: None,
            });
        }
        Ok(live)
    }

    /// End the transaction: the store's revision advances if anything was written.
    pub fn end(self) -> i64 {
        if self.sub > 0 {
            self.batch.state.current_rev = self.main;
        }
        self.batch.state.current_rev
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn open(dir: &std::path::Path) -> KvStore {
        KvStore::open(Backend::open(&dir.join("db")).unwrap(), 2).unwrap()
    }

    fn at(rev: i64) -> RangeParams {
        RangeParams {
            rev,
            ..Default::default()
        }
    }

    fn get(store: &KvStore, key: &[u8], rev: i64) -> Option<KeyValue> {
        store
            .range(KeyRange::new(key, &[]), at(rev))
            .unwrap()
            .kvs
            .pop()
    }

    #[test]
    fn revisions_versions_and_history() {
        let dir = tempfile::tempdir().unwrap();
        let store = open(dir.path());
        assert_eq!(store.current_rev(), 1);
        let mut batch = store.write().unwrap();
        let mut txn = batch.txn();
        txn.put(b"a", b"1", 0).unwrap();
        assert_eq!(txn.end(), 2);
        let mut txn = batch.txn();
        txn.put(b"a", b"2", 0).unwrap();
        txn.put(b"b", b"x", 0).unwrap();
        txn.end();
        let mut txn = batch.txn();
        assert_eq!(
            txn.delete_range(KeyRange::new(b"a", b"c")).unwrap().len(),
            2
        );
        txn.end();
        let mut txn = batch.txn();
        txn.put(b"a", b"3", 0).unwrap();
        txn.end();
        batch.set_consistent_index(9, 1).unwrap();
        batch.commit(true).unwrap();

        assert_eq!(store.current_rev(), 5);
        let a = get(&store, b"a", 0).unwrap();
        assert_eq!((a.create_revision, a.mod_revision, a.version), (5, 5, 1));
        let a3 = get(&store, b"a", 3).unwrap();
        assert_eq!(
            (
                a3.create_revision,
                a3.mod_revision,
                a3.version,
                a3.value.as_slice()
            ),
            (2, 3, 2, &b"2"[..])
        );
        assert_eq!(get(&store, b"b", 4), None);
        let params = RangeParams {
            rev: 3,
            limit: 1,
            count_only: false,
        };
        let all = store.range(KeyRange::new(b"\0", b"\0"), params).unwrap();
        assert_eq!((all.kvs.len(), all.count, all.rev), (1, 2, 5));
        assert!(matches!(
            store.range(KeyRange::new(b"a", &[]), at(6)),
            Err(Error::FutureRevision { .. })
        ));

        drop(store);
        let store = open(dir.path());
        assert_eq!(store.current_rev(), 5);
        assert_eq!(store.consistent_index(), 9);
        assert_eq!(get(&store, b"a", 3).unwrap().version, 2);
        assert_eq!(get(&store, b"a", 0).unwrap().version, 1);
    }

    #[test]
    fn compaction_drops_history_and_survives_restart() {
        let dir = tempfile::tempdir().unwrap();
        let store = open(dir.path());
        let mut batch = store.write().unwrap();
        for value in [b"1", b"2", b"3"] {
            let mut txn = batch.txn();
            txn.put(b"k", value, 0).unwrap();
            txn.end();
        }
        batch.compact(3).unwrap();
        batch.commit(true).unwrap();
        assert!(matches!(
            store.range(KeyRange::new(b"k", &[]), at(2)),
            Err(Error::Compacted { .. })
        ));
        assert_eq!(get(&store, b"k", 3).unwrap().value, b"2");
        drop(store);
        let store = open(dir.path());
        assert_eq!(store.compact_rev(), 3);
        assert_eq!(get(&store, b"k", 3).unwrap().version, 2);
        assert_eq!(get(&store, b"k", 0).unwrap().version, 3);
        let mut batch = store.write().unwrap();
        assert!(matches!(batch.compact(3), Err(Error::Compacted { .. })));
        assert!(matches!(
            batch.compact(9),
            Err(Error::FutureRevision { .. })
        ));
    }

    #[test]
    fn leases_attach_and_revoke_in_one_revision() {
        let dir = tempfile::tempdir().unwrap();
        let store = open(dir.path());
        let mut batch = store.write().unwrap();
        batch.lease_grant(5, 10).unwrap();
        let mut txn = batch.txn();
        assert!(matches!(
            txn.put(b"x", b"", 6),
            Err(Error::LeaseNotFound(6))
        ));
        txn.put(b"a", b"1", 5).unwrap();
        txn.put(b"b", b"1", 5).unwrap();
        txn.end();
        batch.commit(true).unwrap();
        drop(store);
        let store = open(dir.path());
        assert_eq!(store.lessor().get(5).unwrap().keys.len(), 2);
        let mut batch = store.write().unwrap();
        batch.lease_revoke(5).unwrap();
        let (changes, _) = batch.commit(false).unwrap();
        assert_eq!(changes.len(), 2);
        assert!(
            changes
                .iter()
                .all(|c| c.kv.as_ref().unwrap().mod_revision == 3)
        );
        assert_eq!(store.current_rev(), 3);
        assert!(store.lessor().get(5).is_none());
    }
}
