//! The cluster's responses handed to c-watchers: created answers matched to the s-watchers
//! that asked, fragments joined, progress answers passed on, cancels passed to every member,
//! and events filtered and delivered to each member (each event encoded once) within its
//! client's queue; members without room are paused, and private s-watchers that caught up
//! merge into the live one. Everything here runs under the hub's lock, on the cluster
//! stream's task (`run_upstream`).

use super::*;

impl Hub {
    /// A response of the cluster stream of `token`, connection `generation`.
    pub(super) fn on_response(
        self: &Arc<Self>,
        token: &str,
        generation: u64,
        mut resp: WatchResponse,
    ) {
        let mut guard = self.state.lock();
        let state = &mut *guard;
        let Some(stream) = state.streams.get_mut(token) else {
            return;
        };
        if stream.generation != generation {
            return;
        }
        if resp.fragment {
            stream
                .partial
                .entry(resp.watch_id)
                .or_default()
                .append(&mut resp.events);
            return;
        }
        if let Some(mut events) = stream.partial.remove(&resp.watch_id) {
            events.append(&mut resp.events);
            resp.events = events;
        }
        let header = resp.header.unwrap_or_default();
        if resp.created {
            let Some(sw_id) = stream.pending.pop_front() else {
                return;
            };
            if resp.canceled || resp.watch_id < 0 {
                // The cluster refused the watch: so do we, to everyone waiting on it.
                if let Some(sw) = state.remove_sw(sw_id) {
                    fail_members(state, sw, &resp, true);
                }
                return;
            }
            if !state.sws.contains_key(&sw_id) {
                stream.send(cancel_request(resp.watch_id));
                return;
            }
            stream.ids.insert(resp.watch_id, sw_id);
            let Some(sw) = state.sws.get_mut(&sw_id) else {
                return;
            };
            sw.upstream_id = Some(resp.watch_id);
            if sw.next_rev == 0 {
                sw.next_rev = if sw.start_rev > 0 {
                    sw.start_rev
                } else {
                    header.revision + 1
                };
            }
            sw.header = header;
            let live = sw.live;
            let waiting = std::mem::take(&mut sw.waiting);
            let next_rev = sw.next_rev;
            for mut w in waiting {
                if live {
                    w.member.min_rev = w.member.min_rev.max(next_rev);
                }
                let (client, watch_id) = (w.member.client, w.member.watch_id);
                state.join(&self.metrics, sw_id, w.member);
                state.send(client, created_response(&header, watch_id));
                let _ = w.done.send(());
            }
            return;
        }
        if resp.watch_id == -1 && !resp.canceled && resp.events.is_empty() {
            // The answer to RequestProgress: everything up to this revision was delivered.
            let waiters: Vec<ClientId> = stream.progress_waiters.drain(..).collect();
            // A client with paused watchers has not received everything up to this revision:
            // it waits until they are back on the cluster stream (see `resume`).
            let (deferred, waiters): (Vec<ClientId>, Vec<ClientId>) =
                waiters.into_iter().partition(|client| {
                    state
                        .clients
                        .get(client)
                        .is_some_and(|c| !c.paused.is_empty())
                });
            if let Some(stream) = state.streams.get_mut(token) {
                stream.progress_waiters.extend(deferred);
            }
            for client in waiters {
                let reply = WatchResponse {
                    header: Some(header),
                    watch_id: -1,
                    ..Default::default()
                };
                state.send(client, reply);
            }
            return;
        }
        let Some(&sw_id) = stream.ids.get(&resp.watch_id) else {
            return;
        };
        if resp.canceled {
            stream.ids.remove(&resp.watch_id);
            if let Some(sw) = state.sws.get_mut(&sw_id) {
                // The cluster already dropped it: nothing to cancel there.
                sw.upstream_id = None;
            }
            if let Some(sw) = state.remove_sw(sw_id) {
                fail_members(state, sw, &resp, false);
            }
            return;
        }
        // Events, or a per-watcher progress notification.
        if !self.ns.is_empty() {
            for event in &mut resp.events {
                if let Some(kv) = event.kv.as_mut() {
                    self.ns.strip_kv(kv);
                }
                if let Some(kv) = event.prev_kv.as_mut() {
                    self.ns.strip_kv(kv);
                }
            }
        }
        self.deliver(state, sw_id, &resp, header);
    }

