//! PX-1: the node-lifecycle decisions at the API-valid extremes, as properties. Node
//! conditions are a list the kubelet (or anyone with nodes/status) writes: a type may repeat
//! (duplicate list keys), statuses may be odd, times anywhere in years 0001..9999; taints are
//! unique by (key, effect) (validation) but any mix of ours and others'; `spec.unschedulable`.

use super::*;
use k8s_openapi::api::core::v1::{NodeCondition, NodeSpec, NodeStatus};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use proptest::prelude::*;
use std::collections::BTreeMap;

const YEAR_1: i64 = -62_135_596_800;
const YEAR_9999: i64 = 253_402_207_200;

fn instant() -> impl Strategy<Value = Timestamp> {
    prop_oneof![Just(YEAR_1), Just(YEAR_9999), YEAR_1..=YEAR_9999]
        .prop_map(|s| Timestamp::from_second(s).unwrap())
}

fn conditions() -> impl Strategy<Value = Vec<NodeCondition>> {
    prop::collection::vec(
        (
            prop::sample::select(vec![
                "Ready",
                "MemoryPressure",
                "DiskPressure",
                "PIDPressure",
                "NetworkUnavailable",
                "Other",
            ]),
            prop::sample::select(vec!["True", "False", "Unknown", ""]),
            prop::option::of(instant()),
        ),
        0..8,
    )
    .prop_map(|cs| {
        cs.into_iter()
            .map(|(type_, status, at)| NodeCondition {
                type_: type_.into(),
                status: status.into(),
                last_heartbeat_time: at.map(Time),
                last_transition_time: at.map(Time),
                ..Default::default()
            })
            .collect()
    })
}

fn taint_list() -> impl Strategy<Value = Vec<Taint>> {
    prop::collection::vec(
        (
            prop::sample::select(vec![
                NOT_READY,
                UNREACHABLE,
                UNSCHEDULABLE,
                MEMORY_PRESSURE,
                DISK_PRESSURE,
                PID_PRESSURE,
                NETWORK_UNAVAILABLE,
                "example.com/other",
                "",
            ]),
            prop::sample::select(vec![NO_SCHEDULE, NO_EXECUTE, "PreferNoSchedule"]),
            prop::option::of(prop::sample::select(vec!["", "v"])),
        ),
        0..8,
    )
    .prop_map(|ts| {
        // Unique by (key, effect), as validation requires.
        let mut seen = BTreeMap::new();
        for (key, effect, value) in ts {
            seen.entry((key, effect)).or_insert(Taint {
                key: key.into(),
                effect: effect.into(),
                value: value.map(String::from),
                time_added: None,
            });
        }
        seen.into_values().collect()
    })
}

fn node(conditions: Vec<NodeCondition>, taints: Vec<Taint>, unschedulable: bool) -> Node {
    Node {
        metadata: ObjectMeta {
            name: Some("n".into()),
            creation_timestamp: Some(Time(Timestamp::from_second(YEAR_1).unwrap())),
            ..Default::default()
        },
        spec: Some(NodeSpec {
            taints: Some(taints),
            unschedulable: Some(unschedulable),
            ..Default::default()
        }),
        status: Some(NodeStatus {
            conditions: Some(conditions),
            ..Default::default()
        }),
    }
}

fn with_taints(mut n: Node, taints: Vec<Taint>) -> Node {
    n.spec.as_mut().unwrap().taints = Some(taints);
    n
}

fn keys(taints: &[Taint]) -> Vec<(String, String)> {
    let mut k: Vec<(String, String)> = taints
        .iter()
        .map(|t| (t.key.clone(), t.effect.clone()))
        .collect();
    k.sort();
    k
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    /// NL-4: every watched condition's first entry ends Unknown; none is lost; missing ones are
    /// added once; a second pass changes nothing.
    #[test]
    fn stale_conditions_total(cs in conditions(), now in instant()) {
        let n = node(cs.clone(), vec![], false);
        let Some(out) = stale_conditions(&n, now) else {
            for t in WATCHED_CONDITIONS {
                let first = cs.iter().find(|c| c.type_ == t);
                prop_assert_eq!(first.map(|c| c.status.as_str()), Some("Unknown"));
            }
            return Ok(());
        };
        let missing = WATCHED_CONDITIONS
            .iter()
            .filter(|t| !cs.iter().any(|c| c.type_ == **t))
            .count();
        prop_assert_eq!(out.len(), cs.len() + missing);
        for t in WATCHED_CONDITIONS {
            let first = out.iter().find(|c| c.type_ == t).expect("present");
            prop_assert_eq!(first.status.as_str(), "Unknown");
        }
        prop_assert_eq!(stale_conditions(&node(out, vec![], false), now), None);
    }

    /// NL-8: applying the NoSchedule change gives exactly the desired owned taints, keeps every
    /// other taint, never doubles one, and leaves nothing more to change.
    #[test]
    fn no_schedule_change_converges(
        cs in conditions(),
        ts in taint_list(),
        unschedulable in any::<bool>(),
        now in instant(),
    ) {
        let n = node(cs, ts.clone(), unschedulable);
        let after = no_schedule_change(&n).apply(&ts, now);
        let k = keys(&after);
        let mut dedup = k.clone();
        dedup.dedup();
        prop_assert_eq!(&k, &dedup, "a taint doubled");
        for t in ts.iter().filter(|t| t.effect != NO_SCHEDULE || !owned_no_schedule_key(&t.key)) {
            prop_assert!(after.contains(t), "a taint not ours was lost: {:?}", t);
        }
        let n2 = with_taints(n, after);
        prop_assert!(no_schedule_change(&n2).is_empty());
    }

    /// NL-9/NL-11: after the NoExecute step's change (or the token's), the node needs no swap,
    /// and never carries both NoExecute taints.
    #[test]
    fn no_execute_converges(cs in conditions(), ts in taint_list(), now in instant()) {
        let n = node(cs, ts.clone(), false);
        let change = match no_execute_step(&n) {
            NoExecuteStep::Keep => TaintChange::default(),
            NoExecuteStep::Swap(c) | NoExecuteStep::Clear(c) => c,
            NoExecuteStep::Enqueue => tainting_change(&n).expect("not Ready: a change"),
        };
        let after = change.apply(&ts, now);
        let n2 = with_taints(n, after.clone());
        let both = [NOT_READY, UNREACHABLE]
            .iter()
            .all(|k| after.iter().any(|t| t.key == *k && t.effect == NO_EXECUTE));
        prop_assert!(!both);
        match no_execute_step(&n2) {
            NoExecuteStep::Keep => {}
            NoExecuteStep::Clear(c) => prop_assert!(c.is_empty()),
            other => prop_assert!(false, "not converged: {:?}", other),
        }
    }

    /// NL-12: any counts and any threshold flag (NaN, negative, above 1) give a state.
    #[test]
    fn zone_state_total(
        ready in prop_oneof![Just(0usize), Just(usize::MAX / 2), 0..10usize],
        not_ready in prop_oneof![Just(0usize), Just(usize::MAX / 2), 0..10usize],
        threshold in prop_oneof![Just(f32::NAN), Just(-1.0f32), Just(0.0), Just(0.55), Just(2.0), any::<f32>()],
    ) {
        let s = zone_state(ready, not_ready, threshold);
        prop_assert_eq!(s == ZoneState::FullDisruption, ready == 0 && not_ready > 0);
    }
}
