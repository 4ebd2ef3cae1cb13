//! `/metrics`: the series dashboards and alerts use are present with etcd's names and types,
//! and move when they should. The same assertions hold against etcd 3.4.

use std::collections::BTreeMap;
use std::time::Duration;

use etcd_client::WatchOptions;
use etcdrs_testkit::{Member, poll_until};

use crate::start;

/// Each sample line `name{labels} value` of the exposition, and each family's `# TYPE`.
struct Scrape {
    types: BTreeMap<String, String>,
    samples: Vec<(String, f64)>,
}

impl Scrape {
    async fn of(m: &Member) -> Scrape {
        let body = m.http_get("/metrics").await.expect("GET /metrics").body;
        let mut types = BTreeMap::new();
        let mut samples = Vec::new();
        for line in body.lines() {
            if let Some(rest) = line.strip_prefix("# TYPE ") {
                let mut parts = rest.split_whitespace();
                if let (Some(name), Some(kind)) = (parts.next(), parts.next()) {
                    types.insert(name.to_string(), kind.to_string());
                }
            } else if !line.starts_with('#')
                && let Some((series, value)) = line.rsplit_once(' ')
                && let Ok(value) = value.parse::<f64>()
            {
                samples.push((series.to_string(), value));
            }
        }
        Scrape { types, samples }
    }

    fn kind(&self, family: &str) -> Option<&str> {
        self.types.get(family).map(String::as_str)
    }

    /// Sum of the samples of `series` (a name, or a name with a label filter inside `{..}`).
    fn value(&self, series: &str, label: Option<&str>) -> f64 {
        self.samples
            .iter()
            .filter(|(s, _)| {
                let name = s.split('{').next().unwrap_or(s);
                name == series && label.is_none_or(|l| s.contains(l))
            })
            .map(|(_, v)| v)
            .sum()
    }
}

#[tokio::test]
async fn etcd_series_are_present_and_move() {
    let (m, mut c) = start().await;
    let before = Scrape::of(&m).await;
    assert_eq!(before.value("etcd_server_has_leader", None), 1.0);
    assert!(before.value("etcd_server_leader_changes_seen_total", None) >= 1.0);

    // A put moves the proposal, fsync and gRPC series.
    for i in 0..5 {
        c.put(format!("m{i}"), "v", None).await.unwrap();
    }
    let (_watch, _) = {
        let mut stream = c
            .watch("m", Some(WatchOptions::new().with_prefix()))
            .await
            .unwrap();
        let created = stream.message().await.unwrap().unwrap();
        assert!(created.created());
        (stream, ())
    };
    // etcd commits its backend every 100 ms, so that series may lag the puts a little.
    let commits_before = before.value("etcd_disk_backend_commit_duration_seconds_count", None);
    let after = poll_until(Duration::from_secs(10), || async {
        let after = Scrape::of(&m).await;
        let watching = after.value("etcd_debugging_mvcc_watcher_total", None) >= 1.0;
        let committed =
            after.value("etcd_disk_backend_commit_duration_seconds_count", None) > commits_before;
        if watching && committed {
            Ok(after)
        } else {
            Err("watcher or backend commit not counted yet")
        }
    })
    .await
    .expect("watcher gauge moves");
    for (family, kind) in [
        ("etcd_server_has_leader", "gauge"),
        ("etcd_server_leader_changes_seen_total", "counter"),
        ("etcd_server_proposals_committed_total", "gauge"),
        ("etcd_server_proposals_applied_total", "gauge"),
        ("etcd_server_proposals_pending", "gauge"),
        ("etcd_server_proposals_failed_total", "counter"),
        ("etcd_disk_wal_fsync_duration_seconds", "histogram"),
        ("etcd_disk_backend_commit_duration_seconds", "histogram"),
        ("etcd_mvcc_db_total_size_in_bytes", "gauge"),
        ("etcd_debugging_mvcc_keys_total", "gauge"),
        ("etcd_debugging_mvcc_watcher_total", "gauge"),
        ("grpc_server_started_total", "counter"),
        ("grpc_server_handled_total", "counter"),
        ("process_resident_memory_bytes", "gauge"),
        ("process_open_fds", "gauge"),
    ] {
        assert_eq!(after.kind(family), Some(kind), "{family}");
    }
    let moved = |series: &str, label: Option<&str>| {
        after.value(series, label) > before.value(series, label)
    };
    assert!(moved("etcd_server_proposals_committed_total", None));
    assert!(moved("etcd_server_proposals_applied_total", None));
    assert!(moved("etcd_disk_wal_fsync_duration_seconds_count", None));
    assert!(moved(
        "etcd_disk_backend_commit_duration_seconds_count",
        None
    ));
    assert!(after.value("etcd_debugging_mvcc_keys_total", None) >= 5.0);
    let put = r#"grpc_method="Put""#;
    assert!(after.value("grpc_server_started_total", Some(put)) >= 5.0);
    assert!(
        after.value(
            "grpc_server_handled_total",
            Some(r#"grpc_code="OK",grpc_method="Put""#)
        ) >= 5.0
    );
    assert_eq!(after.value("etcd_server_proposals_pending", None), 0.0);
    assert!(after.value("process_resident_memory_bytes", None) > 0.0);
}

#[tokio::test]
async fn health_checks_are_counted() {
    let (m, _c) = start().await;
    let before = Scrape::of(&m).await;
    assert_eq!(before.kind("etcd_server_health_success"), Some("counter"));
    assert_eq!(before.kind("etcd_server_health_failures"), Some("counter"));
    for _ in 0..3 {
        let health = m.http_get("/health").await.expect("GET /health");
        assert_eq!(health.status, 200, "{}", health.body);
    }
    let after = Scrape::of(&m).await;
    assert_eq!(
        after.value("etcd_server_health_success", None)
            - before.value("etcd_server_health_success", None),
        3.0
    );
    assert_eq!(
        after.value("etcd_server_health_failures", None),
        before.value("etcd_server_health_failures", None)
    );
}
