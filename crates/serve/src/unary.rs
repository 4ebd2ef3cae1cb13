//! Unary gRPC calls answered before any router or tonic service, as the server's KV calls and
//! the proxy's cached ranges are: the request body read whole ([`read_whole`]), its one plain
//! message found ([`one_message`]), the answer sent as one message and `grpc-status: 0`
//! ([`answer`]); and, for every call that is not that plain case, the body handed on with what
//! was read put back in front of the rest ([`Replay`]), so that the service behind refuses it
//! as it would have.

use std::convert::Infallible;
use std::future::poll_fn;
use std::pin::Pin;
use std::task::{Context, Poll};

use axum::http::header::{CONTENT_TYPE, HeaderMap, HeaderValue};
use axum::response::Response;
use bytes::{Bytes, BytesMut};
use http_body::{Body as HttpBody, Frame};

/// Bytes before each gRPC message: the compressed flag, then the length (big-endian u32).
pub const PREFIX: usize = 5;

/// Reads `body` until it ends, or until more than `limit` bytes came, or until the first
/// message's prefix claims more than `limit` with its own five bytes (grpc-go refuses such a
/// message from its prefix alone, before any of it arrives; a client that sends the prefix and
/// keeps the stream open must not wait for a body that may never come). The result holds the
/// bytes read (one frame's without a copy), the frame or error that stopped the reading
/// (trailers, a broken stream), and the rest of the body if it did not end; it is the body to
/// hand on when the call is not served from what was read.
pub async fn read_whole<B>(mut body: B, limit: usize) -> Replay<B>
where
    B: HttpBody<Data = Bytes> + Unpin,
{
    let mut first: Option<Bytes> = None;
    let mut more: Option<BytesMut> = None;
    let mut read = 0usize;
    let (pending, rest) = loop {
        let frame = poll_fn(|cx| Pin::new(&mut body).poll_frame(cx)).await;
        let data = match frame {
            None => break (None, None),
            Some(Ok(frame)) => match frame.into_data() {
                Ok(data) => data,
                Err(trailers) => break (Some(Ok(trailers)), None),
            },
            Some(Err(e)) => break (Some(Err(e)), None),
        };
        read += data.len();
        match (&first, &mut more) {
            (None, _) => first = Some(data),
            (Some(head), None) => {
                let mut buf = BytesMut::with_capacity(read);
                buf.extend_from_slice(head);
                buf.extend_from_slice(&data);
                more = Some(buf);
            }
            (Some(_), Some(buf)) => buf.extend_from_slice(&data),
        }
        let head = more.as_deref().or(first.as_deref()).unwrap_or_default();
        if read > limit || declared_len(head).is_some_and(|len| len.saturating_add(PREFIX) > limit)
        {
            break (None, Some(body));
        }
    };
    let buffered = match more {
        Some(buf) => buf.freeze(),
        None => first.unwrap_or_default(),
    };
    Replay {
        buffered: (!buffered.is_empty()).then_some(buffered),
        pending,
        rest,
    }
}

/// The length the first message's prefix declares, once the prefix is all there.
fn declared_len(body: &[u8]) -> Option<usize> {
    let (&[_, a, b, c, d], _) = body.split_first_chunk::<PREFIX>()?;
    usize::try_from(u32::from_be_bytes([a, b, c, d])).ok()
}

/// The message of a body that is exactly one uncompressed gRPC message of at most `max`
/// bytes.
pub fn one_message(body: &Bytes, max: usize) -> Option<Bytes> {
    let (&[compressed, a, b, c, d], message) = body.split_first_chunk::<PREFIX>()?;
    let len = u32::from_be_bytes([a, b, c, d]) as usize;
    (compressed == 0 && len <= max && message.len() == len).then(|| body.slice(PREFIX..))
}

/// A successful unary answer: `framed` (one message, prefix included), then `grpc-status: 0`,
/// with tonic's headers (`content-type: application/grpc`).
pub fn answer(framed: Bytes) -> Response {
    answer_chunks(vec![framed])
}

/// [`answer`] with the framed message in `chunks`, sent (and freed) one after the other.
pub fn answer_chunks(chunks: Vec<Bytes>) -> Response {
    answer_body(OneMessage {
        data: chunks.into(),
        produced: None,
        trailers: true,
    })
}

/// The next chunk of a produced answer (`None` after the last; an error ends it).
pub type Producer = Box<dyn FnMut() -> Option<Result<Bytes, String>> + Send>;

/// [`answer`] with the framed message in chunks that `chunks` writes one at a time, as the
/// connection asks for the next (so the answer is never held whole). An error from it ends
/// the answer there, with `grpc-status: 13` (`Internal`) and its text.
pub fn answer_produced(chunks: Producer) -> Response {
    answer_body(OneMessage {
        data: std::collections::VecDeque::new(),
        produced: Some(chunks),
        trailers: true,
    })
}

fn answer_body(body: OneMessage) -> Response {
    let mut response = Response::new(axum::body::Body::new(body));
    response
        .headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static("application/grpc"));
    response
}

/// A unary answer's body: its one framed message (in one or more chunks, held or produced),
/// then `grpc-status: 0`.
struct OneMessage {
    data: std::collections::VecDeque<Bytes>,
    produced: Option<Producer>,
    trailers: bool,
}

