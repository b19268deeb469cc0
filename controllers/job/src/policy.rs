//! podFailurePolicy (JR-36), successPolicy (JR-41) and pod-failure backoff (JR-34, JR-35).

use crate::indexes::Intervals;
use crate::pods;
use k8s_openapi::api::batch::v1::{
    PodFailurePolicy, PodFailurePolicyOnExitCodesRequirement, SuccessPolicy,
};
use k8s_openapi::api::core::v1::ContainerStatus;
use k8s_openapi::jiff::Timestamp;
use shared::cache::pod::Pod;
use std::time::Duration;

/// JR-34: the first delay; it doubles per failure up to [`MAX_POD_FAILURE_BACKOFF`].
pub const DEFAULT_POD_FAILURE_BACKOFF: Duration = Duration::from_secs(10);
/// Upstream's `MaxJobPodFailureBackOff` (the code says 10 min; older docs say 6, JB-9).
pub const MAX_POD_FAILURE_BACKOFF: Duration = Duration::from_secs(600);

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Action {
    FailJob,
    FailIndex,
    Ignore,
    Count,
}

impl Action {
    pub fn as_str(self) -> &'static str {
        match self {
            Action::FailJob => "FailJob",
            Action::FailIndex => "FailIndex",
            Action::Ignore => "Ignore",
            Action::Count => "Count",
        }
    }
}

/// The outcome of matching a failed pod against the policy (upstream `matchPodFailurePolicy`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Match {
    /// The `FailJob` message, for that action only.
    pub fail_job_message: Option<String>,
    /// Whether the failure counts against backoff limits.
    pub counts: bool,
    /// The matching rule's action, if a rule matched.
    pub action: Option<Action>,
}

const NO_MATCH: Match = Match {
    fail_job_message: None,
    counts: true,
    action: None,
};

fn exit_code_matches(code: i32, req: &PodFailurePolicyOnExitCodesRequirement) -> bool {
    match req.operator.as_str() {
        "In" => req.values.contains(&code),
        "NotIn" => !req.values.contains(&code),
        _ => false,
    }
}

fn matching_container<'a>(
    statuses: &'a [ContainerStatus],
    req: &PodFailurePolicyOnExitCodesRequirement,
) -> Option<(&'a ContainerStatus, i32)> {
    statuses.iter().find_map(|s| {
        let code = s.state.as_ref()?.terminated.as_ref()?.exit_code;
        let name_ok = req.container_name.as_deref().is_none_or(|n| n == s.name);
        (name_ok && code != 0 && exit_code_matches(code, req)).then_some((s, code))
    })
}

/// JR-36: the first rule (in order) matching the pod decides. The caller only asks for pods it
/// considers failed.
pub fn match_pod_failure_policy(policy: Option<&PodFailurePolicy>, pod: &Pod) -> Match {
    let Some(policy) = policy else {
        return NO_MATCH;
    };
    let status = pod.status.clone().unwrap_or_default();
    let ns = pod.metadata.namespace.as_deref().unwrap_or_default();
    let name = pods::name(pod);
    for (index, rule) in policy.rules.iter().enumerate() {
        let message = if let Some(req) = &rule.on_exit_codes {
            let regular = status.container_statuses.as_deref().unwrap_or_default();
            let init = status
                .init_container_statuses
                .as_deref()
                .unwrap_or_default();
            match matching_container(regular, req).or_else(|| matching_container(init, req)) {
                Some((c, code)) => format!(
                    "Container {} for pod {ns}/{name} failed with exit code {code} matching {} rule at index {index}",
                    c.name, rule.action
                ),
                None => continue,
            }
        } else if let Some(patterns) = &rule.on_pod_conditions {
            let found = status.conditions.iter().flatten().find(|c| {
                patterns.iter().any(|p| {
                    p.type_ == c.type_ && p.status.as_deref().unwrap_or("True") == c.status
                })
            });
            match found {
                Some(c) => format!(
                    "Pod {ns}/{name} has condition {} matching {} rule at index {index}",
                    c.type_, rule.action
                ),
                None => continue,
            }
        } else {
            continue;
        };
        return match rule.action.as_str() {
            "Ignore" => Match {
                fail_job_message: None,
                counts: false,
                action: Some(Action::Ignore),
            },
            "FailIndex" => Match {
                fail_job_message: None,
                counts: true,
                action: Some(Action::FailIndex),
            },
            "Count" => Match {
                fail_job_message: None,
                counts: true,
                action: Some(Action::Count),
            },
            "FailJob" => Match {
                fail_job_message: Some(message),
                counts: true,
                action: Some(Action::FailJob),
            },
            // An action this version does not know: keep looking, as upstream's switch does.
            _ => continue,
        };
    }
    NO_MATCH
}

