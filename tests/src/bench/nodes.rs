//! The node workloads.
//!
//! `node-outage`: 200 nodes (× scale) in 20 zones, 10 pods on each that tolerate
//! `unreachable:NoExecute` for 0 s; one node per zone stops renewing its Lease. Both sides run
//! with the default grace period and monitor period. Measured by the benchmark's own watches,
//! from grace-period expiry (the failed nodes' last Lease renewal + `--node-monitor-grace-period`):
//! when each failed node is first seen with the `unreachable:NoExecute` taint, and when each of
//! its pods is first seen deleted. One failing node per zone of ten keeps every zone Normal with a
//! full token bucket, so neither side waits for its rate limiter (issue 5's latency benchmark).
//!
//! `idle-scale`: 500 nodes (× scale) in 20 zones and 10,000 pods bound to them, healthy and
//! unchanging; after the controllers have settled, CPU seconds and requests are measured over two
//! minutes in which nothing changes (peak RSS covers the whole run, caches included).
//!
//! The nodes are not kwok's: the in-test heartbeat writer renews their Leases every 10 s (as a
//! kubelet does) and stops on demand, so all failed nodes share one last renewal. Pods are bound
//! by `nodeName` and never run (no kubelet), which the controllers under test do not mind.

use super::{Outcome, quantile, scaled};
use crate::heartbeat::Heartbeats;
use crate::k8s::{self, has_taint, pod_on_node};
use crate::wait;
use anyhow::Result;
use futures::{StreamExt, TryStreamExt, stream};
use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use kube::Client;
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube::runtime::watcher;
use serde_json::json;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::time::Instant;

const UNREACHABLE: &str = "node.kubernetes.io/unreachable";
const NOT_READY: &str = "node.kubernetes.io/not-ready";
/// kube-controller-manager's and Pilothouse's default `--node-monitor-grace-period`.
const GRACE: SignedDuration = SignedDuration::from_secs(50);
const PODS_PER_NODE: usize = 10;
const NODES_PER_ZONE: usize = 10;

/// First sightings by a watch: node → taint seen; pod → deletion seen.
#[derive(Default)]
struct Seen {
    tainted: BTreeMap<String, Timestamp>,
    deleted: BTreeMap<String, Timestamp>,
}

/// Watches nodes and the namespace's pods until dropped, recording first sightings.
fn watch(client: &Client, ns: &str, seen: Arc<Mutex<Seen>>) -> Vec<tokio::task::JoinHandle<()>> {
    let nodes: Api<Node> = Api::all(client.clone());
    let s = Arc::clone(&seen);
    let node_task = tokio::spawn(async move {
        let mut events = std::pin::pin!(watcher(nodes, watcher::Config::default()));
        while let Some(Ok(e)) = events.next().await {
            let now = Timestamp::now();
            if let watcher::Event::Apply(n) | watcher::Event::InitApply(n) = e
                && has_taint(&n, UNREACHABLE, "NoExecute")
            {
                let name = n.metadata.name.clone().unwrap_or_default();
                s.lock().unwrap().tainted.entry(name).or_insert(now);
            }
        }
    });
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
    let pod_task = tokio::spawn(async move {
        let mut events = std::pin::pin!(watcher(pods, watcher::Config::default()));
        while let Some(Ok(e)) = events.next().await {
            let now = Timestamp::now();
            let gone = match e {
                watcher::Event::Apply(p) | watcher::Event::InitApply(p) => {
                    p.metadata.deletion_timestamp.is_some().then_some(p)
                }
                watcher::Event::Delete(p) => Some(p),
                _ => None,
            };
            if let Some(p) = gone {
                let name = p.metadata.name.clone().unwrap_or_default();
                seen.lock().unwrap().deleted.entry(name).or_insert(now);
            }
        }
    });
    vec![node_task, pod_task]
}

