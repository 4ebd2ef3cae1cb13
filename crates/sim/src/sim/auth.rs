//! Auth in the simulation: an administrator sets it up through raft (users `root` and
//! `alice`, role `rw` with read-write on the clients' keys and the lease keys, auth enabled)
//! and then revokes and grants again `rw`'s permission on the clients' keys, racing with the
//! clients, who run as `alice` (their requests carry her name and the auth revision their
//! member had applied when they were made; lease requests run as `root`).
//!
//! Real: the server's auth store and its checks, in the applier (a request refused at its
//! apply for a permission it lacks or for an auth revision gone stale) and, for reads, the
//! check a member's read path makes before it serves.
//!
//! Checked: no write applies while the permission is revoked, and none is refused while it is
//! granted (judged for each write from the auth state before and after its batch, where they
//! agree), and no read is served by a member whose applied auth state refuses it.

use etcdrs_proto::authpb::Permission;
use etcdrs_proto::authpb::UserAddOptions;
use etcdrs_proto::authpb::permission::Type as PermType;
use etcdrs_proto::etcdserverpb::{
    AuthEnableRequest, AuthRoleAddRequest, AuthRoleGrantPermissionRequest,
    AuthRoleRevokePermissionRequest, AuthUserAddRequest, AuthUserGrantRoleRequest,
};
use etcdrs_proto::rpctypes;

use super::*;

/// The clients' user.
pub(super) const CLIENT_USER: &str = "alice";
/// The administrator.
pub(super) const ROOT_USER: &str = "root";
const ROLE: &str = "rw";
/// The clients' keys, `key-*`, as a permission's range.
const KEYS_FROM: &[u8] = b"key-";
const KEYS_TO: &[u8] = b"key.";

/// What auth did in a run.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct AuthStats {
    /// Permission revocations and grants proposed.
    pub changes: u64,
    /// Writes applied under a granted permission, checked so.
    pub writes_allowed: u64,
    /// Writes refused for a revoked permission.
    pub writes_denied: u64,
    /// Writes refused for an auth revision gone stale between proposal and apply.
    pub writes_stale: u64,
    /// Reads served, and refused.
    pub reads: (u64, u64),
}

/// What a client's request header says under auth: who, and the auth revision its member
/// had applied.
pub(super) fn header(id: u64, user: &str, state: Option<&StandaloneMember>) -> RequestHeader {
    RequestHeader {
        id,
        username: user.to_owned(),
        auth_revision: state.map_or(0, |s| s.auth_state().1),
    }
}

impl Sim {
    /// The header of a request the clients' user may not make (lease grants and revokes,
    /// compactions), through member `i`: the administrator's under auth.
    pub(super) fn admin_header(&self, id: u64, i: usize) -> RequestHeader {
        if self.cfg.auth {
            header(id, ROOT_USER, self.members[i].state.as_ref())
        } else {
            RequestHeader {
                id,
                ..RequestHeader::default()
            }
        }
    }

