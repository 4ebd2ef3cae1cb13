//! Locks and elections: the stock `etcdctl lock` / `etcdctl elect` (which run etcd's client-side
//! recipes over KV, Watch and Lease) and the server-side v3lock and v3election services over
//! gRPC.
//!
//! Expected values are etcd 3.4's (checked by running this file against `/usr/bin/etcd`):
//! - a contender's key is `<name>/<lease id in hex>`, and the key with the lowest create
//!   revision holds the lock or leads the election;
//! - a Lock or Campaign RPC that is canceled while waiting deletes its key;
//! - the election errors are plain client-library errors: code Unknown with the messages
//!   `election: no leader` and `election: not leader`;
//! - a holder whose lease expires loses the lock, and the next waiter gets it.
//!
//! A short fixed wait appears only where a test asserts that a waiter has *not* got the lock
//! yet; every other wait polls with a deadline.

use std::process::Stdio;
use std::time::Duration;

use etcd_client::{Client, GetOptions, LeaderKey, LockOptions, ProclaimOptions, ResignOptions};
use etcdrs_testkit::{Code, Member, assert_grpc_error, poll_until};
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use tokio::io::{AsyncBufReadExt, BufReader, Lines};
use tokio::process::{Child, ChildStdout, Command};

use crate::{keys, start};

/// How long a waiter is watched (its future polled) to show it stays blocked while another holds.
const STILL_WAITING: Duration = Duration::from_millis(500);
/// Generous deadline for anything that should happen promptly.
const PROMPTLY: Duration = Duration::from_secs(10);

/// A running `etcdctl` (lock or elect): its output lines as they come.
struct Ctl {
    child: Child,
    lines: Lines<BufReader<ChildStdout>>,
}

impl Ctl {
    fn spawn(m: &Member, args: &[&str]) -> Ctl {
        let ctl = m.etcdctl();
        let mut child = Command::new(ctl.bin())
            .env("ETCDCTL_API", "3")
            .arg(format!("--endpoints={}", ctl.endpoints()))
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .expect("etcdctl starts");
        let stdout = child.stdout.take().expect("stdout");
        Ctl {
            child,
            lines: BufReader::new(stdout).lines(),
        }
    }

    /// The next `n` lines, failing after [`PROMPTLY`].
    async fn read(&mut self, n: usize) -> Vec<String> {
        let mut out = Vec::new();
        while out.len() < n {
            let line = tokio::time::timeout(PROMPTLY, self.lines.next_line())
                .await
                .unwrap_or_else(|_| panic!("etcdctl printed only {out:?}"))
                .expect("read")
                .unwrap_or_else(|| panic!("etcdctl exited after printing {out:?}"));
            out.push(line);
        }
        out
    }

    /// Asserts that nothing is printed for [`STILL_WAITING`].
    async fn assert_silent(&mut self) {
        if let Ok(line) = tokio::time::timeout(STILL_WAITING, self.lines.next_line()).await {
            panic!("expected etcdctl to keep waiting, got {line:?}");
        }
    }

    /// SIGTERM: etcdctl unlocks or resigns, then exits.
    async fn terminate(mut self) {
        let pid = self.child.id().expect("still running") as i32;
        kill(Pid::from_raw(pid), Signal::SIGTERM).expect("SIGTERM");
        let status = tokio::time::timeout(PROMPTLY, self.child.wait())
            .await
            .expect("etcdctl exits on SIGTERM")
            .expect("wait");
        assert!(status.success(), "etcdctl exited with {status}");
    }
}

/// Keys under `prefix`, oldest first.
async fn contenders(c: &mut Client, prefix: &str) -> Vec<String> {
    let opts = GetOptions::new().with_prefix().with_sort(
        etcd_client::SortTarget::Create,
        etcd_client::SortOrder::Ascend,
    );
    keys(c.get(prefix, Some(opts)).await.expect("get").kvs())
}

/// Polls until exactly `n` keys are under `prefix`; returns them, oldest first.
async fn wait_contenders(c: &Client, prefix: &str, n: usize) -> Vec<String> {
    poll_until(PROMPTLY, || {
        let mut c = c.clone();
        async move {
            let found = contenders(&mut c, prefix).await;
            if found.len() == n {
                Ok(found)
            } else {
                Err(format!("contenders {found:?}"))
            }
        }
    })
    .await
    .unwrap_or_else(|e| panic!("waiting for {n} keys under {prefix:?}: {e}"))
}

/// `name/<lease hex>`, as etcd names a contender.
fn contender_key(name: &str, lease: i64) -> String {
    format!("{name}/{lease:x}")
}

