//! The binary under the name `etcdutl` (a symlink or a copy): etcd's offline tool for data
//! files, with its commands, flags, output formats and error texts (etcd 3.5's `etcdutl/`,
//! plus 3.6's `hashkv`):
//!
//! - `snapshot status <file>` and `snapshot restore <file> --data-dir <dir>`: the
//!   `etcd snapshot` commands (`crate::snapshot`), under etcdutl's flags and messages;
//! - `defrag --data-dir <dir>`: the member's backend rewritten to reclaim free space, offline
//!   (ours, redb, under `<data-dir>/[etcd-rs/]member/snap/db`; or etcd's bbolt file of a data
//!   directory etcd-rs has not converted, rewritten compact in etcd's format);
//! - `hashkv <file> [--rev]`: the `HashKV` of a database file (a snapshot, etcd's
//!   `member/snap/db` or ours), as `etcdctl endpoint hashkv` reports it for a member;
//! - `version`.
//!
//! The global `-w/--write-out` takes `simple` (the default), `table`, `json` and `fields`;
//! `protobuf`, which etcdutl lists but supports for no command, is refused as etcdutl refuses
//! it. Exit codes are cobrautl's: 1 for an error, 128 for bad arguments, 4 for an
//! unsupported output format.
//!
//! Where it differs: `snapshot restore --wal-dir` is taken but writes nothing there (the
//! restore writes no WAL; the member started with the same `--wal-dir` creates it); `defrag`
//! and `hashkv` of a running member's backend fail at once on its lock where etcdutl waits.
//! Not here: `backup` and `migrate` (etcd's v2-era data-dir copy and its storage-version
//! rewrite have no counterpart in etcd-rs's layout).

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::{Context, anyhow, bail};
use etcdrs_backend::Backend;
use etcdrs_mvcc::KvStore;
use etcdrs_mvcc::hash::KvHash;
use etcdrs_schema::etcd_db;

use crate::snapshot::{ImageFormat, RestoreArgs, WriteOut};

/// cobrautl's exit codes.
const EXIT_ERROR: u8 = 1;
const EXIT_BAD_FEATURE: u8 = 4;
const EXIT_BAD_ARGS: u8 = 128;

