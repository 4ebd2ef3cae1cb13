//! What the server writes into raft entries and reads back from them: etcd's own payloads
//! (`etcdrs_proto::raft_internal`), so that etcd 3.4/3.5 members apply what etcd-rs proposes and
//! etcd-rs applies what they propose.
//!
//! [`Op`] is the operation the applier runs; [`encode`] writes it as etcd's proposer would
//! (an `InternalRaftRequest` whose `header` carries the request id, the user and the auth
//! revision, as etcd's `processInternalRaftRequestOnce` sets it; a publish as the bare v2
//! `Request` that etcd 3.4 and 3.5 both write, below cluster version 3.6), and [`decode`] reads any
//! entry data by etcd's apply rule (`raft_internal::decode_entry`): of etcd 3.4's v2 requests
//! only the two that matter to the v3 server (a member's attributes, the cluster version) are
//! applied, as etcd's v2 applier applies them to the membership; the others touch only etcd's
//! v2 store, which etcd-rs does not keep, and apply nothing here.

use etcdrs_proto::etcdserverpb::{
    AlarmRequest, AuthDisableRequest, AuthEnableRequest, AuthRoleAddRequest, AuthRoleDeleteRequest,
    AuthRoleGrantPermissionRequest, AuthRoleRevokePermissionRequest, AuthUserAddRequest,
    AuthUserChangePasswordRequest, AuthUserDeleteRequest, AuthUserGrantRoleRequest,
    AuthUserRevokeRoleRequest, CompactionRequest, DeleteRangeRequest, LeaseCheckpointRequest,
    LeaseGrantRequest, LeaseRevokeRequest, PutRequest, TxnRequest,
};
use etcdrs_proto::raft_internal::{
    self as etcd, Attributes, ClusterMemberAttrSetRequest, ClusterVersionSetRequest,
    DowngradeInfoSetRequest, InternalRaftRequest, Payload, RequestHeader, V2Request,
};
use etcdrs_schema::keys::DOWNGRADE_PATH;
use etcdrs_schema::version::DowngradeInfo;
use prost::Message as _;

pub use etcdrs_proto::raft_internal::InternalAuthenticateRequest;

/// A replicated operation.
#[derive(Clone, Debug, PartialEq)]
pub enum Op {
    /// Put.
    Put(PutRequest),
    /// DeleteRange.
    DeleteRange(DeleteRangeRequest),
    /// Txn.
    Txn(TxnRequest),
    /// Compaction.
    Compaction(CompactionRequest),
    /// LeaseGrant.
    LeaseGrant(LeaseGrantRequest),
    /// LeaseRevoke.
    LeaseRevoke(LeaseRevokeRequest),
    /// Alarm.
    Alarm(AlarmRequest),
    /// A member's attributes (etcd 3.5's `cluster_member_attr_set`, 3.4's v2 publish).
    Publish(MemberAttributes),
    /// The cluster version (etcd 3.5's `cluster_version_set`, 3.4's v2 `PUT /0/version`).
    ClusterVersionSet(String),
    /// AuthEnable.
    AuthEnable(AuthEnableRequest),
    /// AuthDisable.
    AuthDisable(AuthDisableRequest),
    /// Authenticate.
    Authenticate(InternalAuthenticateRequest),
    /// UserAdd (password hashed by etcd-rs and etcd 3.5 proposers; etcd 3.4's carry it in
    /// clear text, which the applier hashes, as 3.4's applier does).
    UserAdd(AuthUserAddRequest),
    /// UserDelete.
    UserDelete(AuthUserDeleteRequest),
    /// UserChangePassword (as UserAdd).
    UserChangePassword(AuthUserChangePasswordRequest),
    /// UserGrantRole.
    UserGrantRole(AuthUserGrantRoleRequest),
    /// UserRevokeRole.
    UserRevokeRole(AuthUserRevokeRoleRequest),
    /// RoleAdd.
    RoleAdd(AuthRoleAddRequest),
    /// RoleDelete.
    RoleDelete(AuthRoleDeleteRequest),
    /// RoleGrantPermission.
    RoleGrantPermission(AuthRoleGrantPermissionRequest),
    /// RoleRevokePermission.
    RoleRevokePermission(AuthRoleRevokePermissionRequest),
    /// The leader's lease checkpoints (`--experimental-enable-lease-checkpoint`).
    LeaseCheckpoint(LeaseCheckpointRequest),
    /// A downgrade enabled (its target cluster version) or cancelled (`None`): etcd 3.5's
    /// `downgrade_info_set`, proposed in the form [`encode`] picks for the cluster version.
    DowngradeInfoSet(Option<String>),
    /// The same, read from a `downgrade_info_set` entry, the form etcd 3.5 proposes: below
    /// cluster version 3.6 only etcd 3.5 members write it, so they know of the downgrade
    /// (and exit if the cluster version is then lowered, see `EtcdServer::downgrade_target`).
    DowngradeInfoSetV3(Option<String>),
}

