//! The watch workloads. Delivery latency is measured from the moment a put is issued to the
//! moment its event arrives at a watcher: every put value starts with the issue time (nanoseconds
//! since the run's base instant, little endian), so any watcher can compute it on receipt.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use anyhow::{Context, Result, bail};
use etcd_client::{Client, KvClient, WatchOptions, WatchStream};
use tokio::sync::{mpsc, watch};
use tokio::task::JoinSet;
use tokio::time::Instant;

use crate::cli::{Budget, GlobalOpts, WatchLatencyOpts, WatchOpts};
use crate::driver::{Progress, Tickets, Worker, clients, connect, run_workers};
use crate::keys::{KeyMaker, random_bytes};
use crate::report::{Recorder, Summary};

/// Bytes of the issue timestamp at the front of every put value.
const STAMP: usize = 8;

/// The clock every put value and every watcher agree on.
#[derive(Debug, Clone, Copy)]
struct Clock(Instant);

impl Clock {
    fn now_nanos(self) -> u64 {
        u64::try_from(self.0.elapsed().as_nanos()).unwrap_or(u64::MAX)
    }

    /// The stamp, then the rest of `pad`: a value of `pad`'s size (at least the stamp's).
    fn stamped(self, pad: &[u8]) -> Vec<u8> {
        let mut v = Vec::with_capacity(pad.len().max(STAMP));
        v.extend_from_slice(&self.now_nanos().to_le_bytes());
        if pad.len() > STAMP {
            v.extend_from_slice(&pad[STAMP..]);
        }
        v
    }

    /// The delay from the stamp in `value` until `now` (a reading of [`Clock::now_nanos`]);
    /// `None` for a value without a stamp.
    fn stamp_until(value: &[u8], now: u64) -> Option<Duration> {
        let stamp = u64::from_le_bytes(value.get(..STAMP)?.try_into().ok()?);
        Some(Duration::from_nanos(now.saturating_sub(stamp)))
    }
}

/// Creates one watcher per key on a new watch stream, one after the other, recording for each
/// the time from its create request to the `created` response.
async fn open_stream(
    client: &Client,
    keys: &[Vec<u8>],
    prev_kv: bool,
    rec: &mut Recorder,
) -> Result<WatchStream> {
    let mut stream: Option<WatchStream> = None;
    let options = || prev_kv.then(|| WatchOptions::new().with_prev_key());
    for key in keys {
        let st = Instant::now();
        let s = match stream.as_mut() {
            None => stream.insert(client.watch_client().watch(key.clone(), options()).await?),
            Some(s) => {
                s.watch(key.clone(), options()).await?;
                s
            }
        };
        loop {
            let resp = s
                .message()
                .await?
                .context("watch stream closed while creating watchers")?;
            if resp.canceled() {
                bail!("watch create canceled: {}", resp.cancel_reason());
            }
            if resp.created() {
                rec.record(st.elapsed());
                break;
            }
        }
    }
    stream.context("no key to watch")
}

/// Reads events until told to stop (or the stream fails), recording each one's latency.
async fn receive(
    mut stream: WatchStream,
    clock: Clock,
    mut stop: watch::Receiver<bool>,
    received: Arc<AtomicU64>,
    last_event: Arc<AtomicU64>,
    notify: Option<mpsc::UnboundedSender<()>>,
) -> Recorder {
    let mut rec = Recorder::new();
    loop {
        let msg = tokio::select! {
            _ = stop.wait_for(|s| *s) => break,
            msg = stream.message() => msg,
        };
        let resp = match msg {
            Ok(Some(resp)) => resp,
            Ok(None) => {
                rec.record_error("watch stream closed");
                break;
            }
            Err(e) => {
                rec.record_error(&e.to_string());
                break;
            }
        };
        if resp.canceled() {
            rec.record_error(&format!("watch canceled: {}", resp.cancel_reason()));
            break;
        }
        let events = resp.events();
        if events.is_empty() {
            continue;
        }
        // The events of one response arrived together: one reading of the clock times them
        // all (and keeps the generator's own work per event small).
        let now = clock.now_nanos();
        for ev in events {
            let latency = ev.kv().and_then(|kv| Clock::stamp_until(kv.value(), now));
            match latency {
                Some(l) => rec.record(l),
                None => rec.record_error("event value carries no timestamp"),
            }
            if let Some(n) = &notify {
                let _ = n.send(());
            }
        }
        received.fetch_add(events.len() as u64, Ordering::Relaxed);
        last_event.fetch_max(now, Ordering::Relaxed);
    }
    rec
}

