//! Table tests of the Job plan, one group per rule (JR-n, JB-n).

use super::*;
use crate::pods::testing::{P, pod, ts};
use k8s_openapi::api::batch::v1::{
    PodFailurePolicy, PodFailurePolicyOnExitCodesRequirement, PodFailurePolicyRule, SuccessPolicy,
    SuccessPolicyRule,
};
use k8s_openapi::api::core::v1::{PodSpec, PodTemplateSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

const NOW: i64 = 10_000;

fn job() -> Job {
    Job {
        metadata: ObjectMeta {
            name: Some("j".into()),
            namespace: Some("ns".into()),
            uid: Some("job-uid".into()),
            ..Default::default()
        },
        spec: Some(JobSpec {
            parallelism: Some(2),
            completions: Some(4),
            backoff_limit: Some(6),
            template: PodTemplateSpec {
                metadata: None,
                spec: Some(PodSpec {
                    restart_policy: Some("Never".into()),
                    ..Default::default()
                }),
            },
            ..Default::default()
        }),
        status: Some(JobStatus {
            start_time: Some(Time(ts(NOW - 100))),
            ..Default::default()
        }),
    }
}

fn with_spec(mut j: Job, f: impl FnOnce(&mut JobSpec)) -> Job {
    f(j.spec.as_mut().unwrap());
    j
}

fn with_status(mut j: Job, f: impl FnOnce(&mut JobStatus)) -> Job {
    f(j.status.as_mut().unwrap());
    j
}

fn indexed(completions: i32, parallelism: i32) -> Job {
    with_spec(job(), |s| {
        s.completion_mode = Some("Indexed".into());
        s.completions = Some(completions);
        s.parallelism = Some(parallelism);
    })
}

fn obs<'a>(job: &'a Job, pods: Vec<P>) -> Observed<'a> {
    Observed {
        job,
        pods: pods.into_iter().map(|p| Arc::new(p.build())).collect(),
        expectations_satisfied: true,
        expected_rm_finalizers: HashSet::new(),
        backoff: BackoffRecord::default(),
        now: ts(NOW),
        clear_start_time_on_suspend: true,
    }
}

fn created(action: &PodAction) -> Vec<Option<i32>> {
    match action {
        PodAction::Create(v) => v.iter().map(|n| n.index).collect(),
        other => panic!("expected Create, got {other:?}"),
    }
}

fn removed(action: &PodAction) -> Vec<String> {
    match action {
        PodAction::Remove(v) | PodAction::DeleteActive(v) => {
            v.iter().map(|p| pods::name(p).to_string()).collect()
        }
        other => panic!("expected a removal, got {other:?}"),
    }
}

fn finished_reason(e: &Evaluation) -> Option<(String, String)> {
    e.finished
        .as_ref()
        .map(|c| (c.type_.clone(), c.reason.clone().unwrap_or_default()))
}

/// Runs the whole pure pipeline with every pod action succeeding.
fn run(o: &Observed<'_>) -> (Evaluation, Tracking) {
    let mut e = evaluate(o);
    let outcome = match &e.action {
        PodAction::DeleteActive(v) | PodAction::Remove(v) => Outcome {
            deleted: v.len() as i32,
            deleted_ready: v.iter().filter(|p| pods::ready(p)).count() as i32,
            ..Default::default()
        },
        _ => Outcome::default(),
    };
    let (needs, _) = conclude(o, &mut e, outcome);
    let t = track(o, &e, needs);
    (e, t)
}

#[test]
fn jr15_desired_active() {
    // (completions, parallelism, succeeded pods, active pods) → pods to create.
    let cases: &[(Option<i32>, i32, usize, usize, usize)] = &[
        (Some(4), 2, 0, 0, 2),
        (Some(4), 2, 3, 0, 1),
        (Some(4), 2, 4, 0, 0),
        (Some(4), 2, 0, 1, 1),
        (None, 3, 0, 0, 3),
        (None, 3, 1, 1, 0),
        (Some(0), 2, 0, 0, 0),
    ];
    for &(completions, parallelism, done, running, want) in cases {
        let j = with_spec(job(), |s| {
            s.completions = completions;
            s.parallelism = Some(parallelism);
        });
        let mut ps: Vec<P> = (0..done)
            .map(|i| pod(&format!("s{i}")).exit(0, 9000))
            .collect();
        ps.extend((0..running).map(|i| pod(&format!("r{i}")).running()));
        let e = evaluate(&obs(&j, ps));
        let got = match &e.action {
            PodAction::Create(v) => v.len(),
            _ => 0,
        };
        assert_eq!(
            got, want,
            "completions {completions:?} parallelism {parallelism} done {done} running {running}"
        );
    }
}

