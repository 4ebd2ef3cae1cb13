//! Leases end to end: Grant/Revoke/KeepAlive/TimeToLive/Leases over gRPC, the stock `etcdctl
//! lease` commands, expiry of attached keys, and leases across a SIGKILL restart.
//!
//! Expected values are etcd 3.4's (checked by running this file against `/usr/bin/etcd`):
//! - a grant's TTL is raised to the minimum, `ceil(((3 * election_ticks) / 2) * heartbeat)`:
//!   2 s with the default 100 ms heartbeat and 1000 ms election timeout;
//! - TimeToLive's `ttl` is the time left truncated to whole seconds (a fresh 10 s lease says 9),
//!   and an unknown lease answers `ttl = -1, granted_ttl = 0` rather than an error;
//! - KeepAlive of an unknown or revoked lease answers TTL 0 and keeps the stream open;
//! - the lease list is sorted by time left;
//! - revoking (or expiring) a lease deletes all its keys in one revision;
//! - a restart keeps leases and their keys, and restarts each lease's clock when the member
//!   becomes leader again, extended by the election timeout (a 5 s lease reports 5 right after).
//!
//! Timing assertions poll with deadlines. A fixed sleep appears only where the test asserts
//! that something has *not* happened yet (a kept-alive lease outliving its TTL).

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use etcd_client::{Client, GetOptions, LeaseGrantOptions, LeaseTimeToLiveOptions, PutOptions};
use etcdrs_testkit::{Code, assert_grpc_error, poll_until};
use serde_json::{Value, json};

use crate::{dump, keys, revision, start, start_with};

/// How long after its TTL a lease may take to be revoked, as a client sees it. The server's
/// expiry loop revokes within about half a second; the slack is for a machine busy with other
/// tests, where scheduling alone delays the revocation's proposal and apply by seconds (a
/// bound of 1.5 s failed there). The lower bounds (never before the TTL) stay exact.
const EXPIRY_SLACK: Duration = Duration::from_secs(5);

/// The lease id as etcdctl prints it.
fn hex(id: i64) -> String {
    format!("{id:016x}")
}

/// `(ttl, granted_ttl)` of a lease.
async fn ttl_of(c: &mut Client, id: i64) -> (i64, i64) {
    let r = c.lease_time_to_live(id, None).await.expect("time to live");
    assert_eq!(r.id(), id);
    (r.ttl(), r.granted_ttl())
}

/// Ids in the lease list, in the server's order.
async fn lease_ids(c: &mut Client) -> Vec<i64> {
    let r = c.leases().await.expect("leases");
    r.leases().iter().map(|l| l.id()).collect()
}

/// Keys under `prefix`, as strings.
async fn keys_under(c: &mut Client, prefix: &str) -> Vec<String> {
    let r = c
        .get(prefix, Some(GetOptions::new().with_prefix()))
        .await
        .expect("get prefix");
    keys(r.kvs())
}

/// Polls until no key is left under `prefix`; returns when that was first seen.
async fn wait_gone(c: &Client, prefix: &str, timeout: Duration) -> Instant {
    poll_until(timeout, || {
        let mut c = c.clone();
        async move {
            let left = keys_under(&mut c, prefix).await;
            if left.is_empty() {
                Ok(Instant::now())
            } else {
                Err(format!("still there: {left:?}"))
            }
        }
    })
    .await
    .unwrap_or_else(|e| panic!("keys under {prefix:?} not deleted: {e}"))
}

