//! client-go `ControllerExpectations`: a controller that creates or deletes pods records how many
//! adds/deletes it expects to observe, and does not act on that controller key again until the
//! cache has caught up (or the record is older than the TTL, in case a watch event was lost).

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;
use tokio::time::Instant;

/// client-go's `ExpectationsTimeout`.
pub const EXPECTATIONS_TTL: Duration = Duration::from_secs(5 * 60);

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Record {
    add: i64,
    del: i64,
    at: Instant,
}

#[derive(Debug, Default)]
pub struct Expectations {
    records: Mutex<HashMap<String, Record>>,
    ttl: Option<Duration>,
}

impl Expectations {
    pub fn new() -> Self {
        Self::with_ttl(EXPECTATIONS_TTL)
    }

    pub fn with_ttl(ttl: Duration) -> Self {
        Expectations {
            records: Mutex::new(HashMap::new()),
            ttl: Some(ttl),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Record>> {
        crate::lock(&self.records)
    }

    /// True when the controller may act on `key`: no record, all expectations observed, or the
    /// record expired.
    pub fn satisfied(&self, key: &str) -> bool {
        match self.lock().get(key) {
            None => true,
            Some(r) => {
                (r.add <= 0 && r.del <= 0) || self.ttl.is_some_and(|ttl| r.at.elapsed() > ttl)
            }
        }
    }

    /// Replaces the record for `key` (client-go `SetExpectations`).
    pub fn set(&self, key: &str, add: i64, del: i64) {
        self.lock().insert(
            key.to_string(),
            Record {
                add,
                del,
                at: Instant::now(),
            },
        );
    }

    pub fn expect_creations(&self, key: &str, n: i64) {
        self.set(key, n, 0);
    }

    pub fn expect_deletions(&self, key: &str, n: i64) {
        self.set(key, 0, n);
    }

    /// Adds to the existing record without resetting its timestamp (client-go `RaiseExpectations`).
    pub fn raise(&self, key: &str, add: i64, del: i64) {
        if let Some(r) = self.lock().get_mut(key) {
            r.add += add;
            r.del += del;
        }
    }

    /// client-go `LowerExpectations`.
    pub fn lower(&self, key: &str, add: i64, del: i64) {
        if let Some(r) = self.lock().get_mut(key) {
            r.add -= add;
            r.del -= del;
        }
    }

    /// A create was observed in the cache, or a create we expected failed.
    pub fn creation_observed(&self, key: &str) {
        self.lower(key, 1, 0);
    }

    /// A delete was observed in the cache, or a delete we expected failed.
    pub fn deletion_observed(&self, key: &str) {
        self.lower(key, 0, 1);
    }

    /// The pending (add, del) counts, if any record exists.
    pub fn get(&self, key: &str) -> Option<(i64, i64)> {
        self.lock().get(key).map(|r| (r.add, r.del))
    }

    /// Forgets `key` (its controller object is gone).
    pub fn delete(&self, key: &str) {
        self.lock().remove(key);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn no_record_is_satisfied() {
        assert!(Expectations::new().satisfied("ns/a"));
    }

    #[test]
    fn creations_must_be_observed() {
        let e = Expectations::new();
        e.expect_creations("ns/a", 2);
        assert!(!e.satisfied("ns/a"));
        e.creation_observed("ns/a");
        assert!(!e.satisfied("ns/a"));
        e.creation_observed("ns/a");
        assert!(e.satisfied("ns/a"));
        // Extra observations (e.g. pods adopted later) keep it satisfied.
        e.creation_observed("ns/a");
        assert!(e.satisfied("ns/a"));
        assert_eq!(e.get("ns/a"), Some((-1, 0)));
    }

    #[test]
    fn deletions_and_raise_lower() {
        let e = Expectations::new();
        e.expect_deletions("k", 1);
        e.raise("k", 1, 0);
        assert_eq!(e.get("k"), Some((1, 1)));
        e.deletion_observed("k");
        assert!(!e.satisfied("k"));
        e.creation_observed("k");
        assert!(e.satisfied("k"));
        // raise without a record does nothing (as client-go).
        e.raise("other", 5, 0);
        assert!(e.satisfied("other"));
    }

    #[tokio::test(start_paused = true)]
    async fn expired_record_is_satisfied() {
        let e = Expectations::with_ttl(Duration::from_secs(300));
        e.expect_creations("k", 3);
        tokio::time::advance(Duration::from_secs(299)).await;
        assert!(!e.satisfied("k"));
        tokio::time::advance(Duration::from_secs(2)).await;
        assert!(e.satisfied("k"));
        e.delete("k");
        assert_eq!(e.get("k"), None);
    }
}
