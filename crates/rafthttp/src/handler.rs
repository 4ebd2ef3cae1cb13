//! The peer port's raft handlers, answering as etcd's do (etcd `rafthttp/http.go`): the
//! pipeline (`POST /raft`), the streams (`GET /raft/stream/...`), snapshots
//! (`POST /raft/snapshot`, in `receive`) and probing, with etcd's paths, methods, status codes,
//! headers and bodies (Go's `http.Error` bodies end in a newline), so that an etcd member and
//! ours understand each other's refusals. The member's other peer routes (membership, leases,
//! hashes) are the server's; they share [`go_error`] and the version checks.

use std::convert::Infallible;
use std::time::{SystemTime, UNIX_EPOCH};

use axum::Router;
use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{HeaderMap, Method, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::any;
use bytes::Bytes;
use futures::StreamExt;

use crate::receive::snapshot;
use crate::{
    CLUSTER_ID_HEADER, FROM_HEADER, MIN_CLUSTER_VERSION, MIN_CLUSTER_VERSION_HEADER, PAIRS_FORMAT,
    RAFT_TO_HEADER, Raft, Refusal, Running, SERVER_VERSION_HEADER, SNAPSHOT_FORMAT_HEADER,
    StreamType, Transport, codec, gate, id_hex,
};

/// The largest request body a pipeline post may carry.
const MAX_BODY: usize = 64 * 1024 * 1024;

/// The raft routes of the peer port (etcd's `rafthttp.Handler`), for a started transport.
pub fn routes<H: Raft, S>(running: Running<H>) -> Router<S> {
    Router::new()
        .route("/raft", any(pipeline::<H>))
        .route("/raft/{*rest}", any(raft_subtree::<H>))
        .with_state(running)
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
pub fn method_not_allowed(allow: Option<&'static str>) -> Response {
    let mut response = go_error(StatusCode::METHOD_NOT_ALLOWED, "Method Not Allowed");
    if let Some(allow) = allow {
        response
            .headers_mut()
            .insert(header::ALLOW, header::HeaderValue::from_static(allow));
    }
    response
}

impl<H: Raft> Transport<H> {
    /// `response` with this member's cluster id in etcd's header.
    pub fn with_cluster_id(&self, mut response: Response) -> Response {
        if let Ok(value) = header::HeaderValue::from_str(&id_hex(self.local.cluster_id)) {
            response.headers_mut().insert(CLUSTER_ID_HEADER, value);
        }
        response
    }

    /// etcd's `checkClusterCompatibilityFromHeader`: the sender's version must be within ours,
    /// and its cluster id ours. The error is the 412 body.
    pub fn check_compatibility(&self, headers: &HeaderMap) -> Result<(), &'static str> {
        let remote_name = headers
            .get(FROM_HEADER)
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default();
        let compatible = versions_compatible(
            self.local.server_version,
            major_minor(headers, SERVER_VERSION_HEADER),
            major_minor(headers, MIN_CLUSTER_VERSION_HEADER),
        );
        if !compatible {
            tracing::warn!(
                local_member_id = %id_hex(self.local.id),
                remote_peer_id = remote_name,
                "failed to check version compatibility"
            );
            return Err("incompatible version");
        }
        let remote_cluster = headers
            .get(CLUSTER_ID_HEADER)
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default();
        if remote_cluster != id_hex(self.local.cluster_id) {
            tracing::warn!(
                local_member_id = %id_hex(self.local.id),
                local_member_cluster_id = %id_hex(self.local.cluster_id),
                remote_peer_id = remote_name,
                remote_peer_cluster_id = remote_cluster,
                "request cluster ID mismatch"
            );
            return Err("cluster ID mismatch");
        }
        Ok(())
    }
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
    server_version: &str,
    remote_server: Option<(u64, u64)>,
    remote_min_cluster: Option<(u64, u64)>,
) -> bool {
    let local_server = local_major_minor(server_version);
    let local_min_cluster = local_major_minor(MIN_CLUSTER_VERSION);
    match (remote_server, remote_min_cluster) {
        (Some(server), Some(min_cluster)) => {
            server >= local_min_cluster && min_cluster <= local_server
        }
        _ => false,
    }
}

/// The label of the member with id `from` for per-peer series, if it is a member.
pub(crate) fn member_label<H: Raft>(host: &H, from: u64) -> Option<String> {
    host.is_member(from).then(|| id_hex(from))
}

/// `POST /raft`: one raft message (etcd's `pipelineHandler`).
async fn pipeline<H: Raft>(State(running): State<Running<H>>, request: Request) -> Response {
    if request.method() != Method::POST {
        return method_not_allowed(Some("POST"));
    }
    let response = pipeline_inner(&running, request).await;
    running.transport.with_cluster_id(response)
}

async fn pipeline_inner<H: Raft>(running: &Running<H>, request: Request) -> Response {
    let local = running.transport.local.id;
    if let Err(text) = running.transport.check_compatibility(request.headers()) {
        return go_error(StatusCode::PRECONDITION_FAILED, text);
    }
    let Ok(bytes) = axum::body::to_bytes(request.into_body(), MAX_BODY).await else {
        tracing::warn!(local_member_id = %id_hex(local), "failed to read Raft message");
        return go_error(StatusCode::BAD_REQUEST, "error reading raft message");
    };
    let message = match codec::decode_message(&bytes) {
        Ok(message) => message,
        Err(e) => {
            tracing::warn!(local_member_id = %id_hex(local), error = %e, "failed to unmarshal Raft message");
            return go_error(StatusCode::BAD_REQUEST, "error unmarshalling raft message");
        }
    };
    if let Some(label) = member_label(running.host.as_ref(), message.from) {
        crate::metrics::PEER_RECEIVED_BYTES
            .with_label_values(&[label.as_str()])
            .inc_by(bytes.len() as u64);
    }
    process(running, message).await
}

/// A peer's message through the gate, answered as etcd's handlers answer `Process`: 204, or
/// 403 with etcd's JSON error for a removed member, or 500.
pub(crate) async fn process<H: Raft>(
    running: &Running<H>,
    message: etcdrs_raftnode::eraftpb::Message,
) -> Response {
    match gate(running.host.as_ref(), message).await {
        Ok(()) => StatusCode::NO_CONTENT.into_response(),
        Err(Refusal::Removed) => (
            StatusCode::FORBIDDEN,
            [(header::CONTENT_TYPE, "application/json")],
            r#"{"message":"cannot process message from removed member"}"#,
        )
            .into_response(),
        Err(Refusal::Stopped) => {
            tracing::warn!(local_member_id = %id_hex(running.transport.local.id), error = "raft node stopped", "failed to process Raft message");
            go_error(
                StatusCode::INTERNAL_SERVER_ERROR,
                "error processing raft message",
            )
        }
    }
}

/// Everything under `/raft/`: streams, snapshots, probing (etcd's rafthttp mux).
async fn raft_subtree<H: Raft>(State(running): State<Running<H>>, request: Request) -> Response {
    let path = request.uri().path().to_owned();
    if path.starts_with("/raft/stream/") {
        return stream(&running, request).await;
    }
    match path.as_str() {
        "/raft/snapshot" => snapshot(&running, request).await,
        "/raft/probing" => probing(),
        _ => go_error(StatusCode::NOT_FOUND, "404 page not found"),
    }
}

/// `GET /raft/stream/{msgapp,message}/<from>` (etcd's `streamHandler`): a peer's reader
/// attaches to this member's writer to it; the response stays open and carries this
/// member's messages to the peer.
async fn stream<H: Raft>(running: &Running<H>, request: Request) -> Response {
    if request.method() != Method::GET {
        return method_not_allowed(Some("GET"));
    }
    let mut response = stream_inner(running, request).await;
    let headers = response.headers_mut();
    headers.insert(
        SERVER_VERSION_HEADER,
        header::HeaderValue::from_static(running.transport.local.server_version),
    );
    running.transport.with_cluster_id(response)
}

async fn stream_inner<H: Raft>(running: &Running<H>, request: Request) -> Response {
    let transport = &running.transport;
    let local = transport.local.id;
    if let Err(text) = transport.check_compatibility(request.headers()) {
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
        tracing::warn!(local_member_id = %id_hex(local), path = from_text, "failed to parse path into ID");
        return go_error(StatusCode::NOT_FOUND, "invalid from");
    };
    if running.host.is_removed(from) {
        tracing::warn!(
            local_member_id = %id_hex(local),
            remote_peer_id_from = %id_hex(from),
            "rejected stream from remote peer because it was removed"
        );
        return go_error(StatusCode::GONE, "removed member");
    }
    if !transport.has_peer(from) {
        tracing::warn!(
            local_member_id = %id_hex(local),
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
    if to != id_hex(local) {
        tracing::warn!(
            local_member_id = %id_hex(local),
            remote_peer_id_to = to,
            "ignored streaming request; ID mismatch"
        );
        return go_error(StatusCode::PRECONDITION_FAILED, "to field mismatch");
    }
    let takes_pairs = request
        .headers()
        .get(SNAPSHOT_FORMAT_HEADER)
        .is_some_and(|v| v.as_bytes() == PAIRS_FORMAT.as_bytes());
    let (tx, rx) = tokio::sync::mpsc::channel::<Bytes>(crate::link::CONN_BUF);
    if !transport.attach(from, kind, tx).await {
        return go_error(StatusCode::NOT_FOUND, "error sender not found");
    }
    transport.note_snapshot_format(from, takes_pairs);
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
    use std::time::Duration;

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
                "3.5.17",
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
