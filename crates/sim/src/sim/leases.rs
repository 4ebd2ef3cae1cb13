//! Leases on the virtual clock: the leader's expiry loop and the clients' grants and keep-alives.

use super::*;

impl Sim {
    pub(super) fn vnow(&self) -> Instant {
        self.base + Duration::from_millis(self.now)
    }

    /// The server's lease-expiry loop on member `i`: on the leader, expired leases are
    /// revoked through raft. Checks first that each has outlived its TTL since its grant and
    /// every renewal this leader knew of (those made on it, and any made anywhere before it
    /// took over: renewals are the leader's own, so one made on another member meanwhile is
    /// not its to honour, as in etcd; with checkpoints, one whose clearing of a checkpoint had
    /// not applied, or that an older checkpoint undid, is not either).
    pub(super) fn expire_leases(&mut self, i: usize) -> Step {
        let vnow = self.vnow() + Duration::from_millis(self.cfg.lease_clock_ahead_ms);
        let member = &self.members[i];
        let (Some(node), Some(kv)) = (member.node.as_ref(), member.store()) else {
            return Ok(());
        };
        if node.raw().raft.state != StateRole::Leader {
            return Ok(());
        }
        let expired = kv.lessor().expired(vnow, 500);
        if expired.is_empty() {
            return Ok(());
        }
        let Some(promoted) = member.promoted_at else {
            return Err(format!(
                "member {} expires leases without having been promoted",
                member.id
            ));
        };
        for id in expired {
            let Some(log) = self.leases.get(&id) else {
                continue;
            };
            let known = log
                .renewals
                .iter()
                .filter(|r| r.on == i || r.known_from.is_some_and(|k| k <= promoted))
                .map(|r| r.at)
                .max()
                .unwrap_or(0)
                .max(log.granted_at);
            let due = known + log.ttl as u64 * 1000;
            if self.now < due {
                return Err(format!(
                    "member {} expires lease {id} (TTL {} s) at {} ms, before {due} ms: granted at {}, renewed at (ms, member index, known to later leaders from) {:?}, promoted at {promoted}",
                    self.members[i].id,
                    log.ttl,
                    self.now,
                    log.granted_at,
                    log.renewals
                        .iter()
                        .map(|r| (r.at, r.on, r.known_from))
                        .collect::<Vec<_>>()
                ));
            }
            let request = InternalRaftRequest {
                header: Some(self.admin_header(self.next_request, i)),
                lease_revoke: Some(LeaseRevokeRequest { id }),
                ..InternalRaftRequest::default()
            };
            self.next_request += 1;
            if let Some(node) = self.members[i].node.as_mut() {
                let _ = node.propose(request.encode_to_vec());
            }
            let member_id = self.members[i].id;
            self.note("lease-expire", member_id, id as u64, 0);
        }
        Ok(())
    }

    /// A client grants a lease with a key on it, or renews one at the member it takes for
    /// the leader; neither waits, and neither enters the checked history.
    pub(super) fn lease_action(&mut self, i: usize) {
        let renewable: Vec<i64> = self.leases.keys().copied().collect();
        if renewable.is_empty() || self.rng.random_bool(0.3) {
            let id = self.next_lease;
            self.next_lease += 1;
            // With checkpoints, TTLs long enough for a remainder below the TTL to be
            // checkpointed (etcd skips one that rounds up to the TTL).
            let ttl = if self.cfg.lease_checkpoint_ms.is_some() {
                self.rng.random_range(2..=4)
            } else {
                self.rng.random_range(1..=2)
            };
            let grant = InternalRaftRequest {
                header: Some(self.admin_header(self.next_request, i)),
                lease_grant: Some(LeaseGrantRequest { ttl, id }),
                ..InternalRaftRequest::default()
            };
            let put = InternalRaftRequest {
                header: Some(self.admin_header(self.next_request + 1, i)),
                put: Some(PutRequest {
                    key: format!("lease-{id}").into_bytes(),
                    value: b"held".to_vec().into(),
                    lease: id,
                    ..PutRequest::default()
                }),
                ..InternalRaftRequest::default()
            };
            self.next_request += 2;
            let Some(node) = self.members[i].node.as_mut() else {
                return;
            };
            if node.propose(grant.encode_to_vec()).is_ok() {
                let _ = node.propose(put.encode_to_vec());
                self.leases.insert(
                    id,
                    LeaseLog {
                        ttl,
                        granted_at: self.now,
                        renewals: Vec::new(),
                    },
                );
                self.note("lease-grant", i as u64 + 1, id as u64, ttl as u64);
            }
            return;
        }
        let id = renewable[self.rng.random_range(0..renewable.len())];
        // A follower forwards a keep-alive to its leader; the renewal happens there.
        let leader = self.members[i]
            .node
            .as_ref()
            .map(|n| n.raw().raft.leader_id)
            .unwrap_or(raft::INVALID_ID);
        let Some(at) = (leader as usize).checked_sub(1) else {
            return;
        };
        if at >= self.members.len() || self.members[at].paused_until > self.now {
            return;
        }
        let vnow = self.vnow();
        let Some(kv) = self.members[at].store() else {
            return;
        };
        let lessor = kv.lessor();
        if let Renewal::Renewed {
            ttl,
            clear_checkpoint,
        } = lessor.renew(id, vnow)
        {
            let clear = clear_checkpoint && self.cfg.lease_checkpoint_ms.is_some();
            // The planted bug believes the renewal stands everywhere, and clears nothing.
            let planted = clear && self.cfg.renewal_keeps_checkpoint;
            let clear = clear && !planted;
            let now = self.now;
            let member = &mut self.members[at];
            member.lease_allowance.insert(id, now + ttl as u64 * 1000);
            member.renewed_at.insert(id, member.applied);
            let Some(log) = self.leases.get_mut(&id) else {
                return;
            };
            log.renewals.push(Renewed {
                at: now,
                on: at,
                known_from: (!clear).then_some(now),
            });
            let renewal = log.renewals.len() - 1;
            if clear {
                self.clear_checkpoint(at, id, renewal);
            }
            self.note("lease-renew", leader, id as u64, u64::from(clear));
        }
    }
}
