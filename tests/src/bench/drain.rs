//! `node-drain` (issue 16): 10 nodes (× scale) with 50 pods each drained at once, by one
//! NodeMaintenance per node (Pilothouse's node-maintenance-controller) and by one `kubectl drain`
//! per node run in parallel (the pinned kubectl, `--ignore-daemonsets --delete-emptydir-data
//! --force`, retrying refused evictions every 5 s as it does), each side on a fresh control plane.
//!
//! Each node holds 20 pods behind PodDisruptionBudgets (10 Deployments of 2 pods per node, each
//! with `maxUnavailable: 1`, so every budget is shared by all drained nodes) and 30 pods of
//! Deployments without one. The plane's three kwok nodes are cordoned while the workload is
//! placed on the drained nodes (a hard spread of one Deployment's pods over hostnames) and
//! uncordoned before the drain, so replacements have somewhere to go. kwok runs the pods and
//! keeps a deleted one for its 2 s grace period.
//!
//! Measured from outside both: time until every drained node holds no pod (a watch), and each
//! side's own end (every `kubectl drain` exited 0; every NodeMaintenance `Drained=True`); API
//! requests of the side under test (the audit log, by user: `bench-kubectl` for the ten kubectl
//! processes, `bench-pilothouse`), eviction requests and those refused with 429. The
//! NodeMaintenance objects are created by the benchmark as admin (not counted); kubectl's cordon
//! is counted, as the controller's is. CPU seconds: Pilothouse's process, or the ten kubectl
//! processes together (getrusage of reaped children); peak RSS: Pilothouse's, or the largest
//! kubectl's.

use super::{Profile, Workload, cpu_seconds, peak_rss_mib, user_kubeconfig};
use super::{RunResult, Side, fresh_cluster, release_binary, requests_by_verb, scaled};
use crate::cluster::Cluster;
use crate::maintenance::{self, Maintenances};
use crate::{audit, k8s, unique, wait};
use anyhow::{Context, Result, ensure};
use futures::StreamExt;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::jiff::Timestamp;
use kube::Client;
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
use kube::runtime::watcher;
use serde_json::json;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::time::Instant;

const NS: &str = super::NS;
const PDB_DEPLOYMENTS: usize = 10;
const PDB_PODS_PER_NODE: usize = 2;
const FREE_DEPLOYMENTS: usize = 3;
const FREE_PODS_PER_NODE: usize = 10;
const SPARES: [&str; 3] = ["kwok-node-0", "kwok-node-1", "kwok-node-2"];

/// The drained nodes' names.
fn drained_nodes(scale: f64) -> Vec<String> {
    (0..scaled(10, scale))
        .map(|i| format!("drain-{i}"))
        .collect()
}

/// One run per side of `order`, each on a fresh control plane.
pub(super) async fn run_pair(
    w: &Workload,
    order: [Side; 2],
    p: Profile,
    log: &mut (dyn FnMut(String) + Send),
) -> Result<Vec<(Side, RunResult)>> {
    let mut out = Vec::new();
    for side in order {
        out.push((side, run_once(w, side, p, log).await?));
    }
    Ok(out)
}

async fn run_once(
    w: &Workload,
    side: Side,
    p: Profile,
    log: &mut (dyn FnMut(String) + Send),
) -> Result<RunResult> {
    let (cluster, client) = fresh_cluster(w, side.name()).await?;
    let nodes = drained_nodes(w.scale);
    let pods = seed(&client, &nodes).await?;
    log(format!("  seeded {} nodes with {pods} pods", nodes.len()));
    let r = match side {
        Side::Pilothouse => with_pilothouse(&cluster, &client, &nodes, p, log).await,
        Side::Upstream => with_kubectl(&cluster, &client, &nodes, log).await,
    };
    tokio::task::spawn_blocking(move || drop(cluster)).await?;
    r
}

