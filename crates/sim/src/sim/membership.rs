//! Members removed at run time (etcd's MemberRemove): the leader proposes the removal as the
//! server does (etcd's `ConfChangeRemoveNode`, through `raftnode::Node`); once a member that
//! has its whole bootstrap configuration applies it, the removed member is gone for good: it
//! stops, is never restarted, and the network carries nothing from or to it (etcd's peers
//! refuse a removed member's messages, and the removed member exits). Removals only shrink a
//! five-member cluster to three, so that a quorum survives the other faults as in a
//! three-member cluster.

use etcdrs_raftnode::confchange::ChangeKind;

use super::*;

/// Members a run removes at most.
const MAX_REMOVALS: usize = 2;

impl Sim {
    /// A fault: the leader proposes to remove a member (possibly itself).
    pub(super) fn remove_member(&mut self) {
        if self.removal_targets.len() >= MAX_REMOVALS {
            return;
        }
        let candidates: Vec<u64> = self
            .members
            .iter()
            .map(|m| m.id)
            .filter(|id| !self.removal_targets.contains(id))
            .collect();
        if candidates.is_empty() {
            return;
        }
        let target = candidates[self.rng.random_range(0..candidates.len())];
        let now = self.now;
        let leader = self.members.iter_mut().find(|m| {
            m.paused_until <= now
                && m.node
                    .as_ref()
                    .is_some_and(|n| n.raw().raft.state == StateRole::Leader)
        });
        let Some(leader) = leader else {
            return;
        };
        let Some(node) = leader.node.as_mut() else {
            return;
        };
        let change = EtcdConfChange {
            id: self.next_request,
            kind: ChangeKind::RemoveNode,
            node_id: target,
            context: None,
        };
        let mut answer = node.propose_conf_change(change);
        let accepted = matches!(answer.try_recv(), Ok(Ok(())));
        let leader_id = leader.id;
        self.next_request += 1;
        if accepted {
            self.removal_targets.push(target);
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
                    && m.node.as_ref().is_some_and(|n| {
                        let conf = n.raw().raft.prs().conf();
                        !conf.voters().ids().iter().any(|id| id == target)
                            && !conf.learners().contains(&target)
                    })
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
        member.waiters.clear();
        member.reads.clear();
        member.read_waits.clear();
        lock(&member.outbox.0).clear();
        lock(&member.observed).clear();
        member.promoted_at = None;
        let id = member.id;
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
