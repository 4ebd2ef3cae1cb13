//! Tests of the [`Wal`](super::Wal) handle: create and open preconditions, saves and
//! replay, torn tails and damage, snapshot marks, segment cuts and release.

use super::*;
use crate::error::CorruptReason;
use crate::types::EntryRecord;

fn entry(index: u64, term: u64) -> EntryRecord {
    EntryRecord {
        index,
        term,
        data: format!("entry-{index}-{term}").into_bytes(),
    }
}

fn entries(indexes: std::ops::RangeInclusive<u64>, term: u64) -> Vec<EntryRecord> {
    indexes.map(|index| entry(index, term)).collect()
}

fn hard_state(term: u64, vote: u64, commit: u64) -> HardState {
    HardState { term, vote, commit }
}

fn small_segments() -> Options {
    Options {
        segment_size: 256,
        ..Options::default()
    }
}

/// Segment files in `dir`, oldest first.
fn segment_paths(dir: &Path) -> Vec<PathBuf> {
    segment::list(dir)
        .unwrap()
        .segments
        .iter()
        .map(|name| name.path(dir))
        .collect()
}

fn last_segment(dir: &Path) -> PathBuf {
    segment_paths(dir).pop().unwrap()
}

fn file_size(path: &Path) -> u64 {
    fs::metadata(path).unwrap().len()
}

/// Where the records of the segment at `path` end: its length less the zeros preallocated
/// after them.
fn records_end(path: &Path) -> u64 {
    let bytes = fs::read(path).unwrap();
    let mut reader = record::SegmentReader::new(&bytes[..], bytes.len() as u64);
    let mut end = 0;
    while let record::Decoded::Record { .. } = reader.next().unwrap() {
        end = reader.offset();
    }
    end
}

/// A copy of the WAL directory `src` in a fresh temporary directory.
fn copy_wal(src: &Path) -> tempfile::TempDir {
    let copy = tempfile::tempdir().unwrap();
    for dir_entry in fs::read_dir(src).unwrap() {
        let dir_entry = dir_entry.unwrap();
        fs::copy(dir_entry.path(), copy.path().join(dir_entry.file_name())).unwrap();
    }
    copy
}

fn truncate_file(path: &Path, len: u64) {
    OpenOptions::new()
        .write(true)
        .open(path)
        .unwrap()
        .set_len(len)
        .unwrap();
}

fn flip_byte(path: &Path, offset: u64) {
    let mut bytes = fs::read(path).unwrap();
    bytes[offset as usize] ^= 0xff;
    fs::write(path, bytes).unwrap();
}

fn expect_corrupt(dir: &Path) -> (PathBuf, u64, CorruptReason) {
    match Wal::open(dir) {
        Err(Error::Corrupt {
            path,
            offset,
            reason,
        }) => (path, offset, reason),
        Err(other) => panic!("expected Corrupt, got {other:?}"),
        Ok((_, state)) => panic!("expected Corrupt, replayed {state:?}"),
    }
}

#[test]
fn round_trip() {
    let dir = tempfile::tempdir().unwrap();
    let mut wal = Wal::create(dir.path(), b"node=1,cluster=7").unwrap();
    wal.save(Some(hard_state(1, 1, 0)), &entries(1..=3, 1))
        .unwrap();
    wal.save(Some(hard_state(1, 1, 3)), &entries(4..=5, 1))
        .unwrap();
    wal.save(
        None,
        &[EntryRecord {
            index: 6,
            term: 1,
            data: Vec::new(),
        }],
    )
    .unwrap();
    assert_eq!(wal.last_index(), 6);
    drop(wal);

    let (wal, state) = Wal::open(dir.path()).unwrap();
    let mut expected = entries(1..=5, 1);
    expected.push(EntryRecord {
        index: 6,
        term: 1,
        data: Vec::new(),
    });
    assert_eq!(
        state,
        WalState {
            metadata: b"node=1,cluster=7".to_vec(),
            hard_state: hard_state(1, 1, 3),
            snapshot: SnapshotMark::default(),
            entries: expected,
        }
    );
    assert_eq!(wal.last_index(), 6);
}

