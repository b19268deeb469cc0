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
    running_controllers: OnceLock<Family<ManagedControllerLabels, Gauge>>,
    troubles: Troubles,
}

/// What in the runtime is failing right now, by controller: a starter retrying after a panic, a
/// task waiting to restart after one. `/readyz` lists it (the panic itself is in the log, with
/// whatever object it names). Kept beside the metrics because everything that can fail and
/// everything that reports already holds them.
#[derive(Default)]
pub struct Troubles(Mutex<std::collections::BTreeMap<(String, String), String>>);

impl Troubles {
    /// Records that `part` of `controller` is failing now, and how.
    pub fn set(&self, controller: &str, part: &str, how: String) {
        crate::lock(&self.0).insert((controller.to_string(), part.to_string()), how);
    }

    pub fn clear(&self, controller: &str, part: &str) {
        crate::lock(&self.0).remove(&(controller.to_string(), part.to_string()));
    }

    /// `controller: part how`, one per failing part.
    pub fn list(&self) -> Vec<String> {
        crate::lock(&self.0)
            .iter()
            .map(|((c, part), how)| format!("{c}: {part} {how}"))
            .collect()
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ManagedControllerLabels {
    pub name: String,
    pub manager: String,
}

impl std::fmt::Debug for Metrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Metrics")
    }
}

pub type FloatGauge = Gauge<f64, AtomicU64>;

/// A counter served under its family name, with no `_total`, as OpenMetrics type `unknown`.
/// kube-controller-manager serves a few counters without the suffix
/// (`endpoint_slice_controller_changes`, `..._syncs`, `endpoint_slice_mirroring_controller_changes`)
/// in the Prometheus text format, where that is legal; an OpenMetrics counter's samples always
/// end in `_total`, so queries written against kcm would find nothing.
#[derive(Clone, Debug, Default)]
pub struct UnsuffixedCounter(Counter);

impl UnsuffixedCounter {
    pub fn inc(&self) -> u64 {
        self.0.inc()
    }

    pub fn get(&self) -> u64 {
        self.0.get()
    }
}

impl prometheus_client::metrics::TypedMetric for UnsuffixedCounter {
    const TYPE: prometheus_client::metrics::MetricType =
        prometheus_client::metrics::MetricType::Unknown;
}

impl prometheus_client::encoding::EncodeMetric for UnsuffixedCounter {
    fn encode(
        &self,
        mut encoder: prometheus_client::encoding::MetricEncoder,
    ) -> Result<(), std::fmt::Error> {
        // A bare sample line (`name{labels} value`), as a gauge's or an unknown's is.
        encoder.encode_gauge(&self.0.get())
    }

