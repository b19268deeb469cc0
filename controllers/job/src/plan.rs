//! Pure decisions of one Job sync, in upstream's order (JR-47):
//!
//! 1. [`evaluate`]: counters, the pending finishing condition and the pod action;
//! 2. the caller performs the pod action and reports an [`Outcome`];
//! 3. [`conclude`]: completion by counts, the Suspended condition, active/ready/terminating;
//! 4. [`track`]: the finalizer protocol's first status write and the pods whose finalizer goes;
//! 5. [`clean_uncounted`] folds released pods into the counters, [`enact_finished`] adds the
//!    terminal condition when nothing is left in flight.
//!
//! Time is a parameter (`now`); nothing here reads a clock or the API.

use crate::indexes::Intervals;
use crate::pods;
use crate::policy::{self, Action, BackoffRecord};
use k8s_openapi::api::batch::v1::{Job, JobCondition, JobSpec, JobStatus, UncountedTerminatedPods};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use shared::cache::pod::Pod;
use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

/// Upstream's `MaxUncountedPods` and `MaxPodCreateDeletePerSync`.
pub const MAX_UNCOUNTED_PODS: usize = 500;
pub const MAX_POD_CREATE_DELETE_PER_SYNC: usize = 500;

pub const FAILURE_TARGET: &str = "FailureTarget";
pub const SUCCESS_CRITERIA_MET: &str = "SuccessCriteriaMet";
pub const COMPLETE: &str = "Complete";
pub const FAILED: &str = "Failed";
pub const SUSPENDED: &str = "Suspended";

pub fn spec(job: &Job) -> JobSpec {
    job.spec.clone().unwrap_or_default()
}

pub fn is_indexed(job: &Job) -> bool {
    job.spec.as_ref().and_then(|s| s.completion_mode.as_deref()) == Some("Indexed")
}

pub fn completion_mode(job: &Job) -> &'static str {
    if is_indexed(job) {
        "Indexed"
    } else {
        "NonIndexed"
    }
}

/// `None` when the mode is set to something this version does not know (JR-9).
pub fn known_completion_mode(job: &Job) -> bool {
    matches!(
        job.spec.as_ref().and_then(|s| s.completion_mode.as_deref()),
        None | Some("Indexed") | Some("NonIndexed")
    )
}

pub fn suspended(job: &Job) -> bool {
    job.spec.as_ref().and_then(|s| s.suspend) == Some(true)
}

fn only_replace_failed(job: &Job) -> bool {
    job.spec
        .as_ref()
        .and_then(|s| s.pod_replacement_policy.as_deref())
        == Some("Failed")
}

fn has_backoff_limit_per_index(job: &Job) -> bool {
    job.spec
        .as_ref()
        .is_some_and(|s| s.backoff_limit_per_index.is_some())
}

fn completions(job: &Job) -> Option<i32> {
    job.spec.as_ref().and_then(|s| s.completions)
}

/// Indexed Jobs always have completions (API validation); 0 guards a malformed object.
fn indexed_completions(job: &Job) -> i32 {
    completions(job).unwrap_or(0)
}

pub fn conditions(job: &Job) -> &[JobCondition] {
    job.status
        .as_ref()
        .and_then(|s| s.conditions.as_deref())
        .unwrap_or_default()
}

pub fn condition_true(conds: &[JobCondition], type_: &str) -> bool {
    conds.iter().any(|c| c.type_ == type_ && c.status == "True")
}

/// JR-6: `Complete=True` or `Failed=True`.
pub fn finished(job: &Job) -> bool {
    let c = conditions(job);
    condition_true(c, COMPLETE) || condition_true(c, FAILED)
}

pub fn new_condition(
    type_: &str,
    status: &str,
    reason: &str,
    message: &str,
    now: Timestamp,
) -> JobCondition {
    JobCondition {
        type_: type_.into(),
        status: status.into(),
        reason: Some(reason.into()),
        message: Some(message.into()),
        last_probe_time: Some(Time(now)),
        last_transition_time: Some(Time(now)),
    }
}

/// The terminal condition (`Failed`, `Complete`) that follows an interim one, with its reason
/// and message.
fn successor(c: &JobCondition, type_: &str, now: Timestamp) -> JobCondition {
    new_condition(
        type_,
        "True",
        c.reason.as_deref().unwrap_or_default(),
        c.message.as_deref().unwrap_or_default(),
        now,
    )
}

/// Upstream `ensureJobConditionStatus` (JR-50): rewrite an existing condition only when status,
/// reason or message change; never add a new False condition. Returns whether it changed.
pub fn ensure_condition(
    conds: &mut Vec<JobCondition>,
    type_: &str,
    status: &str,
    reason: &str,
    message: &str,
    now: Timestamp,
) -> bool {
    if let Some(c) = conds.iter_mut().find(|c| c.type_ == type_) {
        if c.status != status
            || c.reason.as_deref() != Some(reason)
            || c.message.as_deref() != Some(message)
        {
            *c = new_condition(type_, status, reason, message, now);
            return true;
        }
        return false;
    }
    if status != "False" {
        conds.push(new_condition(type_, status, reason, message, now));
        return true;
    }
    false
}

