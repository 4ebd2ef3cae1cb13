//! Latency recording and the summary: etcd's `pkg/report` numbers (total, slowest, fastest,
//! average, stddev, requests/s, histogram, percentiles p10..p99.9) with the percentiles taken
//! from an HDR histogram at microsecond precision.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::time::Duration;

use hdrhistogram::Histogram;
use serde_json::{Value, json};

/// The percentiles etcd's report prints.
pub const PERCENTILES: [f64; 8] = [10.0, 25.0, 50.0, 75.0, 90.0, 95.0, 99.0, 99.9];

/// Distinct error messages kept per recorder; the rest are counted under one line.
const MAX_ERROR_KINDS: usize = 32;
const OTHER_ERRORS: &str = "(other errors)";

/// Latencies and errors of one client; recorders of all clients merge into one.
#[derive(Debug, Clone)]
pub struct Recorder {
    /// Microseconds, 3 significant digits, grows as needed.
    hist: Histogram<u64>,
    count: u64,
    /// Running mean and sum of squared deviations (Welford), in seconds: exact, unlike the
    /// histogram's bucketed values.
    mean: f64,
    m2: f64,
    min: Duration,
    max: Duration,
    errors: u64,
    error_kinds: BTreeMap<String, u64>,
}

impl Default for Recorder {
    fn default() -> Self {
        Self::new()
    }
}

impl Recorder {
    pub fn new() -> Self {
        Self {
            hist: Histogram::new(3).expect("3 significant digits is a valid precision"),
            count: 0,
            mean: 0.0,
            m2: 0.0,
            min: Duration::MAX,
            max: Duration::ZERO,
            errors: 0,
            error_kinds: BTreeMap::new(),
        }
    }

    pub fn record(&mut self, latency: Duration) {
        let micros = u64::try_from(latency.as_micros())
            .unwrap_or(u64::MAX)
            .max(1);
        // The histogram grows to fit; recording fails only past its u64 range.
        if self.hist.record(micros).is_err() {
            self.hist.saturating_record(micros);
        }
        self.count += 1;
        let x = latency.as_secs_f64();
        let delta = x - self.mean;
        self.mean += delta / self.count as f64;
        self.m2 += delta * (x - self.mean);
        self.min = self.min.min(latency);
        self.max = self.max.max(latency);
    }

    pub fn record_error(&mut self, message: &str) {
        self.record_errors(message, 1);
    }

    pub fn record_errors(&mut self, message: &str, n: u64) {
        if n == 0 {
            return;
        }
        self.errors += n;
        let kind =
            if self.error_kinds.contains_key(message) || self.error_kinds.len() < MAX_ERROR_KINDS {
                message
            } else {
                OTHER_ERRORS
            };
        *self.error_kinds.entry(kind.to_owned()).or_default() += n;
    }

    #[cfg(test)]
    pub fn count(&self) -> u64 {
        self.count
    }

    #[cfg(test)]
    pub fn errors(&self) -> u64 {
        self.errors
    }

    pub fn merge(&mut self, other: &Recorder) {
        if other.count > 0 {
            // Chan et al.: combine two (count, mean, m2) triples.
            let n = self.count + other.count;
            let delta = other.mean - self.mean;
            self.mean += delta * other.count as f64 / n as f64;
            self.m2 += other.m2 + delta * delta * self.count as f64 * other.count as f64 / n as f64;
            self.count = n;
            self.min = self.min.min(other.min);
            self.max = self.max.max(other.max);
            self.hist
                .add(&other.hist)
                .expect("an auto-resizing histogram accepts any other");
        }
        for (message, n) in &other.error_kinds {
            self.record_errors(message, *n);
        }
    }

    /// Adds `other`'s errors (not its latencies), each message prefixed with `prefix`.
    pub fn merge_errors(&mut self, other: &Recorder, prefix: &str) {
        for (message, n) in &other.error_kinds {
            self.record_errors(&format!("{prefix}{message}"), *n);
        }
    }

    /// The summary of everything recorded, over a run that took `elapsed`.
    pub fn summary(&self, name: &str, elapsed: Duration) -> Summary {
        let secs = elapsed.as_secs_f64();
        let (fastest, slowest, average, stddev) = if self.count == 0 {
            (0.0, 0.0, 0.0, 0.0)
        } else {
            (
                self.min.as_secs_f64(),
                self.max.as_secs_f64(),
                self.mean,
                (self.m2 / self.count as f64).sqrt(),
            )
        };
        let percentiles = PERCENTILES
            .iter()
            .map(|&p| (p, self.percentile(p)))
            .collect();
        Summary {
            name: name.to_owned(),
            elapsed: secs,
            count: self.count,
            errors: self.errors,
            fastest,
            slowest,
            average,
            stddev,
            rps: if secs > 0.0 {
                self.count as f64 / secs
            } else {
                0.0
            },
            percentiles,
            histogram: self.buckets(fastest, slowest),
            error_kinds: self.error_kinds.clone(),
        }
    }

