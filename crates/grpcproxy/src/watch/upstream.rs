//! The cluster side: one watch stream per auth identity (`UpStream`), its (re)connection
//! with every s-watcher re-created from where it stopped, and the task that runs it
//! (`run_upstream`, task `grpc-proxy watch upstream`), holding the stream briefly while
//! clients' queues are full and failing over to another endpoint when it breaks.

use super::*;

/// The cluster stream of one identity.
pub(super) struct UpStream {
    /// Connection generation: responses of an older connection are ignored.
    pub(super) generation: u64,
    /// Requests for the current connection (none while reconnecting). Entries are bounded by
    /// the s-watchers (one create and one cancel each) and the progress waiters.
    pub(super) req_tx: Option<mpsc::UnboundedSender<WatchRequest>>,
    /// The cluster's watch ids on the current connection.
    pub(super) ids: HashMap<i64, SwId>,
    /// s-watchers whose create was sent and not yet answered, in order.
    pub(super) pending: VecDeque<SwId>,
    pub(super) sws: HashSet<SwId>,
    /// Events of fragmented responses, by the cluster's watch id, until the last fragment.
    pub(super) partial: HashMap<i64, Vec<Event>>,
    pub(super) progress_waiters: VecDeque<ClientId>,
    /// Wakes the stream's task when it has no s-watcher left.
    pub(super) idle: Arc<Notify>,
}

impl UpStream {
    pub(super) fn send(&self, request: WatchRequest) {
        if let Some(tx) = &self.req_tx {
            let _ = tx.send(request);
        }
    }
}

pub(super) fn cancel_request(watch_id: i64) -> WatchRequest {
    WatchRequest {
        request_union: Some(watch_request::RequestUnion::CancelRequest(
            WatchCancelRequest { watch_id },
        )),
    }
}

pub(super) fn progress_request() -> WatchRequest {
    WatchRequest {
        request_union: Some(watch_request::RequestUnion::ProgressRequest(
            WatchProgressRequest {},
        )),
    }
}

impl Hub {
    /// (Re)connection of the cluster stream of `token`: a new generation, and every
    /// s-watcher asked for again from where it stopped. `None`: the stream has no s-watcher
    /// left and is gone.
    pub(super) fn connect(
        &self,
        token: &str,
        req_tx: mpsc::UnboundedSender<WatchRequest>,
    ) -> Option<u64> {
        let mut guard = self.state.lock();
        let state = &mut *guard;
        let stream = state.streams.get_mut(token)?;
        if stream.sws.is_empty() {
            state.streams.remove(token);
            return None;
        }
        stream.generation += 1;
        stream.ids.clear();
        stream.partial.clear();
        stream.pending.clear();
        let mut ids: Vec<SwId> = stream.sws.iter().copied().collect();
        ids.sort_unstable();
        for id in ids {
            if let Some(sw) = state.sws.get_mut(&id) {
                sw.upstream_id = None;
                let _ = req_tx.send(sw.create_request());
                stream.pending.push_back(id);
            }
        }
        if !stream.progress_waiters.is_empty() {
            let _ = req_tx.send(progress_request());
        }
        stream.req_tx = Some(req_tx);
        Some(stream.generation)
    }

    pub(super) fn disconnect(&self, token: &str, generation: u64) {
        let mut state = self.state.lock();
        if let Some(stream) = state.streams.get_mut(token)
            && stream.generation == generation
        {
            stream.req_tx = None;
        }
    }

    pub(super) fn idle_notify(&self, token: &str) -> Option<Arc<Notify>> {
        self.state.lock().streams.get(token).map(|s| s.idle.clone())
    }

    /// Whether the stream of `token` has no s-watcher (it is then removed).
    pub(super) fn remove_if_idle(&self, token: &str) -> bool {
        let mut state = self.state.lock();
        match state.streams.get(token) {
            Some(stream) if stream.sws.is_empty() => {
                state.streams.remove(token);
                true
            }
            Some(_) => false,
            None => true,
        }
    }
}

/// Task `grpc-proxy watch upstream`: the cluster stream of one identity, reconnected to the
/// current endpoint whenever it breaks, until it has no s-watcher left or the proxy stops.
pub(super) async fn run_upstream(hub: Arc<Hub>, token: String) {
    let mut backoff = Duration::from_millis(50);
    loop {
        if hub.shutdown.is_cancelled() {
            return;
        }
        let Some(idle) = hub.idle_notify(&token) else {
            return;
        };
        let (idx, channel) = hub.upstream.current();
        let (req_tx, req_rx) = mpsc::unbounded_channel();
        let Some(generation) = hub.connect(&token, req_tx) else {
            return;
        };
        let mut client =
            WatchClient::new(channel).max_decoding_message_size(hub.upstream.max_decoding());
        let requests = tokio_stream::wrappers::UnboundedReceiverStream::new(req_rx);
        let opened = tokio::select! {
            _ = hub.shutdown.cancelled() => return,
            r = client.watch(require_leader(with_token(&token, requests))) => r,
        };
        match opened {
            Ok(resp) => {
                let mut stream = resp.into_inner();
                loop {
                    let message = tokio::select! {
                        _ = hub.shutdown.cancelled() => return,
                        _ = idle.notified() => {
                            if hub.remove_if_idle(&token) {
                                return;
                            }
                            continue;
                        }
                        m = stream.message() => m,
                    };
                    match message {
                        Ok(Some(resp)) => {
                            backoff = Duration::from_millis(50);
                            if !resp.events.is_empty() {
                                // Bursts are absorbed by briefly holding the cluster stream
                                // (its flow control then slows the member down); clients
                                // still full after that are paused.
                                let full = hub.congested(&token, generation, &resp);
                                let deadline = tokio::time::Instant::now() + CONGESTION_WAIT;
                                for (tx, needed) in full {
                                    let room = tx.reserve_many(needed);
                                    let _ = tokio::time::timeout_at(deadline, room).await;
                                }
                            }
                            hub.on_response(&token, generation, resp);
                        }
                        Ok(None) => break,
                        Err(status) => {
                            if crate::upstream::failover(&status) {
                                hub.upstream.failed(idx);
                            }
                            tracing::warn!(error = %status.message(), "gRPC proxy watch stream to the cluster failed");
                            break;
                        }
                    }
                }
            }
            Err(status) => {
                if crate::upstream::failover(&status) {
                    hub.upstream.failed(idx);
                }
            }
        }
        hub.disconnect(&token, generation);
        tokio::select! {
            _ = hub.shutdown.cancelled() => return,
            _ = tokio::time::sleep(backoff) => {}
        }
        backoff = (backoff * 2).min(Duration::from_secs(1));
    }
}
