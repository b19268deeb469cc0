//! One sync of one Job: observe the Job and its pods in the caches (claiming them, `claim`), ask
//! [`plan`] what to do, manage pods (`manage`) and write status through the finalizer protocol
//! (`tracking`); and one sync of an orphan-queue key (JR-61). Also what the controller remembers
//! of each Job, by UID, so a same-name successor starts clean (JB-3).

use crate::metrics::{Metrics, SyncLabels};
use crate::plan::{self, Observed, PodAction};
use crate::tracking::FlushError;
use crate::{Error, MANAGED_BY, OrphanKey, act, api, handlers, pods, policy};
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::ObjectReference;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use shared::api::writer::Writer;
use shared::cache::informers::{INDEX_CONTROLLER_UID, Informer};
use shared::cache::pod::Pod;
use shared::cache::written::Written;
use shared::meta::clock::Clock;
use shared::meta::keys::object_key;
use shared::meta::refs::refers_to_version;
use shared::runtime::controller::Ctx;
use shared::runtime::events::EventRecorder;
use shared::runtime::queue::{Next, Queue};
use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;
use tokio::time::Instant;

/// JB-4: retry cadence of failed finalizer removals.
const RM_RETRY_BASE: Duration = Duration::from_secs(1);
const RM_RETRY_MAX: Duration = Duration::from_secs(10);

/// What the controller remembers of one Job, by UID. Pod expectations live in
/// [`Jobs::expectations`] and our own status writes in [`Jobs::own`], also by UID.
#[derive(Debug, Default)]
pub(crate) struct Memory {
    /// JR-22: pod UIDs whose finalizer removal was sent and is not yet observed.
    pub rm_finalizers: HashSet<String>,
    /// JR-34: the pod-failure backoff record.
    pub backoff: policy::BackoffRecord,
    /// JR-7: we wrote a terminal condition the cache has not shown yet.
    pub finished: bool,
    /// JB-4: consecutive syncs with failed finalizer removals.
    pub rm_failures: u32,
}

impl Memory {
    fn is_empty(&self) -> bool {
        self.rm_finalizers.is_empty()
            && self.backoff == policy::BackoffRecord::default()
            && !self.finished
            && self.rm_failures == 0
    }
}

pub struct JobController {
    pub jobs: Arc<Informer<Job>>,
    pub pods: Arc<Informer<Pod>>,
    pub queue: Arc<Queue<String>>,
    pub orphans: Arc<Queue<OrphanKey>>,
    pub(crate) writer: Writer,
    pub(crate) events: EventRecorder,
    pub(crate) clock: Arc<dyn Clock>,
    pub(crate) metrics: Metrics,
    /// By Job UID (JB-3): JR-8's status writes the Job cache must show before a sync acts, and
    /// JR-21's pod create/delete expectations.
    pub(crate) written: Written,
    memory: Mutex<HashMap<String, Memory>>,
    /// MutableSchedulingDirectivesForSuspendedJobs (JR-44).
    clear_start_time_on_suspend: bool,
}

/// The subject of the Job's events, as upstream's recorder builds it (`ref.GetReference`).
pub(crate) fn job_ref(job: &Job) -> ObjectReference {
    shared::meta::refs::object_reference(job)
}

pub(crate) fn external_manager(job: &Job) -> Option<&str> {
    job.spec
        .as_ref()
        .and_then(|s| s.managed_by.as_deref())
        .filter(|m| *m != MANAGED_BY)
}

pub(crate) fn uid_of(job: &Job) -> String {
    job.metadata.uid.clone().unwrap_or_default()
}

pub(crate) fn pod_controller(pod: &Pod) -> Option<&OwnerReference> {
    shared::meta::refs::controller_of(&pod.metadata)
}

impl JobController {
    pub fn new(
        jobs: Arc<Informer<Job>>,
        pods: Arc<Informer<Pod>>,
        queue: Arc<Queue<String>>,
        orphans: Arc<Queue<OrphanKey>>,
        ctx: Ctx<Metrics>,
    ) -> JobController {
        let Ctx {
            writer,
            events,
            clock,
            metrics,
            gates,
        } = ctx;
        JobController {
            clear_start_time_on_suspend: gates.mutable_scheduling_directives_for_suspended_jobs,
            jobs,
            pods,
            queue,
            orphans,
            writer,
            events,
            clock,
            metrics,
            written: Written::new(),
            memory: Mutex::new(HashMap::new()),
        }
    }