    /// The latency in seconds at or below which `p` percent of the requests completed.
    pub fn percentile(&self, p: f64) -> f64 {
        if self.count == 0 {
            return 0.0;
        }
        // The histogram reports a bucket's highest equivalent value; never beyond the true max.
        // A hair below p/100: 0.999 * 1000 must select the 999th value, not the 1000th.
        let micros = self.hist.value_at_quantile((p / 100.0 - 1e-9).max(0.0));
        (micros as f64 / 1e6).min(self.max.as_secs_f64())
    }

    /// etcd's 10-bucket response time histogram between fastest and slowest: each bucket is
    /// the count of latencies at or below its mark and above the previous mark.
    fn buckets(&self, fastest: f64, slowest: f64) -> Vec<(f64, u64)> {
        if self.count == 0 {
            return Vec::new();
        }
        const BUCKETS: usize = 10;
        let step = (slowest - fastest) / BUCKETS as f64;
        let mut marks: Vec<(f64, u64)> = (0..BUCKETS)
            .map(|i| (fastest + step * i as f64, 0))
            .collect();
        marks.push((slowest, 0));
        for v in self.hist.iter_recorded() {
            let secs = (self.hist.median_equivalent(v.value_iterated_to()) as f64 / 1e6)
                .clamp(fastest, slowest);
            let i = marks
                .iter()
                .position(|&(mark, _)| secs <= mark)
                .unwrap_or(BUCKETS);
            marks[i].1 += v.count_at_value();
        }
        marks
    }
}

/// The numbers of one finished run.
#[derive(Debug, Clone, PartialEq)]
pub struct Summary {
    pub name: String,
    /// Wall time of the run, seconds.
    pub elapsed: f64,
    /// Successful requests.
    pub count: u64,
    pub errors: u64,
    /// Latencies in seconds.
    pub fastest: f64,
    pub slowest: f64,
    pub average: f64,
    pub stddev: f64,
    pub rps: f64,
    /// (percent, seconds) for each of [`PERCENTILES`].
    pub percentiles: Vec<(f64, f64)>,
    /// (upper mark in seconds, count)
    pub histogram: Vec<(f64, u64)>,
    pub error_kinds: BTreeMap<String, u64>,
}

impl Summary {
    fn pct(&self, p: f64) -> f64 {
        self.percentiles
            .iter()
            .find(|(q, _)| *q == p)
            .map_or(0.0, |(_, v)| *v)
    }

    /// etcd's report layout.
    pub fn to_text(&self) -> String {
        let mut s = String::new();
        // Writing to a String cannot fail.
        let _ = self.write_text(&mut s);
        s
    }

    fn write_text(&self, s: &mut String) -> std::fmt::Result {
        if self.count > 0 {
            writeln!(s, "\nSummary:")?;
            writeln!(s, "  Total:\t{:.4} secs.", self.elapsed)?;
            writeln!(s, "  Slowest:\t{:.4} secs.", self.slowest)?;
            writeln!(s, "  Fastest:\t{:.4} secs.", self.fastest)?;
            writeln!(s, "  Average:\t{:.4} secs.", self.average)?;
            writeln!(s, "  Stddev:\t{:.4} secs.", self.stddev)?;
            writeln!(s, "  Requests/sec:\t{:.4}", self.rps)?;
            writeln!(s, "\nResponse time histogram:")?;
            let max = self.histogram.iter().map(|b| b.1).max().unwrap_or(0).max(1);
            for (mark, n) in &self.histogram {
                let bar = "∎".repeat((n * 40 / max) as usize);
                writeln!(s, "  {mark:.4} [{n}]\t|{bar}")?;
            }
            writeln!(s, "\nLatency distribution:")?;
            for (p, v) in &self.percentiles {
                if *v > 0.0 {
                    writeln!(s, "  {p}% in {v:.4} secs.")?;
                }
            }
        } else {
            writeln!(s, "\nSummary:\n  Total:\t{:.4} secs.", self.elapsed)?;
            writeln!(s, "  no request succeeded")?;
        }
        if self.errors > 0 {
            writeln!(s, "\nError distribution ({} errors):", self.errors)?;
            for (message, n) in &self.error_kinds {
                writeln!(s, "  [{n}]\t{message}")?;
            }
        }
        Ok(())
    }

