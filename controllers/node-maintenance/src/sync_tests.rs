//! Sync tests: the whole controller (its real `init`, handlers, queue and sync) against the test
//! kit's caches and recording writer, on tokio's paused clock; named after the conformance
//! scenarios (M1..M14) whose logic the kit can show (the API server's own behaviour is for end
//! to end).

use crate::types::*;
use crate::{DECLARATION, Options, init};
use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::{EmptyDirVolumeSource, Node, NodeSpec, Taint};
use k8s_openapi::api::policy::v1::{
    PodDisruptionBudget, PodDisruptionBudgetSpec, PodDisruptionBudgetStatus,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, OwnerReference, Time};
use k8s_openapi::jiff::Timestamp;
use kube::api::ObjectMeta;
use serde_json::{Value, json};
use shared::api::writer::Call;
use shared::cache::pod::{Pod, PodSpec, PodStatus, Volume};
use shared::testkit::{Kit, Running, api_error, eventually, settle};
use std::time::Duration;

const NS: &str = "shop";

fn now(kit: &Kit) -> Timestamp {
    kit.clock.now()
}

fn node(name: &str, unschedulable: Option<bool>) -> Node {
    Node {
        metadata: ObjectMeta {
            name: Some(name.into()),
            uid: Some(format!("uid-{name}")),
            resource_version: Some("1".into()),
            ..Default::default()
        },
        spec: Some(NodeSpec {
            unschedulable,
            ..Default::default()
        }),
        ..Default::default()
    }
}

fn owner(kind: &str, api_version: &str, name: &str) -> OwnerReference {
    OwnerReference {
        api_version: api_version.into(),
        kind: kind.into(),
        name: name.into(),
        uid: format!("uid-{name}"),
        controller: Some(true),
        ..Default::default()
    }
}

fn pod(name: &str, node: &str) -> Pod {
    Pod {
        metadata: ObjectMeta {
            name: Some(name.into()),
            namespace: Some(NS.into()),
            uid: Some(format!("uid-{name}")),
            resource_version: Some("1".into()),
            labels: Some(
                [(
                    "app".to_string(),
                    name.split('-').next().unwrap_or(name).to_string(),
                )]
                .into(),
            ),
            owner_references: Some(vec![owner("ReplicaSet", "apps/v1", &format!("{name}-rs"))]),
            creation_timestamp: Some(Time(shared::testkit::EPOCH.parse().unwrap())),
            ..Default::default()
        },
        spec: Some(PodSpec {
            node_name: Some(node.into()),
            ..Default::default()
        }),
        status: Some(PodStatus {
            phase: Some("Running".into()),
            ..Default::default()
        }),
    }
}

fn bare(mut p: Pod) -> Pod {
    p.metadata.owner_references = None;
    p
}

fn with_empty_dir(mut p: Pod) -> Pod {
    p.spec.as_mut().unwrap().volumes = Some(vec![Volume {
        name: "scratch".into(),
        empty_dir: Some(EmptyDirVolumeSource::default()),
        ..Default::default()
    }]);
    p
}

fn daemon_pod(name: &str, node: &str, ds: &str) -> Pod {
    let mut p = pod(name, node);
    p.metadata.owner_references = Some(vec![owner("DaemonSet", "apps/v1", ds)]);
    p
}

fn daemonset(name: &str) -> DaemonSet {
    DaemonSet {
        metadata: ObjectMeta {
            name: Some(name.into()),
            namespace: Some(NS.into()),
            uid: Some(format!("uid-{name}")),
            resource_version: Some("1".into()),
            ..Default::default()
        },
        ..Default::default()
    }
}

fn pdb(
    name: &str,
    app: &str,
    desired: i32,
    current: i32,
    expected: i32,
    allowed: i32,
    generation: i64,
) -> PodDisruptionBudget {
    PodDisruptionBudget {
        metadata: ObjectMeta {
            name: Some(name.into()),
            namespace: Some(NS.into()),
            uid: Some(format!("uid-{name}")),
            resource_version: Some(format!("{}", 10 + generation)),
            generation: Some(generation),
            ..Default::default()
        },
        spec: Some(PodDisruptionBudgetSpec {
            selector: Some(LabelSelector {
                match_labels: Some([("app".to_string(), app.to_string())].into()),
                ..Default::default()
            }),
            ..Default::default()
        }),
        status: Some(PodDisruptionBudgetStatus {
            desired_healthy: Some(desired),
            current_healthy: Some(current),
            expected_pods: Some(expected),
            disruptions_allowed: Some(allowed),
            observed_generation: Some(generation),
            ..Default::default()
        }),
    }
}

fn nm(name: &str, node: &str, stage: Stage, drain: DrainSpec) -> NodeMaintenance {
    let mut o = NodeMaintenance::new(
        name,
        NodeMaintenanceSpec {
            node_name: node.into(),
            stage,
            reason: Some("test".into()),
            drain,
        },
    );
    o.metadata.uid = Some(format!("uid-{name}"));
    o.metadata.resource_version = Some("1".into());
    o.metadata.generation = Some(1);
    o.metadata.creation_timestamp = Some(Time(shared::testkit::EPOCH.parse().unwrap()));
    o
}

fn kit() -> Kit {
    Kit::new()
}

fn start(kit: &Kit) -> Running {
    start_with(kit, Options::default())
}

fn start_with(kit: &Kit, opts: Options) -> Running {
    let ctl = init(kit.setup(DECLARATION.name, DECLARATION.event_source), opts).unwrap();
    kit.seed(Vec::<NodeMaintenance>::new());
    kit.seed(Vec::<Node>::new());
    kit.seed(Vec::<Pod>::new());
    kit.seed(Vec::<PodDisruptionBudget>::new());
    kit.seed(Vec::<DaemonSet>::new());
    kit.start(ctl)
}

/// The watch catches up with everything the tracker holds of these names.
fn catch_up(kit: &Kit, objects: &[&str], nodes: &[&str], pods: &[&str]) {
    for n in nodes {
        kit.observe::<Node>("", n);
    }
    for p in pods {
        kit.observe::<Pod>(NS, p);
    }
    for o in objects {
        kit.observe::<NodeMaintenance>("", o);
    }
}

fn stored(kit: &Kit, name: &str) -> NodeMaintenance {
    kit.api
        .object::<NodeMaintenance>("", name)
        .expect("object in the tracker")
}

fn status(kit: &Kit, name: &str) -> NodeMaintenanceStatus {
    stored(kit, name).status.unwrap_or_default()
}

fn condition(kit: &Kit, name: &str, type_: &str) -> Option<(String, String, String)> {
    status(kit, name)
        .conditions
        .into_iter()
        .find(|c| c.type_ == type_)
        .map(|c| (c.status, c.reason, c.message))
}

fn evictions(kit: &Kit, pod: &str) -> usize {
    kit.api
        .calls()
        .iter()
        .filter(|c| matches!(c, Call::Create(t, _) if t.subresource.as_deref() == Some("eviction") && t.name == pod))
        .count()
}

fn eviction_body(kit: &Kit, pod: &str) -> Option<Value> {
    kit.api.calls().into_iter().find_map(|c| match c {
        Call::Create(t, v) if t.subresource.as_deref() == Some("eviction") && t.name == pod => {
            Some(v)
        }
        _ => None,
    })
}

fn events(kit: &Kit) -> Vec<String> {
    kit.api
        .events()
        .into_iter()
        .map(|(t, r, _)| format!("{t} {r}"))
        .collect()
}

