//! The client side: each client watch stream (`ClientStream`), its requests read and turned
//! into hub operations (`read_client`), and the gRPC `Watch` service that opens them.

use super::*;

/// A client's stream of watch responses. It ends with an error when the client was cut off
/// for not reading; dropping it (the client went away) cancels the client's watchers.
pub(super) struct ClientStream {
    rx: mpsc::Receiver<WatchOut>,
    kill: CancellationToken,
    killed: Pin<Box<tokio_util::sync::WaitForCancellationFutureOwned>>,
    done: bool,
    hub: Arc<Hub>,
    id: ClientId,
    /// Shared with the client's state: some of its c-watchers are paused.
    lagging: Arc<std::sync::atomic::AtomicBool>,
    /// Why the client's requests broke off (its reader sets it, then kills the stream): the
    /// status the stream ends with, as etcd's proxy ends it with its receive error.
    failed: Arc<Mutex<Option<Status>>>,
}

impl Stream for ClientStream {
    type Item = Result<WatchOut, Status>;
    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        if self.done {
            return Poll::Ready(None);
        }
        if self.killed.as_mut().poll(cx).is_ready() {
            self.done = true;
            let status = self.failed.lock().take().unwrap_or_else(|| {
                Status::resource_exhausted(
                    "etcdserver: watch stream is too slow (gRPC proxy client queue is full)",
                )
            });
            return Poll::Ready(Some(Err(status)));
        }
        let item = self.rx.poll_recv(cx).map(|r| r.map(Ok));
        if item.is_ready()
            && self.lagging.load(std::sync::atomic::Ordering::Acquire)
            && self.rx.len() < RESUME_BELOW
        {
            self.hub.resume(self.id);
        }
        item
    }
}

impl Drop for ClientStream {
    fn drop(&mut self) {
        self.kill.cancel();
        self.hub.remove_client(self.id);
    }
}

impl WatchProxy {
    /// The service over `upstream`; its cluster streams run on `tasks` until `shutdown`.
    pub fn new(
        upstream: Upstream,
        ns: Namespace,
        metrics: Metrics,
        tasks: &TaskTracker,
        shutdown: CancellationToken,
    ) -> Self {
        WatchProxy {
            hub: Arc::new(Hub {
                upstream,
                ns,
                metrics,
                shutdown,
                tasks: tasks.clone(),
                state: Mutex::new(State::default()),
            }),
        }
    }
}

/// Task `grpc-proxy watch client`: reads one client's requests, in order (a create is
/// answered before the next request is read, so created responses come in request order).
pub(super) async fn read_client(
    hub: Arc<Hub>,
    id: ClientId,
    mut input: Streaming<WatchRequest>,
    kill: CancellationToken,
    failed: Arc<Mutex<Option<Status>>>,
) {
    loop {
        let message = tokio::select! {
            _ = kill.cancelled() => return,
            _ = hub.shutdown.cancelled() => return,
            m = input.message() => m,
        };
        let request = match message {
            Ok(Some(request)) => request,
            // A client that closes its side keeps receiving, as from a member.
            Ok(None) => return,
            // A broken stream or a refused message (too large): the client's stream ends
            // with that status.
            Err(status) => {
                *failed.lock() = Some(etcdrs_serve::grpc_size::grpc_go_status(status));
                kill.cancel();
                return;
            }
        };
        // A request is handled only once its answer has room in the client's queue: a client
        // that sends and does not read is slowed down, not cut off (as a member stops reading
        // from a client that does not read).
        let tx = hub.state.lock().clients.get(&id).map(|c| c.tx.clone());
        if let Some(tx) = tx {
            tokio::select! {
                _ = kill.cancelled() => return,
                _ = hub.shutdown.cancelled() => return,
                _ = tx.reserve_many(CONTROL_RESERVE + 1) => {}
            }
        }
        match request.request_union {
            Some(watch_request::RequestUnion::CreateRequest(create)) => {
                if let Some(wait) = hub.create(id, create) {
                    tokio::select! {
                        _ = kill.cancelled() => return,
                        _ = hub.shutdown.cancelled() => return,
                        _ = wait => {}
                    }
                }
            }
            Some(watch_request::RequestUnion::CancelRequest(cancel)) => {
                hub.cancel(id, cancel.watch_id)
            }
            Some(watch_request::RequestUnion::ProgressRequest(_)) if !hub.progress(id) => {
                // Nothing of this client's is watched on the cluster: the current
                // revision is the answer.
                let header = current_header(&hub, id).await;
                let tx = hub.state.lock().clients.get(&id).map(|c| c.tx.clone());
                if let (Some(tx), Some(header)) = (tx, header) {
                    let _ = tx.try_send(WatchOut {
                        header: Some(header),
                        watch_id: -1,
                        ..Default::default()
                    });
                }
            }
            Some(watch_request::RequestUnion::ProgressRequest(_)) => {}
            None => {}
        }
    }
}

/// The cluster's current header, read for `client`'s identity.
pub(super) async fn current_header(hub: &Hub, client: ClientId) -> Option<ResponseHeader> {
    let token = hub.state.lock().clients.get(&client)?.token.clone();
    let req = etcdrs_proto::etcdserverpb::RangeRequest {
        key: vec![0],
        count_only: true,
        ..Default::default()
    };
    hub.upstream
        .unary(|ch| {
            let mut kv = etcdrs_proto::etcdserverpb::kv_client::KvClient::new(ch);
            let req = with_token(&token, req.clone());
            async move { kv.range(req).await }
        })
        .await
        .ok()
        .and_then(|r| r.into_inner().header)
}

#[tonic::async_trait]
impl Watch for WatchProxy {
    type WatchStream = Pin<Box<dyn Stream<Item = Result<WatchOut, Status>> + Send>>;

    async fn watch(
        &self,
        request: Request<Streaming<WatchRequest>>,
    ) -> Result<Response<Self::WatchStream>, Status> {
        let token = token_of(request.metadata());
        let exact = request
            .metadata()
            .get(EXACT_METADATA)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|v| v.eq_ignore_ascii_case("true"));
        let (tx, rx) = mpsc::channel(CLIENT_QUEUE);
        let kill = CancellationToken::new();
        let lagging = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let id = {
            let mut state = self.hub.state.lock();
            let id = state.next_client;
            state.next_client += 1;
            state.clients.insert(
                id,
                ClientState {
                    tx,
                    token,
                    exact,
                    kill: kill.clone(),
                    watchers: HashMap::new(),
                    next_watch_id: 0,
                    paused: Vec::new(),
                    lagging: lagging.clone(),
                },
            );
            id
        };
        let input = request.into_inner();
        let failed = Arc::new(Mutex::new(None));
        self.hub.tasks.spawn(read_client(
            self.hub.clone(),
            id,
            input,
            kill.clone(),
            failed.clone(),
        ));
        Ok(Response::new(Box::pin(ClientStream {
            rx,
            killed: Box::pin(kill.clone().cancelled_owned()),
            kill,
            done: false,
            hub: self.hub.clone(),
            id,
            lagging,
            failed,
        })))
    }
}
