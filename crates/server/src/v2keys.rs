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
//! always sorted.

use axum::Router;
use axum::body::Bytes;
use axum::extract::{Path, RawQuery, State};
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{any, get};
use etcdrs_mvcc::{Filters, HubMsg, WatchRange};
use etcdrs_proto::etcdserverpb::compare::{CompareResult, CompareTarget, TargetUnion};
use etcdrs_proto::etcdserverpb::kv_server::Kv;
use etcdrs_proto::etcdserverpb::request_op::Request as OpRequest;
use etcdrs_proto::etcdserverpb::response_op::Response as OpResponse;
use etcdrs_proto::etcdserverpb::{
    Compare, DeleteRangeRequest, PutRequest, RangeRequest, RequestOp, TxnRequest, TxnResponse,
};
use etcdrs_proto::keys::prefix_end;
use etcdrs_proto::mvccpb::KeyValue;
use etcdrs_proto::mvccpb::event::EventType;
use serde_json::{Map, Value, json};
use tokio::sync::mpsc;

use crate::EtcdServer;
use crate::rpc::Rpc;

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

/// `path.Clean("/" + p)`.
fn clean(raw: &str) -> String {
    let mut parts: Vec<&str> = Vec::new();
    for seg in raw.split('/') {
        match seg {
            "" | "." => {}
            ".." => {
                parts.pop();
            }
            s => parts.push(s),
        }
    }
    format!("/{}", parts.join("/"))
}

fn file_key(path: &str) -> Vec<u8> {
    format!("{V3_PREFIX}{path}").into_bytes()
}

fn dir_key(path: &str) -> Vec<u8> {
    if path == "/" {
        format!("{V3_PREFIX}/").into_bytes()
    } else {
        format!("{V3_PREFIX}{path}/").into_bytes()
    }
}

/// The proper ancestors of `path` (`/a/b/c` → `/a`, `/a/b`).
fn ancestors(path: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut at = 0;
    while let Some(i) = path[at + 1..].find('/') {
        at += i + 1;
        out.push(path[..at].to_owned());
    }
    out
}

fn is_hidden(name: &str) -> bool {
    name.starts_with('_')
}

fn compare_create(key: Vec<u8>, result: CompareResult, rev: i64) -> Compare {
    Compare {
        result: result as i32,
        target: CompareTarget::Create as i32,
        key,
        target_union: Some(TargetUnion::CreateRevision(rev)),
        ..Compare::default()
    }
}

fn op_range(key: Vec<u8>, range_end: Vec<u8>) -> RequestOp {
    RequestOp {
        request: Some(OpRequest::RequestRange(RangeRequest {
            key,
            range_end,
            ..RangeRequest::default()
        })),
    }
}

fn op_put(key: Vec<u8>, value: Vec<u8>) -> RequestOp {
    RequestOp {
        request: Some(OpRequest::RequestPut(PutRequest {
            key,
            value,
            ..PutRequest::default()
        })),
    }
}

/// A file node's JSON.
fn file_json(path: &str, kv: &KeyValue, with_value: bool) -> Value {
    let mut node = Map::new();
    node.insert("key".into(), json!(path));
    if with_value {
        node.insert(
            "value".into(),
            json!(String::from_utf8_lossy(&kv.value).into_owned()),
        );
    }
    node.insert("modifiedIndex".into(), json!(kv.mod_revision));
    node.insert("createdIndex".into(), json!(kv.create_revision));
    Value::Object(node)
}

/// A directory as read from the v3 keyspace: its marker and everything below.
#[derive(Default)]
struct Tree {
    file: Option<KeyValue>,
    marker: Option<KeyValue>,
    children: std::collections::BTreeMap<String, Tree>,
}

impl Tree {
    fn insert(&mut self, rest: &str, kv: KeyValue) {
        match rest.split_once('/') {
            None => self.children.entry(rest.to_owned()).or_default().file = Some(kv),
            Some((name, "")) => self.children.entry(name.to_owned()).or_default().marker = Some(kv),
            Some((name, deeper)) => self
                .children
                .entry(name.to_owned())
                .or_default()
                .insert(deeper, kv),
        }
    }

