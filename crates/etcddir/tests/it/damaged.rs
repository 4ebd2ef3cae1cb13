//! Damaged copies of a real data directory, and directories that are not etcd's.
//!
//! etcd 3.4's rules, which `read` follows: a CRC mismatch anywhere is an error (etcd refuses
//! to start), except for a torn write in the last segment; a record cut short or torn at the
//! end of the last segment ends the log there (etcd's `readWAL` gets `io.ErrUnexpectedEOF`
//! from `ReadAll`, `wal.Repair` truncates the segment at the last good record, and the second
//! `ReadAll` succeeds).

use std::fs::OpenOptions;
use std::io::{Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};

use etcdrs_etcddir::Error;

use etcdrs_testkit::Member;

use crate::harness::{copy_dir, start_etcd};

/// A stopped member with a few keys (its data directory lives as long as it).
async fn written_member() -> Member {
    let mut etcd = start_etcd(&[]).await;
    let ctl = etcd.etcdctl();
    for n in 0..10 {
        ctl.ok(&["put", &format!("k{n}"), "some value of a few bytes"])
            .await;
    }
    etcd.stop().await.expect("stop etcd");
    etcd
}

fn only_segment(data_dir: &Path) -> PathBuf {
    let segments = etcdrs_etcddir::list_segments(&data_dir.join("member/wal")).expect("list");
    assert_eq!(segments.len(), 1, "a young member has one segment");
    segments[0].path.clone()
}

/// The frames of a segment: (offset of the length word, record bytes, padding bytes).
fn frames(segment: &Path) -> Vec<(u64, u64, u64)> {
    let mut bytes = Vec::new();
    std::fs::File::open(segment)
        .expect("open")
        .read_to_end(&mut bytes)
        .expect("read");
    let mut frames = Vec::new();
    let mut offset = 0usize;
    while let Some(word) = bytes.get(offset..offset + 8) {
        let word = u64::from_le_bytes(word.try_into().expect("8 bytes"));
        if word == 0 {
            break;
        }
        let record = word & !(0xff << 56);
        let pad = if word >> 63 == 1 { (word >> 56) & 7 } else { 0 };
        frames.push((offset as u64, record, pad));
        offset += 8 + (record + pad) as usize;
    }
    frames
}

fn patch(path: &Path, offset: u64, bytes: &[u8]) {
    let mut file = OpenOptions::new()
        .write(true)
        .open(path)
        .expect("open for writing");
    file.seek(SeekFrom::Start(offset)).expect("seek");
    file.write_all(bytes).expect("write");
}

fn byte_at(path: &Path, offset: u64) -> u8 {
    let mut file = std::fs::File::open(path).expect("open");
    file.seek(SeekFrom::Start(offset)).expect("seek");
    let mut byte = [0u8];
    file.read_exact(&mut byte).expect("read");
    byte[0]
}

