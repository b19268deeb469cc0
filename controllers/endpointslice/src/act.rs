//! Performs one address type's writes (ES-14 step 10): creates, then updates, then deletes; the
//! first failure stops the rest. Every write is tracked (ES-15) and counted.

use crate::Error;
use crate::endpoints::ANNOTATION_TRIGGER_TIME;
use crate::metrics::Metrics;
use crate::plan::{Writes, name_of};
use crate::tracker::{SliceTracker, rfc3339_nano};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::jiff::Timestamp;
use shared::api::apierr::is_namespace_terminating;
use shared::api::writer::{Delete, Writer};
use std::sync::Arc;

/// What the writes need besides the slices.
pub struct Act<'a> {
    pub writer: &'a Writer,
    pub tracker: &'a SliceTracker,
    pub metrics: &'a Metrics,
    /// `namespace/name` of the owner, for messages.
    pub owner: &'a str,
    pub namespace: &'a str,
    /// No creates for an owner being deleted.
    pub owner_deleting: bool,
}

/// ES-17: the trigger-time annotation, or none.
fn annotate(slice: &mut EndpointSlice, trigger: Option<Timestamp>) {
    let annotations = slice
        .metadata
        .annotations
        .get_or_insert_with(Default::default);
    match trigger {
        Some(t) => {
            annotations.insert(ANNOTATION_TRIGGER_TIME.into(), rfc3339_nano(t));
        }
        None => {
            annotations.remove(ANNOTATION_TRIGGER_TIME);
        }
    }
}

impl Act<'_> {
    pub async fn write(&self, writes: Writes, trigger: Option<Timestamp>) -> Result<(), Error> {
        if !self.owner_deleting {
            for mut slice in writes.create {
                annotate(&mut slice, trigger);
                match self.writer.create(self.namespace, &slice).await {
                    Ok(created) => {
                        self.tracker.update(&created);
                        self.metrics.change("create");
                    }
                    // The namespace is going away: nothing more to do here.
                    Err(e) if is_namespace_terminating(&e) => return Ok(()),
                    Err(e) => {
                        return Err(crate::api(format!(
                            "failed to create EndpointSlice for Service {}",
                            self.owner
                        ))(e));
                    }
                }
            }
        }
        for mut slice in writes.update {
            annotate(&mut slice, trigger);
            let updated = self
                .writer
                .replace(&slice)
                .await
                .map_err(crate::api(format!(
                    "failed to update {} EndpointSlice for Service {}",
                    name_of(&slice),
                    self.owner
                )))?;
            self.tracker.update(&updated);
            self.metrics.change("update");
        }
        self.delete(&writes.delete).await
    }

    pub async fn delete(&self, slices: &[Arc<EndpointSlice>]) -> Result<(), Error> {
        for slice in slices {
            self.writer
                .delete::<EndpointSlice>(self.namespace, name_of(slice), Delete::default())
                .await
                .map_err(crate::api(format!(
                    "failed to delete {} EndpointSlice for Service {}",
                    name_of(slice),
                    self.owner
                )))?;
            self.tracker.expect_deletion(slice);
            self.metrics.change("delete");
        }
        Ok(())
    }
}
