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
//! 3. write etcd's entries, after a snapshot mark at etcd's snapshot, into a new WAL of ours
//!    (`etcdrs_raftnode::write_imported_log`) as they are: etcd-rs proposes and applies etcd's
//!    own payloads (`etcdrs_proto::raft_internal`, `raftnode::confchange`), so nothing is
//!    translated ([`check_entry`] only refuses what etcd never writes); the member's restart
//!    then applies those past the backend's consistent index, as etcd would;
//! 4. make it durable, and only then rename `etcd-rs.converting` to `etcd-rs`.
//!
//! A crash before the rename leaves `etcd-rs.converting`, which the next start refuses with an
//! error saying so (nothing is overwritten); a directory whose `member/snap/db` is neither
//! etcd's nor ours is refused too.

use std::path::Path;

use etcdrs_backend::{Backend, Bucket};
use etcdrs_raftnode::eraftpb::{ConfState, Entry, EntryType};
use etcdrs_schema::conf_state::encode_conf_state;
use etcdrs_schema::keys::{META_CLUSTER_ID, META_CLUSTER_VERSION, META_MEMBER_ID};
use etcdrs_schema::layout::CONVERTED_DIR;
use etcdrs_schema::membership;

use crate::error::{Result, ServerError};

/// Where a conversion in progress writes.
const CONVERTING_DIR: &str = "etcd-rs.converting";

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
    etcdrs_backend::create_dir_all_synced(&snap_dir)
        .map_err(|e| fatal(format!("create {root:?}: {e}")))?;
    // etcd 3.4/3.5 start from a received snapshot's database (`<index>.snap.db`) when `db`'s
    // consistent index is behind that snapshot (`recoverSnapshotBackend`).
    let open = |path: &Path| {
        etcdrs_schema::etcd_db::Db::open(path)
            .map_err(|e| fatal(format!("{}: invalid database: {e}", path.display())))
    };
    let mut source = member.db_path.clone();
    let mut db = open(&source)?;
    if let Some(snap_db) = &member.snap_db
        && etcdrs_schema::etcd_db::consistent_index(&db)? < member.wal_snapshot.0
    {
        tracing::info!(path = %snap_db.display(), "using the received snapshot's database, as etcd would");
        source = snap_db.clone();
        db = open(&source)?;
    }
    let backend = Backend::open(&snap_dir.join("db")).map_err(|e| fatal(format!("{e}")))?;
    let mut imported = etcdrs_schema::etcd_db::import(&db, &backend)?;
    // The members' published attributes and promotions as etcd holds them, in its v2 store
    // (the `.snap` file's, then the entries it applied): etcd 3.5.1's database never
    // receives them (`EtcdMember::v2_members`).
    let v2_members = member
        .v2_members(imported.consistent_index)
        .map_err(|e| fatal(format!("reading etcd's v2 store membership: {e}")))?;
    let mut updated = Vec::new();
    for m in &mut imported.members {
        if let Some(v2) = v2_members.get(&m.id)
            && (v2.name != m.name
                || v2.client_urls != m.client_urls
                || v2.is_learner != m.is_learner)
        {
            m.name.clone_from(&v2.name);
            m.client_urls.clone_from(&v2.client_urls);
            m.is_learner = v2.is_learner;
            updated.push(m.clone());
        }
    }
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
    let entries = &member.entries;
    for entry in entries {
        check_entry(entry)?;
    }
    let term = entries
        .iter()
        .find(|e| e.index == imported.consistent_index)
        .map_or(member.wal_snapshot.1, |e| e.term);
    let tx = backend.write().map_err(|e| fatal(format!("{e}")))?;
    let put = |key: &[u8], value: &[u8]| {
        tx.put(Bucket::META, key, value)
            .map_err(|e| fatal(format!("{e}")))
    };
    put(META_MEMBER_ID, &member.node_id.to_be_bytes())?;
    put(META_CLUSTER_ID, &member.cluster_id.to_be_bytes())?;
    put(etcdrs_mvcc::META_TERM, &term.to_be_bytes())?;
    put(
        etcdrs_mvcc::META_CONF_STATE,
        &encode_conf_state(&conf_state),
    )?;
    if let Some(version) = &imported.cluster_version {
        put(META_CLUSTER_VERSION, version.as_bytes())?;
    }
    for m in &updated {
        tracing::info!(
            member_id = %membership::id_hex(m.id),
            name = %m.name,
            "member's attributes taken from etcd's v2 store"
        );
        let json = serde_json::to_vec(m).map_err(|e| fatal(format!("encode member: {e}")))?;
        tx.put(Bucket::MEMBERS, &m.id.to_be_bytes(), &json)
            .map_err(|e| fatal(format!("{e}")))?;
    }
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
        entries,
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

/// Refuses an entry etcd-rs would not apply as etcd does: every entry etcd writes is one
/// etcd-rs reads (the same payloads), except a `ConfChangeV2`, which etcd never writes.
fn check_entry(entry: &Entry) -> Result<()> {
    match entry.get_entry_type() {
        EntryType::EntryNormal => crate::request::decode(entry.data.clone())
            .map(|_| ())
            .map_err(|e| {
                fatal(format!(
                    "entry {}: cannot decode etcd's request: {e}",
                    entry.index
                ))
            }),
        EntryType::EntryConfChange => {
            etcdrs_raftnode::confchange::EtcdConfChange::decode(&entry.data)
                .map(|_| ())
                .map_err(|e| fatal(format!("entry {}: {e}", entry.index)))
        }
        EntryType::EntryConfChangeV2 => Err(fatal(format!(
            "entry {}: a ConfChangeV2, which etcd does not write",
            entry.index
        ))),
    }
}
