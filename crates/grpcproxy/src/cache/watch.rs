//! How the cache learns of changes: the keyspace watch (task `grpc-proxy cache watch`,
//! [`RangeCache::run_invalidation`]) and, where auth refuses it, one watch stream per client
//! identity on which each entry is watched with its client's token (task `grpc-proxy cache
//! identity watch`). Entries are confirmed when their watch stands and dropped at its first
//! event or its end; the entries themselves and their bounds live in the parent module.

use super::*;

/// Entries an identity's watch task may have queued for it (creates and cancels); a store that
/// finds the queue full is not made.
pub(super) const IDENTITY_QUEUE: usize = 64;

/// An identity's watch task, as the cache sees it.
pub(super) struct Identity {
    /// Requests to the task.
    pub(super) tx: mpsc::Sender<Command>,
    /// Tells this task from a later one of the same token.
    pub(super) id: u64,
    /// Entries watched by the task; the task ends when there are none.
    pub(super) entries: usize,
}

/// A request to an identity's watch task.
#[derive(Debug)]
pub(super) enum Command {
    /// Watch `[key, end)` from revision `from` for the entry under cache key `entry`.
    Watch {
        entry: Vec<u8>,
        key: Vec<u8>,
        end: Vec<u8>,
        from: i64,
    },
    /// The entry is gone: cancel its watch.
    Cancel(i64),
}

/// What identity watch tasks need: set once the invalidation task runs.
#[derive(Clone)]
pub(super) struct WatchContext {
    pub(super) upstream: Upstream,
    pub(super) tasks: TaskTracker,
    pub(super) shutdown: CancellationToken,
}

/// Whether a watch was refused for want of an identity or a permission (the proxy's own
/// keyspace watch under auth; an identity's watch whose token expired).
pub(super) fn refused_for_auth(reason: &str) -> bool {
    [
        &rpctypes::USER_EMPTY,
        &rpctypes::PERMISSION_DENIED,
        &rpctypes::INVALID_AUTH_TOKEN,
        &rpctypes::AUTH_OLD_REVISION,
    ]
    .iter()
    .any(|e| reason.contains(e.message))
}

/// An identity watch task's own books.
#[derive(Default)]
pub(super) struct IdentityWatches {
    /// Entries whose watch is requested, in order: a member answers creates in order.
    pending: std::collections::VecDeque<Vec<u8>>,
    /// Entries by established watch.
    watched: HashMap<i64, Vec<u8>>,
}

impl IdentityWatches {
    /// Sends `command` on the stream; false when the stream's queue is full or closed.
    pub(super) fn forward(
        &mut self,
        command: Command,
        req_tx: &mpsc::Sender<WatchRequest>,
    ) -> bool {
        let union = match command {
            Command::Watch {
                entry,
                key,
                end,
                from,
            } => {
                self.pending.push_back(entry);
                watch_request::RequestUnion::CreateRequest(WatchCreateRequest {
                    key,
                    range_end: end,
                    start_revision: from,
                    ..Default::default()
                })
            }
            Command::Cancel(watch_id) => {
                self.watched.remove(&watch_id);
                watch_request::RequestUnion::CancelRequest(WatchCancelRequest { watch_id })
            }
        };
        req_tx
            .try_send(WatchRequest {
                request_union: Some(union),
            })
            .is_ok()
    }

