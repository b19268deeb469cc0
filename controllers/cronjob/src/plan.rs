//! Pure CronJob decisions (CR-22..CR-32): which time is due, what to do about it, active-list
//! upkeep, history cleanup and the Job built from the template. No API access; `lib` observes,
//! calls these, and acts.

use crate::schedule::{DstPolicy, Schedule};
use crate::zone::Zone;
use jiff::{SignedDuration, Timestamp};
use k8s_openapi::api::batch::v1::{CronJob, CronJobStatus, Job};
use k8s_openapi::api::core::v1::ObjectReference;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference, Time};
use std::collections::BTreeMap;
use std::time::Duration;

/// CR-19's annotation on every Job a CronJob creates.
pub const SCHEDULED_TIMESTAMP_ANNOTATION: &str = "batch.kubernetes.io/cronjob-scheduled-timestamp";
/// CR-31: requeues land this long after the next schedule time.
pub const NEXT_SCHEDULE_DELTA: Duration = Duration::from_millis(100);
/// CR-24: more estimated misses than this is `TooManyMissedTimes`.
const MANY_MISSED: i64 = 100;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Missed {
    None,
    Few,
    Many,
}

/// `mostRecentScheduleTime`'s answer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Recent {
    pub earliest: Timestamp,
    pub most_recent: Option<Timestamp>,
    pub missed: Missed,
    /// The schedule's slots are less than a second apart (or there are none): `InvalidSchedule`.
    pub error: Option<String>,
}

fn ts(t: &Time) -> Timestamp {
    t.0
}

fn creation(cj: &CronJob) -> Timestamp {
    cj.metadata
        .creation_timestamp
        .as_ref()
        .map(ts)
        .unwrap_or(Timestamp::UNIX_EPOCH)
}

fn spec_sds(cj: &CronJob) -> Option<i64> {
    cj.spec.starting_deadline_seconds
}

fn last_schedule(cj: &CronJob) -> Option<Timestamp> {
    cj.status
        .as_ref()
        .and_then(|s| s.last_schedule_time.as_ref())
        .map(ts)
}

fn secs(n: i64) -> SignedDuration {
    SignedDuration::from_secs(n)
}

/// CR-22..CR-24 (`utils.go: mostRecentScheduleTime`).
pub fn most_recent(
    cj: &CronJob,
    now: Timestamp,
    sched: &Schedule,
    policy: DstPolicy,
    with_deadline: bool,
) -> Recent {
    let mut earliest = last_schedule(cj).unwrap_or_else(|| creation(cj));
    if with_deadline && let Some(sds) = spec_sds(cj) {
        // A deadline reaching before the earliest representable time clamps nothing (int64
        // seconds are API-valid; the subtraction must not panic).
        if let Ok(deadline) = now.checked_sub(secs(sds))
            && deadline > earliest
        {
            earliest = deadline;
        }
    }
    let mut out = Recent {
        earliest,
        most_recent: None,
        missed: Missed::None,
        error: None,
    };
    let next = |t: Timestamp| sched.next(t, policy);
    let too_close = "time difference between two schedules is less than 1 second";
    let Some(t1) = next(earliest) else {
        out.error = Some(too_close.into());
        return out;
    };
    if now < t1 {
        return out;
    }
    let t2 = next(t1);
    if t2.is_some_and(|t2| now < t2) {
        out.most_recent = Some(t1);
        return out;
    }
    let between = t2.map_or(0, |t2| t2.duration_since(t1).as_secs());
    if between < 1 {
        out.error = Some(too_close.into());
        return out;
    }
    let elapsed = now.duration_since(t1).as_secs();
    let missed = elapsed / between + 1;
    // `now >= t2` above, so `missed >= 2` and `t1 + (missed - 2) * between <= now`: in range.
    let skip = secs(missed.saturating_sub(2).saturating_mul(between));
    let mut t = next(t1.checked_add(skip).unwrap_or(t1));
    while let Some(slot) = t.filter(|slot| *slot <= now) {
        out.most_recent = Some(slot);
        t = next(slot);
    }
    out.missed = if missed > MANY_MISSED {
        Missed::Many
    } else {
        Missed::Few
    };
    out
}

