//! End-to-end tests of the NodeMaintenance API and the operator's command (issue 16): the CRD
//! generated into `crds/` as a 1.37 API server takes it (its CEL cost check is the API server
//! accepting the CRD), M7 (the API server itself refuses invalid objects and stage transitions,
//! with the rules' messages; `Idle` touches nothing), the optional ValidatingAdmissionPolicy of
//! spec §4.7, and `pilothouse maintenance start|status|end` run as a person would, against one
//! Pilothouse running node-maintenance-controller as the `kube-system/pilothouse` ServiceAccount
//! with the shipped RBAC. Each trial owns its objects, so trials run side by side.

use anyhow::{Context, Result, bail, ensure};
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, Patch, PatchParams};
use kube::{Client, CustomResourceExt};
use pilothouse_tests::cluster::ClusterOptions;
use pilothouse_tests::harness::{SuitePilothouse, cluster, trial};
use pilothouse_tests::maintenance::{
    self as nm, CRD_FILE, CRD_NAME, Maintenances, NodeMaintenance, Shape, ShapeOptions, api,
    condition, cordon_state, has_finalizer, name_of, phase_of,
};
use pilothouse_tests::{k8s, unique, wait};
use serde_json::{Value, json};
use std::time::Duration;

const WAIT: Duration = Duration::from_secs(60);

/// The API server's refusal of a write: (HTTP code, message).
fn refusal<T: std::fmt::Debug>(r: Result<T>) -> Result<(u16, String)> {
    match r {
        Ok(v) => bail!("the API server accepted {v:?}"),
        Err(e) => match e.downcast_ref::<kube::Error>() {
            Some(kube::Error::Api(s)) => Ok((s.code, s.message.clone())),
            _ => Err(e.context("not an API refusal")),
        },
    }
}

/// Expects a 422 whose message contains `needle`.
fn invalid<T: std::fmt::Debug>(what: &str, r: Result<T>, needle: &str) -> Result<()> {
    let (code, message) = refusal(r).with_context(|| what.to_string())?;
    ensure!(
        code == 422 && message.contains(needle),
        "{what}: want 422 containing {needle:?}, got {code}: {message}"
    );
    Ok(())
}

async fn create(nms: &Maintenances, name: &str, spec: Value) -> Result<NodeMaintenance> {
    nms.create(name, spec).await
}

async fn patch(nms: &Maintenances, name: &str, spec: Value) -> Result<NodeMaintenance> {
    Ok(nms
        .api
        .patch(
            name,
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": spec})),
        )
        .await?)
}

/// The CRD as generated is what the API server serves: Established, and what kubectl reads
/// from the YAML file (through sigs.k8s.io/yaml) is exactly the types' CRD.
async fn crd_established_and_read_faithfully() -> Result<()> {
    let client = cluster().client().await?;
    let crd = Api::<CustomResourceDefinition>::all(client)
        .get(CRD_NAME)
        .await?;
    let conditions = crd
        .status
        .as_ref()
        .and_then(|s| s.conditions.clone())
        .unwrap_or_default();
    for t in ["Established", "NamesAccepted"] {
        ensure!(
            conditions
                .iter()
                .any(|c| c.type_ == t && c.status == "True"),
            "{t} not True: {conditions:?}"
        );
    }
    ensure!(
        !conditions
            .iter()
            .any(|c| c.type_ == "NonStructuralSchema" && c.status == "True"),
        "the schema is not structural: {conditions:?}"
    );
    let path = pilothouse_tests::repo_root().join(CRD_FILE);
    let read: Value = serde_json::from_str(&cluster().kubectl(&[
        "create",
        "--dry-run=client",
        "-o",
        "json",
        "-f",
        &path.to_string_lossy(),
    ])?)?;
    let want = serde_json::to_value(NodeMaintenance::crd())?;
    ensure!(
        numbers_as_f64(&read["spec"]) == numbers_as_f64(&want["spec"]),
        "kubectl reads {CRD_FILE} differently from NodeMaintenance::crd()"
    );
    // `kubectl get pnm` works through the short name.
    cluster().kubectl(&["get", "pnm"])?;
    Ok(())
}

