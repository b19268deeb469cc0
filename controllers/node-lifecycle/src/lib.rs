//! `node-lifecycle-controller` (spec §2): node health from Ready heartbeats and node Leases,
//! judged on this process's clock; Unknown conditions on stale nodes; pods of not-ready nodes
//! marked NotReady; NoSchedule taints from conditions; NoExecute taints through per-zone,
//! rate-limited queues.
//!
//! Each node has a timer at `probe + grace` (a delayed requeue of its key), so a stale node is
//! handled when its grace runs out rather than up to a monitor period later (B-2); a full pass
//! every `--node-monitor-period` re-evaluates every node too. A tainter task spends zone tokens.

pub mod plan;

use futures::FutureExt;
use futures::future::BoxFuture;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Node, Pod, Taint};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, Patch, PatchParams};
use kube::{Client, ResourceExt};
use plan::{NoExecuteStep, Rates, TaintChange, ZoneLimiter, ZoneState};
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use serde_json::json;
use shared::controller::{Controller, InitError, Setup};
use shared::events::{EventRecorder, core_ref};
use shared::flags::duration_arg;
use shared::informers::{Change, INDEX_POD_NODE, Informer, object_key, pod_by_node, split_key};
use shared::metrics::FloatGauge;
use shared::queue::{Next, Queue, run_workers};
use shared::ratelimit::BackoffConfig;
use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

pub const NAME: &str = "node-lifecycle-controller";
/// Upstream's event source for this controller.
pub const EVENT_SOURCE: &str = "node-controller";
const NODE_LEASE_NAMESPACE: &str = "kube-node-lease";
/// Upstream's `NodeEvictionPeriod`: how often zone queues are served.
const TAINT_PASS: Duration = Duration::from_millis(100);
const STATUS_RETRIES: usize = 5;
/// Upstream's `nodeUpdateWorkerSize`.
const NODE_WORKERS: usize = 8;
/// NL-5: expiries within this window form a batch; a queued node waits this long before it may
/// take a token, so the zone state already counts its batch-mates.
const BATCH_WINDOW: Duration = Duration::from_millis(250);

/// kube-controller-manager's node lifecycle options, same names and defaults.
#[derive(Clone, Debug, clap::Args)]
pub struct NodeLifecycleOptions {
    /// The period for syncing NodeStatus in the node lifecycle controller (a full pass; Pilothouse
    /// also evaluates each node when its grace runs out).
    #[arg(long, default_value = "5s", value_parser = duration_arg)]
    pub node_monitor_period: Duration,
    /// Amount of time a running node may be unresponsive before it is marked unhealthy. Must be
    /// N times more than kubelet's nodeStatusUpdateFrequency.
    #[arg(long, default_value = "50s", value_parser = duration_arg)]
    pub node_monitor_grace_period: Duration,
    /// Amount of time a starting node may be unresponsive before it is marked unhealthy.
    #[arg(long, default_value = "60s", value_parser = duration_arg)]
    pub node_startup_grace_period: Duration,
    /// Nodes per second on which NoExecute taints are added, per zone, when the zone is healthy.
    #[arg(long, default_value_t = 0.1)]
    pub node_eviction_rate: f32,
    /// Nodes per second tainted when a zone is unhealthy (ignored for zones not larger than
    /// --large-cluster-size-threshold, which stop instead).
    #[arg(long, default_value_t = 0.01)]
    pub secondary_node_eviction_rate: f32,
    /// Zone size above which the secondary rate applies.
    #[arg(long, default_value_t = 50)]
    pub large_cluster_size_threshold: i32,
    /// Fraction of NotReady nodes (at least 3) at which a zone is PartialDisruption.
    #[arg(long, default_value_t = 0.55)]
    pub unhealthy_zone_threshold: f32,
}

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("writing node {node} status: {source}")]
    Status { node: String, source: kube::Error },
    #[error("writing node {node} taints: {source}")]
    Taints { node: String, source: kube::Error },
    #[error("node {0}: writes kept conflicting")]
    Conflicts(String),
    #[error("marking pod {pod} not ready: {source}")]
    Pod { pod: String, source: kube::Error },
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ZoneLabel {
    zone: String,
}

/// What a detection-latency sample timed: the Unknown conditions, the `unreachable:NoSchedule`
/// taint, or the NoExecute taint.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct KindLabel {
    kind: &'static str,
}

fn detection_histogram() -> Histogram {
    Histogram::new([0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0])
}

