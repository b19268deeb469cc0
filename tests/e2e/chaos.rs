//! Issue 17 §2: faults under a mixed workload. Three Pilothouse replicas (every controller; each
//! behind a TCP proxy of its own, restarted like a Deployment's pods when they exit) run
//! NonIndexed, Indexed and failing Jobs (one of 20 parallel pods created a second before the
//! leader is cut, so that the cut lands in a burst of writes), a minutely CronJob, a pod waiting
//! out its toleration of a NoExecute taint, a node outage, a StatefulSet scaled and rolled out
//! behind a Service, a selectorless Service whose Endpoints change, and a NodeMaintenance
//! draining a node behind PDBs and ended, while a fixed schedule injects faults: the leader
//! SIGKILLed three times, the leader cut from the API server, kube-apiserver restarted twice and
//! etcd once. The checks are exact: every Job's counts, completed indexes, condition and pod
//! count; no pod left with the tracking finalizer; every CronJob minute run once; the tolerating
//! pod deleted, not before its toleration ran out; the failed node tainted once (one
//! `timeAdded` through every fault), the healthy ones never, its pods evicted after their
//! toleration and the others not; the StatefulSet's ordinals once each on the update revision;
//! each Service's one slice holding exactly its endpoints; the drained node's pods each evicted,
//! no other pod, the status counting each once, the node cordoned while drained and restored
//! after; no replica panicked.

use anyhow::{Context, Result, ensure};
use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::batch::v1::CronJob;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Endpoints, Node, Pod, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::jiff::Timestamp;
use kube::Client;
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
use pilothouse_tests::cluster::ClusterOptions;
use pilothouse_tests::harness::{cluster, log_dir, trial};
use pilothouse_tests::heartbeat::Heartbeats;
use pilothouse_tests::jobs::{self, Jobs};
use pilothouse_tests::proxy::Proxy;
use pilothouse_tests::{Pilothouse, audit, k8s, unique, wait};
use serde_json::{Value, json};
use std::collections::BTreeSet;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::time::Instant;

/// kube-controller-manager's names of the controllers the replicas run (kcm has them off).
const REPLACED: [&str; 7] = [
    "job-controller",
    "cronjob-controller",
    "taint-eviction-controller",
    "node-lifecycle-controller",
    "statefulset-controller",
    "endpointslice-controller",
    "endpointslice-mirroring-controller",
];
const UNREACHABLE: &str = "node.kubernetes.io/unreachable";
/// Keeps the scheduler off the outage's nodes (no kubelet runs there).
const NO_KUBELET: &str = "pilothouse.test/no-kubelet";
const OUTAGE_ZONE: &str = "zone-outage";
/// The outage's pods that tolerate the unreachable taint for a while, and for how long: one is
/// evicted before the faults begin, the other's clock runs through them (each new leader starts
/// it again when it first sees the pod, as kcm does).
const EVICTED: [(&str, i64); 2] = [("evict-0", 5), ("evict-1", 40)];
const MANAGED_BY: &str = "endpointslice-controller.k8s.io";
const MIRRORED_BY: &str = "endpointslicemirroring-controller.k8s.io";
const TAINT: &str = "pilothouse.test/chaos";
/// kube-apiserver's termination grace on a restart (it would drain watches for 60 s).
const APISERVER_GRACE: Duration = Duration::from_secs(10);
/// How long the tolerating pod may stay on the tainted node.
const TOLERATION_SECONDS: i64 = 20;

/// Replicas kept running as a Deployment's would be: one that exits is started again (with a
/// new identity and log) on the same proxy.
struct Replicas {
    lease: String,
    args: Vec<String>,
    slots: Vec<Slot>,
    procs: Arc<Mutex<Vec<Pilothouse>>>,
    /// Every process started, for the final log checks.
    logs: Arc<Mutex<Vec<PathBuf>>>,
    restarts: Arc<Mutex<u32>>,
}

struct Slot {
    proxy: Proxy,
    kubeconfig: PathBuf,
}

impl Replicas {
    async fn start(n: usize) -> Result<Replicas> {
        let lease = unique("ph-chaos");
        let mut args = vec![
            format!("--leader-elect-resource-name={lease}"),
            "--leader-elect-resource-namespace=kube-system".to_string(),
            // kcm's defaults are 15 s / 10 s / 2 s; shorter, so that a run of faults takes
            // minutes (a replica exits when it cannot renew for 6 s, as kcm does at 10 s).
            "--leader-elect-lease-duration=8s".to_string(),
            "--leader-elect-renew-deadline=6s".to_string(),
            "--leader-elect-retry-period=1s".to_string(),
            // node-maintenance-controller is Pilothouse's own (kcm has no such controller).
            format!(
                "--controllers={},node-maintenance-controller",
                REPLACED.join(",")
            ),
            // A kubelet's 40 s Lease (kcm's grace is 50 s); every node but the failed one renews
            // well within it between faults, and each new leader starts its nodes' clocks afresh.
            "--node-monitor-period=1s".to_string(),
            "--node-monitor-grace-period=40s".to_string(),
        ];
        args.push("--feature-gates=TaintTolerationComparisonOperators=true".to_string());
        let mut slots = Vec::new();
        for i in 0..n {
            let proxy = Proxy::start(cluster().apiserver_port()?).await?;
            let kubeconfig =
                cluster().kubeconfig_via(proxy.port, &unique(&format!("chaos-{i}")))?;
            slots.push(Slot { proxy, kubeconfig });
        }
        let r = Replicas {
            lease,
            args,
            slots,
            procs: Arc::default(),
            logs: Arc::default(),
            restarts: Arc::default(),
        };
        for i in 0..n {
            let p = r.spawn(i)?;
            r.procs.lock().expect("procs").push(p);
        }
        Ok(r)
    }

    fn spawn(&self, slot: usize) -> Result<Pilothouse> {
        let p = Pilothouse::spawn(
            &unique(&format!("chaos-{slot}")),
            &self.slots[slot].kubeconfig,
            &log_dir(),
            &self.args,
        )?;
        self.logs.lock().expect("logs").push(p.log.clone());
        Ok(p)
    }

    /// Starts again every replica that exited; returns how many.
    fn supervise(&self) -> Result<u32> {
        let mut procs = self.procs.lock().expect("procs");
        let mut n = 0;
        for slot in 0..procs.len() {
            if !procs[slot].running() {
                procs[slot] = self.spawn(slot)?;
                n += 1;
            }
        }
        *self.restarts.lock().expect("restarts") += n;
        Ok(n)
    }