#[test]
fn jr16_too_many_pods_removes_early_stage_first() {
    let j = with_spec(job(), |s| s.parallelism = Some(1));
    let e = evaluate(&obs(
        &j,
        vec![
            pod("ready").running().ready(),
            pod("pending").node("n"),
            pod("running").running(),
        ],
    ));
    assert_eq!(removed(&e.action), vec!["pending", "running"]);
}

#[test]
fn jr16_indexed_duplicates_and_out_of_range() {
    let j = indexed(3, 3);
    let e = evaluate(&obs(
        &j,
        vec![
            pod("a0").running().ready().index(0),
            pod("b0").running().index(0),
            pod("c5").running().index(5),
            pod("d1").running().index(1),
        ],
    ));
    let mut r = removed(&e.action);
    r.sort();
    assert_eq!(r, vec!["b0", "c5"]);
}

#[test]
fn jr17_indexed_takes_lowest_free_indexes() {
    let j = with_status(indexed(6, 3), |s| s.completed_indexes = Some("0".into()));
    let e = evaluate(&obs(&j, vec![pod("a").running().index(2)]));
    assert_eq!(created(&e.action), vec![Some(1), Some(3)]);
    // With podReplacementPolicy Failed, a terminating pod holds its index and its slot.
    let j = with_spec(indexed(3, 3), |s| {
        s.pod_replacement_policy = Some("Failed".into())
    });
    let e = evaluate(&obs(
        &j,
        vec![pod("t").running().index(0).deleting(NOW, 30)],
    ));
    assert_eq!(created(&e.action), vec![Some(1), Some(2)]);
}

#[test]
fn jr19_b1_active_stays_truthful_during_backoff() {
    let j = with_spec(job(), |s| s.parallelism = Some(2));
    let mut o = obs(
        &j,
        vec![pod("r").running().ready(), pod("f").exit(1, NOW - 2)],
    );
    o.backoff = BackoffRecord::default();
    let (e, t) = run(&o);
    assert_eq!(e.action, PodAction::WaitBackoff(Duration::from_secs(8)));
    assert_eq!((t.status.active, t.status.ready), (Some(1), Some(1)));
}

#[test]
fn jr23_completion() {
    let j = job();
    let ps = (0..4)
        .map(|i| pod(&format!("s{i}")).exit(0, 9000))
        .collect();
    let (e, t) = run(&obs(&j, ps));
    assert_eq!(
        finished_reason(&e),
        Some((SUCCESS_CRITERIA_MET.into(), "CompletionsReached".into()))
    );
    assert_eq!(
        t.final_condition.as_ref().map(|c| c.type_.as_str()),
        Some(COMPLETE)
    );
    // Without completions: any success once nothing is active.
    let j = with_spec(job(), |s| s.completions = None);
    let (e, _) = run(&obs(&j, vec![pod("s").exit(0, 9000), pod("r").running()]));
    assert!(e.finished.is_none());
    let (e, _) = run(&obs(&j, vec![pod("s").exit(0, 9000)]));
    assert!(e.finished.is_some());
}

#[test]
fn jr26_succeeded_pods_go_through_uncounted() {
    let j = job();
    let (_, t) = run(&obs(&j, vec![pod("s").exit(0, 9000), pod("r").running()]));
    let unc = t.status.uncounted_terminated_pods.clone().unwrap();
    assert_eq!(unc.succeeded, Some(vec!["uid-s".to_string()]));
    assert_eq!(
        t.status.succeeded, None,
        "not counted before its finalizer goes"
    );
    assert_eq!(t.remove_finalizers.len(), 1);
    assert!(t.needs_flush);
    // Step 7: once the finalizer is gone the UID folds into the counter.
    let mut st = t.status.clone();
    let mut left = t.uids_with_finalizer.clone();
    left.remove("uid-s");
    assert!(clean_uncounted(&mut st, &left));
    assert_eq!(st.succeeded, Some(1));
    assert_eq!(
        st.uncounted_terminated_pods,
        Some(UncountedTerminatedPods::default())
    );
}