fn count(kit: &Kit, event: &str) -> usize {
    events(kit).iter().filter(|e| *e == event).count()
}

fn node_writes(kit: &Kit) -> usize {
    kit.api
        .writes()
        .iter()
        .filter(|c| c.target().plural == "nodes")
        .count()
}

/// A 429 as eviction.go answers for a budget that allows nothing.
fn pdb_429(name: &str, healthy: i32) -> kube::Error {
    let mut s =
        kube::core::Status::failure(crate::evict::PDB_MESSAGE, "TooManyRequests").with_code(429);
    s.details = Some(kube::core::response::StatusDetails {
        name: String::new(),
        group: String::new(),
        kind: String::new(),
        uid: String::new(),
        causes: vec![kube::core::response::StatusCause {
            reason: "DisruptionBudget".into(),
            message: format!(
                "The disruption budget {name} needs {healthy} healthy pods and has {healthy} currently"
            ),
            field: String::new(),
        }],
        retry_after_seconds: 0,
    });
    kube::Error::Api(Box::new(s))
}

fn is_eviction_of(c: &Call, pod: &str) -> bool {
    matches!(c, Call::Create(t, _) if t.subresource.as_deref() == Some("eviction") && t.name == pod)
}

/// Node w1 with pod db-0 behind PDB db-pdb, which refuses every eviction (429).
fn seed_db_behind_a_closed_budget(kit: &Kit) {
    kit.seed([node("w1", None)]);
    kit.seed([pdb("db-pdb", "db", 1, 1, 1, 0, 1)]);
    kit.seed([pod("db-0", "w1")]);
    kit.api
        .fail_when(|c| is_eviction_of(c, "db-0").then(|| pdb_429("db-pdb", 1)));
}

/// Deletes an object the way the API server does with a finalizer: a deletionTimestamp.
fn mark_deleted(kit: &Kit, name: &str) {
    let mut o = stored(kit, name);
    o.metadata.deletion_timestamp = Some(Time(now(kit)));
    kit.api.insert(&o);
    kit.apply(o);
}

/// M1: finalizer and owner reference, cordon with the annotation and taint, the pod condition
/// before each eviction, DaemonSet pods untouched, progress, events; deletion releases.
#[tokio::test(start_paused = true)]
async fn m1_happy_path_then_delete_releases() {
    let kit = kit();
    let _running = start(&kit);
    kit.seed([node("w1", None)]);
    kit.seed([daemonset("logship")]);
    kit.seed([
        pod("web-1", "w1"),
        bare(with_empty_dir(pod("scratch", "w1"))),
        daemon_pod("logship-x", "w1", "logship"),
    ]);
    kit.seed([nm("m1", "w1", Stage::Drain, DrainSpec::default())]);
    assert!(
        eventually(Duration::from_secs(5), || evictions(&kit, "web-1") == 1
            && evictions(&kit, "scratch") == 1)
        .await
    );
    // The object got its finalizer and owner reference before any node write.
    let writes = kit.api.writes();
    let meta = writes
        .iter()
        .position(|c| c.target().plural == "nodemaintenances" && c.target().subresource.is_none())
        .unwrap();
    let cordon = writes
        .iter()
        .position(|c| c.target().plural == "nodes")
        .unwrap();
    assert!(meta < cordon, "{writes:?}");
    let o = stored(&kit, "m1");
    assert_eq!(
        o.metadata.finalizers.as_deref(),
        Some(&[FINALIZER.to_string()][..])
    );
    let owner = &o.metadata.owner_references.as_ref().unwrap()[0];
    assert_eq!(
        (
            owner.kind.as_str(),
            owner.uid.as_str(),
            owner.controller,
            owner.block_owner_deletion
        ),
        ("Node", "uid-w1", Some(false), Some(false))
    );
    let w1 = kit.api.object::<Node>("", "w1").unwrap();
    assert_eq!(w1.spec.as_ref().unwrap().unschedulable, Some(true));
    assert_eq!(
        w1.metadata.annotations.as_ref().unwrap()[ANNOTATION_PRE_MAINTENANCE_UNSCHEDULABLE],
        "false"
    );
    assert!(
        w1.spec
            .as_ref()
            .unwrap()
            .taints
            .as_ref()
            .unwrap()
            .iter()
            .any(|t| t.key == TAINT_MAINTENANCE && t.effect == "NoSchedule")
    );
    // NM-12: the condition patch precedes each eviction; the eviction carries the UID. Before
    // either, the object's status lists the pod (a successor then knows the target whatever
    // happens to the leader after the eviction is accepted).
    for p in ["web-1", "scratch"] {
        let calls = kit.api.calls();
        let listed = calls.iter().position(|c| matches!(c, Call::Patch(t, _, body) if t.plural == "nodemaintenances" && t.subresource.as_deref() == Some("status") && body["status"]["targetedPods"].as_array().is_some_and(|l| l.iter().any(|e| e["name"] == p)))).unwrap();
        let first_request = calls
            .iter()
            .position(|c| matches!(c, Call::Patch(t, _, _) if t.name == p) || is_eviction_of(c, p))
            .unwrap();
        assert!(
            listed < first_request,
            "{p}: listed at call {listed}, first request at {first_request}"
        );
        let cond = calls.iter().position(|c| matches!(c, Call::Patch(t, _, body) if t.name == p && t.subresource.as_deref() == Some("status") && body["status"]["conditions"][0]["type"] == POD_CONDITION_TARGETED)).unwrap();
        let ev = calls.iter().position(|c| is_eviction_of(c, p)).unwrap();
        assert!(cond < ev);
        let Call::Patch(_, _, body) = &calls[cond] else {
            unreachable!()
        };
        assert_eq!(body["status"]["conditions"][0]["reason"], "NodeMaintenance");
        assert_eq!(
            body["status"]["conditions"][0]["message"],
            "NodeMaintenance m1 on node w1: test"
        );
        let ev = eviction_body(&kit, p).unwrap();
        assert_eq!(ev["apiVersion"], "policy/v1");
        assert_eq!(
            ev["deleteOptions"]["preconditions"]["uid"],
            format!("uid-{p}")
        );
        assert!(ev["deleteOptions"].get("gracePeriodSeconds").is_none());
    }
    assert_eq!(evictions(&kit, "logship-x"), 0);
    // The pods go; the watch catches up.
    catch_up(&kit, &["m1"], &["w1"], &["web-1", "scratch"]);
    assert!(
        eventually(Duration::from_secs(5), || status(&kit, "m1").phase
            == Some(Phase::Drained))
        .await
    );
    let st = status(&kit, "m1");
    let p = st.progress.unwrap();
    assert_eq!(
        (
            p.targeted,
            p.evicted,
            p.pending,
            p.blocked,
            p.skipped.daemon_set,
            p.percent
        ),
        (2, 2, 0, 0, 1, 100)
    );
    assert_eq!(
        condition(&kit, "m1", CONDITION_DRAINED).unwrap().1,
        "DrainComplete"
    );
    assert_eq!(
        st.stage_statuses.iter().map(|s| s.name).collect::<Vec<_>>(),
        [Stage::Drain],
        "a skipped stage gets no entry"
    );
    assert_eq!(st.drain.as_ref().unwrap().total_pods, Some(3));
    settle().await;
    for e in [
        "Normal BeginMaintenance",
        "Normal Cordoned",
        "Normal DrainComplete",
    ] {
        assert_eq!(count(&kit, e), 1, "{e}: {:?}", events(&kit));
    }
    assert_eq!(count(&kit, "Normal Evicted"), 4, "pod and object, twice");
    // Delete: release and let go.
    catch_up(&kit, &["m1"], &["w1"], &[]);
    mark_deleted(&kit, "m1");
    assert!(
        eventually(Duration::from_secs(5), || stored(&kit, "m1")
            .metadata
            .finalizers
            .unwrap_or_default()
            .is_empty())
        .await
    );
    let w1 = kit.api.object::<Node>("", "w1").unwrap();
    assert_eq!(w1.spec.as_ref().unwrap().unschedulable, Some(false));
    assert!(w1.spec.as_ref().unwrap().taints.is_none());
    assert!(w1.metadata.annotations.unwrap_or_default().is_empty());
    settle().await;
    assert_eq!(count(&kit, "Normal UncordonNode"), 1);
    assert_eq!(count(&kit, "Normal RemovedMaintenance"), 1);
}

