//! etcd's database layout, both ways: our backend's buckets written out as the bbolt file etcd
//! keeps in `member/snap/db` (what `Maintenance.Snapshot` streams, so that `etcdctl snapshot
//! status|restore` and etcd itself can use it), and such a file read back into our backend
//! (`etcd snapshot restore` of an etcd snapshot, and the conversion of an etcd data directory).
//!
//! Our backend keeps etcd's bucket names and most of its encodings; where it does not, this
//! module is the one place that translates (etcd 3.4 `mvcc/`, `lease/`, `auth/store.go`,
//! `etcdserver/api/membership/store.go`; 3.5 `server/storage/schema`):
//!
//! | bucket            | etcd's file                                    | our backend                        |
//! |-------------------|------------------------------------------------|------------------------------------|
//! | `key`             | 8-byte main, `_`, 8-byte sub (+ `t`)           | 8-byte main, 8-byte sub (+ `t`)    |
//! | `meta` compaction | `finishedCompactRev`/`scheduledCompactRev` as a 17-byte revision | 8-byte big-endian |
//! | `meta` conf state | `confState`, JSON (3.5)                        | `confState`, raft protobuf         |
//! | `meta` ids        | (none: the WAL holds them)                     | `memberID`, `clusterID`            |
//! | `lease`           | `leasepb.Lease {ID, TTL, RemainingTTL}`        | the same (older: the bare TTL)     |
//! | `auth`            | `authEnabled`, `authRevision`                  | `enabled`, `revision`              |
//! | users, roles      | buckets `authUsers`, `authRoles`, by name      | `auth`, keys `user/…`, `role/…`    |
//! | `members`         | hex id → etcd's member JSON                    | big-endian id → member JSON        |
//! | `members_removed` | hex id → `removed`                             | big-endian id → `removed`          |
//! | `alarm`           | encoded `AlarmMember` → empty                  | member id + alarm → `AlarmMember`  |
//! | `cluster`         | `clusterVersion` → e.g. `3.5.0`                | (not kept: computed)               |
//!
//! Values of the `key` bucket (`mvccpb.KeyValue`; a tombstone is `KeyValue { key }` alone, and
//! the export rewrites older etcd-rs tombstones that also carried the deletion's revision),
//! `consistent_index`, `term` and the auth records (`authpb.User`, `authpb.Role`, bcrypt
//! hashes) are the same bytes on both sides, so `HashKV` over either is the same.
//!
//! **Invariant:** export reads one read transaction, so the file is one consistent commit;
//! import writes into a database nothing else has open, and refuses (naming what is wrong)
//! anything it cannot translate rather than skipping it.

use std::io::{Seek, Write};

use etcdrs_backend::{Backend, Bucket, ReadTx};
pub use etcdrs_bolt::Db;
use etcdrs_bolt::Writer;
use etcdrs_mvcc::LeaseRecord;
use etcdrs_proto::etcdserverpb::AlarmMember;
use etcdrs_proto::mvccpb::KeyValue;
use prost::Message;
use serde::{Deserialize, Serialize};

use crate::conf_state::{ConfState, decode_conf_state, encode_conf_state};
use crate::error::{Error, Result};
use crate::keys::{
    AUTH_ENABLED, AUTH_REVISION, AUTH_ROLE_PREFIX, AUTH_USER_PREFIX, META_CLUSTER_VERSION,
    META_DOWNGRADE, alarm_key,
};
use crate::membership::{Member, id_hex};

/// etcd's bucket names as they appear in its file, in bbolt's (byte) order.
mod names {
    pub const ALARM: &[u8] = b"alarm";
    pub const AUTH: &[u8] = b"auth";
    pub const AUTH_ROLES: &[u8] = b"authRoles";
    pub const AUTH_USERS: &[u8] = b"authUsers";
    pub const CLUSTER: &[u8] = b"cluster";
    pub const KEY: &[u8] = b"key";
    pub const LEASE: &[u8] = b"lease";
    pub const MEMBERS: &[u8] = b"members";
    pub const MEMBERS_REMOVED: &[u8] = b"members_removed";
    pub const META: &[u8] = b"meta";
}