/// JR-27: a pod counts as failed when its phase is Failed or, unless only failed pods are
/// replaced, when it is being deleted without having succeeded.
pub fn pod_failed(pod: &Pod, job: &Job) -> bool {
    if pods::failed_phase(pod) {
        return true;
    }
    if only_replace_failed(job) {
        return false;
    }
    pods::deleting(pod) && !pods::succeeded(pod)
}

/// What the sync observed, from the caches and the controller's memory.
pub struct Observed<'a> {
    pub job: &'a Job,
    /// Pods claimed for the Job (adopted ones already carry the finalizer in this copy).
    pub pods: Vec<Arc<Pod>>,
    pub expectations_satisfied: bool,
    /// Pod UIDs whose finalizer removal was sent and not yet observed (JR-22).
    pub expected_rm_finalizers: HashSet<String>,
    pub backoff: BackoffRecord,
    pub now: Timestamp,
    /// MutableSchedulingDirectivesForSuspendedJobs (beta in 1.37, on): JR-44 clears the
    /// startTime of a Job it suspends.
    pub clear_start_time_on_suspend: bool,
}

/// One pod to create.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NewPod {
    pub index: Option<i32>,
    /// JR-14: (`job-index-failure-count`, `job-index-ignored-failure-count`) for
    /// backoffLimitPerIndex Jobs.
    pub failure_counts: Option<(i32, i32)>,
}

#[derive(Clone, Debug, PartialEq)]
pub enum PodAction {
    /// Pod management does not run this sync (expectations unsatisfied, Job being deleted).
    Skip,
    /// A finishing condition is pending: DELETE every active pod, finalizer kept (JR-48).
    DeleteActive(Vec<Arc<Pod>>),
    /// Suspend or too many pods: remove the finalizer, then DELETE (JR-16, JR-44).
    Remove(Vec<Arc<Pod>>),
    /// Pods are wanted but backoff has not passed: requeue after this long (JR-34, JR-19).
    WaitBackoff(Duration),
    Create(Vec<NewPod>),
    /// Nothing to create or delete.
    Track,
}

/// Everything [`evaluate`] decided.
pub struct Evaluation {
    pub status: JobStatus,
    pub uncounted_succeeded: HashSet<String>,
    pub uncounted_failed: HashSet<String>,
    pub active_pods: Vec<Arc<Pod>>,
    pub ready: i32,
    pub terminating: i32,
    pub succeeded: i32,
    pub failed: i32,
    pub new_backoff: BackoffRecord,
    /// The pending finishing condition: `FailureTarget`, `SuccessCriteriaMet` or (from an
    /// existing `FailureTarget`) `Failed`.
    pub finished: Option<JobCondition>,
    /// JR-3: requeue for the remaining active deadline.
    pub deadline_requeue: Option<Duration>,
    pub prev_succeeded_indexes: Intervals,
    pub succeeded_indexes: Intervals,
    pub failed_indexes: Option<Intervals>,
    pub delayed_deletion: HashMap<i32, Arc<Pod>>,
    pub action: PodAction,
    /// `job_pods_creation_total` reason for this sync's creates.
    pub creation_reason: &'static str,
}

fn uncounted(status: &JobStatus) -> (HashSet<String>, HashSet<String>) {
    let u = status.uncounted_terminated_pods.clone().unwrap_or_default();
    (
        u.succeeded.unwrap_or_default().into_iter().collect(),
        u.failed.unwrap_or_default().into_iter().collect(),
    )
}

/// Pods with the finalizer (not awaiting its removal), not in `uncounted`, with a valid index
/// for Indexed Jobs, passing `filter` (upstream `getValidPodsWithFilter`).
fn valid_pods<'p>(
    obs: &'p Observed<'_>,
    uncounted: &HashSet<String>,
    filter: impl Fn(&Pod) -> bool,
) -> Vec<&'p Arc<Pod>> {
    let indexed = is_indexed(obs.job);
    let completions = indexed_completions(obs.job);
    obs.pods
        .iter()
        .filter(|p| {
            pods::has_tracking_finalizer(p)
                && !uncounted.contains(pods::uid(p))
                && !obs.expected_rm_finalizers.contains(pods::uid(p))
                && (!indexed || pods::completion_index(p).is_some_and(|i| i < completions))
                && filter(p)
        })
        .collect()
}

fn indexes_of<'a>(pods: impl IntoIterator<Item = &'a Arc<Pod>>) -> Vec<i32> {
    pods.into_iter()
        .filter_map(|p| pods::completion_index(p))
        .collect()
}

/// JR-37: the index is failed by this pod.
fn index_failed_by(job: &Job, pod: &Pod) -> bool {
    if !pod_failed(pod, job) {
        return false;
    }
    let spec = job.spec.as_ref();
    let m = policy::match_pod_failure_policy(spec.and_then(|s| s.pod_failure_policy.as_ref()), pod);
    if m.action == Some(Action::FailIndex) {
        return true;
    }
    let limit = spec.and_then(|s| s.backoff_limit_per_index).unwrap_or(0);
    m.counts && pods::index_failure_count(pod) >= limit
}

