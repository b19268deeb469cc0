//! End-to-end tests of `job-controller` (spec §2, scenarios J1..J16), against a local control
//! plane whose kube-controller-manager runs everything but the job controller (its garbage
//! collector and TTL controller included), with one Pilothouse running only the job controller,
//! as the `kube-system/pilothouse` ServiceAccount with the shipped RBAC. Each test owns a
//! namespace; pods run on the shared kwok nodes and exit when the test says (annotations read by
//! the kwok stages), so all tests run side by side on the real clock.

use anyhow::{Result, bail, ensure};
use k8s_openapi::api::core::v1::Pod;
use kube::api::{DeleteParams, EvictParams, Patch, PatchParams, PostParams, PropagationPolicy};
use pilothouse_tests::cluster::ClusterOptions;
use pilothouse_tests::harness::{SuitePilothouse, cluster, pilothouse, trial};
use pilothouse_tests::jobs::{
    self, Jobs, Kubelet, annotation, counts, drive, has_finalizer, non_terminal, template,
    uncounted_empty,
};
use pilothouse_tests::{k8s, wait};
use serde_json::json;
use std::cell::Cell;
use std::collections::BTreeMap;
use std::time::Duration;
use tokio::time::Instant;

const EXIT: &str = "pilothouse.test/exit-code";
const RUN_FOR: &str = "pilothouse.test/run-for";
const INDEX: &str = "batch.kubernetes.io/job-completion-index";

async fn ns(prefix: &str) -> Result<Jobs> {
    let client = cluster().client().await?;
    let ns = cluster().namespace(prefix).await?;
    k8s::wait_service_account(&client, &ns).await?;
    Ok(Jobs::new(client, &ns))
}

async fn metric(series: &str) -> Result<f64> {
    Ok(pilothouse().metric(series).await?.unwrap_or(0.0))
}

/// Makes a running pod exit with `code` (after `run_for`), as its kubelet would report.
async fn exit_pod(j: &Jobs, pod: &str, code: i32, run_for: &str) -> Result<()> {
    j.pods
        .patch(
            pod,
            &PatchParams::default(),
            &Patch::Merge(
                json!({"metadata": {"annotations": {EXIT: code.to_string(), RUN_FOR: run_for}}}),
            ),
        )
        .await?;
    Ok(())
}

fn index_of(p: &Pod) -> Option<i32> {
    annotation(p, INDEX).and_then(|v| v.parse().ok())
}

fn created(p: &Pod) -> k8s_openapi::jiff::Timestamp {
    p.metadata
        .creation_timestamp
        .as_ref()
        .expect("creationTimestamp")
        .0
}

/// Every version of a Job's pods seen by polling every 100 ms (pods vanish once their finalizers
/// are gone), latest per UID.
#[derive(Clone, Default)]
struct PodHistory(std::sync::Arc<std::sync::Mutex<BTreeMap<String, Pod>>>);

impl PodHistory {
    fn start(j: &Jobs, name: &str) -> (PodHistory, tokio::task::JoinHandle<()>) {
        let h = PodHistory::default();
        let (j, name, h2) = (j.clone(), name.to_string(), h.clone());
        let task = tokio::spawn(async move {
            loop {
                for p in j.pods_of(&name).await.unwrap_or_default() {
                    let uid = p.metadata.uid.clone().unwrap_or_default();
                    h2.0.lock().expect("history lock").insert(uid, p);
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        });
        (h, task)
    }

    fn pods(&self) -> Vec<Pod> {
        self.0
            .lock()
            .expect("history lock")
            .values()
            .cloned()
            .collect()
    }
}

/// The sum of every sample of a metric family (all label values).
async fn metric_sum(name: &str) -> Result<f64> {
    let (_, body) = pilothouse().http_get("/metrics").await?;
    Ok(body
        .lines()
        .filter(|l| {
            l.starts_with(name) && matches!(l.as_bytes().get(name.len()), Some(b'{') | Some(b' '))
        })
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum())
}

async fn set_suspend(j: &Jobs, name: &str, suspend: bool) -> Result<()> {
    j.jobs
        .patch(
            name,
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"suspend": suspend}})),
        )
        .await?;
    Ok(())
}

/// No status write was refused locally (JB-2) and none rejected by the API server.
async fn no_invalid_writes() -> Result<()> {
    ensure!(
        metric("pilothouse_job_status_writes_refused_total").await? == 0.0,
        "a status write was refused locally"
    );
    let log = pilothouse().log_text();
    ensure!(
        !log.contains("is invalid"),
        "the API server rejected a write: {}",
        log.lines()
            .filter(|l| l.contains("is invalid"))
            .collect::<Vec<_>>()
            .join("\n")
    );
    Ok(())
}

