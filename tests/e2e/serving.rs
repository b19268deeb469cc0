//! Issue 18 §2: serving as kube-controller-manager does. The secure port serves HTTPS and
//! delegates authentication (TokenReview) and authorization (SubjectAccessReview) to the API
//! server: anonymous /metrics is refused, an unknown token is 401, a ServiceAccount without
//! `get` on the non-resource URL `/metrics` is 403 and one with it reads the metrics, which carry
//! the families kcm dashboards read. /healthz, /readyz and /livez are always allowed. With
//! `--use-service-account-credentials` every controller Pilothouse has built writes as upstream's
//! ServiceAccount (ours for node-maintenance): a workload that makes each of them write shows, in
//! the audit log, each controller's writes under its own user and none refused, while the caches
//! and the Lease stay under Pilothouse's own, which writes nothing else. Pilothouse runs as its
//! ServiceAccount with manifests/rbac.yaml and rbac-service-account-credentials.yaml (in place of
//! rbac-controllers.yaml), under which that account may not write what the controllers write:
//! the shipped RBAC is proven, and the account is read-only for the controllers' objects.

use anyhow::{Context, Result, bail, ensure};
use k8s_openapi::api::authentication::v1::TokenReview;
use k8s_openapi::api::authorization::v1::SubjectAccessReview;
use k8s_openapi::api::core::v1::{Node, ServiceAccount};
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding};
use kube::api::{Api, DeleteParams, PostParams};
use pilothouse_tests::cluster::ClusterOptions;
use pilothouse_tests::harness::{cluster, log_dir, trial};
use pilothouse_tests::jobs::{self, Jobs};
use pilothouse_tests::pilothouse::{HttpsConnection, https_get, tls_connect};
use pilothouse_tests::{Pilothouse, audit, k8s, unique, wait};
use serde_json::{Value, json};
use std::time::Duration;

/// A ServiceAccount in `ns` and a token for it; with `metrics`, bound to a ClusterRole that may
/// `get` the non-resource URLs /metrics and /readyz/* (what kube's `system:monitoring` grants).
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
            "rules": [{"nonResourceURLs": ["/metrics", "/readyz/*"], "verbs": ["get"]}]
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

/// Every controller Pilothouse has built, the ServiceAccount in kube-system it acts as (kcm's
/// `NewClient` name; ours for node-maintenance), and writes the trial's workload makes it send.
const IDENTITIES: [(&str, &str, &[&str]); 8] = [
    (
        "job-controller",
        "job-controller",
        &["create pods", "update jobs/status", "create events"],
    ),
    (
        "cronjob-controller",
        "cronjob-controller",
        &["create jobs", "update cronjobs/status", "create events"],
    ),
    (
        "statefulset-controller",
        "statefulset-controller",
        &[
            "create controllerrevisions",
            "create pods",
            "update statefulsets/status",
            "create events",
        ],
    ),
    (
        "endpointslice-controller",
        "endpointslice-controller",
        &["create endpointslices"],
    ),
    (
        "endpointslice-mirroring-controller",
        "endpointslicemirroring-controller",
        &["create endpointslices"],
    ),
    (
        "node-lifecycle-controller",
        "node-controller",
        &["patch nodes"],
    ),
    (
        "taint-eviction-controller",
        "node-controller",
        &["delete pods", "create events"],
    ),
    (
        "node-maintenance-controller",
        "node-maintenance-controller",
        &[
            "patch nodemaintenances/status",
            "patch nodes",
            "create events",
        ],
    ),
];

/// What Pilothouse's own identity may write beside the caches' reads: its Lease, the
/// controllers' ServiceAccounts and tokens, and the secure port's reviews.
const OWN_WRITES: [&str; 5] = [
    "leases",
    "serviceaccounts",
    "serviceaccounts/token",
    "tokenreviews",
    "subjectaccessreviews",
];

/// Trials that run a job controller one at a time: two would both act on the other's Job.
static ONE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// The controller a request came from, by its user agent (`... pilothouse/<controller>`).
fn controller_of(user_agent: &str) -> Option<&'static str> {
    IDENTITIES
        .iter()
        .map(|(c, _, _)| *c)
        .find(|c| user_agent.ends_with(&format!("pilothouse/{c}")))
}

