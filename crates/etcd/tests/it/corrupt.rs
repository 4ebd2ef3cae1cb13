//! The corruption checks (`--experimental-initial-corrupt-check`,
//! `--experimental-corrupt-check-time`) on a member whose data was altered on disk: one stored
//! value of a follower is rewritten in its backend while it is stopped, as a bad disk or a
//! buggy tool would. Ours only for the alteration (etcd 3.4's bbolt file is not ours to edit);
//! a cluster whose data agrees starts with the check on both.

use std::time::Duration;

use etcdrs_testkit::{Cluster, ClusterOpts, poll_until};
use prost::Message;

use crate::bin;

const WAIT: Duration = Duration::from_secs(20);

/// Rewrites the value of the first key in `data_dir`'s backend, leaving its revisions alone.
pub(crate) fn alter_a_value(data_dir: &std::path::Path) {
    let path = data_dir.join("member").join("snap").join("db");
    let backend = etcdrs_backend::Backend::open(&path).expect("open the stopped member's backend");
    let mut first = None;
    backend
        .read()
        .expect("read")
        .for_each_in(etcdrs_backend::Bucket::KEY, &[], None, |k, v| {
            first = Some((k.to_vec(), v.to_vec()));
            false
        })
        .expect("scan");
    let (key, value) = first.expect("a stored revision");
    let mut kv = etcdrs_proto::mvccpb::KeyValue::decode(value.as_slice()).expect("a KeyValue");
    kv.value = b"altered on disk".to_vec();
    let tx = backend.write().expect("write");
    tx.put(etcdrs_backend::Bucket::KEY, &key, &kv.encode_to_vec())
        .expect("put");
    tx.commit(true).expect("commit");
}

async fn three_members(args: &[&str]) -> Cluster {
    let mut opts = ClusterOpts::new(&bin());
    for arg in args {
        opts = opts.arg(*arg);
    }
    let c = Cluster::start(3, opts).await.expect("cluster starts");
    let mut client = c.client().await.expect("client");
    for i in 0..10 {
        client.put(format!("k{i}"), "v", None).await.expect("put");
    }
    c
}

/// With the initial check, a member whose data differs from its peers' refuses to start, in
/// etcd's words; the others, and a member whose data agrees, start.
#[tokio::test]
async fn initial_check_refuses_a_member_whose_data_differs() {
    let mut c = three_members(&["--experimental-initial-corrupt-check"]).await;
    let follower = (c.leader().await.expect("leader") + 1) % 3;
    c.restart(follower)
        .await
        .expect("a member whose data agrees restarts with the check");
    if !crate::ours() {
        return;
    }
    c.member_mut(follower).stop().await.expect("stop");
    alter_a_value(c.member(follower).data_dir());
    let m = c.member_mut(follower);
    let refused = m.restart().await;
    assert!(refused.is_err(), "the altered member started");
    let status = m.wait_exit(WAIT).await.expect("it exits");
    assert!(!status.success());
    assert!(
        m.log_contains("found data inconsistency with peers")
            && m.log_contains("found different hash values from remote peer"),
        "{}",
        m.log_tail(20)
    );
}

/// With the periodic check, the leader finds a follower whose data differs, raises the CORRUPT
/// alarm for it, and the cluster then refuses writes with etcd's error.
#[tokio::test]
async fn periodic_check_raises_the_corrupt_alarm() {
    if !crate::ours() {
        return;
    }
    let mut c = three_members(&["--experimental-corrupt-check-time", "500ms"]).await;
    let follower = (c.leader().await.expect("leader") + 1) % 3;
    c.member_mut(follower).stop().await.expect("stop");
    alter_a_value(c.member(follower).data_dir());
    // It restarts without the initial check. The leader's periodic check may raise the alarm
    // before the member counts as healthy (its `/health` then names the alarm): either way
    // it is back and serving.
    if let Err(e) = c.restart(follower).await {
        let e = format!("{e:#}");
        assert!(e.contains("ALARM CORRUPT"), "restart: {e}");
    }
    let ctl = c.etcdctl();
    let follower_id = {
        let mut client = c.member(follower).client().await.expect("client");
        client
            .status()
            .await
            .expect("status")
            .header()
            .expect("header")
            .member_id()
    };
    // Polled through failures too: a loaded machine may see an election while the member
    // rejoins.
    let listed = poll_until(WAIT, || async {
        let out = ctl.run(&["alarm", "list"]).await?;
        anyhow::ensure!(out.stdout.contains("alarm:CORRUPT"), "alarms: {out:?}");
        Ok(out.stdout)
    })
    .await
    .unwrap_or_else(|e| panic!("{e:#}\n{}", c.log_tails()));
    assert_eq!(listed, format!("memberID:{follower_id} alarm:CORRUPT \n"));
    let client = c.client().await.expect("client");
    let refused = poll_until(WAIT, || {
        let mut client = client.clone();
        async move {
            match client.put("after", "v", None).await {
                Ok(_) => Ok(Err("a write was applied under the CORRUPT alarm".to_owned())),
                Err(e) if e.to_string().contains("etcdserver: corrupt cluster") => Ok(Ok(())),
                // Transient (an election under load): asked again.
                Err(e) => Err(anyhow::anyhow!("{e}")),
            }
        }
    })
    .await
    .expect("the write is answered");
    assert_eq!(refused, Ok(()));
}
