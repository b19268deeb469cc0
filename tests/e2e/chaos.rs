//! Issue 17 §2: faults under a mixed workload. Three Pilothouse replicas (job, cronjob and
//! taint-eviction controllers; each behind a TCP proxy of its own, restarted like a Deployment's
//! pods when they exit) run NonIndexed, Indexed and failing Jobs, a minutely CronJob and a pod
//! waiting out its toleration of a NoExecute taint, while a fixed schedule injects faults: the
//! leader SIGKILLed three times, the leader cut from the API server, kube-apiserver restarted
//! twice and etcd once. The checks are exact: every Job's counts, completed indexes, condition
//! and pod count; no pod left with the tracking finalizer; every CronJob minute run once; the
//! tolerating pod deleted, not before its toleration ran out; no replica panicked.

use anyhow::{Context, Result, ensure};
use k8s_openapi::api::batch::v1::CronJob;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, PostParams};
use pilothouse_tests::cluster::ClusterOptions;
use pilothouse_tests::harness::{cluster, log_dir, trial};
use pilothouse_tests::jobs::{self, Jobs};
use pilothouse_tests::proxy::Proxy;
use pilothouse_tests::{Pilothouse, audit, k8s, unique, wait};
use serde_json::json;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::time::Instant;

const CONTROLLERS: &str = "job-controller,cronjob-controller,taint-eviction-controller";
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
            format!("--controllers={CONTROLLERS}"),
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

    // The workload.
    let victim_created =
        k8s::tolerating_pod_on_tainted_node(&client, &ns, "zone-chaos", TAINT, TOLERATION_SECONDS)
            .await?;
    let complete = [("plain", 12), ("indexed", 8), ("late", 6)];
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
    at(16).await;
    replicas.sigkill_leader().await?;
    note("leader SIGKILLed");
    at(26).await;
    let exited = replicas.partition_leader().await?;
    note(&format!(
        "leader cut from the API server; it exited {:.1}s later, then the link healed",
        exited.as_secs_f64()
    ));
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
    at(60).await;
    replicas.sigkill_leader().await?;
    note("leader SIGKILLed");
    at(70).await;
    cluster().restart_etcd().await?;
    note("etcd restarted (back up)");
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
    let now_min = Timestamp::now().as_second().div_euclid(60);
    let first_min = cron_created.as_second().div_euclid(60).saturating_add(1);
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

    sup.abort();
    replicas.stop();
    // The victim was deleted by one request (a replica's taint-eviction controller), once, and
    // not before its toleration ran out (each new leader's taint-eviction controller starts the
    // clock when it first sees the pod, as kcm's does, so later is right).
    tokio::time::sleep(Duration::from_secs(2)).await;
    let deletes: Vec<(Option<Timestamp>, Option<u16>)> = audit::read(&cluster().audit_log())?
        .into_iter()
        .filter(|e| {
            e.stage == "ResponseComplete"
                && e.verb == "delete"
                && e.object_ref
                    .as_ref()
                    .is_some_and(|o| o.namespace == ns && o.name == "victim")
                && e.user_agent.contains("pilothouse")
        })
        .map(|e| (e.received(), e.response_status.and_then(|s| s.code)))
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
        "MEASURE chaos: {} processes in all ({restarts} restarts); plain/indexed/late complete with exact counts, failing failed 3/3, {} CronJob minutes each run once, tolerating pod deleted {after:.1}s after creation ({} DELETE requests)",
        logs.len(),
        expected.len(),
        deletes.len()
    );
    k8s::release_pods(&client, &ns).await?;
    Ok(())
}

fn main() -> ! {
    pilothouse_tests::harness::main(
        "chaos",
        // kube-controller-manager keeps everything but the three controllers under test.
        ClusterOptions {
            replace: Some(vec![
                "job-controller",
                "cronjob-controller",
                "taint-eviction-controller",
            ]),
            ..Default::default()
        },
        None,
        vec![trial(
            "mixed_workload_under_faults",
            mixed_workload_under_faults,
        )],
    )
}
