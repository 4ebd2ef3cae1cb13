//! Replay: reading segments back into the state raft restarts from (port of the reading half
//! of etcd `wal/wal.go` `ReadAll` and of `wal/repair.go`'s torn-tail rule). Each segment's
//! header (metadata, snapshot mark, hard state) is checked in place, entries are collected
//! above the latest snapshot mark with raft's overwrite-on-conflict rule, and damage is a
//! torn tail only at the end of the last segment.

use std::fs::File;
use std::io::BufReader;
use std::path::Path;

use crate::error::{CorruptReason, Error, Result};
use crate::record::{Damage, Decoded, Extent, Record, SegmentReader};
use crate::segment::{HEADER_RECORDS, SegmentName};
use crate::types::{EntryRecord, HardState, SnapshotMark, WalState};

/// Read buffer size used while replaying a segment.
const REPLAY_READ_BUFFER: usize = 1 << 16;

/// Segment sequence numbers must be consecutive; a hole means a segment was lost.
pub(super) fn check_consecutive(dir: &Path, segments: &[SegmentName]) -> Result<()> {
    for pair in segments.windows(2) {
        if pair[1].seq != pair[0].seq.saturating_add(1) {
            return Err(Error::Corrupt {
                path: pair[1].path(dir),
                offset: 0,
                reason: CorruptReason::MissingSegment {
                    expected: pair[0].seq.saturating_add(1),
                },
            });
        }
    }
    Ok(())
}
pub(super) fn file_len(file: &File, path: &Path) -> Result<u64> {
    Ok(file.metadata().map_err(Error::io(path))?.len())
}

pub(super) fn corrupt(path: &Path, damage: Damage) -> Error {
    Error::Corrupt {
        path: path.to_path_buf(),
        offset: damage.offset,
        reason: damage.reason,
    }
}

/// Where a segment's records end.
#[derive(Debug)]
pub(super) enum SegmentEnd {
    /// At `records_end`: the end of the file, or the start of zeros that run to it (space
    /// preallocated for records not written yet).
    Clean { records_end: u64 },
    /// A torn tail to cut off (only in the last segment).
    Torn(Damage),
}

/// Replays one segment into `replay`. Returns where its records end: cleanly, or at a torn
/// tail to cut off; only the last segment (`is_last`) may have one, and never inside its
/// header, which `segment::create` synced before the segment became visible.
pub(super) fn replay_segment(
    replay: &mut Replay,
    path: &Path,
    file: &File,
    is_last: bool,
) -> Result<SegmentEnd> {
    let len = file_len(file, path)?;
    let mut reader = SegmentReader::new(BufReader::with_capacity(REPLAY_READ_BUFFER, file), len);
    let mut position = 0;
    let header_cut_short = |position: usize, offset: u64| Error::Corrupt {
        path: path.to_path_buf(),
        offset,
        reason: CorruptReason::BadSegmentHeader { position },
    };
    loop {
        match reader.next().map_err(Error::io(path))? {
            Decoded::Record { offset, record } => {
                replay.apply(path, offset, position, record)?;
                position += 1;
            }
            Decoded::End => {
                if position < HEADER_RECORDS {
                    return Err(header_cut_short(position, reader.offset()));
                }
                return Ok(SegmentEnd::Clean { records_end: len });
            }
            Decoded::ZeroFill { offset } => {
                if position < HEADER_RECORDS {
                    return Err(header_cut_short(position, offset));
                }
                if reader.rest_is_zero().map_err(Error::io(path))? {
                    return Ok(SegmentEnd::Clean {
                        records_end: offset,
                    });
                }
                // Zeros, then data: no write order leaves that behind.
                return Err(Error::Corrupt {
                    path: path.to_path_buf(),
                    offset,
                    reason: CorruptReason::BadLength,
                });
            }
            Decoded::Damaged(damage) => {
                let torn = is_last
                    && position >= HEADER_RECORDS
                    && match damage.extent {
                        Extent::ReachesEof => true,
                        Extent::TornIfRestIsZero => {
                            reader.rest_is_zero().map_err(Error::io(path))?
                        }
                        Extent::Never => false,
                    };
                if torn {
                    return Ok(SegmentEnd::Torn(damage));
                }
                return Err(corrupt(path, damage));
            }
        }
    }
}

