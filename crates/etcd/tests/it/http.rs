//! Plain HTTP endpoints on the client port: /health, /version, /metrics.

use std::time::Duration;

use crate::start;

#[tokio::test]
async fn health_version_metrics() {
    let (m, _c) = start().await;

    // etcd 3.4 answers {"health":"true"}; etcd 3.5 (our target) adds "reason":
    // {"health":"true","reason":""}. Both are accepted.
    let h = m.http_get("/health").await.unwrap();
    assert_eq!(h.status, 200);
    assert!(
        h.body == r#"{"health":"true"}"# || h.body == r#"{"health":"true","reason":""}"#,
        "{:?}",
        h.body
    );

    let v = m.http_get("/version").await.unwrap();
    assert_eq!(v.status, 200);
    assert_eq!(v.header("content-type"), Some("application/json"));
    let json = v.json().unwrap();
    let server = json["etcdserver"].as_str().expect("etcdserver string");
    let cluster = json["etcdcluster"].as_str().expect("etcdcluster string");
    // Byte for byte what Go's encoding/json makes of etcd's `Versions` struct (field order).
    assert_eq!(
        v.body,
        format!(r#"{{"etcdserver":"{server}","etcdcluster":"{cluster}"}}"#)
    );
    // e.g. {"etcdserver":"3.4.23","etcdcluster":"3.4.0"}: cluster version is major.minor.0.
    let parts: Vec<&str> = server.split('.').collect();
    assert_eq!(parts.len(), 3, "{server}");
    assert!(parts.iter().all(|p| p.parse::<u32>().is_ok()), "{server}");
    assert_eq!(cluster, format!("{}.{}.0", parts[0], parts[1]));
    assert_eq!(parts[0], "3");

    let metrics = m.http_get("/metrics").await.unwrap();
    assert_eq!(metrics.status, 200);
    assert!(
        metrics
            .header("content-type")
            .is_some_and(|t| t.starts_with("text/plain")),
        "{:?}",
        metrics.headers
    );
    let lines: Vec<&str> = metrics.body.lines().collect();
    assert!(
        lines.contains(&"etcd_server_has_leader 1"),
        "has_leader missing"
    );
    assert!(lines.contains(&"# TYPE etcd_server_has_leader gauge"));
    assert!(
        lines
            .iter()
            .any(|l| l.starts_with("etcd_mvcc_db_total_size_in_bytes "))
    );
    assert!(
        lines
            .iter()
            .any(|l| l.starts_with("etcd_server_is_leader 1"))
    );

    // Unknown paths are 404.
    let nf = m.http_get("/no/such/path").await.unwrap();
    assert_eq!(nf.status, 404);
}

/// `curl -X POST -d <body> <url>`: the status and the body.
fn post(url: &str, body: &str) -> (String, String) {
    let out = std::process::Command::new("curl")
        .args(["-s", "-X", "POST", "-d", body, "-w", "\n%{http_code}", url])
        .output()
        .expect("curl runs");
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let (body, status) = text.rsplit_once('\n').unwrap_or((&text, ""));
    (status.to_owned(), body.to_owned())
}

/// etcd's gates on the client port: the v2 keys API only with `--enable-v2` (off by default),
/// the JSON gateway unless `--enable-grpc-gateway=false`. A gated path answers Go's plain 404.
/// Runs on etcd 3.4 too.
#[tokio::test]
async fn v2_and_json_gateway_are_served_as_their_flags_say() {
    let not_found = ("404".to_owned(), "404 page not found\n".to_owned());
    let (default, _c) = start().await;
    let base = default.endpoint();
    assert_eq!(post(&format!("{base}/v2/keys/k"), "value=v"), not_found);
    let (status, body) = post(
        &format!("{base}/v3/kv/put"),
        r#"{"key":"aw==","value":"dg=="}"#,
    );
    assert_eq!(status, "200", "{body}");

    let (v2, _c) = crate::start_with(&["--enable-v2"]).await;
    let url = format!("{}/v2/keys/k", v2.endpoint());
    let out = std::process::Command::new("curl")
        .args([
            "-s",
            "-X",
            "PUT",
            "-d",
            "value=v",
            "-w",
            "\n%{http_code}",
            &url,
        ])
        .output()
        .expect("curl runs");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.ends_with("\n201"), "{text}");

    let (no_gateway, _c) = crate::start_with(&["--enable-grpc-gateway=false"]).await;
    let base = no_gateway.endpoint();
    assert_eq!(post(&format!("{base}/v3/kv/range"), "{}"), not_found);
}

/// `curl -i` of `url` with extra arguments: the status line's code, the headers (lower-cased
/// names) and the body.
fn curl_i(url: &str, args: &[&str]) -> (String, Vec<(String, String)>, String) {
    let out = std::process::Command::new("curl")
        .args(["-s", "-i"])
        .args(args)
        .arg(url)
        .output()
        .expect("curl runs");
    let text = String::from_utf8_lossy(&out.stdout).replace("\r\n", "\n");
    let (head, body) = text.split_once("\n\n").unwrap_or((&text, ""));
    let mut lines = head.lines();
    let status = lines
        .next()
        .and_then(|l| l.split_whitespace().nth(1))
        .unwrap_or_default()
        .to_owned();
    let headers = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_ascii_lowercase(), v.trim().to_owned()))
        .collect();
    (status, headers, body.to_owned())
}

