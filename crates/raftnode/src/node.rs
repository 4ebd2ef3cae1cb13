//! The raft node without its thread (sans-IO): how a node is built from its log store, and
//! [`Node`], the same loop body that the raft thread runs, driven by a caller that owns time
//! and the network. The member's thread ([`crate::start`]) and the deterministic simulator
//! both run this code; only the clock, the channels and the log store differ.

use super::*;

impl NodeCore {
    /// A node over `log`, which held `recovered` when it was opened (nothing for a new or
    /// joining member): raft's in-memory log rebuilt from it, the first entries of a new
    /// cluster written to it.
    pub(crate) fn new(
        config: NodeConfig,
        start: Start,
        mut log: Box<dyn LogStore>,
        recovered: Recovered,
        transport: Arc<dyn Transport>,
        state_machine: Box<dyn StateMachine>,
    ) -> Result<NodeCore> {
        let storage = MemStorage::new();
        let alone_at_start = match &start {
            Start::New { peers, .. } => peers.len() == 1 && peers[0].0 == config.id,
            Start::Join { .. } => false,
            Start::Restart { conf_state, .. } => crate::node_loop::only_node(conf_state, config.id),
        };
        let applied = match start {
            Start::New { peers, .. } => {
                let mut entries = Vec::with_capacity(peers.len());
                for (i, (id, context)) in peers.iter().enumerate() {
                    // etcd's raft `StartNode`: one `AddNode` per peer, request id 0.
                    let change = EtcdConfChange {
                        id: 0,
                        kind: ChangeKind::AddNode,
                        node_id: *id,
                        context: Some(context.clone()),
                    };
                    let mut entry = Entry::default();
                    entry.set_entry_type(EntryType::EntryConfChange);
                    entry.term = 1;
                    entry.index = i as u64 + 1;
                    entry.data = change.encode().into();
                    entries.push(entry);
                }
                let hard_state = HardState {
                    term: 1,
                    commit: entries.len() as u64,
                    ..Default::default()
                };
                persist(log.as_mut(), &storage, Some(&hard_state), &entries)?;
                0
            }
            Start::Join { .. } => 0,
            Start::Restart {
                applied,
                conf_state,
                force_new_cluster,
            } => {
                restore(
                    &config,
                    log.as_mut(),
                    &storage,
                    recovered,
                    applied,
                    conf_state,
                    force_new_cluster,
                )?;
                applied
            }
        };

        let raft_config = raft::Config {
            id: config.id,
            election_tick: config.election_tick,
            heartbeat_tick: config.heartbeat_tick,
            applied,
            pre_vote: config.pre_vote,
            check_quorum: true,
            max_size_per_msg: 1024 * 1024,
            max_inflight_msgs: 256,
            ..Default::default()
        };
        raft_config.validate()?;
        let initial = storage.initial_state().ok();
        let applied_term = storage
            .term(applied)
            .unwrap_or_else(|_| initial.as_ref().map_or(0, |s| s.hard_state.term));
        let initial_conf = initial.map(|s| s.conf_state).unwrap_or_default();
        let storage = NodeStorage {
            mem: storage,
            applied: Arc::new(parking_lot::Mutex::new((applied, applied_term))),
            conf_state: Arc::new(parking_lot::Mutex::new(initial_conf)),
        };
        let node = RawNode::new(&raft_config, storage, &logger::logger())?;
        let status = Arc::new(RwLock::new(NodeStatus {
            id: config.id,
            applied,
            ..NodeStatus::default()
        }));
        Ok(NodeCore {
            config,
            node,
            persistence: Persistence::Inline(log),
            synced: Arc::default(),
            alone_at_start,
            gathering: SyncBatch::default(),
            gathering_messages: Vec::new(),
            in_flight_messages: Vec::new(),
            durable: None,
            durable_messages: Vec::new(),
            transport,
            status,
            state_machine,
            reads: crate::reads::ReadBatches::default(),
            last_mark: applied,
            bytes_since_mark: 0,
            compact_requested: false,
            deferred_conf: VecDeque::new(),
        })
    }
}

/// A restart: raft's in-memory log from what the log store recovered, the commit index no
/// lower than what the state machine applied, and with `--force-new-cluster` the
/// uncommitted tail dropped and every other member's removal committed.
fn restore(
    config: &NodeConfig,
    log: &mut dyn LogStore,
    storage: &MemStorage,
    recovered: Recovered,
    applied: u64,
    conf_state: ConfState,
    force_new_cluster: bool,
) -> Result<()> {
    let Recovered {
        snapshot: (snapshot_index, snapshot_term),
        hard_state: recovered_state,
        mut entries,
    } = recovered;
    crate::conf_state::check(&conf_state)?;
    let mut core = storage.wl();
    if snapshot_index > 0 {
        let mut snapshot = raft::eraftpb::Snapshot::default();
        let meta = snapshot.mut_metadata();
        meta.index = snapshot_index;
        meta.term = snapshot_term;
        meta.set_conf_state(conf_state.clone());
        core.apply_snapshot(snapshot)?;
    }
    let last_index = entries.last().map(|e| e.index).unwrap_or(snapshot_index);
    if applied > last_index {
        return Err(Error::LostEntries {
            applied,
            last: last_index,
            dir: config.wal_dir.display().to_string(),
        });
    }
    // Entries the state machine applied were committed even if the hard state that said so
    // did not reach the log before a crash.
    let commit = recovered_state.commit.max(applied).min(last_index);
    if force_new_cluster && last_index > commit {
        tracing::warn!(
            commit_index = commit,
            discarded = last_index - commit,
            "discarding uncommitted WAL entries"
        );
        entries.retain(|e| e.index <= commit);
    }
    core.append(&entries)?;
    let hard_state = HardState {
        term: recovered_state.term,
        vote: recovered_state.vote,
        commit,
        ..Default::default()
    };
    core.set_hardstate(hard_state.clone());
    let removals = if force_new_cluster {
        standalone_removals(config.id, &conf_state, &entries, applied, &hard_state)?
    } else {
        Vec::new()
    };
    core.set_conf_state(conf_state);
    drop(core);
    if force_new_cluster {
        let hard_state = HardState {
            commit: removals.last().map_or(commit, |e| e.index),
            ..hard_state
        };
        tracing::info!(
            local_member_id = %format!("{:x}", config.id),
            commit_index = hard_state.commit,
            "forcing restart member"
        );
        persist(log, storage, Some(&hard_state), &removals)?;
    }
    Ok(())
}

