//! Issue 17 §3: one API budget per controller, as `--kube-api-qps/--kube-api-burst` say. With
//! `--kube-api-qps=5 --kube-api-burst=5`, a burst of Jobs wants far more than 5 requests a second
//! (pod creates, status updates, finalizer patches, and an event for each pod), and the API
//! server's audit log must show no controller's requests, its events included, above 5 per
//! second plus the burst in any 10 s window. Events yield to object writes, so the Jobs still
//! finish; what events could not wait for is dropped and counted.

use anyhow::{Result, ensure};
use pilothouse_tests::audit;
use pilothouse_tests::cluster::ClusterOptions;
use pilothouse_tests::harness::{SuitePilothouse, cluster, pilothouse, trial};
use pilothouse_tests::jobs::{self, Jobs};
use pilothouse_tests::k8s;
use serde_json::json;
use std::collections::BTreeMap;
use std::time::Duration;

const QPS: f64 = 5.0;
const BURST: f64 = 5.0;
const WINDOW_SECONDS: f64 = 10.0;
const JITTER_SECONDS: f64 = 0.5;

/// The most requests any `WINDOW_SECONDS` window holds, for sorted times in seconds.
fn busiest_window(times: &[f64]) -> usize {
    let mut best = 0;
    let mut j = 0;
    for i in 0..times.len() {
        while times[i] - times[j] >= WINDOW_SECONDS {
            j += 1;
        }
        best = best.max(i + 1 - j);
    }
    best
}

async fn job_burst_within_budget() -> Result<()> {
    let client = cluster().client().await?;
    let ns = cluster().namespace("budget").await?;
    k8s::wait_service_account(&client, &ns).await?;
    let j = Jobs::new(client.clone(), &ns);
    let since = k8s_openapi::jiff::Timestamp::now();
    for i in 0..30 {
        j.create(&jobs::job(
            &format!("b-{i}"),
            json!({"completions": 2, "parallelism": 2}),
            jobs::template(Some(0), "1s"),
        )?)
        .await?;
    }
    for i in 0..30 {
        j.wait_finished(&format!("b-{i}"), Duration::from_secs(300))
            .await?;
    }
    // The audit log is written in batches.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let mut by_controller: BTreeMap<String, Vec<f64>> = BTreeMap::new();
    for e in audit::read(&cluster().audit_log())? {
        let Some(controller) = e.user_agent.rsplit_once(" pilothouse/").map(|(_, c)| c) else {
            continue;
        };
        let Some(t) = e.received() else { continue };
        if e.stage != "ResponseComplete" || t < since {
            continue;
        }
        by_controller
            .entry(controller.to_string())
            .or_default()
            .push(t.as_millisecond() as f64 / 1000.0);
    }
    let job = by_controller
        .get("job-controller")
        .cloned()
        .unwrap_or_default();
    let events = audit::read(&cluster().audit_log())?
        .iter()
        .filter(|e| {
            e.stage == "ResponseComplete"
                && e.user_agent.ends_with("pilothouse/job-controller")
                && e.object_ref
                    .as_ref()
                    .is_some_and(|o| o.resource == "events")
                && e.received().is_some_and(|t| t >= since)
        })
        .count();
    // The bucket acts when requests are sent, the audit log stamps when they are received:
    // half a second of delivery jitter can squeeze a little more into a 10 s window. Twice the
    // budget (events on a bucket of their own) would still be far over.
    let limit = (QPS * (WINDOW_SECONDS + JITTER_SECONDS) + BURST) as usize;
    let mut report = Vec::new();
    for (controller, times) in &mut by_controller {
        times.sort_by(f64::total_cmp);
        let busiest = busiest_window(times);
        println!(
            "MEASURE {controller}: {} requests, busiest {WINDOW_SECONDS} s window {busiest} (limit {limit})",
            times.len()
        );
        if busiest > limit {
            report.push(format!(
                "{controller}: {busiest} requests in {WINDOW_SECONDS} s"
            ));
        }
    }
    let dropped = pilothouse()
        .metric("pilothouse_events_dropped_total{controller=\"job-controller\"}")
        .await?
        .unwrap_or(0.0);
    println!("MEASURE job-controller: {events} event writes, {dropped} events dropped");
    ensure!(report.is_empty(), "over budget: {report:?}");
    // The burst must have wanted more than the budget, or the check proves nothing.
    ensure!(
        job.len() as f64 > QPS * 20.0,
        "only {} job-controller requests: the workload did not press the budget",
        job.len()
    );
    ensure!(events > 0, "no event was written at all");
    Ok(())
}

/// The window count itself, on known input.
async fn busiest_window_counts_a_sliding_window() -> Result<()> {
    ensure!(busiest_window(&[]) == 0);
    ensure!(busiest_window(&[0.0, 1.0, 9.9, 10.0, 10.5]) == 4);
    ensure!(busiest_window(&[0.0, 10.0, 20.0]) == 1);
    Ok(())
}

fn main() -> ! {
    pilothouse_tests::harness::main(
        "budget",
        ClusterOptions {
            replace: Some(vec!["job-controller"]),
            ..Default::default()
        },
        Some(SuitePilothouse {
            args: vec![
                "--controllers=job-controller".to_string(),
                format!("--kube-api-qps={QPS}"),
                format!("--kube-api-burst={BURST}"),
            ],
            as_service_account: true,
        }),
        vec![
            trial("job_burst_within_budget", job_burst_within_budget),
            trial(
                "busiest_window_counts_a_sliding_window",
                busiest_window_counts_a_sliding_window,
            ),
        ],
    )
}
