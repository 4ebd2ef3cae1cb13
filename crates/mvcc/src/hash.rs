//! Hashes of the store for consistency checks between members (etcd 3.4
//! `mvcc/kvstore.go` `HashByRev` and `Hash`), and the summary of a snapshot's database
//! (`etcdutl snapshot status`).
//!
//! # What `HashKV` hashes
//!
//! A CRC-32C ([`Crc32c`]) over the bucket name `key`, then, in revision order, every entry of
//! the `key` bucket with main revision `<= rev`, as its key bytes followed by its value bytes.
//! Entries at or below the compacted revision count only if compacting at `rev` would keep
//! them (the key's latest revision at `rev`, when that is not a deletion), unless compacting at
//! `rev` would keep nothing at all: etcd's rule, which makes the hash independent of whether a
//! compaction has finished on a member.
//!
//! The bytes are etcd's, not our on-disk ones, so a member of ours and an etcd member with the
//! same history report the same hash:
//!
//! - key: etcd's revision encoding, 8 bytes big-endian main, `_`, 8 bytes big-endian sub, and a
//!   trailing `t` for a deletion (we store 16 bytes without the `_`);
//! - value: the stored `mvccpb.KeyValue`; for a deletion, `KeyValue { key }` alone, as etcd
//!   writes tombstones (and as ours are stored; earlier builds also stored `mod_revision`).
//!
//! Every input is read from one backend read transaction, so the hash, the current revision
//! and the compacted revision describe the same commit.

use std::collections::HashMap;

use etcdrs_backend::crc32c::Crc32c;
use etcdrs_backend::{Backend, Bucket, ReadTx};
use etcdrs_proto::mvccpb::KeyValue;
use prost::Message;

use crate::kvstore::{META_CONSISTENT_INDEX, META_TERM};
use crate::revision::{REV_BYTES_LEN, Revision};
use crate::{Error, KvStore, Result};

/// `meta` key of the last finished compaction (written by the store's compaction).
const META_FINISHED_COMPACT: &[u8] = b"finishedCompactRev";
/// `meta` key of the last compaction applied, finished or not.
const META_SCHEDULED_COMPACT: &[u8] = b"scheduledCompactRev";
/// `meta` key of this member's id: differs between members, so [`KvStore::hash`] skips it.
const META_MEMBER_ID: &[u8] = b"memberID";

/// The answer to `HashKV`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KvHash {
    /// CRC-32C of the key space up to the requested revision.
    pub hash: u32,
    /// The revision the hash covers (the requested one, or the current one for 0).
    pub hash_revision: i64,
    /// The store's current revision when hashed.
    pub current_revision: i64,
    /// The compacted revision, `-1` when the store was never compacted (etcd's value).
    pub compact_revision: i64,
}

/// What `etcdutl snapshot status` reports about a database.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DbStatus {
    /// CRC-32C over every bucket, as [`ReadTx::hash`] with nothing ignored.
    pub hash: u32,
    /// Main revision of the last entry of the `key` bucket (0 when empty).
    pub revision: i64,
    /// Pairs over every bucket.
    pub total_key: u64,
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

/// etcd's encoding of a `key` bucket key (see the module docs).
fn etcd_rev_key(rev: Revision, tombstone: bool) -> Vec<u8> {
    let mut key = Vec::with_capacity(REV_BYTES_LEN + 2);
    key.extend_from_slice(&(rev.main as u64).to_be_bytes());
    key.push(b'_');
    key.extend_from_slice(&(rev.sub as u64).to_be_bytes());
    if tombstone {
        key.push(b't');
    }
    key
}

/// Visit every `key` bucket entry with main revision `<= upto` in revision order, decoded.
fn for_each_rev(
    read: &ReadTx,
    upto: i64,
    mut visit: impl FnMut(Revision, bool, &[u8]) -> Result<()>,
) -> Result<()> {
    let end = Revision::new(upto.saturating_add(1), 0).to_bytes();
    read.try_for_each_in(Bucket::KEY, &[], Some(&end), |key, value| {
        let (rev, tombstone) =
            Revision::from_key(key).ok_or_else(|| Error::Corrupt("bad revision key".into()))?;
        visit(rev, tombstone, value).map(|()| true)
    })
}

/// The current and compacted revisions (0: never compacted) as of `read`, computed the way
/// [`KvStore::open`] does: the compacted revision is the last one applied, finished or not
/// (etcd's `compactMainRev`), so that a member whose compaction is midway hashes and refuses
/// as one whose compaction is done.
fn revisions(read: &ReadTx) -> Result<(i64, i64)> {
    let compact_rev = read_i64(read.get(Bucket::META, META_FINISHED_COMPACT)?)
        .max(read_i64(read.get(Bucket::META, META_SCHEDULED_COMPACT)?));
    let last_rev = match read.last(Bucket::KEY)? {
        Some((key, _)) => Revision::from_key(&key)
            .map(|(rev, _)| rev.main)
            .ok_or_else(|| Error::Corrupt("bad revision key".into()))?,
        None => 0,
    };
    Ok((last_rev.max(compact_rev).max(1), compact_rev))
}

