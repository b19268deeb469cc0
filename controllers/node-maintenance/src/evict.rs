//! NM-13, NM-14, NM-16, NM-17: what an eviction response means, which PodDisruptionBudget blocks
//! a pod, whether that budget can never allow an eviction, and the per-pod backoff.
//!
//! Wire behaviour of the 1.37 eviction subresource (`pkg/registry/core/pod/storage/eviction.go`,
//! read for this module): a pod matched by several budgets is answered with a `metav1.Status`
//! returned as the *result* (`status: Failure`, `code: 500`, "This pod has more than one
//! PodDisruptionBudget, which the eviction subresource does not support."), and the create
//! handler writes a result with HTTP 201, so the body, not the HTTP code, tells (NB-10). A budget
//! that allows nothing answers 429 with a `DisruptionBudget` cause naming it; a budget whose
//! status lags its generation answers 429 "still being processed" (retry after 10 s per
//! `retryAfterSeconds`); a negative `disruptionsAllowed` or an overfull `disruptedPods` answers
//! 403 with a `DisruptionBudget` cause. `deleteOptions.preconditions.uid` is honoured: a pod
//! replaced under the same name answers 409 "the UID in the precondition ... does not match".

use crate::types::TargetState;
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use serde_json::Value;
use shared::cache::pod::Pod;
use std::time::Duration;

/// kubectl's `EvictErrorRetryDelay`, the first retry (NM-14).
pub const BACKOFF_BASE: Duration = Duration::from_secs(5);
pub const BACKOFF_MAX: Duration = Duration::from_secs(300);
/// 429 "still being processed": the server's own suggestion.
pub const PROCESSING_RETRY: Duration = Duration::from_secs(5);
/// API priority and fairness 429s without `Retry-After` we can read.
pub const THROTTLE_RETRY: Duration = Duration::from_secs(1);

pub const PDB_MESSAGE: &str = "Cannot evict pod as it would violate the pod's disruption budget.";
pub const CAUSE_DISRUPTION_BUDGET: &str = "DisruptionBudget";
pub const CAUSE_NAMESPACE_TERMINATING: &str = "NamespaceTerminating";
const MULTIPLE_PDBS: &str = "more than one PodDisruptionBudget";

/// Blocked reasons, most severe first (the `EvictionBlocked` condition takes the first present).
pub const REASON_DEADLOCK: &str = "PodDisruptionBudgetDeadlock";
pub const REASON_MULTIPLE: &str = "MultiplePodDisruptionBudgets";
pub const REASON_PDB: &str = "PodDisruptionBudget";
pub const REASON_DENIED: &str = "EvictionDenied";
pub const REASON_ERROR: &str = "EvictionError";
pub const SEVERITY: [&str; 5] = [
    REASON_DEADLOCK,
    REASON_MULTIPLE,
    REASON_PDB,
    REASON_DENIED,
    REASON_ERROR,
];

pub fn severity(reason: &str) -> usize {
    SEVERITY
        .iter()
        .position(|r| *r == reason)
        .unwrap_or(SEVERITY.len())
}

/// One eviction response, classified (NM-13's table).
#[derive(Clone, Debug, PartialEq)]
pub enum Outcome {
    /// 2xx, `Success` or no Status: the pod is terminating.
    Accepted,
    /// 404, or the UID precondition failed: the pod we meant is gone.
    Gone,
    /// Refused by a budget; the budget's name from the cause text when it has one.
    Budget {
        pdb: Option<String>,
        message: String,
        /// "still being processed": the budget's status lags its spec.
        processing: bool,
    },
    MultipleBudgets {
        message: String,
    },
    /// API priority and fairness (or any 429 without a budget cause): not blocked.
    Throttled {
        retry_after: Duration,
    },
    /// 403 NamespaceTerminating.
    NamespaceTerminating {
        message: String,
    },
    /// Other 403 / 422 (an admission webhook, RBAC).
    Denied {
        message: String,
    },
    Error {
        message: String,
    },
}

impl Outcome {
    /// `pilothouse_nodemaintenance_evictions_total{result}` (a budget refusal found to be a
    /// deadlock is relabelled by the caller).
    pub fn result_label(&self) -> &'static str {
        match self {
            Outcome::Accepted => "accepted",
            Outcome::Gone => "not_found",
            Outcome::Budget { .. } => "pdb",
            Outcome::MultipleBudgets { .. } => "multiple_pdb",
            Outcome::Throttled { .. } => "throttled",
            Outcome::NamespaceTerminating { .. } | Outcome::Denied { .. } => "denied",
            Outcome::Error { .. } => "error",
        }
    }
}

