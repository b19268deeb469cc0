//! `cronjob-controller`: creates Jobs on cron schedules (CR-1..CR-32), as
//! kube-controller-manager does, with JB-7, JB-8, JB-11 and the DST policy JB-12.
//!
//! Wiring only: one queue (`cronjob`, keyed `namespace/name`) fed by CronJob changes and by the
//! changes of the Jobs they control. [`sync`] is one CronJob's sync, [`plan`] its pure
//! decisions, [`status`] the status they lead to, [`act`] its API requests.

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
pub mod metrics;
pub mod plan;
pub mod schedule;
pub mod status;
pub mod sync;
#[cfg(test)]
mod sync_tests;
pub mod zone;

pub use schedule::{format_schedule, parse_for};
pub use zone::Zones;

use k8s_openapi::api::batch::v1::{CronJob, Job};
use schedule::DstPolicy;
use shared::api::apierr::{Classify, ErrorKind};
use shared::api::ratelimit::BackoffConfig;
use shared::cache::informers::{INDEX_CONTROLLER_UID, by_controller_uid};
use shared::meta::keys::object_key;
use shared::runtime::controller::{Controller, Declaration, InitError, Registration, Setup};
use std::sync::Arc;
use std::time::Duration;

pub const DECLARATION: Declaration = Declaration {
    name: "cronjob-controller",
    aliases: &["cronjob"],
    event_source: "cronjob-controller",
    on_by_default: true,
};
pub const NAME: &str = DECLARATION.name;
/// CR-1: upstream's queue name (label `name` of `workqueue_*`).
pub const QUEUE: &str = "cronjob";

#[derive(clap::Args, Clone, Debug)]
pub struct CronJobOptions {
    /// The number of cron job objects that are allowed to sync concurrently. Larger number = more responsive jobs, but more CPU (and network) load.
    #[arg(long, default_value_t = 5)]
    pub concurrent_cron_job_syncs: usize,
    /// How daylight-saving changes treat schedule times. `cron`: a fixed-time schedule (minute and hour fields not starting with `*` or `?`) runs once for a time skipped by a spring-forward change (at the first instant after it) and once for a time repeated by a fall-back change; other schedules follow elapsed time. `upstream`: exactly as kube-controller-manager (skipped times do not run, repeated times run twice).
    #[arg(long, value_enum, default_value_t = DstPolicy::Cron)]
    pub cronjob_dst_policy: DstPolicy,
    /// The zone of CronJobs without spec.timeZone. Empty: this process's local zone ($TZ, else /etc/localtime, else UTC), as kube-controller-manager; it must be the zone kube-controller-manager used. `UTC` forces UTC.
    #[arg(long, default_value = "")]
    pub cronjob_default_time_zone: String,
}

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(transparent)]
    Api(#[from] shared::api::apierr::Failed),
    /// CR-27 Replace: an active Job could not be deleted.
    #[error("could not replace job {job}")]
    Replace {
        job: String,
        #[source]
        source: kube::Error,
    },
}

impl Classify for Error {
    fn kind(&self) -> ErrorKind {
        match self {
            Error::Api(e) => e.kind(),
            Error::Replace { source, .. } => source.kind(),
        }
    }
}

/// An API error with what the sync was doing (`shared::api::apierr::doing` for this crate's error).
pub(crate) fn api(what: impl Into<String>) -> impl FnOnce(kube::Error) -> Error {
    shared::api::apierr::doing(what)
}

pub fn registration(opts: CronJobOptions) -> Registration {
    Registration::built(DECLARATION, Box::new(move |setup| init(opts, setup)))
}

/// Wires the controller to the shared caches and the runtime.
pub fn init(opts: CronJobOptions, setup: Setup) -> Result<Box<dyn Controller>, InitError> {
    let zones = Zones::from_flag(&opts.cronjob_default_time_zone)
        .map_err(|e| InitError::Invalid(format!("--cronjob-default-time-zone: {e}")))?;
    let cronjobs = setup.informers.get::<CronJob>();
    let jobs = setup.informers.get::<Job>();
    jobs.add_index(INDEX_CONTROLLER_UID, by_controller_uid);
    let mut wiring = setup.wiring();
    // CR-1: the default controller rate limiter (5 ms doubling to 1000 s per item).
    let queue = wiring.queue(
        QUEUE,
        BackoffConfig::exponential(Duration::from_millis(5), Duration::from_secs(1000)),
    );
    let ctl = Arc::new(sync::CronJobController::new(
        Arc::clone(&cronjobs),
        Arc::clone(&jobs),
        Arc::clone(&queue),
        (zones, opts.cronjob_dst_policy),
        setup.ctx(metrics::Metrics::register(&setup.metrics)),
    ));
    // CR-3.
    let c = Arc::downgrade(&ctl);
    wiring.on_change(&cronjobs, move |change| {
        if let Some(c) = c.upgrade() {
            c.cronjob_changed(change);
        }
    });
    let c = Arc::downgrade(&ctl);
    wiring.on_change(&jobs, move |change| {
        if let Some(c) = c.upgrade() {
            c.job_changed(change);
        }
    });
    // On taking over, every CronJob is synced.
    let c = Arc::clone(&ctl);
    wiring.on_start(move || {
        for cj in c.cronjobs.list() {
            c.queue.add(object_key(cj.as_ref()));
        }
    });
    let workers = opts.concurrent_cron_job_syncs.max(1);
    wiring.workers(&queue, workers, move |key: String| {
        let ctl = Arc::clone(&ctl);
        async move { ctl.sync(&key).await }
    });
    Ok(wiring.build())
}
