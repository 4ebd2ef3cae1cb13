//! The ping policy over in-memory connections: the test writes the client's frames, reads
//! them through [`Policed`] as hyper would, writes the server's frames through it, and reads
//! what the client receives. Time is paused, so "at once" is the same instant.

use futures::FutureExt;
use tokio::io::{AsyncReadExt, AsyncWriteExt, DuplexStream};

use super::*;

const MIN: Duration = Duration::from_secs(5);

struct Conn {
    client: DuplexStream,
    server: Policed<DuplexStream>,
}

fn frame(kind: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
    let mut f = Vec::with_capacity(FRAME_HEADER_LEN + payload.len());
    f.extend_from_slice(&(payload.len() as u32).to_be_bytes()[1..]);
    f.push(kind);
    f.push(flags);
    f.extend_from_slice(&stream.to_be_bytes());
    f.extend_from_slice(payload);
    f
}

fn ping() -> Vec<u8> {
    frame(TYPE_PING, 0, 0, &[7; 8])
}

/// A HEADERS frame; the block is not looked at, so any bytes do.
fn headers(stream: u32, flags: u8) -> Vec<u8> {
    frame(TYPE_HEADERS, flags | 0x4, stream, &[0x82])
}

fn data(stream: u32, flags: u8) -> Vec<u8> {
    frame(TYPE_DATA, flags, stream, b"0123456789")
}

impl Conn {
    /// A policed connection past the client's preface and SETTINGS.
    async fn new(min_time: Duration) -> Conn {
        let (client, server) = tokio::io::duplex(64 * 1024);
        let server = Policed::new(
            server,
            Some(PingPolicy { min_time }),
            ([127, 0, 0, 1], 1).into(),
        );
        let mut conn = Conn { client, server };
        let mut hello = PREFACE.to_vec();
        hello.extend(frame(0x4, 0, 0, &[]));
        conn.send(&hello).await;
        conn
    }

    /// The client sends `bytes`; the server reads them all. `false`: the server's read
    /// ended the connection instead.
    async fn send(&mut self, bytes: &[u8]) -> bool {
        self.client.write_all(bytes).await.unwrap();
        let mut got = vec![0; bytes.len()];
        let mut at = 0;
        while at < bytes.len() {
            let n = self.server.read(&mut got[at..]).await.unwrap();
            if n == 0 {
                return false;
            }
            at += n;
        }
        assert_eq!(got, bytes, "the server reads what the client sent");
        // A GOAWAY that came due with these bytes is sent on the next read.
        let mut more = [0u8; 1];
        match self.server.read(&mut more).now_or_never() {
            None => true,
            Some(Ok(0)) => false,
            Some(other) => panic!("unexpected read {other:?}"),
        }
    }

    async fn ping(&mut self) -> bool {
        self.send(&ping()).await
    }

    /// Everything the client has received, up to the server's close.
    async fn received(mut self) -> Vec<u8> {
        drop(self.server);
        let mut all = Vec::new();
        self.client.read_to_end(&mut all).await.unwrap();
        all
    }
}

/// The GOAWAY the policy sends: ENHANCE_YOUR_CALM, `too_many_pings`, `last` stream.
fn goaway(last: u32) -> Vec<u8> {
    let mut payload = last.to_be_bytes().to_vec();
    payload.extend_from_slice(&ENHANCE_YOUR_CALM.to_be_bytes());
    payload.extend_from_slice(TOO_MANY_PINGS);
    frame(TYPE_GOAWAY, 0, 0, &payload)
}

#[tokio::test(start_paused = true)]
async fn pings_with_no_stream_open_end_the_connection_at_the_third_strike() {
    let mut c = Conn::new(MIN).await;
    // The first ping has nothing before it; the next two are strikes one and two.
    for i in 0..3 {
        assert!(c.ping().await, "ping {i} is tolerated");
    }
    assert!(!c.ping().await, "the third strike closes the connection");
    assert_eq!(c.received().await, goaway(0));
}

#[tokio::test(start_paused = true)]
async fn pings_min_time_apart_with_a_stream_open_are_allowed_and_faster_ones_are_not() {
    let mut c = Conn::new(MIN).await;
    assert!(c.send(&headers(1, 0)).await);
    for i in 0..10 {
        if i > 0 {
            tokio::time::advance(MIN).await;
        }
        assert!(c.ping().await, "ping {i}, {MIN:?} after the one before");
    }
    // Just under the minimum, and then at once: strikes.
    tokio::time::advance(MIN - Duration::from_millis(1)).await;
    assert!(c.ping().await);
    assert!(c.ping().await);
    assert!(!c.ping().await, "the third ping too soon ends it");
    assert_eq!(c.received().await, goaway(1));
}