/// The `Status` a 2xx body may carry, if it says `Failure`.
fn failed_status(body: &Value) -> Option<String> {
    (body.get("kind").and_then(Value::as_str) == Some("Status")
        && body.get("status").and_then(Value::as_str) == Some("Failure"))
    .then(|| {
        body.get("message")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_string()
    })
}

/// The budget named in eviction.go's cause texts: "The disruption budget <name> ...".
pub fn pdb_from_cause(message: &str) -> Option<String> {
    let rest = message.strip_prefix("The disruption budget ")?;
    let name = rest.split_whitespace().next()?;
    (!name.is_empty()).then(|| name.to_string())
}

/// NM-13: classifies the answer to `POST pods/<name>/eviction`.
pub fn classify_response(response: &Result<Value, kube::Error>) -> Outcome {
    let s = match response {
        Ok(body) => {
            return match failed_status(body) {
                Some(m) if m.contains(MULTIPLE_PDBS) => Outcome::MultipleBudgets { message: m },
                Some(m) => Outcome::Error { message: m },
                None => Outcome::Accepted,
            };
        }
        Err(kube::Error::Api(s)) => s,
        Err(other) => {
            return Outcome::Error {
                message: other.to_string(),
            };
        }
    };
    let causes = s
        .details
        .as_ref()
        .map(|d| d.causes.as_slice())
        .unwrap_or_default();
    let budget_cause = causes.iter().find(|c| c.reason == CAUSE_DISRUPTION_BUDGET);
    let message = if s.message.is_empty() {
        format!("HTTP {}", s.code)
    } else {
        s.message.clone()
    };
    let budget = |c: Option<&kube::core::response::StatusCause>| {
        let text = c.map(|c| c.message.clone()).unwrap_or_default();
        Outcome::Budget {
            pdb: pdb_from_cause(&text),
            processing: text.contains("is still being processed"),
            message: if text.is_empty() {
                message.clone()
            } else {
                text
            },
        }
    };
    match s.code {
        404 => Outcome::Gone,
        409 if s.message.contains("UID") => Outcome::Gone,
        429 if budget_cause.is_some() || s.message == PDB_MESSAGE => budget(budget_cause),
        429 => Outcome::Throttled {
            retry_after: s
                .details
                .as_ref()
                .map(|d| d.retry_after_seconds)
                .filter(|s| *s > 0)
                .map_or(THROTTLE_RETRY, |s| Duration::from_secs(u64::from(s))),
        },
        // Only the text tells: a bare 500 (etcd, a webhook's crash) is an EvictionError, not a
        // claim about budgets the table's "HTTP 500" row would make.
        _ if s.message.contains(MULTIPLE_PDBS) => Outcome::MultipleBudgets { message },
        // A negative disruptionsAllowed or an overfull disruptedPods: still the budget's refusal.
        403 if budget_cause.is_some() => budget(budget_cause),
        403 if causes
            .iter()
            .any(|c| c.reason == CAUSE_NAMESPACE_TERMINATING)
            || s.message.contains("because it is being terminated") =>
        {
            Outcome::NamespaceTerminating { message }
        }
        403 | 422 => Outcome::Denied { message },
        _ => Outcome::Error { message },
    }
}

/// policy/v1: a budget's selector; an empty one matches every pod of its namespace, a missing
/// or invalid one none (eviction.go skips budgets whose selector does not parse).
pub fn pdb_matches(pdb: &PodDisruptionBudget, pod: &Pod) -> bool {
    if pdb.metadata.namespace != pod.metadata.namespace {
        return false;
    }
    let Some(sel) = pdb.spec.as_ref().and_then(|s| s.selector.as_ref()) else {
        return false;
    };
    shared::meta::selector::matches(Some(sel), pod.metadata.labels.as_ref()).unwrap_or(false)
}

