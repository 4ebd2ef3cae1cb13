//! What the server writes into raft entries (etcd's `InternalRaftRequest`): one request
//! with the id its proposer waits on.

use etcdrs_proto::etcdserverpb::{
    AlarmRequest, AuthDisableRequest, AuthEnableRequest, AuthRoleAddRequest, AuthRoleDeleteRequest,
    AuthRoleGrantPermissionRequest, AuthRoleRevokePermissionRequest, AuthUserAddRequest,
    AuthUserChangePasswordRequest, AuthUserDeleteRequest, AuthUserGrantRoleRequest,
    AuthUserRevokeRoleRequest, CompactionRequest, DeleteRangeRequest, LeaseCheckpointRequest,
    LeaseGrantRequest, LeaseRevokeRequest, PutRequest, TxnRequest,
};

/// A replicated request.
#[derive(Clone, PartialEq, prost::Message)]
pub struct InternalRaftRequest {
    /// The id the proposer waits on.
    #[prost(uint64, tag = "1")]
    pub id: u64,
    /// The operation.
    #[prost(
        oneof = "Op",
        tags = "2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23"
    )]
    pub op: Option<Op>,
    /// Who proposed it, when auth was on (etcd's `RequestHeader`): the apply step checks
    /// permissions and the auth revision with it.
    #[prost(message, optional, tag = "30")]
    pub auth: Option<AuthHeader>,
}

/// The proposer's identity.
#[derive(Clone, PartialEq, prost::Message)]
pub struct AuthHeader {
    /// The user.
    #[prost(string, tag = "1")]
    pub username: String,
    /// The auth revision the request was checked under.
    #[prost(uint64, tag = "2")]
    pub auth_revision: u64,
}

/// Authenticate, as replicated: the user and the random part of the token (etcd's
/// `InternalAuthenticateRequest`; the password was checked by the proposer).
#[derive(Clone, PartialEq, prost::Message)]
pub struct InternalAuthenticateRequest {
    /// The user.
    #[prost(string, tag = "1")]
    pub name: String,
    /// The token prefix.
    #[prost(string, tag = "2")]
    pub simple_token: String,
}

/// A replicated operation.
#[derive(Clone, PartialEq, prost::Oneof)]
pub enum Op {
    /// Put.
    #[prost(message, tag = "2")]
    Put(PutRequest),
    /// DeleteRange.
    #[prost(message, tag = "3")]
    DeleteRange(DeleteRangeRequest),
    /// Txn.
    #[prost(message, tag = "4")]
    Txn(TxnRequest),
    /// Compaction.
    #[prost(message, tag = "5")]
    Compaction(CompactionRequest),
    /// LeaseGrant.
    #[prost(message, tag = "6")]
    LeaseGrant(LeaseGrantRequest),
    /// LeaseRevoke.
    #[prost(message, tag = "7")]
    LeaseRevoke(LeaseRevokeRequest),
    /// Alarm.
    #[prost(message, tag = "8")]
    Alarm(AlarmRequest),
    /// A member's attributes.
    #[prost(message, tag = "9")]
    Publish(MemberAttributes),
    /// New peer URLs for a member (etcd's MemberUpdate).
    #[prost(message, tag = "10")]
    UpdatePeerUrls(MemberPeerUrls),
    /// AuthEnable.
    #[prost(message, tag = "11")]
    AuthEnable(AuthEnableRequest),
    /// AuthDisable.
    #[prost(message, tag = "12")]
    AuthDisable(AuthDisableRequest),
    /// Authenticate.
    #[prost(message, tag = "13")]
    Authenticate(InternalAuthenticateRequest),
    /// UserAdd (password hashed).
    #[prost(message, tag = "14")]
    UserAdd(AuthUserAddRequest),
    /// UserDelete.
    #[prost(message, tag = "15")]
    UserDelete(AuthUserDeleteRequest),
    /// UserChangePassword (password hashed).
    #[prost(message, tag = "16")]
    UserChangePassword(AuthUserChangePasswordRequest),
    /// UserGrantRole.
    #[prost(message, tag = "17")]
    UserGrantRole(AuthUserGrantRoleRequest),
    /// UserRevokeRole.
    #[prost(message, tag = "18")]
    UserRevokeRole(AuthUserRevokeRoleRequest),
    /// RoleAdd.
    #[prost(message, tag = "19")]
    RoleAdd(AuthRoleAddRequest),
    /// RoleDelete.
    #[prost(message, tag = "20")]
    RoleDelete(AuthRoleDeleteRequest),
    /// RoleGrantPermission.
    #[prost(message, tag = "21")]
    RoleGrantPermission(AuthRoleGrantPermissionRequest),
    /// RoleRevokePermission.
    #[prost(message, tag = "22")]
    RoleRevokePermission(AuthRoleRevokePermissionRequest),
    /// The leader's lease checkpoints (`--experimental-enable-lease-checkpoint`).
    #[prost(message, tag = "23")]
    LeaseCheckpoint(LeaseCheckpointRequest),
}

