//! Side-by-side benchmarks (issue 6): one workload, run on fresh control planes started the same
//! way, once with upstream kube-controller-manager running only the controllers under test (a
//! process of its own, the rest of the cluster's controllers in the unmeasured main one) and once
//! with Pilothouse running them: both at once where both are bound by their client budget
//! ([`side_by_side`]), else one after the other, alternating the order across pairs.
//!
//! Measured per run, from outside both controllers: time to converge (first object created → last
//! object seen in its final state, by polling the API every 100 ms), API requests of the process
//! under test by verb (the API server's audit log, attributed by user name), its CPU seconds
//! during the workload and its peak RSS (`/proc/<pid>`), and a digest of the final state, which
//! must be equal on both sides.

use crate::cluster::{Cluster, ClusterOptions};
use crate::jobs::{self, Jobs};
use crate::{audit, k8s, unique, wait};
use anyhow::{Context, Result, bail, ensure};
use kube::Client;
use serde_json::json;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;
use tokio::time::Instant;

mod drain;
mod endpointslices;
mod nodes;
mod statefulsets;

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Side {
    Upstream,
    Pilothouse,
}

impl Side {
    pub fn name(self) -> &'static str {
        match self {
            Side::Upstream => "upstream",
            Side::Pilothouse => "pilothouse",
        }
    }
}

/// A workload and its size. `scale` multiplies object counts (1.0 = the sizes).
#[derive(Clone, Debug)]
pub struct Workload {
    pub name: &'static str,
    pub scale: f64,
}

pub const WORKLOADS: &[&str] = &[
    "job-burst",
    "job-failures",
    "cronjob-minutely",
    "node-outage",
    "idle-scale",
    "sts-rollout",
    "sts-scale",
    "es-rollout",
    "es-rollout-adaptive",
    "es-restart",
    "es-flap",
    "es-flap-1s",
    "es-flap-adaptive",
    "es-flap-adaptive-vs-0s",
    "node-drain",
];

/// The kube-controller-manager controllers a workload exercises: both sides run exactly these.
fn controllers_of(workload: &str) -> Vec<&'static str> {
    match workload {
        "cronjob-minutely" => vec!["cronjob-controller", "job-controller"],
        "node-outage" => vec!["node-lifecycle-controller", "taint-eviction-controller"],
        "sts-rollout" | "sts-scale" => vec!["statefulset-controller"],
        // Nothing under test is a kube-controller-manager controller (kubectl drain against
        // Pilothouse's node-maintenance-controller): its own keeps running everything the drain
        // needs (node-lifecycle, disruption, deployment, replicaset); only the unused
        // taint-eviction controller is off, as `--replace` needs one name.
        "node-drain" => vec!["taint-eviction-controller"],
        w if w.starts_with("es-") => vec!["endpointslice-controller"],
        // Every built controller that kube-controller-manager also has, on both sides (what
        // each caches is the point: pods above all).
        "idle-scale" => vec![
            "job-controller",
            "cronjob-controller",
            "statefulset-controller",
            "endpointslice-controller",
            "endpointslice-mirroring-controller",
            "node-lifecycle-controller",
            "taint-eviction-controller",
        ],
        _ => vec!["job-controller"],
    }
}

/// Flags one side gets beyond the common ones, per workload: where a workload compares settings
/// that are not the defaults (or not the same on both sides).
pub fn extra_args(workload: &str, side: Side) -> Vec<String> {
    const PERIOD: &str = "--endpointslice-updates-batch-period";
    match (workload, side) {
        ("es-flap-1s", _) | ("es-flap-adaptive", Side::Upstream) => vec![format!("{PERIOD}=1s")],
        // es-rollout-adaptive: each side's default, upstream 0 s against Pilothouse's adaptive.
        (
            "es-flap-adaptive" | "es-flap-adaptive-vs-0s" | "es-rollout-adaptive",
            Side::Pilothouse,
        ) => vec![format!("{PERIOD}=adaptive")],
        ("es-flap-adaptive-vs-0s", Side::Upstream) => vec![format!("{PERIOD}=0s")],
        // Equal settings: upstream's default 0 s on both sides (Pilothouse's own default,
        // adaptive, is measured by the variants above).
        ("es-flap" | "es-rollout" | "es-restart", Side::Pilothouse) => vec![format!("{PERIOD}=0s")],
        // Readable /metrics on kube-controller-manager's secure port without credentials (a
        // serving option only), to see when its first pass over the Services ends and how many
        // syncs a rollout took.
        ("es-restart" | "es-rollout" | "es-rollout-adaptive", Side::Upstream) => {
            vec!["--authorization-always-allow-paths=/healthz,/readyz,/livez,/metrics".into()]
        }
        _ => vec![],
    }
}

/// Whether a pair's two runs go side by side (at the same time, each on a control plane of its
/// own) rather than one after the other. Only where both sides are bound by their client budget:
/// the Job and CronJob workloads at upstream's 20/30, whose length is their object writes / 20 qps
/// and which use a fraction of the machine, so running them together halves the wall clock without
/// taking CPU from either. At 200/400 the API server is CPU-bound, and the node workloads measure
/// sub-second latencies or an idle CPU baseline: those keep alternating order. So do the
/// EndpointSlice workloads: es-rollout and es-flap measure sub-second pod → slice latencies (a
/// second plane on 2 cores would add to both), and es-restart's pair shares one plane.
pub fn side_by_side(w: &Workload, p: Profile) -> bool {
    p.qps <= 20
        && matches!(
            w.name,
            "job-burst" | "job-failures" | "cronjob-minutely" | "sts-rollout" | "sts-scale"
        )
}

