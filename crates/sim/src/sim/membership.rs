//! Membership changes at run time, as an operator makes them with etcdctl: a learner added
//! (etcd's MemberAdd --learner: `ConfChangeAddLearnerNode`, the new member started with an
//! empty log to join) or a voter added directly (MemberAdd: `ConfChangeAddNode`), promoted (MemberPromote: `ConfChangeAddNode` of the learner) and
//! members removed (MemberRemove: `ConfChangeRemoveNode`), each proposed by the leader through
//! `raftnode::Node` as the server proposes it. Once a member that has its whole bootstrap
//! configuration applies a removal, the removed member is gone for good: it stops, is never
//! restarted, and the network carries nothing from or to it (etcd's peers refuse a removed
//! member's messages, and the removed member exits). Only five-member clusters change, by at
//! most one learner and two removals, so that a quorum survives the other faults as in a
//! three-member cluster.

use etcdrs_raftnode::confchange::ChangeKind;
use etcdrs_server::membership::Member as ClusterMember;

use super::*;

/// Members a run removes at most.
const MAX_REMOVALS: usize = 2;
/// Learners a run adds at most.
const MAX_ADDITIONS: u32 = 1;

impl Sim {
    /// The leader, if one is up and not stalled: its index.
    fn running_leader(&self) -> Option<usize> {
        (0..self.members.len()).find(|&i| {
            let m = &self.members[i];
            m.paused_until <= self.now
                && m.node
                    .as_ref()
                    .is_some_and(|n| n.raw().raft.state == StateRole::Leader)
        })
    }

    /// Proposes `change` on the leader `i`; whether raft took it.
    fn propose_change(&mut self, i: usize, kind: ChangeKind, id: u64, learner: bool) -> bool {
        let context = matches!(kind, ChangeKind::AddNode | ChangeKind::AddLearnerNode).then(|| {
            let member = ClusterMember {
                id,
                name: format!("m{id}"),
                peer_urls: Vec::new(),
                client_urls: Vec::new(),
                is_learner: learner,
            };
            serde_json::to_vec(&member).unwrap_or_default()
        });
        let change = EtcdConfChange {
            id: self.next_request,
            kind,
            node_id: id,
            context,
        };
        self.next_request += 1;
        let Some(node) = self.members[i].node.as_mut() else {
            return false;
        };
        let mut answer = node.propose_conf_change(change);
        matches!(answer.try_recv(), Ok(Ok(())))
    }

    /// A fault: the leader adds a learner (or, with `voter`, a voter directly: etcd's
    /// MemberAdd without --learner, `ConfChangeAddNode` of a member that has nothing yet), and
    /// the new member starts with an empty log.
    pub(super) fn add_member(&mut self, voter: bool) -> Step {
        if self.added >= MAX_ADDITIONS {
            return Ok(());
        }
        let Some(leader) = self.running_leader() else {
            return Ok(());
        };
        let id = self.members.len() as u64 + 1;
        let kind = if voter {
            ChangeKind::AddNode
        } else {
            ChangeKind::AddLearnerNode
        };
        if !self.propose_change(leader, kind, id, !voter) {
            return Ok(());
        }
        let mut member = Member::new(id, self._dir.path(), true);
        member.learner = !voter;
        self.members.push(member);
        self.added += 1;
        self.added_voters += u32::from(voter);
        let leader_id = self.members[leader].id;
        let what = if voter { "add-voter" } else { "add-learner" };
        self.note(what, leader_id, id, 0);
        Ok(())
    }

    /// Starts each added member once some member has applied its addition, as an operator
    /// starts one once `etcdctl member add` has answered (an addition that never commits
    /// leaves it unstarted, not a member).
    pub(super) fn start_added(&mut self) -> Step {
        for i in 0..self.members.len() {
            if !self.members[i].awaiting_addition {
                continue;
            }
            let id = self.members[i].id;
            let applied = self
                .members
                .iter()
                .any(|m| m.node.as_ref().is_some_and(|n| in_configuration(n, id)));
            if !applied {
                continue;
            }
            self.members[i].awaiting_addition = false;
            self.start_member(i)?;
            self.schedule(TICK_MS, Event::Tick(i));
            self.schedule(LEASE_EXPIRY_MS, Event::LeaseExpiry(i));
            if let Some(interval) = self.cfg.lease_checkpoint_ms {
                self.schedule(interval, Event::LeaseCheckpoint(i));
            }
            if self.cfg.background_flush {
                self.schedule(FLUSH_POLL_MS, Event::BackendFlush(i));
            }
        }
        Ok(())
    }

