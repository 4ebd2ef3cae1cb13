//! The transport between members of this crate, with a fake member behind each: queues that
//! drop when full, streams that attach and re-attach, the pipeline while no stream works,
//! snapshots sent and received, and the one gate on both paths (a removed member's messages
//! refused, raft's local messages dropped). Sockets on 127.0.0.1:0 only.

use std::collections::HashSet;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use etcdrs_raftnode::Transport as _;
use etcdrs_raftnode::eraftpb::{Message, MessageType};
use parking_lot::Mutex;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use crate::{
    Config, PeerClient, Raft, Running, SnapshotImage, Starter, Stopped, StreamType, Transport,
    codec, metrics, routes,
};

const CLUSTER: u64 = 0x100;

/// A member as the transport sees it: what was stepped, reported and received.
struct FakeHost {
    stepped: Mutex<Vec<Message>>,
    removed_ids: HashSet<u64>,
    members: HashSet<u64>,
    told_removed: AtomicBool,
    reports: Mutex<Vec<(u64, bool)>>,
    inbox: tempfile::TempDir,
    received: Mutex<Vec<(u64, Vec<u8>)>>,
    /// Images that arrived as streams of pairs.
    streamed: Mutex<Vec<(u64, Vec<u8>)>>,
}

impl FakeHost {
    fn new(members: &[u64], removed: &[u64]) -> Arc<FakeHost> {
        Arc::new(FakeHost {
            stepped: Mutex::new(Vec::new()),
            removed_ids: removed.iter().copied().collect(),
            members: members.iter().copied().collect(),
            told_removed: AtomicBool::new(false),
            reports: Mutex::new(Vec::new()),
            inbox: tempfile::tempdir().expect("temp dir"),
            received: Mutex::new(Vec::new()),
            streamed: Mutex::new(Vec::new()),
        })
    }

    fn stepped(&self) -> Vec<(MessageType, u64)> {
        self.stepped
            .lock()
            .iter()
            .map(|m| (m.get_msg_type(), m.from))
            .collect()
    }
}

const IMAGE: &[u8] = b"the database image";
const PAIRS_IMAGE: &[u8] = b"the database as pairs";
const SNAPSHOT_DATA: &[u8] = b"the v2 store";

impl Raft for FakeHost {
    async fn step(&self, message: Message) -> Result<(), Stopped> {
        self.stepped.lock().push(message);
        Ok(())
    }

    async fn report_snapshot(&self, to: u64, ok: bool) {
        self.reports.lock().push((to, ok));
    }

    fn is_removed(&self, id: u64) -> bool {
        self.removed_ids.contains(&id)
    }

    fn is_member(&self, id: u64) -> bool {
        self.members.contains(&id)
    }

    fn removed(&self) {
        self.told_removed.store(true, Ordering::SeqCst);
    }

    fn snapshot_image(&self, _index: u64, pairs: bool) -> Result<SnapshotImage, String> {
        let image = if pairs { PAIRS_IMAGE } else { IMAGE };
        Ok(SnapshotImage {
            data: SNAPSHOT_DATA.to_vec(),
            body: Box::new(std::io::Cursor::new(image.to_vec())),
            pairs,
        })
    }

    fn snapshot_inbox(&self, index: u64) -> PathBuf {
        self.inbox.path().join(format!("{index:016x}.snap.recv"))
    }

    fn snapshot_received(&self, index: u64, path: PathBuf) {
        let bytes = std::fs::read(path).expect("received image");
        self.received.lock().push((index, bytes));
    }

    fn snapshot_streamed(
        &self,
        index: u64,
        body: &mut (dyn std::io::Read + Send),
    ) -> Result<(), String> {
        let mut bytes = Vec::new();
        body.read_to_end(&mut bytes).map_err(|e| e.to_string())?;
        self.streamed.lock().push((index, bytes));
        Ok(())
    }
}

/// A member serving the raft routes on a loopback port.
struct Member {
    transport: Arc<Transport<FakeHost>>,
    host: Arc<FakeHost>,
    url: String,
    stop: CancellationToken,
}

