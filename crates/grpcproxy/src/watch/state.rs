//! The hub's state under its lock (`State`): sending to a client within its queue's room,
//! s-watchers made, started, released and removed, c-watchers joined to and detached from
//! them, and slow clients' c-watchers paused and resumed.

use super::*;

impl State {
    /// Sends `resp` to `client`; a full queue cuts the client off.
    pub(super) fn send(&mut self, client: ClientId, resp: impl Into<WatchOut>) -> bool {
        let Some(c) = self.clients.get(&client) else {
            return false;
        };
        match c.tx.try_send(resp.into()) {
            Ok(()) => true,
            Err(mpsc::error::TrySendError::Full(_)) => {
                c.kill.cancel();
                false
            }
            Err(mpsc::error::TrySendError::Closed(_)) => false,
        }
    }

    /// Whether `client`'s queue has room for events (beyond the room kept for control).
    pub(super) fn has_room(&self, client: ClientId) -> bool {
        self.room(client) > CONTROL_RESERVE
    }

    /// Free places in `client`'s queue.
    pub(super) fn room(&self, client: ClientId) -> usize {
        self.clients.get(&client).map_or(0, |c| c.tx.capacity())
    }

    /// Registers a new s-watcher and asks the cluster for it (unless it is paused).
    pub(super) fn add_sw(&mut self, hub: &Arc<Hub>, sw: SWatcher) -> SwId {
        let id = self.next_sw;
        self.next_sw += 1;
        let token = sw.group.token.clone();
        if sw.live {
            self.live.insert(sw.group.clone(), id);
        }
        let paused = sw.paused;
        let follower = sw.mergeable.then(|| sw.group.clone());
        self.sws.insert(id, sw);
        if !paused {
            self.start_sw(hub, &token, id);
        }
        if let Some(group) = follower {
            *self.followers.entry(group.clone()).or_default() += 1;
            if !self.live.contains_key(&group) {
                // Somewhere to merge into once caught up.
                let live = SWatcher {
                    group,
                    start_rev: 0,
                    live: true,
                    mergeable: false,
                    paused: false,
                    upstream_id: None,
                    next_rev: 0,
                    header: ResponseHeader::default(),
                    members: Vec::new(),
                    waiting: Vec::new(),
                };
                self.add_sw(hub, live);
            }
        }
        id
    }

    /// Drops s-watcher `id` if nobody needs it any more.
    pub(super) fn release_if_unused(&mut self, id: SwId) {
        let Some(sw) = self.sws.get(&id) else {
            return;
        };
        let followed = sw.live && self.followers.get(&sw.group).is_some_and(|n| *n > 0);
        if sw.members.is_empty() && sw.waiting.is_empty() && !followed {
            self.remove_sw(id);
        }
    }

    /// Asks the cluster for s-watcher `id` on the stream of `token` (opened if needed).
    pub(super) fn start_sw(&mut self, hub: &Arc<Hub>, token: &str, id: SwId) {
        let Some(request) = self.sws.get(&id).map(SWatcher::create_request) else {
            return;
        };
        let token = token.to_owned();
        let stream = match self.streams.get_mut(&token) {
            Some(stream) => stream,
            None => {
                let idle = Arc::new(Notify::new());
                self.streams.insert(
                    token.clone(),
                    UpStream {
                        generation: 0,
                        req_tx: None,
                        ids: HashMap::new(),
                        pending: VecDeque::new(),
                        sws: HashSet::new(),
                        partial: HashMap::new(),
                        progress_waiters: VecDeque::new(),
                        idle,
                    },
                );
                // Task `grpc-proxy watch upstream`: the identity's cluster stream.
                hub.tasks.spawn(run_upstream(hub.clone(), token.clone()));
                self.streams.get_mut(&token).expect("inserted above")
            }
        };
        stream.sws.insert(id);
        if stream.req_tx.is_some() {
            stream.send(request);
            stream.pending.push_back(id);
        }
    }