    /// Applies one response of the stream to `cache`; false when the stream must end.
    pub(super) fn answer(
        &mut self,
        cache: &RangeCache,
        identity: u64,
        resp: WatchResponse,
        req_tx: &mpsc::Sender<WatchRequest>,
    ) -> bool {
        if resp.created {
            let Some(entry) = self.pending.pop_front() else {
                return false;
            };
            if resp.canceled {
                // Refused (the token expired, or no permission): the entry goes.
                cache.drop_watched(&entry, identity);
            } else if cache.confirm(&entry, identity, resp.watch_id) {
                self.watched.insert(resp.watch_id, entry);
            } else {
                // Gone while its watch was being made.
                return self.forward(Command::Cancel(resp.watch_id), req_tx);
            }
            return true;
        }
        let entry = self.watched.remove(&resp.watch_id);
        if resp.canceled {
            if let Some(entry) = entry {
                cache.drop_watched(&entry, identity);
            }
            return true;
        }
        // A change (or a progress report, which carries no events): any change ends the entry
        // and its watch.
        if resp.events.is_empty() && resp.compact_revision == 0 {
            if let Some(entry) = entry {
                self.watched.insert(resp.watch_id, entry);
            }
            return true;
        }
        if let Some(entry) = entry {
            cache.drop_watched(&entry, identity);
        }
        self.forward(Command::Cancel(resp.watch_id), req_tx)
    }
}

impl RangeCache {
    /// The watch of the entry under `key` (watched by identity task `identity`) is established
    /// as `watch_id`: the entry may be served. False when the entry is gone (the caller then
    /// cancels the watch).
    pub(super) fn confirm(&self, key: &[u8], identity: u64, watch_id: i64) -> bool {
        let mut state = self.inner.lock();
        match state.entries.get_mut(key) {
            Some(e) if e.identity == identity && e.watch_id.is_none() => {
                e.watch_id = Some(watch_id);
                true
            }
            _ => false,
        }
    }

    /// Drops the entry under `key` if identity task `identity` watches it (its watch saw a
    /// change or ended).
    pub(super) fn drop_watched(&self, key: &[u8], identity: u64) {
        let mut state = self.inner.lock();
        match state.entries.get_mut(key) {
            // Its watch is already gone: nothing to cancel.
            Some(e) if e.identity == identity => e.watch_id = None,
            _ => return,
        }
        state.remove(key);
        self.metrics.set_cache_keys(state.entries.len());
    }

    /// Identity task `identity` of `token` ended: every entry it watched goes.
    pub(super) fn identity_ended(&self, token: &str, identity: u64) {
        let mut state = self.inner.lock();
        state.remove_where(|e| e.identity == identity);
        if state
            .identities
            .get(token)
            .is_some_and(|i| i.id == identity)
        {
            state.identities.remove(token);
        }
        self.metrics.set_cache_keys(state.entries.len());
    }

    /// Task `grpc-proxy cache identity watch`: one watch stream with `token`, on which each
    /// entry the cache hands over is watched; ends when the cache forgets the identity (no
    /// entry left) or the stream ends, dropping every entry it watched.
    pub(super) async fn identity_watch(
        self,
        token: String,
        identity: u64,
        mut commands: mpsc::Receiver<Command>,
        context: WatchContext,
    ) {
        let upstream = &context.upstream;
        let (idx, channel) = upstream.current();
        // As bounded as the command queue it drains: a full one ends the task.
        let (req_tx, req_rx) = mpsc::channel::<WatchRequest>(IDENTITY_QUEUE);
        let request = crate::leader::require_leader(crate::upstream::with_token(
            &token,
            tokio_stream::wrappers::ReceiverStream::new(req_rx),
        ));
        let mut client =
            WatchClient::new(channel).max_decoding_message_size(upstream.max_decoding());
        let mut watches = IdentityWatches::default();
        // Requests made before the stream opens wait in `req_tx`'s queue.
        let mut ok = true;
        while let Ok(command) = commands.try_recv() {
            ok &= watches.forward(command, &req_tx);
        }
        if !ok {
            commands.close();
            self.identity_ended(&token, identity);
            return;
        }
        let opened = tokio::select! {
            _ = context.shutdown.cancelled() => return,
            r = client.watch(request) => r,
        };
        let mut stream = match opened {
            Ok(resp) => resp.into_inner(),
            Err(status) => {
                if crate::upstream::failover(&status) {
                    upstream.failed(idx);
                }
                commands.close();
                self.identity_ended(&token, identity);
                return;
            }
        };
        loop {
            tokio::select! {
                _ = context.shutdown.cancelled() => return,
                command = commands.recv() => {
                    let Some(command) = command else { break };
                    if !watches.forward(command, &req_tx) {
                        break;
                    }
                }
                message = stream.message() => {
                    let Ok(Some(resp)) = message else { break };
                    if !watches.answer(&self, identity, resp, &req_tx) {
                        break;
                    }
                }
            }
        }
        // Closed first: a store made from now on sees the task gone and starts another.
        commands.close();
        self.identity_ended(&token, identity);
    }

