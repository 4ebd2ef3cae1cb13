//! The raft node's loop (`NodeCore`), on its own thread: ticks, messages from peers first and
//! then local requests (proposals, ReadIndex, membership changes), and each `Ready` handled in
//! raft's order: persist to the WAL, send, hand committed entries to the state machine, advance.
//! Also snapshots (installing a received one, marking one in the WAL) and the deferred
//! membership changes. The loop's body (`turn` and the requests it handles) is also what
//! [`crate::Node`] runs without the thread.

use super::*;

/// Bytes of applied entries after which a snapshot mark comes early, whatever
/// `--snapshot-count` says: raft's log is held in memory from the mark's catch-up entries
/// on, and `--snapshot-count` entries of up to `--max-request-bytes` each could otherwise fill
/// the machine's memory (100,000 entries of 1.5 MiB). Small entries never reach it first.
pub(crate) const LOG_BYTES_BETWEEN_MARKS: u64 = 64 << 20;
/// Bytes of entries at most kept behind a mark for lagging followers (with at most
/// `catch_up_entries` of them); a follower further behind gets a snapshot, as one more than
/// `catch_up_entries` behind does.
pub(crate) const CATCH_UP_BYTES: u64 = 32 << 20;

pub(crate) struct NodeCore {
    pub(crate) config: NodeConfig,
    pub(crate) node: RawNode<NodeStorage>,
    /// Where the log is made durable: the WAL on the `wal-sync` thread (or, inline, the
    /// simulator's memory, or a lone member's WAL).
    pub(crate) persistence: Persistence,
    /// Woken by the `wal-sync` thread after each batch (never while the log is written inline).
    pub(crate) synced: Arc<tokio::sync::Notify>,
    /// Whether the member started as its cluster's only node (a new cluster of one, or a
    /// restart whose membership is this member alone), before raft has applied any membership.
    pub(crate) alone_at_start: bool,
    /// What the `Ready`s since the last hand-over ask to make durable: the next fsync's.
    pub(crate) gathering: SyncBatch,
    /// Messages that may leave once `gathering` is durable (a non-leader's answers, votes).
    pub(crate) gathering_messages: Vec<Message>,
    /// Messages that may leave once the batch in flight is durable.
    pub(crate) in_flight_messages: Vec<Message>,
    /// The last `Ready` number known durable and not yet told to raft.
    pub(crate) durable: Option<u64>,
    /// Messages whose batch is durable, to send once raft has been told.
    pub(crate) durable_messages: Vec<Message>,
    pub(crate) transport: Arc<dyn Transport>,
    pub(crate) status: Arc<RwLock<NodeStatus>>,
    pub(crate) state_machine: Box<dyn StateMachine>,
    /// Linearizable reads waiting for a read index, one ReadIndex request at a time.
    pub(crate) reads: crate::reads::ReadBatches,
    pub(crate) last_mark: u64,
    /// Bytes of entry data applied since the last snapshot mark: the log held in memory
    /// past the mark, which [`LOG_BYTES_BETWEEN_MARKS`] bounds.
    pub(crate) bytes_since_mark: u64,
    /// The state machine asked for the whole applied log to go ([`crate::Applied::compact_log`]).
    pub(crate) compact_requested: bool,
    /// Membership changes that arrived while another was still in flight (raft would turn
    /// them into empty entries, leaving their proposers waiting): proposed in order once the
    /// previous change is applied and its joint configuration left.
    pub(crate) deferred_conf: VecDeque<(EtcdConfChange, oneshot::Sender<Result<()>>)>,
}

/// Whether `conf` is `id` alone: its only voter, no learner, not in a joint configuration.
pub(crate) fn only_node(conf: &ConfState, id: u64) -> bool {
    conf.voters == [id]
        && conf.learners.is_empty()
        && conf.voters_outgoing.is_empty()
        && conf.learners_next.is_empty()
}

