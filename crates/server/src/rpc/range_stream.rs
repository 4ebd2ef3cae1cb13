//! etcd 3.7's `KV.RangeStream` (KEP-5966): a range whose result is sent as a sequence of
//! messages read page by page, so that the member's memory stays a few pages whatever the
//! result's size, where a unary Range holds the whole result, and its encoding, at once.
//!
//! # What etcd's is
//!
//! Read in etcd's sources (v3.7.1 and main, unchanged between them):
//! `api/etcdserverpb/rpc.proto`, `server/etcdserver/api/v3rpc/key.go` (`RangeStream`,
//! `checkRangeStreamRequest`, the header filling), `server/etcdserver/v3_server.go`
//! (`RangeStream`, `rangeStream`, `adjustChunkLimit`), `server/etcdserver/txn/range.go`,
//! `server/proxy/grpcproxy/kv.go`, `client/v3/kv.go` (`GetStream`,
//! `GetStreamToGetResponse`), `etcdctl/ctlv3/command/get_command.go` (`get --stream`) and the
//! tests in `tests/integration/v3_grpc_test.go` (`TestV3RangeStream*`).
//!
//! - **The RPC.** `rpc RangeStream(RangeRequest) returns (stream RangeStreamResponse)` in
//!   service `etcdserverpb.KV` (path `/etcdserverpb.KV/RangeStream`), with
//!   `message RangeStreamResponse { RangeResponse range_response = 1; }`. The request is
//!   Range's own. There is no JSON gateway path ("intentionally gRPC-only").
//! - **Splitting.** Merged in order (`proto.Merge`), the messages give the `RangeResponse` that
//!   Range answers: every message carries the next keys in `kvs`; only the last one has
//!   `header`, `more` and `count` (and the last keys). An empty result is one message with the
//!   header and count 0. A count-only request is one message: header and count.
//! - **Revision.** The first page reads at the request's revision, or at the current one when
//!   it asks none; every later page reads at that same revision, so writes made meanwhile are
//!   not seen. The header's revision is the store's current revision when the first page was
//!   read (what Range's header says), and cluster id, member id and raft term are filled as
//!   Range's. A compaction past that revision while the stream runs fails the next page with
//!   Range's compacted error (etcd's `TestV3RangeStreamPartialThenCompacted`).
//! - **Limit and count.** Pages stop at the request's `limit`; when keys remain beyond it,
//!   the last message has `more` and a `count` of every key in the range (those sent plus a
//!   count-only read of the rest at the same revision), as Range's.
//! - **Pages.** etcd starts at 10 keys and doubles or halves the next page's key count to keep
//!   a message's size near `--max-request-bytes` (1.5 MiB by default).
//! - **Errors.** Range's: an empty key (InvalidArgument), a compacted or future revision
//!   (OutOfRange, etcd's texts), auth (checked once, before the first page, as Range's), no
//!   leader for a linearizable read. New in 3.7: a sort order or target outside the enums is
//!   `etcdserver: invalid sort option` (InvalidArgument); a sort other than none or by key
//!   ascending, and min/max mod or create revision filters, are Unimplemented ("RangeStream
//!   does not support custom sort orders", "... revision filters"). etcd's stream
//!   interceptor refuses every stream but Snapshot on a learner, so a learner refuses
//!   RangeStream even serializable (Range would serve that).
//! - **Clients.** clientv3's `KV.GetStream` returns a channel of the messages and
//!   `GetStreamToGetResponse` merges them; it does not retry a stream. kube-apiserver uses it
//!   when enabled and falls back to paginated Range when the call answers Unimplemented, which
//!   is what an etcd before 3.7, etcd 3.7's gRPC proxy ("RangeStream is not supported by the
//!   gRPC proxy") and the refusals above answer.
//!
//! # What this one does
//!
//! The same RPC, messages, revisions, count, header and errors. Differences, none visible in
//! the merged result: pages are bounded by bytes as they are read, not only by a key count
//! ([`PageParams`]: a page ends at the first key-value that brings it to `--max-request-bytes`,
//! so a run of large values after small ones cannot make one page of thousands of them), and
//! the page's key count starts at [`FIRST_PAGE_KEYS`] (etcd's 10, so the first message leaves
//! soon) and doubles while pages stay under half the byte budget, up to [`MAX_PAGE_KEYS`]
//! (which bounds how long a page holds the store's index lock). The first page is read before
//! the call answers, so that its errors (compacted, future revision) are the call's status with
//! no message, as etcd's are. A sort target other than the key with no order passes etcd's
//! check; etcd then sorts each chunk by that target within itself, which depends on where its
//! chunks fall; this one keeps key order.
//!
//! # Memory
//!
//! The stream reads a page only when polled for its next message (no task, no channel): tonic
//! polls it while it encodes (up to 32 KiB or one page per chunk), hyper polls tonic only once
//! h2 has taken the previous chunk, and h2 takes a chunk only while the client's flow-control
//! window has room and the stream's send buffer (hyper's 400 KiB) is not full. So a reader that
//! stops reading stops the reads, and the member holds at most: what h2 buffers within the
//! window, one chunk hyper waits to hand it and the page being encoded, each page under
//! `--max-request-bytes` plus one key-value. `it::range_stream` checks it by behaviour: a
//! compaction after the first message fails a stream of 8000 keys of 1 KiB after about 150,
//! and eight readers of 24 MiB that stop after their first message grow the member's RSS by
//! about 4 MiB (about 210 MiB when the results are read ahead). No read transaction or lock stays open between pages (each page takes its own,
//! `KvStore::range_page`), so a stream that waits on its reader pins no pages of the backend.

