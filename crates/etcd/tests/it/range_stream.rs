//! etcd 3.7's `KV.RangeStream` (issue 43), over a raw tonic client of our proto (the
//! `etcd-client` crate lacks the RPC): the messages merged as protobuf merges them equal the
//! unary Range at the same revision, only the last message carries the header, `more` and
//! `count`, the errors are etcd 3.7's, and a reader that stops reading stops the member's
//! reads (the member buffers a few pages, not the result: seen in how far a stream gets after
//! a compaction, and in the member's RSS under readers that stopped). Against a server without the RPC
//! (etcd 3.4 named by `ETCDRS_TEST_ETCD_BIN`) each test checks the Unimplemented answer that
//! clients fall back on.

use std::time::Duration;

use etcdrs_proto::etcdserverpb::kv_client::KvClient;
use etcdrs_proto::etcdserverpb::range_request::{SortOrder, SortTarget};
use etcdrs_proto::etcdserverpb::request_op::Request as OpRequest;
use etcdrs_proto::etcdserverpb::{
    CompactionRequest, DeleteRangeRequest, PutRequest, RangeRequest, RangeResponse, RequestOp,
    TxnRequest,
};
use etcdrs_testkit::{Code, Member, http_request};
use tonic::transport::Channel;

/// A raw KV client of the member's client port.
async fn kv(member: &Member) -> KvClient<Channel> {
    let channel = tonic::transport::Endpoint::from_shared(member.endpoint())
        .expect("endpoint")
        .connect_timeout(Duration::from_secs(5))
        .connect()
        .await
        .expect("connect");
    KvClient::new(channel).max_decoding_message_size(64 * 1024 * 1024)
}

/// Puts `n` keys `<prefix><i>` (zero-padded) with values of `value_len(i)` bytes,
/// `per_txn` in each txn; returns the revision of the last write.
async fn seed(
    client: &mut KvClient<Channel>,
    prefix: &str,
    (n, per_txn): (usize, usize),
    value_len: impl Fn(usize) -> usize,
) -> i64 {
    let mut revision = 0;
    let keys: Vec<usize> = (0..n).collect();
    for batch in keys.chunks(per_txn) {
        let success = batch
            .iter()
            .map(|&i| RequestOp {
                request: Some(OpRequest::RequestPut(PutRequest {
                    key: format!("{prefix}{i:06}").into_bytes(),
                    value: vec![b'a' + (i % 26) as u8; value_len(i)].into(),
                    ..Default::default()
                })),
            })
            .collect();
        let txn = TxnRequest {
            success,
            ..Default::default()
        };
        let resp = client.txn(txn).await.expect("seed txn").into_inner();
        revision = resp.header.expect("header").revision;
    }
    revision
}

/// What a stream gave: its messages, and their merge (protobuf's merge of `RangeResponse`:
/// `kvs` appended, a set scalar or header replacing the earlier).
struct Streamed {
    messages: Vec<RangeResponse>,
    merged: RangeResponse,
}

/// Calls RangeStream with `req` and reads it to its end.
async fn range_stream(
    client: &mut KvClient<Channel>,
    req: RangeRequest,
) -> Result<Streamed, tonic::Status> {
    let mut stream = client.range_stream(req).await?.into_inner();
    let mut messages = Vec::new();
    while let Some(message) = stream.message().await? {
        messages.push(
            message
                .range_response
                .expect("a range_response in every message"),
        );
    }
    let mut merged = RangeResponse::default();
    for message in &messages {
        merged.kvs.extend(message.kvs.iter().cloned());
        if message.header.is_some() {
            merged.header = message.header;
        }
        merged.more |= message.more;
        if message.count != 0 {
            merged.count = message.count;
        }
    }
    Ok(Streamed { messages, merged })
}

