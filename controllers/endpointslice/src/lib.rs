//! `endpointslice-controller` (ES-1..ES-21, SB-10..SB-14): upstream's
//! EndpointSlices for every Service with a selector, written with upstream's reconcile algorithm
//! so that the same change costs the same writes.
//!
//! Wiring only: the `endpoint_slice` queue (keyed `namespace/name` of Services) is fed by Service
//! changes at once, by pod changes after the batch period and by slice changes after at least
//! one second (ES-4); a topology queue rebuilds the zone inventory on node changes. [`sync`] is
//! one Service's sync; [`endpoints`] (ES-9..ES-13) and [`plan`] (ES-14) are its pure decisions,
//! [`topology`] and [`trafficdist`] its hints (ES-18..ES-20), [`act`] its writes and
//! [`tracker`] its memory (ES-15, ES-17).

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
pub mod batching;
pub mod endpoints;
pub mod handlers;
pub mod metrics;
pub mod plan;
pub mod sync;
#[cfg(test)]
mod sync_tests;
pub mod topology;
pub mod tracker;
pub mod trafficdist;

use k8s_openapi::api::core::v1::{Node, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use shared::api::apierr::{Classify, ErrorKind};
use shared::api::ratelimit::BackoffConfig;
use shared::cache::informers::{INDEX_NAMESPACE, by_namespace};
use shared::cache::pod::Pod;
use shared::cache::projection::PodFields;
use shared::meta::keys::object_key;
use shared::runtime::controller::{Controller, Declaration, InitError, Registration, Setup};
use std::sync::Arc;
use std::time::Duration;

pub const DECLARATION: Declaration = Declaration {
    name: "endpointslice-controller",
    aliases: &["endpointslice"],
    event_source: "endpoint-slice-controller",
    on_by_default: true,
};
pub const NAME: &str = DECLARATION.name;
/// ES-3's queue, under upstream's name (label `name` of `workqueue_*`).
pub const QUEUE: &str = "endpoint_slice";
/// The topology queue (unnamed upstream, so it had no metrics).
pub const TOPOLOGY_QUEUE: &str = "endpoint_slice_topology";

#[derive(clap::Args, Clone, Debug)]
pub struct EndpointSliceOptions {
    /// The number of service endpoint syncing operations that will be done concurrently. Larger number = faster endpoint slice updating, but more CPU (and network) load.
    #[arg(long, default_value_t = 5, value_parser = clap::value_parser!(u32).range(1..=50))]
    pub concurrent_service_endpoint_syncs: u32,
    /// The maximum number of endpoints that will be added to an EndpointSlice. More endpoints per slice will result in less endpoint slices, but larger resources.
    #[arg(long, default_value_t = 100, value_parser = clap::value_parser!(u32).range(1..=1000))]
    pub max_endpoints_per_slice: u32,
    /// The length of endpoint slice updates batching period. Processing of pod changes will be delayed by this duration to join them with potential upcoming updates and reduce the overall number of endpoints updates. Pilothouse's default, `adaptive`, writes an isolated change at once and coalesces a burst into one sync per second per Service (kube-controller-manager's default is 0s: every change written at once).
    #[arg(long, default_value = "adaptive", value_parser = batching::batch_period_arg)]
    pub endpointslice_updates_batch_period: batching::BatchPeriod,
    /// Pilothouse (SB-10): delete the EndpointSlices of a Service whose selector was removed, instead of keeping them frozen as kube-controller-manager does.
    #[arg(long, default_value_t = false, num_args = 0..=1, require_equals = true, default_missing_value = "true", action = clap::ArgAction::Set)]
    pub endpointslice_delete_on_selector_removal: bool,
}

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(transparent)]
    Api(#[from] shared::api::apierr::Failed),
    /// Writes or pods that failed, in Go's aggregate form (the sync is retried). The mirroring
    /// controller shares this enum.
    #[error("{0}")]
    Sync(String),
}

impl Classify for Error {
    fn kind(&self) -> ErrorKind {
        match self {
            Error::Api(e) => e.kind(),
            Error::Sync(_) => ErrorKind::Other,
        }
    }
}

/// An API error with what the sync was doing.
pub fn api(what: impl Into<String>) -> impl FnOnce(kube::Error) -> Error {
    shared::api::apierr::doing(what)
}