/// M2 and NM-16/NM-17: a single-replica budget is a named deadlock, warned once; attempts back
/// off; the deadline passes with Wait; a budget that allows a disruption resumes within 5 s.
#[tokio::test(start_paused = true)]
async fn m2_deadlock_is_named_backs_off_and_resumes_on_budget_change() {
    let kit = kit();
    let _running = start(&kit);
    kit.seed([node("w1", None)]);
    kit.seed([pdb("db-pdb", "db", 1, 1, 1, 0, 1)]);
    kit.seed([pod("db-0", "w1")]);
    let budget_open = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let open = budget_open.clone();
    kit.api.fail_when(move |c| {
        (is_eviction_of(c, "db-0") && !open.load(std::sync::atomic::Ordering::SeqCst))
            .then(|| pdb_429("db-pdb", 1))
    });
    let drain = DrainSpec {
        timeout_seconds: Some(30),
        ..DrainSpec::default()
    };
    kit.seed([nm("m2", "w1", Stage::Drain, drain)]);
    assert!(
        eventually(Duration::from_secs(10), || condition(
            &kit,
            "m2",
            CONDITION_EVICTION_BLOCKED
        )
        .is_some_and(|c| c.1 == "PodDisruptionBudgetDeadlock"))
        .await
    );
    let (_, _, msg) = condition(&kit, "m2", CONDITION_EVICTION_BLOCKED).unwrap();
    assert_eq!(
        msg,
        "shop/db-0 blocked by PodDisruptionBudget db-pdb (needs 1 healthy, has 1; no disruption possible at current scale)"
    );
    let st = status(&kit, "m2");
    let entry = &st.targeted_pods[0];
    assert_eq!(
        (
            entry.state,
            entry.pod_disruption_budget.as_deref(),
            entry.blocked_reason.as_deref()
        ),
        (
            TargetState::Blocked,
            Some("db-pdb"),
            Some("PodDisruptionBudgetDeadlock")
        )
    );
    assert_eq!(st.phase, Some(Phase::Draining));
    // Backoff: 5, 10, 20, 40 s: at most 5 attempts in 75 s (scenario M2 allows 6).
    tokio::time::sleep(Duration::from_secs(75)).await;
    catch_up(&kit, &["m2"], &[], &[]);
    let attempts = evictions(&kit, "db-0");
    assert!((3..=6).contains(&attempts), "{attempts} attempts in 75 s");
    settle().await;
    assert_eq!(
        count(&kit, "Warning DrainDeadlocked"),
        2,
        "once on the object, once on the pod: {:?}",
        events(&kit)
    );
    // Past the deadline with Wait: the condition, one warning, the node stays cordoned.
    assert!(
        eventually(Duration::from_secs(5), || condition(
            &kit,
            "m2",
            CONDITION_DEADLINE_EXCEEDED
        )
        .is_some_and(|c| c.1 == "WaitingPastDeadline"))
        .await
    );
    settle().await;
    assert_eq!(count(&kit, "Warning DrainDeadlineExceeded"), 1);
    assert_eq!(
        kit.api
            .object::<Node>("", "w1")
            .unwrap()
            .spec
            .unwrap()
            .unschedulable,
        Some(true)
    );
    // The owner scaled: the budget allows one disruption; the eviction goes through at once
    // (not after the pending backoff of up to 80 s).
    budget_open.store(true, std::sync::atomic::Ordering::SeqCst);
    let before = evictions(&kit, "db-0");
    let mut open_pdb = pdb("db-pdb", "db", 1, 2, 2, 1, 1);
    open_pdb.metadata.resource_version = Some("99".into());
    kit.apply(open_pdb);
    let t0 = tokio::time::Instant::now();
    assert!(eventually(Duration::from_secs(5), || evictions(&kit, "db-0") > before).await);
    assert!(t0.elapsed() <= Duration::from_secs(5));
    catch_up(&kit, &["m2"], &[], &["db-0"]);
    assert!(
        eventually(Duration::from_secs(5), || condition(
            &kit,
            "m2",
            CONDITION_DRAINED
        )
        .is_some_and(|c| c.0 == "True"))
        .await
    );
    assert_eq!(
        condition(&kit, "m2", CONDITION_EVICTION_BLOCKED).unwrap().0,
        "False"
    );
}

/// NM-17: two objects drain one node past a deadlocked budget. The pod's attempts are
/// shared (one record per pod), so the object that did not make the attempt that found the
/// deadlock still shows it in its status, and must warn `DrainDeadlocked` on itself too.
#[tokio::test(start_paused = true)]
async fn a_deadlock_found_by_another_objects_attempt_is_warned_on_both() {
    let kit = kit();
    let _running = start(&kit);
    seed_db_behind_a_closed_budget(&kit);
    kit.seed([
        nm("first", "w1", Stage::Drain, DrainSpec::default()),
        nm("second", "w1", Stage::Drain, DrainSpec::default()),
    ]);
    for name in ["first", "second"] {
        assert!(
            eventually(Duration::from_secs(10), || condition(
                &kit,
                name,
                CONDITION_EVICTION_BLOCKED
            )
            .is_some_and(|c| c.1 == "PodDisruptionBudgetDeadlock"))
            .await,
            "{name}: no deadlock in its status"
        );
    }
    tokio::time::sleep(Duration::from_secs(30)).await;
    settle().await;
    let warned = |who: &str| {
        kit.api
            .calls()
            .into_iter()
            .filter(|c| match c {
                Call::Create(t, v) => {
                    t.plural == "events"
                        && v["reason"] == "DrainDeadlocked"
                        && v["involvedObject"]["name"] == who
                }
                _ => false,
            })
            .count()
    };
    assert_eq!(
        (warned("first"), warned("second")),
        (1, 1),
        "once on each object: {:?}",
        events(&kit)
    );
    assert!(warned("db-0") >= 1, "the pod is warned by the attempt");
}

