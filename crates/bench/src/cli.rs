//! The command line: etcd's `benchmark` flags, parsed with clap.

use std::time::Duration;

use clap::{Args, Parser, Subcommand, ValueEnum};

/// Requests per workload when neither `--total` nor `--duration` is given (etcd's default).
pub const DEFAULT_TOTAL: u64 = 10_000;

#[derive(Debug, Parser)]
#[command(
    name = "bench",
    version,
    about = "A load generator for etcd v3 endpoints (etcd's tools/benchmark)"
)]
pub struct Cli {
    #[command(flatten)]
    pub global: GlobalOpts,
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Clone, Args)]
pub struct GlobalOpts {
    /// gRPC endpoints, comma separated (host:port or http://host:port)
    #[arg(
        long,
        global = true,
        value_delimiter = ',',
        default_value = "127.0.0.1:2379"
    )]
    pub endpoints: Vec<String>,
    /// Total number of concurrent clients (each issues one request at a time)
    #[arg(long, global = true, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..))]
    pub clients: u32,
    /// Total number of gRPC connections; clients share them round-robin
    #[arg(long, global = true, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..))]
    pub conns: u32,
    /// Total number of requests (default 10000 unless --duration is given)
    #[arg(long, global = true, value_parser = clap::value_parser!(u64).range(1..))]
    pub total: Option<u64>,
    /// Run for this many seconds (with --total too, whichever ends first)
    #[arg(long, global = true, value_parser = positive_secs)]
    pub duration: Option<Duration>,
    /// Report format
    #[arg(long, global = true, value_enum, default_value_t = Output::Text)]
    pub output: Output,
    /// Seconds one request may take before it counts as an error
    #[arg(long, global = true, default_value = "30", value_parser = positive_secs)]
    pub request_timeout: Duration,
    /// Threads the load generator runs on (0: one per core); 1 keeps it on one core, off
    /// the target's others, and spares it cross-thread wake-ups
    #[arg(long, global = true, default_value_t = 0)]
    pub threads: usize,
    /// Seconds to wait for a connection to be established
    #[arg(long, global = true, default_value = "5", value_parser = positive_secs)]
    pub dial_timeout: Duration,
}

impl GlobalOpts {
    /// The request budget: `--total` and/or `--duration`, or etcd's default total.
    pub fn budget(&self) -> Budget {
        let total = match (self.total, self.duration) {
            (None, None) => Some(DEFAULT_TOTAL),
            (total, _) => total,
        };
        Budget {
            total,
            duration: self.duration,
        }
    }
}

/// How much work a run may do; at least one bound is always set.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Budget {
    pub total: Option<u64>,
    pub duration: Option<Duration>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Output {
    Text,
    Json,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Benchmark put
    Put(PutOpts),
    /// Benchmark range
    Range(RangeOpts),
    /// Benchmark txn with puts
    TxnPut(TxnPutOpts),
    /// Benchmark watch: watchers on a few keys, puts on them, event delivery latency
    Watch(WatchOpts),
    /// Benchmark the latency from a put to its watch event on every client
    WatchLatency(WatchLatencyOpts),
    /// Benchmark lease keep-alive round trips
    LeaseKeepalive(LeaseKeepaliveOpts),
    /// Read a whole key range with `--clients` concurrent readers: in pages at one pinned
    /// revision (kube-apiserver's LIST), or as one range (`--page-size 0`); `--duration` caps it
    Scan(ScanOpts),
    /// Watch from a past revision and time the catch-up over `--events` events (`--duration`
    /// caps it)
    Catchup(CatchupOpts),
    /// Time `--rounds` paginated LISTs of one prefix (kube-apiserver's: pages pinned to page
    /// one's revision) on one connection, after filling it with `--fill` large values
    List(ListOpts),
    /// kube-apiserver's traffic: nodes and pods created, then heartbeats, pod churn, events
    /// with leases, paginated LISTs, count and keys-only ranges, one watch stream with progress
    /// requests and the compaction loop, for `--duration` seconds (default 60)
    Kube(KubeOpts),
}

