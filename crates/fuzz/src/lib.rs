//! A seeded, coverage-free mutation fuzzer for the decoders that read untrusted bytes, run as
//! ordinary tests (stable Rust: no libFuzzer, no cargo-fuzz). Dev-only.
//!
//! # What it does
//!
//! [`Fuzz::run`] feeds a decoder first every input of its corpus as it is (the checked-in
//! seeds and regression inputs under `crates/<crate>/fuzz-corpus/<target>/`, plus seeds the
//! test generates from real encoders), then `iterations` mutated inputs. Each mutated input is a
//! function of the run's seed and its iteration number only, so one iteration replays alone.
//! A decoder passes if it returns, whatever it returns: the targets map `Err` to success.
//!
//! A failure is reported with the target, seed, iteration, the input in hex and a file under
//! `<target-dir>/fuzz/<target>/` holding it, ready to be copied into the corpus:
//! - a panic (caught with `catch_unwind`; the test then fails with the report);
//! - a hang: an input that takes longer than [`HANG_LIMIT`] (a watchdog thread reports it and
//!   ends the process);
//! - an allocation beyond [`MEMORY_BUDGET`] (a length field trusted): under nextest, where each
//!   test is its own process, the address space is capped, so such an allocation aborts the
//!   process; the input in flight is then in `<target-dir>/fuzz/<target>/in-flight.bin`.
//!
//! # Knobs (environment, for long local runs)
//!
//! - `ETCDRS_FUZZ_ITERS=<n>`: mutated inputs per target instead of the test's CI count.
//! - `ETCDRS_FUZZ_SEED=<n>|random`: the run's seed (decimal or `0x` hex); the default is fixed
//!   per target name, so CI runs the same inputs each time; `random` picks one and prints it.
//! - `ETCDRS_FUZZ_ITER=<i>`: replay iteration `i` of the seed only.
//! - `ETCDRS_FUZZ_REGEN=1`: write the test's generated seeds into its corpus directory.
//!
//! # What it is not
//!
//! No coverage feedback and no corpus growth: it finds what random damage to valid inputs
//! finds (the shallow panics, trusted lengths and loops), not deep paths.
#![deny(missing_docs)]

mod mutate;
mod rng;

use std::fmt::Write as _;
use std::panic::{self, AssertUnwindSafe};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, mpsc};
use std::time::{Duration, Instant};

pub use rng::Rng;

/// How long one input may take before the run is reported as a hang. Generous: debug builds on
/// a loaded two-core machine; a decoder that loops forever is caught all the same.
pub const HANG_LIMIT: Duration = Duration::from_secs(20);

/// Address space a fuzz test process may grow by, under nextest: any allocation a decoder makes
/// from a length field it did not check against its input is far larger.
pub const MEMORY_BUDGET: u64 = 2 << 30;

/// The environment variable that overrides a target's number of mutated inputs.
pub const ITERS_VAR: &str = "ETCDRS_FUZZ_ITERS";
/// The environment variable that sets the run's seed.
pub const SEED_VAR: &str = "ETCDRS_FUZZ_SEED";
/// The environment variable that replays one iteration.
pub const ITER_VAR: &str = "ETCDRS_FUZZ_ITER";
/// The environment variable that writes generated seeds into the corpus directory.
pub const REGEN_VAR: &str = "ETCDRS_FUZZ_REGEN";

/// Longest input the mutations produce unless a target says otherwise.
const DEFAULT_MAX_LEN: usize = 64 * 1024;

/// Bytes of an input printed in hex in a report (the file has all of it).
const HEX_PRINT_LIMIT: usize = 4096;

/// One fuzz target: a name, a corpus and a number of iterations. See the crate docs.
#[derive(Debug)]
pub struct Fuzz {
    name: String,
    corpus_dir: Option<PathBuf>,
    generated: Vec<(String, Vec<u8>)>,
    dictionary: Vec<Vec<u8>>,
    iterations: u64,
    max_len: usize,
}

impl Fuzz {
    /// A target named `name` (used in reports, file names and the default seed).
    pub fn new(name: &str) -> Fuzz {
        Fuzz {
            name: name.to_string(),
            corpus_dir: None,
            generated: Vec::new(),
            dictionary: Vec::new(),
            iterations: 1000,
            max_len: DEFAULT_MAX_LEN,
        }
    }

    /// Reads every file of `dir` into the corpus (sorted by name). The directory must exist.
    pub fn corpus_dir(mut self, dir: impl Into<PathBuf>) -> Fuzz {
        self.corpus_dir = Some(dir.into());
        self
    }

