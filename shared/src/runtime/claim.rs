//! Claiming the objects a controller owns, with upstream `ControllerRefManager` semantics
//! (`pkg/controller/controller_ref_manager.go`: `ClaimObject`, `AdoptPod`/`ReleasePod` and their
//! ReplicaSet/ControllerRevision twins, `RecheckDeletionTimestamp`).
//!
//! Everything here is pure: [`decide`] says what to do with one object, [`partition`] applies it
//! to a list, [`can_adopt`] is the re-check of a live read of the owner, and [`adopt_patch`] /
//! [`release_patch`] are the strategic-merge patches to send. The caller lists candidates from
//! its caches, sends the patches through its writer and handles errors with
//! [`adopt_error_ignored`] / [`release_error_ignored`]:
//!
//! 1. `partition` the objects (all of the owner's namespace, or those it controls plus the
//!    orphans there) into owned, to adopt and to release;
//! 2. send `release_patch` for each of `release`; none of them is claimed;
//! 3. only if `adopt` is non-empty, read the owner live (not from the cache) once and check it
//!    with `can_adopt`; on an error no adoption is attempted and the sync fails (upstream fails
//!    every adoption with that error and so the sync, which is retried with backoff);
//! 4. send `adopt_patch` for each of `adopt`; an adopted object is claimed;
//! 5. as upstream, a failure of one write does not stop the others: the sync fails at the end
//!    with the errors collected, after every write was tried.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use kube::Resource;
use serde_json::{Value, json};
use std::borrow::Borrow;

use crate::meta::refs::controller_of;

/// What one claim pass does with one object: the rows of upstream `ClaimObject`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Claim {
    /// Controlled by the owner and matching its selector: claimed, nothing to write. Holds
    /// while the owner is being deleted, as keeping what is already ours takes no action.
    Owned,
    /// A matching orphan in the owner's namespace, not being deleted, of an owner not being
    /// deleted: send [`adopt_patch`] (after [`can_adopt`]). Claimed if the patch succeeds; gone
    /// (NotFound) means not claimed and no error; any other failure fails the sync.
    Adopt,
    /// Controlled by the owner but no longer matching, the owner not being deleted: send
    /// [`release_patch`]. Never claimed; NotFound and Invalid (the object was recreated or has no
    /// owner references) are no error.
    Release,
    /// Not ours and not to be taken, or ours but left alone while the owner is being deleted:
    /// not claimed, nothing to write.
    Ignore,
}

impl Claim {
    /// Whether the object belongs to the owner's claimed set once the write this outcome asks
    /// for (if any) has succeeded.
    pub fn claims(self) -> bool {
        matches!(self, Claim::Owned | Claim::Adopt)
    }
}

/// Upstream `ClaimObject`'s decision for `obj` against `owner`. `selector_matches` is the
/// owner's selector (and any extra filter, as `ClaimPods`' filters) applied to `obj`.
///
/// A selector that does not parse must not reach here as "no match": that would release every
/// object the owner controls. Upstream fails the sync before claiming (`LabelSelectorAsSelector`).
pub fn decide(owner: &ObjectMeta, obj: &ObjectMeta, selector_matches: bool) -> Claim {
    let owner_uid = owner.uid.as_deref().unwrap_or_default();
    let owner_deleting = owner.deletion_timestamp.is_some();
    if let Some(r) = controller_of(obj) {
        if r.uid != owner_uid {
            // Someone else's: never touched, whatever the labels say.
            return Claim::Ignore;
        }
        if selector_matches {
            return Claim::Owned;
        }
        // A deleting owner's dependents are left to the garbage collector.
        if owner_deleting {
            return Claim::Ignore;
        }
        return Claim::Release;
    }
    // An orphan (no controller reference; other owner references do not count).
    if owner_deleting || !selector_matches {
        return Claim::Ignore;
    }
    // Adopting an object on its way out would only delay its deletion.
    if obj.deletion_timestamp.is_some() {
        return Claim::Ignore;
    }
    // Owner references cannot cross namespaces (a cluster-scoped owner may own anything).
    let owner_ns = owner.namespace.as_deref().unwrap_or_default();
    if !owner_ns.is_empty() && obj.namespace.as_deref().unwrap_or_default() != owner_ns {
        return Claim::Ignore;
    }
    Claim::Adopt
}

