//! The peer port as etcd's rafthttp speaks it, compared with etcd 3.4 (`/usr/bin/etcd`) run
//! side by side: the same status codes, headers and bodies for `/members`, `/version`,
//! `/raft/probing` and the refusals of `/raft/stream/...` and `/raft`; and, against a peer
//! that must not be trusted, snapshot uploads only from members and within a bound of the
//! backend quota, a refused upload leaving no file.

use etcdrs_testkit::{EtcdBin, HttpResponse, Member, MemberOpts, http_request};
use serde_json::Value;

use crate::{ours, start_with};

/// etcd 3.4, the reference.
fn etcd34() -> EtcdBin {
    EtcdBin::at("/usr/bin/etcd")
}

/// Our server, whatever `ETCDRS_TEST_ETCD_BIN` says.
fn etcdrs() -> EtcdBin {
    EtcdBin::at(env!("CARGO_BIN_EXE_etcd"))
}

/// A raft `MsgSnapshot` for index 100 (eraftpb and etcd's raftpb share the numbers).
const SNAPSHOT_MESSAGE: [u8; 8] = [0x08, 0x07, 0x4A, 0x04, 0x12, 0x02, 0x10, 0x64];

/// (cluster id, member id) in etcd's hex.
async fn ids(m: &Member) -> (String, String) {
    let out = m.etcdctl().ok(&["endpoint", "status", "-w", "json"]).await;
    let json: Value = serde_json::from_str(&out).expect("status json");
    let header = &json[0]["Status"]["header"];
    (
        format!("{:x}", header["cluster_id"].as_u64().expect("cluster id")),
        format!("{:x}", header["member_id"].as_u64().expect("member id")),
    )
}

fn peer_addr(m: &Member) -> String {
    m.peer_url()
        .trim_start_matches("http://")
        .trim_end_matches('/')
        .to_owned()
}

async fn peer(
    m: &Member,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &[u8],
) -> HttpResponse {
    http_request(&peer_addr(m), method, path, headers, body)
        .await
        .unwrap_or_else(|e| panic!("{method} {path} on {}: {e:#}", m.name()))
}

/// Uploads a snapshot of `len` bytes to `m`'s peer port as member `from`; the answer.
async fn upload(m: &Member, cluster: &str, from: &str, len: usize) -> HttpResponse {
    upload_image(m, cluster, from, &vec![0; len], false).await
}

/// Uploads a snapshot whose image is `image` to `m`'s peer port as member `from`, saying it is
/// an etcd-rs leader's stream of pairs when `pairs`; the answer.
async fn upload_image(
    m: &Member,
    cluster: &str,
    from: &str,
    image: &[u8],
    pairs: bool,
) -> HttpResponse {
    let mut body = (SNAPSHOT_MESSAGE.len() as u64).to_be_bytes().to_vec();
    body.extend_from_slice(&SNAPSHOT_MESSAGE);
    body.extend_from_slice(image);
    let mut headers = vec![
        ("X-Etcd-Cluster-ID", cluster),
        ("X-Server-From", from),
        ("X-Server-Version", "3.4.23"),
        ("X-Min-Cluster-Version", "3.0.0"),
        ("Content-Type", "application/octet-stream"),
    ];
    if pairs {
        headers.push(("X-Etcd-Rs-Snapshot-Format", "pairs-1"));
    }
    peer(m, "POST", "/raft/snapshot", &headers, &body).await
}

/// No received-snapshot file is left in `m`'s snap directory.
fn no_partial_files(m: &Member) {
    let snap = m.data_dir().join("member/snap");
    let left: Vec<_> = std::fs::read_dir(&snap)
        .expect("snap dir")
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".snap.recv") || n.ends_with(".snap.from-leader"))
        .collect();
    assert!(left.is_empty(), "left behind: {left:?}");
}

