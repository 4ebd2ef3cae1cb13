//! What etcd puts into its raft log, with etcd's field numbers: the one definition that
//! etcd-rs proposes and applies, and that `etcddir` reads etcd's WAL with. A member of either
//! implementation can thus apply the other's entries (issue 17, mixed clusters).
//!
//! Messages of etcd 3.4/3.5 (`etcdserverpb/raft_internal.proto`, `etcdserver.proto`,
//! `membershippb/membership.proto`):
//!
//! - [`InternalRaftRequest`]: what etcd's v3 API proposes (3.4's fields plus 3.5's
//!   `auth_status`, `cluster_version_set`, `cluster_member_attr_set`, `downgrade_info_set`).
//!   The client requests inside are [`crate::etcdserverpb`]'s, which have etcd's numbers.
//!   Fields are declared in tag order, the order in which gogoproto writes them, so the
//!   bytes prost writes are the bytes etcd writes for the same request.
//! - [`V2Request`]: etcd's v2 `Request`. etcd 3.4 proposes it bare (not wrapped) to publish a
//!   member's attributes (`PUT /0/members/<hex id>/attributes`, `Val` = JSON
//!   [`MemberAttributes`]), to set the cluster version (`PUT /0/version`, `Val` = `"3.4.0"`)
//!   and for v2 API writes and `SYNC`. It is proto2 with gogoproto's non-nullable fields,
//!   which etcd writes even when they hold zero: so does prost here (`required`).
//! - [`Member`] and [`ConfigChangeContext`]: etcd's `membership.Member` JSON, the context of a
//!   `raftpb.ConfChange` (the conf change itself, whose type numbers differ from raft-rs's,
//!   is encoded by `raftnode::confchange`), written with Go's field order and `omitempty`s.
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
use serde::{Deserialize, Deserializer, Serialize, Serializer};

use crate::etcdserverpb as pb;

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
    /// The request header (id, user, auth revision).
    #[prost(message, optional, tag = "100")]
    pub header: Option<RequestHeader>,
    /// Auth enable.
    #[prost(message, optional, tag = "1000")]
    pub auth_enable: Option<pb::AuthEnableRequest>,
    /// Auth disable.
    #[prost(message, optional, tag = "1011")]
    pub auth_disable: Option<pb::AuthDisableRequest>,
    /// Authenticate (with the token the API layer made).
    #[prost(message, optional, tag = "1012")]
    pub authenticate: Option<InternalAuthenticateRequest>,
    /// Auth status (etcd 3.5).
    #[prost(message, optional, tag = "1013")]
    pub auth_status: Option<pb::AuthStatusRequest>,
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
    #[prost(uint64, required, tag = "1")]
    pub id: u64,
    /// `PUT`, `POST`, `DELETE`, `GET`, `QGET`, `HEAD` or `SYNC`.
    #[prost(string, required, tag = "2")]
    pub method: String,
    /// The v2 key, e.g. `/0/version`.
    #[prost(string, required, tag = "3")]
    pub path: String,
    /// The value.
    #[prost(string, required, tag = "4")]
    pub val: String,
    /// Whether the key is a directory.
    #[prost(bool, required, tag = "5")]
    pub dir: bool,
    /// Compare-and-swap: the expected previous value.
    #[prost(string, required, tag = "6")]
    pub prev_value: String,
    /// Compare-and-swap: the expected previous modified index.
    #[prost(uint64, required, tag = "7")]
    pub prev_index: u64,
    /// Compare-and-swap: whether the key must (not) exist.
    #[prost(bool, optional, tag = "8")]
    pub prev_exist: Option<bool>,
    /// Expiration, in Unix nanoseconds (0: none).
    #[prost(int64, required, tag = "9")]
    pub expiration: i64,
    /// Watch (reads only).
    #[prost(bool, required, tag = "10")]
    pub wait: bool,
    /// Watch from this index (reads only).
    #[prost(uint64, required, tag = "11")]
    pub since: u64,
    /// Recursive.
    #[prost(bool, required, tag = "12")]
    pub recursive: bool,
    /// Sorted (reads only).
    #[prost(bool, required, tag = "13")]
    pub sorted: bool,
    /// Quorum read.
    #[prost(bool, required, tag = "14")]
    pub quorum: bool,
    /// The leader's clock for `SYNC`, in Unix nanoseconds.
    #[prost(int64, required, tag = "15")]
    pub time: i64,
    /// Stream (watches only).
    #[prost(bool, required, tag = "16")]
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
///
/// Given the entry's data as [`bytes::Bytes`] (raft's entries hold it so), the decoder reads each
/// bytes field out of it without a copy of its own before the one into the message's field: with
/// large values the decode of a `&[u8]` copied each value twice.
pub fn decode_entry<B: bytes::Buf + Clone>(data: B) -> Result<Payload, prost::DecodeError> {
    if !data.has_remaining() {
        return Ok(Payload::Noop);
    }
    match InternalRaftRequest::decode(data.clone()) {
        Ok(mut request) => match request.v2.take() {
            Some(v2) => Ok(Payload::V2(v2)),
            None => Ok(Payload::V3(Box::new(request))),
        },
        Err(_) => V2Request::decode(data).map(Payload::V2),
    }
}

