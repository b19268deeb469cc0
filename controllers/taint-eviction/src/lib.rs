//! `taint-eviction-controller`: deletes pods from nodes with NoExecute taints they do not
//! tolerate, at once or after their `tolerationSeconds` (TE-1..TE-11).
//!
//! Wiring only: one queue keyed by pod (`namespace/name`), fed by node taint changes and pod
//! changes; [`sync`] is one pod's sync, [`plan`] its pure decisions, [`act`] its writes.

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

use k8s_openapi::api::core::v1::Node;
use kube::ResourceExt;
use shared::api::apierr::{Classify, ErrorKind};
use shared::api::ratelimit::BackoffConfig;
use shared::cache::informers::Change;
use shared::cache::pod::Pod;
use shared::cache::pod::{INDEX_POD_NODE, pod_by_node};
use shared::cache::projection::PodFields;
use shared::meta::keys::object_key;
use shared::runtime::controller::{Controller, Declaration, InitError, Registration, Setup};
use std::sync::Arc;
use std::time::Duration;

pub const DECLARATION: Declaration = Declaration {
    name: "taint-eviction-controller",
    aliases: &[],
    event_source: "taint-eviction-controller",
    on_by_default: true,
};
pub const NAME: &str = DECLARATION.name;
/// Upstream's pod-update queue name (label `name` of `workqueue_*`).
pub const QUEUE: &str = "noexec_taint_pod";
/// Upstream's `UpdateWorkerSize`.
pub const WORKERS: usize = 8;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(transparent)]
    Evict(#[from] act::ActError),
}

impl Classify for Error {
    fn kind(&self) -> ErrorKind {
        match self {
            Error::Evict(e) => e.kind(),
        }
    }
}

pub fn registration() -> Registration {
    Registration::built(DECLARATION, Box::new(init))
}

/// TE-1: a node counts when its NoExecute taints change (deletion only forgets its taints:
/// pending timers keep running).
pub fn node_relevant(change: &Change<Node>) -> bool {
    match change {
        Change::Added(n) => !plan::no_execute_taints(n).is_empty(),
        Change::Updated { old, new } => {
            !plan::same_taints(&plan::no_execute_taints(old), &plan::no_execute_taints(new))
        }
        Change::Deleted(_) => false,
    }
}

/// TE-1: a pod counts on add (when bound), delete, or a change of tolerations or node.
pub fn pod_relevant(change: &Change<Pod>) -> bool {
    match change {
        Change::Added(p) => sync::node_name(p).is_some(),
        Change::Updated { old, new } => {
            sync::tolerations(old) != sync::tolerations(new)
                || sync::node_name(old) != sync::node_name(new)
        }
        Change::Deleted(_) => true,
    }
}

/// Wires the controller to the shared caches and the runtime.
pub fn init(setup: Setup) -> Result<Box<dyn Controller>, InitError> {
    // Of a pod: its node and tolerations (nodeName is always kept).
    setup.informers.read_pod_fields(PodFields::TOLERATIONS);
    let pods = setup.informers.get::<Pod>();
    pods.add_index(INDEX_POD_NODE, pod_by_node);
    let nodes = setup.informers.get::<Node>();
    let mut wiring = setup.wiring();
    let queue = wiring.queue(
        QUEUE,
        BackoffConfig::exponential(Duration::from_millis(100), Duration::from_secs(30)),
    );
    let ctl = Arc::new(sync::TaintEvictionController::new(
        Arc::clone(&pods),
        Arc::clone(&nodes),
        Arc::clone(&queue),
        setup.ctx(metrics::Metrics::register(&setup.metrics)),
    ));
    let c = Arc::downgrade(&ctl);
    wiring.map(&nodes, &queue, move |change| match c.upgrade() {
        Some(c) if node_relevant(change) => c.pods_on(&change.object().name_any()),
        _ => vec![],
    });
    wiring.map(&pods, &queue, |change| {
        if pod_relevant(change) {
            vec![object_key(change.object().as_ref())]
        } else {
            vec![]
        }
    });
    // TE-11: on taking over, every tainted node's pods are processed as fresh events.
    let c = Arc::clone(&ctl);
    wiring.on_start(move || {
        for node in c.nodes.list() {
            if !plan::no_execute_taints(&node).is_empty() {
                for key in c.pods_on(&node.name_any()) {
                    c.queue.add(key);
                }
            }
        }
    });
    wiring.workers(&queue, WORKERS, move |key: String| {
        let ctl = Arc::clone(&ctl);
        async move { ctl.sync(&key).await }
    });
    Ok(wiring.build())
}
