//! Plain HTTP endpoints on the client port: /health, /version, /metrics.

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
