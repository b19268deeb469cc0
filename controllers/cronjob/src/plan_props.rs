//! PX-1: the CronJob plan at the API-valid extremes, as properties. Schedules the API
//! server accepts (five fields, descriptors, `@every` up to Go's largest duration, dates that
//! never come such as 30 February), IANA zones with odd offsets and DST rules, times anywhere in
//! `metav1.Time`'s range (years 0001..9999), `startingDeadlineSeconds` from 0 to i64::MAX and
//! history limits from 0 to i32::MAX.

use super::*;
use crate::schedule::{ZoneSource, parse};
use k8s_openapi::api::batch::v1::{CronJobSpec, JobCondition, JobStatus, JobTemplateSpec};
use proptest::prelude::*;

const YEAR_1: i64 = -62_135_596_800;
/// The last second jiff's Timestamp holds (9999-12-30T22:00:00Z).
const YEAR_9999: i64 = 253_402_207_200;

struct Zones;
impl ZoneSource for Zones {
    fn load(&self, name: &str) -> Result<Zone, String> {
        Zone::load(name, &Zone::utc())
    }
    fn local(&self) -> Zone {
        Zone::utc()
    }
}

fn instant() -> impl Strategy<Value = Timestamp> {
    prop_oneof![
        Just(YEAR_1),
        Just(YEAR_9999),
        Just(YEAR_9999 - 60),
        Just(0i64),
        YEAR_1..=YEAR_9999,
        1_700_000_000i64..1_800_000_000,
    ]
    .prop_map(|s| Timestamp::from_second(s).unwrap())
}

fn schedule() -> impl Strategy<Value = &'static str> {
    prop::sample::select(vec![
        "* * * * *",
        "*/5 * * * *",
        "0 0 29 2 *",
        "0 0 30 2 *",
        "0 0 31 4 *",
        "30 2 * * *",
        "0 0 1 1 *",
        "59 23 31 12 6",
        "0-59 0-23 1-31 1-12 0-6",
        "@yearly",
        "@hourly",
        "@every 1s",
        "@every 2562047h47m16.854775807s",
    ])
}

fn zone() -> impl Strategy<Value = Option<&'static str>> {
    prop::sample::select(vec![
        None,
        Some("UTC"),
        Some("America/New_York"),
        Some("Asia/Kathmandu"),
        Some("Australia/Lord_Howe"),
        Some("Pacific/Kiritimati"),
    ])
}

fn finished_job(i: usize, condition: &str, start: Option<Timestamp>) -> Job {
    Job {
        metadata: ObjectMeta {
            name: Some(format!("j{i}")),
            namespace: Some("ns".into()),
            uid: Some(format!("u{i}")),
            ..Default::default()
        },
        spec: None,
        status: Some(JobStatus {
            start_time: start.map(Time),
            conditions: Some(vec![JobCondition {
                type_: condition.into(),
                status: "True".into(),
                ..Default::default()
            }]),
            ..Default::default()
        }),
    }
}

fn limit() -> impl Strategy<Value = Option<i32>> {
    prop_oneof![
        Just(None),
        Just(Some(0)),
        Just(Some(i32::MAX)),
        (0..4i32).prop_map(Some)
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    /// CR-22..CR-31 for any accepted schedule, zone, policy and times: never panics; a start is
    /// for a slot not after now; a wait is finite.
    #[test]
    fn plan_total_at_extremes(
        spec in schedule(),
        tz in zone(),
        upstream in any::<bool>(),
        created in instant(),
        last in prop::option::of(instant()),
        now in instant(),
        sds in prop_oneof![Just(None), Just(Some(0i64)), Just(Some(i64::MAX)), (0..=i64::MAX).prop_map(Some)],
        policy_name in prop::sample::select(vec!["Allow", "Forbid", "Replace"]),
        active in prop::collection::vec(prop_oneof![Just(0i64), Just(i64::MAX), any::<i64>()], 0..3),
    ) {
        let text = tz.map_or(spec.to_string(), |z| format!("CRON_TZ={z} {spec}"));
        let sched = parse(&text, &Zones).expect("an accepted schedule parses");
        let cj = CronJob {
            metadata: ObjectMeta {
                name: Some("cj".into()),
                namespace: Some("ns".into()),
                uid: Some("cj-uid".into()),
                creation_timestamp: Some(Time(created)),
                ..Default::default()
            },
            spec: CronJobSpec {
                schedule: spec.into(),
                time_zone: tz.map(String::from),
                starting_deadline_seconds: sds,
                concurrency_policy: Some(policy_name.into()),
                job_template: JobTemplateSpec::default(),
                ..Default::default()
            },
            status: Some(CronJobStatus {
                last_schedule_time: last.map(Time),
                // Jobs that may no longer exist, with any minute in their names.
                active: Some(
                    active
                        .iter()
                        .map(|m| ObjectReference {
                            name: Some(format!("cj-{m}")),
                            namespace: Some("ns".into()),
                            uid: Some(format!("gone-{m}")),
                            ..Default::default()
                        })
                        .collect(),
                ),
                ..Default::default()
            }),
        };
        let policy = if upstream { DstPolicy::Upstream } else { DstPolicy::Cron };
        let p = plan(&cj, now, &sched, policy, None);
        if let Decision::Start { scheduled, .. } = p.decision {
            prop_assert!(scheduled <= now);
            let _ = job_name(&cj, scheduled);
            let _ = rfc1123z(scheduled);
            let _ = job_for(&cj, scheduled, &sched.zone);
        }
        let _ = requeue_after(&cj, now, &sched, policy);
    }

    /// CR-32: the history to delete never exceeds the finished Jobs beyond each limit, for any
    /// limit up to i32::MAX and start times at both ends of the range.
    #[test]
    fn history_bounded(
        ok in limit(),
        bad in limit(),
        jobs in prop::collection::vec((any::<bool>(), prop::option::of(instant())), 0..8),
    ) {
        let jobs: Vec<Job> = jobs
            .iter()
            .enumerate()
            .map(|(i, (complete, start))| {
                finished_job(i, if *complete { "Complete" } else { "Failed" }, *start)
            })
            .collect();
        let refs: Vec<&Job> = jobs.iter().collect();
        let cj = CronJob {
            spec: CronJobSpec {
                successful_jobs_history_limit: ok,
                failed_jobs_history_limit: bad,
                ..Default::default()
            },
            ..Default::default()
        };
        let gone = history_to_delete(&cj, &refs);
        let count = |c: &str| jobs.iter().filter(|j| finished_condition(j) == Some(c)).count();
        let excess = |n: usize, l: Option<i32>| l.map_or(0, |l| n.saturating_sub(l as usize));
        prop_assert_eq!(
            gone.len(),
            excess(count("Complete"), ok) + excess(count("Failed"), bad)
        );
    }

    /// A schedule is the user's string: parsing any string returns, never panics.
    #[test]
    fn parse_any_string(s in "\\PC{0,40}", prefix in prop::sample::select(vec!["", "TZ=", "CRON_TZ=", "@every ", "@"])) {
        let _ = parse(&format!("{prefix}{s}"), &Zones);
    }
}
