//! Token buckets and per-item backoff, with client-go's semantics.
//!
//! A [`TokenBucket`] hands out *reservations*: every call takes a token now and returns how long
//! the caller must wait before using it (client-go's `rate.Limiter.Reserve().Delay()`), so callers
//! are served in order and the long-run rate never exceeds `qps`.

use std::collections::HashMap;
use std::hash::Hash;
use std::sync::Mutex;
use std::time::Duration;
use tokio::time::Instant;

#[derive(Debug)]
pub struct TokenBucket {
    qps: f64,
    burst: f64,
    state: Mutex<BucketState>,
}

#[derive(Debug)]
struct BucketState {
    tokens: f64,
    last: Instant,
}

impl TokenBucket {
    /// A bucket that starts full. `qps <= 0` means unlimited.
    pub fn new(qps: f64, burst: u32) -> Self {
        let burst = f64::from(burst.max(1));
        TokenBucket {
            qps,
            burst,
            state: Mutex::new(BucketState {
                tokens: burst,
                last: Instant::now(),
            }),
        }
    }

    /// Tokens per second (`<= 0` is unlimited).
    pub fn qps(&self) -> f64 {
        self.qps
    }

    /// Takes one token and returns the delay before it may be used.
    pub fn reserve(&self) -> Duration {
        self.reserve_at(Instant::now())
    }

    fn reserve_at(&self, now: Instant) -> Duration {
        if self.qps <= 0.0 || !self.qps.is_finite() {
            return Duration::ZERO;
        }
        let mut s = crate::lock(&self.state);
        let elapsed = now.saturating_duration_since(s.last).as_secs_f64();
        s.tokens = (s.tokens + elapsed * self.qps).min(self.burst);
        s.last = now;
        s.tokens -= 1.0;
        if s.tokens >= 0.0 {
            Duration::ZERO
        } else {
            // Bounded: a tiny qps must not make an out-of-range (panicking) Duration.
            Duration::from_secs_f64((-s.tokens / self.qps).clamp(0.0, 1e9))
        }
    }

    /// A token for a low-priority caller: taken only if one is free now, after every
    /// reservation made so far; otherwise how long until one may be. A caller that waits and
    /// retries is served after any ordinary caller that reserved meanwhile.
    pub fn take_if_free(&self) -> Result<(), Duration> {
        self.take_if_free_at(Instant::now())
    }

    fn take_if_free_at(&self, now: Instant) -> Result<(), Duration> {
        if self.qps <= 0.0 || !self.qps.is_finite() {
            return Ok(());
        }
        let mut s = crate::lock(&self.state);
        let elapsed = now.saturating_duration_since(s.last).as_secs_f64();
        s.tokens = (s.tokens + elapsed * self.qps).min(self.burst);
        s.last = now;
        if s.tokens >= 1.0 {
            s.tokens -= 1.0;
            return Ok(());
        }
        Err(Duration::from_secs_f64(
            ((1.0 - s.tokens) / self.qps).clamp(0.001, 3600.0),
        ))
    }

    /// Waits for a token.
    pub async fn acquire(&self) {
        let d = self.reserve();
        if !d.is_zero() {
            tokio::time::sleep(d).await;
        }
    }
}

/// How a work queue delays retries of a failing key: exponential per item, optionally max'd with
/// an overall bucket (client-go `DefaultTypedControllerRateLimiter`).
#[derive(Clone, Debug, PartialEq)]
pub struct BackoffConfig {
    pub base: Duration,
    pub max: Duration,
    /// Overall bucket (qps, burst) applied to every retry, as client-go's default limiter does.
    pub bucket: Option<(f64, u32)>,
}

impl Default for BackoffConfig {
    /// client-go's default controller rate limiter: 5 ms doubling to 1000 s, max'd with a
    /// 10 qps / 100 burst bucket.
    fn default() -> Self {
        BackoffConfig {
            base: Duration::from_millis(5),
            max: Duration::from_secs(1000),
            bucket: Some((10.0, 100)),
        }
    }
}

impl BackoffConfig {
    /// Pure per-item exponential backoff (e.g. the Job controller's 1 s..60 s).
    pub fn exponential(base: Duration, max: Duration) -> Self {
        BackoffConfig {
            base,
            max,
            bucket: None,
        }
    }
}

/// Per-item failure counts and the resulting delays.
#[derive(Debug)]
pub struct ItemBackoff<K> {
    config: BackoffConfig,
    failures: HashMap<K, u32>,
    bucket: Option<TokenBucket>,
}

impl<K: Hash + Eq + Clone> ItemBackoff<K> {
    pub fn new(config: BackoffConfig) -> Self {
        let bucket = config
            .bucket
            .map(|(qps, burst)| TokenBucket::new(qps, burst));
        ItemBackoff {
            config,
            failures: HashMap::new(),
            bucket,
        }
    }

