//! One case per CronJob rule (CR-n, JB-n), no API.

use super::*;
use crate::schedule::{ZoneSource, parse};
use k8s_openapi::api::batch::v1::{CronJobSpec, JobCondition, JobStatus, JobTemplateSpec};

struct Zones;
impl ZoneSource for Zones {
    fn load(&self, name: &str) -> Result<Zone, String> {
        Zone::load(name, &Zone::utc())
    }
    fn local(&self) -> Zone {
        Zone::utc()
    }
}

fn at(s: &str) -> Timestamp {
    s.parse().unwrap()
}

fn cj(schedule: &str, created: &str) -> CronJob {
    CronJob {
        metadata: ObjectMeta {
            name: Some("cj".into()),
            namespace: Some("ns".into()),
            uid: Some("cj-uid".into()),
            creation_timestamp: Some(Time(at(created))),
            ..Default::default()
        },
        spec: CronJobSpec {
            schedule: schedule.into(),
            job_template: JobTemplateSpec::default(),
            successful_jobs_history_limit: Some(3),
            failed_jobs_history_limit: Some(1),
            ..Default::default()
        },
        status: Some(CronJobStatus::default()),
    }
}

fn with_last(mut c: CronJob, last: &str) -> CronJob {
    c.status.as_mut().unwrap().last_schedule_time = Some(Time(at(last)));
    c
}

fn sched(c: &CronJob) -> Schedule {
    parse(&c.spec.schedule, &Zones).unwrap()
}

fn run(c: &CronJob, now: &str) -> Plan {
    plan(c, at(now), &sched(c), DstPolicy::Upstream, None)
}

fn reasons(p: &Plan) -> Vec<&'static str> {
    p.events.iter().map(|e| e.reason).collect()
}

fn job(
    name: &str,
    uid: &str,
    condition: Option<&str>,
    start: Option<&str>,
    done: Option<&str>,
) -> Job {
    Job {
        metadata: ObjectMeta {
            name: Some(name.into()),
            namespace: Some("ns".into()),
            uid: Some(uid.into()),
            owner_references: Some(vec![OwnerReference {
                api_version: "batch/v1".into(),
                kind: "CronJob".into(),
                name: "cj".into(),
                uid: "cj-uid".into(),
                controller: Some(true),
                block_owner_deletion: Some(true),
            }]),
            ..Default::default()
        },
        spec: None,
        status: Some(JobStatus {
            conditions: condition.map(|c| {
                vec![JobCondition {
                    type_: c.into(),
                    status: "True".into(),
                    ..Default::default()
                }]
            }),
            start_time: start.map(|s| Time(at(s))),
            completion_time: done.map(|s| Time(at(s))),
            ..Default::default()
        }),
    }
}

fn reference(name: &str, uid: &str) -> ObjectReference {
    ObjectReference {
        name: Some(name.into()),
        namespace: Some("ns".into()),
        uid: Some(uid.into()),
        ..Default::default()
    }
}

#[test]
fn cr18_job_name_is_unix_minutes() {
    let c = cj("*/1 * * * *", "2026-03-01T09:58:10Z");
    assert_eq!(job_name(&c, at("2026-03-01T10:00:00Z")), "cj-29539320");
}

#[test]
fn cr22_never_fires_for_the_creation_minute_and_waits_for_t1() {
    let c = cj("*/1 * * * *", "2026-03-01T10:00:20Z");
    let p = run(&c, "2026-03-01T10:00:50Z");
    assert_eq!(
        p.decision,
        Decision::Wait(Some(Duration::from_millis(10_100)))
    );
    let p = run(&c, "2026-03-01T10:01:00.5Z");
    assert_eq!(
        p.decision,
        Decision::Start {
            scheduled: at("2026-03-01T10:01:00Z"),
            replace: false
        }
    );
}

#[test]
fn cr23_only_the_latest_missed_time_starts() {
    let c = with_last(
        cj("*/1 * * * *", "2026-03-01T09:00:00Z"),
        "2026-03-01T10:00:00Z",
    );
    let p = run(&c, "2026-03-01T10:07:30Z");
    assert_eq!(
        p.decision,
        Decision::Start {
            scheduled: at("2026-03-01T10:07:00Z"),
            replace: false
        }
    );
    assert!(p.events.is_empty());
}

