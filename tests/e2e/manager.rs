//! End-to-end tests of the manager (issue 2): leader election, failover, graceful release,
//! partition step-down, `--controllers`, health and metrics, and the control-plane fixtures
//! themselves (kwok stages). All share one local control plane and run concurrently; each
//! election test uses its own Lease name so they never compete with each other.

use anyhow::{Context, Result, bail, ensure};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use pilothouse_tests::cluster::ClusterOptions;
use pilothouse_tests::harness::{cluster, log_dir, trial};
use pilothouse_tests::{Pilothouse, audit, proxy::Proxy, unique, wait};
use std::time::Duration;
use tokio::time::Instant;

/// Election flags for a test: its own lease, default timings unless overridden.
/// Controllers run only the taint-eviction controller: kube-controller-manager keeps node
/// lifecycle for this suite's nodes, and no NoExecute taint exists here for the TEC to act on.
fn election_args(lease: &str, extra: &[&str]) -> Vec<String> {
    let mut v = vec![
        format!("--leader-elect-resource-name={lease}"),
        "--leader-elect-resource-namespace=kube-system".to_string(),
    ];
    if !extra.iter().any(|a| a.starts_with("--controllers")) {
        v.push("--controllers=taint-eviction-controller".to_string());
    }
    v.extend(extra.iter().map(|s| s.to_string()));
    v
}

fn spawn(name: &str, args: &[String]) -> Result<Pilothouse> {
    Pilothouse::spawn(&unique(name), &cluster().kubeconfig, &log_dir(), args)
}

async fn holder(lease: &str) -> Result<Option<String>> {
    let api: Api<Lease> = Api::namespaced(cluster().client().await?, "kube-system");
    Ok(api
        .get_opt(lease)
        .await?
        .and_then(|l| l.spec)
        .and_then(|s| s.holder_identity)
        .filter(|h| !h.is_empty()))
}

async fn wait_holder(lease: &str, not: Option<&str>, timeout: Duration) -> Result<String> {
    wait::until(
        &format!("a holder of lease {lease} other than {not:?}"),
        timeout,
        Duration::from_millis(100),
        || async { Ok(holder(lease).await?.filter(|h| Some(h.as_str()) != not)) },
    )
    .await
}

async fn master_status(p: &Pilothouse, lease: &str) -> Result<f64> {
    p.metric(&format!(
        "leader_election_master_status{{name=\"{lease}\"}}"
    ))
    .await?
    .context("no leader_election_master_status sample")
}

/// Which of two replicas holds `lease` (by the identity each logged).
async fn leader_and_standby(
    a: Pilothouse,
    b: Pilothouse,
    lease: &str,
) -> Result<(Pilothouse, Pilothouse, String)> {
    let id = wait_holder(lease, None, Duration::from_secs(30)).await?;
    a.wait_log(
        "attempting to acquire leader lease",
        Duration::from_secs(10),
    )
    .await?;
    b.wait_log(
        "attempting to acquire leader lease",
        Duration::from_secs(10),
    )
    .await?;
    if a.log_text().contains(&id) {
        Ok((a, b, id))
    } else if b.log_text().contains(&id) {
        Ok((b, a, id))
    } else {
        bail!("lease holder {id} is neither replica")
    }
}

/// Two replicas on a fresh Lease: (lease, leader, standby, leader identity).
async fn two_replicas(tag: &str) -> Result<(String, Pilothouse, Pilothouse, String)> {
    let lease = unique(&format!("ph-{tag}"));
    let a = spawn(&format!("{tag}-1"), &election_args(&lease, &[]))?;
    let b = spawn(&format!("{tag}-2"), &election_args(&lease, &[]))?;
    let (leader, standby, id) = leader_and_standby(a, b, &lease).await?;
    Ok((lease, leader, standby, id))
}