    /// Runs `act` on the replica holding the Lease (found by the identity it logged), under the
    /// same lock as the lookup, so the supervisor cannot swap that slot in between.
    async fn with_leader<T>(
        &self,
        timeout: Duration,
        act: impl Fn(&mut Vec<Pilothouse>, usize) -> Result<T>,
    ) -> Result<T> {
        let leases: Api<Lease> = Api::namespaced(cluster().client().await?, "kube-system");
        let act = &act;
        wait::until(
            "a replica holding the Lease",
            timeout,
            Duration::from_millis(200),
            || async {
                self.supervise()?;
                let Some(id) = leases
                    .get_opt(&self.lease)
                    .await?
                    .and_then(|l| l.spec)
                    .and_then(|s| s.holder_identity)
                    .filter(|h| !h.is_empty())
                else {
                    return Ok(None);
                };
                let mut procs = self.procs.lock().expect("procs");
                match procs.iter().position(|p| p.log_text().contains(&id)) {
                    Some(slot) => act(&mut procs, slot).map(Some),
                    None => Ok(None),
                }
            },
        )
        .await
    }

    async fn wait_leader(&self) -> Result<usize> {
        self.with_leader(Duration::from_secs(60), |_, slot| Ok(slot))
            .await
    }

    /// SIGKILLs the leader; a fresh replica takes its slot at once (as a Deployment's would).
    async fn sigkill_leader(&self) -> Result<()> {
        let mut killed = self
            .with_leader(Duration::from_secs(60), |procs, slot| {
                let fresh = self.spawn(slot)?;
                let old = std::mem::replace(&mut procs[slot], fresh);
                old.sigkill()?;
                Ok(old)
            })
            .await?;
        *self.restarts.lock().expect("restarts") += 1;
        killed.wait_exit(Duration::from_secs(10)).await?;
        Ok(())
    }

    /// Cuts the leader from the API server until it exits (renew deadline), then heals.
    async fn partition_leader(&self) -> Result<Duration> {
        let t0 = Instant::now();
        let (slot, pid) = self
            .with_leader(Duration::from_secs(60), |procs, slot| {
                self.slots[slot].proxy.cut();
                Ok((slot, procs[slot].pid()))
            })
            .await?;
        // Exited: reaped here, or already replaced by the supervisor.
        let exited = wait::until(
            "the partitioned leader to exit",
            Duration::from_secs(20),
            Duration::from_millis(100),
            || async {
                let mut procs = self.procs.lock().expect("procs");
                let gone = procs[slot].pid() != pid || !procs[slot].running();
                Ok(gone.then(|| t0.elapsed()))
            },
        )
        .await;
        self.slots[slot].proxy.heal();
        exited
    }

    fn stop(&self) {
        for p in self.procs.lock().expect("procs").iter() {
            let _ = p.sigterm();
        }
    }
}

