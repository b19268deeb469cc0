//! One sync of one node (NL-1..NL-9, NL-17) and of one pod (NL-7): observe the caches and what
//! this controller remembers of the node, ask [`plan`] what to change, write it through
//! [`act`]. A node's timer is a delayed requeue of its key at `probe + grace` (NB-2); the full
//! pass every `--node-monitor-period` queues every node too. Zone queues and the tainter are in
//! [`crate::zones`].

use crate::act::Act;
use crate::metrics::{KindLabel, Metrics};
use crate::zones::Zone;
use crate::{Error, NODE_LEASE_NAMESPACE, NodeLifecycleOptions, plan};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;
use plan::{NoExecuteStep, TaintChange};
use shared::cache::informers::parse_rv;
use shared::cache::informers::{Change, Informer};
use shared::cache::pod::INDEX_POD_NODE;
use shared::cache::pod::Pod;
use shared::cache::written::Behind;
use shared::meta::keys::object_key;
use shared::runtime::controller::Ctx;
use shared::runtime::events::{EventRecorder, core_ref};
use shared::runtime::queue::{Next, Queue};
use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;
use tokio::time::Instant;

/// NL-LB's answer for a node whose grace ran out.
enum LeaseCheck {
    /// The cache shows the live Lease (or the gate is off): mark the node.
    Current,
    /// The live Lease is newer than the cache: fenced from now on (counted as a stale skip).
    Behind(Behind),
    /// A fence set earlier still holds.
    Fenced,
    /// A renewal reached the cache after the node was judged.
    Renewed,
}

/// What this controller remembers of one node (in memory only, NL-2).
pub(crate) struct NodeMemory {
    /// The node's UID as last seen (its own writes are remembered by UID).
    pub(crate) uid: String,
    /// Local time of the last observed heartbeat or Lease renewal.
    pub(crate) probe: Instant,
    heartbeat: Option<Timestamp>,
    renew: Option<Timestamp>,
    /// Ready status as last evaluated (after our own writes).
    pub(crate) ready: Option<String>,
    pub(crate) zone: String,
    /// Labelled `node.kubernetes.io/exclude-disruption` (left out of zone statistics).
    excluded: bool,
    /// When the grace period of the current outage ran out (for detection latency).
    pub(crate) expired: Option<Instant>,
}

impl NodeMemory {
    /// What zone states depend on: they are recomputed only when one of these changes.
    fn zone_inputs(&self) -> (Option<String>, String, bool) {
        (self.ready.clone(), self.zone.clone(), self.excluded)
    }
}

pub struct NodeLifecycleController {
    pub(crate) opts: NodeLifecycleOptions,
    pub nodes: Arc<Informer<Node>>,
    pub(crate) leases: Arc<Informer<Lease>>,
    pub(crate) pods: Arc<Informer<Pod>>,
    pub queue: Arc<Queue<String>>,
    pub(crate) pod_queue: Arc<Queue<String>>,
    /// Per-node memory, by node name.
    memory: Mutex<HashMap<String, NodeMemory>>,
    pub(crate) zones: Mutex<BTreeMap<String, Zone>>,
    /// Every zone fully disrupted (master disruption mode, NL-14).
    pub(crate) all_full: AtomicBool,
    /// The full pass under way: when it started and the nodes it queued that are not yet
    /// evaluated (`node_collector_update_all_nodes_health_duration_seconds`).
    pass: Mutex<Option<(Instant, HashSet<String>)>>,
    pub(crate) act: Act,
    events: EventRecorder,
    pub(crate) metrics: Metrics,
    /// NodeControllerLeaseCircuitBreaker (kcm 1.37, beta, on by default).
    circuit_breaker: bool,
    /// The resourceVersion of a live Lease newer than the cache showed: until the Lease cache
    /// has delivered it, no node is marked unreachable (NL-LB).
    lease_fence: AtomicU64,
}

pub(crate) use shared::lock;

fn heartbeat(node: &Node) -> Option<Timestamp> {
    plan::condition(node, "Ready")
        .and_then(|c| c.last_heartbeat_time.as_ref())
        .map(|t| t.0)
}

