//! `cronjob-controller`: creates Jobs on cron schedules (spec §3, CR-1..CR-32), as
//! kube-controller-manager does, with B-7, B-8, B-11 and the DST policy B-12.
//!
//! One queue (`cronjob`, keyed `namespace/name`). A sync observes the CronJob and the Jobs it
//! controls (by controller UID, B-7) from the shared caches, cleans up history, keeps `active`
//! true, asks [`plan`] whether a time is due, acts, and writes status once. The next sync is
//! queued for the next schedule time.

pub mod cli;
pub mod metrics;
pub mod plan;
pub mod schedule;
pub mod zone;

use futures::FutureExt;
use futures::future::BoxFuture;
use jiff::Timestamp;
use k8s_openapi::api::batch::v1::{CronJob, CronJobStatus, Job};
use k8s_openapi::api::core::v1::ObjectReference;
use kube::api::{DeleteParams, PostParams, PropagationPolicy};
use kube::{Api, Client};
use plan::{Decision, Event};
use schedule::{DstPolicy, Schedule, ZoneSource};
use shared::apierr::{is_already_exists, is_namespace_terminating, is_not_found, message};
use shared::controller::{Controller, InitError, Setup};
use shared::events::EventRecorder;
use shared::informers::{
    Change, INDEX_CONTROLLER_UID, Informer, by_controller_uid, object_key, split_key,
};
use shared::queue::{Next, Queue, run_workers};
use shared::ratelimit::BackoffConfig;
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio_util::sync::CancellationToken;
use zone::Zone;

pub const NAME: &str = "cronjob-controller";
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
    #[error("{what}: {source}")]
    Api {
        what: String,
        #[source]
        source: kube::Error,
    },
    #[error("could not replace job {0}")]
    Replace(String),
}

fn api(what: impl Into<String>) -> impl FnOnce(kube::Error) -> Error {
    let what = what.into();
    move |source| Error::Api { what, source }
}

/// The zones a controller resolves: the bundled database, and its default zone as `Local`.
#[derive(Clone, Debug)]
pub struct Zones {
    pub local: Zone,
}

impl Zones {
    /// From `--cronjob-default-time-zone`.
    pub fn from_flag(name: &str) -> Result<Zones, String> {
        let local = if name.is_empty() {
            Zone::process_local()
        } else {
            Zone::load(name, &Zone::utc())?
        };
        Ok(Zones { local })
    }
}

impl ZoneSource for Zones {
    fn load(&self, name: &str) -> Result<Zone, String> {
        Zone::load(name, &self.local)
    }
    fn local(&self) -> Zone {
        self.local.clone()
    }
}

/// The text upstream hands the parser (`formatSchedule`): a schedule mentioning `TZ` as it is,
/// otherwise prefixed with `TZ=<spec.timeZone> ` when the zone loads.
pub fn format_schedule(cj: &CronJob, zones: &Zones) -> (String, bool) {
    let schedule = cj.spec.schedule.clone();
    if schedule.contains("TZ") {
        return (schedule, true);
    }
    match cj.spec.time_zone.as_deref() {
        Some(tz) if zones.load(tz).is_ok() => (format!("TZ={tz} {schedule}"), false),
        _ => (schedule, false),
    }
}

/// What `pilothouse schedule` and the controller both run: parse as the controller would for a
/// CronJob with this schedule and `spec.timeZone`.
pub fn parse_for(
    schedule: &str,
    time_zone: Option<&str>,
    zones: &Zones,
) -> Result<Schedule, String> {
    let cj = CronJob {
        spec: k8s_openapi::api::batch::v1::CronJobSpec {
            schedule: schedule.to_string(),
            time_zone: time_zone.map(str::to_string),
            ..Default::default()
        },
        ..Default::default()
    };
    if let Some(tz) = time_zone {
        zones
            .load(tz)
            .map_err(|e| format!("invalid timeZone: {}: {e}", shared::gocompat::strconv_quote(tz)))?;
    }
    let (text, _) = format_schedule(&cj, zones);
    schedule::parse(&text, zones)
}

pub struct CronJobController {
    inner: Arc<Inner>,
}

