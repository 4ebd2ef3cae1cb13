//! A power-loss layer for real member processes: what a SIGKILL does not show.
//!
//! A SIGKILLed process leaves the page cache behind, so a write that was never fsynced still
//! reaches the next start and a missing or misplaced fsync goes unnoticed. Here a member runs
//! with a small interposer preloaded (`powerloss/shim.c`, built with the machine's C
//! compiler). Under the watched directory it journals, before every `write`, `pwrite`,
//! `writev`, `ftruncate` or `O_TRUNC` open of a regular file, the bytes and size the write
//! replaces, and every successful `fsync`/`fdatasync` of such a file as the point up to which
//! its data is durable. It journals every change of a directory entry too (a file created, a
//! directory made or removed, a rename, an unlink; an unlinked or replaced file is kept as a
//! hard link in a stash) and every fsync of a directory, the point up to which that
//! directory's entries are durable: strict POSIX, where a new, renamed or removed name
//! survives a power cut only once its directory has been synced.
//!
//! [`PowerLoss::cut`] is the power cut, applied after the test SIGKILLs the members. First
//! the data: for each file (inode), every write after its last sync is undone, in reverse
//! order, except a seeded-random prefix of them (what the disk happened to write back before
//! the cut, in order). Then the names: for each directory, every entry change after its last
//! sync is undone, newest first, except a seeded-random prefix: a created file or directory
//! disappears (with what is in it), a rename goes back (and a file it replaced comes back), an
//! unlinked file comes back. Then the members start again on what a disk would hold.
//!
//! [`PowerLoss::stop_at_next_sync`] makes a cut land inside an unsynced window: the next
//! process under the layer to fsync one of its files stops itself just before the fsync
//! (the test then SIGKILLs it and cuts), so the cut finds that file's latest writes unsynced
//! rather than, as a kill at a random instant mostly does, nothing (the WAL fsyncs before it
//! acknowledges, and redb keeps its non-durable commits in memory).
//!
//! [`PowerLoss::delay_syncs`] makes one member's disk slow rather than failing: every fsync of
//! its files whose path contains a given part sleeps a given time first (a stalled disk, as in
//! etcd#7617), until [`PowerLoss::end_delay`].
//!
//! What it does not model: reordering of unsynced writes within one file or of entry changes
//! within one directory, and the instant between a directory change and its record (the
//! change is journaled once it succeeded, so a SIGKILL in between keeps it).

use std::collections::HashMap;
use std::fs::OpenOptions;
use std::os::unix::fs::{FileExt, MetadataExt};
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, bail};

const SHIM: &str = include_str!("powerloss/shim.c");

/// The interposer, built, and the journal that the processes preloading it share.
#[derive(Debug)]
pub struct PowerLoss {
    dir: tempfile::TempDir,
    library: PathBuf,
    journal: PathBuf,
    stash: PathBuf,
    /// Exists while a stop at the next sync is armed (see the module docs).
    stop: PathBuf,
    /// Exists while syncs are delayed (see the module docs).
    delay: PathBuf,
}

/// What one power cut undid.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Cut {
    /// Files that had writes no sync covered.
    pub files: usize,
    /// Unsynced writes undone.
    pub undone: usize,
    /// Unsynced writes kept (written back before the cut).
    pub kept: usize,
    /// Directories that had entry changes no sync covered.
    pub dirs: usize,
    /// Unsynced entry changes undone (creations, renames, unlinks, made or removed
    /// directories).
    pub entries_undone: usize,
    /// Unsynced entry changes kept (written back before the cut).
    pub entries_kept: usize,
}

impl std::ops::AddAssign for Cut {
    fn add_assign(&mut self, other: Cut) {
        self.files += other.files;
        self.undone += other.undone;
        self.kept += other.kept;
        self.dirs += other.dirs;
        self.entries_undone += other.entries_undone;
        self.entries_kept += other.entries_kept;
    }
}

