//! Record framing: encoding into a write buffer and decoding from a segment file.
//!
//! Port of the framing half of etcd `wal/encoder.go` and `wal/decoder.go`, with our own
//! layout (see `FORMAT.md`). This module knows bytes and record types only; what a sequence
//! of records *means* (replay, truncation, headers) lives in `wal.rs`.
//!
//! Frame layout, all integers little-endian:
//!
//! ```text
//! 0   u32  len      payload length
//! 4   u32  len_inv  !len, so a damaged length is detected before it is trusted
//! 8   u32  crc      CRC-32 (IEEE) over type || payload
//! 12  u8   type
//! 13  ..   payload  len bytes
//! ```

use std::io::{self, Read};

use crate::error::{CorruptReason, Error, Result};
use crate::types::{EntryPayload, EntryRecord, HardState, SnapshotMark};

/// Bytes before the payload.
pub(crate) const HEADER_LEN: usize = 13;

/// Largest payload a record may carry. It bounds the allocation a reader makes for one
/// record, even if a damaged header slipped past the length check.
pub(crate) const MAX_PAYLOAD_LEN: u32 = 128 << 20;

/// Offset of the type byte inside the frame; the CRC covers `frame[TYPE_OFFSET..]`.
const TYPE_OFFSET: usize = 12;

/// Record types. Zero is deliberately unused so a zero-filled region never decodes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub(crate) enum RecordType {
    /// Opaque metadata from `Wal::create`; first record of every segment.
    Metadata = 1,
    /// A raft entry: index u64, term u64, data.
    Entry = 2,
    /// A hard state: term u64, vote u64, commit u64.
    HardState = 3,
    /// A snapshot mark: index u64, term u64.
    SnapshotMark = 4,
}

impl RecordType {
    fn from_byte(byte: u8) -> Option<RecordType> {
        match byte {
            1 => Some(RecordType::Metadata),
            2 => Some(RecordType::Entry),
            3 => Some(RecordType::HardState),
            4 => Some(RecordType::SnapshotMark),
            _ => None,
        }
    }
}

const ENTRY_FIXED_LEN: usize = 16;
const HARD_STATE_LEN: usize = 24;
const SNAPSHOT_MARK_LEN: usize = 16;

/// Appends one framed record to `buf`; `write_payload` appends the payload bytes.
///
/// The payload is written straight into `buf` and the header filled in afterwards, so
/// encoding a batch allocates nothing once `buf` has grown to its working size.
fn encode_with(
    buf: &mut Vec<u8>,
    record_type: RecordType,
    payload_len: usize,
    write_payload: impl FnOnce(&mut Vec<u8>),
) -> Result<()> {
    let len = u32::try_from(payload_len)
        .ok()
        .filter(|len| *len <= MAX_PAYLOAD_LEN)
        .ok_or(Error::RecordTooLarge {
            len: payload_len,
            max: MAX_PAYLOAD_LEN,
        })?;
    let start = buf.len();
    // One byte more than the frame: rust-protobuf's writer into a `Vec` reserves a byte after
    // its last write, which would otherwise move the whole buffer when the frame fills it.
    buf.reserve(HEADER_LEN + payload_len + 1);
    buf.extend_from_slice(&[0; HEADER_LEN]);
    buf[start + TYPE_OFFSET] = record_type as u8;
    write_payload(buf);
    debug_assert_eq!(buf.len() - start - HEADER_LEN, payload_len);
    let crc = crc32fast::hash(&buf[start + TYPE_OFFSET..]);
    buf[start..start + 4].copy_from_slice(&len.to_le_bytes());
    buf[start + 4..start + 8].copy_from_slice(&(!len).to_le_bytes());
    buf[start + 8..start + 12].copy_from_slice(&crc.to_le_bytes());
    Ok(())
}

pub(crate) fn encode_metadata(buf: &mut Vec<u8>, metadata: &[u8]) -> Result<()> {
    encode_with(buf, RecordType::Metadata, metadata.len(), |buf| {
        buf.extend_from_slice(metadata)
    })
}

pub(crate) fn encode_entry<E: EntryPayload>(buf: &mut Vec<u8>, entry: &E) -> Result<()> {
    let data_len = entry.payload_len();
    let payload_len = ENTRY_FIXED_LEN.saturating_add(data_len);
    let start = buf.len();
    let mut encoded = Ok(());
    encode_with(buf, RecordType::Entry, payload_len, |buf| {
        buf.extend_from_slice(&entry.index().to_le_bytes());
        buf.extend_from_slice(&entry.term().to_le_bytes());
        let before = buf.len();
        encoded = entry.write_payload(buf).and_then(|()| {
            let written = buf.len() - before;
            if written == data_len {
                Ok(())
            } else {
                Err(format!("{written} bytes written, {data_len} announced"))
            }
        });
        // The frame keeps its announced length whatever happened; it is dropped below.
        buf.resize(before + data_len, 0);
    })?;
    encoded.map_err(|reason| {
        buf.truncate(start);
        Error::EntryEncoding {
            index: entry.index(),
            reason,
        }
    })
}

