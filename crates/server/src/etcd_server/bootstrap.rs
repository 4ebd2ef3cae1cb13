//! How a member's identity and first raft state come about: a new cluster's bootstrap, joining an existing cluster, and what a restart loads from the backend (members, removed members, alarms).

use std::time::Duration;

use etcdrs_backend::Bucket;
use etcdrs_mvcc::{KvStore, META_CONF_STATE};
use etcdrs_raftnode::Start;
use etcdrs_schema::conf_state::decode_conf_state;
use etcdrs_schema::keys::{META_CLUSTER_ID, META_MEMBER_ID};
use etcdrs_schema::membership;
use etcdrs_schema::membership::Member;

use super::url_string;
use crate::config::ServerConfig;
use crate::error::{Result, ServerError};

pub(super) fn bootstrap(config: &ServerConfig, store: &KvStore) -> Result<(u64, u64, Start)> {
    let mut members = Vec::new();
    for (name, urls) in &config.initial_cluster {
        let peer_urls: Vec<String> = urls.iter().map(url_string).collect();
        let id = membership::member_id(&peer_urls, &config.initial_cluster_token);
        members.push(Member {
            id,
            name: name.clone(),
            peer_urls,
            client_urls: Vec::new(),
            is_learner: false,
        });
    }
    let Some(local) = members.iter().find(|m| m.name == config.name) else {
        return Err(ServerError::Fatal(format!(
            "couldn't find local name {:?} in the initial cluster configuration",
            config.name
        )));
    };
    // etcd refuses a member whose advertised peer URLs are not the ones the initial cluster
    // lists for it: the other members would dial somewhere else.
    let mut advertised: Vec<String> = config
        .initial_advertise_peer_urls
        .iter()
        .map(url_string)
        .collect();
    advertised.sort();
    let mut listed = local.peer_urls.clone();
    listed.sort();
    if advertised != listed {
        return Err(ServerError::Fatal(format!(
            "--initial-cluster has {}={} but missing from --initial-advertise-peer-urls={} (resolved urls: \"{}\" != \"{}\")",
            config.name,
            local.peer_urls.join(","),
            advertised.join(","),
            advertised.join(","),
            listed.join(","),
        )));
    }
    let member_id = local.id;
    let ids: Vec<u64> = members.iter().map(|m| m.id).collect();
    let cluster_id = membership::cluster_id(&ids);
    tracing::info!(
        local_member_id = %membership::id_hex(member_id),
        cluster_id = %membership::id_hex(cluster_id),
        "starting local member"
    );
    let mut batch = store.write()?;
    batch.bucket_put(Bucket::META, META_MEMBER_ID, &member_id.to_be_bytes())?;
    batch.bucket_put(Bucket::META, META_CLUSTER_ID, &cluster_id.to_be_bytes())?;
    batch.commit(true)?;
    Ok((
        member_id,
        cluster_id,
        new_cluster_start(members, member_id, cluster_id)?,
    ))
}

/// A new cluster's raft start, as etcd's `startNode` makes it: one `AddNode` entry per member,
/// in the order of their ids (`MemberIDs`), each with the member's JSON; the log's metadata
/// names the member and its cluster.
pub(super) fn new_cluster_start(
    mut members: Vec<Member>,
    member_id: u64,
    cluster_id: u64,
) -> Result<Start> {
    members.sort_by_key(|m| m.id);
    let mut peers = Vec::new();
    for member in &members {
        let context = serde_json::to_vec(member)
            .map_err(|e| ServerError::Fatal(format!("encode member: {e}")))?;
        peers.push((member.id, context));
    }
    let metadata = wal_metadata(member_id, cluster_id);
    Ok(Start::New { metadata, peers })
}

/// The WAL's metadata: the member's id, then its cluster's (big-endian).
pub(super) fn wal_metadata(member_id: u64, cluster_id: u64) -> Vec<u8> {
    let mut metadata = member_id.to_be_bytes().to_vec();
    metadata.extend_from_slice(&cluster_id.to_be_bytes());
    metadata
}

/// A restart's raft start from what `store` holds: the consistent index as the applied index
/// and the membership as of it.
pub(super) fn restart_start(store: &KvStore, force_new_cluster: bool) -> Result<Start> {
    let conf_state = store
        .meta(META_CONF_STATE)?
        .and_then(|b| decode_conf_state(&b))
        .unwrap_or_default();
    Ok(Start::Restart {
        applied: store.consistent_index(),
        conf_state,
        force_new_cluster,
    })
}

/// Join an existing cluster (`--initial-cluster-state=existing`): ask the other members of
/// `--initial-cluster` who is in the cluster, find this member among them by its advertised
/// peer URLs (it must have been added with MemberAdd first), and start with an empty log.
pub(super) async fn join_existing(
    config: &ServerConfig,
    store: &KvStore,
    peer_client: &etcdrs_rafthttp::PeerClient,
) -> Result<(u64, u64, Start, Vec<(u64, Vec<String>)>)> {
    let ours: Vec<String> = config
        .initial_advertise_peer_urls
        .iter()
        .map(url_string)
        .collect();
    let mut last_error = String::from("no other member in --initial-cluster");
    let mut found = None;
    for (name, urls) in &config.initial_cluster {
        if *name == config.name {
            continue;
        }
        for url in urls {
            let url = url_string(url);
            match crate::peer::calls::fetch_members(peer_client, &url, Duration::from_secs(2)).await
            {
                Ok(remote) => {
                    found = Some(remote);
                    break;
                }
                Err(e) => last_error = e.to_string(),
            }
        }
        if found.is_some() {
            break;
        }
    }
    let Some((remote_cluster_id, remote_members)) = found else {
        return Err(ServerError::Fatal(format!(
            "cannot fetch cluster info from peer urls: {last_error}"
        )));
    };
    let Some(local) = remote_members
        .iter()
        .find(|m| m.peer_urls.iter().any(|u| ours.contains(u)))
    else {
        return Err(ServerError::Fatal(format!(
            "error validating peerURLs: no member with peer URLs {ours:?} in the existing cluster (add it with member add first)"
        )));
    };
    let member_id = local.id;
    let cluster_id = remote_cluster_id;
    tracing::info!(
        local_member_id = %membership::id_hex(member_id),
        cluster_id = %membership::id_hex(cluster_id),
        "joining existing cluster"
    );
    let mut batch = store.write()?;
    batch.bucket_put(Bucket::META, META_MEMBER_ID, &member_id.to_be_bytes())?;
    batch.bucket_put(Bucket::META, META_CLUSTER_ID, &cluster_id.to_be_bytes())?;
    batch.commit(true)?;
    let metadata = wal_metadata(member_id, cluster_id);
    let peers = remote_members
        .iter()
        .map(|m| (m.id, m.peer_urls.clone()))
        .collect();
    Ok((member_id, cluster_id, Start::Join { metadata }, peers))
}