    /// The invalidating watch (task `grpc-proxy cache watch`): runs until `shutdown`, reconnecting
    /// to whichever member is current; the cache is enabled only while the watch stands.
    pub async fn run_invalidation(
        self,
        upstream: Upstream,
        ns: Namespace,
        tasks: TaskTracker,
        shutdown: CancellationToken,
    ) {
        self.inner.lock().context = Some(WatchContext {
            upstream: upstream.clone(),
            tasks,
            shutdown: shutdown.clone(),
        });
        let (key, end) = ns.range(&[0], &[0]);
        let mut backoff = Duration::from_millis(100);
        loop {
            self.keyspace_lost();
            let (idx, channel) = upstream.current();
            let (req_tx, req_rx) = tokio::sync::mpsc::channel::<WatchRequest>(1);
            let create = WatchRequest {
                request_union: Some(watch_request::RequestUnion::CreateRequest(
                    WatchCreateRequest {
                        key: key.clone(),
                        range_end: end.clone(),
                        ..Default::default()
                    },
                )),
            };
            let _ = req_tx.try_send(create);
            let mut client =
                WatchClient::new(channel).max_decoding_message_size(upstream.max_decoding());
            let opened = tokio::select! {
                _ = shutdown.cancelled() => return,
                // With a leader: a member cut off from its cluster ends the watch, so the cache
                // does not keep serving what that member last saw.
                r = client.watch(crate::leader::require_leader(tonic::Request::new(
                    tokio_stream::wrappers::ReceiverStream::new(req_rx),
                ))) => r,
            };
            let mut stream = match opened {
                Ok(resp) => resp.into_inner(),
                Err(status) => {
                    if crate::upstream::failover(&status) {
                        upstream.failed(idx);
                    }
                    if refused_for_auth(status.message()) {
                        self.per_entry();
                    }
                    tokio::select! {
                        _ = shutdown.cancelled() => return,
                        _ = tokio::time::sleep(backoff) => {}
                    }
                    backoff = (backoff * 2).min(Duration::from_secs(5));
                    continue;
                }
            };
            loop {
                let message = tokio::select! {
                    _ = shutdown.cancelled() => return,
                    m = stream.message() => m,
                };
                match message {
                    Ok(Some(resp)) => {
                        let revision = resp.header.as_ref().map_or(0, |h| h.revision);
                        if resp.canceled {
                            // Refused for auth: entries are watched one by one (and the
                            // keyspace watch is tried again now and then, in case an identity
                            // appears). Else a compaction: start over.
                            if refused_for_auth(&resp.cancel_reason) {
                                self.per_entry();
                            }
                            break;
                        }
                        if resp.created {
                            backoff = Duration::from_millis(100);
                            self.reset(Mode::Keyspace, revision);
                            continue;
                        }
                        let keys = resp
                            .events
                            .iter()
                            .filter_map(|e| e.kv.as_ref().map(|kv| kv.key.as_slice()));
                        self.invalidate(keys, revision);
                    }
                    Ok(None) => break,
                    Err(status) => {
                        if crate::upstream::failover(&status) {
                            upstream.failed(idx);
                        }
                        break;
                    }
                }
            }
            drop(req_tx);
            self.keyspace_lost();
            tokio::select! {
                _ = shutdown.cancelled() => return,
                _ = tokio::time::sleep(backoff) => {}
            }
            backoff = (backoff * 2).min(Duration::from_secs(5));
        }
    }
}