    pub(super) fn deliver(
        self: &Arc<Self>,
        state: &mut State,
        sw_id: SwId,
        resp: &WatchResponse,
        header: ResponseHeader,
    ) {
        let Some(sw) = state.sws.get_mut(&sw_id) else {
            return;
        };
        let last_rev = match resp.events.last().and_then(|e| e.kv.as_ref()) {
            Some(kv) => kv.mod_revision,
            None => header.revision,
        };
        // Each event is encoded once (twice if some member drops `prev_kv`); every member's
        // response shares those bytes.
        let mut encoded: Vec<EncodedEvent> = resp
            .events
            .iter()
            .map(|_| EncodedEvent::default())
            .collect();
        // (client, response, revision of its first event, fragments allowed)
        let mut out: Vec<(ClientId, WatchOut, i64, bool)> = Vec::with_capacity(sw.members.len());
        for m in &sw.members {
            if resp.events.is_empty() {
                if m.progress_notify && header.revision + 1 >= m.min_rev {
                    out.push((
                        m.client,
                        WatchOut {
                            header: Some(header),
                            watch_id: m.watch_id,
                            ..Default::default()
                        },
                        0,
                        false,
                    ));
                }
                continue;
            }
            let mut first = 0;
            let events: Vec<Bytes> = resp
                .events
                .iter()
                .zip(encoded.iter_mut())
                .filter(|(e, _)| e.kv.as_ref().is_some_and(|kv| kv.mod_revision >= m.min_rev))
                .filter(|(e, _)| {
                    let put = e.r#type == EventType::Put as i32;
                    !(put && m.no_put || !put && m.no_delete)
                })
                .map(|(e, enc)| {
                    if first == 0 {
                        first = e.kv.as_ref().map_or(0, |kv| kv.mod_revision);
                    }
                    enc.bytes(e, m.prev_kv)
                })
                .collect();
            if events.is_empty() {
                continue;
            }
            out.push((
                m.client,
                WatchOut {
                    header: Some(header),
                    watch_id: m.watch_id,
                    events,
                    ..Default::default()
                },
                first,
                m.fragment,
            ));
        }
        sw.next_rev = sw.next_rev.max(last_rev + 1);
        sw.header = header;
        let (live, mergeable, group, next_rev) =
            (sw.live, sw.mergeable, sw.group.clone(), sw.next_rev);
        if live && out.len() > 1 {
            self.metrics
                .add_events_coalescing((resp.events.len() * (out.len() - 1)) as u64);
        }
        let mut lagging: Vec<(ClientId, i64, i64)> = Vec::new();
        for (client, response, first, fragment) in out {
            if response.events.is_empty() {
                // A progress notification is advisory: a full queue just skips it.
                if state.has_room(client) {
                    state.send(client, response);
                }
                continue;
            }
            let watch_id = response.watch_id;
            let parts = if fragment {
                response.fragments(FRAGMENT_BYTES)
            } else {
                vec![response]
            };
            if state.room(client) > CONTROL_RESERVE + parts.len() - 1 {
                for part in parts {
                    state.send(client, part);
                }
            } else {
                let first = if first > 0 { first } else { next_rev };
                lagging.push((client, watch_id, first));
            }
        }
        if !lagging.is_empty() {
            self.pause_members(state, sw_id, &lagging);
        }
        if mergeable && state.sws.contains_key(&sw_id) {
            self.try_merge(state, sw_id, &group, next_rev);
        }
    }

