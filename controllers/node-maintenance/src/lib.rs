//! `node-maintenance-controller`: declarative, PDB-aware node drains (NM-1..NM-23): a
//! NodeMaintenance cordons its node (reference-counted among overlapping objects), evicts the
//! node's pods through the Eviction API in kubectl drain's terms, names what blocks it, and
//! restores the node when it ends.
//!
//! Wiring only: one queue keyed by object name, fed by the objects themselves, their nodes, the
//! nodes' pods, PodDisruptionBudgets (NM-16) and DaemonSets (NM-9). [`sync`] is one object's
//! sync (stage dispatch and the per-stage steps), [`drain`] its drain step (kubectl drain's
//! eviction) and [`release`] its end (uncordon, finishing); [`plan`], [`classify`], [`evict`],
//! [`conditions`] and [`status`] its pure decisions; [`act`] its writes; [`tracker`] the
//! eviction state shared per pod.

// A table test may be longer than a function should be (clippy::too_many_lines is denied in the
// workspace lints).
#![cfg_attr(test, allow(clippy::too_many_lines))]

pub mod act;
pub mod classify;
pub mod conditions;
pub mod drain;
pub mod evict;
pub mod handlers;
pub mod metrics;
pub mod plan;
#[cfg(test)]
mod plan_props;
pub mod release;
pub mod status;
pub mod sync;
#[cfg(test)]
mod sync_tests;
pub mod tracker;
pub mod types;

use handlers::INDEX_NM_NODE;
use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use kube::ResourceExt;
use shared::api::apierr::{Classify, ErrorKind};
use shared::api::ratelimit::BackoffConfig;
use shared::cache::informers::{INDEX_NAMESPACE, Informer, by_namespace};
use shared::cache::pod::Pod;
use shared::cache::pod::{INDEX_POD_NODE, pod_by_node};
use shared::cache::projection::PodFields;
use shared::runtime::controller::{Controller, Declaration, InitError, Registration, Setup};
use std::sync::Arc;
use std::time::Duration;
use types::NodeMaintenance;

pub const DECLARATION: Declaration = Declaration {
    name: "node-maintenance-controller",
    aliases: &[],
    event_source: "node-maintenance-controller",
    // It needs the NodeMaintenance CRD installed: operators enable it by name.
    on_by_default: false,
};
pub const NAME: &str = DECLARATION.name;
pub const QUEUE: &str = "nodemaintenance";

#[derive(clap::Args, Clone, Debug)]
pub struct Options {
    /// Pilothouse (NM-23): patch the node's KEP-5683 conditions (MaintenanceInProgress, DrainInProgress, Drained) while a NodeMaintenance acts on it.
    #[arg(long, default_value_t = false, num_args = 0..=1, require_equals = true, default_missing_value = "true", action = clap::ArgAction::Set)]
    pub nodemaintenance_node_lifecycle_conditions: bool,
    /// The number of NodeMaintenance objects that are allowed to sync concurrently.
    #[arg(long, default_value_t = 5, value_parser = clap::value_parser!(u32).range(1..=50))]
    pub concurrent_nodemaintenance_syncs: u32,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            nodemaintenance_node_lifecycle_conditions: false,
            concurrent_nodemaintenance_syncs: 5,
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(transparent)]
    Api(#[from] shared::api::apierr::Failed),
}

impl Classify for Error {
    fn kind(&self) -> ErrorKind {
        match self {
            Error::Api(e) => e.kind(),
        }
    }
}

pub fn registration(opts: Options) -> Registration {
    Registration::built(DECLARATION, Box::new(move |setup| init(setup, opts)))
}

fn keys_on(objects: &Informer<NodeMaintenance>, nodes: &[String]) -> Vec<String> {
    nodes
        .iter()
        .flat_map(|n| objects.by_index(INDEX_NM_NODE, n))
        .map(|o| o.name_any())
        .collect()
}

