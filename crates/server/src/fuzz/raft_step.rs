//! Fuzzing of what raft-rs is given from outside the member (issue 20).
//!
//! **Stepping what a peer sent:** the messages `rafthttp` decodes
//! from a `message` stream, a msgappv2 stream or a pipeline body (the inputs of
//! `fuzz_peer_messages`, mutated) are stepped into a raft-rs `RawNode`, configured as
//! `raftnode` configures it, with each `Ready` handled in raft-rs's order over its
//! `MemStorage`.
//!
//! raft trusts its peers: a message that contradicts what raft knows to be committed (a
//! commit index past the log, an append that conflicts with a committed entry) stops the
//! member with raft-rs's `fatal!`, as etcd's raft panics on the same; those panics name the
//! node (`raft_id: <id>`) and are counted, not failures. Any other panic (an index out of
//! bounds, an overflow, an unwrap) fails the test. Corpus: `fuzz-corpus/peer-message/`.
//!
//! **The conf state in the backend's `meta` bucket:** a restarting member decodes it
//! (`etcdrs_schema::conf_state::decode_conf_state`) and `raftnode` checks it (`conf_state::check`) before
//! handing it to raft-rs with its WAL's snapshot; a state that passes is restored into a
//! raft-rs node, which is then ticked past an election timeout. raft-rs may still refuse a
//! state with an error (counted), but it must never stop with its `fatal!` on one that passed
//! the check: before the check, an id listed twice did, so such a value in `meta` stopped a
//! restarting member with raft-rs's panic instead of a clear refusal. Corpus: `fuzz-corpus/conf-state/`,
//! conf states as etcd-rs writes them (`ETCDRS_FUZZ_REGEN=1` rewrites them).

use std::panic::{self, AssertUnwindSafe};
use std::sync::Once;

use bytes::BytesMut;
use etcdrs_fuzz::Fuzz;
use etcdrs_raftnode::eraftpb::{ConfState, Entry, HardState, Message, Snapshot};
use etcdrs_schema::conf_state::{decode_conf_state, encode_conf_state};
use raft::storage::MemStorage;
use raft::{Config, RawNode, ReadOnlyOption};

use super::FRAME_LIMIT;
use etcdrs_rafthttp::codec::{self, MsgAppV2Decoder};
use etcdrs_rafthttp::is_local;

/// The member the corpus's messages are sent to, and the others (etcd's ids for m1..m3).
const OUR_ID: u64 = 0x91bc_3c39_8fb3_c146;
const VOTERS: [u64; 3] = [0x8e9e_05c5_2164_694d, OUR_ID, 0xfd42_2379_fda5_0e48];

/// How raft-rs's `fatal!` ends its panic text for this node.
fn fatal_marker() -> String {
    format!("raft_id: {OUR_ID}")
}

/// Keeps raft-rs's counted `fatal!` panics out of the test's output; every other panic is
/// reported by the previous hook as before.
fn quiet_raft_fatal() {
    static INSTALL: Once = Once::new();
    INSTALL.call_once(|| {
        let previous = panic::take_hook();
        let marker = fatal_marker();
        panic::set_hook(Box::new(move |info| {
            let text = panic_text(info.payload());
            if !text.contains(&marker) {
                previous(info);
            }
        }));
    });
}

fn panic_text(payload: &(dyn std::any::Any + Send)) -> String {
    payload
        .downcast_ref::<String>()
        .cloned()
        .or_else(|| {
            payload
                .downcast_ref::<&str>()
                .map(|text| (*text).to_owned())
        })
        .unwrap_or_default()
}

/// A follower in term 2 of a 3-voter cluster: a snapshot at index 3, entries 4 to 6, 5
/// committed and applied.
fn follower() -> raft::Result<RawNode<MemStorage>> {
    restarted(ConfState {
        voters: VOTERS.to_vec(),
        ..Default::default()
    })
}

/// A member restarted with `conf_state` (also its snapshot's): a snapshot at index 3,
/// entries 4 to 6 of term 2, 5 committed and applied.
fn restarted(conf_state: ConfState) -> raft::Result<RawNode<MemStorage>> {
    let storage = MemStorage::new();
    {
        let mut core = storage.wl();
        let mut snapshot = Snapshot::default();
        let meta = snapshot.mut_metadata();
        meta.index = 3;
        meta.term = 2;
        meta.set_conf_state(conf_state.clone());
        core.apply_snapshot(snapshot)?;
        let entries: Vec<Entry> = (4..=6)
            .map(|index| Entry {
                index,
                term: 2,
                ..Default::default()
            })
            .collect();
        core.append(&entries)?;
        core.set_hardstate(HardState {
            term: 2,
            vote: VOTERS[0],
            commit: 5,
            ..Default::default()
        });
        core.set_conf_state(conf_state);
    }
    let config = Config {
        id: OUR_ID,
        election_tick: 10,
        heartbeat_tick: 1,
        applied: 5,
        max_size_per_msg: 1024 * 1024,
        max_inflight_msgs: 256,
        check_quorum: true,
        pre_vote: true,
        read_only_option: ReadOnlyOption::Safe,
        ..Default::default()
    };
    RawNode::new(
        &config,
        storage,
        &slog::Logger::root(slog::Discard, slog::o!()),
    )
}

