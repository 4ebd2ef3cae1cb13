//! Tests of the `:authority` filter: header blocks rewritten field by field, frames filtered
//! whatever their split, pass-through of clean and non-HTTP/2 connections, and hyper
//! answering etcd 3.4 etcdctl's requests through it.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::time::Duration;

use etcdrs_hpack::{
    Decoder, HeaderField, encode_int, encode_literal, encode_string, huffman_encode,
};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper::{Request, Response};
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use super::filter::{needs_rewrite, rewrite_authority, url_authority};
use super::*;

fn hex(s: &str) -> Vec<u8> {
    let digits: Vec<u8> = s.bytes().filter(|b| !b.is_ascii_whitespace()).collect();
    digits
        .chunks(2)
        .map(|pair| u8::from_str_radix(std::str::from_utf8(pair).unwrap(), 16).unwrap())
        .collect()
}

fn fields(list: &[(&str, &str)]) -> Vec<HeaderField> {
    list.iter()
        .map(|(name, value)| HeaderField {
            name: name.as_bytes().to_vec(),
            value: value.as_bytes().to_vec(),
            never_indexed: false,
        })
        .collect()
}

/// Appends `s` Huffman-coded, as grpc-go and h2 send most strings.
fn huffman_string(out: &mut Vec<u8>, s: &str) {
    let coded = huffman_encode(s.as_bytes());
    encode_int(out, 0x80, 7, coded.len());
    out.extend_from_slice(&coded);
}

/// The block as re-encoded: every field a literal that does not index.
fn literals(fields: &[HeaderField]) -> Vec<u8> {
    let mut out = Vec::new();
    for field in fields {
        encode_literal(&mut out, field);
    }
    out
}

#[test]
fn rewriting_keeps_fields_order_and_never_indexed() {
    let mut decoder = Decoder::new(HEADER_TABLE_SIZE);
    let mut block = hex("8286 84 41");
    huffman_string(&mut block, "http://127.0.0.1:2379");
    // A never-indexed custom field.
    block.extend_from_slice(&hex("10 01 78 01 79"));
    let mut decoded = decoder.decode(&block).unwrap();
    assert!(decoded.iter().any(needs_rewrite));
    rewrite_authority(&mut decoded);
    let mut expected = fields(&[
        (":method", "GET"),
        (":scheme", "http"),
        (":path", "/"),
        (":authority", "127.0.0.1:2379"),
        ("x", "y"),
    ]);
    expected[4].never_indexed = true;
    assert_eq!(decoded, expected);
    // What hyper's decoder reads back, with nothing left in its table.
    let mut server = Decoder::new(HEADER_TABLE_SIZE);
    assert_eq!(server.decode(&literals(&decoded)).unwrap(), expected);
    assert_eq!(
        server.decode(&hex("be")),
        Err(etcdrs_hpack::Error::InvalidIndex(62))
    );
}

#[test]
fn url_authorities() {
    let cases: [(&str, Option<&str>); 6] = [
        ("http://127.0.0.1:2379", Some("127.0.0.1:2379")),
        ("https://example.com:2379/x?y", Some("example.com:2379")),
        ("unix://localhost:2379", Some("localhost:2379")),
        ("unix:///tmp/sock", Some("")),
        ("127.0.0.1:2379", None),
        ("", None),
    ];
    for (input, want) in cases {
        assert_eq!(
            url_authority(input.as_bytes()),
            want.map(str::as_bytes),
            "{input}"
        );
    }
    let mut list = fields(&[(":authority", "unix:///tmp/sock"), (":path", "/")]);
    rewrite_authority(&mut list);
    assert_eq!(list, fields(&[(":path", "/")]));
}

/// Yields its bytes one per read, to exercise every split point.
struct Trickle {
    data: Vec<u8>,
    pos: usize,
}

impl AsyncRead for Trickle {
    fn poll_read(
        self: Pin<&mut Self>,
        _: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if let Some(&b) = this.data.get(this.pos) {
            buf.put_slice(&[b]);
            this.pos += 1;
        }
        Poll::Ready(Ok(()))
    }
}

impl AsyncWrite for Trickle {
    fn poll_write(self: Pin<&mut Self>, _: &mut Context<'_>, b: &[u8]) -> Poll<io::Result<usize>> {
        Poll::Ready(Ok(b.len()))
    }
    fn poll_flush(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }
    fn poll_shutdown(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }
}

fn frame(frame_type: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
    let mut out = BytesMut::new();
    let len = payload.len().to_be_bytes();
    out.extend_from_slice(&len[len.len() - 3..]);
    out.extend_from_slice(&[frame_type, flags]);
    out.extend_from_slice(&stream.to_be_bytes());
    out.extend_from_slice(payload);
    out.to_vec()
}

