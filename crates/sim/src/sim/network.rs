//! The simulated network: raft messages delayed, dropped, duplicated and reordered between members,
//! and the backend images that travel with snapshots.

use super::*;

impl Sim {
    pub(super) fn send(&mut self, from: u64, messages: Vec<Message>) -> Step {
        for msg in messages {
            let (kind, to, term, index) = (msg.get_msg_type() as u64, msg.to, msg.term, msg.index);
            let image = if msg.get_msg_type() == MessageType::MsgSnapshot {
                Some(self.snapshot_image(from, &msg)?)
            } else {
                None
            };
            if self.faults && self.per_mille(self.cfg.drop_per_mille) {
                self.note("drop", kind, from * 100 + to, term);
                if image.is_some() {
                    let leader = (from - 1) as usize;
                    self.schedule(
                        1,
                        Event::SnapshotReport {
                            leader,
                            to,
                            ok: false,
                        },
                    );
                }
                continue;
            }
            let may_duplicate =
                msg.get_msg_type() != MessageType::MsgPropose || self.cfg.duplicate_proposals;
            let copies =
                if self.faults && may_duplicate && self.per_mille(self.cfg.duplicate_per_mille) {
                    2
                } else {
                    1
                };
            for _ in 0..copies {
                let delay = if self.faults && self.rng.random_range(0..20) == 0 {
                    self.rng.random_range(20..=200)
                } else {
                    self.rng.random_range(1..=self.cfg.max_delay_ms)
                };
                self.note("send", kind, from * 100 + to, term * 1_000_000 + index);
                self.schedule(
                    delay,
                    Event::Deliver {
                        from,
                        msg: Box::new(msg.clone()),
                        image: image.clone(),
                    },
                );
            }
        }
        Ok(())
    }

    /// The backend image a snapshot message carries (rafthttp sends the database after the
    /// message): the sender's last commit, which must not be older than the snapshot.
    pub(super) fn snapshot_image(&mut self, from: u64, msg: &Message) -> Step<PathBuf> {
        let index = msg.get_snapshot().get_metadata().index;
        let member = &self.members[(from - 1) as usize];
        let Some(kv) = member.store() else {
            return Err(format!("stopped member {from} sends a snapshot"));
        };
        let consistent = kv.consistent_index();
        if consistent < index {
            return Err(format!(
                "member {from} sends a snapshot at {index} with a backend image at {consistent}"
            ));
        }
        let image = kv
            .backend()
            .snapshot()
            .map_err(|e| format!("backend snapshot: {e}"))?;
        self.seq += 1;
        let path = self._dir.path().join(format!("image-{}.redb", self.seq));
        std::fs::copy(image.path(), &path).map_err(|e| format!("copy image: {e}"))?;
        self.note("snapshot-sent", from * 100 + msg.to, index, consistent);
        Ok(path)
    }

    pub(super) fn deliver(&mut self, from: u64, msg: Message, image: Option<PathBuf>) {
        let to = msg.to;
        let kind = msg.get_msg_type() as u64;
        let Some(i) = (to as usize)
            .checked_sub(1)
            .filter(|&i| i < self.members.len())
        else {
            return;
        };
        // etcd's peers refuse a removed member's messages, and it takes none.
        let cut = self.is_removed(from)
            || self.is_removed(to)
            || self
                .groups
                .as_ref()
                .is_some_and(|g| side(g, (from - 1) as usize) != side(g, i));
        let up = self.members[i].node.is_some();
        if let Some(image) = image {
            // The sender learns whether the snapshot arrived.
            let leader = (from - 1) as usize;
            let ok = up && !cut;
            self.schedule(1, Event::SnapshotReport { leader, to, ok });
            match self.members[i].state.as_ref() {
                // As the peer handler does: the image first, then the message to raft.
                Some(state) if ok => {
                    let index = msg.get_snapshot().get_metadata().index;
                    state.snapshot_received(index, image);
                }
                _ => {
                    let _ = std::fs::remove_file(image);
                }
            }
        }
        if cut {
            self.note("cut", kind, from * 100 + to, 0);
            return;
        }
        let Some(node) = self.members[i].node.as_mut() else {
            self.note("to-down", kind, from * 100 + to, 0);
            return;
        };
        let stepped = node.step(msg);
        self.note("deliver", kind, from * 100 + to, u64::from(stepped));
    }
}

/// A member's side of a partition; one added after the partition began is on side 0.
fn side(groups: &[u8], i: usize) -> u8 {
    groups.get(i).copied().unwrap_or(0)
}
