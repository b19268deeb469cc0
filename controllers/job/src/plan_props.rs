//! PX-1: the Job plan at the API-valid extremes of every field it reads, as properties.
//! Generators produce only objects the API server accepts (batch/v1 validation: completions,
//! parallelism, backoffLimit, backoffLimitPerIndex ≥ 0; activeDeadlineSeconds > 0; Indexed
//! completions and parallelism ≤ 10⁵ when backoffLimitPerIndex is set; status counters ≥ 0;
//! timestamps in RFC 3339's years 0001..9999), but at their limits. Index lists
//! (`completedIndexes`, `failedIndexes`, a success rule's `succeededIndexes`) also take odd
//! strings the controller must not trust, valid or not.

use super::*;
use crate::pods::testing::{pod, ts};
use k8s_openapi::api::core::v1::{PodSpec, PodTemplateSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use proptest::prelude::*;

/// 0001-01-01T00:00:00Z and the last second of year 9999 jiff holds (9999-12-30T22:00:00Z): the
/// range of a `metav1.Time`.
const YEAR_1: i64 = -62_135_596_800;
const YEAR_9999: i64 = 253_402_207_200;

fn instant() -> impl Strategy<Value = i64> {
    prop_oneof![
        Just(YEAR_1),
        Just(YEAR_9999),
        Just(0i64),
        -100i64..100,
        YEAR_1..=YEAR_9999,
    ]
}

fn count32() -> impl Strategy<Value = i32> {
    prop_oneof![
        Just(0),
        Just(1),
        Just(i32::MAX),
        Just(i32::MAX - 1),
        0..20i32,
        0..=i32::MAX
    ]
}

fn opt<T: std::fmt::Debug + Clone>(
    s: impl Strategy<Value = T>,
) -> impl Strategy<Value = Option<T>> {
    prop_oneof![Just(None), s.prop_map(Some)]
}

/// A completion-index annotation: valid, out of range, negative, huge or not a number.
fn index_annotation() -> impl Strategy<Value = Option<String>> {
    prop_oneof![
        Just(None),
        (0..8i32).prop_map(|i| Some(i.to_string())),
        Just(Some("-1".to_string())),
        Just(Some(i32::MAX.to_string())),
        Just(Some("99999999999999999999".to_string())),
        Just(Some(String::new())),
        Just(Some("x".to_string())),
    ]
}

#[derive(Clone, Debug)]
struct PodIn {
    phase: &'static str,
    finalizer: bool,
    ready: bool,
    index: Option<String>,
    exit: Option<(i32, i64)>,
    deleting: Option<(i64, i64)>,
    created: i64,
    restarts: i32,
    /// Conditions a podFailurePolicy rule can match (the Ready condition is `ready`).
    conditions: Vec<(&'static str, &'static str)>,
}

fn pod_in() -> impl Strategy<Value = PodIn> {
    (
        prop::sample::select(vec![
            "Pending",
            "Running",
            "Succeeded",
            "Failed",
            "Unknown",
            "",
        ]),
        any::<bool>(),
        any::<bool>(),
        index_annotation(),
        opt((
            prop_oneof![
                Just(0),
                Just(1),
                Just(i32::MIN),
                Just(i32::MAX),
                any::<i32>()
            ],
            instant(),
        )),
        opt((
            instant(),
            prop_oneof![Just(0i64), Just(30), Just(i64::MAX), 0..=i64::MAX],
        )),
        instant(),
        count32(),
        // At most one condition of each type, as the API server keeps them.
        prop::collection::btree_map(
            prop::sample::select(vec!["DisruptionTarget", "ConfigIssue"]),
            prop::sample::select(vec!["True", "False", "Unknown"]),
            0..3,
        )
        .prop_map(|m| m.into_iter().collect::<Vec<_>>()),
    )
        .prop_map(
            |(phase, finalizer, ready, index, exit, deleting, created, restarts, conditions)| {
                PodIn {
                    phase,
                    finalizer,
                    ready,
                    index,
                    exit,
                    deleting,
                    created,
                    restarts,
                    conditions,
                }
            },
        )
}

fn build_pod(i: usize, p: &PodIn) -> Pod {
    let mut b = pod(&format!("p{i}")).created(p.created).phase(p.phase);
    if p.phase == "Running" {
        b = b.node("n");
    }
    if p.restarts > 0 {
        b = b.restarts(p.restarts);
    }
    if let Some((code, at)) = p.exit {
        b = b.exit(code, at);
    }
    if p.ready {
        b = b.ready();
    }
    for (type_, status) in &p.conditions {
        b = b.condition(type_, status);
    }
    if let Some(ix) = &p.index {
        b = b.annotate(pods::COMPLETION_INDEX, ix);
        b = b.annotate(pods::INDEX_FAILURE_COUNT, ix);
        b = b.annotate(pods::INDEX_IGNORED_FAILURE_COUNT, ix);
    }
    if let Some((at, grace)) = p.deleting {
        b = b.deleting(at, grace);
    }
    if !p.finalizer {
        b = b.no_finalizer();
    }
    b.build()
}

#[derive(Clone, Debug)]
struct JobIn {
    indexed: bool,
    completions: Option<i32>,
    parallelism: Option<i32>,
    backoff_limit: Option<i32>,
    per_index: Option<(i32, Option<i32>)>,
    deadline: Option<i64>,
    suspend: bool,
    restart_on_failure: bool,
    start: Option<i64>,
    succeeded: Option<i32>,
    failed: Option<i32>,
    active: Option<i32>,
    uncounted: Vec<usize>,
}

fn job_in() -> impl Strategy<Value = JobIn> {
    (
        any::<bool>(),
        opt(count32()),
        opt(count32()),
        opt(count32()),
        opt((
            count32(),
            opt(prop_oneof![Just(0i32), Just(100_000), 0..=100_000]),
        )),
        opt(prop_oneof![Just(1i64), Just(i64::MAX), 1..=i64::MAX]),
        any::<bool>(),
        any::<bool>(),
        opt(instant()),
        (opt(count32()), opt(count32()), opt(count32())),
        prop::collection::vec(0..10usize, 0..3),
    )
        .prop_map(
            |(
                indexed,
                completions,
                parallelism,
                backoff_limit,
                per_index,
                deadline,
                suspend,
                restart_on_failure,
                start,
                (succeeded, failed, active),
                uncounted,
            )| {
                let mut j = JobIn {
                    indexed,
                    completions,
                    parallelism,
                    backoff_limit,
                    per_index,
                    deadline,
                    suspend,
                    restart_on_failure,
                    start,
                    succeeded,
                    failed,
                    active,
                    uncounted,
                };
                // Validation: Indexed needs completions; per-index limits need Indexed, a
                // Never restart policy and ≤ 10⁵ completions and parallelism.
                if j.indexed {
                    j.completions = Some(j.completions.unwrap_or(1));
                }
                if j.per_index.is_some() {
                    j.indexed = true;
                    j.restart_on_failure = false;
                    let c = j.completions.unwrap_or(1).min(100_000);
                    j.completions = Some(c);
                    j.parallelism = j.parallelism.map(|p| p.min(100_000));
                    if let Some((_, Some(m))) = &mut j.per_index {
                        *m = (*m).min(c);
                    }
                }
                j
            },
        )
}

/// The UID of pod `i`, or of a pod that no longer exists (uncounted pods may refer to them).
fn uid_or_gone(pods: &[Arc<Pod>], i: usize) -> String {
    pods.get(i)
        .map_or_else(|| format!("uid-gone-{i}"), |p| pods::uid(p).to_string())
}

fn build_job(j: &JobIn, pods: &[Arc<Pod>]) -> Job {
    let uncounted = (!j.uncounted.is_empty()).then(|| UncountedTerminatedPods {
        succeeded: Some(
            j.uncounted
                .iter()
                .filter(|i| *i % 2 == 0)
                .map(|i| uid_or_gone(pods, *i))
                .collect(),
        ),
        failed: Some(
            j.uncounted
                .iter()
                .filter(|i| *i % 2 == 1)
                .map(|i| uid_or_gone(pods, *i))
                .collect(),
        ),
    });
    Job {
        metadata: ObjectMeta {
            name: Some("j".into()),
            namespace: Some("ns".into()),
            uid: Some("job-uid".into()),
            ..Default::default()
        },
        spec: Some(JobSpec {
            completion_mode: Some(if j.indexed { "Indexed" } else { "NonIndexed" }.into()),
            completions: j.completions,
            parallelism: j.parallelism,
            backoff_limit: j.backoff_limit,
            backoff_limit_per_index: j.per_index.map(|p| p.0),
            max_failed_indexes: j.per_index.and_then(|p| p.1),
            active_deadline_seconds: j.deadline,
            suspend: Some(j.suspend),
            template: PodTemplateSpec {
                metadata: None,
                spec: Some(PodSpec {
                    restart_policy: Some(
                        if j.restart_on_failure {
                            "OnFailure"
                        } else {
                            "Never"
                        }
                        .into(),
                    ),
                    ..Default::default()
                }),
            },
            ..Default::default()
        }),
        status: Some(JobStatus {
            start_time: j.start.map(|s| Time(ts(s))),
            succeeded: j.succeeded,
            failed: j.failed,
            active: j.active,
            uncounted_terminated_pods: uncounted,
            ..Default::default()
        }),
    }
}

fn run_all(j: &JobIn, ps: &[PodIn], now: i64, backoff: (i32, Option<i64>)) {
    let pods: Vec<Arc<Pod>> = ps
        .iter()
        .enumerate()
        .map(|(i, p)| Arc::new(build_pod(i, p)))
        .collect();
    let job = build_job(j, &pods);
    check_job(&job, pods, now, backoff);
}

/// evaluate, conclude and track on `job` and `pods`, asserting what holds for any input.
fn check_job(job: &Job, pods: Vec<Arc<Pod>>, now: i64, backoff: (i32, Option<i64>)) {
    let spec = job.spec.as_ref().expect("a spec");
    let indexed = spec.completion_mode.as_deref() == Some("Indexed");
    let obs = Observed {
        job,
        pods: pods.clone(),
        expectations_satisfied: true,
        expected_rm_finalizers: HashSet::new(),
        backoff: BackoffRecord {
            failures_after_last_success: backoff.0,
            last_failure: backoff.1.map(ts),
        },
        now: ts(now),
        clear_start_time_on_suspend: true,
    };
    let mut e = evaluate(&obs);
    for n in [e.ready, e.terminating, e.succeeded, e.failed] {
        assert!(n >= 0, "negative count {n}");
    }
    assert!(e.active_pods.len() <= pods.len());
    let created = match &e.action {
        PodAction::Create(v) => {
            assert!(!v.is_empty() && v.len() <= MAX_POD_CREATE_DELETE_PER_SYNC);
            if indexed {
                let c = spec.completions.unwrap_or(0);
                assert!(
                    v.iter()
                        .all(|n| n.index.is_some_and(|i| (0..c).contains(&i)))
                );
            }
            v.len()
        }
        PodAction::Remove(v) | PodAction::DeleteActive(v) => {
            assert!(v.len() <= e.active_pods.len());
            0
        }
        _ => 0,
    };
    let outcome = match &e.action {
        PodAction::DeleteActive(v) | PodAction::Remove(v) => Outcome {
            deleted: v.len() as i32,
            deleted_ready: v.iter().filter(|p| pods::ready(p)).count() as i32,
            ..Default::default()
        },
        _ => Outcome::default(),
    };
    let (needs, _) = conclude(&obs, &mut e, outcome);
    let st = &e.status;
    for n in [st.active, st.ready, st.terminating, st.succeeded, st.failed] {
        assert!(n.unwrap_or(0) >= 0, "negative status count {n:?}");
    }
    assert!(st.active.unwrap_or(0) as usize <= pods.len() + created);
    assert!(st.ready.unwrap_or(0) <= st.active.unwrap_or(0).max(0) + e.terminating);
    let t = track(&obs, &e, needs);
    assert!(t.remove_finalizers.len() <= pods.len());
    let mut status = t.status;
    let with: HashSet<String> = pods
        .iter()
        .filter(|p| pods::has_tracking_finalizer(p))
        .map(|p| pods::uid(p).to_string())
        .collect();
    clean_uncounted(&mut status, &with);
    for n in [status.succeeded, status.failed] {
        assert!(n.unwrap_or(0) >= 0, "negative count after release {n:?}");
    }
    let _ = crate::handlers::deadline_left(job, ts(now));
}

/// The policies and index lists a Job may carry, at the API's extremes: podFailurePolicy (up
/// to 20 rules, every action, exit codes 1..255 with `In` never holding 0, pod conditions),
/// successPolicy (indexes and counts up to the completions), podReplacementPolicy, and
/// `completedIndexes`/`failedIndexes` strings, odd ones included (a status writer may have left
/// any text there; the controller must not trust it).
/// A podFailurePolicy rule: its action, and either (operator, exit codes) or a condition type.
type FailureRule = (&'static str, Result<(&'static str, Vec<i32>), &'static str>);

#[derive(Clone, Debug)]
struct Policies {
    failure: Option<Vec<FailureRule>>,
    success: Option<Vec<(Option<&'static str>, Option<i32>)>>,
    replacement: Option<&'static str>,
    completed: Option<&'static str>,
    failed: Option<&'static str>,
}

fn index_list() -> impl Strategy<Value = &'static str> {
    prop::sample::select(vec![
        "",
        "0",
        "0-2",
        "1,3-5",
        "0-2147483646",
        "2147483646",
        "5-3",
        "1,1",
        "-1",
        "x",
        "0-",
        "99999999999",
    ])
}

fn policies() -> impl Strategy<Value = Policies> {
    let exit_codes = prop_oneof![Just(1i32), Just(255), Just(137), 1..=255i32];
    let rule = (
        prop::sample::select(vec!["FailJob", "Ignore", "Count", "FailIndex"]),
        prop_oneof![
            (
                prop::sample::select(vec!["In", "NotIn"]),
                prop::collection::btree_set(exit_codes, 1..5)
            )
                .prop_map(|(op, codes)| Ok((op, codes.into_iter().collect()))),
            prop::sample::select(vec!["DisruptionTarget", "ConfigIssue", "Ready"]).prop_map(Err),
        ],
    );
    (
        opt(prop::collection::vec(rule, 1..20)),
        opt(prop::collection::vec(
            (opt(index_list()), opt(count32())),
            1..20,
        )),
        opt(prop::sample::select(vec!["TerminatingOrFailed", "Failed"])),
        opt(index_list()),
        opt(index_list()),
    )
        .prop_map(
            |(failure, success, replacement, completed, failed)| Policies {
                failure,
                success,
                replacement,
                completed,
                failed,
            },
        )
}

fn with_policies(job: &mut Job, p: &Policies) {
    use k8s_openapi::api::batch::v1::{
        PodFailurePolicy, PodFailurePolicyOnExitCodesRequirement,
        PodFailurePolicyOnPodConditionsPattern, PodFailurePolicyRule, SuccessPolicy,
        SuccessPolicyRule,
    };
    let spec = job.spec.as_mut().expect("a spec");
    let indexed = spec.completion_mode.as_deref() == Some("Indexed");
    let per_index = spec.backoff_limit_per_index.is_some();
    let never = spec
        .template
        .spec
        .as_ref()
        .and_then(|s| s.restart_policy.as_deref())
        == Some("Never");
    // podFailurePolicy needs restartPolicy Never; FailIndex needs backoffLimitPerIndex.
    if let Some(rules) = p.failure.as_ref().filter(|_| never) {
        spec.pod_failure_policy = Some(PodFailurePolicy {
            rules: rules
                .iter()
                .filter(|(action, _)| *action != "FailIndex" || per_index)
                .map(|(action, on)| PodFailurePolicyRule {
                    action: action.to_string(),
                    on_exit_codes: on.clone().ok().map(|(op, values)| {
                        PodFailurePolicyOnExitCodesRequirement {
                            container_name: None,
                            operator: op.into(),
                            values,
                        }
                    }),
                    on_pod_conditions: on.as_ref().err().map(|type_| {
                        vec![PodFailurePolicyOnPodConditionsPattern {
                            type_: type_.to_string(),
                            status: Some("True".into()),
                        }]
                    }),
                })
                .collect(),
        });
    }
    // successPolicy needs Indexed; a count is at most the completions.
    if let Some(rules) = p.success.as_ref().filter(|_| indexed) {
        let completions = spec.completions.unwrap_or(0);
        spec.success_policy = Some(SuccessPolicy {
            rules: rules
                .iter()
                .map(|(indexes, count)| SuccessPolicyRule {
                    succeeded_indexes: indexes.map(String::from),
                    succeeded_count: count
                        .map(|c| c.min(completions))
                        .or(indexes.is_none().then_some(completions)),
                })
                .collect(),
        });
    }
    // A podFailurePolicy requires podReplacementPolicy Failed.
    spec.pod_replacement_policy = if spec.pod_failure_policy.is_some() {
        Some("Failed".into())
    } else {
        p.replacement.map(String::from)
    };
    let status = job.status.get_or_insert_with(Default::default);
    status.completed_indexes = p.completed.map(String::from);
    status.failed_indexes = p.failed.map(String::from).filter(|_| per_index);
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    /// Never panics; counts never negative; never more pods created or removed than allowed.
    #[test]
    fn job_plan_total_at_extremes(
        j in job_in(),
        ps in prop::collection::vec(pod_in(), 0..8),
        now in instant(),
        failures in count32(),
        last in opt(instant()),
    ) {
        run_all(&j, &ps, now, (failures, last));
    }

    /// The same with podFailurePolicy, successPolicy, podReplacementPolicy and index lists
    /// (the generator above leaves them unset).
    #[test]
    fn job_plan_total_with_policies_and_index_lists(
        j in job_in(),
        p in policies(),
        ps in prop::collection::vec(pod_in(), 0..8),
        now in instant(),
        failures in count32(),
        last in opt(instant()),
    ) {
        let pods: Vec<Arc<Pod>> = ps
            .iter()
            .enumerate()
            .map(|(i, p)| Arc::new(build_pod(i, p)))
            .collect();
        let mut job = build_job(&j, &pods);
        with_policies(&mut job, &p);
        check_job(&job, pods, now, (failures, last));
    }

    /// JR-34: the pod-failure backoff saturates at 600 s for any failure count and any pair of
    /// times in the API's range, never below zero.
    #[test]
    fn backoff_saturates(failures in any::<i32>(), last in instant(), now in instant()) {
        let d = policy::remaining_for_failures(failures, Some(ts(last)), ts(now));
        prop_assert!(d <= Duration::from_secs(600));
        if failures <= 0 {
            prop_assert_eq!(d, Duration::ZERO);
        }
    }

    /// JR-35: a finished time is always one of the pod's times, for any grace period.
    #[test]
    fn finished_time_total(p in pod_in()) {
        let _ = pods::finished_time(&build_pod(0, &p));
    }
}

/// JR-14: a replaced pod whose failure-count annotations say i32::MAX (the user's strings) gives
/// its replacement saturated counts (before: `attempt to add with overflow`).
#[test]
fn index_failure_count_annotation_at_i32_max_saturates() {
    let max = i32::MAX.to_string();
    let p = pod("a")
        .exit(1, 10)
        .annotate(pods::INDEX_FAILURE_COUNT, &max)
        .annotate(pods::INDEX_IGNORED_FAILURE_COUNT, &max)
        .build();
    let j = build_job(
        &JobIn {
            indexed: true,
            completions: Some(1),
            parallelism: Some(1),
            backoff_limit: None,
            per_index: Some((i32::MAX, None)),
            deadline: None,
            suspend: false,
            restart_on_failure: false,
            start: None,
            succeeded: None,
            failed: None,
            active: None,
            uncounted: vec![],
        },
        &[],
    );
    assert_eq!(new_index_failure_counts(&j, Some(&p)), (i32::MAX, i32::MAX));
}

/// The counters a status writer may have left at i32::MAX (validation only asks ≥ 0) are not
/// overflowed by newly counted pods: they saturate (before: `attempt to add with overflow`).
#[test]
fn status_counters_at_i32_max_saturate() {
    let j = JobIn {
        indexed: false,
        completions: None,
        parallelism: Some(2),
        backoff_limit: Some(i32::MAX),
        per_index: None,
        deadline: None,
        suspend: false,
        restart_on_failure: false,
        start: Some(0),
        succeeded: Some(i32::MAX),
        failed: Some(i32::MAX),
        active: Some(i32::MAX),
        uncounted: vec![0, 1],
    };
    let done = |code| PodIn {
        phase: if code == 0 { "Succeeded" } else { "Failed" },
        finalizer: true,
        ready: false,
        index: None,
        exit: Some((code, 10)),
        deleting: None,
        created: 0,
        restarts: 0,
        conditions: vec![],
    };
    run_all(&j, &[done(0), done(1), done(0), done(1)], 100, (0, None));
}

/// JR-41 with `succeededIndexes` spanning two billion indexes (completions up to i32::MAX is
/// API-valid): counted by interval, not by walking every index (before: about a minute of CPU
/// per sync in a debug build, blocking a worker).
#[test]
fn success_policy_over_two_billion_indexes_is_counted_by_interval() {
    use k8s_openapi::api::batch::v1::{SuccessPolicy, SuccessPolicyRule};
    let succeeded = Intervals::parse("0-2147483645", i32::MAX);
    let rule = |indexes: &str| SuccessPolicyRule {
        succeeded_indexes: Some(indexes.into()),
        succeeded_count: None,
    };
    let policy = SuccessPolicy {
        rules: vec![rule("2147483646"), rule("0-2147483645")],
    };
    let started = std::time::Instant::now();
    assert_eq!(
        policy::match_success_policy(Some(&policy), i32::MAX, &succeeded).as_deref(),
        Some("Matched rules at index 1")
    );
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "{:?}",
        started.elapsed()
    );
}

