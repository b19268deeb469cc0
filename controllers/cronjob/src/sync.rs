//! One sync of one CronJob (CR-2): observe it and the Jobs it controls (JB-7) in the caches,
//! clean up history (CR-32), keep `active` true (CR-29), ask [`plan`] whether a time is due
//! (CR-22..CR-28), act through [`act`], and write the status [`status`] computes, at most once.
//! The next sync is queued for the next schedule time (CR-31). Also the change handlers (CR-3)
//! and what the controller remembers of each CronJob.

use crate::metrics::Metrics;
use crate::plan::{self, Decision, Event};
use crate::schedule::{self, DstPolicy, Schedule, ZoneSource, format_schedule};
use crate::zone::{Zone, Zones};
use crate::{Error, act, api, status};
use jiff::Timestamp;
use k8s_openapi::api::batch::v1::{CronJob, CronJobStatus, Job};
use k8s_openapi::api::core::v1::ObjectReference;
use shared::api::apierr::{is_not_found, message};
use shared::api::writer::Writer;
use shared::cache::informers::{Change, INDEX_CONTROLLER_UID, Informer};
use shared::cache::written::Written;
use shared::meta::clock::Clock;
use shared::meta::gocompat::strconv_quote;
use shared::meta::keys::{object_key, split_key};
use shared::runtime::controller::Ctx;
use shared::runtime::events::EventRecorder;
use shared::runtime::queue::{Next, Queue};
use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;
use tokio::time::Instant;

/// How long history cleanup skips a Job we deleted while the cache may still hold it. The cache
/// normally reports the deletion within a second; this bounds the memory should a deletion never
/// be observed.
const DELETING_FOR: Duration = Duration::from_secs(300);

/// What the controller remembers of one CronJob, by UID (a recreated CronJob starts clean).
/// Our own status writes are remembered in [`CronJobs::own`], also by UID.
#[derive(Debug, Default)]
struct Memory {
    /// JB-11: the slot a `MissSchedule` was last reported for.
    missed_warned: Option<Timestamp>,
    /// Jobs we deleted (UID → when) that the cache may still hold: history cleanup skips them
    /// instead of deleting them again (a NotFound and a `FailedDelete` event each time).
    deleting: HashMap<String, Instant>,
}

impl Memory {
    fn is_empty(&self) -> bool {
        self.missed_warned.is_none() && self.deleting.is_empty()
    }
}

pub struct CronJobController {
    pub cronjobs: Arc<Informer<CronJob>>,
    pub jobs: Arc<Informer<Job>>,
    pub queue: Arc<Queue<String>>,
    writer: Writer,
    events: EventRecorder,
    clock: Arc<dyn Clock>,
    metrics: Metrics,
    policy: DstPolicy,
    zones: Zones,
    /// Per-CronJob memory by CronJob UID.
    memory: Mutex<HashMap<String, Memory>>,
    /// By CronJob UID: while the cache still holds the version our last status write
    /// replaced, a sync starts from the object that write returned instead of sending a write
    /// bound to conflict.
    written: Written,
}

fn uid(meta: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta) -> String {
    meta.uid.clone().unwrap_or_default()
}

/// The subject of the CronJob's events, as upstream's recorder builds it (`ref.GetReference`).
fn cronjob_ref(cj: &CronJob) -> ObjectReference {
    shared::meta::refs::object_reference(cj)
}

fn controller_of(
    job: &Job,
) -> Option<&k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference> {
    shared::meta::refs::controller_of(&job.metadata)
}

impl CronJobController {
    /// Takes the caches `init` registered, the writer, events, clock and metrics from `setup`.
    pub fn new(
        cronjobs: Arc<Informer<CronJob>>,
        jobs: Arc<Informer<Job>>,
        queue: Arc<Queue<String>>,
        (zones, policy): (Zones, DstPolicy),
        ctx: Ctx<Metrics>,
    ) -> CronJobController {
        let Ctx {
            writer,
            events,
            clock,
            metrics,
            ..
        } = ctx;
        CronJobController {
            cronjobs,
            jobs,
            queue,
            writer,
            events,
            clock,
            metrics,
            policy,
            zones,
            memory: Mutex::new(HashMap::new()),
            written: Written::new(),
        }
    }