#[test]
fn jr26_uncounted_without_finalizer_counts_once() {
    // A previous sync recorded the pod and removed its finalizer: count it, never twice.
    let j = with_status(job(), |s| {
        s.uncounted_terminated_pods = Some(UncountedTerminatedPods {
            succeeded: Some(vec!["uid-s".into()]),
            failed: None,
        });
        s.succeeded = Some(1);
    });
    let (e, t) = run(&obs(
        &j,
        vec![pod("s").exit(0, 9000).no_finalizer(), pod("r").running()],
    ));
    assert_eq!(e.succeeded, 2);
    assert_eq!(t.status.succeeded, Some(2));
    assert!(t.remove_finalizers.is_empty());
}

#[test]
fn jr29_pods_without_finalizer_are_ignored() {
    let j = job();
    let (e, t) = run(&obs(
        &j,
        vec![
            pod("s").exit(0, 9000).no_finalizer(),
            pod("f").exit(1, 9000).no_finalizer(),
        ],
    ));
    assert_eq!((e.succeeded, e.failed), (0, 0));
    assert!(t.remove_finalizers.is_empty());
}

#[test]
fn jr22_awaiting_removal_is_processed() {
    let j = job();
    let mut o = obs(&j, vec![pod("s").exit(0, 9000)]);
    o.expected_rm_finalizers.insert("uid-s".into());
    let (e, t) = run(&o);
    assert_eq!(e.succeeded, 0);
    assert!(t.remove_finalizers.is_empty());
}

#[test]
fn jr26_cap_at_500() {
    let j = with_spec(job(), |s| {
        s.completions = Some(1000);
        s.parallelism = Some(1000);
    });
    let ps = (0..600)
        .map(|i| pod(&format!("s{i}")).exit(0, 9000))
        .collect();
    let (_, t) = run(&obs(&j, ps));
    assert!(t.reached_max_uncounted);
    assert_eq!(
        t.status
            .uncounted_terminated_pods
            .unwrap()
            .succeeded
            .unwrap()
            .len(),
        500
    );
    assert_eq!(t.remove_finalizers.len(), 500);
}

#[test]
fn jr27_deleted_pods_count_as_failed_unless_failed_replacement() {
    let p = pod("d").running().deleting(NOW, 30).build();
    assert!(pod_failed(&p, &job()));
    let j = with_spec(job(), |s| s.pod_replacement_policy = Some("Failed".into()));
    assert!(!pod_failed(&p, &j));
    assert!(pod_failed(&pod("f").exit(1, 10).build(), &j));
    // A deleted pod that succeeded is not failed.
    assert!(!pod_failed(
        &pod("s").exit(0, 10).deleting(NOW, 30).build(),
        &job()
    ));
}

#[test]
fn jr32_backoff_limit() {
    let j = with_spec(job(), |s| s.backoff_limit = Some(2));
    let ps = (0..3)
        .map(|i| pod(&format!("f{i}")).exit(1, 9000 + i))
        .collect();
    let (e, t) = run(&obs(&j, ps));
    assert_eq!(
        finished_reason(&e),
        Some((FAILURE_TARGET.into(), "BackoffLimitExceeded".into()))
    );
    // JR-49: the interim condition is in the first write; Failed is the final one.
    let conds = t.status.conditions.clone().unwrap();
    assert_eq!(
        conds.iter().map(|c| c.type_.as_str()).collect::<Vec<_>>(),
        vec![FAILURE_TARGET]
    );
    assert_eq!(t.final_condition.unwrap().type_, FAILED);
    let ps = (0..2)
        .map(|i| pod(&format!("f{i}")).exit(1, 9000 + i))
        .collect();
    assert!(evaluate(&obs(&j, ps)).finished.is_none());
}

