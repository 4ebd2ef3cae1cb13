//! Reading an etcd 3.4/3.5 member's data directory, so that etcd-rs can convert it into its
//! own layout on first start.
//!
//! # What this crate owns
//!
//! The reading half of etcd's `wal/` and `etcdserver/api/snap/` packages, and the start-up
//! rules etcd's server applies to them (`etcdserver/server.go` `NewServer`,
//! `etcdserver/storage.go` `readWAL`): [`read`] finds the snapshot etcd would start from
//! (`wal.ValidSnapshotEntries`, then `Snapshotter.LoadNewestAvailable`), reads the WAL from it
//! (`wal.Open` + `ReadAll`, with `wal.Repair`'s handling of a torn tail), and returns it all
//! as an [`EtcdMember`]. [`request`] decodes the entries' payloads, [`v2store`] the
//! snapshot's v2 store JSON (membership and cluster version in etcd 3.4).
//!
//! # What it is not
//!
//! It never writes, renames or removes a file of the directory: where etcd would repair (cut
//! a torn WAL tail, rename a broken `.snap` to `.broken`, delete `db.tmp*`), it reports what
//! it passed over ([`EtcdMember::torn_tail`], [`EtcdMember::skipped_snapshots`]). It does not
//! read the bbolt file `member/snap/db` (another crate does), and knows nothing of etcd-rs's
//! own storage.
//!
//! # Layout
//!
//! - `wal`: segment names, record framing and CRCs, `ValidSnapshotEntries`, `ReadAll`.
//! - `snap`: `.snap` files and the choice of the newest usable one.
//! - [`request`]: `InternalRaftRequest`, the v2 `Request`, `ConfChange` and the member JSON.
//! - [`v2store`]: the v2 store's JSON in a snapshot.
//! - `pb`: the small prost messages of the files (`walpb`, `snappb`, `Metadata`).
//! - CRC-32C as etcd rolls it comes from `etcdrs-crc32c` (`update`).
//! - `error`: [`Error`].
//!
//! # raftpb and raft-rs's eraftpb
//!
//! Entries, hard states and snapshots are decoded straight into raft-rs's `eraftpb` types,
//! because the field numbers and wire types agree with etcd's `raftpb` (checked against etcd
//! 3.4's and 3.5's `raft.proto`): `Entry` type=1 term=2 index=3 data=4 (raft-rs's
//! `sync_log`=5 and `context`=6 etcd never writes); `HardState` term=1 vote=2 commit=3;
//! `Snapshot` data=1 metadata=2; `SnapshotMetadata` conf_state=1 index=2 term=3; `ConfState`
//! voters=1 learners=2 voters_outgoing=3 learners_next=4 auto_leave=5 (etcd, proto2, writes the
//! repeated fields unpacked; raft-rs's decoder takes both forms). `EntryType` agrees too
//! (normal 0, conf change 1, conf change v2 2). `ConfChangeType` does **not**: etcd has
//! update-node 2 and add-learner 3, raft-rs add-learner 2; so a `ConfChange` entry's data is
//! decoded with [`request::ConfChange`], not with raft-rs's type.
#![deny(missing_docs)]

mod error;
mod pb;
pub mod request;
mod snap;
pub mod v2store;
mod wal;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use prost::Message as _;
use raft::eraftpb::{Entry, EntryType, HardState};

pub use error::{Error, Result};
pub use snap::{SkippedSnapshot, SnapshotInfo, read_snap_file};
pub use wal::{Segment, TornTail, list_segments, parse_wal_name};

use request::{Member, Payload};
use v2store::V2Store;

/// What an etcd member's data directory holds, as etcd would start from it.
#[derive(Debug)]
pub struct EtcdMember {
    /// The member's id (the WAL's metadata record).
    pub node_id: u64,
    /// The cluster's id (the WAL's metadata record).
    pub cluster_id: u64,
    /// The last hard state record of the WAL read.
    pub hard_state: HardState,
    /// The newest `.snap` file whose (index, term) the WAL has a snapshot record for at or
    /// below the commit index; `None` when there is none (a young member).
    pub snapshot: Option<SnapshotInfo>,
    /// The (index, term) the WAL was read from: the snapshot's, or (0, 0).
    pub wal_snapshot: (u64, u64),
    /// Every entry after the snapshot, as etcd's `ReadAll` returns them: an entry replaces
    /// one read earlier at the same index and everything after it. Entries past
    /// `hard_state.commit` may be there; they are not committed.
    pub entries: Vec<Entry>,
    /// `member/snap/db`, the bbolt backend (it exists).
    pub db_path: PathBuf,
    /// `member/snap/<index>.snap.db` when a received snapshot's backend is there for the
    /// chosen snapshot's index. etcd 3.4/3.5 replaces `db` with it at start when `db`'s
    /// consistent index is below the snapshot's index (`recoverSnapshotBackend`).
    pub snap_db: Option<PathBuf>,
    /// The cluster version in the snapshot's v2 store JSON (`/0/version`), if any. See
    /// [`EtcdMember::cluster_version`] for the version after the committed entries too.
    pub version: Option<String>,
    /// Where the WAL's last segment ends in a torn record, which etcd would cut off.
    pub torn_tail: Option<TornTail>,
    /// `.snap` files passed over because they could not be read (etcd renames them to
    /// `*.broken`).
    pub skipped_snapshots: Vec<SkippedSnapshot>,
}

