//! NM-9 and NM-10: which of a node's pods a drain targets, in kubectl drain's filter order
//! (`skipDeletedFilter`, `daemonSetFilter`, `mirrorPodFilter`, then the pod selector), and
//! whether the targets have the consent `force` / `deleteEmptyDirData` give, in kubectl's words.

use crate::types::DrainSpec;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use k8s_openapi::jiff::Timestamp;
use shared::cache::pod::Pod;

/// kubectl's `corev1.MirrorPodAnnotationKey`.
pub const MIRROR_ANNOTATION: &str = "kubernetes.io/config.mirror";
/// kubectl's fatal messages (filters.go), prefixed with "cannot delete " when reported.
pub const UNMANAGED_FATAL: &str = "Pods that declare no controller (use --force to override)";
pub const LOCAL_STORAGE_FATAL: &str =
    "Pods with local storage (use --delete-emptydir-data to override)";

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Class {
    /// Terminating longer than `skipWaitForDeleteTimeoutSeconds`: counts as gone.
    Gone,
    SkippedDaemonSet,
    SkippedMirror,
    SkippedNotSelected,
    /// A target; `consent` names what it lacks, if anything.
    Target {
        consent: Option<Consent>,
    },
}

/// Why a non-terminal target may not be evicted without the user's consent (NM-10).
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Consent {
    /// Its controller is a DaemonSet that no longer exists (kubectl prints the lookup error).
    VanishedDaemonSet(String),
    LocalStorage,
    NoController,
}

impl Consent {
    /// The text kubectl's aggregate error groups pods under.
    pub fn words(&self) -> String {
        match self {
            Consent::VanishedDaemonSet(name) => format!("daemonsets.apps \"{name}\" not found"),
            Consent::LocalStorage => LOCAL_STORAGE_FATAL.to_string(),
            Consent::NoController => UNMANAGED_FATAL.to_string(),
        }
    }
}

pub fn is_terminal(pod: &Pod) -> bool {
    matches!(
        pod.status.as_ref().and_then(|s| s.phase.as_deref()),
        Some("Succeeded" | "Failed")
    )
}

pub fn is_terminating(pod: &Pod) -> bool {
    pod.metadata.deletion_timestamp.is_some()
}

fn has_local_storage(pod: &Pod) -> bool {
    pod.spec
        .as_ref()
        .and_then(|s| s.volumes.as_ref())
        .is_some_and(|vs| vs.iter().any(|v| v.empty_dir.is_some()))
}

/// kubectl's `isControllerRefDaemonSet`: kind and apiVersion exactly `apps/v1` DaemonSet.
fn daemon_set_controller(pod: &Pod) -> Option<&str> {
    shared::meta::refs::controller_of(&pod.metadata)
        .filter(|r| {
            shared::meta::refs::refers_to_version::<k8s_openapi::api::apps::v1::DaemonSet>(r)
        })
        .map(|r| r.name.as_str())
}

/// kubectl's `shouldSkipPod`: whole seconds since the deletion timestamp exceed the timeout.
/// Saturating: any int64 timeout and any timestamp are fine.
pub fn terminating_past(pod: &Pod, skip_wait_seconds: Option<i64>, now: Timestamp) -> bool {
    let (Some(limit), Some(deleted)) =
        (skip_wait_seconds, pod.metadata.deletion_timestamp.as_ref())
    else {
        return false;
    };
    limit > 0 && now.duration_since(deleted.0).as_secs() > limit
}