#[tokio::test]
async fn grant_ids_minimum_ttl_and_errors() {
    let (_m, mut c) = start().await;
    let rev = revision(&mut c).await;

    // ID 0: the server picks a positive id.
    let r = c.lease_grant(60, None).await.unwrap();
    assert!(r.id() > 0, "server-assigned id {}", r.id());
    assert_eq!(r.ttl(), 60);
    assert_eq!(r.error(), "");
    // A grant is not a key-space change: the revision stays.
    assert_eq!(r.header().unwrap().revision(), rev);
    let first = r.id();
    let second = c.lease_grant(60, None).await.unwrap().id();
    assert!(second > 0 && second != first);

    // A client-chosen id is kept.
    let r = c
        .lease_grant(30, Some(LeaseGrantOptions::new().with_id(0x1234)))
        .await
        .unwrap();
    assert_eq!((r.id(), r.ttl()), (0x1234, 30));
    assert_eq!(ttl_of(&mut c, 0x1234).await.1, 30);

    // The same id again, whatever the TTL.
    assert_grpc_error(
        c.lease_grant(99, Some(LeaseGrantOptions::new().with_id(0x1234)))
            .await,
        Code::FailedPrecondition,
        "etcdserver: lease already exists",
    );
    assert_grpc_error(
        c.lease_grant(60, Some(LeaseGrantOptions::new().with_id(first)))
            .await,
        Code::FailedPrecondition,
        "etcdserver: lease already exists",
    );
    // The failed grant changed nothing.
    assert_eq!(ttl_of(&mut c, 0x1234).await.1, 30);

    // TTLs below the minimum (2 s with the default timing) are raised, zero and negative too.
    for ttl in [1, 0, -5] {
        let r = c.lease_grant(ttl, None).await.unwrap();
        assert_eq!(r.ttl(), 2, "granted TTL for {ttl}");
        assert_eq!(ttl_of(&mut c, r.id()).await.1, 2);
    }
    assert_eq!(c.lease_grant(2, None).await.unwrap().ttl(), 2);
    assert_eq!(c.lease_grant(3, None).await.unwrap().ttl(), 3);

    // etcd's MaxLeaseTTL is accepted; one more second is not.
    let r = c.lease_grant(9_000_000_000, None).await.unwrap();
    assert_eq!(r.ttl(), 9_000_000_000);
    assert_grpc_error(
        c.lease_grant(9_000_000_001, None).await,
        Code::OutOfRange,
        "etcdserver: too large lease TTL",
    );
    assert_grpc_error(
        c.lease_grant(i64::MAX, Some(LeaseGrantOptions::new().with_id(77)))
            .await,
        Code::OutOfRange,
        "etcdserver: too large lease TTL",
    );
    assert_eq!(ttl_of(&mut c, 77).await, (-1, 0));
    assert_eq!(revision(&mut c).await, rev);
}

#[tokio::test]
async fn minimum_ttl_follows_election_timeout_and_heartbeat() {
    // (3 * 15 ticks) / 2 = 22 ticks of 100 ms = 2.2 s, rounded up to 3 s.
    let (_m, mut c) = start_with(&["--heartbeat-interval=100", "--election-timeout=1500"]).await;
    assert_eq!(c.lease_grant(1, None).await.unwrap().ttl(), 3);
    assert_eq!(c.lease_grant(3, None).await.unwrap().ttl(), 3);
    assert_eq!(c.lease_grant(4, None).await.unwrap().ttl(), 4);
}

#[tokio::test]
async fn revoke_deletes_attached_keys_in_one_revision() {
    let (_m, mut c) = start().await;
    let id = c.lease_grant(60, None).await.unwrap().id();
    let other = c.lease_grant(60, None).await.unwrap().id();
    for key in ["l/a", "l/b", "l/c"] {
        c.put(key, "v", Some(PutOptions::new().with_lease(id)))
            .await
            .unwrap();
    }
    c.put("l/other", "v", Some(PutOptions::new().with_lease(other)))
        .await
        .unwrap();
    c.put("plain", "v", None).await.unwrap();
    // A key re-put without the lease is no longer attached to it.
    c.put("l/detached", "v", Some(PutOptions::new().with_lease(id)))
        .await
        .unwrap();
    c.put("l/detached", "w", None).await.unwrap();
    let rev = revision(&mut c).await;

    let r = c.lease_revoke(id).await.unwrap();
    assert_eq!(r.header().unwrap().revision(), rev + 1);
    assert_eq!(revision(&mut c).await, rev + 1);
    let left: Vec<String> = dump(&mut c).await.into_iter().map(|(k, _)| k).collect();
    assert_eq!(left, ["l/detached", "l/other", "plain"]);
    // All three keys existed up to `rev` and were deleted together at `rev + 1`.
    let before = c
        .get(
            "l/",
            Some(GetOptions::new().with_prefix().with_revision(rev)),
        )
        .await
        .unwrap();
    assert_eq!(
        keys(before.kvs()),
        ["l/a", "l/b", "l/c", "l/detached", "l/other"]
    );
    assert_eq!(ttl_of(&mut c, id).await, (-1, 0));
    assert_eq!(lease_ids(&mut c).await, [other]);

    // Revoking it again, or a lease that never existed: NotFound.
    assert_grpc_error(
        c.lease_revoke(id).await,
        Code::NotFound,
        "etcdserver: requested lease not found",
    );
    assert_grpc_error(
        c.lease_revoke(0x4321).await,
        Code::NotFound,
        "etcdserver: requested lease not found",
    );
    // A revoked lease cannot be used by a put.
    assert_grpc_error(
        c.put("l/a", "v", Some(PutOptions::new().with_lease(id)))
            .await,
        Code::NotFound,
        "etcdserver: requested lease not found",
    );

    // A lease without keys is revoked without a new revision.
    let empty = c.lease_grant(60, None).await.unwrap().id();
    let r = c.lease_revoke(empty).await.unwrap();
    assert_eq!(r.header().unwrap().revision(), rev + 1);
    assert_eq!(revision(&mut c).await, rev + 1);
    assert_eq!(
        dump(&mut c).await,
        [
            ("l/detached".to_owned(), "w".to_owned()),
            ("l/other".to_owned(), "v".to_owned()),
            ("plain".to_owned(), "v".to_owned()),
        ]
    );
}

