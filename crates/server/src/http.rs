//! The client port: gRPC and etcd's plain HTTP endpoints (`/health`, `/livez`, `/readyz`,
//! `/version`, `/metrics`) served on one listener, as etcd's cmux does (etcd `embed/serve.go`).

use std::sync::Arc;

use axum::Router;
use axum::extract::{RawQuery, State};
use axum::http::{Method, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{any, get};
use etcdrs_proto::etcdserverpb::auth_server::AuthServer;
use etcdrs_proto::etcdserverpb::cluster_server::ClusterServer;
use etcdrs_proto::etcdserverpb::kv_server::KvServer;
use etcdrs_proto::etcdserverpb::lease_server::LeaseServer;
use etcdrs_proto::etcdserverpb::maintenance_server::MaintenanceServer;
use etcdrs_proto::fanout::watch_server::WatchServer;
use etcdrs_proto::v3electionpb::election_server::ElectionServer;
use etcdrs_proto::v3lockpb::lock_server::LockServer;
use etcdrs_schema::version::SERVER_VERSION;
use etcdrs_serve::h2authority::LenientAuthority;
use etcdrs_serve::keepalive::{PingPolicy, Policed};
use etcdrs_serve::leader::LeaderSource;
use etcdrs_serve::listener::{Admission, Handler, Peer};
use etcdrs_serve::not_found;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::graceful::Watcher;
use hyper_util::service::TowerToHyperService;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use crate::EtcdServer;
use crate::metrics;
use crate::rpc::{ClientIdentity, Rpc};
use crate::tls::TlsServer;

mod dispatch;
mod peer;
mod scrape;
mod unary;

/// gRPC allows this much on top of `--max-request-bytes` for message framing, as etcd does.
const GRPC_OVERHEAD_BYTES: usize = 512 * 1024;

/// What a client listener serves: both (etcd's default), or, with `--listen-client-http-urls`,
/// gRPC on `--listen-client-urls` and HTTP on the HTTP URLs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Serves {
    /// gRPC and HTTP on one port.
    Both,
    /// gRPC only.
    Grpc,
    /// The HTTP endpoints only (health, version, metrics, probes, JSON gateway, v2).
    Http,
}

/// The router serving gRPC and HTTP for `server`.
pub fn router(server: EtcdServer) -> Router {
    client_router(server, Serves::Both)
}

/// The gRPC services of `rpc`: etcd's `v3rpc.Server` (KV, Lease, Cluster, Auth, Watch,
/// Maintenance, health) and, with `recipes`, the v3lock and v3election services that etcd
/// registers on its client listeners only.
fn grpc_routes(rpc: Rpc, recipes: bool) -> Router {
    let max = max_decoding(&rpc);
    let (health_reporter, health_service) = tonic_health::server::health_reporter();
    drop(health_reporter);
    let mut routes = tonic::service::Routes::new(kv_service(&rpc))
        .add_service(LeaseServer::new(rpc.clone()).max_decoding_message_size(max))
        .add_service(ClusterServer::new(rpc.clone()).max_decoding_message_size(max))
        .add_service(AuthServer::new(rpc.clone()).max_decoding_message_size(max))
        .add_service(WatchServer::new(rpc.clone()).max_decoding_message_size(max));
    if recipes {
        routes = routes
            .add_service(LockServer::new(rpc.clone()).max_decoding_message_size(max))
            .add_service(ElectionServer::new(rpc.clone()).max_decoding_message_size(max));
    }
    routes
        .add_service(MaintenanceServer::new(rpc).max_decoding_message_size(max))
        .add_service(health_service)
        .prepare()
        .into_axum_router()
}

/// The largest gRPC message the services of `rpc` accept.
fn max_decoding(rpc: &Rpc) -> usize {
    rpc.server.config().max_request_bytes as usize + GRPC_OVERHEAD_BYTES
}

/// The KV service, as both the router and the direct path (`http::unary`) serve it.
fn kv_service(rpc: &Rpc) -> KvServer<Rpc> {
    KvServer::new(rpc.clone()).max_decoding_message_size(max_decoding(rpc))
}