impl NodeCore {
    pub(crate) async fn run(
        mut self,
        mut rx: mpsc::Receiver<NodeMsg>,
        mut peer_rx: mpsc::Receiver<NodeMsg>,
        shutdown: CancellationToken,
    ) -> Result<()> {
        let mut ticker = tokio::time::interval(self.config.tick_interval);
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let synced = self.synced.clone();
        loop {
            // While the disk is behind by more than the bound, no new local proposal is taken;
            // peers' messages (heartbeats, votes, appends) and ticks go on.
            let backlogged = self.gathering.over_bound();
            // Biased: shutdown, then the disk's reports (they release acknowledgements and
            // commits), then peers' messages, then ticks, then local requests.
            let first = tokio::select! {
                biased;
                _ = shutdown.cancelled() => break,
                _ = synced.notified() => None,
                // Both channels' senders live in the handle: one closed means both.
                msg = peer_rx.recv() => match msg {
                    Some(msg) => Some(msg),
                    None => break,
                },
                _ = ticker.tick() => {
                    self.tick();
                    None
                }
                msg = rx.recv(), if !backlogged => match msg {
                    Some(msg) => Some(msg),
                    None => break,
                },
            };
            if let Some(msg) = first {
                self.handle(msg)?;
                // Whatever else is waiting, peers' first, up to the turn's bound.
                for _ in 0..MAX_BATCH {
                    let next = match peer_rx.try_recv() {
                        Ok(msg) => Some(msg),
                        Err(_) if self.gathering.over_bound() => None,
                        Err(_) => rx.try_recv().ok(),
                    };
                    match next {
                        Some(msg) => self.handle(msg)?,
                        None => break,
                    }
                }
            }
            // A `Ready` can make the next one (a batch found durable, then what it commits).
            while self.turn()? {}
        }
        self.reads.refuse_all(|| Error::Stopped);
        // What raft handed over is written before the node stops (the thread is joined when
        // the node is dropped).
        self.flush()
    }

    /// What follows each turn's messages: what the disk has made durable told to raft, a lone
    /// voter's campaign, then the `Ready` step if raft has one (whether it had one is
    /// returned).
    pub(crate) fn turn(&mut self) -> Result<bool> {
        let durable = self.state_machine.durable();
        self.on_applied(durable)?;
        let reported = self.sync_step()?;
        self.maybe_campaign()?;
        self.send_reads();
        if !self.node.has_ready() {
            return Ok(reported);
        }
        self.on_ready()?;
        Ok(true)
    }

    pub(crate) fn propose(&mut self, data: Vec<u8>, on_refused: RefusedHook) {
        match self.node.propose(Vec::new(), data) {
            Ok(()) => {}
            Err(raft::Error::ProposalDropped) => on_refused(Error::ProposalDropped),
            Err(e) => on_refused(Error::Raft(e)),
        }
    }

    /// One tick of raft's logical clock.
    pub(crate) fn tick(&mut self) {
        self.node.tick();
        self.reads.tick();
    }

    /// A linearizable read: it waits for the next ReadIndex request ([`Self::send_reads`]).
    pub(crate) fn read_index(&mut self, done: oneshot::Sender<Result<u64>>) {
        if self.node.raft.leader_id == raft::INVALID_ID {
            let _ = done.send(Err(Error::ProposalDropped));
            return;
        }
        self.reads.queue(done);
    }

    /// One ReadIndex request for every read queued, unless a request is still in flight (its
    /// answer comes at the latest within an election timeout, or raft dropped it).
    fn send_reads(&mut self) {
        if self.node.raft.leader_id == raft::INVALID_ID {
            self.reads.refuse_queued(|| Error::ProposalDropped);
            return;
        }
        let lost_after = self.config.election_tick as u64;
        if let Some(ctx) = self.reads.next_request(lost_after) {
            let context = crate::reads::context(self.node.raft.id, ctx);
            self.node.read_index(context);
        }
    }

    /// A message from a peer; false if raft refused it.
    pub(crate) fn step(&mut self, message: Message) -> bool {
        // A follower's forwarded proposal may hold a conf change in etcd's encoding.
        let mut message = message;
        let aliases = alias_learner_additions(&mut message);
        let stepped = self.node.step(message);
        self.restore_aliases(&aliases);
        match stepped {
            Ok(()) => true,
            Err(e) => {
                tracing::debug!(error = %e, "raft step refused a message");
                false
            }
        }
    }