/// JSON numbers as f64: kubectl prints `minimum: 0.0` as 0, serde_json tells 0 and 0.0 apart.
fn numbers_as_f64(v: &Value) -> Value {
    match v {
        Value::Number(n) => n.as_f64().map_or(Value::Null, |f| json!(f)),
        Value::Array(a) => Value::Array(a.iter().map(numbers_as_f64).collect()),
        Value::Object(o) => Value::Object(
            o.iter()
                .map(|(k, v)| (k.clone(), numbers_as_f64(v)))
                .collect(),
        ),
        other => other.clone(),
    }
}

/// M7: the API server refuses invalid objects and stage changes, with the rules' messages.
async fn m7_validation() -> Result<()> {
    let nms = Maintenances::new(cluster().client().await?);
    let n = unique("m7");
    let node = format!("{n}-node");
    let stage_msg = "stage may only advance: Idle -> Cordon -> Drain -> Complete";

    // Defaults: stage Drain, drain.force and deleteEmptyDirData true, Parallel, Wait.
    let d = create(&nms, &format!("{n}-defaults"), json!({"nodeName": node})).await?;
    ensure!(
        d.spec.stage == api::Stage::Drain,
        "stage {:?}",
        d.spec.stage
    );
    ensure!(
        d.spec.drain == api::DrainSpec::default(),
        "{:?}",
        d.spec.drain
    );
    let partial = create(
        &nms,
        &format!("{n}-partial"),
        json!({"nodeName": node, "drain": {"force": false}}),
    )
    .await?;
    ensure!(
        !partial.spec.drain.force
            && partial.spec.drain.delete_empty_dir_data
            && partial.spec.drain.timeout_policy == api::TimeoutPolicy::Wait,
        "{:?}",
        partial.spec.drain
    );

    // Drain -> Cordon, Complete -> Drain: refused; Drain -> Complete accepted.
    let drain = format!("{n}-drain");
    create(&nms, &drain, json!({"nodeName": node, "stage": "Drain"})).await?;
    invalid(
        "Drain -> Cordon",
        patch(&nms, &drain, json!({"stage": "Cordon"})).await,
        stage_msg,
    )?;
    invalid(
        "Drain -> Idle",
        patch(&nms, &drain, json!({"stage": "Idle"})).await,
        stage_msg,
    )?;
    patch(&nms, &drain, json!({"stage": "Complete"})).await?;
    invalid(
        "Complete -> Drain",
        patch(&nms, &drain, json!({"stage": "Drain"})).await,
        stage_msg,
    )?;

    // Idle -> Complete and Cordon -> Drain are accepted.
    let cordon = format!("{n}-cordon");
    create(&nms, &cordon, json!({"nodeName": node, "stage": "Cordon"})).await?;
    patch(&nms, &cordon, json!({"stage": "Drain"})).await?;

    // nodeName is immutable.
    invalid(
        "a changed nodeName",
        patch(&nms, &cordon, json!({"nodeName": format!("{node}-other")})).await,
        "nodeName is immutable",
    )?;

    // timeoutPolicy Delete needs timeoutSeconds, on create and on update.
    invalid(
        "Delete without timeoutSeconds",
        create(
            &nms,
            &format!("{n}-delete"),
            json!({"nodeName": node, "drain": {"timeoutPolicy": "Delete"}}),
        )
        .await,
        "timeoutPolicy Delete requires timeoutSeconds",
    )?;
    invalid(
        "an update to Delete without timeoutSeconds",
        patch(&nms, &cordon, json!({"drain": {"timeoutPolicy": "Delete"}})).await,
        "timeoutPolicy Delete requires timeoutSeconds",
    )?;
    patch(
        &nms,
        &cordon,
        json!({"drain": {"timeoutPolicy": "Delete", "timeoutSeconds": 30}}),
    )
    .await?;

    // podSelector: mutable while Idle, immutable once left (set, changed or removed).
    let sel = format!("{n}-selector");
    let msg = "drain.podSelector is immutable once the maintenance has left Idle";
    create(
        &nms,
        &sel,
        json!({"nodeName": node, "stage": "Idle", "drain": {"podSelector": {"matchLabels": {"a": "1"}}}}),
    )
    .await?;
    patch(
        &nms,
        &sel,
        json!({"drain": {"podSelector": {"matchLabels": {"a": "2"}}}}),
    )
    .await?;
    patch(&nms, &sel, json!({"stage": "Cordon"})).await?;
    invalid(
        "a podSelector change after Idle",
        patch(
            &nms,
            &sel,
            json!({"drain": {"podSelector": {"matchLabels": {"a": "3"}}}}),
        )
        .await,
        msg,
    )?;
    invalid(
        "a podSelector removal after Idle",
        patch(&nms, &sel, json!({"drain": {"podSelector": null}})).await,
        msg,
    )?;
    let unset = format!("{n}-unset");
    create(&nms, &unset, json!({"nodeName": node, "stage": "Cordon"})).await?;
    invalid(
        "a podSelector added after Idle",
        patch(
            &nms,
            &unset,
            json!({"drain": {"podSelector": {"matchLabels": {"a": "1"}}}}),
        )
        .await,
        msg,
    )?;

    // OpenAPI limits.
    for (what, spec, needle) in [
        (
            "an upper-case nodeName",
            json!({"nodeName": "W1"}),
            "spec.nodeName",
        ),
        (
            "an underscore in nodeName",
            json!({"nodeName": "w_1"}),
            "spec.nodeName",
        ),
        (
            "an empty nodeName",
            json!({"nodeName": ""}),
            "spec.nodeName",
        ),
        (
            "no nodeName",
            json!({"reason": "x"}),
            "spec.nodeName: Required value",
        ),
        (
            "a 254-character nodeName",
            json!({"nodeName": "a".repeat(254)}),
            "spec.nodeName",
        ),
        (
            "an unknown stage",
            json!({"nodeName": node, "stage": "Evict"}),
            "spec.stage",
        ),
        (
            "a 1025-character reason",
            json!({"nodeName": node, "reason": "r".repeat(1025)}),
            "spec.reason",
        ),
        (
            "a negative grace period",
            json!({"nodeName": node, "drain": {"gracePeriodSeconds": -1}}),
            "spec.drain.gracePeriodSeconds",
        ),
        (
            "a zero timeout",
            json!({"nodeName": node, "drain": {"timeoutSeconds": 0}}),
            "spec.drain.timeoutSeconds",
        ),
        (
            "a zero skip-wait timeout",
            json!({"nodeName": node, "drain": {"skipWaitForDeleteTimeoutSeconds": 0}}),
            "spec.drain.skipWaitForDeleteTimeoutSeconds",
        ),
        (
            "an unknown ordering",
            json!({"nodeName": node, "drain": {"ordering": "Random"}}),
            "spec.drain.ordering",
        ),
    ] {
        invalid(what, create(&nms, &unique("m7-bad"), spec).await, needle)?;
    }
    // The extremes that are valid: a 253-character dotted name, an int64 timeout.
    let long = format!("{}.{}", "a".repeat(126), "b".repeat(126));
    create(
        &nms,
        &format!("{n}-extremes"),
        json!({"nodeName": long, "reason": "r".repeat(1024),
               "drain": {"timeoutSeconds": i64::MAX, "gracePeriodSeconds": 0}}),
    )
    .await?;

    for name in [
        format!("{n}-defaults"),
        format!("{n}-partial"),
        drain,
        cordon,
        sel,
        unset,
        format!("{n}-extremes"),
    ] {
        nms.delete(&name).await?;
    }
    Ok(())
}

