//! Issue 18 §3: the runbook (docs/migration.md) end to end. kube-controller-manager runs every
//! controller; Jobs have pods mid-flight (with tracking finalizers), a CronJob runs every minute
//! and a pod waits out its toleration of a NoExecute taint. The job, cronjob and taint-eviction
//! controllers are then turned off in kcm (restarted with the new `--controllers`, as a static
//! pod edit does) and Pilothouse is started as its ServiceAccount: every Job completes with exact
//! counts and no extra pod, no pod keeps the finalizer, the tainted pod is deleted once, no
//! CronJob minute is missed, and the double-run guard stays quiet. Then back: Pilothouse stopped,
//! kcm restarted with all its controllers, and a new Job completes under kcm.

use anyhow::{Context, Result, ensure};
use k8s_openapi::api::batch::v1::CronJob;
use kube::api::{Api, PostParams};
use pilothouse_tests::cluster::ClusterOptions;
use pilothouse_tests::harness::{cluster, log_dir, trial};
use pilothouse_tests::jobs::{self, Jobs};
use pilothouse_tests::{Pilothouse, audit, k8s, wait};
use serde_json::json;
use std::time::Duration;

const HANDED: [&str; 3] = [
    "job-controller",
    "cronjob-controller",
    "taint-eviction-controller",
];
const TAINT: &str = "pilothouse.test/handover";