#[tokio::test]
async fn time_to_live_with_and_without_keys() {
    let (_m, mut c) = start().await;
    let id = c.lease_grant(10, None).await.unwrap().id();

    // The time left is truncated to whole seconds: a moment after the grant, 9 of 10.
    let r = c.lease_time_to_live(id, None).await.unwrap();
    assert_eq!((r.id(), r.granted_ttl()), (id, 10));
    assert!((8..=9).contains(&r.ttl()), "ttl {}", r.ttl());
    assert!(r.keys().is_empty());
    let rev = revision(&mut c).await;
    assert_eq!(r.header().unwrap().revision(), rev);

    for key in ["t/b", "t/a", "t/c"] {
        c.put(key, "v", Some(PutOptions::new().with_lease(id)))
            .await
            .unwrap();
    }
    c.delete("t/c", None).await.unwrap();
    // Without `keys` none are listed.
    let r = c.lease_time_to_live(id, None).await.unwrap();
    assert!(r.keys().is_empty());
    // With `keys`, the attached ones (etcd lists them in no particular order).
    let r = c
        .lease_time_to_live(id, Some(LeaseTimeToLiveOptions::new().with_keys()))
        .await
        .unwrap();
    let attached: BTreeSet<&[u8]> = r.keys().iter().map(Vec::as_slice).collect();
    assert_eq!(attached, BTreeSet::from([&b"t/a"[..], &b"t/b"[..]]));
    assert_eq!(r.granted_ttl(), 10);
    assert_eq!(r.header().unwrap().revision(), revision(&mut c).await);

    // An unknown lease is not an error: TTL -1, granted TTL 0, no keys.
    let r = c
        .lease_time_to_live(0x5555, Some(LeaseTimeToLiveOptions::new().with_keys()))
        .await
        .unwrap();
    assert_eq!((r.id(), r.ttl(), r.granted_ttl()), (0x5555, -1, 0));
    assert!(r.keys().is_empty());
    assert!(r.header().unwrap().revision() > 0);
}

#[tokio::test]
async fn leases_are_listed_soonest_expiry_first() {
    let (_m, mut c) = start().await;
    assert!(lease_ids(&mut c).await.is_empty());
    let long = c.lease_grant(300, None).await.unwrap().id();
    let short = c.lease_grant(100, None).await.unwrap().id();
    let mid = c.lease_grant(200, None).await.unwrap().id();
    let fixed = c
        .lease_grant(150, Some(LeaseGrantOptions::new().with_id(1)))
        .await
        .unwrap()
        .id();
    assert_eq!(lease_ids(&mut c).await, [short, fixed, mid, long]);
    let r = c.leases().await.unwrap();
    assert_eq!(r.header().unwrap().revision(), revision(&mut c).await);

    c.lease_revoke(mid).await.unwrap();
    assert_eq!(lease_ids(&mut c).await, [short, fixed, long]);
}

#[tokio::test]
async fn keep_alive_stream_answers_ttl_and_zero_for_unknown() {
    let (_m, mut c) = start().await;
    // etcd answers TTL 0 for a lease it does not know; the client turns that into an error.
    match c.lease_keep_alive(0x6666).await {
        Err(etcd_client::Error::LeaseKeepAliveError(_)) => {}
        other => panic!("keep-alive of an unknown lease: {other:?}"),
    }

    let id = c.lease_grant(60, None).await.unwrap().id();
    c.put("ka", "v", Some(PutOptions::new().with_lease(id)))
        .await
        .unwrap();
    let rev = revision(&mut c).await;
    let (mut keeper, mut stream) = c.lease_keep_alive(id).await.unwrap();
    assert_eq!(keeper.id(), id);
    for _ in 0..3 {
        keeper.keep_alive().await.unwrap();
        let r = stream
            .message()
            .await
            .unwrap()
            .expect("keep-alive response");
        assert_eq!((r.id(), r.ttl()), (id, 60));
        assert_eq!(r.header().unwrap().revision(), rev);
    }

    // Once revoked, the same stream answers TTL 0, and stays open.
    c.lease_revoke(id).await.unwrap();
    for _ in 0..2 {
        keeper.keep_alive().await.unwrap();
        let r = stream
            .message()
            .await
            .unwrap()
            .expect("keep-alive response");
        assert_eq!((r.id(), r.ttl()), (id, 0));
        assert_eq!(r.header().unwrap().revision(), rev + 1);
    }
    assert_eq!(keys_under(&mut c, "ka").await, Vec::<String>::new());
}