/// Whether the server under test has no RangeStream (etcd before 3.7): then it must answer
/// Unimplemented, the code clients fall back on, and the caller's test ends there.
async fn unsupported(client: &mut KvClient<Channel>) -> bool {
    if crate::ours() {
        return false;
    }
    let Err(status) = range_stream(client, range(b"k", b"")).await else {
        panic!("a server without RangeStream refuses it");
    };
    assert_eq!(status.code(), Code::Unimplemented, "{status:?}");
    true
}

fn range(key: &[u8], end: &[u8]) -> RangeRequest {
    RangeRequest {
        key: key.to_vec(),
        range_end: end.to_vec(),
        ..Default::default()
    }
}

/// A RangeStream merged equals the unary Range of the same request at the same revision, for
/// thousands of keys over many messages, with a limit, keys only, count only, a prefix, all
/// keys, an older revision and serializable; only the last message has header, more and count.
#[tokio::test]
async fn range_stream_equals_range_at_the_same_revision() {
    let (member, _client) = crate::start().await;
    let mut client = kv(&member).await;
    if unsupported(&mut client).await {
        return;
    }
    // 3000 keys of 100-700 bytes under "p/", and keys around them.
    let half = seed(&mut client, "p/", (1500, 100), |i| 100 + (i * 37) % 600).await;
    seed(&mut client, "p/", (3000, 100), |i| 100 + (i * 41) % 600).await;
    seed(&mut client, "a/", (5, 5), |_| 10).await;
    seed(&mut client, "q/", (5, 5), |_| 10).await;
    client
        .delete_range(DeleteRangeRequest {
            key: b"p/000100".to_vec(),
            range_end: b"p/000200".to_vec(),
            ..Default::default()
        })
        .await
        .expect("delete");

    let prefix = |edit: fn(&mut RangeRequest)| {
        let mut req = range(b"p/", b"p0");
        edit(&mut req);
        req
    };
    let cases: Vec<(&str, RangeRequest, usize)> = vec![
        ("the prefix", prefix(|_| {}), 2900),
        ("every key", range(b"\0", b"\0"), 2910),
        ("from a key", range(b"p/002000", b"\0"), 1005),
        ("limit below the total", prefix(|r| r.limit = 1234), 1234),
        ("limit at the total", prefix(|r| r.limit = 2900), 2900),
        ("limit above the total", prefix(|r| r.limit = 5000), 2900),
        ("limit within the first page", prefix(|r| r.limit = 3), 3),
        ("keys only", prefix(|r| r.keys_only = true), 2900),
        ("count only", prefix(|r| r.count_only = true), 0),
        (
            "count only with a limit",
            prefix(|r| {
                r.count_only = true;
                r.limit = 10;
            }),
            0,
        ),
        ("serializable", prefix(|r| r.serializable = true), 2900),
        (
            "key order, ascending",
            prefix(|r| {
                r.sort_order = SortOrder::Ascend as i32;
                r.sort_target = SortTarget::Key as i32;
            }),
            2900,
        ),
        ("one key", range(b"p/000007", b""), 1),
        ("a missing key", range(b"p/000150", b""), 0),
        ("an empty range", range(b"p/2", b"p/1"), 0),
        (
            "a range with nothing in it",
            range(b"p/000100", b"p/000200"),
            0,
        ),
    ];
    for (what, req, n_keys) in cases {
        let streamed = range_stream(&mut client, req.clone())
            .await
            .unwrap_or_else(|e| panic!("{what}: {e:?}"));
        let unary = client.range(req.clone()).await.expect("range").into_inner();
        assert_eq!(streamed.merged, unary, "{what}");
        assert_eq!(unary.kvs.len(), n_keys, "{what}");
        let (last, rest) = streamed
            .messages
            .split_last()
            .expect("at least one message");
        assert!(last.header.is_some(), "{what}");
        for message in rest {
            assert!(
                message.header.is_none() && !message.more && message.count == 0,
                "{what}: only the last message has header, more and count"
            );
            assert!(
                !message.kvs.is_empty(),
                "{what}: a message before the last has keys"
            );
        }
        if n_keys > 1000 {
            assert!(
                streamed.messages.len() >= 5,
                "{what}: {} keys came in {} messages",
                n_keys,
                streamed.messages.len()
            );
        }
        if req.count_only {
            assert_eq!(streamed.messages.len(), 1, "{what}");
        }
    }

    // Asking for a leader (`hasleader`) takes the router's path to the same service.
    let mut asked = tonic::Request::new(prefix(|_| {}));
    asked
        .metadata_mut()
        .insert("hasleader", "true".parse().expect("metadata value"));
    let mut stream = client
        .range_stream(asked)
        .await
        .expect("hasleader")
        .into_inner();
    let mut kvs = Vec::new();
    while let Some(message) = stream.message().await.expect("hasleader message") {
        kvs.extend(message.range_response.expect("range_response").kvs);
    }
    let unary = client
        .range(prefix(|_| {}))
        .await
        .expect("range")
        .into_inner();
    assert_eq!(kvs, unary.kvs);

    // At an older revision: the keys as they were, the header at the current revision.
    let old = prefix(|_| {});
    let old = RangeRequest {
        revision: half,
        ..old
    };
    let streamed = range_stream(&mut client, old.clone()).await.expect("old");
    let unary = client.range(old).await.expect("range").into_inner();
    assert_eq!(streamed.merged, unary);
    assert_eq!(unary.kvs.len(), 1500);
    assert!(unary.kvs.iter().all(|kv| kv.mod_revision <= half));
}

