//! Starting from an etcd member's data directory: on the first start of etcd-rs on a directory
//! that etcd 3.4/3.5 wrote (`member/snap/db` is a bbolt file, `member/wal/*.wal` etcd's WAL),
//! its state is converted into our layout in `<data-dir>/etcd-rs/`, and etcd's own files are
//! left exactly as they were, so the operator can start etcd on the same directory again.
//!
//! The steps, each logged:
//! 1. read etcd's member (`etcdrs_etcddir::read`): the ids from the WAL metadata, the hard
//!    state, the newest snapshot the WAL knows, and every entry after it;
//! 2. read etcd's backend into a new one of ours (`etcd_db::import`), plus our `meta` keys:
//!    member and cluster id, and the membership as a raft conf state;
//! 3. translate the entries into ours ([`translate`]) and write them, after a snapshot mark at
//!    etcd's snapshot, into a new WAL of ours (`etcdrs_raftnode::write_imported_log`); the
//!    member's restart then applies those past the backend's consistent index, as etcd would;
//! 4. make it durable, and only then rename `etcd-rs.converting` to `etcd-rs`.
//!
//! A crash before the rename leaves `etcd-rs.converting`, which the next start refuses with an
//! error saying so (nothing is overwritten); a directory whose `member/snap/db` is neither
//! etcd's nor ours is refused too.

use std::path::{Path, PathBuf};

use etcdrs_backend::{Backend, Bucket};
use etcdrs_etcddir::request::{self as etcd, ConfChangeType, Payload};
use etcdrs_proto::etcdserverpb::AuthUserAddRequest;
use etcdrs_raftnode::eraftpb::{ConfChange, ConfState, Entry, EntryType};
use prost::Message;

use crate::error::{Result, ServerError};
use crate::etcd_server::protobuf_free::{encode_conf_change, encode_conf_state};
use crate::membership::{self, Member};
use crate::request::{
    AuthHeader, InternalAuthenticateRequest, InternalRaftRequest, MemberAttributes, MemberPeerUrls,
    Op,
};

/// Where a converted member keeps its storage, inside the data dir.
pub const CONVERTED_DIR: &str = "etcd-rs";
/// Where a conversion in progress writes.
const CONVERTING_DIR: &str = "etcd-rs.converting";
/// etcd's default `--bcrypt-cost`, for passwords etcd 3.4 put in its log in clear text.
const ETCD_BCRYPT_COST: u32 = 10;

fn fatal(what: impl std::fmt::Display) -> ServerError {
    ServerError::Fatal(what.to_string())
}

/// What kind of database a `member/snap/db` is.
#[derive(Debug, PartialEq, Eq)]
enum DbKind {
    Missing,
    Ours,
    Etcd,
    Unknown,
}

fn db_kind(path: &Path) -> Result<DbKind> {
    let mut head = [0u8; 32];
    let mut file = match std::fs::File::open(path) {
        Ok(file) => file,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(DbKind::Missing),
        Err(e) => return Err(fatal(format!("open {}: {e}", path.display()))),
    };
    let read = std::io::Read::read(&mut file, &mut head)
        .map_err(|e| fatal(format!("read {}: {e}", path.display())))?;
    Ok(if read >= 4 && head[..4] == *b"redb" {
        DbKind::Ours
    } else if read >= 20
        && u32::from_le_bytes([head[16], head[17], head[18], head[19]]) == 0xED0C_DAED
    {
        DbKind::Etcd
    } else if read == 0 {
        DbKind::Missing
    } else {
        DbKind::Unknown
    })
}

/// The directory our storage lives in for `data_dir`: `<data-dir>/etcd-rs` once converted
/// from etcd's layout, else the data dir itself.
pub fn storage_root(data_dir: &Path) -> PathBuf {
    let converted = data_dir.join(CONVERTED_DIR);
    if converted.is_dir() {
        converted
    } else {
        data_dir.to_path_buf()
    }
}

