//! What every crate that exports etcd's Prometheus series needs to define them: registration in
//! the process-wide default registry, and Go's exponential histogram buckets. The series
//! themselves stay with the crate that counts them.

use prometheus::{Histogram, HistogramOpts};

/// Registers `metric` (a static definition, so it is valid) in the default registry and
/// returns it. Registering twice (several stores or nodes in one test process) is harmless:
/// the first one wins.
pub fn register<M: prometheus::core::Collector + Clone + 'static>(
    metric: prometheus::Result<M>,
) -> M {
    let metric = metric.expect("static metric definitions are valid");
    let _ = prometheus::default_registry().register(Box::new(metric.clone()));
    metric
}

/// Buckets `start`, `start*factor`, ... (`count` of them), as Go's `ExponentialBuckets`.
pub fn exponential(start: f64, factor: f64, count: usize) -> Vec<f64> {
    std::iter::successors(Some(start), |b| Some(b * factor))
        .take(count)
        .collect()
}

/// A registered histogram with `buckets`.
pub fn histogram(name: &str, help: &str, buckets: Vec<f64>) -> Histogram {
    register(Histogram::with_opts(
        HistogramOpts::new(name, help).buckets(buckets),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_as_go_makes_them() {
        assert_eq!(exponential(0.001, 2.0, 4), [0.001, 0.002, 0.004, 0.008]);
        assert!(exponential(1.0, 2.0, 0).is_empty());
    }
}