/// A member publishing its name and client URLs (etcd's `publish`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct MemberAttributes {
    /// The member.
    pub member_id: u64,
    /// Its name.
    pub name: String,
    /// Its client URLs.
    pub client_urls: Vec<String>,
}

/// Who proposed a request, from its header.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Proposer {
    /// The user; empty without auth.
    pub username: String,
    /// The auth revision the request was checked under.
    pub auth_revision: u64,
}

/// What an entry's data holds for the applier.
#[derive(Debug, PartialEq)]
pub enum Decoded {
    /// Empty data (a new leader's no-op).
    Noop,
    /// A request that applies nothing in etcd-rs (reads, the v2 store, downgrade info); its
    /// proposer, if it waits here, is answered.
    Ignored {
        /// The request id.
        id: u64,
    },
    /// An operation to apply.
    Op {
        /// The request id the proposer waits on.
        id: u64,
        /// Who proposed it: the header's user and auth revision; `None` without a header
        /// (etcd 3.4's v2 requests), which etcd applies unchecked.
        proposer: Option<Proposer>,
        /// The operation.
        op: Op,
    },
}

/// Whether a publish goes out as a bare v2 request or as `cluster_member_attr_set`.
///
/// etcd 3.5 defines `cluster_member_attr_set` (`publishV3`) but still publishes with the v2
/// request, as 3.4 does ("Switch to publishV3 in 3.6"): etcd 3.4's applier panics ("not
/// implemented") on an `InternalRaftRequest` that sets none of the fields it knows, so the v3
/// form is safe only once every member is 3.5 or later, which etcd leaves to 3.6.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PublishForm {
    /// etcd 3.4 and 3.5: `PUT /0/members/<id>/attributes` as a v2 `Request`.
    V2,
    /// etcd 3.6: `cluster_member_attr_set`.
    V3,
}

impl PublishForm {
    /// The form etcd uses at `cluster_version`: the v3 request from 3.6 on, else the v2 one.
    pub fn for_cluster_version(cluster_version: &str) -> PublishForm {
        let mut parts = cluster_version
            .split('.')
            .map(|p| p.parse::<u64>().unwrap_or(0));
        let (major, minor) = (parts.next().unwrap_or(0), parts.next().unwrap_or(0));
        if (major, minor) >= (3, 6) {
            PublishForm::V3
        } else {
            PublishForm::V2
        }
    }
}

