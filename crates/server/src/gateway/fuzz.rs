//! Fuzzing of the JSON gateway's request decoding (issue 20): a client's body goes through
//! Go's scanner ([`gojson`]), the tree reader and jsonpb's rules ([`jsonpb`]), whole or in
//! chunks, and must give Go's error text, never a panic, a stack overflow (nesting is bounded
//! as Go's is, and the deepest value must still fit a tokio worker's 2 MiB stack) or a loop.
//! Corpus: `crates/server/fuzz-corpus/gateway-json/`, request bodies as etcd's clients send
//! them (`ETCDRS_FUZZ_REGEN=1` rewrites them). Runner and knobs: `etcdrs-fuzz`.

use std::convert::Infallible;

use axum::body::Body;
use etcdrs_fuzz::Fuzz;
use etcdrs_proto::etcdserverpb::{
    LeaseKeepAliveRequest, PutRequest, RangeRequest, TxnRequest, WatchRequest,
};

use super::{JsonReader, gojson, jsonpb};

/// Bodies of the kinds etcd's gateway takes: puts, ranges, nested transactions, watch and
/// keep-alive streams, with Go's number, string and escape forms.
fn bodies() -> Vec<(&'static str, Vec<u8>)> {
    vec![
        ("put", br#"{"key":"Zm9v","value":"YmFy","lease":"7587862072469785346","prev_kv":true}"#.to_vec()),
        ("range", br#"{"key":"AA==","range_end":"AA==","limit":10,"revision":"-1","sort_order":"DESCEND","keys_only":true}"#.to_vec()),
        ("txn", br#"{"compare":[{"result":"EQUAL","target":"VALUE","key":"Zm9v","value":"YmFy"},{"target":"MOD","key":"YQ==","mod_revision":"12"}],"success":[{"request_put":{"key":"Zm9v","value":"YmF6"}},{"request_range":{"key":"Zm9v"}}],"failure":[{"request_delete_range":{"key":"Zm9v","prev_kv":true}}]}"#.to_vec()),
        ("watch-stream", br#"{"create_request":{"key":"Zm9v","range_end":"Zm9w","start_revision":3,"filters":["NOPUT"],"progress_notify":true}} {"progress_request":{}}{"cancel_request":{"watch_id":"1"}}"#.to_vec()),
        ("keepalive-stream", b"{\"ID\":7587862072469785346}\n{\"ID\":\"12\"} {\"ID\":1.5e3} null".to_vec()),
        ("escapes", br#"{"key":"\u00e9\ud83d\ude00\n\"\\\/","value":null,"ignored":{"a":[1,-0.5e-7,true,false,null]}}"#.to_vec()),
        ("nested-txn", nested_txn(50)),
        ("deep-txn", nested_txn(150)),
        ("deep-array", deep(2_500)),
    ]
}

/// An array nested `depth` deep.
fn deep(depth: usize) -> Vec<u8> {
    let mut body = "[".repeat(depth);
    body.push_str(&"]".repeat(depth));
    body.into_bytes()
}

/// Transactions nested `levels` deep: three JSON levels each.
fn nested_txn(levels: usize) -> Vec<u8> {
    let mut body = r#"{"success":[{"request_txn":"#.repeat(levels);
    body.push_str("{}");
    body.push_str(&"}]}".repeat(levels));
    body.into_bytes()
}

/// The tokens the mutations splice in: JSON's punctuation and literals, escapes that Go
/// treats specially, numbers at the edges of int64 and float64.
const TOKENS: &[&[u8]] = &[
    b"{",
    b"}",
    b"[",
    b"]",
    b":",
    b",",
    b"\"",
    b"\\",
    b"\\u",
    b"\\ud800",
    b"\\udc00",
    b"null",
    b"true",
    b"false",
    b"-",
    b"0",
    b"1e999",
    b"-1e-999",
    b"9223372036854775808",
    b"-9223372036854775809",
    b"18446744073709551616",
    b"0.0000001",
    b"\"AAAA\"",
    b"\"====\"",
    b"\"request_txn\":",
    b"\"success\":[",
    b"\xff",
    b"\xc3\xa9",
    b"\x00",
];

/// The body through `JsonReader` in two chunks, as requests of type `T` until the body ends
/// or a value fails.
fn read_all<T: prost::Message + prost::Name + Default>(
    runtime: &tokio::runtime::Runtime,
    input: &[u8],
) {
    let split = input.len() / 3;
    let chunks: Vec<Result<Vec<u8>, Infallible>> =
        vec![Ok(input[..split].to_vec()), Ok(input[split..].to_vec())];
    let mut reader = JsonReader::new(Body::from_stream(futures::stream::iter(chunks)), 1 << 20);
    runtime.block_on(async {
        // Each value takes at least one byte, so the body ends within len + 1 reads.
        for _ in 0..=input.len() {
            match reader.next::<T>().await {
                Some(Ok(_)) => {}
                Some(Err(_)) | None => return,
            }
        }
        panic!("JsonReader yielded more values than the body has bytes");
    });
}

#[test]
fn fuzz_gateway_json() {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .build()
        .expect("a current-thread runtime");
    let mut fuzz = Fuzz::new("gateway-json")
        .corpus_dir(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/fuzz-corpus/gateway-json"
        ))
        .dictionary(TOKENS)
        .max_len(24 * 1024)
        .iterations(1500);
    for (name, body) in bodies() {
        fuzz = fuzz.input(name, body);
    }
    fuzz.run(|input| {
        if let Ok(json) = gojson::parse(input) {
            let _ = jsonpb::decode::<TxnRequest>(&json);
            let _ = jsonpb::decode::<RangeRequest>(&json);
        }
        read_all::<TxnRequest>(&runtime, input);
        read_all::<PutRequest>(&runtime, input);
        read_all::<WatchRequest>(&runtime, input);
        read_all::<LeaseKeepAliveRequest>(&runtime, input);
    });
}

/// Found by this fuzzer: Go's scanner admits 10,000 levels of nesting, and a body that used
/// them (9,999 nested arrays for any RPC, or 3,300 transactions nested in one another for
/// `/v3/kv/txn`) overflowed the stack of the task decoding it, which aborts the whole server:
/// the tree reader and the drop of the tree recursed once per level, jsonpb once per message.
/// The tree is now read and dropped with explicit stacks, and messages nest at most as deep
/// as prost decodes them on the gRPC port (100), with prost's text.
#[test]
fn deepest_bodies_are_errors_not_stack_overflows() {
    let json = gojson::parse(&deep(9_999)).expect("Go's scanner accepts 9,999 levels");
    assert_eq!(
        jsonpb::decode::<PutRequest>(&json).expect_err("an array is no PutRequest"),
        "json: cannot unmarshal array into Go value of type map[string]json.RawMessage"
    );
    let json = gojson::parse(&nested_txn(3_300)).expect("9,901 levels scan");
    assert_eq!(
        jsonpb::decode::<TxnRequest>(&json).expect_err("too deep for prost"),
        "failed to decode Protobuf message: recursion limit reached"
    );
    let json = gojson::parse(&nested_txn(49)).expect("49 nested transactions scan");
    jsonpb::decode::<TxnRequest>(&json).expect("prost decodes 99 nested messages");
    let json = gojson::parse(&nested_txn(50)).expect("50 nested transactions scan");
    jsonpb::decode::<TxnRequest>(&json).expect_err("101 nested messages are too deep");
}