/// (a) Two replicas: exactly one holds the Lease and acts; the other stays a warm standby.
async fn election_two_replicas_one_leads() -> Result<()> {
    let (lease, leader, standby, id) = two_replicas("a").await?;
    leader
        .wait_log(
            "leading; waiting for caches to sync",
            Duration::from_secs(10),
        )
        .await?;
    // Hold for a few renewals: no flapping, the standby never acts.
    tokio::time::sleep(Duration::from_secs(6)).await;
    ensure!(
        holder(&lease).await?.as_deref() == Some(id.as_str()),
        "lease changed hands without a failure"
    );
    ensure!(
        master_status(&leader, &lease).await? == 1.0,
        "leader does not report master status 1"
    );
    ensure!(
        master_status(&standby, &lease).await? == 0.0,
        "standby reports master status 1"
    );
    ensure!(
        !standby.log_text().contains("leading; waiting for caches"),
        "standby started acting:\n{}",
        standby.log_tail(20)
    );
    // Controllers run on the leader only (this suite has no NoExecute taint for them to act on).
    ensure!(
        leader.log_text().contains("starting controller"),
        "leader started no controller:\n{}",
        leader.log_tail(20)
    );
    ensure!(
        !standby.log_text().contains("starting controller"),
        "standby started a controller:\n{}",
        standby.log_tail(20)
    );
    // Both are Ready (caches warm) and healthy.
    for p in [&leader, &standby] {
        ensure!(
            p.http_get("/readyz").await?.0 == 200,
            "{} not ready",
            p.name
        );
        ensure!(
            p.http_get("/healthz").await?.0 == 200,
            "{} not healthy",
            p.name
        );
    }
    Ok(())
}

/// (b) SIGKILL the leader: the standby leads within lease duration + one jittered retry period.
async fn election_sigkill_failover() -> Result<()> {
    let (lease, mut leader, standby, id) = two_replicas("b").await?;
    tokio::time::sleep(Duration::from_secs(3)).await;
    let t0 = Instant::now();
    leader.sigkill()?;
    leader.wait_exit(Duration::from_secs(5)).await?;
    let new = wait_holder(&lease, Some(&id), Duration::from_secs(30)).await?;
    let took = t0.elapsed();
    println!("MEASURE crash failover: {:.2}s", took.as_secs_f64());
    ensure!(
        standby.log_text().contains(&new),
        "new holder {new} is not the standby"
    );
    // 15 s lease + 2 s * (1 + 1.2) jittered retry = 19.4 s, plus 0.1 s of polling here.
    ensure!(
        took <= Duration::from_millis(19_500),
        "standby took {took:?} to lead"
    );
    // It must not steal a lease that had not expired: the last renewal was at most 2 s before
    // the kill, and the standby saw it at most one retry (≤4.4 s) later.
    ensure!(
        took >= Duration::from_secs(9),
        "standby acquired after only {took:?}: before the lease expired"
    );
    standby
        .wait_log(
            "leading; waiting for caches to sync",
            Duration::from_secs(5),
        )
        .await?;
    Ok(())
}

/// (c) SIGTERM the leader: it drains (≤ 2 s), releases the Lease, exits 0; the standby leads
/// within one jittered retry period after the release (≤ 5 s in all).
async fn election_sigterm_release() -> Result<()> {
    let (lease, mut leader, standby, id) = two_replicas("c").await?;
    tokio::time::sleep(Duration::from_secs(3)).await;
    let t0 = Instant::now();
    leader.sigterm()?;
    let status = leader.wait_exit(Duration::from_secs(5)).await?;
    let exited = t0.elapsed();
    ensure!(
        status.success(),
        "graceful stop exited with {status}; log:\n{}",
        leader.log_tail(20)
    );
    ensure!(
        leader.log_text().contains("released leader lease"),
        "no release logged:\n{}",
        leader.log_tail(20)
    );
    let new = wait_holder(&lease, Some(&id), Duration::from_secs(10)).await?;
    let took = t0.elapsed();
    println!(
        "MEASURE graceful failover: {:.2}s (leader exited after {:.2}s)",
        took.as_secs_f64(),
        exited.as_secs_f64()
    );
    ensure!(
        standby.log_text().contains(&new),
        "new holder {new} is not the standby"
    );
    ensure!(
        exited <= Duration::from_millis(2_500),
        "drain and release took {exited:?}"
    );
    ensure!(
        took <= Duration::from_secs(5),
        "standby took {took:?} after SIGTERM to lead"
    );
    Ok(())
}