/// M3: timeoutPolicy Delete: past the deadline, DisruptionTarget/DeletionByNodeMaintenance then
/// a DELETE with the UID precondition and grace period; EvictedByDeletion names the budget.
#[tokio::test(start_paused = true)]
async fn m3_delete_escalation_past_the_deadline() {
    let kit = kit();
    let _running = start(&kit);
    seed_db_behind_a_closed_budget(&kit);
    let drain = DrainSpec {
        timeout_seconds: Some(30),
        timeout_policy: TimeoutPolicy::Delete,
        grace_period_seconds: Some(i64::MAX),
        ..DrainSpec::default()
    };
    kit.seed([nm("m3", "w1", Stage::Drain, drain)]);
    let deleted = |kit: &Kit| {
        kit.api.calls().into_iter().find_map(|c| match c {
            Call::DeleteGraceful {
                target,
                uid,
                grace_period_seconds,
                ..
            } if target.name == "db-0" => Some((uid, grace_period_seconds)),
            _ => None,
        })
    };
    tokio::time::sleep(Duration::from_secs(29)).await;
    assert!(
        deleted(&kit).is_none(),
        "nothing deleted before the deadline"
    );
    // At the deadline, not at the evictions' next backoff slot (35 s after 0, 5 and 15 s).
    assert!(eventually(Duration::from_secs(2), || deleted(&kit).is_some()).await);
    assert_eq!(deleted(&kit).unwrap(), (Some("uid-db-0".into()), i64::MAX));
    let calls = kit.api.calls();
    let cond = calls.iter().position(|c| matches!(c, Call::Patch(t, _, b) if t.name == "db-0" && b["status"]["conditions"][0]["reason"] == "DeletionByNodeMaintenance")).unwrap();
    let del = calls
        .iter()
        .position(|c| matches!(c, Call::DeleteGraceful { .. }))
        .unwrap();
    assert!(cond < del);
    settle().await;
    let msgs: Vec<String> = kit
        .api
        .events()
        .into_iter()
        .filter(|(_, r, _)| r == "EvictedByDeletion")
        .map(|(_, _, m)| m)
        .collect();
    assert_eq!(msgs.len(), 2);
    assert!(
        msgs[0].contains("bypassing PodDisruptionBudget db-pdb"),
        "{msgs:?}"
    );
    catch_up(&kit, &["m3"], &[], &["db-0"]);
    assert!(
        eventually(Duration::from_secs(5), || status(&kit, "m3").phase
            == Some(Phase::Drained))
        .await
    );
    assert_eq!(
        status(&kit, "m3").targeted_pods[0].method,
        Some(EvictionMethod::Delete)
    );
    // Drained past its deadline: the condition still says what happened.
    let (st, reason, _) = condition(&kit, "m3", CONDITION_DEADLINE_EXCEEDED).unwrap();
    assert_eq!(
        (st.as_str(), reason.as_str()),
        ("True", "DeletingPastDeadline")
    );
}

/// M4 and NB-10: the multiple-PDB failure comes back as a 2xx Status body: Blocked, named.
#[tokio::test(start_paused = true)]
async fn m4_multiple_budgets_read_from_a_2xx_failure_body() {
    let kit = kit();
    let _running = start(&kit);
    kit.seed([node("w1", None)]);
    kit.seed([
        pdb("db-pdb", "db", 1, 2, 2, 1, 1),
        pdb("db-pdb-2", "db", 1, 2, 2, 1, 1),
    ]);
    kit.seed([pod("db-0", "w1")]);
    kit.api.answer_when(|c| is_eviction_of(c, "db-0").then(|| Ok(json!({
        "kind": "Status", "apiVersion": "v1", "status": "Failure", "code": 500,
        "message": "This pod has more than one PodDisruptionBudget, which the eviction subresource does not support."
    }))));
    kit.seed([nm("m4", "w1", Stage::Drain, DrainSpec::default())]);
    assert!(
        eventually(Duration::from_secs(5), || condition(
            &kit,
            "m4",
            CONDITION_EVICTION_BLOCKED
        )
        .is_some_and(|c| c.1 == "MultiplePodDisruptionBudgets"))
        .await
    );
    let entry = &status(&kit, "m4").targeted_pods[0];
    assert_eq!(
        entry.blocked_reason.as_deref(),
        Some("MultiplePodDisruptionBudgets")
    );
    assert!(
        entry
            .message
            .as_deref()
            .unwrap()
            .contains("db-pdb, db-pdb-2")
    );
    assert_eq!(status(&kit, "m4").progress.unwrap().blocked, 1);
}

/// M5 and NM-10: one pod without consent stops the whole drain, in kubectl's words; consent
/// given later evicts both.
#[tokio::test(start_paused = true)]
async fn m5_consent_is_all_or_nothing() {
    let kit = kit();
    let _running = start(&kit);
    kit.seed([node("w2", None)]);
    kit.seed([bare(pod("legacy", "w2")), pod("web-2", "w2")]);
    kit.seed([nm(
        "m5",
        "w2",
        Stage::Drain,
        DrainSpec {
            force: false,
            ..DrainSpec::default()
        },
    )]);
    assert!(
        eventually(Duration::from_secs(5), || condition(
            &kit,
            "m5",
            CONDITION_DRAINED
        )
        .is_some_and(|c| c.1 == "PodsRequireConsent"))
        .await
    );
    assert_eq!(
        condition(&kit, "m5", CONDITION_DRAINED).unwrap().2,
        "cannot delete Pods that declare no controller (use --force to override): shop/legacy"
    );
    tokio::time::sleep(Duration::from_secs(30)).await;
    assert_eq!(
        evictions(&kit, "web-2") + evictions(&kit, "legacy"),
        0,
        "not even web"
    );
    settle().await;
    assert_eq!(count(&kit, "Warning PodsRequireConsent"), 1);
    let mut o = stored(&kit, "m5");
    o.spec.drain.force = true;
    o.metadata.generation = Some(2);
    kit.api.insert(&o);
    kit.apply(o);
    assert!(
        eventually(Duration::from_secs(5), || evictions(&kit, "web-2") == 1
            && evictions(&kit, "legacy") == 1)
        .await
    );
}

/// M6 and NM-20/NM-21: an admin's cordon is recorded by the first object; the node stays
/// cordoned while another object is active and is restored to the admin's state at the end.
#[tokio::test(start_paused = true)]
async fn m6_overlapping_objects_count_the_cordon() {
    let kit = kit();
    let _running = start(&kit);
    kit.seed([node("w3", Some(true))]);
    kit.seed([pod("web-3", "w3")]);
    kit.seed([nm("a", "w3", Stage::Cordon, DrainSpec::default())]);
    assert!(
        eventually(Duration::from_secs(5), || status(&kit, "a").phase
            == Some(Phase::Cordoned))
        .await
    );
    catch_up(&kit, &["a"], &["w3"], &[]);
    let mut b = nm("b", "w3", Stage::Drain, DrainSpec::default());
    b.metadata.creation_timestamp = Some(Time(now(&kit)));
    kit.seed([b]);
    assert!(eventually(Duration::from_secs(5), || evictions(&kit, "web-3") == 1).await);
    let w3 = kit.api.object::<Node>("", "w3").unwrap();
    assert_eq!(
        w3.metadata.annotations.unwrap()[ANNOTATION_PRE_MAINTENANCE_UNSCHEDULABLE],
        "true"
    );
    catch_up(&kit, &["a", "b"], &["w3"], &["web-3"]);
    // b -> Complete: the node stays cordoned for a.
    let mut o = stored(&kit, "b");
    o.spec.stage = Stage::Complete;
    kit.api.insert(&o);
    kit.apply(o);
    assert!(
        eventually(Duration::from_secs(5), || condition(
            &kit,
            "b",
            CONDITION_CORDONED
        )
        .is_some_and(|c| c.1 == "HeldByOtherMaintenance"))
        .await
    );
    assert!(
        condition(&kit, "b", CONDITION_CORDONED)
            .unwrap()
            .2
            .contains("NodeMaintenance a")
    );
    assert_eq!(status(&kit, "b").phase, Some(Phase::Completed));
    let w3 = kit.api.object::<Node>("", "w3").unwrap();
    assert!(
        w3.spec
            .as_ref()
            .unwrap()
            .taints
            .as_ref()
            .is_some_and(|t| !t.is_empty())
    );
    // Delete a: the admin's unschedulable=true is restored, taint and annotation removed.
    catch_up(&kit, &["a", "b"], &["w3"], &[]);
    mark_deleted(&kit, "a");
    assert!(
        eventually(Duration::from_secs(5), || kit
            .api
            .object::<Node>("", "w3")
            .unwrap()
            .metadata
            .annotations
            .unwrap_or_default()
            .is_empty())
        .await
    );
    let w3 = kit.api.object::<Node>("", "w3").unwrap();
    assert_eq!(w3.spec.as_ref().unwrap().unschedulable, Some(true));
    assert!(w3.spec.as_ref().unwrap().taints.is_none());
    settle().await;
    assert_eq!(
        count(&kit, "Normal UncordonNode"),
        0,
        "the node did not become schedulable"
    );
}