/// The sync's first half: counters, finishing condition and the pod action.
pub fn evaluate(obs: &Observed<'_>) -> Evaluation {
    let job = obs.job;
    let spec = spec(job);
    let now = obs.now;
    let mut status = job.status.clone().unwrap_or_default();
    status
        .uncounted_terminated_pods
        .get_or_insert_with(UncountedTerminatedPods::default);
    let (unc_succeeded, unc_failed) = uncounted(&status);
    let active_pods: Vec<Arc<Pod>> = obs
        .pods
        .iter()
        .filter(|p| pods::active(p))
        .cloned()
        .collect();
    let ready = active_pods.iter().filter(|p| pods::ready(p)).count() as i32;
    let terminating = obs.pods.iter().filter(|p| pods::terminating(p)).count() as i32;

    // JR-29: the stored totals plus newly finished finalizer pods plus uncounted UIDs.
    let new_succeeded = valid_pods(obs, &unc_succeeded, pods::succeeded);
    let new_failed = valid_pods(obs, &unc_failed, |p| pod_failed(p, job));
    let failure_policy = spec.pod_failure_policy.as_ref();
    let counted_new_failed = new_failed
        .iter()
        .filter(|p| policy::match_pod_failure_policy(failure_policy, p).counts)
        .count() as i32;
    // A status writer may have left the counters anywhere up to i32::MAX (validation only asks
    // for ≥ 0): newly counted pods saturate rather than overflow.
    let mut succeeded = status
        .succeeded
        .unwrap_or(0)
        .saturating_add(new_succeeded.len() as i32)
        .saturating_add(unc_succeeded.len() as i32);
    let failed = status
        .failed
        .unwrap_or(0)
        .saturating_add(counted_new_failed)
        .saturating_add(unc_failed.len() as i32);

    // JR-43: startTime on the first sync of an unsuspended Job.
    if status.start_time.is_none() && !suspended(job) {
        status.start_time = Some(Time(now));
    }
    let new_backoff = {
        let s: Vec<&Pod> = new_succeeded.iter().map(|p| p.as_ref()).collect();
        let f: Vec<&Pod> = new_failed.iter().map(|p| p.as_ref()).collect();
        obs.backoff.next(&s, &f)
    };

    let (finished, deadline_requeue) = job_level_finish(obs, &spec, &status, failed);
    let (indexes, finished) = if is_indexed(job) {
        let (indexes, finished) = index_progress(obs, &spec, &status, &active_pods, finished);
        // JR-25: Indexed Jobs count succeeded indexes, not pods.
        succeeded = indexes.succeeded.total();
        (indexes, finished)
    } else {
        (IndexProgress::default(), finished)
    };

    let mut eval = Evaluation {
        status,
        uncounted_succeeded: unc_succeeded,
        uncounted_failed: unc_failed,
        active_pods,
        ready,
        terminating,
        succeeded,
        failed,
        new_backoff,
        finished,
        deadline_requeue,
        prev_succeeded_indexes: indexes.prev_succeeded,
        succeeded_indexes: indexes.succeeded,
        failed_indexes: indexes.failed,
        delayed_deletion: indexes.delayed_deletion,
        action: PodAction::Skip,
        creation_reason: creation_reason(job, failed, terminating),
    };
    eval.action = pod_action(obs, &eval);
    eval
}

/// JR-47 (1)–(5), the rules that look at the whole Job: the pending finishing condition, and
/// the requeue for the remaining active deadline when none is pending (JR-3).
fn job_level_finish(
    obs: &Observed<'_>,
    spec: &JobSpec,
    status: &JobStatus,
    failed: i32,
) -> (Option<JobCondition>, Option<Duration>) {
    if let Some(c) = standing_finish(obs, spec, status) {
        return (Some(c), None);
    }
    // (4) JR-32, JR-33: backoff limit.
    let backoff_limit = spec.backoff_limit.unwrap_or(6);
    if failed > backoff_limit || past_backoff_limit_on_failure(obs.job, &obs.pods, backoff_limit) {
        let c = new_condition(
            FAILURE_TARGET,
            "True",
            "BackoffLimitExceeded",
            "Job has reached the specified backoff limit",
            obs.now,
        );
        return (Some(c), None);
    }
    // (5) JR-42: active deadline, never while suspended.
    let Some(ads) = spec.active_deadline_seconds.filter(|_| !suspended(obs.job)) else {
        return (None, None);
    };
    let now = obs.now;
    let start = status.start_time.as_ref().map_or(now, |t| t.0);
    let elapsed = Duration::try_from(now.duration_since(start)).unwrap_or(Duration::ZERO);
    let allowed = Duration::from_secs(ads.max(0) as u64);
    if elapsed < allowed {
        return (None, Some(allowed.saturating_sub(elapsed)));
    }
    let c = new_condition(
        FAILURE_TARGET,
        "True",
        "DeadlineExceeded",
        "Job was active longer than specified deadline",
        now,
    );
    (Some(c), None)
}

/// JR-47 (1)–(3): a finish already decided by an earlier sync, or a FailJob rule (JR-36).
fn standing_finish(obs: &Observed<'_>, spec: &JobSpec, status: &JobStatus) -> Option<JobCondition> {
    let conds = status.conditions.as_deref().unwrap_or_default();
    // (1) An existing SuccessCriteriaMet stands.
    if let Some(c) = conds
        .iter()
        .find(|c| c.type_ == SUCCESS_CRITERIA_MET && c.status == "True")
    {
        return Some(c.clone());
    }
    // (2) An existing FailureTarget becomes Failed.
    if let Some(ft) = conds
        .iter()
        .find(|c| c.type_ == FAILURE_TARGET && c.status == "True")
    {
        return Some(successor(ft, FAILED, obs.now));
    }
    // (3) FailJob.
    let failure_policy = spec.pod_failure_policy.as_ref();
    let msg = obs
        .pods
        .iter()
        .filter(|p| pod_failed(p, obs.job))
        .find_map(|p| policy::match_pod_failure_policy(failure_policy, p).fail_job_message)?;
    Some(new_condition(
        FAILURE_TARGET,
        "True",
        "PodFailurePolicy",
        &msg,
        obs.now,
    ))
}

