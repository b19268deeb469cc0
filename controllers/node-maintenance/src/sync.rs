//! One sync of one NodeMaintenance: observe the object, its node, the node's pods and the
//! budgets in the caches; decide ([`plan`], [`classify`], [`evict`], [`status`]); act ([`act`]);
//! and remember per object what the status cannot hold between syncs.

use crate::classify::{self, Class, Consent};
use crate::evict::{self, Outcome, PdbRef};
use crate::metrics::{Metrics, ObjectLabel, OutcomeLabel};
use crate::status::{self, Entry};
use crate::tracker::{PodRecord, Tracker};
use crate::types::*;
use crate::{Error, act, plan};
use futures::StreamExt;
use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::{Node, ObjectReference, PodCondition};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{OwnerReference, Time};
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use shared::api::apierr::doing;
use shared::api::writer::Writer;
use shared::cache::informers::{INDEX_NAMESPACE, Informer};
use shared::cache::pod::INDEX_POD_NODE;
use shared::cache::pod::Pod;
use shared::cache::written::Written;
use shared::meta::clock::Clock;
use shared::runtime::events::{EventRecorder, core_ref};
use shared::runtime::queue::Next;
use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::time::Instant;

/// Status is written (in one patch) at most this often, except on a phase change.
pub const STATUS_EVERY: Duration = Duration::from_secs(1);
/// The longest a sync waits before looking again: it requeues at the earliest
/// `nextAttemptTime` of a target, the drain deadline, or after this.
pub const RESYNC: Duration = Duration::from_secs(60);
/// NM-17: `EvictionBlocked` at most once per pod per 5 minutes.
pub const BLOCKED_EVENT_EVERY: i64 = 300;
/// NM-12: after this many failed condition writes, `lastError` says so (eviction goes on).
pub const CONDITION_TRIES: u32 = 3;
/// Evictions (or deletions) of one sync in flight at once.
pub const REQUESTS_AT_ONCE: usize = 16;

pub const REASON_NODE_MAINTENANCE: &str = "NodeMaintenance";
pub const REASON_MAINTENANCE_ENDED: &str = "MaintenanceEnded";
pub const DISRUPTION_TARGET: &str = "DisruptionTarget";
pub const REASON_DELETION: &str = "DeletionByNodeMaintenance";
pub const REASON_INVALID_SELECTOR: &str = "InvalidPodSelector";

/// One target as the object remembers it (its pod may be gone).
#[derive(Clone, Debug)]
struct Target {
    namespace: String,
    name: String,
    created: Option<Timestamp>,
    priority: Option<i32>,
}

/// What the controller remembers of one object between syncs.
#[derive(Default)]
struct Memory {
    uid: String,
    /// Every target ever selected, by pod UID.
    targets: BTreeMap<String, Target>,
    /// Rebuilt from `status.targetedPods` once per process.
    restored: bool,
    last_status_write: Option<Instant>,
    last_error: Option<String>,
    /// NM-5: BeginMaintenance was emitted (a failed cordon must not repeat it).
    begun: bool,
    /// NM-17: the budgets this object warned of a deadlock (once per object and budget).
    deadlock_warned: std::collections::HashSet<String>,
}

pub struct NodeMaintenanceController {
    pub objects: Arc<Informer<NodeMaintenance>>,
    pub nodes: Arc<Informer<Node>>,
    pub pods: Arc<Informer<Pod>>,
    pub pdbs: Arc<Informer<PodDisruptionBudget>>,
    pub daemonsets: Arc<Informer<DaemonSet>>,
    pub writer: Writer,
    pub events: EventRecorder,
    pub clock: Arc<dyn Clock>,
    pub metrics: Metrics,
    pub tracker: Arc<Tracker>,
    pub node_conditions: bool,
    /// By object name: what our last writes to it and to its node returned, served while the
    /// caches still hold the versions they replaced.
    written: Written,
    memory: Mutex<HashMap<String, Memory>>,
}

fn has_finalizer(nm: &NodeMaintenance) -> bool {
    nm.metadata
        .finalizers
        .iter()
        .flatten()
        .any(|f| f == FINALIZER)
}

fn node_owner(nm: &NodeMaintenance) -> Option<&OwnerReference> {
    nm.metadata
        .owner_references
        .iter()
        .flatten()
        .find(|o| o.kind == "Node" && o.api_version == "v1")
}

fn pod_uid(p: &Pod) -> &str {
    p.metadata.uid.as_deref().unwrap_or_default()
}

fn pod_ref(namespace: &str, name: &str, uid: &str) -> ObjectReference {
    ObjectReference {
        uid: Some(uid.to_string()).filter(|u| !u.is_empty()),
        ..core_ref("Pod", &format!("{namespace}/{name}"))
    }
}

fn node_ref(node: &Node) -> ObjectReference {
    ObjectReference {
        uid: node.metadata.uid.clone(),
        ..shared::meta::refs::object_reference_by_key::<Node>(
            node.metadata.name.as_deref().unwrap_or_default(),
        )
    }
}

fn to_std(d: SignedDuration) -> Duration {
    Duration::try_from(d).unwrap_or(Duration::ZERO)
}

/// What one drain step found and did, for the status.
struct DrainResult {
    entries: Vec<Entry>,
    skipped: Skipped,
    consent: Option<String>,
    selector_error: Option<String>,
    wake: Option<Timestamp>,
}