#[test]
fn jr33_on_failure_restarts() {
    let on_failure = |limit| {
        with_spec(job(), |s| {
            s.backoff_limit = Some(limit);
            s.template.spec.as_mut().unwrap().restart_policy = Some("OnFailure".into());
        })
    };
    let j = on_failure(1);
    let e = evaluate(&obs(&j, vec![pod("r").running().restarts(1)]));
    assert_eq!(
        finished_reason(&e),
        Some((FAILURE_TARGET.into(), "BackoffLimitExceeded".into()))
    );
    let j = on_failure(2);
    assert!(
        evaluate(&obs(&j, vec![pod("r").running().restarts(1)]))
            .finished
            .is_none()
    );
    let j = on_failure(0);
    assert!(
        evaluate(&obs(&j, vec![pod("r").running().restarts(1)]))
            .finished
            .is_some()
    );
}

#[test]
fn jr34_backoff_delays_creation() {
    let j = job();
    let mut o = obs(&j, vec![pod("f").exit(1, NOW - 3)]);
    o.backoff = BackoffRecord {
        failures_after_last_success: 1,
        last_failure: Some(ts(NOW - 30)),
    };
    // Two failures now: 20 s after the latest (3 s ago).
    assert_eq!(
        evaluate(&o).action,
        PodAction::WaitBackoff(Duration::from_secs(17))
    );
    o.now = ts(NOW + 20);
    assert!(matches!(evaluate(&o).action, PodAction::Create(_)));
}

fn exit_code_policy(action: &str, codes: &[i32]) -> PodFailurePolicy {
    PodFailurePolicy {
        rules: vec![PodFailurePolicyRule {
            action: action.into(),
            on_exit_codes: Some(PodFailurePolicyOnExitCodesRequirement {
                container_name: None,
                operator: "In".into(),
                values: codes.to_vec(),
            }),
            on_pod_conditions: None,
        }],
    }
}

#[test]
fn jr36_fail_job_deletes_the_rest_and_counts_them() {
    let j = with_spec(job(), |s| {
        s.parallelism = Some(3);
        s.pod_failure_policy = Some(exit_code_policy("FailJob", &[42]));
        s.pod_replacement_policy = Some("Failed".into());
    });
    let (e, t) = run(&obs(
        &j,
        vec![
            pod("x").exit(42, 9000),
            pod("a").running(),
            pod("b").running().ready(),
        ],
    ));
    assert_eq!(
        finished_reason(&e),
        Some((FAILURE_TARGET.into(), "PodFailurePolicy".into()))
    );
    assert_eq!(
        e.finished.as_ref().unwrap().message.as_deref(),
        Some("Container c for pod ns/x failed with exit code 42 matching FailJob rule at index 0")
    );
    let mut r = removed(&e.action);
    r.sort();
    assert_eq!(r, vec!["a", "b"]);
    // The deleted pods are terminating now: the Job is not finished in this sync.
    assert_eq!(
        (t.status.active, t.status.ready, t.status.terminating),
        (Some(0), Some(0), Some(2))
    );
    let mut st = t.status.clone();
    assert!(!enact_finished(
        &mut st,
        t.final_condition.as_ref(),
        ts(NOW)
    ));
    // Every pod of a failing Job counts as failed (JR-26 step 3).
    assert_eq!(
        t.status
            .uncounted_terminated_pods
            .unwrap()
            .failed
            .unwrap()
            .len(),
        3
    );
    assert_eq!(t.policy_actions.get("FailJob"), Some(&1));
}

#[test]
fn jr36_ignore_is_not_counted() {
    let j = with_spec(job(), |s| {
        s.backoff_limit = Some(0);
        s.pod_failure_policy = Some(exit_code_policy("Ignore", &[137]));
    });
    let (e, t) = run(&obs(&j, vec![pod("x").exit(137, 9000)]));
    assert!(e.finished.is_none());
    assert_eq!(e.failed, 0);
    assert_eq!(t.status.uncounted_terminated_pods.unwrap().failed, None);
    assert_eq!(t.remove_finalizers.len(), 1, "its finalizer still goes");
    assert_eq!(t.policy_actions.get("Ignore"), Some(&1));
}