#[tokio::test]
async fn etcdctl_lock_two_contenders_one_holder_at_a_time() {
    let (m, c) = start().await;
    let mut first = Ctl::spawn(&m, &["lock", "mylock"]);
    let held = first.read(2).await;
    assert!(held[0].starts_with("mylock/"), "key line {held:?}");
    assert_eq!(held[1], "", "the lock key's value is empty");

    let mut second = Ctl::spawn(&m, &["lock", "mylock"]);
    let queued = wait_contenders(&c, "mylock/", 2).await;
    assert_eq!(queued[0], held[0], "the first holder is the oldest key");
    second.assert_silent().await;

    first.terminate().await;
    let next = second.read(2).await;
    assert_eq!(next[0], queued[1]);
    assert_eq!(wait_contenders(&c, "mylock/", 1).await, [queued[1].clone()]);
    second.terminate().await;
    wait_contenders(&c, "mylock/", 0).await;
}

#[tokio::test]
async fn etcdctl_lock_runs_a_command_while_holding() {
    let (m, c) = start().await;
    let ctl = m.etcdctl();
    let script = "echo \"key=$ETCD_LOCK_KEY rev=$ETCD_LOCK_REV\"";
    let out = ctl.ok(&["lock", "cmdlock", "--", "sh", "-c", script]).await;
    let line = out.trim();
    assert!(line.starts_with("key=cmdlock/"), "{line:?}");
    assert!(!line.ends_with("rev="), "{line:?}");
    // The command's exit unlocks.
    wait_contenders(&c, "cmdlock/", 0).await;

    // With the lock held elsewhere, the command waits for it.
    let holder = {
        let mut holder = Ctl::spawn(&m, &["lock", "cmdlock"]);
        holder.read(2).await;
        holder
    };
    let mut waiting = tokio::spawn({
        let ctl = ctl.clone();
        async move {
            ctl.run(&["lock", "cmdlock", "--", "sh", "-c", "echo ran"])
                .await
                .expect("etcdctl runs")
        }
    });
    wait_contenders(&c, "cmdlock/", 2).await;
    assert!(
        tokio::time::timeout(STILL_WAITING, &mut waiting)
            .await
            .is_err(),
        "the command ran while the lock was held"
    );
    holder.terminate().await;
    let out = tokio::time::timeout(PROMPTLY, waiting)
        .await
        .expect("the command runs once the lock is free")
        .expect("join");
    assert!(out.success(), "{out:?}");
    assert_eq!(out.stdout.trim(), "ran");
    wait_contenders(&c, "cmdlock/", 0).await;
}

#[tokio::test]
async fn etcdctl_lock_killed_holder_hands_on_when_its_lease_expires() {
    let (m, c) = start().await;
    let mut holder = Ctl::spawn(&m, &["lock", "--ttl=2", "killlock"]);
    let held = holder.read(2).await;
    let mut waiter = Ctl::spawn(&m, &["lock", "--ttl=2", "killlock"]);
    let queued = wait_contenders(&c, "killlock/", 2).await;
    assert_eq!(queued[0], held[0]);

    // SIGKILL: no unlock; only the lease's expiry (2 s after the last keep-alive) frees it.
    holder.child.start_kill().expect("kill");
    let next = waiter.read(2).await;
    assert_eq!(next[0], queued[1]);
    assert_eq!(
        wait_contenders(&c, "killlock/", 1).await,
        [queued[1].clone()]
    );
    waiter.terminate().await;
}

#[tokio::test]
async fn etcdctl_elect_one_leader_at_a_time_and_observers_follow() {
    let (m, c) = start().await;
    let mut observer = Ctl::spawn(&m, &["elect", "-l", "myelection"]);
    let mut first = Ctl::spawn(&m, &["elect", "myelection", "v1"]);
    let led = first.read(2).await;
    assert!(led[0].starts_with("myelection/"), "{led:?}");
    assert_eq!(led[1], "v1");
    assert_eq!(observer.read(2).await, led);

    let mut second = Ctl::spawn(&m, &["elect", "myelection", "v2"]);
    let queued = wait_contenders(&c, "myelection/", 2).await;
    assert_eq!(queued[0], led[0]);
    second.assert_silent().await;

    // Resigning (on SIGTERM) elects the next candidate, and the observer sees it.
    first.terminate().await;
    let next = second.read(2).await;
    assert_eq!(next, [queued[1].clone(), "v2".to_owned()]);
    assert_eq!(observer.read(2).await, next);
    second.terminate().await;
    wait_contenders(&c, "myelection/", 0).await;
    observer.terminate().await;
}

