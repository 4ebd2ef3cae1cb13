//! v3 discovery (etcd 3.6's `v3discovery`): bootstrap through a registry kept in another etcd
//! cluster's v3 keyspace, reached over gRPC.
//!
//! The registry of a token lives under `/_etcd/registry/<token>/`: `_config/size` holds the
//! expected cluster size and each member registers `members/<member id hex>` with its
//! `name=peerURL[,...]`. A member reads the size, checks the cluster is not full yet (fast
//! fail), registers, reads the members again and then watches `members/` until `size` members
//! are known. The first `size` registrations by creation revision form the cluster; anyone
//! else finds it full. Failures to reach the service are retried with etcd's back-off (2 s
//! doubling up to 256 s, without end); a missing or bad size key is not. A watch that breaks
//! after it had been up for a while (a service sends a connection away when its pings come
//! faster than its `--grpc-keepalive-min-time`) is set up again at once, as clientv3's watch
//! re-establishes itself, rather than counted as a failure.

use std::time::Duration;

use etcdrs_client::{DialOptions, EndpointSet, Pick, Target};
use etcdrs_proto::etcdserverpb::auth_client::AuthClient;
use etcdrs_proto::etcdserverpb::kv_client::KvClient;
use etcdrs_proto::etcdserverpb::watch_client::WatchClient;
use etcdrs_proto::etcdserverpb::watch_request::RequestUnion;
use etcdrs_proto::etcdserverpb::{
    AuthenticateRequest, PutRequest, RangeRequest, RangeResponse, WatchCreateRequest, WatchRequest,
    WatchResponse,
};
use etcdrs_proto::keys::prefix_end;
use tonic::metadata::AsciiMetadataValue;
use tonic::transport::Channel;
use tonic::{Code, Request, Status};

use crate::error::{Error, Result};
use crate::registry::{Registration, Registry, check_urls_map};
use crate::tls::{TlsFiles, client_config};

/// Where every token's registry lives.
pub const REGISTRY_PREFIX: &str = "/_etcd/registry";

/// Most exponent of the retry back-off (2^8 s), as etcd.
const MAX_BACKOFF_EXPONENT: u32 = 8;

/// How long a watch must have been up for its end to count as an interruption, set up again
/// at once, rather than a failure, retried after the back-off: at most one re-watch this
/// often, whatever the service does.
const WATCH_SETTLED: Duration = Duration::from_secs(1);

/// Why a watch of the registry ended before it saw every member.
enum WatchEnd {
    /// It failed, or broke before it settled: retried after the back-off.
    Failed(Status),
    /// It broke after it had been up for [`WATCH_SETTLED`]: set up again at once (the
    /// registry is read again first, as after a failure).
    Interrupted(Status),
}

/// How to reach the discovery cluster (etcd's `clientv3.ConfigSpec` from the
/// `--discovery-*` flags).
#[derive(Clone, Debug)]
pub struct Config {
    /// `--discovery-endpoints`: `host:port` or `http(s)://host:port`.
    pub endpoints: Vec<String>,
    /// `--discovery-token`.
    pub token: String,
    /// `--discovery-dial-timeout`.
    pub dial_timeout: Duration,
    /// `--discovery-request-timeout`.
    pub request_timeout: Duration,
    /// `--discovery-keepalive-time`.
    pub keepalive_time: Duration,
    /// `--discovery-keepalive-timeout`.
    pub keepalive_timeout: Duration,
    /// `--discovery-insecure-transport`: no TLS unless files or an `https` endpoint ask for it.
    pub insecure_transport: bool,
    /// TLS files and `--discovery-insecure-skip-tls-verify`.
    pub tls: TlsFiles,
    /// `--discovery-user` (`user` or `user:password`).
    pub user: String,
    /// `--discovery-password`.
    pub password: String,
}

/// The registry keys of one token.
#[derive(Clone, Debug)]
struct Keys {
    size: String,
    members: String,
    this: String,
}

impl Keys {
    fn new(token: &str, member_id: u64) -> Keys {
        let base = format!("{REGISTRY_PREFIX}/{}", token.trim_matches('/'));
        Keys {
            size: format!("{base}/_config/size"),
            members: format!("{base}/members"),
            this: format!("{base}/members/{member_id:x}"),
        }
    }
}

