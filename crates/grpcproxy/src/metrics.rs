//! The proxy's own Prometheus series, with etcd's grpc-proxy names (etcd
//! `server/proxy/grpcproxy/metrics.go`): cache hits, misses and size, and how much watch
//! coalescing saves. They live in a registry of their own, rendered by `/metrics`.

use std::sync::Arc;

use prometheus::{Encoder, IntCounter, IntGauge, Registry, TextEncoder};

/// The proxy's metrics. Cheap to clone.
#[derive(Clone)]
pub struct Metrics {
    inner: Arc<Inner>,
}

struct Inner {
    registry: Registry,
    /// `etcd_grpc_proxy_cache_hits_total`.
    cache_hits: IntCounter,
    /// `etcd_grpc_proxy_cache_misses_total`.
    cache_misses: IntCounter,
    /// `etcd_grpc_proxy_cache_keys_total`.
    cache_keys: IntGauge,
    /// `etcd_grpc_proxy_watchers_coalescing_total`.
    watchers_coalescing: IntGauge,
    /// `etcd_grpc_proxy_events_coalescing_total`.
    events_coalescing: IntCounter,
    /// `process_resident_memory_bytes`, read at scrape time.
    resident_memory: IntGauge,
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    /// A fresh set of series.
    pub fn new() -> Metrics {
        let registry = Registry::new();
        let counter = |name: &str, help: &str| {
            let c = IntCounter::new(name, help).expect("static metric definition is valid");
            let _ = registry.register(Box::new(c.clone()));
            c
        };
        let gauge = |name: &str, help: &str| {
            let g = IntGauge::new(name, help).expect("static metric definition is valid");
            let _ = registry.register(Box::new(g.clone()));
            g
        };
        let cache_hits = counter(
            "etcd_grpc_proxy_cache_hits_total",
            "Total number of cache hits",
        );
        let cache_misses = counter(
            "etcd_grpc_proxy_cache_misses_total",
            "Total number of cache misses",
        );
        let cache_keys = gauge(
            "etcd_grpc_proxy_cache_keys_total",
            "Total number of keys/ranges cached",
        );
        let watchers_coalescing = gauge(
            "etcd_grpc_proxy_watchers_coalescing_total",
            "Total number of current watchers coalescing",
        );
        let events_coalescing = counter(
            "etcd_grpc_proxy_events_coalescing_total",
            "Total number of events coalescing",
        );
        let resident_memory = gauge(
            "process_resident_memory_bytes",
            "Resident memory size in bytes.",
        );
        Metrics {
            inner: Arc::new(Inner {
                resident_memory,
                registry,
                cache_hits,
                cache_misses,
                cache_keys,
                watchers_coalescing,
                events_coalescing,
            }),
        }
    }

    /// A range answered from the cache.
    pub fn cache_hit(&self) {
        self.inner.cache_hits.inc();
    }

    /// A cacheable range that had to go to the cluster.
    pub fn cache_miss(&self) {
        self.inner.cache_misses.inc();
    }

    /// The number of cached ranges is now `n`.
    pub fn set_cache_keys(&self, n: usize) {
        self.inner.cache_keys.set(n as i64);
    }

    /// `delta` more (or fewer) client watchers share a cluster watcher with another one.
    pub fn add_watchers_coalescing(&self, delta: i64) {
        self.inner.watchers_coalescing.add(delta);
    }

    /// `n` events were delivered from one cluster watcher to watchers beyond the first.
    pub fn add_events_coalescing(&self, n: u64) {
        self.inner.events_coalescing.inc_by(n);
    }

    /// The Prometheus text exposition of every series.
    pub fn render(&self) -> String {
        if let Some(bytes) = resident_bytes() {
            self.inner.resident_memory.set(bytes);
        }
        let mut out = Vec::new();
        let _ = TextEncoder::new().encode(&self.inner.registry.gather(), &mut out);
        String::from_utf8_lossy(&out).into_owned()
    }
}

/// This process's resident set size, from `/proc/self/statm` (pages of 4 KiB).
fn resident_bytes() -> Option<i64> {
    let statm = std::fs::read_to_string("/proc/self/statm").ok()?;
    let pages: i64 = statm.split_whitespace().nth(1)?.parse().ok()?;
    Some(pages * 4096)
}