#[tokio::test(start_paused = true)]
async fn a_ping_after_the_server_wrote_is_forgiven() {
    let mut c = Conn::new(MIN).await;
    assert!(c.send(&headers(1, 0)).await);
    let mut sent = Vec::new();
    for i in 0..10 {
        let d = data(1, 0);
        c.server.write_all(&d).await.unwrap();
        sent.extend(d);
        assert!(c.ping().await, "ping {i} right after an answer");
    }
    // Without answers in between, the usual count: three strikes.
    assert!(c.ping().await);
    assert!(c.ping().await);
    assert!(!c.ping().await);
    sent.extend(goaway(1));
    assert_eq!(c.received().await, sent);
}

#[tokio::test(start_paused = true)]
async fn a_stream_the_server_ended_no_longer_counts_as_open() {
    let mut c = Conn::new(MIN).await;
    assert!(c.send(&headers(1, 0x1)).await);
    let end = headers(1, FLAG_END_STREAM);
    c.server.write_all(&end).await.unwrap();
    // The first ping is forgiven (the server wrote); with no stream open, pings even a
    // minute apart are strikes.
    for _ in 0..3 {
        assert!(c.ping().await);
        tokio::time::advance(Duration::from_secs(60)).await;
    }
    assert!(!c.ping().await);
    let mut want = end;
    want.extend(goaway(1));
    assert_eq!(c.received().await, want);
}

#[tokio::test(start_paused = true)]
async fn a_stream_the_client_reset_no_longer_counts_as_open() {
    let mut c = Conn::new(MIN).await;
    assert!(c.send(&headers(3, 0)).await);
    assert!(c.send(&frame(TYPE_RST_STREAM, 0, 3, &[0, 0, 0, 8])).await);
    for _ in 0..3 {
        assert!(c.ping().await);
        tokio::time::advance(MIN).await;
    }
    assert!(
        !c.ping().await,
        "no stream open: a ping within two hours is a strike"
    );
    assert_eq!(c.received().await, goaway(3));
}

#[tokio::test(start_paused = true)]
async fn the_goaway_waits_for_the_end_of_a_frame_the_server_is_writing() {
    let mut c = Conn::new(MIN).await;
    let d = data(1, 0);
    c.server.write_all(&d[..5]).await.unwrap();
    // Half a frame header is not yet a write: no ping is forgiven.
    for _ in 0..3 {
        assert!(c.ping().await);
    }
    assert!(c.ping().await, "due, but the server is inside a frame");
    c.server.write_all(&d[5..]).await.unwrap();
    let refused = c.server.write_all(&data(1, 0)).await;
    assert_eq!(
        refused
            .expect_err("nothing is written after the GOAWAY")
            .kind(),
        io::ErrorKind::BrokenPipe
    );
    let mut eof = [0u8; 1];
    assert_eq!(c.server.read(&mut eof).await.unwrap(), 0, "reads end");
    let mut want = d;
    want.extend(goaway(0));
    assert_eq!(c.received().await, want);
}

#[tokio::test(start_paused = true)]
async fn http1_and_unpoliced_connections_pass_through() {
    for (policy, hello) in [
        (
            Some(PingPolicy { min_time: MIN }),
            b"GET /health HTTP/1.1\r\n\r\n".to_vec(),
        ),
        (None, PREFACE.to_vec()),
    ] {
        let (client, server) = tokio::io::duplex(64 * 1024);
        let mut c = Conn {
            client,
            server: Policed::new(server, policy, ([127, 0, 0, 1], 1).into()),
        };
        assert!(c.send(&hello).await);
        for _ in 0..10 {
            assert!(c.ping().await, "nothing is policed");
        }
        c.server.write_all(b"reply").await.unwrap();
        assert_eq!(c.received().await, b"reply");
    }
}

#[test]
fn etcd_zero_min_time_is_grpc_go_default() {
    assert_eq!(
        PingPolicy::etcd(Duration::ZERO).min_time,
        Duration::from_secs(300)
    );
    assert_eq!(PingPolicy::etcd(MIN).min_time, MIN);
}
