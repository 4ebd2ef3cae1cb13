//! The subset of etcd's v2 keys API that discovery uses, so that our server can host v2
//! discovery for other clusters (as etcd 3.4 does with `--enable-v2`), plus the public
//! discovery service's `GET /new?size=N`, which creates a token and answers its URL.
//!
//! Served on the client port: `GET`/`PUT`/`DELETE /v2/keys/<path>` with `value=` (form or
//! query), `prevExist`, `dir`, `recursive`, `wait`/`waitIndex` (long poll), `quorum`; etcd's
//! v2 JSON bodies, the `X-Etcd-Index`, `X-Etcd-Cluster-Id`, `X-Raft-Index` and `X-Raft-Term`
//! headers and its error JSON (`errorCode`, `message`, `cause`, `index`). Keys whose last
//! element starts with `_` are hidden from listings and recursive waits, as in v2.
//!
//! Storage: like etcd's own v2-on-v3 emulation (`--experimental-enable-v2v3`), v2 nodes live
//! in the replicated v3 keyspace under [`V3_PREFIX`], so every write goes through raft and any
//! member can serve any request, with no store, raft op or bucket of its own. A file `/a/b`
//! is the v3 key `<prefix>/a/b`; a directory `/a` is the marker key `<prefix>/a/` (written
//! with its first child, or by `dir=true`). The v2 index is the v3 revision. Writes are v3
//! transactions whose compares make each v2 precondition atomic (no file where a directory
//! must be, `prevExist`). A wait is a watcher in the server's watch hub from `waitIndex`.
//!
//! Differences from etcd's v2 store: no TTLs, no in-order keys (`POST`), no
//! `prevValue`/`prevIndex`; overwriting a file keeps its `createdIndex` (v3 keeps the create
//! revision); watch events report `set` or `delete` (not `create`/`update`); listings are
//! always sorted.//!
//! Layout: routing, parameters, errors and `/new` are here; `ops` holds the v2 operations
//! over v3 and `node` the path mapping and JSON of v2 nodes.

