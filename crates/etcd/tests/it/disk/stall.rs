//! A slow disk (issue 41, item 1): a member whose fsyncs each take 1.5x the election
//! timeout, made so by the power-loss layer's delay (`PowerLoss::delay_syncs`: the slow
//! leader's every file under `member/`, its WAL and its database file; the slow follower's
//! WAL; a stalled disk, not a failing one).
//!
//! etcd's leader loses its leadership when its disk stalls (etcd#7617, #13587): its raft loop
//! fsyncs the WAL before it sends the next heartbeat, so a 2.9 s fsync let the followers'
//! election timers run out. Ours fsyncs on a thread of its own (`raftnode::wal_sync`) while
//! the raft thread goes on ticking, heartbeating and replicating; the leader sends its appends
//! before its own fsync and commits on its followers' acknowledgements (the Raft thesis,
//! 10.2.1). So under the stall there is no leader change, writes through the two healthy
//! followers go on at their own disks' pace, writes through the leader are answered once its
//! own slow fsync is done (a member answers only what it has applied, and applies only what
//! its own WAL holds), and a power cut of the slow leader in the middle of its stall loses
//! nothing that was acknowledged. The database file's durable commits are made on the
//! server's backend task, not on the raft thread (`backend::batch`), so their stall holds up
//! nothing either. A follower with a slow disk does not slow the quorum.

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use etcd_client::{Client, GetOptions};
use etcdrs_testkit::FAST_ELECTION_MS;
use etcdrs_testkit::powerloss::PowerLoss;
use etcdrs_testkit::{Cluster, ClusterOpts, Member, poll_until};

use crate::{bin, ours, pairs};

const WAIT: Duration = Duration::from_secs(60);
/// Every WAL fsync of the slow member: 1.5x the election timeout.
const STALL: Duration = Duration::from_millis(FAST_ELECTION_MS * 3 / 2);
/// Rounds of the slow-leader test, each ended by a power cut.
const ROUNDS: u64 = 3;

/// The part of a path that names `member`'s files under `member/<sub>` (its data dir is
/// `<tmp>/etcdrs-member-XXXX/data`; the layer sees canonical paths, so the temp dir's own
/// name is what is matched).
fn member_part(member: &Member, sub: &str) -> String {
    let data_dir = member.data_dir();
    let root = data_dir
        .parent()
        .and_then(|p| p.file_name())
        .expect("a member's data dir is <root>/data");
    format!("{}/data/member/{sub}", root.to_string_lossy())
}

/// A cluster of three under the power-loss layer, with fast timers (election 500 ms).
async fn cluster(power: &PowerLoss) -> Cluster {
    let mut opts = ClusterOpts::new(&bin());
    for (key, value) in power.env() {
        opts = opts.env(key, value);
    }
    Cluster::start(3, opts).await.expect("cluster starts")
}

/// Puts `<prefix><i>` = `v<i>` one at a time through `client` until `stop` or an error;
/// returns each acknowledged index with the put's latency.
struct Writer {
    acked: Arc<Mutex<Vec<(usize, Duration)>>>,
    task: tokio::task::JoinHandle<()>,
}

impl Writer {
    fn start(mut client: Client, prefix: String, stop: Arc<AtomicBool>) -> Writer {
        let acked: Arc<Mutex<Vec<(usize, Duration)>>> = Arc::default();
        let list = acked.clone();
        let task = tokio::spawn(async move {
            for i in 0.. {
                if stop.load(Ordering::Relaxed) {
                    return;
                }
                let started = Instant::now();
                let put = client.put(format!("{prefix}{i:06}"), format!("v{i}"), None);
                if put.await.is_err() {
                    return;
                }
                list.lock().expect("lock").push((i, started.elapsed()));
            }
        });
        Writer { acked, task }
    }

    fn count(&self) -> usize {
        self.acked.lock().expect("lock").len()
    }

    fn latencies(&self) -> Vec<Duration> {
        let mut all: Vec<Duration> = self
            .acked
            .lock()
            .expect("lock")
            .iter()
            .map(|a| a.1)
            .collect();
        all.sort();
        all
    }
}

/// Every `(leader, term)` any member reported while it ran, polled every 20 ms through one
/// client per member.
struct Views {
    seen: Arc<Mutex<BTreeSet<(u64, u64)>>>,
    stop: Arc<AtomicBool>,
    task: tokio::task::JoinHandle<()>,
}

