//! The peer port's HTTP handlers, answering as etcd's do (etcd `rafthttp/http.go`,
//! `etcdhttp/peer.go`, `lease/leasehttp/http.go`, the `hashKVHandler` of `corrupt.go`, 3.5's
//! `downgradeEnabledHandler`): the
//! same paths, methods, status codes, headers and bodies (Go's `http.Error` bodies end in a
//! newline), so that an etcd member and ours understand each other's refusals.
//!
//! Beyond etcd, a snapshot upload is accepted only from a member and only up to twice the
//! backend quota, within idle and total deadlines, and a refused upload leaves no file.//!
//! Layout: routing, version checks and the raft message paths are here; `snapshot` takes
//! snapshot uploads, `members` the membership, hash and lease calls.

use std::convert::Infallible;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use axum::Router;
use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{HeaderMap, Method, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::any;
use bytes::{Bytes, BytesMut};
use etcdrs_proto::etcdserverpb::{
    LeaseKeepAliveRequest, LeaseKeepAliveResponse, LeaseTimeToLiveRequest, LeaseTimeToLiveResponse,
};
use etcdrs_raftnode::eraftpb::MessageType;
use futures::StreamExt;
use prost::Message as _;
use serde::{Deserialize, Serialize};
use tokio::io::AsyncWriteExt;

use super::codec;
use super::{
    CLUSTER_ID_HEADER, FROM_HEADER, MIN_CLUSTER_VERSION, MIN_CLUSTER_VERSION_HEADER,
    RAFT_TO_HEADER, SERVER_VERSION_HEADER, StreamType,
};
use crate::EtcdServer;
use crate::membership::id_hex;
mod members;
mod snapshot;

pub use self::members::{
    HashKvRequestJson, HashKvResponseJson, HeaderJson, LeaseInternalRequest, LeaseInternalResponse,
    MemberJson,
};
use self::members::{hash_kv, leases, members, promote};
use self::snapshot::snapshot;

/// The largest request body a pipeline post, lease or hash call may carry.
const MAX_BODY: usize = 64 * 1024 * 1024;

/// The peer port's routes (etcd's peer mux), `/version` aside.
pub fn routes() -> Router<EtcdServer> {
    Router::new()
        .route("/raft", any(pipeline))
        .route("/raft/{*rest}", any(raft_subtree))
        .route("/members", any(members))
        .route("/members/hashkv", any(hash_kv))
        .route("/members/promote/", any(promote))
        .route("/members/promote/{*rest}", any(promote))
        .route("/leases", any(leases))
        .route("/leases/internal", any(leases))
        .route("/downgrade/enabled", any(downgrade_enabled))
}

/// `GET /downgrade/enabled` (etcd 3.5): whether a downgrade is under way, after a
/// linearizable read.
async fn downgrade_enabled(State(server): State<EtcdServer>, request: Request) -> Response {
    if request.method() != Method::GET {
        return method_not_allowed(Some("GET"));
    }
    let response = match server.linearizable_barrier().await {
        Ok(()) => {
            let enabled = if server.downgrade_target().is_some() {
                "true"
            } else {
                "false"
            };
            ([(header::CONTENT_TYPE, "text/plain")], enabled).into_response()
        }
        Err(e) => go_error(
            StatusCode::INTERNAL_SERVER_ERROR,
            &format!("failed linearized read: {e}"),
        ),
    };
    with_cluster_id(response, &server)
}

/// Go's `http.Error`: the text and a newline, as plain text.
pub fn go_error(status: StatusCode, text: &str) -> Response {
    (
        status,
        [
            (header::CONTENT_TYPE, "text/plain; charset=utf-8"),
            (header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
        ],
        format!("{text}\n"),
    )
        .into_response()
}

/// `http.Error(w, "Method Not Allowed", 405)`, with `Allow` when etcd sets it.
fn method_not_allowed(allow: Option<&'static str>) -> Response {
    let mut response = go_error(StatusCode::METHOD_NOT_ALLOWED, "Method Not Allowed");
    if let Some(allow) = allow {
        response
            .headers_mut()
            .insert(header::ALLOW, header::HeaderValue::from_static(allow));
    }
    response
}

fn with_cluster_id(mut response: Response, server: &EtcdServer) -> Response {
    if let Ok(value) = header::HeaderValue::from_str(&id_hex(server.cluster_id())) {
        response.headers_mut().insert(CLUSTER_ID_HEADER, value);
    }
    response
}

/// Major and minor of a version header, absent meaning etcd 2.0.0; `None` when unparsable.
fn major_minor(headers: &HeaderMap, name: &str) -> Option<(u64, u64)> {
    let text = match headers.get(name) {
        None => "2.0.0",
        Some(value) => value.to_str().ok()?,
    };
    let mut parts = text.split(['.', '-', '+']);
    let major = parts.next()?.parse().ok()?;
    let minor = parts.next()?.parse().ok()?;
    Some((major, minor))
}

fn local_major_minor(version: &str) -> (u64, u64) {
    let mut parts = version.split('.').map(|p| p.parse::<u64>().unwrap_or(0));
    (parts.next().unwrap_or(0), parts.next().unwrap_or(0))
}

/// etcd's `checkVersionCompatibility` on major.minor: the peer's server version is at least
/// our minimum cluster version, and its minimum cluster version at most our server version.
/// A version that does not parse is incompatible (etcd would panic on it).
fn versions_compatible(
    remote_server: Option<(u64, u64)>,
    remote_min_cluster: Option<(u64, u64)>,
) -> bool {
    let local_server = local_major_minor(crate::version::SERVER_VERSION);
    let local_min_cluster = local_major_minor(MIN_CLUSTER_VERSION);
    match (remote_server, remote_min_cluster) {
        (Some(server), Some(min_cluster)) => {
            server >= local_min_cluster && min_cluster <= local_server
        }
        _ => false,
    }
}

/// etcd's `checkClusterCompatibilityFromHeader`: the sender's version must be within ours,
/// and its cluster id ours. The error is the 412 body.
pub fn check_compatibility(server: &EtcdServer, headers: &HeaderMap) -> Result<(), &'static str> {
    let remote_name = headers
        .get(FROM_HEADER)
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default();
    let compatible = versions_compatible(
        major_minor(headers, SERVER_VERSION_HEADER),
        major_minor(headers, MIN_CLUSTER_VERSION_HEADER),
    );
    if !compatible {
        tracing::warn!(
            local_member_id = %id_hex(server.member_id()),
            remote_peer_id = remote_name,
            "failed to check version compatibility"
        );
        return Err("incompatible version");
    }
    let remote_cluster = headers
        .get(CLUSTER_ID_HEADER)
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default();
    if remote_cluster != id_hex(server.cluster_id()) {
        tracing::warn!(
            local_member_id = %id_hex(server.member_id()),
            local_member_cluster_id = %id_hex(server.cluster_id()),
            remote_peer_id = remote_name,
            remote_peer_cluster_id = remote_cluster,
            "request cluster ID mismatch"
        );
        return Err("cluster ID mismatch");
    }
    Ok(())
}

/// The label of the member with hex id `from` for per-peer series, if it is a member.
fn member_label(server: &EtcdServer, from: &str) -> Option<String> {
    let id = u64::from_str_radix(from, 16).ok()?;
    server.is_member(id).then(|| id_hex(id))
}

/// `POST /raft`: one raft message (etcd's `pipelineHandler`).
async fn pipeline(State(server): State<EtcdServer>, request: Request) -> Response {
    if request.method() != Method::POST {
        return method_not_allowed(Some("POST"));
    }
    with_cluster_id(pipeline_inner(&server, request).await, &server)
}

async fn pipeline_inner(server: &EtcdServer, request: Request) -> Response {
    if let Err(text) = check_compatibility(server, request.headers()) {
        return go_error(StatusCode::PRECONDITION_FAILED, text);
    }
    let Ok(bytes) = axum::body::to_bytes(request.into_body(), MAX_BODY).await else {
        tracing::warn!(local_member_id = %id_hex(server.member_id()), "failed to read Raft message");
        return go_error(StatusCode::BAD_REQUEST, "error reading raft message");
    };
    let message = match codec::decode_message(&bytes) {
        Ok(message) => message,
        Err(e) => {
            tracing::warn!(local_member_id = %id_hex(server.member_id()), error = %e, "failed to unmarshal Raft message");
            return go_error(StatusCode::BAD_REQUEST, "error unmarshalling raft message");
        }
    };
    if let Some(label) = member_label(server, &id_hex(message.from)) {
        crate::metrics::PEER_RECEIVED_BYTES
            .with_label_values(&[label.as_str()])
            .inc_by(bytes.len() as u64);
    }
    process(server, message).await.unwrap_or_else(|r| r)
}

/// etcd's `EtcdServer.Process`: a removed member's message is refused with 403 and
/// etcd's JSON error; otherwise raft steps it.
async fn process(
    server: &EtcdServer,
    message: etcdrs_raftnode::eraftpb::Message,
) -> Result<Response, Response> {
    if server.is_removed_member(message.from) {
        return Err((
            StatusCode::FORBIDDEN,
            [(header::CONTENT_TYPE, "application/json")],
            r#"{"message":"cannot process message from removed member"}"#,
        )
            .into_response());
    }
    if is_local(message.get_msg_type()) {
        return Ok(StatusCode::NO_CONTENT.into_response());
    }
    match server.raft_step(message).await {
        Ok(()) => Ok(StatusCode::NO_CONTENT.into_response()),
        Err(e) => {
            tracing::warn!(local_member_id = %id_hex(server.member_id()), error = %e, "failed to process Raft message");
            Err(go_error(
                StatusCode::INTERNAL_SERVER_ERROR,
                "error processing raft message",
            ))
        }
    }
}

/// Raft's local messages, which never come from a peer: etcd's raft ignores them, and they
/// are not stepped.
pub(crate) fn is_local(kind: MessageType) -> bool {
    matches!(
        kind,
        MessageType::MsgHup
            | MessageType::MsgBeat
            | MessageType::MsgUnreachable
            | MessageType::MsgSnapStatus
            | MessageType::MsgCheckQuorum
    )
}

/// Everything under `/raft/`: streams, snapshots, probing (etcd's rafthttp mux).
async fn raft_subtree(State(server): State<EtcdServer>, request: Request) -> Response {
    let path = request.uri().path().to_owned();
    if path.starts_with("/raft/stream/") {
        return stream(&server, request).await;
    }
    match path.as_str() {
        "/raft/snapshot" => snapshot(&server, request).await,
        "/raft/probing" => probing(),
        _ => go_error(StatusCode::NOT_FOUND, "404 page not found"),
    }
}

/// `GET /raft/stream/{msgapp,message}/<from>` (etcd's `streamHandler`): a peer's reader
/// attaches to this member's writer to it; the response stays open and carries this
/// member's messages to the peer.
async fn stream(server: &EtcdServer, request: Request) -> Response {
    if request.method() != Method::GET {
        return method_not_allowed(Some("GET"));
    }
    let mut response = stream_inner(server, request).await;
    let headers = response.headers_mut();
    headers.insert(
        SERVER_VERSION_HEADER,
        header::HeaderValue::from_static(crate::version::SERVER_VERSION),
    );
    with_cluster_id(response, server)
}

async fn stream_inner(server: &EtcdServer, request: Request) -> Response {
    if let Err(text) = check_compatibility(server, request.headers()) {
        return go_error(StatusCode::PRECONDITION_FAILED, text);
    }
    let path = request.uri().path();
    let (dir, from_text) = path.rsplit_once('/').unwrap_or(("", path));
    let kind = match dir {
        "/raft/stream/msgapp" => StreamType::MsgAppV2,
        "/raft/stream/message" => StreamType::Message,
        _ => {
            tracing::debug!(path, "ignored unexpected streaming request path");
            return go_error(StatusCode::NOT_FOUND, "invalid path");
        }
    };
    let Ok(from) = u64::from_str_radix(from_text, 16) else {
        tracing::warn!(local_member_id = %id_hex(server.member_id()), path = from_text, "failed to parse path into ID");
        return go_error(StatusCode::NOT_FOUND, "invalid from");
    };
    if server.is_removed_member(from) {
        tracing::warn!(
            local_member_id = %id_hex(server.member_id()),
            remote_peer_id_from = %id_hex(from),
            "rejected stream from remote peer because it was removed"
        );
        return go_error(StatusCode::GONE, "removed member");
    }
    let transport = server.transport();
    if !transport.has_peer(from) {
        tracing::warn!(
            local_member_id = %id_hex(server.member_id()),
            remote_peer_id_from = %id_hex(from),
            "failed to find remote peer in cluster"
        );
        return go_error(StatusCode::NOT_FOUND, "error sender not found");
    }
    let to = request
        .headers()
        .get(RAFT_TO_HEADER)
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default();
    if to != id_hex(server.member_id()) {
        tracing::warn!(
            local_member_id = %id_hex(server.member_id()),
            remote_peer_id_to = to,
            "ignored streaming request; ID mismatch"
        );
        return go_error(StatusCode::PRECONDITION_FAILED, "to field mismatch");
    }
    let (tx, rx) = tokio::sync::mpsc::channel::<Bytes>(super::link::CONN_BUF);
    if !transport.attach(from, kind, tx).await {
        return go_error(StatusCode::NOT_FOUND, "error sender not found");
    }
    let body = tokio_stream::wrappers::ReceiverStream::new(rx).map(Ok::<_, Infallible>);
    (StatusCode::OK, Body::from_stream(body)).into_response()
}

/// `GET /raft/probing` (the prober's `probing.NewHandler`): Go's JSON of
/// `Health{OK: true, Now: time.Now()}`.
fn probing() -> Response {
    let body = format!(
        "{{\"OK\":true,\"Now\":\"{}\"}}\n",
        rfc3339_nano(SystemTime::now())
    );
    (
        StatusCode::OK,
        [(header::CONTENT_TYPE, "text/plain; charset=utf-8")],
        body,
    )
        .into_response()
}

/// A time as Go's `time.Time` marshals to JSON in UTC (RFC 3339 with nanoseconds, trailing
/// zeros dropped).
fn rfc3339_nano(time: SystemTime) -> String {
    let since = time.duration_since(UNIX_EPOCH).unwrap_or_default();
    let secs = since.as_secs();
    let days = (secs / 86_400) as i64;
    let rem = secs % 86_400;
    // Howard Hinnant's civil_from_days.
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    let mut out = format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    );
    let nanos = since.subsec_nanos();
    if nanos > 0 {
        let fraction = format!("{nanos:09}");
        out.push('.');
        out.push_str(fraction.trim_end_matches('0'));
    }
    out.push('Z');
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_are_compatible_as_etcd_decides() {
        let version = |server: &str, min: Option<&str>| {
            let mut headers = HeaderMap::new();
            headers.insert(SERVER_VERSION_HEADER, server.parse().expect("ascii"));
            if let Some(min) = min {
                headers.insert(MIN_CLUSTER_VERSION_HEADER, min.parse().expect("ascii"));
            }
            versions_compatible(
                major_minor(&headers, SERVER_VERSION_HEADER),
                major_minor(&headers, MIN_CLUSTER_VERSION_HEADER),
            )
        };
        // etcd 3.4 and 3.5 peers; a 3.6 peer that still accepts 3.0 clusters.
        assert!(version("3.4.23", Some("3.0.0")));
        assert!(version("3.5.29", Some("3.0.0")));
        assert!(version("3.6.0", Some("3.0.0")));
        // Too old a server; a peer that requires a cluster newer than us; garbage.
        assert!(!version("2.3.8", Some("2.0.0")));
        assert!(!version("3.7.0", Some("3.6.0")));
        assert!(!version("x", Some("3.0.0")));
        // No minimum cluster version header means etcd 2.0.0.
        assert!(version("3.4.0", None));
    }

    #[test]
    fn time_as_go_marshals_it() {
        let t = UNIX_EPOCH + Duration::new(1_700_000_000, 120_000_000);
        assert_eq!(rfc3339_nano(t), "2023-11-14T22:13:20.12Z");
        assert_eq!(
            rfc3339_nano(UNIX_EPOCH + Duration::from_secs(951_782_400)),
            "2000-02-29T00:00:00Z"
        );
    }
}
