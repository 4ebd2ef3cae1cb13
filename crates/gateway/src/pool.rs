//! The endpoint pool: which endpoints exist, which are up, and which one the next client
//! connection goes to (etcd `tcpproxy.TCPProxy.pick`, with weights done as promised).
//!
//! Picking is smooth weighted round robin (nginx's algorithm) over the *lowest SRV priority
//! group that has an endpoint up*. Within a group, zero-weight endpoints are used only when no
//! endpoint of the group with a weight is up; static `--endpoints` all have weight 0 and
//! priority 0, which makes the pick a plain round robin. When nothing is up, the endpoints
//! marked down are tried as a last resort, so a transient failure of every endpoint does not
//! refuse clients for a whole `--retry-delay`.
//!
//! The pool is guarded by one mutex, held only for the few comparisons of a pick or an update,
//! never across an `.await`.

use std::net::SocketAddr;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use crate::metrics::Metrics;

/// How an endpoint is probed for health.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ProbeKind {
    /// A plain endpoint, or one whose protocol is unknown (`--endpoints`): HTTP `GET /version`,
    /// falling back to a TLS hello if the endpoint closes without a byte.
    Plain,
    /// A TLS endpoint found through `_etcd-client-ssl`: a full TLS handshake against
    /// `--trusted-ca-file`.
    Tls,
}

/// What the pool is told about one endpoint.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct EndpointSpec {
    /// `host:port` as configured or discovered; the endpoint's identity in logs and metrics.
    pub(crate) key: String,
    /// Where to dial, in order.
    pub(crate) addrs: Vec<SocketAddr>,
    pub(crate) priority: u16,
    pub(crate) weight: u16,
    pub(crate) probe: ProbeKind,
}

/// One endpoint and its state.
#[derive(Debug)]
struct Endpoint {
    spec: EndpointSpec,
    up: bool,
    /// When the health monitor should next look at it.
    next_check: Instant,
    /// Smooth weighted round robin's running weight.
    current: i64,
}

/// An endpoint chosen for a connection.
#[derive(Debug, Clone)]
pub(crate) struct Picked {
    pub(crate) key: String,
    pub(crate) addrs: Vec<SocketAddr>,
}

/// A due health check.
#[derive(Debug, Clone)]
pub(crate) struct Due {
    pub(crate) key: String,
    pub(crate) addrs: Vec<SocketAddr>,
    pub(crate) probe: ProbeKind,
}

/// The endpoint pool.
pub(crate) struct Pool {
    endpoints: Mutex<Vec<Endpoint>>,
    retry_delay: Duration,
    /// Zero: up endpoints are not probed (etcd's behaviour); down ones still are.
    health_interval: Duration,
    metrics: Metrics,
}

