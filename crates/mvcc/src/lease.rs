//! Leases: time-limited grants that keys can be attached to (port of etcd `lease/lessor.go`).
//!
//! The lessor owns the in-memory view of every lease: its granted TTL, its expiry and the keys
//! attached to it. Grants and revocations are replicated (the server applies them from raft
//! entries through [`crate::WriteBatch`], which also persists them in the `lease` bucket);
//! renewals and expiry checks are local to the member that serves them, as in etcd.
//!
//! # Primary lessor
//!
//! Only the leader's lessor is *primary*: it alone tracks expiries, renews leases and reports
//! expired ones for revocation. Every other lessor (a follower, or any member before it has
//! become leader and applied an entry of its own term) keeps each lease alive forever, so a
//! lease never expires because a member was down or not in charge. [`Lessor::promote`] makes
//! the lessor primary and restarts every lease's clock, extended by the election timeout (as
//! etcd's `Promote(electionTimeout)`), which is why a lease's TTL is refreshed by a restart;
//! [`Lessor::demote`] stops the clocks again.
//!
//! # Expiry
//!
//! A lease is expired once its expiry is not in the future. An expired lease is not removed
//! here: [`Lessor::expired`] reports it (at most once per [`EXPIRED_LEASE_RETRY_INTERVAL`]) and
//! the server proposes its revocation through raft, so every member deletes its keys in the same
//! revision. Until that revocation is applied, [`Lessor::renew`] refuses to bring the lease back
//! ([`Renewal::Expired`]): a keep-alive that arrives too late must not resurrect a lease whose
//! revocation may already be committed. Callers wait on [`Lessor::subscribe`] for the outcome.
//!
//! This module is *not* the lease RPC service (that is the server's `rpc::lease`) and never
//! spawns tasks or reads the clock: every time-dependent call takes `now`.

use std::collections::{BTreeSet, HashMap, HashSet};
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use tokio::sync::watch;

/// A lease id; 0 means "no lease".
pub type LeaseId = i64;

/// The id that means "no lease".
pub const NO_LEASE: LeaseId = 0;

/// The largest TTL etcd accepts (`MaxLeaseTTL`, seconds).
pub const MAX_LEASE_TTL: i64 = 9_000_000_000;

/// How long an expired lease waits before [`Lessor::expired`] reports it again when its
/// revocation did not happen (etcd's `defaultExpiredleaseRetryInterval`).
pub const EXPIRED_LEASE_RETRY_INTERVAL: Duration = Duration::from_secs(3);

/// How many expiring leases per second [`Lessor::promote`] lets through before it spreads the
/// rest out (etcd's `leaseRevokeRate`).
const LEASE_REVOKE_RATE: usize = 1000;

/// What [`Lease::remaining`] reports for a lease without an expiry: etcd's
/// `int64(time.Duration(math.MaxInt64).Seconds())`.
const FOREVER_SECS: i64 = i64::MAX / 1_000_000_000;

/// A lease as the `lease` bucket keeps it, under its id (8 bytes, big-endian): etcd's
/// `leasepb.Lease`, so the bucket is etcd's byte for byte. `remaining_ttl` is the leader's
/// last checkpoint when `--experimental-enable-lease-checkpoint-persist` keeps it (0: none).
/// Records of etcd-rs before this format are the TTL alone, 8 bytes big-endian
/// ([`LeaseRecord::decode_stored`] reads both).
#[derive(Clone, PartialEq, prost::Message)]
pub struct LeaseRecord {
    /// The lease's id.
    #[prost(int64, tag = "1")]
    pub id: i64,
    /// Its granted TTL, seconds.
    #[prost(int64, tag = "2")]
    pub ttl: i64,
    /// The TTL left at the last persisted checkpoint, seconds.
    #[prost(int64, tag = "3")]
    pub remaining_ttl: i64,
}

