//! API calls of the Job controller. Each writes only what the controller owns: pods are created
//! from the template, finalizers removed with a strategic-merge `$deleteFromPrimitiveList`
//! (never a full update, never SSA on pods), ownership changed with upstream's adopt/release
//! patches (carrying the pod UID as a precondition), status written as a PUT on the status
//! subresource carrying the resourceVersion that was read (JR-54). Every request goes through the
//! writer seam.

use crate::plan::NewPod;
use crate::pods::{
    self, COMPLETION_INDEX, INDEX_FAILURE_COUNT, INDEX_IGNORED_FAILURE_COUNT, TRACKING_FINALIZER,
};
use k8s_openapi::api::batch::v1::{Job, JobStatus};
use k8s_openapi::api::core::v1 as core;
use k8s_openapi::api::core::v1::{EnvVar, EnvVarSource, ObjectFieldSelector};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::ResourceExt;
use serde_json::json;
use shared::api::apierr::{is_already_exists, is_not_found};
use shared::api::writer::{Delete, PatchKind, Writer};
use shared::cache::pod::Pod;
use shared::meta::refs::controller_ref;
use shared::runtime::claim;

/// The API server's `MaxGeneratedNameLength` (63 − 5 random characters).
const MAX_GENERATED_NAME_LENGTH: usize = 58;

/// JR-12: `<job>-<i>-`, shortening only the Job-name part to fit the generated-name limit.
pub fn indexed_generate_name(job: &str, index: i32) -> String {
    let suffix = format!("-{index}-");
    let full = format!("{job}{suffix}");
    if full.len() <= MAX_GENERATED_NAME_LENGTH {
        return full;
    }
    let keep = MAX_GENERATED_NAME_LENGTH.saturating_sub(suffix.len());
    format!("{}{suffix}", &full[..keep])
}

/// JR-10..JR-14: the pod to create for `new` (pure; unit-tested).
pub fn pod_from_template(job: &Job, new: &NewPod) -> core::Pod {
    let template = job
        .spec
        .as_ref()
        .map(|s| s.template.clone())
        .unwrap_or_default();
    let tmeta = template.metadata.unwrap_or_default();
    let mut spec = template.spec.unwrap_or_default();
    let mut labels = tmeta.labels.unwrap_or_default();
    let mut annotations = tmeta.annotations.unwrap_or_default();
    let mut finalizers = tmeta.finalizers.unwrap_or_default();
    if !finalizers.iter().any(|f| f == TRACKING_FINALIZER) {
        finalizers.push(TRACKING_FINALIZER.to_string());
    }
    let job_name = job.name_any();
    let generate_name = match new.index {
        Some(ix) => {
            // JR-13: the index env var in every container lacking it.
            let env = EnvVar {
                name: "JOB_COMPLETION_INDEX".into(),
                value: None,
                value_from: Some(EnvVarSource {
                    field_ref: Some(ObjectFieldSelector {
                        api_version: None,
                        field_path: format!("metadata.labels['{COMPLETION_INDEX}']"),
                    }),
                    ..Default::default()
                }),
            };
            for c in spec
                .init_containers
                .iter_mut()
                .flatten()
                .chain(spec.containers.iter_mut())
            {
                let vars = c.env.get_or_insert_with(Vec::new);
                if !vars.iter().any(|v| v.name == env.name) {
                    vars.push(env.clone());
                }
            }
            annotations.insert(COMPLETION_INDEX.into(), ix.to_string());
            labels.insert(COMPLETION_INDEX.into(), ix.to_string());
            spec.hostname = Some(format!("{job_name}-{ix}"));
            if let Some((failures, ignored)) = new.failure_counts {
                annotations.insert(INDEX_FAILURE_COUNT.into(), failures.to_string());
                if ignored > 0 {
                    annotations.insert(INDEX_IGNORED_FAILURE_COUNT.into(), ignored.to_string());
                }
            }
            indexed_generate_name(&job_name, ix)
        }
        None => format!("{job_name}-"),
    };
    core::Pod {
        metadata: ObjectMeta {
            generate_name: Some(generate_name),
            namespace: job.namespace(),
            labels: (!labels.is_empty()).then_some(labels),
            annotations: (!annotations.is_empty()).then_some(annotations),
            finalizers: Some(finalizers),
            owner_references: Some(vec![controller_ref(job)]),
            ..Default::default()
        },
        spec: Some(spec),
        status: None,
    }
}

/// Creates the pod. The API server already retries generated-name collisions; should one still
/// surface as AlreadyExists, the create is retried with a new generated name (once: the caller's
/// single creation expectation stays right, as only one pod can result).
pub async fn create_pod(writer: &Writer, job: &Job, new: &NewPod) -> Result<Pod, kube::Error> {
    let ns = job.namespace().unwrap_or_default();
    let pod = pod_from_template(job, new);
    retry_generated_name(|| writer.create(&ns, &pod))
        .await
        .map(Pod::from)
}

