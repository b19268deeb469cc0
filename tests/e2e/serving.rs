//! Issue 18 §2: serving as kube-controller-manager does. The secure port serves HTTPS and
//! delegates authentication (TokenReview) and authorization (SubjectAccessReview) to the API
//! server: anonymous /metrics is refused, an unknown token is 401, a ServiceAccount without
//! `get` on the non-resource URL `/metrics` is 403 and one with it reads the metrics, which carry
//! the families kcm dashboards read. /healthz, /readyz and /livez are always allowed. With
//! `--use-service-account-credentials` each controller writes as upstream's ServiceAccount (the
//! audit log shows a Job's pods, status and events written by `job-controller`), while the
//! caches and the Lease stay under Pilothouse's own. Pilothouse runs as its ServiceAccount with
//! manifests/rbac.yaml and rbac-service-account-credentials.yaml: the shipped RBAC is proven.

use anyhow::{Context, Result, ensure};
use k8s_openapi::api::core::v1::ServiceAccount;
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding};
use kube::api::{Api, PostParams};
use pilothouse_tests::cluster::ClusterOptions;
use pilothouse_tests::harness::{cluster, log_dir, trial};
use pilothouse_tests::jobs::{self, Jobs};
use pilothouse_tests::pilothouse::https_get;
use pilothouse_tests::{Pilothouse, audit, k8s, unique, wait};
use serde_json::json;
use std::time::Duration;

/// A ServiceAccount in `ns` and a token for it; with `metrics`, bound to a ClusterRole that may
/// `get` the non-resource URL /metrics (what a Prometheus scraper is given).
async fn scraper(ns: &str, name: &str, metrics: bool) -> Result<String> {
    let client = cluster().client().await?;
    let sa: ServiceAccount = serde_json::from_value(json!({"metadata": {"name": name}}))?;
    Api::<ServiceAccount>::namespaced(client.clone(), ns)
        .create(&PostParams::default(), &sa)
        .await?;
    if metrics {
        let role_name = unique("pilothouse-test-metrics-reader");
        let role: ClusterRole = serde_json::from_value(json!({
            "metadata": {"name": role_name},
            "rules": [{"nonResourceURLs": ["/metrics"], "verbs": ["get"]}]
        }))?;
        Api::<ClusterRole>::all(client.clone())
            .create(&PostParams::default(), &role)
            .await?;
        let binding: ClusterRoleBinding = serde_json::from_value(json!({
            "metadata": {"name": role_name},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": role_name},
            "subjects": [{"kind": "ServiceAccount", "name": name, "namespace": ns}]
        }))?;
        Api::<ClusterRoleBinding>::all(client)
            .create(&PostParams::default(), &binding)
            .await?;
    }
    Ok(cluster()
        .kubectl(&["-n", ns, "create", "token", name, "--duration=1h"])?
        .trim()
        .to_string())
}

const PILOTHOUSE_USER: &str = "system:serviceaccount:kube-system:pilothouse";
const JOB_CONTROLLER_USER: &str = "system:serviceaccount:kube-system:job-controller";