/// etcd's `meta`, `auth` and `cluster` keys.
const ETCD_AUTH_ENABLED: &[u8] = b"authEnabled";
const ETCD_AUTH_REVISION: &[u8] = b"authRevision";
const ETCD_CLUSTER_VERSION: &[u8] = b"clusterVersion";
/// etcd 3.5's key of the downgrade record in the `cluster` bucket.
const ETCD_DOWNGRADE: &[u8] = b"downgrade";
const META_FINISHED_COMPACT: &[u8] = b"finishedCompactRev";
const META_SCHEDULED_COMPACT: &[u8] = b"scheduledCompactRev";
const META_CONF_STATE: &[u8] = etcdrs_mvcc::META_CONF_STATE;
/// Ours only: etcd keeps the ids in its WAL.
const META_OURS_ONLY: [&[u8]; 2] = [b"memberID", b"clusterID"];

/// Length of etcd's revision bytes: main, `_`, sub.
const ETCD_REV_LEN: usize = 17;
/// Bytes the import writes before it commits (without fsync) and starts the next transaction.
const IMPORT_COMMIT_BYTES: u64 = 16 << 20;

/// raftpb.ConfState as etcd 3.5 marshals it to JSON in `meta`.
#[derive(Serialize, Deserialize, Default)]
struct ConfStateJson {
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    voters: Vec<u64>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    learners: Vec<u64>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    voters_outgoing: Vec<u64>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    learners_next: Vec<u64>,
    #[serde(default)]
    auto_leave: bool,
}

fn format_error(what: impl std::fmt::Display) -> Error {
    Error::EtcdDb(what.to_string())
}

/// Our `key` bucket key as etcd's.
fn etcd_rev_key(ours: &[u8]) -> Result<Vec<u8>> {
    if ours.len() != 16 && !(ours.len() == 17 && ours[16] == b't') {
        return Err(format_error(format!("bad revision key {ours:?}")));
    }
    let mut key = Vec::with_capacity(ours.len() + 1);
    key.extend_from_slice(&ours[..8]);
    key.push(b'_');
    key.extend_from_slice(&ours[8..]);
    Ok(key)
}

/// etcd's `key` bucket key as ours.
fn our_rev_key(etcd: &[u8]) -> Result<Vec<u8>> {
    let tombstone = match etcd.len() {
        ETCD_REV_LEN => false,
        18 if etcd[17] == b't' => true,
        _ => {
            return Err(format_error(format!(
                "bad revision key {etcd:?} in bucket key"
            )));
        }
    };
    if etcd[8] != b'_' {
        return Err(format_error(format!(
            "bad revision key {etcd:?} in bucket key"
        )));
    }
    let mut key = Vec::with_capacity(17);
    key.extend_from_slice(&etcd[..8]);
    key.extend_from_slice(&etcd[9..17]);
    if tombstone {
        key.push(b't');
    }
    Ok(key)
}

/// A tombstone's value as etcd writes it, `KeyValue { key }` alone. Earlier etcd-rs builds
/// also stored the deletion's revision in it, and etcd's `HashKV` over a file restored from
/// such a backend counted those bytes: the same history hashed differently on the two sides.
fn etcd_tombstone(ours: &[u8]) -> Result<Vec<u8>> {
    let kv = KeyValue::decode(ours).map_err(|e| format_error(format!("bad tombstone: {e}")))?;
    Ok(KeyValue {
        key: kv.key,
        ..KeyValue::default()
    }
    .encode_to_vec())
}

/// A main revision as etcd's 17 revision bytes (sub 0).
fn etcd_rev_bytes(main: i64) -> Vec<u8> {
    let mut bytes = Vec::with_capacity(ETCD_REV_LEN);
    bytes.extend_from_slice(&main.to_be_bytes());
    bytes.push(b'_');
    bytes.extend_from_slice(&0u64.to_be_bytes());
    bytes
}

/// The main revision of etcd's 17 revision bytes.
fn etcd_rev_main(bytes: &[u8]) -> Option<i64> {
    if bytes.len() != ETCD_REV_LEN || bytes[8] != b'_' {
        return None;
    }
    <[u8; 8]>::try_from(&bytes[..8])
        .ok()
        .map(i64::from_be_bytes)
}

fn be_u64(bytes: &[u8], what: &str) -> Result<u64> {
    <[u8; 8]>::try_from(bytes)
        .map(u64::from_be_bytes)
        .map_err(|_| format_error(format!("bad {what}: {bytes:?}")))
}

fn hex_id(hex: &[u8], what: &str) -> Result<u64> {
    std::str::from_utf8(hex)
        .ok()
        .and_then(|s| u64::from_str_radix(s, 16).ok())
        .ok_or_else(|| format_error(format!("bad member id {hex:?} in bucket {what}")))
}

