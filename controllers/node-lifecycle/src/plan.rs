//! Pure decisions of the node-lifecycle controller (NL-1..NL-18). Time is always a parameter.

use k8s_openapi::api::core::v1::{Node, NodeCondition, Taint};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use shared::cache::pod::Pod;
use std::collections::BTreeMap;
use std::time::Duration;
use tokio::time::Instant;

pub const NOT_READY: &str = "node.kubernetes.io/not-ready";
pub const UNREACHABLE: &str = "node.kubernetes.io/unreachable";
pub const UNSCHEDULABLE: &str = "node.kubernetes.io/unschedulable";
pub const MEMORY_PRESSURE: &str = "node.kubernetes.io/memory-pressure";
pub const DISK_PRESSURE: &str = "node.kubernetes.io/disk-pressure";
pub const PID_PRESSURE: &str = "node.kubernetes.io/pid-pressure";
pub const NETWORK_UNAVAILABLE: &str = "node.kubernetes.io/network-unavailable";
pub const EXCLUDE_DISRUPTION: &str = "node.kubernetes.io/exclude-disruption";
pub const NO_SCHEDULE: &str = "NoSchedule";
pub const NO_EXECUTE: &str = "NoExecute";

/// The conditions the controller sets to Unknown on a stale node (NetworkUnavailable is never
/// touched).
pub const WATCHED_CONDITIONS: [&str; 4] =
    ["Ready", "MemoryPressure", "DiskPressure", "PIDPressure"];

/// `nodetopology.GetZoneKey`: `<region>:\0:<zone>` from the beta labels, each falling back to
/// the topology ones; `""` when both are empty.
pub fn zone_key(node: &Node) -> String {
    let Some(labels) = node.metadata.labels.as_ref() else {
        return String::new();
    };
    let get = |beta: &str, ga: &str| {
        labels
            .get(beta)
            .or_else(|| labels.get(ga))
            .cloned()
            .unwrap_or_default()
    };
    let zone = get(
        "failure-domain.beta.kubernetes.io/zone",
        "topology.kubernetes.io/zone",
    );
    let region = get(
        "failure-domain.beta.kubernetes.io/region",
        "topology.kubernetes.io/region",
    );
    if region.is_empty() && zone.is_empty() {
        String::new()
    } else {
        format!("{region}:\0:{zone}")
    }
}

pub fn excluded_from_disruption(node: &Node) -> bool {
    node.metadata
        .labels
        .as_ref()
        .is_some_and(|l| l.contains_key(EXCLUDE_DISRUPTION))
}

pub fn condition<'a>(node: &'a Node, type_: &str) -> Option<&'a NodeCondition> {
    node.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .and_then(|cs| cs.iter().find(|c| c.type_ == type_))
}

/// The Ready condition's status, if the node has one.
pub fn ready_status(node: &Node) -> Option<&str> {
    condition(node, "Ready").map(|c| c.status.as_str())
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum ZoneState {
    Initial,
    Normal,
    FullDisruption,
    PartialDisruption,
}

impl ZoneState {
    /// The value of `node_collector_zone_health`-adjacent logs and tests.
    pub fn as_str(self) -> &'static str {
        match self {
            ZoneState::Initial => "Initial",
            ZoneState::Normal => "Normal",
            ZoneState::FullDisruption => "FullDisruption",
            ZoneState::PartialDisruption => "PartialDisruption",
        }
    }
}

/// NL-12 (`ComputeZoneState`), over the zone's non-excluded nodes.
pub fn zone_state(ready: usize, not_ready: usize, unhealthy_threshold: f32) -> ZoneState {
    if ready == 0 && not_ready > 0 {
        ZoneState::FullDisruption
    } else if not_ready > 2
        && (not_ready as f32) / ((not_ready + ready) as f32) >= unhealthy_threshold
    {
        ZoneState::PartialDisruption
    } else {
        ZoneState::Normal
    }
}

#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Rates {
    pub eviction: f32,
    pub secondary: f32,
    pub large_cluster_threshold: usize,
}