#[test]
fn cr24_many_missed_warns_and_still_starts_the_latest() {
    let c = with_last(
        cj("*/1 * * * *", "2026-01-01T00:00:00Z"),
        "2026-01-01T00:00:00Z",
    );
    let p = run(&c, "2026-03-01T10:07:30Z");
    assert_eq!(reasons(&p), ["TooManyMissedTimes"]);
    assert!(
        matches!(p.decision, Decision::Start { scheduled, .. } if scheduled == at("2026-03-01T10:07:00Z"))
    );
    // Exactly 100 misses is still "few".
    let c = with_last(
        cj("*/1 * * * *", "2026-01-01T00:00:00Z"),
        "2026-03-01T08:27:00Z",
    );
    let r = most_recent(
        &c,
        at("2026-03-01T10:07:30Z"),
        &sched(&c),
        DstPolicy::Upstream,
        true,
    );
    assert_eq!(r.missed, Missed::Few);
}

/// API-valid extremes: startingDeadlineSeconds = int64 max is no deadline at all, not a panic.
#[test]
fn cr25_int64_max_starting_deadline_neither_panics_nor_clamps() {
    let mut c = cj("0 * * * *", "2026-03-01T09:01:00Z");
    c.spec.starting_deadline_seconds = Some(i64::MAX);
    assert!(matches!(
        run(&c, "2026-03-01T10:02:00Z").decision,
        Decision::Start { .. }
    ));
}

#[test]
fn cr25_past_the_deadline_is_skipped_silently_as_upstream() {
    // startingDeadlineSeconds also moves `earliest` to now - SDS, so every slot found is younger
    // than the deadline: upstream's MissSchedule branch cannot fire (its own test "never ran, is
    // time, past deadline" expects no warning). The slot is skipped and the next one awaited.
    let mut c = cj("0 * * * *", "2026-03-01T09:01:00Z");
    c.spec.starting_deadline_seconds = Some(60);
    let p = run(&c, "2026-03-01T10:02:00Z");
    assert!(p.events.is_empty());
    assert_eq!(
        p.decision,
        Decision::Wait(Some(Duration::from_millis(58 * 60_000 + 100)))
    );
    // Within the deadline it starts.
    c.spec.starting_deadline_seconds = Some(300);
    assert!(matches!(
        run(&c, "2026-03-01T10:02:00Z").decision,
        Decision::Start { .. }
    ));
    assert_eq!(
        rfc1123z(at("2026-03-01T10:00:00Z")),
        "Sun, 01 Mar 2026 10:00:00 +0000"
    );
}

#[test]
fn cr26_a_slot_already_taken_waits() {
    let c = with_last(
        cj("*/1 * * * *", "2026-03-01T09:00:00Z"),
        "2026-03-01T10:07:00Z",
    );
    let p = run(&c, "2026-03-01T10:07:30Z");
    assert_eq!(
        p.decision,
        Decision::Wait(Some(Duration::from_millis(30_100)))
    );
    let mut c = with_last(
        cj("*/1 * * * *", "2026-03-01T09:00:00Z"),
        "2026-03-01T10:06:00Z",
    );
    c.status.as_mut().unwrap().active = Some(vec![reference("cj-29539327", "j")]);
    let p = run(&c, "2026-03-01T10:07:30Z");
    assert!(matches!(p.decision, Decision::Wait(_)));
}