/// NM-16: the blocking budget: the one the cache says selects the pod, else the one the cause
/// text names (the cache may lag, or hold several where the server saw one).
pub fn blocking_pdb(
    matching: &[std::sync::Arc<PodDisruptionBudget>],
    named: Option<&str>,
) -> Option<PdbRef> {
    if let Some(name) = named
        && let Some(p) = matching
            .iter()
            .find(|p| p.metadata.name.as_deref() == Some(name))
    {
        return Some(PdbRef::of(p));
    }
    match (matching, named) {
        ([one], _) => Some(PdbRef::of(one)),
        (_, Some(name)) => Some(PdbRef {
            name: name.to_string(),
            ..PdbRef::default()
        }),
        _ => None,
    }
}

/// What a status message and the deadlock test need of a budget.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PdbRef {
    pub name: String,
    pub desired_healthy: Option<i32>,
    pub current_healthy: Option<i32>,
    pub expected_pods: Option<i32>,
}

impl PdbRef {
    pub fn of(p: &PodDisruptionBudget) -> PdbRef {
        let s = p.status.as_ref();
        PdbRef {
            name: p.metadata.name.clone().unwrap_or_default(),
            desired_healthy: s.and_then(|s| s.desired_healthy),
            current_healthy: s.and_then(|s| s.current_healthy),
            expected_pods: s.and_then(|s| s.expected_pods),
        }
    }

    /// NM-17: `expectedPods > 0` and `desiredHealthy >= expectedPods`: no eviction is possible
    /// until the owner scales or the budget changes.
    pub fn deadlocked(&self) -> bool {
        match (self.expected_pods, self.desired_healthy) {
            (Some(expected), Some(desired)) => expected > 0 && desired >= expected,
            _ => false,
        }
    }

    /// `blocked by PodDisruptionBudget db-pdb (needs 1 healthy, has 1; no disruption possible
    /// at current scale)`.
    pub fn describe(&self) -> String {
        let mut s = format!("blocked by PodDisruptionBudget {}", self.name);
        if let (Some(d), Some(c)) = (self.desired_healthy, self.current_healthy) {
            s.push_str(&format!(" (needs {d} healthy, has {c}"));
            if self.deadlocked() {
                s.push_str("; no disruption possible at current scale");
            }
            s.push(')');
        }
        s
    }
}

/// NM-14: 5 s, doubling per consecutive failure, capped at 5 minutes.
pub fn backoff(failures: u32) -> Duration {
    shared::api::ratelimit::backoff_delay(BACKOFF_BASE, BACKOFF_MAX, failures.saturating_sub(1))
}