/// `HashKV` as of `read` at `rev` (`<= 0`: the current revision).
fn hash_kv(read: ReadTx, rev: i64) -> Result<KvHash> {
    let (current_rev, compact_rev) = revisions(&read)?;
    if rev > 0 && rev <= compact_rev {
        return Err(Error::Compacted {
            requested: rev,
            compacted: compact_rev,
        });
    }
    if rev > current_rev {
        return Err(Error::FutureRevision {
            requested: rev,
            current: current_rev,
        });
    }
    let rev = if rev <= 0 { current_rev } else { rev };

    // The revisions a compaction at `rev` keeps, needed only for entries at or below the
    // compacted revision: each key's latest revision at `rev`, when it is not a deletion.
    let mut latest: HashMap<Vec<u8>, (Revision, bool)> = HashMap::new();
    if compact_rev > 0 {
        for_each_rev(&read, rev, |revision, tombstone, value| {
            let kv = decode_kv(value)?;
            latest.insert(kv.key, (revision, tombstone));
            Ok(())
        })?;
    }
    let keep_any = latest.values().any(|(_, tombstone)| !tombstone);

    let mut crc = Crc32c::new();
    crc.update(Bucket::KEY.name().as_bytes());
    for_each_rev(&read, rev, |revision, tombstone, value| {
        let kv = if revision.main <= compact_rev || tombstone {
            Some(decode_kv(value)?)
        } else {
            None
        };
        if revision.main <= compact_rev && keep_any {
            let kept = kv
                .as_ref()
                .and_then(|kv| latest.get(&kv.key))
                .is_some_and(|&(r, t)| r == revision && !t);
            if !kept {
                return Ok(());
            }
        }
        crc.update(&etcd_rev_key(revision, tombstone));
        match kv {
            Some(kv) if tombstone => {
                let etcd_tombstone = KeyValue {
                    key: kv.key,
                    ..KeyValue::default()
                };
                crc.update(&etcd_tombstone.encode_to_vec());
            }
            _ => crc.update(value),
        }
        Ok(())
    })?;
    Ok(KvHash {
        hash: crc.sum(),
        hash_revision: rev,
        current_revision: current_rev,
        compact_revision: if compact_rev == 0 { -1 } else { compact_rev },
    })
}

/// `etcdutl snapshot status` over the database `backend`.
pub fn db_status(backend: &Backend) -> Result<DbStatus> {
    let read = backend.read()?;
    let revision = match read.last(Bucket::KEY)? {
        Some((key, _)) => Revision::from_key(&key).map_or(0, |(rev, _)| rev.main),
        None => 0,
    };
    Ok(DbStatus {
        hash: read.hash(&[])?,
        revision,
        total_key: read.total_len()?,
    })
}

impl KvStore {
    /// `HashKV`: the key space up to `rev` (`<= 0`: current). See the module docs.
    pub fn hash_kv(&self, rev: i64) -> Result<KvHash> {
        let _timer = crate::metrics::HASH_REV_SECONDS.start_timer();
        hash_kv(self.read_committed()?, rev)
    }

