//! Issue 17 §2: API priority and fairness throttling, end to end. A FlowSchema puts every request
//! of Pilothouse's ServiceAccount (its Lease aside) on a priority level of the smallest share
//! that rejects rather than queues, so the real API server answers part of a burst of Jobs with
//! 429 and a `Retry-After` it computes itself. Pilothouse must re-send what was refused no
//! sooner than one second later (the API server never asks for less), once per refusal (events
//! excepted: they are never re-sent), and every Job must still complete with exact counts: no
//! pod lost or created twice, no tracking finalizer left.

use anyhow::{Result, ensure};
use k8s_openapi::jiff::Timestamp;
use pilothouse_tests::audit::{self, AuditEvent};
use pilothouse_tests::cluster::{Cluster, ClusterOptions};
use pilothouse_tests::harness::{SuitePilothouse, cluster, pilothouse, trial};
use pilothouse_tests::jobs::{self, Jobs};
use pilothouse_tests::k8s;
use serde_json::json;
use std::collections::BTreeMap;
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

fn install_flow_control(c: &Cluster) -> Result<()> {
    let file = c.dir.join("apf-flow-control.yaml");
    std::fs::write(&file, FLOW_CONTROL)?;
    c.kubectl(&["apply", "-f", &file.display().to_string()])?;
    Ok(())
}

/// One request of Pilothouse's to a named object: re-sends of a refused one share it.
fn named_request(e: &AuditEvent) -> Option<String> {
    let o = e.object_ref.as_ref()?;
    (!o.name.is_empty()).then(|| {
        format!(
            "{} {}/{}/{}/{}/{}",
            e.verb, o.api_group, o.resource, o.namespace, o.name, o.subresource
        )
    })
}

async fn throttled_jobs_complete_exactly() -> Result<()> {
    let client = cluster().client().await?;
    let ns = cluster().namespace("apf").await?;
    k8s::wait_service_account(&client, &ns).await?;
    let j = Jobs::new(client.clone(), &ns);
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
                .is_some_and(|o| o.resource != "events")
        })
        .collect();
    named.sort_by_key(|e| e.received());
    let mut last_refused: BTreeMap<String, Timestamp> = BTreeMap::new();
    let mut gaps = Vec::new();
    for e in named {
        let (Some(key), Some(t)) = (named_request(e), e.received()) else {
            continue;
        };
        if let Some(at) = last_refused.remove(&key) {
            gaps.push((key.clone(), t.duration_since(at).as_secs_f64()));
        }
        if code(e) == Some(429) {
            last_refused.insert(key, t);
        }
    }
    let (_, scrape) = pilothouse().http_get("/metrics").await?;
    let resent: f64 = scrape
        .lines()
        .filter(|l| {
            l.starts_with("rest_client_request_retries_total{") && l.contains("code=\"429\"")
        })
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum();
    let shortest = gaps.iter().map(|(_, g)| *g).fold(f64::INFINITY, f64::min);
    let longest = gaps.iter().map(|(_, g)| *g).fold(0.0, f64::max);
    println!(
        "MEASURE {} requests, {refused} refused with 429, {resent} re-sent after Retry-After; {} re-sends of a refused named request, {shortest:.3} s to {longest:.3} s after its refusal",
        events.len(),
        gaps.len()
    );
    ensure!(
        refused > 0,
        "APF refused none of Pilothouse's {} requests: the workload did not press it",
        events.len()
    );
    // Every refusal of a request that is not an event was answered by exactly one re-send:
    // none lost (given up), none sent again without being asked.
    let refused_resendable = events
        .iter()
        .filter(|e| code(e) == Some(429))
        .filter(|e| e.object_ref.as_ref().is_none_or(|o| o.resource != "events"))
        .count();
    ensure!(
        resent == refused_resendable as f64,
        "{refused_resendable} requests other than events refused, {resent} re-sent"
    );
    // The API server's Retry-After is a whole number of seconds, at least 1; the audit stamps
    // when requests arrive, so allow a little delivery jitter.
    let early: Vec<_> = gaps.iter().filter(|(_, g)| *g < 0.95).collect();
    ensure!(
        early.is_empty(),
        "re-sent sooner than the API server asked: {early:?}"
    );
    Ok(())
}

fn main() -> ! {
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
        vec![trial(
            "throttled_jobs_complete_exactly",
            throttled_jobs_complete_exactly,
        )],
    )
}
