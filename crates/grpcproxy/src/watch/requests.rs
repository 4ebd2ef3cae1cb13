//! A client's requests turned into hub operations: create (join the live s-watcher of its
//! group, wait for one being created, or start a private one from a past revision), cancel,
//! progress, and the client's removal when its stream ends. The requests themselves are read
//! by `client::read_client`.

use super::*;

impl Hub {
    pub(super) fn create(
        self: &Arc<Self>,
        client: ClientId,
        req: WatchCreateRequest,
    ) -> Option<oneshot::Receiver<()>> {
        let (key, end) = self.ns.range(&req.key, &req.range_end);
        let mut guard = self.state.lock();
        let state = &mut *guard;
        let c = state.clients.get_mut(&client)?;
        if c.watchers.len() >= etcdrs_serve::watch_limits::WATCHERS_PER_STREAM {
            let refused = WatchResponse {
                watch_id: -1,
                created: true,
                canceled: true,
                cancel_reason: etcdrs_serve::watch_limits::too_many_watchers(),
                ..Default::default()
            };
            state.send(client, refused);
            return None;
        }
        let watch_id = if req.watch_id > 0 && !c.watchers.contains_key(&req.watch_id) {
            req.watch_id
        } else {
            while c.watchers.contains_key(&c.next_watch_id) {
                c.next_watch_id += 1;
            }
            c.next_watch_id
        };
        c.next_watch_id = c.next_watch_id.max(watch_id + 1);
        let (token, exact) = (c.token.clone(), c.exact);
        let member = Member {
            client,
            watch_id,
            min_rev: req.start_revision,
            prev_kv: req.prev_kv,
            progress_notify: req.progress_notify,
            no_put: req.filters.contains(&0),
            no_delete: req.filters.contains(&1),
            fragment: req.fragment,
        };
        let group = GroupKey {
            token,
            key,
            end,
            prev_kv: req.prev_kv,
        };
        let start = req.start_revision;
        let live_id = state.live.get(&group).copied();
        if !exact && let Some(live_id) = live_id {
            let joinable = state.sws.get(&live_id).map(|sw| {
                let can = if start == 0 {
                    true
                } else {
                    sw.created() && sw.next_rev <= start
                };
                (can, sw.created(), sw.next_rev, sw.header)
            });
            if let Some((true, created, next_rev, header)) = joinable {
                if created {
                    let mut member = member;
                    member.min_rev = member.min_rev.max(next_rev);
                    let mut header = header;
                    header.revision = header.revision.max(next_rev - 1);
                    state.join(&self.metrics, live_id, member);
                    state.send(client, created_response(&header, watch_id));
                    return None;
                }
                let (done, wait) = oneshot::channel();
                if let Some(c) = state.clients.get_mut(&client) {
                    c.watchers.insert(watch_id, live_id);
                }
                if let Some(sw) = state.sws.get_mut(&live_id) {
                    sw.waiting.push(Waiting { member, done });
                }
                return Some(wait);
            }
        }
        let live = !exact && start == 0;
        let (done, wait) = oneshot::channel();
        let sw = SWatcher {
            group,
            start_rev: start,
            live,
            mergeable: !exact && start != 0,
            paused: false,
            upstream_id: None,
            next_rev: 0,
            header: ResponseHeader::default(),
            members: Vec::new(),
            waiting: vec![Waiting { member, done }],
        };
        let sw_id = state.add_sw(self, sw);
        if let Some(c) = state.clients.get_mut(&client) {
            c.watchers.insert(watch_id, sw_id);
        }
        Some(wait)
    }

    pub(super) fn cancel(&self, client: ClientId, watch_id: i64) {
        let mut guard = self.state.lock();
        let state = &mut *guard;
        let Some(sw_id) = state
            .clients
            .get(&client)
            .and_then(|c| c.watchers.get(&watch_id).copied())
        else {
            return;
        };
        let header = state
            .sws
            .get(&sw_id)
            .map(|sw| sw.header)
            .unwrap_or_default();
        state.detach(&self.metrics, client, watch_id);
        state.send(
            client,
            WatchResponse {
                header: Some(header),
                watch_id,
                canceled: true,
                ..Default::default()
            },
        );
    }

    /// RequestProgress from `client`: asks the cluster on the client's stream. `false`: the
    /// client watches nothing there, and the cluster's current revision is the answer.
    pub(super) fn progress(&self, client: ClientId) -> bool {
        let mut guard = self.state.lock();
        let state = &mut *guard;
        let Some(token) = state.clients.get(&client).map(|c| c.token.clone()) else {
            return true;
        };
        let Some(stream) = state.streams.get_mut(&token) else {
            return false;
        };
        if stream.sws.is_empty() {
            return false;
        }
        if stream.progress_waiters.len() >= PROGRESS_WAITERS {
            return true;
        }
        // While the stream reconnects, the request waits: the reconnection asks for progress
        // once every s-watcher is re-created, so the answer never runs ahead of an event.
        stream.progress_waiters.push_back(client);
        stream.send(progress_request());
        true
    }

    pub(super) fn remove_client(&self, client: ClientId) {
        let mut guard = self.state.lock();
        let state = &mut *guard;
        let Some(c) = state.clients.get(&client) else {
            return;
        };
        let ids: Vec<i64> = c.watchers.keys().copied().collect();
        for watch_id in ids {
            state.detach(&self.metrics, client, watch_id);
        }
        state.clients.remove(&client);
    }
}