#[tokio::test]
async fn lock_service_serializes_holders_and_unlock_hands_on() {
    let (_m, mut c) = start().await;
    let lease_a = c.lease_grant(60, None).await.unwrap().id();
    let lease_b = c.lease_grant(60, None).await.unwrap().id();

    let a = c
        .lock("svc", Some(LockOptions::new().with_lease(lease_a)))
        .await
        .unwrap();
    assert_eq!(a.key(), contender_key("svc", lease_a).as_bytes());
    let created = c.get(a.key(), None).await.unwrap();
    let kv = &created.kvs()[0];
    assert_eq!(kv.value(), b"");
    assert_eq!(kv.lease(), lease_a);
    assert_eq!(
        a.header().unwrap().revision(),
        kv.create_revision(),
        "an uncontended lock answers with the header of the txn that created its key"
    );

    // Locking again with the same lease reuses the key: already held.
    let again = c
        .lock("svc", Some(LockOptions::new().with_lease(lease_a)))
        .await
        .unwrap();
    assert_eq!(again.key(), a.key());

    let mut lock_client = c.lock_client();
    let mut waiting = tokio::spawn(async move {
        lock_client
            .lock("svc", Some(LockOptions::new().with_lease(lease_b)))
            .await
    });
    wait_contenders(&c, "svc/", 2).await;
    assert!(
        tokio::time::timeout(STILL_WAITING, &mut waiting)
            .await
            .is_err(),
        "a second holder got the lock"
    );

    let unlocked = c.unlock(a.key()).await.unwrap();
    let b = tokio::time::timeout(PROMPTLY, waiting)
        .await
        .expect("the waiter gets the lock after unlock")
        .expect("join")
        .expect("lock");
    assert_eq!(b.key(), contender_key("svc", lease_b).as_bytes());
    assert!(b.header().unwrap().revision() >= unlocked.header().unwrap().revision());
    assert_eq!(
        contenders(&mut c, "svc/").await,
        [contender_key("svc", lease_b)]
    );
}

#[tokio::test]
async fn lock_service_without_a_lease_and_with_an_unknown_one() {
    let (_m, mut c) = start().await;
    // Lease 0: the server grants a session lease (60 s) for the lock.
    let resp = c.lock("nolease", None).await.unwrap();
    let got = c.get(resp.key(), None).await.unwrap();
    let lease = got.kvs()[0].lease();
    assert_ne!(lease, 0);
    assert_eq!(resp.key(), contender_key("nolease", lease).as_bytes());
    let ttl = c.lease_time_to_live(lease, None).await.unwrap();
    assert_eq!(ttl.granted_ttl(), 60);

    assert_grpc_error(
        c.lock("unknown", Some(LockOptions::new().with_lease(0x1234)))
            .await,
        // etcd's lock server runs over its Go client, which strips the gRPC code.
        Code::Unknown,
        "etcdserver: requested lease not found",
    );
}

#[tokio::test]
async fn lock_service_expired_holder_hands_on_and_canceled_waiter_leaves() {
    let (_m, mut c) = start().await;
    let short = c.lease_grant(2, None).await.unwrap().id();
    let long = c.lease_grant(60, None).await.unwrap().id();
    let other = c.lease_grant(60, None).await.unwrap().id();
    c.lock("exp", Some(LockOptions::new().with_lease(short)))
        .await
        .unwrap();

    // A waiter whose client gives up: its key goes away with the request.
    let mut canceled_client = c.lock_client();
    let canceled = tokio::spawn(async move {
        canceled_client
            .lock("exp", Some(LockOptions::new().with_lease(other)))
            .await
    });
    wait_contenders(&c, "exp/", 2).await;
    canceled.abort();
    assert_eq!(
        wait_contenders(&c, "exp/", 1).await,
        [contender_key("exp", short)]
    );

    // The holder's lease expires (nobody keeps it alive): the next waiter proceeds.
    let got = tokio::time::timeout(
        PROMPTLY,
        c.lock("exp", Some(LockOptions::new().with_lease(long))),
    )
    .await
    .expect("the lock is handed on when the holder's lease expires")
    .unwrap();
    assert_eq!(got.key(), contender_key("exp", long).as_bytes());
    assert_eq!(
        contenders(&mut c, "exp/").await,
        [contender_key("exp", long)]
    );
}