#[tokio::test]
async fn damaged_copies() {
    let etcd = written_member().await;
    let data = etcd.data_dir();
    let original = etcdrs_etcddir::read(data).expect("the original reads");
    let scratch = tempfile::tempdir().expect("temp dir");

    // One flipped byte in a record in the middle: etcd's walpb CRC mismatch, naming the
    // file and the record's offset.
    let flipped = scratch.path().join("flipped");
    copy_dir(data, &flipped);
    let segment = only_segment(&flipped);
    let all = frames(&segment);
    let (offset, record, _) = all[all.len() / 2];
    let target = offset + 8 + record - 1; // the last byte of the record's data
    patch(&segment, target, &[byte_at(&segment, target) ^ 0x40]);
    let err = etcdrs_etcddir::read(&flipped).expect_err("a flipped byte is detected");
    assert!(
        matches!(err, Error::WalRecordCrcMismatch { offset: o, .. } if o == offset),
        "{err}"
    );
    let message = err.to_string();
    assert!(message.starts_with("walpb: crc mismatch"), "{message}");
    assert!(
        message.contains(&segment.display().to_string()),
        "{message}"
    );
    assert!(message.contains(&format!("offset {offset}")), "{message}");

    // The last record cut short (the file ends inside it): tolerated, the log ends before it.
    let truncated = scratch.path().join("truncated");
    copy_dir(data, &truncated);
    let segment = only_segment(&truncated);
    let all = frames(&segment);
    let (last_offset, last_record, _) = *all.last().expect("frames");
    let file = OpenOptions::new().write(true).open(&segment).expect("open");
    file.set_len(last_offset + 8 + last_record / 2)
        .expect("truncate");
    let member = etcdrs_etcddir::read(&truncated).expect("a torn tail is tolerated");
    let torn = member
        .torn_tail
        .as_ref()
        .expect("the torn tail is reported");
    assert_eq!(
        (torn.path.as_path(), torn.offset),
        (segment.as_path(), last_offset)
    );
    assert_eq!(member.node_id, original.node_id);
    assert!(member.entries.len() + 1 >= original.entries.len());
    assert!(member.entries.len() <= original.entries.len());

    // The last record torn (a sector of it never written: zeros), with the preallocated
    // zeros after it: also tolerated.
    let zeroed = scratch.path().join("zeroed");
    copy_dir(data, &zeroed);
    let segment = only_segment(&zeroed);
    patch(&segment, last_offset + 8, &vec![0u8; last_record as usize]);
    let member = etcdrs_etcddir::read(&zeroed).expect("a torn write is tolerated");
    assert_eq!(member.torn_tail.map(|t| t.offset), Some(last_offset));

    // The same zeroed bytes in a record that is not the last: not a torn write, an error.
    let middle = scratch.path().join("middle");
    copy_dir(data, &middle);
    let segment = only_segment(&middle);
    let (offset, record, _) = all[all.len() / 2];
    patch(&segment, offset + 8 + record - 4, &[0, 0, 0, 0]);
    let err = etcdrs_etcddir::read(&middle).expect_err("corruption before the tail");
    assert!(
        matches!(
            err,
            Error::WalRecordCrcMismatch { .. } | Error::WalDecode { .. }
        ),
        "{err}"
    );

    // A .snap file that does not check is passed over (etcd renames it to .broken) and
    // left as it is.
    let bad_snap = scratch.path().join("bad-snap");
    copy_dir(data, &bad_snap);
    let snap_path = bad_snap.join("member/snap/0000000000000002-0000000000000009.snap");
    std::fs::write(&snap_path, b"\x08\x01\x12\x03abc").expect("write a bad snap file");
    let member = etcdrs_etcddir::read(&bad_snap).expect("reads without the bad snap file");
    assert!(member.snapshot.is_none());
    assert_eq!(member.skipped_snapshots.len(), 1);
    let skipped = &member.skipped_snapshots[0];
    assert_eq!(skipped.path, snap_path);
    assert!(
        skipped.reason.to_string().starts_with("snap: crc mismatch"),
        "{}",
        skipped.reason
    );
    assert!(snap_path.is_file());
    assert_eq!(
        etcdrs_etcddir::read_snap_file(&snap_path)
            .map(|_| ())
            .map_err(|e| e.to_string()),
        Err(format!(
            "snap: crc mismatch in {}: file says 0x00000001, data gives {:#010x}",
            snap_path.display(),
            crc32c_of_abc()
        ))
    );

    // No WAL segments: not an etcd data directory.
    let no_wal = scratch.path().join("no-wal");
    copy_dir(data, &no_wal);
    std::fs::remove_dir_all(no_wal.join("member/wal")).expect("remove member/wal");
    assert!(!etcdrs_etcddir::is_etcd_data_dir(&no_wal));
    assert!(matches!(
        etcdrs_etcddir::read(&no_wal),
        Err(Error::NotEtcdDataDir { .. })
    ));
    assert!(etcdrs_etcddir::is_etcd_data_dir(data));

    // No db: reported.
    let no_db = scratch.path().join("no-db");
    copy_dir(data, &no_db);
    std::fs::remove_file(no_db.join("member/snap/db")).expect("remove db");
    assert!(matches!(
        etcdrs_etcddir::read(&no_db),
        Err(Error::DbNotFound { .. })
    ));
}

/// CRC-32C of "abc" (a published test vector).
fn crc32c_of_abc() -> u32 {
    0x364b_3fb7
}

#[test]
fn not_etcd_dirs() {
    let dir = tempfile::tempdir().expect("temp dir");
    assert!(!etcdrs_etcddir::is_etcd_data_dir(dir.path()));
    std::fs::create_dir_all(dir.path().join("member/snap")).expect("mkdir");
    std::fs::create_dir_all(dir.path().join("member/wal")).expect("mkdir");
    // member/wal without .wal files.
    assert!(!etcdrs_etcddir::is_etcd_data_dir(dir.path()));
    let err = etcdrs_etcddir::read(dir.path()).expect_err("not etcd's");
    assert!(
        err.to_string().contains("is not an etcd data directory"),
        "{err}"
    );
}
