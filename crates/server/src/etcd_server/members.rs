//! Membership changes (etcd's MemberAdd, MemberRemove, MemberPromote, MemberUpdate, MoveLeader): validated as etcd validates them, proposed one at a time as single-step raft configuration changes with etcd's contexts (`raftnode::confchange` writes them as etcd does):
//!
//! | change  | type             | context                                                     |
//! |---------|------------------|-------------------------------------------------------------|
//! | add     | `AddNode`        | the member's JSON, `{"id":..,"peerURLs":[..]}`              |
//! | learner | `AddLearnerNode` | the same with `"isLearner":true`                             |
//! | promote | `AddNode`        | `{"id":..,"peerURLs":null,"isPromote":true}`                |
//! | update  | `UpdateNode`     | `{"id":..,"peerURLs":[..]}`                                 |
//! | remove  | `RemoveNode`     | none                                                        |

use std::time::Instant;

use etcdrs_proto::raft_internal::ConfigChangeContext;
use etcdrs_proto::rpctypes;
use etcdrs_raftnode::confchange::{ChangeKind, EtcdConfChange};
use etcdrs_schema::membership;
use etcdrs_schema::membership::Member;
use tokio::sync::oneshot;

use super::EtcdServer;
use crate::error::{Result, ServerError};

impl EtcdServer {
    /// Propose a membership change through raft and wait until it is applied.
    pub(super) async fn propose_conf_change(
        &self,
        kind: ChangeKind,
        node_id: u64,
        context: Option<Vec<u8>>,
    ) -> Result<()> {
        // One membership change at a time: a joint configuration (which etcd-rs no longer
        // enters, but a log may hold) must be left first.
        self.wait_not_joint().await?;
        let id = self.core.ids.next();
        let change = EtcdConfChange {
            id,
            kind,
            node_id,
            context,
        };
        let (done, result) = oneshot::channel();
        self.inner.waiters.lock().insert(id, done);
        // The raft thread may hold the proposal back until the previous change is done; the
        // whole wait is bounded by the request timeout (a proposal given up is not made).
        let deadline = tokio::time::Instant::now() + self.core.request_timeout;
        let proposed =
            tokio::time::timeout_at(deadline, self.core.raft.propose_conf_change(change)).await;
        let failed = match proposed {
            Ok(Ok(())) => None,
            Ok(Err(etcdrs_raftnode::Error::ProposalDropped)) => {
                Some(ServerError::Etcd(&rpctypes::NO_LEADER))
            }
            Ok(Err(e)) => Some(e.into()),
            Err(_) => Some(ServerError::Etcd(&rpctypes::TIMEOUT)),
        };
        if let Some(e) = failed {
            self.inner.waiters.lock().remove(&id);
            return Err(e);
        }
        match tokio::time::timeout_at(deadline, result).await {
            Ok(Ok(output)) => output.map(|_| ()),
            Ok(Err(_)) => Err(ServerError::Stopped),
            Err(_) => {
                self.inner.waiters.lock().remove(&id);
                Err(ServerError::Etcd(&rpctypes::TIMEOUT))
            }
        }
    }

    /// Wait until the configuration is not joint (bounded by the request timeout).
    pub(super) async fn wait_not_joint(&self) -> Result<()> {
        let deadline = Instant::now() + self.core.request_timeout;
        while self.core.raft.status().joint {
            if Instant::now() >= deadline {
                return Err(ServerError::Etcd(&rpctypes::TIMEOUT));
            }
            tokio::time::sleep(self.inner.config.heartbeat_interval / 4).await;
        }
        Ok(())
    }

    /// Add a member (etcd's MemberAdd): a voter, or a learner.
    pub async fn add_member(&self, peer_urls: Vec<String>, is_learner: bool) -> Result<Member> {
        {
            let members = self.inner.members.read();
            if members
                .values()
                .any(|m| m.peer_urls.iter().any(|u| peer_urls.contains(u)))
            {
                return Err(ServerError::Etcd(&rpctypes::PEER_URL_EXIST));
            }
            let learners = members.values().filter(|m| m.is_learner).count();
            if is_learner && learners >= self.inner.config.max_learners {
                return Err(ServerError::Etcd(&rpctypes::TOO_MANY_LEARNERS));
            }
            if !is_learner && self.inner.config.strict_reconfig_check {
                // etcd's strict reconfiguration check: the started voters must still form a
                // quorum of the grown cluster.
                let voters = members.values().filter(|m| !m.is_learner).count();
                let started = members
                    .values()
                    .filter(|m| !m.is_learner && !m.name.is_empty())
                    .count();
                let grown = voters + 1;
                // Growing a one-member cluster to two is allowed (restoring a cluster from
                // one member's data starts that way), as in etcd.
                let one_to_two = started == 1 && grown == 2;
                if !one_to_two && started < grown / 2 + 1 {
                    return Err(ServerError::Etcd(&rpctypes::MEMBER_NOT_ENOUGH_STARTED));
                }
            }
        }
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or(0);
        let seed = format!("{}{now}", self.inner.config.initial_cluster_token);
        let member = Member {
            id: membership::member_id(&peer_urls, &seed),
            name: String::new(),
            peer_urls,
            client_urls: Vec::new(),
            is_learner,
        };
        let kind = if is_learner {
            ChangeKind::AddLearnerNode
        } else {
            ChangeKind::AddNode
        };
        self.propose_conf_change(kind, member.id, Some(member_json(&member)?))
            .await?;
        Ok(member)
    }