/// J1: basic NonIndexed Job.
async fn j1_basic() -> Result<()> {
    let j = ns("j1").await?;
    let finished_before = metric(r#"job_controller_jobs_finished_total{completion_mode="NonIndexed",result="succeeded",reason="CompletionsReached"}"#).await?;
    j.create(&jobs::job(
        "basic",
        json!({"parallelism": 2, "completions": 4}),
        template(Some(0), "3s"),
    )?)
    .await?;
    let t0 = Instant::now();
    let mut max_running = 0;
    let mut seen = BTreeMap::new();
    loop {
        let pods = j.pods_of("basic").await?;
        max_running = max_running.max(pods.iter().filter(|p| non_terminal(p)).count());
        for p in &pods {
            seen.entry(p.metadata.name.clone().unwrap_or_default())
                .or_insert_with(|| p.clone());
        }
        let job = j.get("basic").await?;
        if jobs::finished(&job).is_some() {
            break;
        }
        ensure!(
            t0.elapsed() < Duration::from_secs(90),
            "job did not finish: {:?}",
            job.status
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    ensure!(max_running <= 2, "{max_running} non-terminal pods at once");
    let job = j.get("basic").await?;
    let uid = job.metadata.uid.clone().unwrap_or_default();
    for p in seen.values() {
        let owner = p
            .metadata
            .owner_references
            .as_ref()
            .and_then(|o| o.first())
            .cloned()
            .unwrap_or_default();
        ensure!(
            owner.kind == "Job"
                && owner.uid == uid
                && owner.controller == Some(true)
                && owner.block_owner_deletion == Some(true),
            "owner {owner:?}"
        );
        ensure!(
            p.metadata.generate_name.as_deref() == Some("basic-"),
            "generateName {:?}",
            p.metadata.generate_name
        );
        let labels = p.metadata.labels.clone().unwrap_or_default();
        for l in [
            "batch.kubernetes.io/job-name",
            "batch.kubernetes.io/controller-uid",
            "job-name",
            "controller-uid",
        ] {
            ensure!(labels.contains_key(l), "pod lacks label {l}");
        }
    }
    ensure!(
        seen.values().any(has_finalizer),
        "no pod was seen with the tracking finalizer"
    );
    ensure!(counts(&job) == (0, 0, 0, 4, 0), "counts {:?}", counts(&job));
    ensure!(uncounted_empty(&job), "uncounted {:?}", job.status);
    let sc = jobs::condition(&job, "SuccessCriteriaMet").map(|c| c.reason.clone());
    let complete = jobs::condition(&job, "Complete")
        .cloned()
        .unwrap_or_default();
    ensure!(
        sc == Some(Some("CompletionsReached".into()))
            && complete.reason.as_deref() == Some("CompletionsReached"),
        "conditions {:?}",
        job.status
    );
    ensure!(
        job.status.as_ref().and_then(|s| s.completion_time.clone())
            == complete.last_transition_time,
        "completionTime != Complete.lastTransitionTime"
    );
    j.wait_no_finalizers("basic", Duration::from_secs(10))
        .await?;
    let pods = j.pods_of("basic").await?;
    ensure!(
        pods.len() == 4 && pods.iter().all(|p| jobs::phase(p) == "Succeeded"),
        "{} pods",
        pods.len()
    );
    wait::until(
        "one Completed event",
        Duration::from_secs(10),
        Duration::from_millis(200),
        || async { Ok((j.events("basic", "Completed").await?.len() == 1).then_some(())) },
    )
    .await?;
    let finished_after = metric(r#"job_controller_jobs_finished_total{completion_mode="NonIndexed",result="succeeded",reason="CompletionsReached"}"#).await?;
    ensure!(
        finished_after >= finished_before + 1.0,
        "jobs_finished_total did not rise"
    );
    no_invalid_writes().await
}

/// J2: Indexed identity, replacement of a force-deleted index after backoff, completedIndexes.
async fn j2_indexed() -> Result<()> {
    let j = ns("j2").await?;
    j.create(&jobs::job(
        "idx",
        json!({"completionMode": "Indexed", "completions": 5, "parallelism": 5}),
        template(Some(0), "20s"),
    )?)
    .await?;
    let pods = wait::until(
        "5 running pods",
        Duration::from_secs(30),
        Duration::from_millis(200),
        || async {
            let p = j.pods_of("idx").await?;
            Ok((p.len() == 5 && p.iter().all(|p| jobs::phase(p) == "Running")).then_some(p))
        },
    )
    .await?;
    for p in &pods {
        let i = index_of(p).expect("index annotation");
        ensure!(
            p.metadata.generate_name.as_deref() == Some(&format!("idx-{i}-")),
            "generateName {:?}",
            p.metadata.generate_name
        );
        ensure!(
            p.metadata.labels.as_ref().and_then(|l| l.get(INDEX)) == Some(&i.to_string()),
            "index label"
        );
        let spec = p.spec.clone().unwrap_or_default();
        ensure!(
            spec.hostname.as_deref() == Some(&format!("idx-{i}")),
            "hostname {:?}",
            spec.hostname
        );
        let env = spec.containers[0].env.clone().unwrap_or_default();
        let e = env
            .iter()
            .find(|e| e.name == "JOB_COMPLETION_INDEX")
            .expect("JOB_COMPLETION_INDEX");
        ensure!(
            e.value_from
                .as_ref()
                .and_then(|v| v.field_ref.as_ref())
                .map(|f| f.field_path.as_str())
                == Some("metadata.labels['batch.kubernetes.io/job-completion-index']")
        );
    }
    let (history, sampler) = PodHistory::start(&j, "idx");
    let victim = pods
        .iter()
        .find(|p| index_of(p) == Some(2))
        .expect("index 2");
    let victim_name = victim.metadata.name.clone().unwrap_or_default();
    // Taken before the request: the deletion happens after this instant, so the backoff (10 s
    // from the whole-second deletion time) ends more than 9 s after it. Taken after the reply,
    // the reply's latency would come off the bound.
    let deleted_at = k8s_openapi::jiff::Timestamp::now();
    j.pods
        .delete(
            &victim_name,
            &DeleteParams {
                grace_period_seconds: Some(0),
                ..Default::default()
            },
        )
        .await?;
    let replacement = wait::until(
        "a replacement for index 2",
        Duration::from_secs(30),
        Duration::from_millis(200),
        || async {
            let p = j.pods_of("idx").await?;
            Ok(p.into_iter().find(|p| {
                index_of(p) == Some(2) && p.metadata.name.as_deref() != Some(&victim_name)
            }))
        },
    )
    .await?;
    let after = created(&replacement)
        .duration_since(deleted_at)
        .as_secs_f64();
    println!("MEASURE j2 replacement of the deleted index created {after:.1}s after the delete");
    // Timestamps have whole seconds: allow one second of truncation.
    ensure!(
        after >= 9.0,
        "replacement after {after}s, before the 10 s backoff"
    );
    let job = j.get("idx").await?;
    ensure!(counts(&job).4 == 1, "failed {:?}", counts(&job));
    let job = j.wait_finished("idx", Duration::from_secs(60)).await?;
    let st = job.status.clone().unwrap_or_default();
    ensure!(
        st.completed_indexes.as_deref() == Some("0-4")
            && st.succeeded == Some(5)
            && st.failed == Some(1),
        "status {st:?}"
    );
    sampler.abort();
    let twos = history
        .pods()
        .into_iter()
        .filter(|p| index_of(p) == Some(2))
        .count();
    ensure!(
        twos == 2,
        "{twos} pods seen for index 2, want the deleted one and one replacement"
    );
    // Variant: completions 2.
    j.create(&jobs::job(
        "two",
        json!({"completionMode": "Indexed", "completions": 2, "parallelism": 2}),
        template(Some(0), "1s"),
    )?)
    .await?;
    let job = j.wait_finished("two", Duration::from_secs(60)).await?;
    ensure!(
        job.status
            .as_ref()
            .and_then(|s| s.completed_indexes.as_deref())
            == Some("0,1")
    );
    no_invalid_writes().await
}

/// J3: pod-failure backoff and BackoffLimitExceeded; JB-1 variant (active/ready truthful).
async fn j3_backoff() -> Result<()> {
    let j = ns("j3").await?;
    j.create(&jobs::job(
        "fail",
        json!({"backoffLimit": 2}),
        template(Some(1), "0s"),
    )?)
    .await?;
    let job = j
        .wait_condition("fail", "Failed", Duration::from_secs(120))
        .await?;
    ensure!(
        jobs::condition(&job, "FailureTarget").is_some(),
        "Failed without FailureTarget"
    );
    let c = jobs::condition(&job, "Failed").cloned().unwrap_or_default();
    ensure!(
        c.reason.as_deref() == Some("BackoffLimitExceeded")
            && c.message.as_deref() == Some("Job has reached the specified backoff limit"),
        "{c:?}"
    );
    ensure!(counts(&job).4 == 3, "failed {:?}", counts(&job));
    let mut pods = j.pods_of("fail").await?;
    ensure!(pods.len() == 3, "{} pods, want 3", pods.len());
    pods.sort_by_key(created);
    let gaps: Vec<f64> = pods
        .windows(2)
        .map(|w| created(&w[1]).duration_since(created(&w[0])).as_secs_f64())
        .collect();
    println!("MEASURE j3 creation gaps {gaps:?} (want ≥10 then ≥20 after each failure)");
    ensure!(gaps[0] >= 9.0 && gaps[1] >= 19.0, "gaps {gaps:?}");
    j.wait_event("fail", "BackoffLimitExceeded").await?;
    tokio::time::sleep(Duration::from_secs(3)).await;
    ensure!(j.pods_of("fail").await?.len() == 3, "a 4th pod appeared");
    // JB-1: one Ready pod keeps running while the other fails and waits on backoff.
    j.create(&jobs::job(
        "b1",
        json!({"parallelism": 2, "completions": 2, "backoffLimit": 6}),
        template(None, ""),
    )?)
    .await?;
    let pods = wait::until(
        "2 ready pods",
        Duration::from_secs(30),
        Duration::from_millis(200),
        || async {
            let job = j.get("b1").await?;
            Ok((counts(&job).1 == 2).then_some(()))
        },
    )
    .await;
    pods?;
    let victim = j.pods_of("b1").await?.remove(0);
    exit_pod(
        &j,
        victim.metadata.name.as_deref().unwrap_or_default(),
        1,
        "0s",
    )
    .await?;
    let t0 = Instant::now();
    let mut saw_failed = false;
    while t0.elapsed() < Duration::from_secs(12) {
        let (active, ready, _, _, failed) = counts(&j.get("b1").await?);
        ensure!(
            active >= 1 && ready <= active,
            "active {active} ready {ready} during backoff"
        );
        saw_failed |= failed == 1;
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    ensure!(saw_failed, "the failure was never counted");
    no_invalid_writes().await
}

/// J4: restartPolicy OnFailure with backoffLimit 1.
async fn j4_on_failure() -> Result<()> {
    let j = ns("j4").await?;
    let mut t = template(None, "");
    t["spec"]["restartPolicy"] = json!("OnFailure");
    t["metadata"]["annotations"] = json!({"pilothouse.test/restarts": "1"});
    j.create(&jobs::job("onf", json!({"backoffLimit": 1}), t)?)
        .await?;
    let job = j
        .wait_condition("onf", "Failed", Duration::from_secs(60))
        .await?;
    ensure!(
        jobs::condition(&job, "Failed").and_then(|c| c.reason.as_deref())
            == Some("BackoffLimitExceeded")
    );
    ensure!(counts(&job).4 == 1, "failed {:?}", counts(&job));
    let pods = j.pods_of("onf").await?;
    ensure!(
        pods.iter()
            .all(|p| p.metadata.deletion_timestamp.is_some() || !non_terminal(p)),
        "pod not deleted"
    );
    no_invalid_writes().await
}

/// J5 (a): FailJob on exit code 42; the others are deleted and counted; Failed after they end.
async fn j5a_fail_job() -> Result<()> {
    let j = ns("j5a").await?;
    let spec = json!({"parallelism": 3, "completions": 3, "podFailurePolicy": {"rules": [
        {"action": "FailJob", "onExitCodes": {"operator": "In", "values": [42]}}]}});
    j.create(&jobs::job("pfp", spec, template(None, ""))?)
        .await?;
    j.wait_running("pfp", 3).await?;
    let victim = j.pods_of("pfp").await?.remove(0);
    let vname = victim.metadata.name.clone().unwrap_or_default();
    exit_pod(&j, &vname, 42, "0s").await?;
    let saw_target_alone = Cell::new(false);
    let job = wait::until(
        "Failed",
        Duration::from_secs(60),
        Duration::from_millis(100),
        || async {
            let job = j.get("pfp").await?;
            let failed = jobs::condition(&job, "Failed").is_some();
            if jobs::condition(&job, "FailureTarget").is_some() && !failed {
                saw_target_alone.set(true);
            }
            if failed {
                ensure!(counts(&job).2 == 0, "Failed with terminating pods");
            }
            Ok(failed.then_some(job))
        },
    )
    .await?;
    ensure!(
        saw_target_alone.get(),
        "FailureTarget was never seen before Failed"
    );
    let c = jobs::condition(&job, "FailureTarget")
        .cloned()
        .unwrap_or_default();
    let want = format!(
        "Container c for pod {}/{vname} failed with exit code 42 matching FailJob rule at index 0",
        j.ns
    );
    ensure!(
        c.reason.as_deref() == Some("PodFailurePolicy")
            && c.message.as_deref() == Some(want.as_str()),
        "{c:?}"
    );
    ensure!(counts(&job).4 == 3, "failed {:?}", counts(&job));
    no_invalid_writes().await
}

/// J5 (b): Ignore on DisruptionTarget: evicted pods are not counted; each replacement waits for
/// its predecessor to be Failed.
async fn j5b_ignore_disruption() -> Result<()> {
    let j = ns("j5b").await?;
    let spec = json!({"completionMode": "Indexed", "completions": 3, "parallelism": 3, "backoffLimit": 0,
        "podFailurePolicy": {"rules": [{"action": "Ignore", "onPodConditions": [{"type": "DisruptionTarget"}]}]}});
    let mut t = template(Some(0), "15s");
    t["metadata"]["annotations"]["pilothouse.test/terminate-after"] = json!("3s");
    j.create(&jobs::job("evict", spec, t)?).await?;
    let (history, sampler) = PodHistory::start(&j, "evict");
    let first = wait::until(
        "3 running pods",
        Duration::from_secs(30),
        Duration::from_millis(200),
        || async {
            let p = j.pods_of("evict").await?;
            Ok((p.iter().filter(|p| jobs::phase(p) == "Running").count() == 3).then_some(p))
        },
    )
    .await?;
    for p in &first {
        j.pods
            .evict(
                p.metadata.name.as_deref().unwrap_or_default(),
                &EvictParams::default(),
            )
            .await?;
    }
    let job = j.wait_finished("evict", Duration::from_secs(90)).await?;
    ensure!(
        jobs::condition(&job, "Complete").is_some(),
        "not complete: {:?}",
        job.status
    );
    ensure!(counts(&job).4 == 0, "failed {:?}", counts(&job));
    sampler.abort();
    let all = history.pods();
    for old in &first {
        let ix = index_of(old);
        let last = all
            .iter()
            .find(|p| p.metadata.uid == old.metadata.uid)
            .unwrap_or(old);
        ensure!(
            jobs::phase(last) == "Failed",
            "evicted pod {:?} never seen Failed",
            old.metadata.name
        );
        let finished_at = finish_time(last)?;
        let repl = all
            .iter()
            .find(|p| index_of(p) == ix && p.metadata.uid != old.metadata.uid)
            .ok_or_else(|| anyhow::anyhow!("no replacement for {ix:?}"))?;
        ensure!(
            created(repl) >= finished_at,
            "replacement for {ix:?} created before its predecessor failed"
        );
    }
    no_invalid_writes().await
}

/// When a pod's containers terminated.
fn finish_time(p: &Pod) -> Result<k8s_openapi::jiff::Timestamp> {
    let t = p
        .status
        .as_ref()
        .and_then(|s| s.container_statuses.as_ref())
        .and_then(|c| c.first())
        .and_then(|c| c.state.as_ref()?.terminated.as_ref()?.finished_at.clone());
    match t {
        Some(t) => Ok(t.0),
        None => bail!("pod {:?} has no termination time", p.metadata.name),
    }
}

/// J6: podReplacementPolicy Failed vs TerminatingOrFailed.
async fn j6_replacement_policy() -> Result<()> {
    let j = ns("j6").await?;
    for policy in ["Failed", "TerminatingOrFailed"] {
        let name = policy.to_lowercase();
        let mut t = template(None, "");
        t["metadata"]["annotations"] = json!({"pilothouse.test/terminate-after": "5s"});
        j.create(&jobs::job(
            &name,
            json!({"podReplacementPolicy": policy}),
            t,
        )?)
        .await?;
        let pod = wait::until(
            "a running pod",
            Duration::from_secs(30),
            Duration::from_millis(200),
            || async {
                Ok(j.pods_of(&name)
                    .await?
                    .into_iter()
                    .find(|p| jobs::phase(p) == "Running"))
            },
        )
        .await?;
        let pname = pod.metadata.name.clone().unwrap_or_default();
        j.pods
            .delete(
                &pname,
                &DeleteParams {
                    grace_period_seconds: Some(30),
                    ..Default::default()
                },
            )
            .await?;
        let deleted_at = k8s_openapi::jiff::Timestamp::now();
        // The pod stays terminating for 5 s (kwok): the Job must show it within that window.
        // Its status follows the delete after the 1 s pod-event batch; a fixed 3 s read was
        // once too early (the write came 3.1 s after the delete under load).
        let want = |(a, f, t): (i32, i32, i32)| {
            if policy == "Failed" {
                (a, f, t) == (0, 0, 1)
            } else {
                f == 1 && t == 1
            }
        };
        let last = std::sync::Mutex::new(None);
        let seen = wait::until(
            "the terminating pod counted",
            Duration::from_millis(4500),
            Duration::from_millis(100),
            || async {
                let (a, _, t, _, f) = counts(&j.get(&name).await?);
                *last.lock().unwrap() = Some((a, f, t));
                Ok(want((a, f, t)).then_some((a, f, t)))
            },
        )
        .await
        .map_err(|e| {
            anyhow::anyhow!(
                "while terminating: {e}; last (active, failed, terminating) {:?}",
                last.lock().unwrap()
            )
        })?;
        println!(
            "MEASURE j6 {policy}: terminating counted {:.1}s after the delete {seen:?}",
            k8s_openapi::jiff::Timestamp::now()
                .duration_since(deleted_at)
                .as_secs_f64()
        );
        if policy == "Failed" {
            ensure!(
                j.pods_of(&name).await?.len() == 1,
                "replacement created while terminating"
            );
        }
        let repl = wait::until(
            "a replacement",
            Duration::from_secs(40),
            Duration::from_millis(200),
            || async {
                Ok(j.pods_of(&name)
                    .await?
                    .into_iter()
                    .find(|p| p.metadata.name.as_deref() != Some(&pname)))
            },
        )
        .await?;
        let after = created(&repl).duration_since(deleted_at).as_secs_f64();
        println!(
            "MEASURE j6 {policy}: replacement {after:.1}s after the delete (pod terminates 5 s after it)"
        );
        if policy == "Failed" {
            // 10 s of backoff after the pod failed at ~5 s.
            ensure!(after >= 14.0, "replacement after {after}s");
            let job = wait::until(
                "active 1 failed 1",
                Duration::from_secs(10),
                Duration::from_millis(200),
                || async {
                    let job = j.get(&name).await?;
                    let (a, _, t, _, f) = counts(&job);
                    Ok(((a, f, t) == (1, 1, 0)).then_some(job))
                },
            )
            .await?;
            drop(job);
        } else {
            // 10 s after the estimated failure (the delete): neither at once nor timed from termination.
            ensure!((9.0..=13.0).contains(&after), "replacement after {after}s");
        }
    }
    no_invalid_writes().await
}

/// J7: suspend and resume.
async fn j7_suspend() -> Result<()> {
    let j = ns("j7").await?;
    // (a) created suspended.
    j.create(&jobs::job(
        "sus",
        json!({"suspend": true, "parallelism": 2, "completions": 2}),
        template(Some(0), "2s"),
    )?)
    .await?;
    let job = j
        .wait_condition("sus", "Suspended", Duration::from_secs(20))
        .await?;
    ensure!(
        jobs::condition(&job, "Suspended").and_then(|c| c.reason.as_deref())
            == Some("JobSuspended")
    );
    ensure!(
        job.status
            .as_ref()
            .and_then(|s| s.start_time.as_ref())
            .is_none(),
        "startTime on a suspended Job"
    );
    tokio::time::sleep(Duration::from_secs(2)).await;
    ensure!(
        j.pods_of("sus").await?.is_empty(),
        "pods for a suspended Job"
    );
    j.wait_event("sus", "Suspended").await?;
    set_suspend(&j, "sus", false).await?;
    let job = wait::until(
        "resumed",
        Duration::from_secs(20),
        Duration::from_millis(200),
        || async {
            let job = j.get("sus").await?;
            let c = job
                .status
                .as_ref()
                .and_then(|s| s.conditions.clone())
                .unwrap_or_default();
            Ok(c.iter()
                .any(|c| {
                    c.type_ == "Suspended"
                        && c.status == "False"
                        && c.reason.as_deref() == Some("JobResumed")
                })
                .then_some(job))
        },
    )
    .await?;
    ensure!(
        job.status
            .as_ref()
            .and_then(|s| s.start_time.as_ref())
            .is_some(),
        "no startTime after resume"
    );
    j.wait_event("sus", "Resumed").await?;
    j.wait_condition("sus", "Complete", Duration::from_secs(60))
        .await?;
    // (b) a running Job suspended for longer than its deadline, then resumed.
    j.create(&jobs::job(
        "run",
        json!({"parallelism": 2, "completions": 2, "activeDeadlineSeconds": 10}),
        template(None, ""),
    )?)
    .await?;
    wait::until(
        "2 active",
        Duration::from_secs(30),
        Duration::from_millis(200),
        || async { Ok((counts(&j.get("run").await?).0 == 2).then_some(())) },
    )
    .await?;
    let start1 = j.get("run").await?.status.and_then(|s| s.start_time);
    set_suspend(&j, "run", true).await?;
    let job = j
        .wait_condition("run", "Suspended", Duration::from_secs(20))
        .await?;
    ensure!(
        job.status
            .as_ref()
            .and_then(|s| s.start_time.as_ref())
            .is_none(),
        "startTime not cleared on suspend"
    );
    wait::until(
        "pods gone",
        Duration::from_secs(30),
        Duration::from_millis(200),
        || async { Ok(j.pods_of("run").await?.is_empty().then_some(())) },
    )
    .await?;
    tokio::time::sleep(Duration::from_secs(12)).await;
    let job = j.get("run").await?;
    ensure!(
        jobs::condition(&job, "FailureTarget").is_none()
            && jobs::condition(&job, "Failed").is_none(),
        "deadline counted while suspended"
    );
    ensure!(
        counts(&job).4 == 0,
        "suspension deletes counted as failures"
    );
    set_suspend(&j, "run", false).await?;
    let job = wait::until(
        "resumed with pods",
        Duration::from_secs(20),
        Duration::from_millis(200),
        || async {
            let job = j.get("run").await?;
            Ok((counts(&job).0 == 2).then_some(job))
        },
    )
    .await?;
    let start2 = job.status.and_then(|s| s.start_time);
    ensure!(
        start2.is_some() && start2 != start1,
        "startTime not renewed on resume"
    );
    no_invalid_writes().await
}

/// J8: activeDeadlineSeconds, set at creation and lowered on a running Job.
async fn j8_deadline() -> Result<()> {
    let j = ns("j8").await?;
    j.create(&jobs::job(
        "ads",
        json!({"parallelism": 2, "completions": 2, "activeDeadlineSeconds": 5}),
        template(None, ""),
    )?)
    .await?;
    let t0 = Instant::now();
    j.wait_condition("ads", "FailureTarget", Duration::from_secs(10))
        .await?;
    let took = t0.elapsed();
    println!(
        "MEASURE j8 FailureTarget DeadlineExceeded {:.2}s after creation (ADS 5)",
        took.as_secs_f64()
    );
    ensure!(
        took <= Duration::from_secs(7),
        "FailureTarget after {took:?}"
    );
    let job = j
        .wait_condition("ads", "Failed", Duration::from_secs(30))
        .await?;
    ensure!(
        jobs::condition(&job, "Failed").and_then(|c| c.reason.as_deref())
            == Some("DeadlineExceeded")
    );
    ensure!(counts(&job).4 == 2, "failed {:?}", counts(&job));
    j.wait_event("ads", "DeadlineExceeded").await?;
    // Lowering the deadline below the elapsed time fails a running Job promptly.
    j.create(&jobs::job(
        "lower",
        json!({"activeDeadlineSeconds": 600}),
        template(None, ""),
    )?)
    .await?;
    wait::until(
        "running",
        Duration::from_secs(30),
        Duration::from_millis(200),
        || async { Ok((counts(&j.get("lower").await?).0 == 1).then_some(())) },
    )
    .await?;
    tokio::time::sleep(Duration::from_secs(3)).await;
    j.jobs
        .patch(
            "lower",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"activeDeadlineSeconds": 1}})),
        )
        .await?;
    let t0 = Instant::now();
    j.wait_condition("lower", "FailureTarget", Duration::from_secs(5))
        .await?;
    println!(
        "MEASURE j8 lowered deadline: FailureTarget {:.2}s after the patch",
        t0.elapsed().as_secs_f64()
    );
    no_invalid_writes().await
}

/// J9: backoffLimitPerIndex (a), maxFailedIndexes (b), FailIndex (c).
async fn j9_per_index() -> Result<()> {
    let j = ns("j9").await?;
    // (a) index 1 always fails.
    j.create(&jobs::job("a", json!({"completionMode": "Indexed", "completions": 4, "parallelism": 2, "backoffLimitPerIndex": 1}), template(None, ""))?).await?;
    let saw_empty = Cell::new(false);
    let driver = drive(&j, "a", |i, _| {
        if i == Some(1) {
            Kubelet::Exit(1, "1s")
        } else {
            Kubelet::Exit(0, "1s")
        }
    });
    let job = wait::until(
        "a finished",
        Duration::from_secs(90),
        Duration::from_millis(100),
        || async {
            let job = j.get("a").await?;
            if job
                .status
                .as_ref()
                .and_then(|s| s.failed_indexes.as_deref())
                == Some("")
            {
                saw_empty.set(true);
            }
            Ok(jobs::finished(&job).is_some().then_some(job))
        },
    )
    .await?;
    driver.abort();
    let st = job.status.clone().unwrap_or_default();
    ensure!(saw_empty.get(), "failedIndexes was never \"\"");
    ensure!(
        job.spec.as_ref().and_then(|s| s.backoff_limit) == Some(i32::MAX),
        "backoffLimit {:?}",
        job.spec.as_ref().and_then(|s| s.backoff_limit)
    );
    ensure!(
        st.failed_indexes.as_deref() == Some("1")
            && st.completed_indexes.as_deref() == Some("0,2,3")
            && st.failed == Some(2),
        "status {st:?}"
    );
    ensure!(
        jobs::condition(&job, "Failed").and_then(|c| c.reason.as_deref()) == Some("FailedIndexes")
    );
    let mut counts_1: Vec<String> = j
        .pods_of("a")
        .await?
        .iter()
        .filter(|p| index_of(p) == Some(1))
        .map(|p| {
            annotation(p, "batch.kubernetes.io/job-index-failure-count")
                .unwrap_or("?")
                .to_string()
        })
        .collect();
    counts_1.sort();
    ensure!(
        counts_1 == vec!["0", "1"],
        "failure counts of index 1: {counts_1:?}"
    );
    // (b) maxFailedIndexes 0.
    j.create(&jobs::job("b", json!({"completionMode": "Indexed", "completions": 4, "parallelism": 4, "backoffLimitPerIndex": 0, "maxFailedIndexes": 0}), template(None, ""))?).await?;
    let driver = drive(&j, "b", |i, _| {
        if i == Some(1) {
            Kubelet::Exit(1, "1s")
        } else {
            Kubelet::Run
        }
    });
    let job = j.wait_finished("b", Duration::from_secs(60)).await?;
    driver.abort();
    ensure!(
        jobs::condition(&job, "Failed").and_then(|c| c.reason.as_deref())
            == Some("MaxFailedIndexesExceeded"),
        "{:?}",
        job.status
    );
    ensure!(
        j.pods_of("b")
            .await?
            .iter()
            .all(|p| !non_terminal(p) || p.metadata.deletion_timestamp.is_some()),
        "pods left running"
    );
    // (c) FailIndex on exit code 3.
    j.create(&jobs::job("c", json!({"completionMode": "Indexed", "completions": 2, "parallelism": 2, "backoffLimitPerIndex": 3,
        "podFailurePolicy": {"rules": [{"action": "FailIndex", "onExitCodes": {"operator": "In", "values": [3]}}]}}), template(None, ""))?).await?;
    let driver = drive(&j, "c", |i, _| {
        if i == Some(1) {
            Kubelet::Exit(3, "1s")
        } else {
            Kubelet::Exit(0, "1s")
        }
    });
    let job = j.wait_finished("c", Duration::from_secs(60)).await?;
    driver.abort();
    ensure!(
        job.status
            .as_ref()
            .and_then(|s| s.failed_indexes.as_deref())
            == Some("1"),
        "{:?}",
        job.status
    );
    let ones = j
        .pods_of("c")
        .await?
        .iter()
        .filter(|p| index_of(p) == Some(1))
        .count();
    ensure!(ones == 1, "index 1 retried ({ones} pods)");
    no_invalid_writes().await
}

/// J10: successPolicy.
async fn j10_success_policy() -> Result<()> {
    let j = ns("j10").await?;
    j.create(&jobs::job(
        "sp",
        json!({"completionMode": "Indexed", "completions": 5, "parallelism": 5,
        "successPolicy": {"rules": [{"succeededIndexes": "0"}]}}),
        template(None, ""),
    )?)
    .await?;
    let driver = drive(&j, "sp", |i, _| {
        if i == Some(0) {
            Kubelet::Exit(0, "5s")
        } else {
            Kubelet::Run
        }
    });
    let job = j
        .wait_condition("sp", "SuccessCriteriaMet", Duration::from_secs(60))
        .await?;
    let c = jobs::condition(&job, "SuccessCriteriaMet")
        .cloned()
        .unwrap_or_default();
    ensure!(
        c.reason.as_deref() == Some("SuccessPolicy")
            && c.message.as_deref() == Some("Matched rules at index 0"),
        "{c:?}"
    );
    let job = j
        .wait_condition("sp", "Complete", Duration::from_secs(60))
        .await?;
    driver.abort();
    let st = job.status.clone().unwrap_or_default();
    ensure!(
        st.succeeded == Some(1)
            && st.failed.unwrap_or(0) == 0
            && st.completed_indexes.as_deref() == Some("0"),
        "{st:?}"
    );
    ensure!(
        j.pods_of("sp")
            .await?
            .iter()
            .all(|p| !non_terminal(p) || p.metadata.deletion_timestamp.is_some()),
        "pods left running"
    );
    no_invalid_writes().await
}

/// J11: adoption of an orphan and release of a pod that stops matching.
async fn j11_adoption() -> Result<()> {
    let j = ns("j11").await?;
    j.create(&jobs::job("own", json!({}), template(None, ""))?)
        .await?;
    let pod = wait::until(
        "a running pod",
        Duration::from_secs(30),
        Duration::from_millis(200),
        || async {
            Ok(j.pods_of("own")
                .await?
                .into_iter()
                .find(|p| jobs::phase(p) == "Running"))
        },
    )
    .await?;
    let name = pod.metadata.name.clone().unwrap_or_default();
    let uid = j.get("own").await?.metadata.uid.unwrap_or_default();
    j.pods
        .patch(
            &name,
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"ownerReferences": null, "finalizers": null}})),
        )
        .await?;
    wait::until(
        "adopted back",
        Duration::from_secs(15),
        Duration::from_millis(200),
        || async {
            let p = j.pods.get(&name).await?;
            let owned = p
                .metadata
                .owner_references
                .iter()
                .flatten()
                .any(|o| o.uid == uid && o.controller == Some(true));
            Ok((owned && has_finalizer(&p)).then_some(()))
        },
    )
    .await?;
    j.pods.patch(&name, &PatchParams::default(), &Patch::Merge(json!({"metadata": {"labels": {"batch.kubernetes.io/controller-uid": "someone-else"}}}))).await?;
    wait::until(
        "released",
        Duration::from_secs(15),
        Duration::from_millis(200),
        || async {
            let p = j.pods.get(&name).await?;
            Ok((p
                .metadata
                .owner_references
                .as_ref()
                .is_none_or(|o| o.is_empty())
                && !has_finalizer(&p))
            .then_some(()))
        },
    )
    .await?;
    wait::until(
        "a replacement",
        Duration::from_secs(15),
        Duration::from_millis(200),
        || async {
            Ok(j.pods_of("own").await?.into_iter().find(|p| {
                p.metadata.name.as_deref() != Some(&name) && p.metadata.owner_references.is_some()
            }))
        },
    )
    .await?;
    no_invalid_writes().await
}