    pub(crate) fn handle(&mut self, msg: NodeMsg) -> Result<()> {
        match msg {
            NodeMsg::Propose { data, on_refused } => self.propose(data, on_refused),
            NodeMsg::ReadIndex { done } => self.read_index(done),
            NodeMsg::ProposeConfChange { change, done } => {
                if self.conf_change_in_flight() {
                    if self.deferred_conf.len() >= MAX_DEFERRED_CONF_CHANGES {
                        let _ = done.send(Err(Error::ProposalDropped));
                    } else {
                        self.deferred_conf.push_back((change, done));
                    }
                } else {
                    self.propose_conf_change(change, done);
                }
            }
            NodeMsg::TransferLeader { to } => self.node.transfer_leader(to),
            NodeMsg::ReportSnapshot { to, ok } => self.report_snapshot(to, ok),
            NodeMsg::Step(message) => {
                self.step(*message);
            }
        }
        Ok(())
    }

    /// Whether raft would refuse a membership change now: the last one is not applied yet, or
    /// its joint configuration is not left yet.
    fn conf_change_in_flight(&self) -> bool {
        let raft = &self.node.raft;
        raft.has_pending_conf() || !raft.prs().conf().to_conf_state().voters_outgoing.is_empty()
    }

    /// Proposes `change` as etcd does: a single-step `EntryConfChange` (etcd 3.4's server
    /// applies no `ConfChangeV2`), its data in etcd's encoding. This is what raft-rs's
    /// `propose_conf_change` does, except that raft-rs would write its own change types.
    fn propose_conf_change(&mut self, change: EtcdConfChange, done: oneshot::Sender<Result<()>>) {
        let mut entry = Entry::default();
        entry.set_entry_type(EntryType::EntryConfChange);
        entry.data = change.encode().into();
        let mut message = Message::default();
        message.set_msg_type(raft::eraftpb::MessageType::MsgPropose);
        message.set_entries(vec![entry].into());
        let aliases = alias_learner_additions(&mut message);
        let stepped = self.node.raft.step(message);
        self.restore_aliases(&aliases);
        let result = match stepped {
            Ok(()) => Ok(()),
            Err(raft::Error::ProposalDropped) => Err(Error::ProposalDropped),
            Err(e) => Err(Error::Raft(e)),
        };
        let _ = done.send(result);
    }

    /// Puts etcd's bytes back where raft took in a learner addition's alias (see
    /// [`alias_learner_additions`]): in the log's unstable entries and in the messages raft
    /// has queued (appends to followers, or the proposal forwarded to the leader).
    fn restore_aliases(&mut self, aliases: &[(Vec<u8>, Vec<u8>)]) {
        if aliases.is_empty() {
            return;
        }
        let restore = |entry: &mut Entry| {
            if entry.get_entry_type() != EntryType::EntryConfChange {
                return;
            }
            if let Some((_, original)) = aliases.iter().find(|(alias, _)| *alias == *entry.data) {
                entry.data = original.clone().into();
            }
        };
        let raft = &mut self.node.raft;
        raft.raft_log.unstable.entries.iter_mut().for_each(restore);
        for message in raft.msgs.iter_mut() {
            message.mut_entries().iter_mut().for_each(restore);
        }
    }

    /// Proposes the deferred membership changes whose turn has come.
    fn propose_deferred_conf_changes(&mut self) {
        while !self.conf_change_in_flight() {
            let Some((change, done)) = self.deferred_conf.pop_front() else {
                return;
            };
            // Its proposer gave up waiting: the change is not made behind its back.
            if done.is_closed() {
                continue;
            }
            self.propose_conf_change(change, done);
        }
    }

    /// A cluster of one does not wait out an election timeout to lead itself.
    fn maybe_campaign(&mut self) -> Result<()> {
        let raft = &self.node.raft;
        if raft.state == StateRole::Leader || !raft.promotable() {
            return Ok(());
        }
        let voters = raft.prs().conf().voters().ids();
        if voters.len() == 1 && voters.contains(self.config.id) {
            // A lone voter leads at once, and raft-rs requires a new leader's whole log to be
            // persisted: what is on its way to the disk gets there first.
            self.flush()?;
            self.report_durable();
            self.node.campaign()?;
        }
        Ok(())
    }

    /// Whether anything raft handed over is not yet known durable.
    fn unpersisted(&self) -> bool {
        self.persistence.busy() || self.gathering.number != 0 || !self.gathering.nothing_to_write()
    }