async fn retry_generated_name<T, F, Fut>(mut create: F) -> Result<T, kube::Error>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, kube::Error>>,
{
    match create().await {
        Err(e) if is_already_exists(&e) => create().await,
        r => r,
    }
}

/// DELETE with the default grace period; NotFound counts as done.
pub async fn delete_pod(writer: &Writer, ns: &str, name: &str) -> Result<(), kube::Error> {
    ignore_not_found(writer.delete::<Pod>(ns, name, Delete::default()).await)
}

/// JR-26 step 6: removes only our finalizer; NotFound counts as done.
pub async fn remove_tracking_finalizer(writer: &Writer, pod: &Pod) -> Result<(), kube::Error> {
    if !pods::has_tracking_finalizer(pod) {
        return Ok(());
    }
    let patch = json!({"metadata": {"$deleteFromPrimitiveList/finalizers": [TRACKING_FINALIZER]}});
    ignore_not_found(patch_pod(writer, pod, patch).await)
}

/// A strategic-merge patch of `pod`.
async fn patch_pod(
    writer: &Writer,
    pod: &Pod,
    patch: serde_json::Value,
) -> Result<(), kube::Error> {
    let ns = pod.namespace().unwrap_or_default();
    writer
        .patch::<Pod>(&ns, pods::name(pod), PatchKind::Strategic, patch)
        .await
        .map(drop)
}

/// NotFound counts as done: the pod is gone, so is what we wanted removed.
fn ignore_not_found(r: Result<(), kube::Error>) -> Result<(), kube::Error> {
    match r {
        Err(e) if is_not_found(&e) => Ok(()),
        r => r,
    }
}

/// JR-63: adopt an orphan (controller reference and finalizer in one patch, pod UID checked).
pub async fn adopt_pod(writer: &Writer, job: &Job, pod: &Pod) -> Result<(), kube::Error> {
    let patch = claim::adopt_patch(&controller_ref(job), pods::uid(pod), &[TRACKING_FINALIZER]);
    patch_pod(writer, pod, patch).await
}

/// JR-63: release a pod that no longer matches (owner reference and finalizer in one patch).
/// The caller decides which errors are no error (`shared::runtime::claim::release_error_ignored`).
pub async fn release_pod(writer: &Writer, job: &Job, pod: &Pod) -> Result<(), kube::Error> {
    let uid = job.metadata.uid.as_deref().unwrap_or_default();
    let patch = claim::release_patch(uid, pods::uid(pod), &[TRACKING_FINALIZER]);
    patch_pod(writer, pod, patch).await
}

/// A live read of the Job (adoption re-checks that it still exists and is not being deleted).
pub async fn get_job(writer: &Writer, ns: &str, name: &str) -> Result<Job, kube::Error> {
    writer.get::<Job>(ns, name).await
}