/// NL-13/NL-14: the tainting rate for a zone. `all_full`: every zone is in FullDisruption
/// (master disruption mode), which stops every zone.
pub fn zone_qps(state: ZoneState, zone_size: usize, all_full: bool, rates: Rates) -> f32 {
    if all_full {
        return 0.0;
    }
    match state {
        ZoneState::Normal | ZoneState::Initial => rates.eviction,
        ZoneState::PartialDisruption => {
            if zone_size > rates.large_cluster_threshold {
                rates.secondary
            } else {
                0.0
            }
        }
        // A fully disrupted zone next to a working one is tainted at the normal rate.
        ZoneState::FullDisruption => rates.eviction,
    }
}

/// A burst-1 token bucket with upstream's swap semantics (NL-15) and an explicit stopped state
/// (NB-6: upstream's stopped limiter reports 1 QPS, so a swap to exactly 1.0 was ignored).
#[derive(Clone, Debug, PartialEq)]
pub struct ZoneLimiter {
    /// `None` = stopped.
    qps: Option<f64>,
    tokens: f64,
    last: Instant,
}

/// A rate flag as the decimal the operator wrote (`0.01f32` widened directly is 0.0099999998,
/// which would make a 100 s wait come up short).
fn rate(qps: f32) -> Option<f64> {
    (qps > 0.0).then(|| qps.to_string().parse().unwrap_or(f64::from(qps)))
}

impl ZoneLimiter {
    /// A new zone's limiter starts full (upstream: a fresh token bucket).
    pub fn new(qps: f32, now: Instant) -> Self {
        let qps = rate(qps);
        ZoneLimiter {
            qps,
            tokens: if qps.is_some() { 1.0 } else { 0.0 },
            last: now,
        }
    }

    pub fn qps(&self) -> Option<f64> {
        self.qps
    }

    fn refill(&mut self, now: Instant) {
        if let Some(q) = self.qps {
            let dt = now.saturating_duration_since(self.last).as_secs_f64();
            self.tokens = (self.tokens + dt * q).min(1.0);
        }
        self.last = now;
    }

    /// Changes the rate. A running limiter keeps its token if it had one (else the new one starts
    /// empty); a stop always forgets it.
    pub fn swap(&mut self, qps: f32, now: Instant) {
        let new = rate(qps);
        if new == self.qps {
            return;
        }
        self.refill(now);
        let had_token = self.qps.is_some() && self.tokens >= 1.0;
        self.qps = new;
        self.tokens = if new.is_some() && had_token { 1.0 } else { 0.0 };
        self.last = now;
    }

    /// Takes a token if one is available.
    pub fn try_accept(&mut self, now: Instant) -> bool {
        self.refill(now);
        if self.qps.is_some() && self.tokens >= 1.0 {
            self.tokens -= 1.0;
            true
        } else {
            false
        }
    }

    /// When the next token will be available (`None` while stopped).
    pub fn next_token_in(&self, now: Instant) -> Option<Duration> {
        let q = self.qps?;
        let dt = now.saturating_duration_since(self.last).as_secs_f64();
        let tokens = (self.tokens + dt * q).min(1.0);
        // A rate of 1e-45 (an accepted flag) waits longer than a Duration holds: saturate.
        Some(Duration::try_from_secs_f64(((1.0 - tokens) / q).max(0.0)).unwrap_or(Duration::MAX))
    }
}

/// `from + d`, capped at the runtime's far future (a grace-period flag of
/// `--node-monitor-grace-period=2562047h` is accepted): never panics.
pub fn deadline(from: Instant, d: Duration) -> Instant {
    shared::meta::clock::far_or(from, d)
}

/// NL-3: the grace that applies to a node.
pub fn grace(has_ready: bool, monitor_grace: Duration, startup_grace: Duration) -> Duration {
    if has_ready {
        monitor_grace
    } else {
        startup_grace
    }
}

