//! The Cluster service (etcd `api/v3rpc/member.go`). Membership changes arrive with the
//! cluster work; a single member lists itself.

use etcdrs_proto::etcdserverpb::cluster_server::Cluster;
use etcdrs_proto::etcdserverpb::{
    Member, MemberAddRequest, MemberAddResponse, MemberListRequest, MemberListResponse,
    MemberPromoteRequest, MemberPromoteResponse, MemberRemoveRequest, MemberRemoveResponse,
    MemberUpdateRequest, MemberUpdateResponse,
};
use tonic::{Request, Response, Status};

use super::Rpc;

impl Rpc {
    fn member_pbs(&self) -> Vec<Member> {
        self.server
            .members()
            .into_iter()
            .map(|m| Member {
                id: m.id,
                name: m.name,
                peer_ur_ls: m.peer_urls,
                client_ur_ls: m.client_urls,
                is_learner: m.is_learner,
            })
            .collect()
    }
}

#[tonic::async_trait]
impl Cluster for Rpc {
    async fn member_add(
        &self,
        _request: Request<MemberAddRequest>,
    ) -> Result<Response<MemberAddResponse>, Status> {
        Err(Status::unimplemented("member add is not supported yet"))
    }

    async fn member_remove(
        &self,
        _request: Request<MemberRemoveRequest>,
    ) -> Result<Response<MemberRemoveResponse>, Status> {
        Err(Status::unimplemented("member remove is not supported yet"))
    }

    async fn member_update(
        &self,
        _request: Request<MemberUpdateRequest>,
    ) -> Result<Response<MemberUpdateResponse>, Status> {
        Err(Status::unimplemented("member update is not supported yet"))
    }

    async fn member_list(
        &self,
        request: Request<MemberListRequest>,
    ) -> Result<Response<MemberListResponse>, Status> {
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
        _request: Request<MemberPromoteRequest>,
    ) -> Result<Response<MemberPromoteResponse>, Status> {
        Err(Status::unimplemented("member promote is not supported yet"))
    }
}
