//! The clients: what each invokes when it wakes, and the history the checker reads.

use super::*;

impl Sim {
    pub(super) fn client_wakes(&mut self, client: usize, generation: u64) -> Step {
        if self.clients[client].generation != generation {
            return Ok(());
        }
        if let Some(op) = self.clients[client].busy.take() {
            // Its deadline passed: the client gives up; a write's outcome stays unknown.
            if self.ops[op].state == OpState::Open {
                self.ops[op].state = OpState::Abandoned;
                self.note("give-up", client as u64, op as u64, 0);
            }
        }
        if self.faults {
            self.invoke(client)?;
        }
        Ok(())
    }

    pub(super) fn take_value(&mut self) -> u64 {
        self.next_value += 1;
        self.next_value - 1
    }

    pub(super) fn invoke(&mut self, client: usize) -> Step {
        // A stalled member takes no new requests (its clients time out on it instead).
        let up: Vec<usize> = (0..self.members.len())
            .filter(|&i| {
                let m = &self.members[i];
                m.node.is_some() && m.paused_until <= self.now && !m.learner
            })
            .collect();
        self.clients[client].generation += 1;
        let generation = self.clients[client].generation;
        if up.is_empty() {
            self.schedule(10, Event::Client { client, generation });
            return Ok(());
        }
        let i = up[self.rng.random_range(0..up.len())];
        if self.rng.random_range(0..8) == 0 {
            self.lease_action(i);
        }
        if self.cfg.watches {
            match self.rng.random_range(0..16) {
                0 => self.request_compaction(i),
                1 | 2 => self.read_history(i)?,
                _ => {}
            }
        }
        let key = self.rng.random_range(0..self.cfg.keys);
        let roll = self.rng.random_range(0..10);
        let kind = match roll {
            0..3 => Kind::Put(self.take_value()),
            3 => Kind::Delete,
            4 => Kind::Cas {
                // Often the value last written there, so that some succeed.
                expect: if self.rng.random_bool(0.8) {
                    self.last_put.get(&key).copied().flatten()
                } else {
                    None
                },
                new: self.take_value(),
                succeeded: None,
            },
            _ => Kind::Get(None),
        };
        match kind {
            Kind::Put(value) => {
                self.last_put.insert(key, Some(value));
            }
            Kind::Delete => {
                self.last_put.insert(key, None);
            }
            _ => {}
        }
        self.clock += 1;
        let op = self.ops.len();
        self.ops.push(SimOp {
            op: Operation {
                client: client as u64,
                key,
                kind,
                invoke: self.clock,
                complete: None,
            },
            state: OpState::Open,
        });
        self.clients[client].busy = Some(op);
        let member = &mut self.members[i];
        let Some(node) = member.node.as_mut() else {
            return Err("invoke on a stopped member".into());
        };
        let accepted = match kind {
            Kind::Put(_) | Kind::Delete | Kind::Cas { .. } => {
                let request_id = self.next_request;
                self.next_request += 1;
                let header = if self.cfg.auth {
                    auth::header(request_id, auth::CLIENT_USER, member.state.as_ref())
                } else {
                    RequestHeader {
                        id: request_id,
                        ..RequestHeader::default()
                    }
                };
                let mut request = InternalRaftRequest {
                    header: Some(header),
                    ..InternalRaftRequest::default()
                };
                match kind {
                    Kind::Put(value) => {
                        request.put = Some(PutRequest {
                            key: key_bytes(key),
                            value: value.to_string().into_bytes().into(),
                            ..PutRequest::default()
                        })
                    }
                    Kind::Cas { expect, new, .. } => {
                        request.txn = Some(cas_request(key, expect, new))
                    }
                    _ => {
                        request.delete_range = Some(DeleteRangeRequest {
                            key: key_bytes(key),
                            ..DeleteRangeRequest::default()
                        })
                    }
                }
                let Some(state) = member.state.as_ref() else {
                    return Err("invoke on a stopped member".into());
                };
                // Registered first, as the server registers its waiter before proposing.
                let answer = state.wait(request_id);
                let accepted = node.propose(request.encode_to_vec()).is_ok();
                if accepted {
                    member.waiters.insert(request_id, (op, answer));
                }
                accepted
            }
            Kind::Get(_) => {
                if self.cfg.local_reads {
                    member.read_waits.push((0, op));
                    true
                } else if node.raw().raft.leader_id == raft::INVALID_ID {
                    // As `raftnode`: without a leader the read is refused at once.
                    false
                } else {
                    member.reads.push((op, node.read_index()));
                    true
                }
            }
        };
        let id = member.id;
        self.note("invoke", client as u64, op as u64, id);
        self.serve_reads(i)?;
        if accepted {
            self.schedule(CLIENT_TIMEOUT_MS, Event::Client { client, generation });
        } else {
            // Refused before it reached the log: it did not happen.
            self.ops[op].state = OpState::Failed;
            self.clients[client].busy = None;
            let after = self.rng.random_range(1..=20);
            self.schedule(after, Event::Client { client, generation });
        }
        Ok(())
    }

    /// Operation `op` was refused (at its apply, or by its member's read path): it did not
    /// happen, and its client goes on.
    pub(super) fn fail(&mut self, op: usize) {
        if self.ops[op].state != OpState::Open {
            return;
        }
        self.ops[op].state = OpState::Failed;
        let client = self.ops[op].op.client as usize;
        self.note("refused", client as u64, op as u64, 0);
        if self.clients[client].busy == Some(op) {
            self.clients[client].busy = None;
            self.clients[client].generation += 1;
            let generation = self.clients[client].generation;
            let after = self.rng.random_range(0..=10);
            self.schedule(after, Event::Client { client, generation });
        }
    }

    /// Operation `op` completes now, with its outcome.
    pub(super) fn complete(&mut self, op: usize, outcome: Outcome) {
        if self.ops[op].state != OpState::Open {
            return;
        }
        self.clock += 1;
        let entry = &mut self.ops[op];
        entry.state = OpState::Done;
        entry.op.complete = Some(self.clock);
        let value = match (outcome, &mut entry.op.kind) {
            (Outcome::Read(seen), kind) => {
                *kind = Kind::Get(seen);
                seen.unwrap_or(0)
            }
            (Outcome::Cas(held), Kind::Cas { succeeded, .. }) => {
                *succeeded = Some(held);
                u64::from(held)
            }
            _ => 0,
        };
        let client = entry.op.client as usize;
        self.note("complete", client as u64, op as u64, value);
        if self.clients[client].busy == Some(op) {
            self.clients[client].busy = None;
            self.clients[client].generation += 1;
            let generation = self.clients[client].generation;
            let after = self.rng.random_range(0..=10);
            self.schedule(after, Event::Client { client, generation });
        }
    }
}
