//! The server's background loops, each a named task on the run's task set that stops with its shutdown token: watch catch-up, lease expiry (on the leader), auto-compaction.

use std::time::{Duration, Instant};

use etcdrs_proto::etcdserverpb::{LeaseCheckpoint, LeaseCheckpointRequest};
use futures::StreamExt as _;
use tokio_util::sync::CancellationToken;

use super::EtcdServer;
use crate::compactor::Plan;
use crate::error::{Result, ServerError};
use crate::request::Op;

/// Leases checkpointed per round (etcd's `maxLeaseCheckpointBatchSize`).
const CHECKPOINT_BATCH: usize = 1000;

impl EtcdServer {
    /// Catch up watchers that are behind, from the store's history (etcd's `syncWatchersLoop`).
    pub(super) async fn run_watch_sync(&self, shutdown: CancellationToken) -> Result<()> {
        let mut ticker = tokio::time::interval(Duration::from_millis(100));
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = shutdown.cancelled() => return Ok(()),
                _ = ticker.tick() => {}
                _ = self.inner.watch_sync.notified() => {}
            }
            // Keep going while rounds make progress, up to a bound per wake-up.
            for _ in 0..16 {
                let hub = &self.inner.watch_hub;
                if !hub.has_unsynced() {
                    break;
                }
                let outcome = tokio::task::block_in_place(|| hub.sync_round(&self.inner.store))?;
                if outcome.behind == 0 || outcome.advanced == 0 {
                    break;
                }
                tokio::task::yield_now().await;
            }
        }
    }

    /// etcd's backend loop: the applier's batches are held in memory (`etcdrs_backend`'s
    /// `batch` module), and every `--backend-batch-interval`, or sooner when the backend asks
    /// (`--backend-batch-limit` writes waiting, or their bytes), this task writes them to the
    /// file and commits durably, off the raft thread: a slow disk under the database file
    /// holds up neither raft's heartbeats nor the apply. Raft hears what is durable from the
    /// applier, which is what lets it release WAL segments and compact its log. A commit that
    /// fails (a full disk, an I/O error) stops the member, as etcd's failed batch commit does:
    /// the backend is not retried behind an error it did not survive. At shutdown the last
    /// batches are committed durably.
    pub(super) async fn run_backend_commit(
        &self,
        shutdown: CancellationToken,
    ) -> std::result::Result<(), String> {
        let backend = self.inner.store.backend();
        let interval = backend.batch_interval();
        let asked = std::sync::Arc::new(tokio::sync::Notify::new());
        let waker = asked.clone();
        backend.set_background_flush(Box::new(move || waker.notify_one()));
        let mut ticker = tokio::time::interval(interval);
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            let stopping = tokio::select! {
                _ = shutdown.cancelled() => true,
                _ = ticker.tick() => false,
                _ = asked.notified() => false,
            };
            let store = self.inner.store.clone();
            let done = tokio::task::spawn_blocking(move || {
                if stopping {
                    store.force_durable().map(|()| true)
                } else {
                    store.commit_pending()
                }
            })
            .await;
            if stopping {
                return match done {
                    Ok(Ok(_)) => Ok(()),
                    Ok(Err(e)) => Err(format!("failed to commit the backend: {e}")),
                    Err(e) => Err(format!("failed to commit the backend: {e}")),
                };
            }
            let failed = match done {
                Ok(Ok(_)) => continue,
                Ok(Err(e)) => e.to_string(),
                Err(e) => e.to_string(),
            };
            tracing::error!(error = %failed, "failed to commit the backend");
            return Err(format!("failed to commit the backend: {failed}"));
        }
    }

    pub(super) async fn run_lease_expiry(&self, shutdown: CancellationToken) {
        let mut ticker = tokio::time::interval(Duration::from_millis(500));
        loop {
            tokio::select! {
                _ = shutdown.cancelled() => return,
                _ = ticker.tick() => {}
            }
            if !self.core.raft.status().is_leader {
                continue;
            }
            let expired = self
                .inner
                .store
                .lessor()
                .expired(self.inner.store.now(), 500);
            futures::stream::iter(expired)
                .for_each_concurrent(16, |id| async move {
                    let revoke = etcdrs_proto::etcdserverpb::LeaseRevokeRequest { id };
                    // As etcd's leader (`WithRoot`): as root, since every member checks the
                    // lease's keys against the proposer's permissions.
                    let root = self.inner.auth.is_enabled().then(|| crate::auth::AuthInfo {
                        username: "root".into(),
                        revision: self.inner.auth.revision(),
                        live: true,
                    });
                    match self.propose_as(Op::LeaseRevoke(revoke), root.as_ref()).await {
                        Ok(_) => crate::metrics::LEASES_EXPIRED.inc(),
                        Err(ServerError::Etcd(_)) => {}
                        Err(e) => {
                            tracing::warn!(lease_id = id, error = %e, "failed to revoke expired lease")
                        }
                    }
                })
                .await;
        }
    }

    pub(super) async fn run_auto_compaction(&self, shutdown: CancellationToken) {
        let mut plan = Plan::new(self.inner.config.auto_compaction, Instant::now());
        let Some(interval) = plan.interval() else {
            shutdown.cancelled().await;
            return;
        };
        let mode = match plan {
            Plan::Periodic(_) => "periodic",
            _ => "revision",
        };
        let mut ticker = tokio::time::interval(interval);
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = shutdown.cancelled() => return,
                _ = ticker.tick() => {}
            }
            let Some(revision) = plan.tick(Instant::now(), self.inner.store.current_rev()) else {
                continue;
            };
            if !self.core.raft.status().is_leader {
                continue;
            }
            tracing::info!(revision, "starting auto {mode} compaction");
            let request = etcdrs_proto::etcdserverpb::CompactionRequest {
                revision,
                physical: false,
            };
            match self.propose(Op::Compaction(request)).await {
                Ok(_) | Err(ServerError::Mvcc(etcdrs_mvcc::Error::Compacted { .. })) => {
                    tracing::info!(revision, "completed auto {mode} compaction");
                    plan.succeeded(revision, Instant::now());
                }
                Err(e) => tracing::warn!(revision, error = %e, "failed auto {mode} compaction"),
            }
        }
    }

    /// The leader's lease checkpoints (etcd's `checkpointScheduledLeases`): every `interval`,
    /// the remaining TTL of up to [`CHECKPOINT_BATCH`] leases, soonest expiry first, goes
    /// through raft, so that a new leader restarts each lease from what was left rather than
    /// from its full TTL.
    pub(super) async fn run_lease_checkpoints(
        &self,
        interval: Duration,
        shutdown: CancellationToken,
    ) {
        loop {
            tokio::select! {
                _ = shutdown.cancelled() => return,
                _ = tokio::time::sleep(interval) => {}
            }
            let checkpoints = self
                .store()
                .lessor()
                .checkpoints(self.inner.store.now(), CHECKPOINT_BATCH);
            if checkpoints.is_empty() {
                continue;
            }
            let request = LeaseCheckpointRequest {
                checkpoints: checkpoints
                    .into_iter()
                    .map(|(id, remaining_ttl)| LeaseCheckpoint { id, remaining_ttl })
                    .collect(),
            };
            if let Err(e) = self.propose(Op::LeaseCheckpoint(request)).await {
                tracing::warn!(error = %e, "failed to checkpoint leases");
            }
        }
    }

    /// Clears `id`'s checkpointed remainder on every member (a renewal on the leader).
    pub async fn clear_lease_checkpoint(&self, id: i64) {
        let request = LeaseCheckpointRequest {
            checkpoints: vec![LeaseCheckpoint {
                id,
                remaining_ttl: 0,
            }],
        };
        if let Err(e) = self.propose(Op::LeaseCheckpoint(request)).await {
            tracing::warn!(error = %e, "failed to clear a lease checkpoint");
        }
    }
}

