//! etcd's health endpoints: `/health` with etcd 3.5's `?exclude=<ALARM>` and
//! `?serializable=true`, and the probes `/livez` and `/readyz` (etcd 3.5.12+ and 3.6), each
//! with one path per check and `?exclude=<check>`/`?verbose`.
//!
//! etcd 3.4.23 has `/health` and its `?exclude=` only: it answers `{"health":..}` without a
//! reason, ignores `?serializable=` and has no `/livez` or `/readyz`. Against it
//! (`ETCDRS_TEST_ETCD_BIN=/usr/bin/etcd`) the 3.5-only assertions are skipped, each where it is.

use std::time::Duration;

use anyhow::Context;
use etcd_client::{AlarmAction, AlarmOptions, AlarmType, Client};
use etcdrs_testkit::{Cluster, ClusterOpts, Member, poll_until};
use serde_json::Value;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::ours;
use crate::{bin, start, start_with};

/// Deadline for states the tests wait for (2 cores, several clusters at once).
const WAIT: Duration = Duration::from_secs(20);

/// A whole response.
#[derive(Debug)]
struct Reply {
    status: u16,
    /// Header lines, lowercased.
    head: String,
    body: String,
}

impl Reply {
    fn json(&self) -> Value {
        serde_json::from_str(self.body.trim_end()).unwrap_or_else(|e| panic!("{e}: {self:?}"))
    }

    fn has_header(&self, line: &str) -> bool {
        self.head.lines().any(|l| l.trim() == line)
    }
}

/// `method path` with an empty body. The health endpoints answer with a `Content-Length`.
async fn call(m: &Member, method: &str, path: &str) -> Reply {
    let addr = m.client_addr();
    let exchange = async {
        let mut tcp = TcpStream::connect(&addr).await?;
        let request = format!(
            "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
        );
        tcp.write_all(request.as_bytes()).await?;
        let mut raw = Vec::new();
        tcp.read_to_end(&mut raw).await?;
        let raw = String::from_utf8_lossy(&raw).into_owned();
        let (head, body) = raw.split_once("\r\n\r\n").context("end of headers")?;
        let status = head
            .split(' ')
            .nth(1)
            .and_then(|s| s.parse().ok())
            .context("status line")?;
        anyhow::Ok(Reply {
            status,
            head: head.to_ascii_lowercase(),
            body: body.to_owned(),
        })
    };
    // Longer than etcd's request timeout, so a slow linearizable check still answers.
    tokio::time::timeout(Duration::from_secs(15), exchange)
        .await
        .unwrap_or_else(|_| panic!("{method} {path} timed out"))
        .unwrap_or_else(|e| panic!("{method} {path}: {e:#}"))
}

async fn get(m: &Member, path: &str) -> Reply {
    call(m, "GET", path).await
}

/// Asserts an unhealthy `/health` answer: 503 and Go's `http.Error` form (the JSON, a newline,
/// plain text). etcd 3.4 has no reason; etcd 3.5 (ours) names it.
fn assert_unhealthy(r: &Reply, reason: &str) {
    assert_eq!(r.status, 503, "{r:?}");
    assert!(r.body.ends_with("}\n"), "{r:?}");
    assert!(
        r.has_header("content-type: text/plain; charset=utf-8"),
        "{r:?}"
    );
    assert!(r.has_header("x-content-type-options: nosniff"), "{r:?}");
    let json = r.json();
    assert_eq!(json["health"], "false", "{r:?}");
    if ours() {
        assert_eq!(json["reason"], reason, "{r:?}");
    }
}

