//! The controller's metrics, with upstream's names.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::Histogram;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReasonLabel {
    pub reason: String,
}

pub struct Metrics {
    pub deletions: Counter,
    pub deletion_duration: Histogram,
    pub failures: Family<ReasonLabel, Counter>,
}

impl Metrics {
    pub fn register(registry: &shared::metrics::Metrics) -> Metrics {
        let m = Metrics {
            deletions: Counter::default(),
            deletion_duration: Histogram::new([
                0.005, 0.025, 0.1, 0.5, 1.0, 2.5, 10.0, 30.0, 60.0, 120.0, 180.0, 240.0,
            ]),
            failures: Family::default(),
        };
        registry.register(
            "taint_eviction_controller_pod_deletions",
            "Total number of Pods deleted by TaintEvictionController since its start",
            m.deletions.clone(),
        );
        registry.register(
            "taint_eviction_controller_pod_deletion_duration_seconds",
            "Latency, in seconds, between the time when a taint effect has been activated for the Pod and its deletion via TaintEvictionController",
            m.deletion_duration.clone(),
        );
        registry.register(
            "pilothouse_taint_eviction_failures",
            "Failed attempts to mark and delete a pod, by reason (HTTP code or transport)",
            m.failures.clone(),
        );
        m
    }
}
