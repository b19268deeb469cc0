//! `job-controller`: runs pods for Jobs and tracks them with the `batch.kubernetes.io/job-tracking`
//! finalizer (spec §2, JR-1..JR-65), as kube-controller-manager does, with the spec's §4 fixes.
//!
//! Two queues as upstream: `job` (keyed `namespace/name`) and `job_orphan_pod` (a pod, or all pods
//! of a Job UID, whose finalizer may have to go). A Job sync observes the Job and its pods from the
//! shared caches, asks [`plan`] what to do, performs it ([`act`]) and writes status through the
//! finalizer protocol. Per-Job memory (expectations, finalizer expectations, backoff records,
//! own-write records) is keyed by the Job's UID, so a same-name successor starts clean (B-3).

pub mod act;
pub mod indexes;
pub mod metrics;
pub mod plan;
pub mod pods;
pub mod policy;
pub mod status;

use futures::FutureExt;
use futures::future::{BoxFuture, join_all};
use k8s_openapi::api::batch::v1::{Job, JobStatus};
use k8s_openapi::api::core::v1::{ObjectReference, Pod};
use k8s_openapi::jiff::Timestamp;
use kube::{Client, ResourceExt};
use metrics::{
    ActionLabel, ControllerNameLabel, CreationLabels, EventLabel, FinishedLabels,
    GroupResourceLabels, IndexesLabels, Metrics, PodsFinishedLabels, ReasonLabel, SyncLabels,
};
use plan::{Evaluation, Observed, Outcome, PodAction};
use shared::controller::{Controller, InitError, Setup};
use shared::events::EventRecorder;
use shared::expectations::Expectations;
use shared::informers::{
    Change, INDEX_CONTROLLER_UID, INDEX_NAMESPACE, Informer, by_controller_uid, by_namespace,
    object_key,
};
use shared::queue::{Next, Queue, run_workers};
use shared::ratelimit::BackoffConfig;
use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio_util::sync::CancellationToken;

pub const NAME: &str = "job-controller";
pub const QUEUE: &str = "job";
pub const ORPHAN_QUEUE: &str = "job_orphan_pod";
/// The reserved `spec.managedBy` value of this controller.
pub const MANAGED_BY: &str = "kubernetes.io/job-controller";
/// JR-2: pod events and status-only updates are batched.
const BATCH_PERIOD: Duration = Duration::from_secs(1);
/// B-4: how often pods carrying our finalizer are checked for a Job that is gone or finished.
const SWEEP_PERIOD: Duration = Duration::from_secs(60);
/// B-4: retry cadence of failed finalizer removals.
const RM_RETRY_BASE: Duration = Duration::from_secs(1);
const RM_RETRY_MAX: Duration = Duration::from_secs(10);
/// Index of pods without a controller, by namespace (candidates for adoption).
const INDEX_ORPHAN_NAMESPACE: &str = "job-orphan-namespace";
/// Index of pods carrying the tracking finalizer (the sweep's input).
const INDEX_TRACKING: &str = "job-tracking-finalizer";

#[derive(clap::Args, Clone, Debug)]
pub struct JobOptions {
    /// The number of job objects that are allowed to sync concurrently. Larger number = more responsive jobs, but more CPU (and network) load.
    #[arg(long, default_value_t = 5)]
    pub concurrent_job_syncs: usize,
}

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("{what}: {source}")]
    Api {
        what: String,
        #[source]
        source: kube::Error,
    },
    #[error("status write for {key} refused locally, it would be invalid: {violations}")]
    InvalidStatus { key: String, violations: String },
    #[error("the cache has not yet observed this controller's last write to {0}")]
    StaleCache(String),
}

fn api(what: impl Into<String>) -> impl FnOnce(kube::Error) -> Error {
    let what = what.into();
    move |source| Error::Api { what, source }
}

/// Orphan-queue keys (upstream `orphanPodKey`): one pod, or every pod a Job UID controls.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum OrphanKey {
    Pod(String),
    Owner(String),
}

fn job_ref(job: &Job) -> ObjectReference {
    ObjectReference {
        api_version: Some("batch/v1".into()),
        kind: Some("Job".into()),
        name: job.metadata.name.clone(),
        namespace: job.metadata.namespace.clone(),
        uid: job.metadata.uid.clone(),
        ..Default::default()
    }
}

fn external_manager(job: &Job) -> Option<&str> {
    job.spec
        .as_ref()
        .and_then(|s| s.managed_by.as_deref())
        .filter(|m| *m != MANAGED_BY)
}

fn uid_of(job: &Job) -> String {
    job.metadata.uid.clone().unwrap_or_default()
}

fn pod_controller(
    pod: &Pod,
) -> Option<&k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference> {
    pod.metadata
        .owner_references
        .iter()
        .flatten()
        .find(|o| o.controller == Some(true))
}