/// A selector's own errors (apimachinery's `LabelSelectorAsSelector`): an unknown operator, or
/// `In`/`NotIn` without values, `Exists`/`DoesNotExist` with values. The message names the field.
pub fn validate_selector(selector: Option<&LabelSelector>) -> Result<(), String> {
    for (i, req) in selector
        .and_then(|s| s.match_expressions.as_ref())
        .into_iter()
        .flatten()
        .enumerate()
    {
        let values = req.values.as_deref().unwrap_or_default();
        let field = format!("spec.drain.podSelector.matchExpressions[{i}]");
        match req.operator.as_str() {
            "In" | "NotIn" if values.is_empty() => {
                return Err(format!(
                    "{field}.values: Required value: must be specified when `operator` is 'In' or 'NotIn'"
                ));
            }
            "Exists" | "DoesNotExist" if !values.is_empty() => {
                return Err(format!(
                    "{field}.values: Forbidden: may not be specified when `operator` is 'Exists' or 'DoesNotExist'"
                ));
            }
            "In" | "NotIn" | "Exists" | "DoesNotExist" => {}
            op => {
                return Err(format!(
                    "{field}.operator: Unsupported value: {op:?}: supported values: \"In\", \"NotIn\", \"Exists\", \"DoesNotExist\""
                ));
            }
        }
    }
    Ok(())
}

/// Whether the pod matches the drain's selector (none = all). Call after [`validate_selector`].
fn selected(selector: Option<&LabelSelector>, pod: &Pod) -> bool {
    match selector {
        None => true,
        Some(s) => {
            shared::meta::selector::matches(Some(s), pod.metadata.labels.as_ref()).unwrap_or(false)
        }
    }
}

/// NM-9 and NM-10 for one pod. `daemon_set_exists(namespace, name)` asks the DaemonSet cache.
pub fn classify(
    pod: &Pod,
    drain: &DrainSpec,
    daemon_set_exists: impl Fn(&str, &str) -> bool,
    now: Timestamp,
) -> Class {
    if terminating_past(pod, drain.skip_wait_for_delete_timeout_seconds, now) {
        return Class::Gone;
    }
    let terminal = is_terminal(pod);
    let namespace = pod.metadata.namespace.as_deref().unwrap_or_default();
    let mut vanished = None;
    if let Some(ds) = daemon_set_controller(pod)
        && !terminal
    {
        if daemon_set_exists(namespace, ds) {
            return Class::SkippedDaemonSet;
        }
        vanished = Some(ds.to_string());
    }
    if pod
        .metadata
        .annotations
        .as_ref()
        .is_some_and(|a| a.contains_key(MIRROR_ANNOTATION))
    {
        return Class::SkippedMirror;
    }
    if !selected(drain.pod_selector.as_ref(), pod) {
        return Class::SkippedNotSelected;
    }
    // kubectl's order after the skips: the DaemonSet lookup error, local storage, then
    // unreplicated; a pod reports the first it fails. Terminal pods need no consent.
    let consent = if terminal {
        None
    } else if let Some(ds) = vanished.filter(|_| !drain.force) {
        Some(Consent::VanishedDaemonSet(ds))
    } else if !drain.delete_empty_dir_data && has_local_storage(pod) {
        Some(Consent::LocalStorage)
    } else if !drain.force && shared::meta::refs::controller_of(&pod.metadata).is_none() {
        Some(Consent::NoController)
    } else {
        None
    };
    Class::Target { consent }
}

