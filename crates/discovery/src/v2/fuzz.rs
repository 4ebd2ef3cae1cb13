//! Fuzzing of what a v2 discovery service answers (issue 20): the JSON of a keys response or
//! error, the registrations in it and the `--initial-cluster` string built from their
//! values, and the SRV targets' URLs, all from outside the cluster, must give an error, never
//! a panic. Corpus: `crates/discovery/fuzz-corpus/v2-response/`, responses as etcd's v2 keys
//! API and discovery.etcd.io send them (`ETCDRS_FUZZ_REGEN=1` rewrites them). Runner and
//! knobs: `etcdrs-fuzz`.

use etcdrs_fuzz::Fuzz;
use hyper::StatusCode;

use super::{Reply, nodes_to_cluster, proxy_host_port, registry_of, reply};
use crate::registry::check_urls_map;
use crate::srv::SrvTarget;

const RESPONSES: &[(&str, &str)] = &[
    (
        "size",
        r#"{"action":"get","node":{"key":"/_etcd/registry/tok/_config/size","value":"3","modifiedIndex":5,"createdIndex":5}}"#,
    ),
    (
        "registrations",
        r#"{"action":"get","node":{"key":"/_etcd/registry/tok","dir":true,"nodes":[{"key":"/_etcd/registry/tok/_config","dir":true,"modifiedIndex":5,"createdIndex":5},{"key":"/_etcd/registry/tok/8e9e05c52164694d","value":"m1=http://127.0.0.1:2380","modifiedIndex":7,"createdIndex":7},{"key":"/_etcd/registry/tok/91bc3c398fb3c146","value":"m2=https://[::1]:2380,m2=unix://sock:1","modifiedIndex":9,"createdIndex":8}],"modifiedIndex":5,"createdIndex":5}}"#,
    ),
    (
        "key-not-found",
        r#"{"errorCode":100,"message":"Key not found","cause":"/_etcd/registry/tok/_config/size","index":12}"#,
    ),
    (
        "node-exist",
        r#"{"errorCode":105,"message":"Key already exists","cause":"/tok/8e9e05c52164694d","index":13}"#,
    ),
];

/// Everything the v2 client does with a response body, under both kinds of status.
fn interpret(body: &[u8]) {
    for status in [StatusCode::OK, StatusCode::NOT_FOUND] {
        let Ok(Reply::Node(node, _)) = reply(status, 7, body) else {
            continue;
        };
        let _ = node.value.parse::<u64>();
        let registry = registry_of(node);
        for size in [0, 1, registry.len(), registry.len() + 1] {
            let _ = nodes_to_cluster(&registry, size);
            let _ = registry.is_full_for("8e9e05c52164694d", size);
        }
    }
    // The same bytes as a cluster string, a proxy and an SRV target's host.
    let text = String::from_utf8_lossy(body);
    let _ = check_urls_map(&text);
    let _ = proxy_host_port(&text);
    let target = SrvTarget {
        host: text.into_owned(),
        port: 2380,
        priority: 0,
        weight: 0,
        addrs: vec![std::net::Ipv4Addr::LOCALHOST.into()],
    };
    let _ = check_urls_map(&format!("m1=https://{}", target.host_port()));
    let _ = target.socket_addrs();
}

#[test]
fn fuzz_v2_discovery_responses() {
    let mut fuzz = Fuzz::new("discovery-v2")
        .corpus_dir(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/fuzz-corpus/v2-response"
        ))
        .dictionary(crate::CLUSTER_STRING_TOKENS)
        .dictionary(&[
            b"\"nodes\":[",
            b"\"value\":\"",
            b"\"createdIndex\":18446744073709551615",
            b"\"errorCode\":",
            b"{",
            b"}",
            b"\\u0000",
        ])
        .iterations(1500);
    for (name, body) in RESPONSES {
        fuzz = fuzz.input(name, body.as_bytes().to_vec());
    }
    fuzz.input(
        "cluster-string",
        b"m1=http://10.0.0.1:2380,m2=https://host:2380".to_vec(),
    )
    .run(interpret);
}
