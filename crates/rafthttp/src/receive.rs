//! `POST /raft/snapshot` (etcd `rafthttp/http.go`'s `snapshotHandler`): a leader's snapshot
//! streamed into the member's inbox ([`Raft::snapshot_inbox`]) and handed to raft through the
//! gate. Beyond etcd, the upload is accepted only from a member and only up to the
//! configured limit (the server's: twice the backend quota), within idle and total deadlines,
//! and a refused upload leaves no file behind (`PartialFile`).

use std::time::Duration;

use axum::extract::Request;
use axum::http::{Method, StatusCode};
use axum::response::Response;
use bytes::BytesMut;
use etcdrs_raftnode::eraftpb::MessageType;
use futures::StreamExt;
use tokio::io::AsyncWriteExt;

use crate::handler::{go_error, member_label, method_not_allowed, process};
use crate::{FROM_HEADER, Raft, Running, codec, id_hex};

/// How long a snapshot upload may go without a chunk.
const SNAPSHOT_IDLE_TIMEOUT: Duration = Duration::from_secs(30);
/// How long a snapshot upload may take.
const SNAPSHOT_TIMEOUT: Duration = Duration::from_secs(300);

fn snapshot_too_large(limit: u64) -> Response {
    tracing::warn!(
        limit,
        "rejected a snapshot larger than twice the backend quota"
    );
    go_error(
        StatusCode::PAYLOAD_TOO_LARGE,
        &format!("etcdserver: snapshot larger than {limit} bytes (twice the backend quota)"),
    )
}

/// A snapshot being received, removed unless it arrived whole.
struct PartialFile(Option<std::path::PathBuf>);

impl Drop for PartialFile {
    fn drop(&mut self) {
        if let Some(path) = self.0.take() {
            let _ = std::fs::remove_file(path);
        }
    }
}

/// `POST /raft/snapshot` (etcd's `snapshotHandler`): the raft snapshot message framed as on
/// the `message` stream, then the database image.
pub(crate) async fn snapshot<H: Raft>(running: &Running<H>, request: Request) -> Response {
    if request.method() != Method::POST {
        return method_not_allowed(Some("POST"));
    }
    // A member, or a peer this member has a link to: a member that joined an existing
    // cluster knows its peers (from `/members`) before any membership has applied, and the
    // leader's snapshot is what brings that membership.
    let from = request
        .headers()
        .get(FROM_HEADER)
        .and_then(|v| v.to_str().ok())
        .and_then(|from| u64::from_str_radix(from, 16).ok())
        .and_then(|from| {
            member_label(running.host.as_ref(), from)
                .or_else(|| running.transport.has_peer(from).then(|| id_hex(from)))
        });
    let label = from
        .clone()
        .unwrap_or_else(|| "UNKNOWN_SNAPSHOT_SENDER".to_owned());
    let labels = [label.as_str()];
    let started = std::time::Instant::now();
    let response = match from {
        // Only a member may replace this member's data (the leader sends snapshots). Not
        // 403: etcd's sender reads a 403 as its own removal and stops.
        None => {
            tracing::warn!("rejected a snapshot from a member not in the cluster");
            go_error(
                StatusCode::PRECONDITION_FAILED,
                "etcdserver: snapshot from a member not in the cluster",
            )
        }
        Some(_) => {
            if let Err(text) = running.transport.check_compatibility(request.headers()) {
                go_error(StatusCode::PRECONDITION_FAILED, text)
            } else {
                let inflight =
                    crate::metrics::SNAPSHOT_RECEIVE_INFLIGHTS.with_label_values(&labels);
                inflight.inc();
                let received = receive_snapshot(running, request).await;
                inflight.dec();
                received
            }
        }
    };
    if response.status() == StatusCode::NO_CONTENT {
        crate::metrics::SNAPSHOT_RECEIVE_SUCCESS
            .with_label_values(&labels)
            .inc();
        crate::metrics::SNAPSHOT_RECEIVE_SECONDS
            .with_label_values(&labels)
            .observe(started.elapsed().as_secs_f64());
    } else {
        crate::metrics::SNAPSHOT_RECEIVE_FAILURES
            .with_label_values(&labels)
            .inc();
    }
    running.transport.with_cluster_id(response)
}