/// The layers every listener's routes get: leader checks and gRPC's size errors.
fn with_common_layers(routes: Router, server: EtcdServer) -> Router {
    routes
        .fallback(not_found)
        .layer(axum::middleware::from_fn_with_state(
            Arc::new(server) as Arc<dyn LeaderSource>,
            etcdrs_serve::leader::require_leader,
        ))
        .layer(axum::middleware::map_response(
            etcdrs_serve::grpc_size::grpc_size_error,
        ))
}

/// The router of a client listener serving `serves`.
pub fn client_router(server: EtcdServer, serves: Serves) -> Router {
    let rpc = Rpc::new(server.clone());
    let gateway = crate::gateway::router(rpc.clone());
    let v2keys = crate::v2keys::router(server.clone());
    let grpc = grpc_routes(rpc, true);
    let mut http = probe_routes(Router::new())
        .route("/health", any(health))
        .route("/version", get(version))
        .route("/metrics", get(metrics_text))
        .with_state(server.clone());
    // etcd's gates: the JSON gateway unless --enable-grpc-gateway=false, the v2 keys API
    // (here the subset v2 discovery uses, and `/new`) only with --enable-v2.
    if server.config().enable_grpc_gateway {
        http = http.merge(gateway);
    }
    if server.config().enable_v2 {
        http = http.merge(v2keys);
    }
    // etcd's access controller stands in front of the HTTP endpoints, not of gRPC.
    let access = Arc::new(Access::new(server.config()));
    let http = http.layer(axum::middleware::from_fn_with_state(access, access_control));
    let routes = match serves {
        Serves::Both => grpc.merge(http),
        Serves::Grpc => grpc,
        Serves::Http => http,
    };
    with_common_layers(routes, server)
}

/// Serve clients on `listener` until `shutdown`: HTTP/1.1 and HTTP/2 (gRPC) on one port,
/// over TLS when `tls` is given. Each connection runs on this function's own task set; on
/// shutdown, connections get a graceful close and a short grace period.
pub async fn serve(
    server: EtcdServer,
    listener: TcpListener,
    tls: Option<Arc<TlsServer>>,
    shutdown: CancellationToken,
) -> std::io::Result<()> {
    let config = server.config();
    let mut builder = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new());
    // etcd's gRPC server options: --max-concurrent-streams, and keepalive pings every
    // --grpc-keepalive-interval, answered within --grpc-keepalive-timeout.
    builder
        .http2()
        .timer(hyper_util::rt::TokioTimer::new())
        .max_concurrent_streams(config.max_concurrent_streams)
        .keep_alive_interval(Some(config.grpc_keepalive_interval))
        .keep_alive_timeout(config.grpc_keepalive_timeout);
    // With --listen-client-http-urls the HTTP endpoints move there, as in etcd 3.5.
    let serves = if config.listen_client_http_urls.is_empty() {
        Serves::Both
    } else {
        Serves::Grpc
    };
    let rpc = Rpc::new(server.clone());
    let kv = unary::DirectKv::new(rpc.clone(), kv_service(&rpc), max_decoding(&rpc));
    // --grpc-keepalive-min-time, as etcd hands it to grpc-go for the client port. etcd's
    // peer port serves gRPC too, under grpc-go's default policy (5 min); ours polices no
    // ping there: its clients are members and proxies, and the port is not capped either.
    let ping_policy = PingPolicy::etcd(config.grpc_keepalive_min_time);
    serve_with(
        dispatch::Dispatch::new(Some(kv), client_router(server.clone(), serves)),
        builder,
        listener,
        tls,
        (Admission::Capped, Some(ping_policy)),
        shutdown,
    )
    .await
}

/// Serve the HTTP endpoints on a `--listen-client-http-urls` listener until `shutdown`.
pub async fn serve_http(
    server: EtcdServer,
    listener: TcpListener,
    tls: Option<Arc<TlsServer>>,
    shutdown: CancellationToken,
) -> std::io::Result<()> {
    serve_router(client_router(server, Serves::Http), listener, tls, shutdown).await
}

