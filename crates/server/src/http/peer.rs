//! The peer port's handlers besides raft's, all of them (etcd `etcdhttp/peer.go`,
//! `lease/leasehttp/http.go`, the `hashKVHandler` of `corrupt.go`, 3.5's
//! `downgradeEnabledHandler`): `/members` and `/members/promote/`, `/members/hashkv`,
//! `/leases` and `/leases/internal`, and `/downgrade/enabled`, with the JSON and protobuf
//! bodies etcd's members send (`peer::wire`, shared with `peer::calls`, which makes the calls) and etcd's status
//! codes and Go's `http.Error` bodies (`etcdrs_rafthttp::go_error`). The raft routes are the
//! transport's (`etcdrs_rafthttp::routes`).

use axum::Router;
use axum::extract::{Request, State};
use axum::http::{Method, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::any;
use etcdrs_proto::etcdserverpb::{
    LeaseKeepAliveRequest, LeaseKeepAliveResponse, LeaseTimeToLiveResponse,
};
use etcdrs_rafthttp::{go_error, method_not_allowed};
use prost::Message as _;

use crate::EtcdServer;
use crate::peer::wire::{
    HashKvRequestJson, HashKvResponseJson, HeaderJson, LeaseInternalRequest, LeaseInternalResponse,
    MemberJson,
};

/// The largest request body a lease or hash call may carry.
const MAX_BODY: usize = 64 * 1024 * 1024;

/// The peer port's routes (etcd's peer mux), `/version` aside: the transport's raft routes
/// and the member's own.
pub fn routes(server: &EtcdServer) -> Router<EtcdServer> {
    let own = Router::new()
        .route("/members", any(members))
        .route("/members/hashkv", any(hash_kv))
        .route("/members/promote/", any(promote))
        .route("/members/promote/{*rest}", any(promote))
        .route("/leases", any(leases))
        .route("/leases/internal", any(leases))
        .route("/downgrade/enabled", any(downgrade_enabled));
    etcdrs_rafthttp::routes(server.peer_link().clone()).merge(own)
}

/// `response` with the cluster id header, as every peer handler of etcd's answers.
fn with_cluster_id(response: Response, server: &EtcdServer) -> Response {
    server.transport().with_cluster_id(response)
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

fn members_json(server: &EtcdServer) -> String {
    let mut members: Vec<MemberJson> = server.members();
    members.sort_by_key(|m| m.id);
    let mut body = serde_json::to_string(&members).unwrap_or_else(|_| "[]".to_owned());
    body.push('\n');
    body
}

/// `GET /members`: the cluster as this member knows it, with the cluster id in a header
/// (joining members use it; no cluster check, since they do not know the id yet).
async fn members(State(server): State<EtcdServer>, request: Request) -> Response {
    if request.method() != Method::GET {
        return method_not_allowed(Some("GET"));
    }
    let response = if request.uri().path() != "/members" {
        go_error(StatusCode::BAD_REQUEST, "bad path")
    } else {
        (
            [(header::CONTENT_TYPE, "application/json")],
            members_json(&server),
        )
            .into_response()
    };
    with_cluster_id(response, &server)
}

/// `POST /members/promote/<id>` (etcd 3.4's learner promotion forwarded to the leader).
async fn promote(State(server): State<EtcdServer>, request: Request) -> Response {
    if request.method() != Method::POST {
        return method_not_allowed(Some("POST"));
    }
    let id_text = request
        .uri()
        .path()
        .trim_start_matches("/members/promote/")
        .to_owned();
    let response = match id_text.parse::<u64>() {
        Err(_) => go_error(
            StatusCode::NOT_FOUND,
            &format!("member {id_text} not found in cluster"),
        ),
        Ok(id) => match server.promote_member(id).await {
            Ok(()) => (
                [(header::CONTENT_TYPE, "application/json")],
                members_json(&server),
            )
                .into_response(),
            Err(crate::ServerError::Etcd(e))
                if std::ptr::eq(e, &etcdrs_proto::rpctypes::MEMBER_NOT_FOUND) =>
            {
                go_error(StatusCode::NOT_FOUND, "membership: ID not found")
            }
            Err(crate::ServerError::Etcd(e))
                if std::ptr::eq(e, &etcdrs_proto::rpctypes::MEMBER_NOT_LEARNER) =>
            {
                go_error(
                    StatusCode::PRECONDITION_FAILED,
                    "membership: can only promote a learner member",
                )
            }
            Err(crate::ServerError::Etcd(e))
                if std::ptr::eq(e, &etcdrs_proto::rpctypes::LEARNER_NOT_READY) =>
            {
                go_error(StatusCode::PRECONDITION_FAILED, e.message)
            }
            Err(e) => go_error(StatusCode::INTERNAL_SERVER_ERROR, &e.to_string()),
        },
    };
    with_cluster_id(response, &server)
}

/// `GET /members/hashkv` with a JSON `HashKVRequest` body (etcd's `hashKVHandler`).
async fn hash_kv(State(server): State<EtcdServer>, request: Request) -> Response {
    if request.method() != Method::GET {
        return method_not_allowed(Some("GET"));
    }
    let Ok(bytes) = axum::body::to_bytes(request.into_body(), MAX_BODY).await else {
        return go_error(StatusCode::BAD_REQUEST, "error reading body");
    };
    let Ok(req) = serde_json::from_slice::<HashKvRequestJson>(&bytes) else {
        tracing::warn!("failed to unmarshal request");
        return go_error(StatusCode::BAD_REQUEST, "error unmarshalling request");
    };
    let hashed = match crate::etcd_server::corrupt::local_hash(&server, req.revision).await {
        Ok(hashed) => hashed,
        Err(e) => {
            tracing::warn!(requested_revision = req.revision, error = %e, "failed to get hashKV");
            return go_error(StatusCode::BAD_REQUEST, &e.to_string());
        }
    };
    let resp = HashKvResponseJson {
        header: Some(HeaderJson {
            revision: hashed.header.as_ref().map_or(0, |h| h.revision),
        }),
        hash: hashed.hash,
        compact_revision: hashed.compact_revision,
        hash_revision: hashed.hash_revision,
    };
    let body = serde_json::to_string(&resp).unwrap_or_default();
    with_cluster_id(
        ([(header::CONTENT_TYPE, "application/json")], body).into_response(),
        &server,
    )
}

fn protobuf(bytes: Vec<u8>) -> Response {
    ([(header::CONTENT_TYPE, "application/protobuf")], bytes).into_response()
}

/// `POST /leases` (renew on the leader) and `POST /leases/internal` (time to live), with
/// protobuf bodies (etcd's `leasehttp`).
async fn leases(State(server): State<EtcdServer>, request: Request) -> Response {
    if request.method() != Method::POST {
        return go_error(StatusCode::METHOD_NOT_ALLOWED, "Method Not Allowed");
    }
    let path = request.uri().path().to_owned();
    let Ok(bytes) = axum::body::to_bytes(request.into_body(), MAX_BODY).await else {
        return go_error(StatusCode::BAD_REQUEST, "error reading body");
    };
    if path == "/leases" {
        let Ok(req) = LeaseKeepAliveRequest::decode(bytes.as_ref()) else {
            return go_error(StatusCode::BAD_REQUEST, "error unmarshalling request");
        };
        if !server.raft_status().is_leader {
            return go_error(StatusCode::BAD_REQUEST, "not a primary lessor");
        }
        return match server.lease_renew(req.id).await {
            Ok(0) => go_error(StatusCode::NOT_FOUND, "lease not found"),
            Ok(ttl) => protobuf(
                LeaseKeepAliveResponse {
                    header: None,
                    id: req.id,
                    ttl,
                }
                .encode_to_vec(),
            ),
            Err(e) => go_error(StatusCode::BAD_REQUEST, &e.to_string()),
        };
    }
    let Ok(req) = LeaseInternalRequest::decode(bytes.as_ref()) else {
        return go_error(StatusCode::BAD_REQUEST, "error unmarshalling request");
    };
    let req = req.lease_time_to_live_request.unwrap_or_default();
    match server.lease_time_to_live_local(req).await {
        Ok(resp) if resp.ttl == -1 => go_error(StatusCode::NOT_FOUND, "lease not found"),
        Ok(resp) => protobuf(
            LeaseInternalResponse {
                lease_time_to_live_response: Some(LeaseTimeToLiveResponse {
                    header: Some(Default::default()),
                    ..resp
                }),
            }
            .encode_to_vec(),
        ),
        Err(e) => go_error(StatusCode::BAD_REQUEST, &e.to_string()),
    }
}
