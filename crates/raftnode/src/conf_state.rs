//! The check a restart makes of the configuration it hands raft-rs.
//!
//! A restarting member reads its raft configuration (`ConfState`) from the backend's `meta`
//! bucket, not from the WAL, so a damaged or hand-edited backend can hold one that no
//! sequence of configuration changes produces. raft-rs refuses some of those with an error but
//! panics on others (an id listed twice makes its progress tracker disagree with the
//! configuration it restored). [`check`] holds a configuration to raft's own invariants first,
//! so that such a backend is refused at start with what is wrong with it, naming the member.

use std::collections::HashSet;

use raft::eraftpb::ConfState;

use crate::error::{Error, Result};

fn invalid(reason: String) -> Error {
    Error::InvalidConfState(reason)
}

/// The ids of `list`, refusing one that is listed twice.
fn distinct<'a>(name: &str, list: &'a [u64]) -> Result<HashSet<&'a u64>> {
    let mut seen = HashSet::with_capacity(list.len());
    for id in list {
        if *id == 0 {
            return Err(invalid(format!(
                "the {name} include id 0, which no member has"
            )));
        }
        if !seen.insert(id) {
            return Err(invalid(format!(
                "member {id:x} is listed twice among the {name}"
            )));
        }
    }
    Ok(seen)
}

/// Refuses a configuration that breaks raft's invariants: id 0 (raft's "no member"), an id
/// listed twice in one list, a
/// learner that is also a voter (of the incoming or the outgoing configuration), a learner to
/// be that is not an outgoing voter or is already an incoming one, `auto_leave` outside a
/// joint configuration.
///
/// An empty configuration passes: a member that has applied no configuration change yet (a
/// new member before its log's first entries, a joining one) restarts with one.
pub fn check(conf: &ConfState) -> Result<()> {
    let voters = distinct("voters", &conf.voters)?;
    let learners = distinct("learners", &conf.learners)?;
    let outgoing = distinct("outgoing voters", &conf.voters_outgoing)?;
    let learners_next = distinct("learners to be", &conf.learners_next)?;
    for id in &learners {
        if voters.contains(id) {
            return Err(invalid(format!(
                "member {id:x} is both a voter and a learner"
            )));
        }
        if outgoing.contains(id) {
            return Err(invalid(format!(
                "member {id:x} is both an outgoing voter and a learner"
            )));
        }
    }
    for id in &learners_next {
        if !outgoing.contains(id) {
            return Err(invalid(format!(
                "member {id:x} is to become a learner but is not an outgoing voter"
            )));
        }
        if voters.contains(id) || learners.contains(id) {
            return Err(invalid(format!(
                "member {id:x} is to become a learner but already is a voter or a learner"
            )));
        }
    }
    if conf.auto_leave && outgoing.is_empty() {
        return Err(invalid(
            "it leaves a joint configuration automatically but is not joint".to_owned(),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn conf(voters: &[u64], learners: &[u64], outgoing: &[u64], next: &[u64]) -> ConfState {
        ConfState {
            voters: voters.to_vec(),
            learners: learners.to_vec(),
            voters_outgoing: outgoing.to_vec(),
            learners_next: next.to_vec(),
            ..Default::default()
        }
    }

    fn reason(state: &ConfState) -> String {
        match check(state) {
            Err(Error::InvalidConfState(reason)) => reason,
            other => panic!("{state:?} was not refused: {other:?}"),
        }
    }

    #[test]
    fn configurations_raft_produces_pass() {
        check(&ConfState::default()).expect("nothing applied yet");
        check(&conf(&[1], &[], &[], &[])).expect("one voter");
        check(&conf(&[1, 2, 3], &[4], &[], &[])).expect("voters and a learner");
        // Joint: 3 is being demoted to a learner, 4 promoted.
        check(&conf(&[1, 2, 4], &[], &[1, 2, 3], &[3])).expect("joint demotion");
        let mut joint = conf(&[1, 2], &[], &[1, 2, 3], &[]);
        joint.auto_leave = true;
        check(&joint).expect("joint, leaving automatically");
    }

    #[test]
    fn configurations_raft_cannot_restore_are_refused_naming_the_member() {
        assert_eq!(
            reason(&conf(&[0x1a, 2, 0x1a], &[], &[], &[])),
            "member 1a is listed twice among the voters"
        );
        assert_eq!(
            reason(&conf(&[1, 0], &[], &[], &[])),
            "the voters include id 0, which no member has"
        );
        assert_eq!(
            reason(&conf(&[1], &[5, 5], &[], &[])),
            "member 5 is listed twice among the learners"
        );
        assert_eq!(
            reason(&conf(&[1, 2], &[2], &[], &[])),
            "member 2 is both a voter and a learner"
        );
        assert_eq!(
            reason(&conf(&[1, 2], &[3], &[1, 3], &[])),
            "member 3 is both an outgoing voter and a learner"
        );
        assert_eq!(
            reason(&conf(&[1, 2], &[], &[1, 2], &[4])),
            "member 4 is to become a learner but is not an outgoing voter"
        );
        assert_eq!(
            reason(&conf(&[1, 2], &[], &[1, 2], &[2])),
            "member 2 is to become a learner but already is a voter or a learner"
        );
        let mut auto = conf(&[1], &[], &[], &[]);
        auto.auto_leave = true;
        assert_eq!(
            reason(&auto),
            "it leaves a joint configuration automatically but is not joint"
        );
    }
}
