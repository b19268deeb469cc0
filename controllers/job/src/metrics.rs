//! Upstream's `job_controller_*` metrics, with upstream's names, types and labels (JR-8, JR-31,
//! JR-36, JR-37, JR-46, JR-51 and JB-6 say what several of them count), and Pilothouse's own
//! `pilothouse_job_*` (JB-2, JB-4).

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};

macro_rules! labels {
    ($name:ident { $($field:ident),* }) => {
        #[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
        pub struct $name { $(pub $field: String),* }
    };
}

labels!(SyncLabels {
    completion_mode,
    result,
    action
});
labels!(FinishedLabels {
    completion_mode,
    result,
    reason
});
labels!(PodsFinishedLabels {
    completion_mode,
    result
});
labels!(ActionLabel { action });
labels!(EventLabel { event });
labels!(CreationLabels { reason, status });
labels!(ControllerNameLabel { controller_name });
labels!(ReasonLabel { reason });

/// Upstream's label is camelCase (`backoffLimit`); the derive takes the field's name as is.
#[allow(non_snake_case)]
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct IndexesLabels {
    pub status: String,
    pub backoffLimit: String,
}

fn sync_histogram() -> Histogram {
    Histogram::new(exponential_buckets(0.004, 2.0, 15))
}

pub struct Metrics {
    pub sync_duration: Family<SyncLabels, Histogram, fn() -> Histogram>,
    pub syncs: Family<SyncLabels, Counter>,
    pub jobs_finished: Family<FinishedLabels, Counter>,
    pub pods_finished: Family<PodsFinishedLabels, Counter>,
    pub policy_actions: Family<ActionLabel, Counter>,
    pub terminated_with_finalizer: Family<EventLabel, Counter>,
    pub finished_indexes: Family<IndexesLabels, Counter>,
    pub pods_creation: Family<CreationLabels, Counter>,
    pub external: Family<ControllerNameLabel, Counter>,
    /// JR-8: fed by the runtime from each `Next::Stale` (`Wiring::count_stale_skips_in`).
    pub stale_skips: Family<shared::metrics::GroupResourceLabels, Counter>,
    pub finalizer_removal_failures: Family<ReasonLabel, Counter>,
    pub status_writes_refused: Counter,
}

impl Metrics {
    pub fn register(r: &shared::metrics::Metrics) -> Metrics {
        let m = Metrics {
            sync_duration: Family::new_with_constructor(sync_histogram),
            syncs: Family::default(),
            jobs_finished: Family::default(),
            pods_finished: Family::default(),
            policy_actions: Family::default(),
            terminated_with_finalizer: Family::default(),
            finished_indexes: Family::default(),
            pods_creation: Family::default(),
            external: Family::default(),
            stale_skips: Family::default(),
            finalizer_removal_failures: Family::default(),
            status_writes_refused: Counter::default(),
        };
        r.register(
            "job_controller_job_sync_duration_seconds",
            "The time it took to sync a job",
            m.sync_duration.clone(),
        );
        r.register(
            "job_controller_job_syncs",
            "The number of job syncs",
            m.syncs.clone(),
        );
        r.register(
            "job_controller_jobs_finished",
            "The number of finished jobs",
            m.jobs_finished.clone(),
        );
        r.register(
            "job_controller_job_pods_finished",
            "The number of finished Pods that are fully tracked",
            m.pods_finished.clone(),
        );
        r.register(
            "job_controller_pod_failures_handled_by_failure_policy",
            "The number of failed Pods handled by failure policy with respect to the failure policy action applied based on the matched rule",
            m.policy_actions.clone(),
        );
        r.register(
            "job_controller_terminated_pods_tracking_finalizer",
            "The number of terminated pods (phase=Failed|Succeeded) that have the finalizer batch.kubernetes.io/job-tracking",
            m.terminated_with_finalizer.clone(),
        );
        r.register(
            "job_controller_job_finished_indexes",
            "The number of finished indexes",
            m.finished_indexes.clone(),
        );
        r.register(
            "job_controller_job_pods_creation",
            "The number of Pods created by the Job controller labelled with a reason for the Pod creation",
            m.pods_creation.clone(),
        );
        r.register(
            "job_controller_jobs_by_external_controller",
            "The number of Jobs managed by an external controller",
            m.external.clone(),
        );
        r.register(
            "job_controller_stale_sync_skips",
            "The number of syncs skipped because the cache has not yet observed the controller's own writes",
            m.stale_skips.clone(),
        );
        r.register(
            "pilothouse_job_tracking_finalizer_removal_failures",
            "Failed removals of batch.kubernetes.io/job-tracking from pods, by reason (HTTP code or transport); each is retried",
            m.finalizer_removal_failures.clone(),
        );
        r.register(
            "pilothouse_job_status_writes_refused",
            "Job status writes not sent because they would fail the API server's validation (a controller bug)",
            m.status_writes_refused.clone(),
        );
        m
    }
}
