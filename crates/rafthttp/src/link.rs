//! One peer's link (etcd `rafthttp/peer.go`, `stream.go`, `pipeline.go`, `snapshot_sender.go`,
//! `probing_status.go`): two stream writers, two stream readers, the pipeline, the snapshot
//! sender and the prober, each a task that stops with the link's token.

use std::io::Read as _;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use axum::body::Body;
use axum::http::{Method, StatusCode};
use bytes::{Bytes, BytesMut};
use etcdrs_raftnode::eraftpb::Message;
use futures::StreamExt;
use parking_lot::Mutex;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use crate::client::PeerClient;
use crate::codec::{self, MsgAppV2Decoder, MsgAppV2Encoder};
use crate::{
    CLUSTER_ID_HEADER, Local, MEMBER_REMOVED, PIPELINE_BUF, Peer, RAFT_TO_HEADER, Raft, Refusal,
    STREAM_BUF, StreamType, WriterHandle, gate, id_hex,
};

/// How long a stream connection may stay silent (etcd's `ConnReadTimeout`).
const CONN_READ_TIMEOUT: Duration = Duration::from_secs(5);
/// How long one write to a stream may wait (etcd's `ConnWriteTimeout`).
const CONN_WRITE_TIMEOUT: Duration = Duration::from_secs(5);
/// How often an idle stream carries a link heartbeat (etcd: `ConnReadTimeout / 3`).
const LINK_HEARTBEAT: Duration = Duration::from_millis(1666);
/// The pause between two dials of a stream reader (etcd's `DialRetryFrequency`).
const DIAL_RETRY: Duration = Duration::from_millis(100);
/// How long a pipeline post may take.
const POST_TIMEOUT: Duration = Duration::from_secs(5);
/// How often the prober times the peer (etcd's prober interval is a few seconds too).
const PROBE_INTERVAL: Duration = Duration::from_secs(5);
/// How long sending one snapshot may take.
const SNAPSHOT_TIMEOUT: Duration = Duration::from_secs(300);
/// Bytes per snapshot chunk on the wire.
const SNAPSHOT_CHUNK: usize = 1 << 20;
/// The most bytes a writer encodes into one write.
const MAX_WRITE: usize = 1 << 20;
/// Chunks a stream response buffers between the writer and the connection.
pub(crate) const CONN_BUF: usize = 16;

/// Whom a link talks to, and how.
pub(crate) struct LinkConfig {
    pub to: u64,
    pub local: Arc<Local>,
    pub client: PeerClient,
    pub dial: Vec<String>,
    pub stop: CancellationToken,
}

/// A stream writer's receiving ends, until its task runs.
struct WriterParts {
    msgc: mpsc::Receiver<Message>,
    connc: mpsc::Receiver<mpsc::Sender<Bytes>>,
    working: Arc<AtomicBool>,
}

/// A link whose queues exist (raft may send into them) and whose tasks do not run yet.
pub(crate) struct Parked {
    config: LinkConfig,
    active: Arc<AtomicBool>,
    takes_pairs: Arc<AtomicBool>,
    msgapp: WriterParts,
    message: WriterParts,
    pipeline: mpsc::Receiver<Message>,
    snapshot: mpsc::Receiver<Message>,
}

/// What the link's tasks share: whom they talk to, the member they deliver to, and the
/// peer's status.
struct Shared<H> {
    to: u64,
    label: String,
    local: Arc<Local>,
    client: PeerClient,
    host: Arc<H>,
    picker: Mutex<Picker>,
    status: Mutex<Status>,
    /// Whether the peer takes a snapshot as a stream of pairs (`Transport::note_snapshot_format`).
    takes_pairs: Arc<AtomicBool>,
}

/// etcd's `urlPicker`: the URL in use, moving on when it proves unreachable.
struct Picker {
    urls: Vec<String>,
    index: usize,
}

impl Picker {
    fn pick(&self) -> String {
        self.urls[self.index % self.urls.len()].clone()
    }

    fn unreachable(&mut self, url: &str) {
        if self.pick() == url {
            self.index = (self.index + 1) % self.urls.len();
        }
    }
}

/// etcd's `peerStatus`, with the last failure logged per source (stream, pipeline) so that
/// a failure repeating the same way is logged once.
struct Status {
    activity: crate::metrics::PeerActivity,
    last_errors: std::collections::HashMap<String, String>,
}

