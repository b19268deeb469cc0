//! The exit decisions, pure: what `start --wait` concludes from the object as it is now
//! ([`verdict`]), and whether `end`'s node is released yet ([`release`]).

use super::{EXIT_BLOCKED, EXIT_CANCELLED, EXIT_DEADLINE};
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use node_maintenance::types::{
    CONDITION_CORDONED, CONDITION_DEADLINE_EXCEEDED, CONDITION_DRAINED, CONDITION_EVICTION_BLOCKED,
    NodeMaintenance, Phase, Stage, TAINT_MAINTENANCE, TimeoutPolicy,
};

pub(super) fn condition<'a>(nm: &'a NodeMaintenance, type_: &str) -> Option<&'a Condition> {
    nm.status
        .as_ref()
        .and_then(|s| s.conditions.iter().find(|c| c.type_ == type_))
}

fn is_true(c: Option<&Condition>) -> bool {
    c.is_some_and(|c| c.status == "True")
}

/// Whether the status describes the current spec (a status written for an older generation,
/// e.g. before an edit, decides nothing). Without any observed generation it is taken as is.
fn observed(nm: &NodeMaintenance) -> bool {
    let Some(generation) = nm.metadata.generation else {
        return true;
    };
    match nm.status.as_ref().and_then(|s| s.observed_generation) {
        Some(g) => g >= generation,
        None => nm.status.is_some(),
    }
}

/// What `start --wait` does after seeing the object.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Verdict {
    Waiting,
    Drained,
    Fail { code: u8, message: String },
}

fn fail(code: u8, message: String) -> Verdict {
    Verdict::Fail { code, message }
}

/// The exit decision of `start --wait` from the object as it is now.
pub fn verdict(nm: &NodeMaintenance) -> Verdict {
    let node = &nm.spec.node_name;
    if nm.metadata.deletion_timestamp.is_some() {
        return fail(
            EXIT_CANCELLED,
            format!("the maintenance of {node} is being deleted: the drain stopped"),
        );
    }
    if !observed(nm) {
        return Verdict::Waiting;
    }
    let drained = condition(nm, CONDITION_DRAINED);
    if is_true(drained) {
        return Verdict::Drained;
    }
    let text = |c: Option<&Condition>| {
        c.map(|c| format!("{}: {}", c.reason, c.message))
            .unwrap_or_default()
    };
    match nm.spec.stage {
        Stage::Complete => {
            return fail(
                EXIT_CANCELLED,
                format!("the maintenance of {node} was ended (stage Complete) before it drained"),
            );
        }
        Stage::Idle | Stage::Cordon => {
            return fail(
                EXIT_BLOCKED,
                format!(
                    "stage is {}: nothing is drained until the stage is Drain",
                    nm.spec.stage.as_str()
                ),
            );
        }
        Stage::Drain => {}
    }
    if let Some(c) = drained.filter(|c| c.status == "False")
        && (c.reason == "PodsRequireConsent" || c.reason == "NodeNotFound")
    {
        return fail(
            EXIT_BLOCKED,
            format!("{node} cannot be drained: {}", text(Some(c))),
        );
    }
    let cordoned = condition(nm, CONDITION_CORDONED);
    if let Some(c) = cordoned.filter(|c| c.reason == "NodeReplaced") {
        return fail(EXIT_BLOCKED, format!("{node}: {}", text(Some(c))));
    }
    let blocked = condition(nm, CONDITION_EVICTION_BLOCKED).filter(|c| c.status == "True");
    let deadline = condition(nm, CONDITION_DEADLINE_EXCEEDED).filter(|c| c.status == "True");
    if let Some(d) = deadline
        && d.reason != "DeletingPastDeadline"
    {
        let mut message = format!(
            "the drain deadline of {node} passed ({}); the node stays cordoned and evictions are \
             retried",
            text(Some(d))
        );
        if let Some(b) = blocked {
            message.push_str(&format!("; blocked: {}", text(Some(b))));
        }
        return fail(EXIT_DEADLINE, message);
    }
    if let Some(b) = blocked.filter(|b| b.reason == "PodDisruptionBudgetDeadlock") {
        let drain = &nm.spec.drain;
        // With Delete at a deadline the controller resolves the deadlock itself: keep following.
        if drain.timeout_policy == TimeoutPolicy::Delete && drain.timeout_seconds.is_some() {
            return Verdict::Waiting;
        }
        return fail(
            EXIT_BLOCKED,
            format!(
                "the drain of {node} is deadlocked ({}). No eviction can succeed until the \
                 workload scales or the PodDisruptionBudget changes; the node stays cordoned and \
                 retries go on. End it with `pilothouse maintenance end {node}`, or start with \
                 --timeout D --timeout-policy Delete to delete such pods at a deadline",
                text(Some(b))
            ),
        );
    }
    Verdict::Waiting
}

/// What `end` waits for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Release {
    Waiting,
    /// Released; whether the node is schedulable now (it stays unschedulable if it was cordoned
    /// before the maintenance).
    Released {
        schedulable: bool,
    },
    NodeGone,
    /// Our object completed, but another active maintenance still holds the node.
    Held(String),
}

/// `end`'s decision: released when the object is `Completed` (or gone) and the node no longer
/// carries the maintenance taint.
pub fn release(nm: Option<&NodeMaintenance>, node: Option<&Node>) -> Release {
    let completed = nm.is_none_or(|nm| {
        nm.status.as_ref().and_then(|s| s.phase) == Some(Phase::Completed) && observed(nm)
    });
    if !completed {
        return Release::Waiting;
    }
    let Some(node) = node else {
        return Release::NodeGone;
    };
    let spec = node.spec.as_ref();
    let tainted = spec
        .and_then(|s| s.taints.as_ref())
        .is_some_and(|ts| ts.iter().any(|t| t.key == TAINT_MAINTENANCE));
    if !tainted {
        return Release::Released {
            schedulable: !spec.and_then(|s| s.unschedulable).unwrap_or(false),
        };
    }
    match nm.and_then(|nm| condition(nm, CONDITION_CORDONED)) {
        Some(c) if c.reason == "HeldByOtherMaintenance" => Release::Held(c.message.clone()),
        _ => Release::Waiting,
    }
}
