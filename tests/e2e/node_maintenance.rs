//! End-to-end tests of `node-maintenance-controller` (issue 16; spec §4, §6 M1..M14 but M7, which
//! `e2e_maintenance_api` holds), and the side-by-side runs against the pinned `kubectl drain`.
//!
//! One control plane for the suite (spec §6 harness): kube-controller-manager without its
//! node-lifecycle and taint-eviction controllers (its disruption, Deployment, ReplicaSet,
//! DaemonSet and garbage collector controllers are upstream's), and one Pilothouse running those
//! two and the node-maintenance controller at the accelerated node profile, as the
//! `kube-system/pilothouse` ServiceAccount with the shipped RBAC. Each trial owns a namespace and
//! kwok nodes of its own (the shape of `pilothouse_tests::maintenance`), so trials run side by
//! side and their real-clock waits overlap.

use anyhow::{Context, Result, bail, ensure};
use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::api::events::v1::Event;
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use pilothouse_tests::cluster::ClusterOptions;
use pilothouse_tests::harness::{SuitePilothouse, cluster, pilothouse, trial};
use pilothouse_tests::k8s::{self, merge_json};
use pilothouse_tests::maintenance::{
    self as nm, CLUSTER_EVENTS_NS, Maintenances, NodeMaintenance, PILOTHOUSE_USER, Shape,
    ShapeOptions, api, condition, cordon_state, name_of, phase_of, progress, target,
};
use pilothouse_tests::wait;
use serde_json::json;
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::time::Instant;

const KIND: &str = "NodeMaintenance";
const WAIT: Duration = Duration::from_secs(60);
const CONSENT_FORCE: &str = "Pods that declare no controller (use --force to override)";
const DEADLOCK: &str = "PodDisruptionBudgetDeadlock";

async fn setup(prefix: &str, opts: ShapeOptions) -> Result<(Shape, Maintenances)> {
    let s = Shape::new(cluster(), prefix, opts).await?;
    let nms = Maintenances::new(s.client.clone());
    Ok((s, nms))
}

/// Exactly one event, not repeated as a series.
fn once(ev: &[Event]) -> bool {
    ev.len() == 1 && ev[0].series.as_ref().is_none_or(|s| s.count <= 1)
}

fn notes(ev: &[Event]) -> Vec<String> {
    ev.iter().filter_map(|e| e.note.clone()).collect()
}

fn time(t: &Option<k8s_openapi::apimachinery::pkg::apis::meta::v1::Time>) -> Option<Timestamp> {
    t.as_ref().map(|t| t.0)
}

fn drain_status(nm: &NodeMaintenance) -> api::DrainStatus {
    nm.status
        .as_ref()
        .and_then(|s| s.drain.clone())
        .unwrap_or_default()
}

/// Seconds from `a` to `b` (negative if `b` is earlier).
fn between(a: Timestamp, b: Timestamp) -> f64 {
    a.duration_until(b).as_secs_f64()
}

async fn sleep_until(t: Timestamp) {
    tokio::time::sleep(k8s::until(t)).await;
}

/// The audit log is written in batches: a request is there a second or so after it was served.
async fn audit_settle() {
    tokio::time::sleep(Duration::from_secs(3)).await;
}

/// Deployment `db` (one replica, preferring w1) behind PDB `db-pdb` `minAvailable: 1`, observed
/// by the disruption controller; returns the pod on w1 (spec M2's setup).
async fn single_replica_db(s: &Shape, grace: i64) -> Result<Pod> {
    let mut spec = s.prefer(s.w(1));
    merge_json(&mut spec, &json!({"terminationGracePeriodSeconds": grace}));
    s.deployment("db", 1, spec).await?;
    s.pdb("db-pdb", json!({"minAvailable": 1}), "db").await?;
    let pod = s.wait_app_on("db", s.w(1)).await?;
    let pdbs = s.pdbs();
    wait::until(
        "db-pdb observing its one healthy pod",
        WAIT,
        Duration::from_millis(100),
        || async {
            let st = pdbs.get("db-pdb").await?.status.unwrap_or_default();
            Ok((st.expected_pods == Some(1)
                && st.current_healthy == Some(1)
                && st.desired_healthy == Some(1)
                && st.disruptions_allowed == Some(0))
            .then_some(()))
        },
    )
    .await?;
    Ok(pod)
}

/// Waits for `EvictionBlocked=True/PodDisruptionBudgetDeadlock` naming `ns/pod` and `db-pdb`.
async fn wait_deadlock(
    nms: &Maintenances,
    name: &str,
    ns: &str,
    pod: &str,
    within: Duration,
) -> Result<NodeMaintenance> {
    let who = format!("{ns}/{pod}");
    nms.wait(
        name,
        "EvictionBlocked=True/PodDisruptionBudgetDeadlock naming pod and db-pdb",
        within,
        |nm| {
            condition(nm, api::CONDITION_EVICTION_BLOCKED)
                .is_some_and(|c| {
                    c.status == "True"
                        && c.reason == DEADLOCK
                        && c.message.contains(&who)
                        && c.message.contains("db-pdb")
                })
                .then(|| nm.clone())
        },
    )
    .await
}

/// The `targetedPods` entry of a deadlocked pod, as M2 says.
fn check_deadlocked_entry(nm: &NodeMaintenance, ns: &str, pod: &str) -> Result<()> {
    let t = target(nm, ns, pod)
        .with_context(|| format!("no entry for {pod}: {}", nm::describe(Some(nm))))?;
    ensure!(
        t.state == api::TargetState::Blocked
            && t.pod_disruption_budget.as_deref() == Some("db-pdb")
            && t.blocked_reason.as_deref() == Some(DEADLOCK),
        "entry {t:?}"
    );
    Ok(())
}

