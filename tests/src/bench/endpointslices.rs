//! The EndpointSlice workloads (spec §6 "Scale": EX1, EX2, EX3). Both sides run only
//! `endpointslice-controller`; the plane's main kube-controller-manager (unmeasured) runs the
//! rest, Deployments and ReplicaSets included; the plane's three kwok nodes run the pods.
//!
//! `es-rollout` (EX1): one Deployment of 5,000 replicas (× scale) behind one Service,
//! RollingUpdate 25 %/25 %. Once every replica is Ready and shown ready in the slices, the
//! template changes; converged when the slices list exactly the new ReplicaSet's pods, all ready.
//!
//! `es-restart` (EX2): 10,000 Services (× scale) of 5 pods each on one plane, their slices
//! written once by the first side of the pair; then each side starts on that plane in turn (a
//! restart with nothing to change) and is measured over a fixed window after its caches sync.
//!
//! `es-flap` (EX3): 500 pods (× scale) of one Service flip readiness every 2 s (the annotation
//! `pilothouse.test/not-ready`, which the kwok stages turn into Ready=False and back), spread
//! evenly over each period, for a fixed window; then all are Ready. Variants differ only in
//! `--endpointslice-updates-batch-period` ([`super::extra_args`]).
//!
//! Latencies come from the benchmark's own watches on pods and EndpointSlices: when a pod's Ready
//! change was first seen, against when a slice first showed that endpoint in the same state.
//! Both watches are this process's, so they share its clock and its lag.

