//! One-off calls to a peer's HTTP endpoints, as etcd makes them: the membership a joining
//! member fetches (`GET /members`, etcd's `getClusterFromRemotePeers`), lease renewals and
//! time-to-live forwarded to the leader (`leasehttp.RenewHTTP`, `TimeToLiveHTTP`), and the
//! hash the corruption checks compare (`getPeerHashKVHTTP`).

use std::time::Duration;

use axum::body::Body;
use axum::http::request::Builder as RequestBuilder;
use axum::http::{Method, StatusCode, header};
use bytes::Bytes;
use etcdrs_proto::etcdserverpb::{
    HashKvResponse, LeaseKeepAliveRequest, LeaseKeepAliveResponse, LeaseTimeToLiveRequest,
    LeaseTimeToLiveResponse, ResponseHeader,
};
use etcdrs_proto::rpctypes;
use prost::Message as _;

use etcdrs_rafthttp::{CLUSTER_ID_HEADER, PeerClient, Raft, Transport};

use super::wire::{
    HashKvRequestJson, HashKvResponseJson, LeaseInternalRequest, LeaseInternalResponse, MemberJson,
};
use crate::error::{Result, ServerError};

/// The largest answer a one-off call reads.
const MAX_ANSWER: usize = 16 * 1024 * 1024;

/// Who makes a call: anyone (no member headers: a joining member asking for the membership,
/// the version monitor), or this member, with etcd's headers.
#[derive(Clone, Copy)]
enum Caller<'a> {
    Anonymous(&'a PeerClient),
    /// This member's client, and what puts its headers on a request (the transport's stamp).
    Member(
        &'a PeerClient,
        &'a (dyn Fn(RequestBuilder) -> RequestBuilder + Sync),
    ),
}

/// One request to `url` + `path`; the status, the cluster id header and the body.
async fn call(
    caller: Caller<'_>,
    url: &str,
    method: Method,
    path: &str,
    content_type: &str,
    body: Vec<u8>,
    timeout: Duration,
) -> Result<(StatusCode, String, Bytes)> {
    let uri = format!("{}{path}", url.trim_end_matches('/'));
    let mut builder = axum::http::Request::builder()
        .method(method)
        .uri(&uri)
        .header(header::CONTENT_TYPE, content_type);
    let client = match caller {
        Caller::Anonymous(client) => client,
        Caller::Member(client, stamp) => {
            builder = stamp(builder);
            client
        }
    };
    let request = builder
        .body(Body::from(body))
        .map_err(|e| ServerError::Peer(format!("failed to make http request to {uri} ({e})")))?;
    let exchange = async {
        let response = client
            .request(request)
            .await
            .map_err(|e| ServerError::Peer(etcdrs_rafthttp::alert::transport_error_text(&e)))?;
        let status = response.status();
        let cluster = response
            .headers()
            .get(CLUSTER_ID_HEADER)
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default()
            .to_owned();
        let body = axum::body::to_bytes(Body::new(response.into_body()), MAX_ANSWER)
            .await
            .map_err(|e| ServerError::Peer(format!("reading the answer of {uri}: {e}")))?;
        Ok::<_, ServerError>((status, cluster, body))
    };
    tokio::time::timeout(timeout, exchange)
        .await
        .map_err(|_| ServerError::Peer(format!("timed out asking {uri}")))?
}

/// The cluster id and members a peer at `url` knows (`GET /members`).
pub async fn fetch_members(
    client: &PeerClient,
    url: &str,
    timeout: Duration,
) -> Result<(u64, Vec<MemberJson>)> {
    let (status, cluster, body) = call(
        Caller::Anonymous(client),
        url,
        Method::GET,
        "/members",
        "application/json",
        Vec::new(),
        timeout,
    )
    .await?;
    if status != StatusCode::OK {
        return Err(ServerError::Peer(format!(
            "unexpected status {} from {url}/members: {}",
            status.as_u16(),
            String::from_utf8_lossy(&body).trim_end()
        )));
    }
    let cluster_id = u64::from_str_radix(&cluster, 16)
        .map_err(|_| ServerError::Peer(format!("bad cluster id {cluster:?} from {url}")))?;
    let members = serde_json::from_slice(&body)
        .map_err(|e| ServerError::Peer(format!("bad members from {url}: {e}")))?;
    Ok((cluster_id, members))
}

/// Renew lease `id` on the leader `leader`: `Some(ttl)` (0 when the lease is gone), or
/// `None` when the leader could not answer (not the leader after all, unreachable).
pub async fn renew_lease<H: Raft>(
    transport: &Transport<H>,
    leader: u64,
    id: i64,
    timeout: Duration,
) -> Option<i64> {
    let url = transport.urls(leader)?.into_iter().next()?;
    let body = LeaseKeepAliveRequest { id }.encode_to_vec();
    let answer = call(
        Caller::Member(transport.client(), &|b| transport.stamp(b)),
        &url,
        Method::POST,
        "/leases",
        "application/protobuf",
        body,
        timeout,
    )
    .await
    .ok()?;
    match answer {
        (StatusCode::OK, _, body) => {
            let resp = LeaseKeepAliveResponse::decode(body.as_ref()).ok()?;
            (resp.id == id).then_some(resp.ttl)
        }
        (StatusCode::NOT_FOUND, _, _) => Some(0),
        _ => None,
    }
}