    /// Adds an input produced by a real encoder. With `ETCDRS_FUZZ_REGEN=1` it is also
    /// written to the corpus directory as `file_name`.
    pub fn input(mut self, file_name: &str, bytes: impl Into<Vec<u8>>) -> Fuzz {
        self.generated.push((file_name.to_string(), bytes.into()));
        self
    }

    /// Tokens the mutations insert or write over the input (JSON punctuation, keywords).
    pub fn dictionary(mut self, tokens: &[&[u8]]) -> Fuzz {
        self.dictionary
            .extend(tokens.iter().map(|token| token.to_vec()));
        self
    }

    /// Mutated inputs per run (CI's count; `ETCDRS_FUZZ_ITERS` overrides it).
    pub fn iterations(mut self, iterations: u64) -> Fuzz {
        self.iterations = iterations;
        self
    }

    /// Longest mutated input.
    pub fn max_len(mut self, max_len: usize) -> Fuzz {
        self.max_len = max_len;
        self
    }

    /// Runs the corpus, then the mutated inputs, through `decode`; panics with a report on the
    /// first input that makes it panic. See the crate docs for hangs and allocations.
    pub fn run(self, mut decode: impl FnMut(&[u8])) {
        let corpus = self.load_corpus();
        let seed = seed_from_env(&self.name);
        let iterations = env_number(ITERS_VAR).unwrap_or(self.iterations);
        let only = env_number(ITER_VAR);
        let out_dir = out_dir(&self.name);
        let started = Instant::now();

        let in_flight = Arc::new(Mutex::new(Vec::new()));
        let in_flight_file = arm_memory_limit().then(|| out_dir.join("in-flight.bin"));
        if let Some(path) = &in_flight_file {
            // Printed first: an allocation over the cap aborts the process with no report,
            // and this line (which nextest shows with the failure) says where the input is.
            eprintln!(
                "fuzz {}: seed {seed:#x}; address space capped, the input in flight is in {}",
                self.name,
                path.display()
            );
        }
        let (progress, watchdog) = start_watchdog(
            self.name.clone(),
            seed,
            out_dir.clone(),
            Arc::clone(&in_flight),
        );
        let mut runner = Runner {
            fuzz: &self,
            seed,
            out_dir: &out_dir,
            in_flight: &in_flight,
            in_flight_file: in_flight_file.as_deref(),
            progress: &progress,
        };

        if only.is_none() {
            for (label, input) in &corpus {
                runner.check(&Label::Corpus(label), input, &mut decode);
            }
        }
        let inputs: Vec<Vec<u8>> = corpus.into_iter().map(|(_, input)| input).collect();
        let range = match only {
            Some(iteration) => iteration..iteration + 1,
            None => 0..iterations,
        };
        for iteration in range {
            let mut rng = Rng::for_iteration(seed, iteration);
            let input = mutate::mutate(&mut rng, &inputs, &self.dictionary, self.max_len);
            runner.check(&Label::Iteration(iteration), &input, &mut decode);
        }
        drop(progress);
        watchdog.join().expect("the watchdog thread does not panic");
        if let Some(path) = &in_flight_file {
            // Best effort: the file only matters while a run is in flight.
            let _ = std::fs::remove_file(path);
        }
        eprintln!(
            "fuzz {}: {} corpus inputs, {} iterations, seed {seed:#x}, {:?}",
            self.name,
            inputs.len(),
            iterations,
            started.elapsed()
        );
    }

    /// The generated inputs and the corpus directory's files, duplicates dropped.
    fn load_corpus(&self) -> Vec<(String, Vec<u8>)> {
        let mut corpus: Vec<(String, Vec<u8>)> = Vec::new();
        if let Some(dir) = &self.corpus_dir {
            if std::env::var_os(REGEN_VAR).is_some() {
                std::fs::create_dir_all(dir).expect("create the corpus directory");
                for (file_name, bytes) in &self.generated {
                    std::fs::write(dir.join(file_name), bytes).expect("write a generated seed");
                }
            }
            let mut paths: Vec<PathBuf> = std::fs::read_dir(dir)
                .unwrap_or_else(|err| panic!("read corpus directory {}: {err}", dir.display()))
                .map(|entry| entry.expect("list the corpus directory").path())
                .filter(|path| path.is_file())
                .collect();
            paths.sort();
            for path in paths {
                let bytes = std::fs::read(&path).expect("read a corpus file");
                let label = path
                    .file_name()
                    .map(|name| name.to_string_lossy().into_owned())
                    .unwrap_or_default();
                corpus.push((label, bytes));
            }
        }
        for (file_name, bytes) in &self.generated {
            corpus.push((format!("{file_name} (generated)"), bytes.clone()));
        }
        let mut seen = std::collections::HashSet::new();
        corpus.retain(|(_, bytes)| seen.insert(bytes.clone()));
        assert!(
            !corpus.is_empty(),
            "fuzz target {} has an empty corpus",
            self.name
        );
        corpus
    }
}

