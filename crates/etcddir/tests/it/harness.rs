//! What these tests need on top of `etcdrs-testkit`: a real etcd 3.4 (`/usr/bin/etcd`,
//! Debian's) named `m1`, the ids it reports, and copies of its data directory. Members are
//! stopped with SIGTERM ([`Member::stop`]) so that they leave their data directory as they
//! would in production.

use std::path::Path;
use std::time::Duration;

use etcdrs_testkit::{EtcdBin, Member, MemberOpts};

const ETCD: &str = "/usr/bin/etcd";

/// How long etcd may take to become ready.
const READY_TIMEOUT: Duration = Duration::from_secs(60);

/// Starts a single member `m1` of etcd 3.4 with extra `settings` (`(flag, value)`, e.g.
/// `("snapshot-count", "50")`) and waits until HTTP `/health` answers true (in etcd 3.4 that
/// probe is a v2 `QGET` through raft, so the WAL holds at least one).
pub async fn start_etcd(settings: &[(&str, &str)]) -> Member {
    let mut opts = MemberOpts::new(&EtcdBin::at(ETCD))
        .name("m1")
        .require_health()
        .ready_timeout(READY_TIMEOUT);
    for &(flag, value) in settings {
        opts = opts.setting(flag, value);
    }
    Member::start(opts).await.expect("start etcd 3.4")
}

/// `etcdctl <args> -w json` against `member`, parsed.
pub async fn ctl_json(member: &Member, args: &[&str]) -> serde_json::Value {
    let mut args = args.to_vec();
    args.extend(["-w", "json"]);
    let out = member.etcdctl().ok(&args).await;
    serde_json::from_str(&out).expect("etcdctl prints JSON")
}

/// What etcdctl reported about the member before it stopped.
pub struct Reported {
    pub member_id: u64,
    pub cluster_id: u64,
}

/// `endpoint status` and `member list`, cross-checked.
pub async fn reported_ids(member: &Member) -> Reported {
    let status = ctl_json(member, &["endpoint", "status"]).await;
    let header = &status[0]["Status"]["header"];
    let member_id = header["member_id"].as_u64().expect("member_id");
    let cluster_id = header["cluster_id"].as_u64().expect("cluster_id");
    let members = ctl_json(member, &["member", "list"]).await;
    assert_eq!(members["header"]["cluster_id"].as_u64(), Some(cluster_id));
    assert_eq!(members["members"][0]["ID"].as_u64(), Some(member_id));
    Reported {
        member_id,
        cluster_id,
    }
}

/// Copies a directory tree (the data directory, for tests that damage a copy).
pub fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).expect("create the copy");
    for dir_entry in std::fs::read_dir(from).expect("list") {
        let dir_entry = dir_entry.expect("entry");
        let target = to.join(dir_entry.file_name());
        if dir_entry.file_type().expect("type").is_dir() {
            copy_dir(&dir_entry.path(), &target);
        } else {
            std::fs::copy(dir_entry.path(), &target).expect("copy");
        }
    }
}
