//! Bounds on the secure port's connections, so that no peer can hold the port: a TLS handshake
//! (10 s), a request's headers (32 s, kube-apiserver's; hyper also applies it to an HTTP/1.1
//! connection waiting for its next request) and a connection with nothing in flight (90 s, for
//! HTTP/2) each get a deadline, and the number of open connections is capped. At the cap a new
//! connection takes the place of the one idle longest, one that never served a request first, so
//! a flood of idle or half-sent connections cannot lock out the kubelet's probes or a scrape; it
//! is refused only when every open connection is serving a request.

use crate::meta::clock::far_or;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

/// The deadlines and the cap. `Default` is what the secure port uses.
#[derive(Clone, Copy, Debug)]
pub struct Limits {
    /// Open connections at most (a TLS connection with hyper's buffers costs tens of KiB).
    pub max: usize,
    pub handshake: Duration,
    /// From the connection's first byte (or the end of its previous request) to its headers.
    pub header_read: Duration,
    /// A connection with no request in flight is closed after this long.
    pub idle: Duration,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max: 512,
            handshake: Duration::from_secs(10),
            header_read: Duration::from_secs(32),
            idle: Duration::from_secs(90),
        }
    }
}

struct Entry {
    /// When the connection was accepted or last finished a request.
    since: Instant,
    /// Whether it ever served a request: one that never did (a flood's, a slow handshake's)
    /// makes way before a scraper's keep-alive connection.
    served: bool,
    /// Requests in flight.
    busy: usize,
    close: CancellationToken,
}

/// The open connections of one listener.
pub struct Connections {
    limits: Limits,
    open: Mutex<HashMap<u64, Entry>>,
    next: AtomicU64,
}

/// One admitted connection; dropping it forgets the connection.
pub struct Conn {
    id: u64,
    set: Arc<Connections>,
    /// Cancelled when a newer connection takes this one's place.
    pub close: CancellationToken,
}

/// A request in flight on a [`Conn`]; while one exists the connection is neither idle nor
/// evictable.
pub struct Busy {
    id: u64,
    set: Arc<Connections>,
}

impl Connections {
    pub fn new(limits: Limits) -> Arc<Connections> {
        Arc::new(Connections {
            limits,
            open: Mutex::new(HashMap::new()),
            next: AtomicU64::new(0),
        })
    }

    pub fn limits(&self) -> Limits {
        self.limits
    }

    pub fn len(&self) -> usize {
        crate::lock(&self.open).len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Admits a new connection, closing the longest-idle one when at the cap; `None` when every
    /// open connection has a request in flight.
    pub fn admit(self: &Arc<Self>) -> Option<Conn> {
        let mut open = crate::lock(&self.open);
        if open.len() >= self.limits.max {
            let oldest = open
                .iter()
                .filter(|(_, e)| e.busy == 0)
                .min_by_key(|(_, e)| (e.served, e.since))
                .map(|(id, _)| *id)?;
            if let Some(e) = open.remove(&oldest) {
                e.close.cancel();
            }
        }
        let id = self.next.fetch_add(1, Ordering::Relaxed);
        let close = CancellationToken::new();
        open.insert(
            id,
            Entry {
                since: Instant::now(),
                served: false,
                busy: 0,
                close: close.clone(),
            },
        );
        Some(Conn {
            id,
            set: Arc::clone(self),
            close,
        })
    }
}

impl Conn {
    pub fn limits(&self) -> Limits {
        self.set.limits
    }

    /// Marks a request in flight until the returned guard is dropped.
    pub fn begin(&self) -> Busy {
        if let Some(e) = crate::lock(&self.set.open).get_mut(&self.id) {
            e.busy += 1;
            e.served = true;
        }
        Busy {
            id: self.id,
            set: Arc::clone(&self.set),
        }
    }

    /// When this connection becomes closable for idleness: `None` while a request is in flight
    /// (or once it has been evicted: `close` says so).
    pub fn idle_deadline(&self) -> Option<Instant> {
        let open = crate::lock(&self.set.open);
        let e = open.get(&self.id)?;
        (e.busy == 0).then(|| far_or(e.since, self.set.limits.idle))
    }

    /// Closes the connection once it has been idle for the limit or is evicted.
    pub async fn idle_or_evicted(&self) {
        loop {
            let wake = match self.idle_deadline() {
                Some(deadline) if deadline <= Instant::now() => return,
                Some(deadline) => deadline,
                // Busy: look again after a full idle period at the latest.
                None => far_or(Instant::now(), self.set.limits.idle),
            };
            tokio::select! {
                _ = self.close.cancelled() => return,
                _ = tokio::time::sleep_until(wake) => {}
            }
        }
    }
}

impl Drop for Conn {
    fn drop(&mut self) {
        crate::lock(&self.set.open).remove(&self.id);
    }
}

impl Drop for Busy {
    fn drop(&mut self) {
        if let Some(e) = crate::lock(&self.set.open).get_mut(&self.id) {
            e.busy = e.busy.saturating_sub(1);
            e.since = Instant::now();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limits(max: usize) -> Limits {
        Limits {
            max,
            ..Limits::default()
        }
    }

    #[tokio::test(start_paused = true)]
    async fn at_the_cap_the_longest_idle_connection_gives_way() {
        let set = Connections::new(limits(2));
        let first = set.admit().unwrap();
        tokio::time::advance(Duration::from_secs(1)).await;
        let second = set.admit().unwrap();
        let third = set.admit().unwrap();
        assert!(first.close.is_cancelled(), "the oldest idle one is closed");
        assert!(!second.close.is_cancelled() && !third.close.is_cancelled());
        assert_eq!(set.len(), 2);
    }

    #[tokio::test(start_paused = true)]
    async fn a_connection_that_never_served_makes_way_before_a_scrapers() {
        let set = Connections::new(limits(2));
        let scraper = set.admit().unwrap();
        drop(scraper.begin());
        tokio::time::advance(Duration::from_secs(1)).await;
        let junk = set.admit().unwrap();
        let _new = set.admit().unwrap();
        assert!(junk.close.is_cancelled() && !scraper.close.is_cancelled());
    }

    #[tokio::test(start_paused = true)]
    async fn a_connection_serving_a_request_is_never_evicted() {
        let set = Connections::new(limits(2));
        let a = set.admit().unwrap();
        let b = set.admit().unwrap();
        let (_ra, _rb) = (a.begin(), b.begin());
        assert!(set.admit().is_none(), "all busy: the newcomer is refused");
        drop(_rb);
        let c = set.admit().unwrap();
        assert!(b.close.is_cancelled() && !a.close.is_cancelled());
        drop(c);
        assert_eq!(set.len(), 1);
    }

    #[tokio::test(start_paused = true)]
    async fn idle_is_counted_from_the_end_of_the_last_request() {
        let set = Connections::new(limits(8));
        let conn = set.admit().unwrap();
        let idle = set.limits().idle;
        tokio::time::advance(idle / 2).await;
        drop(conn.begin());
        let started = Instant::now();
        conn.idle_or_evicted().await;
        assert_eq!(Instant::now() - started, idle);
    }

    #[tokio::test(start_paused = true)]
    async fn an_evicted_connection_closes_at_once() {
        let set = Connections::new(limits(1));
        let old = set.admit().unwrap();
        let _new = set.admit().unwrap();
        let started = Instant::now();
        old.idle_or_evicted().await;
        assert_eq!(Instant::now(), started);
        assert_eq!(set.len(), 1, "the evicted one no longer counts");
    }
}
