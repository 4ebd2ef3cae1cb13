//! v2 discovery (etcd's `v2discovery`, deprecated in etcd 3.6): bootstrap through a registry
//! in a v2 keys API, over HTTP, named by the `--discovery` URL
//! (`http://host/v2/keys/<dir>/<token>` or a discovery.etcd.io-style token URL).
//!
//! The member reads `<url>/_config/size`, reads the registry directory (fast fail when the
//! cluster is full), creates `<url>/<member id hex>` with `prevExist=false` (a member id
//! registered before is refused: the token was used), waits until its own key is visible,
//! reads the registry again and long-polls it (`?wait=true&recursive=true&waitIndex=N`) until
//! `size` members are known. The first `size` registrations by `createdIndex` form the
//! cluster. Reaching the service goes through `--discovery-proxy` when set (plain HTTP
//! proxies: absolute-form requests for `http`, `CONNECT` for `https`). Unreachable services
//! are retried with etcd's back-off.

use std::sync::Arc;
use std::time::Duration;

use etcdrs_client::tls::handshake;
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Bytes;
use hyper_util::rt::TokioIo;
use serde::Deserialize;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpStream;

use crate::error::{Error, Result};
use crate::registry::{Registration, Registry, check_urls_map};
use crate::tls::{TlsFiles, client_config};

/// How long a plain request may take (the v2 client's `DefaultRequestTimeout`).
const REQUEST_TIMEOUT: Duration = Duration::from_secs(5);
/// How long connecting may take (etcd's discovery transport dial timeout).
const DIAL_TIMEOUT: Duration = Duration::from_secs(30);
/// Largest response body read.
const MAX_BODY: usize = 4 << 20;
/// Most exponent of the retry back-off (2^8 s), as etcd.
const MAX_BACKOFF_EXPONENT: u32 = 8;
/// v2 error code: key not found.
const KEY_NOT_FOUND: u64 = 100;
/// v2 error code: key already exists.
const NODE_EXIST: u64 = 105;

/// The v2 discovery settings.
#[derive(Clone, Debug)]
pub struct Config {
    /// `--discovery`.
    pub url: String,
    /// `--discovery-proxy` / `ETCD_DISCOVERY_PROXY` ("" for none).
    pub proxy: String,
}

/// A node of the v2 keys API's JSON.
#[derive(Clone, Debug, Default, Deserialize)]
pub struct Node {
    /// Key.
    #[serde(default)]
    pub key: String,
    /// Value (files).
    #[serde(default)]
    pub value: String,
    /// Whether it is a directory.
    #[serde(default)]
    pub dir: bool,
    /// Children (directories).
    #[serde(default)]
    pub nodes: Vec<Node>,
    /// Index that created it.
    #[serde(default, rename = "createdIndex")]
    pub created_index: u64,
    /// Index of its last change.
    #[serde(default, rename = "modifiedIndex")]
    pub modified_index: u64,
}

#[derive(Debug, Default, Deserialize)]
struct KeysResponse {
    #[serde(default)]
    node: Option<Node>,
}

#[derive(Debug, Deserialize)]
struct KeysError {
    #[serde(rename = "errorCode")]
    error_code: u64,
    #[serde(default)]
    message: String,
}

/// What one request brought back.
enum Reply {
    /// 2xx with a node, and `X-Etcd-Index`.
    Node(Node, u64),
    /// A v2 error body.
    KeysError(u64, String),
}

/// Why a request did not produce a [`Reply`].
enum Failure {
    /// The service could not be reached (retried).
    Unreachable(String),
    /// It answered something that is not the v2 keys API.
    BadEndpoint,
}

/// Registers this member and waits for the cluster; returns the `--initial-cluster` string.
pub async fn join_cluster(config: &Config, id: u64, entry: &str) -> Result<String> {
    let mut d = Discovery::new(config, id)?;
    // Fast path: a full cluster is refused before registering.
    d.check_cluster().await.map_err(|(e, _)| e)?;
    d.create_self(entry).await?;
    let (registry, size, index) = d.check_cluster().await.map_err(|(e, _)| e)?;
    let registry = d.wait_nodes(registry, size, index).await?;
    nodes_to_cluster(&registry, size)
}

