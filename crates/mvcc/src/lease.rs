//! Leases: time-limited grants that keys can be attached to (etcd `server/lease/lessor.go`).
//!
//! The lessor owns the in-memory view of every lease: its granted TTL, its expiry and the keys
//! attached to it. Grants and revocations are replicated (the server applies them from raft
//! entries through [`crate::WriteBatch`], which also persists them in the `lease` bucket);
//! renewals and expiry checks are local to the member that serves them, as in etcd.

use std::collections::{BTreeSet, HashMap};
use std::time::{Duration, Instant};

use parking_lot::Mutex;

/// A lease id; 0 means "no lease".
pub type LeaseId = i64;

/// The id that means "no lease".
pub const NO_LEASE: LeaseId = 0;

/// The largest TTL etcd accepts (`MaxLeaseTTL`, seconds).
pub const MAX_LEASE_TTL: i64 = 9_000_000_000;

/// One lease.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Lease {
    /// The lease's id.
    pub id: LeaseId,
    /// The TTL it was granted with, seconds (after raising to the minimum TTL).
    pub ttl: i64,
    /// When it expires; None while this member does not track expiry (not the leader).
    pub expiry: Option<Instant>,
    /// Keys attached to it.
    pub keys: BTreeSet<Vec<u8>>,
}

impl Lease {
    /// Seconds left before expiry, rounded up as etcd does; the TTL when expiry is not tracked.
    pub fn remaining(&self, now: Instant) -> i64 {
        match self.expiry {
            None => self.ttl,
            Some(expiry) => {
                let left = expiry.saturating_duration_since(now);
                let secs = left.as_secs() as i64 + i64::from(left.subsec_nanos() > 0);
                secs.max(0)
            }
        }
    }
}

#[derive(Default)]
struct Inner {
    leases: HashMap<LeaseId, Lease>,
    key_lease: HashMap<Vec<u8>, LeaseId>,
}

/// The set of leases.
pub struct Lessor {
    inner: Mutex<Inner>,
    min_ttl: i64,
}

impl Lessor {
    /// A lessor whose grants are raised to at least `min_ttl` seconds.
    pub fn new(min_ttl: i64) -> Self {
        Lessor {
            inner: Mutex::new(Inner::default()),
            min_ttl,
        }
    }

    /// The minimum TTL, seconds.
    pub fn min_ttl(&self) -> i64 {
        self.min_ttl
    }

    /// The TTL a grant of `ttl` gets.
    pub fn effective_ttl(&self, ttl: i64) -> i64 {
        ttl.max(self.min_ttl)
    }

    pub(crate) fn insert(&self, id: LeaseId, ttl: i64, now: Instant) {
        let expiry = now.checked_add(Duration::from_secs(ttl.max(0) as u64));
        self.inner.lock().leases.insert(
            id,
            Lease {
                id,
                ttl,
                expiry,
                keys: BTreeSet::new(),
            },
        );
    }

    /// Remove a lease; returns its attached keys (None if there was no such lease).
    pub(crate) fn remove(&self, id: LeaseId) -> Option<BTreeSet<Vec<u8>>> {
        let mut inner = self.inner.lock();
        let lease = inner.leases.remove(&id)?;
        for key in &lease.keys {
            inner.key_lease.remove(key);
        }
        Some(lease.keys)
    }

    /// Whether the lease exists.
    pub fn contains(&self, id: LeaseId) -> bool {
        self.inner.lock().leases.contains_key(&id)
    }

    /// A copy of the lease.
    pub fn get(&self, id: LeaseId) -> Option<Lease> {
        self.inner.lock().leases.get(&id).cloned()
    }

    /// Ids of every lease.
    pub fn ids(&self) -> Vec<LeaseId> {
        let mut ids: Vec<_> = self.inner.lock().leases.keys().copied().collect();
        ids.sort_unstable();
        ids
    }

    /// The lease `key` is attached to, if any.
    pub fn lease_of(&self, key: &[u8]) -> LeaseId {
        self.inner
            .lock()
            .key_lease
            .get(key)
            .copied()
            .unwrap_or(NO_LEASE)
    }

    pub(crate) fn attach(&self, id: LeaseId, key: &[u8]) {
        let mut inner = self.inner.lock();
        if let Some(lease) = inner.leases.get_mut(&id) {
            lease.keys.insert(key.to_vec());
            inner.key_lease.insert(key.to_vec(), id);
        }
    }

    pub(crate) fn detach(&self, key: &[u8]) {
        let mut inner = self.inner.lock();
        if let Some(id) = inner.key_lease.remove(key)
            && let Some(lease) = inner.leases.get_mut(&id)
        {
            lease.keys.remove(key);
        }
    }

    /// Renew a lease (KeepAlive): its expiry moves to now + TTL. Returns the TTL, or None
    /// when the lease does not exist.
    pub fn renew(&self, id: LeaseId, now: Instant) -> Option<i64> {
        let mut inner = self.inner.lock();
        let lease = inner.leases.get_mut(&id)?;
        lease.expiry = now.checked_add(Duration::from_secs(lease.ttl.max(0) as u64));
        Some(lease.ttl)
    }

    /// Restart every lease's clock at `now` (etcd refreshes leases when a member becomes the
    /// primary lessor, e.g. after a restart).
    pub fn refresh_all(&self, now: Instant) {
        let mut inner = self.inner.lock();
        for lease in inner.leases.values_mut() {
            lease.expiry = now.checked_add(Duration::from_secs(lease.ttl.max(0) as u64));
        }
    }

    /// Up to `limit` leases whose expiry has passed, oldest first.
    pub fn expired(&self, now: Instant, limit: usize) -> Vec<LeaseId> {
        let inner = self.inner.lock();
        let mut expired: Vec<(Instant, LeaseId)> = inner
            .leases
            .values()
            .filter_map(|l| l.expiry.filter(|e| *e <= now).map(|e| (e, l.id)))
            .collect();
        expired.sort_unstable();
        expired.truncate(limit);
        expired.into_iter().map(|(_, id)| id).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn attach_detach_renew_expire() {
        let lessor = Lessor::new(2);
        let t0 = Instant::now();
        assert_eq!(lessor.effective_ttl(1), 2);
        lessor.insert(7, 5, t0);
        lessor.attach(7, b"a");
        lessor.attach(7, b"b");
        lessor.detach(b"a");
        assert_eq!(lessor.lease_of(b"b"), 7);
        assert_eq!(lessor.lease_of(b"a"), NO_LEASE);
        assert_eq!(lessor.get(7).unwrap().remaining(t0), 5);
        assert!(lessor.expired(t0 + Duration::from_secs(4), 10).is_empty());
        assert_eq!(lessor.expired(t0 + Duration::from_secs(5), 10), vec![7]);
        lessor.renew(7, t0 + Duration::from_secs(4));
        assert!(lessor.expired(t0 + Duration::from_secs(8), 10).is_empty());
        let keys = lessor.remove(7).unwrap();
        assert_eq!(keys.into_iter().collect::<Vec<_>>(), vec![b"b".to_vec()]);
        assert_eq!(lessor.lease_of(b"b"), NO_LEASE);
    }
}
