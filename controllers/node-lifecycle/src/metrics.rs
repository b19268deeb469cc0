//! The controller's metrics: upstream's `node_collector_*` names (zone gauges of NL-12, evictions
//! of NL-11) and Pilothouse's own (NB-2's detection latency, the zone-token queue depth).

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use shared::metrics::FloatGauge;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ZoneLabel {
    pub zone: String,
}

impl ZoneLabel {
    pub fn of(zone: &str) -> ZoneLabel {
        ZoneLabel {
            zone: zone.to_string(),
        }
    }
}

/// What a detection-latency sample timed: the Unknown conditions, the `unreachable:NoSchedule`
/// taint, or the NoExecute taint.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct KindLabel {
    pub kind: &'static str,
}

fn detection_histogram() -> Histogram {
    Histogram::new([0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0])
}

pub struct Metrics {
    pub zone_health: Family<ZoneLabel, FloatGauge>,
    pub zone_size: Family<ZoneLabel, Gauge>,
    pub unhealthy: Family<ZoneLabel, Gauge>,
    pub evictions: Family<ZoneLabel, Counter>,
    pub node_health_duration: Histogram,
    pub all_nodes_duration: Histogram,
    pub queue_depth: Family<ZoneLabel, Gauge>,
    /// NB-2: grace expiry → write accepted, token waits excluded.
    pub detection: Family<KindLabel, Histogram, fn() -> Histogram>,
}

impl Metrics {
    pub fn register(r: &shared::metrics::Metrics) -> Metrics {
        let m = Metrics {
            zone_health: Family::default(),
            zone_size: Family::default(),
            unhealthy: Family::default(),
            evictions: Family::default(),
            node_health_duration: Histogram::new(exponential_buckets(0.001, 4.0, 8)),
            all_nodes_duration: Histogram::new(exponential_buckets(0.01, 4.0, 8)),
            queue_depth: Family::default(),
            detection: Family::new_with_constructor(detection_histogram),
        };
        r.register(
            "node_collector_zone_health",
            "Gauge measuring percentage of healthy nodes per zone",
            m.zone_health.clone(),
        );
        r.register(
            "node_collector_zone_size",
            "Gauge measuring number of registered Nodes per zones",
            m.zone_size.clone(),
        );
        r.register(
            "node_collector_unhealthy_nodes_in_zone",
            "Gauge measuring number of not Ready Nodes per zones",
            m.unhealthy.clone(),
        );
        r.register("node_collector_evictions", "Number of Node evictions that happened since current instance of NodeController started", m.evictions.clone());
        r.register(
            "node_collector_update_node_health_duration_seconds",
            "Duration in seconds for NodeController to update the health of a single node",
            m.node_health_duration.clone(),
        );
        r.register(
            "node_collector_update_all_nodes_health_duration_seconds",
            "Duration in seconds for NodeController to update the health of all nodes",
            m.all_nodes_duration.clone(),
        );
        r.register(
            "pilothouse_node_lifecycle_detection_latency_seconds",
            "Seconds from a node's grace expiry to the accepted write of its Unknown conditions, unreachable NoSchedule taint or NoExecute taint, zone-token waits excluded",
            m.detection.clone(),
        );
        r.register(
            "pilothouse_node_lifecycle_taint_queue_depth",
            "Nodes waiting for a zone token",
            m.queue_depth.clone(),
        );
        m
    }
}
