//! Each member's `Ready` step, run by `raftnode`'s own node (persist, send, apply through the
//! server's applier, advance), and what the simulator does after it: the messages go to the
//! network, what the applier reported is checked against every other member, answered
//! proposals complete, and ReadIndex reads whose index the apply reached read the store.

use super::*;

impl Sim {
    pub(super) fn process_readies(&mut self) -> Step {
        loop {
            let mut any = false;
            for i in 0..self.members.len() {
                any |= self.process(i)?;
                self.schedule_disk_write(i);
            }
            self.pin_election_timeouts();
            if !any {
                return Ok(());
            }
        }
    }

    pub(super) fn process(&mut self, i: usize) -> Step<bool> {
        let Some(node) = self.members[i].node.as_mut() else {
            return Ok(false);
        };
        let had_ready = match node.process() {
            Ok(had_ready) => had_ready,
            // The applier stops a member that applied its own removal, as etcd's server
            // exits then.
            Err(e) if self.removed_itself(i, &e) => {
                self.retire(i);
                return Ok(false);
            }
            Err(e) => {
                return Err(format!(
                    "member {} stopped on an error: {e}",
                    self.members[i].id
                ));
            }
        };
        // Messages, applies and read states all come out of a `Ready`.
        if had_ready {
            self.after_process(i)?;
        }
        Ok(had_ready)
    }

    /// What follows a member's turn: its messages go out, its applier's reports are checked,
    /// answered requests complete.
    pub(super) fn after_process(&mut self, i: usize) -> Step {
        let id = self.members[i].id;
        let messages = std::mem::take(&mut *lock(&self.members[i].outbox.0));
        self.send(id, messages)?;
        let observed = std::mem::take(&mut *lock(&self.members[i].observed));
        for observation in observed {
            self.observe(i, observation)?;
        }
        self.answer_waiters(i)?;
        self.answer_compactions(i)?;
        self.take_read_states(i);
        self.serve_reads(i)
    }

    /// Checks one report of member `i`'s applier or log against what every member did.
    fn observe(&mut self, i: usize, observation: Observed) -> Step {
        let id = self.members[i].id;
        match observation {
            Observed::Applied {
                entries,
                raft_term,
                index,
                revision,
                at_index,
                hash,
                durable,
                revoked,
                primary,
                events,
                compact_rev,
                auth_verdicts,
                checkpoints,
            } => {
                for (request_id, verdict) in auth_verdicts {
                    self.auth_verdicts.entry(request_id).or_insert(verdict);
                }
                self.history
                    .record(&events)
                    .map_err(|e| format!("member {id}: {e}"))?;
                if self.cfg.watches {
                    self.history.committed(revision);
                }
                for (entry_index, entry_term, payload) in entries {
                    let member = &mut self.members[i];
                    if entry_index != member.applied + 1 {
                        return Err(format!(
                            "member {id} applies entry {entry_index} after {}",
                            member.applied
                        ));
                    }
                    member.applied = entry_index;
                    // The same entry at the same index on every member.
                    let seen = (entry_term, payload);
                    match self.log.get(entry_index as usize - 1) {
                        Some(first) if *first != seen => {
                            return Err(format!(
                                "member {id} applies entry {entry_index} of term {entry_term}, another member applied term {} there (or another payload)",
                                first.0
                            ));
                        }
                        Some(_) => {}
                        None => {
                            self.log.push(seen);
                            self.eras.push(self.max_term.max(raft_term));
                        }
                    }
                }
                // A store whose image came from a snapshot past `index` is compared at its own
                // index.
                if at_index && let Some(first) = disagreement(&mut self.revisions, index, revision)
                {
                    return Err(format!(
                        "member {id} is at revision {revision} after applying up to {index}, another member was at {first}"
                    ));
                }
                if at_index
                    && let Some(first) = disagreement(&mut self.compacted, index, compact_rev)
                {
                    return Err(format!(
                        "member {id} has compacted at revision {compact_rev} after applying up to {index}, another member at {first}"
                    ));
                }
                if let Some(hash) = hash
                    && let Some(first) = disagreement(&mut self.hashes, index, hash)
                {
                    return Err(format!(
                        "member {id} has HashKV {hash:08x} at applied index {index}, another member had {first:08x}"
                    ));
                }
                self.checkpoints_applied(checkpoints);
                let member = &mut self.members[i];
                match (primary, member.promoted_at) {
                    (true, None) => {
                        member.promoted_at = Some(self.now);
                        self.promoted(i)?;
                    }
                    (false, _) => {
                        member.promoted_at = None;
                        member.lease_allowance.clear();
                    }
                    (true, Some(_)) => {}
                }
                self.note("apply", id, index, revision as u64);
                if durable {
                    self.note("durable", id, index, 0);
                }
                for lease in revoked {
                    if self.leases.remove(&lease).is_some() {
                        self.lease_revokes += 1;
                        self.note("lease-revoked", id, lease as u64, 0);
                    }
                }
            }
            Observed::Restored { index, consistent } => {
                if consistent < index {
                    return Err(format!(
                        "member {id} installed snapshot {index} from an image at {consistent}"
                    ));
                }
                // Entries up to the image's consistent index are skipped by the applier.
                self.members[i].applied = index;
                // The applier demotes a lessor that installs a snapshot.
                self.members[i].promoted_at = None;
                self.members[i].lease_allowance.clear();
                self.members[i].renewed_at.clear();
                // The image's lessor holds no checkpoint unless they persist.
                if !self.cfg.lease_checkpoint_persist {
                    self.members[i].checkpoint_floor = consistent;
                }
                self.snapshots += 1;
                self.note("snapshot-installed", id, index, consistent);
            }
            Observed::Released { index } => self.note("compact", id, index, 0),
        }
        Ok(())
    }