impl LeaseRecord {
    /// The record stored under `key`: etcd's encoding, or the older bare TTL (8 bytes whose
    /// first is 0: a TTL is below 2^56, while an encoded record starts with its id's tag).
    pub fn decode_stored(key: &[u8], value: &[u8]) -> Option<LeaseRecord> {
        let id = i64::from_be_bytes(<[u8; 8]>::try_from(key).ok()?);
        if let Ok(ttl) = <[u8; 8]>::try_from(value)
            && value[0] == 0
        {
            return Some(LeaseRecord {
                id,
                ttl: i64::from_be_bytes(ttl),
                remaining_ttl: 0,
            });
        }
        let record = <LeaseRecord as prost::Message>::decode(value).ok()?;
        (record.id == id).then_some(record)
    }
}

/// One lease, as a snapshot.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Lease {
    /// The lease's id.
    pub id: LeaseId,
    /// The TTL it was granted with, seconds (after raising to the minimum TTL).
    pub ttl: i64,
    /// When it expires; None while this lessor is not primary (the lease lives forever).
    pub expiry: Option<Instant>,
    /// Keys attached to it.
    pub keys: BTreeSet<Vec<u8>>,
    /// The TTL left at the leader's last checkpoint (etcd's `remainingTTL`, with
    /// `--experimental-enable-lease-checkpoint`); 0 when none stands. A new leader restarts
    /// the lease's clock from it rather than from the full TTL.
    pub remaining_ttl: i64,
}

impl Lease {
    /// Seconds left before expiry as etcd's `int64(Remaining().Seconds())` reports them:
    /// truncated toward zero, so a fresh 10 s lease reports 9, and negative once expired for
    /// a second or more. A lease without an expiry reports etcd's "forever" (9223372036).
    pub fn remaining(&self, now: Instant) -> i64 {
        match self.expiry {
            None => FOREVER_SECS,
            Some(expiry) if expiry >= now => secs(expiry - now),
            Some(expiry) => -secs(now - expiry),
        }
    }

    /// Whether the lease's expiry has passed (etcd `expired`: remaining <= 0).
    fn is_expired(&self, now: Instant) -> bool {
        self.expiry.is_some_and(|expiry| expiry <= now)
    }

    /// The nanoseconds left before expiry (negative once expired); None without an expiry.
    fn remaining_nanos(&self, now: Instant) -> Option<i128> {
        self.expiry.map(|expiry| signed_nanos(expiry, now))
    }
}

/// Whole seconds of `d`, saturating.
fn secs(d: Duration) -> i64 {
    i64::try_from(d.as_secs()).unwrap_or(i64::MAX)
}

/// `a - b` in nanoseconds.
fn signed_nanos(a: Instant, b: Instant) -> i128 {
    if a >= b {
        (a - b).as_nanos() as i128
    } else {
        -((b - a).as_nanos() as i128)
    }
}

/// `now + extend + ttl seconds`; None if that is beyond what an `Instant` can hold, which for
/// etcd's largest TTL (about 285 years) still fits.
fn expiry_at(now: Instant, extend: Duration, ttl: i64) -> Option<Instant> {
    let ttl = Duration::from_secs(u64::try_from(ttl).unwrap_or(0));
    now.checked_add(extend)?.checked_add(ttl)
}

/// The outcome of [`Lessor::renew`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Renewal {
    /// The lease's clock restarted.
    Renewed {
        /// It now lives this many seconds (its granted TTL).
        ttl: i64,
        /// A checkpoint of it may stand, or be on its way through raft, on the members: the
        /// caller clears it through raft, or a new leader would restart the renewed lease
        /// from that remainder.
        clear_checkpoint: bool,
    },
    /// There is no such lease (never granted, or revoked).
    NotFound,
    /// The lease expired and awaits its revocation; it was not renewed. The caller waits for
    /// a change ([`Lessor::subscribe`]) and asks again: it will be `NotFound` once revoked.
    Expired,
    /// This lessor is not primary and renews nothing; only the leader's lessor renews.
    NotPrimary,
}

