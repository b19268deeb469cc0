//! The drain step of stage Drain (NM-9..NM-18), in kubectl drain's terms: select the node's pods
//! ([`classify`]), remember them as targets, evict the current wave through the Eviction API
//! (`evictPods`) or, past a `Delete` deadline, delete them (`DeletePod`), and build the view of
//! every target the status lists. Which conditions and events that view leads to is
//! [`crate::conditions::drain_conditions`]'s to decide; `drain_status` here sets and sends what
//! it returns.

use crate::classify::{self, Class, Consent};
use crate::conditions::{self, DrainStep, EventType};
use crate::evict::{self, Outcome, PdbRef};
use crate::metrics::ObjectLabel;
use crate::status::{self, Entry};
use crate::sync::{NodeMaintenanceController, Target, pod_ref, pod_uid};
use crate::tracker::PodRecord;
use crate::types::*;
use crate::{act, plan};
use futures::StreamExt;
use k8s_openapi::api::core::v1::{ObjectReference, PodCondition};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use shared::cache::informers::INDEX_NAMESPACE;
use shared::cache::pod::INDEX_POD_NODE;
use shared::cache::pod::Pod;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

/// NM-17: `EvictionBlocked` at most once per pod per 5 minutes.
pub const BLOCKED_EVENT_EVERY: i64 = 300;
/// NM-12: after this many failed condition writes, `lastError` says so (eviction goes on).
pub const CONDITION_TRIES: u32 = 3;
/// Evictions (or deletions) of one sync in flight at once.
pub const REQUESTS_AT_ONCE: usize = 16;

pub const REASON_NODE_MAINTENANCE: &str = "NodeMaintenance";
pub const DISRUPTION_TARGET: &str = "DisruptionTarget";
pub const REASON_DELETION: &str = "DeletionByNodeMaintenance";

/// The node's pods that are targets, by UID.
type Present = HashMap<String, Arc<Pod>>;

/// What one drain step found and did, for the status.
pub(crate) struct DrainResult {
    pub(crate) entries: Vec<Entry>,
    pub(crate) skipped: Skipped,
    pub(crate) consent: Option<String>,
    pub(crate) selector_error: Option<String>,
    pub(crate) wake: Option<Timestamp>,
}

impl NodeMaintenanceController {
    /// NM-9..NM-18 for one sync.
    pub(crate) async fn drain(
        &self,
        nm: &Arc<NodeMaintenance>,
        st: &mut NodeMaintenanceStatus,
        now: Timestamp,
    ) -> DrainResult {
        let name = nm.metadata.name.clone().unwrap_or_default();
        let node_name = nm.spec.node_name.clone();
        let drain = &nm.spec.drain;
        let mut result = DrainResult {
            entries: Vec::new(),
            skipped: Skipped::default(),
            consent: None,
            selector_error: None,
            wake: None,
        };
        let pods = self.pods.by_index(INDEX_POD_NODE, &node_name);
        // NM-11.
        let deadline = start(st, pods.len(), drain, now);
        if let Err(e) = classify::validate_selector(drain.pod_selector.as_ref()) {
            result.selector_error = Some(e);
            return result;
        }
        self.restore(&name, &node_name, st);
        let (present, missing) = self.select(&name, &pods, drain, now, &mut result.skipped);
        let targets = self.targets_of(&name);
        // A gone pod's record is dropped after a while (tracker::KEEP_GONE); the status still
        // says how it went, so the count of evicted targets does not fall.
        let stored = nm
            .status
            .as_ref()
            .map(|s| s.targeted_pods.as_slice())
            .unwrap_or_default();
        let stored: HashMap<&str, &TargetedPod> = stored
            .iter()
            .filter_map(|p| Some((p.uid.as_deref()?, p)))
            .collect();
        for (uid, t) in &targets {
            if present.contains_key(uid) {
                self.tracker
                    .ensure(uid, || PodRecord::new(&t.namespace, &t.name, &node_name));
            }
        }
        // Targets go into the status before the first request for them: a leader lost between
        // an accepted eviction and the next status write would otherwise leave its successor
        // no trace of a target whose pod is gone. Beyond the list's cap nothing can be listed.
        let unlisted = stored.len() < status::MAX_TARGETED_PODS
            && present.keys().any(|uid| !stored.contains_key(uid.as_str()));
        // NM-10: all or nothing.
        if !missing.is_empty() {
            result.consent = Some(classify::consent_message(&missing));
        }
        if unlisted {
            result.wake = Some(now);
        } else if result.consent.is_none() {
            self.request(nm, &targets, &present, deadline, now).await;
        }
        self.view(nm, &targets, &present, &stored, &mut result);
        self.warn_shared_deadlocks(nm, &result.entries);
        if let Some(d) = deadline.filter(|d| *d > now) {
            result.wake = earliest(result.wake, Some(d));
        }
        result
    }