pub(crate) fn encode_hard_state(buf: &mut Vec<u8>, hard_state: &HardState) -> Result<()> {
    encode_with(buf, RecordType::HardState, HARD_STATE_LEN, |buf| {
        buf.extend_from_slice(&hard_state.term.to_le_bytes());
        buf.extend_from_slice(&hard_state.vote.to_le_bytes());
        buf.extend_from_slice(&hard_state.commit.to_le_bytes());
    })
}

pub(crate) fn encode_snapshot_mark(buf: &mut Vec<u8>, mark: &SnapshotMark) -> Result<()> {
    encode_with(buf, RecordType::SnapshotMark, SNAPSHOT_MARK_LEN, |buf| {
        buf.extend_from_slice(&mark.index.to_le_bytes());
        buf.extend_from_slice(&mark.term.to_le_bytes());
    })
}

/// A decoded record, validated (CRC and payload size) and parsed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Record {
    Metadata(Vec<u8>),
    Entry(EntryRecord),
    HardState(HardState),
    SnapshotMark(SnapshotMark),
}

/// How far the damage at a bad frame may extend, which decides torn tail versus corruption.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Extent {
    /// The frame runs into end of file: nothing can follow it, so in the last segment
    /// this is always a torn write.
    ReachesEof,
    /// A torn write only if every byte from the reader's position (just past the bad
    /// header, or past the bad frame when its length is trustworthy) to EOF is zero: a crash
    /// after the file grew but before all of its data reached the disk. Anything else after
    /// the bad frame means good data follows it, which a crash cannot explain.
    TornIfRestIsZero,
    /// The frame's CRC is valid but its content is not: the writer produced it, so this
    /// is never a torn write.
    Never,
}

/// The first bad frame of a segment.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Damage {
    /// Offset of the bad frame; the segment's good prefix ends here.
    pub(crate) offset: u64,
    pub(crate) reason: CorruptReason,
    pub(crate) extent: Extent,
}

/// One step of decoding.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Decoded {
    /// A good record that started at `offset`.
    Record { offset: u64, record: Record },
    /// Clean end of file at a record boundary.
    End,
    /// Zeros where a frame header should start (fewer than a header's bytes if that is all
    /// the file has left): the start of preallocated space, if every byte after it is zero
    /// too (see [`SegmentReader::rest_is_zero`]). Real frames never start with zeros, since
    /// `len_inv` is `!len`.
    ZeroFill { offset: u64 },
    /// A bad frame; decoding must stop.
    Damaged(Damage),
}

/// Streams records out of one segment. The payload buffer is reused between records.
pub(crate) struct SegmentReader<R> {
    reader: R,
    file_len: u64,
    offset: u64,
    payload: Vec<u8>,
}

impl<R: Read> SegmentReader<R> {
    /// `reader` must be positioned at offset 0 of a file that is `file_len` bytes long.
    pub(crate) fn new(reader: R, file_len: u64) -> SegmentReader<R> {
        SegmentReader {
            reader,
            file_len,
            offset: 0,
            payload: Vec::new(),
        }
    }