#[tokio::test]
async fn election_service_campaign_proclaim_leader_observe_resign() {
    let (_m, mut c) = start().await;
    assert_grpc_error(c.leader("elec").await, Code::Unknown, "election: no leader");

    let lease_a = c.lease_grant(60, None).await.unwrap().id();
    let lease_b = c.lease_grant(60, None).await.unwrap().id();
    let won = c.campaign("elec", "a1", lease_a).await.unwrap();
    // etcd sends an Observe stream's response headers with its first message, so the call
    // returns only once there is a leader.
    let mut observe = c.observe("elec").await.unwrap();
    let leader_a = won.leader().unwrap().clone();
    assert_eq!(leader_a.name(), b"elec");
    assert_eq!(leader_a.key(), contender_key("elec", lease_a).as_bytes());
    assert_eq!(leader_a.lease(), lease_a);
    assert_eq!(leader_a.rev(), won.header().unwrap().revision());

    let seen = observe.message().await.unwrap().unwrap();
    assert_eq!(seen.kv().unwrap().value(), b"a1");
    assert_eq!(seen.header().unwrap().revision(), leader_a.rev());

    let leader = c.leader("elec").await.unwrap();
    assert_eq!(leader.kv().unwrap().key(), leader_a.key());
    assert_eq!(leader.kv().unwrap().value(), b"a1");

    let proclaimed = c
        .proclaim(
            "a2",
            Some(ProclaimOptions::new().with_leader(leader_a.clone())),
        )
        .await
        .unwrap();
    let seen = observe.message().await.unwrap().unwrap();
    assert_eq!(seen.kv().unwrap().value(), b"a2");
    assert_eq!(
        seen.header().unwrap().revision(),
        proclaimed.header().unwrap().revision()
    );

    // A second candidate waits until the leader resigns.
    let mut election_client = c.election_client();
    let mut campaign_b =
        tokio::spawn(async move { election_client.campaign("elec", "b1", lease_b).await });
    wait_contenders(&c, "elec/", 2).await;
    assert!(
        tokio::time::timeout(STILL_WAITING, &mut campaign_b)
            .await
            .is_err(),
        "two leaders at once"
    );

    c.resign(Some(ResignOptions::new().with_leader(leader_a.clone())))
        .await
        .unwrap();
    let won_b = tokio::time::timeout(PROMPTLY, campaign_b)
        .await
        .expect("the second candidate wins after the resignation")
        .expect("join")
        .expect("campaign");
    let leader_b = won_b.leader().unwrap().clone();
    assert_eq!(leader_b.key(), contender_key("elec", lease_b).as_bytes());
    let seen = observe.message().await.unwrap().unwrap();
    assert_eq!(seen.kv().unwrap().key(), leader_b.key());
    assert_eq!(seen.kv().unwrap().value(), b"b1");

    // The resigned leader's key is gone: it can no longer proclaim; resigning again is a no-op.
    assert_grpc_error(
        c.proclaim(
            "a3",
            Some(ProclaimOptions::new().with_leader(leader_a.clone())),
        )
        .await,
        Code::Unknown,
        "election: not leader",
    );
    c.resign(Some(ResignOptions::new().with_leader(leader_a)))
        .await
        .unwrap();
    assert_eq!(
        contenders(&mut c, "elec/").await,
        [contender_key("elec", lease_b)]
    );
}

#[tokio::test]
async fn election_service_errors_and_rejoining_candidate() {
    let (_m, mut c) = start().await;
    assert_grpc_error(
        c.proclaim("v", Some(ProclaimOptions::new())).await,
        Code::Unknown,
        "\"leader\" field must be provided",
    );
    assert_grpc_error(
        c.resign(Some(ResignOptions::new())).await,
        Code::Unknown,
        "\"leader\" field must be provided",
    );
    // A leader key that never existed.
    let ghost = LeaderKey::new()
        .with_name("ghost")
        .with_key("ghost/1")
        .with_rev(5);
    let ghost_lease = c.lease_grant(60, None).await.unwrap().id();
    assert_grpc_error(
        c.proclaim(
            "v",
            Some(ProclaimOptions::new().with_leader(ghost.with_lease(ghost_lease))),
        )
        .await,
        Code::Unknown,
        "election: not leader",
    );

    // Campaigning again with the same lease keeps the place and takes the new value.
    let lease = c.lease_grant(60, None).await.unwrap().id();
    let first = c.campaign("re", "x", lease).await.unwrap();
    let again = c.campaign("re", "y", lease).await.unwrap();
    assert_eq!(again.leader().unwrap().rev(), first.leader().unwrap().rev());
    let leader = c.leader("re").await.unwrap();
    assert_eq!(leader.kv().unwrap().value(), b"y");
    assert_eq!(
        leader.kv().unwrap().create_revision(),
        first.leader().unwrap().rev()
    );

    // An observer of an election with no candidate waits for the first one (the call itself
    // returns with the first message).
    let mut observe_client = c.election_client();
    let observing = tokio::spawn(async move { observe_client.observe("later").await });
    c.campaign("later", "first", lease).await.unwrap();
    let mut observe = tokio::time::timeout(PROMPTLY, observing)
        .await
        .expect("the observe call returns")
        .expect("join")
        .expect("observe");
    let seen = tokio::time::timeout(PROMPTLY, observe.message())
        .await
        .expect("the observer sees the first candidate")
        .unwrap()
        .unwrap();
    assert_eq!(seen.kv().unwrap().value(), b"first");
    assert_eq!(
        seen.header().unwrap().revision(),
        seen.kv().unwrap().mod_revision()
    );
}