/// (d) The leader's connection to the API server is cut: it stops acting before its renew
/// deadline passes and exits non-zero; the standby takes over.
async fn election_partition_steps_down() -> Result<()> {
    let lease = unique("ph-d");
    let proxy = Proxy::start(cluster().apiserver_port()?).await?;
    let via_proxy = cluster().kubeconfig_via(proxy.port, &unique("proxied"))?;
    // The proxied replica starts first so it is the leader.
    let mut leader = Pilothouse::spawn(
        &unique("d-1"),
        &via_proxy,
        &log_dir(),
        &election_args(&lease, &[]),
    )?;
    let id = wait_holder(&lease, None, Duration::from_secs(30)).await?;
    ensure!(
        leader.log_text().contains(&id),
        "the proxied replica did not lead"
    );
    let standby = spawn("d-2", &election_args(&lease, &[]))?;
    standby
        .wait_log(
            "attempting to acquire leader lease",
            Duration::from_secs(10),
        )
        .await?;
    tokio::time::sleep(Duration::from_secs(3)).await;

    let t0 = Instant::now();
    proxy.cut();
    // Renew deadline is 10 s from the start of the last successful renewal (≤ 2 s before the
    // cut): by t0 + 10 s the leader must no longer claim leadership.
    let status = leader.wait_exit(Duration::from_secs(15)).await?;
    let exited = t0.elapsed();
    ensure!(!status.success(), "partitioned leader exited with success");
    ensure!(
        leader.log_text().contains("leader election lost"),
        "no step-down logged:\n{}",
        leader.log_tail(20)
    );
    let lost_line = leader
        .log_text()
        .lines()
        .find(|l| l.contains("leader election lost"))
        .unwrap_or_default()
        .to_string();
    let new = wait_holder(&lease, Some(&id), Duration::from_secs(30)).await?;
    let took = t0.elapsed();
    println!(
        "MEASURE partition: leader exited {:.2}s after the cut, standby led {:.2}s after it",
        exited.as_secs_f64(),
        took.as_secs_f64()
    );
    ensure!(
        standby.log_text().contains(&new),
        "new holder {new} is not the standby"
    );
    // Exit = step-down at the deadline (≤ 10 s) + drain (≤ 2 s).
    ensure!(
        exited <= Duration::from_secs(12),
        "leader took {exited:?} to exit: {lost_line}"
    );
    ensure!(
        exited < took,
        "standby led before the partitioned leader stopped"
    );
    Ok(())
}

/// (e) `--controllers` validation: an unknown name is a start-up error naming the valid ones;
/// `*` runs the on-by-default controllers only, so node-maintenance-controller (ours, off by
/// default: it needs its CRD) stays off under `*` and runs when named.
async fn controllers_flag() -> Result<()> {
    let lease = unique("ph-e");
    let mut bad = spawn(
        "e-unknown",
        &election_args(&lease, &["--controllers=*,jobs"]),
    )?;
    let status = bad.wait_exit(Duration::from_secs(10)).await?;
    ensure!(
        status.code() == Some(2),
        "unknown controller exited with {status}"
    );
    let log = bad.log_text();
    ensure!(
        log.contains("\"jobs\" is not in the list of known controllers")
            && log.contains("job-controller, cronjob-controller")
            && log.contains("node-maintenance-controller"),
        "{log}"
    );

    let mut ok = spawn(
        "e-star",
        &election_args(
            &lease,
            &[
                "--controllers=*,-job-controller,-node-lifecycle-controller,-cronjob-controller,-statefulset-controller,-endpointslice-controller,-endpointslice-mirroring-controller",
            ],
        ),
    )?;
    ok.wait_log(
        "leading; waiting for caches to sync",
        Duration::from_secs(30),
    )
    .await?;
    ensure!(ok.running(), "exited: {}", ok.log_tail(20));
    // Every on-by-default controller but those named (node lifecycle stays with kcm in this
    // suite): not node-maintenance-controller.
    ensure!(
        ok.log_text()
            .contains("enabled=[\"taint-eviction-controller\"]"),
        "{}",
        ok.log_tail(20)
    );
    ok.sigterm()?;
    ensure!(ok.wait_exit(Duration::from_secs(5)).await?.success());

    // Named, it runs (its caches list NodeMaintenances: the CRD must be served).
    pilothouse_tests::maintenance::install_crd(cluster()).await?;
    let lease = unique("ph-e-nm");
    let mut named = spawn(
        "e-named",
        &election_args(&lease, &["--controllers=node-maintenance-controller"]),
    )?;
    named
        .wait_log(
            "starting controller controller=\"node-maintenance-controller\"",
            Duration::from_secs(30),
        )
        .await?;
    ensure!(
        named
            .log_text()
            .contains("enabled=[\"node-maintenance-controller\"]"),
        "{}",
        named.log_tail(20)
    );
    named.sigterm()?;
    ensure!(named.wait_exit(Duration::from_secs(5)).await?.success());
    Ok(())
}