/// M7 with the controller: `Idle` touches nothing and adds no finalizer; `Idle -> Complete`
/// leaves `spec.unschedulable` alone (a node an admin cordoned stays cordoned, another stays
/// schedulable).
async fn m7_idle_touches_nothing() -> Result<()> {
    let s = Shape::new(
        cluster(),
        "m7-idle",
        ShapeOptions {
            workload: false,
            ..Default::default()
        },
    )
    .await?;
    let nms = Maintenances::new(s.client.clone());
    // w2 cordoned by an admin beforehand.
    s.node_api
        .patch(
            s.w(2),
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"unschedulable": true}})),
        )
        .await?;
    for (i, cordoned) in [(1, false), (2, true)] {
        let node = s.w(i).to_string();
        let name = format!("{node}-idle");
        let before = s.node(&node).await?;
        create(&nms, &name, json!({"nodeName": node, "stage": "Idle"})).await?;
        let idle = nms
            .wait(&name, "phase Idle", WAIT, |o| {
                (phase_of(o) == Some(api::Phase::Idle)).then(|| o.clone())
            })
            .await?;
        ensure!(!has_finalizer(&idle), "Idle added the finalizer");
        for t in [api::CONDITION_CORDONED, api::CONDITION_DRAINED] {
            let c = condition(&idle, t).with_context(|| format!("no {t} condition"))?;
            ensure!(
                c.status == "False" && c.reason == "NotRequested",
                "{t}: {c:?}"
            );
        }
        // kube-controller-manager and kwok keep writing the node (status, its own taints):
        // compare what a maintenance would write (spec.unschedulable, its taint, its annotation).
        let during = s.node(&node).await?;
        ensure!(
            cordon_state(&during) == cordon_state(&before),
            "Idle changed the node: {:?} -> {:?}",
            cordon_state(&before),
            cordon_state(&during)
        );
        patch(&nms, &name, json!({"stage": "Complete"})).await?;
        let done = nms
            .wait(&name, "phase Completed", WAIT, |o| {
                (phase_of(o) == Some(api::Phase::Completed)).then(|| o.clone())
            })
            .await?;
        ensure!(
            done.status.as_ref().is_some_and(|st| st
                .stage_statuses
                .iter()
                .all(|e| e.name != api::Stage::Cordon && e.name != api::Stage::Drain)),
            "skipped stages got entries: {:?}",
            done.status.as_ref().map(|s| &s.stage_statuses)
        );
        let after = s.node(&node).await?;
        let (unschedulable, tainted, annotation) = cordon_state(&after);
        ensure!(
            unschedulable == cordoned && !tainted && annotation.is_none(),
            "{node}: unschedulable {unschedulable} (was {cordoned}), taint {tainted}, annotation {annotation:?}"
        );
        nms.delete(&name).await?;
        nms.wait_gone(&name, WAIT).await?;
    }
    s.cleanup(cluster()).await
}