#[tokio::test]
async fn expiry_deletes_all_keys_of_a_lease_in_one_revision() {
    const TTL: u64 = 3;
    let (_m, mut c) = start().await;
    c.put("keep", "v", None).await.unwrap();
    let granted = Instant::now();
    let id = c.lease_grant(TTL as i64, None).await.unwrap().id();
    for key in ["e/a", "e/b", "e/c"] {
        c.put(key, "v", Some(PutOptions::new().with_lease(id)))
            .await
            .unwrap();
    }
    let rev = revision(&mut c).await;

    let gone = wait_gone(&c, "e/", Duration::from_secs(TTL) + EXPIRY_SLACK).await;
    let after = gone.duration_since(granted);
    assert!(
        after >= Duration::from_secs(TTL - 1),
        "deleted {after:?} after a {TTL} s grant"
    );
    assert!(
        after <= Duration::from_secs(TTL) + EXPIRY_SLACK,
        "deleted only {after:?} after a {TTL} s grant"
    );
    assert_eq!(revision(&mut c).await, rev + 1);
    let before = c
        .get(
            "e/",
            Some(GetOptions::new().with_prefix().with_revision(rev)),
        )
        .await
        .unwrap();
    assert_eq!(keys(before.kvs()), ["e/a", "e/b", "e/c"]);
    assert_eq!(ttl_of(&mut c, id).await, (-1, 0));
    assert!(lease_ids(&mut c).await.is_empty());
    assert_eq!(dump(&mut c).await, [("keep".to_owned(), "v".to_owned())]);
}

#[tokio::test]
async fn keep_alive_keeps_a_lease_past_its_ttl() {
    const TTL: u64 = 2;
    let (_m, mut c) = start().await;
    let id = c.lease_grant(TTL as i64, None).await.unwrap().id();
    c.put("alive", "v", Some(PutOptions::new().with_lease(id)))
        .await
        .unwrap();
    let (mut keeper, mut stream) = c.lease_keep_alive(id).await.unwrap();
    let keeping = tokio::spawn(async move {
        loop {
            keeper.keep_alive().await.expect("send keep-alive");
            let r = stream.message().await.expect("receive").expect("response");
            assert_eq!(r.ttl(), TTL as i64);
            // The pace of the keep-alives (etcd's clients renew every TTL / 3).
            tokio::time::sleep(Duration::from_millis(400)).await;
        }
    });

    // Let more than twice the TTL pass: the lease and its key must still be there.
    tokio::time::sleep(Duration::from_secs(2 * TTL + 1)).await;
    assert!(!keeping.is_finished(), "keep-alive loop failed");
    assert_eq!(keys_under(&mut c, "alive").await, ["alive"]);
    let (ttl, granted) = ttl_of(&mut c, id).await;
    assert_eq!(granted, TTL as i64);
    assert!((0..=TTL as i64).contains(&ttl), "ttl {ttl}");

    // Without keep-alives it expires like any other lease.
    keeping.abort();
    let stopped = Instant::now();
    let gone = wait_gone(&c, "alive", Duration::from_secs(TTL) + EXPIRY_SLACK).await;
    let after = gone.duration_since(stopped);
    assert!(
        after <= Duration::from_secs(TTL) + EXPIRY_SLACK,
        "{after:?}"
    );
    assert_eq!(ttl_of(&mut c, id).await, (-1, 0));
}