impl PowerLoss {
    /// Builds the interposer with `gcc`.
    pub fn build() -> anyhow::Result<PowerLoss> {
        let dir = tempfile::Builder::new()
            .prefix("etcdrs-powerloss-")
            .tempdir()
            .context("power-loss temp dir")?;
        let source = dir.path().join("shim.c");
        let library = dir.path().join("shim.so");
        std::fs::write(&source, SHIM).context("writing the interposer's source")?;
        let status = Command::new("gcc")
            .args(["-shared", "-fPIC", "-O2", "-Wall", "-o"])
            .arg(&library)
            .arg(&source)
            .arg("-ldl")
            .status()
            .context("running gcc")?;
        if !status.success() {
            bail!("gcc failed to build the power-loss interposer: {status}");
        }
        let journal = dir.path().join("journal");
        let stash = dir.path().join("stash");
        std::fs::create_dir(&stash).context("creating the power-loss stash")?;
        let stop = dir.path().join("stop");
        let delay = dir.path().join("delay");
        Ok(PowerLoss {
            dir,
            library,
            journal,
            stash,
            stop,
            delay,
        })
    }

    /// The environment that puts a member's files (everything under the testkit's member
    /// directories) under this layer.
    pub fn env(&self) -> Vec<(String, String)> {
        let watched = std::env::temp_dir().join("etcdrs-member-");
        vec![
            ("LD_PRELOAD".into(), self.library.display().to_string()),
            ("ETCDRS_POWER_DIR".into(), watched.display().to_string()),
            (
                "ETCDRS_POWER_JOURNAL".into(),
                self.journal.display().to_string(),
            ),
            (
                "ETCDRS_POWER_STASH".into(),
                self.stash.display().to_string(),
            ),
            ("ETCDRS_POWER_STOP".into(), self.stop.display().to_string()),
            (
                "ETCDRS_POWER_DELAY".into(),
                self.delay.display().to_string(),
            ),
        ]
    }

    /// A slow disk: from now on every fsync (or fdatasync) of a file under the layer whose
    /// path contains `path_part` (a member's `<data-dir>/member/wal/`, say) sleeps `delay`
    /// before it syncs, until [`PowerLoss::end_delay`].
    pub fn delay_syncs(&self, path_part: &str, delay: std::time::Duration) -> anyhow::Result<()> {
        // Written whole under another name, then renamed: a sync never reads half of it.
        let next = self.dir.path().join("delay.next");
        std::fs::write(&next, format!("{}\n{path_part}", delay.as_micros()))
            .context("writing the sync delay")?;
        std::fs::rename(&next, &self.delay).context("arming the sync delay")
    }