/// Cordons the spare nodes, creates the drained nodes and the workload on them, waits until
/// every pod runs and every budget is observed, uncordons the spares. Returns the pod count.
async fn seed(client: &Client, nodes: &[String]) -> Result<usize> {
    let node_api: Api<Node> = Api::all(client.clone());
    let cordon = |v: bool| json!({"spec": {"unschedulable": v}});
    for n in SPARES {
        node_api
            .patch(n, &PatchParams::default(), &Patch::Merge(cordon(true)))
            .await?;
    }
    // The spread below honours taints: cordoned spares count once they carry the NLC's taint.
    wait::until(
        "spares tainted unschedulable",
        Duration::from_secs(60),
        Duration::from_millis(200),
        || async {
            for n in SPARES {
                let node = node_api.get(n).await?;
                if !k8s::has_taint(&node, "node.kubernetes.io/unschedulable", "NoSchedule") {
                    return Ok(None);
                }
            }
            Ok(Some(()))
        },
    )
    .await?;
    futures::stream::iter(nodes)
        .map(|n| k8s::create_kwok_node(client, n, "zone-drain"))
        .buffer_unordered(10)
        .collect::<Vec<_>>()
        .await
        .into_iter()
        .collect::<Result<Vec<Node>>>()?;
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), NS);
    let pdbs: Api<PodDisruptionBudget> = Api::namespaced(client.clone(), NS);
    let mut total = 0;
    let mut create = |name: String, replicas: usize| {
        total += replicas;
        let d: Result<Deployment> = serde_json::from_value(json!({
            "metadata": {"name": name},
            "spec": {
                "replicas": replicas,
                "selector": {"matchLabels": {"app": name}},
                "template": {
                    "metadata": {"labels": {"app": name}},
                    "spec": {
                        "terminationGracePeriodSeconds": 2,
                        "tolerations": [maintenance::kwok_toleration()],
                        "topologySpreadConstraints": [{
                            "maxSkew": 1, "topologyKey": "kubernetes.io/hostname",
                            "whenUnsatisfiable": "DoNotSchedule", "nodeTaintsPolicy": "Honor",
                            "labelSelector": {"matchLabels": {"app": name}}
                        }],
                        "containers": [{"name": "c", "image": "busybox"}]
                    }
                }
            }
        }))
        .map_err(Into::into);
        d
    };
    let mut objects = Vec::new();
    for k in 0..PDB_DEPLOYMENTS {
        objects.push(create(format!("pdb-{k}"), PDB_PODS_PER_NODE * nodes.len())?);
    }
    for k in 0..FREE_DEPLOYMENTS {
        objects.push(create(
            format!("free-{k}"),
            FREE_PODS_PER_NODE * nodes.len(),
        )?);
    }
    for d in &objects {
        deployments.create(&PostParams::default(), d).await?;
    }
    for k in 0..PDB_DEPLOYMENTS {
        let pdb: PodDisruptionBudget = serde_json::from_value(json!({
            "metadata": {"name": format!("pdb-{k}")},
            "spec": {"maxUnavailable": 1, "selector": {"matchLabels": {"app": format!("pdb-{k}")}}}
        }))?;
        pdbs.create(&PostParams::default(), &pdb).await?;
    }
    let pods: Api<Pod> = Api::namespaced(client.clone(), NS);
    let per_node = PDB_DEPLOYMENTS * PDB_PODS_PER_NODE + FREE_DEPLOYMENTS * FREE_PODS_PER_NODE;
    wait::until(
        &format!("{total} pods ready, {per_node} on each drained node"),
        Duration::from_secs(600),
        Duration::from_secs(1),
        || async {
            let list = pods.list(&ListParams::default()).await?.items;
            let mut on: BTreeMap<String, usize> = BTreeMap::new();
            for p in list.iter().filter(|p| maintenance::is_ready(p)) {
                if let Some(n) = p.spec.as_ref().and_then(|s| s.node_name.clone()) {
                    *on.entry(n).or_default() += 1;
                }
            }
            Ok(
                (nodes.iter().all(|n| on.get(n) == Some(&per_node)) && on.len() == nodes.len())
                    .then_some(()),
            )
        },
    )
    .await?;
    wait::until(
        "every budget observed, allowing one disruption",
        Duration::from_secs(120),
        Duration::from_millis(500),
        || async {
            let list = pdbs.list(&ListParams::default()).await?.items;
            Ok(list
                .iter()
                .all(|b| {
                    let st = b.status.clone().unwrap_or_default();
                    st.observed_generation == b.metadata.generation
                        && st.disruptions_allowed == Some(1)
                })
                .then_some(()))
        },
    )
    .await?;
    for n in SPARES {
        node_api
            .patch(n, &PatchParams::default(), &Patch::Merge(cordon(false)))
            .await?;
    }
    wait::until(
        "spares schedulable again",
        Duration::from_secs(60),
        Duration::from_millis(200),
        || async {
            for n in SPARES {
                if !k8s::taints(&node_api.get(n).await?)
                    .iter()
                    .all(|t| t.key == "kwok.x-k8s.io/node")
                {
                    return Ok(None);
                }
            }
            Ok(Some(()))
        },
    )
    .await?;
    Ok(total)
}