struct Metrics {
    zone_health: Family<ZoneLabel, FloatGauge>,
    zone_size: Family<ZoneLabel, Gauge>,
    unhealthy: Family<ZoneLabel, Gauge>,
    evictions: Family<ZoneLabel, Counter>,
    node_health_duration: Histogram,
    all_nodes_duration: Histogram,
    queue_depth: Family<ZoneLabel, Gauge>,
    /// B-2: grace expiry → write accepted, token waits excluded.
    detection: Family<KindLabel, Histogram, fn() -> Histogram>,
}

impl Metrics {
    fn register(r: &shared::metrics::Metrics) -> Metrics {
        let m = Metrics {
            zone_health: Family::default(),
            zone_size: Family::default(),
            unhealthy: Family::default(),
            evictions: Family::default(),
            node_health_duration: Histogram::new(exponential_buckets(0.001, 4.0, 8)),
            all_nodes_duration: Histogram::new(exponential_buckets(0.01, 4.0, 8)),
            queue_depth: Family::default(),
            detection: Family::new_with_constructor(detection_histogram),
        };
        r.register(
            "node_collector_zone_health",
            "Gauge measuring percentage of healthy nodes per zone",
            m.zone_health.clone(),
        );
        r.register(
            "node_collector_zone_size",
            "Gauge measuring number of registered Nodes per zones",
            m.zone_size.clone(),
        );
        r.register(
            "node_collector_unhealthy_nodes_in_zone",
            "Gauge measuring number of not Ready Nodes per zones",
            m.unhealthy.clone(),
        );
        r.register("node_collector_evictions", "Number of Node evictions that happened since current instance of NodeController started", m.evictions.clone());
        r.register(
            "node_collector_update_node_health_duration_seconds",
            "Duration in seconds for NodeController to update the health of a single node",
            m.node_health_duration.clone(),
        );
        r.register(
            "node_collector_update_all_nodes_health_duration_seconds",
            "Duration in seconds for NodeController to update the health of all nodes",
            m.all_nodes_duration.clone(),
        );
        r.register(
            "pilothouse_node_lifecycle_detection_latency_seconds",
            "Seconds from a node's grace expiry to the accepted write of its Unknown conditions, unreachable NoSchedule taint or NoExecute taint, zone-token waits excluded",
            m.detection.clone(),
        );
        r.register(
            "pilothouse_node_lifecycle_taint_queue_depth",
            "Nodes waiting for a zone token",
            m.queue_depth.clone(),
        );
        m
    }
}

/// What this controller remembers of a node (in memory only, NL-2).
struct Health {
    /// Local time of the last observed heartbeat or Lease renewal.
    probe: Instant,
    heartbeat: Option<Timestamp>,
    renew: Option<Timestamp>,
    /// Ready status as last evaluated (after our own writes).
    ready: Option<String>,
    zone: String,
    /// Labelled `node.kubernetes.io/exclude-disruption` (left out of zone statistics).
    excluded: bool,
    /// When the grace period of the current outage ran out (for detection latency).
    expired: Option<Instant>,
}

impl Health {
    /// What zone states depend on: they are recomputed only when one of these changes.
    fn zone_inputs(&self) -> (Option<String>, String, bool) {
        (self.ready.clone(), self.zone.clone(), self.excluded)
    }
}

/// This controller's writes to one node: the resourceVersions they replaced and the node the
/// latest one returned. While the cache still holds a replaced version, the returned node is the
/// freshest copy known, and a write from it needs no read first.
struct Written {
    replaced: Vec<String>,
    last: Node,
}

struct Zone {
    limiter: ZoneLimiter,
    /// FIFO set of nodes waiting for a token, with when each was queued.
    queue: VecDeque<(String, Instant)>,
    state: ZoneState,
}

struct Inner {
    opts: NodeLifecycleOptions,
    nodes: Arc<Informer<Node>>,
    leases: Arc<Informer<Lease>>,
    pods: Arc<Informer<Pod>>,
    queue: Arc<Queue<String>>,
    pod_queue: Arc<Queue<String>>,
    health: Mutex<HashMap<String, Health>>,
    zones: Mutex<BTreeMap<String, Zone>>,
    /// Every zone fully disrupted (master disruption mode, NL-14).
    all_full: AtomicBool,
    /// The full pass under way: when it started and the nodes it queued that are not yet
    /// evaluated (`node_collector_update_all_nodes_health_duration_seconds`).
    pass: Mutex<Option<(Instant, std::collections::HashSet<String>)>>,
    /// Our own writes to each node that the cache may not show yet.
    written: Mutex<HashMap<String, Written>>,
    client: Client,
    events: EventRecorder,
    metrics: Metrics,
    active: AtomicBool,
}

