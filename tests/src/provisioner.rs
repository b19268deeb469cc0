//! Dynamic storage for the local control plane: a small external provisioner run as tokio tasks
//! in the test process. The plane has no CSI driver or storage backend, so StatefulSet
//! `volumeClaimTemplates` would otherwise leave claims Pending and their pods unschedulable.
//!
//! It keeps a default StorageClass [`CLASS`] (provisioner [`PROVISIONER`], Immediate binding,
//! reclaim Delete), creates a hostPath PersistentVolume pre-bound (`claimRef`) to each unbound
//! claim of that class, and deletes the volumes it made once they are Released.
//! kube-controller-manager's PV binder does the binding; with an external provisioner the
//! Delete reclaim policy is ours to carry out. kwok never mounts anything, so the hostPath
//! directories are never created.

use crate::cluster::Cluster;
use anyhow::Result;
use futures::StreamExt;
use k8s_openapi::api::core::v1::{
    HostPathVolumeSource, ObjectReference, PersistentVolume, PersistentVolumeClaim,
    PersistentVolumeSpec,
};
use k8s_openapi::api::storage::v1::StorageClass;
use kube::api::{Api, DeleteParams, ObjectMeta, PostParams};
use kube::runtime::controller::{Action, Controller};
use kube::runtime::watcher;
use kube::{Client, ResourceExt};
use std::collections::BTreeMap;
use std::sync::{Arc, OnceLock};
use std::time::Duration;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

/// The StorageClass the provisioner serves; the cluster's default class.
pub const CLASS: &str = "pilothouse-test";
/// The provisioner name in the class and in the volumes' `pv.kubernetes.io/provisioned-by`.
pub const PROVISIONER: &str = "pilothouse.test/provisioner";

/// The field manager of the objects it writes.
const MANAGER: &str = "pilothouse-test-provisioner";
const PROVISIONED_BY: &str = "pv.kubernetes.io/provisioned-by";
const DEFAULT_CLASS: &str = "storageclass.kubernetes.io/is-default-class";
/// Still honoured by kube-controller-manager ahead of `spec.storageClassName`.
const BETA_CLASS: &str = "volume.beta.kubernetes.io/storage-class";

/// A running provisioner; stops when its token is cancelled or when dropped.
pub struct Provisioner {
    cancel: CancellationToken,
    ready: watch::Receiver<bool>,
}

/// Starts a provisioner on the current tokio runtime (a multi-thread one keeps it running while
/// the caller blocks elsewhere).
pub fn start(client: Client) -> Provisioner {
    start_with(client, CancellationToken::new())
}

/// As [`start`], also stopping when `cancel` is cancelled.
pub fn start_with(client: Client, cancel: CancellationToken) -> Provisioner {
    // A child token: dropping the handle must not cancel the caller's token.
    let cancel = cancel.child_token();
    let (ready_tx, ready) = watch::channel(false);
    tokio::spawn(run(client, cancel.clone(), ready_tx));
    Provisioner { cancel, ready }
}

/// For `harness::main`: starts the suite's provisioner on `rt` and waits for its StorageClass;
/// it then runs until the process exits.
pub fn start_for_suite(rt: &tokio::runtime::Runtime, cluster: &Cluster) -> Result<()> {
    static SUITE: OnceLock<Provisioner> = OnceLock::new();
    let p = rt.block_on(async {
        let p = start(cluster.client().await?);
        let ready = tokio::time::timeout(Duration::from_secs(60), p.ready()).await;
        anyhow::ensure!(
            ready == Ok(true),
            "StorageClass {CLASS} not created (errors above)"
        );
        Ok::<_, anyhow::Error>(p)
    })?;
    let _ = SUITE.set(p);
    Ok(())
}

impl Provisioner {
    /// Waits until the StorageClass exists; false if the provisioner stopped first.
    pub async fn ready(&self) -> bool {
        let mut r = self.ready.clone();
        r.wait_for(|ok| *ok).await.is_ok()
    }

    pub fn stop(&self) {
        self.cancel.cancel();
    }
}

impl Drop for Provisioner {
    fn drop(&mut self) {
        self.cancel.cancel();
    }
}