/// Every pair of one of our buckets, in key order.
fn collect(read: &ReadTx, bucket: Bucket) -> Result<Vec<(Vec<u8>, Vec<u8>)>> {
    let mut pairs = Vec::new();
    read.for_each_in(bucket, &[], None, |k, v| {
        pairs.push((k.to_vec(), v.to_vec()));
        true
    })?;
    Ok(pairs)
}

/// Write `pairs` (any order) as the next bucket.
fn put_sorted<W: Write + Seek>(
    out: &mut Writer<W>,
    name: &[u8],
    mut pairs: Vec<(Vec<u8>, Vec<u8>)>,
) -> Result<()> {
    pairs.sort();
    out.bucket(name)?;
    for (k, v) in &pairs {
        out.put(k, v)?;
    }
    Ok(())
}

/// Lay out what `read` sees as etcd's database file in `out`; returns the file's length.
pub fn export<W: Write + Seek>(read: &ReadTx, out: W) -> Result<(W, u64)> {
    let mut out = Writer::new(out)?;

    let alarms = collect(read, Bucket::ALARM)?
        .into_iter()
        .map(|(_, member)| (member, Vec::new()))
        .collect();
    put_sorted(&mut out, names::ALARM, alarms)?;

    let (mut auth, mut users, mut roles) = (Vec::new(), Vec::new(), Vec::new());
    for (key, value) in collect(read, Bucket::AUTH)? {
        if key == AUTH_ENABLED {
            auth.push((ETCD_AUTH_ENABLED.to_vec(), value));
        } else if key == AUTH_REVISION {
            auth.push((ETCD_AUTH_REVISION.to_vec(), value));
        } else if let Some(name) = key.strip_prefix(AUTH_USER_PREFIX) {
            users.push((name.to_vec(), value));
        } else if let Some(name) = key.strip_prefix(AUTH_ROLE_PREFIX) {
            roles.push((name.to_vec(), value));
        }
    }
    put_sorted(&mut out, names::AUTH, auth)?;
    put_sorted(&mut out, names::AUTH_ROLES, roles)?;
    put_sorted(&mut out, names::AUTH_USERS, users)?;
    // The cluster version as applied (an etcd 3.4 cluster's stays 3.4.0), none before one is
    // decided; a downgrade under way, as etcd 3.5 records it.
    let mut cluster = Vec::new();
    if let Some(version) = read
        .get(Bucket::META, META_CLUSTER_VERSION)
        .map_err(|e| format_error(format!("read cluster version: {e}")))?
    {
        cluster.push((ETCD_CLUSTER_VERSION.to_vec(), version));
    }
    if let Some(info) = read
        .get(Bucket::META, META_DOWNGRADE)
        .map_err(|e| format_error(format!("read downgrade: {e}")))?
    {
        cluster.push((ETCD_DOWNGRADE.to_vec(), info));
    }
    put_sorted(&mut out, names::CLUSTER, cluster)?;

    // The big one, streamed: the translation keeps the order.
    out.bucket(names::KEY)?;
    read.try_for_each_in(Bucket::KEY, &[], None, |k, v| {
        let key = etcd_rev_key(k)?;
        if key.len() == ETCD_REV_LEN + 1 {
            out.put(&key, &etcd_tombstone(v)?)?;
        } else {
            out.put(&key, v)?;
        }
        Ok::<_, Error>(true)
    })?;

    let mut leases = Vec::new();
    for (key, value) in collect(read, Bucket::LEASE)? {
        let record = LeaseRecord::decode_stored(&key, &value)
            .ok_or_else(|| format_error(format!("bad lease record {key:?}")))?;
        leases.push((key, record.encode_to_vec()));
    }
    put_sorted(&mut out, names::LEASE, leases)?;

    let mut members = Vec::new();
    for (_, value) in collect(read, Bucket::MEMBERS)? {
        // `membership::Member` is etcd's encoding of `membership.Member` already; decoding and
        // encoding again writes it in Go's field order whatever the stored bytes were.
        let member: Member = serde_json::from_slice(&value).map_err(format_error)?;
        let json = serde_json::to_vec(&member).map_err(format_error)?;
        members.push((id_hex(member.id).into_bytes(), json));
    }
    put_sorted(&mut out, names::MEMBERS, members)?;
    let mut removed = Vec::new();
    for (key, value) in collect(read, Bucket::MEMBERS_REMOVED)? {
        let id = be_u64(&key, "removed member id")?;
        removed.push((id_hex(id).into_bytes(), value));
    }
    put_sorted(&mut out, names::MEMBERS_REMOVED, removed)?;

    let mut meta = Vec::new();
    for (key, value) in collect(read, Bucket::META)? {
        if META_OURS_ONLY.contains(&key.as_slice()) {
            continue;
        }
        let value = if key == META_FINISHED_COMPACT || key == META_SCHEDULED_COMPACT {
            etcd_rev_bytes(be_u64(&value, "compaction revision")? as i64)
        } else if key == META_CONF_STATE {
            let state = decode_conf_state(&value)
                .ok_or_else(|| format_error("bad conf state in bucket meta"))?;
            serde_json::to_vec(&ConfStateJson {
                voters: state.voters,
                learners: state.learners,
                voters_outgoing: state.voters_outgoing,
                learners_next: state.learners_next,
                auto_leave: state.auto_leave,
            })
            .map_err(format_error)?
        } else {
            value
        };
        meta.push((key, value));
    }
    put_sorted(&mut out, names::META, meta)?;
    Ok(out.finish()?)
}

