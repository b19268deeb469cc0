//! JB-2: every Job status write is checked against the 1.37 API server's status validation
//! (JR-55..JR-60; `ValidateJobStatusUpdate` with the options the Job strategy enables) before it
//! is sent. A violation is a controller bug: the write is not sent, the sync fails, and it is
//! logged and counted, so no write is ever rejected by the API server.

use crate::indexes::Intervals;
use crate::plan::{self, COMPLETE, FAILED, FAILURE_TARGET, SUCCESS_CRITERIA_MET, SUSPENDED};
use k8s_openapi::api::batch::v1::{Job, JobCondition, JobSpec, JobStatus};

fn is_true(c: &[JobCondition], t: &str) -> bool {
    plan::condition_true(c, t)
}

fn is_false(c: &[JobCondition], t: &str) -> bool {
    c.iter().any(|x| x.type_ == t && x.status == "False")
}

fn valid_indexes(s: &str, completions: i32) -> bool {
    if s.is_empty() {
        return true;
    }
    let mut prev: Option<i32> = None;
    for part in s.split(',') {
        let mut it = part.splitn(2, '-');
        let (Some(a), b) = (it.next(), it.next()) else {
            return false;
        };
        let Ok(first) = a.parse::<i32>() else {
            return false;
        };
        let last = match b {
            Some(b) => match b.parse::<i32>() {
                Ok(l) if l > first => l,
                _ => return false,
            },
            None => first,
        };
        if first < 0 || last >= completions || prev.is_some_and(|p| first <= p) {
            return false;
        }
        prev = Some(last);
    }
    true
}

/// One status write: the cached Job, the status it holds and the status about to replace it.
struct Write<'a> {
    old: &'a Job,
    spec: JobSpec,
    o: JobStatus,
    n: &'a JobStatus,
}

impl Write<'_> {
    fn oc(&self) -> &[JobCondition] {
        self.o.conditions.as_deref().unwrap_or_default()
    }

    fn nc(&self) -> &[JobCondition] {
        self.n.conditions.as_deref().unwrap_or_default()
    }

    /// Whether condition `t` turns True or stops being True.
    fn changed(&self, t: &str) -> bool {
        is_true(self.oc(), t) != is_true(self.nc(), t)
    }
}

fn finished(c: &[JobCondition]) -> bool {
    is_true(c, COMPLETE) || is_true(c, FAILED)
}

/// The reasons `new` (the status about to be written over `old`, the cached Job) would be
/// rejected; empty when the write is valid.
pub fn violations(old: &Job, new_status: &JobStatus) -> Vec<String> {
    let w = Write {
        old,
        spec: plan::spec(old),
        o: old.status.clone().unwrap_or_default(),
        n: new_status,
    };
    let mut v = Vec::new();
    counter_violations(&w, &mut v);
    let has_uncounted = uncounted_violations(&w, &mut v);
    condition_violations(&w, &mut v);
    finished_violations(&w, has_uncounted, &mut v);
    start_time_violations(&w, &mut v);
    index_violations(&w, &mut v);
    v
}

/// JR-55: counters are never negative, failed never drops, succeeded drops only for an Indexed
/// Job with completions == parallelism, ready never exceeds active.
fn counter_violations(w: &Write<'_>, v: &mut Vec<String>) {
    let (o, n) = (&w.o, w.n);
    for (name, val) in [
        ("active", n.active),
        ("ready", n.ready),
        ("terminating", n.terminating),
        ("succeeded", n.succeeded),
        ("failed", n.failed),
    ] {
        if val.unwrap_or(0) < 0 {
            v.push(format!("{name} is negative"));
        }
    }
    if n.succeeded.unwrap_or(0) < o.succeeded.unwrap_or(0)
        && (!plan::is_indexed(w.old) || w.spec.completions != w.spec.parallelism)
    {
        v.push("succeeded decreases".into());
    }
    if n.failed.unwrap_or(0) < o.failed.unwrap_or(0) {
        v.push("failed decreases".into());
    }
    if (n.ready != o.ready || n.active != o.active) && n.ready.unwrap_or(0) > n.active.unwrap_or(0)
    {
        v.push("ready > active".into());
    }
}