/// One `Ready`, handled as `raftnode` handles it: the snapshot, the entries and the hard
/// state persisted, then the node advanced past what it asked to apply.
fn handle_ready(node: &mut RawNode<MemStorage>) -> raft::Result<()> {
    if !node.has_ready() {
        return Ok(());
    }
    let ready = node.ready();
    let storage = node.store().clone();
    if !ready.snapshot().is_empty() {
        storage.wl().apply_snapshot(ready.snapshot().clone())?;
    }
    storage.wl().append(ready.entries())?;
    if let Some(hard_state) = ready.hs() {
        storage.wl().set_hardstate(hard_state.clone());
    }
    let light = node.advance(ready);
    if let Some(commit) = light.commit_index() {
        storage.wl().mut_hard_state().commit = commit;
    }
    node.advance_apply();
    Ok(())
}

/// Runs `f`; `true` if raft-rs stopped it with its own `fatal!`. Any other panic goes on.
fn stopped_by_raft(f: impl FnOnce()) -> bool {
    match panic::catch_unwind(AssertUnwindSafe(f)) {
        Ok(()) => false,
        Err(payload) if panic_text(payload.as_ref()).contains(&fatal_marker()) => true,
        Err(payload) => panic::resume_unwind(payload),
    }
}

/// Steps `messages` into a fresh follower, handling a `Ready` after each; `true` if raft-rs
/// stopped it with its own `fatal!`.
fn step_all(messages: Vec<Message>) -> bool {
    stopped_by_raft(|| {
        let Ok(mut node) = follower() else {
            return;
        };
        for message in messages {
            // What the stream reader and the pipeline handler leave out.
            if codec::is_link_heartbeat(&message) || is_local(message.get_msg_type()) {
                continue;
            }
            if node.step(message).is_ok() && handle_ready(&mut node).is_err() {
                return;
            }
            node.tick();
        }
    })
}

#[test]
fn fuzz_raft_stepping_peer_messages() {
    quiet_raft_fatal();
    let fuzz = Fuzz::new("raft-step")
        .corpus_dir(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/fuzz-corpus/peer-message"
        ))
        .iterations(1500);
    let mut fatal = 0u64;
    let mut inputs = 0u64;
    fuzz.run(|input| {
        inputs += 1;
        let mut messages = Vec::new();
        let mut buf = BytesMut::from(input);
        while let Ok(Some(m)) = codec::decode_frame(&mut buf, FRAME_LIMIT) {
            messages.push(m);
        }
        let mut buf = BytesMut::from(input);
        let mut decoder = MsgAppV2Decoder::new(OUR_ID, VOTERS[0]);
        while let Ok(Some(m)) = decoder.decode(&mut buf) {
            messages.push(m);
        }
        if let Ok(m) = codec::decode_message(input) {
            messages.push(m);
        }
        if step_all(messages) {
            fatal += 1;
        }
    });
    eprintln!("{inputs} inputs stepped, {fatal} stopped by raft-rs's fatal checks");
}

/// Conf states as the applier stores them: a single voter, three voters, a learner, and a
/// joint configuration on its way out.
fn conf_states() -> Vec<(&'static str, Vec<u8>)> {
    let voters = |ids: &[u64]| ids.to_vec();
    [
        (
            "one-voter",
            ConfState {
                voters: voters(&[OUR_ID]),
                ..Default::default()
            },
        ),
        (
            "three-voters-a-learner",
            ConfState {
                voters: voters(&VOTERS),
                learners: voters(&[0x1234]),
                ..Default::default()
            },
        ),
        (
            "joint-auto-leave",
            ConfState {
                voters: voters(&[OUR_ID, VOTERS[2]]),
                voters_outgoing: voters(&VOTERS),
                learners_next: voters(&[VOTERS[0]]),
                auto_leave: true,
                ..Default::default()
            },
        ),
    ]
    .into_iter()
    .map(|(name, state)| (name, encode_conf_state(&state)))
    .collect()
}

#[test]
fn fuzz_conf_state_from_the_backend() {
    quiet_raft_fatal();
    let mut fuzz = Fuzz::new("conf-state")
        .corpus_dir(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/fuzz-corpus/conf-state"
        ))
        .dictionary(&[
            b"\x08",
            b"\x10",
            b"\x18",
            b"\x20",
            b"\x28\x01",
            b"\xc6\xe8\xcd\xfb\x83\x87\x9e\xde\x91\x01",
        ])
        .max_len(512)
        .iterations(1500);
    for (name, bytes) in conf_states() {
        fuzz = fuzz.input(name, bytes);
    }
    let (mut decoded, mut checked_out, mut refused) = (0u64, 0u64, 0u64);
    fuzz.run(|input| {
        let Some(conf_state) = decode_conf_state(input) else {
            return;
        };
        decoded += 1;
        if etcdrs_raftnode::conf_state::check(&conf_state).is_err() {
            checked_out += 1;
            return;
        }
        let shown = format!("{conf_state:?}");
        let stopped = stopped_by_raft(|| {
            let Ok(mut node) = restarted(conf_state) else {
                refused += 1;
                return;
            };
            // Past an election timeout (10 to 19 ticks): a member the conf state makes a
            // voter campaigns, as `raftnode` ticks it (raft-rs's `tick` campaigns only when
            // the member is promotable; `raftnode` campaigns at once only then, too).
            for _ in 0..25 {
                node.tick();
                if handle_ready(&mut node).is_err() {
                    return;
                }
            }
        });
        assert!(
            !stopped,
            "raft-rs stopped with its fatal checks on a conf state raftnode accepts: {shown}"
        );
    });
    eprintln!(
        "{decoded} conf states decoded: {checked_out} refused by raftnode's check, {refused} by raft-rs"
    );
    assert!(decoded > 0, "no input decoded as a conf state");
}