/// The state a target is in after a response (NM-13).
pub fn state_after(outcome: &Outcome, pod_terminating: bool) -> TargetState {
    match outcome {
        Outcome::Accepted => TargetState::Terminating,
        Outcome::Gone => TargetState::Gone,
        Outcome::Throttled { .. } => TargetState::Pending,
        Outcome::NamespaceTerminating { .. } if pod_terminating => TargetState::Terminating,
        Outcome::NamespaceTerminating { .. } => TargetState::Pending,
        _ => TargetState::Blocked,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::policy::v1::{PodDisruptionBudgetSpec, PodDisruptionBudgetStatus};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta};
    use kube::core::response::{StatusCause, StatusDetails};
    use serde_json::json;

    fn api(
        code: u16,
        reason: &str,
        message: &str,
        causes: Vec<(&str, &str)>,
        retry: u32,
    ) -> Result<Value, kube::Error> {
        let mut s = kube::core::Status::failure(message, reason).with_code(code);
        s.details = Some(StatusDetails {
            name: String::new(),
            group: String::new(),
            kind: String::new(),
            uid: String::new(),
            causes: causes
                .into_iter()
                .map(|(r, m)| StatusCause {
                    reason: r.into(),
                    message: m.into(),
                    field: String::new(),
                })
                .collect(),
            retry_after_seconds: retry,
        });
        Err(kube::Error::Api(Box::new(s)))
    }

    #[test]
    fn nm_13_every_response_row() {
        let multiple = "This pod has more than one PodDisruptionBudget, which the eviction subresource does not support.";
        let needs = "The disruption budget db-pdb needs 1 healthy pods and has 1 currently";
        let rows: Vec<(&str, Result<Value, kube::Error>, Outcome)> = vec![
            ("201 Success", Ok(json!({"kind": "Status", "apiVersion": "v1", "status": "Success"})), Outcome::Accepted),
            ("200 no body", Ok(json!({})), Outcome::Accepted),
            // NB-10: eviction.go returns the multiple-PDB Status as a result, written with 201.
            ("201 Failure multiple PDBs", Ok(json!({"kind": "Status", "status": "Failure", "code": 500, "message": multiple})), Outcome::MultipleBudgets { message: multiple.into() }),
            ("201 Failure other", Ok(json!({"kind": "Status", "status": "Failure", "message": "odd"})), Outcome::Error { message: "odd".into() }),
            ("500 multiple PDBs", api(500, "InternalError", multiple, vec![], 0), Outcome::MultipleBudgets { message: multiple.into() }),
            ("404", api(404, "NotFound", "pods \"p\" not found", vec![], 0), Outcome::Gone),
            ("409 UID precondition", api(409, "Conflict", "Operation cannot be fulfilled on Pod \"p\": the UID in the precondition (a) does not match the UID in record (b). The object might have been deleted and then recreated", vec![], 0), Outcome::Gone),
            ("409 other", api(409, "Conflict", "something else", vec![], 0), Outcome::Error { message: "something else".into() }),
            ("429 PDB cause", api(429, "TooManyRequests", PDB_MESSAGE, vec![(CAUSE_DISRUPTION_BUDGET, needs)], 0),
                Outcome::Budget { pdb: Some("db-pdb".into()), message: needs.into(), processing: false }),
            ("429 PDB message without cause", api(429, "TooManyRequests", PDB_MESSAGE, vec![], 0),
                Outcome::Budget { pdb: None, message: PDB_MESSAGE.into(), processing: false }),
            ("429 still being processed", api(429, "TooManyRequests", PDB_MESSAGE, vec![(CAUSE_DISRUPTION_BUDGET, "The disruption budget db-pdb is still being processed by the server.")], 10),
                Outcome::Budget { pdb: Some("db-pdb".into()), message: "The disruption budget db-pdb is still being processed by the server.".into(), processing: true }),
            // NB-12: priority and fairness answers plain text; kube keeps the code only.
            ("429 APF", api(429, "Failed to parse error data", "Too many requests, please try again later.", vec![], 0), Outcome::Throttled { retry_after: THROTTLE_RETRY }),
            ("429 APF with retryAfterSeconds", api(429, "TooManyRequests", "slow down", vec![], 7), Outcome::Throttled { retry_after: Duration::from_secs(7) }),
            ("403 negative budget", api(403, "Forbidden", "poddisruptionbudget.policy \"db-pdb\" is forbidden: pdb disruptions allowed is negative", vec![(CAUSE_DISRUPTION_BUDGET, "The disruption budget db-pdb does not allow evicting pods currently: pdb disruptions allowed is negative")], 0),
                Outcome::Budget { pdb: Some("db-pdb".into()), message: "The disruption budget db-pdb does not allow evicting pods currently: pdb disruptions allowed is negative".into(), processing: false }),
            ("403 namespace terminating", api(403, "Forbidden", "pods \"p\" is forbidden: unable to create new content in namespace shop because it is being terminated", vec![(CAUSE_NAMESPACE_TERMINATING, "namespace shop is being terminated")], 0),
                Outcome::NamespaceTerminating { message: "pods \"p\" is forbidden: unable to create new content in namespace shop because it is being terminated".into() }),
            ("403 webhook", api(403, "Forbidden", "admission webhook \"deny\" denied the request", vec![], 0), Outcome::Denied { message: "admission webhook \"deny\" denied the request".into() }),
            ("422", api(422, "Invalid", "invalid", vec![], 0), Outcome::Denied { message: "invalid".into() }),
            ("503", api(503, "ServiceUnavailable", "", vec![], 0), Outcome::Error { message: "HTTP 503".into() }),
            ("500 without the multiple-PDB text", api(500, "InternalError", "etcdserver: request timed out", vec![], 0), Outcome::Error { message: "etcdserver: request timed out".into() }),
        ];
        for (name, response, want) in rows {
            assert_eq!(classify_response(&response), want, "{name}");
        }
    }

    #[test]
    fn nm_13_labels_and_states() {
        let budget = Outcome::Budget {
            pdb: None,
            message: String::new(),
            processing: false,
        };
        assert_eq!(budget.result_label(), "pdb");
        assert_eq!(
            Outcome::Throttled {
                retry_after: THROTTLE_RETRY
            }
            .result_label(),
            "throttled"
        );
        assert_eq!(
            state_after(&Outcome::Accepted, false),
            TargetState::Terminating
        );
        assert_eq!(state_after(&Outcome::Gone, false), TargetState::Gone);
        // NB-12: throttling is never "blocked".
        assert_eq!(
            state_after(
                &Outcome::Throttled {
                    retry_after: THROTTLE_RETRY
                },
                false
            ),
            TargetState::Pending
        );
        assert_eq!(state_after(&budget, false), TargetState::Blocked);
        let ns = Outcome::NamespaceTerminating {
            message: String::new(),
        };
        assert_eq!(state_after(&ns, true), TargetState::Terminating);
        assert_eq!(state_after(&ns, false), TargetState::Pending);
    }

    #[test]
    fn nm_14_backoff_doubles_to_five_minutes() {
        let secs: Vec<u64> = (1..=9).map(|n| backoff(n).as_secs()).collect();
        assert_eq!(secs, [5, 10, 20, 40, 80, 160, 300, 300, 300]);
        assert_eq!(backoff(0).as_secs(), 5);
        assert_eq!(backoff(u32::MAX), BACKOFF_MAX);
    }

    fn pdb(
        name: &str,
        sel: Option<LabelSelector>,
        desired: i32,
        current: i32,
        expected: i32,
    ) -> std::sync::Arc<PodDisruptionBudget> {
        std::sync::Arc::new(PodDisruptionBudget {
            metadata: ObjectMeta {
                name: Some(name.into()),
                namespace: Some("shop".into()),
                ..Default::default()
            },
            spec: Some(PodDisruptionBudgetSpec {
                selector: sel,
                ..Default::default()
            }),
            status: Some(PodDisruptionBudgetStatus {
                desired_healthy: Some(desired),
                current_healthy: Some(current),
                expected_pods: Some(expected),
                ..Default::default()
            }),
        })
    }

    #[test]
    fn nm_16_blocking_budget_from_cache_else_cause() {
        let a = pdb("a", Some(LabelSelector::default()), 1, 1, 1);
        let b = pdb("b", Some(LabelSelector::default()), 1, 2, 2);
        assert_eq!(
            blocking_pdb(std::slice::from_ref(&a), None).unwrap().name,
            "a"
        );
        assert_eq!(
            blocking_pdb(&[a.clone(), b.clone()], Some("b")).unwrap(),
            PdbRef::of(&b)
        );
        assert_eq!(blocking_pdb(&[], Some("gone")).unwrap().name, "gone");
        assert_eq!(blocking_pdb(&[a, b], None), None);
        assert_eq!(
            pdb_from_cause("The disruption budget db-pdb needs 1 healthy pods and has 1 currently")
                .as_deref(),
            Some("db-pdb")
        );
        assert_eq!(pdb_from_cause("something"), None);
        // policy/v1: an empty selector matches all pods of the namespace, a missing one none.
        let pod: Pod =
            serde_json::from_value(json!({"metadata": {"name": "p", "namespace": "shop"}}))
                .unwrap();
        assert!(pdb_matches(
            &pdb("all", Some(LabelSelector::default()), 0, 0, 0),
            &pod
        ));
        assert!(!pdb_matches(&pdb("none", None, 0, 0, 0), &pod));
    }

    #[test]
    fn nm_17_deadlock_only_when_no_eviction_is_possible() {
        assert!(
            PdbRef::of(&pdb("one", None, 1, 1, 1)).deadlocked(),
            "minAvailable 1 of 1"
        );
        assert!(
            PdbRef::of(&pdb("zero", None, 2, 2, 2)).deadlocked(),
            "maxUnavailable 0"
        );
        assert!(
            !PdbRef::of(&pdb("room", None, 1, 1, 2)).deadlocked(),
            "scaled to 2"
        );
        assert!(
            !PdbRef::of(&pdb("empty", None, 0, 0, 0)).deadlocked(),
            "no expected pods"
        );
        assert!(!PdbRef::default().deadlocked(), "unknown status");
        assert_eq!(
            PdbRef::of(&pdb("db-pdb", None, 1, 1, 1)).describe(),
            "blocked by PodDisruptionBudget db-pdb (needs 1 healthy, has 1; no disruption possible at current scale)"
        );
        assert_eq!(
            PdbRef {
                name: "x".into(),
                ..Default::default()
            }
            .describe(),
            "blocked by PodDisruptionBudget x"
        );
    }
}
