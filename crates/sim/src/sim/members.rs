//! Members start, crash (a clean stop or a power cut) and restart, and the faults the seed draws:
//! partitions, stalls, leader transfers.

use super::*;

impl Sim {
    /// Start (or restart) member `i` as a member starts: its backend opened (on the virtual
    /// clock), the server's state loaded from it, and `raftnode`'s node over its log: a new
    /// cluster's first entries while the log is empty, a restart from it otherwise.
    pub(super) fn start_member(&mut self, i: usize) -> Step {
        let n = self.cfg.members as u64;
        let member = &mut self.members[i];
        let id = member.id;
        let mut backend = Backend::open(&member.db).map_err(|e| format!("open backend: {e}"))?;
        backend.set_clock(Arc::new(VirtualClock {
            base: self.base,
            now_ms: self.now_ms.clone(),
        }));
        backend.set_batching(Duration::from_millis(self.cfg.backend_batch_ms), u64::MAX);
        if self.cfg.background_flush {
            // The flush polls (`Event::BackendFlush`); nothing to wake.
            backend.set_background_flush(Box::new(|| {}));
        }
        let store = Arc::new(KvStore::open(backend, 1).map_err(|e| format!("open store: {e}"))?);
        store
            .force_durable()
            .map_err(|e| format!("durable commit: {e}"))?;
        std::fs::copy(&member.db, &member.durable_db)
            .map_err(|e| format!("copy the durable backend: {e}"))?;
        let applied = store.consistent_index();
        // Entries applied before a crash whose backend commits it lost: raft replays them.
        self.replayed += member.applied.saturating_sub(applied);
        let mut config = etcdrs_server::ServerConfig::with_defaults();
        config.data_dir = member.db.with_extension("dir");
        config.election_timeout = Duration::from_millis(LEASE_EXTEND_MS);
        if let Some(interval) = self.cfg.lease_checkpoint_ms {
            config.lease_checkpoint = true;
            config.lease_checkpoint_persist = self.cfg.lease_checkpoint_persist;
            config.lease_checkpoint_interval = Duration::from_millis(interval);
        }
        let (state, machine) = StandaloneMember::open(config, id, CLUSTER_ID, store.clone())
            .map_err(|e| format!("load member state: {e}"))?;
        let (start, recovered) = match member.log.recovered() {
            Some(recovered) => (
                state.restart().map_err(|e| format!("restart: {e}"))?,
                recovered,
            ),
            // A member added at run time joins with an empty log: the leader sends it the
            // log, or a snapshot.
            None if id > n => (StandaloneMember::join(id, CLUSTER_ID), Recovered::default()),
            None => {
                let members = (1..=n)
                    .map(|id| etcdrs_server::membership::Member {
                        id,
                        name: format!("m{id}"),
                        peer_urls: Vec::new(),
                        client_urls: Vec::new(),
                        is_learner: false,
                    })
                    .collect();
                let start = StandaloneMember::new_cluster(members, id, CLUSTER_ID)
                    .map_err(|e| format!("bootstrap: {e}"))?;
                (start, Recovered::default())
            }
        };
        let (snapshot_count, catch_up_entries) = self.cfg.compaction.unwrap_or((1 << 40, 1));
        let node_config = NodeConfig {
            id,
            wal_dir: PathBuf::from(format!("member-{id}-log")),
            tick_interval: Duration::from_millis(TICK_MS),
            election_tick: ELECTION_TICK,
            heartbeat_tick: HEARTBEAT_TICK,
            pre_vote: self.cfg.pre_vote,
            snapshot_count,
            catch_up_entries,
            unsafe_no_fsync: false,
        };
        let recorder = Recorder {
            machine,
            store,
            observed: member.observed.clone(),
            db: member.db.clone(),
            durable_db: member.durable_db.clone(),
            record_events: self.cfg.watches,
            auth_probe: self
                .cfg
                .auth
                .then(|| Box::new(state.auth_probe()) as storage::AuthProbe),
        };
        let node = Node::new(
            node_config,
            start,
            Box::new(member.log.clone()),
            recovered,
            Arc::new(member.outbox.clone()),
            Box::new(recorder),
        )
        .map_err(|e| format!("start raft: {e}"))?;
        let mut node = node;
        if self.cfg.slow_disks {
            node.defer_disk_writes();
        }
        member.node = Some(node);
        member.state = Some(state);
        member.applied = applied;
        member.promoted_at = None;
        member.started_at = applied;
        // Without persistence, a restarted lessor holds only the checkpoints it applies again.
        if !self.cfg.lease_checkpoint_persist {
            member.checkpoint_floor = applied;
        }
        self.note("start", id, applied, 0);
        // raft drew the new node's election timeout from the thread's RNG.
        self.pin_election_timeouts();
        Ok(())
    }