    /// Proposals whose entry applied on member `i` complete with the applier's answer.
    fn answer_waiters(&mut self, i: usize) -> Step {
        let member = &mut self.members[i];
        let id = member.id;
        let mut answered = Vec::new();
        member
            .waiters
            .retain(|request_id, (op, answer)| match answer.try_recv() {
                Ok(output) => {
                    answered.push((*request_id, *op, output));
                    false
                }
                Err(oneshot::error::TryRecvError::Empty) => true,
                Err(oneshot::error::TryRecvError::Closed) => false,
            });
        for (request_id, op, output) in answered {
            if self.cfg.auth && !self.judge_write(id, request_id, &output)? {
                // Refused at its apply: it did not happen.
                self.fail(op);
                continue;
            }
            let outcome = match output {
                Ok(ApplyOutput::Txn(txn)) => Outcome::Cas(txn.succeeded),
                Ok(_) => Outcome::Written,
                // None of the clients' requests is one the applier may refuse.
                Err(e) => {
                    return Err(format!(
                        "member {id} answered operation {op} with an error: {e}"
                    ));
                }
            };
            self.complete(op, outcome);
        }
        Ok(())
    }

    /// Read indexes raft answered on member `i`: the read waits for the apply to reach it.
    fn take_read_states(&mut self, i: usize) {
        let member = &mut self.members[i];
        let mut answered = Vec::new();
        member
            .reads
            .retain_mut(|(op, answer)| match answer.try_recv() {
                Ok(Ok(index)) => {
                    answered.push((*op, index));
                    false
                }
                Ok(Err(_)) | Err(oneshot::error::TryRecvError::Closed) => false,
                Err(oneshot::error::TryRecvError::Empty) => true,
            });
        let id = member.id;
        for (op, index) in answered {
            self.note("read-index", id, op as u64, index);
            self.members[i].read_waits.push((index, op));
        }
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
            if !self.read_permitted(i, &key)? {
                self.fail(op);
                continue;
            }
            let Some(store) = self.members[i].store() else {
                return Err("read on a stopped member".into());
            };
            let result = store
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

/// Records `value` as what the members hold at applied index `index`; if another member
/// recorded something else there first, returns that instead.
fn disagreement<V: Copy + PartialEq>(
    seen: &mut std::collections::BTreeMap<u64, V>,
    index: u64,
    value: V,
) -> Option<V> {
    let first = *seen.entry(index).or_insert(value);
    (first != value).then_some(first)
}
