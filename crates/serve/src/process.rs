//! The `process_*` series that Go's Prometheus client exports for every process (its process
//! collector), read from `/proc/self` at scrape time: the server's `/metrics` and the gRPC
//! proxy's `/proxy/metrics` both show them.

use prometheus::{Counter, Gauge, Registry};

/// Registers a scrape-time gauge `name` at `value` in `registry` (a family a scrape builds
/// afresh); a family already there is left alone.
pub fn gauge(registry: &Registry, name: &str, help: &str, value: f64) {
    if let Ok(g) = Gauge::new(name, help) {
        g.set(value);
        let _ = registry.register(Box::new(g));
    }
}

/// Registers a scrape-time counter `name` at `value` in `registry`, as [`gauge`].
pub fn counter(registry: &Registry, name: &str, help: &str, value: f64) {
    if let Ok(c) = Counter::new(name, help) {
        c.inc_by(value);
        let _ = registry.register(Box::new(c));
    }
}

/// Registers the `process_*` series of the Go client's process collector in `registry`, read
/// from `/proc/self` now. Returns the open and the maximum file descriptors.
pub fn register_families(registry: &Registry) -> (f64, f64) {
    let Ok(stat) = std::fs::read_to_string("/proc/self/stat") else {
        return (0.0, 0.0);
    };
    // Fields after the command name (which may hold spaces) start after the last ')'.
    let Some(rest) = stat.rsplit_once(')').map(|(_, rest)| rest) else {
        return (0.0, 0.0);
    };
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let field = |i: usize| {
        fields
            .get(i)
            .and_then(|v| v.parse::<f64>().ok())
            .unwrap_or(0.0)
    };
    // Field numbers of proc(5), less the two before ')': utime 14, stime 15, starttime 22,
    // vsize 23, rss 24.
    let ticks = 100.0;
    let page = 4096.0;
    counter(
        registry,
        "process_cpu_seconds_total",
        "Total user and system CPU time spent in seconds.",
        (field(11) + field(12)) / ticks,
    );
    gauge(
        registry,
        "process_virtual_memory_bytes",
        "Virtual memory size in bytes.",
        field(20),
    );
    gauge(
        registry,
        "process_resident_memory_bytes",
        "Resident memory size in bytes.",
        field(21) * page,
    );
    let boot = std::fs::read_to_string("/proc/stat")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("btime "))
                .and_then(|v| v.trim().parse::<f64>().ok())
        })
        .unwrap_or(0.0);
    gauge(
        registry,
        "process_start_time_seconds",
        "Start time of the process since unix epoch in seconds.",
        boot + field(19) / ticks,
    );
    let open_fds = std::fs::read_dir("/proc/self/fd")
        .map(|d| d.count())
        .unwrap_or(0);
    gauge(
        registry,
        "process_open_fds",
        "Number of open file descriptors.",
        open_fds as f64,
    );
    let limits = std::fs::read_to_string("/proc/self/limits").unwrap_or_default();
    // The soft limit of a row of proc(5)'s limits table; "unlimited" is RLIM_INFINITY.
    let soft_limit = |row: &str| {
        limits
            .lines()
            .find_map(|l| l.strip_prefix(row))
            .and_then(|rest| rest.split_whitespace().next())
            .map(|v| {
                if v == "unlimited" {
                    u64::MAX as f64
                } else {
                    v.parse::<f64>().unwrap_or(0.0)
                }
            })
            .unwrap_or(0.0)
    };
    let max_fds = soft_limit("Max open files");
    gauge(
        registry,
        "process_max_fds",
        "Maximum number of open file descriptors.",
        max_fds,
    );
    gauge(
        registry,
        "process_virtual_memory_max_bytes",
        "Maximum amount of virtual memory available in bytes.",
        soft_limit("Max address space"),
    );
    (open_fds as f64, max_fds)
}
