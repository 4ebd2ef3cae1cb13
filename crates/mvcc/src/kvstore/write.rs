//! Writing to the store (etcd `server/storage/mvcc/kvstore_txn.go`): a [`WriteBatch`] is
//! the apply loop's unit of work (one backend batch, `etcdrs_backend::BatchTx`, over one or more raft entries:
//! compaction, leases, meta, other buckets), and a [`Txn`] within it is one revision, whose
//! puts and deletes share that revision and whose reads see its own writes. Reading at a
//! past revision and opening the store are the parent's.

use super::*;

/// A batch of writes committed together: the apply loop's unit of work, one or more raft
/// entries. Dropping it without committing aborts the backend transaction, but changes
/// already made to the index stay: a failed batch is fatal to the server.
pub struct WriteBatch<'a> {
    pub(super) store: &'a KvStore,
    pub(super) state: RwLockWriteGuard<'a, State>,
    pub(super) tx: BatchTx<'a>,
    pub(super) changes: Vec<Change>,
    /// The large key-values it stored, for the store's record of them (`recent`).
    pub(super) large: Vec<(Revision, bytes::Bytes)>,
}

impl<'a> WriteBatch<'a> {
    /// Begin a transaction: all its writes share one revision.
    pub fn txn(&mut self) -> Txn<'_, 'a> {
        let main = self.state.current_rev + 1;
        Txn {
            batch: self,
            main,
            sub: 0,
            tally: crate::metrics::TxnTally::default(),
        }
    }

    /// The current revision as this batch sees it.
    pub fn current_rev(&self) -> i64 {
        self.state.current_rev
    }

    /// The compacted revision.
    pub fn compact_rev(&self) -> i64 {
        self.state.compact_rev
    }

    /// The lessor.
    pub fn lessor(&self) -> &Lessor {
        &self.store.lessor
    }

    /// Compact history at `rev`: from this batch's commit on, reads below `rev` are refused;
    /// the history no revision at or after `rev` needs is dropped afterwards, step by step
    /// ([`KvStore::compaction_step`]), so applying a compaction holds up nobody.
    pub fn compact(&mut self, rev: i64) -> Result<()> {
        if rev <= self.state.compact_rev {
            return Err(Error::Compacted {
                requested: rev,
                compacted: self.state.compact_rev,
            });
        }
        if rev > self.state.current_rev {
            return Err(Error::FutureRevision {
                requested: rev,
                current: self.state.current_rev,
            });
        }
        self.tx
            .put(Bucket::META, META_SCHEDULED_COMPACT, &rev.to_be_bytes())?;
        self.state.compact_rev = rev;
        // The compactor's first step takes the index lock, which this batch holds until it
        // commits: the pass never starts ahead of the scheduled mark it finishes.
        self.store.compaction.lock().schedule(rev);
        Ok(())
    }

    /// Grant a lease (already validated: id free, TTL within bounds).
    pub fn lease_grant(&mut self, id: LeaseId, ttl: i64) -> Result<()> {
        if self.store.lessor.contains(id) {
            return Err(Error::LeaseExists(id));
        }
        let record = LeaseRecord {
            id,
            ttl,
            remaining_ttl: 0,
        };
        self.tx
            .put(Bucket::LEASE, &id.to_be_bytes(), &record.encode_to_vec())?;
        self.store.lessor.insert(id, ttl, self.store.backend.now());
        crate::metrics::LEASES_GRANTED.inc();
        crate::metrics::LEASE_TTLS.observe(ttl as f64);
        Ok(())
    }

    /// Revoke a lease: it is removed and every key attached to it is deleted, all in one
    /// revision.
    pub fn lease_revoke(&mut self, id: LeaseId) -> Result<()> {
        let Some(keys) = self.store.lessor.get(id).map(|l| l.keys) else {
            return Err(Error::LeaseNotFound(id));
        };
        let mut txn = self.txn();
        for key in &keys {
            txn.delete_range(KeyRange::new(key, &[]))?;
        }
        txn.end();
        self.tx.delete(Bucket::LEASE, &id.to_be_bytes())?;
        self.store.lessor.remove(id);
        crate::metrics::LEASES_REVOKED.inc();
        Ok(())
    }

