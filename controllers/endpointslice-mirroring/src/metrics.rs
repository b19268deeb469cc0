//! The controller's metrics (MR-3's skipped addresses, MR-6's slice changes) with upstream's
//! names [pkg/controller/endpointslicemirroring/metrics/metrics.go], and the per-Endpoints totals
//! upstream keeps behind its gauges [metrics/cache.go].

use crate::desired::SliceKey;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use std::collections::{BTreeMap, HashMap};
use std::sync::Mutex;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct Operation {
    pub operation: String,
}

/// Per key of one Endpoints: (endpoints desired, slices).
pub type KeyTotals = BTreeMap<SliceKey, (usize, usize)>;

#[derive(Default)]
struct Efficiency {
    max: usize,
    by_endpoints: HashMap<String, KeyTotals>,
    /// Running sum of desired endpoints over every Endpoints.
    endpoints: i64,
}

pub struct Metrics {
    pub added_per_sync: Histogram,
    pub updated_per_sync: Histogram,
    pub removed_per_sync: Histogram,
    pub skipped_per_sync: Histogram,
    pub sync_duration: Histogram,
    pub endpoints_desired: Gauge,
    pub num_slices: Gauge,
    pub desired_slices: Gauge,
    pub changes: Family<Operation, shared::metrics::UnsuffixedCounter>,
    efficiency: Mutex<Efficiency>,
}

fn to_i64(n: usize) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

impl Metrics {
    pub fn register(
        registry: &std::sync::Arc<shared::metrics::Metrics>,
        max_per_subset: usize,
    ) -> Metrics {
        let per_sync = || Histogram::new(exponential_buckets(2.0, 2.0, 15));
        let m = Metrics {
            added_per_sync: per_sync(),
            updated_per_sync: per_sync(),
            removed_per_sync: per_sync(),
            skipped_per_sync: per_sync(),
            sync_duration: Histogram::new(exponential_buckets(0.001, 2.0, 15)),
            endpoints_desired: Gauge::default(),
            num_slices: Gauge::default(),
            desired_slices: Gauge::default(),
            changes: Family::default(),
            efficiency: Mutex::new(Efficiency {
                max: max_per_subset.max(1),
                ..Efficiency::default()
            }),
        };
        let s = "endpoint_slice_mirroring_controller_";
        let help = [
            (
                "endpoints_added_per_sync",
                "Number of endpoints added on each Endpoints sync",
                &m.added_per_sync,
            ),
            (
                "endpoints_updated_per_sync",
                "Number of endpoints updated on each Endpoints sync",
                &m.updated_per_sync,
            ),
            (
                "endpoints_removed_per_sync",
                "Number of endpoints removed on each Endpoints sync",
                &m.removed_per_sync,
            ),
            (
                "addresses_skipped_per_sync",
                "Number of addresses skipped on each Endpoints sync due to being invalid or exceeding MaxEndpointsPerSubset",
                &m.skipped_per_sync,
            ),
            (
                "endpoints_sync_duration",
                "Duration of syncEndpoints() in seconds",
                &m.sync_duration,
            ),
        ];
        for (name, text, h) in help {
            registry.register(&format!("{s}{name}"), text, h.clone());
        }
        for (name, text, g) in [
            (
                "endpoints_desired",
                "Number of endpoints desired",
                &m.endpoints_desired,
            ),
            (
                "num_endpoint_slices",
                "Number of EndpointSlices",
                &m.num_slices,
            ),
            (
                "desired_endpoint_slices",
                "Number of EndpointSlices that would exist with perfect endpoint allocation",
                &m.desired_slices,
            ),
        ] {
            registry.register(&format!("{s}{name}"), text, g.clone());
        }
        registry.register(
            &format!("{s}changes"),
            "Number of EndpointSlice changes",
            m.changes.clone(),
        );
        // Stale-cache skips are counted by the runtime (`Next::Stale`), in its process-wide
        // family.
        m
    }