#[test]
fn fresh_wal_replays_empty_state() {
    let dir = tempfile::tempdir().unwrap();
    drop(Wal::create(dir.path(), b"meta").unwrap());
    let (wal, state) = Wal::open(dir.path()).unwrap();
    assert_eq!(
        state,
        WalState {
            metadata: b"meta".to_vec(),
            ..WalState::default()
        }
    );
    assert_eq!(wal.last_index(), 0);
}

#[test]
fn conflicting_tail_is_overwritten() {
    let dir = tempfile::tempdir().unwrap();
    let mut wal = Wal::create(dir.path(), b"").unwrap();
    wal.save(None, &entries(1..=10, 1)).unwrap();
    // A new leader at term 2 overwrites 6 and 7; 8..=10 are gone.
    wal.save(None, &entries(6..=7, 2)).unwrap();
    assert_eq!(wal.last_index(), 7);
    drop(wal);

    let (mut wal, state) = Wal::open(dir.path()).unwrap();
    let mut expected = entries(1..=5, 1);
    expected.extend(entries(6..=7, 2));
    assert_eq!(state.entries, expected);

    // Overwrite again below the first overwrite, then continue appending.
    wal.save(None, &entries(3..=4, 3)).unwrap();
    wal.save(None, &entries(5..=5, 3)).unwrap();
    drop(wal);
    let (_, state) = Wal::open(dir.path()).unwrap();
    let mut expected = entries(1..=2, 1);
    expected.extend(entries(3..=5, 3));
    assert_eq!(state.entries, expected);
}

#[test]
fn hard_state_last_wins() {
    let dir = tempfile::tempdir().unwrap();
    let mut wal = Wal::create(dir.path(), b"").unwrap();
    wal.save(Some(hard_state(1, 0, 0)), &entries(1..=2, 1))
        .unwrap();
    wal.save(Some(hard_state(2, 3, 2)), &[] as &[EntryRecord])
        .unwrap();
    wal.save(None, &entries(3..=3, 2)).unwrap();
    wal.save(Some(hard_state(2, 3, 1)), &[] as &[EntryRecord])
        .unwrap();
    drop(wal);
    let (_, state) = Wal::open(dir.path()).unwrap();
    // The last written wins, even when it is "smaller": the WAL does not interpret it.
    assert_eq!(state.hard_state, hard_state(2, 3, 1));
    assert_eq!(state.entries.len(), 3);
}

#[test]
fn snapshot_mark_skips_old_entries() {
    let dir = tempfile::tempdir().unwrap();
    let mut wal = Wal::create(dir.path(), b"").unwrap();
    wal.save(Some(hard_state(1, 1, 8)), &entries(1..=10, 1))
        .unwrap();
    wal.save_snapshot_mark(SnapshotMark { index: 6, term: 1 })
        .unwrap();
    wal.save(None, &entries(11..=12, 1)).unwrap();
    drop(wal);

    let (mut wal, state) = Wal::open(dir.path()).unwrap();
    assert_eq!(state.snapshot, SnapshotMark { index: 6, term: 1 });
    assert_eq!(state.entries, entries(7..=12, 1));
    assert_eq!(state.hard_state, hard_state(1, 1, 8));

    // A snapshot beyond every entry (e.g. received from the leader) leaves no entries;
    // the next entry must follow the mark.
    wal.save_snapshot_mark(SnapshotMark { index: 20, term: 2 })
        .unwrap();
    assert_eq!(wal.last_index(), 20);
    assert!(matches!(
        wal.save(None, &entries(22..=22, 2)),
        Err(Error::IndexGap {
            last_index: 20,
            found: 22
        })
    ));
    wal.save(None, &entries(21..=22, 2)).unwrap();
    drop(wal);
    let (_, state) = Wal::open(dir.path()).unwrap();
    assert_eq!(state.snapshot, SnapshotMark { index: 20, term: 2 });
    assert_eq!(state.entries, entries(21..=22, 2));
}

#[test]
fn entries_at_or_below_the_mark_are_ignored() {
    let dir = tempfile::tempdir().unwrap();
    let mut wal = Wal::create(dir.path(), b"").unwrap();
    wal.save(None, &entries(1..=5, 1)).unwrap();
    wal.save_snapshot_mark(SnapshotMark { index: 3, term: 1 })
        .unwrap();
    // Rewriting an index the snapshot covers changes nothing, on disk or in memory.
    wal.save(None, &entries(2..=2, 1)).unwrap();
    assert_eq!(wal.last_index(), 5);
    drop(wal);
    let (_, state) = Wal::open(dir.path()).unwrap();
    assert_eq!(state.entries, entries(4..=5, 1));
}