impl<H: Raft> Shared<H> {
    fn activate(&self) {
        let mut status = self.status.lock();
        status.last_errors.clear();
        if status.activity.up() {
            tracing::info!(local_member_id = %id_hex(self.local.id), remote_peer_id = %self.label, "peer became active");
        }
    }

    fn deactivate(&self, source: &str, action: &str, reason: &str) {
        let mut status = self.status.lock();
        let error = format!("failed to {action} {} on {source} ({reason})", self.label);
        let was_active = status.activity.down();
        let repeated = status
            .last_errors
            .get(source)
            .is_some_and(|last| last == reason);
        if was_active {
            tracing::warn!(
                local_member_id = %id_hex(self.local.id),
                remote_peer_id = %self.label,
                error = %error,
                "peer became inactive (message send to peer failed)"
            );
        } else if !repeated {
            // etcd says this at debug level; a new reason is worth a warning (a refused TLS
            // certificate shows here, in Go's words).
            tracing::warn!(
                local_member_id = %id_hex(self.local.id),
                remote_peer_id = %self.label,
                error = %error,
                "peer deactivated again"
            );
        }
        if was_active || !repeated {
            status
                .last_errors
                .insert(source.to_owned(), reason.to_owned());
        }
    }

    fn url(&self) -> String {
        self.picker.lock().pick()
    }

    fn unreachable(&self, url: &str) {
        self.picker.lock().unreachable(url);
    }

    fn removed(&self) {
        tracing::warn!(local_member_id = %id_hex(self.local.id), remote_peer_id = %self.label, "{MEMBER_REMOVED}");
        self.host.removed();
    }

    /// A request to `path` on the peer's current URL, with etcd's headers.
    fn request(&self, url: &str, method: Method, path: &str) -> axum::http::request::Builder {
        let uri = format!("{}{path}", url.trim_end_matches('/'));
        self.local
            .stamp(axum::http::Request::builder().method(method).uri(uri))
    }
}

/// The queues of the link to `config.to` (the returned peer's `urls`/`dial` are the caller's
/// to set) and the receiving ends its tasks take when they run.
pub(crate) fn open(config: LinkConfig) -> (Peer, Parked) {
    let writer = || {
        let (msgc_tx, msgc) = mpsc::channel(STREAM_BUF);
        let (connc_tx, connc) = mpsc::channel(1);
        let working = Arc::new(AtomicBool::new(false));
        let handle = WriterHandle {
            msgc: msgc_tx,
            working: working.clone(),
            connc: connc_tx,
        };
        let parts = WriterParts {
            msgc,
            connc,
            working,
        };
        (handle, parts)
    };
    let (msgapp, msgapp_parts) = writer();
    let (message, message_parts) = writer();
    let (pipeline, pipeline_rx) = mpsc::channel(PIPELINE_BUF);
    let (snapshot, snapshot_rx) = mpsc::channel(1);
    let active = Arc::new(AtomicBool::new(false));
    let takes_pairs = Arc::new(AtomicBool::new(false));
    let peer = Peer {
        urls: Vec::new(),
        dial: Vec::new(),
        msgapp,
        message,
        pipeline,
        snapshot,
        active: active.clone(),
        takes_pairs: takes_pairs.clone(),
        stop: config.stop.clone(),
    };
    let parked = Parked {
        config,
        active,
        takes_pairs,
        msgapp: msgapp_parts,
        message: message_parts,
        pipeline: pipeline_rx,
        snapshot: snapshot_rx,
    };
    (peer, parked)
}

