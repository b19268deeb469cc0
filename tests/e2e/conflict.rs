//! Issue 18 §3: a guard against running a controller twice. On a plane whose
//! kube-controller-manager still runs its job controller (the reference plane, all of kcm's
//! controllers on), a Pilothouse running job-controller sees kcm write a Job's status after it
//! took over, and says so: `/readyz` fails naming the controller (the Job only in the log), and
//! `pilothouse_conflicting_writes_total` counts it, and a Warning event on the Job says so. Before any such write, `/readyz` is ready.
//! A tenant who may update Jobs but not their status cannot fire it: an update carrying a forged
//! kube-controller-manager status entry changes no status, and is not counted.

use anyhow::{Result, ensure};
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::rbac::v1::RoleBinding;
use k8s_openapi::jiff::Timestamp;
use kube::Client;
use kube::api::{Api, PostParams};
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
    let j = Jobs::new(client.clone(), &ns);
    // First a tenant's forgery: a Job no controller here manages (its managedBy is another's),
    // updated by a user with the namespace's `edit` role, who sends a managedFields entry
    // naming kube-controller-manager and the status subresource. The update changes no status,
    // so it must not count, even after later writes.
    forge_kcm_entry(&client, &j, &ns).await?;
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
    // /readyz is open to anyone: it names the failing check and withholds the reason.
    ensure!(
        body.contains("[-]conflicts failed: reason withheld") && !body.contains("job-controller"),
        "{body}"
    );
    // The reason is at /readyz/conflicts (open on this plain-HTTP port; authorized on the
    // secure one), and even there the object is named only in the log (and its event).
    let (code, body) = p.http_get("/readyz/conflicts").await?;
    ensure!(
        code == 500
            && body.contains("kube-controller-manager wrote jobs/status")
            && body.contains("job-controller runs here"),
        "/readyz/conflicts: {code} {body}"
    );
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
    // The forged entry came before kcm's real writes, on the same watch: had it counted, it
    // would be in the log and on its Job by now.
    ensure!(
        !p.log_text().contains(&format!("object={ns}/forged")),
        "a forged managedFields entry fired the guard:\n{}",
        p.log_tail(20)
    );
    ensure!(
        j.events("forged", "ConflictingWrite").await?.is_empty(),
        "a ConflictingWrite event on the forged Job"
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

/// Creates Job `forged` (managed by another controller, so neither kcm nor Pilothouse writes
/// its status) and updates it as tenant `mallory`, who holds `edit` in `ns`, with an added
/// managedFields entry claiming a kube-controller-manager status write now. Checks the API server
/// kept the entry, or the trial proves nothing.
async fn forge_kcm_entry(admin: &Client, j: &Jobs, ns: &str) -> Result<()> {
    let binding: RoleBinding = serde_json::from_value(json!({
        "metadata": {"name": "mallory-edit", "namespace": ns},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "edit"},
        "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": "mallory"}],
    }))?;
    Api::<RoleBinding>::namespaced(admin.clone(), ns)
        .create(&PostParams::default(), &binding)
        .await?;
    j.create(&jobs::job(
        "forged",
        json!({"completions": 1, "suspend": true, "managedBy": "example.com/elsewhere"}),
        jobs::template(Some(0), "2s"),
    )?)
    .await?;
    let mut config = kube::Config::from_custom_kubeconfig(
        kube::config::Kubeconfig::read_from(&cluster().kubeconfig)?,
        &kube::config::KubeConfigOptions::default(),
    )
    .await?;
    config.auth_info.impersonate = Some("mallory".into());
    let tenant: Api<Job> = Api::namespaced(Client::try_from(config)?, ns);
    let now = Timestamp::now().strftime("%Y-%m-%dT%H:%M:%SZ").to_string();
    let forged_entry = json!({
        "manager": "kube-controller-manager",
        "operation": "Update",
        "apiVersion": "batch/v1",
        "subresource": "status",
        "time": now,
        "fieldsType": "FieldsV1",
        "fieldsV1": {"f:status": {"f:active": {}, "f:conditions": {}}},
    });
    // Whatever the tenant's retries, the update must land with the entry: a conflict is retried.
    for attempt in 0.. {
        let mut job = serde_json::to_value(tenant.get("forged").await?)?;
        let entries = job["metadata"]["managedFields"]
            .as_array_mut()
            .ok_or_else(|| anyhow::anyhow!("no managedFields on the created Job"))?;
        entries.push(forged_entry.clone());
        job["metadata"]["labels"] = json!({"touched": "by-mallory"});
        let job: Job = serde_json::from_value(job)?;
        match tenant.replace("forged", &PostParams::default(), &job).await {
            Ok(_) => break,
            Err(kube::Error::Api(e)) if e.code == 409 && attempt < 5 => continue,
            Err(e) => return Err(e.into()),
        }
    }
    let kept = j.get("forged").await?;
    let claims = kept
        .metadata
        .managed_fields
        .unwrap_or_default()
        .into_iter()
        .any(|e| {
            e.manager.as_deref() == Some("kube-controller-manager")
                && e.subresource.as_deref() == Some("status")
        });
    ensure!(
        claims,
        "the API server did not keep the forged managedFields entry"
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