use super::{
    Outcome, Profile, RunResult, Side, UnderTest, Workload, converge, cpu_seconds, finish,
    fresh_cluster, quantile, scaled, start_under_test,
};
use anyhow::{Context, Result, bail, ensure};
use futures::{StreamExt, TryStreamExt, stream};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{Pod, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::jiff::Timestamp;
use kube::Client;
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
use kube::runtime::{WatchStreamExt, watcher};
use serde_json::{Value, json};
use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::time::Instant;

const TIMEOUT: Duration = Duration::from_secs(1800);
const NOT_READY: &str = "pilothouse.test/not-ready";
const SERVICE_NAME: &str = "kubernetes.io/service-name";
/// es-flap's flip period per pod.
const PERIOD: Duration = Duration::from_secs(2);
/// es-restart's pods per Service.
const PODS_PER_SERVICE: usize = 5;

/// The measured window of es-flap and es-restart: a minute, or 4 s (one flip each way) at the
/// smoke test's tiny scales, which check the harness, not the numbers.
fn window(scale: f64) -> Duration {
    if scale < 0.02 {
        Duration::from_secs(4)
    } else {
        Duration::from_secs(60)
    }
}

/// A Service selecting `app: <name>`, port 80 → 8080 (numeric: no port lookup in the pods).
fn service(name: &str) -> Result<Service> {
    Ok(serde_json::from_value(json!({
        "metadata": {"name": name},
        "spec": {
            "selector": {"app": name},
            "ports": [{"name": "http", "port": 80, "targetPort": 8080, "protocol": "TCP"}]
        }
    }))?)
}

fn pod_spec(image: &str) -> Value {
    json!({
        "terminationGracePeriodSeconds": 1,
        "tolerations": [{"key": "kwok.x-k8s.io/node", "operator": "Exists", "effect": "NoSchedule"}],
        "containers": [{"name": "c", "image": image, "ports": [{"name": "http", "containerPort": 8080}]}]
    })
}

/// A pod of `app` bound to one of the plane's kwok nodes (no scheduler in the way).
fn pod(name: &str, app: &str, i: usize) -> Result<Pod> {
    let mut spec = pod_spec("nginx:1");
    spec["nodeName"] = json!(format!("kwok-node-{}", i % 3));
    Ok(serde_json::from_value(json!({
        "metadata": {"name": name, "labels": {"app": app}},
        "spec": spec
    }))?)
}

fn is_ready(p: &Pod) -> bool {
    p.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

/// A slice's endpoints: (pod name, ready).
fn listed(s: &EndpointSlice) -> Vec<(String, bool)> {
    s.endpoints
        .iter()
        .flatten()
        .filter_map(|e| {
            let pod = e.target_ref.as_ref()?.name.clone()?;
            let ready = e.conditions.as_ref().and_then(|c| c.ready) == Some(true);
            Some((pod, ready))
        })
        .collect()
}

#[derive(Default)]
struct PodView {
    /// Ready as the pod watch saw it: the first state, then each change.
    ready: Vec<(Instant, bool)>,
    hash: String,
    /// Exists and is not being deleted.
    live: bool,
}

/// What the watches have seen.
#[derive(Default)]
struct View {
    pods: HashMap<String, PodView>,
    /// Slice name → its endpoints (pod, ready).
    slices: HashMap<String, Vec<(String, bool)>>,
    /// Pod → the slices listing it now, with its `ready` in each.
    listed: HashMap<String, HashMap<String, bool>>,
    /// Pod → its readiness as the slices show it (ready in any of them; not listed = not
    /// ready), each change as first seen.
    shown: HashMap<String, Vec<(Instant, bool)>>,
    /// Watches past their initial list.
    synced: usize,
}

impl View {
    fn pod(&mut self, p: &Pod, live: bool, now: Instant) {
        let name = p.metadata.name.clone().unwrap_or_default();
        let v = self.pods.entry(name).or_default();
        let ready = live && is_ready(p);
        if v.ready.last().is_none_or(|(_, r)| *r != ready) {
            v.ready.push((now, ready));
        }
        v.hash = p
            .metadata
            .labels
            .as_ref()
            .and_then(|l| l.get("pod-template-hash").cloned())
            .unwrap_or_default();
        v.live = live && p.metadata.deletion_timestamp.is_none();
    }

    fn slice(&mut self, name: String, endpoints: Option<Vec<(String, bool)>>, now: Instant) {
        let old = match &endpoints {
            Some(e) => self.slices.insert(name.clone(), e.clone()),
            None => self.slices.remove(&name),
        };
        let mut affected: Vec<String> = Vec::new();
        for (pod, _) in old.iter().flatten() {
            if let Some(m) = self.listed.get_mut(pod) {
                m.remove(&name);
            }
            affected.push(pod.clone());
        }
        for (pod, ready) in endpoints.iter().flatten() {
            self.listed
                .entry(pod.clone())
                .or_default()
                .insert(name.clone(), *ready);
            affected.push(pod.clone());
        }
        for pod in affected {
            let ready = self
                .listed
                .get(&pod)
                .is_some_and(|m| m.values().any(|r| *r));
            if self.listed.get(&pod).is_some_and(|m| m.is_empty()) {
                self.listed.remove(&pod);
            }
            let h = self.shown.entry(pod).or_default();
            if h.last().map_or(ready, |(_, r)| *r != ready) {
                h.push((now, ready));
            }
        }
    }

    fn shown_ready(&self, pod: &str) -> bool {
        self.shown
            .get(pod)
            .and_then(|h| h.last())
            .is_some_and(|(_, r)| *r)
    }

    /// How many of the live pods (of another template than `not_hash`, if given) are shown
    /// ready, `n` only once exactly those `n` pods are listed, all ready and nothing else is.
    fn converged(&self, n: usize, not_hash: Option<&str>) -> usize {
        let target: Vec<&String> = self
            .pods
            .iter()
            .filter(|(_, p)| p.live && not_hash.is_none_or(|h| !p.hash.is_empty() && p.hash != h))
            .map(|(name, _)| name)
            .collect();
        let ready = target.iter().filter(|p| self.shown_ready(p)).count();
        let exact = ready == n
            && target.len() == n
            && self.listed.len() == n
            && target.iter().all(|p| self.listed.contains_key(*p));
        if exact { n } else { ready.min(n - 1) }
    }
}

/// Watches the namespace's pods and slices into `view` until aborted; returns once both have
/// listed, so nothing created afterwards is first seen in a list.
async fn watch(client: &Client, ns: &str, view: &Arc<Mutex<View>>) -> Result<Watches> {
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
    let slices: Api<EndpointSlice> = Api::namespaced(client.clone(), ns);
    let v = Arc::clone(view);
    let pod_task = tokio::spawn(async move {
        let mut events =
            std::pin::pin!(watcher(pods, watcher::Config::default()).default_backoff());
        while let Some(e) = events.next().await {
            let now = Instant::now();
            let mut v = v.lock().unwrap();
            match e {
                Ok(watcher::Event::Apply(p) | watcher::Event::InitApply(p)) => v.pod(&p, true, now),
                Ok(watcher::Event::Delete(p)) => v.pod(&p, false, now),
                Ok(watcher::Event::InitDone) => v.synced += 1,
                _ => {}
            }
        }
    });
    let v = Arc::clone(view);
    let slice_task = tokio::spawn(async move {
        let mut events =
            std::pin::pin!(watcher(slices, watcher::Config::default()).default_backoff());
        while let Some(e) = events.next().await {
            let now = Instant::now();
            let mut v = v.lock().unwrap();
            match e {
                Ok(watcher::Event::Apply(s) | watcher::Event::InitApply(s)) => v.slice(
                    s.metadata.name.clone().unwrap_or_default(),
                    Some(listed(&s)),
                    now,
                ),
                Ok(watcher::Event::Delete(s)) => {
                    v.slice(s.metadata.name.clone().unwrap_or_default(), None, now)
                }
                Ok(watcher::Event::InitDone) => v.synced += 1,
                _ => {}
            }
        }
    });
    let w = Watches(vec![pod_task, slice_task]);
    crate::wait::until(
        "pod and slice watches listed",
        Duration::from_secs(60),
        Duration::from_millis(50),
        || async { Ok((view.lock().unwrap().synced >= 2).then_some(())) },
    )
    .await?;
    Ok(w)
}

/// The watch tasks, stopped when dropped (an early error included).
struct Watches(Vec<tokio::task::JoinHandle<()>>);

impl Drop for Watches {
    fn drop(&mut self) {
        self.0.iter().for_each(|t| t.abort());
    }
}

fn seconds(d: Duration) -> f64 {
    d.as_secs_f64()
}

/// p50, p99 and max rows of `v` under `name`.
fn latency_rows(extra: &mut BTreeMap<String, f64>, name: &str, v: &[f64]) {
    for (q, label) in [(0.5, "p50"), (0.99, "p99"), (1.0, "max")] {
        extra.insert(format!("{name} {label} (s)"), quantile(v, q));
    }
}

/// `es-rollout` (EX1).
pub(super) async fn rollout(
    client: &Client,
    ns: &str,
    scale: f64,
    metrics_url: &str,
) -> Result<Outcome> {
    let n = scaled(5000, scale);
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), ns);
    let services: Api<Service> = Api::namespaced(client.clone(), ns);
    let view: Arc<Mutex<View>> = Arc::default();
    let watches = watch(client, ns, &view).await?;
    let pp = PostParams::default();
    let start = Instant::now();
    let since = Timestamp::now();
    services.create(&pp, &service("web")?).await?;
    let spec = pod_spec("nginx:1");
    let d: Deployment = serde_json::from_value(json!({
        "metadata": {"name": "web"},
        "spec": {
            "replicas": n,
            "selector": {"matchLabels": {"app": "web"}},
            "strategy": {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": "25%", "maxUnavailable": "25%"}},
            "template": {"metadata": {"labels": {"app": "web"}}, "spec": spec}
        }
    }))?;
    deployments.create(&pp, &d).await?;
    let count = |not_hash: Option<String>| {
        let c = view.lock().unwrap().converged(n, not_hash.as_deref());
        async move { Ok(c) }
    };
    let mut series = converge(start, n, TIMEOUT, || count(None)).await?;
    let created = seconds(start.elapsed());
    let (old_hash, slices_created) = {
        let v = view.lock().unwrap();
        let hash = v.pods.values().find(|p| p.live).map(|p| p.hash.clone());
        (hash.context("no live pod")?, v.slices.len())
    };

    let rollout_start = Instant::now();
    deployments
        .patch(
            "web",
            &PatchParams::default(),
            &Patch::Strategic(json!({"spec": {"template": {"spec": {"containers": [{"name": "c", "image": "nginx:2"}]}}}})),
        )
        .await?;
    // Plotted from n up: the second phase counts the new template's pods again.
    let phase2 = converge(start, n, TIMEOUT, || count(Some(old_hash.clone()))).await?;
    series.extend(phase2.into_iter().skip(1).map(|(t, c)| (t, n + c)));
    let rolled_out = seconds(rollout_start.elapsed());
    let converge_seconds = seconds(start.elapsed());
    drop(watches);
    // How many syncs the writes came from: at batch period 0 a sync writes what changed since
    // the last, so fewer, longer syncs coalesce more changes into each write.
    // One read for both series, so that they describe the same moment.
    let text = metrics_text(metrics_url).await;
    let synced = text.as_deref().and_then(syncs_by_result);
    // How long a sync takes (the work queue's processing time of a key, writes included), which
    // sets how many changes the next one finds waiting.
    let worked = text
        .as_deref()
        .and_then(|t| work_duration(t, "endpoint_slice"));

    let mut extra = BTreeMap::from([
        ("created and shown ready (s)".to_string(), created),
        ("rolled out and shown (s)".to_string(), rolled_out),
        ("slices once created".to_string(), slices_created as f64),
    ]);
    for result in ["success", "stale", "error"] {
        let n = synced
            .as_ref()
            .map_or(f64::NAN, |by| by.get(result).copied().unwrap_or(0.0));
        extra.insert(format!("syncs: {result}"), n);
    }
    let (sum, count) = worked.unwrap_or((f64::NAN, f64::NAN));
    extra.insert("queue work, total (s)".to_string(), sum);
    extra.insert(
        "queue work per key processed, mean (ms)".to_string(),
        sum / count * 1000.0,
    );
    {
        let v = view.lock().unwrap();
        extra.insert("slices at rest".to_string(), v.slices.len() as f64);
        let (mut latencies, mut never) = (Vec::new(), 0);
        for (name, p) in &v.pods {
            let Some((t, _)) = p.ready.iter().find(|(_, r)| *r) else {
                continue;
            };
            match v.shown.get(name).and_then(|h| h.iter().find(|(_, r)| *r)) {
                // Two watches: a slice event can arrive a hair before its pod's; that is 0.
                Some((s, _)) => latencies.push(seconds(s.saturating_duration_since(*t))),
                None => never += 1,
            }
        }
        latency_rows(&mut extra, "pod Ready → shown ready", &latencies);
        extra.insert("Ready pods never shown ready".to_string(), never as f64);
    }

    Ok(Outcome {
        converge_seconds,
        series,
        state: rollout_state(&deployments, &view, n).await?,
        extra,
        since,
        cpu_seconds: None,
    })
}

/// The Deployment's settled status (written by the unmeasured main controller manager, so
/// waited for) and what the slices list.
async fn rollout_state(
    deployments: &Api<Deployment>,
    view: &Arc<Mutex<View>>,
    n: usize,
) -> Result<BTreeMap<String, String>> {
    let status = || async {
        let d = deployments.get("web").await?;
        let st = serde_json::to_value(&d.status)?;
        anyhow::Ok(format!(
            "replicas={} updated={} ready={} available={}",
            st["replicas"], st["updatedReplicas"], st["readyReplicas"], st["availableReplicas"]
        ))
    };
    let want = format!("replicas={n} updated={n} ready={n} available={n}");
    let settled = crate::wait::until(
        "Deployment status settled",
        Duration::from_secs(60),
        Duration::from_millis(500),
        || async {
            let s: String = status().await?;
            Ok((s == want).then_some(s))
        },
    )
    .await;
    let deployment = match settled {
        Ok(s) => s,
        Err(_) => status().await?,
    };
    let v = view.lock().unwrap();
    let ready = v.listed.keys().filter(|p| v.shown_ready(p)).count();
    Ok(BTreeMap::from([
        ("deployment/web".to_string(), deployment),
        (
            "service/web".to_string(),
            format!("endpoints={} ready={ready}", v.listed.len()),
        ),
    ]))
}

/// Flip → shown latencies: for each Ready change of a pod at or after `from`, the first time the
/// slices showed that state — after the pod's previous change (allowing 250 ms for the two
/// watches' delivery order) and before its next change to the same state, which would claim it.
/// Returns the latencies and how many changes were never shown (superseded first).
fn flip_latencies(
    pod: &[(Instant, bool)],
    shown: &[(Instant, bool)],
    from: Instant,
) -> (Vec<f64>, usize) {
    let skew = Duration::from_millis(250);
    let (mut out, mut never) = (Vec::new(), 0);
    for (i, (t, state)) in pod.iter().enumerate() {
        if *t < from {
            continue;
        }
        let mut lower = t.checked_sub(skew).unwrap_or(*t);
        if i > 0 {
            lower = lower.max(pod[i - 1].0);
        }
        let upper = pod.get(i + 2).map(|(u, _)| *u);
        let hit = shown
            .iter()
            .find(|(s, r)| r == state && *s >= lower && upper.is_none_or(|u| *s < u));
        match hit {
            Some((s, _)) => out.push(seconds(s.saturating_duration_since(*t))),
            None => never += 1,
        }
    }
    (out, never)
}

/// `es-flap` and its variants (EX3).
pub(super) async fn flap(
    client: &Client,
    ns: &str,
    scale: f64,
    pid: u32,
    log: &mut (dyn FnMut(String) + Send),
) -> Result<Outcome> {
    let n = scaled(500, scale);
    let window = window(scale);
    // An even number of flips per pod, so every pod ends Ready.
    let flips = 2 * (window.as_millis() / (2 * PERIOD.as_millis())) as usize;
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
    let services: Api<Service> = Api::namespaced(client.clone(), ns);
    let view: Arc<Mutex<View>> = Arc::default();
    let watches = watch(client, ns, &view).await?;
    let pp = PostParams::default();
    services.create(&pp, &service("flap")?).await?;
    let names: Vec<String> = (0..n).map(|i| format!("flap-{i:04}")).collect();
    stream::iter(names.iter().enumerate())
        .map(|(i, name)| {
            let pods = pods.clone();
            async move {
                let p = pod(name, "flap", i)?;
                anyhow::Ok(pods.create(&PostParams::default(), &p).await?)
            }
        })
        .buffer_unordered(32)
        .try_for_each(|_| async { Ok(()) })
        .await?;
    let count = || {
        let c = view.lock().unwrap().converged(n, None);
        async move { Ok(c) }
    };
    let setup = Instant::now();
    converge(setup, n, Duration::from_secs(600), count).await?;
    log(format!(
        "  {n} pods shown ready in {:.1}s; flipping for {window:?}",
        seconds(setup.elapsed())
    ));
    // The first syncs' trailing writes land before the count starts.
    tokio::time::sleep(Duration::from_secs(3)).await;

    let since = Timestamp::now();
    let cpu0 = cpu_seconds(pid)?;
    let start = Instant::now();
    // Shown-ready endpoints over time, for the plot, until told to stop.
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let sampler = {
        let (v, stop) = (Arc::clone(&view), Arc::clone(&stop));
        tokio::spawn(async move {
            let mut series = Vec::new();
            let mut tick = tokio::time::interval(Duration::from_millis(250));
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                tick.tick().await;
                let ready = {
                    let v = v.lock().unwrap();
                    v.listed.keys().filter(|p| v.shown_ready(p)).count()
                };
                series.push((seconds(start.elapsed()), ready));
            }
            series
        })
    };
    // Each pod's latest patch: the next one waits for it, so that a patch delayed on its way
    // (at 250 a second some were) never lands after its successor (at scale 1.0 that left 138
    // of 500 pods annotated not-ready for good, and the run waiting for a convergence that
    // could not come).
    let mut last: Vec<Option<tokio::task::JoinHandle<Result<()>>>> =
        names.iter().map(|_| None).collect();
    let mut late = Duration::ZERO;
    for k in 0..flips {
        for (i, name) in names.iter().enumerate() {
            let at = start + PERIOD * k as u32 + PERIOD.mul_f64(i as f64 / n as f64);
            tokio::time::sleep_until(at).await;
            late = late.max(Instant::now().saturating_duration_since(at));
            let value = if k % 2 == 0 {
                json!("true")
            } else {
                Value::Null
            };
            let (pods, name) = (pods.clone(), name.clone());
            let before = last[i].take();
            last[i] = Some(tokio::spawn(async move {
                if let Some(before) = before {
                    before.await??;
                }
                let patch = json!({"metadata": {"annotations": {NOT_READY: value}}});
                pods.patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
                    .await?;
                Ok(())
            }));
        }
    }
    for handle in last.into_iter().flatten() {
        handle.await??;
    }
    let last_flip = Instant::now();
    if late > Duration::from_millis(500) {
        log(format!(
            "  warning: flip patches ran up to {:.2}s behind schedule",
            seconds(late)
        ));
    }
    converge(start, n, Duration::from_secs(600), count).await?;
    let converge_seconds = seconds(start.elapsed());
    let settled = seconds(last_flip.elapsed());
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let mut series = sampler.await?;
    series.push((converge_seconds, n));
    // Trailing writes (a batch period's) count alike on both sides.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let cpu = cpu_seconds(pid)? - cpu0;
    drop(watches);

    let v = view.lock().unwrap();
    let (mut latencies, mut never, mut changes) = (Vec::new(), 0, 0);
    for name in &names {
        let history = &v.pods[name].ready;
        let shown = v.shown.get(name).map_or(&[][..], |h| &h[..]);
        let (l, nv) = flip_latencies(history, shown, start);
        changes += history.iter().filter(|(t, _)| *t >= start).count();
        latencies.extend(l);
        never += nv;
    }
    let mut extra = BTreeMap::from([
        ("flips seen (pod Ready changes)".to_string(), changes as f64),
        ("flips never shown (superseded)".to_string(), never as f64),
        (
            "all shown ready after the last flip (s)".to_string(),
            settled,
        ),
        (
            "flip patches behind schedule, max (s)".to_string(),
            seconds(late),
        ),
        ("slices at rest".to_string(), v.slices.len() as f64),
    ]);
    latency_rows(&mut extra, "flip → shown", &latencies);
    let ready = v.listed.keys().filter(|p| v.shown_ready(p)).count();
    let state = BTreeMap::from([(
        "service/flap".to_string(),
        format!("endpoints={} ready={ready}", v.listed.len()),
    )]);
    Ok(Outcome {
        converge_seconds,
        series,
        state,
        extra,
        since,
        cpu_seconds: Some(cpu),
    })
}