impl Views {
    async fn watch(c: &Cluster) -> Views {
        let mut clients = Vec::new();
        for m in c.members() {
            clients.push(m.client().await.expect("client"));
        }
        let seen: Arc<Mutex<BTreeSet<(u64, u64)>>> = Arc::default();
        let stop = Arc::new(AtomicBool::new(false));
        let (into, until) = (seen.clone(), stop.clone());
        let task = tokio::spawn(async move {
            let mut ticker = tokio::time::interval(Duration::from_millis(20));
            while !until.load(Ordering::Relaxed) {
                ticker.tick().await;
                for client in &mut clients {
                    if let Ok(status) = client.status().await {
                        let term = status.raft_term();
                        into.lock().expect("lock").insert((status.leader(), term));
                    }
                }
            }
        });
        Views { seen, stop, task }
    }

    async fn stop(self) -> BTreeSet<(u64, u64)> {
        self.stop.store(true, Ordering::Relaxed);
        self.task.await.expect("views");
        self.seen.lock().expect("lock").clone()
    }
}

fn millis(d: Duration) -> u128 {
    d.as_millis()
}

/// Every acknowledged put of `writer` under `prefix` is stored in `client`'s member.
async fn check_acked(client: &mut Client, prefix: &str, acked: &[(usize, Duration)], who: &str) {
    let got = client
        .get(prefix, Some(GetOptions::new().with_prefix()))
        .await
        .expect("read");
    let stored: std::collections::BTreeMap<String, String> = pairs(got.kvs()).into_iter().collect();
    for (i, _) in acked {
        let key = format!("{prefix}{i:06}");
        assert_eq!(
            stored.get(&key).map(String::as_str),
            Some(format!("v{i}").as_str()),
            "{who}: acknowledged {key} is lost"
        );
    }
}

#[tokio::test]
async fn a_leader_whose_wal_and_database_fsyncs_outlast_the_election_timeout_keeps_leading_and_loses_nothing()
 {
    if !ours() {
        return;
    }
    let power = PowerLoss::build().expect("power-loss layer");
    let mut c = cluster(&power).await;
    let mut all_acked: Vec<(String, Vec<(usize, Duration)>)> = Vec::new();
    for round in 0..ROUNDS {
        let leader = c.leader().await.expect("a leader");
        let followers: Vec<usize> = (0..3).filter(|m| *m != leader).collect();
        power
            .delay_syncs(&member_part(c.member(leader), ""), STALL)
            .expect("slow the leader's disk");
        let views = Views::watch(&c).await;
        let stop = Arc::new(AtomicBool::new(false));
        let mut writers = Vec::new();
        for m in followers.iter().copied().chain([leader]) {
            let client = c.member(m).client().await.expect("client");
            let prefix = format!("stall/{round}/m{m}/");
            writers.push((
                m,
                prefix.clone(),
                Writer::start(client, prefix, stop.clone()),
            ));
        }
        // Three writes answered by the slow leader take at least three of its fsyncs (over
        // four election timeouts); the followers' writers go on meanwhile. The cut comes at a
        // point that moves from round to round.
        let leader_acks = 3 + usize::try_from(round).expect("small");
        let started = Instant::now();
        poll_until(WAIT, || async {
            let counts: Vec<usize> = writers.iter().map(|w| w.2.count()).collect();
            let (via_followers, via_leader) = (&counts[..2], counts[2]);
            if via_leader >= leader_acks && via_followers.iter().all(|n| *n >= 50) {
                Ok(())
            } else {
                Err(format!(
                    "acknowledged so far (followers', leader's): {counts:?}"
                ))
            }
        })
        .await
        .unwrap_or_else(|e| panic!("round {round}: writes stopped: {e:#}\n{}", c.log_tails()));
        let stalled_for = started.elapsed();
        let seen = views.stop().await;
        // The power cut of the slow leader, in the middle of a stalled fsync (its WAL has
        // writes no fsync covered yet); the others go down with it.
        c.kill9_all().expect("SIGKILL all");
        stop.store(true, Ordering::Relaxed);
        let cut = if round == 0 {
            power.cut_everything()
        } else {
            power.cut(round)
        }
        .expect("power cut");
        power.end_delay().expect("end the stall");
        let mut summary = Vec::new();
        for (m, prefix, writer) in writers {
            let latencies = writer.latencies();
            let acked = writer.acked.lock().expect("lock").clone();
            writer.task.await.expect("writer");
            summary.push(format!(
                "m{m}{}: {} acks, p50 {} ms, max {} ms",
                if m == leader { " (slow leader)" } else { "" },
                latencies.len(),
                millis(latencies[latencies.len() / 2]),
                millis(*latencies.last().expect("acks")),
            ));
            all_acked.push((prefix, acked));
        }
        eprintln!(
            "round {round}: {} ms of {} ms fsyncs on the leader m{leader}; {}; leader and \
             term seen {seen:?}; cut {cut:?}",
            millis(stalled_for),
            millis(STALL),
            summary.join("; ")
        );
        assert_eq!(
            seen.len(),
            1,
            "round {round}: the leader or term changed under the stall: {seen:?}"
        );
        // The slow leader's WAL had writes its stalled fsync had not covered yet.
        assert!(
            cut.undone + cut.kept > 0,
            "round {round}: the cut found nothing unsynced: {cut:?}"
        );
        assert!(
            seen.iter().all(|(leader, _)| *leader != 0),
            "round {round}: a member lost its leader: {seen:?}"
        );
        c.restart_all().await.unwrap_or_else(|e| {
            panic!(
                "restart after the cut of round {round}: {e:#}\n{}",
                c.log_tails()
            )
        });
        for m in 0..3 {
            let mut client = c.member(m).client().await.expect("client");
            // A member that restarted behind catches up from the others first.
            let want: usize = all_acked.iter().map(|(_, a)| a.len()).sum();
            poll_until(WAIT, || {
                let mut client = client.clone();
                async move {
                    let got = client
                        .get(
                            "stall/",
                            Some(GetOptions::new().with_prefix().with_count_only()),
                        )
                        .await
                        .map_err(|e| e.to_string())?;
                    match usize::try_from(got.count()).unwrap_or(0) {
                        have if have >= want => Ok(()),
                        have => Err(format!("m{m} holds {have} of {want} acknowledged")),
                    }
                }
            })
            .await
            .expect("every member catches up");
            for (prefix, acked) in &all_acked {
                check_acked(
                    &mut client,
                    prefix,
                    acked,
                    &format!("m{m} after round {round}"),
                )
                .await;
            }
        }
    }
}