    /// The queues of the clients an event response of the cluster stream of `token` goes to
    /// that have no room for it now, with the room each needs (its responses to this one, and
    /// the room kept for control responses).
    pub(super) fn congested(
        &self,
        token: &str,
        generation: u64,
        resp: &WatchResponse,
    ) -> Vec<(ClientTx, usize)> {
        let state = self.state.lock();
        let Some(stream) = state.streams.get(token) else {
            return Vec::new();
        };
        if stream.generation != generation {
            return Vec::new();
        }
        let Some(sw) = stream
            .ids
            .get(&resp.watch_id)
            .and_then(|id| state.sws.get(id))
        else {
            return Vec::new();
        };
        let mut per_client: HashMap<ClientId, usize> = HashMap::new();
        for m in &sw.members {
            *per_client.entry(m.client).or_default() += 1;
        }
        per_client
            .into_iter()
            .filter_map(|(client, n)| {
                let c = state.clients.get(&client)?;
                let needed = n.min(CLIENT_QUEUE - CONTROL_RESERVE) + CONTROL_RESERVE;
                (c.tx.capacity() < needed).then(|| (c.tx.clone(), needed))
            })
            .collect()
    }

    /// Pauses the c-watchers of `sw_id` that had no room for their events: `(client,
    /// watch_id, revision of the first event they missed)`.
    pub(super) fn pause_members(
        self: &Arc<Self>,
        state: &mut State,
        sw_id: SwId,
        lagging: &[(ClientId, i64, i64)],
    ) {
        let Some(sw) = state.sws.get_mut(&sw_id) else {
            return;
        };
        let first_of: HashMap<(ClientId, i64), i64> = lagging
            .iter()
            .map(|&(c, w, first)| ((c, w), first))
            .collect();
        let before = sw.members.len();
        let mut taken: HashMap<(ClientId, i64), Vec<Member>> = HashMap::new();
        let mut kept = Vec::with_capacity(before);
        for m in std::mem::take(&mut sw.members) {
            match first_of.get(&(m.client, m.watch_id)) {
                Some(&first) => taken.entry((m.client, first)).or_default().push(m),
                None => kept.push(m),
            }
        }
        sw.members = kept;
        if sw.live {
            let shared = |n: usize| n.saturating_sub(1) as i64;
            self.metrics
                .add_watchers_coalescing(shared(sw.members.len()) - shared(before));
        }
        // The c-watchers of one client that stopped at one revision share a paused watcher.
        let mut clients = HashSet::new();
        for ((client, first), members) in taken {
            state.pause(self, sw_id, client, members, first);
            clients.insert(client);
        }
        state.release_if_unused(sw_id);
        // A client that already drained its queue will not read again to wake its paused
        // watchers: resume them now. (The flag was set first, so a client still reading
        // sees it.)
        for client in clients {
            let drained = state
                .clients
                .get(&client)
                .is_some_and(|c| c.tx.max_capacity() - c.tx.capacity() < RESUME_BELOW);
            if drained {
                state.resume(self, client);
            }
        }
    }

    /// `client` drained its queue: its paused c-watchers catch up from where they stopped.
    pub(super) fn resume(self: &Arc<Self>, client: ClientId) {
        let mut state = self.state.lock();
        state.resume(self, client);
    }

    /// Hands a private s-watcher's c-watchers to the live one when no event can be lost or
    /// repeated.
    pub(super) fn try_merge(
        &self,
        state: &mut State,
        sw_id: SwId,
        group: &GroupKey,
        next_rev: i64,
    ) {
        let Some(&live_id) = state.live.get(group) else {
            return;
        };
        let Some(live) = state.sws.get(&live_id) else {
            return;
        };
        if !live.created() || live.next_rev > next_rev {
            return;
        }
        let Some(private) = state.remove_sw(sw_id) else {
            return;
        };
        for mut m in private.members {
            m.min_rev = m.min_rev.max(next_rev);
            state.join(&self.metrics, live_id, m);
        }
    }
}