/// An Indexed Job's index sets, as this sync sees them.
#[derive(Default)]
struct IndexProgress {
    prev_succeeded: Intervals,
    succeeded: Intervals,
    /// With backoffLimitPerIndex only.
    failed: Option<Intervals>,
    delayed_deletion: HashMap<i32, Arc<Pod>>,
}

/// JR-25, JR-37, JR-41: the index sets, and JR-47 (6)–(7): the per-index and successPolicy
/// finishes, which apply only when `finished` (the job-level one) is `None`.
fn index_progress(
    obs: &Observed<'_>,
    spec: &JobSpec,
    status: &JobStatus,
    active_pods: &[Arc<Pod>],
    mut finished: Option<JobCondition>,
) -> (IndexProgress, Option<JobCondition>) {
    let job = obs.job;
    let completions = indexed_completions(job);
    let prev_succeeded = Intervals::parse(
        status.completed_indexes.as_deref().unwrap_or_default(),
        completions,
    );
    let succeeded = prev_succeeded.with_indexes(obs.pods.iter().filter_map(|p| {
        pods::completion_index(p)
            .filter(|ix| pods::succeeded(p) && *ix < completions && pods::has_tracking_finalizer(p))
    }));
    let mut progress = IndexProgress {
        prev_succeeded,
        succeeded,
        ..IndexProgress::default()
    };
    if has_backoff_limit_per_index(job) {
        let prev = Intervals::parse(
            status.failed_indexes.as_deref().unwrap_or_default(),
            completions,
        );
        let fi = prev.with_indexes(obs.pods.iter().filter_map(|p| {
            pods::completion_index(p).filter(|ix| {
                *ix < completions && pods::has_tracking_finalizer(p) && index_failed_by(job, p)
            })
        }));
        if finished.is_none() {
            finished = failed_indexes_finish(spec, &fi, &progress.succeeded, completions, obs.now);
        }
        progress.delayed_deletion =
            pods_with_delayed_deletion(obs, active_pods, &progress.succeeded, &fi);
        progress.failed = Some(fi);
    }
    // (7) successPolicy.
    if finished.is_none()
        && let Some(msg) = policy::match_success_policy(
            spec.success_policy.as_ref(),
            completions,
            &progress.succeeded,
        )
    {
        finished = Some(new_condition(
            SUCCESS_CRITERIA_MET,
            "True",
            "SuccessPolicy",
            &msg,
            obs.now,
        ));
    }
    (progress, finished)
}

/// JR-47 (6), JR-37: too many failed indexes, or every index done with some failed.
fn failed_indexes_finish(
    spec: &JobSpec,
    failed: &Intervals,
    succeeded: &Intervals,
    completions: i32,
    now: Timestamp,
) -> Option<JobCondition> {
    if spec.max_failed_indexes.is_some_and(|m| failed.total() > m) {
        Some(new_condition(
            FAILURE_TARGET,
            "True",
            "MaxFailedIndexesExceeded",
            "Job has exceeded the specified maximal number of failed indexes",
            now,
        ))
    } else if failed.total() > 0 && failed.total().saturating_add(succeeded.total()) >= completions
    {
        Some(new_condition(
            FAILURE_TARGET,
            "True",
            "FailedIndexes",
            "Job has failed indexes",
            now,
        ))
    } else {
        None
    }
}

/// The `job_pods_creation_total` reason for this sync's creates.
fn creation_reason(job: &Job, failed: i32, terminating: i32) -> &'static str {
    if only_replace_failed(job) && failed > 0 {
        "recreate_failed"
    } else if failed > 0 || terminating > 0 {
        "recreate_terminating_or_failed"
    } else {
        "new"
    }
}

/// JR-48 and JR-20: a pending finish deletes the active pods; otherwise pods are managed only
/// with expectations met and the Job not being deleted.
fn pod_action(obs: &Observed<'_>, eval: &Evaluation) -> PodAction {
    if eval.finished.is_some() {
        PodAction::DeleteActive(eval.active_pods.clone())
    } else if obs.expectations_satisfied && obs.job.metadata.deletion_timestamp.is_none() {
        manage(obs, eval)
    } else {
        PodAction::Skip
    }
}

/// JR-33: restarts of Pending/Running pods against the backoff limit for `OnFailure` pods.
fn past_backoff_limit_on_failure(job: &Job, pods: &[Arc<Pod>], limit: i32) -> bool {
    let on_failure = job
        .spec
        .as_ref()
        .and_then(|s| s.template.spec.as_ref())
        .map(|s| s.restart_policy.as_deref() == Some("OnFailure"))
        .unwrap_or(false);
    if !on_failure {
        return false;
    }
    let restarts: i64 = pods
        .iter()
        .filter(|p| matches!(pods::phase(p), "Running" | "Pending"))
        .map(|p| pods::restart_count(p))
        .sum();
    if limit == 0 {
        restarts > 0
    } else {
        restarts >= i64::from(limit)
    }
}