/// JR-41: `Matched rules at index <i>` for the first rule met by the succeeded indexes.
pub fn match_success_policy(
    policy: Option<&SuccessPolicy>,
    completions: i32,
    succeeded: &Intervals,
) -> Option<String> {
    let policy = policy?;
    if succeeded.is_empty() {
        return None;
    }
    for (index, rule) in policy.rules.iter().enumerate() {
        let met = match &rule.succeeded_indexes {
            Some(s) => {
                let required = Intervals::parse(s, completions);
                if required.is_empty() {
                    continue;
                }
                let contained = required.count_in(succeeded);
                contained == required.normalized().total()
                    || rule.succeeded_count.is_some_and(|c| contained >= c)
            }
            None => rule.succeeded_count.is_some_and(|c| succeeded.total() >= c),
        };
        if met {
            return Some(format!("Matched rules at index {index}"));
        }
    }
    None
}

/// Failures since the last success and when the latest happened, kept per Job across syncs.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct BackoffRecord {
    pub failures_after_last_success: i32,
    pub last_failure: Option<Timestamp>,
}

impl BackoffRecord {
    /// Upstream `newBackoffRecord`: folds this sync's newly finished pods into the record.
    pub fn next(&self, new_succeeded: &[&Pod], new_failed: &[&Pod]) -> BackoffRecord {
        let mut failed: Vec<Timestamp> =
            new_failed.iter().map(|p| pods::finished_time(p)).collect();
        failed.sort();
        let last_success = new_succeeded.iter().map(|p| pods::finished_time(p)).max();
        match (last_success, failed.last()) {
            (None, None) => *self,
            (None, Some(last)) => BackoffRecord {
                failures_after_last_success: self
                    .failures_after_last_success
                    .saturating_add(failed.len() as i32),
                last_failure: Some(*last),
            },
            (Some(_), None) => BackoffRecord::default(),
            (Some(success), Some(_)) => {
                let after: Vec<&Timestamp> = failed.iter().filter(|t| **t > success).collect();
                BackoffRecord {
                    failures_after_last_success: after.len() as i32,
                    last_failure: after.last().map(|t| **t),
                }
            }
        }
    }

    pub fn remaining(&self, now: Timestamp) -> Duration {
        remaining_for_failures(self.failures_after_last_success, self.last_failure, now)
    }
}

/// `min(10 s × 2^(n−1), 600 s)` after the last failure, minus the time since it (JR-34).
pub fn remaining_for_failures(failures: i32, last: Option<Timestamp>, now: Timestamp) -> Duration {
    let Some(last) = last.filter(|_| failures > 0) else {
        return Duration::ZERO;
    };
    let mut backoff = DEFAULT_POD_FAILURE_BACKOFF;
    for _ in 1..failures {
        backoff = backoff.saturating_mul(2);
        if backoff >= MAX_POD_FAILURE_BACKOFF {
            backoff = MAX_POD_FAILURE_BACKOFF;
            break;
        }
    }
    let elapsed = now.duration_since(last);
    let elapsed = Duration::try_from(elapsed).unwrap_or(Duration::ZERO);
    backoff.saturating_sub(elapsed)
}