/// Run a parked link's tasks (two stream writers, two readers, the pipeline, the snapshot
/// sender, the prober), delivering to `host`; they stop with the link's token.
pub(crate) fn spawn<H: Raft>(runtime: &tokio::runtime::Handle, host: Arc<H>, parked: Parked) {
    let Parked {
        config,
        active,
        takes_pairs,
        msgapp,
        message,
        pipeline,
        snapshot,
    } = parked;
    let activity = crate::metrics::PeerActivity::new(config.local.id, config.to, active);
    let shared = Arc::new(Shared {
        to: config.to,
        label: id_hex(config.to),
        local: config.local,
        client: config.client,
        host,
        picker: Mutex::new(Picker {
            urls: config.dial,
            index: 0,
        }),
        status: Mutex::new(Status {
            activity,
            last_errors: std::collections::HashMap::new(),
        }),
        takes_pairs,
    });
    let stop = config.stop;
    for (kind, parts) in [
        (StreamType::MsgAppV2, msgapp),
        (StreamType::Message, message),
    ] {
        runtime.spawn(run_writer(
            shared.clone(),
            kind,
            parts.msgc,
            parts.connc,
            parts.working,
            stop.clone(),
        ));
    }
    for kind in [StreamType::MsgAppV2, StreamType::Message] {
        runtime.spawn(run_reader(shared.clone(), kind, stop.clone()));
    }
    runtime.spawn(run_pipeline(shared.clone(), pipeline, stop.clone()));
    runtime.spawn(run_snapshots(shared.clone(), snapshot, stop.clone()));
    runtime.spawn(run_prober(shared, stop));
}

enum Encoder {
    MsgAppV2(MsgAppV2Encoder),
    Message,
}

impl Encoder {
    fn new(kind: StreamType) -> Self {
        match kind {
            StreamType::MsgAppV2 => Encoder::MsgAppV2(MsgAppV2Encoder::default()),
            StreamType::Message => Encoder::Message,
        }
    }

    fn encode(&mut self, message: &Message, out: &mut Vec<u8>) -> crate::Result<()> {
        match self {
            Encoder::MsgAppV2(enc) => enc.encode(message, out),
            Encoder::Message => codec::encode_frame(message, out),
        }
    }
}

/// etcd's `streamWriter`: writes what is sent to the peer into the connection the peer's
/// reader attached, until it fails or another replaces it.
async fn run_writer<H: Raft>(
    shared: Arc<Shared<H>>,
    kind: StreamType,
    mut msgc: mpsc::Receiver<Message>,
    mut connc: mpsc::Receiver<mpsc::Sender<Bytes>>,
    working: Arc<AtomicBool>,
    stop: CancellationToken,
) {
    let mut conn: Option<mpsc::Sender<Bytes>> = None;
    let mut encoder = Encoder::new(kind);
    let mut heartbeat = tokio::time::interval(LINK_HEARTBEAT);
    heartbeat.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        let mut out = Vec::new();
        let action = tokio::select! {
            biased;
            _ = stop.cancelled() => {
                working.store(false, Ordering::Relaxed);
                return;
            }
            attached = connc.recv() => {
                let Some(attached) = attached else { return };
                if conn.replace(attached).is_some() {
                    tracing::info!(local_member_id = %id_hex(shared.local.id), remote_peer_id = %shared.label, stream_writer_type = kind.name(), "closed TCP streaming connection with remote peer");
                }
                encoder = Encoder::new(kind);
                working.store(true, Ordering::Relaxed);
                shared.activate();
                tracing::info!(local_member_id = %id_hex(shared.local.id), remote_peer_id = %shared.label, stream_writer_type = kind.name(), "established TCP streaming connection with remote peer");
                continue;
            }
            _ = heartbeat.tick(), if conn.is_some() => {
                encoder.encode(&codec::link_heartbeat(), &mut out).map(|_| "heartbeat")
            }
            message = msgc.recv(), if conn.is_some() => {
                let Some(message) = message else { return };
                let mut encoded = encoder.encode(&message, &mut out);
                // Whatever else is queued goes in the same write (etcd flushes when the
                // queue is empty).
                while encoded.is_ok() && out.len() < MAX_WRITE {
                    let Ok(next) = msgc.try_recv() else { break };
                    encoded = encoder.encode(&next, &mut out);
                }
                encoded.map(|_| "write")
            }
        };
        let Some(sink) = conn.as_ref() else { continue };
        let written = match action {
            Ok(action) => {
                let bytes = out.len() as u64;
                match tokio::time::timeout(CONN_WRITE_TIMEOUT, sink.send(Bytes::from(out))).await {
                    Ok(Ok(())) => {
                        crate::metrics::PEER_SENT_BYTES
                            .with_label_values(&[shared.label.as_str()])
                            .inc_by(bytes);
                        Ok(())
                    }
                    Ok(Err(_)) => Err((action, "use of closed network connection".to_owned())),
                    Err(_) => Err((action, "i/o timeout".to_owned())),
                }
            }
            Err(e) => Err(("write", e.to_string())),
        };
        if let Err((action, reason)) = written {
            conn = None;
            working.store(false, Ordering::Relaxed);
            // What was queued for the lost connection is dropped (raft retransmits).
            while msgc.try_recv().is_ok() {}
            crate::metrics::PEER_SENT_FAILURES
                .with_label_values(&[shared.label.as_str()])
                .inc();
            shared.deactivate(kind.name(), action, &reason);
            tracing::warn!(local_member_id = %id_hex(shared.local.id), remote_peer_id = %shared.label, stream_writer_type = kind.name(), "lost TCP streaming connection with remote peer");
        }
    }
}