    /// Ends [`PowerLoss::delay_syncs`]: syncs take their own time again.
    pub fn end_delay(&self) -> anyhow::Result<()> {
        match std::fs::remove_file(&self.delay) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                Err(e).context("ending the sync delay")
            }
            _ => Ok(()),
        }
    }

    /// Arms the stop at the next sync: the first process under the layer to fsync (or
    /// fdatasync) one of its regular files whose path contains `path_part` (any file, when it
    /// is empty) stops itself (SIGSTOP) just before that sync, with the file's latest writes
    /// unsynced. [`PowerLoss::stopped_at`] tells when it has.
    pub fn stop_at_next_sync(&self, path_part: &str) -> anyhow::Result<()> {
        let _ = std::fs::remove_file(self.stop_report());
        std::fs::write(&self.stop, path_part).context("arming the stop at the next sync")
    }

    /// The file before whose sync a process stopped itself, once one has since
    /// [`PowerLoss::stop_at_next_sync`]; `None` while the stop is still armed.
    pub fn stopped_at(&self) -> Option<PathBuf> {
        if self.stop.exists() {
            return None;
        }
        let path = std::fs::read_to_string(self.stop_report()).ok()?;
        Some(PathBuf::from(path))
    }

    fn stop_report(&self) -> PathBuf {
        self.dir.path().join("stop.at")
    }

    /// Cuts the power: undoes the unsynced writes and entry changes that the journal holds
    /// (every process under the layer must be dead), keeping a prefix per file and per
    /// directory chosen from `seed`, and starts a fresh journal.
    pub fn cut(&self, seed: u64) -> anyhow::Result<Cut> {
        // One generator for both halves: the data's choices are drawn first, then the names'.
        let rng = std::cell::RefCell::new(SplitMix(seed));
        let draw =
            |n: usize| usize::try_from(rng.borrow_mut().next() % (n as u64 + 1)).unwrap_or(0);
        self.cut_with(draw, draw)
    }

    /// The worst power cut: every unsynced write and entry change is undone.
    pub fn cut_everything(&self) -> anyhow::Result<Cut> {
        self.cut_with(|_| 0, |_| 0)
    }

    /// A cut on a filesystem that wrote its metadata back before the data: every unsynced
    /// write is undone but every entry change is kept, so a file created and written without
    /// an fsync comes back under its name, short or empty (what XFS, or ext4 without
    /// `data=ordered`, can leave after a crash).
    pub fn cut_data_keep_names(&self) -> anyhow::Result<Cut> {
        self.cut_with(|_| 0, |changes| changes)
    }

    /// The cut, with `keep_data(n)` choosing how many of a file's `n` unsynced writes, and
    /// `keep_entries(n)` how many of a directory's `n` unsynced entry changes, reached the
    /// disk (a prefix).
    fn cut_with(
        &self,
        mut keep_data: impl FnMut(usize) -> usize,
        mut keep_entries: impl FnMut(usize) -> usize,
    ) -> anyhow::Result<Cut> {
        let bytes = match std::fs::read(&self.journal) {
            Ok(bytes) => bytes,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Vec::new(),
            Err(e) => return Err(e).context("reading the power-loss journal"),
        };
        let records = parse(&bytes)?;
        let mut cut = Cut::default();
        // A stop still armed is disarmed: the processes are dead.
        let _ = std::fs::remove_file(&self.stop);
        let _ = std::fs::remove_file(self.stop_report());
        undo_writes(&records, &mut keep_data, &mut cut)?;
        undo_entries(&records, &mut keep_entries, &mut cut)?;
        // Whatever the stash still holds was removed for good.
        for entry in std::fs::read_dir(&self.stash).context("reading the stash")? {
            let path = entry.context("reading the stash")?.path();
            std::fs::remove_file(&path)
                .with_context(|| format!("emptying the stash: {}", path.display()))?;
        }
        match std::fs::remove_file(&self.journal) {
            Ok(()) => Ok(cut),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(cut),
            Err(e) => Err(e).context("removing the power-loss journal"),
        }
    }

    /// Where the interposer and journals live.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }
}

/// A file's identity, which renames keep: (device, inode).
type Inode = (u64, u64);

/// The data half of a cut. A file is known by its inode, so that a sync under one name covers
/// writes made under an earlier one; each file's undo is applied wherever the file is now
/// (some name it had, or its stash link).
fn undo_writes(
    records: &[Record],
    keep: &mut impl FnMut(usize) -> usize,
    cut: &mut Cut,
) -> anyhow::Result<()> {
    // Per file, in journal order: the writes after the file's last sync.
    let mut pending: HashMap<Inode, Vec<&Undo>> = HashMap::new();
    let mut order = Vec::new();
    // Every name each file had, the newest last.
    let mut names: HashMap<Inode, Vec<&str>> = HashMap::new();
    for record in records {
        match record {
            Record::Sync { path, inode } => {
                pending.remove(inode);
                names.entry(*inode).or_default().push(path);
            }
            Record::Write(undo) => {
                if !order.contains(&undo.inode) {
                    order.push(undo.inode);
                }
                pending.entry(undo.inode).or_default().push(undo);
                names.entry(undo.inode).or_default().push(&undo.path);
            }
            Record::Create { path, inode } => names.entry(*inode).or_default().push(path),
            Record::Rename {
                to,
                stash,
                inode,
                replaced,
                ..
            } => {
                names.entry(*inode).or_default().push(to);
                if !stash.is_empty() {
                    names.entry(*replaced).or_default().push(stash);
                }
            }
            Record::Unlink { stash, inode, .. } => {
                if !stash.is_empty() {
                    names.entry(*inode).or_default().push(stash);
                }
            }
            Record::DirSync(_) | Record::MakeDir(_) | Record::RemoveDir(_) => {}
        }
    }
    for inode in order {
        let Some(writes) = pending.remove(&inode) else {
            continue;
        };
        cut.files += 1;
        let keep = keep(writes.len()).min(writes.len());
        cut.kept += keep;
        cut.undone += writes.len() - keep;
        let mut candidates = names.get(&inode).into_iter().flatten().rev();
        let Some(path) = candidates.find(|path| is_inode(Path::new(path), inode)) else {
            continue; // removed for good: nothing left to undo
        };
        let file = OpenOptions::new()
            .write(true)
            .open(path)
            .with_context(|| format!("opening {path} to undo its writes"))?;
        for undo in writes[keep..].iter().rev() {
            file.write_all_at(&undo.old, undo.offset)
                .with_context(|| format!("undoing a write to {path}"))?;
            file.set_len(undo.size_before)
                .with_context(|| format!("undoing a write to {path}"))?;
        }
    }
    Ok(())
}