use axum::Router;
use axum::body::Bytes;
use axum::extract::{Path, RawQuery, State};
use axum::http::{HeaderMap, Method, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{any, get};
use etcdrs_proto::etcdserverpb::PutRequest;
use etcdrs_proto::etcdserverpb::kv_server::Kv;

use crate::EtcdServer;
use crate::rpc::Rpc;
mod node;
mod ops;

use self::node::clean;

/// Where v2 nodes live in the v3 keyspace.
pub const V3_PREFIX: &str = "/_etcdrs/v2keys";
/// Where the v3 discovery registry lives (`/new` writes the size there too).
const V3_REGISTRY: &str = "/_etcd/registry";
/// How many times a write is re-evaluated when a concurrent change beat its compares.
const WRITE_ATTEMPTS: usize = 5;
/// Largest size `/new` accepts.
const MAX_NEW_SIZE: u64 = 1000;

/// v2 error codes used here (etcd `etcdserver/api/v2error`).
const KEY_NOT_FOUND: u32 = 100;
const NOT_FILE: u32 = 102;
const NOT_DIR: u32 = 104;
const NODE_EXIST: u32 = 105;
const DIR_NOT_EMPTY: u32 = 108;
const INVALID_FIELD: u32 = 209;
const RAFT_INTERNAL: u32 = 300;
const EVENT_INDEX_CLEARED: u32 = 401;

/// The routes: `/v2/keys[/...]` and `/new`.
pub fn router(server: EtcdServer) -> Router {
    Router::new()
        .route("/v2/keys", any(keys_root))
        .route("/v2/keys/", any(keys_root))
        .route("/v2/keys/{*path}", any(keys))
        .route("/new", get(new_token))
        .with_state(server)
}

/// A v2 error.
struct V2Error {
    code: u32,
    cause: String,
    index: i64,
}

impl V2Error {
    fn new(code: u32, cause: impl Into<String>, index: i64) -> Self {
        V2Error {
            code,
            cause: cause.into(),
            index,
        }
    }

    fn message(&self) -> &'static str {
        match self.code {
            KEY_NOT_FOUND => "Key not found",
            NOT_FILE => "Not a file",
            NOT_DIR => "Not a directory",
            NODE_EXIST => "Key already exists",
            DIR_NOT_EMPTY => "Directory not empty",
            INVALID_FIELD => "Invalid field",
            EVENT_INDEX_CLEARED => "The event in requested index is outdated and cleared",
            _ => "Raft Internal Error",
        }
    }

    fn status(&self) -> StatusCode {
        match self.code {
            KEY_NOT_FOUND => StatusCode::NOT_FOUND,
            NOT_FILE | NOT_DIR | DIR_NOT_EMPTY => StatusCode::FORBIDDEN,
            NODE_EXIST => StatusCode::PRECONDITION_FAILED,
            INVALID_FIELD | EVENT_INDEX_CLEARED => StatusCode::BAD_REQUEST,
            _ => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }

    fn internal(e: impl std::fmt::Display, index: i64) -> Self {
        V2Error::new(RAFT_INTERNAL, e.to_string(), index)
    }
}

/// The v2 handler: the server and its services.
struct Keys {
    server: EtcdServer,
    rpc: Rpc,
}

/// Request parameters (query and form, as Go's `FormValue`).
#[derive(Default)]
struct Params {
    value: Option<String>,
    prev_exist: Option<bool>,
    dir: bool,
    recursive: bool,
    wait: bool,
    wait_index: Option<i64>,
    quorum: bool,
    ttl: bool,
}

impl Params {
    fn parse(query: Option<&str>, body: &[u8]) -> Result<Params, V2Error> {
        let mut p = Params::default();
        let pairs = url::form_urlencoded::parse(query.unwrap_or("").as_bytes())
            .chain(url::form_urlencoded::parse(body));
        let flag = |v: &str, field: &str| match v {
            "true" => Ok(true),
            "false" => Ok(false),
            _ => Err(V2Error::new(
                INVALID_FIELD,
                format!("invalid value for {field}"),
                0,
            )),
        };
        for (k, v) in pairs {
            match k.as_ref() {
                "value" if p.value.is_none() => p.value = Some(v.into_owned()),
                "prevExist" => p.prev_exist = Some(flag(&v, "prevExist")?),
                "dir" => p.dir = flag(&v, "dir")?,
                "recursive" => p.recursive = flag(&v, "recursive")?,
                "wait" => p.wait = flag(&v, "wait")?,
                "quorum" => p.quorum = flag(&v, "quorum")?,
                "waitIndex" => {
                    p.wait_index = Some(v.parse::<i64>().map_err(|_| {
                        V2Error::new(INVALID_FIELD, "invalid value for waitIndex", 0)
                    })?);
                }
                "ttl" if !v.is_empty() => p.ttl = true,
                _ => {}
            }
        }
        Ok(p)
    }
}

async fn keys_root(
    State(server): State<EtcdServer>,
    method: Method,
    RawQuery(query): RawQuery,
    body: Bytes,
) -> Response {
    handle(server, method, String::new(), query, body).await
}

async fn keys(
    State(server): State<EtcdServer>,
    method: Method,
    Path(path): Path<String>,
    RawQuery(query): RawQuery,
    body: Bytes,
) -> Response {
    handle(server, method, path, query, body).await
}

async fn handle(
    server: EtcdServer,
    method: Method,
    path: String,
    query: Option<String>,
    body: Bytes,
) -> Response {
    let keys = Keys {
        rpc: Rpc::new(server.clone()),
        server,
    };
    let path = clean(&path);
    let params = match Params::parse(query.as_deref(), &body) {
        Ok(p) => p,
        Err(e) => return keys.error(e),
    };
    let result = match method {
        Method::GET | Method::HEAD => keys.get(&path, &params).await,
        Method::PUT => keys.put(&path, &params).await,
        Method::DELETE => keys.delete(&path, &params).await,
        _ => {
            return (
                StatusCode::METHOD_NOT_ALLOWED,
                [(header::ALLOW, "GET, HEAD, PUT, DELETE")],
                "Method Not Allowed",
            )
                .into_response();
        }
    };
    result.unwrap_or_else(|e| keys.error(e))
}

/// `GET /new?size=N` (the public discovery service's API): a fresh token whose registry
/// expects `N` members (default 3), answered as the `--discovery` URL of its v2 registry. The
/// size is written for v3 discovery too, so the token also works with `--discovery-token`.
async fn new_token(
    State(server): State<EtcdServer>,
    headers: HeaderMap,
    RawQuery(query): RawQuery,
) -> Response {
    let mut size: u64 = 3;
    for (k, v) in url::form_urlencoded::parse(query.unwrap_or_default().as_bytes()) {
        if k == "size" {
            match v.parse::<u64>() {
                Ok(n) if (1..=MAX_NEW_SIZE).contains(&n) => size = n,
                _ => {
                    return (StatusCode::BAD_REQUEST, "invalid size\n").into_response();
                }
            }
        }
    }
    let token: String = (0..16)
        .map(|_| format!("{:02x}", rand::random::<u8>()))
        .collect();
    let keys = Keys {
        rpc: Rpc::new(server.clone()),
        server,
    };
    let path = format!("{V3_REGISTRY}/{token}/_config/size");
    let params = Params {
        value: Some(size.to_string()),
        prev_exist: Some(false),
        ..Params::default()
    };
    if let Err(e) = keys.put(&path, &params).await {
        return keys.error(e);
    }
    let v3 = PutRequest {
        key: path.clone().into_bytes(),
        value: size.to_string().into_bytes().into(),
        ..PutRequest::default()
    };
    if let Err(status) = Kv::put(&keys.rpc, tonic::Request::new(v3)).await {
        return keys.error(V2Error::internal(status.message(), 0));
    }
    let host = headers
        .get(header::HOST)
        .and_then(|h| h.to_str().ok())
        .unwrap_or("127.0.0.1:2379");
    (
        StatusCode::OK,
        [(header::CONTENT_TYPE, "text/plain")],
        format!("http://{host}/v2/keys{V3_REGISTRY}/{token}"),
    )
        .into_response()
}
