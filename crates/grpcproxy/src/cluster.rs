//! The Cluster service and the proxy's self-registration (etcd `grpcproxy/cluster.go`,
//! `register.go`).
//!
//! With `--resolver-prefix`, each proxy keeps `<prefix>/<advertise-client-url>` under a lease
//! of `--resolver-ttl` seconds (task `grpc-proxy register`), in the format etcd's gRPC naming
//! resolver writes (`{"Op":0,"Addr":..,"Metadata":"{\"Name\":<hostname>}"}`), so our proxies
//! and etcd's can share a prefix. MemberList then answers the live registered proxies, read
//! from the cluster on each call, so a proxy that died leaves the list when its lease expires;
//! without a prefix (or before any proxy registered) it answers this proxy alone. A client
//! that syncs its endpoints through a proxy thus finds proxies, not members. Member changes
//! go to the cluster.

use std::time::Duration;

use etcdrs_proto::etcdserverpb::cluster_client::ClusterClient;
use etcdrs_proto::etcdserverpb::cluster_server::Cluster;
use etcdrs_proto::etcdserverpb::kv_client::KvClient;
use etcdrs_proto::etcdserverpb::lease_client::LeaseClient;
use etcdrs_proto::etcdserverpb::{
    LeaseGrantRequest, LeaseKeepAliveRequest, LeaseRevokeRequest, Member, MemberAddRequest,
    MemberAddResponse, MemberListRequest, MemberListResponse, MemberPromoteRequest,
    MemberPromoteResponse, MemberRemoveRequest, MemberRemoveResponse, MemberUpdateRequest,
    MemberUpdateResponse, PutRequest, RangeRequest,
};
use tokio_util::sync::CancellationToken;
use tonic::{Request, Response, Status};

use crate::upstream::{Upstream, forward};
use etcdrs_proto::keys::prefix_end;

/// The Cluster service of the proxy.
#[derive(Clone)]
pub struct ClusterProxy {
    upstream: Upstream,
    /// `--resolver-prefix` (empty: none).
    prefix: String,
    /// `--advertise-client-url`.
    advertise: String,
}

/// This host's name, as etcd's proxy names itself.
pub fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|s| s.trim().to_owned())
        .unwrap_or_default()
}

/// The value etcd's naming resolver stores for a registered address.
fn registration_value(addr: &str) -> String {
    let metadata = serde_json::json!({ "Name": hostname() }).to_string();
    serde_json::json!({ "Op": 0, "Addr": addr, "Metadata": metadata }).to_string()
}

/// The member a registration value stands for (`None`: not a registration).
fn member_of(value: &[u8]) -> Option<Member> {
    let parsed: serde_json::Value = serde_json::from_slice(value).ok()?;
    let addr = parsed.get("Addr")?.as_str()?.to_owned();
    let name = parsed
        .get("Metadata")
        .and_then(|m| m.as_str())
        .and_then(|m| serde_json::from_str::<serde_json::Value>(m).ok())
        .and_then(|m| m.get("Name").and_then(|n| n.as_str()).map(str::to_owned))
        .unwrap_or_default();
    Some(Member {
        name,
        client_ur_ls: vec![addr],
        ..Default::default()
    })
}

impl ClusterProxy {
    /// The service over `upstream`.
    pub fn new(upstream: Upstream, prefix: String, advertise: String) -> Self {
        ClusterProxy {
            upstream,
            prefix,
            advertise,
        }
    }

    fn client(&self, ch: tonic::transport::Channel) -> ClusterClient<tonic::transport::Channel> {
        ClusterClient::new(ch).max_decoding_message_size(self.upstream.max_decoding())
    }

    /// The proxies registered under the prefix, in key order.
    async fn registered(&self) -> Result<Vec<Member>, Status> {
        let start = format!("{}/", self.prefix).into_bytes();
        let req = RangeRequest {
            range_end: prefix_end(&start),
            key: start,
            ..Default::default()
        };
        let resp = self
            .upstream
            .unary(|ch| {
                let mut client = KvClient::new(ch);
                let req = req.clone();
                async move { client.range(req).await }
            })
            .await?
            .into_inner();
        Ok(resp
            .kvs
            .iter()
            .filter_map(|kv| member_of(&kv.value))
            .collect())
    }
}

#[tonic::async_trait]
impl Cluster for ClusterProxy {
    async fn member_add(
        &self,
        request: Request<MemberAddRequest>,
    ) -> Result<Response<MemberAddResponse>, Status> {
        let req = request.get_ref().clone();
        self.upstream
            .unary(|ch| {
                let mut client = self.client(ch);
                let req = forward(&request, req.clone());
                async move { client.member_add(req).await }
            })
            .await
    }

    async fn member_remove(
        &self,
        request: Request<MemberRemoveRequest>,
    ) -> Result<Response<MemberRemoveResponse>, Status> {
        let req = *request.get_ref();
        self.upstream
            .unary(|ch| {
                let mut client = self.client(ch);
                let req = forward(&request, req);
                async move { client.member_remove(req).await }
            })
            .await
    }