#[test]
fn jr37_backoff_limit_per_index() {
    let per_index = |limit, max_failed: Option<i32>| {
        with_spec(indexed(4, 2), |s| {
            s.backoff_limit_per_index = Some(limit);
            s.max_failed_indexes = max_failed;
            s.backoff_limit = Some(i32::MAX);
        })
    };
    // First failure of index 1 (count 0 < 1): not failed; its pod waits for a replacement.
    let j = per_index(1, None);
    let o = obs(
        &j,
        vec![
            pod("f1")
                .exit(1, NOW - 1)
                .index(1)
                .annotate(pods::INDEX_FAILURE_COUNT, "0"),
            pod("r0").running().index(0),
        ],
    );
    let (e, t) = run(&o);
    assert_eq!(e.failed_indexes.as_ref().unwrap().to_string(), "");
    assert_eq!(t.status.failed_indexes.as_deref(), Some(""));
    assert!(e.delayed_deletion.contains_key(&1));
    assert!(
        t.remove_finalizers.is_empty(),
        "JR-28: kept until the replacement exists"
    );
    // Replacement waits 10 s after the failure, then carries failure count 1.
    assert_eq!(e.action, PodAction::WaitBackoff(Duration::from_secs(9)));
    let mut later = obs(
        &j,
        vec![
            pod("f1")
                .exit(1, NOW - 1)
                .index(1)
                .annotate(pods::INDEX_FAILURE_COUNT, "0"),
            pod("r0").running().index(0),
        ],
    );
    later.now = ts(NOW + 10);
    match evaluate(&later).action {
        PodAction::Create(v) => assert_eq!(
            v,
            vec![NewPod {
                index: Some(1),
                failure_counts: Some((1, 0))
            }]
        ),
        other => panic!("{other:?}"),
    }
    // Second failure (count 1 ≥ 1): index 1 fails.
    let o = obs(
        &j,
        vec![
            pod("g1")
                .exit(1, NOW - 1)
                .index(1)
                .annotate(pods::INDEX_FAILURE_COUNT, "1"),
        ],
    );
    let e = evaluate(&o);
    assert_eq!(e.failed_indexes.as_ref().unwrap().to_string(), "1");
    // maxFailedIndexes 0: the first failed index fails the Job.
    let j = per_index(1, Some(0));
    let e = evaluate(&obs(
        &j,
        vec![
            pod("g1")
                .exit(1, NOW - 1)
                .index(1)
                .annotate(pods::INDEX_FAILURE_COUNT, "1"),
        ],
    ));
    assert_eq!(
        finished_reason(&e),
        Some((FAILURE_TARGET.into(), "MaxFailedIndexesExceeded".into()))
    );
    // All indexes finished with one failed: FailedIndexes.
    let j = with_status(per_index(1, None), |s| {
        s.completed_indexes = Some("0,2,3".into())
    });
    let e = evaluate(&obs(
        &j,
        vec![
            pod("g1")
                .exit(1, NOW - 1)
                .index(1)
                .annotate(pods::INDEX_FAILURE_COUNT, "1"),
        ],
    ));
    assert_eq!(
        finished_reason(&e),
        Some((FAILURE_TARGET.into(), "FailedIndexes".into()))
    );
    // FailIndex fails the index at the first failure.
    let j = with_spec(per_index(3, None), |s| {
        s.pod_failure_policy = Some(exit_code_policy("FailIndex", &[3]))
    });
    let e = evaluate(&obs(
        &j,
        vec![
            pod("h2")
                .exit(3, NOW - 1)
                .index(2)
                .annotate(pods::INDEX_FAILURE_COUNT, "0"),
        ],
    ));
    assert_eq!(e.failed_indexes.as_ref().unwrap().to_string(), "2");
}