    /// NM-9: classifies the node's pods like kubectl (the skipped ones counted in `skipped`)
    /// and remembers the targets; returns the present targets by UID, and those that lack
    /// consent (NM-10).
    fn select(
        &self,
        name: &str,
        pods: &[Arc<Pod>],
        drain: &DrainSpec,
        now: Timestamp,
        skipped: &mut Skipped,
    ) -> (Present, Vec<(Consent, String)>) {
        let ds_exists = |ns: &str, n: &str| self.daemonsets.get(&format!("{ns}/{n}")).is_some();
        let mut present: Present = HashMap::new();
        let mut missing: Vec<(Consent, String)> = Vec::new();
        let mut mem = self.memory();
        let m = mem.entry(name.to_string()).or_default();
        for pod in pods {
            let uid = pod_uid(pod).to_string();
            match classify::classify(pod, drain, ds_exists, now) {
                Class::Gone => {}
                Class::SkippedDaemonSet => skipped.daemon_set += 1,
                Class::SkippedMirror => skipped.mirror += 1,
                Class::SkippedNotSelected => skipped.not_selected += 1,
                Class::Target { consent } => {
                    if let Some(c) = consent {
                        missing.push((c, pod.key().into_owned()));
                    }
                    // The present pod is the truth (a target restored from the status
                    // knows neither its priority nor its creation time).
                    let target = Target {
                        namespace: pod.metadata.namespace.clone().unwrap_or_default(),
                        name: pod.metadata.name.clone().unwrap_or_default(),
                        created: pod.metadata.creation_timestamp.as_ref().map(|t| t.0),
                        priority: pod.spec.as_ref().and_then(|s| s.priority),
                    };
                    m.targets.insert(uid.clone(), target);
                    present.insert(uid, Arc::clone(pod));
                }
            }
        }
        (present, missing)
    }

    /// NM-13, NM-18: the requests of one sync to the current wave's present, not terminating
    /// targets: evictions, or past a `Delete` deadline deletions (unless refused for good).
    async fn request(
        &self,
        nm: &NodeMaintenance,
        targets: &[(String, Target)],
        present: &Present,
        deadline: Option<Timestamp>,
        now: Timestamp,
    ) {
        let drain = &nm.spec.drain;
        // Waves over targets not gone (NM-13).
        let not_gone = |uid: &str| present.contains_key(uid);
        let wave = plan::current_wave(
            targets
                .iter()
                .filter(|(u, _)| not_gone(u))
                .map(|(_, t)| plan::wave(drain.ordering, t.priority)),
        );
        let past_deadline = deadline.is_some_and(|d| now >= d);
        let escalate = past_deadline && drain.timeout_policy == TimeoutPolicy::Delete;
        let message = self.targeted_message(&nm.spec.node_name);
        let eligible: Vec<(&String, &Arc<Pod>)> = targets
            .iter()
            .filter(|(_, t)| Some(plan::wave(drain.ordering, t.priority)) == wave)
            .filter_map(|(uid, _)| present.get(uid).map(|p| (uid, p)))
            .filter(|(_, p)| !classify::is_terminating(p))
            .collect();
        // Requests of one sync go out side by side (the client's budget paces them).
        futures::stream::iter(eligible)
            .for_each_concurrent(REQUESTS_AT_ONCE, |(uid, pod)| {
                let message = &message;
                async move {
                    let denied = self.tracker.get(uid).is_some_and(|r| r.delete_denied);
                    if escalate && !denied {
                        self.delete_one(nm, pod, uid, now).await;
                    } else {
                        self.evict_one(nm, pod, uid, message, now).await;
                    }
                }
            })
            .await;
    }

