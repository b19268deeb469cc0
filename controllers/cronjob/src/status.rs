//! The status a CronJob should have (CR-21, CR-29, CR-30, CR-32), computed purely: a sync
//! observes, [`crate::plan`] decides, [`crate::act`] performs, and these functions say what each
//! outcome does to `status` (`active`, `lastScheduleTime`). Active-list upkeep over the owned
//! Jobs is [`crate::plan::upkeep`].

use crate::plan;
use jiff::Timestamp;
use k8s_openapi::api::batch::v1::{CronJobStatus, Job};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

fn uid(job: &Job) -> &str {
    job.metadata.uid.as_deref().unwrap_or_default()
}

/// Whether `status.active` lists the Job with this UID.
pub fn listed(status: &CronJobStatus, job_uid: &str) -> bool {
    status
        .active
        .iter()
        .flatten()
        .any(|a| a.uid.as_deref() == Some(job_uid))
}

/// CR-29: an owned unfinished Job that `status` does not list may be one a write we have not yet
/// observed listed: the CronJob is then read live.
pub fn needs_live_read(status: &CronJobStatus, jobs: &[&Job]) -> bool {
    jobs.iter()
        .any(|j| plan::finished_condition(j).is_none() && !listed(status, uid(j)))
}

/// CR-29: the live copy wins when it lists an owned unfinished Job the cached copy does not.
pub fn live_lists_more(cached: &CronJobStatus, live: &CronJobStatus, jobs: &[&Job]) -> bool {
    jobs.iter().any(|j| {
        plan::finished_condition(j).is_none() && !listed(cached, uid(j)) && listed(live, uid(j))
    })
}

/// CR-27, CR-29, CR-32: the Jobs with these UIDs leave `active` (deleted, or gone).
pub fn remove_all(status: &mut CronJobStatus, job_uids: &[String]) {
    for u in job_uids {
        plan::remove_active(status, u);
    }
}

/// CR-21: the Job started for `scheduled` joins `active`, and `lastScheduleTime` is `scheduled`.
pub fn started(status: &mut CronJobStatus, job: &Job, scheduled: Timestamp) {
    status
        .active
        .get_or_insert_with(Vec::new)
        .push(plan::job_reference(job));
    status.last_schedule_time = Some(Time(scheduled));
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::batch::v1::{JobCondition, JobStatus};
    use k8s_openapi::api::core::v1::ObjectReference;
    use kube::api::ObjectMeta;

    fn job(name: &str, finished: bool) -> Job {
        Job {
            metadata: ObjectMeta {
                name: Some(name.into()),
                namespace: Some("ns".into()),
                uid: Some(format!("uid-{name}")),
                resource_version: Some("7".into()),
                ..Default::default()
            },
            status: finished.then(|| JobStatus {
                conditions: Some(vec![JobCondition {
                    type_: "Complete".into(),
                    status: "True".into(),
                    ..Default::default()
                }]),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    fn listing(names: &[&str]) -> CronJobStatus {
        CronJobStatus {
            active: Some(
                names
                    .iter()
                    .map(|n| ObjectReference {
                        uid: Some(format!("uid-{n}")),
                        ..Default::default()
                    })
                    .collect(),
            ),
            ..Default::default()
        }
    }

    /// CR-29: only an unfinished, unlisted owned Job asks for the live copy, and the live copy
    /// wins only when it lists such a Job.
    #[test]
    fn cr29_live_read_only_for_unlisted_unfinished_jobs() {
        let (running, done) = (job("a", false), job("b", true));
        assert!(!needs_live_read(&listing(&["a"]), &[&running, &done]));
        assert!(needs_live_read(&listing(&[]), &[&running]));
        assert!(!needs_live_read(&listing(&[]), &[&done]));
        assert!(live_lists_more(
            &listing(&[]),
            &listing(&["a"]),
            &[&running]
        ));
        assert!(!live_lists_more(
            &listing(&[]),
            &listing(&["b"]),
            &[&running, &done]
        ));
    }

    /// CR-21, CR-30: a start appends the Job's reference and sets lastScheduleTime; CR-32
    /// removals drop entries by UID.
    #[test]
    fn cr21_start_appends_reference_and_last_schedule_time() {
        let mut status = listing(&["a"]);
        let at: Timestamp = "2026-01-01T00:01:00Z".parse().unwrap();
        started(&mut status, &job("b", false), at);
        let active = status.active.clone().unwrap();
        assert_eq!(active.len(), 2);
        assert_eq!(active[1].name.as_deref(), Some("b"));
        assert_eq!(active[1].kind.as_deref(), Some("Job"));
        assert_eq!(active[1].resource_version.as_deref(), Some("7"));
        assert_eq!(status.last_schedule_time, Some(Time(at)));
        remove_all(&mut status, &["uid-a".to_string()]);
        assert!(listed(&status, "uid-b") && !listed(&status, "uid-a"));
    }
}
