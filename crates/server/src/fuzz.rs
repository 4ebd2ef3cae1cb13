//! Fuzzing of what a member decodes from its peers (issue 20): rafthttp's `message` stream
//! frames (`rafthttp::codec::decode_frame`, also the head of a `POST /raft/snapshot`), its
//! msgappv2 stream (`MsgAppV2Decoder`), a pipeline body (`codec::decode_message`), and the
//! payloads of the entries they carry as the applier reads them (`server::request::decode`,
//! etcd's `ConfChange` with `EtcdConfChange::decode` and its JSON context). Any bytes must
//! give an error, never a panic or a length trusted into an allocation. Corpus:
//! `crates/server/fuzz-corpus/peer-message/`, streams of the messages raft exchanges
//! carrying etcd 3.4's entries from
//! `crates/etcddir/fuzz-corpus/entry/` (`ETCDRS_FUZZ_REGEN=1` rewrites them). Runner and
//! knobs: `etcdrs-fuzz`. What raft-rs then does with the decoded messages, and with the conf
//! state read from the backend, is fuzzed in `raft_step`.

use std::path::Path;

use bytes::BytesMut;
use etcdrs_fuzz::Fuzz;
use etcdrs_proto::raft_internal::ConfigChangeContext;
use etcdrs_raftnode::confchange::EtcdConfChange;
use etcdrs_raftnode::eraftpb::{Entry, EntryType, Message, MessageType};
use protobuf::Message as _;

use etcdrs_rafthttp::codec::{self, MsgAppV2Decoder, MsgAppV2Encoder};

mod raft_step;

/// A frame limit for the fuzzed streams (etcd's `readBytesLimit` is 512 MiB; the fuzzer's
/// inputs are small, so a smaller one finds the same length checks).
const FRAME_LIMIT: u64 = 1 << 20;

/// etcd 3.4's entry payloads, checked in beside etcd's WAL.
fn etcd_entries() -> Vec<Entry> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../etcddir/fuzz-corpus/entry");
    let mut paths: Vec<_> = std::fs::read_dir(&dir)
        .expect("read etcddir's entry corpus")
        .map(|entry| entry.expect("list the entry corpus").path())
        .collect();
    paths.sort();
    paths
        .iter()
        .enumerate()
        .map(|(n_entry, path)| {
            let mut entry = Entry {
                index: n_entry as u64 + 1,
                term: 2,
                ..Default::default()
            };
            let name = path.to_string_lossy();
            if name.contains("confchange") {
                entry.set_entry_type(EntryType::EntryConfChange);
            }
            entry.data = std::fs::read(path).expect("read an entry").into();
            entry
        })
        .collect()
}

fn message(kind: MessageType, entries: Vec<Entry>) -> Vec<u8> {
    let mut message = Message::default();
    message.set_msg_type(kind);
    message.from = 0x8e9e_05c5_2164_694d;
    message.to = 0x91bc_3c39_8fb3_c146;
    message.term = 2;
    message.log_term = 2;
    message.index = 3;
    message.commit = 5;
    message.set_entries(entries.into());
    if kind == MessageType::MsgSnapshot {
        let snapshot = message.mut_snapshot();
        snapshot.mut_metadata().index = 18;
        snapshot.mut_metadata().term = 2;
        snapshot.mut_metadata().mut_conf_state().voters = vec![0x8e9e_05c5_2164_694d];
    }
    message.write_to_bytes().expect("encode a raft message")
}

fn message_bytes(kind: MessageType, entries: Vec<Entry>) -> Message {
    let mut m = Message::default();
    m.merge_from_bytes(&message(kind, entries))
        .expect("decode our own message");
    m
}

fn streams() -> Vec<(&'static str, Vec<u8>)> {
    let frames = |messages: Vec<Message>| {
        let mut out = Vec::new();
        for m in &messages {
            codec::encode_frame(m, &mut out).expect("encode a frame");
        }
        out
    };
    let append = message_bytes(MessageType::MsgAppend, etcd_entries());
    let mut msgapp = Vec::new();
    let mut encoder = MsgAppV2Encoder::default();
    encoder
        .encode(&append, &mut msgapp)
        .expect("encode msgappv2");
    vec![
        ("append-etcd34-entries", frames(vec![append.clone()])),
        (
            "heartbeat-vote-response",
            frames(vec![
                message_bytes(MessageType::MsgHeartbeat, Vec::new()),
                message_bytes(MessageType::MsgRequestVote, Vec::new()),
                message_bytes(MessageType::MsgAppendResponse, Vec::new()),
                message_bytes(MessageType::MsgReadIndex, Vec::new()),
            ]),
        ),
        (
            "snapshot-head",
            frames(vec![message_bytes(MessageType::MsgSnapshot, Vec::new())]),
        ),
        ("msgappv2-etcd34-entries", msgapp),
    ]
}

/// What the applier does with an entry that arrived from a peer.
fn decode_entry(entry: &Entry) {
    match entry.get_entry_type() {
        EntryType::EntryNormal => {
            let _ = crate::request::decode(entry.data.clone());
        }
        _ => {
            if let Ok(change) = EtcdConfChange::decode(&entry.data)
                && let Some(context) = &change.context
            {
                let _ = change.to_raft();
                let _ = serde_json::from_slice::<ConfigChangeContext>(context);
                let _ = serde_json::from_slice::<etcdrs_schema::membership::Member>(context);
            }
        }
    }
}

fn decode_entries(message: &Message) {
    for entry in message.get_entries() {
        decode_entry(entry);
    }
    let _ = message.get_snapshot().get_metadata().index;
}

#[test]
fn fuzz_peer_messages() {
    let mut fuzz = Fuzz::new("peer-message")
        .corpus_dir(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/fuzz-corpus/peer-message"
        ))
        .iterations(2000);
    for (name, bytes) in streams() {
        fuzz = fuzz.input(name, bytes);
    }
    fuzz.run(|input| {
        // As a `message` stream (and a snapshot upload's head).
        let mut buf = BytesMut::from(input);
        while let Ok(Some(m)) = codec::decode_frame(&mut buf, FRAME_LIMIT) {
            decode_entries(&m);
        }
        // As a msgappv2 stream.
        let mut buf = BytesMut::from(input);
        let mut decoder = MsgAppV2Decoder::new(1, 2);
        while let Ok(Some(m)) = decoder.decode(&mut buf) {
            decode_entries(&m);
        }
        // As a pipeline body, and as one entry's data.
        if let Ok(m) = codec::decode_message(input) {
            decode_entries(&m);
        }
        let mut entry = Entry {
            data: input.to_vec().into(),
            ..Default::default()
        };
        decode_entry(&entry);
        entry.set_entry_type(EntryType::EntryConfChange);
        decode_entry(&entry);
    });
}
