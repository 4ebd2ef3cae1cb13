//! `bench kube` at a tiny scale against a real member, etcd 3.4 from Debian and ours: the run
//! must finish clean, and what it reports and leaves behind must be kube-apiserver's: nodes and
//! pods under their `/registry/` keys, events attached to a lease, the compactor's
//! `compact_rev_key`, a watch that saw an event for every acknowledged write with `prev_kv`, and
//! progress answers.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result, ensure};
use etcd_client::{Client, GetOptions};
use etcdrs_testkit::{EtcdBin, Member, MemberOpts};
use serde_json::Value;

/// Our `etcd` binary, built beside `bench` when the workspace's binaries are built.
fn ours() -> PathBuf {
    Path::new(env!("CARGO_BIN_EXE_bench")).with_file_name("etcd")
}

/// Keys under `prefix`, with their leases.
async fn keys(client: &mut Client, prefix: &str) -> Result<Vec<(String, i64)>> {
    let resp = client
        .get(
            prefix,
            Some(GetOptions::new().with_prefix().with_keys_only()),
        )
        .await?;
    Ok(resp
        .kvs()
        .iter()
        .map(|kv| (String::from_utf8_lossy(kv.key()).into_owned(), kv.lease()))
        .collect())
}

fn num(report: &Value, key: &str) -> u64 {
    report[key].as_u64().unwrap_or(0)
}

async fn kube_runs_clean(bin: &EtcdBin) -> Result<()> {
    let member = Member::start(MemberOpts::new(bin)).await?;
    let endpoint = member.endpoint();
    let out = tokio::process::Command::new(env!("CARGO_BIN_EXE_bench"))
        .args(["--endpoints", endpoint.as_str(), "--output", "json"])
        .args(["--clients", "4", "--conns", "2", "--duration", "4"])
        .args(["kube", "--nodes", "5", "--pods-per-node", "4"])
        .args([
            "--namespaces",
            "3",
            "--node-rate",
            "20",
            "--pod-update-rate",
            "10",
        ])
        .args([
            "--pod-churn-rate",
            "5",
            "--event-rate",
            "10",
            "--get-rate",
            "5",
        ])
        .args(["--list-interval", "0.5", "--progress-interval", "0.5"])
        .args(["--count-interval", "1", "--keys-only-interval", "1"])
        .args(["--compact-interval", "1"])
        .output()
        .await
        .context("running bench kube")?;
    let stdout = String::from_utf8_lossy(&out.stdout);
    ensure!(
        out.status.success(),
        "bench kube failed: {stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let report: Value =
        serde_json::from_str(stdout.trim()).with_context(|| format!("report {stdout}"))?;

    ensure!(report["workload"] == "kube", "{report}");
    ensure!(
        num(&report, "populated") == 25,
        "5 nodes and 20 pods: {report}"
    );
    ensure!(num(&report, "errors") == 0, "no errors: {report}");
    ensure!(
        num(&report, "writes") > 20,
        "writes went on for 4 s: {report}"
    );
    let ops = &report["ops"];
    for op in [
        "node-update",
        "pod-update",
        "pod-delete",
        "pod-create",
        "event-create",
        "lease-grant",
        "get",
        "list-pods",
        "list-nodes",
        "list-page",
        "count",
        "keys-only",
        "current-rev",
        "compact-txn",
        "compact",
        "progress",
    ] {
        ensure!(
            ops[op]["count"].as_u64().unwrap_or(0) > 0,
            "{op} happened: {report}"
        );
    }
    // Every acknowledged write came back as an event, with its previous value where it had one.
    ensure!(num(&report, "watch_missing") == 0, "{report}");
    ensure!(
        num(&report, "watch_events") >= num(&report, "watch_expected")
            && num(&report, "watch_expected") == num(&report, "writes"),
        "{report}"
    );
    ensure!(
        num(&report, "watch_prev_kv") == num(&report, "watch_prev_kv_expected")
            && num(&report, "watch_prev_kv") > 0,
        "{report}"
    );
    ensure!(num(&report, "watch_deletes") > 0, "{report}");
    // A watcher's progress notification (an empty response with its own id) comes only every
    // `--experimental-watch-progress-notify-interval` (etcd's ten minutes), so none here, from
    // either server (ours took the default 0 as 100 ms until this test found it).
    ensure!(num(&report, "watch_progress_notify") == 0, "{report}");

    // What the run left: kube-apiserver's key layout.
    let mut client = Client::connect([endpoint.as_str()], None).await?;
    let nodes = keys(&mut client, "/registry/minions/").await?;
    ensure!(nodes.len() == 5, "{nodes:?}");
    for (i, (key, _)) in nodes.iter().enumerate() {
        ensure!(*key == format!("/registry/minions/node-{i:05}"), "{key}");
    }
    let pods = keys(&mut client, "/registry/pods/").await?;
    // Churn replaces a pod by another of the same slot: always 20 live ones.
    ensure!(pods.len() == 20, "{pods:?}");
    for (key, _) in &pods {
        let rest = key.strip_prefix("/registry/pods/").context("pod prefix")?;
        let (ns, name) = rest.split_once('/').context("namespace/name")?;
        ensure!(ns.starts_with("ns-") && name.starts_with("pod-"), "{key}");
    }
    let events = keys(&mut client, "/registry/events/").await?;
    ensure!(!events.is_empty(), "events were created");
    ensure!(
        events.iter().all(|(_, lease)| *lease != 0),
        "every event has a lease: {events:?}"
    );
    let compact = client.get("compact_rev_key", None).await?;
    let kv = compact.kvs().first().context("compact_rev_key exists")?;
    ensure!(kv.version() >= 2, "the compactor won at least twice");
    Ok(())
}

#[tokio::test]
async fn kube_runs_clean_against_etcd34() -> Result<()> {
    kube_runs_clean(&EtcdBin::at("/usr/bin/etcd")).await
}

#[tokio::test]
async fn kube_runs_clean_against_ours() -> Result<()> {
    let bin = EtcdBin::resolve(ours());
    ensure!(
        bin.path().exists(),
        "{} is not built (cargo build --bins)",
        bin.path().display()
    );
    kube_runs_clean(&bin).await
}
