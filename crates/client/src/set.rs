//! The endpoints of a cluster as one client dials them: a lazily connected channel per
//! endpoint, one of them current, and the rule that picks another when the current one fails.
//!
//! Invariant: the current index is always that of a member of the set, and a failure reported
//! for an endpoint that is no longer current changes nothing (another caller has moved on
//! already), so concurrent callers that see the same endpoint fail move the set once.

use std::ops::Range;
use std::sync::atomic::{AtomicUsize, Ordering};

use tonic::transport::{Channel, Endpoint};

use crate::endpoint::{DialOptions, Target};
use crate::error::{Error, Result};
use crate::tls::{ClientTls, connector};

/// Which endpoint is current at first and which one follows a failed one.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Pick {
    /// Start at a random endpoint; after a failure, a random one not failed yet (the gRPC
    /// proxy, spreading its load over the cluster as etcd's balancer does).
    Random,
    /// Start at the first endpoint; after a failure, the next one in the list not failed yet
    /// (v3 discovery, trying the endpoints in the order given).
    InOrder,
}

/// One endpoint of the set.
struct Member {
    target: Target,
    endpoint: Endpoint,
    tls: Option<ClientTls>,
    channel: Channel,
}

/// A cluster's endpoints, one of them current.
pub struct EndpointSet {
    members: Vec<Member>,
    current: AtomicUsize,
    pick: Pick,
}

impl EndpointSet {
    /// Lazily connected channels to `targets`, each over TLS when its configuration is given.
    /// Must run inside a tokio runtime (a channel's worker is a task).
    pub fn new(
        targets: Vec<(Target, Option<ClientTls>)>,
        options: &DialOptions,
        pick: Pick,
    ) -> Result<EndpointSet> {
        if targets.is_empty() {
            return Err(Error::NoEndpoints);
        }
        let mut members = Vec::with_capacity(targets.len());
        for (target, tls) in targets {
            let endpoint = options.endpoint(&target)?;
            let channel = match &tls {
                None => endpoint.connect_lazy(),
                Some(config) => endpoint
                    .clone()
                    .connect_with_connector_lazy(connector(config.clone())),
            };
            members.push(Member {
                target,
                endpoint,
                tls,
                channel,
            });
        }
        let start = match pick {
            Pick::Random => rand::random_range(0..members.len()),
            Pick::InOrder => 0,
        };
        Ok(EndpointSet {
            members,
            current: AtomicUsize::new(start),
            pick,
        })
    }

    /// Number of endpoints (at least one).
    pub fn len(&self) -> usize {
        self.members.len()
    }

    /// Whether there is no endpoint (never: [`EndpointSet::new`] refuses that).
    pub fn is_empty(&self) -> bool {
        self.members.is_empty()
    }

    /// `host:port` of the endpoint at `idx`.
    pub fn host_port(&self, idx: usize) -> &str {
        &self.members[idx % self.members.len()].target.host_port
    }

    /// The endpoint calls currently go to: its index and channel.
    pub fn current(&self) -> (usize, Channel) {
        let idx = self.current.load(Ordering::Relaxed) % self.members.len();
        (idx, self.members[idx].channel.clone())
    }

    /// Reports that the endpoint at `idx` failed: if it is still the current one, the next
    /// one by the set's [`Pick`] becomes current. Returns the new current index when this
    /// call moved the set.
    pub fn failed(&self, idx: usize) -> Option<usize> {
        self.failed_avoiding(idx, &[])
    }

    /// [`EndpointSet::failed`], preferring an endpoint not in `tried` while there is one.
    pub fn failed_avoiding(&self, idx: usize, tried: &[usize]) -> Option<usize> {
        let next = next_after_failure(self.pick, self.members.len(), idx, tried, |range| {
            rand::random_range(range)
        })?;
        self.current
            .compare_exchange(idx, next, Ordering::Relaxed, Ordering::Relaxed)
            .ok()
            .map(|_| next)
    }

    /// Connects to the endpoint at `idx` now, rather than at its first call: the caller learns
    /// whether it can be reached (bounded by the connect timeout of the TCP dial).
    pub async fn dial(&self, idx: usize) -> std::result::Result<Channel, tonic::transport::Error> {
        let member = &self.members[idx % self.members.len()];
        match &member.tls {
            None => member.endpoint.connect().await,
            Some(config) => {
                member
                    .endpoint
                    .connect_with_connector(connector(config.clone()))
                    .await
            }
        }
    }

    /// Makes `channel`, connected by [`EndpointSet::dial`] to the endpoint at `idx`, that
    /// endpoint's channel, and the endpoint current.
    pub fn connected(&mut self, idx: usize, channel: Channel) {
        let idx = idx % self.members.len();
        self.members[idx].channel = channel;
        self.current.store(idx, Ordering::Relaxed);
    }
}

