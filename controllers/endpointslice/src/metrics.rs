//! The controller's metrics (ES-14's writes, ES-15's stale syncs), with upstream's names
//! (`endpointslice/metrics`), and the efficiency totals upstream keeps in its metrics cache
//! [metrics/cache.go].

use crate::endpoints::PortKey;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::family::{Family, MetricConstructor};
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use std::collections::{BTreeMap, HashMap};
use std::sync::Mutex;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct Operation {
    pub operation: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ChangedLabels {
    pub topology: String,
    pub traffic_distribution: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct SyncResult {
    pub result: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct Distribution {
    pub traffic_distribution: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ServiceLabels {
    pub namespace: String,
    pub service: String,
}

#[derive(Clone)]
pub struct DefaultBuckets;

impl MetricConstructor<Histogram> for DefaultBuckets {
    fn new_metric(&self) -> Histogram {
        // Prometheus' default buckets (upstream registers this histogram without buckets).
        Histogram::new([
            0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
        ])
    }
}

pub struct Metrics {
    pub added_per_sync: Histogram,
    pub removed_per_sync: Histogram,
    pub endpoints_desired: Gauge,
    pub num_slices: Gauge,
    pub desired_slices: Gauge,
    pub changes: Family<Operation, shared::metrics::UnsuffixedCounter>,
    pub changed_per_sync: Family<ChangedLabels, Histogram, DefaultBuckets>,
    pub syncs: Family<SyncResult, shared::metrics::UnsuffixedCounter>,
    pub by_distribution: Family<Distribution, Gauge>,
    pub retained: Family<ServiceLabels, Gauge>,
    efficiency: Mutex<Efficiency>,
}

/// Per Service and address type, per port set: (endpoints, slices).
type PortTotals = BTreeMap<PortKey, (usize, usize)>;

#[derive(Default)]
struct Efficiency {
    max: usize,
    /// Running totals over every Service: (actual slices, desired slices, endpoints).
    sum: (i64, i64, i64),
    by_service: HashMap<(String, &'static str), PortTotals>,
    distribution: HashMap<String, String>,
}

impl Efficiency {
    fn add(&mut self, (a, d, n): (i64, i64, i64), sign: i64) {
        self.sum.0 = self.sum.0.saturating_add(a.saturating_mul(sign));
        self.sum.1 = self.sum.1.saturating_add(d.saturating_mul(sign));
        self.sum.2 = self.sum.2.saturating_add(n.saturating_mul(sign));
    }

    /// (actual slices, desired slices, endpoints) [ServicePortCache.totals].
    fn totals(&self, items: &PortTotals) -> (i64, i64, i64) {
        let (mut actual, mut desired, mut endpoints) = (0i64, 0i64, 0i64);
        for (eps, slices) in items.values() {
            endpoints = endpoints.saturating_add(*eps as i64);
            actual = actual.saturating_add(*slices as i64);
            desired = desired.saturating_add(eps.div_ceil(self.max.max(1)) as i64);
        }
        (actual, desired.max(1), endpoints)
    }
}

impl Metrics {
    pub fn register(
        registry: &std::sync::Arc<shared::metrics::Metrics>,
        max_per_slice: usize,
    ) -> Metrics {
        let per_sync = || Histogram::new(exponential_buckets(2.0, 2.0, 15));
        let m = Metrics {
            added_per_sync: per_sync(),
            removed_per_sync: per_sync(),
            endpoints_desired: Gauge::default(),
            num_slices: Gauge::default(),
            desired_slices: Gauge::default(),
            changes: Family::default(),
            changed_per_sync: Family::new_with_constructor(DefaultBuckets),
            syncs: Family::default(),
            by_distribution: Family::default(),
            retained: Family::default(),
            efficiency: Mutex::new(Efficiency {
                max: max_per_slice,
                ..Efficiency::default()
            }),
        };
        let s = "endpoint_slice_controller_";
        registry.register(
            &format!("{s}endpoints_added_per_sync"),
            "Number of endpoints added on each Service sync",
            m.added_per_sync.clone(),
        );
        registry.register(
            &format!("{s}endpoints_removed_per_sync"),
            "Number of endpoints removed on each Service sync",
            m.removed_per_sync.clone(),
        );
        registry.register(
            &format!("{s}endpoints_desired"),
            "Number of endpoints desired",
            m.endpoints_desired.clone(),
        );
        registry.register(
            &format!("{s}num_endpoint_slices"),
            "Number of EndpointSlices",
            m.num_slices.clone(),
        );
        registry.register(
            &format!("{s}desired_endpoint_slices"),
            "Number of EndpointSlices that would exist with perfect endpoint allocation",
            m.desired_slices.clone(),
        );
        registry.register(
            &format!("{s}changes"),
            "Number of EndpointSlice changes",
            m.changes.clone(),
        );
        registry.register(
            &format!("{s}endpointslices_changed_per_sync"),
            "Number of EndpointSlices changed on each Service sync",
            m.changed_per_sync.clone(),
        );
        registry.register(
            &format!("{s}syncs"),
            "Number of EndpointSlice syncs",
            m.syncs.clone(),
        );
        registry.register(
            &format!("{s}services_count_by_traffic_distribution"),
            "Number of Services using some specific trafficDistribution",
            m.by_distribution.clone(),
        );
        registry.register(
            "pilothouse_endpointslice_retained_slices",
            "EndpointSlices kept for a Service whose selector was removed (SB-10)",
            m.retained.clone(),
        );
        m
    }

    pub fn change(&self, operation: &str) {
        self.changes
            .get_or_create(&Operation {
                operation: operation.to_string(),
            })
            .inc();
    }

    pub fn sync(&self, result: &str) {
        self.syncs
            .get_or_create(&SyncResult {
                result: result.to_string(),
            })
            .inc();
    }

    /// [UpdateServicePortCache], per address type: upstream keys by Service only, so a
    /// dual-stack Service's second family overwrote the first's totals.
    pub fn set_efficiency(&self, service: &str, address_type: &'static str, items: PortTotals) {
        let mut e = self.efficiency.lock().unwrap_or_else(|p| p.into_inner());
        let new = e.totals(&items);
        let old = e
            .by_service
            .insert((service.to_string(), address_type), items)
            .map(|old| e.totals(&old));
        e.add(new, 1);
        if let Some(old) = old {
            e.add(old, -1);
        }
        self.publish(&e);
    }

    /// [UpdateTrafficDistributionForService].
    pub fn set_distribution(&self, service: &str, distribution: Option<&str>) {
        let mut e = self.efficiency.lock().unwrap_or_else(|p| p.into_inner());
        let old = match distribution {
            Some(d) => e.distribution.insert(service.to_string(), d.to_string()),
            None => e.distribution.remove(service),
        };
        if old.as_deref() == distribution {
            return;
        }
        self.count_distribution(old.as_deref(), -1);
        self.count_distribution(distribution, 1);
    }

    fn count_distribution(&self, distribution: Option<&str>, delta: i64) {
        if let Some(d) = distribution {
            self.by_distribution
                .get_or_create(&Distribution {
                    traffic_distribution: d.to_string(),
                })
                .inc_by(delta);
        }
    }

    /// A family the Service no longer has: its totals leave the gauges.
    pub fn forget_family(&self, service: &str, address_type: &str) {
        let mut e = self.efficiency.lock().unwrap_or_else(|p| p.into_inner());
        let key = e
            .by_service
            .keys()
            .find(|(s, t)| s == service && *t == address_type)
            .cloned();
        if let Some(old) = key.and_then(|k| e.by_service.remove(&k)) {
            let old = e.totals(&old);
            e.add(old, -1);
            self.publish(&e);
        }
    }

    /// [DeleteService].
    pub fn forget_service(&self, service: &str) {
        let mut e = self.efficiency.lock().unwrap_or_else(|p| p.into_inner());
        for family in [crate::endpoints::IPV4, crate::endpoints::IPV6] {
            if let Some(old) = e.by_service.remove(&(service.to_string(), family)) {
                let old = e.totals(&old);
                e.add(old, -1);
            }
        }
        let old = e.distribution.remove(service);
        self.count_distribution(old.as_deref(), -1);
        self.publish(&e);
    }

    fn publish(&self, e: &Efficiency) {
        let (actual, desired, endpoints) = e.sum;
        self.num_slices.set(actual);
        self.desired_slices.set(desired);
        self.endpoints_desired.set(endpoints);
    }
}