/// Registers this member (`id`, `entry` = `name=peerURL[,...]`) under the token and waits
/// for the cluster to be complete. Returns the `--initial-cluster` string.
pub async fn join_cluster(config: &Config, id: u64, entry: &str) -> Result<String> {
    let mut d = Discovery::new(config, id)?;
    let result = d.join(entry).await;
    match &result {
        Ok(cluster) => tracing::info!(cluster = %cluster, "discovery joined cluster successfully"),
        Err(e) => tracing::error!(error = %e, "discovery failed to join cluster"),
    }
    result
}

/// Reads the cluster of a token without registering (etcd's `GetCluster`).
pub async fn get_cluster(config: &Config) -> Result<String> {
    let mut d = Discovery::new(config, 0)?;
    d.open().await?;
    let (registry, size, rev) = match d.check_cluster().await {
        Ok(found) => found,
        Err((Error::FullCluster, Some((registry, size)))) => {
            return finish(&registry, size);
        }
        Err((e, _)) => return Err(e),
    };
    let registry = d.wait_peers(registry, size, rev).await?;
    finish(&registry, size)
}

fn finish(registry: &Registry, size: usize) -> Result<String> {
    let cluster = registry.initial_cluster(size);
    if check_urls_map(&cluster).is_none() {
        return Err(Error::InvalidPeerUrl);
    }
    Ok(cluster)
}

type CheckResult = std::result::Result<(Registry, usize, i64), (Error, Option<(Registry, usize)>)>;

struct Discovery {
    /// The endpoints, tried in the order given (the first one current at start), each
    /// dialed eagerly at start.
    endpoints: EndpointSet,
    dial_timeout: Duration,
    keys: Keys,
    request_timeout: Duration,
    user: Option<(String, String)>,
    auth_token: Option<AsciiMetadataValue>,
    retries: u32,
}

impl Discovery {
    fn new(config: &Config, id: u64) -> Result<Discovery> {
        let targets = Target::parse_list(&config.endpoints).map_err(client_error)?;
        let wants_tls = !config.insecure_transport
            || config.tls.insecure_skip_verify
            || config.tls.cert.is_some()
            || config.tls.key.is_some()
            || config.tls.cacert.is_some();
        // One configuration for every endpoint that needs TLS, read only if one does.
        let tls = if wants_tls || targets.iter().any(|target| target.secure) {
            Some(client_config(&config.tls, b"h2")?)
        } else {
            None
        };
        let targets = targets
            .into_iter()
            .map(|target| {
                let tls = tls.clone().filter(|_| wants_tls || target.secure);
                (target, tls)
            })
            .collect();
        let dial = DialOptions {
            connect_timeout: config.dial_timeout,
            keepalive_time: config.keepalive_time,
            keepalive_timeout: config.keepalive_timeout,
        };
        let endpoints = EndpointSet::new(targets, &dial, Pick::InOrder).map_err(client_error)?;
        let user = if config.user.is_empty() {
            None
        } else if config.password.is_empty()
            && let Some((user, password)) = config.user.split_once(':')
        {
            Some((user.to_owned(), password.to_owned()))
        } else {
            Some((config.user.clone(), config.password.clone()))
        };
        tracing::info!(
            discovery_token = %config.token,
            discovery_endpoints = %config.endpoints.join(","),
            "Bootstrapping cluster using v3 discovery."
        );
        Ok(Discovery {
            endpoints,
            dial_timeout: config.dial_timeout,
            keys: Keys::new(&config.token, id),
            request_timeout: config.request_timeout,
            user,
            auth_token: None,
            retries: 0,
        })
    }

    /// etcd's client creation: some endpoint must accept a connection within the dial
    /// timeout, and `--discovery-user` must log in; otherwise discovery fails at once.
    async fn open(&mut self) -> Result<()> {
        let mut connected = None;
        for idx in 0..self.endpoints.len() {
            let dial = self.endpoints.dial(idx);
            if let Ok(Ok(channel)) = tokio::time::timeout(self.dial_timeout, dial).await {
                connected = Some((idx, channel));
                break;
            }
        }
        let Some((idx, channel)) = connected else {
            return Err(Error::Service("context deadline exceeded".to_owned()));
        };
        self.endpoints.connected(idx, channel.clone());
        self.authenticate(channel.clone())
            .await
            .map_err(|status| Error::Service(status.message().to_owned()))?;
        // A TLS 1.3 server refuses a missing client certificate only after the handshake:
        // one round trip proves the connection usable, as gRPC's blocking dial does.
        let probe = self.request(RangeRequest {
            key: self.keys.size.as_bytes().to_vec(),
            count_only: true,
            ..RangeRequest::default()
        });
        match tokio::time::timeout(self.dial_timeout, KvClient::new(channel).range(probe)).await {
            Err(_) => Err(Error::Service("context deadline exceeded".to_owned())),
            Ok(Err(status)) => Err(Error::Service(status.message().to_owned())),
            Ok(Ok(_)) => Ok(()),
        }
    }