#[test]
fn save_rejects_gaps_and_mark_regressions_without_writing() {
    let dir = tempfile::tempdir().unwrap();
    let mut wal = Wal::create(dir.path(), b"").unwrap();
    wal.save(None, &entries(1..=3, 1)).unwrap();
    let size_before = records_end(&last_segment(dir.path()));

    let gap_after_last = wal.save(None, &entries(5..=6, 1)).unwrap_err();
    assert!(matches!(
        gap_after_last,
        Error::IndexGap {
            last_index: 3,
            found: 5
        }
    ));
    let hole_in_batch = wal.save(None, &[entry(4, 1), entry(6, 1)]).unwrap_err();
    assert!(matches!(
        hole_in_batch,
        Error::IndexGap {
            last_index: 4,
            found: 6
        }
    ));

    wal.save_snapshot_mark(SnapshotMark { index: 2, term: 1 })
        .unwrap();
    let size_before_regression = records_end(&last_segment(dir.path()));
    let regression = wal
        .save_snapshot_mark(SnapshotMark { index: 1, term: 1 })
        .unwrap_err();
    assert!(matches!(regression, Error::SnapshotMarkRegression { .. }));
    assert_eq!(
        records_end(&last_segment(dir.path())),
        size_before_regression
    );
    assert!(size_before_regression > size_before);

    // The rejections did not poison the handle.
    wal.save(None, &entries(4..=4, 1)).unwrap();
}

/// An entry whose payload is not as long as it says.
struct Lying {
    index: u64,
    announced: usize,
}

impl EntryPayload for Lying {
    fn index(&self) -> u64 {
        self.index
    }

    fn term(&self) -> u64 {
        1
    }

    fn payload_len(&self) -> usize {
        self.announced
    }

    fn write_payload(&self, buf: &mut Vec<u8>) -> std::result::Result<(), String> {
        buf.extend_from_slice(b"three");
        Ok(())
    }
}

#[test]
fn an_entry_longer_or_shorter_than_announced_is_refused_and_nothing_is_written() {
    let dir = tempfile::tempdir().unwrap();
    let mut wal = Wal::create(dir.path(), b"").unwrap();
    wal.save(None, &entries(1..=2, 1)).unwrap();
    let size = records_end(&last_segment(dir.path()));
    for announced in [3, 9] {
        let refused = wal
            .save(
                Some(hard_state(1, 1, 3)),
                &[Lying {
                    index: 3,
                    announced,
                }],
            )
            .unwrap_err();
        assert!(
            matches!(&refused, Error::EntryEncoding { index: 3, reason } if reason.contains(&format!("{announced} announced"))),
            "{refused}"
        );
        assert_eq!(records_end(&last_segment(dir.path())), size);
    }
    // The handle is not poisoned, and the log goes on where it was.
    wal.save(None, &entries(3..=3, 1)).unwrap();
    drop(wal);
    let (_, state) = Wal::open(dir.path()).unwrap();
    assert_eq!(state.entries, entries(1..=3, 1));
}

#[test]
fn empty_save_writes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let mut wal = Wal::create(dir.path(), b"").unwrap();
    let size = records_end(&last_segment(dir.path()));
    wal.save(None, &[] as &[EntryRecord]).unwrap();
    assert_eq!(records_end(&last_segment(dir.path())), size);
}

#[test]
fn one_save_appends_exactly_its_records() {
    let dir = tempfile::tempdir().unwrap();
    let mut wal = Wal::create(dir.path(), b"").unwrap();
    let batch = entries(1..=4, 1);
    let hs = hard_state(1, 1, 2);
    let mut expected = Vec::new();
    for entry in &batch {
        record::encode_entry(&mut expected, entry).unwrap();
    }
    record::encode_hard_state(&mut expected, &hs).unwrap();

    let path = last_segment(dir.path());
    let size_before = records_end(&path);
    wal.save(Some(hs), &batch).unwrap();
    let bytes = fs::read(&path).unwrap();
    let size_after = records_end(&path);
    assert_eq!(
        &bytes[size_before as usize..size_after as usize],
        &expected[..]
    );
}