struct Inner {
    cronjobs: Arc<Informer<CronJob>>,
    jobs: Arc<Informer<Job>>,
    queue: Arc<Queue<String>>,
    client: Client,
    events: EventRecorder,
    workers: usize,
    policy: DstPolicy,
    zones: Zones,
    metrics: metrics::Metrics,
    /// B-11: CronJob UID → the slot a MissSchedule was last reported for.
    warned: Mutex<HashMap<String, Timestamp>>,
    /// Our last status write per key: (the resourceVersion it replaced, the object it returned).
    /// While the cache still holds the replaced version, the next sync starts from the returned
    /// one instead of sending a write bound to conflict.
    written: Mutex<HashMap<String, (String, Arc<CronJob>)>>,
    /// UIDs of Jobs we deleted that the cache may still hold: history cleanup skips them
    /// instead of deleting them again (a NotFound and a FailedDelete event each time).
    deleting: Mutex<HashMap<String, std::time::Instant>>,
    active: AtomicBool,
}

/// Wires the controller to the shared caches.
pub fn init(opts: CronJobOptions) -> impl FnOnce(Setup) -> Result<Box<dyn Controller>, InitError> {
    move |setup: Setup| {
        let zones = Zones::from_flag(&opts.cronjob_default_time_zone)
            .map_err(|e| InitError::Invalid(format!("--cronjob-default-time-zone: {e}")))?;
        let cronjobs = setup.informers.get::<CronJob>();
        let jobs = setup.informers.get::<Job>();
        jobs.add_index(INDEX_CONTROLLER_UID, by_controller_uid);
        // CR-1: the default controller rate limiter (5 ms doubling to 1000 s per item).
        let backoff =
            BackoffConfig::exponential(Duration::from_millis(5), Duration::from_secs(1000));
        let inner = Arc::new(Inner {
            cronjobs: Arc::clone(&cronjobs),
            jobs: Arc::clone(&jobs),
            queue: Queue::new(QUEUE, backoff, &setup.metrics),
            client: setup.client,
            events: setup.events,
            workers: opts.concurrent_cron_job_syncs.max(1),
            policy: opts.cronjob_dst_policy,
            zones,
            metrics: metrics::Metrics::register(&setup.metrics),
            warned: Mutex::new(HashMap::new()),
            written: Mutex::new(HashMap::new()),
            deleting: Mutex::new(HashMap::new()),
            active: AtomicBool::new(false),
        });
        let weak = Arc::downgrade(&inner);
        cronjobs.on_change(move |change| {
            if let Some(inner) = weak.upgrade() {
                inner.on_cronjob(change);
            }
        });
        let weak = Arc::downgrade(&inner);
        jobs.on_change(move |change| {
            if let Some(inner) = weak.upgrade() {
                inner.on_job(change);
            }
        });
        Ok(Box::new(CronJobController { inner }) as Box<dyn Controller>)
    }
}

impl Controller for CronJobController {
    fn run(self: Box<Self>, stop: CancellationToken) -> BoxFuture<'static, ()> {
        let inner = self.inner;
        async move {
            inner.active.store(true, Ordering::Release);
            for cj in inner.cronjobs.list() {
                inner.queue.add(object_key(cj.as_ref()));
            }
            let queue = Arc::clone(&inner.queue);
            tokio::spawn(async move {
                stop.cancelled().await;
                queue.shut_down();
            });
            let a = Arc::clone(&inner);
            run_workers(
                Arc::clone(&inner.queue),
                inner.workers,
                move |key: String| {
                    let inner = Arc::clone(&a);
                    async move { inner.sync(&key).await }
                },
            )
            .await;
        }
        .boxed()
    }
}

fn cronjob_ref(cj: &CronJob) -> ObjectReference {
    ObjectReference {
        api_version: Some("batch/v1".into()),
        kind: Some("CronJob".into()),
        name: cj.metadata.name.clone(),
        namespace: cj.metadata.namespace.clone(),
        uid: cj.metadata.uid.clone(),
        ..Default::default()
    }
}

fn uid(meta: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta) -> String {
    meta.uid.clone().unwrap_or_default()
}

