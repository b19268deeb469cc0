//! Lease-based leader election with client-go's semantics, written here because the available
//! crates either never step down or acquire without a precondition.
//!
//! - Every write is an update conditional on the resourceVersion last read (or a create when the
//!   Lease is missing), so two candidates can never both win.
//! - Expiry is judged on this process's monotonic clock: a lease held by someone else is valid
//!   until `leaseDurationSeconds` after the moment *we* last saw its record change. Wall clocks of
//!   other machines never matter.
//! - While leading, renewals run every retry period; if none succeeds within the renew deadline
//!   (counted from the start of the last successful renewal) leadership is lost. The write fence
//!   closes at that same instant, which is always earlier than any standby can acquire.
//! - A graceful stop releases the Lease (holder cleared, duration 1 s) so a standby takes over at
//!   its next retry.

use crate::api::client::WriteFence;
use crate::meta::clock::jitter;
use crate::metrics::{Metrics, NameLabel};
use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use k8s_openapi::jiff::Timestamp;
use kube::Client;
use kube::api::{Api, PostParams};
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::watch;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

/// client-go's `JitterFactor` for the acquire retry.
pub const JITTER_FACTOR: f64 = 1.2;
/// kube-controller-manager's leader healthz tolerance beyond the lease duration.
pub const HEALTHZ_TOLERANCE: Duration = Duration::from_secs(20);

#[derive(Clone, Debug)]
pub struct ElectionConfig {
    pub namespace: String,
    pub name: String,
    pub identity: String,
    pub lease_duration: Duration,
    pub renew_deadline: Duration,
    pub retry_period: Duration,
}

#[derive(Debug, thiserror::Error)]
pub enum ElectionError {
    #[error("invalid leader election timing: {0}")]
    Config(String),
}

impl ElectionConfig {
    /// client-go's checks: leaseDuration > renewDeadline > JitterFactor * retryPeriod > 0.
    pub fn validate(&self) -> Result<(), ElectionError> {
        let jittered = self.retry_period.mul_f64(JITTER_FACTOR);
        if self.lease_duration <= self.renew_deadline {
            return Err(ElectionError::Config(
                "leaseDuration must be greater than renewDeadline".into(),
            ));
        }
        if self.renew_deadline <= jittered {
            return Err(ElectionError::Config(
                "renewDeadline must be greater than retryPeriod*JitterFactor".into(),
            ));
        }
        if self.retry_period.is_zero() {
            return Err(ElectionError::Config(
                "retryPeriod must be greater than zero".into(),
            ));
        }
        if self.identity.is_empty() {
            return Err(ElectionError::Config("identity must not be empty".into()));
        }
        Ok(())
    }
}

/// `<hostname>_<uuid>`, as kube-controller-manager names its candidates.
pub fn default_identity() -> String {
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .map(|h| h.trim().to_string())
        .filter(|h| !h.is_empty())
        .or_else(|| std::env::var("HOSTNAME").ok())
        .unwrap_or_else(|| "pilothouse".into());
    format!("{host}_{}", uuid::Uuid::new_v4())
}

/// The fields of a Lease that make up the leader record (client-go `LeaderElectionRecord`).
#[derive(Clone, Debug, PartialEq, Eq, Default)]
struct Record {
    holder: String,
    duration_seconds: i32,
    acquire: Option<Timestamp>,
    renew: Option<Timestamp>,
    transitions: i32,
}

impl Record {
    fn from_spec(spec: Option<&LeaseSpec>) -> Record {
        let Some(s) = spec else {
            return Record::default();
        };
        Record {
            holder: s.holder_identity.clone().unwrap_or_default(),
            duration_seconds: s.lease_duration_seconds.unwrap_or(0),
            acquire: s.acquire_time.as_ref().map(|t| t.0),
            renew: s.renew_time.as_ref().map(|t| t.0),
            transitions: s.lease_transitions.unwrap_or(0),
        }
    }