#[derive(Default)]
struct Inner {
    leases: HashMap<LeaseId, Lease>,
    key_lease: HashMap<Vec<u8>, LeaseId>,
    /// Expired leases already reported by `expired`, with the time to report them again.
    revoke_retry: HashMap<LeaseId, Instant>,
    /// Invariant: every lease has an expiry exactly when this is true.
    primary: bool,
    /// Leases this lessor took a checkpoint of ([`Lessor::checkpoints`]) since their last
    /// renewal, while primary: the checkpoint may not have applied here yet (no remainder
    /// stands) and still land after a renewal, so the renewal must clear it in the log.
    checkpoint_taken: HashSet<LeaseId>,
}

/// The set of leases.
pub struct Lessor {
    inner: Mutex<Inner>,
    min_ttl: i64,
    /// Bumped whenever a lease is removed or the lessor is promoted or demoted: the events a
    /// caller blocked on [`Renewal::Expired`] or [`Renewal::NotPrimary`] waits for.
    changes: watch::Sender<u64>,
}

impl Lessor {
    /// A non-primary lessor whose grants are raised to at least `min_ttl` seconds.
    pub fn new(min_ttl: i64) -> Self {
        Lessor {
            inner: Mutex::new(Inner::default()),
            min_ttl,
            changes: watch::Sender::new(0),
        }
    }

    /// The minimum TTL, seconds.
    pub fn min_ttl(&self) -> i64 {
        self.min_ttl
    }

    /// The TTL a grant of `ttl` gets: etcd raises it to the minimum TTL.
    pub fn effective_ttl(&self, ttl: i64) -> i64 {
        ttl.max(self.min_ttl)
    }

    /// Add a lease (a grant being applied, or one recovered from the backend). Its TTL is raised
    /// to the minimum, as etcd does on both paths; its clock starts only if this lessor is
    /// primary.
    pub(crate) fn insert(&self, id: LeaseId, ttl: i64, now: Instant) {
        let ttl = self.effective_ttl(ttl);
        let mut inner = self.inner.lock();
        let expiry = if inner.primary {
            expiry_at(now, Duration::ZERO, ttl)
        } else {
            None
        };
        inner.leases.insert(
            id,
            Lease {
                id,
                ttl,
                expiry,
                keys: BTreeSet::new(),
                remaining_ttl: 0,
            },
        );
    }

    /// Remove a lease; returns its attached keys (None if there was no such lease).
    pub(crate) fn remove(&self, id: LeaseId) -> Option<BTreeSet<Vec<u8>>> {
        let keys = {
            let mut inner = self.inner.lock();
            let lease = inner.leases.remove(&id)?;
            inner.revoke_retry.remove(&id);
            inner.checkpoint_taken.remove(&id);
            for key in &lease.keys {
                inner.key_lease.remove(key);
            }
            lease.keys
        };
        self.notify();
        Some(keys)
    }

    /// Whether the lease exists.
    pub fn contains(&self, id: LeaseId) -> bool {
        self.inner.lock().leases.contains_key(&id)
    }

    /// A copy of the lease.
    pub fn get(&self, id: LeaseId) -> Option<Lease> {
        self.inner.lock().leases.get(&id).cloned()
    }

    /// The lease's granted TTL (without copying its keys).
    pub fn ttl(&self, id: LeaseId) -> Option<i64> {
        self.inner.lock().leases.get(&id).map(|l| l.ttl)
    }

    /// Ids of every lease, ascending.
    pub fn ids(&self) -> Vec<LeaseId> {
        let mut ids: Vec<_> = self.inner.lock().leases.keys().copied().collect();
        ids.sort_unstable();
        ids
    }