impl HttpBody for OneMessage {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        _cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        if let Some(data) = self.data.pop_front() {
            return Poll::Ready(Some(Ok(Frame::data(data))));
        }
        if let Some(produced) = self.produced.as_mut() {
            match produced() {
                Some(Ok(data)) => return Poll::Ready(Some(Ok(Frame::data(data)))),
                Some(Err(text)) => {
                    self.produced = None;
                    self.trailers = false;
                    // grpc-message is printable ASCII (and `%` only as an escape).
                    let text: String = text
                        .chars()
                        .map(|c| {
                            if c.is_ascii_graphic() && c != '%' || c == ' ' {
                                c
                            } else {
                                '?'
                            }
                        })
                        .collect();
                    let mut trailers = HeaderMap::with_capacity(2);
                    trailers.insert("grpc-status", HeaderValue::from_static("13"));
                    if let Ok(value) = HeaderValue::from_str(&text) {
                        trailers.insert("grpc-message", value);
                    }
                    return Poll::Ready(Some(Ok(Frame::trailers(trailers))));
                }
                None => self.produced = None,
            }
        }
        if std::mem::take(&mut self.trailers) {
            let mut trailers = HeaderMap::with_capacity(1);
            trailers.insert("grpc-status", HeaderValue::from_static("0"));
            return Poll::Ready(Some(Ok(Frame::trailers(trailers))));
        }
        Poll::Ready(None)
    }

    fn is_end_stream(&self) -> bool {
        self.data.is_empty() && self.produced.is_none() && !self.trailers
    }
}

/// A request body as [`read_whole`] leaves it: what was read, then the frame or error that
/// stopped the reading, then the rest (none once the body ended).
pub struct Replay<B: HttpBody> {
    buffered: Option<Bytes>,
    pending: Option<Result<Frame<Bytes>, B::Error>>,
    rest: Option<B>,
}

impl<B: HttpBody> Replay<B> {
    /// The whole body, if it ended cleanly (no trailers, no error, nothing left unread).
    pub fn whole(&self) -> Option<Bytes> {
        (self.pending.is_none() && self.rest.is_none())
            .then(|| self.buffered.clone().unwrap_or_default())
    }
}

// Nothing in a `Replay` is pinned but `rest`, which is `Unpin` (a pending error need not be).
impl<B: HttpBody + Unpin> Unpin for Replay<B> {}

impl<B> HttpBody for Replay<B>
where
    B: HttpBody<Data = Bytes> + Unpin,
{
    type Data = Bytes;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, B::Error>>> {
        let this = self.get_mut();
        if let Some(data) = this.buffered.take() {
            return Poll::Ready(Some(Ok(Frame::data(data))));
        }
        if let Some(pending) = this.pending.take() {
            return Poll::Ready(Some(pending));
        }
        match this.rest.as_mut() {
            Some(rest) => Pin::new(rest).poll_frame(cx),
            None => Poll::Ready(None),
        }
    }

    fn is_end_stream(&self) -> bool {
        self.buffered.is_none()
            && self.pending.is_none()
            && self.rest.as_ref().is_none_or(|rest| rest.is_end_stream())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn framed(flag: u8, message: &[u8]) -> Bytes {
        let mut out = vec![flag];
        out.extend_from_slice(&(message.len() as u32).to_be_bytes());
        out.extend_from_slice(message);
        Bytes::from(out)
    }

    /// A body that sends `first` and then neither data nor its end.
    struct ThenSilence(Option<Bytes>);

    impl HttpBody for ThenSilence {
        type Data = Bytes;
        type Error = Infallible;

        fn poll_frame(
            mut self: Pin<&mut Self>,
            _cx: &mut Context<'_>,
        ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
            match self.0.take() {
                Some(data) => Poll::Ready(Some(Ok(Frame::data(data)))),
                None => Poll::Pending,
            }
        }
    }

    /// A prefix claiming more than the limit stops the reading at once, the rest of the body
    /// left to whoever refuses the call; one within the limit waits for its message.
    #[tokio::test]
    async fn an_oversized_prefix_stops_the_reading() {
        let prefix = Bytes::from_static(&[0, 0xff, 0xff, 0xff, 0xff]);
        let read = tokio::time::timeout(
            std::time::Duration::from_secs(5),
            read_whole(ThenSilence(Some(prefix.clone())), 1024 + PREFIX),
        )
        .await
        .expect("read_whole returns without the body");
        assert!(read.whole().is_none());
        assert_eq!(read.buffered, Some(prefix));
        assert!(read.rest.is_some());

        let small = Bytes::from_static(&[0, 0, 0, 0, 10]);
        let waited = tokio::time::timeout(
            std::time::Duration::from_millis(50),
            read_whole(ThenSilence(Some(small)), 1024 + PREFIX),
        )
        .await;
        assert!(waited.is_err(), "a message within the limit is waited for");
    }

    #[test]
    fn only_one_plain_message_within_the_limit_is_found() {
        assert_eq!(
            one_message(&framed(0, b"abc"), 10),
            Some(Bytes::from_static(b"abc"))
        );
        assert_eq!(one_message(&framed(0, b""), 10), Some(Bytes::new()));
        // Compressed, too large, two messages, cut short, no prefix at all.
        assert_eq!(one_message(&framed(1, b"abc"), 10), None);
        assert_eq!(one_message(&framed(0, b"abc"), 2), None);
        let mut two = framed(0, b"abc").to_vec();
        two.extend_from_slice(&framed(0, b"d"));
        assert_eq!(one_message(&Bytes::from(two), 10), None);
        assert_eq!(one_message(&framed(0, b"abc").slice(..6), 10), None);
        assert_eq!(one_message(&Bytes::from_static(&[0, 0]), 10), None);
    }
}
