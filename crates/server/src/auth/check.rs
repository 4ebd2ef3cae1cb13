//! etcd's permission checks (`auth/store.go`'s `isOpPermitted` and friends): who may run
//! admin RPCs, read, write, run a txn or revoke a lease's keys, as the user's roles'
//! key-interval permissions allow (merged as etcd merges them, `Interval`/`covers`). The
//! checks only read the auth state; when they run is the caller's choice (see the parent).

use etcdrs_proto::authpb::Permission;
use etcdrs_proto::authpb::permission::Type as PermType;
use etcdrs_proto::etcdserverpb::request_op::Request as OpRequest;
use etcdrs_proto::etcdserverpb::{DeleteRangeRequest, PutRequest, RangeRequest, TxnRequest};
use etcdrs_proto::rpctypes;

use super::{AuthInfo, AuthState, AuthStore, ROOT, etcd};
use crate::error::Result;

impl AuthStore {
    /// The caller must be an admin (have the root role) when auth is on.
    pub fn check_admin(&self, info: Option<&AuthInfo>) -> Result<()> {
        self.check_user(info)?;
        let Some(info) = info else { return Ok(()) };
        let state = self.state.read();
        if !state.enabled || state.is_admin(&info.username) {
            Ok(())
        } else {
            Err(etcd(&rpctypes::PERMISSION_DENIED))
        }
    }

    /// The caller must be a user (not the anonymous caller) when auth is on.
    pub fn check_user(&self, info: Option<&AuthInfo>) -> Result<()> {
        let state = self.state.read();
        let Some(info) = info else { return Ok(()) };
        if !state.enabled {
            return Ok(());
        }
        if info.username.is_empty() {
            return Err(etcd(&rpctypes::USER_EMPTY));
        }
        if info.revision < state.revision {
            return Err(etcd(&rpctypes::AUTH_OLD_REVISION));
        }
        if !state.users.contains_key(&info.username) {
            return Err(etcd(&rpctypes::USER_NOT_FOUND));
        }
        Ok(())
    }

    /// The caller may read (or write) `[key, range_end)` (etcd's `isOpPermitted`).
    pub fn check_range(
        &self,
        info: Option<&AuthInfo>,
        key: &[u8],
        range_end: &[u8],
        write: bool,
    ) -> Result<()> {
        let state = self.state.read();
        state.check(info, &[(key, range_end, write)])
    }

    /// Everything a Range needs.
    pub fn check_range_request(&self, info: Option<&AuthInfo>, req: &RangeRequest) -> Result<()> {
        self.check_range(info, &req.key, &req.range_end, false)
    }

    /// Everything a Put needs: write on the key, read for `prev_kv`, write on the keys of the
    /// lease it attaches to (etcd's `checkLeasePuts`).
    pub fn check_put(
        &self,
        info: Option<&AuthInfo>,
        req: &PutRequest,
        lease_keys: &[Vec<u8>],
    ) -> Result<()> {
        let state = self.state.read();
        let mut needs: Vec<(&[u8], &[u8], bool)> = vec![(&req.key, &[], true)];
        if req.prev_kv {
            needs.push((&req.key, &[], false));
        }
        for key in lease_keys {
            needs.push((key, &[], true));
        }
        state.check(info, &needs)
    }

    /// Everything a DeleteRange needs.
    pub fn check_delete(&self, info: Option<&AuthInfo>, req: &DeleteRangeRequest) -> Result<()> {
        let state = self.state.read();
        let mut needs: Vec<(&[u8], &[u8], bool)> = vec![(&req.key, &req.range_end, true)];
        if req.prev_kv {
            needs.push((&req.key, &req.range_end, false));
        }
        state.check(info, &needs)
    }

    /// Everything a Txn needs: read on every compared key, and what each operation of both
    /// branches needs, whichever branch runs (etcd's `checkTxnReqsPermission`).
    pub fn check_txn(&self, info: Option<&AuthInfo>, req: &TxnRequest) -> Result<()> {
        let state = self.state.read();
        let mut needs = Vec::new();
        collect_txn_needs(req, &mut needs);
        state.check(info, &needs)
    }

    /// Revoking a lease deletes its keys: write on each (etcd's `checkLeasePuts`).
    pub fn check_lease_keys(&self, info: Option<&AuthInfo>, keys: &[Vec<u8>]) -> Result<()> {
        let state = self.state.read();
        let needs: Vec<(&[u8], &[u8], bool)> =
            keys.iter().map(|k| (k.as_slice(), &[][..], true)).collect();
        state.check(info, &needs)
    }
}

impl AuthState {
    pub(super) fn is_admin(&self, username: &str) -> bool {
        self.users
            .get(username)
            .is_some_and(|u| u.roles.iter().any(|r| r == ROOT))
    }

    pub(super) fn check_self_or_admin(&self, info: Option<&AuthInfo>, name: &str) -> Result<()> {
        let Some(info) = info else { return Ok(()) };
        if !self.enabled {
            return Ok(());
        }
        if info.username.is_empty() {
            return Err(etcd(&rpctypes::USER_EMPTY));
        }
        if info.username == name || self.is_admin(&info.username) {
            Ok(())
        } else {
            Err(etcd(&rpctypes::PERMISSION_DENIED))
        }
    }

