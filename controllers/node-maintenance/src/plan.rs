//! Pure decisions: the node's cordon and its release (NM-6, NM-7, NM-20), the drain's waves
//! (NM-13), its deadline (NM-11, NM-18), the pod condition's message (NM-12), the KEP-5683 node
//! conditions (NM-23), and which objects count as active on a node.

use crate::types::{
    ANNOTATION_PRE_MAINTENANCE_UNSCHEDULABLE, DrainOrdering, NodeMaintenance, Stage,
    TAINT_MAINTENANCE,
};
use k8s_openapi::api::core::v1::{Node, Taint};
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use serde_json::{Value, json};

pub const EFFECT: &str = "NoSchedule";

/// *Active* = stage Cordon or Drain, not deleting (the sense of "active" in NM-20).
pub fn is_active(nm: &NodeMaintenance) -> bool {
    nm.metadata.deletion_timestamp.is_none()
        && matches!(nm.spec.stage, Stage::Cordon | Stage::Drain)
}

/// Whether `nm` drains: stage Drain, not deleting.
pub fn is_draining(nm: &NodeMaintenance) -> bool {
    nm.metadata.deletion_timestamp.is_none() && nm.spec.stage == Stage::Drain
}

/// Oldest first: creationTimestamp, then name (NM-12).
pub fn oldest_first(a: &NodeMaintenance, b: &NodeMaintenance) -> std::cmp::Ordering {
    a.metadata
        .creation_timestamp
        .as_ref()
        .map(|t| t.0)
        .cmp(&b.metadata.creation_timestamp.as_ref().map(|t| t.0))
        .then_with(|| a.metadata.name.cmp(&b.metadata.name))
}

fn taints(node: &Node) -> &[Taint] {
    node.spec
        .as_ref()
        .and_then(|s| s.taints.as_deref())
        .unwrap_or_default()
}

fn has_taint(node: &Node) -> bool {
    taints(node)
        .iter()
        .any(|t| t.key == TAINT_MAINTENANCE && t.effect == EFFECT)
}

fn unschedulable(node: &Node) -> bool {
    node.spec
        .as_ref()
        .and_then(|s| s.unschedulable)
        .unwrap_or(false)
}

fn annotation(node: &Node) -> Option<&str> {
    node.metadata
        .annotations
        .as_ref()?
        .get(ANNOTATION_PRE_MAINTENANCE_UNSCHEDULABLE)
        .map(String::as_str)
}

/// NM-6: unschedulable and carrying the maintenance taint.
pub fn is_cordoned(node: &Node) -> bool {
    unschedulable(node) && has_taint(node)
}

/// NM-6: one merge patch, guarded by the node's resourceVersion (the taint list is replaced
/// whole), that sets `spec.unschedulable`, adds the taint, and records the prior
/// `spec.unschedulable` only if no maintenance recorded it first. `None` when in place.
pub fn cordon_patch(node: &Node) -> Option<Value> {
    if is_cordoned(node) && annotation(node).is_some() {
        return None;
    }
    let mut metadata = json!({"resourceVersion": node.metadata.resource_version});
    if annotation(node).is_none() {
        metadata["annotations"] = json!({
            ANNOTATION_PRE_MAINTENANCE_UNSCHEDULABLE: unschedulable(node).to_string()
        });
    }
    let mut list: Vec<Value> = taints(node)
        .iter()
        .map(|t| serde_json::to_value(t).unwrap_or(Value::Null))
        .collect();
    if !has_taint(node) {
        list.push(json!({"key": TAINT_MAINTENANCE, "effect": EFFECT}));
    }
    Some(json!({"metadata": metadata, "spec": {"unschedulable": true, "taints": list}}))
}