impl Drop for Member {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

fn config(id: u64, url: &str) -> Config {
    Config {
        id,
        cluster_id: CLUSTER,
        urls: vec![url.to_owned()],
        server_version: "3.5.17",
        snapshot_limit: 1 << 20,
        client: PeerClient::new(None),
    }
}

/// Member `id`, started, serving; its host knows `members` and refuses `removed`.
async fn member(id: u64, members: &[u64], removed: &[u64]) -> Member {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let url = format!("http://{}", listener.local_addr().expect("address"));
    let stop = CancellationToken::new();
    let (transport, starter): (_, Starter<FakeHost>) =
        Transport::new(config(id, &url), stop.clone());
    let host = FakeHost::new(members, removed);
    let running: Running<FakeHost> = starter.start(host.clone());
    let router: axum::Router = routes(running);
    let serving = stop.clone();
    tokio::spawn(async move {
        let _ = axum::serve(listener, router)
            .with_graceful_shutdown(serving.cancelled_owned())
            .await;
    });
    Member {
        transport,
        host,
        url,
        stop,
    }
}

fn message(kind: MessageType, from: u64, to: u64) -> Message {
    let mut message = Message::default();
    message.set_msg_type(kind);
    message.from = from;
    message.to = to;
    message.term = 1;
    message
}

/// Wait for `what` to hold, at most ten seconds.
async fn until(what: impl Fn() -> bool) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while !what() {
        assert!(tokio::time::Instant::now() < deadline, "timed out");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

fn stream_working(transport: &Transport<FakeHost>, to: u64, kind: StreamType) -> bool {
    let peers = transport.peers.read();
    let Some(peer) = peers.by_id.get(&to) else {
        return false;
    };
    match kind {
        StreamType::MsgAppV2 => peer.msgapp.working.load(Ordering::Relaxed),
        StreamType::Message => peer.message.working.load(Ordering::Relaxed),
    }
}

#[tokio::test]
async fn a_full_queue_drops_and_counts_before_the_links_start() {
    // Not started: what raft sends waits in the queues, up to the pipeline's 64.
    let (transport, _starter): (_, Starter<FakeHost>) =
        Transport::new(config(1, "http://127.0.0.1:1"), CancellationToken::new());
    let peer = 0xfee1;
    transport.set_peers(&[(peer, vec!["http://127.0.0.1:1".to_owned()])]);
    let failures = || {
        metrics::PEER_SENT_FAILURES
            .with_label_values(&["fee1"])
            .get()
    };
    let heartbeat_failures = metrics::HEARTBEAT_SEND_FAILURES.get();
    let before = failures();
    let messages = (0..70)
        .map(|_| message(MessageType::MsgHeartbeat, 1, peer))
        .collect();
    transport.send(messages);
    assert_eq!(failures() - before, 70 - super::PIPELINE_BUF as u64);
    assert!(metrics::HEARTBEAT_SEND_FAILURES.get() - heartbeat_failures >= 6);
    // Messages to a member without a link go nowhere, and count nothing.
    transport.send(vec![message(MessageType::MsgHeartbeat, 1, 0xdead)]);
    assert_eq!(failures() - before, 6);
}

/// The next raft message a `message` stream writer wrote into `conn`, link heartbeats skipped.
async fn next_message(conn: &mut mpsc::Receiver<bytes::Bytes>) -> Message {
    let mut buf = bytes::BytesMut::new();
    loop {
        match codec::decode_frame(&mut buf, codec::READ_BYTES_LIMIT).expect("a frame") {
            Some(message) if codec::is_link_heartbeat(&message) => {}
            Some(message) => return message,
            None => buf.extend_from_slice(&conn.recv().await.expect("a write")),
        }
    }
}

#[tokio::test]
async fn a_writer_takes_the_newest_attached_connection() {
    let a = member(1, &[2], &[]).await;
    a.transport
        .set_peers(&[(2, vec!["http://127.0.0.1:1".to_owned()])]);
    let (first, mut first_rx) = mpsc::channel(16);
    assert!(a.transport.attach(2, StreamType::Message, first).await);
    until(|| stream_working(&a.transport, 2, StreamType::Message)).await;
    a.transport
        .send(vec![message(MessageType::MsgHeartbeat, 1, 2)]);
    let sent = next_message(&mut first_rx).await;
    assert_eq!(sent.get_msg_type(), MessageType::MsgHeartbeat);
    // Re-attached (the peer's reader dialled again): the old connection is let go.
    let (second, mut second_rx) = mpsc::channel(16);
    assert!(a.transport.attach(2, StreamType::Message, second).await);
    until(|| first_rx.is_closed()).await;
    a.transport
        .send(vec![message(MessageType::MsgRequestVote, 1, 2)]);
    let sent = next_message(&mut second_rx).await;
    assert_eq!(sent.get_msg_type(), MessageType::MsgRequestVote);
    // No link, no attachment.
    let (third, _third_rx) = mpsc::channel(16);
    assert!(!a.transport.attach(9, StreamType::Message, third).await);
}

#[tokio::test]
async fn messages_go_by_pipeline_until_a_stream_attaches_then_by_stream() {
    // Member 2 has no link to 1, so no reader of its attaches to 1's writers: 1 posts.
    let one = member(1, &[2], &[]).await;
    let two = member(2, &[1], &[]).await;
    one.transport.set_peers(&[(2, vec![two.url.clone()])]);
    one.transport
        .send(vec![message(MessageType::MsgHeartbeat, 1, 2)]);
    until(|| two.host.stepped() == [(MessageType::MsgHeartbeat, 1)]).await;
    assert!(!stream_working(&one.transport, 2, StreamType::Message));
    until(|| one.transport.is_active(2)).await;
    // Once 2 links to 1, its readers attach to 1's writers, and messages take the streams.
    two.transport.set_peers(&[(1, vec![one.url.clone()])]);
    until(|| {
        stream_working(&one.transport, 2, StreamType::Message)
            && stream_working(&one.transport, 2, StreamType::MsgAppV2)
    })
    .await;
    one.transport.send(vec![
        message(MessageType::MsgAppend, 1, 2),
        message(MessageType::MsgRequestVote, 1, 2),
    ]);
    until(|| two.host.stepped().len() == 3).await;
    let stepped = two.host.stepped();
    assert!(stepped.contains(&(MessageType::MsgAppend, 1)));
    assert!(stepped.contains(&(MessageType::MsgRequestVote, 1)));
}

#[tokio::test]
async fn a_snapshot_is_sent_with_its_image_and_received_into_the_inbox() {
    let one = member(1, &[2], &[]).await;
    let two = member(2, &[1], &[]).await;
    one.transport.set_peers(&[(2, vec![two.url.clone()])]);
    let mut snapshot = message(MessageType::MsgSnapshot, 1, 2);
    snapshot.mut_snapshot().mut_metadata().index = 42;
    snapshot.mut_snapshot().mut_metadata().term = 3;
    one.transport.send(vec![snapshot]);
    until(|| !one.host.reports.lock().is_empty()).await;
    assert_eq!(*one.host.reports.lock(), [(2, true)]);
    assert_eq!(*two.host.received.lock(), [(42, IMAGE.to_vec())]);
    let stepped = two.host.stepped.lock();
    assert_eq!(stepped.len(), 1);
    assert_eq!(stepped[0].get_msg_type(), MessageType::MsgSnapshot);
    assert_eq!(stepped[0].get_snapshot().get_metadata().index, 42);
    assert_eq!(&stepped[0].get_snapshot().data[..], SNAPSHOT_DATA);
}

/// A peer whose stream reader said it takes a stream of pairs gets the image as one; the
/// member reads it as it arrives (no file in the inbox).
#[tokio::test]
async fn a_snapshot_to_a_peer_that_takes_pairs_goes_as_pairs() {
    let one = member(1, &[2], &[]).await;
    let two = member(2, &[1], &[]).await;
    one.transport.set_peers(&[(2, vec![two.url.clone()])]);
    two.transport.set_peers(&[(1, vec![one.url.clone()])]);
    until(|| stream_working(&one.transport, 2, StreamType::Message)).await;
    let mut snapshot = message(MessageType::MsgSnapshot, 1, 2);
    snapshot.mut_snapshot().mut_metadata().index = 43;
    one.transport.send(vec![snapshot]);
    until(|| !one.host.reports.lock().is_empty()).await;
    assert_eq!(*one.host.reports.lock(), [(2, true)]);
    assert_eq!(*two.host.streamed.lock(), [(43, PAIRS_IMAGE.to_vec())]);
    assert!(two.host.received.lock().is_empty());
    let stepped = two.host.stepped.lock();
    assert_eq!(stepped.len(), 1);
    assert_eq!(stepped[0].get_snapshot().get_metadata().index, 43);
}

#[tokio::test]
async fn a_snapshot_from_a_stranger_is_refused_and_reported() {
    // Member 2 knows no member 1 and has no link to it.
    let one = member(1, &[2], &[]).await;
    let two = member(2, &[], &[]).await;
    one.transport.set_peers(&[(2, vec![two.url.clone()])]);
    let mut snapshot = message(MessageType::MsgSnapshot, 1, 2);
    snapshot.mut_snapshot().mut_metadata().index = 7;
    one.transport.send(vec![snapshot]);
    until(|| !one.host.reports.lock().is_empty()).await;
    assert_eq!(*one.host.reports.lock(), [(2, false)]);
    assert!(two.host.received.lock().is_empty());
    assert!(two.host.stepped().is_empty());
}

#[tokio::test]
async fn the_pipeline_refuses_a_removed_member_and_tells_it() {
    // Member 2 has member 7 on its removed list; a message from 7 gets 403, and whoever
    // posted it learns that it was removed. Raft's local types are dropped, not stepped.
    let one = member(1, &[2], &[]).await;
    let two = member(2, &[1], &[7]).await;
    one.transport.set_peers(&[(2, vec![two.url.clone()])]);
    one.transport.send(vec![
        message(MessageType::MsgHup, 1, 2),
        message(MessageType::MsgHeartbeat, 7, 2),
    ]);
    until(|| one.host.told_removed.load(Ordering::SeqCst)).await;
    assert!(two.host.stepped().is_empty());
    // The refusal as etcd words it.
    let mut post = message(MessageType::MsgHeartbeat, 7, 2);
    post.term = 2;
    let request = one
        .transport
        .stamp(axum::http::Request::post(format!("{}/raft", two.url)))
        .body(axum::body::Body::from(
            codec::encode_message(&post).expect("encode"),
        ))
        .expect("request");
    let response = one
        .transport
        .client()
        .request(request)
        .await
        .expect("answer");
    assert_eq!(response.status(), axum::http::StatusCode::FORBIDDEN);
    let body = axum::body::to_bytes(axum::body::Body::new(response.into_body()), 1024)
        .await
        .expect("body");
    assert_eq!(
        &body[..],
        br#"{"message":"cannot process message from removed member"}"#
    );
}

#[tokio::test]
async fn a_stream_goes_through_the_same_gate() {
    // Member 2 dials 1's streams; what comes from removed member 7 or is one of raft's local
    // types is dropped there too, and what follows it on the stream is stepped.
    let one = member(1, &[2], &[]).await;
    let two = member(2, &[1], &[7]).await;
    one.transport.set_peers(&[(2, vec![two.url.clone()])]);
    two.transport.set_peers(&[(1, vec![one.url.clone()])]);
    until(|| stream_working(&one.transport, 2, StreamType::Message)).await;
    one.transport.send(vec![
        message(MessageType::MsgHup, 1, 2),
        message(MessageType::MsgHeartbeat, 7, 2),
        message(MessageType::MsgRequestVote, 1, 2),
    ]);
    until(|| !two.host.stepped().is_empty()).await;
    assert!(stream_working(&one.transport, 2, StreamType::Message));
    assert_eq!(two.host.stepped(), [(MessageType::MsgRequestVote, 1)]);
}

#[tokio::test]
async fn a_stream_dial_refused_as_removed_tells_the_member() {
    // Member 1 has 2 on its removed list: 2's readers get 410 Gone and 2 learns of it.
    let one = member(1, &[2], &[2]).await;
    let two = member(2, &[1], &[]).await;
    two.transport.set_peers(&[(1, vec![one.url.clone()])]);
    until(|| two.host.told_removed.load(Ordering::SeqCst)).await;
}