/// Client rate limits given to both sides alike.
#[derive(Clone, Copy, Debug)]
pub struct Profile {
    pub qps: u32,
    pub burst: u32,
}

#[derive(Clone, Debug, Default)]
pub struct RunResult {
    pub converge_seconds: f64,
    pub requests: BTreeMap<String, u64>,
    pub cpu_seconds: f64,
    pub peak_rss_mib: f64,
    /// (seconds since the first create, objects converged so far).
    pub series: Vec<(f64, usize)>,
    /// Final state: per object, a digest line.
    pub state: BTreeMap<String, String>,
    /// Workload-specific measurements (name → value), reported as extra table rows.
    pub extra: BTreeMap<String, f64>,
}

/// What the workload body measured.
struct Outcome {
    converge_seconds: f64,
    series: Vec<(f64, usize)>,
    state: BTreeMap<String, String>,
    extra: BTreeMap<String, f64>,
    /// When the first object was created (requests are counted from here).
    since: k8s_openapi::jiff::Timestamp,
    /// CPU seconds of the process under test over the part that counts, when that is not the
    /// whole workload (idle-scale measures its idle window only).
    cpu_seconds: Option<f64>,
}

impl RunResult {
    pub fn writes(&self) -> u64 {
        self.requests
            .iter()
            .filter(|(v, _)| {
                let verb = v.split(' ').next().unwrap_or_default();
                !matches!(verb, "get" | "list" | "watch")
            })
            .map(|(_, n)| n)
            .sum()
    }
    /// Writes to anything but events: the controllers' own work.
    pub fn object_writes(&self) -> u64 {
        self.writes()
            - self
                .requests
                .iter()
                .filter(|(v, _)| v.ends_with(" events"))
                .map(|(_, n)| n)
                .sum::<u64>()
    }
    pub fn total_requests(&self) -> u64 {
        self.requests.values().sum()
    }
}

fn scaled(n: usize, scale: f64) -> usize {
    ((n as f64 * scale).round() as usize).max(1)
}

/// The Jobs of a workload: (name, spec, template).
fn jobs_of(w: &Workload) -> Result<Vec<k8s_openapi::api::batch::v1::Job>> {
    let mut out = Vec::new();
    match w.name {
        "job-burst" => {
            for i in 0..scaled(500, w.scale) {
                out.push(jobs::job(
                    &format!("burst-{i}"),
                    json!({}),
                    jobs::template(Some(0), "1s"),
                )?);
            }
            let completions = scaled(1000, w.scale);
            let parallelism = scaled(100, w.scale).min(completions);
            out.push(jobs::job(
                "burst-indexed",
                json!({"completionMode": "Indexed", "completions": completions, "parallelism": parallelism}),
                jobs::template(Some(0), "1s"),
            )?);
        }
        "job-failures" => {
            // Mixed exit codes under one podFailurePolicy and backoffLimit 2: a third fail the
            // Job at once (42, FailJob), a third exhaust the backoff limit (1, Count, with 10 s
            // and 20 s of pod-failure backoff), a third succeed.
            for i in 0..scaled(200, w.scale) {
                let code = [42, 1, 0][i % 3];
                out.push(jobs::job(
                    &format!("fail-{i}"),
                    json!({"backoffLimit": 2, "podFailurePolicy": {"rules": [
                        {"action": "FailJob", "onExitCodes": {"operator": "In", "values": [42]}},
                        {"action": "Count", "onExitCodes": {"operator": "In", "values": [1]}}]}}),
                    jobs::template(Some(code), "1s"),
                )?);
            }
        }
        other => bail!("unknown workload {other:?} (known: {WORKLOADS:?})"),
    }
    Ok(out)
}

/// CPU seconds (user + system) of a process so far.
pub fn cpu_seconds(pid: u32) -> Result<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))?;
    // Fields after the parenthesised command name; utime and stime are fields 14 and 15.
    let rest = stat
        .rsplit_once(')')
        .map(|(_, r)| r)
        .context("malformed stat")?;
    let f: Vec<&str> = rest.split_whitespace().collect();
    let ticks: f64 = f[11].parse::<f64>()? + f[12].parse::<f64>()?;
    // SAFETY: sysconf has no memory-safety preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64;
    Ok(ticks / hz)
}

/// Peak resident set size (VmHWM) in MiB.
pub fn peak_rss_mib(pid: u32) -> Result<f64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    let kb: f64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.split_whitespace().next())
        .context("no VmHWM")?
        .parse()?;
    Ok(kb / 1024.0)
}