pub fn registration(opts: EndpointSliceOptions) -> Registration {
    Registration::built(DECLARATION, Box::new(move |setup| init(opts, setup)))
}

/// Wires the controller to the shared caches and the runtime.
pub fn init(opts: EndpointSliceOptions, setup: Setup) -> Result<Box<dyn Controller>, InitError> {
    // ES-10: named target ports resolve against container ports.
    setup.informers.read_pod_fields(PodFields::CONTAINER_PORTS);
    let services = setup.informers.get::<Service>();
    services.add_index(INDEX_NAMESPACE, by_namespace);
    let pods = setup.informers.get::<Pod>();
    pods.add_index(INDEX_NAMESPACE, by_namespace);
    let slices = setup.informers.get::<EndpointSlice>();
    slices.add_index(sync::INDEX_SERVICE, sync::slice_by_service);
    let nodes = setup.informers.get::<Node>();
    let mut wiring = setup.wiring();
    // ES-3: 1 s doubling to 1000 s, max'd with a 10 qps / 100 bucket; never dropped (SB-11).
    let queue = wiring.queue(
        QUEUE,
        BackoffConfig {
            base: Duration::from_secs(1),
            max: Duration::from_secs(1000),
            bucket: Some((10.0, 100)),
        },
    );
    let topology_queue = wiring.queue::<String>(TOPOLOGY_QUEUE, BackoffConfig::default());
    let tracker = Arc::new(tracker::SliceTracker::default());
    let hints = Arc::new(topology::TopologyCache::new());
    let max = opts.max_endpoints_per_slice as usize;
    let ctl = Arc::new(sync::EndpointSliceController::new(
        sync::Caches {
            services: Arc::clone(&services),
            pods: Arc::clone(&pods),
            slices: Arc::clone(&slices),
            nodes: Arc::clone(&nodes),
        },
        setup.ctx(metrics::Metrics::register(&setup.metrics, max)),
        sync::Config {
            max_endpoints_per_slice: max,
            delete_on_selector_removal: opts.endpointslice_delete_on_selector_removal,
        },
        Arc::clone(&tracker),
        hints,
    ));
    // ES-4.
    let period = opts.endpointslice_updates_batch_period;
    let batcher = Arc::new(batching::Batcher::new(period));
    let (b, q) = (Arc::clone(&batcher), Arc::clone(&queue));
    wiring.on_change(&services, move |change| {
        let key = object_key(change.object().as_ref());
        if let shared::cache::informers::Change::Deleted(_) = change {
            b.forget(&key);
        }
        q.add(key);
    });
    let (s, q) = (Arc::clone(&services), Arc::clone(&queue));
    wiring.on_change(&pods, move |change| {
        let now = tokio::time::Instant::now();
        for key in handlers::pod_services(&s, change) {
            let delay = batcher.delay(&key, now);
            q.add_after(key, delay);
        }
    });
    let slice_delay = period.slice_delay(handlers::SLICE_MIN_DELAY);
    let (s, q) = (Arc::clone(&services), Arc::clone(&queue));
    wiring.on_change(&slices, move |change| {
        for key in handlers::slice_services(&tracker, &s, change) {
            q.add_after(key, slice_delay);
        }
    });
    let tq = Arc::clone(&topology_queue);
    wiring.on_change(&nodes, move |change| {
        if handlers::node_topology_changed(change) {
            tq.add("topology".to_string());
        }
    });
    // On taking over, every Service is synced, and the inventory built.
    let (s, q, tq) = (
        Arc::clone(&services),
        Arc::clone(&queue),
        Arc::clone(&topology_queue),
    );
    wiring.on_start(move || {
        tq.add("topology".to_string());
        for svc in s.list() {
            q.add(object_key(svc.as_ref()));
        }
    });
    let (c, q) = (Arc::clone(&ctl), Arc::clone(&queue));
    wiring.workers(&topology_queue, 1, move |_key: String| {
        let (c, q) = (Arc::clone(&c), Arc::clone(&q));
        async move {
            for key in c.topology_changed() {
                q.add(key);
            }
            Ok::<_, Error>(shared::runtime::queue::Next::Done)
        }
    });
    wiring.workers(
        &queue,
        opts.concurrent_service_endpoint_syncs as usize,
        move |key: String| {
            let ctl = Arc::clone(&ctl);
            async move { ctl.sync(&key).await }
        },
    );
    Ok(wiring.build())
}
