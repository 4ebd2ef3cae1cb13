//! Fuzzing of what a member decodes from its peers (issue 20): the peer service's
//! `RaftBatch` and `SnapshotChunk` (prost), each raft message in them (raft-rs's
//! `eraftpb.Message`, as `server::peer` reads it with `merge_from_bytes`), and the payloads
//! of the entries they carry as the applier reads them (`server::request::decode`, etcd's
//! `ConfChange` with `EtcdConfChange::decode` and its JSON context). Any bytes must give an
//! error, never a panic or a length trusted into an allocation. `peer.rs` is not touched: the
//! same calls are made here. Corpus: `crates/server/fuzz-corpus/peer-message/`, batches of
//! the messages raft exchanges carrying etcd 3.4's entries from
//! `crates/etcddir/fuzz-corpus/entry/` (`ETCDRS_FUZZ_REGEN=1` rewrites them). Runner and
//! knobs: `etcdrs-fuzz`.

use std::path::Path;

use etcdrs_fuzz::Fuzz;
use etcdrs_proto::peerpb::{RaftBatch, SnapshotChunk};
use etcdrs_proto::raft_internal::ConfigChangeContext;
use etcdrs_raftnode::confchange::EtcdConfChange;
use etcdrs_raftnode::eraftpb::{Entry, EntryType, Message, MessageType};
use prost::Message as _;
use protobuf::Message as _;

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

fn batches() -> Vec<(&'static str, Vec<u8>)> {
    let entries = etcd_entries();
    let append = message(MessageType::MsgAppend, entries);
    let batch = |messages: Vec<Vec<u8>>| RaftBatch { messages }.encode_to_vec();
    vec![
        ("append-etcd34-entries", batch(vec![append])),
        (
            "heartbeat-vote-response",
            batch(vec![
                message(MessageType::MsgHeartbeat, Vec::new()),
                message(MessageType::MsgRequestVote, Vec::new()),
                message(MessageType::MsgAppendResponse, Vec::new()),
                message(MessageType::MsgReadIndex, Vec::new()),
            ]),
        ),
        (
            "snapshot-chunk",
            SnapshotChunk {
                message: message(MessageType::MsgSnapshot, Vec::new()),
                data: b"redb image bytes".to_vec(),
            }
            .encode_to_vec(),
        ),
    ]
}

/// What the applier does with an entry that arrived from a peer.
fn decode_entry(entry: &Entry) {
    match entry.get_entry_type() {
        EntryType::EntryNormal => {
            let _ = crate::request::decode(&entry.data);
        }
        _ => {
            if let Ok(change) = EtcdConfChange::decode(&entry.data)
                && let Some(context) = &change.context
            {
                let _ = change.to_raft();
                let _ = serde_json::from_slice::<ConfigChangeContext>(context);
                let _ = serde_json::from_slice::<crate::membership::Member>(context);
            }
        }
    }
}

fn decode_message(bytes: &[u8]) {
    let mut message = Message::default();
    if message.merge_from_bytes(bytes).is_err() {
        return;
    }
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
    for (name, bytes) in batches() {
        fuzz = fuzz.input(name, bytes);
    }
    fuzz.run(|input| {
        if let Ok(batch) = RaftBatch::decode(input) {
            for bytes in &batch.messages {
                decode_message(bytes);
            }
        }
        if let Ok(chunk) = SnapshotChunk::decode(input) {
            decode_message(&chunk.message);
        }
        // The same bytes as one message and as one entry's data.
        decode_message(input);
        let mut entry = Entry {
            data: input.to_vec().into(),
            ..Default::default()
        };
        decode_entry(&entry);
        entry.set_entry_type(EntryType::EntryConfChange);
        decode_entry(&entry);
    });
}