/// Convert `data_dir` if etcd wrote it and it has not been converted yet (module docs).
/// Returns whether it converted.
pub fn convert_if_etcd(data_dir: &Path, wal_dir: Option<&Path>) -> Result<bool> {
    let converting = data_dir.join(CONVERTING_DIR);
    if converting.exists() {
        return Err(fatal(format!(
            "data-dir {:?} holds a conversion from etcd that did not finish ({}); etcd's files are untouched: remove {} to convert again",
            data_dir.display().to_string(),
            converting.display(),
            converting.display()
        )));
    }
    if data_dir.join(CONVERTED_DIR).is_dir() {
        return Ok(false);
    }
    let db = data_dir.join("member").join("snap").join("db");
    match db_kind(&db)? {
        DbKind::Missing | DbKind::Ours => return Ok(false),
        DbKind::Unknown => {
            return Err(fatal(format!(
                "{} is neither etcd's (bbolt) nor etcd-rs's (redb) database; refusing to start on data-dir {:?}",
                db.display(),
                data_dir.display().to_string()
            )));
        }
        DbKind::Etcd => {}
    }
    tracing::info!(
        data_dir = %data_dir.display(),
        "found an etcd data directory; converting it to etcd-rs's layout, leaving etcd's files untouched"
    );
    let started = std::time::Instant::now();
    let member = match wal_dir {
        Some(wal_dir) => etcdrs_etcddir::read_with_wal_dir(data_dir, wal_dir),
        None => etcdrs_etcddir::read(data_dir),
    }
    .map_err(fatal)?;
    tracing::info!(
        local_member_id = %membership::id_hex(member.node_id),
        cluster_id = %membership::id_hex(member.cluster_id),
        snapshot_index = member.wal_snapshot.0,
        entries = member.entries.len(),
        commit_index = member.hard_state.commit,
        "read etcd's WAL"
    );
    let result = write_converted(&member, &converting);
    if let Err(e) = result {
        // Ours only; etcd's files were never opened for writing.
        let _ = std::fs::remove_dir_all(&converting);
        return Err(e);
    }
    let converted = data_dir.join(CONVERTED_DIR);
    std::fs::rename(&converting, &converted).map_err(|e| fatal(format!("rename: {e}")))?;
    sync_dir(data_dir)?;
    tracing::info!(
        path = %converted.display(),
        took = ?started.elapsed(),
        "converted etcd data directory"
    );
    Ok(true)
}

fn sync_dir(dir: &Path) -> Result<()> {
    std::fs::File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(|e| fatal(format!("sync {}: {e}", dir.display())))
}

fn write_converted(member: &etcdrs_etcddir::EtcdMember, root: &Path) -> Result<()> {
    let snap_dir = root.join("member").join("snap");
    std::fs::create_dir_all(&snap_dir).map_err(|e| fatal(format!("create {root:?}: {e}")))?;
    // etcd 3.4/3.5 start from a received snapshot's database (`<index>.snap.db`) when `db`'s
    // consistent index is behind that snapshot (`recoverSnapshotBackend`).
    let open = |path: &Path| {
        crate::etcd_db::Db::open(path)
            .map_err(|e| fatal(format!("{}: invalid database: {e}", path.display())))
    };
    let mut source = member.db_path.clone();
    let mut db = open(&source)?;
    if let Some(snap_db) = &member.snap_db
        && crate::etcd_db::consistent_index(&db)? < member.wal_snapshot.0
    {
        tracing::info!(path = %snap_db.display(), "using the received snapshot's database, as etcd would");
        source = snap_db.clone();
        db = open(&source)?;
    }
    let backend = Backend::open(&snap_dir.join("db")).map_err(|e| fatal(format!("{e}")))?;
    let imported = crate::etcd_db::import(&db, &backend)?;
    tracing::info!(
        path = %source.display(),
        revisions = imported.revisions,
        leases = imported.leases,
        members = imported.members.len(),
        consistent_index = imported.consistent_index,
        "converted etcd's backend"
    );
    if imported.consistent_index < member.wal_snapshot.0 {
        // etcd itself refuses to start here (its backend cannot be recovered from the
        // snapshot without the snapshot's database).
        return Err(fatal(format!(
            "{}: its consistent index {} is behind etcd's last snapshot at {}, and that snapshot's database is missing",
            source.display(),
            imported.consistent_index,
            member.wal_snapshot.0
        )));
    }
    if imported.members.is_empty() {
        return Err(fatal(format!(
            "{} has no members: cannot tell this member's cluster",
            source.display()
        )));
    }
    let mut conf_state = ConfState::default();
    for m in &imported.members {
        if m.is_learner {
            conf_state.learners.push(m.id);
        } else {
            conf_state.voters.push(m.id);
        }
    }
    let entries = member
        .entries
        .iter()
        .map(translate)
        .collect::<Result<Vec<_>>>()?;
    let term = entries
        .iter()
        .find(|e| e.index == imported.consistent_index)
        .map_or(member.wal_snapshot.1, |e| e.term);
    let tx = backend.write().map_err(|e| fatal(format!("{e}")))?;
    let put = |key: &[u8], value: &[u8]| {
        tx.put(Bucket::META, key, value)
            .map_err(|e| fatal(format!("{e}")))
    };
    put(
        crate::etcd_server::META_MEMBER_ID,
        &member.node_id.to_be_bytes(),
    )?;
    put(
        crate::etcd_server::META_CLUSTER_ID,
        &member.cluster_id.to_be_bytes(),
    )?;
    put(etcdrs_mvcc::META_TERM, &term.to_be_bytes())?;
    put(
        etcdrs_mvcc::META_CONF_STATE,
        &encode_conf_state(&conf_state),
    )?;
    tx.commit(true).map_err(|e| fatal(format!("{e}")))?;
    drop(backend);

    let mut metadata = member.node_id.to_be_bytes().to_vec();
    metadata.extend_from_slice(&member.cluster_id.to_be_bytes());
    let mut hard_state = member.hard_state.clone();
    hard_state.commit = hard_state.commit.max(imported.consistent_index);
    etcdrs_raftnode::write_imported_log(
        &root.join("member").join("wal"),
        &metadata,
        member.wal_snapshot,
        &hard_state,
        &entries,
    )?;
    tracing::info!(
        entries = entries.len(),
        first_index = entries.first().map_or(0, |e| e.index),
        last_index = entries.last().map_or(0, |e| e.index),
        "converted etcd's WAL"
    );
    sync_dir(&snap_dir)?;
    sync_dir(&root.join("member"))?;
    sync_dir(root)
}