    async fn join(&mut self, entry: &str) -> Result<String> {
        self.open().await?;
        // Fast path: a full cluster is refused before registering.
        self.check_cluster().await.map_err(|(e, _)| e)?;
        self.register_self(entry).await?;
        let (registry, size, rev) = self.check_cluster().await.map_err(|(e, _)| e)?;
        let registry = self.wait_peers(registry, size, rev).await?;
        finish(&registry, size)
    }

    fn request<T>(&self, message: T) -> Request<T> {
        let mut request = Request::new(message);
        if let Some(token) = &self.auth_token {
            request.metadata_mut().insert("token", token.clone());
        }
        request
    }

    /// Logs in with `--discovery-user`, if any and not done yet.
    async fn authenticate(&mut self, channel: Channel) -> std::result::Result<(), Status> {
        let Some((name, password)) = self.user.clone() else {
            return Ok(());
        };
        if self.auth_token.is_some() {
            return Ok(());
        }
        let resp = tokio::time::timeout(
            self.request_timeout,
            AuthClient::new(channel).authenticate(AuthenticateRequest { name, password }),
        )
        .await
        .map_err(|_| Status::deadline_exceeded("context deadline exceeded"))??
        .into_inner();
        let token = AsciiMetadataValue::try_from(resp.token.as_str())
            .map_err(|_| Status::internal("authentication token is not ASCII"))?;
        self.auth_token = Some(token);
        Ok(())
    }

    /// One unary call, tried on each endpoint in turn while they are unreachable.
    async fn call<T, F, Fut>(&mut self, mut f: F) -> std::result::Result<T, Status>
    where
        F: FnMut(Channel, Option<AsciiMetadataValue>) -> Fut,
        Fut: Future<Output = std::result::Result<T, Status>>,
    {
        let mut last = Status::unavailable("no discovery endpoint answered");
        for _ in 0..self.endpoints.len() {
            let (idx, channel) = self.endpoints.current();
            let outcome = match self.authenticate(channel.clone()).await {
                Ok(()) => {
                    tokio::time::timeout(self.request_timeout, f(channel, self.auth_token.clone()))
                        .await
                        .unwrap_or_else(|_| {
                            Err(Status::deadline_exceeded("context deadline exceeded"))
                        })
                }
                Err(status) => Err(status),
            };
            match outcome {
                Ok(value) => return Ok(value),
                Err(status)
                    if matches!(status.code(), Code::Unavailable | Code::DeadlineExceeded) =>
                {
                    self.endpoints.failed(idx);
                    last = status;
                }
                Err(status) if status.message().contains("invalid auth token") => {
                    self.auth_token = None;
                    last = status;
                }
                Err(status) => return Err(status),
            }
        }
        Err(last)
    }

    async fn range(
        &mut self,
        key: &str,
        prefix: bool,
    ) -> std::result::Result<RangeResponse, Status> {
        let key = key.as_bytes().to_vec();
        let range_end = if prefix { prefix_end(&key) } else { Vec::new() };
        self.call(|channel, token| {
            let mut request = Request::new(RangeRequest {
                key: key.clone(),
                range_end: range_end.clone(),
                ..RangeRequest::default()
            });
            if let Some(token) = token {
                request.metadata_mut().insert("token", token);
            }
            async move { Ok(KvClient::new(channel).range(request).await?.into_inner()) }
        })
        .await
    }

    async fn backoff(&mut self, step: &str) {
        self.retries = self.retries.saturating_add(1);
        let wait = Duration::from_secs(1 << self.retries.min(MAX_BACKOFF_EXPONENT));
        tracing::warn!(reason = step, backoff = ?wait, "retry connecting to discovery service");
        tokio::time::sleep(wait).await;
    }

    async fn cluster_size(&mut self) -> std::result::Result<usize, Option<Status>> {
        let key = self.keys.size.clone();
        let resp = self.range(&key, false).await.map_err(|e| {
            tracing::warn!(clusterSizeKey = %key, error = %e.message(), "failed to get cluster size from discovery service");
            Some(e)
        })?;
        size_from(&resp).ok_or(None)
    }

    async fn cluster_members(&mut self) -> std::result::Result<(Registry, i64), Status> {
        let prefix = self.keys.members.clone();
        let resp = self.range(&prefix, true).await.inspect_err(|e| {
            tracing::warn!(membersKeyPrefix = %prefix, error = %e.message(), "failed to get cluster members from discovery service");
        })?;
        Ok(members_from(resp))
    }

