//! Waiting on conditions with a timeout and a description of what was awaited.

use anyhow::{Result, bail};
use std::future::Future;
use std::time::Duration;
use tokio::time::Instant;

/// Polls `check` every `every` until it returns `Ok(Some(v))`; fails after `timeout` with the
/// last observation (`Ok(None)` = not yet; an `Err` is remembered and reported, not fatal).
pub async fn until<T, F, Fut>(
    what: &str,
    timeout: Duration,
    every: Duration,
    mut check: F,
) -> Result<T>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<Option<T>>>,
{
    let deadline = Instant::now() + timeout;
    let mut last_err = None;
    loop {
        match check().await {
            Ok(Some(v)) => return Ok(v),
            Ok(None) => {}
            Err(e) => last_err = Some(e),
        }
        if Instant::now() >= deadline {
            match last_err {
                Some(e) => {
                    bail!("timed out after {timeout:?} waiting for {what}; last error: {e:#}")
                }
                None => bail!("timed out after {timeout:?} waiting for {what}"),
            }
        }
        tokio::time::sleep(every).await;
    }
}
