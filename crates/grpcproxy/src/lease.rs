//! The Lease service (etcd `grpcproxy/lease.go`), with keep-alive coalescing done so that
//! leases keep etcd's semantics:
//!
//! - Every client keep-alive stream is multiplexed onto **one** keep-alive stream to the
//!   cluster (task `grpc-proxy lease keepalive`). A keep-alive a client sends becomes one
//!   keep-alive to the cluster (shared with any other client asking for the same lease at the
//!   same moment), and its answer goes back to every client that asked. The proxy never renews
//!   a lease on its own, so a lease expires at its TTL after the last keep-alive any client
//!   sent, not up to twice that (etcd#13031).
//! - A client that sends keep-alives and then closes its side still gets every answer it is
//!   owed; its stream ends after the last one (etcd#9751).
//! - Each client's queue of answers and of outstanding requests is bounded.

use std::collections::HashMap;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use etcdrs_proto::etcdserverpb::lease_client::LeaseClient;
use etcdrs_proto::etcdserverpb::lease_server::Lease;
use etcdrs_proto::etcdserverpb::{
    LeaseGrantRequest, LeaseGrantResponse, LeaseKeepAliveRequest, LeaseKeepAliveResponse,
    LeaseLeasesRequest, LeaseLeasesResponse, LeaseRevokeRequest, LeaseRevokeResponse,
    LeaseTimeToLiveRequest, LeaseTimeToLiveResponse,
};
use futures::Stream;
use parking_lot::Mutex;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tonic::{Request, Response, Status, Streaming};

use crate::namespace::Namespace;
use crate::upstream::{Upstream, forward};

/// Answers a client stream may have queued and not yet read.
const CLIENT_QUEUE: usize = 128;
/// Keep-alives a client may have waiting for the cluster's answer.
const CLIENT_OUTSTANDING: usize = 1024;
/// Keep-alive requests queued for the cluster stream.
const UPSTREAM_QUEUE: usize = 4096;

/// The Lease service of the proxy.
#[derive(Clone)]
pub struct LeaseProxy {
    upstream: Upstream,
    ns: Namespace,
    hub: Arc<Hub>,
    tasks: TaskTracker,
}

struct Hub {
    state: Mutex<HubState>,
    /// Lease ids to send on the cluster stream.
    to_upstream: mpsc::Sender<i64>,
}

#[derive(Default)]
struct HubState {
    clients: HashMap<u64, KeepAliveClient>,
    /// Per lease, the clients waiting for an answer (one entry per request).
    waiting: HashMap<i64, Vec<u64>>,
    next_client: u64,
}

struct KeepAliveClient {
    tx: mpsc::Sender<Result<LeaseKeepAliveResponse, Status>>,
    outstanding: usize,
    /// The client closed its sending side: end its stream after the last answer.
    send_closed: bool,
}

impl Hub {
    fn register(&self, tx: mpsc::Sender<Result<LeaseKeepAliveResponse, Status>>) -> u64 {
        let mut state = self.state.lock();
        let id = state.next_client;
        state.next_client += 1;
        state.clients.insert(
            id,
            KeepAliveClient {
                tx,
                outstanding: 0,
                send_closed: false,
            },
        );
        id
    }

    fn keep_alive(&self, client: u64, lease: i64) {
        let first = {
            let mut state = self.state.lock();
            let Some(c) = state.clients.get_mut(&client) else {
                return;
            };
            if c.outstanding >= CLIENT_OUTSTANDING {
                return;
            }
            c.outstanding += 1;
            let waiters = state.waiting.entry(lease).or_default();
            waiters.push(client);
            waiters.len() == 1
        };
        if first {
            // The queue holds at most one entry per lease being waited on (bounded by the
            // clients' outstanding limits); a full queue means the cluster stream is gone and
            // the reconnect resends every waiting lease anyway.
            let _ = self.to_upstream.try_send(lease);
        }
    }

    fn close_send(&self, client: u64) {
        let mut state = self.state.lock();
        if let Some(c) = state.clients.get_mut(&client) {
            c.send_closed = true;
            if c.outstanding == 0 {
                state.clients.remove(&client);
            }
        }
    }

    /// The client's requests broke off with `status` (a broken stream, a message refused as
    /// too large): its stream ends with it, as etcd's proxy returns its receive error.
    fn fail(&self, client: u64, status: Status) {
        let removed = self.state.lock().clients.remove(&client);
        if let Some(c) = removed {
            let _ = c.tx.try_send(Err(status));
        }
    }