/// CR-31 (`nextScheduleTimeDuration`): how long until the key should sync again; `None` when the
/// schedule has no further time.
pub fn requeue_after(
    cj: &CronJob,
    now: Timestamp,
    sched: &Schedule,
    policy: DstPolicy,
) -> Option<Duration> {
    let r = most_recent(cj, now, sched, policy, false);
    let base = match (&r.error, r.most_recent, r.missed) {
        (Some(_), _, _) => now,
        (None, Some(t), _) => t,
        (None, None, Missed::None) => r.earliest,
        (None, None, _) => now,
    };
    let next = sched.next(base, policy)?;
    let wait = Duration::try_from(next.duration_since(now)).unwrap_or(Duration::ZERO);
    Some(wait.saturating_add(NEXT_SCHEDULE_DELTA))
}

/// An event to emit on the CronJob.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Event {
    pub warning: bool,
    pub reason: &'static str,
    pub note: String,
}

impl Event {
    pub fn normal(reason: &'static str, note: String) -> Event {
        Event {
            warning: false,
            reason,
            note,
        }
    }
    pub fn warning(reason: &'static str, note: String) -> Event {
        Event {
            warning: true,
            reason,
            note,
        }
    }
}

/// What the scheduling part of a sync decides (CR-22..CR-28).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Decision {
    /// Nothing to start; sync again after this long (`None`: wait for an event).
    Wait(Option<Duration>),
    /// Start the Job for `scheduled`, first deleting the active Jobs when `replace`.
    Start { scheduled: Timestamp, replace: bool },
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Plan {
    pub events: Vec<Event>,
    pub decision: Decision,
    /// The slot a `MissSchedule` was reported for (JB-11: once per slot).
    pub missed_slot: Option<Timestamp>,
}

/// `<cronjob>-<scheduled minutes since the epoch>` (CR-18).
pub fn job_name(cj: &CronJob, scheduled: Timestamp) -> String {
    let minutes = scheduled.as_second() / 60;
    format!(
        "{}-{minutes}",
        cj.metadata.name.as_deref().unwrap_or_default()
    )
}

fn concurrency(cj: &CronJob) -> &str {
    cj.spec.concurrency_policy.as_deref().unwrap_or("Allow")
}

fn active(cj: &CronJob) -> &[ObjectReference] {
    cj.status
        .as_ref()
        .and_then(|s| s.active.as_deref())
        .unwrap_or_default()
}

/// `Missed scheduled time to start a job: <RFC 1123, numeric zone, UTC>`.
pub fn rfc1123z(t: Timestamp) -> String {
    t.strftime("%a, %d %b %Y %H:%M:%S +0000").to_string()
}

