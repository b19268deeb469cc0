//! The controller's writes, through the writer seam: the object's metadata (finalizer, owner
//! reference) and status, the node's cordon and conditions, the pods' conditions, evictions and
//! NM-18's deletions. Every patch touches only fields the controller owns.

use crate::types::NodeMaintenance;
use k8s_openapi::api::core::v1::{Node, PodCondition};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use serde_json::{Value, json};
use shared::api::writer::{Delete, PatchKind, Writer};
use shared::cache::pod::Pod;

/// NM-3/NM-5/NM-1: the object's finalizers and owner references in one merge patch, guarded by
/// the resourceVersion it was computed from (both lists are replaced whole).
pub async fn patch_meta(
    writer: &Writer,
    nm: &NodeMaintenance,
    finalizers: &[String],
    owners: &[OwnerReference],
) -> Result<NodeMaintenance, kube::Error> {
    let patch = json!({"metadata": {
        "resourceVersion": nm.metadata.resource_version,
        "finalizers": finalizers,
        "ownerReferences": owners,
    }});
    let name = nm.metadata.name.as_deref().unwrap_or_default();
    writer
        .patch::<NodeMaintenance>("", name, PatchKind::Merge, patch)
        .await
}

/// One merge patch of the status subresource (the diff from the stored status).
pub async fn patch_status(
    writer: &Writer,
    name: &str,
    status_patch: Value,
) -> Result<NodeMaintenance, kube::Error> {
    writer
        .patch_status::<NodeMaintenance>(
            "",
            name,
            PatchKind::Merge,
            json!({"status": status_patch}),
        )
        .await
}

/// NM-6/NM-7/NM-20: a guarded merge patch of the node (the patch carries the resourceVersion).
pub async fn patch_node(writer: &Writer, name: &str, patch: Value) -> Result<Node, kube::Error> {
    writer
        .patch::<Node>("", name, PatchKind::Merge, patch)
        .await
}

/// NM-23: a strategic-merge patch of `nodes/status` (conditions merge by type).
pub async fn patch_node_status(
    writer: &Writer,
    name: &str,
    patch: Value,
) -> Result<Node, kube::Error> {
    writer
        .patch_status::<Node>("", name, PatchKind::Strategic, patch)
        .await
}

/// NM-12/NM-18: one pod condition by a strategic-merge patch of `pods/status` (never
/// server-side apply); the UID in the patch makes a replaced pod fail validation.
pub async fn set_pod_condition(
    writer: &Writer,
    namespace: &str,
    name: &str,
    uid: &str,
    condition: &PodCondition,
) -> Result<(), kube::Error> {
    let patch = json!({"metadata": {"uid": uid}, "status": {"conditions": [condition]}});
    writer
        .patch_status::<Pod>(namespace, name, PatchKind::Strategic, patch)
        .await
        .map(drop)
}

/// NM-13: `POST pods/<name>/eviction` with the UID precondition and, when set, the grace period.
pub async fn evict(
    writer: &Writer,
    namespace: &str,
    name: &str,
    uid: &str,
    grace_period_seconds: Option<i64>,
) -> Result<Value, kube::Error> {
    let mut options = json!({"preconditions": {"uid": uid}});
    if let Some(g) = grace_period_seconds {
        options["gracePeriodSeconds"] = json!(g);
    }
    writer.evict(namespace, name, Some(options)).await
}

/// NM-18: DELETE with the UID precondition and the spec's grace period (or the pod's).
pub async fn delete_pod(
    writer: &Writer,
    namespace: &str,
    name: &str,
    uid: &str,
    grace_period_seconds: Option<i64>,
) -> Result<(), kube::Error> {
    let opts = Delete {
        grace_period_seconds,
        ..Delete::with_uid(uid)
    };
    writer.delete::<Pod>(namespace, name, opts).await
}