async fn secure_port_and_controller_identities() -> Result<()> {
    let port = cluster().reserve_port()?;
    let addr = format!("127.0.0.1:{port}");
    let kubeconfig = cluster().pilothouse_service_account_kubeconfig()?;
    let extra =
        pilothouse_tests::repo_root().join("manifests/rbac-service-account-credentials.yaml");
    cluster().kubectl(&["apply", "-f", &extra.to_string_lossy()])?;
    let started = k8s_openapi::jiff::Timestamp::now();
    let p = Pilothouse::spawn(
        "serving-secure",
        &kubeconfig,
        &log_dir(),
        &[
            "--controllers=job-controller".to_string(),
            "--use-service-account-credentials".to_string(),
            "--bind-address=127.0.0.1".to_string(),
            format!("--secure-port={port}"),
        ],
    )?;
    p.wait_log("serving securely", Duration::from_secs(30))
        .await?;
    p.wait_log("starting controller", Duration::from_secs(60))
        .await?;
    let since = k8s_openapi::jiff::Timestamp::now();

    // Always allowed, even anonymously.
    for path in ["/healthz", "/readyz", "/livez"] {
        let (code, body) = https_get(&addr, path, None, None).await?;
        ensure!(code == 200, "{path}: {code} {body}");
    }
    // Anonymous: authorized as system:anonymous, which may not read /metrics.
    let (code, body) = https_get(&addr, "/metrics", None, None).await?;
    ensure!(code == 403, "anonymous /metrics: {code} {body}");
    ensure!(
        body.contains("User \"system:anonymous\" cannot get path \"/metrics\""),
        "{body}"
    );
    // A token the API server does not accept.
    let (code, body) = https_get(&addr, "/metrics", Some("not-a-token"), None).await?;
    ensure!(code == 401, "bad token: {code} {body}");

    let ns = cluster().namespace("serving").await?;
    let nobody = scraper(&ns, "nobody", false).await?;
    let (code, body) = https_get(&addr, "/metrics", Some(&nobody), None).await?;
    ensure!(code == 403, "token without the role: {code} {body}");
    ensure!(
        body.contains(&format!(
            "User \"system:serviceaccount:{ns}:nobody\" cannot get path \"/metrics\""
        )),
        "{body}"
    );

    let reader = scraper(&ns, "prometheus", true).await?;
    // A binding reaches the API server's authorizer through its informer: allow a moment.
    let body = wait::until(
        "the metrics reader allowed",
        // A 403 is cached 10 s (as kcm's): a binding seen late costs up to that.
        Duration::from_secs(25),
        Duration::from_millis(500),
        || async {
            let (code, body) = https_get(&addr, "/metrics", Some(&reader), None).await?;
            Ok((code == 200).then_some(body))
        },
    )
    .await?;
    for family in [
        "process_cpu_seconds_total ",
        "process_resident_memory_bytes ",
        "process_virtual_memory_bytes ",
        "process_open_fds ",
        "process_max_fds ",
        "process_start_time_seconds ",
        "rest_client_request_duration_seconds_count{verb=\"GET\"",
        "rest_client_requests_total{",
        "kubernetes_build_info{major=\"0\"",
        "running_managed_controllers{name=\"job-controller\",manager=\"pilothouse\"} 1",
        "leader_election_master_status{",
    ] {
        ensure!(
            body.lines().any(|l| l.starts_with(family)),
            "no {family:?} in the scrape"
        );
    }

    // The reviews went out as Pilothouse's ServiceAccount, from a client of their own.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let reviews: Vec<(String, String)> = audit::read(&cluster().audit_log())?
        .into_iter()
        .filter(|e| {
            e.stage == "ResponseComplete"
                && e.verb == "create"
                && e.received().is_some_and(|t| t >= since)
        })
        .filter_map(|e| {
            let r = e.object_ref?.resource;
            (r == "tokenreviews" || r == "subjectaccessreviews")
                .then(|| (r, format!("{} {}", e.user.username, e.user_agent)))
        })
        .collect();
    for kind in ["tokenreviews", "subjectaccessreviews"] {
        ensure!(
            reviews.iter().any(|(r, who)| r == kind
                && who.starts_with("system:serviceaccount:kube-system:pilothouse ")
                && who.ends_with("pilothouse/delegated-auth")),
            "no {kind} by Pilothouse's delegated-auth client: {reviews:?}"
        );
    }

    // A Job run by the job-controller's own identity.
    let client = cluster().client().await?;
    k8s::wait_service_account(&client, &ns).await?;
    let j = Jobs::new(client, &ns);
    j.create(&jobs::job(
        "identity",
        json!({"completions": 2, "parallelism": 2}),
        jobs::template(Some(0), "1s"),
    )?)
    .await?;
    j.wait_finished("identity", Duration::from_secs(120))
        .await?;
    j.wait_event("identity", "Completed").await?;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let mut writes: Vec<(String, String, String)> = Vec::new();
    for e in audit::read(&cluster().audit_log())? {
        let Some(o) = e.object_ref.as_ref() else {
            continue;
        };
        if e.stage != "ResponseComplete"
            || !e.user_agent.ends_with("pilothouse/job-controller")
            || ["get", "list", "watch"].contains(&e.verb.as_str())
            || o.namespace != ns
        {
            continue;
        }
        let what = match o.subresource.as_str() {
            "" => format!("{} {}", e.verb, o.resource),
            sub => format!("{} {}/{sub}", e.verb, o.resource),
        };
        writes.push((what, e.user.username.clone(), e.user_agent.clone()));
    }
    for want in ["create pods", "update jobs/status", "create events"] {
        ensure!(
            writes.iter().any(|(w, _, _)| w == want),
            "no {want:?} by the job controller: {writes:?}"
        );
    }
    let foreign: Vec<_> = writes
        .iter()
        .filter(|(_, user, _)| user != JOB_CONTROLLER_USER)
        .collect();
    ensure!(
        foreign.is_empty(),
        "job-controller writes under another identity: {foreign:?}"
    );
    // The caches stay under Pilothouse's own identity.
    let cache_reader = audit::read(&cluster().audit_log())?.into_iter().any(|e| {
        e.verb == "watch"
            && e.received().is_some_and(|t| t >= started)
            && e.user.username == PILOTHOUSE_USER
            && e.object_ref.as_ref().is_some_and(|o| o.resource == "jobs")
    });
    ensure!(cache_reader, "no jobs watch by {PILOTHOUSE_USER}");
    cluster().delete_namespace(&ns).await?;
    Ok(())
}

