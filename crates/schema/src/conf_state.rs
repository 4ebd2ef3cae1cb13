//! The stored form of raft's configuration (`meta`'s `confState`, raft's protobuf). raft-rs
//! messages are rust-protobuf types; this module keeps that crate's API in one place.

use protobuf::Message;
pub use raft::eraftpb::ConfState;

/// A stored configuration read back; `None` for bytes that are not one.
pub fn decode_conf_state(bytes: &[u8]) -> Option<ConfState> {
    let mut state = ConfState::default();
    state.merge_from_bytes(bytes).ok()?;
    Some(state)
}

/// The stored form of a raft configuration: each list of ids sorted, as etcd's raft lists
/// them. raft-rs lists them in its hash sets' order, which differs between members and
/// across a restart, and the stored bytes are part of the backend's hash
/// (`Maintenance.Hash`), which members with the same data must agree on.
pub fn encode_conf_state(state: &ConfState) -> Vec<u8> {
    let mut state = state.clone();
    state.mut_voters().sort_unstable();
    state.mut_learners().sort_unstable();
    state.mut_voters_outgoing().sort_unstable();
    state.mut_learners_next().sort_unstable();
    state.write_to_bytes().unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_configuration_is_stored_the_same_whatever_the_order_of_its_ids() {
        let state = |voters: &[u64], learners: &[u64]| {
            let mut s = ConfState::default();
            s.set_voters(voters.to_vec());
            s.set_learners(learners.to_vec());
            s
        };
        let stored = encode_conf_state(&state(&[5, 2, 4], &[7, 6]));
        assert_eq!(stored, encode_conf_state(&state(&[4, 5, 2], &[6, 7])));
        let back = decode_conf_state(&stored).expect("decodes");
        assert_eq!(back.get_voters(), &[2, 4, 5]);
        assert_eq!(back.get_learners(), &[6, 7]);
    }
}