/// Pods per drained node as a watch sees them (a pod counts until it is gone).
struct Placement {
    on: Arc<Mutex<BTreeMap<String, String>>>,
    task: tokio::task::JoinHandle<()>,
}

impl Placement {
    async fn start(client: &Client) -> Result<Placement> {
        let on: Arc<Mutex<BTreeMap<String, String>>> = Arc::default();
        let (o, ready) = (on.clone(), Arc::new(tokio::sync::Notify::new()));
        let r = ready.clone();
        let pods: Api<Pod> = Api::namespaced(client.clone(), NS);
        let task = tokio::spawn(async move {
            let mut events = std::pin::pin!(watcher(pods, watcher::Config::default()));
            while let Some(e) = events.next().await {
                let Ok(e) = e else { continue };
                let mut on = o.lock().expect("placement");
                match e {
                    watcher::Event::Apply(p) | watcher::Event::InitApply(p) => {
                        let name = p.metadata.name.clone().unwrap_or_default();
                        if let Some(n) = p.spec.and_then(|s| s.node_name) {
                            on.insert(name, n);
                        }
                    }
                    watcher::Event::Delete(p) => {
                        on.remove(&p.metadata.name.unwrap_or_default());
                    }
                    watcher::Event::Init => on.clear(),
                    watcher::Event::InitDone => r.notify_one(),
                }
            }
        });
        tokio::time::timeout(Duration::from_secs(60), ready.notified())
            .await
            .context("the pod watch did not list")?;
        Ok(Placement { on, task })
    }

    /// How many of `nodes` hold no pod.
    fn empty(&self, nodes: &[String]) -> usize {
        let on = self.on.lock().expect("placement");
        let busy: BTreeSet<&String> = on.values().collect();
        nodes.iter().filter(|n| !busy.contains(n)).count()
    }
}