impl EtcdMember {
    /// The committed entries (index at most `hard_state.commit`).
    pub fn committed_entries(&self) -> impl Iterator<Item = &Entry> {
        self.entries
            .iter()
            .filter(|entry| entry.index <= self.hard_state.commit)
    }

    /// The members as etcd 3.4 and 3.5 hold them in their v2 store once entry `up_to` is
    /// applied: the snapshot's v2 store, then the committed membership changes and publishes
    /// (v2 `PUT /0/members/<id>/attributes`, or v3 `cluster_member_attr_set`) up to it.
    ///
    /// This is where etcd 3.5.1 keeps what its database lacks: its `members` bucket holds each
    /// member as it was added, since the write that should update it refuses a member already
    /// there (`unsafeSaveMemberToBackend`), so published names and client URLs and learner
    /// promotions reach the v2 store only. Entries that do not decode are passed over.
    pub fn v2_members(&self, up_to: u64) -> Result<BTreeMap<u64, Member>> {
        let mut members: BTreeMap<u64, Member> = match &self.snapshot {
            Some(snapshot) => V2Store::parse(&snapshot.data)
                .map_err(|source| Error::V2StoreJson {
                    path: snapshot.path.clone(),
                    source,
                })?
                .members()?
                .into_iter()
                .map(|member| (member.id, member))
                .collect(),
            None => BTreeMap::new(),
        };
        for entry in self.committed_entries().filter(|e| e.index <= up_to) {
            match entry.get_entry_type() {
                EntryType::EntryNormal => {
                    let (id, name, client_urls) = match request::decode_entry(&entry.data) {
                        Ok(Payload::V2(v2)) if v2.method == "PUT" => {
                            let Some(id) =
                                etcdrs_proto::raft_internal::member_of_attributes_path(&v2.path)
                            else {
                                continue;
                            };
                            let Ok(attributes) = serde_json::from_str::<
                                etcdrs_proto::raft_internal::MemberAttributes,
                            >(&v2.val) else {
                                continue;
                            };
                            (id, attributes.name, attributes.client_urls)
                        }
                        Ok(Payload::V3(v3)) => match v3.cluster_member_attr_set {
                            Some(set) => {
                                let attributes = set.member_attributes.unwrap_or_default();
                                (set.member_id, attributes.name, attributes.client_urls)
                            }
                            None => continue,
                        },
                        _ => continue,
                    };
                    if let Some(member) = members.get_mut(&id) {
                        member.name = name;
                        member.client_urls = client_urls;
                    }
                }
                EntryType::EntryConfChange => {
                    let Ok(change) = request::decode_conf_change(&entry.data) else {
                        continue;
                    };
                    let context =
                        serde_json::from_slice::<request::ConfigChangeContext>(&change.context);
                    match request::ConfChangeType::try_from(change.r#type) {
                        Ok(request::ConfChangeType::ConfChangeRemoveNode) => {
                            members.remove(&change.node_id);
                        }
                        Ok(
                            request::ConfChangeType::ConfChangeAddNode
                            | request::ConfChangeType::ConfChangeAddLearnerNode,
                        ) => match context {
                            Ok(context) if context.is_promote => {
                                if let Some(member) = members.get_mut(&change.node_id) {
                                    member.is_learner = false;
                                }
                            }
                            Ok(context) => {
                                members.insert(change.node_id, context.member);
                            }
                            Err(_) => {}
                        },
                        Ok(request::ConfChangeType::ConfChangeUpdateNode) => {
                            if let (Ok(context), Some(member)) =
                                (context, members.get_mut(&change.node_id))
                            {
                                member.peer_urls = context.member.peer_urls;
                            }
                        }
                        Err(_) => {}
                    }
                }
                EntryType::EntryConfChangeV2 => {}
            }
        }
        Ok(members)
    }

