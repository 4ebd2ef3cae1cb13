//! A power-loss layer for real member processes: what a SIGKILL does not show.
//!
//! A SIGKILLed process leaves the page cache behind, so a write that was never fsynced still
//! reaches the next start and a missing or misplaced fsync goes unnoticed. Here a member runs
//! with a small interposer preloaded (`powerloss/shim.c`, built with the machine's C
//! compiler): before every `write`, `pwrite`, `writev` or `ftruncate` of a regular file under
//! the watched directory it journals the bytes and size the write replaces, and every
//! successful `fsync`/`fdatasync` of such a file is journaled as the point up to which the
//! file is durable. [`PowerLoss::cut`] is the power cut, applied after the test SIGKILLs the
//! members: for each file, every write after its last sync is undone, in reverse order,
//! except a seeded-random prefix of them (what the disk happened to write back before the
//! cut, in order). Then the members start again on what a disk would hold.
//!
//! What it does not model: directory entries (a create, rename or unlink is kept even if the
//! directory was never synced) and reordering of unsynced writes within one file.

use std::collections::HashMap;
use std::fs::OpenOptions;
use std::os::unix::fs::FileExt;
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
}

impl std::ops::AddAssign for Cut {
    fn add_assign(&mut self, other: Cut) {
        self.files += other.files;
        self.undone += other.undone;
        self.kept += other.kept;
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
        Ok(PowerLoss {
            dir,
            library,
            journal,
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
        ]
    }

    /// Cuts the power: undoes the unsynced writes that the journal holds (every process under
    /// the layer must be dead), keeping a prefix per file chosen from `seed`, and starts a
    /// fresh journal.
    pub fn cut(&self, seed: u64) -> anyhow::Result<Cut> {
        let mut rng = SplitMix(seed);
        self.cut_with(|writes| usize::try_from(rng.next() % (writes as u64 + 1)).unwrap_or(0))
    }

    /// The worst power cut: every unsynced write is undone.
    pub fn cut_everything(&self) -> anyhow::Result<Cut> {
        self.cut_with(|_| 0)
    }

    /// The cut, with `keep(n)` choosing how many of a file's `n` unsynced writes reached the
    /// disk (a prefix).
    fn cut_with(&self, mut keep: impl FnMut(usize) -> usize) -> anyhow::Result<Cut> {
        let bytes = match std::fs::read(&self.journal) {
            Ok(bytes) => bytes,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Vec::new(),
            Err(e) => return Err(e).context("reading the power-loss journal"),
        };
        // Per file, in journal order: the writes after the file's last sync.
        let mut pending: HashMap<String, Vec<Undo>> = HashMap::new();
        let mut order = Vec::new();
        for record in parse(&bytes)? {
            match record {
                Record::Sync(path) => {
                    pending.remove(&path);
                }
                Record::Write(undo) => {
                    if !order.contains(&undo.path) {
                        order.push(undo.path.clone());
                    }
                    pending.entry(undo.path.clone()).or_default().push(undo);
                }
            }
        }
        let mut cut = Cut::default();
        for path in order {
            let Some(writes) = pending.remove(&path) else {
                continue;
            };
            cut.files += 1;
            let keep = keep(writes.len()).min(writes.len());
            cut.kept += keep;
            cut.undone += writes.len() - keep;
            let Ok(file) = OpenOptions::new().write(true).open(&path) else {
                continue; // removed since: nothing left to undo
            };
            for undo in writes[keep..].iter().rev() {
                file.write_all_at(&undo.old, undo.offset)
                    .with_context(|| format!("undoing a write to {path}"))?;
                file.set_len(undo.size_before)
                    .with_context(|| format!("undoing a write to {path}"))?;
            }
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

struct Undo {
    path: String,
    offset: u64,
    size_before: u64,
    old: Vec<u8>,
}

enum Record {
    Write(Undo),
    Sync(String),
}

/// The journal's records; a record cut short by the SIGKILL ends it.
fn parse(bytes: &[u8]) -> anyhow::Result<Vec<Record>> {
    let mut records = Vec::new();
    let mut at = 0;
    let take = |at: &mut usize, n: usize| -> Option<&[u8]> {
        let slice = bytes.get(*at..*at + n)?;
        *at += n;
        Some(slice)
    };
    loop {
        let Some(kind) = take(&mut at, 1) else {
            return Ok(records);
        };
        let kind = kind[0];
        let Some(len) = take(&mut at, 4) else {
            return Ok(records);
        };
        let len = u32::from_le_bytes(len.try_into()?) as usize;
        let Some(path) = take(&mut at, len) else {
            return Ok(records);
        };
        let path = String::from_utf8(path.to_vec()).context("journal path")?;
        match kind {
            b'S' => records.push(Record::Sync(path)),
            b'W' => {
                let (Some(offset), Some(size), Some(old_len)) =
                    (take(&mut at, 8), take(&mut at, 8), take(&mut at, 4))
                else {
                    return Ok(records);
                };
                let offset = u64::from_le_bytes(offset.try_into()?);
                let size_before = u64::from_le_bytes(size.try_into()?);
                let old_len = u32::from_le_bytes(old_len.try_into()?) as usize;
                let Some(old) = take(&mut at, old_len) else {
                    return Ok(records);
                };
                records.push(Record::Write(Undo {
                    path,
                    offset,
                    size_before,
                    old: old.to_vec(),
                }));
            }
            other => bail!("power-loss journal: unknown record kind {other}"),
        }
    }
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

    #[test]
    fn a_cut_undoes_unsynced_writes_and_keeps_synced_ones() {
        let power = PowerLoss::build().unwrap();
        let files = tempfile::Builder::new()
            .prefix("etcdrs-member-powerloss-selftest-")
            .tempdir()
            .unwrap();
        let path = files.path().join("f");
        // A child process under the layer: a synced write, then an unsynced one.
        let script = format!(
            "printf synced > {p} && python3 -c 'import os; f=os.open(\"{p}\", os.O_WRONLY|os.O_APPEND); os.fsync(f); os.write(f, b\"-lost\")'",
            p = path.display()
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
                kept: 0
            }
        );
        assert_eq!(std::fs::read(&path).unwrap(), b"synced");
    }
}
