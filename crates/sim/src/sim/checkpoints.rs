//! Lease checkpoints across leader changes (etcd's `--experimental-enable-lease-checkpoint`):
//! the leader's checkpoint loop, and the checks that a lease on a leader's lessor never
//! outlives what its grant, its last keep-alive or the last checkpoint its leader applied
//! allows.
//!
//! Real: the lessor's `checkpoints` (what the leader proposes), the applier's
//! `LeaseCheckpoint` apply (every member records the remainders, in the backend too with
//! `lease_checkpoint_persist`), the store's recovery of persisted remainders on a restart, and
//! the lessor's promotion that restarts each lease from its checkpointed remainder. Glue, as
//! for the expiry loop: the server's `run_lease_checkpoints` loop, and the keep-alive's
//! clearing of a checkpointed remainder (`clear_lease_checkpoint`).
//!
//! The checks read the remainders from the log, not from the lessor: each member holds the
//! last checkpoint of each lease among the entries it applied after its `checkpoint_floor`
//! and after its own last renewal of the lease (a renewal clears the remainder on the lessor
//! that renews at once, before its clear reaches the log: that lessor, led again before the
//! clear commits, restarts the lease from its full TTL, as the keep-alive promised).
//! At its promotion at `p`, a lease may expire no later than `p` plus the extension plus that
//! remainder (its full TTL if none stands); a keep-alive it renews, or a grant it applies, sets
//! `now + TTL`. Every step, every leader's lessor is held to that. Early expiry is the
//! revocation check's (`leases`): a keep-alive counts for a later leader only once a
//! checkpoint it cleared is cleared in the log, and not if an older checkpoint lands after it.

use etcdrs_proto::etcdserverpb::{LeaseCheckpoint, LeaseCheckpointRequest};

use super::storage::Checkpointed;
use super::*;

/// What the lease checks saw.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LeaseStats {
    /// Checkpoint entries applied (first applies), and of them clears by a keep-alive.
    pub checkpoints: (u32, u32),
    /// Leaders promoted while they held leases (leader changes with live leases).
    pub promotions_with_leases: u32,
    /// Leases checked at those promotions, and of them those restarted from a checkpoint.
    pub leases_at_promotion: (u32, u32),
    /// Of those restarted from a checkpoint, the ones whose checkpoint the member's lessor
    /// read back from its backend at its last start (persisted checkpoints).
    pub from_persisted: u32,
    /// Lease states checked on leaders, step by step.
    pub checked: u64,
    /// Keep-alives that an older checkpoint applied after them undid for a later leader (a
    /// keep-alive racing a checkpoint in flight).
    pub renewals_undone: u32,
}

/// What a checkpoint request was proposed for.
pub(super) enum Proposed {
    /// The checkpoint loop's, at this time.
    Periodic(u64),
    /// A keep-alive's clear of this lease's remainder: the renewal's place in its log.
    Clear(i64, usize),
}

impl Sim {
    /// Member `i`'s checkpoint loop: on the leader, every lease's remaining TTL goes through
    /// raft (at most 1000, as etcd batches them).
    pub(super) fn checkpoint_leases(&mut self, i: usize) {
        let member = &self.members[i];
        let (Some(node), Some(kv)) = (member.node.as_ref(), member.store()) else {
            return;
        };
        if node.raw().raft.state != StateRole::Leader {
            return;
        }
        let checkpoints = kv.lessor().checkpoints(self.vnow(), 1000);
        if checkpoints.is_empty() {
            return;
        }
        let count = checkpoints.len() as u64;
        let request = InternalRaftRequest {
            header: Some(self.admin_header(self.next_request, i)),
            lease_checkpoint: Some(LeaseCheckpointRequest {
                checkpoints: checkpoints
                    .into_iter()
                    .map(|(id, remaining_ttl)| LeaseCheckpoint { id, remaining_ttl })
                    .collect(),
            }),
            ..InternalRaftRequest::default()
        };
        let request_id = self.next_request;
        self.next_request += 1;
        if let Some(node) = self.members[i].node.as_mut()
            && node.propose(request.encode_to_vec()).is_ok()
        {
            self.checkpoint_requests
                .insert(request_id, Proposed::Periodic(self.now));
            self.note("lease-checkpoint", i as u64 + 1, request_id, count);
        }
    }

    /// A keep-alive renewed lease `id` on member `at`, whose lessor held a checkpointed
    /// remainder for it: the remainder is cleared through raft, as the server does.
    pub(super) fn clear_checkpoint(&mut self, at: usize, id: i64, renewal: usize) {
        let request = InternalRaftRequest {
            header: Some(self.admin_header(self.next_request, at)),
            lease_checkpoint: Some(LeaseCheckpointRequest {
                checkpoints: vec![LeaseCheckpoint {
                    id,
                    remaining_ttl: 0,
                }],
            }),
            ..InternalRaftRequest::default()
        };
        let request_id = self.next_request;
        self.next_request += 1;
        if let Some(node) = self.members[at].node.as_mut()
            && node.propose(request.encode_to_vec()).is_ok()
        {
            self.checkpoint_requests
                .insert(request_id, Proposed::Clear(id, renewal));
        }
    }