/// JR-37: the remaining per-index backoff before replacing `last_failed`.
pub fn remaining_for_index(last_failed: Option<&Pod>, now: Timestamp) -> Duration {
    match last_failed {
        None => Duration::ZERO,
        Some(p) => remaining_for_failures(
            pods::index_absolute_failure_count(p).saturating_add(1),
            Some(pods::finished_time(p)),
            now,
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pods::testing::*;
    use k8s_openapi::api::batch::v1::{
        PodFailurePolicyOnPodConditionsPattern, PodFailurePolicyRule, SuccessPolicyRule,
    };

    fn rule_codes(action: &str, op: &str, values: &[i32]) -> PodFailurePolicyRule {
        PodFailurePolicyRule {
            action: action.into(),
            on_exit_codes: Some(PodFailurePolicyOnExitCodesRequirement {
                container_name: None,
                operator: op.into(),
                values: values.to_vec(),
            }),
            on_pod_conditions: None,
        }
    }

    fn rule_cond(action: &str, type_: &str) -> PodFailurePolicyRule {
        PodFailurePolicyRule {
            action: action.into(),
            on_exit_codes: None,
            on_pod_conditions: Some(vec![PodFailurePolicyOnPodConditionsPattern {
                type_: type_.into(),
                status: Some("True".into()),
            }]),
        }
    }

    #[test]
    fn jr36_first_matching_rule_wins() {
        let policy = PodFailurePolicy {
            rules: vec![
                rule_cond("Ignore", "DisruptionTarget"),
                rule_codes("FailJob", "In", &[42]),
                rule_codes("FailIndex", "In", &[3]),
                rule_codes("Count", "NotIn", &[0, 42, 3]),
            ],
        };
        let p = Some(&policy);
        let m = match_pod_failure_policy(p, &pod("a").exit(42, 10).build());
        assert_eq!(m.action, Some(Action::FailJob));
        assert_eq!(
            m.fail_job_message.as_deref(),
            Some(
                "Container c for pod ns/a failed with exit code 42 matching FailJob rule at index 1"
            )
        );
        let evicted = pod("b")
            .exit(42, 10)
            .condition("DisruptionTarget", "True")
            .build();
        let m = match_pod_failure_policy(p, &evicted);
        assert_eq!((m.action, m.counts), (Some(Action::Ignore), false));
        let m = match_pod_failure_policy(p, &pod("c").exit(3, 10).build());
        assert_eq!((m.action, m.counts), (Some(Action::FailIndex), true));
        let m = match_pod_failure_policy(p, &pod("d").exit(7, 10).build());
        assert_eq!((m.action, m.counts), (Some(Action::Count), true));
        // Exit code 0 never matches onExitCodes.
        let m = match_pod_failure_policy(
            Some(&PodFailurePolicy {
                rules: vec![rule_codes("FailJob", "NotIn", &[1])],
            }),
            &pod("e").exit(0, 10).phase("Failed").build(),
        );
        assert_eq!(m, NO_MATCH);
        assert_eq!(match_pod_failure_policy(None, &pod("f").build()), NO_MATCH);
    }

    #[test]
    fn jr36_condition_message() {
        let policy = PodFailurePolicy {
            rules: vec![rule_cond("FailJob", "DisruptionTarget")],
        };
        let p = pod("a")
            .phase("Failed")
            .condition("DisruptionTarget", "True")
            .build();
        assert_eq!(
            match_pod_failure_policy(Some(&policy), &p)
                .fail_job_message
                .as_deref(),
            Some("Pod ns/a has condition DisruptionTarget matching FailJob rule at index 0")
        );
    }

    #[test]
    fn jr41_success_policy() {
        let rule = |ixs: Option<&str>, count: Option<i32>| SuccessPolicyRule {
            succeeded_indexes: ixs.map(Into::into),
            succeeded_count: count,
        };
        let policy = SuccessPolicy {
            rules: vec![
                rule(Some("x"), None),
                rule(Some("0-2"), Some(2)),
                rule(None, Some(4)),
            ],
        };
        let done = |s: &str| Intervals::parse(s, 10);
        assert_eq!(match_success_policy(Some(&policy), 10, &done("")), None);
        assert_eq!(match_success_policy(Some(&policy), 10, &done("0")), None);
        assert_eq!(
            match_success_policy(Some(&policy), 10, &done("0,2")).as_deref(),
            Some("Matched rules at index 1")
        );
        assert_eq!(
            match_success_policy(Some(&policy), 10, &done("5-8")).as_deref(),
            Some("Matched rules at index 2")
        );
        let all = SuccessPolicy {
            rules: vec![rule(Some("0"), None)],
        };
        assert_eq!(
            match_success_policy(Some(&all), 5, &done("0")).as_deref(),
            Some("Matched rules at index 0")
        );
    }

    #[test]
    fn jr34_backoff_curve() {
        let now = ts(10_000);
        let at = |n: i32, ago: i64| remaining_for_failures(n, Some(ts(10_000 - ago)), now);
        assert_eq!(at(0, 0), Duration::ZERO);
        assert_eq!(at(1, 0), Duration::from_secs(10));
        assert_eq!(at(2, 5), Duration::from_secs(15));
        assert_eq!(at(3, 0), Duration::from_secs(40));
        assert_eq!(at(6, 0), Duration::from_secs(320));
        assert_eq!(at(7, 0), Duration::from_secs(600));
        assert_eq!(at(50, 0), Duration::from_secs(600));
        assert_eq!(at(1, 11), Duration::ZERO);
    }

    #[test]
    fn jr34_record_folds_new_pods() {
        let f1 = pod("f1").exit(1, 100).build();
        let f2 = pod("f2").exit(1, 300).build();
        let s = pod("s").exit(0, 200).build();
        let r = BackoffRecord::default().next(&[], &[&f1]);
        assert_eq!(r.failures_after_last_success, 1);
        let r = r.next(&[], &[&f2]);
        assert_eq!(
            (r.failures_after_last_success, r.last_failure),
            (2, Some(ts(300)))
        );
        // A success resets; failures after it still count.
        let r = r.next(&[&s], &[&f1, &f2]);
        assert_eq!(
            (r.failures_after_last_success, r.last_failure),
            (1, Some(ts(300)))
        );
        assert_eq!(r.next(&[&s], &[]), BackoffRecord::default());
        assert_eq!(r.next(&[], &[]), r);
    }

    #[test]
    fn jr37_per_index_backoff() {
        let now = ts(1000);
        assert_eq!(remaining_for_index(None, now), Duration::ZERO);
        let p = pod("a")
            .exit(1, 995)
            .annotate(pods::INDEX_FAILURE_COUNT, "1")
            .build();
        // Second failure of the index: 20 s after it.
        assert_eq!(remaining_for_index(Some(&p), now), Duration::from_secs(15));
    }
}
