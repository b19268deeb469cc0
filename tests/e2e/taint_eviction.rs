//! End-to-end tests of `taint-eviction-controller` (spec §3, scenarios N7, N8, N9, N16 and the
//! TE rules), against a local control plane whose kube-controller-manager runs everything but
//! the taint-eviction controller, with one Pilothouse running only that controller
//! (`--controllers=taint-eviction-controller`: N16, "TEC alone"). Each test owns a namespace and
//! a kwok node, so the tests run side by side. Pilothouse runs as the `kube-system/pilothouse`
//! ServiceAccount with the shipped RBAC, so these tests also prove that RBAC is sufficient.

use anyhow::{Result, ensure};
use k8s_openapi::api::core::v1::Pod;
use kube::Client;
use kube::api::{Api, PostParams};
use pilothouse_tests::cluster::ClusterOptions;
use pilothouse_tests::harness::{SuitePilothouse, cluster, pilothouse, trial};
use pilothouse_tests::k8s::{self, deleted, pod_on_node, taint};
use pilothouse_tests::{unique, wait};
use serde_json::{Value, json};
use std::time::Duration;
use tokio::time::Instant;

struct Fixture {
    client: Client,
    ns: String,
    node: String,
    pods: Api<Pod>,
}

impl Fixture {
    async fn new(prefix: &str) -> Result<Fixture> {
        let client = cluster().client().await?;
        let ns = cluster().namespace(prefix).await?;
        k8s::wait_service_account(&client, &ns).await?;
        let node = unique(&format!("{prefix}-node"));
        k8s::create_kwok_node(&client, &node, "zone-tec").await?;
        let pods = Api::namespaced(client.clone(), &ns);
        Ok(Fixture {
            client,
            ns,
            node,
            pods,
        })
    }

    async fn pod(&self, name: &str, tolerations: Value) -> Result<()> {
        self.pods
            .create(
                &PostParams::default(),
                &pod_on_node(name, &self.node, tolerations)?,
            )
            .await?;
        Ok(())
    }

    async fn add_taint(&self, key: &str, value: &str) -> Result<Instant> {
        k8s::modify_taints(&self.client, &self.node, |ts| {
            ts.push(taint(key, value, "NoExecute"))
        })
        .await?;
        Ok(Instant::now())
    }

    async fn remove_taint(&self, key: &str) -> Result<Instant> {
        k8s::modify_taints(&self.client, &self.node, |ts| ts.retain(|t| t.key != key)).await?;
        Ok(Instant::now())
    }

    /// Waits until `name` is deleted; returns when (since `t0`).
    async fn deleted_within(&self, name: &str, t0: Instant, timeout: Duration) -> Result<Duration> {
        wait::until(
            &format!("pod {name} deleted"),
            timeout,
            Duration::from_millis(50),
            || async { Ok(deleted(&self.pods, name).await?.then(|| t0.elapsed())) },
        )
        .await
    }

    async fn cleanup(self) -> Result<()> {
        k8s::release_pods(&self.client, &self.ns).await?;
        k8s::delete_node(&self.client, &self.node).await?;
        cluster().delete_namespace(&self.ns).await
    }
}

fn exists(key: &str, seconds: Option<i64>) -> Value {
    match seconds {
        Some(s) => {
            json!({"key": key, "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": s})
        }
        None => json!({"key": key, "operator": "Exists", "effect": "NoExecute"}),
    }
}

async fn deletions_total() -> Result<f64> {
    Ok(pilothouse()
        .metric("taint_eviction_controller_pod_deletions_total")
        .await?
        .unwrap_or(0.0))
}