/// NM-20: the guarded patch that removes the taint, restores `spec.unschedulable` from the
/// annotation and drops it; without the annotation `spec.unschedulable` is left alone. Returns
/// the patch and whether the node becomes schedulable; `None` when nothing is ours.
pub fn release_patch(node: &Node) -> Option<(Value, bool)> {
    let recorded = annotation(node);
    if recorded.is_none() && !has_taint(node) {
        return None;
    }
    let kept: Vec<Value> = taints(node)
        .iter()
        .filter(|t| !(t.key == TAINT_MAINTENANCE && t.effect == EFFECT))
        .map(|t| serde_json::to_value(t).unwrap_or(Value::Null))
        .collect();
    let mut spec =
        json!({"taints": if kept.is_empty() { Value::Null } else { Value::Array(kept) }});
    // An unreadable annotation leaves spec.unschedulable as it is, like a missing one.
    let restore = match recorded {
        Some("true") => Some(true),
        Some("false") => Some(false),
        _ => None,
    };
    let mut schedulable = false;
    if let Some(before) = restore {
        spec["unschedulable"] = json!(before);
        schedulable = !before && unschedulable(node);
    }
    let mut metadata = json!({"resourceVersion": node.metadata.resource_version});
    if recorded.is_some() {
        metadata["annotations"] = json!({ANNOTATION_PRE_MAINTENANCE_UNSCHEDULABLE: null});
    }
    Some((json!({"metadata": metadata, "spec": spec}), schedulable))
}

/// KEP-4212's default plan: priority ≤ 1000000000, ≤ 2000000000, ≤ 2000001000, the rest.
pub const WAVES: [i32; 4] = [1_000_000_000, 2_000_000_000, 2_000_001_000, i32::MAX];

/// NM-13: a pod's wave (nil priority = 0); with `Parallel` every pod is in wave 0.
pub fn wave(ordering: DrainOrdering, priority: Option<i32>) -> usize {
    match ordering {
        DrainOrdering::Parallel => 0,
        DrainOrdering::PriorityWaves => {
            let p = priority.unwrap_or(0);
            WAVES
                .iter()
                .position(|b| p <= *b)
                .unwrap_or(WAVES.len() - 1)
        }
    }
}

/// The current wave: the lowest wave holding a target that is not gone.
pub fn current_wave(waves_not_gone: impl IntoIterator<Item = usize>) -> Option<usize> {
    waves_not_gone.into_iter().min()
}

/// NM-11/NM-18: start + timeout, saturating (an int64 timeout never overflows a timestamp).
pub fn deadline(start: Timestamp, timeout_seconds: Option<i64>) -> Option<Timestamp> {
    let secs = timeout_seconds?.max(0);
    Some(
        start
            .checked_add(SignedDuration::from_secs(secs))
            .unwrap_or(Timestamp::MAX),
    )
}

/// NM-12: `NodeMaintenance <name> on node <node>: <reason>` per object, oldest first.
pub fn targeted_message(objects: &[&NodeMaintenance]) -> String {
    objects
        .iter()
        .map(|nm| {
            let name = nm.metadata.name.as_deref().unwrap_or_default();
            match nm.spec.reason.as_deref().filter(|r| !r.is_empty()) {
                Some(reason) => {
                    format!(
                        "NodeMaintenance {name} on node {}: {reason}",
                        nm.spec.node_name
                    )
                }
                None => format!("NodeMaintenance {name} on node {}", nm.spec.node_name),
            }
        })
        .collect::<Vec<_>>()
        .join("; ")
}

/// NM-23: the KEP-5683 node conditions (type, status, reason) for the node's state.
pub fn lifecycle_conditions(
    active: bool,
    draining: bool,
    drained: bool,
) -> [(&'static str, bool, &'static str); 3] {
    [
        (
            "MaintenanceInProgress",
            active,
            if active {
                "AdminRequested"
            } else {
                "MaintenanceEnded"
            },
        ),
        (
            "DrainInProgress",
            active && draining && !drained,
            if active && draining && !drained {
                "DrainStarted"
            } else {
                "NotDraining"
            },
        ),
        (
            "Drained",
            active && drained,
            if active && drained {
                "DrainCompleted"
            } else {
                "NotDrained"
            },
        ),
    ]
}