/// The objects of one claim pass by outcome, each list in input order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Claims<T> {
    /// Already the owner's: claimed as they are.
    pub owned: Vec<T>,
    /// To adopt (claimed once the patch succeeded).
    pub adopt: Vec<T>,
    /// To release (not claimed).
    pub release: Vec<T>,
}

impl<T> Default for Claims<T> {
    fn default() -> Self {
        Claims {
            owned: Vec::new(),
            adopt: Vec::new(),
            release: Vec::new(),
        }
    }
}

/// [`decide`] over `objects` (`Arc<Pod>`, `&ControllerRevision`, ...); ignored ones are dropped.
pub fn partition<K, T>(
    owner: &ObjectMeta,
    objects: impl IntoIterator<Item = T>,
    matches: impl Fn(&K) -> bool,
) -> Claims<T>
where
    K: Resource,
    T: Borrow<K>,
{
    let mut claims = Claims::default();
    for o in objects {
        let obj: &K = o.borrow();
        match decide(owner, obj.meta(), matches(obj)) {
            Claim::Owned => claims.owned.push(o),
            Claim::Adopt => claims.adopt.push(o),
            Claim::Release => claims.release.push(o),
            Claim::Ignore => {}
        }
    }
    claims
}

/// Why adoption is refused after the live read of the owner.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ClaimError {
    /// The name now belongs to another object: the cached owner was deleted and recreated.
    #[error("original {kind} {namespace}/{name} is gone: got uid {got}, wanted {wanted}")]
    OwnerReplaced {
        kind: String,
        namespace: String,
        name: String,
        got: String,
        wanted: String,
    },
    /// The owner is being deleted (the cache had not seen it yet).
    #[error("{namespace}/{name} has just been deleted at {at}")]
    OwnerDeleting {
        namespace: String,
        name: String,
        at: String,
    },
}

/// Upstream's `canAdopt` (the owner's `RecheckDeletionTimestamp` with its UID check) on a live
/// read `fresh` of the cached `owner`: adoption needs the very same owner, not being deleted,
/// because the cache may lag a deletion and adopting then would leave objects that the garbage
/// collector has already decided not to wait for (kubernetes#42639).
pub fn can_adopt<K: Resource<DynamicType = ()>>(owner: &K, fresh: &K) -> Result<(), ClaimError> {
    let (cached, live) = (owner.meta(), fresh.meta());
    let namespace = live.namespace.clone().unwrap_or_default();
    let name = live.name.clone().unwrap_or_default();
    if live.uid != cached.uid {
        return Err(ClaimError::OwnerReplaced {
            kind: K::kind(&()).into_owned(),
            namespace,
            name,
            got: live.uid.clone().unwrap_or_default(),
            wanted: cached.uid.clone().unwrap_or_default(),
        });
    }
    if let Some(at) = &live.deletion_timestamp {
        return Err(ClaimError::OwnerDeleting {
            namespace,
            name,
            at: at.0.to_string(),
        });
    }
    Ok(())
}

/// Upstream's adoption patch (strategic merge): `owner_ref` (from
/// [`crate::meta::refs::controller_ref`]) merged into `metadata.ownerReferences` by UID, `finalizers`
/// added in the same write (the Job controller's tracking finalizer; none for most owners), and
/// `metadata.uid` as a precondition: were the object recreated under the same name, the patch
/// would change its immutable UID and be refused (Invalid). The API server also refuses it if
/// another controller reference appeared meanwhile.
pub fn adopt_patch(owner_ref: &OwnerReference, obj_uid: &str, finalizers: &[&str]) -> Value {
    let mut patch = json!({"metadata": {
        "ownerReferences": [owner_ref],
        "uid": obj_uid,
    }});
    if !finalizers.is_empty() {
        patch["metadata"]["finalizers"] = json!(finalizers);
    }
    patch
}

