//! Power cuts (issue 20, item 1): members run under the testkit's power-loss layer
//! (`testkit::powerloss`: every write to a member's files that no fsync covered is undone
//! at the cut, and every directory entry change that no fsync of its directory covered, but
//! for a seeded-random prefix per file and per directory), a writer puts keys as fast as it
//! is acknowledged, and at a seeded-random point every member is SIGKILLed and the power
//! cut. Each member must start again on what the disk kept with every acknowledged write,
//! and the members of a cluster must agree (`endpoint hashkv`).
//!
//! The worst cut (nothing unsynced kept) right after a member's first start found the
//! member's directories unsynced: `data`, `data/member`, `data/member/snap` and the
//! backend's `db` were made without syncing their parents, so the member came back empty,
//! as a new member, without the writes it had acknowledged; with `--wal-dir` a few levels
//! deep, the WAL synced only its immediate parent, so the levels above were lost (and the
//! member, finding applied data and no WAL, refused to start). The same cut after a follower
//! installed the leader's snapshot brought back the received images (`*.snap.recv`,
//! `*.snap.from-etcd`) whose removal was not durable: they are removed at start now.
//!
//! A kill at a random instant mostly finds nothing unsynced (the WAL fsyncs before it
//! acknowledges, redb keeps its non-durable commits in memory), so some rounds stop a member
//! just before an fsync of its WAL or backend (`PowerLoss::stop_at_next_sync`) and cut there.
//!
//! `--no-capture` prints each round's seed and what its cut undid. The layer's own check:
//! with `--unsafe-no-fsync`, one cut loses acknowledged writes (and the member, finding its
//! backend ahead of its WAL, refuses to start rather than serve them).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use etcd_client::{Client, GetOptions};
use etcdrs_testkit::powerloss::{Cut, PowerLoss};
use etcdrs_testkit::{Cluster, ClusterOpts, Member, MemberOpts, poll_until};

use crate::{bin, opts, ours, pairs};

const WAIT: Duration = Duration::from_secs(30);
/// Power cuts of the single member.
const MEMBER_ROUNDS: u64 = 16;
/// New members cut right after their first start (the worst cut).
const FRESH_ROUNDS: u64 = 3;
/// Power cuts of the whole 3-member cluster.
const CLUSTER_ROUNDS: u64 = 6;

/// The seed of round `round` of test `salt`, and the number of acknowledgements to wait for
/// before cutting (20 to 169).
fn round_seed(salt: u64, round: u64) -> (u64, usize) {
    let seed = salt.wrapping_mul(1_000).wrapping_add(round);
    let mixed = seed
        .wrapping_mul(0x9e37_79b9_7f4a_7c15)
        .rotate_left(29)
        .wrapping_mul(0xbf58_476d_1ce4_e5b9);
    (
        seed,
        20 + usize::try_from((mixed >> 33) % 150).expect("small"),
    )
}

fn under(power: &PowerLoss, mut opts: MemberOpts) -> MemberOpts {
    for (key, value) in power.env() {
        opts = opts.env(key, value);
    }
    opts
}

/// Puts `<prefix><i>` = `v<i>`, i = 0, 1, … one at a time until a put fails (the kill);
/// returns the shared list of acknowledged indexes and the task.
fn writer(
    mut client: Client,
    prefix: String,
) -> (Arc<Mutex<Vec<usize>>>, tokio::task::JoinHandle<()>) {
    let acked: Arc<Mutex<Vec<usize>>> = Arc::default();
    let list = acked.clone();
    let task = tokio::spawn(async move {
        for i in 0.. {
            if client
                .put(format!("{prefix}{i:06}"), format!("v{i}"), None)
                .await
                .is_err()
            {
                return;
            }
            list.lock().expect("lock").push(i);
        }
    });
    (acked, task)
}

async fn wait_acks(acked: &Arc<Mutex<Vec<usize>>>, n: usize) {
    poll_until(WAIT, || async {
        match acked.lock().expect("lock").len() {
            got if got >= n => Ok(()),
            got => Err(format!("{got} of {n} acks")),
        }
    })
    .await
    .expect("the writer is acknowledged");
}