    /// Decodes the next record. After `End`, `ZeroFill` or `Damaged` the reader must not be
    /// used again, except through [`SegmentReader::rest_is_zero`] right after a `ZeroFill` or
    /// a `TornIfRestIsZero` damage.
    pub(crate) fn next(&mut self) -> io::Result<Decoded> {
        let offset = self.offset;
        let remaining = self.file_len - offset;
        if remaining == 0 {
            return Ok(Decoded::End);
        }
        if remaining < HEADER_LEN as u64 {
            // `remaining < HEADER_LEN`, so this cannot truncate.
            let partial = &mut [0u8; HEADER_LEN][..remaining as usize];
            self.reader.read_exact(partial)?;
            if partial.iter().all(|b| *b == 0) {
                return Ok(Decoded::ZeroFill { offset });
            }
            return Ok(damaged(
                offset,
                CorruptReason::TruncatedHeader,
                Extent::ReachesEof,
            ));
        }
        let mut header = [0u8; HEADER_LEN];
        self.reader.read_exact(&mut header)?;
        if header.iter().all(|b| *b == 0) {
            return Ok(Decoded::ZeroFill { offset });
        }
        let len = u32::from_le_bytes([header[0], header[1], header[2], header[3]]);
        let len_inv = u32::from_le_bytes([header[4], header[5], header[6], header[7]]);
        let stored_crc = u32::from_le_bytes([header[8], header[9], header[10], header[11]]);
        let type_byte = header[TYPE_OFFSET];

        if len != !len_inv || len > MAX_PAYLOAD_LEN {
            // The length cannot be trusted, so the frame's end is unknown. A crash explains
            // this only if nothing but zeros follows the header: a zero-filled tail, or a
            // header whose sector was only partly persisted.
            return Ok(damaged(
                offset,
                CorruptReason::BadLength,
                Extent::TornIfRestIsZero,
            ));
        }
        let frame_end = offset + HEADER_LEN as u64 + u64::from(len);
        if frame_end > self.file_len {
            return Ok(damaged(
                offset,
                CorruptReason::TruncatedRecord,
                Extent::ReachesEof,
            ));
        }
        // `len <= MAX_PAYLOAD_LEN`, so this cannot truncate on any supported platform.
        let payload_len = len as usize;
        self.payload.resize(payload_len, 0);
        self.reader.read_exact(&mut self.payload)?;
        self.offset = frame_end;

        let mut hasher = crc32fast::Hasher::new();
        hasher.update(&[type_byte]);
        hasher.update(&self.payload);
        let computed_crc = hasher.finalize();
        if computed_crc != stored_crc {
            return Ok(damaged(
                offset,
                CorruptReason::CrcMismatch {
                    stored: stored_crc,
                    computed: computed_crc,
                },
                Extent::TornIfRestIsZero,
            ));
        }
        match parse(type_byte, &self.payload) {
            Ok(record) => Ok(Decoded::Record { offset, record }),
            Err(reason) => Ok(damaged(offset, reason, Extent::Never)),
        }
    }

    /// Offset just past the last frame read.
    pub(crate) fn offset(&self) -> u64 {
        self.offset
    }

    /// Reads everything from the current position to EOF and reports whether it is all zero.
    pub(crate) fn rest_is_zero(&mut self) -> io::Result<bool> {
        let mut chunk = [0u8; 8192];
        loop {
            let n_read = self.reader.read(&mut chunk)?;
            if n_read == 0 {
                return Ok(true);
            }
            if chunk[..n_read].iter().any(|byte| *byte != 0) {
                return Ok(false);
            }
        }
    }
}

fn damaged(offset: u64, reason: CorruptReason, extent: Extent) -> Decoded {
    Decoded::Damaged(Damage {
        offset,
        reason,
        extent,
    })
}

fn read_u64(bytes: &[u8], at: usize) -> u64 {
    let mut word = [0u8; 8];
    word.copy_from_slice(&bytes[at..at + 8]);
    u64::from_le_bytes(word)
}