/// JR-28: per index, the last failed pod of an unfinished, inactive index keeps its finalizer
/// until its replacement exists (it carries the failure counts forward).
fn pods_with_delayed_deletion(
    obs: &Observed<'_>,
    active_pods: &[Arc<Pod>],
    succeeded: &Intervals,
    failed: &Intervals,
) -> HashMap<i32, Arc<Pod>> {
    let active: HashSet<i32> = indexes_of(active_pods).into_iter().collect();
    let mut out: HashMap<i32, Arc<Pod>> = HashMap::new();
    for p in valid_pods(obs, &HashSet::new(), |p| pod_failed(p, obs.job)) {
        let Some(ix) = pods::completion_index(p) else {
            continue;
        };
        if succeeded.has(ix) || failed.has(ix) || active.contains(&ix) {
            continue;
        }
        match out.get(&ix) {
            Some(last)
                if !(pods::index_absolute_failure_count(last)
                    <= pods::index_absolute_failure_count(p)
                    && pods::finished_time(p) >= pods::finished_time(last)) => {}
            _ => {
                out.insert(ix, Arc::clone(p));
            }
        }
    }
    out
}

/// JR-15..JR-18: what pod management does (upstream `manageJob`), before any API call.
fn manage(obs: &Observed<'_>, eval: &Evaluation) -> PodAction {
    let job = obs.job;
    let spec = spec(job);
    let active = eval.active_pods.len() as i32;
    if suspended(job) {
        return PodAction::Remove(pods_for_removal(
            job,
            &eval.active_pods,
            eval.active_pods.len(),
        ));
    }
    let parallelism = spec.parallelism.unwrap_or(1);
    let want = match spec.completions {
        None if eval.succeeded > 0 => active,
        None => parallelism,
        Some(c) => (c - eval.succeeded).clamp(0, parallelism.max(0)),
    };
    let rm_at_least = (active - want).max(0) as usize;
    let mut rm = pods_for_removal(job, &eval.active_pods, rm_at_least);
    rm.truncate(MAX_POD_CREATE_DELETE_PER_SYNC);
    if !rm.is_empty() {
        return PodAction::Remove(rm);
    }
    let terminating = if only_replace_failed(job) {
        eval.terminating
    } else {
        0
    };
    let diff = want - terminating - active;
    if diff <= 0 {
        return PodAction::Track;
    }
    if !has_backoff_limit_per_index(job) {
        let remaining = eval.new_backoff.remaining(obs.now);
        if !remaining.is_zero() {
            return PodAction::WaitBackoff(remaining);
        }
    }
    let diff = (diff as usize).min(MAX_POD_CREATE_DELETE_PER_SYNC);
    if !is_indexed(job) {
        return PodAction::Create(vec![
            NewPod {
                index: None,
                failure_counts: None
            };
            diff
        ]);
    }
    let mut indexes = first_pending_indexes(obs, eval, diff);
    if has_backoff_limit_per_index(job) {
        let mut min_wait: Option<Duration> = None;
        indexes.retain(|ix| {
            let wait = policy::remaining_for_index(
                eval.delayed_deletion.get(ix).map(|p| p.as_ref()),
                obs.now,
            );
            if wait.is_zero() {
                return true;
            }
            min_wait = Some(min_wait.map_or(wait, |m| m.min(wait)));
            false
        });
        if indexes.is_empty()
            && let Some(wait) = min_wait
        {
            return PodAction::WaitBackoff(wait);
        }
    }
    let per_index = has_backoff_limit_per_index(job);
    PodAction::Create(
        indexes
            .into_iter()
            .map(|ix| NewPod {
                index: Some(ix),
                failure_counts: per_index.then(|| {
                    new_index_failure_counts(
                        job,
                        eval.delayed_deletion.get(&ix).map(|p| p.as_ref()),
                    )
                }),
            })
            .collect(),
    )
}

/// JR-14: failure counts for the replacement of `replaced` (the index's last failed pod).
pub fn new_index_failure_counts(job: &Job, replaced: Option<&Pod>) -> (i32, i32) {
    let Some(p) = replaced else {
        return (0, 0);
    };
    let (mut failures, mut ignored) = (
        pods::index_failure_count(p),
        pods::index_ignored_failure_count(p),
    );
    let m = policy::match_pod_failure_policy(
        job.spec
            .as_ref()
            .and_then(|s| s.pod_failure_policy.as_ref()),
        p,
    );
    // The annotations are the user's strings: "2147483647" parses.
    if m.counts {
        failures = failures.saturating_add(1);
    } else {
        ignored = ignored.saturating_add(1);
    }
    (failures, ignored)
}

/// JR-17: the lowest indexes neither active, succeeded, failed nor (with `Failed` replacement)
/// held by a terminating pod.
fn first_pending_indexes(obs: &Observed<'_>, eval: &Evaluation, count: usize) -> Vec<i32> {
    let completions = indexed_completions(obs.job);
    let mut taken = eval
        .succeeded_indexes
        .with_indexes(indexes_of(&eval.active_pods));
    if only_replace_failed(obs.job) {
        taken = taken.with_indexes(indexes_of(obs.pods.iter().filter(|p| pods::terminating(p))));
    }
    if let Some(f) = &eval.failed_indexes {
        taken = taken.merge(f);
    }
    taken.first_missing(completions, count)
}

