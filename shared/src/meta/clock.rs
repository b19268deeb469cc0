//! Wall-clock time behind a seam, so sync tests can drive it. Monotonic time is tokio's
//! `Instant`, which tests pause and advance; the test kit's clock follows it.

use k8s_openapi::jiff::{SignedDuration, Timestamp};
use std::sync::Arc;
use std::time::Duration;
use tokio::time::Instant;

pub trait Clock: Send + Sync + std::fmt::Debug + 'static {
    fn now(&self) -> Timestamp;
}

/// The system's clock.
#[derive(Debug, Default)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now(&self) -> Timestamp {
        Timestamp::now()
    }
}

pub fn system() -> Arc<dyn Clock> {
    Arc::new(SystemClock)
}

/// A wall clock that starts at a fixed time and moves with tokio's (pausable) `Instant`, so
/// `tokio::time::advance` moves both together.
#[derive(Debug)]
pub struct FollowingClock {
    base: Timestamp,
    start: tokio::time::Instant,
}

impl FollowingClock {
    pub fn starting_at(base: Timestamp) -> FollowingClock {
        FollowingClock {
            base,
            start: tokio::time::Instant::now(),
        }
    }
}

impl Clock for FollowingClock {
    fn now(&self) -> Timestamp {
        let elapsed = SignedDuration::try_from(self.start.elapsed()).unwrap_or(SignedDuration::MAX);
        self.base.checked_add(elapsed).unwrap_or(Timestamp::MAX)
    }
}

/// Now, in Unix seconds (the resolution of managedFields times).
pub fn unix_now() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| i64::try_from(d.as_secs()).unwrap_or(i64::MAX))
        .unwrap_or(0)
}

/// The latest a delayed add or timer waits: far enough to mean "never" for any controller, near enough
/// that every platform's `Instant` can hold it.
pub const FAR_FUTURE: Duration = Duration::from_secs(100 * 365 * 24 * 3600);

/// `now + delay`, capped at `now + FAR_FUTURE`: never panics on a user-supplied duration.
pub fn far_or(now: Instant, delay: Duration) -> Instant {
    now.checked_add(delay.min(FAR_FUTURE)).unwrap_or(now)
}

/// client-go `wait.Jitter`: `d + rand[0,1) * factor * d`.
pub fn jitter(d: Duration, factor: f64) -> Duration {
    let extra = Duration::try_from_secs_f64(d.as_secs_f64() * rand::random::<f64>() * factor)
        .unwrap_or(Duration::MAX);
    d.saturating_add(extra)
}
