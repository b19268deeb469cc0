//! `taint-eviction-controller`: deletes pods from nodes with NoExecute taints they do not
//! tolerate, at once or after their `tolerationSeconds` (spec §3, TE-1..TE-11).
//!
//! One queue keyed by pod (`namespace/name`). A sync reads the pod and its node from the shared
//! caches, asks [`plan`] what the taints mean, and keeps, moves, cancels or fires the pod's timer;
//! a timer is a delayed requeue of the pod's key. Firing is [`act::evict`].

pub mod act;
pub mod plan;

use futures::FutureExt;
use futures::future::BoxFuture;
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::{Client, ResourceExt};
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::Histogram;
use shared::controller::{Controller, InitError, Setup};
use shared::events::{EventRecorder, core_ref};
use shared::flags::FeatureGates;
use shared::informers::{Change, INDEX_POD_NODE, Informer, object_key, pod_by_node, split_key};
use shared::queue::{Next, Queue, run_workers};
use shared::ratelimit::BackoffConfig;
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

pub const NAME: &str = "taint-eviction-controller";
/// Upstream's pod-update queue name (label `name` of `workqueue_*`).
pub const QUEUE: &str = "noexec_taint_pod";
/// Upstream's `UpdateWorkerSize`.
pub const WORKERS: usize = 8;
/// TE-10: warn after this many consecutive failures, then at most this often.
const WARN_AFTER_FAILURES: u32 = 5;
const WARN_EVERY: Duration = Duration::from_secs(600);

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(transparent)]
    Evict(#[from] act::ActError),
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ReasonLabel {
    reason: String,
}

struct Metrics {
    deletions: Counter,
    deletion_duration: Histogram,
    failures: Family<ReasonLabel, Counter>,
}

impl Metrics {
    fn register(registry: &shared::metrics::Metrics) -> Metrics {
        let m = Metrics {
            deletions: Counter::default(),
            deletion_duration: Histogram::new([
                0.005, 0.025, 0.1, 0.5, 1.0, 2.5, 10.0, 30.0, 60.0, 120.0, 180.0, 240.0,
            ]),
            failures: Family::default(),
        };
        registry.register(
            "taint_eviction_controller_pod_deletions",
            "Total number of Pods deleted by TaintEvictionController since its start",
            m.deletions.clone(),
        );
        registry.register(
            "taint_eviction_controller_pod_deletion_duration_seconds",
            "Latency, in seconds, between the time when a taint effect has been activated for the Pod and its deletion via TaintEvictionController",
            m.deletion_duration.clone(),
        );
        registry.register(
            "pilothouse_taint_eviction_failures",
            "Failed attempts to mark and delete a pod, by reason (HTTP code or transport)",
            m.failures.clone(),
        );
        m
    }
}

struct PodTimer {
    timer: plan::Timer,
    /// "Marking for deletion" was announced for this firing.
    announced: bool,
    last_warning: Option<Instant>,
}

struct Inner {
    pods: Arc<Informer<Pod>>,
    nodes: Arc<Informer<Node>>,
    queue: Arc<Queue<String>>,
    timers: Mutex<HashMap<String, PodTimer>>,
    client: Client,
    events: EventRecorder,
    gates: FeatureGates,
    metrics: Metrics,
    /// Handlers enqueue only while the controller runs (i.e. leads); TE-11 covers the rest.
    active: AtomicBool,
}

pub struct TaintEviction {
    inner: Arc<Inner>,
}

fn node_name(pod: &Pod) -> Option<&str> {
    pod.spec
        .as_ref()
        .and_then(|s| s.node_name.as_deref())
        .filter(|n| !n.is_empty())
}

fn tolerations(pod: &Pod) -> &[k8s_openapi::api::core::v1::Toleration] {
    pod.spec
        .as_ref()
        .and_then(|s| s.tolerations.as_deref())
        .unwrap_or_default()
}

/// Wires the controller to the shared caches.
pub fn init(setup: Setup) -> Result<Box<dyn Controller>, InitError> {
    let pods = setup.informers.get::<Pod>();
    pods.add_index(INDEX_POD_NODE, pod_by_node);
    let nodes = setup.informers.get::<Node>();
    let queue = Queue::new(
        QUEUE,
        BackoffConfig::exponential(Duration::from_millis(100), Duration::from_secs(30)),
        &setup.metrics,
    );
    let inner = Arc::new(Inner {
        pods: Arc::clone(&pods),
        nodes: Arc::clone(&nodes),
        queue,
        timers: Mutex::new(HashMap::new()),
        client: setup.client,
        events: setup.events,
        gates: setup.gates,
        metrics: Metrics::register(&setup.metrics),
        active: AtomicBool::new(false),
    });

    // TE-1: node events count when the NoExecute list changes.
    let weak = Arc::downgrade(&inner);
    nodes.on_change(move |change| {
        let Some(inner) = weak.upgrade().filter(|i| i.active.load(Ordering::Acquire)) else {
            return;
        };
        let changed = match change {
            Change::Added(n) => !plan::no_execute_taints(n).is_empty(),
            Change::Updated { old, new } => {
                !plan::same_taints(&plan::no_execute_taints(old), &plan::no_execute_taints(new))
            }
            // Node deletion only forgets its taints: pending timers keep running.
            Change::Deleted(_) => false,
        };
        if changed {
            inner.enqueue_node(&change.object().name_any());
        }
    });
    // TE-1: pod events on add, delete, toleration or node change.
    let weak = Arc::downgrade(&inner);
    pods.on_change(move |change| {
        let Some(inner) = weak.upgrade().filter(|i| i.active.load(Ordering::Acquire)) else {
            return;
        };
        let relevant = match change {
            Change::Added(p) => node_name(p).is_some(),
            Change::Updated { old, new } => {
                tolerations(old) != tolerations(new) || node_name(old) != node_name(new)
            }
            Change::Deleted(_) => true,
        };
        if relevant {
            inner.queue.add(object_key(change.object().as_ref()));
        }
    });
    Ok(Box::new(TaintEviction { inner }))
}

impl Controller for TaintEviction {
    fn run(self: Box<Self>, stop: CancellationToken) -> BoxFuture<'static, ()> {
        let inner = self.inner;
        async move {
            inner.active.store(true, Ordering::Release);
            // TE-11: every tainted node's pods are processed as fresh events.
            for node in inner.nodes.list() {
                if !plan::no_execute_taints(&node).is_empty() {
                    inner.enqueue_node(&node.name_any());
                }
            }
            let queue = Arc::clone(&inner.queue);
            tokio::spawn(async move {
                stop.cancelled().await;
                queue.shut_down();
            });
            let queue = Arc::clone(&inner.queue);
            run_workers(queue, WORKERS, move |key: String| {
                let inner = Arc::clone(&inner);
                async move { inner.sync(&key).await }
            })
            .await;
        }
        .boxed()
    }
}

