//! Why a header block does not decode (RFC 7541).

/// Why a header block does not decode. A decoder that fails has lost track of its peer's
/// table: the connection must end (RFC 7541 §2.2: a COMPRESSION_ERROR).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The block ended inside a representation.
    #[error("hpack: truncated header block")]
    Truncated,
    /// An integer does not fit the sizes we accept.
    #[error("hpack: integer overflow")]
    IntegerOverflow,
    /// An index is 0 or beyond the static and dynamic tables.
    #[error("hpack: invalid table index {0}")]
    InvalidIndex(usize),
    /// A Huffman string holds the EOS symbol.
    #[error("hpack: huffman string contains EOS")]
    HuffmanEos,
    /// A Huffman string's padding is longer than 7 bits or not all ones.
    #[error("hpack: invalid huffman padding")]
    HuffmanPadding,
    /// A dynamic table size update above the limit the decoder's side advertised.
    #[error("hpack: dynamic table size update to {requested} exceeds {limit}")]
    TableSizeTooLarge {
        /// The size the encoder asked for.
        requested: usize,
        /// The SETTINGS_HEADER_TABLE_SIZE the encoder works under.
        limit: usize,
    },
    /// A dynamic table size update after the first header field of a block.
    #[error("hpack: dynamic table size update after a header field")]
    LateTableSizeUpdate,
    /// The decoded header list is larger than we accept.
    #[error("hpack: decoded header list exceeds {limit} bytes")]
    HeaderListTooLarge {
        /// The bound, in RFC 7541 sizes (name + value + 32 per field).
        limit: usize,
    },
}

/// The crate's result type.
pub type Result<T, E = Error> = std::result::Result<T, E>;