    /// One JSON object for scripts; latencies in milliseconds.
    pub fn to_json(&self) -> Value {
        let ms = |secs: f64| round3(secs * 1e3);
        json!({
            "workload": self.name,
            "total": self.count,
            "errors": self.errors,
            "duration_s": round6(self.elapsed),
            "requests_per_sec": round3(self.rps),
            "latency_ms": {
                "min": ms(self.fastest),
                "mean": ms(self.average),
                "max": ms(self.slowest),
                "stddev": ms(self.stddev),
                "p10": ms(self.pct(10.0)),
                "p50": ms(self.pct(50.0)),
                "p90": ms(self.pct(90.0)),
                "p99": ms(self.pct(99.0)),
                "p999": ms(self.pct(99.9)),
            },
        })
    }
}

fn round3(x: f64) -> f64 {
    (x * 1e3).round() / 1e3
}

fn round6(x: f64) -> f64 {
    (x * 1e6).round() / 1e6
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    fn close(a: f64, b: f64, rel: f64) -> bool {
        (a - b).abs() <= b.abs() * rel
    }

    #[test]
    fn percentiles_of_one_to_a_thousand_ms() {
        let mut r = Recorder::new();
        for i in 1..=1000 {
            r.record(ms(i));
        }
        let s = r.summary("put", Duration::from_secs(2));
        assert_eq!(s.count, 1000);
        assert_eq!(s.errors, 0);
        assert_eq!(s.fastest, 0.001);
        assert_eq!(s.slowest, 1.0);
        assert!(close(s.average, 0.5005, 1e-9), "{}", s.average);
        // Population stddev of 1..=1000 ms: sqrt((1000^2 - 1) / 12) ms.
        assert!(close(s.stddev, (999_999f64 / 12.0).sqrt() / 1e3, 1e-9));
        assert_eq!(s.rps, 500.0);
        // HDR with 3 significant digits: within 0.1% of the exact order statistic.
        for (p, v) in &s.percentiles {
            let exact = (p * 10.0).round() / 1e3;
            assert!(close(*v, exact, 1e-3), "p{p}: {v} vs {exact}");
        }
        assert_eq!(s.percentiles.len(), PERCENTILES.len());
    }

    #[test]
    fn a_single_sample_is_every_percentile() {
        let mut r = Recorder::new();
        r.record(Duration::from_micros(1234));
        let s = r.summary("range", Duration::from_secs(1));
        for (_, v) in &s.percentiles {
            assert!(close(*v, 0.001234, 1e-3), "{v}");
            assert!(*v <= s.slowest);
        }
        assert_eq!(s.stddev, 0.0);
        assert_eq!(s.histogram.iter().map(|b| b.1).sum::<u64>(), 1);
    }

    #[test]
    fn sub_microsecond_latencies_still_count() {
        let mut r = Recorder::new();
        r.record(Duration::from_nanos(10));
        assert_eq!(r.count(), 1);
        assert!(r.percentile(50.0) <= 1e-6);
    }

    #[test]
    fn merging_equals_recording_in_one() {
        let mut all = Recorder::new();
        let mut a = Recorder::new();
        let mut b = Recorder::new();
        for i in 1..=500u64 {
            let d = Duration::from_micros(i * i);
            all.record(d);
            if i % 3 == 0 { &mut a } else { &mut b }.record(d);
        }
        a.record_error("boom");
        b.record_error("boom");
        b.record_error("bang");
        all.record_errors("boom", 2);
        all.record_error("bang");
        let mut merged = Recorder::new();
        merged.merge(&a);
        merged.merge(&b);
        let (m, x) = (
            merged.summary("x", Duration::from_secs(1)),
            all.summary("x", Duration::from_secs(1)),
        );
        assert_eq!(m.count, x.count);
        assert_eq!((m.fastest, m.slowest), (x.fastest, x.slowest));
        assert!(close(m.average, x.average, 1e-12));
        assert!(close(m.stddev, x.stddev, 1e-9));
        assert_eq!(m.percentiles, x.percentiles);
        assert_eq!(m.histogram, x.histogram);
        assert_eq!(m.errors, 3);
        assert_eq!(m.error_kinds, x.error_kinds);
    }

    #[test]
    fn merged_percentiles_match_the_sorted_samples() {
        let mut seed = 0x9e37_79b9_7f4a_7c15_u64;
        let mut next = move || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed
        };
        let mut truth = Vec::new();
        let mut merged = Recorder::new();
        for client in 0..20u64 {
            let mut r = Recorder::new();
            for _ in 0..(50 + client * 7) {
                let micros = 700 + next() % 11_000;
                truth.push(micros);
                r.record(Duration::from_micros(micros));
            }
            merged.merge(&r);
        }
        truth.sort_unstable();
        let s = merged.summary("x", Duration::from_secs(1));
        for (p, v) in &s.percentiles {
            let rank = ((p / 100.0 * truth.len() as f64).ceil() as usize).max(1);
            let exact = truth[rank - 1] as f64 / 1e6;
            assert!(close(*v, exact, 2e-3), "p{p}: {v} vs {exact}");
        }
    }

    #[test]
    fn histogram_buckets_cover_every_sample() {
        let mut r = Recorder::new();
        for i in 0..100 {
            r.record(ms(10 + (i % 7) * 13));
        }
        let s = r.summary("x", Duration::from_secs(1));
        assert_eq!(s.histogram.len(), 11);
        assert_eq!(s.histogram.iter().map(|b| b.1).sum::<u64>(), 100);
        assert_eq!(s.histogram[0].0, s.fastest);
        assert_eq!(s.histogram[10].0, s.slowest);
    }

    #[test]
    fn error_kinds_are_bounded() {
        let mut r = Recorder::new();
        for i in 0..100 {
            r.record_error(&format!("error {i}"));
        }
        assert_eq!(r.errors(), 100);
        let s = r.summary("x", Duration::from_secs(1));
        assert_eq!(s.error_kinds.len(), MAX_ERROR_KINDS + 1);
        assert_eq!(s.error_kinds[OTHER_ERRORS], 100 - MAX_ERROR_KINDS as u64);
        assert!(s.to_text().contains("Error distribution (100 errors)"));
        assert!(s.to_text().contains("no request succeeded"));
    }

    #[test]
    fn json_shape() {
        let mut r = Recorder::new();
        for i in 1..=1000 {
            r.record(ms(i));
        }
        r.record_error("etcdserver: request timed out");
        let v = r.summary("put", Duration::from_secs(4)).to_json();
        let obj = v.as_object().expect("an object");
        let keys: Vec<&str> = obj.keys().map(String::as_str).collect();
        assert_eq!(
            keys,
            [
                "workload",
                "total",
                "errors",
                "duration_s",
                "requests_per_sec",
                "latency_ms"
            ]
        );
        assert_eq!(v["workload"], "put");
        assert_eq!(v["total"], 1000);
        assert_eq!(v["errors"], 1);
        assert_eq!(v["duration_s"], 4.0);
        assert_eq!(v["requests_per_sec"], 250.0);
        let lat = v["latency_ms"].as_object().expect("latency object");
        for k in [
            "min", "mean", "max", "stddev", "p10", "p50", "p90", "p99", "p999",
        ] {
            assert!(lat[k].is_f64(), "{k} is a number: {:?}", lat[k]);
        }
        assert_eq!(lat["min"], 1.0);
        assert_eq!(lat["max"], 1000.0);
        assert_eq!(lat["mean"], 500.5);
        let p = |k: &str| lat[k].as_f64().expect("number");
        assert!(close(p("p50"), 500.0, 1e-3));
        assert!(close(p("p90"), 900.0, 1e-3));
        assert!(close(p("p99"), 990.0, 1e-3));
        assert!(close(p("p999"), 999.0, 1e-3));
        // It prints as one line.
        assert!(
            !serde_json::to_string(&v)
                .expect("serializes")
                .contains('\n')
        );
    }

    #[test]
    fn json_of_an_empty_run_has_zeros() {
        let mut r = Recorder::new();
        r.record_error("connection refused");
        let v = r.summary("range", Duration::from_millis(5)).to_json();
        assert_eq!(v["total"], 0);
        assert_eq!(v["errors"], 1);
        assert_eq!(v["requests_per_sec"], 0.0);
        assert_eq!(v["latency_ms"]["p99"], 0.0);
        assert_eq!(v["latency_ms"]["max"], 0.0);
    }

    #[test]
    fn text_has_etcd_sections() {
        let mut r = Recorder::new();
        for i in 1..=10 {
            r.record(ms(i));
        }
        let t = r.summary("put", Duration::from_secs(1)).to_text();
        for needle in [
            "Summary:",
            "Total:\t1.0000 secs.",
            "Slowest:\t0.0100 secs.",
            "Fastest:\t0.0010 secs.",
            "Average:\t0.0055 secs.",
            "Stddev:",
            "Requests/sec:\t10.0000",
            "Response time histogram:",
            "Latency distribution:",
            "10% in ",
            "99.9% in 0.0100 secs.",
        ] {
            assert!(t.contains(needle), "missing {needle:?} in\n{t}");
        }
        assert!(!t.contains("Error distribution"));
    }
}