/// etcd's database file `db` copied bucket by bucket, in order, into a fresh compact bbolt
/// file in `out` (etcd's defragmentation, as `etcdutl defrag` runs it on a stopped member's
/// file); returns the new file's length. Nothing is translated: the copy is etcd's file.
pub fn copy_compact<W: Write + Seek>(db: &Db, out: W) -> Result<(W, u64)> {
    let mut out = Writer::new(out)?;
    for name in db.bucket_names()? {
        out.bucket(&name)?;
        db.for_each(&name, |key: &[u8], value: &[u8]| -> Result<()> {
            Ok(out.put(key, value)?)
        })?;
    }
    Ok(out.finish()?)
}

/// What [`import`] read.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Imported {
    /// Entries of the `key` bucket.
    pub revisions: u64,
    /// Leases.
    pub leases: u64,
    /// Members of the file's `members` bucket, in id order.
    pub members: Vec<Member>,
    /// Its consistent index (0 when it has none).
    pub consistent_index: u64,
    /// The cluster version it records, if any.
    pub cluster_version: Option<String>,
    /// Its downgrade record (etcd's `DowngradeInfo` JSON), if any.
    pub downgrade: Option<Vec<u8>>,
}

/// Writes into the backend, committing every [`IMPORT_COMMIT_BYTES`].
struct Importer<'a> {
    backend: &'a Backend,
    tx: Option<etcdrs_backend::WriteTx<'a>>,
    pending: u64,
}

impl<'a> Importer<'a> {
    fn put(&mut self, bucket: Bucket, key: &[u8], value: &[u8]) -> Result<()> {
        if self.tx.is_none() {
            self.tx = Some(self.backend.write()?);
        }
        if let Some(tx) = &self.tx {
            tx.put(bucket, key, value)?;
        }
        self.pending += (key.len() + value.len()) as u64;
        if self.pending >= IMPORT_COMMIT_BYTES {
            self.commit(false)?;
        }
        Ok(())
    }

    fn commit(&mut self, durable: bool) -> Result<()> {
        self.pending = 0;
        match self.tx.take() {
            Some(tx) => tx.commit(durable).map(|_| ()).map_err(Error::from),
            None if durable => self
                .backend
                .write()
                .and_then(|tx| tx.commit(true))
                .map(|_| ())
                .map_err(Error::from),
            None => Ok(()),
        }
    }
}

/// Read etcd's database file `db` into `backend` (a new, empty one), translating every bucket
/// (module docs). Buckets etcd-rs has no use for (`cluster`) are read but not kept; a bucket
/// this module does not know is an error, so nothing is silently lost.
pub fn import(db: &Db, backend: &Backend) -> Result<Imported> {
    import_with(db, backend, |_, _| Ok(()))
}