impl Inner {
    fn enqueue_node(&self, node: &str) {
        for pod in self.pods.by_index(INDEX_POD_NODE, node) {
            self.queue.add(object_key(pod.as_ref()));
        }
    }

    fn cancel(&self, key: &str, announce: bool) {
        let live = self
            .timers
            .lock()
            .expect("timers lock")
            .remove(key)
            .is_some();
        if announce && live {
            self.events.normal(
                &core_ref("Pod", key),
                "TaintManagerEviction",
                "CancelDeletion",
                format!("Cancelling deletion of Pod {key}"),
            );
        }
    }

    async fn sync(&self, key: &str) -> Result<Next, Error> {
        let now = Instant::now();
        let Some(pod) = self.pods.get(key) else {
            // Deleted: cancel any pending eviction.
            self.cancel(key, true);
            return Ok(Next::Done);
        };
        let uid = pod.metadata.uid.clone().unwrap_or_default();
        let Some(node) = node_name(&pod) else {
            return Ok(Next::Done);
        };
        let timer = {
            let mut timers = self.timers.lock().expect("timers lock");
            if timers.get(key).is_some_and(|t| t.timer.uid != uid) {
                // The name now belongs to another pod: its predecessor's timer is void.
                timers.remove(key);
            }
            timers.get(key).map(|t| t.timer.clone())
        };
        let verdict = match self.nodes.get(node) {
            Some(node) => plan::verdict(
                &plan::no_execute_taints(&node),
                tolerations(&pod),
                self.gates.taint_toleration_comparison_operators,
            ),
            // The node is gone: its taints are forgotten, a pending eviction still fires.
            None => match &timer {
                Some(t) => plan::Verdict::EvictAfter(t.deadline.saturating_duration_since(t.start)),
                None => return Ok(Next::Done),
            },
        };
        match plan::step(verdict, &uid, timer.as_ref(), now) {
            plan::Step::Idle => Ok(Next::Done),
            plan::Step::Cancel { announce } => {
                self.cancel(key, announce);
                Ok(Next::Done)
            }
            plan::Step::Wait(t) => {
                let wait = t.deadline.saturating_duration_since(now);
                let mut timers = self.timers.lock().expect("timers lock");
                let entry = timers.entry(key.to_string()).or_insert(PodTimer {
                    timer: t.clone(),
                    announced: false,
                    last_warning: None,
                });
                entry.timer = t;
                Ok(Next::After(wait))
            }
            plan::Step::Fire { due, cancelled } => {
                if cancelled {
                    self.cancel(key, true);
                }
                self.fire(key, &uid, timer.map_or(now, |t| t.start), due, now)
                    .await
            }
        }
    }

