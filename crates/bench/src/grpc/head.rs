//! Request header blocks (RFC 7541), encoded the way real gRPC clients (Go's gRPC, `h2`)
//! encode them: every field enters the connection's dynamic table once and is an index from
//! then on, and a caller keeps its all-index block until an insertion moves the indexes
//! ([`HeadEncoder::generation`]). Response headers are decoded elsewhere, by
//! `etcdrs_hpack::Decoder`.

use std::collections::HashMap;

use bytes::{Bytes, BytesMut};
use etcdrs_hpack::{DEFAULT_TABLE_SIZE, STATIC_ENTRIES};

/// The fields of one request that vary by method and endpoint.
pub(super) struct RequestFields<'a> {
    pub(super) path: &'a Bytes,
    pub(super) authority: &'a Bytes,
    /// The caller's copy of its last all-index header block.
    pub(super) cached: &'a mut Option<(u64, Bytes)>,
}

/// Static-table entries (RFC 7541 Appendix A) the request headers use.
const STATIC_AUTHORITY: usize = 1;
const STATIC_METHOD_POST: usize = 3;
const STATIC_PATH: usize = 4;
const STATIC_SCHEME_HTTP: usize = 6;
const STATIC_CONTENT_TYPE: usize = 31;

/// The encoder side of a connection's request-header dynamic table (RFC 7541 §2.3). A field is
/// sent once as a literal with incremental indexing, then as an index. Entries are never
/// evicted: a field that no longer fits is sent as a literal without indexing, so an entry's
/// insertion number fixes its index.
pub(super) struct HeadEncoder {
    /// Insertion number of each field in the table, by (static name index or 0, name, value).
    entries: HashMap<(usize, &'static str, Bytes), usize>,
    /// Entries inserted so far.
    inserted: usize,
    /// Bytes of the table in use (RFC 7541 §4.1).
    used: usize,
    /// The table's size; 0 once the server lowered it below what is in use.
    capacity: usize,
    /// The table was emptied: the next block starts with a size update to 0.
    size_update: bool,
    /// Changes whenever an index would change: a cached block of another generation is stale.
    generation: u64,
}

impl Default for HeadEncoder {
    fn default() -> Self {
        HeadEncoder {
            entries: HashMap::new(),
            inserted: 0,
            used: 0,
            capacity: DEFAULT_TABLE_SIZE,
            size_update: false,
            generation: 0,
        }
    }
}

impl HeadEncoder {
    /// The server's SETTINGS_HEADER_TABLE_SIZE. A limit below what the table holds empties it
    /// (with a size update to 0) and ends indexing on this connection.
    pub(super) fn limit(&mut self, size: usize) {
        if size < self.capacity {
            self.entries.clear();
            self.used = 0;
            self.capacity = 0;
            self.size_update = true;
            self.generation += 1;
        }
    }

    /// The header block of a gRPC request: `:method POST` and `:scheme http` from the static
    /// table, then `:path`, `:authority`, `content-type: application/grpc` and `te: trailers`.
    pub(super) fn head(&mut self, f: RequestFields<'_>) -> Bytes {
        if let Some((generation, block)) = f.cached.as_ref()
            && *generation == self.generation
        {
            return block.clone();
        }
        let mut b = BytesMut::with_capacity(64);
        let mut all_indexed = !std::mem::take(&mut self.size_update);
        if !all_indexed {
            hpack_int(&mut b, 5, 0x20, 0);
        }
        hpack_int(&mut b, 7, 0x80, STATIC_METHOD_POST);
        hpack_int(&mut b, 7, 0x80, STATIC_SCHEME_HTTP);
        all_indexed &= self.field(&mut b, STATIC_PATH, "", f.path);
        all_indexed &= self.field(&mut b, STATIC_AUTHORITY, "", f.authority);
        all_indexed &= self.field(&mut b, STATIC_CONTENT_TYPE, "", &CONTENT_TYPE_GRPC);
        all_indexed &= self.field(&mut b, 0, "te", &TE_TRAILERS);
        let block = b.freeze();
        if all_indexed {
            *f.cached = Some((self.generation, block.clone()));
        }
        block
    }

    /// One field: an index if the table has it (`true`), else a literal that enters the table
    /// if it fits, else a plain literal. `name_index` 0: the name is `name`, sent as a literal.
    fn field(
        &mut self,
        b: &mut BytesMut,
        name_index: usize,
        name: &'static str,
        value: &Bytes,
    ) -> bool {
        let key = (name_index, name, value.clone());
        if let Some(k) = self.entries.get(&key) {
            // The newest entry is index 62, the one before it 63, and so on.
            hpack_int(b, 7, 0x80, STATIC_ENTRIES + 1 + self.inserted - k);
            return true;
        }
        let (name_index, name, value) = key;
        let size = name.len().max(static_name_len(name_index)) + value.len() + 32;
        let index = self.used + size <= self.capacity;
        let (prefix, flags) = if index { (6, 0x40) } else { (4, 0x00) };
        hpack_int(b, prefix, flags, name_index);
        if name_index == 0 {
            hpack_string(b, name.as_bytes());
        }
        hpack_string(b, &value);
        if index {
            self.inserted += 1;
            self.used += size;
            self.generation += 1;
            self.entries
                .insert((name_index, name, value), self.inserted);
        }
        false
    }
}

static CONTENT_TYPE_GRPC: Bytes = Bytes::from_static(b"application/grpc");
static TE_TRAILERS: Bytes = Bytes::from_static(b"trailers");

/// Length of the name of static-table entry `index` (of those the request headers use).
fn static_name_len(index: usize) -> usize {
    match index {
        STATIC_AUTHORITY => ":authority".len(),
        STATIC_PATH => ":path".len(),
        STATIC_CONTENT_TYPE => "content-type".len(),
        _ => 0,
    }
}

/// A string literal, not Huffman-coded.
fn hpack_string(b: &mut BytesMut, s: &[u8]) {
    etcdrs_hpack::encode_string(b, s);
}

/// An integer with an N-bit prefix (RFC 7541 §5.1); `flags` fills the first byte's high bits.
fn hpack_int(b: &mut BytesMut, prefix_bits: u8, flags: u8, v: usize) {
    etcdrs_hpack::encode_int(b, flags, prefix_bits, v);
}

#[cfg(test)]
mod tests {
    use super::super::{KV_PUT, KV_RANGE};
    use super::*;

