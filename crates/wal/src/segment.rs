//! Segment files: naming, listing, and atomically creating a new segment with its header.
//!
//! Port of the file-management half of etcd `wal/util.go` (`walName`, `parseWALName`,
//! `readWALNames`, `isValidSeq`) and of the cut path in `wal/wal.go`. It does not read or
//! interpret records beyond writing a new segment's header.

use std::fs::{self, File, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};

use crate::error::{Error, Result};
use crate::record;
use crate::types::{HardState, SnapshotMark};

/// Suffix of a segment file.
const SEGMENT_SUFFIX: &str = ".wal";
/// Suffix of a segment being created; such files are never replayed and are removed on open.
pub(crate) const TMP_SUFFIX: &str = ".wal.tmp";
/// `%016x-%016x.wal`
const NAME_LEN: usize = 16 + 1 + 16 + SEGMENT_SUFFIX.len();

/// The identity of a segment, as encoded in its file name.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct SegmentName {
    /// Position in the log; consecutive segments have consecutive sequence numbers.
    pub(crate) seq: u64,
    /// `last_index + 1` when the segment was cut. Every live entry in the *previous*
    /// segment has an index below this, which is what makes `release_to` safe.
    pub(crate) first_index: u64,
}

impl SegmentName {
    pub(crate) fn file_name(&self) -> String {
        format!(
            "{:016x}-{:016x}{SEGMENT_SUFFIX}",
            self.seq, self.first_index
        )
    }

    pub(crate) fn path(&self, dir: &Path) -> PathBuf {
        dir.join(self.file_name())
    }

    /// Parses a canonical segment file name; anything else (including upper-case hex) is `None`.
    pub(crate) fn parse(file_name: &str) -> Option<SegmentName> {
        if file_name.len() != NAME_LEN || !file_name.ends_with(SEGMENT_SUFFIX) {
            return None;
        }
        let (seq_hex, rest) = file_name.split_at(16);
        let first_index_hex = rest.strip_prefix('-')?.get(..16)?;
        let is_lower_hex = |text: &str| {
            text.bytes()
                .all(|byte| byte.is_ascii_digit() || (b'a'..=b'f').contains(&byte))
        };
        if !is_lower_hex(seq_hex) || !is_lower_hex(first_index_hex) {
            return None;
        }
        Some(SegmentName {
            seq: u64::from_str_radix(seq_hex, 16).ok()?,
            first_index: u64::from_str_radix(first_index_hex, 16).ok()?,
        })
    }
}

/// What a directory holds, as far as the WAL is concerned.
#[derive(Debug, Default)]
pub(crate) struct Listing {
    /// Segments sorted by sequence number.
    pub(crate) segments: Vec<SegmentName>,
    /// Leftover `*.wal.tmp` files from an interrupted segment creation.
    pub(crate) stale_tmp: Vec<PathBuf>,
    /// Whether anything else is in the directory.
    pub(crate) has_other_files: bool,
}

pub(crate) fn list(dir: &Path) -> Result<Listing> {
    let mut listing = Listing::default();
    for dir_entry in fs::read_dir(dir).map_err(Error::io(dir))? {
        let dir_entry = dir_entry.map_err(Error::io(dir))?;
        let file_name = dir_entry.file_name();
        let Some(file_name) = file_name.to_str() else {
            listing.has_other_files = true;
            continue;
        };
        if let Some(name) = SegmentName::parse(file_name) {
            listing.segments.push(name);
        } else if file_name.ends_with(TMP_SUFFIX) {
            listing.stale_tmp.push(dir_entry.path());
        } else {
            if file_name.ends_with(SEGMENT_SUFFIX) {
                tracing::warn!(dir = %dir.display(), file_name, "ignoring badly named wal file");
            }
            listing.has_other_files = true;
        }
    }
    listing.segments.sort();
    Ok(listing)
}

