//! One sync of one pod: observe the pod and its node in the caches, ask [`plan`] what the taints
//! mean for the pod's timer, then keep, move, cancel or fire it. A timer is a delayed requeue of
//! the pod's key; firing is [`act::evict`].

use crate::metrics::{Metrics, ReasonLabel};
use crate::{Error, act, plan};
use k8s_openapi::api::core::v1::{Node, Toleration};
use shared::cache::informers::Informer;
use shared::cache::pod::INDEX_POD_NODE;
use shared::cache::pod::Pod;
use shared::meta::clock::Clock;
use shared::meta::keys::{object_key, split_key};
use shared::runtime::controller::Ctx;
use shared::runtime::events::{EventRecorder, core_ref};
use shared::runtime::gates::FeatureGates;
use shared::runtime::queue::{Next, Queue};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::time::Instant;

/// TE-10: warn after this many consecutive failures, then at most this often.
const WARN_AFTER_FAILURES: u32 = 5;
const WARN_EVERY: Duration = Duration::from_secs(600);

/// What the controller remembers of one pod with a pending eviction.
struct PodTimer {
    timer: plan::Timer,
    /// "Marking for deletion" was announced for this firing.
    announced: bool,
    last_warning: Option<Instant>,
}

pub struct TaintEvictionController {
    pub pods: Arc<Informer<Pod>>,
    pub nodes: Arc<Informer<Node>>,
    pub queue: Arc<Queue<String>>,
    pub writer: shared::api::writer::Writer,
    pub events: EventRecorder,
    pub gates: FeatureGates,
    pub clock: Arc<dyn Clock>,
    pub metrics: Metrics,
    /// Pending evictions by pod key; each carries the UID it was started for.
    timers: Mutex<HashMap<String, PodTimer>>,
}

pub fn node_name(pod: &Pod) -> Option<&str> {
    pod.spec
        .as_ref()
        .and_then(|s| s.node_name.as_deref())
        .filter(|n| !n.is_empty())
}

pub fn tolerations(pod: &Pod) -> &[Toleration] {
    pod.spec
        .as_ref()
        .and_then(|s| s.tolerations.as_deref())
        .unwrap_or_default()
}

impl TaintEvictionController {
    pub fn new(
        pods: Arc<Informer<Pod>>,
        nodes: Arc<Informer<Node>>,
        queue: Arc<Queue<String>>,
        ctx: Ctx<Metrics>,
    ) -> TaintEvictionController {
        let Ctx {
            writer,
            events,
            clock,
            gates,
            metrics,
        } = ctx;
        TaintEvictionController {
            pods,
            nodes,
            queue,
            writer,
            events,
            gates,
            clock,
            metrics,
            timers: Mutex::new(HashMap::new()),
        }
    }

    fn timers(&self) -> std::sync::MutexGuard<'_, HashMap<String, PodTimer>> {
        shared::lock(&self.timers)
    }

    /// The keys of the pods bound to `node`.
    pub fn pods_on(&self, node: &str) -> Vec<String> {
        self.pods
            .by_index(INDEX_POD_NODE, node)
            .iter()
            .map(|p| object_key(p.as_ref()))
            .collect()
    }

    fn cancel(&self, key: &str, announce: bool) {
        let live = self.timers().remove(key).is_some();
        if announce && live {
            self.events.normal(
                &core_ref("Pod", key),
                "TaintManagerEviction",
                "CancelDeletion",
                format!("Cancelling deletion of Pod {key}"),
            );
        }
    }

    pub async fn sync(&self, key: &str) -> Result<Next, Error> {
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
            let mut timers = self.timers();
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
                let mut timers = self.timers();
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
            let mut timers = self.timers();
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
        match act::evict(&self.writer, namespace, name, uid, self.clock.now()).await {
            Ok(outcome) => {
                if outcome == act::Evicted::Deleted {
                    self.metrics.deletions.inc();
                    self.metrics
                        .deletion_duration
                        .observe(Instant::now().saturating_duration_since(due).as_secs_f64());
                }
                self.timers().remove(key);
                Ok(Next::Done)
            }
            Err(e) => {
                self.metrics
                    .failures
                    .get_or_create(&ReasonLabel { reason: e.reason() })
                    .inc();
                let failures = self.queue.num_requeues(&key.to_string()) + 1;
                let warn = match self.timers().get_mut(key) {
                    Some(t)
                        if failures >= WARN_AFTER_FAILURES
                            && t.last_warning
                                .is_none_or(|w| now.saturating_duration_since(w) >= WARN_EVERY) =>
                    {
                        t.last_warning = Some(now);
                        true
                    }
                    _ => false,
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