/// NL-4: the conditions after the node was found stale at `now`; `None` when nothing changes.
/// Existing non-Unknown conditions flip to Unknown/NodeStatusUnknown (heartbeat kept); missing
/// ones are added as Unknown/NodeStatusNeverUpdated with the creation time as heartbeat.
pub fn stale_conditions(node: &Node, now: Timestamp) -> Option<Vec<NodeCondition>> {
    let mut conditions = node
        .status
        .as_ref()
        .and_then(|s| s.conditions.clone())
        .unwrap_or_default();
    let created = node.metadata.creation_timestamp.clone();
    let mut changed = false;
    for type_ in WATCHED_CONDITIONS {
        match conditions.iter_mut().find(|c| c.type_ == type_) {
            Some(c) if c.status != "Unknown" => {
                c.status = "Unknown".into();
                c.reason = Some("NodeStatusUnknown".into());
                c.message = Some("Kubelet stopped posting node status.".into());
                c.last_transition_time = Some(Time(now));
                changed = true;
            }
            Some(_) => {}
            None => {
                conditions.push(NodeCondition {
                    type_: type_.into(),
                    status: "Unknown".into(),
                    reason: Some("NodeStatusNeverUpdated".into()),
                    message: Some("Kubelet never posted node status.".into()),
                    last_heartbeat_time: created.clone(),
                    last_transition_time: Some(Time(now)),
                });
                changed = true;
            }
        }
    }
    changed.then_some(conditions)
}

fn no_schedule(key: &str) -> Taint {
    Taint {
        key: key.into(),
        value: None,
        effect: NO_SCHEDULE.into(),
        time_added: None,
    }
}

/// NL-8: the NoSchedule taints the node's conditions and `spec.unschedulable` call for.
pub fn desired_no_schedule(node: &Node) -> Vec<Taint> {
    let mut out = Vec::new();
    for c in node
        .status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .into_iter()
        .flatten()
    {
        let key = match (c.type_.as_str(), c.status.as_str()) {
            ("Ready", "False") => Some(NOT_READY),
            ("Ready", "Unknown") => Some(UNREACHABLE),
            ("MemoryPressure", "True") => Some(MEMORY_PRESSURE),
            ("DiskPressure", "True") => Some(DISK_PRESSURE),
            ("NetworkUnavailable", "True") => Some(NETWORK_UNAVAILABLE),
            ("PIDPressure", "True") => Some(PID_PRESSURE),
            _ => None,
        };
        out.extend(key.map(no_schedule));
    }
    if node
        .spec
        .as_ref()
        .and_then(|s| s.unschedulable)
        .unwrap_or(false)
    {
        out.push(no_schedule(UNSCHEDULABLE));
    }
    out
}

/// Taint keys whose NoSchedule taint the controller owns.
fn owned_no_schedule_key(key: &str) -> bool {
    matches!(
        key,
        NOT_READY
            | UNREACHABLE
            | MEMORY_PRESSURE
            | DISK_PRESSURE
            | NETWORK_UNAVAILABLE
            | PID_PRESSURE
            | UNSCHEDULABLE
    )
}

fn same(a: &Taint, b: &Taint) -> bool {
    a.key == b.key && a.effect == b.effect
}

/// A change to a node's taints: (to add, to remove), matched by (key, effect).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct TaintChange {
    pub add: Vec<Taint>,
    pub remove: Vec<Taint>,
}

impl TaintChange {
    pub fn is_empty(&self) -> bool {
        self.add.is_empty() && self.remove.is_empty()
    }

    /// The node's new taint list: removals dropped, additions appended with `timeAdded`.
    pub fn apply(&self, current: &[Taint], now: Timestamp) -> Vec<Taint> {
        let mut out: Vec<Taint> = current
            .iter()
            .filter(|t| !self.remove.iter().any(|r| same(r, t)))
            .cloned()
            .collect();
        for a in &self.add {
            if !out.iter().any(|t| same(t, a)) {
                out.push(Taint {
                    time_added: Some(Time(now)),
                    ..a.clone()
                });
            }
        }
        out
    }
}