/// What `client` holds under `prefix`, index to value.
async fn stored(client: &mut Client, prefix: &str) -> BTreeMap<usize, String> {
    let got = client
        .get(prefix, Some(GetOptions::new().with_prefix()))
        .await
        .expect("read");
    pairs(got.kvs())
        .into_iter()
        .map(|(k, v)| {
            let i = k[prefix.len()..].parse().expect("index");
            (i, v)
        })
        .collect()
}

/// Every acknowledged put is stored, and nothing else but the one in flight at the cut.
fn check_round(who: &str, stored: &BTreeMap<usize, String>, acked: usize) {
    for i in 0..acked {
        assert_eq!(
            stored.get(&i).map(String::as_str),
            Some(format!("v{i}").as_str()),
            "{who}: acknowledged put {i} of {acked}"
        );
    }
    assert!(
        stored.len() == acked || stored.len() == acked + 1,
        "{who}: {} stored, {acked} acknowledged",
        stored.len()
    );
}

#[tokio::test]
async fn a_member_survives_power_cuts_under_a_writer() {
    if !ours() {
        return;
    }
    let power = PowerLoss::build().expect("power-loss layer");
    let mut member = Member::start(under(&power, opts()))
        .await
        .expect("member starts");
    let mut acked_per_round = Vec::new();
    let mut total = Cut::default();
    let (mut unsynced_cuts, mut stops, mut previous_commits) = (0, 0, 0);
    for round in 0..MEMBER_ROUNDS {
        let (seed, acks) = round_seed(1, round);
        let client = member.client().await.expect("client");
        let (acked, task) = writer(client, format!("pl/{round}/"));
        wait_acks(&acked, acks).await;
        // Two rounds in three are cut inside an unsynced window: the member stops itself
        // just before its next sync of the WAL, or of the backend, and is killed there.
        let stop = match round % 3 {
            1 => Some("/member/wal/"),
            2 => Some("/member/snap/db"),
            _ => None,
        };
        let stopped_at = match stop {
            Some(path_part) => {
                let pid = member.pid().expect("the member runs");
                Some(wait_for_a_stop(&power, &[pid], path_part).await)
            }
            None => None,
        };
        member.kill9().expect("SIGKILL");
        task.await.expect("writer");
        let acked = acked.lock().expect("lock").len();
        let cut = power.cut(seed).expect("power cut");
        eprintln!(
            "round {round}: seed {seed}, {acked} acknowledged, stopped at {stopped_at:?}, cut {cut:?}"
        );
        total += cut;
        stops += usize::from(stopped_at.is_some());
        unsynced_cuts += usize::from(cut.undone + cut.kept > 0);
        member
            .restart()
            .await
            .unwrap_or_else(|e| panic!("restart after cut {round} (seed {seed}): {e:#}"));
        previous_commits += usize::from(member.current_log().contains(PREVIOUS_COMMIT));
        acked_per_round.push(acked);
        let mut client = member.client().await.expect("client");
        for (r, acked) in acked_per_round.iter().enumerate() {
            let prefix = format!("pl/{r}/");
            check_round(
                &format!("round {round}, seed {seed}"),
                &stored(&mut client, &prefix).await,
                *acked,
            );
        }
    }
    eprintln!(
        "{MEMBER_ROUNDS} power cuts of one member: {unsynced_cuts} found unsynced data \
         ({stops} stopped at a sync), {previous_commits} restarts opened the backend's \
         previous commit; {total:?}"
    );
    // A kill at a random instant mostly finds nothing unsynced (WAL writes are fsynced
    // before they are acknowledged, and redb keeps its non-durable commits in memory), but a
    // member stopped just before an fsync has written what that fsync would cover.
    assert!(
        unsynced_cuts > 0,
        "no cut found unsynced data ({stops} stops at a sync): {total:?}"
    );
}

/// What the backend logs when its newest commit failed the integrity check on open.
const PREVIOUS_COMMIT: &str = "opened the previous commit";

