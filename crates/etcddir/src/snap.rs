//! Reading etcd's raft snapshot files, `member/snap/%016x-%016x.snap` (term-index).
//!
//! Port of the reading half of etcd 3.4/3.5 `etcdserver/api/snap/snapshotter.go`: `Read`,
//! and `LoadNewestAvailable`, which picks the newest file whose (term, index) the WAL has a
//! snapshot record for. Where etcd renames a file it cannot read to `*.broken`, this reader
//! only skips it and reports it in [`SkippedSnapshot`]; it never writes.
//!
//! A `.snap` file holds a `snappb.snapshot{crc, data}`: `data` is a marshaled
//! `raftpb.Snapshot`, `crc` its CRC-32C. The raft snapshot's own `data` is, in etcd 3.4 and
//! 3.5, the v2 store's JSON (see [`crate::v2store`]); the key-value state is in the bbolt
//! file `member/snap/db`, not here.

use std::path::{Path, PathBuf};

use prost::Message as _;
use protobuf::Message as _;
use raft::eraftpb::{ConfState, Snapshot};

use crate::error::{Error, Result};
use crate::pb::{SnapFile, WalSnapshot};

/// The snapshot etcd would start from.
#[derive(Clone, Debug, PartialEq)]
pub struct SnapshotInfo {
    /// The `.snap` file it came from.
    pub path: PathBuf,
    /// The raft index it covers.
    pub index: u64,
    /// The term of that index.
    pub term: u64,
    /// The membership at that index.
    pub conf_state: ConfState,
    /// The raft snapshot's data, as etcd wrote it: the v2 store's JSON in etcd 3.4 and 3.5.
    pub data: Vec<u8>,
}

/// A `.snap` file that was passed over because it could not be read (etcd would rename it
/// to `*.broken`).
#[derive(Debug)]
pub struct SkippedSnapshot {
    /// The file.
    pub path: PathBuf,
    /// Why it could not be read.
    pub reason: Error,
}

/// Reads and checks one `.snap` file (etcd `snap.Read`).
pub fn read_snap_file(path: &Path) -> Result<Snapshot> {
    let bytes = std::fs::read(path).map_err(|source| Error::Io {
        path: path.to_path_buf(),
        source,
    })?;
    if bytes.is_empty() {
        return Err(Error::SnapEmpty {
            path: path.to_path_buf(),
        });
    }
    let file = SnapFile::decode(bytes.as_slice()).map_err(|e| Error::SnapDecode {
        path: path.to_path_buf(),
        what: "snappb.Snapshot",
        reason: e.to_string(),
    })?;
    if file.data.is_empty() || file.crc == 0 {
        return Err(Error::SnapEmpty {
            path: path.to_path_buf(),
        });
    }
    let computed = etcdrs_crc32c::update(0, &file.data);
    if computed != file.crc {
        return Err(Error::SnapCrcMismatch {
            path: path.to_path_buf(),
            stored: file.crc,
            computed,
        });
    }
    Snapshot::parse_from_bytes(&file.data).map_err(|e| Error::SnapDecode {
        path: path.to_path_buf(),
        what: "raftpb.Snapshot",
        reason: e.to_string(),
    })
}

/// The `.snap` files of `snap_dir`, newest first (etcd `snapNames`: names sorted in reverse;
/// they are fixed-width hex, so that is (term, index) order).
pub fn snap_names(snap_dir: &Path) -> Result<Vec<PathBuf>> {
    let io_error = |source| Error::Io {
        path: snap_dir.to_path_buf(),
        source,
    };
    let mut names = Vec::new();
    for dir_entry in std::fs::read_dir(snap_dir).map_err(io_error)? {
        let dir_entry = dir_entry.map_err(io_error)?;
        let name = dir_entry.file_name();
        if name.to_str().is_some_and(|name| name.ends_with(".snap")) {
            names.push(dir_entry.path());
        }
    }
    names.sort_by(|a, b| b.cmp(a));
    Ok(names)
}

/// etcd's `LoadNewestAvailable`: the newest readable `.snap` file whose (term, index) is among
/// `wal_snapshots`, and the files passed over because they could not be read.
pub fn load_newest_available(
    snap_dir: &Path,
    wal_snapshots: &[WalSnapshot],
) -> Result<(Option<SnapshotInfo>, Vec<SkippedSnapshot>)> {
    let mut skipped = Vec::new();
    for path in snap_names(snap_dir)? {
        let snapshot = match read_snap_file(&path) {
            Ok(snapshot) => snapshot,
            Err(reason) => {
                skipped.push(SkippedSnapshot { path, reason });
                continue;
            }
        };
        let metadata = snapshot.get_metadata();
        let known = wal_snapshots
            .iter()
            .any(|mark| mark.index == metadata.index && mark.term == metadata.term);
        if known {
            let info = SnapshotInfo {
                index: metadata.index,
                term: metadata.term,
                conf_state: metadata.get_conf_state().clone(),
                data: snapshot.data.to_vec(),
                path,
            };
            return Ok((Some(info), skipped));
        }
    }
    Ok((None, skipped))
}