    /// Checkpoint entries a member applied: the first apply of each enters the log; a clear
    /// makes its keep-alive known to later leaders, a checkpoint taken before a keep-alive
    /// that lands after it undoes it for them.
    pub(super) fn checkpoints_applied(&mut self, applied: Vec<Checkpointed>) {
        for (index, request_id, pairs) in applied {
            if self.checkpoint_log.contains_key(&index) {
                continue;
            }
            self.checkpoint_log.insert(index, pairs.clone());
            self.lease_stats.checkpoints.0 += 1;
            match self.checkpoint_requests.remove(&request_id) {
                Some(Proposed::Clear(id, renewal)) => {
                    self.lease_stats.checkpoints.1 += 1;
                    let now = self.now;
                    if let Some(r) = self
                        .leases
                        .get_mut(&id)
                        .and_then(|log| log.renewals.get_mut(renewal))
                    {
                        r.known_from = Some(now);
                    }
                }
                Some(Proposed::Periodic(taken)) => {
                    for (id, remaining) in pairs {
                        let Some(log) = self.leases.get_mut(&id) else {
                            continue;
                        };
                        for r in &mut log.renewals {
                            if remaining > 0 && r.at > taken && r.known_from.is_some() {
                                r.known_from = None;
                                self.lease_stats.renewals_undone += 1;
                            }
                        }
                    }
                }
                None => {}
            }
        }
    }

    /// The remainder member `i`'s lessor holds for lease `id`: the last checkpoint of it among
    /// the entries it applied after its floor and after its own last renewal of the lease (0:
    /// none, or cleared), and that entry's index.
    fn checkpointed(&self, i: usize, id: i64) -> (i64, u64) {
        let member = &self.members[i];
        let floor = member
            .checkpoint_floor
            .max(member.renewed_at.get(&id).copied().unwrap_or(0));
        if floor >= member.applied {
            return (0, 0);
        }
        self.checkpoint_log
            .range(floor + 1..=member.applied)
            .rev()
            .find_map(|(index, pairs)| {
                let (_, remaining) = pairs.iter().rev().find(|(l, _)| *l == id)?;
                Some((*remaining, *index))
            })
            .unwrap_or((0, 0))
    }

    /// Member `i`'s lessor has just been promoted: each lease may live until the extension
    /// plus its checkpointed remainder, else its full TTL.
    pub(super) fn promoted(&mut self, i: usize) -> Step {
        let Some(kv) = self.members[i].store().cloned() else {
            return Ok(());
        };
        let lessor = kv.lessor();
        if self.cfg.ignore_lease_checkpoints {
            // The planted bug: the new leader forgets every remainder.
            for id in lessor.ids() {
                lessor.checkpoint(id, 0);
            }
            lessor.promote(self.vnow(), Duration::from_millis(LEASE_EXTEND_MS));
        }
        let ids = lessor.ids();
        let mut allowance = BTreeMap::new();
        let mut from_checkpoint = 0;
        for &id in &ids {
            let Some(ttl) = lessor.ttl(id) else {
                continue;
            };
            let (remaining, index) = self.checkpointed(i, id);
            from_checkpoint += u32::from(remaining > 0);
            if remaining > 0 && index <= self.members[i].started_at {
                self.lease_stats.from_persisted += 1;
            }
            let lives = if remaining > 0 { remaining } else { ttl };
            allowance.insert(id, self.now + LEASE_EXTEND_MS + lives as u64 * 1000);
        }
        if !ids.is_empty() {
            self.lease_stats.promotions_with_leases += 1;
            self.lease_stats.leases_at_promotion.0 += ids.len() as u32;
            self.lease_stats.leases_at_promotion.1 += from_checkpoint;
            let member_id = self.members[i].id;
            self.note(
                "lease-promote",
                member_id,
                ids.len() as u64,
                from_checkpoint as u64,
            );
        }
        self.members[i].lease_allowance = allowance;
        Ok(())
    }

    /// Every leader's lessor: no lease expires later than its allowance (one granted since
    /// the promotion is allowed its TTL from the step its grant applied in).
    pub(super) fn check_lease_allowances(&mut self) -> Step {
        let now = self.now;
        for i in 0..self.members.len() {
            let member = &self.members[i];
            if member.promoted_at.is_none() {
                continue;
            }
            let (Some(node), Some(kv)) = (member.node.as_ref(), member.store()) else {
                continue;
            };
            if node.raw().raft.state != StateRole::Leader {
                continue;
            }
            let kv = kv.clone();
            let lessor = kv.lessor();
            for id in lessor.ids() {
                let Some(lease) = lessor.get(id) else {
                    continue;
                };
                let Some(expiry) = lease.expiry else {
                    continue;
                };
                let expiry_ms = expiry.saturating_duration_since(self.base).as_millis() as u64;
                let allowed = *self.members[i]
                    .lease_allowance
                    .entry(id)
                    .or_insert(now + lease.ttl as u64 * 1000);
                self.lease_stats.checked += 1;
                if expiry_ms > allowed {
                    return Err(format!(
                        "leader {} holds lease {id} (TTL {} s) until {expiry_ms} ms, beyond the {allowed} ms its grant, last keep-alive or last applied checkpoint allows (checkpoint it applied: {} s, promoted at {:?})",
                        self.members[i].id,
                        lease.ttl,
                        self.checkpointed(i, id).0,
                        self.members[i].promoted_at
                    ));
                }
            }
        }
        Ok(())
    }
}
