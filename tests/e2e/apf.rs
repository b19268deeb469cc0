//! Issue 17 §2: API priority and fairness throttling, end to end. A FlowSchema puts every request
//! of Pilothouse's ServiceAccount (its Lease aside) on a priority level of the smallest share
//! that rejects rather than queues, so the real API server answers part of a burst of Jobs with
//! 429 and a `Retry-After` it computes itself. Pilothouse must decide one re-send per refusal
//! (events excepted: they are never re-sent), and send a refused request to a named object again
//! no sooner than the `Retry-After` its client logged; every Job must still complete with exact
//! counts: no pod lost or created twice, no tracking finalizer left.
//!
//! Then, with the flow control removed, a webhook misbehaves for a while (issue 17 §2): for 20 s
//! it refuses the first 8 pod creations and times out every Job status write, then it refuses
//! the next 8 pod updates (the tracking finalizers' removal, which waits for those writes). Every Job must still end with exact counts, and a
//! Job in a namespace the webhook does not cover must complete during the faults (one bad object
//! never stalls the others).

use anyhow::{Result, ensure};
use k8s_openapi::jiff::Timestamp;
use pilothouse_tests::audit::{self, AuditEvent};
use pilothouse_tests::cluster::{Cluster, ClusterOptions};
use pilothouse_tests::harness::{SuitePilothouse, cluster, pilothouse, trial};
use pilothouse_tests::jobs::{self, Jobs};
use pilothouse_tests::k8s;
use pilothouse_tests::webhook::{Match, Webhook};
use serde_json::json;
use std::collections::BTreeMap;
use std::sync::OnceLock;
use std::time::Duration;

const USER: &str = "system:serviceaccount:kube-system:pilothouse";
/// Enough that pod creates and finalizer patches overlap far beyond 3 seats; APF doubles its
/// Retry-After while refusals go on (it reached 32 s with 12 Jobs of 20), so not more.
const JOBS: usize = 4;
const COMPLETIONS: i32 = 10;

/// The priority level and the two FlowSchemas: the Lease keeps the leader-election level (a
/// replica refused its renewal would step down, which is another test's subject), everything
/// else of Pilothouse's goes to one nominal share with nothing borrowed or lent (3 seats of the
/// server's 600 here) and rejection when they are taken.
const FLOW_CONTROL: &str = r#"
apiVersion: flowcontrol.apiserver.k8s.io/v1
kind: PriorityLevelConfiguration
metadata:
  name: pilothouse-test-narrow
spec:
  type: Limited
  limited:
    nominalConcurrencyShares: 1
    lendablePercent: 0
    borrowingLimitPercent: 0
    limitResponse:
      type: Reject
---
apiVersion: flowcontrol.apiserver.k8s.io/v1
kind: FlowSchema
metadata:
  name: pilothouse-test-lease
spec:
  matchingPrecedence: 40
  priorityLevelConfiguration:
    name: leader-election
  distinguisherMethod:
    type: ByUser
  rules:
  - subjects:
    - kind: ServiceAccount
      serviceAccount: {name: pilothouse, namespace: kube-system}
    resourceRules:
    - apiGroups: [coordination.k8s.io]
      resources: [leases]
      verbs: ["*"]
      namespaces: ["*"]
---
apiVersion: flowcontrol.apiserver.k8s.io/v1
kind: FlowSchema
metadata:
  name: pilothouse-test-narrow
spec:
  matchingPrecedence: 50
  priorityLevelConfiguration:
    name: pilothouse-test-narrow
  distinguisherMethod:
    type: ByUser
  rules:
  - subjects:
    - kind: ServiceAccount
      serviceAccount: {name: pilothouse, namespace: kube-system}
    resourceRules:
    - apiGroups: ["*"]
      resources: ["*"]
      verbs: ["*"]
      namespaces: ["*"]
      clusterScope: true
    nonResourceRules:
    - nonResourceURLs: ["*"]
      verbs: ["*"]