/// NM-10: kubectl's aggregate error for the pods lacking consent, one clause per reason:
/// `cannot delete <words>: ns/a, ns/b; cannot delete <words>: ns/c`.
pub fn consent_message(missing: &[(Consent, String)]) -> String {
    let mut groups: std::collections::BTreeMap<&Consent, Vec<&str>> = Default::default();
    for (c, pod) in missing {
        groups.entry(c).or_default().push(pod);
    }
    groups
        .into_iter()
        .map(|(c, pods)| format!("cannot delete {}: {}", c.words(), pods.join(", ")))
        .collect::<Vec<_>>()
        .join("; ")
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::EmptyDirVolumeSource;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{
        LabelSelectorRequirement, ObjectMeta, OwnerReference, Time,
    };
    use shared::cache::pod::{PodSpec, PodStatus, Volume};

    fn now() -> Timestamp {
        "2026-01-01T00:10:00Z".parse().unwrap()
    }

    fn pod() -> Pod {
        Pod {
            metadata: ObjectMeta {
                name: Some("p".into()),
                namespace: Some("ns".into()),
                labels: Some([("app".to_string(), "web".to_string())].into()),
                owner_references: Some(vec![owner("apps/v1", "ReplicaSet", "rs")]),
                ..Default::default()
            },
            spec: Some(PodSpec::default()),
            status: Some(PodStatus {
                phase: Some("Running".into()),
                ..Default::default()
            }),
        }
    }

    fn owner(api_version: &str, kind: &str, name: &str) -> OwnerReference {
        OwnerReference {
            api_version: api_version.into(),
            kind: kind.into(),
            name: name.into(),
            uid: format!("uid-{name}"),
            controller: Some(true),
            ..Default::default()
        }
    }

    fn with(f: impl FnOnce(&mut Pod)) -> Pod {
        let mut p = pod();
        f(&mut p);
        p
    }

    fn bare(p: &mut Pod) {
        p.metadata.owner_references = None;
    }

    fn empty_dir(p: &mut Pod) {
        p.spec.as_mut().unwrap().volumes = Some(vec![Volume {
            name: "scratch".into(),
            empty_dir: Some(EmptyDirVolumeSource::default()),
            ..Default::default()
        }]);
    }

    fn phase(p: &mut Pod, ph: &str) {
        p.status.as_mut().unwrap().phase = Some(ph.into());
    }

    fn daemon(p: &mut Pod) {
        p.metadata.owner_references = Some(vec![owner("apps/v1", "DaemonSet", "logship")]);
    }

    fn deleted_secs_ago(p: &mut Pod, secs: i64) {
        p.metadata.deletion_timestamp = Some(Time(
            now()
                .checked_sub(k8s_openapi::jiff::SignedDuration::from_secs(secs))
                .unwrap(),
        ));
    }

    fn drain(force: bool, empty_dir: bool) -> DrainSpec {
        DrainSpec {
            force,
            delete_empty_dir_data: empty_dir,
            ..DrainSpec::default()
        }
    }

    #[test]
    fn nm_9_filter_order_and_skips() {
        let ds_exists = |_: &str, name: &str| name == "logship";
        let ds_gone = |_: &str, _: &str| false;
        let d = DrainSpec {
            skip_wait_for_delete_timeout_seconds: Some(30),
            pod_selector: Some(LabelSelector {
                match_labels: Some([("app".to_string(), "web".to_string())].into()),
                ..Default::default()
            }),
            ..DrainSpec::default()
        };
        let target = Class::Target { consent: None };
        let rows: Vec<(&str, Pod, Class)> = vec![
            ("plain target", pod(), target.clone()),
            (
                "terminating 31s > 30s: gone",
                with(|p| deleted_secs_ago(p, 31)),
                Class::Gone,
            ),
            (
                "terminating 30s: still a target",
                with(|p| deleted_secs_ago(p, 30)),
                target.clone(),
            ),
            // skip-wait runs first: a long-terminating DaemonSet pod is gone, not skipped.
            (
                "daemonset terminating long",
                with(|p| {
                    daemon(p);
                    deleted_secs_ago(p, 100)
                }),
                Class::Gone,
            ),
            ("daemonset pod", with(daemon), Class::SkippedDaemonSet),
            (
                "terminal daemonset pod is a target",
                with(|p| {
                    daemon(p);
                    phase(p, "Succeeded")
                }),
                target.clone(),
            ),
            (
                "mirror pod",
                with(|p| {
                    p.metadata.annotations =
                        Some([(MIRROR_ANNOTATION.to_string(), "x".to_string())].into())
                }),
                Class::SkippedMirror,
            ),
            // DaemonSet before mirror, as kubectl.
            (
                "mirror daemonset pod",
                with(|p| {
                    daemon(p);
                    p.metadata.annotations =
                        Some([(MIRROR_ANNOTATION.to_string(), "x".to_string())].into())
                }),
                Class::SkippedDaemonSet,
            ),
            (
                "not selected",
                with(|p| p.metadata.labels = None),
                Class::SkippedNotSelected,
            ),
            // A DaemonSet kind under another apiVersion is not a DaemonSet to kubectl.
            (
                "extensions daemonset is an ordinary controller",
                with(|p| {
                    p.metadata.owner_references =
                        Some(vec![owner("extensions/v1beta1", "DaemonSet", "logship")])
                }),
                target.clone(),
            ),
        ];
        for (name, p, want) in rows {
            assert_eq!(classify(&p, &d, ds_exists, now()), want, "{name}");
        }
        // A vanished DaemonSet makes its pod a target (force=true: consent given).
        assert_eq!(classify(&with(daemon), &d, ds_gone, now()), target);
    }

    #[test]
    fn nm_10_consent_in_kubectl_order() {
        let ds_gone = |_: &str, _: &str| false;
        let rows: Vec<(&str, Pod, DrainSpec, Option<Consent>)> = vec![
            ("bare, force", with(bare), drain(true, true), None),
            (
                "bare, no force",
                with(bare),
                drain(false, true),
                Some(Consent::NoController),
            ),
            (
                "emptyDir, allowed",
                with(empty_dir),
                drain(true, true),
                None,
            ),
            (
                "emptyDir, not allowed",
                with(empty_dir),
                drain(true, false),
                Some(Consent::LocalStorage),
            ),
            // Local storage is checked before the controller, as kubectl's filters run.
            (
                "bare emptyDir, neither",
                with(|p| {
                    bare(p);
                    empty_dir(p)
                }),
                drain(false, false),
                Some(Consent::LocalStorage),
            ),
            (
                "bare terminal needs nothing",
                with(|p| {
                    bare(p);
                    empty_dir(p);
                    phase(p, "Failed")
                }),
                drain(false, false),
                None,
            ),
            (
                "vanished daemonset, no force",
                with(daemon),
                drain(false, true),
                Some(Consent::VanishedDaemonSet("logship".into())),
            ),
            (
                "controller ref without controller=true is no controller",
                with(|p| p.metadata.owner_references.as_mut().unwrap()[0].controller = None),
                drain(false, true),
                Some(Consent::NoController),
            ),
        ];
        for (name, p, d, want) in rows {
            assert_eq!(
                classify(&p, &d, ds_gone, now()),
                Class::Target { consent: want },
                "{name}"
            );
        }
    }

    #[test]
    fn nm_10_message_in_kubectl_words() {
        let msg = consent_message(&[
            (Consent::NoController, "shop/legacy".into()),
            (Consent::LocalStorage, "shop/cache".into()),
            (Consent::NoController, "shop/old".into()),
        ]);
        assert_eq!(
            msg,
            "cannot delete Pods with local storage (use --delete-emptydir-data to override): shop/cache; \
             cannot delete Pods that declare no controller (use --force to override): shop/legacy, shop/old"
        );
    }

    #[test]
    fn skip_wait_extremes_never_panic() {
        for limit in [Some(i64::MAX), Some(i64::MIN), Some(0), Some(1), None] {
            let p = with(|p| p.metadata.deletion_timestamp = Some(Time(Timestamp::MIN)));
            let _ = terminating_past(&p, limit, now());
            let p = with(|p| p.metadata.deletion_timestamp = Some(Time(Timestamp::MAX)));
            assert!(!terminating_past(&p, limit, now()));
        }
        let p = with(|p| p.metadata.deletion_timestamp = Some(Time(Timestamp::MIN)));
        assert!(terminating_past(&p, Some(1), now()));
        assert!(!terminating_past(&p, Some(i64::MAX), Timestamp::MAX));
    }

    #[test]
    fn invalid_selectors_name_the_field() {
        let sel = |op: &str, values: Option<Vec<String>>| LabelSelector {
            match_expressions: Some(vec![LabelSelectorRequirement {
                key: "k".into(),
                operator: op.into(),
                values,
            }]),
            ..Default::default()
        };
        assert!(validate_selector(None).is_ok());
        assert!(validate_selector(Some(&sel("In", Some(vec!["a".into()])))).is_ok());
        for bad in [
            sel("In", None),
            sel("Exists", Some(vec!["a".into()])),
            sel("Near", None),
        ] {
            let e = validate_selector(Some(&bad)).unwrap_err();
            assert!(
                e.starts_with("spec.drain.podSelector.matchExpressions[0]"),
                "{e}"
            );
        }
    }
}