#[test]
fn cr27_concurrency_policies() {
    let mut c = with_last(
        cj("*/1 * * * *", "2026-03-01T09:00:00Z"),
        "2026-03-01T10:06:00Z",
    );
    c.status.as_mut().unwrap().active = Some(vec![reference("cj-29539326", "j")]);
    assert!(matches!(
        run(&c, "2026-03-01T10:07:30Z").decision,
        Decision::Start { replace: false, .. }
    ));
    c.spec.concurrency_policy = Some("Forbid".into());
    let p = run(&c, "2026-03-01T10:07:30Z");
    assert_eq!(reasons(&p), ["JobAlreadyActive"]);
    assert_eq!(
        p.decision,
        Decision::Wait(Some(Duration::from_millis(30_100)))
    );
    c.spec.concurrency_policy = Some("Replace".into());
    assert!(matches!(
        run(&c, "2026-03-01T10:07:30Z").decision,
        Decision::Start { replace: true, .. }
    ));
}

#[test]
fn cr22_slots_under_a_second_apart_are_invalid() {
    // A field that matches nothing: no next time at all.
    let c = cj("59 23 31 2 *", "2026-03-01T09:00:00Z");
    let p = run(&c, "2026-03-01T10:00:00Z");
    assert_eq!(reasons(&p), ["InvalidSchedule"]);
    assert_eq!(p.decision, Decision::Wait(None));
    assert_eq!(
        p.events[0].note,
        "invalid schedule: 59 23 31 2 * : time difference between two schedules is less than 1 second"
    );
}

#[test]
fn cr31_requeue_points() {
    // Nothing due: next after earliest; missed: next after now; due: next after the due time.
    let c = cj("*/5 * * * *", "2026-03-01T10:01:00Z");
    let s = sched(&c);
    let d = requeue_after(&c, at("2026-03-01T10:02:00Z"), &s, DstPolicy::Upstream);
    assert_eq!(d, Some(Duration::from_millis(180_100)));
    let d = requeue_after(&c, at("2026-03-01T10:06:00Z"), &s, DstPolicy::Upstream);
    assert_eq!(d, Some(Duration::from_millis(240_100)));
    let c = with_last(c, "2026-03-01T10:05:00Z");
    let d = requeue_after(&c, at("2026-03-01T10:05:00.25Z"), &s, DstPolicy::Upstream);
    assert_eq!(d, Some(Duration::from_millis(299_850)));
}

#[test]
fn cr29_active_list_upkeep() {
    let mut status = CronJobStatus {
        active: Some(vec![
            reference("done", "u1"),
            reference("running", "u2"),
            reference("gone", "u3"),
        ]),
        last_successful_time: Some(Time(at("2026-03-01T09:00:00Z"))),
        ..Default::default()
    };
    let done = job(
        "done",
        "u1",
        Some("Complete"),
        Some("2026-03-01T09:59:00Z"),
        Some("2026-03-01T10:00:30Z"),
    );
    let running = job("running", "u2", None, Some("2026-03-01T10:00:00Z"), None);
    let stray = job("stray", "u4", None, None, None);
    let old = job(
        "old",
        "u5",
        Some("Complete"),
        Some("2026-03-01T08:00:00Z"),
        Some("2026-03-01T08:01:00Z"),
    );
    let u = upkeep(&status, &[&done, &running, &stray, &old]);
    assert!(u.changed);
    let kept: Vec<_> = u
        .status
        .active
        .iter()
        .flatten()
        .map(|a| a.name.clone().unwrap())
        .collect();
    assert_eq!(kept, ["running", "gone"]);
    assert_eq!(
        u.status.last_successful_time,
        Some(Time(at("2026-03-01T10:00:30Z")))
    );
    let r: Vec<_> = u
        .events
        .iter()
        .map(|e| (e.reason, e.note.as_str()))
        .collect();
    assert_eq!(
        r,
        [
            (
                "SawCompletedJob",
                "Saw completed job: done, condition: Complete"
            ),
            (
                "UnexpectedJob",
                "Saw a job that the controller did not create or forgot: stray"
            ),
        ]
    );
    assert_eq!(u.unseen, [reference("gone", "u3")]);
    // A failed Job leaves active with its condition named and never moves lastSuccessfulTime.
    status.active = Some(vec![reference("f", "u6")]);
    let failed = job("f", "u6", Some("Failed"), None, None);
    let u = upkeep(&status, &[&failed]);
    assert_eq!(u.events[0].note, "Saw completed job: f, condition: Failed");
    assert_eq!(u.status.last_successful_time, status.last_successful_time);
}