/// Healthy nodes in `zones` zones with `pods_per_node` pods each (`tolerations` on every pod),
/// once every node has lost the not-ready taint the API server gave it at creation. Returns the
/// heartbeat writer keeping them alive and (node, zone) pairs.
async fn seed(
    client: &Client,
    ns: &str,
    node_count: usize,
    zones: usize,
    pods_per_node: usize,
    tolerations: serde_json::Value,
    lift_not_ready_taint: bool,
) -> Result<(Heartbeats, Vec<(String, String)>)> {
    let hb = Heartbeats::every(client.clone(), Duration::from_secs(10));
    let names: Vec<(String, String)> = (0..node_count)
        .map(|i| {
            let zone = format!("zone-{:02}", i % zones);
            (format!("o-{zone}-{}", i / zones), zone)
        })
        .collect();
    stream::iter(&names)
        .map(|(n, z)| hb.add_node(n, z))
        .buffer_unordered(16)
        .try_collect::<Vec<()>>()
        .await?;
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
    let specs = names
        .iter()
        .flat_map(|(n, _)| (0..pods_per_node).map(move |k| (n, k)))
        .map(|(n, k)| {
            let mut pod = pod_on_node(&format!("p-{n}-{k}"), n, tolerations.clone())?;
            pod.metadata.finalizers = None;
            Ok(pod)
        })
        .collect::<Result<Vec<Pod>>>()?;
    let pp = PostParams::default();
    stream::iter(&specs)
        .map(|p| pods.create(&pp, p))
        .buffer_unordered(32)
        .try_for_each(|_| async { Ok(()) })
        .await?;
    let nodes: Api<Node> = Api::all(client.clone());
    if lift_not_ready_taint {
        let (pp, lift) = (
            PatchParams::default(),
            Patch::Merge(json!({"spec": {"taints": null}})),
        );
        stream::iter(&names)
            .map(|(n, _)| nodes.patch(n, &pp, &lift))
            .buffer_unordered(16)
            .try_for_each(|_| async { Ok(()) })
            .await?;
    }
    // Every node has lost the not-ready taint the API server put on it at creation.
    wait::until(
        "all nodes untainted",
        Duration::from_secs(180),
        Duration::from_secs(1),
        || async {
            let list = nodes.list(&Default::default()).await?;
            let clean = list
                .items
                .iter()
                .filter(|n| k8s::taints(n).is_empty())
                .count();
            Ok((clean == names.len()).then_some(()))
        },
    )
    .await?;
    Ok((hb, names))
}