    /// Keep a lease's checkpointed remainder in its record (etcd's
    /// `--experimental-enable-lease-checkpoint-persist`; 0 clears it), so that a restarted
    /// member goes on from it rather than from the full TTL. A lease that is gone is skipped.
    pub fn persist_lease_checkpoint(&mut self, id: LeaseId, remaining_ttl: i64) -> Result<()> {
        let Some(ttl) = self.store.lessor.ttl(id) else {
            return Ok(());
        };
        let record = LeaseRecord {
            id,
            ttl,
            remaining_ttl: remaining_ttl.max(0),
        };
        self.tx
            .put(Bucket::LEASE, &id.to_be_bytes(), &record.encode_to_vec())?;
        Ok(())
    }

    /// Write a value to a bucket inside this batch (membership, alarms, meta...).
    pub fn bucket_put(&mut self, bucket: Bucket, key: &[u8], value: &[u8]) -> Result<()> {
        self.tx.put(bucket, key, value)?;
        Ok(())
    }

    /// Delete a value from a bucket inside this batch.
    pub fn bucket_delete(&mut self, bucket: Bucket, key: &[u8]) -> Result<()> {
        self.tx.delete(bucket, key)?;
        Ok(())
    }

    /// Record the raft position this batch brings the store to.
    pub fn set_consistent_index(&mut self, index: u64, term: u64) -> Result<()> {
        self.tx
            .put(Bucket::META, META_CONSISTENT_INDEX, &index.to_be_bytes())?;
        self.tx.put(Bucket::META, META_TERM, &term.to_be_bytes())?;
        self.state.consistent_index = index;
        Ok(())
    }

    /// Take the changes made so far (for watchers), in revision order.
    pub fn take_changes(&mut self) -> Vec<Change> {
        std::mem::take(&mut self.changes)
    }

    /// Commit the batch; `durable` forces an fsync (otherwise the backend decides by time).
    /// Returns the batch's changes and whether the commit was durable.
    pub fn commit(self, durable: bool) -> Result<(Vec<Change>, bool)> {
        let WriteBatch {
            store,
            state,
            tx,
            changes,
            large,
        } = self;
        let durable = tx.commit(durable)?;
        // The index lock is released only now: readers never see uncommitted revisions.
        drop(state);
        // Off the lock: a reader that finds a revision before it is kept reads the backend.
        store.recent.record(&large);
        Ok((changes, durable))
    }
}

/// A transaction inside a batch: every write gets the same main revision. Reads see the
/// transaction's own earlier writes.
pub struct Txn<'b, 'a> {
    batch: &'b mut WriteBatch<'a>,
    main: i64,
    sub: i64,
    /// Its operations, counted when it ends (dropped).
    tally: crate::metrics::TxnTally,
}

impl Drop for Txn<'_, '_> {
    fn drop(&mut self) {
        self.tally.end();
    }
}

impl Txn<'_, '_> {
    /// The revision the transaction's writes get.
    pub fn rev(&self) -> i64 {
        self.main
    }

    /// Whether this transaction has written anything.
    pub fn has_changes(&self) -> bool {
        self.sub > 0
    }

    /// Read a range as this transaction sees it.
    pub fn range(&self, range: KeyRange<'_>, params: RangeParams) -> Result<RangeResult> {
        self.tally.ranges.set(self.tally.ranges.get() + 1);
        let state = &self.batch.state;
        let read_rev = if self.sub > 0 {
            self.main
        } else {
            state.current_rev
        };
        let rev = if params.rev <= 0 {
            read_rev
        } else if params.rev > read_rev {
            return Err(Error::FutureRevision {
                requested: params.rev,
                current: read_rev,
            });
        } else if params.rev < state.compact_rev {
            return Err(Error::Compacted {
                requested: params.rev,
                compacted: state.compact_rev,
            });
        } else {
            params.rev
        };
        let (revs, count) = state.read_range(range, rev, params);
        let mut kvs = Vec::new();
        if !params.count_only {
            for rev in revs {
                let Some(bytes) = self.batch.tx.get(Bucket::KEY, &rev.to_bytes())? else {
                    return Err(Error::Corrupt(format!("revision {rev:?} missing")));
                };
                kvs.push(decode_kv(&bytes)?);
            }
        }
        Ok(RangeResult {
            kvs,
            rev: read_rev,
            count,
        })
    }