"#;

fn flow_control_file(c: &Cluster) -> String {
    c.dir.join("apf-flow-control.yaml").display().to_string()
}

fn install_flow_control(c: &Cluster) -> Result<()> {
    std::fs::write(flow_control_file(c), FLOW_CONTROL)?;
    c.kubectl(&["apply", "-f", &flow_control_file(c)])?;
    Ok(())
}

/// Set once the throttling test is over and its flow control removed: the webhook test runs
/// after it, unthrottled.
static THROTTLING_DONE: OnceLock<()> = OnceLock::new();

/// Removes the flow control and lets the next test go, however the throttling test ends.
struct ThrottlingOver;

impl Drop for ThrottlingOver {
    fn drop(&mut self) {
        let c = cluster();
        if let Err(e) = c.kubectl(&["delete", "-f", &flow_control_file(c), "--wait=true"]) {
            eprintln!("removing the flow control: {e:#}");
        }
        let _ = THROTTLING_DONE.set(());
    }
}

/// A request URI without its query.
fn uri_path(uri: &str) -> &str {
    uri.split('?').next().unwrap_or(uri)
}

/// A `Debug`-printed `Duration` (`5s`, `1.5s`, `500ms`) in seconds.
fn duration_secs(text: &str) -> Option<f64> {
    if let Some(ms) = text.strip_suffix("ms") {
        return ms.parse::<f64>().ok().map(|v| v / 1000.0);
    }
    text.strip_suffix('s')?.parse().ok()
}

