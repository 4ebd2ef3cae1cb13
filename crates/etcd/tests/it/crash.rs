//! Crash safety: every put acknowledged to a client survives SIGKILL.
//!
//! Eight writers stream sequential puts through one `etcd-client` connection and record each
//! acknowledged put. Once a poll confirms enough acks, the member is SIGKILLed mid-stream and
//! restarted on the same data dir. Every acknowledged put must read back with its value, and
//! each writer's surviving keys must be gap-free (a writer sends put i+1 only after put i was
//! acknowledged). This runs twice in a row on the same data dir, so recovery of an already
//! recovered store is covered too.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use etcd_client::GetOptions;
use etcdrs_testkit::{Member, poll_until};

use crate::opts;

const WRITERS: usize = 8;
/// Acks to wait for before the kill, per round.
const ACKS_BEFORE_KILL: usize = 400;

fn key(round: usize, writer: usize, i: usize) -> String {
    format!("crash/{round}/{writer}/{i:06}")
}

fn value(round: usize, writer: usize, i: usize) -> String {
    format!("value-{round}-{writer}-{i}-{}", "x".repeat(i % 50))
}

#[tokio::test]
async fn acknowledged_puts_survive_sigkill_twice() {
    let mut member = Member::start(opts()).await.expect("member starts");
    let mut all_acked: BTreeMap<String, String> = BTreeMap::new();

    for round in 0..2 {
        let client = member.client().await.expect("client");
        let acked: Arc<Mutex<Vec<(String, String)>>> = Arc::default();
        let count = Arc::new(AtomicUsize::new(0));
        let mut writers = Vec::new();
        for w in 0..WRITERS {
            let mut client = client.clone();
            let acked = acked.clone();
            let count = count.clone();
            writers.push(tokio::spawn(async move {
                for i in 0.. {
                    let (k, v) = (key(round, w, i), value(round, w, i));
                    if client.put(k.clone(), v.clone(), None).await.is_err() {
                        return;
                    }
                    acked.lock().unwrap().push((k, v));
                    count.fetch_add(1, Ordering::SeqCst);
                }
            }));
        }
        poll_until(Duration::from_secs(30), || async {
            let n = count.load(Ordering::SeqCst);
            if n >= ACKS_BEFORE_KILL {
                Ok(n)
            } else {
                Err(format!("{n} acks"))
            }
        })
        .await
        .expect("writers make progress");

        member.kill9().expect("SIGKILL");
        // Writers now fail (or hang on the dead connection): stop them. Anything recorded so
        // far was acknowledged before the kill.
        for w in writers {
            w.abort();
            let _ = w.await;
        }
        let acked = std::mem::take(&mut *acked.lock().unwrap());
        assert!(acked.len() >= ACKS_BEFORE_KILL);
        all_acked.extend(acked);

        member.restart().await.expect("restart after SIGKILL");
        let mut c = member.client().await.expect("client after restart");
        let resp = c
            .get("crash/", Some(GetOptions::new().with_prefix()))
            .await
            .expect("read back");
        let stored: BTreeMap<String, String> = crate::pairs(resp.kvs()).into_iter().collect();

        let missing: Vec<&String> = all_acked
            .iter()
            .filter(|(k, v)| stored.get(*k) != Some(*v))
            .map(|(k, _)| k)
            .collect();
        assert!(
            missing.is_empty(),
            "round {round}: {} of {} acknowledged puts lost or wrong after SIGKILL, e.g. {:?}",
            missing.len(),
            all_acked.len(),
            &missing[..missing.len().min(5)]
        );
        // Per writer, the stored keys of this round are exactly 0..n (no gaps), and every
        // stored value is the one that was written.
        for w in 0..WRITERS {
            let prefix = format!("crash/{round}/{w}/");
            let idx: Vec<usize> = stored
                .keys()
                .filter_map(|k| k.strip_prefix(&prefix))
                .map(|i| i.parse().expect("index"))
                .collect();
            assert_eq!(
                idx,
                (0..idx.len()).collect::<Vec<_>>(),
                "writer {w} has gaps"
            );
            for i in idx {
                assert_eq!(stored[&key(round, w, i)], value(round, w, i));
            }
        }
        // Every put was its own revision.
        let rev = resp.header().expect("header").revision();
        assert_eq!(rev, i64::try_from(stored.len()).expect("fits") + 1);
    }
    assert_eq!(member.starts(), 3);
}

/// `etcd_disk_wal_fsync_duration_seconds_count` of `m`'s `/metrics`.
async fn wal_fsyncs(m: &Member) -> f64 {
    let scrape = m.http_get("/metrics").await.expect("GET /metrics");
    scrape
        .body
        .lines()
        .find_map(|l| l.strip_prefix("etcd_disk_wal_fsync_duration_seconds_count "))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or_else(|| panic!("no WAL fsync count in /metrics"))
}

/// `--unsafe-no-fsync`: the WAL is written without fsync, so etcd's fsync histogram does not
/// move however many puts are acknowledged; without the flag every save is synced. A process
/// crash still loses nothing (the page cache survives it). Runs on etcd 3.4 too.
#[tokio::test]
async fn unsafe_no_fsync_writes_the_wal_without_syncing_it() {
    let (synced, mut c) = crate::start().await;
    for i in 0..20 {
        c.put(format!("k{i}"), "v", None).await.expect("put");
    }
    assert!(wal_fsyncs(&synced).await >= 20.0);
    let (mut unsynced, mut c) = crate::start_with(&["--unsafe-no-fsync"]).await;
    // etcd 3.4 syncs its bootstrap entries before the flag applies; puts are never synced.
    let at_start = wal_fsyncs(&unsynced).await;
    for i in 0..20 {
        c.put(format!("k{i}"), "v", None).await.expect("put");
    }
    assert_eq!(wal_fsyncs(&unsynced).await, at_start);
    unsynced.kill9().expect("kill -9");
    unsynced.restart().await.expect("restarts");
    let mut c = unsynced.client().await.expect("client");
    let got = c
        .get("k", Some(GetOptions::new().with_prefix()))
        .await
        .expect("get");
    assert_eq!(got.count(), 20);
}
