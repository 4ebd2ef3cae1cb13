//! Reading etcd's WAL: segment names, record framing, and the two passes etcd makes at start.
//!
//! Port of the reading half of etcd 3.4/3.5 `wal/` (`decoder.go`, `util.go`, and `wal.go`'s
//! `ValidSnapshotEntries`, `selectWALFiles` and `ReadAll`). Nothing here writes: where etcd
//! repairs a torn tail (truncating the last segment, zeroing what follows the last good
//! record), this reader stops at the same place and reports it in [`WalContents::torn_tail`].
//!
//! # Format
//!
//! A segment is named `%016x-%016x.wal` (sequence, index of the first entry it may hold) and
//! is a run of frames: an 8-byte little-endian length word, then a `walpb.Record`, then
//! padding to the next 8-byte boundary. The low 56 bits of the word are the record's size;
//! when the top bit is set, its low 3 bits are the padding size. A zero word (etcd
//! preallocates segments with zeros) ends the segment. Every record but a crc record carries
//! the CRC-32C of all records' data so far, across segments; a segment begins with a crc
//! record holding the value the previous segment ended with.
//!
//! # Torn writes (etcd's rule, matched here)
//!
//! The decoder reports `io.ErrUnexpectedEOF` for a frame cut short or whose length runs past
//! the end of the file (in any segment), and for a record that fails to decode or to check
//! when it is in the last segment and one of its 512-byte sectors is all zeros (a torn
//! write). etcd's server then runs `wal.Repair`, which truncates the *last* segment at the
//! last good record, and reads again; a short frame in an earlier segment fails the second
//! read too, and etcd refuses to start. So: a torn record in the last segment ends the log
//! there; anywhere else it is [`Error::WalTornRecord`]. Any other CRC or decode failure is an
//! error wherever it is. A record longer than 10 MiB, which etcd 3.4 refused and 3.5 writes
//! and reads, is read.

use std::path::{Path, PathBuf};

use prost::Message as _;
use raft::eraftpb::{Entry, HardState};

use crate::error::{Error, Result};
use crate::pb::{Record, WalSnapshot, record_type};

/// The sector size etcd's torn-write check assumes (`minSectorSize`).
const SECTOR_BYTES: u64 = 512;

/// The size of a frame's length word (`frameSizeBytes`).
const FRAME_WORD_BYTES: u64 = 8;

/// One WAL segment file.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Segment {
    /// The file.
    pub path: PathBuf,
    /// The sequence number in its name.
    pub seq: u64,
    /// The raft index in its name: the first entry the segment may hold.
    pub index: u64,
}

/// Parses a segment name, `%016x-%016x.wal`, into (sequence, index).
///
/// etcd scans the name with `fmt.Sscanf`; this accepts exactly the names etcd writes.
pub fn parse_wal_name(name: &str) -> Option<(u64, u64)> {
    let stem = name.strip_suffix(".wal")?;
    let (seq, index) = stem.split_once('-')?;
    if seq.len() != 16 || index.len() != 16 {
        return None;
    }
    let seq = u64::from_str_radix(seq, 16).ok()?;
    let index = u64::from_str_radix(index, 16).ok()?;
    Some((seq, index))
}

/// Lists the segments of `wal_dir` in name order, skipping other files (etcd ignores them
/// with a warning, and `.tmp` leftovers silently).
pub fn list_segments(wal_dir: &Path) -> Result<Vec<Segment>> {
    let io_error = |source| Error::Io {
        path: wal_dir.to_path_buf(),
        source,
    };
    let mut segments = Vec::new();
    for dir_entry in std::fs::read_dir(wal_dir).map_err(io_error)? {
        let dir_entry = dir_entry.map_err(io_error)?;
        let name = dir_entry.file_name();
        let Some(name) = name.to_str() else { continue };
        if let Some((seq, index)) = parse_wal_name(name) {
            segments.push(Segment {
                path: dir_entry.path(),
                seq,
                index,
            });
        }
    }
    // The names are fixed-width hex, so name order is (sequence, index) order, as etcd's
    // sorted directory listing gives it.
    segments.sort_by(|a, b| a.path.cmp(&b.path));
    Ok(segments)
}

/// Where a torn record at the end of the last segment was found (etcd would truncate there).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TornTail {
    /// The last segment.
    pub path: PathBuf,
    /// Offset of the torn record's length word: the end of the last good record.
    pub offset: u64,
}