    fn write_into(&self, spec: &mut LeaseSpec) {
        spec.holder_identity = Some(self.holder.clone());
        spec.lease_duration_seconds = Some(self.duration_seconds);
        spec.acquire_time = self.acquire.map(MicroTime);
        spec.renew_time = self.renew.map(MicroTime);
        spec.lease_transitions = Some(self.transitions);
    }
}

#[derive(Debug, Default)]
struct State {
    /// The Lease as last read or written by us (carries the resourceVersion for the next write).
    lease: Option<Lease>,
    observed: Record,
    /// When we last saw the record change (our clock).
    observed_at: Option<Instant>,
    leading: bool,
    /// Start of the last successful acquire or renew.
    renewed_at: Option<Instant>,
}

/// How a leadership term ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Ended {
    /// `stop` was cancelled (before or while leading). Call [`LeaderElector::release`] once the
    /// controllers have drained.
    Stopped,
    /// No renewal succeeded within the renew deadline: the caller must stop acting and exit.
    Lost,
}

#[derive(Debug)]
pub struct LeaderElector {
    api: Api<Lease>,
    config: ElectionConfig,
    state: Mutex<State>,
    leading_tx: watch::Sender<bool>,
    status: Family<NameLabel, Gauge>,
    /// Woken by the lease watch when the holder releases the Lease.
    released: tokio::sync::Notify,
}

impl LeaderElector {
    pub fn new(
        client: Client,
        config: ElectionConfig,
        metrics: &Metrics,
    ) -> Result<Arc<Self>, ElectionError> {
        config.validate()?;
        let status = Family::<NameLabel, Gauge>::default();
        metrics.register(
            "leader_election_master_status",
            "Gauge of if the reporting system is master of the relevant lease, 0 indicates backup, 1 indicates master. 'name' is the string used to identify the lease",
            status.clone(),
        );
        let (leading_tx, _) = watch::channel(false);
        let e = Arc::new(LeaderElector {
            api: Api::namespaced(client, &config.namespace),
            config,
            state: Mutex::new(State::default()),
            leading_tx,
            status,
            released: tokio::sync::Notify::new(),
        });
        e.set_leading(false);
        Ok(e)
    }

    pub fn identity(&self) -> &str {
        &self.config.identity
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        crate::lock(&self.state)
    }

    fn set_leading(&self, leading: bool) {
        self.lock().leading = leading;
        self.status
            .get_or_create(&NameLabel {
                name: self.config.name.clone(),
            })
            .set(i64::from(leading));
        self.leading_tx.send_replace(leading);
    }

    /// Whether this replica currently believes it leads.
    pub fn is_leader(&self) -> bool {
        self.lock().leading
    }

    /// A receiver that flips to true on acquiring and back to false on losing or releasing.
    pub fn subscribe(&self) -> watch::Receiver<bool> {
        self.leading_tx.subscribe()
    }

    /// kube-controller-manager's leader health check: unhealthy when we believe we lead but have
    /// not renewed within lease duration + 20 s.
    pub fn healthy(&self) -> bool {
        let s = self.lock();
        if !s.leading {
            return true;
        }
        s.renewed_at.is_some_and(|t| {
            t.elapsed() <= self.config.lease_duration.saturating_add(HEALTHZ_TOLERANCE)
        })
    }

    fn observe(&self, s: &mut State, lease: Lease, now: Instant) {
        let record = Record::from_spec(lease.spec.as_ref());
        if s.observed_at.is_none() || record != s.observed {
            s.observed = record;
            s.observed_at = Some(now);
        }
        s.lease = Some(lease);
    }