/// A kubeconfig for `ns/sa` (a TokenRequest token), as a user without cluster admin.
async fn client_as(ns: &str, sa: &str) -> Result<Client> {
    let token = cluster().kubectl(&["-n", ns, "create", "token", sa, "--duration=1h"])?;
    let api = cluster().apiserver_port()?;
    let ca = cluster().dir.join("pki/ca.crt");
    let text = format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: local\n  cluster:\n    server: https://127.0.0.1:{api}\n    certificate-authority: {}\nusers:\n- name: u\n  user:\n    token: {}\ncontexts:\n- name: local\n  context: {{cluster: local, user: u}}\ncurrent-context: local\n",
        ca.display(),
        token.trim()
    );
    let path = cluster().dir.join(format!("{}.kubeconfig", unique(sa)));
    std::fs::write(&path, text)?;
    pilothouse_tests::cluster::client_for(&path).await
}

/// Spec §4.7's optional ValidatingAdmissionPolicy (manifests/): a requester who may create
/// NodeMaintenances but not patch the node is refused, naming the node; allowed to patch that
/// node, the same create is accepted; a missing node is no admission error.
async fn admission_policy_requires_node_patch() -> Result<()> {
    let admin = cluster().client().await?;
    let ns = cluster().namespace("vap").await?;
    k8s::wait_service_account(&admin, &ns).await?;
    let node = unique("vap-node");
    k8s::create_kwok_node(&admin, &node, "zone-vap").await?;
    let sa = "requester";
    cluster().kubectl(&["-n", &ns, "create", "serviceaccount", sa])?;
    let role = unique("vap-requester");
    cluster().kubectl(&[
        "create",
        "clusterrole",
        &role,
        "--verb=create,get,delete",
        "--resource=nodemaintenances.pilothouse.dev",
    ])?;
    cluster().kubectl(&[
        "create",
        "clusterrolebinding",
        &role,
        &format!("--clusterrole={role}"),
        &format!("--serviceaccount={ns}:{sa}"),
    ])?;
    let policy =
        pilothouse_tests::repo_root().join("manifests/nodemaintenance-admission-policy.yaml");
    cluster().kubectl(&["apply", "-f", &policy.to_string_lossy()])?;
    let user = Maintenances::new(client_as(&ns, sa).await?);
    // The policy is enforced once the API server's policy informer has it: wait for the first
    // refusal (bounded), then every check below is a single request.
    let name = unique("vap");
    let (code, message) = wait::until(
        "the admission policy refusing a requester who may not patch the node",
        Duration::from_secs(30),
        Duration::from_millis(250),
        || async {
            match user.create(&name, json!({"nodeName": node})).await {
                Ok(_) => {
                    user.delete(&name).await?;
                    Ok(None)
                }
                Err(e) => Ok(Some(refusal::<()>(Err(e))?)),
            }
        },
    )
    .await?;
    ensure!(
        code == 403 && message.contains(&format!("requires permission to patch node {node}")),
        "{code}: {message}"
    );
    // Allowed to patch exactly that node: accepted.
    let patcher = unique("vap-patch-node");
    let missing = unique("vap-missing-node");
    cluster().kubectl(&[
        "create",
        "clusterrole",
        &patcher,
        "--verb=patch",
        "--resource=nodes",
        &format!("--resource-name={node}"),
        &format!("--resource-name={missing}"),
    ])?;
    cluster().kubectl(&[
        "create",
        "clusterrolebinding",
        &patcher,
        &format!("--clusterrole={patcher}"),
        &format!("--serviceaccount={ns}:{sa}"),
    ])?;
    // RBAC changes reach the authorizer through its informer too: bounded wait for acceptance.
    wait::until(
        "the create accepted once the requester may patch the node",
        Duration::from_secs(30),
        Duration::from_millis(250),
        || async { Ok(user.create(&name, json!({"nodeName": node})).await.ok()) },
    )
    .await?;
    // The check is by node name, not existence: a missing node the requester may patch is
    // accepted (the controller reports NodeNotFound), another one is refused.
    let for_missing = unique("vap-missing");
    user.create(&for_missing, json!({"nodeName": missing}))
        .await?;
    let other = unique("vap-other");
    let (code, message) = refusal(
        user.create(&other, json!({"nodeName": "no-such-node"}))
            .await,
    )?;
    ensure!(
        code == 403 && message.contains("patch node no-such-node"),
        "{code}: {message}"
    );
    user.delete(&name).await?;
    user.delete(&for_missing).await?;
    cluster().kubectl(&["delete", "-f", &policy.to_string_lossy()])?;
    for r in [&role, &patcher] {
        cluster().kubectl(&["delete", "clusterrole", r])?;
        cluster().kubectl(&["delete", "clusterrolebinding", r])?;
    }
    k8s::delete_node(&admin, &node).await?;
    cluster().delete_namespace(&ns).await
}

