//! The cluster version: the leader's monitor that decides it from every member's server
//! version (etcd 3.5's `monitorVersions`, 3.6's `version.Monitor`), and downgrades (the
//! Maintenance service's `Downgrade`: validate, enable, cancel).
//!
//! A cluster runs at the lowest version among its members: the leader asks each member's
//! `/version` on its peer URLs and, once every one has answered, raises the cluster version to
//! the lowest server version's major.minor; it never lowers it on its own. A cluster of etcd-rs
//! members alone therefore runs at 3.5, and one with an etcd 3.4 member at 3.4.
//!
//! The way back is etcd's downgrade, with 3.6's rule (3.5 records a downgrade but never lowers
//! the version): once a downgrade to the version one minor below is enabled, the leader sets
//! the cluster version to that target, and members of the target version can join (an etcd
//! 3.4 member refuses a cluster at 3.5). The downgrade is cancelled, by the leader, once every
//! member runs the target version, or by `Downgrade(CANCEL)`. A downgrade that etcd 3.5
//! members enabled (and so know of) is the exception: the version stays, as etcd 3.5 keeps it,
//! since they exit once it is lowered (`EtcdServer::downgrade_known_to_etcd35`).

use std::time::{Duration, Instant};

use etcdrs_proto::etcdserverpb::downgrade_request::DowngradeAction;
use etcdrs_proto::rpctypes;
use etcdrs_schema::membership;
use etcdrs_schema::version::{self, Version};
use tokio_util::sync::CancellationToken;

use super::EtcdServer;
use crate::error::{Result, ServerError};
use crate::request::Op;

/// How often the leader checks the members' versions (etcd's `monitorVersionInterval`, the
/// peer connection's write timeout less a second).
const MONITOR_INTERVAL: Duration = Duration::from_secs(4);
/// How long the leader waits for one member's `/version`.
const VERSION_TIMEOUT: Duration = Duration::from_secs(2);

impl EtcdServer {
    /// The leader's version monitor: at the first commit of each of its terms and every
    /// [`MONITOR_INTERVAL`] after that, the cluster version is decided again.
    pub(super) async fn run_version_monitor(&self, shutdown: CancellationToken) {
        let mut applied = self.inner.applied.subscribe();
        let mut ticker = tokio::time::interval(self.inner.config.heartbeat_interval);
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut checked_term = 0;
        let mut last_check = Instant::now();
        loop {
            tokio::select! {
                _ = shutdown.cancelled() => return,
                _ = ticker.tick() => {}
                changed = applied.changed() => {
                    if changed.is_err() {
                        return;
                    }
                }
            }
            let status = self.raft_status();
            if !status.is_leader {
                checked_term = 0;
                continue;
            }
            // etcd's `FirstCommitInTermNotify`: the new leader's own entry has applied.
            let new_term = checked_term != status.term && self.applied_term() == status.term;
            if !new_term && last_check.elapsed() < MONITOR_INTERVAL {
                continue;
            }
            checked_term = status.term;
            last_check = Instant::now();
            tokio::select! {
                _ = shutdown.cancelled() => return,
                _ = self.update_cluster_version_if_needed() => {}
            }
        }
    }

    /// Every member's server version, `None` unless every member answered.
    async fn members_versions(&self) -> Option<Vec<Version>> {
        let me = self.member_id();
        let asks = self.members().into_iter().map(|m| async move {
            if m.id == me {
                return Some(version::local());
            }
            match crate::peer::calls::fetch_version(
                self.transport().client(),
                &m.peer_urls,
                VERSION_TIMEOUT,
            )
            .await
            {
                Ok(v) => {
                    let parsed = Version::parse(&v.server);
                    if parsed.is_none() {
                        tracing::warn!(
                            remote_member_id = %membership::id_hex(m.id),
                            remote_member_version = %v.server,
                            "failed to parse server version of remote member"
                        );
                    }
                    parsed
                }
                Err(e) => {
                    tracing::warn!(
                        remote_member_id = %membership::id_hex(m.id),
                        error = %e,
                        "failed to reach the peer URL"
                    );
                    None
                }
            }
        });
        let versions: Option<Vec<Version>> =
            futures::future::join_all(asks).await.into_iter().collect();
        for v in versions.iter().flatten() {
            if *v > version::local() {
                tracing::warn!(
                    local_member_version = version::SERVER_VERSION,
                    remote_member_version = %v,
                    "leader found higher-versioned member"
                );
            }
        }
        versions
    }

