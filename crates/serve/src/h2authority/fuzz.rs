//! Fuzzing of the `:authority` filter (issue 20): it parses HTTP/2 frames and HPACK blocks
//! that any client sends before hyper sees them, so any byte stream must pass, be rewritten
//! or fail the read with an error: no panic, no frame length trusted into an allocation
//! beyond the 1 MiB header block bound, no loop. Corpus:
//! `crates/serve/fuzz-corpus/connection/`, connections as etcd 3.4's etcdctl and other
//! clients open them (`ETCDRS_FUZZ_REGEN=1` rewrites them). Runner and knobs: `etcdrs-fuzz`.

use std::io::Cursor;

use etcdrs_fuzz::Fuzz;
use etcdrs_hpack::{HeaderField, encode_literal, huffman_encode};
use tokio::io::AsyncReadExt;

use super::{FLAG_END_HEADERS, FLAG_PADDED, FLAG_PRIORITY, LenientAuthority, PREFACE};

const TYPE_DATA: u8 = 0x0;
const TYPE_HEADERS: u8 = 0x1;
const TYPE_SETTINGS: u8 = 0x4;
const TYPE_CONTINUATION: u8 = 0x9;

fn frame(out: &mut Vec<u8>, frame_type: u8, flags: u8, stream: u32, payload: &[u8]) {
    let len = (payload.len() as u32).to_be_bytes();
    out.extend_from_slice(&len[1..]);
    out.extend_from_slice(&[frame_type, flags]);
    out.extend_from_slice(&stream.to_be_bytes());
    out.extend_from_slice(payload);
}

fn block(authority: &str) -> Vec<u8> {
    let mut block = vec![0x83, 0x86]; // :method POST, :scheme http (static table)
    for (name, value) in [
        (":path", "/etcdserverpb.KV/Range"),
        (":authority", authority),
        ("content-type", "application/grpc"),
    ] {
        let field = HeaderField {
            name: name.as_bytes().to_vec(),
            value: value.as_bytes().to_vec(),
            never_indexed: false,
        };
        encode_literal(&mut block, &field);
    }
    // An incrementally indexed field with a Huffman-coded value, then its index.
    block.extend_from_slice(&[0x40, 0x02]);
    block.extend_from_slice(b"te");
    let trailers = huffman_encode(b"trailers");
    block.push(0x80 | trailers.len() as u8);
    block.extend_from_slice(&trailers);
    block.push(0x80 | 62);
    block
}

/// etcd 3.4's etcdctl: a URL authority, then a second request split into HEADERS (padded,
/// with priority) and CONTINUATION, DATA between them.
fn etcdctl_connection() -> Vec<u8> {
    let mut out = PREFACE.to_vec();
    frame(&mut out, TYPE_SETTINGS, 0, 0, &[0, 3, 0, 0, 0, 100]);
    frame(
        &mut out,
        TYPE_HEADERS,
        FLAG_END_HEADERS,
        1,
        &block("http://127.0.0.1:2379"),
    );
    frame(&mut out, TYPE_DATA, 0x1, 1, &[0, 0, 0, 0, 2, 0x0a, 0x00]);
    let second = block("https://[::1]:2379/prefix");
    let (head, tail) = second.split_at(second.len() / 2);
    let mut payload = vec![4];
    payload.extend_from_slice(&[0x80, 0, 0, 1, 15]);
    payload.extend_from_slice(head);
    payload.extend_from_slice(&[0; 4]);
    frame(
        &mut out,
        TYPE_HEADERS,
        FLAG_PADDED | FLAG_PRIORITY,
        3,
        &payload,
    );
    frame(&mut out, TYPE_CONTINUATION, FLAG_END_HEADERS, 3, tail);
    out
}

/// Any other client: a plain authority, after which the connection passes through.
fn plain_connection() -> Vec<u8> {
    let mut out = PREFACE.to_vec();
    frame(&mut out, TYPE_SETTINGS, 0, 0, &[]);
    frame(
        &mut out,
        TYPE_HEADERS,
        FLAG_END_HEADERS,
        1,
        &block("127.0.0.1:2379"),
    );
    frame(&mut out, TYPE_DATA, 0x1, 1, &[0, 0, 0, 0, 0]);
    out
}

#[test]
fn fuzz_h2_authority_filter() {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .build()
        .expect("a current-thread runtime");
    Fuzz::new("h2-authority")
        .corpus_dir(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/fuzz-corpus/connection"
        ))
        .input("etcdctl-3.4", etcdctl_connection())
        .input("plain", plain_connection())
        .input("http1", b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n".to_vec())
        .iterations(1500)
        .run(|input| {
            runtime.block_on(async {
                let mut filtered = Vec::new();
                let mut io = LenientAuthority::new(Cursor::new(input.to_vec()));
                let _ = io.read_to_end(&mut filtered).await;
                // Small reads take the other paths through the output buffer.
                let mut io = LenientAuthority::new(Cursor::new(input.to_vec()));
                let mut small = [0u8; 7];
                while let Ok(n_read) = io.read(&mut small).await {
                    if n_read == 0 {
                        break;
                    }
                }
            });
        });
}
