//! Many seeds of the cluster simulation, and the replay of one.
//!
//! `ETCDRS_SIM_SEEDS=N` runs N seeds (from `ETCDRS_SIM_FIRST`, default 0); `ETCDRS_SIM_SEED=S`
//! runs seed S alone, as a failure's report says.

use std::time::Instant;

use etcdrs_sim::{Config, run};

const DEFAULT_SEEDS: u64 = 300;

fn env_u64(name: &str) -> Option<u64> {
    std::env::var(name).ok().and_then(|v| v.trim().parse().ok())
}

#[test]
fn seeds_keep_every_invariant_and_stay_linearizable() {
    let seeds: Vec<u64> = match env_u64("ETCDRS_SIM_SEED") {
        Some(seed) => vec![seed],
        None => {
            let first = env_u64("ETCDRS_SIM_FIRST").unwrap_or(0);
            let n = env_u64("ETCDRS_SIM_SEEDS").unwrap_or(DEFAULT_SEEDS);
            (first..first + n).collect()
        }
    };
    let started = Instant::now();
    let mut longest = None;
    let (mut ops, mut completed, mut unknown, mut crashes, mut partitions) = (0, 0, 0, 0, 0);
    let mut max_term = 0;
    let mut gave_up = 0;
    for &seed in &seeds {
        let report = match run(&Config::from_seed(seed)) {
            Ok(report) => report,
            Err(failure) => panic!("{failure}"),
        };
        ops += report.history;
        completed += report.completed;
        unknown += report.unknown;
        crashes += report.crashes;
        partitions += report.partitions;
        max_term = max_term.max(report.term);
        gave_up += report.checker_gave_up;
        assert!(report.applied > 0, "seed {seed} applied nothing");
        if longest
            .as_ref()
            .is_none_or(|l: &etcdrs_sim::Report| report.history > l.history)
        {
            longest = Some(report);
        }
    }
    let longest = longest.expect("at least one seed ran");
    println!(
        "{} seeds in {:.1?}: {ops} operations ({completed} completed, {unknown} unknown writes), \
         {crashes} crashes, {partitions} partitions, highest term {max_term}, {gave_up} keys \
         beyond the checker's budget",
        seeds.len(),
        started.elapsed()
    );
    println!("longest history: {longest:?}");
    // The runs did what they are for: clients completed operations through the faults.
    assert!(completed > 0);
    assert!(longest.history > 0);
}

#[test]
fn a_seed_replays_exactly() {
    for seed in [1, 2, 77] {
        let config = Config::from_seed(seed);
        let first = run(&config).unwrap_or_else(|f| panic!("{f}"));
        let second = run(&config).unwrap_or_else(|f| panic!("{f}"));
        assert_eq!(first, second, "seed {seed} ran differently twice");
        assert!(first.events > 100);
    }
    // And a different seed runs differently.
    let a = run(&Config::from_seed(3)).unwrap_or_else(|f| panic!("{f}"));
    let b = run(&Config::from_seed(4)).unwrap_or_else(|f| panic!("{f}"));
    assert_ne!(a.trace_hash, b.trace_hash);
}
