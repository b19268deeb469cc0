//! The process-wide metrics registry and the metric families the runtime itself owns.
//!
//! Names follow kube-controller-manager's (`workqueue_*`, `rest_client_requests_total`,
//! `leader_election_master_status`) so existing dashboards keep working.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::{Metric, Registry};
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex, OnceLock};

#[derive(Default)]
pub struct Metrics {
    registry: Mutex<Registry>,
    workqueue: OnceLock<Arc<WorkqueueMetrics>>,
    rest_client: OnceLock<Arc<RestClientMetrics>>,
    reconcile: OnceLock<Arc<ReconcileMetrics>>,
    stale_skips: OnceLock<Family<StaleSkipLabels, Counter>>,
    events_dropped: OnceLock<Family<ControllerLabel, Counter>>,
}

impl std::fmt::Debug for Metrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Metrics")
    }
}

pub type FloatGauge = Gauge<f64, AtomicU64>;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct StaleSkipLabels {
    pub controller: String,
    pub resource: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct NameLabel {
    pub name: String,
}

fn latency_histogram() -> Histogram {
    // client-go's workqueue buckets: 10 ns .. 10 s, decades.
    Histogram::new(exponential_buckets(1e-8, 10.0, 10))
}

/// client-go's workqueue metrics, labelled by queue `name`.
pub struct WorkqueueMetrics {
    pub depth: Family<NameLabel, Gauge>,
    pub adds: Family<NameLabel, Counter>,
    pub queue_duration: Family<NameLabel, Histogram, fn() -> Histogram>,
    pub work_duration: Family<NameLabel, Histogram, fn() -> Histogram>,
    pub unfinished_work: Family<NameLabel, FloatGauge>,
    pub longest_running: Family<NameLabel, FloatGauge>,
    pub retries: Family<NameLabel, Counter>,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RequestLabels {
    pub code: String,
    pub method: String,
    pub host: String,
    /// Which controller's client issued the request (user agent suffix).
    pub controller: String,
}

pub struct RestClientMetrics {
    pub requests: Family<RequestLabels, Counter>,
    pub rate_limiter_wait: Family<NameLabel, Histogram, fn() -> Histogram>,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct SyncLabels {
    pub controller: String,
    pub queue: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct SyncResultLabels {
    pub controller: String,
    pub queue: String,
    /// `success`, `requeue` (success with a delayed resync), an error kind's label, or `panic`.
    pub result: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ControllerLabel {
    pub controller: String,
}

/// Per-sync metrics the runtime keeps for every queue of every controller.
pub struct ReconcileMetrics {
    pub duration: Family<SyncLabels, Histogram, fn() -> Histogram>,
    pub results: Family<SyncResultLabels, Counter>,
    pub panics: Family<ControllerLabel, Counter>,
}

fn sync_histogram() -> Histogram {
    // 1 ms .. ~65 s.
    Histogram::new(exponential_buckets(0.001, 2.0, 17))
}

impl Metrics {
    pub fn new() -> Arc<Self> {
        Arc::new(Metrics::default())
    }

    pub fn register(&self, name: &str, help: &str, metric: impl Metric) {
        self.registry
            .lock()
            .expect("registry lock")
            .register(name, help, metric);
    }

    /// OpenMetrics text of everything registered.
    pub fn encode(&self) -> String {
        let mut out = String::new();
        let reg = self.registry.lock().expect("registry lock");
        prometheus_client::encoding::text::encode(&mut out, &reg)
            .expect("encoding to a String cannot fail");
        out
    }

    pub fn workqueue(&self) -> Arc<WorkqueueMetrics> {
        self.workqueue
            .get_or_init(|| {
                let m = WorkqueueMetrics {
                    depth: Family::default(),
                    adds: Family::default(),
                    queue_duration: Family::new_with_constructor(latency_histogram),
                    work_duration: Family::new_with_constructor(latency_histogram),
                    unfinished_work: Family::default(),
                    longest_running: Family::default(),
                    retries: Family::default(),
                };
                self.register("workqueue_depth", "Current depth of workqueue", m.depth.clone());
                self.register("workqueue_adds", "Total number of adds handled by workqueue", m.adds.clone());
                self.register(
                    "workqueue_queue_duration_seconds",
                    "How long in seconds an item stays in workqueue before being requested",
                    m.queue_duration.clone(),
                );
                self.register(
                    "workqueue_work_duration_seconds",
                    "How long in seconds processing an item from workqueue takes",
                    m.work_duration.clone(),
                );
                self.register(
                    "workqueue_unfinished_work_seconds",
                    "How many seconds of work has been done that is in progress and hasn't been observed by work_duration",
                    m.unfinished_work.clone(),
                );
                self.register(
                    "workqueue_longest_running_processor_seconds",
                    "How many seconds has the longest running processor for workqueue been running",
                    m.longest_running.clone(),
                );
                self.register("workqueue_retries", "Total number of retries handled by workqueue", m.retries.clone());
                Arc::new(m)
            })
            .clone()
    }

    pub fn reconcile(&self) -> Arc<ReconcileMetrics> {
        self.reconcile
            .get_or_init(|| {
                let m = ReconcileMetrics {
                    duration: Family::new_with_constructor(sync_histogram),
                    results: Family::default(),
                    panics: Family::default(),
                };
                self.register(
                    "pilothouse_reconcile_duration_seconds",
                    "How long one sync of one key takes, by controller and queue",
                    m.duration.clone(),
                );
                self.register(
                    "pilothouse_reconcile",
                    "Syncs by controller, queue and result (success, requeue, an error kind, or panic)",
                    m.results.clone(),
                );
                self.register(
                    "pilothouse_reconcile_panics",
                    "Syncs that panicked; the key is retried with backoff",
                    m.panics.clone(),
                );
                Arc::new(m)
            })
            .clone()
    }

    /// `pilothouse_stale_cache_skips_total{controller,resource}` (spec §7): syncs held back
    /// because a cache had not caught up with this replica's own writes. One family for every
    /// controller, registered on first use.
    pub fn stale_skip(&self, controller: &str, resource: &str) {
        self.stale_skips
            .get_or_init(|| {
                let f = Family::default();
                self.register(
                    "pilothouse_stale_cache_skips",
                    "Syncs skipped because a cache had not caught up with this replica's own writes",
                    f.clone(),
                );
                f
            })
            .get_or_create(&StaleSkipLabels {
                controller: controller.to_string(),
                resource: resource.to_string(),
            })
            .inc();
    }

    /// `pilothouse_events_dropped_total{controller}`: events not written because the
    /// controller's budget could not carry them (the recorder's queue was full).
    pub fn events_dropped(&self, controller: &str) -> Counter {
        self.events_dropped
            .get_or_init(|| {
                let f = Family::default();
                self.register(
                    "pilothouse_events_dropped",
                    "Events dropped because the controller's API budget could not carry them (its queue of pending events was full)",
                    f.clone(),
                );
                f
            })
            .get_or_create(&ControllerLabel {
                controller: controller.to_string(),
            })
            .clone()
    }

    pub fn rest_client(&self) -> Arc<RestClientMetrics> {
        self.rest_client
            .get_or_init(|| {
                let m = RestClientMetrics {
                    requests: Family::default(),
                    rate_limiter_wait: Family::new_with_constructor(latency_histogram),
                };
                self.register(
                    "rest_client_requests",
                    "Number of HTTP requests, partitioned by status code, method, host and controller",
                    m.requests.clone(),
                );
                self.register(
                    "rest_client_rate_limiter_duration_seconds",
                    "Client side rate limiter latency in seconds, by controller",
                    m.rate_limiter_wait.clone(),
                );
                Arc::new(m)
            })
            .clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counters_get_total_suffix_and_queue_label() {
        let m = Metrics::new();
        let wq = m.workqueue();
        wq.adds
            .get_or_create(&NameLabel { name: "job".into() })
            .inc();
        // Asking twice returns the same families (registered once).
        m.workqueue()
            .adds
            .get_or_create(&NameLabel { name: "job".into() })
            .inc();
        let text = m.encode();
        assert!(
            text.contains("workqueue_adds_total{name=\"job\"} 2"),
            "{text}"
        );
        assert_eq!(
            text.matches("# TYPE workqueue_adds counter").count(),
            1,
            "{text}"
        );
    }
}