async fn run(client: Client, cancel: CancellationToken, ready: watch::Sender<bool>) {
    tokio::select! {
        _ = cancel.cancelled() => return,
        _ = ensure_class(&client) => {}
    }
    let _ = ready.send(true);
    let ctx = Arc::new(client.clone());
    let claims = Controller::new(
        Api::<PersistentVolumeClaim>::all(client.clone()),
        watcher::Config::default(),
    )
    .graceful_shutdown_on(cancel.clone().cancelled_owned())
    .run(provision, retry, ctx.clone())
    .for_each(|_| async {});
    let volumes = Controller::new(
        Api::<PersistentVolume>::all(client),
        watcher::Config::default(),
    )
    .graceful_shutdown_on(cancel.clone().cancelled_owned())
    .run(reclaim, retry, ctx)
    .for_each(|_| async {});
    futures::join!(claims, volumes);
}

/// Creates the class, retrying until the API server takes it (an existing one is kept as is).
async fn ensure_class(client: &Client) {
    let class = StorageClass {
        metadata: ObjectMeta {
            name: Some(CLASS.into()),
            annotations: Some(BTreeMap::from([(DEFAULT_CLASS.into(), "true".into())])),
            ..Default::default()
        },
        provisioner: PROVISIONER.into(),
        reclaim_policy: Some("Delete".into()),
        volume_binding_mode: Some("Immediate".into()),
        ..Default::default()
    };
    let api: Api<StorageClass> = Api::all(client.clone());
    let pp = PostParams {
        field_manager: Some(MANAGER.into()),
        ..Default::default()
    };
    let mut delay = Duration::from_millis(200);
    loop {
        match api.create(&pp, &class).await {
            Ok(_) => return,
            Err(e) if is_status(&e, 409) => return,
            Err(e) => eprintln!("[provisioner] creating StorageClass {CLASS}: {e}"),
        }
        tokio::time::sleep(delay).await;
        delay = (delay * 2).min(Duration::from_secs(5));
    }
}

/// The reconcile errors are the API's; the controller retries the object after a pause.
fn retry<K: ResourceExt>(obj: Arc<K>, e: &kube::Error, _: Arc<Client>) -> Action {
    eprintln!(
        "[provisioner] {}/{}: {e}; retrying",
        obj.namespace().unwrap_or_default(),
        obj.name_any()
    );
    Action::requeue(Duration::from_secs(1))
}

fn is_status(e: &kube::Error, code: u16) -> bool {
    matches!(e, kube::Error::Api(s) if s.code == code)
}

/// The claim's class as kube-controller-manager reads it (the beta annotation first).
fn class_of(claim: &PersistentVolumeClaim) -> Option<&str> {
    claim
        .annotations()
        .get(BETA_CLASS)
        .map(String::as_str)
        .or(claim.spec.as_ref()?.storage_class_name.as_deref())
}

/// The volume for an unbound, live claim of our class; `None` for every other claim.
fn volume_for(claim: &PersistentVolumeClaim) -> Option<PersistentVolume> {
    let spec = claim.spec.as_ref()?;
    let unbound = spec.volume_name.as_deref().unwrap_or_default().is_empty()
        && claim.status.as_ref().and_then(|s| s.phase.as_deref()) != Some("Bound");
    if !unbound || claim.metadata.deletion_timestamp.is_some() || class_of(claim) != Some(CLASS) {
        return None;
    }
    // A pre-bound volume matching a selector would need its labels; no test asks for that.
    if spec.selector.is_some() {
        return None;
    }
    let uid = claim.uid()?;
    let size = spec.resources.as_ref()?.requests.as_ref()?.get("storage")?;
    let name = format!("pvc-{uid}");
    let path = std::env::temp_dir().join("pilothouse-pv").join(&name);
    Some(PersistentVolume {
        metadata: ObjectMeta {
            name: Some(name),
            annotations: Some(BTreeMap::from([(
                PROVISIONED_BY.into(),
                PROVISIONER.into(),
            )])),
            ..Default::default()
        },
        spec: Some(PersistentVolumeSpec {
            access_modes: spec.access_modes.clone(),
            capacity: Some(BTreeMap::from([("storage".into(), size.clone())])),
            claim_ref: Some(ObjectReference {
                api_version: Some("v1".into()),
                kind: Some("PersistentVolumeClaim".into()),
                namespace: claim.namespace(),
                name: Some(claim.name_any()),
                uid: Some(uid),
                ..Default::default()
            }),
            host_path: Some(HostPathVolumeSource {
                path: path.to_string_lossy().into_owned(),
                type_: Some("DirectoryOrCreate".into()),
            }),
            persistent_volume_reclaim_policy: Some("Delete".into()),
            storage_class_name: Some(CLASS.into()),
            volume_mode: spec.volume_mode.clone(),
            ..Default::default()
        }),
        ..Default::default()
    })
}