    /// The view of every target, for the status: its state (NM-15: gone, terminating, blocked
    /// or pending) and attempts, from the tracker's record (else the status's); wakes at a
    /// target's next attempt, or when kubectl's skip-wait would count a terminating pod gone.
    fn view(
        &self,
        nm: &NodeMaintenance,
        targets: &[(String, Target)],
        present: &Present,
        stored: &HashMap<&str, &TargetedPod>,
        result: &mut DrainResult,
    ) {
        let node_name = &nm.spec.node_name;
        let drain = &nm.spec.drain;
        for (uid, t) in targets {
            let rec = self
                .tracker
                .get(uid)
                .or_else(|| stored.get(uid.as_str()).map(|p| record_from(p, node_name)));
            let pod = present.get(uid);
            let state = match (pod, &rec) {
                (None, _) => TargetState::Gone,
                (Some(p), _) if classify::is_terminating(p) => TargetState::Terminating,
                (Some(_), Some(r)) if r.method.is_some() => TargetState::Terminating,
                (Some(_), Some(r)) if r.state == TargetState::Blocked => TargetState::Blocked,
                _ => TargetState::Pending,
            };
            if let (Some(p), Some(limit)) = (pod, drain.skip_wait_for_delete_timeout_seconds)
                && let Some(dt) = &p.metadata.deletion_timestamp
            {
                // Wake when kubectl's skip-wait would count it gone.
                let at =
                    dt.0.checked_add(SignedDuration::from_secs(limit.max(0).saturating_add(1)))
                        .unwrap_or(Timestamp::MAX);
                result.wake = earliest(result.wake, Some(at));
            }
            if matches!(state, TargetState::Pending | TargetState::Blocked)
                && let Some(r) = &rec
                && result.consent.is_none()
            {
                result.wake = earliest(result.wake, r.next_attempt);
            }
            let r = rec.unwrap_or_else(|| PodRecord::new(&t.namespace, &t.name, node_name));
            let blocked = state == TargetState::Blocked;
            result.entries.push(Entry {
                created: t.created,
                pod: TargetedPod {
                    namespace: t.namespace.clone(),
                    name: t.name.clone(),
                    uid: Some(uid.clone()),
                    state,
                    method: r.method,
                    blocked_reason: r.blocked_reason.filter(|_| blocked).map(Into::into),
                    pod_disruption_budget: r.pdb.clone().filter(|_| blocked),
                    message: r.message.clone().filter(|_| blocked),
                    attempts: r.attempts,
                    first_attempt_time: r.first_attempt.map(Time),
                    last_attempt_time: r.last_attempt.map(Time),
                    next_attempt_time: r
                        .next_attempt
                        .filter(|_| matches!(state, TargetState::Pending | TargetState::Blocked))
                        .map(Time),
                },
            });
        }
    }

    /// After a restart: the targets the status lists (their pods may be gone since).
    pub(crate) fn restore(&self, name: &str, node: &str, st: &NodeMaintenanceStatus) {
        let mut mem = self.memory();
        let m = mem.entry(name.to_string()).or_default();
        if std::mem::replace(&mut m.restored, true) {
            return;
        }
        for p in &st.targeted_pods {
            let Some(uid) = p.uid.clone() else { continue };
            m.targets.entry(uid.clone()).or_insert_with(|| Target {
                namespace: p.namespace.clone(),
                name: p.name.clone(),
                created: p.first_attempt_time.as_ref().map(|t| t.0),
                priority: None,
            });
            self.tracker.ensure(&uid, || record_from(p, node));
        }
    }

    /// A snapshot of the object's targets.
    pub(crate) fn targets_of(&self, name: &str) -> Vec<(String, Target)> {
        self.memory()
            .get(name)
            .map(|m| {
                m.targets
                    .iter()
                    .map(|(k, v)| (k.clone(), v.clone()))
                    .collect()
            })
            .unwrap_or_default()
    }

    /// NM-12: the message naming every active object on the node, oldest first.
    fn targeted_message(&self, node: &str) -> String {
        let mut objs: Vec<Arc<NodeMaintenance>> = self
            .on_node(node)
            .into_iter()
            .filter(|o| plan::is_active(o))
            .collect();
        objs.sort_by(|a, b| plan::oldest_first(a, b));
        plan::targeted_message(&objs.iter().map(|o| o.as_ref()).collect::<Vec<_>>())
    }

