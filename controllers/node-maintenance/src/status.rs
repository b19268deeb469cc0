//! The status an object should have (its fields, conditions and phase), computed purely:
//! conditions that keep their transition time, progress, `targetedPods` (blocked first, then
//! oldest, at most 512) and the `EvictionBlocked` summary; and the merge patch from the stored
//! status to it.

use crate::evict::severity;
use crate::types::{
    NodeMaintenanceStatus, Progress, Skipped, Stage, StageStatus, TargetState, TargetedPod,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use k8s_openapi::jiff::Timestamp;
use serde_json::{Map, Value};

/// At most this many targets are listed, each with a message of at most
/// [`MAX_POD_MESSAGE`] bytes: with every name, namespace and budget name at the API's longest
/// (253, 63, 253) a listed pod takes about 1.3 KiB, so the list stays near 650 KiB, well under
/// etcd's 1.5 MiB object limit (a status write over it would fail, and with it the drain).
pub const MAX_TARGETED_PODS: usize = 512;
/// The eviction answer kept per listed pod (the API server's refusal is a sentence or two).
pub const MAX_POD_MESSAGE: usize = 256;
/// The `EvictionBlocked` message names this many pods, then counts the rest.
pub const NAMED_IN_MESSAGE: usize = 5;

/// Sets condition `type_`, keeping `lastTransitionTime` unless the status changes.
pub fn set_condition(
    conditions: &mut Vec<Condition>,
    type_: &str,
    status: bool,
    reason: &str,
    message: impl Into<String>,
    now: Timestamp,
    generation: Option<i64>,
) {
    let status = if status { "True" } else { "False" };
    let message = message.into();
    let transition = conditions
        .iter()
        .find(|c| c.type_ == type_ && c.status == status)
        .map(|c| c.last_transition_time.clone())
        .unwrap_or(Time(now));
    let c = Condition {
        type_: type_.to_string(),
        status: status.to_string(),
        reason: reason.to_string(),
        // The API requires a message of at most 32768 bytes; ours are short but cut anyway.
        message: truncate(message, 32 * 1024),
        last_transition_time: transition,
        observed_generation: generation,
    };
    match conditions.iter_mut().find(|c| c.type_ == type_) {
        Some(existing) => *existing = c,
        None => conditions.push(c),
    }
}

pub fn condition<'a>(conditions: &'a [Condition], type_: &str) -> Option<&'a Condition> {
    conditions.iter().find(|c| c.type_ == type_)
}

pub fn is_true(conditions: &[Condition], type_: &str) -> bool {
    condition(conditions, type_).is_some_and(|c| c.status == "True")
}

/// `lastError` as the status keeps it: at most 1 KiB (an admission webhook's refusal can be
/// long, and the status must stay writable).
pub fn bounded_error(e: String) -> String {
    truncate(e, 1024)
}

fn truncate(mut s: String, max: usize) -> String {
    if s.len() > max {
        let mut cut = max;
        while !s.is_char_boundary(cut) {
            cut -= 1;
        }
        s.truncate(cut);
    }
    s
}

/// KEP-4212: an entry per stage when first acted on. Returns whether it was added.
pub fn note_stage(stages: &mut Vec<StageStatus>, stage: Stage, now: Timestamp) -> bool {
    if stages.iter().any(|s| s.name == stage) {
        return false;
    }
    stages.push(StageStatus {
        name: stage,
        start_time: Some(Time(now)),
    });
    true
}

/// One target with what orders it: its pod's creation time.
#[derive(Clone, Debug)]
pub struct Entry {
    pub created: Option<Timestamp>,
    pub pod: TargetedPod,
}

fn is_blocked(p: &TargetedPod) -> bool {
    p.state == TargetState::Blocked
}

/// Blocked first (most severe reason first), then oldest, then by name.
fn order(entries: &mut [Entry]) {
    entries.sort_by(|a, b| {
        let sev = |e: &Entry| {
            if is_blocked(&e.pod) {
                severity(e.pod.blocked_reason.as_deref().unwrap_or_default())
            } else {
                usize::MAX
            }
        };
        sev(a)
            .cmp(&sev(b))
            .then_with(|| a.created.cmp(&b.created))
            .then_with(|| (&a.pod.namespace, &a.pod.name).cmp(&(&b.pod.namespace, &b.pod.name)))
    });
}