/// (e) With `--controllers` naming one controller only that controller runs, and the API
/// server's audit log shows watches only for the resource types it needs; with it disabled no
/// cache watches at all. On a control plane of its own, so the audit log holds only this test's
/// Pilothouse processes.
async fn controllers_flag_limits_watches() -> Result<()> {
    use pilothouse_tests::cluster::Cluster;
    let own = Cluster::up(
        &unique("watches"),
        ClusterOptions {
            nodes: 0,
            ..Default::default()
        },
    )?;
    let dir = own.dir.join("pilothouse-logs");
    std::fs::create_dir_all(&dir)?;
    let watches_since =
        |from: k8s_openapi::jiff::Timestamp| -> Result<std::collections::BTreeSet<String>> {
            let events = audit::read(&own.audit_log())?;
            let later: Vec<audit::AuditEvent> = events
                .into_iter()
                .filter(|e| e.received().is_some_and(|t| t >= from))
                .collect();
            let mut other = later
                .iter()
                .filter(|e| e.verb == "watch" && e.user_agent.contains("pilothouse/"))
                .filter(|e| !e.user_agent.contains("pilothouse/shared-informers"));
            // Besides the caches, only the election client watches, and only its own Lease.
            if let Some(e) = other.find(|e| {
                !(e.user_agent.contains("pilothouse/leader-election")
                    && e.request_uri.contains("fieldSelector=metadata.name"))
            }) {
                bail!("unexpected watch: {} {}", e.user_agent, e.request_uri);
            }
            Ok(audit::watched_resources(
                &later,
                "pilothouse/shared-informers",
            ))
        };

    // Each controller alone: it starts, and the caches watch exactly what it reads.
    // node-maintenance-controller's caches list NodeMaintenances: serve the CRD first.
    pilothouse_tests::maintenance::install_crd(&own).await?;
    let alone: [(&str, &str, &[&str]); 7] = [
        (
            "taint-eviction-controller",
            "taint-eviction-controller",
            &["nodes", "pods"],
        ),
        (
            "nodelifecycle",
            "node-lifecycle-controller",
            &["leases", "nodes", "pods"],
        ),
        ("job", "job-controller", &["jobs", "pods"]),
        ("cronjob", "cronjob-controller", &["cronjobs", "jobs"]),
        (
            "endpointslice",
            "endpointslice-controller",
            &["endpointslices", "nodes", "pods", "services"],
        ),
        (
            "endpointslicemirroring",
            "endpointslice-mirroring-controller",
            &["endpoints", "endpointslices", "services"],
        ),
        (
            "node-maintenance-controller",
            "node-maintenance-controller",
            &[
                "daemonsets",
                "nodemaintenances",
                "nodes",
                "poddisruptionbudgets",
                "pods",
            ],
        ),
    ];
    for (flag, name, want) in alone {
        let start = k8s_openapi::jiff::Timestamp::now();
        let mut p = Pilothouse::spawn(
            &format!("only-{flag}"),
            &own.kubeconfig,
            &dir,
            &[format!("--controllers={flag}")],
        )?;
        p.wait_log(
            &format!("starting controller controller=\"{name}\""),
            Duration::from_secs(30),
        )
        .await?;
        ensure!(
            p.log_text().matches("starting controller").count() == 1,
            "{}",
            p.log_tail(20)
        );
        tokio::time::sleep(Duration::from_secs(2)).await;
        let watched = watches_since(start)?;
        let want: std::collections::BTreeSet<String> = want.iter().map(|s| s.to_string()).collect();
        ensure!(
            watched == want,
            "{name} alone watched {watched:?}, want {want:?}"
        );
        p.sigterm()?;
        ensure!(p.wait_exit(Duration::from_secs(5)).await?.success());
    }

    let start = k8s_openapi::jiff::Timestamp::now();
    let mut none = Pilothouse::spawn(
        "none",
        &own.kubeconfig,
        &dir,
        &[
            "--controllers=*,-taint-eviction-controller,-node-lifecycle-controller,-job-controller,-cronjob-controller,-statefulset-controller,-endpointslice-controller,-endpointslice-mirroring-controller"
                .to_string(),
        ],
    )?;
    none.wait_log(
        "leading; waiting for caches to sync",
        Duration::from_secs(30),
    )
    .await?;
    ensure!(
        none.log_text().contains("enabled=[]"),
        "{}",
        none.log_tail(20)
    );
    tokio::time::sleep(Duration::from_secs(2)).await;
    let watched = watches_since(start)?;
    ensure!(
        watched.is_empty(),
        "with no controller enabled the caches watched {watched:?}"
    );
    none.sigterm()?;
    ensure!(none.wait_exit(Duration::from_secs(5)).await?.success());
    drop(own);
    Ok(())
}