    fn note_error(&self, nm: &NodeMaintenance, e: String) {
        if let Some(m) = self
            .memory()
            .get_mut(nm.metadata.name.as_deref().unwrap_or_default())
        {
            m.last_error = Some(e);
        }
    }

    /// NM-12: `TargetedByNodeMaintenance=True` before the first attempt (and when the message
    /// changes); a failed write never blocks the eviction.
    async fn mark_targeted(
        &self,
        nm: &NodeMaintenance,
        pod: &Pod,
        uid: &str,
        message: &str,
        now: Timestamp,
    ) {
        let have = pod
            .condition(POD_CONDITION_TARGETED)
            .is_some_and(|c| c.status == "True" && c.message.as_deref() == Some(message));
        let written = self
            .tracker
            .get(uid)
            .and_then(|r| r.condition_message)
            .as_deref()
            == Some(message);
        if have || written {
            return;
        }
        let (ns, name) = (
            pod.metadata.namespace.as_deref().unwrap_or_default(),
            pod.metadata.name.as_deref().unwrap_or_default(),
        );
        let cond = true_condition(
            pod,
            POD_CONDITION_TARGETED,
            REASON_NODE_MAINTENANCE,
            message.to_string(),
            now,
        );
        match act::set_pod_condition(&self.writer, ns, name, uid, &cond).await {
            Ok(()) => {
                self.tracker.update(uid, |r| {
                    r.condition_message = Some(message.to_string());
                    r.condition_failures = 0;
                });
            }
            Err(e) => {
                let failures = self.tracker.update(uid, |r| {
                    r.condition_failures = r.condition_failures.saturating_add(1);
                    r.condition_failures
                });
                tracing::warn!(pod = %pod.key(), error = %e, "writing the TargetedByNodeMaintenance condition failed");
                if failures.unwrap_or(0) >= CONDITION_TRIES {
                    self.note_error(
                        nm,
                        format!(
                            "writing condition {POD_CONDITION_TARGETED} on pod {}: {}",
                            pod.key(),
                            shared::api::apierr::message(&e)
                        ),
                    );
                }
            }
        }
    }

    /// NM-13..NM-17: one eviction attempt, if the pod is due and nobody else is at it.
    async fn evict_one(
        &self,
        nm: &NodeMaintenance,
        pod: &Pod,
        uid: &str,
        message: &str,
        now: Timestamp,
    ) {
        let Some(_claim) = self.tracker.claim(uid, now) else {
            return;
        };
        self.mark_targeted(nm, pod, uid, message, now).await;
        let (ns, name) = (
            pod.metadata.namespace.clone().unwrap_or_default(),
            pod.metadata.name.clone().unwrap_or_default(),
        );
        let response = act::evict(
            &self.writer,
            &ns,
            &name,
            uid,
            nm.spec.drain.grace_period_seconds,
        )
        .await;
        let outcome = evict::classify_response(&response);
        if let Outcome::MultipleBudgets { .. } = &outcome {
            // NB-10, NM-13: which wire form the API server used (unverified: a 201 with the Failure
            // body, or an HTTP 500 with it, as docs/rules.md reads upstream's code).
            let wire = match &response {
                Ok(_) => "2xx with a Failure Status body".to_string(),
                Err(e) => format!("error {}", shared::api::apierr::error_reason(e)),
            };
            tracing::info!(pod = %pod.key(), %wire, "eviction refused: the pod has more than one PodDisruptionBudget");
        }
        let now = self.clock.now();
        let obj_ref = shared::meta::refs::object_reference(nm);
        let verdict = self.verdict(nm, pod, uid, &outcome, &obj_ref);
        self.metrics.eviction(verdict.label);
        let terminating = classify::is_terminating(pod);
        let events = self.tracker.update(uid, |r| {
            record_attempt(r, &outcome, &verdict, terminating, now)
        });
        self.warn_blocked(nm, pod, uid, &verdict, events, &obj_ref);
    }

