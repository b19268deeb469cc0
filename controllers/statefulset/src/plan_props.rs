//! PX-1: the StatefulSet plan and status at the API-valid extremes, as properties.
//! apps/v1 validation: replicas, ordinals.start, partition and minReadySeconds ≥ 0 (up to
//! i32::MAX); maxUnavailable an integer ≥ 1 or a percentage (1%..100%; "0%" is tried too, as an
//! object written before that check); pods' ordinals come from their names (any i32, or -1 when
//! the name has none); Ready transition times anywhere in years 0001..9999; the SB-6 annotation any
//! Go duration.

use super::*;
use crate::status::{Inputs, compute};
use k8s_openapi::api::apps::v1::StatefulSetStatus;
use proptest::prelude::{
    Just, ProptestConfig, any, prop, prop_assert, prop_assert_eq, prop_oneof, proptest,
};
use proptest::strategy::Strategy as Gen;

const YEAR_1: i64 = -62_135_596_800;
const YEAR_9999: i64 = 253_402_207_200;

fn instant() -> impl Gen<Value = Timestamp> {
    prop_oneof![
        Just(YEAR_1),
        Just(YEAR_9999),
        Just(0i64),
        YEAR_1..=YEAR_9999
    ]
    .prop_map(|s| Timestamp::from_second(s).unwrap())
}

fn nonneg() -> impl Gen<Value = i32> {
    prop_oneof![
        Just(0),
        Just(1),
        Just(i32::MAX),
        Just(i32::MAX - 1),
        0..6i32,
        0..=i32::MAX
    ]
}

fn max_unavailable_in() -> impl Gen<Value = Option<IntOrString>> {
    prop_oneof![
        Just(None),
        prop_oneof![Just(1), Just(i32::MAX), 1..=i32::MAX].prop_map(|i| Some(IntOrString::Int(i))),
        prop_oneof![Just(0u32), Just(1), Just(100), 0..=100u32]
            .prop_map(|p| Some(IntOrString::String(format!("{p}%")))),
    ]
}

fn strategy() -> impl Gen<Value = Strategy> {
    prop_oneof![
        (nonneg(), max_unavailable_in()).prop_map(|(partition, max_unavailable)| {
            Strategy::RollingUpdate {
                partition,
                max_unavailable,
            }
        }),
        Just(Strategy::RollingUpdateBare),
        Just(Strategy::OnDelete),
        Just(Strategy::Recreate),
    ]
}

fn set_view() -> impl Gen<Value = SetView> {
    (
        nonneg(),
        prop_oneof![Just(0), Just(i32::MAX), Just(i32::MAX - 2), 0..4i32],
        any::<bool>(),
        strategy(),
        nonneg(),
        any::<bool>(),
        nonneg(),
        prop::option::of(prop_oneof![
            Just(Duration::ZERO),
            Just(Duration::MAX),
            Just(Duration::from_secs(i64::MAX as u64)),
            (0u64..100_000).prop_map(Duration::from_secs),
        ]),
    )
        .prop_map(
            |(replicas, start, parallel, strategy, min_ready, deleting, current, b6)| SetView {
                replicas,
                start,
                management: if parallel {
                    Management::Parallel
                } else {
                    Management::OrderedReady
                },
                strategy,
                min_ready_seconds: min_ready,
                deleting,
                current_revision: "old".into(),
                update_revision: "new".into(),
                status_current_replicas: current,
                stale_claims: vec![],
                replace_unavailable_after: b6,
            },
        )
}

