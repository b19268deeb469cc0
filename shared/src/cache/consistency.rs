//! Read-your-writes by resourceVersion (upstream's consistency store, KEP-5647, widened to every
//! type a controller writes): each write an owner's sync makes is noted with the version the API
//! server returned; before the owner's next sync acts, every informer it wrote through must have
//! delivered that version. Until then the sync waits (requeues) instead of acting on a cache
//! that does not yet show its own last writes, which would double a create or a delete.
//!
//! A note that stays unconfirmed for [`GIVE_UP`] is dropped: a watch that delivers nothing newer
//! (the object deleted meanwhile and nothing else changing) must not stall the owner forever.

use crate::cache::informers::parse_rv;
use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;
use tokio::time::Instant;

/// How long an unconfirmed write holds its owner back.
pub const GIVE_UP: Duration = Duration::from_secs(30);

struct Wrote {
    resource: &'static str,
    rv: u64,
    at: Instant,
}

/// Per owner key (`namespace/name`, or a UID): the versions its writes returned.
#[derive(Default)]
pub struct Consistency {
    pending: Mutex<HashMap<String, Vec<Wrote>>>,
}

/// The owner's caches do not yet show one of its writes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Behind {
    pub resource: &'static str,
    pub wrote: u64,
    pub seen: u64,
}

impl Consistency {
    pub fn new() -> Self {
        Self::default()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Vec<Wrote>>> {
        self.pending.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A write for `owner` to `resource` returned `rv` (absent or non-numeric: nothing to wait
    /// for).
    pub fn wrote(&self, owner: &str, resource: &'static str, rv: Option<&str>) {
        let Some(rv) = rv.and_then(parse_rv) else {
            return;
        };
        let mut map = self.lock();
        let notes = map.entry(owner.to_string()).or_default();
        match notes.iter_mut().find(|w| w.resource == resource) {
            Some(w) if w.rv >= rv => {}
            Some(w) => {
                w.rv = rv;
                w.at = Instant::now();
            }
            None => notes.push(Wrote {
                resource,
                rv,
                at: Instant::now(),
            }),
        }
    }

    /// Whether the caches show every write noted for `owner`; `newest(resource)` is that
    /// resource's informer's newest delivered version. Confirmed (and expired) notes are dropped.
    pub fn check(&self, owner: &str, newest: impl Fn(&str) -> u64) -> Result<(), Behind> {
        let mut map = self.lock();
        let Some(notes) = map.get_mut(owner) else {
            return Ok(());
        };
        let now = Instant::now();
        let mut behind = None;
        notes.retain(|w| {
            let seen = newest(w.resource);
            if seen >= w.rv {
                return false;
            }
            if now.saturating_duration_since(w.at) >= GIVE_UP {
                tracing::warn!(
                    owner,
                    resource = w.resource,
                    wrote = w.rv,
                    seen,
                    "a write was never seen by the watch; acting anyway"
                );
                return false;
            }
            behind.get_or_insert(Behind {
                resource: w.resource,
                wrote: w.rv,
                seen,
            });
            true
        });
        if notes.is_empty() {
            map.remove(owner);
        }
        behind.map_or(Ok(()), Err)
    }

    /// The owner is gone.
    pub fn forget(&self, owner: &str) {
        self.lock().remove(owner);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn an_owner_waits_until_each_written_resource_caught_up() {
        let c = Consistency::new();
        c.wrote("ns/web", "pods", Some("10"));
        c.wrote("ns/web", "pods", Some("7"));
        c.wrote("ns/web", "controllerrevisions", Some("12"));
        c.wrote("ns/web", "pods", None);
        let seen = |pods: u64, revs: u64| move |r: &str| if r == "pods" { pods } else { revs };
        assert_eq!(
            c.check("ns/web", seen(9, 11)),
            Err(Behind {
                resource: "pods",
                wrote: 10,
                seen: 9
            })
        );
        assert!(c.check("ns/web", seen(10, 11)).is_err());
        // Pods confirmed: only the revision note is left.
        assert!(c.check("ns/web", seen(0, 12)).is_ok());
        assert!(c.check("ns/other", seen(0, 0)).is_ok());
    }

    #[tokio::test(start_paused = true)]
    async fn an_unconfirmed_write_stops_holding_its_owner_back() {
        let c = Consistency::new();
        c.wrote("ns/web", "pods", Some("10"));
        assert!(c.check("ns/web", |_| 0).is_err());
        tokio::time::advance(GIVE_UP).await;
        assert!(c.check("ns/web", |_| 0).is_ok());
        c.wrote("ns/web", "pods", Some("11"));
        c.forget("ns/web");
        assert!(c.check("ns/web", |_| 0).is_ok());
    }
}