fn header<'a>(headers: &'a [(String, String)], name: &str) -> Option<&'a str> {
    headers
        .iter()
        .find(|(k, _)| k == name)
        .map(|(_, v)| v.as_str())
}

/// etcd's access controller on the HTTP endpoints: `--host-whitelist` refuses a plain-text
/// request for another Host with 421 and etcd's explanation (the same bytes as etcd 3.4's),
/// `--cors` decides the CORS headers (`*` by default), `OPTIONS` is answered at once.
#[tokio::test]
async fn host_whitelist_and_cors_as_etcd() {
    let refusal = |bin: etcdrs_testkit::EtcdBin| async move {
        let m = etcdrs_testkit::Member::start(
            etcdrs_testkit::MemberOpts::new(&bin)
                .setting("host-whitelist", "127.0.0.1,localhost")
                .setting("cors", "https://a.example:8443"),
        )
        .await
        .expect("member starts");
        let health = format!("{}/health", m.endpoint());
        let (status, _, _) = curl_i(&health, &[]);
        assert_eq!(status, "200");
        let (status, headers, body) = curl_i(&health, &["-H", "Host: rebind.example:2379"]);
        assert_eq!(status, "421", "{body}");
        let allowed = curl_i(&health, &["-H", "Origin: https://a.example:8443"]).1;
        let other = curl_i(&health, &["-H", "Origin: https://b.example"]).1;
        let options = curl_i(
            &health,
            &["-X", "OPTIONS", "-H", "Origin: https://a.example"],
        );
        (
            body,
            header(&headers, "content-type").map(str::to_owned),
            header(&allowed, "access-control-allow-origin").map(str::to_owned),
            header(&other, "access-control-allow-origin").map(str::to_owned),
            options.0,
        )
    };
    let ours = refusal(crate::bin()).await;
    let etcd = refusal(etcdrs_testkit::EtcdBin::at("/usr/bin/etcd")).await;
    assert_eq!(ours, etcd);
    assert!(
        ours.0.contains("--host-whitelist \"rebind.example\""),
        "{}",
        ours.0
    );
    assert_eq!(ours.2.as_deref(), Some("https://a.example:8443"));
    assert_eq!(ours.3, None);
    assert_eq!(ours.4, "200");

    // By default every host and origin is allowed.
    let (m, _c) = start().await;
    let (status, headers, _) = curl_i(
        &format!("{}/health", m.endpoint()),
        &["-H", "Host: rebind.example"],
    );
    assert_eq!(status, "200");
    assert_eq!(header(&headers, "access-control-allow-origin"), Some("*"));
}