/// Whether kube-system's ServiceAccount `who` may `verb` `resource[/subresource]` (named `name`,
/// or any) in kube-system (a SubjectAccessReview: the API server's own answer).
async fn allowed(who: &str, verb: &str, resource: &str, name: &str) -> Result<bool> {
    let (resource, subresource) = resource.split_once('/').unwrap_or((resource, ""));
    let group = match resource {
        "jobs" => "batch",
        "endpointslices" => "discovery.k8s.io",
        "controllerrevisions" => "apps",
        "nodemaintenances" => "pilothouse.dev",
        _ => "",
    };
    let review: SubjectAccessReview = serde_json::from_value(json!({
        "spec": {
            "user": format!("system:serviceaccount:kube-system:{who}"),
            "groups": ["system:serviceaccounts", "system:serviceaccounts:kube-system", "system:authenticated"],
            "resourceAttributes": {
                "namespace": "kube-system", "verb": verb, "group": group,
                "resource": resource, "subresource": subresource, "name": name
            }
        }
    }))?;
    let answer = Api::<SubjectAccessReview>::all(cluster().client().await?)
        .create(&PostParams::default(), &review)
        .await?;
    Ok(answer.status.is_some_and(|s| s.allowed))
}

/// One request by a controller, as the audit log saw it.
#[derive(Clone, Debug)]
struct Request {
    controller: &'static str,
    /// `verb resource[/subresource]`.
    what: String,
    user: String,
    code: u16,
}

/// Every completed request by one of Pilothouse's controllers received since `since`.
fn controller_requests(since: k8s_openapi::jiff::Timestamp) -> Result<Vec<Request>> {
    let mut out = Vec::new();
    for e in audit::read(&cluster().audit_log())? {
        let (Some(o), Some(c)) = (e.object_ref.as_ref(), controller_of(&e.user_agent)) else {
            continue;
        };
        if e.stage != "ResponseComplete" || e.received().is_none_or(|t| t < since) {
            continue;
        }
        out.push(Request {
            controller: c,
            what: format!("{} {}", e.verb, resource_of(o)),
            user: e.user.username.clone(),
            code: e.response_status.as_ref().and_then(|r| r.code).unwrap_or(0),
        });
    }
    Ok(out)
}

fn resource_of(o: &audit::ObjectRef) -> String {
    match o.subresource.as_str() {
        "" => o.resource.clone(),
        sub => format!("{}/{sub}", o.resource),
    }
}

/// Objects that make every controller write: a Job, a CronJob due every minute, a StatefulSet
/// with a Service selecting its pod, a selector-less Service with hand-kept Endpoints, a pod bound
/// to `tainted` (unschedulable, with a NoExecute taint the pod does not tolerate) and a
/// NodeMaintenance of `drained` (neither node has a kubelet: nothing else acts on them).
fn workload(ns: &str, tainted: &str, drained: &str) -> Value {
    let node = |name: &str, spec: Value| {
        json!({"apiVersion": "v1", "kind": "Node",
            "metadata": {"name": name, "labels": {"pilothouse.test/identity": "true"}},
            "spec": spec})
    };
    let kwok = json!([{"key": "kwok.x-k8s.io/node", "operator": "Exists", "effect": "NoSchedule"}]);
    let meta = |name: &str| json!({"name": name, "namespace": ns});
    let app = json!({"app": "identity-sts"});
    json!({"apiVersion": "v1", "kind": "List", "items": [
        node(tainted, json!({"unschedulable": true, "taints": [
            {"key": "pilothouse.test/identity", "value": "evict", "effect": "NoExecute"}]})),
        node(drained, json!({})),
        {"apiVersion": "batch/v1", "kind": "CronJob", "metadata": meta("identity"),
         "spec": {"schedule": "* * * * *", "successfulJobsHistoryLimit": 1,
                  "jobTemplate": {"spec": {"template": jobs::template(Some(0), "1s")}}}},
        {"apiVersion": "apps/v1", "kind": "StatefulSet", "metadata": meta("identity"),
         "spec": {"replicas": 1, "serviceName": "identity-sts",
                  "selector": {"matchLabels": app},
                  "template": {"metadata": {"labels": app}, "spec": {
                      "terminationGracePeriodSeconds": 0, "tolerations": kwok,
                      "containers": [{"name": "c", "image": "busybox"}]}}}},
        {"apiVersion": "v1", "kind": "Service", "metadata": meta("identity-sts"),
         "spec": {"selector": app, "ports": [{"name": "http", "port": 80}]}},
        {"apiVersion": "v1", "kind": "Service", "metadata": meta("identity-external"),
         "spec": {"ports": [{"name": "db", "port": 5432}]}},
        {"apiVersion": "v1", "kind": "Endpoints", "metadata": meta("identity-external"),
         "subsets": [{"addresses": [{"ip": "10.99.0.1"}], "ports": [{"name": "db", "port": 5432}]}]},
        {"apiVersion": "v1", "kind": "Pod", "metadata": meta("identity-evicted"),
         "spec": {"nodeName": tainted, "terminationGracePeriodSeconds": 0,
                  "containers": [{"name": "c", "image": "busybox"}]}},
        {"apiVersion": "pilothouse.dev/v1alpha1", "kind": "NodeMaintenance",
         "metadata": {"name": drained},
         "spec": {"nodeName": drained, "reason": "identity test"}},
    ]})
}

