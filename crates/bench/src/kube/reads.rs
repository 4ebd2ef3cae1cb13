//! The readers beside the writers in `bench kube`: paginated LISTs pinned to page one's
//! revision, count-only and keys-only ranges, current-revision reads followed by a progress
//! request, and kube-apiserver's compaction loop.

use std::sync::atomic::Ordering;
use std::time::Duration;

use etcdrs_proto::etcdserverpb::compare::{CompareResult, CompareTarget, TargetUnion};
use etcdrs_proto::etcdserverpb::response_op::Response;
use etcdrs_proto::etcdserverpb::{
    CompactionRequest, CompactionResponse, Compare, RangeRequest, TxnRequest,
};
use etcdrs_proto::keys::prefix_end;
use tokio::time::Instant;

use super::objects::{Kv, call, get_op, put_op};
use super::report::Stats;
use super::watch::{ProgressSent, SharedSender};
use super::writes::locked;
use super::{COMPACT_REV_KEY, EVENTS, NODES, PODS};
use crate::cli::KubeOpts;
use crate::driver::STOP;

/// The name a whole LIST of `prefix` is timed under.
pub(super) fn list_name(prefix: &str) -> &'static str {
    match prefix {
        NODES => "list-nodes",
        PODS => "list-pods",
        _ => "list-events",
    }
}

/// A paginated LIST of `prefix`: page one at the current revision, the others pinned to it and
/// starting after the last key read; every page timed as `list-page`, the whole as
/// [`list_name`]. Returns page one's revision.
pub(super) async fn list(
    kv: &mut Kv,
    prefix: &str,
    page_size: i64,
    stats: &mut Stats,
) -> Option<i64> {
    let started = Instant::now();
    let end = prefix_end(prefix.as_bytes());
    let mut key = prefix.as_bytes().to_vec();
    let mut revision = 0;
    loop {
        let req = RangeRequest {
            key: key.clone(),
            range_end: end.clone(),
            limit: page_size,
            revision,
            ..Default::default()
        };
        let page_started = Instant::now();
        let resp = match kv.range(&req).await {
            Ok(resp) => resp,
            Err(e) => {
                stats.error(list_name(prefix), &e);
                return None;
            }
        };
        stats.ok("list-page", page_started);
        if revision == 0 {
            revision = resp.header.as_ref().map_or(0, |h| h.revision);
        }
        stats.listed_keys += resp.kvs.len() as u64;
        match resp.kvs.last() {
            Some(last) if resp.more => {
                key = last.key.clone();
                key.push(0);
            }
            _ => break,
        }
    }
    stats.ok(list_name(prefix), started);
    Some(revision)
}

/// Sleeps until `at` or the end of the run; whether the run goes on.
pub(super) async fn wait_until(at: Instant, end: Instant) -> bool {
    tokio::time::sleep_until(at.min(end)).await;
    running(end)
}

pub(super) fn running(end: Instant) -> bool {
    !STOP.load(Ordering::Relaxed) && Instant::now() < end
}

/// LISTs of all pods and all nodes in turn, one every `--list-interval` at most.
pub(super) async fn list_loop(
    mut kv: Kv,
    interval: Duration,
    page_size: i64,
    end: Instant,
) -> Stats {
    let mut stats = Stats::default();
    let mut next = Instant::now() + interval;
    for turn in 0u64.. {
        if !wait_until(next, end).await {
            break;
        }
        next = Instant::now().max(next) + interval;
        let prefix = if turn % 2 == 0 { PODS } else { NODES };
        list(&mut kv, prefix, page_size, &mut stats).await;
    }
    stats
}

