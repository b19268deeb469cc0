//! Pure decisions of the taint-eviction controller (TE-2..TE-5): which NoExecute taints
//! a pod tolerates and for how long, and what that means for its eviction timer.

use k8s_openapi::api::core::v1::{Node, Taint, Toleration};
use std::time::Duration;
use tokio::time::Instant;

pub const NO_EXECUTE: &str = "NoExecute";

/// The node's NoExecute taints, in order.
pub fn no_execute_taints(node: &Node) -> Vec<Taint> {
    node.spec
        .as_ref()
        .and_then(|s| s.taints.as_ref())
        .map(|ts| {
            ts.iter()
                .filter(|t| t.effect == NO_EXECUTE)
                .cloned()
                .collect()
        })
        .unwrap_or_default()
}

/// The NoExecute taints compared as the controller compares them (key, value, effect), ignoring
/// `timeAdded` noise only when identical.
pub fn same_taints(a: &[Taint], b: &[Taint]) -> bool {
    a == b
}

/// Upstream's decimal-integer rule for `Lt`/`Gt` values: optional `-`, no leading zeros, digits,
/// and it must fit an i64.
fn parse_decimal_integer(v: &str) -> Option<i64> {
    let digits = v.strip_prefix('-').unwrap_or(v);
    let valid = !digits.is_empty()
        && digits.bytes().all(|b| b.is_ascii_digit())
        && (digits == "0" && !v.starts_with('-') || !digits.starts_with('0'));
    if valid { v.parse().ok() } else { None }
}

/// core/v1 `Toleration.ToleratesTaint`.
pub fn tolerates(t: &Toleration, taint: &Taint, comparison_operators: bool) -> bool {
    let effect = t.effect.as_deref().unwrap_or_default();
    if !effect.is_empty() && effect != taint.effect {
        return false;
    }
    let key = t.key.as_deref().unwrap_or_default();
    if !key.is_empty() && key != taint.key {
        return false;
    }
    let value = t.value.as_deref().unwrap_or_default();
    let taint_value = taint.value.as_deref().unwrap_or_default();
    match t.operator.as_deref().unwrap_or_default() {
        "" | "Equal" => value == taint_value,
        "Exists" => true,
        op @ ("Lt" | "Gt") if comparison_operators => {
            match (
                parse_decimal_integer(value),
                parse_decimal_integer(taint_value),
            ) {
                (Some(tol), Some(tnt)) => {
                    if op == "Lt" {
                        tnt < tol
                    } else {
                        tnt > tol
                    }
                }
                _ => false,
            }
        }
        _ => false,
    }
}

/// For each taint the first toleration that tolerates it (`GetMatchingTolerations`); `None` when
/// some taint is not tolerated.
pub fn matching_tolerations<'a>(
    taints: &[Taint],
    tolerations: &'a [Toleration],
    comparison_operators: bool,
) -> Option<Vec<&'a Toleration>> {
    taints
        .iter()
        .map(|taint| {
            tolerations
                .iter()
                .find(|t| tolerates(t, taint, comparison_operators))
        })
        .collect()
}

/// What the taints mean for a pod.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// No NoExecute taint, or every one tolerated forever.
    Stay,
    /// Some taint is not tolerated, or a used toleration has `tolerationSeconds <= 0`.
    EvictNow,
    /// Evict once the smallest used `tolerationSeconds` has passed.
    EvictAfter(Duration),
}

/// TE-2/TE-3 (`getMinTolerationTime`).
pub fn verdict(
    taints: &[Taint],
    tolerations: &[Toleration],
    comparison_operators: bool,
) -> Verdict {
    if taints.is_empty() {
        return Verdict::Stay;
    }
    let Some(used) = matching_tolerations(taints, tolerations, comparison_operators) else {
        return Verdict::EvictNow;
    };
    let mut min: Option<i64> = None;
    for s in used.iter().filter_map(|t| t.toleration_seconds) {
        if s <= 0 {
            return Verdict::EvictNow;
        }
        min = Some(min.map_or(s, |m| m.min(s)));
    }
    match min {
        None => Verdict::Stay,
        Some(s) => Verdict::EvictAfter(Duration::from_secs(s as u64)),
    }
}

/// A pending eviction of one pod.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Timer {
    /// The pod the timer was started for (a same-name successor does not inherit it).
    pub uid: String,
    /// When the pod became evictable (as this controller observed it).
    pub start: Instant,
    pub deadline: Instant,
}

/// What to do with a pod's timer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Step {
    /// Nothing pending and nothing to do.
    Idle,
    /// Drop the timer; `announce` when a live timer was cancelled ("Cancelling deletion").
    Cancel { announce: bool },
    /// Keep or (re)start the timer and look again at its deadline.
    Wait(Timer),
    /// Delete the pod now. `cancelled` when a live timer was replaced (upstream announces that
    /// cancellation before the immediate deletion); `due` is the time it was scheduled for.
    Fire { due: Instant, cancelled: bool },
}