/// The owner key of an object's own-writes record: its name (the kind is cluster-scoped).
fn owner(nm: &NodeMaintenance) -> &str {
    nm.metadata.name.as_deref().unwrap_or_default()
}

impl NodeMaintenanceController {
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        objects: Arc<Informer<NodeMaintenance>>,
        nodes: Arc<Informer<Node>>,
        pods: Arc<Informer<Pod>>,
        pdbs: Arc<Informer<PodDisruptionBudget>>,
        daemonsets: Arc<Informer<DaemonSet>>,
        writer: Writer,
        events: EventRecorder,
        clock: Arc<dyn Clock>,
        metrics: Metrics,
        tracker: Arc<Tracker>,
        node_conditions: bool,
    ) -> Self {
        NodeMaintenanceController {
            objects,
            nodes,
            pods,
            pdbs,
            daemonsets,
            writer,
            events,
            clock,
            metrics,
            tracker,
            node_conditions,
            written: Written::new(),
            memory: Mutex::new(HashMap::new()),
        }
    }

    fn memory(&self) -> std::sync::MutexGuard<'_, HashMap<String, Memory>> {
        shared::lock(&self.memory)
    }

    /// The objects naming `node`, freshest copies.
    fn on_node(&self, node: &str) -> Vec<Arc<NodeMaintenance>> {
        self.objects
            .by_index(crate::handlers::INDEX_NM_NODE, node)
            .into_iter()
            .map(|o| self.written.freshest(o))
            .collect()
    }

    fn node(&self, name: &str) -> Option<Arc<Node>> {
        self.nodes.get(name).map(|n| self.written.freshest(n))
    }

    pub async fn sync(&self, name: &str) -> Result<Next, Error> {
        let Some(cached) = self.objects.get(name) else {
            self.memory().remove(name);
            self.written.forget(name);
            self.metrics.blocked_pods.remove(&ObjectLabel {
                nodemaintenance: name.to_string(),
            });
            return Ok(Next::Done);
        };
        let nm = self.written.freshest(cached);
        let uid = nm.metadata.uid.clone().unwrap_or_default();
        {
            let mut mem = self.memory();
            let m = mem.entry(name.to_string()).or_default();
            if m.uid != uid {
                *m = Memory {
                    uid,
                    ..Memory::default()
                };
            }
        }
        // NM-1: a deleting object releases and lets go, nothing else.
        if nm.metadata.deletion_timestamp.is_some() {
            if has_finalizer(&nm) {
                let node = self.node(&nm.spec.node_name);
                let node = node.filter(|n| !replaced(&nm, n));
                self.end_targeting(&nm).await;
                let released = match &node {
                    Some(node) => self.release(&nm, node).await.map(drop),
                    None => Ok(()),
                };
                if let Err(e) = released {
                    // Cleanup is still running: say so, and retry.
                    let mut st = nm.status.clone().unwrap_or_default();
                    st.phase = Some(Phase::Completing);
                    let _ = self.write_status(&nm, st, false).await;
                    return Err(e);
                }
                self.remove_finalizer(&nm).await?;
                let st = nm.status.clone().unwrap_or_default();
                if let Some(c) = status::condition(&st.conditions, CONDITION_DRAINED)
                    && c.status != "True"
                    && c.reason != "Cancelled"
                {
                    self.observe_drain_end(&nm, "cancelled", self.clock.now());
                }
                self.events.normal(
                    &shared::meta::refs::object_reference(nm.as_ref()),
                    "RemovedMaintenance",
                    "Release",
                    format!("Removed maintenance of node {}", nm.spec.node_name),
                );
            }
            return Ok(Next::Done);
        }
        let now = self.clock.now();
        let mut st = nm.status.clone().unwrap_or_default();
        let generation = nm.metadata.generation;
        // NM-2: no node, or another node of the same name.
        let node = match self.node(&nm.spec.node_name) {
            Some(n) if !replaced(&nm, &n) => n,
            other => {
                let reason = if other.is_some() {
                    "NodeReplaced"
                } else {
                    "NodeNotFound"
                };
                let warned = status::condition(&st.conditions, CONDITION_CORDONED)
                    .is_some_and(|c| c.reason == reason && c.observed_generation == generation);
                if !warned && reason == "NodeNotFound" {
                    self.events.warning(
                        &shared::meta::refs::object_reference(nm.as_ref()),
                        "NodeNotFound",
                        "Lookup",
                        format!("Node {} not found", nm.spec.node_name),
                    );
                }
                let msg = format!(
                    "node {} {}",
                    nm.spec.node_name,
                    if other.is_some() {
                        "was replaced by a new node of the same name"
                    } else {
                        "not found"
                    }
                );
                status::set_condition(
                    &mut st.conditions,
                    CONDITION_CORDONED,
                    false,
                    reason,
                    &msg,
                    now,
                    generation,
                );
                let drained_reason = if other.is_some() {
                    "NodeReplaced"
                } else {
                    "NodeNotFound"
                };
                status::set_condition(
                    &mut st.conditions,
                    CONDITION_DRAINED,
                    false,
                    drained_reason,
                    &msg,
                    now,
                    generation,
                );
                st.phase = Some(Phase::Pending);
                // M8/M9: no finalizer while there is no node to release (and no node writes).
                if has_finalizer(&nm) {
                    self.remove_finalizer(&nm).await?;
                }
                let nm = self.written.freshest(Arc::clone(&nm));
                self.write_status(&nm, st, true).await?;
                return Ok(Next::Done);
            }
        };
        // NM-3, NM-5: owner reference, and the finalizer before any node write.
        let nm = self.ensure_meta(&nm, &node).await?;
        match nm.spec.stage {
            Stage::Idle => {
                st.phase = Some(Phase::Idle);
                for c in [CONDITION_CORDONED, CONDITION_DRAINED] {
                    status::set_condition(
                        &mut st.conditions,
                        c,
                        false,
                        "NotRequested",
                        "",
                        now,
                        generation,
                    );
                }
                status::set_condition(
                    &mut st.conditions,
                    CONDITION_EVICTION_BLOCKED,
                    false,
                    "NotBlocked",
                    "",
                    now,
                    generation,
                );
                status::set_condition(
                    &mut st.conditions,
                    CONDITION_DEADLINE_EXCEEDED,
                    false,
                    "NoDeadline",
                    "",
                    now,
                    generation,
                );
                self.write_status(&nm, st, false).await?;
                Ok(Next::Done)
            }
            Stage::Complete => self.complete(&nm, &node, st, now).await,
            Stage::Cordon | Stage::Drain => self.active(&nm, &node, st, now).await,
        }
    }

    async fn ensure_meta(
        &self,
        nm: &Arc<NodeMaintenance>,
        node: &Node,
    ) -> Result<Arc<NodeMaintenance>, Error> {
        let mut owners = nm.metadata.owner_references.clone().unwrap_or_default();
        let mut finalizers = nm.metadata.finalizers.clone().unwrap_or_default();
        let mut changed = false;
        if node_owner(nm).is_none() {
            owners.push(OwnerReference {
                api_version: "v1".into(),
                kind: "Node".into(),
                name: node.metadata.name.clone().unwrap_or_default(),
                uid: node.metadata.uid.clone().unwrap_or_default(),
                controller: Some(false),
                block_owner_deletion: Some(false),
            });
            changed = true;
        }
        if plan::is_active(nm) && !has_finalizer(nm) {
            finalizers.push(FINALIZER.to_string());
            changed = true;
        }
        if !changed {
            return Ok(Arc::clone(nm));
        }
        let after = act::patch_meta(&self.writer, nm, &finalizers, &owners)
            .await
            .map_err(doing::<Error>("adding the finalizer and owner reference"))?;
        self.written.replaced(owner(nm), &**nm, after.clone());
        Ok(Arc::new(after))
    }

    async fn remove_finalizer(&self, nm: &NodeMaintenance) -> Result<(), Error> {
        let finalizers: Vec<String> = nm
            .metadata
            .finalizers
            .iter()
            .flatten()
            .filter(|f| *f != FINALIZER)
            .cloned()
            .collect();
        let owners = nm.metadata.owner_references.clone().unwrap_or_default();
        match act::patch_meta(&self.writer, nm, &finalizers, &owners).await {
            Ok(after) => {
                self.written.replaced(owner(nm), nm, after);
                Ok(())
            }
            Err(e) if shared::api::apierr::is_not_found(&e) => Ok(()),
            Err(e) => Err(doing::<Error>("removing the finalizer")(e)),
        }
    }

    /// Stages Cordon and Drain: NM-5..NM-18.
    async fn active(
        &self,
        nm: &Arc<NodeMaintenance>,
        node: &Arc<Node>,
        mut st: NodeMaintenanceStatus,
        now: Timestamp,
    ) -> Result<Next, Error> {
        let generation = nm.metadata.generation;
        let obj_ref = shared::meta::refs::object_reference(nm.as_ref());
        // NM-5: BeginMaintenance when first acted on; NM-8: only the stage acted on gets an entry.
        let first = !st
            .stage_statuses
            .iter()
            .any(|s| matches!(s.name, Stage::Cordon | Stage::Drain));
        status::note_stage(&mut st.stage_statuses, nm.spec.stage, now);
        let name = nm.metadata.name.clone().unwrap_or_default();
        let first = first
            && self
                .memory()
                .get_mut(&name)
                .is_some_and(|m| !std::mem::replace(&mut m.begun, true));
        if first {
            self.events.normal(
                &obj_ref,
                "BeginMaintenance",
                "Begin",
                format!("Begin maintenance of node {}", nm.spec.node_name),
            );
        }
        // NM-6, NM-7.
        let node = self.cordon(nm, node, &st, &obj_ref).await?;
        status::set_condition(
            &mut st.conditions,
            CONDITION_CORDONED,
            true,
            "Cordoned",
            format!(
                "node {} is unschedulable and tainted {}:{}",
                nm.spec.node_name,
                TAINT_MAINTENANCE,
                plan::EFFECT
            ),
            now,
            generation,
        );
        let mut wake: Option<Timestamp> = None;
        let mut drained = false;
        if nm.spec.stage == Stage::Drain {
            let result = self.drain(nm, &mut st, now).await;
            wake = result.wake;
            drained = self.drain_status(nm, &mut st, result, now, &obj_ref);
            st.phase = Some(if drained {
                Phase::Drained
            } else {
                Phase::Draining
            });
        } else {
            for (c, r) in [
                (CONDITION_DRAINED, "NotRequested"),
                (CONDITION_EVICTION_BLOCKED, "NotBlocked"),
                (CONDITION_DEADLINE_EXCEEDED, "NoDeadline"),
            ] {
                status::set_condition(&mut st.conditions, c, false, r, "", now, generation);
            }
            st.phase = Some(Phase::Cordoned);
        }
        if let Some(e) = self
            .memory()
            .get(nm.metadata.name.as_deref().unwrap_or_default())
            .and_then(|m| m.last_error.clone())
        {
            st.last_error = Some(e);
        }
        let mut next = self.write_status(nm, st, false).await?;
        // After the status: a node patch that keeps failing must not keep the drain's targets
        // unlisted, and so unevicted.
        if self.node_conditions {
            // One view of the node for every object on it, so overlapping objects agree.
            let me = nm.metadata.uid.clone();
            let drains: Vec<bool> = self
                .on_node(&nm.spec.node_name)
                .iter()
                .filter(|o| plan::is_draining(o))
                .map(|o| {
                    if o.metadata.uid == me {
                        drained
                    } else {
                        o.status
                            .as_ref()
                            .is_some_and(|s| status::is_true(&s.conditions, CONDITION_DRAINED))
                    }
                })
                .collect();
            let draining = drains.iter().any(|d| !d);
            let all_drained = !drains.is_empty() && drains.iter().all(|d| *d);
            let wanted = plan::lifecycle_conditions(true, draining, all_drained);
            if let Some(p) = plan::lifecycle_patch(&node, &wanted, now) {
                act::patch_node_status(&self.writer, &nm.spec.node_name, p)
                    .await
                    .map_err(doing::<Error>("patching the node's maintenance conditions"))?;
            }
        }
        if let Some(w) = wake {
            let d = to_std(w.duration_since(self.clock.now())).max(Duration::from_millis(100));
            next = next.min(d);
        }
        Ok(Next::After(next.min(RESYNC)))
    }

    /// NM-6/NM-7: the guarded cordon patch; a cordon found undone after it once held is
    /// restored with `CordonReverted` on the object and the node.
    async fn cordon(
        &self,
        nm: &NodeMaintenance,
        node: &Arc<Node>,
        st: &NodeMaintenanceStatus,
        obj_ref: &ObjectReference,
    ) -> Result<Arc<Node>, Error> {
        let Some(patch) = plan::cordon_patch(node) else {
            return Ok(Arc::clone(node));
        };
        let reverted =
            status::is_true(&st.conditions, CONDITION_CORDONED) && !plan::is_cordoned(node);
        let name = &nm.spec.node_name;
        let after = act::patch_node(&self.writer, name, patch)
            .await
            .map_err(doing::<Error>(format!("cordoning node {name}")))?;
        self.written.replaced(owner(nm), &**node, after.clone());
        if reverted {
            let msg = format!(
                "Node {name} was uncordoned or untainted while under maintenance; cordoned again"
            );
            self.events
                .warning(obj_ref, "CordonReverted", "Cordon", &msg);
            self.events
                .warning(&node_ref(node), "CordonReverted", "Cordon", msg);
        } else if !plan::is_cordoned(node) {
            self.events.normal(
                obj_ref,
                "Cordoned",
                "Cordon",
                format!("Cordoned node {name}"),
            );
        }
        Ok(Arc::new(after))
    }

    /// NM-9..NM-18 for one sync.
    async fn drain(
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
        let d = st.drain.get_or_insert_with(DrainStatus::default);
        if d.start_time.is_none() {
            d.start_time = Some(Time(now));
            d.total_pods = Some(pods.len() as i64);
        }
        let start = d.start_time.as_ref().map_or(now, |t| t.0);
        d.deadline = plan::deadline(start, drain.timeout_seconds).map(Time);
        let deadline = d.deadline.as_ref().map(|t| t.0);
        if let Err(e) = classify::validate_selector(drain.pod_selector.as_ref()) {
            result.selector_error = Some(e);
            return result;
        }
        self.restore(&name, &node_name, st);
        let ds_exists = |ns: &str, n: &str| self.daemonsets.get(&format!("{ns}/{n}")).is_some();
        let mut present: HashMap<String, Arc<Pod>> = HashMap::new();
        let mut missing: Vec<(Consent, String)> = Vec::new();
        {
            let mut mem = self.memory();
            let m = mem.entry(name.clone()).or_default();
            for pod in &pods {
                let uid = pod_uid(pod).to_string();
                match classify::classify(pod, drain, ds_exists, now) {
                    Class::Gone => {}
                    Class::SkippedDaemonSet => result.skipped.daemon_set += 1,
                    Class::SkippedMirror => result.skipped.mirror += 1,
                    Class::SkippedNotSelected => result.skipped.not_selected += 1,
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
        }
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
        if unlisted {
            result.wake = Some(now);
        } else if result.consent.is_none() {
            let message = self.targeted_message(&node_name);
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
        // The view of every target.
        for (uid, t) in &targets {
            let rec = self
                .tracker
                .get(uid)
                .or_else(|| stored.get(uid.as_str()).map(|p| record_from(p, &node_name)));
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
            let r = rec.unwrap_or_else(|| PodRecord::new(&t.namespace, &t.name, &node_name));
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
        if let Some(d) = deadline.filter(|d| *d > now) {
            result.wake = earliest(result.wake, Some(d));
        }
        result
    }

    /// After a restart: the targets the status lists (their pods may be gone since).
    fn restore(&self, name: &str, node: &str, st: &NodeMaintenanceStatus) {
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
    fn targets_of(&self, name: &str) -> Vec<(String, Target)> {
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
        let transition = pod
            .condition(POD_CONDITION_TARGETED)
            .filter(|c| c.status == "True")
            .and_then(|c| c.last_transition_time.clone())
            .unwrap_or(Time(now));
        let cond = PodCondition {
            type_: POD_CONDITION_TARGETED.into(),
            status: "True".into(),
            reason: Some(REASON_NODE_MAINTENANCE.into()),
            message: Some(message.to_string()),
            last_transition_time: Some(transition),
            observed_generation: pod.metadata.generation,
            last_probe_time: None,
        };
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
        let key = pod.key().into_owned();
        let mut label = outcome.result_label();
        let (reason, pdb, text, retry): (
            Option<&'static str>,
            Option<String>,
            Option<String>,
            Option<Duration>,
        ) = match &outcome {
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
                    .normal(&obj_ref, "Evicted", "Evict", format!("Evicted pod {key}"));
                (None, None, None, None)
            }
            Outcome::Gone => (None, None, None, None),
            Outcome::Throttled { retry_after } => (None, None, None, Some(*retry_after)),
            Outcome::Budget {
                pdb,
                message: cause,
                processing,
            } => {
                let matching: Vec<Arc<PodDisruptionBudget>> = self
                    .pdbs
                    .by_index(INDEX_NAMESPACE, &ns)
                    .into_iter()
                    .filter(|p| evict::pdb_matches(p, pod))
                    .collect();
                let found = evict::blocking_pdb(&matching, pdb.as_deref());
                let deadlock = found.as_ref().is_some_and(PdbRef::deadlocked);
                if deadlock {
                    label = "pdb_deadlock";
                }
                let text = match &found {
                    Some(p) => p.describe(),
                    None => format!("blocked by a PodDisruptionBudget: {cause}"),
                };
                let retry = processing.then_some(evict::PROCESSING_RETRY);
                (
                    Some(if deadlock {
                        evict::REASON_DEADLOCK
                    } else {
                        evict::REASON_PDB
                    }),
                    found.map(|p| p.name),
                    Some(text),
                    retry,
                )
            }
            Outcome::MultipleBudgets { message: m } => {
                let names: Vec<String> = self
                    .pdbs
                    .by_index(INDEX_NAMESPACE, &ns)
                    .into_iter()
                    .filter(|p| evict::pdb_matches(p, pod))
                    .filter_map(|p| p.metadata.name.clone())
                    .collect();
                let text = if names.is_empty() {
                    format!("blocked by more than one PodDisruptionBudget: {m}")
                } else {
                    format!(
                        "blocked by more than one PodDisruptionBudget ({})",
                        names.join(", ")
                    )
                };
                (
                    Some(evict::REASON_MULTIPLE),
                    (!names.is_empty()).then(|| names.join(",")),
                    Some(text),
                    None,
                )
            }
            Outcome::NamespaceTerminating { .. } => (None, None, None, None),
            Outcome::Denied { message: m } => {
                self.note_error(nm, format!("evicting pod {key}: {m}"));
                (
                    Some(evict::REASON_DENIED),
                    None,
                    Some(format!("eviction denied: {m}")),
                    None,
                )
            }
            Outcome::Error { message: m } => {
                self.note_error(nm, format!("evicting pod {key}: {m}"));
                (
                    Some(evict::REASON_ERROR),
                    None,
                    Some(format!("eviction failed: {m}")),
                    None,
                )
            }
        };
        self.metrics.eviction(label);
        let terminating = classify::is_terminating(pod);
        let events = self.tracker.update(uid, |r| {
            r.attempts = r.attempts.saturating_add(1);
            r.first_attempt.get_or_insert(now);
            r.last_attempt = Some(now);
            r.state = evict::state_after(&outcome, terminating);
            let mut events = (false, false);
            match (&outcome, reason) {
                (Outcome::Accepted, _) => {
                    r.method = Some(EvictionMethod::Eviction);
                    r.next_attempt = None;
                }
                (Outcome::NamespaceTerminating { .. }, _) => {
                    r.failures = r.failures.saturating_add(1);
                    r.next_attempt = now.checked_add(evict::backoff(r.failures)).ok();
                }
                (_, None) => {
                    r.next_attempt = retry.and_then(|d| now.checked_add(d).ok());
                }
                (_, Some(reason)) => {
                    r.failures = r.failures.saturating_add(1);
                    let wait = retry.unwrap_or_else(|| evict::backoff(r.failures));
                    r.next_attempt = now.checked_add(wait).ok();
                    r.blocked_reason = Some(reason);
                    r.pdb = pdb.clone();
                    r.message = text.clone();
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
        });
        let msg = format!("pod {key} {}", text.clone().unwrap_or_default());
        // NM-17: DrainDeadlocked once per (object, budget), on the object and the pod.
        let deadlock_first = matches!(events, Some((true, _)))
            && self
                .memory()
                .get_mut(nm.metadata.name.as_deref().unwrap_or_default())
                .is_some_and(|m| m.deadlock_warned.insert(pdb.clone().unwrap_or_default()));
        match events {
            Some((true, _)) if !deadlock_first => {}
            Some((true, _)) => {
                self.events
                    .warning(&obj_ref, "DrainDeadlocked", "Evict", &msg);
                self.events
                    .warning(&pod_ref(&ns, &name, uid), "DrainDeadlocked", "Evict", &msg);
            }
            Some((_, true)) => self
                .events
                .warning(&obj_ref, "EvictionBlocked", "Evict", &msg),
            _ => {}
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
        let transition = pod
            .condition(DISRUPTION_TARGET)
            .filter(|c| c.status == "True")
            .and_then(|c| c.last_transition_time.clone())
            .unwrap_or(Time(now));
        let cond = PodCondition {
            type_: DISRUPTION_TARGET.into(),
            status: "True".into(),
            reason: Some(REASON_DELETION.into()),
            message: Some(format!(
                "NodeMaintenance {nm_name}: deleting past the drain deadline"
            )),
            last_transition_time: Some(transition),
            observed_generation: pod.metadata.generation,
            last_probe_time: None,
        };
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

    /// The Drain-stage conditions and events from one drain step; returns whether drained.
    fn drain_status(
        &self,
        nm: &NodeMaintenance,
        st: &mut NodeMaintenanceStatus,
        result: DrainResult,
        now: Timestamp,
        obj_ref: &ObjectReference,
    ) -> bool {
        let generation = nm.metadata.generation;
        let name = nm.metadata.name.clone().unwrap_or_default();
        let was_drained = status::is_true(&st.conditions, CONDITION_DRAINED);
        if let Some(e) = &result.selector_error {
            let warned = status::condition(&st.conditions, CONDITION_DRAINED).is_some_and(|c| {
                c.reason == REASON_INVALID_SELECTOR && c.observed_generation == generation
            });
            if !warned {
                self.events
                    .warning(obj_ref, REASON_INVALID_SELECTOR, "Drain", e);
            }
            status::set_condition(
                &mut st.conditions,
                CONDITION_DRAINED,
                false,
                REASON_INVALID_SELECTOR,
                e,
                now,
                generation,
            );
            return false;
        }
        let drained = result.consent.is_none() && status::drained(&result.entries);
        if let Some(msg) = &result.consent {
            let same = status::condition(&st.conditions, CONDITION_DRAINED)
                .is_some_and(|c| c.reason == "PodsRequireConsent" && c.message == *msg);
            if !same {
                self.events
                    .warning(obj_ref, "PodsRequireConsent", "Drain", msg);
            }
            status::set_condition(
                &mut st.conditions,
                CONDITION_DRAINED,
                false,
                "PodsRequireConsent",
                msg,
                now,
                generation,
            );
        } else if drained {
            status::set_condition(
                &mut st.conditions,
                CONDITION_DRAINED,
                true,
                "DrainComplete",
                format!("node {} is drained", nm.spec.node_name),
                now,
                generation,
            );
            if !was_drained {
                self.events.normal(
                    obj_ref,
                    "DrainComplete",
                    "Drain",
                    format!("Drained node {}", nm.spec.node_name),
                );
                self.observe_drain_end(nm, "drained", now);
            }
        } else {
            let left = result
                .entries
                .iter()
                .filter(|e| e.pod.state != TargetState::Gone)
                .count();
            let terminating = result
                .entries
                .iter()
                .filter(|e| e.pod.state == TargetState::Terminating)
                .count();
            let mut msg = format!("{left} pods left to drain");
            if terminating > 0 {
                // NM-22: pods of a failed node stay Terminating until PodGC or its return.
                msg.push_str(&format!(" ({terminating} terminating; if node {} is gone for good, taint it node.kubernetes.io/out-of-service or set drain.skipWaitForDeleteTimeoutSeconds)", nm.spec.node_name));
            }
            status::set_condition(
                &mut st.conditions,
                CONDITION_DRAINED,
                false,
                "Draining",
                msg,
                now,
                generation,
            );
        }
        match status::eviction_blocked(&result.entries) {
            Some((reason, msg)) => status::set_condition(
                &mut st.conditions,
                CONDITION_EVICTION_BLOCKED,
                true,
                &reason,
                msg,
                now,
                generation,
            ),
            None => status::set_condition(
                &mut st.conditions,
                CONDITION_EVICTION_BLOCKED,
                false,
                "NotBlocked",
                "",
                now,
                generation,
            ),
        }
        let deadline = st
            .drain
            .as_ref()
            .and_then(|d| d.deadline.as_ref())
            .map(|t| t.0);
        match deadline {
            None => status::set_condition(
                &mut st.conditions,
                CONDITION_DEADLINE_EXCEEDED,
                false,
                "NoDeadline",
                "",
                now,
                generation,
            ),
            Some(d) if now >= d && !drained => {
                let reason = match nm.spec.drain.timeout_policy {
                    TimeoutPolicy::Wait => "WaitingPastDeadline",
                    TimeoutPolicy::Delete => "DeletingPastDeadline",
                };
                if !status::is_true(&st.conditions, CONDITION_DEADLINE_EXCEEDED) {
                    self.events.warning(
                        obj_ref,
                        "DrainDeadlineExceeded",
                        "Drain",
                        format!(
                            "Drain of node {} not done by its deadline {}",
                            nm.spec.node_name,
                            Time(d).0
                        ),
                    );
                }
                status::set_condition(
                    &mut st.conditions,
                    CONDITION_DEADLINE_EXCEEDED,
                    true,
                    reason,
                    format!("deadline {} passed", Time(d).0),
                    now,
                    generation,
                );
            }
            // Drained after the deadline passed: the condition keeps what the drain went
            // through (True/…PastDeadline), rather than a "WithinDeadline" that reads wrong.
            Some(d)
                if drained
                    && now >= d
                    && status::is_true(&st.conditions, CONDITION_DEADLINE_EXCEEDED) => {}
            Some(d) => status::set_condition(
                &mut st.conditions,
                CONDITION_DEADLINE_EXCEEDED,
                false,
                "WithinDeadline",
                format!("deadline {}", Time(d).0),
                now,
                generation,
            ),
        }
        let (pods, truncated) = status::targeted_pods(result.entries.clone());
        let progress = status::progress(&result.entries, result.skipped, truncated);
        self.metrics
            .blocked_pods
            .get_or_create(&ObjectLabel {
                nodemaintenance: name,
            })
            .set(progress.blocked);
        st.targeted_pods = pods;
        st.progress = Some(progress);
        drained
    }

    /// `pilothouse_nodemaintenance_drain_duration_seconds`: one observation per drain, at its end
    /// (the transition to Drained or Cancelled), of `status.drain.startTime` → `end`.
    fn observe_drain_end(&self, nm: &NodeMaintenance, outcome: &str, end: Timestamp) {
        let Some(start) = nm
            .status
            .as_ref()
            .and_then(|s| s.drain.as_ref())
            .and_then(|d| d.start_time.as_ref())
        else {
            return;
        };
        let secs = end.duration_since(start.0).as_secs_f64().max(0.0);
        self.metrics
            .drain_duration
            .get_or_create(&OutcomeLabel {
                outcome: outcome.into(),
            })
            .observe(secs);
    }

    /// NM-19: stage Complete: stop, end the pod conditions, release; phase Completed.
    async fn complete(
        &self,
        nm: &Arc<NodeMaintenance>,
        node: &Arc<Node>,
        mut st: NodeMaintenanceStatus,
        now: Timestamp,
    ) -> Result<Next, Error> {
        let generation = nm.metadata.generation;
        if !status::is_true(&st.conditions, CONDITION_DRAINED) {
            let cancelled = st.drain.as_ref().is_some_and(|d| d.start_time.is_some());
            let newly = status::condition(&st.conditions, CONDITION_DRAINED)
                .is_none_or(|c| c.reason != "Cancelled");
            let reason = if cancelled {
                "Cancelled"
            } else {
                "NotRequested"
            };
            status::set_condition(
                &mut st.conditions,
                CONDITION_DRAINED,
                false,
                reason,
                "",
                now,
                generation,
            );
            if cancelled && newly {
                self.observe_drain_end(nm, "cancelled", now);
            }
        }
        status::set_condition(
            &mut st.conditions,
            CONDITION_EVICTION_BLOCKED,
            false,
            "NotBlocked",
            "",
            now,
            generation,
        );
        if status::condition(&st.conditions, CONDITION_DEADLINE_EXCEEDED).is_none() {
            status::set_condition(
                &mut st.conditions,
                CONDITION_DEADLINE_EXCEEDED,
                false,
                "NoDeadline",
                "",
                now,
                generation,
            );
        }
        self.end_targeting(nm).await;
        let held = match self.release(nm, node).await {
            Ok(held) => held,
            Err(e) => {
                // Cleanup is still running: say so, and retry.
                st.phase = Some(Phase::Completing);
                let _ = self.write_status(nm, st, false).await;
                return Err(e);
            }
        };
        match held {
            Some(others) => status::set_condition(
                &mut st.conditions,
                CONDITION_CORDONED,
                false,
                "HeldByOtherMaintenance",
                format!(
                    "node {} stays cordoned for NodeMaintenance {others}",
                    nm.spec.node_name
                ),
                now,
                generation,
            ),
            None => {
                let cordoned_before = nm.status.as_ref().is_some_and(|s| {
                    s.stage_statuses
                        .iter()
                        .any(|s| matches!(s.name, Stage::Cordon | Stage::Drain))
                });
                let reason = if cordoned_before {
                    "Uncordoned"
                } else {
                    "NotRequested"
                };
                status::set_condition(
                    &mut st.conditions,
                    CONDITION_CORDONED,
                    false,
                    reason,
                    "",
                    now,
                    generation,
                );
            }
        }
        status::note_stage(&mut st.stage_statuses, Stage::Complete, now);
        self.metrics.blocked_pods.remove(&ObjectLabel {
            nodemaintenance: nm.metadata.name.clone().unwrap_or_default(),
        });
        st.phase = Some(Phase::Completed);
        self.write_status(nm, st, false).await?;
        Ok(Next::Done)
    }

    /// NM-20: releases the node unless another active object holds it; returns the names of
    /// those that do.
    async fn release(
        &self,
        nm: &NodeMaintenance,
        node: &Arc<Node>,
    ) -> Result<Option<String>, Error> {
        let me = nm.metadata.uid.clone();
        let mut others: Vec<Arc<NodeMaintenance>> = self
            .on_node(&nm.spec.node_name)
            .into_iter()
            .filter(|o| o.metadata.uid != me && plan::is_active(o))
            .collect();
        if !others.is_empty() {
            others.sort_by(|a, b| plan::oldest_first(a, b));
            let names: Vec<&str> = others
                .iter()
                .filter_map(|o| o.metadata.name.as_deref())
                .collect();
            return Ok(Some(names.join(", ")));
        }
        let name = &nm.spec.node_name;
        let mut current = Arc::clone(node);
        if let Some((patch, schedulable)) = plan::release_patch(node) {
            let after = act::patch_node(&self.writer, name, patch)
                .await
                .map_err(doing::<Error>(format!("releasing node {name}")))?;
            self.written.replaced(owner(nm), &**node, after.clone());
            current = Arc::new(after);
            if schedulable {
                self.events.normal(
                    &node_ref(node),
                    "UncordonNode",
                    "Release",
                    format!("Node {name} is schedulable again"),
                );
            }
        }
        if self.node_conditions
            && let Some(p) = plan::lifecycle_patch(
                &current,
                &plan::lifecycle_conditions(false, false, false),
                self.clock.now(),
            )
        {
            act::patch_node_status(&self.writer, name, p)
                .await
                .map_err(doing::<Error>("clearing the node's maintenance conditions"))?;
        }
        Ok(None)
    }

    /// NM-12/NM-19: present pods this object targeted, no longer targeted by any other Drain
    /// object, get `TargetedByNodeMaintenance=False/MaintenanceEnded`.
    async fn end_targeting(&self, nm: &NodeMaintenance) {
        let name = nm.metadata.name.clone().unwrap_or_default();
        self.restore(
            &name,
            &nm.spec.node_name,
            nm.status
                .as_ref()
                .unwrap_or(&NodeMaintenanceStatus::default()),
        );
        let me = nm.metadata.uid.clone();
        let others: Vec<Arc<NodeMaintenance>> = self
            .on_node(&nm.spec.node_name)
            .into_iter()
            .filter(|o| o.metadata.uid != me && plan::is_draining(o))
            .collect();
        let targets = self.targets_of(&name);
        let now = self.clock.now();
        for (uid, t) in targets {
            let Some(pod) = self.pods.get(&format!("{}/{}", t.namespace, t.name)) else {
                continue;
            };
            let targeted = pod
                .condition(POD_CONDITION_TARGETED)
                .is_some_and(|c| c.status == "True");
            if pod_uid(&pod) != uid || !targeted {
                continue;
            }
            let still = others.iter().any(|o| {
                matches!(
                    classify::classify(
                        &pod,
                        &o.spec.drain,
                        |ns, n| self.daemonsets.get(&format!("{ns}/{n}")).is_some(),
                        now
                    ),
                    Class::Target { .. }
                )
            });
            if still {
                continue;
            }
            let cond = PodCondition {
                type_: POD_CONDITION_TARGETED.into(),
                status: "False".into(),
                reason: Some(REASON_MAINTENANCE_ENDED.into()),
                message: Some(format!(
                    "NodeMaintenance {name} on node {} ended",
                    nm.spec.node_name
                )),
                last_transition_time: Some(Time(now)),
                observed_generation: pod.metadata.generation,
                last_probe_time: None,
            };
            if let Err(e) =
                act::set_pod_condition(&self.writer, &t.namespace, &t.name, &uid, &cond).await
            {
                tracing::warn!(pod = %pod.key(), error = %e, "ending the TargetedByNodeMaintenance condition failed");
            }
            self.tracker.update(&uid, |r| r.condition_message = None);
        }
    }

    /// Writes the status when it changed: at once on a phase change or an accepted eviction
    /// ([`status::write_now`]), else at most once a second (returns how long until the next
    /// write may go).
    async fn write_status(
        &self,
        nm: &Arc<NodeMaintenance>,
        mut st: NodeMaintenanceStatus,
        force: bool,
    ) -> Result<Duration, Error> {
        st.observed_generation = nm.metadata.generation;
        let old = nm.status.clone().unwrap_or_default();
        let patch = status::merge_patch(
            &serde_json::to_value(&old).unwrap_or_default(),
            &serde_json::to_value(&st).unwrap_or_default(),
        );
        // Compared as written: times are whole seconds on the wire and the tracker's are not, so
        // comparing the structs would find a change every sync once a target was tried.
        if patch.as_object().is_some_and(|o| o.is_empty()) {
            return Ok(RESYNC);
        }
        let name = nm.metadata.name.clone().unwrap_or_default();
        let urgent = status::write_now(&old, &st);
        let since = self
            .memory()
            .get(&name)
            .and_then(|m| m.last_status_write)
            .map(|t| t.elapsed());
        if !force
            && !urgent
            && let Some(since) = since.filter(|s| *s < STATUS_EVERY)
        {
            return Ok(STATUS_EVERY.saturating_sub(since));
        }
        match act::patch_status(&self.writer, &name, patch).await {
            Ok(after) => {
                self.written.replaced(owner(nm), &**nm, after);
                if let Some(m) = self.memory().get_mut(&name) {
                    m.last_status_write = Some(Instant::now());
                    m.last_error = None;
                }
                Ok(RESYNC)
            }
            Err(e) if shared::api::apierr::is_not_found(&e) => Ok(RESYNC),
            Err(e) => Err(doing::<Error>("writing the status")(e)),
        }
    }

    /// `pilothouse_nodemaintenance_objects{phase}` from the cache.
    pub fn count_phases(&self) {
        let mut counts: HashMap<&'static str, i64> =
            Phase::ALL.iter().map(|p| (p.as_str(), 0)).collect();
        for o in self.objects.list() {
            if let Some(p) = o.status.as_ref().and_then(|s| s.phase) {
                *counts.entry(p.as_str()).or_default() += 1;
            }
        }
        for (phase, n) in counts {
            self.metrics
                .objects
                .get_or_create(&crate::metrics::PhaseLabel {
                    phase: phase.into(),
                })
                .set(n);
        }
    }
}

/// NM-2: the object's owner reference names a Node of another UID.
fn replaced(nm: &NodeMaintenance, node: &Node) -> bool {
    node_owner(nm).is_some_and(|o| Some(&o.uid) != node.metadata.uid.as_ref())
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