#[tokio::test]
async fn snapshot_uploads_only_from_members_and_within_a_bound() {
    if !ours() {
        return;
    }
    let (m, mut client) = start_with(&["--quota-backend-bytes=1048576"]).await;
    let (cluster, member) = ids(&m).await;

    // Refused with 412, not 403: etcd's snapshot sender reads a 403 as its own removal.
    let stranger = upload(&m, &cluster, "1234", 1024).await;
    assert_eq!(stranger.status, 412, "{stranger:?}");
    assert_eq!(
        stranger.body,
        "etcdserver: snapshot from a member not in the cluster\n"
    );

    // Twice the 1 MiB quota is the bound; 3.5 MiB is refused part way.
    let huge = upload(&m, &cluster, &member, 7 * 512 * 1024).await;
    assert_eq!(huge.status, 413, "{huge:?}");
    assert!(
        huge.body.contains("snapshot larger than 2097152 bytes"),
        "{huge:?}"
    );
    no_partial_files(&m);
    // Ten more past the bound: the member's memory stays where the first left it.
    let pid = m.pid().expect("running");
    let before = etcdrs_testkit::memory::rss_bytes(pid).expect("rss");
    for _ in 0..10 {
        let refused = upload(&m, &cluster, &member, 7 * 512 * 1024).await;
        assert_eq!(refused.status, 413, "{refused:?}");
    }
    etcdrs_testkit::memory::assert_rss_flat(pid, before, 16 << 20, "ten 3.5 MiB uploads");
    no_partial_files(&m);

    // An etcd-rs leader's stream of pairs is held to the same bound, and one that is not
    // whole (a record the format does not have; a stream cut short) is refused, leaves no
    // file and installs nothing.
    // (Bucket `key`, then one pair of a 1-byte key and a 3.5 MiB value.)
    let mut stream = b"etcd-rs pairs 1\n\x01\x03key\x02".to_vec();
    stream.extend_from_slice(&1u32.to_le_bytes());
    stream.extend_from_slice(&(7 * 512 * 1024u32).to_le_bytes());
    stream.resize(stream.len() + 1 + 7 * 512 * 1024, 1);
    let huge = upload_image(&m, &cluster, &member, &stream, true).await;
    assert_eq!(huge.status, 413, "{huge:?}");
    let mut damaged = b"etcd-rs pairs 1\n".to_vec();
    damaged.extend_from_slice(&[9; 64]);
    let refused = upload_image(&m, &cluster, &member, &damaged, true).await;
    assert_eq!(refused.status, 500, "{refused:?}");
    assert!(
        refused.body.starts_with("failed to save KV snapshot (")
            && refused.body.contains("unknown record 9"),
        "{refused:?}"
    );
    let cut = upload_image(&m, &cluster, &member, b"etcd-rs pairs 1\n\x01\x03ke", true).await;
    assert_eq!(cut.status, 500, "{cut:?}");
    assert!(cut.body.contains("cut short"), "{cut:?}");
    no_partial_files(&m);
    client.put("still", "serving", None).await.expect("serving");
}

/// A single member of `bin` with fast timers.
async fn single(bin: &EtcdBin, name: &str) -> Member {
    Member::start(MemberOpts::new(bin).name(name).fast_timers())
        .await
        .expect("member starts")
}

/// The answer with what differs between two members (ids, URLs, versions, times) masked.
fn masked(r: &HttpResponse, subst: &[(&str, &str)]) -> (u16, Option<String>, String) {
    let mut body = r.body.clone();
    for (from, to) in subst {
        body = body.replace(from, to);
    }
    (r.status, r.header("Content-Type").map(str::to_owned), body)
}