    pub fn change(&self, operation: &str) {
        self.changes
            .get_or_create(&Operation {
                operation: operation.to_string(),
            })
            .inc();
    }

    /// [Cache.UpdateEndpointPortCache].
    pub fn set_efficiency(&self, endpoints: &str, items: KeyTotals) {
        let mut e = shared::lock(&self.efficiency);
        let now: usize = items.values().map(|(n, _)| *n).sum();
        let before: usize = e
            .by_endpoints
            .insert(endpoints.to_string(), items)
            .map(|old| old.values().map(|(n, _)| *n).sum())
            .unwrap_or(0);
        e.endpoints = e
            .endpoints
            .saturating_add(to_i64(now))
            .saturating_sub(to_i64(before));
        self.publish(&e);
    }

    /// [Cache.DeleteEndpoints].
    pub fn forget(&self, endpoints: &str) {
        let mut e = shared::lock(&self.efficiency);
        if let Some(old) = e.by_endpoints.remove(endpoints) {
            let n: usize = old.values().map(|(n, _)| *n).sum();
            e.endpoints = e.endpoints.saturating_sub(to_i64(n));
            self.publish(&e);
        }
    }

    /// [Cache.updateMetrics]: the slices are summed over every Endpoints at each change, as
    /// upstream does; desired slices are ⌈endpoints / max⌉ per key (0 for none).
    fn publish(&self, e: &Efficiency) {
        let (mut actual, mut desired) = (0usize, 0usize);
        for items in e.by_endpoints.values() {
            for (n, slices) in items.values() {
                actual = actual.saturating_add(*slices);
                desired = desired.saturating_add(n.div_ceil(e.max));
            }
        }
        self.num_slices.set(to_i64(actual));
        self.desired_slices.set(to_i64(desired));
        self.endpoints_desired.set(e.endpoints);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use endpointslice::endpoints::PortKey;

    fn key(t: &str) -> SliceKey {
        SliceKey {
            address_type: t.into(),
            ports: PortKey::default(),
        }
    }

    #[test]
    fn mr7_efficiency_gauges_follow_upstreams_cache() {
        let registry = shared::metrics::Metrics::new();
        let m = Metrics::register(&registry, 2);
        m.set_efficiency(
            "ns/a",
            BTreeMap::from([(key("IPv4"), (3, 1)), (key("IPv6"), (0, 0))]),
        );
        m.set_efficiency("ns/b", BTreeMap::from([(key("IPv4"), (1, 1))]));
        assert_eq!(
            (
                m.endpoints_desired.get(),
                m.num_slices.get(),
                m.desired_slices.get()
            ),
            (4, 2, 3)
        );
        m.set_efficiency("ns/a", BTreeMap::from([(key("IPv4"), (2, 1))]));
        assert_eq!(
            (
                m.endpoints_desired.get(),
                m.num_slices.get(),
                m.desired_slices.get()
            ),
            (3, 2, 2)
        );
        m.forget("ns/a");
        m.forget("ns/unknown");
        assert_eq!(
            (
                m.endpoints_desired.get(),
                m.num_slices.get(),
                m.desired_slices.get()
            ),
            (1, 1, 1)
        );
        m.change("create");
        let text = registry.encode();
        for name in [
            "endpoint_slice_mirroring_controller_endpoints_added_per_sync",
            "endpoint_slice_mirroring_controller_endpoints_updated_per_sync",
            "endpoint_slice_mirroring_controller_endpoints_removed_per_sync",
            "endpoint_slice_mirroring_controller_addresses_skipped_per_sync",
            "endpoint_slice_mirroring_controller_endpoints_sync_duration",
            "endpoint_slice_mirroring_controller_endpoints_desired",
            "endpoint_slice_mirroring_controller_num_endpoint_slices",
            "endpoint_slice_mirroring_controller_desired_endpoint_slices",
            "endpoint_slice_mirroring_controller_changes",
        ] {
            assert!(text.contains(&format!("# TYPE {name} ")), "{name}\n{text}");
        }
    }
}