/// Runs `pilothouse --kubeconfig=<admin> maintenance <args>` (stdout not a terminal: plain
/// lines): (exit code, stdout, stderr). Output goes to files in the suite's log folder, so what
/// a process printed before it ran over `timeout` is still shown.
async fn cli(args: &[&str], timeout: Duration) -> Result<(i32, String, String)> {
    run_cli(args, timeout, false).await
}

/// [`cli`] on a pseudo-terminal (util-linux `script`), as a person at a terminal runs it.
async fn cli_tty(args: &[&str], timeout: Duration) -> Result<(i32, String, String)> {
    run_cli(args, timeout, true).await
}

async fn run_cli(args: &[&str], timeout: Duration, tty: bool) -> Result<(i32, String, String)> {
    let tag = unique("cli");
    let dir = pilothouse_tests::harness::log_dir();
    let (out, err) = (
        dir.join(format!("{tag}.out")),
        dir.join(format!("{tag}.err")),
    );
    let mut argv = vec![
        pilothouse_tests::pilothouse::binary()?
            .to_string_lossy()
            .into_owned(),
        format!("--kubeconfig={}", cluster().kubeconfig.display()),
        "maintenance".to_string(),
    ];
    argv.extend(args.iter().map(|a| a.to_string()));
    let mut cmd = if tty {
        // script -e: its exit code is the command's; -q: no banner.
        let quoted: Vec<String> = argv
            .iter()
            .map(|a| format!("'{}'", a.replace('\'', "'\\''")))
            .collect();
        let mut c = tokio::process::Command::new("script");
        c.args(["-qec", &quoted.join(" "), "/dev/null"])
            .env("TERM", "xterm-256color");
        c
    } else {
        let mut c = tokio::process::Command::new(&argv[0]);
        c.args(&argv[1..]);
        c
    };
    let mut child = cmd
        .stdin(std::process::Stdio::null())
        .stdout(std::fs::File::create(&out)?)
        .stderr(std::fs::File::create(&err)?)
        .kill_on_drop(true)
        .spawn()?;
    let read = |p: &std::path::Path| std::fs::read_to_string(p).unwrap_or_default();
    match tokio::time::timeout(timeout, child.wait()).await {
        Ok(status) => Ok((status?.code().unwrap_or(-1), read(&out), read(&err))),
        Err(_) => {
            let _ = child.kill().await;
            bail!(
                "pilothouse maintenance {} ran over {timeout:?}\nstdout:\n{}\nstderr:\n{}",
                args.join(" "),
                read(&out),
                read(&err)
            )
        }
    }
}