#[derive(Debug, Clone, Args)]
pub struct PutOpts {
    /// Key size of put request
    #[arg(long, default_value_t = 8)]
    pub key_size: usize,
    /// Value size of put request
    #[arg(long, default_value_t = 8)]
    pub val_size: usize,
    /// Maximum possible keys
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u64).range(1..))]
    pub key_space_size: u64,
    /// Use sequential keys (request i writes key i mod key-space-size)
    #[arg(long)]
    pub sequential_keys: bool,
    /// Maximum puts per second (0 is no limit)
    #[arg(long, default_value_t = 0)]
    pub rate: u64,
}

#[derive(Debug, Clone, Args)]
pub struct RangeOpts {
    /// Key to range over
    pub key: String,
    /// End of the range (exclusive)
    #[arg(conflicts_with = "prefix")]
    pub end: Option<String>,
    /// Linearizable (l) or serializable (s)
    #[arg(long, value_enum, default_value_t = Consistency::Linearizable)]
    pub consistency: Consistency,
    /// Range over every key with the prefix <key>
    #[arg(long)]
    pub prefix: bool,
    /// Maximum range requests per second (0 is no limit)
    #[arg(long, default_value_t = 0)]
    pub rate: u64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Consistency {
    #[value(name = "l")]
    Linearizable,
    #[value(name = "s")]
    Serializable,
}

#[derive(Debug, Clone, Args)]
pub struct TxnPutOpts {
    /// Key size of txn put
    #[arg(long, default_value_t = 8)]
    pub key_size: usize,
    /// Value size of txn put
    #[arg(long, default_value_t = 8)]
    pub val_size: usize,
    /// Number of puts per txn
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u64).range(1..))]
    pub txn_ops: u64,
    /// Maximum possible keys (txn i writes keys (i*txn-ops + j) mod key-space-size)
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u64).range(1..))]
    pub key_space_size: u64,
    /// Maximum txns per second (0 is no limit)
    #[arg(long, default_value_t = 0)]
    pub rate: u64,
}

#[derive(Debug, Clone, Args)]
pub struct WatchOpts {
    /// Total watch streams (spread round-robin over the clients)
    #[arg(long, default_value_t = 10, value_parser = clap::value_parser!(u64).range(1..))]
    pub streams: u64,
    /// Total watchers per stream
    #[arg(long, default_value_t = 100, value_parser = clap::value_parser!(u64).range(1..))]
    pub watch_per_stream: u64,
    /// Total number of keys to be watched
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u64).range(1..))]
    pub watched_key_total: u64,
    /// Number of put requests (instead of the global --total; --duration bounds the put phase)
    #[arg(long, default_value_t = 1000, value_parser = clap::value_parser!(u64).range(1..))]
    pub put_total: u64,
    /// Number of keys to put per second (0 is no limit)
    #[arg(long, default_value_t = 0)]
    pub put_rate: u64,
    /// Key size of watch request
    #[arg(long, default_value_t = 32)]
    pub key_size: usize,
    /// Maximum possible keys
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u64).range(1..))]
    pub key_space_size: u64,
    /// Use sequential keys
    #[arg(long)]
    pub sequential_keys: bool,
    /// Watchers ask for each event's previous key-value (`prev_kv`), as kube-apiserver's do
    #[arg(long)]
    pub prev_kv: bool,
    /// Once every watcher is created, print `watchers created` on stderr and hold them idle
    /// this many seconds before the puts (for reading the server's memory per watcher)
    #[arg(long, value_parser = positive_secs)]
    pub hold: Option<Duration>,
}

#[derive(Debug, Clone, Args)]
pub struct WatchLatencyOpts {
    /// Number of keys to put per second (0 is no limit)
    #[arg(long, default_value_t = 100)]
    pub put_rate: u64,
    /// Key size of watch response
    #[arg(long, default_value_t = 32)]
    pub key_size: usize,
    /// Value size of watch response (at least 8: the value carries the put's issue time)
    #[arg(long, default_value_t = 32)]
    pub val_size: usize,
}

