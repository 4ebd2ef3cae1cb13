//! What `bench kube` measured and how it prints it: per-operation stats merged over tasks,
//! the JSON report and its text table.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::time::Duration;

use serde_json::{Value, json};
use tokio::time::Instant;

use super::watch::WatchCounts;
use super::{WRITES, offered_writes, rates};
use crate::cli::KubeOpts;
use crate::report::Recorder;

/// The numbers of one operation kind.
#[derive(Debug, Clone, Default)]
pub(super) struct OpStats {
    /// Latency of every request that got an answer, conflicts included.
    pub(super) rec: Recorder,
    pub(super) conflicts: u64,
}

/// Per-operation results of one task; the tasks' merge into one at the end.
#[derive(Debug, Default)]
pub(super) struct Stats {
    pub(super) ops: BTreeMap<&'static str, OpStats>,
    /// Keys read by LISTs.
    pub(super) listed_keys: u64,
}

impl Stats {
    pub(super) fn op(&mut self, name: &'static str) -> &mut OpStats {
        self.ops.entry(name).or_default()
    }

    pub(super) fn ok(&mut self, name: &'static str, started: Instant) {
        self.op(name).rec.record(started.elapsed());
    }

    pub(super) fn conflict(&mut self, name: &'static str, started: Instant) {
        let op = self.op(name);
        op.rec.record(started.elapsed());
        op.conflicts += 1;
    }

    pub(super) fn error(&mut self, name: &'static str, message: &str) {
        self.op(name).rec.record_error(message);
    }

    pub(super) fn merge(&mut self, other: &Stats) {
        for (name, op) in &other.ops {
            let mine = self.op(name);
            mine.rec.merge(&op.rec);
            mine.conflicts += op.conflicts;
        }
        self.listed_keys += other.listed_keys;
    }
}

/// Everything a run measured.
pub(super) struct Report<'a> {
    pub(super) opts: &'a KubeOpts,
    pub(super) elapsed: Duration,
    pub(super) populate: (Stats, Duration),
    pub(super) stats: Stats,
    pub(super) counts: WatchCounts,
    pub(super) delay: Recorder,
    pub(super) acked: u64,
    pub(super) events: u64,
    pub(super) missing: u64,
}

pub(super) fn ms(secs: f64) -> f64 {
    (secs * 1e6).round() / 1e3
}

/// count, errors, conflicts, rate, latency of one operation kind.
pub(super) fn op_json(op: &OpStats, elapsed: Duration) -> Value {
    let s = op.rec.summary("", elapsed);
    json!({
        "count": s.count,
        "errors": s.errors,
        "conflicts": op.conflicts,
        "per_sec": (s.rps * 100.0).round() / 100.0,
        "latency_ms": {
            "p50": ms(op.rec.percentile(50.0)),
            "p99": ms(op.rec.percentile(99.0)),
            "max": ms(s.slowest),
        },
    })
}

