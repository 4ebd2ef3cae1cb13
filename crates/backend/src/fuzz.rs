//! Fuzzing of the snapshot image reader (issue 20): a member restores what its leader
//! streams, and `etcd snapshot restore` reads what a user hands it, so [`restore_image`]
//! followed by [`Backend::open`] on the restored file must give an error for a damaged image:
//! no panic (ours or redb's), no loop. redb trusts its file and panics on some damage (found
//! here: `regression-redb-panic-slice-index`, a slice index out of range in redb 4.6's
//! `table_tree_base.rs`); [`Backend::open`] and [`Backend::replace_with_image`] turn that
//! into [`crate::Error::Damaged`]. Corpus: `crates/backend/fuzz-corpus/image/`, images of
//! a tiny backend (`ETCDRS_FUZZ_REGEN=1` rewrites them). Runner and knobs: `etcdrs-fuzz`.

use std::io::Read;

use etcdrs_fuzz::Fuzz;

use crate::{Backend, Bucket, HashCheck, ImageDigest, restore_image};

/// The image `Maintenance.Snapshot` streams for a backend with a few keys: the redb copy and
/// its SHA-256.
fn tiny_image() -> Vec<u8> {
    let dir = tempfile::tempdir().expect("tempdir");
    let backend = Backend::open(&dir.path().join("db")).expect("open a backend");
    let tx = backend.write().expect("write");
    tx.put(
        Bucket::KEY,
        b"\x00\x00\x00\x00\x00\x00\x00\x02_\x00\x00\x00\x00\x00\x00\x00\x00",
        b"kv",
    )
    .expect("put");
    tx.put(Bucket::META, b"consistent_index", &7u64.to_be_bytes())
        .expect("put");
    tx.commit(true).expect("commit");
    let snapshot = backend.snapshot().expect("snapshot");
    let mut image = Vec::new();
    snapshot
        .open()
        .expect("open the snapshot")
        .read_to_end(&mut image)
        .expect("read the snapshot");
    let mut digest = ImageDigest::new();
    digest.update(&image);
    image.extend_from_slice(&digest.finish());
    image
}

#[test]
fn fuzz_snapshot_image() {
    let dir = tempfile::tempdir_in(etcdrs_fuzz::scratch_base()).expect("tempdir");
    let image_path = dir.path().join("image");
    let db_path = dir.path().join("restored").join("db");
    let image = tiny_image();
    eprintln!("tiny image: {} bytes", image.len());
    Fuzz::new("backend-image")
        .corpus_dir(concat!(env!("CARGO_MANIFEST_DIR"), "/fuzz-corpus/image"))
        .input("tiny-with-digest", image)
        .max_len(2 << 20)
        .iterations(200)
        .run(|input| {
            std::fs::write(&image_path, input).expect("write the mutated image");
            for check in [HashCheck::Verify, HashCheck::Skip] {
                let _ = std::fs::remove_dir_all(db_path.parent().expect("db has a parent"));
                if restore_image(&image_path, &db_path, check).is_ok()
                    && let Ok(backend) = Backend::open(&db_path)
                    && let Ok(read) = backend.read()
                {
                    for bucket in Bucket::ALL {
                        let _ = read.for_each_in(bucket, &[], None, |_, _| true);
                    }
                }
            }
        });
}