    /// (created, modified) of a directory: its marker's, else its oldest descendant's.
    fn indices(&self) -> (i64, i64) {
        if let Some(m) = &self.marker {
            return (m.create_revision, m.mod_revision);
        }
        let created = self
            .children
            .values()
            .map(|c| c.file.as_ref().map_or(c.indices().0, |f| f.create_revision))
            .min()
            .unwrap_or(0);
        (created, created)
    }

    fn dir_json(&self, path: &str, depth: usize, recursive: bool) -> Value {
        let mut node = Map::new();
        if path != "/" {
            node.insert("key".into(), json!(path));
        }
        node.insert("dir".into(), json!(true));
        if depth == 0 || recursive {
            let nodes: Vec<Value> = self
                .children
                .iter()
                .filter(|(name, _)| !is_hidden(name))
                .map(|(name, child)| {
                    let child_path = if path == "/" {
                        format!("/{name}")
                    } else {
                        format!("{path}/{name}")
                    };
                    match &child.file {
                        Some(kv) => file_json(&child_path, kv, true),
                        None => child.dir_json(&child_path, depth + 1, recursive),
                    }
                })
                .collect();
            if !nodes.is_empty() {
                node.insert("nodes".into(), Value::Array(nodes));
            }
        }
        if path != "/" {
            let (created, modified) = self.indices();
            node.insert("modifiedIndex".into(), json!(modified));
            node.insert("createdIndex".into(), json!(created));
        }
        Value::Object(node)
    }
}

/// What a path is right now.
enum Found {
    Nothing,
    File(KeyValue),
    Dir(Box<Tree>),
}

impl Keys {
    fn index(&self) -> i64 {
        self.server.store().current_rev()
    }