impl Drop for Placement {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Polls until every node is empty and `done` reports the side's own end; returns the series,
/// when the nodes were empty and when the side said it was done.
async fn until_drained<F, Fut>(
    placement: &Placement,
    nodes: &[String],
    start: Instant,
    mut done: F,
) -> Result<(Vec<(f64, usize)>, f64, f64)>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<bool>>,
{
    let mut series = vec![(0.0, 0)];
    let (mut empty_at, mut done_at) = (None, None);
    let mut last_check = Instant::now() - Duration::from_secs(1);
    loop {
        let empty = placement.empty(nodes);
        if series.last().is_some_and(|(_, n)| *n != empty) {
            series.push((start.elapsed().as_secs_f64(), empty));
        }
        if empty == nodes.len() && empty_at.is_none() {
            empty_at = Some(start.elapsed().as_secs_f64());
        }
        // The side's own report, at most twice a second (a list or a process poll).
        if done_at.is_none() && last_check.elapsed() >= Duration::from_millis(500) {
            last_check = Instant::now();
            if done().await? {
                done_at = Some(start.elapsed().as_secs_f64());
            }
        }
        if let (Some(e), Some(d)) = (empty_at, done_at) {
            return Ok((series, e, d));
        }
        ensure!(
            start.elapsed() < Duration::from_secs(1200),
            "not drained after 20 minutes: {empty}/{} nodes empty, side done: {}",
            nodes.len(),
            done_at.is_some()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The final state both sides must reach: every drained node empty and cordoned, every
/// Deployment fully available again (on the spares).
async fn final_state(client: &Client, nodes: &[String]) -> Result<BTreeMap<String, String>> {
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), NS);
    let ready = || async {
        let list = deployments.list(&ListParams::default()).await?.items;
        let all = list.iter().all(|d| {
            let want = d.spec.replicas.unwrap_or(1);
            d.status.as_ref().and_then(|s| s.available_replicas) == Some(want)
        });
        anyhow::Ok(all.then_some(list))
    };
    // Unsettled is still a state: the comparison between the sides reports it.
    let list = match wait::until(
        "every Deployment available again",
        Duration::from_secs(180),
        Duration::from_secs(1),
        ready,
    )
    .await
    {
        Ok(l) => l,
        Err(_) => deployments.list(&ListParams::default()).await?.items,
    };
    let mut out = BTreeMap::new();
    for d in list {
        let st = d.status.unwrap_or_default();
        out.insert(
            format!("deployment/{}", d.metadata.name.unwrap_or_default()),
            format!("available={}", st.available_replicas.unwrap_or(0)),
        );
    }
    let node_api: Api<Node> = Api::all(client.clone());
    let pods: Api<Pod> = Api::namespaced(client.clone(), NS);
    for n in nodes {
        let node = node_api.get(n).await?;
        let left = pods
            .list(&ListParams::default().fields(&format!("spec.nodeName={n}")))
            .await?
            .items
            .len();
        out.insert(
            format!("node/{n}"),
            format!(
                "unschedulable={} pods={left}",
                node.spec.and_then(|s| s.unschedulable).unwrap_or(false)
            ),
        );
    }
    Ok(out)
}

/// Eviction requests of `user` since `since`: (all, refused with 429).
fn evictions(log: &std::path::Path, user: &str, since: Timestamp) -> Result<(u64, u64)> {
    let mut all = 0;
    let mut refused = 0;
    for e in audit::read(log)? {
        let path = e.request_uri.split('?').next().unwrap_or_default();
        if e.stage == "ResponseComplete"
            && e.verb == "create"
            && e.user.username == user
            && path.ends_with("/eviction")
            && e.received().is_some_and(|t| t >= since)
        {
            all += 1;
            if e.response_status.as_ref().and_then(|s| s.code) == Some(429) {
                refused += 1;
            }
        }
    }
    Ok((all, refused))
}

async fn measured(
    cluster: &Cluster,
    client: &Client,
    nodes: &[String],
    user: &str,
    since: Timestamp,
    drained: (Vec<(f64, usize)>, f64, f64),
    (cpu, rss): (f64, f64),
) -> Result<RunResult> {
    let (series, empty_at, done_at) = drained;
    let state = final_state(client, nodes).await?;
    // The audit log is written in batches: give it a moment.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let requests = requests_by_verb(&cluster.audit_log(), user, since)?;
    let (all, refused) = evictions(&cluster.audit_log(), user, since)?;
    let extra = BTreeMap::from([
        ("side reports drained (s)".to_string(), done_at),
        ("eviction requests".to_string(), all as f64),
        ("evictions refused (429)".to_string(), refused as f64),
    ]);
    Ok(RunResult {
        converge_seconds: empty_at,
        requests,
        cpu_seconds: cpu,
        peak_rss_mib: rss,
        series,
        state,
        extra,
    })
}

async fn with_pilothouse(
    cluster: &Cluster,
    client: &Client,
    nodes: &[String],
    p: Profile,
    log: &mut (dyn FnMut(String) + Send),
) -> Result<RunResult> {
    let user = "bench-pilothouse";
    maintenance::install_crd(cluster).await?;
    let kc = user_kubeconfig(cluster, user)?;
    let port = cluster.reserve_port()?;
    let log_path = cluster.dir.join(format!(
        "logs/{}.log",
        unique("bench-pilothouse-node-drain")
    ));
    let file = std::fs::File::create(&log_path)?;
    let mut cmd = std::process::Command::new(release_binary()?);
    cmd.arg(format!("--kubeconfig={}", kc.display()))
        .arg(format!("--metrics-bind-address=127.0.0.1:{port}"))
        .arg("--secure-port=0")
        .arg("--leader-elect=false")
        .arg("--controllers=node-maintenance-controller")
        .arg(format!("--kube-api-qps={}", p.qps))
        .arg(format!("--kube-api-burst={}", p.burst));
    log(format!("  pilothouse ran: {cmd:?}"));
    let mut child = cmd
        .stdout(file.try_clone()?)
        .stderr(file)
        .spawn()
        .context("spawning pilothouse")?;
    let pid = child.id();
    let r = async {
        // Let it list and settle before the clock starts.
        tokio::time::sleep(Duration::from_secs(3)).await;
        let cpu0 = cpu_seconds(pid)?;
        let placement = Placement::start(client).await?;
        let nms = Maintenances::new(client.clone());
        let since = Timestamp::now();
        let start = Instant::now();
        for n in nodes {
            nms.create(n, json!({"nodeName": n, "reason": "node-drain benchmark"}))
                .await?;
        }
        let drained = until_drained(&placement, nodes, start, || async {
            let list = nms.api.list(&ListParams::default()).await?.items;
            Ok(list.len() == nodes.len()
                && list.iter().all(|m| {
                    maintenance::condition(m, maintenance::api::CONDITION_DRAINED)
                        .is_some_and(|c| c.status == "True")
                }))
        })
        .await?;
        let cpu = cpu_seconds(pid)? - cpu0;
        let rss = peak_rss_mib(pid)?;
        measured(cluster, client, nodes, user, since, drained, (cpu, rss)).await
    }
    .await;
    let _ = child.kill();
    let _ = child.wait();
    r.with_context(|| format!("pilothouse log: {}", log_path.display()))
}

/// CPU seconds (user + system) and the largest peak RSS (MiB) of this process's reaped children.
fn children_usage() -> (f64, f64) {
    // SAFETY: getrusage writes into the struct we pass; no other preconditions.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    unsafe { libc::getrusage(libc::RUSAGE_CHILDREN, &mut ru) };
    let t = |tv: libc::timeval| tv.tv_sec as f64 + tv.tv_usec as f64 / 1e6;
    (
        t(ru.ru_utime) + t(ru.ru_stime),
        ru.ru_maxrss as f64 / 1024.0,
    )
}

async fn with_kubectl(
    cluster: &Cluster,
    client: &Client,
    nodes: &[String],
    log: &mut (dyn FnMut(String) + Send),
) -> Result<RunResult> {
    let user = "bench-kubectl";
    let kc = user_kubeconfig(cluster, user)?;
    let kubectl = cluster.bin_dir()?.join("kubectl");
    let placement = Placement::start(client).await?;
    let (cpu0, _) = children_usage();
    let since = Timestamp::now();
    let start = Instant::now();
    let mut children = Vec::new();
    for n in nodes {
        let out = std::fs::File::create(cluster.dir.join(format!("logs/kubectl-drain-{n}.log")))?;
        let mut cmd = tokio::process::Command::new(&kubectl);
        cmd.arg(format!("--kubeconfig={}", kc.display())).args([
            "drain",
            n,
            "--ignore-daemonsets",
            "--delete-emptydir-data",
            "--force",
        ]);
        if children.is_empty() {
            log(format!("  kubectl ran (one per node, at once): {cmd:?}"));
        }
        children.push(
            cmd.stdout(out.try_clone()?)
                .stderr(out)
                .kill_on_drop(true)
                .spawn()
                .context("spawning kubectl drain")?,
        );
    }
    let children = Arc::new(Mutex::new(children));
    let exited: Arc<Mutex<Vec<Option<std::process::ExitStatus>>>> =
        Arc::new(Mutex::new(vec![None; nodes.len()]));
    let drained = until_drained(&placement, nodes, start, || {
        let (exited, children) = (exited.clone(), children.clone());
        async move {
            let mut e = exited.lock().expect("exited");
            for (i, c) in children.lock().expect("children").iter_mut().enumerate() {
                if e[i].is_none() {
                    e[i] = c.try_wait()?;
                }
            }
            if let Some(bad) = e.iter().flatten().find(|s| !s.success()) {
                anyhow::bail!("a kubectl drain failed: {bad}");
            }
            Ok(e.iter().all(Option::is_some))
        }
    })
    .await?;
    let (cpu1, rss) = children_usage();
    measured(
        cluster,
        client,
        nodes,
        user,
        since,
        drained,
        (cpu1 - cpu0, rss),
    )
    .await
}