fn is_inode(path: &Path, inode: Inode) -> bool {
    std::fs::symlink_metadata(path).is_ok_and(|m| (m.dev(), m.ino()) == inode)
}

/// The names half of a cut: per directory, the entry changes after its last sync, less a
/// kept prefix, are undone newest first. A rename needs both its directories.
fn undo_entries(
    records: &[Record],
    keep: &mut impl FnMut(usize) -> usize,
    cut: &mut Cut,
) -> anyhow::Result<()> {
    // Per directory: the journal positions of its entry changes since its last sync.
    let mut pending: HashMap<&Path, Vec<usize>> = HashMap::new();
    let mut order: Vec<&Path> = Vec::new();
    for (at, record) in records.iter().enumerate() {
        if let Record::DirSync(dir) = record {
            pending.remove(Path::new(dir));
            continue;
        }
        for dir in record.parents() {
            if !order.contains(&dir) {
                order.push(dir);
            }
            pending.entry(dir).or_default().push(at);
        }
    }
    // A change is durable unless one of its directories lost it.
    let mut lost = vec![false; records.len()];
    for dir in order {
        let Some(changes) = pending.remove(dir) else {
            continue;
        };
        cut.dirs += 1;
        let keep = keep(changes.len()).min(changes.len());
        for &at in &changes[keep..] {
            lost[at] = true;
        }
    }
    for (at, record) in records.iter().enumerate().rev() {
        if record.parents().is_empty() {
            continue;
        }
        if !lost[at] {
            cut.entries_kept += 1;
            continue;
        }
        cut.entries_undone += 1;
        record.undo()?;
    }
    Ok(())
}

struct Undo {
    path: String,
    inode: Inode,
    offset: u64,
    size_before: u64,
    old: Vec<u8>,
}

enum Record {
    Write(Undo),
    Sync {
        path: String,
        inode: Inode,
    },
    DirSync(String),
    Create {
        path: String,
        inode: Inode,
    },
    MakeDir(String),
    RemoveDir(String),
    Rename {
        from: String,
        to: String,
        stash: String,
        inode: Inode,
        /// The file `to` named before, kept in `stash`.
        replaced: Inode,
    },
    Unlink {
        path: String,
        stash: String,
        inode: Inode,
    },
}

fn parent(path: &str) -> &Path {
    Path::new(path).parent().unwrap_or(Path::new("/"))
}

impl Record {
    /// The directories whose entries this record changes.
    fn parents(&self) -> Vec<&Path> {
        match self {
            Record::Write(_) | Record::Sync { .. } | Record::DirSync(_) => Vec::new(),
            Record::Create { path, .. }
            | Record::MakeDir(path)
            | Record::RemoveDir(path)
            | Record::Unlink { path, .. } => vec![parent(path)],
            Record::Rename { from, to, .. } if parent(from) == parent(to) => vec![parent(to)],
            Record::Rename { from, to, .. } => vec![parent(from), parent(to)],
        }
    }