async fn receive_snapshot<H: Raft>(running: &Running<H>, request: Request) -> Response {
    let local = running.transport.local.id;
    let pairs = request
        .headers()
        .get(crate::SNAPSHOT_FORMAT_HEADER)
        .is_some_and(|v| v.as_bytes() == crate::PAIRS_FORMAT.as_bytes());
    let mut body = request.into_body().into_data_stream();
    // Bounds: a leader's database stays within its quota (the NOSPACE alarm stops writes at
    // it), so an image over twice the quota is not one; and an upload that stalls or drags
    // on is dropped rather than holding the file.
    let limit = running.transport.snapshot_limit;
    let deadline = tokio::time::Instant::now() + SNAPSHOT_TIMEOUT;
    let mut buf = BytesMut::new();
    let idle = || deadline.min(tokio::time::Instant::now() + SNAPSHOT_IDLE_TIMEOUT);
    // The raft message first.
    let message = loop {
        match codec::decode_frame(&mut buf, limit) {
            Ok(Some(message)) => break message,
            Ok(None) => {}
            Err(e) => {
                return go_error(
                    StatusCode::BAD_REQUEST,
                    &format!("failed to decode raft message ({e})"),
                );
            }
        }
        match tokio::time::timeout_at(idle(), body.next()).await {
            Ok(Some(Ok(data))) => buf.extend_from_slice(&data),
            Ok(Some(Err(e))) => {
                return go_error(
                    StatusCode::BAD_REQUEST,
                    &format!("failed to decode raft message ({e})"),
                );
            }
            Ok(None) => {
                return go_error(
                    StatusCode::BAD_REQUEST,
                    "failed to decode raft message (unexpected EOF)",
                );
            }
            Err(_) => {
                return go_error(
                    StatusCode::REQUEST_TIMEOUT,
                    "etcdserver: snapshot upload timed out",
                );
            }
        }
    };
    if message.get_msg_type() != MessageType::MsgSnapshot {
        tracing::warn!(message_type = ?message.get_msg_type(), "unexpected Raft message type");
        return go_error(StatusCode::BAD_REQUEST, "wrong raft message type");
    }
    let index = message.get_snapshot().get_metadata().index;
    tracing::info!(
        local_member_id = %id_hex(local),
        remote_snapshot_sender_id = %id_hex(message.from),
        incoming_snapshot_index = index,
        "receiving database snapshot"
    );
    let saving = std::time::Instant::now();
    if pairs {
        return receive_pairs(running, message, buf, body, idle).await;
    }
    let path = running.host.snapshot_inbox(index);
    let save_error = |e: &dyn std::fmt::Display| {
        go_error(
            StatusCode::INTERNAL_SERVER_ERROR,
            &format!("failed to save KV snapshot ({e})"),
        )
    };
    let mut file = match tokio::fs::File::create(&path).await {
        Ok(file) => file,
        Err(e) => return save_error(&e),
    };
    // From here on a failed upload leaves no file behind.
    let mut partial = PartialFile(Some(path.clone()));
    let mut received = buf.len() as u64;
    if received > limit {
        return snapshot_too_large(limit);
    }
    if let Err(e) = file.write_all(&buf).await {
        return save_error(&e);
    }
    loop {
        let data = match next_chunk(&mut body, idle(), &mut received, limit).await {
            Ok(Some(data)) => data,
            Ok(None) => break,
            Err(refused) => return refused,
        };
        if let Err(e) = file.write_all(&data).await {
            return save_error(&e);
        }
    }
    // Not synced (etcd syncs it, as it renames the file into place as its database): the
    // member keeps nothing of the received file across a restart (an image waits for raft in
    // memory only) and makes durable what it installs from it, so the sync only cost the
    // join the time to write the image to the disk one more time.
    if let Err(e) = file.flush().await {
        return save_error(&e);
    }
    drop(file);
    crate::metrics::SNAP_DB_SAVE_SECONDS.observe(saving.elapsed().as_secs_f64());
    tracing::info!(
        local_member_id = %id_hex(local),
        incoming_snapshot_index = index,
        incoming_snapshot_size_bytes = received,
        download_took = ?saving.elapsed(),
        "received and saved database snapshot"
    );
    partial.0 = None;
    // The member makes the image ready to install (its conversion can take seconds on a big
    // database) before raft hears of it.
    let host = running.host.clone();
    if tokio::task::spawn_blocking(move || host.snapshot_received(index, path))
        .await
        .is_err()
    {
        return save_error(&"the member stopped while taking the snapshot");
    }
    process(running, message).await
}

