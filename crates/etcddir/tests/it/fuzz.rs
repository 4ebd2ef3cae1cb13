//! Fuzzing of what reads etcd's files (issue 20): a WAL segment, a `.snap` file and the
//! entry payloads in them are untrusted bytes; each must give an error, never a panic, a
//! trusted length or a loop. Corpus: `crates/etcddir/fuzz-corpus/`, files an etcd 3.4 member
//! wrote (`scripts/fuzz-corpus-etcd34`) plus regression inputs; entry payloads are taken from
//! that WAL (`ETCDRS_FUZZ_REGEN=1` rewrites them). Runner and knobs: `etcdrs-fuzz`.

use std::path::{Path, PathBuf};

use etcdrs_etcddir::request::{decode_conf_change, decode_conf_change_member, decode_entry};
use etcdrs_etcddir::v2store::V2Store;
use etcdrs_fuzz::Fuzz;
use raft::eraftpb::EntryType;

const WAL_NAME: &str = "0000000000000000-0000000000000000.wal";
const SNAP_NAME: &str = "0000000000000002-0000000000000012.snap";

fn corpus(target: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("fuzz-corpus")
        .join(target)
}

fn corpus_file(target: &str, name: &str) -> Vec<u8> {
    std::fs::read(corpus(target).join(name)).expect("read a checked-in corpus file")
}

/// A data directory with etcd 3.4's WAL and `.snap` file from the corpus and an empty `db`.
fn data_dir() -> tempfile::TempDir {
    let dir = tempfile::tempdir().expect("tempdir");
    let member = dir.path().join("member");
    std::fs::create_dir_all(member.join("wal")).expect("create member/wal");
    std::fs::create_dir_all(member.join("snap")).expect("create member/snap");
    std::fs::write(
        member.join("wal").join(WAL_NAME),
        corpus_file("wal", &format!("etcd34-{WAL_NAME}")),
    )
    .expect("write the WAL");
    std::fs::write(
        member.join("snap").join(SNAP_NAME),
        corpus_file("snap", &format!("etcd34-{SNAP_NAME}")),
    )
    .expect("write the snapshot");
    std::fs::write(member.join("snap").join("db"), b"").expect("write db");
    dir
}

/// Everything `server::convert` does with a member read from etcd's files: the entries
/// decoded by type, the v2 store parsed.
fn read_and_decode(dir: &Path) {
    let Ok(member) = etcdrs_etcddir::read(dir) else {
        return;
    };
    let _ = member.cluster_version();
    for entry in member.committed_entries() {
        decode_any_entry(entry.get_entry_type(), entry.get_data());
    }
    if let Some(snapshot) = &member.snapshot
        && let Ok(store) = V2Store::parse(&snapshot.data)
    {
        let _ = store.members();
        let _ = store.removed_member_ids();
        let _ = store.cluster_version();
    }
}

fn decode_any_entry(entry_type: EntryType, data: &[u8]) {
    match entry_type {
        EntryType::EntryNormal => {
            let _ = decode_entry(data);
        }
        _ => {
            if let Ok(change) = decode_conf_change(data) {
                let _ = decode_conf_change_member(&change.context);
            }
        }
    }
}

#[test]
fn fuzz_etcd_wal_segment() {
    let dir = data_dir();
    let segment = dir.path().join("member").join("wal").join(WAL_NAME);
    Fuzz::new("etcddir-wal")
        .corpus_dir(corpus("wal"))
        .iterations(1500)
        .run(|input| {
            std::fs::write(&segment, input).expect("write the mutated segment");
            read_and_decode(dir.path());
        });
}

#[test]
fn fuzz_etcd_snap_file() {
    let dir = data_dir();
    let snap = dir.path().join("member").join("snap").join(SNAP_NAME);
    Fuzz::new("etcddir-snap")
        .corpus_dir(corpus("snap"))
        .iterations(600)
        .run(|input| {
            std::fs::write(&snap, input).expect("write the mutated snapshot");
            if let Ok(snapshot) = etcdrs_etcddir::read_snap_file(&snap)
                && let Ok(store) = V2Store::parse(snapshot.get_data())
            {
                let _ = store.members();
                let _ = store.cluster_version();
            }
            read_and_decode(dir.path());
        });
}

#[test]
fn fuzz_etcd_entry_payloads() {
    // Without its snapshot file the member is read from the WAL's start: every entry.
    let dir = data_dir();
    std::fs::remove_file(dir.path().join("member").join("snap").join(SNAP_NAME))
        .expect("remove the snapshot");
    let member = etcdrs_etcddir::read(dir.path()).expect("the corpus WAL reads");
    let mut fuzz = Fuzz::new("etcddir-entry")
        .corpus_dir(corpus("entry"))
        .iterations(2000);
    for entry in &member.entries {
        let kind = match entry.get_entry_type() {
            EntryType::EntryNormal => "normal",
            _ => "confchange",
        };
        if !entry.get_data().is_empty() {
            fuzz = fuzz.input(
                &format!("etcd34-{kind}-{:03}", entry.index),
                entry.get_data().to_vec(),
            );
        }
    }
    fuzz.run(|input| {
        decode_any_entry(EntryType::EntryNormal, input);
        decode_any_entry(EntryType::EntryConfChange, input);
        let _ = decode_conf_change_member(input);
    });
}