/// What a response says, from its status, `X-Etcd-Index` and body (untrusted: the discovery
/// service's).
fn reply(
    status: hyper::StatusCode,
    index: u64,
    body: &[u8],
) -> std::result::Result<Reply, Failure> {
    if status.is_success() {
        let parsed: KeysResponse =
            serde_json::from_slice(body).map_err(|_| Failure::BadEndpoint)?;
        return Ok(Reply::Node(parsed.node.unwrap_or_default(), index));
    }
    match serde_json::from_slice::<KeysError>(body) {
        Ok(e) => Ok(Reply::KeysError(e.error_code, e.message)),
        // etcd's client treats a non-v2 answer from the only endpoint as unreachable.
        Err(_) => Err(Failure::Unreachable(format!(
            "unexpected response {status}"
        ))),
    }
}

/// The registrations in the token's directory, `_config` left out.
fn registry_of(dir: Node) -> Registry {
    let mut registry = Registry::default();
    for node in dir.nodes {
        if base(&node.key) == "_config" {
            continue;
        }
        // A malformed value still takes its place, as in etcd; the cluster string check
        // reports it.
        let _ = registry.add(Registration {
            key: base(&node.key).to_owned(),
            value: node.value,
            created: i64::try_from(node.created_index).unwrap_or(i64::MAX),
        });
    }
    registry
}

fn nodes_to_cluster(registry: &Registry, size: usize) -> Result<String> {
    let cluster = registry.initial_cluster(size);
    match check_urls_map(&cluster) {
        None => Err(Error::InvalidUrl),
        Some(names) if names != size => Err(Error::DuplicateName),
        Some(_) => Ok(cluster),
    }
}

type CheckResult = std::result::Result<(Registry, usize, u64), (Error, Option<Registry>)>;

struct Discovery {
    /// `scheme://host:port` of the service.
    https: bool,
    host: String,
    port: u16,
    /// The token's path (`/v2/keys/discovery/<token>`).
    cluster: String,
    self_key: String,
    /// `host:port` of the HTTP proxy.
    proxy: Option<String>,
    tls: Option<Arc<rustls::ClientConfig>>,
    retries: u32,
}

impl Discovery {
    fn new(config: &Config, id: u64) -> Result<Discovery> {
        let url = url::Url::parse(&config.url)
            .map_err(|e| Error::Config(format!("parse {:?}: {e}", config.url)))?;
        let https = match url.scheme() {
            "http" => false,
            "https" => true,
            other => {
                return Err(Error::Config(format!(
                    "unsupported protocol scheme {other:?}"
                )));
            }
        };
        let host = url
            .host_str()
            .ok_or_else(|| Error::Config(format!("no host in discovery URL {:?}", config.url)))?
            .to_owned();
        let port = url
            .port_or_known_default()
            .unwrap_or(if https { 443 } else { 80 });
        let cluster = url.path().trim_end_matches('/').to_owned();
        let proxy = proxy_host_port(&config.proxy)?;
        if let Some(proxy) = &proxy {
            tracing::info!(proxy_url = %format!("http://{proxy}"), "running proxy with discovery");
        }
        let tls = https
            .then(|| client_config(&TlsFiles::default(), b"http/1.1"))
            .transpose()?;
        Ok(Discovery {
            https,
            host,
            port,
            self_key: format!("{cluster}/{id:x}"),
            cluster,
            proxy,
            tls,
            retries: 0,
        })
    }

    fn base_url(&self) -> String {
        let scheme = if self.https { "https" } else { "http" };
        format!("{scheme}://{}:{}", self.host, self.port)
    }

    async fn backoff(&mut self, step: &str) {
        self.retries = self.retries.saturating_add(1);
        let wait = Duration::from_secs(1 << self.retries.min(MAX_BACKOFF_EXPONENT));
        tracing::info!(url = %self.base_url(), reason = step, backoff = ?wait, "retry connecting to discovery service");
        tokio::time::sleep(wait).await;
    }

