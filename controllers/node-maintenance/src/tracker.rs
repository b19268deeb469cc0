//! NM-13's "eviction state is shared per pod UID across the node's objects": one record per pod
//! the controller tries to evict, whichever object asked, so overlapping objects never evict a
//! pod twice and share its backoff. A record is claimed for the duration of one request.

use crate::types::{EvictionMethod, TargetState};
use k8s_openapi::jiff::Timestamp;
use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

/// A gone pod's record is kept this long (objects that target it count it as evicted).
const KEEP_GONE: Duration = Duration::from_secs(600);

#[derive(Clone, Debug, PartialEq)]
pub struct PodRecord {
    pub namespace: String,
    pub name: String,
    pub node: String,
    /// Pending, Blocked or Terminating (accepted); Gone once the pod left.
    pub state: TargetState,
    pub method: Option<EvictionMethod>,
    pub blocked_reason: Option<&'static str>,
    pub pdb: Option<String>,
    pub message: Option<String>,
    pub attempts: i64,
    /// Consecutive failures, for the backoff (reset by budget changes, NM-16).
    pub failures: u32,
    pub first_attempt: Option<Timestamp>,
    pub last_attempt: Option<Timestamp>,
    pub next_attempt: Option<Timestamp>,
    /// A request for this pod is under way.
    pub in_flight: bool,
    /// `TargetedByNodeMaintenance=True` written with this message.
    pub condition_message: Option<String>,
    pub condition_failures: u32,
    /// NM-17: the last `EvictionBlocked` warning.
    pub last_blocked_event: Option<Timestamp>,
    /// NM-18: a DELETE was refused (no RBAC, a webhook): eviction goes on, as with `Wait`.
    pub delete_denied: bool,
    /// NM-18: failed DELETEs and when the next may go. Deletions have their own backoff: the
    /// first one goes at the deadline, whatever the evictions' backoff says.
    pub delete_failures: u32,
    pub next_delete: Option<Timestamp>,
    pub gone_at: Option<Timestamp>,
}

impl PodRecord {
    pub fn new(namespace: &str, name: &str, node: &str) -> PodRecord {
        PodRecord {
            namespace: namespace.into(),
            name: name.into(),
            node: node.into(),
            state: TargetState::Pending,
            method: None,
            blocked_reason: None,
            pdb: None,
            message: None,
            attempts: 0,
            failures: 0,
            first_attempt: None,
            last_attempt: None,
            next_attempt: None,
            in_flight: false,
            condition_message: None,
            condition_failures: 0,
            last_blocked_event: None,
            delete_denied: false,
            delete_failures: 0,
            next_delete: None,
            gone_at: None,
        }
    }

    pub fn key(&self) -> String {
        format!("{}/{}", self.namespace, self.name)
    }

    /// Due for an attempt: not accepted, not in flight, past its backoff.
    pub fn due(&self, now: Timestamp) -> bool {
        !self.in_flight
            && self.method.is_none()
            && matches!(self.state, TargetState::Pending | TargetState::Blocked)
            && self.next_attempt.is_none_or(|t| t <= now)
    }

    /// NM-18: whether a DELETE may go now (its own backoff, not the evictions').
    pub fn delete_due(&self, now: Timestamp) -> bool {
        !self.in_flight
            && self.method.is_none()
            && matches!(self.state, TargetState::Pending | TargetState::Blocked)
            && self.next_delete.is_none_or(|t| t <= now)
    }
}

/// A pod claimed for one request; released on drop.
pub struct Claim<'a> {
    tracker: &'a Tracker,
    uid: String,
}

impl Drop for Claim<'_> {
    fn drop(&mut self) {
        self.tracker.release(&self.uid);
    }
}

#[derive(Default)]
pub struct Tracker {
    pods: Mutex<HashMap<String, PodRecord>>,
}

impl Tracker {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, PodRecord>> {
        shared::lock(&self.pods)
    }

    pub fn get(&self, uid: &str) -> Option<PodRecord> {
        self.lock().get(uid).cloned()
    }

    /// The record of `uid`, created if new (a restart rebuilds it from an object's status).
    pub fn ensure(&self, uid: &str, make: impl FnOnce() -> PodRecord) -> PodRecord {
        self.lock()
            .entry(uid.to_string())
            .or_insert_with(make)
            .clone()
    }

    pub fn update<T>(&self, uid: &str, f: impl FnOnce(&mut PodRecord) -> T) -> Option<T> {
        self.lock().get_mut(uid).map(f)
    }

