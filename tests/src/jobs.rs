//! Job helpers for end-to-end, differential and benchmark runs: manifests whose kwok pods exit on
//! demand, and reads of a Job's status, pods and events.

use crate::wait;
use anyhow::{Context, Result, ensure};
use k8s_openapi::api::batch::v1::{Job, JobCondition};
use k8s_openapi::api::core::v1::Pod;
use kube::Client;
use kube::api::{Api, ListParams, PostParams};
use serde_json::{Value, json};
use std::time::Duration;

pub const TRACKING_FINALIZER: &str = "batch.kubernetes.io/job-tracking";

/// A pod template for kwok nodes: its containers exit with `exit_code` after `run_for` (or run
/// until deleted when `exit_code` is `None`).
pub fn template(exit_code: Option<i32>, run_for: &str) -> Value {
    let mut annotations = serde_json::Map::new();
    if let Some(c) = exit_code {
        annotations.insert("pilothouse.test/exit-code".into(), json!(c.to_string()));
        annotations.insert("pilothouse.test/run-for".into(), json!(run_for));
    }
    json!({
        "metadata": {"annotations": annotations},
        "spec": {
            "restartPolicy": "Never",
            "terminationGracePeriodSeconds": 5,
            "tolerations": [{"key": "kwok.x-k8s.io/node", "operator": "Exists", "effect": "NoSchedule"}],
            "containers": [{"name": "c", "image": "busybox"}]
        }
    })
}

/// A batch/v1 Job named `name` with `spec` (JSON, without `template` if `template` is given).
pub fn job(name: &str, mut spec: Value, template: Value) -> Result<Job> {
    spec["template"] = template;
    Ok(serde_json::from_value(json!({
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": name},
        "spec": spec
    }))?)
}

pub fn condition<'a>(job: &'a Job, type_: &str) -> Option<&'a JobCondition> {
    job.status
        .as_ref()?
        .conditions
        .as_ref()?
        .iter()
        .find(|c| c.type_ == type_ && c.status == "True")
}

pub fn finished(job: &Job) -> Option<&JobCondition> {
    condition(job, "Complete").or_else(|| condition(job, "Failed"))
}

/// One namespace's Jobs and pods.
#[derive(Clone)]
pub struct Jobs {
    pub client: Client,
    pub ns: String,
    pub jobs: Api<Job>,
    pub pods: Api<Pod>,
}

impl Jobs {
    pub fn new(client: Client, ns: &str) -> Jobs {
        Jobs {
            jobs: Api::namespaced(client.clone(), ns),
            pods: Api::namespaced(client.clone(), ns),
            client,
            ns: ns.to_string(),
        }
    }

    pub async fn create(&self, job: &Job) -> Result<Job> {
        self.jobs
            .create(&PostParams::default(), job)
            .await
            .with_context(|| format!("creating job {:?}", job.metadata.name))
    }

    pub async fn get(&self, name: &str) -> Result<Job> {
        Ok(self.jobs.get(name).await?)
    }

    /// The Job's pods by the `batch.kubernetes.io/job-name` label.
    pub async fn pods_of(&self, name: &str) -> Result<Vec<Pod>> {
        Ok(self
            .pods
            .list(&ListParams::default().labels(&format!("batch.kubernetes.io/job-name={name}")))
            .await?
            .items)
    }

    /// Waits for `type_`=True on the Job.
    pub async fn wait_condition(&self, name: &str, type_: &str, timeout: Duration) -> Result<Job> {
        wait::until(
            &format!("job {}/{name} {type_}=True", self.ns),
            timeout,
            Duration::from_millis(200),
            || async {
                let j = self.get(name).await?;
                Ok(condition(&j, type_).is_some().then_some(j))
            },
        )
        .await
    }