/// One event of a cluster response, encoded on first use: as received, and without its
/// `prev_kv` for members that did not ask for it.
#[derive(Default)]
struct EncodedEvent {
    full: Option<Bytes>,
    without_prev: Option<Bytes>,
}

impl EncodedEvent {
    pub(super) fn bytes(&mut self, event: &Event, prev_kv: bool) -> Bytes {
        if prev_kv || event.prev_kv.is_none() {
            self.full.get_or_insert_with(|| encode_event(event)).clone()
        } else {
            self.without_prev
                .get_or_insert_with(|| {
                    encode_event(&Event {
                        prev_kv: None,
                        ..event.clone()
                    })
                })
                .clone()
        }
    }
}

/// Tells every member and waiter of `sw` it was cancelled, with the cluster's reason.
fn fail_members(state: &mut State, sw: SWatcher, resp: &WatchResponse, on_create: bool) {
    let header = resp.header.unwrap_or_default();
    let response = |watch_id: i64, created: bool| WatchResponse {
        header: Some(header),
        watch_id,
        created,
        canceled: true,
        compact_revision: resp.compact_revision,
        cancel_reason: resp.cancel_reason.clone(),
        ..Default::default()
    };
    for m in sw.members {
        if let Some(c) = state.clients.get_mut(&m.client) {
            c.watchers.remove(&m.watch_id);
        }
        state.send(m.client, response(m.watch_id, false));
    }
    for w in sw.waiting {
        if let Some(c) = state.clients.get_mut(&w.member.client) {
            c.watchers.remove(&w.member.watch_id);
        }
        state.send(w.member.client, response(w.member.watch_id, on_create));
        let _ = w.done.send(());
    }
}

/// The hub driven directly: each test plays the cluster (it connects the identity's stream
/// itself, reads the requests sent on it and feeds responses to `on_response`), so no
/// network and no upstream task take part.
#[cfg(test)]
mod tests {
    use etcdrs_proto::mvccpb::KeyValue;
    use prost::Message as _;

    use super::*;

    struct Cluster {
        hub: Arc<Hub>,
        requests: mpsc::UnboundedReceiver<WatchRequest>,
        generation: u64,
    }

    fn hub() -> Arc<Hub> {
        let upstream = Upstream::new(&["127.0.0.1:1".to_string()], None, 4 << 20)
            .expect("a well-formed endpoint");
        let shutdown = CancellationToken::new();
        // The test is the cluster: a cancelled token makes the upstream task end at once.
        shutdown.cancel();
        Arc::new(Hub {
            upstream,
            ns: Namespace::new(Vec::new()),
            metrics: Metrics::new(),
            shutdown,
            tasks: TaskTracker::new(),
            state: Mutex::new(State::default()),
        })
    }

    fn add_client(hub: &Hub) -> (ClientId, mpsc::Receiver<WatchOut>) {
        let (tx, rx) = mpsc::channel(CLIENT_QUEUE);
        let mut state = hub.state.lock();
        let id = state.next_client;
        state.next_client += 1;
        state.clients.insert(
            id,
            ClientState {
                tx,
                token: String::new(),
                exact: false,
                kill: CancellationToken::new(),
                watchers: HashMap::new(),
                next_watch_id: 0,
                paused: Vec::new(),
                lagging: Arc::new(std::sync::atomic::AtomicBool::new(false)),
            },
        );
        (id, rx)
    }

    /// Connects the (only) identity's cluster stream, once an s-watcher made it exist.
    fn connect(hub: &Arc<Hub>) -> Cluster {
        let (tx, requests) = mpsc::unbounded_channel();
        let generation = hub.connect("", tx).expect("the stream has s-watchers");
        Cluster {
            hub: hub.clone(),
            requests,
            generation,
        }
    }