/// NL-8: diff the desired NoSchedule set against only the owned NoSchedule taints.
pub fn no_schedule_change(node: &Node) -> TaintChange {
    let desired = desired_no_schedule(node);
    let current: Vec<Taint> = taints(node)
        .into_iter()
        .filter(|t| t.effect == NO_SCHEDULE && owned_no_schedule_key(&t.key))
        .collect();
    TaintChange {
        add: desired
            .iter()
            .filter(|d| !current.iter().any(|c| same(c, d)))
            .cloned()
            .collect(),
        remove: current
            .iter()
            .filter(|c| !desired.iter().any(|d| same(c, d)))
            .cloned()
            .collect(),
    }
}

pub fn taints(node: &Node) -> Vec<Taint> {
    node.spec
        .as_ref()
        .and_then(|s| s.taints.clone())
        .unwrap_or_default()
}

fn has_taint(node: &Node, key: &str, effect: &str) -> bool {
    taints(node)
        .iter()
        .any(|t| t.key == key && t.effect == effect)
}

fn no_execute(key: &str) -> Taint {
    Taint {
        key: key.into(),
        value: None,
        effect: NO_EXECUTE.into(),
        time_added: None,
    }
}

/// What NL-9 asks for a node with a Ready condition.
#[derive(Clone, Debug, PartialEq)]
pub enum NoExecuteStep {
    /// Nothing to do (the expected taint is present).
    Keep,
    /// Replace the other NoExecute taint at once, without a token.
    Swap(TaintChange),
    /// Wait in the zone queue for a token.
    Enqueue,
    /// Ready: remove both NoExecute taints (if present) and leave the queue.
    Clear(TaintChange),
}

/// NL-9: the NoExecute step for an evaluated node, from its Ready status and taints.
pub fn no_execute_step(node: &Node) -> NoExecuteStep {
    let (want, other) = match ready_status(node) {
        Some("False") => (NOT_READY, UNREACHABLE),
        Some("Unknown") => (UNREACHABLE, NOT_READY),
        _ => {
            let remove: Vec<Taint> = [NOT_READY, UNREACHABLE]
                .iter()
                .filter(|k| has_taint(node, k, NO_EXECUTE))
                .map(|k| no_execute(k))
                .collect();
            return NoExecuteStep::Clear(TaintChange {
                add: vec![],
                remove,
            });
        }
    };
    match (
        has_taint(node, want, NO_EXECUTE),
        has_taint(node, other, NO_EXECUTE),
    ) {
        (true, false) => NoExecuteStep::Keep,
        // Both present (never by us): drop the wrong one.
        (true, true) => NoExecuteStep::Swap(TaintChange {
            add: vec![],
            remove: vec![no_execute(other)],
        }),
        (false, true) => NoExecuteStep::Swap(TaintChange {
            add: vec![no_execute(want)],
            remove: vec![no_execute(other)],
        }),
        (false, false) => NoExecuteStep::Enqueue,
    }
}

/// NL-11: the taint change when a zone token is spent on a node (re-read state); `None` when
/// the node is Ready (or has no Ready condition) and should simply leave the queue.
pub fn tainting_change(node: &Node) -> Option<TaintChange> {
    let (want, other) = match ready_status(node) {
        Some("False") => (NOT_READY, UNREACHABLE),
        Some("Unknown") => (UNREACHABLE, NOT_READY),
        _ => return None,
    };
    Some(TaintChange {
        add: vec![no_execute(want)],
        remove: vec![no_execute(other)],
    })
}

/// NL-6/NL-7: a pod is marked `Ready=False` only if it has a Ready condition that is not False.
pub fn pod_needs_not_ready(pod: &Pod) -> bool {
    pod.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .and_then(|cs| cs.iter().find(|c| c.type_ == "Ready"))
        .is_some_and(|c| c.status != "False")
}

/// Per-zone counts for NL-12: the zone state and upstream's `node_collector_*` zone gauges.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ZoneCounts {
    pub ready: usize,
    pub not_ready: usize,
}

impl ZoneCounts {
    pub fn size(&self) -> usize {
        self.ready + self.not_ready
    }