/// Lease `req.id`'s time to live as the leader's lessor sees it: `Some` answer (TTL -1 when
/// the lease is gone), `None` when the leader could not answer.
pub async fn lease_time_to_live<H: Raft>(
    transport: &Transport<H>,
    leader: u64,
    req: LeaseTimeToLiveRequest,
    timeout: Duration,
) -> Option<LeaseTimeToLiveResponse> {
    let url = transport.urls(leader)?.into_iter().next()?;
    let id = req.id;
    let body = LeaseInternalRequest {
        lease_time_to_live_request: Some(req),
    }
    .encode_to_vec();
    let answer = call(
        Caller::Member(transport.client(), &|b| transport.stamp(b)),
        &url,
        Method::POST,
        "/leases/internal",
        "application/protobuf",
        body,
        timeout,
    )
    .await
    .ok()?;
    match answer {
        (StatusCode::OK, _, body) => {
            let resp = LeaseInternalResponse::decode(body.as_ref())
                .ok()?
                .lease_time_to_live_response?;
            (resp.id == id).then_some(resp)
        }
        (StatusCode::NOT_FOUND, _, _) => Some(LeaseTimeToLiveResponse {
            header: None,
            id,
            ttl: -1,
            granted_ttl: 0,
            keys: Vec::new(),
        }),
        _ => None,
    }
}

/// Member `id`'s key-space hash at `revision` (`GET /members/hashkv`); etcd's compacted and
/// future-revision errors come back as theirs.
pub async fn hash_kv<H: Raft>(
    transport: &Transport<H>,
    id: u64,
    revision: i64,
    timeout: Duration,
) -> Result<HashKvResponse> {
    let url = transport
        .urls(id)
        .and_then(|urls| urls.into_iter().next())
        .ok_or_else(|| ServerError::Peer("no link to the peer".to_owned()))?;
    let body = serde_json::to_vec(&HashKvRequestJson { revision }).unwrap_or_default();
    let (status, _, body) = call(
        Caller::Member(transport.client(), &|b| transport.stamp(b)),
        &url,
        Method::GET,
        "/members/hashkv",
        "application/json",
        body,
        timeout,
    )
    .await?;
    let text = String::from_utf8_lossy(&body);
    if status == StatusCode::BAD_REQUEST {
        if text.contains("mvcc: required revision has been compacted") {
            return Err(ServerError::Etcd(&rpctypes::COMPACTED));
        }
        if text.contains("mvcc: required revision is a future revision") {
            return Err(ServerError::Etcd(&rpctypes::FUTURE_REV));
        }
    }
    if status != StatusCode::OK {
        return Err(ServerError::Peer(format!("unknown error: {text}")));
    }
    let resp: HashKvResponseJson = serde_json::from_slice(&body)
        .map_err(|e| ServerError::Peer(format!("bad hash answer from {url}: {e}")))?;
    Ok(HashKvResponse {
        header: resp.header.map(|h| ResponseHeader {
            revision: h.revision,
            ..Default::default()
        }),
        hash: resp.hash,
        compact_revision: resp.compact_revision,
        hash_revision: resp.hash_revision,
    })
}

/// A member's versions as its `/version` reports them (etcd's `version.Versions`).
#[derive(Debug, serde::Deserialize)]
pub struct Versions {
    /// Its server version.
    #[serde(rename = "etcdserver")]
    pub server: String,
}

/// The versions a member reports at the first of its peer URLs that answers (etcd's
/// `getVersion`, which the leader's version monitor asks of every member).
pub async fn fetch_version(
    client: &PeerClient,
    urls: &[String],
    timeout: Duration,
) -> Result<Versions> {
    let mut last = ServerError::Peer("the member has no peer URL".to_owned());
    for url in urls {
        let answer = call(
            Caller::Anonymous(client),
            url,
            Method::GET,
            "/version",
            "application/json",
            Vec::new(),
            timeout,
        )
        .await;
        match answer {
            Ok((StatusCode::OK, _, body)) => {
                return serde_json::from_slice(&body)
                    .map_err(|e| ServerError::Peer(format!("bad versions from {url}: {e}")));
            }
            Ok((status, _, _)) => {
                last = ServerError::Peer(format!(
                    "unexpected status {} from {url}/version",
                    status.as_u16()
                ))
            }
            Err(e) => last = e,
        }
    }
    Err(last)
}
