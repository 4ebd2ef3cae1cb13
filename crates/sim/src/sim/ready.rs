//! The Ready loop, in `raftnode`'s `NodeCore::on_ready` order, and the applier in the server's
//! image: committed entries applied to each member's real MVCC store, snapshots installed, log
//! compaction, ReadIndex reads served.

use super::*;

impl Sim {
    pub(super) fn process_readies(&mut self) -> Step {
        loop {
            let mut any = false;
            for i in 0..self.members.len() {
                any |= self.process(i)?;
            }
            self.pin_election_timeouts();
            if !any {
                return Ok(());
            }
        }
    }

    pub(super) fn process(&mut self, i: usize) -> Step<bool> {
        let Some(mut node) = self.members[i].node.take() else {
            return Ok(false);
        };
        if !node.has_ready() {
            self.members[i].node = Some(node);
            return Ok(false);
        }
        let result = self.on_ready(i, &mut node);
        self.members[i].node = Some(node);
        result.map(|()| true)
    }

    /// `raftnode`'s `NodeCore::on_ready`, with the storage standing for the WAL.
    pub(super) fn on_ready(&mut self, i: usize, node: &mut RawNode<SimStorage>) -> Step {
        let id = self.members[i].id;
        let mut ready = node.ready();
        self.send(id, ready.take_messages())?;
        if !ready.snapshot().is_empty() {
            self.install_snapshot(i, ready.snapshot().clone())?;
        }
        let leading = (node.raft.state == StateRole::Leader, node.raft.term);
        self.apply(i, ready.take_committed_entries(), leading)?;
        for state in ready.take_read_states() {
            let ctx = <[u8; 8]>::try_from(state.request_ctx.as_slice())
                .map(u64::from_be_bytes)
                .unwrap_or(u64::MAX);
            if let Some(op) = self.members[i].reads.remove(&ctx) {
                self.note("read-index", id, op as u64, state.index);
                self.members[i].read_waits.push((state.index, op));
            }
        }
        let storage = self.members[i].storage.mem.clone();
        let entries = ready.take_entries();
        if !entries.is_empty() {
            storage
                .wl()
                .append(&entries)
                .map_err(|e| format!("persist entries: {e}"))?;
        }
        if let Some(hs) = ready.hs() {
            storage.wl().set_hardstate(hs.clone());
        }
        self.send(id, ready.take_persisted_messages())?;
        let mut light = node.advance(ready);
        if let Some(commit) = light.commit_index() {
            storage.wl().mut_hard_state().commit = commit;
        }
        self.send(id, light.take_messages())?;
        let leading = (node.raft.state == StateRole::Leader, node.raft.term);
        self.apply(i, light.take_committed_entries(), leading)?;
        node.advance_apply();
        self.serve_reads(i)
    }

    /// `raftnode`'s `install_snapshot` with the server's: the store takes the leader's image,
    /// then the log restarts after the snapshot.
    pub(super) fn install_snapshot(&mut self, i: usize, snapshot: raft::eraftpb::Snapshot) -> Step {
        let (index, term) = {
            let meta = snapshot.get_metadata();
            (meta.index, meta.term)
        };
        let member = &mut self.members[i];
        let id = member.id;
        let Some(image) = member.images.remove(&index) else {
            return Err(format!(
                "member {id} installs snapshot {index} without its image"
            ));
        };
        member.images.retain(|&at, _| at > index);
        let Some(kv) = member.kv.as_ref() else {
            return Err(format!("stopped member {id} installs a snapshot"));
        };
        kv.install_snapshot(&image, &[])
            .map_err(|e| format!("install snapshot: {e}"))?;
        let consistent = kv.consistent_index();
        if consistent < index {
            return Err(format!(
                "member {id} installed snapshot {index} from an image at {consistent}"
            ));
        }
        std::fs::copy(&member.db, &member.durable_db)
            .map_err(|e| format!("copy the durable backend: {e}"))?;
        member.last_durable = self.now;
        member
            .storage
            .mem
            .wl()
            .apply_snapshot(snapshot)
            .map_err(|e| format!("raft snapshot: {e}"))?;
        member.storage.applied.set((index, term));
        member.applied = index;
        member.last_mark = index;
        // Entries up to the image's consistent index are skipped by the applier.
        let _ = std::fs::remove_file(&image);
        self.snapshots += 1;
        self.note("snapshot-installed", id, index, consistent);
        Ok(())
    }