async fn secure_port_and_controller_identities() -> Result<()> {
    let _alone = ONE_AT_A_TIME.lock().await;
    pilothouse_tests::maintenance::install_crd(cluster()).await?;
    let port = cluster().reserve_port()?;
    let addr = format!("127.0.0.1:{port}");
    // Service-account mode's RBAC: rbac-service-account-credentials.yaml instead of
    // rbac-controllers.yaml, so the pilothouse account holds no controller's role (a plane left
    // by an earlier run may hold those bindings: they go first).
    let controllers_rbac = pilothouse_tests::repo_root().join("manifests/rbac-controllers.yaml");
    cluster().kubectl(&[
        "delete",
        "--ignore-not-found",
        "-f",
        &controllers_rbac.to_string_lossy(),
    ])?;
    let kubeconfig = cluster().pilothouse_service_account_kubeconfig_with(&[
        "manifests/rbac.yaml",
        "manifests/rbac-service-account-credentials.yaml",
    ])?;
    // The API server's authorizer learns bindings from a watch: Pilothouse stops on a refused
    // token request at start, and a controller's first events would be refused. The events
    // binding is the file's last object.
    for (who, verb, resource, name) in [
        (
            "pilothouse",
            "create",
            "serviceaccounts/token",
            "job-controller",
        ),
        ("node-maintenance-controller", "create", "events", ""),
    ] {
        wait::until(
            &format!("{who} allowed to {verb} {resource}"),
            Duration::from_secs(30),
            Duration::from_millis(200),
            || async { Ok(allowed(who, verb, resource, name).await?.then_some(())) },
        )
        .await?;
    }
    // Reading is all the pilothouse account may do with what the controllers write.
    for (verb, resource) in [
        ("create", "pods"),
        ("delete", "pods"),
        ("update", "jobs/status"),
        ("create", "jobs"),
        ("patch", "nodes"),
        ("create", "endpointslices"),
        ("create", "controllerrevisions"),
        ("patch", "nodemaintenances/status"),
        ("create", "events"),
    ] {
        ensure!(
            !allowed("pilothouse", verb, resource, "").await?,
            "the pilothouse account may {verb} {resource} in service-account mode"
        );
    }
    let started = k8s_openapi::jiff::Timestamp::now();
    let p = Pilothouse::spawn(
        "serving-secure",
        &kubeconfig,
        &log_dir(),
        &[
            format!("--controllers={}", IDENTITIES.map(|(c, _, _)| c).join(",")),
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
        "kubernetes_build_info{major=\"1\",minor=\"37\"",
        "pilothouse_build_info{",
        "running_managed_controllers{name=\"job-controller\",manager=\"pilothouse\"} 1",
        "leader_election_master_status{",
    ] {
        ensure!(
            body.lines().any(|l| l.starts_with(family)),
            "no {family:?} in the scrape"
        );
    }
    // Readiness: anyone reads the status and the checks' names; a check's reasons are
    // authorized as any path (the role above grants /readyz/*, as `system:monitoring` does).
    let (code, body) = https_get(&addr, "/readyz?verbose", None, None).await?;
    ensure!(
        code == 200 && body.contains("[+]caches ok") && body.contains("[+]conflicts ok"),
        "anonymous /readyz?verbose: {code} {body}"
    );
    let (code, body) = https_get(&addr, "/readyz/caches", None, None).await?;
    ensure!(code == 403, "anonymous /readyz/caches: {code} {body}");
    let (code, body) = https_get(&addr, "/readyz/caches", Some(&nobody), None).await?;
    ensure!(
        code == 403,
        "/readyz/caches without the role: {code} {body}"
    );
    let (code, body) = https_get(&addr, "/readyz/caches", Some(&reader), None).await?;
    ensure!(
        code == 200 && body.starts_with("ok\n"),
        "/readyz/caches for the reader: {code} {body}"
    );

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

    // A workload that makes every controller write, each under its own identity.
    let client = cluster().client().await?;
    k8s::wait_service_account(&client, &ns).await?;
    let j = Jobs::new(client, &ns);
    j.create(&jobs::job(
        "identity",
        json!({"completions": 2, "parallelism": 2}),
        jobs::template(Some(0), "1s"),
    )?)
    .await?;
    let (tainted, drained) = (unique("identity-tainted"), unique("identity-drained"));
    let manifest = log_dir().join(format!("{ns}-workload.json"));
    std::fs::write(
        &manifest,
        serde_json::to_vec(&workload(&ns, &tainted, &drained))?,
    )?;
    cluster().kubectl(&["apply", "-f", &manifest.to_string_lossy()])?;
    j.wait_finished("identity", Duration::from_secs(120))
        .await?;
    j.wait_event("identity", "Completed").await?;

    // Every request by a controller (its user agent) since it started. The CronJob's first slot
    // is up to a minute away.
    let last = std::sync::Mutex::new(Vec::new());
    let missing = |requests: &[Request]| -> Vec<String> {
        IDENTITIES
            .iter()
            .flat_map(|(c, _, want)| want.iter().map(move |w| (*c, *w)))
            .filter(|(c, w)| {
                !requests
                    .iter()
                    .any(|r| r.controller == *c && r.what == *w && (200..300).contains(&r.code))
            })
            .map(|(c, w)| format!("{c}: {w}"))
            .collect()
    };
    let waited = wait::until(
        "every controller's writes, answered 2xx, in the audit log",
        Duration::from_secs(90),
        Duration::from_secs(1),
        || async {
            let requests = controller_requests(started)?;
            let done = missing(&requests).is_empty();
            *last.lock().expect("not poisoned") = requests;
            Ok(done.then_some(()))
        },
    )
    .await;
    if let Err(e) = waited {
        let requests = last.lock().expect("not poisoned").clone();
        let failed: Vec<&Request> = requests
            .iter()
            .filter(|r| !(200..300).contains(&r.code))
            .collect();
        bail!(
            "{e:#}: missing {:?}; answered otherwise: {failed:?}",
            missing(&requests)
        );
    }
    // Requests sent after the last expected write count too (node-lifecycle's status patches
    // once the startup grace ends, retries, reads): give the audit log a moment to have them.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let requests = controller_requests(started)?;
    let foreign: Vec<&Request> = requests
        .iter()
        .filter(|r| {
            IDENTITIES
                .iter()
                .find(|(c, _, _)| *c == r.controller)
                .is_none_or(|(_, a, _)| r.user != format!("system:serviceaccount:kube-system:{a}"))
        })
        .collect();
    ensure!(
        foreign.is_empty(),
        "controller requests under another identity: {foreign:?}"
    );
    // Each identity has what its controller needs: nothing refused, reads included.
    let refused: Vec<&Request> = requests.iter().filter(|r| r.code == 403).collect();
    ensure!(refused.is_empty(), "requests refused (RBAC): {refused:?}");

    // Pilothouse's own identity reads (every cache's watch is its: streaming lists, so a watch
    // that has not ended is logged only as started) and writes only its own.
    let own = audit::read(&cluster().audit_log())?;
    let own: Vec<_> = own
        .iter()
        .filter(|e| {
            e.user.username == PILOTHOUSE_USER && e.received().is_some_and(|t| t >= started)
        })
        .collect();
    for resource in [
        "jobs",
        "pods",
        "nodes",
        "statefulsets",
        "endpointslices",
        "nodemaintenances",
    ] {
        ensure!(
            own.iter().any(|e| e.verb == "watch"
                && e.object_ref
                    .as_ref()
                    .is_some_and(|o| o.resource == resource)),
            "no {resource} watch by {PILOTHOUSE_USER}"
        );
    }
    let own: Vec<_> = own
        .into_iter()
        .filter(|e| e.stage == "ResponseComplete")
        .collect();
    let other: Vec<String> = own
        .iter()
        .filter(|e| !["get", "list", "watch"].contains(&e.verb.as_str()))
        .filter_map(|e| {
            let r = resource_of(e.object_ref.as_ref()?);
            (!OWN_WRITES.contains(&r.as_str()))
                .then(|| format!("{} {r} ({})", e.verb, e.user_agent))
        })
        .collect();
    ensure!(
        other.is_empty(),
        "{PILOTHOUSE_USER} wrote what a controller's identity should: {other:?}"
    );

    // Issue 30 §6: the job controller's ServiceAccount deleted by hand revokes its token; the
    // next request is refused (401), the token is renewed at once, the account created again,
    // and a new Job completes without a restart.
    let accounts: Api<ServiceAccount> = Api::namespaced(cluster().client().await?, "kube-system");
    // A token of the same account tells when the API server refuses the account's tokens; one
    // it authenticated lately stays accepted while its authentication is cached (kube-apiserver
    // caches a token's success 10 s), so the trial waits that out too.
    let witness = cluster()
        .kubectl(&["-n", "kube-system", "create", "token", "job-controller"])?
        .trim()
        .to_string();
    accounts
        .delete("job-controller", &DeleteParams::default())
        .await?;
    let reviews: Api<TokenReview> = Api::all(cluster().client().await?);
    wait::until(
        "the deleted account's tokens refused",
        Duration::from_secs(60),
        Duration::from_millis(500),
        || async {
            let review: TokenReview = serde_json::from_value(json!({"spec": {"token": witness}}))?;
            let answer = reviews.create(&PostParams::default(), &review).await?;
            let accepted = answer.status.and_then(|s| s.authenticated) == Some(true);
            Ok((!accepted).then_some(()))
        },
    )
    .await?;
    tokio::time::sleep(Duration::from_secs(11)).await;
    let revoked = Jobs::new(cluster().client().await?, &ns);
    revoked
        .create(&jobs::job(
            "after-revocation",
            json!({"completions": 1}),
            jobs::template(Some(0), "1s"),
        )?)
        .await?;
    revoked
        .wait_finished("after-revocation", Duration::from_secs(90))
        .await
        .with_context(|| format!("after the ServiceAccount was deleted:\n{}", p.log_tail(20)))?;
    ensure!(
        accounts.get_opt("job-controller").await?.is_some(),
        "the job controller's ServiceAccount was not created again"
    );

    let nodes: Api<Node> = Api::all(cluster().client().await?);
    let nms: Api<pilothouse_tests::maintenance::NodeMaintenance> =
        Api::all(cluster().client().await?);
    // Its finalizer is Pilothouse's to remove: gone before Pilothouse stops.
    nms.delete(&drained, &DeleteParams::default()).await?;
    wait::until(
        "the NodeMaintenance gone",
        Duration::from_secs(30),
        Duration::from_millis(200),
        || async { Ok(nms.get_opt(&drained).await?.is_none().then_some(())) },
    )
    .await?;
    for node in [&tainted, &drained] {
        nodes.delete(node, &DeleteParams::default()).await?;
    }
    cluster().delete_namespace(&ns).await?;
    Ok(())
}

/// `--tls-cert-file`/`--tls-private-key-file` are what is served (checked by trusting only that
/// certificate), and a missing file stops the start with its name.
async fn serving_certificate_files() -> Result<()> {
    let _alone = ONE_AT_A_TIME.lock().await;
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

/// Resident memory of process `pid`, in bytes.
fn rss(pid: u32) -> Result<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    let kib: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .context("no VmRSS")?;
    Ok(kib * 1024)
}

/// The 99th percentile of `samples` (nearest rank).
fn p99(samples: &mut [Duration]) -> Duration {
    samples.sort();
    samples
        .get((samples.len() * 99).div_ceil(100).saturating_sub(1))
        .copied()
        .unwrap_or_default()
}

/// Waits until the peer closes `s` (a read ends or fails), feeding it `feed` every 5 s, and
/// returns when that was.
async fn until_closed<S>(mut s: S, feed: Option<&'static [u8]>) -> std::time::Instant
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
{
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut buf = [0u8; 512];
    loop {
        tokio::select! {
            read = s.read(&mut buf) => match read {
                Ok(0) | Err(_) => return std::time::Instant::now(),
                Ok(_) => {}
            },
            () = tokio::time::sleep(Duration::from_secs(5)), if feed.is_some() => {
                if s.write_all(feed.unwrap_or_default()).await.is_err() {
                    return std::time::Instant::now();
                }
            }
        }
    }
}

/// Issue 30 §1–2: nothing a peer does on the secure port locks out the probes or a scrape.
/// 1,000 idle TLS connections, 200 slow-loris ones (headers never finished) and a flood of
/// 10,000 requests with random bearer tokens or random anonymous paths (each a review the API
/// server must answer) while the kubelet's probes (a fresh connection each) and a real scraper
/// are timed: probes answer under 100 ms p99, scrapes under 1 s p99, memory stays within 50 MiB
/// of idle, the slow-loris connections are closed by the header deadline (32 s, as
/// kube-apiserver's) and idle ones are closed to keep the open count at the cap.
async fn secure_port_under_flood() -> Result<()> {
    let _alone = ONE_AT_A_TIME.lock().await;
    let port = cluster().reserve_port()?;
    let addr = format!("127.0.0.1:{port}");
    let p = Pilothouse::spawn(
        "serving-flood",
        &cluster().kubeconfig,
        &log_dir(),
        &[
            "--controllers=job-controller".to_string(),
            format!("--leader-elect-resource-name={}", unique("serving-flood")),
            "--bind-address=127.0.0.1".to_string(),
            format!("--secure-port={port}"),
        ],
    )?;
    p.wait_log("serving securely", Duration::from_secs(30))
        .await?;
    let pid = p.pid().context("pilothouse exited")?;
    let ns = cluster().namespace("serving-flood").await?;
    let reader = scraper(&ns, "prometheus", true).await?;
    wait::until(
        "the metrics reader allowed",
        Duration::from_secs(25),
        Duration::from_millis(500),
        || async {
            let (code, _) = https_get(&addr, "/metrics", Some(&reader), None).await?;
            Ok((code == 200).then_some(()))
        },
    )
    .await?;
    let idle_rss = rss(pid)?;

    let mut idle = Vec::new();
    for _ in 0..1000 {
        let tls = tls_connect(&addr, None).await?;
        idle.push(tokio::spawn(until_closed(tls, None)));
    }
    let mut loris = Vec::new();
    let loris_opened = std::time::Instant::now();
    for _ in 0..200 {
        use tokio::io::AsyncWriteExt;
        let mut tls = tls_connect(&addr, None).await?;
        tls.write_all(format!("GET /healthz HTTP/1.1\r\nHost: {addr}\r\n").as_bytes())
            .await?;
        loris.push(tokio::spawn(until_closed(tls, Some(b"X-Slow: 1\r\n"))));
    }

    let sent = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let mut flood = Vec::new();
    for worker in 0..50 {
        let (addr, sent) = (addr.clone(), std::sync::Arc::clone(&sent));
        flood.push(tokio::spawn(async move {
            let mut answers: std::collections::BTreeMap<u16, usize> = Default::default();
            let mut conn = None;
            loop {
                let i = sent.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                if i >= 10_000 {
                    return answers;
                }
                if conn.is_none() {
                    conn = HttpsConnection::open(&addr).await.ok();
                }
                let Some(c) = conn.as_mut() else { continue };
                let (path, token) = if i % 2 == 0 {
                    ("/metrics".to_string(), Some(format!("bogus-{worker}-{i}")))
                } else {
                    (format!("/flood/{worker}/{i}"), None)
                };
                match c.get(&path, token.as_deref()).await {
                    Ok(code) => *answers.entry(code).or_default() += 1,
                    Err(_) => conn = None,
                }
            }
        }));
    }

    let (mut probes, mut scrapes) = (Vec::new(), Vec::new());
    let mut peak_rss = idle_rss;
    let started = std::time::Instant::now();
    while started.elapsed() < Duration::from_secs(45) || flood.iter().any(|f| !f.is_finished()) {
        ensure!(
            started.elapsed() < Duration::from_secs(240),
            "the flood did not end in 240 s"
        );
        for path in ["/healthz", "/readyz"] {
            let t = std::time::Instant::now();
            let (code, body) = https_get(&addr, path, None, None).await?;
            probes.push(t.elapsed());
            ensure!(code == 200, "{path} under the flood: {code} {body}");
        }
        if probes.len() % 20 == 0 {
            let t = std::time::Instant::now();
            let (code, _) = https_get(&addr, "/metrics", Some(&reader), None).await?;
            scrapes.push(t.elapsed());
            ensure!(code == 200, "a real scrape under the flood: {code}");
        }
        peak_rss = peak_rss.max(rss(pid)?);
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let mut answers: std::collections::BTreeMap<u16, usize> = Default::default();
    for f in flood {
        for (code, n) in f.await? {
            *answers.entry(code).or_default() += n;
        }
    }
    let (probe_p99, scrape_p99) = (p99(&mut probes), p99(&mut scrapes));
    let grown = peak_rss.saturating_sub(idle_rss) / (1024 * 1024);
    eprintln!(
        "flood: answers {answers:?}; {} probes p99 {probe_p99:?}; {} scrapes p99 {scrape_p99:?}; RSS {} MiB idle, +{grown} MiB at peak",
        probes.len(),
        scrapes.len(),
        idle_rss / (1024 * 1024)
    );
    ensure!(
        !answers.contains_key(&200),
        "a bogus credential was served: {answers:?}"
    );
    ensure!(
        probe_p99 < Duration::from_millis(100),
        "probes p99 {probe_p99:?} under the flood"
    );
    ensure!(
        scrape_p99 < Duration::from_secs(1),
        "scrapes p99 {scrape_p99:?} under the flood"
    );
    ensure!(grown < 50, "RSS grew {grown} MiB under the flood");
    for (i, l) in loris.into_iter().enumerate() {
        let closed = tokio::time::timeout(Duration::from_secs(5), l)
            .await
            .with_context(|| format!("slow-loris connection {i} still open"))??;
        let after = closed - loris_opened;
        ensure!(
            after < Duration::from_secs(40),
            "slow-loris connection {i} closed only after {after:?}"
        );
    }
    // Idle connections beyond the cap made way for newer ones; the rest close within the idle
    // deadline (90 s) at the latest, which this trial does not wait for.
    let closed = idle.iter().filter(|c| c.is_finished()).count();
    ensure!(
        closed >= 1000 - 512,
        "{closed} of 1,000 idle connections closed: more than the cap stayed open"
    );
    // Under the flood most slow-loris connections made way for newer ones before their
    // header deadline. With nothing else connecting, the deadline alone closes them, at 32 s.
    let mut quiet = Vec::new();
    let opened = std::time::Instant::now();
    for _ in 0..5 {
        use tokio::io::AsyncWriteExt;
        let mut tls = tls_connect(&addr, None).await?;
        tls.write_all(format!("GET /healthz HTTP/1.1\r\nHost: {addr}\r\n").as_bytes())
            .await?;
        quiet.push(tokio::spawn(until_closed(tls, Some(b"X-Slow: 1\r\n"))));
    }
    for (i, l) in quiet.into_iter().enumerate() {
        let after = tokio::time::timeout(Duration::from_secs(60), l)
            .await
            .with_context(|| format!("quiet slow-loris connection {i} still open after 60 s"))??
            - opened;
        ensure!(
            (Duration::from_secs(30)..Duration::from_secs(40)).contains(&after),
            "quiet slow-loris connection {i} closed after {after:?}, not at the 32 s header deadline"
        );
    }
    ensure!(!p.log_text().contains("panicked"), "{}", p.log_tail(20));
    cluster().delete_namespace(&ns).await?;
    Ok(())
}

fn main() -> ! {
    pilothouse_tests::harness::main(
        "serving",
        // kcm runs none of the controllers Pilothouse has built.
        ClusterOptions::default(),
        None,
        vec![
            trial(
                "secure_port_and_controller_identities",
                secure_port_and_controller_identities,
            ),
            trial("serving_certificate_files", serving_certificate_files),
            trial("secure_port_under_flood", secure_port_under_flood),
        ],
    )
}
