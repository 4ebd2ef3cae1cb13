//! Write batches held in memory across raft turns (etcd's batch transaction and its read
//! buffer).
//!
//! etcd keeps one bbolt write transaction open for a whole `--backend-batch-interval` and
//! serves reads of what it wrote meanwhile from a buffer; each apply step only adds to both.
//! A redb commit per apply step, durable or not, writes every page it copied into the file,
//! and redb reuses no page freed since the last durable commit: with one client, each put was
//! its own commit and wrote about 168 KB (etcd: 4.9 KB).
//!
//! Here a [`BatchTx`] gathers a batch's writes into a [`Layer`] in memory, and its commit
//! publishes the layer: from then on every reader sees it (readers look at the published
//! layers, newest first, before the file). The layers reach the file together, oldest first,
//! in one redb transaction (a *flush*: [`Backend::write`] takes in every layer published
//! before it), made durable every batch interval or batch limit. A flush runs on the calling
//! thread when the backend flushes inline (the offline tools, the simulator), or on the
//! server's own backend task ([`Backend::set_background_flush`]), so the thread that applies
//! raft's entries never waits for the file, nor for a defragmentation holding its writer,
//! unless the layers waiting outgrow [`HARD_LIMIT_BYTES`].
//!
//! Durability is told by generation: each published layer has the next number, and
//! [`Backend::durable_generation`] is the newest one a durable flush has written. The layers'
//! memory is bounded: past [`SOFT_LIMIT_BYTES`] a flush is asked for at once, past
//! [`HARD_LIMIT_BYTES`] the committing batch flushes itself.

use std::cell::RefCell;
use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use crate::{Backend, Bucket, ReadTx, Result};

/// Bytes of keys and values waiting in layers past which a flush is asked for at once.
pub const SOFT_LIMIT_BYTES: u64 = 32 << 20;
/// Bytes waiting in layers past which the batch that commits flushes them itself (the bound
/// on the layers' memory when the file's disk stalls).
pub const HARD_LIMIT_BYTES: u64 = 256 << 20;

/// One bucket's writes in a layer: the newest value of each key written (`None`: removed),
/// and whether the bucket was cleared first (then nothing older than the layer counts).
#[derive(Debug)]
pub(crate) struct BucketLayer {
    pub(crate) bucket: Bucket,
    pub(crate) cleared: bool,
    pub(crate) entries: BTreeMap<Vec<u8>, Option<Vec<u8>>>,
    /// The first and last key of `entries` (set when the layer is published), so that a
    /// lookup outside them skips the layer with two comparisons.
    bounds: Option<(Vec<u8>, Vec<u8>)>,
}

impl BucketLayer {
    /// What this layer says of `key`: its value, its removal, or nothing.
    fn lookup(&self, key: &[u8]) -> Seen<'_> {
        let inside = match &self.bounds {
            Some((first, last)) => key >= first.as_slice() && key <= last.as_slice(),
            None => !self.entries.is_empty(),
        };
        if inside {
            match self.entries.get(key) {
                Some(Some(value)) => return Seen::Value(value),
                Some(None) => return Seen::Gone,
                None => {}
            }
        }
        if self.cleared {
            Seen::Gone
        } else {
            Seen::Unknown
        }
    }
}

/// The writes of one committed batch, as readers see them until a flush writes them to the
/// file.
#[derive(Debug, Default)]
pub(crate) struct Layer {
    /// Its number: layers are published, and flushed, in this order.
    pub(crate) generation: u64,
    pub(crate) buckets: Vec<BucketLayer>,
    /// Operations it holds (counted toward `--backend-batch-limit`).
    pub(crate) writes: u64,
    /// Bytes of the keys and values it holds.
    pub(crate) bytes: u64,
}

/// What the layers say of a key.
pub(crate) enum Seen<'l> {
    /// Its newest value.
    Value(&'l [u8]),
    /// Removed (or its bucket cleared) after the file's state.
    Gone,
    /// Not written since the file's state: the file answers.
    Unknown,
}

impl Layer {
    pub(crate) fn bucket(&self, bucket: Bucket) -> Option<&BucketLayer> {
        self.buckets.iter().find(|b| b.bucket == bucket)
    }

