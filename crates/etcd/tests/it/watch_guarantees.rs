//! Watch guarantees under kills and partitions (issue 41, item 3): a 3-member cluster of real
//! processes whose peer traffic runs through relays (`testkit::RelayedCluster`), one writer
//! (puts, deletes and two-key transactions, retried on another member when an answer does not
//! come), and on every member two watchers (every key of the test's prefix with `prev_kv` and
//! progress notifications, and one key), each asking for progress now and then and resuming
//! on its member from the revision after the last it was delivered whenever its stream
//! breaks. Meanwhile members are SIGKILLed and restarted and one is cut off from the others
//! for a while. At the end the history is read back on every member by a watch from
//! revision 1 (the three must agree revision by revision, and with a range of every key at
//! the last revision), and every delivery of every watcher goes through the simulator's
//! checker (`crates/sim/src/watch_check.rs`, compiled in here: the test still links none of
//! our server code): ordered, unique, atomic, reliable across resumptions, bookmarkable, and
//! every event and `prev_kv` the history's own.
//!
//! etcd 3.5.1 does not pass it (`ETCDRS_TEST_ETCD_BIN=target/etcd-3.5.1/etcdbin/etcd`, one
//! run): a watcher on the prefix got a progress notification at revision 1403 after an event
//! at 1404, a notification behind a delivered event (the cause in etcd was not looked into).

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use etcd_client::{
    Client, Compare, CompareOp, EventType, GetOptions, Txn, TxnOp, WatchOptions, WatchResponse,
};
use etcdrs_proto::mvccpb;
use etcdrs_testkit::{RelayedCluster, poll_until};

#[path = "../../../sim/src/watch_check.rs"]
#[allow(dead_code)]
mod watch_check;

use watch_check::{History, KeyRange, Watch};

use crate::bin;

/// The test's keys: `wg/k0`..`wg/k4`.
const PREFIX: &str = "wg/";
const KEYS: usize = 5;
/// Deadline for every state the test waits for.
const WAIT: Duration = Duration::from_secs(20);
/// Writes acknowledged in each phase of the fault schedule (before, during and after each
/// fault).
const PHASE_WRITES: usize = 40;

fn key(i: usize) -> String {
    format!("{PREFIX}k{i}")
}

/// What a watcher was delivered, in order.
#[derive(Debug)]
enum Delivery {
    /// A (re)opened watch from this revision.
    Open(i64),
    /// Events, the response's header at this revision.
    Events(i64, Vec<mvccpb::Event>),
    /// A progress notification at this revision.
    Progress(i64),
}

struct Watcher {
    member: usize,
    range: KeyRange,
    prev_kv: bool,
    log: Vec<Delivery>,
    /// The revision after the last delivered (or covered by progress).
    next_rev: i64,
    resumed: u32,
}

fn to_proto(event: &etcd_client::Event) -> mvccpb::Event {
    let kv = |kv: &etcd_client::KeyValue| mvccpb::KeyValue {
        key: kv.key().to_vec(),
        value: kv.value().to_vec(),
        create_revision: kv.create_revision(),
        mod_revision: kv.mod_revision(),
        version: kv.version(),
        lease: kv.lease(),
    };
    let r#type = match event.event_type() {
        EventType::Put => mvccpb::event::EventType::Put,
        EventType::Delete => mvccpb::event::EventType::Delete,
    };
    mvccpb::Event {
        r#type: r#type as i32,
        kv: event.kv().map(kv),
        prev_kv: event.prev_kv().map(kv),
    }
}

fn header_rev(resp: &WatchResponse) -> i64 {
    resp.header().map_or(0, |h| h.revision())
}