    /// `raftnode`'s `on_applied`: with a durable commit, every `snapshot_count` entries, the
    /// log before the catch-up entries goes.
    pub(super) fn maybe_compact(&mut self, i: usize, index: u64, durable: bool) -> Step {
        let Some((count, catch_up)) = self.cfg.compaction else {
            return Ok(());
        };
        let member = &mut self.members[i];
        if !durable || index < member.last_mark + count {
            return Ok(());
        }
        member.last_mark = index;
        let keep_from = index.saturating_sub(catch_up);
        let first = raft::Storage::first_index(&member.storage).unwrap_or(1);
        if keep_from > first {
            member
                .storage
                .mem
                .wl()
                .compact(keep_from)
                .map_err(|e| format!("compact: {e}"))?;
            let id = member.id;
            self.note("compact", id, keep_from, 0);
        }
        Ok(())
    }

    /// `server`'s `apply_batch` for the requests the clients make, with the invariants on
    /// what was applied.
    pub(super) fn apply(&mut self, i: usize, entries: Vec<Entry>, leading: (bool, u64)) -> Step {
        if entries.is_empty() {
            return Ok(());
        }
        let member = &mut self.members[i];
        let id = member.id;
        let Some(kv) = member.kv.as_ref() else {
            return Err(format!("member {id} applies while stopped"));
        };
        let skip_below = kv.consistent_index();
        let mut batch = kv.write().map_err(|e| format!("write batch: {e}"))?;
        let mut results = Vec::new();
        let mut granted = Vec::new();
        let mut revoked = Vec::new();
        let (mut index, mut term) = (0, 0);
        for entry in &entries {
            if entry.index != member.applied + 1 {
                return Err(format!(
                    "member {id} applies entry {} after {}",
                    entry.index, member.applied
                ));
            }
            member.applied = entry.index;
            index = entry.index;
            term = entry.term;
            // The same entry at the same index on every member.
            let seen = (entry.term, payload_hash(entry));
            match self.log.get(entry.index as usize - 1) {
                Some(first) if *first != seen => {
                    return Err(format!(
                        "member {id} applies entry {} of term {}, another member applied term {} there (or another payload)",
                        entry.index, entry.term, first.0
                    ));
                }
                Some(_) => {}
                None => {
                    self.log.push(seen);
                    self.eras.push(self.max_term.max(leading.1));
                }
            }
            if entry.index <= skip_below {
                continue;
            }
            if entry.get_entry_type() != EntryType::EntryNormal {
                return Err(format!(
                    "entry {} is a membership change: none is proposed",
                    entry.index
                ));
            }
            if entry.data.is_empty() {
                continue;
            }
            let request = InternalRaftRequest::decode(entry.data.as_ref())
                .map_err(|e| format!("decode entry: {e}"))?;
            let request_id = request.header.as_ref().map_or(request.id, |h| h.id);
            if let Some(grant) = &request.lease_grant {
                match batch.lease_grant(grant.id, grant.ttl) {
                    Ok(()) => granted.push(grant.id),
                    Err(etcdrs_mvcc::Error::LeaseExists(_)) => {}
                    Err(e) => return Err(format!("lease grant: {e}")),
                }
                continue;
            }
            if let Some(revoke) = &request.lease_revoke {
                match batch.lease_revoke(revoke.id) {
                    Ok(()) => revoked.push(revoke.id),
                    Err(etcdrs_mvcc::Error::LeaseNotFound(_)) => {}
                    Err(e) => return Err(format!("lease revoke: {e}")),
                }
                continue;
            }
            let mut txn = batch.txn();
            let mut succeeded = None;
            if let Some(request) = &request.txn {
                let held = cas_holds(&txn, request)?;
                let ops = if held {
                    &request.success
                } else {
                    &request.failure
                };
                for op in ops {
                    match &op.request {
                        Some(Request::RequestPut(put)) => {
                            txn.put(&put.key, &put.value, put.lease)
                                .map_err(|e| format!("txn put: {e}"))?;
                        }
                        _ => return Err("a txn op the clients never send".into()),
                    }
                }
                succeeded = Some(held);
            } else if let Some(put) = &request.put {
                match txn.put(&put.key, &put.value, put.lease) {
                    Ok(_) => {}
                    // etcd answers "requested lease not found"; nothing is written.
                    Err(etcdrs_mvcc::Error::LeaseNotFound(_)) => {}
                    Err(e) => return Err(format!("put: {e}")),
                }
            } else if let Some(delete) = &request.delete_range {
                txn.delete_range(KeyRange::new(&delete.key, &delete.range_end))
                    .map_err(|e| format!("delete: {e}"))?;
            } else {
                return Err(format!(
                    "entry {} holds no request the clients make",
                    entry.index
                ));
            }
            txn.end();
            results.push((request_id, succeeded));
        }
        if index > skip_below {
            batch
                .set_consistent_index(index, term)
                .map_err(|e| format!("consistent index: {e}"))?;
        }
        let durable = self.now >= member.last_durable + self.cfg.backend_batch_ms;
        batch.commit(durable).map_err(|e| format!("commit: {e}"))?;
        if durable {
            std::fs::copy(&member.db, &member.durable_db)
                .map_err(|e| format!("copy the durable backend: {e}"))?;
            member.last_durable = self.now;
        }
        // The server's applier: the leader's lessor becomes primary once it has applied an
        // entry of its own term, every lease restarting extended by the election timeout;
        // a member that lost leadership stops expiring leases.
        let lessor = kv.lessor();
        let vnow = self.base + Duration::from_millis(self.now);
        let (is_leader, leader_term) = leading;
        if is_leader && term == leader_term && !lessor.is_primary() {
            let election = Duration::from_millis(ELECTION_TICK as u64 * TICK_MS);
            lessor.promote(vnow, election);
            member.promoted_at = Some(self.now);
        } else if !is_leader && lessor.is_primary() {
            lessor.demote();
            member.promoted_at = None;
        }
        // A grant applied on a primary lessor starts its clock at the wall clock's now
        // (`WriteBatch::lease_grant` reads `Instant::now()` itself): restart it at the virtual
        // now, which is what the grant means. Virtual instants are behind the wall clock's,
        // so the grant is not yet expired and `renew` takes it.
        for id in granted {
            if lessor.is_primary() {
                lessor.renew(id, vnow);
            }
        }
        member.storage.applied.set((index, term));
        let revision = kv.current_rev();
        // A store whose image came from a snapshot past `index` is compared at its own index.
        let at_index = kv.consistent_index() == index;
        let hash = if at_index && index % HASH_EVERY == 0 {
            Some(kv.hash_kv(0).map_err(|e| format!("hash: {e}"))?.hash)
        } else {
            None
        };
        match self.revisions.get(&index) {
            _ if !at_index => {}
            Some(&first) if first != revision => {
                return Err(format!(
                    "member {id} is at revision {revision} after applying up to {index}, another member was at {first}"
                ));
            }
            Some(_) => {}
            None => {
                self.revisions.insert(index, revision);
            }
        }
        if let Some(hash) = hash {
            match self.hashes.get(&index) {
                Some(&first) if first != hash => {
                    return Err(format!(
                        "member {id} has HashKV {hash:08x} at applied index {index}, another member had {first:08x}"
                    ));
                }
                Some(_) => {}
                None => {
                    self.hashes.insert(index, hash);
                }
            }
        }
        self.note("apply", id, index, revision as u64);
        self.maybe_compact(i, index, durable)?;
        for lease in revoked {
            if self.leases.remove(&lease).is_some() {
                self.lease_revokes += 1;
                self.note("lease-revoked", id, lease as u64, 0);
            }
        }
        for (request_id, succeeded) in results {
            if let Some(op) = self.members[i].waiters.remove(&request_id) {
                let outcome = match succeeded {
                    Some(held) => Outcome::Cas(held),
                    None => Outcome::Written,
                };
                self.complete(op, outcome);
            }
        }
        Ok(())
    }

    /// Linearizable reads whose read index the apply has reached read the store.
    pub(super) fn serve_reads(&mut self, i: usize) -> Step {
        let member = &mut self.members[i];
        if member.read_waits.is_empty() {
            return Ok(());
        }
        let applied = member.applied;
        let (ready, waiting): (Vec<_>, Vec<_>) = member
            .read_waits
            .drain(..)
            .partition(|(index, _)| *index <= applied);
        member.read_waits = waiting;
        for (_, op) in ready {
            let key = key_bytes(self.ops[op].op.key);
            let Some(kv) = self.members[i].kv.as_ref() else {
                return Err("read on a stopped member".into());
            };
            let result = kv
                .range(KeyRange::new(&key, &[]), RangeParams::default())
                .map_err(|e| format!("range: {e}"))?;
            let value = match result.kvs.first() {
                None => None,
                Some(kv) => Some(
                    std::str::from_utf8(&kv.value)
                        .ok()
                        .and_then(|v| v.parse::<u64>().ok())
                        .ok_or_else(|| format!("a value no client wrote: {:?}", kv.value))?,
                ),
            };
            self.complete(op, Outcome::Read(value));
        }
        Ok(())
    }
}