async fn filtered(input: Vec<u8>, trickle: bool) -> io::Result<Vec<u8>> {
    let mut out = Vec::new();
    if trickle {
        let mut io = LenientAuthority::new(Trickle {
            data: input,
            pos: 0,
        });
        let mut small = [0u8; 3];
        loop {
            let n = io.read(&mut small).await?;
            if n == 0 {
                return Ok(out);
            }
            out.extend_from_slice(&small[..n]);
        }
    }
    let (mut client, server) = tokio::io::duplex(64 * 1024);
    let writer = tokio::spawn(async move {
        // The reader may fail early and drop its end; that write error is expected.
        let _ = client.write_all(&input).await;
    });
    let read = LenientAuthority::new(server).read_to_end(&mut out).await;
    writer.await.unwrap();
    read.map(|_| out)
}

#[tokio::test]
async fn frames_filter_byte_by_byte() {
    let settings = frame(0x4, 0, 0, &hex("0003 0000 0064"));
    let data = frame(0x0, 0x1, 1, &[7u8; 40_000]);
    let window = frame(0x8, 0, 0, &hex("0000 ffff"));
    // HEADERS with padding and priority, its block split over two CONTINUATIONs; the
    // authority Huffman-coded and indexed, as grpc-go sends it.
    let mut block = hex("8286 84 41");
    huffman_string(&mut block, "http://127.0.0.1:2379");
    let mut headers_payload = vec![3u8];
    headers_payload.extend_from_slice(&hex("0000 0000 0f"));
    headers_payload.extend_from_slice(&block[..2]);
    headers_payload.extend_from_slice(&[0, 0, 0]);
    let mut input = PREFACE.to_vec();
    input.extend(&settings);
    input.extend(frame(0x1, FLAG_PADDED | FLAG_PRIORITY, 1, &headers_payload));
    input.extend(frame(0x9, 0, 1, &block[2..5]));
    input.extend(frame(0x9, FLAG_END_HEADERS, 1, &block[5..]));
    input.extend(&data);
    // Second request on stream 3: the authority by dynamic index 62, END_STREAM.
    input.extend(frame(
        0x1,
        FLAG_END_HEADERS | FLAG_END_STREAM,
        3,
        &hex("8286 84be"),
    ));
    input.extend(&window);

    let request = fields(&[
        (":method", "GET"),
        (":scheme", "http"),
        (":path", "/"),
        (":authority", "127.0.0.1:2379"),
    ]);
    let rewritten = literals(&request);
    let mut expected = PREFACE.to_vec();
    expected.extend(&settings);
    expected.extend(frame(0x1, FLAG_END_HEADERS, 1, &rewritten));
    expected.extend(&data);
    expected.extend(frame(
        0x1,
        FLAG_END_HEADERS | FLAG_END_STREAM,
        3,
        &rewritten,
    ));
    expected.extend(&window);

    assert_eq!(filtered(input.clone(), true).await.unwrap(), expected);
    assert_eq!(filtered(input, false).await.unwrap(), expected);
}

#[tokio::test]
async fn plain_authority_connections_pass_through_untouched() {
    let settings = frame(0x4, 0, 0, &hex("0003 0000 0064"));
    // First request: `:authority: 127.0.0.1:2379`, indexed into the client's table.
    let mut block = hex("8286 84 41 0e");
    block.extend_from_slice(b"127.0.0.1:2379");
    let mut input = PREFACE.to_vec();
    input.extend(&settings);
    input.extend(frame(0x1, FLAG_END_HEADERS, 1, &block));
    input.extend(frame(0x0, 0x1, 1, &[7u8; 20_000]));
    // Later requests reuse the table entry; the filter no longer looks, so even a
    // URL-shaped authority (which one client never mixes with a plain one) is not touched.
    input.extend(frame(
        0x1,
        FLAG_END_HEADERS | FLAG_END_STREAM,
        3,
        &hex("8286 84be"),
    ));
    let mut url_block = hex("8286 84 01 15");
    url_block.extend_from_slice(b"http://127.0.0.1:2379");
    input.extend(frame(
        0x1,
        FLAG_END_HEADERS | FLAG_END_STREAM,
        5,
        &url_block,
    ));

    assert_eq!(filtered(input.clone(), true).await.unwrap(), input);
    assert_eq!(filtered(input.clone(), false).await.unwrap(), input);
}

