//! Reads of large results, for the scale rows of `scripts/bench-compare`: whole key ranges
//! read by concurrent readers, in pages pinned to the first page's revision (kube-apiserver's
//! paginated LIST) or as one unpaginated range, and a watch catching up on past events. Each
//! prints one JSON object. `--duration` caps either (a scan stops after the page that ends
//! past it, a catch-up at it) and the object then says `"stopped": true`: a slow server's
//! step at a scale that would take hours ends with what it did by then.

use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use etcd_client::{GetOptions, WatchOptions};
use serde_json::{Value, json};

use crate::cli::{CatchupOpts, GlobalOpts, ScanOpts};

/// Reads the range `--clients` times at once; reports keys and bytes read and the time the
/// slowest reader took.
pub async fn scan(global: &GlobalOpts, opts: &ScanOpts) -> Result<Value> {
    let clients = crate::driver::clients(global).await?;
    let started = Instant::now();
    let deadline = cap(global.duration, started);
    let readers: Vec<_> = clients
        .into_iter()
        .map(|client| {
            let opts = opts.clone();
            tokio::spawn(async move { read_range(client, &opts, deadline).await })
        })
        .collect();
    let mut keys = 0u64;
    let mut bytes = 0u64;
    let mut stopped = false;
    for reader in readers {
        let (k, b, s) = reader.await.context("a reader")??;
        keys += k;
        bytes += b;
        stopped |= s;
    }
    let secs = started.elapsed().as_secs_f64();
    Ok(json!({
        "workload": "scan",
        "readers": global.clients,
        "keys": keys,
        "bytes": bytes,
        "duration_s": (secs * 1e3).round() / 1e3,
        "keys_per_sec": (keys as f64 / secs).round(),
        "stopped": stopped,
    }))
}

/// The instant `--duration` ends, if given.
fn cap(duration: Option<Duration>, started: Instant) -> Option<tokio::time::Instant> {
    duration.map(|d| tokio::time::Instant::from_std(started + d))
}

/// One reader's whole range (or as much as it read by `deadline`): (keys, bytes of keys and
/// values, whether the deadline stopped it).
async fn read_range(
    client: etcd_client::Client,
    opts: &ScanOpts,
    deadline: Option<tokio::time::Instant>,
) -> Result<(u64, u64, bool)> {
    let mut kv = client.kv_client().max_decoding_message_size(usize::MAX);
    let end = if opts.range_end.is_empty() {
        vec![0]
    } else {
        opts.range_end.clone().into_bytes()
    };
    // etcd's "every key": from `\0` to `\0`.
    let mut key = if opts.key.is_empty() {
        vec![0]
    } else {
        opts.key.clone().into_bytes()
    };
    let (mut keys, mut bytes) = (0u64, 0u64);
    let mut revision = 0;
    loop {
        let remaining = if opts.limit > 0 {
            opts.limit - keys as i64
        } else {
            i64::MAX
        };
        let page = match opts.page_size {
            0 => opts.limit,
            n => n.min(remaining),
        };
        let mut get = GetOptions::new().with_range(end.clone()).with_limit(page);
        if revision > 0 {
            get = get.with_revision(revision);
        }
        let resp = kv.get(key.clone(), Some(get)).await?;
        if revision == 0 {
            revision = resp.header().map_or(0, |h| h.revision());
        }
        for kv in resp.kvs() {
            bytes += (kv.key().len() + kv.value().len()) as u64;
        }
        keys += resp.kvs().len() as u64;
        let Some(last) = resp.kvs().last() else { break };
        if opts.page_size == 0 || !resp.more() || (opts.limit > 0 && keys as i64 >= opts.limit) {
            break;
        }
        if deadline.is_some_and(|d| tokio::time::Instant::now() >= d) {
            return Ok((keys, bytes, true));
        }
        key = last.key().to_vec();
        key.push(0);
    }
    Ok((keys, bytes, false))
}

/// Watches `--prefix` from `--rev` until `--events` events arrived.
pub async fn catchup(global: &GlobalOpts, opts: &CatchupOpts) -> Result<Value> {
    let client = crate::driver::connect(global, 1)
        .await?
        .pop()
        .context("a connection")?;
    let mut watch = client.watch_client().max_decoding_message_size(usize::MAX);
    let started = Instant::now();
    let mut options = WatchOptions::new().with_start_revision(opts.rev);
    if opts.prefix.is_empty() {
        options = options.with_from_key();
    } else {
        options = options.with_prefix();
    }
    let key = if opts.prefix.is_empty() {
        vec![0]
    } else {
        opts.prefix.clone().into_bytes()
    };
    let mut stream = watch.watch(key, Some(options)).await?;
    let deadline = cap(global.duration, started);
    let mut events = 0u64;
    let mut stopped = false;
    while events < opts.events {
        let next = match deadline {
            Some(d) => match tokio::time::timeout_at(d, stream.message()).await {
                Ok(next) => next?,
                Err(_) => {
                    stopped = true;
                    break;
                }
            },
            None => stream.message().await?,
        };
        let Some(resp) = next else {
            bail!("the watch ended after {events} events");
        };
        if resp.canceled() {
            bail!(
                "the watch was canceled after {events} events: {}",
                resp.cancel_reason()
            );
        }
        events += resp.events().len() as u64;
    }
    let secs = started.elapsed().as_secs_f64();
    Ok(json!({
        "workload": "catchup",
        "events": events,
        "duration_s": (secs * 1e3).round() / 1e3,
        "events_per_sec": (events as f64 / secs).round(),
        "stopped": stopped,
    }))
}