/// M7 and NM-4: Idle touches nothing and holds no finalizer; Idle -> Complete leaves
/// spec.unschedulable alone.
#[tokio::test(start_paused = true)]
async fn m7_idle_touches_nothing() {
    let kit = kit();
    let _running = start(&kit);
    kit.seed([node("w1", Some(true))]);
    kit.seed([pod("web-1", "w1")]);
    kit.seed([nm("idle", "w1", Stage::Idle, DrainSpec::default())]);
    assert!(
        eventually(Duration::from_secs(5), || status(&kit, "idle").phase
            == Some(Phase::Idle))
        .await
    );
    assert_eq!(node_writes(&kit), 0);
    assert!(
        stored(&kit, "idle")
            .metadata
            .finalizers
            .unwrap_or_default()
            .is_empty()
    );
    assert_eq!(
        condition(&kit, "idle", CONDITION_CORDONED).unwrap().1,
        "NotRequested"
    );
    catch_up(&kit, &["idle"], &[], &[]);
    let mut o = stored(&kit, "idle");
    o.spec.stage = Stage::Complete;
    kit.api.insert(&o);
    kit.apply(o);
    assert!(
        eventually(Duration::from_secs(5), || status(&kit, "idle").phase
            == Some(Phase::Completed))
        .await
    );
    assert_eq!(node_writes(&kit), 0);
    assert_eq!(evictions(&kit, "web-1"), 0);
    assert!(
        status(&kit, "idle")
            .stage_statuses
            .iter()
            .all(|s| s.name == Stage::Complete)
    );
}

/// M8 and NM-2: a missing node: Pending, NodeNotFound once per generation, no finalizer, no
/// polling; the node's creation starts the maintenance.
#[tokio::test(start_paused = true)]
async fn m8_missing_node_then_created() {
    let kit = kit();
    let _running = start(&kit);
    kit.seed([nm("m8", "w9", Stage::Drain, DrainSpec::default())]);
    assert!(
        eventually(Duration::from_secs(5), || status(&kit, "m8").phase
            == Some(Phase::Pending))
        .await
    );
    assert_eq!(
        condition(&kit, "m8", CONDITION_CORDONED).unwrap().1,
        "NodeNotFound"
    );
    assert_eq!(
        condition(&kit, "m8", CONDITION_DRAINED).unwrap().1,
        "NodeNotFound"
    );
    assert!(
        stored(&kit, "m8")
            .metadata
            .finalizers
            .unwrap_or_default()
            .is_empty()
    );
    catch_up(&kit, &["m8"], &[], &[]);
    let calls = kit.api.calls().len();
    tokio::time::sleep(Duration::from_secs(600)).await;
    assert_eq!(kit.api.calls().len(), calls, "no polling");
    settle().await;
    assert_eq!(count(&kit, "Warning NodeNotFound"), 1);
    kit.seed([node("w9", None)]);
    assert!(
        eventually(Duration::from_secs(5), || status(&kit, "m8").phase
            == Some(Phase::Drained))
        .await
    );
    assert_eq!(
        kit.api
            .object::<Node>("", "w9")
            .unwrap()
            .spec
            .unwrap()
            .unschedulable,
        Some(true)
    );
}

/// M9 and NM-2: the node deleted mid-drain: the finalizer goes without any node write; a node
/// of the same name but another UID is "replaced" and left alone.
#[tokio::test(start_paused = true)]
async fn m9_node_deleted_or_replaced_mid_drain() {
    let kit = kit();
    let _running = start(&kit);
    kit.seed([node("w1", None)]);
    kit.seed([pod("db-0", "w1")]);
    kit.api
        .fail_when(|c| is_eviction_of(c, "db-0").then(|| pdb_429("db-pdb", 1)));
    kit.seed([nm("m9", "w1", Stage::Drain, DrainSpec::default())]);
    assert!(eventually(Duration::from_secs(5), || evictions(&kit, "db-0") >= 1).await);
    catch_up(&kit, &["m9"], &["w1"], &[]);
    let writes = node_writes(&kit);
    // Replaced: same name, new UID.
    let mut fresh = node("w1", None);
    fresh.metadata.uid = Some("uid-w1-new".into());
    fresh.metadata.resource_version = Some("50".into());
    kit.api.insert(&fresh);
    kit.apply(fresh.clone());
    assert!(
        eventually(Duration::from_secs(5), || condition(
            &kit,
            "m9",
            CONDITION_CORDONED
        )
        .is_some_and(|c| c.1 == "NodeReplaced"))
        .await
    );
    assert!(
        stored(&kit, "m9")
            .metadata
            .finalizers
            .unwrap_or_default()
            .is_empty(),
        "the garbage collector may delete it"
    );
    assert_eq!(node_writes(&kit), writes, "no write to the new node");
    // Deleted: still no node writes.
    kit.remove(fresh);
    catch_up(&kit, &["m9"], &[], &[]);
    assert!(
        eventually(Duration::from_secs(5), || condition(
            &kit,
            "m9",
            CONDITION_CORDONED
        )
        .is_some_and(|c| c.1 == "NodeNotFound"))
        .await
    );
    assert_eq!(node_writes(&kit), writes);
}

/// M10 and NM-7: an out-of-band uncordon is reverted within one reconcile, with CordonReverted
/// on the object and the node.
#[tokio::test(start_paused = true)]
async fn m10_out_of_band_uncordon_is_reverted() {
    let kit = kit();
    let _running = start(&kit);
    kit.seed([node("w1", None)]);
    kit.seed([pod("db-0", "w1")]);
    kit.api
        .fail_when(|c| is_eviction_of(c, "db-0").then(|| pdb_429("db-pdb", 1)));
    kit.seed([nm("m10", "w1", Stage::Drain, DrainSpec::default())]);
    assert!(
        eventually(Duration::from_secs(5), || condition(
            &kit,
            "m10",
            CONDITION_CORDONED
        )
        .is_some_and(|c| c.0 == "True"))
        .await
    );
    catch_up(&kit, &["m10"], &["w1"], &[]);
    // kubectl uncordon: unschedulable false (the taint stays, the annotation too).
    let mut n = kit.api.object::<Node>("", "w1").unwrap();
    n.spec.as_mut().unwrap().unschedulable = None;
    n.metadata.resource_version = Some("777".into());
    kit.api.insert(&n);
    kit.apply(n);
    assert!(
        eventually(Duration::from_secs(2), || kit
            .api
            .object::<Node>("", "w1")
            .unwrap()
            .spec
            .unwrap()
            .unschedulable
            == Some(true))
        .await
    );
    settle().await;
    assert_eq!(
        count(&kit, "Warning CordonReverted"),
        2,
        "{:?}",
        events(&kit)
    );
    let n = kit.api.object::<Node>("", "w1").unwrap();
    assert_eq!(
        n.metadata.annotations.unwrap()[ANNOTATION_PRE_MAINTENANCE_UNSCHEDULABLE],
        "false",
        "the prior state is kept"
    );
}

