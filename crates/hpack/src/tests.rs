//! The codec against RFC 7541's examples (Appendix C) and its tables' own structure.

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

fn table(decoder: &Decoder) -> Vec<(String, String)> {
    decoder
        .table
        .iter()
        .map(|(n, v)| {
            (
                String::from_utf8(n.clone()).unwrap(),
                String::from_utf8(v.clone()).unwrap(),
            )
        })
        .collect()
}

#[test]
fn huffman_table_is_a_complete_canonical_code() {
    // Kraft sum exactly 1 (complete, so every bit string decodes) and canonical ordering
    // (codes consecutive in (length, symbol) order), which catches any mistyped entry.
    let kraft: u64 = HUFFMAN_CODES
        .iter()
        .map(|&(_, len)| 1u64 << (30 - len))
        .sum();
    assert_eq!(kraft, 1 << 30);
    let mut order: Vec<usize> = (0..HUFFMAN_CODES.len()).collect();
    order.sort_by_key(|&s| (HUFFMAN_CODES[s].1, s));
    let mut expected = 0u32;
    let mut prev_len = HUFFMAN_CODES[order[0]].1;
    for (i, &s) in order.iter().enumerate() {
        let (code, len) = HUFFMAN_CODES[s];
        if i > 0 {
            expected = (expected + 1) << (len - prev_len);
        }
        assert_eq!(code, expected, "symbol {s}");
        prev_len = len;
    }
    assert_eq!(HUFFMAN_CODES[256], (0x3fff_ffff, 30));
}

#[test]
fn huffman_decodes_rfc7541_examples() {
    let cases = [
        // C.4
        ("f1e3 c2e5 f23a 6ba0 ab90 f4ff", "www.example.com"),
        ("a8eb 1064 9cbf", "no-cache"),
        ("25a8 49e9 5ba9 7d7f", "custom-key"),
        ("25a8 49e9 5bb8 e8b4 bf", "custom-value"),
        // C.6
        ("6402", "302"),
        ("aec3 771a 4b", "private"),
        (
            "d07a be94 1054 d444 a820 0595 040b 8166 e082 a62d 1bff",
            "Mon, 21 Oct 2013 20:13:21 GMT",
        ),
        (
            "9d29 ad17 1863 c78f 0b97 c8e9 ae82 ae43 d3",
            "https://www.example.com",
        ),
    ];
    for (code, text) in cases {
        assert_eq!(
            huffman_decode(&hex(code)).unwrap(),
            text.as_bytes(),
            "{text}"
        );
        assert_eq!(huffman_encode(text.as_bytes()), hex(code), "{text}");
    }
}

#[test]
fn huffman_round_trips_every_byte() {
    let all: Vec<u8> = (0..=255).collect();
    assert_eq!(huffman_decode(&huffman_encode(&all)).unwrap(), all);
    assert_eq!(huffman_decode(&[]).unwrap(), b"");
}

#[test]
fn huffman_rejects_bad_padding_and_eos() {
    // '0' is 00000; zero padding is not EOS's prefix.
    assert_eq!(huffman_decode(&[0x00]), Err(Error::HuffmanPadding));
    // A whole byte of padding.
    assert_eq!(huffman_decode(&[0x07, 0xff]), Err(Error::HuffmanPadding));
    // EOS itself (30 ones).
    assert_eq!(
        huffman_decode(&[0xff, 0xff, 0xff, 0xff]),
        Err(Error::HuffmanEos)
    );
}

type Pairs<'a> = &'a [(&'a str, &'a str)];

/// Decodes `(block, expected headers, expected dynamic table, expected table size)` in order.
fn check_sequence(limit: usize, steps: &[(&str, Pairs<'_>, Pairs<'_>, usize)]) {
    let mut decoder = Decoder::new(limit);
    for (i, (block, headers, dynamic, size)) in steps.iter().enumerate() {
        assert_eq!(
            decoder.decode(&hex(block)).unwrap(),
            fields(headers),
            "step {i}"
        );
        let expected: Vec<(String, String)> = dynamic
            .iter()
            .map(|(n, v)| (n.to_string(), v.to_string()))
            .collect();
        assert_eq!(table(&decoder), expected, "step {i}");
        assert_eq!(decoder.size, *size, "step {i}");
    }
}

