//! Durable directory entries: a new file or directory survives a power cut only once the
//! directory that names it has been fsynced (POSIX promises no more, and ext4 and XFS give no
//! more after a crash), so whoever creates one syncs its parent before relying on it.
//!
//! Not the data of most files: a caller that writes one syncs it. The exception is
//! [`write_file_synced`], for small files written whole at once (auto-TLS certificates).

use std::fs::{File, OpenOptions};
use std::io::{self, Write};
use std::os::unix::fs::OpenOptionsExt;
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

/// Writes `bytes` to `path` so that after a power cut the file is either absent (or as it
/// was) or whole, never short or empty: the bytes go to `<path>.tmp` (created with
/// permission bits `mode`, before the umask), which is fsynced, then renamed over `path`,
/// then the directory is fsynced. The directory must exist durably (see
/// [`create_dir_all_synced`]).
pub fn write_file_synced(path: &Path, bytes: &[u8], mode: u32) -> io::Result<()> {
    let Some(name) = path.file_name() else {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("{} names no file", path.display()),
        ));
    };
    let mut tmp_name = name.to_os_string();
    tmp_name.push(".tmp");
    let tmp = path.with_file_name(tmp_name);
    let mut file = OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(mode)
        .open(&tmp)?;
    file.write_all(bytes)?;
    file.sync_all()?;
    drop(file);
    std::fs::rename(&tmp, path)?;
    let parent = path.parent().filter(|p| !p.as_os_str().is_empty());
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

    #[test]
    fn a_synced_write_replaces_the_file_whole_and_leaves_no_temporary() {
        use std::os::unix::fs::PermissionsExt;
        let root = tempfile::tempdir().unwrap();
        let path = root.path().join("key.pem");
        write_file_synced(&path, b"first", 0o600).unwrap();
        write_file_synced(&path, b"second", 0o600).unwrap();
        assert_eq!(std::fs::read(&path).unwrap(), b"second");
        let mode = std::fs::metadata(&path).unwrap().permissions().mode();
        assert_eq!(mode & 0o077, 0, "{mode:o}");
        let names: Vec<_> = std::fs::read_dir(root.path())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names, ["key.pem"]);
        assert!(write_file_synced(&root.path().join("missing/f"), b"", 0o644).is_err());
    }
}
