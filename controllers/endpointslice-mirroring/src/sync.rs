//! One Endpoints' sync [endpointslicemirroring_controller.go: syncEndpoints; reconciler.go:
//! reconcile]: observe the caches, decide whether to mirror (MR-1), plan (MR-3..MR-6), write,
//! report (MR-7).

use crate::act::Act;
use crate::handlers::{has_selector, mirrored, should_mirror};
use crate::metrics::Metrics;
use crate::{Error, desired, plan};
use endpointslice::sync::INDEX_SERVICE;
use endpointslice::tracker::SliceTracker;
use k8s_openapi::api::core::v1::{Endpoints, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use shared::api::writer::Writer;
use shared::cache::informers::Informer;
use shared::cache::written::Behind;
use shared::meta::keys::split_key;
use shared::meta::refs::object_reference;
use shared::runtime::controller::Ctx;
use shared::runtime::events::EventRecorder;
use shared::runtime::queue::Next;
use std::sync::Arc;

pub struct Caches {
    pub endpoints: Arc<Informer<Endpoints>>,
    pub services: Arc<Informer<Service>>,
    pub slices: Arc<Informer<EndpointSlice>>,
}

pub struct EndpointSliceMirroringController {
    caches: Caches,
    writer: Writer,
    events: EventRecorder,
    metrics: Metrics,
    max_per_subset: usize,
    tracker: Arc<SliceTracker>,
}

impl EndpointSliceMirroringController {
    pub fn new(
        caches: Caches,
        ctx: Ctx<Metrics>,
        max_per_subset: usize,
        tracker: Arc<SliceTracker>,
    ) -> Self {
        let Ctx {
            writer,
            events,
            metrics,
            ..
        } = ctx;
        EndpointSliceMirroringController {
            caches,
            writer,
            events,
            metrics,
            max_per_subset: max_per_subset.max(1),
            tracker,
        }
    }

    pub async fn sync(&self, key: &str) -> Result<Next, Error> {
        let start = tokio::time::Instant::now();
        let result = self.sync_endpoints(key).await;
        // Upstream observes whole milliseconds, in seconds.
        let millis = start.elapsed().as_millis();
        self.metrics
            .sync_duration
            .observe(u32::try_from(millis).map_or(f64::MAX, f64::from) / 1000.0);
        result
    }

    async fn sync_endpoints(&self, key: &str) -> Result<Next, Error> {
        // MR-1: each switch, and a missing Endpoints, removes what was mirrored.
        let Some(endpoints) = self.caches.endpoints.get(key) else {
            return self.stop_mirroring(key, "Endpoints not found").await;
        };
        if !should_mirror(&endpoints) {
            return self
                .stop_mirroring(key, "Endpoints should not be mirrored")
                .await;
        }
        let Some(svc) = self.caches.services.get(key) else {
            return self.stop_mirroring(key, "Service not found").await;
        };
        if has_selector(&svc) {
            return self.stop_mirroring(key, "Service has a selector").await;
        }
        let slices = self.mirrored_slices(key);
        // MR-7: the runtime counts the skip and looks again.
        if self.tracker.stale(key, &slices) {
            return Ok(Next::Stale(Behind::of::<EndpointSlice>()));
        }
        let subsets = endpoints.subsets.as_deref().unwrap_or_default();
        let want = desired::desired(subsets, self.max_per_subset);
        self.report_skipped(&endpoints, &want);
        let plan = plan::plan(&endpoints, &slices, want, self.max_per_subset);
        let t = plan.totals;
        self.metrics.added_per_sync.observe(t.added as f64);
        self.metrics.updated_per_sync.observe(t.updated as f64);
        self.metrics.removed_per_sync.observe(t.removed as f64);
        self.metrics.set_efficiency(key, plan.efficiency.clone());
        let (namespace, _) = split_key(key);
        let act = Act {
            writer: &self.writer,
            tracker: &self.tracker,
            metrics: &self.metrics,
            owner: key,
            namespace,
        };
        act.finalize(plan, endpoints.metadata.deletion_timestamp.is_some())
            .await?;
        Ok(Next::Done)
    }

    /// MR-7 [reconcile]: the skipped-address histogram and the two warnings on the Endpoints.
    fn report_skipped(&self, endpoints: &Endpoints, want: &desired::Desired) {
        self.metrics.skipped_per_sync.observe(want.skipped as f64);
        let about = object_reference(endpoints);
        if want.invalid > 0 {
            self.events.warning(
                &about,
                "InvalidIPAddress",
                "",
                format!(
                    "Skipped {} invalid IP addresses when mirroring to EndpointSlices",
                    want.invalid
                ),
            );
        }
        if want.skipped > want.invalid {
            tracing::info!(
                endpoints = %crate::key_of(endpoints),
                skipped = want.skipped,
                "addresses in Endpoints were skipped due to exceeding MaxEndpointsPerSubset"
            );
            self.events.warning(
                &about,
                "TooManyAddressesToMirror",
                "",
                format!(
                    "A max of {} addresses can be mirrored to EndpointSlices per Endpoints subset. {} addresses were skipped",
                    self.max_per_subset, want.skipped
                ),
            );
        }
    }

    /// MR-1 [deleteMirroredSlices]: forget the Endpoints and delete every slice mirrored for
    /// its name, whatever the cache's freshness.
    async fn stop_mirroring(&self, key: &str, why: &str) -> Result<Next, Error> {
        tracing::debug!(
            endpoints = key,
            why,
            "cleaning up any mirrored EndpointSlices"
        );
        let slices = self.mirrored_slices(key);
        self.tracker.forget(key);
        self.metrics.forget(key);
        let (namespace, _) = split_key(key);
        Act {
            writer: &self.writer,
            tracker: &self.tracker,
            metrics: &self.metrics,
            owner: key,
            namespace,
        }
        .delete_all(&slices)
        .await?;
        Ok(Next::Done)
    }

    /// [endpointSlicesMirroredForService]: slices whose service-name label is the Endpoints'
    /// name and whose managed-by is this controller (those being deleted included, as
    /// upstream's lister returns them).
    fn mirrored_slices(&self, key: &str) -> Vec<Arc<EndpointSlice>> {
        self.caches
            .slices
            .by_index(INDEX_SERVICE, key)
            .into_iter()
            .filter(|s| mirrored(s))
            .collect()
    }
}
