//! PX-1: node-maintenance's pure decisions at the API-valid extremes of every field they
//! read, as properties. Generators produce what the API server accepts (the CRD's ranges:
//! `timeoutSeconds` and `skipWaitForDeleteTimeoutSeconds` ≥ 1, `gracePeriodSeconds` ≥ 0, any
//! int32 priority, taints unique by key and effect, timestamps in RFC 3339's years 0001..9999),
//! at their limits; and, where a decision can be undone, that it undoes exactly.

use crate::classify::{self, Class, Consent, MIRROR_ANNOTATION};
use crate::evict;
use crate::plan;
use crate::status::{self, Entry};
use crate::types::{
    ANNOTATION_PRE_MAINTENANCE_UNSCHEDULABLE, DrainOrdering, DrainSpec, EvictionMethod, Skipped,
    TAINT_MAINTENANCE, TargetState, TargetedPod,
};
use k8s_openapi::api::core::v1::Taint;
use k8s_openapi::api::core::v1::{EmptyDirVolumeSource, Node, NodeCondition, NodeSpec, NodeStatus};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{
    LabelSelector, LabelSelectorRequirement, ObjectMeta, OwnerReference, Time,
};
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use proptest::prelude::*;
use serde_json::{Value, json};
use shared::cache::pod::{Pod, PodSpec, PodStatus, Volume};
use std::time::Duration;

/// 0001-01-01T00:00:00Z and the last second of year 9999 jiff holds: a `metav1.Time`'s range.
const YEAR_1: i64 = -62_135_596_800;
const YEAR_9999: i64 = 253_402_207_200;

fn instant() -> impl Strategy<Value = Timestamp> {
    prop_oneof![
        Just(YEAR_1),
        Just(YEAR_9999),
        Just(0i64),
        1_767_225_600i64..1_767_312_000,
        YEAR_1..=YEAR_9999,
    ]
    .prop_map(|s| Timestamp::from_second(s).expect("in range"))
}

/// An int64 the CRD accepts where its minimum is `min`.
fn seconds(min: i64) -> impl Strategy<Value = i64> {
    prop_oneof![
        Just(min),
        Just(i64::MAX),
        Just(i64::MAX - 1),
        min..min.saturating_add(100),
        min..=i64::MAX,
    ]
}

fn opt<T: std::fmt::Debug + Clone>(
    s: impl Strategy<Value = T>,
) -> impl Strategy<Value = Option<T>> {
    prop_oneof![Just(None), s.prop_map(Some)]
}

fn priority() -> impl Strategy<Value = Option<i32>> {
    opt(prop_oneof![
        Just(i32::MIN),
        Just(i32::MAX),
        Just(0),
        Just(1_000_000_000),
        Just(1_000_000_001),
        Just(2_000_000_000),
        Just(2_000_001_000),
        Just(2_000_001_001),
        any::<i32>(),
    ])
}

fn ordering() -> impl Strategy<Value = DrainOrdering> {
    prop_oneof![
        Just(DrainOrdering::Parallel),
        Just(DrainOrdering::PriorityWaves)
    ]
}

fn selector() -> impl Strategy<Value = Option<LabelSelector>> {
    let requirement = (
        prop_oneof![Just("app"), Just("tier"), Just("absent")],
        prop_oneof![
            Just("In"),
            Just("NotIn"),
            Just("Exists"),
            Just("DoesNotExist")
        ],
        prop::collection::vec(prop_oneof![Just("web"), Just("db"), Just("")], 1..3),
    )
        .prop_map(|(key, op, values)| LabelSelectorRequirement {
            key: key.into(),
            operator: op.into(),
            // The API requires values for In/NotIn and forbids them for the others.
            values: matches!(op, "In" | "NotIn")
                .then(|| values.into_iter().map(String::from).collect()),
        });
    opt(
        (opt(Just("web")), prop::collection::vec(requirement, 0..3)).prop_map(|(app, reqs)| {
            LabelSelector {
                match_labels: app.map(|v| [("app".to_string(), v.to_string())].into()),
                match_expressions: (!reqs.is_empty()).then_some(reqs),
            }
        }),
    )
}