/// The errors are etcd 3.7's: Range's for an empty key, a compacted and a future revision
/// (the call's status, before any message), 3.7's invalid sort option, and Unimplemented for
/// the sorts and filters a stream in key order does not serve; the JSON gateway has no path
/// for it, as etcd's.
#[tokio::test]
async fn range_stream_errors_are_etcds() {
    let (member, _client) = crate::start().await;
    let mut client = kv(&member).await;
    if unsupported(&mut client).await {
        return;
    }
    let last = seed(&mut client, "k", (30, 1), |_| 10).await;
    client
        .compact(CompactionRequest {
            revision: last - 10,
            physical: true,
        })
        .await
        .expect("compact");
    let status = |edit: fn(&mut RangeRequest)| {
        let mut req = range(b"k", b"l");
        edit(&mut req);
        req
    };
    let cases: Vec<(RangeRequest, Code, String)> = vec![
        (
            status(|r| r.key.clear()),
            Code::InvalidArgument,
            "etcdserver: key is not provided".into(),
        ),
        (
            RangeRequest {
                revision: last - 11,
                ..range(b"k", b"l")
            },
            Code::OutOfRange,
            "etcdserver: mvcc: required revision has been compacted".into(),
        ),
        (
            RangeRequest {
                revision: last + 1,
                ..range(b"k", b"l")
            },
            Code::OutOfRange,
            "etcdserver: mvcc: required revision is a future revision".into(),
        ),
        (
            status(|r| r.sort_order = 7),
            Code::InvalidArgument,
            "etcdserver: invalid sort option".into(),
        ),
        (
            status(|r| r.sort_order = SortOrder::Descend as i32),
            Code::Unimplemented,
            "RangeStream does not support custom sort orders".into(),
        ),
        (
            status(|r| {
                r.sort_order = SortOrder::Ascend as i32;
                r.sort_target = SortTarget::Create as i32;
            }),
            Code::Unimplemented,
            "RangeStream does not support custom sort orders".into(),
        ),
        (
            status(|r| r.min_mod_revision = 2),
            Code::Unimplemented,
            "RangeStream does not support revision filters".into(),
        ),
        (
            status(|r| r.max_create_revision = 2),
            Code::Unimplemented,
            "RangeStream does not support revision filters".into(),
        ),
    ];
    for (req, code, message) in cases {
        // Refused as the call's answer: the stream does not open.
        let Err(refused) = client.range_stream(req.clone()).await else {
            panic!("{req:?} is refused");
        };
        assert_eq!(
            (refused.code(), refused.message()),
            (code, message.as_str())
        );
    }
    // The revision just at the compaction is still served.
    let at = RangeRequest {
        revision: last - 10,
        ..range(b"k", b"l")
    };
    let streamed = range_stream(&mut client, at.clone()).await.expect("at");
    assert_eq!(
        streamed.merged,
        client.range(at).await.expect("range").into_inner()
    );

    // No JSON gateway path: answered as any path the gateway does not know.
    let body = br#"{"key":"aw=="}"#;
    let addr = member.client_addr();
    let stream = http_request(&addr, "POST", "/v3/kv/rangestream", &[], body)
        .await
        .expect("gateway answers");
    let unknown = http_request(&addr, "POST", "/v3/kv/nosuchcall", &[], body)
        .await
        .expect("gateway answers");
    assert_eq!(
        (stream.status, &stream.body),
        (unknown.status, &unknown.body)
    );
    assert_eq!(stream.status, 404);
}