const REQ1: &[(&str, &str)] = &[
    (":method", "GET"),
    (":scheme", "http"),
    (":path", "/"),
    (":authority", "www.example.com"),
];
const REQ2: &[(&str, &str)] = &[
    (":method", "GET"),
    (":scheme", "http"),
    (":path", "/"),
    (":authority", "www.example.com"),
    ("cache-control", "no-cache"),
];
const REQ3: &[(&str, &str)] = &[
    (":method", "GET"),
    (":scheme", "https"),
    (":path", "/index.html"),
    (":authority", "www.example.com"),
    ("custom-key", "custom-value"),
];
const TABLE1: &[(&str, &str)] = &[(":authority", "www.example.com")];
const TABLE2: &[(&str, &str)] = &[
    ("cache-control", "no-cache"),
    (":authority", "www.example.com"),
];
const TABLE3: &[(&str, &str)] = &[
    ("custom-key", "custom-value"),
    ("cache-control", "no-cache"),
    (":authority", "www.example.com"),
];

#[test]
fn decodes_rfc7541_c3_requests_without_huffman() {
    check_sequence(
        4096,
        &[
            (
                "8286 8441 0f77 7777 2e65 7861 6d70 6c65 2e63 6f6d",
                REQ1,
                TABLE1,
                57,
            ),
            ("8286 84be 5808 6e6f 2d63 6163 6865", REQ2, TABLE2, 110),
            (
                "8287 85bf 400a 6375 7374 6f6d 2d6b 6579 0c63 7573 746f 6d2d 7661 6c75 65",
                REQ3,
                TABLE3,
                164,
            ),
        ],
    );
}

#[test]
fn decodes_rfc7541_c4_requests_with_huffman() {
    check_sequence(
        4096,
        &[
            (
                "8286 8441 8cf1 e3c2 e5f2 3a6b a0ab 90f4 ff",
                REQ1,
                TABLE1,
                57,
            ),
            ("8286 84be 5886 a8eb 1064 9cbf", REQ2, TABLE2, 110),
            (
                "8287 85bf 4088 25a8 49e9 5ba9 7d7f 8925 a849 e95b b8e8 b4bf",
                REQ3,
                TABLE3,
                164,
            ),
        ],
    );
}

#[test]
fn decodes_rfc7541_c6_responses_with_eviction() {
    let date1 = "Mon, 21 Oct 2013 20:13:21 GMT";
    let date2 = "Mon, 21 Oct 2013 20:13:22 GMT";
    let loc = "https://www.example.com";
    let cookie = "foo=ASDJKHQKBZXOQWEOPIUAXQWEOIU; max-age=3600; version=1";
    check_sequence(
        256,
        &[
            (
                "4882 6402 5885 aec3 771a 4b61 96d0 7abe 9410 54d4 44a8 2005 9504 0b81 66e0
                 82a6 2d1b ff6e 919d 29ad 1718 63c7 8f0b 97c8 e9ae 82ae 43d3",
                &[
                    (":status", "302"),
                    ("cache-control", "private"),
                    ("date", date1),
                    ("location", loc),
                ],
                &[
                    ("location", loc),
                    ("date", date1),
                    ("cache-control", "private"),
                    (":status", "302"),
                ],
                222,
            ),
            (
                "4883 640e ffc1 c0bf",
                &[
                    (":status", "307"),
                    ("cache-control", "private"),
                    ("date", date1),
                    ("location", loc),
                ],
                &[
                    (":status", "307"),
                    ("location", loc),
                    ("date", date1),
                    ("cache-control", "private"),
                ],
                222,
            ),
            (
                "88c1 6196 d07a be94 1054 d444 a820 0595 040b 8166 e084 a62d 1bff c05a 839b
                 d9ab 77ad 94e7 821d d7f2 e6c7 b335 dfdf cd5b 3960 d5af 2708 7f36 72c1 ab27
                 0fb5 291f 9587 3160 65c0 03ed 4ee5 b106 3d50 07",
                &[
                    (":status", "200"),
                    ("cache-control", "private"),
                    ("date", date2),
                    ("location", loc),
                    ("content-encoding", "gzip"),
                    ("set-cookie", cookie),
                ],
                &[
                    ("set-cookie", cookie),
                    ("content-encoding", "gzip"),
                    ("date", date2),
                ],
                215,
            ),
        ],
    );
}