#[tokio::test]
async fn large_blocks_split_into_continuations() {
    let value = "v".repeat(40_000);
    let mut block = hex("8286 84 00 01 78");
    encode_string(&mut block, value.as_bytes());
    let mut input = PREFACE.to_vec();
    let mut pos = 0;
    for (i, chunk) in block.chunks(10_000).enumerate() {
        let last = pos + chunk.len() == block.len();
        let flags = if last { FLAG_END_HEADERS } else { 0 };
        input.extend(frame(if i == 0 { 0x1 } else { 0x9 }, flags, 1, chunk));
        pos += chunk.len();
    }
    let out = filtered(input, false).await.unwrap();
    let mut rest = &out[PREFACE.len()..];
    let mut reassembled = Vec::new();
    let mut types = Vec::new();
    while !rest.is_empty() {
        let len = usize::from(rest[0]) << 16 | usize::from(rest[1]) << 8 | usize::from(rest[2]);
        assert!(len <= MAX_EMIT_FRAME);
        types.push((rest[3], rest[4]));
        reassembled.extend_from_slice(&rest[9..9 + len]);
        rest = &rest[9 + len..];
    }
    assert_eq!(types, [(0x1, 0), (0x9, 0), (0x9, FLAG_END_HEADERS)]);
    let decoded = Decoder::new(HEADER_TABLE_SIZE)
        .decode(&reassembled)
        .unwrap();
    assert_eq!(decoded[3].value, value.as_bytes());
}

#[tokio::test]
async fn bad_streams_fail_the_connection() {
    let mut huge = PREFACE.to_vec();
    huge.extend(frame(0x1, 0, 1, &vec![0x82; 600_000]));
    huge.extend(frame(0x9, FLAG_END_HEADERS, 1, &vec![0x82; 600_000]));
    let e = filtered(huge, false).await.unwrap_err();
    assert_eq!(e.kind(), io::ErrorKind::InvalidData);
    assert!(e.to_string().contains("exceeds"), "{e}");

    let mut bad = PREFACE.to_vec();
    bad.extend(frame(0x1, FLAG_END_HEADERS, 1, &hex("80")));
    let e = filtered(bad, true).await.unwrap_err();
    assert!(e.to_string().contains("invalid table index 0"), "{e}");

    // One 4,000-byte entry indexed 300 times: over 1 MiB decoded.
    let mut block = hex("40 01 78");
    encode_string(&mut block, &[b'v'; 4000]);
    block.extend(std::iter::repeat_n(0xbe, 300));
    let mut large = PREFACE.to_vec();
    large.extend(frame(0x1, FLAG_END_HEADERS, 1, &block));
    let e = filtered(large, false).await.unwrap_err();
    assert!(e.to_string().contains("header list exceeds"), "{e}");

    let mut interleaved = PREFACE.to_vec();
    interleaved.extend(frame(0x1, 0, 1, &hex("82")));
    interleaved.extend(frame(0x0, 0, 1, b"x"));
    let e = filtered(interleaved, false).await.unwrap_err();
    assert!(e.to_string().contains("expected CONTINUATION"), "{e}");
}

#[tokio::test]
async fn non_http2_passes_through() {
    for input in [
        b"GET / HTTP/1.1\r\nHost: x\r\n\r\n".to_vec(),
        b"PRI * HTTP/1.1\r\n\r\n".to_vec(),
        b"PRI * HTTP".to_vec(),
        Vec::new(),
    ] {
        assert_eq!(filtered(input.clone(), true).await.unwrap(), input);
        assert_eq!(filtered(input.clone(), false).await.unwrap(), input);
    }
}

/// An HTTP/1 + HTTP/2 hyper server answering 200 with the request's authority (or Host).
async fn serve(lenient: bool) -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        loop {
            let (stream, _) = listener.accept().await.unwrap();
            tokio::spawn(async move {
                let service = service_fn(|req: Request<Incoming>| async move {
                    let authority = match req.uri().authority() {
                        Some(a) => a.to_string(),
                        None => req
                            .headers()
                            .get("host")
                            .and_then(|h| h.to_str().ok())
                            .unwrap_or_default()
                            .to_string(),
                    };
                    Ok::<_, Infallible>(Response::new(authority))
                });
                let builder = auto::Builder::new(TokioExecutor::new());
                let _ = if lenient {
                    let io = TokioIo::new(LenientAuthority::new(stream));
                    builder.serve_connection(io, service).await
                } else {
                    builder
                        .serve_connection(TokioIo::new(stream), service)
                        .await
                };
            });
        }
    });
    addr
}

#[derive(Debug, PartialEq, Eq)]
enum Outcome {
    Response { status: String, body: String },
    Reset(u32),
}

async fn read_frame(stream: &mut TcpStream) -> (u8, u8, u32, Vec<u8>) {
    let mut header = [0u8; 9];
    stream.read_exact(&mut header).await.unwrap();
    let len = usize::from(header[0]) << 16 | usize::from(header[1]) << 8 | usize::from(header[2]);
    let mut payload = vec![0u8; len];
    stream.read_exact(&mut payload).await.unwrap();
    let id = u32::from_be_bytes([header[5], header[6], header[7], header[8]]);
    (header[3], header[4], id, payload)
}

