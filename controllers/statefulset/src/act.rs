//! The StatefulSet controller's API requests, through the runtime's writer seam. Bodies are built
//! by [`crate::identity`] and [`crate::revision`]; this module only sends them.

use crate::identity::{self, POD_INDEX_LABEL, POD_NAME_LABEL};
use crate::model::StatefulSet;
use k8s_openapi::api::apps::v1::{ControllerRevision, StatefulSetStatus};
use k8s_openapi::api::core::v1::{PersistentVolumeClaim, Pod as FullPod};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use serde_json::{Value, json};
use shared::api::writer::{Call, Delete, PatchKind, Target, Writer};
use shared::cache::pod::Pod;
use shared::meta::refs::controller_ref;
use shared::runtime::claim;

/// Upstream's `maxUpdateRetries`-like bound for conflict retries of one write.
const CONFLICT_RETRIES: usize = 5;

fn parse<K: serde::de::DeserializeOwned>(v: Value) -> Result<K, kube::Error> {
    serde_json::from_value(v).map_err(kube::Error::SerdeError)
}

/// Creates a pod from its JSON body (ST-8: the template's fields as served), returning the
/// cached form of what the API server stored.
pub async fn create_pod(w: &Writer, ns: &str, body: Value) -> Result<Pod, kube::Error> {
    parse(
        w.call(Call::Create(Target::of::<FullPod>(ns, ""), body))
            .await?,
    )
}

pub async fn create_claim(
    w: &Writer,
    ns: &str,
    body: Value,
) -> Result<PersistentVolumeClaim, kube::Error> {
    parse(
        w.call(Call::Create(
            Target::of::<PersistentVolumeClaim>(ns, ""),
            body,
        ))
        .await?,
    )
}

/// ST-23: a plain DELETE (never forced, no precondition, as upstream). Returns the
/// resourceVersion of the pod the API server answered with (graceful deletion: the pod with its
/// deletion timestamp), for read-your-writes.
pub async fn delete_pod(w: &Writer, ns: &str, name: &str) -> Result<Option<String>, kube::Error> {
    let answer = w
        .call(Call::Delete {
            target: Target::of::<FullPod>(ns, name),
            uid: None,
            resource_version: None,
            propagation: None,
        })
        .await?;
    Ok((answer["kind"] == "Pod")
        .then(|| {
            answer["metadata"]["resourceVersion"]
                .as_str()
                .map(String::from)
        })
        .flatten())
}

/// ST-34: the claim's owner references set to `refs(claim)`, by a full update of a live read
/// (the role grants PVCs update, not patch; the live JSON keeps fields k8s-openapi does not
/// know), retried on conflict.
pub async fn set_claim_refs(
    w: &Writer,
    ns: &str,
    name: &str,
    refs: impl Fn(&PersistentVolumeClaim) -> Vec<OwnerReference>,
) -> Result<PersistentVolumeClaim, kube::Error> {
    let refs = &refs;
    shared::api::retry::on_conflict(CONFLICT_RETRIES, |_| async move {
        let mut live: Value = w
            .call(Call::Get(Target::of::<PersistentVolumeClaim>(ns, name)))
            .await?;
        let typed: PersistentVolumeClaim = parse(live.clone())?;
        live["metadata"]["ownerReferences"] = json!(refs(&typed));
        parse(
            w.call(Call::Replace(
                Target::of::<PersistentVolumeClaim>(ns, name),
                live,
            ))
            .await?,
        )
    })
    .await
}

/// ST-10: repairs a pod's identity labels and claim volumes by a full update of a live read
/// (the cached pod lacks most of the object), retried on conflict.
pub async fn repair_pod(w: &Writer, set: &StatefulSet, name: &str) -> Result<Pod, kube::Error> {
    let ns = set.namespace();
    shared::api::retry::on_conflict(CONFLICT_RETRIES, |_| async move {
        let mut pod: Value = w.call(Call::Get(Target::of::<FullPod>(ns, name))).await?;
        let ord = identity::ordinal(name);
        let labels = &mut pod["metadata"]["labels"];
        if !labels.is_object() {
            *labels = json!({});
        }
        labels[POD_NAME_LABEL] = json!(name);
        labels[POD_INDEX_LABEL] = json!(ord.to_string());
        let body = identity::with_claim_volumes(set, ord, pod);
        parse(
            w.call(Call::Replace(Target::of::<FullPod>(ns, name), body))
                .await?,
        )
    })
    .await
}

/// ST-14 (b): a rollback bumps the old revision's number; nothing else is ever modified.
pub async fn set_revision_number(
    w: &Writer,
    rev: &ControllerRevision,
    revision: i64,
) -> Result<ControllerRevision, kube::Error> {
    let m = &rev.metadata;
    w.patch::<ControllerRevision>(
        m.namespace.as_deref().unwrap_or_default(),
        m.name.as_deref().unwrap_or_default(),
        PatchKind::Merge,
        json!({"metadata": {"resourceVersion": m.resource_version}, "revision": revision}),
    )
    .await
}

pub async fn delete_revision(w: &Writer, ns: &str, name: &str) -> Result<(), kube::Error> {
    w.delete::<ControllerRevision>(ns, name, Delete::default())
        .await
}

/// A live read of the set, for the adoption re-check (ST-4).
pub async fn get_set(w: &Writer, ns: &str, name: &str) -> Result<StatefulSet, kube::Error> {
    w.get::<StatefulSet>(ns, name).await
}

/// ST-4: adoption and release of pods and revisions (upstream's strategic-merge patches).
pub async fn adopt<K: kube::Resource<DynamicType = ()> + serde::de::DeserializeOwned>(
    w: &Writer,
    set: &StatefulSet,
    ns: &str,
    name: &str,
    uid: &str,
) -> Result<(), kube::Error> {
    let patch = claim::adopt_patch(&controller_ref(set), uid, &[]);
    w.call(Call::Patch(
        Target::of::<K>(ns, name),
        PatchKind::Strategic,
        patch,
    ))
    .await
    .map(drop)
}

pub async fn release<K: kube::Resource<DynamicType = ()>>(
    w: &Writer,
    set: &StatefulSet,
    ns: &str,
    name: &str,
    uid: &str,
) -> Result<(), kube::Error> {
    let patch = claim::release_patch(set.uid(), uid, &[]);
    w.call(Call::Patch(
        Target::of::<K>(ns, name),
        PatchKind::Strategic,
        patch,
    ))
    .await
    .map(drop)
}

/// ST-42: the status subresource by PUT (the role grants `statefulsets/status` update only),
/// guarded by the cached resourceVersion; the API server keeps spec and metadata from storage.
pub async fn write_status(
    w: &Writer,
    set: &StatefulSet,
    status: &StatefulSetStatus,
) -> Result<StatefulSet, kube::Error> {
    let mut body = set.clone();
    body.status = Some(status.clone());
    w.replace_status(&body).await
}

/// ST-15: `template` as the API server defaults it: a dry-run PodTemplate create in
/// `namespace` (nothing is stored).
pub async fn defaulted_template(
    w: &Writer,
    namespace: &str,
    template: Value,
) -> Result<Value, kube::Error> {
    let body = json!({
        "apiVersion": "v1", "kind": "PodTemplate",
        "metadata": {"generateName": "pilothouse-revision-defaults-"},
        "template": template,
    });
    // Kept as JSON: a typed round trip could drop what the comparison must see.
    let target = Target::of::<k8s_openapi::api::core::v1::PodTemplate>(namespace, "");
    let created = w.call(Call::DryRunCreate(target, body)).await?;
    Ok(created.get("template").cloned().unwrap_or(Value::Null))
}