fn terminal_with_finalizer(pod: Option<&Pod>) -> bool {
    pod.is_some_and(|p| pods::terminal(p) && pods::has_tracking_finalizer(p))
}

struct Inner {
    jobs: Arc<Informer<Job>>,
    pods: Arc<Informer<Pod>>,
    queue: Arc<Queue<String>>,
    orphans: Arc<Queue<OrphanKey>>,
    client: Client,
    events: EventRecorder,
    workers: usize,
    /// Pod create/delete expectations, keyed by Job UID (JR-21, B-3).
    expectations: Expectations,
    /// Job UID → pod UIDs whose finalizer removal is not yet observed (JR-22).
    rm_finalizers: Mutex<HashMap<String, HashSet<String>>>,
    /// Job UID → pod-failure backoff record (JR-34).
    backoff: Mutex<HashMap<String, policy::BackoffRecord>>,
    /// Job UID → resourceVersion of our last status write (JR-8).
    written: Mutex<HashMap<String, u64>>,
    /// Job UIDs whose terminal condition we wrote and the cache has not shown yet (JR-7).
    finished: Mutex<HashSet<String>>,
    /// Job UID → consecutive syncs with failed finalizer removals (B-4 retry cadence).
    rm_failures: Mutex<HashMap<String, u32>>,
    metrics: Metrics,
    active: AtomicBool,
}

pub struct JobController {
    inner: Arc<Inner>,
}

/// Wires the controller to the shared caches.
pub fn init(opts: JobOptions) -> impl FnOnce(Setup) -> Result<Box<dyn Controller>, InitError> {
    move |setup: Setup| {
        let jobs = setup.informers.get::<Job>();
        jobs.add_index(INDEX_NAMESPACE, by_namespace);
        let pods = setup.informers.get::<Pod>();
        pods.add_index(INDEX_CONTROLLER_UID, by_controller_uid);
        pods.add_index(INDEX_ORPHAN_NAMESPACE, |p: &Pod| {
            if pod_controller(p).is_none() {
                p.metadata.namespace.clone().into_iter().collect()
            } else {
                Vec::new()
            }
        });
        pods.add_index(INDEX_TRACKING, |p: &Pod| {
            if pods::has_tracking_finalizer(p) {
                vec![String::new()]
            } else {
                Vec::new()
            }
        });
        // JR-1: 1 s doubling to 60 s per item.
        let backoff = BackoffConfig::exponential(Duration::from_secs(1), Duration::from_secs(60));
        let inner = Arc::new(Inner {
            jobs: Arc::clone(&jobs),
            pods: Arc::clone(&pods),
            queue: Queue::new(QUEUE, backoff.clone(), &setup.metrics),
            orphans: Queue::new(ORPHAN_QUEUE, backoff, &setup.metrics),
            client: setup.client,
            events: setup.events,
            workers: opts.concurrent_job_syncs.max(1),
            expectations: Expectations::new(),
            rm_finalizers: Mutex::new(HashMap::new()),
            backoff: Mutex::new(HashMap::new()),
            written: Mutex::new(HashMap::new()),
            finished: Mutex::new(HashSet::new()),
            rm_failures: Mutex::new(HashMap::new()),
            metrics: Metrics::register(&setup.metrics),
            active: AtomicBool::new(false),
        });
        let weak = Arc::downgrade(&inner);
        jobs.on_change(move |change| {
            if let Some(inner) = weak.upgrade() {
                inner.on_job(change);
            }
        });
        let weak = Arc::downgrade(&inner);
        pods.on_change(move |change| {
            if let Some(inner) = weak.upgrade() {
                inner.on_pod(change);
            }
        });
        Ok(Box::new(JobController { inner }) as Box<dyn Controller>)
    }
}

impl Controller for JobController {
    fn run(self: Box<Self>, stop: CancellationToken) -> BoxFuture<'static, ()> {
        let inner = self.inner;
        async move {
            inner.active.store(true, Ordering::Release);
            for job in inner.jobs.list() {
                inner.queue.add(object_key(job.as_ref()));
            }
            inner.sweep();
            let queues = (Arc::clone(&inner.queue), Arc::clone(&inner.orphans));
            let sweeper = Arc::clone(&inner);
            let stop2 = stop.clone();
            tokio::spawn(async move {
                let mut tick = tokio::time::interval(SWEEP_PERIOD);
                tick.tick().await;
                loop {
                    tokio::select! {
                        _ = stop2.cancelled() => break,
                        _ = tick.tick() => sweeper.sweep(),
                    }
                }
            });
            tokio::spawn(async move {
                stop.cancelled().await;
                queues.0.shut_down();
                queues.1.shut_down();
            });
            let a = Arc::clone(&inner);
            let jobs = run_workers(
                Arc::clone(&inner.queue),
                inner.workers,
                move |key: String| {
                    let inner = Arc::clone(&a);
                    async move { inner.sync_job(&key).await }
                },
            );
            let b = Arc::clone(&inner);
            let orphans = run_workers(
                Arc::clone(&inner.orphans),
                inner.workers,
                move |key: OrphanKey| {
                    let inner = Arc::clone(&b);
                    async move { inner.sync_orphan(&key).await }
                },
            );
            futures::join!(jobs, orphans);
        }
        .boxed()
    }
}