/// J12: orphaned pods lose the finalizer.
async fn j12_orphans() -> Result<()> {
    let j = ns("j12").await?;
    j.create(&jobs::job(
        "orph",
        json!({"parallelism": 2, "completions": 2}),
        template(None, ""),
    )?)
    .await?;
    j.wait_running("orph", 2).await?;
    j.jobs
        .delete(
            "orph",
            &DeleteParams {
                propagation_policy: Some(PropagationPolicy::Orphan),
                ..Default::default()
            },
        )
        .await?;
    wait::until(
        "orphans without owner or finalizer",
        Duration::from_secs(30),
        Duration::from_millis(200),
        || async {
            let pods = j.pods_of("orph").await?;
            let done = pods.len() == 2
                && pods.iter().all(|p| {
                    p.metadata
                        .owner_references
                        .as_ref()
                        .is_none_or(|o| o.is_empty())
                        && !has_finalizer(p)
                        && p.metadata.deletion_timestamp.is_none()
                });
            Ok(done.then_some(()))
        },
    )
    .await?;
    let stray: Pod = serde_json::from_value(json!({
        "metadata": {"name": "stray", "finalizers": [jobs::TRACKING_FINALIZER]},
        "spec": {"containers": [{"name": "c", "image": "busybox"}], "nodeName": "nowhere"}
    }))?;
    j.pods.create(&PostParams::default(), &stray).await?;
    wait::until(
        "stray pod loses the finalizer",
        Duration::from_secs(15),
        Duration::from_millis(200),
        || async { Ok((!has_finalizer(&j.pods.get("stray").await?)).then_some(())) },
    )
    .await?;
    Ok(())
}