/// A client certificate for a user of its own (system:masters), so the audit log attributes
/// every request of the process under test to it.
fn user_kubeconfig(cluster: &Cluster, user: &str) -> Result<PathBuf> {
    let pki = cluster.dir.join("pki");
    let run = |args: &[&str]| -> Result<()> {
        let st = Command::new("openssl")
            .args(args)
            .current_dir(&pki)
            .stderr(Stdio::null())
            .status()?;
        ensure!(st.success(), "openssl {args:?} failed");
        Ok(())
    };
    let subj = format!("/O=system:masters/CN={user}");
    run(&[
        "req",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-subj",
        &subj,
        "-keyout",
        &format!("{user}.key"),
        "-out",
        &format!("{user}.csr"),
    ])?;
    run(&[
        "x509",
        "-req",
        "-in",
        &format!("{user}.csr"),
        "-CA",
        "ca.crt",
        "-CAkey",
        "ca.key",
        "-CAcreateserial",
        "-days",
        "2",
        "-extfile",
        "admin.ext",
        "-out",
        &format!("{user}.crt"),
    ])?;
    let text = std::fs::read_to_string(&cluster.kubeconfig)?;
    let text = text
        .replace("admin.crt", &format!("{user}.crt"))
        .replace("admin.key", &format!("{user}.key"));
    ensure!(
        text.contains(&format!("{user}.crt")),
        "the admin kubeconfig does not name pki/admin.crt"
    );
    let path = cluster.dir.join(format!("{user}.kubeconfig"));
    std::fs::write(&path, text)?;
    Ok(path)
}

/// The process under test on a fresh control plane.
struct UnderTest {
    child: Child,
    user: &'static str,
    command: String,
    /// Its /metrics (https for kube-controller-manager, http for Pilothouse).
    metrics_url: String,
    log: PathBuf,
}

