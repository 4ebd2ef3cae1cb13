//! The Maintenance service (etcd `api/v3rpc/maintenance.go`): status, alarms,
//! defragmentation, the consistency hashes and snapshots.
//!
//! Work that reads the whole backend (hashes, the snapshot copy) runs on tokio's blocking
//! pool; the request awaits it. A snapshot is first written into a temporary file as etcd's
//! bbolt database ([`etcdrs_schema::etcd_db::snapshot`], so that etcd's tools and etcd itself can read
//! it) and then streamed from it in 32 KiB messages, read
//! as the client takes them, so memory stays bounded whatever the database size. As in etcd,
//! each message's `remaining_bytes` counts the image bytes still to come, and one last message
//! carries the SHA-256 of everything sent (with `remaining_bytes == 0`). The temporary file is
//! deleted when the stream ends or is dropped.

use std::pin::Pin;

use etcdrs_backend::{ImageDigest, Snapshot};
use etcdrs_proto::etcdserverpb::ResponseHeader;
use etcdrs_proto::etcdserverpb::alarm_request::AlarmAction;
use etcdrs_proto::etcdserverpb::maintenance_server::Maintenance;
use etcdrs_proto::etcdserverpb::{
    AlarmRequest, AlarmResponse, DefragmentRequest, DefragmentResponse, DowngradeRequest,
    DowngradeResponse, HashKvRequest, HashKvResponse, HashRequest, HashResponse, MoveLeaderRequest,
    MoveLeaderResponse, SnapshotRequest, SnapshotResponse, StatusRequest, StatusResponse,
};
use etcdrs_schema::version::SERVER_VERSION;
use futures::Stream;
use tokio::io::AsyncReadExt;
use tonic::{Request, Response, Status};

use super::Rpc;
use crate::error::ServerError;

type SnapshotStream = Pin<Box<dyn Stream<Item = Result<SnapshotResponse, Status>> + Send>>;

/// Bytes of database per snapshot message (etcd's `snapshotSendBufferSize`).
const SNAPSHOT_CHUNK: u64 = 32 * 1024;

/// A backend failure as the client sees it.
fn backend_error(e: etcdrs_backend::Error) -> ServerError {
    ServerError::Mvcc(etcdrs_mvcc::Error::Backend(e))
}

/// Run `work` on the blocking pool and wait for it.
async fn blocking<T: Send + 'static>(
    work: impl FnOnce() -> Result<T, ServerError> + Send + 'static,
) -> Result<T, ServerError> {
    tokio::task::spawn_blocking(work)
        .await
        .map_err(|e| ServerError::Fatal(format!("blocking task: {e}")))?
}