    fn remove(&self, client: u64) {
        let mut state = self.state.lock();
        state.clients.remove(&client);
        // Stale waiter entries are skipped when the answer comes.
    }

    fn deliver(&self, resp: &LeaseKeepAliveResponse) {
        let mut state = self.state.lock();
        let Some(waiters) = state.waiting.remove(&resp.id) else {
            return;
        };
        for client in waiters {
            let Some(c) = state.clients.get_mut(&client) else {
                continue;
            };
            c.outstanding = c.outstanding.saturating_sub(1);
            let _ = c.tx.try_send(Ok(*resp));
            if c.send_closed && c.outstanding == 0 {
                state.clients.remove(&client);
            }
        }
    }

    fn waiting_leases(&self) -> Vec<i64> {
        self.state.lock().waiting.keys().copied().collect()
    }
}

impl LeaseProxy {
    /// The service over `upstream`; its cluster keep-alive stream runs on `tasks` until
    /// `shutdown`.
    pub fn new(
        upstream: Upstream,
        ns: Namespace,
        tasks: &TaskTracker,
        shutdown: CancellationToken,
    ) -> Self {
        let (to_upstream, from_clients) = mpsc::channel(UPSTREAM_QUEUE);
        let hub = Arc::new(Hub {
            state: Mutex::new(HubState::default()),
            to_upstream,
        });
        // Task `grpc-proxy lease keepalive`: the one keep-alive stream to the cluster.
        tasks.spawn(keep_alive_upstream(
            hub.clone(),
            upstream.clone(),
            from_clients,
            shutdown,
        ));
        LeaseProxy {
            upstream,
            ns,
            hub,
            tasks: tasks.clone(),
        }
    }

    fn client(&self, ch: tonic::transport::Channel) -> LeaseClient<tonic::transport::Channel> {
        LeaseClient::new(ch).max_decoding_message_size(self.upstream.max_decoding())
    }
}

/// The cluster keep-alive stream: sends the leases clients want renewed, hands the answers
/// to the hub, and reconnects (to the current endpoint) when the stream breaks.
async fn keep_alive_upstream(
    hub: Arc<Hub>,
    upstream: Upstream,
    mut from_clients: mpsc::Receiver<i64>,
    shutdown: CancellationToken,
) {
    let mut backoff = Duration::from_millis(50);
    'connect: loop {
        // Connect only when someone needs a keep-alive.
        let first = tokio::select! {
            _ = shutdown.cancelled() => return,
            id = from_clients.recv() => match id { Some(id) => id, None => return },
        };
        let (idx, channel) = upstream.current();
        let (req_tx, req_rx) = mpsc::channel::<LeaseKeepAliveRequest>(UPSTREAM_QUEUE);
        let mut client =
            LeaseClient::new(channel).max_decoding_message_size(upstream.max_decoding());
        let mut pending = hub.waiting_leases();
        if !pending.contains(&first) {
            pending.push(first);
        }
        for id in pending {
            let _ = req_tx.try_send(LeaseKeepAliveRequest { id });
        }
        let opened = tokio::select! {
            _ = shutdown.cancelled() => return,
            r = client.lease_keep_alive(crate::leader::require_leader(tonic::Request::new(
                tokio_stream::wrappers::ReceiverStream::new(req_rx),
            ))) => r,
        };
        let mut stream = match opened {
            Ok(r) => r.into_inner(),
            Err(status) => {
                if crate::upstream::failover(&status) {
                    upstream.failed(idx);
                }
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(Duration::from_secs(1));
                // Reconnect at once: leases are waiting.
                let _ = hub.to_upstream.try_send(first);
                continue 'connect;
            }
        };
        loop {
            tokio::select! {
                _ = shutdown.cancelled() => return,
                id = from_clients.recv() => {
                    let Some(id) = id else { return };
                    if req_tx.send(LeaseKeepAliveRequest { id }).await.is_err() {
                        break;
                    }
                }
                message = stream.message() => match message {
                    Ok(Some(resp)) => {
                        backoff = Duration::from_millis(50);
                        hub.deliver(&resp);
                    }
                    Ok(None) => break,
                    Err(status) => {
                        if crate::upstream::failover(&status) {
                            upstream.failed(idx);
                        }
                        break;
                    }
                },
            }
        }
        tokio::time::sleep(backoff).await;
        // Whatever is still waiting is resent on the next stream.
        if let Some(&id) = hub.waiting_leases().first() {
            let _ = hub.to_upstream.try_send(id);
        }
    }
}

