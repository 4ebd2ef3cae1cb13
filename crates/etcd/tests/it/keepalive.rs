//! Keep-alive enforcement (`--grpc-keepalive-min-time`, issue 20): a client that pings the
//! client port more often than the policy allows gets grpc-go's `GOAWAY` (ENHANCE_YOUR_CALM,
//! `too_many_pings`) and is disconnected, as etcd's server does; one within the policy is
//! left alone. The client here writes HTTP/2 frames by hand (no client library paces its
//! pings the way a misbehaving one would), so the same tests run against etcd 3.4.

use std::time::Duration;

use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;
use tokio::time::{Instant, timeout};

use crate::{start, start_with};

use crate::http::{H2_SETTINGS as SETTINGS, h2_connect, h2_frame};

const DATA: u8 = 0x0;
const HEADERS: u8 = 0x1;
const PING: u8 = 0x6;
const GOAWAY: u8 = 0x7;
const ENHANCE_YOUR_CALM: u32 = 0xb;

/// One frame read from the server.
pub(crate) struct Frame {
    pub(crate) kind: u8,
    pub(crate) flags: u8,
    pub(crate) payload: Vec<u8>,
}

/// An HTTP/2 connection driven frame by frame (also for the stream limit's test).
pub(crate) struct RawH2 {
    tcp: TcpStream,
    authority: String,
}

/// What the server did within a wait.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Heard {
    /// Nothing but its own housekeeping (SETTINGS, PING acks, window updates).
    Quiet,
    /// GOAWAY: last stream id, error code, debug data.
    GoAway(u32, u32, String),
    /// The connection closed without a GOAWAY.
    Closed,
}

impl RawH2 {
    /// Connects and sends the client preface and an empty SETTINGS.
    pub(crate) async fn connect(addr: &str) -> RawH2 {
        RawH2 {
            tcp: h2_connect(addr).await,
            authority: addr.to_owned(),
        }
    }

    pub(crate) async fn send(&mut self, kind: u8, flags: u8, stream: u32, payload: &[u8]) {
        let mut f = (payload.len() as u32).to_be_bytes()[1..].to_vec();
        f.extend([kind, flags]);
        f.extend(stream.to_be_bytes());
        f.extend(payload);
        // A write may fail once the server has closed: what it said is read afterwards.
        let _ = self.tcp.write_all(&f).await;
    }

    async fn ping(&mut self) {
        self.send(PING, 0, 0, b"pingpong").await;
    }

    /// Opens stream `id` as a Watch call with one watcher and reads the server's answer
    /// (the watcher created): a stream the server then holds open and writes nothing on.
    pub(crate) async fn open_watch(&mut self, id: u32) {
        self.start_watch(id).await;
        let created = timeout(Duration::from_secs(10), async {
            loop {
                let frame = self.read_frame().await.expect("the connection stays open");
                match frame.kind {
                    SETTINGS if frame.flags & 0x1 == 0 => self.send(SETTINGS, 0x1, 0, &[]).await,
                    DATA => return,
                    _ => {}
                }
            }
        })
        .await;
        assert!(created.is_ok(), "the watcher is created within 10 s");
    }

    /// Sends the HEADERS and the create request of a Watch call on stream `id`.
    async fn start_watch(&mut self, id: u32) {
        self.open_stream(id).await;
        // A gRPC message: WatchRequest { create_request { key: "k" } }.
        let request = [0x0a, 0x03, 0x0a, 0x01, b'k'];
        let mut message = vec![0, 0, 0, 0, request.len() as u8];
        message.extend(request);
        self.send(DATA, 0, id, &message).await;
    }

    /// Sends the HEADERS of a Watch call on stream `id`.
    pub(crate) async fn open_stream(&mut self, id: u32) {
        let mut block = Vec::new();
        let authority = self.authority.clone();
        for (name, value) in [
            (":method", "POST"),
            (":scheme", "http"),
            (":path", "/etcdserverpb.Watch/Watch"),
            (":authority", authority.as_str()),
            ("content-type", "application/grpc"),
            ("te", "trailers"),
        ] {
            // HPACK literal without indexing, new name, no Huffman coding (RFC 7541 §6.2.2).
            block.push(0);
            block.push(name.len() as u8);
            block.extend(name.as_bytes());
            block.push(value.len() as u8);
            block.extend(value.as_bytes());
        }
        self.send(HEADERS, 0x4, id, &block).await;
    }

    pub(crate) async fn read_frame(&mut self) -> Option<Frame> {
        let (kind, flags, payload) = h2_frame(&mut self.tcp).await?;
        Some(Frame {
            kind,
            flags,
            payload,
        })
    }

    /// Reads what the server sends for `wait` (acknowledging its SETTINGS), or until it
    /// sends GOAWAY or closes.
    async fn listen(&mut self, wait: Duration) -> Heard {
        let until = Instant::now() + wait;
        loop {
            let Ok(frame) = timeout(until.saturating_duration_since(Instant::now()), async {
                self.read_frame().await
            })
            .await
            else {
                return Heard::Quiet;
            };
            let Some(frame) = frame else {
                return Heard::Closed;
            };
            match frame.kind {
                SETTINGS if frame.flags & 0x1 == 0 => self.send(SETTINGS, 0x1, 0, &[]).await,
                GOAWAY => return goaway(&frame.payload),
                _ => {}
            }
        }
    }