impl Inner {
    fn leading(&self) -> bool {
        self.active.load(Ordering::Acquire)
    }

    /// The cached Job a controller reference points to, if it exists with that UID.
    fn resolve(
        &self,
        namespace: &str,
        r: &k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference,
    ) -> Option<Arc<Job>> {
        if r.kind != "Job" {
            return None;
        }
        self.jobs
            .get(&format!("{namespace}/{}", r.name))
            .filter(|j| j.metadata.uid.as_deref() == Some(r.uid.as_str()))
    }

    /// Jobs in the pod's namespace whose selector matches it (for orphans).
    fn matching_jobs(&self, pod: &Pod) -> Vec<Arc<Job>> {
        let ns = pod.metadata.namespace.as_deref().unwrap_or_default();
        self.jobs
            .by_index(INDEX_NAMESPACE, ns)
            .into_iter()
            .filter(|j| {
                shared::selector::matches(
                    j.spec.as_ref().and_then(|s| s.selector.as_ref()),
                    pod.metadata.labels.as_ref(),
                )
                .unwrap_or(false)
            })
            .collect()
    }

    fn enqueue_batched(&self, job: &Job) {
        self.queue.add_after(object_key(job), BATCH_PERIOD);
    }

    fn forget(&self, uid: &str) {
        self.expectations.delete(uid);
        self.rm_finalizers.lock().expect("lock").remove(uid);
        self.backoff.lock().expect("lock").remove(uid);
        self.written.lock().expect("lock").remove(uid);
        self.finished.lock().expect("lock").remove(uid);
        self.rm_failures.lock().expect("lock").remove(uid);
    }

    fn finalizer_removal_observed(&self, job_uid: &str, pod_uid: &str) {
        if let Some(set) = self.rm_finalizers.lock().expect("lock").get_mut(job_uid) {
            set.remove(pod_uid);
        }
    }

    fn on_job(&self, change: &Change<Job>) {
        if let Change::Added(j) = change
            && let Some(m) = external_manager(j)
        {
            // JR-46: counted whether or not this replica leads.
            self.metrics
                .external
                .get_or_create(&ControllerNameLabel {
                    controller_name: m.to_string(),
                })
                .inc();
        }
        if !self.leading() {
            return;
        }
        match change {
            Change::Added(j) => self.queue.add(object_key(j.as_ref())),
            Change::Updated { old, new } => {
                if plan::finished(new) {
                    self.orphans.add(OrphanKey::Owner(uid_of(new)));
                    return;
                }
                if old.metadata.generation == new.metadata.generation {
                    self.enqueue_batched(new);
                } else {
                    self.queue.add(object_key(new.as_ref()));
                }
                // JR-3: a changed deadline is checked again when it runs out.
                let ads = |j: &Job| j.spec.as_ref().and_then(|s| s.active_deadline_seconds);
                if let (Some(start), Some(new_ads)) = (
                    new.status.as_ref().and_then(|s| s.start_time.as_ref()),
                    ads(new),
                ) && ads(old) != Some(new_ads)
                {
                    let elapsed = Timestamp::now().duration_since(start.0);
                    let total = k8s_openapi::jiff::SignedDuration::from_secs(new_ads);
                    let left = Duration::try_from(total - elapsed).unwrap_or(Duration::ZERO);
                    self.queue.add_after(object_key(new.as_ref()), left);
                }
            }
            Change::Deleted(j) => {
                self.forget(&uid_of(j));
                self.queue.add(object_key(j.as_ref()));
                self.orphans.add(OrphanKey::Owner(uid_of(j)));
            }
        }
    }

