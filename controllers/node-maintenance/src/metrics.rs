//! The controller's metrics, all Pilothouse's own `pilothouse_nodemaintenance_*` (evictions per
//! reply of NM-13, deletions of NM-18, blocked pods of NM-17, objects by phase, drain durations).

use crate::types::Phase;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PhaseLabel {
    pub phase: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ResultLabel {
    pub result: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ObjectLabel {
    pub nodemaintenance: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct OutcomeLabel {
    pub outcome: String,
}

/// 1 s … 86400 s (a day), roughly ×3 per bucket.
pub const DRAIN_BUCKETS: [f64; 11] = [
    1.0, 3.0, 10.0, 30.0, 60.0, 300.0, 900.0, 1800.0, 3600.0, 21600.0, 86400.0,
];

pub const RESULTS: [&str; 8] = [
    "accepted",
    "not_found",
    "pdb",
    "pdb_deadlock",
    "multiple_pdb",
    "denied",
    "throttled",
    "error",
];

#[derive(Clone)]
pub struct Metrics {
    pub objects: Family<PhaseLabel, Gauge>,
    pub evictions: Family<ResultLabel, Counter>,
    pub deletions: Counter,
    pub blocked_pods: Family<ObjectLabel, Gauge>,
    pub drain_duration: Family<OutcomeLabel, Histogram>,
}

impl Metrics {
    pub fn register(registry: &shared::metrics::Metrics) -> Metrics {
        let m = Metrics {
            objects: Family::default(),
            evictions: Family::default(),
            deletions: Counter::default(),
            blocked_pods: Family::default(),
            drain_duration: Family::new_with_constructor(|| Histogram::new(DRAIN_BUCKETS)),
        };
        // Every series exists from the start, so a dashboard sees zeros, not gaps.
        for p in Phase::ALL {
            m.objects
                .get_or_create(&PhaseLabel {
                    phase: p.as_str().into(),
                })
                .set(0);
        }
        for r in RESULTS {
            m.evictions
                .get_or_create(&ResultLabel { result: r.into() })
                .inc_by(0);
        }
        registry.register(
            "pilothouse_nodemaintenance_objects",
            "NodeMaintenance objects by phase",
            m.objects.clone(),
        );
        registry.register(
            "pilothouse_nodemaintenance_evictions",
            "Eviction responses by result (one per response)",
            m.evictions.clone(),
        );
        registry.register(
            "pilothouse_nodemaintenance_deletions",
            "Pods deleted past a drain deadline (timeoutPolicy Delete)",
            m.deletions.clone(),
        );
        registry.register(
            "pilothouse_nodemaintenance_blocked_pods",
            "Targets whose last eviction attempt failed, per NodeMaintenance",
            m.blocked_pods.clone(),
        );
        registry.register(
            "pilothouse_nodemaintenance_drain_duration_seconds",
            "From status.drain.startTime to drained or cancelled",
            m.drain_duration.clone(),
        );
        m
    }

    pub fn eviction(&self, result: &str) {
        self.evictions
            .get_or_create(&ResultLabel {
                result: result.into(),
            })
            .inc();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_labels_and_buckets_as_the_spec_says() {
        let registry = shared::metrics::Metrics::new();
        let m = Metrics::register(&registry);
        m.eviction("pdb_deadlock");
        m.deletions.inc();
        m.blocked_pods
            .get_or_create(&ObjectLabel {
                nodemaintenance: "w1".into(),
            })
            .set(1);
        m.drain_duration
            .get_or_create(&OutcomeLabel {
                outcome: "drained".into(),
            })
            .observe(2.0);
        let text = registry.encode();
        for want in [
            "pilothouse_nodemaintenance_objects{phase=\"Draining\"} 0",
            "pilothouse_nodemaintenance_evictions_total{result=\"pdb_deadlock\"} 1",
            "pilothouse_nodemaintenance_evictions_total{result=\"throttled\"} 0",
            "pilothouse_nodemaintenance_deletions_total 1",
            "pilothouse_nodemaintenance_blocked_pods{nodemaintenance=\"w1\"} 1",
            "pilothouse_nodemaintenance_drain_duration_seconds_bucket{le=\"86400.0\",outcome=\"drained\"} 1",
            "pilothouse_nodemaintenance_drain_duration_seconds_bucket{le=\"1.0\",outcome=\"drained\"} 0",
        ] {
            assert!(text.contains(want), "{want} missing from\n{text}");
        }
    }
}