impl Op {
    /// The operation's index in [`crate::metrics::APPLY_OPS`] (etcd 3.5's `op` label of
    /// `etcd_server_apply_duration_seconds`); `None` for what etcd does not apply as a request.
    pub(crate) fn metric_index(&self) -> Option<usize> {
        let name = match self {
            Op::Put(_) => "Put",
            Op::DeleteRange(_) => "DeleteRange",
            Op::Txn(_) => "Txn",
            Op::Compaction(_) => "Compaction",
            Op::LeaseGrant(_) => "LeaseGrant",
            Op::LeaseRevoke(_) => "LeaseRevoke",
            Op::Alarm(_) => "Alarm",
            Op::Publish(_) => "ClusterMemberAttrSet",
            Op::UpdatePeerUrls(_) => return None,
            Op::AuthEnable(_) => "AuthEnable",
            Op::AuthDisable(_) => "AuthDisable",
            Op::Authenticate(_) => "Authenticate",
            Op::UserAdd(_) => "AuthUserAdd",
            Op::UserDelete(_) => "AuthUserDelete",
            Op::UserChangePassword(_) => "AuthUserChangePassword",
            Op::UserGrantRole(_) => "AuthUserGrantRole",
            Op::UserRevokeRole(_) => "AuthUserRevokeRole",
            Op::RoleAdd(_) => "AuthRoleAdd",
            Op::RoleDelete(_) => "AuthRoleDelete",
            Op::RoleGrantPermission(_) => "AuthRoleGrantPermission",
            Op::RoleRevokePermission(_) => "AuthRoleRevokePermission",
            Op::LeaseCheckpoint(_) => "LeaseCheckpoint",
        };
        let index = crate::metrics::APPLY_OPS.iter().position(|op| *op == name);
        debug_assert!(index.is_some(), "{name} is not in APPLY_OPS");
        index
    }
}

/// A member's new peer URLs.
#[derive(Clone, PartialEq, prost::Message)]
pub struct MemberPeerUrls {
    /// The member.
    #[prost(uint64, tag = "1")]
    pub member_id: u64,
    /// Its peer URLs.
    #[prost(string, repeated, tag = "2")]
    pub peer_urls: Vec<String>,
}

/// A member publishing its name and client URLs (etcd's `publish`, as a v3 request).
#[derive(Clone, PartialEq, prost::Message)]
pub struct MemberAttributes {
    /// The member.
    #[prost(uint64, tag = "1")]
    pub member_id: u64,
    /// Its name.
    #[prost(string, tag = "2")]
    pub name: String,
    /// Its client URLs.
    #[prost(string, repeated, tag = "3")]
    pub client_urls: Vec<String>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use etcdrs_proto::etcdserverpb::LeaseCheckpoint;
    use prost::Message;

    /// Every operation survives the log: a tag missing from the oneof's list would decode as no
    /// operation at all.
    #[test]
    fn operations_round_trip_through_their_encoding() {
        let ops = [
            Op::Put(PutRequest::default()),
            Op::LeaseCheckpoint(LeaseCheckpointRequest {
                checkpoints: vec![LeaseCheckpoint {
                    id: 7,
                    remaining_ttl: 30,
                }],
            }),
            Op::RoleRevokePermission(AuthRoleRevokePermissionRequest::default()),
        ];
        for op in ops {
            let request = InternalRaftRequest {
                id: 1,
                op: Some(op),
                auth: None,
            };
            let decoded =
                InternalRaftRequest::decode(request.encode_to_vec().as_slice()).expect("decodes");
            assert!(
                decoded == request,
                "{:?}",
                decoded.op.and_then(|op| op.metric_index())
            );
        }
    }
}