/// Wires the controller to the shared caches and the runtime.
pub fn init(setup: Setup, opts: Options) -> Result<Box<dyn Controller>, InitError> {
    // NM-10 reads emptyDir volumes; priority, owners and annotations are always kept.
    setup.informers.read_pod_fields(PodFields::VOLUMES);
    let objects = setup.informers.get::<NodeMaintenance>();
    objects.add_index(INDEX_NM_NODE, handlers::nm_by_node);
    let nodes = setup.informers.get::<Node>();
    let pods = setup.informers.get::<Pod>();
    pods.add_index(INDEX_POD_NODE, pod_by_node);
    let pdbs = setup.informers.get::<PodDisruptionBudget>();
    pdbs.add_index(INDEX_NAMESPACE, by_namespace);
    let daemonsets = setup.informers.get::<DaemonSet>();
    let mut wiring = setup.wiring();
    let queue = wiring.queue(
        QUEUE,
        BackoffConfig::exponential(Duration::from_secs(1), Duration::from_secs(300)),
    );
    let tracker = Arc::new(tracker::Tracker::default());
    let ctl = Arc::new(sync::NodeMaintenanceController::new(
        sync::Caches {
            objects: Arc::clone(&objects),
            nodes: Arc::clone(&nodes),
            pods: Arc::clone(&pods),
            pdbs: Arc::clone(&pdbs),
            daemonsets: Arc::clone(&daemonsets),
        },
        Arc::clone(&tracker),
        opts.nodemaintenance_node_lifecycle_conditions,
        setup.ctx(metrics::Metrics::register(&setup.metrics)),
    ));
    let o = Arc::clone(&objects);
    wiring.map(&objects, &queue, move |c| {
        let mut keys = keys_on(&o, &handlers::nm_nodes(c));
        keys.push(c.object().name_any());
        keys
    });
    let o = Arc::clone(&objects);
    wiring.map(&nodes, &queue, move |c| {
        if handlers::node_relevant(c) {
            keys_on(&o, &[c.object().name_any()])
        } else {
            vec![]
        }
    });
    let o = Arc::clone(&objects);
    wiring.map(&pods, &queue, move |c| keys_on(&o, &handlers::pod_nodes(c)));
    // A deleted pod is gone for every object that targets it.
    let (t, clock) = (Arc::clone(&tracker), Arc::clone(&setup.clock));
    wiring.on_change(&pods, move |c| {
        if let shared::cache::informers::Change::Deleted(p) = c
            && let Some(uid) = p.metadata.uid.as_deref()
        {
            t.pod_gone(uid, clock.now());
        }
    });
    // NM-16: a budget that may allow evictions now resets the backoff of the pods it blocks.
    let (o, t, p) = (
        Arc::clone(&objects),
        Arc::clone(&tracker),
        Arc::clone(&pods),
    );
    wiring.map(&pdbs, &queue, move |c| {
        if !handlers::pdb_may_unblock(c) {
            return vec![];
        }
        let pdb = c.object();
        let ns = pdb.metadata.namespace.clone().unwrap_or_default();
        let name = pdb.metadata.name.clone().unwrap_or_default();
        let nodes = t.reset_blocked(&ns, |_, r| {
            r.pdb
                .as_deref()
                .is_some_and(|b| b.split(',').any(|b| b == name))
                || p.get(&r.key())
                    .is_some_and(|pod| evict::pdb_matches(pdb, &pod))
        });
        keys_on(&o, &nodes)
    });
    let o = Arc::clone(&objects);
    wiring.map(&daemonsets, &queue, move |c| {
        if handlers::daemonset_relevant(c) {
            o.list().iter().map(|nm| nm.name_any()).collect()
        } else {
            vec![]
        }
    });
    let (o, q) = (Arc::clone(&objects), Arc::clone(&queue));
    wiring.on_start(move || {
        for nm in o.list() {
            q.add(nm.name_any());
        }
    });
    let c = Arc::clone(&ctl);
    wiring.every(Duration::from_secs(10), move || {
        let c = Arc::clone(&c);
        async move { c.count_phases() }
    });
    let workers = opts.concurrent_nodemaintenance_syncs.max(1) as usize;
    wiring.workers(&queue, workers, move |key: String| {
        let ctl = Arc::clone(&ctl);
        async move { ctl.sync(&key).await }
    });
    Ok(wiring.build())
}