fn listed(status: &CronJobStatus, job_uid: &str) -> bool {
    status
        .active
        .iter()
        .flatten()
        .any(|a| a.uid.as_deref() == Some(job_uid))
}

impl Inner {
    fn leading(&self) -> bool {
        self.active.load(Ordering::Acquire)
    }

    /// CR-3: the CronJob a Job's controller reference resolves to (kind, name and UID checked).
    fn owner_key(&self, job: &Job) -> Option<String> {
        let owner = job
            .metadata
            .owner_references
            .iter()
            .flatten()
            .find(|o| o.controller == Some(true))?;
        if owner.kind != "CronJob" {
            return None;
        }
        let key = format!(
            "{}/{}",
            job.metadata.namespace.as_deref().unwrap_or_default(),
            owner.name
        );
        let cj = self.cronjobs.get(&key)?;
        (cj.metadata.uid.as_deref() == Some(owner.uid.as_str())).then_some(key)
    }

    fn on_job(&self, change: &Change<Job>) {
        if let Change::Deleted(job) = change {
            self.deleting.lock().unwrap().remove(&uid(&job.metadata));
        }
        if !self.leading() {
            return;
        }
        if let Change::Updated { old, new } = change {
            if old.metadata.resource_version == new.metadata.resource_version {
                return;
            }
            let controller = |j: &Job| {
                j.metadata
                    .owner_references
                    .iter()
                    .flatten()
                    .find(|o| o.controller == Some(true))
                    .cloned()
            };
            if controller(old) != controller(new)
                && let Some(key) = self.owner_key(old)
            {
                self.queue.add(key);
            }
        }
        if let Some(key) = self.owner_key(change.object()) {
            self.queue.add(key);
        }
    }

    fn on_cronjob(&self, change: &Change<CronJob>) {
        if !self.leading() {
            return;
        }
        let Change::Updated { old, new } = change else {
            if let Change::Deleted(cj) = change {
                self.warned.lock().unwrap().remove(&uid(&cj.metadata));
                self.written
                    .lock()
                    .unwrap()
                    .remove(&object_key(cj.as_ref()));
            }
            self.queue.add(object_key(change.object().as_ref()));
            return;
        };
        let (o, n) = (&old.spec, &new.spec);
        let schedule_changed = o.schedule != n.schedule || o.time_zone != n.time_zone;
        let key = object_key(new.as_ref());
        if !schedule_changed {
            self.queue.add(key);
            return;
        }
        // CR-3: a new schedule is waited for from its own next time.
        let (text, _) = format_schedule(new, &self.zones);
        match schedule::parse(&text, &self.zones) {
            Ok(sched) => match plan::requeue_after(new, Timestamp::now(), &sched, self.policy) {
                Some(d) => self.queue.add_after(key, d),
                None => self.queue.add(key),
            },
            Err(_) => self.events.warning(
                &cronjob_ref(new),
                "UnParseableCronJobSchedule",
                "Sync",
                format!("unparseable schedule for cronjob: {}", n.schedule),
            ),
        }
    }

    fn emit(&self, cj: &CronJob, e: &Event) {
        let r = cronjob_ref(cj);
        if e.warning {
            self.events.warning(&r, e.reason, "Sync", e.note.clone());
        } else {
            self.events.normal(&r, e.reason, "Sync", e.note.clone());
        }
    }