fn node_released(n: &Node) -> bool {
    let (unschedulable, tainted, annotation) = cordon_state(n);
    !unschedulable && !tainted && annotation.is_none()
}

/// `start --wait` on a node with evictable pods only: exits 0 after progress lines; `status`
/// shows it Drained; `kubectl wait --for=condition=Drained` returns; `end` releases the node.
async fn cli_start_wait_status_end() -> Result<()> {
    let s = Shape::new(cluster(), "cli-ok", ShapeOptions::default()).await?;
    let w1 = s.w(1).to_string();
    let web = name_of(
        &s.app_on("web", &w1)
            .await?
            .into_iter()
            .next()
            .context("no web on w1")?,
    );
    let t0 = tokio::time::Instant::now();
    let (code, out, err) = cli(
        &["start", &w1, "--reason", "kernel upgrade", "--wait"],
        Duration::from_secs(120),
    )
    .await?;
    println!(
        "MEASURE cli start --wait: {:.2}s to exit\n{out}",
        t0.elapsed().as_secs_f64()
    );
    ensure!(code == 0, "exit {code}\nstdout:\n{out}\nstderr:\n{err}");
    ensure!(
        out.contains(&format!("nodemaintenance/{w1} created")),
        "{out}"
    );
    ensure!(
        out.lines()
            .any(|l| l.starts_with(&format!("{w1}: ")) && l.contains("evicted")),
        "no progress line:\n{out}"
    );
    ensure!(
        out.contains(&format!("{w1} drained: 1 of 1 targeted pods evicted")),
        "{out}"
    );
    ensure!(
        s.pods
            .get_opt(&web)
            .await?
            .is_none_or(|p| p.metadata.deletion_timestamp.is_some()),
        "web on w1 not evicted"
    );
    // kubectl wait works on the condition's shape, through the short name.
    cluster().kubectl(&[
        "wait",
        "--for=condition=Drained",
        &format!("pnm/{w1}"),
        "--timeout=10s",
    ])?;
    let (code, out, err) = cli(&["status", &w1], Duration::from_secs(30)).await?;
    ensure!(code == 0, "status exit {code}: {err}");
    let row = out
        .lines()
        .nth(1)
        .with_context(|| format!("no row:\n{out}"))?;
    let cells: Vec<&str> = row.split_whitespace().collect();
    ensure!(
        cells.get(..8)
            == Some(
                &[
                    w1.as_str(),
                    w1.as_str(),
                    "Drain",
                    "Drained",
                    "1",
                    "1",
                    "0",
                    "0"
                ][..]
            ),
        "status row {row:?}\n{out}"
    );
    ensure!(out.contains("reason: kernel upgrade"), "{out}");
    // A second start with the same name is refused (no silent double maintenance).
    let (code, _, err) = cli(
        &["start", &w1, "--reason", "again"],
        Duration::from_secs(30),
    )
    .await?;
    ensure!(code == 1 && err.contains("already exists"), "{code}: {err}");

    let (code, out, err) = cli(&["end", &w1], Duration::from_secs(90)).await?;
    ensure!(code == 0, "end exit {code}\nstdout:\n{out}\nstderr:\n{err}");
    ensure!(
        out.contains(&format!("{w1} released: schedulable")),
        "{out}"
    );
    let node = s.node(&w1).await?;
    ensure!(node_released(&node), "{:?}", cordon_state(&node));
    let o = nm::Maintenances::new(s.client.clone()).get(&w1).await?;
    ensure!(
        phase_of(&o) == Some(api::Phase::Completed),
        "{:?}",
        phase_of(&o)
    );
    nm::Maintenances::new(s.client.clone()).delete(&w1).await?;
    s.cleanup(cluster()).await
}