/// Asserts a healthy `/health` answer (etcd 3.4 has no `reason`).
fn assert_healthy(r: &Reply) {
    assert_eq!(r.status, 200, "{r:?}");
    assert!(
        r.body == r#"{"health":"true","reason":""}"#
            || (!ours() && r.body == r#"{"health":"true"}"#),
        "{r:?}"
    );
    // Go sniffs the JSON body as plain text.
    assert!(
        r.has_header("content-type: text/plain; charset=utf-8"),
        "{r:?}"
    );
}

/// Asserts a passing probe: `ok` and a newline, as plain text.
fn assert_ok(r: &Reply) {
    assert_eq!((r.status, r.body.as_str()), (200, "ok\n"), "{r:?}");
    assert!(
        r.has_header("content-type: text/plain; charset=utf-8"),
        "{r:?}"
    );
}

/// The check lines of a probe's report, sorted: etcd runs the checks in map order.
fn check_lines(body: &str) -> Vec<&str> {
    let mut lines: Vec<&str> = body.lines().filter(|l| l.starts_with('[')).collect();
    lines.sort_unstable();
    lines
}

async fn member_id(c: &mut Client) -> u64 {
    c.status()
        .await
        .expect("status")
        .header()
        .expect("header")
        .member_id()
}

#[tokio::test]
async fn probes_of_a_healthy_member() {
    let metrics_port = etcdrs_testkit::ports::reserve().expect("port");
    let metrics_addr = format!("127.0.0.1:{}", metrics_port.port());
    let metrics_url = format!("http://{metrics_addr}");
    let (m, _c) = start_with(&["--listen-metrics-urls", &metrics_url]).await;

    assert_healthy(&get(&m, "/health").await);
    assert_healthy(&get(&m, "/health?serializable=true").await);
    // GET only, as Go's `http.Error` answers anything else (etcd 3.4 as well).
    let r = call(&m, "POST", "/health").await;
    assert_eq!((r.status, r.body.as_str()), (405, "Method Not Allowed\n"));
    assert!(r.has_header("allow: get"), "{r:?}");

    if !ours() {
        // etcd 3.4 has no /livez or /readyz.
        assert_eq!(get(&m, "/livez").await.status, 404);
        return;
    }
    for path in [
        "/livez",
        "/livez/serializable_read",
        "/readyz",
        "/readyz/data_corruption",
        "/readyz/serializable_read",
        "/readyz/linearizable_read",
    ] {
        let r = get(&m, path).await;
        assert_ok(&r);
        assert!(r.has_header("x-content-type-options: nosniff"), "{r:?}");
    }
    // `?verbose` lists the checks before the verdict.
    let r = get(&m, "/readyz?verbose").await;
    assert_eq!(r.status, 200);
    assert!(r.body.ends_with("\nok\n"), "{r:?}");
    assert_eq!(
        check_lines(&r.body),
        [
            "[+]data_corruption ok",
            "[+]linearizable_read ok",
            "[+]serializable_read ok",
        ]
    );
    let r = get(&m, "/livez?verbose=1").await;
    assert_eq!(r.body, "[+]serializable_read ok\nok\n");
    // Excluded checks do not run; unknown names are ignored.
    let r = get(
        &m,
        "/readyz?verbose&exclude=linearizable_read&exclude=no_such_check",
    )
    .await;
    assert_eq!(
        check_lines(&r.body),
        ["[+]data_corruption ok", "[+]serializable_read ok"]
    );
    // The metrics listener serves the probes too, as etcd 3.6's does.
    for path in ["/livez", "/readyz", "/readyz/linearizable_read"] {
        let r = etcdrs_testkit::http_get(&metrics_addr, path)
            .await
            .expect("GET on the metrics listener");
        assert_eq!((r.status, r.body.as_str()), (200, "ok\n"), "{path}");
    }
    let r = call(&m, "POST", "/readyz").await;
    assert_eq!((r.status, r.body.as_str()), (405, "Method Not Allowed\n"));
    assert_eq!(call(&m, "PUT", "/livez").await.status, 405);
    assert_eq!(get(&m, "/readyz/no_such_check").await.status, 404);
}

#[tokio::test]
async fn nospace_alarm_and_exclude() {
    let (m, mut c) = start_with(&["--quota-backend-bytes", "262144"]).await;

    // Fill the 256 KiB quota until it raises NOSPACE (as errors.rs does).
    let value = vec![b'q'; 16 * 1024];
    for i in 0.. {
        if c.put(format!("big/{i:04}"), value.clone(), None)
            .await
            .is_err()
        {
            break;
        }
        assert!(i < 500, "quota never hit");
    }
    assert_eq!(
        c.alarm(AlarmAction::Get, AlarmType::None, None)
            .await
            .unwrap()
            .alarms()
            .len(),
        1
    );

    assert_unhealthy(&get(&m, "/health").await, "ALARM NOSPACE");
    assert_unhealthy(&get(&m, "/health?serializable=true").await, "ALARM NOSPACE");
    assert_unhealthy(&get(&m, "/health?exclude=CORRUPT").await, "ALARM NOSPACE");
    // Excluding the raised alarm makes the member healthy again (etcd 3.4 as well).
    assert_healthy(&get(&m, "/health?exclude=NOSPACE").await);
    assert_healthy(&get(&m, "/health?exclude=CORRUPT&exclude=NOSPACE").await);
    assert_healthy(&get(&m, "/health?exclude=NOSPACE&serializable=true").await);

    if ours() {
        // NOSPACE does not make a member unready or dead: it still serves reads and deletes.
        assert_ok(&get(&m, "/livez").await);
        assert_ok(&get(&m, "/readyz").await);
    }
}

#[tokio::test]
async fn corrupt_alarm_fails_readiness() {
    if !ours() {
        // etcd 3.4 has no /readyz; its /health on alarms is covered by the NOSPACE test.
        return;
    }
    let (m, mut c) = start().await;
    let mut options = AlarmOptions::new();
    options.with_member(member_id(&mut c).await);
    c.alarm(AlarmAction::Activate, AlarmType::Corrupt, Some(options))
        .await
        .unwrap();

    assert_unhealthy(&get(&m, "/health").await, "ALARM CORRUPT");
    assert_healthy(&get(&m, "/health?exclude=CORRUPT").await);
    // A failing probe always reports every check it ran, as Go's `http.Error`.
    let r = get(&m, "/readyz").await;
    assert_eq!(r.status, 503, "{r:?}");
    assert!(r.has_header("x-content-type-options: nosniff"), "{r:?}");
    assert!(r.body.ends_with("\n\n"), "{r:?}");
    assert_eq!(
        check_lines(&r.body),
        [
            "[+]linearizable_read ok",
            "[+]serializable_read ok",
            "[-]data_corruption failed: alarm activated: CORRUPT",
        ]
    );
    let r = get(&m, "/readyz/data_corruption").await;
    assert_eq!(
        (r.status, r.body.as_str()),
        (
            503,
            "[-]data_corruption failed: alarm activated: CORRUPT\n\n"
        )
    );
    // The probe's checks, not alarms, are what `exclude` names for /readyz.
    assert_ok(&get(&m, "/readyz?exclude=data_corruption").await);
    assert_ok(&get(&m, "/livez").await);
}

#[tokio::test]
async fn lost_quorum() {
    let mut cluster = Cluster::start(3, ClusterOpts::new(&bin()))
        .await
        .expect("3-member cluster starts");
    assert_healthy(&get(cluster.member(0), "/health").await);
    cluster.kill9(1).unwrap();
    cluster.kill9(2).unwrap();
    let m = cluster.member(0);

    // The survivor loses its leader (a leader steps down by check-quorum).
    poll_until(WAIT, || async {
        let r = get(m, "/health").await;
        anyhow::ensure!(r.status == 503, "{r:?}");
        anyhow::Ok(())
    })
    .await
    .unwrap();
    assert_unhealthy(&get(m, "/health").await, "RAFT NO LEADER");

    if !ours() {
        // etcd 3.4 ignores `serializable=` and has no probes.
        return;
    }
    // `serializable=true` checks this member alone: no leader needed, a local read works.
    assert_healthy(&get(m, "/health?serializable=true").await);
    // Live (it serves local reads) but not ready (no linearizable read).
    assert_ok(&get(m, "/livez").await);
    let r = get(m, "/readyz").await;
    assert_eq!(r.status, 503, "{r:?}");
    let lines = check_lines(&r.body);
    assert_eq!(
        lines[..2],
        ["[+]data_corruption ok", "[+]serializable_read ok"],
        "{r:?}"
    );
    // ReadIndex fails at once without a leader ("etcdserver: no leader"); a read that raft
    // accepted while it still had one times out instead, as in etcd.
    assert!(
        [
            "[-]linearizable_read failed: etcdserver: no leader",
            "[-]linearizable_read failed: etcdserver: request timed out",
        ]
        .contains(&lines[2]),
        "{r:?}"
    );
    assert_ok(&get(m, "/readyz?exclude=linearizable_read").await);
    assert_eq!(get(m, "/readyz/linearizable_read").await.status, 503);
}