/// The first version of each named pod seen with a deletionTimestamp (polled every 100 ms by a
/// task until `stop`).
fn record_terminating(
    pods: Api<Pod>,
    names: Vec<String>,
) -> (
    Arc<Mutex<BTreeMap<String, Pod>>>,
    tokio::task::JoinHandle<()>,
) {
    let seen: Arc<Mutex<BTreeMap<String, Pod>>> = Arc::default();
    let s2 = seen.clone();
    let task = tokio::spawn(async move {
        loop {
            for n in &names {
                if s2.lock().expect("seen").contains_key(n) {
                    continue;
                }
                if let Ok(Some(p)) = pods.get_opt(n).await
                    && p.metadata.deletion_timestamp.is_some()
                {
                    s2.lock().expect("seen").insert(n.clone(), p);
                }
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    });
    (seen, task)
}

/// M1: the happy path, and deletion restoring the node.
async fn m1_happy_path() -> Result<()> {
    let (s, nms) = setup(
        "m1",
        ShapeOptions {
            web_grace: 3,
            ..Default::default()
        },
    )
    .await?;
    let (w1, ns) = (s.w(1).to_string(), s.ns.clone());
    s.bare_pod(
        "scratch",
        &w1,
        json!({"terminationGracePeriodSeconds": 3, "volumes": [{"name": "scratch", "emptyDir": {}}],
               "containers": [{"name": "c", "image": "busybox", "volumeMounts": [{"name": "scratch", "mountPath": "/s"}]}]}),
    )
    .await?;
    s.wait_pod_ready("scratch").await?;
    let web1 = name_of(&s.wait_app_on("web", &w1).await?);
    let logship1 = s.wait_app_on("logship", &w1).await?;
    let node_uid = s.node(&w1).await?.metadata.uid.clone();
    let (seen, recorder) = record_terminating(s.pods.clone(), vec![web1.clone(), "scratch".into()]);

    let name = format!("{}-nm", s.name);
    nms.create(&name, json!({"nodeName": w1, "reason": "test"}))
        .await?;
    let done = nms
        .wait_condition(&name, api::CONDITION_DRAINED, "True", "DrainComplete", WAIT)
        .await?;
    recorder.abort();
    let mut problems = Vec::new();

    // The object: finalizer, ownerReference to the node, status.
    if !nm::has_finalizer(&done) {
        problems.push(format!("no finalizer: {:?}", done.metadata.finalizers));
    }
    let owners = done.metadata.owner_references.clone().unwrap_or_default();
    if !(owners.len() == 1
        && owners[0].kind == "Node"
        && owners[0].name == w1
        && Some(&owners[0].uid) == node_uid.as_ref()
        && owners[0].controller == Some(false)
        && owners[0].block_owner_deletion == Some(false))
    {
        problems.push(format!("ownerReferences {owners:?}"));
    }
    let p = progress(&done);
    if (p.targeted, p.evicted, p.pending, p.blocked, p.terminating) != (2, 2, 0, 0, 0)
        || p.skipped.daemon_set != 1
        || p.percent != 100
    {
        problems.push(format!("progress {p:?}"));
    }
    if phase_of(&done) != Some(api::Phase::Drained) {
        problems.push(format!("phase {:?}", phase_of(&done)));
    }
    match condition(&done, api::CONDITION_CORDONED) {
        Some(c) if c.status == "True" && c.reason == "Cordoned" => {}
        c => problems.push(format!("Cordoned {c:?}")),
    }
    // The node: cordoned, tainted, annotated, and the node-lifecycle controller's taint.
    let node = wait::until(
        "the NLC's unschedulable taint on w1",
        Duration::from_secs(10),
        Duration::from_millis(100),
        || async {
            let n = s.node(&w1).await?;
            Ok(k8s::has_taint(&n, "node.kubernetes.io/unschedulable", "NoSchedule").then_some(n))
        },
    )
    .await?;
    let cs = cordon_state(&node);
    if cs != (true, true, Some("false".into())) {
        problems.push(format!(
            "w1 (unschedulable, maintenance taint, annotation) = {cs:?}"
        ));
    }
    // The evicted pods: TargetedByNodeMaintenance, then the Eviction API's DisruptionTarget.
    let seen = seen.lock().expect("seen").clone();
    let message = format!("NodeMaintenance {name} on node {w1}: test");
    for pod in [&web1, &"scratch".to_string()] {
        let Some(p) = seen.get(pod) else {
            problems.push(format!("{pod} never seen terminating"));
            continue;
        };
        match k8s::condition(p, api::POD_CONDITION_TARGETED) {
            Some(c)
                if c.status == "True"
                    && c.reason.as_deref() == Some("NodeMaintenance")
                    && c.message.as_deref() == Some(message.as_str()) => {}
            c => problems.push(format!("{pod} {} = {c:?}", api::POD_CONDITION_TARGETED)),
        }
        match k8s::condition(p, "DisruptionTarget") {
            Some(c)
                if c.status == "True" && c.reason.as_deref() == Some("EvictionByEvictionAPI") => {}
            c => problems.push(format!("{pod} DisruptionTarget = {c:?}")),
        }
    }
    // web is replaced on w2/w3; logship is untouched.
    let replaced = wait::until(
        "web back to 3 ready replicas on w2 and w3",
        WAIT,
        Duration::from_millis(250),
        || async {
            let pods = s.pods.list(&Default::default()).await?.items;
            let web: Vec<&Pod> = pods
                .iter()
                .filter(|p| {
                    nm::label(p, "app") == Some("web")
                        && nm::is_ready(p)
                        && p.metadata.deletion_timestamp.is_none()
                })
                .collect();
            Ok((web.len() == 3).then(|| {
                web.iter()
                    .filter_map(|p| p.spec.as_ref()?.node_name.clone())
                    .collect::<Vec<_>>()
            }))
        },
    )
    .await?;
    if replaced.iter().any(|n| n == &w1) {
        problems.push(format!("web runs on w1 again: {replaced:?}"));
    }
    let logship_now = s.pods.get(&name_of(&logship1)).await?;
    if logship_now.metadata.uid != logship1.metadata.uid
        || logship_now.metadata.deletion_timestamp.is_some()
    {
        problems.push("logship on w1 was touched".into());
    }
    // Events on the object (and one Evicted on each pod).
    for (reason, n) in [
        ("BeginMaintenance", 1),
        ("Cordoned", 1),
        ("Evicted", 2),
        ("DrainComplete", 1),
    ] {
        let ev = nms
            .wait_events(CLUSTER_EVENTS_NS, KIND, &name, reason, n)
            .await?;
        if ev.len() != n {
            problems.push(format!(
                "{n} {reason} events wanted on the object, got {:?}",
                notes(&ev)
            ));
        }
    }
    for pod in [&web1, &"scratch".to_string()] {
        nms.wait_events(&ns, "Pod", pod, "Evicted", 1).await?;
    }
    // kubectl get pnm: the printer columns.
    let row = cluster().kubectl(&["get", "pnm", &name, "--no-headers"])?;
    let cols: Vec<&str> = row.split_whitespace().collect();
    if cols.get(1..8) != Some(&[w1.as_str(), "Drain", "Drained", "2", "2", "0", "0"][..]) {
        problems.push(format!("kubectl get pnm row {row:?}"));
    }
    // Order: the Targeted status patch precedes each eviction (the audit log).
    audit_settle().await;
    let log = cluster().audit_log();
    for pod in [&web1, &"scratch".to_string()] {
        let patches =
            nm::controller_requests(&log, &format!("/api/v1/namespaces/{ns}/pods/{pod}/status"))?;
        let first_patch = patches.iter().find(|(_, v)| v == "patch").map(|(t, _)| *t);
        let first_eviction = nm::eviction_requests(&log, &ns, pod)?
            .first()
            .map(|e| e.received);
        match (first_patch, first_eviction) {
            (Some(p), Some(e)) if p <= e => {}
            other => problems.push(format!(
                "{pod}: first status patch / first eviction = {other:?}"
            )),
        }
    }

    // Deletion: the node restored, UncordonNode, RemovedMaintenance, the object gone.
    nms.delete(&name).await?;
    nms.wait_gone(&name, WAIT).await?;
    let node = s.node(&w1).await?;
    let cs = cordon_state(&node);
    if cs != (false, false, None) {
        problems.push(format!("after deletion w1 = {cs:?}"));
    }
    nms.wait_events(CLUSTER_EVENTS_NS, "Node", &w1, "UncordonNode", 1)
        .await?;
    nms.wait_events(CLUSTER_EVENTS_NS, KIND, &name, "RemovedMaintenance", 1)
        .await?;
    ensure!(problems.is_empty(), "M1: {problems:#?}");
    s.cleanup(cluster()).await
}

/// M2: a single-replica PDB under the default `Wait` policy: deadlock named within 10 s, backoff,
/// the deadline reported, and the drain resuming once the owner scales.
async fn m2_single_replica_pdb_wait() -> Result<()> {
    let (s, nms) = setup("m2", ShapeOptions::default()).await?;
    let (w1, ns) = (s.w(1).to_string(), s.ns.clone());
    let db = name_of(&single_replica_db(&s, 1).await?);
    let name = format!("{}-nm", s.name);
    let t0 = Instant::now();
    nms.create(
        &name,
        json!({"nodeName": w1, "drain": {"timeoutSeconds": 30}}),
    )
    .await?;
    let nm1 = wait_deadlock(&nms, &name, &ns, &db, Duration::from_secs(10)).await?;
    println!(
        "MEASURE m2 deadlock reported {:.2}s after creation",
        t0.elapsed().as_secs_f64()
    );
    let mut problems = Vec::new();
    check_deadlocked_entry(&nm1, &ns, &db)?;
    if phase_of(&nm1) != Some(api::Phase::Draining) {
        problems.push(format!("phase {:?}", phase_of(&nm1)));
    }
    nms.wait_events(CLUSTER_EVENTS_NS, KIND, &name, "DrainDeadlocked", 1)
        .await?;
    nms.wait_events(&ns, "Pod", &db, "DrainDeadlocked", 1)
        .await?;

    // The deadline: startTime + 30 s; DeadlineExceeded within ±2 s of it.
    let d = drain_status(&nm1);
    let (start, deadline) = (
        time(&d.start_time).context("no drain.startTime")?,
        time(&d.deadline).context("no drain.deadline")?,
    );
    ensure!(
        between(start, deadline) == 30.0,
        "deadline {deadline} is not startTime {start} + 30s"
    );
    let before = deadline - SignedDuration::from_secs(2);
    let early = nms.get(&name).await?;
    sleep_until(before).await;
    let at_before = nms.get(&name).await?;
    if condition(&at_before, api::CONDITION_DEADLINE_EXCEEDED).is_some_and(|c| c.status == "True") {
        problems.push("DeadlineExceeded True more than 2 s before the deadline".into());
    }
    match condition(&early, api::CONDITION_DEADLINE_EXCEEDED) {
        Some(c) if c.status == "False" && c.reason == "WithinDeadline" => {}
        c => problems.push(format!("before the deadline DeadlineExceeded = {c:?}")),
    }
    let past = nms
        .wait_condition(
            &name,
            api::CONDITION_DEADLINE_EXCEEDED,
            "True",
            "WaitingPastDeadline",
            Duration::from_secs(6),
        )
        .await?;
    println!(
        "MEASURE m2 DeadlineExceeded {:.2}s after the deadline",
        between(deadline, Timestamp::now())
    );
    nms.wait_events(CLUSTER_EVENTS_NS, KIND, &name, "DrainDeadlineExceeded", 1)
        .await?;
    if phase_of(&past) != Some(api::Phase::Draining) {
        problems.push(format!("past the deadline phase {:?}", phase_of(&past)));
    }
    let pod = s.pods.get(&db).await?;
    if pod.metadata.deletion_timestamp.is_some()
        || pod.status.as_ref().and_then(|s| s.phase.as_deref()) != Some("Running")
    {
        problems.push("db deleted or not Running past the deadline under Wait".into());
    }
    if !cordon_state(&s.node(&w1).await?).0 {
        problems.push("w1 not cordoned past the deadline".into());
    }

    // At most 6 attempts in the 75 s after the first; retries go on past the deadline.
    let log = cluster().audit_log();
    audit_settle().await;
    let first = nm::eviction_requests(&log, &ns, &db)?
        .first()
        .map(|e| e.received)
        .context("no eviction request for db in the audit log")?;
    sleep_until(first + SignedDuration::from_secs(75)).await;
    audit_settle().await;
    let reqs: Vec<nm::EvictionRequest> = nm::eviction_requests(&log, &ns, &db)?
        .into_iter()
        .filter(|e| e.received <= first + SignedDuration::from_secs(75))
        .collect();
    let offsets: Vec<String> = reqs
        .iter()
        .map(|e| format!("{:.1}s:{}", between(first, e.received), e.code))
        .collect();
    println!(
        "MEASURE m2 eviction attempts in 75 s: {} ({offsets:?})",
        reqs.len()
    );
    if reqs.len() > 6
        || reqs
            .iter()
            .any(|e| e.user != PILOTHOUSE_USER || e.code != 429)
    {
        problems.push(format!("attempts in 75 s: {offsets:?}"));
    }
    if !reqs.iter().any(|e| e.received > deadline) {
        problems.push(format!("no attempt after the deadline: {offsets:?}"));
    }
    let now = nms.get(&name).await?;
    let attempts = target(&now, &ns, &db).map(|t| t.attempts).unwrap_or(0);
    if attempts < reqs.len() as i64 || attempts > 7 {
        problems.push(format!(
            "targetedPods attempts {attempts}, audit log {}",
            reqs.len()
        ));
    }
    for (ns_, kind, obj) in [(CLUSTER_EVENTS_NS, KIND, &name), (ns.as_str(), "Pod", &db)] {
        let ev = nms.events(ns_, kind, obj, "DrainDeadlocked").await?;
        if !once(&ev) {
            problems.push(format!(
                "DrainDeadlocked on {kind} {obj}: {:?}",
                ev.iter().map(|e| (&e.note, &e.series)).collect::<Vec<_>>()
            ));
        }
    }
    let ev = nms
        .events(CLUSTER_EVENTS_NS, KIND, &name, "DrainDeadlineExceeded")
        .await?;
    if !once(&ev) || ev[0].type_.as_deref() != Some("Warning") {
        problems.push(format!("DrainDeadlineExceeded {:?}", notes(&ev)));
    }

    // Scaling db to 2: once the PDB allows a disruption, the w1 pod goes within 5 s.
    s.scale("db", 2).await?;
    let allowed = s.wait_pdb_allows("db-pdb", 1).await?;
    let allowed_at = Instant::now();
    let other = s
        .pods
        .list(&Default::default())
        .await?
        .items
        .into_iter()
        .find(|p| nm::label(p, "app") == Some("db") && name_of(p) != db && nm::is_ready(p));
    let other_node = other.and_then(|p| p.spec?.node_name);
    if !matches!(other_node.as_deref(), Some(n) if n == s.w(2) || n == s.w(3)) {
        problems.push(format!("the new db replica runs on {other_node:?}"));
    }
    wait::until(
        "db on w1 evicted",
        Duration::from_secs(10),
        Duration::from_millis(100),
        || async { Ok(k8s::deleted(&s.pods, &db).await?.then_some(())) },
    )
    .await?;
    let took = allowed_at.elapsed();
    println!(
        "MEASURE m2 evicted {:.2}s after disruptionsAllowed=1 was observed (PDB rv {:?})",
        took.as_secs_f64(),
        allowed.metadata.resource_version
    );
    if took > Duration::from_secs(5) {
        problems.push(format!("evicted {took:?} after disruptionsAllowed=1"));
    }
    let drained = nms
        .wait_condition(&name, api::CONDITION_DRAINED, "True", "DrainComplete", WAIT)
        .await?;
    match condition(&drained, api::CONDITION_EVICTION_BLOCKED) {
        Some(c) if c.status == "False" && c.reason == "NotBlocked" => {}
        c => problems.push(format!("after the drain EvictionBlocked = {c:?}")),
    }
    ensure!(problems.is_empty(), "M2: {problems:#?}");
    nms.delete(&name).await?;
    nms.wait_gone(&name, WAIT).await?;
    s.cleanup(cluster()).await
}

/// M3: as M2 with `timeoutPolicy: Delete`: at the deadline the pod is marked and deleted,
/// bypassing the PDB, and the drain completes.
async fn m3_escalation_delete() -> Result<()> {
    let (s, nms) = setup("m3", ShapeOptions::default()).await?;
    let (w1, ns) = (s.w(1).to_string(), s.ns.clone());
    // A 5 s grace period keeps the deleted pod visible long enough to read its conditions.
    let db = name_of(&single_replica_db(&s, 5).await?);
    let (seen, recorder) = record_terminating(s.pods.clone(), vec![db.clone()]);
    let name = format!("{}-nm", s.name);
    nms.create(
        &name,
        json!({"nodeName": w1, "drain": {"timeoutSeconds": 30, "timeoutPolicy": "Delete"}}),
    )
    .await?;
    let nm1 = wait_deadlock(&nms, &name, &ns, &db, Duration::from_secs(10)).await?;
    let deadline = time(&drain_status(&nm1).deadline).context("no deadline")?;
    wait::until(
        "db deleted",
        Duration::from_secs(45),
        Duration::from_millis(100),
        || async { Ok(seen.lock().expect("seen").get(&db).cloned()) },
    )
    .await?;
    recorder.abort();
    let mut problems = Vec::new();
    let pod = seen
        .lock()
        .expect("seen")
        .get(&db)
        .cloned()
        .context("db seen")?;
    // deletionTimestamp = deletion + grace (5 s).
    let deleted_at =
        time(&pod.metadata.deletion_timestamp).context("dts")? - SignedDuration::from_secs(5);
    let off = between(deadline, deleted_at);
    println!("MEASURE m3 deleted {off:.2}s after the deadline");
    if !(-2.0..=2.0).contains(&off) {
        problems.push(format!("deleted {off:.2}s from the deadline"));
    }
    match k8s::condition(&pod, "DisruptionTarget") {
        Some(c)
            if c.status == "True" && c.reason.as_deref() == Some("DeletionByNodeMaintenance") => {}
        c => problems.push(format!("DisruptionTarget = {c:?}")),
    }
    // While the deleted pod terminates (5 s), the drain is past its deadline, escalating.
    let escalating = nms
        .wait(
            &name,
            "DeadlineExceeded=True/DeletingPastDeadline, or drained",
            Duration::from_secs(10),
            |nm| {
                let c = condition(nm, api::CONDITION_DEADLINE_EXCEEDED)?;
                let drained =
                    condition(nm, api::CONDITION_DRAINED).is_some_and(|d| d.status == "True");
                (c.status == "True" || drained).then(|| c.clone())
            },
        )
        .await?;
    if !(escalating.status == "True" && escalating.reason == "DeletingPastDeadline") {
        problems.push(format!(
            "past the deadline DeadlineExceeded = {escalating:?}"
        ));
    }
    let ev = nms
        .wait_events(CLUSTER_EVENTS_NS, KIND, &name, "DrainDeadlineExceeded", 1)
        .await?;
    if !once(&ev) {
        problems.push(format!("DrainDeadlineExceeded {:?}", notes(&ev)));
    }
    let drained = nms
        .wait_condition(&name, api::CONDITION_DRAINED, "True", "DrainComplete", WAIT)
        .await?;
    match target(&drained, &ns, &db) {
        Some(t)
            if t.method == Some(api::EvictionMethod::Delete)
                && t.state == api::TargetState::Gone => {}
        t => problems.push(format!("entry {t:?}")),
    }
    for (ns_, kind, obj) in [(CLUSTER_EVENTS_NS, KIND, &name), (ns.as_str(), "Pod", &db)] {
        let ev = nms
            .wait_events(ns_, kind, obj, "EvictedByDeletion", 1)
            .await?;
        if !ev.iter().all(|e| {
            e.note.as_deref().is_some_and(|n| n.contains("db-pdb"))
                && e.type_.as_deref() == Some("Warning")
        }) {
            problems.push(format!("EvictedByDeletion on {kind}: {:?}", notes(&ev)));
        }
    }
    // No eviction was accepted: every one was refused by the PDB; the pod was DELETEd.
    audit_settle().await;
    let log = cluster().audit_log();
    let ev = nm::eviction_requests(&log, &ns, &db)?;
    if ev.is_empty() || ev.iter().any(|e| e.code != 429) {
        problems.push(format!(
            "eviction codes {:?}",
            ev.iter().map(|e| e.code).collect::<Vec<_>>()
        ));
    }
    let deletes = nm::controller_requests(&log, &format!("/api/v1/namespaces/{ns}/pods/{db}"))?
        .into_iter()
        .filter(|(_, v)| v == "delete")
        .count();
    if deletes == 0 {
        problems.push("no DELETE of db by the node-maintenance controller".into());
    }
    let deletions = pilothouse()
        .metric("pilothouse_nodemaintenance_deletions_total")
        .await?
        .unwrap_or(0.0);
    if deletions < 1.0 {
        problems.push(format!(
            "pilothouse_nodemaintenance_deletions_total {deletions}"
        ));
    }
    ensure!(problems.is_empty(), "M3: {problems:#?}");
    nms.delete(&name).await?;
    nms.wait_gone(&name, WAIT).await?;
    s.cleanup(cluster()).await
}

/// M4: two PDBs select the pod: `MultiplePodDisruptionBudgets`, whatever the HTTP code; deleting
/// one unblocks.
async fn m4_multiple_pdbs() -> Result<()> {
    let (s, nms) = setup("m4", ShapeOptions::default()).await?;
    let (w1, ns) = (s.w(1).to_string(), s.ns.clone());
    let mut spec = s.prefer(&w1);
    merge_json(&mut spec, &json!({"terminationGracePeriodSeconds": 1}));
    s.deployment("db", 1, spec).await?;
    s.pdb("db-pdb", json!({"maxUnavailable": 1}), "db").await?;
    let db = name_of(&s.wait_app_on("db", &w1).await?);
    s.wait_pdb_allows("db-pdb", 1).await?;
    // The second budget only once the pod is healthy: kube-controller-manager's disruption
    // controller sends a pod's changes to one of the budgets that select it ("chose
    // arbitrarily"), so a second budget created earlier may never see the pod turn Ready.
    s.pdb("db-pdb-2", json!({"maxUnavailable": 1}), "db")
        .await?;
    s.wait_pdb_allows("db-pdb-2", 1).await?;
    let name = format!("{}-nm", s.name);
    nms.create(&name, json!({"nodeName": w1})).await?;
    let blocked = nms
        .wait(
            &name,
            "db blocked by MultiplePodDisruptionBudgets",
            Duration::from_secs(20),
            |nm| {
                let entry = target(nm, &ns, &db).is_some_and(|t| {
                    t.state == api::TargetState::Blocked
                        && t.blocked_reason.as_deref() == Some("MultiplePodDisruptionBudgets")
                });
                let cond = condition(nm, api::CONDITION_EVICTION_BLOCKED).is_some_and(|c| {
                    c.status == "True" && c.reason == "MultiplePodDisruptionBudgets"
                });
                (entry && cond).then(|| nm.clone())
            },
        )
        .await?;
    audit_settle().await;
    let codes: Vec<u16> = nm::eviction_requests(&cluster().audit_log(), &ns, &db)?
        .iter()
        .map(|e| e.code)
        .collect();
    println!("MEASURE m4 the API server answered the multiple-PDB evictions with {codes:?}");
    ensure!(
        progress(&blocked).blocked == 1,
        "progress {:?}",
        progress(&blocked)
    );
    let t = Instant::now();
    s.pdbs()
        .delete("db-pdb-2", &DeleteParams::default())
        .await?;
    let drained = nms
        .wait_condition(&name, api::CONDITION_DRAINED, "True", "DrainComplete", WAIT)
        .await?;
    println!(
        "MEASURE m4 drained {:.2}s after the second PDB was deleted",
        t.elapsed().as_secs_f64()
    );
    match condition(&drained, api::CONDITION_EVICTION_BLOCKED) {
        Some(c) if c.status == "False" && c.reason == "NotBlocked" => {}
        c => bail!("after the drain EvictionBlocked = {c:?}"),
    }
    nms.delete(&name).await?;
    nms.wait_gone(&name, WAIT).await?;
    s.cleanup(cluster()).await
}

/// M5: consent: a bare pod with `force: false` blocks the whole drain; `force: true` evicts both.
async fn m5_consent() -> Result<()> {
    let (s, nms) = setup("m5", ShapeOptions::default()).await?;
    let (w2, ns) = (s.w(2).to_string(), s.ns.clone());
    s.bare_pod("legacy", &w2, json!({})).await?;
    s.wait_pod_ready("legacy").await?;
    let web2 = name_of(&s.wait_app_on("web", &w2).await?);
    let name = format!("{}-nm", s.name);
    nms.create(&name, json!({"nodeName": w2, "drain": {"force": false}}))
        .await?;
    let refused = nms
        .wait_condition(
            &name,
            api::CONDITION_DRAINED,
            "False",
            "PodsRequireConsent",
            Duration::from_secs(20),
        )
        .await?;
    let msg = condition(&refused, api::CONDITION_DRAINED)
        .map(|c| c.message.clone())
        .unwrap_or_default();
    let who = format!("{ns}/legacy");
    ensure!(
        msg.contains(CONSENT_FORCE) && msg.contains(&who),
        "Drained message {msg:?}"
    );
    ensure!(
        !msg.contains(&web2),
        "web named as needing consent: {msg:?}"
    );
    nms.wait_events(CLUSTER_EVENTS_NS, KIND, &name, "PodsRequireConsent", 1)
        .await?;
    // Nothing is evicted, not even web, while consent is missing.
    tokio::time::sleep(Duration::from_secs(5)).await;
    audit_settle().await;
    let log = cluster().audit_log();
    for pod in ["legacy", web2.as_str()] {
        let ev = nm::eviction_requests(&log, &ns, pod)?;
        ensure!(
            ev.is_empty(),
            "{pod}: {} eviction request(s) without consent",
            ev.len()
        );
        ensure!(
            !k8s::deleted(&s.pods, pod).await?,
            "{pod} deleted without consent"
        );
    }
    let still = nms.get(&name).await?;
    ensure!(
        condition(&still, api::CONDITION_DRAINED).is_some_and(|c| c.reason == "PodsRequireConsent"),
        "{}",
        nm::describe(Some(&still))
    );
    nms.patch_spec(&name, json!({"drain": {"force": true}}))
        .await?;
    nms.wait_condition(&name, api::CONDITION_DRAINED, "True", "DrainComplete", WAIT)
        .await?;
    for pod in ["legacy", web2.as_str()] {
        ensure!(
            k8s::deleted(&s.pods, pod).await?,
            "{pod} still there after consent"
        );
    }
    nms.delete(&name).await?;
    nms.wait_gone(&name, WAIT).await?;
    s.cleanup(cluster()).await
}

/// M6: two objects on a node an admin had cordoned: the cordon is held by the other, and the
/// admin's `spec.unschedulable: true` is restored at the end.
async fn m6_overlap_pre_cordoned() -> Result<()> {
    let (s, nms) = setup("m6", ShapeOptions::default()).await?;
    let w3 = s.w(3).to_string();
    cluster().kubectl(&["cordon", &w3])?;
    let (a, b) = (format!("{}-a", s.name), format!("{}-b", s.name));
    nms.create(&a, json!({"nodeName": w3, "stage": "Cordon"}))
        .await?;
    nms.wait_phase(&a, api::Phase::Cordoned, Duration::from_secs(20))
        .await?;
    nms.create(&b, json!({"nodeName": w3})).await?;
    nms.wait_condition(&b, api::CONDITION_DRAINED, "True", "DrainComplete", WAIT)
        .await?;
    let cs = cordon_state(&s.node(&w3).await?);
    ensure!(
        cs == (true, true, Some("true".into())),
        "w3 during the overlap: {cs:?}"
    );
    nms.patch_spec(&b, json!({"stage": "Complete"})).await?;
    let held = nms
        .wait_phase(&b, api::Phase::Completed, Duration::from_secs(20))
        .await?;
    let c = condition(&held, api::CONDITION_CORDONED).cloned();
    ensure!(
        c.as_ref().is_some_and(|c| c.status == "False"
            && c.reason == "HeldByOtherMaintenance"
            && c.message.contains(&a)),
        "b Cordoned = {c:?}"
    );
    let cs = cordon_state(&s.node(&w3).await?);
    ensure!(
        cs == (true, true, Some("true".into())),
        "w3 after b completed: {cs:?}"
    );
    nms.delete(&a).await?;
    nms.wait_gone(&a, WAIT).await?;
    let cs = cordon_state(&s.node(&w3).await?);
    ensure!(
        cs == (true, false, None),
        "w3 after a was deleted: {cs:?} (want the admin's cordon, no taint, no annotation)"
    );
    nms.delete(&b).await?;
    nms.wait_gone(&b, WAIT).await?;
    let cs = cordon_state(&s.node(&w3).await?);
    ensure!(cs == (true, false, None), "w3 after b was deleted: {cs:?}");
    s.cleanup(cluster()).await
}

/// M8: a maintenance of a node that does not exist yet waits without a finalizer, and starts
/// when the node appears.
async fn m8_missing_node() -> Result<()> {
    let client = cluster().client().await?;
    let nms = Maintenances::new(client.clone());
    let w9 = pilothouse_tests::unique("m8-w9");
    let name = format!("{w9}-nm");
    nms.create(&name, json!({"nodeName": w9})).await?;
    let pending = nms
        .wait_phase(&name, api::Phase::Pending, Duration::from_secs(20))
        .await?;
    for t in [api::CONDITION_CORDONED, api::CONDITION_DRAINED] {
        let c = condition(&pending, t);
        ensure!(
            c.is_some_and(|c| c.status == "False" && c.reason == "NodeNotFound"),
            "{t} = {c:?}"
        );
    }
    ensure!(
        !nm::has_finalizer(&pending),
        "finalizer on a maintenance of a missing node"
    );
    let ev = nms
        .wait_events(CLUSTER_EVENTS_NS, KIND, &name, "NodeNotFound", 1)
        .await?;
    ensure!(ev[0].type_.as_deref() == Some("Warning"), "{ev:?}");
    tokio::time::sleep(Duration::from_secs(3)).await;
    let ev = nms
        .events(CLUSTER_EVENTS_NS, KIND, &name, "NodeNotFound")
        .await?;
    ensure!(
        once(&ev),
        "NodeNotFound more than once per generation: {:?}",
        notes(&ev)
    );
    // The node appears (a kwok node; the maintenance may cordon it at once).
    let nodes: Api<Node> = Api::all(client.clone());
    let node: Node = serde_json::from_value(json!({
        "metadata": {"name": w9, "labels": {"kubernetes.io/hostname": w9, "pilothouse.test/kwok": "shared", "type": "kwok"},
                     "annotations": {"kwok.x-k8s.io/node": "fake"}},
        "spec": {"taints": [{"key": "kwok.x-k8s.io/node", "value": "fake", "effect": "NoSchedule"}]}
    }))?;
    nodes.create(&PostParams::default(), &node).await?;
    let started = nms
        .wait_condition(&name, api::CONDITION_DRAINED, "True", "DrainComplete", WAIT)
        .await?;
    ensure!(
        nm::has_finalizer(&started),
        "no finalizer once the node exists"
    );
    ensure!(
        condition(&started, api::CONDITION_CORDONED).is_some_and(|c| c.status == "True"),
        "{}",
        nm::describe(Some(&started))
    );
    let cs = cordon_state(&nodes.get(&w9).await?);
    ensure!(cs == (true, true, Some("false".into())), "w9 {cs:?}");
    nms.delete(&name).await?;
    nms.wait_gone(&name, WAIT).await?;
    k8s::delete_node(&client, &w9).await
}

/// M9: deleting the node mid-drain: the object is garbage-collected and its finalizer released
/// without node writes.
async fn m9_node_deleted_mid_drain() -> Result<()> {
    let (s, nms) = setup("m9", ShapeOptions::default()).await?;
    let (w1, ns) = (s.w(1).to_string(), s.ns.clone());
    let db = name_of(&single_replica_db(&s, 1).await?);
    let name = format!("{}-nm", s.name);
    nms.create(&name, json!({"nodeName": w1})).await?;
    wait_deadlock(&nms, &name, &ns, &db, Duration::from_secs(10)).await?;
    let deleted_at = Timestamp::now();
    s.node_api.delete(&w1, &DeleteParams::default()).await?;
    nms.wait_gone(&name, WAIT).await?;
    audit_settle().await;
    let writes: Vec<(Timestamp, String)> =
        nm::controller_requests(&cluster().audit_log(), &format!("/api/v1/nodes/{w1}"))?
            .into_iter()
            .filter(|(t, v)| *t >= deleted_at && !matches!(v.as_str(), "get" | "list" | "watch"))
            .collect();
    ensure!(
        writes.is_empty(),
        "node writes after the node was deleted: {writes:?}"
    );
    s.cleanup(cluster()).await
}

/// M10: an out-of-band `kubectl uncordon` is reverted within one reconcile and reported.
async fn m10_out_of_band_uncordon() -> Result<()> {
    let (s, nms) = setup("m10", ShapeOptions::default()).await?;
    let (w1, ns) = (s.w(1).to_string(), s.ns.clone());
    let db = name_of(&single_replica_db(&s, 1).await?);
    let name = format!("{}-nm", s.name);
    nms.create(&name, json!({"nodeName": w1})).await?;
    wait_deadlock(&nms, &name, &ns, &db, Duration::from_secs(10)).await?;
    let t = Instant::now();
    cluster().kubectl(&["uncordon", &w1])?;
    let recordoned = wait::until(
        "w1 cordoned again",
        Duration::from_secs(5),
        Duration::from_millis(100),
        || async {
            let n = s.node(&w1).await?;
            Ok((cordon_state(&n).0 && cordon_state(&n).1).then_some(n))
        },
    )
    .await?;
    println!(
        "MEASURE m10 re-cordoned within {:.2}s of the uncordon",
        t.elapsed().as_secs_f64()
    );
    ensure!(
        t.elapsed() <= Duration::from_secs(3),
        "re-cordoned after {:?}",
        t.elapsed()
    );
    ensure!(
        cordon_state(&recordoned).2.as_deref() == Some("false"),
        "annotation {:?}",
        cordon_state(&recordoned).2
    );
    for (kind, obj) in [(KIND, &name), ("Node", &w1)] {
        let ev = nms
            .wait_events(CLUSTER_EVENTS_NS, kind, obj, "CordonReverted", 1)
            .await?;
        ensure!(
            ev.iter().all(|e| e.type_.as_deref() == Some("Warning")),
            "{kind}: {ev:?}"
        );
    }
    nms.delete(&name).await?;
    nms.wait_gone(&name, WAIT).await?;
    s.cleanup(cluster()).await
}

/// M11: stage Complete during a blocked drain cancels it: no further attempts, Cancelled, the
/// pod condition ended, the node released.
async fn m11_cancellation() -> Result<()> {
    let (s, nms) = setup("m11", ShapeOptions::default()).await?;
    let (w1, ns) = (s.w(1).to_string(), s.ns.clone());
    let db = name_of(&single_replica_db(&s, 1).await?);
    let name = format!("{}-nm", s.name);
    nms.create(&name, json!({"nodeName": w1})).await?;
    let blocked = wait_deadlock(&nms, &name, &ns, &db, Duration::from_secs(10)).await?;
    let first = target(&blocked, &ns, &db)
        .and_then(|t| time(&t.first_attempt_time))
        .context("no firstAttemptTime")?;
    // Between the second attempt (5 s) and the third (15 s).
    sleep_until(first + SignedDuration::from_secs(7)).await;
    let cancelled_at = Timestamp::now();
    nms.patch_spec(&name, json!({"stage": "Complete"})).await?;
    let done = nms
        .wait_phase(&name, api::Phase::Completed, Duration::from_secs(20))
        .await?;
    let c = condition(&done, api::CONDITION_DRAINED);
    ensure!(
        c.is_some_and(|c| c.status == "False" && c.reason == "Cancelled"),
        "Drained = {c:?}"
    );
    let pod = wait::until(
        "db's TargetedByNodeMaintenance ended",
        Duration::from_secs(10),
        Duration::from_millis(100),
        || async {
            let p = s.pods.get(&db).await?;
            Ok(k8s::condition(&p, api::POD_CONDITION_TARGETED)
                .is_some_and(|c| {
                    c.status == "False" && c.reason.as_deref() == Some("MaintenanceEnded")
                })
                .then_some(p))
        },
    )
    .await?;
    ensure!(pod.metadata.deletion_timestamp.is_none(), "db deleted");
    let cs = cordon_state(&s.node(&w1).await?);
    ensure!(cs == (false, false, None), "w1 after cancellation {cs:?}");
    // Past the time of the third and fourth attempts: none was made.
    sleep_until(first + SignedDuration::from_secs(40)).await;
    audit_settle().await;
    let after: Vec<Timestamp> = nm::eviction_requests(&cluster().audit_log(), &ns, &db)?
        .into_iter()
        .map(|e| e.received)
        .filter(|t| *t > cancelled_at)
        .collect();
    ensure!(
        after.is_empty(),
        "eviction attempts after the stage became Complete: {after:?}"
    );
    nms.delete(&name).await?;
    nms.wait_gone(&name, WAIT).await?;
    s.cleanup(cluster()).await
}

/// M12: deleting the object mid-eviction never leaves the cordon behind nor re-creates it.
/// 20 runs, 5 on each of four nodes at once, deleted at staggered moments after the first
/// eviction was accepted.
async fn m12_delete_during_drain() -> Result<()> {
    let (s, nms) = setup(
        "m12",
        ShapeOptions {
            workload: false,
            ..Default::default()
        },
    )
    .await?;
    let w4 = format!("{}-w4", s.name);
    s.add_node(&w4).await?;
    let lanes: Vec<String> = s.nodes.iter().cloned().chain([w4.clone()]).collect();
    let runs = futures::future::try_join_all(lanes.iter().enumerate().map(|(lane, node)| {
        let (s, nms) = (&s, &nms);
        async move {
            let mut out = Vec::new();
            for run in 0..5 {
                out.push(
                    m12_run(s, nms, node, lane * 5 + run)
                        .await
                        .with_context(|| format!("run {} on {node}", lane * 5 + run))?,
                );
            }
            anyhow::Ok(out)
        }
    }))
    .await?;
    let runs: Vec<(String, Timestamp, Timestamp)> = runs.into_iter().flatten().collect();
    ensure!(runs.len() == 20, "{} runs", runs.len());
    // No node write by Pilothouse between a run's object being gone and the next run's object
    // on that node being created (which writes legitimately).
    audit_settle().await;
    let log = cluster().audit_log();
    let mut late = Vec::new();
    for (node, _, gone) in &runs {
        let next = runs
            .iter()
            .filter(|(n, created, _)| n == node && created > gone)
            .map(|(_, created, _)| *created)
            .min();
        for (t, verb) in nm::controller_requests(&log, &format!("/api/v1/nodes/{node}"))? {
            let write = !matches!(verb.as_str(), "get" | "list" | "watch");
            if write && t > *gone && next.is_none_or(|n| t < n) {
                late.push(format!(
                    "{node}: {verb} at {t} after the object was gone at {gone}"
                ));
            }
        }
    }
    ensure!(late.is_empty(), "M12: {late:#?}");
    s.cleanup(cluster()).await
}

/// One M12 run on `node`; returns (node, when its object was created, when it was seen gone).
async fn m12_run(
    s: &Shape,
    nms: &Maintenances,
    node: &str,
    run: usize,
) -> Result<(String, Timestamp, Timestamp)> {
    let pods: Vec<String> = (0..3).map(|i| format!("r{run}-p{i}")).collect();
    for p in &pods {
        s.bare_pod(p, node, json!({"terminationGracePeriodSeconds": 3}))
            .await?;
    }
    for p in &pods {
        s.wait_pod_ready(p).await?;
    }
    let name = format!("{}-r{run}", s.name);
    let created = Timestamp::now();
    nms.create(&name, json!({"nodeName": node})).await?;
    // Mid-eviction: the first target accepted for eviction, then a staggered pause.
    wait::until(
        "a target evicted",
        Duration::from_secs(20),
        Duration::from_millis(50),
        || async {
            for p in &pods {
                if k8s::deleted(&s.pods, p).await? {
                    return Ok(Some(()));
                }
            }
            Ok(None)
        },
    )
    .await?;
    tokio::time::sleep(Duration::from_millis(300 * (run % 5) as u64)).await;
    nms.delete(&name).await?;
    nms.wait_gone(&name, Duration::from_secs(30)).await?;
    let gone = Timestamp::now();
    let mut problems = Vec::new();
    let cs = cordon_state(&s.node(node).await?);
    if cs != (false, false, None) {
        problems.push(format!(
            "run {run}: node right after the object was gone: {cs:?}"
        ));
    }
    // Still released 3 s later (polled every 100 ms).
    let until = Instant::now() + Duration::from_secs(3);
    while Instant::now() < until {
        let cs = cordon_state(&s.node(node).await?);
        if cs != (false, false, None) {
            problems.push(format!("run {run}: node cordoned again: {cs:?}"));
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    ensure!(problems.is_empty(), "{problems:?}");
    // The pods left: removed before the next run.
    for p in &pods {
        let _ = s
            .pods
            .delete(
                p,
                &DeleteParams {
                    grace_period_seconds: Some(0),
                    ..Default::default()
                },
            )
            .await;
    }
    for p in &pods {
        wait::until(
            &format!("{p} gone"),
            Duration::from_secs(30),
            Duration::from_millis(100),
            || async { Ok(s.pods.get_opt(p).await?.is_none().then_some(())) },
        )
        .await?;
    }
    Ok((node.to_string(), created, gone))
}

/// M13: PriorityWaves: the 2000000000 pod is not evicted before the lower waves are gone.
async fn m13_priority_waves() -> Result<()> {
    let (s, nms) = setup(
        "m13",
        ShapeOptions {
            workload: false,
            ..Default::default()
        },
    )
    .await?;
    let w1 = s.w(1).to_string();
    let class = format!("{}-billion", s.name);
    let classes: Api<k8s_openapi::api::scheduling::v1::PriorityClass> = Api::all(s.client.clone());
    classes
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": class}, "value": 1000000000}))?,
        )
        .await?;
    s.bare_pod("p0", &w1, json!({"terminationGracePeriodSeconds": 5}))
        .await?;
    s.bare_pod(
        "p1e9",
        &w1,
        json!({"terminationGracePeriodSeconds": 5, "priorityClassName": class}),
    )
    .await?;
    s.bare_pod(
        "p2e9",
        &w1,
        json!({"terminationGracePeriodSeconds": 20, "priorityClassName": "system-cluster-critical",
               "containers": [{"name": "c", "image": "busybox",
                               "lifecycle": {"preStop": {"exec": {"command": ["sleep", "20"]}}}}]}),
    )
    .await?;
    for p in ["p0", "p1e9", "p2e9"] {
        let pod = s.wait_pod_ready(p).await?;
        println!("{p}: priority {:?}", pod.spec.and_then(|s| s.priority));
    }
    let name = format!("{}-nm", s.name);
    nms.create(
        &name,
        json!({"nodeName": w1, "drain": {"ordering": "PriorityWaves"}}),
    )
    .await?;
    // Polled: once p2e9 is seen deleted, the other two must already be gone.
    let t = Instant::now();
    let mut lows_gone_at = None;
    loop {
        let high = s.pods.get_opt("p2e9").await?;
        let high_deleted = high
            .as_ref()
            .is_none_or(|p| p.metadata.deletion_timestamp.is_some());
        let lows_gone =
            s.pods.get_opt("p0").await?.is_none() && s.pods.get_opt("p1e9").await?.is_none();
        if lows_gone && lows_gone_at.is_none() {
            lows_gone_at = Some(t.elapsed());
        }
        if high_deleted {
            ensure!(lows_gone, "p2e9 evicted while a lower wave was still there");
            break;
        }
        ensure!(t.elapsed() < Duration::from_secs(60), "p2e9 never evicted");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    println!(
        "MEASURE m13 lower waves gone at {lows_gone_at:?}, p2e9 evicted at {:?}",
        t.elapsed()
    );
    nms.wait_condition(&name, api::CONDITION_DRAINED, "True", "DrainComplete", WAIT)
        .await?;
    nms.delete(&name).await?;
    nms.wait_gone(&name, WAIT).await?;
    classes.delete(&class, &DeleteParams::default()).await?;
    s.cleanup(cluster()).await
}

/// M14: the node fails after web was evicted: web stays Terminating and the drain waits, until
/// `skipWaitForDeleteTimeoutSeconds: 30` counts it gone 30 s after its deletionTimestamp.
async fn m14_node_fails_mid_drain() -> Result<()> {
    // kwok keeps an evicted pod for its grace period: 10 s to stop the node before it goes.
    let (s, nms) = setup(
        "m14",
        ShapeOptions {
            web_grace: 10,
            ..Default::default()
        },
    )
    .await?;
    let (w1, ns) = (s.w(1).to_string(), s.ns.clone());
    let web1 = name_of(&s.wait_app_on("web", &w1).await?);
    let name = format!("{}-nm", s.name);
    nms.create(&name, json!({"nodeName": w1})).await?;
    let evicted = wait::until(
        "web on w1 evicted",
        Duration::from_secs(20),
        Duration::from_millis(50),
        || async {
            Ok(s.pods
                .get_opt(&web1)
                .await?
                .filter(|p| p.metadata.deletion_timestamp.is_some()))
        },
    )
    .await?;
    // The node stops: kwok no longer manages it (no heartbeats, no pod termination).
    s.node_api
        .patch(
            &w1,
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"labels": {"pilothouse.test/kwok": null}}})),
        )
        .await?;
    let dts = time(&evicted.metadata.deletion_timestamp).context("dts")?;
    // Past the grace period: web still there, Terminating, and the drain not done.
    sleep_until(dts + SignedDuration::from_secs(8)).await;
    ensure!(
        s.pods.get_opt(&web1).await?.is_some(),
        "web on w1 went although its node stopped"
    );
    let waiting = nms.get(&name).await?;
    let c = condition(&waiting, api::CONDITION_DRAINED);
    ensure!(c.is_some_and(|c| c.status == "False"), "Drained = {c:?}");
    let entry = target(&waiting, &ns, &web1).map(|t| t.state);
    ensure!(
        entry == Some(api::TargetState::Terminating),
        "web entry {entry:?}"
    );
    ensure!(
        progress(&waiting).terminating == 1,
        "progress {:?}",
        progress(&waiting)
    );
    nms.patch_spec(
        &name,
        json!({"drain": {"skipWaitForDeleteTimeoutSeconds": 30}}),
    )
    .await?;
    let drained = nms
        .wait_condition(
            &name,
            api::CONDITION_DRAINED,
            "True",
            "DrainComplete",
            Duration::from_secs(60),
        )
        .await?;
    let at = Timestamp::now();
    let off = between(dts + SignedDuration::from_secs(30), at);
    println!("MEASURE m14 drained {off:.2}s after deletionTimestamp + 30 s");
    ensure!(
        (-2.0..=2.0).contains(&off),
        "drained {off:.2}s from deletionTimestamp + 30 s"
    );
    ensure!(
        s.pods.get_opt(&web1).await?.is_some(),
        "web really went: the skip was not exercised"
    );
    let t = target(&drained, &ns, &web1).map(|t| t.state);
    ensure!(t == Some(api::TargetState::Gone), "web entry {t:?}");
    nms.delete(&name).await?;
    nms.wait_gone(&name, WAIT).await?;
    s.cleanup(cluster()).await
}