/// Arms the power-loss layer's stop at the next sync of a file whose path contains
/// `path_part` and waits until one of the processes `pids` has stopped itself there;
/// returns the file.
async fn wait_for_a_stop(power: &PowerLoss, pids: &[u32], path_part: &str) -> PathBuf {
    power.stop_at_next_sync(path_part).expect("arm the stop");
    poll_until(WAIT, || async {
        match power.stopped_at() {
            Some(path) if pids.iter().any(|&pid| process_is_stopped(pid)) => Ok(path),
            Some(_) => Err("stopping".to_owned()),
            None => Err(format!("no sync of {path_part} yet")),
        }
    })
    .await
    .unwrap_or_else(|e| panic!("no member stopped at a sync: {e}"))
}

/// Whether process `pid` is stopped (state `T` in `/proc/<pid>/stat`).
fn process_is_stopped(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|stat| {
        stat.rsplit_once(')')
            .is_some_and(|(_, rest)| rest.trim_start().starts_with('T'))
    })
}

#[tokio::test]
async fn a_new_member_survives_a_power_cut_that_keeps_nothing_unsynced() {
    // The worst cut right after the first start: every file, directory and name the member
    // created without syncing it (and its directory) is gone, so each missing fsync shows.
    if !ours() {
        return;
    }
    let power = PowerLoss::build().expect("power-loss layer");
    let mut total = Cut::default();
    // The last round keeps its WAL elsewhere (`--wal-dir`), a few directories deep in a
    // directory the member did not make.
    let wal_root = tempfile::Builder::new()
        .prefix("etcdrs-member-wal-")
        .tempdir()
        .expect("WAL root");
    for round in 0..FRESH_ROUNDS {
        let mut member_opts = opts();
        if round == FRESH_ROUNDS - 1 {
            let wal_dir = wal_root.path().join("deep").join("wal");
            member_opts = member_opts.arg(format!("--wal-dir={}", wal_dir.display()));
        }
        let mut member = Member::start(under(&power, member_opts))
            .await
            .expect("member starts");
        let client = member.client().await.expect("client");
        let (acked, task) = writer(client, format!("fresh/{round}/"));
        wait_acks(&acked, 1 + 20 * round as usize).await;
        member.kill9().expect("SIGKILL");
        task.await.expect("writer");
        let acked = acked.lock().expect("lock").len();
        let cut = power.cut_everything().expect("power cut");
        eprintln!("new member {round}: {acked} acknowledged, cut {cut:?}");
        total += cut;
        member.restart().await.unwrap_or_else(|e| {
            panic!(
                "restart of new member {round} after the cut: {e:#}\n{}",
                member.log_tail(20)
            )
        });
        let mut client = member.client().await.expect("client");
        check_round(
            &format!("new member {round}"),
            &stored(&mut client, &format!("fresh/{round}/")).await,
            acked,
        );
    }
    eprintln!("{FRESH_ROUNDS} cuts of new members: {total:?}");
    assert!(
        total.entries_kept > 0,
        "the layer saw no directory change: {total:?}"
    );
}