    fn metric_type(&self) -> prometheus_client::metrics::MetricType {
        prometheus_client::metrics::MetricType::Unknown
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct StaleSkipLabels {
    pub controller: String,
    pub resource: String,
}

/// The labels of upstream's per-controller stale-skip counters
/// (`job_controller_stale_sync_skips`, `statefulset_controller_stale_sync_skips`).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct GroupResourceLabels {
    pub group: String,
    pub resource: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ResourceLabel {
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
    /// client-go's `rest_client_request_duration_seconds{verb,host}`: from sending a request
    /// (after the rate limiter) to its response headers.
    pub request_duration: Family<VerbHostLabels, Histogram, fn() -> Histogram>,
    /// client-go's `rest_client_request_retries_total{code,method,host}`: re-sends the server
    /// asked for with `Retry-After`, by the answer that asked.
    pub retries: Family<RetryLabels, Counter>,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RetryLabels {
    pub code: String,
    pub method: String,
    pub host: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct VerbHostLabels {
    pub verb: String,
    pub host: String,
}

fn request_duration_histogram() -> Histogram {
    // client-go's buckets.
    Histogram::new([
        0.005, 0.025, 0.1, 0.25, 0.5, 1.0, 2.0, 4.0, 8.0, 15.0, 30.0, 60.0,
    ])
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
        let m = Metrics::default();
        {
            let mut reg = crate::lock(&m.registry);
            reg.register_collector(Box::new(ProcessCollector));
            let build = Family::<BuildInfoLabels, Gauge>::default();
            build.get_or_create(&BuildInfoLabels::current()).set(1);
            reg.register(
                "kubernetes_build_info",
                "A metric with a constant '1' value labeled by major, minor, git version, git commit, git tree state, build date, Go version, and compiler from which Kubernetes was built, and platform on which it is running",
                build,
            );
            let own = Family::<PilothouseBuildLabels, Gauge>::default();
            own.get_or_create(&PilothouseBuildLabels {
                version: env!("CARGO_PKG_VERSION").into(),
                git_commit: option_env!("PILOTHOUSE_GIT_COMMIT").unwrap_or("").into(),
            })
            .set(1);
            reg.register(
                "pilothouse_build_info",
                "A metric with a constant '1' value labeled by Pilothouse's own version and git commit",
                own,
            );
        }
        Arc::new(m)
    }

    pub fn troubles(&self) -> &Troubles {
        &self.troubles
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
        let reg = crate::lock(&self.registry);
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

    /// `pilothouse_stale_cache_skips_total{controller,resource}` (ST-44, ES-15, MR-7): syncs held
    /// back because a cache had not caught up with this replica's own writes. One family for
    /// every controller, registered on first use.
    pub fn stale_skip(&self, controller: &str, resource: &str) {
        self.stale_skips()
            .get_or_create(&StaleSkipLabels {
                controller: controller.to_string(),
                resource: resource.to_string(),
            })
            .inc();
    }

    /// The family behind [`Self::stale_skip`], for the workers that count into it.
    pub fn stale_skips(&self) -> Family<StaleSkipLabels, Counter> {
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
            .clone()
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

    /// component-base's `running_managed_controllers{name,manager}`: 1 while a controller runs
    /// in this process (it leads), 0 after it stopped. `manager` is `pilothouse`.
    pub fn set_controller_running(&self, name: &str, running: bool) {
        self.running_controllers
            .get_or_init(|| {
                let f = Family::default();
                self.register(
                    "running_managed_controllers",
                    "Indicates where instances of a controller are currently running",
                    f.clone(),
                );
                f
            })
            .get_or_create(&ManagedControllerLabels {
                name: name.to_string(),
                manager: "pilothouse".to_string(),
            })
            .set(i64::from(running));
    }

    pub fn rest_client(&self) -> Arc<RestClientMetrics> {
        self.rest_client
            .get_or_init(|| {
                let m = RestClientMetrics {
                    requests: Family::default(),
                    rate_limiter_wait: Family::new_with_constructor(latency_histogram),
                    request_duration: Family::new_with_constructor(request_duration_histogram),
                    retries: Family::default(),
                };
                self.register(
                    "rest_client_request_retries",
                    "Number of request retries, partitioned by status code, verb, and host",
                    m.retries.clone(),
                );
                self.register(
                    "rest_client_request_duration_seconds",
                    "Request latency in seconds. Broken down by verb, and host",
                    m.request_duration.clone(),
                );
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

/// The Kubernetes minor whose kube-controller-manager Pilothouse stands in for (the
/// k8s-openapi feature, and `KUBERNETES_VERSION` in `tests/cluster/versions.env`; a test keeps
/// them equal).
pub const KUBERNETES_MAJOR: &str = "1";
pub const KUBERNETES_MINOR: &str = "37";

/// `kubernetes_build_info`, as every Kubernetes component exports it. Its version is that of
/// the kube-controller-manager Pilothouse stands in for, with Pilothouse's own as build
/// metadata (`v1.37.0+pilothouse.0.1.0`, as k3s reports `v1.30.2+k3s1`). Dashboards then list a
/// 1.37 component, and kubernetes-mixin's `KubeVersionMismatch`, which compares major.minor
/// across components, stays quiet. Pilothouse's own version is `pilothouse_build_info`.
/// `compiler` is `rustc`, `go_version` empty, and `git_commit` comes from
/// `PILOTHOUSE_GIT_COMMIT` at build time when it is set (the image build).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct BuildInfoLabels {
    major: String,
    minor: String,
    git_version: String,
    git_commit: String,
    git_tree_state: String,
    build_date: String,
    go_version: String,
    compiler: String,
    platform: String,
}

impl BuildInfoLabels {
    fn current() -> Self {
        BuildInfoLabels {
            major: KUBERNETES_MAJOR.into(),
            minor: KUBERNETES_MINOR.into(),
            git_version: format!(
                "v{KUBERNETES_MAJOR}.{KUBERNETES_MINOR}.0+pilothouse.{}",
                env!("CARGO_PKG_VERSION")
            ),
            git_commit: option_env!("PILOTHOUSE_GIT_COMMIT").unwrap_or("").into(),
            git_tree_state: String::new(),
            build_date: String::new(),
            go_version: String::new(),
            compiler: "rustc".into(),
            platform: format!("{}/{}", std::env::consts::OS, go_arch()),
        }
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct PilothouseBuildLabels {
    version: String,
    git_commit: String,
}

/// Go's GOARCH spelling, which `platform` uses.
fn go_arch() -> &'static str {
    match std::env::consts::ARCH {
        "x86_64" => "amd64",
        "aarch64" => "arm64",
        other => other,
    }
}

/// The `process_*` metrics of Prometheus' client libraries (read from /proc at each scrape):
/// CPU seconds, resident and virtual memory, open and maximum file descriptors, start time.
#[derive(Debug)]
struct ProcessCollector;

impl prometheus_client::collector::Collector for ProcessCollector {
    fn encode(
        &self,
        mut encoder: prometheus_client::encoding::DescriptorEncoder,
    ) -> Result<(), std::fmt::Error> {
        use prometheus_client::encoding::EncodeMetric;
        use prometheus_client::metrics::counter::ConstCounter;
        use prometheus_client::metrics::gauge::ConstGauge;
        // An unreadable /proc (not Linux, or hidden) leaves the families out, as client_golang does.
        let Ok(me) = procfs::process::Process::myself() else {
            return Ok(());
        };
        let Ok(stat) = me.stat() else {
            return Ok(());
        };
        let ticks = procfs::ticks_per_second() as f64;
        let page = procfs::page_size() as f64;
        let cpu = ConstCounter::new((stat.utime + stat.stime) as f64 / ticks);
        cpu.encode(encoder.encode_descriptor(
            "process_cpu_seconds",
            "Total user and system CPU time spent in seconds",
            None,
            cpu.metric_type(),
        )?)?;
        let gauges = [
            (
                "process_resident_memory_bytes",
                "Resident memory size in bytes",
                Some(stat.rss as f64 * page),
            ),
            (
                "process_virtual_memory_bytes",
                "Virtual memory size in bytes",
                Some(stat.vsize as f64),
            ),
            (
                "process_start_time_seconds",
                "Start time of the process since unix epoch in seconds",
                procfs::boot_time_secs()
                    .ok()
                    .map(|boot| boot as f64 + stat.starttime as f64 / ticks),
            ),
            (
                "process_open_fds",
                "Number of open file descriptors",
                me.fd_count().ok().map(|n| n as f64),
            ),
            (
                "process_max_fds",
                "Maximum number of open file descriptors",
                me.limits()
                    .ok()
                    .and_then(|l| match l.max_open_files.soft_limit {
                        procfs::process::LimitValue::Value(v) => Some(v as f64),
                        procfs::process::LimitValue::Unlimited => None,
                    }),
            ),
        ];
        for (name, help, value) in gauges {
            if let Some(v) = value {
                let g = ConstGauge::new(v);
                g.encode(encoder.encode_descriptor(name, help, None, g.metric_type())?)?;
            }
        }
        Ok(())
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

    #[test]
    fn unsuffixed_counters_keep_kcm_names() {
        #[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
        struct Op {
            operation: String,
        }
        let m = Metrics::new();
        let f = Family::<Op, UnsuffixedCounter>::default();
        m.register("x_changes", "changes", f.clone());
        let op = Op {
            operation: "create".into(),
        };
        f.get_or_create(&op).inc();
        f.get_or_create(&op).inc();
        let text = m.encode();
        assert!(text.contains("# TYPE x_changes unknown"), "{text}");
        assert!(text.contains("x_changes{operation=\"create\"} 2"), "{text}");
        assert!(!text.contains("x_changes_total"), "{text}");
    }

    fn sample(text: &str, name: &str) -> f64 {
        text.lines()
            .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.parse().ok())
            .unwrap_or_else(|| panic!("no sample {name} in\n{text}"))
    }

    #[test]
    fn process_and_build_info_are_exported() {
        let text = Metrics::new().encode();
        assert!(
            sample(&text, "process_resident_memory_bytes") > 1e6,
            "{text}"
        );
        assert!(
            sample(&text, "process_virtual_memory_bytes")
                >= sample(&text, "process_resident_memory_bytes")
        );
        assert!(sample(&text, "process_open_fds") >= 3.0);
        assert!(sample(&text, "process_cpu_seconds_total") >= 0.0);
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs_f64();
        let started = sample(&text, "process_start_time_seconds");
        assert!(
            started <= now + 1.0 && started > now - 3600.0,
            "{started} vs {now}"
        );
        assert!(
            text.contains(&format!(
                "kubernetes_build_info{{major=\"1\",minor=\"37\",git_version=\"v1.37.0+pilothouse.{}\"",
                env!("CARGO_PKG_VERSION")
            )),
            "{text}"
        );
        assert!(
            text.contains(&format!(
                "pilothouse_build_info{{version=\"{}\"",
                env!("CARGO_PKG_VERSION")
            )),
            "{text}"
        );
        // The minor is the pinned control plane's.
        let pinned = std::fs::read_to_string(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../tests/cluster/versions.env"
        ))
        .unwrap();
        assert!(
            pinned.lines().any(|l| l.starts_with(&format!(
                "KUBERNETES_VERSION=v{KUBERNETES_MAJOR}.{KUBERNETES_MINOR}."
            ))),
            "tests/cluster/versions.env pins another minor"
        );
        assert!(text.contains("compiler=\"rustc\""), "{text}");
    }
}