/// Whether `a` is listed rather than `b`, a target of the same name: the pod still there, else
/// the newer.
fn listed_over(a: &Entry, b: &Entry) -> bool {
    let present = |e: &Entry| e.pod.state != TargetState::Gone;
    (present(a), a.created) > (present(b), b.created)
}

/// `targetedPods` and whether it was truncated. The API keys the list by namespace and name (a
/// duplicate fails every status write), so a pod replaced on the node by another of the same
/// name is listed once, as the one still there; progress counts both.
pub fn targeted_pods(entries: Vec<Entry>) -> (Vec<TargetedPod>, bool) {
    let mut by_name: std::collections::HashMap<(String, String), Entry> =
        std::collections::HashMap::new();
    for e in entries {
        let key = (e.pod.namespace.clone(), e.pod.name.clone());
        match by_name.entry(key) {
            std::collections::hash_map::Entry::Vacant(v) => {
                v.insert(e);
            }
            std::collections::hash_map::Entry::Occupied(mut o) => {
                if listed_over(&e, o.get()) {
                    o.insert(e);
                }
            }
        }
    }
    let mut entries: Vec<Entry> = by_name.into_values().collect();
    order(&mut entries);
    let truncated = entries.len() > MAX_TARGETED_PODS;
    entries.truncate(MAX_TARGETED_PODS);
    let pods = entries
        .into_iter()
        .map(|e| TargetedPod {
            message: e.pod.message.map(|m| truncate(m, MAX_POD_MESSAGE)),
            ..e.pod
        })
        .collect();
    (pods, truncated)
}

/// `status.progress` over every target ever selected; percent = evicted·100/targeted (100 if
/// none).
pub fn progress(entries: &[Entry], skipped: Skipped, truncated: bool) -> Progress {
    let count =
        |f: &dyn Fn(&TargetedPod) -> bool| entries.iter().filter(|e| f(&e.pod)).count() as i64;
    let targeted = entries.len() as i64;
    let evicted = count(&|p| p.state == TargetState::Gone && p.method.is_some());
    let percent = if targeted == 0 {
        100
    } else {
        (evicted.saturating_mul(100) / targeted).clamp(0, 100) as i32
    };
    Progress {
        targeted,
        evicted,
        terminating: count(&|p| p.state == TargetState::Terminating),
        pending: count(&|p| matches!(p.state, TargetState::Pending | TargetState::Blocked)),
        blocked: count(&|p| p.state == TargetState::Blocked),
        skipped,
        percent,
        truncated,
    }
}

/// NM-15: drained when no target is Pending, Blocked or Terminating.
pub fn drained(entries: &[Entry]) -> bool {
    entries.iter().all(|e| e.pod.state == TargetState::Gone)
}

/// `EvictionBlocked`: the most severe reason, and the first five blocked pods with what blocks
/// them, then a count.
pub fn eviction_blocked(entries: &[Entry]) -> Option<(String, String)> {
    let mut blocked: Vec<Entry> = entries
        .iter()
        .filter(|e| is_blocked(&e.pod))
        .cloned()
        .collect();
    if blocked.is_empty() {
        return None;
    }
    order(&mut blocked);
    let reason = blocked[0]
        .pod
        .blocked_reason
        .clone()
        .unwrap_or_else(|| crate::evict::REASON_ERROR.to_string());
    let mut parts: Vec<String> = blocked
        .iter()
        .take(NAMED_IN_MESSAGE)
        .map(|e| {
            format!(
                "{}/{} {}",
                e.pod.namespace,
                e.pod.name,
                e.pod.message.as_deref().unwrap_or("blocked")
            )
        })
        .collect();
    if blocked.len() > NAMED_IN_MESSAGE {
        parts.push(format!("and {} more", blocked.len() - NAMED_IN_MESSAGE));
    }
    Some((reason, parts.join("; ")))
}

