//! The bytes of etcd's peer streams (etcd `rafthttp/msg_codec.go`, `msgappv2_codec.go`) and
//! the translation between raft-rs's `eraftpb` and etcd's `raftpb` at the wire.
//!
//! **raftpb on the wire.** raft-rs's `eraftpb.Message` keeps etcd's field numbers and enum
//! values for every field etcd has (type 1, to 2, from 3, term 4, logTerm 5, index 6, entries 7,
//! commit 8, snapshot 9, reject 10, rejectHint 11, context 12; `Entry`, `Snapshot`,
//! `SnapshotMetadata` and `ConfState` alike), so one encoding serves both. What differs:
//! raft-rs adds `request_snapshot` (13), `deprecated_priority` (14), `commit_term` (15) and
//! `priority` (16), which etcd skips as unknown fields and which etcd never sends (raft-rs reads
//! them as zero: no request, no priority, `commit_term` 0 disables the commit-by-vote shortcut);
//! raft-rs writes proto3, so `ConfState`'s ids arrive packed, which etcd's decoder accepts; and
//! etcd always writes its non-nullable `snapshot` field, even empty, which [`decode_message`]
//! drops for any message but `MsgSnapshot`. Entry payloads (and `ConfChangeType`'s values inside
//! them) are not this module's business.
//!
//! **Streams.** `message`: each message as an 8-byte big-endian length and its raftpb bytes;
//! a `MsgHeartbeat` with `from` and `to` 0 is the *link heartbeat*, which keeps an idle
//! stream's connection alive and is never handed to raft. `msgappv2` (MsgApp only): a type
//! byte, then `0` (link heartbeat), `2` (a whole message: length and raftpb bytes), or `1`
//! (entries that continue the previous MsgApp in the same term: entry count, each entry's length
//! and bytes, then the commit index; term, log term, index, from and to are implied).
//!
//! Decoders work on a buffer the caller fills: they take one frame when it is whole and leave
//! partial ones, so a reader never blocks inside a frame. Frame lengths are bounded (etcd's
//! 512 MiB `readBytesLimit`), and the buffer grows only by what the peer actually sent.

use bytes::{Buf, BytesMut};
use etcdrs_raftnode::eraftpb::{Entry, Message, MessageType};
use protobuf::Message as _;

use crate::error::{Error, Result};

/// The largest frame a stream reader accepts (etcd's `readBytesLimit`).
pub const READ_BYTES_LIMIT: u64 = 512 * 1024 * 1024;

const MSG_TYPE_LINK_HEARTBEAT: u8 = 0;
const MSG_TYPE_APP_ENTRIES: u8 = 1;
const MSG_TYPE_APP: u8 = 2;

/// etcd's `linkHeartbeatMessage`: a `MsgHeartbeat` from nobody to nobody.
pub fn link_heartbeat() -> Message {
    let mut message = Message::default();
    message.set_msg_type(MessageType::MsgHeartbeat);
    message
}

/// Whether `message` is the link heartbeat rather than raft's.
pub fn is_link_heartbeat(message: &Message) -> bool {
    message.get_msg_type() == MessageType::MsgHeartbeat && message.from == 0 && message.to == 0
}

/// The raftpb bytes of `message`.
pub fn encode_message(message: &Message) -> Result<Vec<u8>> {
    message
        .write_to_bytes()
        .map_err(|e| Error::Message(format!("failed to marshal raft message ({e})")))
}

/// A raft message from its raftpb bytes (etcd's or ours).
pub fn decode_message(bytes: &[u8]) -> Result<Message> {
    let mut message = Message::parse_from_bytes(bytes)
        .map_err(|e| Error::Message(format!("failed to unmarshal raft message ({e})")))?;
    // etcd writes its non-nullable snapshot field on every message.
    if message.get_msg_type() != MessageType::MsgSnapshot && message.has_snapshot() {
        message.clear_snapshot();
    }
    Ok(message)
}

fn decode_entry(bytes: &[u8]) -> Result<Entry> {
    Entry::parse_from_bytes(bytes)
        .map_err(|e| Error::Message(format!("failed to unmarshal raft entry ({e})")))
}

fn too_large() -> Error {
    Error::Message("rafthttp: error limit exceeded".to_owned())
}

/// The big-endian u64 at `at` in `buf`, if that many bytes are there.
fn u64_at(buf: &[u8], at: usize) -> Option<u64> {
    let bytes = buf.get(at..at.checked_add(8)?)?;
    let mut word = [0u8; 8];
    word.copy_from_slice(bytes);
    Some(u64::from_be_bytes(word))
}

/// A frame length as a `usize`, refused over [`READ_BYTES_LIMIT`].
fn frame_len(len: u64) -> Result<usize> {
    if len > READ_BYTES_LIMIT {
        return Err(too_large());
    }
    usize::try_from(len).map_err(|_| too_large())
}