    fn on_pod(&self, change: &Change<Pod>) {
        // JR-31: counted on every replica, as upstream counts in its handlers.
        let (was, is) = match change {
            Change::Added(p) => (false, terminal_with_finalizer(Some(p))),
            Change::Updated { old, new } => (
                terminal_with_finalizer(Some(old)),
                terminal_with_finalizer(Some(new)),
            ),
            Change::Deleted(p) => (terminal_with_finalizer(Some(p)), false),
        };
        if was != is {
            let event = if is { "add" } else { "delete" };
            self.metrics
                .terminated_with_finalizer
                .get_or_create(&EventLabel {
                    event: event.into(),
                })
                .inc();
        }
        if !self.leading() {
            return;
        }
        match change {
            Change::Added(p) => {
                if pods::deleting(p) {
                    return self.pod_deleted(p, true, false);
                }
                let ns = p.metadata.namespace.as_deref().unwrap_or_default();
                if let Some(r) = pod_controller(p) {
                    if let Some(job) = self.resolve(ns, r) {
                        self.expectations.creation_observed(&uid_of(&job));
                        self.enqueue_batched(&job);
                    }
                    return;
                }
                if pods::has_tracking_finalizer(p) {
                    self.orphans.add(OrphanKey::Pod(object_key(p.as_ref())));
                }
                for job in self.matching_jobs(p) {
                    self.enqueue_batched(&job);
                }
            }
            Change::Updated { old, new } => {
                if old.metadata.resource_version == new.metadata.resource_version {
                    return;
                }
                if pods::deleting(new) {
                    // JR-21: a deletion is observed once, when deletionTimestamp first appears.
                    return self.pod_deleted(new, !pods::deleting(old), false);
                }
                let ns = new.metadata.namespace.as_deref().unwrap_or_default();
                let finalizer_gone = !pods::has_tracking_finalizer(new);
                let (cur, prev) = (pod_controller(new), pod_controller(old));
                let ref_changed = cur != prev;
                if ref_changed
                    && let Some(r) = prev
                    && let Some(job) = self.resolve(ns, r)
                {
                    if finalizer_gone {
                        self.finalizer_removal_observed(&uid_of(&job), pods::uid(new));
                    }
                    self.enqueue_batched(&job);
                }
                if let Some(r) = cur {
                    if let Some(job) = self.resolve(ns, r) {
                        if finalizer_gone {
                            self.finalizer_removal_observed(&uid_of(&job), pods::uid(new));
                        }
                        self.enqueue_batched(&job);
                    }
                    return;
                }
                if pods::has_tracking_finalizer(new) {
                    self.orphans.add(OrphanKey::Pod(object_key(new.as_ref())));
                }
                if ref_changed || old.metadata.labels != new.metadata.labels {
                    for job in self.matching_jobs(new) {
                        self.enqueue_batched(&job);
                    }
                }
            }
            Change::Deleted(p) => self.pod_deleted(p, !pods::deleting(p), true),
        }
    }

    /// Upstream `deletePod`: `first_sighting` is whether this is the first time the deletion is
    /// seen (so expectations are lowered once per pod); `gone` whether the object is gone.
    fn pod_deleted(&self, pod: &Pod, first_sighting: bool, gone: bool) {
        let has_finalizer = pods::has_tracking_finalizer(pod);
        let ns = pod.metadata.namespace.as_deref().unwrap_or_default();
        let Some(r) = pod_controller(pod) else {
            if has_finalizer {
                self.orphans.add(OrphanKey::Pod(object_key(pod)));
            }
            return;
        };
        let job = match self.resolve(ns, r) {
            Some(j) if !plan::finished(&j) => j,
            _ => {
                if has_finalizer {
                    self.orphans.add(OrphanKey::Pod(object_key(pod)));
                }
                return;
            }
        };
        let uid = uid_of(&job);
        if first_sighting {
            self.expectations.deletion_observed(&uid);
        }
        if gone || !has_finalizer {
            self.finalizer_removal_observed(&uid, pods::uid(pod));
        }
        self.enqueue_batched(&job);
    }

    /// B-4: pods with our finalizer whose Job is gone or finished go to the orphan queue.
    fn sweep(&self) {
        for pod in self.pods.by_index(INDEX_TRACKING, "") {
            let ns = pod.metadata.namespace.as_deref().unwrap_or_default();
            let stale = match pod_controller(&pod) {
                None => true,
                Some(r) if r.kind == "Job" && r.api_version == "batch/v1" => {
                    self.resolve(ns, r).is_none_or(|j| plan::finished(&j))
                }
                Some(_) => false,
            };
            if stale {
                self.orphans.add(OrphanKey::Pod(object_key(pod.as_ref())));
            }
        }
    }