/// The scheduling decision for a CronJob that is not deleting, not suspended, and whose zone and
/// schedule are valid. `warned_slot` is the slot a `MissSchedule` was last reported for.
pub fn plan(
    cj: &CronJob,
    now: Timestamp,
    sched: &Schedule,
    policy: DstPolicy,
    warned_slot: Option<Timestamp>,
) -> Plan {
    let schedule = cj.spec.schedule.as_str();
    let mut out = Plan {
        events: Vec::new(),
        decision: Decision::Wait(None),
        missed_slot: None,
    };
    let wait = || Decision::Wait(requeue_after(cj, now, sched, policy));
    let r = most_recent(cj, now, sched, policy, true);
    let scheduled = match r.most_recent.filter(|t| *t <= now) {
        Some(t) => t,
        None => {
            if let Some(err) = r.error {
                out.events.push(Event::warning(
                    "InvalidSchedule",
                    format!("invalid schedule: {schedule} : {err}"),
                ));
            } else {
                out.decision = wait();
            }
            return out;
        }
    };
    if r.missed == Missed::Many {
        out.events.push(Event::warning(
            "TooManyMissedTimes",
            "too many missed start times. Set or decrease .spec.startingDeadlineSeconds or check clock skew".into(),
        ));
    }
    if let Some(err) = r.error {
        out.events.push(Event::warning(
            "InvalidSchedule",
            format!("invalid schedule: {schedule} : {err}"),
        ));
        return out;
    }
    if let Some(sds) = spec_sds(cj)
        && scheduled.checked_add(secs(sds)).is_ok_and(|d| d < now)
    {
        // CR-25; JB-11: reported once per missed slot.
        if warned_slot != Some(scheduled) {
            out.events.push(Event::warning(
                "MissSchedule",
                format!(
                    "Missed scheduled time to start a job: {}",
                    rfc1123z(scheduled)
                ),
            ));
        }
        out.missed_slot = Some(scheduled);
        out.decision = wait();
        return out;
    }
    let name = job_name(cj, scheduled);
    let namespace = cj.metadata.namespace.as_deref();
    let listed = active(cj)
        .iter()
        .any(|a| a.name.as_deref() == Some(name.as_str()) && a.namespace.as_deref() == namespace);
    if listed || last_schedule(cj) == Some(scheduled) {
        out.decision = wait();
        return out;
    }
    let policy_name = concurrency(cj);
    if policy_name == "Forbid" && !active(cj).is_empty() {
        out.events.push(Event::normal(
            "JobAlreadyActive",
            "Not starting job because prior execution is running and concurrency policy is Forbid"
                .into(),
        ));
        out.decision = wait();
        return out;
    }
    out.decision = Decision::Start {
        scheduled,
        replace: policy_name == "Replace",
    };
    out
}

pub fn finished_condition(job: &Job) -> Option<&'static str> {
    job.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .into_iter()
        .flatten()
        .find_map(|c| match (c.type_.as_str(), c.status.as_str()) {
            ("Complete", "True") => Some("Complete"),
            ("Failed", "True") => Some("Failed"),
            _ => None,
        })
}

/// What CR-29 does to the status from the owned Jobs in the cache.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Upkeep {
    pub status: CronJobStatus,
    pub changed: bool,
    pub events: Vec<Event>,
    /// `active` entries whose Job is not among the owned Jobs: read live (MissingJob if gone).
    pub unseen: Vec<ObjectReference>,
}

/// CR-29 over the owned Jobs. Unfinished Jobs missing from `active` were already checked against
/// a live read of the CronJob by the caller: `status` is that copy's status when it listed them.
pub fn upkeep(status: &CronJobStatus, jobs: &[&Job]) -> Upkeep {
    let mut out = Upkeep {
        status: status.clone(),
        ..Default::default()
    };
    let uid = |j: &Job| j.metadata.uid.clone().unwrap_or_default();
    let name = |j: &Job| j.metadata.name.clone().unwrap_or_default();
    for job in jobs {
        let listed = out
            .status
            .active
            .iter()
            .flatten()
            .any(|a| a.uid.as_deref() == Some(uid(job).as_str()));
        match finished_condition(job) {
            None if !listed => out.events.push(Event::warning(
                "UnexpectedJob",
                format!(
                    "Saw a job that the controller did not create or forgot: {}",
                    name(job)
                ),
            )),
            None => {}
            Some(condition) => {
                if listed {
                    remove_active(&mut out.status, &uid(job));
                    out.events.push(Event::normal(
                        "SawCompletedJob",
                        format!("Saw completed job: {}, condition: {condition}", name(job)),
                    ));
                    out.changed = true;
                }
                if condition == "Complete" {
                    // lastSuccessfulTime = max(lastSuccessfulTime, completionTime).
                    let done = job.status.as_ref().and_then(|s| s.completion_time.clone());
                    let newer = match (&out.status.last_successful_time, &done) {
                        (_, None) => false,
                        (None, Some(_)) => true,
                        (Some(last), Some(done)) => done.0 > last.0,
                    };
                    if newer {
                        out.status.last_successful_time = done;
                        out.changed = true;
                    }
                }
            }
        }
    }
    let owned: Vec<String> = jobs.iter().map(|j| uid(j)).collect();
    out.unseen = out
        .status
        .active
        .iter()
        .flatten()
        .filter(|a| !owned.iter().any(|u| Some(u.as_str()) == a.uid.as_deref()))
        .cloned()
        .collect();
    out
}