/// Health and metrics endpoints, and `--leader-elect=false`.
async fn health_metrics_and_no_election() -> Result<()> {
    let lease = unique("ph-h");
    let p = spawn("h-1", &election_args(&lease, &["--leader-elect=false"]))?;
    p.wait_log(
        "leading; waiting for caches to sync",
        Duration::from_secs(30),
    )
    .await?;
    ensure!(p.http_get("/healthz").await? == (200, "ok\n".to_string()));
    // Ready once the enabled controllers' caches have listed.
    wait::until(
        "/readyz to report ready",
        Duration::from_secs(30),
        Duration::from_millis(100),
        || async { Ok((p.http_get("/readyz").await?.0 == 200).then_some(())) },
    )
    .await?;
    let (code, body) = p.http_get("/metrics").await?;
    ensure!(
        code == 200 && body.ends_with("# EOF\n"),
        "metrics: {code} {body}"
    );
    ensure!(
        holder(&lease).await?.is_none(),
        "--leader-elect=false touched the lease"
    );
    let q = spawn("h-2", &election_args(&lease, &[]))?;
    wait_holder(&lease, None, Duration::from_secs(30)).await?;
    // Created (POST), then renewed (PUT) every retry period, each counted by verb and code.
    let body = wait::until(
        "a counted lease renewal",
        Duration::from_secs(10),
        Duration::from_millis(200),
        || async {
            let body = q.http_get("/metrics").await?.1;
            Ok(body
                .contains("rest_client_requests_total{code=\"200\",method=\"PUT\"")
                .then_some(body))
        },
    )
    .await?;
    ensure!(
        body.contains("rest_client_requests_total{code=\"201\",method=\"POST\""),
        "no create counted:\n{body}"
    );
    ensure!(
        body.contains(&format!(
            "leader_election_master_status{{name=\"{lease}\"}} 1"
        )),
        "{body}"
    );
    Ok(())
}

/// The kwok stages the other suites rely on: pods run with IPs, exit with a chosen code on
/// demand, and a deleted pod runs out its grace period, ends with 143, and stays while a
/// finalizer holds it.
async fn kwok_pod_lifecycle() -> Result<()> {
    let ns = cluster().namespace("kwok").await?;
    let pods: Api<Pod> = Api::namespaced(cluster().client().await?, &ns);
    let pod = |name: &str,
               annotations: serde_json::Value,
               finalizers: serde_json::Value|
     -> Result<Pod> {
        Ok(serde_json::from_value(serde_json::json!({
            "metadata": {"name": name, "annotations": annotations, "finalizers": finalizers},
            "spec": {
                "terminationGracePeriodSeconds": 2,
                "tolerations": [{"key": "kwok.x-k8s.io/node", "operator": "Exists"}],
                "containers": [{"name": "c", "image": "busybox"}]
            }
        }))?)
    };
    // The namespace's default ServiceAccount appears asynchronously (kcm's serviceaccount controller).
    let sa: Api<k8s_openapi::api::core::v1::ServiceAccount> =
        Api::namespaced(cluster().client().await?, &ns);
    wait::until(
        "default service account",
        Duration::from_secs(30),
        Duration::from_millis(200),
        || async { Ok(sa.get_opt("default").await?) },
    )
    .await?;
    pods.create(
        &PostParams::default(),
        &pod(
            "exit",
            serde_json::json!({"pilothouse.test/exit-code": "7", "pilothouse.test/run-for": "1s"}),
            serde_json::json!([]),
        )?,
    )
    .await?;
    pods.create(
        &PostParams::default(),
        &pod(
            "held",
            serde_json::json!({}),
            serde_json::json!(["pilothouse.test/hold"]),
        )?,
    )
    .await?;
    let phase = |p: &Pod| {
        p.status
            .as_ref()
            .and_then(|s| s.phase.clone())
            .unwrap_or_default()
    };
    let running = wait::until(
        "held pod running with an IP",
        Duration::from_secs(30),
        Duration::from_millis(200),
        || async {
            let p = pods.get("held").await?;
            Ok((phase(&p) == "Running"
                && p.status.as_ref().and_then(|s| s.pod_ip.clone()).is_some())
            .then_some(p))
        },
    )
    .await?;
    ensure!(
        running
            .spec
            .as_ref()
            .and_then(|s| s.node_name.clone())
            .is_some_and(|n| n.starts_with("kwok-node-"))
    );
    let exit_code = |p: &Pod| {
        p.status
            .as_ref()
            .and_then(|s| s.container_statuses.as_ref())
            .and_then(|c| c.first().cloned())
            .and_then(|c| c.state)
            .and_then(|s| s.terminated)
            .map(|t| t.exit_code)
    };
    let failed = wait::until(
        "exit pod failed",
        Duration::from_secs(30),
        Duration::from_millis(200),
        || async {
            let p = pods.get("exit").await?;
            Ok((phase(&p) == "Failed").then_some(p))
        },
    )
    .await?;
    ensure!(
        exit_code(&failed) == Some(7),
        "exit code {:?}",
        exit_code(&failed)
    );

    let t0 = Instant::now();
    pods.delete("held", &DeleteParams::default()).await?;
    let terminated = wait::until(
        "held pod terminated",
        Duration::from_secs(30),
        Duration::from_millis(100),
        || async {
            let p = pods.get("held").await?;
            Ok((phase(&p) == "Failed").then_some(p))
        },
    )
    .await?;
    ensure!(
        t0.elapsed() >= Duration::from_millis(1000),
        "terminated before its grace period: {:?}",
        t0.elapsed()
    );
    ensure!(exit_code(&terminated) == Some(143));
    tokio::time::sleep(Duration::from_secs(2)).await;
    ensure!(
        pods.get_opt("held").await?.is_some(),
        "pod vanished while its finalizer was still set"
    );
    pods.patch(
        "held",
        &PatchParams::default(),
        &Patch::Merge(serde_json::json!({"metadata": {"finalizers": null}})),
    )
    .await?;
    wait::until(
        "held pod gone",
        Duration::from_secs(30),
        Duration::from_millis(200),
        || async { Ok(pods.get_opt("held").await?.is_none().then_some(())) },
    )
    .await?;
    cluster().delete_namespace(&ns).await?;
    Ok(())
}