#[tokio::test]
async fn keep_alive_after_expiry_does_not_resurrect_the_lease() {
    const TTL: u64 = 2;
    let (_m, mut c) = start().await;
    let id = c.lease_grant(TTL as i64, None).await.unwrap().id();
    c.put("late", "v", Some(PutOptions::new().with_lease(id)))
        .await
        .unwrap();
    // Opening the stream renews the lease; when it returns, the server's expiry is at most
    // TTL ahead.
    let (mut keeper, mut stream) = c.lease_keep_alive(id).await.unwrap();
    let renewed = Instant::now();
    // Let the lease expire (on the server's clock, whatever the expiry loop has done yet).
    tokio::time::sleep_until((renewed + Duration::from_millis(TTL * 1000 + 200)).into()).await;
    // etcd does not renew an expired lease: it waits for its revocation and answers TTL 0.
    keeper.keep_alive().await.unwrap();
    let r = stream
        .message()
        .await
        .unwrap()
        .expect("keep-alive response");
    assert_eq!((r.id(), r.ttl()), (id, 0));
    assert_eq!(keys_under(&mut c, "late").await, Vec::<String>::new());
    assert_eq!(ttl_of(&mut c, id).await, (-1, 0));
}

#[tokio::test]
async fn sigkill_restart_keeps_leases_keys_and_refreshes_ttl() {
    const TTL: i64 = 5;
    let (mut m, mut c) = start().await;
    let id = c.lease_grant(TTL, None).await.unwrap().id();
    let other = c
        .lease_grant(600, Some(LeaseGrantOptions::new().with_id(42)))
        .await
        .unwrap()
        .id();
    c.put("r/a", "1", Some(PutOptions::new().with_lease(id)))
        .await
        .unwrap();
    c.put("r/b", "2", Some(PutOptions::new().with_lease(id)))
        .await
        .unwrap();
    c.put("r/long", "3", Some(PutOptions::new().with_lease(other)))
        .await
        .unwrap();
    c.put("r/plain", "4", None).await.unwrap();
    let rev = revision(&mut c).await;

    // Let the lease run down to at most 2 s left.
    poll_until(Duration::from_secs(10), || {
        let mut c = c.clone();
        async move {
            let (ttl, _) = ttl_of(&mut c, id).await;
            if ttl <= 2 {
                Ok(())
            } else {
                Err(format!("ttl {ttl}"))
            }
        }
    })
    .await
    .expect("lease runs down");

    m.kill9().expect("SIGKILL");
    m.restart().await.expect("restart");
    let ready = Instant::now();
    let mut c = m.client().await.expect("client");

    // Leases and keys survived, and the lease's clock restarted: etcd restarts it when the
    // member becomes leader, extended by the election timeout (1 s), so 5 s + 1 s, truncated.
    let r = c
        .lease_time_to_live(id, Some(LeaseTimeToLiveOptions::new().with_keys()))
        .await
        .unwrap();
    assert_eq!(r.granted_ttl(), TTL);
    assert_eq!(r.ttl(), TTL, "remaining TTL right after restart");
    let attached: BTreeSet<&[u8]> = r.keys().iter().map(Vec::as_slice).collect();
    assert_eq!(attached, BTreeSet::from([&b"r/a"[..], &b"r/b"[..]]));
    assert_eq!(ttl_of(&mut c, other).await.1, 600);
    let mut listed = lease_ids(&mut c).await;
    listed.sort_unstable();
    assert_eq!(listed, {
        let mut both = vec![id, other];
        both.sort_unstable();
        both
    });
    let got = c.get("r/a", None).await.unwrap();
    assert_eq!(got.kvs()[0].lease(), id);
    assert_eq!(revision(&mut c).await, rev);

    // The refreshed lease expires a full TTL after the restart, its keys in one revision.
    let gone = wait_gone(
        &c,
        "r/a",
        Duration::from_secs(TTL as u64 + 1) + EXPIRY_SLACK,
    )
    .await;
    let after = gone.duration_since(ready);
    assert!(
        after >= Duration::from_secs(TTL as u64 - 1),
        "expired {after:?} after the restart"
    );
    assert!(
        after <= Duration::from_secs(TTL as u64 + 1) + EXPIRY_SLACK,
        "expired only {after:?} after the restart"
    );
    assert_eq!(keys_under(&mut c, "r/").await, ["r/long", "r/plain"]);
    assert_eq!(revision(&mut c).await, rev + 1);
    assert_eq!(lease_ids(&mut c).await, [other]);
}

/// Header fields etcdctl prints, read over gRPC.
async fn header_json(c: &mut Client) -> (u64, u64, i64, u64) {
    let s = c.status().await.expect("status");
    let h = s.header().expect("header");
    (h.cluster_id(), h.member_id(), h.revision(), s.raft_term())
}

fn parse_json(out: &str) -> Value {
    serde_json::from_str(out.trim()).unwrap_or_else(|e| panic!("not JSON ({e}): {out:?}"))
}