#[tokio::test]
async fn a_follower_with_a_slow_disk_does_not_slow_the_quorum() {
    if !ours() {
        return;
    }
    const PUTS: usize = 200;
    let power = PowerLoss::build().expect("power-loss layer");
    let c = cluster(&power).await;
    let leader = c.leader().await.expect("a leader");
    let slow = (leader + 1) % 3;
    power
        .delay_syncs(&member_part(c.member(slow), "wal/"), STALL)
        .expect("slow a follower's disk");
    let views = Views::watch(&c).await;
    let mut client = c.member(leader).client().await.expect("client");
    let mut latencies = Vec::with_capacity(PUTS);
    let started = Instant::now();
    for i in 0..PUTS {
        let put_started = Instant::now();
        client
            .put(format!("slowfollower/{i:04}"), "v", None)
            .await
            .expect("put");
        latencies.push(put_started.elapsed());
    }
    let took = started.elapsed();
    let seen = views.stop().await;
    latencies.sort();
    let p50 = latencies[PUTS / 2];
    let max = *latencies.last().expect("puts");
    eprintln!(
        "{PUTS} puts through the leader m{leader} with m{slow}'s fsyncs at {} ms: {} ms in \
         all, p50 {} ms, max {} ms; leader and term seen {seen:?}",
        millis(STALL),
        millis(took),
        millis(p50),
        millis(max)
    );
    // A put that waited for the slow follower would take a whole stalled fsync, each one of
    // them; a loaded machine (other members, other tests) may hold up one now and then.
    let stalled = latencies.iter().filter(|l| **l >= STALL).count();
    assert!(
        p50 < STALL / 5 && stalled <= PUTS / 20,
        "puts waited for the slow follower: p50 {} ms, {stalled} of {PUTS} over {} ms",
        millis(p50),
        millis(STALL)
    );
    assert_eq!(seen.len(), 1, "the leader or term changed: {seen:?}");
    // Once its disk is fast again the slow follower holds every write.
    power.end_delay().expect("end the stall");
    let slow_client = c.member(slow).client().await.expect("client");
    poll_until(WAIT, || {
        let mut slow_client = slow_client.clone();
        async move {
            let got = slow_client
                .get(
                    "slowfollower/",
                    Some(
                        GetOptions::new()
                            .with_prefix()
                            .with_count_only()
                            .with_serializable(),
                    ),
                )
                .await
                .map_err(|e| e.to_string())?;
            match usize::try_from(got.count()).unwrap_or(0) {
                n if n == PUTS => Ok(()),
                n => Err(format!("the slow follower holds {n} of {PUTS}")),
            }
        }
    })
    .await
    .expect("the slow follower catches up");
}
