//! The proxy's side of the cluster: one lazily connected gRPC channel per `--endpoints` entry,
//! one of them current (picked at random at start), and the failover rule: a call that fails
//! with `Unavailable` (the member is gone, or has no leader) moves the proxy to another endpoint
//! and is retried there, so clients never see which member serves them (etcd's clientv3
//! balancer in the proxy's place). The channels, the current endpoint and the choice of the
//! next are `etcdrs_client`'s `EndpointSet` (`Pick::Random`); this module adds the retry of
//! unary calls and the log line of a switch.
//!
//! It also carries the per-request metadata a member needs from the proxy's client (the auth
//! `token` and the `hasleader` requirement) onto the upstream request.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use etcdrs_client::{DialOptions, EndpointSet, Pick, Target};
use hyper_util::rt::TokioIo;
use tonic::transport::Channel;
use tonic::{Code, Request, Status};

use crate::Error;

/// Metadata keys copied from a client request to the upstream request.
const FORWARDED_METADATA: &[&str] = &["token", "hasleader"];

/// How connections to members are made: a connection attempt to one member may take 2 s
/// before the next is tried; HTTP/2 PINGs every 10 s, answered within 5 s.
const DIAL: DialOptions = DialOptions {
    connect_timeout: Duration::from_secs(2),
    keepalive_time: Duration::from_secs(10),
    keepalive_timeout: Duration::from_secs(5),
};

/// The cluster as the proxy sees it. Cheap to clone.
#[derive(Clone)]
pub struct Upstream {
    inner: Arc<Inner>,
}

struct Inner {
    /// The endpoints, one current (picked at random at start).
    endpoints: EndpointSet,
    max_decoding: usize,
    /// TLS for plain HTTP requests to members (`/metrics`), offering HTTP/1.1 only.
    http_tls: Option<ClusterTls>,
}

/// How long relaying a member's `/metrics` may take.
const HTTP_TIMEOUT: Duration = Duration::from_secs(5);

/// TLS to the cluster (`--cert`, `--key`, `--cacert`, `--insecure-skip-tls-verify`).
pub type ClusterTls = etcdrs_client::tls::ClientTls;

impl Upstream {
    /// Channels to `endpoints` (`host:port`, `http://host:port` or `https://host:port`). With
    /// `tls`, every connection is TLS (as etcd's proxy, which uses one TLS config for all).
    pub fn new(
        endpoints: &[String],
        tls: Option<ClusterTls>,
        max_decoding: usize,
    ) -> Result<Upstream, Error> {
        let targets = Target::parse_list(endpoints)?
            .into_iter()
            .map(|target| (target, tls.clone()))
            .collect();
        let endpoints = EndpointSet::new(targets, &DIAL, Pick::Random)?;
        Ok(Upstream {
            inner: Arc::new(Inner {
                endpoints,
                max_decoding,
                http_tls: tls.map(|config| {
                    let mut config = (*config).clone();
                    config.alpn_protocols = vec![b"http/1.1".to_vec()];
                    Arc::new(config)
                }),
            }),
        })
    }

    /// The largest message the proxy accepts from the cluster.
    pub fn max_decoding(&self) -> usize {
        self.inner.max_decoding
    }

    /// The endpoint calls currently go to: its index and channel.
    pub fn current(&self) -> (usize, Channel) {
        self.inner.endpoints.current()
    }

    /// Reports that the endpoint at `idx` failed: if it is still the current one, another one
    /// (at random among the rest) becomes current.
    pub fn failed(&self, idx: usize) {
        self.failed_avoiding(idx, &[]);
    }

    /// [`Upstream::failed`], preferring an endpoint not in `tried` while there is one.
    fn failed_avoiding(&self, idx: usize, tried: &[usize]) {
        let endpoints = &self.inner.endpoints;
        if let Some(next) = endpoints.failed_avoiding(idx, tried) {
            tracing::warn!(
                failed = %endpoints.host_port(idx),
                next = %endpoints.host_port(next),
                "switching gRPC proxy upstream endpoint"
            );
        }
    }

    /// Number of endpoints.
    pub fn len(&self) -> usize {
        self.inner.endpoints.len()
    }

    /// Whether there is no endpoint (never: [`Upstream::new`] refuses that).
    pub fn is_empty(&self) -> bool {
        self.inner.endpoints.is_empty()
    }