/// TE-3..TE-5: the next step for a pod with `uid`, given its verdict, its current timer and now.
pub fn step(verdict: Verdict, uid: &str, timer: Option<&Timer>, now: Instant) -> Step {
    // A timer started for another pod of the same name is dropped silently.
    let timer = timer.filter(|t| t.uid == uid);
    match verdict {
        Verdict::Stay => match timer {
            Some(_) => Step::Cancel { announce: true },
            None => Step::Idle,
        },
        Verdict::EvictNow => match timer {
            // A running timer that is due fires as itself (no cancellation to announce).
            Some(t) if t.deadline <= now => Step::Fire {
                due: t.deadline,
                cancelled: false,
            },
            Some(_) => Step::Fire {
                due: now,
                cancelled: true,
            },
            None => Step::Fire {
                due: now,
                cancelled: false,
            },
        },
        Verdict::EvictAfter(d) => {
            // NB-5: the start is kept and the deadline follows the current minimum.
            let start = timer.map_or(now, |t| t.start);
            // tolerationSeconds may be up to i64::MAX: cap instead of overflowing the Instant.
            let deadline = shared::meta::clock::far_or(start, d);
            if deadline <= now {
                Step::Fire {
                    due: deadline,
                    cancelled: false,
                }
            } else {
                Step::Wait(Timer {
                    uid: uid.to_string(),
                    start,
                    deadline,
                })
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn taint(key: &str, value: &str) -> Taint {
        Taint {
            key: key.into(),
            value: Some(value.into()),
            effect: NO_EXECUTE.into(),
            time_added: None,
        }
    }

    fn tol(key: &str, op: &str, value: &str, effect: &str, secs: Option<i64>) -> Toleration {
        let s = |v: &str| (!v.is_empty()).then(|| v.to_string());
        Toleration {
            key: s(key),
            operator: s(op),
            value: s(value),
            effect: s(effect),
            toleration_seconds: secs,
        }
    }

    #[test]
    fn tolerates_matrix_te2() {
        let t = taint("example.com/q", "7");
        let cases = [
            // (toleration, comparison gate, tolerated)
            (
                tol("example.com/q", "Equal", "7", "NoExecute", None),
                false,
                true,
            ),
            (tol("example.com/q", "", "7", "", None), false, true),
            (
                tol("example.com/q", "Equal", "8", "NoExecute", None),
                false,
                false,
            ),
            (tol("example.com/q", "Exists", "", "", None), false, true),
            (tol("", "Exists", "", "", None), false, true),
            (tol("", "Exists", "", "NoSchedule", None), false, false),
            (tol("other", "Exists", "", "", None), false, false),
            (tol("example.com/q", "Gt", "5", "", None), true, true),
            (tol("example.com/q", "Gt", "7", "", None), true, false),
            (tol("example.com/q", "Lt", "5", "", None), true, false),
            (tol("example.com/q", "Lt", "8", "", None), true, true),
            // Gate off: comparison operators never match (upstream 1.37 default).
            (tol("example.com/q", "Gt", "5", "", None), false, false),
            // Values that are not decimal integers never match.
            (tol("example.com/q", "Gt", "05", "", None), true, false),
            (tol("example.com/q", "Gt", "+5", "", None), true, false),
            (tol("example.com/q", "Gt", "x", "", None), true, false),
            (
                tol("example.com/q", "Gt", "99999999999999999999", "", None),
                true,
                false,
            ),
            (tol("example.com/q", "Bogus", "7", "", None), true, false),
        ];
        for (i, (toleration, gate, want)) in cases.iter().enumerate() {
            assert_eq!(
                tolerates(toleration, &t, *gate),
                *want,
                "case {i}: {toleration:?}"
            );
        }
        assert!(tolerates(
            &tol("k", "Lt", "0", "", None),
            &taint("k", "-3"),
            true
        ));
        assert!(
            !tolerates(&tol("k", "Lt", "0", "", None), &taint("k", "-0"), true),
            "-0 is not a decimal integer"
        );
    }

    #[test]
    fn verdict_te3() {
        let q = taint("example.com/q", "7");
        let u = taint("node.kubernetes.io/unreachable", "");
        let exists = |k: &str, s: Option<i64>| tol(k, "Exists", "", "NoExecute", s);
        let cases: Vec<(Vec<Taint>, Vec<Toleration>, Verdict)> = vec![
            (vec![], vec![], Verdict::Stay),
            (vec![q.clone()], vec![], Verdict::EvictNow),
            (
                vec![q.clone()],
                vec![exists("example.com/q", None)],
                Verdict::Stay,
            ),
            (
                vec![q.clone()],
                vec![exists("example.com/q", Some(0))],
                Verdict::EvictNow,
            ),
            (
                vec![q.clone()],
                vec![exists("example.com/q", Some(-5))],
                Verdict::EvictNow,
            ),
            (
                vec![q.clone()],
                vec![exists("example.com/q", Some(15))],
                Verdict::EvictAfter(Duration::from_secs(15)),
            ),
            // Two taints: the minimum over the used tolerations.
            (
                vec![q.clone(), u.clone()],
                vec![
                    exists("example.com/q", Some(60)),
                    exists("node.kubernetes.io/unreachable", Some(30)),
                ],
                Verdict::EvictAfter(Duration::from_secs(30)),
            ),
            // One tolerated forever, the other for 30 s: 30 s.
            (
                vec![q.clone(), u.clone()],
                vec![
                    exists("example.com/q", None),
                    exists("node.kubernetes.io/unreachable", Some(30)),
                ],
                Verdict::EvictAfter(Duration::from_secs(30)),
            ),
            // One untolerated: now.
            (
                vec![q.clone(), u.clone()],
                vec![exists("example.com/q", None)],
                Verdict::EvictNow,
            ),
            // Only the first tolerating toleration counts (later, shorter ones are unused).
            (
                vec![q.clone()],
                vec![
                    exists("example.com/q", None),
                    exists("example.com/q", Some(1)),
                ],
                Verdict::Stay,
            ),
            // DaemonSet-style tolerations (no seconds) for not-ready/unreachable.
            (
                vec![u.clone()],
                vec![
                    exists("node.kubernetes.io/not-ready", None),
                    exists("node.kubernetes.io/unreachable", None),
                ],
                Verdict::Stay,
            ),
        ];
        for (i, (taints, tols, want)) in cases.iter().enumerate() {
            assert_eq!(verdict(taints, tols, false), *want, "case {i}");
        }
    }

    #[test]
    fn step_te3_te4_te5() {
        let t0 = Instant::now();
        let s = Duration::from_secs;
        let timer = |start: Instant, d: u64| Timer {
            uid: "u1".into(),
            start,
            deadline: start + s(d),
        };
        let cases: Vec<(Verdict, Option<Timer>, Instant, Step)> = vec![
            (Verdict::Stay, None, t0, Step::Idle),
            (
                Verdict::Stay,
                Some(timer(t0, 30)),
                t0 + s(5),
                Step::Cancel { announce: true },
            ),
            (
                Verdict::EvictNow,
                None,
                t0,
                Step::Fire {
                    due: t0,
                    cancelled: false,
                },
            ),
            // Untolerated while a timer runs: cancel (announced) and delete now.
            (
                Verdict::EvictNow,
                Some(timer(t0, 30)),
                t0 + s(5),
                Step::Fire {
                    due: t0 + s(5),
                    cancelled: true,
                },
            ),
            (
                Verdict::EvictAfter(s(30)),
                None,
                t0,
                Step::Wait(timer(t0, 30)),
            ),
            // Same verdict again keeps the start.
            (
                Verdict::EvictAfter(s(30)),
                Some(timer(t0, 30)),
                t0 + s(10),
                Step::Wait(timer(t0, 30)),
            ),
            // NB-5: the deadline follows the current minimum, from the original start.
            (
                Verdict::EvictAfter(s(120)),
                Some(timer(t0, 60)),
                t0 + s(10),
                Step::Wait(timer(t0, 120)),
            ),
            (
                Verdict::EvictAfter(s(5)),
                Some(timer(t0, 60)),
                t0 + s(10),
                Step::Fire {
                    due: t0 + s(5),
                    cancelled: false,
                },
            ),
            // Due.
            (
                Verdict::EvictAfter(s(30)),
                Some(timer(t0, 30)),
                t0 + s(30),
                Step::Fire {
                    due: t0 + s(30),
                    cancelled: false,
                },
            ),
            (
                Verdict::EvictNow,
                Some(timer(t0, 30)),
                t0 + s(31),
                Step::Fire {
                    due: t0 + s(30),
                    cancelled: false,
                },
            ),
        ];
        for (i, (v, t, now, want)) in cases.iter().enumerate() {
            assert_eq!(step(*v, "u1", t.as_ref(), *now), *want, "case {i}");
        }
        // A timer of a previous pod with the same name is not inherited.
        let old = Timer {
            uid: "old".into(),
            start: t0,
            deadline: t0 + s(1),
        };
        assert_eq!(step(Verdict::Stay, "u1", Some(&old), t0 + s(5)), Step::Idle);
        assert_eq!(
            step(Verdict::EvictAfter(s(30)), "u1", Some(&old), t0 + s(5)),
            Step::Wait(Timer {
                uid: "u1".into(),
                start: t0 + s(5),
                deadline: t0 + s(35)
            })
        );
    }

    #[test]
    fn decimal_integers() {
        for (v, want) in [
            ("0", Some(0)),
            ("7", Some(7)),
            ("-3", Some(-3)),
            ("-0", None),
            ("007", None),
            ("", None),
            ("-", None),
            ("1e3", None),
            ("9223372036854775807", Some(i64::MAX)),
            ("9223372036854775808", None),
        ] {
            assert_eq!(parse_decimal_integer(v), want, "{v:?}");
        }
    }
}

#[cfg(test)]
#[path = "plan_props.rs"]
mod props;