    fn bucket_mut(&mut self, bucket: Bucket) -> &mut BucketLayer {
        let at = match self.buckets.iter().position(|b| b.bucket == bucket) {
            Some(at) => at,
            None => {
                self.buckets.push(BucketLayer {
                    bucket,
                    cleared: false,
                    entries: BTreeMap::new(),
                    bounds: None,
                });
                self.buckets.len() - 1
            }
        };
        &mut self.buckets[at]
    }

    fn set(&mut self, bucket: Bucket, key: &[u8], value: Option<Vec<u8>>) {
        self.writes += 1;
        self.bytes += (key.len() + value.as_ref().map_or(0, Vec::len)) as u64;
        self.bucket_mut(bucket).entries.insert(key.to_vec(), value);
    }

    fn is_empty(&self) -> bool {
        self.buckets
            .iter()
            .all(|b| b.entries.is_empty() && !b.cleared)
    }

    /// Fixes the bounds of every bucket's keys, before the layer is shared.
    fn seal(&mut self) {
        for bucket in &mut self.buckets {
            bucket.bounds = match (
                bucket.entries.first_key_value(),
                bucket.entries.last_key_value(),
            ) {
                (Some((first, _)), Some((last, _))) => Some((first.clone(), last.clone())),
                _ => None,
            };
        }
    }
}

/// The published layers, oldest first, with the lowest key each bucket has in any of them:
/// a read of a key below it (in the `key` bucket, any revision older than the oldest batch
/// waiting) goes to the file without looking at each layer.
#[derive(Debug, Default)]
pub(crate) struct Published {
    layers: Vec<Arc<Layer>>,
    /// Per bucket written: the lowest key written (empty when a layer cleared it).
    lows: Vec<(Bucket, Vec<u8>)>,
}

impl std::ops::Deref for Published {
    type Target = Vec<Arc<Layer>>;

    fn deref(&self) -> &Vec<Arc<Layer>> {
        &self.layers
    }
}

impl Published {
    pub(crate) fn new(layers: Vec<Arc<Layer>>) -> Published {
        let mut lows: Vec<(Bucket, Vec<u8>)> = Vec::new();
        for layer in &layers {
            for written in &layer.buckets {
                let low = if written.cleared {
                    Some(&[][..])
                } else {
                    written.bounds.as_ref().map(|(first, _)| first.as_slice())
                };
                let Some(low) = low else {
                    continue;
                };
                match lows.iter_mut().find(|(b, _)| *b == written.bucket) {
                    Some((_, held)) if low < held.as_slice() => *held = low.to_vec(),
                    Some(_) => {}
                    None => lows.push((written.bucket, low.to_vec())),
                }
            }
        }
        Published { layers, lows }
    }

    /// What the layers say of `key` of `bucket`, newest first.
    pub(crate) fn lookup(&self, bucket: Bucket, key: &[u8]) -> Seen<'_> {
        match self.lows.iter().find(|(b, _)| *b == bucket) {
            Some((_, low)) if key >= low.as_slice() => lookup(&self.layers, bucket, key),
            _ => Seen::Unknown,
        }
    }
}

/// What published layers (oldest first) say of `key` of `bucket`, newest first.
fn lookup<'l>(layers: &'l [Arc<Layer>], bucket: Bucket, key: &[u8]) -> Seen<'l> {
    for layer in layers.iter().rev() {
        if let Some(found) = layer.bucket(bucket) {
            match found.lookup(key) {
                Seen::Unknown => {}
                seen => return seen,
            }
        }
    }
    Seen::Unknown
}

/// What the layers hold of `bucket` in `[start, end)` (`end == None`: to the end), the newest
/// write of each key, and whether a layer cleared the bucket (then the file holds nothing of
/// it that counts).
pub(crate) fn range<'l>(
    layers: &'l [Arc<Layer>],
    bucket: Bucket,
    start: &[u8],
    end: Option<&[u8]>,
) -> (BTreeMap<&'l [u8], Option<&'l [u8]>>, bool) {
    let mut seen = BTreeMap::new();
    let mut cleared = false;
    for layer in layers {
        let Some(found) = layer.bucket(bucket) else {
            continue;
        };
        if found.cleared {
            seen.clear();
            cleared = true;
        }
        let bounds = (
            std::ops::Bound::Included(start),
            end.map_or(std::ops::Bound::Unbounded, std::ops::Bound::Excluded),
        );
        if end.is_some_and(|end| end <= start) {
            continue;
        }
        for (key, value) in found.entries.range::<[u8], _>(bounds) {
            seen.insert(key.as_slice(), value.as_deref());
        }
    }
    (seen, cleared)
}