fn drain() -> impl Strategy<Value = DrainSpec> {
    (
        selector(),
        any::<bool>(),
        any::<bool>(),
        opt(seconds(0)),
        opt(seconds(1)),
        ordering(),
        opt(seconds(1)),
    )
        .prop_map(
            |(pod_selector, force, delete_empty_dir_data, grace, skip, ordering, timeout)| {
                DrainSpec {
                    pod_selector,
                    force,
                    delete_empty_dir_data,
                    grace_period_seconds: grace,
                    skip_wait_for_delete_timeout_seconds: skip,
                    ordering,
                    timeout_seconds: timeout,
                    ..Default::default()
                }
            },
        )
}

#[derive(Clone, Copy, Debug)]
enum Owner {
    None,
    ReplicaSet,
    DaemonSet,
    /// A DaemonSet of another group: not one for kubectl (`isControllerRefDaemonSet`).
    ExtensionsDaemonSet,
}

fn pod() -> impl Strategy<Value = Pod> {
    (
        prop_oneof![
            Just(Owner::None),
            Just(Owner::ReplicaSet),
            Just(Owner::DaemonSet),
            Just(Owner::ExtensionsDaemonSet)
        ],
        opt(prop_oneof![Just("web"), Just("db")]),
        any::<bool>(),
        any::<bool>(),
        prop_oneof![
            Just("Pending"),
            Just("Running"),
            Just("Succeeded"),
            Just("Failed"),
            Just("Unknown")
        ],
        opt(instant()),
        priority(),
    )
        .prop_map(|(owner, app, mirror, scratch, phase, deleted, priority)| {
            let owner = match owner {
                Owner::None => None,
                Owner::ReplicaSet => Some(("apps/v1", "ReplicaSet")),
                Owner::DaemonSet => Some(("apps/v1", "DaemonSet")),
                Owner::ExtensionsDaemonSet => Some(("extensions/v1beta1", "DaemonSet")),
            };
            Pod {
                metadata: ObjectMeta {
                    name: Some("p".into()),
                    namespace: Some("ns".into()),
                    labels: app.map(|a| [("app".to_string(), a.to_string())].into()),
                    annotations: mirror
                        .then(|| [(MIRROR_ANNOTATION.to_string(), "hash".to_string())].into()),
                    owner_references: owner.map(|(api_version, kind)| {
                        vec![OwnerReference {
                            api_version: api_version.into(),
                            kind: kind.into(),
                            name: "owner".into(),
                            uid: "uid-owner".into(),
                            controller: Some(true),
                            ..Default::default()
                        }]
                    }),
                    deletion_timestamp: deleted.map(Time),
                    ..Default::default()
                },
                spec: Some(PodSpec {
                    priority,
                    volumes: scratch.then(|| {
                        vec![Volume {
                            name: "scratch".into(),
                            empty_dir: Some(EmptyDirVolumeSource::default()),
                            ..Default::default()
                        }]
                    }),
                    ..Default::default()
                }),
                status: Some(PodStatus {
                    phase: Some(phase.into()),
                    ..Default::default()
                }),
            }
        })
}

/// Taints unique by (key, effect), as the API requires, ours among them or not.
fn taints() -> impl Strategy<Value = Vec<Taint>> {
    let keys = [
        TAINT_MAINTENANCE,
        "node.kubernetes.io/unreachable",
        "dedicated",
    ];
    let effects = ["NoSchedule", "PreferNoSchedule", "NoExecute"];
    prop::collection::vec(any::<bool>(), keys.len() * effects.len()).prop_flat_map(move |on| {
        let list: Vec<Taint> = on
            .iter()
            .enumerate()
            .filter(|(_, on)| **on)
            .map(|(i, _)| Taint {
                key: keys[i / effects.len()].into(),
                effect: effects[i % effects.len()].into(),
                ..Default::default()
            })
            .collect();
        Just(list).prop_shuffle()
    })
}

fn node() -> impl Strategy<Value = Node> {
    (
        opt(any::<bool>()),
        taints(),
        opt(prop_oneof![
            Just("true"),
            Just("false"),
            Just(""),
            Just("yes")
        ]),
    )
        .prop_map(|(unschedulable, taints, recorded)| {
            plan::tests::node(unschedulable, taints, recorded)
        })
}

/// RFC 7386: applies a JSON merge patch (what the API server does with ours).
fn merge(target: &mut Value, patch: &Value) {
    let Value::Object(p) = patch else {
        *target = patch.clone();
        return;
    };
    if !target.is_object() {
        *target = json!({});
    }
    let t = target.as_object_mut().expect("an object");
    for (k, v) in p {
        if v.is_null() {
            t.remove(k);
        } else {
            merge(t.entry(k.clone()).or_insert(Value::Null), v);
        }
    }
}

