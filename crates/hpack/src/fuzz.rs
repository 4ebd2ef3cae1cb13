//! Fuzzing of the HPACK decoder (issue 20): header blocks come from clients
//! (`serve::h2authority`) and servers (`bench::grpc`), so any block must decode or fail with
//! an [`Error`]: no panic, no integer or table size trusted into an allocation, no loop.
//! Corpus: `crates/hpack/fuzz-corpus/block/`, RFC 7541's examples (appendix C) and blocks of
//! our encoder (`ETCDRS_FUZZ_REGEN=1` rewrites them). Runner and knobs: `etcdrs-fuzz`.

use etcdrs_fuzz::Fuzz;

use crate::{DEFAULT_TABLE_SIZE, Decoder, HeaderField, encode_literal, huffman_decode};

fn hex(text: &str) -> Vec<u8> {
    let digits: Vec<u8> = text.bytes().filter(|c| c.is_ascii_hexdigit()).collect();
    digits
        .chunks(2)
        .map(|pair| {
            let pair = std::str::from_utf8(pair).expect("hex digits are ASCII");
            u8::from_str_radix(pair, 16).expect("two hex digits")
        })
        .collect()
}

/// A block of our encoder: what `serve::h2authority` re-encodes for etcd 3.4's etcdctl.
fn encoded_request() -> Vec<u8> {
    let mut block = Vec::new();
    for (name, value, never_indexed) in [
        (":method", "POST", false),
        (":scheme", "http", false),
        (":path", "/etcdserverpb.KV/Put", false),
        (":authority", "http://127.0.0.1:2379", false),
        ("content-type", "application/grpc", false),
        ("authorization", "token.123", true),
    ] {
        let field = HeaderField {
            name: name.as_bytes().to_vec(),
            value: value.as_bytes().to_vec(),
            never_indexed,
        };
        encode_literal(&mut block, &field);
    }
    block
}

#[test]
fn fuzz_hpack_decoder() {
    // RFC 7541 C.3 (requests), C.4 (the same, Huffman-coded), C.6 (responses with eviction
    // under a 256-byte table), a table size update.
    let rfc = [
        (
            "rfc7541-c3-1",
            "8286 8441 0f77 7777 2e65 7861 6d70 6c65 2e63 6f6d",
        ),
        ("rfc7541-c3-2", "8286 84be 5808 6e6f 2d63 6163 6865"),
        (
            "rfc7541-c3-3",
            "8287 85bf 400a 6375 7374 6f6d 2d6b 6579 0c63 7573 746f 6d2d 7661 6c75 65",
        ),
        ("rfc7541-c4-1", "8286 8441 8cf1 e3c2 e5f2 3a6b a0ab 90f4 ff"),
        (
            "rfc7541-c4-3",
            "8287 85bf 4088 25a8 49e9 5ba9 7d7f 8925 a849 e95b b8e8 b4bf",
        ),
        (
            "rfc7541-c6-1",
            "4882 6402 5885 aec3 771a 4b61 96d0 7abe 9410 54d4 44a8 2005 9504 0b81 66e0 82a6 2d1b ff6e 919d 29ad 1718 63c7 8f0b 97c8 e9ae 82ae 43d3",
        ),
        ("table-size-update", "20 3fe1 1f 82"),
    ];
    let mut fuzz = Fuzz::new("hpack-block")
        .corpus_dir(concat!(env!("CARGO_MANIFEST_DIR"), "/fuzz-corpus/block"))
        .input("encoded-request", encoded_request())
        .iterations(1000);
    for (name, block) in rfc {
        fuzz = fuzz.input(name, hex(block));
    }
    fuzz.run(|input| {
        // Twice through one decoder, so the second pass starts from the table the first left,
        // and under a small table as well as the default.
        for limit in [DEFAULT_TABLE_SIZE, 256] {
            let mut decoder = Decoder::new(limit);
            let _ = decoder.decode(input);
            let _ = decoder.decode_with(input, |_| {});
        }
        let _ = huffman_decode(input);
    });
}
