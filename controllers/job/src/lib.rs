//! `job-controller`: runs pods for Jobs and tracks them with the `batch.kubernetes.io/job-tracking`
//! finalizer (JR-1..JR-65), as kube-controller-manager does, with Pilothouse's fixes over
//! upstream (JB-1..JB-6, JB-9, JB-10).
//!
//! Wiring only. Two queues as upstream: `job` (keyed `namespace/name`) and `job_orphan_pod` (a
//! pod, or all pods of a Job UID, whose finalizer may have to go). `handlers` map cache changes to
//! keys, [`sync`] is one Job's (or orphan's) sync, [`plan`] its pure decisions, [`act`] and
//! `manage` its API requests, `tracking` the finalizer protocol's writes, [`validation`] the
//! check of every status write (JB-2).

// Time arithmetic must not panic (PX-2; clippy::arithmetic_side_effects is denied in the
// workspace lints). Tests may use plain operators on the instants they build, and a table
// test may be longer than a function should be.
#![cfg_attr(
    test,
    allow(
        clippy::arithmetic_side_effects,
        clippy::unchecked_time_subtraction,
        clippy::too_many_lines
    )
)]

pub mod act;
mod claim;
mod handlers;
pub mod indexes;
mod manage;
pub mod metrics;
pub mod plan;
pub mod pods;
pub mod policy;
pub mod sync;
#[cfg(test)]
mod sync_tests;
mod tracking;
pub mod validation;

use k8s_openapi::api::batch::v1::Job;
use shared::api::apierr::{Classify, ErrorKind};
use shared::api::ratelimit::BackoffConfig;
use shared::cache::informers::{
    INDEX_CONTROLLER_UID, INDEX_NAMESPACE, INDEX_ORPHAN_NAMESPACE, by_controller_uid, by_namespace,
    orphan_by_namespace,
};
use shared::cache::pod::Pod;
use shared::cache::projection::PodFields;
use shared::runtime::controller::{Controller, Declaration, InitError, Registration, Setup};
use std::sync::Arc;
use std::time::Duration;

pub const DECLARATION: Declaration = Declaration {
    name: "job-controller",
    aliases: &["job"],
    event_source: "job-controller",
    on_by_default: true,
};
pub const NAME: &str = DECLARATION.name;
/// JR-1: upstream's queue names (label `name` of `workqueue_*`).
pub const QUEUE: &str = "job";
pub const ORPHAN_QUEUE: &str = "job_orphan_pod";
/// The reserved `spec.managedBy` value of this controller.
pub const MANAGED_BY: &str = "kubernetes.io/job-controller";
/// JB-4: how often pods carrying our finalizer are checked for a Job that is gone or finished.
const SWEEP_PERIOD: Duration = Duration::from_secs(60);

#[derive(clap::Args, Clone, Debug)]
pub struct JobOptions {
    /// The number of job objects that are allowed to sync concurrently. Larger number = more responsive jobs, but more CPU (and network) load.
    #[arg(long, default_value_t = 5)]
    pub concurrent_job_syncs: usize,
}

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(transparent)]
    Api(#[from] shared::api::apierr::Failed),
    #[error("status write for {key} refused locally, it would be invalid: {violations}")]
    InvalidStatus { key: String, violations: String },
    #[error("claiming pods: {0}")]
    Claim(String),
}

impl Classify for Error {
    fn kind(&self) -> ErrorKind {
        match self {
            Error::Api(e) => e.kind(),
            Error::InvalidStatus { .. } | Error::Claim(_) => ErrorKind::Other,
        }
    }
}

/// An API error with what the sync was doing (`shared::api::apierr::doing` for this crate's error).
pub(crate) fn api(what: impl Into<String>) -> impl FnOnce(kube::Error) -> Error {
    shared::api::apierr::doing(what)
}

/// Orphan-queue keys (upstream `orphanPodKey`): one pod, or every pod a Job UID controls.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum OrphanKey {
    Pod(String),
    Owner(String),
}

pub fn registration(opts: JobOptions) -> Registration {
    Registration::built(DECLARATION, Box::new(move |setup| init(opts, setup)))
}

/// Wires the controller to the shared caches and the runtime.
pub fn init(opts: JobOptions, setup: Setup) -> Result<Box<dyn Controller>, InitError> {
    // Of a pod: container statuses (exit codes for podFailurePolicy, finish times for backoff,
    // restart counts); sidecars are known by the always-kept init container restartPolicy.
    setup
        .informers
        .read_pod_fields(PodFields::CONTAINER_STATUSES);
    let jobs = setup.informers.get::<Job>();
    jobs.add_index(INDEX_NAMESPACE, by_namespace);
    let pods = setup.informers.get::<Pod>();
    pods.add_index(INDEX_CONTROLLER_UID, by_controller_uid);
    pods.add_index(INDEX_ORPHAN_NAMESPACE, orphan_by_namespace);
    pods.add_index(handlers::INDEX_TRACKING, handlers::tracking);
    let mut wiring = setup.wiring();
    // JR-1: 1 s doubling to 60 s per item.
    let backoff = BackoffConfig::exponential(Duration::from_secs(1), Duration::from_secs(60));
    let queue = wiring.queue(QUEUE, backoff.clone());
    let orphans = wiring.queue(ORPHAN_QUEUE, backoff);
    let ctl = Arc::new(sync::JobController::new(
        jobs,
        pods,
        Arc::clone(&queue),
        Arc::clone(&orphans),
        setup.ctx(metrics::Metrics::register(&setup.metrics)),
    ));
    // JR-8: upstream's counter, fed by the runtime next to pilothouse_stale_cache_skips.
    wiring.count_stale_skips_in(ctl.metrics.stale_skips.clone());
    // JR-31, JR-46: these metrics count on every replica, leading or not, as upstream's handlers.
    let c = Arc::downgrade(&ctl);
    wiring.on_change_every_replica(&ctl.jobs, move |change| {
        if let Some(c) = c.upgrade() {
            c.count_job(change);
        }
    });
    let c = Arc::downgrade(&ctl);
    wiring.on_change_every_replica(&ctl.pods, move |change| {
        if let Some(c) = c.upgrade() {
            c.count_pod(change);
        }
    });
    let c = Arc::downgrade(&ctl);
    wiring.on_change(&ctl.jobs, move |change| {
        if let Some(c) = c.upgrade() {
            c.job_changed(change);
        }
    });
    let c = Arc::downgrade(&ctl);
    wiring.on_change(&ctl.pods, move |change| {
        if let Some(c) = c.upgrade() {
            c.pod_changed(change);
        }
    });
    // On taking over: every Job is synced and the orphan sweep runs at once.
    let c = Arc::clone(&ctl);
    wiring.on_start(move || {
        for job in c.jobs.list() {
            c.queue.add(shared::meta::keys::object_key(job.as_ref()));
        }
        c.sweep();
    });
    let c = Arc::clone(&ctl);
    wiring.every(SWEEP_PERIOD, move || {
        c.sweep();
        std::future::ready(())
    });
    let workers = opts.concurrent_job_syncs.max(1);
    let c = Arc::clone(&ctl);
    wiring.workers(&queue, workers, move |key: String| {
        let c = Arc::clone(&c);
        async move { c.sync_job(&key).await }
    });
    wiring.workers(&orphans, workers, move |key: OrphanKey| {
        let c = Arc::clone(&ctl);
        async move { c.sync_orphan(&key).await }
    });
    Ok(wiring.build())
}