    fn headers(&self, index: i64) -> HeaderMap {
        let mut headers = HeaderMap::new();
        headers.insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        );
        let status = self.server.raft_status();
        for (name, value) in [
            (
                "X-Etcd-Cluster-Id",
                crate::membership::id_hex(self.server.cluster_id()),
            ),
            ("X-Etcd-Index", index.to_string()),
            ("X-Raft-Index", status.commit.to_string()),
            ("X-Raft-Term", status.term.to_string()),
        ] {
            if let Ok(v) = HeaderValue::from_str(&value) {
                headers.insert(name, v);
            }
        }
        headers
    }

    fn reply(&self, status: StatusCode, index: i64, body: Value) -> Response {
        (status, self.headers(index), format!("{body}\n")).into_response()
    }

    fn error(&self, e: V2Error) -> Response {
        let index = if e.index == 0 { self.index() } else { e.index };
        let body = json!({
            "errorCode": e.code,
            "message": e.message(),
            "cause": e.cause,
            "index": index,
        });
        let mut headers = self.headers(index);
        headers.remove("X-Raft-Index");
        headers.remove("X-Raft-Term");
        (e.status(), headers, format!("{body}\n")).into_response()
    }

    async fn range(
        &self,
        key: Vec<u8>,
        range_end: Vec<u8>,
        quorum: bool,
    ) -> Result<Vec<KeyValue>, V2Error> {
        let req = RangeRequest {
            key,
            range_end,
            serializable: !quorum,
            ..RangeRequest::default()
        };
        let resp = Kv::range(&self.rpc, tonic::Request::new(req))
            .await
            .map_err(|s| V2Error::internal(s.message(), 0))?;
        Ok(resp.into_inner().kvs)
    }

    async fn txn(&self, req: TxnRequest) -> Result<TxnResponse, V2Error> {
        Kv::txn(&self.rpc, tonic::Request::new(req))
            .await
            .map(tonic::Response::into_inner)
            .map_err(|s| V2Error::internal(s.message(), 0))
    }

    async fn lookup(&self, path: &str, quorum: bool) -> Result<Found, V2Error> {
        if path != "/" {
            let file = self.range(file_key(path), Vec::new(), quorum).await?;
            if let Some(kv) = file.into_iter().next() {
                return Ok(Found::File(kv));
            }
        }
        let prefix = dir_key(path);
        let below = self
            .range(prefix.clone(), prefix_end(&prefix), quorum)
            .await?;
        if below.is_empty() && path != "/" {
            return Ok(Found::Nothing);
        }
        let mut tree = Tree::default();
        for kv in below {
            let rest = String::from_utf8_lossy(&kv.key[prefix.len()..]).into_owned();
            if rest.is_empty() {
                tree.marker = Some(kv);
            } else {
                tree.insert(&rest, kv);
            }
        }
        Ok(Found::Dir(Box::new(tree)))
    }

    async fn get(&self, path: &str, p: &Params) -> Result<Response, V2Error> {
        if p.wait {
            return self.wait(path, p).await;
        }
        let index = self.index();
        match self.lookup(path, p.quorum).await? {
            Found::Nothing => Err(V2Error::new(KEY_NOT_FOUND, path, index)),
            Found::File(kv) => Ok(self.reply(
                StatusCode::OK,
                index,
                json!({"action": "get", "node": file_json(path, &kv, true)}),
            )),
            Found::Dir(tree) => Ok(self.reply(
                StatusCode::OK,
                index,
                json!({"action": "get", "node": tree.dir_json(path, 0, p.recursive)}),
            )),
        }
    }

    /// PUT: set a file (or create a directory with `dir=true`).
    async fn put(&self, path: &str, p: &Params) -> Result<Response, V2Error> {
        if p.ttl {
            return Err(V2Error::new(INVALID_FIELD, "ttl is not supported", 0));
        }
        if path == "/" {
            return Err(V2Error::new(NOT_FILE, "/", 0));
        }
        let value = p.value.clone().unwrap_or_default();
        for _ in 0..WRITE_ATTEMPTS {
            // Which ancestors lack their directory marker (written with this node).
            let mut missing = Vec::new();
            for a in ancestors(path) {
                if self.range(dir_key(&a), Vec::new(), true).await?.is_empty() {
                    missing.push(a);
                }
            }
            let mut compare: Vec<Compare> = ancestors(path)
                .into_iter()
                .map(|a| compare_create(file_key(&a), CompareResult::Equal, 0))
                .collect();
            compare.push(compare_create(dir_key(path), CompareResult::Equal, 0));
            match p.prev_exist {
                Some(false) => {
                    compare.push(compare_create(file_key(path), CompareResult::Equal, 0))
                }
                Some(true) => {
                    compare.push(compare_create(file_key(path), CompareResult::Greater, 0))
                }
                None => {}
            }
            if p.dir {
                compare.push(compare_create(file_key(path), CompareResult::Equal, 0));
            }
            let mut success = vec![op_range(file_key(path), Vec::new())];
            success.push(if p.dir {
                op_put(dir_key(path), Vec::new())
            } else {
                op_put(file_key(path), value.clone().into_bytes())
            });
            success.extend(missing.iter().map(|a| op_put(dir_key(a), Vec::new())));
            let resp = self
                .txn(TxnRequest {
                    compare,
                    success,
                    failure: Vec::new(),
                })
                .await?;
            let index = resp.header.as_ref().map_or(0, |h| h.revision);
            if !resp.succeeded {
                self.put_conflict(path, p).await?;
                continue;
            }
            let prev = match resp.responses.first().and_then(|r| r.response.as_ref()) {
                Some(OpResponse::ResponseRange(r)) => r.kvs.first().cloned(),
                _ => None,
            };
            let action = match p.prev_exist {
                Some(false) => "create",
                Some(true) => "update",
                None => "set",
            };
            let mut body = Map::new();
            body.insert("action".into(), json!(action));
            let node = if p.dir {
                json!({"key": path, "dir": true, "modifiedIndex": index, "createdIndex": index})
            } else {
                let created = prev.as_ref().map_or(index, |kv| kv.create_revision);
                json!({"key": path, "value": value, "modifiedIndex": index, "createdIndex": created})
            };
            body.insert("node".into(), node);
            if let Some(prev) = &prev {
                body.insert("prevNode".into(), file_json(path, prev, true));
            }
            let status = if prev.is_some() {
                StatusCode::OK
            } else {
                StatusCode::CREATED
            };
            return Ok(self.reply(status, index, Value::Object(body)));
        }
        Err(V2Error::internal("too many concurrent changes", 0))
    }

    /// Why a PUT's compares failed; `Ok` when it was a race worth retrying.
    async fn put_conflict(&self, path: &str, p: &Params) -> Result<(), V2Error> {
        let index = self.index();
        for a in ancestors(path) {
            if !self.range(file_key(&a), Vec::new(), true).await?.is_empty() {
                return Err(V2Error::new(NOT_DIR, a, index));
            }
        }
        let file = !self
            .range(file_key(path), Vec::new(), true)
            .await?
            .is_empty();
        let dir = !self
            .range(dir_key(path), Vec::new(), true)
            .await?
            .is_empty();
        if dir {
            return Err(V2Error::new(
                if p.dir { NODE_EXIST } else { NOT_FILE },
                path,
                index,
            ));
        }
        match (p.prev_exist, file) {
            (Some(false), true) => Err(V2Error::new(NODE_EXIST, path, index)),
            (Some(true), false) => Err(V2Error::new(KEY_NOT_FOUND, path, index)),
            _ if p.dir && file => Err(V2Error::new(NOT_FILE, path, index)),
            _ => Ok(()),
        }
    }

    async fn delete(&self, path: &str, p: &Params) -> Result<Response, V2Error> {
        let index = self.index();
        let (compare, range_end, key, prev_json) = match self.lookup(path, true).await? {
            Found::Nothing => return Err(V2Error::new(KEY_NOT_FOUND, path, index)),
            Found::File(kv) => (
                vec![compare_create(
                    file_key(path),
                    CompareResult::Equal,
                    kv.create_revision,
                )],
                Vec::new(),
                file_key(path),
                file_json(path, &kv, true),
            ),
            Found::Dir(tree) => {
                if path == "/" {
                    return Err(V2Error::new(NOT_FILE, "/", index));
                }
                if !p.dir && !p.recursive {
                    return Err(V2Error::new(NOT_FILE, path, index));
                }
                if !p.recursive && !tree.children.is_empty() {
                    return Err(V2Error::new(DIR_NOT_EMPTY, path, index));
                }
                let prefix = dir_key(path);
                let mut prev = tree.dir_json(path, 1, false);
                if let Some(obj) = prev.as_object_mut() {
                    obj.remove("nodes");
                }
                (Vec::new(), prefix_end(&prefix), prefix, prev)
            }
        };
        let resp = self
            .txn(TxnRequest {
                compare,
                success: vec![RequestOp {
                    request: Some(OpRequest::RequestDeleteRange(DeleteRangeRequest {
                        key,
                        range_end,
                        ..DeleteRangeRequest::default()
                    })),
                }],
                failure: Vec::new(),
            })
            .await?;
        let index = resp.header.as_ref().map_or(0, |h| h.revision);
        if !resp.succeeded {
            return Err(V2Error::new(KEY_NOT_FOUND, path, index));
        }
        let created = prev_json.get("createdIndex").cloned().unwrap_or(json!(0));
        let mut node = Map::new();
        node.insert("key".into(), json!(path));
        if prev_json.get("dir").is_some() {
            node.insert("dir".into(), json!(true));
        }
        node.insert("modifiedIndex".into(), json!(index));
        node.insert("createdIndex".into(), created);
        Ok(self.reply(
            StatusCode::OK,
            index,
            json!({"action": "delete", "node": Value::Object(node), "prevNode": prev_json}),
        ))
    }

    /// A long poll: the first change at or after `waitIndex` (the next one without it) to
    /// `path`, or below it with `recursive=true`.
    async fn wait(&self, path: &str, p: &Params) -> Result<Response, V2Error> {
        let hub = self.server.watch_hub();
        let index = self.index();
        let start = p.wait_index.filter(|i| *i > 0).unwrap_or(index + 1);
        let key = file_key(path);
        let range = WatchRange {
            end: prefix_end(&key),
            key,
        };
        let (tx, mut rx) = mpsc::channel(16);
        let stream = hub.new_stream();
        // The watcher goes when the poll ends, answered or abandoned by the client.
        let _guard = CloseStream {
            server: self.server.clone(),
            stream,
        };
        if !hub.watch(stream, 1, range, Filters::default(), start, tx) {
            self.server.wake_watch_sync();
        }
        while let Some(msg) = rx.recv().await {
            match msg {
                HubMsg::Events { events, .. } => {
                    for event in events {
                        let event = event.event();
                        let Some(kv) = &event.kv else { continue };
                        let Some(event_path) = kv
                            .key
                            .strip_prefix(V3_PREFIX.as_bytes())
                            .map(|k| String::from_utf8_lossy(k).into_owned())
                        else {
                            continue;
                        };
                        if !wanted(path, &event_path, p.recursive) {
                            continue;
                        }
                        let node = if event.r#type == EventType::Delete as i32 {
                            json!({"key": event_path, "modifiedIndex": kv.mod_revision, "createdIndex": kv.create_revision})
                        } else {
                            file_json(&event_path, kv, true)
                        };
                        let action = if event.r#type == EventType::Delete as i32 {
                            "delete"
                        } else {
                            "set"
                        };
                        return Ok(self.reply(
                            StatusCode::OK,
                            index,
                            json!({"action": action, "node": node}),
                        ));
                    }
                }
                HubMsg::Compacted {
                    compact_revision, ..
                } => {
                    return Err(V2Error::new(
                        EVENT_INDEX_CLEARED,
                        format!(
                            "the requested history has been cleared [{compact_revision}/{start}]"
                        ),
                        index,
                    ));
                }
            }
        }
        Err(V2Error::internal("watcher closed", index))
    }
}