/// J13: a Job managed by another controller is left alone; the API server guards its status.
async fn j13_managed_by() -> Result<()> {
    let j = ns("j13").await?;
    let series =
        r#"job_controller_jobs_by_external_controller_total{controller_name="example.com/custom"}"#;
    let before = metric(series).await?;
    j.create(&jobs::job(
        "ext",
        json!({"managedBy": "example.com/custom"}),
        template(Some(0), "1s"),
    )?)
    .await?;
    tokio::time::sleep(Duration::from_secs(4)).await;
    ensure!(
        j.pods_of("ext").await?.is_empty(),
        "pods created for an external Job"
    );
    let job = j.get("ext").await?;
    let st = job.status.clone().unwrap_or_default();
    ensure!(
        st.start_time.is_none() && st.conditions.is_none() && st.active.is_none(),
        "status written: {st:?}"
    );
    ensure!(
        metric(series).await? >= before + 1.0,
        "jobs_by_external_controller_total did not rise"
    );
    let mut bad = job.clone();
    bad.status = Some(serde_json::from_value(
        json!({"conditions": [{"type": "Complete", "status": "True"}], "startTime": "2026-01-01T00:00:00Z", "completionTime": "2026-01-01T00:00:01Z"}),
    )?);
    match j
        .jobs
        .replace_status("ext", &PostParams::default(), &bad)
        .await
    {
        Err(kube::Error::Api(e)) if e.code == 422 => Ok(()),
        other => bail!("Complete without SuccessCriteriaMet was not rejected: {other:?}"),
    }
}