fn renew_time(lease: &Lease) -> Option<Timestamp> {
    lease.spec.as_ref()?.renew_time.as_ref().map(|t| t.0)
}

/// NL-7: a pod added to or moved onto a node is synced.
pub fn pod_keys(change: &Change<Pod>) -> Vec<String> {
    let node = |p: &Pod| p.spec.as_ref().and_then(|s| s.node_name.clone());
    let relevant = match change {
        Change::Added(p) => node(p).is_some(),
        Change::Updated { old, new } => node(old) != node(new) && node(new).is_some(),
        Change::Deleted(_) => false,
    };
    if relevant {
        vec![object_key(change.object().as_ref())]
    } else {
        vec![]
    }
}

/// The caches the controller reads.
pub struct Caches {
    pub nodes: Arc<Informer<Node>>,
    pub leases: Arc<Informer<Lease>>,
    pub pods: Arc<Informer<Pod>>,
}

impl NodeLifecycleController {
    /// `queues`: the node queue and the pod queue.
    pub fn new(
        opts: NodeLifecycleOptions,
        caches: Caches,
        (queue, pod_queue): (Arc<Queue<String>>, Arc<Queue<String>>),
        ctx: Ctx<Metrics>,
    ) -> NodeLifecycleController {
        let Caches {
            nodes,
            leases,
            pods,
        } = caches;
        let Ctx {
            writer,
            events,
            clock,
            metrics,
            gates,
        } = ctx;
        let act = Act::new(writer, clock);
        NodeLifecycleController {
            opts,
            nodes,
            leases,
            pods,
            queue,
            pod_queue,
            memory: Mutex::new(HashMap::new()),
            zones: Mutex::new(BTreeMap::new()),
            all_full: AtomicBool::new(false),
            pass: Mutex::new(None),
            act,
            events,
            metrics,
            circuit_breaker: gates.node_controller_lease_circuit_breaker,
            lease_fence: AtomicU64::new(0),
        }
    }

