//! Sync tests: the whole controller (its real `init`, handlers, queues and syncs) against the test
//! kit's caches and recording writer, on tokio's paused clock. Writes reach the caches only when
//! a test lets the watch catch up (`Kit::observe`).

use crate::pods::testing::{P, pod};
use crate::{DECLARATION, JobOptions, init};
use k8s_openapi::api::batch::v1::{
    Job, JobSpec, JobStatus, PodFailurePolicy, PodFailurePolicyOnExitCodesRequirement,
    PodFailurePolicyRule,
};
use k8s_openapi::api::core::v1::{PodSpec, PodTemplateSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{
    LabelSelector, ObjectMeta, OwnerReference, Time,
};
use serde_json::{Value, json};
use shared::api::writer::Call;
use shared::cache::pod::Pod;
use shared::testkit::{EPOCH, Kit, Running, api_error, eventually};
use std::collections::BTreeMap;
use std::time::Duration;

fn labels() -> BTreeMap<String, String> {
    BTreeMap::from([("job-name".to_string(), "j".to_string())])
}

fn job(parallelism: i32, completions: i32) -> Job {
    Job {
        metadata: ObjectMeta {
            name: Some("j".into()),
            namespace: Some("ns".into()),
            uid: Some("uid-j".into()),
            resource_version: Some("1".into()),
            generation: Some(1),
            ..Default::default()
        },
        spec: Some(JobSpec {
            parallelism: Some(parallelism),
            completions: Some(completions),
            backoff_limit: Some(6),
            selector: Some(LabelSelector {
                match_labels: Some(labels()),
                ..Default::default()
            }),
            template: PodTemplateSpec {
                metadata: Some(ObjectMeta {
                    labels: Some(labels()),
                    ..Default::default()
                }),
                spec: Some(PodSpec {
                    restart_policy: Some("Never".into()),
                    ..Default::default()
                }),
            },
            ..Default::default()
        }),
        status: None,
    }
}

/// A pod of `job` (controller reference, labels, finalizer), as the watch delivers it.
fn owned(p: P, job: &Job) -> Pod {
    let mut p = p.build();
    p.metadata.owner_references = Some(vec![shared::meta::refs::controller_ref(job)]);
    p.metadata.labels = Some(labels());
    p.metadata.resource_version = Some("1".into());
    p
}

fn epoch_secs() -> i64 {
    EPOCH
        .parse::<k8s_openapi::jiff::Timestamp>()
        .unwrap()
        .as_second()
}

/// Builds the controller, seeds the caches (after `init`: pods are projected to its declared
/// fields), then starts it.
fn start(kit: &Kit, jobs: Vec<Job>, pods: Vec<Pod>) -> Running {
    let opts = JobOptions {
        concurrent_job_syncs: 5,
    };
    let controller = init(opts, kit.setup(DECLARATION.name, DECLARATION.event_source)).unwrap();
    kit.seed(jobs);
    kit.seed(pods);
    kit.start(controller)
}

fn pod_creates(kit: &Kit) -> usize {
    kit.api
        .calls()
        .iter()
        .filter(|c| matches!(c, Call::Create(t, _) if t.plural == "pods"))
        .count()
}

/// The status bodies of the Job status PUTs, in order.
fn status_puts(kit: &Kit) -> Vec<Value> {
    kit.api
        .calls()
        .into_iter()
        .filter_map(|c| match c {
            Call::Replace(t, v)
                if t.plural == "jobs" && t.subresource.as_deref() == Some("status") =>
            {
                Some(v["status"].clone())
            }
            _ => None,
        })
        .collect()
}

/// Writes as `verb plural/name`, for order assertions.
fn writes(kit: &Kit) -> Vec<String> {
    kit.api
        .writes()
        .iter()
        .map(|c| format!("{} {}/{}", c.verb(), c.target().plural, c.target().name))
        .collect()
}

fn events(kit: &Kit) -> Vec<String> {
    kit.api
        .events()
        .into_iter()
        .map(|(t, r, m)| format!("{t} {r}: {m}"))
        .collect()
}

fn condition<'a>(status: &'a Value, type_: &str) -> Option<&'a Value> {
    status["conditions"]
        .as_array()?
        .iter()
        .find(|c| c["type"] == type_)
}