    /// Remove a member (etcd's MemberRemove).
    pub async fn remove_member(&self, id: u64) -> Result<()> {
        if !self.inner.members.read().contains_key(&id) {
            return Err(ServerError::Etcd(&rpctypes::MEMBER_NOT_FOUND));
        }
        if self.inner.config.strict_reconfig_check {
            self.may_remove_voter(id)?;
        }
        self.propose_conf_change(ChangeKind::RemoveNode, id, None)
            .await
    }

    /// etcd's `mayRemoveMember`: a learner may always go; a voter only if one voter stays,
    /// and, unless it is down already (so not part of the active quorum), only if the voters
    /// this member reaches still form a quorum without it.
    fn may_remove_voter(&self, id: u64) -> Result<()> {
        let members = self.inner.members.read();
        if members.get(&id).is_some_and(|m| m.is_learner) {
            return Ok(());
        }
        let voters: Vec<u64> = members
            .values()
            .filter(|m| !m.is_learner)
            .map(|m| m.id)
            .collect();
        if voters.iter().filter(|v| **v != id).count() < 1 {
            tracing::warn!(
                member_id = %membership::id_hex(id),
                "rejecting member remove request; not enough healthy members"
            );
            return Err(ServerError::Etcd(&rpctypes::MEMBER_NOT_ENOUGH_STARTED));
        }
        let local = self.inner.member_id;
        if id != local && !self.inner.transport.is_active(id) {
            return Ok(());
        }
        let active = voters
            .iter()
            .filter(|v| **v == local || self.inner.transport.is_active(**v))
            .count();
        if active.saturating_sub(1) < 1 + (voters.len() - 1) / 2 {
            tracing::warn!(
                member_id = %membership::id_hex(id),
                "rejecting member remove request; local member has not been connected to all peers, reconfigure breaks active quorum"
            );
            return Err(ServerError::Etcd(&rpctypes::UNHEALTHY));
        }
        Ok(())
    }

    /// Promote a learner to a voter (etcd's MemberPromote), once it has caught up.
    pub async fn promote_member(&self, id: u64) -> Result<()> {
        let Some(member) = self.inner.members.read().get(&id).cloned() else {
            return Err(ServerError::Etcd(&rpctypes::MEMBER_NOT_FOUND));
        };
        if !member.is_learner {
            return Err(ServerError::Etcd(&rpctypes::MEMBER_NOT_LEARNER));
        }
        let status = self.core.raft.status();
        if status.is_leader {
            // etcd's readiness rule: the learner's log matches at least 90% of the leader's.
            let leader_match = status.commit;
            let learner_match = status
                .matched
                .iter()
                .find(|(m, _)| *m == id)
                .map(|(_, matched)| *matched)
                .unwrap_or(0);
            if (learner_match as f64) < 0.9 * leader_match as f64 {
                crate::metrics::LEARNER_PROMOTE_FAILURES
                    .with_label_values(&[rpctypes::LEARNER_NOT_READY.message])
                    .inc();
                return Err(ServerError::Etcd(&rpctypes::LEARNER_NOT_READY));
            }
        }
        // etcd's promote context: the bare id, marked as a promotion.
        let context = ConfigChangeContext {
            member: Member {
                id,
                ..Member::default()
            },
            is_promote: true,
        };
        let context = serde_json::to_vec(&context)
            .map_err(|e| ServerError::Fatal(format!("encode member: {e}")))?;
        self.propose_conf_change(ChangeKind::AddNode, id, Some(context))
            .await?;
        if status.is_leader {
            crate::metrics::LEARNER_PROMOTE_SUCCESSES.inc();
        }
        Ok(())
    }

    /// Change a member's peer URLs (etcd's MemberUpdate).
    pub async fn update_member(&self, id: u64, peer_urls: Vec<String>) -> Result<()> {
        {
            let members = self.inner.members.read();
            if !members.contains_key(&id) {
                return Err(ServerError::Etcd(&rpctypes::MEMBER_NOT_FOUND));
            }
            if members
                .values()
                .any(|m| m.id != id && m.peer_urls.iter().any(|u| peer_urls.contains(u)))
            {
                return Err(ServerError::Etcd(&rpctypes::PEER_URL_EXIST));
            }
        }
        // etcd's update context: the member's id and new peer URLs only.
        let update = Member {
            id,
            peer_urls,
            ..Member::default()
        };
        self.propose_conf_change(ChangeKind::UpdateNode, id, Some(member_json(&update)?))
            .await
    }

    /// Ask raft to move leadership to `to` (etcd's MoveLeader).
    pub async fn move_leader(&self, to: u64) -> Result<()> {
        let status = self.core.raft.status();
        if !status.is_leader {
            return Err(ServerError::Etcd(&rpctypes::NOT_LEADER));
        }
        if !status.voters.contains(&to) {
            return Err(ServerError::Etcd(&rpctypes::BAD_LEADER_TRANSFEREE));
        }
        self.core.raft.transfer_leader(to).await?;
        let deadline = Instant::now() + self.core.request_timeout;
        while Instant::now() < deadline {
            if self.core.raft.status().leader == to {
                return Ok(());
            }
            tokio::time::sleep(self.inner.config.heartbeat_interval).await;
        }
        Err(ServerError::Etcd(&rpctypes::TIMEOUT))
    }
}

fn member_json(member: &Member) -> Result<Vec<u8>> {
    serde_json::to_vec(member).map_err(|e| ServerError::Fatal(format!("encode member: {e}")))
}