/// Later pages read at the first page's revision, and a reader that stops reading stops the
/// member's reads: with pages of at most 64 KiB (`--max-request-bytes`, the page budget) and a
/// reader whose HTTP/2 windows stay at 64 KiB, writes made after the first message are not in
/// the later ones, and a compaction made after it fails the stream once the reader resumes,
/// after no more keys than the member could hold unread: what the reader's 64 KiB window
/// admits, the chunk hyper holds until the window opens and the page tonic encodes (a page of
/// 64 KiB each), the first message, and at most h2's send buffer for the stream (hyper's
/// 400 KiB): well under 1000 of the 8000 keys of 1 KiB (about 150 in our runs). A member that
/// read the whole result ahead (checked by making it so) delivers all of them and ends without
/// an error.
#[tokio::test]
async fn later_pages_read_at_the_first_pages_revision_and_wait_for_the_reader() {
    const KEYS: usize = 8000;
    let (member, _client) = crate::start_with(&["--max-request-bytes", "65536"]).await;
    let mut writer = kv(&member).await;
    if unsupported(&mut writer).await {
        return;
    }
    seed(&mut writer, "s/", (KEYS, 50), |_| 1000).await;
    let channel = tonic::transport::Endpoint::from_shared(member.endpoint())
        .expect("endpoint")
        .initial_stream_window_size(65_535)
        .initial_connection_window_size(65_535)
        .connect()
        .await
        .expect("connect");
    let mut reader = KvClient::new(channel);
    let whole = range(b"s/", b"s0");

    // Writes after the first message: the stream still gives the result at its revision.
    let mut stream = reader
        .range_stream(whole.clone())
        .await
        .expect("stream")
        .into_inner();
    let first = stream
        .message()
        .await
        .expect("first message")
        .and_then(|m| m.range_response)
        .expect("a first message");
    let pinned = writer
        .range(range(b"s/000000", b""))
        .await
        .expect("range")
        .into_inner()
        .header
        .expect("header")
        .revision;
    writer
        .delete_range(DeleteRangeRequest {
            key: b"s/007000".to_vec(),
            range_end: b"s/007100".to_vec(),
            ..Default::default()
        })
        .await
        .expect("delete");
    for key in ["s/007999", "s/007500a"] {
        writer
            .put(PutRequest {
                key: key.into(),
                value: b"written after the first message".to_vec().into(),
                ..Default::default()
            })
            .await
            .expect("put");
    }
    let mut kvs = first.kvs;
    let mut last = None;
    while let Some(message) = stream.message().await.expect("message") {
        let message = message.range_response.expect("range_response");
        kvs.extend(message.kvs.iter().cloned());
        last = Some(message);
    }
    let last = last.expect("more than one message");
    let then = writer
        .range(RangeRequest {
            revision: pinned,
            ..whole.clone()
        })
        .await
        .expect("range at the stream's revision")
        .into_inner();
    assert_eq!(kvs.len(), KEYS);
    assert_eq!(kvs, then.kvs);
    assert_eq!((last.count, last.more), (KEYS as i64, false));
    assert_eq!(last.header.expect("header").revision, pinned);

    // A compaction after the first message: the stream fails at the first page read after
    // it, having delivered only what the member had read ahead.
    let mut stream = reader
        .range_stream(whole.clone())
        .await
        .expect("stream")
        .into_inner();
    let first = stream
        .message()
        .await
        .expect("first message")
        .and_then(|m| m.range_response)
        .expect("a first message");
    let head = writer
        .put(PutRequest {
            key: b"t".to_vec(),
            value: b"v".to_vec().into(),
            ..Default::default()
        })
        .await
        .expect("put")
        .into_inner()
        .header
        .expect("header")
        .revision;
    writer
        .compact(CompactionRequest {
            revision: head,
            physical: true,
        })
        .await
        .expect("compact");
    let mut received = first.kvs.len();
    let failed = loop {
        match stream.message().await {
            Ok(Some(message)) => received += message.range_response.expect("range").kvs.len(),
            Ok(None) => panic!("the stream ended after {received} keys, without an error"),
            Err(status) => break status,
        }
    };
    assert_eq!(
        (failed.code(), failed.message()),
        (
            Code::OutOfRange,
            "etcdserver: mvcc: required revision has been compacted"
        )
    );
    assert!(
        received < 1000,
        "the member had read {received} of {KEYS} keys ahead of its reader"
    );
}