    /// `GET path` over HTTP/1.1 from the current endpoint, as etcd's proxy fetches a member's
    /// `/metrics` to relay it: the status and the body.
    pub async fn http_get(&self, path: &str) -> std::io::Result<(u16, bytes::Bytes)> {
        let (idx, _) = self.current();
        let host_port = self.inner.endpoints.host_port(idx).to_owned();
        let fetch = async {
            let tcp = tokio::net::TcpStream::connect(host_port.as_str()).await?;
            let _ = tcp.set_nodelay(true);
            match &self.inner.http_tls {
                None => http1_get(tcp, &host_port, path).await,
                Some(config) => {
                    let host = host_port
                        .rsplit_once(':')
                        .map_or(host_port.as_str(), |(host, _)| host);
                    let tls = etcdrs_client::tls::handshake(config.clone(), host, tcp).await?;
                    http1_get(tls, &host_port, path).await
                }
            }
        };
        tokio::time::timeout(HTTP_TIMEOUT, fetch)
            .await
            .map_err(|_| std::io::Error::new(std::io::ErrorKind::TimedOut, "timed out"))?
    }

    /// Runs `call` on the current endpoint; when it fails with `Unavailable`, moves to an
    /// endpoint not tried yet and tries again: every endpoint at most once.
    pub async fn unary<T, F, Fut>(&self, mut call: F) -> Result<T, Status>
    where
        F: FnMut(Channel) -> Fut,
        Fut: Future<Output = Result<T, Status>>,
    {
        let mut last = None;
        let mut tried = Vec::with_capacity(self.len());
        // Bounded: each turn either tries an endpoint or moves away from a tried one.
        for _ in 0..2 * self.len() {
            if tried.len() == self.len() {
                break;
            }
            let (idx, channel) = self.current();
            if tried.contains(&idx) {
                // Another call moved the current endpoint back to one this call tried.
                self.failed_avoiding(idx, &tried);
                continue;
            }
            match call(channel).await {
                Err(status) if failover(&status) => {
                    tried.push(idx);
                    self.failed_avoiding(idx, &tried);
                    last = Some(status);
                }
                other => return other,
            }
        }
        Err(last.unwrap_or_else(|| Status::unavailable("no endpoint available")))
    }
}

/// Whether a failed call should move the proxy to another member: the connection failed, or
/// the member is unavailable (no leader, shutting down).
pub fn failover(status: &Status) -> bool {
    status.code() == Code::Unavailable
}

/// `message` as an upstream request carrying the forwarded metadata of `from`.
pub fn forward<T, M>(from: &Request<T>, message: M) -> Request<M> {
    forward_metadata(from.metadata(), message)
}

/// `message` as an upstream request carrying the forwarded entries of `metadata`.
pub fn forward_metadata<M>(metadata: &tonic::metadata::MetadataMap, message: M) -> Request<M> {
    let mut request = Request::new(message);
    for key in FORWARDED_METADATA {
        if let Some(value) = metadata.get(*key) {
            request.metadata_mut().insert(*key, value.clone());
        }
    }
    request
}

/// The auth token of a request (`token` metadata), empty without one.
pub fn token_of(metadata: &tonic::metadata::MetadataMap) -> String {
    metadata
        .get("token")
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_owned()
}

/// A request carrying `token` (when not empty) as its `token` metadata.
pub fn with_token<M>(token: &str, message: M) -> Request<M> {
    let mut request = Request::new(message);
    if !token.is_empty()
        && let Ok(value) = token.parse()
    {
        request.metadata_mut().insert("token", value);
    }
    request
}

/// One HTTP/1.1 GET on a fresh connection `io` to `host`, which closes after the answer.
async fn http1_get<IO>(io: IO, host: &str, path: &str) -> std::io::Result<(u16, bytes::Bytes)>
where
    IO: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    use http_body_util::BodyExt as _;
    let other = |e: hyper::Error| std::io::Error::other(e);
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(io))
        .await
        .map_err(other)?;
    let request = hyper::Request::get(path)
        .header(hyper::header::HOST, host)
        .header(hyper::header::CONNECTION, "close")
        .body(http_body_util::Empty::<bytes::Bytes>::new())
        .map_err(std::io::Error::other)?;
    let exchange = async {
        let response = sender.send_request(request).await.map_err(other)?;
        let status = response.status().as_u16();
        let body = response.into_body().collect().await.map_err(other)?;
        Ok((status, body.to_bytes()))
    };
    let mut exchange = std::pin::pin!(exchange);
    let mut conn = std::pin::pin!(conn);
    // The connection is driven until the answer is read; it may end first (the server closes
    // after the last byte), which leaves the answer to be read.
    tokio::select! {
        biased;
        answer = &mut exchange => return answer,
        ended = &mut conn => ended.map_err(other)?,
    }
    exchange.await
}
