//! One sync of one NodeMaintenance: observe the object, its node, the node's pods and the
//! budgets in the caches; decide ([`plan`], [`crate::classify`], [`crate::evict`],
//! [`crate::conditions`], [`status`]); act ([`act`]); and remember per object what the status
//! cannot hold between syncs. Here: the dispatch by stage and its steps (NM-1..NM-8, the cordon,
//! the status write); the drain step is [`crate::drain`], stage Complete and the release
//! [`crate::release`].

use crate::metrics::{Metrics, ObjectLabel, OutcomeLabel};
use crate::status;
use crate::tracker::Tracker;
use crate::types::*;
use crate::{Error, act, plan};
use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::{Node, ObjectReference};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use shared::api::apierr::doing;
use shared::api::writer::Writer;
use shared::cache::informers::Informer;
use shared::cache::pod::Pod;
use shared::cache::written::Written;
use shared::meta::clock::Clock;
use shared::runtime::controller::Ctx;
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
/// One target as the object remembers it (its pod may be gone).
#[derive(Clone, Debug)]
pub(crate) struct Target {
    pub(crate) namespace: String,
    pub(crate) name: String,
    pub(crate) created: Option<Timestamp>,
    pub(crate) priority: Option<i32>,
}

/// What the controller remembers of one object between syncs.
#[derive(Default)]
pub(crate) struct Memory {
    pub(crate) uid: String,
    /// Every target ever selected, by pod UID.
    pub(crate) targets: BTreeMap<String, Target>,
    /// Rebuilt from `status.targetedPods` once per process.
    pub(crate) restored: bool,
    pub(crate) last_status_write: Option<Instant>,
    pub(crate) last_error: Option<String>,
    /// NM-5: BeginMaintenance was emitted (a failed cordon must not repeat it).
    pub(crate) begun: bool,
    /// NM-17: the budgets this object warned of a deadlock (once per object and budget).
    pub(crate) deadlock_warned: std::collections::HashSet<String>,
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
    pub(crate) written: Written,
    pub(crate) memory: Mutex<HashMap<String, Memory>>,
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
        .find(|o| shared::meta::refs::refers_to_version::<Node>(o))
}

pub(crate) fn pod_uid(p: &Pod) -> &str {
    p.metadata.uid.as_deref().unwrap_or_default()
}

pub(crate) fn pod_ref(namespace: &str, name: &str, uid: &str) -> ObjectReference {
    ObjectReference {
        uid: Some(uid.to_string()).filter(|u| !u.is_empty()),
        ..core_ref("Pod", &format!("{namespace}/{name}"))
    }
}

