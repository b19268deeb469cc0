//! The conditions one drain step leads to, and the events that go with them, decided purely:
//! [`drain_conditions`] reads the object, its status as the sync holds it, the view of its
//! targets that the drain step built (from the tracker's pod records and the cached pods) and
//! the time, and returns the conditions to set and the notices to send. The caller
//! ([`crate::sync::NodeMaintenanceController`]'s drain step) sets and sends what it is given,
//! in order.
//!
//! `Drained`: InvalidPodSelector (NM-9), PodsRequireConsent (NM-10), DrainComplete (NM-15) or
//! Draining (NM-15, NM-22); `EvictionBlocked` (NM-16, NM-17); `DeadlineExceeded` (NM-18).

use crate::status::{self, Entry};
use crate::types::{
    CONDITION_DEADLINE_EXCEEDED, CONDITION_DRAINED, CONDITION_EVICTION_BLOCKED, NodeMaintenance,
    NodeMaintenanceStatus, TargetState, TimeoutPolicy,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use k8s_openapi::jiff::Timestamp;

pub const REASON_INVALID_SELECTOR: &str = "InvalidPodSelector";
/// The events' action (core/v1 events carry none; kept for the recorder's signature).
const ACTION: &str = "Drain";

/// What one drain step found, as the conditions read it.
#[derive(Clone, Copy, Debug, Default)]
pub struct DrainStep<'a> {
    /// The view of every target ever selected (from the tracker's records and the cache).
    pub entries: &'a [Entry],
    /// NM-10: the consent message, when a live target lacks consent.
    pub consent: Option<&'a str>,
    /// NM-9: why `spec.drain.podSelector` is invalid (nothing was selected).
    pub selector_error: Option<&'a str>,
}

/// One condition to set, with the sync's time and the object's generation
/// ([`status::set_condition`] keeps the transition time when the status stays).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Set {
    pub type_: &'static str,
    pub status: bool,
    pub reason: String,
    pub message: String,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EventType {
    Normal,
    Warning,
}

/// An event about the object, for the caller to send.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Notice {
    pub type_: EventType,
    pub reason: &'static str,
    pub action: &'static str,
    pub message: String,
}

/// What one drain step comes to.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct DrainConditions {
    /// The conditions to set, in this order.
    pub set: Vec<Set>,
    /// The events to send, in this order.
    pub notices: Vec<Notice>,
    /// NM-15: the node is drained.
    pub drained: bool,
    /// The drain ended with this step (drained now, not before): the drain's duration is
    /// observed once.
    pub ended: bool,
}

impl DrainConditions {
    fn set(
        &mut self,
        type_: &'static str,
        status: bool,
        reason: impl Into<String>,
        message: impl Into<String>,
    ) {
        self.set.push(Set {
            type_,
            status,
            reason: reason.into(),
            message: message.into(),
        });
    }

    fn notice(&mut self, type_: EventType, reason: &'static str, message: impl Into<String>) {
        self.notices.push(Notice {
            type_,
            reason,
            action: ACTION,
            message: message.into(),
        });
    }

    /// Sets [`Self::set`] on `conditions`, in order.
    pub fn apply(&self, conditions: &mut Vec<Condition>, now: Timestamp, generation: Option<i64>) {
        for s in &self.set {
            status::set_condition(
                conditions,
                s.type_,
                s.status,
                &s.reason,
                s.message.as_str(),
                now,
                generation,
            );
        }
    }
}

/// The Drain-stage conditions and events of one drain step. `st` is the status as the sync
/// holds it before they are set (its `drain.deadline` already computed by the step).
pub fn drain_conditions(
    nm: &NodeMaintenance,
    st: &NodeMaintenanceStatus,
    step: &DrainStep<'_>,
    now: Timestamp,
) -> DrainConditions {
    let mut out = DrainConditions::default();
    if let Some(e) = step.selector_error {
        invalid_selector(nm, st, e, &mut out);
        return out;
    }
    out.drained = step.consent.is_none() && status::drained(step.entries);
    drained(nm, st, step, &mut out);
    // NM-16, NM-17: the most severe block, naming the first blocked pods.
    match status::eviction_blocked(step.entries) {
        Some((reason, msg)) => out.set(CONDITION_EVICTION_BLOCKED, true, reason, msg),
        None => out.set(CONDITION_EVICTION_BLOCKED, false, "NotBlocked", ""),
    }
    deadline(nm, st, now, &mut out);
    out
}