/// The id in etcdctl's "lease <hex> granted with TTL(<n>s)" line.
fn granted_id(out: &str) -> i64 {
    let hex_id = out
        .strip_prefix("lease ")
        .and_then(|rest| rest.split(' ').next())
        .unwrap_or_else(|| panic!("unexpected grant output {out:?}"));
    i64::from_str_radix(hex_id, 16).expect("hex lease id")
}

#[tokio::test]
async fn etcdctl_lease_commands() {
    let (m, mut c) = start().await;
    let ctl = m.etcdctl();

    // grant
    let out = ctl.ok(&["lease", "grant", "60"]).await;
    let id = granted_id(&out);
    assert_eq!(out, format!("lease {} granted with TTL(60s)\n", hex(id)));
    let out = ctl.ok(&["lease", "grant", "1"]).await;
    let short = granted_id(&out);
    assert_eq!(out, format!("lease {} granted with TTL(2s)\n", hex(short)));
    // Gone before it could expire in the middle of the checks below (or already expired).
    let _ = c.lease_revoke(short).await;
    let err = ctl.fail(&["lease", "grant", "9000000001"]).await;
    assert!(
        err.ends_with("Error: failed to grant lease (etcdserver: too large lease TTL)\n"),
        "{err}"
    );
    let (cluster, member, rev, term) = header_json(&mut c).await;
    let out = ctl.ok(&["lease", "grant", "70", "-w", "json"]).await;
    let v = parse_json(&out);
    let json_id = v["ID"].as_i64().expect("ID");
    assert_eq!(
        v,
        json!({"cluster_id": cluster, "member_id": member, "revision": rev,
               "raft_term": term, "ID": json_id, "TTL": 70, "Error": ""})
    );

    // put --lease, with the id in hex as etcdctl takes it.
    let lease_flag = format!("--lease={}", hex(id));
    assert_eq!(ctl.ok(&["put", &lease_flag, "k1", "v1"]).await, "OK\n");
    assert_eq!(ctl.ok(&["put", &lease_flag, "k2", "v2"]).await, "OK\n");
    assert_eq!(c.get("k1", None).await.unwrap().kvs()[0].lease(), id);
    let err = ctl.fail(&["put", "--lease=1234", "k3", "v3"]).await;
    assert!(
        err.ends_with("Error: etcdserver: requested lease not found\n"),
        "{err}"
    );

    // timetolive
    let id_hex = hex(id);
    let out = ctl.ok(&["lease", "timetolive", &id_hex]).await;
    let prefix = format!("lease {id_hex} granted with TTL(60s), remaining(");
    let rest = out
        .strip_prefix(&prefix)
        .unwrap_or_else(|| panic!("{out:?}"));
    let remaining: i64 = rest
        .strip_suffix("s)\n")
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("{out:?}"));
    assert!((58..=59).contains(&remaining), "{out:?}");
    let out = ctl.ok(&["lease", "timetolive", "--keys", &id_hex]).await;
    // etcd lists keys in no particular order; the remaining time may tick down meanwhile.
    let accepted: Vec<String> = [remaining, remaining - 1]
        .iter()
        .flat_map(|r| {
            ["k1 k2", "k2 k1"].map(|order| {
                format!(
                    "lease {id_hex} granted with TTL(60s), remaining({r}s), attached keys([{order}])\n"
                )
            })
        })
        .collect();
    assert!(accepted.contains(&out), "{out:?}");
    assert_eq!(
        ctl.ok(&["lease", "timetolive", "1234"]).await,
        "lease 0000000000001234 already expired\n"
    );
    let (cluster, member, rev, term) = header_json(&mut c).await;
    let v = parse_json(&ctl.ok(&["lease", "timetolive", "1234", "-w", "json"]).await);
    assert_eq!(
        v,
        json!({"cluster_id": cluster, "member_id": member, "revision": rev, "raft_term": term,
               "id": 0x1234, "ttl": -1, "granted-ttl": 0, "keys": null})
    );
    let v = parse_json(
        &ctl.ok(&["lease", "timetolive", "--keys", &id_hex, "-w", "json"])
            .await,
    );
    let mut listed: Vec<&str> = v["keys"]
        .as_array()
        .expect("keys")
        .iter()
        .map(|k| k.as_str().expect("base64 key"))
        .collect();
    listed.sort_unstable();
    // "k1", "k2" in base64.
    assert_eq!(listed, ["azE=", "azI="]);
    assert_eq!(v["granted-ttl"], json!(60));
    assert_eq!(v["id"], json!(id));
    let v = parse_json(
        &ctl.ok(&["lease", "timetolive", &id_hex, "-w", "json"])
            .await,
    );
    assert_eq!(v["keys"], Value::Null);

    // keep-alive --once, and the streaming form on a lease that does not exist.
    assert_eq!(
        ctl.ok(&["lease", "keep-alive", "--once", &id_hex]).await,
        format!("lease {id_hex} keepalived with TTL(60)\n")
    );
    let (cluster, member, rev, term) = header_json(&mut c).await;
    let v = parse_json(
        &ctl.ok(&["lease", "keep-alive", "--once", &id_hex, "-w", "json"])
            .await,
    );
    assert_eq!(
        v,
        json!({"cluster_id": cluster, "member_id": member, "revision": rev,
               "raft_term": term, "ID": id, "TTL": 60})
    );
    let out = ctl
        .run(&["lease", "keep-alive", "--once", "1234"])
        .await
        .expect("etcdctl runs");
    assert_eq!(out.code(), Some(2), "{out:?}");
    assert_eq!(out.stdout, "");
    assert_eq!(out.stderr, "Error: etcdserver: requested lease not found\n");
    assert_eq!(
        ctl.ok(&["lease", "keep-alive", "1234"]).await,
        "lease 0000000000001234 expired or revoked.\n"
    );

    // list: soonest expiry first.
    let ids = lease_ids(&mut c).await;
    assert_eq!(ids, [id, json_id]);
    let mut expected = format!("found {} leases\n", ids.len());
    for lease in &ids {
        expected.push_str(&hex(*lease));
        expected.push('\n');
    }
    assert_eq!(ctl.ok(&["lease", "list"]).await, expected);
    let (cluster, member, rev, term) = header_json(&mut c).await;
    let v = parse_json(&ctl.ok(&["lease", "list", "-w", "json"]).await);
    let listed: Vec<Value> = ids.iter().map(|id| json!({ "id": id })).collect();
    assert_eq!(
        v,
        json!({"cluster_id": cluster, "member_id": member, "revision": rev,
               "raft_term": term, "leases": listed})
    );

    // revoke
    assert_eq!(
        ctl.ok(&["lease", "revoke", &id_hex]).await,
        format!("lease {id_hex} revoked\n")
    );
    assert_eq!(keys_under(&mut c, "k").await, Vec::<String>::new());
    let err = ctl.fail(&["lease", "revoke", &id_hex]).await;
    assert!(
        err.ends_with("Error: failed to revoke lease (etcdserver: requested lease not found)\n"),
        "{err}"
    );
    let (cluster, member, rev, term) = header_json(&mut c).await;
    let v = parse_json(
        &ctl.ok(&["lease", "revoke", &hex(json_id), "-w", "json"])
            .await,
    );
    assert_eq!(
        v,
        json!({"header": {"cluster_id": cluster, "member_id": member, "revision": rev,
               "raft_term": term}})
    );
}

