//! JR-63: claiming pods by `spec.selector` (upstream `ControllerRefManager.ClaimPods` with the
//! Job's finalizer). Kept here until `shared::claim` provides the manager.

use crate::sync::Jobs;
use crate::{Error, act, api, pods};
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::Pod;
use kube::ResourceExt;
use shared::informers::{INDEX_CONTROLLER_UID, object_key};
use std::sync::Arc;

impl Jobs {
    /// The Job's pods, adopting matching orphans and releasing owned pods that stopped matching.
    /// Adopted pods carry the finalizer in the returned copies.
    pub(crate) async fn claim_pods(&self, job: &Job) -> Result<Vec<Arc<Pod>>, Error> {
        let uid = crate::sync::uid_of(job);
        let ns = job.namespace().unwrap_or_default();
        let selector = job.spec.as_ref().and_then(|s| s.selector.as_ref());
        let matches = |p: &Pod| {
            shared::selector::matches(selector, p.metadata.labels.as_ref()).unwrap_or(false)
        };
        let deleting = job.metadata.deletion_timestamp.is_some();
        let mut claimed = Vec::new();
        for p in self.pods.by_index(INDEX_CONTROLLER_UID, &uid) {
            if matches(&p) || deleting {
                claimed.push(p);
            } else {
                act::release_pod(&self.writer, job, &p)
                    .await
                    .map_err(api(format!("releasing pod {}", object_key(p.as_ref()))))?;
            }
        }
        let candidates: Vec<Arc<Pod>> = self
            .pods
            .by_index(crate::handlers::INDEX_ORPHAN_NAMESPACE, &ns)
            .into_iter()
            .filter(|p| !pods::deleting(p) && matches(p))
            .collect();
        if candidates.is_empty() || deleting {
            return Ok(claimed);
        }
        // Adopt only if a live read shows the same Job, not being deleted.
        let fresh = act::get_job(&self.writer, &ns, &job.name_any())
            .await
            .map_err(api(format!("re-reading job {ns}/{}", job.name_any())))?;
        if fresh.metadata.uid != job.metadata.uid || fresh.metadata.deletion_timestamp.is_some() {
            return Ok(claimed);
        }
        for p in candidates {
            match act::adopt_pod(&self.writer, job, &p).await {
                Ok(()) => {
                    let mut copy = (*p).clone();
                    if !pods::has_tracking_finalizer(&copy) {
                        copy.metadata
                            .finalizers
                            .get_or_insert_with(Vec::new)
                            .push(pods::TRACKING_FINALIZER.into());
                    }
                    claimed.push(Arc::new(copy));
                }
                Err(e) if shared::apierr::is_not_found(&e) => {}
                Err(e) => return Err(api(format!("adopting pod {}", object_key(p.as_ref())))(e)),
            }
        }
        Ok(claimed)
    }
}
