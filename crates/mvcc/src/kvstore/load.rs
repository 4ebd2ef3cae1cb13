//! Reading the store's in-memory state back from a backend (etcd's `kvstore.restore`): the key
//! index from every pair of the `key` bucket, the revisions and consistent index from `meta`,
//! the leases and the keys attached to them.
//!
//! The `key` bucket is taken a pair at a time ([`StoreLoader::push`]), so the index can be
//! built while something else walks the pairs anyway: opening a store walks its own backend,
//! and a snapshot received from the leader is indexed in the same pass that imports it, off
//! the raft thread, so that installing it is a swap ([`KvStore::install_loaded`]). Only the
//! fields the index needs are read from each value (key, create revision, version, lease),
//! never the value itself.

use std::collections::BTreeMap;
use std::time::Instant;

use etcdrs_backend::{Backend, Bucket, ReadTx};

use super::index::Index;
use super::{META_CONSISTENT_INDEX, META_FINISHED_COMPACT, META_SCHEDULED_COMPACT, State};
use crate::key_index::KeyIndex;
use crate::lease::{LeaseId, LeaseRecord, Lessor, NO_LEASE};
use crate::revision::Revision;
use crate::{Error, Result};

#[cfg(doc)]
use super::KvStore;

/// Builds the key index from the `key` bucket's pairs, in key (revision) order.
///
/// The pairs' index fields are gathered end to end and sorted by key once at the end, and the
/// index built from the sorted run in one pass: a tree lookup per pair, as each revision
/// found its key's history, cost more than the rest of the load together (a million keys:
/// most of the time in key comparisons).
#[derive(Default)]
pub struct StoreLoader {
    /// The pairs' keys (the user's keys, not the revisions), end to end.
    keys: Vec<u8>,
    entries: Vec<Entry>,
    current_rev: i64,
}

/// One pair of the `key` bucket, as the index needs it.
struct Entry {
    /// Where its key is in `StoreLoader::keys`.
    key_at: usize,
    key_len: u32,
    tombstone: bool,
    rev: Revision,
    create_revision: i64,
    version: i64,
    lease: LeaseId,
}

/// A store's state read back from a backend, not yet in a store: the index, the revisions,
/// the leases. [`KvStore::install_loaded`] puts it in place.
pub struct LoadedStore {
    pub(super) state: State,
    /// A compaction scheduled but maybe not finished.
    pub(super) scheduled: i64,
    leases: Vec<LeaseRecord>,
    leases_of_keys: BTreeMap<Vec<u8>, LeaseId>,
}

impl LoadedStore {
    /// Keys the index holds.
    pub fn key_count(&self) -> usize {
        self.state.index.len()
    }

    /// The current revision.
    pub fn current_rev(&self) -> i64 {
        self.state.current_rev
    }

    /// Fill `lessor` (empty) with the leases and their keys, granted as of `now`.
    pub(super) fn fill(&self, lessor: &Lessor, now: Instant) {
        for record in &self.leases {
            lessor.insert(record.id, record.ttl, now);
            // As etcd's lessor recovers it: a persisted checkpoint stands until renewed.
            if record.remaining_ttl > 0 {
                lessor.checkpoint(record.id, record.remaining_ttl);
            }
        }
        for (key, lease) in &self.leases_of_keys {
            lessor.attach(*lease, key);
        }
    }
}

impl StoreLoader {
    /// An empty loader.
    pub fn new() -> Self {
        Self::default()
    }

    /// The next pair of the `key` bucket (its key in our revision encoding); pairs come in
    /// key order.
    pub fn push(&mut self, rev_key: &[u8], value: &[u8]) -> Result<()> {
        let Some((rev, tombstone)) = Revision::from_key(rev_key) else {
            return Err(Error::Corrupt("bad revision key".into()));
        };
        let fields = IndexFields::decode(value)?;
        let key_len = u32::try_from(fields.key.len())
            .map_err(|_| Error::Corrupt("key longer than 4 GiB".into()))?;
        self.current_rev = self.current_rev.max(rev.main);
        self.entries.push(Entry {
            key_at: self.keys.len(),
            key_len,
            tombstone,
            rev,
            create_revision: fields.create_revision,
            version: fields.version,
            lease: fields.lease,
        });
        self.keys.extend_from_slice(fields.key);
        Ok(())
    }

