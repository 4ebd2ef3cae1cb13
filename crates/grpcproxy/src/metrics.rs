//! The proxy's own Prometheus series, with etcd's grpc-proxy names and types (etcd
//! `server/proxy/grpcproxy/metrics.go`): cache hits, misses and size, and how much watch
//! coalescing saves; the proxy's own gRPC server's `grpc_server_*` (go-grpc-prometheus's, in
//! the process-wide registry, counted by `serve::grpc_metrics`); the process collector's
//! `process_*` and promhttp's scrape counts.
//! They live in a registry of their own, rendered by `/proxy/metrics` (etcd 3.5; `/metrics`
//! relays a member's, as etcd's proxy does).

use std::sync::Arc;

use prometheus::{Encoder, IntCounter, IntCounterVec, IntGauge, Opts, Registry, TextEncoder};

/// The proxy's metrics. Cheap to clone.
#[derive(Clone)]
pub struct Metrics {
    inner: Arc<Inner>,
}

struct Inner {
    registry: Registry,
    /// `etcd_grpc_proxy_cache_hits_total` (a gauge in etcd, that only grows).
    cache_hits: IntGauge,
    /// `etcd_grpc_proxy_cache_misses_total` (a gauge in etcd, that only grows).
    cache_misses: IntGauge,
    /// `etcd_grpc_proxy_cache_keys_total`.
    cache_keys: IntGauge,
    /// `etcd_grpc_proxy_watchers_coalescing_total`.
    watchers_coalescing: IntGauge,
    /// `etcd_grpc_proxy_events_coalescing_total`.
    events_coalescing: IntCounter,
    /// `promhttp_metric_handler_requests_total{code}`.
    scrapes: IntCounterVec,
    /// `promhttp_metric_handler_requests_in_flight`.
    scrapes_in_flight: IntGauge,
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    /// A fresh set of series.
    pub fn new() -> Metrics {
        // The gRPC series of the services the proxy serves, at zero from start-up as
        // go-grpc-prometheus shows those registered before it (etcd's proxy has no health
        // service; its lock and election services are registered with the others).
        let methods: Vec<(&str, &str)> = etcdrs_serve::grpc_metrics::MEMBER_METHODS
            .iter()
            .chain(etcdrs_serve::grpc_metrics::LATE_METHODS)
            .filter(|(service, _)| !service.starts_with("grpc.health"))
            .copied()
            .collect();
        etcdrs_serve::grpc_metrics::init_series(&methods);
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
        let cache_hits = gauge(
            "etcd_grpc_proxy_cache_hits_total",
            "Total number of cache hits",
        );
        let cache_misses = gauge(
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
        let scrapes = IntCounterVec::new(
            Opts::new(
                "promhttp_metric_handler_requests_total",
                "Total number of scrapes by HTTP status code.",
            ),
            &["code"],
        )
        .expect("static metric definition is valid");
        for code in ["200", "500", "503"] {
            let _ = scrapes.with_label_values(&[code]);
        }
        let _ = registry.register(Box::new(scrapes.clone()));
        let scrapes_in_flight = gauge(
            "promhttp_metric_handler_requests_in_flight",
            "Current number of scrapes being served.",
        );
        Metrics {
            inner: Arc::new(Inner {
                scrapes,
                scrapes_in_flight,
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
        self.inner.scrapes_in_flight.inc();
        // Process state is read fresh for each scrape, as Go's process collector does.
        let process = Registry::new();
        let _ = etcdrs_serve::process::register_families(&process);
        let mut families = self.inner.registry.gather();
        families.extend(process.gather());
        // Of the process-wide registry, only the gRPC server's calls are the proxy's: the
        // byte and client-request counters there are etcd's member series.
        families.extend(
            prometheus::gather()
                .into_iter()
                .filter(|family| family.name().starts_with("grpc_server_")),
        );
        families.sort_by(|a, b| a.name().cmp(b.name()));
        let mut out = Vec::new();
        let _ = TextEncoder::new().encode(&families, &mut out);
        self.inner.scrapes_in_flight.dec();
        self.inner.scrapes.with_label_values(&["200"]).inc();
        String::from_utf8_lossy(&out).into_owned()
    }
}
