//! PX-1: the taint-eviction decisions at the API-valid extremes, as properties.
//! `tolerationSeconds` is any int64 (negative and zero mean "evict now", i64::MAX is accepted);
//! taint and toleration values are any strings (Lt/Gt compare them as decimal integers, which may
//! not parse or may be out of int64's range); keys may repeat (duplicate list entries).

use super::*;
use proptest::prelude::*;

fn word() -> impl Strategy<Value = String> {
    prop_oneof![
        Just(String::new()),
        Just("k".to_string()),
        Just("0".to_string()),
        Just("-1".to_string()),
        Just(i64::MAX.to_string()),
        Just(i64::MIN.to_string()),
        Just("99999999999999999999".to_string()),
        Just("007".to_string()),
        Just("x".repeat(253)),
        "[a-z0-9-]{0,6}",
    ]
}

fn seconds() -> impl Strategy<Value = Option<i64>> {
    prop_oneof![
        Just(None),
        Just(Some(i64::MAX)),
        Just(Some(i64::MIN)),
        Just(Some(0)),
        Just(Some(1)),
        Just(Some(-1)),
        any::<i64>().prop_map(Some),
    ]
}

fn taint() -> impl Strategy<Value = Taint> {
    (word(), prop::option::of(word())).prop_map(|(key, value)| Taint {
        key,
        value,
        effect: NO_EXECUTE.into(),
        time_added: None,
    })
}

fn toleration() -> impl Strategy<Value = Toleration> {
    (
        prop::option::of(word()),
        prop::option::of(prop::sample::select(vec![
            "", "Equal", "Exists", "Lt", "Gt",
        ])),
        prop::option::of(word()),
        prop::option::of(prop::sample::select(vec!["", NO_EXECUTE, "NoSchedule"])),
        seconds(),
    )
        .prop_map(|(key, op, value, effect, secs)| Toleration {
            key,
            operator: op.map(String::from),
            value,
            effect: effect.map(String::from),
            toleration_seconds: secs,
        })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    /// TE-2..TE-5 for any taints, tolerations (int64 seconds at both ends) and timer: never
    /// panics; `EvictAfter` only with the smallest positive seconds of the used tolerations; a
    /// waiting timer's deadline lies after now and not before its start.
    #[test]
    fn verdict_and_step_total(
        taints in prop::collection::vec(taint(), 0..4),
        tols in prop::collection::vec(toleration(), 0..5),
        cmp in any::<bool>(),
        timer_age in prop_oneof![Just(None), (0u64..1_000_000).prop_map(Some)],
        same_uid in any::<bool>(),
    ) {
        let v = verdict(&taints, &tols, cmp);
        if let Verdict::EvictAfter(d) = v {
            let used = matching_tolerations(&taints, &tols, cmp).expect("tolerated");
            let secs: Vec<i64> = used.iter().filter_map(|t| t.toleration_seconds).collect();
            prop_assert!(secs.iter().all(|s| *s > 0));
            prop_assert_eq!(Some(d.as_secs()), secs.iter().min().map(|s| *s as u64));
        }
        let now = Instant::now();
        let timer = timer_age.map(|age| {
            let start = now.checked_sub(Duration::from_secs(age)).unwrap_or(now);
            Timer {
                uid: if same_uid { "u" } else { "other" }.into(),
                start,
                deadline: shared::meta::clock::far_or(start, Duration::from_secs(age / 2)),
            }
        });
        match step(v, "u", timer.as_ref(), now) {
            Step::Wait(t) => {
                prop_assert!(t.deadline > now);
                prop_assert!(t.deadline >= t.start);
                prop_assert_eq!(t.uid, "u");
            }
            Step::Fire { due, .. } => prop_assert!(due <= now),
            Step::Idle | Step::Cancel { .. } => {
                prop_assert!(!matches!(v, Verdict::EvictNow));
            }
        }
    }
}

/// TE-3: tolerationSeconds = i64::MAX waits (capped at the runtime's far future) instead of
/// overflowing the timer's Instant; i64::MIN evicts at once.
#[test]
fn toleration_seconds_at_int64_ends() {
    let t = |secs| Toleration {
        operator: Some("Exists".into()),
        toleration_seconds: Some(secs),
        ..Default::default()
    };
    let taints = [Taint {
        key: "k".into(),
        effect: NO_EXECUTE.into(),
        ..Default::default()
    }];
    let now = Instant::now();
    let v = verdict(&taints, &[t(i64::MAX)], false);
    assert_eq!(v, Verdict::EvictAfter(Duration::from_secs(i64::MAX as u64)));
    match step(v, "u", None, now) {
        Step::Wait(timer) => assert!(timer.deadline > now),
        other => panic!("expected Wait, got {other:?}"),
    }
    assert_eq!(verdict(&taints, &[t(i64::MIN)], false), Verdict::EvictNow);
}