    /// Reads until the server acknowledges a ping (`Quiet`), sends GOAWAY or closes.
    async fn acked(&mut self) -> Heard {
        let answer = timeout(Duration::from_secs(10), async {
            loop {
                let Some(frame) = self.read_frame().await else {
                    return Heard::Closed;
                };
                match frame.kind {
                    PING if frame.flags & 0x1 != 0 => return Heard::Quiet,
                    SETTINGS if frame.flags & 0x1 == 0 => self.send(SETTINGS, 0x1, 0, &[]).await,
                    GOAWAY => return goaway(&frame.payload),
                    _ => {}
                }
            }
        })
        .await;
        answer.expect("the server answers a ping within 10 s")
    }

    /// After a GOAWAY: the server closes the connection.
    async fn closes(&mut self) {
        let closed = timeout(Duration::from_secs(10), async {
            while self.read_frame().await.is_some() {}
        })
        .await;
        assert!(
            closed.is_ok(),
            "the server closes the connection after GOAWAY"
        );
    }
}

/// What a GOAWAY frame's payload says.
fn goaway(p: &[u8]) -> Heard {
    assert!(p.len() >= 8, "a GOAWAY payload of {} bytes", p.len());
    Heard::GoAway(
        u32::from_be_bytes([p[0], p[1], p[2], p[3]]) & 0x7fff_ffff,
        u32::from_be_bytes([p[4], p[5], p[6], p[7]]),
        String::from_utf8_lossy(&p[8..]).into_owned(),
    )
}

fn too_many_pings(last_stream: u32) -> Heard {
    Heard::GoAway(last_stream, ENHANCE_YOUR_CALM, "too_many_pings".into())
}

/// Sends `n` pings, each once the server acknowledged the one before and then stayed quiet
/// for `linger` (so that what the server does about a ping is seen before the next one);
/// returns what the server did after each ping, up to the first that was not quiet.
async fn pings(c: &mut RawH2, n: usize, linger: Duration) -> Vec<Heard> {
    let mut heard = Vec::new();
    for _ in 0..n {
        c.ping().await;
        let h = match c.acked().await {
            Heard::Quiet => c.listen(linger).await,
            other => other,
        };
        let quiet = h == Heard::Quiet;
        heard.push(h);
        if !quiet {
            break;
        }
    }
    heard
}

#[tokio::test]
async fn a_client_pinging_with_no_stream_open_is_sent_away_and_others_are_served() {
    // With no stream open, grpc-go allows one ping per two hours; the third strike (the
    // fourth ping) ends the connection. 200 such clients cost the member nothing that stays.
    let (m, mut client) = start().await;
    let pid = m.pid().expect("running");
    let mut c = RawH2::connect(&m.client_addr()).await;
    let heard = pings(&mut c, 5, Duration::from_millis(100)).await;
    assert_eq!(
        heard,
        [Heard::Quiet, Heard::Quiet, Heard::Quiet, too_many_pings(0)],
        "the fourth ping is the third strike"
    );
    c.closes().await;

    let before = etcdrs_testkit::memory::rss_bytes(pid).expect("rss");
    for i in 0..200 {
        let mut c = RawH2::connect(&m.client_addr()).await;
        for _ in 0..4 {
            c.ping().await;
        }
        assert_eq!(
            c.listen(Duration::from_secs(10)).await,
            too_many_pings(0),
            "client {i}"
        );
        if i % 50 == 0 {
            client
                .put(format!("k{i}"), "v", None)
                .await
                .expect("served");
        }
    }
    etcdrs_testkit::memory::assert_rss_flat(pid, before, 8 << 20, "200 ping floods");
    let got = client.get("k150", None).await.expect("get");
    assert_eq!(got.kvs().len(), 1, "another client is served throughout");
}

#[tokio::test]
async fn the_min_time_sets_how_often_a_client_with_a_stream_open_may_ping() {
    // --grpc-keepalive-min-time=500ms: pings 600 ms apart on a connection with a stream
    // open are allowed, and a burst is not.
    let (m, _client) = start_with(&["--grpc-keepalive-min-time=500ms"]).await;
    let mut c = RawH2::connect(&m.client_addr()).await;
    c.open_watch(1).await;
    let heard = pings(&mut c, 5, Duration::from_millis(600)).await;
    assert_eq!(heard, vec![Heard::Quiet; 5], "pings at the allowed pace");
    let heard = pings(&mut c, 5, Duration::from_millis(50)).await;
    assert_eq!(
        heard,
        [Heard::Quiet, Heard::Quiet, Heard::Quiet, too_many_pings(1)],
        "faster than 500 ms: the first is 600 ms after the last paced one, then three strikes"
    );
    c.closes().await;

    // etcd's default, 5 s: the same 400 ms pace is a strike every time.
    let (m, _client) = start().await;
    let mut c = RawH2::connect(&m.client_addr()).await;
    c.open_watch(1).await;
    let heard = pings(&mut c, 6, Duration::from_millis(400)).await;
    assert_eq!(
        heard,
        [Heard::Quiet, Heard::Quiet, Heard::Quiet, too_many_pings(1)],
        "400 ms apart under a 5 s minimum"
    );
    c.closes().await;
}
