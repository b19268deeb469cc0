//! The unit tests of the pure decisions: arguments, exit verdicts, what is printed, release.

use super::args::{StartArgs, new_object, timeout_seconds};
use super::render::{blocker_lines, human_age, progress_line, status_text};
use super::verdict::{Release, Verdict, release, verdict};
use super::{EXIT_BLOCKED, EXIT_CANCELLED, EXIT_DEADLINE};
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use k8s_openapi::jiff::Timestamp;
use node_maintenance::types::{
    CONDITION_CORDONED, CONDITION_DEADLINE_EXCEEDED, CONDITION_DRAINED, CONDITION_EVICTION_BLOCKED,
    NodeMaintenance, NodeMaintenanceStatus, Phase, Progress, Stage, TAINT_MAINTENANCE, TargetState,
    TargetedPod, TimeoutPolicy,
};

fn args(extra: &[&str]) -> StartArgs {
    use clap::Parser;
    #[derive(clap::Parser)]
    struct P {
        #[command(flatten)]
        a: StartArgs,
    }
    let mut v = vec!["x", "w1", "--reason", "kernel"];
    v.extend(extra);
    P::try_parse_from(v).map(|p| p.a).unwrap()
}

fn parse_err(extra: &[&str]) -> String {
    use clap::Parser;
    #[derive(clap::Parser, Debug)]
    struct P {
        #[command(flatten)]
        a: StartArgs,
    }
    let mut v = vec!["x", "w1", "--reason", "kernel"];
    v.extend(extra);
    P::try_parse_from(v).unwrap_err().to_string()
}

fn cond(type_: &str, status: &str, reason: &str, message: &str) -> Condition {
    Condition {
        type_: type_.into(),
        status: status.into(),
        reason: reason.into(),
        message: message.into(),
        last_transition_time: Time(Timestamp::UNIX_EPOCH),
        observed_generation: Some(1),
    }
}

fn nm(conditions: Vec<Condition>) -> NodeMaintenance {
    let mut o = new_object(&args(&[])).unwrap();
    o.metadata.generation = Some(1);
    o.status = Some(NodeMaintenanceStatus {
        observed_generation: Some(1),
        phase: Some(Phase::Draining),
        conditions,
        ..Default::default()
    });
    o
}

fn blocked_pod(pdb: Option<&str>, reason: &str) -> TargetedPod {
    TargetedPod {
        namespace: "shop".into(),
        name: "db-0".into(),
        uid: None,
        state: TargetState::Blocked,
        method: None,
        blocked_reason: Some(reason.into()),
        pod_disruption_budget: pdb.map(String::from),
        message: Some("needs 1 healthy, has 1".into()),
        attempts: 3,
        first_attempt_time: None,
        last_attempt_time: None,
        next_attempt_time: None,
    }
}

#[test]
fn object_is_named_after_the_node_and_drains() {
    let o = new_object(&args(&[])).unwrap();
    assert_eq!(o.metadata.name.as_deref(), Some("w1"));
    assert_eq!(o.spec.node_name, "w1");
    assert_eq!(o.spec.stage, Stage::Drain);
    assert_eq!(o.spec.reason.as_deref(), Some("kernel"));
    assert!(o.spec.drain.force && o.spec.drain.delete_empty_dir_data);
    assert_eq!(o.spec.drain.timeout_seconds, None);
    let o = new_object(&args(&["--name", "w1-kernel"])).unwrap();
    assert_eq!(o.metadata.name.as_deref(), Some("w1-kernel"));
    assert_eq!(o.spec.node_name, "w1");
}