#[test]
fn cr32_history_oldest_by_start_time_unset_last() {
    let mut c = cj("*/1 * * * *", "2026-03-01T09:00:00Z");
    c.spec.successful_jobs_history_limit = Some(1);
    c.spec.failed_jobs_history_limit = Some(0);
    let a = job(
        "a",
        "1",
        Some("Complete"),
        Some("2026-03-01T10:02:00Z"),
        None,
    );
    let b = job(
        "b",
        "2",
        Some("Complete"),
        Some("2026-03-01T10:01:00Z"),
        None,
    );
    let n = job("n", "3", Some("Complete"), None, None);
    let f = job("f", "4", Some("Failed"), None, None);
    let r = job("r", "5", None, Some("2026-03-01T10:00:00Z"), None);
    let gone: Vec<_> = history_to_delete(&c, &[&a, &b, &n, &f, &r])
        .iter()
        .map(|j| j.metadata.name.clone().unwrap())
        .collect();
    assert_eq!(gone, ["b", "a", "f"]);
    // Unset limits delete nothing.
    c.spec.successful_jobs_history_limit = None;
    c.spec.failed_jobs_history_limit = None;
    assert!(history_to_delete(&c, &[&a, &b, &n, &f]).is_empty());
}

#[test]
fn cr19_job_from_template() {
    let mut c = cj("*/1 * * * *", "2026-03-01T09:00:00Z");
    let t = &mut c.spec.job_template;
    t.metadata = Some(ObjectMeta {
        labels: Some([("app".to_string(), "x".to_string())].into()),
        annotations: Some([("note".to_string(), "y".to_string())].into()),
        ..Default::default()
    });
    let kolkata = Zone::bundled("Asia/Kolkata").unwrap();
    let j = job_for(&c, at("2026-03-01T10:00:00Z"), &kolkata);
    let a = j.metadata.annotations.unwrap();
    assert_eq!(
        a[SCHEDULED_TIMESTAMP_ANNOTATION],
        "2026-03-01T15:30:00+05:30"
    );
    assert_eq!(a["note"], "y");
    assert_eq!(j.metadata.labels.unwrap()["app"], "x");
    assert_eq!(j.metadata.name.as_deref(), Some("cj-29539320"));
    let o = &j.metadata.owner_references.unwrap()[0];
    assert_eq!(
        (
            o.kind.as_str(),
            o.uid.as_str(),
            o.controller,
            o.block_owner_deletion
        ),
        ("CronJob", "cj-uid", Some(true), Some(true))
    );
    let utc = job_for(&c, at("2026-03-01T10:00:00Z"), &Zone::utc());
    assert_eq!(
        utc.metadata.annotations.unwrap()[SCHEDULED_TIMESTAMP_ANNOTATION],
        "2026-03-01T10:00:00Z"
    );
}

#[test]
fn b7_ownership_needs_kind_group_and_uid() {
    let mut j = job("x", "1", None, None, None);
    assert!(controlled_by(&j, "cj-uid"));
    assert!(!controlled_by(&j, "other"));
    j.metadata.owner_references.as_mut().unwrap()[0].kind = "Deployment".into();
    assert!(!controlled_by(&j, "cj-uid"));
    j.metadata.owner_references.as_mut().unwrap()[0].kind = "CronJob".into();
    j.metadata.owner_references.as_mut().unwrap()[0].api_version = "example.com/v1".into();
    assert!(!controlled_by(&j, "cj-uid"));
}

#[test]
fn b7_a_group_without_version_is_not_batch() {
    let mut j = job("x", "1", None, None, None);
    j.metadata.owner_references.as_mut().unwrap()[0].api_version = "batch".into();
    assert!(
        !controlled_by(&j, "cj-uid"),
        "\"batch\" is a core version string, not group batch"
    );
    j.metadata.owner_references.as_mut().unwrap()[0].api_version = "batch/v1beta1".into();
    assert!(controlled_by(&j, "cj-uid"), "any version of group batch");
}