#[test]
fn table_size_updates() {
    let mut decoder = Decoder::new(4096);
    decoder
        .decode(&hex("8286 8441 0f77 7777 2e65 7861 6d70 6c65 2e63 6f6d"))
        .unwrap();
    assert_eq!(decoder.size, 57);
    // Size update to 0 (empties the table), then back to 4096, then a field.
    assert_eq!(
        decoder.decode(&hex("20 3fe1 1f 82")).unwrap(),
        fields(&[(":method", "GET")])
    );
    assert_eq!((decoder.size, decoder.max_size), (0, 4096));
    assert_eq!(decoder.decode(&hex("be")), Err(Error::InvalidIndex(62)));
    // Above the server's limit.
    assert_eq!(
        decoder.decode(&hex("3fe2 1f")),
        Err(Error::TableSizeTooLarge {
            requested: 4097,
            limit: 4096
        })
    );
    // After a field.
    assert_eq!(
        decoder.decode(&hex("82 20")),
        Err(Error::LateTableSizeUpdate)
    );
    assert_eq!(decoder.decode(&hex("80")), Err(Error::InvalidIndex(0)));
    assert_eq!(decoder.decode(&hex("41 0f77")), Err(Error::Truncated));
    assert_eq!(
        decoder.decode(&hex("ff ff ff ff ff 0f")),
        Err(Error::IntegerOverflow)
    );
}

#[test]
fn literals_never_enter_the_peers_table_and_keep_never_indexed() {
    let mut decoder = Decoder::new(DEFAULT_TABLE_SIZE);
    let mut block = hex("8286 84 41");
    let coded = huffman_encode(b"127.0.0.1:2379");
    encode_int(&mut block, 0x80, 7, coded.len());
    block.extend_from_slice(&coded);
    // A never-indexed custom field.
    block.extend_from_slice(&hex("10 01 78 01 79"));
    let decoded = decoder.decode(&block).unwrap();
    let mut encoded = Vec::new();
    for field in &decoded {
        encode_literal(&mut encoded, field);
    }

    let mut fresh = Decoder::new(DEFAULT_TABLE_SIZE);
    let mut expected = fields(&[
        (":method", "GET"),
        (":scheme", "http"),
        (":path", "/"),
        (":authority", "127.0.0.1:2379"),
        ("x", "y"),
    ]);
    expected[4].never_indexed = true;
    assert_eq!(fresh.decode(&encoded).unwrap(), expected);
    assert!(fresh.table.is_empty(), "literals must not index");
}

#[test]
fn decode_with_lends_fields_in_order() {
    let mut decoder = Decoder::new(DEFAULT_TABLE_SIZE);
    let mut seen = Vec::new();
    decoder
        .decode_with(
            &hex("8286 8441 0f77 7777 2e65 7861 6d70 6c65 2e63 6f6d be"),
            |f| {
                seen.push(HeaderField::from(f));
            },
        )
        .unwrap();
    let mut expected = fields(REQ1);
    expected.push(expected[3].clone());
    assert_eq!(seen, expected);
}

#[test]
fn header_lists_are_bounded() {
    // One 4,000-byte entry in the table, then indexed 300 times: 1.2 MB decoded from a
    // block of a few kilobytes. Decoding stops at the bound.
    let mut block = hex("40 01 78");
    encode_string(&mut block, &[b'v'; 4000]);
    block.extend(std::iter::repeat_n(0xbe, 300));
    let mut calls = 0;
    let result = Decoder::new(DEFAULT_TABLE_SIZE).decode_with(&block, |_| calls += 1);
    assert_eq!(
        result,
        Err(Error::HeaderListTooLarge {
            limit: MAX_HEADER_LIST
        })
    );
    assert!(calls < 300, "{calls}");
}

#[test]
fn integers_round_trip_at_every_prefix() {
    for prefix in 1..=7u8 {
        for value in [0, 1, 30, 31, 127, 128, 255, 4096, 1 << 20, (1 << 28) - 1] {
            let mut out = Vec::new();
            encode_int(&mut out, 0, prefix, value);
            let mut src = &out[..];
            assert_eq!(decode_int(&mut src, prefix), Ok(value), "{prefix} {value}");
            assert!(src.is_empty());
        }
    }
}