#[test]
fn jr41_success_policy_and_jr47_order() {
    let j = with_spec(indexed(5, 5), |s| {
        s.success_policy = Some(SuccessPolicy {
            rules: vec![SuccessPolicyRule {
                succeeded_indexes: Some("0".into()),
                succeeded_count: None,
            }],
        })
    });
    let (e, t) = run(&obs(
        &j,
        vec![
            pod("s0").exit(0, 9000).index(0),
            pod("r1").running().index(1),
        ],
    ));
    assert_eq!(
        finished_reason(&e),
        Some((SUCCESS_CRITERIA_MET.into(), "SuccessPolicy".into()))
    );
    assert_eq!(removed(&e.action), vec!["r1"]);
    assert_eq!(t.status.completed_indexes.as_deref(), Some("0"));
    // Deleted pods of a succeeding Job are not failures.
    assert_eq!(
        t.status.uncounted_terminated_pods.clone().unwrap().failed,
        None
    );
    // (1) an existing SuccessCriteriaMet wins over a later failure.
    let j2 = with_status(with_spec(job(), |s| s.backoff_limit = Some(0)), |s| {
        s.conditions = Some(vec![new_condition(
            SUCCESS_CRITERIA_MET,
            "True",
            "CompletionsReached",
            "m",
            ts(1),
        )]);
    });
    let e = evaluate(&obs(&j2, vec![pod("f").exit(1, 9000)]));
    assert_eq!(
        finished_reason(&e),
        Some((SUCCESS_CRITERIA_MET.into(), "CompletionsReached".into()))
    );
    // (2) an existing FailureTarget turns into Failed with its reason.
    let j3 = with_status(job(), |s| {
        s.conditions = Some(vec![new_condition(
            FAILURE_TARGET,
            "True",
            "DeadlineExceeded",
            "msg",
            ts(1),
        )]);
    });
    let e = evaluate(&obs(&j3, vec![]));
    assert_eq!(
        finished_reason(&e),
        Some((FAILED.into(), "DeadlineExceeded".into()))
    );
}

#[test]
fn jr42_deadline() {
    let j = with_spec(job(), |s| s.active_deadline_seconds = Some(100));
    let e = evaluate(&obs(&j, vec![pod("r").running()]));
    assert_eq!(
        finished_reason(&e),
        Some((FAILURE_TARGET.into(), "DeadlineExceeded".into()))
    );
    let j = with_spec(job(), |s| s.active_deadline_seconds = Some(130));
    let e = evaluate(&obs(&j, vec![pod("r").running()]));
    assert!(e.finished.is_none());
    assert_eq!(e.deadline_requeue, Some(Duration::from_secs(30)));
    // Never while suspended.
    let j = with_spec(job(), |s| {
        s.active_deadline_seconds = Some(1);
        s.suspend = Some(true);
    });
    assert!(evaluate(&obs(&j, vec![])).finished.is_none());
}

#[test]
fn jr43_jr44_jr45_suspend_and_resume() {
    // Created suspended: no pods, no startTime, Suspended=True.
    let j = with_status(with_spec(job(), |s| s.suspend = Some(true)), |s| {
        s.start_time = None
    });
    let o = obs(&j, vec![]);
    let mut e = evaluate(&o);
    assert_eq!(e.action, PodAction::Remove(vec![]));
    let (needs, event) = conclude(&o, &mut e, Outcome::default());
    assert!(needs);
    assert_eq!(event, Some(("Suspended", "Job suspended")));
    assert_eq!(e.status.start_time, None);
    // Suspending a running Job removes its pods (finalizer first) and clears startTime.
    let j = with_spec(job(), |s| s.suspend = Some(true));
    let (e, t) = run(&obs(&j, vec![pod("a").running(), pod("b").running()]));
    assert_eq!(removed(&e.action).len(), 2);
    assert_eq!(t.status.start_time, None);
    assert_eq!(t.status.failed, None, "suspension deletes are not failures");
    // With MutableSchedulingDirectivesForSuspendedJobs off, suspending keeps startTime.
    let mut o = obs(&j, vec![pod("a").running()]);
    o.clear_start_time_on_suspend = false;
    let mut e = evaluate(&o);
    let (_, event) = conclude(&o, &mut e, Outcome::default());
    assert_eq!(event, Some(("Suspended", "Job suspended")));
    assert!(e.status.start_time.is_some(), "gate off: startTime kept");
    // Resume: Suspended=False, a new startTime.
    let j = with_status(job(), |s| {
        s.start_time = None;
        s.conditions = Some(vec![new_condition(
            SUSPENDED,
            "True",
            "JobSuspended",
            "Job suspended",
            ts(1),
        )]);
    });
    let o = obs(&j, vec![]);
    let mut e = evaluate(&o);
    let (_, event) = conclude(&o, &mut e, Outcome::default());
    assert_eq!(event, Some(("Resumed", "Job resumed")));
    assert_eq!(e.status.start_time, Some(Time(ts(NOW))));
    // A never-suspended Job gets no False condition.
    let j = job();
    let o = obs(&j, vec![pod("a").running(), pod("b").running()]);
    let mut e = evaluate(&o);
    let (_, event) = conclude(&o, &mut e, Outcome::default());
    assert_eq!((event, e.status.conditions), (None, None));
}