    /// Waits for the Job to finish, then requires it `Complete` with exactly `completions`
    /// succeeded, nothing active, terminating or failed, one pod per completion (none created
    /// twice) and no pod keeping the tracking finalizer.
    pub async fn expect_complete(
        &self,
        name: &str,
        completions: i32,
        timeout: Duration,
    ) -> Result<Job> {
        let job = self.wait_finished(name, timeout).await?;
        let (active, _, terminating, succeeded, failed) = counts(&job);
        ensure!(
            (active, terminating, succeeded, failed) == (0, 0, completions, 0),
            "{name}: active {active} terminating {terminating} succeeded {succeeded} failed {failed}"
        );
        ensure!(
            condition(&job, "Complete").is_some(),
            "{name} not Complete: {:?}",
            job.status
        );
        let pods = self.pods_of(name).await?;
        ensure!(
            pods.len() == usize::try_from(completions).unwrap_or(0),
            "{name}: {} pods for {completions} completions",
            pods.len()
        );
        self.wait_no_finalizers(name, Duration::from_secs(30))
            .await?;
        Ok(job)
    }

    /// The scheduled minutes (since the epoch) of CronJob `cron`'s Jobs in this namespace,
    /// sorted: its Jobs are named `<cron>-<minute>`.
    pub async fn cron_minutes(&self, cron: &str) -> Result<Vec<i64>> {
        let prefix = format!("{cron}-");
        let mut minutes: Vec<i64> = self
            .jobs
            .list(&ListParams::default())
            .await?
            .items
            .iter()
            .filter_map(|job| {
                job.metadata
                    .name
                    .as_deref()?
                    .strip_prefix(&prefix)?
                    .parse()
                    .ok()
            })
            .collect();
        minutes.sort_unstable();
        Ok(minutes)
    }

    /// Waits for Complete or Failed.
    pub async fn wait_finished(&self, name: &str, timeout: Duration) -> Result<Job> {
        wait::until(
            &format!("job {}/{name} finished", self.ns),
            timeout,
            Duration::from_millis(200),
            || async {
                let j = self.get(name).await?;
                Ok(finished(&j).is_some().then_some(j))
            },
        )
        .await
    }

    /// Waits (30 s at most) until `n` of the Job's pods are Running.
    pub async fn wait_running(&self, name: &str, n: usize) -> Result<()> {
        wait::until(
            &format!("{n} running pods of {}/{name}", self.ns),
            Duration::from_secs(30),
            Duration::from_millis(200),
            || async {
                let running = self
                    .pods_of(name)
                    .await?
                    .iter()
                    .filter(|p| phase(p) == "Running")
                    .count();
                Ok((running == n).then_some(()))
            },
        )
        .await
    }

    /// Waits until no pod of the Job carries the tracking finalizer.
    pub async fn wait_no_finalizers(&self, name: &str, timeout: Duration) -> Result<()> {
        wait::until(
            &format!("no tracking finalizer on pods of {}/{name}", self.ns),
            timeout,
            Duration::from_millis(200),
            || async {
                let left = self
                    .pods_of(name)
                    .await?
                    .iter()
                    .filter(|p| has_finalizer(p))
                    .count();
                Ok((left == 0).then_some(()))
            },
        )
        .await
    }

    pub async fn events(
        &self,
        name: &str,
        reason: &str,
    ) -> Result<Vec<k8s_openapi::api::events::v1::Event>> {
        crate::k8s::events(&self.client, &self.ns, name, reason).await
    }

    /// Waits for an event of `reason` on the Job `name`. Events yield to the controller's
    /// object writes in its one API budget, so one may trail the status it reports by seconds
    /// when the budget is busy.
    pub async fn wait_event(&self, name: &str, reason: &str) -> Result<()> {
        crate::wait::until(
            &format!("{reason} event on {name}"),
            Duration::from_secs(40),
            Duration::from_millis(500),
            || async { Ok((!self.events(name, reason).await?.is_empty()).then_some(())) },
        )
        .await
    }
}

pub fn has_finalizer(p: &Pod) -> bool {
    p.metadata
        .finalizers
        .iter()
        .flatten()
        .any(|f| f == TRACKING_FINALIZER)
}