pub struct NodeLifecycle {
    inner: Arc<Inner>,
}

fn heartbeat(node: &Node) -> Option<Timestamp> {
    plan::condition(node, "Ready")
        .and_then(|c| c.last_heartbeat_time.as_ref())
        .map(|t| t.0)
}

/// Builds the controller for `opts`.
pub fn init(
    opts: NodeLifecycleOptions,
) -> impl FnOnce(Setup) -> Result<Box<dyn Controller>, InitError> + Send {
    move |setup: Setup| {
        if opts.node_monitor_grace_period <= Duration::from_secs(45) {
            tracing::warn!(
                grace = ?opts.node_monitor_grace_period,
                "--node-monitor-grace-period should exceed 45s (HTTP/2 ping 30s + read idle 15s)"
            );
        }
        let nodes = setup.informers.get::<Node>();
        let leases = setup
            .informers
            .get_namespaced::<Lease>(NODE_LEASE_NAMESPACE);
        let pods = setup.informers.get::<Pod>();
        pods.add_index(INDEX_POD_NODE, pod_by_node);
        let backoff =
            || BackoffConfig::exponential(Duration::from_millis(20), Duration::from_secs(5));
        let inner = Arc::new(Inner {
            opts,
            nodes: Arc::clone(&nodes),
            leases: Arc::clone(&leases),
            pods: Arc::clone(&pods),
            queue: Queue::new("node_lifecycle_controller", backoff(), &setup.metrics),
            pod_queue: Queue::new("node_lifecycle_controller_pods", backoff(), &setup.metrics),
            health: Mutex::new(HashMap::new()),
            zones: Mutex::new(BTreeMap::new()),
            all_full: AtomicBool::new(false),
            pass: Mutex::new(None),
            written: Mutex::new(HashMap::new()),
            events: EventRecorder::new(setup.events_client.clone(), EVENT_SOURCE, &setup.identity),
            client: setup.client,
            metrics: Metrics::register(&setup.metrics),
            active: AtomicBool::new(false),
        });
        // NL-1: the probe time is when a change is *observed*, so it is taken here, on the
        // watch, not when a worker gets to the node (which can be much later under load and
        // would spread simultaneous failures over several batch windows).
        let weak = Arc::downgrade(&inner);
        nodes.on_change(move |c| {
            if let Some(i) = weak.upgrade().filter(|i| i.active.load(Ordering::Acquire)) {
                let name = c.object().name_any();
                if let Some(hb) = heartbeat(c.object()) {
                    i.observed(&name, |h, now| {
                        if h.heartbeat != Some(hb) {
                            h.heartbeat = Some(hb);
                            h.probe = now;
                        }
                    });
                }
                i.queue.add(name);
            }
        });
        let weak = Arc::downgrade(&inner);
        leases.on_change(move |c| {
            let lease = c.object();
            if lease.metadata.namespace.as_deref() != Some(NODE_LEASE_NAMESPACE)
                || matches!(c, Change::Deleted(_))
            {
                return;
            }
            if let Some(i) = weak.upgrade().filter(|i| i.active.load(Ordering::Acquire)) {
                let name = lease.name_any();
                if let Some(renew) = lease
                    .spec
                    .as_ref()
                    .and_then(|s| s.renew_time.as_ref())
                    .map(|t| t.0)
                {
                    i.observed(&name, |h, now| {
                        if h.renew.is_none_or(|r| renew > r) {
                            h.renew = Some(renew);
                            h.probe = now;
                        }
                    });
                }
                i.queue.add(name);
            }
        });
        // NL-7: a pod added to or moved onto a node.
        let weak = Arc::downgrade(&inner);
        pods.on_change(move |c| {
            let node = |p: &Pod| p.spec.as_ref().and_then(|s| s.node_name.clone());
            let relevant = match c {
                Change::Added(p) => node(p).is_some(),
                Change::Updated { old, new } => node(old) != node(new) && node(new).is_some(),
                Change::Deleted(_) => false,
            };
            if relevant && let Some(i) = weak.upgrade().filter(|i| i.active.load(Ordering::Acquire))
            {
                i.pod_queue.add(object_key(c.object().as_ref()));
            }
        });
        Ok(Box::new(NodeLifecycle { inner }) as Box<dyn Controller>)
    }
}

