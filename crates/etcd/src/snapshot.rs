//! `etcd snapshot restore` and `etcd snapshot status`: etcd's `etcdutl snapshot` (3.5) for
//! snapshots saved with `etcdctl snapshot save` from etcd or from etcd-rs: etcd's bbolt
//! database with a SHA-256 trailer, read through `etcdrs_schema::etcd_db` into our backend.
//! Images of etcd-rs before it wrote etcd's format (a redb database, see `etcdrs_backend`'s
//! `snapshot` module) are still read.
//!
//! # Restore
//!
//! etcd's restore writes the database and a new WAL. Ours writes only the database,
//! `<data-dir>/member/snap/db`, and leaves the WAL to the server: a member that finds no WAL
//! bootstraps a new cluster from its `--initial-cluster` flags (`EtcdServer::start`). So the
//! restored database is made to look like one that never saw raft:
//!
//! - `meta`: `consistent_index`, `term` and `confState` are removed, so that the new log's
//!   entries (from index 1) are applied rather than skipped as already seen; `memberID` and
//!   `clusterID` are removed (bootstrap writes the new ones);
//! - the `members` and `members_removed` buckets are emptied: the old cluster's membership
//!   does not carry over (bootstrap adds the new members through the log).
//!
//! Keys, their revisions, the compaction mark, leases and alarms are kept, as etcd keeps them.
//! Start the member with the same `--name`, `--initial-cluster`, `--initial-cluster-token` and
//! `--initial-advertise-peer-urls` as given here; restore prints the ids they lead to.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::{Context, anyhow, bail};
use clap::{Parser, Subcommand, ValueEnum};
use etcdrs_backend::{Backend, Bucket, HashCheck};
use etcdrs_mvcc::hash::DbStatus;
use etcdrs_mvcc::{META_CONF_STATE, META_CONSISTENT_INDEX, META_TERM};
use etcdrs_schema::keys::{META_CLUSTER_ID, META_MEMBER_ID};
use etcdrs_schema::{etcd_db, membership};
use etcdrs_server::url_string;

#[derive(Debug, Parser)]
#[command(
    name = "etcd snapshot",
    about = "Manages etcd node snapshots",
    disable_version_flag = true
)]
struct SnapshotArgs {
    #[command(subcommand)]
    command: SnapshotCommand,
}

#[derive(Debug, Subcommand)]
enum SnapshotCommand {
    /// Restores an etcd member snapshot to an etcd directory
    Restore(RestoreArgs),
    /// Gets backend snapshot status of a given file
    Status(StatusArgs),
}

#[derive(Debug, clap::Args)]
pub(crate) struct RestoreArgs {
    /// The snapshot file (as written by `etcdctl snapshot save`).
    pub(crate) file: PathBuf,
    /// Path to the output data directory
    #[arg(long = "data-dir", default_value = "")]
    pub(crate) data_dir: String,
    /// Human-readable name for this member
    #[arg(long, default_value = "default")]
    pub(crate) name: String,
    /// Initial cluster configuration for restore bootstrap
    #[arg(
        long = "initial-cluster",
        default_value = "default=http://localhost:2380"
    )]
    pub(crate) initial_cluster: String,
    /// Initial cluster token for the etcd cluster during restore bootstrap
    #[arg(long = "initial-cluster-token", default_value = "etcd-cluster")]
    pub(crate) initial_cluster_token: String,
    /// List of this member's peer URLs to advertise to the rest of the cluster
    #[arg(
        long = "initial-advertise-peer-urls",
        default_value = "http://localhost:2380"
    )]
    pub(crate) initial_advertise_peer_urls: String,
    /// Ignore snapshot integrity hash value (required if copied from data directory)
    #[arg(long = "skip-hash-check")]
    pub(crate) skip_hash_check: bool,
}