/// M11 and NM-19: Complete mid-drain: no more attempts, Cancelled, the pod condition ends,
/// the node is released, Completed.
#[tokio::test(start_paused = true)]
async fn m11_cancellation() {
    let kit = kit();
    let _running = start(&kit);
    kit.seed([node("w1", None)]);
    kit.seed([pod("db-0", "w1")]);
    kit.api
        .fail_when(|c| is_eviction_of(c, "db-0").then(|| pdb_429("db-pdb", 1)));
    kit.seed([nm("m11", "w1", Stage::Drain, DrainSpec::default())]);
    assert!(
        eventually(Duration::from_secs(5), || evictions(&kit, "db-0") >= 1
            && status(&kit, "m11").phase == Some(Phase::Draining))
        .await
    );
    catch_up(&kit, &["m11"], &["w1"], &["db-0"]);
    let mut o = stored(&kit, "m11");
    o.spec.stage = Stage::Complete;
    kit.api.insert(&o);
    kit.apply(o);
    assert!(
        eventually(Duration::from_secs(5), || status(&kit, "m11").phase
            == Some(Phase::Completed))
        .await
    );
    assert_eq!(
        condition(&kit, "m11", CONDITION_DRAINED).unwrap().1,
        "Cancelled"
    );
    let n = kit.api.object::<Node>("", "w1").unwrap();
    assert_eq!(n.spec.as_ref().unwrap().unschedulable, Some(false));
    let db = kit.api.object::<Pod>(NS, "db-0").unwrap();
    let c = db.condition(POD_CONDITION_TARGETED).unwrap();
    assert_eq!(
        (c.status.as_str(), c.reason.as_deref()),
        ("False", Some("MaintenanceEnded"))
    );
    let attempts = evictions(&kit, "db-0");
    tokio::time::sleep(Duration::from_secs(600)).await;
    assert_eq!(
        evictions(&kit, "db-0"),
        attempts,
        "no attempt after Complete"
    );
}

/// M12 and NM-1: a deleting object never re-cordons, even when the node looks uncordoned.
#[tokio::test(start_paused = true)]
async fn m12_delete_during_drain_never_recordons() {
    let kit = kit();
    let _running = start(&kit);
    kit.seed([node("w1", None)]);
    kit.seed([pod("db-0", "w1")]);
    kit.api
        .fail_when(|c| is_eviction_of(c, "db-0").then(|| pdb_429("db-pdb", 1)));
    kit.seed([nm("m12", "w1", Stage::Drain, DrainSpec::default())]);
    assert!(eventually(Duration::from_secs(5), || evictions(&kit, "db-0") >= 1).await);
    catch_up(&kit, &["m12"], &["w1"], &["db-0"]);
    mark_deleted(&kit, "m12");
    assert!(
        eventually(Duration::from_secs(5), || stored(&kit, "m12")
            .metadata
            .finalizers
            .unwrap_or_default()
            .is_empty())
        .await
    );
    catch_up(&kit, &["m12"], &["w1"], &["db-0"]);
    let writes = node_writes(&kit);
    tokio::time::sleep(Duration::from_secs(120)).await;
    assert_eq!(node_writes(&kit), writes);
    let n = kit.api.object::<Node>("", "w1").unwrap();
    assert_eq!(n.spec.as_ref().unwrap().unschedulable, Some(false));
    assert!(n.spec.as_ref().unwrap().taints.is_none());
}

/// M13: PriorityWaves: the highest wave waits until the lower ones are gone.
#[tokio::test(start_paused = true)]
async fn m13_priority_waves() {
    let kit = kit();
    let _running = start(&kit);
    kit.seed([node("w1", None)]);
    let prio = |name: &str, p: Option<i32>| {
        let mut x = pod(name, "w1");
        x.spec.as_mut().unwrap().priority = p;
        x
    };
    kit.seed([
        prio("low", None),
        prio("mid", Some(1_000_000_000)),
        prio("high", Some(2_000_000_000)),
    ]);
    kit.seed([nm(
        "m13",
        "w1",
        Stage::Drain,
        DrainSpec {
            ordering: DrainOrdering::PriorityWaves,
            ..DrainSpec::default()
        },
    )]);
    assert!(
        eventually(Duration::from_secs(5), || evictions(&kit, "low") == 1
            && evictions(&kit, "mid") == 1)
        .await
    );
    tokio::time::sleep(Duration::from_secs(30)).await;
    assert_eq!(
        evictions(&kit, "high"),
        0,
        "not before the lower waves are gone"
    );
    catch_up(&kit, &["m13"], &[], &["low"]);
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert_eq!(evictions(&kit, "high"), 0, "mid is still there");
    catch_up(&kit, &["m13"], &[], &["mid"]);
    assert!(eventually(Duration::from_secs(5), || evictions(&kit, "high") == 1).await);
}

/// M14, NM-22: an evicted pod of a failed node stays Terminating until skip-wait is set; then
/// it counts as gone that long after its deletionTimestamp.
#[tokio::test(start_paused = true)]
async fn m14_terminating_until_skip_wait() {
    let kit = kit();
    let _running = start(&kit);
    kit.seed([node("w1", None)]);
    kit.seed([pod("web-1", "w1")]);
    kit.seed([nm("m14", "w1", Stage::Drain, DrainSpec::default())]);
    assert!(eventually(Duration::from_secs(5), || evictions(&kit, "web-1") == 1).await);
    // The kubelet is gone: the pod keeps its deletionTimestamp and never leaves.
    let mut p = pod("web-1", "w1");
    p.metadata.deletion_timestamp = Some(Time(now(&kit)));
    p.metadata.resource_version = Some("5".into());
    kit.apply(p);
    catch_up(&kit, &["m14"], &[], &[]);
    tokio::time::sleep(Duration::from_secs(120)).await;
    catch_up(&kit, &["m14"], &[], &[]);
    assert!(
        eventually(Duration::from_secs(5), || status(&kit, "m14")
            .progress
            .is_some_and(|p| p.terminating == 1))
        .await
    );
    let (s, reason, msg) = condition(&kit, "m14", CONDITION_DRAINED).unwrap();
    assert_eq!((s.as_str(), reason.as_str()), ("False", "Draining"));
    assert!(msg.contains("out-of-service"), "{msg}");
    let mut o = stored(&kit, "m14");
    o.spec.drain.skip_wait_for_delete_timeout_seconds = Some(30);
    kit.api.insert(&o);
    kit.apply(o);
    assert!(
        eventually(Duration::from_secs(5), || status(&kit, "m14").phase
            == Some(Phase::Drained))
        .await
    );
}

