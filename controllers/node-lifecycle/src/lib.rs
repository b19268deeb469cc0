//! `node-lifecycle-controller` (NL-1..NL-18): node health from Ready heartbeats and node Leases,
//! judged on this process's clock; Unknown conditions on stale nodes; pods of not-ready nodes
//! marked NotReady; NoSchedule taints from conditions; NoExecute taints through per-zone,
//! rate-limited queues.
//!
//! Wiring only. Two queues: nodes (by name; each node also has a timer at `probe + grace`, a
//! delayed requeue of its key, so a stale node is handled when its grace runs out rather than
//! up to a monitor period later, NB-2) and pods (`namespace/name`, NL-7). A full pass every
//! `--node-monitor-period` re-evaluates every node; the tainter serves the zone queues every
//! 100 ms. [`sync`] is one node's or pod's sync, [`zones`] the zone queues and tainter, [`plan`]
//! the pure decisions, [`act`] the writes.

// Time arithmetic must not panic (PX-2; clippy::arithmetic_side_effects is denied in the
// workspace lints). Tests may use plain operators on the instants they build, and a table
// test may be longer than a function should be.
#![cfg_attr(
    test,
    allow(
        clippy::arithmetic_side_effects,
        clippy::unchecked_time_subtraction,
        clippy::too_many_lines
    )
)]

pub mod act;
pub mod metrics;
pub mod plan;
pub mod sync;
#[cfg(test)]
mod sync_tests;
pub mod zones;

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Node;
use shared::api::apierr::{Classify, ErrorKind};
use shared::api::ratelimit::BackoffConfig;
use shared::cache::pod::Pod;
use shared::cache::pod::{INDEX_POD_NODE, pod_by_node};
use shared::process::flags::duration_arg;
use shared::runtime::controller::{Controller, Declaration, InitError, Registration, Setup};
use std::sync::Arc;
use std::time::Duration;

pub const DECLARATION: Declaration = Declaration {
    name: "node-lifecycle-controller",
    aliases: &["nodelifecycle"],
    event_source: "node-controller",
    on_by_default: true,
};
pub const NAME: &str = DECLARATION.name;
/// Upstream's event source for this controller.
pub const EVENT_SOURCE: &str = DECLARATION.event_source;
/// The node queue's name (label `name` of `workqueue_*`).
pub const QUEUE: &str = "node_lifecycle_controller";
pub const POD_QUEUE: &str = "node_lifecycle_controller_pods";
pub const NODE_LEASE_NAMESPACE: &str = "kube-node-lease";
/// Upstream's `nodeUpdateWorkerSize`.
const NODE_WORKERS: usize = 8;
const POD_WORKERS: usize = 2;

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
    #[error("marking pod {pod} not ready: {source}")]
    Pod { pod: String, source: kube::Error },
    #[error("reading node {node}'s live Lease: {source}")]
    Lease { node: String, source: kube::Error },
}

impl Classify for Error {
    fn kind(&self) -> ErrorKind {
        match self {
            Error::Status { source, .. }
            | Error::Taints { source, .. }
            | Error::Pod { source, .. }
            | Error::Lease { source, .. } => source.kind(),
        }
    }
}

pub fn registration(opts: NodeLifecycleOptions) -> Registration {
    Registration::built(DECLARATION, Box::new(move |setup| init(opts, setup)))
}

/// Wires the controller to the shared caches and the runtime.
pub fn init(opts: NodeLifecycleOptions, setup: Setup) -> Result<Box<dyn Controller>, InitError> {
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
    let mut wiring = setup.wiring();
    let backoff = || BackoffConfig::exponential(Duration::from_millis(20), Duration::from_secs(5));
    let queue = wiring.queue(QUEUE, backoff());
    let pod_queue = wiring.queue(POD_QUEUE, backoff());
    let period = opts.node_monitor_period;
    let ctl = Arc::new(sync::NodeLifecycleController::new(
        opts,
        sync::Caches {
            nodes: Arc::clone(&nodes),
            leases: Arc::clone(&leases),
            pods: Arc::clone(&pods),
        },
        (Arc::clone(&queue), Arc::clone(&pod_queue)),
        setup.ctx(metrics::Metrics::register(&setup.metrics)),
    ));
    // NL-1: probes are taken as changes are observed.
    let c = Arc::downgrade(&ctl);
    wiring.on_change(&nodes, move |change| {
        if let Some(c) = c.upgrade() {
            c.node_changed(change);
        }
    });
    let c = Arc::downgrade(&ctl);
    wiring.on_change(&leases, move |change| {
        if let Some(c) = c.upgrade() {
            c.lease_changed(change);
        }
    });
    // NL-7.
    wiring.map(&pods, &pod_queue, sync::pod_keys);
    // NL-17: every node counts as added; the first full pass starts at once.
    let c = Arc::clone(&ctl);
    wiring.on_start(move || c.full_pass());
    // NL-5: the full pass every --node-monitor-period.
    let c = Arc::clone(&ctl);
    wiring.every(period, move || {
        c.full_pass();
        async {}
    });
    // NL-11: the tainter serves the zone queues every 100 ms.
    let (c, spawner) = (Arc::clone(&ctl), wiring.spawner());
    wiring.every(zones::TAINT_PASS, move || {
        c.taint_pass(&spawner);
        async {}
    });
    let c = Arc::clone(&ctl);
    wiring.workers(&pod_queue, POD_WORKERS, move |key: String| {
        let c = Arc::clone(&c);
        async move { c.sync_pod(&key).await }
    });
    wiring.workers(&queue, NODE_WORKERS, move |name: String| {
        let c = Arc::clone(&ctl);
        async move { c.sync_node(&name).await }
    });
    Ok(wiring.build())
}
