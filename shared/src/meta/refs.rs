//! Owner and object references, as apimachinery builds and reads them (`metav1.GetControllerOf`,
//! `metav1.NewControllerRef`, `reference.GetReference`), so every controller names its owners
//! and the subjects of its events the same way kube-controller-manager does.
//!
//! Kind, group and version always come from the Rust type (`K: Resource`), never from strings
//! typed at the call site, so a reference cannot name the wrong API group.

use k8s_openapi::api::core::v1::ObjectReference;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use kube::Resource;

/// The owner reference marked `controller: true` (upstream `metav1.GetControllerOf`: the first
/// one; the API server refuses objects with more than one).
pub fn controller_of(meta: &ObjectMeta) -> Option<&OwnerReference> {
    meta.owner_references
        .iter()
        .flatten()
        .find(|o| o.controller == Some(true))
}

/// The controller reference to put on objects `owner` creates or adopts (upstream
/// `metav1.NewControllerRef`): `controller` and `blockOwnerDeletion` both true, so only one
/// controller can own the object and foreground deletion of the owner waits for it.
pub fn controller_ref<K: Resource<DynamicType = ()>>(owner: &K) -> OwnerReference {
    let meta = owner.meta();
    OwnerReference {
        api_version: K::api_version(&()).into_owned(),
        kind: K::kind(&()).into_owned(),
        name: meta.name.clone().unwrap_or_default(),
        uid: meta.uid.clone().unwrap_or_default(),
        controller: Some(true),
        block_owner_deletion: Some(true),
    }
}

/// Whether the object's controller reference carries `owner_uid`. UIDs are unique across kinds,
/// so this is how a controller recognises what it already owns (upstream `ClaimObject`).
pub fn is_controlled_by(meta: &ObjectMeta, owner_uid: &str) -> bool {
    controller_of(meta).is_some_and(|o| o.uid == owner_uid)
}

/// Whether the object's controller reference names kind `K` (in `K`'s group, any version) with
/// `owner_uid`: for controllers that must not act on objects another kind happens to control
/// under a look-alike reference (CronJob's JB-7).
pub fn is_controlled_by_kind<K: Resource<DynamicType = ()>>(
    meta: &ObjectMeta,
    owner_uid: &str,
) -> bool {
    controller_of(meta).is_some_and(|o| refers_to_kind::<K>(o) && o.uid == owner_uid)
}

/// Whether `r` names kind `K` by its kind alone: upstream's `resolveControllerRef`, which
/// compares only `Kind` (the UID it checks next rules out look-alikes).
pub fn names_kind<K: Resource<DynamicType = ()>>(r: &OwnerReference) -> bool {
    r.kind == K::kind(&())
}

/// Whether `r` names kind `K` in `K`'s API group, whatever the version (a reference written as
/// `batch/v1beta1` still names the same Jobs).
pub fn refers_to_kind<K: Resource<DynamicType = ()>>(r: &OwnerReference) -> bool {
    r.kind == K::kind(&()) && group_of(&r.api_version) == K::group(&())
}

/// Whether `r` names kind `K` with exactly `K`'s `apiVersion`: upstream's test where it compares
/// `APIVersion` strings (the Job controller's orphan-pod finalizer cleanup).
pub fn refers_to_version<K: Resource<DynamicType = ()>>(r: &OwnerReference) -> bool {
    r.kind == K::kind(&()) && r.api_version == K::api_version(&())
}

/// The group part of an `apiVersion` (`batch/v1` → `batch`, core `v1` → ``).
pub fn group_of(api_version: &str) -> &str {
    api_version.split_once('/').map_or("", |(g, _)| g)
}

