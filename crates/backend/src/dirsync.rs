//! Durable directory entries: a new file or directory survives a power cut only once the
//! directory that names it has been fsynced (POSIX promises no more, and ext4 and XFS give no
//! more after a crash), so whoever creates one syncs its parent before relying on it.
//!
//! Not the data of the files themselves: that is the caller's fsync.

use std::fs::File;
use std::io;
use std::path::Path;

/// fsyncs the directory `dir`, making the creations, renames and removals of its entries
/// durable.
pub fn sync_dir(dir: &Path) -> io::Result<()> {
    File::open(dir)?.sync_all()
}

/// `create_dir_all` whose result survives a power cut: each directory it creates is named
/// durably (its parent is synced after it is made). Directories that already exist are
/// taken as durable.
pub fn create_dir_all_synced(dir: &Path) -> io::Result<()> {
    if dir.as_os_str().is_empty() || dir.is_dir() {
        return Ok(());
    }
    let parent = dir.parent().filter(|p| !p.as_os_str().is_empty());
    if let Some(parent) = parent {
        create_dir_all_synced(parent)?;
    }
    match std::fs::create_dir(dir) {
        Ok(()) => {}
        // Made meanwhile by someone else, who syncs it.
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists && dir.is_dir() => return Ok(()),
        Err(e) => return Err(e),
    }
    sync_dir(parent.unwrap_or(Path::new(".")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn creates_every_missing_level() {
        let root = tempfile::tempdir().unwrap();
        let deep = root.path().join("a").join("b").join("c");
        create_dir_all_synced(&deep).unwrap();
        assert!(deep.is_dir());
        create_dir_all_synced(&deep).unwrap();
        let file = root.path().join("f");
        std::fs::write(&file, b"").unwrap();
        assert!(create_dir_all_synced(&file.join("x")).is_err());
    }
}
