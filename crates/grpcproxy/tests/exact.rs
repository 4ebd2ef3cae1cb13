//! The watch opt-out of coalescing (`etcdrs-watch-exact: true` metadata), which stock clients
//! cannot send: the proxy runs in-process in front of a real etcd 3.4 member, and a raw tonic
//! client sets the metadata. The cluster's own watcher count shows who shares a watcher.

use std::time::Duration;

use etcdrs_proto::etcdserverpb::kv_client::KvClient;
use etcdrs_proto::etcdserverpb::watch_client::WatchClient;
use etcdrs_proto::etcdserverpb::{
    PutRequest, WatchCreateRequest, WatchRequest, WatchResponse, watch_request,
};
use etcdrs_testkit::{EtcdBin, Member, MemberOpts, poll_until};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::Request;
use tonic::transport::Channel;

mod common;
use common::InProcessProxy;

fn create(key: &str) -> WatchRequest {
    WatchRequest {
        request_union: Some(watch_request::RequestUnion::CreateRequest(
            WatchCreateRequest {
                key: key.as_bytes().to_vec(),
                ..Default::default()
            },
        )),
    }
}

async fn watchers(member: &Member) -> f64 {
    let body = member.http_get("/metrics").await.expect("metrics").body;
    body.lines()
        .find_map(|l| l.strip_prefix("etcd_debugging_mvcc_watcher_total "))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(-1.0)
}

/// A watch stream on the proxy; `exact` sets the opt-out metadata.
async fn open(
    channel: Channel,
    exact: bool,
) -> (mpsc::Sender<WatchRequest>, tonic::Streaming<WatchResponse>) {
    let (tx, rx) = mpsc::channel(16);
    let mut request = Request::new(ReceiverStream::new(rx));
    if exact {
        request
            .metadata_mut()
            .insert("etcdrs-watch-exact", "true".parse().expect("ascii"));
    }
    let stream = WatchClient::new(channel)
        .watch(request)
        .await
        .expect("watch")
        .into_inner();
    (tx, stream)
}

async fn next(stream: &mut tonic::Streaming<WatchResponse>) -> WatchResponse {
    tokio::time::timeout(Duration::from_secs(5), stream.message())
        .await
        .expect("in time")
        .expect("ok")
        .expect("open")
}

/// Watchers the proxy holds on the cluster for itself (the cache's and the leader monitor's).
const OWN: f64 = 2.0;

#[tokio::test]
async fn exact_watchers_get_their_own_cluster_watcher() {
    let member = Member::start(MemberOpts::new(&EtcdBin::at("/usr/bin/etcd")))
        .await
        .expect("etcd 3.4 member");
    let proxy = InProcessProxy::start(&member, "").await;
    let channel = proxy.channel.clone();
    // The proxy's own watches first: the cache's and the leader monitor's.
    poll_until(Duration::from_secs(5), || async {
        let n = watchers(&member).await;
        if n == OWN {
            Ok(())
        } else {
            Err(format!("{n}"))
        }
    })
    .await
    .expect("cache watcher");

    // Two coalesced watchers of "x": one more cluster watcher.
    let (shared_tx, mut shared) = open(channel.clone(), false).await;
    for _ in 0..2 {
        shared_tx.send(create("x")).await.expect("send");
        assert!(next(&mut shared).await.created);
    }
    assert_eq!(watchers(&member).await, OWN + 1.0);

    // Two exact watchers of "x": one cluster watcher each, created at the cluster's revision.
    let mut kv = KvClient::new(channel.clone());
    let put = kv
        .put(PutRequest {
            key: b"y".to_vec(),
            value: b"1".to_vec().into(),
            ..Default::default()
        })
        .await
        .expect("put")
        .into_inner();
    let revision = put.header.expect("header").revision;
    let (exact_tx, mut exact) = open(channel.clone(), true).await;
    for _ in 0..2 {
        exact_tx.send(create("x")).await.expect("send");
        let created = next(&mut exact).await;
        assert!(created.created);
        assert_eq!(created.header.expect("header").revision, revision);
    }
    assert_eq!(watchers(&member).await, OWN + 3.0);

    // Everybody gets the event, with the proxy's watch ids.
    kv.put(PutRequest {
        key: b"x".to_vec(),
        value: b"v".to_vec().into(),
        ..Default::default()
    })
    .await
    .expect("put");
    for stream in [&mut shared, &mut exact] {
        let mut ids = Vec::new();
        while ids.len() < 2 {
            let resp = next(stream).await;
            assert_eq!(resp.events.len(), 1);
            ids.push(resp.watch_id);
        }
        ids.sort_unstable();
        assert_eq!(ids, [0, 1]);
    }
    drop((shared_tx, shared, exact_tx, exact));
    proxy.stop().await;
}