/// NB-12: a priority-and-fairness 429 is throttling: retried after a second, never Blocked.
#[tokio::test(start_paused = true)]
async fn b12_throttling_is_not_blocked() {
    let kit = kit();
    let _running = start(&kit);
    kit.seed([node("w1", None)]);
    kit.seed([pod("web-1", "w1")]);
    let mut left = 3;
    kit.api.fail_when(move |c| {
        (is_eviction_of(c, "web-1") && left > 0).then(|| {
            left -= 1;
            api_error(
                429,
                "TooManyRequests",
                "Too many requests, please try again later.",
            )
        })
    });
    kit.seed([nm("b12", "w1", Stage::Drain, DrainSpec::default())]);
    assert!(eventually(Duration::from_secs(10), || evictions(&kit, "web-1") == 4).await);
    catch_up(&kit, &["b12"], &[], &[]);
    assert_eq!(
        condition(&kit, "b12", CONDITION_EVICTION_BLOCKED)
            .unwrap()
            .0,
        "False"
    );
    settle().await;
    assert_eq!(count(&kit, "Warning EvictionBlocked"), 0);
}

/// NM-13: two objects draining one node evict each pod once.
#[tokio::test(start_paused = true)]
async fn nm_13_overlapping_drains_evict_once() {
    let kit = kit();
    let _running = start(&kit);
    kit.seed([node("w1", None)]);
    kit.seed([pod("web-1", "w1"), pod("web-2", "w1")]);
    kit.seed([
        nm("a", "w1", Stage::Drain, DrainSpec::default()),
        nm("b", "w1", Stage::Drain, DrainSpec::default()),
    ]);
    assert!(
        eventually(Duration::from_secs(5), || evictions(&kit, "web-1") == 1
            && evictions(&kit, "web-2") == 1)
        .await
    );
    catch_up(&kit, &["a", "b"], &["w1"], &[]);
    tokio::time::sleep(Duration::from_secs(30)).await;
    assert_eq!((evictions(&kit, "web-1"), evictions(&kit, "web-2")), (1, 1));
    // NM-12: the condition names both objects.
    let body = kit.api.calls().into_iter().find_map(|c| match c {
        Call::Patch(t, _, b) if t.name == "web-1" && t.subresource.as_deref() == Some("status") => {
            Some(b)
        }
        _ => None,
    });
    assert!(
        body.unwrap()["status"]["conditions"][0]["message"]
            .as_str()
            .unwrap()
            .contains("NodeMaintenance a on node w1: test; NodeMaintenance b on node w1: test")
    );
}

/// Bad input never panics: int64 extremes, an empty reason, a selector that does not parse
/// (Warning naming the field, a condition), odd owner references; another object is unaffected.
#[tokio::test(start_paused = true)]
async fn extremes_never_panic_and_leave_others_alone() {
    let kit = kit();
    let _running = start(&kit);
    kit.seed([node("w1", None), node("w2", None)]);
    let mut odd = pod("odd", "w1");
    odd.metadata.owner_references = Some(vec![
        OwnerReference {
            controller: Some(true),
            ..owner("DaemonSet", "extensions/v1beta1", "x")
        },
        OwnerReference {
            controller: Some(true),
            ..owner("", "", "")
        },
    ]);
    kit.seed([odd, pod("web-2", "w2")]);
    let extreme = DrainSpec {
        grace_period_seconds: Some(i64::MAX),
        timeout_seconds: Some(i64::MAX),
        skip_wait_for_delete_timeout_seconds: Some(i64::MAX),
        ..DrainSpec::default()
    };
    let mut x = nm("x", "w1", Stage::Drain, extreme);
    x.spec.reason = Some(String::new());
    let bad_selector = DrainSpec {
        pod_selector: Some(LabelSelector {
            match_expressions: Some(vec![
                k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelectorRequirement {
                    key: "app".into(),
                    operator: "Near".into(),
                    values: None,
                },
            ]),
            ..Default::default()
        }),
        ..DrainSpec::default()
    };
    kit.seed([
        x,
        nm("bad", "w2", Stage::Drain, bad_selector),
        nm("good", "w2", Stage::Cordon, DrainSpec::default()),
    ]);
    assert!(eventually(Duration::from_secs(5), || evictions(&kit, "odd") == 1).await);
    let ev = eviction_body(&kit, "odd").unwrap();
    assert_eq!(ev["deleteOptions"]["gracePeriodSeconds"], i64::MAX);
    assert!(
        eventually(Duration::from_secs(5), || condition(
            &kit,
            "bad",
            CONDITION_DRAINED
        )
        .is_some_and(|c| c.1 == "InvalidPodSelector"))
        .await
    );
    assert!(
        condition(&kit, "bad", CONDITION_DRAINED)
            .unwrap()
            .2
            .contains("spec.drain.podSelector.matchExpressions[0].operator")
    );
    assert_eq!(evictions(&kit, "web-2"), 0);
    assert!(
        eventually(Duration::from_secs(5), || status(&kit, "good").phase
            == Some(Phase::Cordoned))
        .await
    );
    let st = status(&kit, "x");
    // start + int64 seconds saturates at the latest representable time (year 9999).
    assert_eq!(
        st.drain.unwrap().deadline.unwrap().0.as_second(),
        Timestamp::MAX.as_second()
    );
    settle().await;
    assert_eq!(count(&kit, "Warning InvalidPodSelector"), 1);
    let msg = kit.api.calls().into_iter().find_map(|c| match c {
        Call::Patch(t, _, b) if t.name == "odd" && t.subresource.is_some() => {
            b["status"]["conditions"][0]["message"]
                .as_str()
                .map(String::from)
        }
        _ => None,
    });
    assert_eq!(msg.as_deref(), Some("NodeMaintenance x on node w1"));
}

/// NM-23: node conditions only with the flag; cleared on release.
#[tokio::test(start_paused = true)]
async fn nm_23_node_conditions_with_the_flag() {
    let kit = kit();
    let _running = start_with(
        &kit,
        Options {
            nodemaintenance_node_lifecycle_conditions: true,
            ..Options::default()
        },
    );
    kit.seed([node("w1", None)]);
    kit.seed([nm("c", "w1", Stage::Drain, DrainSpec::default())]);
    assert!(
        eventually(Duration::from_secs(5), || status(&kit, "c").phase
            == Some(Phase::Drained))
        .await
    );
    let conds = |kit: &Kit| {
        kit.api
            .object::<Node>("", "w1")
            .unwrap()
            .status
            .and_then(|s| s.conditions)
            .unwrap_or_default()
    };
    assert!(
        eventually(Duration::from_secs(5), || conds(&kit).iter().any(|c| c
            .type_
            == "MaintenanceInProgress"
            && c.status == "True"
            && c.reason.as_deref() == Some("AdminRequested")))
        .await
    );
    catch_up(&kit, &["c"], &["w1"], &[]);
    mark_deleted(&kit, "c");
    assert!(
        eventually(Duration::from_secs(5), || conds(&kit)
            .iter()
            .all(|c| c.status == "False"))
        .await
    );
}

#[test]
fn taint_helper_is_exact() {
    let t = Taint {
        key: TAINT_MAINTENANCE.into(),
        effect: "NoSchedule".into(),
        ..Default::default()
    };
    assert_eq!(
        serde_json::to_value(&t).unwrap(),
        json!({"key": TAINT_MAINTENANCE, "effect": "NoSchedule"})
    );
}