/// JR-16: duplicates and out-of-range indexes first (Indexed), then the active pods in
/// upstream's deletion order, at least `at_least` of them.
pub fn pods_for_removal(job: &Job, active: &[Arc<Pod>], at_least: usize) -> Vec<Arc<Pod>> {
    let mut rm: Vec<Arc<Pod>> = Vec::new();
    let mut left: Vec<Arc<Pod>> = Vec::new();
    if is_indexed(job) {
        let completions = indexed_completions(job);
        let mut by_index: BTreeMap<Option<i32>, Vec<Arc<Pod>>> = BTreeMap::new();
        for p in active {
            by_index
                .entry(pods::completion_index(p))
                .or_default()
                .push(Arc::clone(p));
        }
        for (ix, mut group) in by_index {
            match ix {
                None => rm.extend(group),
                Some(i) if i >= completions => rm.extend(group),
                Some(_) => {
                    group.sort_by(|a, b| pods::deletion_order(a, b));
                    let keep = group.pop().expect("non-empty group");
                    rm.extend(group);
                    left.push(keep);
                }
            }
        }
    } else {
        left = active.to_vec();
    }
    if rm.len() < at_least {
        left.sort_by(|a, b| pods::deletion_order(a, b));
        let n = (at_least - rm.len()).min(left.len());
        rm.extend(left.into_iter().take(n));
    }
    rm
}

/// What performing the pod action did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Outcome {
    /// Pods whose DELETE (or finalizer removal + DELETE) succeeded.
    pub deleted: i32,
    pub deleted_ready: i32,
    /// Pods whose create was not attempted or failed.
    pub not_created: i32,
    /// A DELETE in `DeleteActive` failed.
    pub delete_failed: bool,
}

/// After the pod action: `active`, ready, terminating, completion and Suspended (JR-23, JR-44,
/// JR-45, JR-48). Returns `(needs_status_update, event)` with the Suspended/Resumed event to
/// emit, if any.
pub fn conclude(
    obs: &Observed<'_>,
    eval: &mut Evaluation,
    outcome: Outcome,
) -> (bool, Option<(&'static str, &'static str)>) {
    let job = obs.job;
    let mut active = eval.active_pods.len() as i32;
    let mut event = None;
    let mut suspend_changed = false;
    match &eval.action {
        PodAction::DeleteActive(list) => {
            if outcome.delete_failed
                || outcome.deleted != list.len() as i32
                || !obs.expectations_satisfied
            {
                // Not every pod is known gone: the finish waits for a later sync (JR-48).
                eval.finished = None;
            }
            active -= outcome.deleted;
            eval.terminating += outcome.deleted;
            eval.ready -= outcome.deleted_ready;
        }
        action => {
            let managed = !matches!(action, PodAction::Skip);
            match action {
                PodAction::Remove(_) => {
                    active -= outcome.deleted;
                    eval.terminating += outcome.deleted;
                    eval.ready -= outcome.deleted_ready;
                }
                PodAction::Create(list) => active += list.len() as i32 - outcome.not_created,
                _ => {}
            }
            let complete = match completions(job) {
                None => eval.succeeded > 0 && active == 0,
                Some(c) => eval.succeeded >= c && active == 0,
            };
            if complete {
                eval.finished = Some(new_condition(
                    SUCCESS_CRITERIA_MET,
                    "True",
                    "CompletionsReached",
                    "Reached expected number of succeeded pods",
                    obs.now,
                ));
            } else if managed {
                let conds = eval.status.conditions.get_or_insert_with(Vec::new);
                if suspended(job) {
                    if ensure_condition(
                        conds,
                        SUSPENDED,
                        "True",
                        "JobSuspended",
                        "Job suspended",
                        obs.now,
                    ) {
                        suspend_changed = true;
                        event = Some(("Suspended", "Job suspended"));
                        // JR-44 (MutableSchedulingDirectivesForSuspendedJobs, beta on).
                        if obs.clear_start_time_on_suspend {
                            eval.status.start_time = None;
                        }
                    }
                } else if ensure_condition(
                    conds,
                    SUSPENDED,
                    "False",
                    "JobResumed",
                    "Job resumed",
                    obs.now,
                ) {
                    suspend_changed = true;
                    event = Some(("Resumed", "Job resumed"));
                    eval.status.start_time = Some(Time(obs.now));
                }
                if eval.status.conditions.as_ref().is_some_and(Vec::is_empty) {
                    eval.status.conditions = None;
                }
            }
        }
    }
    let old = job.status.clone().unwrap_or_default();
    let needs = suspend_changed
        || Some(active) != Some(old.active.unwrap_or(0))
        || old.ready != Some(eval.ready)
        || old.terminating != Some(eval.terminating);
    eval.status.active = Some(active);
    eval.status.ready = Some(eval.ready);
    eval.status.terminating = Some(eval.terminating);
    (needs, event)
}

/// The finalizer protocol's decisions (JR-26 steps 1–4).
pub struct Tracking {
    pub status: JobStatus,
    pub needs_flush: bool,
    pub uids_with_finalizer: HashSet<String>,
    pub remove_finalizers: Vec<Arc<Pod>>,
    /// The terminal condition to add once nothing is in flight (`Failed` or `Complete`).
    pub final_condition: Option<JobCondition>,
    pub reached_max_uncounted: bool,
    /// Failed pods handled by a podFailurePolicy rule, by action (metric).
    pub policy_actions: BTreeMap<&'static str, u64>,
}