    /// A fault: the leader promotes the learner to a voter.
    pub(super) fn promote_learner(&mut self) -> Step {
        let Some(i) = self
            .members
            .iter()
            .position(|m| m.learner && !m.removed && !m.awaiting_addition)
        else {
            return Ok(());
        };
        let Some(leader) = self.running_leader() else {
            return Ok(());
        };
        let id = self.members[i].id;
        if self.propose_change(leader, ChangeKind::AddNode, id, false) {
            // Clients may use it from now on; if the promotion is lost it serves as a
            // learner would not, which raft still keeps linearizable.
            self.members[i].learner = false;
            self.promoted += 1;
            let leader_id = self.members[leader].id;
            self.note("promote", leader_id, id, 0);
        }
        Ok(())
    }

    /// A fault: the leader proposes to remove a member (possibly itself).
    pub(super) fn remove_member(&mut self) {
        if self.removal_targets.len() >= MAX_REMOVALS {
            return;
        }
        let candidates: Vec<u64> = self
            .members
            .iter()
            .filter(|m| !m.awaiting_addition)
            .map(|m| m.id)
            .filter(|id| !self.removal_targets.contains(id))
            .collect();
        if candidates.is_empty() {
            return;
        }
        let target = candidates[self.rng.random_range(0..candidates.len())];
        let Some(leader) = self.running_leader() else {
            return;
        };
        if self.propose_change(leader, ChangeKind::RemoveNode, target, false) {
            self.removal_targets.push(target);
            let leader_id = self.members[leader].id;
            self.note("remove-member", leader_id, target, 0);
        }
    }

    /// Retires every member whose removal some member has applied.
    pub(super) fn retire_removed(&mut self) {
        let bootstrap = self.cfg.members as u64;
        for t in 0..self.removal_targets.len() {
            let target = self.removal_targets[t];
            let Some(i) = (target as usize).checked_sub(1) else {
                continue;
            };
            if self.members[i].removed {
                continue;
            }
            let applied = self.members.iter().any(|m| {
                m.applied > bootstrap
                    && m.node
                        .as_ref()
                        .is_some_and(|n| !in_configuration(n, target))
            });
            if applied {
                self.retire(i);
            }
        }
    }

    /// Raft's configuration and the applier's membership name the same members on every
    /// member that has applied its bootstrap configuration: a removal (or any change) that
    /// one of them applies and the other does not shows here at once.
    pub(super) fn check_membership(&mut self) -> Step {
        let bootstrap = self.cfg.members as u64;
        for member in &mut self.members {
            let (Some(node), Some(state)) = (member.node.as_ref(), member.state.as_ref()) else {
                continue;
            };
            // Once per applied index: nothing changes membership but an apply.
            if member.applied <= bootstrap || member.membership_checked == member.applied {
                continue;
            }
            member.membership_checked = member.applied;
            let conf = node.raw().raft.prs().conf();
            let mut in_raft: Vec<u64> = conf.voters().ids().iter().collect();
            in_raft.extend(conf.learners().iter().copied());
            in_raft.sort_unstable();
            let mut in_applier: Vec<u64> = state.members().iter().map(|m| m.id).collect();
            in_applier.sort_unstable();
            if in_raft != in_applier {
                return Err(format!(
                    "member {} at applied index {}: raft's configuration has {in_raft:?}, the applier's membership {in_applier:?}",
                    member.id, member.applied
                ));
            }
        }
        Ok(())
    }

    /// Whether member `i` stopped because it applied its own removal.
    pub(super) fn removed_itself(&self, i: usize, error: &etcdrs_raftnode::Error) -> bool {
        self.removal_targets.contains(&self.members[i].id)
            && error
                .to_string()
                .contains("the member has been permanently removed from the cluster")
    }

    /// Member `i` is gone for good: stopped, never restarted, cut off from the network.
    pub(super) fn retire(&mut self, i: usize) {
        let member = &mut self.members[i];
        if member.removed {
            return;
        }
        member.removed = true;
        drop(member.node.take());
        drop(member.state.take());
        member.forget_process();
        let id = member.id;
        self.member_watches_break(i);
        self.removed += 1;
        self.note("member-removed", id, 0, 0);
    }

    /// Whether member `id` has been removed (its messages go nowhere).
    pub(super) fn is_removed(&self, id: u64) -> bool {
        (id as usize)
            .checked_sub(1)
            .and_then(|i| self.members.get(i))
            .is_some_and(|m| m.removed)
    }
}

/// Whether `node`'s raft configuration holds `id`, as a voter or a learner.
fn in_configuration(node: &Node, id: u64) -> bool {
    let conf = node.raw().raft.prs().conf();
    conf.voters().ids().contains(id) || conf.learners().contains(&id)
}