/// Append the `message` stream's frame for `message` (etcd's `messageEncoder`).
pub fn encode_frame(message: &Message, out: &mut Vec<u8>) -> Result<()> {
    let bytes = encode_message(message)?;
    out.extend_from_slice(&(bytes.len() as u64).to_be_bytes());
    out.extend_from_slice(&bytes);
    Ok(())
}

/// Take the next whole frame of a `message` stream out of `buf` (etcd's `messageDecoder`),
/// refusing frames over `limit` bytes.
pub fn decode_frame(buf: &mut BytesMut, limit: u64) -> Result<Option<Message>> {
    let Some(len) = u64_at(buf, 0) else {
        return Ok(None);
    };
    if len > limit {
        return Err(too_large());
    }
    let len = frame_len(len)?;
    if buf.len() < 8 + len {
        return Ok(None);
    }
    buf.advance(8);
    let frame = buf.split_to(len);
    decode_message(&frame).map(Some)
}

/// etcd's `msgAppV2Encoder`: remembers the last MsgApp's term and last index so that the
/// next one in the same term that continues it goes as bare entries.
#[derive(Default)]
pub struct MsgAppV2Encoder {
    term: u64,
    index: u64,
}

impl MsgAppV2Encoder {
    /// Append the encoding of `message` (a MsgApp or the link heartbeat).
    pub fn encode(&mut self, message: &Message, out: &mut Vec<u8>) -> Result<()> {
        if is_link_heartbeat(message) {
            out.push(MSG_TYPE_LINK_HEARTBEAT);
        } else if self.index == message.index
            && self.term == message.log_term
            && message.log_term == message.term
        {
            out.push(MSG_TYPE_APP_ENTRIES);
            out.extend_from_slice(&(message.entries.len() as u64).to_be_bytes());
            for entry in message.entries.iter() {
                let bytes = entry
                    .write_to_bytes()
                    .map_err(|e| Error::Message(format!("failed to marshal raft entry ({e})")))?;
                out.extend_from_slice(&(bytes.len() as u64).to_be_bytes());
                out.extend_from_slice(&bytes);
                self.index += 1;
            }
            out.extend_from_slice(&message.commit.to_be_bytes());
        } else {
            let bytes = encode_message(message)?;
            out.push(MSG_TYPE_APP);
            out.extend_from_slice(&(bytes.len() as u64).to_be_bytes());
            out.extend_from_slice(&bytes);
            self.term = message.term;
            self.index = message.entries.last().map_or(message.index, |e| e.index);
        }
        Ok(())
    }
}

/// etcd's `msgAppV2Decoder` for the stream from member `remote` to member `local`.
pub struct MsgAppV2Decoder {
    local: u64,
    remote: u64,
    term: u64,
    index: u64,
}

impl MsgAppV2Decoder {
    /// A decoder for what `remote` sends `local`.
    pub fn new(local: u64, remote: u64) -> Self {
        MsgAppV2Decoder {
            local,
            remote,
            term: 0,
            index: 0,
        }
    }

