//! HTTP/2 framing (RFC 9113) as the unary client needs it: the frame types, flags, settings
//! and error codes it sends or reads, the window sizes it advertises, and the few frame
//! writers (`frame_head`, `window_update`, `rst_stream`) and readers (`unpad`, `be_u32`) the
//! connection and its task share. No connection state lives here.

use bytes::{BufMut, BytesMut};

/// Largest response message a call accepts (etcd's default client limit is larger than any
/// response these workloads provoke).
pub(super) const MAX_RESPONSE: usize = 64 << 20;

/// The client connection preface.
pub(super) const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

// Frame types.
pub(super) const DATA: u8 = 0;
pub(super) const HEADERS: u8 = 1;
pub(super) const RST_STREAM: u8 = 3;
pub(super) const SETTINGS: u8 = 4;
pub(super) const PUSH_PROMISE: u8 = 5;
pub(super) const PING: u8 = 6;
pub(super) const GOAWAY: u8 = 7;
pub(super) const WINDOW_UPDATE: u8 = 8;
pub(super) const CONTINUATION: u8 = 9;

// Frame flags.
pub(super) const END_STREAM: u8 = 0x1;
pub(super) const ACK: u8 = 0x1;
pub(super) const END_HEADERS: u8 = 0x4;
pub(super) const PADDED: u8 = 0x8;
pub(super) const PRIORITY: u8 = 0x20;

// Settings.
pub(super) const SETTINGS_HEADER_TABLE_SIZE: u16 = 0x1;
pub(super) const SETTINGS_ENABLE_PUSH: u16 = 0x2;
pub(super) const SETTINGS_MAX_CONCURRENT_STREAMS: u16 = 0x3;
pub(super) const SETTINGS_INITIAL_WINDOW_SIZE: u16 = 0x4;
pub(super) const SETTINGS_MAX_FRAME_SIZE: u16 = 0x5;

/// The error code of a stream we give up on.
pub(super) const CANCEL: u32 = 0x8;
/// Flow-control windows before any setting or update says otherwise.
pub(super) const DEFAULT_WINDOW: i64 = 65_535;
/// The largest frame we accept: we do not raise it from the protocol's default.
pub(super) const MAX_RECV_FRAME: usize = 16_384;
/// The receive window of each stream we open, the largest HTTP/2 allows: a response never
/// waits for a stream-level WINDOW_UPDATE.
pub(super) const STREAM_WINDOW: u32 = (1 << 31) - 1;
/// The connection's receive window; topped up whenever half of it has been received.
pub(super) const CONN_WINDOW: u32 = 16 << 20;
/// Streams a connection opens at once until the server's settings arrive (RFC 9113 §6.5.2
/// asks servers to allow at least 100).
pub(super) const STREAMS_BEFORE_SETTINGS: usize = 100;
/// Bytes read from the socket at a time.
pub(super) const READ_CHUNK: usize = 64 * 1024;

/// The payload of a DATA or HEADERS frame without its padding.
pub(super) fn unpad(flags: u8, payload: &[u8]) -> Result<&[u8], String> {
    if flags & PADDED == 0 {
        return Ok(payload);
    }
    let pad = usize::from(*payload.first().ok_or("padded frame without a pad length")?);
    payload
        .get(1..payload.len().saturating_sub(pad))
        .filter(|_| pad < payload.len())
        .ok_or_else(|| "padding longer than the frame".to_owned())
}

pub(super) fn be_u32(b: &[u8]) -> Option<u32> {
    Some(u32::from_be_bytes(b.get(..4)?.try_into().ok()?))
}

/// A frame's 9-byte header.
pub(super) fn frame_head(out: &mut BytesMut, len: usize, kind: u8, flags: u8, id: u32) {
    out.put_uint(len as u64, 3);
    out.put_u8(kind);
    out.put_u8(flags);
    out.put_u32(id);
}

pub(super) fn window_update(out: &mut BytesMut, id: u32, inc: u32) {
    frame_head(out, 4, WINDOW_UPDATE, 0, id);
    out.put_u32(inc);
}

pub(super) fn rst_stream(out: &mut BytesMut, id: u32, code: u32) {
    frame_head(out, 4, RST_STREAM, 0, id);
    out.put_u32(code);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn padding_is_removed_and_checked() {
        assert_eq!(unpad(0, b"abc"), Ok(&b"abc"[..]));
        assert_eq!(unpad(PADDED, b"\x02abcXX"), Ok(&b"abc"[..]));
        assert!(unpad(PADDED, b"\x05ab").is_err());
        assert!(unpad(PADDED, b"").is_err());
    }

    #[test]
    fn frames_start_with_a_nine_byte_header() {
        let mut out = BytesMut::new();
        window_update(&mut out, 3, 0x10);
        assert_eq!(
            &out[..],
            [0, 0, 4, WINDOW_UPDATE, 0, 0, 0, 0, 3, 0, 0, 0, 0x10]
        );
        assert_eq!(be_u32(&out[9..]), Some(0x10));
        let mut out = BytesMut::new();
        rst_stream(&mut out, 5, CANCEL);
        assert_eq!(&out[..], [0, 0, 4, RST_STREAM, 0, 0, 0, 0, 5, 0, 0, 0, 8]);
        assert_eq!(be_u32(&out[..3]), None);
    }
}
