//! The payloads of etcd's raft entries, so that a converter can replay them.
//!
//! Messages of etcd 3.4/3.5 with etcd's field numbers (`etcdserverpb/raft_internal.proto`,
//! `etcdserver.proto`, `membershippb/membership.proto`, `raftpb/raft.proto`):
//!
//! - [`InternalRaftRequest`]: what etcd's v3 API proposes (3.4's fields plus 3.5's
//!   `auth_status`, `cluster_version_set`, `cluster_member_attr_set`, `downgrade_info_set`).
//!   The client requests inside are `etcdrs_proto::etcdserverpb`'s, which have etcd's numbers.
//! - [`V2Request`]: etcd's v2 `Request`. etcd 3.4 proposes it bare (not wrapped) to publish a
//!   member's attributes (`PUT /0/members/<hex id>/attributes`, `Val` = JSON
//!   `{"name","clientURLs"}`), to set the cluster version (`PUT /0/version`, `Val` = `"3.4.0"`)
//!   and for v2 API writes and `SYNC`.
//! - [`ConfChange`]: etcd's `raftpb.ConfChange`. It is decoded here rather than with raft-rs's
//!   `eraftpb::ConfChange` because the enums differ: etcd has `ConfChangeUpdateNode = 2` and
//!   `ConfChangeAddLearnerNode = 3`, raft-rs has `AddLearnerNode = 2` and no update.
//!   Its `context` is the member's JSON ([`Member`]), except for a removal.
//!
//! # Which payload an entry holds ([`decode_entry`])
//!
//! etcd 3.4's `applyEntryNormal` skips an entry with empty data (the leader's no-op at the
//! start of a term), then unmarshals the data as an `InternalRaftRequest`; if that fails it
//! unmarshals it as a bare v2 `Request`; if it succeeds and `v2` is set, the v2 request is the
//! payload; otherwise the internal request is. [`decode_entry`] does the same, with prost
//! instead of gogoproto. A bare v2 `Request` fails as an `InternalRaftRequest` because its
//! field 2 (`Method`, a string) is read as the embedded message `v2`, and every method etcd
//! writes (`PUT`, `POST`, `DELETE`, `GET`, `QGET`, `HEAD`, `SYNC`) starts with a byte that is
//! an invalid tag for `Request`; both decoders reject it alike. One difference: prost checks
//! that strings are UTF-8 and gogoproto does not, so a v2 value that is not UTF-8 is an error
//! here.

use prost::Message as _;
use serde::{Deserialize, Serialize};

use etcdrs_proto::etcdserverpb as pb;

use crate::error::{Error, Result};

/// `etcdserverpb.RequestHeader`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct RequestHeader {
    /// The request id.
    #[prost(uint64, tag = "1")]
    pub id: u64,
    /// The user of the auth token of the request's connection.
    #[prost(string, tag = "2")]
    pub username: String,
    /// The auth store's revision when the request was authorized.
    #[prost(uint64, tag = "3")]
    pub auth_revision: u64,
}

/// `etcdserverpb.InternalAuthenticateRequest`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct InternalAuthenticateRequest {
    /// The user.
    #[prost(string, tag = "1")]
    pub name: String,
    /// The password.
    #[prost(string, tag = "2")]
    pub password: String,
    /// The simple token the API layer generated.
    #[prost(string, tag = "3")]
    pub simple_token: String,
}

/// `membershippb.ClusterVersionSetRequest` (etcd 3.5).
#[derive(Clone, PartialEq, prost::Message)]
pub struct ClusterVersionSetRequest {
    /// The cluster version, e.g. `"3.5.0"`.
    #[prost(string, tag = "1")]
    pub ver: String,
}

/// `membershippb.Attributes`: a member's name and client URLs.
#[derive(Clone, PartialEq, prost::Message)]
pub struct Attributes {
    /// The member's name.
    #[prost(string, tag = "1")]
    pub name: String,
    /// The member's client URLs.
    #[prost(string, repeated, tag = "2")]
    pub client_urls: Vec<String>,
}

/// `membershippb.ClusterMemberAttrSetRequest` (etcd 3.5's publish).
#[derive(Clone, PartialEq, prost::Message)]
pub struct ClusterMemberAttrSetRequest {
    /// The member's id.
    #[prost(uint64, tag = "1")]
    pub member_id: u64,
    /// Its attributes.
    #[prost(message, optional, tag = "2")]
    pub member_attributes: Option<Attributes>,
}