    /// Put `key` = `value` attached to `lease` (0 for none). The lease must exist. The
    /// key-value written moves into the batch's events; its encoding moves into the backend's
    /// batch when small, and when large (2 KiB or more, `recent::LARGE`) is copied there and kept for
    /// the values held in memory, which copy it into their chunks at the commit.
    pub fn put(&mut self, key: &[u8], value: impl Into<Vec<u8>>, lease: LeaseId) -> Result<()> {
        if lease != NO_LEASE && !self.batch.store.lessor.contains(lease) {
            return Err(Error::LeaseNotFound(lease));
        }
        let value: Vec<u8> = value.into();
        self.tally.puts += 1;
        self.tally.put_bytes += (key.len() + value.len()) as u64;
        let rev = Revision::new(self.main, self.sub);
        // Recorded in the index first: a batch that fails is fatal, its index changes kept.
        let before = self.batch.state.index.put(key, rev);
        let (create_revision, version) = match before {
            Some(found) => (found.created.main, found.version + 1),
            None => (self.main, 1),
        };
        let kv = KeyValue {
            key: key.to_vec(),
            create_revision,
            mod_revision: self.main,
            version,
            value,
            lease,
        };
        let stored = kv.encode_to_vec();
        if stored.len() >= super::recent::LARGE {
            let kept = self.batch.store.recent.keep(&stored);
            self.batch.large.push((rev, kept));
        }
        self.batch
            .tx
            .put_owned(Bucket::KEY, &rev.to_bytes(), stored)?;
        let lessor = &self.batch.store.lessor;
        let old_lease = lessor.lease_of(key);
        if old_lease != lease {
            lessor.detach(key);
        }
        if lease != NO_LEASE {
            lessor.attach(lease, key);
        }
        self.sub += 1;
        self.batch.changes.push(Event {
            r#type: EventType::Put as i32,
            kv: Some(kv),
            prev_kv: None,
        });
        Ok(())
    }

    /// Delete every key in `range`; returns the deleted keys, in key order.
    pub fn delete_range(&mut self, range: KeyRange<'_>) -> Result<Vec<Vec<u8>>> {
        self.tally.deletes += 1;
        let Some(bounds) = range.bounds() else {
            return Ok(Vec::new());
        };
        let live: Vec<Vec<u8>> = self
            .batch
            .state
            .index
            .range(bounds)
            .filter(|(_, key_index)| key_index.is_live())
            .map(|(key, _)| key.clone())
            .collect();
        for key in &live {
            let rev = Revision::new(self.main, self.sub);
            // Stored as etcd stores a tombstone, `KeyValue { key }` alone, so that the bucket
            // (and a snapshot of it that etcd restores) hashes as etcd's does; the event
            // carries the deletion's revision, as etcd's watchers see it.
            let stored = KeyValue {
                key: key.clone(),
                ..KeyValue::default()
            };
            self.batch
                .tx
                .put(Bucket::KEY, &rev.to_key(true), &stored.encode_to_vec())?;
            let tombstone = KeyValue {
                mod_revision: self.main,
                ..stored
            };
            self.batch.state.index.tombstone(key, rev);
            self.batch.store.lessor.detach(key);
            self.sub += 1;
            self.batch.changes.push(Event {
                r#type: EventType::Delete as i32,
                kv: Some(tombstone),
                prev_kv: None,
            });
        }
        Ok(live)
    }

    /// End the transaction: the store's revision advances if anything was written.
    pub fn end(self) -> i64 {
        if self.sub > 0 {
            self.batch.state.current_rev = self.main;
        }
        self.batch.state.current_rev
    }
}