/// NM-9: an invalid pod selector selects nothing; warned once per generation.
fn invalid_selector(
    nm: &NodeMaintenance,
    st: &NodeMaintenanceStatus,
    e: &str,
    out: &mut DrainConditions,
) {
    let generation = nm.metadata.generation;
    let warned = status::condition(&st.conditions, CONDITION_DRAINED).is_some_and(|c| {
        c.reason == REASON_INVALID_SELECTOR && c.observed_generation == generation
    });
    if !warned {
        out.notice(EventType::Warning, REASON_INVALID_SELECTOR, e);
    }
    out.set(CONDITION_DRAINED, false, REASON_INVALID_SELECTOR, e);
}

/// `Drained`: NM-10 (consent, warned when its message changes), NM-15 (complete, announced
/// once), else Draining with what is left (NM-22: where terminating pods may hang).
fn drained(
    nm: &NodeMaintenance,
    st: &NodeMaintenanceStatus,
    step: &DrainStep<'_>,
    out: &mut DrainConditions,
) {
    let node = &nm.spec.node_name;
    if let Some(msg) = step.consent {
        let same = status::condition(&st.conditions, CONDITION_DRAINED)
            .is_some_and(|c| c.reason == "PodsRequireConsent" && c.message == *msg);
        if !same {
            out.notice(EventType::Warning, "PodsRequireConsent", msg);
        }
        out.set(CONDITION_DRAINED, false, "PodsRequireConsent", msg);
    } else if out.drained {
        out.set(
            CONDITION_DRAINED,
            true,
            "DrainComplete",
            format!("node {node} is drained"),
        );
        if !status::is_true(&st.conditions, CONDITION_DRAINED) {
            out.notice(
                EventType::Normal,
                "DrainComplete",
                format!("Drained node {node}"),
            );
            out.ended = true;
        }
    } else {
        let left = step
            .entries
            .iter()
            .filter(|e| e.pod.state != TargetState::Gone)
            .count();
        let terminating = step
            .entries
            .iter()
            .filter(|e| e.pod.state == TargetState::Terminating)
            .count();
        let mut msg = format!("{left} pods left to drain");
        if terminating > 0 {
            // NM-22: pods of a failed node stay Terminating until PodGC or its return.
            msg.push_str(&format!(" ({terminating} terminating; if node {node} is gone for good, taint it node.kubernetes.io/out-of-service or set drain.skipWaitForDeleteTimeoutSeconds)"));
        }
        out.set(CONDITION_DRAINED, false, "Draining", msg);
    }
}