/// A failure in Go's words for TLS alerts (`remote error: tls: bad certificate`), else the
/// error with its causes (`client error (Connect): tcp connect error: Connection refused`).
fn error_text(error: &(dyn std::error::Error + 'static)) -> String {
    let top = error.to_string();
    let tls = crate::alert::transport_error_text(error);
    if tls != top {
        return tls;
    }
    let mut text = top;
    let mut cause = error.source();
    while let Some(e) = cause {
        let more = e.to_string();
        if !text.contains(&more) {
            text.push_str(": ");
            text.push_str(&more);
        }
        cause = e.source();
    }
    text
}

/// Why a stream reader's dial failed.
enum DialError {
    /// The peer answered 410 Gone: this member was removed.
    Removed,
    /// Anything else, in etcd's words.
    Other(String),
}

/// etcd's `streamReader`: dials the peer's stream for this member, hands what arrives to raft,
/// dials again when the connection ends.
async fn run_reader<H: Raft>(shared: Arc<Shared<H>>, kind: StreamType, stop: CancellationToken) {
    loop {
        let dialled = tokio::select! {
            _ = stop.cancelled() => return,
            dialled = dial_stream(&shared, kind) => dialled,
        };
        match dialled {
            Ok(body) => {
                shared.activate();
                tracing::info!(local_member_id = %id_hex(shared.local.id), remote_peer_id = %shared.label, stream_reader_type = kind.name(), "established TCP streaming connection with remote peer");
                let ended = tokio::select! {
                    _ = stop.cancelled() => return,
                    ended = decode_loop(&shared, kind, body) => ended,
                };
                tracing::warn!(local_member_id = %id_hex(shared.local.id), remote_peer_id = %shared.label, stream_reader_type = kind.name(), "lost TCP streaming connection with remote peer");
                if let Err(reason) = ended {
                    shared.deactivate(kind.name(), "read", &reason);
                }
            }
            Err(DialError::Removed) => {
                shared.removed();
                return;
            }
            Err(DialError::Other(reason)) => shared.deactivate(kind.name(), "dial", &reason),
        }
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tokio::time::sleep(DIAL_RETRY) => {}
        }
    }
}

async fn dial_stream<H: Raft>(
    shared: &Shared<H>,
    kind: StreamType,
) -> Result<hyper::body::Incoming, DialError> {
    let url = shared.url();
    let path = format!("{}/{}", kind.endpoint(), id_hex(shared.local.id));
    let request = shared
        .request(&url, Method::GET, &path)
        .header(RAFT_TO_HEADER, shared.label.as_str())
        .body(Body::empty())
        .map_err(|e| DialError::Other(format!("failed to make http request to {url} ({e})")))?;
    let response =
        match tokio::time::timeout(CONN_READ_TIMEOUT, shared.client.request(request)).await {
            Ok(Ok(response)) => response,
            Ok(Err(e)) => {
                shared.unreachable(&url);
                return Err(DialError::Other(error_text(&e)));
            }
            Err(_) => {
                shared.unreachable(&url);
                return Err(DialError::Other("i/o timeout".to_owned()));
            }
        };
    let status = response.status();
    if status == StatusCode::OK {
        return Ok(response.into_body());
    }
    shared.unreachable(&url);
    let remote_cluster = response
        .headers()
        .get(CLUSTER_ID_HEADER)
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_owned();
    let body = read_body(response.into_body(), 4096).await;
    match status {
        StatusCode::GONE => Err(DialError::Removed),
        StatusCode::NOT_FOUND => Err(DialError::Other(format!(
            "peer {} failed to find local node {}",
            shared.label,
            id_hex(shared.local.id)
        ))),
        StatusCode::PRECONDITION_FAILED => {
            let text = body.trim_end_matches('\n');
            match text {
                "incompatible version" => {
                    tracing::warn!(local_member_id = %id_hex(shared.local.id), remote_peer_id = %shared.label, "request sent was ignored by remote peer due to server version incompatibility");
                }
                "cluster ID mismatch" => {
                    tracing::warn!(
                        local_member_id = %id_hex(shared.local.id),
                        remote_peer_id = %shared.label,
                        remote_peer_cluster_id = %remote_cluster,
                        local_member_cluster_id = %id_hex(shared.local.cluster_id),
                        "request sent was ignored by remote peer due to cluster ID mismatch"
                    );
                }
                _ => {}
            }
            Err(DialError::Other(match text {
                "incompatible version" | "cluster ID mismatch" => text.to_owned(),
                other => format!("unhandled error {other:?} when precondition failed"),
            }))
        }
        other => Err(DialError::Other(format!(
            "unhandled http status {}",
            other.as_u16()
        ))),
    }
}