/// Opens a directory handle, used to fsync the directory and to hold the WAL's lock.
pub(crate) fn open_dir(dir: &Path) -> Result<File> {
    File::open(dir).map_err(Error::io(dir))
}

/// Makes creations, renames and removals of entries in `dir` durable.
pub(crate) fn sync_dir(dir_handle: &File, dir: &Path) -> Result<()> {
    dir_handle.sync_all().map_err(Error::io(dir))
}

/// The header every segment starts with, in this order: metadata, the snapshot mark in
/// effect, the hard state in effect. It makes each segment self-describing, so replay is
/// correct from whichever segment is oldest after `release_to`.
pub(crate) struct SegmentHeader<'a> {
    pub(crate) metadata: &'a [u8],
    pub(crate) snapshot: SnapshotMark,
    pub(crate) hard_state: HardState,
}

/// Number of records in a segment header.
pub(crate) const HEADER_RECORDS: usize = 3;

/// Creates segment `name` in `dir` with its header, atomically: the header is written and
/// synced under a temporary name, then renamed into place and the directory synced. A
/// crash therefore never leaves a visible segment without a complete, durable header.
///
/// Returns the open file, positioned at its end, and its length.
pub(crate) fn create(
    dir: &Path,
    dir_handle: &File,
    name: SegmentName,
    header: &SegmentHeader<'_>,
) -> Result<(File, u64)> {
    let mut buf = Vec::new();
    record::encode_metadata(&mut buf, header.metadata)?;
    record::encode_snapshot_mark(&mut buf, &header.snapshot)?;
    record::encode_hard_state(&mut buf, &header.hard_state)?;

    let final_path = name.path(dir);
    // `<name>.wal` + `.tmp` ends with TMP_SUFFIX, so `list` recognises it as stale.
    let tmp_path = dir.join(format!("{}.tmp", name.file_name()));
    let mut file = OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .open(&tmp_path)
        .map_err(Error::io(&tmp_path))?;
    file.write_all(&buf).map_err(Error::io(&tmp_path))?;
    file.sync_data().map_err(Error::io(&tmp_path))?;
    fs::rename(&tmp_path, &final_path).map_err(Error::io(&final_path))?;
    sync_dir(dir_handle, dir)?;
    Ok((file, buf.len() as u64))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn name_round_trip() {
        let name = SegmentName {
            seq: 0x1f,
            first_index: 0xabc,
        };
        assert_eq!(name.file_name(), "000000000000001f-0000000000000abc.wal");
        assert_eq!(SegmentName::parse(&name.file_name()), Some(name));
    }

    #[test]
    fn rejects_non_canonical_names() {
        for bad in [
            "000000000000001F-0000000000000abc.wal",
            "000000000000001f_0000000000000abc.wal",
            "000000000000001f-0000000000000abc.wa",
            "1f-abc.wal",
            "000000000000001f-0000000000000abc.wal.tmp",
            "+00000000000001f-0000000000000abc.wal",
        ] {
            assert_eq!(SegmentName::parse(bad), None, "{bad}");
        }
    }

    #[test]
    fn list_sorts_and_classifies() {
        let dir = tempfile::tempdir().unwrap();
        let second = SegmentName {
            seq: 2,
            first_index: 9,
        };
        let first = SegmentName {
            seq: 1,
            first_index: 3,
        };
        fs::write(second.path(dir.path()), b"").unwrap();
        fs::write(first.path(dir.path()), b"").unwrap();
        fs::write(
            dir.path().join("0000000000000003-0000000000000010.wal.tmp"),
            b"",
        )
        .unwrap();
        let listing = list(dir.path()).unwrap();
        assert_eq!(listing.segments, vec![first, second]);
        assert_eq!(listing.stale_tmp.len(), 1);
        assert!(!listing.has_other_files);

        fs::write(dir.path().join("notes.txt"), b"").unwrap();
        assert!(list(dir.path()).unwrap().has_other_files);
    }
}
