//! Cached serializable ranges as clients see them: the proxy runs in-process (with a namespace)
//! in front of a real etcd 3.4 member, and raw tonic clients read through it.
//! Hits come from the listener's fast path (encoded responses); they must carry the namespace
//! stripped, follow writes made around the proxy, and never answer one identity with what
//! another may read. (With auth enabled the cache's own watch, which has no credentials, is
//! refused, so the cache stays bypassed; the identity test holds either way.)

use std::time::Duration;

use etcdrs_proto::etcdserverpb::auth_client::AuthClient;
use etcdrs_proto::etcdserverpb::kv_client::KvClient;
use etcdrs_proto::etcdserverpb::{AuthenticateRequest, RangeRequest, RangeResponse};
use etcdrs_testkit::{EtcdBin, Etcdctl, Member, MemberOpts, poll_until};
use tonic::transport::Channel;
use tonic::{Code, Request};

mod common;
use common::InProcessProxy;

/// A serializable range of `key` through `channel`, as `token` when given.
async fn read(
    channel: &Channel,
    token: Option<&str>,
    key: &[u8],
    range_end: &[u8],
) -> Result<RangeResponse, tonic::Status> {
    let mut request = Request::new(RangeRequest {
        key: key.to_vec(),
        range_end: range_end.to_vec(),
        serializable: true,
        ..Default::default()
    });
    if let Some(token) = token {
        request
            .metadata_mut()
            .insert("token", token.parse().expect("ascii token"));
    }
    KvClient::new(channel.clone())
        .range(request)
        .await
        .map(|r| r.into_inner())
}

fn pairs(resp: &RangeResponse) -> Vec<(String, String)> {
    resp.kvs
        .iter()
        .map(|kv| {
            (
                String::from_utf8_lossy(&kv.key).into_owned(),
                String::from_utf8_lossy(&kv.value).into_owned(),
            )
        })
        .collect()
}

async fn token(channel: &Channel, name: &str, password: &str) -> String {
    AuthClient::new(channel.clone())
        .authenticate(AuthenticateRequest {
            name: name.to_owned(),
            password: password.to_owned(),
        })
        .await
        .expect("authenticate")
        .into_inner()
        .token
}

async fn cache_hits(addr: std::net::SocketAddr) -> f64 {
    let body = etcdrs_testkit::http_get(&addr.to_string(), "/proxy/metrics")
        .await
        .expect("metrics")
        .body;
    body.lines()
        .find_map(|l| l.strip_prefix("etcd_grpc_proxy_cache_hits_total "))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(-1.0)
}

#[tokio::test]
async fn hits_are_namespaced_and_fresh() {
    let member = Member::start(MemberOpts::new(&EtcdBin::at("/usr/bin/etcd")))
        .await
        .expect("etcd 3.4 member");
    let ctl = Etcdctl::new(member.endpoint());
    for (k, v) in [("ns/a", "1"), ("ns/b", "2"), ("outside", "x")] {
        assert!(ctl.run(&["put", k, v]).await.expect("put").success());
    }
    let proxy = InProcessProxy::start(&member, "ns/").await;
    let (addr, channel) = (proxy.addr, proxy.channel.clone());

    // The first read fills the cache (once its watch stands), the next are hits, all with the
    // namespace stripped and nothing from outside it.
    let want = vec![
        ("a".to_owned(), "1".to_owned()),
        ("b".to_owned(), "2".to_owned()),
    ];
    poll_until(Duration::from_secs(5), || async {
        let before = cache_hits(addr).await;
        for _ in 0..2 {
            let got = read(&channel, None, b"a", b"\0").await?;
            assert_eq!(pairs(&got), want);
        }
        if cache_hits(addr).await > before {
            Ok(())
        } else {
            Err(anyhow::anyhow!("no cache hit yet"))
        }
    })
    .await
    .expect("the range is served from the cache");
    // A different request is a different entry.
    let got = read(&channel, None, b"b", b"").await.expect("b");
    assert_eq!(pairs(&got), [("b".to_owned(), "2".to_owned())]);

    // A write around the proxy reaches the cached range promptly.
    assert!(
        ctl.run(&["put", "ns/a", "changed"])
            .await
            .expect("put")
            .success()
    );
    poll_until(Duration::from_secs(2), || async {
        let got = read(&channel, None, b"a", b"\0").await?;
        if pairs(&got)[0].1 == "changed" {
            Ok(())
        } else {
            Err(anyhow::anyhow!("stale: {:?}", pairs(&got)))
        }
    })
    .await
    .expect("fresh after a direct write");

    // Requests the cache never answers still get etcd's errors.
    let empty = read(&channel, None, b"", b"").await;
    assert_eq!(
        empty.map_err(|s| (s.code(), s.message().to_owned())).err(),
        Some((
            Code::InvalidArgument,
            "etcdserver: key is not provided".to_owned()
        ))
    );

    proxy.stop().await;
}

#[tokio::test]
async fn one_identity_never_gets_anothers_answer() {
    let member = Member::start(MemberOpts::new(&EtcdBin::at("/usr/bin/etcd")))
        .await
        .expect("etcd 3.4 member");
    let ctl = Etcdctl::new(member.endpoint());
    for (k, v) in [("ns/a", "1"), ("ns/b", "2")] {
        assert!(ctl.run(&["put", k, v]).await.expect("put").success());
    }
    for args in [
        &["user", "add", "root:rootpw", "--interactive=false"][..],
        &["user", "grant-role", "root", "root"],
        &["user", "add", "alice:alicepw", "--interactive=false"],
        &["role", "add", "reader"],
        &["role", "grant-permission", "reader", "read", "ns/b"],
        &["user", "grant-role", "alice", "reader"],
        &["auth", "enable"],
    ] {
        let out = ctl.run(args).await.expect("etcdctl");
        assert!(out.success(), "etcdctl {args:?}: {out:?}");
    }
    let proxy = InProcessProxy::start(&member, "ns/").await;
    let channel = proxy.channel.clone();
    let root = token(&channel, "root", "rootpw").await;
    let alice = token(&channel, "alice", "alicepw").await;

    for _ in 0..3 {
        let got = read(&channel, Some(&root), b"a", b"\0")
            .await
            .expect("root");
        assert_eq!(pairs(&got).len(), 2);
    }
    // Alice may read ns/b only: root's answer to the same request is not hers.
    for _ in 0..2 {
        let denied = read(&channel, Some(&alice), b"a", b"\0").await;
        assert_eq!(
            denied.map(|r| pairs(&r)).map_err(|s| s.code()),
            Err(Code::PermissionDenied)
        );
        let got = read(&channel, Some(&alice), b"b", b"").await.expect("b");
        assert_eq!(pairs(&got), [("b".to_owned(), "2".to_owned())]);
    }
    // No token: refused, whatever root read before.
    let anonymous = read(&channel, None, b"b", b"").await;
    assert!(anonymous.is_err(), "anonymous read: {anonymous:?}");

    proxy.stop().await;
}