async fn kcm_to_pilothouse_and_back() -> Result<()> {
    let client = cluster().client().await?;
    let ns = cluster().namespace("handover").await?;
    k8s::wait_service_account(&client, &ns).await?;
    let j = Jobs::new(client.clone(), &ns);

    let pods = j.pods.clone();
    let victim_created =
        k8s::tolerating_pod_on_tainted_node(&client, &ns, "zone-handover", TAINT, 40).await?;

    j.create(&jobs::job(
        "plain",
        json!({"completions": 6, "parallelism": 2}),
        jobs::template(Some(0), "4s"),
    )?)
    .await?;
    j.create(&jobs::job(
        "indexed",
        json!({"completions": 4, "parallelism": 2, "completionMode": "Indexed"}),
        jobs::template(Some(0), "4s"),
    )?)
    .await?;
    let cron: CronJob = serde_json::from_value(json!({
        "metadata": {"name": "minutely"},
        "spec": {
            "schedule": "* * * * *",
            "successfulJobsHistoryLimit": 10,
            "jobTemplate": {"spec": {"template": jobs::template(Some(0), "1s")}}
        }
    }))?;
    Api::<CronJob>::namespaced(client.clone(), &ns)
        .create(&PostParams::default(), &cron)
        .await?;

    // Mid-flight under kcm: some pods done, others running with the tracking finalizer.
    for name in ["plain", "indexed"] {
        wait::until(
            "a Job mid-flight under kube-controller-manager",
            Duration::from_secs(60),
            Duration::from_millis(200),
            || async {
                let job = j.get(name).await?;
                let (active, _, _, succeeded, _) = jobs::counts(&job);
                let tracked = j.pods_of(name).await?.iter().any(jobs::has_finalizer);
                Ok((succeeded >= 1 && active >= 1 && tracked).then_some(()))
            },
        )
        .await?;
    }

    // Switch over, as docs/migration.md says: kcm first, then Pilothouse.
    let disabled: String = HANDED.iter().map(|c| format!(",-{c}")).collect();
    cluster()
        .restart_kube_controller_manager(&format!("*{disabled}"))
        .await?;
    let switched = k8s_openapi::jiff::Timestamp::now();
    let kubeconfig = cluster().pilothouse_service_account_kubeconfig()?;
    let mut p = Pilothouse::spawn(
        "handover",
        &kubeconfig,
        &log_dir(),
        &[format!("--controllers={}", HANDED.join(","))],
    )?;
    p.wait_log("starting controller", Duration::from_secs(60))
        .await?;
    let leading = k8s_openapi::jiff::Timestamp::now();

    // Exact counts: no pod created twice, every pod's finalizer gone.
    for (name, completions) in [("plain", 6), ("indexed", 4)] {
        j.expect_complete(name, completions, Duration::from_secs(90))
            .await?;
    }
    let indexed = j.get("indexed").await?;
    let done = indexed
        .status
        .as_ref()
        .and_then(|s| s.completed_indexes.clone());
    ensure!(done.as_deref() == Some("0-3"), "completedIndexes {done:?}");

    // The tainted pod: deleted once, when its 40 s ran out (the clock restarts when a new
    // taint-eviction controller first sees the pod, as kcm's own restart would).
    let deleted = wait::until(
        "the tolerating pod deleted",
        Duration::from_secs(90),
        Duration::from_millis(200),
        || async {
            let pod = pods.get("victim").await?;
            Ok(pod.metadata.deletion_timestamp.map(|t| t.0))
        },
    )
    .await?;
    let after_create = deleted.duration_since(victim_created).as_secs_f64();
    let after_switch = deleted.duration_since(switched).as_secs_f64();
    let after_leading = deleted.duration_since(leading).as_secs_f64();
    // The clock that matters: from Pilothouse's taint-eviction controller starting (its own
    // log's time) to the API server receiving its DELETE (the audit log's), free of this test's
    // polling and of deletionTimestamp's grace period and whole seconds.
    let started = p
        .log_text()
        .lines()
        .find(|l| l.contains("starting controller controller=\"taint-eviction-controller\""))
        .and_then(|l| {
            l.split_whitespace()
                .next()?
                .parse::<k8s_openapi::jiff::Timestamp>()
                .ok()
        })
        .context("no start of taint-eviction-controller in Pilothouse's log")?;
    tokio::time::sleep(Duration::from_secs(3)).await;
    let delete = audit::read(&cluster().audit_log())?
        .iter()
        .filter(|e| {
            e.stage == "ResponseComplete"
                && e.verb == "delete"
                && e.user_agent
                    .ends_with("pilothouse/taint-eviction-controller")
                && e.object_ref.as_ref().is_some_and(|o| {
                    o.resource == "pods" && o.namespace == ns && o.name == "victim"
                })
        })
        .filter_map(|e| e.received())
        .min()
        .context("no DELETE of the victim by Pilothouse's taint-eviction-controller")?;
    let toleration = delete.duration_since(started).as_secs_f64();
    println!(
        "MEASURE handover: victim deleted {after_create:.1}s after creation, {after_switch:.1}s after the switch, {after_leading:.1}s after Pilothouse led (polled); DELETE received {toleration:.3}s after taint-eviction-controller started"
    );
    ensure!(
        after_create >= 39.0 && (39.9..=43.0).contains(&toleration),
        "deleted {after_create:.1}s after creation, DELETE {toleration:.3}s after taint-eviction-controller started"
    );

    // CronJob: a slot after the switch has its Job (Pilothouse ran it: the test may have
    // started early in a minute, with no slot yet), and every minute from the first slot to the
    // latest has its one Job.
    let after_switch_minute = switched.as_second().div_euclid(60) + 1;
    let slots = wait::until(
        "a CronJob Job for a minute after the switch",
        Duration::from_secs(90),
        Duration::from_millis(500),
        || async {
            let slots = j.cron_minutes("minutely").await?;
            Ok(slots
                .iter()
                .any(|m| *m >= after_switch_minute)
                .then_some(slots))
        },
    )
    .await?;
    let (first, last) = (slots.iter().min(), slots.iter().max());
    if let (Some(first), Some(last)) = (first, last) {
        let missed: Vec<i64> = (*first..=*last).filter(|m| !slots.contains(m)).collect();
        ensure!(
            missed.is_empty(),
            "CronJob minutes missed: {missed:?} of {slots:?}"
        );
    }
    ensure!(!slots.is_empty(), "the CronJob ran no Job");

    // The guard saw no kcm write after the switch (kcm's earlier writes are not conflicts).
    let (code, body) = p.http_get("/readyz").await?;
    ensure!(code == 200, "readyz after the switch: {code} {body}");

    // No double action: the victim was deleted by one controller, once.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let deletes: Vec<String> = audit::read(&cluster().audit_log())?
        .into_iter()
        .filter(|e| {
            e.stage == "ResponseComplete"
                && e.verb == "delete"
                && e.object_ref
                    .as_ref()
                    .is_some_and(|o| o.namespace == ns && o.name == "victim")
                && (e.user_agent.contains("kube-controller-manager")
                    || e.user_agent
                        .ends_with("pilothouse/taint-eviction-controller"))
        })
        .map(|e| format!("{} ({})", e.user.username, e.user_agent))
        .collect();
    ensure!(deletes.len() == 1, "victim deletions: {deletes:?}");

    // And back: Pilothouse stopped first (it releases the Lease), then kcm with everything.
    p.sigterm()?;
    let status = p.wait_exit(Duration::from_secs(30)).await?;
    ensure!(status.success(), "pilothouse exit {status}");
    cluster().restart_kube_controller_manager("*").await?;
    j.create(&jobs::job(
        "after",
        json!({"completions": 2, "parallelism": 2}),
        jobs::template(Some(0), "1s"),
    )?)
    .await?;
    let job = j.wait_finished("after", Duration::from_secs(90)).await?;
    ensure!(
        jobs::condition(&job, "Complete").is_some() && jobs::counts(&job).3 == 2,
        "after the switch back: {:?}",
        job.status
    );
    k8s::release_pods(&client, &ns).await?;
    Ok(())
}

fn main() -> ! {
    pilothouse_tests::harness::main(
        "handover",
        ClusterOptions {
            reference: true,
            ..Default::default()
        },
        None,
        vec![trial(
            "kcm_to_pilothouse_and_back",
            kcm_to_pilothouse_and_back,
        )],
    )
}