    /// etcd's `checkCluster`: the size, the registrations and the revision they were read
    /// at; `FullCluster` (with what was read) when this member is not among the first
    /// `size`.
    async fn check_cluster(&mut self) -> CheckResult {
        loop {
            let size = match self.cluster_size().await {
                Ok(0) => return Err((Error::BadSizeKey, None)),
                Ok(size) => size,
                Err(None) => return Err((Error::SizeNotFound, None)),
                Err(Some(status)) if !transient(&status) => {
                    return Err((Error::Service(status.message().to_owned()), None));
                }
                Err(Some(_)) => {
                    self.backoff("cluster status check").await;
                    continue;
                }
            };
            let (registry, rev) = match self.cluster_members().await {
                Ok(found) => found,
                Err(status) if !transient(&status) => {
                    return Err((Error::Service(status.message().to_owned()), None));
                }
                Err(_) => {
                    self.backoff("cluster status check").await;
                    continue;
                }
            };
            self.retries = 0;
            if registry.is_full_for(&self.keys.this, size) {
                return Err((Error::FullCluster, Some((registry, size))));
            }
            return Ok((registry, size, rev));
        }
    }

    async fn register_self(&mut self, entry: &str) -> Result<()> {
        let key = self.keys.this.clone();
        loop {
            let request = PutRequest {
                key: key.as_bytes().to_vec(),
                value: entry.as_bytes().to_vec().into(),
                ..PutRequest::default()
            };
            let result = self
                .call(|channel, token| {
                    let mut request = Request::new(request.clone());
                    if let Some(token) = token {
                        request.metadata_mut().insert("token", token);
                    }
                    async move { KvClient::new(channel).put(request).await.map(|_| ()) }
                })
                .await;
            match result {
                Ok(()) => {
                    self.retries = 0;
                    tracing::info!(memberKey = %key, memberInfo = %entry, "register member itself successfully");
                    return Ok(());
                }
                Err(status) if transient(&status) => {
                    tracing::warn!(memberKey = %key, error = %status.message(), "failed to register members itself to the discovery service");
                    self.backoff("register member itself").await;
                }
                Err(status) => return Err(Error::Service(status.message().to_owned())),
            }
        }
    }

    /// Watches `members/` from `rev + 1` until `size` members are known. A broken watch is
    /// re-established after a fresh read of the members.
    async fn wait_peers(
        &mut self,
        mut registry: Registry,
        size: usize,
        mut rev: i64,
    ) -> Result<Registry> {
        while registry.len() < size {
            tracing::info!(
                clusterSize = size,
                found_peers = registry.len(),
                "waiting for peers from discovery service"
            );
            match self.watch_members(&mut registry, size, rev).await {
                Ok(()) => continue,
                Err(WatchEnd::Failed(status)) => {
                    tracing::warn!(error = %status.message(), "watching the discovery service failed");
                    self.backoff("waiting for other nodes").await;
                }
                Err(WatchEnd::Interrupted(status)) => {
                    tracing::info!(error = %status.message(), "the discovery service ended the watch; watching again");
                }
            }
            match self.check_cluster().await {
                Ok((fresh, _, fresh_rev)) => {
                    registry = fresh;
                    rev = fresh_rev;
                }
                Err((e, _)) => return Err(e),
            }
        }
        tracing::info!(
            clusterSize = size,
            found_peers = registry.len(),
            "found all needed peers from discovery service"
        );
        Ok(registry)
    }