/// One of etcd's raft entries as ours: the same index and term, and data that applies to the
/// same effect (etcd 3.4's v2 requests for member attributes become our `Publish`; what
/// etcd-rs does not keep, such as the cluster version and the v2 store, becomes an empty
/// entry, which applies nothing).
pub fn translate(entry: &Entry) -> Result<Entry> {
    let mut out = Entry {
        index: entry.index,
        term: entry.term,
        ..Default::default()
    };
    match entry.get_entry_type() {
        EntryType::EntryNormal => {
            out.set_entry_type(EntryType::EntryNormal);
            let payload = etcd::decode_entry(&entry.data).map_err(|e| {
                fatal(format!(
                    "entry {}: cannot decode etcd's request: {e}",
                    entry.index
                ))
            })?;
            if let Some(request) = translate_request(payload)? {
                out.data = request.encode_to_vec().into();
            }
        }
        EntryType::EntryConfChange => {
            let change = etcd::decode_conf_change(&entry.data).map_err(|e| {
                fatal(format!(
                    "entry {}: cannot decode etcd's conf change: {e}",
                    entry.index
                ))
            })?;
            let kind = ConfChangeType::try_from(change.r#type).map_err(|_| {
                fatal(format!(
                    "entry {}: unknown conf change type {}",
                    entry.index, change.r#type
                ))
            })?;
            let ours = |kind: etcdrs_raftnode::eraftpb::ConfChangeType, context: Vec<u8>| {
                let mut cc = ConfChange {
                    id: change.id,
                    node_id: change.node_id,
                    context: context.into(),
                    ..Default::default()
                };
                cc.set_change_type(kind);
                Ok::<_, ServerError>(encode_conf_change(&cc))
            };
            let member_json = || -> Result<Vec<u8>> {
                let m = etcd::decode_conf_change_member(&change.context).map_err(|e| {
                    fatal(format!(
                        "entry {}: bad member in conf change: {e}",
                        entry.index
                    ))
                })?;
                serde_json::to_vec(&Member {
                    id: m.id,
                    name: m.name,
                    peer_urls: m.peer_urls,
                    client_urls: m.client_urls,
                    is_learner: m.is_learner,
                })
                .map_err(fatal)
            };
            match kind {
                ConfChangeType::ConfChangeAddNode | ConfChangeType::ConfChangeAddLearnerNode => {
                    let ours_kind = if kind == ConfChangeType::ConfChangeAddNode {
                        etcdrs_raftnode::eraftpb::ConfChangeType::AddNode
                    } else {
                        etcdrs_raftnode::eraftpb::ConfChangeType::AddLearnerNode
                    };
                    out.set_entry_type(EntryType::EntryConfChange);
                    out.data = ours(ours_kind, member_json()?)?.into();
                }
                ConfChangeType::ConfChangeRemoveNode => {
                    out.set_entry_type(EntryType::EntryConfChange);
                    out.data = ours(
                        etcdrs_raftnode::eraftpb::ConfChangeType::RemoveNode,
                        Vec::new(),
                    )?
                    .into();
                }
                // New peer URLs change no raft configuration: ours is a normal entry.
                ConfChangeType::ConfChangeUpdateNode => {
                    let m = etcd::decode_conf_change_member(&change.context).map_err(|e| {
                        fatal(format!(
                            "entry {}: bad member in conf change: {e}",
                            entry.index
                        ))
                    })?;
                    out.set_entry_type(EntryType::EntryNormal);
                    out.data = InternalRaftRequest {
                        id: change.id,
                        op: Some(Op::UpdatePeerUrls(MemberPeerUrls {
                            member_id: change.node_id,
                            peer_urls: m.peer_urls,
                        })),
                        auth: None,
                    }
                    .encode_to_vec()
                    .into();
                }
            }
        }
        EntryType::EntryConfChangeV2 => {
            return Err(fatal(format!(
                "entry {}: a ConfChangeV2, which etcd does not write",
                entry.index
            )));
        }
    }
    Ok(out)
}