impl EtcdServer {
    /// The compactor: carries out applied compactions step by step
    /// (`KvStore::compaction_step`), each step a bounded run of the index under its lock and
    /// one backend transaction of deletions, with `--experimental-compaction-sleep-interval`
    /// between steps so that the applier and readers go on meanwhile (etcd's scheduled
    /// compaction). A failed step stops the member, as a failed apply does.
    pub(super) async fn run_physical_compaction(
        &self,
        shutdown: CancellationToken,
    ) -> std::result::Result<(), String> {
        let batch = self.inner.config.compaction_batch_limit;
        let pause = self.inner.config.compaction_sleep_interval;
        loop {
            // A compaction left by the open or an install is picked up by the first round.
            loop {
                let store = self.inner.store.clone();
                let step = tokio::task::spawn_blocking(move || store.compaction_step(batch))
                    .await
                    .map_err(|e| e.to_string())
                    .and_then(|step| step.map_err(|e| e.to_string()));
                match step {
                    Ok(etcdrs_mvcc::CompactionStep::Idle) => break,
                    Ok(etcdrs_mvcc::CompactionStep::Finished(rev)) => {
                        self.inner.note_compacted(rev);
                    }
                    Ok(etcdrs_mvcc::CompactionStep::Progress) => {}
                    Err(e) => {
                        tracing::error!(error = %e, "failed to compact the backend");
                        return Err(format!("failed to compact the backend: {e}"));
                    }
                }
                tokio::select! {
                    _ = shutdown.cancelled() => return Ok(()),
                    _ = tokio::time::sleep(pause) => {}
                }
            }
            tokio::select! {
                _ = shutdown.cancelled() => return Ok(()),
                _ = self.inner.compactor.notified() => {}
            }
        }
    }

    /// Waits until the compaction at `rev` is carried out to its end (a physical `Compact`;
    /// as etcd, no server-side timeout: the client's deadline bounds it).
    pub async fn wait_compacted(&self, rev: i64) -> Result<()> {
        let mut compacted = self.inner.compacted.subscribe();
        match compacted.wait_for(|done| *done >= rev).await {
            Ok(_) => Ok(()),
            Err(_) => Err(ServerError::Stopped),
        }
    }
}