/// Which input a report is about.
enum Label<'a> {
    Corpus(&'a str),
    Iteration(u64),
}

/// The per-run state [`Fuzz::run`] checks each input with.
struct Runner<'a> {
    fuzz: &'a Fuzz,
    seed: u64,
    out_dir: &'a Path,
    in_flight: &'a Mutex<Vec<u8>>,
    in_flight_file: Option<&'a Path>,
    progress: &'a mpsc::Sender<()>,
}

impl Runner<'_> {
    fn check(&mut self, label: &Label<'_>, input: &[u8], decode: &mut impl FnMut(&[u8])) {
        {
            let mut in_flight = self.in_flight.lock().expect("in-flight lock");
            in_flight.clear();
            in_flight.extend_from_slice(input);
        }
        if let Some(path) = self.in_flight_file {
            std::fs::create_dir_all(self.out_dir).expect("create the fuzz output directory");
            std::fs::write(path, input).expect("write the in-flight input");
        }
        let outcome = panic::catch_unwind(AssertUnwindSafe(|| decode(input)));
        // The watchdog only needs to hear of progress; it is gone only after the run.
        let _ = self.progress.send(());
        if let Err(payload) = outcome {
            let message = payload
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| payload.downcast_ref::<&str>().map(|text| text.to_string()))
                .unwrap_or_else(|| "a panic without a message".to_string());
            let what = format!("panicked ({message})");
            let report = report(
                &self.fuzz.name,
                self.seed,
                label,
                &what,
                input,
                self.out_dir,
                self.fuzz.corpus_dir.as_deref(),
            );
            panic!("{report}");
        }
    }
}

/// Writes the input to a file and returns the report text.
fn report(
    name: &str,
    seed: u64,
    label: &Label<'_>,
    what: &str,
    input: &[u8],
    out_dir: &Path,
    corpus_dir: Option<&Path>,
) -> String {
    let (which, file_name, replay) = match label {
        Label::Corpus(file) => (
            format!("corpus input {file}"),
            format!("corpus-{}.bin", file.replace(['/', ' '], "_")),
            String::new(),
        ),
        Label::Iteration(iteration) => (
            format!("iteration {iteration} of seed {seed:#x}"),
            format!("crash-{seed:016x}-{iteration}.bin"),
            format!("\n  replay: {SEED_VAR}={seed:#x} {ITER_VAR}={iteration}"),
        ),
    };
    let path = out_dir.join(file_name);
    let saved = std::fs::create_dir_all(out_dir)
        .and_then(|()| std::fs::write(&path, input))
        .map_or_else(
            |err| format!("could not be saved to {} ({err})", path.display()),
            |()| format!("saved to {}", path.display()),
        );
    let corpus = corpus_dir.map_or_else(String::new, |dir| {
        format!("; add it to {} as a regression input", dir.display())
    });
    let mut hex = String::with_capacity(2 * input.len().min(HEX_PRINT_LIMIT));
    for byte in input.iter().take(HEX_PRINT_LIMIT) {
        let _ = write!(hex, "{byte:02x}");
    }
    if input.len() > HEX_PRINT_LIMIT {
        hex.push_str("... (truncated; the file has all of it)");
    }
    format!(
        "fuzz target {name}: the decoder {what} on {which}{replay}\n  input ({} bytes) {saved}{corpus}\n  hex: {hex}",
        input.len()
    )
}

/// Starts the thread that reports an input taking longer than [`HANG_LIMIT`] and ends the
/// process (a looping decoder cannot be interrupted from outside).
fn start_watchdog(
    name: String,
    seed: u64,
    out_dir: PathBuf,
    in_flight: Arc<Mutex<Vec<u8>>>,
) -> (mpsc::Sender<()>, std::thread::JoinHandle<()>) {
    let (progress, heard) = mpsc::channel::<()>();
    let watchdog = std::thread::Builder::new()
        .name(format!("fuzz-watchdog-{name}"))
        .spawn(move || {
            loop {
                match heard.recv_timeout(HANG_LIMIT) {
                    Ok(()) => {}
                    Err(mpsc::RecvTimeoutError::Disconnected) => return,
                    Err(mpsc::RecvTimeoutError::Timeout) => {
                        let input = in_flight
                            .lock()
                            .map_or_else(|poisoned| poisoned.into_inner().clone(), |g| g.clone());
                        let what = format!("did not return within {HANG_LIMIT:?}");
                        let report = report(
                            &name,
                            seed,
                            &Label::Corpus("in flight (see the seed above)"),
                            &what,
                            &input,
                            &out_dir,
                            None,
                        );
                        eprintln!("{report}");
                        std::process::exit(101);
                    }
                }
            }
        })
        .expect("spawn the fuzz watchdog");
    (progress, watchdog)
}