/// `membershippb.DowngradeInfoSetRequest` (etcd 3.5).
#[derive(Clone, PartialEq, prost::Message)]
pub struct DowngradeInfoSetRequest {
    /// Whether a downgrade is in progress.
    #[prost(bool, tag = "1")]
    pub enabled: bool,
    /// The target version.
    #[prost(string, tag = "2")]
    pub ver: String,
}

/// `etcdserverpb.InternalRaftRequest`: the union of what etcd's v3 server proposes.
#[derive(Clone, PartialEq, prost::Message)]
pub struct InternalRaftRequest {
    /// The request header (id, user, auth revision).
    #[prost(message, optional, tag = "100")]
    pub header: Option<RequestHeader>,
    /// The request id (older form; etcd uses `header.id` when this is 0).
    #[prost(uint64, tag = "1")]
    pub id: u64,
    /// A v2 request wrapped in the v3 envelope.
    #[prost(message, optional, tag = "2")]
    pub v2: Option<V2Request>,
    /// A range (a linearizable read or a txn's read part, when proposed).
    #[prost(message, optional, tag = "3")]
    pub range: Option<pb::RangeRequest>,
    /// A put.
    #[prost(message, optional, tag = "4")]
    pub put: Option<pb::PutRequest>,
    /// A delete range.
    #[prost(message, optional, tag = "5")]
    pub delete_range: Option<pb::DeleteRangeRequest>,
    /// A transaction.
    #[prost(message, optional, tag = "6")]
    pub txn: Option<pb::TxnRequest>,
    /// A compaction.
    #[prost(message, optional, tag = "7")]
    pub compaction: Option<pb::CompactionRequest>,
    /// A lease grant.
    #[prost(message, optional, tag = "8")]
    pub lease_grant: Option<pb::LeaseGrantRequest>,
    /// A lease revoke.
    #[prost(message, optional, tag = "9")]
    pub lease_revoke: Option<pb::LeaseRevokeRequest>,
    /// An alarm activation or deactivation.
    #[prost(message, optional, tag = "10")]
    pub alarm: Option<pb::AlarmRequest>,
    /// Lease checkpoints.
    #[prost(message, optional, tag = "11")]
    pub lease_checkpoint: Option<pb::LeaseCheckpointRequest>,
    /// Auth enable.
    #[prost(message, optional, tag = "1000")]
    pub auth_enable: Option<pb::AuthEnableRequest>,
    /// Auth disable.
    #[prost(message, optional, tag = "1011")]
    pub auth_disable: Option<pb::AuthDisableRequest>,
    /// Auth status (etcd 3.5).
    #[prost(message, optional, tag = "1013")]
    pub auth_status: Option<pb::AuthStatusRequest>,
    /// Authenticate (with the token the API layer made).
    #[prost(message, optional, tag = "1012")]
    pub authenticate: Option<InternalAuthenticateRequest>,
    /// User add.
    #[prost(message, optional, tag = "1100")]
    pub auth_user_add: Option<pb::AuthUserAddRequest>,
    /// User delete.
    #[prost(message, optional, tag = "1101")]
    pub auth_user_delete: Option<pb::AuthUserDeleteRequest>,
    /// User get.
    #[prost(message, optional, tag = "1102")]
    pub auth_user_get: Option<pb::AuthUserGetRequest>,
    /// User password change.
    #[prost(message, optional, tag = "1103")]
    pub auth_user_change_password: Option<pb::AuthUserChangePasswordRequest>,
    /// User role grant.
    #[prost(message, optional, tag = "1104")]
    pub auth_user_grant_role: Option<pb::AuthUserGrantRoleRequest>,
    /// User role revoke.
    #[prost(message, optional, tag = "1105")]
    pub auth_user_revoke_role: Option<pb::AuthUserRevokeRoleRequest>,
    /// User list.
    #[prost(message, optional, tag = "1106")]
    pub auth_user_list: Option<pb::AuthUserListRequest>,
    /// Role list.
    #[prost(message, optional, tag = "1107")]
    pub auth_role_list: Option<pb::AuthRoleListRequest>,
    /// Role add.
    #[prost(message, optional, tag = "1200")]
    pub auth_role_add: Option<pb::AuthRoleAddRequest>,
    /// Role delete.
    #[prost(message, optional, tag = "1201")]
    pub auth_role_delete: Option<pb::AuthRoleDeleteRequest>,
    /// Role get.
    #[prost(message, optional, tag = "1202")]
    pub auth_role_get: Option<pb::AuthRoleGetRequest>,
    /// Role permission grant.
    #[prost(message, optional, tag = "1203")]
    pub auth_role_grant_permission: Option<pb::AuthRoleGrantPermissionRequest>,
    /// Role permission revoke.
    #[prost(message, optional, tag = "1204")]
    pub auth_role_revoke_permission: Option<pb::AuthRoleRevokePermissionRequest>,
    /// Cluster version set (etcd 3.5).
    #[prost(message, optional, tag = "1300")]
    pub cluster_version_set: Option<ClusterVersionSetRequest>,
    /// Member attributes set (etcd 3.5's publish).
    #[prost(message, optional, tag = "1301")]
    pub cluster_member_attr_set: Option<ClusterMemberAttrSetRequest>,
    /// Downgrade info set (etcd 3.5).
    #[prost(message, optional, tag = "1302")]
    pub downgrade_info_set: Option<DowngradeInfoSetRequest>,
}