#[test]
fn rotation_across_segments_and_release_to() {
    let dir = tempfile::tempdir().unwrap();
    let mut wal = Wal::create_with_options(dir.path(), b"meta", small_segments()).unwrap();
    // The only hard state is written into the first segment; after releasing it, the
    // hard state must still come back from later segments' headers.
    wal.save(Some(hard_state(1, 1, 1)), &entries(1..=1, 1))
        .unwrap();
    for index in 2..=60 {
        wal.save(None, &entries(index..=index, 1)).unwrap();
    }
    drop(wal);

    let names = segment::list(dir.path()).unwrap().segments;
    assert!(names.len() >= 5, "expected rotation, got {names:?}");
    for (seq, name) in names.iter().enumerate() {
        assert_eq!(name.seq, seq as u64);
    }
    for path in segment_paths(dir.path()) {
        // A segment is cut once it reaches the limit, so none grows past limit + one save.
        assert!(file_size(&path) < 256 + 64, "{path:?}");
    }

    let (mut wal, state) = Wal::open_with_options(dir.path(), small_segments()).unwrap();
    assert_eq!(state.entries, entries(1..=60, 1));
    assert_eq!(state.metadata, b"meta");

    // release_to is clamped to the snapshot mark: with no mark nothing goes.
    wal.release_to(40).unwrap();
    assert_eq!(segment_paths(dir.path()).len(), names.len());

    wal.save_snapshot_mark(SnapshotMark { index: 40, term: 1 })
        .unwrap();
    wal.release_to(40).unwrap();
    let remaining = segment::list(dir.path()).unwrap().segments;
    assert!(remaining.len() < names.len());
    assert_eq!(remaining.last(), names.last());
    // Every released segment held only entries <= 40: the first remaining segment's
    // successor starts at or below 41 would have allowed releasing more.
    assert!(remaining[0].first_index <= 41);
    if let Some(second) = remaining.get(1) {
        assert!(second.first_index > 41);
    }
    drop(wal);

    let (mut wal, state) = Wal::open_with_options(dir.path(), small_segments()).unwrap();
    assert_eq!(state.snapshot, SnapshotMark { index: 40, term: 1 });
    assert_eq!(state.entries, entries(41..=60, 1));
    assert_eq!(state.hard_state, hard_state(1, 1, 1));
    assert_eq!(state.metadata, b"meta");

    // Releasing everything keeps the tail segment, and replay still works.
    wal.save_snapshot_mark(SnapshotMark { index: 60, term: 1 })
        .unwrap();
    wal.release_to(u64::MAX).unwrap();
    assert_eq!(segment_paths(dir.path()).len(), 1);
    wal.save(Some(hard_state(2, 2, 61)), &entries(61..=61, 2))
        .unwrap();
    drop(wal);
    let (_, state) = Wal::open_with_options(dir.path(), small_segments()).unwrap();
    assert_eq!(state.snapshot, SnapshotMark { index: 60, term: 1 });
    assert_eq!(state.entries, entries(61..=61, 2));
    assert_eq!(state.hard_state, hard_state(2, 2, 61));
}

#[test]
fn overwrite_across_segments_then_release() {
    let dir = tempfile::tempdir().unwrap();
    let mut wal = Wal::create_with_options(dir.path(), b"", small_segments()).unwrap();
    for index in 1..=30 {
        wal.save(None, &entries(index..=index, 1)).unwrap();
    }
    // Overwrite from 10: the entries 10..=30 in older segments are dead.
    wal.save(None, &entries(10..=12, 2)).unwrap();
    for index in 13..=20 {
        wal.save(None, &entries(index..=index, 2)).unwrap();
    }
    wal.save_snapshot_mark(SnapshotMark { index: 15, term: 2 })
        .unwrap();
    wal.release_to(15).unwrap();
    drop(wal);
    let (_, state) = Wal::open_with_options(dir.path(), small_segments()).unwrap();
    assert_eq!(state.entries, entries(16..=20, 2));
}