    /// Records one more failure of `key` and returns how long to wait before retrying it.
    pub fn when(&mut self, key: &K) -> Duration {
        let n = self.failures.entry(key.clone()).or_insert(0);
        let exp = backoff_delay(self.config.base, self.config.max, *n);
        *n = n.saturating_add(1);
        let bucket = self
            .bucket
            .as_ref()
            .map(TokenBucket::reserve)
            .unwrap_or_default();
        exp.max(bucket)
    }

    pub fn forget(&mut self, key: &K) {
        self.failures.remove(key);
    }

    pub fn retries(&self, key: &K) -> u32 {
        self.failures.get(key).copied().unwrap_or(0)
    }
}

/// `base * 2^failures`, capped at `max` (no overflow for any count).
pub fn backoff_delay(base: Duration, max: Duration, failures: u32) -> Duration {
    let factor = 2f64.powi(failures.min(1024) as i32);
    let secs = base.as_secs_f64() * factor;
    if !secs.is_finite() || secs >= max.as_secs_f64() {
        max
    } else {
        Duration::from_secs_f64(secs)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bucket_allows_burst_then_spaces_by_qps() {
        let b = TokenBucket::new(10.0, 3);
        let t0 = Instant::now();
        assert_eq!(b.reserve_at(t0), Duration::ZERO);
        assert_eq!(b.reserve_at(t0), Duration::ZERO);
        assert_eq!(b.reserve_at(t0), Duration::ZERO);
        let d = b.reserve_at(t0);
        assert!((d.as_secs_f64() - 0.1).abs() < 1e-9, "{d:?}");
        let d = b.reserve_at(t0);
        assert!((d.as_secs_f64() - 0.2).abs() < 1e-9, "{d:?}");
        // After a second the bucket refilled (capped at burst) minus the debt.
        let d = b.reserve_at(t0 + Duration::from_secs(1));
        assert_eq!(d, Duration::ZERO);
    }

    #[test]
    fn low_priority_takes_only_free_tokens_after_reservations() {
        let b = TokenBucket::new(10.0, 2);
        let t0 = Instant::now();
        assert_eq!(b.take_if_free_at(t0), Ok(()));
        // A reservation takes the last token; the next one is in debt.
        assert_eq!(b.reserve_at(t0), Duration::ZERO);
        assert!((b.reserve_at(t0).as_secs_f64() - 0.1).abs() < 1e-9);
        // The low-priority caller waits for the debt and a whole token: 0.2 s.
        let wait = b.take_if_free_at(t0).unwrap_err();
        assert!((wait.as_secs_f64() - 0.2).abs() < 1e-9, "{wait:?}");
        // Meanwhile an ordinary caller reserves again: it goes first.
        assert!((b.reserve_at(t0 + Duration::from_millis(100)).as_secs_f64() - 0.1).abs() < 1e-9);
        assert!(b.take_if_free_at(t0 + Duration::from_millis(200)).is_err());
        assert_eq!(b.take_if_free_at(t0 + Duration::from_millis(300)), Ok(()));
    }

    #[test]
    fn unlimited_bucket_never_waits() {
        let b = TokenBucket::new(0.0, 1);
        for _ in 0..1000 {
            assert_eq!(b.reserve(), Duration::ZERO);
        }
    }

    #[test]
    fn item_backoff_doubles_caps_and_forgets() {
        let mut b = ItemBackoff::new(BackoffConfig::exponential(
            Duration::from_secs(1),
            Duration::from_secs(60),
        ));
        let k = "ns/a".to_string();
        let got: Vec<u64> = (0..8).map(|_| b.when(&k).as_secs()).collect();
        assert_eq!(got, vec![1, 2, 4, 8, 16, 32, 60, 60]);
        assert_eq!(b.retries(&k), 8);
        // Another key is independent.
        assert_eq!(b.when(&"ns/b".to_string()), Duration::from_secs(1));
        b.forget(&k);
        assert_eq!(b.retries(&k), 0);
        assert_eq!(b.when(&k), Duration::from_secs(1));
    }

    #[test]
    fn default_limiter_is_client_go_default() {
        let mut b = ItemBackoff::new(BackoffConfig::default());
        let k = 1u32;
        assert_eq!(b.when(&k), Duration::from_millis(5));
        assert_eq!(b.when(&k), Duration::from_millis(10));
        assert_eq!(
            backoff_delay(Duration::from_millis(5), Duration::from_secs(1000), 30),
            Duration::from_secs(1000)
        );
        assert_eq!(
            backoff_delay(
                Duration::from_millis(5),
                Duration::from_secs(1000),
                u32::MAX
            ),
            Duration::from_secs(1000)
        );
    }
}