// --- side by side with the pinned `kubectl drain` --------------------------------------------

/// `kubectl drain` run as a child process against the suite's plane (as admin).
struct KubectlDrain {
    child: tokio::process::Child,
    out: std::path::PathBuf,
}

impl KubectlDrain {
    fn start(node: &str, extra: &[&str]) -> Result<KubectlDrain> {
        let out = cluster()
            .dir
            .join(format!("{}.log", pilothouse_tests::unique("kubectl-drain")));
        let file = std::fs::File::create(&out)?;
        let child = tokio::process::Command::new(cluster().bin_dir()?.join("kubectl"))
            .arg(format!("--kubeconfig={}", cluster().kubeconfig.display()))
            .args([
                "drain",
                node,
                "--ignore-daemonsets",
                "--delete-emptydir-data",
                "--force",
            ])
            .args(extra)
            .stdout(file.try_clone()?)
            .stderr(file)
            .kill_on_drop(true)
            .spawn()
            .context("spawning kubectl drain")?;
        Ok(KubectlDrain { child, out })
    }

    fn output(&self) -> String {
        std::fs::read_to_string(&self.out).unwrap_or_default()
    }
}

/// The roles (app label, else name) of the pods on `node`.
async fn roles_on(s: &Shape, node: &str) -> Result<BTreeMap<String, String>> {
    Ok(s.pods_on(node)
        .await?
        .iter()
        .filter(|p| p.metadata.deletion_timestamp.is_none())
        .map(|p| {
            (
                name_of(p),
                nm::label(p, "app")
                    .map(str::to_string)
                    .unwrap_or_else(|| name_of(p)),
            )
        })
        .collect())
}