use std::pin::Pin;
use std::task::{Context, Poll};

use etcdrs_mvcc::{KeyRange, PageParams, RangePage, RangeParams};
use etcdrs_proto::etcdserverpb::{RangeRequest, RangeResponse, RangeStreamResponse};
use futures::Stream;
use prost::Message;
use tonic::Status;

use crate::EtcdServer;
use crate::error::ServerError;

/// Keys in the first page (etcd's `initialStreamChunkLimit`).
pub const FIRST_PAGE_KEYS: usize = 10;

/// Most keys in one page, however small they are: a page walks the index under its read lock.
pub const MAX_PAGE_KEYS: usize = 10_000;

/// A RangeStream's messages, read page by page as they are polled (see the module docs).
pub struct RangeStream {
    server: EtcdServer,
    /// Where the next page starts: the request's key, then just after each page's last key.
    next_key: Vec<u8>,
    range_end: Vec<u8>,
    keys_only: bool,
    /// The revision every page reads at: the first page's.
    read_rev: i64,
    /// The revision the last message's header carries: the store's when the first page was
    /// read (0 before it).
    header_rev: i64,
    /// Most keys to send: the request's limit, or all.
    limit: i64,
    /// Keys sent so far.
    sent: i64,
    /// Most keys in the next page.
    page_keys: usize,
    /// A page ends once its key-values reach this many encoded bytes.
    page_bytes: usize,
    /// The first message, read when the call began, until it is polled.
    first: Option<RangeStreamResponse>,
    /// Whether the last message has been produced (or an error ended the stream).
    finished: bool,
}

impl RangeStream {
    /// Begins the stream of `req` (already validated, its read barrier and auth check passed):
    /// reads the first page now, so that a failing read is the call's answer.
    pub(crate) fn start(server: EtcdServer, req: RangeRequest) -> Result<RangeStream, Status> {
        let page_bytes = usize::try_from(server.config().max_request_bytes).unwrap_or(usize::MAX);
        let mut stream = RangeStream {
            server,
            next_key: req.key,
            range_end: req.range_end,
            keys_only: req.keys_only,
            read_rev: req.revision,
            header_rev: 0,
            limit: if req.limit > 0 { req.limit } else { i64::MAX },
            sent: 0,
            page_keys: FIRST_PAGE_KEYS,
            page_bytes,
            first: None,
            finished: false,
        };
        let first = if req.count_only {
            stream.count_only()?
        } else {
            stream.next_message()?
        };
        stream.first = Some(first);
        Ok(stream)
    }