#[test]
fn timeout_is_a_go_duration_rounded_up_to_seconds() {
    assert_eq!(timeout_seconds("5s"), Ok(5));
    assert_eq!(timeout_seconds("1m30s"), Ok(90));
    assert_eq!(timeout_seconds("1500ms"), Ok(2));
    assert_eq!(timeout_seconds("1ns"), Ok(1));
    assert_eq!(timeout_seconds("2562047h"), Ok(2562047 * 3600));
    assert!(timeout_seconds("0s").unwrap_err().contains("positive"));
    assert!(timeout_seconds("-5s").is_err());
    // Go's own error text for a bad duration.
    assert_eq!(
        timeout_seconds("5").unwrap_err(),
        "time: missing unit in duration \"5\""
    );
    let o = new_object(&args(&["--timeout", "10m", "--timeout-policy", "Delete"])).unwrap();
    assert_eq!(o.spec.drain.timeout_seconds, Some(600));
    assert_eq!(o.spec.drain.timeout_policy, TimeoutPolicy::Delete);
}

#[test]
fn bad_arguments_are_refused_before_any_request() {
    assert!(
        new_object(&args(&["--timeout-policy", "delete"]))
            .unwrap_err()
            .contains("needs --timeout")
    );
    assert!(parse_err(&["--timeout-policy", "Evict"]).contains("must be Wait or Delete"));
    assert!(parse_err(&["--timeout", "soon"]).contains("invalid duration"));
    let long = "x".repeat(1025);
    let mut a = args(&[]);
    a.reason = long;
    assert!(new_object(&a).unwrap_err().contains("1024"));
    a.reason = "é".repeat(1024); // characters, not bytes, as the CRD's maxLength
    assert!(new_object(&a).is_ok());
}

#[test]
fn verdict_drained_is_success() {
    let o = nm(vec![cond(CONDITION_DRAINED, "True", "DrainComplete", "")]);
    assert_eq!(verdict(&o), Verdict::Drained);
}

#[test]
fn verdict_waits_while_draining_or_on_an_unobserved_generation() {
    let o = nm(vec![
        cond(CONDITION_DRAINED, "False", "Draining", ""),
        cond(
            CONDITION_EVICTION_BLOCKED,
            "True",
            "PodDisruptionBudget",
            "web",
        ),
    ]);
    assert_eq!(verdict(&o), Verdict::Waiting);
    let mut o = nm(vec![cond(CONDITION_DRAINED, "True", "DrainComplete", "")]);
    o.metadata.generation = Some(2);
    assert_eq!(verdict(&o), Verdict::Waiting, "status of generation 1");
    let mut o = new_object(&args(&[])).unwrap();
    o.metadata.generation = Some(1);
    assert_eq!(verdict(&o), Verdict::Waiting, "no status yet");
}

#[test]
fn verdict_deadlock_fails_naming_pod_and_pdb() {
    let msg = "shop/db-0 blocked by PodDisruptionBudget db-pdb (needs 1 healthy, has 1)";
    let o = nm(vec![cond(
        CONDITION_EVICTION_BLOCKED,
        "True",
        "PodDisruptionBudgetDeadlock",
        msg,
    )]);
    let Verdict::Fail { code, message } = verdict(&o) else {
        panic!("{:?}", verdict(&o))
    };
    assert_eq!(code, EXIT_BLOCKED);
    assert!(
        message.contains(msg) && message.contains("deadlocked"),
        "{message}"
    );
    // With Delete at a deadline the controller will resolve it: keep following.
    let mut o = o;
    o.spec.drain.timeout_seconds = Some(30);
    o.spec.drain.timeout_policy = TimeoutPolicy::Delete;
    assert_eq!(verdict(&o), Verdict::Waiting);
}

