//! `endpointslice-mirroring-controller` (MR-1..MR-7):
//! EndpointSlices mirrored from the Endpoints of Services without a selector, as
//! kube-controller-manager 1.37 writes them.
//!
//! Wiring only: the `endpoint_slice_mirroring` queue (keyed `namespace/name` of Endpoints) is
//! fed by Endpoints and Service changes at once and by mirrored-slice changes after the batch
//! period (MR-2). [`sync`] is one Endpoints' sync; [`desired`] (MR-3, MR-4) and [`plan`]
//! (MR-5, MR-6) are its pure decisions, [`act`] its writes; the slice tracker (MR-7) is the
//! endpointslice controller's.

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
pub mod desired;
pub mod handlers;
pub mod metrics;
pub mod plan;
pub mod sync;
#[cfg(test)]
mod sync_tests;

use endpointslice::sync::{INDEX_SERVICE, slice_by_service};
use endpointslice::tracker::SliceTracker;
use k8s_openapi::api::core::v1::{Endpoints, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use shared::api::ratelimit::BackoffConfig;
use shared::meta::keys::object_key;
use shared::process::flags::duration_arg;
use shared::runtime::controller::{Controller, Declaration, InitError, Registration, Setup};
use std::sync::Arc;
use std::time::Duration;

pub const DECLARATION: Declaration = Declaration {
    name: "endpointslice-mirroring-controller",
    aliases: &["endpointslicemirroring"],
    event_source: "endpoint-slice-mirroring-controller",
    on_by_default: true,
};
pub const NAME: &str = DECLARATION.name;
/// MR-2's queue, under upstream's name (label `name` of `workqueue_*`).
pub const QUEUE: &str = "endpoint_slice_mirroring";

#[derive(clap::Args, Clone, Debug)]
pub struct EndpointSliceMirroringOptions {
    /// The number of service endpoint syncing operations that will be done concurrently by the endpointslice-mirroring-controller. Larger number = faster endpoint slice updating, but more CPU (and network) load. Defaults to 5.
    #[arg(long, default_value_t = 5, value_parser = clap::value_parser!(u32).range(1..=50))]
    pub mirroring_concurrent_service_endpoint_syncs: u32,
    /// The maximum number of endpoints that will be added to an EndpointSlice by the endpointslice-mirroring-controller. More endpoints per slice will result in less endpoint slices, but larger resources. Defaults to 1000.
    #[arg(long, default_value_t = 1000, value_parser = clap::value_parser!(u32).range(1..=1000))]
    pub mirroring_max_endpoints_per_subset: u32,
    /// The length of EndpointSlice updates batching period for endpointslice-mirroring-controller. Processing of EndpointSlice changes will be delayed by this duration to join them with potential upcoming updates and reduce the overall number of EndpointSlice updates. Larger number = higher endpoint programming latency, but lower number of endpoints revision generated
    #[arg(long, default_value = "0s", value_parser = duration_arg)]
    pub mirroring_endpointslice_updates_batch_period: Duration,
}

impl Default for EndpointSliceMirroringOptions {
    fn default() -> Self {
        EndpointSliceMirroringOptions {
            mirroring_concurrent_service_endpoint_syncs: 5,
            mirroring_max_endpoints_per_subset: 1000,
            mirroring_endpointslice_updates_batch_period: Duration::ZERO,
        }
    }
}

/// The EndpointSlice controller's error: the same three outcomes (an API failure, a slice cache
/// behind this controller's writes (MR-7), deletes that failed in Go's aggregate form).
pub use endpointslice::{Error, api};

pub(crate) fn key_of(endpoints: &Endpoints) -> String {
    object_key(endpoints)
}

pub fn registration(opts: EndpointSliceMirroringOptions) -> Registration {
    Registration::built(DECLARATION, Box::new(move |setup| init(opts, setup)))
}

/// Wires the controller to the shared caches and the runtime.
pub fn init(
    opts: EndpointSliceMirroringOptions,
    setup: Setup,
) -> Result<Box<dyn Controller>, InitError> {
    let endpoints = setup.informers.get::<Endpoints>();
    let services = setup.informers.get::<Service>();
    let slices = setup.informers.get::<EndpointSlice>();
    // Shared with the endpointslice controller: the first registration wins, both are equal.
    slices.add_index(INDEX_SERVICE, slice_by_service);
    let mut wiring = setup.wiring();
    // MR-2: 1 s doubling to 100 s, max'd with a 10 qps / 100 bucket; never dropped (upstream
    // drops a key after 15 retries).
    let queue = wiring.queue(
        QUEUE,
        BackoffConfig {
            base: Duration::from_secs(1),
            max: Duration::from_secs(100),
            bucket: Some((10.0, 100)),
        },
    );
    let tracker = Arc::new(SliceTracker::default());
    let max = opts.mirroring_max_endpoints_per_subset as usize;
    let ctl = Arc::new(sync::EndpointSliceMirroringController::new(
        sync::Caches {
            endpoints: Arc::clone(&endpoints),
            services: Arc::clone(&services),
            slices: Arc::clone(&slices),
        },
        setup.ctx(metrics::Metrics::register(&setup.metrics, max)),
        max,
        Arc::clone(&tracker),
    ));
    wiring.map(&endpoints, &queue, handlers::endpoints_keys);
    wiring.map(&services, &queue, handlers::service_keys);
    let batch = opts.mirroring_endpointslice_updates_batch_period;
    let (t, q) = (Arc::clone(&tracker), Arc::clone(&queue));
    wiring.on_change(&slices, move |change| {
        for key in handlers::slice_keys(&t, change) {
            q.add_after(key, batch);
        }
    });
    // On taking over, what upstream's initial list would queue: mirrorable Endpoints,
    // selectorless Services, and the owners of mirrored slices (so that slices whose mirroring
    // stopped while no replica led are cleaned up).
    let (e, s, sl, q) = (
        Arc::clone(&endpoints),
        Arc::clone(&services),
        Arc::clone(&slices),
        Arc::clone(&queue),
    );
    wiring.on_start(move || {
        for ep in e.list() {
            if handlers::should_mirror(&ep) {
                q.add(object_key(ep.as_ref()));
            }
        }
        for svc in s.list() {
            if !handlers::has_selector(&svc) {
                q.add(object_key(svc.as_ref()));
            }
        }
        for slice in sl.list() {
            if handlers::mirrored(&slice)
                && let Some(key) = endpointslice::handlers::service_of(&slice)
            {
                q.add(key);
            }
        }
    });
    wiring.workers(
        &queue,
        opts.mirroring_concurrent_service_endpoint_syncs as usize,
        move |key: String| {
            let ctl = Arc::clone(&ctl);
            async move { ctl.sync(&key).await }
        },
    );
    Ok(wiring.build())
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::{CommandFactory, FromArgMatches, Parser};

    #[derive(Parser, Debug)]
    struct Cli {
        #[command(flatten)]
        o: EndpointSliceMirroringOptions,
    }

    fn parse(args: &[&str]) -> Result<EndpointSliceMirroringOptions, clap::Error> {
        let m = Cli::command()
            .try_get_matches_from(std::iter::once("p").chain(args.iter().copied()))?;
        Ok(Cli::from_arg_matches(&m)?.o)
    }

    #[test]
    fn mr_flags_match_kube_controller_manager() {
        let o = parse(&[]).unwrap();
        assert_eq!(o.mirroring_concurrent_service_endpoint_syncs, 5);
        assert_eq!(o.mirroring_max_endpoints_per_subset, 1000);
        assert_eq!(
            o.mirroring_endpointslice_updates_batch_period,
            Duration::ZERO
        );
        let o = parse(&[
            "--mirroring-concurrent-service-endpoint-syncs=50",
            "--mirroring-max-endpoints-per-subset=1",
            "--mirroring-endpointslice-updates-batch-period=1m30s",
        ])
        .unwrap();
        assert_eq!(o.mirroring_concurrent_service_endpoint_syncs, 50);
        assert_eq!(o.mirroring_max_endpoints_per_subset, 1);
        assert_eq!(
            o.mirroring_endpointslice_updates_batch_period,
            Duration::from_secs(90)
        );
        for bad in [
            "--mirroring-concurrent-service-endpoint-syncs=0",
            "--mirroring-concurrent-service-endpoint-syncs=51",
            "--mirroring-max-endpoints-per-subset=0",
            "--mirroring-max-endpoints-per-subset=1001",
            "--mirroring-endpointslice-updates-batch-period=-1s",
            "--mirroring-endpointslice-updates-batch-period=5",
        ] {
            assert!(parse(&[bad]).is_err(), "{bad}");
        }
        // MR-3's per-subset cap: upstream's help text says 100; the default is 1000.
        let help = Cli::command().render_long_help().to_string();
        assert!(help.contains("Defaults to 1000"), "{help}");
        assert_eq!(
            help.matches("Defaults to 100").count(),
            help.matches("Defaults to 1000").count(),
            "{help}"
        );
    }
}
