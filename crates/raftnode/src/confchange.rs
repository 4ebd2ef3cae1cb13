//! etcd's `raftpb.ConfChange` on the wire: the one place where etcd-rs encodes and decodes the
//! data of `EntryConfChange` entries, so that they are the bytes etcd 3.4/3.5 write and apply.
//!
//! raft-rs's `eraftpb::ConfChange` has the same field numbers but not the same change types:
//! etcd has `ConfChangeUpdateNode = 2` and `ConfChangeAddLearnerNode = 3`, raft-rs has
//! `AddLearnerNode = 2` and no update. So the entry data is written here with etcd's numbers,
//! and raft-rs only ever sees the change translated into its own type ([`EtcdConfChange::to_raft`]).
//! An update changes no raft configuration (etcd's raft treats it as a no-op): it has no raft-rs
//! form and only the state machine applies it.
//!
//! The encoding is gogoproto's for etcd's proto2 message: `ID`, `Type` and `NodeID` are written
//! always (they are non-nullable), in field order, and `Context` only when it is set (etcd leaves
//! it nil for a removal).

use raft::eraftpb::{ConfChange, ConfChangeType};

use crate::error::{Error, Result};

/// etcd's `raftpb.ConfChangeType`, with etcd's wire numbers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ChangeKind {
    /// `ConfChangeAddNode` (0): add a voter, or promote a learner.
    AddNode,
    /// `ConfChangeRemoveNode` (1).
    RemoveNode,
    /// `ConfChangeUpdateNode` (2): new peer URLs; no change to the raft configuration.
    UpdateNode,
    /// `ConfChangeAddLearnerNode` (3).
    AddLearnerNode,
}

impl ChangeKind {
    /// The number etcd writes.
    pub fn wire(self) -> u64 {
        match self {
            ChangeKind::AddNode => 0,
            ChangeKind::RemoveNode => 1,
            ChangeKind::UpdateNode => 2,
            ChangeKind::AddLearnerNode => 3,
        }
    }

    fn from_wire(value: u64) -> Option<ChangeKind> {
        Some(match value {
            0 => ChangeKind::AddNode,
            1 => ChangeKind::RemoveNode,
            2 => ChangeKind::UpdateNode,
            3 => ChangeKind::AddLearnerNode,
            _ => return None,
        })
    }
}

/// One membership change as etcd writes it in an `EntryConfChange` entry.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EtcdConfChange {
    /// The proposer's request id (etcd's `cc.ID`, which its proposer waits on); 0 in the
    /// bootstrap entries and in `--force-new-cluster`'s removals.
    pub id: u64,
    /// What changes.
    pub kind: ChangeKind,
    /// The member.
    pub node_id: u64,
    /// The member's JSON (`membership.Member` or `ConfigChangeContext`); `None` for a removal.
    pub context: Option<Vec<u8>>,
}

