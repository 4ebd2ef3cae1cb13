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

/// A physical compaction of a long history is carried out in batches
/// (`--experimental-compaction-batch-limit`, with `--experimental-compaction-sleep-interval`
/// between them): writes and reads made while it runs are answered before it is, the
/// physical `Compact` is answered once the history is gone from the backend (with no
/// server-side timeout), and every value it must keep is there. Runs on etcd 3.4 too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_physical_compaction_runs_in_batches_while_writes_go_on() {
    // etcd 3.4 sleeps 10 ms between batches, without a flag for it.
    let mut flags = vec!["--experimental-compaction-batch-limit", "10"];
    if crate::ours() {
        flags.extend(["--experimental-compaction-sleep-interval", "20ms"]);
    }
    physical_compaction_in_batches(&flags).await;
}

/// The same under etcd 3.6's names for the two flags.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn compaction_batches_take_etcd_36_flag_names() {
    if !crate::ours() {
        return;
    }
    physical_compaction_in_batches(&[
        "--compaction-batch-limit",
        "10",
        "--compaction-sleep-interval",
        "20ms",
    ])
    .await;
}

async fn physical_compaction_in_batches(flags: &[&str]) {
    const KEYS: usize = 200;
    const ROUNDS: usize = 10;
    let (m, mut c) = start_with(flags).await;
    let mut rev = 0;
    for round in 0..ROUNDS {
        let txn_puts: Vec<_> = (0..KEYS)
            .map(|k| etcd_client::TxnOp::put(format!("k{k:03}"), format!("v{round}"), None))
            .collect();
        for chunk in txn_puts.chunks(100) {
            let resp = c
                .txn(etcd_client::Txn::new().and_then(chunk.to_vec()))
                .await
                .expect("txn");
            rev = resp.header().expect("header").revision();
        }
    }
    // 1,800 revisions to drop, 10 a batch, 20 ms apart: the compaction takes seconds.
    let compacting = {
        let mut c = c.clone();
        tokio::spawn(async move {
            c.compact(
                rev,
                Some(etcd_client::CompactionOptions::new().with_physical()),
            )
            .await
            .map(|_| ())
        })
    };
    // The compaction is applied (reads below it are refused) before the writes below.
    poll_until(Duration::from_secs(10), || {
        let mut c = c.clone();
        async move {
            match c
                .get("k000", Some(GetOptions::new().with_revision(rev - 1)))
                .await
            {
                Err(_) => Ok(()),
                Ok(_) => Err("not applied yet".to_string()),
            }
        }
    })
    .await
    .expect("compaction applied");
    let mut answered_meanwhile = 0;
    for i in 0..20 {
        let put = c.put("meanwhile", format!("{i}"), None).await.expect("put");
        assert!(put.header().expect("header").revision() > rev);
        let got = c.get("k150", None).await.expect("get");
        assert_eq!(got.kvs()[0].value(), format!("v{}", ROUNDS - 1).as_bytes());
        if !compacting.is_finished() {
            answered_meanwhile += 1;
        }
    }
    assert!(
        answered_meanwhile > 0,
        "every write waited for the physical compaction"
    );
    tokio::time::timeout(Duration::from_secs(120), compacting)
        .await
        .expect("physical compaction answered")
        .expect("task")
        .expect("compact");
    // What the compaction had to keep is there: each key at the compacted revision.
    let at_rev = c
        .get(
            "k",
            Some(GetOptions::new().with_prefix().with_revision(rev)),
        )
        .await
        .expect("get at the compacted revision");
    assert_eq!(at_rev.kvs().len(), KEYS);
    if crate::ours() {
        // All 1,800 dropped values deleted, in many batches.
        let scrape = m.http_get("/metrics").await.expect("GET /metrics");
        let value = |name: &str| -> f64 {
            scrape
                .body
                .lines()
                .find_map(|l| l.strip_prefix(name))
                .and_then(|v| v.trim().parse().ok())
                .unwrap_or_else(|| panic!("no {name} in /metrics"))
        };
        assert_eq!(
            value("etcd_debugging_mvcc_db_compaction_keys_total "),
            ((ROUNDS - 1) * KEYS) as f64
        );
        assert!(
            value("etcd_debugging_mvcc_db_compaction_pause_duration_milliseconds_count ") >= 100.0
        );
        assert!(m.log_contains("finished scheduled compaction"));
    }
}
