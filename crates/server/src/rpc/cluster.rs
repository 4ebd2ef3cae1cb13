//! The Cluster service (etcd `api/v3rpc/member.go`): membership listing and changes.

use etcdrs_proto::etcdserverpb::cluster_server::Cluster;
use etcdrs_proto::etcdserverpb::{
    Member, MemberAddRequest, MemberAddResponse, MemberListRequest, MemberListResponse,
    MemberPromoteRequest, MemberPromoteResponse, MemberRemoveRequest, MemberRemoveResponse,
    MemberUpdateRequest, MemberUpdateResponse,
};
use etcdrs_proto::rpctypes;
use tonic::{Request, Response, Status};

use super::Rpc;

impl Rpc {
    /// A membership change needs the root role (with auth on) and a voter to take it, as
    /// etcd's member handlers check before proposing.
    fn check_membership_change<T>(&self, request: &Request<T>) -> Result<(), Status> {
        self.server
            .auth()
            .check_admin(self.auth_info(request)?.as_ref())?;
        Ok(self.server.check_not_learner()?)
    }

    fn member_pbs(&self) -> Vec<Member> {
        self.server.members().into_iter().map(member_pb).collect()
    }
}

/// etcd accepts peer URLs that are http(s) with a host and a port.
fn check_urls(urls: &[String]) -> Result<Vec<String>, Status> {
    let mut out = Vec::with_capacity(urls.len());
    for raw in urls {
        let ok = url::Url::parse(raw).ok().filter(|u| {
            matches!(u.scheme(), "http" | "https")
                && u.host_str().is_some()
                && u.port_or_known_default().is_some()
                && (u.path().is_empty() || u.path() == "/")
        });
        let Some(url) = ok else {
            return Err(rpctypes::MEMBER_BAD_URLS.to_status());
        };
        out.push(crate::url_string(&url));
    }
    if out.is_empty() {
        return Err(rpctypes::MEMBER_BAD_URLS.to_status());
    }
    Ok(out)
}

#[tonic::async_trait]
impl Cluster for Rpc {
    async fn member_add(
        &self,
        request: Request<MemberAddRequest>,
    ) -> Result<Response<MemberAddResponse>, Status> {
        self.check_membership_change(&request)?;
        let req = request.into_inner();
        let urls = check_urls(&req.peer_ur_ls)?;
        let member = self.server.add_member(urls, req.is_learner).await?;
        Ok(Response::new(MemberAddResponse {
            header: Some(self.server.cluster_header()),
            member: Some(member_pb(member)),
            members: self.member_pbs(),
        }))
    }

    async fn member_remove(
        &self,
        request: Request<MemberRemoveRequest>,
    ) -> Result<Response<MemberRemoveResponse>, Status> {
        self.check_membership_change(&request)?;
        self.server.remove_member(request.into_inner().id).await?;
        Ok(Response::new(MemberRemoveResponse {
            header: Some(self.server.cluster_header()),
            members: self.member_pbs(),
        }))
    }

    async fn member_update(
        &self,
        request: Request<MemberUpdateRequest>,
    ) -> Result<Response<MemberUpdateResponse>, Status> {
        self.check_membership_change(&request)?;
        let req = request.into_inner();
        let urls = check_urls(&req.peer_ur_ls)?;
        self.server.update_member(req.id, urls).await?;
        Ok(Response::new(MemberUpdateResponse {
            header: Some(self.server.cluster_header()),
            members: self.member_pbs(),
        }))
    }

    async fn member_list(
        &self,
        request: Request<MemberListRequest>,
    ) -> Result<Response<MemberListResponse>, Status> {
        self.server.check_not_learner()?;
        if request.get_ref().linearizable {
            self.server.linearizable_barrier().await?;
        }
        Ok(Response::new(MemberListResponse {
            header: Some(self.server.cluster_header()),
            members: self.member_pbs(),
        }))
    }

    async fn member_promote(
        &self,
        request: Request<MemberPromoteRequest>,
    ) -> Result<Response<MemberPromoteResponse>, Status> {
        self.check_membership_change(&request)?;
        self.server.promote_member(request.into_inner().id).await?;
        Ok(Response::new(MemberPromoteResponse {
            header: Some(self.server.cluster_header()),
            members: self.member_pbs(),
        }))
    }
}

/// A member as the Cluster API shows it.
pub fn member_pb(m: etcdrs_schema::membership::Member) -> etcdrs_proto::etcdserverpb::Member {
    etcdrs_proto::etcdserverpb::Member {
        id: m.id,
        name: m.name,
        peer_ur_ls: m.peer_urls,
        client_ur_ls: m.client_urls,
        is_learner: m.is_learner,
    }
}