#[tokio::test]
async fn a_cluster_survives_power_cuts_of_every_member_at_once() {
    if !ours() {
        return;
    }
    let power = PowerLoss::build().expect("power-loss layer");
    let mut cluster_opts = ClusterOpts::new(&bin());
    for (key, value) in power.env() {
        cluster_opts = cluster_opts.env(key, value);
    }
    let mut c = Cluster::start(3, cluster_opts)
        .await
        .expect("cluster starts");
    let mut acked_per_round = Vec::new();
    let mut total = Cut::default();
    let mut unsynced_cuts = 0;
    for round in 0..CLUSTER_ROUNDS {
        let (seed, acks) = round_seed(2, round);
        let client = c.client().await.expect("client");
        let (acked, task) = writer(client, format!("plc/{round}/"));
        wait_acks(&acked, acks).await;
        // Odd rounds stop a member (whichever syncs first) just before a WAL sync; the
        // others are killed wherever they are.
        let stopped_at = if round % 2 == 1 {
            let pids: Vec<u32> = (0..3).filter_map(|m| c.member(m).pid()).collect();
            Some(wait_for_a_stop(&power, &pids, "/member/wal/").await)
        } else {
            None
        };
        c.kill9_all().expect("SIGKILL all");
        task.await.expect("writer");
        let acked = acked.lock().expect("lock").len();
        // The first cut, of new members, is the worst one (nothing unsynced kept).
        let cut = if round == 0 {
            power.cut_everything()
        } else {
            power.cut(seed)
        }
        .expect("power cut");
        eprintln!(
            "cluster round {round}: seed {seed}, {acked} acknowledged, stopped at \
             {stopped_at:?}, cut {cut:?}"
        );
        total += cut;
        unsynced_cuts += usize::from(cut.undone + cut.kept > 0);
        c.restart_all().await.unwrap_or_else(|e| {
            panic!(
                "restart after cut {round} (seed {seed}): {e:#}\n{}",
                c.log_tails()
            )
        });
        acked_per_round.push(acked);
        for m in 0..3 {
            let mut client = c.member(m).client().await.expect("client");
            for (r, acked) in acked_per_round.iter().enumerate() {
                let prefix = format!("plc/{r}/");
                check_round(
                    &format!("m{m}, round {round}, seed {seed}"),
                    &stored(&mut client, &prefix).await,
                    *acked,
                );
            }
        }
        let ctl = c.etcdctl();
        poll_until(WAIT, || async {
            let out = ctl
                .run(&["endpoint", "hashkv", "--cluster", "-w", "json"])
                .await
                .map_err(|e| format!("{e:#}"))?;
            let rows: serde_json::Value =
                serde_json::from_str(&out.stdout).map_err(|e| e.to_string())?;
            let hashes: std::collections::BTreeSet<(i64, u64)> = rows
                .as_array()
                .ok_or("not an array")?
                .iter()
                .map(|r| {
                    (
                        r["HashKV"]["header"]["revision"].as_i64().unwrap_or(0),
                        r["HashKV"]["hash"].as_u64().unwrap_or(0),
                    )
                })
                .collect();
            if hashes.len() == 1 {
                Ok(())
            } else {
                Err(format!("members disagree: {hashes:?}"))
            }
        })
        .await
        .unwrap_or_else(|e| panic!("round {round} (seed {seed}): {e}"));
    }
    eprintln!(
        "{CLUSTER_ROUNDS} power cuts of a 3-member cluster: {unsynced_cuts} found unsynced \
         data; {total:?}"
    );
    // The members fsync every WAL write before acknowledging it and the backend buffers its
    // commits in memory between durable ones, so whether a kill finds an unsynced write is a
    // race (the unsafe-no-fsync test is the one held to losing writes); what must hold is
    // that the layer saw the members' files at all.
    assert!(
        total.undone + total.kept + total.entries_undone + total.entries_kept > 0,
        "the layer saw nothing of the members' writes: {total:?}"
    );
}

/// Puts `n` keys `<prefix><i>` through `client`, 8 at a time.
async fn put_many(client: &Client, prefix: &str, n: usize) {
    let mut workers = tokio::task::JoinSet::new();
    for worker in 0..8 {
        let mut client = client.clone();
        let prefix = prefix.to_owned();
        workers.spawn(async move {
            for i in (worker..n).step_by(8) {
                client
                    .put(format!("{prefix}{i:06}"), format!("v{i}"), None)
                    .await
                    .unwrap_or_else(|e| panic!("put {i}: {e}"));
            }
        });
    }
    while let Some(done) = workers.join_next().await {
        done.expect("put worker");
    }
}

