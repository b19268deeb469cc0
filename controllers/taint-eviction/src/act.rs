//! TE-6/TE-7: mark a pod with `DisruptionTarget` and delete it.

use k8s_openapi::api::core::v1::PodCondition;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use serde_json::json;
use shared::api::apierr::{Classify, ErrorKind};
use shared::api::writer::{Delete, PatchKind, Writer};
use shared::cache::pod::Pod;

pub const DISRUPTION_TARGET: &str = "DisruptionTarget";
pub const REASON: &str = "DeletionByTaintManager";
pub const MESSAGE: &str = "Taint manager: deleting due to NoExecute taint";

#[derive(Debug, thiserror::Error)]
pub enum ActError {
    // The server's message, as Go prints it (an event carries this text).
    #[error("reading pod: {}", shared::api::apierr::message(.0))]
    Get(#[source] kube::Error),
    #[error("adding the DisruptionTarget condition: {}", shared::api::apierr::message(.0))]
    Patch(#[source] kube::Error),
    #[error("deleting: {}", shared::api::apierr::message(.0))]
    Delete(#[source] kube::Error),
}

impl ActError {
    fn source(&self) -> &kube::Error {
        match self {
            ActError::Get(e) | ActError::Patch(e) | ActError::Delete(e) => e,
        }
    }

    /// A short label for metrics: the HTTP code, or the kind of client-side failure.
    pub fn reason(&self) -> String {
        shared::api::apierr::error_reason(self.source())
    }
}

impl Classify for ActError {
    fn kind(&self) -> ErrorKind {
        self.source().kind()
    }
}

#[derive(Debug, PartialEq, Eq)]
pub enum Evicted {
    Deleted,
    /// The pod is gone, or the name now belongs to another pod: nothing to do.
    Gone,
}

/// 404: deleted. Replaced by another pod of the same name: the delete's UID precondition fails
/// with 409, the patch carrying the UID with 422 on metadata.uid.
fn is_gone(e: &kube::Error) -> bool {
    shared::api::apierr::is_not_found(e)
        || shared::api::apierr::is_conflict(e)
        || shared::api::apierr::is_uid_mismatch(e)
}

/// Whether `pod` already carries our exact condition (then no status write is needed).
pub fn has_condition(pod: &Pod) -> bool {
    pod.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|cs| {
            cs.iter().any(|c| {
                c.type_ == DISRUPTION_TARGET
                    && c.status == "True"
                    && c.reason.as_deref() == Some(REASON)
                    && c.message.as_deref() == Some(MESSAGE)
            })
        })
}

/// The condition as upstream writes it (pod observed-generation tracking is GA in 1.37).
pub fn condition(pod: &Pod, now: Timestamp) -> PodCondition {
    let existing = pod
        .status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .and_then(|cs| cs.iter().find(|c| c.type_ == DISRUPTION_TARGET));
    // The transition time moves only when the status changes.
    let last_transition = match existing {
        Some(c) if c.status == "True" => c.last_transition_time.clone(),
        _ => Some(Time(now)),
    };
    PodCondition {
        type_: DISRUPTION_TARGET.into(),
        status: "True".into(),
        reason: Some(REASON.into()),
        message: Some(MESSAGE.into()),
        last_transition_time: last_transition,
        observed_generation: pod.metadata.generation,
        last_probe_time: None,
    }
}

/// GETs the pod, checks it is still the one we timed (`uid`), writes the condition with a
/// strategic-merge patch of `pods/status` (merged by condition type; never server-side apply,
/// which fails on pods with duplicate list keys), then deletes it with a UID precondition.
pub async fn evict(
    writer: &Writer,
    namespace: &str,
    name: &str,
    uid: &str,
    now: Timestamp,
) -> Result<Evicted, ActError> {
    let pod = match writer.get::<Pod>(namespace, name).await {
        Err(e) if shared::api::apierr::is_not_found(&e) => return Ok(Evicted::Gone),
        Err(e) => return Err(ActError::Get(e)),
        Ok(p) if p.metadata.uid.as_deref() != Some(uid) => return Ok(Evicted::Gone),
        Ok(p) => p,
    };
    if !has_condition(&pod) {
        let patch = json!({
            // The UID in the patch makes it a precondition: a replaced pod fails validation.
            "metadata": {"uid": uid},
            "status": {"conditions": [condition(&pod, now)]}
        });
        match writer
            .patch_status::<Pod>(namespace, name, PatchKind::Strategic, patch)
            .await
        {
            Ok(_) => {}
            Err(e) if is_gone(&e) => return Ok(Evicted::Gone),
            Err(e) => return Err(ActError::Patch(e)),
        }
    }
    match writer
        .delete::<Pod>(namespace, name, Delete::with_uid(uid))
        .await
    {
        Ok(_) => Ok(Evicted::Deleted),
        Err(e) if is_gone(&e) => Ok(Evicted::Gone),
        Err(e) => Err(ActError::Delete(e)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use shared::cache::pod::PodStatus;

    fn pod_with(conds: Vec<PodCondition>, generation: Option<i64>) -> Pod {
        Pod {
            metadata: kube::api::ObjectMeta {
                generation,
                ..Default::default()
            },
            spec: None,
            status: Some(PodStatus {
                conditions: Some(conds),
                ..Default::default()
            }),
        }
    }

    #[test]
    fn condition_matches_upstream_and_keeps_transition_time() {
        let now = Timestamp::from_second(1000).unwrap();
        let fresh = condition(&pod_with(vec![], Some(3)), now);
        assert_eq!(fresh.type_, "DisruptionTarget");
        assert_eq!(fresh.reason.as_deref(), Some("DeletionByTaintManager"));
        assert_eq!(
            fresh.message.as_deref(),
            Some("Taint manager: deleting due to NoExecute taint")
        );
        assert_eq!(fresh.observed_generation, Some(3));
        assert_eq!(fresh.last_transition_time, Some(Time(now)));
        let earlier = Time(Timestamp::from_second(10).unwrap());
        let other = PodCondition {
            type_: "DisruptionTarget".into(),
            status: "True".into(),
            reason: Some("EvictionByEvictionAPI".into()),
            last_transition_time: Some(earlier.clone()),
            ..Default::default()
        };
        let p = pod_with(vec![other], None);
        assert!(!has_condition(&p));
        assert_eq!(condition(&p, now).last_transition_time, Some(earlier));
        assert!(has_condition(&pod_with(vec![fresh], Some(3))));
    }
}
