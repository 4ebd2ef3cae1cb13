//! Snapshot images received from the leader, made ready to install as they arrive: an etcd
//! leader sends its database in etcd's bbolt layout, which is read into a backend file of ours
//! (`etcd_db::import`), and an etcd-rs leader sends its backend's pairs as a stream
//! (`etcdrs_backend::transfer`), written into a backend file of ours as it arrives; either way
//! the store's key index is built from the same pairs meanwhile (`mvcc::StoreLoader`, on a
//! thread of its own fed batches of pairs), on the peer handler's blocking thread and before
//! raft hears of the snapshot. Raft's thread then only swaps the file in (`Applier::install_snapshot`): it
//! keeps answering the leader's heartbeats instead of spending the conversion and the
//! index rebuild inside one `Ready`, which in a two-member cluster cost the leader its quorum
//! and an election.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::time::Instant;

use etcdrs_backend::Bucket;
use etcdrs_backend::transfer::Batch;
use etcdrs_mvcc::{BuiltIndex, LoadedStore, StoreLoader};

/// An image waiting for raft to install it.
pub(super) enum ReceivedImage {
    /// etcd's bbolt file, imported into a backend file of ours at `path` and indexed.
    Imported {
        path: PathBuf,
        /// The cluster version and the downgrade record (etcd's JSON) the file carries.
        cluster_version: Option<String>,
        downgrade: Option<Vec<u8>>,
        loaded: LoadedStore,
    },
    /// An etcd-rs leader's stream of pairs, written into a backend file of ours at `path` and
    /// indexed: its membership and cluster version are the file's own.
    Streamed { path: PathBuf, loaded: LoadedStore },
    /// A backend image of ours, installed as it is (the simulator's links send these).
    Ours { path: PathBuf },
    /// The image could not be read: installing it fails with this.
    Failed(String),
}

impl ReceivedImage {
    /// Remove its file (an image that will not be installed).
    pub(super) fn discard(self) {
        match self {
            ReceivedImage::Imported { path, .. }
            | ReceivedImage::Streamed { path, .. }
            | ReceivedImage::Ours { path } => {
                let _ = std::fs::remove_file(path);
            }
            ReceivedImage::Failed(_) => {}
        }
    }
}

/// The image received at `path` for raft index `index`, made ready to install: an etcd
/// bbolt file is imported beside it (`*.snap.from-etcd`) and indexed, and the received
/// file removed; anything else is taken as a backend image of ours.
pub(super) fn prepare(index: u64, path: PathBuf) -> ReceivedImage {
    let db = match etcdrs_schema::etcd_db::Db::open(&path) {
        Ok(db) => db,
        Err(_) => return ReceivedImage::Ours { path },
    };
    let started = Instant::now();
    let image = path.with_extension("from-etcd");
    let _ = std::fs::remove_file(&image);
    let result = import(&image, |backend, index_batch| {
        let mut batch = Batch::new(Bucket::KEY);
        let imported = etcdrs_schema::etcd_db::import_with(&db, backend, |key, value| {
            batch.push(key, value);
            if batch.len() >= INDEX_BATCH_PAIRS {
                index_batch(std::mem::replace(&mut batch, Batch::new(Bucket::KEY)));
            }
            Ok(())
        });
        if !batch.is_empty() {
            index_batch(batch);
        }
        imported.map_err(crate::ServerError::from)
    });
    drop(db);
    let _ = std::fs::remove_file(&path);
    match result {
        Ok((imported, loaded)) => {
            tracing::info!(
                index,
                consistent_index = imported.consistent_index,
                revisions = imported.revisions,
                keys = loaded.key_count(),
                revision = loaded.current_rev(),
                took = ?started.elapsed(),
                "read etcd's snapshot database and indexed it"
            );
            ReceivedImage::Imported {
                path: image,
                cluster_version: imported.cluster_version,
                downgrade: imported.downgrade,
                loaded,
            }
        }
        Err(e) => {
            let _ = std::fs::remove_file(&image);
            tracing::warn!(index, error = %e, "cannot read the snapshot database");
            ReceivedImage::Failed(e.to_string())
        }
    }
}