/// JR-56: uncounted UIDs are non-empty and unique across both lists. Returns whether any are
/// listed.
fn uncounted_violations(w: &Write<'_>, v: &mut Vec<String>) -> bool {
    let unc = w.n.uncounted_terminated_pods.clone().unwrap_or_default();
    let all: Vec<String> = unc
        .succeeded
        .iter()
        .flatten()
        .chain(unc.failed.iter().flatten())
        .cloned()
        .collect();
    let mut seen = std::collections::HashSet::new();
    if all.iter().any(|u| u.is_empty() || !seen.insert(u.clone())) {
        v.push("uncountedTerminatedPods has an empty or repeated UID".into());
    }
    !all.is_empty()
}

/// JR-58, then JR-57: no terminal or interim condition turns back from True; terminal
/// conditions need their interim partner, and success and failure exclude each other.
fn condition_violations(w: &Write<'_>, v: &mut Vec<String>) {
    let (oc, nc) = (w.oc(), w.nc());
    for t in [COMPLETE, FAILED, FAILURE_TARGET, SUCCESS_CRITERIA_MET] {
        if is_true(oc, t) && !is_true(nc, t) {
            v.push(format!("{t}=True reverted"));
        }
    }
    if is_true(nc, FAILED)
        && !is_true(nc, FAILURE_TARGET)
        && (w.changed(FAILED) || w.n.failed_indexes != w.o.failed_indexes)
    {
        v.push("Failed without FailureTarget".into());
    }
    if is_true(nc, COMPLETE)
        && !is_true(nc, SUCCESS_CRITERIA_MET)
        && (w.changed(COMPLETE) || w.changed(SUCCESS_CRITERIA_MET))
    {
        v.push("Complete without SuccessCriteriaMet".into());
    }
    if is_true(nc, COMPLETE) && is_true(nc, FAILED) {
        v.push("Complete and Failed".into());
    }
    if is_true(nc, COMPLETE)
        && is_true(nc, FAILURE_TARGET)
        && (w.changed(COMPLETE) || w.changed(FAILURE_TARGET))
    {
        v.push("Complete with FailureTarget".into());
    }
    if is_true(nc, SUCCESS_CRITERIA_MET) && (is_true(nc, FAILED) || is_true(nc, FAILURE_TARGET)) {
        v.push("SuccessCriteriaMet with Failed or FailureTarget".into());
    }
    if is_true(oc, COMPLETE)
        && !is_true(oc, SUCCESS_CRITERIA_MET)
        && is_true(nc, SUCCESS_CRITERIA_MET)
    {
        v.push("SuccessCriteriaMet added after Complete".into());
    }
}

/// JR-59: a finished Job has no active, terminating or uncounted pods and a startTime;
/// completionTime comes only with Complete, never changes and is not before startTime.
fn finished_violations(w: &Write<'_>, has_uncounted: bool, v: &mut Vec<String>) {
    let (o, n) = (&w.o, w.n);
    let nfin = finished(w.nc());
    let finished_changed = finished(w.oc()) != nfin;
    if nfin && n.active.unwrap_or(0) > 0 && (finished_changed || n.active != o.active) {
        v.push("finished with active pods".into());
    }
    if nfin
        && n.terminating.unwrap_or(0) > 0
        && (finished_changed || n.terminating != o.terminating)
    {
        v.push("finished with terminating pods".into());
    }
    if nfin
        && has_uncounted
        && (finished_changed || n.uncounted_terminated_pods != o.uncounted_terminated_pods)
    {
        v.push("finished with uncounted pods".into());
    }
    let suspended_zero = plan::suspended(w.old) && w.spec.completions == Some(0);
    if nfin
        && n.start_time.is_none()
        && (finished_changed || n.start_time != o.start_time)
        && !suspended_zero
    {
        v.push("finished without startTime".into());
    }
    let complete = is_true(w.nc(), COMPLETE);
    let complete_changed = w.changed(COMPLETE);
    let completion_changed = n.completion_time != o.completion_time;
    if n.completion_time.is_some() && !complete && (complete_changed || completion_changed) {
        v.push("completionTime without Complete".into());
    }
    if n.completion_time.is_none() && complete && (complete_changed || completion_changed) {
        v.push("Complete without completionTime".into());
    }
    if o.completion_time.is_some() && n.completion_time.is_some() && completion_changed {
        v.push("completionTime changed".into());
    }
    if let (Some(s), Some(c)) = (&n.start_time, &n.completion_time)
        && (n.start_time != o.start_time || completion_changed)
        && c.0 < s.0
    {
        v.push("completionTime before startTime".into());
    }
}