/// etcd's v2 `etcdserverpb.Request` (proto2; `prev_exist` and `refresh` are its two
/// nullable fields).
#[derive(Clone, PartialEq, prost::Message)]
pub struct V2Request {
    /// The request id.
    #[prost(uint64, tag = "1")]
    pub id: u64,
    /// `PUT`, `POST`, `DELETE`, `GET`, `QGET`, `HEAD` or `SYNC`.
    #[prost(string, tag = "2")]
    pub method: String,
    /// The v2 key, e.g. `/0/version`.
    #[prost(string, tag = "3")]
    pub path: String,
    /// The value.
    #[prost(string, tag = "4")]
    pub val: String,
    /// Whether the key is a directory.
    #[prost(bool, tag = "5")]
    pub dir: bool,
    /// Compare-and-swap: the expected previous value.
    #[prost(string, tag = "6")]
    pub prev_value: String,
    /// Compare-and-swap: the expected previous modified index.
    #[prost(uint64, tag = "7")]
    pub prev_index: u64,
    /// Compare-and-swap: whether the key must (not) exist.
    #[prost(bool, optional, tag = "8")]
    pub prev_exist: Option<bool>,
    /// Expiration, in Unix nanoseconds (0: none).
    #[prost(int64, tag = "9")]
    pub expiration: i64,
    /// Watch (reads only).
    #[prost(bool, tag = "10")]
    pub wait: bool,
    /// Watch from this index (reads only).
    #[prost(uint64, tag = "11")]
    pub since: u64,
    /// Recursive.
    #[prost(bool, tag = "12")]
    pub recursive: bool,
    /// Sorted (reads only).
    #[prost(bool, tag = "13")]
    pub sorted: bool,
    /// Quorum read.
    #[prost(bool, tag = "14")]
    pub quorum: bool,
    /// The leader's clock for `SYNC`, in Unix nanoseconds.
    #[prost(int64, tag = "15")]
    pub time: i64,
    /// Stream (watches only).
    #[prost(bool, tag = "16")]
    pub stream: bool,
    /// Refresh a TTL without changing the value.
    #[prost(bool, optional, tag = "17")]
    pub refresh: Option<bool>,
}

/// What an `EntryNormal` entry's data holds, by etcd's rule (see the module docs).
#[derive(Clone, Debug, PartialEq)]
pub enum Payload {
    /// Empty data: the no-op a new leader appends; etcd applies nothing.
    Noop,
    /// A v3 request.
    V3(Box<InternalRaftRequest>),
    /// A v2 request, bare or wrapped in `InternalRaftRequest.v2`.
    V2(V2Request),
}

/// Decodes an `EntryNormal` entry's data as etcd 3.4's `applyEntryNormal` does.
pub fn decode_entry(data: &[u8]) -> Result<Payload> {
    if data.is_empty() {
        return Ok(Payload::Noop);
    }
    match InternalRaftRequest::decode(data) {
        Ok(mut request) => match request.v2.take() {
            Some(v2) => Ok(Payload::V2(v2)),
            None => Ok(Payload::V3(Box::new(request))),
        },
        Err(_) => V2Request::decode(data)
            .map(Payload::V2)
            .map_err(Error::Payload),
    }
}