#[tokio::test]
async fn a_member_that_installed_a_snapshot_survives_the_worst_power_cut() {
    // A follower that was down while the leader compacted its log catches up from the
    // leader's database snapshot (received into a file beside its backend, installed, then
    // removed); then every member loses its power with nothing unsynced kept.
    if !ours() {
        return;
    }
    let power = PowerLoss::build().expect("power-loss layer");
    let mut cluster_opts = ClusterOpts::new(&bin()).args([
        "--snapshot-count",
        "200",
        "--experimental-snapshot-catchup-entries",
        "100",
    ]);
    for (key, value) in power.env() {
        cluster_opts = cluster_opts.env(key, value);
    }
    let mut c = Cluster::start(3, cluster_opts)
        .await
        .expect("cluster starts");
    let leader = c.leader().await.expect("leader");
    let follower = (leader + 1) % 3;
    c.kill9(follower).expect("kill the follower");
    const PUTS: usize = 600;
    let client = c.member(leader).client().await.expect("client");
    put_many(&client, "plsnap/", PUTS).await;
    c.restart(follower)
        .await
        .unwrap_or_else(|e| panic!("restart: {e:#}\n{}", c.log_tails()));
    let on_follower = c.member(follower).client().await.expect("client");
    poll_until(WAIT, || {
        let mut on_follower = on_follower.clone();
        async move {
            match stored(&mut on_follower, "plsnap/").await.len() {
                PUTS => Ok(()),
                got => Err(format!("the follower has {got} of {PUTS}")),
            }
        }
    })
    .await
    .expect("the follower catches up");
    assert!(
        c.member(follower)
            .current_log()
            .contains("received and saved database snapshot"),
        "the follower caught up without a snapshot:\n{}",
        c.member(follower).log_tail(20)
    );

    c.kill9_all().expect("SIGKILL all");
    let cut = power.cut_everything().expect("power cut");
    eprintln!("cut after a snapshot install: {cut:?}");
    c.restart_all()
        .await
        .unwrap_or_else(|e| panic!("restart after the cut: {e:#}\n{}", c.log_tails()));
    for m in 0..3 {
        let mut client = c.member(m).client().await.expect("client");
        check_round(
            &format!("m{m}"),
            &stored(&mut client, "plsnap/").await,
            PUTS,
        );
    }
    // What the snapshot left beside the backend is gone once the member is back.
    let snap_dir = c.member(follower).data_dir().join("member/snap");
    let left: Vec<String> = std::fs::read_dir(&snap_dir)
        .expect("snap dir")
        .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
        .filter(|name| name != "db")
        .collect();
    assert!(left.is_empty(), "left in {}: {left:?}", snap_dir.display());
}

#[tokio::test]
async fn without_fsync_a_power_cut_loses_acknowledged_writes_or_the_start_is_refused() {
    // The layer's own check: with `--unsafe-no-fsync` the WAL is never synced, so cutting
    // the power right after a burst of acknowledged puts loses some of them.
    if !ours() {
        return;
    }
    let power = PowerLoss::build().expect("power-loss layer");
    let mut member = Member::start(under(&power, opts().arg("--unsafe-no-fsync")))
        .await
        .expect("member starts");
    let client = member.client().await.expect("client");
    let (acked, task) = writer(client, "nofsync/".to_owned());
    wait_acks(&acked, 100).await;
    member.kill9().expect("SIGKILL");
    task.await.expect("writer");
    let acked = acked.lock().expect("lock").len();
    let cut = power.cut_everything().expect("power cut");
    // Either the member sees that its backend is ahead of what the WAL kept and refuses to
    // start, or it starts without some acknowledged puts.
    if let Err(e) = member.restart().await {
        let log = member.current_log();
        assert!(
            log.contains("applied entries are missing from the WAL"),
            "restart failed otherwise: {e:#}\n{}",
            member.log_tail(10)
        );
        eprintln!("without fsync: the member refused to start after the cut {cut:?}");
        return;
    }
    let mut client = member.client().await.expect("client");
    let kept = stored(&mut client, "nofsync/").await;
    eprintln!(
        "without fsync: {} of {acked} acknowledged puts kept; cut {cut:?}",
        kept.len()
    );
    assert!(
        kept.len() < acked,
        "all {acked} acknowledged puts survived a cut of everything unsynced"
    );
}