fn hash_password(password: &str) -> Result<String> {
    bcrypt::hash(password, ETCD_BCRYPT_COST).map_err(|e| fatal(format!("bcrypt: {e}")))
}

/// An etcd request as ours; `None` for what applies nothing here.
fn translate_request(payload: Payload) -> Result<Option<InternalRaftRequest>> {
    let request = match payload {
        Payload::Noop => return Ok(None),
        Payload::V2(v2) => return Ok(translate_v2(v2)),
        Payload::V3(request) => *request,
    };
    let (id, auth) = match &request.header {
        Some(h) => (
            if h.id != 0 { h.id } else { request.id },
            (!h.username.is_empty()).then(|| AuthHeader {
                username: h.username.clone(),
                auth_revision: h.auth_revision,
            }),
        ),
        None => (request.id, None),
    };
    let with_hash = |mut req: AuthUserAddRequest| -> Result<AuthUserAddRequest> {
        if req.hashed_password.is_empty() && !req.password.is_empty() {
            req.hashed_password = hash_password(&req.password)?;
        }
        req.password.clear();
        Ok(req)
    };
    let r = request;
    let op = if let Some(x) = r.put {
        Op::Put(x)
    } else if let Some(x) = r.delete_range {
        Op::DeleteRange(x)
    } else if let Some(x) = r.txn {
        Op::Txn(x)
    } else if let Some(x) = r.compaction {
        Op::Compaction(x)
    } else if let Some(x) = r.lease_grant {
        Op::LeaseGrant(x)
    } else if let Some(x) = r.lease_revoke {
        Op::LeaseRevoke(x)
    } else if let Some(x) = r.alarm {
        Op::Alarm(x)
    } else if let Some(x) = r.lease_checkpoint {
        Op::LeaseCheckpoint(x)
    } else if let Some(x) = r.auth_enable {
        Op::AuthEnable(x)
    } else if let Some(x) = r.auth_disable {
        Op::AuthDisable(x)
    } else if let Some(x) = r.authenticate {
        Op::Authenticate(InternalAuthenticateRequest {
            name: x.name,
            simple_token: x.simple_token,
        })
    } else if let Some(x) = r.auth_user_add {
        Op::UserAdd(with_hash(x)?)
    } else if let Some(x) = r.auth_user_delete {
        Op::UserDelete(x)
    } else if let Some(mut x) = r.auth_user_change_password {
        if x.hashed_password.is_empty() && !x.password.is_empty() {
            x.hashed_password = hash_password(&x.password)?;
        }
        x.password.clear();
        Op::UserChangePassword(x)
    } else if let Some(x) = r.auth_user_grant_role {
        Op::UserGrantRole(x)
    } else if let Some(x) = r.auth_user_revoke_role {
        Op::UserRevokeRole(x)
    } else if let Some(x) = r.auth_role_add {
        Op::RoleAdd(x)
    } else if let Some(x) = r.auth_role_delete {
        Op::RoleDelete(x)
    } else if let Some(x) = r.auth_role_grant_permission {
        Op::RoleGrantPermission(x)
    } else if let Some(x) = r.auth_role_revoke_permission {
        Op::RoleRevokePermission(x)
    } else if let Some(x) = r.cluster_member_attr_set {
        let attributes = x.member_attributes.unwrap_or_default();
        Op::Publish(MemberAttributes {
            member_id: x.member_id,
            name: attributes.name,
            client_urls: attributes.client_urls,
        })
    } else {
        // Reads (range, auth status and listings), the cluster version and downgrade
        // settings: nothing etcd-rs keeps changes.
        return Ok(None);
    };
    Ok(Some(InternalRaftRequest {
        id,
        op: Some(op),
        auth,
    }))
}

/// etcd 3.4's v2 requests: a member's attributes become our `Publish`; the cluster version
/// and the v2 store's own keys apply nothing here (etcd-rs does not carry the v2 store over).
fn translate_v2(v2: etcd::V2Request) -> Option<InternalRaftRequest> {
    #[derive(serde::Deserialize)]
    struct Attributes {
        #[serde(default)]
        name: String,
        #[serde(rename = "clientURLs", default)]
        client_urls: Vec<String>,
    }
    let hex = v2
        .path
        .strip_prefix("/0/members/")?
        .strip_suffix("/attributes")?;
    if v2.method != "PUT" {
        return None;
    }
    let member_id = u64::from_str_radix(hex, 16).ok()?;
    let attributes: Attributes = serde_json::from_str(&v2.val).ok()?;
    Some(InternalRaftRequest {
        id: v2.id,
        op: Some(Op::Publish(MemberAttributes {
            member_id,
            name: attributes.name,
            client_urls: attributes.client_urls,
        })),
        auth: None,
    })
}
