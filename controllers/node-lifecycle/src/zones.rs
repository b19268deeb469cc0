//! Zones (NL-10..NL-16): per-zone queues of nodes waiting for a NoExecute taint, their token
//! buckets and states, master disruption, and the tainter that serves the queues every 100 ms.

use crate::metrics::ZoneLabel;
use crate::plan::{self, Rates, TaintChange, ZoneLimiter, ZoneState};
use crate::sync::{NodeLifecycleController, lock};
use k8s_openapi::api::core::v1::Node;
use kube::ResourceExt;
use shared::runtime::controller::Spawner;
use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;
use tokio::time::Instant;

/// Upstream's `NodeEvictionPeriod`: how often zone queues are served.
pub const TAINT_PASS: Duration = Duration::from_millis(100);
/// NL-5: expiries within this window form a batch; a queued node waits this long before it may
/// take a token, so the zone state already counts its batch-mates.
pub const BATCH_WINDOW: Duration = Duration::from_millis(250);

pub(crate) struct Zone {
    limiter: ZoneLimiter,
    /// FIFO set of nodes waiting for a token, with when each was queued.
    pub(crate) queue: VecDeque<(String, Instant)>,
    state: ZoneState,
}

impl Zone {
    fn new(rate: f32, now: Instant) -> Zone {
        Zone {
            limiter: ZoneLimiter::new(rate, now),
            queue: VecDeque::new(),
            state: ZoneState::Initial,
        }
    }
}

fn is_no_execute_ours(t: &k8s_openapi::api::core::v1::Taint) -> bool {
    t.effect == plan::NO_EXECUTE && (t.key == plan::NOT_READY || t.key == plan::UNREACHABLE)
}

impl NodeLifecycleController {
    fn rates(&self) -> Rates {
        Rates {
            eviction: self.opts.node_eviction_rate,
            secondary: self.opts.secondary_node_eviction_rate,
            large_cluster_threshold: self.opts.large_cluster_size_threshold.max(0) as usize,
        }
    }

    /// NL-10: queues `name` in its zone unless it is queued already.
    pub(crate) fn enqueue(&self, zone: &str, name: &str) {
        let mut zones = lock(&self.zones);
        let z = zones
            .entry(zone.to_string())
            .or_insert_with(|| Zone::new(self.opts.node_eviction_rate, Instant::now()));
        if !z.queue.iter().any(|(n, _)| n == name) {
            z.queue.push_back((name.to_string(), Instant::now()));
        }
        self.metrics
            .queue_depth
            .get_or_create(&ZoneLabel::of(zone))
            .set(z.queue.len() as i64);
    }

    pub(crate) fn dequeue(&self, name: &str) {
        for (zone, z) in lock(&self.zones).iter_mut() {
            let before = z.queue.len();
            z.queue.retain(|(n, _)| n != name);
            if z.queue.len() != before {
                self.metrics
                    .queue_depth
                    .get_or_create(&ZoneLabel::of(zone))
                    .set(z.queue.len() as i64);
            }
        }
    }