/// JR-26 steps 1–4 and JR-28: which terminated pods enter `uncountedTerminatedPods` and lose
/// their finalizer this sync, and the interim condition to write first.
pub fn track(obs: &Observed<'_>, eval: &Evaluation, needs_update: bool) -> Tracking {
    let mut status = eval.status.clone();
    let mut needs_flush = needs_update;
    // Step 1: the pods that still carry the finalizer.
    let with_finalizer: HashSet<String> = obs
        .pods
        .iter()
        .filter(|p| {
            pods::has_tracking_finalizer(p) && !obs.expected_rm_finalizers.contains(pods::uid(p))
        })
        .map(|p| pods::uid(p).to_string())
        .collect();
    // Step 2.
    if clean_uncounted(&mut status, &with_finalizer) {
        needs_flush = true;
    }
    // Step 3. `uncountedTerminatedPods` is rewritten just below, so its lists are taken.
    let mut unc = status.uncounted_terminated_pods.take().unwrap_or_default();
    let rec = record_finished_pods(
        obs,
        eval,
        unc.succeeded.take().unwrap_or_default(),
        unc.failed.take().unwrap_or_default(),
    );
    if rec.changed {
        needs_flush = true;
    }
    status.uncounted_terminated_pods = Some(UncountedTerminatedPods {
        succeeded: (!rec.uncounted_succeeded.is_empty()).then_some(rec.uncounted_succeeded),
        failed: (!rec.uncounted_failed.is_empty()).then_some(rec.uncounted_failed),
    });
    if is_indexed(obs.job) && record_indexes(&mut status, eval, rec.succeeded_indexes) {
        needs_flush = true;
    }
    // Step 4.
    let (interim_added, final_condition) = interim_condition(&mut status, eval, obs.now);
    if interim_added {
        needs_flush = true;
    }
    Tracking {
        status,
        needs_flush,
        uids_with_finalizer: with_finalizer,
        remove_finalizers: rec.remove,
        final_condition,
        reached_max_uncounted: rec.reached_max,
        policy_actions: rec.policy_actions,
    }
}

/// What [`record_finished_pods`] decided.
struct Recorded {
    uncounted_succeeded: Vec<String>,
    uncounted_failed: Vec<String>,
    /// Indexed Jobs: indexes newly succeeded (their pods enter no uncounted list).
    succeeded_indexes: Vec<i32>,
    remove: Vec<Arc<Pod>>,
    policy_actions: BTreeMap<&'static str, u64>,
    reached_max: bool,
    /// Something new was recorded: the status must be written before any finalizer goes.
    changed: bool,
}

/// JR-26 step 3, JR-28 and JR-30: each pod whose finalizer may go is recorded in the uncounted
/// lists (or as a succeeded index) once, lowest index first, at most [`MAX_UNCOUNTED_PODS`].
fn record_finished_pods(
    obs: &Observed<'_>,
    eval: &Evaluation,
    uncounted_succeeded: Vec<String>,
    uncounted_failed: Vec<String>,
) -> Recorded {
    let job = obs.job;
    let indexed = is_indexed(job);
    let completions = indexed_completions(job);
    let mut pods_sorted: Vec<&Arc<Pod>> = obs.pods.iter().collect();
    if indexed {
        pods_sorted.sort_by_key(|p| pods::completion_index(p).map_or(-1, i64::from));
    }
    // While a failure finish is pending, every unsucceeded pod whose finalizer goes is a failure.
    let failing = eval
        .finished
        .as_ref()
        .is_some_and(|c| !(c.type_ == SUCCESS_CRITERIA_MET && c.status == "True"));
    let policy_spec = job
        .spec
        .as_ref()
        .and_then(|s| s.pod_failure_policy.as_ref());
    let mut rec = Recorded {
        uncounted_succeeded,
        uncounted_failed,
        succeeded_indexes: Vec::new(),
        remove: Vec::new(),
        policy_actions: BTreeMap::new(),
        reached_max: false,
        changed: false,
    };
    for pod in pods_sorted {
        let uid = pods::uid(pod);
        if !pods::has_tracking_finalizer(pod) || obs.expected_rm_finalizers.contains(uid) {
            continue;
        }
        let considered_failed = pod_failed(pod, job);
        if !can_remove_finalizer(obs, eval, pod, considered_failed) {
            continue;
        }
        rec.remove.push(Arc::clone(pod));
        let valid_index = |p: &Pod| pods::completion_index(p).filter(|ix| *ix < completions);
        if pods::succeeded(pod) && !eval.uncounted_failed.contains(uid) {
            if indexed {
                if let Some(ix) = valid_index(pod)
                    && !eval.prev_succeeded_indexes.has(ix)
                {
                    rec.succeeded_indexes.push(ix);
                    rec.changed = true;
                }
            } else if !eval.uncounted_succeeded.contains(uid) {
                rec.changed = true;
                rec.uncounted_succeeded.push(uid.to_string());
            }
        } else if (considered_failed || failing)
            && !eval.uncounted_failed.contains(uid)
            && (!indexed || valid_index(pod).is_some())
        {
            let m = policy::match_pod_failure_policy(policy_spec, pod);
            if let Some(a) = m.action {
                *rec.policy_actions.entry(a.as_str()).or_default() += 1;
            }
            if m.counts {
                rec.changed = true;
                rec.uncounted_failed.push(uid.to_string());
            }
        }
        if rec.succeeded_indexes.len() + rec.uncounted_succeeded.len() + rec.uncounted_failed.len()
            >= MAX_UNCOUNTED_PODS
        {
            rec.reached_max = true;
            break;
        }
    }
    rec
}