/// The body of a refusal, at most `limit` bytes of it.
async fn read_body(body: hyper::body::Incoming, limit: usize) -> String {
    let mut body = Body::new(body).into_data_stream();
    let mut out = Vec::new();
    while out.len() < limit {
        match tokio::time::timeout(CONN_READ_TIMEOUT, body.next()).await {
            Ok(Some(Ok(data))) => out.extend_from_slice(&data),
            _ => break,
        }
    }
    out.truncate(limit);
    String::from_utf8_lossy(&out).into_owned()
}

/// Read messages off a stream until it ends; `Ok` for a clean end (EOF).
async fn decode_loop<H: Raft>(
    shared: &Shared<H>,
    kind: StreamType,
    body: hyper::body::Incoming,
) -> Result<(), String> {
    let mut body = Body::new(body).into_data_stream();
    let mut decoder = match kind {
        StreamType::MsgAppV2 => Some(MsgAppV2Decoder::new(shared.local.id, shared.to)),
        StreamType::Message => None,
    };
    let mut buf = BytesMut::new();
    loop {
        let data = match tokio::time::timeout(CONN_READ_TIMEOUT, body.next()).await {
            Err(_) => return Err("i/o timeout".to_owned()),
            Ok(None) => return Ok(()),
            Ok(Some(Err(e))) => return Err(error_text(&e)),
            Ok(Some(Ok(data))) => data,
        };
        crate::metrics::PEER_RECEIVED_BYTES
            .with_label_values(&[shared.label.as_str()])
            .inc_by(data.len() as u64);
        buf.extend_from_slice(&data);
        loop {
            let decoded = match decoder.as_mut() {
                Some(decoder) => decoder.decode(&mut buf),
                None => codec::decode_frame(&mut buf, codec::READ_BYTES_LIMIT),
            };
            let message = match decoded {
                Ok(Some(message)) => message,
                Ok(None) => break,
                Err(e) => {
                    crate::metrics::PEER_RECEIVED_FAILURES
                        .with_label_values(&[shared.label.as_str()])
                        .inc();
                    return Err(e.to_string());
                }
            };
            if codec::is_link_heartbeat(&message) {
                continue;
            }
            // The same gate as a pipeline post's (etcd's `peer` hands stream messages to
            // `Process` too): a removed member's message is dropped, as etcd drops it.
            match gate(shared.host.as_ref(), message).await {
                Ok(()) => {}
                Err(Refusal::Removed) => {
                    tracing::warn!(local_member_id = %id_hex(shared.local.id), remote_peer_id = %shared.label, "failed to process Raft message (cannot process message from removed member)");
                }
                Err(Refusal::Stopped) => return Ok(()),
            }
        }
    }
}