/// As [`import`], showing each pair of the `key` bucket to `on_key` as it is written (in our
/// encoding, in key order): how a received snapshot's index is built in the same pass
/// (`etcdrs_mvcc::StoreLoader`).
pub fn import_with(
    db: &Db,
    backend: &Backend,
    mut on_key: impl FnMut(&[u8], &[u8]) -> Result<()>,
) -> Result<Imported> {
    let mut imported = Imported::default();
    let mut out = Importer {
        backend,
        tx: None,
        pending: 0,
    };
    for name in db.bucket_names()? {
        let bucket_name = String::from_utf8_lossy(&name).into_owned();
        let result = db.for_each(&name, |key: &[u8], value: &[u8]| -> Result<()> {
            match name.as_slice() {
                names::KEY => {
                    imported.revisions += 1;
                    let ours = our_rev_key(key)?;
                    on_key(&ours, value)?;
                    out.put(Bucket::KEY, &ours, value)
                }
                names::META => {
                    if key == META_FINISHED_COMPACT || key == META_SCHEDULED_COMPACT {
                        let main = etcd_rev_main(value).ok_or_else(|| {
                            format_error(format!("bad {} in bucket meta", bucket_key(key)))
                        })?;
                        out.put(Bucket::META, key, &main.to_be_bytes())
                    } else if key == META_CONF_STATE {
                        let json: ConfStateJson =
                            serde_json::from_slice(value).map_err(format_error)?;
                        let state = ConfState {
                            voters: json.voters,
                            learners: json.learners,
                            voters_outgoing: json.voters_outgoing,
                            learners_next: json.learners_next,
                            auto_leave: json.auto_leave,
                            ..Default::default()
                        };
                        out.put(Bucket::META, key, &encode_conf_state(&state))
                    } else {
                        if key == etcdrs_mvcc::META_CONSISTENT_INDEX {
                            imported.consistent_index = be_u64(value, "consistent index")?;
                        }
                        out.put(Bucket::META, key, value)
                    }
                }
                names::LEASE => {
                    let record = LeaseRecord::decode(value)
                        .map_err(|e| format_error(format!("bad lease {key:?}: {e}")))?;
                    if key != record.id.to_be_bytes() {
                        return Err(format_error(format!(
                            "lease {key:?} holds lease {:x}",
                            record.id
                        )));
                    }
                    imported.leases += 1;
                    // etcd's record is ours: the remaining TTL of a persisted checkpoint
                    // comes along.
                    out.put(Bucket::LEASE, key, value)
                }
                names::AUTH => {
                    if key == ETCD_AUTH_ENABLED {
                        out.put(Bucket::AUTH, AUTH_ENABLED, value)
                    } else if key == ETCD_AUTH_REVISION {
                        out.put(Bucket::AUTH, AUTH_REVISION, value)
                    } else {
                        Err(format_error(format!(
                            "unknown key {} in bucket auth",
                            bucket_key(key)
                        )))
                    }
                }
                names::AUTH_USERS => {
                    let key = [AUTH_USER_PREFIX, key].concat();
                    out.put(Bucket::AUTH, &key, value)
                }
                names::AUTH_ROLES => {
                    let key = [AUTH_ROLE_PREFIX, key].concat();
                    out.put(Bucket::AUTH, &key, value)
                }
                names::MEMBERS => {
                    let id = hex_id(key, "members")?;
                    let member: Member = serde_json::from_slice(value)
                        .map_err(|e| format_error(format!("bad member {id:x}: {e}")))?;
                    let json = serde_json::to_vec(&member).map_err(format_error)?;
                    imported.members.push(member);
                    out.put(Bucket::MEMBERS, &id.to_be_bytes(), &json)
                }
                names::MEMBERS_REMOVED => {
                    let id = hex_id(key, "members_removed")?;
                    out.put(Bucket::MEMBERS_REMOVED, &id.to_be_bytes(), b"removed")
                }
                names::ALARM => {
                    let alarm = AlarmMember::decode(key)
                        .map_err(|e| format_error(format!("bad alarm {key:?}: {e}")))?;
                    let ours = alarm_key(alarm.member_id, alarm.alarm);
                    out.put(Bucket::ALARM, &ours, key)
                }
                names::CLUSTER => {
                    if key == ETCD_CLUSTER_VERSION {
                        imported.cluster_version = Some(String::from_utf8_lossy(value).into());
                    } else if key == ETCD_DOWNGRADE {
                        imported.downgrade = Some(value.to_vec());
                    }
                    Ok(())
                }
                _ => Err(format_error(format!(
                    "unknown bucket {bucket_name:?}: etcd-rs does not know how to keep it"
                ))),
            }
        });
        result?;
    }
    out.commit(true)?;
    imported.members.sort_by_key(|m| m.id);
    Ok(imported)
}

/// A key for an error message: text when it is text.
fn bucket_key(key: &[u8]) -> String {
    match std::str::from_utf8(key) {
        Ok(text) => format!("{text:?}"),
        Err(_) => format!("{key:?}"),
    }
}