/// Count-only and keys-only ranges per resource, and current-revision reads, each followed by
/// a progress request on the watch stream.
pub(super) async fn metadata_loop(
    mut kv: Kv,
    opts: KubeOpts,
    sender: SharedSender,
    progress_sent: ProgressSent,
    end: Instant,
) -> Stats {
    let mut stats = Stats::default();
    let start = Instant::now();
    let mut next_count = start + opts.count_interval;
    let mut next_keys = start + opts.keys_only_interval;
    let mut next_progress = start + opts.progress_interval;
    loop {
        let at = next_count.min(next_keys).min(next_progress);
        if !wait_until(at, end).await {
            break;
        }
        let now = Instant::now();
        if now >= next_count {
            next_count = now + opts.count_interval;
            for prefix in [NODES, PODS, EVENTS] {
                let req = RangeRequest {
                    key: prefix.as_bytes().to_vec(),
                    range_end: prefix_end(prefix.as_bytes()),
                    count_only: true,
                    ..Default::default()
                };
                timed_range(&mut kv, &req, "count", &mut stats).await;
            }
        }
        if now >= next_keys {
            next_keys = now + opts.keys_only_interval;
            for prefix in [NODES, PODS, EVENTS] {
                let req = RangeRequest {
                    key: prefix.as_bytes().to_vec(),
                    range_end: prefix_end(prefix.as_bytes()),
                    keys_only: true,
                    ..Default::default()
                };
                timed_range(&mut kv, &req, "keys-only", &mut stats).await;
            }
        }
        if now >= next_progress {
            next_progress = now + opts.progress_interval;
            let req = RangeRequest {
                key: PODS.as_bytes().to_vec(),
                range_end: prefix_end(PODS.as_bytes()),
                limit: 1,
                ..Default::default()
            };
            if timed_range(&mut kv, &req, "current-rev", &mut stats).await {
                *locked(&progress_sent) = Some(Instant::now());
                if let Err(e) = sender.lock().await.request_progress().await {
                    stats.error("progress", &e.to_string());
                }
            }
        }
    }
    stats
}

pub(super) async fn timed_range(
    kv: &mut Kv,
    req: &RangeRequest,
    name: &'static str,
    stats: &mut Stats,
) -> bool {
    let started = Instant::now();
    match kv.range(req).await {
        Ok(_) => {
            stats.ok(name, started);
            true
        }
        Err(e) => {
            stats.error(name, &e);
            false
        }
    }
}

/// kube-apiserver's compactor: every interval, `Txn If(version(compact_rev_key) == t) Then
/// Put(compact_rev_key, rev) Else Get(compact_rev_key)`; the winner compacts the revision it
/// saw one interval earlier (never on its first turn).
pub(super) async fn compact_loop(mut kv: Kv, interval: Duration, end: Instant) -> Stats {
    let mut stats = Stats::default();
    let mut compact_time = 0i64;
    let mut rev = 0i64;
    let mut next = Instant::now() + interval;
    while wait_until(next, end).await {
        next += interval;
        let req = TxnRequest {
            compare: vec![Compare {
                result: CompareResult::Equal as i32,
                target: CompareTarget::Version as i32,
                key: COMPACT_REV_KEY.to_vec(),
                range_end: Vec::new(),
                target_union: Some(TargetUnion::Version(compact_time)),
            }],
            success: vec![put_op(COMPACT_REV_KEY, rev.to_string().into_bytes(), 0)],
            failure: vec![get_op(COMPACT_REV_KEY)],
        };
        let started = Instant::now();
        let resp = match kv.txn(&req).await {
            Ok(resp) => resp,
            Err(e) => {
                stats.error("compact-txn", &e);
                continue;
            }
        };
        let current_rev = resp.header.as_ref().map_or(0, |h| h.revision);
        if !resp.succeeded {
            stats.conflict("compact-txn", started);
            let version = resp.responses.first().and_then(|op| match &op.response {
                Some(Response::ResponseRange(range)) => range.kvs.first().map(|kv| kv.version),
                _ => None,
            });
            compact_time = version.unwrap_or(compact_time);
            rev = current_rev;
            continue;
        }
        stats.ok("compact-txn", started);
        compact_time += 1;
        let previous = std::mem::replace(&mut rev, current_rev);
        if previous == 0 {
            continue;
        }
        let started = Instant::now();
        let req = CompactionRequest {
            revision: previous,
            physical: false,
        };
        match call::<_, CompactionResponse>(&mut kv.compact, &req, kv.timeout).await {
            Ok(_) => stats.ok("compact", started),
            Err(e) => stats.error("compact", &e),
        }
    }
    stats
}