/// Readers that stop reading cost the member a few pages each, not their results: eight
/// streams of a 24 MiB result (24,000 keys of 1 KiB, pages up to the default 1.5 MiB), each
/// read to its first message and then left unread on a connection whose HTTP/2 windows stay at
/// 64 KiB, grow the member's resident memory by well under one result (each holds at most what
/// its window admits, the chunk hyper holds and the page being encoded, some 3 MiB); a member
/// that read each result ahead would hold eight of them.
#[tokio::test]
async fn readers_that_stop_reading_cost_pages_not_results() {
    const KEYS: usize = 24_000;
    const READERS: usize = 8;
    let (member, _client) = crate::start().await;
    let mut writer = kv(&member).await;
    if unsupported(&mut writer).await {
        return;
    }
    seed(&mut writer, "r/", (KEYS, 100), |_| 1000).await;
    let pid = member.pid().expect("the member runs");
    let before = etcdrs_testkit::memory::rss_bytes(pid).expect("RSS");
    let mut streams = Vec::new();
    for _ in 0..READERS {
        let channel = tonic::transport::Endpoint::from_shared(member.endpoint())
            .expect("endpoint")
            .initial_stream_window_size(65_535)
            .initial_connection_window_size(65_535)
            .connect()
            .await
            .expect("connect");
        let mut reader = KvClient::new(channel);
        let mut stream = reader
            .range_stream(range(b"r/", b"r0"))
            .await
            .expect("stream")
            .into_inner();
        let first = stream
            .message()
            .await
            .expect("first message")
            .and_then(|m| m.range_response)
            .expect("a first message");
        assert!(!first.kvs.is_empty() && first.header.is_none());
        streams.push((reader, stream, first.kvs.len()));
    }
    // Measured once every reader has its first message (a member that read its results ahead
    // of the first message, checked by making it so, grew by some 210 MiB here; ours by
    // about 4 MiB).
    etcdrs_testkit::memory::assert_rss_flat(
        pid,
        before,
        24 * 1024 * 1024,
        "eight readers of 24 MiB that stopped reading",
    );
    // Each stream still delivers its whole result once read.
    for (_reader, mut stream, mut n) in streams.drain(..2) {
        while let Some(message) = stream.message().await.expect("message") {
            n += message.range_response.expect("range").kvs.len();
        }
        assert_eq!(n, KEYS);
    }
}