#[derive(Debug, clap::Args)]
struct StatusArgs {
    /// The snapshot file.
    file: PathBuf,
    /// Set the output format (fields, json, simple, table)
    #[arg(short = 'w', long = "write-out", value_enum, default_value = "simple")]
    write_out: WriteOut,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub(crate) enum WriteOut {
    Simple,
    Table,
    Json,
    Fields,
}

/// Run `etcd snapshot <args>`; errors are printed as etcdutl prints them (`Error: ...`).
pub fn main(args: &[String]) -> ExitCode {
    // As cobra (etcdutl), a subcommand's flags may stand before its name: move the name first.
    let no_value = |name: &str| matches!(name, "skip-hash-check");
    let args = match crate::config::pflag::split_subcommand(args, no_value) {
        Some((command, rest)) => std::iter::once(command).chain(rest).collect(),
        None => args.to_vec(),
    };
    let argv = std::iter::once("etcd snapshot".to_string()).chain(args);
    let parsed = match SnapshotArgs::try_parse_from(argv) {
        Ok(parsed) => parsed,
        Err(e) => {
            let _ = e.print();
            return if e.use_stderr() {
                ExitCode::FAILURE
            } else {
                ExitCode::SUCCESS
            };
        }
    };
    let result = match parsed.command {
        SnapshotCommand::Restore(restore_args) => {
            crate::logging::init("info", &[]);
            restore(&restore_args)
        }
        SnapshotCommand::Status(status_args) => status(&status_args),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("Error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

/// One `--initial-cluster` member: its name and peer URLs as etcd prints them.
type ClusterMember = (String, Vec<String>);

/// Parse `name=url,name=url` into members in name order.
fn parse_initial_cluster(spec: &str) -> anyhow::Result<Vec<ClusterMember>> {
    let mut members: Vec<ClusterMember> = Vec::new();
    for entry in spec.split(',').filter(|e| !e.is_empty()) {
        let Some((name, raw_url)) = entry.split_once('=') else {
            bail!("failed to parse initial cluster entry {entry:?}");
        };
        let url = parse_url(raw_url)?;
        match members.iter_mut().find(|(n, _)| n == name) {
            Some((_, urls)) => urls.push(url),
            None => members.push((name.to_string(), vec![url])),
        }
    }
    members.sort();
    Ok(members)
}

fn parse_url(raw: &str) -> anyhow::Result<String> {
    let url = url::Url::parse(raw.trim()).with_context(|| format!("invalid URL {raw:?}"))?;
    Ok(url_string(&url))
}

/// Check the flags as etcd's `VerifyBootstrap` does; returns this member's id and the
/// cluster id the server's bootstrap will compute from the same flags.
fn cluster_ids(args: &RestoreArgs) -> anyhow::Result<(u64, u64)> {
    let members = parse_initial_cluster(&args.initial_cluster)?;
    let mut advertised = Vec::new();
    for raw in args
        .initial_advertise_peer_urls
        .split(',')
        .filter(|u| !u.is_empty())
    {
        advertised.push(parse_url(raw)?);
    }
    let Some((_, local_urls)) = members.iter().find(|(name, _)| *name == args.name) else {
        bail!(
            "couldn't find local name {:?} in the initial cluster configuration",
            args.name
        );
    };
    let (mut local_sorted, mut advertised_sorted) = (local_urls.clone(), advertised.clone());
    local_sorted.sort();
    advertised_sorted.sort();
    if local_sorted != advertised_sorted {
        bail!(
            "--initial-cluster has {}={} but missing from --initial-advertise-peer-urls={} (resolved urls: {:?} != {:?})",
            args.name,
            local_urls.join(","),
            advertised.join(","),
            advertised_sorted,
            local_sorted
        );
    }
    let ids: Vec<u64> = members
        .iter()
        .map(|(_, urls)| membership::member_id(urls, &args.initial_cluster_token))
        .collect();
    let member_id = membership::member_id(local_urls, &args.initial_cluster_token);
    Ok((member_id, membership::cluster_id(&ids)))
}

pub(crate) fn restore(args: &RestoreArgs) -> anyhow::Result<()> {
    let (member_id, cluster_id) = cluster_ids(args)?;
    let data_dir = if args.data_dir.is_empty() {
        PathBuf::from(format!("{}.etcd", args.name))
    } else {
        PathBuf::from(&args.data_dir)
    };
    if data_dir.exists() {
        bail!("data-dir {:?} exists", data_dir.display().to_string());
    }
    let snap_dir = data_dir.join("member").join("snap");
    let wal_dir = data_dir.join("member").join("wal");
    tracing::info!(
        path = %args.file.display(),
        wal_dir = %wal_dir.display(),
        data_dir = %data_dir.display(),
        snap_dir = %snap_dir.display(),
        "restoring snapshot"
    );
    let result = write_db(args, &snap_dir.join("db"));
    if result.is_err() {
        // Leave nothing half-restored behind: the next attempt would refuse the data dir.
        let _ = std::fs::remove_dir_all(&data_dir);
    }
    result?;
    tracing::info!(
        path = %args.file.display(),
        wal_dir = %wal_dir.display(),
        data_dir = %data_dir.display(),
        snap_dir = %snap_dir.display(),
        local_member_id = %membership::id_hex(member_id),
        cluster_id = %membership::id_hex(cluster_id),
        "restored snapshot"
    );
    Ok(())
}

/// Write the database out of the image and reset its raft bookkeeping (module docs).
fn write_db(args: &RestoreArgs, db_path: &Path) -> anyhow::Result<()> {
    let check = if args.skip_hash_check {
        HashCheck::Skip
    } else {
        HashCheck::Verify
    };
    let Some(snap_dir) = db_path.parent() else {
        bail!("no directory for {}", db_path.display());
    };
    // The image's database, checked against its digest, beside where ours goes.
    let copy = snap_dir.join("db.restoring");
    etcdrs_backend::restore_image(&args.file, &copy, check)?;
    let backend = match image_format(&copy)? {
        ImageFormat::Bolt => {
            let db = etcd_db::Db::open(&copy).map_err(|e| anyhow!("invalid database: {e}"))?;
            let backend = Backend::open(db_path).context("create the database")?;
            let imported = etcd_db::import(&db, &backend)?;
            tracing::info!(
                revisions = imported.revisions,
                leases = imported.leases,
                "converted etcd's database into etcd-rs's backend"
            );
            drop(db);
            std::fs::remove_file(&copy).context("remove the image copy")?;
            backend
        }
        ImageFormat::Redb => {
            std::fs::rename(&copy, db_path).context("move the database into place")?;
            // The new name must survive a power cut as the file's contents do.
            etcdrs_backend::sync_dir(snap_dir).context("sync the snap directory")?;
            Backend::open(db_path).context("open restored database")?
        }
    };
    let tx = backend.write()?;
    for key in [
        META_CONSISTENT_INDEX,
        META_TERM,
        META_CONF_STATE,
        META_MEMBER_ID,
        META_CLUSTER_ID,
    ] {
        tx.delete(Bucket::META, key)?;
    }
    tx.clear(Bucket::MEMBERS)?;
    tx.clear(Bucket::MEMBERS_REMOVED)?;
    tx.commit(true)?;
    Ok(())
}

/// What a snapshot image holds.
pub(crate) enum ImageFormat {
    /// etcd's bbolt database, as every snapshot etcd or etcd-rs streams.
    Bolt,
    /// A redb database: what etcd-rs streamed before it wrote etcd's format.
    Redb,
}

/// Tell the image's database format by its first page (bbolt's meta page, or redb's magic).
pub(crate) fn image_format(path: &Path) -> anyhow::Result<ImageFormat> {
    let mut head = [0u8; 32];
    let mut file = std::fs::File::open(path).with_context(|| format!("open {}", path.display()))?;
    let read = std::io::Read::read(&mut file, &mut head).context("read the snapshot")?;
    if read >= 4 && head[..4] == *b"redb" {
        return Ok(ImageFormat::Redb);
    }
    if read >= 20 && u32::from_le_bytes([head[16], head[17], head[18], head[19]]) == BOLT_MAGIC {
        return Ok(ImageFormat::Bolt);
    }
    bail!("invalid database")
}

/// bbolt's magic number, in its meta pages.
const BOLT_MAGIC: u32 = 0xED0C_DAED;

/// What `status` prints, as etcd's `snapshot.Status`.
pub(crate) struct Status {
    db: DbStatus,
    total_size: u64,
}

fn status(args: &StatusArgs) -> anyhow::Result<()> {
    print!("{}", render(&read_status(&args.file)?, args.write_out));
    Ok(())
}

/// The status of the snapshot `file` (etcd's `snapshot.Status`).
pub(crate) fn read_status(file: &Path) -> anyhow::Result<Status> {
    if !file.exists() {
        bail!("stat {}: no such file or directory", file.display());
    }
    // The image is not itself a redb file (it may end with a digest): read a copy.
    let scratch = tempfile::Builder::new()
        .prefix("etcd-snapshot-status-")
        .tempdir()
        .context("create a scratch directory")?;
    let status = match image_format(file)? {
        // bbolt ignores what follows its last page (the digest): read the file in place.
        ImageFormat::Bolt => {
            let db = etcd_db::Db::open(file).map_err(|e| anyhow!("invalid database: {e}"))?;
            Status {
                db: etcd_db::status(&db)?,
                total_size: db.size(),
            }
        }
        ImageFormat::Redb => {
            let db_path = scratch.path().join("db");
            let total_size = etcdrs_backend::restore_image(file, &db_path, HashCheck::Skip)?;
            let backend = Backend::open(&db_path).map_err(|e| anyhow!("invalid database: {e}"))?;
            Status {
                db: etcdrs_mvcc::hash::db_status(&backend)?,
                total_size,
            }
        }
    };
    Ok(status)
}

/// The status in etcdctl's printers' formats (`printer_*.go` `DBStatus`).
pub(crate) fn render(status: &Status, write_out: WriteOut) -> String {
    let row = [
        format!("{:x}", status.db.hash),
        status.db.revision.to_string(),
        status.db.total_key.to_string(),
        humanize_bytes(status.total_size),
    ];
    match write_out {
        WriteOut::Simple => format!("{}\n", row.join(", ")),
        WriteOut::Json => format!(
            "{}\n",
            serde_json::json!({
                "hash": status.db.hash,
                "revision": status.db.revision,
                "totalKey": status.db.total_key,
                "totalSize": status.total_size,
            })
        ),
        WriteOut::Fields => format!(
            "\"Hash\" : {}\n\"Revision\" : {}\n\"Keys\" : {}\n\"Size\" : {}\n",
            status.db.hash, status.db.revision, status.db.total_key, status.total_size
        ),
        WriteOut::Table => table(&["HASH", "REVISION", "TOTAL KEYS", "TOTAL SIZE"], &row),
    }
}

/// A one-row table as `olekukonko/tablewriter` draws it for etcdctl: centred headers, cells
/// aligned right.
pub(crate) fn table(header: &[&str], row: &[String]) -> String {
    let widths: Vec<usize> = header
        .iter()
        .zip(row)
        .map(|(h, c)| h.len().max(c.len()))
        .collect();
    let rule = {
        let cells: Vec<String> = widths.iter().map(|w| "-".repeat(w + 2)).collect();
        format!("+{}+\n", cells.join("+"))
    };
    let header_cells: Vec<String> = header
        .iter()
        .zip(&widths)
        .map(|(h, &w)| {
            let gap = w - h.len();
            let left = gap / 2;
            format!(" {}{}{} ", " ".repeat(left), h, " ".repeat(gap - left))
        })
        .collect();
    let row_cells: Vec<String> = row
        .iter()
        .zip(&widths)
        .map(|(c, &w)| format!(" {c:>w$} "))
        .collect();
    format!(
        "{rule}|{}|\n{rule}|{}|\n{rule}",
        header_cells.join("|"),
        row_cells.join("|")
    )
}

/// `humanize.Bytes`: SI units, one decimal below 10.
fn humanize_bytes(bytes: u64) -> String {
    const UNITS: [&str; 7] = ["B", "kB", "MB", "GB", "TB", "PB", "EB"];
    if bytes < 10 {
        return format!("{bytes} B");
    }
    let value = bytes as f64;
    let exponent = (value.ln() / 1000f64.ln()).floor();
    let scaled = value / 1000f64.powf(exponent);
    let rounded = (scaled * 10.0 + 0.5).floor() / 10.0;
    let unit = UNITS[(exponent as usize).min(UNITS.len() - 1)];
    if rounded < 10.0 {
        format!("{rounded:.1} {unit}")
    } else {
        format!("{rounded:.0} {unit}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn restore_args(extra: &[&str]) -> RestoreArgs {
        let argv = ["etcd snapshot", "restore", "x.db"]
            .into_iter()
            .chain(extra.iter().copied());
        match SnapshotArgs::try_parse_from(argv).unwrap().command {
            SnapshotCommand::Restore(args) => args,
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn status_prints_as_etcdctl() {
        // The values etcdctl 3.4 printed for a snapshot of a fresh etcd with two keys.
        let status = Status {
            db: DbStatus {
                hash: 0x138a_e433,
                revision: 3,
                total_key: 6,
            },
            total_size: 20480,
        };
        assert_eq!(render(&status, WriteOut::Simple), "138ae433, 3, 6, 20 kB\n");
        assert_eq!(
            render(&status, WriteOut::Json),
            "{\"hash\":327869491,\"revision\":3,\"totalKey\":6,\"totalSize\":20480}\n"
        );
        assert_eq!(
            render(&status, WriteOut::Fields),
            "\"Hash\" : 327869491\n\"Revision\" : 3\n\"Keys\" : 6\n\"Size\" : 20480\n"
        );
        assert_eq!(
            render(&status, WriteOut::Table),
            "+----------+----------+------------+------------+\n\
             |   HASH   | REVISION | TOTAL KEYS | TOTAL SIZE |\n\
             +----------+----------+------------+------------+\n\
             | 138ae433 |        3 |          6 |      20 kB |\n\
             +----------+----------+------------+------------+\n"
        );
    }

    #[test]
    fn humanize_like_go_humanize() {
        for (bytes, text) in [
            (0, "0 B"),
            (9, "9 B"),
            (10, "10 B"),
            (999, "999 B"),
            (1000, "1.0 kB"),
            (20480, "20 kB"),
            (73760, "74 kB"),
            (143_360, "143 kB"),
            (2_147_483_648, "2.1 GB"),
        ] {
            assert_eq!(humanize_bytes(bytes), text, "{bytes}");
        }
    }

    #[test]
    fn restore_flags_are_checked_like_etcd() {
        let args = restore_args(&[]);
        assert_eq!(args.name, "default");
        assert!(!args.skip_hash_check);
        cluster_ids(&args).unwrap();

        let args = restore_args(&[
            "--name",
            "m1",
            "--initial-cluster",
            "m1=http://127.0.0.1:2380",
            "--initial-advertise-peer-urls=http://127.0.0.1:2380",
            "--initial-cluster-token",
            "tok",
            "--data-dir",
            "/x",
            "--skip-hash-check",
        ]);
        assert!(args.skip_hash_check);
        let (member, cluster) = cluster_ids(&args).unwrap();
        let urls = vec!["http://127.0.0.1:2380".to_string()];
        assert_eq!(member, membership::member_id(&urls, "tok"));
        assert_eq!(cluster, membership::cluster_id(&[member]));

        let err = cluster_ids(&restore_args(&["--name", "nope"])).unwrap_err();
        assert_eq!(
            err.to_string(),
            "couldn't find local name \"nope\" in the initial cluster configuration"
        );
        let err = cluster_ids(&restore_args(&[
            "--initial-advertise-peer-urls",
            "http://10.0.0.1:2380",
        ]))
        .unwrap_err();
        assert!(err.to_string().starts_with("--initial-cluster has default=http://localhost:2380 but missing from --initial-advertise-peer-urls=http://10.0.0.1:2380"), "{err}");
    }
}
