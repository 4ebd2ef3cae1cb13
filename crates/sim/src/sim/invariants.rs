//! The invariants checked as a run goes (leaders) and at its end (convergence), and the report.

use super::*;

impl Sim {
    pub(super) fn check_leaders(&mut self) -> Step {
        for member in &self.members {
            if let Some(node) = member.node.as_ref() {
                self.max_term = self.max_term.max(node.raw().raft.term);
            }
        }
        for i in 0..self.members.len() {
            let Some(node) = self.members[i].node.as_ref() else {
                continue;
            };
            if node.raw().raft.state != StateRole::Leader {
                continue;
            }
            let (id, term) = (node.raw().raft.id, node.raw().raft.term);
            match self.leaders.get(&term) {
                Some(&leader) if leader != id => {
                    return Err(format!("members {leader} and {id} both lead term {term}"));
                }
                Some(_) => {}
                None => {
                    // Leader completeness: every entry committed before its term is in its log.
                    for (at, (entry_term, _)) in self.log.iter().enumerate() {
                        let index = at as u64 + 1;
                        if self.eras[at] >= term {
                            continue;
                        }
                        // Compacted away: covered by the snapshot it holds.
                        if index < node.raw().raft.raft_log.first_index() {
                            continue;
                        }
                        let held = node.raw().raft.raft_log.term(index).unwrap_or(0);
                        if held != *entry_term {
                            return Err(format!(
                                "member {id} leads term {term} without entry {index} of term {entry_term} (holds term {held})"
                            ));
                        }
                    }
                    if term < self.max_term {
                        self.late_leaders += 1;
                    }
                    self.leaders.insert(term, id);
                    self.note("leader", id, term, 0);
                }
            }
        }
        Ok(())
    }

    pub(super) fn leader(&self) -> Option<&raft::Raft<etcdrs_raftnode::NodeStorage>> {
        self.members
            .iter()
            .filter_map(|m| m.node.as_ref())
            .map(|n| &n.raw().raft)
            .filter(|r| r.state == StateRole::Leader)
            .max_by_key(|r| r.term)
    }

    pub(super) fn converged(&self) -> bool {
        if self.clients.iter().any(|c| c.busy.is_some()) {
            return false;
        }
        let Some(leader) = self.leader() else {
            return false;
        };
        let commit = leader.raft_log.committed;
        commit == leader.raft_log.last_index()
            && self
                .members
                .iter()
                .filter(|m| m.is_member())
                .all(|m| m.node.is_some() && m.applied == commit)
    }

    pub(super) fn convergence(&self) -> String {
        let members: Vec<String> = self
            .members
            .iter()
            .map(|m| match &m.node {
                None if m.removed => format!("{}: removed", m.id),
                None if m.awaiting_addition => format!("{}: addition not applied", m.id),
                None => format!("{}: down", m.id),
                Some(n) => {
                    let raft = &n.raw().raft;
                    format!(
                        "{}: {:?} term {} commit {} applied {}",
                        m.id, raft.state, raft.term, raft.raft_log.committed, m.applied
                    )
                }
            })
            .collect();
        let busy = self.clients.iter().filter(|c| c.busy.is_some()).count();
        format!("{}; {busy} clients waiting", members.join(", "))
    }

    pub(super) fn finish(&mut self) -> Step<Report> {
        // Watchers caught up and checked to the end; compactions carried out (the backend
        // hashes below compare what they left).
        self.finish_watches()?;
        let mut first: Option<(u64, i64, u32, u32)> = None;
        for member in self.members.iter().filter(|m| m.is_member()) {
            let Some(kv) = member.store() else {
                return Err(format!("member {} is down at the end", member.id));
            };
            let hash_kv = kv.hash_kv(0).map_err(|e| format!("hash: {e}"))?;
            let (hash, _) = kv.hash().map_err(|e| format!("hash: {e}"))?;
            let here = (member.applied, kv.current_rev(), hash_kv.hash, hash);
            match first {
                None => first = Some(here),
                Some(first) if first != here => {
                    return Err(format!(
                        "members diverge at the end: (applied, revision, HashKV, hash) {first:?} and {here:?} on member {}",
                        member.id
                    ));
                }
                Some(_) => {}
            }
        }
        let (applied, revision, hash_kv, _) = first.unwrap_or_default();
        self.note("end", applied, revision as u64, u64::from(hash_kv));
        let history: Vec<Operation> = self
            .ops
            .iter()
            .filter(|o| match o.state {
                OpState::Done => true,
                OpState::Open | OpState::Abandoned => !matches!(o.op.kind, Kind::Get(_)),
                OpState::Failed => false,
            })
            .map(|o| o.op.clone())
            .collect();
        let summary = Checker::default()
            .check(&history)
            .map_err(|violation| format!("the history is not linearizable: {violation}"))?;
        let term = self
            .members
            .iter()
            .filter_map(|m| m.node.as_ref())
            .map(|n| n.raw().raft.term)
            .max()
            .unwrap_or(0);
        Ok(Report {
            seed: self.cfg.seed,
            trace_hash: self.trace.hasher.finish(),
            events: self.trace.events,
            history: history.len(),
            completed: history.iter().filter(|o| o.complete.is_some()).count(),
            unknown: history.iter().filter(|o| o.complete.is_none()).count(),
            cas: history.iter().fold((0, 0), |(yes, no), o| match o.kind {
                Kind::Cas {
                    succeeded: Some(true),
                    ..
                } => (yes + 1, no),
                Kind::Cas {
                    succeeded: Some(false),
                    ..
                } => (yes, no + 1),
                _ => (yes, no),
            }),
            applied,
            revision,
            term,
            crashes: self.crashes,
            partitions: self.partitions,
            pauses: self.pauses,
            disk_stalls: self.disk_stalls,
            transfers: self.transfers,
            simulated_ms: self.now,
            checker_states: summary.states,
            checker_gave_up: summary.gave_up.len(),
            leases: self.next_lease - 1,
            lease_revokes: self.lease_revokes,
            replayed: self.replayed,
            snapshots: self.snapshots,
            late_leaders: self.late_leaders,
            removed: self.removed,
            added: (self.added, self.promoted),
            added_voters: self.added_voters,
            watches: self.watch_stats,
            auth: self.auth_stats,
            lease_checks: self.lease_stats,
        })
    }
}