    async fn sync(&self, key: &str) -> Result<Next, Error> {
        let Some(cached) = self.cronjobs.get(key) else {
            return Ok(Next::Done);
        };
        let cached = self.freshest(key, cached);
        let cj_uid = uid(&cached.metadata);
        let (ns, _) = split_key(key);
        // B-7: only Jobs whose controller reference is this CronJob (kind, group, UID).
        let owned: Vec<Arc<Job>> = self
            .jobs
            .by_index(INDEX_CONTROLLER_UID, &cj_uid)
            .into_iter()
            .filter(|j| j.metadata.namespace.as_deref() == Some(ns))
            .filter(|j| plan::controlled_by(j, &cj_uid))
            .collect();
        let jobs: Vec<&Job> = owned.iter().map(|j| j.as_ref()).collect();
        let mut cj: CronJob = (*cached).clone();
        let mut changed = false;

        // CR-32: history first, also while suspended or deleting.
        let mut deleted = Vec::new();
        let present: Vec<&Job> = {
            let mut deleting = self.deleting.lock().unwrap();
            // The cache normally reports the deletion within a second; five minutes bounds
            // the memory should a deletion never be observed.
            deleting.retain(|_, at| at.elapsed() < Duration::from_secs(300));
            jobs.iter()
                .copied()
                .filter(|j| !deleting.contains_key(&uid(&j.metadata)))
                .collect()
        };
        for job in plan::history_to_delete(&cj, &present) {
            if self.delete_job(&cj, job).await.is_ok() {
                deleted.push(uid(&job.metadata));
                changed = true;
            }
        }
        let status = cj.status.get_or_insert_with(Default::default);
        for d in &deleted {
            plan::remove_active(status, d);
        }

        // CR-29: an unfinished Job missing from `active` may be one a write we have not yet
        // observed listed; a live read decides.
        let unlisted = jobs
            .iter()
            .any(|j| plan::finished_condition(j).is_none() && !listed(status, &uid(&j.metadata)));
        if unlisted {
            let live = self
                .api_cronjobs(ns)
                .get(cached.metadata.name.as_deref().unwrap_or_default())
                .await
                .map_err(api(format!("reading cronjob {key}")))?;
            let live_status = live.status.clone().unwrap_or_default();
            if jobs.iter().any(|j| {
                plan::finished_condition(j).is_none()
                    && !listed(status, &uid(&j.metadata))
                    && listed(&live_status, &uid(&j.metadata))
            }) {
                cj = live;
                let status = cj.status.get_or_insert_with(Default::default);
                for d in &deleted {
                    plan::remove_active(status, d);
                }
            }
        }
        let up = plan::upkeep(
            cj.status.as_ref().unwrap_or(&CronJobStatus::default()),
            &jobs,
        );
        for e in &up.events {
            self.emit(&cj, e);
        }
        changed |= up.changed;
        cj.status = Some(up.status);
        let mut result = self.check_unseen(&mut cj, &up.unseen, &mut changed).await;

        let mut next = Next::Done;
        if result.is_ok() {
            match self.schedule(&mut cj, &cj_uid, &mut changed).await {
                Ok(n) => next = n,
                Err(e) => result = Err(e),
            }
        }
        if changed {
            self.write_status(&cj).await?;
        }
        match (result, next) {
            (_, Next::After(d)) => Ok(Next::After(d)),
            (Err(e), _) => Err(e),
            (Ok(()), n) => Ok(n),
        }
    }

    /// CR-29: `active` entries whose Job the cache does not hold are read live.
    async fn check_unseen(
        &self,
        cj: &mut CronJob,
        unseen: &[ObjectReference],
        changed: &mut bool,
    ) -> Result<(), Error> {
        for r in unseen {
            let ns = r.namespace.as_deref().unwrap_or_default();
            let name = r.name.as_deref().unwrap_or_default();
            match Api::<Job>::namespaced(self.client.clone(), ns)
                .get(name)
                .await
            {
                Ok(_) => {}
                Err(e) if is_not_found(&e) => {
                    self.emit(
                        cj,
                        &Event::normal("MissingJob", format!("Active job went missing: {name}")),
                    );
                    let status = cj.status.get_or_insert_with(Default::default);
                    plan::remove_active(status, r.uid.as_deref().unwrap_or_default());
                    *changed = true;
                }
                Err(e) => return Err(api(format!("reading job {ns}/{name}"))(e)),
            }
        }
        Ok(())
    }