/// etcd 3.5's `--listen-client-http-urls`: the HTTP endpoints (health, metrics, the JSON
/// gateway) are served there, and `--listen-client-urls` keeps gRPC alone. Ours only: etcd 3.4
/// has no such flag.
#[tokio::test]
async fn listen_client_http_urls_take_the_http_endpoints() {
    if !crate::ours() {
        return;
    }
    let port = etcdrs_testkit::ports::reserve().expect("port");
    let http_url = format!("http://127.0.0.1:{}", port.port());
    let (m, mut client) = crate::start_with(&["--listen-client-http-urls", &http_url]).await;
    client
        .put("k", "v", None)
        .await
        .expect("gRPC on the client URL");
    let (status, _, body) = curl_i(&format!("{http_url}/health"), &[]);
    assert_eq!(status, "200", "{body}");
    let (status, body) = post(&format!("{http_url}/v3/kv/range"), r#"{"key":"aw=="}"#);
    assert_eq!(status, "200", "{body}");
    assert!(body.contains(r#""value":"dg==""#), "{body}");
    let (status, _, _) = curl_i(&format!("{}/health", m.endpoint()), &[]);
    assert_eq!(status, "404", "the client URL serves gRPC only");
}

/// A raw HTTP/2 connection (prior knowledge, as gRPC clients speak to a plain port): the
/// client preface and an empty SETTINGS frame sent.
pub(crate) async fn h2_connect(addr: &str) -> tokio::net::TcpStream {
    use tokio::io::AsyncWriteExt;
    let mut tcp = tokio::net::TcpStream::connect(addr).await.expect("connect");
    tcp.write_all(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n")
        .await
        .expect("preface");
    tcp.write_all(&[0, 0, 0, 4, 0, 0, 0, 0, 0])
        .await
        .expect("settings");
    tcp
}

/// The next frame: (type, flags, payload); `None` at the end of the connection.
pub(crate) async fn h2_frame(tcp: &mut tokio::net::TcpStream) -> Option<(u8, u8, Vec<u8>)> {
    use tokio::io::AsyncReadExt;
    let mut head = [0u8; 9];
    tcp.read_exact(&mut head).await.ok()?;
    let len = (usize::from(head[0]) << 16) | (usize::from(head[1]) << 8) | usize::from(head[2]);
    let mut payload = vec![0u8; len];
    tcp.read_exact(&mut payload).await.ok()?;
    Some((head[3], head[4], payload))
}

pub(crate) const H2_SETTINGS: u8 = 4;
const H2_PING: u8 = 6;
const H2_GOAWAY: u8 = 7;

/// `--max-concurrent-streams`: the server's SETTINGS frame announces it to every connection.
#[tokio::test]
async fn max_concurrent_streams_is_announced_in_settings() {
    let (m, _c) = crate::start_with(&["--max-concurrent-streams=7"]).await;
    assert_eq!(announced_max_streams(&m.client_addr()).await, Some(7));
}

/// `--max-concurrent-streams` driven past its limit (issue 20): on a connection with 7 streams
/// open, each of 100 more is refused with RST_STREAM REFUSED_STREAM (as grpc-go refuses
/// it), the open ones stay, the member's memory stays flat and another client is served.
#[tokio::test]
async fn streams_past_max_concurrent_streams_are_refused() {
    use crate::keepalive::RawH2;
    const RST_STREAM: u8 = 3;
    const REFUSED_STREAM: u32 = 7;
    let (m, mut client) = crate::start_with(&["--max-concurrent-streams=7"]).await;
    let pid = m.pid().expect("running");
    let mut c = RawH2::connect(&m.client_addr()).await;
    for id in (1..=13).step_by(2) {
        c.open_watch(id).await;
    }
    let before = etcdrs_testkit::memory::rss_bytes(pid).expect("rss");
    for n in 0..100u32 {
        let id = 15 + 2 * n;
        c.open_stream(id).await;
        let refusal = tokio::time::timeout(Duration::from_secs(10), async {
            loop {
                let frame = c.read_frame().await.expect("the connection stays open");
                if frame.kind == RST_STREAM {
                    return frame.payload;
                }
            }
        })
        .await
        .expect("a refusal within 10 s");
        assert_eq!(refusal, REFUSED_STREAM.to_be_bytes(), "stream {id}");
    }
    client.put("during", "v", None).await.expect("served");
    etcdrs_testkit::memory::assert_rss_flat(pid, before, 8 << 20, "100 refused streams");
    // The open watchers still see writes: seven events.
    client.put("k", "v", None).await.expect("put");
    let events = tokio::time::timeout(Duration::from_secs(10), async {
        let mut events = 0;
        while events < 7 {
            let frame = c.read_frame().await.expect("the connection stays open");
            events += usize::from(frame.kind == 0);
        }
    })
    .await;
    assert!(events.is_ok(), "the seven open watchers each got the put");
}

/// SETTINGS_MAX_CONCURRENT_STREAMS as the server at `addr` announces it.
pub(crate) async fn announced_max_streams(addr: &str) -> Option<u32> {
    let mut tcp = h2_connect(addr).await;
    let settings = tokio::time::timeout(Duration::from_secs(5), async {
        loop {
            match h2_frame(&mut tcp).await {
                Some((H2_SETTINGS, 0, payload)) => return payload,
                Some(_) => continue,
                None => panic!("connection ended before the server's SETTINGS"),
            }
        }
    })
    .await
    .expect("server SETTINGS");
    settings.chunks_exact(6).find_map(|entry| {
        (u16::from_be_bytes([entry[0], entry[1]]) == 3)
            .then(|| u32::from_be_bytes([entry[2], entry[3], entry[4], entry[5]]))
    })
}

/// `--grpc-keepalive-interval` and `--grpc-keepalive-timeout`: an idle connection is pinged
/// after the interval, and closed when the ping goes unanswered for the timeout.
#[tokio::test]
async fn grpc_keepalive_pings_idle_clients_and_drops_silent_ones() {
    use tokio::io::AsyncWriteExt;
    let (m, _c) = crate::start_with(&[
        "--grpc-keepalive-interval=1s",
        "--grpc-keepalive-timeout=1s",
    ])
    .await;
    let mut tcp = h2_connect(&m.client_addr()).await;
    let pinged = tokio::time::timeout(Duration::from_secs(10), async {
        loop {
            match h2_frame(&mut tcp).await {
                Some((H2_SETTINGS, 0, _)) => {
                    // Acknowledge the server's settings, as a client must.
                    tcp.write_all(&[0, 0, 0, 4, 1, 0, 0, 0, 0])
                        .await
                        .expect("ack");
                }
                Some((H2_PING, 0, _)) => return true,
                Some(_) => continue,
                None => return false,
            }
        }
    })
    .await
    .expect("a ping within 10 s");
    assert!(pinged, "the connection ended before any ping");
    // Not answered: the server gives up on the connection.
    let closed = tokio::time::timeout(Duration::from_secs(10), async {
        loop {
            match h2_frame(&mut tcp).await {
                Some((H2_GOAWAY, _, _)) | None => return,
                Some(_) => continue,
            }
        }
    })
    .await;
    assert!(closed.is_ok(), "the unanswered connection was kept open");
}
