//! etcd's wire protocol for etcd-rs: the generated protobuf messages and
//! tonic clients/servers of the etcd v3 API, plus [`rpctypes`], the table of
//! gRPC errors (code and exact message) that etcd servers send.
//!
//! This crate is a leaf. It depends only on prost and tonic and holds no
//! logic beyond the generated codecs, the error table and the two wire
//! conventions every side shares (prefix range ends, `grpc-message`
//! decoding); servers, proxies and clients build on it.
//!
//! It mirrors these etcd packages (message names, field numbers and enum
//! values are identical, so stock etcd clients interoperate):
//!
//! | module | etcd package |
//! |---|---|
//! | [`etcdserverpb`] | `api/etcdserverpb` (`rpc.proto`: KV, Watch, Lease, Cluster, Maintenance, Auth) |
//! | [`mvccpb`] | `api/mvccpb` (`KeyValue`, `Event`) |
//! | [`authpb`] | `api/authpb` (`User`, `Role`, `Permission`, `UserAddOptions`) |
//! | [`v3lockpb`] | `server/etcdserver/api/v3lock/v3lockpb` (Lock service) |
//! | [`v3electionpb`] | `server/etcdserver/api/v3election/v3electionpb` (Election service) |
//! | [`rpctypes`] | `api/v3rpc/rpctypes` (gRPC errors, and `grpc-message` decoding) |
//! | [`raft_internal`] | `etcdserverpb/raft_internal.proto`, v2 `Request`, `membershippb`, `membership.Member` JSON (raft entry payloads) |
//! | [`keys`] | `clientv3.GetPrefixRangeEnd` (the end of a prefix's range) |
//! | [`fanout`] | (etcd-rs) `WatchResponse` with pre-encoded events, and a Watch service sending it |
//!
//! Each service `Foo` yields a `foo_server` module (trait `Foo`, wrapper
//! `FooServer`) and a `foo_client` module (`FooClient`). These, [`rpctypes`] and [`fanout`]
//! come with the `grpc` feature (on by default); without it the crate is the messages alone,
//! linking no network crate, as the storage crates use it.
#![deny(missing_docs)]

/// The compiled descriptors of every message above (a `FileDescriptorSet`), for code that reads
/// messages by their descriptors: the JSON gateway's jsonpb decoding.
pub const FILE_DESCRIPTOR_SET: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/descriptors.bin"));

#[cfg(feature = "grpc")]
pub mod fanout;
pub mod keys;
pub mod raft_internal;
#[cfg(feature = "grpc")]
pub mod rpctypes;

/// Multi-version store records: `KeyValue` and `Event` (etcd `mvccpb`).
#[allow(missing_docs, clippy::all, clippy::pedantic)]
pub mod mvccpb {
    include!(concat!(env!("OUT_DIR"), "/mvccpb.rs"));
}

/// Auth store records: users, roles and permissions (etcd `authpb`).
#[allow(missing_docs, clippy::all, clippy::pedantic)]
pub mod authpb {
    include!(concat!(env!("OUT_DIR"), "/authpb.rs"));
}

/// The etcd v3 client API services and messages (etcd `etcdserverpb`).
#[allow(missing_docs, clippy::all, clippy::pedantic)]
pub mod etcdserverpb {
    include!(concat!(env!("OUT_DIR"), "/etcdserverpb.rs"));
}

/// The Lock service (etcd `v3lockpb`).
#[allow(missing_docs, clippy::all, clippy::pedantic)]
pub mod v3lockpb {
    include!(concat!(env!("OUT_DIR"), "/v3lockpb.rs"));
}

/// The Election service (etcd `v3electionpb`).
#[allow(missing_docs, clippy::all, clippy::pedantic)]
pub mod v3electionpb {
    include!(concat!(env!("OUT_DIR"), "/v3electionpb.rs"));
}

#[cfg(test)]
mod tests {
    use prost::Message;

    use super::etcdserverpb::{
        Compare, RangeRequest, RangeResponse, ResponseHeader, WatchResponse, compare,
    };
    use super::mvccpb::{Event, KeyValue, event::EventType};