    /// The one message of a count-only request: Range's header and count, no keys.
    fn count_only(&mut self) -> Result<RangeStreamResponse, Status> {
        let counted = self
            .server
            .store()
            .range(
                KeyRange::new(&self.next_key, &self.range_end),
                RangeParams {
                    rev: self.read_rev,
                    limit: 0,
                    count_only: true,
                },
            )
            .map_err(ServerError::from)?;
        self.finished = true;
        Ok(RangeStreamResponse {
            range_response: Some(RangeResponse {
                header: Some(self.server.header(counted.rev)),
                kvs: Vec::new(),
                more: false,
                count: counted.count,
            }),
        })
    }

    /// Reads the next page and makes it a message; the last one also gets the header, `more`
    /// and the count.
    fn next_message(&mut self) -> Result<RangeStreamResponse, Status> {
        let wanted = usize::try_from(self.limit - self.sent).unwrap_or(usize::MAX);
        let params = PageParams {
            rev: self.read_rev,
            max_keys: self.page_keys.min(wanted),
            max_bytes: self.page_bytes,
            keys_only: self.keys_only,
        };
        let page = self
            .server
            .store()
            .range_page(KeyRange::new(&self.next_key, &self.range_end), params)
            .map_err(ServerError::from)?;
        if self.header_rev == 0 {
            // The first page pins the revision for the rest.
            self.read_rev = page.read_rev;
            self.header_rev = page.current_rev;
        }
        self.message(page)
    }

    fn message(&mut self, page: RangePage) -> Result<RangeStreamResponse, Status> {
        self.sent += page.kvs.len() as i64;
        if let Some(last) = page.kvs.last().filter(|_| page.more) {
            // The smallest key after the last one sent.
            self.next_key.clear();
            self.next_key.extend_from_slice(&last.key);
            self.next_key.push(0);
        }
        let last = !page.more || self.sent >= self.limit;
        if !last {
            let size: usize = page.kvs.iter().map(Message::encoded_len).sum();
            if size < self.page_bytes / 2 {
                self.page_keys = (self.page_keys * 2).min(MAX_PAGE_KEYS);
            }
            return Ok(RangeStreamResponse {
                range_response: Some(RangeResponse {
                    kvs: page.kvs,
                    ..RangeResponse::default()
                }),
            });
        }
        self.finished = true;
        let mut count = self.sent;
        if page.more {
            // Cut by the limit: the count is of the whole range, as Range's.
            let rest = self
                .server
                .store()
                .range(
                    KeyRange::new(&self.next_key, &self.range_end),
                    RangeParams {
                        rev: self.read_rev,
                        limit: 0,
                        count_only: true,
                    },
                )
                .map_err(ServerError::from)?;
            count += rest.count;
        }
        Ok(RangeStreamResponse {
            range_response: Some(RangeResponse {
                header: Some(self.server.header(self.header_rev)),
                kvs: page.kvs,
                more: page.more,
                count,
            }),
        })
    }
}

impl Stream for RangeStream {
    type Item = Result<RangeStreamResponse, Status>;

    fn poll_next(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let this = self.get_mut();
        if let Some(first) = this.first.take() {
            return Poll::Ready(Some(Ok(first)));
        }
        if this.finished {
            return Poll::Ready(None);
        }
        // A page is read only here, when the next message is asked for: the reader's pace
        // sets the reads' (see the module docs on memory).
        let next = this.next_message();
        if next.is_err() {
            this.finished = true;
        }
        Poll::Ready(Some(next))
    }
}