pub fn phase(p: &Pod) -> &str {
    p.status
        .as_ref()
        .and_then(|s| s.phase.as_deref())
        .unwrap_or_default()
}

pub fn non_terminal(p: &Pod) -> bool {
    !matches!(phase(p), "Succeeded" | "Failed")
}

pub fn annotation<'a>(p: &'a Pod, key: &str) -> Option<&'a str> {
    p.metadata
        .annotations
        .as_ref()?
        .get(key)
        .map(String::as_str)
}

/// (active, ready, terminating, succeeded, failed) as written in status (missing = 0).
pub fn counts(job: &Job) -> (i32, i32, i32, i32, i32) {
    let s = job.status.clone().unwrap_or_default();
    (
        s.active.unwrap_or(0),
        s.ready.unwrap_or(0),
        s.terminating.unwrap_or(0),
        s.succeeded.unwrap_or(0),
        s.failed.unwrap_or(0),
    )
}

/// Whether `status.uncountedTerminatedPods` holds no UID.
pub fn uncounted_empty(job: &Job) -> bool {
    job.status
        .as_ref()
        .and_then(|s| s.uncounted_terminated_pods.as_ref())
        .is_none_or(|u| {
            u.succeeded.as_ref().is_none_or(Vec::is_empty)
                && u.failed.as_ref().is_none_or(Vec::is_empty)
        })
}

/// What the simulated kubelet does with a running pod of a driven Job.
#[derive(Clone, Copy, Debug)]
pub enum Kubelet {
    /// Containers exit with this code after this long (`3s`).
    Exit(i32, &'static str),
    /// The pod is deleted (default grace period), as by an eviction or a user.
    Delete,
    /// Keep running.
    Run,
}

/// Plays the kubelet for a Job until it finishes: each running pod is handled once, by
/// `decide(index, attempt)` (`attempt` counts earlier pods of the same index, or of the Job when
/// NonIndexed). Abort the handle when done.
pub fn drive(
    j: &Jobs,
    name: &str,
    decide: impl Fn(Option<i32>, u32) -> Kubelet + Send + 'static,
) -> tokio::task::JoinHandle<()> {
    use std::collections::{BTreeMap, BTreeSet};
    let j = j.clone();
    let name = name.to_string();
    tokio::spawn(async move {
        let mut handled: BTreeSet<String> = BTreeSet::new();
        let mut attempts: BTreeMap<Option<i32>, u32> = BTreeMap::new();
        loop {
            if let Ok(job) = j.get(&name).await
                && finished(&job).is_some()
            {
                return;
            }
            let mut pods = j.pods_of(&name).await.unwrap_or_default();
            pods.sort_by_key(|p| p.metadata.creation_timestamp.clone().map(|t| t.0));
            for p in pods {
                let uid = p.metadata.uid.clone().unwrap_or_default();
                if phase(&p) != "Running"
                    || p.metadata.deletion_timestamp.is_some()
                    || handled.contains(&uid)
                {
                    continue;
                }
                handled.insert(uid);
                let index = annotation(&p, "batch.kubernetes.io/job-completion-index")
                    .and_then(|v| v.parse().ok());
                let n = attempts.entry(index).or_insert(0);
                let action = decide(index, *n);
                *n += 1;
                let pname = p.metadata.name.clone().unwrap_or_default();
                let _ = match action {
                    Kubelet::Exit(code, after) => j
                        .pods
                        .patch(
                            &pname,
                            &kube::api::PatchParams::default(),
                            &kube::api::Patch::Merge(json!({"metadata": {"annotations": {
                                "pilothouse.test/exit-code": code.to_string(),
                                "pilothouse.test/run-for": after}}})),
                        )
                        .await
                        .map(|_| ()),
                    Kubelet::Delete => j
                        .pods
                        .delete(&pname, &kube::api::DeleteParams::default())
                        .await
                        .map(|_| ()),
                    Kubelet::Run => Ok(()),
                };
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    })
}
