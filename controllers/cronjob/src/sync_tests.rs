//! Sync tests: the whole controller (its real `init`, handlers, queue and sync) against the test
//! kit's caches and recording writer, on tokio's paused clock. The kit's wall clock starts at
//! 2026-01-01T00:00:00Z, so a `*/1 * * * *` CronJob created then first falls due at 00:01:00.

use crate::plan::{self, SCHEDULED_TIMESTAMP_ANNOTATION};
use crate::schedule::DstPolicy;
use crate::{CronJobOptions, DECLARATION, init};
use jiff::Timestamp;
use k8s_openapi::api::batch::v1::{
    CronJob, CronJobSpec, CronJobStatus, Job, JobCondition, JobSpec, JobStatus, JobTemplateSpec,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
use serde_json::Value;
use shared::api::writer::Call;
use shared::testkit::{EPOCH, Kit, Running, eventually, settle};
use std::time::Duration;
use tokio::time::Instant;

/// 2026-01-01T00:01:00Z in minutes since the Unix epoch: the suffix of the first `*/1` Job.
const MINUTE_1: i64 = 29_453_761;

fn at(s: &str) -> Timestamp {
    s.parse().unwrap()
}

fn opts() -> CronJobOptions {
    CronJobOptions {
        concurrent_cron_job_syncs: 5,
        cronjob_dst_policy: DstPolicy::Cron,
        cronjob_default_time_zone: "UTC".into(),
    }
}

/// Builds the controller with its real `init` and starts it as a leading replica.
fn start(kit: &Kit) -> Running {
    kit.start(
        init(
            opts(),
            kit.setup(DECLARATION.name, DECLARATION.event_source),
        )
        .unwrap(),
    )
}

fn cronjob(name: &str, schedule: &str) -> CronJob {
    CronJob {
        metadata: ObjectMeta {
            name: Some(name.into()),
            namespace: Some("ns".into()),
            uid: Some(format!("uid-{name}")),
            resource_version: Some("1".into()),
            creation_timestamp: Some(Time(at(EPOCH))),
            ..Default::default()
        },
        spec: CronJobSpec {
            schedule: schedule.into(),
            job_template: JobTemplateSpec {
                metadata: Some(ObjectMeta {
                    labels: Some([("app".to_string(), name.to_string())].into()),
                    ..Default::default()
                }),
                spec: Some(JobSpec::default()),
            },
            ..Default::default()
        },
        status: None,
    }
}

/// A Job `owner` controls; `finished` is (condition, startTime).
fn job(name: &str, owner: &CronJob, finished: Option<(&str, &str)>) -> Job {
    Job {
        metadata: ObjectMeta {
            name: Some(name.into()),
            namespace: Some("ns".into()),
            uid: Some(format!("uid-{name}")),
            resource_version: Some("1".into()),
            owner_references: Some(vec![plan::controller_ref(owner)]),
            ..Default::default()
        },
        spec: Some(JobSpec::default()),
        status: finished.map(|(condition, start)| JobStatus {
            start_time: Some(Time(at(start))),
            completion_time: (condition == "Complete").then(|| Time(at(start))),
            conditions: Some(vec![JobCondition {
                type_: condition.into(),
                status: "True".into(),
                ..Default::default()
            }]),
            ..Default::default()
        }),
    }
}

fn listing(jobs: &[&Job]) -> Option<CronJobStatus> {
    Some(CronJobStatus {
        active: Some(jobs.iter().map(|j| plan::job_reference(j)).collect()),
        ..Default::default()
    })
}

/// The API requests other than events, as `verb resource[/subresource] name`.
fn requests(kit: &Kit) -> Vec<String> {
    kit.api
        .calls()
        .iter()
        .filter(|c| c.target().plural != "events")
        .map(|c| {
            let t = c.target();
            let name = match c {
                Call::Create(_, body) => body["metadata"]["name"].as_str().unwrap_or_default(),
                _ => t.name.as_str(),
            };
            let sub = t
                .subresource
                .as_deref()
                .map(|s| format!("/{s}"))
                .unwrap_or_default();
            format!("{} {}{sub} {name}", c.verb(), t.plural)
        })
        .collect()
}

/// The bodies of the Job creates, in order.
fn created(kit: &Kit) -> Vec<Value> {
    kit.api
        .calls()
        .into_iter()
        .filter_map(|c| match c {
            Call::Create(t, body) if t.plural == "jobs" => Some(body),
            _ => None,
        })
        .collect()
}

/// The bodies of the CronJob status PUTs for `name`, in order.
fn status_puts(kit: &Kit, name: &str) -> Vec<Value> {
    kit.api
        .calls()
        .into_iter()
        .filter_map(|c| match c {
            Call::Replace(t, body)
                if t.plural == "cronjobs"
                    && t.name == name
                    && t.subresource.as_deref() == Some("status") =>
            {
                Some(body)
            }
            _ => None,
        })
        .collect()
}

fn events(kit: &Kit) -> Vec<String> {
    kit.api
        .events()
        .into_iter()
        .map(|(t, r, m)| format!("{t} {r}: {m}"))
        .collect()
}

fn active_names(status: &Value) -> Vec<String> {
    status["status"]["active"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|a| a["name"].as_str().unwrap_or_default().to_string())
        .collect()
}

/// CR-18, CR-19, CR-20, CR-21, CR-31, CR-2: at the due time exactly one Job named
/// `<cronjob>-<scheduled unix minutes>` is created (template labels, the scheduled-timestamp
/// annotation in UTC, the controller reference), then one status PUT carrying the read
/// resourceVersion with `active` and `lastScheduleTime`; the sync came 100 ms after the time.
/// The next minute's sync starts from our own write (the cache still holds the replaced
/// version), reads the unseen active Job live (CR-29) and creates the next Job.
#[tokio::test(start_paused = true)]
async fn cr18_cr19_cr20_cr21_cr31_a_due_time_creates_one_job_then_one_status_put() {
    let kit = Kit::new();
    let running = start(&kit);
    kit.seed([cronjob("cj", "*/1 * * * *")]);
    let t0 = Instant::now();
    assert!(eventually(Duration::from_secs(120), || !created(&kit).is_empty()).await);
    let waited = t0.elapsed();
    assert!(
        waited >= Duration::from_millis(60_100) && waited < Duration::from_millis(60_150),
        "{waited:?}"
    );
    settle().await;
    let first = format!("cj-{MINUTE_1}");
    assert_eq!(
        requests(&kit),
        [
            format!("create jobs {first}"),
            "update cronjobs/status cj".to_string()
        ]
    );
    let job = &created(&kit)[0];
    assert_eq!(job["metadata"]["namespace"], "ns");
    assert_eq!(job["metadata"]["labels"]["app"], "cj");
    assert_eq!(
        job["metadata"]["annotations"][SCHEDULED_TIMESTAMP_ANNOTATION],
        "2026-01-01T00:01:00Z"
    );
    let owner = &job["metadata"]["ownerReferences"][0];
    assert_eq!(owner["kind"], "CronJob");
    assert_eq!(owner["apiVersion"], "batch/v1");
    assert_eq!(owner["uid"], "uid-cj");
    assert_eq!(owner["controller"], true);
    assert_eq!(owner["blockOwnerDeletion"], true);
    let put = &status_puts(&kit, "cj")[0];
    assert_eq!(put["metadata"]["resourceVersion"], "1");
    assert_eq!(active_names(put), [first.as_str()]);
    assert_eq!(put["status"]["lastScheduleTime"], "2026-01-01T00:01:00Z");
    assert_eq!(
        events(&kit),
        [format!("Normal SuccessfulCreate: Created job {first}")]
    );

    // The next minute: from our own write, not the stale cache (else the PUT would conflict).
    let written_rv = kit
        .api
        .object::<CronJob>("ns", "cj")
        .unwrap()
        .metadata
        .resource_version;
    assert!(eventually(Duration::from_secs(61), || created(&kit).len() == 2).await);
    settle().await;
    let second = format!("cj-{}", MINUTE_1 + 1);
    assert_eq!(
        requests(&kit)[2..],
        [
            format!("get jobs {first}"),
            format!("create jobs {second}"),
            "update cronjobs/status cj".to_string()
        ]
    );
    let put = &status_puts(&kit, "cj")[1];
    assert_eq!(
        put["metadata"]["resourceVersion"].as_str(),
        written_rv.as_deref()
    );
    let stored = kit
        .api
        .object::<CronJob>("ns", "cj")
        .unwrap()
        .status
        .unwrap();
    assert_eq!(stored.active.unwrap().len(), 2);
    assert!(!kit.metrics.encode().contains("result=\"conflict\""));
    running.stop().await;
}

/// CR-27 Forbid: with a running Job the due slot starts nothing (`JobAlreadyActive`, no
/// writes); the slot stays due, so once the Job finishes it starts late.
#[tokio::test(start_paused = true)]
async fn cr27_forbid_with_a_running_job_skips_then_starts_late() {
    let kit = Kit::new();
    let running = start(&kit);
    let mut cj = cronjob("cj", "*/1 * * * *");
    cj.spec.concurrency_policy = Some("Forbid".into());
    let old = job("cj-old", &cj, None);
    cj.status = listing(&[&old]);
    kit.seed([old.clone()]);
    kit.seed([cj]);
    tokio::time::sleep(Duration::from_secs(61)).await;
    settle().await;
    assert!(created(&kit).is_empty());
    assert!(kit.api.writes().is_empty(), "{:?}", requests(&kit));
    assert_eq!(
        events(&kit),
        [
            "Normal JobAlreadyActive: Not starting job because prior execution is running and concurrency policy is Forbid"
        ]
    );
    let mut done = job(
        "cj-old",
        &cronjob("cj", ""),
        Some(("Complete", "2026-01-01T00:00:30Z")),
    );
    done.metadata.resource_version = Some("2".into());
    kit.apply(done);
    assert!(eventually(Duration::from_secs(1), || created(&kit).len() == 1).await);
    settle().await;
    assert_eq!(
        created(&kit)[0]["metadata"]["name"],
        format!("cj-{MINUTE_1}")
    );
    let put = &status_puts(&kit, "cj")[0];
    assert_eq!(active_names(put), [format!("cj-{MINUTE_1}")]);
    assert!(events(&kit).contains(
        &"Normal SawCompletedJob: Saw completed job: cj-old, condition: Complete".to_string()
    ));
    running.stop().await;
}

/// CR-27 Replace: the running Job is read live and deleted with Background propagation
/// (`SuccessfulDelete`), then the new Job is created and is the only one in `active`.
#[tokio::test(start_paused = true)]
async fn cr27_replace_deletes_the_running_job_in_background_then_creates() {
    let kit = Kit::new();
    let running = start(&kit);
    let mut cj = cronjob("cj", "*/1 * * * *");
    cj.spec.concurrency_policy = Some("Replace".into());
    let old = job("cj-old", &cj, None);
    cj.status = listing(&[&old]);
    kit.seed([old]);
    kit.seed([cj]);
    assert!(eventually(Duration::from_secs(61), || !created(&kit).is_empty()).await);
    settle().await;
    let new = format!("cj-{MINUTE_1}");
    assert_eq!(
        requests(&kit),
        [
            "get jobs cj-old".to_string(),
            "delete jobs cj-old".to_string(),
            format!("create jobs {new}"),
            "update cronjobs/status cj".to_string()
        ]
    );
    let propagation = kit.api.calls().into_iter().find_map(|c| match c {
        Call::Delete { propagation, .. } => Some(propagation),
        _ => None,
    });
    assert_eq!(propagation, Some(Some("Background".to_string())));
    assert_eq!(active_names(&status_puts(&kit, "cj")[0]), [new.as_str()]);
    assert_eq!(
        events(&kit),
        [
            "Normal SuccessfulDelete: Deleted job cj-old".to_string(),
            format!("Normal SuccessfulCreate: Created job {new}")
        ]
    );
    running.stop().await;
}

/// CR-20, JB-8: the Job of the due name already exists on the server (a lost status write): it
/// is read in the CronJob's namespace and, being ours and unlisted, taken into `active` without
/// `SuccessfulCreate`. A foreign Job holding the name stops the sync with no status write.
#[tokio::test(start_paused = true)]
async fn b8_cr20_already_exists_takes_our_job_back_and_stops_at_a_foreign_one() {
    let kit = Kit::new();
    let running = start(&kit);
    let ours = cronjob("cj", "*/1 * * * *");
    let foreign_owner = cronjob("other", "*/1 * * * *");
    kit.api.insert(&job(&format!("cj-{MINUTE_1}"), &ours, None));
    let mut foreign = job(&format!("other-{MINUTE_1}"), &foreign_owner, None);
    foreign.metadata.owner_references = None;
    kit.api.insert(&foreign);
    kit.seed([ours, foreign_owner]);
    assert!(
        eventually(Duration::from_secs(61), || !status_puts(&kit, "cj")
            .is_empty())
        .await
    );
    tokio::time::sleep(Duration::from_secs(1)).await;
    let mut reqs = requests(&kit);
    reqs.sort();
    assert_eq!(
        reqs,
        [
            format!("create jobs cj-{MINUTE_1}"),
            format!("create jobs other-{MINUTE_1}"),
            format!("get jobs cj-{MINUTE_1}"),
            format!("get jobs other-{MINUTE_1}"),
            "update cronjobs/status cj".to_string()
        ]
    );
    let put = &status_puts(&kit, "cj")[0];
    assert_eq!(active_names(put), [format!("cj-{MINUTE_1}")]);
    assert_eq!(
        put["status"]["active"][0]["uid"],
        format!("uid-cj-{MINUTE_1}")
    );
    assert_eq!(put["status"]["lastScheduleTime"], "2026-01-01T00:01:00Z");
    assert!(events(&kit).is_empty(), "{:?}", events(&kit));
    running.stop().await;
}

/// CR-32: beyond the history limits (1 successful, 0 failed) the oldest finished Jobs by
/// startTime are deleted with Background propagation, before scheduling, and
/// lastSuccessfulTime follows the newest completion (CR-29). A later sync, while the cache
/// still holds the deleted Jobs, deletes nothing again and writes nothing.
#[tokio::test(start_paused = true)]
async fn cr32_history_limits_delete_the_oldest_finished_jobs_once() {
    let kit = Kit::new();
    let running = start(&kit);
    let mut cj = cronjob("cj", "0 0 1 1 *");
    cj.spec.successful_jobs_history_limit = Some(1);
    cj.spec.failed_jobs_history_limit = Some(0);
    let c1 = job("c1", &cj, Some(("Complete", "2025-12-01T00:00:00Z")));
    let c2 = job("c2", &cj, Some(("Complete", "2025-12-02T00:00:00Z")));
    let c3 = job("c3", &cj, Some(("Complete", "2025-12-03T00:00:00Z")));
    let f1 = job("f1", &cj, Some(("Failed", "2025-12-04T00:00:00Z")));
    kit.seed([c3.clone(), f1, c2, c1]);
    kit.seed([cj]);
    assert!(
        eventually(Duration::from_secs(1), || !status_puts(&kit, "cj")
            .is_empty())
        .await
    );
    settle().await;
    assert_eq!(
        requests(&kit),
        [
            "delete jobs c1",
            "delete jobs c2",
            "delete jobs f1",
            "update cronjobs/status cj"
        ]
    );
    assert!(kit.api.calls().iter().all(|c| match c {
        Call::Delete { propagation, .. } => propagation.as_deref() == Some("Background"),
        _ => true,
    }));
    assert_eq!(
        status_puts(&kit, "cj")[0]["status"]["lastSuccessfulTime"],
        "2025-12-03T00:00:00Z"
    );
    assert_eq!(
        events(&kit),
        [
            "Normal SuccessfulDelete: Deleted job c1",
            "Normal SuccessfulDelete: Deleted job c2",
            "Normal SuccessfulDelete: Deleted job f1"
        ]
    );
    // A Job change syncs the CronJob again before the watch reports the deletions.
    let mut touched = c3;
    touched.metadata.resource_version = Some("2".into());
    kit.apply(touched);
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(requests(&kit).len(), 4, "{:?}", requests(&kit));
    // Both syncs requeue for the next (yearly) time; neither failed.
    let text = kit.metrics.encode();
    assert!(text.contains("result=\"requeue\"} 2"), "{text}");
    running.stop().await;
}

/// CR-28: a suspended CronJob creates nothing and is not requeued, however long it is due; on
/// resume one Job starts, for the most recent due time.
#[tokio::test(start_paused = true)]
async fn cr28_suspend_creates_nothing_and_resume_starts_one() {
    let kit = Kit::new();
    let running = start(&kit);
    let mut cj = cronjob("cj", "*/1 * * * *");
    cj.spec.suspend = Some(true);
    kit.seed([cj.clone()]);
    tokio::time::sleep(Duration::from_secs(330)).await;
    assert!(kit.api.writes().is_empty(), "{:?}", requests(&kit));
    let text = kit.metrics.encode();
    assert!(text.contains("result=\"success\"} 1"), "{text}");
    assert!(!text.contains("result=\"requeue\""), "{text}");
    cj.spec.suspend = Some(false);
    cj.metadata.resource_version = Some("2".into());
    kit.api.insert(&cj);
    kit.apply(cj);
    assert!(
        eventually(Duration::from_secs(1), || !status_puts(&kit, "cj")
            .is_empty())
        .await
    );
    settle().await;
    assert_eq!(created(&kit).len(), 1);
    assert_eq!(
        created(&kit)[0]["metadata"]["name"],
        format!("cj-{}", MINUTE_1 + 4)
    );
    running.stop().await;
}

/// CR-12, CR-22, CR-4: an unknown time zone (`UnknownTimeZone`), a schedule that never fires
/// (`InvalidSchedule`) and an unparseable one (`UnparseableSchedule`) get their Warning and no
/// Job, while another CronJob still fires on time.
#[tokio::test(start_paused = true)]
async fn cr12_cr22_bad_zone_or_schedule_warns_and_another_cronjob_still_fires() {
    let kit = Kit::new();
    let running = start(&kit);
    let mut zone = cronjob("zone", "*/1 * * * *");
    zone.spec.time_zone = Some("Mars/Olympus".into());
    kit.seed([
        zone,
        cronjob("never", "59 23 31 2 *"),
        cronjob("garbage", "every minute"),
        cronjob("ok", "*/1 * * * *"),
    ]);
    assert!(eventually(Duration::from_secs(61), || !created(&kit).is_empty()).await);
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(
        requests(&kit),
        [
            format!("create jobs ok-{MINUTE_1}"),
            "update cronjobs/status ok".to_string()
        ]
    );
    let events = events(&kit);
    let has = |prefix: &str| events.iter().any(|e| e.starts_with(prefix));
    assert!(
        has("Warning UnknownTimeZone: invalid timeZone: \"Mars/Olympus\": "),
        "{events:?}"
    );
    assert!(
        has(
            "Warning InvalidSchedule: invalid schedule: 59 23 31 2 * : time difference between two schedules is less than 1 second"
        ),
        "{events:?}"
    );
    assert!(
        has("Warning UnparseableSchedule: unparseable schedule: \"every minute\" : "),
        "{events:?}"
    );
    assert!(
        has(&format!(
            "Normal SuccessfulCreate: Created job ok-{MINUTE_1}"
        )),
        "{events:?}"
    );
    assert_eq!(kit.panics(), 0.0, "{}", kit.metrics.encode());
    running.stop().await;
}

/// CR-3: a schedule change is waited for from the new schedule's next time; an unparseable new
/// schedule gets `UnParseableCronJobSchedule` and is not queued.
#[tokio::test(start_paused = true)]
async fn cr3_schedule_changes_requeue_at_the_new_time_or_warn() {
    let kit = Kit::new();
    let running = start(&kit);
    let yearly = cronjob("cj", "0 0 1 1 *");
    kit.seed([yearly.clone(), cronjob("bad", "0 0 1 1 *")]);
    tokio::time::sleep(Duration::from_secs(10)).await;
    let mut every_minute = yearly;
    every_minute.spec.schedule = "*/1 * * * *".into();
    every_minute.metadata.resource_version = Some("2".into());
    kit.api.insert(&every_minute);
    kit.apply(every_minute);
    let mut bad = cronjob("bad", "bogus");
    bad.metadata.resource_version = Some("2".into());
    kit.apply(bad);
    let t0 = Instant::now();
    assert!(eventually(Duration::from_secs(60), || !created(&kit).is_empty()).await);
    let waited = t0.elapsed();
    assert!(
        waited >= Duration::from_millis(50_100) && waited < Duration::from_millis(50_150),
        "{waited:?}"
    );
    assert_eq!(
        created(&kit)[0]["metadata"]["name"],
        format!("cj-{MINUTE_1}")
    );
    assert_eq!(
        events(&kit)[0],
        "Warning UnParseableCronJobSchedule: unparseable schedule for cronjob: bogus"
    );
    assert!(
        !events(&kit)
            .iter()
            .any(|e| e.contains("UnparseableSchedule"))
    );
    running.stop().await;
}
