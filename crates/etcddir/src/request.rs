//! The payloads of etcd's raft entries, so that a reader of etcd's WAL can replay them.
//!
//! The requests ([`InternalRaftRequest`], the v2 [`V2Request`], [`Member`] JSON) are
//! `etcdrs_proto::raft_internal`'s, which etcd-rs itself proposes and applies; they are
//! re-exported here, and [`decode_entry`] applies etcd's rule for which payload an entry holds.
//!
//! [`ConfChange`] is etcd's `raftpb.ConfChange`, decoded here rather than with raft-rs's
//! `eraftpb::ConfChange` because the enums differ: etcd has `ConfChangeUpdateNode = 2` and
//! `ConfChangeAddLearnerNode = 3`, raft-rs has `AddLearnerNode = 2` and no update. etcd-rs
//! writes conf changes with etcd's numbers through `raftnode::confchange`; this decoder is a
//! second, independent reading of the same wire format (the tests read etcd-rs's entries with
//! it). Its `context` is the member's JSON ([`Member`], [`ConfigChangeContext`]), except for a
//! removal.

use crate::error::{Error, Result};
use prost::Message as _;

pub use etcdrs_proto::raft_internal::{
    Attributes, ClusterMemberAttrSetRequest, ClusterVersionSetRequest, ConfigChangeContext,
    DowngradeInfoSetRequest, InternalAuthenticateRequest, InternalRaftRequest, Member, Payload,
    RequestHeader, V2Request,
};

/// Decodes an `EntryNormal` entry's data as etcd 3.4's `applyEntryNormal` does
/// ([`etcdrs_proto::raft_internal::decode_entry`]).
pub fn decode_entry(data: &[u8]) -> Result<Payload> {
    etcdrs_proto::raft_internal::decode_entry(data).map_err(Error::Payload)
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

/// Decodes a `ConfChange` context, the JSON of the member added or updated.
pub fn decode_conf_change_member(context: &[u8]) -> Result<Member> {
    serde_json::from_slice(context).map_err(Error::MemberJson)
}

#[cfg(test)]
mod tests {
    use super::*;
    use etcdrs_proto::etcdserverpb as pb;

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
                value: b"v".to_vec().into(),
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