    /// The cluster version after the committed entries: the snapshot's, then the last
    /// committed v2 `PUT /0/version` (etcd 3.4) or `cluster_version_set` (etcd 3.5).
    /// Entries that do not decode are passed over here.
    pub fn cluster_version(&self) -> Option<String> {
        let mut version = self.version.clone();
        for entry in self.committed_entries() {
            if entry.get_entry_type() != EntryType::EntryNormal {
                continue;
            }
            match request::decode_entry(&entry.data) {
                Ok(Payload::V2(v2)) if v2.method == "PUT" && v2.path == "/0/version" => {
                    version = Some(v2.val);
                }
                Ok(Payload::V3(v3)) => {
                    if let Some(set) = &v3.cluster_version_set {
                        version = Some(set.ver.clone());
                    }
                }
                _ => {}
            }
        }
        version
    }
}

/// Whether `data_dir` looks like an etcd member's data directory: `member/wal` holding at
/// least one `.wal` file (etcd's `wal.Exist`) and `member/snap`.
pub fn is_etcd_data_dir(data_dir: &Path) -> bool {
    let member = data_dir.join("member");
    let has_wal = std::fs::read_dir(member.join("wal")).is_ok_and(|entries| {
        entries.flatten().any(|entry| {
            entry
                .file_name()
                .to_str()
                .is_some_and(|n| n.ends_with(".wal"))
        })
    });
    has_wal && member.join("snap").is_dir()
}

/// Reads the member in `data_dir` as etcd 3.4/3.5 would start from it.
///
/// Errors name the file (and, for WAL records, the offset) and use etcd's words where etcd
/// has an error for the condition; see [`Error`].
pub fn read(data_dir: &Path) -> Result<EtcdMember> {
    if !is_etcd_data_dir(data_dir) {
        return Err(Error::NotEtcdDataDir {
            path: data_dir.to_path_buf(),
        });
    }
    read_with_wal_dir(data_dir, &data_dir.join("member").join("wal"))
}

/// [`read`] for a member whose WAL etcd kept in `wal_dir` (`--wal-dir`) rather than in
/// `member/wal`.
pub fn read_with_wal_dir(data_dir: &Path, wal_dir: &Path) -> Result<EtcdMember> {
    let wal_dir = wal_dir.to_path_buf();
    let snap_dir = data_dir.join("member").join("snap");
    if !snap_dir.is_dir() {
        return Err(Error::NotEtcdDataDir {
            path: data_dir.to_path_buf(),
        });
    }

    let segments = wal::list_segments(&wal_dir)?;
    if segments.is_empty() {
        return Err(Error::WalFileNotFound {
            dir: wal_dir,
            index: 0,
        });
    }
    // Snapshot files can outlive a crash before their WAL record was written, so only a
    // snapshot the WAL knows (and has committed) counts.
    let wal_snapshots = wal::valid_snapshot_entries(&segments)?;
    let (snapshot, skipped_snapshots) = snap::load_newest_available(&snap_dir, &wal_snapshots)?;
    let wal_snapshot = snapshot.as_ref().map_or((0, 0), |s| (s.index, s.term));

    let contents = wal::read_all(&wal_dir, &segments, wal_snapshot)?;
    let Some((metadata, metadata_path, metadata_offset)) = contents.metadata else {
        return Err(Error::WalMetadataMissing { dir: wal_dir });
    };
    let metadata = pb::Metadata::decode(metadata.as_slice()).map_err(|e| Error::WalDecode {
        path: metadata_path,
        offset: metadata_offset,
        what: "etcdserverpb.Metadata",
        reason: e.to_string(),
    })?;

    let db_path = snap_dir.join("db");
    if !db_path.is_file() {
        return Err(Error::DbNotFound { path: db_path });
    }
    let snap_db = snapshot
        .as_ref()
        .map(|s| snap_dir.join(format!("{:016x}.snap.db", s.index)))
        .filter(|path| path.is_file());

    let version = match &snapshot {
        Some(snapshot) => V2Store::parse(&snapshot.data)
            .map_err(|source| Error::V2StoreJson {
                path: snapshot.path.clone(),
                source,
            })?
            .cluster_version(),
        None => None,
    };

    Ok(EtcdMember {
        node_id: metadata.node_id,
        cluster_id: metadata.cluster_id,
        hard_state: contents.hard_state,
        snapshot,
        wal_snapshot,
        entries: contents.entries,
        db_path,
        snap_db,
        version,
        torn_tail: contents.torn_tail,
        skipped_snapshots,
    })
}