/// `es-restart`'s pair (EX2): one plane, seeded once; `order[0]` writes the slices (not
/// measured); then each side in `order` starts on it and is measured over the window.
pub(super) async fn restart_pair(
    w: &Workload,
    order: [Side; 2],
    p: Profile,
    log: &mut (dyn FnMut(String) + Send),
) -> Result<Vec<(Side, RunResult)>> {
    let (cluster, client) = fresh_cluster(w, "pair").await?;
    let ns = super::NS;
    let n = scaled(10_000, w.scale);
    let seeding = Instant::now();
    let services: Api<Service> = Api::namespaced(client.clone(), ns);
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
    stream::iter(0..n)
        .map(|i| {
            let services = services.clone();
            async move {
                let s = service(&format!("svc-{i:05}"))?;
                anyhow::Ok(services.create(&PostParams::default(), &s).await?)
            }
        })
        .buffer_unordered(32)
        .try_for_each(|_| async { Ok(()) })
        .await?;
    stream::iter(0..n * PODS_PER_SERVICE)
        .map(|j| {
            let pods = pods.clone();
            let app = format!("svc-{:05}", j / PODS_PER_SERVICE);
            let name = format!("{app}-{}", j % PODS_PER_SERVICE);
            async move {
                let p = pod(&name, &app, j)?;
                anyhow::Ok(pods.create(&PostParams::default(), &p).await?)
            }
        })
        .buffer_unordered(32)
        .try_for_each(|_| async { Ok(()) })
        .await?;
    crate::wait::until(
        "every pod Ready",
        TIMEOUT,
        Duration::from_secs(2),
        || async {
            let ready = pods
                .list(&ListParams::default())
                .await?
                .items
                .iter()
                .filter(|p| is_ready(p))
                .count();
            Ok((ready == n * PODS_PER_SERVICE).then_some(()))
        },
    )
    .await?;
    log(format!(
        "  seeded {n} Services and {} Ready pods in {:.0}s",
        n * PODS_PER_SERVICE,
        seconds(seeding.elapsed())
    ));

    let slices: Api<EndpointSlice> = Api::namespaced(client.clone(), ns);
    {
        let first = start_under_test(order[0], &cluster, w.name, p)?;
        let t = Instant::now();
        crate::wait::until(
            "every Service's endpoints in its slices",
            TIMEOUT,
            Duration::from_secs(2),
            || async {
                let s = restart_state(&slices).await?;
                let full = format!("{PODS_PER_SERVICE} ready");
                let done = s.values().filter(|v| v.starts_with(&full)).count();
                Ok((done == n).then_some(()))
            },
        )
        .await?;
        log(format!(
            "  {} wrote the slices in {:.0}s (not measured)",
            order[0].name(),
            seconds(t.elapsed())
        ));
        // Its last writes land before it stops.
        tokio::time::sleep(Duration::from_secs(5)).await;
        drop(first);
    }

    let mut out = Vec::new();
    for side in order {
        let since = Timestamp::now();
        let under = start_under_test(side, &cluster, w.name, p)?;
        log(format!("  {} ran: {}", side.name(), under.command));
        let o = restart_window(&slices, &under, side, n, w.scale, since, log).await?;
        out.push((side, finish(&cluster, &under, 0.0, o).await?));
    }
    drop(client);
    tokio::task::spawn_blocking(move || drop(cluster)).await?;
    Ok(out)
}

