//! Counting gRPC calls on a listener that serves etcd's services: calls started and handled
//! by code, with `--metrics=extensive` their duration, and their messages
//! (go-grpc-prometheus's `grpc_server_*`), message bytes as etcd's codec counts them
//! (`etcd_network_client_grpc_{received,sent}_bytes_total`, v3rpc `codec.go`), and etcd's
//! `etcd_server_client_requests_total` (v3rpc `interceptor.go`).
//!
//! A call's code is its `grpc-status`: among the response headers for an error answered at
//! once, else in the trailers that end the response body; a response dropped before its
//! trailers (the client went away) counts as `Canceled`, what a Go handler returns then.
//!
//! [`CountGrpc`] wraps a connection's service outside axum, where hyper hands it the request
//! bodies: it wraps the request body and the response body in [`Counted`], which follows
//! gRPC's length-prefixed framing (a 1-byte flag and a 4-byte big-endian length before each
//! message) as data frames pass. Nothing is allocated per call: the wrappers live inside the
//! boxes axum and hyper make anyway, and every count is an atomic add on a series resolved
//! once. Message bytes are counted without the 5-byte prefixes, as the codec sees them (etcd's
//! clients do not compress).

use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Instant;

use axum::http::{Request, Response};
use bytes::Buf;
use http_body::{Body, Frame, SizeHint};
use prometheus::IntCounter;

use super::{MethodSeries, method_series};

/// Which way a body flows: what its messages count as.
#[derive(Clone, Copy)]
enum Direction {
    Received,
    Sent,
}

/// Where a body's counts go: the method's message counter and the direction's byte counter.
#[derive(Clone, Copy)]
struct Sink {
    messages: &'static IntCounter,
    bytes: &'static IntCounter,
}

impl Sink {
    fn new(series: &'static MethodSeries, direction: Direction) -> Sink {
        match direction {
            Direction::Received => Sink {
                messages: &series.msg_received,
                bytes: &super::GRPC_RECEIVED_BYTES,
            },
            Direction::Sent => Sink {
                messages: &series.msg_sent,
                bytes: &super::GRPC_SENT_BYTES,
            },
        }
    }
}

/// Where a reader of gRPC framing stands.
#[derive(Default)]
struct Framing {
    /// Prefix bytes of the next message read so far (0..5).
    prefix_len: u8,
    /// The prefix, as far as read.
    prefix: [u8; 5],
    /// Payload bytes of the current message still to come.
    remaining: u64,
}

impl Framing {
    /// Follow `chunk` of the stream: returns (messages that began, payload bytes seen).
    fn feed(&mut self, mut chunk: &[u8]) -> (u64, u64) {
        let (mut messages, mut bytes) = (0, 0);
        while !chunk.is_empty() {
            if self.remaining > 0 {
                let take = self.remaining.min(chunk.len() as u64);
                bytes += take;
                self.remaining -= take;
                chunk = &chunk[take as usize..];
                continue;
            }
            let need = 5 - usize::from(self.prefix_len);
            let take = need.min(chunk.len());
            let at = usize::from(self.prefix_len);
            self.prefix[at..at + take].copy_from_slice(&chunk[..take]);
            self.prefix_len += take as u8;
            chunk = &chunk[take..];
            if self.prefix_len == 5 {
                let len = u32::from_be_bytes([
                    self.prefix[1],
                    self.prefix[2],
                    self.prefix[3],
                    self.prefix[4],
                ]);
                messages += 1;
                self.remaining = u64::from(len);
                self.prefix_len = 0;
            }
        }
        (messages, bytes)
    }
}

/// A call whose code is not counted yet.
struct Pending {
    series: &'static MethodSeries,
    /// When it started, if its duration is observed (`--metrics=extensive`).
    started: Option<Instant>,
}

impl Pending {
    /// Count the call as handled with gRPC code `code`.
    fn finish(self, code: usize) {
        self.series.count_handled(code, self.started);
    }
}