impl Controller for NodeLifecycle {
    fn run(self: Box<Self>, stop: CancellationToken) -> BoxFuture<'static, ()> {
        let inner = self.inner;
        async move {
            inner.active.store(true, Ordering::Release);
            // NL-17: every node counts as added.
            for n in inner.nodes.list() {
                inner.queue.add(n.name_any());
            }
            let (q, pq, s) = (
                Arc::clone(&inner.queue),
                Arc::clone(&inner.pod_queue),
                stop.clone(),
            );
            tokio::spawn(async move {
                s.cancelled().await;
                q.shut_down();
                pq.shut_down();
            });
            let passes = tokio::spawn(Arc::clone(&inner).periodic(stop.clone()));
            let tainter = tokio::spawn(Arc::clone(&inner).tainter(stop.clone()));
            let i = Arc::clone(&inner);
            let nodes = run_workers(
                Arc::clone(&inner.queue),
                NODE_WORKERS,
                move |name: String| {
                    let i = Arc::clone(&i);
                    async move { i.sync_node(&name).await }
                },
            );
            let i = Arc::clone(&inner);
            let pods = run_workers(Arc::clone(&inner.pod_queue), 2, move |key: String| {
                let i = Arc::clone(&i);
                async move { i.sync_pod(&key).await }
            });
            futures::join!(nodes, pods);
            let _ = futures::join!(passes, tainter);
        }
        .boxed()
    }
}

impl Inner {
    /// The full pass of NL-5: every node, every `--node-monitor-period`.
    async fn periodic(self: Arc<Self>, stop: CancellationToken) {
        let mut tick = tokio::time::interval(self.opts.node_monitor_period);
        loop {
            tokio::select! {
                _ = stop.cancelled() => return,
                _ = tick.tick() => {}
            }
            let names: std::collections::HashSet<String> =
                self.nodes.list().iter().map(|n| n.name_any()).collect();
            {
                // One pass is timed at a time: a pass that outlasts the period absorbs the next.
                let mut pass = self.pass.lock().expect("pass lock");
                if pass.is_none() && !names.is_empty() {
                    *pass = Some((Instant::now(), names.clone()));
                }
            }
            for n in names {
                self.queue.add(n);
            }
        }
    }