/// A client's stream of keep-alive answers; dropping it (the client went away) forgets the
/// client.
struct ClientStream {
    rx: mpsc::Receiver<Result<LeaseKeepAliveResponse, Status>>,
    hub: Arc<Hub>,
    id: u64,
    /// Stops the task reading the client's requests.
    reader: CancellationToken,
}

impl Stream for ClientStream {
    type Item = Result<LeaseKeepAliveResponse, Status>;
    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        self.rx.poll_recv(cx)
    }
}

impl Drop for ClientStream {
    fn drop(&mut self) {
        self.reader.cancel();
        self.hub.remove(self.id);
    }
}

#[tonic::async_trait]
impl Lease for LeaseProxy {
    async fn lease_grant(
        &self,
        request: Request<LeaseGrantRequest>,
    ) -> Result<Response<LeaseGrantResponse>, Status> {
        let req = *request.get_ref();
        self.upstream
            .unary(|ch| {
                let mut client = self.client(ch);
                let req = forward(&request, req);
                async move { client.lease_grant(req).await }
            })
            .await
    }

    async fn lease_revoke(
        &self,
        request: Request<LeaseRevokeRequest>,
    ) -> Result<Response<LeaseRevokeResponse>, Status> {
        let req = *request.get_ref();
        if !self.ns.is_empty() {
            // A revoke deletes every key of the lease: through a namespace, only leases whose
            // keys all lie inside it may go (etcd's proxy lets a revoke delete keys outside).
            let ttl = LeaseTimeToLiveRequest {
                id: req.id,
                keys: true,
            };
            let attached = self
                .upstream
                .unary(|ch| {
                    let mut client = self.client(ch);
                    let ttl = forward(&request, ttl);
                    async move { client.lease_time_to_live(ttl).await }
                })
                .await?;
            let prefix = self.ns.prefix();
            if attached
                .get_ref()
                .keys
                .iter()
                .any(|k| !k.starts_with(prefix))
            {
                return Err(etcdrs_proto::rpctypes::PERMISSION_DENIED.to_status());
            }
        }
        self.upstream
            .unary(|ch| {
                let mut client = self.client(ch);
                let req = forward(&request, req);
                async move { client.lease_revoke(req).await }
            })
            .await
    }

    type LeaseKeepAliveStream =
        Pin<Box<dyn Stream<Item = Result<LeaseKeepAliveResponse, Status>> + Send>>;

    async fn lease_keep_alive(
        &self,
        request: Request<Streaming<LeaseKeepAliveRequest>>,
    ) -> Result<Response<Self::LeaseKeepAliveStream>, Status> {
        let (tx, rx) = mpsc::channel(CLIENT_QUEUE);
        let id = self.hub.register(tx);
        let reader = CancellationToken::new();
        let mut input = request.into_inner();
        let hub = self.hub.clone();
        let stop = reader.clone();
        // Task `grpc-proxy lease keepalive client`: reads one client's keep-alives.
        self.tasks.spawn(async move {
            loop {
                let message = tokio::select! {
                    _ = stop.cancelled() => return,
                    m = input.message() => m,
                };
                match message {
                    Ok(Some(req)) => hub.keep_alive(id, req.id),
                    Ok(None) => {
                        hub.close_send(id);
                        return;
                    }
                    Err(status) => {
                        hub.fail(id, etcdrs_serve::grpc_size::grpc_go_status(status));
                        return;
                    }
                }
            }
        });
        Ok(Response::new(Box::pin(ClientStream {
            rx,
            hub: self.hub.clone(),
            id,
            reader,
        })))
    }

    async fn lease_time_to_live(
        &self,
        request: Request<LeaseTimeToLiveRequest>,
    ) -> Result<Response<LeaseTimeToLiveResponse>, Status> {
        let req = *request.get_ref();
        let mut resp = self
            .upstream
            .unary(|ch| {
                let mut client = self.client(ch);
                let req = forward(&request, req);
                async move { client.lease_time_to_live(req).await }
            })
            .await?;
        let keys = std::mem::take(&mut resp.get_mut().keys);
        resp.get_mut().keys = self.ns.lease_keys(keys);
        Ok(resp)
    }

    async fn lease_leases(
        &self,
        request: Request<LeaseLeasesRequest>,
    ) -> Result<Response<LeaseLeasesResponse>, Status> {
        let req = *request.get_ref();
        self.upstream
            .unary(|ch| {
                let mut client = self.client(ch);
                let req = forward(&request, req);
                async move { client.lease_leases(req).await }
            })
            .await
    }
}