    #[test]
    fn range_request_uses_etcd_field_numbers() {
        let req = RangeRequest {
            key: b"a".to_vec(),
            range_end: b"b".to_vec(),
            limit: 3,
            revision: 4,
            ..Default::default()
        };
        let bytes = req.encode_to_vec();
        // tag = field << 3 | wire type (2 = length-delimited, 0 = varint)
        assert_eq!(
            bytes,
            [0x0a, 0x01, b'a', 0x12, 0x01, b'b', 0x18, 0x03, 0x20, 0x04]
        );
        assert_eq!(RangeRequest::decode(bytes.as_slice()).unwrap(), req);
    }

    #[test]
    fn compare_range_end_is_field_64() {
        let cmp = Compare {
            range_end: b"z".to_vec(),
            target_union: Some(compare::TargetUnion::Lease(5)),
            ..Default::default()
        };
        let bytes = cmp.encode_to_vec();
        // field 8 varint, then field 64 length-delimited (tag 514 = 0x82 0x04).
        assert_eq!(bytes, [0x40, 0x05, 0x82, 0x04, 0x01, b'z']);
    }

    #[test]
    fn nested_mvccpb_types_round_trip() {
        let kv = KeyValue {
            key: b"k".to_vec(),
            create_revision: 2,
            mod_revision: 3,
            version: 1,
            value: b"v".to_vec(),
            lease: 0,
        };
        let resp = RangeResponse {
            header: Some(ResponseHeader {
                cluster_id: 1,
                member_id: 2,
                revision: 3,
                raft_term: 4,
            }),
            kvs: vec![kv.clone()],
            more: false,
            count: 1,
        };
        let bytes = resp.encode_to_vec();
        assert_eq!(RangeResponse::decode(bytes.as_slice()).unwrap(), resp);

        let watch = WatchResponse {
            events: vec![Event {
                r#type: EventType::Delete as i32,
                kv: Some(kv),
                prev_kv: None,
            }],
            ..Default::default()
        };
        let bytes = watch.encode_to_vec();
        // events is field 11, length-delimited: tag 0x5a.
        assert_eq!(bytes[0], 0x5a);
        assert_eq!(WatchResponse::decode(bytes.as_slice()).unwrap(), watch);
    }

    #[test]
    fn range_stream_response_is_etcds_wire_format() {
        use super::etcdserverpb::{RangeResponse, RangeStreamResponse};
        // range_response is field 1, length-delimited (tag 0x0a); inside, count is field 4.
        let message = RangeStreamResponse {
            range_response: Some(RangeResponse {
                count: 3,
                ..Default::default()
            }),
        };
        assert_eq!(message.encode_to_vec(), [0x0a, 0x02, 0x20, 0x03]);
        assert_eq!(
            RangeStreamResponse::decode(&[0x0a, 0x02, 0x20, 0x03][..]).unwrap(),
            message
        );
    }

    #[cfg(feature = "grpc")]
    #[test]
    fn services_generate_clients_and_servers() {
        use super::etcdserverpb::{
            auth_client::AuthClient, auth_server::AuthServer, cluster_client::ClusterClient,
            cluster_server::ClusterServer, kv_client::KvClient, kv_server::KvServer,
            lease_client::LeaseClient, lease_server::LeaseServer,
            maintenance_client::MaintenanceClient, maintenance_server::MaintenanceServer,
            watch_client::WatchClient, watch_server::WatchServer,
        };
        use super::v3electionpb::{
            election_client::ElectionClient, election_server::ElectionServer,
        };
        use super::v3lockpb::{lock_client::LockClient, lock_server::LockServer};

        let names = [
            std::any::type_name::<KvServer<()>>(),
            std::any::type_name::<KvClient<()>>(),
            std::any::type_name::<WatchServer<()>>(),
            std::any::type_name::<WatchClient<()>>(),
            std::any::type_name::<LeaseServer<()>>(),
            std::any::type_name::<LeaseClient<()>>(),
            std::any::type_name::<ClusterServer<()>>(),
            std::any::type_name::<ClusterClient<()>>(),
            std::any::type_name::<MaintenanceServer<()>>(),
            std::any::type_name::<MaintenanceClient<()>>(),
            std::any::type_name::<AuthServer<()>>(),
            std::any::type_name::<AuthClient<()>>(),
            std::any::type_name::<LockServer<()>>(),
            std::any::type_name::<LockClient<()>>(),
            std::any::type_name::<ElectionServer<()>>(),
            std::any::type_name::<ElectionClient<()>>(),
        ];
        assert!(names.iter().all(|n| !n.is_empty()));
    }
}