    /// Takes this entry change back, the later ones having been taken back already.
    fn undo(&self) -> anyhow::Result<()> {
        match self {
            Record::Create { path, inode } => {
                if is_inode(Path::new(path), *inode) {
                    std::fs::remove_file(path)
                        .with_context(|| format!("undoing the creation of {path}"))?;
                }
            }
            Record::MakeDir(path) => match std::fs::remove_dir_all(path) {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => {
                    return Err(e).with_context(|| format!("undoing the creation of {path}"));
                }
            },
            Record::RemoveDir(path) => {
                if !Path::new(path).exists() {
                    std::fs::create_dir(path)
                        .with_context(|| format!("undoing the removal of {path}"))?;
                }
            }
            Record::Rename {
                from,
                to,
                stash,
                inode,
                ..
            } => {
                if is_inode(Path::new(to), *inode)
                    && Path::new(from).parent().is_some_and(Path::exists)
                {
                    std::fs::rename(to, from)
                        .with_context(|| format!("undoing the rename of {from} to {to}"))?;
                }
                if !stash.is_empty() && Path::new(stash).exists() {
                    std::fs::rename(stash, to)
                        .with_context(|| format!("bringing {to} back from the stash"))?;
                }
            }
            Record::Unlink { path, stash, .. } => {
                if !stash.is_empty()
                    && Path::new(stash).exists()
                    && Path::new(path).parent().is_some_and(Path::exists)
                {
                    std::fs::rename(stash, path)
                        .with_context(|| format!("bringing {path} back from the stash"))?;
                }
            }
            Record::Write(_) | Record::Sync { .. } | Record::DirSync(_) => {}
        }
        Ok(())
    }
}

/// Reads the journal's fields; a record cut short by the SIGKILL ends it.
struct Reader<'a> {
    bytes: &'a [u8],
    at: usize,
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        let slice = self.bytes.get(self.at..self.at.checked_add(n)?)?;
        self.at += n;
        Some(slice)
    }

    fn u32(&mut self) -> Option<u32> {
        Some(u32::from_le_bytes(self.take(4)?.try_into().ok()?))
    }

    fn u64(&mut self) -> Option<u64> {
        Some(u64::from_le_bytes(self.take(8)?.try_into().ok()?))
    }

    fn bytes(&mut self) -> Option<&'a [u8]> {
        let len = self.u32()? as usize;
        self.take(len)
    }

    fn string(&mut self) -> Option<anyhow::Result<String>> {
        let bytes = self.bytes()?;
        Some(String::from_utf8(bytes.to_vec()).context("journal path"))
    }

    fn inode(&mut self) -> Option<Inode> {
        Some((self.u64()?, self.u64()?))
    }

    /// The next record: `None` at the end (or at a record cut short).
    fn record(&mut self) -> Option<anyhow::Result<Record>> {
        let kind = self.take(1)?[0];
        let path = match self.string()? {
            Ok(path) => path,
            Err(e) => return Some(Err(e)),
        };
        let record = match kind {
            b'W' => {
                let inode = self.inode()?;
                let offset = self.u64()?;
                let size_before = self.u64()?;
                let old = self.bytes()?.to_vec();
                Record::Write(Undo {
                    path,
                    inode,
                    offset,
                    size_before,
                    old,
                })
            }
            b'S' => Record::Sync {
                path,
                inode: self.inode()?,
            },
            b'D' => Record::DirSync(path),
            b'C' => Record::Create {
                path,
                inode: self.inode()?,
            },
            b'M' => Record::MakeDir(path),
            b'X' => Record::RemoveDir(path),
            b'R' => {
                let to = match self.string()? {
                    Ok(to) => to,
                    Err(e) => return Some(Err(e)),
                };
                let stash = match self.string()? {
                    Ok(stash) => stash,
                    Err(e) => return Some(Err(e)),
                };
                Record::Rename {
                    from: path,
                    to,
                    stash,
                    inode: self.inode()?,
                    replaced: self.inode()?,
                }
            }
            b'U' => {
                let stash = match self.string()? {
                    Ok(stash) => stash,
                    Err(e) => return Some(Err(e)),
                };
                Record::Unlink {
                    path,
                    stash,
                    inode: self.inode()?,
                }
            }
            other => {
                return Some(Err(anyhow::anyhow!(
                    "power-loss journal: unknown record kind {other}"
                )));
            }
        };
        Some(Ok(record))
    }
}

/// The journal's records; a record cut short by the SIGKILL ends it.
fn parse(bytes: &[u8]) -> anyhow::Result<Vec<Record>> {
    let mut reader = Reader { bytes, at: 0 };
    let mut records = Vec::new();
    while let Some(record) = reader.record() {
        records.push(record?);
    }
    Ok(records)
}

/// A small seeded generator (SplitMix64): the cut's choices replay from the seed.
struct SplitMix(u64);