/// `--tls-cert-file`/`--tls-private-key-file` are what is served (checked by trusting only that
/// certificate), and a missing file stops the start with its name.
async fn serving_certificate_files() -> Result<()> {
    let dir = log_dir().join(unique("serving-pki"));
    std::fs::create_dir_all(&dir)?;
    let cert = rcgen::generate_simple_self_signed(vec!["127.0.0.1".to_string()])?;
    let (crt, key) = (dir.join("tls.crt"), dir.join("tls.key"));
    std::fs::write(&crt, cert.cert.pem())?;
    std::fs::write(&key, cert.signing_key.serialize_pem())?;
    let port = cluster().reserve_port()?;
    let addr = format!("127.0.0.1:{port}");
    let lease = unique("serving-files");
    let p = Pilothouse::spawn(
        "serving-files",
        &cluster().kubeconfig,
        &log_dir(),
        &[
            "--controllers=job-controller".to_string(),
            format!("--leader-elect-resource-name={lease}"),
            "--bind-address=127.0.0.1".to_string(),
            format!("--secure-port={port}"),
            format!("--tls-cert-file={}", crt.display()),
            format!("--tls-private-key-file={}", key.display()),
        ],
    )?;
    p.wait_log("serving securely", Duration::from_secs(30))
        .await?;
    let (code, body) = https_get(&addr, "/healthz", None, Some(&[cert.cert.der().clone()]))
        .await
        .context("the served certificate is the one given")?;
    ensure!(code == 200, "{code} {body}");

    let mut bad = Pilothouse::spawn(
        "serving-bad-files",
        &cluster().kubeconfig,
        &log_dir(),
        &[
            "--controllers=job-controller".to_string(),
            format!("--leader-elect-resource-name={}", unique("serving-bad")),
            "--bind-address=127.0.0.1".to_string(),
            format!("--secure-port={}", cluster().reserve_port()?),
            "--tls-cert-file=/nonexistent/tls.crt".to_string(),
            format!("--tls-private-key-file={}", key.display()),
        ],
    )?;
    let status = bad.wait_exit(Duration::from_secs(30)).await?;
    ensure!(!status.success(), "started with a missing certificate file");
    ensure!(
        bad.log_text().contains("/nonexistent/tls.crt"),
        "the error does not name the file:\n{}",
        bad.log_tail(10)
    );
    Ok(())
}

fn main() -> ! {
    pilothouse_tests::harness::main(
        "serving",
        ClusterOptions {
            replace: Some(vec!["job-controller"]),
            ..Default::default()
        },
        None,
        vec![
            trial(
                "secure_port_and_controller_identities",
                secure_port_and_controller_identities,
            ),
            trial("serving_certificate_files", serving_certificate_files),
        ],
    )
}
