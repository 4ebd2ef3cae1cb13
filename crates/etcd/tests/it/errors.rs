//! Request errors: exact gRPC codes and messages, and the store unchanged after each error.

use std::time::Duration;

use etcd_client::{
    AlarmAction, AlarmOptions, AlarmType, Client, CompactionOptions, Compare, CompareOp,
    DeleteOptions, GetOptions, Txn, TxnOp,
};
use etcdrs_testkit::{Code, assert_grpc_error, grpc_error, poll_until};

use crate::{dump, revision, start, start_with};

const NO_KEY: &str = "etcdserver: key is not provided";
const TOO_LARGE: &str = "etcdserver: request is too large";
const NO_SPACE: &str = "etcdserver: mvcc: database space exceeded";

#[tokio::test]
async fn empty_key_is_rejected() {
    let (_m, mut c) = start().await;
    c.put("k", "v", None).await.unwrap();

    assert_grpc_error(c.put("", "v", None).await, Code::InvalidArgument, NO_KEY);
    assert_grpc_error(c.get("", None).await, Code::InvalidArgument, NO_KEY);
    assert_grpc_error(
        c.get("", Some(GetOptions::new().with_range("z"))).await,
        Code::InvalidArgument,
        NO_KEY,
    );
    assert_grpc_error(c.delete("", None).await, Code::InvalidArgument, NO_KEY);
    assert_grpc_error(
        c.delete("", Some(DeleteOptions::new().with_range("z")))
            .await,
        Code::InvalidArgument,
        NO_KEY,
    );
    // The same checks apply to ops inside a txn.
    assert_grpc_error(
        c.txn(Txn::new().and_then([TxnOp::put("", "v", None)]))
            .await,
        Code::InvalidArgument,
        NO_KEY,
    );
    assert_grpc_error(
        c.txn(Txn::new().or_else([TxnOp::get("", None)])).await,
        Code::InvalidArgument,
        NO_KEY,
    );
    assert_grpc_error(
        c.txn(Txn::new().and_then([TxnOp::delete("", None)])).await,
        Code::InvalidArgument,
        NO_KEY,
    );
    assert_grpc_error(
        c.txn(Txn::new().when([Compare::version("", CompareOp::Equal, 0)]))
            .await,
        Code::InvalidArgument,
        NO_KEY,
    );
    // Inside a nested txn too.
    assert_grpc_error(
        c.txn(Txn::new().and_then([TxnOp::txn(Txn::new().and_then([TxnOp::put("", "v", None)]))]))
            .await,
        Code::InvalidArgument,
        NO_KEY,
    );

    assert_eq!(revision(&mut c).await, 2);
    assert_eq!(dump(&mut c).await, [("k".into(), "v".into())]);
}

#[tokio::test]
async fn request_too_large() {
    // etcd lets gRPC accept max-request-bytes + 512 KiB (grpcOverheadBytes); requests between
    // the two limits get etcd's own error, larger ones gRPC's.
    let (_m, mut c) = start_with(&["--max-request-bytes", "1024"]).await;
    c.put("k", vec![b'a'; 500], None).await.unwrap();

    assert_grpc_error(
        c.put("k", vec![b'b'; 2000], None).await,
        Code::InvalidArgument,
        TOO_LARGE,
    );
    assert_grpc_error(
        c.txn(Txn::new().and_then([
            TxnOp::put("t1", vec![b'c'; 600], None),
            TxnOp::put("t2", vec![b'c'; 600], None),
        ]))
        .await,
        Code::InvalidArgument,
        TOO_LARGE,
    );
    let huge = c.put("k", vec![b'd'; 1024 + 512 * 1024 + 100], None).await;
    let (code, msg) = grpc_error(huge.as_ref().unwrap_err()).expect("gRPC status");
    assert_eq!(code, Code::ResourceExhausted);
    assert!(
        msg.starts_with("grpc: received message larger than max (")
            && msg.ends_with(&format!(" vs. {})", 1024 + 512 * 1024)),
        "{msg}"
    );

    // Reads of any size are unaffected, and nothing was written.
    assert_eq!(revision(&mut c).await, 2);
    let r = c.get("k", None).await.unwrap();
    assert_eq!(r.kvs()[0].value(), vec![b'a'; 500].as_slice());
    assert_eq!(dump(&mut c).await.len(), 1);
}