/// A batch of writes, published together at its commit without touching the file: the
/// store's unit of work (see the module docs). One at a time (it holds the batch writer), and
/// it reads its own writes, then what is published, then the file. Dropping it without
/// [`BatchTx::commit`] drops its writes.
pub struct BatchTx<'a> {
    backend: &'a Backend,
    _writer: std::sync::MutexGuard<'a, ()>,
    layer: RefCell<Layer>,
    /// What was committed when the batch first read: published layers and the file, taken
    /// together (nothing else publishes while the batch holds the writer).
    view: RefCell<Option<ReadTx>>,
}

impl<'a> BatchTx<'a> {
    pub(crate) fn begin(backend: &'a Backend) -> BatchTx<'a> {
        BatchTx {
            backend,
            _writer: crate::lock(&backend.batch_writer),
            layer: RefCell::new(Layer::default()),
            view: RefCell::new(None),
        }
    }

    /// Insert or overwrite `key` in `bucket`.
    pub fn put(&self, bucket: Bucket, key: &[u8], value: &[u8]) -> Result<()> {
        self.put_owned(bucket, key, value.to_vec())
    }

    /// [`BatchTx::put`] of a value the caller has no more use for: the batch keeps it as it
    /// is, without a copy.
    pub fn put_owned(&self, bucket: Bucket, key: &[u8], value: Vec<u8>) -> Result<()> {
        self.layer.borrow_mut().set(bucket, key, Some(value));
        Ok(())
    }

    /// Remove `key` from `bucket`.
    pub fn delete(&self, bucket: Bucket, key: &[u8]) -> Result<()> {
        self.layer.borrow_mut().set(bucket, key, None);
        Ok(())
    }

    /// Remove each of `keys` from `bucket` (a compaction's batch); returns how many were
    /// named (whether each was there is settled when the batch reaches the file).
    pub fn delete_all<'k>(
        &self,
        bucket: Bucket,
        keys: impl IntoIterator<Item = &'k [u8]>,
    ) -> Result<u64> {
        let mut layer = self.layer.borrow_mut();
        let mut named = 0;
        for key in keys {
            layer.set(bucket, key, None);
            named += 1;
        }
        Ok(named)
    }

    /// Read `key` as this batch sees it.
    pub fn get(&self, bucket: Bucket, key: &[u8]) -> Result<Option<Vec<u8>>> {
        {
            let layer = self.layer.borrow();
            if let Some(own) = layer.bucket(bucket) {
                match own.lookup(key) {
                    Seen::Value(value) => return Ok(Some(value.to_vec())),
                    Seen::Gone => return Ok(None),
                    Seen::Unknown => {}
                }
            }
        }
        let mut view = self.view.borrow_mut();
        if view.is_none() {
            *view = Some(self.backend.read()?);
        }
        match view.as_ref() {
            Some(read) => read.get(bucket, key),
            None => Ok(None),
        }
    }

    /// Publish the batch's writes: every reader sees them from now on. With `durable`, they
    /// (and everything published before) are flushed to the file and made durable before
    /// this returns; otherwise a flush follows by the backend's schedule (see the module
    /// docs). Returns whether the batch is durable.
    pub fn commit(self, durable: bool) -> Result<bool> {
        let backend = self.backend;
        let mut layer = self.layer.into_inner();
        drop(self.view);
        let writes = layer.writes;
        if !layer.is_empty() {
            layer.seal();
            backend.publish(layer);
        }
        let pending = backend.pending_writes.fetch_add(writes, Ordering::Relaxed) + writes;
        let held = backend.layer_bytes.load(Ordering::Relaxed);
        let due = pending > 0
            && (pending >= backend.batch_limit
                || backend
                    .now()
                    .saturating_duration_since(*crate::lock(&backend.last_durable))
                    >= backend.batch_interval
                || held >= backend.layer_limits.0);
        let background = backend.background_flush.load(Ordering::Relaxed);
        if durable || held >= backend.layer_limits.1 || (due && !background) {
            drop(self._writer);
            backend.write()?.commit(true)?;
            return Ok(true);
        }
        if due {
            backend.request_flush();
        }
        Ok(false)
    }
}

#[cfg(test)]
mod tests;