/// The same node shape and pods drained by a NodeMaintenance and by `kubectl drain --force
/// --ignore-daemonsets --delete-emptydir-data`: the same pods are evicted (web, a bare pod with
/// emptyDir, a finished bare pod), the same are left (the DaemonSet's).
async fn kubectl_same_pods_evicted() -> Result<()> {
    let ((a, nms), (b, _)) = futures::try_join!(
        setup("kd-nm", ShapeOptions::default()),
        setup("kd-kc", ShapeOptions::default())
    )?;
    for s in [&a, &b] {
        let w1 = s.w(1);
        s.bare_pod(
            "scratch",
            w1,
            json!({"volumes": [{"name": "scratch", "emptyDir": {}}]}),
        )
        .await?;
        s.bare_pod_with(
            "done",
            w1,
            json!({"annotations": {"pilothouse.test/exit-code": "0"}}),
            json!({"restartPolicy": "Never"}),
        )
        .await?;
        s.wait_pod_ready("scratch").await?;
        wait::until(
            "done Succeeded",
            WAIT,
            Duration::from_millis(200),
            || async {
                let p = s.pods.get("done").await?;
                Ok((p.status.and_then(|s| s.phase).as_deref() == Some("Succeeded")).then_some(()))
            },
        )
        .await?;
    }
    let (before_a, before_b) = (roles_on(&a, a.w(1)).await?, roles_on(&b, b.w(1)).await?);
    let name = format!("{}-nm", a.name);
    nms.create(&name, json!({"nodeName": a.w(1)})).await?;
    let mut kubectl = KubectlDrain::start(b.w(1), &["--timeout=120s"])?;
    nms.wait_condition(
        &name,
        api::CONDITION_DRAINED,
        "True",
        "DrainComplete",
        Duration::from_secs(120),
    )
    .await?;
    let status = tokio::time::timeout(Duration::from_secs(120), kubectl.child.wait()).await??;
    ensure!(
        status.success(),
        "kubectl drain failed: {}",
        kubectl.output()
    );
    let evicted = |before: &BTreeMap<String, String>,
                   after: &BTreeMap<String, String>|
     -> std::collections::BTreeSet<String> {
        before
            .iter()
            .filter(|(n, _)| !after.contains_key(*n))
            .map(|(_, r)| r.clone())
            .collect()
    };
    let (after_a, after_b) = (roles_on(&a, a.w(1)).await?, roles_on(&b, b.w(1)).await?);
    let (ev_a, ev_b) = (evicted(&before_a, &after_a), evicted(&before_b, &after_b));
    let left_a: std::collections::BTreeSet<&String> = after_a.values().collect();
    let left_b: std::collections::BTreeSet<&String> = after_b.values().collect();
    println!(
        "MEASURE kubectl-compare evicted: NodeMaintenance {ev_a:?}, kubectl drain {ev_b:?}; left {left_a:?} / {left_b:?}"
    );
    ensure!(
        ev_a == ev_b,
        "evicted sets differ: NodeMaintenance {ev_a:?}, kubectl drain {ev_b:?}"
    );
    let want: std::collections::BTreeSet<String> =
        ["web", "scratch", "done"].map(String::from).into();
    ensure!(ev_a == want, "evicted {ev_a:?}, want {want:?}");
    ensure!(left_a == left_b, "left {left_a:?} vs {left_b:?}");
    // Both used the Eviction API for every pod they removed.
    audit_settle().await;
    let log = cluster().audit_log();
    for (s, before) in [(&a, &before_a), (&b, &before_b)] {
        for (pod, role) in before {
            if role == "logship" {
                continue;
            }
            let ev = nm::eviction_requests(&log, &s.ns, pod)?;
            ensure!(
                ev.iter().any(|e| (200..300).contains(&e.code)),
                "{}/{pod}: no accepted eviction: {ev:?}",
                s.ns
            );
        }
    }
    for (s, node) in [(&a, a.w(1)), (&b, b.w(1))] {
        ensure!(cordon_state(&s.node(node).await?).0, "{node} not cordoned");
    }
    nms.delete(&name).await?;
    nms.wait_gone(&name, WAIT).await?;
    cluster().kubectl(&["uncordon", b.w(1)])?;
    a.cleanup(cluster()).await?;
    b.cleanup(cluster()).await
}