/// JR-60: startTime is immutable for an unsuspended Job, except in the resume write.
fn start_time_violations(w: &Write<'_>, v: &mut Vec<String>) {
    let resuming = is_true(w.oc(), SUSPENDED) && is_false(w.nc(), SUSPENDED);
    if w.o.start_time.is_some()
        && w.n.start_time != w.o.start_time
        && !resuming
        && !plan::suspended(w.old)
    {
        v.push("startTime changed on an unsuspended Job".into());
    }
}

/// JR-60: index strings parse, stay below completions, appear only where allowed and are
/// disjoint.
fn index_violations(w: &Write<'_>, v: &mut Vec<String>) {
    let (o, n) = (&w.o, w.n);
    let completions = w.spec.completions.unwrap_or(0);
    if n.completed_indexes != o.completed_indexes {
        let s = n.completed_indexes.as_deref().unwrap_or_default();
        if !plan::is_indexed(w.old) && !s.is_empty() {
            v.push("completedIndexes on a NonIndexed Job".into());
        } else if !valid_indexes(s, completions) {
            v.push(format!("completedIndexes {s:?} malformed"));
        }
    }
    if n.failed_indexes != o.failed_indexes {
        if n.failed_indexes.is_some() && w.spec.backoff_limit_per_index.is_none() {
            v.push("failedIndexes without backoffLimitPerIndex".into());
        } else if !valid_indexes(n.failed_indexes.as_deref().unwrap_or_default(), completions) {
            v.push("failedIndexes malformed".into());
        }
    }
    if (n.failed_indexes != o.failed_indexes || n.completed_indexes != o.completed_indexes)
        && let Some(f) = &n.failed_indexes
    {
        let done = Intervals::parse(n.completed_indexes.as_deref().unwrap_or_default(), i32::MAX);
        if Intervals::parse(f, i32::MAX).iter().any(|i| done.has(i)) {
            v.push("failedIndexes overlap completedIndexes".into());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plan::new_condition;
    use k8s_openapi::api::batch::v1::{JobSpec, UncountedTerminatedPods};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
    use k8s_openapi::jiff::Timestamp;

    fn t(s: i64) -> Timestamp {
        Timestamp::from_second(s).unwrap()
    }

    fn job(status: JobStatus, suspend: bool) -> Job {
        Job {
            spec: Some(JobSpec {
                completions: Some(3),
                parallelism: Some(2),
                suspend: Some(suspend),
                ..Default::default()
            }),
            status: Some(status),
            ..Default::default()
        }
    }

    fn cond(type_: &str) -> JobCondition {
        new_condition(type_, "True", "R", "m", t(100))
    }

    #[test]
    fn b2_valid_writes_pass() {
        let old = job(
            JobStatus {
                active: Some(2),
                ready: Some(1),
                start_time: Some(Time(t(50))),
                ..Default::default()
            },
            false,
        );
        let new = JobStatus {
            active: Some(2),
            ready: Some(2),
            terminating: Some(0),
            start_time: Some(Time(t(50))),
            uncounted_terminated_pods: Some(UncountedTerminatedPods::default()),
            ..Default::default()
        };
        assert!(violations(&old, &new).is_empty());
        // Finishing: SuccessCriteriaMet, Complete, completionTime == its transition time.
        let mut fin = new.clone();
        fin.active = Some(0);
        fin.ready = Some(0);
        fin.succeeded = Some(3);
        fin.conditions = Some(vec![cond(SUCCESS_CRITERIA_MET), cond(COMPLETE)]);
        fin.completion_time = Some(Time(t(100)));
        assert!(
            violations(&old, &fin).is_empty(),
            "{:?}",
            violations(&old, &fin)
        );
    }

    #[test]
    fn b2_rejections() {
        let base = JobStatus {
            active: Some(1),
            ready: Some(1),
            failed: Some(2),
            start_time: Some(Time(t(50))),
            ..Default::default()
        };
        let old = job(base.clone(), false);
        let with = |f: &dyn Fn(&mut JobStatus)| {
            let mut s = base.clone();
            f(&mut s);
            violations(&old, &s)
        };
        let cases: Vec<(&str, Vec<String>)> = vec![
            ("ready > active", with(&|s| s.active = Some(0))),
            ("failed decreases", with(&|s| s.failed = Some(1))),
            (
                "Failed without FailureTarget",
                with(&|s| {
                    s.active = Some(0);
                    s.ready = Some(0);
                    s.conditions = Some(vec![cond(FAILED)]);
                }),
            ),
            (
                "Complete without SuccessCriteriaMet",
                with(&|s| {
                    s.active = Some(0);
                    s.ready = Some(0);
                    s.conditions = Some(vec![cond(COMPLETE)]);
                    s.completion_time = Some(Time(t(100)));
                }),
            ),
            (
                "finished with active pods",
                with(&|s| {
                    s.ready = Some(0);
                    s.conditions = Some(vec![cond(FAILURE_TARGET), cond(FAILED)]);
                }),
            ),
            (
                "finished with terminating pods",
                with(&|s| {
                    s.active = Some(0);
                    s.ready = Some(0);
                    s.terminating = Some(1);
                    s.conditions = Some(vec![cond(FAILURE_TARGET), cond(FAILED)]);
                }),
            ),
            (
                "finished with uncounted pods",
                with(&|s| {
                    s.active = Some(0);
                    s.ready = Some(0);
                    s.uncounted_terminated_pods = Some(UncountedTerminatedPods {
                        failed: Some(vec!["u".into()]),
                        succeeded: None,
                    });
                    s.conditions = Some(vec![cond(FAILURE_TARGET), cond(FAILED)]);
                }),
            ),
            (
                "startTime changed on an unsuspended Job",
                with(&|s| s.start_time = Some(Time(t(60)))),
            ),
            (
                "completedIndexes on a NonIndexed Job",
                with(&|s| s.completed_indexes = Some("0".into())),
            ),
            (
                "uncountedTerminatedPods has an empty or repeated UID",
                with(&|s| {
                    s.uncounted_terminated_pods = Some(UncountedTerminatedPods {
                        failed: Some(vec!["u".into()]),
                        succeeded: Some(vec!["u".into()]),
                    });
                }),
            ),
        ];
        for (want, got) in cases {
            assert!(
                got.iter().any(|g| g == want),
                "expected {want:?}, got {got:?}"
            );
        }
    }

    #[test]
    fn b2_start_time_on_resume_and_while_suspended() {
        let mut suspended = JobStatus {
            start_time: Some(Time(t(50))),
            ..Default::default()
        };
        suspended.conditions = Some(vec![new_condition(
            SUSPENDED,
            "True",
            "JobSuspended",
            "Job suspended",
            t(40),
        )]);
        // The user resumed (spec.suspend=false); the controller's resume write moves startTime.
        let old = job(suspended.clone(), false);
        let mut resumed = suspended.clone();
        resumed.start_time = Some(Time(t(90)));
        resumed.conditions = Some(vec![new_condition(
            SUSPENDED,
            "False",
            "JobResumed",
            "Job resumed",
            t(90),
        )]);
        assert!(violations(&old, &resumed).is_empty());
        // Clearing startTime while suspended is allowed.
        let old = job(suspended.clone(), true);
        let mut cleared = suspended;
        cleared.start_time = None;
        assert!(violations(&old, &cleared).is_empty());
    }

    #[test]
    fn index_strings() {
        assert!(valid_indexes("", 3));
        assert!(valid_indexes("0,2", 3));
        assert!(valid_indexes("0-2", 3));
        assert!(!valid_indexes("0-3", 3));
        assert!(!valid_indexes("2,1", 3));
        assert!(!valid_indexes("a", 3));
    }
}
