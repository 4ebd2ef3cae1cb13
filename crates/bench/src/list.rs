//! `bench list`: kube-apiserver's paginated LIST of one large resource, timed alone and
//! repeated, so that the LIST row of `bench kube` can be looked at without the rest of the mix.
//!
//! Optionally fills the prefix first (`--fill` keys named `<prefix>node-NNNNN`, values of random
//! bytes with sizes uniform in `--value-min..=--value-max`, as `bench kube`'s nodes), then runs
//! `--rounds` LISTs one after the other on one lean gRPC connection ([`crate::grpc`], the client
//! `bench kube` uses): page one at revision 0, the others pinned to page one's revision and
//! starting after the last key read. `--put-rate` keeps puts of fresh values on keys of the
//! prefix going meanwhile, on a connection of their own. Prints one JSON object: each LIST's
//! and each page's latency (p50, p99, max, in ms) and what was read.

use std::time::Duration;

use anyhow::{Context, Result, bail};
use etcdrs_proto::etcdserverpb::{PutRequest, PutResponse, RangeRequest, RangeResponse};
use etcdrs_proto::keys::prefix_end;
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use serde_json::{Value, json};
use tokio::time::Instant;

use crate::cli::{GlobalOpts, ListOpts};
use crate::grpc::{Conn, KV_PUT, KV_RANGE, Unary};

/// The key of the `i`th filled object.
fn key(prefix: &str, i: u64) -> Vec<u8> {
    format!("{prefix}node-{i:05}").into_bytes()
}

fn value(rng: &mut SmallRng, opts: &ListOpts) -> Vec<u8> {
    let len = rng.random_range(opts.value_min..=opts.value_max.max(opts.value_min));
    let mut v = vec![0u8; len];
    rng.fill(&mut v[..]);
    v
}

async fn call<Req: prost::Message, Resp: prost::Message + Default>(
    unary: &mut Unary,
    req: &Req,
    timeout: Duration,
) -> Result<Resp> {
    match tokio::time::timeout(timeout, unary.call(req)).await {
        Ok(r) => r.map_err(|e| anyhow::anyhow!(e)),
        Err(_) => bail!("request timed out (bench --request-timeout)"),
    }
}

/// Puts `--fill` objects with `--clients` concurrent writers.
async fn fill(global: &GlobalOpts, opts: &ListOpts, endpoint: &str) -> Result<()> {
    let conn = Conn::connect(endpoint, global.dial_timeout).await?;
    let writers = global.clients.max(1) as u64;
    let mut tasks = tokio::task::JoinSet::new();
    for w in 0..writers {
        let mut put = conn.unary(KV_PUT)?;
        let opts = opts.clone();
        let timeout = global.request_timeout;
        tasks.spawn(async move {
            let mut rng = SmallRng::seed_from_u64(w);
            let mut i = w;
            while i < opts.fill {
                let req = PutRequest {
                    key: key(&opts.prefix, i),
                    value: value(&mut rng, &opts).into(),
                    ..Default::default()
                };
                let _: PutResponse = call(&mut put, &req, timeout).await?;
                i += writers;
            }
            anyhow::Ok(())
        });
    }
    while let Some(done) = tasks.join_next().await {
        done.context("a writer")??;
    }
    Ok(())
}

/// One paginated LIST: the page latencies go to `pages`; returns the keys and bytes read.
async fn list_once(
    range: &mut Unary,
    opts: &ListOpts,
    timeout: Duration,
    pages: &mut Vec<Duration>,
) -> Result<(u64, u64)> {
    let end = prefix_end(opts.prefix.as_bytes());
    let mut start = opts.prefix.as_bytes().to_vec();
    let mut revision = 0;
    let (mut keys, mut bytes) = (0u64, 0u64);
    loop {
        let req = RangeRequest {
            key: start.clone(),
            range_end: end.clone(),
            limit: opts.page_size,
            revision,
            serializable: opts.serializable,
            ..Default::default()
        };
        let page_started = Instant::now();
        let resp: RangeResponse = call(range, &req, timeout).await?;
        pages.push(page_started.elapsed());
        if revision == 0 {
            revision = resp.header.as_ref().map_or(0, |h| h.revision);
        }
        keys += resp.kvs.len() as u64;
        bytes += resp
            .kvs
            .iter()
            .map(|kv| (kv.key.len() + kv.value.len()) as u64)
            .sum::<u64>();
        match resp.kvs.last() {
            Some(last) if resp.more => {
                start = last.key.clone();
                start.push(0);
            }
            _ => break,
        }
    }
    Ok((keys, bytes))
}

