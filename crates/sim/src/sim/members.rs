//! Members start, crash (a clean stop or a power cut) and restart, and the faults the seed draws:
//! partitions, stalls, leader transfers.

use super::*;

impl Sim {
    /// Start (or restart) member `i` from its raft storage and its backend, as a member
    /// restarts from its WAL and `member/snap/db`.
    pub(super) fn start_member(&mut self, i: usize) -> Step {
        let member = &mut self.members[i];
        let mut backend = Backend::open(&member.db).map_err(|e| format!("open backend: {e}"))?;
        // Nothing becomes durable by the wall clock: only a clean stop makes it so.
        backend.set_batching(Duration::from_secs(1 << 40), u64::MAX);
        let kv = KvStore::open(backend, 1).map_err(|e| format!("open store: {e}"))?;
        kv.force_durable()
            .map_err(|e| format!("durable commit: {e}"))?;
        std::fs::copy(&member.db, &member.durable_db)
            .map_err(|e| format!("copy the durable backend: {e}"))?;
        member.last_durable = self.now;
        let applied = kv.consistent_index();
        // Entries applied before a crash whose backend commits it lost: raft replays them.
        self.replayed += member.applied.saturating_sub(applied);
        {
            // As `raftnode` restarts: entries the store applied were committed.
            let mut core = member.storage.mem.wl();
            let commit = core.hard_state().commit.max(applied);
            core.mut_hard_state().commit = commit;
        }
        let applied_term = raft::Storage::term(&member.storage, applied).unwrap_or(0);
        member.storage.applied.set((applied, applied_term));
        member.last_mark = member.last_mark.min(applied);
        let config = raft_config(member.id, applied, self.cfg.pre_vote);
        let node = RawNode::new(&config, member.storage.clone(), &self.logger)
            .map_err(|e| format!("start raft: {e}"))?;
        member.node = Some(node);
        member.kv = Some(kv);
        member.applied = applied;
        member.promoted_at = None;
        let id = member.id;
        self.note("start", id, applied, 0);
        // raft drew the new node's election timeout from the thread's RNG.
        self.pin_election_timeouts();
        Ok(())
    }

    pub(super) fn crash(&mut self, i: usize) {
        let clean = self.rng.random_bool(0.5);
        let member = &mut self.members[i];
        if member.node.take().is_none() {
            return;
        }
        if let Some(kv) = member.kv.take() {
            if clean {
                // A clean stop: the backend's last commits reach the disk.
                let _ = kv.force_durable();
            }
            drop(kv);
            if !clean {
                // A power cut: what was committed since the last durable commit is lost, and
                // raft replays it from the log after the consistent index.
                let _ = std::fs::copy(&member.durable_db, &member.db);
            }
        }
        member.waiters.clear();
        member.reads.clear();
        member.read_waits.clear();
        member.images.clear();
        member.promoted_at = None;
        let id = member.id;
        self.crashes += 1;
        self.note("crash", id, u64::from(clean), 0);
        let after = self.rng.random_range(50..=800);
        self.schedule(after, Event::Restart(i));
    }

    pub(super) fn fault(&mut self) {
        if !self.faults {
            return;
        }
        match self.rng.random_range(0..6) {
            0 | 1 if self.cfg.partitions && self.groups.is_none() => {
                let n = self.members.len();
                let groups: Vec<u8> = if self.rng.random_bool(0.5) {
                    let alone = self.rng.random_range(0..n);
                    (0..n).map(|i| u8::from(i == alone)).collect()
                } else {
                    (0..n).map(|_| self.rng.random_range(0..2)).collect()
                };
                let mask = groups
                    .iter()
                    .enumerate()
                    .fold(0u64, |m, (i, g)| m | (u64::from(*g) << i));
                self.groups = Some(groups);
                self.partitions += 1;
                self.note("partition", mask, 0, 0);
                let after = self.rng.random_range(100..=1500);
                self.schedule(after, Event::Heal);
            }
            4 if self.cfg.pauses => {
                let i = self.rng.random_range(0..self.members.len());
                let pause = self.rng.random_range(50..=600);
                self.members[i].paused_until = self.now + pause;
                let id = self.members[i].id;
                self.pauses += 1;
                self.note("pause", id, pause, 0);
            }
            5 if self.cfg.pauses => {
                let n = self.members.len() as u64;
                let to = self.rng.random_range(1..=n);
                let leader = self.members.iter_mut().find(|m| {
                    m.paused_until <= self.now
                        && m.node
                            .as_ref()
                            .is_some_and(|n| n.raft.state == StateRole::Leader)
                });
                if let Some(member) = leader
                    && member.id != to
                    && let Some(node) = member.node.as_mut()
                {
                    node.transfer_leader(to);
                    let id = member.id;
                    self.transfers += 1;
                    self.note("transfer-leader", id, to, 0);
                }
            }
            2 if self.cfg.crashes => {
                let up: Vec<usize> = (0..self.members.len())
                    .filter(|&i| self.members[i].node.is_some())
                    .collect();
                if !up.is_empty() {
                    let i = up[self.rng.random_range(0..up.len())];
                    self.schedule(0, Event::Crash(i));
                }
            }
            _ => {}
        }
        let after = self.rng.random_range(50..=500);
        self.schedule(after, Event::Fault);
    }
}