    /// Every `(key, range_end, write)` must be permitted.
    pub(super) fn check(
        &self,
        info: Option<&AuthInfo>,
        needs: &[(&[u8], &[u8], bool)],
    ) -> Result<()> {
        let Some(info) = info else { return Ok(()) };
        if !self.enabled {
            return Ok(());
        }
        if info.username.is_empty() {
            return Err(etcd(&rpctypes::USER_EMPTY));
        }
        if info.revision < self.revision {
            return Err(etcd(&rpctypes::AUTH_OLD_REVISION));
        }
        let Some(user) = self.users.get(&info.username) else {
            return Err(etcd(&rpctypes::PERMISSION_DENIED));
        };
        if user.roles.iter().any(|r| r == ROOT) {
            return Ok(());
        }
        let perms: Vec<&Permission> = user
            .roles
            .iter()
            .filter_map(|r| self.roles.get(r))
            .flat_map(|r| r.key_permission.iter())
            .collect();
        for (key, range_end, write) in needs {
            let allowed: Vec<Interval> = perms
                .iter()
                .filter(|p| {
                    let kind = PermType::try_from(p.perm_type).unwrap_or(PermType::Read);
                    kind == PermType::Readwrite
                        || (*write && kind == PermType::Write)
                        || (!*write && kind == PermType::Read)
                })
                .map(|p| Interval::of(&p.key, &p.range_end))
                .collect();
            if !covers(&allowed, &Interval::of(key, range_end)) {
                return Err(etcd(&rpctypes::PERMISSION_DENIED));
            }
        }
        Ok(())
    }
}

/// A key interval: `[start, end)`, `end == None` meaning no end.
#[derive(Debug, Clone)]
pub(super) struct Interval {
    start: Vec<u8>,
    end: Option<Vec<u8>>,
}

impl Interval {
    /// etcd's reading of a key and range end: empty end is the key alone, `"\0"` is every key
    /// from `key` on.
    pub(super) fn of(key: &[u8], range_end: &[u8]) -> Interval {
        let end = if range_end.is_empty() {
            let mut next = key.to_vec();
            next.push(0);
            Some(next)
        } else if range_end == [0] {
            None
        } else {
            Some(range_end.to_vec())
        };
        Interval {
            start: key.to_vec(),
            end,
        }
    }
}

/// Whether the union of `allowed` covers all of `wanted`.
pub(super) fn covers(allowed: &[Interval], wanted: &Interval) -> bool {
    if let Some(end) = &wanted.end
        && *end <= wanted.start
    {
        // An empty range asks for nothing.
        return true;
    }
    let mut covered_to = wanted.start.clone();
    // Each round extends the covered prefix by one interval; at most one round per interval.
    for _ in 0..=allowed.len() {
        let next = allowed
            .iter()
            .filter(|i| i.start <= covered_to && i.end.as_ref().is_none_or(|e| *e > covered_to))
            .map(|i| i.end.clone())
            .max_by(|a, b| match (a, b) {
                (None, None) => std::cmp::Ordering::Equal,
                (None, _) => std::cmp::Ordering::Greater,
                (_, None) => std::cmp::Ordering::Less,
                (Some(a), Some(b)) => a.cmp(b),
            });
        match next {
            None => return false,
            Some(None) => return true,
            Some(Some(end)) => {
                if wanted.end.as_ref().is_some_and(|w| end >= *w) {
                    return true;
                }
                covered_to = end;
            }
        }
    }
    false
}

pub(super) fn collect_txn_needs<'a>(
    req: &'a TxnRequest,
    needs: &mut Vec<(&'a [u8], &'a [u8], bool)>,
) {
    for compare in &req.compare {
        needs.push((&compare.key, &compare.range_end, false));
    }
    for op in req.success.iter().chain(req.failure.iter()) {
        match &op.request {
            Some(OpRequest::RequestRange(r)) => needs.push((&r.key, &r.range_end, false)),
            Some(OpRequest::RequestPut(p)) => {
                needs.push((&p.key, &[], true));
                if p.prev_kv {
                    needs.push((&p.key, &[], false));
                }
            }
            Some(OpRequest::RequestDeleteRange(d)) => {
                needs.push((&d.key, &d.range_end, true));
                if d.prev_kv {
                    needs.push((&d.key, &d.range_end, false));
                }
            }
            Some(OpRequest::RequestTxn(t)) => collect_txn_needs(t, needs),
            None => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    pub(super) fn perm(key: &str, end: &str) -> Interval {
        Interval::of(key.as_bytes(), end.as_bytes())
    }

    #[test]
    pub(super) fn intervals_cover_as_etcd_merges_permissions() {
        let prefix = [perm("a/", "a0")];
        assert!(covers(&prefix, &perm("a/x", "")));
        assert!(covers(&prefix, &perm("a/", "a0")));
        assert!(!covers(&prefix, &perm("a/", "b")));
        assert!(!covers(&prefix, &perm("b", "")));
        let pieces = [perm("a", "c"), perm("c", "e")];
        assert!(covers(&pieces, &perm("b", "d")));
        assert!(!covers(&pieces, &perm("b", "f")));
        let open = [perm("m", "\0")];
        assert!(covers(&[Interval::of(b"m", &[0])], &perm("z", "")));
        assert!(!covers(&open, &perm("a", "")));
        let single = [perm("k", "")];
        assert!(covers(&single, &perm("k", "")));
        assert!(!covers(&single, &perm("k", "l")));
    }
}