impl SplitMix {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Runs Python's `script` under the layer, with `d` bound to `dir`.
    fn under_layer(power: &PowerLoss, dir: &Path, script: &str) {
        let program = format!(
            "import os\nd = {dir:?}\ndef sync_dir(p):\n    f = os.open(p, os.O_RDONLY)\n    os.fsync(f)\n    os.close(f)\ndef put(p, b, sync):\n    f = os.open(p, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)\n    os.write(f, b)\n    if sync:\n        os.fsync(f)\n    os.close(f)\n{script}",
            dir = dir.display().to_string()
        );
        let status = Command::new("python3")
            .args(["-c", &program])
            .envs(power.env())
            .status()
            .unwrap();
        assert!(status.success());
    }

    fn member_dir() -> tempfile::TempDir {
        tempfile::Builder::new()
            .prefix("etcdrs-member-powerloss-selftest-")
            .tempdir()
            .unwrap()
    }

    #[test]
    fn a_cut_undoes_unsynced_writes_and_keeps_synced_ones() {
        let power = PowerLoss::build().unwrap();
        let files = member_dir();
        let path = files.path().join("f");
        // A child process under the layer: a synced write (and its name), then an unsynced
        // one.
        let script = format!(
            "printf synced > {p} && python3 -c 'import os; f=os.open(\"{p}\", os.O_WRONLY|os.O_APPEND); os.fsync(f); d=os.open(\"{d}\", os.O_RDONLY); os.fsync(d); os.write(f, b\"-lost\")'",
            p = path.display(),
            d = files.path().display()
        );
        let status = Command::new("sh")
            .args(["-c", &script])
            .envs(power.env())
            .status()
            .unwrap();
        assert!(status.success());
        assert_eq!(std::fs::read(&path).unwrap(), b"synced-lost");
        // Seeds until one keeps nothing of the one unsynced write (half of them do).
        let cut = (0..64)
            .map(|seed| (seed, SplitMix(seed).next() % 2))
            .find(|(_, keep)| *keep == 0)
            .map(|(seed, _)| power.cut(seed).unwrap())
            .unwrap();
        assert_eq!(
            cut,
            Cut {
                files: 1,
                undone: 1,
                kept: 0,
                dirs: 0,
                entries_undone: 0,
                entries_kept: 1,
            }
        );
        assert_eq!(std::fs::read(&path).unwrap(), b"synced");
    }

    #[test]
    fn a_cut_undoes_entry_changes_that_no_directory_sync_covered() {
        let power = PowerLoss::build().unwrap();
        let files = member_dir();
        let d = files.path();
        // Durable: `kept`, `old`, `gone` and the directory `sub`, all with their data.
        under_layer(
            &power,
            d,
            "put(d + '/kept', b'k', True)\nput(d + '/old', b'old', True)\nput(d + '/gone', b'g', True)\nos.mkdir(d + '/sub')\nsync_dir(d)\nput(d + '/sub/inner', b'i', True)\nsync_dir(d + '/sub')",
        );
        assert_eq!(power.cut_everything().unwrap().entries_undone, 0);
        // Not durable: a new file, a rename over `old`, an unlink, a new directory; `kept`
        // renamed within the synced `sub` stays renamed.
        under_layer(
            &power,
            d,
            "put(d + '/new', b'n', True)\nput(d + '/old.tmp', b'new', True)\nos.rename(d + '/old.tmp', d + '/old')\nos.unlink(d + '/gone')\nos.mkdir(d + '/newdir')\nput(d + '/newdir/x', b'x', True)\nsync_dir(d + '/newdir')\nos.rename(d + '/sub/inner', d + '/sub/moved')\nsync_dir(d + '/sub')",
        );
        let cut = power.cut_everything().unwrap();
        let mut names: Vec<String> = std::fs::read_dir(d)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        // `old.tmp` goes with its own creation; `old` is back from the stash.
        assert_eq!(names, ["gone", "kept", "old", "sub"], "{cut:?}");
        assert_eq!(std::fs::read(d.join("old")).unwrap(), b"old");
        assert_eq!(std::fs::read(d.join("gone")).unwrap(), b"g");
        assert_eq!(std::fs::read(d.join("sub/moved")).unwrap(), b"i");
        assert!(!d.join("sub/inner").exists());
        assert_eq!(cut.entries_undone, 5, "{cut:?}");
        assert_eq!(std::fs::read_dir(power.stash.as_path()).unwrap().count(), 0);
    }
}