    /// `Hash`: CRC-32C of every bucket of the backend (etcd's `backend.Hash`), leaving out the
    /// `meta` entries that legitimately differ between members with the same data: the
    /// consistent index and term (as etcd) and the member id (etcd keeps it in the WAL).
    /// Returns the hash and the current revision.
    pub fn hash(&self) -> Result<(u32, i64)> {
        let _timer = crate::metrics::HASH_SECONDS.start_timer();
        let read = self.read_committed()?;
        let (current_rev, _) = revisions(&read)?;
        let hash = read.hash(&[
            (Bucket::META, META_CONSISTENT_INDEX),
            (Bucket::META, META_TERM),
            (Bucket::META, META_MEMBER_ID),
        ])?;
        Ok((hash, current_rev))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kvstore::KeyRange;

    fn open(dir: &std::path::Path, name: &str) -> KvStore {
        KvStore::open(Backend::open(&dir.join(name)).unwrap(), 2).unwrap()
    }

    fn put(store: &KvStore, key: &str, value: &str) {
        let mut batch = store.write().unwrap();
        let mut txn = batch.txn();
        txn.put(key.as_bytes(), value.as_bytes(), 0).unwrap();
        txn.end();
        batch.commit(false).unwrap();
    }

    fn delete(store: &KvStore, key: &str) {
        let mut batch = store.write().unwrap();
        let mut txn = batch.txn();
        txn.delete_range(KeyRange::new(key.as_bytes(), &[]))
            .unwrap();
        txn.end();
        batch.commit(false).unwrap();
    }

    fn compact(store: &KvStore, rev: i64) {
        let mut batch = store.write().unwrap();
        batch.compact(rev).unwrap();
        batch.commit(false).unwrap();
    }

    #[test]
    fn equal_histories_hash_equal_and_match_etcd() {
        let dir = tempfile::tempdir().unwrap();
        let one = open(dir.path(), "one");
        let two = open(dir.path(), "two");
        // etcd 3.4: an empty key space hashes to crc32c("key").
        assert_eq!(one.hash_kv(0).unwrap().hash, 1_084_519_789);
        for store in [&one, &two] {
            put(store, "a", "b");
            put(store, "c", "d");
        }
        let h1 = one.hash_kv(0).unwrap();
        assert_eq!(h1, two.hash_kv(0).unwrap());
        // The same two puts on a fresh etcd 3.4.23 (`etcdctl endpoint hashkv`).
        assert_eq!(h1.hash, 3_424_965_703);
        assert_eq!(h1.current_revision, 3);
        assert_eq!(h1.compact_revision, -1);
        // At revision 1 there is nothing but the bucket name.
        assert_eq!(one.hash_kv(1).unwrap().hash, 1_084_519_789);

        put(&two, "c", "other");
        assert_ne!(one.hash_kv(0).unwrap().hash, two.hash_kv(0).unwrap().hash);
        // Up to revision 3 the histories are still the same.
        assert_eq!(one.hash_kv(3).unwrap().hash, two.hash_kv(3).unwrap().hash);
    }

    #[test]
    fn revision_errors_as_etcd() {
        let dir = tempfile::tempdir().unwrap();
        let store = open(dir.path(), "db");
        for i in 0..4 {
            put(&store, "k", &i.to_string());
        }
        assert!(matches!(
            store.hash_kv(6),
            Err(Error::FutureRevision {
                requested: 6,
                current: 5
            })
        ));
        compact(&store, 3);
        // etcd refuses the compacted revision itself, too.
        for rev in [1, 3] {
            assert!(matches!(
                store.hash_kv(rev),
                Err(Error::Compacted { compacted: 3, .. })
            ));
        }
        let h = store.hash_kv(4).unwrap();
        assert_eq!(h.compact_revision, 3);
        assert_eq!(h.current_revision, 5);
        assert_eq!(h.hash_revision, 4);
        assert_eq!(store.hash_kv(0).unwrap().hash_revision, 5);
    }

    /// The expected values were read from etcd 3.4.23 with `etcdctl endpoint hashkv --rev`
    /// after the same requests on a fresh member (puts, a delete, then `compact 5`).
    #[test]
    fn hashes_around_compaction_match_etcd() {
        let dir = tempfile::tempdir().unwrap();
        let store = open(dir.path(), "db");
        put(&store, "a", "1"); // 2
        put(&store, "b", "1"); // 3
        put(&store, "a", "2"); // 4
        delete(&store, "b"); // 5
        put(&store, "c", "1"); // 6
        put(&store, "a", "3"); // 7
        let etcd_before = [
            (0, 4_186_052_070),
            (5, 1_416_966_122),
            (6, 3_076_932_441),
            (7, 4_186_052_070),
        ];
        for (rev, hash) in etcd_before {
            assert_eq!(store.hash_kv(rev).unwrap().hash, hash, "rev {rev}");
        }
        compact(&store, 5);
        let etcd_after = [(0, 643_951_048), (6, 709_067_906), (7, 643_951_048)];
        for (rev, hash) in etcd_after {
            let h = store.hash_kv(rev).unwrap();
            assert_eq!(h.hash, hash, "rev {rev}");
            assert_eq!((h.current_revision, h.compact_revision), (7, 5));
        }
        // The same after a restart (the index is rebuilt; the bucket is what counts).
        drop(store);
        let store = open(dir.path(), "db");
        assert_eq!(store.hash_kv(6).unwrap().hash, 709_067_906);
    }

    #[test]
    fn db_status_counts_every_bucket() {
        let dir = tempfile::tempdir().unwrap();
        let store = open(dir.path(), "db");
        put(&store, "a", "1");
        put(&store, "b", "2");
        let status = db_status(store.backend()).unwrap();
        assert_eq!(status.revision, 3);
        assert_eq!(status.total_key, 2);
        assert_eq!(
            status.hash,
            store.backend().read().unwrap().hash(&[]).unwrap()
        );
        let (hash, rev) = store.hash().unwrap();
        assert_eq!(rev, 3);
        // Only ignored meta keys differ, so the hashes agree here.
        assert_eq!(hash, status.hash);
    }
}
