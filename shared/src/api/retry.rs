//! Retry on conflict, as client-go's `retry.RetryOnConflict` with `retry.DefaultRetry`: a few
//! quick attempts, each of which re-reads what it writes from.

use std::future::Future;
use std::time::Duration;

/// client-go's `DefaultRetry`: 5 steps, 10 ms apart (jitter 0.1).
pub const DEFAULT_ATTEMPTS: usize = 5;
const STEP: Duration = Duration::from_millis(10);

/// Calls `attempt(n)` (n from 0) until it succeeds, fails with anything but a conflict, or
/// `attempts` conflicts have happened; returns the last result. Waits as `DefaultRetry`.
pub async fn on_conflict<T, F, Fut>(attempts: usize, attempt: F) -> Result<T, kube::Error>
where
    F: FnMut(usize) -> Fut,
    Fut: Future<Output = Result<T, kube::Error>>,
{
    on_conflict_with(attempts, |_| crate::meta::clock::jitter(STEP, 0.1), attempt).await
}

/// `on_conflict` with another backoff, as client-go's `RetryOnConflict(backoff, fn)`: waits
/// `step(n)` before attempt `n` (n ≥ 1).
pub async fn on_conflict_with<T, F, Fut>(
    attempts: usize,
    step: impl Fn(usize) -> Duration,
    mut attempt: F,
) -> Result<T, kube::Error>
where
    F: FnMut(usize) -> Fut,
    Fut: Future<Output = Result<T, kube::Error>>,
{
    let mut n = 0;
    loop {
        match attempt(n).await {
            Err(e) if crate::api::apierr::is_conflict(&e) && n + 1 < attempts.max(1) => {
                n += 1;
                tokio::time::sleep(step(n)).await;
            }
            other => return other,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testkit::api_error;

    #[tokio::test(start_paused = true)]
    async fn retries_conflicts_only_and_stops_after_the_last_attempt() {
        let mut calls = 0;
        let r: Result<(), _> = on_conflict(3, |_| {
            calls += 1;
            async { Err(api_error(409, "Conflict", "c")) }
        })
        .await;
        assert!(r.is_err());
        assert_eq!(calls, 3);
        let mut calls = 0;
        let r: Result<(), _> = on_conflict(3, |_| {
            calls += 1;
            async { Err(api_error(500, "InternalError", "x")) }
        })
        .await;
        assert!(r.is_err());
        assert_eq!(calls, 1);
        let r = on_conflict(3, |n| async move {
            if n == 0 {
                Err(api_error(409, "Conflict", "c"))
            } else {
                Ok(n)
            }
        })
        .await;
        assert_eq!(r.unwrap(), 1);
    }

    #[tokio::test(start_paused = true)]
    async fn waits_the_given_steps_between_conflicts_only() {
        let start = tokio::time::Instant::now();
        let mut at = Vec::new();
        let r: Result<(), _> = on_conflict_with(
            5,
            |n| Duration::from_millis(100) * 2u32.pow(n as u32 - 1),
            |_| {
                at.push(start.elapsed());
                async { Err(api_error(409, "Conflict", "c")) }
            },
        )
        .await;
        assert!(crate::api::apierr::is_conflict(&r.unwrap_err()));
        let ms: Vec<u128> = at.iter().map(|d| d.as_millis()).collect();
        assert_eq!(ms, [0, 100, 300, 700, 1500]);
    }
}