/// A single-replica `minAvailable: 1` PDB: `kubectl drain` is still retrying after 60 s; the
/// NodeMaintenance names the deadlock (pod and PDB) within 10 s and, with `timeoutPolicy:
/// Delete`, finishes after its deadline.
async fn kubectl_single_replica_deadlock() -> Result<()> {
    let ((a, nms), (b, _)) = futures::try_join!(
        setup("kdl-nm", ShapeOptions::default()),
        setup("kdl-kc", ShapeOptions::default())
    )?;
    let (db_a, db_b) = futures::try_join!(single_replica_db(&a, 1), single_replica_db(&b, 1))?;
    let (db_a, db_b) = (name_of(&db_a), name_of(&db_b));
    let name = format!("{}-nm", a.name);
    let t0 = Instant::now();
    let mut kubectl = KubectlDrain::start(b.w(1), &[])?;
    nms.create(
        &name,
        json!({"nodeName": a.w(1), "drain": {"timeoutSeconds": 30, "timeoutPolicy": "Delete"}}),
    )
    .await?;
    let nm1 = wait_deadlock(&nms, &name, &a.ns, &db_a, Duration::from_secs(10)).await?;
    println!(
        "MEASURE kubectl-compare NodeMaintenance named the deadlock {:.2}s after creation",
        t0.elapsed().as_secs_f64()
    );
    check_deadlocked_entry(&nm1, &a.ns, &db_a)?;
    let deadline = time(&drain_status(&nm1).deadline).context("no deadline")?;
    let drained = nms
        .wait_condition(
            &name,
            api::CONDITION_DRAINED,
            "True",
            "DrainComplete",
            Duration::from_secs(50),
        )
        .await?;
    let done_at = Timestamp::now();
    println!(
        "MEASURE kubectl-compare NodeMaintenance drained {:.2}s after its deadline",
        between(deadline, done_at)
    );
    ensure!(done_at >= deadline, "drained before the deadline");
    ensure!(
        target(&drained, &a.ns, &db_a).and_then(|t| t.method) == Some(api::EvictionMethod::Delete),
        "{}",
        nm::describe(Some(&drained))
    );
    // kubectl: still waiting at 60 s, saying only that the budget refuses.
    tokio::time::sleep(Duration::from_secs(60).saturating_sub(t0.elapsed())).await;
    ensure!(
        kubectl.child.try_wait()?.is_none(),
        "kubectl drain exited: {}",
        kubectl.output()
    );
    let out = kubectl.output();
    ensure!(
        out.contains("Cannot evict pod as it would violate the pod's disruption budget"),
        "kubectl output: {out}"
    );
    ensure!(
        b.pods
            .get(&db_b)
            .await?
            .metadata
            .deletion_timestamp
            .is_none(),
        "kubectl evicted db"
    );
    println!(
        "MEASURE kubectl-compare kubectl drain after {:.0}s: still running, {} refusal lines",
        t0.elapsed().as_secs_f64(),
        out.matches("Cannot evict pod").count()
    );
    kubectl.child.kill().await?;
    nms.delete(&name).await?;
    nms.wait_gone(&name, WAIT).await?;
    cluster().kubectl(&["uncordon", b.w(1)])?;
    a.cleanup(cluster()).await?;
    b.cleanup(cluster()).await
}

