//! The store's tests: revisions, versions and history; compaction surviving a restart;
//! leases attached and revoked in one revision.

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

/// A tombstone is stored as etcd stores it, `KeyValue { key }` alone (a snapshot etcd
/// restores must hash as etcd's own bucket), and its delete event still carries the
/// deletion's revision, read from the bucket key, also for a tombstone of an older build
/// that stored the revision in the value.
#[test]
fn tombstones_are_stored_as_etcd_stores_them() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path());
    let mut batch = store.write().unwrap();
    let mut txn = batch.txn();
    txn.put(b"a", b"1", 0).unwrap();
    txn.end();
    let mut txn = batch.txn();
    txn.delete_range(KeyRange::new(b"a", &[])).unwrap();
    txn.end();
    let (changes, _) = batch.commit(false).unwrap();
    let deleted = changes.last().and_then(|e| e.kv.clone()).unwrap();
    assert_eq!(
        (deleted.key.as_slice(), deleted.mod_revision),
        (&b"a"[..], 3)
    );

    let stored = store
        .backend()
        .read()
        .unwrap()
        .get(Bucket::KEY, &Revision::new(3, 0).to_key(true))
        .unwrap()
        .unwrap();
    let etcd_tombstone = KeyValue {
        key: b"a".to_vec(),
        ..KeyValue::default()
    };
    assert_eq!(stored, etcd_tombstone.encode_to_vec());

    // An older build's tombstone (with its revision in the value) reads the same.
    let tx = store.backend().write().unwrap();
    let older = KeyValue {
        key: b"b".to_vec(),
        mod_revision: 4,
        ..KeyValue::default()
    };
    let put = KeyValue {
        key: b"b".to_vec(),
        value: b"x".to_vec(),
        create_revision: 4,
        mod_revision: 4,
        version: 1,
        ..KeyValue::default()
    };
    tx.put(
        Bucket::KEY,
        &Revision::new(4, 0).to_key(false),
        &put.encode_to_vec(),
    )
    .unwrap();
    tx.put(
        Bucket::KEY,
        &Revision::new(5, 0).to_key(true),
        &older.encode_to_vec(),
    )
    .unwrap();
    tx.commit(true).unwrap();
    let events = store.events_between(1, 5).unwrap();
    let deletions: Vec<(Vec<u8>, i64)> = events
        .iter()
        .filter(|e| e.r#type == EventType::Delete as i32)
        .filter_map(|e| e.kv.as_ref().map(|kv| (kv.key.clone(), kv.mod_revision)))
        .collect();
    assert_eq!(deletions, vec![(b"a".to_vec(), 3), (b"b".to_vec(), 5)]);
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