/// Every file under `<data-dir>/fixtures` (the auto-TLS certificates and keys), by path.
fn fixture_files(data_dir: &Path) -> BTreeMap<PathBuf, Vec<u8>> {
    let mut files = BTreeMap::new();
    let mut dirs = vec![data_dir.join("fixtures")];
    while let Some(dir) = dirs.pop() {
        let Ok(entries) = std::fs::read_dir(&dir) else {
            continue;
        };
        for entry in entries {
            let path = entry.expect("fixtures entry").path();
            if path.is_dir() {
                dirs.push(path);
            } else {
                let bytes = std::fs::read(&path).expect("read a fixture");
                files.insert(path, bytes);
            }
        }
    }
    files
}

/// The base64 body of the first PEM certificate in `text`, without line breaks.
fn first_pem_body(text: &str) -> Option<String> {
    let begin = "-----BEGIN CERTIFICATE-----";
    let start = text.find(begin)? + begin.len();
    let end = start + text[start..].find("-----END CERTIFICATE-----")?;
    Some(text[start..end].split_whitespace().collect())
}

/// The certificate the TLS listener at `addr` presents, as a PEM body.
fn served_certificate(addr: &str) -> Option<String> {
    let out = std::process::Command::new("openssl")
        .args(["s_client", "-connect", addr])
        .stdin(std::process::Stdio::null())
        .output()
        .ok()?;
    first_pem_body(&String::from_utf8_lossy(&out.stdout))
}

#[tokio::test]
async fn auto_tls_certificates_survive_a_power_cut_after_the_member_served() {
    // `--auto-tls` and `--peer-auto-tls` write a self-signed certificate and key under
    // `<data-dir>/fixtures`. They were written without an fsync (as etcd writes them), so
    // the worst cut after the member had served took the new directory with them (the member
    // came back with a new certificate, one its peers and clients had never seen), and a cut
    // that kept the names but not the data left both files empty (the member could not
    // start). A member started fresh for each kind of cut.
    if !ours() {
        return;
    }
    let power = PowerLoss::build().expect("power-loss layer");
    for data_only in [false, true] {
        let auto_tls = opts().peer_auto_tls().setting("auto-tls", "true");
        let mut member = Member::start(under(&power, auto_tls))
            .await
            .expect("member starts");
        let mut client = member.client().await.expect("client");
        client.put("tls/k", "v", None).await.expect("put");
        let peer_addr = member.peer_url().trim_start_matches("https://").to_owned();
        let before = fixture_files(member.data_dir());
        let peer_cert = member.data_dir().join("fixtures/peer/cert.pem");
        let peer_pem = first_pem_body(&String::from_utf8_lossy(&before[&peer_cert]))
            .expect("a PEM peer certificate");
        assert!(
            before.contains_key(&member.data_dir().join("fixtures/client/key.pem")),
            "no client certificate: {:?}",
            before.keys()
        );
        assert_eq!(served_certificate(&peer_addr).as_ref(), Some(&peer_pem));

        member.kill9().expect("SIGKILL");
        let cut = if data_only {
            power.cut_data_keep_names()
        } else {
            power.cut_everything()
        }
        .expect("power cut");
        eprintln!("auto TLS, data only {data_only}: cut {cut:?}");
        member.restart().await.unwrap_or_else(|e| {
            panic!(
                "restart after the cut (data only {data_only}): {e:#}\n{}",
                member.log_tail(20)
            )
        });
        let after = fixture_files(member.data_dir());
        assert_eq!(
            after.keys().collect::<Vec<_>>(),
            before.keys().collect::<Vec<_>>(),
            "data only {data_only}"
        );
        for (path, bytes) in &before {
            assert!(
                after[path] == *bytes,
                "{} changed across the cut (data only {data_only})",
                path.display()
            );
        }
        assert_eq!(
            served_certificate(&peer_addr).as_ref(),
            Some(&peer_pem),
            "the peer port serves the certificate it served before the cut"
        );
        let mut client = member.client().await.expect("client");
        let got = client.get("tls/k", None).await.expect("get");
        assert_eq!(pairs(got.kvs()), [("tls/k".to_owned(), "v".to_owned())]);
    }
}