/// etcd's `pipeline`: messages posted one by one while no stream works.
async fn run_pipeline<H: Raft>(
    shared: Arc<Shared<H>>,
    mut rx: mpsc::Receiver<Message>,
    stop: CancellationToken,
) {
    loop {
        let message = tokio::select! {
            _ = stop.cancelled() => return,
            message = rx.recv() => match message {
                Some(message) => message,
                None => return,
            },
        };
        let Ok(bytes) = codec::encode_message(&message) else {
            continue;
        };
        let url = shared.url();
        let len = bytes.len() as u64;
        let Ok(request) = shared
            .request(&url, Method::POST, "/raft")
            .header(axum::http::header::CONTENT_TYPE, "application/protobuf")
            .body(Body::from(bytes))
        else {
            continue;
        };
        match post(&shared.client, request).await {
            Ok(()) => {
                shared.activate();
                crate::metrics::PEER_SENT_BYTES
                    .with_label_values(&[shared.label.as_str()])
                    .inc_by(len);
            }
            Err(PostError::Removed) => {
                shared.removed();
                return;
            }
            Err(PostError::Refused(reason)) | Err(PostError::Failed(reason)) => {
                shared.unreachable(&url);
                shared.deactivate("pipeline", "write", &reason);
                crate::metrics::PEER_SENT_FAILURES
                    .with_label_values(&[shared.label.as_str()])
                    .inc();
            }
        }
    }
}

/// Why a post to a peer failed (etcd's `checkPostResponse`).
enum PostError {
    /// 403: this member was removed.
    Removed,
    /// 412: version or cluster id refused, in etcd's words.
    Refused(String),
    /// Unreachable, or another status.
    Failed(String),
}

async fn post(client: &PeerClient, request: axum::http::Request<Body>) -> Result<(), PostError> {
    post_with_timeout(client, request, POST_TIMEOUT).await
}

async fn post_with_timeout(
    client: &PeerClient,
    request: axum::http::Request<Body>,
    timeout: Duration,
) -> Result<(), PostError> {
    let uri = request.uri().to_string();
    let response = match tokio::time::timeout(timeout, client.request(request)).await {
        Ok(Ok(response)) => response,
        Ok(Err(e)) => return Err(PostError::Failed(error_text(&e))),
        Err(_) => return Err(PostError::Failed("i/o timeout".to_owned())),
    };
    let status = response.status();
    let body = read_body(response.into_body(), 4096).await;
    match status {
        StatusCode::NO_CONTENT => Ok(()),
        StatusCode::FORBIDDEN => Err(PostError::Removed),
        StatusCode::PRECONDITION_FAILED => {
            let text = body.trim_end_matches('\n');
            Err(PostError::Refused(match text {
                "incompatible version" | "cluster ID mismatch" => text.to_owned(),
                other => format!("unhandled error {other:?} when precondition failed"),
            }))
        }
        other => Err(PostError::Failed(format!(
            "unexpected http status {} while posting to {uri:?} ({})",
            other.canonical_reason().unwrap_or("unknown"),
            body.trim_end()
        ))),
    }
}

/// etcd's `snapshotSender`: each snapshot message goes with the store's image in one post;
/// raft hears whether it arrived.
async fn run_snapshots<H: Raft>(
    shared: Arc<Shared<H>>,
    mut rx: mpsc::Receiver<Message>,
    stop: CancellationToken,
) {
    loop {
        let message = tokio::select! {
            _ = stop.cancelled() => return,
            message = rx.recv() => match message {
                Some(message) => message,
                None => return,
            },
        };
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = send_snapshot(&shared, message) => {}
        }
    }
}

async fn send_snapshot<H: Raft>(shared: &Shared<H>, message: Message) {
    let index = message.get_snapshot().get_metadata().index;
    tracing::info!(remote_peer_id = %shared.label, index, "sending database snapshot");
    let to = shared.label.as_str();
    let inflight = crate::metrics::SNAPSHOT_SEND_INFLIGHTS.with_label_values(&[to]);
    inflight.inc();
    let started = Instant::now();
    let host = shared.host.clone();
    // etcd's form, which an etcd member installs and so do we: the member's snapshot data
    // (etcd's: the v2 store's JSON) in the message, then its database image; to an etcd-rs
    // member, the image as a stream of pairs.
    let pairs = shared.takes_pairs.load(Ordering::Relaxed);
    let image = tokio::task::spawn_blocking(move || host.snapshot_image(index, pairs)).await;
    let mut format = "etcd's database file";
    let ok = match image {
        Ok(Ok(image)) => {
            let mut message = message;
            message.mut_snapshot().data = image.data.into();
            if image.pairs {
                format = "a stream of pairs";
            }
            stream_snapshot(shared, message, image.body, image.pairs).await
        }
        Ok(Err(e)) => {
            tracing::warn!(error = %e, "failed to take a database snapshot");
            None
        }
        Err(_) => None,
    };
    inflight.dec();
    if let Some(bytes) = ok {
        tracing::info!(
            remote_peer_id = %shared.label,
            index,
            bytes,
            format,
            took = ?started.elapsed(),
            "sent database snapshot"
        );
        crate::metrics::SNAPSHOT_SEND_SUCCESS
            .with_label_values(&[to])
            .inc();
        crate::metrics::SNAPSHOT_SEND_SECONDS
            .with_label_values(&[to])
            .observe(started.elapsed().as_secs_f64());
    } else {
        crate::metrics::SNAPSHOT_SEND_FAILURES
            .with_label_values(&[to])
            .inc();
    }
    shared.host.report_snapshot(shared.to, ok.is_some()).await;
}