/// The router of the peer port: etcd's peer handlers (the transport's raft routes and
/// `http::peer`) and `/version` (like etcd's, no `/health`), and, as etcd serves them
/// there too, the v3 gRPC services (without lock and election, and without the JSON gateway).
pub fn peer_router(server: EtcdServer) -> Router {
    let peer = peer::routes(&server)
        .route("/version", get(version))
        .with_state(server.clone());
    let grpc = grpc_routes(Rpc::new(server.clone()), false);
    with_common_layers(grpc.merge(peer), server)
}

/// The router of `--listen-metrics-urls`: `/metrics` and the health endpoints (`/health`,
/// `/livez`, `/readyz`), as etcd serves there.
pub fn metrics_router(server: EtcdServer) -> Router {
    probe_routes(Router::new())
        .route("/metrics", get(metrics_text))
        .route("/health", any(health))
        .fallback(not_found)
        .with_state(server)
}

/// Serve `/metrics` and `/health` on `listener` until `shutdown`.
pub async fn serve_metrics(
    server: EtcdServer,
    listener: TcpListener,
    tls: Option<Arc<TlsServer>>,
    shutdown: CancellationToken,
) -> std::io::Result<()> {
    serve_router(metrics_router(server), listener, tls, shutdown).await
}

/// Serve peers on `listener` until `shutdown`.
pub async fn serve_peers(
    server: EtcdServer,
    listener: TcpListener,
    tls: Option<Arc<TlsServer>>,
    shutdown: CancellationToken,
) -> std::io::Result<()> {
    let builder = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new());
    serve_router_with(
        peer_router(server),
        builder,
        listener,
        tls,
        Admission::Uncapped,
        shutdown,
    )
    .await
}

/// `--host-whitelist` and `--cors` (etcd's `AccessController`): an empty list or `*` allows all.
struct Access {
    hosts: Vec<String>,
    origins: Vec<String>,
}

impl Access {
    fn new(config: &crate::ServerConfig) -> Access {
        Access {
            hosts: config.host_whitelist.clone(),
            origins: config.cors.clone(),
        }
    }

    fn allows(list: &[String], name: &str) -> bool {
        list.is_empty() || list.iter().any(|item| item == "*" || item == name)
    }
}

