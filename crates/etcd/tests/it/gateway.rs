//! etcd's JSON gateway on the client port (`POST /v3/...`), compared with etcd 3.4's exact
//! bodies: proto field names, 64-bit integers as strings, bytes as base64, zero values
//! omitted, grpc-gateway's error shape and HTTP statuses. Ids and terms are taken from each
//! response's own header, so the expected strings are otherwise byte-for-byte etcd's.

use std::time::Duration;

use anyhow::{Context, bail};
use serde_json::Value;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::start;

const TIMEOUT: Duration = Duration::from_secs(10);

/// A response: status and body (dechunked).
struct Reply {
    status: u16,
    body: String,
}

impl Reply {
    fn json(&self) -> Value {
        serde_json::from_str(&self.body).unwrap_or_else(|e| panic!("{e}: {:?}", self.body))
    }

    /// The response header as etcd prints it, rebuilt from this reply's own ids, with the given
    /// revision (`None`: the header has none, as member-list responses).
    fn header(&self, revision: Option<i64>) -> String {
        header_of(&self.json()["header"], revision)
    }
}

fn header_of(h: &Value, revision: Option<i64>) -> String {
    let cluster = h["cluster_id"].as_str().expect("cluster_id");
    let member = h["member_id"].as_str().expect("member_id");
    let term = h["raft_term"].as_str().expect("raft_term");
    match revision {
        Some(rev) => format!(
            r#"{{"cluster_id":"{cluster}","member_id":"{member}","revision":"{rev}","raft_term":"{term}"}}"#
        ),
        None => {
            format!(r#"{{"cluster_id":"{cluster}","member_id":"{member}","raft_term":"{term}"}}"#)
        }
    }
}

/// A streaming response whose body is read as it arrives, one line at a time.
struct Lines {
    tcp: TcpStream,
    /// Received bytes not yet decoded from chunked encoding.
    raw: Vec<u8>,
    /// Decoded body bytes not yet returned as lines.
    body: Vec<u8>,
    status: u16,
}

impl Lines {
    async fn open(addr: &str, path: &str, body: &str) -> anyhow::Result<Lines> {
        let mut tcp = TcpStream::connect(addr).await?;
        tcp.write_all(request(addr, path, body).as_bytes()).await?;
        let mut raw = Vec::new();
        let split = loop {
            if let Some(i) = raw.windows(4).position(|w| w == b"\r\n\r\n") {
                break i;
            }
            read_more(&mut tcp, &mut raw).await?;
        };
        let head = String::from_utf8_lossy(&raw[..split]).into_owned();
        let status = head
            .split(' ')
            .nth(1)
            .and_then(|s| s.parse().ok())
            .context("status line")?;
        if !head
            .to_ascii_lowercase()
            .contains("transfer-encoding: chunked")
        {
            bail!("streaming response is not chunked: {head}");
        }
        raw.drain(..split + 4);
        Ok(Lines {
            tcp,
            raw,
            body: Vec::new(),
            status,
        })
    }

    /// The next line of the body, without its newline.
    async fn next(&mut self) -> anyhow::Result<String> {
        tokio::time::timeout(TIMEOUT, self.next_inner())
            .await
            .context("no line within the timeout")?
    }

    async fn next_inner(&mut self) -> anyhow::Result<String> {
        loop {
            if let Some(i) = self.body.iter().position(|&b| b == b'\n') {
                let line: Vec<u8> = self.body.drain(..=i).collect();
                return Ok(String::from_utf8_lossy(&line[..i]).into_owned());
            }
            // Move every complete chunk from `raw` to `body`.
            while let Some(eol) = self.raw.windows(2).position(|w| w == b"\r\n") {
                let size = usize::from_str_radix(
                    String::from_utf8_lossy(&self.raw[..eol])
                        .split(';')
                        .next()
                        .unwrap_or_default()
                        .trim(),
                    16,
                )?;
                if size == 0 {
                    bail!(
                        "stream ended; unread: {:?}",
                        String::from_utf8_lossy(&self.body)
                    );
                }
                if self.raw.len() < eol + 2 + size + 2 {
                    break;
                }
                self.body
                    .extend_from_slice(&self.raw[eol + 2..eol + 2 + size]);
                self.raw.drain(..eol + 2 + size + 2);
            }
            if self.body.contains(&b'\n') {
                continue;
            }
            read_more(&mut self.tcp, &mut self.raw).await?;
        }
    }
}

async fn read_more(tcp: &mut TcpStream, raw: &mut Vec<u8>) -> anyhow::Result<()> {
    let mut buf = [0u8; 8192];
    let n = tcp.read(&mut buf).await?;
    if n == 0 {
        bail!("connection closed");
    }
    raw.extend_from_slice(&buf[..n]);
    Ok(())
}

fn request(addr: &str, path: &str, body: &str) -> String {
    format!(
        "POST {path} HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\n\
         Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
}

/// `POST path` with a JSON body; the whole response.
async fn post(addr: &str, path: &str, body: &str) -> Reply {
    tokio::time::timeout(TIMEOUT, post_inner(addr, path, body))
        .await
        .unwrap_or_else(|_| panic!("POST {path} timed out"))
        .unwrap_or_else(|e| panic!("POST {path}: {e:#}"))
}

async fn post_inner(addr: &str, path: &str, body: &str) -> anyhow::Result<Reply> {
    let mut tcp = TcpStream::connect(addr).await?;
    tcp.write_all(request(addr, path, body).as_bytes()).await?;
    let mut raw = Vec::new();
    tcp.read_to_end(&mut raw).await?;
    let split = raw
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .context("end of headers")?;
    let head = String::from_utf8_lossy(&raw[..split]).to_ascii_lowercase();
    let status = head
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .context("status line")?;
    let mut rest = &raw[split + 4..];
    let mut body = Vec::new();
    if head.contains("transfer-encoding: chunked") {
        loop {
            let eol = rest
                .windows(2)
                .position(|w| w == b"\r\n")
                .context("chunk size")?;
            let size = usize::from_str_radix(
                String::from_utf8_lossy(&rest[..eol])
                    .split(';')
                    .next()
                    .unwrap_or_default()
                    .trim(),
                16,
            )?;
            if size == 0 {
                break;
            }
            body.extend_from_slice(&rest[eol + 2..eol + 2 + size]);
            rest = &rest[eol + 2 + size + 2..];
        }
    } else {
        body.extend_from_slice(rest);
    }
    Ok(Reply {
        status,
        body: String::from_utf8_lossy(&body).into_owned(),
    })
}

/// grpc-gateway's error body.
fn error_body(message: &str, code: i32) -> String {
    format!(r#"{{"error":"{message}","message":"{message}","code":{code}}}"#)
}

#[tokio::test]
async fn kv_round_trip() {
    let (m, _c) = start().await;
    let a = m.client_addr();

    // Put "foo" = "bar": a fresh store's first write is revision 2.
    let r = post(&a, "/v3/kv/put", r#"{"key":"Zm9v","value":"YmFy"}"#).await;
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(r.body, format!(r#"{{"header":{}}}"#, r.header(Some(2))));

    let r = post(
        &a,
        "/v3/kv/put",
        r#"{"key":"Zm9v","value":"YmF6","prev_kv":true}"#,
    )
    .await;
    assert_eq!(
        r.body,
        format!(
            r#"{{"header":{},"prev_kv":{{"key":"Zm9v","create_revision":"2","mod_revision":"2","version":"1","value":"YmFy"}}}}"#,
            r.header(Some(3))
        )
    );

    let r = post(&a, "/v3/kv/range", r#"{"key":"Zm9v"}"#).await;
    assert_eq!(
        r.body,
        format!(
            r#"{{"header":{},"kvs":[{{"key":"Zm9v","create_revision":"2","mod_revision":"3","version":"2","value":"YmF6"}}],"count":"1"}}"#,
            r.header(Some(3))
        )
    );
    // The /v3beta alias, numbers given as JSON numbers, enum given by name, unknown fields
    // ignored (grpc-gateway's decoder skips them).
    let r = post(
        &a,
        "/v3beta/kv/range",
        r#"{"key":"Zm9v","revision":2,"sort_order":"DESCEND","no_such_field":1}"#,
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(r.json()["kvs"][0]["value"], "YmFy");
    // A range that matches nothing omits kvs and count.
    let r = post(&a, "/v3/kv/range", r#"{"key":"bm9uZQ=="}"#).await;
    assert_eq!(r.body, format!(r#"{{"header":{}}}"#, r.header(Some(3))));

    // Txn: compare by value (enums by name), a range and a put on success.
    let r = post(
        &a,
        "/v3/kv/txn",
        r#"{"compare":[{"key":"Zm9v","result":"EQUAL","target":"VALUE","value":"YmF6"}],
            "success":[{"request_range":{"key":"Zm9v"}},{"request_put":{"key":"YQ==","value":"MQ=="}}]}"#,
    )
    .await;
    assert_eq!(
        r.body,
        format!(
            r#"{{"header":{},"succeeded":true,"responses":[{{"response_range":{{"header":{{"revision":"3"}},"kvs":[{{"key":"Zm9v","create_revision":"2","mod_revision":"3","version":"2","value":"YmF6"}}],"count":"1"}}}},{{"response_put":{{"header":{{"revision":"4"}}}}}}]}}"#,
            r.header(Some(4))
        )
    );
    // A failed compare: enums by number; `succeeded` false is omitted.
    let r = post(
        &a,
        "/v3/kv/txn",
        r#"{"compare":[{"key":"Zm9v","result":1,"target":0,"version":"9"}]}"#,
    )
    .await;
    assert_eq!(r.body, format!(r#"{{"header":{}}}"#, r.header(Some(4))));

    let r = post(&a, "/v3/kv/deleterange", r#"{"key":"YQ==","prev_kv":true}"#).await;
    assert_eq!(
        r.body,
        format!(
            r#"{{"header":{},"deleted":"1","prev_kvs":[{{"key":"YQ==","create_revision":"4","mod_revision":"4","version":"1","value":"MQ=="}}]}}"#,
            r.header(Some(5))
        )
    );

    let r = post(&a, "/v3/kv/compaction", r#"{"revision":"3"}"#).await;
    assert_eq!(r.body, format!(r#"{{"header":{}}}"#, r.header(Some(5))));
    let r = post(&a, "/v3/kv/range", r#"{"key":"Zm9v","revision":2}"#).await;
    assert_eq!(r.status, 400);
    assert_eq!(
        r.body,
        error_body("etcdserver: mvcc: required revision has been compacted", 11)
    );
}

#[tokio::test]
async fn error_shapes() {
    let (m, _c) = start().await;
    let a = m.client_addr();

    // Validation errors: InvalidArgument is 400.
    for body in ["{}", ""] {
        let r = post(&a, "/v3/kv/range", body).await;
        assert_eq!(r.status, 400);
        assert_eq!(r.body, error_body("etcdserver: key is not provided", 3));
    }
    // OutOfRange is 400 too.
    let r = post(&a, "/v3/kv/range", r#"{"key":"Zm9v","revision":100}"#).await;
    assert_eq!(r.status, 400);
    assert_eq!(
        r.body,
        error_body(
            "etcdserver: mvcc: required revision is a future revision",
            11
        )
    );
    // NotFound is 404, on the /v3/kv/lease alias as well.
    for path in ["/v3/lease/revoke", "/v3/kv/lease/revoke"] {
        let r = post(&a, path, r#"{"ID":"12345"}"#).await;
        assert_eq!(r.status, 404);
        assert_eq!(
            r.body,
            error_body("etcdserver: requested lease not found", 5)
        );
    }
    let r = post(&a, "/v3/cluster/member/remove", r#"{"ID":"12345"}"#).await;
    assert_eq!(r.status, 404);
    assert_eq!(r.body, error_body("etcdserver: member not found", 5));
    let r = post(&a, "/v3/cluster/member/promote", r#"{"ID":"12345"}"#).await;
    assert_eq!(r.status, 404);
    assert_eq!(r.body, error_body("etcdserver: member not found", 5));
    // FailedPrecondition is 412 in the grpc-gateway etcd 3.4 ships.
    let r = post(&a, "/v3/maintenance/transfer-leadership", "{}").await;
    assert_eq!(r.status, 412);
    assert_eq!(r.body, error_body("etcdserver: bad leader transferee", 9));

    // A body that is not JSON: 400, InvalidArgument. The message is the JSON decoder's own
    // text, which differs between Go and us; only the shape is compared.
    let r = post(&a, "/v3/kv/put", "notjson").await;
    assert_eq!(r.status, 400);
    let json = r.json();
    let keys: Vec<&str> = json
        .as_object()
        .unwrap()
        .keys()
        .map(|k| k.as_str())
        .collect();
    assert_eq!(keys, ["error", "message", "code"]);
    assert_eq!(json["code"], 3);
    assert_eq!(json["error"], json["message"]);
}

#[tokio::test]
async fn lease_grant_keepalive_timetolive() {
    let (m, _c) = start().await;
    let a = m.client_addr();

    let r = post(&a, "/v3/lease/grant", r#"{"TTL":60}"#).await;
    let id = r.json()["ID"].as_str().expect("ID").to_owned();
    assert_eq!(
        r.body,
        format!(
            r#"{{"header":{},"ID":"{id}","TTL":"60"}}"#,
            r.header(Some(1))
        )
    );

    // Two keep-alives in one body: one `{"result":..}` line each, then the stream ends.
    let r = post(
        &a,
        "/v3/lease/keepalive",
        &format!(r#"{{"ID":"{id}"}} {{"ID":{id}}}"#),
    )
    .await;
    assert_eq!(r.status, 200);
    let lines: Vec<&str> = r.body.lines().collect();
    assert_eq!(lines.len(), 2, "{}", r.body);
    for line in lines {
        let v: Value = serde_json::from_str(line).unwrap();
        let h = header_of(&v["result"]["header"], Some(1));
        assert_eq!(
            line,
            format!(r#"{{"result":{{"header":{h},"ID":"{id}","TTL":"60"}}}}"#)
        );
    }

    post(
        &a,
        "/v3/kv/put",
        &format!(r#"{{"key":"Zm9v","value":"YmFy","lease":"{id}"}}"#),
    )
    .await;
    for path in ["/v3/lease/timetolive", "/v3/kv/lease/timetolive"] {
        let r = post(&a, path, &format!(r#"{{"ID":"{id}","keys":true}}"#)).await;
        let json = r.json();
        assert_eq!(json["grantedTTL"], "60", "{}", r.body);
        assert_eq!(json["keys"], serde_json::json!(["Zm9v"]));
        let ttl: i64 = json["TTL"].as_str().unwrap().parse().unwrap();
        assert!((55..=60).contains(&ttl), "{}", r.body);
    }
    for path in ["/v3/lease/leases", "/v3/kv/lease/leases"] {
        let r = post(&a, path, "{}").await;
        assert_eq!(
            r.body,
            format!(
                r#"{{"header":{},"leases":[{{"ID":"{id}"}}]}}"#,
                r.header(Some(2))
            )
        );
    }
    let r = post(&a, "/v3/lease/revoke", &format!(r#"{{"ID":"{id}"}}"#)).await;
    assert_eq!(r.body, format!(r#"{{"header":{}}}"#, r.header(Some(3))));
    // A revoked lease: TTL -1, and granted TTL and keys omitted.
    let r = post(&a, "/v3/lease/timetolive", &format!(r#"{{"ID":"{id}"}}"#)).await;
    assert_eq!(
        r.body,
        format!(
            r#"{{"header":{},"ID":"{id}","TTL":"-1"}}"#,
            r.header(Some(3))
        )
    );
}

#[tokio::test]
async fn watch_streams_events() {
    let (m, _c) = start().await;
    let a = m.client_addr();

    // The request body ends after the create request; the watch stays open (as with etcd).
    let mut w = Lines::open(
        &a,
        "/v3/watch",
        r#"{"create_request":{"key":"Zm9v","prev_kv":true}}"#,
    )
    .await
    .unwrap();
    assert_eq!(w.status, 200);
    let created = w.next().await.unwrap();
    let v: Value = serde_json::from_str(&created).unwrap();
    let h1 = header_of(&v["result"]["header"], Some(1));
    assert_eq!(
        created,
        format!(r#"{{"result":{{"header":{h1},"created":true}}}}"#)
    );

    post(&a, "/v3/kv/put", r#"{"key":"Zm9v","value":"YmFy"}"#).await;
    post(&a, "/v3/kv/deleterange", r#"{"key":"Zm9v"}"#).await;
    let put = w.next().await.unwrap();
    let h2 = header_of(&v["result"]["header"], Some(2));
    assert_eq!(
        put,
        format!(
            r#"{{"result":{{"header":{h2},"events":[{{"kv":{{"key":"Zm9v","create_revision":"2","mod_revision":"2","version":"1","value":"YmFy"}}}}]}}}}"#
        )
    );
    let delete = w.next().await.unwrap();
    let h3 = header_of(&v["result"]["header"], Some(3));
    assert_eq!(
        delete,
        format!(
            r#"{{"result":{{"header":{h3},"events":[{{"type":"DELETE","kv":{{"key":"Zm9v","mod_revision":"3"}},"prev_kv":{{"key":"Zm9v","create_revision":"2","mod_revision":"2","version":"1","value":"YmFy"}}}}]}}}}"#
        )
    );

    // Several requests in one body: a watch from history, then its cancellation.
    let mut w = Lines::open(
        &a,
        "/v3beta/watch",
        r#"{"create_request":{"key":"Zm9v","start_revision":"2"}}"#,
    )
    .await
    .unwrap();
    assert!(w.next().await.unwrap().contains(r#""created":true"#));
    let mut revisions = Vec::new();
    while revisions.len() < 2 {
        let line: Value = serde_json::from_str(&w.next().await.unwrap()).unwrap();
        for event in line["result"]["events"].as_array().expect("events") {
            revisions.push(event["kv"]["mod_revision"].as_str().unwrap().to_owned());
        }
    }
    assert_eq!(revisions, ["2", "3"]);

    // Not JSON: the stream fails before it starts, as grpc-gateway's Unknown (500).
    let r = post(&a, "/v3/watch", "garbage").await;
    assert_eq!(r.status, 500);
    assert_eq!(r.json()["code"], 2);
}

/// issue 40 (APISIX, apisix#13303: a watcher on an idle prefix without progress falls behind
/// the compaction and reloads everything): `progress_notify` over `/v3/watch` delivers
/// progress responses at `--experimental-watch-progress-notify-interval`, carrying the
/// revision of writes elsewhere, and a `progress_request` in the body is answered, with etcd
/// 3.4's bytes. Runs on etcd 3.4 too.
#[tokio::test]
async fn watch_progress_over_the_gateway() {
    let (m, _c) =
        crate::start_with(&["--experimental-watch-progress-notify-interval", "300ms"]).await;
    let a = m.client_addr();
    let mut w = Lines::open(
        &a,
        "/v3/watch",
        r#"{"create_request":{"key":"aWRsZS8=","range_end":"aWRsZTA=","progress_notify":true}}"#,
    )
    .await
    .unwrap();
    let created = w.next().await.unwrap();
    let v: Value = serde_json::from_str(&created).unwrap();
    assert_eq!(
        created,
        format!(
            r#"{{"result":{{"header":{},"created":true}}}}"#,
            header_of(&v["result"]["header"], Some(1))
        )
    );
    // A write outside the watched prefix; the progress responses catch up with it.
    post(&a, "/v3/kv/put", r#"{"key":"b3RoZXI=","value":"eA=="}"#).await;
    let want = format!(
        r#"{{"result":{{"header":{}}}}}"#,
        header_of(&v["result"]["header"], Some(2))
    );
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    let mut seen = Vec::new();
    loop {
        let line = w.next().await.unwrap();
        assert!(!line.contains("events"), "{line}");
        if line == want {
            break;
        }
        seen.push(line);
        assert!(
            tokio::time::Instant::now() < deadline,
            "no progress at revision 2: {seen:?}"
        );
    }

    // A progress request after the create request, in the same body.
    let mut w = Lines::open(
        &a,
        "/v3/watch",
        r#"{"create_request":{"key":"aWRsZS8="}} {"progress_request":{}}"#,
    )
    .await
    .unwrap();
    assert!(w.next().await.unwrap().contains(r#""created":true"#));
    assert_eq!(
        w.next().await.unwrap(),
        format!(
            r#"{{"result":{{"header":{},"watch_id":"-1"}}}}"#,
            header_of(&v["result"]["header"], Some(2))
        )
    );
}

#[tokio::test]
async fn cluster_and_maintenance() {
    let (m, _c) = start().await;
    let a = m.client_addr();

    let r = post(&a, "/v3/cluster/member/list", "{}").await;
    let json = r.json();
    let id = json["members"][0]["ID"].as_str().unwrap().to_owned();
    assert_eq!(
        r.body,
        format!(
            r#"{{"header":{},"members":[{{"ID":"{id}","name":"{}","peerURLs":["{}"],"clientURLs":["{}"]}}]}}"#,
            r.header(None),
            m.name(),
            m.peer_url(),
            m.endpoint()
        )
    );

    let r = post(&a, "/v3/maintenance/status", "{}").await;
    assert_eq!(r.status, 200);
    let json = r.json();
    assert_eq!(json["leader"], id.as_str());
    for field in [
        "dbSize",
        "raftIndex",
        "raftTerm",
        "raftAppliedIndex",
        "dbSizeInUse",
    ] {
        let n: i64 = json[field]
            .as_str()
            .unwrap_or_default()
            .parse()
            .unwrap_or(-1);
        assert!(n > 0, "{field} in {}", r.body);
    }
    assert!(json["version"].as_str().unwrap().starts_with("3."));

    let r = post(&a, "/v3/maintenance/hash", "{}").await;
    assert!(
        r.json()["hash"].is_u64(),
        "uint32 is a JSON number: {}",
        r.body
    );
    let r = post(&a, "/v3/maintenance/alarm", "{}").await;
    assert_eq!(r.status, 200);
    let r = post(&a, "/v3/maintenance/defragment", "{}").await;
    assert_eq!(r.status, 200);

    // The snapshot streams the database as base64 blobs.
    let r = post(&a, "/v3/maintenance/snapshot", "{}").await;
    assert_eq!(r.status, 200);
    let blobs = r.body.lines().filter(|l| l.contains(r#""blob":""#)).count();
    assert!(blobs >= 1, "{}", &r.body[..r.body.len().min(200)]);

    // Add a learner (never started), then remove it.
    let r = post(
        &a,
        "/v3/cluster/member/add",
        r#"{"peerURLs":["http://127.0.0.1:1"],"isLearner":true}"#,
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.body);
    let json = r.json();
    assert_eq!(json["member"]["isLearner"], true);
    let learner = json["member"]["ID"].as_str().unwrap().to_owned();
    let r = post(
        &a,
        "/v3/cluster/member/remove",
        &format!(r#"{{"ID":"{learner}"}}"#),
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(r.json()["members"].as_array().unwrap().len(), 1);
}

/// base64 of `text`, as the gateway encodes bytes.
fn b64(text: &str) -> String {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::new();
    for chunk in text.as_bytes().chunks(3) {
        let n = chunk
            .iter()
            .enumerate()
            .fold(0u32, |n, (i, &b)| n | u32::from(b) << (16 - 8 * i));
        for i in 0..4 {
            if i <= chunk.len() {
                out.push(ALPHABET[(n >> (18 - 6 * i) & 63) as usize] as char);
            } else {
                out.push('=');
            }
        }
    }
    out
}

#[tokio::test]
async fn lock_and_election() {
    let (m, _c) = start().await;
    let a = m.client_addr();

    let r = post(&a, "/v3/lease/grant", r#"{"TTL":60}"#).await;
    let id = r.json()["ID"].as_str().expect("ID").to_owned();
    let hex = format!("{:x}", id.parse::<i64>().unwrap());

    // The lock is the key `<name>/<lease in hex>`; locking again with the same lease finds it.
    let lock_key = b64(&format!("mylock/{hex}"));
    for path in ["/v3/lock/lock", "/v3beta/lock/lock"] {
        let r = post(
            &a,
            path,
            &format!(r#"{{"name":"bXlsb2Nr","lease":"{id}"}}"#),
        )
        .await;
        assert_eq!(r.status, 200, "{}", r.body);
        assert_eq!(
            r.body,
            format!(r#"{{"header":{},"key":"{lock_key}"}}"#, r.header(Some(2)))
        );
    }
    // The services' errors are not etcd's typed errors: grpc-gateway's Unknown (500).
    let r = post(&a, "/v3/lock/lock", r#"{"name":"bXlsb2Nr","lease":"123"}"#).await;
    assert_eq!(r.status, 500);
    assert_eq!(
        r.body,
        error_body("etcdserver: requested lease not found", 2)
    );
    let r = post(&a, "/v3/lock/unlock", "{}").await;
    assert_eq!(r.status, 500);
    assert_eq!(r.body, error_body("etcdserver: key is not provided", 2));
    let r = post(&a, "/v3/lock/unlock", &format!(r#"{{"key":"{lock_key}"}}"#)).await;
    assert_eq!(r.body, format!(r#"{{"header":{}}}"#, r.header(Some(3))));

    // Campaign: the leader is `<name>/<lease in hex>`, created at revision 4.
    let elect_key = b64(&format!("elect/{hex}"));
    let r = post(
        &a,
        "/v3/election/campaign",
        &format!(r#"{{"name":"ZWxlY3Q=","lease":"{id}","value":"djE="}}"#),
    )
    .await;
    let leader = format!(r#"{{"name":"ZWxlY3Q=","key":"{elect_key}","rev":"4","lease":"{id}"}}"#);
    assert_eq!(
        r.body,
        format!(r#"{{"header":{},"leader":{leader}}}"#, r.header(Some(4)))
    );
    let kv = |value: &str, rev: i64, version: i64| {
        format!(
            r#"{{"key":"{elect_key}","create_revision":"4","mod_revision":"{rev}","version":"{version}","value":"{value}","lease":"{id}"}}"#
        )
    };
    let r = post(&a, "/v3/election/leader", r#"{"name":"ZWxlY3Q="}"#).await;
    assert_eq!(
        r.body,
        format!(
            r#"{{"header":{},"kv":{}}}"#,
            r.header(Some(4)),
            kv("djE=", 4, 1)
        )
    );

    // Observe streams the current leader, then each proclamation.
    let mut observe = Lines::open(&a, "/v3beta/election/observe", r#"{"name":"ZWxlY3Q="}"#)
        .await
        .unwrap();
    assert_eq!(observe.status, 200);
    let line = observe.next().await.unwrap();
    let v: Value = serde_json::from_str(&line).unwrap();
    assert_eq!(
        line,
        format!(
            r#"{{"result":{{"header":{},"kv":{}}}}}"#,
            header_of(&v["result"]["header"], Some(4)),
            kv("djE=", 4, 1)
        )
    );
    let r = post(
        &a,
        "/v3/election/proclaim",
        &format!(r#"{{"leader":{leader},"value":"djI="}}"#),
    )
    .await;
    assert_eq!(r.body, format!(r#"{{"header":{}}}"#, r.header(Some(5))));
    let line = observe.next().await.unwrap();
    let v: Value = serde_json::from_str(&line).unwrap();
    assert_eq!(
        line,
        format!(
            r#"{{"result":{{"header":{},"kv":{}}}}}"#,
            header_of(&v["result"]["header"], Some(5)),
            kv("djI=", 5, 2)
        )
    );

    // Resign; then there is no leader, and the old one may not proclaim.
    let r = post(
        &a,
        "/v3/election/resign",
        &format!(r#"{{"leader":{leader}}}"#),
    )
    .await;
    assert_eq!(r.body, format!(r#"{{"header":{}}}"#, r.header(Some(6))));
    let r = post(&a, "/v3/election/leader", r#"{"name":"ZWxlY3Q="}"#).await;
    assert_eq!(r.status, 500);
    assert_eq!(r.body, error_body("election: no leader", 2));
    let r = post(
        &a,
        "/v3/election/proclaim",
        &format!(r#"{{"leader":{leader},"value":"djM="}}"#),
    )
    .await;
    assert_eq!(r.status, 500);
    assert_eq!(r.body, error_body("election: not leader", 2));
    let r = post(&a, "/v3/election/resign", "{}").await;
    assert_eq!(r.status, 500);
    assert_eq!(
        r.body,
        error_body(r#"\"leader\" field must be provided"#, 2)
    );
}

/// A Python client of the JSON gateway (etcd3gw, as OpenStack uses it): put, get, prefix,
/// create/replace (txns), lease grant/keys/refresh/revoke, watch, delete, members. The expected
/// output is what the same script prints against etcd 3.4.
#[tokio::test]
async fn python_etcd3gw_client() {
    let (m, _c) = start().await;
    let addr = m.client_addr();
    let (host, port) = addr.rsplit_once(':').expect("host:port");
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/it/py/etcd3gw_calls.py");
    let out = tokio::time::timeout(
        Duration::from_secs(60),
        tokio::process::Command::new(
            std::env::var("ETCDRS_TEST_PYTHON").unwrap_or_else(|_| "python3".into()),
        )
        .args([script, host, port])
        .output(),
    )
    .await
    .expect("the script finishes")
    .expect("python runs (scripts/test makes a virtual environment with etcd3gw)");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim(),
        concat!(
            r#"{"api_path": "/v3/", "create_existing": false, "create_new": true, "delete": true, "#,
            r#""delete_missing": false, "get": ["bar"], "get_prefix": [["1", "dir/a"], ["2", "dir/b"]], "#,
            r#""lease_keys": ["leased"], "lease_ttl_ok": true, "leased_after_revoke": [], "members": 1, "#,
            r#""put": true, "refresh": true, "replace_ok": true, "replace_stale": false, "revoke": true, "#,
            r#""watch": [["watched", "PUT"], ["watched", "PUT"]]}"#
        )
    );
}

/// `v` without its response headers (ids differ between members), recursively.
fn without_headers(mut v: Value) -> Value {
    match &mut v {
        Value::Object(map) => {
            map.remove("header");
            for value in map.values_mut() {
                *value = without_headers(value.take());
            }
        }
        Value::Array(items) => {
            for item in items.iter_mut() {
                *item = without_headers(item.take());
            }
        }
        _ => {}
    }
    v
}

/// Request bodies as etcd's gateway reads them (grpc-gateway, Go's `encoding/json`, jsonpb with
/// unknown fields allowed): each body goes to our member and to an etcd 3.4 member with the
/// same history, and the answers (status, and body less the response headers) must be equal.
/// Malformed JSON, wrong types, quoted integers, base64, byte arrays, camelCase and proto
/// names, duplicate keys, nulls, trailing data, unknown fields, and Go struct names (the txn
/// from the issue, whose op is then empty).
#[tokio::test]
async fn json_bodies_are_read_as_etcds_gateway_reads_them() {
    let (ours, _c) = start().await;
    let etcd34 = etcdrs_testkit::EtcdBin::at("/usr/bin/etcd");
    let theirs = etcdrs_testkit::Member::start(etcdrs_testkit::MemberOpts::new(&etcd34))
        .await
        .expect("etcd 3.4 starts");
    let cases: &[(&str, &str)] = &[
        ("/v3/kv/put", r#"{"key":"Zm9v","value":"YmFy","bogus":1}"#),
        ("/v3/kv/put", r#"{"key":"Zm9v","value":1}"#),
        ("/v3/kv/put", r#"{"key":"Zm9v","lease":"abc"}"#),
        ("/v3/kv/range", r#"{"key":"Zm9v"}"#),
        ("/v3/kv/range", r#"{"key":1}"#),
        ("/v3/kv/range", r#"{"key":"Zm9v","limit":"abc"}"#),
        ("/v3/kv/range", r#"{"key":"Zm9v","limit":true}"#),
        ("/v3/kv/range", r#"{"key":"Zm9v","limit":"1.5"}"#),
        ("/v3/kv/range", r#"{"key":"Zm9v","limit":""}"#),
        ("/v3/kv/range", r#"{"key":"Zm9v","limit":"\u0031"}"#),
        ("/v3/kv/range", r#"{"key":"Zm9v","limit":[1]}"#),
        (
            "/v3/kv/range",
            r#"{"key":"Zm9v","limit":99999999999999999999}"#,
        ),
        ("/v3/kv/range", r#"{"key":"Zm9v","limit":"1"}"#),
        ("/v3/kv/range", r#"{"key":"Zm9v","serializable":"true"}"#),
        ("/v3/kv/range", r#"{"key":[102,111,111]}"#),
        ("/v3/kv/range", r#"{"key":[102,111,300]}"#),
        ("/v3/kv/range", r#"{"key":"Zm9"}"#),
        ("/v3/kv/range", r#"{"key":"Zm9v=="}"#),
        ("/v3/kv/range", r#"{"key":"Zm 9v"}"#),
        ("/v3/kv/range", r#"{"key":"%%%"}"#),
        ("/v3/kv/range", r#"{"key":"Zm9v""#),
        ("/v3/kv/range", r#"{"key":"Zm9v",}"#),
        ("/v3/kv/range", r#"{"key" "Zm9v"}"#),
        ("/v3/kv/range", "{key:1}"),
        ("/v3/kv/range", r#"{"key":tru}"#),
        ("/v3/kv/range", r#"{"key":01}"#),
        ("/v3/kv/range", r#"{"key":-}"#),
        ("/v3/kv/range", r#"{"key":1.}"#),
        ("/v3/kv/range", r#"{"key":1e}"#),
        ("/v3/kv/range", r#"{"key":"a\qb"}"#),
        ("/v3/kv/range", "{\"key\":\"a\tb\"}"),
        ("/v3/kv/range", r#""abc""#),
        ("/v3/kv/range", "[1]"),
        ("/v3/kv/range", "null"),
        ("/v3/kv/range", ""),
        ("/v3/kv/range", r#"{"key":"Zm9v"} x"#),
        ("/v3/kv/range", r#"{"key":"Zm9v","sort_order":"DESCEND"}"#),
        ("/v3/kv/range", r#"{"key":"Zm9v","sort_order":7}"#),
        ("/v3/kv/range", r#"{"key":"Zm9v","sortOrder":1}"#),
        ("/v3/kv/range", r#"{"key":"YmFy","key":"Zm9v"}"#),
        ("/v3/kv/range", r#"{"key":null}"#),
        ("/v3/kv/range", r#"{"key":"Zm9v","keysOnly":1}"#),
        (
            "/v3/kv/range",
            r#"{"key":"Zm9v","keys_only":true,"keysOnly":false}"#,
        ),
        ("/v3/kv/range", r#"{"key":"Zm9v","keys_only":true}"#),
        (
            "/v3/kv/txn",
            r#"{"compare":[{"result":0,"target":1,"key":"Zm9v","TargetUnion":null}],"success":[{"Request":{"RequestPut":{"key":"Zm9v","value":"YmFy"}}}]}"#,
        ),
        ("/v3/kv/txn", r#"{"compare":{"key":"Zm9v"}}"#),
        (
            "/v3/kv/txn",
            r#"{"compare":[{"key":"Zm9v","target":"VALUE","value":"YmFy","result":"EQUAL"}],"success":[{"request_put":{"key":"Zm9v","value":"YmF6"}}]}"#,
        ),
        ("/v3/lease/grant", r#"{"TTL":"abc"}"#),
        ("/v3/lease/grant", r#"{"TTL":true}"#),
        ("/v3/lease/timetolive", r#"{"ID":"x"}"#),
    ];
    let mut differences = Vec::new();
    for (path, body) in cases {
        let a = post(&ours.client_addr(), path, body).await;
        let b = post(&theirs.client_addr(), path, body).await;
        let parse = |r: &Reply| {
            serde_json::from_str::<Value>(&r.body)
                .map(without_headers)
                .unwrap_or_else(|_| Value::String(r.body.clone()))
        };
        if a.status != b.status || parse(&a) != parse(&b) {
            differences.push(format!(
                "POST {path} {body}\n  ours:     {} {}\n  etcd 3.4: {} {}",
                a.status, a.body, b.status, b.body
            ));
        }
    }
    assert!(differences.is_empty(), "{}", differences.join("\n"));
}

/// The gateway's bound on a request body (issue 20): a body over `--max-request-bytes` plus
/// gRPC's 512 KiB allowance is refused once that much has been read, each byte scanned once
/// however the body is split (etcd 3.4's gateway reads any body whole before gRPC refuses
/// it: ours only). Thirty 1 MiB bodies sent 4 KiB at a time leave the member's memory flat,
/// and another client is served.
#[tokio::test]
async fn an_oversized_body_is_refused_part_way_and_memory_stays_flat() {
    if !crate::ours() {
        return;
    }
    let (m, mut client) = crate::start_with(&["--max-request-bytes=16384"]).await;
    let pid = m.pid().expect("running");
    let body = format!(r#"{{"key":"Zm9v","value":"{}"}}"#, "a".repeat(1 << 20));
    let first = oversized_post(&m.client_addr(), &body).await;
    assert!(first.starts_with("HTTP/1.1 400"), "{first}");
    assert!(first.contains("http: request body too large"), "{first}");
    let before = etcdrs_testkit::memory::rss_bytes(pid).expect("rss");
    for i in 0..30 {
        let answer = oversized_post(&m.client_addr(), &body).await;
        assert!(
            answer.contains("http: request body too large"),
            "body {i}: {answer}"
        );
    }
    client.put("still", "served", None).await.expect("served");
    etcdrs_testkit::memory::assert_rss_flat(pid, before, 16 << 20, "thirty 1 MiB bodies");
}

/// POSTs `body` to `/v3/kv/put` in 4 KiB writes (write errors once the server has answered
/// and closed are expected) and returns the answer as text.
async fn oversized_post(addr: &str, body: &str) -> String {
    let tcp = TcpStream::connect(addr).await.expect("connect");
    let (mut rd, mut wr) = tcp.into_split();
    let head = format!(
        "POST /v3/kv/put HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\n\
         Content-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    let body = body.as_bytes().to_vec();
    let writer = tokio::spawn(async move {
        wr.write_all(head.as_bytes()).await?;
        for chunk in body.chunks(4096) {
            wr.write_all(chunk).await?;
        }
        Ok::<_, std::io::Error>(())
    });
    let mut answer = Vec::new();
    let mut buf = [0u8; 4096];
    let read = tokio::time::timeout(TIMEOUT, async {
        while let Ok(n) = rd.read(&mut buf).await {
            if n == 0 {
                break;
            }
            answer.extend_from_slice(&buf[..n]);
        }
    })
    .await;
    assert!(read.is_ok(), "answered within {TIMEOUT:?}");
    writer.abort();
    String::from_utf8_lossy(&answer).into_owned()
}