/// JR-15 for an Indexed Job of i32::MAX completions whose status lists all but the last index
/// as completed: the one pending index is found by stepping over the range, at once.
#[test]
fn pending_index_after_two_billion_completed_is_found_at_once() {
    let mut j = build_job(
        &JobIn {
            indexed: true,
            completions: Some(i32::MAX),
            parallelism: Some(2),
            backoff_limit: None,
            per_index: None,
            deadline: None,
            suspend: false,
            restart_on_failure: false,
            start: Some(0),
            succeeded: Some(i32::MAX - 1),
            failed: None,
            active: None,
            uncounted: vec![],
        },
        &[],
    );
    j.status.as_mut().unwrap().completed_indexes = Some("0-2147483645".into());
    let obs = Observed {
        job: &j,
        pods: vec![],
        expectations_satisfied: true,
        expected_rm_finalizers: HashSet::new(),
        backoff: BackoffRecord::default(),
        now: ts(100),
        clear_start_time_on_suspend: true,
    };
    let started = std::time::Instant::now();
    let e = evaluate(&obs);
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "{:?}",
        started.elapsed()
    );
    match &e.action {
        PodAction::Create(v) => {
            assert_eq!(
                v.iter().map(|n| n.index).collect::<Vec<_>>(),
                vec![Some(i32::MAX - 1)]
            )
        }
        other => panic!("expected one create, got {other:?}"),
    }
}