    /// Parks `members` (c-watchers of `client` taken off s-watcher `sw_id`, whose next event
    /// is at `resume_rev`) on one paused private s-watcher until their client has room.
    pub(super) fn pause(
        &mut self,
        hub: &Arc<Hub>,
        sw_id: SwId,
        client: ClientId,
        members: Vec<Member>,
        resume_rev: i64,
    ) {
        let Some(sw) = self.sws.get(&sw_id) else {
            return;
        };
        let group = sw.group.clone();
        let mergeable = sw.live || sw.mergeable;
        let watch_ids: Vec<i64> = members.iter().map(|m| m.watch_id).collect();
        let members = members
            .into_iter()
            .map(|mut m| {
                m.min_rev = m.min_rev.max(resume_rev);
                m
            })
            .collect();
        let paused = SWatcher {
            group,
            start_rev: resume_rev,
            live: false,
            mergeable,
            paused: true,
            upstream_id: None,
            next_rev: 0,
            header: ResponseHeader::default(),
            members,
            waiting: Vec::new(),
        };
        let paused_id = self.add_sw(hub, paused);
        if let Some(c) = self.clients.get_mut(&client) {
            for watch_id in watch_ids {
                c.watchers.insert(watch_id, paused_id);
            }
            c.paused.push(paused_id);
            c.lagging.store(true, std::sync::atomic::Ordering::Release);
        }
    }

    /// Puts `client`'s paused c-watchers back on the cluster stream, from where they stopped.
    pub(super) fn resume(&mut self, hub: &Arc<Hub>, client: ClientId) {
        let Some(c) = self.clients.get_mut(&client) else {
            return;
        };
        let paused = std::mem::take(&mut c.paused);
        c.lagging.store(false, std::sync::atomic::Ordering::Release);
        for id in paused {
            let Some(sw) = self.sws.get_mut(&id) else {
                continue;
            };
            if !sw.paused {
                continue;
            }
            sw.paused = false;
            let token = sw.group.token.clone();
            self.start_sw(hub, &token, id);
        }
        // A progress request deferred for this client is asked again, behind the catch-up.
        let token = self.clients.get(&client).map(|c| c.token.clone());
        if let Some(stream) = token.and_then(|t| self.streams.get(&t))
            && stream.progress_waiters.contains(&client)
        {
            stream.send(progress_request());
        }
    }

    /// Forgets an s-watcher and cancels it on the cluster.
    pub(super) fn remove_sw(&mut self, id: SwId) -> Option<SWatcher> {
        let sw = self.sws.remove(&id)?;
        if sw.live && self.live.get(&sw.group) == Some(&id) {
            self.live.remove(&sw.group);
        }
        if sw.mergeable
            && let Some(n) = self.followers.get_mut(&sw.group)
        {
            *n -= 1;
            if *n == 0 {
                self.followers.remove(&sw.group);
                if let Some(&live) = self.live.get(&sw.group) {
                    self.release_if_unused(live);
                }
            }
        }
        if let Some(stream) = self.streams.get_mut(&sw.group.token) {
            stream.sws.remove(&id);
            if let Some(upstream_id) = sw.upstream_id {
                stream.ids.remove(&upstream_id);
                stream.send(cancel_request(upstream_id));
            }
            if stream.sws.is_empty() {
                stream.idle.notify_one();
            }
        }
        Some(sw)
    }

    /// Removes c-watcher `watch_id` of `client` from its s-watcher; drops the s-watcher when
    /// nobody is left on it.
    pub(super) fn detach(
        &mut self,
        metrics: &Metrics,
        client: ClientId,
        watch_id: i64,
    ) -> Option<SwId> {
        let sw_id = self.clients.get_mut(&client)?.watchers.remove(&watch_id)?;
        let sw = self.sws.get_mut(&sw_id)?;
        let is_member = |m: &Member| m.client == client && m.watch_id == watch_id;
        let before = sw.members.len();
        sw.members.retain(|m| !is_member(m));
        sw.waiting.retain(|w| !is_member(&w.member));
        if sw.live && sw.members.len() < before && !sw.members.is_empty() {
            metrics.add_watchers_coalescing(-1);
        }
        self.release_if_unused(sw_id);
        Some(sw_id)
    }

    /// Adds a member to a created live s-watcher.
    pub(super) fn join(&mut self, metrics: &Metrics, sw_id: SwId, member: Member) {
        if let Some(sw) = self.sws.get_mut(&sw_id) {
            if sw.live && !sw.members.is_empty() {
                metrics.add_watchers_coalescing(1);
            }
            if let Some(c) = self.clients.get_mut(&member.client) {
                c.watchers.insert(member.watch_id, sw_id);
            }
            sw.members.push(member);
        }
    }
}