pub(super) async fn node_outage(client: &Client, ns: &str, scale: f64) -> Result<Outcome> {
    let node_count = scaled(200, scale);
    let zones = node_count.div_ceil(NODES_PER_ZONE);
    let since = Timestamp::now();
    let tol = json!([{"key": UNREACHABLE, "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 0}]);
    let (hb, names) = seed(client, ns, node_count, zones, PODS_PER_NODE, tol, false).await?;
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
    let nodes: Api<Node> = Api::all(client.clone());

    let seen: Arc<Mutex<Seen>> = Arc::default();
    let watches = watch(client, ns, Arc::clone(&seen));
    // One node per zone, all after one shared renewal.
    let failing: Vec<String> = names
        .iter()
        .filter(|(n, _)| n.ends_with("-0"))
        .map(|(n, _)| n.clone())
        .collect();
    let start = Instant::now();
    let renewed = hb.fail(&failing).await;
    let expiry = renewed + GRACE;
    let victims: BTreeSet<String> = failing
        .iter()
        .flat_map(|n| (0..PODS_PER_NODE).map(move |k| format!("p-{n}-{k}")))
        .collect();
    // Every pod of the failed nodes seen deleted (which, with no toleration time, follows their
    // taints; the taints are judged in the final state).
    let series = super::converge(start, victims.len(), Duration::from_secs(300), || {
        let s = seen.lock().unwrap();
        let done = victims
            .iter()
            .filter(|p| s.deleted.contains_key(*p))
            .count();
        async move { Ok(done) }
    })
    .await?;
    let converge_seconds = start.elapsed().as_secs_f64();
    // Anything else either side would do (a wrong taint, a wrong deletion) has time to show.
    tokio::time::sleep(Duration::from_secs(15)).await;
    for w in watches {
        w.abort();
    }
    drop(hb);

    let extra = {
        let s = seen.lock().unwrap();
        let after = |t: &Timestamp| t.duration_since(expiry).as_secs_f64();
        let taint: Vec<f64> = failing
            .iter()
            .filter_map(|n| s.tainted.get(n).map(after))
            .collect();
        let deletion: Vec<f64> = victims
            .iter()
            .filter_map(|p| s.deleted.get(p).map(after))
            .collect();
        BTreeMap::from([
            (
                "taint after grace expiry p50 (s)".to_string(),
                quantile(&taint, 0.5),
            ),
            (
                "taint after grace expiry p99 (s)".to_string(),
                quantile(&taint, 0.99),
            ),
            (
                "taint after grace expiry max (s)".to_string(),
                quantile(&taint, 1.0),
            ),
            (
                "pod deleted after grace expiry p50 (s)".to_string(),
                quantile(&deletion, 0.5),
            ),
            (
                "pod deleted after grace expiry p99 (s)".to_string(),
                quantile(&deletion, 0.99),
            ),
            (
                "evictions (pods deleted)".to_string(),
                s.deleted.len() as f64,
            ),
            (
                "nodes tainted NoExecute".to_string(),
                s.tainted.len() as f64,
            ),
        ])
    };
    Ok(Outcome {
        converge_seconds,
        series,
        state: final_state(&nodes, &pods).await?,
        extra,
        since,
        cpu_seconds: None,
    })
}

/// The final state: each node's node-controller taints, each pod deleted or not.
async fn final_state(nodes: &Api<Node>, pods: &Api<Pod>) -> Result<BTreeMap<String, String>> {
    let mut state = BTreeMap::new();
    for n in nodes.list(&Default::default()).await?.items {
        let set: BTreeSet<String> = k8s::taints(&n)
            .into_iter()
            .filter(|t| [UNREACHABLE, NOT_READY].contains(&t.key.as_str()))
            .map(|t| format!("{}:{}", t.key, t.effect))
            .collect();
        state.insert(
            format!("node/{}", n.metadata.name.unwrap_or_default()),
            format!("{set:?}"),
        );
    }
    for p in pods.list(&Default::default()).await?.items {
        state.insert(
            format!("pod/{}", p.metadata.name.unwrap_or_default()),
            format!("deleted={}", p.metadata.deletion_timestamp.is_some()),
        );
    }
    Ok(state)
}

/// How long `idle-scale` watches nothing happen.
const IDLE: Duration = Duration::from_secs(120);
/// How long each side gets to list and settle before the idle window.
const SETTLE: Duration = Duration::from_secs(20);

/// `idle-scale`'s objects, seeded once for both sides of a pair.
pub(super) struct Seeded {
    pub nodes: usize,
    pub pods: usize,
    /// Renews the nodes' Leases for as long as the pair runs.
    _hb: Heartbeats,
}

/// Seeds `idle-scale` with no controller under test running: the API server's not-ready taint
/// on each new node is lifted here, as a node-lifecycle controller would for a Ready node.
pub(super) async fn seed_idle(client: &Client, ns: &str, scale: f64) -> Result<Seeded> {
    let node_count = scaled(500, scale);
    let zones = 20.min(node_count);
    let pods_per_node = (scaled(10_000, scale) / node_count).max(1);
    let (hb, _) = seed(
        client,
        ns,
        node_count,
        zones,
        pods_per_node,
        json!([]),
        true,
    )
    .await?;
    Ok(Seeded {
        nodes: node_count,
        pods: node_count * pods_per_node,
        _hb: hb,
    })
}

/// One side on the seeded cluster: settle, then two idle minutes measured.
pub(super) async fn idle_window(
    client: &Client,
    ns: &str,
    pid: u32,
    seeded: &Seeded,
) -> Result<Outcome> {
    tokio::time::sleep(SETTLE).await;
    let since = Timestamp::now();
    let cpu0 = super::cpu_seconds(pid)?;
    tokio::time::sleep(IDLE).await;
    let cpu = super::cpu_seconds(pid)? - cpu0;
    let nodes: Api<Node> = Api::all(client.clone());
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
    let state = final_state(&nodes, &pods).await?;
    let objects = state.len();
    Ok(Outcome {
        // Nothing converges: the window is reported as it is.
        converge_seconds: IDLE.as_secs_f64(),
        series: vec![(0.0, objects), (IDLE.as_secs_f64(), objects)],
        state,
        extra: BTreeMap::from([
            ("nodes".to_string(), seeded.nodes as f64),
            ("pods".to_string(), seeded.pods as f64),
        ]),
        since,
        cpu_seconds: Some(cpu),
    })
}