/// Where targets that must write files should make their scratch directory: a RAM-backed
/// file system when there is one (`/dev/shm`), since some decoders `fsync` what they repair.
pub fn scratch_base() -> PathBuf {
    let shm = Path::new("/dev/shm");
    if shm.is_dir() {
        shm.to_path_buf()
    } else {
        std::env::temp_dir()
    }
}

/// The run's seed: `ETCDRS_FUZZ_SEED`, or a function of the target's name.
fn seed_from_env(name: &str) -> u64 {
    match std::env::var(SEED_VAR) {
        Ok(value) if value == "random" => {
            let nanos = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |elapsed| elapsed.as_nanos() as u64);
            let seed = rng::fnv1a(&nanos.to_le_bytes()) ^ rng::fnv1a(name.as_bytes());
            eprintln!("fuzz {name}: {SEED_VAR}={seed:#x}");
            seed
        }
        Ok(value) => parse_number(&value)
            .unwrap_or_else(|| panic!("{SEED_VAR}={value}: not a number or `random`")),
        Err(_) => rng::fnv1a(name.as_bytes()),
    }
}

fn env_number(var: &str) -> Option<u64> {
    let value = std::env::var(var).ok()?;
    Some(parse_number(&value).unwrap_or_else(|| panic!("{var}={value}: not a number")))
}

fn parse_number(text: &str) -> Option<u64> {
    let text = text.trim();
    match text.strip_prefix("0x") {
        Some(hex) => u64::from_str_radix(hex, 16).ok(),
        None => text.parse().ok(),
    }
}

/// `<target-dir>/fuzz/<name>`: the test binary lives in `<target-dir>/<profile>/deps/`.
fn out_dir(name: &str) -> PathBuf {
    let target = std::env::current_exe().ok().and_then(|exe| {
        let deps = exe.parent()?;
        (deps.file_name()? == "deps").then(|| deps.parent()?.parent().map(Path::to_path_buf))?
    });
    target
        .unwrap_or_else(|| std::env::temp_dir().join("etcdrs"))
        .join("fuzz")
        .join(name)
}

/// Caps the address space at its current size plus [`MEMORY_BUDGET`] when this test has the
/// process to itself (nextest's process-per-test mode); returns whether it did.
fn arm_memory_limit() -> bool {
    use nix::sys::resource::{Resource, getrlimit, setrlimit};
    if std::env::var("NEXTEST_EXECUTION_MODE").as_deref() != Ok("process-per-test") {
        return false;
    }
    let Some(current) = vm_size() else {
        return false;
    };
    let Ok((soft, hard)) = getrlimit(Resource::RLIMIT_AS) else {
        return false;
    };
    let limit = current.saturating_add(MEMORY_BUDGET).min(hard);
    limit < soft && setrlimit(Resource::RLIMIT_AS, limit, hard).is_ok()
}

/// The process's address space size in bytes (`VmSize` of `/proc/self/status`).
fn vm_size() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|line| line.starts_with("VmSize:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_panicking_decoder_fails_with_a_report_that_replays() {
        let outcome = panic::catch_unwind(|| {
            Fuzz::new("self-test")
                .input("seed", b"hello".to_vec())
                .iterations(200)
                .run(|input| assert!(!input.contains(&0xff), "found 0xff"));
        });
        let payload = outcome.expect_err("a decoder that panics on 0xff is caught");
        let report = payload
            .downcast_ref::<String>()
            .expect("the report is a String");
        assert!(report.contains("self-test"), "{report}");
        assert!(report.contains("panicked (found 0xff)"), "{report}");
        assert!(report.contains("hex: "), "{report}");
        let field = |var: &str| {
            report
                .split(&format!("{var}="))
                .nth(1)
                .and_then(|rest| rest.split_whitespace().next())
                .and_then(parse_number)
                .expect("the report names the seed and the iteration")
        };
        let (seed, iteration) = (field(SEED_VAR), field(ITER_VAR));
        let mut rng = Rng::for_iteration(seed, iteration);
        let corpus = vec![b"hello".to_vec()];
        let replayed = mutate::mutate(&mut rng, &corpus, &[], DEFAULT_MAX_LEN);
        assert!(
            replayed.contains(&0xff),
            "the iteration replays to the same input"
        );
    }

    #[test]
    fn a_decoder_that_never_panics_passes() {
        let mut n_inputs = 0;
        Fuzz::new("self-test-ok")
            .input("seed", vec![1, 2, 3])
            .iterations(100)
            .run(|_| n_inputs += 1);
        assert_eq!(n_inputs, 101);
    }
}
