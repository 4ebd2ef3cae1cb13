//! Automatic compaction (`--auto-compaction-mode=periodic`): history older than the retention
//! period is compacted by the server itself.

use std::time::Duration;

use etcd_client::GetOptions;
use etcdrs_testkit::{grpc_error, poll_until};

use crate::start_with;

#[tokio::test]
async fn periodic_auto_compaction_compacts_old_history() {
    let (m, mut c) = start_with(&[
        "--auto-compaction-mode",
        "periodic",
        "--auto-compaction-retention",
        "1s",
    ])
    .await;
    let first = c
        .put("k", "v1", None)
        .await
        .unwrap()
        .header()
        .unwrap()
        .revision();
    c.put("k", "v2", None).await.unwrap();

    // Within a few retention periods the first revision is compacted away; meanwhile keep
    // writing so the revision moves (etcd compacts at the revision sampled a period ago).
    let mut n = 0;
    poll_until(Duration::from_secs(20), || {
        n += 1;
        let mut c = c.clone();
        let value = format!("v{n}");
        async move {
            c.put("k", value, None).await.map_err(|e| e.to_string())?;
            match c
                .get("k", Some(GetOptions::new().with_revision(first)))
                .await
            {
                Err(e) => match grpc_error(&e) {
                    Some((_, msg))
                        if msg == "etcdserver: mvcc: required revision has been compacted" =>
                    {
                        Ok(())
                    }
                    other => Err(format!("unexpected error {other:?}")),
                },
                Ok(_) => Err("not compacted yet".to_string()),
            }
        }
    })
    .await
    .expect("old revision compacted");

    // The latest value is intact.
    let latest = c.get("k", None).await.unwrap();
    assert_eq!(latest.kvs()[0].value(), format!("v{n}").as_bytes());
    assert!(
        m.log_contains("compaction"),
        "the log mentions the compaction"
    );
}