    /// The fast path: we lead and our view of the Lease is still valid, so the renewal is an
    /// update without a GET. False: not leading, or the update failed (re-read the Lease).
    async fn renew_fast(&self, now: Instant, wall: Timestamp, duration_seconds: i32) -> bool {
        let me = &self.config.identity;
        let fast = {
            let s = self.lock();
            let valid = s
                .observed_at
                .is_some_and(|t| now < crate::meta::clock::far_or(t, self.config.lease_duration));
            if s.leading && valid && &s.observed.holder == me {
                s.lease.clone()
            } else {
                None
            }
        };
        if let Some(mut lease) = fast {
            let mut record = self.lock().observed.clone();
            record.renew = Some(wall);
            record.duration_seconds = duration_seconds;
            record.write_into(lease.spec.get_or_insert_with(Default::default));
            match self
                .api
                .replace(&self.config.name, &PostParams::default(), &lease)
                .await
            {
                Ok(updated) => {
                    let mut s = self.lock();
                    self.observe(&mut s, updated, now);
                    s.renewed_at = Some(now);
                    true
                }
                Err(e) => {
                    tracing::info!(error = %e, "lease renewal failed on the fast path; re-reading the lease");
                    false
                }
            }
        } else {
            false
        }
    }

    /// No Lease yet: create it, holding it.
    async fn create_lease(
        &self,
        now: Instant,
        wall: Timestamp,
        me: String,
        duration_seconds: i32,
    ) -> bool {
        let record = Record {
            holder: me,
            duration_seconds,
            acquire: Some(wall),
            renew: Some(wall),
            transitions: 0,
        };
        let mut spec = LeaseSpec::default();
        record.write_into(&mut spec);
        let lease = Lease {
            metadata: ObjectMeta {
                name: Some(self.config.name.clone()),
                namespace: Some(self.config.namespace.clone()),
                ..Default::default()
            },
            spec: Some(spec),
        };
        match self.api.create(&PostParams::default(), &lease).await {
            Ok(created) => {
                let mut s = self.lock();
                self.observe(&mut s, created, now);
                s.renewed_at = Some(now);
                true
            }
            Err(e) => {
                tracing::info!(error = %e, "creating the lease failed");
                false
            }
        }
    }

    /// One attempt (client-go `tryAcquireOrRenew`). Returns whether we hold the Lease now.
    async fn try_acquire_or_renew(&self) -> bool {
        let now = Instant::now();
        let wall = Timestamp::now();
        let me = self.config.identity.clone();
        let duration_seconds = self.config.lease_duration.as_secs().max(1) as i32;

        if self.renew_fast(now, wall, duration_seconds).await {
            return true;
        }

        let current = match self.api.get_opt(&self.config.name).await {
            Ok(l) => l,
            Err(e) => {
                tracing::warn!(error = %e, lease = %self.config.name, "error retrieving lease");
                return false;
            }
        };
        let Some(current) = current else {
            return self.create_lease(now, wall, me, duration_seconds).await;
        };

        let (old, valid) = {
            let mut s = self.lock();
            self.observe(&mut s, current.clone(), now);
            let held_for = Duration::from_secs(s.observed.duration_seconds.max(0) as u64);
            // leaseDurationSeconds is anyone's write: the expiry must not overflow an Instant.
            let valid = s
                .observed_at
                .is_some_and(|t| now < crate::meta::clock::far_or(t, held_for));
            (s.observed.clone(), valid)
        };
        if !old.holder.is_empty() && old.holder != me && valid {
            tracing::trace!(holder = %old.holder, "lease is held by another candidate and has not expired");
            return false;
        }
        let mut record = Record {
            holder: me.clone(),
            duration_seconds,
            acquire: Some(wall),
            renew: Some(wall),
            transitions: old.transitions,
        };
        if old.holder == me {
            record.acquire = old.acquire;
        } else {
            record.transitions = old.transitions + 1;
        }
        let mut lease = current;
        record.write_into(lease.spec.get_or_insert_with(Default::default));
        // `replace` carries metadata.resourceVersion from the GET: a concurrent writer gets 409.
        match self
            .api
            .replace(&self.config.name, &PostParams::default(), &lease)
            .await
        {
            Ok(updated) => {
                let mut s = self.lock();
                self.observe(&mut s, updated, now);
                s.renewed_at = Some(now);
                true
            }
            Err(e) => {
                tracing::info!(error = %e, "failed to update the lease");
                false
            }
        }
    }