    /// Opens a connection to the service (through the proxy if any).
    async fn connect(&self) -> std::io::Result<Box<dyn Io>> {
        let target = format!("{}:{}", self.host, self.port);
        let dial = match &self.proxy {
            Some(proxy) => proxy.clone(),
            None => target.clone(),
        };
        let tcp = tokio::time::timeout(DIAL_TIMEOUT, TcpStream::connect(dial.as_str()))
            .await
            .map_err(|_| std::io::Error::new(std::io::ErrorKind::TimedOut, "dial timeout"))??;
        let _ = tcp.set_nodelay(true);
        match (&self.tls, &self.proxy) {
            (None, _) => Ok(Box::new(tcp)),
            (Some(tls), None) => Ok(Box::new(handshake(tls.clone(), &self.host, tcp).await?)),
            (Some(tls), Some(_)) => {
                let tcp = connect_tunnel(tcp, &target).await?;
                Ok(Box::new(handshake(tls.clone(), &self.host, tcp).await?))
            }
        }
    }

    /// One request; `path_and_query` starts with `/`.
    async fn request(
        &self,
        method: hyper::Method,
        path_and_query: &str,
        form: Option<String>,
    ) -> std::result::Result<Reply, Failure> {
        let unreachable = |e: &dyn std::fmt::Display| Failure::Unreachable(e.to_string());
        let io = self.connect().await.map_err(|e| unreachable(&e))?;
        let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(io))
            .await
            .map_err(|e| unreachable(&e))?;
        // The connection task ends with the request (one request per connection).
        let conn = tokio::spawn(async move {
            let _ = conn.await;
        });
        let uri = if self.proxy.is_some() && !self.https {
            format!("{}{path_and_query}", self.base_url())
        } else {
            path_and_query.to_owned()
        };
        let mut builder = hyper::Request::builder()
            .method(method)
            .uri(uri)
            .header(hyper::header::HOST, format!("{}:{}", self.host, self.port));
        if form.is_some() {
            builder = builder.header(
                hyper::header::CONTENT_TYPE,
                "application/x-www-form-urlencoded",
            );
        }
        let request = builder
            .body(Full::new(Bytes::from(form.unwrap_or_default())))
            .map_err(|e| unreachable(&e))?;
        let response = sender
            .send_request(request)
            .await
            .map_err(|e| unreachable(&e))?;
        let status = response.status();
        let index = response
            .headers()
            .get("X-Etcd-Index")
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse::<u64>().ok())
            .unwrap_or(0);
        let body = Limited::new(response.into_body(), MAX_BODY)
            .collect()
            .await
            .map_err(|e| unreachable(&e))?
            .to_bytes();
        conn.abort();
        reply(status, index, &body)
    }

    async fn get(
        &self,
        path: &str,
        timeout: Option<Duration>,
    ) -> std::result::Result<Reply, Failure> {
        let query = format!("{path}?quorum=false&recursive=false&sorted=false");
        let call = self.request(hyper::Method::GET, &query, None);
        match timeout {
            Some(t) => tokio::time::timeout(t, call).await.unwrap_or_else(|_| {
                Err(Failure::Unreachable("context deadline exceeded".to_owned()))
            }),
            None => call.await,
        }
    }

    /// etcd's `checkCluster`: size, registrations (in creation order) and the index they
    /// were read at; `FullCluster` with the first `size` when this member is not among them.
    async fn check_cluster(&mut self) -> CheckResult {
        loop {
            let size_path = format!("{}/_config/size", self.cluster);
            let size = match self.get(&size_path, Some(REQUEST_TIMEOUT)).await {
                Ok(Reply::Node(node, _)) => match node.value.parse::<u64>() {
                    Ok(size) => usize::try_from(size).unwrap_or(usize::MAX),
                    Err(_) => return Err((Error::BadSizeKey, None)),
                },
                Ok(Reply::KeysError(KEY_NOT_FOUND, _)) => return Err((Error::SizeNotFound, None)),
                Ok(Reply::KeysError(_, message)) => return Err((Error::Service(message), None)),
                Err(Failure::BadEndpoint) => return Err((Error::BadDiscoveryEndpoint, None)),
                Err(Failure::Unreachable(reason)) => {
                    tracing::warn!(discovery_url = %self.base_url(), path = %size_path, error = %reason, "failed to get from discovery server");
                    self.backoff("cluster status check").await;
                    continue;
                }
            };
            let cluster = self.cluster.clone();
            let (dir, index) = match self.get(&cluster, Some(REQUEST_TIMEOUT)).await {
                Ok(Reply::Node(node, index)) => (node, index),
                Ok(Reply::KeysError(_, message)) => return Err((Error::Service(message), None)),
                Err(Failure::BadEndpoint) => return Err((Error::BadDiscoveryEndpoint, None)),
                Err(Failure::Unreachable(reason)) => {
                    tracing::warn!(discovery_url = %self.base_url(), path = %cluster, error = %reason, "failed to get from discovery server");
                    self.backoff("cluster status check").await;
                    continue;
                }
            };
            self.retries = 0;
            let registry = registry_of(dir);
            if size == 0 || registry.is_full_for(base(&self.self_key), size) {
                let mut first = Registry::default();
                for m in registry.members().iter().take(size) {
                    let _ = first.add(m.clone());
                }
                return Err((Error::FullCluster, Some(first)));
            }
            return Ok((registry, size, index));
        }
    }

    async fn create_self(&mut self, entry: &str) -> Result<()> {
        let path = format!("{}?prevExist=false", self.self_key);
        let form = format!("value={}", form_escape(entry));
        let call = self.request(hyper::Method::PUT, &path, Some(form));
        let created = match tokio::time::timeout(REQUEST_TIMEOUT, call).await {
            Ok(Ok(Reply::Node(node, _))) => node.created_index,
            Ok(Ok(Reply::KeysError(NODE_EXIST, _))) => return Err(Error::DuplicateId),
            Ok(Ok(Reply::KeysError(_, message))) => return Err(Error::Service(message)),
            Ok(Err(Failure::BadEndpoint)) => return Err(Error::BadDiscoveryEndpoint),
            Ok(Err(Failure::Unreachable(reason))) => return Err(Error::Service(reason)),
            Err(_) => return Err(Error::Service("context deadline exceeded".to_owned())),
        };
        // Make sure the registration is visible on the server we talk to.
        let wait = format!("{}?wait=true&waitIndex={created}", self.self_key);
        match self.request(hyper::Method::GET, &wait, None).await {
            Ok(_) => Ok(()),
            Err(Failure::BadEndpoint) => Err(Error::BadDiscoveryEndpoint),
            Err(Failure::Unreachable(reason)) => Err(Error::Service(reason)),
        }
    }

    /// Long-polls the registry from `index + 1` until `size` members are known.
    async fn wait_nodes(
        &mut self,
        mut registry: Registry,
        size: usize,
        mut index: u64,
    ) -> Result<Registry> {
        loop {
            for m in registry.members().iter().take(size) {
                if m.key == base(&self.self_key) {
                    tracing::info!(discovery_url = %self.base_url(), "self" = %m.key, "found self from discovery server");
                } else {
                    tracing::info!(discovery_url = %self.base_url(), peer = %m.key, "found peer from discovery server");
                }
            }
            let mut failed = false;
            while registry.len() < size {
                tracing::info!(discovery_url = %self.base_url(), found_peers = registry.len(), needed_peers = size - registry.len(), "found peers from discovery server; waiting for more");
                let wait = format!(
                    "{}?recursive=true&wait=true&waitIndex={}",
                    self.cluster,
                    index + 1
                );
                match self.request(hyper::Method::GET, &wait, None).await {
                    Ok(Reply::Node(node, _)) => {
                        index = index.max(node.modified_index);
                        let key = node
                            .key
                            .strip_prefix(self.cluster.trim_start_matches("/v2/keys"))
                            .unwrap_or(&node.key);
                        if key.trim_start_matches('/').starts_with("_config")
                            || node.value.is_empty()
                        {
                            continue;
                        }
                        tracing::info!(discovery_url = %self.base_url(), peer = %base(&node.key), "found peer from discovery server");
                        let _ = registry.add(Registration {
                            key: base(&node.key).to_owned(),
                            value: node.value,
                            created: i64::try_from(node.created_index).unwrap_or(i64::MAX),
                        });
                    }
                    Ok(Reply::KeysError(_, message)) => return Err(Error::Service(message)),
                    Err(Failure::BadEndpoint) => return Err(Error::BadDiscoveryEndpoint),
                    Err(Failure::Unreachable(reason)) => {
                        tracing::warn!(discovery_url = %self.base_url(), error = %reason, "watching the discovery server failed");
                        failed = true;
                        break;
                    }
                }
            }
            if !failed {
                tracing::info!(discovery_url = %self.base_url(), found_peers = registry.len(), "found all needed peers from discovery server");
                return Ok(registry);
            }
            self.backoff("waiting for other nodes").await;
            let (fresh, _, fresh_index) = self.check_cluster().await.map_err(|(e, _)| e)?;
            registry = fresh;
            index = fresh_index;
        }
    }
}