/// The kwok hooks node-level suites rely on: Leases renewed every ~2 s; a node unlabelled from
/// kwok stops renewing (unreachable) and resumes when relabelled; `pilothouse.test/not-ready`
/// makes it report Ready=False with a live Lease; pods report restarts on demand and honour a set
/// termination delay.
async fn kwok_node_and_pod_hooks() -> Result<()> {
    use k8s_openapi::api::core::v1::Node;
    use pilothouse_tests::k8s;
    let client = cluster().client().await?;
    let node = unique("hooks-node");
    k8s::create_kwok_node(&client, &node, "zone-hooks").await?;
    let leases: Api<Lease> = Api::namespaced(client.clone(), "kube-node-lease");
    let nodes: Api<Node> = Api::all(client.clone());
    let renewed = || async {
        let l = leases.get(&node).await?;
        Ok::<_, anyhow::Error>(l.spec.and_then(|s| s.renew_time).map(|t| t.0))
    };
    // Renewed every ~2 s (lease duration 8 s / 4).
    let r0 = renewed().await?;
    tokio::time::sleep(Duration::from_millis(3000)).await;
    let r1 = renewed().await?;
    ensure!(r1 > r0, "lease not renewed within 3 s: {r0:?} -> {r1:?}");

    // Unreachable: leave kwok's selector; the Lease stops.
    let label =
        |v: Option<&str>| serde_json::json!({"metadata": {"labels": {"pilothouse.test/kwok": v}}});
    nodes
        .patch(&node, &PatchParams::default(), &Patch::Merge(label(None)))
        .await?;
    tokio::time::sleep(Duration::from_millis(2500)).await;
    let stopped = renewed().await?;
    tokio::time::sleep(Duration::from_millis(5000)).await;
    ensure!(
        renewed().await? == stopped,
        "lease still renewed after leaving kwok's selector"
    );
    nodes
        .patch(
            &node,
            &PatchParams::default(),
            &Patch::Merge(label(Some("shared"))),
        )
        .await?;
    wait::until(
        "lease renewals to resume",
        Duration::from_secs(10),
        Duration::from_millis(200),
        || async { Ok((renewed().await? > stopped).then_some(())) },
    )
    .await?;

    let ready = || async {
        let n = nodes.get(&node).await?;
        Ok::<_, anyhow::Error>(
            n.status
                .and_then(|s| s.conditions)
                .and_then(|cs| cs.into_iter().find(|c| c.type_ == "Ready"))
                .map(|c| c.status),
        )
    };
    // kube-controller-manager marked it Unknown meanwhile; kwok reports Ready again.
    wait::until(
        "Ready=True after recovery",
        Duration::from_secs(30),
        Duration::from_millis(200),
        || async { Ok((ready().await?.as_deref() == Some("True")).then_some(())) },
    )
    .await?;
    let not_ready = |v: Option<&str>| serde_json::json!({"metadata": {"labels": {"pilothouse.test/not-ready": v}}});
    nodes
        .patch(
            &node,
            &PatchParams::default(),
            &Patch::Merge(not_ready(Some("true"))),
        )
        .await?;
    wait::until(
        "Ready=False",
        Duration::from_secs(10),
        Duration::from_millis(200),
        || async { Ok((ready().await?.as_deref() == Some("False")).then_some(())) },
    )
    .await?;
    let before = renewed().await?;
    tokio::time::sleep(Duration::from_millis(3000)).await;
    ensure!(
        renewed().await? > before,
        "a not-ready node must keep renewing its lease"
    );
    nodes
        .patch(
            &node,
            &PatchParams::default(),
            &Patch::Merge(not_ready(None)),
        )
        .await?;
    wait::until(
        "Ready=True again",
        Duration::from_secs(10),
        Duration::from_millis(200),
        || async { Ok((ready().await?.as_deref() == Some("True")).then_some(())) },
    )
    .await?;

    // Pods: restarts on demand, and a set termination delay.
    let ns = cluster().namespace("hooks").await?;
    k8s::wait_service_account(&client, &ns).await?;
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);
    let pod: Pod = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "p", "finalizers": ["pilothouse.test/hold"], "annotations": {"pilothouse.test/terminate-after": "2s"}},
        "spec": {"nodeName": node, "restartPolicy": "OnFailure", "terminationGracePeriodSeconds": 60,
                 "containers": [{"name": "c", "image": "busybox"}]}
    }))?;
    pods.create(&PostParams::default(), &pod).await?;
    let restarts = || async {
        let p = pods.get("p").await?;
        Ok::<_, anyhow::Error>((
            p.status.as_ref().and_then(|s| s.phase.clone()),
            p.status
                .and_then(|s| s.container_statuses)
                .and_then(|c| c.first().map(|c| c.restart_count)),
            p.metadata.resource_version,
        ))
    };
    wait::until(
        "pod running",
        Duration::from_secs(30),
        Duration::from_millis(100),
        || async { Ok((restarts().await?.0.as_deref() == Some("Running")).then_some(())) },
    )
    .await?;
    for n in [2, 3] {
        let a = serde_json::json!({"metadata": {"annotations": {"pilothouse.test/restarts": n.to_string()}}});
        pods.patch("p", &PatchParams::default(), &Patch::Merge(a))
            .await?;
        wait::until(
            &format!("restartCount {n}"),
            Duration::from_secs(10),
            Duration::from_millis(100),
            || async { Ok((restarts().await?.1 == Some(n)).then_some(())) },
        )
        .await?;
    }
    let rv = restarts().await?.2;
    tokio::time::sleep(Duration::from_secs(2)).await;
    ensure!(restarts().await?.2 == rv, "kwok keeps rewriting the pod");
    let t0 = Instant::now();
    pods.delete("p", &DeleteParams::default()).await?;
    wait::until(
        "pod terminated",
        Duration::from_secs(20),
        Duration::from_millis(100),
        || async { Ok((restarts().await?.0.as_deref() == Some("Failed")).then_some(())) },
    )
    .await?;
    let took = t0.elapsed();
    ensure!(
        took >= Duration::from_millis(1500) && took <= Duration::from_secs(6),
        "terminated after {took:?}, want ~2 s (not the 60 s grace)"
    );
    k8s::release_pods(&client, &ns).await?;
    k8s::delete_node(&client, &node).await?;
    cluster().delete_namespace(&ns).await?;
    Ok(())
}