/// NM-18: `DeadlineExceeded`, warned once when the deadline passes undrained; a drain that
/// ends past its deadline keeps what it went through.
fn deadline(
    nm: &NodeMaintenance,
    st: &NodeMaintenanceStatus,
    now: Timestamp,
    out: &mut DrainConditions,
) {
    let deadline = st
        .drain
        .as_ref()
        .and_then(|d| d.deadline.as_ref())
        .map(|t| t.0);
    let exceeded = status::is_true(&st.conditions, CONDITION_DEADLINE_EXCEEDED);
    match deadline {
        None => out.set(CONDITION_DEADLINE_EXCEEDED, false, "NoDeadline", ""),
        Some(d) if now >= d && !out.drained => {
            let reason = match nm.spec.drain.timeout_policy {
                TimeoutPolicy::Wait => "WaitingPastDeadline",
                TimeoutPolicy::Delete => "DeletingPastDeadline",
            };
            if !exceeded {
                out.notice(
                    EventType::Warning,
                    "DrainDeadlineExceeded",
                    format!(
                        "Drain of node {} not done by its deadline {d}",
                        nm.spec.node_name
                    ),
                );
            }
            out.set(
                CONDITION_DEADLINE_EXCEEDED,
                true,
                reason,
                format!("deadline {d} passed"),
            );
        }
        // Drained after the deadline passed: the condition keeps what the drain went
        // through (True/…PastDeadline), rather than a "WithinDeadline" that reads wrong.
        Some(d) if out.drained && now >= d && exceeded => {}
        Some(d) => out.set(
            CONDITION_DEADLINE_EXCEEDED,
            false,
            "WithinDeadline",
            format!("deadline {d}"),
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::evict::{REASON_DEADLOCK, REASON_PDB};
    use crate::types::{
        DrainSpec, DrainStatus, EvictionMethod, NodeMaintenanceSpec, Stage, TargetedPod,
    };
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

    const T0: i64 = 1_000_000;

    fn t(s: i64) -> Timestamp {
        Timestamp::from_second(T0 + s).unwrap()
    }

    fn nm(policy: TimeoutPolicy) -> NodeMaintenance {
        let mut o = NodeMaintenance::new(
            "m1",
            NodeMaintenanceSpec {
                node_name: "w1".into(),
                stage: Stage::Drain,
                reason: None,
                drain: DrainSpec {
                    timeout_policy: policy,
                    ..DrainSpec::default()
                },
            },
        );
        o.metadata.generation = Some(2);
        o
    }

    fn entry(name: &str, state: TargetState, blocked: Option<&str>) -> Entry {
        Entry {
            created: Some(t(0)),
            pod: TargetedPod {
                namespace: "shop".into(),
                name: name.into(),
                uid: Some(format!("uid-{name}")),
                state,
                method: (state != TargetState::Pending && blocked.is_none())
                    .then_some(EvictionMethod::Eviction),
                blocked_reason: blocked.map(Into::into),
                pod_disruption_budget: None,
                message: blocked.map(|r| format!("blocked by {r}")),
                attempts: 1,
                first_attempt_time: None,
                last_attempt_time: None,
                next_attempt_time: None,
            },
        }
    }

    fn cond(type_: &str, status: bool, reason: &str, message: &str, generation: i64) -> Condition {
        Condition {
            type_: type_.into(),
            status: if status { "True" } else { "False" }.into(),
            reason: reason.into(),
            message: message.into(),
            last_transition_time: Time(t(0)),
            observed_generation: Some(generation),
        }
    }

    /// The status before the step: these conditions, and a deadline at `t(deadline)`.
    fn status(conditions: Vec<Condition>, deadline: Option<i64>) -> NodeMaintenanceStatus {
        NodeMaintenanceStatus {
            drain: Some(DrainStatus {
                start_time: Some(Time(t(0))),
                deadline: deadline.map(|d| Time(t(d))),
                total_pods: Some(1),
            }),
            conditions,
            ..Default::default()
        }
    }

    fn set(type_: &'static str, status: bool, reason: &str, message: &str) -> Set {
        Set {
            type_,
            status,
            reason: reason.into(),
            message: message.into(),
        }
    }

    fn warning(reason: &'static str, message: &str) -> Notice {
        Notice {
            type_: EventType::Warning,
            reason,
            action: "Drain",
            message: message.into(),
        }
    }

    fn normal(reason: &'static str, message: &str) -> Notice {
        Notice {
            type_: EventType::Normal,
            ..warning(reason, message)
        }
    }

    const DEADLINE: &str = "1970-01-12T13:46:40Z"; // t(0)
    const OUT_OF_SERVICE: &str = "1 pods left to drain (1 terminating; if node w1 is gone for good, taint it node.kubernetes.io/out-of-service or set drain.skipWaitForDeleteTimeoutSeconds)";

    struct Case {
        /// The rule, then what the row shows.
        name: &'static str,
        policy: TimeoutPolicy,
        before: NodeMaintenanceStatus,
        entries: Vec<Entry>,
        consent: Option<&'static str>,
        selector_error: Option<&'static str>,
        now: i64,
        want: DrainConditions,
    }

    fn case(name: &'static str, before: NodeMaintenanceStatus, entries: Vec<Entry>) -> Case {
        Case {
            name,
            policy: TimeoutPolicy::Wait,
            before,
            entries,
            consent: None,
            selector_error: None,
            now: 10,
            want: DrainConditions::default(),
        }
    }

    fn not_blocked() -> Set {
        set(CONDITION_EVICTION_BLOCKED, false, "NotBlocked", "")
    }

    fn no_deadline() -> Set {
        set(CONDITION_DEADLINE_EXCEEDED, false, "NoDeadline", "")
    }

    fn draining(left: &str) -> Set {
        set(CONDITION_DRAINED, false, "Draining", left)
    }

    fn draining_cond() -> Condition {
        cond(
            CONDITION_DRAINED,
            false,
            "Draining",
            "1 pods left to drain",
            2,
        )
    }

    fn exceeded_cond(reason: &str) -> Condition {
        cond(CONDITION_DEADLINE_EXCEEDED, true, reason, "", 2)
    }

    /// Each row: `drain_conditions` returns exactly what it wants.
    fn check(cases: Vec<Case>) {
        for c in cases {
            let step = DrainStep {
                entries: &c.entries,
                consent: c.consent,
                selector_error: c.selector_error,
            };
            let got = drain_conditions(&nm(c.policy), &c.before, &step, t(c.now));
            assert_eq!(got, c.want, "{}", c.name);
        }
    }

    #[test]
    fn nm_9_an_invalid_selector_sets_only_drained_warned_once_per_generation() {
        check(vec![
            Case {
                selector_error: Some("bad selector"),
                want: DrainConditions {
                    set: vec![set(
                        CONDITION_DRAINED,
                        false,
                        REASON_INVALID_SELECTOR,
                        "bad selector",
                    )],
                    notices: vec![warning(REASON_INVALID_SELECTOR, "bad selector")],
                    ..Default::default()
                },
                ..case(
                    "NM-9: an invalid pod selector sets only Drained, and warns",
                    status(vec![], None),
                    vec![],
                )
            },
            Case {
                selector_error: Some("bad selector"),
                want: DrainConditions {
                    set: vec![set(
                        CONDITION_DRAINED,
                        false,
                        REASON_INVALID_SELECTOR,
                        "bad selector",
                    )],
                    ..Default::default()
                },
                ..case(
                    "NM-9: an invalid pod selector is warned once per generation",
                    status(
                        vec![cond(
                            CONDITION_DRAINED,
                            false,
                            REASON_INVALID_SELECTOR,
                            "bad selector",
                            2,
                        )],
                        None,
                    ),
                    vec![],
                )
            },
        ]);
    }

    #[test]
    fn nm_10_missing_consent_evicts_nothing_and_warns_when_the_message_changes() {
        let gone = || entry("a", TargetState::Gone, None);
        let pending = || entry("a", TargetState::Pending, None);
        let consent =
            "cannot delete Pods that declare no controller (use --force to override): shop/a";
        check(vec![
            Case {
                consent: Some(consent),
                want: DrainConditions {
                    set: vec![
                        set(CONDITION_DRAINED, false, "PodsRequireConsent", consent),
                        not_blocked(),
                        no_deadline(),
                    ],
                    notices: vec![warning("PodsRequireConsent", consent)],
                    ..Default::default()
                },
                ..case(
                    "NM-10: missing consent is not drained (even with every target gone), and warns",
                    status(vec![], None),
                    vec![gone()],
                )
            },
            Case {
                consent: Some(consent),
                want: DrainConditions {
                    set: vec![
                        set(CONDITION_DRAINED, false, "PodsRequireConsent", consent),
                        not_blocked(),
                        no_deadline(),
                    ],
                    ..Default::default()
                },
                ..case(
                    "NM-10: the same consent message is not warned again",
                    status(
                        vec![cond(
                            CONDITION_DRAINED,
                            false,
                            "PodsRequireConsent",
                            consent,
                            1,
                        )],
                        None,
                    ),
                    vec![pending()],
                )
            },
        ]);
    }

    #[test]
    fn nm_15_drained_once_every_target_is_gone_announced_once() {
        let gone = || entry("a", TargetState::Gone, None);
        check(vec![
            Case {
                want: DrainConditions {
                    set: vec![
                        set(
                            CONDITION_DRAINED,
                            true,
                            "DrainComplete",
                            "node w1 is drained",
                        ),
                        not_blocked(),
                        no_deadline(),
                    ],
                    notices: vec![normal("DrainComplete", "Drained node w1")],
                    drained: true,
                    ended: true,
                },
                ..case(
                    "NM-15: drained once every target is gone, announced and ended once",
                    status(vec![draining_cond()], None),
                    vec![gone()],
                )
            },
            Case {
                want: DrainConditions {
                    set: vec![
                        set(
                            CONDITION_DRAINED,
                            true,
                            "DrainComplete",
                            "node w1 is drained",
                        ),
                        not_blocked(),
                        no_deadline(),
                    ],
                    drained: true,
                    ..Default::default()
                },
                ..case(
                    "NM-15: an object already drained is not announced again",
                    status(
                        vec![cond(
                            CONDITION_DRAINED,
                            true,
                            "DrainComplete",
                            "node w1 is drained",
                            2,
                        )],
                        None,
                    ),
                    vec![gone()],
                )
            },
            Case {
                want: DrainConditions {
                    set: vec![
                        draining("1 pods left to drain"),
                        not_blocked(),
                        no_deadline(),
                    ],
                    ..Default::default()
                },
                ..case(
                    "NM-15: a pending target leaves the node draining",
                    status(vec![], None),
                    vec![gone(), entry("b", TargetState::Pending, None)],
                )
            },
        ]);
    }

    #[test]
    fn nm_22_terminating_targets_point_to_out_of_service() {
        check(vec![Case {
            want: DrainConditions {
                set: vec![draining(OUT_OF_SERVICE), not_blocked(), no_deadline()],
                ..Default::default()
            },
            ..case(
                "NM-22: terminating targets point to out-of-service",
                status(vec![], None),
                vec![entry("a", TargetState::Terminating, None)],
            )
        }]);
    }

    #[test]
    fn nm_16_nm_17_eviction_blocked_names_the_most_severe_block_first() {
        check(vec![Case {
            want: DrainConditions {
                set: vec![
                    draining("2 pods left to drain"),
                    set(
                        CONDITION_EVICTION_BLOCKED,
                        true,
                        REASON_DEADLOCK,
                        "shop/b blocked by PodDisruptionBudgetDeadlock; shop/a blocked by PodDisruptionBudget",
                    ),
                    no_deadline(),
                ],
                ..Default::default()
            },
            ..case(
                "NM-16, NM-17: EvictionBlocked names the blocked pods, most severe reason first",
                status(vec![], None),
                vec![
                    entry("a", TargetState::Blocked, Some(REASON_PDB)),
                    entry("b", TargetState::Blocked, Some(REASON_DEADLOCK)),
                ],
            )
        }]);
    }

    #[test]
    fn nm_18_within_the_deadline_or_drained_by_it() {
        let gone = || entry("a", TargetState::Gone, None);
        let pending = || entry("a", TargetState::Pending, None);
        check(vec![
            Case {
                want: DrainConditions {
                    set: vec![
                        draining("1 pods left to drain"),
                        not_blocked(),
                        set(
                            CONDITION_DEADLINE_EXCEEDED,
                            false,
                            "WithinDeadline",
                            &format!("deadline {}", t(20)),
                        ),
                    ],
                    ..Default::default()
                },
                ..case(
                    "NM-18: before the deadline, WithinDeadline",
                    status(vec![], Some(20)),
                    vec![pending()],
                )
            },
            Case {
                want: DrainConditions {
                    set: vec![
                        set(
                            CONDITION_DRAINED,
                            true,
                            "DrainComplete",
                            "node w1 is drained",
                        ),
                        not_blocked(),
                    ],
                    notices: vec![normal("DrainComplete", "Drained node w1")],
                    drained: true,
                    ended: true,
                },
                ..case(
                    "NM-18: drained past the deadline keeps DeadlineExceeded as it was",
                    status(vec![exceeded_cond("WaitingPastDeadline")], Some(0)),
                    vec![gone()],
                )
            },
            Case {
                want: DrainConditions {
                    set: vec![
                        set(
                            CONDITION_DRAINED,
                            true,
                            "DrainComplete",
                            "node w1 is drained",
                        ),
                        not_blocked(),
                        set(
                            CONDITION_DEADLINE_EXCEEDED,
                            false,
                            "WithinDeadline",
                            &format!("deadline {DEADLINE}"),
                        ),
                    ],
                    notices: vec![normal("DrainComplete", "Drained node w1")],
                    drained: true,
                    ended: true,
                },
                ..case(
                    "NM-18: drained at the deadline, never exceeded: WithinDeadline",
                    status(vec![], Some(0)),
                    vec![gone()],
                )
            },
        ]);
    }

    #[test]
    fn nm_18_past_the_deadline_deadline_exceeded_warned_once() {
        let pending = || entry("a", TargetState::Pending, None);
        check(vec![
            Case {
                want: DrainConditions {
                    set: vec![
                        draining("1 pods left to drain"),
                        not_blocked(),
                        set(
                            CONDITION_DEADLINE_EXCEEDED,
                            true,
                            "WaitingPastDeadline",
                            &format!("deadline {DEADLINE} passed"),
                        ),
                    ],
                    notices: vec![warning(
                        "DrainDeadlineExceeded",
                        &format!("Drain of node w1 not done by its deadline {DEADLINE}"),
                    )],
                    ..Default::default()
                },
                ..case(
                    "NM-18: Wait past the deadline: DeadlineExceeded, warned",
                    status(vec![], Some(0)),
                    vec![pending()],
                )
            },
            Case {
                policy: TimeoutPolicy::Delete,
                want: DrainConditions {
                    set: vec![
                        draining("1 pods left to drain"),
                        not_blocked(),
                        set(
                            CONDITION_DEADLINE_EXCEEDED,
                            true,
                            "DeletingPastDeadline",
                            &format!("deadline {DEADLINE} passed"),
                        ),
                    ],
                    ..Default::default()
                },
                ..case(
                    "NM-18: Delete past the deadline, already exceeded: one warning only",
                    status(vec![exceeded_cond("DeletingPastDeadline")], Some(0)),
                    vec![pending()],
                )
            },
        ]);
    }

    /// The caller sets what it is given: transition times kept for an unchanged status, the
    /// object's generation on each.
    #[test]
    fn apply_sets_each_condition_in_order() {
        let before = status(vec![draining_cond()], None);
        let step = DrainStep {
            entries: &[entry("a", TargetState::Pending, None)],
            ..Default::default()
        };
        let got = drain_conditions(&nm(TimeoutPolicy::Wait), &before, &step, t(10));
        let mut conditions = before.conditions.clone();
        got.apply(&mut conditions, t(10), Some(3));
        let types: Vec<&str> = conditions.iter().map(|c| c.type_.as_str()).collect();
        assert_eq!(
            types,
            [
                CONDITION_DRAINED,
                CONDITION_EVICTION_BLOCKED,
                CONDITION_DEADLINE_EXCEEDED
            ]
        );
        assert_eq!(conditions[0].last_transition_time, Time(t(0)));
        assert_eq!(conditions[1].last_transition_time, Time(t(10)));
        assert!(conditions.iter().all(|c| c.observed_generation == Some(3)));
    }
}