fn pod_view() -> impl Gen<Value = PodView> {
    (
        prop_oneof![Just(-1), Just(0), Just(i32::MAX), 0..6i32, any::<i32>()],
        any::<bool>(),
        prop::option::of(prop::sample::select(vec![
            "",
            "Pending",
            "Running",
            "Succeeded",
            "Failed",
            "Unknown",
        ])),
        any::<bool>(),
        prop::option::of(instant()),
        any::<bool>(),
        (any::<bool>(), any::<bool>()),
        prop::option::of(instant()),
    )
        .prop_map(
            |(ordinal, new, phase, ready, ready_since, terminating, (id, refs), unready)| PodView {
                name: format!("web-{ordinal}"),
                ordinal,
                revision: if new { "new" } else { "old" }.into(),
                phase: phase.map(String::from),
                ready,
                ready_since,
                terminating,
                identity_ok: id,
                claim_refs_ok: refs,
                unready_since: unready,
            },
        )
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    /// ST-R: a Recreate plan creates nothing while a created pod of an old revision remains,
    /// and then deletes every such pod not already terminating.
    #[test]
    fn recreate_creates_nothing_while_an_old_pod_remains(
        set in set_view(),
        pods in prop::collection::vec(pod_view(), 0..8),
        now in instant(),
    ) {
        let mut set = set;
        set.strategy = Strategy::Recreate;
        let mut pods = pods;
        pods.sort_by_key(|p| p.ordinal);
        pods.dedup_by_key(|p| p.ordinal);
        let p = plan(&set, &pods, now);
        let old: Vec<&PodView> = pods
            .iter()
            .filter(|x| x.ordinal >= 0 && x.created() && x.revision != set.update_revision)
            .collect();
        let actions: Vec<&Action> = p.phases.iter().flat_map(|ph| &ph.actions).collect();
        if !old.is_empty() && !set.deleting {
            let creates = actions.iter().filter(|a| matches!(a, Action::CreatePod { .. })).count();
            prop_assert_eq!(creates, 0, "created while an old pod remains");
            let deleted: Vec<&str> = actions
                .iter()
                .filter_map(|a| match a {
                    Action::DeletePod { name, .. } => Some(name.as_str()),
                    _ => None,
                })
                .collect();
            for o in old.iter().filter(|x| !x.terminating) {
                prop_assert!(deleted.contains(&o.name.as_str()), "{} not deleted", o.name);
            }
            prop_assert_eq!(p.progressing, Some(crate::plan::RECREATE_DELETING));
        }
    }

    /// ST-6..ST-31, ST-40: never panics; M ≥ 1; U ≥ 0; no more creations than missing slots
    /// planned per sync; no pod deleted twice for one reason; status counts between 0 and the pods that exist.
    #[test]
    fn plan_and_status_total_at_extremes(
        set in set_view(),
        pods in prop::collection::vec(pod_view(), 0..8),
        now in instant(),
        generation in prop::option::of(prop_oneof![Just(i64::MAX), any::<i64>()]),
        collision in any::<i32>(),
    ) {
        // Pod names are unique in a namespace: one pod per ordinal (the name is derived from it).
        let mut pods = pods;
        pods.sort_by_key(|p| p.ordinal);
        pods.dedup_by_key(|p| p.ordinal);
        let p = plan(&set, &pods, now);
        prop_assert!(p.max_unavailable >= 1);
        prop_assert!(p.unavailable >= 0);
        let actions: Vec<&Action> = p.phases.iter().flat_map(|ph| &ph.actions).collect();
        let creates = actions.iter().filter(|a| matches!(a, Action::CreatePod { .. })).count();
        prop_assert!(creates <= MAX_MISSING);
        // A terminal old pod may be deleted twice in one Parallel sync: by ST-19 and again by
        // ST-28's phase 1, which sees the cached object (not yet terminating), as upstream 1.37
        // does (deletes tolerate NotFound). Never twice for the same reason.
        let mut deleted: Vec<(&str, Why)> = actions
            .iter()
            .filter_map(|a| match a {
                Action::DeletePod { name, why } => Some((name.as_str(), *why)),
                _ => None,
            })
            .collect();
        deleted.sort_unstable_by_key(|(n, w)| (*n, format!("{w:?}")));
        let n = deleted.len();
        deleted.dedup();
        prop_assert_eq!(n, deleted.len(), "a pod deleted twice for one reason");
        let mut names: Vec<&str> = deleted.iter().map(|(n, _)| *n).collect();
        names.dedup();
        prop_assert!(names.len() <= pods.len());
        let s = compute(
            &Inputs {
                set: &set,
                generation,
                old: &StatefulSetStatus::default(),
                collision_count: collision,
                now,
                progressing: p.progressing,
            },
            &pods,
        );
        for c in [
            Some(s.replicas),
            s.ready_replicas,
            s.available_replicas,
            s.current_replicas,
            s.updated_replicas,
        ] {
            let c = c.unwrap_or(0);
            prop_assert!(c >= 0 && c as usize <= pods.len());
        }
        prop_assert!(s.available_replicas <= s.ready_replicas);
    }

    /// ST-25 for every integer and percentage: at least 1, never overflowing.
    #[test]
    fn max_unavailable_total(m in max_unavailable_in(), replicas in nonneg()) {
        let v = max_unavailable(m.as_ref(), replicas).expect("valid values");
        prop_assert!(v >= 1);
        if let Some(IntOrString::String(pct)) = &m {
            let pct: i64 = pct.trim_end_matches('%').parse().unwrap();
            prop_assert!(i64::from(v) <= (pct * i64::from(replicas) / 100).max(1));
        }
    }
}
