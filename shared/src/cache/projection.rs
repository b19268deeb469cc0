//! Declared field projections: each controller declares which heavy parts of a pod it reads, and
//! the shared pod cache keeps exactly the union of what the enabled controllers declared. A
//! controller that is turned off takes its fields out of memory with it.
//!
//! The cached pod type ([`crate::cache::pod::Pod`]) already holds only the fields some controller
//! reads; of those, the heavy optional parts below are kept only when declared.
//!
//! The test kit's caches apply the same projection with only the controller under test's
//! declaration, so a sync test that reads an undeclared field sees it empty and fails.

use crate::cache::informers::Informers;
use crate::cache::pod::Pod;
use std::ops::BitOr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};

/// Groups of pod fields a controller may declare it reads.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct PodFields(u32);

impl PodFields {
    pub const NONE: PodFields = PodFields(0);
    /// `spec.tolerations`.
    pub const TOLERATIONS: PodFields = PodFields(1);
    /// `spec.containers[].ports` (named ports of EndpointSlices).
    pub const CONTAINER_PORTS: PodFields = PodFields(1 << 1);
    /// `spec.volumes` (claims of StatefulSets, drains' local storage).
    pub const VOLUMES: PodFields = PodFields(1 << 2);
    /// `status.containerStatuses`, `initContainerStatuses`, `ephemeralContainerStatuses`.
    pub const CONTAINER_STATUSES: PodFields = PodFields(1 << 3);
    pub const ALL: PodFields = PodFields(u32::MAX);

    pub fn contains(self, other: PodFields) -> bool {
        self.0 & other.0 == other.0
    }

    pub fn bits(self) -> u32 {
        self.0
    }

    pub fn from_bits(bits: u32) -> PodFields {
        PodFields(bits)
    }
}

impl BitOr for PodFields {
    type Output = PodFields;
    fn bitor(self, rhs: PodFields) -> PodFields {
        PodFields(self.0 | rhs.0)
    }
}

/// The union of the pod fields the enabled controllers declared, one per registry.
#[derive(Default)]
struct Declared(AtomicU32);

/// Installs the pod projection on `informers`: every pod is cut to the declared fields.
pub fn install(informers: &Informers) {
    let declared = informers.extension::<Declared>();
    informers.transform::<Pod>(Arc::new(move |pod: &mut Pod| {
        project_pod(
            pod,
            PodFields::from_bits(declared.0.load(Ordering::Acquire)),
        );
    }));
}

impl Informers {
    /// A controller declares the pod fields it reads (before the caches start); the pod cache
    /// keeps the union of the declarations.
    pub fn read_pod_fields(&self, fields: PodFields) {
        self.extension::<Declared>()
            .0
            .fetch_or(fields.bits(), Ordering::AcqRel);
    }

    /// The union declared so far.
    pub fn pod_fields(&self) -> PodFields {
        PodFields::from_bits(self.extension::<Declared>().0.load(Ordering::Acquire))
    }
}

/// Drops of `pod` the optional parts not in `fields`.
pub fn project_pod(pod: &mut Pod, fields: PodFields) {
    if let Some(spec) = pod.spec.as_mut() {
        if !fields.contains(PodFields::TOLERATIONS) {
            spec.tolerations = None;
        }
        if !fields.contains(PodFields::VOLUMES) {
            spec.volumes = None;
        }
        if !fields.contains(PodFields::CONTAINER_PORTS) {
            let containers = spec
                .containers
                .iter_mut()
                .chain(spec.init_containers.iter_mut().flatten());
            for c in containers {
                c.ports = None;
            }
        }
    }
    if !fields.contains(PodFields::CONTAINER_STATUSES)
        && let Some(status) = pod.status.as_mut()
    {
        status.container_statuses = None;
        status.init_container_statuses = None;
        status.ephemeral_container_statuses = None;
    }
    pod.shrink_to_fit();
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod() -> Pod {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": "a", "namespace": "ns", "labels": {"l": "v"}},
            "spec": {
                "nodeName": "n1",
                "restartPolicy": "Never",
                "hostname": "h",
                "nodeSelector": {"zone": "a"},
                "tolerations": [{"key": "k", "operator": "Exists"}],
                "volumes": [{"name": "v", "emptyDir": {}}],
                "initContainers": [{"name": "side", "image": "i", "restartPolicy": "Always",
                                    "env": [{"name": "E", "value": "1"}]}],
                "containers": [{"name": "main", "image": "i", "command": ["sh"],
                                "ports": [{"name": "http", "containerPort": 80}],
                                "volumeMounts": [{"name": "v", "mountPath": "/v"}]}]
            },
            "status": {"phase": "Running", "podIP": "10.0.0.1", "containerStatuses": [{"name": "main",
                "image": "i", "imageID": "", "ready": true, "restartCount": 0}]}
        }))
        .unwrap()
    }

    #[test]
    fn nothing_declared_keeps_the_always_kept_part_only() {
        let mut p = pod();
        project_pod(&mut p, PodFields::NONE);
        let spec = p.spec.as_ref().unwrap();
        assert_eq!(spec.volumes, None);
        assert_eq!(spec.tolerations, None);
        assert_eq!(
            spec.containers[0],
            crate::cache::pod::Container {
                name: "main".into(),
                ..Default::default()
            }
        );
        let init = &spec.init_containers.as_ref().unwrap()[0];
        assert_eq!(
            (init.name.as_str(), init.restart_policy.as_deref()),
            ("side", Some("Always"))
        );
        assert_eq!(spec.node_name.as_deref(), Some("n1"));
        assert_eq!(spec.hostname.as_deref(), Some("h"));
        assert_eq!(spec.restart_policy.as_deref(), Some("Never"));
        let status = p.status.as_ref().unwrap();
        assert_eq!(status.container_statuses, None);
        assert_eq!(status.phase.as_deref(), Some("Running"));
        assert_eq!(status.pod_ip.as_deref(), Some("10.0.0.1"));
        assert!(p.metadata.labels.is_some());
    }

    #[test]
    fn declared_groups_are_kept() {
        let mut p = pod();
        project_pod(
            &mut p,
            PodFields::TOLERATIONS | PodFields::CONTAINER_PORTS | PodFields::CONTAINER_STATUSES,
        );
        let spec = p.spec.as_ref().unwrap();
        assert_eq!(spec.tolerations.as_ref().map(Vec::len), Some(1));
        assert_eq!(spec.containers[0].ports.as_ref().map(Vec::len), Some(1));
        assert_eq!(spec.volumes, None);
        assert!(p.status.unwrap().container_statuses.is_some());
        let mut all = pod();
        project_pod(&mut all, PodFields::ALL);
        assert_eq!(all, pod());
    }
}