/// The code in a `grpc-status` header value (2, Unknown, when unreadable).
fn status_code(value: &axum::http::HeaderValue) -> usize {
    std::str::from_utf8(value.as_bytes())
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(2)
}

/// A body whose gRPC messages are counted as they pass (bodies of other requests pass
/// untouched); a response body also counts its call's code when its trailers pass.
pub struct Counted<B> {
    inner: B,
    sink: Option<Sink>,
    framing: Framing,
    pending: Option<Pending>,
}

impl<B> Counted<B> {
    fn new(inner: B, sink: Option<Sink>) -> Counted<B> {
        Counted {
            inner,
            sink,
            framing: Framing::default(),
            pending: None,
        }
    }
}

impl<B> Drop for Counted<B> {
    fn drop(&mut self) {
        if let Some(pending) = self.pending.take() {
            pending.finish(1);
        }
    }
}

impl<B> Body for Counted<B>
where
    B: Body + Unpin,
    B::Data: Buf,
{
    type Data = B::Data;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        let this = self.get_mut();
        let polled = Pin::new(&mut this.inner).poll_frame(cx);
        if this.pending.is_some() {
            match &polled {
                Poll::Ready(Some(Ok(frame))) => {
                    if let Some(status) = frame
                        .trailers_ref()
                        .and_then(|t| t.get(crate::names::GRPC_STATUS))
                        && let Some(pending) = this.pending.take()
                    {
                        pending.finish(status_code(status));
                    }
                }
                // A gRPC response must end with trailers.
                Poll::Ready(None) | Poll::Ready(Some(Err(_))) => {
                    if let Some(pending) = this.pending.take() {
                        pending.finish(2);
                    }
                }
                Poll::Pending => {}
            }
        }
        if let (Some(sink), Poll::Ready(Some(Ok(frame)))) = (this.sink, &polled)
            && let Some(data) = frame.data_ref()
        {
            // A frame's data is one contiguous chunk in hyper and tonic.
            let (messages, bytes) = this.framing.feed(data.chunk());
            if messages > 0 {
                sink.messages.inc_by(messages);
            }
            if bytes > 0 {
                sink.bytes.inc_by(bytes);
            }
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

/// The client port's service wrapper: counts the gRPC calls of etcd's methods.
#[derive(Clone)]
pub struct CountGrpc<S> {
    inner: S,
}

impl<S> CountGrpc<S> {
    /// Wrap `inner` (the client router).
    pub fn new(inner: S) -> CountGrpc<S> {
        CountGrpc { inner }
    }
}

impl<S, B, R> tower::Service<Request<B>> for CountGrpc<S>
where
    S: tower::Service<Request<Counted<B>>, Response = Response<R>>,
    S::Future: Unpin,
{
    type Response = Response<Counted<R>>;
    type Error = S::Error;
    type Future = CountedCall<S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request<B>) -> Self::Future {
        let series = is_grpc(&request)
            .then(|| method_series(request.uri().path()))
            .flatten();
        let mut pending = None;
        if let Some(series) = series {
            let version = request
                .headers()
                .get("client-api-version")
                .map(|v| v.as_bytes());
            super::count_client_request(series.streaming, version);
            pending = Some(Pending {
                series,
                started: series.count_started(),
            });
        }
        let request = request.map(|body| {
            Counted::new(
                body,
                series.map(|series| Sink::new(series, Direction::Received)),
            )
        });
        CountedCall {
            inner: self.inner.call(request),
            sink: series.map(|series| Sink::new(series, Direction::Sent)),
            pending,
        }
    }
}

fn is_grpc<B>(request: &Request<B>) -> bool {
    request
        .headers()
        .get(axum::http::header::CONTENT_TYPE)
        .is_some_and(|v| v.as_bytes().starts_with(b"application/grpc"))
}

/// The future of a counted call: its response body is counted too.
pub struct CountedCall<F> {
    inner: F,
    sink: Option<Sink>,
    pending: Option<Pending>,
}

impl<F, R, E> std::future::Future for CountedCall<F>
where
    F: std::future::Future<Output = Result<Response<R>, E>> + Unpin,
{
    type Output = Result<Response<Counted<R>>, E>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.as_mut().get_mut();
        let Poll::Ready(result) = Pin::new(&mut this.inner).poll(cx) else {
            return Poll::Pending;
        };
        let sink = this.sink;
        let mut pending = this.pending.take();
        Poll::Ready(result.map(|response| {
            // An error answered at once carries its status among the headers.
            if let Some(status) = response.headers().get(crate::names::GRPC_STATUS)
                && let Some(call) = pending.take()
            {
                call.finish(status_code(status));
            }
            response.map(|body| {
                let mut counted = Counted::new(body, sink);
                counted.pending = pending;
                counted
            })
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn framed(payloads: &[&[u8]]) -> Vec<u8> {
        let mut out = Vec::new();
        for payload in payloads {
            out.push(0);
            out.extend_from_slice(&(payload.len() as u32).to_be_bytes());
            out.extend_from_slice(payload);
        }
        out
    }

    /// A response body of the given frames.
    struct Frames(std::collections::VecDeque<Frame<bytes::Bytes>>);

    impl Body for Frames {
        type Data = bytes::Bytes;
        type Error = std::convert::Infallible;

        fn poll_frame(
            mut self: Pin<&mut Self>,
            _cx: &mut Context<'_>,
        ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
            Poll::Ready(self.0.pop_front().map(Ok))
        }
    }

    fn drain(body: &mut Counted<Frames>) {
        let waker = futures::task::noop_waker();
        let mut cx = Context::from_waker(&waker);
        while let Poll::Ready(Some(_)) = Pin::new(&mut *body).poll_frame(&mut cx) {}
    }

    #[test]
    fn a_response_counts_its_messages_and_the_code_of_its_trailers() {
        let series = method_series("/etcdserverpb.Lease/LeaseKeepAlive").expect("etcd's method");
        let (ok, sent, canceled, not_found) = (
            series.handled[0].get(),
            series.msg_sent.get(),
            series.handled[1].get(),
            series.handled[5].get(),
        );
        let mut trailers = axum::http::HeaderMap::new();
        trailers.insert("grpc-status", axum::http::HeaderValue::from_static("5"));
        let frames = [
            Frame::data(bytes::Bytes::from(framed(&[b"one", b"two"]))),
            Frame::trailers(trailers),
        ];
        let mut body = Counted::new(
            Frames(frames.into_iter().collect()),
            Some(Sink::new(series, Direction::Sent)),
        );
        body.pending = Some(Pending {
            series,
            started: None,
        });
        drain(&mut body);
        drop(body);
        assert_eq!(series.msg_sent.get() - sent, 2);
        assert_eq!(series.handled[5].get() - not_found, 1);
        // A response dropped before its trailers: the client canceled.
        let mut body = Counted::new(Frames(Default::default()), None);
        body.pending = Some(Pending {
            series,
            started: None,
        });
        drop(body);
        assert_eq!(series.handled[1].get() - canceled, 1);
        assert_eq!(series.handled[0].get(), ok);
    }

    #[test]
    fn framing_counts_messages_and_payload_bytes_across_any_split() {
        let stream = framed(&[b"hello", b"", b"a longer message"]);
        for split in 0..=stream.len() {
            let mut framing = Framing::default();
            let (m1, b1) = framing.feed(&stream[..split]);
            let (m2, b2) = framing.feed(&stream[split..]);
            assert_eq!((m1 + m2, b1 + b2), (3, 21), "split at {split}");
        }
        let mut framing = Framing::default();
        let counts: Vec<(u64, u64)> = stream.chunks(1).map(|c| framing.feed(c)).collect();
        let total = counts
            .iter()
            .fold((0, 0), |(m, b), (dm, db)| (m + dm, b + db));
        assert_eq!(total, (3, 21));
    }
}