    /// Take the next whole message out of `buf`, if it is all there.
    pub fn decode(&mut self, buf: &mut BytesMut) -> Result<Option<Message>> {
        let Some(&kind) = buf.first() else {
            return Ok(None);
        };
        match kind {
            MSG_TYPE_LINK_HEARTBEAT => {
                buf.advance(1);
                Ok(Some(link_heartbeat()))
            }
            MSG_TYPE_APP => {
                let Some(len) = u64_at(buf, 1) else {
                    return Ok(None);
                };
                let len = frame_len(len)?;
                if buf.len() < 9 + len {
                    return Ok(None);
                }
                buf.advance(9);
                let message = decode_message(&buf.split_to(len))?;
                self.term = message.term;
                self.index = message.entries.last().map_or(message.index, |e| e.index);
                Ok(Some(message))
            }
            MSG_TYPE_APP_ENTRIES => {
                // Find where the frame ends before taking anything.
                let Some(count) = u64_at(buf, 1) else {
                    return Ok(None);
                };
                let mut at = 9usize;
                let mut spans = Vec::new();
                for _ in 0..count {
                    let Some(len) = u64_at(buf, at) else {
                        return Ok(None);
                    };
                    let len = frame_len(len)?;
                    let start = at + 8;
                    let end = start.checked_add(len).ok_or_else(too_large)?;
                    if end > buf.len() {
                        return Ok(None);
                    }
                    if end - 9 > READ_BYTES_LIMIT as usize {
                        return Err(too_large());
                    }
                    spans.push((start, end));
                    at = end;
                }
                let Some(commit) = u64_at(buf, at) else {
                    return Ok(None);
                };
                let frame = buf.split_to(at + 8);
                let mut message = Message::default();
                message.set_msg_type(MessageType::MsgAppend);
                message.from = self.remote;
                message.to = self.local;
                message.term = self.term;
                message.log_term = self.term;
                message.index = self.index;
                message.commit = commit;
                for (start, end) in spans {
                    message.entries.push(decode_entry(&frame[start..end])?);
                    self.index += 1;
                }
                Ok(Some(message))
            }
            other => Err(Error::Message(format!(
                "failed to parse type {other} in msgappv2 stream"
            ))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(term: u64, index: u64, data: &[u8]) -> Entry {
        Entry {
            term,
            index,
            data: data.to_vec().into(),
            ..Default::default()
        }
    }

    fn app(term: u64, log_term: u64, index: u64, entries: Vec<Entry>, commit: u64) -> Message {
        let mut m = Message::default();
        m.set_msg_type(MessageType::MsgAppend);
        m.from = 2;
        m.to = 1;
        m.term = term;
        m.log_term = log_term;
        m.index = index;
        m.entries = entries.into();
        m.commit = commit;
        m
    }

    #[test]
    fn msgappv2_round_trip_uses_the_compact_form_for_continuations() {
        let mut enc = MsgAppV2Encoder::default();
        let mut dec = MsgAppV2Decoder::new(1, 2);
        let messages = vec![
            app(3, 2, 10, vec![entry(3, 11, b"a")], 9),
            app(3, 3, 11, vec![entry(3, 12, b"b"), entry(3, 13, b"c")], 11),
            link_heartbeat(),
            app(3, 3, 13, vec![], 13),
            app(4, 3, 13, vec![entry(4, 14, b"d")], 13),
        ];
        let mut out = Vec::new();
        let mut kinds = Vec::new();
        for m in &messages {
            kinds.push(out.len());
            enc.encode(m, &mut out).expect("encode");
        }
        let types: Vec<u8> = kinds.iter().map(|at| out[*at]).collect();
        assert_eq!(types, vec![2, 1, 0, 1, 2]);
        // Fed one byte at a time, the decoder yields each message once it is whole.
        let mut buf = BytesMut::new();
        let mut decoded = Vec::new();
        for byte in out {
            buf.extend_from_slice(&[byte]);
            while let Some(m) = dec.decode(&mut buf).expect("decode") {
                decoded.push(m);
            }
        }
        assert_eq!(decoded, messages);
    }

    #[test]
    fn message_frames_round_trip_and_respect_the_limit() {
        let mut out = Vec::new();
        let mut hb = Message::default();
        hb.set_msg_type(MessageType::MsgHeartbeat);
        hb.from = 5;
        hb.to = 6;
        hb.commit = 7;
        encode_frame(&hb, &mut out).expect("encode");
        encode_frame(&link_heartbeat(), &mut out).expect("encode");
        let mut buf = BytesMut::from(&out[..]);
        assert_eq!(decode_frame(&mut buf, 1024).expect("frame"), Some(hb));
        let second = decode_frame(&mut buf, 1024).expect("frame").expect("whole");
        assert!(is_link_heartbeat(&second));
        assert_eq!(decode_frame(&mut buf, 1024).expect("empty"), None);
        let mut huge = BytesMut::from(&(2048u64).to_be_bytes()[..]);
        assert!(decode_frame(&mut huge, 1024).is_err());
    }

    #[test]
    fn etcds_always_present_snapshot_is_dropped_from_other_messages() {
        // MsgHeartbeat{to:2, from:1, term:3, commit:4} as gogoproto writes etcd's raftpb:
        // every non-nullable field, the empty snapshot (and its metadata) included.
        let etcd = [
            0x08, 0x08, 0x10, 0x02, 0x18, 0x01, 0x20, 0x03, 0x28, 0x00, 0x30, 0x00, 0x40, 0x04,
            0x4a, 0x08, 0x12, 0x06, 0x0a, 0x00, 0x10, 0x00, 0x18, 0x00, 0x50, 0x00, 0x58, 0x00,
        ];
        let m = decode_message(&etcd).expect("decode");
        assert_eq!(m.get_msg_type(), MessageType::MsgHeartbeat);
        assert_eq!((m.to, m.from, m.term, m.commit), (2, 1, 3, 4));
        assert!(!m.has_snapshot());
    }

    #[test]
    fn an_unknown_msgappv2_type_is_etcds_error() {
        let mut buf = BytesMut::from(&[9u8][..]);
        let err = MsgAppV2Decoder::new(1, 2)
            .decode(&mut buf)
            .expect_err("bad type");
        assert_eq!(err.to_string(), "failed to parse type 9 in msgappv2 stream");
    }
}