    /// What an eviction's answer means for its target: NM-13 (accepted: `Evicted` on the pod
    /// and the object), NM-16 and NM-17 (which budget blocks it, and whether it is a deadlock),
    /// and a refusal or a failure noted in `lastError`.
    fn verdict(
        &self,
        nm: &NodeMaintenance,
        pod: &Pod,
        uid: &str,
        outcome: &Outcome,
        obj_ref: &ObjectReference,
    ) -> Verdict {
        let (ns, name) = (
            pod.metadata.namespace.clone().unwrap_or_default(),
            pod.metadata.name.clone().unwrap_or_default(),
        );
        let key = pod.key().into_owned();
        let mut verdict = Verdict {
            label: outcome.result_label(),
            reason: None,
            pdb: None,
            text: None,
            retry: None,
        };
        match outcome {
            Outcome::Accepted => {
                self.events.normal(
                    &pod_ref(&ns, &name, uid),
                    "Evicted",
                    "Evict",
                    format!(
                        "Evicted by NodeMaintenance {}",
                        nm.metadata.name.as_deref().unwrap_or_default()
                    ),
                );
                self.events
                    .normal(obj_ref, "Evicted", "Evict", format!("Evicted pod {key}"));
            }
            Outcome::Gone | Outcome::NamespaceTerminating { .. } => {}
            Outcome::Throttled { retry_after } => verdict.retry = Some(*retry_after),
            Outcome::Budget {
                pdb,
                message: cause,
                processing,
            } => self.budget_verdict(&ns, pod, pdb.as_deref(), cause, *processing, &mut verdict),
            Outcome::MultipleBudgets { message: m } => {
                let names: Vec<String> = self
                    .pdbs
                    .by_index(INDEX_NAMESPACE, &ns)
                    .into_iter()
                    .filter(|p| evict::pdb_matches(p, pod))
                    .filter_map(|p| p.metadata.name.clone())
                    .collect();
                verdict.text = Some(if names.is_empty() {
                    format!("blocked by more than one PodDisruptionBudget: {m}")
                } else {
                    format!(
                        "blocked by more than one PodDisruptionBudget ({})",
                        names.join(", ")
                    )
                });
                verdict.reason = Some(evict::REASON_MULTIPLE);
                verdict.pdb = (!names.is_empty()).then(|| names.join(","));
            }
            Outcome::Denied { message: m } => {
                self.note_error(nm, format!("evicting pod {key}: {m}"));
                verdict.reason = Some(evict::REASON_DENIED);
                verdict.text = Some(format!("eviction denied: {m}"));
            }
            Outcome::Error { message: m } => {
                self.note_error(nm, format!("evicting pod {key}: {m}"));
                verdict.reason = Some(evict::REASON_ERROR);
                verdict.text = Some(format!("eviction failed: {m}"));
            }
        }
        verdict
    }

    /// NM-16, NM-17: the budget that blocks the pod, named from the cache (else the answer's
    /// cause), and whether it can never allow the eviction.
    fn budget_verdict(
        &self,
        ns: &str,
        pod: &Pod,
        pdb: Option<&str>,
        cause: &str,
        processing: bool,
        verdict: &mut Verdict,
    ) {
        let matching: Vec<Arc<PodDisruptionBudget>> = self
            .pdbs
            .by_index(INDEX_NAMESPACE, ns)
            .into_iter()
            .filter(|p| evict::pdb_matches(p, pod))
            .collect();
        let found = evict::blocking_pdb(&matching, pdb);
        let deadlock = found.as_ref().is_some_and(PdbRef::deadlocked);
        if deadlock {
            verdict.label = "pdb_deadlock";
        }
        verdict.text = Some(match &found {
            Some(p) => p.describe(),
            None => format!("blocked by a PodDisruptionBudget: {cause}"),
        });
        verdict.retry = processing.then_some(evict::PROCESSING_RETRY);
        verdict.reason = Some(if deadlock {
            evict::REASON_DEADLOCK
        } else {
            evict::REASON_PDB
        });
        verdict.pdb = found.map(|p| p.name);
    }