    /// NL-12..NL-14: zone states, limiter rates and gauges from the evaluated Ready statuses.
    pub(crate) async fn recompute_zones(&self) {
        let nodes = self.nodes.list();
        let evaluated: Vec<(Arc<Node>, bool)> = {
            let memory = self.memory();
            nodes
                .into_iter()
                .map(|n| {
                    let ready = memory
                        .get(&n.name_any())
                        .and_then(|m| m.ready.clone())
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
            let mut zones = lock(&self.zones);
            for (zone, c) in &counts {
                let state = states[zone];
                let z = zones
                    .entry(zone.clone())
                    .or_insert_with(|| Zone::new(self.opts.node_eviction_rate, now));
                if z.state != state {
                    tracing::info!(zone = %zone.replace('\0', ""), from = z.state.as_str(), to = state.as_str(), "zone state changed");
                    z.state = state;
                }
                z.limiter
                    .swap(plan::zone_qps(state, c.size(), all_full, self.rates()), now);
                if all_full {
                    z.queue.clear();
                }
                let label = ZoneLabel::of(zone);
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
                let label = ZoneLabel::of(zone);
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
                if plan::taints(n).iter().any(is_no_execute_ours) {
                    let remove = |n: &Node| TaintChange {
                        add: vec![],
                        remove: plan::taints(n)
                            .into_iter()
                            .filter(is_no_execute_ours)
                            .collect(),
                    };
                    if let Err(e) = self.act.taints(n, remove).await {
                        tracing::warn!(node = %n.name_any(), error = %e, "removing NoExecute taints in master disruption mode");
                    }
                }
            }
        } else if was_full && !all_full {
            tracing::info!("leaving master disruption mode: every node gets a fresh grace period");
            for m in self.memory().values_mut() {
                m.probe = now;
            }
            for (n, _) in &evaluated {
                self.queue.add(n.name_any());
            }
        }
    }

    /// Zones with a node whose grace has run out but which is still counted Ready.
    fn zones_with_unevaluated_expiry(&self, now: Instant) -> BTreeSet<String> {
        let grace = self.opts.node_monitor_grace_period;
        self.memory()
            .values()
            .filter(|m| m.ready.as_deref() == Some("True") && now > plan::deadline(m.probe, grace))
            .map(|m| m.zone.clone())
            .collect()
    }

    /// NL-11: one pass over the zone queues (every 100 ms), one token per attempt.
    pub fn taint_pass(self: &Arc<Self>, spawner: &Spawner) {
        let now = Instant::now();
        let mut picks = Vec::new();
        {
            let pending = self.zones_with_unevaluated_expiry(now);
            let mut zones = lock(&self.zones);
            for (zone, z) in zones.iter_mut() {
                // A node of this zone has expired but no worker has evaluated it yet: it
                // belongs to the batch, so the zone state is not final.
                if pending.contains(zone) {
                    continue;
                }
                // A node queued by a sync that ran while this controller's NoExecute write to
                // it was under way is already tainted (or no longer needs a taint): it leaves
                // without a token. Upstream never queues it twice (its queue remembers a
                // tainted node until it recovers); taking a token for it here delayed the
                // zone's next node by a whole token period.
                while let Some((name, _)) = z.queue.front()
                    && !self.needs_taint(name)
                {
                    z.queue.pop_front();
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
        // Each pick is a task of its own: with many zones tainting at once (a node per zone)
        // none queues behind the others' requests, and a node whose writes keep conflicting
        // (retries with backoff) holds up neither the others nor the next pass. The runtime
        // contains a panicking one and waits for them at stop.
        for (zone, name, queued_at) in picks {
            let this = Arc::clone(self);
            spawner.spawn(async move { this.taint(zone, name, queued_at, now).await });
        }
    }

    /// Whether a queued node still waits for its first NoExecute taint, as this controller's
    /// latest write left it (a node gone from the cache is the tainting task's to forget).
    fn needs_taint(&self, name: &str) -> bool {
        match self.nodes.get(name) {
            Some(cached) => matches!(
                plan::no_execute_step(&self.act.own.freshest(cached)),
                plan::NoExecuteStep::Enqueue
            ),
            None => true,
        }
    }

    /// NL-11: one queued node that got its zone's token at `picked`.
    async fn taint(&self, zone: String, name: String, queued_at: Instant, picked: Instant) {
        // The cache may not yet hold this controller's own latest write to the node (its
        // conditions and NoSchedule taint, a moment ago): start from what that write returned,
        // so no read is spent and no conflict is bound to happen. A conflict re-reads.
        let Some(cached) = self.nodes.get(&name) else {
            if let Some(uid) = self.memory().get(&name).map(|m| m.uid.clone()) {
                self.act.own.forget(&uid);
            }
            return;
        };
        let node = self.act.own.freshest(cached);
        if plan::tainting_change(&node).is_none() {
            return;
        }
        match self
            .act
            .taints(&node, |n| plan::tainting_change(n).unwrap_or_default())
            .await
        {
            Ok(_) => {
                self.metrics
                    .evictions
                    .get_or_create(&ZoneLabel::of(&zone))
                    .inc();
                let expired = self.memory().get(&name).and_then(|m| m.expired);
                if let Some(expired) = expired {
                    // Past its batch window and the pass that follows it, a queued node was
                    // waiting for the zone's token.
                    let eligible =
                        plan::deadline(queued_at, BATCH_WINDOW.saturating_add(TAINT_PASS));
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
                if let Some(z) = lock(&self.zones).get_mut(&zone) {
                    z.queue.push_front((name, queued_at));
                }
            }
        }
    }
}
