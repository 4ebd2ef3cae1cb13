//! The Maintenance service (etcd `api/v3rpc/maintenance.go`): status and alarms here;
//! hashes, defragmentation and snapshots arrive with the maintenance work.

use std::pin::Pin;

use etcdrs_proto::etcdserverpb::alarm_request::AlarmAction;
use etcdrs_proto::etcdserverpb::maintenance_server::Maintenance;
use etcdrs_proto::etcdserverpb::{
    AlarmRequest, AlarmResponse, DefragmentRequest, DefragmentResponse, DowngradeRequest,
    DowngradeResponse, HashKvRequest, HashKvResponse, HashRequest, HashResponse, MoveLeaderRequest,
    MoveLeaderResponse, SnapshotRequest, SnapshotResponse, StatusRequest, StatusResponse,
};
use futures::Stream;
use tonic::{Request, Response, Status};

use super::Rpc;
use crate::etcd_server::ApplyOutput;
use crate::request::Op;
use crate::version::SERVER_VERSION;

type SnapshotStream = Pin<Box<dyn Stream<Item = Result<SnapshotResponse, Status>> + Send>>;

#[tonic::async_trait]
impl Maintenance for Rpc {
    async fn alarm(
        &self,
        request: Request<AlarmRequest>,
    ) -> Result<Response<AlarmResponse>, Status> {
        let req = request.into_inner();
        if req.action == AlarmAction::Get as i32 {
            return Ok(Response::new(AlarmResponse {
                header: Some(self.server.header(0)),
                alarms: self.server.alarms(),
            }));
        }
        match self.server.propose(Op::Alarm(req)).await? {
            ApplyOutput::Alarm(mut resp) => {
                self.server.fill_header(&mut resp.header);
                Ok(Response::new(resp))
            }
            _ => Err(Status::internal("etcdserver: unexpected apply result")),
        }
    }

    async fn status(
        &self,
        _request: Request<StatusRequest>,
    ) -> Result<Response<StatusResponse>, Status> {
        let raft = self.server.raft_status();
        let backend = self.server.store().backend();
        let errors = self
            .server
            .alarms()
            .iter()
            .map(|a| format!("memberID:{} alarm:{} ", a.member_id, alarm_name(a.alarm)))
            .collect();
        Ok(Response::new(StatusResponse {
            header: Some(self.server.header(0)),
            version: SERVER_VERSION.to_string(),
            db_size: backend.size() as i64,
            leader: raft.leader,
            raft_index: raft.commit,
            raft_term: raft.term,
            raft_applied_index: raft.applied,
            errors,
            db_size_in_use: backend.size_in_use() as i64,
            is_learner: false,
            storage_version: String::new(),
            db_size_quota: self.server.config().quota_bytes() as i64,
            downgrade_info: None,
        }))
    }

    async fn defragment(
        &self,
        _request: Request<DefragmentRequest>,
    ) -> Result<Response<DefragmentResponse>, Status> {
        let backend = self.server.store().backend();
        let before = backend.size();
        tracing::info!(path = %backend.path().display(), "defragmenting");
        let started = std::time::Instant::now();
        tokio::task::block_in_place(|| backend.defragment(std::time::Duration::from_secs(30)))
            .map_err(|e| Status::unknown(e.to_string()))?;
        tracing::info!(
            current_db_size_bytes = before,
            new_db_size_bytes = backend.size(),
            took = ?started.elapsed(),
            "finished defragmenting directory"
        );
        Ok(Response::new(DefragmentResponse {
            header: Some(self.server.header(0)),
        }))
    }

    async fn hash(&self, _request: Request<HashRequest>) -> Result<Response<HashResponse>, Status> {
        Err(Status::unimplemented("hash is not supported yet"))
    }

    async fn hash_kv(
        &self,
        _request: Request<HashKvRequest>,
    ) -> Result<Response<HashKvResponse>, Status> {
        Err(Status::unimplemented("hashkv is not supported yet"))
    }

    type SnapshotStream = SnapshotStream;

    async fn snapshot(
        &self,
        _request: Request<SnapshotRequest>,
    ) -> Result<Response<Self::SnapshotStream>, Status> {
        Err(Status::unimplemented("snapshot is not supported yet"))
    }

    async fn move_leader(
        &self,
        _request: Request<MoveLeaderRequest>,
    ) -> Result<Response<MoveLeaderResponse>, Status> {
        Err(Status::unimplemented("move leader is not supported yet"))
    }

    async fn downgrade(
        &self,
        _request: Request<DowngradeRequest>,
    ) -> Result<Response<DowngradeResponse>, Status> {
        Err(Status::unimplemented("downgrade is not supported yet"))
    }
}

/// etcd's name for an alarm type.
pub fn alarm_name(alarm: i32) -> &'static str {
    match alarm {
        1 => "NOSPACE",
        2 => "CORRUPT",
        _ => "NONE",
    }
}