    /// The index and the keys attached to leases, from the pairs gathered: sorted by key
    /// (revision order kept within a key, the order they came in), then each key's history
    /// replayed in one run.
    ///
    /// The costly part of [`StoreLoader::finish`], and one that needs no backend: a caller
    /// feeding the loader from a thread of its own runs it there, while the pairs' writer
    /// makes its commit durable.
    pub fn build(self) -> BuiltIndex {
        let StoreLoader {
            keys,
            mut entries,
            current_rev,
        } = self;
        let key_of = |e: &Entry| &keys[e.key_at..e.key_at + e.key_len as usize];
        // Stable: a key's revisions stay in the order they came in, which is revision order.
        entries.sort_by(|a, b| key_of(a).cmp(key_of(b)));
        let mut index = Vec::new();
        let mut leases_of_keys = Vec::new();
        let mut at = 0;
        while at < entries.len() {
            let key = key_of(&entries[at]);
            let mut key_index = KeyIndex::default();
            let mut lease = NO_LEASE;
            while let Some(entry) = entries.get(at).filter(|e| key_of(e) == key) {
                if entry.tombstone {
                    key_index.restore_tombstone(entry.rev);
                    lease = NO_LEASE;
                } else {
                    key_index.restore(
                        entry.rev,
                        Revision::new(entry.create_revision, 0),
                        entry.version,
                    );
                    lease = entry.lease;
                }
                at += 1;
            }
            if lease != NO_LEASE {
                leases_of_keys.push((key.to_vec(), lease));
            }
            index.push((key.to_vec(), key_index));
        }
        // Both in key order without duplicates: built in bulk.
        BuiltIndex {
            index: index.into_iter().collect(),
            leases_of_keys: leases_of_keys.into_iter().collect(),
            current_rev,
        }
    }

    /// Every pair of `read`'s `key` bucket.
    fn push_all(&mut self, read: &ReadTx) -> Result<()> {
        read.try_for_each_in(Bucket::KEY, &[], None, |key, value| {
            self.push(key, value).map(|()| true)
        })
    }

    /// The state, once every pair of the `key` bucket is in; `read` gives the rest (`meta`
    /// and `lease`) and must see the backend the pairs came from.
    pub fn finish(self, read: &ReadTx) -> Result<LoadedStore> {
        self.build().finish(read)
    }
}

/// The key index built from every pair of a `key` bucket ([`StoreLoader::build`]), waiting
/// for the rest of the state.
pub struct BuiltIndex {
    index: BTreeMap<Vec<u8>, KeyIndex>,
    leases_of_keys: BTreeMap<Vec<u8>, LeaseId>,
    current_rev: i64,
}

impl BuiltIndex {
    /// The state: `read` gives the rest (`meta` and `lease`) and must see the backend the
    /// pairs came from.
    pub fn finish(self, read: &ReadTx) -> Result<LoadedStore> {
        let consistent_index = read_i64(read.get(Bucket::META, META_CONSISTENT_INDEX)?) as u64;
        let compact_rev = read_i64(read.get(Bucket::META, META_FINISHED_COMPACT)?);
        let scheduled = read_i64(read.get(Bucket::META, META_SCHEDULED_COMPACT)?);
        // A new store is at revision 1, so the first write is revision 2, as in etcd.
        let current_rev = self.current_rev.max(compact_rev).max(1);
        let mut leases = Vec::new();
        read.try_for_each_in(Bucket::LEASE, &[], None, |key, value| {
            let record = LeaseRecord::decode_stored(key, value)
                .ok_or_else(|| Error::Corrupt("bad lease record".into()))?;
            leases.push(record);
            Ok::<_, Error>(true)
        })?;
        tracing::debug!(
            current_rev,
            compact_rev,
            consistent_index,
            "restored mvcc store"
        );
        Ok(LoadedStore {
            state: State {
                index: Index::build(self.index, compact_rev),
                current_rev,
                compact_rev,
                consistent_index,
            },
            scheduled,
            leases,
            leases_of_keys: self.leases_of_keys,
        })
    }
}