/// The log line each side writes once its caches have synced.
fn synced_in_log(side: Side, text: &str) -> bool {
    match side {
        // client-go's WaitForNamedCacheSync, after the controller's start line.
        Side::Upstream => text
            .split_once("Starting endpoint slice controller")
            .is_some_and(|(_, after)| after.contains("Caches are synced")),
        // The manager starts controllers once every cache has synced.
        Side::Pilothouse => text.contains("starting controller"),
    }
}

/// `endpoint_slice_controller_syncs` (both sides; Pilothouse served it as `..._total` before
/// 92261b4, which older binaries still do) summed over results, or `None` if /metrics could not be read or has no such series.
async fn syncs(url: &str) -> Option<f64> {
    syncs_by_result(&metrics_text(url).await?).map(|by| by.values().sum())
}

/// One read of the /metrics at `url` (either side's), or `None` if curl could not run.
async fn metrics_text(url: &str) -> Option<String> {
    let out = tokio::process::Command::new("curl")
        .args(["-sk", "--max-time", "5", url])
        .output()
        .await
        .ok()?;
    Some(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// `endpoint_slice_controller_syncs` by its `result` label (success, stale, error) in a
/// /metrics `text`, or `None` if it has no such series.
fn syncs_by_result(text: &str) -> Option<BTreeMap<String, f64>> {
    let mut by = BTreeMap::new();
    for l in text.lines() {
        let Some(rest) = l.strip_prefix("endpoint_slice_controller_syncs") else {
            continue;
        };
        let rest = rest.strip_prefix("_total").unwrap_or(rest);
        if rest.starts_with('{') || rest.starts_with(' ') {
            let v = l.rsplit(' ').next().and_then(|v| v.parse::<f64>().ok())?;
            let result = rest
                .split_once("result=\"")
                .and_then(|(_, r)| r.split_once('"'))
                .map_or("", |(r, _)| r);
            *by.entry(result.to_string()).or_insert(0.0) += v;
        }
    }
    (!by.is_empty()).then_some(by)
}

/// `workqueue_work_duration_seconds` of the queue `name` in a /metrics `text`: (sum, count), or
/// `None` if it has no such series.
fn work_duration(text: &str, name: &str) -> Option<(f64, f64)> {
    let value = |suffix: &str| {
        let series = format!("workqueue_work_duration_seconds_{suffix}{{name=\"{name}\"}}");
        text.lines()
            .find_map(|l| l.strip_prefix(series.as_str()))
            .and_then(|v| v.trim().parse::<f64>().ok())
    };
    Some((value("sum")?, value("count")?))
}

/// One side's restart: wait for its caches, then the window. /metrics is read every 500 ms only
/// until the first pass over the Services is seen (or the window ends), the same on both sides.
async fn restart_window(
    slices: &Api<EndpointSlice>,
    under: &UnderTest,
    side: Side,
    n: usize,
    scale: f64,
    since: Timestamp,
    log: &mut (dyn FnMut(String) + Send),
) -> Result<Outcome> {
    let pid = under.child.id();
    let spawned = Instant::now();
    loop {
        let text = std::fs::read_to_string(&under.log).unwrap_or_default();
        if synced_in_log(side, &text) {
            break;
        }
        ensure!(
            spawned.elapsed() < Duration::from_secs(300),
            "{}: caches not synced after 300 s (log {})",
            side.name(),
            under.log.display()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let synced = Instant::now();
    let cpu_start = cpu_seconds(pid)?;
    let window = window(scale);
    let mut pass = f64::NAN;
    let mut last = None;
    while synced.elapsed() < window {
        last = syncs(&under.metrics_url).await;
        if last.is_some_and(|s| s >= n as f64) {
            pass = seconds(synced.elapsed());
            break;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    if pass.is_nan() {
        log(format!(
            "  {}: first pass over {n} Services not seen within the window (syncs: {last:?})",
            side.name()
        ));
    }
    tokio::time::sleep_until(synced + window).await;
    let cpu = cpu_seconds(pid)? - cpu_start;
    let state = restart_state(slices).await?;
    let objects = state.len();
    Ok(Outcome {
        // Nothing converges: the window is reported as it is.
        converge_seconds: seconds(window),
        series: vec![(0.0, objects), (seconds(window), objects)],
        state,
        extra: BTreeMap::from([
            ("Services".to_string(), n as f64),
            (
                "caches synced after start (s)".to_string(),
                seconds(synced - spawned),
            ),
            ("CPU seconds, start to caches synced".to_string(), cpu_start),
            ("every Service synced after caches (s)".to_string(), pass),
        ]),
        since,
        cpu_seconds: Some(cpu),
    })
}

/// Per Service: its slices' endpoints (pod, ready, serving, terminating, node, zone, addresses)
/// in a canonical order, led by the ready count.
async fn restart_state(slices: &Api<EndpointSlice>) -> Result<BTreeMap<String, String>> {
    let mut by_service: BTreeMap<String, (usize, Vec<String>)> = BTreeMap::new();
    for s in slices.list(&ListParams::default()).await?.items {
        let Some(svc) = s.metadata.labels.as_ref().and_then(|l| l.get(SERVICE_NAME)) else {
            bail!("slice {:?} has no {SERVICE_NAME}", s.metadata.name);
        };
        let e = by_service.entry(svc.clone()).or_default();
        e.0 += 1;
        for ep in s.endpoints.iter().flatten() {
            let c = ep.conditions.clone().unwrap_or_default();
            e.1.push(format!(
                "{}:{:?}/{:?}/{:?}@{}/{}{:?}",
                ep.target_ref
                    .as_ref()
                    .and_then(|t| t.name.clone())
                    .unwrap_or_default(),
                c.ready,
                c.serving,
                c.terminating,
                ep.node_name.clone().unwrap_or_default(),
                ep.zone.clone().unwrap_or_default(),
                ep.addresses
            ));
        }
    }
    Ok(by_service
        .into_iter()
        .map(|(svc, (count, mut eps))| {
            eps.sort();
            let ready = eps.iter().filter(|e| e.contains(":Some(true)/")).count();
            (svc, format!("{ready} ready in {count} slice(s): {eps:?}"))
        })
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Both sides' exposition: Pilothouse's (OpenMetrics from prometheus-client) and
    /// kube-controller-manager's (Prometheus text, Go float forms), with a queue whose name
    /// extends the one asked for.
    #[test]
    fn reads_syncs_and_queue_work_from_either_side() {
        let pilothouse = "endpoint_slice_controller_syncs{result=\"success\"} 8664\n\
            endpoint_slice_controller_syncs{result=\"stale\"} 1772\n\
            workqueue_work_duration_seconds_sum{name=\"endpoint_slice\"} 686.74\n\
            workqueue_work_duration_seconds_count{name=\"endpoint_slice\"} 10436\n";
        let upstream = "# TYPE endpoint_slice_controller_syncs counter\n\
            endpoint_slice_controller_syncs{result=\"success\"} 5619\n\
            workqueue_work_duration_seconds_sum{name=\"endpoint_slice_topology\"} 1\n\
            workqueue_work_duration_seconds_count{name=\"endpoint_slice_topology\"} 2\n\
            workqueue_work_duration_seconds_sum{name=\"endpoint_slice\"} 718.57\n\
            workqueue_work_duration_seconds_count{name=\"endpoint_slice\"} 6.382e+03\n";
        let by = syncs_by_result(pilothouse).unwrap();
        assert_eq!(by.get("success"), Some(&8664.0));
        assert_eq!(by.get("stale"), Some(&1772.0));
        assert_eq!(
            work_duration(pilothouse, "endpoint_slice"),
            Some((686.74, 10436.0))
        );
        assert_eq!(
            syncs_by_result(upstream).unwrap().get("success"),
            Some(&5619.0)
        );
        assert_eq!(
            work_duration(upstream, "endpoint_slice"),
            Some((718.57, 6382.0))
        );
        assert_eq!(work_duration("", "endpoint_slice"), None);
        assert_eq!(syncs_by_result("workqueue_depth{name=\"x\"} 0"), None);
    }
}
