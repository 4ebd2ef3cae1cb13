//! Waiting for a state by polling with a deadline (never by sleeping a fixed time).

use std::fmt::Display;
use std::future::Future;
use std::time::{Duration, Instant};

/// Calls `check` until it returns `Ok`, and returns that value.
///
/// Between attempts it pauses briefly (10 ms, growing to 100 ms). If `timeout` passes first, the
/// error carries the number of attempts and the last `Err` message, so a failing test says what
/// it was still waiting for.
///
/// ```no_run
/// # async fn demo(member: &etcdrs_testkit::Member) -> anyhow::Result<()> {
/// use std::time::Duration;
/// etcdrs_testkit::poll_until(Duration::from_secs(5), || async {
///     if member.log_contains("ready to serve client requests") { Ok(()) } else { Err("not ready") }
/// })
/// .await?;
/// # Ok(()) }
/// ```
pub async fn poll_until<T, E, F, Fut>(timeout: Duration, mut check: F) -> anyhow::Result<T>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, E>>,
    E: Display,
{
    let deadline = Instant::now() + timeout;
    let mut pause = Duration::from_millis(10);
    let mut attempts = 0u64;
    loop {
        attempts += 1;
        let last = match check().await {
            Ok(v) => return Ok(v),
            Err(e) => e.to_string(),
        };
        let now = Instant::now();
        if now >= deadline {
            anyhow::bail!(
                "condition not met within {timeout:?} ({attempts} attempts); last: {last}"
            );
        }
        tokio::time::sleep(pause.min(deadline - now)).await;
        pause = (pause * 2).min(Duration::from_millis(100));
    }
}

/// Polls `child` until it exits and returns its status; an error if it is still running after
/// `timeout` (it is left running).
pub async fn wait_child(
    child: &mut std::process::Child,
    timeout: Duration,
) -> anyhow::Result<std::process::ExitStatus> {
    poll_until(timeout, || {
        let polled = child.try_wait();
        async move {
            match polled {
                Ok(Some(status)) => Ok(status),
                Ok(None) => Err("still running".to_owned()),
                Err(e) => Err(format!("try_wait: {e}")),
            }
        }
    })
    .await
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::Cell;

    #[tokio::test]
    async fn returns_first_ok_value() {
        let calls = Cell::new(0);
        let v = poll_until(Duration::from_secs(5), || {
            calls.set(calls.get() + 1);
            let n = calls.get();
            async move {
                if n >= 3 {
                    Ok(n * 10)
                } else {
                    Err(format!("only {n}"))
                }
            }
        })
        .await
        .unwrap();
        assert_eq!((v, calls.get()), (30, 3));
    }

    #[tokio::test]
    async fn times_out_with_last_error() {
        let err = poll_until(Duration::from_millis(50), || async {
            Err::<(), _>("still waiting")
        })
        .await
        .unwrap_err()
        .to_string();
        assert!(err.contains("last: still waiting"), "{err}");
    }
}
