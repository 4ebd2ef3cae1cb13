//! Fuzzing of what a v3 discovery service answers (issue 20): the gRPC messages of its
//! ranges (the size key, the members) and of the `members/` watch, decoded as tonic decodes
//! them and read as v3 discovery reads them (the size, the registrations, the full-cluster
//! rule and the `--initial-cluster` string made of them), must give an error, never a panic.
//! Corpus: `crates/discovery/fuzz-corpus/v3-response/`, responses as etcd 3.6 sends them
//! (`ETCDRS_FUZZ_REGEN=1` rewrites them). Runner and knobs: `etcdrs-fuzz`.

use etcdrs_fuzz::Fuzz;
use etcdrs_proto::etcdserverpb::{RangeResponse, ResponseHeader, WatchResponse};
use etcdrs_proto::mvccpb::{Event, KeyValue};
use prost::Message;

use super::{Keys, add_watched, finish, members_from, size_from};
use crate::registry::Registry;

fn kv(key: &str, value: &str, created: i64) -> KeyValue {
    KeyValue {
        key: key.as_bytes().to_vec(),
        value: value.as_bytes().to_vec(),
        create_revision: created,
        mod_revision: created,
        version: 1,
        lease: 0,
    }
}

fn header(revision: i64) -> Option<ResponseHeader> {
    Some(ResponseHeader {
        cluster_id: 0x1c0d_6bd4_e2a3_1c3f,
        member_id: 0x8e9e_05c5_2164_694d,
        revision,
        raft_term: 2,
    })
}

/// Responses as an etcd 3.6 discovery cluster answers a member of token `tok`.
fn seeds() -> Vec<(&'static str, Vec<u8>)> {
    let size = RangeResponse {
        header: header(5),
        kvs: vec![kv("/_etcd/registry/tok/_config/size", "3", 5)],
        more: false,
        count: 1,
    };
    let members = RangeResponse {
        header: header(9),
        kvs: vec![
            kv(
                "/_etcd/registry/tok/members/8e9e05c52164694d",
                "m1=http://127.0.0.1:2380",
                7,
            ),
            kv(
                "/_etcd/registry/tok/members/91bc3c398fb3c146",
                "m2=https://[::1]:2380,m2=unix://sock:1",
                8,
            ),
        ],
        more: false,
        count: 2,
    };
    let watched = WatchResponse {
        header: header(10),
        watch_id: 0,
        events: vec![Event {
            r#type: 0,
            kv: Some(kv(
                "/_etcd/registry/tok/members/fd422379fda50e48",
                "m3=http://127.0.0.1:2382",
                10,
            )),
            prev_kv: None,
        }],
        ..WatchResponse::default()
    };
    let canceled = WatchResponse {
        header: header(10),
        canceled: true,
        compact_revision: 4,
        cancel_reason: "mvcc: required revision has been compacted".to_owned(),
        ..WatchResponse::default()
    };
    vec![
        ("range-size", size.encode_to_vec()),
        ("range-members", members.encode_to_vec()),
        ("watch-put", watched.encode_to_vec()),
        ("watch-canceled", canceled.encode_to_vec()),
    ]
}

/// Everything v3 discovery does with a response's bytes, as each kind of response.
fn interpret(bytes: &[u8]) {
    let keys = Keys::new("tok", 0x8e9e_05c5_2164_694d);
    let mut sizes = vec![0, 1, 3];
    if let Ok(resp) = RangeResponse::decode(bytes) {
        if let Some(size) = size_from(&resp) {
            sizes.push(size);
        }
        let (registry, _revision) = members_from(resp);
        read_registry(&registry, &keys, &sizes);
    }
    if let Ok(resp) = WatchResponse::decode(bytes) {
        let mut registry = Registry::default();
        let _ = add_watched(&mut registry, resp);
        read_registry(&registry, &keys, &sizes);
    }
}

fn read_registry(registry: &Registry, keys: &Keys, sizes: &[usize]) {
    for &size in sizes
        .iter()
        .chain([registry.len(), registry.len() + 1].iter())
    {
        let _ = registry.is_full_for(&keys.this, size);
        let _ = finish(registry, size);
    }
}

#[test]
fn fuzz_v3_discovery_responses() {
    let mut fuzz = Fuzz::new("discovery-v3")
        .corpus_dir(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/fuzz-corpus/v3-response"
        ))
        .dictionary(crate::CLUSTER_STRING_TOKENS)
        .dictionary(&[
            b"/_etcd/registry/tok/members/",
            b"\xff\xff\xff\xff\xff\xff\xff\xff\xff\x01",
        ])
        .max_len(8 * 1024)
        .iterations(1500);
    for (name, bytes) in seeds() {
        fuzz = fuzz.input(name, bytes);
    }
    fuzz.run(interpret);
}