/// The last element of a key path.
fn base(key: &str) -> &str {
    key.trim_end_matches('/').rsplit('/').next().unwrap_or(key)
}

/// `application/x-www-form-urlencoded` escaping of a value.
fn form_escape(value: &str) -> String {
    url::form_urlencoded::byte_serialize(value.as_bytes()).collect()
}

/// etcd's `newProxyFunc`: the proxy as `host:port`; a value without an `http` scheme is
/// read as `http://<value>`.
fn proxy_host_port(proxy: &str) -> Result<Option<String>> {
    if proxy.is_empty() {
        return Ok(None);
    }
    let parsed = url::Url::parse(proxy)
        .ok()
        .filter(|u| u.scheme().starts_with("http") && u.host_str().is_some())
        .or_else(|| url::Url::parse(&format!("http://{proxy}")).ok())
        .ok_or_else(|| Error::Config(format!("invalid proxy address {proxy:?}")))?;
    let host = parsed
        .host_str()
        .ok_or_else(|| Error::Config(format!("invalid proxy address {proxy:?}")))?;
    let port = parsed.port_or_known_default().unwrap_or(80);
    Ok(Some(format!("{host}:{port}")))
}

/// `CONNECT target` through an HTTP proxy; the stream is then a tunnel to `target`.
async fn connect_tunnel(mut tcp: TcpStream, target: &str) -> std::io::Result<TcpStream> {
    use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
    tcp.write_all(format!("CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n\r\n").as_bytes())
        .await?;
    let mut reader = BufReader::new(&mut tcp);
    let mut status = String::new();
    reader.read_line(&mut status).await?;
    if status.split_whitespace().nth(1).is_none_or(|c| c != "200") {
        return Err(std::io::Error::other(format!(
            "proxy refused CONNECT: {}",
            status.trim()
        )));
    }
    // Skip the headers, bounded.
    for _ in 0..100 {
        let mut line = String::new();
        if reader.read_line(&mut line).await? == 0 || line == "\r\n" || line == "\n" {
            break;
        }
    }
    Ok(tcp)
}

/// A byte stream to the service (TCP, or TLS over TCP).
trait Io: AsyncRead + AsyncWrite + Send + Unpin + 'static {}
impl<T: AsyncRead + AsyncWrite + Send + Unpin + 'static> Io for T {}

#[cfg(test)]
mod fuzz;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn proxies_as_etcd_reads_them() {
        assert_eq!(proxy_host_port("").ok().flatten(), None);
        assert_eq!(
            proxy_host_port("127.0.0.1:3128").ok().flatten().as_deref(),
            Some("127.0.0.1:3128")
        );
        assert_eq!(
            proxy_host_port("http://p.local").ok().flatten().as_deref(),
            Some("p.local:80")
        );
        assert_eq!(base("/discovery/tok/abc"), "abc");
        assert_eq!(form_escape("a=http://h:1,b"), "a%3Dhttp%3A%2F%2Fh%3A1%2Cb");
    }
}