/// J14: the upstream TTL controller deletes finished Jobs as before.
async fn j14_ttl() -> Result<()> {
    let j = ns("j14").await?;
    j.create(&jobs::job(
        "ttl0",
        json!({"ttlSecondsAfterFinished": 0}),
        template(Some(0), "1s"),
    )?)
    .await?;
    j.create(&jobs::job(
        "ttl60",
        json!({"ttlSecondsAfterFinished": 60}),
        template(Some(0), "1s"),
    )?)
    .await?;
    wait::until(
        "ttl0 gone",
        Duration::from_secs(60),
        Duration::from_millis(300),
        || async { Ok(j.jobs.get_opt("ttl0").await?.is_none().then_some(())) },
    )
    .await?;
    j.wait_condition("ttl60", "Complete", Duration::from_secs(60))
        .await?;
    j.jobs
        .patch(
            "ttl60",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"ttlSecondsAfterFinished": 5}})),
        )
        .await?;
    wait::until(
        "ttl60 gone",
        Duration::from_secs(30),
        Duration::from_millis(300),
        || async { Ok(j.jobs.get_opt("ttl60").await?.is_none().then_some(())) },
    )
    .await?;
    wait::until(
        "their pods gone",
        Duration::from_secs(30),
        Duration::from_millis(300),
        || async {
            Ok(
                (j.pods_of("ttl0").await?.is_empty() && j.pods_of("ttl60").await?.is_empty())
                    .then_some(()),
            )
        },
    )
    .await
}

