//! The controller's API requests, every one through the writer seam: Job creation with the
//! AlreadyExists recovery (CR-20, JB-8), live reads the caches cannot serve (CR-27, CR-29), Job
//! deletion with Background propagation (CR-27 Replace, CR-32 history) and the status write
//! (CR-2). Events and memory stay with the sync; these only send and classify.

use k8s_openapi::api::batch::v1::{CronJob, Job};
use shared::api::apierr::{is_already_exists, is_namespace_terminating};
use shared::api::writer::{Delete, Writer};

/// CR-29: the CronJob as the API server has it now.
pub async fn read_cronjob(
    writer: &Writer,
    namespace: &str,
    name: &str,
) -> Result<CronJob, kube::Error> {
    writer.get::<CronJob>(namespace, name).await
}

/// CR-27, CR-29: a Job as the API server has it now.
pub async fn read_job(writer: &Writer, namespace: &str, name: &str) -> Result<Job, kube::Error> {
    writer.get::<Job>(namespace, name).await
}

/// `deleteJob`: a delete with Background propagation (the Job's pods go with it).
pub async fn delete_job(writer: &Writer, job: &Job) -> Result<(), kube::Error> {
    let namespace = job.metadata.namespace.as_deref().unwrap_or_default();
    let name = job.metadata.name.as_deref().unwrap_or_default();
    let opts = Delete {
        propagation: Some("Background"),
        ..Delete::default()
    };
    writer.delete::<Job>(namespace, name, opts).await
}

/// CR-2: one status write, a PUT of the status subresource carrying the resourceVersion the sync
/// read (the role grants `update` only): a concurrent change fails it and the sync retries.
/// Returns what the API server stored.
pub async fn write_status(writer: &Writer, cj: &CronJob) -> Result<CronJob, kube::Error> {
    writer.replace_status(cj).await
}

/// What a create came to.
#[derive(Debug)]
pub enum Created {
    /// The API server created it (as returned).
    New(Job),
    /// JB-8: a Job of that name already existed in the CronJob's namespace (as read); whether it
    /// is ours and unlisted is the caller's to decide.
    Existing(Job),
}

#[derive(Debug, thiserror::Error)]
pub enum CreateError {
    /// The namespace is being deleted (no `FailedCreate` event).
    #[error("{}", shared::api::apierr::message(.0))]
    NamespaceTerminating(#[source] kube::Error),
    /// The create failed (`FailedCreate`).
    #[error("{}", shared::api::apierr::message(.0))]
    Failed(#[source] kube::Error),
    /// The create found the name taken and reading that Job failed.
    #[error("{}", shared::api::apierr::message(.0))]
    ReadExisting(#[source] kube::Error),
}

/// CR-20: creates `want` in `namespace`; on AlreadyExists reads the Job of that name there (JB-8:
/// the CronJob's namespace, not the empty one upstream used before 1.37).
pub async fn create_job(
    writer: &Writer,
    namespace: &str,
    want: &Job,
) -> Result<Created, CreateError> {
    match writer.create(namespace, want).await {
        Ok(created) => Ok(Created::New(created)),
        Err(e) if is_namespace_terminating(&e) => Err(CreateError::NamespaceTerminating(e)),
        Err(e) if is_already_exists(&e) => {
            let name = want.metadata.name.as_deref().unwrap_or_default();
            read_job(writer, namespace, name)
                .await
                .map(Created::Existing)
                .map_err(CreateError::ReadExisting)
        }
        Err(e) => Err(CreateError::Failed(e)),
    }
}