/// JR-24, JR-37: an Indexed Job's `completedIndexes` (with the newly succeeded ones),
/// `succeeded` and `failedIndexes`. Returns whether an index string changed.
fn record_indexes(status: &mut JobStatus, eval: &Evaluation, new_succeeded: Vec<i32>) -> bool {
    let mut changed = false;
    let done = eval.succeeded_indexes.with_indexes(new_succeeded);
    let text = done.to_string();
    if status.completed_indexes.as_deref().unwrap_or_default() != text {
        changed = true;
    }
    status.succeeded = Some(done.total());
    status.completed_indexes = Some(text);
    let failed_text = eval.failed_indexes.as_ref().map(ToString::to_string);
    if status.failed_indexes != failed_text {
        status.failed_indexes = failed_text;
        changed = true;
    }
    changed
}

/// JR-26 step 4, JR-49: the pending finish's interim condition goes into this write, before any
/// finalizer goes; returns whether it was added, and the terminal condition that follows.
fn interim_condition(
    status: &mut JobStatus,
    eval: &Evaluation,
    now: Timestamp,
) -> (bool, Option<JobCondition>) {
    let Some(c) = &eval.finished else {
        return (false, None);
    };
    if c.type_ == FAILURE_TARGET {
        status
            .conditions
            .get_or_insert_with(Vec::new)
            .push(c.clone());
        (true, Some(successor(c, FAILED, now)))
    } else if c.type_ == SUCCESS_CRITERIA_MET {
        let added = !condition_true(
            status.conditions.as_deref().unwrap_or_default(),
            SUCCESS_CRITERIA_MET,
        );
        if added {
            status
                .conditions
                .get_or_insert_with(Vec::new)
                .push(c.clone());
        }
        (added, Some(successor(c, COMPLETE, now)))
    } else {
        // A `Failed` derived from an existing FailureTarget.
        (false, Some(c.clone()))
    }
}

/// JR-28.
fn can_remove_finalizer(
    obs: &Observed<'_>,
    eval: &Evaluation,
    pod: &Pod,
    considered_failed: bool,
) -> bool {
    if obs.job.metadata.deletion_timestamp.is_some()
        || eval.finished.is_some()
        || pods::succeeded(pod)
    {
        return true;
    }
    if !considered_failed {
        return false;
    }
    if has_backoff_limit_per_index(obs.job)
        && let Some(ix) = pods::completion_index(pod)
        && eval
            .delayed_deletion
            .get(&ix)
            .is_some_and(|p| pods::uid(p) == pods::uid(pod))
    {
        return false;
    }
    true
}

/// JR-26 steps 2 and 7: uncounted UIDs whose pod no longer has the finalizer move into the
/// counters. Returns whether anything changed.
pub fn clean_uncounted(status: &mut JobStatus, with_finalizer: &HashSet<String>) -> bool {
    let unc = status
        .uncounted_terminated_pods
        .get_or_insert_with(UncountedTerminatedPods::default);
    let mut changed = false;
    let mut fold = |list: &mut Option<Vec<String>>, counter: &mut Option<i32>| {
        let old = list.take().unwrap_or_default();
        let n = old.len();
        let kept: Vec<String> = old
            .into_iter()
            .filter(|u| with_finalizer.contains(u))
            .collect();
        if kept.len() != n {
            changed = true;
            *counter = Some(counter.unwrap_or(0).saturating_add((n - kept.len()) as i32));
        }
        *list = (!kept.is_empty()).then_some(kept);
    };
    fold(&mut unc.succeeded, &mut status.succeeded);
    fold(&mut unc.failed, &mut status.failed);
    changed
}

/// JR-26 step 8: add the terminal condition when nothing is uncounted or terminating.
/// Returns whether the Job is now finished.
pub fn enact_finished(
    status: &mut JobStatus,
    final_condition: Option<&JobCondition>,
    now: Timestamp,
) -> bool {
    let Some(c) = final_condition else {
        return false;
    };
    let unc = status.uncounted_terminated_pods.clone().unwrap_or_default();
    if !unc.succeeded.unwrap_or_default().is_empty() || !unc.failed.unwrap_or_default().is_empty() {
        return false;
    }
    if status.terminating.unwrap_or(0) > 0 {
        return false;
    }
    let conds = status.conditions.get_or_insert_with(Vec::new);
    ensure_condition(
        conds,
        &c.type_,
        &c.status,
        c.reason.as_deref().unwrap_or_default(),
        c.message.as_deref().unwrap_or_default(),
        now,
    );
    if c.type_ == COMPLETE {
        // JR-52: exactly the stored condition's transition time.
        status.completion_time = conds
            .iter()
            .find(|x| x.type_ == COMPLETE)
            .and_then(|x| x.last_transition_time.clone());
    }
    true
}

#[cfg(test)]
#[path = "plan_tests.rs"]
mod tests;

#[cfg(test)]
#[path = "plan_props.rs"]
mod props;