    /// `name` has been evaluated: the timed full pass ends with its last node.
    fn evaluated(&self, name: &str) {
        let mut pass = self.pass.lock().expect("pass lock");
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
    fn detected(&self, kind: &'static str, since: Instant, excluded: Duration) {
        let latency = Instant::now()
            .saturating_duration_since(since)
            .saturating_sub(excluded);
        self.metrics
            .detection
            .get_or_create(&KindLabel { kind })
            .observe(latency.as_secs_f64());
    }

    fn rates(&self) -> Rates {
        Rates {
            eviction: self.opts.node_eviction_rate,
            secondary: self.opts.secondary_node_eviction_rate,
            large_cluster_threshold: self.opts.large_cluster_size_threshold.max(0) as usize,
        }
    }

    /// Zones with a node whose grace has run out but which is still counted Ready.
    fn zones_with_unevaluated_expiry(&self, now: Instant) -> std::collections::BTreeSet<String> {
        let grace = self.opts.node_monitor_grace_period;
        self.health
            .lock()
            .expect("health lock")
            .values()
            .filter(|h| h.ready.as_deref() == Some("True") && now > h.probe + grace)
            .map(|h| h.zone.clone())
            .collect()
    }

    /// Applies an observation to a known node's health (unknown nodes start in `observe`).
    fn observed(&self, name: &str, f: impl FnOnce(&mut Health, Instant)) {
        if let Some(h) = self.health.lock().expect("health lock").get_mut(name) {
            f(h, Instant::now());
        }
    }

    /// NL-1/NL-2: updates the probe time from what the caches show; returns (probe, first time).
    fn observe(&self, node: &Node, now: Instant) -> (Instant, bool) {
        let name = node.name_any();
        let hb = heartbeat(node);
        let renew = self
            .leases
            .get(&format!("{NODE_LEASE_NAMESPACE}/{name}"))
            .and_then(|l| l.spec.as_ref()?.renew_time.as_ref().map(|t| t.0));
        let mut health = self.health.lock().expect("health lock");
        match health.get_mut(&name) {
            Some(h) => {
                if hb.is_some() && hb != h.heartbeat {
                    h.heartbeat = hb;
                    h.probe = now;
                }
                if renew.is_some() && renew > h.renew {
                    h.renew = renew;
                    h.probe = now;
                }
                h.zone = plan::zone_key(node);
                h.excluded = plan::excluded_from_disruption(node);
                (h.probe, false)
            }
            None => {
                // A node that never posted Ready starts at its creation, unless its Lease is seen.
                let probe = if plan::ready_status(node).is_none() && renew.is_none() {
                    let created = node
                        .metadata
                        .creation_timestamp
                        .as_ref()
                        .map(|t| t.0)
                        .unwrap_or_else(Timestamp::now);
                    let age = Timestamp::now().duration_since(created).unsigned_abs();
                    now.checked_sub(age).unwrap_or(now)
                } else {
                    now
                };
                health.insert(
                    name,
                    Health {
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

    async fn sync_node(&self, name: &str) -> Result<Next, Error> {
        let started = Instant::now();
        let now = started;
        let Some(node) = self.nodes.get(name) else {
            if self
                .health
                .lock()
                .expect("health lock")
                .remove(name)
                .is_some()
            {
                self.events.normal(
                    &core_ref("Node", name),
                    "RemovingNode",
                    "RemoveNode",
                    format!("Node {name} event: Removing Node {name} from Controller"),
                );
            }
            for z in self.zones.lock().expect("zones lock").values_mut() {
                z.queue.retain(|(n, _)| n != name);
            }
            self.recompute_zones().await;
            self.evaluated(name);
            return Ok(Next::Done);
        };
        let counted = self
            .health
            .lock()
            .expect("health lock")
            .get(name)
            .map(Health::zone_inputs);
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
        let due = probe + grace;
        let mut node: Node = (*node).clone();
        let stale = now > due;
        if let Some(h) = self.health.lock().expect("health lock").get_mut(name) {
            h.expired = if stale { h.expired.or(Some(due)) } else { None };
        }
        if stale {
            let before = plan::ready_status(&node).map(String::from);
            // Count the node as Unknown in its zone at once (NL-5): the status write below may be
            // slow, and zone states must see the whole batch before any NoExecute token is spent.
            let marked = before.as_deref() != Some("Unknown") && {
                let mut health = self.health.lock().expect("health lock");
                health
                    .get_mut(name)
                    .map(|h| h.ready = Some("Unknown".into()))
                    .is_some()
            };
            if marked {
                self.recompute_zones().await;
            }
            if let Some(updated) = self.write_stale_conditions(&node).await? {
                self.detected("condition", due, Duration::ZERO);
                node = updated;
                if before.as_deref() == Some("True") {
                    self.node_not_ready(&node).await;
                }
            }
        }
        if let Some(h) = self.health.lock().expect("health lock").get_mut(name) {
            h.ready = plan::ready_status(&node).map(Into::into);
        }
        // NL-8: NoSchedule taints, never rate limited.
        let change = plan::no_schedule_change(&node);
        if !change.is_empty() {
            node = self.write_taints(&node, plan::no_schedule_change).await?;
            if stale && change.add.iter().any(|t| t.key == plan::UNREACHABLE) {
                self.detected("noschedule", due, Duration::ZERO);
            }
        }
        // NL-9: NoExecute taints.
        if plan::ready_status(&node).is_some() && !self.all_full.load(Ordering::Acquire) {
            match plan::no_execute_step(&node) {
                NoExecuteStep::Keep => {}
                NoExecuteStep::Swap(_) => {
                    node = self
                        .write_taints(&node, |n| match plan::no_execute_step(n) {
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
                        node = self
                            .write_taints(&node, |n| match plan::no_execute_step(n) {
                                NoExecuteStep::Clear(c) => c,
                                _ => TaintChange::default(),
                            })
                            .await?;
                    }
                }
                NoExecuteStep::Enqueue => self.enqueue(&plan::zone_key(&node), name),
            }
        }
        let _ = node;
        // Zone states are a scan of every node: redo it only when this node changed what they
        // count (a full pass must not cost O(nodes²)).
        let after = self
            .health
            .lock()
            .expect("health lock")
            .get(name)
            .map(Health::zone_inputs);
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
            Next::After(due.saturating_duration_since(Instant::now()) + Duration::from_millis(1))
        })
    }

    fn enqueue(&self, zone: &str, name: &str) {
        let mut zones = self.zones.lock().expect("zones lock");
        let rate = self.opts.node_eviction_rate;
        let z = zones.entry(zone.to_string()).or_insert_with(|| Zone {
            limiter: ZoneLimiter::new(rate, Instant::now()),
            queue: VecDeque::new(),
            state: ZoneState::Initial,
        });
        if !z.queue.iter().any(|(n, _)| n == name) {
            z.queue.push_back((name.to_string(), Instant::now()));
        }
        self.metrics
            .queue_depth
            .get_or_create(&ZoneLabel {
                zone: zone.to_string(),
            })
            .set(z.queue.len() as i64);
    }

    fn dequeue(&self, name: &str) {
        for (zone, z) in self.zones.lock().expect("zones lock").iter_mut() {
            let before = z.queue.len();
            z.queue.retain(|(n, _)| n != name);
            if z.queue.len() != before {
                self.metrics
                    .queue_depth
                    .get_or_create(&ZoneLabel { zone: zone.clone() })
                    .set(z.queue.len() as i64);
            }
        }
    }

    /// NL-12..NL-14: zone states, limiter rates and gauges from the evaluated Ready statuses.
    async fn recompute_zones(&self) {
        let nodes = self.nodes.list();
        let evaluated: Vec<(Arc<Node>, bool)> = {
            let health = self.health.lock().expect("health lock");
            nodes
                .into_iter()
                .map(|n| {
                    let ready = health
                        .get(&n.name_any())
                        .and_then(|h| h.ready.clone())
                        .or_else(|| plan::ready_status(&n).map(String::from));
                    (n, ready.as_deref() == Some("True"))
                })
                .collect()
        };
        let counts = plan::zone_counts(evaluated.iter().map(|(n, r)| (n.as_ref(), *r)));
        let threshold = self.opts.unhealthy_zone_threshold;
        let states: BTreeMap<&String, ZoneState> = counts
            .iter()
            .map(|(z, c)| (z, plan::zone_state(c.ready, c.not_ready, threshold)))
            .collect();
        let all_full =
            !states.is_empty() && states.values().all(|s| *s == ZoneState::FullDisruption);
        let was_full = self.all_full.swap(all_full, Ordering::AcqRel);
        let now = Instant::now();
        {
            let mut zones = self.zones.lock().expect("zones lock");
            for (zone, c) in &counts {
                let state = states[zone];
                let z = zones.entry(zone.clone()).or_insert_with(|| Zone {
                    limiter: ZoneLimiter::new(self.opts.node_eviction_rate, now),
                    queue: VecDeque::new(),
                    state: ZoneState::Initial,
                });
                if z.state != state {
                    tracing::info!(zone = %zone.replace('\0', ""), from = z.state.as_str(), to = state.as_str(), "zone state changed");
                    z.state = state;
                }
                z.limiter
                    .swap(plan::zone_qps(state, c.size(), all_full, self.rates()), now);
                if all_full {
                    z.queue.clear();
                }
                let label = ZoneLabel { zone: zone.clone() };
                self.metrics
                    .zone_health
                    .get_or_create(&label)
                    .set(c.health());
                self.metrics
                    .zone_size
                    .get_or_create(&label)
                    .set(c.size() as i64);
                self.metrics
                    .unhealthy
                    .get_or_create(&label)
                    .set(c.not_ready as i64);
                self.metrics.evictions.get_or_create(&label).inc_by(0);
            }
            // Vanished zones read 0 / 100 / 0 and are forgotten (their queues persist).
            for (zone, _) in zones.iter().filter(|(z, _)| !counts.contains_key(*z)) {
                let label = ZoneLabel { zone: zone.clone() };
                self.metrics.zone_health.get_or_create(&label).set(100.0);
                self.metrics.zone_size.get_or_create(&label).set(0);
                self.metrics.unhealthy.get_or_create(&label).set(0);
            }
        }
        if all_full && !was_full {
            tracing::warn!(
                "all zones are fully disrupted: stopping NoExecute tainting and removing NoExecute taints"
            );
            for (n, _) in &evaluated {
                if plan::taints(n).iter().any(|t| {
                    t.effect == plan::NO_EXECUTE
                        && (t.key == plan::NOT_READY || t.key == plan::UNREACHABLE)
                }) {
                    let remove = |n: &Node| TaintChange {
                        add: vec![],
                        remove: plan::taints(n)
                            .into_iter()
                            .filter(|t| {
                                t.effect == plan::NO_EXECUTE
                                    && (t.key == plan::NOT_READY || t.key == plan::UNREACHABLE)
                            })
                            .collect(),
                    };
                    if let Err(e) = self.write_taints(n, remove).await {
                        tracing::warn!(node = %n.name_any(), error = %e, "removing NoExecute taints in master disruption mode");
                    }
                }
            }
        } else if was_full && !all_full {
            tracing::info!("leaving master disruption mode: every node gets a fresh grace period");
            for h in self.health.lock().expect("health lock").values_mut() {
                h.probe = now;
            }
            for (n, _) in &evaluated {
                self.queue.add(n.name_any());
            }
        }
    }

    /// NL-11: serves the zone queues every 100 ms, one token per attempt.
    async fn tainter(self: Arc<Self>, stop: CancellationToken) {
        let mut tick = tokio::time::interval(TAINT_PASS);
        loop {
            tokio::select! {
                _ = stop.cancelled() => return,
                _ = tick.tick() => {}
            }
            let now = Instant::now();
            let mut picks = Vec::new();
            {
                let pending = self.zones_with_unevaluated_expiry(now);
                let mut zones = self.zones.lock().expect("zones lock");
                for (zone, z) in zones.iter_mut() {
                    // A node of this zone has expired but no worker has evaluated it yet: it
                    // belongs to the batch, so the zone state is not final.
                    if pending.contains(zone) {
                        continue;
                    }
                    while z
                        .queue
                        .front()
                        .is_some_and(|(_, at)| now.duration_since(*at) >= BATCH_WINDOW)
                        && z.limiter.try_accept(now)
                    {
                        let (name, at) = z.queue.pop_front().expect("non-empty");
                        picks.push((zone.clone(), name, at));
                    }
                }
            }
            // Each pick is a task of its own: with many zones tainting at once (a node per
            // zone) none queues behind the others' requests, and a node whose writes keep
            // conflicting (retries with backoff) holds up neither the others nor the next pass.
            for (zone, name, queued_at) in picks {
                let inner = Arc::clone(&self);
                tokio::spawn(async move { inner.taint(zone, name, queued_at, now).await });
            }
        }
    }

    /// NL-11: one queued node that got its zone's token at `picked`.
    async fn taint(&self, zone: String, name: String, queued_at: Instant, picked: Instant) {
        // The cache may not yet hold this controller's own latest write to the node (its
        // conditions and NoSchedule taint, a moment ago): start from what that write returned,
        // so no read is spent and no conflict is bound to happen. A conflict re-reads.
        let Some(node) = self.freshest(&name) else {
            return;
        };
        if plan::tainting_change(&node).is_none() {
            return;
        }
        match self
            .write_taints(&node, |n| plan::tainting_change(n).unwrap_or_default())
            .await
        {
            Ok(_) => {
                self.metrics
                    .evictions
                    .get_or_create(&ZoneLabel { zone: zone.clone() })
                    .inc();
                let expired = self
                    .health
                    .lock()
                    .expect("health lock")
                    .get(&name)
                    .and_then(|h| h.expired);
                if let Some(expired) = expired {
                    // Past its batch window and the pass that follows it, a queued node was
                    // waiting for the zone's token.
                    let eligible = queued_at + BATCH_WINDOW + TAINT_PASS;
                    self.detected(
                        "noexecute",
                        expired,
                        picked.saturating_duration_since(eligible),
                    );
                }
                tracing::info!(node = %name, "added NoExecute taint");
            }
            Err(e) => {
                tracing::warn!(node = %name, error = %e, "NoExecute tainting failed; retrying");
                let mut zones = self.zones.lock().expect("zones lock");
                if let Some(z) = zones.get_mut(&zone) {
                    z.queue.push_front((name, queued_at));
                }
            }
        }
    }

    /// NL-4: sets the conditions to Unknown under a resourceVersion precondition; on conflict
    /// re-reads and retries (5 tries, 20 ms apart). `None` when nothing had to change.
    async fn write_stale_conditions(&self, node: &Node) -> Result<Option<Node>, Error> {
        let api: Api<Node> = Api::all(self.client.clone());
        let name = node.name_any();
        let mut current = node.clone();
        for attempt in 0..STATUS_RETRIES {
            let Some(conditions) = plan::stale_conditions(&current, Timestamp::now()) else {
                return Ok(None);
            };
            let patch = json!({
                "metadata": {"resourceVersion": current.metadata.resource_version},
                "status": {"conditions": conditions}
            });
            match api
                .patch_status(&name, &PatchParams::default(), &Patch::Strategic(patch))
                .await
            {
                Ok(n) => {
                    self.wrote(&current, &n);
                    return Ok(Some(n));
                }
                Err(kube::Error::Api(e)) if e.code == 409 && attempt + 1 < STATUS_RETRIES => {
                    tokio::time::sleep(Duration::from_millis(20)).await;
                    current = api.get(&name).await.map_err(|source| Error::Status {
                        node: name.clone(),
                        source,
                    })?;
                }
                Err(kube::Error::Api(e)) if e.code == 404 => return Ok(None),
                Err(source) => return Err(Error::Status { node: name, source }),
            }
        }
        Err(Error::Conflicts(name))
    }

    /// Replaces `spec.taints` with `change(node)` applied, guarded by resourceVersion; on 409
    /// re-reads and recomputes (5 steps from 100 ms).
    async fn write_taints(
        &self,
        node: &Node,
        change: impl Fn(&Node) -> TaintChange,
    ) -> Result<Node, Error> {
        let api: Api<Node> = Api::all(self.client.clone());
        let name = node.name_any();
        let mut current = node.clone();
        let mut delay = Duration::from_millis(100);
        for attempt in 0..STATUS_RETRIES {
            let c = change(&current);
            if c.is_empty() {
                return Ok(current);
            }
            let taints: Vec<Taint> = c.apply(&plan::taints(&current), Timestamp::now());
            let patch = json!({
                "metadata": {"resourceVersion": current.metadata.resource_version},
                "spec": {"taints": taints}
            });
            match api
                .patch(&name, &PatchParams::default(), &Patch::Merge(patch))
                .await
            {
                Ok(n) => {
                    self.wrote(&current, &n);
                    return Ok(n);
                }
                Err(kube::Error::Api(e)) if e.code == 409 && attempt + 1 < STATUS_RETRIES => {
                    tokio::time::sleep(delay).await;
                    delay *= 2;
                    current = api.get(&name).await.map_err(|source| Error::Taints {
                        node: name.clone(),
                        source,
                    })?;
                }
                Err(source) => return Err(Error::Taints { node: name, source }),
            }
        }
        Err(Error::Conflicts(name))
    }

    fn wrote(&self, before: &Node, after: &Node) {
        let Some(rv) = before.metadata.resource_version.clone() else {
            return;
        };
        let mut written = self.written.lock().expect("written lock");
        let w = written.entry(before.name_any()).or_insert_with(|| Written {
            replaced: Vec::new(),
            last: after.clone(),
        });
        // A handful of back-to-back writes at most; older ones are long in the cache.
        if w.replaced.len() >= 8 {
            w.replaced.remove(0);
        }
        w.replaced.push(rv);
        w.last = after.clone();
    }

    /// The cached node, or the one our last write returned while the cache still holds a
    /// version that write (or an earlier one of ours) replaced.
    fn freshest(&self, name: &str) -> Option<Node> {
        let cached = self.nodes.get(name);
        let mut written = self.written.lock().expect("written lock");
        let Some(cached) = cached else {
            written.remove(name);
            return None;
        };
        match written.get(name) {
            Some(w)
                if cached
                    .metadata
                    .resource_version
                    .as_ref()
                    .is_some_and(|rv| w.replaced.contains(rv)) =>
            {
                Some(w.last.clone())
            }
            Some(_) => {
                // The cache has caught up (or someone else wrote since): it is the freshest.
                written.remove(name);
                Some((*cached).clone())
            }
            None => Some((*cached).clone()),
        }
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
        let key = object_key(pod);
        let ready = pod
            .status
            .as_ref()
            .and_then(|s| s.conditions.as_ref())
            .and_then(|cs| cs.iter().find(|c| c.type_ == "Ready"));
        if ready.is_none_or(|c| c.status == "False") {
            return Ok(());
        }
        let (ns, name) = split_key(&key);
        let api: Api<Pod> = Api::namespaced(self.client.clone(), ns);
        // Only status and transition time change; reason and message stay (merged by type).
        let patch = json!({"status": {"conditions": [{"type": "Ready", "status": "False", "lastTransitionTime": Time(Timestamp::now())}]}});
        match api
            .patch_status(name, &PatchParams::default(), &Patch::Strategic(patch))
            .await
        {
            Ok(_) => {
                self.events.warning(
                    &core_ref("Pod", &key),
                    "NodeNotReady",
                    "MarkPodNotReady",
                    "Node is not ready",
                );
                Ok(())
            }
            Err(kube::Error::Api(e)) if e.code == 404 => Ok(()),
            Err(source) => Err(Error::Pod { pod: key, source }),
        }
    }

    /// NL-7: a pod on a node whose evaluated Ready is not True is marked too.
    async fn sync_pod(&self, key: &str) -> Result<Next, Error> {
        let Some(pod) = self.pods.get(key) else {
            return Ok(Next::Done);
        };
        let Some(node) = pod.spec.as_ref().and_then(|s| s.node_name.clone()) else {
            return Ok(Next::Done);
        };
        let ready = self
            .health
            .lock()
            .expect("health lock")
            .get(&node)
            .map(|h| h.ready.clone());
        match ready {
            // Not evaluated yet: skipped.
            None => Ok(Next::Done),
            Some(r) if r.as_deref() == Some("True") => Ok(Next::Done),
            Some(_) => self.mark_pod_not_ready(&pod).await.map(|_| Next::Done),
        }
    }
}
