//! The StatefulSet workloads (issue 14).
//!
//! `sts-rollout`: 100 sets (× scale) of 10 replicas, OrderedReady, RollingUpdate with
//! maxUnavailable 2; once every set is Ready, every template changes at once and the workload
//! converges when every set has rolled out (all replicas updated, Ready, and
//! `currentRevision == updateRevision`).
//!
//! `sts-scale` (spec SX1): one Parallel set of 2,000 replicas (× scale) created, then, once all
//! are Ready, scaled to 0; converges when the last pod is gone.
//!
//! Convergence is judged from the sets' status (polled every 100 ms: a list of ≤ 100 sets, cheap
//! next to a list of their pods) and, for the scale-down, from the pod list once the status says
//! 0. Pods run on the plane's kwok nodes with a 1 s grace period (kwok keeps a deleted pod for
//! its grace period).

use super::{Outcome, converge, scaled};
use anyhow::Result;
use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::Pod;
use kube::Client;
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
use serde_json::{Value, json};
use std::collections::BTreeMap;
use std::time::Duration;
use tokio::time::Instant;

const TIMEOUT: Duration = Duration::from_secs(1800);

fn set(name: &str, replicas: usize, spec: Value) -> Result<StatefulSet> {
    let mut v = crate::k8s::stateful_set(name, i32::try_from(replicas)?);
    if let (Some(s), Some(extra)) = (v["spec"].as_object_mut(), spec.as_object()) {
        s.extend(extra.clone());
    }
    Ok(serde_json::from_value(v)?)
}

fn status(s: &StatefulSet) -> Value {
    serde_json::to_value(&s.status).unwrap_or_default()
}

/// Every replica Ready and updated, and the set's current revision is its update revision.
fn rolled(s: &StatefulSet, image: &str) -> bool {
    let st = status(s);
    let want = s.spec.replicas.unwrap_or(1) as i64;
    let at_image = s.spec.template.spec.as_ref().is_some_and(|p| {
        p.containers
            .iter()
            .all(|c| c.image.as_deref() == Some(image))
    });
    let observed = st["observedGeneration"].as_i64() == s.metadata.generation;
    at_image
        && observed
        && st["readyReplicas"].as_i64() == Some(want)
        && st["updatedReplicas"].as_i64() == Some(want)
        && st["currentRevision"] == st["updateRevision"]
}

async fn count_rolled(sets: &Api<StatefulSet>, image: &str) -> Result<usize> {
    Ok(sets
        .list(&ListParams::default())
        .await?
        .items
        .iter()
        .filter(|s| rolled(s, image))
        .count())
}

/// Per set: replicas, the revisions, and the counters (names and hashes are equal on both sides
/// for the same template).
async fn digest(sets: &Api<StatefulSet>) -> Result<BTreeMap<String, String>> {
    let mut out = BTreeMap::new();
    for s in sets.list(&ListParams::default()).await?.items {
        let st = status(&s);
        out.insert(
            s.metadata.name.clone().unwrap_or_default(),
            format!(
                "replicas={} ready={} updated={} current={} currentRevision={} updateRevision={}",
                st["replicas"],
                st["readyReplicas"],
                st["updatedReplicas"],
                st["currentReplicas"],
                st["currentRevision"],
                st["updateRevision"]
            ),
        );
    }
    Ok(out)
}

/// `sts-rollout`.
pub async fn rollout(client: &Client, ns: &str, scale: f64) -> Result<Outcome> {
    let sets: Api<StatefulSet> = Api::namespaced(client.clone(), ns);
    let n = scaled(100, scale);
    let start = Instant::now();
    let since = k8s_openapi::jiff::Timestamp::now();
    for i in 0..n {
        let s = set(
            &format!("web-{i:03}"),
            10,
            json!({"updateStrategy": {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": 2}}}),
        )?;
        sets.create(&PostParams::default(), &s).await?;
    }
    converge(start, n, TIMEOUT, || count_rolled(&sets, "nginx:1")).await?;
    let created = start.elapsed().as_secs_f64();
    let patch = json!({"spec": {"template": {"spec": {"containers": [{"name": "c", "image": "nginx:2"}]}}}});
    let rollout_start = Instant::now();
    for i in 0..n {
        sets.patch(
            &format!("web-{i:03}"),
            &PatchParams::default(),
            &Patch::Strategic(&patch),
        )
        .await?;
    }
    let series = converge(start, n, TIMEOUT, || count_rolled(&sets, "nginx:2")).await?;
    let rolled_out = rollout_start.elapsed().as_secs_f64();
    outcome(
        &sets,
        start,
        since,
        series,
        [
            ("created and Ready in (s)", created),
            ("rolled out in (s)", rolled_out),
        ],
    )
    .await
}

/// Both workloads run two phases: converged at the end of the second, each phase's length
/// reported beside it.
async fn outcome(
    sets: &Api<StatefulSet>,
    start: Instant,
    since: k8s_openapi::jiff::Timestamp,
    series: Vec<(f64, usize)>,
    phases: [(&str, f64); 2],
) -> Result<Outcome> {
    Ok(Outcome {
        converge_seconds: start.elapsed().as_secs_f64(),
        series,
        state: digest(sets).await?,
        extra: phases.iter().map(|(k, v)| (k.to_string(), *v)).collect(),
        since,
        cpu_seconds: None,
    })
}

/// `sts-scale` (SX1).
pub async fn scale_up_and_down(client: &Client, ns: &str, scale: f64) -> Result<Outcome> {
    let sets: Api<StatefulSet> = Api::namespaced(client.clone(), ns);
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
    let replicas = scaled(2000, scale);
    let start = Instant::now();
    let since = k8s_openapi::jiff::Timestamp::now();
    sets.create(
        &PostParams::default(),
        &set("big", replicas, json!({"podManagementPolicy": "Parallel"}))?,
    )
    .await?;
    let ready = || async {
        let s = sets.get("big").await?;
        Ok(status(&s)["readyReplicas"].as_i64().unwrap_or(0) as usize)
    };
    let mut series = converge(start, replicas, TIMEOUT, ready).await?;
    let created = start.elapsed().as_secs_f64();
    sets.patch(
        "big",
        &PatchParams::default(),
        &Patch::Merge(json!({"spec": {"replicas": 0}})),
    )
    .await?;
    let down_start = Instant::now();
    // Plotted as pods still to go, counted down from the total.
    let left = || async {
        let s = sets.get("big").await?;
        let st = status(&s);
        let counted = st["replicas"].as_i64().unwrap_or(0) as usize;
        let gone_by_status = replicas.saturating_sub(counted);
        if gone_by_status < replicas {
            return Ok(replicas + gone_by_status);
        }
        // The status says 0: the pods themselves must be gone too.
        let live = pods.list(&ListParams::default()).await?.items.len();
        Ok((2 * replicas).saturating_sub(live))
    };
    series.extend(
        converge(start, 2 * replicas, TIMEOUT, left)
            .await?
            .into_iter()
            .skip(1),
    );
    let scaled_down = down_start.elapsed().as_secs_f64();
    outcome(
        &sets,
        start,
        since,
        series,
        [
            ("created and Ready in (s)", created),
            ("scaled to 0 and gone in (s)", scaled_down),
        ],
    )
    .await
}