    pub(crate) fn memory(&self) -> MutexGuard<'_, HashMap<String, NodeMemory>> {
        lock(&self.memory)
    }

    /// NL-1: the probe time is when a change is *observed*, so it is taken here, on the watch,
    /// not when a worker gets to the node (which can be much later under load and would spread
    /// simultaneous failures over several batch windows).
    pub fn node_changed(&self, change: &Change<Node>) {
        let name = change.object().name_any();
        if let Some(hb) = heartbeat(change.object()) {
            self.observed(&name, |m, now| {
                if m.heartbeat != Some(hb) {
                    m.heartbeat = Some(hb);
                    m.probe = now;
                }
            });
        }
        self.queue.add(name);
    }

    /// NL-1: a Lease renewal later than the recorded one is a probe.
    pub fn lease_changed(&self, change: &Change<Lease>) {
        let lease = change.object();
        if lease.metadata.namespace.as_deref() != Some(NODE_LEASE_NAMESPACE)
            || matches!(change, Change::Deleted(_))
        {
            return;
        }
        let name = lease.name_any();
        if let Some(renew) = renew_time(lease) {
            self.observed(&name, |m, now| {
                if m.renew.is_none_or(|r| renew > r) {
                    m.renew = Some(renew);
                    m.probe = now;
                }
            });
        }
        self.queue.add(name);
    }

    /// The full pass of NL-5 (and, on start, NL-17: every node counts as added).
    pub fn full_pass(&self) {
        let names: HashSet<String> = self.nodes.list().iter().map(|n| n.name_any()).collect();
        {
            // One pass is timed at a time: a pass that outlasts the period absorbs the next.
            let mut pass = lock(&self.pass);
            if pass.is_none() && !names.is_empty() {
                *pass = Some((Instant::now(), names.clone()));
            }
        }
        for n in names {
            self.queue.add(n);
        }
    }

    /// `name` has been evaluated: the timed full pass ends with its last node.
    fn evaluated(&self, name: &str) {
        let mut pass = lock(&self.pass);
        if let Some((started, pending)) = pass.as_mut() {
            pending.remove(name);
            if pending.is_empty() {
                self.metrics
                    .all_nodes_duration
                    .observe(started.elapsed().as_secs_f64());
                *pass = None;
            }
        }
    }

    /// A detection-latency sample: `since` (a grace expiry) to now, less `excluded`.
    pub(crate) fn detected(&self, kind: &'static str, since: Instant, excluded: Duration) {
        let latency = Instant::now()
            .saturating_duration_since(since)
            .saturating_sub(excluded);
        self.metrics
            .detection
            .get_or_create(&KindLabel { kind })
            .observe(latency.as_secs_f64());
    }

    /// Applies an observation to a known node's memory (unknown nodes start in `observe`).
    fn observed(&self, name: &str, f: impl FnOnce(&mut NodeMemory, Instant)) {
        if let Some(m) = self.memory().get_mut(name) {
            f(m, Instant::now());
        }
    }

    /// NL-1/NL-2: updates the probe time from what the caches show; returns (probe, first time).
    fn observe(&self, node: &Node, now: Instant) -> (Instant, bool) {
        let name = node.name_any();
        let uid = node.metadata.uid.clone().unwrap_or_default();
        let hb = heartbeat(node);
        let renew = self
            .leases
            .get(&format!("{NODE_LEASE_NAMESPACE}/{name}"))
            .and_then(|l| renew_time(&l));
        let mut memory = self.memory();
        match memory.get_mut(&name) {
            Some(m) => {
                if hb.is_some() && hb != m.heartbeat {
                    m.heartbeat = hb;
                    m.probe = now;
                }
                if renew.is_some() && renew > m.renew {
                    m.renew = renew;
                    m.probe = now;
                }
                m.uid = uid;
                m.zone = plan::zone_key(node);
                m.excluded = plan::excluded_from_disruption(node);
                (m.probe, false)
            }
            None => {
                // A node that never posted Ready starts at its creation, unless its Lease is seen.
                let probe = if plan::ready_status(node).is_none() && renew.is_none() {
                    let wall = self.act.clock.now();
                    let created = node
                        .metadata
                        .creation_timestamp
                        .as_ref()
                        .map_or(wall, |t| t.0);
                    let age = wall.duration_since(created).unsigned_abs();
                    now.checked_sub(age).unwrap_or(now)
                } else {
                    now
                };
                memory.insert(
                    name,
                    NodeMemory {
                        uid,
                        probe,
                        heartbeat: hb,
                        renew,
                        ready: plan::ready_status(node).map(Into::into),
                        zone: plan::zone_key(node),
                        excluded: plan::excluded_from_disruption(node),
                        expired: None,
                    },
                );
                (probe, true)
            }
        }
    }

    /// The node is gone from the cache: forget it (NL-17 `RemovingNode`).
    async fn node_gone(&self, name: &str) {
        if let Some(m) = self.memory().remove(name) {
            self.act.own.forget(&m.uid);
            self.events.normal(
                &core_ref("Node", name),
                "RemovingNode",
                "RemoveNode",
                format!("Node {name} event: Removing Node {name} from Controller"),
            );
        }
        for z in lock(&self.zones).values_mut() {
            z.queue.retain(|(n, _)| n != name);
        }
        self.recompute_zones().await;
        self.evaluated(name);
    }

    /// One node's sync: NL-1..NL-5 health, NL-6 pods, NL-8 NoSchedule and NL-9 NoExecute taints.
    pub async fn sync_node(&self, name: &str) -> Result<Next, Error> {
        let started = Instant::now();
        let now = started;
        let Some(node) = self.nodes.get(name) else {
            self.node_gone(name).await;
            return Ok(Next::Done);
        };
        let counted = self.memory().get(name).map(NodeMemory::zone_inputs);
        let (probe, first) = self.observe(&node, now);
        if first {
            self.events.normal(
                &core_ref("Node", name),
                "RegisteredNode",
                "RegisterNode",
                format!("Node {name} event: Registered Node {name} in Controller"),
            );
        }
        let grace = plan::grace(
            plan::ready_status(&node).is_some(),
            self.opts.node_monitor_grace_period,
            self.opts.node_startup_grace_period,
        );
        let due = plan::deadline(probe, grace);
        let mut node: Node = (*node).clone();
        let stale = now > due;
        if let Some(m) = self.memory().get_mut(name) {
            m.expired = if stale { m.expired.or(Some(due)) } else { None };
        }
        if stale {
            match self.lease_check(name).await? {
                LeaseCheck::Current => {}
                LeaseCheck::Behind(behind) => return Ok(Next::Stale(behind)),
                // Already fenced: as upstream's short circuit, looked at again next period
                // (the Lease event that renews the node queues it sooner).
                LeaseCheck::Fenced => return Ok(Next::After(self.opts.node_monitor_period)),
                // A renewal reached the cache after this sync judged the node: judge again.
                LeaseCheck::Renewed => return Ok(Next::After(Duration::ZERO)),
            }
            self.mark_unknown(&mut node, name, due).await?;
        }
        if let Some(m) = self.memory().get_mut(name) {
            m.ready = plan::ready_status(&node).map(Into::into);
        }
        self.no_schedule_taints(&mut node, stale, due).await?;
        self.no_execute_taints(&node, name, stale, due).await?;
        // Zone states are a scan of every node: redo it only when this node changed what they
        // count (a full pass must not cost O(nodes²)).
        let after = self.memory().get(name).map(NodeMemory::zone_inputs);
        if first || counted != after {
            self.recompute_zones().await;
        }
        self.metrics
            .node_health_duration
            .observe(started.elapsed().as_secs_f64());
        self.evaluated(name);
        Ok(if stale {
            Next::Done
        } else {
            Next::After(
                due.saturating_duration_since(Instant::now())
                    .saturating_add(Duration::from_millis(1)),
            )
        })
    }

    /// NL-LB (kcm 1.37's NodeControllerLeaseCircuitBreaker): a node whose grace ran out on the
    /// cached Lease may be renewing while the Lease cache lags (a slow or restarting watch), and
    /// marking it would taint and evict a healthy node. So its live Lease is read first; one newer
    /// than the cache fences the marking of every node until the cache has delivered that version (the runtime
    /// counts the skip and runs the key again). Upstream compares with the last Lease whose
    /// renewal it saw, so a Lease updated without a renewal fences its node for ever; this
    /// compares with the cached Lease, which says the same about the cache without that trap.
    /// Only the marking of nodes whose grace ran out waits; other nodes' syncs go on.
    async fn lease_check(&self, name: &str) -> Result<LeaseCheck, Error> {
        if !self.circuit_breaker {
            return Ok(LeaseCheck::Current);
        }
        let seen = self.leases.newest_resource_version();
        if self.lease_fence.load(Ordering::Acquire) > seen {
            return Ok(LeaseCheck::Fenced);
        }
        let cached = self.leases.get(&format!("{NODE_LEASE_NAMESPACE}/{name}"));
        // The node was judged on the renewal its memory holds; a later one in the cache now
        // means the judgement is already out of date.
        let judged = self.memory().get(name).and_then(|m| m.renew);
        if cached.as_deref().and_then(renew_time) > judged {
            return Ok(LeaseCheck::Renewed);
        }
        let cached = cached.and_then(|l| l.metadata.resource_version.clone());
        let live = match self.act.live_lease(name).await? {
            Some(lease) => lease.metadata.resource_version,
            // No Lease at all: the cache is not hiding a renewal.
            None => return Ok(LeaseCheck::Current),
        };
        let wrote = live.as_deref().and_then(parse_rv).unwrap_or(0);
        if live != cached && wrote > seen {
            self.lease_fence.fetch_max(wrote, Ordering::AcqRel);
            tracing::info!(node = name, cached = ?cached, live = ?live, "the Lease cache is behind the node's live Lease: no node is marked unreachable until it catches up");
            return Ok(LeaseCheck::Behind(Behind {
                group: "coordination.k8s.io",
                resource: "leases",
                wrote,
                seen,
            }));
        }
        Ok(LeaseCheck::Current)
    }

    /// NL-4: the node's grace ran out at `due`: its conditions go Unknown, and NL-6 follows
    /// when that moved Ready off True.
    async fn mark_unknown(&self, node: &mut Node, name: &str, due: Instant) -> Result<(), Error> {
        let before = plan::ready_status(node).map(String::from);
        // Count the node as Unknown in its zone at once (NL-5): the status write below may be
        // slow, and zone states must see the whole batch before any NoExecute token is spent.
        let marked = before.as_deref() != Some("Unknown")
            && self
                .memory()
                .get_mut(name)
                .map(|m| m.ready = Some("Unknown".into()))
                .is_some();
        if marked {
            self.recompute_zones().await;
        }
        if let Some(updated) = self.act.stale_conditions(node).await? {
            self.detected("condition", due, Duration::ZERO);
            *node = updated;
            if before.as_deref() == Some("True") {
                self.node_not_ready(node).await;
            }
        }
        Ok(())
    }

    /// NL-8: NoSchedule taints, never rate limited.
    async fn no_schedule_taints(
        &self,
        node: &mut Node,
        stale: bool,
        due: Instant,
    ) -> Result<(), Error> {
        let change = plan::no_schedule_change(node);
        if !change.is_empty() {
            *node = self.act.taints(node, plan::no_schedule_change).await?;
            if stale && change.add.iter().any(|t| t.key == plan::UNREACHABLE) {
                self.detected("noschedule", due, Duration::ZERO);
            }
        }
        Ok(())
    }

    /// NL-9: NoExecute taints: swapped or cleared at once, added through the zone queue (NL-10);
    /// none while every zone is fully disrupted (NL-14).
    async fn no_execute_taints(
        &self,
        node: &Node,
        name: &str,
        stale: bool,
        due: Instant,
    ) -> Result<(), Error> {
        if plan::ready_status(node).is_none() || self.all_full.load(Ordering::Acquire) {
            return Ok(());
        }
        match plan::no_execute_step(node) {
            NoExecuteStep::Keep => {}
            NoExecuteStep::Swap(_) => {
                self.act
                    .taints(node, |n| match plan::no_execute_step(n) {
                        NoExecuteStep::Swap(c) => c,
                        _ => TaintChange::default(),
                    })
                    .await?;
                if stale {
                    self.detected("noexecute", due, Duration::ZERO);
                }
            }
            NoExecuteStep::Clear(c) => {
                self.dequeue(name);
                if !c.is_empty() {
                    self.act
                        .taints(node, |n| match plan::no_execute_step(n) {
                            NoExecuteStep::Clear(c) => c,
                            _ => TaintChange::default(),
                        })
                        .await?;
                }
            }
            NoExecuteStep::Enqueue => self.enqueue(&plan::zone_key(node), name),
        }
        Ok(())
    }

    /// NL-6: the controller turned Ready from True to not-True.
    async fn node_not_ready(&self, node: &Node) {
        let name = node.name_any();
        self.events.normal(
            &core_ref("Node", &name),
            "NodeNotReady",
            "NodeNotReady",
            format!("Node {name} status is now: NodeNotReady"),
        );
        for pod in self.pods.by_index(INDEX_POD_NODE, &name) {
            let key = object_key(pod.as_ref());
            if let Err(e) = self.mark_pod_not_ready(&pod).await {
                tracing::warn!(pod = %key, error = %e, "marking pod not ready failed; retrying");
                self.pod_queue.add_rate_limited(key);
            }
        }
    }

    async fn mark_pod_not_ready(&self, pod: &Pod) -> Result<(), Error> {
        if self.act.pod_not_ready(pod).await? {
            self.events.warning(
                &core_ref("Pod", &object_key(pod)),
                "NodeNotReady",
                "MarkPodNotReady",
                "Node is not ready",
            );
        }
        Ok(())
    }

    /// NL-7: a pod on a node whose evaluated Ready is not True is marked too.
    pub async fn sync_pod(&self, key: &str) -> Result<Next, Error> {
        let Some(pod) = self.pods.get(key) else {
            return Ok(Next::Done);
        };
        let Some(node) = pod.spec.as_ref().and_then(|s| s.node_name.clone()) else {
            return Ok(Next::Done);
        };
        let ready = self.memory().get(&node).map(|m| m.ready.clone());
        match ready {
            // Not evaluated yet: skipped.
            None => Ok(Next::Done),
            Some(r) if r.as_deref() == Some("True") => Ok(Next::Done),
            Some(_) => self.mark_pod_not_ready(&pod).await.map(|_| Next::Done),
        }
    }
}