/// Go's `%q` of a string: double quotes, with `"`, `\` and control characters escaped.
fn go_quote(text: &str) -> String {
    let mut out = String::with_capacity(text.len() + 2);
    out.push('"');
    for c in text.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\t' => out.push_str("\\t"),
            '\r' => out.push_str("\\r"),
            c if c.is_control() => out.push_str(&format!("\\x{:02x}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// etcd's `accessController` for the HTTP endpoints: a plain-text request whose Host is not in
/// `--host-whitelist` is refused with 421 and etcd's explanation (DNS rebinding, CVE-2018-5702);
/// answers carry the CORS headers `--cors` allows, and `OPTIONS` is answered at once.
async fn access_control(
    State(access): State<Arc<Access>>,
    request: axum::extract::Request,
    next: axum::middleware::Next,
) -> Response {
    let secure = request
        .extensions()
        .get::<ClientIdentity>()
        .is_some_and(|id| id.secure);
    if !secure {
        let host = request
            .headers()
            .get(header::HOST)
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned)
            .or_else(|| request.uri().authority().map(|a| a.to_string()))
            .unwrap_or_default();
        // Go's `net.SplitHostPort`, falling back to the whole value.
        let hostname = match host.rsplit_once(':') {
            Some((name, port)) if !port.contains(']') => name
                .trim_start_matches('[')
                .trim_end_matches(']')
                .to_owned(),
            _ => host.clone(),
        };
        if !Access::allows(&access.hosts, &hostname) {
            tracing::warn!(host = %hostname, "rejecting HTTP request to prevent DNS rebinding attacks");
            let text = format!(
                "\netcd received your request, but the Host header was unrecognized.\n\n\
                 To fix this, choose one of the following options:\n\
                 - Enable TLS, then any HTTPS request will be allowed.\n\
                 - Add the hostname you want to use to the whitelist in settings.\n  \
                 - e.g. etcd --host-whitelist {}\n\n\
                 This requirement has been added to help prevent \"DNS Rebinding\" attacks (CVE-2018-5702).\n\n",
                go_quote(&hostname)
            );
            return (
                StatusCode::MISDIRECTED_REQUEST,
                [
                    (header::CONTENT_TYPE, "text/plain; charset=utf-8"),
                    (header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
                ],
                text,
            )
                .into_response();
        }
    }
    let origin = request
        .headers()
        .get(header::ORIGIN)
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_owned();
    let allowed_origin = if Access::allows(&access.origins, "*") {
        Some("*".to_owned())
    } else if Access::allows(&access.origins, &origin) {
        Some(origin)
    } else {
        None
    };
    let mut response = if request.method() == Method::OPTIONS {
        StatusCode::OK.into_response()
    } else {
        next.run(request).await
    };
    if let Some(origin) = allowed_origin
        && let Ok(origin) = header::HeaderValue::from_str(&origin)
    {
        let headers = response.headers_mut();
        headers.insert(
            header::ACCESS_CONTROL_ALLOW_METHODS,
            header::HeaderValue::from_static("POST, GET, OPTIONS, PUT, DELETE"),
        );
        headers.insert(header::ACCESS_CONTROL_ALLOW_ORIGIN, origin);
        headers.insert(
            header::ACCESS_CONTROL_ALLOW_HEADERS,
            header::HeaderValue::from_static("accept, content-type, authorization"),
        );
    }
    response
}

/// Serve `router` on `listener` until `shutdown` (the accept loop is `etcdrs_serve`'s).
async fn serve_router(
    router: Router,
    listener: TcpListener,
    tls: Option<Arc<TlsServer>>,
    shutdown: CancellationToken,
) -> std::io::Result<()> {
    let builder = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new());
    serve_router_with(router, builder, listener, tls, Admission::Capped, shutdown).await
}

/// [`serve_router`] with hyper settings of the caller's.
async fn serve_router_with(
    router: Router,
    builder: hyper_util::server::conn::auto::Builder<TokioExecutor>,
    listener: TcpListener,
    tls: Option<Arc<TlsServer>>,
    admission: Admission,
    shutdown: CancellationToken,
) -> std::io::Result<()> {
    serve_with(
        dispatch::Dispatch::new(None, router),
        builder,
        listener,
        tls,
        (admission, None),
        shutdown,
    )
    .await
}

/// [`serve_router_with`] for a front service of the caller's, with the listener's
/// admission and ping policy.
async fn serve_with(
    service: dispatch::Dispatch,
    mut builder: hyper_util::server::conn::auto::Builder<TokioExecutor>,
    listener: TcpListener,
    tls: Option<Arc<TlsServer>>,
    (admission, ping_policy): (Admission, Option<PingPolicy>),
    shutdown: CancellationToken,
) -> std::io::Result<()> {
    // gRPC answers carry no `date` (grpc-go, behind etcd, sends none); HTTP/1.1 keeps it.
    builder.http2().auto_date_header(false);
    let handler = Connections {
        service,
        builder,
        tls: tls.clone(),
        ping_policy,
    };
    let acceptor = tls.map(|tls| tls as Arc<dyn etcdrs_serve::listener::Acceptor>);
    etcdrs_serve::listener::serve(listener, acceptor, handler, admission, shutdown).await;
    Ok(())
}

impl etcdrs_serve::listener::Acceptor for TlsServer {
    fn acceptor(&self) -> tokio_rustls::TlsAcceptor {
        TlsServer::acceptor(self)
    }
}

/// What one of the server's listeners serves on each connection: HTTP/1.1 and HTTP/2 (by
/// preface) with hyper's own executor, each request tagged with the client's [`ClientIdentity`].
#[derive(Clone)]
struct Connections {
    service: dispatch::Dispatch,
    builder: hyper_util::server::conn::auto::Builder<TokioExecutor>,
    /// The listener's TLS: a client certificate must also pass its allowed CN/hostname check.
    tls: Option<Arc<TlsServer>>,
    /// How the listener polices clients' pings (the client port's `--grpc-keepalive-min-time`).
    ping_policy: Option<PingPolicy>,
}

impl Handler for Connections {
    fn ping_policy(&self) -> Option<PingPolicy> {
        self.ping_policy
    }

    async fn serve<IO>(self, io: LenientAuthority<Policed<IO>>, peer: Peer, watcher: Watcher)
    where
        IO: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
    {
        let mut identity = ClientIdentity::default();
        if let Some(tls) = &self.tls {
            let certificate = peer.certificate.as_ref();
            if !tls.info().allows(certificate) {
                tracing::warn!(remote_addr = %peer.addr, "rejected connection: client certificate not allowed");
                return;
            }
            identity.common_name = certificate.and_then(crate::tls::common_name);
            identity.secure = true;
        }
        // gRPC calls, messages and bytes are counted here, outside axum, where counting
        // allocates nothing; on the peer and metrics ports no path is one of etcd's methods.
        let service = tower::ServiceBuilder::new()
            .map_request(
                move |mut request: axum::extract::Request<
                    etcdrs_serve::grpc_metrics::wire::Counted<hyper::body::Incoming>,
                >| {
                    request.extensions_mut().insert(identity.clone());
                    request
                },
            )
            .service(self.service);
        let service = etcdrs_serve::grpc_metrics::wire::CountGrpc::new(service);
        let service = TowerToHyperService::new(service);
        let conn = self
            .builder
            .serve_connection_with_upgrades(TokioIo::new(io), service);
        let _ = watcher.watch(conn).await;
    }
}

/// `GET /health` (etcd 3.5 `etcdhttp.HandleHealth`): JSON `{"health":..,"reason":..}`, 200 when
/// healthy and 503 otherwise. `?exclude=<ALARM>` (repeatable) ignores that alarm;
/// `?serializable=true` skips the leader check and reads locally instead of through ReadIndex,
/// so it probes this member rather than the cluster.
async fn health(
    State(server): State<EtcdServer>,
    method: Method,
    RawQuery(query): RawQuery,
) -> Response {
    if method != Method::GET {
        return method_not_allowed();
    }
    let query = HealthQuery::parse(query.as_deref());
    let (healthy, reason) = check_health(&server, &query).await;
    if healthy {
        crate::metrics::HEALTH_SUCCESS.inc();
    } else {
        crate::metrics::HEALTH_FAILURES.inc();
    }
    let body =
        serde_json::json!({ "health": if healthy { "true" } else { "false" }, "reason": reason })
            .to_string();
    if healthy {
        // Go sniffs the content type of the JSON body as plain text.
        return (StatusCode::OK, [(header::CONTENT_TYPE, TEXT_PLAIN)], body).into_response();
    }
    http_error(StatusCode::SERVICE_UNAVAILABLE, &body)
}

/// The health of `server` as `/health` reports it: alarms, then the leader, then a read.
async fn check_health(server: &EtcdServer, query: &HealthQuery) -> (bool, String) {
    let alarm = server
        .alarms()
        .into_iter()
        .map(|alarm| crate::rpc::maintenance::alarm_name(alarm.alarm))
        .find(|name| !query.exclude.iter().any(|excluded| excluded == name));
    if let Some(name) = alarm {
        let reason = match name {
            "NOSPACE" | "CORRUPT" => format!("ALARM {name}"),
            _ => "ALARM UNKNOWN".to_owned(),
        };
        return (false, reason);
    }
    if !query.serializable && server.raft_status().leader == 0 {
        return (false, "RAFT NO LEADER".into());
    }
    match read_check(server, query.serializable).await {
        Ok(()) => (true, String::new()),
        Err(e) => (false, format!("RANGE ERROR:{e}")),
    }
}

/// The query parameters of the health endpoints, as etcd reads them.
#[derive(Debug, Default, PartialEq)]
struct HealthQuery {
    /// `exclude=<name>` (repeatable; empty values ignored): alarms for `/health`, checks for
    /// `/livez` and `/readyz`.
    exclude: Vec<String>,
    /// `serializable=true`, exactly (Go compares the first value with "true").
    serializable: bool,
    /// `verbose` is present, with any value: list every check on success too.
    verbose: bool,
}

impl HealthQuery {
    fn parse(query: Option<&str>) -> Self {
        let mut parsed = HealthQuery::default();
        let mut serializable = None;
        for (name, value) in url::form_urlencoded::parse(query.unwrap_or_default().as_bytes()) {
            match &*name {
                "exclude" if !value.is_empty() => parsed.exclude.push(value.into_owned()),
                "serializable" => {
                    serializable.get_or_insert(value == "true");
                }
                "verbose" => parsed.verbose = true,
                _ => {}
            }
        }
        parsed.serializable = serializable.unwrap_or(false);
        parsed
    }
}

/// One of the named checks of `/livez` and `/readyz` (etcd 3.5.12+/3.6 `CheckRegistry`).
#[derive(Clone, Copy, Debug, PartialEq)]
enum Check {
    /// The CORRUPT alarm is not raised.
    DataCorruption,
    /// A local read works.
    SerializableRead,
    /// A read through ReadIndex works: the cluster has a leader and a quorum.
    LinearizableRead,
}

impl Check {
    fn name(self) -> &'static str {
        match self {
            Check::DataCorruption => "data_corruption",
            Check::SerializableRead => "serializable_read",
            Check::LinearizableRead => "linearizable_read",
        }
    }

    async fn run(self, server: &EtcdServer) -> Result<(), String> {
        match self {
            Check::DataCorruption => {
                let corrupt = server
                    .alarms()
                    .iter()
                    .any(|alarm| crate::rpc::maintenance::alarm_name(alarm.alarm) == "CORRUPT");
                if corrupt {
                    return Err("alarm activated: CORRUPT".to_owned());
                }
                Ok(())
            }
            Check::SerializableRead => read_check(server, true).await,
            Check::LinearizableRead => read_check(server, false).await,
        }
    }
}

/// `/livez`: the process serves local reads. Alarms and a lost quorum do not fail it, so a
/// liveness probe does not restart a member that only waits for its cluster.
const LIVEZ_CHECKS: &[Check] = &[Check::SerializableRead];

/// `/readyz`: the member can serve requests: no CORRUPT alarm, and both local and
/// linearizable reads work.
const READYZ_CHECKS: &[Check] = &[
    Check::DataCorruption,
    Check::SerializableRead,
    Check::LinearizableRead,
];

/// etcd's health read: a one-key range (on the empty key), linearizable or not. Failures read
/// as the gRPC API's error text (`etcdserver: no leader`), as etcd reports its range error.
async fn read_check(server: &EtcdServer, serializable: bool) -> Result<(), String> {
    let text = |e: crate::ServerError| tonic::Status::from(e).message().to_owned();
    if !serializable {
        server.linearizable_barrier().await.map_err(text)?;
    }
    let params = etcdrs_mvcc::RangeParams {
        rev: 0,
        limit: 1,
        count_only: false,
    };
    server
        .store()
        .range(etcdrs_mvcc::KeyRange::new(b"", b""), params)
        .map(|_| ())
        .map_err(|e| text(e.into()))
}

/// The routes of `/livez` and `/readyz`: the root runs every check not excluded, and each
/// check also has its own path (`/readyz/linearizable_read`).
fn probe_routes(mut router: Router<EtcdServer>) -> Router<EtcdServer> {
    for (root, checks) in [("/livez", LIVEZ_CHECKS), ("/readyz", READYZ_CHECKS)] {
        router = router.route(
            root,
            any(
                move |State(server): State<EtcdServer>,
                      method: Method,
                      RawQuery(query): RawQuery| async move {
                    let query = HealthQuery::parse(query.as_deref());
                    let checks: Vec<Check> = checks
                        .iter()
                        .copied()
                        .filter(|check| !query.exclude.iter().any(|e| e == check.name()))
                        .collect();
                    probe(&server, &root[1..], method, &query, &checks).await
                },
            ),
        );
        for &check in checks {
            router = router.route(
                &format!("{root}/{}", check.name()),
                any(
                    move |State(server): State<EtcdServer>,
                          method: Method,
                          RawQuery(query): RawQuery| async move {
                        let query = HealthQuery::parse(query.as_deref());
                        probe(&server, &root[1..], method, &query, &[check]).await
                    },
                ),
            );
        }
    }
    router
}

/// Run `checks` and answer as etcd's `newHealthHandler`: `ok` (after the check list with
/// `?verbose`), or 503 with the check list, failures marked `[-]`.
async fn probe(
    server: &EtcdServer,
    kind: &str,
    method: Method,
    query: &HealthQuery,
    checks: &[Check],
) -> Response {
    if method != Method::GET {
        return method_not_allowed();
    }
    let mut report = String::new();
    let mut failed = false;
    for &check in checks {
        let outcome = check.run(server).await;
        metrics::record_healthcheck(kind, check.name(), outcome.is_ok());
        match outcome {
            Ok(()) => report.push_str(&format!("[+]{} ok\n", check.name())),
            Err(e) => {
                failed = true;
                report.push_str(&format!("[-]{} failed: {e}\n", check.name()));
            }
        }
    }
    if failed {
        return http_error(StatusCode::SERVICE_UNAVAILABLE, &report);
    }
    let body = if query.verbose {
        format!("{report}ok\n")
    } else {
        "ok\n".to_owned()
    };
    (
        StatusCode::OK,
        [
            (header::CONTENT_TYPE, TEXT_PLAIN),
            (header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
        ],
        body,
    )
        .into_response()
}

/// Go's content type for plain text.
const TEXT_PLAIN: &str = "text/plain; charset=utf-8";

/// Go's `http.Error`: the text and a newline, as plain text that must not be sniffed.
fn http_error(status: StatusCode, text: &str) -> Response {
    (
        status,
        [
            (header::CONTENT_TYPE, TEXT_PLAIN),
            (header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
        ],
        format!("{text}\n"),
    )
        .into_response()
}

/// The health endpoints answer GET only, as etcd's.
fn method_not_allowed() -> Response {
    let mut response = http_error(StatusCode::METHOD_NOT_ALLOWED, "Method Not Allowed");
    response
        .headers_mut()
        .insert(header::ALLOW, axum::http::HeaderValue::from_static("GET"));
    response
}

/// etcd's `/version`: this build's server version and the cluster version as applied (what
/// an etcd member checks before it joins: a 3.4 member refuses a cluster running at 3.5).
async fn version(State(server): State<EtcdServer>) -> impl IntoResponse {
    // etcd's "not_decided" until the first leader sets a version.
    let cluster = server
        .cluster_version()
        .unwrap_or_else(|| "not_decided".to_owned());
    let body = serde_json::json!({ "etcdserver": SERVER_VERSION, "etcdcluster": cluster });
    (
        [(header::CONTENT_TYPE, "application/json")],
        body.to_string(),
    )
}

async fn metrics_text(State(server): State<EtcdServer>) -> impl IntoResponse {
    (
        [(
            header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        scrape::render(&server),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn health_query_as_go_reads_it() {
        assert_eq!(HealthQuery::parse(None), HealthQuery::default());
        let q = HealthQuery::parse(Some(
            "exclude=NOSPACE&exclude=&exclude=CORRUPT&serializable=true&serializable=false&verbose",
        ));
        assert_eq!(
            q,
            HealthQuery {
                exclude: vec!["NOSPACE".into(), "CORRUPT".into()],
                serializable: true,
                verbose: true,
            }
        );
        // Only the exact value "true" counts, and only the first value.
        assert!(!HealthQuery::parse(Some("serializable=1")).serializable);
        assert!(!HealthQuery::parse(Some("serializable=false&serializable=true")).serializable);
    }
}