/// Sends GET requests on streams 1, 3, ... over one raw HTTP/2 connection, each with
/// the header `blocks[i]`, and collects each outcome.
async fn h2_requests(addr: SocketAddr, blocks: &[Vec<u8>]) -> Vec<Outcome> {
    let mut stream = TcpStream::connect(addr).await.unwrap();
    let mut hello = PREFACE.to_vec();
    hello.extend(frame(0x4, 0, 0, &[]));
    stream.write_all(&hello).await.unwrap();
    let mut decoder = Decoder::new(HEADER_TABLE_SIZE);
    let mut outcomes = Vec::new();
    for (i, block) in blocks.iter().enumerate() {
        let id = u32::try_from(2 * i + 1).unwrap();
        let flags = FLAG_END_HEADERS | FLAG_END_STREAM;
        stream
            .write_all(&frame(0x1, flags, id, block))
            .await
            .unwrap();
        let mut status = None;
        let mut body = Vec::new();
        let outcome = loop {
            let (frame_type, flags, sid, payload) = read_frame(&mut stream).await;
            match frame_type {
                0x4 if flags & 1 == 0 => {
                    stream.write_all(&frame(0x4, 1, 0, &[])).await.unwrap();
                }
                0x1 => {
                    assert_eq!(sid, id);
                    let headers = decoder.decode(&payload).unwrap();
                    let s = headers.iter().find(|f| f.name == b":status").unwrap();
                    status = Some(String::from_utf8(s.value.clone()).unwrap());
                }
                0x0 if sid == id => body.extend_from_slice(&payload),
                0x3 if sid == id => {
                    break Outcome::Reset(u32::from_be_bytes(payload[..4].try_into().unwrap()));
                }
                0x7 => panic!("GOAWAY: {payload:?}"),
                _ => {}
            }
            if sid == id && flags & FLAG_END_STREAM != 0 {
                break Outcome::Response {
                    status: status.clone().unwrap(),
                    body: String::from_utf8(body.clone()).unwrap(),
                };
            }
        };
        outcomes.push(outcome);
    }
    outcomes
}

/// GET / with `:authority` as a literal with incremental indexing (Huffman-coded).
fn indexing_request(authority: &str) -> Vec<u8> {
    let mut block = hex("8286 84 41");
    huffman_string(&mut block, authority);
    block
}

#[tokio::test]
async fn hyper_answers_url_authority() {
    tokio::time::timeout(Duration::from_secs(30), async {
        let addr = serve(true).await;
        // Literals without indexing, raw strings.
        let without_indexing = |authority: &str| {
            let mut block = hex("8286 84 01");
            encode_string(&mut block, authority.as_bytes());
            block
        };
        let outcomes = h2_requests(
            addr,
            &[
                indexing_request("http://127.0.0.1:2379"),
                // The authority again, by dynamic index, as grpc-go sends it.
                hex("8286 84be"),
                without_indexing(&format!("http://{addr}/")),
                hex("8286 84be"),
                indexing_request(&format!("http://{addr}")),
                hex("8286 84be"),
                // Plain authorities on a rewritten connection go through as they are.
                indexing_request("127.0.0.1:2379"),
                without_indexing("example:2379"),
            ],
        )
        .await;
        let ok = |body: &str| Outcome::Response {
            status: "200".to_string(),
            body: body.to_string(),
        };
        let authority = addr.to_string();
        assert_eq!(
            outcomes,
            [
                ok("127.0.0.1:2379"),
                ok("127.0.0.1:2379"),
                ok(&authority),
                ok("127.0.0.1:2379"),
                ok(&authority),
                ok(&authority),
                ok("127.0.0.1:2379"),
                ok("example:2379"),
            ]
        );

        // Control: without the wrapper, h2 resets the stream with PROTOCOL_ERROR (1).
        // If a newer h2 accepts URL authorities, this wrapper is no longer needed.
        let strict = serve(false).await;
        let outcomes = h2_requests(strict, &[indexing_request(&format!("http://{strict}"))]).await;
        assert_eq!(outcomes, [Outcome::Reset(1)]);
    })
    .await
    .unwrap();
}

#[tokio::test]
async fn hyper_http1_passes_through() {
    tokio::time::timeout(Duration::from_secs(30), async {
        let addr = serve(true).await;
        let mut stream = TcpStream::connect(addr).await.unwrap();
        stream
            .write_all(b"GET / HTTP/1.1\r\nHost: example:2379\r\nConnection: close\r\n\r\n")
            .await
            .unwrap();
        let mut response = String::new();
        stream.read_to_string(&mut response).await.unwrap();
        assert!(response.starts_with("HTTP/1.1 200 OK\r\n"), "{response}");
        assert!(response.ends_with("\r\n\r\nexample:2379"), "{response}");
    })
    .await
    .unwrap();
}