    /// Header blocks `encoder` makes for `path`, decoded by an independent decoder that has
    /// seen every block before (as the server's has).
    fn decode_all(decoder: &mut etcdrs_hpack::Decoder, block: &[u8]) -> Vec<(String, String)> {
        decoder
            .decode(block)
            .expect("a valid header block")
            .into_iter()
            .map(|f| {
                (
                    String::from_utf8_lossy(&f.name).into_owned(),
                    String::from_utf8_lossy(&f.value).into_owned(),
                )
            })
            .collect()
    }

    fn request(path: &str, authority: &str) -> Vec<(String, String)> {
        [
            (":method", "POST"),
            (":scheme", "http"),
            (":path", path),
            (":authority", authority),
            ("content-type", "application/grpc"),
            ("te", "trailers"),
        ]
        .iter()
        .map(|(n, v)| ((*n).to_owned(), (*v).to_owned()))
        .collect()
    }

    #[test]
    fn request_heads_index_their_fields_and_stay_decodable() {
        let authority = Bytes::from_static(b"127.0.0.1:2379");
        let range = Bytes::from_static(KV_RANGE.as_bytes());
        let put = Bytes::from_static(KV_PUT.as_bytes());
        let mut encoder = HeadEncoder::default();
        let mut decoder = etcdrs_hpack::Decoder::new(DEFAULT_TABLE_SIZE);
        let (mut range_cache, mut put_cache) = (None, None);
        let head = |encoder: &mut HeadEncoder, path: &Bytes, cache: &mut Option<(u64, Bytes)>| {
            encoder.head(RequestFields {
                path,
                authority: &authority,
                cached: cache,
            })
        };

        // The first block inserts; the second is indexes only, and is cached.
        let first = head(&mut encoder, &range, &mut range_cache);
        assert!(range_cache.is_none());
        assert_eq!(
            decode_all(&mut decoder, &first),
            request(KV_RANGE, "127.0.0.1:2379")
        );
        let second = head(&mut encoder, &range, &mut range_cache);
        assert!(second.len() < 8, "{second:?} is not all indexes");
        assert_eq!(range_cache.as_ref().map(|c| &c.1), Some(&second));
        assert_eq!(
            decode_all(&mut decoder, &second),
            request(KV_RANGE, "127.0.0.1:2379")
        );

        // Another method inserts its path: every index moves, so the cached block is stale.
        let put_first = head(&mut encoder, &put, &mut put_cache);
        assert_eq!(
            decode_all(&mut decoder, &put_first),
            request(KV_PUT, "127.0.0.1:2379")
        );
        let third = head(&mut encoder, &range, &mut range_cache);
        assert_ne!(third, second);
        assert_eq!(
            decode_all(&mut decoder, &third),
            request(KV_RANGE, "127.0.0.1:2379")
        );

        // A table size lowered by the server empties the table; literals from then on.
        encoder.limit(0);
        let after = head(&mut encoder, &range, &mut range_cache);
        assert_eq!(after[0], 0x20, "a size update to 0 comes first");
        assert_eq!(
            decode_all(&mut decoder, &after),
            request(KV_RANGE, "127.0.0.1:2379")
        );
        let again = head(&mut encoder, &put, &mut put_cache);
        assert_eq!(
            decode_all(&mut decoder, &again),
            request(KV_PUT, "127.0.0.1:2379")
        );
    }

    #[test]
    fn fields_that_do_not_fit_are_sent_as_literals() {
        let authority = Bytes::from_static(b"127.0.0.1:2379");
        let long: Bytes = format!("/svc/{}", "m".repeat(5000)).into();
        let mut encoder = HeadEncoder::default();
        let mut decoder = etcdrs_hpack::Decoder::new(DEFAULT_TABLE_SIZE);
        let mut cache = None;
        for _ in 0..3 {
            let block = encoder.head(RequestFields {
                path: &long,
                authority: &authority,
                cached: &mut cache,
            });
            let want = request(
                std::str::from_utf8(&long).unwrap_or_default(),
                "127.0.0.1:2379",
            );
            assert_eq!(decode_all(&mut decoder, &block), want);
        }
        assert!(cache.is_none(), "a block with a literal is never cached");
    }

    #[test]
    fn integers_past_their_prefix_continue_in_7_bit_groups() {
        // RFC 7541 C.1.2: 1337 with a 5-bit prefix.
        let mut b = BytesMut::new();
        hpack_int(&mut b, 5, 0, 1337);
        assert_eq!(&b[..], [31, 154, 10]);
        // Static-table entry 31 (content-type) in a 4-bit prefix.
        let mut b = BytesMut::new();
        hpack_int(&mut b, 4, 0, 31);
        assert_eq!(&b[..], [15, 16]);
    }
}