/// etcd's `membership.Member` as JSON: the context of a conf change that adds or updates a
/// member, a member's record in etcd's `members` bucket (and ours), and (split into
/// `raftAttributes` and `attributes`) the v2 store's record of one.
///
/// Go's `encoding/json` writes the fields in this order (`ID`, then the embedded
/// `RaftAttributes`, then `Attributes`), with `isLearner`, `name` and `clientURLs` left out
/// when empty and a nil `peerURLs` written as `null` (etcd's promote context has one).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Member {
    /// The member's id.
    pub id: u64,
    /// Its peer URLs.
    #[serde(
        rename = "peerURLs",
        default,
        serialize_with = "empty_as_null",
        deserialize_with = "null_as_empty"
    )]
    pub peer_urls: Vec<String>,
    /// Whether it is a learner.
    #[serde(rename = "isLearner", default, skip_serializing_if = "is_false")]
    pub is_learner: bool,
    /// Its name (empty until it has published).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub name: String,
    /// Its client URLs (empty until it has published).
    #[serde(
        rename = "clientURLs",
        default,
        skip_serializing_if = "Vec::is_empty",
        deserialize_with = "null_as_empty"
    )]
    pub client_urls: Vec<String>,
}

/// etcd's `membership.ConfigChangeContext`: what etcd unmarshals an `AddNode` or
/// `AddLearnerNode` context into. A promotion is an `AddNode` whose context is the member's id
/// with `isPromote` set (etcd 3.4 and 3.5 alike); an addition's context is the bare [`Member`]
/// JSON, which reads here with `is_promote` false.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ConfigChangeContext {
    /// The member.
    #[serde(flatten)]
    pub member: Member,
    /// Whether the change promotes a learner.
    #[serde(rename = "isPromote", default)]
    pub is_promote: bool,
}

/// etcd's `membership.Attributes` as JSON: the value of etcd 3.4's v2 publish request.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct MemberAttributes {
    /// The member's name.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub name: String,
    /// Its client URLs.
    #[serde(
        rename = "clientURLs",
        default,
        skip_serializing_if = "Vec::is_empty",
        deserialize_with = "null_as_empty"
    )]
    pub client_urls: Vec<String>,
}

/// The v2 store path of a member's attributes (etcd's `MemberAttributesStorePath`).
pub fn member_attributes_path(member_id: u64) -> String {
    format!("/0/members/{member_id:x}/attributes")
}

/// The v2 store path of the cluster version (etcd's `StoreClusterVersionKey`).
pub const CLUSTER_VERSION_PATH: &str = "/0/version";

/// The member whose attributes a v2 path names, if it names one (etcd's
/// `storeMemberAttributeRegexp`, `/0/members/[[:xdigit:]]{1,16}/attributes`).
pub fn member_of_attributes_path(path: &str) -> Option<u64> {
    let hex = path
        .strip_prefix("/0/members/")?
        .strip_suffix("/attributes")?;
    if hex.is_empty() || hex.len() > 16 || !hex.bytes().all(|b| b.is_ascii_hexdigit()) {
        return None;
    }
    u64::from_str_radix(hex, 16).ok()
}

fn is_false(value: &bool) -> bool {
    !*value
}

fn empty_as_null<S: Serializer>(urls: &[String], serializer: S) -> Result<S::Ok, S::Error> {
    if urls.is_empty() {
        serializer.serialize_none()
    } else {
        serializer.collect_seq(urls)
    }
}

fn null_as_empty<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Vec<String>, D::Error> {
    Ok(Option::<Vec<String>>::deserialize(deserializer)?.unwrap_or_default())
}