    /// CR-10..CR-28: decide and start the due Job, if any.
    async fn schedule(
        &self,
        cj: &mut CronJob,
        cj_uid: &str,
        changed: &mut bool,
    ) -> Result<Next, Error> {
        if cj.metadata.deletion_timestamp.is_some() {
            return Ok(Next::Done);
        }
        let spec = cj.spec.clone();
        if let Some(tz) = spec.time_zone.as_deref()
            && let Err(e) = self.zones.load(tz)
        {
            // CR-12: e.g. a zone newer than our database; no Jobs until it loads.
            self.emit(
                cj,
                &Event::warning(
                    "UnknownTimeZone",
                    format!("invalid timeZone: {}: {e}", shared::gocompat::strconv_quote(tz)),
                ),
            );
            return Ok(Next::Done);
        }
        if spec.suspend == Some(true) {
            return Ok(Next::Done);
        }
        let (text, grandfathered) = format_schedule(cj, &self.zones);
        if grandfathered {
            self.emit(cj, &Event::warning("UnsupportedSchedule", format!(
                "CRON_TZ or TZ used in schedule {} is not officially supported, see https://kubernetes.io/docs/concepts/workloads/controllers/cron-jobs/ for more details",
                shared::gocompat::strconv_quote(&spec.schedule)
            )));
        }
        let sched = match schedule::parse(&text, &self.zones) {
            Ok(s) => s,
            Err(e) => {
                self.emit(
                    cj,
                    &Event::warning(
                        "UnparseableSchedule",
                        format!(
                            "unparseable schedule: {} : {e}",
                            shared::gocompat::strconv_quote(&spec.schedule)
                        ),
                    ),
                );
                return Ok(Next::Done);
            }
        };
        let now = Timestamp::now();
        let warned = self.warned.lock().unwrap().get(cj_uid).copied();
        let p = plan::plan(cj, now, &sched, self.policy, warned);
        for e in &p.events {
            self.emit(cj, e);
        }
        if let Some(slot) = p.missed_slot {
            self.warned.lock().unwrap().insert(cj_uid.to_string(), slot);
        }
        let (scheduled, replace) = match p.decision {
            Decision::Wait(None) => return Ok(Next::Done),
            Decision::Wait(Some(d)) => return Ok(Next::After(d)),
            Decision::Start { scheduled, replace } => (scheduled, replace),
        };
        if replace {
            self.replace_active(cj, changed).await?;
        }
        // The annotation is in spec.timeZone, or UTC when unset (never the local zone).
        let annotation_zone = match spec.time_zone.as_deref() {
            Some(tz) => self.zones.load(tz).unwrap_or_else(|_| Zone::utc()),
            None => Zone::utc(),
        };
        let want = plan::job_for(cj, scheduled, &annotation_zone);
        let ns = cj.metadata.namespace.clone().unwrap_or_default();
        let jobs = Api::<Job>::namespaced(self.client.clone(), &ns);
        let job = match jobs.create(&PostParams::default(), &want).await {
            Ok(created) => {
                if let Some(c) = &created.metadata.creation_timestamp {
                    let skew = c.0.duration_since(scheduled).as_secs_f64();
                    self.metrics.creation_skew.observe(skew);
                }
                self.emit(
                    cj,
                    &Event::normal(
                        "SuccessfulCreate",
                        format!(
                            "Created job {}",
                            created.metadata.name.as_deref().unwrap_or_default()
                        ),
                    ),
                );
                created
            }
            Err(e) if is_namespace_terminating(&e) => {
                return Err(api(format!("creating job for cronjob {ns}"))(e));
            }
            Err(e) if is_already_exists(&e) => {
                // B-8: in the CronJob's namespace; ours but unlisted (a lost status write) is
                // taken back into `active`.
                let name = want.metadata.name.clone().unwrap_or_default();
                let existing = jobs
                    .get(&name)
                    .await
                    .map_err(api(format!("reading job {ns}/{name}")))?;
                if !plan::controlled_by(&existing, cj_uid) {
                    return Ok(Next::Done);
                }
                if listed(
                    cj.status.as_ref().unwrap_or(&Default::default()),
                    &uid(&existing.metadata),
                ) {
                    return Ok(Next::Done);
                }
                tracing::info!(job = %name, "job already exists; taking it back into active");
                existing
            }
            Err(e) => {
                self.emit(
                    cj,
                    &Event::warning(
                        "FailedCreate",
                        format!("Error creating job: {}", message(&e)),
                    ),
                );
                return Err(api(format!("creating job in {ns}"))(e));
            }
        };
        let status = cj.status.get_or_insert_with(Default::default);
        status
            .active
            .get_or_insert_with(Vec::new)
            .push(plan::job_reference(&job));
        status.last_schedule_time = Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
            scheduled,
        ));
        *changed = true;
        Ok(match plan::requeue_after(cj, now, &sched, self.policy) {
            Some(d) => Next::After(d),
            None => Next::Done,
        })
    }

    /// CR-27 Replace: every active Job is read live and deleted before the new one starts.
    async fn replace_active(&self, cj: &mut CronJob, changed: &mut bool) -> Result<(), Error> {
        let active: Vec<ObjectReference> = cj
            .status
            .as_ref()
            .and_then(|s| s.active.clone())
            .unwrap_or_default();
        for r in active {
            let ns = r.namespace.as_deref().unwrap_or_default();
            let name = r.name.as_deref().unwrap_or_default();
            let job = match Api::<Job>::namespaced(self.client.clone(), ns)
                .get(name)
                .await
            {
                Ok(j) => j,
                Err(e) => {
                    self.emit(
                        cj,
                        &Event::warning("FailedGet", format!("Get job: {}", message(&e))),
                    );
                    return Err(api(format!("reading job {ns}/{name}"))(e));
                }
            };
            self.delete_job(cj, &job)
                .await
                .map_err(|_| Error::Replace(format!("{ns}/{name}")))?;
            let status = cj.status.get_or_insert_with(Default::default);
            plan::remove_active(status, &uid(&job.metadata));
            *changed = true;
        }
        Ok(())
    }

    /// Background deletion with its events (`deleteJob`).
    async fn delete_job(&self, cj: &CronJob, job: &Job) -> Result<(), ()> {
        let ns = job.metadata.namespace.as_deref().unwrap_or_default();
        let name = job.metadata.name.as_deref().unwrap_or_default();
        let dp = DeleteParams {
            propagation_policy: Some(PropagationPolicy::Background),
            ..Default::default()
        };
        let result = Api::<Job>::namespaced(self.client.clone(), ns)
            .delete(name, &dp)
            .await;
        if result.as_ref().is_ok() || result.as_ref().is_err_and(is_not_found) {
            self.deleting
                .lock()
                .unwrap()
                .insert(uid(&job.metadata), std::time::Instant::now());
        }
        match result {
            Ok(_) => {
                self.emit(
                    cj,
                    &Event::normal("SuccessfulDelete", format!("Deleted job {name}")),
                );
                Ok(())
            }
            Err(e) => {
                tracing::warn!(job = %name, error = %e, "deleting job");
                self.emit(
                    cj,
                    &Event::warning("FailedDelete", format!("Deleted job: {}", message(&e))),
                );
                Err(())
            }
        }
    }

    fn api_cronjobs(&self, ns: &str) -> Api<CronJob> {
        Api::namespaced(self.client.clone(), ns)
    }

    /// CR-2: one status write, a PUT of the status subresource carrying the resourceVersion the
    /// sync read (the role grants `update` only): a concurrent change fails it and the sync retries.
    async fn write_status(&self, cj: &CronJob) -> Result<(), Error> {
        let ns = cj.metadata.namespace.as_deref().unwrap_or_default();
        let name = cj.metadata.name.as_deref().unwrap_or_default();
        let written = self
            .api_cronjobs(ns)
            .replace_status(name, &PostParams::default(), cj)
            .await
            .map_err(api(format!("updating status of cronjob {ns}/{name}")))?;
        if let Some(rv) = cj.metadata.resource_version.clone() {
            self.written
                .lock()
                .unwrap()
                .insert(format!("{ns}/{name}"), (rv, Arc::new(written)));
        }
        Ok(())
    }

    /// The cached CronJob, or the one our last status write returned while the cache still
    /// holds the version that write replaced.
    fn freshest(&self, key: &str, cached: Arc<CronJob>) -> Arc<CronJob> {
        let mut written = self.written.lock().unwrap();
        match written.get(key) {
            Some((replaced, ours))
                if cached.metadata.resource_version.as_ref() == Some(replaced) =>
            {
                ours.clone()
            }
            Some(_) => {
                written.remove(key);
                cached
            }
            None => cached,
        }
    }
}