/// N7: the toleration matrix. Untolerated, zero-second and `Lt`-mismatched pods go at once, the
/// timed one after its seconds, `Exists` without seconds and a matching `Gt` stay.
async fn n7_toleration_matrix() -> Result<()> {
    let f = Fixture::new("n7").await?;
    let q = "example.com/q";
    f.pod("p-none", json!([])).await?;
    f.pod("p-zero", json!([exists(q, Some(0))])).await?;
    f.pod("p-timed", json!([exists(q, Some(15))])).await?;
    f.pod("p-forever", json!([exists(q, None)])).await?;
    f.pod(
        "p-gt",
        json!([{"key": q, "operator": "Gt", "value": "5", "effect": "NoExecute"}]),
    )
    .await?;
    f.pod(
        "p-lt",
        json!([{"key": q, "operator": "Lt", "value": "5", "effect": "NoExecute"}]),
    )
    .await?;
    let before = deletions_total().await?;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let t0 = f.add_taint(q, "7").await?;
    for name in ["p-none", "p-zero", "p-lt"] {
        let took = f.deleted_within(name, t0, Duration::from_secs(5)).await?;
        println!(
            "MEASURE n7 {name} deleted {:.3}s after the taint",
            took.as_secs_f64()
        );
        ensure!(
            took <= Duration::from_millis(1500),
            "{name} deleted after {took:?}"
        );
        let pod = f.pods.get(name).await?;
        let c = k8s::condition(&pod, "DisruptionTarget")
            .ok_or_else(|| anyhow::anyhow!("{name} has no DisruptionTarget"))?;
        ensure!(
            c.status == "True" && c.reason.as_deref() == Some("DeletionByTaintManager"),
            "{c:?}"
        );
        ensure!(
            c.message.as_deref() == Some("Taint manager: deleting due to NoExecute taint"),
            "{c:?}"
        );
    }
    // Events yield to object writes: waited for after the timed deletions, not read once.
    for name in ["p-none", "p-zero", "p-lt"] {
        let note = format!("Marking for deletion Pod {}/{name}", f.ns);
        let ev = k8s::wait_events(
            &f.client,
            &f.ns,
            name,
            "TaintManagerEviction",
            Duration::from_secs(30),
            |ev| ev.iter().any(|e| e.note.as_deref() == Some(note.as_str())),
        )
        .await?;
        ensure!(
            ev.iter()
                .all(|e| e.reporting_controller.as_deref() == Some("taint-eviction-controller")),
            "{ev:?}"
        );
    }
    let took = f
        .deleted_within("p-timed", t0, Duration::from_secs(25))
        .await?;
    println!(
        "MEASURE n7 p-timed (15s) deleted {:.3}s after the taint",
        took.as_secs_f64()
    );
    ensure!(
        took >= Duration::from_secs(13) && took <= Duration::from_secs(17),
        "p-timed deleted after {took:?}"
    );
    tokio::time::sleep(Duration::from_secs(2)).await;
    for name in ["p-forever", "p-gt"] {
        ensure!(!deleted(&f.pods, name).await?, "{name} was deleted");
    }
    // The suite's other tests delete pods too: at least our four were counted.
    ensure!(
        deletions_total().await? >= before + 4.0,
        "pod_deletions_total did not grow by 4"
    );
    f.cleanup().await
}

/// N8 (NB-5): raising `tolerationSeconds` while the timer runs moves the deadline; upstream
/// would keep the old one.
async fn n8_toleration_change_moves_deadline() -> Result<()> {
    let f = Fixture::new("n8").await?;
    let q = "example.com/q";
    f.pod("p", json!([exists(q, Some(20))])).await?;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let t0 = f.add_taint(q, "").await?;
    tokio::time::sleep(Duration::from_secs(5)).await;
    let mut pod = f.pods.get("p").await?;
    for t in pod
        .spec
        .as_mut()
        .and_then(|s| s.tolerations.as_mut())
        .into_iter()
        .flatten()
    {
        if t.key.as_deref() == Some(q) {
            t.toleration_seconds = Some(40);
        }
    }
    f.pods.replace("p", &PostParams::default(), &pod).await?;
    let took = f.deleted_within("p", t0, Duration::from_secs(50)).await?;
    println!(
        "MEASURE n8 deleted {:.3}s after the taint (toleration raised 20s -> 40s)",
        took.as_secs_f64()
    );
    ensure!(
        took >= Duration::from_secs(38) && took <= Duration::from_secs(42),
        "deleted after {took:?}, want 40s"
    );
    f.cleanup().await
}

/// N9: DaemonSet-style pods (not-ready/unreachable NoExecute tolerations without seconds)
/// survive an unreachable taint but go at once on an untolerated NoExecute taint.
async fn n9_daemonset_pods() -> Result<()> {
    let f = Fixture::new("n9").await?;
    let ds = json!([
        exists("node.kubernetes.io/not-ready", None),
        exists("node.kubernetes.io/unreachable", None)
    ]);
    f.pod("p-ds", ds).await?;
    // Gets the API server's default 30 s not-ready/unreachable tolerations.
    f.pod("p-default", json!([])).await?;
    tokio::time::sleep(Duration::from_millis(500)).await;
    f.add_taint("node.kubernetes.io/unreachable", "").await?;
    tokio::time::sleep(Duration::from_secs(5)).await;
    ensure!(
        !deleted(&f.pods, "p-ds").await?,
        "DaemonSet pod deleted by the unreachable taint"
    );
    ensure!(
        !deleted(&f.pods, "p-default").await?,
        "default pod deleted before its 30 s"
    );
    let t1 = f.add_taint("example.com/maintenance", "").await?;
    for name in ["p-ds", "p-default"] {
        let took = f.deleted_within(name, t1, Duration::from_secs(5)).await?;
        ensure!(
            took <= Duration::from_millis(1500),
            "{name} deleted after {took:?}"
        );
    }
    f.cleanup().await
}

