//! When a pod change reaches its Services' syncs (ES-17 and the adaptive mode).
//!
//! Upstream delays every pod-triggered sync by `--endpointslice-updates-batch-period`: 0 writes
//! each change at once (one slice update per readiness flip under churn), a fixed period
//! coalesces churn but delays an isolated change by the whole period. `adaptive` throttles per
//! Service instead: a change to a Service not synced for pods within the last window is released
//! at once; later changes inside the window wait for its end and coalesce into one sync. An
//! isolated change is never delayed; a burst costs at most one sync per window after its first.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;
use tokio::time::Instant;

/// The coalescing window of the adaptive mode.
pub const ADAPTIVE_WINDOW: Duration = Duration::from_secs(1);

/// `--endpointslice-updates-batch-period`: a Go duration, or `adaptive`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BatchPeriod {
    Fixed(Duration),
    Adaptive,
}

impl BatchPeriod {
    /// The floor of slice-triggered syncs: max(1 s, period) upstream; 1 s when adaptive.
    pub fn slice_delay(self, floor: Duration) -> Duration {
        match self {
            BatchPeriod::Fixed(d) => d.max(floor),
            BatchPeriod::Adaptive => floor,
        }
    }
}

impl std::fmt::Display for BatchPeriod {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            BatchPeriod::Fixed(d) => write!(f, "{d:?}"),
            BatchPeriod::Adaptive => f.write_str("adaptive"),
        }
    }
}

/// clap value parser.
pub fn batch_period_arg(s: &str) -> Result<BatchPeriod, String> {
    if s == "adaptive" {
        return Ok(BatchPeriod::Adaptive);
    }
    shared::process::flags::duration_arg(s)
        .map(BatchPeriod::Fixed)
        .map_err(|e| format!("{e} (or \"adaptive\")"))
}

/// Per-Service release times of the adaptive mode.
#[derive(Debug)]
pub struct Batcher {
    period: BatchPeriod,
    released: Mutex<HashMap<String, Instant>>,
}

impl Batcher {
    pub fn new(period: BatchPeriod) -> Self {
        Batcher {
            period,
            released: Mutex::new(HashMap::new()),
        }
    }

    /// How long a pod-triggered sync of `key` waits, from `now`.
    pub fn delay(&self, key: &str, now: Instant) -> Duration {
        if let BatchPeriod::Fixed(d) = self.period {
            return d;
        }
        let mut released = self.released.lock().unwrap_or_else(|p| p.into_inner());
        match released.get(key).copied() {
            // A coalesced release is already due at the end of the window: join it.
            Some(at) if at > now => at.saturating_duration_since(now),
            // Within a window that began with a release: coalesce at its end, which also
            // begins the next window (so a change just after it waits too).
            Some(last) if now.saturating_duration_since(last) < ADAPTIVE_WINDOW => {
                let at = shared::meta::clock::far_or(last, ADAPTIVE_WINDOW);
                released.insert(key.to_string(), at);
                at.saturating_duration_since(now)
            }
            _ => {
                released.insert(key.to_string(), now);
                // Entries older than a window decide nothing: drop them now and then.
                if released.len() > 4096 && released.len().is_power_of_two() {
                    released.retain(|_, t| {
                        *t > now || now.saturating_duration_since(*t) < ADAPTIVE_WINDOW
                    });
                }
                Duration::ZERO
            }
        }
    }

    /// The Service is gone.
    pub fn forget(&self, key: &str) {
        self.released
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(key);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_durations_and_adaptive() {
        assert_eq!(
            batch_period_arg("0s"),
            Ok(BatchPeriod::Fixed(Duration::ZERO))
        );
        assert_eq!(
            batch_period_arg("1.5s"),
            Ok(BatchPeriod::Fixed(Duration::from_millis(1500)))
        );
        assert_eq!(batch_period_arg("adaptive"), Ok(BatchPeriod::Adaptive));
        assert!(batch_period_arg("-1s").is_err());
        assert!(batch_period_arg("sometimes").is_err());
    }

    #[test]
    fn fixed_periods_delay_every_change_alike() {
        let b = Batcher::new(BatchPeriod::Fixed(Duration::from_secs(1)));
        let now = Instant::now();
        assert_eq!(b.delay("ns/a", now), Duration::from_secs(1));
        assert_eq!(b.delay("ns/a", now), Duration::from_secs(1));
    }

    #[test]
    fn adaptive_releases_an_isolated_change_at_once_and_coalesces_a_burst() {
        let b = Batcher::new(BatchPeriod::Adaptive);
        let t0 = Instant::now();
        assert_eq!(b.delay("ns/a", t0), Duration::ZERO, "isolated: at once");
        let t1 = t0 + Duration::from_millis(300);
        assert_eq!(
            b.delay("ns/a", t1),
            Duration::from_millis(700),
            "burst: at the window's end"
        );
        assert_eq!(
            b.delay("ns/a", t1 + Duration::from_millis(200)),
            Duration::from_millis(500)
        );
        assert_eq!(b.delay("ns/b", t1), Duration::ZERO, "per Service");
        // The coalesced release at t0 + 1 s begins the next window: a change just after it
        // waits for t0 + 2 s instead of going at once.
        let just_after = t0 + Duration::from_millis(1001);
        assert_eq!(b.delay("ns/a", just_after), Duration::from_millis(999));
        let later = t0 + Duration::from_secs(5);
        assert_eq!(
            b.delay("ns/a", later),
            Duration::ZERO,
            "quiet again: at once"
        );
        b.forget("ns/a");
        assert_eq!(b.delay("ns/a", later), Duration::ZERO);
    }
}
