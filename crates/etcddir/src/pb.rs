//! etcd's small on-disk protobuf messages, as prost structs with etcd's field numbers:
//! `walpb.Record`, `walpb.Snapshot`, `snappb.snapshot` and `etcdserverpb.Metadata`.
//!
//! etcd declares them proto2 with gogoproto's `nullable = false`, so its encoder writes every
//! scalar field, zero or not. Decoding proto2 bytes with proto3-style prost fields is exact:
//! the wire forms are the same, and an absent field reads as zero either way.
//!
//! The raft messages inside (`raftpb.Entry`, `HardState`, `Snapshot`, `ConfState`) are not
//! here: they are decoded with raft-rs's `eraftpb` types (see the crate docs for the field
//! check).

/// The record types of etcd's WAL (`wal/wal.go`).
pub mod record_type {
    /// `etcdserverpb.Metadata`: node and cluster id, at the head of every segment.
    pub const METADATA: i64 = 1;
    /// `raftpb.Entry`.
    pub const ENTRY: i64 = 2;
    /// `raftpb.HardState`.
    pub const STATE: i64 = 3;
    /// The rolling CRC carried into a new segment (the record's `crc`; no data).
    pub const CRC: i64 = 4;
    /// `walpb.Snapshot`: a snapshot was taken at (index, term).
    pub const SNAPSHOT: i64 = 5;
}

/// `walpb.Record`: one framed WAL record.
#[derive(Clone, PartialEq, prost::Message)]
pub struct Record {
    /// One of [`record_type`].
    #[prost(int64, tag = "1")]
    pub r#type: i64,
    /// The rolling CRC-32C of every record's data up to and including this one (for a crc
    /// record: the CRC carried over).
    #[prost(uint32, tag = "2")]
    pub crc: u32,
    /// The encoded message.
    #[prost(bytes = "vec", tag = "3")]
    pub data: Vec<u8>,
}

/// `walpb.Snapshot`: the mark a snapshot record carries.
#[derive(Clone, PartialEq, prost::Message)]
pub struct WalSnapshot {
    /// The snapshot's raft index.
    #[prost(uint64, tag = "1")]
    pub index: u64,
    /// The snapshot's raft term.
    #[prost(uint64, tag = "2")]
    pub term: u64,
    /// `raftpb.ConfState`, written by etcd 3.5 and later; kept encoded and decoded with
    /// raft-rs's `ConfState`.
    #[prost(bytes = "vec", optional, tag = "3")]
    pub conf_state: Option<Vec<u8>>,
}

/// `snappb.snapshot`: the content of a `.snap` file.
#[derive(Clone, PartialEq, prost::Message)]
pub struct SnapFile {
    /// CRC-32C of `data`.
    #[prost(uint32, tag = "1")]
    pub crc: u32,
    /// An encoded `raftpb.Snapshot`.
    #[prost(bytes = "vec", tag = "2")]
    pub data: Vec<u8>,
}

/// `etcdserverpb.Metadata`: what etcd stores as the WAL's metadata.
#[derive(Clone, PartialEq, prost::Message)]
pub struct Metadata {
    /// The member's id.
    #[prost(uint64, tag = "1")]
    pub node_id: u64,
    /// The cluster's id.
    #[prost(uint64, tag = "2")]
    pub cluster_id: u64,
}