async fn stream_snapshot<H: Raft>(
    shared: &Shared<H>,
    message: Message,
    mut image: Box<dyn std::io::Read + Send>,
    pairs: bool,
) -> Option<u64> {
    let mut first = Vec::new();
    if codec::encode_frame(&message, &mut first).is_err() {
        return None;
    }
    let (tx, rx) = mpsc::channel::<Result<Bytes, std::io::Error>>(4);
    // The body: the raft message as the `message` stream frames it, then the image (etcd's
    // `createSnapBody`), read on a blocking thread; it answers the bytes it sent.
    let reader = tokio::task::spawn_blocking(move || -> Option<u64> {
        let mut sent = first.len() as u64;
        if tx.blocking_send(Ok(Bytes::from(first))).is_err() {
            return None;
        }
        let mut buf = vec![0u8; SNAPSHOT_CHUNK];
        loop {
            match image.read(&mut buf) {
                Ok(0) => return Some(sent),
                Ok(n) => {
                    sent += n as u64;
                    if tx
                        .blocking_send(Ok(Bytes::copy_from_slice(&buf[..n])))
                        .is_err()
                    {
                        return None;
                    }
                }
                Err(e) => {
                    let _ = tx.blocking_send(Err(e));
                    return None;
                }
            }
        }
    });
    let url = shared.url();
    let mut request = shared
        .request(&url, Method::POST, "/raft/snapshot")
        .header(axum::http::header::CONTENT_TYPE, "application/octet-stream");
    if !pairs {
        // The header on every request says the member takes pairs; on an upload it says the
        // body is pairs.
        if let Some(headers) = request.headers_mut() {
            headers.remove(crate::SNAPSHOT_FORMAT_HEADER);
        }
    }
    let Ok(request) = request.body(Body::from_stream(
        tokio_stream::wrappers::ReceiverStream::new(rx),
    )) else {
        return None;
    };
    let sent = post_with_timeout(&shared.client, request, SNAPSHOT_TIMEOUT).await;
    let read = reader.await.unwrap_or(None);
    match sent {
        Ok(()) => read,
        Err(PostError::Removed) => {
            shared.removed();
            None
        }
        Err(PostError::Refused(reason)) | Err(PostError::Failed(reason)) => {
            shared.unreachable(&url);
            tracing::warn!(remote_peer_id = %shared.label, error = %reason, "failed to send database snapshot");
            None
        }
    }
}

/// etcd's prober: times `GET /raft/probing` for the round-trip series.
async fn run_prober<H: Raft>(shared: Arc<Shared<H>>, stop: CancellationToken) {
    let mut tick = tokio::time::interval(PROBE_INTERVAL);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tick.tick() => {}
        }
        let url = shared.url();
        let Ok(request) = shared
            .request(&url, Method::GET, "/raft/probing")
            .body(Body::empty())
        else {
            continue;
        };
        let started = Instant::now();
        let answered = tokio::select! {
            _ = stop.cancelled() => return,
            answered = tokio::time::timeout(POST_TIMEOUT, shared.client.request(request)) => answered,
        };
        if let Ok(Ok(response)) = answered
            && response.status() == StatusCode::OK
        {
            let _ = read_body(response.into_body(), 4096).await;
            crate::metrics::PEER_RTT
                .with_label_values(&[shared.label.as_str()])
                .observe(started.elapsed().as_secs_f64());
        }
    }
}