/// The in-test webhook: rejects chosen requests a set number of times, delays others, and sees
/// who asked.
async fn webhook_rejects_then_allows_and_delays() -> Result<()> {
    use k8s_openapi::api::core::v1::ConfigMap;
    use pilothouse_tests::webhook::{Match, Webhook};
    let ns = cluster().namespace("hook").await?;
    let client = cluster().client().await?;
    let hook = Webhook::start(client.clone(), &ns, &["configmaps"], &["CREATE", "UPDATE"]).await?;
    let cms: Api<ConfigMap> = Api::namespaced(client, &ns);
    let cm = |name: &str| -> Result<ConfigMap> {
        Ok(serde_json::from_value(
            serde_json::json!({"metadata": {"name": name}}),
        )?)
    };
    hook.reject(
        Match {
            resource: Some("configmaps".into()),
            operation: Some("CREATE".into()),
            name: Some("r".into()),
            ..Default::default()
        },
        2,
        "no, not yet",
    );
    for attempt in 0..2 {
        match cms.create(&PostParams::default(), &cm("r")?).await {
            Err(kube::Error::Api(e)) => ensure!(
                e.message.contains("no, not yet") && e.code == 403,
                "attempt {attempt}: {e:?}"
            ),
            other => bail!("attempt {attempt} was not rejected: {other:?}"),
        }
    }
    cms.create(&PostParams::default(), &cm("r")?)
        .await
        .context("third create")?;
    hook.delay(
        Match {
            resource: Some("configmaps".into()),
            operation: Some("UPDATE".into()),
            ..Default::default()
        },
        Duration::from_millis(1500),
    );
    let t0 = Instant::now();
    cms.patch(
        "r",
        &PatchParams::default(),
        &Patch::Merge(serde_json::json!({"data": {"k": "v"}})),
    )
    .await?;
    ensure!(
        t0.elapsed() >= Duration::from_millis(1500),
        "update not delayed: {:?}",
        t0.elapsed()
    );
    let seen = hook.seen();
    let verdicts: Vec<(String, bool)> = seen
        .iter()
        .filter(|s| s.name == "r")
        .map(|s| (s.operation.clone(), s.allowed))
        .collect();
    ensure!(
        verdicts
            == [
                ("CREATE".to_string(), false),
                ("CREATE".to_string(), false),
                ("CREATE".to_string(), true),
                ("UPDATE".to_string(), true)
            ],
        "{verdicts:?}"
    );
    ensure!(
        // Only our object: kube-controller-manager may publish kube-root-ca.crt meanwhile.
        seen.iter()
            .filter(|s| s.name == "r")
            .all(|s| s.user == "pilothouse-admin"),
        "{seen:?}"
    );
    hook.remove().await?;
    cluster().delete_namespace(&ns).await?;
    Ok(())
}