/// The entry data for `op`, proposed as request `id` by `proposer`.
pub fn encode(id: u64, proposer: Option<&Proposer>, op: Op, publish: PublishForm) -> Vec<u8> {
    if publish == PublishForm::V2 {
        // Below 3.6 etcd writes the membership's own records as v2 requests, which every
        // version applies.
        let v2 = match &op {
            Op::Publish(attributes) => Some(publish_v2(id, attributes)),
            Op::ClusterVersionSet(ver) => Some(v2_put(id, etcd::CLUSTER_VERSION_PATH, ver.clone())),
            Op::DowngradeInfoSet(target) => {
                let json = DowngradeInfo::new(target.as_deref()).encode();
                Some(v2_put(
                    id,
                    DOWNGRADE_PATH,
                    String::from_utf8(json).unwrap_or_default(),
                ))
            }
            _ => None,
        };
        if let Some(v2) = v2 {
            return v2.encode_to_vec();
        }
    }
    let mut request = InternalRaftRequest {
        header: Some(RequestHeader {
            id,
            username: proposer.map(|p| p.username.clone()).unwrap_or_default(),
            auth_revision: proposer.map_or(0, |p| p.auth_revision),
        }),
        ..Default::default()
    };
    match op {
        Op::Put(x) => request.put = Some(x),
        Op::DeleteRange(x) => request.delete_range = Some(x),
        Op::Txn(x) => request.txn = Some(x),
        Op::Compaction(x) => request.compaction = Some(x),
        Op::LeaseGrant(x) => request.lease_grant = Some(x),
        Op::LeaseRevoke(x) => request.lease_revoke = Some(x),
        Op::Alarm(x) => request.alarm = Some(x),
        Op::LeaseCheckpoint(x) => request.lease_checkpoint = Some(x),
        Op::Publish(x) => {
            request.cluster_member_attr_set = Some(ClusterMemberAttrSetRequest {
                member_id: x.member_id,
                member_attributes: Some(Attributes {
                    name: x.name,
                    client_urls: x.client_urls,
                }),
            })
        }
        Op::ClusterVersionSet(ver) => {
            request.cluster_version_set = Some(ClusterVersionSetRequest { ver })
        }
        Op::DowngradeInfoSet(target) | Op::DowngradeInfoSetV3(target) => {
            request.downgrade_info_set = Some(DowngradeInfoSetRequest {
                enabled: target.is_some(),
                ver: target.unwrap_or_default(),
            })
        }
        Op::AuthEnable(x) => request.auth_enable = Some(x),
        Op::AuthDisable(x) => request.auth_disable = Some(x),
        Op::Authenticate(x) => request.authenticate = Some(x),
        Op::UserAdd(x) => request.auth_user_add = Some(x),
        Op::UserDelete(x) => request.auth_user_delete = Some(x),
        Op::UserChangePassword(x) => request.auth_user_change_password = Some(x),
        Op::UserGrantRole(x) => request.auth_user_grant_role = Some(x),
        Op::UserRevokeRole(x) => request.auth_user_revoke_role = Some(x),
        Op::RoleAdd(x) => request.auth_role_add = Some(x),
        Op::RoleDelete(x) => request.auth_role_delete = Some(x),
        Op::RoleGrantPermission(x) => request.auth_role_grant_permission = Some(x),
        Op::RoleRevokePermission(x) => request.auth_role_revoke_permission = Some(x),
    }
    request.encode_to_vec()
}

/// etcd 3.4's publish: `PUT /0/members/<hex id>/attributes` with the attributes' JSON.
fn publish_v2(id: u64, attributes: &MemberAttributes) -> V2Request {
    let val = serde_json::to_string(&etcd::MemberAttributes {
        name: attributes.name.clone(),
        client_urls: attributes.client_urls.clone(),
    })
    .unwrap_or_default();
    v2_put(id, &etcd::member_attributes_path(attributes.member_id), val)
}

/// A plain v2 `PUT` of `val` at `path`.
fn v2_put(id: u64, path: &str, val: String) -> V2Request {
    V2Request {
        id,
        method: "PUT".into(),
        path: path.to_owned(),
        val,
        ..Default::default()
    }
}

/// Reads an `EntryNormal` entry's data by etcd's rule.
pub fn decode<B: bytes::Buf + Clone>(data: B) -> Result<Decoded, prost::DecodeError> {
    Ok(match etcd::decode_entry(data)? {
        Payload::Noop => Decoded::Noop,
        Payload::V2(v2) => decode_v2(v2),
        Payload::V3(request) => decode_v3(*request),
    })
}

/// etcd 3.4's `applierV2store.Put` as it touches the membership: a member's attributes and the
/// cluster version, set by a `PUT` without compare-and-swap conditions.
fn decode_v2(v2: V2Request) -> Decoded {
    let id = v2.id;
    let plain_put = v2.method == "PUT"
        && v2.prev_exist.is_none()
        && v2.prev_index == 0
        && v2.prev_value.is_empty();
    if !plain_put {
        return Decoded::Ignored { id };
    }
    let op = if let Some(member_id) = etcd::member_of_attributes_path(&v2.path) {
        // etcd panics on attributes it cannot read; a value etcd-rs cannot read applies nothing.
        let Ok(attributes) = serde_json::from_str::<etcd::MemberAttributes>(&v2.val) else {
            return Decoded::Ignored { id };
        };
        Op::Publish(MemberAttributes {
            member_id,
            name: attributes.name,
            client_urls: attributes.client_urls,
        })
    } else if v2.path == etcd::CLUSTER_VERSION_PATH {
        Op::ClusterVersionSet(v2.val)
    } else if v2.path == DOWNGRADE_PATH {
        let Ok(info) = serde_json::from_str::<DowngradeInfo>(&v2.val) else {
            return Decoded::Ignored { id };
        };
        Op::DowngradeInfoSet(info.enabled.then_some(info.target_version))
    } else {
        return Decoded::Ignored { id };
    };
    Decoded::Op {
        id,
        proposer: None,
        op,
    }
}

