//! When to compact automatically (etcd `server/etcdserver/api/v3compactor`).
//!
//! *Periodic* mode samples the store revision every tenth of the retention period (at most
//! every 6 minutes) and, once a period has passed since the last success, compacts at the
//! revision sampled one period ago. *Revision* mode compacts every 5 minutes at the current
//! revision less the retention. Both are pure state machines here; the server's task feeds
//! them the clock and the revision and proposes what they decide.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use crate::config::AutoCompaction;

/// How often revision mode checks, as in etcd.
pub const REVISION_CHECK_INTERVAL: Duration = Duration::from_secs(5 * 60);

/// The compaction plan for one mode.
#[derive(Debug)]
pub enum Plan {
    /// No automatic compaction.
    Off,
    /// etcd's periodic compactor.
    Periodic(Periodic),
    /// etcd's revision compactor.
    Revision {
        /// Revisions to keep.
        keep: i64,
        /// The last revision compacted at.
        last: i64,
    },
}

/// State of the periodic compactor.
#[derive(Debug)]
pub struct Periodic {
    period: Duration,
    retry_interval: Duration,
    retentions: usize,
    revs: VecDeque<i64>,
    last_success: Instant,
    base_interval: Duration,
}

impl Plan {
    /// The plan for `mode`, starting at `now`.
    pub fn new(mode: AutoCompaction, now: Instant) -> Plan {
        match mode {
            AutoCompaction::Off => Plan::Off,
            AutoCompaction::Periodic(period) if period.is_zero() => Plan::Off,
            AutoCompaction::Periodic(period) => {
                let retry_interval =
                    (period.min(Duration::from_secs(3600)) / 10).max(Duration::from_millis(1));
                let retentions = (period.as_nanos() / retry_interval.as_nanos()) as usize + 1;
                Plan::Periodic(Periodic {
                    period,
                    retry_interval,
                    retentions,
                    revs: VecDeque::with_capacity(retentions + 1),
                    last_success: now,
                    base_interval: period,
                })
            }
            AutoCompaction::Revision(0) => Plan::Off,
            AutoCompaction::Revision(keep) => Plan::Revision {
                keep: keep as i64,
                last: 0,
            },
        }
    }

    /// How often [`Plan::tick`] should run.
    pub fn interval(&self) -> Option<Duration> {
        match self {
            Plan::Off => None,
            Plan::Periodic(p) => Some(p.retry_interval),
            Plan::Revision { .. } => Some(REVISION_CHECK_INTERVAL),
        }
    }

    /// Record the current revision at `now`; returns the revision to compact at, if it is time.
    pub fn tick(&mut self, now: Instant, current_rev: i64) -> Option<i64> {
        match self {
            Plan::Off => None,
            Plan::Periodic(p) => {
                p.revs.push_back(current_rev);
                if p.revs.len() > p.retentions {
                    p.revs.pop_front();
                }
                if now.duration_since(p.last_success) < p.base_interval {
                    return None;
                }
                // After the first compaction, compact every interval rather than every period.
                p.base_interval = p.period.min(Duration::from_secs(3600));
                p.revs.front().copied()
            }
            Plan::Revision { keep, last } => {
                let rev = current_rev - *keep;
                if rev <= 0 || rev == *last {
                    return None;
                }
                Some(rev)
            }
        }
    }

    /// Tell the plan a compaction at `rev` succeeded (or was already done) at `now`.
    pub fn succeeded(&mut self, rev: i64, now: Instant) {
        match self {
            Plan::Off => {}
            Plan::Periodic(p) => p.last_success = now,
            Plan::Revision { last, .. } => *last = rev,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn periodic_compacts_at_the_revision_one_period_ago() {
        let t0 = Instant::now();
        let mut plan = Plan::new(AutoCompaction::Periodic(Duration::from_secs(10)), t0);
        assert_eq!(plan.interval(), Some(Duration::from_secs(1)));
        let mut decided = None;
        for second in 0..=10 {
            let now = t0 + Duration::from_secs(second);
            decided = plan.tick(now, 100 + second as i64);
            if second < 10 {
                assert_eq!(decided, None, "at {second}s");
            }
        }
        // Samples are kept for one period: the oldest kept is from t0.
        assert_eq!(decided, Some(100));
        plan.succeeded(100, t0 + Duration::from_secs(10));
        assert_eq!(plan.tick(t0 + Duration::from_secs(11), 111), None);
    }

    #[test]
    fn revision_mode_keeps_the_last_n() {
        let t0 = Instant::now();
        let mut plan = Plan::new(AutoCompaction::Revision(100), t0);
        assert_eq!(plan.tick(t0, 50), None);
        assert_eq!(plan.tick(t0, 150), Some(50));
        plan.succeeded(50, t0);
        assert_eq!(plan.tick(t0, 150), None);
        assert_eq!(plan.tick(t0, 151), Some(51));
    }

    #[test]
    fn zero_retention_is_off() {
        let t0 = Instant::now();
        assert!(matches!(
            Plan::new(AutoCompaction::Periodic(Duration::ZERO), t0),
            Plan::Off
        ));
        assert!(matches!(
            Plan::new(AutoCompaction::Revision(0), t0),
            Plan::Off
        ));
    }
}