#[derive(Debug, Clone, Args)]
pub struct ScanOpts {
    /// First key of the range (all keys from it with `--range-end` empty)
    #[arg(long, default_value = "")]
    pub key: String,
    /// End of the range (exclusive); empty: every key from `--key`
    #[arg(long, default_value = "")]
    pub range_end: String,
    /// Keys per page; 0 reads the range in one request of at most `--limit` keys
    #[arg(long, default_value_t = 10_000)]
    pub page_size: i64,
    /// Most keys read in all (0: every key)
    #[arg(long, default_value_t = 0)]
    pub limit: i64,
}

#[derive(Debug, Clone, Args)]
pub struct ListOpts {
    /// Prefix listed (and filled)
    #[arg(long, default_value = "/registry/minions/")]
    pub prefix: String,
    /// Keys put under the prefix before the LISTs (`<prefix>node-NNNNN`), `--clients` at a time
    #[arg(long, default_value_t = 0)]
    pub fill: u64,
    /// Smallest value filled, in bytes
    #[arg(long, default_value_t = 6 * 1024)]
    pub value_min: usize,
    /// Largest value filled, in bytes
    #[arg(long, default_value_t = 10 * 1024)]
    pub value_max: usize,
    /// LISTs, one after the other
    #[arg(long, default_value_t = 200)]
    pub rounds: u64,
    /// Keys per page
    #[arg(long, default_value_t = 500, value_parser = clap::value_parser!(i64).range(1..))]
    pub page_size: i64,
    /// Puts per second on filled keys while the LISTs run (0: none)
    #[arg(long, default_value_t = 0.0)]
    pub put_rate: f64,
    /// Read every page serializable (no read index): not what kube-apiserver sends, but it
    /// tells the time a page waits for its read index from the time it is read and sent
    #[arg(long)]
    pub serializable: bool,
}

#[derive(Debug, Clone, Args)]
pub struct CatchupOpts {
    /// Key prefix watched
    #[arg(long, default_value = "")]
    pub prefix: String,
    /// Revision the watch starts from
    #[arg(long)]
    pub rev: i64,
    /// Events to receive before stopping
    #[arg(long)]
    pub events: u64,
}

/// The rates of `bench kube` default to what one real cluster's apiserver sent at 5,000 nodes,
/// scaled by `--nodes / 5000` and by `--rate-scale`; a rate given explicitly is only scaled by
/// `--rate-scale`.
#[derive(Debug, Clone, Args)]
pub struct KubeOpts {
    /// Nodes (`/registry/minions/<name>`), created before the run
    #[arg(long, default_value_t = 100, value_parser = clap::value_parser!(u64).range(1..))]
    pub nodes: u64,
    /// Pods per node (`/registry/pods/<namespace>/<name>`), created before the run
    #[arg(long, default_value_t = 30)]
    pub pods_per_node: u64,
    /// Namespaces the pods and events are spread over
    #[arg(long, default_value_t = 100, value_parser = clap::value_parser!(u64).range(1..))]
    pub namespaces: u64,
    /// Node status updates per second (default 158 at 5,000 nodes)
    #[arg(long)]
    pub node_rate: Option<f64>,
    /// Pod updates per second (default 66 at 5,000 nodes)
    #[arg(long)]
    pub pod_update_rate: Option<f64>,
    /// Pods deleted and created again per second (default 56 at 5,000 nodes)
    #[arg(long)]
    pub pod_churn_rate: Option<f64>,
    /// Events created per second, each with a lease (default 56 at 5,000 nodes)
    #[arg(long)]
    pub event_rate: Option<f64>,
    /// Gets of one pod per second (default 16 at 5,000 nodes)
    #[arg(long)]
    pub get_rate: Option<f64>,
    /// Multiplies every write and get rate (to look for the highest sustained rate)
    #[arg(long, default_value_t = 1.0)]
    pub rate_scale: f64,
    /// Writers issue their next request as soon as the last is answered, in the rates'
    /// proportions: the highest write rate the target sustains with this mix
    #[arg(long)]
    pub unpaced: bool,
    /// Seconds between two LISTs (of all pods, then all nodes, in turn); a LIST that takes
    /// longer delays the next one
    #[arg(long, default_value = "1", value_parser = positive_secs)]
    pub list_interval: Duration,
    /// Keys per LIST page
    #[arg(long, default_value_t = 500, value_parser = clap::value_parser!(i64).range(1..))]
    pub list_page_size: i64,
    /// Seconds between two rounds of count-only ranges (one per resource)
    #[arg(long, default_value = "60", value_parser = positive_secs)]
    pub count_interval: Duration,
    /// Seconds between two rounds of keys-only ranges (one per resource)
    #[arg(long, default_value = "60", value_parser = positive_secs)]
    pub keys_only_interval: Duration,
    /// Seconds between two current-revision reads, each followed by a progress request on the
    /// watch stream
    #[arg(long, default_value = "1", value_parser = positive_secs)]
    pub progress_interval: Duration,
    /// Seconds between two turns of the compaction loop (kube-apiserver's is 300)
    #[arg(long, default_value = "300", value_parser = positive_secs)]
    pub compact_interval: Duration,
    /// TTL in seconds of events (their lease is granted for this plus 60 s)
    #[arg(long, default_value_t = 3600, value_parser = clap::value_parser!(i64).range(1..))]
    pub event_ttl: i64,
}