#[tokio::test]
async fn peer_endpoints_answer_as_etcd_34s() {
    let (reference, under_test) = (etcd34(), etcdrs());
    // etcd 3.4 with zap, as 3.5 always logs: its hash handler logs its refusals through a zap
    // logger that capnslog (3.4's default) leaves nil, and the nil logger drops the connection.
    let etcd = Member::start(
        MemberOpts::new(&reference)
            .name("ref")
            .fast_timers()
            .arg("--logger=zap"),
    );
    let (etcd, ours_m) = tokio::join!(etcd, single(&under_test, "ours"));
    let etcd = etcd.expect("etcd 3.4 starts");
    let ((etcd_cluster, etcd_id), (our_cluster, our_id)) = tokio::join!(ids(&etcd), ids(&ours_m));

    // /members/hashkv: Go's JSON of HashKVResponse (3.5 adds hash_revision, which 3.4 lacks),
    // and its refusals.
    let headers = [("Content-Type", "application/json")];
    let a = peer(
        &etcd,
        "GET",
        "/members/hashkv",
        &headers,
        br#"{"revision":0}"#,
    )
    .await;
    let b = peer(
        &ours_m,
        "GET",
        "/members/hashkv",
        &headers,
        br#"{"revision":0}"#,
    )
    .await;
    assert_eq!((a.status, b.status), (200, 200), "{a:?} {b:?}");
    assert_eq!(a.header("Content-Type"), b.header("Content-Type"));
    assert_eq!(b.header("X-Etcd-Cluster-ID"), Some(our_cluster.as_str()));
    let mut our_keys = keys(&b);
    our_keys.retain(|k| k != "hash_revision");
    assert_eq!(keys(&a), our_keys, "{} vs {}", a.body, b.body);
    assert!(
        b.json().expect("json")["header"]["revision"].is_i64(),
        "{}",
        b.body
    );
    for (method, body) in [("GET", &b"not json"[..]), ("POST", &b"{}"[..])] {
        let a = peer(&etcd, method, "/members/hashkv", &headers, body).await;
        let b = peer(&ours_m, method, "/members/hashkv", &headers, body).await;
        assert_eq!(masked(&a, &[]), masked(&b, &[]), "{method}: {a:?} vs {b:?}");
        assert_eq!(a.header("Allow"), b.header("Allow"));
    }
    let a = peer(
        &etcd,
        "GET",
        "/members/hashkv",
        &headers,
        br#"{"revision":1000}"#,
    )
    .await;
    let b = peer(
        &ours_m,
        "GET",
        "/members/hashkv",
        &headers,
        br#"{"revision":1000}"#,
    )
    .await;
    assert_eq!(
        masked(&a, &[]),
        masked(&b, &[]),
        "future revision: {a:?} vs {b:?}"
    );

    // /members: Go's JSON of the member list, the cluster id in a header.
    let a = peer(&etcd, "GET", "/members", &[], b"").await;
    let b = peer(&ours_m, "GET", "/members", &[], b"").await;
    assert_eq!(a.header("X-Etcd-Cluster-ID"), Some(etcd_cluster.as_str()));
    assert_eq!(b.header("X-Etcd-Cluster-ID"), Some(our_cluster.as_str()));
    let shape = |r: &HttpResponse| -> Vec<Vec<String>> {
        let json: Value = r.json().expect("members json");
        json.as_array()
            .expect("array")
            .iter()
            .map(|m| {
                m.as_object()
                    .expect("object")
                    .keys()
                    .cloned()
                    .collect::<Vec<_>>()
            })
            .collect()
    };
    assert_eq!(shape(&a), shape(&b), "{} vs {}", a.body, b.body);
    assert!(a.json().expect("json")[0]["id"].is_u64(), "{}", a.body);
    assert!(b.json().expect("json")[0]["id"].is_u64(), "{}", b.body);
    assert_eq!(
        a.header("Content-Type"),
        b.header("Content-Type"),
        "{a:?} {b:?}"
    );
    assert!(b.body.ends_with("]\n"), "{:?}", b.body);
    let wrong = peer(&ours_m, "POST", "/members", &[], b"").await;
    let reference = peer(&etcd, "POST", "/members", &[], b"").await;
    assert_eq!(masked(&wrong, &[]), masked(&reference, &[]));
    assert_eq!(wrong.header("Allow"), reference.header("Allow"));

    // /version: the same keys (the versions differ by design).
    let a = peer(&etcd, "GET", "/version", &[], b"").await;
    let b = peer(&ours_m, "GET", "/version", &[], b"").await;
    assert_eq!(a.status, b.status);
    assert_eq!(keys(&a), keys(&b));

    // Paths etcd's peer mux does not serve (no `/health` on the peer port).
    for path in ["/health", "/nothing", "/members/x"] {
        let a = peer(&etcd, "GET", path, &[], b"").await;
        let b = peer(&ours_m, "GET", path, &[], b"").await;
        assert_eq!(masked(&a, &[]), masked(&b, &[]), "{path}: {a:?} vs {b:?}");
    }

    // Leases (protobuf bodies): renewing or asking about a lease that does not exist, a body
    // that is no request, a wrong method.
    let lease_12345 = [0x08, 0xb9, 0x60];
    let internal_12345 = [0x0a, 0x03, 0x08, 0xb9, 0x60];
    let lease_cases: [(&str, &str, &[u8]); 5] = [
        ("POST", "/leases", &lease_12345),
        ("POST", "/leases/internal", &internal_12345),
        ("POST", "/leases", &[0xff, 0xff]),
        ("GET", "/leases", b""),
        ("GET", "/leases/internal", b""),
    ];
    for (method, path, body) in lease_cases {
        let headers = [("Content-Type", "application/protobuf")];
        let a = peer(&etcd, method, path, &headers, body).await;
        let b = peer(&ours_m, method, path, &headers, body).await;
        assert_eq!(
            masked(&a, &[]),
            masked(&b, &[]),
            "{method} {path}: {a:?} vs {b:?}"
        );
    }

    // /raft/probing: `{"OK":true,"Now":<time>}`.
    let a = peer(&etcd, "GET", "/raft/probing", &[], b"").await;
    let b = peer(&ours_m, "GET", "/raft/probing", &[], b"").await;
    assert_eq!((a.status, b.status), (200, 200));
    assert_eq!(keys(&a), keys(&b), "{} vs {}", a.body, b.body);
    assert_eq!(b.json().expect("json")["OK"], Value::Bool(true));
    assert!(b.body.ends_with("}\n"));

    // A stream request from another cluster: 412 "cluster ID mismatch", with etcd's headers.
    let stranger = |to: &str| {
        vec![
            ("X-Etcd-Cluster-ID", "abcdef"),
            ("X-Server-From", "1234"),
            ("X-Server-Version", "3.4.23"),
            ("X-Min-Cluster-Version", "3.0.0"),
            ("X-Raft-To", to),
        ]
        .into_iter()
        .map(|(k, v)| (k, v.to_owned()))
        .collect::<Vec<_>>()
    };
    for path in [
        "/raft/stream/message/1234",
        "/raft/stream/msgapp/1234",
        "/raft",
    ] {
        let method = if path == "/raft" { "POST" } else { "GET" };
        let a = peer(&etcd, method, path, &as_refs(&stranger(&etcd_id)), b"").await;
        let b = peer(&ours_m, method, path, &as_refs(&stranger(&our_id)), b"").await;
        assert_eq!(masked(&a, &[]), masked(&b, &[]), "{path}: {a:?} vs {b:?}");
        assert_eq!((b.status, b.body.as_str()), (412, "cluster ID mismatch\n"));
        assert_eq!(b.header("X-Etcd-Cluster-ID"), Some(our_cluster.as_str()));
        assert_eq!(
            a.header("X-Content-Type-Options"),
            b.header("X-Content-Type-Options")
        );
    }

    // The right cluster, but a sender that is no member, a bad id, a bad path, a wrong
    // `X-Raft-To`, an old version, a wrong method: the same refusals.
    let member_headers =
        |cluster: &str, to: &str, from: &str, version: &str| -> Vec<(&'static str, String)> {
            vec![
                ("X-Etcd-Cluster-ID", cluster.to_owned()),
                ("X-Server-From", from.to_owned()),
                ("X-Server-Version", version.to_owned()),
                ("X-Min-Cluster-Version", "3.0.0".to_owned()),
                ("X-Raft-To", to.to_owned()),
            ]
        };
    let cases: Vec<(&str, &str, &str, &str, &str)> = vec![
        // (method, path, X-Raft-To (self or other), from, version)
        ("GET", "/raft/stream/message/1234", "self", "1234", "3.4.23"),
        ("GET", "/raft/stream/message/zz", "self", "1234", "3.4.23"),
        ("GET", "/raft/stream/other/1234", "self", "1234", "3.4.23"),
        ("GET", "/raft/stream/message/1234", "self", "1234", "2.3.0"),
        (
            "POST",
            "/raft/stream/message/1234",
            "self",
            "1234",
            "3.4.23",
        ),
        ("GET", "/raft", "self", "1234", "3.4.23"),
        ("GET", "/raft/snapshot", "self", "1234", "3.4.23"),
        ("GET", "/raft/nothing", "self", "1234", "3.4.23"),
        ("POST", "/raft", "self", "1234", "3.4.23"),
    ];
    for (method, path, _, from, version) in cases {
        let a = peer(
            &etcd,
            method,
            path,
            &as_refs(&member_headers(&etcd_cluster, &etcd_id, from, version)),
            b"",
        )
        .await;
        let b = peer(
            &ours_m,
            method,
            path,
            &as_refs(&member_headers(&our_cluster, &our_id, from, version)),
            b"",
        )
        .await;
        assert_eq!(
            masked(&a, &[]),
            masked(&b, &[]),
            "{method} {path} {version}: {a:?} vs {b:?}"
        );
        assert_eq!(a.header("Allow"), b.header("Allow"), "{method} {path}");
    }
}