/// Puts a stamped value on `keys[i % len]`; on success adds that key's watcher count to the
/// number of events expected.
struct StampedPut {
    kv: KvClient,
    clock: Clock,
    keys: Arc<Vec<Vec<u8>>>,
    watchers: Arc<Vec<u64>>,
    expected: Arc<AtomicU64>,
}

impl Worker for StampedPut {
    async fn call(&mut self, i: u64) -> Result<(), String> {
        let k = (i % self.keys.len() as u64) as usize;
        let value = self.clock.stamped(&[]);
        self.kv
            .put(self.keys[k].clone(), value, None)
            .await
            .map_err(|e| e.to_string())?;
        self.expected.fetch_add(self.watchers[k], Ordering::Relaxed);
        Ok(())
    }
}

/// `watch`: watch creation summary and event delivery summary.
pub async fn watch(global: &GlobalOpts, opts: &WatchOpts) -> Result<(Summary, Summary)> {
    let km = KeyMaker::new(opts.key_size, opts.key_space_size)?;
    let watched: Vec<Vec<u8>> = (0..opts.watched_key_total)
        .map(|i| {
            let n = if opts.sequential_keys {
                i % opts.key_space_size
            } else {
                rand::random_range(0..opts.key_space_size)
            };
            km.key(n)
        })
        .collect();
    // Distinct keys, and how many watchers each one has.
    let mut index: HashMap<&[u8], usize> = HashMap::new();
    let mut keys: Vec<Vec<u8>> = Vec::new();
    for k in &watched {
        index.entry(k).or_insert_with(|| {
            keys.push(k.clone());
            keys.len() - 1
        });
    }
    let mut watchers = vec![0u64; keys.len()];
    let per_stream = opts.watch_per_stream as usize;
    let stream_keys: Vec<Vec<Vec<u8>>> = (0..opts.streams as usize)
        .map(|s| {
            (0..per_stream)
                .map(|j| {
                    let k = &watched[(s * per_stream + j) % watched.len()];
                    watchers[index[k.as_slice()]] += 1;
                    k.clone()
                })
                .collect()
        })
        .collect();
    // Puts cycle through the watched keys as etcd's benchmark does.
    let put_keys: Vec<Vec<u8>> = watched.clone();
    let put_watchers: Vec<u64> = watched
        .iter()
        .map(|k| watchers[index[k.as_slice()]])
        .collect();

    let cls = clients(global).await?;
    let prev_kv = opts.prev_kv;

    // Phase 1: create the watchers.
    let create_start = Instant::now();
    let mut set = JoinSet::new();
    for (s, keys) in stream_keys.into_iter().enumerate() {
        let client = cls[s % cls.len()].clone();
        let timeout = global.request_timeout * per_stream.max(1) as u32;
        set.spawn(async move {
            let mut rec = Recorder::new();
            let stream =
                tokio::time::timeout(timeout, open_stream(&client, &keys, prev_kv, &mut rec))
                    .await
                    .context("creating watchers timed out")??;
            anyhow::Ok((stream, rec))
        });
    }
    let mut streams = Vec::new();
    let mut create_rec = Recorder::new();
    while let Some(res) = set.join_next().await {
        let (stream, rec) = res.context("watch stream task")??;
        create_rec.merge(&rec);
        streams.push(stream);
    }
    let create = create_rec.summary("watch-create", create_start.elapsed());
    if let Some(hold) = opts.hold {
        eprintln!("watchers created");
        tokio::time::sleep(hold).await;
    }

    // Phase 2: receivers on every stream, puts on the watched keys.
    let clock = Clock(Instant::now());
    let (stop_tx, stop_rx) = watch::channel(false);
    let received = Arc::new(AtomicU64::new(0));
    let last_event = Arc::new(AtomicU64::new(0));
    let mut receivers = JoinSet::new();
    for stream in streams {
        receivers.spawn(receive(
            stream,
            clock,
            stop_rx.clone(),
            received.clone(),
            last_event.clone(),
            None,
        ));
    }
    let expected = Arc::new(AtomicU64::new(0));
    let put_keys = Arc::new(put_keys);
    let put_watchers = Arc::new(put_watchers);
    let putters = cls
        .iter()
        .map(|c| StampedPut {
            kv: c.kv_client(),
            clock,
            keys: put_keys.clone(),
            watchers: put_watchers.clone(),
            expected: expected.clone(),
        })
        .collect();
    let budget = Budget {
        total: Some(opts.put_total),
        duration: global.duration,
    };
    let (put_rec, put_elapsed) =
        run_workers(putters, budget, opts.put_rate, global.request_timeout).await;

    // Wait for the events of every acknowledged put (a bounded grace period).
    let want = expected.load(Ordering::Relaxed);
    let grace = Instant::now() + global.request_timeout;
    while received.load(Ordering::Relaxed) < want && Instant::now() < grace {
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    let _ = stop_tx.send(true);
    let mut events_rec = Recorder::new();
    while let Some(res) = receivers.join_next().await {
        match res {
            Ok(rec) => events_rec.merge(&rec),
            Err(e) => events_rec.record_error(&format!("receiver task failed: {e}")),
        }
    }
    let got = received.load(Ordering::Relaxed);
    events_rec.record_errors("watch event not received", want.saturating_sub(got));
    events_rec.merge_errors(&put_rec, "put failed: ");
    let last = last_event.load(Ordering::Relaxed);
    let elapsed = if last > 0 {
        Duration::from_nanos(last)
    } else {
        put_elapsed
    };
    Ok((create, events_rec.summary("watch", elapsed)))
}

/// `watch-latency`: every client watches one key; each put waits until all of them got its
/// event before the next one is issued (at most `--put-rate` puts per second).
pub async fn watch_latency(global: &GlobalOpts, opts: &WatchLatencyOpts) -> Result<Summary> {
    let key = random_bytes(opts.key_size);
    let pad = random_bytes(opts.val_size);
    let cls = clients(global).await?;
    let mut put = connect(global, 1)
        .await?
        .pop()
        .context("no put connection")?
        .kv_client();

    let clock = Clock(Instant::now());
    let (stop_tx, stop_rx) = watch::channel(false);
    let (event_tx, mut event_rx) = mpsc::unbounded_channel();
    let received = Arc::new(AtomicU64::new(0));
    let last_event = Arc::new(AtomicU64::new(0));
    let mut setup = JoinSet::new();
    for c in cls {
        let key = key.clone();
        let timeout = global.request_timeout;
        setup.spawn(async move {
            let mut rec = Recorder::new();
            tokio::time::timeout(timeout, open_stream(&c, &[key], false, &mut rec))
                .await
                .context("creating a watcher timed out")?
        });
    }
    let mut receivers = JoinSet::new();
    while let Some(res) = setup.join_next().await {
        let stream = res.context("watch setup task")??;
        receivers.spawn(receive(
            stream,
            clock,
            stop_rx.clone(),
            received.clone(),
            last_event.clone(),
            Some(event_tx.clone()),
        ));
    }
    drop(event_tx);
    let n_watchers = receivers.len();

    let tickets = Tickets::new(global.budget(), opts.put_rate);
    let done = Arc::new(AtomicU64::new(0));
    let progress = Progress::start(done.clone(), tickets.total(), tickets.deadline());
    let mut errors = Recorder::new();
    let start = Instant::now();
    'puts: while tickets.next().await.is_some() {
        let value = clock.stamped(&pad);
        match tokio::time::timeout(global.request_timeout, put.put(key.clone(), value, None)).await
        {
            Ok(Ok(_)) => {}
            Ok(Err(e)) => {
                errors.record_error(&format!("put failed: {e}"));
                break;
            }
            Err(_) => {
                errors.record_error("put timed out (bench --request-timeout)");
                break;
            }
        }
        let deadline = Instant::now() + global.request_timeout;
        for got in 0..n_watchers {
            match tokio::time::timeout_at(deadline, event_rx.recv()).await {
                Ok(Some(())) => {}
                _ => {
                    errors.record_errors("watch event not received", (n_watchers - got) as u64);
                    break 'puts;
                }
            }
        }
        done.fetch_add(1, Ordering::Relaxed);
    }
    let elapsed = start.elapsed();
    progress.finish();
    let _ = stop_tx.send(true);
    let mut rec = Recorder::new();
    while let Some(res) = receivers.join_next().await {
        match res {
            Ok(r) => rec.merge(&r),
            Err(e) => rec.record_error(&format!("receiver task failed: {e}")),
        }
    }
    rec.merge_errors(&errors, "");
    Ok(rec.summary("watch-latency", elapsed))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stamps_round_trip_and_keep_the_value_size() {
        let clock = Clock(Instant::now());
        let v = clock.stamped(&[7u8; 32]);
        assert_eq!(v.len(), 32);
        assert_eq!(&v[STAMP..], &[7u8; 24]);
        let stamp = u64::from_le_bytes(v[..STAMP].try_into().unwrap());
        assert_eq!(
            Clock::stamp_until(&v, stamp + 1500),
            Some(Duration::from_nanos(1500))
        );
        assert_eq!(Clock::stamp_until(&v, 0), Some(Duration::ZERO));
        assert_eq!(clock.stamped(&[]).len(), STAMP);
        assert_eq!(Clock::stamp_until(b"data", stamp), None);
    }
}
