//! Job helpers for end-to-end, differential and benchmark runs: manifests whose kwok pods exit on
//! demand, and reads of a Job's status, pods and events.

use crate::wait;
use anyhow::{Context, Result};
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