/// Parses a CRC-valid payload according to its type.
fn parse(type_byte: u8, payload: &[u8]) -> Result<Record, CorruptReason> {
    let record_type =
        RecordType::from_byte(type_byte).ok_or(CorruptReason::UnknownType(type_byte))?;
    let bad_payload = |record| CorruptReason::BadPayload {
        record,
        len: payload.len(),
    };
    match record_type {
        RecordType::Metadata => Ok(Record::Metadata(payload.to_vec())),
        RecordType::Entry => {
            if payload.len() < ENTRY_FIXED_LEN {
                return Err(bad_payload("entry"));
            }
            Ok(Record::Entry(EntryRecord {
                index: read_u64(payload, 0),
                term: read_u64(payload, 8),
                data: payload[ENTRY_FIXED_LEN..].to_vec(),
            }))
        }
        RecordType::HardState => {
            if payload.len() != HARD_STATE_LEN {
                return Err(bad_payload("hard state"));
            }
            Ok(Record::HardState(HardState {
                term: read_u64(payload, 0),
                vote: read_u64(payload, 8),
                commit: read_u64(payload, 16),
            }))
        }
        RecordType::SnapshotMark => {
            if payload.len() != SNAPSHOT_MARK_LEN {
                return Err(bad_payload("snapshot mark"));
            }
            Ok(Record::SnapshotMark(SnapshotMark {
                index: read_u64(payload, 0),
                term: read_u64(payload, 8),
            }))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn decode_all(bytes: &[u8]) -> (Vec<Record>, Decoded) {
        let mut reader = SegmentReader::new(bytes, bytes.len() as u64);
        let mut records = Vec::new();
        loop {
            match reader.next().unwrap() {
                Decoded::Record { record, .. } => records.push(record),
                other => return (records, other),
            }
        }
    }

    fn sample() -> (Vec<u8>, Vec<Record>) {
        let entry = EntryRecord {
            index: 7,
            term: 3,
            data: b"payload".to_vec(),
        };
        let hard_state = HardState {
            term: 3,
            vote: 2,
            commit: 6,
        };
        let mark = SnapshotMark { index: 5, term: 2 };
        let mut buf = Vec::new();
        encode_metadata(&mut buf, b"meta").unwrap();
        encode_entry(&mut buf, &entry).unwrap();
        encode_hard_state(&mut buf, &hard_state).unwrap();
        encode_snapshot_mark(&mut buf, &mark).unwrap();
        let records = vec![
            Record::Metadata(b"meta".to_vec()),
            Record::Entry(entry),
            Record::HardState(hard_state),
            Record::SnapshotMark(mark),
        ];
        (buf, records)
    }

    #[test]
    fn encode_decode_round_trip() {
        let (buf, expected) = sample();
        let (records, end) = decode_all(&buf);
        assert_eq!(records, expected);
        assert_eq!(end, Decoded::End);
    }

    #[test]
    fn frame_layout_matches_format_doc() {
        let mut buf = Vec::new();
        encode_metadata(&mut buf, b"ab").unwrap();
        assert_eq!(buf.len(), HEADER_LEN + 2);
        assert_eq!(&buf[0..4], &2u32.to_le_bytes());
        assert_eq!(&buf[4..8], &(!2u32).to_le_bytes());
        assert_eq!(
            &buf[8..12],
            &crc32fast::hash(&[1, b'a', b'b']).to_le_bytes()
        );
        assert_eq!(buf[12], RecordType::Metadata as u8);
        assert_eq!(&buf[13..], b"ab");
    }

    #[test]
    fn truncation_reaches_eof() {
        let (buf, _) = sample();
        let (_, end) = decode_all(&buf[..buf.len() - 1]);
        let Decoded::Damaged(damage) = end else {
            panic!("expected damage, got {end:?}");
        };
        assert_eq!(damage.extent, Extent::ReachesEof);
        assert_eq!(damage.reason, CorruptReason::TruncatedRecord);
    }

    #[test]
    fn zeros_at_a_frame_boundary_are_zero_fill() {
        let mut buf = [0u8; 40];
        let mut reader = SegmentReader::new(&buf[..], buf.len() as u64);
        assert_eq!(reader.next().unwrap(), Decoded::ZeroFill { offset: 0 });
        assert!(reader.rest_is_zero().unwrap());

        // Fewer zero bytes than a header: still zero fill.
        let mut reader = SegmentReader::new(&buf[..5], 5);
        assert_eq!(reader.next().unwrap(), Decoded::ZeroFill { offset: 0 });

        buf[30] = 1;
        let mut reader = SegmentReader::new(&buf[..], buf.len() as u64);
        assert_eq!(reader.next().unwrap(), Decoded::ZeroFill { offset: 0 });
        assert!(!reader.rest_is_zero().unwrap());
    }

    #[test]
    fn a_zero_length_with_a_bad_inverse_is_torn_if_rest_is_zero() {
        let mut buf = [0u8; 40];
        buf[4] = 0x12;
        let mut reader = SegmentReader::new(&buf[..], buf.len() as u64);
        let Decoded::Damaged(damage) = reader.next().unwrap() else {
            panic!("expected damage");
        };
        assert_eq!(damage.reason, CorruptReason::BadLength);
        assert_eq!(damage.extent, Extent::TornIfRestIsZero);
        assert!(reader.rest_is_zero().unwrap());
    }

    #[test]
    fn crc_valid_but_unknown_type_is_never_torn() {
        let mut buf = Vec::new();
        encode_metadata(&mut buf, b"x").unwrap();
        buf[TYPE_OFFSET] = 9;
        let crc = crc32fast::hash(&buf[TYPE_OFFSET..]);
        buf[8..12].copy_from_slice(&crc.to_le_bytes());
        let (_, end) = decode_all(&buf);
        let Decoded::Damaged(damage) = end else {
            panic!("expected damage");
        };
        assert_eq!(damage.reason, CorruptReason::UnknownType(9));
        assert_eq!(damage.extent, Extent::Never);
    }

    #[test]
    fn oversized_payload_is_rejected_on_encode() {
        let entry = EntryRecord {
            index: 1,
            term: 1,
            data: vec![0; MAX_PAYLOAD_LEN as usize],
        };
        let mut buf = Vec::new();
        let err = encode_entry(&mut buf, &entry).unwrap_err();
        assert!(matches!(err, Error::RecordTooLarge { .. }));
        assert!(buf.is_empty());
    }
}