/// The raft node driven by its caller: no thread, timer, channel or file of its own. The
/// caller ticks it, hands it peers' messages and local requests, and calls
/// [`Node::process`] after each to run the `Ready` step exactly as the raft thread runs it
/// (persist to the log store, send through the transport, apply to the state machine).
/// The deterministic simulator drives members this way, one seed deciding every interleaving.
pub struct Node {
    core: NodeCore,
}

impl Node {
    /// A node over `log`, which held `recovered` when it was opened ([`Recovered::default`]
    /// for a new or joining member's empty log), as [`crate::start`] builds it over the WAL.
    pub fn new(
        config: NodeConfig,
        start: Start,
        log: Box<dyn LogStore>,
        recovered: Recovered,
        transport: Arc<dyn Transport>,
        state_machine: Box<dyn StateMachine>,
    ) -> Result<Node> {
        let core = NodeCore::new(config, start, log, recovered, transport, state_machine)?;
        Ok(Node { core })
    }

    /// One tick of raft's logical clock (etcd's heartbeat interval).
    pub fn tick(&mut self) {
        self.core.tick();
    }

    /// Hand a message from a peer to raft; false if raft refused it.
    pub fn step(&mut self, message: Message) -> bool {
        self.core.step(message)
    }

    /// Propose opaque data, as [`RaftNodeHandle::propose`] does on the raft thread; raft's
    /// refusal (no leader, a leader transfer under way) is the error. Ok means raft took it
    /// into its log, not that it will commit.
    pub fn propose(&mut self, data: Vec<u8>) -> Result<()> {
        let refused = Arc::new(parking_lot::Mutex::new(None));
        let hook = refused.clone();
        self.core
            .propose(data, Box::new(move |e| *hook.lock() = Some(e)));
        match refused.lock().take() {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }

    /// Ask for a read index, as [`RaftNodeHandle::read_index`]: the answer arrives on the
    /// returned receiver once a [`Node::process`] sees raft's read state.
    pub fn read_index(&mut self) -> oneshot::Receiver<Result<u64>> {
        let (done, answer) = oneshot::channel();
        self.core.read_index(done);
        answer
    }

    /// Propose a membership change, as [`RaftNodeHandle::propose_conf_change`] does on the
    /// raft thread (held back while another is in flight); the answer is on the returned
    /// receiver once raft took it into its log or refused it.
    pub fn propose_conf_change(
        &mut self,
        change: crate::confchange::EtcdConfChange,
    ) -> oneshot::Receiver<Result<()>> {
        let (done, answer) = oneshot::channel();
        if let Err(e) = self
            .core
            .handle(crate::NodeMsg::ProposeConfChange { change, done })
        {
            tracing::warn!(error = %e, "membership change not proposed");
        }
        answer
    }

    /// Ask the leader to hand leadership to `to`.
    pub fn transfer_leader(&mut self, to: u64) {
        self.core.node.transfer_leader(to);
    }

    /// Report whether a snapshot reached member `to`.
    pub fn report_snapshot(&mut self, to: u64, ok: bool) {
        self.core.report_snapshot(to, ok);
    }

    /// Run what the raft thread runs after each turn: a lone voter's campaign, then the
    /// `Ready` steps as long as raft has one (the log store writes each batch where it is
    /// handed over, so what a `Ready` persisted can commit and apply in the next). Returns
    /// whether there was a `Ready`.
    pub fn process(&mut self) -> Result<bool> {
        let mut had_ready = false;
        while self.core.turn()? {
            had_ready = true;
        }
        Ok(had_ready)
    }

    /// From now on the log store's writes wait for [`Node::write_to_disk`], as the raft
    /// thread's wait for its `wal-sync` thread: raft goes on meanwhile, a leader replicating
    /// what it has not persisted, a follower holding back what depends on what it has not. A
    /// batch not written when the node is dropped is lost.
    pub fn defer_disk_writes(&mut self) {
        self.core.persistence.defer();
    }

    /// Whether a batch waits for [`Node::write_to_disk`].
    pub fn disk_write_waiting(&self) -> bool {
        self.core.persistence.deferred_waiting()
    }

    /// Writes the batch that waits (after [`Node::defer_disk_writes`]); the next
    /// [`Node::process`] tells raft and sends what waited for it. Whether a batch was written.
    pub fn write_to_disk(&mut self) -> Result<bool> {
        self.core.persistence.write_deferred()
    }

    /// The node's state as of its last `Ready`.
    pub fn status(&self) -> NodeStatus {
        self.core.status.read().clone()
    }

    /// raft-rs's node itself, for checks of raft's own state (role, term, log) in tests and
    /// the simulator.
    pub fn raw(&self) -> &RawNode<NodeStorage> {
        &self.core.node
    }

    /// raft-rs's node, mutably: for the simulator to draw raft's randomized election timeout
    /// from its seed. Requests go through [`Node`]'s own methods.
    pub fn raw_mut(&mut self) -> &mut RawNode<NodeStorage> {
        &mut self.core.node
    }
}