async fn mixed_workload_under_faults() -> Result<()> {
    let client = cluster().client().await?;
    let ns = cluster().namespace("chaos").await?;
    k8s::wait_service_account(&client, &ns).await?;
    let j = Jobs::new(client.clone(), &ns);
    let replicas = Arc::new(Replicas::start(3).await?);
    let first = replicas.wait_leader().await?;
    let log = replicas.procs.lock().expect("procs")[first].log.clone();
    wait::until(
        "the first leader to start its controllers",
        Duration::from_secs(60),
        Duration::from_millis(200),
        || async {
            Ok(std::fs::read_to_string(&log)?
                .contains("starting controller")
                .then_some(()))
        },
    )
    .await?;
    // The supervisor: a replica that exits is started again within half a second.
    let sup = {
        let r = Arc::clone(&replicas);
        tokio::spawn(async move {
            loop {
                let _ = r.supervise();
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
        })
    };

    // The workload. The maintenance shape first, while no other pod could land on its nodes
    // before they are tainted.
    let mut drain = maintenance::Drain::prepare().await?;
    // The node outage: out-a is tainted before the faults, so that its taint is carried through
    // all of them.
    let outage = Outage::start(&client, &ns).await?;
    let tainted = outage.fail_until_tainted().await?;
    println!("MEASURE chaos: out-a tainted at {tainted}, before the faults");
    serving::start(&client, &ns).await?;
    let victim_created =
        k8s::tolerating_pod_on_tainted_node(&client, &ns, "zone-chaos", TAINT, TOLERATION_SECONDS)
            .await?;
    let complete = [("plain", 12), ("indexed", 8), ("late", 6), ("burst", 20)];
    j.create(&jobs::job(
        "plain",
        json!({"completions": 12, "parallelism": 2}),
        jobs::template(Some(0), "6s"),
    )?)
    .await?;
    j.create(&jobs::job(
        "indexed",
        json!({"completions": 8, "parallelism": 2, "completionMode": "Indexed"}),
        jobs::template(Some(0), "6s"),
    )?)
    .await?;
    j.create(&jobs::job(
        "failing",
        json!({"completions": 1, "backoffLimit": 2}),
        jobs::template(Some(1), "2s"),
    )?)
    .await?;
    let cron: CronJob = serde_json::from_value(json!({
        "metadata": {"name": "minutely"},
        "spec": {
            "schedule": "* * * * *",
            "successfulJobsHistoryLimit": 100,
            "failedJobsHistoryLimit": 100,
            "jobTemplate": {"spec": {"template": jobs::template(Some(0), "1s")}}
        }
    }))?;
    let cron = Api::<CronJob>::namespaced(client.clone(), &ns)
        .create(&PostParams::default(), &cron)
        .await?;
    let cron_created = cron
        .metadata
        .creation_timestamp
        .context("CronJob without creationTimestamp")?
        .0;

    // The faults, on a fixed schedule (seconds after the workload started).
    let t0 = Instant::now();
    let at = |s: u64| tokio::time::sleep_until(t0 + Duration::from_secs(s));
    let note = |what: &str| {
        println!("MEASURE chaos: {:>5.1}s {what}", t0.elapsed().as_secs_f64());
    };
    at(6).await;
    replicas.sigkill_leader().await?;
    note("leader SIGKILLed");
    // The next leader begins the drain: it evicts web's pod and is held by batch's PDB
    // through the kill at 16 s, the cut and the first kube-apiserver restart.
    drain.begin().await?;
    note(&format!(
        "NodeMaintenance created: {} pods to drain behind PDBs",
        drain.targets()
    ));
    at(16).await;
    replicas.sigkill_leader().await?;
    note("leader SIGKILLed");
    // A burst of writes under way when the leader is cut: 20 pods at once, then their
    // tracking finalizers and the status. The cut comes once the first of them exists.
    at(25).await;
    j.create(&jobs::job(
        "burst",
        json!({"completions": 20, "parallelism": 20}),
        jobs::template(Some(0), "2s"),
    )?)
    .await?;
    wait::until(
        "the burst's first pod",
        Duration::from_secs(20),
        Duration::from_millis(50),
        || async { Ok((!j.pods_of("burst").await?.is_empty()).then_some(())) },
    )
    .await?;
    note("a Job of 20 parallel pods created, its first pod seen");
    let exited = replicas.partition_leader().await?;
    note(&format!(
        "leader cut from the API server; it exited {:.1}s later, then the link healed",
        exited.as_secs_f64()
    ));
    serving::scale(&client, &ns).await?;
    note("web scaled to 5");
    at(42).await;
    cluster().restart_kube_apiserver(APISERVER_GRACE).await?;
    note("kube-apiserver restarted (SIGTERM, SIGKILL after 10 s; back up)");
    // A second wave, so that Jobs are mid-flight through the later faults too.
    let late = jobs::job(
        "late",
        json!({"completions": 6, "parallelism": 2}),
        jobs::template(Some(0), "6s"),
    )?;
    wait::until(
        "the API server to take a Job",
        Duration::from_secs(30),
        Duration::from_millis(300),
        || async {
            match j.jobs.create(&PostParams::default(), &late).await {
                Ok(_) => Ok(Some(())),
                // An earlier try landed though its answer was lost.
                Err(kube::Error::Api(e)) if e.code == 409 => Ok(Some(())),
                Err(e) => Err(e.into()),
            }
        },
    )
    .await?;
    serving::roll(&client, &ns).await?;
    note("web's template changed");
    // The drain, held by batch's PDB since it began, goes on: its PDB-spaced evictions (about
    // a second each) meet the next SIGKILL.
    at(59).await;
    drain.relax().await?;
    note("batch's PDB allows a disruption: the drain goes on");
    at(60).await;
    replicas.sigkill_leader().await?;
    note("leader SIGKILLed");
    // Ended once the leader after this kill reports it drained: its release of the node meets
    // the etcd restart.
    drain.end().await?;
    note("NodeMaintenance Drained, then deleted");
    at(70).await;
    cluster().restart_etcd().await?;
    note("etcd restarted (back up)");
    serving::grow_ext(&client, &ns).await?;
    note("ext's Endpoints grew to 4 addresses");
    at(84).await;
    cluster().restart_kube_apiserver(APISERVER_GRACE).await?;
    note("kube-apiserver restarted (SIGTERM, SIGKILL after 10 s; back up)");

    // Exact results.
    for (name, completions) in complete {
        j.expect_complete(name, completions, Duration::from_secs(180))
            .await?;
    }
    let indexed = j.get("indexed").await?;
    let done = indexed
        .status
        .as_ref()
        .and_then(|s| s.completed_indexes.clone());
    ensure!(done.as_deref() == Some("0-7"), "completedIndexes {done:?}");
    let failing = j.wait_finished("failing", Duration::from_secs(120)).await?;
    let (active, _, _, succeeded, failed) = jobs::counts(&failing);
    let reason = jobs::condition(&failing, "Failed").and_then(|c| c.reason.clone());
    ensure!(
        (active, succeeded, failed) == (0, 0, 3)
            && reason.as_deref() == Some("BackoffLimitExceeded"),
        "failing: active {active} succeeded {succeeded} failed {failed}, Failed reason {reason:?}"
    );
    let failing_pods = j.pods_of("failing").await?.len();
    ensure!(
        failing_pods == 3,
        "failing: {failing_pods} pods for 3 tries"
    );
    j.wait_no_finalizers("failing", Duration::from_secs(30))
        .await?;

    // The tolerating pod: deleted (its deletion is checked in the audit log below).
    wait::until(
        "the tolerating pod deleted",
        Duration::from_secs(90),
        Duration::from_millis(200),
        || async {
            Ok(j.pods
                .get_opt("victim")
                .await?
                .is_none_or(|p| p.metadata.deletion_timestamp.is_some())
                .then_some(()))
        },
    )
    .await?;

    // Every CronJob minute from the first after its creation to the one before now: one Job.
    // The faults take about 100 s, which spans a whole minute only if the CronJob was created
    // early enough in its minute: otherwise wait for the first minute to be over, so that at
    // least one is checked (run 2 of the extended suite finished with none to check).
    let first_min = cron_created.as_second().div_euclid(60).saturating_add(1);
    let second_min_starts = first_min.saturating_add(1).saturating_mul(60);
    let wait = second_min_starts.saturating_sub(Timestamp::now().as_second());
    if wait > 0 {
        tokio::time::sleep(Duration::from_secs(wait.unsigned_abs())).await;
    }
    let now_min = Timestamp::now().as_second().div_euclid(60);
    let expected: Vec<i64> = (first_min..now_min).collect();
    let slots = wait::until(
        "a Job for every CronJob minute",
        Duration::from_secs(60),
        Duration::from_millis(500),
        || async {
            let slots = j.cron_minutes("minutely").await?;
            Ok(expected.iter().all(|m| slots.contains(m)).then_some(slots))
        },
    )
    .await?;
    ensure!(
        slots.iter().all(|m| *m >= first_min),
        "a CronJob Job for a minute before the CronJob existed: {slots:?} (first {first_min})"
    );
    ensure!(!expected.is_empty(), "the run spanned no CronJob minute");
    serving::check(&client, &ns).await?;
    outage.check(&client, &ns, tainted).await?;
    drain.wait_ended().await?;

    sup.abort();
    replicas.stop();
    // The victim was deleted by one request (a replica's taint-eviction controller), once, and
    // not before its toleration ran out (each new leader's taint-eviction controller starts the
    // clock when it first sees the pod, as kcm's does, so later is right).
    tokio::time::sleep(Duration::from_secs(2)).await;
    let events = audit::read(&cluster().audit_log())?;
    let deletes: Vec<(Option<Timestamp>, Option<u16>)> = events
        .iter()
        .filter(|e| {
            e.stage == "ResponseComplete"
                && e.verb == "delete"
                && e.object_ref
                    .as_ref()
                    .is_some_and(|o| o.namespace == ns && o.name == "victim")
                && e.user_agent.contains("pilothouse")
        })
        .map(|e| {
            (
                e.received(),
                e.response_status.as_ref().and_then(|s| s.code),
            )
        })
        .collect();
    // A leader that took over after the deletion deletes the still-terminating pod again when
    // its own clock runs out (upstream's controller does not skip terminating pods); only the
    // first deletion evicts.
    let Some((Some(deleted), _)) = deletes.iter().find(|(_, code)| *code == Some(200)) else {
        anyhow::bail!("no deletion of the tolerating pod by Pilothouse: {deletes:?}");
    };
    let after = deleted.duration_since(victim_created).as_secs_f64();
    ensure!(
        after >= TOLERATION_SECONDS as f64 - 1.0,
        "the tolerating pod was deleted {after:.1}s after creation, before its {TOLERATION_SECONDS}s"
    );
    // The outage's pods: deleted by Pilothouse, not before their toleration of the taint ran
    // out; the pods that tolerate it for ever, or sit on a healthy node, never.
    let deletions = |name: &str| -> Vec<Option<Timestamp>> {
        events
            .iter()
            .filter(|e| {
                e.stage == "ResponseComplete"
                    && e.verb == "delete"
                    && e.object_ref.as_ref().is_some_and(|o| {
                        o.namespace == ns && o.name == name && o.resource == "pods"
                    })
                    && e.user_agent.contains("pilothouse")
                    && e.response_status.as_ref().and_then(|s| s.code) == Some(200)
            })
            .map(|e| e.received())
            .collect()
    };
    let mut evicted_after = Vec::new();
    for (name, seconds) in EVICTED {
        let first = deletions(name).into_iter().flatten().min();
        let Some(first) = first else {
            anyhow::bail!("{name} was not deleted by Pilothouse");
        };
        let after = tainted.duration_until(first).as_secs_f64();
        ensure!(
            after >= seconds as f64 - 1.0,
            "{name} deleted {after:.1}s after out-a's taint, before its {seconds}s"
        );
        evicted_after.push(format!("{name} ({seconds}s) {after:.1}s"));
    }
    for name in ["keep", "stay"] {
        ensure!(deletions(name).is_empty(), "Pilothouse deleted {name}");
    }
    drain.check(&events).await?;

    // No replica panicked (a caught panic is logged and counted; none may happen here).
    let logs = replicas.logs.lock().expect("logs").clone();
    for log in &logs {
        let text = std::fs::read_to_string(log).unwrap_or_default();
        ensure!(
            !text.contains("panicked"),
            "{} logged a panic",
            log.display()
        );
    }
    let restarts = *replicas.restarts.lock().expect("restarts");
    println!(
        "MEASURE chaos: {} processes in all ({restarts} restarts); plain/indexed/late/burst complete with exact counts, failing failed 3/3, {} CronJob minutes each run once, tolerating pod deleted {after:.1}s after creation ({} DELETE requests)",
        logs.len(),
        expected.len(),
        deletes.len()
    );
    println!(
        "MEASURE chaos: out-a's taint kept through every fault; its pods deleted after the taint: {}; the healthy nodes never tainted; web rolled out to {} ready on one revision, its slice and ext's mirrored slice exact",
        evicted_after.join(", "),
        serving::REPLICAS
    );
    // kube-scheduler exits on purpose when a kube-apiserver restart leaves its cache
    // inconsistent; the plane restarts it as a kubelet would. Said, not hidden.
    let scheduler_log = cluster()
        .audit_log()
        .parent()
        .map(|d| d.join("logs/kube-scheduler.log"))
        .and_then(|p| std::fs::read_to_string(p).ok())
        .unwrap_or_default();
    println!(
        "MEASURE chaos: kube-scheduler restarted {} times",
        scheduler_log.matches("kube-scheduler exited").count()
    );
    k8s::release_pods(&client, &ns).await?;
    Ok(())
}

/// A node outage in a zone of its own: three nodes outside kwok whose Leases the test renews;
/// `out-a` stops renewing. Its pods: two tolerating the unreachable taint for
/// a while ([`EVICTED`]), one tolerating every NoExecute taint (kept); `out-b` holds a
/// pod that must stay. A watcher records the nodes' taints every 250 ms through every fault.
struct Outage {
    client: Client,
    hb: Heartbeats,
    nodes: [String; 3],
    log: Arc<Mutex<TaintLog>>,
    watcher: tokio::task::JoinHandle<()>,
}

#[derive(Clone, Debug, Default)]
struct TaintLog {
    /// Every distinct `timeAdded` of the failed node's unreachable NoExecute taint.
    added: BTreeSet<Timestamp>,
    /// Reads that found that taint missing after it had been seen.
    lost: u32,
    /// Unreachable or not-ready taints seen on the healthy nodes.
    healthy_tainted: BTreeSet<String>,
}

impl Outage {
    async fn start(client: &Client, ns: &str) -> Result<Outage> {
        let hb = Heartbeats::start(client.clone());
        let nodes = ["out-a", "out-b", "out-c"].map(String::from);
        for n in &nodes {
            hb.add_node(n, OUTAGE_ZONE).await?;
            // No kubelet runs there: the scheduler keeps the workload's pods off.
            k8s::modify_taints(client, n, |ts| {
                ts.push(k8s::taint(NO_KUBELET, "", "NoSchedule"))
            })
            .await?;
        }
        let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
        let pp = PostParams::default();
        for (name, seconds) in EVICTED {
            let brief = json!([{"key": UNREACHABLE, "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": seconds}]);
            pods.create(&pp, &k8s::pod_on_node(name, &nodes[0], brief)?)
                .await?;
        }
        let forever = json!([{"operator": "Exists", "effect": "NoExecute"}]);
        pods.create(&pp, &k8s::pod_on_node("keep", &nodes[0], forever)?)
            .await?;
        pods.create(&pp, &k8s::pod_on_node("stay", &nodes[1], json!([]))?)
            .await?;
        // The API server gives a new node `not-ready:NoSchedule` (TaintNodesByCondition); the
        // node-lifecycle controller takes it off once it sees Ready. Watched from then on.
        let api = Api::<Node>::all(client.clone());
        for n in &nodes {
            wait::until(
                &format!("{n} untainted by the node-lifecycle controller"),
                Duration::from_secs(30),
                Duration::from_millis(200),
                || async {
                    let taints = k8s::taints(&api.get(n).await?);
                    Ok((!taints
                        .iter()
                        .any(|t| t.key.starts_with("node.kubernetes.io/")))
                    .then_some(()))
                },
            )
            .await?;
        }
        let log: Arc<Mutex<TaintLog>> = Arc::default();
        let watcher = {
            let (log, nodes, api) = (
                Arc::clone(&log),
                nodes.clone(),
                Api::<Node>::all(client.clone()),
            );
            tokio::spawn(async move {
                loop {
                    for (i, n) in nodes.iter().enumerate() {
                        // The API server is down at times: a failed read records nothing.
                        let Ok(node) = api.get(n).await else { continue };
                        let taints = k8s::taints(&node);
                        let mut log = log.lock().expect("taint log");
                        if i == 0 {
                            let added = taints
                                .iter()
                                .find(|t| t.key == UNREACHABLE && t.effect == "NoExecute")
                                .map(|t| t.time_added.as_ref().map(|a| a.0));
                            match added {
                                Some(Some(at)) => {
                                    log.added.insert(at);
                                }
                                Some(None) => {
                                    log.added.insert(Timestamp::MIN);
                                }
                                None if !log.added.is_empty() => log.lost += 1,
                                None => {}
                            }
                        } else {
                            for t in taints.iter().filter(|t| {
                                t.key == UNREACHABLE || t.key == "node.kubernetes.io/not-ready"
                            }) {
                                log.healthy_tainted
                                    .insert(format!("{n}: {}:{}", t.key, t.effect));
                            }
                        }
                    }
                    tokio::time::sleep(Duration::from_millis(250)).await;
                }
            })
        };
        Ok(Outage {
            client: client.clone(),
            hb,
            nodes,
            log,
            watcher,
        })
    }

    /// `out-a`'s kubelet stops; returns its NoExecute taint's `timeAdded` once the node-lifecycle
    /// controller has added it (the grace, 40 s, after the last renewal).
    async fn fail_until_tainted(&self) -> Result<Timestamp> {
        self.hb.fail(&self.nodes[..1]).await;
        let api = Api::<Node>::all(self.client.clone());
        wait::until(
            "out-a's unreachable NoExecute taint",
            Duration::from_secs(90),
            Duration::from_millis(250),
            || async {
                Ok(k8s::taints(&api.get(&self.nodes[0]).await?)
                    .into_iter()
                    .find(|t| t.key == UNREACHABLE && t.effect == "NoExecute")
                    .and_then(|t| t.time_added)
                    .map(|t| t.0))
            },
        )
        .await
    }

    /// Exact: `out-a` Unknown, its NoExecute taint the one added before the faults (one
    /// `timeAdded` through all of them, never missing), the healthy nodes never tainted, the
    /// two pods evicted and the others not.
    async fn check(&self, client: &Client, ns: &str, tainted: Timestamp) -> Result<()> {
        let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
        wait::until(
            "the outage's pods evicted",
            Duration::from_secs(240),
            Duration::from_millis(500),
            || async {
                for (name, _) in EVICTED {
                    if !k8s::deleted(&pods, name).await? {
                        return Ok(None);
                    }
                }
                Ok(Some(()))
            },
        )
        .await?;
        let node = Api::<Node>::all(client.clone()).get(&self.nodes[0]).await?;
        ensure!(
            k8s::node_condition(&node, "Ready").map(|c| c.0).as_deref() == Some("Unknown"),
            "out-a Ready: {:?}",
            k8s::node_condition(&node, "Ready")
        );
        for effect in ["NoSchedule", "NoExecute"] {
            ensure!(
                k8s::has_taint(&node, UNREACHABLE, effect),
                "out-a lost its unreachable {effect} taint: {:?}",
                k8s::taints(&node)
            );
        }
        self.watcher.abort();
        let log = self.log.lock().expect("taint log").clone();
        ensure!(
            log.added.len() == 1 && log.added.contains(&tainted),
            "out-a's NoExecute taint, added at {tainted} before the faults, was added again or without a time: {:?}",
            log.added
        );
        ensure!(
            log.lost == 0,
            "out-a's NoExecute taint went missing {} times after it was added",
            log.lost
        );
        ensure!(
            log.healthy_tainted.is_empty(),
            "healthy nodes tainted: {:?}",
            log.healthy_tainted
        );
        for name in ["keep", "stay"] {
            ensure!(!k8s::deleted(&pods, name).await?, "{name} was deleted");
        }
        Ok(())
    }
}

/// A StatefulSet `web` behind a Service of the same name, scaled and rolled out during the
/// faults, and a selectorless Service `ext` whose Endpoints change during them.
mod serving {
    use super::*;

    pub const REPLICAS: i32 = 5;
    pub const EXT: [&str; 4] = ["10.1.0.1", "10.1.0.2", "10.1.0.3", "10.1.0.4"];

    pub async fn start(client: &Client, ns: &str) -> Result<()> {
        let pp = PostParams::default();
        let ports = json!([{"name": "http", "port": 80, "targetPort": 8080, "protocol": "TCP"}]);
        let services: Api<Service> = Api::namespaced(client.clone(), ns);
        services
            .create(
                &pp,
                &serde_json::from_value(json!({
                    "metadata": {"name": "web"},
                    "spec": {"selector": {"app": "web"}, "ports": ports}
                }))?,
            )
            .await?;
        services
            .create(
                &pp,
                &serde_json::from_value(json!({
                    "metadata": {"name": "ext"},
                    "spec": {"ports": [{"name": "http", "port": 80, "protocol": "TCP"}]}
                }))?,
            )
            .await?;
        Api::<Endpoints>::namespaced(client.clone(), ns)
            .create(&pp, &serde_json::from_value(endpoints(&EXT[..3]))?)
            .await?;
        Api::<StatefulSet>::namespaced(client.clone(), ns)
            .create(&pp, &serde_json::from_value(k8s::stateful_set("web", 3))?)
            .await?;
        Ok(())
    }

    fn endpoints(ips: &[&str]) -> Value {
        let addresses: Vec<Value> = ips.iter().map(|ip| json!({"ip": ip})).collect();
        json!({
            "metadata": {"name": "ext"},
            "subsets": [{"addresses": addresses, "ports": [{"name": "http", "port": 80, "protocol": "TCP"}]}]
        })
    }

    /// A merge patch by the test, tried again while an injected fault refuses it.
    async fn patch<K>(api: &Api<K>, name: &str, body: Value) -> Result<()>
    where
        K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
    {
        wait::until(
            &format!("the API server to take a patch of {name}"),
            Duration::from_secs(30),
            Duration::from_millis(300),
            || async {
                Ok(api
                    .patch(name, &PatchParams::default(), &Patch::Merge(&body))
                    .await
                    .ok()
                    .map(|_| ()))
            },
        )
        .await
    }

    pub async fn scale(client: &Client, ns: &str) -> Result<()> {
        let sets: Api<StatefulSet> = Api::namespaced(client.clone(), ns);
        patch(&sets, "web", json!({"spec": {"replicas": REPLICAS}})).await
    }

    pub async fn roll(client: &Client, ns: &str) -> Result<()> {
        let sets: Api<StatefulSet> = Api::namespaced(client.clone(), ns);
        let body = json!({"spec": {"template": {"metadata": {"annotations": {"pilothouse.test/rev": "2"}}}}});
        patch(&sets, "web", body).await
    }

    pub async fn grow_ext(client: &Client, ns: &str) -> Result<()> {
        let eps: Api<Endpoints> = Api::namespaced(client.clone(), ns);
        patch(&eps, "ext", endpoints(&EXT)).await
    }

    fn addresses(slices: &[EndpointSlice]) -> Vec<(String, bool)> {
        let mut out: Vec<(String, bool)> = slices
            .iter()
            .flat_map(|s| s.endpoints.iter().flatten())
            .flat_map(|e| {
                let ready = e.conditions.as_ref().and_then(|c| c.ready) == Some(true);
                e.addresses.iter().map(move |a| (a.clone(), ready))
            })
            .collect();
        out.sort();
        out
    }

    async fn slices(
        client: &Client,
        ns: &str,
        service: &str,
        by: &str,
    ) -> Result<Vec<EndpointSlice>> {
        let lp = ListParams::default().labels(&format!(
            "kubernetes.io/service-name={service},endpointslice.kubernetes.io/managed-by={by}"
        ));
        Ok(Api::<EndpointSlice>::namespaced(client.clone(), ns)
            .list(&lp)
            .await?
            .items)
    }

    /// Exact: the set rolled out (ordinals 0..5 once each, all on the update revision, status
    /// counts and revisions agreeing), its Service's one slice holding exactly its pods' IPs,
    /// ready, and `ext`'s one mirrored slice holding exactly its four addresses.
    pub async fn check(client: &Client, ns: &str) -> Result<()> {
        let sets: Api<StatefulSet> = Api::namespaced(client.clone(), ns);
        let set = wait::until(
            "web rolled out",
            Duration::from_secs(180),
            Duration::from_millis(500),
            || async {
                let s = sets.get("web").await?;
                let Some(st) = s.status.clone() else {
                    return Ok(None);
                };
                let n = Some(REPLICAS);
                let done = st.observed_generation == s.metadata.generation
                    && st.replicas == REPLICAS
                    && st.ready_replicas == n
                    && st.updated_replicas == n
                    && st.current_replicas == n
                    && st.update_revision.is_some()
                    && st.current_revision == st.update_revision;
                Ok(done.then_some(s))
            },
        )
        .await?;
        let revision = set.status.and_then(|s| s.update_revision);
        let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
        let list = pods
            .list(&ListParams::default().labels("app=web"))
            .await?
            .items;
        let mut names: Vec<String> = list
            .iter()
            .filter_map(|p| p.metadata.name.clone())
            .collect();
        names.sort();
        let want: Vec<String> = (0..REPLICAS).map(|i| format!("web-{i}")).collect();
        ensure!(names == want, "web's pods: {names:?}");
        for p in &list {
            let rev = p
                .metadata
                .labels
                .as_ref()
                .and_then(|l| l.get("controller-revision-hash"));
            ensure!(
                rev == revision.as_ref() && p.metadata.deletion_timestamp.is_none(),
                "{:?} on revision {rev:?}, want {revision:?}",
                p.metadata.name
            );
        }
        let mut ips: Vec<(String, bool)> = list
            .iter()
            .filter_map(|p| p.status.as_ref()?.pod_ip.clone())
            .map(|ip| (ip, true))
            .collect();
        ips.sort();
        ensure!(
            ips.len() == want.len(),
            "web's pods without an IP: {list:?}"
        );
        let got = wait::until(
            "web's slice to hold exactly its pods",
            Duration::from_secs(60),
            Duration::from_millis(250),
            || async {
                let s = slices(client, ns, "web", MANAGED_BY).await?;
                Ok((s.len() == 1 && addresses(&s) == ips).then_some(s))
            },
        )
        .await;
        if got.is_err() {
            let s = slices(client, ns, "web", MANAGED_BY).await?;
            anyhow::bail!(
                "web's slices: {} of them with {:?}; want one with {ips:?}",
                s.len(),
                addresses(&s)
            );
        }
        let want_ext: Vec<(String, bool)> = EXT.iter().map(|a| (a.to_string(), true)).collect();
        let got = wait::until(
            "ext's mirrored slice to hold exactly its addresses",
            Duration::from_secs(60),
            Duration::from_millis(250),
            || async {
                let s = slices(client, ns, "ext", MIRRORED_BY).await?;
                Ok((s.len() == 1 && addresses(&s) == want_ext).then_some(()))
            },
        )
        .await;
        if got.is_err() {
            let s = slices(client, ns, "ext", MIRRORED_BY).await?;
            anyhow::bail!(
                "ext's mirrored slices: {} of them with {:?}; want one with {want_ext:?}",
                s.len(),
                addresses(&s)
            );
        }
        Ok(())
    }
}

/// A NodeMaintenance draining a node through the faults and ended during them: the maintenance
/// shape's three kwok nodes (kept apart by a taint of their own), its `web` Deployment behind a
/// `maxUnavailable: 1` PDB and `logship` DaemonSet, and a Deployment `batch` of three pods on
/// the drained node behind a PDB that allows no disruption until the test relaxes it: the drain
/// evicts `web`'s pod, is held by `batch`'s PDB through the kill at 16 s, the cut and the first
/// kube-apiserver restart, and goes on, one PDB-spaced eviction at a time, into the kill at 60 s.
mod maintenance {
    use super::*;
    use pilothouse_tests::maintenance::{
        self as nm, Maintenances, NodeMaintenance, Shape, ShapeOptions, api, cordon_state, name_of,
        progress,
    };
    use std::collections::BTreeMap;

    /// Keeps the rest of the workload off the shape's nodes (an evicted Job pod would change
    /// that Job's counts).
    const SHAPE_TAINT: &str = "pilothouse.test/nm-chaos";
    const BATCH: usize = 3;
    /// The disruption controller's `DeletionTimeout`: how long a budget counts a pod an eviction
    /// was accepted for as disrupted while the pod is not deleted.
    const PDB_DELETION_TIMEOUT: Duration = Duration::from_secs(120);
    /// How soon after the budget allows disruptions the drain must be done, unless an eviction
    /// was interrupted (measured: 2-9 s).
    const DRAIN_AFTER_RELAX: Duration = Duration::from_secs(30);
    /// A node's (unschedulable, maintenance taint, recorded-unschedulable annotation).
    type Cordon = (bool, bool, Option<String>);

    pub struct Drain {
        shape: Shape,
        nms: Maintenances,
        name: String,
        /// The pods on the drained node when the maintenance began (logship's is a DaemonSet's).
        targets: BTreeSet<String>,
        /// When `batch`'s PDB began to allow a disruption.
        relaxed: Option<Timestamp>,
        /// The object when it reported `Drained`, and the node then.
        drained: Option<(NodeMaintenance, Cordon)>,
    }

    async fn set_unschedulable(shape: &Shape, node: &str, on: bool) -> Result<()> {
        shape
            .node_api
            .patch(
                node,
                &PatchParams::default(),
                &Patch::Merge(json!({"spec": {"unschedulable": on}})),
            )
            .await?;
        Ok(())
    }

    impl Drain {
        pub async fn prepare() -> Result<Drain> {
            let shape = Shape::new(
                cluster(),
                "chaos-nm",
                ShapeOptions {
                    taint: Some(SHAPE_TAINT),
                    ..Default::default()
                },
            )
            .await?;
            let w1 = shape.w(1).to_string();
            // All of batch on w1: the other two are cordoned (by the test) while it starts.
            for n in &shape.nodes[1..] {
                set_unschedulable(&shape, n, true).await?;
            }
            let mut spec = shape.prefer(&w1);
            spec["terminationGracePeriodSeconds"] = json!(2);
            shape.deployment("batch", BATCH as i32, spec).await?;
            shape
                .pdb("batch-pdb", json!({"maxUnavailable": 0}), "batch")
                .await?;
            wait::until(
                "batch's replicas ready on w1",
                Duration::from_secs(60),
                Duration::from_millis(250),
                || async {
                    let ready = shape
                        .app_on("batch", &w1)
                        .await?
                        .iter()
                        .filter(|p| nm::is_ready(p))
                        .count();
                    Ok((ready == BATCH).then_some(()))
                },
            )
            .await?;
            for n in &shape.nodes[1..] {
                set_unschedulable(&shape, n, false).await?;
            }
            shape.wait_pdb_allows("batch-pdb", 0).await?;
            let targets: BTreeSet<String> = shape
                .pods_on(&w1)
                .await?
                .iter()
                .filter(|p| nm::label(p, "app") != Some("logship"))
                .map(name_of)
                .collect();
            ensure!(
                targets.len() == 1 + BATCH,
                "pods on {w1} to drain: {targets:?}, want web's and batch's {BATCH}"
            );
            let name = format!("{}-nm", shape.name);
            Ok(Drain {
                nms: Maintenances::new(shape.client.clone()),
                shape,
                name,
                targets,
                relaxed: None,
                drained: None,
            })
        }

        pub fn targets(&self) -> usize {
            self.targets.len()
        }

        pub async fn begin(&self) -> Result<()> {
            let spec = json!({"nodeName": self.shape.w(1), "reason": "chaos"});
            wait::until(
                "the API server to take the NodeMaintenance",
                Duration::from_secs(30),
                Duration::from_millis(300),
                || async {
                    match self.nms.create(&self.name, spec.clone()).await {
                        Ok(_) => Ok(Some(())),
                        // An earlier try may have landed though its answer was lost; any other
                        // refusal is kept as the error to report.
                        Err(e) => match self.nms.get_opt(&self.name).await? {
                            Some(_) => Ok(Some(())),
                            None => Err(e),
                        },
                    }
                },
            )
            .await
        }

        /// Checks the drain is held where it should be (web's pod evicted, batch's three
        /// blocked by their PDB), then lets the PDB allow one disruption at a time.
        pub async fn relax(&mut self) -> Result<()> {
            let held = wait::until(
                "the drain held by batch's PDB",
                Duration::from_secs(30),
                Duration::from_millis(250),
                || async {
                    let nm = self.nms.get(&self.name).await?;
                    let p = progress(&nm);
                    // web's pod gone (recorded as evicted unless its leader was lost in the
                    // round trip: see `check`).
                    let gone = nm.status.as_ref().map_or(0, |s| {
                        s.targeted_pods
                            .iter()
                            .filter(|t| t.state == api::TargetState::Gone)
                            .count()
                    });
                    Ok(
                        (p.targeted == 1 + BATCH as i64 && gone == 1 && p.blocked == BATCH as i64)
                            .then_some(nm),
                    )
                },
            )
            .await;
            if let Err(e) = held {
                let now = self.nms.get_opt(&self.name).await.ok().flatten();
                anyhow::bail!("{e:#}; the object: {}", nm::describe(now.as_ref()));
            }
            let relaxed = Timestamp::now();
            wait::until(
                "the API server to take batch-pdb's change",
                Duration::from_secs(30),
                Duration::from_millis(300),
                || async {
                    Ok(self
                        .shape
                        .pdbs()
                        .patch(
                            "batch-pdb",
                            &PatchParams::default(),
                            &Patch::Merge(json!({"spec": {"maxUnavailable": 1}})),
                        )
                        .await
                        .ok()
                        .map(|_| ()))
                },
            )
            .await?;
            self.relaxed = Some(relaxed);
            Ok(())
        }

        /// Waits for `Drained`, keeps the object and the node as they were then, and ends the
        /// maintenance (deletes the object: the finalizer restores the node).
        ///
        /// The wait covers one upstream consequence of the kill: an eviction whose client dies
        /// while the API server retries its budget update (500 ms a try, on conflicts with the
        /// other evictions) is answered 504 at once, but its handler goes on without the
        /// request's context, may still decrement the budget, and then fails to delete the pod.
        /// The budget counts that pod as disrupted, and so refuses every eviction, until the
        /// disruption controller drops the entry after its `DeletionTimeout` (2 minutes, with a
        /// `NotDeleted` warning on the pod). `check` allows that long only with both in the
        /// record. The later faults then come after the drain (their times are printed).
        pub async fn end(&mut self) -> Result<()> {
            let done = self
                .nms
                .wait_condition(
                    &self.name,
                    api::CONDITION_DRAINED,
                    "True",
                    "DrainComplete",
                    PDB_DELETION_TIMEOUT + Duration::from_secs(60),
                )
                .await?;
            let w1 = self.shape.w(1).to_string();
            let node = wait::until(
                "a read of the drained node",
                Duration::from_secs(30),
                Duration::from_millis(300),
                || async { Ok(Some(self.shape.node(&w1).await?)) },
            )
            .await?;
            self.drained = Some((done, cordon_state(&node)));
            wait::until(
                "the API server to take the NodeMaintenance's deletion",
                Duration::from_secs(30),
                Duration::from_millis(300),
                || async {
                    match self.nms.api.delete(&self.name, &Default::default()).await {
                        Ok(_) => Ok(Some(())),
                        // An earlier try landed though its answer was lost.
                        Err(kube::Error::Api(e)) if e.code == 404 => Ok(Some(())),
                        Err(e) => Err(e.into()),
                    }
                },
            )
            .await
        }

        /// Waits until the controller has removed its finalizer and the object is gone; the
        /// nodes must then be as before the maintenance.
        pub async fn wait_ended(&self) -> Result<()> {
            self.nms
                .wait_gone(&self.name, Duration::from_secs(60))
                .await?;
            for node in &self.shape.nodes {
                let state = cordon_state(&self.shape.node(node).await?);
                ensure!(
                    state == (false, false, None),
                    "{node} after the maintenance ended: {state:?}"
                );
            }
            Ok(())
        }

        /// Exact: every pod on the node when the drain began evicted once and no other pod, the
        /// status counting each once; `Drained` only after the PDB allowed the last evictions;
        /// the node cordoned while drained; the other nodes never written by the controller.
        pub async fn check(self, events: &[audit::AuditEvent]) -> Result<()> {
            let (done, cordoned) = self
                .drained
                .clone()
                .context("the maintenance was never ended")?;
            let relaxed = self.relaxed.context("batch's PDB was never relaxed")?;
            // The audit log: the controller's accepted evictions, per pod.
            let nmc = |e: &&audit::AuditEvent| {
                e.stage == "ResponseComplete" && e.user_agent.contains(nm::NMC_AGENT)
            };
            let mut evicted: BTreeMap<String, Vec<Timestamp>> = BTreeMap::new();
            // Evictions whose client left while the API server was still at them (its 504; the
            // handler goes on in the background): see `end`.
            let mut interrupted: Vec<(String, Timestamp)> = Vec::new();
            for e in events.iter().filter(nmc) {
                let Some(o) = e.object_ref.as_ref() else {
                    continue;
                };
                let code = e.response_status.as_ref().and_then(|s| s.code);
                if e.verb != "create" || o.resource != "pods" || o.subresource != "eviction" {
                    continue;
                }
                let pod = format!("{}/{}", o.namespace, o.name);
                // Every namespace: no pod but the targets may be evicted.
                match code {
                    Some(c) if (200..300).contains(&c) => {
                        evicted.entry(pod).or_default().extend(e.received());
                    }
                    Some(504) => interrupted.extend(e.received().map(|at| (pod, at))),
                    _ => {}
                }
            }
            let want: BTreeSet<String> = self
                .targets
                .iter()
                .map(|t| format!("{}/{t}", self.shape.ns))
                .collect();
            ensure!(
                evicted.keys().cloned().collect::<BTreeSet<_>>() == want
                    && evicted.values().all(|at| at.len() == 1),
                "accepted evictions by the controller {evicted:?}, want one each of {:?}",
                self.targets
            );
            let n = i64::try_from(self.targets.len())?;
            let listed = done
                .status
                .as_ref()
                .map(|s| s.targeted_pods.clone())
                .unwrap_or_default();
            let by_eviction: BTreeSet<String> = listed
                .iter()
                .filter(|t| {
                    t.namespace == self.shape.ns
                        && t.state == api::TargetState::Gone
                        && t.method == Some(api::EvictionMethod::Eviction)
                })
                .map(|t| t.name.clone())
                .collect();
            // The one window the status cannot close: a leader lost between an accepted
            // eviction and the status write that records it (sent at once after the sync's
            // requests) leaves its successor a listed target gone with no record of why. Such a
            // target is accepted only with its accepted eviction in the audit log (checked
            // above), and counted.
            let unrecorded: Vec<&api::TargetedPod> = listed
                .iter()
                .filter(|t| t.state == api::TargetState::Gone && t.method.is_none())
                .collect();
            let m = i64::try_from(unrecorded.len())?;
            let p = progress(&done);
            ensure!(
                listed.len() == self.targets.len()
                    && listed.iter().all(
                        |t| self.targets.contains(&t.name) && t.state == api::TargetState::Gone
                    )
                    && (p.targeted, p.evicted, p.pending, p.blocked, p.terminating)
                        == (n, n - m, 0, 0, 0)
                    && by_eviction.len() + unrecorded.len() == self.targets.len()
                    && p.skipped.daemon_set == 1,
                "Drained with progress {p:?} and targetedPods {listed:?}; want {n} targets {:?}, each Gone by eviction",
                self.targets
            );
            let drained_at = nm::condition(&done, api::CONDITION_DRAINED)
                .map(|c| c.last_transition_time.0)
                .context("no Drained condition")?;
            let last_eviction = evicted.values().flatten().max().copied();
            ensure!(
                drained_at >= relaxed && last_eviction.is_some_and(|e| drained_at >= e),
                "Drained at {drained_at}, before batch's PDB was relaxed ({relaxed}) or before the last eviction ({last_eviction:?})"
            );
            let took = relaxed.duration_until(drained_at).unsigned_abs();
            // Later than that only behind a budget that counted a target disrupted though it was
            // never deleted: an eviction of it interrupted after the relaxation, and the
            // disruption controller's `NotDeleted` warning on it when the entry expired, after
            // which the drain must be as quick as ever.
            let interrupted: Vec<(String, Timestamp)> = interrupted
                .into_iter()
                .filter(|(pod, at)| want.contains(pod) && *at >= relaxed && *at <= drained_at)
                .collect();
            let expired = if took > DRAIN_AFTER_RELAX {
                let mut expired = None;
                for (pod, _) in &interrupted {
                    let name = pod.rsplit('/').next().unwrap_or(pod);
                    for e in
                        k8s::events(&self.shape.client, &self.shape.ns, name, "NotDeleted").await?
                    {
                        let at = e
                            .deprecated_last_timestamp
                            .or(e.deprecated_first_timestamp)
                            .map(|t| t.0)
                            .or(e.event_time.map(|t| t.0));
                        expired = expired.max(at);
                    }
                }
                ensure!(
                    expired.is_some_and(|at| {
                        at >= relaxed
                            && at.duration_until(drained_at).unsigned_abs() <= DRAIN_AFTER_RELAX
                    }),
                    "Drained {:.1}s after batch's PDB allowed evictions (at most {}s, or that long after the budget's NotDeleted warning on a target whose eviction was interrupted after the relaxation: interrupted {interrupted:?}, last such warning {expired:?})",
                    took.as_secs_f64(),
                    DRAIN_AFTER_RELAX.as_secs()
                );
                expired
            } else {
                None
            };
            ensure!(
                cordoned == (true, true, Some("false".into())),
                "{} when Drained: (unschedulable, maintenance taint, annotation) = {cordoned:?}",
                self.shape.w(1)
            );
            let others: Vec<String> = events
                .iter()
                .filter(nmc)
                .filter(|e| matches!(e.verb.as_str(), "patch" | "update"))
                .filter_map(|e| e.object_ref.as_ref())
                .filter(|o| {
                    o.resource == "nodes"
                        && o.name != self.shape.w(1)
                        && self.shape.nodes.contains(&o.name)
                })
                .map(|o| o.name.clone())
                .collect();
            ensure!(
                others.is_empty(),
                "the controller wrote the undrained nodes: {others:?}"
            );
            println!(
                "MEASURE chaos: {} drained through the faults: {n} pods evicted once each ({m} of them without a status record of it, their leader lost before writing it), Drained {:.1}s after batch's PDB allowed evictions ({} eviction(s) of a target interrupted by the kill after it: {interrupted:?}; the budget's NotDeleted warning {}), the node cordoned while drained and restored when the object was deleted",
                self.shape.w(1),
                took.as_secs_f64(),
                interrupted.len(),
                expired.map_or("not needed".to_string(), |at| format!(
                    "at {at}, {:.1}s before Drained",
                    at.duration_until(drained_at).as_secs_f64()
                ))
            );
            self.shape.cleanup(cluster()).await
        }
    }
}

fn install_crd(c: &pilothouse_tests::Cluster) -> Result<()> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?
        .block_on(pilothouse_tests::maintenance::install_crd(c))
}

fn main() -> ! {
    pilothouse_tests::harness::main_with_setup(
        "chaos",
        // kube-controller-manager keeps everything but the controllers under test (its
        // disruption controller computes the PDBs' status for the drain).
        ClusterOptions {
            replace: Some(REPLACED.to_vec()),
            ..Default::default()
        },
        install_crd,
        None,
        vec![trial(
            "mixed_workload_under_faults",
            mixed_workload_under_faults,
        )],
    )
}