fn decode_v3(r: InternalRaftRequest) -> Decoded {
    // etcd reads the id from the header, and from the old `ID` field when the header has none.
    let (id, proposer) = match &r.header {
        Some(h) => (
            if h.id != 0 { h.id } else { r.id },
            Some(Proposer {
                username: h.username.clone(),
                auth_revision: h.auth_revision,
            }),
        ),
        None => (r.id, None),
    };
    let op = if let Some(x) = r.put {
        Op::Put(x)
    } else if let Some(x) = r.delete_range {
        Op::DeleteRange(x)
    } else if let Some(x) = r.txn {
        Op::Txn(x)
    } else if let Some(x) = r.compaction {
        Op::Compaction(x)
    } else if let Some(x) = r.lease_grant {
        Op::LeaseGrant(x)
    } else if let Some(x) = r.lease_revoke {
        Op::LeaseRevoke(x)
    } else if let Some(x) = r.alarm {
        Op::Alarm(x)
    } else if let Some(x) = r.lease_checkpoint {
        Op::LeaseCheckpoint(x)
    } else if let Some(x) = r.authenticate {
        Op::Authenticate(x)
    } else if let Some(x) = r.auth_enable {
        Op::AuthEnable(x)
    } else if let Some(x) = r.auth_disable {
        Op::AuthDisable(x)
    } else if let Some(x) = r.auth_user_add {
        Op::UserAdd(x)
    } else if let Some(x) = r.auth_user_delete {
        Op::UserDelete(x)
    } else if let Some(x) = r.auth_user_change_password {
        Op::UserChangePassword(x)
    } else if let Some(x) = r.auth_user_grant_role {
        Op::UserGrantRole(x)
    } else if let Some(x) = r.auth_user_revoke_role {
        Op::UserRevokeRole(x)
    } else if let Some(x) = r.auth_role_add {
        Op::RoleAdd(x)
    } else if let Some(x) = r.auth_role_delete {
        Op::RoleDelete(x)
    } else if let Some(x) = r.auth_role_grant_permission {
        Op::RoleGrantPermission(x)
    } else if let Some(x) = r.auth_role_revoke_permission {
        Op::RoleRevokePermission(x)
    } else if let Some(x) = r.cluster_member_attr_set {
        let attributes = x.member_attributes.unwrap_or_default();
        Op::Publish(MemberAttributes {
            member_id: x.member_id,
            name: attributes.name,
            client_urls: attributes.client_urls,
        })
    } else if let Some(x) = r.cluster_version_set {
        Op::ClusterVersionSet(x.ver)
    } else if let Some(x) = r.downgrade_info_set {
        Op::DowngradeInfoSetV3(x.enabled.then_some(x.ver))
    } else {
        // Ranges, auth status and listings, and fields this build does not
        // know: nothing etcd-rs keeps changes.
        return Decoded::Ignored { id };
    };
    Decoded::Op { id, proposer, op }
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
            Op::ClusterVersionSet(_) | Op::DowngradeInfoSet(_) | Op::DowngradeInfoSetV3(_) => {
                return None;
            }
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

#[cfg(test)]
mod tests {
    use super::*;
    use etcdrs_proto::etcdserverpb::LeaseCheckpoint;

    /// Every operation survives the log, proposed and applied through etcd's message.
    #[test]
    fn operations_round_trip_through_etcds_encoding() {
        let proposer = Proposer {
            username: "root".into(),
            auth_revision: 4,
        };
        let ops = [
            Op::Put(PutRequest {
                key: b"k".to_vec(),
                value: b"v".to_vec().into(),
                lease: 5,
                ..Default::default()
            }),
            Op::DeleteRange(DeleteRangeRequest {
                key: b"a".to_vec(),
                range_end: b"b".to_vec(),
                prev_kv: true,
            }),
            Op::Txn(TxnRequest::default()),
            Op::Compaction(CompactionRequest {
                revision: 3,
                physical: true,
            }),
            Op::LeaseGrant(LeaseGrantRequest { ttl: 10, id: 7 }),
            Op::LeaseRevoke(LeaseRevokeRequest { id: 7 }),
            Op::Alarm(AlarmRequest {
                action: 1,
                member_id: 2,
                alarm: 1,
            }),
            Op::Publish(MemberAttributes {
                member_id: 0x8e9e05c52164694d,
                name: "n1".into(),
                client_urls: vec!["http://127.0.0.1:2379".into()],
            }),
            Op::ClusterVersionSet("3.5.0".into()),
            Op::AuthEnable(AuthEnableRequest {}),
            Op::AuthDisable(AuthDisableRequest {}),
            Op::Authenticate(InternalAuthenticateRequest {
                name: "root".into(),
                password: String::new(),
                simple_token: "abc".into(),
            }),
            Op::UserAdd(AuthUserAddRequest {
                name: "u".into(),
                ..Default::default()
            }),
            Op::UserDelete(AuthUserDeleteRequest { name: "u".into() }),
            Op::UserChangePassword(AuthUserChangePasswordRequest {
                name: "u".into(),
                ..Default::default()
            }),
            Op::UserGrantRole(AuthUserGrantRoleRequest {
                user: "u".into(),
                role: "r".into(),
            }),
            Op::UserRevokeRole(AuthUserRevokeRoleRequest {
                name: "u".into(),
                role: "r".into(),
            }),
            Op::RoleAdd(AuthRoleAddRequest { name: "r".into() }),
            Op::RoleDelete(AuthRoleDeleteRequest { role: "r".into() }),
            Op::RoleGrantPermission(AuthRoleGrantPermissionRequest::default()),
            Op::RoleRevokePermission(AuthRoleRevokePermissionRequest::default()),
            Op::LeaseCheckpoint(LeaseCheckpointRequest {
                checkpoints: vec![LeaseCheckpoint {
                    id: 7,
                    remaining_ttl: 30,
                }],
            }),
            Op::DowngradeInfoSet(Some("3.4.0".into())),
            Op::DowngradeInfoSet(None),
            Op::DowngradeInfoSetV3(Some("3.4.0".into())),
        ];
        // Every variant is in the list: the match names them all (no wildcard), so a new
        // variant fails to compile here until it is added above.
        let variant = |op: &Op| match op {
            Op::Put(_) => 0,
            Op::DeleteRange(_) => 1,
            Op::Txn(_) => 2,
            Op::Compaction(_) => 3,
            Op::LeaseGrant(_) => 4,
            Op::LeaseRevoke(_) => 5,
            Op::Alarm(_) => 6,
            Op::Publish(_) => 7,
            Op::ClusterVersionSet(_) => 8,
            Op::AuthEnable(_) => 9,
            Op::AuthDisable(_) => 10,
            Op::Authenticate(_) => 11,
            Op::UserAdd(_) => 12,
            Op::UserDelete(_) => 13,
            Op::UserChangePassword(_) => 14,
            Op::UserGrantRole(_) => 15,
            Op::UserRevokeRole(_) => 16,
            Op::RoleAdd(_) => 17,
            Op::RoleDelete(_) => 18,
            Op::RoleGrantPermission(_) => 19,
            Op::RoleRevokePermission(_) => 20,
            Op::LeaseCheckpoint(_) => 21,
            Op::DowngradeInfoSet(_) => 22,
            Op::DowngradeInfoSetV3(_) => 23,
        };
        let covered: std::collections::BTreeSet<usize> = ops.iter().map(variant).collect();
        assert_eq!(
            covered,
            (0..24).collect(),
            "an Op variant is missing from the list"
        );
        for op in ops {
            for form in [PublishForm::V2, PublishForm::V3] {
                let data = encode(9, Some(&proposer), op.clone(), form);
                let decoded = decode(&data[..]).expect("decodes");
                let expected_proposer = match (&op, form) {
                    // etcd 3.4's v2 request has no header.
                    (
                        Op::Publish(_) | Op::ClusterVersionSet(_) | Op::DowngradeInfoSet(_),
                        PublishForm::V2,
                    ) => None,
                    _ => Some(proposer.clone()),
                };
                // A downgrade in the v3 form reads back as the form etcd 3.5 writes.
                let expected_op = match (&op, form) {
                    (Op::DowngradeInfoSet(target), PublishForm::V3) => {
                        Op::DowngradeInfoSetV3(target.clone())
                    }
                    _ => op.clone(),
                };
                assert_eq!(
                    decoded,
                    Decoded::Op {
                        id: 9,
                        proposer: expected_proposer,
                        op: expected_op,
                    }
                );
            }
        }
    }

    /// The bytes of etcd 3.4's publish (`pb.Request` marshalled by gogoproto, every
    /// non-nullable field written) and of a put with its header.
    #[test]
    fn bytes_are_etcds() {
        let attributes = MemberAttributes {
            member_id: 0x1a,
            name: "n".into(),
            client_urls: vec!["u".into()],
        };
        let data = encode(1, None, Op::Publish(attributes), PublishForm::V2);
        let mut expected = vec![0x08, 1, 0x12, 3];
        expected.extend_from_slice(b"PUT");
        let path = b"/0/members/1a/attributes";
        expected.extend_from_slice(&[0x1a, path.len() as u8]);
        expected.extend_from_slice(path);
        let val = br#"{"name":"n","clientURLs":["u"]}"#;
        expected.extend_from_slice(&[0x22, val.len() as u8]);
        expected.extend_from_slice(val);
        // Dir, PrevValue, PrevIndex, then Expiration .. Stream (PrevExist and Refresh are nil).
        expected.extend_from_slice(&[0x28, 0, 0x32, 0, 0x38, 0]);
        expected.extend_from_slice(&[0x48, 0, 0x50, 0, 0x58, 0, 0x60, 0, 0x68, 0, 0x70, 0]);
        expected.extend_from_slice(&[0x78, 0, 0x80, 0x01, 0]);
        assert_eq!(data, expected);

        let put = PutRequest {
            key: b"k".to_vec(),
            value: b"v".to_vec().into(),
            ..Default::default()
        };
        let data = encode(2, None, Op::Put(put), PublishForm::V3);
        // put (4) before header (100), as gogoproto orders fields.
        assert_eq!(
            data,
            [
                0x22, 6, 0x0a, 1, b'k', 0x12, 1, b'v', 0xa2, 0x06, 2, 0x08, 2
            ]
        );
    }

    #[test]
    fn v2_requests_apply_as_etcds_v2_applier() {
        let v2 = |method: &str, path: &str, val: &str| {
            decode(
                &V2Request {
                    id: 3,
                    method: method.into(),
                    path: path.into(),
                    val: val.into(),
                    ..Default::default()
                }
                .encode_to_vec()[..],
            )
            .expect("decodes")
        };
        assert_eq!(
            v2("PUT", "/0/version", "3.4.0"),
            Decoded::Op {
                id: 3,
                proposer: None,
                op: Op::ClusterVersionSet("3.4.0".into()),
            }
        );
        assert_eq!(
            v2("PUT", "/0/members/ab/attributes", r#"{"name":"m"}"#),
            Decoded::Op {
                id: 3,
                proposer: None,
                op: Op::Publish(MemberAttributes {
                    member_id: 0xab,
                    name: "m".into(),
                    client_urls: Vec::new(),
                }),
            }
        );
        assert_eq!(
            v2(
                "PUT",
                "/0/downgrade",
                r#"{"target-version":"3.4.0","enabled":true}"#
            ),
            Decoded::Op {
                id: 3,
                proposer: None,
                op: Op::DowngradeInfoSet(Some("3.4.0".into())),
            }
        );
        assert_eq!(v2("PUT", "/0/downgrade", "{"), Decoded::Ignored { id: 3 });
        assert_eq!(v2("PUT", "/foo", "x"), Decoded::Ignored { id: 3 });
        assert_eq!(v2("SYNC", "", ""), Decoded::Ignored { id: 3 });
        assert_eq!(decode(&[][..]).ok(), Some(Decoded::Noop));
        assert_eq!(PublishForm::for_cluster_version("3.4.0"), PublishForm::V2);
        assert_eq!(PublishForm::for_cluster_version("3.5.0"), PublishForm::V2);
        assert_eq!(PublishForm::for_cluster_version("3.6.0"), PublishForm::V3);
    }
}