    /// NM-17: `DrainDeadlocked` once per (object, budget), on the object and the pod; other
    /// blocks `EvictionBlocked` on the object, at most once per pod per 5 minutes. `events` is
    /// what [`record_attempt`] decided.
    fn warn_blocked(
        &self,
        nm: &NodeMaintenance,
        pod: &Pod,
        uid: &str,
        verdict: &Verdict,
        events: Option<(bool, bool)>,
        obj_ref: &ObjectReference,
    ) {
        let (ns, name) = (
            pod.metadata.namespace.clone().unwrap_or_default(),
            pod.metadata.name.clone().unwrap_or_default(),
        );
        let key = pod.key().into_owned();
        let msg = format!("pod {key} {}", verdict.text.clone().unwrap_or_default());
        let deadlock_first = matches!(events, Some((true, _)))
            && self
                .memory()
                .get_mut(nm.metadata.name.as_deref().unwrap_or_default())
                .is_some_and(|m| {
                    m.deadlock_warned
                        .insert(verdict.pdb.clone().unwrap_or_default())
                });
        match events {
            Some((true, _)) if !deadlock_first => {}
            Some((true, _)) => {
                self.events
                    .warning(obj_ref, "DrainDeadlocked", "Evict", &msg);
                self.events
                    .warning(&pod_ref(&ns, &name, uid), "DrainDeadlocked", "Evict", &msg);
            }
            Some((_, true)) => self
                .events
                .warning(obj_ref, "EvictionBlocked", "Evict", &msg),
            _ => {}
        }
    }

    /// NM-17 for a pod two objects target: the attempts are shared (one record per pod), so the
    /// object whose status shows a deadlock found by the other's attempt warns too, once per
    /// budget, on itself (the pod was warned by the attempt).
    fn warn_shared_deadlocks(&self, nm: &NodeMaintenance, entries: &[crate::status::Entry]) {
        let name = nm.metadata.name.as_deref().unwrap_or_default();
        let fresh: Vec<&TargetedPod> = {
            let mut mem = self.memory();
            let m = mem.entry(name.to_string()).or_default();
            entries
                .iter()
                .map(|e| &e.pod)
                .filter(|p| p.blocked_reason.as_deref() == Some(evict::REASON_DEADLOCK))
                .filter(|p| {
                    m.deadlock_warned
                        .insert(p.pod_disruption_budget.clone().unwrap_or_default())
                })
                .collect()
        };
        if fresh.is_empty() {
            return;
        }
        let obj_ref = shared::meta::refs::object_reference(nm);
        for p in fresh {
            let msg = format!(
                "pod {}/{} {}",
                p.namespace,
                p.name,
                p.message.clone().unwrap_or_default()
            );
            self.events
                .warning(&obj_ref, "DrainDeadlocked", "Evict", &msg);
        }
    }