    fn memory(&self) -> MutexGuard<'_, HashMap<String, Memory>> {
        shared::lock(&self.memory)
    }

    /// Changes the memory of Job `uid`, dropping it when nothing is left to remember.
    pub(crate) fn remember<T>(&self, uid: &str, f: impl FnOnce(&mut Memory) -> T) -> T {
        let mut memory = self.memory();
        let m = memory.entry(uid.to_string()).or_default();
        let out = f(m);
        if m.is_empty() {
            memory.remove(uid);
        }
        out
    }

    /// JR-4: the Job is gone; nothing of it is kept.
    pub(crate) fn forget(&self, uid: &str) {
        self.written.forget(uid);
        self.memory().remove(uid);
    }

    /// JR-22: the watch shows the finalizer of `pod_uid` gone (or the pod gone).
    pub(crate) fn finalizer_removal_observed(&self, job_uid: &str, pod_uid: &str) {
        let mut memory = self.memory();
        if let Some(m) = memory.get_mut(job_uid) {
            m.rm_finalizers.remove(pod_uid);
            if m.is_empty() {
                memory.remove(job_uid);
            }
        }
    }

    pub async fn sync_job(&self, key: &str) -> Result<Next, Error> {
        let started = Instant::now();
        let Some(job) = self.jobs.get(key) else {
            // Per-Job memory went with the delete event (keyed by UID).
            return Ok(Next::Done);
        };
        if external_manager(&job).is_some() {
            return Ok(Next::Done);
        }
        let uid = uid_of(&job);
        // JR-8: act only on a cache that holds our own last write.
        if let Some(behind) = self.written.behind(&uid) {
            return Ok(Next::Stale(behind));
        }
        if plan::finished(&job) {
            self.written.forget(&uid);
            self.remember(&uid, |m| {
                m.backoff = policy::BackoffRecord::default();
                m.finished = false;
            });
            return Ok(Next::Done);
        }
        // JR-7: never manage pods again for a Job we finished.
        if self.remember(&uid, |m| m.finished) {
            return Ok(Next::Done);
        }
        if !plan::known_completion_mode(&job) {
            self.events.warning(
                &job_ref(&job),
                "UnknownCompletionMode",
                "Sync",
                "Skipped Job sync because completion mode is unknown",
            );
            return Ok(Next::Done);
        }
        // PX-3: a selector this controller cannot evaluate (one the API server would not
        // accept; `spec.selector` is immutable) is a Warning naming the field, not a retry loop.
        let selector = job.spec.as_ref().and_then(|s| s.selector.as_ref());
        if let Err(e) = shared::meta::selector::matches(selector, None) {
            self.events.warning(
                &job_ref(&job),
                "InvalidSelector",
                "Sync",
                format!("spec.selector: {e}"),
            );
            return Ok(Next::Done);
        }
        let mut action = "reconciling";
        let result = self.sync_unfinished(&job, &mut action).await;
        let labels = SyncLabels {
            completion_mode: plan::completion_mode(&job).into(),
            result: if result.is_ok() { "success" } else { "error" }.into(),
            action: action.into(),
        };
        self.metrics
            .sync_duration
            .get_or_create(&labels)
            .observe(started.elapsed().as_secs_f64());
        self.metrics.syncs.get_or_create(&labels).inc();
        result
    }

    async fn sync_unfinished(
        &self,
        job: &Arc<Job>,
        action_label: &mut &'static str,
    ) -> Result<Next, Error> {
        let uid = uid_of(job);
        // JR-20: expectations are read before pods are listed.
        let satisfied = self.written.satisfied(&uid);
        let pods = self.claim_pods(job).await?;
        let (expected_rm_finalizers, backoff) =
            self.remember(&uid, |m| (m.rm_finalizers.clone(), m.backoff));
        let obs = Observed {
            job,
            pods,
            expectations_satisfied: satisfied,
            expected_rm_finalizers,
            backoff,
            now: self.clock.now(),
            clear_start_time_on_suspend: self.clear_start_time_on_suspend,
        };
        let mut eval = plan::evaluate(&obs);
        let mut next = Next::Done;
        let mut requeue = |d: Duration| {
            next = match next {
                Next::After(e) if e <= d => next,
                _ => Next::After(d),
            }
        };
        if let Some(d) = eval.deadline_requeue {
            requeue(d);
        }
        let (outcome, manage_err) = self.perform(job, &eval, action_label).await;
        if let PodAction::WaitBackoff(d) = eval.action {
            // JR-2: at least the batch period.
            requeue(d.max(handlers::BATCH_PERIOD));
        }
        let (needs_update, event) = plan::conclude(&obs, &mut eval, outcome);
        if let Some((reason, note)) = event {
            self.events.normal(&job_ref(job), reason, "Sync", note);
        }
        let tracking = plan::track(&obs, &eval, needs_update);
        match self.flush(&obs, &eval, tracking).await {
            Err(FlushError::Finalizers(e)) => {
                // JB-4: rejected finalizer removals retry on their own cadence (1 s doubling to
                // 10 s), not the queue's (up to 60 s), so pods are released soon after an
                // admission webhook stops rejecting. Status progress was already written.
                let n = self.remember(&uid, |m| {
                    m.rm_failures = m.rm_failures.saturating_add(1);
                    m.rm_failures
                });
                tracing::warn!(error = %e, attempt = n, "tracking finalizer removal failed; will retry");
                requeue(shared::api::ratelimit::backoff_delay(
                    RM_RETRY_BASE,
                    RM_RETRY_MAX,
                    n - 1,
                ));
            }
            Err(FlushError::Other(e)) => return Err(e),
            Ok(()) => self.remember(&uid, |m| m.rm_failures = 0),
        }
        match manage_err {
            Some(e) => Err(e),
            None => Ok(next),
        }
    }

    /// JB-4: pods with our finalizer whose Job is gone or finished go to the orphan queue.
    pub fn sweep(&self) {
        for pod in self.pods.by_index(handlers::INDEX_TRACKING, "") {
            let ns = pod.metadata.namespace.as_deref().unwrap_or_default();
            let stale = match pod_controller(&pod) {
                None => true,
                Some(r) if refers_to_version::<Job>(r) => {
                    self.resolve(ns, r).is_none_or(|j| plan::finished(&j))
                }
                Some(_) => false,
            };
            if stale {
                self.orphans.add(OrphanKey::Pod(object_key(pod.as_ref())));
            }
        }
    }

    pub async fn sync_orphan(&self, key: &OrphanKey) -> Result<Next, Error> {
        match key {
            OrphanKey::Pod(k) => match self.pods.get(k) {
                Some(p) => self.handle_orphan(&p).await.map(|_| Next::Done),
                None => Ok(Next::Done),
            },
            OrphanKey::Owner(uid) => {
                // Per-pod failures are retried per pod (JR-61, #141346).
                for p in self.pods.by_index(INDEX_CONTROLLER_UID, uid) {
                    if let Err(e) = self.handle_orphan(&p).await {
                        tracing::warn!(pod = %object_key(p.as_ref()), error = %e, "releasing tracking finalizer");
                        self.orphans
                            .add_rate_limited(OrphanKey::Pod(object_key(p.as_ref())));
                    }
                }
                Ok(Next::Done)
            }
        }
    }

    /// JR-61: remove our finalizer from a pod whose Job is gone or finished.
    async fn handle_orphan(&self, pod: &Pod) -> Result<(), Error> {
        if !pods::has_tracking_finalizer(pod) {
            return Ok(());
        }
        let ns = pod.metadata.namespace.as_deref().unwrap_or_default();
        let mut job = None;
        if let Some(r) = pod_controller(pod) {
            if !refers_to_version::<Job>(r) {
                return Ok(());
            }
            job = self.resolve(ns, r);
            if let Some(j) = &job
                && (external_manager(j).is_some() || !plan::finished(j))
            {
                return Ok(());
            }
        }
        act::remove_tracking_finalizer(&self.writer, pod)
            .await
            .map_err(|e| {
                let failures = [(pod, e)];
                self.finalizer_failure(job.as_deref(), &failures);
                let [(_, e)] = failures;
                api(format!(
                    "removing the tracking finalizer of pod {}",
                    object_key(pod)
                ))(e)
            })
    }
}