const REMOVE_FINALIZER: &str = "batch.kubernetes.io/job-tracking";

fn finalizer_patch(kit: &Kit, pod: &str) -> bool {
    kit.api.calls().iter().any(|c| {
        matches!(c, Call::Patch(t, _, body) if t.plural == "pods" && t.name == pod
            && body == &json!({"metadata": {"$deleteFromPrimitiveList/finalizers": [REMOVE_FINALIZER]}}))
    })
}

/// JR-18, JR-20, JR-21, JR-8: creates go in batches of 1, 2, 4; a failing batch skips the rest;
/// nothing more is created until the cache has seen our status write (a stale-cache sync is
/// deferred and counted) and every pod we created; then the rest are created.
#[tokio::test(start_paused = true)]
async fn jr18_jr21_creates_in_batches_and_waits_for_the_creations_to_be_observed() {
    let kit = Kit::new();
    let mut creates = 0;
    kit.api.fail_when(move |c| {
        if matches!(c, Call::Create(t, _) if t.plural == "pods") {
            creates += 1;
            if creates == 2 {
                return Some(api_error(500, "InternalError", "injected"));
            }
        }
        None
    });
    let running = start(&kit, vec![job(7, 7)], vec![]);
    // Batch 1 (one pod), batch 2 (two pods, one failing): the batch of four is skipped.
    assert!(eventually(Duration::from_secs(1), || pod_creates(&kit) == 3).await);
    tokio::time::sleep(Duration::from_secs(10)).await;
    assert_eq!(pod_creates(&kit), 3);
    let puts = status_puts(&kit);
    assert_eq!(puts.len(), 1, "{puts:?}");
    assert_eq!(puts[0]["active"], 2);
    let text = kit.metrics.encode();
    assert!(
        text.contains(r#"job_controller_stale_sync_skips_total{group="batch",resource="jobs"}"#),
        "{text}"
    );
    assert!(
        text.contains(
            r#"job_controller_job_pods_creation_total{reason="new",status="succeeded"} 2"#
        ),
        "{text}"
    );
    assert!(
        text.contains(r#"job_controller_job_pods_creation_total{reason="new",status="failed"} 1"#),
        "{text}"
    );
    // The Job catches up, the two created pods not yet: expectations hold pod management back.
    kit.observe::<Job>("ns", "j");
    tokio::time::sleep(Duration::from_secs(10)).await;
    assert_eq!(pod_creates(&kit), 3);
    // Both creations observed: the missing five are created (batches 1, 2, 2).
    kit.observe::<Job>("ns", "j");
    for p in kit.api.objects::<Pod>() {
        kit.observe::<Pod>("ns", p.metadata.name.as_deref().unwrap());
    }
    assert!(eventually(Duration::from_secs(120), || pod_creates(&kit) == 8).await);
    tokio::time::sleep(Duration::from_secs(10)).await;
    assert_eq!(pod_creates(&kit), 8);
    assert_eq!(kit.api.objects::<Pod>().len(), 7);
    let ev = events(&kit);
    assert_eq!(
        ev.iter()
            .filter(|e| e.starts_with("Normal SuccessfulCreate: Created pod: j-"))
            .count(),
        7,
        "{ev:?}"
    );
    assert_eq!(
        ev.iter()
            .filter(|e| e.starts_with("Warning FailedCreate: Error creating:"))
            .count(),
        1,
        "{ev:?}"
    );
    running.stop().await;
}

/// JR-26, JR-30, JR-49, JR-51, JR-52: a succeeded pod is counted in two steps: its UID goes into
/// `uncountedTerminatedPods` (with the pending `SuccessCriteriaMet`) by a status PUT, then its
/// finalizer is removed, then the counters move and `Complete` is written, with
/// `completionTime` equal to its transition time.
#[tokio::test(start_paused = true)]
async fn jr26_a_finished_pod_is_written_ahead_then_released_then_counted() {
    let kit = Kit::new();
    let j = job(1, 1);
    let p0 = owned(pod("p0").exit(0, epoch_secs() - 5), &j);
    let running = start(&kit, vec![j], vec![p0]);
    assert!(eventually(Duration::from_secs(2), || status_puts(&kit).len() == 2).await);
    assert_eq!(
        writes(&kit),
        ["update jobs/j", "patch pods/p0", "update jobs/j"]
    );
    assert!(finalizer_patch(&kit, "p0"));
    let puts = status_puts(&kit);
    assert_eq!(
        puts[0]["uncountedTerminatedPods"]["succeeded"],
        json!(["uid-p0"])
    );
    assert!(puts[0]["succeeded"].is_null(), "{}", puts[0]);
    assert_eq!(
        condition(&puts[0], "SuccessCriteriaMet").unwrap()["reason"],
        "CompletionsReached"
    );
    assert!(condition(&puts[0], "Complete").is_none());
    assert_eq!(puts[1]["succeeded"], 1);
    assert_eq!(puts[1]["uncountedTerminatedPods"], json!({}));
    let complete = condition(&puts[1], "Complete").unwrap();
    assert_eq!(complete["status"], "True");
    assert_eq!(puts[1]["completionTime"], complete["lastTransitionTime"]);
    assert!(puts[1]["startTime"].is_string());
    assert_eq!(events(&kit), ["Normal Completed: Job completed"]);
    let text = kit.metrics.encode();
    assert!(text.contains(r#"job_controller_jobs_finished_total{completion_mode="NonIndexed",result="succeeded",reason="CompletionsReached"} 1"#), "{text}");
    assert!(text.contains(r#"job_controller_job_pods_finished_total{completion_mode="NonIndexed",result="succeeded"} 1"#), "{text}");
    // JR-7: nothing more for this Job, whatever the cache says next.
    kit.observe::<Job>("ns", "j");
    kit.observe::<Pod>("ns", "p0");
    tokio::time::sleep(Duration::from_secs(10)).await;
    assert_eq!(writes(&kit).len(), 3);
    running.stop().await;
}

/// JR-36, JR-47, JR-49, JR-51: a pod failing with an exit code a `FailJob` rule matches
/// (container statuses are declared pod fields) fails the Job: `FailureTarget` with the rule's
/// message first, then the finalizer, then `Failed` and its Warning event.
#[tokio::test(start_paused = true)]
async fn jr36_fail_job_exit_code_writes_failure_target_then_failed() {
    let kit = Kit::new();
    let mut j = job(1, 1);
    j.spec.as_mut().unwrap().pod_failure_policy = Some(PodFailurePolicy {
        rules: vec![PodFailurePolicyRule {
            action: "FailJob".into(),
            on_exit_codes: Some(PodFailurePolicyOnExitCodesRequirement {
                operator: "In".into(),
                values: vec![42],
                container_name: None,
            }),
            on_pod_conditions: None,
        }],
    });
    let p0 = owned(pod("p0").exit(42, epoch_secs() - 5), &j);
    let running = start(&kit, vec![j], vec![p0]);
    assert!(eventually(Duration::from_secs(2), || status_puts(&kit).len() == 2).await);
    assert_eq!(
        writes(&kit),
        ["update jobs/j", "patch pods/p0", "update jobs/j"]
    );
    let puts = status_puts(&kit);
    let message =
        "Container c for pod ns/p0 failed with exit code 42 matching FailJob rule at index 0";
    let target = condition(&puts[0], "FailureTarget").unwrap();
    assert_eq!(
        (&target["reason"], &target["message"]),
        (&json!("PodFailurePolicy"), &json!(message))
    );
    assert_eq!(
        puts[0]["uncountedTerminatedPods"]["failed"],
        json!(["uid-p0"])
    );
    assert!(condition(&puts[0], "Failed").is_none());
    assert_eq!(puts[1]["failed"], 1);
    let failed = condition(&puts[1], "Failed").unwrap();
    assert_eq!(
        (&failed["reason"], &failed["message"]),
        (&json!("PodFailurePolicy"), &json!(message))
    );
    assert_eq!(
        events(&kit),
        [format!("Warning PodFailurePolicy: {message}")]
    );
    let text = kit.metrics.encode();
    assert!(
        text.contains(
            r#"job_controller_pod_failures_handled_by_failure_policy_total{action="FailJob"} 1"#
        ),
        "{text}"
    );
    assert!(text.contains(r#"job_controller_jobs_finished_total{completion_mode="NonIndexed",result="failed",reason="PodFailurePolicy"} 1"#), "{text}");
    running.stop().await;
}

/// JR-44, JR-16: suspending deletes every active pod finalizer-first (never counted as failed),
/// writes `Suspended=True` with `startTime` cleared, and emits `Suspended`.
#[tokio::test(start_paused = true)]
async fn jr44_suspend_deletes_pods_finalizer_first_and_clears_start_time() {
    let kit = Kit::new();
    let mut j = job(2, 2);
    j.spec.as_mut().unwrap().suspend = Some(true);
    j.status = Some(JobStatus {
        active: Some(2),
        ready: Some(0),
        terminating: Some(0),
        start_time: Some(Time(EPOCH.parse().unwrap())),
        ..Default::default()
    });
    let pods = vec![
        owned(pod("p0").running(), &j),
        owned(pod("p1").running(), &j),
    ];
    let running = start(&kit, vec![j], pods);
    assert!(eventually(Duration::from_secs(2), || status_puts(&kit).len() == 1).await);
    let w = writes(&kit);
    assert_eq!(w.len(), 5, "{w:?}");
    for p in ["p0", "p1"] {
        let patch = w
            .iter()
            .position(|c| *c == format!("patch pods/{p}"))
            .unwrap();
        let delete = w
            .iter()
            .position(|c| *c == format!("delete pods/{p}"))
            .unwrap();
        assert!(patch < delete, "{w:?}");
        assert!(finalizer_patch(&kit, p));
    }
    assert_eq!(w[4], "update jobs/j");
    let put = &status_puts(&kit)[0];
    let suspended = condition(put, "Suspended").unwrap();
    assert_eq!(
        (&suspended["status"], &suspended["reason"]),
        (&json!("True"), &json!("JobSuspended"))
    );
    assert!(put["startTime"].is_null(), "{put}");
    assert_eq!(
        (&put["active"], &put["terminating"]),
        (&json!(0), &json!(2))
    );
    assert!(put["failed"].is_null(), "{put}");
    let ev = events(&kit);
    assert_eq!(
        ev.iter()
            .filter(|e| e.starts_with("Normal SuccessfulDelete: Deleted pod: p"))
            .count(),
        2,
        "{ev:?}"
    );
    assert!(
        ev.contains(&"Normal Suspended: Job suspended".to_string()),
        "{ev:?}"
    );
    running.stop().await;
}

/// JR-32: more failed pods than `backoffLimit` fail the Job with `BackoffLimitExceeded`, after
/// both failures were written ahead and released.
#[tokio::test(start_paused = true)]
async fn jr32_backoff_limit_exceeded_fails_the_job() {
    let kit = Kit::new();
    let mut j = job(1, 1);
    j.spec.as_mut().unwrap().backoff_limit = Some(1);
    let pods = vec![
        owned(pod("p0").exit(1, epoch_secs() - 20), &j),
        owned(pod("p1").exit(1, epoch_secs() - 10), &j),
    ];
    let running = start(&kit, vec![j], pods);
    assert!(eventually(Duration::from_secs(2), || status_puts(&kit).len() == 2).await);
    assert_eq!(pod_creates(&kit), 0);
    assert!(finalizer_patch(&kit, "p0") && finalizer_patch(&kit, "p1"));
    let puts = status_puts(&kit);
    assert_eq!(
        condition(&puts[0], "FailureTarget").unwrap()["reason"],
        "BackoffLimitExceeded"
    );
    assert_eq!(
        puts[0]["uncountedTerminatedPods"]["failed"]
            .as_array()
            .unwrap()
            .len(),
        2
    );
    assert_eq!(puts[1]["failed"], 2);
    assert_eq!(
        condition(&puts[1], "Failed").unwrap()["reason"],
        "BackoffLimitExceeded"
    );
    assert_eq!(
        events(&kit),
        ["Warning BackoffLimitExceeded: Job has reached the specified backoff limit"]
    );
    let text = kit.metrics.encode();
    assert!(text.contains(r#"job_controller_jobs_finished_total{completion_mode="NonIndexed",result="failed",reason="BackoffLimitExceeded"} 1"#), "{text}");
    running.stop().await;
}

/// JR-34, JR-2: under the limit, a failed pod's replacement waits 10 s from its failure (the
/// backoff record is per-Job memory, moved on only after the status write).
#[tokio::test(start_paused = true)]
async fn jr34_a_failure_delays_the_replacement() {
    let kit = Kit::new();
    let j = job(1, 1);
    let p0 = owned(pod("p0").exit(1, epoch_secs()), &j);
    let started = tokio::time::Instant::now();
    let running = start(&kit, vec![j], vec![p0]);
    assert!(eventually(Duration::from_secs(2), || status_puts(&kit).len() == 2).await);
    assert_eq!(status_puts(&kit)[1]["failed"], 1);
    kit.observe::<Job>("ns", "j");
    assert!(!eventually(Duration::from_secs(8), || pod_creates(&kit) > 0).await);
    assert!(eventually(Duration::from_secs(5), || pod_creates(&kit) == 1).await);
    let waited = started.elapsed();
    assert!(
        waited >= Duration::from_secs(10) && waited < Duration::from_secs(12),
        "{waited:?}"
    );
    let text = kit.metrics.encode();
    assert!(
        text.contains(r#"job_controller_job_pods_creation_total{reason="recreate_terminating_or_failed",status="succeeded"} 1"#),
        "{text}"
    );
    running.stop().await;
}

/// JR-61, JB-4: on taking over (and every 60 s), the sweep finds a pod with our finalizer and no controller and
/// removes the finalizer; a pod of another controller kind is left alone.
#[tokio::test(start_paused = true)]
async fn jr61_orphan_sweep_releases_finalizers_of_uncontrolled_pods_only() {
    let kit = Kit::new();
    let orphan = pod("orphan").exit(0, epoch_secs()).build();
    let mut other = pod("other").running().build();
    other.metadata.owner_references = Some(vec![OwnerReference {
        api_version: "apps/v1".into(),
        kind: "ReplicaSet".into(),
        name: "rs".into(),
        uid: "uid-rs".into(),
        controller: Some(true),
        block_owner_deletion: None,
    }]);
    let running = start(&kit, vec![], vec![orphan, other]);
    assert!(eventually(Duration::from_secs(2), || finalizer_patch(&kit, "orphan")).await);
    // While the cache still shows the finalizer, the 60 s sweep sends the patch again.
    tokio::time::sleep(Duration::from_secs(61)).await;
    assert_eq!(writes(&kit), ["patch pods/orphan", "patch pods/orphan"]);
    // Once the watch shows it gone, later sweeps find nothing.
    kit.observe::<Pod>("ns", "orphan");
    tokio::time::sleep(Duration::from_secs(130)).await;
    assert_eq!(writes(&kit), ["patch pods/orphan", "patch pods/orphan"]);
    running.stop().await;
}

/// JR-5, JR-46: a Job of another controller is counted (on every replica, before leading too)
/// and never synced.
#[tokio::test(start_paused = true)]
async fn jr46_external_jobs_are_counted_and_left_alone() {
    let kit = Kit::new();
    let mut j = job(1, 1);
    j.spec.as_mut().unwrap().managed_by = Some("example.com/custom".into());
    let opts = JobOptions {
        concurrent_job_syncs: 1,
    };
    let controller = init(opts, kit.setup(DECLARATION.name, DECLARATION.event_source)).unwrap();
    kit.seed(Vec::<Pod>::new());
    kit.seed([j]);
    let text = kit.metrics.encode();
    assert!(text.contains(r#"job_controller_jobs_by_external_controller_total{controller_name="example.com/custom"} 1"#), "{text}");
    let running = kit.start(controller);
    tokio::time::sleep(Duration::from_secs(10)).await;
    assert!(kit.api.calls().is_empty(), "{:?}", kit.api.calls());
    running.stop().await;
}

/// JR-63 (upstream `ClaimPods`): an owned pod that stopped matching is released (owner
/// reference and finalizer in one patch); a matching orphan is adopted (controller reference,
/// UID precondition and finalizer in one patch) after a live read of the Job; pods of another
/// controller and orphans being deleted are left alone. A failed release does not stop the
/// adoption, and fails the sync (retried); a release refused as Invalid (the pod was recreated)
/// is no error.
#[tokio::test(start_paused = true)]
async fn jr63_releases_what_stopped_matching_and_adopts_matching_orphans() {
    let kit = Kit::new();
    let j = job(1, 1);
    let mut moved = owned(pod("moved").running(), &j);
    moved.metadata.labels = Some(BTreeMap::from([("job-name".into(), "other".into())]));
    let mut orphan = pod("orphan").running().build();
    orphan.metadata.labels = Some(labels());
    let mut gone = pod("gone").running().deleting(epoch_secs(), 30).build();
    gone.metadata.labels = Some(labels());
    let mut foreign = pod("foreign").running().build();
    foreign.metadata.labels = Some(labels());
    foreign.metadata.owner_references = Some(vec![OwnerReference {
        api_version: "apps/v1".into(),
        kind: "ReplicaSet".into(),
        name: "rs".into(),
        uid: "uid-rs".into(),
        controller: Some(true),
        block_owner_deletion: Some(true),
    }]);
    kit.api.fail("patch", "pods", 1, 500, "InternalError");
    let running = start(&kit, vec![j.clone()], vec![moved, orphan, gone, foreign]);
    let pod_patches = |kit: &Kit| -> Vec<(String, Value)> {
        kit.api
            .calls()
            .into_iter()
            .filter_map(|c| match c {
                Call::Patch(t, _, body) if t.plural == "pods" => Some((t.name.clone(), body)),
                _ => None,
            })
            .collect()
    };
    // First sync: the release fails (500), the adoption is still sent, the sync fails.
    let ok = eventually(Duration::from_millis(500), || pod_patches(&kit).len() >= 2).await;
    assert!(ok, "{:#?}", kit.api.calls());
    let patches = pod_patches(&kit);
    assert_eq!(patches[0].0, "moved");
    assert_eq!(
        patches[0].1,
        json!({"metadata": {
            "ownerReferences": [{"$patch": "delete", "uid": "uid-j"}],
            "$deleteFromPrimitiveList/finalizers": [REMOVE_FINALIZER],
            "uid": "uid-moved",
        }})
    );
    assert_eq!(patches[1].0, "orphan");
    assert_eq!(
        patches[1].1,
        json!({"metadata": {
            "ownerReferences": [serde_json::to_value(shared::meta::refs::controller_ref(&j)).unwrap()],
            "finalizers": [REMOVE_FINALIZER],
            "uid": "uid-orphan",
        }})
    );
    assert!(
        kit.api
            .calls()
            .iter()
            .any(|c| matches!(c, Call::Get(t) if t.plural == "jobs" && t.name == "j")),
        "adoption re-reads the Job live"
    );
    assert!(
        status_puts(&kit).is_empty(),
        "the failed sync wrote no status"
    );
    // The retry: the pod was recreated meanwhile (Invalid): no error; the sync goes on with
    // the one pod it claims, the adopted orphan (the released pod no longer counts).
    kit.api.fail("patch", "pods", 1, 422, "Invalid");
    assert!(eventually(Duration::from_secs(5), || !status_puts(&kit).is_empty()).await);
    assert_eq!(status_puts(&kit)[0]["active"], 1);
    assert_eq!(pod_creates(&kit), 0);
    // Neither the deleting orphan nor the other controller's pod is adopted (the deleting
    // orphan only loses its finalizer, as every orphan does).
    for (name, body) in pod_patches(&kit) {
        if name == "gone" || name == "foreign" {
            assert!(
                body["metadata"]["ownerReferences"].is_null(),
                "{name}: {body}"
            );
        }
    }
    running.stop().await;
}

/// PX-3: `bad` gets one Warning `reason` whose message starts with `message` and nothing
/// else (no writes, no retries, 30 s on), while a Job beside it is synced: its one pod is the
/// only create.
async fn warned_once_and_left_alone(bad: Job, reason: &str, message: &str) {
    let kit = Kit::new();
    let mut good = job(1, 1);
    good.metadata.name = Some("k".into());
    good.metadata.uid = Some("uid-k".into());
    let running = start(&kit, vec![bad, good], vec![]);
    let want = format!("Warning {reason}: {message}");
    assert!(
        eventually(Duration::from_secs(1), || events(&kit)
            .iter()
            .any(|e| e.starts_with(&want)))
        .await,
        "{:?}",
        events(&kit)
    );
    assert!(
        eventually(Duration::from_secs(1), || pod_creates(&kit) == 1).await,
        "the other Job is synced: {:?}",
        writes(&kit)
    );
    tokio::time::sleep(Duration::from_secs(30)).await;
    let warnings = events(&kit).iter().filter(|e| e.contains(reason)).count();
    assert_eq!(warnings, 1, "not retried: {:?}", events(&kit));
    // Creates carry no name: the pods' owners say whose they are.
    let owners: Vec<Value> = kit
        .api
        .calls()
        .into_iter()
        .filter_map(|c| match c {
            Call::Create(t, v) if t.plural == "pods" => {
                Some(v["metadata"]["ownerReferences"][0]["name"].clone())
            }
            _ => None,
        })
        .collect();
    assert_eq!(owners, [json!("k")], "{:?}", writes(&kit));
    assert!(
        writes(&kit).iter().all(|w| !w.contains("jobs/j")),
        "{:?}",
        writes(&kit)
    );
    running.stop().await;
}

/// PX-3, bad input: a selector the API would not produce gets a Warning naming the field, no
/// writes and no retries; another Job is synced as usual.
#[tokio::test(start_paused = true)]
async fn an_invalid_selector_is_a_warning_naming_the_field() {
    let mut bad = job(1, 1);
    bad.spec.as_mut().unwrap().selector = Some(LabelSelector {
        match_expressions: Some(vec![
            k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelectorRequirement {
                key: "job-name".into(),
                operator: "Within".into(),
                values: Some(vec!["j".into()]),
            },
        ]),
        ..Default::default()
    });
    warned_once_and_left_alone(bad, "InvalidSelector", "spec.selector:").await;
}

/// JR-9: a completion mode this controller does not know (a newer API server's) gets upstream's
/// Warning, no writes and no retries; another Job is synced as usual.
#[tokio::test(start_paused = true)]
async fn jr9_an_unknown_completion_mode_is_a_warning_and_nothing_else() {
    let mut unknown = job(1, 1);
    unknown.spec.as_mut().unwrap().completion_mode = Some("Sharded".into());
    warned_once_and_left_alone(
        unknown,
        "UnknownCompletionMode",
        "Skipped Job sync because completion mode is unknown",
    )
    .await;
}