#[test]
fn verdict_passed_deadline_fails_unless_deleting() {
    let o = nm(vec![
        cond(
            CONDITION_DEADLINE_EXCEEDED,
            "True",
            "WaitingPastDeadline",
            "at 12:00",
        ),
        cond(
            CONDITION_EVICTION_BLOCKED,
            "True",
            "PodDisruptionBudget",
            "shop/db-0 web-pdb",
        ),
    ]);
    let Verdict::Fail { code, message } = verdict(&o) else {
        panic!()
    };
    assert_eq!(code, EXIT_DEADLINE);
    assert!(message.contains("WaitingPastDeadline") && message.contains("web-pdb"));
    let o = nm(vec![cond(
        CONDITION_DEADLINE_EXCEEDED,
        "True",
        "DeletingPastDeadline",
        "",
    )]);
    assert_eq!(verdict(&o), Verdict::Waiting);
    let o = nm(vec![cond(
        CONDITION_DEADLINE_EXCEEDED,
        "False",
        "WithinDeadline",
        "",
    )]);
    assert_eq!(verdict(&o), Verdict::Waiting);
}

#[test]
fn verdict_consent_missing_node_cancel_and_delete() {
    let o = nm(vec![cond(
        CONDITION_DRAINED,
        "False",
        "PodsRequireConsent",
        "Pods that declare no controller (use --force to override): shop/legacy",
    )]);
    assert!(
        matches!(verdict(&o), Verdict::Fail { code: EXIT_BLOCKED, message } if message.contains("shop/legacy"))
    );
    let o = nm(vec![cond(CONDITION_DRAINED, "False", "NodeNotFound", "")]);
    assert!(matches!(
        verdict(&o),
        Verdict::Fail {
            code: EXIT_BLOCKED,
            ..
        }
    ));
    let mut o = nm(vec![]);
    o.spec.stage = Stage::Complete;
    assert!(matches!(
        verdict(&o),
        Verdict::Fail {
            code: EXIT_CANCELLED,
            ..
        }
    ));
    let mut o = nm(vec![]);
    o.metadata.deletion_timestamp = Some(Time(Timestamp::UNIX_EPOCH));
    assert!(matches!(
        verdict(&o),
        Verdict::Fail {
            code: EXIT_CANCELLED,
            ..
        }
    ));
}

#[test]
fn blockers_name_pod_pdb_and_reason() {
    let mut o = nm(vec![]);
    let status = o.status.as_mut().unwrap();
    status.targeted_pods = vec![
        blocked_pod(Some("db-pdb"), "PodDisruptionBudgetDeadlock"),
        TargetedPod {
            name: "web-1".into(),
            state: TargetState::Terminating,
            ..blocked_pod(None, "x")
        },
        TargetedPod {
            name: "hooked".into(),
            message: None,
            ..blocked_pod(None, "EvictionDenied")
        },
        TargetedPod {
            name: "db-1".into(),
            message: Some("blocked by PodDisruptionBudget db-pdb (needs 1 healthy, has 1)".into()),
            ..blocked_pod(Some("db-pdb"), "PodDisruptionBudgetDeadlock")
        },
    ];
    assert_eq!(
        blocker_lines(&o),
        vec![
            "blocked: shop/db-0 by PodDisruptionBudget db-pdb (PodDisruptionBudgetDeadlock): needs 1 healthy, has 1",
            "blocked: shop/hooked (EvictionDenied)",
            "blocked: shop/db-1 by PodDisruptionBudget db-pdb (needs 1 healthy, has 1) [PodDisruptionBudgetDeadlock]",
        ]
    );
}

#[test]
fn progress_line_counts() {
    let mut o = nm(vec![]);
    o.status.as_mut().unwrap().progress = Some(Progress {
        targeted: 5,
        evicted: 2,
        terminating: 1,
        pending: 2,
        blocked: 1,
        ..Default::default()
    });
    assert_eq!(
        progress_line(&o),
        "w1: Draining 2/5 evicted, 1 terminating, 2 pending, 1 blocked"
    );
    let mut o = new_object(&args(&[])).unwrap();
    o.status = None;
    assert_eq!(
        progress_line(&o),
        "w1: - 0/0 evicted, 0 terminating, 0 pending, 0 blocked"
    );
}