impl Pool {
    pub(crate) fn new(
        specs: Vec<EndpointSpec>,
        retry_delay: Duration,
        health_interval: Duration,
        metrics: Metrics,
    ) -> Pool {
        let pool = Pool {
            endpoints: Mutex::new(Vec::new()),
            retry_delay,
            health_interval,
            metrics,
        };
        pool.replace(specs);
        pool
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<Endpoint>> {
        // A panic while holding the lock leaves plain data; keep serving with it.
        self.endpoints
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// The endpoints' keys, in order.
    pub(crate) fn keys(&self) -> Vec<String> {
        self.lock().iter().map(|e| e.spec.key.clone()).collect()
    }

    /// Whether any endpoint is up.
    pub(crate) fn any_up(&self) -> bool {
        self.lock().iter().any(|e| e.up)
    }

    /// Replaces the endpoint set (SRV re-resolution). Endpoints that stay keep their state;
    /// new ones start up and are probed at once. Returns whether the set of keys changed.
    pub(crate) fn replace(&self, specs: Vec<EndpointSpec>) -> bool {
        let now = Instant::now();
        let mut endpoints = self.lock();
        let old_keys: Vec<String> = endpoints.iter().map(|e| e.spec.key.clone()).collect();
        let mut old: Vec<Endpoint> = std::mem::take(&mut *endpoints);
        for spec in specs {
            if endpoints.iter().any(|e| e.spec.key == spec.key) {
                continue;
            }
            match old.iter().position(|e| e.spec.key == spec.key) {
                Some(i) => {
                    let mut kept = old.swap_remove(i);
                    kept.spec = spec;
                    endpoints.push(kept);
                }
                None => {
                    self.metrics.set_endpoint_up(&spec.key, true);
                    endpoints.push(Endpoint {
                        spec,
                        up: true,
                        next_check: now,
                        current: 0,
                    });
                }
            }
        }
        for gone in old {
            self.metrics.remove_endpoint(&gone.spec.key);
        }
        let new_keys: Vec<String> = endpoints.iter().map(|e| e.spec.key.clone()).collect();
        old_keys != new_keys
    }

    /// Chooses the endpoint for the next connection, skipping `tried`.
    pub(crate) fn pick(&self, tried: &[String]) -> Option<Picked> {
        let mut endpoints = self.lock();
        let untried = |e: &Endpoint| !tried.contains(&e.spec.key);
        let any_up = endpoints.iter().any(|e| e.up && untried(e));
        // Candidates: untried endpoints that are up, or (last resort) untried ones that are not.
        let candidate = |e: &Endpoint| untried(e) && e.up == any_up;
        let priority = endpoints
            .iter()
            .filter(|e| candidate(e))
            .map(|e| e.spec.priority)
            .min()?;
        let in_group = |e: &Endpoint| candidate(e) && e.spec.priority == priority;
        let weighted = endpoints.iter().any(|e| in_group(e) && e.spec.weight > 0);
        let weight_of = |e: &Endpoint| -> i64 {
            if weighted {
                i64::from(e.spec.weight)
            } else {
                1
            }
        };
        // Every member of the group gains its weight; the one with the highest running
        // weight (first on ties) is chosen and pays back the group's total.
        let mut total = 0i64;
        let mut best: Option<(usize, i64)> = None;
        for (i, e) in endpoints.iter_mut().enumerate() {
            if !in_group(e) {
                continue;
            }
            let w = weight_of(e);
            if w == 0 {
                continue;
            }
            total += w;
            e.current += w;
            if best.is_none_or(|(_, current)| e.current > current) {
                best = Some((i, e.current));
            }
        }
        let (best, _) = best?;
        let chosen = &mut endpoints[best];
        chosen.current -= total;
        Some(Picked {
            key: chosen.spec.key.clone(),
            addrs: chosen.spec.addrs.clone(),
        })
    }

    /// A dial or probe of `key` failed: out of rotation until `--retry-delay` has passed and a
    /// probe succeeds. Returns whether it was up before.
    pub(crate) fn mark_down(&self, key: &str, why: &str) -> bool {
        let mut endpoints = self.lock();
        let Some(e) = endpoints.iter_mut().find(|e| e.spec.key == key) else {
            return false;
        };
        let was_up = e.up;
        e.up = false;
        e.current = 0;
        e.next_check = Instant::now() + self.retry_delay;
        drop(endpoints);
        self.metrics.set_endpoint_up(key, false);
        if was_up {
            tracing::warn!(
                address = %key,
                interval = ?self.retry_delay,
                error = %why,
                "deactivated endpoint"
            );
        } else {
            tracing::warn!(
                address = %key,
                interval = ?self.retry_delay,
                error = %why,
                "failed to activate endpoint (stay inactive for another interval)"
            );
        }
        was_up
    }

    /// A probe of `key` succeeded.
    pub(crate) fn mark_up(&self, key: &str) {
        let mut endpoints = self.lock();
        let Some(e) = endpoints.iter_mut().find(|e| e.spec.key == key) else {
            return;
        };
        let was_up = e.up;
        e.up = true;
        e.next_check = Instant::now() + self.health_interval;
        drop(endpoints);
        self.metrics.set_endpoint_up(key, true);
        if !was_up {
            tracing::info!(address = %key, "activated");
        }
    }

    /// The checks due now, and when the next one after them is due. Up endpoints are checked
    /// every health interval (never, if it is zero); down ones once `--retry-delay` passed.
    pub(crate) fn due(&self, now: Instant) -> (Vec<Due>, Option<Instant>) {
        let mut endpoints = self.lock();
        let mut due = Vec::new();
        let mut next: Option<Instant> = None;
        for e in endpoints.iter_mut() {
            let checked = !e.up || !self.health_interval.is_zero();
            if !checked {
                continue;
            }
            if e.next_check <= now {
                due.push(Due {
                    key: e.spec.key.clone(),
                    addrs: e.spec.addrs.clone(),
                    probe: e.spec.probe,
                });
                // Not checked again before this probe reports (it sets the next time).
                e.next_check = now + Duration::from_secs(3600);
            } else {
                next = Some(next.map_or(e.next_check, |n| n.min(e.next_check)));
            }
        }
        (due, next)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(key: &str, priority: u16, weight: u16) -> EndpointSpec {
        EndpointSpec {
            key: key.to_string(),
            addrs: vec![],
            priority,
            weight,
            probe: ProbeKind::Plain,
        }
    }

    fn pool(specs: Vec<EndpointSpec>) -> Pool {
        Pool::new(
            specs,
            Duration::from_secs(60),
            Duration::from_secs(5),
            Metrics::new().expect("metrics"),
        )
    }

    fn picks(pool: &Pool, n: usize) -> Vec<String> {
        (0..n).map(|_| pool.pick(&[]).expect("pick").key).collect()
    }

    #[test]
    fn unweighted_is_round_robin() {
        let p = pool(vec![spec("a", 0, 0), spec("b", 0, 0), spec("c", 0, 0)]);
        assert_eq!(picks(&p, 6), ["a", "b", "c", "a", "b", "c"]);
    }

    #[test]
    fn weights_share_the_best_priority_group() {
        let p = pool(vec![spec("a", 10, 3), spec("b", 10, 1), spec("c", 20, 5)]);
        let got = picks(&p, 40);
        assert_eq!(got.iter().filter(|k| *k == "a").count(), 30);
        assert_eq!(got.iter().filter(|k| *k == "b").count(), 10);
        // Smooth: never three a's... in a row more than the weights need.
        assert_eq!(&got[..4], ["a", "a", "b", "a"]);
    }

    #[test]
    fn lower_priority_only_when_the_best_group_is_down() {
        let p = pool(vec![spec("a", 10, 1), spec("b", 10, 1), spec("c", 20, 0)]);
        p.mark_down("a", "test");
        assert_eq!(picks(&p, 3), ["b", "b", "b"]);
        p.mark_down("b", "test");
        assert_eq!(picks(&p, 2), ["c", "c"]);
        p.mark_up("a");
        assert_eq!(picks(&p, 2), ["a", "a"]);
    }

    #[test]
    fn zero_weight_used_only_without_weighted_peers() {
        let p = pool(vec![spec("a", 0, 2), spec("z", 0, 0)]);
        assert_eq!(picks(&p, 3), ["a", "a", "a"]);
        p.mark_down("a", "test");
        assert_eq!(picks(&p, 2), ["z", "z"]);
    }

    #[test]
    fn tried_endpoints_are_skipped_and_down_ones_are_a_last_resort() {
        let p = pool(vec![spec("a", 0, 0), spec("b", 0, 0)]);
        p.mark_down("a", "test");
        assert_eq!(p.pick(&[]).expect("pick").key, "b");
        assert_eq!(p.pick(&["b".into()]).expect("last resort").key, "a");
        assert!(p.pick(&["a".into(), "b".into()]).is_none());
    }

    #[test]
    fn replace_keeps_state_of_endpoints_that_stay() {
        let p = pool(vec![spec("a", 0, 0), spec("b", 0, 0)]);
        p.mark_down("a", "test");
        assert!(p.replace(vec![spec("a", 0, 0), spec("c", 0, 0)]));
        assert_eq!(p.keys(), ["a", "c"]);
        assert_eq!(picks(&p, 2), ["c", "c"]);
        assert!(!p.replace(vec![spec("a", 0, 0), spec("c", 0, 0)]));
    }
}