    /// Claims `uid` for one request if it is due; the claim ends when the guard drops (also on
    /// a panic or a dropped future), so a pod is never left claimed.
    pub fn claim(&self, uid: &str, now: Timestamp) -> Option<Claim<'_>> {
        match self.lock().get_mut(uid) {
            Some(r) if r.due(now) => {
                r.in_flight = true;
                Some(Claim {
                    tracker: self,
                    uid: uid.to_string(),
                })
            }
            _ => None,
        }
    }

    /// As [`Tracker::claim`], for an NM-18 deletion.
    pub fn claim_delete(&self, uid: &str, now: Timestamp) -> Option<Claim<'_>> {
        match self.lock().get_mut(uid) {
            Some(r) if r.delete_due(now) => {
                r.in_flight = true;
                Some(Claim {
                    tracker: self,
                    uid: uid.to_string(),
                })
            }
            _ => None,
        }
    }

    pub fn release(&self, uid: &str) {
        if let Some(r) = self.lock().get_mut(uid) {
            r.in_flight = false;
        }
    }

    /// The pod left the API: its record says Gone and is forgotten after a while.
    pub fn pod_gone(&self, uid: &str, now: Timestamp) {
        let mut pods = self.lock();
        if let Some(r) = pods.get_mut(uid) {
            r.state = TargetState::Gone;
            r.gone_at.get_or_insert(now);
        }
        pods.retain(|_, r| {
            r.gone_at
                .is_none_or(|t| now.duration_since(t).as_secs() < KEEP_GONE.as_secs() as i64)
        });
    }

    /// NM-16: a budget of `namespace` changed so that it may allow evictions: the backoff of
    /// the blocked pods `blocks` picks is reset. Returns their nodes.
    pub fn reset_blocked(
        &self,
        namespace: &str,
        blocks: impl Fn(&str, &PodRecord) -> bool,
    ) -> Vec<String> {
        let mut nodes = Vec::new();
        for (uid, r) in self.lock().iter_mut() {
            if r.namespace == namespace && r.state == TargetState::Blocked && blocks(uid, r) {
                r.failures = 0;
                r.next_attempt = None;
                if !nodes.contains(&r.node) {
                    nodes.push(r.node.clone());
                }
            }
        }
        nodes
    }

    pub fn len(&self) -> usize {
        self.lock().len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(s: i64) -> Timestamp {
        Timestamp::from_second(1_000_000 + s).unwrap()
    }

    #[test]
    fn nm_13_one_request_per_pod_at_a_time_and_never_after_acceptance() {
        let tr = Tracker::default();
        tr.ensure("u", || PodRecord::new("ns", "p", "w1"));
        let claim = tr.claim("u", t(0));
        assert!(claim.is_some());
        assert!(
            tr.claim("u", t(0)).is_none(),
            "a second object must not evict the same pod"
        );
        drop(claim);
        assert!(
            tr.claim("u", t(0)).is_some(),
            "released when the claim drops"
        );
        let claim = tr.claim("u", t(0));
        tr.update("u", |r| {
            r.method = Some(EvictionMethod::Eviction);
            r.state = TargetState::Terminating;
        });
        drop(claim);
        assert!(tr.claim("u", t(100)).is_none(), "accepted: never again");
    }

    #[test]
    fn nm_16_budget_changes_reset_the_backoff_of_what_they_block() {
        let tr = Tracker::default();
        for (uid, ns) in [("a", "shop"), ("b", "shop"), ("c", "other")] {
            tr.ensure(uid, || PodRecord::new(ns, uid, "w1"));
            tr.update(uid, |r| {
                r.state = TargetState::Blocked;
                r.failures = 4;
                r.next_attempt = Some(t(300));
                r.pdb = Some("db-pdb".into());
            });
        }
        assert!(tr.claim("a", t(10)).is_none());
        let nodes = tr.reset_blocked("shop", |uid, _| uid == "a");
        assert_eq!(nodes, ["w1"]);
        assert!(tr.claim("a", t(10)).is_some());
        assert!(tr.claim("b", t(10)).is_none());
        assert!(tr.claim("c", t(10)).is_none());
    }

    #[test]
    fn gone_records_are_forgotten_later() {
        let tr = Tracker::default();
        tr.ensure("a", || PodRecord::new("ns", "a", "w1"));
        tr.pod_gone("a", t(0));
        assert_eq!(tr.get("a").unwrap().state, TargetState::Gone);
        tr.pod_gone("zzz", t(601));
        assert!(tr.is_empty());
    }
}