/// The failover rule: which of `n` endpoints follows `failed`, avoiding those in `tried`
/// while any other remains; `None` when there is no other endpoint. `roll` draws a number in
/// a range (the randomness of [`Pick::Random`], a parameter so that the rule is testable).
pub fn next_after_failure(
    pick: Pick,
    n: usize,
    failed: usize,
    tried: &[usize],
    roll: impl FnOnce(Range<usize>) -> usize,
) -> Option<usize> {
    if n < 2 {
        return None;
    }
    let untried: Vec<usize> = (0..n)
        .filter(|i| *i != failed && !tried.contains(i))
        .collect();
    let next = match pick {
        Pick::Random if untried.is_empty() => (failed + roll(1..n)) % n,
        Pick::Random => untried[roll(0..untried.len()) % untried.len()],
        Pick::InOrder => (1..n)
            .map(|step| (failed + step) % n)
            .find(|i| untried.contains(i))
            .unwrap_or((failed + 1) % n),
    };
    Some(next)
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn options() -> DialOptions {
        DialOptions {
            connect_timeout: Duration::from_millis(100),
            keepalive_time: Duration::from_secs(10),
            keepalive_timeout: Duration::from_secs(5),
        }
    }

    /// A set over `n` loopback endpoints nothing listens on (channels are lazy: no dial).
    fn set(n: usize, pick: Pick) -> EndpointSet {
        let targets = (0..n)
            .map(|i| (Target::parse(&format!("http://127.0.0.1:{}", i + 1)), None))
            .collect();
        EndpointSet::new(targets, &options(), pick).expect("valid endpoints")
    }

    #[test]
    fn a_single_endpoint_has_no_successor() {
        for pick in [Pick::Random, Pick::InOrder] {
            assert_eq!(next_after_failure(pick, 1, 0, &[], |_| 0), None);
            assert_eq!(next_after_failure(pick, 0, 0, &[], |_| 0), None);
        }
    }

    #[test]
    fn in_order_takes_the_next_untried_endpoint() {
        assert_eq!(next_after_failure(Pick::InOrder, 3, 0, &[], |_| 9), Some(1));
        assert_eq!(next_after_failure(Pick::InOrder, 3, 2, &[], |_| 9), Some(0));
        assert_eq!(
            next_after_failure(Pick::InOrder, 4, 1, &[2], |_| 9),
            Some(3)
        );
        assert_eq!(
            next_after_failure(Pick::InOrder, 4, 3, &[0, 1], |_| 9),
            Some(2)
        );
        // All tried: the next one all the same.
        assert_eq!(
            next_after_failure(Pick::InOrder, 3, 1, &[0, 2], |_| 9),
            Some(2)
        );
    }

    #[test]
    fn random_draws_among_the_untried_others() {
        // Untried are [1, 3]: the roll indexes them.
        let mut asked = None;
        let next = next_after_failure(Pick::Random, 4, 0, &[2], |range| {
            asked = Some(range);
            1
        });
        assert_eq!(next, Some(3));
        assert_eq!(asked, Some(0..2));
        assert_eq!(next_after_failure(Pick::Random, 4, 0, &[2], |_| 0), Some(1));
        // Every draw over every failed endpoint lands on another, untried one.
        for failed in 0..5 {
            for draw in 0..4 {
                let next = next_after_failure(Pick::Random, 5, failed, &[failed, 4], |_| draw)
                    .expect("others remain");
                assert_ne!(next, failed);
                assert_ne!(next, 4);
            }
        }
    }

    #[test]
    fn random_with_all_tried_still_leaves_the_failed_one() {
        for draw in 1..3 {
            let next = next_after_failure(Pick::Random, 3, 1, &[0, 2], |range| {
                assert_eq!(range, 1..3);
                draw
            });
            assert_eq!(next, Some((1 + draw) % 3));
        }
    }

    #[test]
    fn an_empty_set_is_refused() {
        let err = EndpointSet::new(Vec::new(), &options(), Pick::Random)
            .err()
            .expect("no endpoints");
        assert!(matches!(err, Error::NoEndpoints));
    }

    #[tokio::test]
    async fn in_order_starts_first_and_walks_the_list() {
        let set = set(3, Pick::InOrder);
        assert_eq!(set.len(), 3);
        assert!(!set.is_empty());
        assert_eq!(set.current().0, 0);
        assert_eq!(set.host_port(0), "127.0.0.1:1");
        assert_eq!(set.failed(0), Some(1));
        assert_eq!(set.failed(1), Some(2));
        assert_eq!(set.failed(2), Some(0));
        assert_eq!(set.current().0, 0);
    }

    #[tokio::test]
    async fn a_stale_failure_does_not_move_the_set() {
        let set = set(3, Pick::InOrder);
        assert_eq!(set.failed(0), Some(1));
        // A second caller that also saw endpoint 0 fail: the set has moved on already.
        assert_eq!(set.failed(0), None);
        assert_eq!(set.current().0, 1);
    }

    #[tokio::test]
    async fn random_failover_leaves_the_failed_endpoint() {
        let set = set(4, Pick::Random);
        for _ in 0..32 {
            let (idx, _) = set.current();
            assert!(idx < 4);
            let next = set.failed(idx).expect("the current endpoint moves");
            assert_ne!(next, idx);
            assert_eq!(set.current().0, next);
        }
        let single = self::set(1, Pick::Random);
        assert_eq!(single.failed(0), None);
        assert_eq!(single.current().0, 0);
    }

    #[tokio::test]
    async fn a_connected_channel_becomes_current() {
        let mut set = set(3, Pick::InOrder);
        let channel = options()
            .endpoint(&Target::parse("127.0.0.1:9"))
            .expect("valid")
            .connect_lazy();
        set.connected(2, channel);
        assert_eq!(set.current().0, 2);
        assert_eq!(set.failed(2), Some(0));
    }

    #[tokio::test]
    async fn dialing_an_endpoint_nobody_listens_on_fails() {
        // Port 1 on loopback: refused at once, no network beyond the host.
        let set = set(1, Pick::InOrder);
        assert!(set.dial(0).await.is_err());
    }
}