/// The keys of a JSON object answer, in order.
fn keys(r: &HttpResponse) -> Vec<String> {
    r.json()
        .expect("json answer")
        .as_object()
        .expect("object")
        .keys()
        .cloned()
        .collect()
}

fn as_refs<'a>(headers: &'a [(&'static str, String)]) -> Vec<(&'static str, &'a str)> {
    headers.iter().map(|(k, v)| (*k, v.as_str())).collect()
}

/// Lines of `log` that say a stream to or from the other member was established, by stream
/// type and direction (the zap fields `stream-reader-type`, `stream-writer-type`, which our
/// JSON log writes too).
fn established(log: &str) -> Vec<String> {
    let mut seen: Vec<String> = log
        .lines()
        .filter(|l| l.contains("established TCP streaming connection with remote peer"))
        .filter_map(|l| {
            let json: Value = serde_json::from_str(l).ok()?;
            ["stream-reader-type", "stream-writer-type"]
                .iter()
                .find_map(|k| {
                    let kind = json.get(*k)?.as_str()?;
                    Some(format!("{} {kind}", &k[7..13]))
                })
        })
        .collect();
    seen.sort();
    seen.dedup();
    seen
}

/// The real prize of issue 17's transport: an etcd 3.4 member and an etcd-rs member of one
/// two-member cluster (same `--initial-cluster`, so the same member and cluster ids) dial each
/// other's streams, pass each other's version and cluster checks, and attach both streams in
/// both directions, as each one's log says in etcd's words; then raft's votes pass over those
/// streams and the two elect a leader. What they then do with each other's raft entries is
/// beyond the transport: etcd-rs stops at the first entry etcd proposed (`decode raft
/// request`), since the entry encoding is issue 17's other half.
#[tokio::test]
async fn etcd_34_and_etcd_rs_open_streams_to_each_other() {
    use etcdrs_testkit::ports::reserve_on;
    let host = std::net::Ipv4Addr::LOCALHOST;
    let (a_client, a_peer) = (
        reserve_on(host).expect("port"),
        reserve_on(host).expect("port"),
    );
    let (b_client, b_peer) = (
        reserve_on(host).expect("port"),
        reserve_on(host).expect("port"),
    );
    let a_url = format!("http://{host}:{}", a_peer.port());
    let b_url = format!("http://{host}:{}", b_peer.port());
    let (reference, under_test) = (etcd34(), etcdrs());
    let a_opts = MemberOpts::new(&reference)
        .name("a")
        .fast_timers()
        .initial_peers([("b", b_url.clone())])
        .arg("--logger=zap");
    let b_opts = MemberOpts::new(&under_test)
        .name("b")
        .fast_timers()
        .initial_peers([("a", a_url.clone())]);
    let a = Member::spawn_on(a_opts, a_client, a_peer).expect("etcd 3.4 starts");
    let b = Member::spawn_on(b_opts, b_client, b_peer).expect("etcd-rs starts");
    let all = vec![
        "reader stream MsgApp v2".to_owned(),
        "reader stream Message".to_owned(),
        "writer stream MsgApp v2".to_owned(),
        "writer stream Message".to_owned(),
    ];
    let mut want = all.clone();
    want.sort();
    let checked = etcdrs_testkit::poll_until(std::time::Duration::from_secs(30), || {
        let (etcd_side, our_side) = (established(&a.log()), established(&b.log()));
        let want = want.clone();
        async move {
            if etcd_side == want && our_side == want {
                Ok(())
            } else {
                Err(format!("etcd 3.4: {etcd_side:?}; etcd-rs: {our_side:?}"))
            }
        }
    })
    .await;
    if let Err(e) = checked {
        panic!(
            "{e}\n--- etcd 3.4 log:\n{}\n--- etcd-rs log:\n{}",
            a.log_tail(60),
            b.log_tail(60)
        );
    }
    // Raft messages pass both ways: the two elect a leader (etcd's raft logs "raft.node: <id>
    // elected leader <id> at term <n>" whichever of the two it is).
    etcdrs_testkit::poll_until(std::time::Duration::from_secs(30), || {
        let elected = a.log_contains("elected leader");
        async move {
            if elected {
                Ok(())
            } else {
                Err("no leader elected")
            }
        }
    })
    .await
    .unwrap_or_else(|e| {
        panic!(
            "{e}\n--- etcd 3.4 log:\n{}\n--- etcd-rs log:\n{}",
            a.log_tail(60),
            b.log_tail(60)
        )
    });
    // Neither refused the other's headers.
    for needle in [
        "cluster ID mismatch",
        "incompatible version",
        "to field mismatch",
    ] {
        assert!(!a.log_contains(needle), "etcd 3.4 logged {needle:?}");
        assert!(!b.log_contains(needle), "etcd-rs logged {needle:?}");
    }
}

/// What the leader of a two-member cluster of `bin` answers a peer that names the follower: a
/// stream request with the wrong `X-Raft-To`, then, once the follower is removed, its stream
/// request.
async fn refusals_of_peers(bin: &EtcdBin, extra: &[&str]) -> Vec<(u16, Option<String>, String)> {
    let c = etcdrs_testkit::Cluster::start(
        2,
        etcdrs_testkit::ClusterOpts::new(bin).args(extra.iter().copied()),
    )
    .await
    .expect("cluster starts");
    // The member that stays is the leader: a leader that removes itself may stop before its
    // follower hears that the removal committed, which leaves the follower without a quorum
    // (in etcd as in ours).
    let out = c
        .member(0)
        .etcdctl()
        .ok(&["endpoint", "status", "-w", "json"])
        .await;
    let json: Value = serde_json::from_str(&out).expect("status json");
    let leader = format!(
        "{:x}",
        json[0]["Status"]["leader"].as_u64().expect("leader")
    );
    let (cluster, zero) = ids(c.member(0)).await;
    let (_, one) = ids(c.member(1)).await;
    let (stays, first, second) = if leader == zero {
        (0, zero, one)
    } else {
        (1, one, zero)
    };
    let headers = |to: &str| -> Vec<(&'static str, String)> {
        vec![
            ("X-Etcd-Cluster-ID", cluster.clone()),
            ("X-Server-From", second.clone()),
            ("X-Server-Version", "3.4.23".to_owned()),
            ("X-Min-Cluster-Version", "3.0.0".to_owned()),
            ("X-Raft-To", to.to_owned()),
        ]
    };
    let stream = format!("/raft/stream/message/{second}");
    let mut answers = Vec::new();
    let wrong_to = peer(
        c.member(stays),
        "GET",
        &stream,
        &as_refs(&headers("1")),
        b"",
    )
    .await;
    answers.push(masked(&wrong_to, &[]));

    // etcd refuses a removal until every member has been connected for a while ("unhealthy
    // cluster"), so ask until it is done.
    let ctl = c.member(stays).etcdctl();
    etcdrs_testkit::poll_until(std::time::Duration::from_secs(30), || async {
        let out = ctl
            .run(&["member", "remove", second.as_str()])
            .await
            .map_err(|e| e.to_string())?;
        if out.success() {
            Ok(())
        } else {
            Err(out.stderr)
        }
    })
    .await
    .expect("member removed");
    // The leader refuses the removed member once it has applied the removal.
    let addr = peer_addr(c.member(stays));
    let until = |method: &'static str,
                 path: String,
                 headers: Vec<(&'static str, String)>,
                 body: Vec<u8>,
                 status: u16| {
        let addr = addr.clone();
        async move {
            etcdrs_testkit::poll_until(std::time::Duration::from_secs(30), || {
                let (addr, path, headers, body) =
                    (addr.clone(), path.clone(), headers.clone(), body.clone());
                async move {
                    let r = http_request(&addr, method, &path, &as_refs(&headers), &body)
                        .await
                        .map_err(|e| format!("{e:#}"))?;
                    if r.status == status {
                        Ok(r)
                    } else {
                        Err(format!("{r:?}"))
                    }
                }
            })
            .await
            .unwrap_or_else(|e| panic!("{method} {path}: {e}"))
        }
    };
    let removed = until("GET", stream.clone(), headers(&first), Vec::new(), 410).await;
    answers.push(masked(&removed, &[]));
    answers
}

/// Refusals that need a real peer: a stream opened to the wrong member (412 `to field
/// mismatch`) and a removed member's stream (410 `removed member`), compared with a
/// two-member etcd 3.4 cluster.
#[tokio::test]
async fn refusals_of_known_and_removed_peers_as_etcd_34s() {
    let (reference, under_test) = (etcd34(), etcdrs());
    let (etcd, ours) = tokio::join!(
        refusals_of_peers(&reference, &["--logger=zap"]),
        refusals_of_peers(&under_test, &[])
    );
    assert_eq!(etcd, ours);
    assert_eq!(ours[0].0, 412, "{ours:?}");
    assert_eq!(ours[0].2, "to field mismatch\n");
    assert_eq!((ours[1].0, ours[1].2.as_str()), (410, "removed member\n"));
}

/// etcd serves its v3 gRPC API on the peer port too (`servePeers` puts `v3rpc.Server` behind
/// cmux), without the lock and election services: etcdctl pointed at the peer URL prints
/// the same against both.
#[tokio::test]
async fn the_peer_port_serves_the_v3_api_as_etcd_34s() {
    let mut outputs = Vec::new();
    for bin in [etcd34(), etcdrs()] {
        let m = single(&bin, "p").await;
        let ctl = etcdrs_testkit::Etcdctl::new(m.peer_url());
        let mut out = vec![
            ctl.ok(&["put", "k", "v"]).await,
            ctl.ok(&["get", "k"]).await,
            ctl.ok(&["member", "list", "-w", "json"])
                .await
                .contains(&m.peer_url())
                .to_string(),
        ];
        // The v3lock service (which etcdctl's lock, a client-side recipe, does not use).
        let mut client = etcd_client::Client::connect([m.peer_url()], None)
            .await
            .expect("connect to the peer port");
        let lock = client.lock("l", None).await.expect_err("no lock service");
        out.push(format!("{lock}"));
        // And the client port still holds what went in through the peer port.
        out.push(m.etcdctl().ok(&["get", "k", "--print-value-only"]).await);
        outputs.push(out);
    }
    assert_eq!(outputs[0][0], "OK\n");
    assert_eq!(outputs[0][1], "k\nv\n");
    assert_eq!(outputs[1], outputs[0]);
}