/// Pilothouse's re-sends after a 429, over every label set.
fn retries_429(scrape: &str) -> f64 {
    scrape
        .lines()
        .filter(|l| {
            l.starts_with("rest_client_request_retries_total{") && l.contains("code=\"429\"")
        })
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

async fn throttled_jobs_complete_exactly() -> Result<()> {
    let _over = ThrottlingOver;
    let client = cluster().client().await?;
    let ns = cluster().namespace("apf").await?;
    k8s::wait_service_account(&client, &ns).await?;
    let j = Jobs::new(client.clone(), &ns);
    let (_, scrape) = pilothouse().http_get("/metrics").await?;
    let resent_before = retries_429(&scrape);
    let since = Timestamp::now();
    for i in 0..JOBS {
        j.create(&jobs::job(
            &format!("t-{i}"),
            json!({"completions": COMPLETIONS, "parallelism": COMPLETIONS}),
            jobs::template(Some(0), "1s"),
        )?)
        .await?;
    }
    for i in 0..JOBS {
        j.expect_complete(&format!("t-{i}"), COMPLETIONS, Duration::from_secs(300))
            .await?;
    }
    // The audit log is written in batches.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let events: Vec<AuditEvent> = audit::read(&cluster().audit_log())?
        .into_iter()
        .filter(|e| {
            e.stage == "ResponseComplete"
                && e.user.username == USER
                && e.received().is_some_and(|t| t >= since)
        })
        .collect();
    let code = |e: &AuditEvent| e.response_status.as_ref().and_then(|s| s.code);
    let refused = events.iter().filter(|e| code(e) == Some(429)).count();
    // What APF refused on a named object, then the same request's next try.
    // Events are never re-sent (a later write to one is a new one): left out. In the order
    // the API server received them (the log is in the order answers completed).
    let mut named: Vec<&AuditEvent> = events
        .iter()
        .filter(|e| {
            e.object_ref
                .as_ref()
                .is_some_and(|o| o.resource != "events" && !o.name.is_empty())
        })
        .collect();
    named.sort_by_key(|e| e.received());
    // Per path, each refusal and how long after it the same request came again.
    let mut last_refused: BTreeMap<String, Timestamp> = BTreeMap::new();
    let mut gaps: BTreeMap<String, Vec<f64>> = BTreeMap::new();
    for e in named {
        let Some(t) = e.received() else { continue };
        let path = uri_path(&e.request_uri).to_string();
        if let Some(at) = last_refused.remove(&path) {
            gaps.entry(path.clone())
                .or_default()
                .push(t.duration_since(at).as_secs_f64());
        }
        if code(e) == Some(429) {
            last_refused.insert(path, t);
        }
    }
    // The waits Pilothouse's client logged, per path, in order: the API server's Retry-After.
    let mut waits: BTreeMap<String, Vec<f64>> = BTreeMap::new();
    for line in pilothouse().log_text().lines() {
        if !line.contains("the API server asked to retry later") {
            continue;
        }
        let field = |name: &str| {
            line.split_whitespace()
                .find_map(|w| w.strip_prefix(name))
                .map(str::to_string)
        };
        if let (Some(path), Some(wait)) = (field("path="), field("wait=")) {
            waits
                .entry(path)
                .or_default()
                .push(duration_secs(&wait).unwrap_or(f64::NAN));
        }
    }
    let (_, scrape) = pilothouse().http_get("/metrics").await?;
    let resent = retries_429(&scrape) - resent_before;
    let all: Vec<f64> = gaps.values().flatten().copied().collect();
    let shortest = all.iter().copied().fold(f64::INFINITY, f64::min);
    let longest = all.iter().copied().fold(0.0, f64::max);
    println!(
        "MEASURE {} requests, {refused} refused with 429, {resent} re-sent after Retry-After; {} re-sends of a refused request to a named object, {shortest:.3} s to {longest:.3} s after its refusal",
        events.len(),
        all.len()
    );
    ensure!(
        refused > 0,
        "APF refused none of Pilothouse's {} requests: the workload did not press it",
        events.len()
    );
    // Every refusal of a request that is not an event was answered by one re-send decision:
    // none given up, none sent again without being asked.
    let refused_resendable = events
        .iter()
        .filter(|e| code(e) == Some(429))
        .filter(|e| e.object_ref.as_ref().is_none_or(|o| o.resource != "events"))
        .count();
    ensure!(
        resent == refused_resendable as f64,
        "{refused_resendable} requests other than events refused, {resent} re-sent"
    );
    // Every refused request to a named object came again, each no sooner than the wait the
    // API server asked for (the refusal is stamped before its answer leaves, the re-send after
    // the wait: no jitter can shorten the gap).
    ensure!(
        last_refused.is_empty(),
        "refused and never sent again: {last_refused:?}"
    );
    ensure!(
        !all.is_empty(),
        "no refused request to a named object: nothing shows when re-sends went"
    );
    for (path, gs) in &gaps {
        let ws = waits.get(path).cloned().unwrap_or_default();
        ensure!(
            ws.len() == gs.len(),
            "{path}: refused and re-sent {} times, {} waits logged",
            gs.len(),
            ws.len()
        );
        for (g, w) in gs.iter().zip(&ws) {
            ensure!(
                *w >= 1.0 && g >= w,
                "{path}: re-sent {g:.3} s after its refusal, Retry-After {w} s"
            );
        }
    }
    Ok(())
}

async fn misbehaving_webhook_jobs_complete_exactly() -> Result<()> {
    while THROTTLING_DONE.get().is_none() {
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let client = cluster().client().await?;
    let ns = cluster().namespace("webhook").await?;
    let free_ns = cluster().namespace("free").await?;
    for n in [&ns, &free_ns] {
        k8s::wait_service_account(&client, n).await?;
    }
    // The API server waits 2 s for an answer; a 3 s delay is a timeout.
    let hook = Webhook::start_with_timeout(
        client.clone(),
        &ns,
        &["pods", "jobs/status"],
        &["CREATE", "UPDATE"],
        2,
    )
    .await?;
    let by = |resource: &str, sub: &str, op: &str| Match::by(resource, sub, op, USER);
    hook.reject(
        by("pods", "", "CREATE"),
        8,
        "pilothouse test: pod creation refused",
    );
    hook.delay(by("jobs", "status", "UPDATE"), Duration::from_secs(3));
    let j = Jobs::new(client.clone(), &ns);
    let free = Jobs::new(client.clone(), &free_ns);
    let jobs = [
        ("plain", json!({"completions": 6, "parallelism": 3})),
        (
            "indexed",
            json!({"completions": 6, "parallelism": 3, "completionMode": "Indexed"}),
        ),
    ];
    for (name, spec) in &jobs {
        j.create(&jobs::job(
            name,
            spec.clone(),
            jobs::template(Some(0), "1s"),
        )?)
        .await?;
    }
    free.create(&jobs::job(
        "free",
        json!({"completions": 2, "parallelism": 2}),
        jobs::template(Some(0), "1s"),
    )?)
    .await?;
    let faults = std::time::Instant::now();
    free.expect_complete("free", 2, Duration::from_secs(20))
        .await?;
    let free_done = faults.elapsed();
    // The faults last 20 s from the start, whatever the free Job took.
    tokio::time::sleep(Duration::from_secs(20).saturating_sub(free_done)).await;
    // Status writes go through again, so the finished pods' finalizers are to be removed now:
    // the first 8 removals are refused.
    hook.clear();
    hook.reject(
        by("pods", "", "UPDATE"),
        8,
        "pilothouse test: pod update refused",
    );
    let cleared = faults.elapsed();
    for (name, _) in &jobs {
        j.expect_complete(name, 6, Duration::from_secs(180)).await?;
    }
    let refused = |resource: &str, sub: &str, op: &str| {
        hook.seen()
            .iter()
            .filter(|s| {
                s.resource == resource
                    && s.sub_resource == sub
                    && s.operation == op
                    && s.user == USER
                    && !s.allowed
            })
            .count()
    };
    let timed_out = hook
        .seen()
        .iter()
        .filter(|s| s.resource == "jobs" && s.sub_resource == "status" && s.user == USER)
        .count();
    let (creates, updates) = (refused("pods", "", "CREATE"), refused("pods", "", "UPDATE"));
    println!(
        "MEASURE webhook faults: {creates} pod creations refused and {timed_out} Job status writes timed out over {:.1}s, then {updates} pod updates refused; the Job outside the webhook's namespace completed {:.1}s into the faults; all complete {:.1}s after they stopped",
        cleared.as_secs_f64(),
        free_done.as_secs_f64(),
        faults.elapsed().saturating_sub(cleared).as_secs_f64()
    );
    ensure!(
        creates == 8 && updates == 8 && timed_out >= 1,
        "the faults did not all happen: {creates} creations, {updates} updates refused, {timed_out} status writes delayed"
    );
    hook.remove().await
}

fn main() -> ! {
    // The client's debug line names each wait the API server asked for. Set before any thread
    // exists; the suite's Pilothouse inherits it.
    // SAFETY: single-threaded here, nothing reads the environment concurrently.
    unsafe { std::env::set_var("RUST_LOG", "info,shared::api::client=debug") };
    pilothouse_tests::harness::main_with_setup(
        "apf",
        ClusterOptions {
            replace: Some(vec!["job-controller"]),
            ..Default::default()
        },
        install_flow_control,
        Some(SuitePilothouse {
            args: vec![
                "--controllers=job-controller".to_string(),
                // A budget that does not hold the burst back: the API server does.
                "--kube-api-qps=500".to_string(),
                "--kube-api-burst=1000".to_string(),
                "--concurrent-job-syncs=4".to_string(),
            ],
            as_service_account: true,
        }),
        vec![
            trial(
                "throttled_jobs_complete_exactly",
                throttled_jobs_complete_exactly,
            ),
            trial(
                "misbehaving_webhook_jobs_complete_exactly",
                misbehaving_webhook_jobs_complete_exactly,
            ),
        ],
    )
}