/// p50, p99 and max of `samples` in milliseconds.
fn percentiles(samples: &mut [Duration]) -> Value {
    samples.sort_unstable();
    let at = |q: f64| {
        let i = ((samples.len() as f64 * q).ceil() as usize).clamp(1, samples.len()) - 1;
        (samples[i].as_secs_f64() * 1e4).round() / 10.0
    };
    if samples.is_empty() {
        return json!(null);
    }
    json!({ "p50_ms": at(0.5), "p99_ms": at(0.99), "max_ms": at(1.0), "n": samples.len() })
}

pub async fn list(global: &GlobalOpts, opts: &ListOpts) -> Result<Value> {
    let endpoint = global.endpoints.first().context("an endpoint")?;
    let filled_at = Instant::now();
    if opts.fill > 0 {
        fill(global, opts, endpoint).await?;
    }
    let fill_s = filled_at.elapsed().as_secs_f64();

    // The writers beside the LISTs, if any: `--clients` of them on one connection, each
    // paced at its share of `--put-rate`, so that the rate holds while a put waits for its
    // fsync.
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let mut writers = tokio::task::JoinSet::new();
    if opts.put_rate > 0.0 && opts.fill > 0 {
        let conn = Conn::connect(endpoint, global.dial_timeout).await?;
        let n = global.clients.max(1);
        for w in 0..n {
            let mut put = conn.unary(KV_PUT)?;
            let (opts, stop) = (opts.clone(), stop.clone());
            let timeout = global.request_timeout;
            writers.spawn(async move {
                let mut rng = SmallRng::seed_from_u64(u64::MAX - u64::from(w));
                let interval = Duration::from_secs_f64(f64::from(n) / opts.put_rate);
                let mut next = Instant::now();
                let mut done = 0u64;
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    next += interval;
                    tokio::time::sleep_until(next).await;
                    let req = PutRequest {
                        key: key(&opts.prefix, rng.random_range(0..opts.fill)),
                        value: value(&mut rng, &opts).into(),
                        ..Default::default()
                    };
                    let _: PutResponse = call(&mut put, &req, timeout).await?;
                    done += 1;
                }
                anyhow::Ok(done)
            });
        }
    }

    let conn = Conn::connect(endpoint, global.dial_timeout).await?;
    let mut range = conn.unary(KV_RANGE)?;
    let mut lists = Vec::with_capacity(opts.rounds as usize);
    let mut pages = Vec::new();
    let (mut keys, mut bytes) = (0u64, 0u64);
    let started = Instant::now();
    for _ in 0..opts.rounds {
        if crate::driver::STOP.load(std::sync::atomic::Ordering::Relaxed) {
            break;
        }
        let list_started = Instant::now();
        let (k, b) = list_once(&mut range, opts, global.request_timeout, &mut pages).await?;
        lists.push(list_started.elapsed());
        keys = k;
        bytes = b;
    }
    let secs = started.elapsed().as_secs_f64();
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let mut puts = 0;
    while let Some(done) = writers.join_next().await {
        puts += done.context("a writer")??;
    }
    Ok(json!({
        "workload": "list",
        "fill_s": (fill_s * 1e3).round() / 1e3,
        "keys_per_list": keys,
        "bytes_per_list": bytes,
        "rounds": lists.len(),
        "duration_s": (secs * 1e3).round() / 1e3,
        "puts": puts,
        "list": percentiles(&mut lists),
        "page": percentiles(&mut pages),
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_are_nearest_rank_in_milliseconds() {
        let mut samples: Vec<Duration> = (1..=200).map(Duration::from_millis).collect();
        samples.reverse();
        let p = percentiles(&mut samples);
        assert_eq!(p["p50_ms"], 100.0);
        assert_eq!(p["p99_ms"], 198.0);
        assert_eq!(p["max_ms"], 200.0);
        assert_eq!(p["n"], 200);
        assert_eq!(percentiles(&mut []), Value::Null);
    }

    #[test]
    fn filled_keys_sort_in_creation_order_and_values_keep_their_bounds() {
        assert_eq!(
            key("/registry/minions/", 7),
            b"/registry/minions/node-00007"
        );
        assert!(key("p/", 9) < key("p/", 10));
        let mut rng = SmallRng::seed_from_u64(1);
        let opts = ListOpts {
            prefix: "p/".into(),
            fill: 1,
            value_min: 6 * 1024,
            value_max: 10 * 1024,
            rounds: 1,
            page_size: 500,
            put_rate: 0.0,
            serializable: false,
        };
        for _ in 0..100 {
            let v = value(&mut rng, &opts);
            assert!((6 * 1024..=10 * 1024).contains(&v.len()), "{}", v.len());
        }
    }
}