/// One watcher's loop: (re)open on its member from `next_rev`, record every response, ask
/// for progress every 300 ms, until `stop`; a broken stream (the member killed) or one that
/// cannot open is retried.
async fn watch_loop(
    endpoint: String,
    shared: Arc<Mutex<Watcher>>,
    stop: Arc<std::sync::atomic::AtomicBool>,
) {
    use std::sync::atomic::Ordering;
    while !stop.load(Ordering::SeqCst) {
        let (start, range, prev_kv) = {
            let w = shared.lock().expect("lock");
            (w.next_rev, w.range.clone(), w.prev_kv)
        };
        let opened = async {
            let mut client = Client::connect([endpoint.clone()], None).await?;
            let mut opts = WatchOptions::new()
                .with_start_revision(start)
                .with_progress_notify();
            if !range.end.is_empty() {
                opts = opts.with_range(range.end.clone());
            }
            if prev_kv {
                opts = opts.with_prev_key();
            }
            client.watch(range.key.clone(), Some(opts)).await
        };
        let stream = match tokio::time::timeout(Duration::from_secs(2), opened).await {
            Ok(Ok(stream)) => stream,
            // The member is down: try again shortly (this paces the retries; nothing waits
            // on it).
            _ => {
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        {
            let mut w = shared.lock().expect("lock");
            if !w.log.is_empty() {
                w.resumed += 1;
            }
            w.log.push(Delivery::Open(start));
        }
        let (mut sender, mut responses) = stream.split();
        let mut progress = tokio::time::interval(Duration::from_millis(300));
        loop {
            if stop.load(Ordering::SeqCst) {
                return;
            }
            let resp = tokio::select! {
                resp = tokio::time::timeout(Duration::from_millis(500), responses.message()) => resp,
                _ = progress.tick() => {
                    if sender.request_progress().await.is_err() {
                        break;
                    }
                    continue;
                }
            };
            let resp = match resp {
                // Nothing for a while: check `stop` and go on.
                Err(_) => continue,
                Ok(Ok(Some(resp))) => resp,
                // The stream broke or ended: resume.
                Ok(_) => break,
            };
            if resp.created() {
                continue;
            }
            if resp.canceled() {
                // Nothing here compacts; any cancel (the member stopping) means resume.
                break;
            }
            let mut w = shared.lock().expect("lock");
            if resp.events().is_empty() {
                let rev = header_rev(&resp);
                w.next_rev = w.next_rev.max(rev + 1);
                w.log.push(Delivery::Progress(rev));
            } else {
                let events: Vec<mvccpb::Event> = resp.events().iter().map(to_proto).collect();
                let last = events
                    .last()
                    .and_then(|e| e.kv.as_ref())
                    .map_or(0, |kv| kv.mod_revision);
                w.next_rev = w.next_rev.max(last + 1);
                w.log.push(Delivery::Events(header_rev(&resp), events));
            }
        }
    }
}

/// The writer: puts, deletes and two-key transactions over the test's keys, each retried on
/// the next member until one answers; returns how many were answered.
async fn write_loop(
    endpoints: Vec<String>,
    stop: Arc<std::sync::atomic::AtomicBool>,
    acked: Arc<std::sync::atomic::AtomicUsize>,
) -> usize {
    use std::sync::atomic::Ordering;
    let mut clients: Vec<Option<Client>> = vec![None; endpoints.len()];
    let mut at = 0;
    let mut done = 0;
    let mut n: usize = 0;
    while !stop.load(Ordering::SeqCst) {
        n += 1;
        let k = key(n % KEYS);
        loop {
            if stop.load(Ordering::SeqCst) {
                return done;
            }
            if clients[at].is_none() {
                let connect = Client::connect([endpoints[at].clone()], None);
                clients[at] = tokio::time::timeout(Duration::from_secs(1), connect)
                    .await
                    .ok()
                    .and_then(Result::ok);
            }
            let Some(client) = clients[at].as_mut() else {
                at = (at + 1) % endpoints.len();
                continue;
            };
            let value = format!("v{n}");
            let op = async {
                match n % 7 {
                    0 => client.delete(k.clone(), None).await.map(|_| ()),
                    // Two keys in one revision: a watcher of both must get them together.
                    3 => {
                        let other = key((n + 2) % KEYS);
                        let txn = Txn::new()
                            .when([Compare::version(k.clone(), CompareOp::Greater, -1)])
                            .and_then([
                                TxnOp::put(k.clone(), value.clone(), None),
                                TxnOp::put(other, value.clone(), None),
                            ]);
                        client.txn(txn).await.map(|_| ())
                    }
                    _ => client.put(k.clone(), value.clone(), None).await.map(|_| ()),
                }
            };
            match tokio::time::timeout(Duration::from_secs(2), op).await {
                Ok(Ok(())) => {
                    done += 1;
                    acked.fetch_add(1, Ordering::SeqCst);
                    break;
                }
                // No answer: its outcome is unknown (the history read at the end says); go
                // on with the next member.
                _ => {
                    clients[at] = None;
                    at = (at + 1) % endpoints.len();
                }
            }
        }
    }
    done
}

/// Every event of the test's prefix from revision 1 up to `head`, as member `endpoint` holds
/// it.
async fn history_from(endpoint: &str, head: i64) -> anyhow::Result<Vec<mvccpb::Event>> {
    let mut client = Client::connect([endpoint], None).await?;
    let mut stream = client
        .watch(
            PREFIX,
            Some(WatchOptions::new().with_prefix().with_start_revision(1)),
        )
        .await?;
    let mut events = Vec::new();
    let deadline = Instant::now() + WAIT;
    loop {
        let last = events
            .last()
            .and_then(|e: &mvccpb::Event| e.kv.as_ref())
            .map_or(0, |kv| kv.mod_revision);
        if last >= head {
            return Ok(events);
        }
        let left = deadline.saturating_duration_since(Instant::now());
        let Some(resp) = tokio::time::timeout(left, stream.message()).await?? else {
            anyhow::bail!("the history watch ended at revision {last}");
        };
        events.extend(resp.events().iter().map(to_proto));
    }
}

#[tokio::test]
async fn watchers_on_every_member_keep_the_guarantees_through_kills_and_a_partition() {
    use std::sync::atomic::{AtomicBool, Ordering};
    let started = Instant::now();
    let mut c = RelayedCluster::start(3, &bin(), &[])
        .await
        .expect("cluster starts");
    let endpoints: Vec<String> = c.members().iter().map(|m| m.endpoint()).collect();
    let stop_watchers = Arc::new(AtomicBool::new(false));
    let stop_writer = Arc::new(AtomicBool::new(false));
    let mut watchers = Vec::new();
    let mut tasks = Vec::new();
    for (member, endpoint) in endpoints.iter().enumerate() {
        for (range, prev_kv) in [
            (KeyRange::prefix(PREFIX.as_bytes()), true),
            (
                KeyRange {
                    key: key(member).into_bytes(),
                    end: Vec::new(),
                },
                false,
            ),
        ] {
            let w = Arc::new(Mutex::new(Watcher {
                member,
                range,
                prev_kv,
                log: Vec::new(),
                next_rev: 1,
                resumed: 0,
            }));
            watchers.push(w.clone());
            tasks.push(tokio::spawn(watch_loop(
                endpoint.clone(),
                w,
                stop_watchers.clone(),
            )));
        }
    }
    let acked = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let writer = tokio::spawn(write_loop(
        endpoints.clone(),
        stop_writer.clone(),
        acked.clone(),
    ));

    // The faults, one after another; each phase lasts until the writer has had another
    // PHASE_WRITES writes acknowledged (within the deadline), so that no phase passes empty
    // on a slow machine.
    let phase = || {
        let from = acked.load(Ordering::SeqCst);
        let acked = acked.clone();
        async move {
            poll_until(WAIT, || {
                let n = acked.load(Ordering::SeqCst) - from;
                async move {
                    if n >= PHASE_WRITES {
                        Ok(())
                    } else {
                        Err(format!(
                            "{n} of {PHASE_WRITES} writes acknowledged in this phase"
                        ))
                    }
                }
            })
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        }
    };
    phase().await;
    let mut kills = 0;
    let victim = (c.leader().await.expect("leader") + 1) % 3;
    c.member_mut(victim).kill9().expect("SIGKILL a follower");
    kills += 1;
    phase().await;
    c.member_mut(victim)
        .restart()
        .await
        .unwrap_or_else(|e| panic!("restart m{victim}: {e:#}\n{}", c.log_tails()));
    phase().await;
    let cut = c.leader().await.expect("leader");
    c.isolate(cut).expect("isolate the leader");
    phase().await;
    c.heal();
    phase().await;
    let leader = c.leader().await.expect("leader");
    c.member_mut(leader).kill9().expect("SIGKILL the leader");
    kills += 1;
    phase().await;
    c.member_mut(leader)
        .restart()
        .await
        .unwrap_or_else(|e| panic!("restart m{leader}: {e:#}\n{}", c.log_tails()));
    phase().await;
    stop_writer.store(true, Ordering::SeqCst);
    let writes = writer.await.expect("writer");

    // The last revision, then every watcher caught up to it (progress notifications carry
    // the ones whose keys did not change).
    let mut client = c.member(0).client().await.expect("client");
    let head = poll_until(WAIT, || {
        let mut client = client.clone();
        async move {
            client
                .get(PREFIX, Some(GetOptions::new().with_prefix()))
                .await
                .map(|r| r.header().map_or(0, |h| h.revision()))
        }
    })
    .await
    .expect("the last revision");
    poll_until(WAIT, || {
        let behind: Vec<(usize, i64)> = watchers
            .iter()
            .map(|w| w.lock().expect("lock"))
            .filter(|w| w.next_rev <= head)
            .map(|w| (w.member, w.next_rev))
            .collect();
        async move {
            if behind.is_empty() {
                Ok(())
            } else {
                Err(format!(
                    "watchers (member, next revision) behind {head}: {behind:?}"
                ))
            }
        }
    })
    .await
    .unwrap_or_else(|e| panic!("{e}\n{}", c.log_tails()));
    stop_watchers.store(true, Ordering::SeqCst);
    for task in tasks {
        task.await.expect("watcher");
    }

    // The history: every member's, which must agree revision by revision.
    let mut history = History::new();
    for endpoint in &endpoints {
        let events = history_from(endpoint, head)
            .await
            .unwrap_or_else(|e| panic!("the history on {endpoint}: {e:#}"));
        history
            .record(&events)
            .unwrap_or_else(|e| panic!("{endpoint}: {e}"));
    }
    history.committed(head);
    // And the keys' values at the last revision are the history's.
    let all = client
        .get(
            PREFIX,
            Some(GetOptions::new().with_prefix().with_revision(head)),
        )
        .await
        .expect("range at the head");
    for i in 0..KEYS {
        let k = key(i);
        let stored = all.kvs().iter().find(|kv| kv.key() == k.as_bytes());
        let want = history.value_at(k.as_bytes(), head);
        assert_eq!(
            stored.map(|kv| (kv.value().to_vec(), kv.mod_revision())),
            want.map(|kv| (kv.value.clone(), kv.mod_revision)),
            "{k} at revision {head}"
        );
    }

    // Every watcher's deliveries, replayed through the checker.
    let (mut events, mut responses, mut progress, mut resumed) = (0, 0, 0, 0);
    for w in &watchers {
        let w = w.lock().expect("lock");
        let mut check: Option<Watch> = None;
        for delivery in &w.log {
            let outcome = match delivery {
                Delivery::Open(start) => {
                    check = Some(Watch::new(w.range.clone(), w.prev_kv, *start, 0));
                    Ok(())
                }
                Delivery::Events(rev, got) => {
                    responses += 1;
                    events += got.len();
                    check
                        .as_mut()
                        .expect("opened")
                        .events(&history, *rev, got, 0)
                }
                Delivery::Progress(rev) => {
                    progress += 1;
                    check.as_mut().expect("opened").progress(&history, *rev, 0)
                }
            };
            if let Err(violation) = outcome {
                panic!(
                    "watcher on m{} of {:?}: {violation}\ndeliveries: {:?}",
                    w.member, w.range, w.log
                );
            }
        }
        resumed += w.resumed;
    }
    eprintln!(
        "{writes} writes answered, history of {} revisions ({} events) up to {head}; {} \
         watchers: {responses} responses with {events} events and {progress} progress \
         notifications checked, {resumed} resumptions; {kills} SIGKILLs, 1 partition; {:?}",
        history.revisions(),
        history.events(),
        watchers.len(),
        started.elapsed()
    );
    assert!(writes > 50, "only {writes} writes answered");
    assert!(events > 0 && progress > 0);
    assert!(
        resumed >= 2,
        "the kills broke no watch: {resumed} resumptions"
    );
}
