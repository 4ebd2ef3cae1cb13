//! Prints a seed's whole event trace: `cargo run -p etcdrs-sim --example trace -- SEED`.

fn main() {
    let seed = std::env::args()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    let (outcome, trace) = etcdrs_sim::run_traced(&etcdrs_sim::Config::from_seed(seed), usize::MAX);
    for line in trace {
        println!("{line}");
    }
    match outcome {
        Ok(report) => println!("{report:?}"),
        Err(failure) => println!("{failure}"),
    }
}