    /// Takes the outcome of the batch in flight if it is in, hands the gathering batch to the
    /// disk if the disk is free, and tells raft what is durable. Never waits for the disk.
    /// Whether raft was told anything or messages went out.
    fn sync_step(&mut self) -> Result<bool> {
        if let Some(number) = self.persistence.poll(false)? {
            let messages = std::mem::take(&mut self.in_flight_messages);
            self.mark_durable(number, messages);
        }
        if !self.persistence.busy() && self.unpersisted() {
            let batch = std::mem::take(&mut self.gathering);
            let messages = std::mem::take(&mut self.gathering_messages);
            if batch.nothing_to_write() {
                // Nothing of its own to wait for, and everything before it is durable.
                self.mark_durable(batch.number, messages);
            } else {
                match self.persistence.submit(batch)? {
                    Some(number) => self.mark_durable(number, messages),
                    None => self.in_flight_messages = messages,
                }
            }
        }
        Ok(self.report_durable())
    }

    /// Waits until everything raft handed over is durable (not yet told to raft: see
    /// [`NodeCore::report_durable`]). Blocks the raft thread: only for the rare steps that
    /// need the log durable where they stand (a snapshot installed, a lone voter's campaign,
    /// a stop).
    fn flush(&mut self) -> Result<()> {
        if let Some(number) = self.persistence.poll(true)? {
            let messages = std::mem::take(&mut self.in_flight_messages);
            self.mark_durable(number, messages);
        }
        if !self.unpersisted() {
            return Ok(());
        }
        let batch = std::mem::take(&mut self.gathering);
        let messages = std::mem::take(&mut self.gathering_messages);
        let number = match self.persistence.submit(batch)? {
            Some(number) => number,
            None => self.persistence.poll(true)?.ok_or(Error::Stopped)?,
        };
        self.mark_durable(number, messages);
        Ok(())
    }

    /// Whether this member is its cluster's only node, voter or learner.
    fn alone(&self) -> bool {
        only_node(
            &self.node.raft.raft_log.store.conf_state.lock(),
            self.node.raft.id,
        )
    }

    /// After a change of membership: a log written inline while the member was alone moves to
    /// its thread once it is not (see [`Persistence::Alone`]).
    fn check_company(&mut self) -> Result<()> {
        if !self.alone() {
            self.persistence.company_arrived(self.synced.clone())?;
        }
        Ok(())
    }

    fn mark_durable(&mut self, number: u64, messages: Vec<Message>) {
        if number != 0 {
            self.durable = Some(self.durable.map_or(number, |durable| durable.max(number)));
        }
        self.durable_messages.extend(messages);
    }

    /// Tells raft what is durable, and only then sends the messages that waited for it: an
    /// answer to them (a vote that makes this member leader, an append's acknowledgement)
    /// must find raft knowing it. Never called while a `Ready` is out.
    fn report_durable(&mut self) -> bool {
        let told = match self.durable.take() {
            Some(number) => {
                self.node.on_persist_ready(number);
                true
            }
            None => false,
        };
        let sent = !self.durable_messages.is_empty();
        if sent {
            self.transport
                .send(std::mem::take(&mut self.durable_messages));
        }
        told || sent
    }

    fn on_ready(&mut self) -> Result<()> {
        let mut ready = self.node.ready();
        if !ready.messages().is_empty() {
            self.transport.send(ready.take_messages());
        }
        let with_snapshot = !ready.snapshot().is_empty();
        if with_snapshot {
            self.install_snapshot(ready.snapshot().clone())?;
        }
        let committed = ready.take_committed_entries();
        self.send_committed(committed)?;
        for read_state in ready.take_read_states() {
            if let Some(ctx) = crate::reads::request_of(self.node.raft.id, &read_state.request_ctx)
            {
                self.reads.answer(ctx, read_state.index);
            }
        }
        // Raft reads its log from memory at once (a leader sends these entries before its own
        // fsync); the disk gets them with the next batch, and raft counts them persisted only
        // when that batch is durable.
        let hard_state = ready.hs().cloned();
        let entries = ready.take_entries();
        {
            let mut memory = self.node.raft.raft_log.store.mem.wl();
            if !entries.is_empty() {
                memory.append(&entries)?;
            }
            if let Some(hard_state) = &hard_state {
                memory.set_hardstate(hard_state.clone());
            }
        }
        self.gathering.add(ready.number(), hard_state, entries);
        self.gathering_messages
            .extend(ready.take_persisted_messages());
        self.node.advance_append_async(ready);
        if with_snapshot {
            // raft counts the snapshot applied only once it knows it persisted: this `Ready`
            // is made durable where it stands (a snapshot is rare; the disk was flushed for it).
            self.flush()?;
            self.report_durable();
        }
        self.node.advance_apply();
        self.sync_step()?;
        self.propose_deferred_conf_changes();
        self.publish_status();
        Ok(())
    }