#[test]
fn torn_tail_at_every_offset_of_last_record_is_repaired() {
    let dir = tempfile::tempdir().unwrap();
    let mut wal = Wal::create(dir.path(), b"meta").unwrap();
    wal.save(Some(hard_state(1, 1, 2)), &entries(1..=3, 1))
        .unwrap();
    let path = last_segment(dir.path());
    let record_start = records_end(&path);
    wal.save(None, &entries(4..=4, 1)).unwrap();
    let record_end = records_end(&path);
    drop(wal);

    for cut in record_start..record_end {
        let copy = copy_wal(dir.path());
        let copy_path = last_segment(copy.path());
        truncate_file(&copy_path, cut);
        let (_, state) = Wal::open(copy.path()).unwrap();
        assert_eq!(state.entries, entries(1..=3, 1), "cut at {cut}");
        assert_eq!(state.hard_state, hard_state(1, 1, 2), "cut at {cut}");
        assert_eq!(file_size(&copy_path), record_start, "cut at {cut}");
    }
}

#[test]
fn torn_batch_replays_a_prefix() {
    let dir = tempfile::tempdir().unwrap();
    let mut wal = Wal::create(dir.path(), b"").unwrap();
    wal.save(Some(hard_state(1, 1, 0)), &entries(1..=2, 1))
        .unwrap();
    let path = last_segment(dir.path());
    let batch_start = records_end(&path);
    wal.save(Some(hard_state(1, 1, 6)), &entries(3..=6, 1))
        .unwrap();
    let batch_end = records_end(&path);
    drop(wal);

    let mut n_entries_seen = 2;
    for cut in batch_start..batch_end {
        let copy = copy_wal(dir.path());
        truncate_file(&last_segment(copy.path()), cut);
        let (_, state) = Wal::open(copy.path()).unwrap();
        // Records survive in order, and the hard state (written last) never survives
        // without all of its batch's entries.
        assert!(state.entries.len() >= n_entries_seen, "cut at {cut}");
        n_entries_seen = state.entries.len();
        assert_eq!(state.entries, entries(1..=n_entries_seen as u64, 1));
        assert_eq!(state.hard_state, hard_state(1, 1, 0), "cut at {cut}");
    }
    assert_eq!(n_entries_seen, 6);
}

#[test]
fn crc_bad_or_zero_filled_tail_is_repaired() {
    let dir = tempfile::tempdir().unwrap();
    let mut wal = Wal::create(dir.path(), b"").unwrap();
    wal.save(None, &entries(1..=3, 1)).unwrap();
    let path = last_segment(dir.path());
    let good_len = records_end(&path);
    wal.save(None, &entries(4..=4, 1)).unwrap();
    let full_len = records_end(&path);
    drop(wal);

    // The last record's payload is damaged (its sector never reached the disk).
    let copy = copy_wal(dir.path());
    flip_byte(&last_segment(copy.path()), full_len - 1);
    let (_, state) = Wal::open(copy.path()).unwrap();
    assert_eq!(state.entries, entries(1..=3, 1));
    assert_eq!(file_size(&last_segment(copy.path())), good_len);

    // The file grew but the new data is zeros (crash before the data blocks were written):
    // the same as space preallocated for records not written yet, so nothing is cut.
    let copy = copy_wal(dir.path());
    let copy_path = last_segment(copy.path());
    truncate_file(&copy_path, good_len);
    truncate_file(&copy_path, good_len + 100);
    let (_, state) = Wal::open(copy.path()).unwrap();
    assert_eq!(state.entries, entries(1..=3, 1));
    assert_eq!(file_size(&copy_path), good_len + 100);

    // A damaged last record followed only by zeros is torn as well.
    let copy = copy_wal(dir.path());
    let copy_path = last_segment(copy.path());
    flip_byte(&copy_path, full_len - 1);
    truncate_file(&copy_path, full_len + 4096);
    let (_, state) = Wal::open(copy.path()).unwrap();
    assert_eq!(state.entries, entries(1..=3, 1));
    assert_eq!(file_size(&copy_path), good_len);
}