pub(crate) fn node_ref(node: &Node) -> ObjectReference {
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

/// The owner key of an object's own-writes record: its name (the kind is cluster-scoped).
pub(crate) fn owner(nm: &NodeMaintenance) -> &str {
    nm.metadata.name.as_deref().unwrap_or_default()
}

/// The caches the controller reads.
pub struct Caches {
    pub objects: Arc<Informer<NodeMaintenance>>,
    pub nodes: Arc<Informer<Node>>,
    pub pods: Arc<Informer<Pod>>,
    pub pdbs: Arc<Informer<PodDisruptionBudget>>,
    pub daemonsets: Arc<Informer<DaemonSet>>,
}

impl NodeMaintenanceController {
    /// `node_conditions`: NM-23's `--nodemaintenance-node-lifecycle-conditions`.
    pub fn new(
        caches: Caches,
        tracker: Arc<Tracker>,
        node_conditions: bool,
        ctx: Ctx<Metrics>,
    ) -> Self {
        let Caches {
            objects,
            nodes,
            pods,
            pdbs,
            daemonsets,
        } = caches;
        let Ctx {
            writer,
            events,
            clock,
            metrics,
            ..
        } = ctx;
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

    pub(crate) fn memory(&self) -> std::sync::MutexGuard<'_, HashMap<String, Memory>> {
        shared::lock(&self.memory)
    }

    /// The objects naming `node`, freshest copies.
    pub(crate) fn on_node(&self, node: &str) -> Vec<Arc<NodeMaintenance>> {
        self.objects
            .by_index(crate::handlers::INDEX_NM_NODE, node)
            .into_iter()
            .map(|o| self.written.freshest(o))
            .collect()
    }

    fn node(&self, name: &str) -> Option<Arc<Node>> {
        self.nodes.get(name).map(|n| self.written.freshest(n))
    }

    /// One sync of the object `name`: NM-1 (deleting), NM-2 (no node), NM-3/NM-5 (owner
    /// reference and finalizer), then the step of its stage.
    pub async fn sync(&self, name: &str) -> Result<Next, Error> {
        let Some(cached) = self.objects.get(name) else {
            self.forget(name);
            return Ok(Next::Done);
        };
        let nm = self.written.freshest(cached);
        self.remember(name, &nm);
        // NM-1: a deleting object releases and lets go, nothing else.
        if nm.metadata.deletion_timestamp.is_some() {
            if has_finalizer(&nm) {
                self.finish_deletion(&nm).await?;
            }
            return Ok(Next::Done);
        }
        let now = self.clock.now();
        let st = nm.status.clone().unwrap_or_default();
        let generation = nm.metadata.generation;
        // NM-2: no node, or another node of the same name.
        let node = match self.node(&nm.spec.node_name) {
            Some(n) if !replaced(&nm, &n) => n,
            other => return self.no_node(&nm, other.is_some(), st, now).await,
        };
        // NM-3, NM-5: owner reference, and the finalizer before any node write.
        let nm = self.ensure_meta(&nm, &node).await?;
        match nm.spec.stage {
            Stage::Idle => self.idle(&nm, st, generation, now).await,
            Stage::Complete => self.complete(&nm, &node, st, now).await,
            Stage::Cordon | Stage::Drain => self.active(&nm, &node, st, now).await,
        }
    }

    /// The object is gone: what we remember of it goes too.
    fn forget(&self, name: &str) {
        self.memory().remove(name);
        self.written.forget(name);
        self.metrics.blocked_pods.remove(&ObjectLabel {
            nodemaintenance: name.to_string(),
        });
    }

    /// The memory of `name` is the memory of this object: another UID (the object was
    /// recreated) starts afresh.
    fn remember(&self, name: &str, nm: &NodeMaintenance) {
        let uid = nm.metadata.uid.clone().unwrap_or_default();
        let mut mem = self.memory();
        let m = mem.entry(name.to_string()).or_default();
        if m.uid != uid {
            *m = Memory {
                uid,
                ..Memory::default()
            };
        }
    }

    /// NM-1: a deleting object that still has our finalizer: end the targeting, release the
    /// node (if it is still ours), drop the finalizer, RemovedMaintenance.
    async fn finish_deletion(&self, nm: &Arc<NodeMaintenance>) -> Result<(), Error> {
        let node = self.node(&nm.spec.node_name);
        let node = node.filter(|n| !replaced(nm, n));
        self.end_targeting(nm).await;
        let released = match &node {
            Some(node) => self.release(nm, node).await.map(drop),
            None => Ok(()),
        };
        if let Err(e) = released {
            // Cleanup is still running: say so, and retry.
            let mut st = nm.status.clone().unwrap_or_default();
            st.phase = Some(Phase::Completing);
            let _ = self.write_status(nm, st, false).await;
            return Err(e);
        }
        self.remove_finalizer(nm).await?;
        let st = nm.status.clone().unwrap_or_default();
        if let Some(c) = status::condition(&st.conditions, CONDITION_DRAINED)
            && c.status != "True"
            && c.reason != "Cancelled"
        {
            self.observe_drain_end(nm, "cancelled", self.clock.now());
        }
        self.events.normal(
            &shared::meta::refs::object_reference(nm.as_ref()),
            "RemovedMaintenance",
            "Release",
            format!("Removed maintenance of node {}", nm.spec.node_name),
        );
        Ok(())
    }

    /// NM-2: no node (`NodeNotFound`, warned once per generation), or another node of the same
    /// name (`NodeReplaced`): phase Pending, no finalizer, no node writes.
    async fn no_node(
        &self,
        nm: &Arc<NodeMaintenance>,
        node_replaced: bool,
        mut st: NodeMaintenanceStatus,
        now: Timestamp,
    ) -> Result<Next, Error> {
        let generation = nm.metadata.generation;
        let reason = if node_replaced {
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
            if node_replaced {
                "was replaced by a new node of the same name"
            } else {
                "not found"
            }
        );
        for c in [CONDITION_CORDONED, CONDITION_DRAINED] {
            status::set_condition(&mut st.conditions, c, false, reason, &msg, now, generation);
        }
        st.phase = Some(Phase::Pending);
        // M8/M9: no finalizer while there is no node to release (and no node writes).
        if has_finalizer(nm) {
            self.remove_finalizer(nm).await?;
        }
        let nm = self.written.freshest(Arc::clone(nm));
        self.write_status(&nm, st, true).await?;
        Ok(Next::Done)
    }

    /// NM-4: stage Idle touches nothing and reports NotRequested.
    async fn idle(
        &self,
        nm: &Arc<NodeMaintenance>,
        mut st: NodeMaintenanceStatus,
        generation: Option<i64>,
        now: Timestamp,
    ) -> Result<Next, Error> {
        st.phase = Some(Phase::Idle);
        for (c, r) in [
            (CONDITION_CORDONED, "NotRequested"),
            (CONDITION_DRAINED, "NotRequested"),
            (CONDITION_EVICTION_BLOCKED, "NotBlocked"),
            (CONDITION_DEADLINE_EXCEEDED, "NoDeadline"),
        ] {
            status::set_condition(&mut st.conditions, c, false, r, "", now, generation);
        }
        self.write_status(nm, st, false).await?;
        Ok(Next::Done)
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

    pub(crate) async fn remove_finalizer(&self, nm: &NodeMaintenance) -> Result<(), Error> {
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
            st.last_error = Some(crate::status::bounded_error(e));
        }
        let mut next = self.write_status(nm, st, false).await?;
        // After the status: a node patch that keeps failing must not keep the drain's targets
        // unlisted, and so unevicted.
        if self.node_conditions {
            self.mark_node(nm, &node, drained, now).await?;
        }
        if let Some(w) = wake {
            let d = to_std(w.duration_since(self.clock.now())).max(Duration::from_millis(100));
            next = next.min(d);
        }
        Ok(Next::After(next.min(RESYNC)))
    }

    /// NM-23: the node's KEP-5683 conditions while an object acts on it; `drained` is this
    /// object's drain as this sync found it.
    async fn mark_node(
        &self,
        nm: &NodeMaintenance,
        node: &Node,
        drained: bool,
        now: Timestamp,
    ) -> Result<(), Error> {
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
        if let Some(p) = plan::lifecycle_patch(node, &wanted, now) {
            act::patch_node_status(&self.writer, &nm.spec.node_name, p)
                .await
                .map_err(doing::<Error>("patching the node's maintenance conditions"))?;
        }
        Ok(())
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

    /// `pilothouse_nodemaintenance_drain_duration_seconds`: one observation per drain, at its end
    /// (the transition to Drained or Cancelled), of `status.drain.startTime` → `end`.
    pub(crate) fn observe_drain_end(&self, nm: &NodeMaintenance, outcome: &str, end: Timestamp) {
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

    /// Writes the status when it changed: at once on a phase change or an accepted eviction
    /// ([`status::write_now`]), else at most once a second (returns how long until the next
    /// write may go).
    pub(crate) async fn write_status(
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