/// Replay state, built record by record.
#[derive(Default)]
pub(super) struct Replay {
    metadata: Option<Vec<u8>>,
    hard_state: HardState,
    snapshot: SnapshotMark,
    /// Invariant: contiguous indices, all above `snapshot.index`.
    entries: Vec<EntryRecord>,
}

impl Replay {
    /// Applies one record found at `offset`, the `position`-th record of segment `path`.
    fn apply(&mut self, path: &Path, offset: u64, position: usize, record: Record) -> Result<()> {
        let corrupt = |reason| Error::Corrupt {
            path: path.to_path_buf(),
            offset,
            reason,
        };
        let in_place = match (position, &record) {
            (0, Record::Metadata(_)) => true,
            (1, Record::SnapshotMark(_)) => true,
            (2, Record::HardState(_)) => true,
            (0..HEADER_RECORDS, _) => false,
            (_, Record::Metadata(_)) => false,
            _ => true,
        };
        if !in_place {
            return Err(corrupt(CorruptReason::BadSegmentHeader { position }));
        }
        match record {
            Record::Metadata(metadata) => match &self.metadata {
                None => self.metadata = Some(metadata),
                Some(first) if *first != metadata => {
                    return Err(Error::MetadataConflict {
                        path: path.to_path_buf(),
                    });
                }
                Some(_) => {}
            },
            Record::HardState(hard_state) => self.hard_state = hard_state,
            Record::SnapshotMark(mark) => {
                if mark.index < self.snapshot.index {
                    return Err(corrupt(CorruptReason::SnapshotMarkRegression {
                        from: self.snapshot.index,
                        to: mark.index,
                    }));
                }
                self.snapshot = mark;
                let n_covered = self
                    .entries
                    .iter()
                    .take_while(|entry| entry.index <= mark.index)
                    .count();
                self.entries.drain(..n_covered);
            }
            Record::Entry(entry) => self.push_entry(entry).map_err(corrupt)?,
        }
        Ok(())
    }

    /// Appends `entry`, first dropping any replayed entries at or above its index: raft
    /// only rewrites an index after discarding a conflicting tail.
    fn push_entry(&mut self, entry: EntryRecord) -> Result<(), CorruptReason> {
        if entry.index <= self.snapshot.index {
            return Ok(());
        }
        if let Some(first) = self.entries.first() {
            let first_index = first.index;
            let last_index = first_index + (self.entries.len() as u64 - 1);
            if entry.index > last_index.saturating_add(1) {
                return Err(CorruptReason::IndexGap {
                    last_index,
                    found: entry.index,
                });
            }
            let n_keep =
                usize::try_from(entry.index.saturating_sub(first_index)).unwrap_or(usize::MAX);
            self.entries.truncate(n_keep);
        }
        // An empty list accepts any index: after `release_to` the oldest remaining segment
        // may start above its header's (older) snapshot mark. `finish` checks the result.
        self.entries.push(entry);
        Ok(())
    }

    /// Checks that the entries continue the snapshot and produces the final state.
    pub(super) fn finish(self, oldest_path: &Path) -> Result<WalState> {
        if let Some(first) = self.entries.first()
            && first.index != self.snapshot.index.saturating_add(1)
        {
            return Err(Error::Corrupt {
                path: oldest_path.to_path_buf(),
                offset: 0,
                reason: CorruptReason::IndexGap {
                    last_index: self.snapshot.index,
                    found: first.index,
                },
            });
        }
        Ok(WalState {
            // Every segment's first record is metadata, and there is at least one segment.
            metadata: self.metadata.unwrap_or_default(),
            hard_state: self.hard_state,
            snapshot: self.snapshot,
            entries: self.entries,
        })
    }
}