/// `start --wait --timeout 5s` on a node whose only pod is behind a single-replica
/// `minAvailable: 1` PDB: exits non-zero naming the pod and the PDB; `end` releases the node.
async fn cli_deadlock_exits_non_zero() -> Result<()> {
    let s = Shape::new(
        cluster(),
        "cli-dl",
        ShapeOptions {
            workload: false,
            ..Default::default()
        },
    )
    .await?;
    let w1 = s.w(1).to_string();
    let mut spec = s.prefer(&w1);
    k8s::merge_json(&mut spec, &json!({"terminationGracePeriodSeconds": 1}));
    s.deployment("db", 1, spec).await?;
    s.pdb("db-pdb", json!({"minAvailable": 1}), "db").await?;
    let db = name_of(&s.wait_app_on("db", &w1).await?);
    let pdbs = s.pdbs();
    wait::until(
        "db-pdb observing its one healthy pod",
        WAIT,
        Duration::from_millis(100),
        || async {
            let st = pdbs.get("db-pdb").await?.status.unwrap_or_default();
            Ok((st.expected_pods == Some(1)
                && st.current_healthy == Some(1)
                && st.disruptions_allowed == Some(0))
            .then_some(()))
        },
    )
    .await?;
    let t0 = tokio::time::Instant::now();
    let nms = Maintenances::new(s.client.clone());
    let (code, out, err) = match cli(
        &["start", &w1, "--reason", "x", "--wait"],
        Duration::from_secs(60),
    )
    .await
    {
        Ok(r) => r,
        Err(e) => bail!(
            "{e:#}\nobject: {}",
            nm::describe(nms.get_opt(&w1).await?.as_ref())
        ),
    };
    println!(
        "MEASURE cli deadlock: exit {code} after {:.2}s\nstdout:\n{out}\nstderr:\n{err}",
        t0.elapsed().as_secs_f64()
    );
    // No deadline is set: only the deadlock (NM-17) can end the command, with its own code.
    ensure!(
        code == 3,
        "want exit 3 (deadlock), got {code}\nstdout:\n{out}\nstderr:\n{err}"
    );
    ensure!(
        t0.elapsed() < Duration::from_secs(20),
        "the deadlock took {:?} to end the command (NM-17: reported within 10 s)",
        t0.elapsed()
    );
    let blocked = format!("blocked: {}/{db} by PodDisruptionBudget db-pdb", s.ns);
    ensure!(out.contains(&blocked), "no {blocked:?} line:\n{out}");
    ensure!(
        err.contains(&db) && err.contains("db-pdb"),
        "the message names neither pod nor PDB: {err}"
    );
    ensure!(
        s.pods.get(&db).await?.metadata.deletion_timestamp.is_none(),
        "the PDB-protected pod was removed"
    );
    let (code, out, err) = cli(&["end", &w1], Duration::from_secs(90)).await?;
    ensure!(code == 0, "end exit {code}\nstdout:\n{out}\nstderr:\n{err}");
    let node = s.node(&w1).await?;
    ensure!(node_released(&node), "{:?}", cordon_state(&node));
    nms.delete(&w1).await?;
    s.cleanup(cluster()).await
}