#[test]
fn corrupted_byte_in_a_middle_record_is_corrupt() {
    let dir = tempfile::tempdir().unwrap();
    let mut wal = Wal::create(dir.path(), b"").unwrap();
    let path = last_segment(dir.path());
    let mut boundaries = vec![records_end(&path)];
    for index in 1..=5 {
        wal.save(None, &entries(index..=index, 1)).unwrap();
        boundaries.push(records_end(&path));
    }
    drop(wal);

    // Every byte of entry 3's record: length, its complement, CRC, type, payload.
    let (start, end) = (boundaries[2], boundaries[3]);
    for offset in start..end {
        let copy = copy_wal(dir.path());
        let copy_path = last_segment(copy.path());
        flip_byte(&copy_path, offset);
        let (corrupt_path, corrupt_offset, _) = expect_corrupt(copy.path());
        assert_eq!(corrupt_path, copy_path, "byte {offset}");
        assert_eq!(corrupt_offset, start, "byte {offset}");
        // Nothing was repaired behind our back.
        assert_eq!(file_size(&copy_path), file_size(&path));
    }

    // Damage inside the segment header is never treated as a torn tail.
    let copy = copy_wal(dir.path());
    // Metadata is empty, so the header's snapshot mark record starts at byte 13.
    flip_byte(&last_segment(copy.path()), 20);
    let (_, offset, _) = expect_corrupt(copy.path());
    assert_eq!(offset, record::HEADER_LEN as u64);
}

#[test]
fn damage_in_a_non_last_segment_is_corrupt() {
    let dir = tempfile::tempdir().unwrap();
    let mut wal = Wal::create_with_options(dir.path(), b"", small_segments()).unwrap();
    for index in 1..=30 {
        wal.save(None, &entries(index..=index, 1)).unwrap();
    }
    drop(wal);
    let first = segment_paths(dir.path()).remove(0);
    let first_len = file_size(&first);

    // A truncated tail of a segment that has a successor is lost data, not a torn write.
    let copy = copy_wal(dir.path());
    let copy_first = segment_paths(copy.path()).remove(0);
    truncate_file(&copy_first, first_len - 1);
    let (path, _, reason) = expect_corrupt(copy.path());
    assert_eq!(path, copy_first);
    assert_eq!(reason, CorruptReason::TruncatedRecord);

    let copy = copy_wal(dir.path());
    let copy_first = segment_paths(copy.path()).remove(0);
    flip_byte(&copy_first, first_len - 1);
    let (path, _, reason) = expect_corrupt(copy.path());
    assert_eq!(path, copy_first);
    assert!(matches!(reason, CorruptReason::CrcMismatch { .. }));
}

#[test]
fn missing_segment_is_corrupt() {
    let dir = tempfile::tempdir().unwrap();
    let mut wal = Wal::create_with_options(dir.path(), b"", small_segments()).unwrap();
    for index in 1..=30 {
        wal.save(None, &entries(index..=index, 1)).unwrap();
    }
    drop(wal);
    let paths = segment_paths(dir.path());
    assert!(paths.len() >= 3);
    fs::remove_file(&paths[1]).unwrap();
    let (path, _, reason) = expect_corrupt(dir.path());
    assert_eq!(path, paths[2]);
    assert_eq!(reason, CorruptReason::MissingSegment { expected: 1 });
}

#[test]
fn reopen_and_continue_appending_after_repair() {
    let dir = tempfile::tempdir().unwrap();
    let mut wal = Wal::create_with_options(dir.path(), b"m", small_segments()).unwrap();
    for index in 1..=10 {
        wal.save(
            Some(hard_state(1, 1, index - 1)),
            &entries(index..=index, 1),
        )
        .unwrap();
    }
    drop(wal);
    let path = last_segment(dir.path());
    truncate_file(&path, records_end(&path) - 3);

    let (mut wal, state) = Wal::open_with_options(dir.path(), small_segments()).unwrap();
    // The last batch lost its hard state record but kept its entry.
    assert_eq!(state.entries, entries(1..=10, 1));
    assert_eq!(state.hard_state, hard_state(1, 1, 8));
    for index in 11..=25 {
        wal.save(
            Some(hard_state(2, 2, index - 1)),
            &entries(index..=index, 2),
        )
        .unwrap();
    }
    drop(wal);

    let (_, state) = Wal::open_with_options(dir.path(), small_segments()).unwrap();
    let mut expected = entries(1..=10, 1);
    expected.extend(entries(11..=25, 2));
    assert_eq!(state.entries, expected);
    assert_eq!(state.hard_state, hard_state(2, 2, 24));
    assert_eq!(state.metadata, b"m");
}