    /// Hands committed entries to the state machine, applying their membership changes to
    /// raft on the way: the entries before a change are applied first, so that the state
    /// machine judges the change (`conf_change_allowed`) on the membership it follows.
    fn send_committed(&mut self, entries: Vec<Entry>) -> Result<()> {
        let mut chunk = Vec::with_capacity(entries.len());
        let mut conf_state = None;
        for entry in entries {
            let changed = match entry.get_entry_type() {
                EntryType::EntryConfChange => {
                    let change = EtcdConfChange::decode(&entry.data)?;
                    if !chunk.is_empty() {
                        self.apply_chunk(std::mem::take(&mut chunk), conf_state.take())?;
                    }
                    let machine = &mut self.state_machine;
                    if !machine.conf_change_allowed(entry.index, &change) {
                        None
                    } else {
                        // An update (new peer URLs) is etcd raft's no-op: only the state
                        // machine applies it.
                        match change.to_raft() {
                            Some(change) => Some(self.node.apply_conf_change(&change)?),
                            None => None,
                        }
                    }
                }
                EntryType::EntryConfChangeV2 => {
                    let mut change = ConfChangeV2::default();
                    change
                        .merge_from_bytes(&entry.data)
                        .map_err(|e| Error::Corrupt(e.to_string()))?;
                    Some(self.node.apply_conf_change(&change)?)
                }
                EntryType::EntryNormal => None,
            };
            if let Some(changed) = changed {
                *self.node.raft.raft_log.store.conf_state.lock() = changed.clone();
                conf_state = Some(changed);
                self.check_company()?;
            }
            chunk.push(entry);
        }
        if chunk.is_empty() {
            return Ok(());
        }
        self.apply_chunk(chunk, conf_state)
    }

    /// Applies one run of committed entries and records how far the state machine got.
    fn apply_chunk(&mut self, entries: Vec<Entry>, conf_state: Option<ConfState>) -> Result<()> {
        let Some(last) = entries.last() else {
            return Ok(());
        };
        let last_index = last.index;
        let raft = &self.node.raft;
        let raft_view = RaftView {
            is_leader: raft.state == StateRole::Leader,
            term: raft.term,
            leader: raft.leader_id,
        };
        self.bytes_since_mark += entries
            .iter()
            .map(|e| e.data.len() as u64 + e.context.len() as u64)
            .sum::<u64>();
        let machine = &mut self.state_machine;
        let applied = machine
            .apply(Apply {
                entries,
                conf_state,
                raft: raft_view,
            })
            .map_err(Error::Apply)?;
        self.status.write().applied = last_index;
        *self.node.raft.raft_log.store.applied.lock() = (applied.index, applied.term);
        self.compact_requested |= applied.compact_log;
        self.on_applied(applied.durable)
    }

    /// A snapshot from the leader: the state machine installs its image first, then the WAL
    /// records the snapshot and raft's log restarts after it.
    fn install_snapshot(&mut self, snapshot: raft::eraftpb::Snapshot) -> Result<()> {
        // The log before the snapshot reaches the disk first, so that the mark follows it.
        self.flush()?;
        let meta = snapshot.get_metadata();
        let (index, term) = (meta.index, meta.term);
        let machine = &mut self.state_machine;
        metrics::SNAPSHOT_APPLY_IN_PROGRESS.set(1);
        let restored = machine.restore(index, term, meta.get_conf_state(), snapshot.get_data());
        metrics::SNAPSHOT_APPLY_IN_PROGRESS.set(0);
        restored.map_err(Error::Apply)?;
        // The mark is durable before raft's log restarts after it: a restart must not find
        // the state machine past a log that has no mark.
        let mark = SyncBatch {
            mark: Some((index, term)),
            ..SyncBatch::default()
        };
        if self.persistence.submit(mark)?.is_none() {
            self.persistence.poll(true)?;
        }
        let store = &self.node.raft.raft_log.store;
        *store.conf_state.lock() = meta.get_conf_state().clone();
        store.mem.wl().apply_snapshot(snapshot)?;
        *store.applied.lock() = (index, term);
        self.last_mark = index;
        self.bytes_since_mark = 0;
        self.status.write().applied = index;
        self.check_company()?;
        tracing::info!(index, term, "applied snapshot from the leader");
        Ok(())
    }