    /// etcd's `UpdateClusterVersionIfNeeded` and `CancelDowngradeIfNeeded`, on the leader.
    pub(super) async fn update_cluster_version_if_needed(&self) {
        // One decision at a time, each on what the previous one applied.
        let _deciding = self.core.version_decision.lock().await;
        let versions = self.members_versions().await;
        let minimal = versions
            .as_ref()
            .and_then(|vs| vs.iter().min().copied())
            .map(Version::cluster);
        let current = self.cluster_version();
        let current_parsed = current.as_deref().and_then(Version::parse);
        let downgrade = self.downgrade_target().as_deref().and_then(Version::parse);
        let decided = match (current_parsed, minimal) {
            // No version yet: the lowest member's, or the lowest there is.
            (None, _) => Some(minimal.unwrap_or_else(|| {
                Version::parse(version::MIN_CLUSTER_VERSION).unwrap_or(version::local())
            })),
            (Some(_), None) => None,
            (Some(cv), Some(minimal)) => match downgrade {
                Some(target) if target == cv.cluster() => None,
                Some(target) if self.downgrade_known_to_etcd35() => {
                    tracing::info!(
                        downgrade_target = %target,
                        cluster_version = %cv,
                        "keeping the cluster version: etcd 3.5 members know of the downgrade"
                    );
                    None
                }
                Some(target) => {
                    if cv.one_minor_below() == Some(target)
                        && minimal.one_minor_below() == Some(target)
                    {
                        Some(target)
                    } else {
                        tracing::error!(
                            downgrade_target = %target,
                            cluster_version = %cv,
                            minimal_server_version = %minimal,
                            "cannot downgrade the cluster version to the downgrade target"
                        );
                        None
                    }
                }
                None => (cv.cluster() < minimal && cv.major == minimal.major).then_some(minimal),
            },
        };
        if let Some(decided) = decided {
            match &current {
                None => tracing::info!(
                    cluster_version = %version::major_minor(&decided.to_string()),
                    "setting up initial cluster version using v2 API"
                ),
                Some(from) => tracing::info!(
                    from = version::major_minor(from),
                    to = %version::major_minor(&decided.to_string()),
                    "updating cluster version using v2 API"
                ),
            }
            if let Err(e) = self
                .propose(Op::ClusterVersionSet(decided.to_string()))
                .await
            {
                tracing::warn!(error = %e, "failed to update cluster version");
            }
        }
        // Every member at the target: the downgrade is done (never while an etcd-rs member
        // leads, whose own version is above any target; kept for what etcd does).
        if let (Some(target), Some(versions)) = (downgrade, &versions)
            && versions.iter().all(|v| v.cluster() == target)
        {
            tracing::info!(target_version = %target, "the cluster has been downgraded");
            if let Err(e) = self.propose(Op::DowngradeInfoSet(None)).await {
                tracing::warn!(error = %e, "failed to cancel downgrade");
            }
        }
    }

    /// `Maintenance.Downgrade`: the cluster version in the answer, or etcd's error.
    pub async fn downgrade(&self, action: i32, target: &str) -> Result<String> {
        match DowngradeAction::try_from(action) {
            Ok(DowngradeAction::Validate) => self.downgrade_validate(target).await,
            Ok(DowngradeAction::Enable) => {
                if let Err(e) = self.downgrade_validate(target).await {
                    tracing::warn!(error = %e, "reject downgrade request");
                    return Err(e);
                }
                let target = downgrade_target(target)?;
                if let Err(e) = self
                    .propose(Op::DowngradeInfoSet(Some(target.to_string())))
                    .await
                {
                    tracing::warn!(error = %e, "reject downgrade request");
                    return Err(e);
                }
                Ok(self.cluster_version().unwrap_or_default())
            }
            Ok(DowngradeAction::Cancel) => {
                self.linearizable_barrier().await?;
                if self.downgrade_target().is_none() {
                    return Err(ServerError::Etcd(&rpctypes::NO_INFLIGHT_DOWNGRADE));
                }
                // etcd 3.5 members that know of the downgrade hear of its end only in their
                // own form (they keep the v2 record etcd-rs writes below 3.6 in their v2
                // store), and would refuse to restart while they think it under way.
                let cancel = if self.downgrade_known_to_etcd35() {
                    Op::DowngradeInfoSetV3(None)
                } else {
                    Op::DowngradeInfoSet(None)
                };
                self.propose(cancel).await?;
                Ok(self.cluster_version().unwrap_or_default())
            }
            Err(_) => Err(ServerError::UnknownMethod),
        }
    }

    /// etcd's `downgradeValidate`: the target must be one minor below the cluster version,
    /// with no downgrade under way, as of a linearizable read.
    async fn downgrade_validate(&self, target: &str) -> Result<String> {
        let target = downgrade_target(target)?;
        self.linearizable_barrier().await?;
        let Some(current) = self.cluster_version() else {
            return Err(ServerError::Etcd(&rpctypes::CLUSTER_VERSION_UNAVAILABLE));
        };
        let allowed = Version::parse(&current).and_then(Version::one_minor_below);
        if allowed != Some(target) {
            return Err(ServerError::Etcd(
                &rpctypes::INVALID_DOWNGRADE_TARGET_VERSION,
            ));
        }
        if self.downgrade_target().is_some() {
            return Err(ServerError::Etcd(&rpctypes::DOWNGRADE_IN_PROCESS));
        }
        Ok(current)
    }
}

/// etcd's `convertToClusterVersion`: `major.minor.patch` or `major.minor`, kept as
/// major.minor.
fn downgrade_target(text: &str) -> Result<Version> {
    Version::parse(text)
        .or_else(|| Version::parse(&format!("{text}.0")))
        .map(Version::cluster)
        .ok_or(ServerError::Etcd(&rpctypes::WRONG_DOWNGRADE_VERSION_FORMAT))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn downgrade_targets_read_as_etcd_reads_them() {
        let v = |t| Version::parse(t).expect("version");
        assert_eq!(downgrade_target("3.4").ok(), Some(v("3.4.0")));
        assert_eq!(downgrade_target("3.4.7").ok(), Some(v("3.4.0")));
        assert!(matches!(
            downgrade_target("three"),
            Err(ServerError::Etcd(e)) if e.message == rpctypes::WRONG_DOWNGRADE_VERSION_FORMAT.message
        ));
    }
}
