//! The bodies of the peer port's calls besides raft's, as etcd's members send them: Go's JSON
//! for the membership and the hash, etcd's protobuf for the lease calls. Shared by the
//! handlers (`http::peer`) and the calls this member makes ([`super::calls`]).

use etcdrs_proto::etcdserverpb::{LeaseTimeToLiveRequest, LeaseTimeToLiveResponse};
use serde::{Deserialize, Serialize};

/// A member as etcd's `/members` lists it (Go's JSON of `membership.Member`), which is how
/// `membership::Member` encodes.
pub use etcdrs_schema::membership::Member as MemberJson;

/// etcd's `pb.HashKVRequest` in Go's JSON.
#[derive(Serialize, Deserialize, Default)]
pub struct HashKvRequestJson {
    /// The revision to hash at (0: the current one).
    #[serde(default, skip_serializing_if = "is_zero_i64")]
    pub revision: i64,
}

/// etcd's `pb.HashKVResponse` in Go's JSON (`omitempty` everywhere).
#[derive(Serialize, Deserialize, Default)]
pub struct HashKvResponseJson {
    /// Only the revision is set, as etcd does.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub header: Option<HeaderJson>,
    /// The hash.
    #[serde(default, skip_serializing_if = "is_zero_u32")]
    pub hash: u32,
    /// The compacted revision when hashed.
    #[serde(default, skip_serializing_if = "is_zero_i64")]
    pub compact_revision: i64,
    /// The revision hashed at (etcd 3.5).
    #[serde(default, skip_serializing_if = "is_zero_i64")]
    pub hash_revision: i64,
}

/// etcd's `pb.ResponseHeader` in Go's JSON, as the hash answer carries it.
#[derive(Serialize, Deserialize, Default)]
pub struct HeaderJson {
    /// The store's revision.
    #[serde(default, skip_serializing_if = "is_zero_i64")]
    pub revision: i64,
}

fn is_zero_i64(v: &i64) -> bool {
    *v == 0
}

fn is_zero_u32(v: &u32) -> bool {
    *v == 0
}

/// etcd's `leasepb.LeaseInternalRequest`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct LeaseInternalRequest {
    /// The request forwarded.
    #[prost(message, optional, tag = "1")]
    pub lease_time_to_live_request: Option<LeaseTimeToLiveRequest>,
}

/// etcd's `leasepb.LeaseInternalResponse`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct LeaseInternalResponse {
    /// The leader's answer.
    #[prost(message, optional, tag = "1")]
    pub lease_time_to_live_response: Option<LeaseTimeToLiveResponse>,
}