/// etcd's `raftpb.ConfChangeType`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, prost::Enumeration)]
#[repr(i32)]
pub enum ConfChangeType {
    /// Add a voter.
    ConfChangeAddNode = 0,
    /// Remove a member.
    ConfChangeRemoveNode = 1,
    /// Update a member's peer URLs (no change to the raft configuration).
    ConfChangeUpdateNode = 2,
    /// Add a learner.
    ConfChangeAddLearnerNode = 3,
}

/// etcd's `raftpb.ConfChange`, the data of an `EntryConfChange` entry.
#[derive(Clone, PartialEq, prost::Message)]
pub struct ConfChange {
    /// The change's id (etcd sets the proposal id).
    #[prost(uint64, tag = "1")]
    pub id: u64,
    /// The change; see [`ConfChangeType`].
    #[prost(enumeration = "ConfChangeType", tag = "2")]
    pub r#type: i32,
    /// The member the change is about.
    #[prost(uint64, tag = "3")]
    pub node_id: u64,
    /// The member's JSON ([`Member`]); empty for a removal.
    #[prost(bytes = "vec", tag = "4")]
    pub context: Vec<u8>,
}

/// Decodes an `EntryConfChange` entry's data.
pub fn decode_conf_change(data: &[u8]) -> Result<ConfChange> {
    ConfChange::decode(data).map_err(Error::ConfChange)
}

/// etcd's `membership.Member` as JSON: the context of a `ConfChange` that adds or updates a
/// member, and (split into `raftAttributes` and `attributes`) the v2 store's record of one.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Member {
    /// The member's id.
    pub id: u64,
    /// Its peer URLs.
    #[serde(rename = "peerURLs", default)]
    pub peer_urls: Vec<String>,
    /// Its name (empty until it has published).
    #[serde(default)]
    pub name: String,
    /// Its client URLs (empty until it has published).
    #[serde(rename = "clientURLs", default)]
    pub client_urls: Vec<String>,
    /// Whether it is a learner.
    #[serde(rename = "isLearner", default)]
    pub is_learner: bool,
}

/// Decodes a `ConfChange` context, the JSON of the member added or updated.
pub fn decode_conf_change_member(context: &[u8]) -> Result<Member> {
    serde_json::from_slice(context).map_err(Error::MemberJson)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn v2(method: &str, path: &str, val: &str) -> V2Request {
        V2Request {
            id: 0x1234_5678,
            method: method.to_string(),
            path: path.to_string(),
            val: val.to_string(),
            ..V2Request::default()
        }
    }

    #[test]
    fn bare_v2_requests_fall_back() {
        for method in ["PUT", "POST", "DELETE", "GET", "QGET", "HEAD", "SYNC"] {
            let request = v2(method, "/0/version", "3.4.0");
            let payload = decode_entry(&request.encode_to_vec()).expect("decodes");
            assert_eq!(payload, Payload::V2(request), "{method}");
        }
    }

    #[test]
    fn wrapped_v2_and_v3() {
        let request = v2("PUT", "/0/version", "3.4.0");
        let wrapped = InternalRaftRequest {
            v2: Some(request.clone()),
            ..Default::default()
        };
        assert_eq!(
            decode_entry(&wrapped.encode_to_vec()).ok(),
            Some(Payload::V2(request))
        );

        let put = InternalRaftRequest {
            header: Some(RequestHeader {
                id: 7,
                ..Default::default()
            }),
            put: Some(pb::PutRequest {
                key: b"k".to_vec(),
                value: b"v".to_vec(),
                ..Default::default()
            }),
            ..Default::default()
        };
        let Ok(Payload::V3(decoded)) = decode_entry(&put.encode_to_vec()) else {
            panic!("not a v3 request");
        };
        assert_eq!(*decoded, put);
        assert_eq!(decode_entry(&[]).ok(), Some(Payload::Noop));
    }

    #[test]
    fn member_json() {
        let json = br#"{"id":10276657743932975437,"peerURLs":["http://localhost:2380"],"name":"default","clientURLs":["http://localhost:2379"]}"#;
        let member = decode_conf_change_member(json).expect("decodes");
        assert_eq!(member.id, 10276657743932975437);
        assert_eq!(member.name, "default");
        assert!(!member.is_learner);
        let learner = decode_conf_change_member(br#"{"id":1,"peerURLs":[],"isLearner":true}"#)
            .expect("decodes");
        assert!(learner.is_learner);
        assert!(decode_conf_change_member(b"{").is_err());
    }
}