fn install_crd(c: &pilothouse_tests::Cluster) -> Result<()> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?
        .block_on(nm::install_crd(c))
}

fn main() {
    let trials = vec![
        trial("m1_happy_path", m1_happy_path),
        trial("m2_single_replica_pdb_wait", m2_single_replica_pdb_wait),
        trial("m3_escalation_delete", m3_escalation_delete),
        trial("m4_multiple_pdbs", m4_multiple_pdbs),
        trial("m5_consent", m5_consent),
        trial("m6_overlap_pre_cordoned", m6_overlap_pre_cordoned),
        trial("m8_missing_node", m8_missing_node),
        trial("m9_node_deleted_mid_drain", m9_node_deleted_mid_drain),
        trial("m10_out_of_band_uncordon", m10_out_of_band_uncordon),
        trial("m11_cancellation", m11_cancellation),
        trial("m12_delete_during_drain", m12_delete_during_drain),
        trial("m13_priority_waves", m13_priority_waves),
        trial("m14_node_fails_mid_drain", m14_node_fails_mid_drain),
        trial("kubectl_same_pods_evicted", kubectl_same_pods_evicted),
        trial(
            "kubectl_single_replica_deadlock",
            kubectl_single_replica_deadlock,
        ),
    ];
    let mut args = k8s::accelerated_node_args(
        "node-lifecycle-controller,taint-eviction-controller,node-maintenance-controller",
    );
    args.extend([
        "--kube-api-qps=200".to_string(),
        "--kube-api-burst=400".to_string(),
    ]);
    pilothouse_tests::harness::main_with_setup(
        "node-maintenance",
        // Spec §6's harness: kube-controller-manager without the node-lifecycle and
        // taint-eviction controllers (Pilothouse runs them); its disruption controller computes
        // PDB status.
        ClusterOptions {
            nodes: 0,
            replace: Some(vec![
                "node-lifecycle-controller",
                "taint-eviction-controller",
            ]),
            ..Default::default()
        },
        install_crd,
        Some(SuitePilothouse {
            args,
            as_service_account: true,
        }),
        trials,
    )
}