/// NM-19, NM-20: while the release keeps failing the phase says Completing; then Completed.
#[tokio::test(start_paused = true)]
async fn completing_until_the_release_succeeds() {
    let kit = kit();
    let _running = start(&kit);
    kit.seed([node("w1", None)]);
    kit.seed([nm("c", "w1", Stage::Cordon, DrainSpec::default())]);
    assert!(
        eventually(Duration::from_secs(5), || status(&kit, "c").phase
            == Some(Phase::Cordoned))
        .await
    );
    catch_up(&kit, &["c"], &["w1"], &[]);
    kit.api.fail("patch", "nodes", 2, 500, "InternalError");
    let mut o = stored(&kit, "c");
    o.spec.stage = Stage::Complete;
    kit.api.insert(&o);
    kit.apply(o);
    assert!(
        eventually(Duration::from_secs(1), || status(&kit, "c").phase
            == Some(Phase::Completing))
        .await
    );
    assert!(
        eventually(Duration::from_secs(10), || status(&kit, "c").phase
            == Some(Phase::Completed))
        .await
    );
    let n = kit.api.object::<Node>("", "w1").unwrap();
    assert_eq!(n.spec.unwrap().unschedulable, Some(false));
}

/// A new leader starts cold: it rebuilds each target's state from `status.targetedPods`, so an
/// accepted eviction is not sent again and a blocked pod keeps its backoff.
#[tokio::test(start_paused = true)]
async fn a_new_leader_resumes_from_the_status() {
    let kit = kit();
    let _running = start(&kit);
    kit.seed([node("w1", Some(true))]);
    kit.seed([pod("db-0", "w1"), pod("web-1", "w1")]);
    let mut o = nm("r", "w1", Stage::Drain, DrainSpec::default());
    o.metadata.finalizers = Some(vec![FINALIZER.into()]);
    o.metadata.owner_references = Some(vec![OwnerReference {
        api_version: "v1".into(),
        kind: "Node".into(),
        name: "w1".into(),
        uid: "uid-w1".into(),
        controller: Some(false),
        block_owner_deletion: Some(false),
    }]);
    let t = |secs: i64| {
        Some(Time(
            now(&kit)
                .checked_add(k8s_openapi::jiff::SignedDuration::from_secs(secs))
                .unwrap(),
        ))
    };
    let entry = |name: &str, state: TargetState, method: Option<EvictionMethod>| TargetedPod {
        namespace: NS.into(),
        name: name.into(),
        uid: Some(format!("uid-{name}")),
        state,
        method,
        blocked_reason: (state == TargetState::Blocked).then(|| "PodDisruptionBudget".into()),
        pod_disruption_budget: None,
        message: None,
        attempts: 3,
        first_attempt_time: t(-60),
        last_attempt_time: t(-10),
        next_attempt_time: (state == TargetState::Blocked).then(|| t(30)).flatten(),
    };
    o.status = Some(NodeMaintenanceStatus {
        stage_statuses: vec![StageStatus {
            name: Stage::Drain,
            start_time: t(-60),
        }],
        drain: Some(DrainStatus {
            start_time: t(-60),
            ..Default::default()
        }),
        targeted_pods: vec![
            entry("db-0", TargetState::Blocked, None),
            entry(
                "web-1",
                TargetState::Terminating,
                Some(EvictionMethod::Eviction),
            ),
        ],
        ..Default::default()
    });
    kit.seed([o]);
    tokio::time::sleep(Duration::from_secs(10)).await;
    assert_eq!(evictions(&kit, "web-1"), 0, "accepted before the restart");
    assert_eq!(evictions(&kit, "db-0"), 0, "still backing off");
    // NM-16 after a restart: the restored record knows its node, so a budget that allows a
    // disruption wakes the drain at once (not at the restored nextAttemptTime, 20 s on).
    kit.apply(pdb("db-pdb", "db", 1, 2, 2, 1, 1));
    let t0 = tokio::time::Instant::now();
    assert!(eventually(Duration::from_secs(5), || evictions(&kit, "db-0") == 1).await);
    assert!(t0.elapsed() < Duration::from_secs(5));
    assert_eq!(evictions(&kit, "web-1"), 0);
    settle().await;
    assert_eq!(
        count(&kit, "Normal BeginMaintenance"),
        0,
        "not a new maintenance"
    );
}

/// NM-18: without delete permission the escalation is refused once: the pod shows
/// EvictionDenied and the drain goes on as with Wait (evictions on their backoff, no DELETE
/// loop).
#[tokio::test(start_paused = true)]
async fn nm_18_refused_deletion_falls_back_to_wait() {
    let kit = kit();
    let _running = start(&kit);
    seed_db_behind_a_closed_budget(&kit);
    kit.api.fail("delete", "pods", 100, 403, "Forbidden");
    let drain = DrainSpec {
        timeout_seconds: Some(30),
        timeout_policy: TimeoutPolicy::Delete,
        ..DrainSpec::default()
    };
    kit.seed([nm("d", "w1", Stage::Drain, drain)]);
    let deletes = |kit: &Kit| {
        kit.api
            .calls()
            .iter()
            .filter(|c| c.verb() == "delete" && c.target().plural == "pods")
            .count()
    };
    assert!(eventually(Duration::from_secs(40), || deletes(&kit) == 1).await);
    let evictions_then = evictions(&kit, "db-0");
    tokio::time::sleep(Duration::from_secs(120)).await;
    catch_up(&kit, &["d"], &[], &[]);
    assert_eq!(deletes(&kit), 1, "no DELETE loop");
    assert!(evictions(&kit, "db-0") > evictions_then, "evictions go on");
    let condition_patches = kit
        .api
        .calls()
        .iter()
        .filter(|c| matches!(c, Call::Patch(t, _, b) if t.name == "db-0" && b["status"]["conditions"][0]["type"] == "DisruptionTarget"))
        .count();
    assert_eq!(condition_patches, 1);
    assert!(
        status(&kit, "d")
            .last_error
            .is_some_and(|e| e.contains("deleting pod shop/db-0"))
    );
}

/// The status is written only when it changes (one patch, at most once a second). While a blocked
/// target waits out its backoff nothing changes, so nothing is written (the tracker keeps
/// sub-second times the wire does not, which once made every sync after an attempt look like a
/// change: a write a second).
#[tokio::test(start_paused = true)]
async fn an_unchanged_status_is_not_rewritten() {
    let kit = kit();
    let _running = start(&kit);
    seed_db_behind_a_closed_budget(&kit);
    // Off the whole second, as a real clock is: the attempt times then have a fraction.
    tokio::time::sleep(Duration::from_millis(250)).await;
    kit.seed([nm("m", "w1", Stage::Drain, DrainSpec::default())]);
    // Tried at once and again 5 s later; the next try is 10 s after that.
    assert!(eventually(Duration::from_secs(10), || evictions(&kit, "db-0") == 2).await);
    tokio::time::sleep(Duration::from_secs(2)).await;
    let writes = || {
        kit.api
            .calls()
            .iter()
            .filter(|c| matches!(c, Call::Patch(t, _, _) if t.plural == "nodemaintenances" && t.name == "m" && t.subresource.as_deref() == Some("status")))
            .count()
    };
    let before = writes();
    // Other changes wake the sync meanwhile (here the pod's annotations, as a kubelet's status
    // updates would): nothing the status shows changed.
    for i in 0..3 {
        tokio::time::sleep(Duration::from_secs(2)).await;
        let mut p = kit.api.object::<Pod>(NS, "db-0").unwrap();
        p.metadata
            .annotations
            .get_or_insert_with(Default::default)
            .insert("touched".into(), i.to_string());
        kit.apply(p);
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(evictions(&kit, "db-0"), 2, "tried again within the backoff");
    assert_eq!(writes(), before, "status rewritten with nothing changed");
}