    async fn member_update(
        &self,
        request: Request<MemberUpdateRequest>,
    ) -> Result<Response<MemberUpdateResponse>, Status> {
        let req = request.get_ref().clone();
        self.upstream
            .unary(|ch| {
                let mut client = self.client(ch);
                let req = forward(&request, req.clone());
                async move { client.member_update(req).await }
            })
            .await
    }

    async fn member_list(
        &self,
        _request: Request<MemberListRequest>,
    ) -> Result<Response<MemberListResponse>, Status> {
        if !self.prefix.is_empty() {
            let members = self.registered().await?;
            if !members.is_empty() {
                return Ok(Response::new(MemberListResponse {
                    members,
                    ..Default::default()
                }));
            }
        }
        Ok(Response::new(MemberListResponse {
            members: vec![Member {
                name: hostname(),
                client_ur_ls: vec![self.advertise.clone()],
                ..Default::default()
            }],
            ..Default::default()
        }))
    }

    async fn member_promote(
        &self,
        request: Request<MemberPromoteRequest>,
    ) -> Result<Response<MemberPromoteResponse>, Status> {
        let req = *request.get_ref();
        self.upstream
            .unary(|ch| {
                let mut client = self.client(ch);
                let req = forward(&request, req);
                async move { client.member_promote(req).await }
            })
            .await
    }
}

/// Task `grpc-proxy register`: keeps `<prefix>/<addr>` alive under a lease of `ttl` seconds
/// until `shutdown`, then revokes the lease so the proxy leaves the list at once. A lost
/// lease (the cluster was unreachable for longer than the TTL) is granted and written again.
pub async fn register(
    upstream: Upstream,
    prefix: String,
    addr: String,
    ttl: i64,
    shutdown: CancellationToken,
) {
    let key = format!("{prefix}/{addr}").into_bytes();
    let value = registration_value(&addr).into_bytes();
    let renew_every = Duration::from_millis((ttl.max(1) as u64) * 1000 / 3);
    loop {
        let lease = match grant_and_put(&upstream, &key, &value, ttl).await {
            Ok(lease) => lease,
            Err(e) => {
                tracing::warn!(error = %e.message(), "failed to register gRPC proxy");
                tokio::select! {
                    _ = shutdown.cancelled() => return,
                    _ = tokio::time::sleep(Duration::from_millis(500)) => continue,
                }
            }
        };
        tracing::info!(prefix = %prefix, address = %addr, "registered gRPC proxy");
        loop {
            tokio::select! {
                _ = shutdown.cancelled() => {
                    let revoke = upstream.unary(|ch| async move {
                        LeaseClient::new(ch).lease_revoke(LeaseRevokeRequest { id: lease }).await
                    });
                    let _ = tokio::time::timeout(Duration::from_secs(1), revoke).await;
                    return;
                }
                _ = tokio::time::sleep(renew_every) => {}
            }
            match keep_alive_once(&upstream, lease).await {
                Ok(remaining) if remaining > 0 => {}
                // The lease is gone: register again.
                Ok(_) => break,
                // The cluster is unreachable: try again at the next turn while the lease lives.
                Err(_) => {}
            }
        }
    }
}

async fn grant_and_put(
    upstream: &Upstream,
    key: &[u8],
    value: &[u8],
    ttl: i64,
) -> Result<i64, Status> {
    let grant = upstream
        .unary(|ch| async move {
            LeaseClient::new(ch)
                .lease_grant(LeaseGrantRequest { ttl, id: 0 })
                .await
        })
        .await?
        .into_inner();
    let put = PutRequest {
        key: key.to_vec(),
        value: bytes::Bytes::copy_from_slice(value),
        lease: grant.id,
        ..Default::default()
    };
    upstream
        .unary(|ch| {
            let put = put.clone();
            async move { KvClient::new(ch).put(put).await }
        })
        .await?;
    Ok(grant.id)
}

/// One keep-alive of `lease`: the TTL left (0 or less: the lease is gone).
async fn keep_alive_once(upstream: &Upstream, lease: i64) -> Result<i64, Status> {
    upstream
        .unary(|ch| async move {
            let mut client = LeaseClient::new(ch);
            let request = futures::stream::iter([LeaseKeepAliveRequest { id: lease }]);
            let mut stream = client.lease_keep_alive(request).await?.into_inner();
            match stream.message().await? {
                Some(resp) => Ok(resp.ttl),
                None => Ok(0),
            }
        })
        .await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn registration_round_trips_through_etcds_format() {
        let value = registration_value("127.0.0.1:23790");
        let member = member_of(value.as_bytes()).expect("a registration");
        assert_eq!(member.client_ur_ls, vec!["127.0.0.1:23790".to_owned()]);
        assert_eq!(member.name, hostname());
        // As etcd 3.4's proxy writes it.
        let etcd = br#"{"Op":0,"Addr":"10.0.0.1:23790","Metadata":"{\"Name\":\"host-a\"}"}"#;
        let member = member_of(etcd).expect("etcd's registration");
        assert_eq!(member.name, "host-a");
        assert!(member_of(b"not json").is_none());
    }
}