/// J15 (JB-3): a Job recreated under the same name while a create for its predecessor hangs
/// starts clean.
async fn j15_recreated_job_starts_clean() -> Result<()> {
    use pilothouse_tests::webhook::{Match, Webhook};
    let j = ns("j15").await?;
    let hook = Webhook::start(j.client.clone(), &j.ns, &["pods"], &["CREATE"]).await?;
    hook.delay(
        Match {
            resource: Some("pods".into()),
            operation: Some("CREATE".into()),
            ..Default::default()
        },
        Duration::from_secs(5),
    );
    j.create(&jobs::job("same", json!({}), template(None, ""))?)
        .await?;
    tokio::time::sleep(Duration::from_secs(1)).await;
    j.jobs.delete("same", &DeleteParams::background()).await?;
    wait::until(
        "old job gone",
        Duration::from_secs(10),
        Duration::from_millis(100),
        || async { Ok(j.jobs.get_opt("same").await?.is_none().then_some(())) },
    )
    .await?;
    let new = j
        .create(&jobs::job("same", json!({}), template(None, ""))?)
        .await?;
    hook.clear();
    let uid = new.metadata.uid.unwrap_or_default();
    let t0 = Instant::now();
    wait::until(
        "a pod of the new Job",
        Duration::from_secs(10),
        Duration::from_millis(200),
        || async {
            Ok(j.pods_of("same").await?.into_iter().find(|p| {
                p.metadata
                    .owner_references
                    .iter()
                    .flatten()
                    .any(|o| o.uid == uid)
            }))
        },
    )
    .await?;
    println!(
        "MEASURE j15 recreated Job's first pod {:.2}s after it was created",
        t0.elapsed().as_secs_f64()
    );
    hook.remove().await
}