fn patched(node: &Node, patch: &Value) -> Node {
    let mut v = serde_json::to_value(node).expect("a node");
    merge(&mut v, patch);
    serde_json::from_value(v).expect("a node after the patch")
}

fn node_taints(node: &Node) -> Vec<(String, String)> {
    node.spec
        .as_ref()
        .and_then(|s| s.taints.clone())
        .unwrap_or_default()
        .into_iter()
        .map(|t| (t.key, t.effect))
        .collect()
}

fn recorded(node: &Node) -> Option<String> {
    node.metadata
        .annotations
        .as_ref()?
        .get(ANNOTATION_PRE_MAINTENANCE_UNSCHEDULABLE)
        .cloned()
}

fn is_unschedulable(node: &Node) -> bool {
    node.spec
        .as_ref()
        .and_then(|s| s.unschedulable)
        .unwrap_or(false)
}

fn targeted(state: TargetState, blocked: Option<&'static str>, evicted: bool) -> TargetedPod {
    TargetedPod {
        namespace: "ns".into(),
        name: String::new(),
        uid: None,
        state,
        method: evicted.then_some(EvictionMethod::Eviction),
        blocked_reason: blocked.map(String::from),
        pod_disruption_budget: None,
        message: None,
        attempts: 0,
        first_attempt_time: None,
        last_attempt_time: None,
        next_attempt_time: None,
    }
}