    /// Schedules member `i`'s disk to write the batch its node handed over: in a few ms, or
    /// once its stall is over.
    pub(super) fn schedule_disk_write(&mut self, i: usize) {
        let member = &self.members[i];
        let waiting = member.node.as_ref().is_some_and(Node::disk_write_waiting);
        if !waiting || member.disk_write_scheduled {
            return;
        }
        let stalled = member.disk_stalled_until.saturating_sub(self.now);
        let after = stalled + self.rng.random_range(0..=3);
        self.members[i].disk_write_scheduled = true;
        self.schedule(after, Event::DiskWrite(i));
    }

    /// Member `i`'s backend task: flushes the batches due, durably, unless its disk stalls;
    /// the file is then what a power cut leaves.
    pub(super) fn flush_backend(&mut self, i: usize) -> Step {
        let member = &self.members[i];
        if member.disk_stalled_until > self.now {
            return Ok(());
        }
        let Some(state) = member.state.as_ref() else {
            return Ok(());
        };
        let flushed = state
            .store()
            .commit_pending()
            .map_err(|e| format!("member {}: backend flush: {e}", i + 1))?;
        if flushed {
            std::fs::copy(&member.db, &member.durable_db)
                .map_err(|e| format!("copy the durable backend: {e}"))?;
        }
        Ok(())
    }

    pub(super) fn crash(&mut self, i: usize) {
        let clean = self.rng.random_bool(0.5);
        let member = &mut self.members[i];
        let Some(node) = member.node.take() else {
            return;
        };
        // The node holds the applier, and with it the store: both go before the files move.
        drop(node);
        if let Some(state) = member.state.take() {
            if clean {
                // A clean stop: the backend's last commits reach the disk.
                let _ = state.store().force_durable();
            }
            drop(state);
            if !clean {
                // A power cut: what was committed since the last durable commit is lost, and
                // raft replays it from the log after the consistent index.
                let _ = std::fs::copy(&member.durable_db, &member.db);
            }
        }
        member.forget_process();
        let id = member.id;
        self.member_watches_break(i);
        self.crashes += 1;
        self.note("crash", id, u64::from(clean), 0);
        let after = self.rng.random_range(50..=800);
        self.schedule(after, Event::Restart(i));
    }

    pub(super) fn fault(&mut self) -> Step {
        if !self.faults {
            return Ok(());
        }
        if self.cfg.membership_changes && self.rng.random_bool(0.2) {
            match self.rng.random_range(0..3) {
                0 => {
                    let voter = self.rng.random_bool(0.5);
                    self.add_member(voter)?
                }
                1 => self.promote_learner()?,
                _ => self.remove_member(),
            }
            let after = self.rng.random_range(50..=500);
            self.schedule(after, Event::Fault);
            return Ok(());
        }
        if self.cfg.slow_disks && self.rng.random_bool(0.15) {
            let i = self.rng.random_range(0..self.members.len());
            let stall = self.rng.random_range(150..=1000);
            self.members[i].disk_stalled_until = self.now + stall;
            let id = self.members[i].id;
            self.disk_stalls += 1;
            self.note("disk-stall", id, stall, 0);
            let after = self.rng.random_range(50..=500);
            self.schedule(after, Event::Fault);
            return Ok(());
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
                            .is_some_and(|n| n.raw().raft.state == StateRole::Leader)
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
        Ok(())
    }
}