    /// Campaigns until leading, then renews until leadership is lost or `stop` is cancelled.
    pub async fn run(self: Arc<Self>, stop: CancellationToken) -> Ended {
        tracing::info!(identity = %self.config.identity, lease = %format!("{}/{}", self.config.namespace, self.config.name), "attempting to acquire leader lease");
        // Standbys also watch the Lease: they see each renewal when it happens (not up to one
        // retry later), so they can try again exactly when it expires, or at once on release.
        let watch_stop = stop.child_token();
        tokio::spawn(Arc::clone(&self).watch_lease(watch_stop.clone()));
        let _stop_watch = watch_stop.drop_guard();
        loop {
            let attempt =
                tokio::time::timeout(self.config.renew_deadline, self.try_acquire_or_renew());
            let acquired = tokio::select! {
                _ = stop.cancelled() => return Ended::Stopped,
                r = attempt => r.unwrap_or(false),
            };
            if acquired {
                break;
            }
            let wait = self.next_attempt_in(jitter(self.config.retry_period, JITTER_FACTOR));
            tokio::select! {
                _ = stop.cancelled() => return Ended::Stopped,
                _ = tokio::time::sleep(wait) => {}
                _ = self.released.notified() => {}
            }
        }
        tracing::info!(identity = %self.config.identity, "successfully acquired lease");
        self.set_leading(true);

        loop {
            tokio::select! {
                _ = stop.cancelled() => return Ended::Stopped,
                _ = tokio::time::sleep(self.config.retry_period) => {}
            }
            if !self.renew_within_deadline(&stop).await {
                if stop.is_cancelled() {
                    return Ended::Stopped;
                }
                tracing::error!(identity = %self.config.identity, "leader election lost: no renewal within the renew deadline");
                self.set_leading(false);
                return Ended::Lost;
            }
        }
    }

    async fn renew_within_deadline(&self, stop: &CancellationToken) -> bool {
        let Some(last) = self.lock().renewed_at else {
            return false;
        };
        let deadline = crate::meta::clock::far_or(last, self.config.renew_deadline);
        loop {
            let now = Instant::now();
            if now >= deadline || stop.is_cancelled() {
                return false;
            }
            let attempt = tokio::time::timeout_at(deadline, self.try_acquire_or_renew());
            if let Ok(true) = attempt.await {
                return true;
            }
            let retry =
                crate::meta::clock::far_or(Instant::now(), self.config.retry_period).min(deadline);
            tokio::select! {
                _ = stop.cancelled() => return false,
                _ = tokio::time::sleep_until(retry) => {}
            }
        }
    }

    /// The wait before the next acquire attempt: the jittered retry period, or less if the lease
    /// we observe expires sooner (plus a small margin so the attempt finds it expired).
    fn next_attempt_in(&self, retry: Duration) -> Duration {
        let s = self.lock();
        let Some(seen) = s.observed_at else {
            return retry;
        };
        if s.observed.holder.is_empty() {
            return retry;
        }
        let expires = crate::meta::clock::far_or(
            seen,
            Duration::from_secs(s.observed.duration_seconds.max(0) as u64),
        );
        retry.min(
            expires
                .saturating_duration_since(Instant::now())
                .saturating_add(Duration::from_millis(20)),
        )
    }

    /// Follows the Lease while standing by. Observations feed the same expiry clock as polls.
    async fn watch_lease(self: Arc<Self>, stop: CancellationToken) {
        use futures::StreamExt;
        use kube::runtime::WatchStreamExt;
        use kube::runtime::watcher::{self, Event};
        let config =
            watcher::Config::default().fields(&format!("metadata.name={}", self.config.name));
        let stream = watcher::watcher(self.api.clone(), config).default_backoff();
        futures::pin_mut!(stream);
        loop {
            let next = tokio::select! {
                _ = stop.cancelled() => return,
                n = stream.next() => n,
            };
            let lease = match next {
                Some(Ok(Event::Apply(l) | Event::InitApply(l))) => l,
                Some(Ok(_)) => continue,
                Some(Err(e)) => {
                    tracing::debug!(error = %e, "lease watch failed; polling continues");
                    continue;
                }
                None => return,
            };
            let released = {
                let mut s = self.lock();
                if s.leading || stop.is_cancelled() {
                    return;
                }
                self.observe(&mut s, lease, Instant::now());
                s.observed.holder.is_empty()
            };
            if released {
                self.released.notify_one();
            }
        }
    }