#[test]
fn create_open_and_exists_preconditions() {
    let root = tempfile::tempdir().unwrap();
    let dir = root.path().join("member").join("wal");
    assert!(!Wal::exists(&dir));
    assert!(matches!(Wal::open(&dir), Err(Error::NotFound { .. })));

    drop(Wal::create(&dir, b"").unwrap());
    assert!(Wal::exists(&dir));
    assert!(matches!(
        Wal::create(&dir, b""),
        Err(Error::AlreadyExists { .. })
    ));

    let empty = root.path().join("empty");
    fs::create_dir(&empty).unwrap();
    assert!(matches!(Wal::open(&empty), Err(Error::NotFound { .. })));
    drop(Wal::create(&empty, b"").unwrap());

    let other = root.path().join("other");
    fs::create_dir(&other).unwrap();
    fs::write(other.join("notes"), b"x").unwrap();
    assert!(matches!(
        Wal::create(&other, b""),
        Err(Error::AlreadyExists { .. })
    ));
}

#[test]
fn one_wal_per_directory() {
    let dir = tempfile::tempdir().unwrap();
    let wal = Wal::create(dir.path(), b"").unwrap();
    assert!(matches!(Wal::open(dir.path()), Err(Error::Locked { .. })));
    drop(wal);
    let (_wal, _) = Wal::open(dir.path()).unwrap();
    assert!(matches!(Wal::open(dir.path()), Err(Error::Locked { .. })));
}

#[test]
fn half_created_segment_is_removed_on_open() {
    let dir = tempfile::tempdir().unwrap();
    let mut wal = Wal::create(dir.path(), b"").unwrap();
    wal.save(None, &entries(1..=2, 1)).unwrap();
    drop(wal);
    let stale = dir.path().join("0000000000000001-0000000000000003.wal.tmp");
    fs::write(&stale, b"partial header").unwrap();

    let (_, state) = Wal::open(dir.path()).unwrap();
    assert_eq!(state.entries, entries(1..=2, 1));
    assert!(!stale.exists());
}

#[test]
fn conflicting_metadata_is_rejected() {
    let dir = tempfile::tempdir().unwrap();
    let mut wal = Wal::create_with_options(dir.path(), b"a", small_segments()).unwrap();
    for index in 1..=10 {
        wal.save(None, &entries(index..=index, 1)).unwrap();
    }
    drop(wal);
    // Rewrite the last segment with a different metadata record but otherwise valid.
    let path = last_segment(dir.path());
    let mut buf = Vec::new();
    record::encode_metadata(&mut buf, b"b").unwrap();
    record::encode_snapshot_mark(&mut buf, &SnapshotMark::default()).unwrap();
    record::encode_hard_state(&mut buf, &HardState::default()).unwrap();
    fs::write(&path, buf).unwrap();
    assert!(matches!(
        Wal::open(dir.path()),
        Err(Error::MetadataConflict { .. })
    ));
}

#[test]
fn the_tail_is_preallocated_and_its_zeros_end_the_records_cleanly() {
    let dir = tempfile::tempdir().unwrap();
    let mut wal = Wal::create(dir.path(), b"p").unwrap();
    wal.save(Some(hard_state(1, 1, 1)), &entries(1..=3, 1))
        .unwrap();
    let path = last_segment(dir.path());
    let written = records_end(&path);
    // Writes go into space allocated ahead of them, a chunk at a time.
    assert_eq!(file_size(&path), PREALLOCATE_CHUNK);
    assert_eq!(wal.tail_len, written);
    drop(wal);

    // Reopening neither cuts nor complains: the zeros are room, not damage.
    let (mut wal, state) = Wal::open(dir.path()).unwrap();
    assert_eq!(state.entries, entries(1..=3, 1));
    assert_eq!(file_size(&path), PREALLOCATE_CHUNK);
    wal.save(Some(hard_state(1, 1, 4)), &entries(4..=4, 1))
        .unwrap();
    drop(wal);
    let (_, state) = Wal::open(dir.path()).unwrap();
    assert_eq!(state.entries, entries(1..=4, 1));
    assert_eq!(state.hard_state, hard_state(1, 1, 4));

    // Data somewhere in the zeros after the records is damage no crash explains.
    let copy = copy_wal(dir.path());
    let copy_path = last_segment(copy.path());
    let end = records_end(&copy_path);
    flip_byte(&copy_path, end + 1000);
    let (corrupt_path, offset, reason) = expect_corrupt(copy.path());
    assert_eq!((corrupt_path, offset), (copy_path, end));
    assert_eq!(reason, CorruptReason::BadLength);
}

