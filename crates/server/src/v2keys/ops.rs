//! The v2 operations (get, put, delete, wait) as v3 ranges, transactions and watches: each
//! precondition (no file where a directory must be, `prevExist`) is a compare in the same
//! transaction as the write, retried when a concurrent write changed the tree; a wait is a
//! watcher in the server's hub from `waitIndex`. Also the v2 headers and error replies.

use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse as _, Response};
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

use super::node::{Tree, ancestors, dir_key, file_json, file_key, wanted};
use super::{
    DIR_NOT_EMPTY, EVENT_INDEX_CLEARED, INVALID_FIELD, KEY_NOT_FOUND, Keys, NODE_EXIST, NOT_DIR,
    NOT_FILE, Params, V2Error, V3_PREFIX, WRITE_ATTEMPTS,
};
use crate::EtcdServer;

pub(super) fn compare_create(key: Vec<u8>, result: CompareResult, rev: i64) -> Compare {
    Compare {
        result: result as i32,
        target: CompareTarget::Create as i32,
        key,
        target_union: Some(TargetUnion::CreateRevision(rev)),
        ..Compare::default()
    }
}

pub(super) fn op_range(key: Vec<u8>, range_end: Vec<u8>) -> RequestOp {
    RequestOp {
        request: Some(OpRequest::RequestRange(RangeRequest {
            key,
            range_end,
            ..RangeRequest::default()
        })),
    }
}

pub(super) fn op_put(key: Vec<u8>, value: Vec<u8>) -> RequestOp {
    RequestOp {
        request: Some(OpRequest::RequestPut(PutRequest {
            key,
            value: value.into(),
            ..PutRequest::default()
        })),
    }
}

/// What a path is right now.
pub(super) enum Found {
    Nothing,
    File(KeyValue),
    Dir(Box<Tree>),
}

impl Keys {
    pub(super) fn index(&self) -> i64 {
        self.server.store().current_rev()
    }

    pub(super) fn headers(&self, index: i64) -> HeaderMap {
        let mut headers = HeaderMap::new();
        headers.insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        );
        let status = self.server.raft_status();
        for (name, value) in [
            (
                "X-Etcd-Cluster-Id",
                etcdrs_schema::membership::id_hex(self.server.cluster_id()),
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

    pub(super) fn reply(&self, status: StatusCode, index: i64, body: Value) -> Response {
        (status, self.headers(index), format!("{body}\n")).into_response()
    }

    pub(super) fn error(&self, e: V2Error) -> Response {
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

    pub(super) async fn range(
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

    pub(super) async fn txn(&self, req: TxnRequest) -> Result<TxnResponse, V2Error> {
        Kv::txn(&self.rpc, tonic::Request::new(req))
            .await
            .map(tonic::Response::into_inner)
            .map_err(|s| V2Error::internal(s.message(), 0))
    }

    pub(super) async fn lookup(&self, path: &str, quorum: bool) -> Result<Found, V2Error> {
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

    pub(super) async fn get(&self, path: &str, p: &Params) -> Result<Response, V2Error> {
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
    pub(super) async fn put(&self, path: &str, p: &Params) -> Result<Response, V2Error> {
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
    pub(super) async fn put_conflict(&self, path: &str, p: &Params) -> Result<(), V2Error> {
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

    pub(super) async fn delete(&self, path: &str, p: &Params) -> Result<Response, V2Error> {
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
    pub(super) async fn wait(&self, path: &str, p: &Params) -> Result<Response, V2Error> {
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

/// Removes a long poll's watcher from the hub.
pub(super) struct CloseStream {
    server: EtcdServer,
    stream: etcdrs_mvcc::StreamId,
}

impl Drop for CloseStream {
    fn drop(&mut self) {
        self.server.watch_hub().close_stream(self.stream);
    }
}