/// Upstream's release patch (strategic merge, `GenerateDeleteOwnerRefStrategicMergeBytes`): the
/// owner reference with `owner_uid` deleted (`$patch: delete`), `finalizers` removed in the same
/// write (`$deleteFromPrimitiveList`), and `metadata.uid` as a precondition as in
/// [`adopt_patch`].
pub fn release_patch(owner_uid: &str, obj_uid: &str, finalizers: &[&str]) -> Value {
    let mut patch = json!({"metadata": {
        "ownerReferences": [{"$patch": "delete", "uid": owner_uid}],
    }});
    if !finalizers.is_empty() {
        patch["metadata"]["$deleteFromPrimitiveList/finalizers"] = json!(finalizers);
    }
    patch["metadata"]["uid"] = json!(obj_uid);
    patch
}

/// Whether a failed adoption is no error: the object is gone (upstream `ClaimObject`); it is then
/// simply not claimed.
pub fn adopt_error_ignored(e: &kube::Error) -> bool {
    matches!(e, kube::Error::Api(s) if s.code == 404)
}

/// Whether a failed release is no error: the object is gone (NotFound), or was recreated or has
/// no owner references left (Invalid), as upstream `ReleasePod` and its twins.
pub fn release_error_ignored(e: &kube::Error) -> bool {
    matches!(e, kube::Error::Api(s) if s.code == 404 || s.code == 422 || s.reason == "Invalid")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::meta::refs::controller_ref;
    use k8s_openapi::api::apps::v1::{ControllerRevision, StatefulSet};
    use k8s_openapi::api::batch::v1::Job;
    use k8s_openapi::api::core::v1::Pod;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
    use std::sync::Arc;

    const OWNER: &str = "owner-uid";

    fn ts() -> Time {
        Time("2025-01-02T03:04:05Z".parse().unwrap())
    }

    fn owner_meta(deleting: bool) -> ObjectMeta {
        ObjectMeta {
            name: Some("o".into()),
            namespace: Some("ns".into()),
            uid: Some(OWNER.into()),
            deletion_timestamp: deleting.then(ts),
            ..Default::default()
        }
    }

    fn reference(uid: &str, controller: Option<bool>) -> OwnerReference {
        OwnerReference {
            api_version: "batch/v1".into(),
            kind: "Job".into(),
            name: "o".into(),
            uid: uid.into(),
            controller,
            block_owner_deletion: Some(true),
        }
    }

    #[derive(Clone, Copy, Debug)]
    enum Ctl {
        None,
        Us,
        Other,
        /// Only a non-controller reference to us: still an orphan.
        UsNotController,
    }

    fn obj_meta(ctl: Ctl, deleting: bool, ns: &str) -> ObjectMeta {
        let refs = match ctl {
            Ctl::None => None,
            Ctl::Us => Some(vec![reference(OWNER, Some(true))]),
            Ctl::Other => Some(vec![reference("other-uid", Some(true))]),
            Ctl::UsNotController => Some(vec![reference(OWNER, Some(false))]),
        };
        ObjectMeta {
            name: Some("p".into()),
            namespace: Some(ns.into()),
            uid: Some("obj-uid".into()),
            owner_references: refs,
            deletion_timestamp: deleting.then(ts),
            ..Default::default()
        }
    }

    /// Every row of upstream `ClaimObject`.
    #[test]
    fn claim_object_table() {
        use Claim::*;
        // (controller, object deleting, selector matches, owner deleting, namespace, expected)
        let rows: &[(Ctl, bool, bool, bool, &str, Claim)] = &[
            // Controlled by someone else: ignored, whatever else holds.
            (Ctl::Other, false, true, false, "ns", Ignore),
            (Ctl::Other, false, false, false, "ns", Ignore),
            (Ctl::Other, true, true, true, "ns", Ignore),
            // Ours and matching: owned, even while the owner or the object is being deleted.
            (Ctl::Us, false, true, false, "ns", Owned),
            (Ctl::Us, false, true, true, "ns", Owned),
            (Ctl::Us, true, true, false, "ns", Owned),
            // Ours, not matching: released, even if the object is being deleted ...
            (Ctl::Us, false, false, false, "ns", Release),
            (Ctl::Us, true, false, false, "ns", Release),
            // ... unless the owner is being deleted: then neither released nor claimed.
            (Ctl::Us, false, false, true, "ns", Ignore),
            // Orphan matching: adopted.
            (Ctl::None, false, true, false, "ns", Adopt),
            // Orphan not matching: ignored.
            (Ctl::None, false, false, false, "ns", Ignore),
            // Orphan matching but being deleted: never adopted.
            (Ctl::None, true, true, false, "ns", Ignore),
            // Owner being deleted: no adoption.
            (Ctl::None, false, true, true, "ns", Ignore),
            // Orphan in another namespace: not adopted.
            (Ctl::None, false, true, false, "elsewhere", Ignore),
            // A non-controller reference to us does not make it ours: an orphan, adopted.
            (Ctl::UsNotController, false, true, false, "ns", Adopt),
            (Ctl::UsNotController, false, false, false, "ns", Ignore),
        ];
        for &(ctl, obj_deleting, matches, owner_deleting, ns, want) in rows {
            let got = decide(
                &owner_meta(owner_deleting),
                &obj_meta(ctl, obj_deleting, ns),
                matches,
            );
            assert_eq!(
                got, want,
                "controller {ctl:?}, object deleting {obj_deleting}, matches {matches}, \
                 owner deleting {owner_deleting}, namespace {ns}"
            );
        }
    }

    #[test]
    fn cluster_scoped_owner_adopts_in_any_namespace() {
        let owner = ObjectMeta {
            namespace: None,
            ..owner_meta(false)
        };
        assert_eq!(
            decide(&owner, &obj_meta(Ctl::None, false, "any"), true),
            Claim::Adopt
        );
    }

    #[test]
    fn claims_is_owned_or_adopted() {
        assert!(Claim::Owned.claims());
        assert!(Claim::Adopt.claims());
        assert!(!Claim::Release.claims());
        assert!(!Claim::Ignore.claims());
    }

    fn pod(name: &str, ctl: Ctl, app: &str) -> Arc<Pod> {
        let mut meta = obj_meta(ctl, false, "ns");
        meta.name = Some(name.into());
        meta.labels = Some([("app".to_string(), app.to_string())].into());
        Arc::new(Pod {
            metadata: meta,
            ..Default::default()
        })
    }

    #[test]
    fn partition_sorts_in_input_order_and_drops_ignored() {
        let pods = [
            pod("a", Ctl::Us, "web"),
            pod("b", Ctl::None, "web"),
            pod("c", Ctl::Us, "db"),
            pod("d", Ctl::Other, "web"),
            pod("e", Ctl::None, "db"),
            pod("f", Ctl::None, "web"),
            pod("g", Ctl::Us, "web"),
        ];
        let web = |p: &Pod| {
            p.metadata
                .labels
                .as_ref()
                .and_then(|l| l.get("app"))
                .map(String::as_str)
                == Some("web")
        };
        let c = partition(&owner_meta(false), pods.iter().cloned(), web);
        let names = |v: &[Arc<Pod>]| {
            v.iter()
                .map(|p| p.metadata.name.clone().unwrap())
                .collect::<Vec<_>>()
        };
        assert_eq!(names(&c.owned), ["a", "g"]);
        assert_eq!(names(&c.adopt), ["b", "f"]);
        assert_eq!(names(&c.release), ["c"]);

        // Borrowed objects work as well; a deleting owner only keeps what it owns.
        let c = partition(&owner_meta(true), pods.iter().map(|p| p.as_ref()), web);
        assert_eq!(c.owned.len(), 2);
        assert!(c.adopt.is_empty() && c.release.is_empty());

        // Any kind: ControllerRevisions of a StatefulSet.
        let rev = ControllerRevision {
            metadata: obj_meta(Ctl::None, false, "ns"),
            ..Default::default()
        };
        let c = partition(&owner_meta(false), [&rev], |_: &ControllerRevision| true);
        assert_eq!(c.adopt.len(), 1);
    }

    fn job(uid: &str, deleting: bool) -> Job {
        Job {
            metadata: ObjectMeta {
                uid: Some(uid.into()),
                ..owner_meta(deleting)
            },
            ..Default::default()
        }
    }

    #[test]
    fn can_adopt_rechecks_uid_then_deletion() {
        assert_eq!(can_adopt(&job(OWNER, false), &job(OWNER, false)), Ok(()));
        // The cached copy being deleted does not matter; the live read does.
        assert_eq!(can_adopt(&job(OWNER, true), &job(OWNER, false)), Ok(()));
        let e = can_adopt(&job(OWNER, false), &job("new-uid", true)).unwrap_err();
        assert!(matches!(e, ClaimError::OwnerReplaced { .. }));
        assert_eq!(
            e.to_string(),
            "original Job ns/o is gone: got uid new-uid, wanted owner-uid"
        );
        let e = can_adopt(&job(OWNER, false), &job(OWNER, true)).unwrap_err();
        assert!(matches!(e, ClaimError::OwnerDeleting { .. }));
        assert_eq!(
            e.to_string(),
            "ns/o has just been deleted at 2025-01-02T03:04:05Z"
        );
    }

    fn a_job() -> Job {
        Job {
            metadata: ObjectMeta {
                name: Some("pi".into()),
                namespace: Some("ns".into()),
                uid: Some("job-uid".into()),
                ..Default::default()
            },
            ..Default::default()
        }
    }

    const TRACKING: &str = "batch.kubernetes.io/job-tracking";

    /// The Job controller's adopt patch, byte for byte (controllers/job `act::adopt_pod`).
    #[test]
    fn adopt_patch_equals_jobs() {
        let job = a_job();
        let jobs = json!({"metadata": {
            "ownerReferences": [controller_ref(&job)],
            "uid": "pod-uid",
            "finalizers": [TRACKING],
        }});
        let ours = adopt_patch(&controller_ref(&job), "pod-uid", &[TRACKING]);
        assert_eq!(ours, jobs);
        assert_eq!(ours.to_string(), jobs.to_string());
    }

    /// Upstream's shape without finalizers (`finalizers` is `omitempty`).
    #[test]
    fn adopt_patch_without_finalizers() {
        let s = StatefulSet {
            metadata: ObjectMeta {
                name: Some("web".into()),
                uid: Some("sts-uid".into()),
                ..Default::default()
            },
            ..Default::default()
        };
        assert_eq!(
            adopt_patch(&controller_ref(&s), "rev-uid", &[]),
            json!({"metadata": {
                "ownerReferences": [{
                    "apiVersion": "apps/v1",
                    "kind": "StatefulSet",
                    "name": "web",
                    "uid": "sts-uid",
                    "controller": true,
                    "blockOwnerDeletion": true,
                }],
                "uid": "rev-uid",
            }})
        );
    }

    /// The Job controller's release patch, byte for byte (controllers/job `act::release_pod`).
    #[test]
    fn release_patch_equals_jobs() {
        let jobs = json!({"metadata": {
            "ownerReferences": [{"$patch": "delete", "uid": "job-uid"}],
            "$deleteFromPrimitiveList/finalizers": [TRACKING],
            "uid": "pod-uid",
        }});
        let ours = release_patch("job-uid", "pod-uid", &[TRACKING]);
        assert_eq!(ours, jobs);
        assert_eq!(ours.to_string(), jobs.to_string());
    }

    /// Upstream's shape without finalizers (`$deleteFromPrimitiveList/finalizers` is `omitempty`).
    #[test]
    fn release_patch_without_finalizers() {
        assert_eq!(
            release_patch("sts-uid", "rev-uid", &[]),
            json!({"metadata": {
                "uid": "rev-uid",
                "ownerReferences": [{"$patch": "delete", "uid": "sts-uid"}],
            }})
        );
    }

    fn api(code: u16, reason: &str) -> kube::Error {
        kube::Error::Api(Box::new(kube::core::Status {
            code,
            reason: reason.into(),
            ..kube::core::Status::failure("m", reason)
        }))
    }

    #[test]
    fn ignored_errors_as_upstream() {
        assert!(adopt_error_ignored(&api(404, "NotFound")));
        assert!(!adopt_error_ignored(&api(422, "Invalid")));
        assert!(!adopt_error_ignored(&api(409, "Conflict")));
        assert!(release_error_ignored(&api(404, "NotFound")));
        assert!(release_error_ignored(&api(422, "Invalid")));
        assert!(!release_error_ignored(&api(409, "Conflict")));
        assert!(!release_error_ignored(&api(500, "InternalError")));
    }
}