/// The upload's next chunk, waited for until `deadline`, its bytes added to `received`;
/// `None` at the upload's end; the answer to give when it broke, stalled or went past `limit`.
async fn next_chunk(
    body: &mut axum::body::BodyDataStream,
    deadline: tokio::time::Instant,
    received: &mut u64,
    limit: u64,
) -> Result<Option<bytes::Bytes>, Response> {
    match tokio::time::timeout_at(deadline, body.next()).await {
        Ok(Some(Ok(data))) => {
            *received += data.len() as u64;
            if *received > limit {
                return Err(snapshot_too_large(limit));
            }
            Ok(Some(data))
        }
        Ok(Some(Err(e))) => Err(go_error(
            StatusCode::INTERNAL_SERVER_ERROR,
            &format!("failed to save KV snapshot ({e})"),
        )),
        Ok(None) => Ok(None),
        Err(_) => Err(go_error(
            StatusCode::REQUEST_TIMEOUT,
            "etcdserver: snapshot upload timed out",
        )),
    }
}

/// Chunks of a stream of pairs queued between the upload and the member reading it.
const PAIRS_QUEUED: usize = 8;

/// The rest of an upload whose image is a stream of pairs: handed to the member chunk by
/// chunk as it arrives ([`Raft::snapshot_streamed`], on a blocking thread), within the same
/// bounds as a file; raft gets the message once the member has read the stream whole.
async fn receive_pairs<H: Raft>(
    running: &Running<H>,
    message: etcdrs_raftnode::eraftpb::Message,
    mut buf: BytesMut,
    mut body: axum::body::BodyDataStream,
    idle: impl Fn() -> tokio::time::Instant,
) -> Response {
    let local = running.transport.local.id;
    let index = message.get_snapshot().get_metadata().index;
    let limit = running.transport.snapshot_limit;
    let saving = std::time::Instant::now();
    let (tx, rx) = tokio::sync::mpsc::channel::<bytes::Bytes>(PAIRS_QUEUED);
    let host = running.host.clone();
    let reader = tokio::task::spawn_blocking(move || {
        let mut body = ChunkReader {
            rx,
            chunk: bytes::Bytes::new(),
        };
        host.snapshot_streamed(index, &mut body)
    });
    let mut received = buf.len() as u64;
    if received > limit {
        return snapshot_too_large(limit);
    }
    // A closed queue means the member stopped reading: its error is the answer.
    let mut reading = buf.is_empty() || tx.send(buf.split().freeze()).await.is_ok();
    while reading {
        let data = match next_chunk(&mut body, idle(), &mut received, limit).await {
            Ok(Some(data)) => data,
            Ok(None) => break,
            Err(refused) => return refused,
        };
        reading = tx.send(data).await.is_ok();
    }
    // The end of the upload is the end of the member's stream.
    drop(tx);
    match reader.await {
        Ok(Ok(())) => {}
        Ok(Err(e)) => {
            tracing::warn!(local_member_id = %id_hex(local), incoming_snapshot_index = index, error = %e, "failed to read the snapshot's stream of pairs");
            return go_error(
                StatusCode::INTERNAL_SERVER_ERROR,
                &format!("failed to save KV snapshot ({e})"),
            );
        }
        Err(_) => {
            return go_error(
                StatusCode::INTERNAL_SERVER_ERROR,
                "failed to save KV snapshot (the member stopped while taking the snapshot)",
            );
        }
    }
    crate::metrics::SNAP_DB_SAVE_SECONDS.observe(saving.elapsed().as_secs_f64());
    tracing::info!(
        local_member_id = %id_hex(local),
        incoming_snapshot_index = index,
        incoming_snapshot_size_bytes = received,
        download_took = ?saving.elapsed(),
        "received and saved database snapshot"
    );
    process(running, message).await
}

/// The chunks of an upload as a reader, for a blocking thread: the end of the queue is the
/// end of the stream.
struct ChunkReader {
    rx: tokio::sync::mpsc::Receiver<bytes::Bytes>,
    chunk: bytes::Bytes,
}

impl std::io::Read for ChunkReader {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        while self.chunk.is_empty() {
            match self.rx.blocking_recv() {
                Some(chunk) => self.chunk = chunk,
                None => return Ok(0),
            }
        }
        let n = buf.len().min(self.chunk.len());
        buf[..n].copy_from_slice(&self.chunk.split_to(n));
        Ok(n)
    }
}