    /// `node_collector_zone_health`: 100·(n−unhealthy)/n, 100 for an empty zone.
    pub fn health(&self) -> f64 {
        if self.size() == 0 {
            100.0
        } else {
            100.0 * self.ready as f64 / self.size() as f64
        }
    }
}

/// Counts nodes per zone (excluded nodes left out), each by its evaluated Ready status.
pub fn zone_counts<'a>(
    nodes: impl Iterator<Item = (&'a Node, bool)>,
) -> BTreeMap<String, ZoneCounts> {
    let mut out: BTreeMap<String, ZoneCounts> = BTreeMap::new();
    for (node, ready) in nodes {
        let counts = out.entry(zone_key(node)).or_default();
        if excluded_from_disruption(node) {
            continue;
        }
        if ready {
            counts.ready += 1;
        } else {
            counts.not_ready += 1;
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{NodeSpec, NodeStatus};
    use kube::api::ObjectMeta;

    fn node(
        labels: &[(&str, &str)],
        conds: &[(&str, &str)],
        taints: &[(&str, &str)],
        unschedulable: bool,
    ) -> Node {
        Node {
            metadata: ObjectMeta {
                name: Some("n".into()),
                labels: Some(
                    labels
                        .iter()
                        .map(|(k, v)| (k.to_string(), v.to_string()))
                        .collect(),
                ),
                creation_timestamp: Some(Time(Timestamp::from_second(100).unwrap())),
                ..Default::default()
            },
            spec: Some(NodeSpec {
                taints: Some(
                    taints
                        .iter()
                        .map(|(k, e)| Taint {
                            key: k.to_string(),
                            effect: e.to_string(),
                            ..Default::default()
                        })
                        .collect(),
                ),
                unschedulable: Some(unschedulable),
                ..Default::default()
            }),
            status: Some(NodeStatus {
                conditions: Some(
                    conds
                        .iter()
                        .map(|(t, s)| NodeCondition {
                            type_: t.to_string(),
                            status: s.to_string(),
                            last_heartbeat_time: Some(Time(Timestamp::from_second(500).unwrap())),
                            ..Default::default()
                        })
                        .collect(),
                ),
                ..Default::default()
            }),
        }
    }

    #[test]
    fn zone_keys() {
        assert_eq!(zone_key(&node(&[], &[], &[], false)), "");
        assert_eq!(
            zone_key(&node(
                &[("topology.kubernetes.io/zone", "a")],
                &[],
                &[],
                false
            )),
            ":\0:a"
        );
        assert_eq!(
            zone_key(&node(
                &[
                    ("topology.kubernetes.io/zone", "a"),
                    ("topology.kubernetes.io/region", "r")
                ],
                &[],
                &[],
                false
            )),
            "r:\0:a"
        );
        // The beta labels win.
        assert_eq!(
            zone_key(&node(
                &[
                    ("topology.kubernetes.io/zone", "a"),
                    ("failure-domain.beta.kubernetes.io/zone", "b")
                ],
                &[],
                &[],
                false
            )),
            ":\0:b"
        );
    }

    #[test]
    fn zone_states_nl12() {
        let t = 0.55;
        let cases = [
            ((0, 0), ZoneState::Normal),
            ((4, 0), ZoneState::Normal),
            ((0, 1), ZoneState::FullDisruption),
            ((0, 5), ZoneState::FullDisruption),
            // notReady must exceed 2.
            ((1, 2), ZoneState::Normal),
            ((2, 3), ZoneState::PartialDisruption),
            ((3, 3), ZoneState::Normal), // 0.5 < 0.55
            ((2, 4), ZoneState::PartialDisruption),
            ((7, 3), ZoneState::Normal),
        ];
        for ((ready, not_ready), want) in cases {
            assert_eq!(
                zone_state(ready, not_ready, t),
                want,
                "ready {ready} notReady {not_ready}"
            );
        }
    }

    #[test]
    fn zone_qps_nl13_nl14() {
        let r = Rates {
            eviction: 0.1,
            secondary: 0.01,
            large_cluster_threshold: 50,
        };
        assert_eq!(zone_qps(ZoneState::Normal, 10, false, r), 0.1);
        assert_eq!(zone_qps(ZoneState::Initial, 10, false, r), 0.1);
        assert_eq!(zone_qps(ZoneState::PartialDisruption, 10, false, r), 0.0);
        assert_eq!(zone_qps(ZoneState::PartialDisruption, 51, false, r), 0.01);
        assert_eq!(zone_qps(ZoneState::PartialDisruption, 50, false, r), 0.0);
        assert_eq!(zone_qps(ZoneState::FullDisruption, 6, false, r), 0.1);
        assert_eq!(zone_qps(ZoneState::Normal, 6, true, r), 0.0);
        assert_eq!(zone_qps(ZoneState::FullDisruption, 6, true, r), 0.0);
    }

    #[test]
    fn limiter_nl15_b6() {
        let t0 = Instant::now();
        let s = Duration::from_secs_f64;
        let mut l = ZoneLimiter::new(0.1, t0);
        assert!(l.try_accept(t0), "a new zone starts with a token");
        assert!(!l.try_accept(t0));
        assert_eq!(l.next_token_in(t0), Some(s(10.0)));
        assert!(!l.try_accept(t0 + s(9.9)));
        assert!(l.try_accept(t0 + s(10.0)));
        // Burst 1: a long idle period still gives one token.
        assert!(l.try_accept(t0 + s(100.0)));
        assert!(!l.try_accept(t0 + s(100.0)));
        // Stop, then resume: the first token waits 1/r (the stop forgot everything).
        let mut l = ZoneLimiter::new(0.1, t0);
        l.swap(0.0, t0);
        assert_eq!(l.qps(), None);
        assert!(!l.try_accept(t0 + s(50.0)));
        assert_eq!(l.next_token_in(t0), None);
        l.swap(0.1, t0 + s(60.0));
        assert!(!l.try_accept(t0 + s(60.0)));
        assert!(l.try_accept(t0 + s(70.0)));
        // Running → other rate keeps a held token.
        let mut l = ZoneLimiter::new(0.1, t0);
        l.swap(0.01, t0);
        assert!(l.try_accept(t0), "token carried over");
        assert!(!l.try_accept(t0 + s(99.0)));
        assert!(l.try_accept(t0 + s(100.0)));
        // ... and an empty one stays empty.
        let mut l = ZoneLimiter::new(0.1, t0);
        assert!(l.try_accept(t0));
        l.swap(1.0, t0 + s(0.5));
        assert!(!l.try_accept(t0 + s(0.5)));
        assert!(l.try_accept(t0 + s(1.5)));
        // NB-6: stopped → exactly 1.0 is a real swap.
        let mut l = ZoneLimiter::new(0.0, t0);
        l.swap(1.0, t0);
        assert_eq!(l.qps(), Some(1.0));
        assert!(l.try_accept(t0 + s(1.0)));
    }

    #[test]
    fn stale_conditions_nl4() {
        let now = Timestamp::from_second(1000).unwrap();
        let n = node(
            &[],
            &[
                ("Ready", "True"),
                ("MemoryPressure", "False"),
                ("NetworkUnavailable", "False"),
            ],
            &[],
            false,
        );
        let cs = stale_conditions(&n, now).unwrap();
        let get = |t: &str| cs.iter().find(|c| c.type_ == t).unwrap().clone();
        let ready = get("Ready");
        assert_eq!(
            (
                ready.status.as_str(),
                ready.reason.as_deref(),
                ready.message.as_deref()
            ),
            (
                "Unknown",
                Some("NodeStatusUnknown"),
                Some("Kubelet stopped posting node status.")
            )
        );
        assert_eq!(
            ready.last_heartbeat_time,
            Some(Time(Timestamp::from_second(500).unwrap())),
            "heartbeat kept"
        );
        assert_eq!(ready.last_transition_time, Some(Time(now)));
        let disk = get("DiskPressure");
        assert_eq!(
            (disk.status.as_str(), disk.reason.as_deref()),
            ("Unknown", Some("NodeStatusNeverUpdated"))
        );
        assert_eq!(
            disk.message.as_deref(),
            Some("Kubelet never posted node status.")
        );
        assert_eq!(
            disk.last_heartbeat_time,
            Some(Time(Timestamp::from_second(100).unwrap())),
            "creation time"
        );
        assert_eq!(
            get("NetworkUnavailable").status,
            "False",
            "NetworkUnavailable untouched"
        );
        assert_eq!(cs.len(), 5);
        // Already Unknown everywhere: nothing to write.
        let n = node(
            &[],
            &[
                ("Ready", "Unknown"),
                ("MemoryPressure", "Unknown"),
                ("DiskPressure", "Unknown"),
                ("PIDPressure", "Unknown"),
            ],
            &[],
            false,
        );
        assert_eq!(stale_conditions(&n, now), None);
    }

    #[test]
    fn no_schedule_nl8() {
        let keys = |ts: &[Taint]| ts.iter().map(|t| t.key.clone()).collect::<Vec<_>>();
        // Ready=False + memory pressure + unschedulable; an admin's NoSchedule taint is left alone.
        let n = node(
            &[],
            &[
                ("Ready", "False"),
                ("MemoryPressure", "True"),
                ("DiskPressure", "False"),
            ],
            &[
                ("example.com/admin", "NoSchedule"),
                (UNREACHABLE, "NoSchedule"),
                (NOT_READY, "NoExecute"),
            ],
            true,
        );
        let c = no_schedule_change(&n);
        assert_eq!(
            keys(&c.add),
            vec![NOT_READY, MEMORY_PRESSURE, UNSCHEDULABLE]
        );
        assert_eq!(keys(&c.remove), vec![UNREACHABLE]);
        let now = Timestamp::from_second(2000).unwrap();
        let applied = c.apply(&taints(&n), now);
        let pairs: Vec<(String, String)> = applied
            .iter()
            .map(|t| (t.key.clone(), t.effect.clone()))
            .collect();
        assert_eq!(
            pairs,
            vec![
                ("example.com/admin".to_string(), "NoSchedule".to_string()),
                (NOT_READY.to_string(), "NoExecute".to_string()),
                (NOT_READY.to_string(), "NoSchedule".to_string()),
                (MEMORY_PRESSURE.to_string(), "NoSchedule".to_string()),
                (UNSCHEDULABLE.to_string(), "NoSchedule".to_string()),
            ]
        );
        assert!(
            applied[2..].iter().all(|t| t.time_added == Some(Time(now))),
            "timeAdded set on added taints"
        );
        // A node created without conditions loses the admission not-ready:NoSchedule.
        let bare = node(&[], &[], &[(NOT_READY, "NoSchedule")], false);
        assert_eq!(keys(&no_schedule_change(&bare).remove), vec![NOT_READY]);
        // Healthy and consistent: nothing.
        assert!(no_schedule_change(&node(&[], &[("Ready", "True")], &[], false)).is_empty());
    }

    #[test]
    fn no_execute_nl9_nl11() {
        let keys = |ts: &[Taint]| ts.iter().map(|t| t.key.clone()).collect::<Vec<_>>();
        assert_eq!(
            no_execute_step(&node(&[], &[("Ready", "Unknown")], &[], false)),
            NoExecuteStep::Enqueue
        );
        assert_eq!(
            no_execute_step(&node(
                &[],
                &[("Ready", "Unknown")],
                &[(UNREACHABLE, "NoExecute")],
                false
            )),
            NoExecuteStep::Keep
        );
        // The NoSchedule variant does not count.
        assert_eq!(
            no_execute_step(&node(
                &[],
                &[("Ready", "False")],
                &[(NOT_READY, "NoSchedule")],
                false
            )),
            NoExecuteStep::Enqueue
        );
        match no_execute_step(&node(
            &[],
            &[("Ready", "False")],
            &[(UNREACHABLE, "NoExecute")],
            false,
        )) {
            NoExecuteStep::Swap(c) => {
                assert_eq!(keys(&c.add), vec![NOT_READY]);
                assert_eq!(keys(&c.remove), vec![UNREACHABLE]);
            }
            other => panic!("{other:?}"),
        }
        match no_execute_step(&node(
            &[],
            &[("Ready", "True")],
            &[(UNREACHABLE, "NoExecute"), ("example.com/x", "NoExecute")],
            false,
        )) {
            NoExecuteStep::Clear(c) => assert_eq!(keys(&c.remove), vec![UNREACHABLE]),
            other => panic!("{other:?}"),
        }
        let c = tainting_change(&node(&[], &[("Ready", "Unknown")], &[], false)).unwrap();
        assert_eq!(
            (keys(&c.add), keys(&c.remove)),
            (vec![UNREACHABLE.to_string()], vec![NOT_READY.to_string()])
        );
        assert_eq!(
            tainting_change(&node(&[], &[("Ready", "True")], &[], false)),
            None
        );
        assert_eq!(tainting_change(&node(&[], &[], &[], false)), None);
    }

    #[test]
    fn pod_marking_nl6_nl7() {
        use k8s_openapi::api::core::v1::PodCondition;
        use shared::cache::pod::PodStatus;
        let pod = |ready: Option<&str>| Pod {
            status: Some(PodStatus {
                conditions: ready.map(|s| {
                    vec![PodCondition {
                        type_: "Ready".into(),
                        status: s.into(),
                        ..Default::default()
                    }]
                }),
                ..Default::default()
            }),
            ..Default::default()
        };
        assert!(pod_needs_not_ready(&pod(Some("True"))));
        assert!(pod_needs_not_ready(&pod(Some("Unknown"))));
        assert!(!pod_needs_not_ready(&pod(Some("False"))));
        assert!(
            !pod_needs_not_ready(&pod(None)),
            "no Ready condition: left alone"
        );
        assert!(!pod_needs_not_ready(&Pod::default()));
    }

    #[test]
    fn counts_and_health() {
        let a = node(&[("topology.kubernetes.io/zone", "a")], &[], &[], false);
        let ex = node(
            &[
                ("topology.kubernetes.io/zone", "a"),
                (EXCLUDE_DISRUPTION, ""),
            ],
            &[],
            &[],
            false,
        );
        let b = node(&[("topology.kubernetes.io/zone", "b")], &[], &[], false);
        let counts = zone_counts([(&a, true), (&a, false), (&ex, false), (&b, false)].into_iter());
        assert_eq!(
            counts[":\0:a"],
            ZoneCounts {
                ready: 1,
                not_ready: 1
            }
        );
        assert_eq!(counts[":\0:a"].health(), 50.0);
        assert_eq!(counts[":\0:b"].health(), 0.0);
        assert_eq!(ZoneCounts::default().health(), 100.0);
        assert_eq!(
            grace(true, Duration::from_secs(50), Duration::from_secs(60)),
            Duration::from_secs(50)
        );
        assert_eq!(
            grace(false, Duration::from_secs(50), Duration::from_secs(60)),
            Duration::from_secs(60)
        );
    }

    /// A grace-period flag is any Go duration (`--node-monitor-grace-period=2562047h` parses):
    /// the node's timer saturates instead of `overflow when adding duration to instant`.
    #[test]
    fn deadline_saturates_for_any_grace() {
        let t0 = Instant::now();
        assert_eq!(
            deadline(t0, Duration::from_secs(40)),
            t0 + Duration::from_secs(40)
        );
        for huge in [Duration::MAX, Duration::from_secs(i64::MAX as u64)] {
            assert!(deadline(t0, huge) > t0 + Duration::from_secs(86_400 * 365));
        }
    }

    /// `--node-eviction-rate=1e-45` (a positive f32) waits longer than a Duration holds: the
    /// wait saturates instead of `from_secs_f64` panicking.
    #[test]
    fn next_token_in_saturates_for_a_tiny_rate() {
        let t0 = Instant::now();
        let mut l = ZoneLimiter::new(1e-45, t0);
        assert!(l.try_accept(t0));
        assert_eq!(l.next_token_in(t0), Some(Duration::MAX));
    }
}

#[cfg(test)]
#[path = "plan_props.rs"]
mod props;