/// J16 (JB-4): finalizer removals rejected by an admission webhook for 60 s are reported and
/// retried; once the rejection lifts, the finalizers go and the Job completes.
async fn j16_rejected_finalizer_removal() -> Result<()> {
    use pilothouse_tests::webhook::Webhook;
    let j = ns("j16").await?;
    let hook = Webhook::start(j.client.clone(), &j.ns, &["pods"], &["UPDATE"]).await?;
    let result = j16_body(&j, &hook).await;
    hook.remove().await?;
    result?;
    no_invalid_writes().await
}

async fn j16_body(j: &Jobs, hook: &pilothouse_tests::webhook::Webhook) -> Result<()> {
    use pilothouse_tests::webhook::Match;
    hook.reject(
        Match {
            resource: Some("pods".into()),
            sub_resource: Some(String::new()),
            operation: Some("UPDATE".into()),
            user: Some("pilothouse".into()),
            ..Default::default()
        },
        u32::MAX,
        "pod updates may not add or remove containers",
    );
    let before = metric_sum("pilothouse_job_tracking_finalizer_removal_failures_total").await?;
    j.create(&jobs::job(
        "stuck",
        json!({"parallelism": 3, "completions": 3}),
        template(Some(0), "2s"),
    )?)
    .await?;
    let ev = wait::until(
        "a TrackingFinalizerRemovalFailed event",
        Duration::from_secs(60),
        Duration::from_millis(500),
        || async {
            Ok(j.events("stuck", "TrackingFinalizerRemovalFailed")
                .await?
                .into_iter()
                .next())
        },
    )
    .await?;
    let note = ev.note.unwrap_or_default();
    ensure!(
        note.contains("pod updates may not add or remove containers"),
        "event does not name the rejection: {note}"
    );
    let after = metric_sum("pilothouse_job_tracking_finalizer_removal_failures_total").await?;
    ensure!(after > before, "failures not counted ({before} -> {after})");
    tokio::time::sleep(Duration::from_secs(50)).await;
    let job = j.get("stuck").await?;
    ensure!(
        jobs::finished(&job).is_none(),
        "finished while finalizers could not be removed"
    );
    hook.clear();
    let t0 = Instant::now();
    j.wait_no_finalizers("stuck", Duration::from_secs(30))
        .await?;
    println!(
        "MEASURE j16 finalizers gone {:.1}s after the rejection lifted",
        t0.elapsed().as_secs_f64()
    );
    let job = j.wait_finished("stuck", Duration::from_secs(30)).await?;
    ensure!(
        counts(&job).3 == 3 && jobs::condition(&job, "Complete").is_some(),
        "{:?}",
        job.status
    );
    Ok(())
}