    /// The administrator's turn: sets auth up while some member has not applied it, then
    /// revokes or grants the clients' permission, through the leader.
    pub(super) fn auth_admin(&mut self) -> Step {
        if !self.faults {
            return Ok(());
        }
        let after = self.rng.random_range(150..=600);
        self.schedule(after, Event::AuthAdmin);
        let Some(i) = (0..self.members.len()).find(|&i| {
            let m = &self.members[i];
            m.paused_until <= self.now
                && m.node
                    .as_ref()
                    .is_some_and(|n| n.raw().raft.state == StateRole::Leader)
        }) else {
            return Ok(());
        };
        let Some(state) = self.members[i].state.as_ref() else {
            return Ok(());
        };
        let (enabled, _) = state.auth_state();
        let permission = || Permission {
            perm_type: PermType::Readwrite as i32,
            key: KEYS_FROM.to_vec(),
            range_end: KEYS_TO.to_vec(),
        };
        let requests: Vec<InternalRaftRequest> = if !enabled {
            // Each may fail as already done; auth_enable goes last.
            let user = |name: &str| AuthUserAddRequest {
                name: name.to_owned(),
                options: Some(UserAddOptions { no_password: true }),
                ..AuthUserAddRequest::default()
            };
            vec![
                InternalRaftRequest {
                    auth_user_add: Some(user(ROOT_USER)),
                    ..InternalRaftRequest::default()
                },
                InternalRaftRequest {
                    auth_user_grant_role: Some(AuthUserGrantRoleRequest {
                        user: ROOT_USER.to_owned(),
                        role: "root".to_owned(),
                    }),
                    ..InternalRaftRequest::default()
                },
                InternalRaftRequest {
                    auth_role_add: Some(AuthRoleAddRequest {
                        name: ROLE.to_owned(),
                    }),
                    ..InternalRaftRequest::default()
                },
                InternalRaftRequest {
                    auth_role_grant_permission: Some(AuthRoleGrantPermissionRequest {
                        name: ROLE.to_owned(),
                        perm: Some(permission()),
                    }),
                    ..InternalRaftRequest::default()
                },
                InternalRaftRequest {
                    auth_role_grant_permission: Some(AuthRoleGrantPermissionRequest {
                        name: ROLE.to_owned(),
                        perm: Some(Permission {
                            perm_type: PermType::Readwrite as i32,
                            key: b"lease-".to_vec(),
                            range_end: b"lease.".to_vec(),
                        }),
                    }),
                    ..InternalRaftRequest::default()
                },
                InternalRaftRequest {
                    auth_user_add: Some(user(CLIENT_USER)),
                    ..InternalRaftRequest::default()
                },
                InternalRaftRequest {
                    auth_user_grant_role: Some(AuthUserGrantRoleRequest {
                        user: CLIENT_USER.to_owned(),
                        role: ROLE.to_owned(),
                    }),
                    ..InternalRaftRequest::default()
                },
                InternalRaftRequest {
                    auth_enable: Some(AuthEnableRequest {}),
                    ..InternalRaftRequest::default()
                },
            ]
        } else {
            let probe = state.auth_probe();
            let granted = probe(CLIENT_USER, &key_bytes(0), true);
            self.auth_stats.changes += 1;
            self.note("auth-change", i as u64 + 1, u64::from(granted), 0);
            if granted {
                vec![InternalRaftRequest {
                    auth_role_revoke_permission: Some(AuthRoleRevokePermissionRequest {
                        role: ROLE.to_owned(),
                        key: KEYS_FROM.to_vec(),
                        range_end: KEYS_TO.to_vec(),
                    }),
                    ..InternalRaftRequest::default()
                }]
            } else {
                vec![InternalRaftRequest {
                    auth_role_grant_permission: Some(AuthRoleGrantPermissionRequest {
                        name: ROLE.to_owned(),
                        perm: Some(permission()),
                    }),
                    ..InternalRaftRequest::default()
                }]
            }
        };
        for mut request in requests {
            let id = self.next_request;
            self.next_request += 1;
            request.header = Some(header(id, ROOT_USER, self.members[i].state.as_ref()));
            if let Some(node) = self.members[i].node.as_mut() {
                let _ = node.propose(request.encode_to_vec());
            }
        }
        Ok(())
    }

    /// Whether the clients' user may read `key` on member `i` now; a read it may not make is
    /// refused, unless the planted bug serves it anyway, which the check then catches.
    pub(super) fn read_permitted(&mut self, i: usize, key: &[u8]) -> Step<bool> {
        if !self.cfg.auth {
            return Ok(true);
        }
        let Some(state) = self.members[i].state.as_ref() else {
            return Ok(false);
        };
        let permitted = state.auth_probe()(CLIENT_USER, key, false);
        if permitted {
            self.auth_stats.reads.0 += 1;
            return Ok(true);
        }
        if self.cfg.read_after_revoke {
            let (_, revision) = state.auth_state();
            return Err(format!(
                "member {} served a read of {} its applied auth state (revision {revision}) refuses: a read allowed after its permission was revoked",
                self.members[i].id,
                String::from_utf8_lossy(key)
            ));
        }
        self.auth_stats.reads.1 += 1;
        Ok(false)
    }

    /// A write answered `output` on member `id`: checked against the permission its batch
    /// applied under, if the batch did not change it.
    pub(super) fn judge_write(
        &mut self,
        id: u64,
        request_id: u64,
        output: &etcdrs_server::Result<ApplyOutput>,
    ) -> Step<bool> {
        let verdict = self.auth_verdicts.get(&request_id).copied().flatten();
        match output {
            Ok(_) => {
                if verdict == Some(false) {
                    return Err(format!(
                        "member {id} applied write {request_id} while its permission was revoked"
                    ));
                }
                if verdict.is_some() {
                    self.auth_stats.writes_allowed += 1;
                }
                Ok(true)
            }
            Err(etcdrs_server::ServerError::Etcd(e))
                if e.message == rpctypes::PERMISSION_DENIED.message =>
            {
                if verdict == Some(true) {
                    return Err(format!(
                        "member {id} refused write {request_id} although its permission was granted"
                    ));
                }
                self.auth_stats.writes_denied += 1;
                Ok(false)
            }
            Err(etcdrs_server::ServerError::Etcd(e))
                if e.message == rpctypes::AUTH_OLD_REVISION.message =>
            {
                self.auth_stats.writes_stale += 1;
                Ok(false)
            }
            Err(e) => Err(format!(
                "member {id} answered request {request_id} with an error: {e}"
            )),
        }
    }
}