/// The API server accepts the kube-system manifests as they are (server-side dry run).
async fn manifests_are_accepted() -> Result<()> {
    let bin = std::process::Command::new(pilothouse_tests::repo_root().join("tests/cluster/build"))
        .output()?;
    let bin = String::from_utf8(bin.stdout)?.trim().to_string();
    let manifests = pilothouse_tests::repo_root().join("manifests");
    let dry_run = |how: &str, path: &std::path::Path| -> Result<String> {
        let out = std::process::Command::new(format!("{bin}/kubectl"))
            .arg(format!("--kubeconfig={}", cluster().kubeconfig.display()))
            .args(["apply", "--dry-run=server", how])
            .arg(path)
            .output()?;
        ensure!(
            out.status.success(),
            "{}: {}",
            path.display(),
            String::from_utf8_lossy(&out.stderr)
        );
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    };
    // The Kustomize base as an operator applies it, then every manifest outside it.
    let text = dry_run("-k", &manifests)?;
    ensure!(
        text.contains("deployment.apps/pilothouse created (server dry run)"),
        "{text}"
    );
    let base = std::fs::read_to_string(manifests.join("kustomization.yaml"))?;
    for entry in std::fs::read_dir(&manifests)? {
        let path = entry?.path();
        let name = path
            .file_name()
            .and_then(|n| n.to_str())
            .unwrap_or_default()
            .to_string();
        if path.extension().is_some_and(|e| e == "yaml")
            && name != "kustomization.yaml"
            && !base.contains(&format!("- {name}"))
        {
            dry_run("-f", &path)?;
        }
    }
    Ok(())
}

fn main() {
    let trials = vec![
        trial(
            "election_two_replicas_one_leads",
            election_two_replicas_one_leads,
        ),
        trial("election_sigkill_failover", election_sigkill_failover),
        trial("election_sigterm_release", election_sigterm_release),
        trial(
            "election_partition_steps_down",
            election_partition_steps_down,
        ),
        trial("controllers_flag", controllers_flag),
        trial(
            "controllers_flag_limits_watches",
            controllers_flag_limits_watches,
        ),
        trial(
            "health_metrics_and_no_election",
            health_metrics_and_no_election,
        ),
        trial("kwok_pod_lifecycle", kwok_pod_lifecycle),
        trial("kwok_node_and_pod_hooks", kwok_node_and_pod_hooks),
        trial(
            "webhook_rejects_then_allows_and_delays",
            webhook_rejects_then_allows_and_delays,
        ),
        trial("manifests_are_accepted", manifests_are_accepted),
    ];
    // kube-controller-manager keeps node lifecycle here; the replicas under test run the TEC.
    let opts = ClusterOptions {
        replace: Some(vec!["taint-eviction-controller"]),
        ..Default::default()
    };
    pilothouse_tests::harness::main("manager", opts, None, trials)
}
