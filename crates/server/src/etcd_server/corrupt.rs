//! etcd's corruption checks (`etcdserver/corrupt.go`): members compare the hash of their key
//! space at one revision (`HashKV`, the same value `etcdctl endpoint hashkv` prints, asked over the peer port's
//! `/members/hashkv` as etcd does), which is
//! equal on every member that applied the same history.
//!
//! - **At start** (`--experimental-initial-corrupt-check`): before the member serves clients it
//!   asks every peer for its hash at the member's own revision; a peer with another hash and
//!   the same compacted revision means this member's data differs, and it refuses to start
//!   (`<id> found data inconsistency with peers`). Peers that cannot answer (down, behind,
//!   compacted past the revision) are logged and skipped, as etcd does.
//! - **Periodically** (`--experimental-corrupt-check-time`): the leader compares its hash with
//!   every follower's at its revision and raises the CORRUPT alarm for a follower that
//!   differs. While the alarm stands the cluster refuses writes with
//!   `etcdserver: corrupt cluster` (the applier's check), and `/readyz` fails.

use std::time::Duration;

use etcdrs_proto::etcdserverpb::alarm_request::AlarmAction;
use etcdrs_proto::etcdserverpb::{AlarmRequest, AlarmType, HashKvResponse};
use etcdrs_proto::rpctypes;
use etcdrs_schema::membership::id_hex;
use tokio_util::sync::CancellationToken;

use super::EtcdServer;
use crate::error::{Result, ServerError};
use crate::request::Op;

/// How long a peer has to answer for its hash.
const PEER_TIMEOUT: Duration = Duration::from_secs(5);

/// This member's `HashKV` at `revision` (0: the current one), as the peer service answers it.
pub(crate) async fn local_hash(server: &EtcdServer, revision: i64) -> Result<HashKvResponse> {
    let owner = server.clone();
    let hashed = tokio::task::spawn_blocking(move || owner.store().hash_kv(revision))
        .await
        .map_err(|e| ServerError::Fatal(format!("hash task: {e}")))??;
    Ok(HashKvResponse {
        header: Some(server.header(hashed.current_revision)),
        hash: hashed.hash,
        compact_revision: hashed.compact_revision,
        hash_revision: hashed.hash_revision,
    })
}

/// Every other member's answer for its hash at `revision`, asked in parallel.
async fn peer_hashes(server: &EtcdServer, revision: i64) -> Vec<(u64, Result<HashKvResponse>)> {
    let me = server.member_id();
    let asks = server
        .members()
        .into_iter()
        .filter(|m| m.id != me)
        .map(|m| async move {
            let answer =
                crate::peer::calls::hash_kv(server.transport(), m.id, revision, PEER_TIMEOUT).await;
            (m.id, answer)
        });
    futures::future::join_all(asks).await
}

/// The initial check; an error when a peer's data differs from this member's.
pub async fn check_at_start(server: &EtcdServer) -> Result<()> {
    let me = id_hex(server.member_id());
    tracing::info!(local_member_id = %me, timeout = ?PEER_TIMEOUT, "starting initial corruption check");
    let local = local_hash(server, 0).await?;
    let revision = local.header.as_ref().map_or(0, |h| h.revision);
    let mut mismatches = 0;
    for (id, answer) in peer_hashes(server, revision).await {
        let remote_peer_id = id_hex(id);
        match answer {
            Ok(remote) if remote.hash == local.hash => {}
            Ok(remote) if remote.compact_revision == local.compact_revision => {
                mismatches += 1;
                tracing::error!(
                    local_member_id = %me,
                    local_member_revision = revision,
                    local_member_compact_revision = local.compact_revision,
                    local_member_hash = local.hash,
                    remote_peer_id = %remote_peer_id,
                    remote_peer_hash = remote.hash,
                    "found different hash values from remote peer"
                );
            }
            Ok(remote) => tracing::warn!(
                local_member_id = %me,
                local_member_compact_revision = local.compact_revision,
                remote_peer_id = %remote_peer_id,
                remote_peer_compact_revision = remote.compact_revision,
                "found different compact revision values from remote peer"
            ),
            Err(ServerError::Etcd(e)) if std::ptr::eq(e, &rpctypes::FUTURE_REV) => tracing::warn!(
                local_member_id = %me,
                remote_peer_id = %remote_peer_id,
                "cannot fetch hash from slow remote peer"
            ),
            Err(ServerError::Etcd(e)) if std::ptr::eq(e, &rpctypes::COMPACTED) => tracing::warn!(
                local_member_id = %me,
                remote_peer_id = %remote_peer_id,
                "cannot fetch hash from remote peer; local member is behind"
            ),
            Err(error) => tracing::warn!(
                local_member_id = %me,
                remote_peer_id = %remote_peer_id,
                error = %error,
                "cannot fetch hash from remote peer"
            ),
        }
    }
    if mismatches > 0 {
        return Err(ServerError::Fatal(format!(
            "{me} found data inconsistency with peers"
        )));
    }
    tracing::info!(local_member_id = %me, "initial corruption checking passed; no corruption");
    Ok(())
}

/// The periodic check, run by whichever member leads, every `interval` until `shutdown`.
pub async fn run_periodic(server: EtcdServer, interval: Duration, shutdown: CancellationToken) {
    tracing::info!(
        local_member_id = %id_hex(server.member_id()),
        interval = ?interval,
        "enabled corruption checking"
    );
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = tokio::time::sleep(interval) => {}
        }
        if !server.raft_status().is_leader {
            continue;
        }
        if let Err(e) = check_followers(&server).await {
            tracing::warn!(error = %e, "failed to check the followers' hashes");
        }
    }
}

/// The leader's round: a follower whose hash differs at the leader's revision, with the same
/// compacted revision, gets the CORRUPT alarm.
async fn check_followers(server: &EtcdServer) -> Result<()> {
    let local = local_hash(server, 0).await?;
    let revision = local.header.as_ref().map_or(0, |h| h.revision);
    for (id, answer) in peer_hashes(server, revision).await {
        let Ok(remote) = answer else { continue };
        if remote.hash == local.hash || remote.compact_revision != local.compact_revision {
            continue;
        }
        tracing::error!(
            local_member_id = %id_hex(server.member_id()),
            local_member_hash = local.hash,
            revision,
            remote_peer_id = %id_hex(id),
            remote_peer_hash = remote.hash,
            "found hash mismatch; raising the CORRUPT alarm"
        );
        let activate = AlarmRequest {
            action: AlarmAction::Activate as i32,
            member_id: id,
            alarm: AlarmType::Corrupt as i32,
        };
        server.propose(Op::Alarm(activate)).await?;
    }
    Ok(())
}
