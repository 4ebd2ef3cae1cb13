//! What the server writes into raft entries (etcd's `InternalRaftRequest`): one request
//! with the id its proposer waits on.

use etcdrs_proto::etcdserverpb::{
    AlarmRequest, CompactionRequest, DeleteRangeRequest, LeaseGrantRequest, LeaseRevokeRequest,
    PutRequest, TxnRequest,
};

/// A replicated request.
#[derive(Clone, PartialEq, prost::Message)]
pub struct InternalRaftRequest {
    /// The id the proposer waits on.
    #[prost(uint64, tag = "1")]
    pub id: u64,
    /// The operation.
    #[prost(oneof = "Op", tags = "2, 3, 4, 5, 6, 7, 8, 9, 10")]
    pub op: Option<Op>,
}

/// A replicated operation.
#[derive(Clone, PartialEq, prost::Oneof)]
pub enum Op {
    /// Put.
    #[prost(message, tag = "2")]
    Put(PutRequest),
    /// DeleteRange.
    #[prost(message, tag = "3")]
    DeleteRange(DeleteRangeRequest),
    /// Txn.
    #[prost(message, tag = "4")]
    Txn(TxnRequest),
    /// Compaction.
    #[prost(message, tag = "5")]
    Compaction(CompactionRequest),
    /// LeaseGrant.
    #[prost(message, tag = "6")]
    LeaseGrant(LeaseGrantRequest),
    /// LeaseRevoke.
    #[prost(message, tag = "7")]
    LeaseRevoke(LeaseRevokeRequest),
    /// Alarm.
    #[prost(message, tag = "8")]
    Alarm(AlarmRequest),
    /// A member's attributes.
    #[prost(message, tag = "9")]
    Publish(MemberAttributes),
    /// New peer URLs for a member (etcd's MemberUpdate).
    #[prost(message, tag = "10")]
    UpdatePeerUrls(MemberPeerUrls),
}

/// A member's new peer URLs.
#[derive(Clone, PartialEq, prost::Message)]
pub struct MemberPeerUrls {
    /// The member.
    #[prost(uint64, tag = "1")]
    pub member_id: u64,
    /// Its peer URLs.
    #[prost(string, repeated, tag = "2")]
    pub peer_urls: Vec<String>,
}

/// A member publishing its name and client URLs (etcd's `publish`, as a v3 request).
#[derive(Clone, PartialEq, prost::Message)]
pub struct MemberAttributes {
    /// The member.
    #[prost(uint64, tag = "1")]
    pub member_id: u64,
    /// Its name.
    #[prost(string, tag = "2")]
    pub name: String,
    /// Its client URLs.
    #[prost(string, repeated, tag = "3")]
    pub client_urls: Vec<String>,
}