/// JR-54: PUT of the status subresource over `current` (its resourceVersion is the precondition).
pub async fn replace_status(
    writer: &Writer,
    current: &Job,
    status: JobStatus,
) -> Result<Job, kube::Error> {
    let mut job = current.clone();
    job.status = Some(status);
    writer.replace_status(&job).await
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::batch::v1::JobSpec;
    use k8s_openapi::api::core::v1::{Container, PodSpec, PodTemplateSpec};
    use std::collections::BTreeMap;

    fn job(name: &str) -> Job {
        Job {
            metadata: ObjectMeta {
                name: Some(name.into()),
                namespace: Some("ns".into()),
                uid: Some("job-uid".into()),
                ..Default::default()
            },
            spec: Some(JobSpec {
                template: PodTemplateSpec {
                    metadata: Some(ObjectMeta {
                        labels: Some(BTreeMap::from([(
                            "batch.kubernetes.io/job-name".to_string(),
                            name.to_string(),
                        )])),
                        finalizers: Some(vec!["example.com/keep".into()]),
                        ..Default::default()
                    }),
                    spec: Some(PodSpec {
                        hostname: Some("ignored".into()),
                        subdomain: Some("svc".into()),
                        containers: vec![
                            Container {
                                name: "a".into(),
                                ..Default::default()
                            },
                            Container {
                                name: "b".into(),
                                env: Some(vec![EnvVar {
                                    name: "JOB_COMPLETION_INDEX".into(),
                                    value: Some("mine".into()),
                                    value_from: None,
                                }]),
                                ..Default::default()
                            },
                        ],
                        ..Default::default()
                    }),
                },
                ..Default::default()
            }),
            status: None,
        }
    }

    #[test]
    fn jr10_jr12_non_indexed_pod() {
        let p = pod_from_template(
            &job("pi"),
            &NewPod {
                index: None,
                failure_counts: None,
            },
        );
        assert_eq!(p.metadata.generate_name.as_deref(), Some("pi-"));
        assert_eq!(
            p.metadata.finalizers,
            Some(vec![
                "example.com/keep".to_string(),
                TRACKING_FINALIZER.to_string()
            ])
        );
        let owner = &p.metadata.owner_references.as_ref().unwrap()[0];
        assert_eq!(
            (
                owner.api_version.as_str(),
                owner.kind.as_str(),
                owner.name.as_str(),
                owner.uid.as_str()
            ),
            ("batch/v1", "Job", "pi", "job-uid")
        );
        assert_eq!(
            (owner.controller, owner.block_owner_deletion),
            (Some(true), Some(true))
        );
        assert_eq!(
            p.metadata.labels.unwrap()["batch.kubernetes.io/job-name"],
            "pi"
        );
        assert_eq!(p.spec.unwrap().hostname.as_deref(), Some("ignored"));
    }

    #[test]
    fn jr13_jr14_indexed_pod() {
        let p = pod_from_template(
            &job("pi"),
            &NewPod {
                index: Some(3),
                failure_counts: Some((2, 0)),
            },
        );
        assert_eq!(p.metadata.generate_name.as_deref(), Some("pi-3-"));
        let ann = p.metadata.annotations.unwrap();
        assert_eq!(ann[COMPLETION_INDEX], "3");
        assert_eq!(ann[INDEX_FAILURE_COUNT], "2");
        assert!(!ann.contains_key(INDEX_IGNORED_FAILURE_COUNT));
        assert_eq!(p.metadata.labels.unwrap()[COMPLETION_INDEX], "3");
        let spec = p.spec.unwrap();
        assert_eq!(spec.hostname.as_deref(), Some("pi-3"));
        assert_eq!(spec.subdomain.as_deref(), Some("svc"));
        let env_a = spec.containers[0].env.as_ref().unwrap();
        assert_eq!(
            env_a[0]
                .value_from
                .as_ref()
                .unwrap()
                .field_ref
                .as_ref()
                .unwrap()
                .field_path,
            "metadata.labels['batch.kubernetes.io/job-completion-index']"
        );
        // A container that sets it keeps its own.
        let env_b = spec.containers[1].env.as_ref().unwrap();
        assert_eq!((env_b.len(), env_b[0].value.as_deref()), (1, Some("mine")));
        let p = pod_from_template(
            &job("pi"),
            &NewPod {
                index: Some(0),
                failure_counts: Some((1, 2)),
            },
        );
        assert_eq!(
            p.metadata.annotations.unwrap()[INDEX_IGNORED_FAILURE_COUNT],
            "2"
        );
    }

    fn api_error(code: u16, reason: &str) -> kube::Error {
        kube::Error::Api(
            kube::core::Status::failure("x", reason)
                .with_code(code)
                .boxed(),
        )
    }

    #[tokio::test]
    async fn generated_name_collision_is_retried_once() {
        use std::cell::Cell;
        // AlreadyExists once, then success: one retry, one pod.
        let calls = Cell::new(0);
        let r = retry_generated_name(|| {
            calls.set(calls.get() + 1);
            let n = calls.get();
            async move {
                if n == 1 {
                    Err(api_error(409, "AlreadyExists"))
                } else {
                    Ok(n)
                }
            }
        })
        .await;
        assert_eq!((r.ok(), calls.get()), (Some(2), 2));
        // Other errors (a conflict, a quota rejection) are not retried here.
        for (code, reason) in [(409, "Conflict"), (403, "Forbidden")] {
            let calls = Cell::new(0);
            let r: Result<(), _> = retry_generated_name(|| {
                calls.set(calls.get() + 1);
                async move { Err(api_error(code, reason)) }
            })
            .await;
            assert!(r.is_err());
            assert_eq!(calls.get(), 1);
        }
        // Never more than one retry.
        let calls = Cell::new(0);
        let r: Result<(), _> = retry_generated_name(|| {
            calls.set(calls.get() + 1);
            async { Err(api_error(409, "AlreadyExists")) }
        })
        .await;
        assert!(r.is_err());
        assert_eq!(calls.get(), 2);
    }

    #[test]
    fn jr12_long_names_shorten_the_job_part() {
        let long = "a".repeat(63);
        let g = indexed_generate_name(&long, 123);
        assert_eq!(g.len(), 58);
        assert!(g.ends_with("-123-"));
        assert_eq!(indexed_generate_name("short", 7), "short-7-");
    }
}