#[tokio::test]
async fn etcdctl_keep_alive_streams_until_revoked() {
    let (m, mut c) = start().await;
    let ctl = m.etcdctl();
    let id = c.lease_grant(6, None).await.unwrap().id();
    // etcdctl renews every TTL / 3, so a short TTL makes it notice the revocation soon. Wait
    // until the time left reads 4 s, so that a renewal (back to 5 s) is visible.
    poll_until(Duration::from_secs(5), || {
        let mut c = c.clone();
        async move {
            let (ttl, _) = ttl_of(&mut c, id).await;
            if ttl <= 4 {
                Ok(())
            } else {
                Err(format!("ttl {ttl}"))
            }
        }
    })
    .await
    .expect("lease ticks down");

    let id_hex = hex(id);
    let running = {
        let ctl = ctl.clone();
        let id_hex = id_hex.clone();
        tokio::spawn(async move { ctl.run(&["lease", "keep-alive", &id_hex]).await })
    };
    // etcdctl renews at once: the time left goes back up.
    poll_until(Duration::from_secs(10), || {
        let mut c = c.clone();
        async move {
            let (ttl, _) = ttl_of(&mut c, id).await;
            if ttl >= 5 {
                Ok(())
            } else {
                Err(format!("ttl {ttl}"))
            }
        }
    })
    .await
    .expect("etcdctl keeps the lease alive");
    c.lease_revoke(id).await.unwrap();

    let out = running.await.expect("join").expect("etcdctl runs");
    assert!(out.success(), "{out:?}");
    let lines: Vec<&str> = out.stdout.lines().collect();
    let (last, kept) = lines.split_last().expect("output");
    assert_eq!(*last, format!("lease {id_hex} expired or revoked."));
    assert!(!kept.is_empty(), "{out:?}");
    for line in kept {
        assert_eq!(*line, format!("lease {id_hex} keepalived with TTL(6)"));
    }
}