fn entries() -> impl Strategy<Value = Vec<Entry>> {
    let entry = (
        prop_oneof![
            Just(TargetState::Pending),
            Just(TargetState::Blocked),
            Just(TargetState::Terminating),
            Just(TargetState::Gone)
        ],
        opt(prop_oneof![
            Just(evict::REASON_ERROR),
            Just("PodDisruptionBudget"),
            Just("EvictionDenied"),
            Just("not a reason")
        ]),
        any::<bool>(),
        opt(instant()),
    );
    prop::collection::vec(entry, 0..1100).prop_map(|list| {
        list.into_iter()
            .enumerate()
            .map(|(i, (state, reason, evicted, created))| {
                let mut pod = targeted(state, reason, evicted);
                pod.name = format!("p{i}");
                Entry { created, pod }
            })
            .collect()
    })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    /// NM-11/NM-18: any start and any int64 timeout give a deadline, saturating at the end of
    /// time, never before the start.
    #[test]
    fn a_deadline_never_overflows(start in instant(), timeout in opt(prop_oneof![seconds(1), Just(i64::MIN), Just(-1i64)])) {
        let d = plan::deadline(start, timeout);
        prop_assert_eq!(d.is_some(), timeout.is_some());
        if let (Some(d), Some(t)) = (d, timeout) {
            prop_assert!(d >= start);
            match start.checked_add(SignedDuration::from_secs(t.max(0))) {
                Ok(exact) => prop_assert_eq!(d, exact),
                Err(_) => prop_assert_eq!(d, Timestamp::MAX),
            }
        }
    }

    /// NM-13: a pod's wave is one of the four, rises with its priority, and is 0 in Parallel.
    #[test]
    fn waves_are_bounded_and_ordered_by_priority(a in priority(), b in priority(), ordering in ordering()) {
        let (wa, wb) = (plan::wave(ordering, a), plan::wave(ordering, b));
        prop_assert!(wa < plan::WAVES.len() && wb < plan::WAVES.len());
        if ordering == DrainOrdering::Parallel {
            prop_assert_eq!((wa, wb), (0, 0));
        }
        if a.unwrap_or(0) <= b.unwrap_or(0) {
            prop_assert!(wa <= wb);
        }
    }

    /// NM-9 at any deletion time, any now and any int64 timeout: never panics; only a pod
    /// being deleted is past it, and once past it stays past.
    #[test]
    fn terminating_past_is_saturating_and_monotone(p in pod(), skip in opt(seconds(1)), now in instant(), later in 0i64..=i64::MAX) {
        let past = classify::terminating_past(&p, skip, now);
        if skip.is_none() || p.metadata.deletion_timestamp.is_none() {
            prop_assert!(!past);
        }
        let later = now.checked_add(SignedDuration::from_secs(later)).unwrap_or(Timestamp::MAX);
        if past {
            prop_assert!(classify::terminating_past(&p, skip, later));
        }
    }

    /// NM-9/NM-10 for any pod and any drain: kubectl's filters in order, and consent asked only
    /// of a live target, never when `force` and `deleteEmptyDirData` both give it.
    #[test]
    fn classify_follows_kubectls_filters(p in pod(), d in drain(), ds_exists in any::<bool>(), now in instant()) {
        prop_assert!(classify::validate_selector(d.pod_selector.as_ref()).is_ok());
        let class = classify::classify(&p, &d, |_, _| ds_exists, now);
        let terminal = classify::is_terminal(&p);
        let mirror = p.metadata.annotations.as_ref().is_some_and(|a| a.contains_key(MIRROR_ANNOTATION));
        let daemon = p.metadata.owner_references.as_ref().is_some_and(|o| o[0].kind == "DaemonSet" && o[0].api_version == "apps/v1");
        let gone = classify::terminating_past(&p, d.skip_wait_for_delete_timeout_seconds, now);
        match &class {
            Class::Gone => prop_assert!(gone),
            Class::SkippedDaemonSet => prop_assert!(!gone && daemon && ds_exists && !terminal),
            Class::SkippedMirror => prop_assert!(!gone && mirror),
            Class::SkippedNotSelected => prop_assert!(!gone && !mirror && d.pod_selector.is_some()),
            Class::Target { consent } => {
                prop_assert!(!gone && !mirror);
                if terminal || (d.force && d.delete_empty_dir_data) {
                    prop_assert_eq!(consent, &None);
                }
                if let Some(Consent::VanishedDaemonSet(_)) = consent {
                    prop_assert!(daemon && !ds_exists && !d.force);
                }
            }
        }
        if gone {
            prop_assert_eq!(class, Class::Gone);
        }
    }

    /// NM-6 then NM-20 on any node: the cordon is one patch and then in place, and the
    /// release puts back exactly what was there: the other taints in their order, and
    /// `spec.unschedulable` as recorded (left as it is when the record is unreadable).
    #[test]
    fn release_undoes_cordon(n in node()) {
        let before = recorded(&n);
        let cordon = plan::cordon_patch(&n);
        let cordoned = match &cordon {
            Some(p) => patched(&n, p),
            None => n.clone(),
        };
        prop_assert!(plan::is_cordoned(&cordoned));
        prop_assert_eq!(plan::cordon_patch(&cordoned), None);
        let ours = |t: &(String, String)| t.0 == TAINT_MAINTENANCE && t.1 == plan::EFFECT;
        prop_assert_eq!(node_taints(&cordoned).iter().filter(|t| ours(t)).count(), 1);
        // The first maintenance records the prior value; a later one keeps that record.
        let record = recorded(&cordoned);
        match &before {
            Some(r) => prop_assert_eq!(record.as_ref(), Some(r)),
            None => prop_assert_eq!(record.clone(), Some(is_unschedulable(&n).to_string())),
        }
        let (release, schedulable) = plan::release_patch(&cordoned).expect("ours to release");
        let released = patched(&cordoned, &release);
        let others: Vec<_> = node_taints(&n).into_iter().filter(|t| !ours(t)).collect();
        prop_assert_eq!(node_taints(&released), others);
        prop_assert_eq!(recorded(&released), None);
        let restored = match record.as_deref() {
            Some("true") => true,
            Some("false") => false,
            // Unreadable: spec.unschedulable is left as the cordon set it.
            _ => true,
        };
        prop_assert_eq!(is_unschedulable(&released), restored);
        prop_assert_eq!(schedulable, !restored);
        prop_assert_eq!(plan::release_patch(&released), None);
    }

    /// NM-23: for any stored conditions, applying the patch makes the conditions what is
    /// wanted, keeps a transition time whose status did not change, and then nothing is left
    /// to write.
    #[test]
    fn lifecycle_conditions_converge_in_one_patch(
        stored in prop::collection::vec((0usize..3, any::<bool>(), prop_oneof![Just("AdminRequested"), Just("Other")], instant()), 0..4),
        active in any::<bool>(), draining in any::<bool>(), drained in any::<bool>(),
        now in instant(),
    ) {
        let types = ["MaintenanceInProgress", "DrainInProgress", "Drained"];
        let mut conditions: Vec<NodeCondition> = Vec::new();
        for (t, s, reason, at) in stored {
            if conditions.iter().any(|c| c.type_ == types[t]) {
                continue;
            }
            conditions.push(NodeCondition {
                type_: types[t].into(),
                status: if s { "True" } else { "False" }.into(),
                reason: Some(reason.into()),
                last_transition_time: Some(Time(at)),
                ..Default::default()
            });
        }
        let node = Node {
            metadata: ObjectMeta::default(),
            spec: Some(NodeSpec::default()),
            status: Some(NodeStatus { conditions: Some(conditions.clone()), ..Default::default() }),
        };
        let wanted = plan::lifecycle_conditions(active, draining, drained);
        let mut after = conditions.clone();
        if let Some(p) = plan::lifecycle_patch(&node, &wanted, now) {
            // A strategic merge of `status.conditions`, keyed by type.
            for c in p["status"]["conditions"].as_array().expect("conditions") {
                let c: NodeCondition = serde_json::from_value(c.clone()).expect("a condition");
                match after.iter_mut().find(|o| o.type_ == c.type_) {
                    Some(o) => *o = c,
                    None => after.push(c),
                }
            }
        }
        let any_true = wanted.iter().any(|(_, s, _)| *s);
        for (type_, want, reason) in wanted {
            let status = if want { "True" } else { "False" };
            match after.iter().find(|c| c.type_ == type_) {
                Some(c) => {
                    prop_assert_eq!((c.status.as_str(), c.reason.as_deref()), (status, Some(reason)));
                    if let Some(old) = conditions.iter().find(|o| o.type_ == type_ && o.status == status) {
                        prop_assert_eq!(&c.last_transition_time, &old.last_transition_time);
                    }
                }
                None => prop_assert!(!any_true, "{} missing", type_),
            }
        }
        let node = Node { status: Some(NodeStatus { conditions: Some(after), ..Default::default() }), ..node };
        prop_assert_eq!(plan::lifecycle_patch(&node, &wanted, now), None);
    }

    /// `progress` and `targetedPods` for any targets, up to past the 512 cap: counts add up,
    /// percent is 0..=100, `targetedPods` is capped with `truncated` saying so, blocked first.
    #[test]
    fn progress_and_targeted_pods_stay_in_range(list in entries()) {
        let (pods, truncated) = status::targeted_pods(list.clone());
        prop_assert_eq!(truncated, list.len() > status::MAX_TARGETED_PODS);
        prop_assert_eq!(pods.len(), list.len().min(status::MAX_TARGETED_PODS));
        let blocked = list.iter().filter(|e| e.pod.state == TargetState::Blocked).count();
        prop_assert!(pods.iter().take(blocked.min(pods.len())).all(|p| p.state == TargetState::Blocked));
        let p = status::progress(&list, Skipped::default(), truncated);
        prop_assert!((0..=100).contains(&p.percent));
        prop_assert_eq!(p.targeted, list.len() as i64);
        prop_assert!(p.evicted + p.terminating + p.pending <= p.targeted);
        prop_assert!(p.blocked <= p.pending);
        prop_assert_eq!(status::drained(&list), list.iter().all(|e| e.pod.state == TargetState::Gone));
        match status::eviction_blocked(&list) {
            None => prop_assert_eq!(blocked, 0),
            Some((_, message)) => {
                prop_assert!(blocked > 0);
                prop_assert_eq!(message.contains("more"), blocked > status::NAMED_IN_MESSAGE);
            }
        }
    }

    /// Any message, however long and whatever its characters, becomes a condition message the
    /// API accepts: at most 32 KiB, cut on a character boundary.
    #[test]
    fn condition_messages_fit_the_api(message in prop_oneof![".{0,40}", "[é€𝄞a]{14000,20000}"], now in instant()) {
        let mut conditions = Vec::new();
        status::set_condition(&mut conditions, "Drained", true, "DrainCompleted", message.clone(), now, Some(i64::MAX));
        let c = &conditions[0];
        prop_assert!(c.message.len() <= 32 * 1024);
        prop_assert!(message.starts_with(&c.message));
        if message.len() <= 32 * 1024 {
            prop_assert_eq!(&c.message, &message);
        }
    }

    /// NM-14: any number of failures gives a backoff from 5 s to 5 minutes, never shrinking.
    #[test]
    fn eviction_backoff_is_bounded_and_monotone(n in any::<u32>()) {
        let (a, b) = (evict::backoff(n), evict::backoff(n.saturating_add(1)));
        prop_assert!(a >= Duration::from_secs(5) && a <= Duration::from_secs(300));
        prop_assert!(a <= b);
    }
}
