//! Fuzzing of the WAL's replay (issue 20): [`Wal::open`] over a segment file made of mutated
//! bytes must return an error or a state (after cutting a torn tail), never panic, allocate
//! what a length field claims, or loop. Corpus: `crates/wal/fuzz-corpus/segment/`, segments
//! this crate wrote (`ETCDRS_FUZZ_REGEN=1` rewrites them). Runner and knobs: `etcdrs-fuzz`.

use etcdrs_fuzz::Fuzz;

use crate::{EntryRecord, HardState, Options, SnapshotMark, Wal};

const SEGMENT: &str = "0000000000000000-0000000000000000.wal";

/// A segment with every record type: metadata, a snapshot mark, entries (one overwritten by
/// a later term, as raft does), hard states.
fn written_segment() -> Vec<u8> {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut wal = Wal::create(dir.path(), b"node 1, cluster 2").expect("create");
    let entry = |index, term, data: &[u8]| EntryRecord {
        index,
        term,
        data: data.to_vec(),
    };
    wal.save_snapshot_mark(SnapshotMark { index: 2, term: 1 })
        .expect("mark");
    wal.save(
        Some(HardState {
            term: 1,
            vote: 1,
            commit: 3,
        }),
        &[entry(3, 1, b"put foo"), entry(4, 1, b""), entry(5, 1, b"x")],
    )
    .expect("save");
    wal.save(
        Some(HardState {
            term: 2,
            vote: 1,
            commit: 5,
        }),
        &[entry(5, 2, &[0xff; 40])],
    )
    .expect("save");
    drop(wal);
    std::fs::read(dir.path().join(SEGMENT)).expect("read the segment")
}

#[test]
fn fuzz_wal_open() {
    let dir = tempfile::tempdir_in(etcdrs_fuzz::scratch_base()).expect("tempdir");
    let segment = dir.path().join(SEGMENT);
    Fuzz::new("wal-segment")
        .corpus_dir(concat!(env!("CARGO_MANIFEST_DIR"), "/fuzz-corpus/segment"))
        .input("written-all-record-types", written_segment())
        .iterations(1500)
        .run(|input| {
            std::fs::write(&segment, input).expect("write the mutated segment");
            if let Ok((wal, state)) = Wal::open_with_options(dir.path(), Options::default()) {
                assert!(
                    state.entries.len() <= input.len(),
                    "entries come from the input"
                );
                drop(wal);
            }
        });
}