/// Our snapshot of `backend` in etcd's layout, in a temporary file (see
/// [`Backend::snapshot_with`]).
///
/// The file is only what the image is streamed from (to a client or a peer) and goes with
/// the stream, or at the next start if the member stops first: it is not synced.
pub fn snapshot(backend: &Backend) -> Result<etcdrs_backend::Snapshot> {
    backend.snapshot_with(|read, file| {
        let (file, len) = export(read, std::io::BufWriter::with_capacity(IMAGE_BUFFER, file))?;
        file.into_inner()
            .map_err(|e| format_error(format!("write snapshot: {e}")))?;
        Ok(len)
    })
}

/// The buffer the image is written and read back through: a system call per MiB.
pub const IMAGE_BUFFER: usize = 1 << 20;

/// The consistent index etcd's database file `db` records (0 when none).
pub fn consistent_index(db: &Db) -> Result<u64> {
    match db.get(names::META, etcdrs_mvcc::META_CONSISTENT_INDEX)? {
        Some(value) => be_u64(&value, "consistent index"),
        None => Ok(0),
    }
}

/// What `etcdctl snapshot status` reports for etcd's database file `db` (etcd's
/// `snapshot.Status`): a CRC-32C over every bucket's name followed by its keys and values, in
/// order; the main revision of the `key` bucket's last key; and the pairs in all.
pub fn status(db: &Db) -> Result<etcdrs_mvcc::hash::DbStatus> {
    let mut crc = etcdrs_backend::crc32c::Crc32c::new();
    let mut revision = 0;
    let mut total_key = 0;
    for name in db.bucket_names()? {
        crc.update(&name);
        let is_key = name == names::KEY;
        db.for_each(&name, |key: &[u8], value: &[u8]| -> Result<()> {
            crc.update(key);
            crc.update(value);
            if is_key && let Some(main) = key.get(..8).and_then(|b| <[u8; 8]>::try_from(b).ok()) {
                revision = i64::from_be_bytes(main);
            }
            total_key += 1;
            Ok(())
        })?;
    }
    Ok(etcdrs_mvcc::hash::DbStatus {
        hash: crc.sum(),
        revision,
        total_key,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn revision_keys_translate_both_ways() {
        let ours = etcdrs_mvcc::Revision::new(0x0102, 3).to_key(false);
        let etcd = etcd_rev_key(&ours).unwrap();
        assert_eq!(etcd.len(), 17);
        assert_eq!(etcd[8], b'_');
        assert_eq!(our_rev_key(&etcd).unwrap(), ours);
        let tomb = etcdrs_mvcc::Revision::new(9, 0).to_key(true);
        let etcd = etcd_rev_key(&tomb).unwrap();
        assert_eq!(etcd.len(), 18);
        assert_eq!(etcd[17], b't');
        assert_eq!(our_rev_key(&etcd).unwrap(), tomb);
        assert!(our_rev_key(b"0123456789abcdefg").is_err());
        assert!(our_rev_key(&etcd[..10]).is_err());
        assert_eq!(etcd_rev_main(&etcd_rev_bytes(77)), Some(77));
    }

    #[test]
    fn tombstones_are_written_as_etcd_writes_them() {
        let etcd = KeyValue {
            key: b"k".to_vec(),
            ..KeyValue::default()
        }
        .encode_to_vec();
        let older = KeyValue {
            key: b"k".to_vec(),
            mod_revision: 25,
            ..KeyValue::default()
        }
        .encode_to_vec();
        assert_eq!(etcd_tombstone(&older).unwrap(), etcd);
        assert_eq!(etcd_tombstone(&etcd).unwrap(), etcd);
        assert!(etcd_tombstone(&[0xff]).is_err());
    }

    #[test]
    fn members_are_written_as_etcd_marshals_them() {
        let member = Member {
            id: 10,
            peer_urls: vec!["http://a:2380".into()],
            is_learner: false,
            name: String::new(),
            client_urls: Vec::new(),
        };
        assert_eq!(
            serde_json::to_string(&member).unwrap(),
            r#"{"id":10,"peerURLs":["http://a:2380"]}"#
        );
        let ours: Member = serde_json::from_str(
            r#"{"id":11,"peerURLs":["http://b:2380"],"isLearner":true,"name":"m2","clientURLs":["http://b:2379"]}"#,
        )
        .unwrap();
        assert_eq!(ours.name, "m2");
        assert!(ours.is_learner);
        assert_eq!(ours.client_urls, vec!["http://b:2379".to_string()]);
    }
}
