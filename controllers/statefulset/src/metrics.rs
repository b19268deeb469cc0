//! The controller's metrics (ST-25's `M` and `U`, ST-44's stale skips, SB-7's gauge), with
//! upstream's names (`pkg/controller/statefulset/metrics`).

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use shared::metrics::GroupResourceLabels;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct SetLabels {
    pub statefulset_namespace: String,
    pub statefulset_name: String,
    pub pod_management_policy: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ZeroGraceLabels {
    pub namespace: String,
    pub statefulset: String,
}

pub struct Metrics {
    pub max_unavailable: Family<SetLabels, Gauge>,
    pub unavailable: Family<SetLabels, Gauge>,
    /// Fed by the runtime from each `Next::Stale` (see `Wiring::count_stale_skips_in`).
    pub stale_skips: Family<GroupResourceLabels, Counter>,
    pub zero_grace: Family<ZeroGraceLabels, Gauge>,
}

impl Metrics {
    pub fn register(registry: &std::sync::Arc<shared::metrics::Metrics>) -> Metrics {
        let m = Metrics {
            max_unavailable: Family::default(),
            unavailable: Family::default(),
            stale_skips: Family::default(),
            zero_grace: Family::default(),
        };
        registry.register(
            "statefulset_controller_statefulset_max_unavailable",
            "Maximum number of unavailable pods allowed during StatefulSet rolling updates",
            m.max_unavailable.clone(),
        );
        registry.register(
            "statefulset_controller_statefulset_unavailable_replicas",
            "Current number of unavailable pods in StatefulSet",
            m.unavailable.clone(),
        );
        // Upstream 1.37's name (ST-44); it counts ControllerRevisions too here (SB-8).
        registry.register(
            "statefulset_controller_stale_sync_skips",
            "Total number of StatefulSet syncs skipped due to a stale watch cache.",
            m.stale_skips.clone(),
        );
        registry.register(
            "pilothouse_statefulset_zero_grace_period",
            "1 for a StatefulSet whose pods have terminationGracePeriodSeconds 0 (a replacement may share a volume with a still-running pod, SB-7)",
            m.zero_grace.clone(),
        );
        m
    }
}
