//! Issue 18 §3: a guard against running a controller twice. On a plane whose
//! kube-controller-manager still runs its job controller (the reference plane, all of kcm's
//! controllers on), a Pilothouse running job-controller sees kcm write a Job's status after it
//! took over, and says so: `/readyz` fails naming the controller (the Job only in the log), and
//! `pilothouse_conflicting_writes_total` counts it, and a Warning event on the Job says so. Before any such write, `/readyz` is ready.

use anyhow::{Result, ensure};
use pilothouse_tests::cluster::ClusterOptions;
use pilothouse_tests::harness::{cluster, log_dir, trial};
use pilothouse_tests::jobs::{self, Jobs};
use pilothouse_tests::{Pilothouse, k8s, unique, wait};
use serde_json::json;
use std::time::Duration;

async fn kcm_still_running_job_controller_is_reported() -> Result<()> {
    let p = Pilothouse::spawn(
        "conflict",
        &cluster().kubeconfig,
        &log_dir(),
        &[
            "--controllers=job-controller".to_string(),
            format!("--leader-elect-resource-name={}", unique("conflict")),
        ],
    )?;
    p.wait_log("starting controller", Duration::from_secs(60))
        .await?;
    // The guard ignores kcm's writes in the two seconds after Pilothouse took over (kcm
    // finishing its last sync, not running); the Job must be created after them. CI created it
    // 0.7 s after the take-over once, and every kcm write it caused fell into that window.
    let armed = std::time::Instant::now();
    let (code, body) = p.http_get("/readyz").await?;
    ensure!(code == 200, "ready before any conflict: {code} {body}");

    let client = cluster().client().await?;
    let ns = cluster().namespace("conflict").await?;
    k8s::wait_service_account(&client, &ns).await?;
    tokio::time::sleep(Duration::from_secs(3).saturating_sub(armed.elapsed())).await;
    let j = Jobs::new(client, &ns);
    j.create(&jobs::job(
        "twice",
        json!({"completions": 1}),
        jobs::template(Some(0), "2s"),
    )?)
    .await?;
    let body = wait::until(
        "/readyz reporting kube-controller-manager",
        Duration::from_secs(60),
        Duration::from_millis(500),
        || async {
            let (code, body) = p.http_get("/readyz").await?;
            Ok((code == 500).then_some(body))
        },
    )
    .await?;
    ensure!(
        body.contains("kube-controller-manager wrote jobs/status")
            && body.contains("job-controller runs here"),
        "{body}"
    );
    // /readyz is open to anyone: the object is named only in the log (and its event).
    ensure!(!body.contains(&format!("{ns}/twice")), "{body}");
    ensure!(
        p.log_text().contains(&format!("object={ns}/twice")),
        "the log does not name the object:\n{}",
        p.log_tail(20)
    );
    let counted = p
        .metric(
            "pilothouse_conflicting_writes_total{controller=\"job-controller\",manager=\"kube-controller-manager\",resource=\"jobs/status\"}",
        )
        .await?
        .unwrap_or(0.0);
    ensure!(counted >= 1.0, "conflicting writes counted: {counted}");
    ensure!(
        p.log_text()
            .contains("kube-controller-manager is still running this controller"),
        "no error logged"
    );
    // And a Warning on the Job, from the job controller's recorder.
    j.wait_event("twice", "ConflictingWrite").await?;
    let events = j.events("twice", "ConflictingWrite").await?;
    ensure!(
        events.iter().any(|e| e.type_.as_deref() == Some("Warning")
            && e.note
                .as_deref()
                .is_some_and(|m| m.contains("-job-controller"))),
        "no Warning ConflictingWrite naming the flag: {events:?}"
    );
    Ok(())
}

fn main() -> ! {
    pilothouse_tests::harness::main(
        "conflict",
        ClusterOptions {
            reference: true,
            ..Default::default()
        },
        None,
        vec![trial(
            "kcm_still_running_job_controller_is_reported",
            kcm_still_running_job_controller_is_reported,
        )],
    )
}
