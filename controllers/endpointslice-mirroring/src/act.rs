//! Performs an Endpoints' writes through the writer seam [reconciler.go: finalize,
//! deleteEndpoints]; every write is tracked (MR-7) and counted.

use crate::Error;
use crate::metrics::Metrics;
use crate::plan::Plan;
use endpointslice::plan::name_of;
use endpointslice::tracker::SliceTracker;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use shared::api::apierr::is_namespace_terminating;
use shared::api::writer::{Delete, Writer};
use std::sync::Arc;

pub struct Act<'a> {
    pub writer: &'a Writer,
    pub tracker: &'a SliceTracker,
    pub metrics: &'a Metrics,
    /// `namespace/name` of the Endpoints.
    pub owner: &'a str,
    pub namespace: &'a str,
}

impl Act<'_> {
    /// MR-6 [finalize]: creates (none for an Endpoints being deleted), then updates, then
    /// deletes; the first failure stops the rest.
    pub async fn finalize(&self, plan: Plan, owner_deleting: bool) -> Result<(), Error> {
        for slice in &plan.track {
            if !self.tracker.has(slice) {
                self.tracker.update(slice);
            }
        }
        if !owner_deleting {
            for slice in &plan.create {
                match self.writer.create(self.namespace, slice).await {
                    Ok(created) => {
                        self.tracker.update(&created);
                        self.metrics.change("create");
                    }
                    // Creates will go on failing while the namespace terminates: drop the key.
                    Err(e) if is_namespace_terminating(&e) => return Ok(()),
                    Err(e) => {
                        return Err(crate::api(format!(
                            "failed to create EndpointSlice for Endpoints {}",
                            self.owner
                        ))(e));
                    }
                }
            }
        }
        for slice in &plan.update {
            let updated = self
                .writer
                .replace(slice)
                .await
                .map_err(crate::api(format!(
                    "failed to update {} EndpointSlice for Endpoints {}",
                    name_of(slice),
                    self.owner
                )))?;
            self.tracker.update(&updated);
            self.metrics.change("update");
        }
        for slice in &plan.delete {
            self.writer
                .delete::<EndpointSlice>(self.namespace, name_of(slice), Delete::default())
                .await
                .map_err(crate::api(format!(
                    "failed to delete {} EndpointSlice for Endpoints {}",
                    name_of(slice),
                    self.owner
                )))?;
            self.tracker.expect_deletion(slice);
            self.metrics.change("delete");
        }
        Ok(())
    }

    /// MR-1 [deleteEndpoints]: every mirrored slice goes; a failure does not stop the others
    /// and the first is reported. Upstream forgets the owner and expects nothing; we record the
    /// deletions so that a cache still holding them reads as stale (MR-7) rather than being
    /// reused by a sync that mirrors again. Upstream counts none of these in `changes`.
    pub async fn delete_all(&self, slices: &[Arc<EndpointSlice>]) -> Result<(), Error> {
        let mut failed = Vec::new();
        for slice in slices {
            match self
                .writer
                .delete::<EndpointSlice>(self.namespace, name_of(slice), Delete::default())
                .await
            {
                Ok(_) => self.tracker.expect_deletion(slice),
                Err(e) if shared::api::apierr::is_not_found(&e) => {}
                Err(e) => failed.push(e),
            }
        }
        match failed.first() {
            None => Ok(()),
            Some(first) => Err(Error::Sync(format!(
                "error(s) deleting {}/{} EndpointSlices for {} Endpoints, including: {first}",
                failed.len(),
                slices.len(),
                self.owner
            ))),
        }
    }
}