    async fn watch_members(
        &mut self,
        registry: &mut Registry,
        size: usize,
        rev: i64,
    ) -> std::result::Result<(), WatchEnd> {
        let (idx, channel) = self.endpoints.current();
        if let Err(status) = self.authenticate(channel.clone()).await {
            self.endpoints.failed(idx);
            return Err(WatchEnd::Failed(status));
        }
        let key = self.keys.members.as_bytes().to_vec();
        let create = WatchRequest {
            request_union: Some(RequestUnion::CreateRequest(WatchCreateRequest {
                range_end: prefix_end(&key),
                key,
                start_revision: rev + 1,
                ..WatchCreateRequest::default()
            })),
        };
        let (tx, rx) = tokio::sync::mpsc::channel(1);
        tx.send(create)
            .await
            .map_err(|_| WatchEnd::Failed(Status::internal("watch request not sent")))?;
        let request = self.request(tokio_stream::wrappers::ReceiverStream::new(rx));
        let mut stream = match WatchClient::new(channel).watch(request).await {
            Ok(resp) => resp.into_inner(),
            Err(status) => {
                self.endpoints.failed(idx);
                return Err(WatchEnd::Failed(status));
            }
        };
        // When the watch counts as settled: a while after its first response.
        let mut settled_at = None;
        let broke = loop {
            match stream.message().await {
                Ok(Some(resp)) => {
                    settled_at.get_or_insert_with(|| tokio::time::Instant::now() + WATCH_SETTLED);
                    add_watched(registry, resp).map_err(WatchEnd::Failed)?;
                    if registry.len() >= size {
                        drop(tx);
                        return Ok(());
                    }
                }
                Ok(None) => break Status::unavailable("watch stream ended"),
                Err(status) => break status,
            }
        };
        match settled_at {
            Some(at) if tokio::time::Instant::now() >= at => Err(WatchEnd::Interrupted(broke)),
            _ => Err(WatchEnd::Failed(broke)),
        }
    }
}

/// The client crate's refusal of `--discovery-endpoints` in this crate's words.
fn client_error(e: etcdrs_client::Error) -> Error {
    match e {
        etcdrs_client::Error::NoEndpoints => Error::Config("no discovery endpoints".to_owned()),
        etcdrs_client::Error::BadEndpoint { endpoint, reason } => {
            Error::Config(format!("bad discovery endpoint {endpoint:?}: {reason}"))
        }
        other => Error::Config(other.to_string()),
    }
}

/// Whether a failed call is worth retrying: the service unreachable or busy. Refusals
/// (permission denied, no user, bad request) would fail again the same way, so discovery
/// stops at once (etcd retries every error here, for ever).
fn transient(status: &Status) -> bool {
    matches!(
        status.code(),
        Code::Unavailable
            | Code::DeadlineExceeded
            | Code::Cancelled
            | Code::Unknown
            | Code::Aborted
            | Code::ResourceExhausted
            | Code::Internal
    )
}

/// The cluster size a range of the `_config/size` key holds: `None` without the key, 0 when
/// its value is not a positive number (etcd's `ErrBadSizeKey`).
fn size_from(resp: &RangeResponse) -> Option<usize> {
    let kv = resp.kvs.first()?;
    match std::str::from_utf8(&kv.value)
        .ok()
        .and_then(|v| v.parse::<i64>().ok())
    {
        Some(n) if n > 0 => Some(usize::try_from(n).unwrap_or(usize::MAX)),
        _ => Some(0),
    }
}

/// The registrations a range of `members/` holds, and the revision it was read at.
fn members_from(resp: RangeResponse) -> (Registry, i64) {
    let mut registry = Registry::default();
    for kv in resp.kvs {
        add_member(&mut registry, &kv.key, &kv.value, kv.create_revision);
    }
    (registry, resp.header.map_or(0, |h| h.revision))
}

/// Adds the registrations one response of the `members/` watch carries; a canceled watch is
/// an error with its reason.
fn add_watched(registry: &mut Registry, resp: WatchResponse) -> std::result::Result<(), Status> {
    if resp.canceled {
        return Err(Status::aborted(if resp.cancel_reason.is_empty() {
            "watch canceled".to_owned()
        } else {
            resp.cancel_reason
        }));
    }
    for event in resp.events {
        if let Some(kv) = event.kv {
            add_member(registry, &kv.key, &kv.value, kv.create_revision);
        }
    }
    Ok(())
}

fn add_member(registry: &mut Registry, key: &[u8], value: &[u8], created: i64) {
    let key = String::from_utf8_lossy(key).trim().to_owned();
    let value = String::from_utf8_lossy(value).trim().to_owned();
    let registration = Registration {
        key: key.clone(),
        value: value.clone(),
        created,
    };
    match registry.add(registration) {
        Ok(()) => {
            tracing::info!(memberKey = %key, memberInfo = %value, "found peer from discovery service")
        }
        Err(warning) => tracing::warn!(memberKey = %key, memberInfo = %value, "{warning}"),
    }
}

#[cfg(test)]
mod fuzz;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn registry_keys_as_etcd() {
        let keys = Keys::new("tok", 0x8e9e05c52164694d);
        assert_eq!(keys.size, "/_etcd/registry/tok/_config/size");
        assert_eq!(keys.this, "/_etcd/registry/tok/members/8e9e05c52164694d");
        assert_eq!(prefix_end(b"/a"), b"/b".to_vec());
    }
}
