//! The WAL directory itself: its lock (one `Wal` per directory), its durable creation
//! (each new directory's parent synced), and the removal of segments a crash left
//! half-created.

use std::fs::{self, File, TryLockError};
use std::path::{Path, PathBuf};

use crate::error::{Error, Result};
use crate::segment;

/// Takes the directory lock, or reports who holds it.
pub(super) fn lock_dir(dir_handle: &File, dir: &Path) -> Result<()> {
    match dir_handle.try_lock() {
        Ok(()) => Ok(()),
        Err(TryLockError::WouldBlock) => Err(Error::Locked {
            dir: dir.to_path_buf(),
        }),
        Err(TryLockError::Error(err)) => Err(Error::io(dir)(err)),
    }
}

/// `create_dir_all` whose result survives a power cut: the parent of each directory it makes
/// is synced after it (a new name is durable only once its directory is).
pub(super) fn create_dir_all_synced(dir: &Path) -> Result<()> {
    if dir.as_os_str().is_empty() || dir.is_dir() {
        return Ok(());
    }
    if let Some(parent) = dir.parent().filter(|p| !p.as_os_str().is_empty()) {
        create_dir_all_synced(parent)?;
    }
    match fs::create_dir(dir) {
        Ok(()) => sync_parent_dir(dir),
        Err(err) if err.kind() == std::io::ErrorKind::AlreadyExists && dir.is_dir() => Ok(()),
        Err(err) => Err(Error::io(dir)(err)),
    }
}

/// Makes the creation of `dir` itself durable.
pub(super) fn sync_parent_dir(dir: &Path) -> Result<()> {
    let Some(parent) = dir.parent() else {
        return Ok(());
    };
    let parent = if parent.as_os_str().is_empty() {
        Path::new(".")
    } else {
        parent
    };
    let parent_handle = segment::open_dir(parent)?;
    segment::sync_dir(&parent_handle, parent)
}

pub(super) fn remove_stale_tmp(dir: &Path, dir_handle: &File, stale_tmp: &[PathBuf]) -> Result<()> {
    for path in stale_tmp {
        tracing::warn!(path = %path.display(), "wal: removing segment left half-created by a crash");
        fs::remove_file(path).map_err(Error::io(path))?;
    }
    if !stale_tmp.is_empty() {
        segment::sync_dir(dir_handle, dir)?;
    }
    Ok(())
}