async fn provision(claim: Arc<PersistentVolumeClaim>, client: Arc<Client>) -> kube::Result<Action> {
    let Some(volume) = volume_for(&claim) else {
        return Ok(Action::await_change());
    };
    let api: Api<PersistentVolume> = Api::all((*client).clone());
    let pp = PostParams {
        field_manager: Some(MANAGER.into()),
        ..Default::default()
    };
    match api.create(&pp, &volume).await {
        Ok(_) => Ok(Action::await_change()),
        // Named after the claim's uid: it is already there (a repeated event, another instance).
        Err(e) if is_status(&e, 409) => Ok(Action::await_change()),
        Err(e) => Err(e),
    }
}

/// Deletes a volume of ours whose claim is gone.
async fn reclaim(volume: Arc<PersistentVolume>, client: Arc<Client>) -> kube::Result<Action> {
    let ours = volume.annotations().get(PROVISIONED_BY).map(String::as_str) == Some(PROVISIONER);
    let released = volume.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Released");
    let delete = volume
        .spec
        .as_ref()
        .and_then(|s| s.persistent_volume_reclaim_policy.as_deref())
        == Some("Delete");
    if !(ours && released && delete) || volume.metadata.deletion_timestamp.is_some() {
        return Ok(Action::await_change());
    }
    let api: Api<PersistentVolume> = Api::all((*client).clone());
    match api
        .delete(&volume.name_any(), &DeleteParams::default())
        .await
    {
        Ok(_) => Ok(Action::await_change()),
        Err(e) if is_status(&e, 404) => Ok(Action::await_change()),
        Err(e) => Err(e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn claim(v: serde_json::Value) -> PersistentVolumeClaim {
        serde_json::from_value(v).unwrap()
    }

    fn base() -> serde_json::Value {
        json!({
            "metadata": {"name": "data-web-0", "namespace": "ns", "uid": "u1"},
            "spec": {"accessModes": ["ReadWriteOnce"], "storageClassName": CLASS,
                     "volumeMode": "Filesystem", "resources": {"requests": {"storage": "1Gi"}}},
            "status": {"phase": "Pending"}
        })
    }

    #[test]
    fn volume_for_an_unbound_claim_is_pre_bound_to_it() {
        let pv = volume_for(&claim(base())).expect("a volume");
        let v = serde_json::to_value(&pv).unwrap();
        assert_eq!(v["metadata"]["name"], "pvc-u1");
        assert_eq!(v["metadata"]["annotations"][PROVISIONED_BY], PROVISIONER);
        assert_eq!(v["spec"]["capacity"]["storage"], "1Gi");
        assert_eq!(v["spec"]["accessModes"], json!(["ReadWriteOnce"]));
        assert_eq!(v["spec"]["volumeMode"], "Filesystem");
        assert_eq!(v["spec"]["storageClassName"], CLASS);
        assert_eq!(v["spec"]["persistentVolumeReclaimPolicy"], "Delete");
        assert_eq!(
            v["spec"]["claimRef"],
            json!({"apiVersion": "v1", "kind": "PersistentVolumeClaim",
                   "namespace": "ns", "name": "data-web-0", "uid": "u1"})
        );
    }

    #[test]
    fn other_claims_get_no_volume() {
        let mut bound = base();
        bound["spec"]["volumeName"] = json!("pv-1");
        let mut other = base();
        other["spec"]["storageClassName"] = json!("fast");
        let mut beta = base();
        beta["metadata"]["annotations"] = json!({BETA_CLASS: "fast"});
        let mut no_class = base();
        no_class["spec"]["storageClassName"] = serde_json::Value::Null;
        let mut deleting = base();
        deleting["metadata"]["deletionTimestamp"] = json!("2025-01-01T00:00:00Z");
        for v in [bound, other, beta, no_class, deleting] {
            assert!(volume_for(&claim(v.clone())).is_none(), "{v}");
        }
    }
}