#[test]
fn jr48_failed_delete_or_unsatisfied_expectations_postpone_the_finish() {
    let j = with_spec(job(), |s| s.backoff_limit = Some(0));
    let o = obs(&j, vec![pod("f").exit(1, 9000), pod("r").running()]);
    let mut e = evaluate(&o);
    let (_, _) = conclude(
        &o,
        &mut e,
        Outcome {
            deleted: 0,
            delete_failed: true,
            ..Default::default()
        },
    );
    assert!(e.finished.is_none());
    let mut o = obs(&j, vec![pod("f").exit(1, 9000)]);
    o.expectations_satisfied = false;
    let mut e = evaluate(&o);
    conclude(&o, &mut e, Outcome::default());
    assert!(e.finished.is_none());
}

#[test]
fn jr20_unsatisfied_expectations_skip_pod_management() {
    let j = job();
    let mut o = obs(&j, vec![]);
    o.expectations_satisfied = false;
    assert_eq!(evaluate(&o).action, PodAction::Skip);
}

#[test]
fn jr26_step8_and_jr52_finish() {
    let j = job();
    let ps = (0..4)
        .map(|i| pod(&format!("s{i}")).exit(0, 9000).no_finalizer())
        .collect();
    let j = with_status(j, |s| s.succeeded = Some(4));
    let (_, t) = run(&obs(&j, ps));
    let mut st = t.status.clone();
    assert!(enact_finished(
        &mut st,
        t.final_condition.as_ref(),
        ts(NOW + 1)
    ));
    let complete = st
        .conditions
        .as_ref()
        .unwrap()
        .iter()
        .find(|c| c.type_ == COMPLETE)
        .unwrap();
    assert_eq!(st.completion_time, complete.last_transition_time);
    assert_eq!(
        st.conditions
            .as_ref()
            .unwrap()
            .iter()
            .map(|c| c.type_.as_str())
            .collect::<Vec<_>>(),
        vec![SUCCESS_CRITERIA_MET, COMPLETE]
    );
    assert!(
        crate::validation::violations(&j, &st).is_empty(),
        "{:?}",
        crate::validation::violations(&j, &st)
    );
    // Not while anything is uncounted.
    let mut st = t.status.clone();
    st.uncounted_terminated_pods = Some(UncountedTerminatedPods {
        succeeded: Some(vec!["x".into()]),
        failed: None,
    });
    assert!(!enact_finished(
        &mut st,
        t.final_condition.as_ref(),
        ts(NOW)
    ));
}

#[test]
fn jr14_failure_counts_for_replacement() {
    let j = with_spec(indexed(2, 2), |s| {
        s.pod_failure_policy = Some(exit_code_policy("Ignore", &[137]))
    });
    let counted = pod("a")
        .exit(1, 1)
        .index(0)
        .annotate(pods::INDEX_FAILURE_COUNT, "2")
        .build();
    assert_eq!(new_index_failure_counts(&j, Some(&counted)), (3, 0));
    let ignored = pod("b")
        .exit(137, 1)
        .index(0)
        .annotate(pods::INDEX_FAILURE_COUNT, "2")
        .build();
    assert_eq!(new_index_failure_counts(&j, Some(&ignored)), (2, 1));
    assert_eq!(new_index_failure_counts(&j, None), (0, 0));
}