/// NM-23: a strategic-merge patch of `nodes/status` when a condition differs; none when in
/// place, or when releasing a node that never had them.
pub fn lifecycle_patch(
    node: &Node,
    wanted: &[(&'static str, bool, &'static str)],
    now: Timestamp,
) -> Option<Value> {
    let existing = node
        .status
        .as_ref()
        .and_then(|s| s.conditions.as_deref())
        .unwrap_or_default();
    let any_true = wanted.iter().any(|(_, s, _)| *s);
    let mut out = Vec::new();
    for (type_, status, reason) in wanted {
        let status = if *status { "True" } else { "False" };
        match existing.iter().find(|c| c.type_ == *type_) {
            Some(c) if c.status == status && c.reason.as_deref() == Some(*reason) => {}
            None if !any_true => {}
            other => {
                let transition = match other {
                    Some(c) if c.status == status => c.last_transition_time.clone(),
                    _ => Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(now)),
                };
                out.push(json!({
                    "type": type_, "status": status, "reason": reason,
                    "lastHeartbeatTime": k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(now),
                    "lastTransitionTime": transition,
                }));
            }
        }
    }
    (!out.is_empty()).then(|| json!({"status": {"conditions": out}}))
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::NodeSpec;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

    /// A node `w1` at resourceVersion 7 (the property tests build theirs with it too).
    pub(crate) fn node(unschedulable: Option<bool>, taints: Vec<Taint>, ann: Option<&str>) -> Node {
        Node {
            metadata: ObjectMeta {
                name: Some("w1".into()),
                resource_version: Some("7".into()),
                annotations: ann.map(|a| {
                    [(
                        ANNOTATION_PRE_MAINTENANCE_UNSCHEDULABLE.to_string(),
                        a.to_string(),
                    )]
                    .into()
                }),
                ..Default::default()
            },
            spec: Some(NodeSpec {
                unschedulable,
                taints: (!taints.is_empty()).then_some(taints),
                ..Default::default()
            }),
            status: None,
        }
    }

    fn ours() -> Taint {
        Taint {
            key: TAINT_MAINTENANCE.into(),
            effect: EFFECT.into(),
            ..Default::default()
        }
    }

    fn other() -> Taint {
        Taint {
            key: "node.kubernetes.io/unschedulable".into(),
            effect: EFFECT.into(),
            ..Default::default()
        }
    }

    #[test]
    fn nm_6_cordon_is_one_guarded_patch_recording_the_prior_state_once() {
        let p = cordon_patch(&node(None, vec![other()], None)).unwrap();
        assert_eq!(p["metadata"]["resourceVersion"], "7");
        assert_eq!(
            p["metadata"]["annotations"][ANNOTATION_PRE_MAINTENANCE_UNSCHEDULABLE],
            "false"
        );
        assert_eq!(p["spec"]["unschedulable"], true);
        assert_eq!(p["spec"]["taints"].as_array().unwrap().len(), 2);
        // Pre-cordoned by an admin: "true" is recorded (M6).
        let p = cordon_patch(&node(Some(true), vec![], None)).unwrap();
        assert_eq!(
            p["metadata"]["annotations"][ANNOTATION_PRE_MAINTENANCE_UNSCHEDULABLE],
            "true"
        );
        // The annotation of a first maintenance is never overwritten (NM-7's restore).
        let p = cordon_patch(&node(Some(false), vec![], Some("true"))).unwrap();
        assert!(p["metadata"].get("annotations").is_none());
        assert_eq!(p["spec"]["taints"][0]["key"], TAINT_MAINTENANCE);
        assert_eq!(
            cordon_patch(&node(Some(true), vec![ours()], Some("false"))),
            None,
            "no-op in place"
        );
    }

    #[test]
    fn nm_20_release_restores_the_recorded_state() {
        let (p, schedulable) =
            release_patch(&node(Some(true), vec![ours(), other()], Some("false"))).unwrap();
        assert_eq!(p["spec"]["unschedulable"], false);
        assert_eq!(p["spec"]["taints"].as_array().unwrap().len(), 1);
        assert_eq!(
            p["metadata"]["annotations"][ANNOTATION_PRE_MAINTENANCE_UNSCHEDULABLE],
            Value::Null
        );
        assert!(schedulable);
        let (p, schedulable) =
            release_patch(&node(Some(true), vec![ours()], Some("true"))).unwrap();
        assert_eq!(
            p["spec"]["unschedulable"], true,
            "admin's cordon restored (M6)"
        );
        assert_eq!(p["spec"]["taints"], Value::Null);
        assert!(!schedulable);
        // Never cordoned (Idle -> Complete): nothing of ours, spec.unschedulable left alone (M7).
        assert_eq!(release_patch(&node(Some(true), vec![], None)), None);
        // A taint without annotation: only the taint goes.
        let (p, _) = release_patch(&node(Some(true), vec![ours()], None)).unwrap();
        assert!(p["spec"].get("unschedulable").is_none());
        let (p, _) = release_patch(&node(Some(true), vec![ours()], Some("garbage"))).unwrap();
        assert!(p["spec"].get("unschedulable").is_none());
    }

    #[test]
    fn nm_13_priority_waves() {
        let w = |p| wave(DrainOrdering::PriorityWaves, p);
        assert_eq!(w(None), 0);
        assert_eq!(w(Some(i32::MIN)), 0);
        assert_eq!(w(Some(1_000_000_000)), 0);
        assert_eq!(w(Some(1_000_000_001)), 1);
        assert_eq!(w(Some(2_000_000_000)), 1);
        assert_eq!(w(Some(2_000_001_000)), 2);
        assert_eq!(w(Some(i32::MAX)), 3);
        assert_eq!(wave(DrainOrdering::Parallel, Some(i32::MAX)), 0);
        assert_eq!(current_wave([3, 1, 2]), Some(1));
        assert_eq!(current_wave([]), None);
    }

    #[test]
    fn nm_18_deadline_saturates() {
        let start = Timestamp::from_second(1000).unwrap();
        assert_eq!(deadline(start, None), None);
        assert_eq!(
            deadline(start, Some(30)),
            Some(Timestamp::from_second(1030).unwrap())
        );
        assert_eq!(deadline(start, Some(i64::MAX)), Some(Timestamp::MAX));
        assert_eq!(deadline(Timestamp::MAX, Some(1)), Some(Timestamp::MAX));
        assert_eq!(deadline(start, Some(i64::MIN)), Some(start));
    }

    #[test]
    fn nm_12_message_names_every_object_oldest_first() {
        let nm = |name: &str, reason: Option<&str>| {
            let mut o = NodeMaintenance::new(
                name,
                crate::types::NodeMaintenanceSpec {
                    node_name: "w1".into(),
                    stage: Stage::Drain,
                    reason: reason.map(Into::into),
                    drain: Default::default(),
                },
            );
            o.metadata.creation_timestamp = None;
            o
        };
        let (a, b) = (nm("a", Some("kernel")), nm("b", None));
        assert_eq!(
            targeted_message(&[&a]),
            "NodeMaintenance a on node w1: kernel"
        );
        assert_eq!(
            targeted_message(&[&a, &b]),
            "NodeMaintenance a on node w1: kernel; NodeMaintenance b on node w1"
        );
    }

    #[test]
    fn nm_23_conditions_only_when_asked_and_cleared_on_release() {
        let n = node(None, vec![], None);
        let now = Timestamp::from_second(1000).unwrap();
        assert_eq!(
            lifecycle_patch(&n, &lifecycle_conditions(false, false, false), now),
            None
        );
        let p = lifecycle_patch(&n, &lifecycle_conditions(true, true, false), now).unwrap();
        let conds = p["status"]["conditions"].as_array().unwrap();
        assert_eq!(conds[0]["reason"], "AdminRequested");
        assert_eq!(conds[1]["status"], "True");
        assert_eq!(conds[2]["status"], "False");
    }
}