impl Drop for UnderTest {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn start_under_test(
    side: Side,
    cluster: &Cluster,
    workload: &str,
    p: Profile,
) -> Result<UnderTest> {
    let controllers = controllers_of(workload);
    let user = match side {
        Side::Upstream => "bench-kcm",
        Side::Pilothouse => "bench-pilothouse",
    };
    let kc = user_kubeconfig(cluster, user)?;
    // A file per start: es-restart starts the same side twice on one plane.
    let log_path = cluster.dir.join(format!(
        "logs/{}.log",
        unique(&format!("{user}-{workload}"))
    ));
    let log = std::fs::File::create(&log_path)?;
    let port = cluster.reserve_port()?;
    let metrics_url = match side {
        Side::Upstream => format!("https://127.0.0.1:{port}/metrics"),
        Side::Pilothouse => format!("http://127.0.0.1:{port}/metrics"),
    };
    let mut cmd = match side {
        Side::Upstream => {
            let mut c = Command::new(cluster.bin_dir()?.join("kube-controller-manager"));
            c.arg(format!("--kubeconfig={}", kc.display()))
                .arg("--bind-address=127.0.0.1")
                .arg(format!("--secure-port={port}"))
                .arg("--leader-elect=false")
                .arg(format!("--controllers={}", controllers.join(",")));
            c
        }
        Side::Pilothouse => {
            let mut c = Command::new(release_binary()?);
            c.arg(format!("--kubeconfig={}", kc.display()))
                .arg(format!("--metrics-bind-address=127.0.0.1:{port}"))
                .arg("--secure-port=0")
                .arg("--leader-elect=false")
                .arg(format!("--controllers={}", controllers.join(",")));
            c
        }
    };
    cmd.arg(format!("--kube-api-qps={}", p.qps))
        .arg(format!("--kube-api-burst={}", p.burst))
        .args(extra_args(workload, side));
    let command = format!("{cmd:?}");
    let child = cmd
        .stdout(log.try_clone()?)
        .stderr(log)
        .spawn()
        .with_context(|| format!("spawning {command}"))?;
    Ok(UnderTest {
        child,
        user,
        command,
        metrics_url,
        log: log_path,
    })
}

static BINARY: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();

/// Runs Pilothouse from `path` instead (the smoke run uses the debug build).
pub fn use_binary(path: PathBuf) {
    let _ = BINARY.set(path);
}

/// [`use_binary`]'s, else `$PILOTHOUSE_BIN`, else the workspace's release build (benchmarks
/// measure optimised code).
fn release_binary() -> Result<PathBuf> {
    if let Some(p) = BINARY.get() {
        return Ok(p.clone());
    }
    if let Ok(p) = std::env::var("PILOTHOUSE_BIN") {
        return Ok(PathBuf::from(p));
    }
    let p = crate::repo_root().join("target/release/pilothouse");
    ensure!(
        p.exists(),
        "{} is missing: cargo build --release -p pilothouse",
        p.display()
    );
    Ok(p)
}

/// A fresh control plane for `w` (the controllers under test turned off in its own
/// kube-controller-manager) with the benchmark's namespace ready.
async fn fresh_cluster(w: &Workload, tag: &str) -> Result<(Cluster, Client)> {
    let name = unique(&format!("bench-{}-{tag}", w.name));
    let opts = ClusterOptions {
        replace: Some(controllers_of(w.name)),
        // The node workloads bring nodes of their own, whose Leases they control.
        nodes: if matches!(w.name, "node-outage" | "idle-scale") {
            0
        } else {
            3
        },
        ..Default::default()
    };
    // Blocking (a script): off the async workers, since two sides may start at once.
    let cluster = tokio::task::spawn_blocking(move || Cluster::up(&name, opts)).await??;
    let client = cluster.client().await?;
    let nss: kube::Api<k8s_openapi::api::core::v1::Namespace> = kube::Api::all(client.clone());
    nss.create(
        &Default::default(),
        &serde_json::from_value(json!({"metadata": {"name": NS}}))?,
    )
    .await?;
    k8s::wait_service_account(&client, NS).await?;
    Ok((cluster, client))
}

const NS: &str = "bench";

/// The measurements taken after the workload body: CPU (unless the body measured its own
/// window), peak RSS, and the requests the audit log attributes to the process under test.
async fn finish(cluster: &Cluster, under: &UnderTest, cpu0: f64, o: Outcome) -> Result<RunResult> {
    let pid = under.child.id();
    let cpu_seconds = match o.cpu_seconds {
        Some(c) => c,
        None => cpu_seconds(pid)? - cpu0,
    };
    let peak_rss_mib = peak_rss_mib(pid)?;
    // The audit log is written in batches: give it a moment.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let requests = requests_by_verb(&cluster.audit_log(), under.user, o.since)?;
    Ok(RunResult {
        converge_seconds: o.converge_seconds,
        requests,
        cpu_seconds,
        peak_rss_mib,
        series: o.series,
        state: o.state,
        extra: o.extra,
    })
}

/// Runs `w` once on a fresh control plane with `side` running the controllers under test.
pub async fn run_once(
    w: &Workload,
    side: Side,
    p: Profile,
    log: &mut (dyn FnMut(String) + Send),
) -> Result<RunResult> {
    let (cluster, client) = fresh_cluster(w, side.name()).await?;
    let under = start_under_test(side, &cluster, w.name, p)?;
    log(format!("  {} ran: {}", side.name(), under.command));
    let pid = under.child.id();
    // Let the process under test list and settle before the clock starts.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let cpu0 = cpu_seconds(pid)?;
    let o = match w.name {
        "cronjob-minutely" => cronjob_minutely(&client, NS, w).await?,
        "node-outage" => nodes::node_outage(&client, NS, w.scale).await?,
        "sts-rollout" => statefulsets::rollout(&client, NS, w.scale).await?,
        "sts-scale" => statefulsets::scale_up_and_down(&client, NS, w.scale).await?,
        "es-rollout" | "es-rollout-adaptive" => {
            endpointslices::rollout(&client, NS, w.scale, &under.metrics_url).await?
        }
        name if name.starts_with("es-flap") => {
            endpointslices::flap(&client, NS, w.scale, pid, log).await?
        }
        _ => job_workload(&client, NS, w).await?,
    };
    let r = finish(&cluster, &under, cpu0, o).await;
    drop(under);
    // Stopping a control plane blocks for seconds: off this task (see `side_by_side`).
    tokio::task::spawn_blocking(move || drop(cluster)).await?;
    r
}

/// `idle-scale`'s pair: one control plane, seeded once before either side starts; then each side
/// in `order` starts on it (its initial lists included in peak RSS), settles, is measured over the
/// idle window and is stopped. Both find the same objects, none of them changing.
async fn run_idle_pair(
    w: &Workload,
    order: [Side; 2],
    p: Profile,
    log: &mut (dyn FnMut(String) + Send),
) -> Result<Vec<(Side, RunResult)>> {
    let (cluster, client) = fresh_cluster(w, "pair").await?;
    let seeded = nodes::seed_idle(&client, NS, w.scale).await?;
    log(format!(
        "  seeded {} nodes and {} pods",
        seeded.nodes, seeded.pods
    ));
    let mut out = Vec::new();
    for side in order {
        let under = start_under_test(side, &cluster, w.name, p)?;
        log(format!("  {} ran: {}", side.name(), under.command));
        let o = nodes::idle_window(&client, NS, under.child.id(), &seeded).await?;
        out.push((side, finish(&cluster, &under, 0.0, o).await?));
    }
    Ok(out)
}

/// `job-burst` and `job-failures`: create every Job at once, wait for all to finish.
async fn job_workload(client: &Client, ns: &str, w: &Workload) -> Result<Outcome> {
    let j = Jobs::new(client.clone(), ns);
    let objects = jobs_of(w)?;
    let start = Instant::now();
    let since = k8s_openapi::jiff::Timestamp::now();
    for job in &objects {
        j.create(job).await?;
    }
    let series = converge(start, objects.len(), Duration::from_secs(1800), || {
        finished_count(client, ns)
    })
    .await?;
    let converge_seconds = start.elapsed().as_secs_f64();
    // The final state, once no tracking finalizer is left.
    wait::until(
        "no tracking finalizers left",
        Duration::from_secs(120),
        Duration::from_millis(500),
        || async {
            let pods = j.pods.list(&Default::default()).await?;
            Ok((!pods.items.iter().any(jobs::has_finalizer)).then_some(()))
        },
    )
    .await?;
    Ok(Outcome {
        converge_seconds,
        series,
        state: digest(client, ns).await?,
        extra: BTreeMap::new(),
        since,
        cpu_seconds: None,
    })
}

/// The `p`-quantile (0..=1) of `v`, nearest rank.
fn quantile(v: &[f64], p: f64) -> f64 {
    let mut v = v.to_vec();
    v.sort_by(|a, b| a.partial_cmp(b).unwrap_or(std::cmp::Ordering::Equal));
    if v.is_empty() {
        return f64::NAN;
    }
    let rank = ((p * v.len() as f64).ceil() as usize).clamp(1, v.len());
    v[rank - 1]
}

/// A Job as the benchmark's own watch saw it.
#[derive(Clone, Debug)]
struct SeenJob {
    /// The scheduled time (annotation), in Unix seconds.
    scheduled: i64,
    /// When the watch first delivered the Job.
    seen: k8s_openapi::jiff::Timestamp,
    finished: bool,
}

/// `cronjob-minutely`: 300 CronJobs (× scale), each firing every minute for three minutes, with
/// short successful Jobs and the default history limits. The schedule names those three minutes
/// (`M1,M2,M3 H.. D.. * *` in UTC) so every run stops after them without racing a suspend.
/// Converged: every Job of the three slots seen finished by a watch, timed from the first slot
/// (the wait for it depends only on when the run began). Also measured: creation skew (the
/// watch's first sight of a Job minus its scheduled time).
async fn cronjob_minutely(client: &Client, ns: &str, w: &Workload) -> Result<Outcome> {
    use k8s_openapi::api::batch::v1::{CronJob, Job};
    use k8s_openapi::jiff::{Timestamp, tz::TimeZone};
    use kube::runtime::{WatchStreamExt, watcher};
    use std::sync::{Arc, Mutex};
    const SLOTS: i64 = 3;
    let n = scaled(300, w.scale);
    // The CronJobs are created within the minute before the first slot; with less than 15 s of
    // it left, wait for the next one.
    let second = Timestamp::now().as_second().rem_euclid(60);
    if second > 45 {
        tokio::time::sleep(Duration::from_secs((61 - second) as u64)).await;
    }
    let first = (Timestamp::now().as_second() / 60 + 1) * 60;
    let slots: Vec<i64> = (0..SLOTS).map(|i| first + 60 * i).collect();
    let field = |f: fn(&k8s_openapi::jiff::civil::DateTime) -> i8| -> Result<String> {
        let mut v = Vec::new();
        for s in &slots {
            let x = f(&Timestamp::from_second(*s)?
                .to_zoned(TimeZone::UTC)
                .datetime());
            if !v.contains(&x) {
                v.push(x);
            }
        }
        Ok(v.iter().map(i8::to_string).collect::<Vec<_>>().join(","))
    };
    let schedule = format!(
        "{} {} {} * *",
        field(|d| d.minute())?,
        field(|d| d.hour())?,
        field(|d| d.day())?
    );

    let seen: Arc<Mutex<BTreeMap<String, SeenJob>>> = Arc::default();
    let jobs_api: kube::Api<Job> = kube::Api::namespaced(client.clone(), ns);
    let watch = {
        let seen = seen.clone();
        let stream = watcher(jobs_api.clone(), watcher::Config::default()).applied_objects();
        tokio::spawn(async move {
            use futures::StreamExt;
            let mut stream = std::pin::pin!(stream);
            while let Some(Ok(job)) = stream.next().await {
                let now = Timestamp::now();
                let Some(scheduled) = job
                    .metadata
                    .annotations
                    .as_ref()
                    .and_then(|a| a.get("batch.kubernetes.io/cronjob-scheduled-timestamp"))
                    .and_then(|t| t.parse::<Timestamp>().ok())
                else {
                    continue;
                };
                let finished = jobs::finished(&job).is_some();
                let name = job.metadata.name.clone().unwrap_or_default();
                let mut seen = seen.lock().unwrap();
                let e = seen.entry(name).or_insert(SeenJob {
                    scheduled: scheduled.as_second(),
                    seen: now,
                    finished,
                });
                e.finished |= finished;
            }
        })
    };

    let cronjobs: kube::Api<CronJob> = kube::Api::namespaced(client.clone(), ns);
    let since = Timestamp::now();
    let start = Instant::now()
        + Duration::from_millis((first * 1000 - since.as_millisecond()).max(0) as u64);
    for i in 0..n {
        let cj: CronJob = serde_json::from_value(json!({
            "apiVersion": "batch/v1", "kind": "CronJob",
            "metadata": {"name": format!("minutely-{i}")},
            "spec": {
                "schedule": schedule, "timeZone": "UTC",
                "jobTemplate": {"spec": {"backoffLimit": 0, "template": jobs::template(Some(0), "1s")}}
            }
        }))?;
        cronjobs.create(&Default::default(), &cj).await?;
    }
    let deadline =
        Duration::from_secs((first - since.as_second()) as u64 + 60 * SLOTS as u64 + 900);
    let series = converge(start, n * SLOTS as usize, deadline, || {
        let done = seen
            .lock()
            .unwrap()
            .values()
            .filter(|j| j.finished && slots.contains(&j.scheduled))
            .count();
        async move { Ok(done) }
    })
    .await?;
    let converge_seconds = start.elapsed().as_secs_f64();
    watch.abort();
    let skew: Vec<f64> = seen
        .lock()
        .unwrap()
        .values()
        .map(|j| (j.seen.as_millisecond() - j.scheduled * 1000) as f64 / 1000.0)
        .collect();
    // The final state: nothing active, the last slot succeeded, history trimmed to 3.
    // Which slot (1-based) a time falls in.
    let slot_index = |t: &Timestamp| (t.as_second() - first) / 60 + 1;
    let slot_of = |t: Option<&k8s_openapi::apimachinery::pkg::apis::meta::v1::Time>| {
        t.map_or("-".to_string(), |t| format!("slot{}", slot_index(&t.0)))
    };
    let last_success = |t: Option<&k8s_openapi::apimachinery::pkg::apis::meta::v1::Time>| {
        t.map_or("-".to_string(), |t| {
            let slot = slot_index(&t.0).min(SLOTS);
            format!("after slot{slot}")
        })
    };
    let digest_cronjobs = || async {
        let jobs = jobs_api.list(&Default::default()).await?.items;
        let mut out = BTreeMap::new();
        for cj in cronjobs.list(&Default::default()).await?.items {
            let name = cj.metadata.name.clone().unwrap_or_default();
            let st = cj.status.unwrap_or_default();
            let mut kept: Vec<String> = jobs
                .iter()
                .filter(|j| {
                    j.metadata
                        .owner_references
                        .iter()
                        .flatten()
                        .any(|o| o.name == name && o.kind == "CronJob")
                })
                .map(|j| {
                    let t = j.metadata.annotations.as_ref().and_then(|a| {
                        a.get("batch.kubernetes.io/cronjob-scheduled-timestamp")
                            .and_then(|t| t.parse::<Timestamp>().ok())
                    });
                    format!(
                        "{}:{}",
                        t.map_or(0, |t| slot_index(&t)),
                        jobs::finished(j).map_or("-".into(), |c| c.type_.clone())
                    )
                })
                .collect();
            kept.sort();
            out.insert(
                name,
                format!(
                    "active={} lastSchedule={} lastSuccessful={} jobs={kept:?}",
                    st.active.map_or(0, |a| a.len()),
                    slot_of(st.last_schedule_time.as_ref()),
                    // A completion time, which falls in whichever minute the last Job
                    // finished: only whether it follows the last slot is state.
                    last_success(st.last_successful_time.as_ref()),
                ),
            );
        }
        anyhow::Ok(out)
    };
    let settled = format!(
        "active=0 lastSchedule=slot{SLOTS} lastSuccessful=after slot{SLOTS} jobs=[\"{}:Complete\", \"{}:Complete\", \"{}:Complete\"]",
        SLOTS - 2,
        SLOTS - 1,
        SLOTS
    );
    let settle = wait::until(
        "CronJobs settled (nothing active, history trimmed)",
        Duration::from_secs(180),
        Duration::from_secs(1),
        || async {
            let d = digest_cronjobs().await?;
            Ok(d.values().all(|v| *v == settled).then_some(d))
        },
    )
    .await;
    // Unsettled is still a state: the comparison between the two sides reports it.
    let state = match settle {
        Ok(d) => d,
        Err(_) => digest_cronjobs().await?,
    };
    let extra = BTreeMap::from([
        ("creation skew p50 (s)".to_string(), quantile(&skew, 0.5)),
        ("creation skew p99 (s)".to_string(), quantile(&skew, 0.99)),
        ("creation skew max (s)".to_string(), quantile(&skew, 1.0)),
    ]);
    Ok(Outcome {
        converge_seconds,
        series,
        state,
        extra,
        since,
        cpu_seconds: None,
    })
}

/// Polls `count` every 100 ms until it reaches `total` (failing after `timeout`); returns the
/// (seconds since `start`, count) series, a point at each change.
async fn converge<F, Fut>(
    start: Instant,
    total: usize,
    timeout: Duration,
    mut count: F,
) -> Result<Vec<(f64, usize)>>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<usize>>,
{
    let mut series = vec![(0.0, 0)];
    loop {
        let done = count().await?;
        if series.last().is_some_and(|(_, last)| *last != done) {
            series.push((start.elapsed().as_secs_f64(), done));
        }
        if done == total {
            return Ok(series);
        }
        ensure!(
            start.elapsed() < timeout,
            "{done}/{total} converged after {timeout:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

async fn finished_count(client: &Client, ns: &str) -> Result<usize> {
    let api: kube::Api<k8s_openapi::api::batch::v1::Job> =
        kube::Api::namespaced(client.clone(), ns);
    Ok(api
        .list(&Default::default())
        .await?
        .items
        .iter()
        .filter(|j| jobs::finished(j).is_some())
        .count())
}

async fn digest(client: &Client, ns: &str) -> Result<BTreeMap<String, String>> {
    let api: kube::Api<k8s_openapi::api::batch::v1::Job> =
        kube::Api::namespaced(client.clone(), ns);
    let mut out = BTreeMap::new();
    for j in api.list(&Default::default()).await?.items {
        let c = jobs::finished(&j).cloned().unwrap_or_default();
        let (a, r, t, s, f) = jobs::counts(&j);
        out.insert(
            j.metadata.name.clone().unwrap_or_default(),
            format!(
                "{}/{} active={a} ready={r} terminating={t} succeeded={s} failed={f}",
                c.type_,
                c.reason.unwrap_or_default()
            ),
        );
    }
    Ok(out)
}

/// Requests by verb from `user` received since `since` (each request once: its completion, or a
/// watch's start).
fn requests_by_verb(
    log: &Path,
    user: &str,
    since: k8s_openapi::jiff::Timestamp,
) -> Result<BTreeMap<String, u64>> {
    let mut out = BTreeMap::new();
    for e in audit::read(log)? {
        let counted = (e.stage == "ResponseComplete" && e.verb != "watch")
            || (e.stage == "ResponseStarted" && e.verb == "watch");
        if counted && e.user.username == user && e.received().is_some_and(|t| t >= since) {
            // Events apart: how many a recorder writes (or drops) is a policy of its own.
            let events = e
                .object_ref
                .as_ref()
                .is_some_and(|o| o.resource == "events");
            let key = if events {
                format!("{} events", e.verb)
            } else {
                e.verb.clone()
            };
            *out.entry(key).or_default() += 1;
        }
    }
    Ok(out)
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap_or(std::cmp::Ordering::Equal));
    match v.len() {
        0 => f64::NAN,
        n if n % 2 == 1 => v[n / 2],
        n => (v[n / 2 - 1] + v[n / 2]) / 2.0,
    }
}

/// Runs `pairs` pairs (A B, B A, …) and returns every run, in order.
pub async fn run_pairs(
    w: &Workload,
    p: Profile,
    pairs: usize,
    log: &mut (dyn FnMut(String) + Send),
) -> Result<Vec<(Side, RunResult)>> {
    let mut runs = Vec::new();
    for i in 0..pairs {
        let order = if i % 2 == 0 {
            [Side::Upstream, Side::Pilothouse]
        } else {
            [Side::Pilothouse, Side::Upstream]
        };
        let report = |r: &RunResult| {
            format!(
                "  converged in {:.1}s, {} requests ({} writes), {:.2} CPU-s, peak RSS {:.1} MiB",
                r.converge_seconds,
                r.total_requests(),
                r.writes(),
                r.cpu_seconds,
                r.peak_rss_mib
            )
        };
        if side_by_side(w, p) {
            log(format!(
                "{} pair {}/{pairs}: upstream and pilothouse side by side",
                w.name,
                i + 1
            ));
            // Both on this task (the bodies are not `Send`); every blocking step in them (a
            // cluster's start and stop) runs on the blocking pool, so neither stalls the other.
            let (mut up_lines, mut ph_lines) = (Vec::new(), Vec::new());
            let (up, ph) = futures::future::join(
                run_once(w, Side::Upstream, p, &mut |l| up_lines.push(l)),
                run_once(w, Side::Pilothouse, p, &mut |l| ph_lines.push(l)),
            )
            .await;
            for (side, lines, r) in [
                (Side::Upstream, up_lines, up),
                (Side::Pilothouse, ph_lines, ph),
            ] {
                lines.into_iter().for_each(&mut *log);
                let r = r.with_context(|| format!("{} {}", w.name, side.name()))?;
                log(format!("  {}:{}", side.name(), report(&r)));
                runs.push((side, r));
            }
            continue;
        }
        if matches!(w.name, "idle-scale" | "es-restart" | "node-drain") {
            log(format!(
                "{} pair {}/{pairs}: {} then {}",
                w.name,
                i + 1,
                order[0].name(),
                order[1].name()
            ));
            let pair = if w.name == "es-restart" {
                endpointslices::restart_pair(w, order, p, log).await
            } else if w.name == "node-drain" {
                drain::run_pair(w, order, p, log).await
            } else {
                run_idle_pair(w, order, p, log).await
            }
            .with_context(|| format!("{} pair {}", w.name, i + 1))?;
            for (side, r) in pair {
                log(format!("  {}:{}", side.name(), report(&r)));
                runs.push((side, r));
            }
            continue;
        }
        for side in order {
            log(format!(
                "{} pair {}/{pairs}: {}",
                w.name,
                i + 1,
                side.name()
            ));
            let r = run_once(w, side, p, log)
                .await
                .with_context(|| format!("{} {}", w.name, side.name()))?;
            log(report(&r));
            runs.push((side, r));
        }
    }
    // Correctness: every run ended in the same state.
    if let Some((_, first)) = runs.first() {
        for (side, r) in &runs {
            if r.state != first.state {
                let diff: Vec<String> = r
                    .state
                    .iter()
                    .filter(|(k, v)| first.state.get(*k) != Some(*v))
                    .map(|(k, v)| format!("{k}: {v} vs {:?}", first.state.get(k)))
                    .take(5)
                    .collect();
                bail!(
                    "{}: the {} run ended in another state: {diff:?}",
                    w.name,
                    side.name()
                );
            }
        }
    }
    Ok(runs)
}

/// The Markdown table: medians per side and the median of per-pair ratios.
pub fn table(w: &Workload, p: Profile, runs: &[(Side, RunResult)]) -> String {
    let of = |s: Side| runs.iter().filter(move |(x, _)| *x == s).map(|(_, r)| r);
    let pairs: Vec<(&RunResult, &RunResult)> =
        of(Side::Upstream).zip(of(Side::Pilothouse)).collect();
    let mut out = format!(
        "### {} (scale {}, qps {}/burst {}, {} pair(s), {})\n\n| metric | upstream | Pilothouse | ratio (Pilothouse / upstream, median of pairs) |\n|---|---|---|---|\n",
        w.name,
        w.scale,
        p.qps,
        p.burst,
        pairs.len(),
        if side_by_side(w, p) {
            "both sides at once"
        } else {
            "order alternating"
        }
    );
    let (up_args, ph_args) = (
        extra_args(w.name, Side::Upstream),
        extra_args(w.name, Side::Pilothouse),
    );
    if !up_args.is_empty() || !ph_args.is_empty() {
        let show = |a: Vec<String>| {
            if a.is_empty() {
                "defaults".to_string()
            } else {
                format!("`{}`", a.join(" "))
            }
        };
        out = out.replacen(
            "\n\n|",
            &format!(
                "\n\nFlags beyond the common ones: upstream {}; Pilothouse {}.\n\n|",
                show(up_args),
                show(ph_args)
            ),
            1,
        );
    }
    type Metric = (&'static str, fn(&RunResult) -> f64);
    let metrics: [Metric; 6] = [
        ("time to converge (s)", |r| r.converge_seconds),
        ("API requests", |r| r.total_requests() as f64),
        ("API writes", |r| r.writes() as f64),
        ("API writes other than events", |r| r.object_writes() as f64),
        ("CPU seconds", |r| r.cpu_seconds),
        ("peak RSS (MiB)", |r| r.peak_rss_mib),
    ];
    for (name, f) in metrics {
        let up = median(of(Side::Upstream).map(f).collect());
        let ph = median(of(Side::Pilothouse).map(f).collect());
        let ratio = median(pairs.iter().map(|(u, o)| f(o) / f(u)).collect());
        out.push_str(&format!("| {name} | {up:.2} | {ph:.2} | {ratio:.2} |\n"));
    }
    let extras: std::collections::BTreeSet<&String> =
        runs.iter().flat_map(|(_, r)| r.extra.keys()).collect();
    for name in extras {
        let get = |r: &RunResult| r.extra.get(name).copied().unwrap_or(f64::NAN);
        let up = median(of(Side::Upstream).map(get).collect());
        let ph = median(of(Side::Pilothouse).map(get).collect());
        let ratio = median(pairs.iter().map(|(u, o)| get(o) / get(u)).collect());
        out.push_str(&format!("| {name} | {up:.2} | {ph:.2} | {ratio:.2} |\n"));
    }
    let verbs: std::collections::BTreeSet<&String> =
        runs.iter().flat_map(|(_, r)| r.requests.keys()).collect();
    for v in verbs {
        let up = median(
            of(Side::Upstream)
                .map(|r| *r.requests.get(v).unwrap_or(&0) as f64)
                .collect(),
        );
        let ph = median(
            of(Side::Pilothouse)
                .map(|r| *r.requests.get(v).unwrap_or(&0) as f64)
                .collect(),
        );
        out.push_str(&format!(
            "| requests: {v} | {up:.0} | {ph:.0} | {} |\n",
            if up > 0.0 {
                format!("{:.2}", ph / up)
            } else {
                "-".into()
            }
        ));
    }
    out
}

/// An SVG plot of objects converged over time, one line per run.
pub fn plot(path: &Path, w: &Workload, runs: &[(Side, RunResult)]) -> Result<()> {
    use plotters::prelude::*;
    let max_t = runs
        .iter()
        .map(|(_, r)| r.converge_seconds)
        .fold(1.0, f64::max);
    let max_n = runs
        .iter()
        .map(|(_, r)| r.series.last().map_or(0, |s| s.1))
        .max()
        .unwrap_or(1)
        .max(1);
    let root = SVGBackend::new(path, (800, 450)).into_drawing_area();
    root.fill(&WHITE)?;
    let mut chart = ChartBuilder::on(&root)
        .caption(
            format!("{}: objects converged over time", w.name),
            ("sans-serif", 20),
        )
        .margin(10)
        .x_label_area_size(35)
        .y_label_area_size(50)
        .build_cartesian_2d(0f64..max_t * 1.05, 0usize..max_n + max_n / 20 + 1)?;
    chart
        .configure_mesh()
        .x_desc("seconds since the first create")
        .y_desc("objects in their final state")
        .draw()?;
    for (i, (side, r)) in runs.iter().enumerate() {
        let color = match side {
            Side::Upstream => RED,
            Side::Pilothouse => BLUE,
        };
        let mut pts: Vec<(f64, usize)> = Vec::new();
        for w2 in r.series.windows(2) {
            pts.push(w2[0]);
            pts.push((w2[1].0, w2[0].1));
        }
        pts.extend(r.series.last().copied());
        chart
            .draw_series(LineSeries::new(pts, color.stroke_width(2)))?
            .label(format!("{} (run {})", side.name(), i + 1))
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], color));
    }
    chart
        .configure_series_labels()
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .draw()?;
    root.present()?;
    Ok(())
}