/// A decoded record and where it was.
struct Located {
    record: Record,
    segment: usize,
    offset: u64,
}

/// What one decode step gives: etcd's `nil`, `io.EOF` and `io.ErrUnexpectedEOF`.
enum Step {
    Record(Located),
    End,
    Torn { segment: usize, offset: u64 },
}

/// etcd's `decoder` over a run of segments, one file in memory at a time.
struct Decoder<'a> {
    segments: &'a [Segment],
    current: usize,
    bytes: Option<Vec<u8>>,
    /// Offset in the current segment just past the last good record (`lastValidOff`).
    offset: u64,
    /// The rolling CRC.
    crc: u32,
}

impl<'a> Decoder<'a> {
    fn new(segments: &'a [Segment]) -> Self {
        Decoder {
            segments,
            current: 0,
            bytes: None,
            offset: 0,
            crc: 0,
        }
    }

    fn path(&self, segment: usize) -> PathBuf {
        self.segments
            .get(segment)
            .map(|s| s.path.clone())
            .unwrap_or_default()
    }

    fn next_segment(&mut self) {
        self.current += 1;
        self.bytes = None;
        self.offset = 0;
    }

    fn decode(&mut self) -> Result<Step> {
        loop {
            let Some(segment) = self.segments.get(self.current) else {
                return Ok(Step::End);
            };
            if self.bytes.is_none() {
                let bytes = std::fs::read(&segment.path).map_err(|source| Error::Io {
                    path: segment.path.clone(),
                    source,
                })?;
                self.bytes = Some(bytes);
            }
            let is_last = self.current + 1 == self.segments.len();
            let bytes = self.bytes.as_deref().unwrap_or_default();
            let offset = self.offset;
            let rest = bytes.get(to_usize(offset)..).unwrap_or_default();
            if rest.is_empty() {
                self.next_segment();
                continue;
            }
            let Some(word) = rest.first_chunk::<8>() else {
                // A partial length word: Go's binary.Read reports io.ErrUnexpectedEOF.
                return Ok(Step::Torn {
                    segment: self.current,
                    offset,
                });
            };
            let word = u64::from_le_bytes(*word);
            if word == 0 {
                // Preallocated space: the segment ends here.
                self.next_segment();
                continue;
            }
            // A length past the end of the file is a frame cut short (etcd 3.5's check; 3.4
            // refused any record over 10 MiB instead, which 3.5 can write).
            let (record_bytes, pad_bytes) = decode_frame_size(word);
            let frame_len = to_usize(record_bytes.saturating_add(pad_bytes));
            let Some(frame) = rest.get(8..).and_then(|r| r.get(..frame_len)) else {
                return Ok(Step::Torn {
                    segment: self.current,
                    offset,
                });
            };
            let record_data = &frame[..to_usize(record_bytes)];
            let torn = || is_last && is_torn(frame, offset + FRAME_WORD_BYTES);
            let record = match Record::decode(record_data) {
                Ok(record) => record,
                Err(_) if torn() => {
                    return Ok(Step::Torn {
                        segment: self.current,
                        offset,
                    });
                }
                Err(e) => {
                    return Err(Error::WalDecode {
                        path: segment.path.clone(),
                        offset,
                        what: "walpb.Record",
                        reason: e.to_string(),
                    });
                }
            };
            if record.r#type != record_type::CRC {
                let computed = etcdrs_crc32c::update(self.crc, &record.data);
                if record.crc != computed {
                    if torn() {
                        return Ok(Step::Torn {
                            segment: self.current,
                            offset,
                        });
                    }
                    return Err(Error::WalRecordCrcMismatch {
                        path: segment.path.clone(),
                        offset,
                        stored: record.crc,
                        computed,
                    });
                }
                self.crc = computed;
            }
            self.offset = offset + FRAME_WORD_BYTES + record_bytes + pad_bytes;
            return Ok(Step::Record(Located {
                record,
                segment: self.current,
                offset,
            }));
        }
    }

    /// A crc record: checks it against the rolling CRC (unless this decoder has seen no data
    /// yet) and continues from its value.
    fn apply_crc_record(&mut self, located: &Located) -> Result<()> {
        if self.crc != 0 && located.record.crc != self.crc {
            return Err(Error::WalCrcMismatch {
                path: self.path(located.segment),
                offset: located.offset,
                stored: located.record.crc,
                computed: self.crc,
            });
        }
        self.crc = located.record.crc;
        Ok(())
    }
}