/// Read the whole state back from `backend` (one read transaction).
pub fn load_store(backend: &Backend) -> Result<LoadedStore> {
    let read = backend.read()?;
    let mut loader = StoreLoader::new();
    loader.push_all(&read)?;
    loader.finish(&read)
}

fn read_i64(bytes: Option<Vec<u8>>) -> i64 {
    bytes
        .and_then(|b| <[u8; 8]>::try_from(b.as_slice()).ok())
        .map(i64::from_be_bytes)
        .unwrap_or(0)
}

/// The fields of a stored `mvccpb.KeyValue` that the index needs; the value is skipped.
#[derive(Debug, Default, PartialEq, Eq)]
struct IndexFields<'a> {
    key: &'a [u8],
    create_revision: i64,
    version: i64,
    lease: i64,
}

impl<'a> IndexFields<'a> {
    /// Decode `bytes` (protobuf wire format: key = 1, create_revision = 2, mod_revision = 3,
    /// version = 4, value = 5, lease = 6); a later occurrence of a field wins, as in prost.
    fn decode(bytes: &'a [u8]) -> Result<IndexFields<'a>> {
        let corrupt = |what: &str| Error::Corrupt(format!("key-value: {what}"));
        let mut fields = IndexFields::default();
        let mut at = 0;
        while at < bytes.len() {
            let tag = varint(bytes, &mut at).ok_or_else(|| corrupt("bad tag"))?;
            let (number, wire) = (tag >> 3, tag & 7);
            match wire {
                0 => {
                    let n = varint(bytes, &mut at).ok_or_else(|| corrupt("bad varint"))? as i64;
                    match number {
                        2 => fields.create_revision = n,
                        4 => fields.version = n,
                        6 => fields.lease = n,
                        _ => {}
                    }
                }
                2 => {
                    let len = varint(bytes, &mut at).ok_or_else(|| corrupt("bad length"))?;
                    let end = usize::try_from(len)
                        .ok()
                        .and_then(|len| at.checked_add(len))
                        .filter(|end| *end <= bytes.len())
                        .ok_or_else(|| corrupt("field past the end"))?;
                    if number == 1 {
                        fields.key = &bytes[at..end];
                    }
                    at = end;
                }
                1 => at = at.checked_add(8).ok_or_else(|| corrupt("bad fixed64"))?,
                5 => at = at.checked_add(4).ok_or_else(|| corrupt("bad fixed32"))?,
                _ => return Err(corrupt("unknown wire type")),
            }
        }
        if at > bytes.len() {
            return Err(corrupt("field past the end"));
        }
        Ok(fields)
    }
}

/// A base-128 varint at `*at`, advancing it.
fn varint(bytes: &[u8], at: &mut usize) -> Option<u64> {
    let mut value = 0u64;
    for shift in (0..64).step_by(7) {
        let byte = *bytes.get(*at)?;
        *at += 1;
        value |= u64::from(byte & 0x7f) << shift;
        if byte & 0x80 == 0 {
            return Some(value);
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::super::{KeyRange, KvStore};
    use super::*;
    use etcdrs_proto::mvccpb::KeyValue;
    use prost::Message;

    /// The state read back from a backend is the state the writes built: every key's
    /// history (puts, deletions, new generations, keys written many times in one and in
    /// several revisions) and the keys attached to leases, whatever order the keys and
    /// revisions came in.
    #[test]
    fn loading_rebuilds_the_state_the_writes_built() {
        let dir = tempfile::tempdir().unwrap();
        let store = KvStore::open(Backend::open(&dir.path().join("db")).unwrap(), 2).unwrap();
        let mut seed = 0x9e37_79b9_7f4a_7c15u64;
        let mut next = |n: u64| {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed % n
        };
        let mut batch = store.write().unwrap();
        batch.lease_grant(7, 100).unwrap();
        batch.lease_grant(8, 100).unwrap();
        batch.commit(false).unwrap();
        for _ in 0..400 {
            let mut batch = store.write().unwrap();
            let mut txn = batch.txn();
            for _ in 0..=next(3) {
                let key = format!("k{:03}", next(60)).into_bytes();
                match next(10) {
                    0..=1 => {
                        txn.delete_range(KeyRange::new(&key, b"")).unwrap();
                    }
                    2 => {
                        txn.put(&key, b"v", 7).unwrap();
                    }
                    3 => {
                        txn.put(&key, b"v", 8).unwrap();
                    }
                    _ => {
                        txn.put(&key, key.as_slice(), NO_LEASE).unwrap();
                    }
                }
            }
            txn.end();
            batch.commit(false).unwrap();
        }
        let loaded = load_store(store.backend()).unwrap();
        let live = store.state.read();
        let all = (std::ops::Bound::Unbounded, std::ops::Bound::Unbounded);
        let want: Vec<_> = live.index.range(all).collect();
        let got: Vec<_> = loaded.state.index.range(all).collect();
        assert_eq!(got.len(), want.len());
        assert_eq!(loaded.current_rev(), live.current_rev);
        // Every key as seen at every revision. A value records its create revision's main
        // part only, so a reloaded generation's creation has sub 0, as etcd's restore has.
        for ((got_key, got), (want_key, want)) in got.iter().zip(&want) {
            assert_eq!(got_key, want_key);
            for rev in 1..=live.current_rev {
                let view = |found: Option<crate::key_index::Found>| {
                    found.map(|f| (f.modified, f.created.main, f.version))
                };
                assert_eq!(
                    view(got.get(rev)),
                    view(want.get(rev)),
                    "{got_key:?} at {rev}"
                );
            }
        }
        let lessor = Lessor::new(2);
        loaded.fill(&lessor, Instant::now());
        for (key, _) in want {
            assert_eq!(
                lessor.lease_of(key),
                store.lessor().lease_of(key),
                "{key:?}"
            );
        }
        assert_eq!(
            lessor.get(7).unwrap().keys,
            store.lessor().get(7).unwrap().keys
        );
    }

    #[test]
    fn index_fields_match_prost() {
        let cases = [
            KeyValue::default(),
            KeyValue {
                key: b"k".to_vec(),
                ..KeyValue::default()
            },
            KeyValue {
                key: vec![0xff; 300],
                create_revision: 1 << 40,
                mod_revision: 7,
                version: 3,
                value: vec![9; 1000],
                lease: -5,
            },
            KeyValue {
                key: b"a/b".to_vec(),
                create_revision: 2,
                mod_revision: 2,
                version: 1,
                value: Vec::new(),
                lease: 0x1234_5678_9abc,
            },
        ];
        for kv in cases {
            let bytes = kv.encode_to_vec();
            let fields = IndexFields::decode(&bytes).unwrap();
            assert_eq!(fields.key, kv.key.as_slice());
            assert_eq!(fields.create_revision, kv.create_revision);
            assert_eq!(fields.version, kv.version);
            assert_eq!(fields.lease, kv.lease);
            // Cut short anywhere inside a field, it is refused rather than misread.
            for cut in 1..bytes.len() {
                if KeyValue::decode(&bytes[..cut]).is_err() {
                    assert!(IndexFields::decode(&bytes[..cut]).is_err(), "cut at {cut}");
                }
            }
        }
        assert!(IndexFields::decode(&[0x0f]).is_err());
    }
}