pub fn remove_active(status: &mut CronJobStatus, uid: &str) {
    if let Some(list) = status.active.as_mut() {
        list.retain(|a| a.uid.as_deref() != Some(uid));
    }
}

/// CR-32: the finished Jobs beyond the history limits, oldest first by `status.startTime`
/// (unset last, ties by name).
pub fn history_to_delete<'a>(cj: &CronJob, jobs: &[&'a Job]) -> Vec<&'a Job> {
    let successful = cj.spec.successful_jobs_history_limit;
    let failed = cj.spec.failed_jobs_history_limit;
    let mut out = Vec::new();
    for (condition, limit) in [("Complete", successful), ("Failed", failed)] {
        let Some(limit) = limit else { continue };
        let mut finished: Vec<&Job> = jobs
            .iter()
            .copied()
            .filter(|j| finished_condition(j) == Some(condition))
            .collect();
        let excess = finished.len() as i64 - i64::from(limit);
        if excess <= 0 {
            continue;
        }
        finished.sort_by(|a, b| {
            let start = |j: &Job| j.status.as_ref().and_then(|s| s.start_time.clone());
            match (start(a), start(b)) {
                (Some(x), Some(y)) if x != y => x.0.cmp(&y.0),
                (Some(_), None) => std::cmp::Ordering::Less,
                (None, Some(_)) => std::cmp::Ordering::Greater,
                _ => a.metadata.name.cmp(&b.metadata.name),
            }
        });
        out.extend(finished.into_iter().take(excess as usize));
    }
    out
}

/// CR-19: the Job for `scheduled` (`getJobFromTemplate2`). `zone` is `spec.timeZone`'s zone, or
/// UTC when it is unset (never the controller's local zone).
pub fn job_for(cj: &CronJob, scheduled: Timestamp, zone: &Zone) -> Job {
    let template = &cj.spec.job_template;
    let meta = template.metadata.as_ref();
    let labels: BTreeMap<String, String> = meta.and_then(|m| m.labels.clone()).unwrap_or_default();
    let mut annotations = meta.and_then(|m| m.annotations.clone()).unwrap_or_default();
    annotations.insert(
        SCHEDULED_TIMESTAMP_ANNOTATION.into(),
        zone.rfc3339(scheduled),
    );
    Job {
        metadata: ObjectMeta {
            name: Some(job_name(cj, scheduled)),
            namespace: cj.metadata.namespace.clone(),
            labels: (!labels.is_empty()).then_some(labels),
            annotations: Some(annotations),
            owner_references: Some(vec![controller_ref(cj)]),
            ..Default::default()
        },
        spec: template.spec.clone(),
        status: None,
    }
}

pub fn controller_ref(cj: &CronJob) -> OwnerReference {
    shared::meta::refs::controller_ref(cj)
}

/// JB-7: a Job belongs to a CronJob only through a controller reference naming kind `CronJob` in
/// group `batch` and the CronJob's UID.
pub fn controlled_by(job: &Job, cj_uid: &str) -> bool {
    shared::meta::refs::is_controlled_by_kind::<CronJob>(&job.metadata, cj_uid)
}

/// `status.active` entry for a Job (`ref.GetReference`).
pub fn job_reference(job: &Job) -> ObjectReference {
    shared::meta::refs::object_reference(job)
}

#[cfg(test)]
#[path = "plan_tests.rs"]
mod plan_tests;

#[cfg(test)]
#[path = "plan_props.rs"]
mod props;