#[test]
fn ages_like_kubectl() {
    for (s, want) in [
        (-3, "0s"),
        (45, "45s"),
        (192, "3m12s"),
        (180, "3m"),
        (1020, "17m"),
        (5 * 3600 + 240, "5h4m"),
        (30 * 3600, "30h"),
        (3 * 86400 + 4 * 3600, "3d4h"),
        (12 * 86400, "12d"),
        (3 * 365 * 86400, "3y"),
        (i64::MAX, "292471208677y"),
    ] {
        assert_eq!(human_age(s), want, "{s}");
    }
}

#[test]
fn status_table_and_notes() {
    let now: Timestamp = "2026-01-01T00:10:00Z".parse().unwrap();
    let mut a = nm(vec![cond(
        CONDITION_EVICTION_BLOCKED,
        "True",
        "PodDisruptionBudgetDeadlock",
        "shop/db-0 blocked by PodDisruptionBudget db-pdb",
    )]);
    a.metadata.creation_timestamp = Some(Time("2026-01-01T00:09:15Z".parse().unwrap()));
    let status = a.status.as_mut().unwrap();
    status.progress = Some(Progress {
        targeted: 2,
        evicted: 1,
        pending: 1,
        blocked: 1,
        ..Default::default()
    });
    status.targeted_pods = vec![blocked_pod(Some("db-pdb"), "PodDisruptionBudgetDeadlock")];
    let mut b = new_object(&args(&["--name", "w2-long-name"])).unwrap();
    b.spec.node_name = "w2".into();
    b.spec.reason = None;
    let text = status_text(&[a, b], now);
    let want = "\
NAME           NODE   STAGE   PHASE      TARGETED   EVICTED   PENDING   BLOCKED   AGE
w1             w1     Drain   Draining   2          1         1         1         45s
w2-long-name   w2     Drain   -          0          0         0         0         -

w1:
  reason: kernel
  EvictionBlocked=True PodDisruptionBudgetDeadlock: shop/db-0 blocked by PodDisruptionBudget db-pdb
  blocked: shop/db-0 by PodDisruptionBudget db-pdb (PodDisruptionBudgetDeadlock): needs 1 healthy, has 1
";
    assert_eq!(text, want);
    assert_eq!(status_text(&[], now), "No NodeMaintenance found.\n");
}

fn node(unschedulable: bool, taints: &[&str]) -> Node {
    serde_json::from_value(serde_json::json!({
        "metadata": {"name": "w1"},
        "spec": {
            "unschedulable": unschedulable,
            "taints": taints.iter().map(|k| serde_json::json!({"key": k, "effect": "NoSchedule"})).collect::<Vec<_>>(),
        }
    }))
    .unwrap()
}

#[test]
fn release_waits_for_completed_and_the_taint_gone() {
    let mut o = nm(vec![]);
    let tainted = node(
        true,
        &[TAINT_MAINTENANCE, "node.kubernetes.io/unschedulable"],
    );
    let free = node(false, &[]);
    assert_eq!(
        release(Some(&o), Some(&free)),
        Release::Waiting,
        "not Completed"
    );
    o.status.as_mut().unwrap().phase = Some(Phase::Completed);
    assert_eq!(release(Some(&o), Some(&tainted)), Release::Waiting);
    assert_eq!(
        release(Some(&o), Some(&free)),
        Release::Released { schedulable: true }
    );
    assert_eq!(
        release(Some(&o), Some(&node(true, &[]))),
        Release::Released { schedulable: false },
        "cordoned before the maintenance: restored, not uncordoned"
    );
    assert_eq!(
        release(None, Some(&free)),
        Release::Released { schedulable: true }
    );
    assert_eq!(release(Some(&o), None), Release::NodeGone);
    o.status.as_mut().unwrap().conditions = vec![cond(
        CONDITION_CORDONED,
        "False",
        "HeldByOtherMaintenance",
        "held by a",
    )];
    assert_eq!(
        release(Some(&o), Some(&tainted)),
        Release::Held("held by a".into())
    );
}