/// On a terminal `start --wait` draws indicatif's bar (evicted/targeted) instead of plain lines.
async fn cli_progress_bar_on_a_terminal() -> Result<()> {
    let s = Shape::new(cluster(), "cli-tty", ShapeOptions::default()).await?;
    let w2 = s.w(2).to_string();
    let (code, out, err) = cli_tty(
        &["start", &w2, "--reason", "tty", "--wait"],
        Duration::from_secs(120),
    )
    .await?;
    ensure!(code == 0, "exit {code}\nstdout:\n{out:?}\nstderr:\n{err}");
    ensure!(
        out.contains("1/1 evicted") && out.contains('\u{1b}'),
        "no bar drawn with terminal control sequences: {out:?}"
    );
    ensure!(
        !out.lines().any(|l| l.starts_with(&format!("{w2}: "))),
        "plain progress lines on a terminal: {out:?}"
    );
    ensure!(
        out.contains(&format!("{w2} drained: 1 of 1 targeted pods evicted")),
        "{out:?}"
    );
    let (code, out, err) = cli(&["end", &w2], Duration::from_secs(90)).await?;
    ensure!(code == 0, "end exit {code}\nstdout:\n{out}\nstderr:\n{err}");
    Maintenances::new(s.client.clone()).delete(&w2).await?;
    s.cleanup(cluster()).await
}

/// Arguments are refused before anything is created.
async fn cli_refuses_bad_arguments() -> Result<()> {
    let nms = Maintenances::new(cluster().client().await?);
    let node = unique("cli-args");
    let (code, _, err) = cli(
        &[
            "start",
            &node,
            "--reason",
            "x",
            "--timeout-policy",
            "Delete",
        ],
        Duration::from_secs(30),
    )
    .await?;
    ensure!(
        code == 1 && err.contains("needs --timeout"),
        "{code}: {err}"
    );
    let (code, _, err) = cli(
        &["start", &node, "--reason", "x", "--timeout", "soon"],
        Duration::from_secs(30),
    )
    .await?;
    ensure!(
        code == 2 && err.contains("invalid duration"),
        "{code}: {err}"
    );
    ensure!(nms.get_opt(&node).await?.is_none(), "an object was created");
    let (code, _, err) = cli(&["end", &node], Duration::from_secs(30)).await?;
    ensure!(
        code == 1 && err.contains(&format!("no NodeMaintenance named {node}")),
        "{code}: {err}"
    );
    Ok(())
}

fn install_crd(c: &pilothouse_tests::Cluster) -> Result<()> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?
        .block_on(nm::install_crd(c))
}

fn main() {
    let trials = vec![
        trial(
            "crd_established_and_read_faithfully",
            crd_established_and_read_faithfully,
        ),
        trial("m7_validation", m7_validation),
        trial("m7_idle_touches_nothing", m7_idle_touches_nothing),
        trial(
            "admission_policy_requires_node_patch",
            admission_policy_requires_node_patch,
        ),
        trial("cli_start_wait_status_end", cli_start_wait_status_end),
        trial("cli_deadlock_exits_non_zero", cli_deadlock_exits_non_zero),
        trial("cli_refuses_bad_arguments", cli_refuses_bad_arguments),
        trial(
            "cli_progress_bar_on_a_terminal",
            cli_progress_bar_on_a_terminal,
        ),
    ];
    pilothouse_tests::harness::main_with_setup(
        "maintenance-api",
        // kube-controller-manager keeps everything but the taint-eviction controller (its
        // disruption controller computes PDB status); Pilothouse runs node-maintenance only.
        ClusterOptions {
            nodes: 0,
            replace: Some(vec!["taint-eviction-controller"]),
            ..Default::default()
        },
        install_crd,
        Some(SuitePilothouse {
            args: vec!["--controllers=node-maintenance-controller".to_string()],
            as_service_account: true,
        }),
        trials,
    )
}