    impl Cluster {
        fn sent(&mut self) -> Vec<WatchRequest> {
            std::iter::from_fn(|| self.requests.try_recv().ok()).collect()
        }

        fn respond(&self, resp: WatchResponse) {
            self.hub.on_response("", self.generation, resp);
        }

        fn created(&self, watch_id: i64, revision: i64) {
            self.respond(WatchResponse {
                header: Some(header(revision)),
                watch_id,
                created: true,
                ..Default::default()
            });
        }

        fn events(&self, watch_id: i64, revisions: &[i64], fragment: bool) {
            self.respond(WatchResponse {
                header: Some(header(*revisions.last().unwrap_or(&0))),
                watch_id,
                fragment,
                events: revisions.iter().map(|rev| put(b"a", *rev)).collect(),
                ..Default::default()
            });
        }
    }

    fn header(revision: i64) -> ResponseHeader {
        ResponseHeader {
            revision,
            ..Default::default()
        }
    }

    fn put(key: &[u8], revision: i64) -> Event {
        Event {
            r#type: EventType::Put as i32,
            kv: Some(KeyValue {
                key: key.to_vec(),
                mod_revision: revision,
                ..Default::default()
            }),
            prev_kv: None,
        }
    }

    fn watch(key: &[u8], start_revision: i64) -> WatchCreateRequest {
        WatchCreateRequest {
            key: key.to_vec(),
            start_revision,
            ..Default::default()
        }
    }

    fn received(rx: &mut mpsc::Receiver<WatchOut>) -> Vec<WatchOut> {
        std::iter::from_fn(|| rx.try_recv().ok()).collect()
    }

    /// The revisions of the events `rx` received, with the watch id each came for.
    fn event_revisions(rx: &mut mpsc::Receiver<WatchOut>) -> Vec<(i64, i64)> {
        received(rx)
            .into_iter()
            .flat_map(|out| {
                let watch_id = out.watch_id;
                out.events.into_iter().map(move |bytes| {
                    let event = Event::decode(bytes).expect("an encoded event");
                    (watch_id, event.kv.map_or(0, |kv| kv.mod_revision))
                })
            })
            .collect()
    }

    fn create_starts(requests: &[WatchRequest]) -> Vec<i64> {
        requests
            .iter()
            .filter_map(|r| match &r.request_union {
                Some(watch_request::RequestUnion::CreateRequest(c)) => Some(c.start_revision),
                _ => None,
            })
            .collect()
    }

    #[tokio::test]
    async fn watchers_of_one_range_share_one_cluster_watcher() {
        let hub = hub();
        let (first, mut first_rx) = add_client(&hub);
        let (second, mut second_rx) = add_client(&hub);
        let wait = hub.create(first, watch(b"a", 0));
        assert!(wait.is_some(), "the first watcher waits for the cluster");
        let mut cluster = connect(&hub);
        cluster.created(100, 10);
        let created = received(&mut first_rx);
        assert_eq!(created.len(), 1);
        assert!(created[0].created);
        assert_eq!(created[0].header.map(|h| h.revision), Some(10));

        // The second joins the live s-watcher at once: no new request to the cluster.
        assert!(hub.create(second, watch(b"a", 0)).is_none());
        assert_eq!(create_starts(&cluster.sent()), vec![0]);
        assert!(received(&mut second_rx)[0].created);

        cluster.events(100, &[11, 12], false);
        assert_eq!(event_revisions(&mut first_rx), vec![(0, 11), (0, 12)]);
        assert_eq!(event_revisions(&mut second_rx), vec![(0, 11), (0, 12)]);
    }