    /// NM-18 `Delete`: past the deadline a Pending or Blocked target gets `DisruptionTarget` and
    /// a DELETE with its UID precondition, bypassing its budget.
    async fn delete_one(&self, nm: &NodeMaintenance, pod: &Pod, uid: &str, now: Timestamp) {
        // The first DELETE goes at the deadline; a failed one is retried on a backoff of its own
        // (NM-14's 5 s doubling), not on the evictions' (which may be minutes long by then).
        let Some(_claim) = self.tracker.claim_delete(uid, now) else {
            return;
        };
        let (ns, name) = (
            pod.metadata.namespace.clone().unwrap_or_default(),
            pod.metadata.name.clone().unwrap_or_default(),
        );
        let nm_name = nm.metadata.name.clone().unwrap_or_default();
        let cond = true_condition(
            pod,
            DISRUPTION_TARGET,
            REASON_DELETION,
            format!("NodeMaintenance {nm_name}: deleting past the drain deadline"),
            now,
        );
        let grace = nm.spec.drain.grace_period_seconds;
        let result = match act::set_pod_condition(&self.writer, &ns, &name, uid, &cond).await {
            Ok(()) => act::delete_pod(&self.writer, &ns, &name, uid, grace).await,
            Err(e) => Err(e),
        };
        let key = pod.key().into_owned();
        let bypassed = self.tracker.get(uid).and_then(|r| r.pdb);
        let gone = |e: &kube::Error| {
            shared::api::apierr::is_not_found(e)
                || shared::api::apierr::is_conflict(e)
                || shared::api::apierr::is_uid_mismatch(e)
        };
        match result {
            Ok(()) => {
                self.metrics.deletions.inc();
                self.tracker.update(uid, |r| {
                    r.method = Some(EvictionMethod::Delete);
                    r.state = TargetState::Terminating;
                    r.attempts = r.attempts.saturating_add(1);
                    r.last_attempt = Some(now);
                    r.next_attempt = None;
                });
                let msg = match &bypassed {
                    Some(p) => format!(
                        "Deleted pod {key} past the drain deadline, bypassing PodDisruptionBudget {p}"
                    ),
                    None => format!("Deleted pod {key} past the drain deadline"),
                };
                self.events.warning(
                    &pod_ref(&ns, &name, uid),
                    "EvictedByDeletion",
                    "Delete",
                    &msg,
                );
                self.events.warning(
                    &shared::meta::refs::object_reference(nm),
                    "EvictedByDeletion",
                    "Delete",
                    msg,
                );
            }
            Err(e) if gone(&e) => {
                self.tracker.update(uid, |r| r.state = TargetState::Gone);
            }
            Err(e) => {
                // Lacking delete RBAC: EvictionDenied, and the drain behaves as Wait.
                let m = shared::api::apierr::message(&e);
                let denied = matches!(
                    shared::api::apierr::classify(&e),
                    shared::api::apierr::ErrorKind::Forbidden
                        | shared::api::apierr::ErrorKind::Invalid
                );
                let reason = if denied {
                    evict::REASON_DENIED
                } else {
                    evict::REASON_ERROR
                };
                self.note_error(nm, format!("deleting pod {key}: {m}"));
                self.tracker.update(uid, |r| {
                    r.state = TargetState::Blocked;
                    r.failures = r.failures.saturating_add(1);
                    r.next_attempt = now.checked_add(evict::backoff(r.failures)).ok();
                    r.delete_failures = r.delete_failures.saturating_add(1);
                    r.next_delete = now.checked_add(evict::backoff(r.delete_failures)).ok();
                    r.blocked_reason = Some(reason);
                    r.message = Some(format!("deletion failed: {m}"));
                    // Refused for good (RBAC, a webhook): evictions go on, as with Wait.
                    r.delete_denied |= denied;
                });
            }
        }
    }

    /// The Drain-stage conditions and events of one drain step: what
    /// [`conditions::drain_conditions`] decides is set and sent here, in its order; then the
    /// targets and progress. Returns whether drained.
    pub(crate) fn drain_status(
        &self,
        nm: &NodeMaintenance,
        st: &mut NodeMaintenanceStatus,
        result: DrainResult,
        now: Timestamp,
        obj_ref: &ObjectReference,
    ) -> bool {
        let step = DrainStep {
            entries: &result.entries,
            consent: result.consent.as_deref(),
            selector_error: result.selector_error.as_deref(),
        };
        let decided = conditions::drain_conditions(nm, st, &step, now);
        decided.apply(&mut st.conditions, now, nm.metadata.generation);
        for n in &decided.notices {
            match n.type_ {
                EventType::Normal => self.events.normal(obj_ref, n.reason, n.action, &n.message),
                EventType::Warning => self.events.warning(obj_ref, n.reason, n.action, &n.message),
            }
        }
        if decided.ended {
            self.observe_drain_end(nm, "drained", now);
        }
        if result.selector_error.is_some() {
            return false;
        }
        let (pods, truncated) = status::targeted_pods(result.entries.clone());
        let progress = status::progress(&result.entries, result.skipped, truncated);
        self.metrics
            .blocked_pods
            .get_or_create(&ObjectLabel {
                nodemaintenance: nm.metadata.name.clone().unwrap_or_default(),
            })
            .set(progress.blocked);
        st.targeted_pods = pods;
        st.progress = Some(progress);
        decided.drained
    }
}

/// What an eviction's answer means for its target.
struct Verdict {
    /// The `result` of `pilothouse_nodemaintenance_evictions_total`.
    label: &'static str,
    /// Why the target is blocked, if it is.
    reason: Option<&'static str>,
    /// The budget (or budgets, comma-separated) that blocks it.
    pdb: Option<String>,
    /// What blocks it, in words.
    text: Option<String>,
    /// When to try again, if the answer said (else the backoff, NM-14).
    retry: Option<Duration>,
}

