//! The pod as the shared cache holds it: only the fields some controller reads, deserialized
//! straight from the API server's JSON (serde skips the rest), so a pod costs a fraction of
//! `k8s_openapi`'s `Pod` (whose spec and containers are kilobytes even when empty) and a field no
//! controller reads cannot be read at all. Field names and types follow `k8s_openapi` so code
//! reads a cached pod as it would the full one; a volume is [`Volume`], which has the same names
//! for the three fields it keeps.
//!
//! Heavy optional parts (tolerations, volumes, container ports, container statuses) are kept only
//! when an enabled controller declared them ([`crate::cache::projection::PodFields`]). A controller that
//! needs another field adds it here and says so in its declaration.
//!
//! Never write a cached pod back whole (PUT): it lacks most of the object. Patch the fields you
//! own; create pods from `k8s_openapi`'s full type.

use k8s_openapi::api::core::v1 as core;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
use serde::{Deserialize, Serialize};
use std::borrow::Cow;

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Pod {
    #[serde(default)]
    pub metadata: ObjectMeta,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub spec: Option<PodSpec>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<PodStatus>,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PodSpec {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_name: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub restart_policy: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hostname: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub subdomain: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub priority: Option<i32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub termination_grace_period_seconds: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub active_deadline_seconds: Option<i64>,
    /// Each container's name, `restartPolicy` (a sidecar is known by it) and, if declared,
    /// ports.
    #[serde(default)]
    pub containers: Vec<Container>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub init_containers: Option<Vec<Container>>,
    /// Declared: [`crate::cache::projection::PodFields::TOLERATIONS`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tolerations: Option<Vec<core::Toleration>>,
    /// Declared: [`crate::cache::projection::PodFields::VOLUMES`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub volumes: Option<Vec<Volume>>,
}

/// A volume as cached: its name and the two sources controllers read (a StatefulSet's claims,
/// a drain's local storage). `k8s_openapi`'s `Volume` holds every source inline (3 KiB) and the
/// service-account volume every pod gets adds 3 KiB of projections: 6.8 KiB a pod, doubling
/// the cache of 10,000 pods (idle-scale). Other sources are skipped when deserialized.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Volume {
    #[serde(default)]
    pub name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub persistent_volume_claim: Option<core::PersistentVolumeClaimVolumeSource>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub empty_dir: Option<core::EmptyDirVolumeSource>,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Container {
    #[serde(default)]
    pub name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub restart_policy: Option<String>,
    /// Declared: [`crate::cache::projection::PodFields::CONTAINER_PORTS`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ports: Option<Vec<core::ContainerPort>>,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PodStatus {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub conditions: Option<Vec<core::PodCondition>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub start_time: Option<Time>,
    #[serde(default, rename = "hostIP", skip_serializing_if = "Option::is_none")]
    pub host_ip: Option<String>,
    #[serde(default, rename = "podIP", skip_serializing_if = "Option::is_none")]
    pub pod_ip: Option<String>,
    #[serde(default, rename = "podIPs", skip_serializing_if = "Option::is_none")]
    pub pod_ips: Option<Vec<core::PodIP>>,
    /// Declared: [`crate::cache::projection::PodFields::CONTAINER_STATUSES`] (the three lists).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub container_statuses: Option<Vec<core::ContainerStatus>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub init_container_statuses: Option<Vec<core::ContainerStatus>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ephemeral_container_statuses: Option<Vec<core::ContainerStatus>>,
}

impl k8s_openapi::Resource for Pod {
    const API_VERSION: &'static str = <core::Pod as k8s_openapi::Resource>::API_VERSION;
    const GROUP: &'static str = <core::Pod as k8s_openapi::Resource>::GROUP;
    const KIND: &'static str = <core::Pod as k8s_openapi::Resource>::KIND;
    const VERSION: &'static str = <core::Pod as k8s_openapi::Resource>::VERSION;
    const URL_PATH_SEGMENT: &'static str = <core::Pod as k8s_openapi::Resource>::URL_PATH_SEGMENT;
    type Scope = k8s_openapi::NamespaceResourceScope;
}

impl k8s_openapi::Metadata for Pod {
    type Ty = ObjectMeta;
    fn metadata(&self) -> &ObjectMeta {
        &self.metadata
    }
    fn metadata_mut(&mut self) -> &mut ObjectMeta {
        &mut self.metadata
    }
}

impl From<core::Pod> for Pod {
    /// The cached form of a full pod (tests build full pods; the cache keeps this).
    fn from(p: core::Pod) -> Pod {
        let container = |c: core::Container| Container {
            name: c.name,
            restart_policy: c.restart_policy,
            ports: c.ports,
        };
        Pod {
            metadata: p.metadata,
            spec: p.spec.map(|s| PodSpec {
                node_name: s.node_name,
                restart_policy: s.restart_policy,
                hostname: s.hostname,
                subdomain: s.subdomain,
                priority: s.priority,
                termination_grace_period_seconds: s.termination_grace_period_seconds,
                active_deadline_seconds: s.active_deadline_seconds,
                containers: s.containers.into_iter().map(container).collect(),
                init_containers: s
                    .init_containers
                    .map(|v| v.into_iter().map(container).collect()),
                tolerations: s.tolerations,
                volumes: s.volumes.map(|v| {
                    v.into_iter()
                        .map(|v| Volume {
                            name: v.name,
                            persistent_volume_claim: v.persistent_volume_claim,
                            empty_dir: v.empty_dir,
                        })
                        .collect()
                }),
            }),
            status: p.status.map(|s| PodStatus {
                phase: s.phase,
                conditions: s.conditions,
                reason: s.reason,
                message: s.message,
                start_time: s.start_time,
                host_ip: s.host_ip,
                pod_ip: s.pod_ip,
                pod_ips: s.pod_ips,
                container_statuses: s.container_statuses,
                init_container_statuses: s.init_container_statuses,
                ephemeral_container_statuses: s.ephemeral_container_statuses,
            }),
        }
    }
}

impl Pod {
    /// Gives back the spare capacity of every list: a deserialized `Vec` of one element holds
    /// room for four, which for a pod's one container status alone is 2 KiB per cached pod.
    pub fn shrink_to_fit(&mut self) {
        crate::meta::keys::shrink_meta(&mut self.metadata);
        if let Some(spec) = self.spec.as_mut() {
            spec.containers.shrink_to_fit();
            let containers = spec
                .containers
                .iter_mut()
                .chain(spec.init_containers.iter_mut().flatten());
            for c in containers {
                shrink(&mut c.ports);
            }
            shrink(&mut spec.init_containers);
            shrink(&mut spec.tolerations);
            shrink(&mut spec.volumes);
        }
        if let Some(status) = self.status.as_mut() {
            shrink(&mut status.conditions);
            shrink(&mut status.pod_ips);
            shrink(&mut status.container_statuses);
            shrink(&mut status.init_container_statuses);
            shrink(&mut status.ephemeral_container_statuses);
        }
    }

    /// The pod's condition of `type_` (upstream `podutil.GetPodCondition`).
    pub fn condition(&self, type_: &str) -> Option<&core::PodCondition> {
        self.status
            .as_ref()?
            .conditions
            .as_ref()?
            .iter()
            .find(|c| c.type_ == type_)
    }

    /// Ready condition `True` (upstream `podutil.IsPodReady`).
    pub fn is_ready(&self) -> bool {
        self.condition("Ready").is_some_and(|c| c.status == "True")
    }

    /// The pod's `namespace/name`, for messages.
    pub fn key(&self) -> Cow<'_, str> {
        match &self.metadata.namespace {
            Some(ns) => Cow::Owned(format!(
                "{ns}/{}",
                self.metadata.name.as_deref().unwrap_or_default()
            )),
            None => Cow::Borrowed(self.metadata.name.as_deref().unwrap_or_default()),
        }
    }
}