fn to_usize(n: u64) -> usize {
    usize::try_from(n).unwrap_or(usize::MAX)
}

/// Splits a length word into (record bytes, padding bytes) (etcd `decodeFrameSize`).
fn decode_frame_size(word: u64) -> (u64, u64) {
    let record_bytes = word & !(0xff << 56);
    let pad_bytes = if word >> 63 == 1 {
        (word >> 56) & 0x7
    } else {
        0
    };
    (record_bytes, pad_bytes)
}

/// etcd's `isTornEntry`: whether any 512-byte sector the frame (starting at `file_offset`)
/// touches is all zeros, the trace of a write that did not reach the disk.
fn is_torn(frame: &[u8], file_offset: u64) -> bool {
    let mut file_offset = file_offset;
    let mut rest = frame;
    while !rest.is_empty() {
        let in_sector = to_usize(SECTOR_BYTES - file_offset % SECTOR_BYTES).min(rest.len());
        let (chunk, tail) = rest.split_at(in_sector);
        if chunk.iter().all(|&b| b == 0) {
            return true;
        }
        file_offset += in_sector as u64;
        rest = tail;
    }
    false
}

fn decode_raft<M: protobuf::Message>(
    located: &Located,
    segments: &[Segment],
    what: &'static str,
) -> Result<M> {
    M::parse_from_bytes(&located.record.data).map_err(|e| Error::WalDecode {
        path: segments
            .get(located.segment)
            .map(|s| s.path.clone())
            .unwrap_or_default(),
        offset: located.offset,
        what,
        reason: e.to_string(),
    })
}

fn decode_wal_snapshot(located: &Located, segments: &[Segment]) -> Result<WalSnapshot> {
    WalSnapshot::decode(located.record.data.as_slice()).map_err(|e| Error::WalDecode {
        path: segments
            .get(located.segment)
            .map(|s| s.path.clone())
            .unwrap_or_default(),
        offset: located.offset,
        what: "walpb.Snapshot",
        reason: e.to_string(),
    })
}

/// etcd's `wal.ValidSnapshotEntries`: every snapshot record in the whole WAL whose index is
/// at most the last hard state's commit. Reading stops quietly at a torn record anywhere
/// (etcd reads in read-only mode here).
pub fn valid_snapshot_entries(segments: &[Segment]) -> Result<Vec<WalSnapshot>> {
    let mut decoder = Decoder::new(segments);
    let mut snapshots = Vec::new();
    let mut commit = 0;
    while let Step::Record(located) = decoder.decode()? {
        match located.record.r#type {
            record_type::SNAPSHOT => snapshots.push(decode_wal_snapshot(&located, segments)?),
            record_type::STATE => {
                commit = decode_raft::<HardState>(&located, segments, "raftpb.HardState")?.commit;
            }
            record_type::CRC => decoder.apply_crc_record(&located)?,
            _ => {}
        }
    }
    snapshots.retain(|snapshot| snapshot.index <= commit);
    Ok(snapshots)
}

/// What etcd's `ReadAll` returns, from the snapshot given on.
#[derive(Debug)]
pub struct WalContents {
    /// The metadata record's data and where the first one was.
    pub metadata: Option<(Vec<u8>, PathBuf, u64)>,
    /// The last hard state record.
    pub hard_state: HardState,
    /// The entries after the snapshot, later ones overwriting earlier ones at the same index.
    pub entries: Vec<Entry>,
    /// Where reading stopped at a torn record in the last segment, if it did.
    pub torn_tail: Option<TornTail>,
}

/// etcd's `selectWALFiles`: the segments to read for a snapshot at `index`, from the last one
/// whose name index is at most `index`, checked for consecutive sequence numbers.
pub fn select_segments<'a>(
    wal_dir: &Path,
    segments: &'a [Segment],
    index: u64,
) -> Result<&'a [Segment]> {
    let Some(first) = segments.iter().rposition(|segment| segment.index <= index) else {
        return Err(Error::WalFileNotFound {
            dir: wal_dir.to_path_buf(),
            index,
        });
    };
    let selected = &segments[first..];
    // etcd's isValidSeq compares only after a non-zero sequence number; kept as it is.
    for pair in selected.windows(2) {
        if let [previous, next] = pair
            && previous.seq != 0
            && previous.seq.checked_add(1) != Some(next.seq)
        {
            return Err(Error::WalSequenceGap {
                previous: previous.path.clone(),
                next: next.path.clone(),
            });
        }
    }
    Ok(selected)
}