/// Whether `new` must be written at once rather than within the second: the phase changed, a
/// target is listed that `old` did not list (no request goes to it before that is written), or
/// a target's eviction (or deletion) was accepted since `old`. Until such a change is written
/// only this leader knows it; a successor would find the pod gone with no record of it or of
/// why, and could not count it, so the record goes out at once.
pub fn write_now(old: &NodeMaintenanceStatus, new: &NodeMaintenanceStatus) -> bool {
    if old.phase != new.phase {
        return true;
    }
    fn key(p: &TargetedPod) -> (&str, &str, Option<&str>) {
        (p.namespace.as_str(), p.name.as_str(), p.uid.as_deref())
    }
    let listed: std::collections::HashMap<_, bool> = old
        .targeted_pods
        .iter()
        .map(|p| (key(p), p.method.is_some()))
        .collect();
    new.targeted_pods.iter().any(|p| match listed.get(&key(p)) {
        None => true,
        Some(recorded) => p.method.is_some() && !recorded,
    })
}

/// RFC 7386: the merge patch that turns `old` into `new` (lists replace, removed keys null).
pub fn merge_patch(old: &Value, new: &Value) -> Value {
    match (old, new) {
        (Value::Object(o), Value::Object(n)) => {
            let mut out = Map::new();
            for (k, v) in n {
                match o.get(k) {
                    Some(ov) if ov == v => {}
                    Some(ov @ Value::Object(_)) if v.is_object() => {
                        out.insert(k.clone(), merge_patch(ov, v));
                    }
                    _ => {
                        out.insert(k.clone(), v.clone());
                    }
                }
            }
            for k in o.keys() {
                if !n.contains_key(k) {
                    out.insert(k.clone(), Value::Null);
                }
            }
            Value::Object(out)
        }
        _ => new.clone(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::evict::{REASON_DEADLOCK, REASON_DENIED, REASON_PDB};
    use crate::types::EvictionMethod;
    use serde_json::json;

    fn t(s: i64) -> Timestamp {
        Timestamp::from_second(1_000_000 + s).unwrap()
    }

    fn entry(name: &str, created: i64, state: TargetState, reason: Option<&str>) -> Entry {
        Entry {
            created: Some(t(created)),
            pod: TargetedPod {
                namespace: "shop".into(),
                name: name.into(),
                uid: Some(format!("uid-{name}")),
                state,
                method: (state == TargetState::Gone || state == TargetState::Terminating)
                    .then_some(EvictionMethod::Eviction),
                blocked_reason: reason.map(Into::into),
                pod_disruption_budget: None,
                message: reason.map(|r| format!("blocked by {r}")),
                attempts: 0,
                first_attempt_time: None,
                last_attempt_time: None,
                next_attempt_time: None,
            },
        }
    }

    #[test]
    fn conditions_keep_their_transition_time() {
        let mut cs = Vec::new();
        set_condition(&mut cs, "Drained", false, "Draining", "", t(0), Some(1));
        set_condition(
            &mut cs,
            "Drained",
            false,
            "PodsRequireConsent",
            "x",
            t(5),
            Some(2),
        );
        assert_eq!(cs[0].last_transition_time, Time(t(0)));
        assert_eq!(cs[0].observed_generation, Some(2));
        set_condition(&mut cs, "Drained", true, "DrainComplete", "", t(9), Some(2));
        assert_eq!(cs[0].last_transition_time, Time(t(9)));
        assert_eq!(cs.len(), 1);
        assert!(is_true(&cs, "Drained"));
    }

    #[test]
    fn write_now_on_a_phase_change_or_a_newly_accepted_eviction() {
        use crate::types::Phase;
        let status = |phase, pods: Vec<Entry>| NodeMaintenanceStatus {
            phase: Some(phase),
            targeted_pods: pods.into_iter().map(|e| e.pod).collect(),
            ..Default::default()
        };
        let pending = || entry("a", 0, TargetState::Pending, None);
        let blocked = || entry("a", 0, TargetState::Blocked, Some(REASON_PDB));
        let terminating = || entry("a", 0, TargetState::Terminating, None);
        let gone = || entry("a", 0, TargetState::Gone, None);
        let other = || entry("b", 0, TargetState::Terminating, None);
        let mut replaced = terminating();
        replaced.pod.uid = Some("uid-a2".into());
        let d = Phase::Draining;
        let cases = [
            // Progress alone (a refusal, a retry) waits for the second.
            (
                status(d, vec![pending()]),
                status(d, vec![blocked()]),
                false,
            ),
            (
                status(d, vec![blocked()]),
                status(d, vec![pending()]),
                false,
            ),
            // A target found: listed at once, before any request for it.
            (status(d, vec![]), status(d, vec![pending()]), true),
            (
                status(d, vec![pending()]),
                status(d, vec![pending(), other()]),
                true,
            ),
            // Accepted: at once.
            (
                status(d, vec![pending()]),
                status(d, vec![terminating()]),
                true,
            ),
            (status(d, vec![blocked()]), status(d, vec![gone()]), true),
            (
                status(d, vec![terminating()]),
                status(d, vec![terminating(), other()]),
                true,
            ),
            // Already recorded: no hurry.
            (
                status(d, vec![terminating()]),
                status(d, vec![gone()]),
                false,
            ),
            // A new pod of the same name is another target.
            (
                status(d, vec![terminating()]),
                status(d, vec![replaced]),
                true,
            ),
            (
                status(d, vec![gone()]),
                status(Phase::Drained, vec![gone()]),
                true,
            ),
        ];
        for (i, (old, new, want)) in cases.iter().enumerate() {
            assert_eq!(write_now(old, new), *want, "case {i}");
        }
    }

    #[test]
    fn a_pod_replaced_under_its_name_is_listed_once_as_the_one_there() {
        let mut old = entry("db-0", 0, TargetState::Gone, None);
        old.pod.uid = Some("uid-old".into());
        let new = entry("db-0", 5, TargetState::Pending, None);
        for list in [
            vec![old.clone(), new.clone()],
            vec![new.clone(), old.clone()],
        ] {
            let (pods, truncated) = targeted_pods(list.clone());
            assert_eq!(pods.len(), 1);
            assert_eq!(pods[0].uid.as_deref(), Some("uid-db-0"));
            assert!(!truncated);
            let p = progress(&list, Skipped::default(), truncated);
            assert_eq!((p.targeted, p.evicted, p.pending), (2, 1, 1));
        }
        // Both gone: the newer.
        let mut newer_gone = new.clone();
        newer_gone.pod.state = TargetState::Gone;
        let (pods, _) = targeted_pods(vec![newer_gone, old]);
        assert_eq!(pods[0].uid.as_deref(), Some("uid-db-0"));
    }

    #[test]
    fn targeted_pods_blocked_first_then_oldest_capped() {
        let entries = vec![
            entry("old-pending", 1, TargetState::Pending, None),
            entry("new-blocked", 9, TargetState::Blocked, Some(REASON_PDB)),
            entry(
                "deadlocked",
                10,
                TargetState::Blocked,
                Some(REASON_DEADLOCK),
            ),
            entry("oldest-gone", 0, TargetState::Gone, None),
        ];
        let (pods, truncated) = targeted_pods(entries);
        let names: Vec<&str> = pods.iter().map(|p| p.name.as_str()).collect();
        assert_eq!(
            names,
            ["deadlocked", "new-blocked", "oldest-gone", "old-pending"]
        );
        assert!(!truncated);
        let many: Vec<Entry> = (0..1030i64)
            .map(|i| entry(&format!("p{i}"), i, TargetState::Pending, None))
            .collect();
        let p = progress(&many, Skipped::default(), true);
        let (pods, truncated) = targeted_pods(many);
        assert_eq!(pods.len(), MAX_TARGETED_PODS);
        assert!(truncated);
        assert_eq!(pods[0].name, "p0");
        assert_eq!((p.targeted, p.pending, p.percent), (1030, 1030, 0));
    }

    /// 5,000 blocked pods with the API's longest names, budget names and a long
    /// refusal each: the status stays under 1 MiB and still names the blockers first.
    #[test]
    fn the_status_of_a_drain_over_5000_blocked_pods_stays_under_a_mebibyte() {
        let long = |c: char, n: usize| std::iter::repeat_n(c, n).collect::<String>();
        let many: Vec<Entry> = (0..5000i64)
            .map(|i| {
                let mut e = entry(
                    &format!("{i:05}{}", long('p', 248)),
                    i,
                    TargetState::Blocked,
                    Some(REASON_PDB),
                );
                e.pod.namespace = long('n', 63);
                e.pod.pod_disruption_budget = Some(long('b', 253));
                e.pod.message = Some(long('m', 4096));
                e.pod.attempts = i64::MAX;
                e.pod.first_attempt_time = Some(Time(t(i)));
                e.pod.last_attempt_time = Some(Time(t(i)));
                e.pod.next_attempt_time = Some(Time(t(i)));
                e
            })
            .collect();
        let skipped = Skipped::default();
        let progress = progress(&many, skipped, true);
        let (pods, truncated) = targeted_pods(many);
        assert!(truncated);
        assert!(pods.iter().all(|p| p.state == TargetState::Blocked));
        assert!(
            pods[0].name.starts_with("00000"),
            "the oldest blocker first"
        );
        let status = NodeMaintenanceStatus {
            progress: Some(progress),
            targeted_pods: pods,
            last_error: Some(bounded_error(long('e', 4096))),
            ..Default::default()
        };
        let size = serde_json::to_vec(&status).unwrap().len();
        assert!(size < 1024 * 1024, "{size} bytes");
    }

    #[test]
    fn progress_counts_and_percent() {
        let entries = vec![
            entry("a", 0, TargetState::Gone, None),
            entry("b", 0, TargetState::Terminating, None),
            entry("c", 0, TargetState::Blocked, Some(REASON_PDB)),
            entry("d", 0, TargetState::Pending, None),
        ];
        let p = progress(
            &entries,
            Skipped {
                daemon_set: 1,
                mirror: 0,
                not_selected: 2,
            },
            false,
        );
        assert_eq!(
            (
                p.targeted,
                p.evicted,
                p.terminating,
                p.pending,
                p.blocked,
                p.percent
            ),
            (4, 1, 1, 2, 1, 25)
        );
        assert_eq!(progress(&[], Skipped::default(), false).percent, 100);
        assert!(!drained(&entries));
        assert!(drained(&entries[..1]));
        assert!(drained(&[]));
    }

    #[test]
    fn eviction_blocked_names_five_then_counts() {
        let mut entries: Vec<Entry> = (0..7)
            .map(|i| {
                entry(
                    &format!("p{i}"),
                    i,
                    TargetState::Blocked,
                    Some(REASON_DENIED),
                )
            })
            .collect();
        entries.push(entry(
            "db-0",
            100,
            TargetState::Blocked,
            Some(REASON_DEADLOCK),
        ));
        let (reason, message) = eviction_blocked(&entries).unwrap();
        assert_eq!(reason, REASON_DEADLOCK);
        assert!(
            message.starts_with("shop/db-0 blocked by PodDisruptionBudgetDeadlock; shop/p0 "),
            "{message}"
        );
        assert!(message.ends_with("; and 3 more"), "{message}");
        assert_eq!(eviction_blocked(&entries[..0]), None);
    }

    #[test]
    fn merge_patch_nulls_what_went_away() {
        let old = json!({"phase": "Draining", "drain": {"startTime": "a", "deadline": "b"}, "lastError": "x", "conditions": [1]});
        let new = json!({"phase": "Draining", "drain": {"startTime": "a"}, "conditions": [1, 2]});
        assert_eq!(
            merge_patch(&old, &new),
            json!({"drain": {"deadline": null}, "lastError": null, "conditions": [1, 2]})
        );
        assert_eq!(merge_patch(&new, &new), json!({}));
    }
}
