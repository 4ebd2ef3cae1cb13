//! The peer port against a peer that must not be trusted: snapshot uploads come only from
//! members, and stay within a bound of the backend quota; a refused upload leaves no file.
//! Ours only: the peer protocol is etcd-rs's own (`etcdrspeer`).

use etcdrs_proto::peerpb::SnapshotChunk;
use etcdrs_proto::peerpb::peer_client::PeerClient;
use etcdrs_testkit::{Code, Member};
use serde_json::Value;

use crate::{ours, start_with};

/// A raft `MsgSnapshot` (eraftpb and etcd's raftpb share the numbers) for index 100.
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

/// Uploads `chunks` chunks of `chunk` bytes to `m`'s peer port as member `from`.
async fn upload(
    m: &Member,
    cluster: &str,
    from: &str,
    chunks: usize,
    chunk: usize,
) -> tonic::Status {
    let mut client = PeerClient::connect(m.peer_url())
        .await
        .expect("peer connection");
    let stream = futures::stream::iter((0..chunks).map(move |i| SnapshotChunk {
        message: if i == 0 {
            SNAPSHOT_MESSAGE.to_vec()
        } else {
            Vec::new()
        },
        data: vec![0u8; chunk],
    }));
    let mut request = tonic::Request::new(stream);
    request
        .metadata_mut()
        .insert("x-etcd-cluster-id", cluster.parse().expect("ascii"));
    request
        .metadata_mut()
        .insert("x-server-from", from.parse().expect("ascii"));
    client
        .snapshot(request)
        .await
        .expect_err("the upload is refused")
}

/// No received-snapshot file is left in `m`'s snap directory.
fn no_partial_files(m: &Member) {
    let snap = m.data_dir().join("member/snap");
    let left: Vec<_> = std::fs::read_dir(&snap)
        .expect("snap dir")
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".snap.recv"))
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

    let stranger = upload(&m, &cluster, "1234", 1, 1024).await;
    assert_eq!(stranger.code(), Code::PermissionDenied, "{stranger:?}");
    assert_eq!(
        stranger.message(),
        "etcdserver: snapshot from a member not in the cluster"
    );

    // Twice the 1 MiB quota is the bound; 3.5 MiB is refused part way.
    let huge = upload(&m, &cluster, &member, 7, 512 * 1024).await;
    assert_eq!(huge.code(), Code::ResourceExhausted, "{huge:?}");
    assert!(
        huge.message()
            .contains("snapshot larger than 2097152 bytes"),
        "{huge:?}"
    );
    no_partial_files(&m);
    client.put("still", "serving", None).await.expect("serving");
}
