//! Where a member's storage lives in its data directory. A member converted from etcd's data
//! directory keeps all its storage (backend and WAL) under `<data-dir>/etcd-rs/`, leaving
//! etcd's files as they were; any other member keeps etcd's layout (`member/snap/db`,
//! `member/wal`, or `--wal-dir`).
//!
//! The layout is resolved from the disk once, after a conversion had its chance to run
//! ([`Layout::resolve`]); the configuration stays plain data.

use std::path::{Path, PathBuf};

/// Where a converted member keeps its storage, inside the data dir.
pub const CONVERTED_DIR: &str = "etcd-rs";

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

/// A member's storage paths, as resolved once at start.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Layout {
    /// The backend file (etcd's `member/snap/db`).
    pub backend_path: PathBuf,
    /// The WAL directory.
    pub wal_dir: PathBuf,
}

impl Layout {
    /// The layout of `data_dir` as the disk holds it now; `wal_dir` is `--wal-dir`. A
    /// converted member keeps its WAL with the rest of its storage, whatever `--wal-dir` says:
    /// that directory holds etcd's WAL.
    pub fn resolve(data_dir: &Path, wal_dir: Option<&Path>) -> Layout {
        let root = storage_root(data_dir);
        let wal_dir = if root != data_dir {
            root.join("member").join("wal")
        } else {
            wal_dir
                .map(Path::to_path_buf)
                .unwrap_or_else(|| data_dir.join("member").join("wal"))
        };
        Layout {
            backend_path: root.join("member").join("snap").join("db"),
            wal_dir,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_converted_member_keeps_its_wal_beside_its_backend() {
        let dir = std::env::temp_dir().join(format!("etcdrs-schema-layout-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("temp dir");
        let flag = Some(Path::new("/elsewhere/wal"));
        let plain = Layout::resolve(&dir, flag);
        assert_eq!(plain.wal_dir, PathBuf::from("/elsewhere/wal"));
        assert_eq!(plain.backend_path, dir.join("member/snap/db"));
        assert_eq!(Layout::resolve(&dir, None).wal_dir, dir.join("member/wal"));

        std::fs::create_dir_all(dir.join(CONVERTED_DIR)).expect("converted dir");
        let converted = Layout::resolve(&dir, flag);
        assert_eq!(converted.wal_dir, dir.join("etcd-rs/member/wal"));
        assert_eq!(converted.backend_path, dir.join("etcd-rs/member/snap/db"));
        std::fs::remove_dir_all(&dir).expect("cleanup");
    }
}