    /// Gives the Lease up (client-go `release`): holder cleared, duration 1 s, so a standby
    /// acquires at its next retry instead of waiting out the lease duration.
    pub async fn release(&self) -> bool {
        let lease = {
            let s = self.lock();
            if !(s.leading && s.observed.holder == self.config.identity) {
                return true;
            }
            s.lease.clone()
        };
        let Some(mut lease) = lease else { return true };
        let now = Timestamp::now();
        let transitions = self.lock().observed.transitions;
        let record = Record {
            holder: String::new(),
            duration_seconds: 1,
            acquire: Some(now),
            renew: Some(now),
            transitions,
        };
        record.write_into(lease.spec.get_or_insert_with(Default::default));
        self.set_leading(false);
        match tokio::time::timeout(
            self.config.retry_period,
            self.api
                .replace(&self.config.name, &PostParams::default(), &lease),
        )
        .await
        {
            Ok(Ok(_)) => {
                tracing::info!(identity = %self.config.identity, "released leader lease");
                true
            }
            Ok(Err(e)) => {
                tracing::warn!(error = %e, "failed to release the lease");
                false
            }
            Err(_) => {
                tracing::warn!("timed out releasing the lease");
                false
            }
        }
    }
}

impl WriteFence for LeaderElector {
    /// Writes are allowed only while leading and within the renew deadline of the last renewal.
    fn may_write(&self) -> bool {
        let s = self.lock();
        s.leading
            && s.renewed_at
                .is_some_and(|t| t.elapsed() < self.config.renew_deadline)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg(lease: u64, renew: u64, retry: u64) -> ElectionConfig {
        ElectionConfig {
            namespace: "kube-system".into(),
            name: "pilothouse".into(),
            identity: "me".into(),
            lease_duration: Duration::from_secs(lease),
            renew_deadline: Duration::from_secs(renew),
            retry_period: Duration::from_secs(retry),
        }
    }

    #[test]
    fn validation_matches_client_go() {
        assert!(cfg(15, 10, 2).validate().is_ok());
        assert!(cfg(10, 10, 2).validate().is_err());
        assert!(
            cfg(15, 2, 2).validate().is_err(),
            "renewDeadline must exceed 1.2 * retryPeriod"
        );
        assert!(cfg(15, 10, 0).validate().is_err());
        let mut c = cfg(15, 10, 2);
        c.identity.clear();
        assert!(c.validate().is_err());
    }

    #[test]
    fn jitter_stays_in_range() {
        for _ in 0..1000 {
            let j = jitter(Duration::from_secs(2), JITTER_FACTOR);
            assert!(
                j >= Duration::from_secs(2) && j <= Duration::from_millis(4400),
                "{j:?}"
            );
        }
    }

    #[test]
    fn record_roundtrips_through_spec() {
        let r = Record {
            holder: "a".into(),
            duration_seconds: 15,
            acquire: Some(Timestamp::from_second(100).unwrap()),
            renew: Some(Timestamp::from_second(200).unwrap()),
            transitions: 3,
        };
        let mut spec = LeaseSpec::default();
        r.write_into(&mut spec);
        assert_eq!(Record::from_spec(Some(&spec)), r);
        assert_eq!(Record::from_spec(None), Record::default());
    }

    #[test]
    fn identity_is_host_underscore_uuid() {
        let id = default_identity();
        let (host, uuid) = id.rsplit_once('_').unwrap();
        assert!(!host.is_empty());
        assert_eq!(uuid.len(), 36);
    }
}