impl EtcdConfChange {
    /// The entry data, byte for byte as gogoproto writes it.
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(32 + self.context.as_ref().map_or(0, Vec::len));
        out.push(0x08);
        put_varint(&mut out, self.id);
        out.push(0x10);
        put_varint(&mut out, self.kind.wire());
        out.push(0x18);
        put_varint(&mut out, self.node_id);
        if let Some(context) = &self.context {
            out.push(0x22);
            put_varint(&mut out, context.len() as u64);
            out.extend_from_slice(context);
        }
        out
    }

    /// Reads an entry's data (fields in any order, unknown fields skipped, as a protobuf
    /// decoder does).
    pub fn decode(data: &[u8]) -> Result<EtcdConfChange> {
        let corrupt = |what: &str| Error::Corrupt(format!("conf change: {what}"));
        let (mut id, mut kind, mut node_id, mut context) = (0, 0, 0, None);
        let mut rest = data;
        while !rest.is_empty() {
            let key = take_varint(&mut rest).ok_or_else(|| corrupt("truncated key"))?;
            let (field, wire_type) = (key >> 3, key & 7);
            match (field, wire_type) {
                (1, 0) => id = take_varint(&mut rest).ok_or_else(|| corrupt("truncated id"))?,
                (2, 0) => kind = take_varint(&mut rest).ok_or_else(|| corrupt("truncated type"))?,
                (3, 0) => {
                    node_id = take_varint(&mut rest).ok_or_else(|| corrupt("truncated node id"))?
                }
                (4, 2) => {
                    context = Some(
                        take_bytes(&mut rest)
                            .ok_or_else(|| corrupt("truncated context"))?
                            .to_vec(),
                    )
                }
                (_, 0) => {
                    take_varint(&mut rest).ok_or_else(|| corrupt("truncated field"))?;
                }
                (_, 1) => rest = rest.get(8..).ok_or_else(|| corrupt("truncated field"))?,
                (_, 2) => {
                    take_bytes(&mut rest).ok_or_else(|| corrupt("truncated field"))?;
                }
                (_, 5) => rest = rest.get(4..).ok_or_else(|| corrupt("truncated field"))?,
                _ => return Err(corrupt(&format!("wire type {wire_type} of field {field}"))),
            }
        }
        let kind =
            ChangeKind::from_wire(kind).ok_or_else(|| corrupt(&format!("unknown type {kind}")))?;
        Ok(EtcdConfChange {
            id,
            kind,
            node_id,
            context,
        })
    }

    /// The change as raft-rs applies it; `None` for an update, which changes no raft
    /// configuration.
    pub fn to_raft(&self) -> Option<ConfChange> {
        let kind = match self.kind {
            ChangeKind::AddNode => ConfChangeType::AddNode,
            ChangeKind::RemoveNode => ConfChangeType::RemoveNode,
            ChangeKind::AddLearnerNode => ConfChangeType::AddLearnerNode,
            ChangeKind::UpdateNode => return None,
        };
        let mut change = ConfChange::default();
        change.set_change_type(kind);
        change.node_id = self.node_id;
        change.id = self.id;
        Some(change)
    }
}

fn put_varint(out: &mut Vec<u8>, mut value: u64) {
    while value >= 0x80 {
        out.push((value as u8) | 0x80);
        value >>= 7;
    }
    out.push(value as u8);
}

fn take_varint(rest: &mut &[u8]) -> Option<u64> {
    let mut value = 0u64;
    for (i, byte) in rest.iter().enumerate().take(10) {
        value |= u64::from(byte & 0x7f) << (7 * i);
        if byte & 0x80 == 0 {
            *rest = &rest[i + 1..];
            return Some(value);
        }
    }
    None
}

fn take_bytes<'a>(rest: &mut &'a [u8]) -> Option<&'a [u8]> {
    let len = usize::try_from(take_varint(rest)?).ok()?;
    let bytes = rest.get(..len)?;
    *rest = &rest[len..];
    Some(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The bytes etcd 3.4 writes for `ConfChange{ID: 1, Type: AddLearnerNode, NodeID: 300,
    /// Context: "{}"}` and for a removal without context.
    #[test]
    fn encodes_as_gogoproto_does() {
        let learner = EtcdConfChange {
            id: 1,
            kind: ChangeKind::AddLearnerNode,
            node_id: 300,
            context: Some(b"{}".to_vec()),
        };
        assert_eq!(
            learner.encode(),
            [0x08, 1, 0x10, 3, 0x18, 0xac, 0x02, 0x22, 2, b'{', b'}']
        );
        let removal = EtcdConfChange {
            id: 0,
            kind: ChangeKind::RemoveNode,
            node_id: 5,
            context: None,
        };
        assert_eq!(removal.encode(), [0x08, 0, 0x10, 1, 0x18, 5]);
        for change in [learner, removal] {
            assert_eq!(EtcdConfChange::decode(&change.encode()).ok(), Some(change));
        }
    }

    #[test]
    fn maps_etcd_types_onto_raft_rs() {
        let change = |kind| EtcdConfChange {
            id: 9,
            kind,
            node_id: 2,
            context: None,
        };
        let raft_type = |kind| change(kind).to_raft().map(|c| c.get_change_type());
        assert_eq!(
            raft_type(ChangeKind::AddNode),
            Some(ConfChangeType::AddNode)
        );
        assert_eq!(
            raft_type(ChangeKind::AddLearnerNode),
            Some(ConfChangeType::AddLearnerNode)
        );
        assert_eq!(
            raft_type(ChangeKind::RemoveNode),
            Some(ConfChangeType::RemoveNode)
        );
        assert_eq!(raft_type(ChangeKind::UpdateNode), None);
        assert!(EtcdConfChange::decode(&[0x10, 7]).is_err());
        assert!(EtcdConfChange::decode(&[0x22, 5, 1]).is_err());
    }
}