    /// Ids of every lease, the soonest to expire first (etcd's `Leases`, which sorts by
    /// remaining time); leases without an expiry come last, ties in id order.
    pub fn ids_by_expiry(&self) -> Vec<LeaseId> {
        let inner = self.inner.lock();
        let mut leases: Vec<(Option<Instant>, LeaseId)> = inner
            .leases
            .values()
            .map(|lease| (lease.expiry, lease.id))
            .collect();
        drop(inner);
        leases.sort_unstable_by_key(|&(expiry, id)| (expiry.is_none(), expiry, id));
        leases.into_iter().map(|(_, id)| id).collect()
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

    /// Renew a lease (KeepAlive): its expiry moves to now + TTL. An expired lease is not
    /// renewed (see the module docs), nor is anything while this lessor is not primary.
    pub fn renew(&self, id: LeaseId, now: Instant) -> Renewal {
        let mut inner = self.inner.lock();
        if !inner.primary {
            return Renewal::NotPrimary;
        }
        let Some(lease) = inner.leases.get_mut(&id) else {
            return Renewal::NotFound;
        };
        if lease.is_expired(now) {
            return Renewal::Expired;
        }
        lease.expiry = expiry_at(now, Duration::ZERO, lease.ttl);
        // A renewal starts the lease afresh: a checkpointed remainder no longer holds, here
        // at once, on the other members once the caller's clear applies. A checkpoint taken
        // before and applied after it (committed, not applied here yet) needs that clear too:
        // the simulator's lease checks found it (seed 6043: a new leader expired a renewed
        // lease 518 ms early).
        let clear_checkpoint = lease.remaining_ttl > 0;
        lease.remaining_ttl = 0;
        let ttl = lease.ttl;
        let clear_checkpoint = inner.checkpoint_taken.remove(&id) || clear_checkpoint;
        crate::metrics::LEASES_RENEWED.inc();
        Renewal::Renewed {
            ttl,
            clear_checkpoint,
        }
    }

    /// Apply a checkpoint (etcd's `Checkpoint`): `id` had `remaining_ttl` seconds left on the
    /// leader (0 clears it). Only a promotion reads it.
    pub fn checkpoint(&self, id: LeaseId, remaining_ttl: i64) {
        if let Some(lease) = self.inner.lock().leases.get_mut(&id) {
            lease.remaining_ttl = remaining_ttl.max(0);
        }
    }

    /// What the leader checkpoints (at most `limit` leases, soonest expiry first): each lease
    /// with a running clock and the seconds it has left, rounded up as etcd's
    /// `findDueScheduledCheckpoints` does (`math.Ceil`), and none for a lease with at least its
    /// TTL left. Rounded down, a new leader would restart a lease up to a second short of what
    /// its last keep-alive promised, which the promotion's extension (the election timeout)
    /// covers only when it is a second or more (the simulator's lease checks found it, seed 15
    /// with a 100 ms election timeout). Empty unless primary.
    pub fn checkpoints(&self, now: Instant, limit: usize) -> Vec<(LeaseId, i64)> {
        let mut inner = self.inner.lock();
        if !inner.primary {
            return Vec::new();
        }
        let mut due: Vec<(Instant, LeaseId, i64)> = inner
            .leases
            .values()
            .filter_map(|lease| {
                let expiry = lease.expiry?;
                if expiry <= now {
                    return None;
                }
                let left = expiry - now;
                let remaining = secs(left).saturating_add(i64::from(left.subsec_nanos() > 0));
                (remaining < lease.ttl).then_some((expiry, lease.id, remaining))
            })
            .collect();
        due.sort_unstable();
        due.truncate(limit);
        inner
            .checkpoint_taken
            .extend(due.iter().map(|(_, id, _)| *id));
        due.into_iter()
            .map(|(_, id, remaining)| (id, remaining))
            .collect()
    }

    /// Whether this lessor is primary (tracks expiries and renews).
    pub fn is_primary(&self) -> bool {
        self.inner.lock().primary
    }

    /// Make this lessor primary and restart every lease's clock at `now + extend` (etcd's
    /// `Promote`, called with the election timeout when a member becomes leader, so that no
    /// lease expires because its keep-alives could not reach a leader during the election).
    ///
    /// With [`LEASE_REVOKE_RATE`] leases or more, expiries that would pile up are spread out so
    /// that at most three quarters of that rate expire in any one second, as etcd does.
    pub fn promote(&self, now: Instant, extend: Duration) {
        {
            let mut inner = self.inner.lock();
            inner.primary = true;
            inner.revoke_retry.clear();
            for lease in inner.leases.values_mut() {
                // etcd: a checkpointed remainder, else the full TTL.
                let ttl = if lease.remaining_ttl > 0 {
                    lease.remaining_ttl
                } else {
                    lease.ttl
                };
                lease.expiry = expiry_at(now, extend, ttl);
            }
            if inner.leases.len() >= LEASE_REVOKE_RATE {
                spread_expiries(&mut inner.leases, now, extend);
            }
        }
        self.notify();
    }

    /// Restart every lease's clock at `now` and make this lessor primary: [`Lessor::promote`]
    /// without an extension.
    pub fn refresh_all(&self, now: Instant) {
        self.promote(now, Duration::ZERO);
    }

    /// Stop being primary (etcd's `Demote`, when this member loses leadership): every lease
    /// lives forever until the next promotion.
    pub fn demote(&self) {
        {
            let mut inner = self.inner.lock();
            inner.primary = false;
            inner.revoke_retry.clear();
            inner.checkpoint_taken.clear();
            for lease in inner.leases.values_mut() {
                lease.expiry = None;
            }
        }
        self.notify();
    }

    /// Up to `limit` expired leases to revoke, the longest expired first (etcd's
    /// `findExpiredLeases`). Each is reported once, then again only after
    /// [`EXPIRED_LEASE_RETRY_INTERVAL`] if it still exists (its revocation failed). Nothing is
    /// reported while this lessor is not primary.
    pub fn expired(&self, now: Instant, limit: usize) -> Vec<LeaseId> {
        let mut inner = self.inner.lock();
        if !inner.primary {
            return Vec::new();
        }
        let mut expired: Vec<(Instant, LeaseId)> = inner
            .leases
            .values()
            .filter(|lease| {
                inner
                    .revoke_retry
                    .get(&lease.id)
                    .is_none_or(|retry| *retry <= now)
            })
            .filter_map(|lease| {
                let expiry = lease.expiry?;
                (expiry <= now).then_some((expiry, lease.id))
            })
            .collect();
        expired.sort_unstable();
        expired.truncate(limit);
        let retry = now.checked_add(EXPIRED_LEASE_RETRY_INTERVAL).unwrap_or(now);
        for (_, id) in &expired {
            inner.revoke_retry.insert(*id, retry);
        }
        expired.into_iter().map(|(_, id)| id).collect()
    }

    /// A receiver that changes whenever a lease is removed or the lessor is promoted or
    /// demoted. Subscribe *before* the check that may have to wait, so no change is missed.
    pub fn subscribe(&self) -> watch::Receiver<u64> {
        self.changes.subscribe()
    }

    /// Forget every lease (a snapshot replaces the store); the primary flag is kept.
    pub(crate) fn clear(&self) {
        {
            let mut inner = self.inner.lock();
            inner.leases.clear();
            inner.key_lease.clear();
            inner.revoke_retry.clear();
            inner.checkpoint_taken.clear();
        }
        self.notify();
    }

    fn notify(&self) {
        self.changes.send_modify(|generation| {
            *generation = generation.wrapping_add(1);
        });
    }
}

/// etcd `Promote`'s pile-up adjustment: walking the leases in expiry order, once more than
/// three quarters of [`LEASE_REVOKE_RATE`] expire within one second of the window's first
/// expiry, each further lease is pushed back in proportion to how many are already due.
fn spread_expiries(leases: &mut HashMap<LeaseId, Lease>, now: Instant, extend: Duration) {
    const SECOND: i128 = 1_000_000_000;
    let target_per_second = (3 * LEASE_REVOKE_RATE / 4) as i128;
    let mut by_expiry: Vec<(i128, LeaseId)> = leases
        .values()
        .filter_map(|lease| Some((lease.remaining_nanos(now)?, lease.id)))
        .collect();
    by_expiry.sort_unstable();
    let Some(&(first, _)) = by_expiry.first() else {
        return;
    };
    let mut base_window = first;
    let mut next_window = base_window + SECOND;
    let mut expires: i128 = 0;
    for (remaining, id) in by_expiry {
        if remaining > next_window {
            base_window = remaining;
            next_window = base_window + SECOND;
            expires = 1;
            continue;
        }
        expires += 1;
        if expires <= target_per_second {
            continue;
        }
        let delay = SECOND * expires / target_per_second - (remaining - base_window);
        next_window = base_window + delay;
        let delay = Duration::from_nanos(u64::try_from(delay).unwrap_or(0));
        if let Some(lease) = leases.get_mut(&id) {
            lease.expiry = expiry_at(now, extend + delay, lease.ttl);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lease_records_read_both_encodings() {
        use prost::Message as _;
        let key = 0x1234_i64.to_be_bytes();
        let record = LeaseRecord {
            id: 0x1234,
            ttl: 60,
            remaining_ttl: 17,
        };
        assert_eq!(
            LeaseRecord::decode_stored(&key, &record.encode_to_vec()),
            Some(record)
        );
        // An etcd-rs record from before: the TTL alone.
        let legacy = LeaseRecord::decode_stored(&key, &60i64.to_be_bytes()).unwrap();
        assert_eq!(
            (legacy.id, legacy.ttl, legacy.remaining_ttl),
            (0x1234, 60, 0)
        );
        // A record under another lease's key is refused.
        let other = 0x99_i64.to_be_bytes();
        let encoded = LeaseRecord {
            id: 0x1234,
            ttl: 60,
            remaining_ttl: 0,
        }
        .encode_to_vec();
        assert_eq!(LeaseRecord::decode_stored(&other, &encoded), None);
    }

    fn primary(min_ttl: i64) -> Lessor {
        let lessor = Lessor::new(min_ttl);
        lessor.promote(Instant::now(), Duration::ZERO);
        lessor
    }

    #[test]
    fn attach_detach_renew_expire() {
        let lessor = primary(2);
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
        assert_eq!(
            lessor.renew(7, t0 + Duration::from_secs(4)),
            Renewal::Renewed {
                ttl: 5,
                clear_checkpoint: false
            }
        );
        assert!(lessor.expired(t0 + Duration::from_secs(8), 10).is_empty());
        assert_eq!(lessor.expired(t0 + Duration::from_secs(9), 10), vec![7]);
        let keys = lessor.remove(7).unwrap();
        assert_eq!(keys.into_iter().collect::<Vec<_>>(), vec![b"b".to_vec()]);
        assert_eq!(lessor.lease_of(b"b"), NO_LEASE);
        assert_eq!(lessor.renew(7, t0), Renewal::NotFound);
    }

    #[test]
    fn remaining_truncates_like_etcd() {
        let lessor = primary(1);
        let t0 = Instant::now();
        lessor.insert(1, 10, t0);
        let lease = lessor.get(1).unwrap();
        assert_eq!(lease.remaining(t0), 10);
        assert_eq!(lease.remaining(t0 + Duration::from_millis(1)), 9);
        assert_eq!(lease.remaining(t0 + Duration::from_millis(9_999)), 0);
        assert_eq!(lease.remaining(t0 + Duration::from_millis(10_500)), 0);
        assert_eq!(lease.remaining(t0 + Duration::from_millis(11_500)), -1);
        let forever = Lease {
            expiry: None,
            ..lease
        };
        assert_eq!(forever.remaining(t0), 9_223_372_036);
    }

    #[test]
    fn grants_and_recovered_leases_are_raised_to_the_minimum_ttl() {
        let lessor = primary(3);
        let t0 = Instant::now();
        lessor.insert(1, 1, t0);
        lessor.insert(2, -5, t0);
        lessor.insert(3, 4, t0);
        assert_eq!(lessor.get(1).unwrap().ttl, 3);
        assert_eq!(lessor.get(2).unwrap().ttl, 3);
        assert_eq!(lessor.get(3).unwrap().ttl, 4);
    }

    #[test]
    fn expired_lease_is_not_renewed_and_reported_once_per_retry_interval() {
        let lessor = primary(1);
        let t0 = Instant::now();
        lessor.insert(1, 2, t0);
        let late = t0 + Duration::from_secs(2);
        assert_eq!(lessor.renew(1, late), Renewal::Expired);
        assert_eq!(lessor.get(1).unwrap().expiry, Some(late));
        assert_eq!(lessor.expired(late, 10), vec![1]);
        assert!(lessor.expired(late + Duration::from_secs(1), 10).is_empty());
        let retry = late + EXPIRED_LEASE_RETRY_INTERVAL;
        assert_eq!(lessor.expired(retry, 10), vec![1]);
        // A keep-alive (even one that was there first) still does not resurrect it.
        assert_eq!(lessor.renew(1, retry), Renewal::Expired);
    }

    #[test]
    fn checkpoints_round_the_remainder_up_and_skip_a_full_ttl() {
        let lessor = primary(1);
        let t0 = Instant::now();
        lessor.insert(1, 10, t0);
        lessor.insert(2, 3, t0);
        // 9.5 s left of 10: rounds up to the TTL, nothing to checkpoint; 2.5 s left of 3: 3.
        let soon = t0 + Duration::from_millis(500);
        assert!(lessor.checkpoints(soon, 10).is_empty());
        // 7.5 s left rounds up to 8 (etcd's math.Ceil), 0.5 s left to 1, soonest first.
        let later = t0 + Duration::from_millis(2500);
        assert_eq!(lessor.checkpoints(later, 10), vec![(2, 1), (1, 8)]);
        assert_eq!(lessor.checkpoints(later, 1), vec![(2, 1)]);
        // Exactly 7 s left is 7; an expired lease is not checkpointed.
        let whole = t0 + Duration::from_secs(3);
        assert_eq!(lessor.checkpoints(whole, 10), vec![(1, 7)]);
    }

    /// A renewal asks its caller to clear the lease's checkpoint in the log when a remainder
    /// stands here, and also when this lessor took a checkpoint that has not applied here
    /// yet (it would land after the renewal); once cleared, the next renewal asks nothing.
    #[test]
    fn a_renewal_clears_a_checkpoint_that_stands_or_is_on_its_way() {
        let lessor = primary(1);
        let t0 = Instant::now();
        lessor.insert(1, 10, t0);
        lessor.insert(2, 10, t0);
        let renewed = |id, at| lessor.renew(id, at);
        let clears = |clear_checkpoint| Renewal::Renewed {
            ttl: 10,
            clear_checkpoint,
        };
        let t1 = t0 + Duration::from_secs(3);
        assert_eq!(renewed(1, t1), clears(false), "no checkpoint taken");
        // Taken of both; lease 2's has applied here, lease 1's not yet.
        let t2 = t1 + Duration::from_secs(3);
        assert_eq!(lessor.checkpoints(t2, 10), vec![(2, 4), (1, 7)]);
        lessor.checkpoint(2, 4);
        assert_eq!(renewed(1, t2), clears(true), "a checkpoint on its way");
        assert_eq!(renewed(2, t2), clears(true), "a checkpoint that stands");
        assert_eq!(lessor.get(2).map(|l| l.remaining_ttl), Some(0));
        assert_eq!(renewed(1, t2), clears(false));
        assert_eq!(renewed(2, t2), clears(false));
        // A demoted lessor's checkpoints went with its leadership.
        let t3 = t2 + Duration::from_secs(3);
        assert_eq!(lessor.checkpoints(t3, 10).len(), 2);
        lessor.demote();
        lessor.promote(t3, Duration::ZERO);
        assert_eq!(renewed(1, t3), clears(false));
    }

    #[test]
    fn expired_is_oldest_first_and_limited() {
        let lessor = primary(1);
        let t0 = Instant::now();
        lessor.insert(5, 3, t0);
        lessor.insert(6, 1, t0);
        lessor.insert(7, 2, t0);
        let later = t0 + Duration::from_secs(10);
        assert_eq!(lessor.expired(later, 2), vec![6, 7]);
        assert_eq!(lessor.expired(later, 2), vec![5]);
    }

    #[test]
    fn not_primary_keeps_leases_forever() {
        let lessor = Lessor::new(1);
        let t0 = Instant::now();
        lessor.insert(1, 2, t0);
        assert!(!lessor.is_primary());
        assert_eq!(lessor.get(1).unwrap().expiry, None);
        assert_eq!(lessor.renew(1, t0), Renewal::NotPrimary);
        assert!(lessor.expired(t0 + Duration::from_secs(100), 10).is_empty());

        // Promotion starts the clocks, extended; demotion stops them.
        let t1 = t0 + Duration::from_secs(50);
        lessor.promote(t1, Duration::from_secs(1));
        assert_eq!(lessor.get(1).unwrap().remaining(t1), 3);
        assert_eq!(
            lessor.renew(1, t1),
            Renewal::Renewed {
                ttl: 2,
                clear_checkpoint: false
            }
        );
        lessor.insert(2, 4, t1);
        assert_eq!(lessor.get(2).unwrap().remaining(t1), 4);
        lessor.demote();
        assert_eq!(lessor.get(1).unwrap().expiry, None);
        assert_eq!(lessor.get(2).unwrap().expiry, None);
        assert!(lessor.expired(t1 + Duration::from_secs(100), 10).is_empty());
    }

    #[test]
    fn ids_by_expiry_orders_soonest_first() {
        let lessor = primary(1);
        let t0 = Instant::now();
        lessor.insert(1, 30, t0);
        lessor.insert(2, 10, t0);
        lessor.insert(3, 20, t0);
        lessor.insert(4, 10, t0);
        assert_eq!(lessor.ids_by_expiry(), vec![2, 4, 3, 1]);
        assert_eq!(lessor.ids(), vec![1, 2, 3, 4]);
    }

    #[test]
    fn changes_are_signalled_on_remove_promote_demote() {
        let lessor = Lessor::new(1);
        let mut changes = lessor.subscribe();
        lessor.insert(1, 2, Instant::now());
        assert!(!changes.has_changed().unwrap());
        lessor.remove(1);
        assert!(changes.has_changed().unwrap());
        changes.mark_unchanged();
        lessor.promote(Instant::now(), Duration::ZERO);
        assert!(changes.has_changed().unwrap());
        changes.mark_unchanged();
        lessor.demote();
        assert!(changes.has_changed().unwrap());
    }

    #[test]
    fn promote_spreads_piled_up_expiries() {
        let lessor = Lessor::new(1);
        let t0 = Instant::now();
        for id in 1..=2000 {
            lessor.insert(id, 10, t0);
        }
        lessor.promote(t0, Duration::ZERO);
        let mut per_second: HashMap<i64, usize> = HashMap::new();
        for id in 1..=2000 {
            let lease = lessor.get(id).unwrap();
            let nanos = lease.remaining_nanos(t0).unwrap();
            assert!(nanos >= 10 * 1_000_000_000, "{nanos}");
            *per_second
                .entry((nanos / 1_000_000_000) as i64)
                .or_default() += 1;
        }
        // 750 keep their expiry; the rest are pushed back into the following seconds.
        assert_eq!(per_second[&10], 750);
        assert!(per_second.values().all(|n| *n <= 750), "{per_second:?}");
    }
}