async fn alarms(c: &mut Client) -> Vec<(u64, AlarmType)> {
    c.alarm(AlarmAction::Get, AlarmType::None, None)
        .await
        .expect("alarm list")
        .alarms()
        .iter()
        .map(|a| (a.member_id(), a.alarm()))
        .collect()
}

#[tokio::test]
async fn quota_exceeded_raises_nospace() {
    let (m, mut c) = start_with(&["--quota-backend-bytes", "262144"]).await;
    let member_id = c.status().await.unwrap().header().unwrap().member_id();
    assert!(alarms(&mut c).await.is_empty());

    // Write 16 KiB values until the quota refuses one. The backend size only grows when the
    // backend commits, so how many writes fit is not exact.
    let value = vec![b'q'; 16 * 1024];
    let mut written = 0u32;
    let first_err = loop {
        match c
            .put(format!("big/{written:04}"), value.clone(), None)
            .await
        {
            Ok(_) => written += 1,
            Err(e) => break e,
        }
        assert!(written < 500, "quota never hit");
    };
    assert!(written >= 5, "only {written} writes fit in 256 KiB");
    assert_eq!(
        grpc_error(&first_err),
        Some((Code::ResourceExhausted, NO_SPACE.to_owned()))
    );

    // The alarm is raised for this member and is visible over gRPC and etcdctl.
    assert_eq!(alarms(&mut c).await, [(member_id, AlarmType::Nospace)]);
    let out = m.etcdctl().ok(&["alarm", "list"]).await;
    // etcdctl prints the proto's text form, which ends with a space.
    assert_eq!(out, format!("memberID:{member_id} alarm:NOSPACE \n"));

    // With the alarm active every write with a put is refused, even a small one...
    let rev = revision(&mut c).await;
    assert_eq!(rev, i64::from(written) + 1);
    assert_grpc_error(
        c.put("small", "x", None).await,
        Code::ResourceExhausted,
        NO_SPACE,
    );
    assert_grpc_error(
        c.txn(Txn::new().and_then([TxnOp::put("small", "x", None)]))
            .await,
        Code::ResourceExhausted,
        NO_SPACE,
    );
    assert_eq!(revision(&mut c).await, rev);
    let r = c
        .get(
            "big/",
            Some(GetOptions::new().with_prefix().with_count_only()),
        )
        .await
        .unwrap();
    assert_eq!(r.count(), i64::from(written));
    assert_eq!(c.get("small", None).await.unwrap().count(), 0);

    // ...and /health reports unhealthy. etcd 3.4: {"health":"false"};
    // etcd 3.5 (our target): {"health":"false","reason":"ALARM NOSPACE"}.
    let h = m.http_get("/health").await.unwrap();
    assert_eq!(h.status, 503, "{h:?}");
    let body = h.json().unwrap();
    assert_eq!(body["health"], "false");
    if let Some(reason) = body.get("reason") {
        assert_eq!(reason, "ALARM NOSPACE");
    }

    // Reads, deletes, compaction and defragmentation still work, and disarming the alarm
    // re-enables writes once there is space again.
    let d = c
        .delete("big/", Some(DeleteOptions::new().with_prefix()))
        .await
        .unwrap();
    assert_eq!(d.deleted(), i64::from(written));
    assert_eq!(d.header().unwrap().revision(), rev + 1);
    c.compact(rev + 1, Some(CompactionOptions::new().with_physical()))
        .await
        .unwrap();
    c.defragment().await.unwrap();
    assert_eq!(alarms(&mut c).await, [(member_id, AlarmType::Nospace)]);
    let mut disarm = AlarmOptions::new();
    disarm.with_member(member_id);
    let resp = c
        .alarm(AlarmAction::Deactivate, AlarmType::Nospace, Some(disarm))
        .await
        .unwrap();
    assert_eq!(
        resp.alarms().len(),
        1,
        "deactivate returns the disarmed alarm"
    );
    assert!(alarms(&mut c).await.is_empty());
    let p = c.put("after", "ok", None).await.unwrap();
    assert_eq!(p.header().unwrap().revision(), rev + 2);
    poll_until(Duration::from_secs(5), || async {
        let h = m.http_get("/health").await?;
        anyhow::ensure!(h.status == 200, "health {} {}", h.status, h.body);
        anyhow::Ok(())
    })
    .await
    .unwrap();
}