    async fn fire(
        &self,
        key: &str,
        uid: &str,
        start: Instant,
        due: Instant,
        now: Instant,
    ) -> Result<Next, Error> {
        let announce = {
            let mut timers = self.timers.lock().expect("timers lock");
            let entry = timers.entry(key.to_string()).or_insert(PodTimer {
                timer: plan::Timer {
                    uid: uid.to_string(),
                    start,
                    deadline: due,
                },
                announced: false,
                last_warning: None,
            });
            entry.timer.deadline = due;
            !std::mem::replace(&mut entry.announced, true)
        };
        if announce {
            tracing::info!(pod = key, "deleting pod");
            self.events.normal(
                &core_ref("Pod", key),
                "TaintManagerEviction",
                "DeletePod",
                format!("Marking for deletion Pod {key}"),
            );
        }
        let (namespace, name) = split_key(key);
        match act::evict(&self.client, namespace, name, uid).await {
            Ok(outcome) => {
                if outcome == act::Evicted::Deleted {
                    self.metrics.deletions.inc();
                    self.metrics
                        .deletion_duration
                        .observe(Instant::now().saturating_duration_since(due).as_secs_f64());
                }
                self.timers.lock().expect("timers lock").remove(key);
                Ok(Next::Done)
            }
            Err(e) => {
                self.metrics
                    .failures
                    .get_or_create(&ReasonLabel { reason: e.reason() })
                    .inc();
                let failures = self.queue.num_requeues(&key.to_string()) + 1;
                let warn = {
                    let mut timers = self.timers.lock().expect("timers lock");
                    let entry = timers.get_mut(key);
                    match entry {
                        Some(t)
                            if failures >= WARN_AFTER_FAILURES
                                && t.last_warning
                                    .is_none_or(|w| now.duration_since(w) >= WARN_EVERY) =>
                        {
                            t.last_warning = Some(now);
                            true
                        }
                        _ => false,
                    }
                };
                if warn {
                    self.events.warning(
                        &core_ref("Pod", key),
                        "TaintEvictionFailed",
                        "DeletePod",
                        format!("Failed to delete pod {key} after {failures} attempts, still retrying: {e}"),
                    );
                }
                Err(e.into())
            }
        }
    }
}