fn shrink<T>(v: &mut Option<Vec<T>>) {
    if let Some(v) = v {
        v.shrink_to_fit();
    }
}

/// The index of pods by node name ([`pod_by_node`]).
pub const INDEX_POD_NODE: &str = "pod-node";

/// Index function: a pod's node.
pub fn pod_by_node(pod: &Pod) -> Vec<String> {
    pod.spec
        .as_ref()
        .and_then(|s| s.node_name.clone())
        .into_iter()
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn deserializes_only_what_it_holds_from_a_full_pod() {
        let full = serde_json::json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "a", "namespace": "ns", "uid": "u", "labels": {"l": "v"},
                "finalizers": ["f"], "ownerReferences": [{"apiVersion": "batch/v1", "kind": "Job",
                "name": "j", "uid": "ju", "controller": true}]},
            "spec": {"nodeName": "n1", "restartPolicy": "Never", "hostname": "h", "subdomain": "s",
                "priority": 5, "terminationGracePeriodSeconds": 7, "activeDeadlineSeconds": 9,
                "containers": [{"name": "c", "image": "i", "ports": [{"containerPort": 80, "name": "http"}],
                    "env": [{"name": "E", "value": "v"}]}],
                "initContainers": [{"name": "s", "image": "i", "restartPolicy": "Always"}],
                "tolerations": [{"key": "k", "operator": "Exists"}],
                "volumes": [{"name": "v", "emptyDir": {}},
                    {"name": "data", "persistentVolumeClaim": {"claimName": "data-web-0"}},
                    {"name": "kube-api-access-x", "projected": {"sources": [
                        {"serviceAccountToken": {"path": "token", "expirationSeconds": 3607}},
                        {"configMap": {"name": "kube-root-ca.crt",
                            "items": [{"key": "ca.crt", "path": "ca.crt"}]}}]}}],
                "affinity": {"nodeAffinity": {}}},
            "status": {"phase": "Running", "podIP": "10.0.0.1", "hostIP": "10.1.0.1",
                "podIPs": [{"ip": "10.0.0.1"}], "reason": "R", "message": "M",
                "startTime": "2026-01-01T00:00:00Z",
                "initContainerStatuses": [{"name": "s", "ready": true, "restartCount": 0,
                    "image": "i", "imageID": ""}],
                "ephemeralContainerStatuses": [{"name": "e", "ready": false, "restartCount": 0,
                    "image": "i", "imageID": ""}],
                "conditions": [{"type": "Ready", "status": "True"}],
                "containerStatuses": [{"name": "c", "ready": true, "restartCount": 2, "image": "i",
                    "imageID": "", "state": {"running": {}}}]}
        });
        let pod: Pod = serde_json::from_value(full.clone()).unwrap();
        let spec = pod.spec.as_ref().unwrap();
        assert_eq!(spec.node_name.as_deref(), Some("n1"));
        assert_eq!(
            spec.containers[0].ports.as_ref().unwrap()[0].container_port,
            80
        );
        assert_eq!(
            spec.init_containers.as_ref().unwrap()[0]
                .restart_policy
                .as_deref(),
            Some("Always")
        );
        assert_eq!(
            pod.status
                .as_ref()
                .unwrap()
                .container_statuses
                .as_ref()
                .unwrap()[0]
                .restart_count,
            2
        );
        // Volumes keep their names and the sources controllers read, nothing else.
        let volumes = spec.volumes.as_ref().unwrap();
        assert_eq!(volumes.len(), 3);
        assert!(volumes[0].empty_dir.is_some());
        assert_eq!(
            volumes[1]
                .persistent_volume_claim
                .as_ref()
                .unwrap()
                .claim_name,
            "data-web-0"
        );
        assert_eq!(
            serde_json::to_value(&volumes[2]).unwrap(),
            serde_json::json!({"name": "kube-api-access-x"})
        );
        let status = pod.status.as_ref().unwrap();
        assert_eq!(status.pod_ip.as_deref(), Some("10.0.0.1"));
        assert_eq!(status.host_ip.as_deref(), Some("10.1.0.1"));
        assert_eq!(status.pod_ips.as_ref().unwrap()[0].ip, "10.0.0.1");
        // Every field is read under its API name: each is set above and none may be left empty.
        let back_all = serde_json::to_value(&pod).unwrap();
        for part in ["spec", "status"] {
            let fields = back_all[part].as_object().unwrap();
            assert_eq!(fields.len(), 11, "{part}: {fields:?}");
        }
        // The same as converting the full type, and back to the same JSON for what it holds.
        let back = serde_json::to_value(&pod).unwrap();
        assert_eq!(back["status"]["podIP"], "10.0.0.1");
        assert_eq!(back["spec"]["nodeName"], "n1");
        let via_full: Pod = Pod::from(serde_json::from_value::<core::Pod>(full).unwrap());
        assert_eq!(pod, via_full);
        assert_eq!(pod.key(), "ns/a");
        // A cached volume stays small whatever sources the API gains (the full type is 3 KiB).
        assert!(std::mem::size_of::<Volume>() <= 160);
        assert!(std::mem::size_of::<core::Volume>() > 2048);
        assert_eq!(<Pod as kube::Resource>::plural(&()), "pods");
        assert_eq!(<Pod as kube::Resource>::api_version(&()), "v1");
    }
}