/// NM-14, NM-17: one attempt in the target's record (its next attempt on the backoff, or when
/// the answer said); returns whether to warn of a deadlock, and whether of another block (at
/// most every [`BLOCKED_EVENT_EVERY`] seconds).
fn record_attempt(
    r: &mut PodRecord,
    outcome: &Outcome,
    verdict: &Verdict,
    terminating: bool,
    now: Timestamp,
) -> (bool, bool) {
    r.attempts = r.attempts.saturating_add(1);
    r.first_attempt.get_or_insert(now);
    r.last_attempt = Some(now);
    r.state = evict::state_after(outcome, terminating);
    let mut events = (false, false);
    match (outcome, verdict.reason) {
        (Outcome::Accepted, _) => {
            r.method = Some(EvictionMethod::Eviction);
            r.next_attempt = None;
        }
        (Outcome::NamespaceTerminating { .. }, _) => {
            r.failures = r.failures.saturating_add(1);
            r.next_attempt = now.checked_add(evict::backoff(r.failures)).ok();
        }
        (_, None) => {
            r.next_attempt = verdict.retry.and_then(|d| now.checked_add(d).ok());
        }
        (_, Some(reason)) => {
            r.failures = r.failures.saturating_add(1);
            let wait = verdict.retry.unwrap_or_else(|| evict::backoff(r.failures));
            r.next_attempt = now.checked_add(wait).ok();
            r.blocked_reason = Some(reason);
            r.pdb = verdict.pdb.clone();
            r.message = verdict.text.clone();
            if reason == evict::REASON_DEADLOCK {
                events.0 = true;
            } else if r
                .last_blocked_event
                .is_none_or(|t| now.duration_since(t).as_secs() >= BLOCKED_EVENT_EVERY)
            {
                r.last_blocked_event = Some(now);
                events.1 = true;
            }
        }
    }
    events
}

fn earliest(a: Option<Timestamp>, b: Option<Timestamp>) -> Option<Timestamp> {
    match (a, b) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}

/// A target's record as the status left it: how it was last tried, and whether an eviction (or
/// deletion) was accepted.
fn record_from(p: &TargetedPod, node: &str) -> PodRecord {
    let mut r = PodRecord::new(&p.namespace, &p.name, node);
    r.method = p.method;
    r.attempts = p.attempts;
    r.first_attempt = p.first_attempt_time.as_ref().map(|t| t.0);
    r.last_attempt = p.last_attempt_time.as_ref().map(|t| t.0);
    r.next_attempt = p.next_attempt_time.as_ref().map(|t| t.0);
    if p.state == TargetState::Blocked {
        r.state = TargetState::Blocked;
        r.failures = 1;
        r.pdb = p.pod_disruption_budget.clone();
        r.message = p.message.clone();
        r.blocked_reason = p
            .blocked_reason
            .as_deref()
            .and_then(|b| evict::SEVERITY.iter().copied().find(|known| *known == b));
    }
    r
}

/// NM-11: the first drain step stores its start time and the node's pod count; every step sets
/// the deadline from the start and `spec.drain.timeoutSeconds`, and returns it.
fn start(
    st: &mut NodeMaintenanceStatus,
    pods: usize,
    drain: &DrainSpec,
    now: Timestamp,
) -> Option<Timestamp> {
    let d = st.drain.get_or_insert_with(DrainStatus::default);
    if d.start_time.is_none() {
        d.start_time = Some(Time(now));
        d.total_pods = Some(pods as i64);
    }
    let start = d.start_time.as_ref().map_or(now, |t| t.0);
    d.deadline = plan::deadline(start, drain.timeout_seconds).map(Time);
    d.deadline.as_ref().map(|t| t.0)
}
/// A `True` pod condition of ours, keeping the transition time of one already `True`.
fn true_condition(
    pod: &Pod,
    type_: &str,
    reason: &str,
    message: String,
    now: Timestamp,
) -> PodCondition {
    let transition = pod
        .condition(type_)
        .filter(|c| c.status == "True")
        .and_then(|c| c.last_transition_time.clone())
        .unwrap_or(Time(now));
    PodCondition {
        type_: type_.into(),
        status: "True".into(),
        reason: Some(reason.into()),
        message: Some(message),
        last_transition_time: Some(transition),
        observed_generation: pod.metadata.generation,
        last_probe_time: None,
    }
}