/// The TTL `m` reports for `lease` (a linearizable TimeToLive through `m`).
async fn ttl_through(m: &etcdrs_testkit::Member, lease: i64) -> anyhow::Result<i64> {
    let mut client = m.client().await?;
    Ok(client.lease_time_to_live(lease, None).await?.ttl())
}

/// A 3-member cluster loses its leader 4 s into a 60 s lease: what the new leader reports.
async fn ttl_after_leader_loss(args: &[&str]) -> (i64, String) {
    let mut opts = etcdrs_testkit::ClusterOpts::new(&crate::bin())
        .env("ETCDRS_LEASE_CHECKPOINT_INTERVAL", "200ms");
    for arg in args {
        opts = opts.arg(*arg);
    }
    let mut c = etcdrs_testkit::Cluster::start(3, opts)
        .await
        .expect("cluster starts");
    let leader = c.leader().await.expect("leader");
    let mut client = c.member(leader).client().await.expect("client");
    let lease = client.lease_grant(60, None).await.expect("grant").id();
    let granted = Instant::now();
    poll_until(Duration::from_secs(20), || async {
        anyhow::ensure!(
            granted.elapsed() >= Duration::from_secs(4),
            "4 s not yet passed"
        );
        Ok(())
    })
    .await
    .expect("time passes");
    c.kill9(leader).expect("kill the leader");
    let survivor = (leader + 1) % 3;
    let ttl = poll_until(Duration::from_secs(20), || async {
        ttl_through(c.member(survivor), lease).await
    })
    .await
    .expect("the new leader answers");
    (ttl, c.log_tails())
}

/// `--experimental-enable-lease-checkpoint`: the leader checkpoints each lease's remaining TTL
/// through raft, so a new leader restarts it from what was left instead of the full TTL (ours:
/// etcd checkpoints every 5 minutes and no flag shortens that; the test sets 200ms through
/// `ETCDRS_LEASE_CHECKPOINT_INTERVAL`).
#[tokio::test]
async fn checkpointed_leases_keep_their_remaining_ttl_across_a_leader_change() {
    if !crate::ours() {
        return;
    }
    let (with, logs) = ttl_after_leader_loss(&["--experimental-enable-lease-checkpoint"]).await;
    assert!(
        with <= 57,
        "the checkpointed lease restarted at {with}s\n{logs}"
    );
    let (without, logs) = ttl_after_leader_loss(&[]).await;
    assert!(
        without >= 59,
        "without checkpoints the lease restarts in full: {without}s\n{logs}"
    );
}

/// A single member restarted 4 s into a 60 s lease: the TTL it then reports.
async fn ttl_after_restart(args: &[&str]) -> i64 {
    let mut opts = crate::opts().env("ETCDRS_LEASE_CHECKPOINT_INTERVAL", "200ms");
    for arg in args {
        opts = opts.arg(*arg);
    }
    let mut m = etcdrs_testkit::Member::start(opts)
        .await
        .expect("member starts");
    let mut client = m.client().await.expect("client");
    let lease = client.lease_grant(60, None).await.expect("grant").id();
    let granted = Instant::now();
    poll_until(Duration::from_secs(20), || async {
        anyhow::ensure!(
            granted.elapsed() >= Duration::from_secs(4),
            "4 s not yet passed"
        );
        Ok(())
    })
    .await
    .expect("time passes");
    m.restart().await.expect("restart");
    poll_until(Duration::from_secs(20), || async {
        ttl_through(&m, lease).await
    })
    .await
    .expect("the restarted member answers")
}

/// `--experimental-enable-lease-checkpoint-persist`: the checkpointed remainder is kept in
/// the backend, so a restarted member goes on from it; without it, the lease restarts in full.
#[tokio::test]
async fn persisted_checkpoints_survive_a_restart() {
    if !crate::ours() {
        return; // etcd 3.5 flag.
    }
    let with = ttl_after_restart(&[
        "--experimental-enable-lease-checkpoint",
        "--experimental-enable-lease-checkpoint-persist",
    ])
    .await;
    assert!(with <= 57, "the persisted checkpoint was lost: {with}s");
    let without = ttl_after_restart(&["--experimental-enable-lease-checkpoint"]).await;
    assert!(
        without >= 59,
        "without persistence the lease restarts in full: {without}s"
    );
}