/// etcd's `ReadAll` as the server runs it at start (open at the snapshot, read everything,
/// repair a torn last segment once): the metadata, the last hard state and the entries after
/// the snapshot `(index, term)`.
pub fn read_all(wal_dir: &Path, segments: &[Segment], start: (u64, u64)) -> Result<WalContents> {
    let (start_index, start_term) = start;
    let segments = select_segments(wal_dir, segments, start_index)?;
    let mut decoder = Decoder::new(segments);
    let mut contents = WalContents {
        metadata: None,
        hard_state: HardState::default(),
        entries: Vec::new(),
        torn_tail: None,
    };
    let mut matched = false;
    loop {
        let located = match decoder.decode()? {
            Step::Record(located) => located,
            Step::End => break,
            Step::Torn { segment, offset } => {
                let path = decoder.path(segment);
                if segment + 1 == segments.len() {
                    contents.torn_tail = Some(TornTail { path, offset });
                    break;
                }
                return Err(Error::WalTornRecord { path, offset });
            }
        };
        let path = || decoder.path(located.segment);
        match located.record.r#type {
            record_type::ENTRY => {
                let entry: Entry = decode_raft(&located, segments, "raftpb.Entry")?;
                if entry.index > start_index {
                    let keep = entry.index - start_index - 1;
                    if keep > contents.entries.len() as u64 {
                        return Err(Error::WalSliceOutOfRange {
                            path: path(),
                            offset: located.offset,
                            index: entry.index,
                            start: start_index,
                            entries: contents.entries.len(),
                        });
                    }
                    // A later entry at an index already read replaces it and everything
                    // after it: the leader that wrote it overruled the old tail.
                    contents.entries.truncate(to_usize(keep));
                    contents.entries.push(entry);
                }
            }
            record_type::STATE => {
                contents.hard_state = decode_raft(&located, segments, "raftpb.HardState")?;
            }
            record_type::METADATA => match &contents.metadata {
                Some((first, _, _)) if *first != located.record.data => {
                    return Err(Error::WalMetadataConflict {
                        path: path(),
                        offset: located.offset,
                    });
                }
                Some(_) => {}
                None => {
                    contents.metadata = Some((located.record.data.clone(), path(), located.offset));
                }
            },
            record_type::CRC => decoder.apply_crc_record(&located)?,
            record_type::SNAPSHOT => {
                let snapshot = decode_wal_snapshot(&located, segments)?;
                if snapshot.index == start_index {
                    if snapshot.term != start_term {
                        return Err(Error::WalSnapshotMismatch {
                            path: path(),
                            offset: located.offset,
                            index: start_index,
                            found: snapshot.term,
                            expected: start_term,
                        });
                    }
                    matched = true;
                }
            }
            other => {
                return Err(Error::WalUnexpectedRecordType {
                    path: path(),
                    offset: located.offset,
                    record_type: other,
                });
            }
        }
    }
    if !matched {
        return Err(Error::WalSnapshotNotFound {
            dir: wal_dir.to_path_buf(),
            index: start_index,
            term: start_term,
        });
    }
    Ok(contents)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wal_names() {
        assert_eq!(
            parse_wal_name("0000000000000001-00000000000000ff.wal"),
            Some((1, 255))
        );
        assert_eq!(
            parse_wal_name("0000000000000001-00000000000000ff.wal.tmp"),
            None
        );
        assert_eq!(parse_wal_name("1-2.wal"), None);
        assert_eq!(
            parse_wal_name("000000000000000g-0000000000000000.wal"),
            None
        );
    }

    #[test]
    fn frame_size() {
        // etcd's encodeFrameSize for 13 bytes: 3 bytes of padding, flagged in the top byte.
        let word = 13u64 | ((0x80u64 | 3) << 56);
        assert_eq!(decode_frame_size(word), (13, 3));
        assert_eq!(decode_frame_size(16), (16, 0));
    }

    #[test]
    fn torn_sectors() {
        let mut frame = vec![1u8; 1024];
        assert!(!is_torn(&frame, 8));
        // The second sector the frame touches (file bytes 512..1024) is zero.
        frame[504..1016].fill(0);
        assert!(is_torn(&frame, 8));
    }

    /// Frames records as etcd's encoder does, rolling the CRC; for the cases a real etcd
    /// does not produce on demand (several segments, overwritten entries, damage in an
    /// earlier segment).
    struct Writer {
        crc: u32,
        bytes: Vec<u8>,
    }

    impl Writer {
        fn record(&mut self, r#type: i64, data: Vec<u8>) -> u64 {
            let crc = if r#type == record_type::CRC {
                self.crc
            } else {
                self.crc = etcdrs_crc32c::update(self.crc, &data);
                self.crc
            };
            let encoded = prost::Message::encode_to_vec(&Record { r#type, crc, data });
            let pad = (8 - encoded.len() % 8) % 8;
            let mut word = encoded.len() as u64;
            if pad != 0 {
                word |= (0x80 | pad as u64) << 56;
            }
            let offset = self.bytes.len() as u64;
            self.bytes.extend_from_slice(&word.to_le_bytes());
            self.bytes.extend_from_slice(&encoded);
            self.bytes.extend(std::iter::repeat_n(0u8, pad));
            offset
        }

        fn entry(&mut self, index: u64, term: u64) -> u64 {
            let entry = Entry {
                index,
                term,
                data: vec![7u8; 20].into(),
                ..Entry::default()
            };
            let data = protobuf::Message::write_to_bytes(&entry).expect("encodes");
            self.record(record_type::ENTRY, data)
        }

        /// Starts a segment: etcd's crc, metadata and (first segment) snapshot records.
        fn start(&mut self, metadata: &[u8]) {
            self.bytes.clear();
            self.record(record_type::CRC, Vec::new());
            self.record(record_type::METADATA, metadata.to_vec());
        }

        fn save(&self, dir: &Path, seq: u64, index: u64) -> Segment {
            let path = dir.join(format!("{seq:016x}-{index:016x}.wal"));
            let mut bytes = self.bytes.clone();
            bytes.extend(std::iter::repeat_n(0u8, 4096)); // preallocated
            std::fs::write(&path, bytes).expect("write a segment");
            Segment { path, seq, index }
        }
    }

    fn snapshot_record(index: u64, term: u64) -> Vec<u8> {
        prost::Message::encode_to_vec(&WalSnapshot {
            index,
            term,
            conf_state: None,
        })
    }

    #[test]
    fn two_segments_and_overwritten_entries() {
        let dir = tempfile::tempdir().expect("temp dir");
        let mut writer = Writer {
            crc: 0,
            bytes: Vec::new(),
        };
        writer.start(b"meta");
        writer.record(record_type::SNAPSHOT, snapshot_record(0, 0));
        for index in 1..=3 {
            writer.entry(index, 1);
        }
        let torn_in_first = writer.entry(4, 1);
        let first = writer.save(dir.path(), 0, 0);
        writer.start(b"meta");
        // A new leader overwrote index 3 onwards.
        writer.entry(3, 2);
        let last = writer.entry(4, 2);
        let second = writer.save(dir.path(), 1, 5);
        let segments = vec![first.clone(), second.clone()];

        let contents = read_all(dir.path(), &segments, (0, 0)).expect("reads");
        let read: Vec<_> = contents.entries.iter().map(|e| (e.index, e.term)).collect();
        assert_eq!(read, [(1, 1), (2, 1), (3, 2), (4, 2)]);
        assert!(contents.torn_tail.is_none());
        assert_eq!(contents.metadata.map(|m| m.0), Some(b"meta".to_vec()));

        // No snapshot record for (9, 1).
        assert!(matches!(
            read_all(dir.path(), &segments, (9, 1)),
            Err(Error::WalSnapshotNotFound { index: 9, .. })
        ));

        // Cut inside the last record of the last segment: the log ends before it.
        let full = std::fs::read(&second.path).expect("read");
        std::fs::write(&second.path, &full[..to_usize(last) + 12]).expect("truncate");
        let contents = read_all(dir.path(), &segments, (0, 0)).expect("a torn tail is tolerated");
        assert_eq!(contents.entries.len(), 3);
        assert_eq!(contents.torn_tail.map(|t| t.offset), Some(last));
        std::fs::write(&second.path, &full).expect("restore");

        // Cut inside the last record of the first segment: etcd cannot repair it.
        let first_bytes = std::fs::read(&first.path).expect("read");
        std::fs::write(&first.path, &first_bytes[..to_usize(torn_in_first) + 12]).expect("cut");
        assert!(matches!(
            read_all(dir.path(), &segments, (0, 0)),
            Err(Error::WalTornRecord { offset, .. }) if offset == torn_in_first
        ));
        std::fs::write(&first.path, &first_bytes).expect("restore");

        // The second segment's crc record does not carry the first segment's final CRC.
        let mut bad = Writer {
            crc: 0x1234,
            bytes: Vec::new(),
        };
        bad.start(b"meta");
        bad.entry(5, 2);
        bad.save(dir.path(), 1, 5);
        assert!(matches!(
            read_all(dir.path(), &segments, (0, 0)),
            Err(Error::WalCrcMismatch { offset: 0, .. })
        ));
        // ... and conflicting metadata.
        let mut conflict = Writer {
            crc: 0,
            bytes: Vec::new(),
        };
        conflict.start(b"meta");
        conflict.record(record_type::SNAPSHOT, snapshot_record(0, 0));
        conflict.record(record_type::METADATA, b"other".to_vec());
        conflict.save(dir.path(), 0, 0);
        assert!(matches!(
            read_all(dir.path(), &segments[..1], (0, 0)),
            Err(Error::WalMetadataConflict { .. })
        ));
    }

    /// Damage anywhere in a segment (seeded bytes flipped, the file cut at seeded lengths):
    /// the reader answers with entries or an error, never a panic, and never returns an entry
    /// the segment did not hold.
    #[test]
    fn damaged_segments_give_errors_not_panics() {
        let dir = tempfile::tempdir().expect("temp dir");
        let mut writer = Writer {
            crc: 0,
            bytes: Vec::new(),
        };
        writer.start(b"meta");
        writer.record(record_type::SNAPSHOT, snapshot_record(0, 0));
        for index in 1..=40 {
            writer.entry(index, 1);
        }
        let segment = writer.save(dir.path(), 0, 0);
        let pristine = std::fs::read(&segment.path).expect("read");
        let segments = vec![segment.clone()];
        // A small xorshift: the same damage on every run.
        let mut state = 0x9E37_79B9_7F4A_7C15_u64;
        let mut next = move || {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state
        };
        for round in 0..300 {
            let mut bytes = pristine.clone();
            if round % 3 == 0 {
                let cut = (next() as usize) % bytes.len();
                bytes.truncate(cut);
            } else {
                for _ in 0..(1 + next() % 4) {
                    let at = (next() as usize) % bytes.len();
                    bytes[at] ^= 1 << (next() % 8);
                }
            }
            std::fs::write(&segment.path, &bytes).expect("write");
            if let Ok(contents) = read_all(dir.path(), &segments, (0, 0)) {
                for entry in &contents.entries {
                    assert!(
                        (1..=40).contains(&entry.index) && entry.term == 1,
                        "round {round}: an entry the segment never held: {entry:?}"
                    );
                }
            }
        }
    }

    fn segment(seq: u64, index: u64) -> Segment {
        Segment {
            path: PathBuf::from(format!("{seq:016x}-{index:016x}.wal")),
            seq,
            index,
        }
    }

    #[test]
    fn select_from_snapshot_index() {
        let segments = [segment(0, 0), segment(1, 50), segment(2, 120)];
        let dir = Path::new("wal");
        assert_eq!(
            select_segments(dir, &segments, 0).map(<[_]>::len).ok(),
            Some(3)
        );
        assert_eq!(
            select_segments(dir, &segments, 60).map(<[_]>::len).ok(),
            Some(2)
        );
        assert_eq!(
            select_segments(dir, &segments, 120).map(<[_]>::len).ok(),
            Some(1)
        );
        let released = [segment(3, 50)];
        assert!(matches!(
            select_segments(dir, &released, 10),
            Err(Error::WalFileNotFound { index: 10, .. })
        ));
        let gap = [segment(1, 0), segment(3, 50)];
        assert!(matches!(
            select_segments(dir, &gap, 0),
            Err(Error::WalSequenceGap { .. })
        ));
    }
}