impl Report<'_> {
    pub(super) fn writes(&self) -> OpStats {
        let mut all = OpStats::default();
        for name in WRITES {
            if let Some(op) = self.stats.ops.get(name) {
                all.rec.merge(&op.rec);
                all.conflicts += op.conflicts;
            }
        }
        all
    }

    pub(super) fn json(&self) -> Value {
        let writes = self.writes();
        let w = writes.rec.summary("", self.elapsed);
        // Conflicting Txns are timed with the rest but are not writes done.
        let done = w.count.saturating_sub(writes.conflicts);
        let secs = self.elapsed.as_secs_f64().max(1e-9);
        let list_op = |name: &str| self.stats.ops.get(name).cloned().unwrap_or_default();
        let (list_pods, list_nodes) = (list_op("list-pods"), list_op("list-nodes"));
        let lists = [&list_pods, &list_nodes]
            .iter()
            .map(|op| op.rec.summary("", self.elapsed).count)
            .sum::<u64>();
        let (populate, populate_secs) = &self.populate;
        let populate_op = populate.ops.get("populate").cloned().unwrap_or_default();
        let p = populate_op.rec.summary("", *populate_secs);
        let ops: serde_json::Map<String, Value> = self
            .stats
            .ops
            .iter()
            .map(|(name, op)| ((*name).to_owned(), op_json(op, self.elapsed)))
            .collect();
        let errors: u64 = self
            .stats
            .ops
            .values()
            .map(|op| op.rec.summary("", self.elapsed).errors)
            .sum::<u64>()
            + p.errors;
        // Every answered request of the run (population included), for CPU per request.
        let requests: u64 = self
            .stats
            .ops
            .iter()
            .filter(|(name, _)| !name.starts_with("list-") || **name == "list-page")
            .map(|(_, op)| op.rec.summary("", self.elapsed).count)
            .sum::<u64>()
            + p.count;
        let mut error_kinds = BTreeMap::new();
        for (name, op) in self.stats.ops.iter().chain(populate.ops.iter()) {
            for (message, n) in op.rec.summary("", self.elapsed).error_kinds {
                error_kinds.insert(format!("{name}: {message}"), n);
            }
        }
        for (message, n) in self.counts.errors.summary("", self.elapsed).error_kinds {
            error_kinds.insert(format!("watch: {message}"), n);
        }
        json!({
            "workload": "kube",
            "nodes": self.opts.nodes,
            "pods": self.opts.nodes * self.opts.pods_per_node,
            "duration_s": (self.elapsed.as_secs_f64() * 1e3).round() / 1e3,
            "populated": p.count,
            "populate_s": (populate_secs.as_secs_f64() * 1e3).round() / 1e3,
            "populate_per_sec": p.rps.round(),
            "offered_writes_per_sec": if self.opts.unpaced {
                Value::Null
            } else {
                json!((offered_writes(&rates(self.opts)) * 100.0).round() / 100.0)
            },
            "writes": done,
            "writes_per_sec": (done as f64 / secs * 100.0).round() / 100.0,
            "write_p50_ms": ms(writes.rec.percentile(50.0)),
            "write_p99_ms": ms(writes.rec.percentile(99.0)),
            "write_max_ms": ms(w.slowest),
            "conflicts": writes.conflicts,
            "errors": errors,
            "requests": requests,
            "lists": lists,
            "list_pods_p50_ms": ms(list_pods.rec.percentile(50.0)),
            "list_pods_p99_ms": ms(list_pods.rec.percentile(99.0)),
            "list_nodes_p50_ms": ms(list_nodes.rec.percentile(50.0)),
            "list_nodes_p99_ms": ms(list_nodes.rec.percentile(99.0)),
            "listed_keys": self.stats.listed_keys,
            "watch_events": self.events,
            "watch_expected": self.acked,
            "watch_missing": self.missing,
            "watch_delay_p50_ms": ms(self.delay.percentile(50.0)),
            "watch_delay_p99_ms": ms(self.delay.percentile(99.0)),
            "watch_delay_max_ms": ms(self.delay.summary("", self.elapsed).slowest),
            "watch_puts": self.counts.puts,
            "watch_deletes": self.counts.deletes,
            "watch_prev_kv": self.counts.with_prev_kv,
            "watch_prev_kv_expected": self.counts.want_prev_kv,
            "watch_progress": self.counts.progress,
            "watch_progress_notify": self.counts.notify,
            "ops": ops,
            "populate": op_json(&populate_op, *populate_secs),
            "error_kinds": error_kinds,
        })
    }

    pub(super) fn text(&self) -> String {
        let mut s = String::new();
        // Writing to a String cannot fail.
        let _ = self.write_text(&mut s);
        s
    }

    pub(super) fn write_text(&self, s: &mut String) -> std::fmt::Result {
        let v = self.json();
        writeln!(
            s,
            "kube: {} nodes, {} pods; {} objects created in {:.1} s ({:.0}/s)",
            v["nodes"], v["pods"], v["populated"], v["populate_s"], v["populate_per_sec"]
        )?;
        match v["offered_writes_per_sec"].as_f64() {
            Some(offered) => writeln!(
                s,
                "mix for {:.1} s, {offered} writes offered per s:\n",
                self.elapsed.as_secs_f64()
            )?,
            None => writeln!(s, "mix for {:.1} s, unpaced:\n", self.elapsed.as_secs_f64())?,
        }
        writeln!(
            s,
            "{:<14} {:>9} {:>9} {:>7} {:>9} {:>9} {:>9} {:>9}",
            "operation", "count", "per s", "errors", "conflicts", "p50 ms", "p99 ms", "max ms"
        )?;
        let mut line = |name: &str, op: &Value| {
            writeln!(
                s,
                "{:<14} {:>9} {:>9.2} {:>7} {:>9} {:>9.3} {:>9.3} {:>9.3}",
                name,
                op["count"].as_u64().unwrap_or(0),
                op["per_sec"].as_f64().unwrap_or(0.0),
                op["errors"].as_u64().unwrap_or(0),
                op["conflicts"].as_u64().unwrap_or(0),
                op["latency_ms"]["p50"].as_f64().unwrap_or(0.0),
                op["latency_ms"]["p99"].as_f64().unwrap_or(0.0),
                op["latency_ms"]["max"].as_f64().unwrap_or(0.0),
            )
        };
        line("populate", &v["populate"])?;
        if let Some(ops) = v["ops"].as_object() {
            for (name, op) in ops {
                line(name, op)?;
            }
        }
        writeln!(
            s,
            "\nwrites: {} ({} per s), p50 {} ms, p99 {} ms, max {} ms, {} conflicts",
            v["writes"],
            v["writes_per_sec"],
            v["write_p50_ms"],
            v["write_p99_ms"],
            v["write_max_ms"],
            v["conflicts"]
        )?;
        writeln!(
            s,
            "watch: {} events ({} puts, {} deletes) for {} acknowledged writes, {} missing; \
             delay p50 {} ms, p99 {} ms, max {} ms; prev_kv on {} of {}; {} progress responses, \
             {} progress notifications",
            v["watch_events"],
            v["watch_puts"],
            v["watch_deletes"],
            v["watch_expected"],
            v["watch_missing"],
            v["watch_delay_p50_ms"],
            v["watch_delay_p99_ms"],
            v["watch_delay_max_ms"],
            v["watch_prev_kv"],
            v["watch_prev_kv_expected"],
            v["watch_progress"],
            v["watch_progress_notify"]
        )?;
        if let Some(kinds) = v["error_kinds"].as_object()
            && !kinds.is_empty()
        {
            writeln!(s, "\nerrors:")?;
            for (message, n) in kinds {
                writeln!(s, "  [{n}]\t{message}")?;
            }
        }
        Ok(())
    }
}