/// The image of an etcd-rs leader's stream of pairs for raft index `index`, read from `body`
/// into a backend file at `path` as it arrives and indexed; a stream that fails (cut short,
/// damaged) leaves no file.
pub(super) fn receive_pairs(
    index: u64,
    path: PathBuf,
    body: &mut (dyn Read + Send),
) -> ReceivedImage {
    let started = Instant::now();
    let _ = std::fs::remove_file(&path);
    let result = import(&path, |backend, index_batch| {
        // The stream's own batches go to the indexer as they are: no copy.
        etcdrs_backend::transfer::receive(body, backend, |batch| {
            if batch.bucket == Bucket::KEY {
                index_batch(batch);
            }
        })
        .map_err(crate::ServerError::from)
    });
    match result {
        Ok((pairs, loaded)) => {
            tracing::info!(
                index,
                pairs,
                keys = loaded.key_count(),
                revision = loaded.current_rev(),
                took = ?started.elapsed(),
                "read the leader's snapshot stream and indexed it"
            );
            ReceivedImage::Streamed { path, loaded }
        }
        Err(e) => {
            let _ = std::fs::remove_file(&path);
            tracing::warn!(index, error = %e, "cannot read the leader's snapshot stream");
            ReceivedImage::Failed(e.to_string())
        }
    }
}

/// The import's backend makes its commits durable no oftener than this (in effect: only the
/// last, which asks to be).
const IMPORT_DURABLE_INTERVAL: std::time::Duration = std::time::Duration::from_secs(24 * 3600);
/// Pairs an import from etcd's file hands the indexing thread at a time.
const INDEX_BATCH_PAIRS: usize = 4096;
/// Batches in flight to it.
const INDEX_BATCHES_QUEUED: usize = 8;

/// Fill a new backend at `image` (`fill` writes into it and hands the pairs of the `key`
/// bucket, in our encoding and key order, in batches to the function it is given), indexing
/// them on a second thread meanwhile (the fill writes redb, the indexer builds the key index).
fn import<T>(
    image: &Path,
    fill: impl FnOnce(&etcdrs_backend::Backend, &mut dyn FnMut(Batch)) -> Result<T, crate::ServerError>,
) -> Result<(T, LoadedStore), crate::ServerError> {
    let mut backend = etcdrs_backend::Backend::open(image)?;
    // Durable once, at its end: the file is used only once it is whole (a crash before leaves
    // a partial image that is received again), so the import's commits in between need not
    // wait for the disk.
    backend.set_batching(IMPORT_DURABLE_INTERVAL, u64::MAX);
    let (tx, rx) = std::sync::mpsc::sync_channel::<Batch>(INDEX_BATCHES_QUEUED);
    std::thread::scope(|scope| {
        let indexer = std::thread::Builder::new()
            .name("snapshot-index".into())
            .spawn_scoped(scope, move || -> etcdrs_mvcc::Result<BuiltIndex> {
                let mut loader = StoreLoader::new();
                for batch in rx {
                    for (key, value) in batch.pairs() {
                        loader.push(key, value)?;
                    }
                }
                // Sorted and built while the import makes its file durable.
                Ok(loader.build())
            })
            .map_err(|e| crate::ServerError::Fatal(format!("start the indexing thread: {e}")))?;
        // A closed channel means the indexer failed: its error is reported below.
        let imported = fill(&backend, &mut |batch| {
            let _ = tx.send(batch);
        });
        drop(tx);
        let loader = indexer
            .join()
            .map_err(|_| crate::ServerError::Fatal("the indexing thread panicked".into()))?;
        let imported = imported?;
        let loaded = loader?.finish(&backend.read()?)?;
        Ok((imported, loaded))
    })
}
