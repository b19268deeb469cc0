//! JR-63: claiming pods by `spec.selector` with the Job's tracking finalizer, as upstream
//! `ControllerRefManager.ClaimPods` (the decisions are `shared::runtime::claim`'s).

use crate::sync::JobController;
use crate::{Error, act, api, pods};
use k8s_openapi::api::batch::v1::Job;
use kube::ResourceExt;
use shared::cache::informers::INDEX_CONTROLLER_UID;
use shared::cache::pod::Pod;
use shared::meta::keys::object_key;
use shared::runtime::claim;
use std::sync::Arc;

impl JobController {
    /// The Job's pods, adopting matching orphans and releasing owned pods that stopped matching.
    /// Adopted pods carry the finalizer in the returned copies. As upstream, every write is
    /// tried and the first failure then fails the sync (retried with backoff).
    pub(crate) async fn claim_pods(&self, job: &Job) -> Result<Vec<Arc<Pod>>, Error> {
        let uid = crate::sync::uid_of(job);
        let ns = job.namespace().unwrap_or_default();
        let selector = job.spec.as_ref().and_then(|s| s.selector.as_ref());
        // A selector that does not parse would otherwise release every pod: fail first, as
        // upstream's `LabelSelectorAsSelector`.
        shared::meta::selector::matches(selector, None).map_err(|e| Error::Claim(e.to_string()))?;
        let matches = |p: &Pod| {
            shared::meta::selector::matches(selector, p.metadata.labels.as_ref()).unwrap_or(false)
        };
        let candidates = self
            .pods
            .by_index(INDEX_CONTROLLER_UID, &uid)
            .into_iter()
            .chain(
                self.pods
                    .by_index(shared::cache::informers::INDEX_ORPHAN_NAMESPACE, &ns),
            );
        let claims = claim::partition::<Pod, _>(&job.metadata, candidates, matches);
        let mut failed: Option<Error> = None;
        for p in &claims.release {
            if let Err(e) = act::release_pod(&self.writer, job, p).await
                && !claim::release_error_ignored(&e)
            {
                let e = api(format!("releasing pod {}", object_key(p.as_ref())))(e);
                failed.get_or_insert(e);
            }
        }
        let mut claimed = claims.owned;
        if !claims.adopt.is_empty() {
            // Adopt only if a live read shows the same Job, not being deleted (#42639).
            let fresh = act::get_job(&self.writer, &ns, &job.name_any())
                .await
                .map_err(api(format!("re-reading job {ns}/{}", job.name_any())))?;
            claim::can_adopt(job, &fresh).map_err(|e| Error::Claim(e.to_string()))?;
            for p in claims.adopt {
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
                    Err(e) if claim::adopt_error_ignored(&e) => {}
                    Err(e) => {
                        let e = api(format!("adopting pod {}", object_key(p.as_ref())))(e);
                        failed.get_or_insert(e);
                    }
                }
            }
        }
        match failed {
            Some(e) => Err(e),
            None => Ok(claimed),
        }
    }
}