    fn memory(&self) -> MutexGuard<'_, HashMap<String, Memory>> {
        shared::lock(&self.memory)
    }

    /// CR-3: the CronJob a Job's controller reference resolves to (kind, name and UID checked).
    fn owner_key(&self, job: &Job) -> Option<String> {
        let owner = controller_of(job)?;
        if !shared::meta::refs::names_kind::<CronJob>(owner) {
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

    /// CR-3: Job changes enqueue the owning CronJob (the old owner too when the controller
    /// reference changed); a deletion also ends history cleanup's wait for it.
    pub fn job_changed(&self, change: &Change<Job>) {
        if let Change::Deleted(job) = change
            && let Some(owner) = controller_of(job)
        {
            let mut memory = self.memory();
            if let Some(m) = memory.get_mut(&owner.uid) {
                m.deleting.remove(&uid(&job.metadata));
                if m.is_empty() {
                    memory.remove(&owner.uid);
                }
            }
        }
        if let Change::Updated { old, new } = change {
            if old.metadata.resource_version == new.metadata.resource_version {
                return;
            }
            if controller_of(old) != controller_of(new)
                && let Some(key) = self.owner_key(old)
            {
                self.queue.add(key);
            }
        }
        if let Some(key) = self.owner_key(change.object()) {
            self.queue.add(key);
        }
    }

    /// CR-3: a CronJob update changing `schedule` or `timeZone` is waited for from its own next
    /// time; other changes enqueue at once. A deletion forgets the CronJob.
    pub fn cronjob_changed(&self, change: &Change<CronJob>) {
        let Change::Updated { old, new } = change else {
            if let Change::Deleted(cj) = change {
                let id = uid(&cj.metadata);
                self.memory().remove(&id);
                self.written.forget(&id);
            }
            self.queue.add(object_key(change.object().as_ref()));
            return;
        };
        let (o, n) = (&old.spec, &new.spec);
        let key = object_key(new.as_ref());
        if o.schedule == n.schedule && o.time_zone == n.time_zone {
            self.queue.add(key);
            return;
        }
        let (text, _) = format_schedule(new, &self.zones);
        match schedule::parse(&text, &self.zones) {
            Ok(sched) => match plan::requeue_after(new, self.clock.now(), &sched, self.policy) {
                Some(d) => self.queue.add_after(key, d),
                None => self.queue.add(key),
            },
            Err(_) => self.emit(
                new,
                &Event::warning(
                    "UnParseableCronJobSchedule",
                    format!("unparseable schedule for cronjob: {}", n.schedule),
                ),
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

    /// JB-7: the Jobs in `namespace` whose controller reference is this CronJob (kind, group, UID).
    fn owned_jobs(&self, namespace: &str, cj_uid: &str) -> Vec<Arc<Job>> {
        self.jobs
            .by_index(INDEX_CONTROLLER_UID, cj_uid)
            .into_iter()
            .filter(|j| j.metadata.namespace.as_deref() == Some(namespace))
            .filter(|j| plan::controlled_by(j, cj_uid))
            .collect()
    }

    pub async fn sync(&self, key: &str) -> Result<Next, Error> {
        // Observe.
        let Some(cached) = self.cronjobs.get(key) else {
            return Ok(Next::Done);
        };
        let cached = self.written.freshest(cached);
        let cj_uid = uid(&cached.metadata);
        let (ns, _) = split_key(key);
        let owned = self.owned_jobs(ns, &cj_uid);
        let jobs: Vec<&Job> = owned.iter().map(|j| j.as_ref()).collect();
        let mut cj: CronJob = (*cached).clone();
        let mut changed = false;

        // CR-32: history first, also while suspended or deleting.
        let deleted = self.clean_up_history(&cj, &jobs).await;
        changed |= !deleted.is_empty();
        let status = cj.status.get_or_insert_with(Default::default);
        status::remove_all(status, &deleted);

        // CR-29: an unfinished Job missing from `active` may be one a write we have not yet
        // observed listed; a live read decides.
        if status::needs_live_read(status, &jobs) {
            let live = act::read_cronjob(
                &self.writer,
                ns,
                cached.metadata.name.as_deref().unwrap_or_default(),
            )
            .await
            .map_err(api(format!("reading cronjob {key}")))?;
            let live_status = live.status.clone().unwrap_or_default();
            if status::live_lists_more(status, &live_status, &jobs) {
                cj = live;
                status::remove_all(cj.status.get_or_insert_with(Default::default), &deleted);
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

        // Plan and act.
        let mut next = Next::Done;
        if result.is_ok() {
            match self.start_due(&mut cj, &cj_uid, &mut changed).await {
                Ok(n) => next = n,
                Err(e) => result = Err(e),
            }
        }

        // Status, once.
        if changed {
            self.write_status(&cj).await?;
        }
        result.map(|()| next)
    }

    /// CR-32: deletes the finished Jobs beyond the history limits (skipping those already being
    /// deleted); returns the UIDs deleted.
    async fn clean_up_history(&self, cj: &CronJob, jobs: &[&Job]) -> Vec<String> {
        let present: Vec<&Job> = {
            let mut memory = self.memory();
            let cj_uid = uid(&cj.metadata);
            match memory.get_mut(&cj_uid) {
                Some(m) => {
                    m.deleting.retain(|_, at| at.elapsed() < DELETING_FOR);
                    let present = jobs
                        .iter()
                        .copied()
                        .filter(|j| !m.deleting.contains_key(&uid(&j.metadata)))
                        .collect();
                    if m.is_empty() {
                        memory.remove(&cj_uid);
                    }
                    present
                }
                None => jobs.to_vec(),
            }
        };
        let mut deleted = Vec::new();
        for job in plan::history_to_delete(cj, &present) {
            if self.delete_job(cj, job).await.is_ok() {
                deleted.push(uid(&job.metadata));
            }
        }
        deleted
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
            match act::read_job(&self.writer, ns, name).await {
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
    async fn start_due(
        &self,
        cj: &mut CronJob,
        cj_uid: &str,
        changed: &mut bool,
    ) -> Result<Next, Error> {
        if cj.metadata.deletion_timestamp.is_some() {
            return Ok(Next::Done);
        }
        let Some(sched) = self.runnable_schedule(cj) else {
            return Ok(Next::Done);
        };
        let now = self.clock.now();
        let (scheduled, replace) = match self.decide(cj, cj_uid, now, &sched) {
            Decision::Wait(None) => return Ok(Next::Done),
            Decision::Wait(Some(d)) => return Ok(Next::After(d)),
            Decision::Start { scheduled, replace } => (scheduled, replace),
        };
        if replace {
            self.replace_active(cj, changed).await?;
        }
        let Some(job) = self.create_due_job(cj, cj_uid, scheduled).await? else {
            return Ok(Next::Done);
        };
        // CR-21.
        status::started(
            cj.status.get_or_insert_with(Default::default),
            &job,
            scheduled,
        );
        *changed = true;
        Ok(match plan::requeue_after(cj, now, &sched, self.policy) {
            Some(d) => Next::After(d),
            None => Next::Done,
        })
    }

    /// The schedule to plan with; `None` (after its warning) when the CronJob starts nothing:
    /// an unknown zone (CR-12), suspended (CR-28) or an unparseable schedule (CR-4..CR-7).
    fn runnable_schedule(&self, cj: &CronJob) -> Option<Schedule> {
        let spec = &cj.spec;
        if let Some(tz) = spec.time_zone.as_deref()
            && let Err(e) = self.zones.load(tz)
        {
            // CR-12: e.g. a zone newer than our database; no Jobs until it loads.
            let note = format!("invalid timeZone: {}: {e}", strconv_quote(tz));
            self.emit(cj, &Event::warning("UnknownTimeZone", note));
            return None;
        }
        if spec.suspend == Some(true) {
            return None;
        }
        let (text, grandfathered) = format_schedule(cj, &self.zones);
        if grandfathered {
            // CR-13: still run, but warned about every sync.
            self.emit(cj, &Event::warning("UnsupportedSchedule", format!(
                "CRON_TZ or TZ used in schedule {} is not officially supported, see https://kubernetes.io/docs/concepts/workloads/controllers/cron-jobs/ for more details",
                strconv_quote(&spec.schedule)
            )));
        }
        match schedule::parse(&text, &self.zones) {
            Ok(s) => Some(s),
            Err(e) => {
                let note = format!(
                    "unparseable schedule: {} : {e}",
                    strconv_quote(&spec.schedule)
                );
                self.emit(cj, &Event::warning("UnparseableSchedule", note));
                None
            }
        }
    }

    /// CR-22..CR-27: what [`plan::plan`] decides, with its events emitted and a reported miss
    /// remembered (JB-11: once per slot).
    fn decide(&self, cj: &CronJob, cj_uid: &str, now: Timestamp, sched: &Schedule) -> Decision {
        let warned = self.memory().get(cj_uid).and_then(|m| m.missed_warned);
        let p = plan::plan(cj, now, sched, self.policy, warned);
        for e in &p.events {
            self.emit(cj, e);
        }
        if let Some(slot) = p.missed_slot {
            self.memory()
                .entry(cj_uid.to_string())
                .or_default()
                .missed_warned = Some(slot);
        }
        p.decision
    }

    /// CR-19, CR-20: creates the Job for `scheduled`. `None` when a Job of that name exists and
    /// is someone else's or already in `active`: nothing to start.
    async fn create_due_job(
        &self,
        cj: &CronJob,
        cj_uid: &str,
        scheduled: Timestamp,
    ) -> Result<Option<Job>, Error> {
        // The annotation is in spec.timeZone, or UTC when unset (never the local zone).
        let annotation_zone = match cj.spec.time_zone.as_deref() {
            Some(tz) => self.zones.load(tz).unwrap_or_else(|_| Zone::utc()),
            None => Zone::utc(),
        };
        let want = plan::job_for(cj, scheduled, &annotation_zone);
        let ns = cj.metadata.namespace.clone().unwrap_or_default();
        match act::create_job(&self.writer, &ns, &want).await {
            Ok(act::Created::New(created)) => {
                if let Some(c) = &created.metadata.creation_timestamp {
                    let skew = c.0.duration_since(scheduled).as_secs_f64();
                    self.metrics.creation_skew.observe(skew);
                }
                let name = created.metadata.name.as_deref().unwrap_or_default();
                self.emit(
                    cj,
                    &Event::normal("SuccessfulCreate", format!("Created job {name}")),
                );
                Ok(Some(created))
            }
            Ok(act::Created::Existing(existing)) => {
                // JB-8: ours but unlisted (a lost status write) is taken back into `active`.
                if !plan::controlled_by(&existing, cj_uid) {
                    return Ok(None);
                }
                let existing_uid = uid(&existing.metadata);
                if cj
                    .status
                    .as_ref()
                    .is_some_and(|s| status::listed(s, &existing_uid))
                {
                    return Ok(None);
                }
                let name = existing.metadata.name.as_deref().unwrap_or_default();
                tracing::info!(job = %name, "job already exists; taking it back into active");
                Ok(Some(existing))
            }
            Err(act::CreateError::NamespaceTerminating(e)) => {
                Err(api(format!("creating job for cronjob {ns}"))(e))
            }
            Err(act::CreateError::ReadExisting(e)) => {
                let name = want.metadata.name.as_deref().unwrap_or_default();
                Err(api(format!("reading job {ns}/{name}"))(e))
            }
            Err(act::CreateError::Failed(e)) => {
                let note = format!("Error creating job: {}", message(&e));
                self.emit(cj, &Event::warning("FailedCreate", note));
                Err(api(format!("creating job in {ns}"))(e))
            }
        }
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
            let job = match act::read_job(&self.writer, ns, name).await {
                Ok(j) => j,
                Err(e) => {
                    let note = format!("Get job: {}", message(&e));
                    self.emit(cj, &Event::warning("FailedGet", note));
                    return Err(api(format!("reading job {ns}/{name}"))(e));
                }
            };
            self.delete_job(cj, &job)
                .await
                .map_err(|source| Error::Replace {
                    job: format!("{ns}/{name}"),
                    source,
                })?;
            let status = cj.status.get_or_insert_with(Default::default);
            plan::remove_active(status, &uid(&job.metadata));
            *changed = true;
        }
        Ok(())
    }

    /// `deleteJob`: Background deletion with its events; a Job deleted (or already gone) is
    /// skipped by history cleanup until the cache drops it.
    async fn delete_job(&self, cj: &CronJob, job: &Job) -> Result<(), kube::Error> {
        let name = job.metadata.name.as_deref().unwrap_or_default();
        let result = act::delete_job(&self.writer, job).await;
        if result.as_ref().is_ok() || result.as_ref().is_err_and(is_not_found) {
            self.memory()
                .entry(uid(&cj.metadata))
                .or_default()
                .deleting
                .insert(uid(&job.metadata), Instant::now());
        }
        match result {
            Ok(()) => {
                self.emit(
                    cj,
                    &Event::normal("SuccessfulDelete", format!("Deleted job {name}")),
                );
                Ok(())
            }
            Err(e) => {
                tracing::warn!(job = %name, error = %e, "deleting job");
                let note = format!("Deleted job: {}", message(&e));
                self.emit(cj, &Event::warning("FailedDelete", note));
                Err(e)
            }
        }
    }

    /// CR-2: the one status write; what it returns is served to the next sync while the cache
    /// still holds the version it replaced.
    async fn write_status(&self, cj: &CronJob) -> Result<(), Error> {
        let ns = cj.metadata.namespace.as_deref().unwrap_or_default();
        let name = cj.metadata.name.as_deref().unwrap_or_default();
        let written = act::write_status(&self.writer, cj)
            .await
            .map_err(api(format!("updating status of cronjob {ns}/{name}")))?;
        self.written.replaced(&uid(&cj.metadata), cj, written);
        Ok(())
    }
}