    /// Tell raft whether a snapshot reached member `to`.
    pub(crate) fn report_snapshot(&mut self, to: u64, ok: bool) {
        let status = if ok {
            raft::SnapshotStatus::Finish
        } else {
            raft::SnapshotStatus::Failure
        };
        self.node.report_snapshot(to, status);
    }

    fn on_applied(&mut self, durable: Option<(u64, u64)>) -> Result<()> {
        let Some((index, term)) = durable else {
            return Ok(());
        };
        let forced = self.compact_requested;
        let due = index >= self.last_mark + self.config.snapshot_count
            || self.bytes_since_mark >= LOG_BYTES_BETWEEN_MARKS;
        if index <= self.last_mark || (!forced && !due) {
            return Ok(());
        }
        self.compact_requested = false;
        // Everything up to `index` is durable in the backend: the WAL no longer needs it. The
        // mark and the release go with the next batch (every applied entry is durable in the
        // WAL already: raft hands over only persisted entries to apply).
        self.gathering.mark = Some((index, term));
        self.gathering.release_to = Some(index);
        // Catch-up entries, as many as fit in CATCH_UP_BYTES at the mean size since the last
        // mark.
        let since = index.saturating_sub(self.last_mark).max(1);
        let mean = (self.bytes_since_mark / since).max(1);
        let catch_up = self.config.catch_up_entries.min(CATCH_UP_BYTES / mean);
        self.last_mark = index;
        self.bytes_since_mark = 0;
        let keep_from = if forced {
            index
        } else {
            index.saturating_sub(catch_up)
        };
        let store = self.node.raft.raft_log.store.mem.clone();
        let first = store.first_index().unwrap_or(1);
        if keep_from > first {
            store.wl().compact(keep_from)?;
        }
        tracing::info!(index, "saved snapshot mark and released old WAL segments");
        Ok(())
    }

    fn publish_status(&self) {
        let raft = &self.node.raft;
        let conf = raft.prs().conf();
        let mut status = self.status.write();
        status.leader = raft.leader_id;
        status.term = raft.term;
        status.commit = raft.raft_log.committed;
        status.is_leader = raft.state == StateRole::Leader;
        status.joint = !conf.to_conf_state().voters_outgoing.is_empty();
        let voters: Vec<u64> = conf.voters().ids().iter().collect();
        if *status.voters != *voters {
            status.voters = voters.into();
        }
        let learners: Vec<u64> = conf.learners().iter().copied().collect();
        if *status.learners != *learners {
            status.learners = learners.into();
        }
        status.matched = if status.is_leader {
            raft.prs()
                .iter()
                .map(|(id, pr)| (*id, pr.matched))
                .collect()
        } else {
            Arc::from([])
        };
    }
}

/// raft-rs's leader decodes a proposed conf change with its own `ConfChange` type to check it,
/// and refuses etcd's `ConfChangeAddLearnerNode = 3`, a type raft-rs does not know (its learner
/// is 2). The check reads nothing but whether the change enters or leaves a joint configuration,
/// so a learner addition goes through it as the same change with type 2 (its alias, unique by
/// the request id it carries), and [`NodeCore::restore_aliases`] puts etcd's bytes back before
/// anything is persisted, sent or applied. Returns each alias with the original data.
fn alias_learner_additions(message: &mut Message) -> Vec<(Vec<u8>, Vec<u8>)> {
    if message.get_msg_type() != raft::eraftpb::MessageType::MsgPropose {
        return Vec::new();
    }
    let mut aliases = Vec::new();
    for entry in message.mut_entries().iter_mut() {
        if entry.get_entry_type() != EntryType::EntryConfChange {
            continue;
        }
        let Ok(change) = EtcdConfChange::decode(&entry.data) else {
            continue;
        };
        if change.kind != ChangeKind::AddLearnerNode {
            continue;
        }
        let alias = EtcdConfChange {
            kind: ChangeKind::UpdateNode,
            ..change
        }
        .encode();
        let original = std::mem::replace(&mut entry.data, alias.clone().into());
        aliases.push((alias, original.to_vec()));
    }
    aliases
}