/// Whether a change to `event_path` answers a wait on `path`: the node itself, or (recursive)
/// a file below it whose name below `path` has no hidden element. Directory markers never do.
fn wanted(path: &str, event_path: &str, recursive: bool) -> bool {
    if event_path.ends_with('/') {
        return false;
    }
    if event_path == path {
        return true;
    }
    if !recursive {
        return false;
    }
    let below = if path == "/" {
        event_path.strip_prefix('/')
    } else {
        event_path
            .strip_prefix(path)
            .and_then(|rest| rest.strip_prefix('/'))
    };
    below.is_some_and(|rest| !rest.split('/').any(is_hidden))
}

/// Removes a long poll's watcher from the hub.
struct CloseStream {
    server: EtcdServer,
    stream: etcdrs_mvcc::StreamId,
}

impl Drop for CloseStream {
    fn drop(&mut self) {
        self.server.watch_hub().close_stream(self.stream);
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
        value: size.to_string().into_bytes(),
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_as_go_cleans_them() {
        assert_eq!(clean(""), "/");
        assert_eq!(clean("a//b/./c/../d/"), "/a/b/d");
        assert_eq!(ancestors("/a/b/c"), ["/a", "/a/b"]);
        assert!(ancestors("/a").is_empty());
    }

    #[test]
    fn waits_see_their_node_and_visible_descendants() {
        assert!(wanted("/d/t", "/d/t", false));
        assert!(!wanted("/d/t", "/d/t/m", false));
        assert!(wanted("/d/t", "/d/t/m", true));
        assert!(!wanted("/d/t", "/d/t/_config/size", true));
        assert!(!wanted("/d/t", "/d/t/x/", true));
        assert!(!wanted("/d/t", "/d/tt", true));
        assert!(wanted("/", "/a/b", true));
    }
}