#[test]
fn chunks_are_written_with_zeros_only_while_syncs_are_small() {
    let dir = tempfile::tempdir().unwrap();
    let mut wal = Wal::create(dir.path(), b"").unwrap();
    let record = |index: u64, len: usize| EntryRecord {
        index,
        term: 1,
        data: vec![7; len],
    };
    // The first chunk: nothing is known yet, so it is written with zeros, all of it after the
    // segment's header.
    let header = wal.tail_len;
    wal.save(None, &[record(1, 100)]).unwrap();
    let first = wal.write_stats().zeros_written;
    assert_eq!(first, PREALLOCATE_CHUNK - header);
    // Small syncs fill it, and the next chunk is written with zeros too.
    let mut index = 2;
    while wal.allocated == PREALLOCATE_CHUNK {
        wal.save(None, &[record(index, 4000)]).unwrap();
        index += 1;
    }
    let second = wal.write_stats().zeros_written;
    assert!(second > first, "{second} after {first}");
    // Syncs of 512 KiB fill the second chunk in a few: the third is left unwritten.
    while wal.allocated == 2 * PREALLOCATE_CHUNK {
        wal.save(None, &[record(index, 512 * 1024)]).unwrap();
        index += 1;
    }
    assert_eq!(wal.write_stats().zeros_written, second);
    drop(wal);
    // Unwritten space reads as zeros: the records end cleanly before it.
    let (_, state) = Wal::open(dir.path()).unwrap();
    assert_eq!(state.entries.len() as u64, index - 1);
}

#[test]
fn preallocation_stops_at_the_segment_size() {
    let dir = tempfile::tempdir().unwrap();
    let mut wal = Wal::create_with_options(dir.path(), b"", small_segments()).unwrap();
    for index in 1..=40 {
        wal.save(None, &entries(index..=index, 1)).unwrap();
    }
    let paths = segment_paths(dir.path());
    let (tail, closed) = paths.split_last().unwrap();
    // A cut segment holds its records and nothing else; the tail is allocated up to the
    // segment size, and grows past it only by the save that fills it.
    for path in closed {
        assert_eq!(file_size(path), records_end(path), "{path:?}");
    }
    let tail_len = file_size(tail);
    assert!(
        tail_len == 256 || tail_len == records_end(tail) && tail_len > 256,
        "{tail:?}: {tail_len} bytes"
    );
}

#[test]
fn a_hard_state_changing_only_the_commit_index_is_written_without_a_sync() {
    let dir = tempfile::tempdir().unwrap();
    let mut wal = Wal::create(dir.path(), b"meta").unwrap();
    wal.save(Some(hard_state(1, 1, 0)), &entries(1..=2, 1))
        .unwrap();
    let synced = wal.write_stats().syncs;
    // The commit index alone: written, not synced.
    wal.save(Some(hard_state(1, 1, 2)), &[] as &[EntryRecord])
        .unwrap();
    assert_eq!(wal.write_stats().syncs, synced);
    // Entries, a new term or a vote each need the sync.
    wal.save(None, &entries(3..=3, 1)).unwrap();
    assert_eq!(wal.write_stats().syncs, synced + 1);
    wal.save(Some(hard_state(2, 1, 2)), &[] as &[EntryRecord])
        .unwrap();
    assert_eq!(wal.write_stats().syncs, synced + 2);
    wal.save(Some(hard_state(2, 3, 2)), &[] as &[EntryRecord])
        .unwrap();
    assert_eq!(wal.write_stats().syncs, synced + 3);
    drop(wal);
    // Written all the same: a clean reopen reads the last commit index.
    let (_, state) = Wal::open(dir.path()).unwrap();
    assert_eq!(state.hard_state, hard_state(2, 3, 2));
}