#[derive(Debug, Clone, Args)]
pub struct LeaseKeepaliveOpts {
    /// TTL in seconds of the lease each client keeps alive
    #[arg(long, default_value_t = 100, value_parser = clap::value_parser!(i64).range(1..))]
    pub ttl: i64,
}

fn positive_secs(s: &str) -> Result<Duration, String> {
    let secs: f64 = s
        .trim_end_matches('s')
        .parse()
        .map_err(|e| format!("{s:?} is not a number of seconds: {e}"))?;
    if !(secs.is_finite() && secs > 0.0) {
        return Err(format!("{s:?} must be a positive number of seconds"));
    }
    Ok(Duration::from_secs_f64(secs))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(args: &[&str]) -> Cli {
        Cli::try_parse_from(std::iter::once("bench").chain(args.iter().copied()))
            .expect("arguments parse")
    }

    fn parse_err(args: &[&str]) -> clap::Error {
        Cli::try_parse_from(std::iter::once("bench").chain(args.iter().copied()))
            .expect_err("arguments are rejected")
    }

    #[test]
    fn defaults_match_etcd_benchmark() {
        let cli = parse(&["put"]);
        assert_eq!(cli.global.endpoints, vec!["127.0.0.1:2379"]);
        assert_eq!(cli.global.clients, 1);
        assert_eq!(cli.global.conns, 1);
        assert_eq!(cli.global.output, Output::Text);
        assert_eq!(
            cli.global.budget(),
            Budget {
                total: Some(DEFAULT_TOTAL),
                duration: None
            }
        );
        let Command::Put(p) = cli.command else {
            panic!("expected put, got {:?}", cli.command)
        };
        assert_eq!((p.key_size, p.val_size, p.key_space_size), (8, 8, 1));
        assert!(!p.sequential_keys);
        assert_eq!(p.rate, 0);
    }

    #[test]
    fn global_flags_go_before_or_after_the_subcommand() {
        let before = parse(&[
            "--endpoints",
            "a:1,b:2",
            "--clients=100",
            "--conns",
            "10",
            "--total",
            "5",
            "put",
        ]);
        let after = parse(&[
            "put",
            "--endpoints=a:1,b:2",
            "--clients",
            "100",
            "--conns=10",
            "--total=5",
        ]);
        for cli in [before, after] {
            assert_eq!(cli.global.endpoints, vec!["a:1", "b:2"]);
            assert_eq!((cli.global.clients, cli.global.conns), (100, 10));
            assert_eq!(cli.global.budget().total, Some(5));
        }
    }

    #[test]
    fn duration_replaces_the_default_total() {
        let cli = parse(&["--duration", "2.5", "put"]);
        assert_eq!(
            cli.global.budget(),
            Budget {
                total: None,
                duration: Some(Duration::from_millis(2500))
            }
        );
        let both = parse(&["--duration", "3s", "--total", "7", "put"]);
        assert_eq!(
            both.global.budget(),
            Budget {
                total: Some(7),
                duration: Some(Duration::from_secs(3))
            }
        );
    }

    #[test]
    fn rejects_nonsense() {
        parse_err(&["--clients", "0", "put"]);
        parse_err(&["--conns", "0", "put"]);
        parse_err(&["--total", "0", "put"]);
        parse_err(&["--duration", "-1", "put"]);
        parse_err(&["--duration", "abc", "put"]);
        parse_err(&["--output", "yaml", "put"]);
        parse_err(&["put", "--key-space-size", "0"]);
        parse_err(&["range"]);
        parse_err(&["range", "a", "b", "--prefix"]);
        parse_err(&["range", "a", "--consistency", "x"]);
        parse_err(&["txn-put", "--txn-ops", "0"]);
    }

    #[test]
    fn range_arguments() {
        let cli = parse(&[
            "--output",
            "json",
            "range",
            "foo",
            "fop",
            "--consistency",
            "s",
        ]);
        assert_eq!(cli.global.output, Output::Json);
        let Command::Range(r) = cli.command else {
            panic!("expected range")
        };
        assert_eq!(r.key, "foo");
        assert_eq!(r.end.as_deref(), Some("fop"));
        assert_eq!(r.consistency, Consistency::Serializable);
        assert!(!r.prefix);

        let Command::Range(r) = parse(&["range", "foo", "--prefix"]).command else {
            panic!("expected range")
        };
        assert_eq!(r.end, None);
        assert!(r.prefix);
        assert_eq!(r.consistency, Consistency::Linearizable);
    }

    #[test]
    fn other_subcommands() {
        let Command::TxnPut(t) =
            parse(&["txn-put", "--txn-ops", "4", "--key-space-size", "8"]).command
        else {
            panic!("expected txn-put")
        };
        assert_eq!((t.txn_ops, t.key_space_size, t.key_size), (4, 8, 8));

        let Command::Watch(w) = parse(&[
            "watch",
            "--streams",
            "2",
            "--watch-per-stream",
            "3",
            "--put-total",
            "4",
            "--put-rate",
            "5",
        ])
        .command
        else {
            panic!("expected watch")
        };
        assert_eq!(
            (w.streams, w.watch_per_stream, w.put_total, w.put_rate),
            (2, 3, 4, 5)
        );
        assert_eq!(w.watched_key_total, 1);

        let Command::WatchLatency(l) = parse(&["watch-latency"]).command else {
            panic!("expected watch-latency")
        };
        assert_eq!((l.put_rate, l.key_size, l.val_size), (100, 32, 32));

        let Command::Kube(k) = parse(&[
            "kube",
            "--nodes",
            "5",
            "--pods-per-node",
            "2",
            "--compact-interval",
            "2.5",
            "--node-rate",
            "7",
        ])
        .command
        else {
            panic!("expected kube")
        };
        assert_eq!((k.nodes, k.pods_per_node, k.namespaces), (5, 2, 100));
        assert_eq!(k.compact_interval, Duration::from_millis(2500));
        assert_eq!((k.node_rate, k.pod_update_rate), (Some(7.0), None));
        assert_eq!(k.list_page_size, 500);
        parse_err(&["kube", "--nodes", "0"]);
        parse_err(&["kube", "--compact-interval", "0"]);

        let Command::LeaseKeepalive(l) = parse(&["lease-keepalive"]).command else {
            panic!("expected lease-keepalive")
        };
        assert_eq!(l.ttl, 100);
    }
}
