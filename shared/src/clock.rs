//! Wall-clock time behind a seam, so sync tests can drive it. Monotonic time is tokio's
//! `Instant`, which tests pause and advance; the test kit's clock follows it.

use k8s_openapi::jiff::{SignedDuration, Timestamp};
use std::sync::Arc;

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