/// TE-5: removing the taint cancels a pending eviction, announced once.
async fn recovery_cancels_eviction() -> Result<()> {
    let f = Fixture::new("cancel").await?;
    let q = "example.com/q";
    f.pod("p", json!([exists(q, Some(10))])).await?;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let t0 = f.add_taint(q, "").await?;
    tokio::time::sleep(Duration::from_secs(3)).await;
    f.remove_taint(q).await?;
    let note = format!("Cancelling deletion of Pod {}/p", f.ns);
    k8s::wait_events(
        &f.client,
        &f.ns,
        "p",
        "TaintManagerEviction",
        Duration::from_secs(10),
        |ev| ev.iter().any(|e| e.note.as_deref() == Some(note.as_str())),
    )
    .await?;
    while t0.elapsed() < Duration::from_secs(14) {
        ensure!(
            !deleted(&f.pods, "p").await?,
            "pod deleted after its taint was removed"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let ev = k8s::events(&f.client, &f.ns, "p", "TaintManagerEviction").await?;
    ensure!(
        !ev.iter()
            .any(|e| e.note.as_deref().is_some_and(|n| n.starts_with("Marking"))),
        "{ev:?}"
    );
    f.cleanup().await
}

/// NB-7, TE-7, TE-10: a webhook rejecting the DisruptionTarget status write six times: the
/// controller keeps retrying with backoff, warns after the fifth failure, and deletes the pod
/// once the webhook lets it through.
async fn rejected_status_write_is_retried_and_reported() -> Result<()> {
    use pilothouse_tests::webhook::{Match, Webhook};
    let f = Fixture::new("hook").await?;
    f.pod("p", json!([])).await?;
    wait::until(
        "p running",
        Duration::from_secs(30),
        Duration::from_millis(100),
        || async {
            let p = f.pods.get("p").await?;
            Ok((p.status.and_then(|s| s.phase).as_deref() == Some("Running")).then_some(()))
        },
    )
    .await?;
    let hook = Webhook::start(f.client.clone(), &f.ns, &["pods/status"], &["UPDATE"]).await?;
    hook.reject(
        Match {
            resource: Some("pods".into()),
            sub_resource: Some("status".into()),
            name: Some("p".into()),
            ..Default::default()
        },
        6,
        "status writes are paused by policy",
    );
    let t0 = f.add_taint("example.com/q", "").await?;
    let took = f.deleted_within("p", t0, Duration::from_secs(30)).await?;
    println!(
        "MEASURE webhook: deleted {:.2}s after the taint, after 6 rejected status writes",
        took.as_secs_f64()
    );
    let seen: Vec<bool> = hook
        .seen()
        .iter()
        .filter(|s| s.name == "p" && s.sub_resource == "status")
        .map(|s| s.allowed)
        .collect();
    ensure!(
        seen.len() >= 7 && seen[..6].iter().all(|a| !a) && seen[6],
        "webhook saw {seen:?}"
    );
    // Backoff 100 ms doubling: 0.1+0.2+0.4+0.8+1.6+3.2 s before the 7th try.
    ensure!(
        took >= Duration::from_secs(6),
        "retries did not back off: {took:?}"
    );
    k8s::wait_events(
        &f.client,
        &f.ns,
        "p",
        "TaintEvictionFailed",
        Duration::from_secs(30),
        |ev| !ev.is_empty(),
    )
    .await?;
    // A repeat the correlator merged would be the same Event with a higher count (core/v1
    // `count`, read here as `deprecatedCount`; `series` for an events/v1 writer), not a second
    // object: read again once the recorder has had time to send one, and count occurrences.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let warnings = k8s::events(&f.client, &f.ns, "p", "TaintEvictionFailed").await?;
    let occurrences: i32 = warnings
        .iter()
        .map(|e| {
            let series = e.series.as_ref().map_or(1, |s| s.count);
            e.deprecated_count.unwrap_or(1).max(series)
        })
        .sum();
    ensure!(
        warnings.len() == 1 && occurrences == 1,
        "want one TaintEvictionFailed warning, once, got {warnings:?}"
    );
    ensure!(warnings[0].type_.as_deref() == Some("Warning"));
    ensure!(
        warnings[0]
            .note
            .as_deref()
            .is_some_and(|n| n.contains("status writes are paused by policy")),
        "{warnings:?}"
    );
    let failures = pilothouse()
        .metric("pilothouse_taint_eviction_failures_total{reason=\"403\"}")
        .await?
        .unwrap_or(0.0);
    ensure!(failures >= 6.0, "failures counted: {failures}");
    hook.remove().await?;
    f.cleanup().await
}

fn main() {
    let trials = vec![
        trial("n7_toleration_matrix", n7_toleration_matrix),
        trial(
            "n8_toleration_change_moves_deadline",
            n8_toleration_change_moves_deadline,
        ),
        trial("n9_daemonset_pods", n9_daemonset_pods),
        trial("recovery_cancels_eviction", recovery_cancels_eviction),
        trial(
            "rejected_status_write_is_retried_and_reported",
            rejected_status_write_is_retried_and_reported,
        ),
    ];
    let args = vec![
        "--controllers=taint-eviction-controller".to_string(),
        "--feature-gates=TaintTolerationComparisonOperators=true".to_string(),
    ];
    pilothouse_tests::harness::main(
        "taint-eviction",
        // kube-controller-manager keeps its node-lifecycle controller: the Pilothouse under test
        // takes over the taint-eviction controller only.
        ClusterOptions {
            nodes: 0,
            replace: Some(vec!["taint-eviction-controller"]),
            ..Default::default()
        },
        Some(SuitePilothouse {
            args,
            as_service_account: true,
        }),
        trials,
    )
}