const GLOBAL_FLAGS: &str = "Global Flags:
  -w, --write-out string   set the output format (fields, json, protobuf, simple, table) (default \"simple\")
";

const ROOT_USAGE: &str = "Usage:
  etcdutl [command]

Available Commands:
  defrag      Defragments the storage of the etcd
  hashkv      Prints the KV history hash of a given file
  help        Help about any command
  snapshot    Manages etcd node snapshots
  version     Prints the version of etcdutl

Flags:
  -h, --help               help for etcdutl
  -w, --write-out string   set the output format (fields, json, protobuf, simple, table) (default \"simple\")

Use \"etcdutl [command] --help\" for more information about a command.
";

const SNAPSHOT_USAGE: &str = "Usage:
  etcdutl snapshot [command]

Available Commands:
  restore     Restores an etcd member snapshot to an etcd directory
  status      Gets backend snapshot status of a given file

Flags:
  -h, --help   help for snapshot

Use \"etcdutl snapshot [command] --help\" for more information about a command.
";

const STATUS_USAGE: &str = "Usage:
  etcdutl snapshot status <filename> [flags]

Flags:
  -h, --help   help for status
";

const RESTORE_USAGE: &str = "Usage:
  etcdutl snapshot restore <filename> --data-dir {output dir} [options] [flags]

Flags:
      --data-dir string                      Path to the output data directory
  -h, --help                                 help for restore
      --initial-advertise-peer-urls string   List of this member's peer URLs to advertise to the rest of the cluster (default \"http://localhost:2380\")
      --initial-cluster string               Initial cluster configuration for restore bootstrap (default \"default=http://localhost:2380\")
      --initial-cluster-token string         Initial cluster token for the etcd cluster during restore bootstrap (default \"etcd-cluster\")
      --name string                          Human-readable name for this member (default \"default\")
      --skip-hash-check                      Ignore snapshot integrity hash value (required if copied from data directory)
      --wal-dir string                       Path to the WAL directory (use --data-dir if none given)
";

const DEFRAG_USAGE: &str = "Usage:
  etcdutl defrag [flags]

Flags:
      --data-dir string   Required. Defragments a data directory not in use by etcd.
  -h, --help              help for defrag
";

const HASHKV_USAGE: &str = "Usage:
  etcdutl hashkv <filename> [flags]

Flags:
  -h, --help      help for hashkv
      --rev int   maximum revision to hash (default: latest revision)
";

const VERSION_USAGE: &str = "Usage:
  etcdutl version [flags]

Flags:
  -h, --help   help for version
";

/// A command's usage with the global flags after it, as cobra prints it.
fn usage(text: &str) -> String {
    if text == ROOT_USAGE {
        return text.to_owned();
    }
    match text.split_once("\n\nUse ") {
        Some((head, tail)) => format!("{head}\n\n{GLOBAL_FLAGS}\nUse {tail}"),
        None => format!("{text}\n{GLOBAL_FLAGS}"),
    }
}

/// The command line, scanned as pflag scans it: flags anywhere, `--name=value`,
/// `--name value`, `-w value`, `-wvalue`, a boolean flag alone meaning true, `--` ending the
/// flags.
#[derive(Debug, Default)]
struct Line {
    /// The words that are not flags: the command path, then its arguments.
    words: Vec<String>,
    /// Flags other than the global ones, by long name, in order.
    flags: Vec<(String, String)>,
    write_out: Option<String>,
    help: bool,
}

/// Flags that take no value.
const BOOL_FLAGS: [&str; 1] = ["skip-hash-check"];

fn scan(args: &[String]) -> Result<Line, String> {
    let mut line = Line::default();
    let mut i = 0;
    while i < args.len() {
        let arg = &args[i];
        i += 1;
        if arg == "--" {
            line.words.extend(args[i..].iter().cloned());
            break;
        }
        if let Some(body) = arg.strip_prefix("--") {
            let (name, inline) = match body.split_once('=') {
                Some((n, v)) => (n, Some(v.to_owned())),
                None => (body, None),
            };
            if name == "help" {
                line.help = true;
                continue;
            }
            let value = match inline {
                Some(value) => value,
                None if BOOL_FLAGS.contains(&name) => "true".to_owned(),
                None => {
                    let next = args
                        .get(i)
                        .ok_or_else(|| format!("flag needs an argument: --{name}"))?;
                    i += 1;
                    next.clone()
                }
            };
            if name == "write-out" {
                line.write_out = Some(value);
            } else {
                line.flags.push((name.to_owned(), value));
            }
        } else if let Some(shorts) = arg.strip_prefix('-').filter(|s| !s.is_empty()) {
            for (at, c) in shorts.char_indices() {
                match c {
                    'h' => line.help = true,
                    'w' => {
                        let rest = &shorts[at + 1..];
                        let value = if let Some(inline) = rest.strip_prefix('=') {
                            inline.to_owned()
                        } else if !rest.is_empty() {
                            rest.to_owned()
                        } else {
                            let next = args
                                .get(i)
                                .ok_or_else(|| "flag needs an argument: 'w' in -w".to_owned())?;
                            i += 1;
                            next.clone()
                        };
                        line.write_out = Some(value);
                        break;
                    }
                    _ => {
                        return Err(format!(
                            "unknown shorthand flag: '{c}' in -{}",
                            &shorts[at..]
                        ));
                    }
                }
            }
        } else {
            line.words.push(arg.clone());
        }
    }
    Ok(line)
}

/// How a run ends when it does not succeed: what to print to stderr and the exit code.
struct Failure {
    message: String,
    code: u8,
}

impl Failure {
    /// An error of a command's run: `Error: <message>`, exit 1.
    fn error(e: impl std::fmt::Display) -> Failure {
        Failure {
            message: format!("Error: {e}\n"),
            code: EXIT_ERROR,
        }
    }

    /// A flag error as cobra reports it: the error, the command's usage, the error again.
    fn flag(e: &str, usage_text: &str) -> Failure {
        Failure {
            message: format!("Error: {e}\n{}\nError: {e}\n", usage(usage_text)),
            code: EXIT_ERROR,
        }
    }

    /// Wrong positional arguments (cobrautl's `ExitBadArgs`).
    fn bad_args(e: &str) -> Failure {
        Failure {
            message: format!("Error: {e}\n"),
            code: EXIT_BAD_ARGS,
        }
    }
}

/// Run as `etcdutl <args>`.
pub fn main(args: &[String]) -> ExitCode {
    match run(args) {
        Ok(out) => {
            print!("{out}");
            ExitCode::SUCCESS
        }
        Err(failure) => {
            eprint!("{}", failure.message);
            ExitCode::from(failure.code)
        }
    }
}

/// The flags each command takes (besides `-w` and `-h`), each by long name.
fn known_flags(command: &[&str]) -> &'static [&'static str] {
    match command {
        ["snapshot", "restore"] => &[
            "data-dir",
            "wal-dir",
            "name",
            "initial-cluster",
            "initial-cluster-token",
            "initial-advertise-peer-urls",
            "skip-hash-check",
        ],
        ["defrag"] => &["data-dir"],
        ["hashkv"] => &["rev"],
        _ => &[],
    }
}

fn usage_of(command: &[&str]) -> &'static str {
    match command {
        ["snapshot"] => SNAPSHOT_USAGE,
        ["snapshot", "status"] => STATUS_USAGE,
        ["snapshot", "restore"] => RESTORE_USAGE,
        ["defrag"] => DEFRAG_USAGE,
        ["hashkv"] => HASHKV_USAGE,
        ["version"] => VERSION_USAGE,
        _ => ROOT_USAGE,
    }
}

/// The output of a successful run, or how it failed.
fn run(args: &[String]) -> Result<String, Failure> {
    let line = match scan(args) {
        Ok(line) => line,
        Err(e) => {
            // cobra finds the command before it parses the flags: the usage is the
            // command's, named by the words that are not flags.
            let words: Vec<&str> = args
                .iter()
                .map(String::as_str)
                .filter(|a| !a.starts_with('-'))
                .take(2)
                .collect();
            let path = match words.as_slice() {
                ["snapshot", sub @ ("status" | "restore"), ..] => vec!["snapshot", *sub],
                [first, ..] => vec![*first],
                [] => Vec::new(),
            };
            return Err(Failure::flag(&e, usage_of(&path)));
        }
    };
    let words: Vec<&str> = line.words.iter().map(String::as_str).collect();
    // The command path: `snapshot` takes a subcommand, the others are leaves.
    let (command, rest): (Vec<&str>, &[&str]) = match words.as_slice() {
        [] => return Ok(usage(ROOT_USAGE)),
        ["help", rest @ ..] => {
            let path: Vec<&str> = rest.iter().take(2).copied().collect();
            return Ok(usage(usage_of(&path)));
        }
        ["snapshot"] => (vec!["snapshot"], &[]),
        ["snapshot", sub @ ("status" | "restore"), rest @ ..] => (vec!["snapshot", sub], rest),
        // cobra runs `snapshot` with an unknown word as its argument: its usage.
        ["snapshot", ..] => return Ok(usage(SNAPSHOT_USAGE)),
        [leaf @ ("defrag" | "hashkv" | "version"), rest @ ..] => (vec![*leaf], rest),
        [other, ..] => {
            return Err(Failure {
                message: format!(
                    "Error: unknown command \"{other}\" for \"etcdutl\"\nRun 'etcdutl --help' for usage.\nError: unknown command \"{other}\" for \"etcdutl\"\n"
                ),
                code: EXIT_ERROR,
            });
        }
    };
    let usage_text = usage_of(&command);
    if line.help {
        return Ok(usage(usage_text));
    }
    let known = known_flags(&command);
    if let Some((name, _)) = line
        .flags
        .iter()
        .find(|(n, _)| !known.contains(&n.as_str()))
    {
        return Err(Failure::flag(
            &format!("unknown flag: --{name}"),
            usage_text,
        ));
    }
    let flag = |name: &str| {
        line.flags
            .iter()
            .rev()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.clone())
    };
    if command == ["snapshot"] {
        return Ok(usage(SNAPSHOT_USAGE));
    }
    if matches!(command.as_slice(), ["defrag"] | ["snapshot", "restore"])
        && flag("data-dir").is_none()
    {
        return Err(Failure::flag(
            "required flag(s) \"data-dir\" not set",
            usage_text,
        ));
    }
    let write_out = line.write_out.as_deref().unwrap_or("simple");
    let format = match write_out {
        "simple" => WriteOut::Simple,
        "table" => WriteOut::Table,
        "json" => WriteOut::Json,
        "fields" => WriteOut::Fields,
        "protobuf" => {
            // etcdutl makes its printer only in the commands that print.
            if matches!(command.as_slice(), ["snapshot", "status"] | ["hashkv"]) {
                return Err(Failure {
                    message: "Error: protobuf not supported as output format\n".into(),
                    code: EXIT_BAD_FEATURE,
                });
            }
            WriteOut::Simple
        }
        _ => {
            if matches!(command.as_slice(), ["snapshot", "status"] | ["hashkv"]) {
                return Err(Failure {
                    message: "Error: unsupported output format\n".into(),
                    code: EXIT_BAD_FEATURE,
                });
            }
            WriteOut::Simple
        }
    };
    match command.as_slice() {
        ["version"] => Ok(format!(
            "etcdutl version: {}\nAPI version: {}\n",
            etcdrs_schema::version::SERVER_VERSION,
            api_version()
        )),
        ["snapshot", "status"] => {
            let [file] = rest else {
                return Err(Failure::bad_args(
                    "snapshot status requires exactly one argument",
                ));
            };
            let status = crate::snapshot::read_status(Path::new(file)).map_err(Failure::error)?;
            Ok(crate::snapshot::render(&status, format))
        }
        ["snapshot", "restore"] => {
            let [file] = rest else {
                return Err(Failure::bad_args(
                    "snapshot restore requires exactly one argument",
                ));
            };
            let restore = RestoreArgs {
                file: PathBuf::from(file),
                data_dir: flag("data-dir").unwrap_or_default(),
                name: flag("name").unwrap_or_else(|| "default".into()),
                initial_cluster: flag("initial-cluster")
                    .unwrap_or_else(|| "default=http://localhost:2380".into()),
                initial_cluster_token: flag("initial-cluster-token")
                    .unwrap_or_else(|| "etcd-cluster".into()),
                initial_advertise_peer_urls: flag("initial-advertise-peer-urls")
                    .unwrap_or_else(|| "http://localhost:2380".into()),
                skip_hash_check: match flag("skip-hash-check").as_deref() {
                    None | Some("false") => false,
                    Some("true") => true,
                    Some(other) => {
                        return Err(Failure::flag(
                            &format!(
                                "invalid argument \"{other}\" for \"--skip-hash-check\" flag: strconv.ParseBool: parsing \"{other}\": invalid syntax"
                            ),
                            usage_text,
                        ));
                    }
                },
            };
            restore_into_empty(&restore).map_err(Failure::error)?;
            Ok(String::new())
        }
        ["defrag"] => {
            let data_dir = flag("data-dir").unwrap_or_default();
            crate::logging::init("info", &[]);
            defrag(Path::new(&data_dir)).map_err(|e| {
                Failure::error(format!(
                    "Failed to defragment etcd data[{data_dir}] ({e:#})"
                ))
            })?;
            Ok(String::new())
        }
        ["hashkv"] => {
            let [file] = rest else {
                return Err(Failure::flag(
                    &format!("accepts 1 arg(s), received {}", rest.len()),
                    usage_text,
                ));
            };
            let rev = match flag("rev") {
                None => 0,
                Some(text) => text.parse::<i64>().map_err(|_| {
                    Failure::flag(
                        &format!(
                            "invalid argument \"{text}\" for \"--rev\" flag: strconv.ParseInt: parsing \"{text}\": invalid syntax"
                        ),
                        usage_text,
                    )
                })?,
            };
            let hash = hashkv(Path::new(file), rev).map_err(Failure::error)?;
            Ok(render_hashkv(&hash, format))
        }
        _ => Ok(usage(ROOT_USAGE)),
    }
}

/// The API version etcdutl prints beside its own: the server version's major.minor.
fn api_version() -> &'static str {
    let version = etcdrs_schema::version::SERVER_VERSION;
    match version.match_indices('.').nth(1) {
        Some((at, _)) => &version[..at],
        None => version,
    }
}

/// `snapshot restore` as etcdutl runs it: the data directory may exist if it is empty
/// (etcdutl's check), where `etcd snapshot restore` refuses any existing one.
fn restore_into_empty(args: &RestoreArgs) -> anyhow::Result<()> {
    let data_dir = Path::new(&args.data_dir);
    if data_dir.exists() {
        let empty = std::fs::read_dir(data_dir)
            .map(|mut entries| entries.next().is_none())
            .unwrap_or(false);
        if !empty {
            bail!(
                "data-dir {:?} not empty or could not be read",
                args.data_dir
            );
        }
        std::fs::remove_dir(data_dir)
            .with_context(|| format!("remove the empty data-dir {:?}", args.data_dir))?;
    }
    crate::logging::init("info", &[]);
    crate::snapshot::restore(args)
}

/// Defragment the backend of the stopped member whose data directory is `data_dir`.
fn defrag(data_dir: &Path) -> anyhow::Result<()> {
    let metadata =
        std::fs::metadata(data_dir).with_context(|| format!("stat {}", data_dir.display()))?;
    if !metadata.is_dir() {
        bail!("{} is not a directory", data_dir.display());
    }
    let root = etcdrs_schema::layout::storage_root(data_dir);
    let db_path = root.join("member").join("snap").join("db");
    if !db_path.exists() {
        bail!("open {}: no such file or directory", db_path.display());
    }
    let before = file_len(&db_path);
    tracing::info!(path = %db_path.display(), current_db_size_bytes = before, "defragmenting");
    let started = std::time::Instant::now();
    match crate::snapshot::image_format(&db_path)
        .map_err(|_| anyhow!("{}: invalid database", db_path.display()))?
    {
        ImageFormat::Redb => {
            let backend = Backend::open(&db_path)?;
            backend.defragment()?;
        }
        ImageFormat::Bolt => rewrite_bolt(&db_path)?,
    }
    let after = file_len(&db_path);
    tracing::info!(
        path = %db_path.display(),
        current_db_size_bytes_diff = after as i64 - before as i64,
        current_db_size_bytes = after,
        took = ?started.elapsed(),
        "finished defragmenting directory"
    );
    Ok(())
}

fn file_len(path: &Path) -> u64 {
    std::fs::metadata(path).map_or(0, |m| m.len())
}

/// etcd's own defragmentation of its bbolt file: every bucket copied in order into a fresh,
/// compact file, which then takes the old one's place (synced, then renamed, then the
/// directory synced, so a crash leaves one or the other).
fn rewrite_bolt(db_path: &Path) -> anyhow::Result<()> {
    let Some(dir) = db_path.parent() else {
        bail!("no directory for {}", db_path.display());
    };
    let db = etcd_db::Db::open(db_path).map_err(|e| anyhow!("invalid database: {e}"))?;
    let tmp_path = dir.join("db.tmp");
    let file = std::fs::File::create(&tmp_path)
        .with_context(|| format!("create {}", tmp_path.display()))?;
    let result = (|| -> anyhow::Result<()> {
        let (buffered, _) = etcd_db::copy_compact(&db, std::io::BufWriter::new(file))?;
        let file = buffered
            .into_inner()
            .map_err(|e| anyhow!("write {}: {e}", tmp_path.display()))?;
        file.sync_all()
            .with_context(|| format!("sync {}", tmp_path.display()))?;
        Ok(())
    })();
    if let Err(e) = result {
        let _ = std::fs::remove_file(&tmp_path);
        return Err(e);
    }
    drop(db);
    std::fs::rename(&tmp_path, db_path)
        .with_context(|| format!("rename {}", tmp_path.display()))?;
    etcdrs_backend::sync_dir(dir).with_context(|| format!("sync {}", dir.display()))?;
    Ok(())
}

/// `HashKV` of the database file `file` at `rev` (0: its last revision): etcd's bbolt file
/// (a snapshot, with or without its digest, or a member's `member/snap/db`) is read into a
/// scratch backend of ours first; our own backend file is opened where it is.
fn hashkv(file: &Path, rev: i64) -> anyhow::Result<KvHash> {
    if !file.exists() {
        bail!("stat {}: no such file or directory", file.display());
    }
    let scratch = tempfile::Builder::new()
        .prefix("etcdutl-hashkv-")
        .tempdir()
        .context("create a scratch directory")?;
    let backend = match crate::snapshot::image_format(file)? {
        ImageFormat::Bolt => {
            let db = etcd_db::Db::open(file).map_err(|e| anyhow!("invalid database: {e}"))?;
            let backend = Backend::open(&scratch.path().join("db"))?;
            etcd_db::import(&db, &backend)?;
            backend
        }
        ImageFormat::Redb => Backend::open(file).map_err(|e| anyhow!("invalid database: {e}"))?,
    };
    // Leases play no part in the hash; the smallest TTL keeps the lessor from refusing any.
    let store = KvStore::open(backend, 1)?;
    Ok(store.hash_kv(rev)?)
}

/// `hashkv`'s output in etcdutl's printers' formats (`printer_*.go` `DBHashKV`).
fn render_hashkv(hash: &KvHash, write_out: WriteOut) -> String {
    let row = [
        hash.hash.to_string(),
        hash.hash_revision.to_string(),
        hash.compact_revision.to_string(),
    ];
    match write_out {
        WriteOut::Simple => format!("{}\n", row.join(", ")),
        // Go's encoding/json writes a struct's fields in their order, not sorted.
        WriteOut::Json => format!(
            "{{\"hash\":{},\"hashRevision\":{},\"compactRevision\":{}}}\n",
            hash.hash, hash.hash_revision, hash.compact_revision
        ),
        WriteOut::Fields => format!(
            "\"Hash\" : {}\n\"Hash revision\" : {}\n\"Compact revision\" : {}\n",
            hash.hash, hash.hash_revision, hash.compact_revision
        ),
        WriteOut::Table => {
            crate::snapshot::table(&["HASH", "HASH REVISION", "COMPACT REVISION"], &row)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(line: &[&str]) -> Vec<String> {
        line.iter().map(|s| s.to_string()).collect()
    }

    fn fails(line: &[&str]) -> (String, u8) {
        match run(&args(line)) {
            Ok(out) => panic!("{line:?} succeeded: {out}"),
            Err(f) => (f.message, f.code),
        }
    }

    #[test]
    fn flags_scan_as_pflag_scans_them() {
        let line = scan(&args(&[
            "-wjson",
            "snapshot",
            "--data-dir=x",
            "restore",
            "--name",
            "n",
            "--skip-hash-check",
            "f.db",
        ]))
        .unwrap();
        assert_eq!(line.words, args(&["snapshot", "restore", "f.db"]));
        assert_eq!(line.write_out.as_deref(), Some("json"));
        assert_eq!(
            line.flags,
            vec![
                ("data-dir".into(), "x".into()),
                ("name".into(), "n".into()),
                ("skip-hash-check".into(), "true".into())
            ]
        );
        assert_eq!(
            scan(&args(&["-w"])).unwrap_err(),
            "flag needs an argument: 'w' in -w"
        );
        assert_eq!(
            scan(&args(&["-x"])).unwrap_err(),
            "unknown shorthand flag: 'x' in -x"
        );
    }

    /// The texts and exit codes etcdutl 3.5.1 gave for the same command lines.
    #[test]
    fn errors_as_etcdutl() {
        assert_eq!(
            fails(&["snapshot", "status"]),
            (
                "Error: snapshot status requires exactly one argument\n".into(),
                128
            )
        );
        assert_eq!(
            fails(&["snapshot", "restore", "--data-dir", "x"]),
            (
                "Error: snapshot restore requires exactly one argument\n".into(),
                128
            )
        );
        assert_eq!(
            fails(&["bogus"]),
            (
                "Error: unknown command \"bogus\" for \"etcdutl\"\nRun 'etcdutl --help' for usage.\nError: unknown command \"bogus\" for \"etcdutl\"\n"
                    .into(),
                1
            )
        );
        let (message, code) = fails(&["defrag"]);
        assert_eq!(code, 1);
        assert!(
            message.starts_with(
                "Error: required flag(s) \"data-dir\" not set\nUsage:\n  etcdutl defrag [flags]\n"
            ),
            "{message}"
        );
        assert!(message.ends_with("\nError: required flag(s) \"data-dir\" not set\n"));
        let (message, _) = fails(&["snapshot", "status", "--bogus", "f"]);
        assert!(
            message.starts_with("Error: unknown flag: --bogus\n"),
            "{message}"
        );
        assert_eq!(
            fails(&["-w", "bogus", "snapshot", "status", "f"]),
            ("Error: unsupported output format\n".into(), 4)
        );
        assert_eq!(
            fails(&["snapshot", "status", "f", "-w", "protobuf"]),
            ("Error: protobuf not supported as output format\n".into(), 4)
        );
        let (message, code) = fails(&["defrag", "--data-dir", "/nonexistent/etcdutl"]);
        assert_eq!(code, 1);
        assert!(
            message.starts_with("Error: Failed to defragment etcd data[/nonexistent/etcdutl] ("),
            "{message}"
        );
    }

    #[test]
    fn version_and_usage() {
        assert_eq!(
            run(&args(&["version"])).ok().unwrap(),
            format!(
                "etcdutl version: {}\nAPI version: 3.5\n",
                etcdrs_schema::version::SERVER_VERSION
            )
        );
        let snapshot = run(&args(&["snapshot"])).ok().unwrap();
        assert!(snapshot.starts_with("Usage:\n  etcdutl snapshot [command]\n"));
        assert!(snapshot.ends_with(
            "\n\nGlobal Flags:\n  -w, --write-out string   set the output format (fields, json, protobuf, simple, table) (default \"simple\")\n\nUse \"etcdutl snapshot [command] --help\" for more information about a command.\n"
        ));
        assert_eq!(run(&args(&[])).ok().unwrap(), ROOT_USAGE);
    }

    #[test]
    fn hashkv_prints_as_etcdutl() {
        let hash = KvHash {
            hash: 1_084_519_789,
            hash_revision: 1,
            current_revision: 1,
            compact_revision: -1,
        };
        assert_eq!(
            render_hashkv(&hash, WriteOut::Simple),
            "1084519789, 1, -1\n"
        );
        assert_eq!(
            render_hashkv(&hash, WriteOut::Json),
            "{\"hash\":1084519789,\"hashRevision\":1,\"compactRevision\":-1}\n"
        );
        assert_eq!(
            render_hashkv(&hash, WriteOut::Fields),
            "\"Hash\" : 1084519789\n\"Hash revision\" : 1\n\"Compact revision\" : -1\n"
        );
        assert_eq!(
            render_hashkv(&hash, WriteOut::Table),
            "+------------+---------------+------------------+\n\
             |    HASH    | HASH REVISION | COMPACT REVISION |\n\
             +------------+---------------+------------------+\n\
             | 1084519789 |             1 |               -1 |\n\
             +------------+---------------+------------------+\n"
        );
    }
}