    async fn sync_orphan(&self, key: &OrphanKey) -> Result<Next, Error> {
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
            if r.kind != "Job" || r.api_version != "batch/v1" {
                return Ok(());
            }
            job = self.resolve(ns, r);
            if let Some(j) = &job
                && (external_manager(j).is_some() || !plan::finished(j))
            {
                return Ok(());
            }
        }
        act::remove_tracking_finalizer(&self.client, pod)
            .await
            .map_err(|e| {
                self.finalizer_failure(job.as_deref(), &[(pod, &e)]);
                Error::Api {
                    what: format!("removing the tracking finalizer of pod {}", object_key(pod)),
                    source: e,
                }
            })
    }

    /// B-4: a failed finalizer removal is counted, and named in a Warning event (on the Job, or
    /// on the pod when the Job is gone).
    fn finalizer_failure(&self, job: Option<&Job>, failures: &[(&Pod, &kube::Error)]) {
        for (_, e) in failures {
            self.metrics
                .finalizer_removal_failures
                .get_or_create(&ReasonLabel {
                    reason: act::error_reason(e),
                })
                .inc();
        }
        let Some((pod, e)) = failures.first() else {
            return;
        };
        let note = format!(
            "Removing finalizer {} from pod {} failed ({} pod(s) this sync), will retry: {e}",
            pods::TRACKING_FINALIZER,
            pods::name(pod),
            failures.len()
        );
        let regarding = match job {
            Some(j) => job_ref(j),
            None => shared::events::core_ref("Pod", &object_key(*pod)),
        };
        self.events.warning(
            &regarding,
            "TrackingFinalizerRemovalFailed",
            "RemoveFinalizer",
            note,
        );
    }

    async fn sync_job(&self, key: &str) -> Result<Next, Error> {
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
        let written = self.written.lock().expect("lock").get(&uid).copied();
        let cached = job
            .metadata
            .resource_version
            .as_deref()
            .and_then(|rv| rv.parse::<u64>().ok());
        if let (Some(w), Some(c)) = (written, cached)
            && c < w
        {
            self.metrics
                .stale_skips
                .get_or_create(&GroupResourceLabels {
                    group: "batch".into(),
                    resource: "jobs".into(),
                })
                .inc();
            return Err(Error::StaleCache(key.to_string()));
        }
        if plan::finished(&job) {
            self.backoff.lock().expect("lock").remove(&uid);
            self.written.lock().expect("lock").remove(&uid);
            self.finished.lock().expect("lock").remove(&uid);
            return Ok(Next::Done);
        }
        // JR-7: never manage pods again for a Job we finished.
        if self.finished.lock().expect("lock").contains(&uid) {
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

    /// JR-63: the Job's pods, adopting matching orphans and releasing owned pods that stopped
    /// matching. Adopted pods carry the finalizer in the returned copies.
    async fn claim_pods(&self, job: &Job) -> Result<Vec<Arc<Pod>>, Error> {
        let uid = uid_of(job);
        let ns = job.namespace().unwrap_or_default();
        let selector = job.spec.as_ref().and_then(|s| s.selector.as_ref());
        let matches = |p: &Pod| {
            shared::selector::matches(selector, p.metadata.labels.as_ref()).unwrap_or(false)
        };
        let deleting = job.metadata.deletion_timestamp.is_some();
        let mut claimed = Vec::new();
        for p in self.pods.by_index(INDEX_CONTROLLER_UID, &uid) {
            if matches(&p) || deleting {
                claimed.push(p);
            } else {
                act::release_pod(&self.client, job, &p)
                    .await
                    .map_err(api(format!("releasing pod {}", object_key(p.as_ref()))))?;
            }
        }
        let candidates: Vec<Arc<Pod>> = self
            .pods
            .by_index(INDEX_ORPHAN_NAMESPACE, &ns)
            .into_iter()
            .filter(|p| !pods::deleting(p) && matches(p))
            .collect();
        if candidates.is_empty() || deleting {
            return Ok(claimed);
        }
        // Adopt only if a live read shows the same Job, not being deleted.
        let fresh = act::get_job(&self.client, &ns, &job.name_any())
            .await
            .map_err(api(format!("re-reading job {ns}/{}", job.name_any())))?;
        if fresh.metadata.uid != job.metadata.uid || fresh.metadata.deletion_timestamp.is_some() {
            return Ok(claimed);
        }
        for p in candidates {
            match act::adopt_pod(&self.client, job, &p).await {
                Ok(()) => {
                    let mut copy = (*p).clone();
                    if !pods::has_tracking_finalizer(&copy) {
                        copy.metadata
                            .finalizers
                            .get_or_insert_with(Vec::new)
                            .push(pods::TRACKING_FINALIZER.into());
                    }
                    claimed.push(Arc::new(copy));
                }
                Err(e) if act::is_not_found(&e) => {}
                Err(e) => return Err(api(format!("adopting pod {}", object_key(p.as_ref())))(e)),
            }
        }
        Ok(claimed)
    }

    async fn sync_unfinished(
        &self,
        job: &Arc<Job>,
        action_label: &mut &'static str,
    ) -> Result<Next, Error> {
        let uid = uid_of(job);
        // JR-20: expectations are read before pods are listed.
        let satisfied = self.expectations.satisfied(&uid);
        let pods = self.claim_pods(job).await?;
        let obs = Observed {
            job,
            pods,
            expectations_satisfied: satisfied,
            expected_rm_finalizers: self
                .rm_finalizers
                .lock()
                .expect("lock")
                .get(&uid)
                .cloned()
                .unwrap_or_default(),
            backoff: self
                .backoff
                .lock()
                .expect("lock")
                .get(&uid)
                .copied()
                .unwrap_or_default(),
            now: Timestamp::now(),
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
            requeue(d.max(BATCH_PERIOD));
        }
        let (needs_update, event) = plan::conclude(&obs, &mut eval, outcome);
        if let Some((reason, note)) = event {
            self.events.normal(&job_ref(job), reason, "Sync", note);
        }
        let tracking = plan::track(&obs, &eval, needs_update);
        match self.flush(&obs, &eval, tracking).await {
            Err(FlushError::Finalizers(e)) => {
                // B-4: rejected finalizer removals retry on their own cadence (1 s doubling to
                // 10 s), not the queue's (up to 60 s), so pods are released soon after an
                // admission webhook stops rejecting. Status progress was already written.
                let n = {
                    let mut f = self.rm_failures.lock().expect("lock");
                    let n = f.entry(uid.clone()).or_insert(0);
                    *n = n.saturating_add(1);
                    *n
                };
                tracing::warn!(error = %e, attempt = n, "tracking finalizer removal failed; will retry");
                requeue(shared::ratelimit::backoff_delay(
                    RM_RETRY_BASE,
                    RM_RETRY_MAX,
                    n - 1,
                ));
                return match manage_err {
                    Some(e) => Err(e),
                    None => Ok(next),
                };
            }
            Err(FlushError::Other(e)) => return Err(e),
            Ok(()) => {
                self.rm_failures.lock().expect("lock").remove(&uid);
            }
        }
        match manage_err {
            Some(e) => Err(e),
            None => Ok(next),
        }
    }

    /// Performs the pod action; returns what happened and the first error.
    async fn perform(
        &self,
        job: &Job,
        eval: &Evaluation,
        action_label: &mut &'static str,
    ) -> (Outcome, Option<Error>) {
        let uid = uid_of(job);
        let ns = job.namespace().unwrap_or_default();
        let mut out = Outcome::default();
        match &eval.action {
            PodAction::Skip | PodAction::Track => {
                if matches!(eval.action, PodAction::Track) {
                    *action_label = "tracking";
                }
                (out, None)
            }
            PodAction::WaitBackoff(_) => {
                *action_label = "pods_created";
                (out, None)
            }
            PodAction::DeleteActive(list) => {
                // JR-48: finalizers stay; tracking counts these pods when they terminate.
                let results = join_all(
                    list.iter()
                        .map(|p| act::delete_pod(&self.client, &ns, pods::name(p))),
                )
                .await;
                let mut err = None;
                for (p, r) in list.iter().zip(results) {
                    match r {
                        Ok(()) => {
                            out.deleted += 1;
                            self.events.normal(
                                &job_ref(job),
                                "SuccessfulDelete",
                                "DeletePod",
                                format!("Deleted pod: {}", pods::name(p)),
                            );
                        }
                        Err(e) => {
                            out.delete_failed = true;
                            self.events.warning(
                                &job_ref(job),
                                "FailedDelete",
                                "DeletePod",
                                format!("Error deleting: {e}"),
                            );
                            err.get_or_insert(api(format!("deleting pod {ns}/{}", pods::name(p)))(
                                e,
                            ));
                        }
                    }
                    if pods::ready(p) {
                        out.deleted_ready += 1;
                    }
                }
                (out, err)
            }
            PodAction::Remove(list) => {
                *action_label = "pods_deleted";
                self.expectations.expect_deletions(&uid, list.len() as i64);
                let ns = ns.as_str();
                let results = join_all(list.iter().map(|p| async move {
                    act::remove_tracking_finalizer(&self.client, p).await?;
                    act::delete_pod(&self.client, ns, pods::name(p)).await
                }))
                .await;
                let mut err = None;
                for (p, r) in list.iter().zip(results) {
                    match r {
                        Ok(()) => {
                            out.deleted += 1;
                            if pods::ready(p) {
                                out.deleted_ready += 1;
                            }
                            self.events.normal(
                                &job_ref(job),
                                "SuccessfulDelete",
                                "DeletePod",
                                format!("Deleted pod: {}", pods::name(p)),
                            );
                        }
                        Err(e) => {
                            // The informer will not observe this deletion.
                            self.expectations.deletion_observed(&uid);
                            self.events.warning(
                                &job_ref(job),
                                "FailedDelete",
                                "DeletePod",
                                format!("Error deleting: {e}"),
                            );
                            err.get_or_insert(api(format!("deleting pod {ns}/{}", pods::name(p)))(
                                e,
                            ));
                        }
                    }
                }
                (out, err)
            }
            PodAction::Create(list) => {
                *action_label = "pods_created";
                self.create_pods(job, list, eval.creation_reason).await
            }
        }
    }

    /// JR-18: creates in batches of 1, 2, 4, …; the rest are skipped after a failing batch.
    async fn create_pods(
        &self,
        job: &Job,
        list: &[plan::NewPod],
        reason: &'static str,
    ) -> (Outcome, Option<Error>) {
        let uid = uid_of(job);
        let mut out = Outcome::default();
        self.expectations.expect_creations(&uid, list.len() as i64);
        let (mut ok, mut failed) = (0u64, 0u64);
        let mut first_err = None;
        let mut start = 0;
        let mut batch = 1usize;
        while start < list.len() {
            let end = (start + batch).min(list.len());
            let results = join_all(
                list[start..end]
                    .iter()
                    .map(|n| act::create_pod(&self.client, job, n)),
            )
            .await;
            let mut batch_failed = false;
            for r in results {
                match r {
                    Ok(p) => {
                        ok += 1;
                        self.events.normal(
                            &job_ref(job),
                            "SuccessfulCreate",
                            "CreatePod",
                            format!("Created pod: {}", pods::name(&p)),
                        );
                    }
                    // The namespace is going away: nothing more will be created, nothing to say.
                    Err(e) if act::is_namespace_terminating(&e) => {}
                    Err(e) => {
                        failed += 1;
                        batch_failed = true;
                        out.not_created += 1;
                        self.expectations.creation_observed(&uid);
                        self.events.warning(
                            &job_ref(job),
                            "FailedCreate",
                            "CreatePod",
                            format!("Error creating: {e}"),
                        );
                        first_err.get_or_insert(api(format!(
                            "creating a pod for job {}",
                            object_key(job)
                        ))(e));
                    }
                }
            }
            start = end;
            if batch_failed && start < list.len() {
                let skipped = (list.len() - start) as i64;
                out.not_created += skipped as i32;
                self.expectations.lower(&uid, skipped, 0);
                break;
            }
            batch *= 2;
        }
        // B-6: each attempt counted once.
        for (status, n) in [("succeeded", ok), ("failed", failed)] {
            if n > 0 {
                self.metrics
                    .pods_creation
                    .get_or_create(&CreationLabels {
                        reason: reason.into(),
                        status: status.into(),
                    })
                    .inc_by(n);
            }
        }
        (out, first_err)
    }

    /// B-2 then JR-54: checks the status and PUTs it over `current`.
    async fn write_status(&self, current: &Job, status: &JobStatus) -> Result<Job, Error> {
        let key = object_key(current);
        let violations = status::violations(current, status);
        if !violations.is_empty() {
            self.metrics.status_writes_refused.inc();
            tracing::error!(job = %key, ?violations, "refusing an invalid status write (controller bug)");
            return Err(Error::InvalidStatus {
                key,
                violations: violations.join("; "),
            });
        }
        let written = act::replace_status(&self.client, current, status.clone())
            .await
            .map_err(api(format!("writing status of job {key}")))?;
        if let Some(rv) = written
            .metadata
            .resource_version
            .as_deref()
            .and_then(|r| r.parse().ok())
        {
            self.written
                .lock()
                .expect("lock")
                .insert(uid_of(&written), rv);
        }
        Ok(written)
    }

    fn record_pods_finished(&self, job: &Job, old: &JobStatus, new: &JobStatus) {
        let mode = plan::completion_mode(job);
        let completions = job.spec.as_ref().and_then(|s| s.completions).unwrap_or(0);
        let count = |s: &Option<String>| {
            indexes::Intervals::parse(s.as_deref().unwrap_or_default(), completions).total()
        };
        let succeeded = if plan::is_indexed(job) {
            let per_index = job
                .spec
                .as_ref()
                .is_some_and(|s| s.backoff_limit_per_index.is_some());
            let label = if per_index { "perIndex" } else { "global" };
            let diff = count(&new.completed_indexes) - count(&old.completed_indexes);
            if diff > 0 {
                self.metrics
                    .finished_indexes
                    .get_or_create(&IndexesLabels {
                        status: "succeeded".into(),
                        backoffLimit: label.into(),
                    })
                    .inc_by(diff as u64);
            }
            let fdiff = count(&new.failed_indexes) - count(&old.failed_indexes);
            if per_index && fdiff > 0 {
                self.metrics
                    .finished_indexes
                    .get_or_create(&IndexesLabels {
                        status: "failed".into(),
                        backoffLimit: label.into(),
                    })
                    .inc_by(fdiff as u64);
            }
            diff
        } else {
            new.succeeded.unwrap_or(0) - old.succeeded.unwrap_or(0)
        };
        let failed = new.failed.unwrap_or(0) - old.failed.unwrap_or(0);
        for (result, n) in [("succeeded", succeeded), ("failed", failed)] {
            if n > 0 {
                self.metrics
                    .pods_finished
                    .get_or_create(&PodsFinishedLabels {
                        completion_mode: mode.into(),
                        result: result.into(),
                    })
                    .inc_by(n as u64);
            }
        }
    }

    /// JR-26 steps 5–8.
    async fn flush(
        &self,
        obs: &Observed<'_>,
        eval: &Evaluation,
        t: plan::Tracking,
    ) -> Result<(), FlushError> {
        let job = obs.job;
        let uid = uid_of(job);
        let mut current = job.clone();
        let mut status = t.status;
        let mut needs_flush = t.needs_flush;
        let mut counters = job.status.clone().unwrap_or_default();
        if needs_flush {
            current = self.write_status(&current, &status).await?;
            // Only after the write is durable is the backoff record moved on (JR-26 step 5).
            self.backoff
                .lock()
                .expect("lock")
                .insert(uid.clone(), eval.new_backoff);
            self.record_pods_finished(job, &counters, &status);
            counters = status.clone();
            needs_flush = false;
        }
        for (action, n) in &t.policy_actions {
            self.metrics
                .policy_actions
                .get_or_create(&ActionLabel {
                    action: (*action).into(),
                })
                .inc_by(*n);
        }
        let mut with_finalizer = t.uids_with_finalizer;
        let mut rm_err = None;
        if !t.remove_finalizers.is_empty() {
            {
                let mut rm = self.rm_finalizers.lock().expect("lock");
                let set = rm.entry(uid.clone()).or_default();
                set.extend(t.remove_finalizers.iter().map(|p| pods::uid(p).to_string()));
            }
            let results = join_all(
                t.remove_finalizers
                    .iter()
                    .map(|p| act::remove_tracking_finalizer(&self.client, p)),
            )
            .await;
            let mut failures = Vec::new();
            for (p, r) in t.remove_finalizers.iter().zip(results.iter()) {
                match r {
                    Ok(()) => {
                        with_finalizer.remove(pods::uid(p));
                    }
                    Err(e) => {
                        self.finalizer_removal_observed(&uid, pods::uid(p));
                        failures.push((p.as_ref(), e));
                    }
                }
            }
            if !failures.is_empty() {
                self.finalizer_failure(Some(job), &failures);
                let (p, e) = failures[0];
                rm_err = Some(Error::Api {
                    what: format!("removing the tracking finalizer of pod {}", pods::name(p)),
                    source: clone_error(e),
                });
            }
        }
        if plan::clean_uncounted(&mut status, &with_finalizer) {
            needs_flush = true;
        }
        if let Some(e) = rm_err {
            if needs_flush {
                self.write_status(&current, &status).await?;
                self.record_pods_finished(job, &counters, &status);
            }
            return Err(FlushError::Finalizers(e));
        }
        let now = Timestamp::now();
        let finished = !t.reached_max_uncounted
            && plan::enact_finished(&mut status, t.final_condition.as_ref(), now);
        if finished {
            needs_flush = true;
        }
        if needs_flush {
            self.write_status(&current, &status).await?;
            self.record_pods_finished(job, &counters, &status);
            if finished && let Some(c) = &t.final_condition {
                self.finished.lock().expect("lock").insert(uid);
                self.record_finished(job, &status, c);
            }
        }
        Ok(())
    }

    /// JR-51.
    fn record_finished(
        &self,
        job: &Job,
        status: &JobStatus,
        c: &k8s_openapi::api::batch::v1::JobCondition,
    ) {
        let reason = c.reason.clone().unwrap_or_default();
        let mode = plan::completion_mode(job);
        let result = if c.type_ == plan::COMPLETE {
            let completions = job.spec.as_ref().and_then(|s| s.completions);
            if completions.is_some_and(|n| status.succeeded.unwrap_or(0) > n) {
                self.events.warning(
                    &job_ref(job),
                    "TooManySucceededPods",
                    "Sync",
                    "Too many succeeded pods running after completion count reached",
                );
            }
            self.events
                .normal(&job_ref(job), "Completed", "Sync", "Job completed");
            "succeeded"
        } else {
            self.events.warning(
                &job_ref(job),
                &reason,
                "Sync",
                c.message.clone().unwrap_or_default(),
            );
            "failed"
        };
        self.metrics
            .jobs_finished
            .get_or_create(&FinishedLabels {
                completion_mode: mode.into(),
                result: result.into(),
                reason,
            })
            .inc();
    }
}

/// Finalizer removals that failed are retried on their own cadence (B-4).
enum FlushError {
    Finalizers(Error),
    Other(Error),
}

impl From<Error> for FlushError {
    fn from(e: Error) -> Self {
        FlushError::Other(e)
    }
}

/// kube::Error is not Clone; keep what matters for the message and retry classification.
fn clone_error(e: &kube::Error) -> kube::Error {
    match e {
        kube::Error::Api(s) => kube::Error::Api(s.clone()),
        other => kube::Error::Service(other.to_string().into()),
    }
}