fn main() -> ! {
    let trials = vec![
        trial("j1_basic", j1_basic),
        trial("j2_indexed", j2_indexed),
        trial("j3_backoff", j3_backoff),
        trial("j4_on_failure", j4_on_failure),
        trial("j5a_fail_job", j5a_fail_job),
        trial("j5b_ignore_disruption", j5b_ignore_disruption),
        trial("j6_replacement_policy", j6_replacement_policy),
        trial("j7_suspend", j7_suspend),
        trial("j8_deadline", j8_deadline),
        trial("j9_per_index", j9_per_index),
        trial("j10_success_policy", j10_success_policy),
        trial("j11_adoption", j11_adoption),
        trial("j12_orphans", j12_orphans),
        trial("j13_managed_by", j13_managed_by),
        trial("j14_ttl", j14_ttl),
        trial(
            "j15_recreated_job_starts_clean",
            j15_recreated_job_starts_clean,
        ),
        trial(
            "j16_rejected_finalizer_removal",
            j16_rejected_finalizer_removal,
        ),
    ];
    pilothouse_tests::harness::main(
        "job",
        // kube-controller-manager keeps everything else (garbage collector, TTL, node lifecycle).
        ClusterOptions {
            replace: Some(vec!["job-controller"]),
            ..Default::default()
        },
        Some(SuitePilothouse {
            args: vec!["--controllers=job-controller".to_string()],
            as_service_account: true,
        }),
        trials,
    )
}