/// A reference to `obj` as upstream's `reference.GetReference` builds it for events and for
/// status fields such as CronJob's `status.active`: kind and apiVersion of `K`, namespace, name,
/// UID and resourceVersion of the object.
pub fn object_reference<K: Resource<DynamicType = ()>>(obj: &K) -> ObjectReference {
    let meta = obj.meta();
    ObjectReference {
        api_version: Some(K::api_version(&()).into_owned()),
        kind: Some(K::kind(&()).into_owned()),
        namespace: meta.namespace.clone(),
        name: meta.name.clone(),
        uid: meta.uid.clone(),
        resource_version: meta.resource_version.clone(),
        ..Default::default()
    }
}

/// A reference to a `K` by its cache key (`namespace/name`, or `name` when cluster-scoped),
/// without UID or resourceVersion: for events about objects that may already be gone, as
/// upstream builds them by hand (taint eviction's pod events). Add the UID where upstream has
/// it: `ObjectReference { uid, ..object_reference_by_key::<Node>(name) }`.
pub fn object_reference_by_key<K: Resource<DynamicType = ()>>(key: &str) -> ObjectReference {
    let (namespace, name) = crate::meta::keys::split_key(key);
    ObjectReference {
        api_version: Some(K::api_version(&()).into_owned()),
        kind: Some(K::kind(&()).into_owned()),
        namespace: (!namespace.is_empty()).then(|| namespace.into()),
        name: Some(name.into()),
        ..Default::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::apps::v1::StatefulSet;
    use k8s_openapi::api::batch::v1::{CronJob, Job};
    use k8s_openapi::api::core::v1::{Node, Pod};

    fn owner(api_version: &str, kind: &str, uid: &str, controller: Option<bool>) -> OwnerReference {
        OwnerReference {
            api_version: api_version.into(),
            kind: kind.into(),
            name: "o".into(),
            uid: uid.into(),
            controller,
            block_owner_deletion: None,
        }
    }

    fn meta_with(refs: Vec<OwnerReference>) -> ObjectMeta {
        ObjectMeta {
            owner_references: Some(refs),
            ..Default::default()
        }
    }

    fn job(name: &str, uid: &str) -> Job {
        Job {
            metadata: ObjectMeta {
                name: Some(name.into()),
                namespace: Some("ns".into()),
                uid: Some(uid.into()),
                resource_version: Some("42".into()),
                ..Default::default()
            },
            ..Default::default()
        }
    }

    #[test]
    fn controller_of_is_the_first_controller_reference() {
        assert_eq!(controller_of(&ObjectMeta::default()), None);
        assert_eq!(controller_of(&meta_with(vec![])), None);
        let m = meta_with(vec![
            owner("v1", "ConfigMap", "a", None),
            owner("v1", "ConfigMap", "b", Some(false)),
            owner("batch/v1", "Job", "c", Some(true)),
            owner("batch/v1", "Job", "d", Some(true)),
        ]);
        assert_eq!(controller_of(&m).map(|o| o.uid.as_str()), Some("c"));
    }

    #[test]
    fn controller_ref_is_new_controller_ref() {
        let r = controller_ref(&job("pi", "u1"));
        assert_eq!(
            r,
            OwnerReference {
                api_version: "batch/v1".into(),
                kind: "Job".into(),
                name: "pi".into(),
                uid: "u1".into(),
                controller: Some(true),
                block_owner_deletion: Some(true),
            }
        );
        let s = StatefulSet {
            metadata: ObjectMeta {
                name: Some("web".into()),
                uid: Some("u2".into()),
                ..Default::default()
            },
            ..Default::default()
        };
        let r = controller_ref(&s);
        assert_eq!(
            (r.api_version.as_str(), r.kind.as_str()),
            ("apps/v1", "StatefulSet")
        );
    }

    #[test]
    fn controlled_by_uid_only_counts_the_controller() {
        let m = meta_with(vec![
            owner("batch/v1", "Job", "a", None),
            owner("batch/v1", "Job", "b", Some(true)),
        ]);
        assert!(is_controlled_by(&m, "b"));
        assert!(!is_controlled_by(&m, "a"));
        assert!(!is_controlled_by(&ObjectMeta::default(), ""));
    }

    #[test]
    fn controlled_by_kind_checks_kind_group_and_uid_not_version() {
        let m = |v: &str, k: &str| meta_with(vec![owner(v, k, "u", Some(true))]);
        assert!(is_controlled_by_kind::<CronJob>(
            &m("batch/v1", "CronJob"),
            "u"
        ));
        assert!(is_controlled_by_kind::<CronJob>(
            &m("batch/v1beta1", "CronJob"),
            "u"
        ));
        assert!(!is_controlled_by_kind::<CronJob>(
            &m("batch/v1", "CronJob"),
            "x"
        ));
        assert!(!is_controlled_by_kind::<CronJob>(
            &m("batch/v1", "Deployment"),
            "u"
        ));
        assert!(!is_controlled_by_kind::<CronJob>(
            &m("example.com/v1", "CronJob"),
            "u"
        ));
        // Core kinds: group "" and a bare version.
        assert!(!is_controlled_by_kind::<CronJob>(&m("v1", "CronJob"), "u"));
        assert!(is_controlled_by_kind::<Node>(&m("v1", "Node"), "u"));
        assert!(!is_controlled_by_kind::<Node>(
            &m("example.com/v1", "Node"),
            "u"
        ));
        // Not the controller: not controlled.
        let not_ctl = meta_with(vec![owner("batch/v1", "CronJob", "u", Some(false))]);
        assert!(!is_controlled_by_kind::<CronJob>(&not_ctl, "u"));
    }

    #[test]
    fn refers_to_version_is_exact() {
        assert!(refers_to_version::<Job>(&owner(
            "batch/v1", "Job", "u", None
        )));
        assert!(!refers_to_version::<Job>(&owner(
            "batch/v1beta1",
            "Job",
            "u",
            None
        )));
        assert!(!refers_to_version::<Job>(&owner(
            "batch/v1", "CronJob", "u", None
        )));
        assert!(refers_to_kind::<Job>(&owner(
            "batch/v1beta1",
            "Job",
            "u",
            None
        )));
    }

    #[test]
    fn group_of_api_versions() {
        assert_eq!(group_of("batch/v1"), "batch");
        assert_eq!(group_of("v1"), "");
        assert_eq!(group_of(""), "");
    }

    #[test]
    fn object_reference_is_get_reference() {
        assert_eq!(
            object_reference(&job("pi", "u1")),
            ObjectReference {
                api_version: Some("batch/v1".into()),
                kind: Some("Job".into()),
                namespace: Some("ns".into()),
                name: Some("pi".into()),
                uid: Some("u1".into()),
                resource_version: Some("42".into()),
                field_path: None,
            }
        );
        let n = Node {
            metadata: ObjectMeta {
                name: Some("n1".into()),
                uid: Some("nu".into()),
                ..Default::default()
            },
            ..Default::default()
        };
        let r = object_reference(&n);
        assert_eq!(
            (
                r.api_version.as_deref(),
                r.kind.as_deref(),
                r.namespace,
                r.uid.as_deref()
            ),
            (Some("v1"), Some("Node"), None, Some("nu"))
        );
    }

    #[test]
    fn object_reference_by_key_matches_core_ref() {
        assert_eq!(
            object_reference_by_key::<Pod>("ns/p"),
            crate::runtime::events::core_ref("Pod", "ns/p")
        );
        assert_eq!(
            object_reference_by_key::<Node>("n"),
            crate::runtime::events::core_ref("Node", "n")
        );
        let j = object_reference_by_key::<Job>("ns/pi");
        assert_eq!(
            (
                j.api_version.as_deref(),
                j.kind.as_deref(),
                j.namespace.as_deref(),
                j.name.as_deref(),
                j.uid
            ),
            (Some("batch/v1"), Some("Job"), Some("ns"), Some("pi"), None)
        );
    }
}