    #[tokio::test]
    async fn a_watcher_from_the_past_catches_up_then_merges_without_repeats() {
        let hub = hub();
        let (live, mut live_rx) = add_client(&hub);
        let (past, mut past_rx) = add_client(&hub);
        let _wait = hub.create(live, watch(b"a", 0));
        let mut cluster = connect(&hub);
        cluster.created(100, 10);
        cluster.events(100, &[11], false);
        received(&mut live_rx);
        cluster.sent();

        // Revision 5 was delivered already on the live one: a private s-watcher from 5.
        let _wait = hub.create(past, watch(b"a", 5));
        assert_eq!(create_starts(&cluster.sent()), vec![5]);
        cluster.created(101, 11);
        assert!(received(&mut past_rx)[0].created);

        // Caught up to the live one (both delivered everything below 12): it merges, and
        // the private watcher is cancelled on the cluster.
        cluster.events(101, &[7, 11], false);
        let cancels: Vec<i64> = cluster
            .sent()
            .iter()
            .filter_map(|r| match &r.request_union {
                Some(watch_request::RequestUnion::CancelRequest(c)) => Some(c.watch_id),
                _ => None,
            })
            .collect();
        assert_eq!(cancels, vec![101]);
        // Late events of the cancelled private watcher are not delivered again.
        cluster.events(101, &[11], false);
        cluster.events(100, &[12], false);
        assert_eq!(
            event_revisions(&mut past_rx),
            vec![(0, 7), (0, 11), (0, 12)]
        );
        assert_eq!(event_revisions(&mut live_rx), vec![(0, 12)]);
    }

    #[tokio::test]
    async fn fragments_are_joined_and_filters_apply_per_watcher() {
        let hub = hub();
        let (all, mut all_rx) = add_client(&hub);
        let (no_put, mut no_put_rx) = add_client(&hub);
        let _wait = hub.create(all, watch(b"a", 0));
        let cluster = connect(&hub);
        cluster.created(100, 10);
        let mut filtered = watch(b"a", 0);
        filtered.filters = vec![0];
        assert!(hub.create(no_put, filtered).is_none());
        received(&mut all_rx);
        received(&mut no_put_rx);

        cluster.events(100, &[11], true);
        assert!(
            received(&mut all_rx).is_empty(),
            "a fragment waits for the rest"
        );
        cluster.events(100, &[12], false);
        let responses = received(&mut all_rx);
        assert_eq!(responses.len(), 1, "one response for the joined revision");
        assert_eq!(responses[0].events.len(), 2);
        assert!(received(&mut no_put_rx).is_empty(), "NOPUT drops every put");
    }

    #[tokio::test]
    async fn cluster_cancels_and_progress_answers_reach_the_clients() {
        let hub = hub();
        let (client, mut rx) = add_client(&hub);
        let _wait = hub.create(client, watch(b"a", 0));
        let mut cluster = connect(&hub);
        cluster.created(100, 10);
        received(&mut rx);
        cluster.sent();

        assert!(hub.progress(client));
        let progress = cluster.sent();
        assert!(matches!(
            progress[..],
            [WatchRequest {
                request_union: Some(watch_request::RequestUnion::ProgressRequest(_))
            }]
        ));
        cluster.respond(WatchResponse {
            header: Some(header(20)),
            watch_id: -1,
            ..Default::default()
        });
        let answer = received(&mut rx);
        assert_eq!(answer.len(), 1);
        assert_eq!(answer[0].watch_id, -1);
        assert_eq!(answer[0].header.map(|h| h.revision), Some(20));

        cluster.respond(WatchResponse {
            header: Some(header(20)),
            watch_id: 100,
            canceled: true,
            compact_revision: 9,
            cancel_reason: "mvcc: required revision has been compacted".to_string(),
            ..Default::default()
        });
        let cancel = received(&mut rx);
        assert_eq!(cancel.len(), 1);
        assert!(cancel[0].canceled);
        assert_eq!(cancel[0].watch_id, 0);
        assert_eq!(cancel[0].compact_revision, 9);
        assert!(hub.state.lock().clients[&client].watchers.is_empty());
    }
}