#[tonic::async_trait]
impl Maintenance for Rpc {
    async fn alarm(
        &self,
        request: Request<AlarmRequest>,
    ) -> Result<Response<AlarmResponse>, Status> {
        self.server.check_not_learner()?;
        // Raising an alarm (NOSPACE stops every write) or clearing one is the root role's,
        // with auth on; etcd takes both from anyone.
        if request.get_ref().action != AlarmAction::Get as i32 {
            let info = self.auth_info(&request)?;
            self.server.auth().check_admin(info.as_ref())?;
        }
        let req = request.into_inner();
        if req.action == AlarmAction::Get as i32 {
            return Ok(Response::new(AlarmResponse {
                header: Some(self.server.header(0)),
                alarms: self.server.alarms(),
            }));
        }
        let mut resp = self.server.request(req, None).await?;
        self.server.fill_header(&mut resp.header);
        Ok(Response::new(resp))
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
            // etcd's `Term()`: the last applied entry's, as in the header.
            raft_term: self.server.applied_term(),
            raft_applied_index: raft.applied,
            errors,
            db_size_in_use: backend.size_in_use() as i64,
            is_learner: self.server.check_not_learner().is_err(),
            storage_version: String::new(),
            db_size_quota: self.server.config().quota_bytes() as i64,
            downgrade_info: None,
        }))
    }

    async fn defragment(
        &self,
        request: Request<DefragmentRequest>,
    ) -> Result<Response<DefragmentResponse>, Status> {
        self.check_maintenance_admin(&request)?;
        self.server.check_not_learner()?;
        let backend = self.server.store().backend();
        let before = backend.size();
        tracing::info!(path = %backend.path().display(), "defragmenting");
        let started = std::time::Instant::now();
        tokio::task::block_in_place(|| backend.defragment()).map_err(backend_error)?;
        tracing::info!(
            current_db_size_bytes = before,
            new_db_size_bytes = backend.size(),
            took = ?started.elapsed(),
            "finished defragmenting directory"
        );
        // etcd answers Defragment and MoveLeader with an empty message: no header.
        Ok(Response::new(DefragmentResponse { header: None }))
    }

    async fn hash(&self, request: Request<HashRequest>) -> Result<Response<HashResponse>, Status> {
        self.check_maintenance_admin(&request)?;
        self.server.check_not_learner()?;
        let server = self.server.clone();
        let (hash, revision) = blocking(move || Ok(server.store().hash()?)).await?;
        Ok(Response::new(HashResponse {
            header: Some(self.server.header(revision)),
            hash,
        }))
    }

    async fn hash_kv(
        &self,
        request: Request<HashKvRequest>,
    ) -> Result<Response<HashKvResponse>, Status> {
        self.check_maintenance_admin(&request)?;
        self.server.check_not_learner()?;
        let rev = request.into_inner().revision;
        let server = self.server.clone();
        let hashed = blocking(move || Ok(server.store().hash_kv(rev)?)).await?;
        Ok(Response::new(HashKvResponse {
            header: Some(self.server.header(hashed.current_revision)),
            hash: hashed.hash,
            compact_revision: hashed.compact_revision,
            hash_revision: hashed.hash_revision,
        }))
    }

    type SnapshotStream = SnapshotStream;

    async fn snapshot(
        &self,
        request: Request<SnapshotRequest>,
    ) -> Result<Response<Self::SnapshotStream>, Status> {
        self.check_maintenance_admin(&request)?;
        self.server.check_not_learner()?;
        let server = self.server.clone();
        let snapshot = blocking(move || {
            // Everything answered before the request is in the image (etcd commits first).
            server.store().wait_committed();
            Ok::<_, crate::ServerError>(etcdrs_schema::etcd_db::snapshot(server.store().backend())?)
        })
        .await?;
        let file = snapshot.open().map_err(backend_error)?;
        tracing::info!(
            total_bytes = snapshot.size(),
            "sending database snapshot to client"
        );
        let sender = SnapshotSender {
            file: tokio::io::BufReader::with_capacity(
                etcdrs_schema::etcd_db::IMAGE_BUFFER,
                tokio::fs::File::from_std(file),
            ),
            sent: 0,
            total: snapshot.size(),
            snapshot,
            digest: Some(ImageDigest::new()),
            header: Some(self.server.header(0)),
        };
        let stream = futures::stream::unfold(sender, |mut sender| async move {
            let message = sender.next().await?;
            Some((message, sender))
        });
        Ok(Response::new(Box::pin(stream)))
    }

    async fn move_leader(
        &self,
        request: Request<MoveLeaderRequest>,
    ) -> Result<Response<MoveLeaderResponse>, Status> {
        self.server.check_not_learner()?;
        self.server
            .move_leader(request.into_inner().target_id)
            .await?;
        Ok(Response::new(MoveLeaderResponse { header: None }))
    }

    async fn downgrade(
        &self,
        request: Request<DowngradeRequest>,
    ) -> Result<Response<DowngradeResponse>, Status> {
        let request = request.into_inner();
        let version = self
            .server
            .downgrade(request.action, &request.version)
            .await?;
        let mut resp = DowngradeResponse {
            header: None,
            version,
        };
        self.server.fill_header(&mut resp.header);
        Ok(Response::new(resp))
    }
}

/// The state of one snapshot stream. Owns the temporary file's guard: the file goes when
/// the stream does.
struct SnapshotSender {
    /// Read a MiB at a time (a blocking read each), sent in etcd's 32 KiB messages.
    file: tokio::io::BufReader<tokio::fs::File>,
    /// Image bytes sent so far.
    sent: u64,
    /// Image bytes in all.
    total: u64,
    snapshot: Snapshot,
    /// `None` once the digest went out: the stream is over.
    digest: Option<ImageDigest>,
    /// Sent with the first message only.
    header: Option<ResponseHeader>,
}

impl SnapshotSender {
    /// The next message, `None` after the digest.
    async fn next(&mut self) -> Option<Result<SnapshotResponse, Status>> {
        let digest = self.digest.as_mut()?;
        if self.sent < self.total {
            let len = SNAPSHOT_CHUNK.min(self.total - self.sent) as usize;
            let mut blob = vec![0u8; len];
            if let Err(e) = self.file.read_exact(&mut blob).await {
                self.digest = None;
                let error = backend_error(etcdrs_backend::Error::Io(e));
                tracing::warn!(path = %self.snapshot.path().display(), error = %error, "failed to read snapshot");
                return Some(Err(error.into()));
            }
            digest.update(&blob);
            self.sent += len as u64;
            return Some(Ok(SnapshotResponse {
                header: self.header.take(),
                remaining_bytes: self.total - self.sent,
                blob,
                // The storage version etcd 3.6 reports; empty as in etcd 3.5.
                version: String::new(),
            }));
        }
        let sha = self.digest.take()?.finish();
        tracing::info!(
            total_bytes = self.total,
            "sent database snapshot and its sha256 checksum to client"
        );
        Some(Ok(SnapshotResponse {
            header: self.header.take(),
            remaining_bytes: 0,
            blob: sha.to_vec(),
            version: String::new(),
        }))
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
