//! Identity and storage (ST-6, ST-7, ST-10, ST-32..ST-36): ordinals from names, the bodies of new
//! pods and claims (JSON built from the template as served, ST-8), whether a pod keeps its
//! identity and claims, and the owner references a claim should carry under the retention
//! policy. Pure functions, upstream's `stateful_set_utils.go`.

use crate::model::{Policy, StatefulSet, template_name};
use k8s_openapi::api::core::v1::PersistentVolumeClaim;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use serde_json::{Map, Value, json};
use shared::cache::pod::Pod;
use shared::meta::refs::refers_to_version;

pub const POD_NAME_LABEL: &str = "statefulset.kubernetes.io/pod-name";
pub const POD_INDEX_LABEL: &str = "apps.kubernetes.io/pod-index";
pub const REVISION_LABEL: &str = "controller-revision-hash";

/// ST-6: the parent name and ordinal of `<parent>-<digits>`; an ordinal that does not fit an
/// int32 (or no such suffix) is -1.
pub fn parent_and_ordinal(name: &str) -> (&str, i32) {
    let Some((parent, digits)) = name.rsplit_once('-') else {
        return ("", -1);
    };
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return ("", -1);
    }
    (parent, digits.parse::<i32>().unwrap_or(-1))
}

pub fn ordinal(name: &str) -> i32 {
    parent_and_ordinal(name).1
}

pub fn pod_name(set: &str, ordinal: i32) -> String {
    format!("{set}-{ordinal}")
}

/// ST-7: a claim's name, `<template>-<set>-<ordinal>`.
pub fn claim_name(template: &str, set: &str, ordinal: i32) -> String {
    format!("{template}-{set}-{ordinal}")
}

/// The pod's controller reference to its set (ST-7).
pub fn set_ref(set: &StatefulSet) -> OwnerReference {
    OwnerReference {
        api_version: "apps/v1".into(),
        kind: "StatefulSet".into(),
        name: set.name().into(),
        uid: set.uid().into(),
        controller: Some(true),
        block_owner_deletion: Some(true),
    }
}

fn pod_ref(name: &str, uid: &str) -> OwnerReference {
    OwnerReference {
        api_version: "v1".into(),
        kind: "Pod".into(),
        name: name.into(),
        uid: uid.into(),
        controller: Some(true),
        block_owner_deletion: Some(true),
    }
}

fn object(v: &mut Value) -> &mut Map<String, Value> {
    if !v.is_object() {
        *v = Value::Object(Map::new());
    }
    v.as_object_mut().expect("made an object")
}

/// ST-7, ST-9: the body of a new pod for `ordinal` from `template` (the pod template of the
/// revision it gets, as JSON), labelled with that revision's name.
pub fn new_pod(set: &StatefulSet, template: &Value, ordinal: i32, revision: &str) -> Value {
    let name = pod_name(set.name(), ordinal);
    let tmeta = template.get("metadata");
    let mut labels = tmeta
        .and_then(|m| m.get("labels"))
        .cloned()
        .unwrap_or_else(|| json!({}));
    {
        let l = object(&mut labels);
        l.insert(POD_NAME_LABEL.into(), json!(name));
        l.insert(POD_INDEX_LABEL.into(), json!(ordinal.to_string()));
        l.insert(REVISION_LABEL.into(), json!(revision));
    }
    // Upstream's generateName prefix: `<set>-` unless that is no longer a valid name.
    let prefix = if set.name().len() < 253 {
        format!("{}-", set.name())
    } else {
        set.name().to_string()
    };
    let mut meta = Map::new();
    meta.insert("name".into(), json!(name));
    meta.insert("generateName".into(), json!(prefix));
    meta.insert("namespace".into(), json!(set.namespace()));
    meta.insert("labels".into(), labels);
    for key in ["annotations", "finalizers"] {
        if let Some(v) = tmeta.and_then(|m| m.get(key)).filter(|v| !v.is_null()) {
            meta.insert(key.into(), v.clone());
        }
    }
    meta.insert("ownerReferences".into(), json!([set_ref(set)]));
    let mut spec = template.get("spec").cloned().unwrap_or_else(|| json!({}));
    {
        let s = object(&mut spec);
        s.insert("hostname".into(), json!(name));
        if !set.service_name().is_empty() {
            s.insert("subdomain".into(), json!(set.service_name()));
        }
    }
    let spec = with_claim_volumes(set, ordinal, json!({"spec": spec}))["spec"].take();
    json!({"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": spec})
}

/// Upstream `updateStorage` on a pod body: its claim volumes set per the templates.
pub fn with_claim_volumes(set: &StatefulSet, ordinal: i32, mut pod: Value) -> Value {
    let spec = object(object(&mut pod).entry("spec").or_insert_with(|| json!({})));
    let current = spec.remove("volumes");
    let vs = volumes(set, ordinal, current);
    if !vs.is_empty() {
        spec.insert("volumes".into(), Value::Array(vs));
    }
    pod
}

/// Upstream `updateStorage`: a claim volume per template (in template order), then the pod's
/// other volumes.
fn volumes(set: &StatefulSet, ordinal: i32, current: Option<Value>) -> Vec<Value> {
    let templates = set.claim_template_names();
    let mut out: Vec<Value> = templates
        .iter()
        .map(|t| {
            json!({"name": t, "persistentVolumeClaim": {"claimName": claim_name(t, set.name(), ordinal)}})
        })
        .collect();
    if let Some(Value::Array(vs)) = current {
        out.extend(vs.into_iter().filter(|v| {
            v.get("name")
                .and_then(Value::as_str)
                .is_none_or(|n| !templates.contains(&n))
        }));
    }
    out
}

/// ST-32: the claims a pod of `ordinal` needs, as (claim name, body).
pub fn new_claims(set: &StatefulSet, ordinal: i32) -> Vec<(String, Value)> {
    let spec = set.spec();
    let selector_labels = spec
        .selector
        .as_ref()
        .and_then(|s| s.match_labels.clone())
        .unwrap_or_default();
    spec.volume_claim_templates
        .iter()
        .flatten()
        .filter_map(|t| {
            let tname = template_name(t)?;
            let name = claim_name(tname, set.name(), ordinal);
            let mut claim = t.clone();
            let c = object(&mut claim);
            c.insert("apiVersion".into(), json!("v1"));
            c.insert("kind".into(), json!("PersistentVolumeClaim"));
            c.remove("status");
            let meta = object(c.entry("metadata").or_insert_with(|| json!({})));
            meta.insert("name".into(), json!(name));
            meta.insert("namespace".into(), json!(set.namespace()));
            let labels = object(meta.entry("labels").or_insert_with(|| json!({})));
            for (k, v) in &selector_labels {
                labels.insert(k.clone(), json!(v));
            }
            Some((name, claim))
        })
        .collect()
}

pub fn label<'a>(pod: &'a Pod, key: &str) -> Option<&'a str> {
    pod.metadata.labels.as_ref()?.get(key).map(String::as_str)
}

/// ST-10 (upstream `identityMatches`; the pod-index label is checked too, which upstream
/// repairs but does not check).
pub fn identity_matches(set: &StatefulSet, pod: &Pod) -> bool {
    let name = pod.metadata.name.as_deref().unwrap_or_default();
    let (parent, ord) = parent_and_ordinal(name);
    ord >= 0
        && parent == set.name()
        && name == pod_name(set.name(), ord)
        && pod.metadata.namespace.as_deref() == Some(set.namespace())
        && label(pod, POD_NAME_LABEL) == Some(name)
        && label(pod, POD_INDEX_LABEL) == Some(ord.to_string().as_str())
}

/// ST-10 (upstream `storageMatches`): every claim template has its volume naming the right
/// claim. Needs the pod's volumes (declared: `PodFields::VOLUMES`).
pub fn storage_matches(set: &StatefulSet, pod: &Pod) -> bool {
    let ord = ordinal(pod.metadata.name.as_deref().unwrap_or_default());
    if ord < 0 {
        return false;
    }
    let volumes = pod
        .spec
        .as_ref()
        .and_then(|s| s.volumes.as_deref())
        .unwrap_or_default();
    set.claim_template_names().iter().all(|t| {
        volumes.iter().any(|v| {
            v.name == *t
                && v.persistent_volume_claim
                    .as_ref()
                    .map(|c| c.claim_name.as_str())
                    == Some(claim_name(t, set.name(), ord).as_str())
        })
    })
}

/// Who a claim's references are judged against: the set and the pod of its ordinal (the pod may
/// not exist yet: no UID).
pub struct Owners<'a> {
    pub set: &'a StatefulSet,
    pub pod_name: &'a str,
    pub pod_uid: &'a str,
    /// The pod's ordinal is outside the set's range (scaled down).
    pub condemned: bool,
}

fn matches_set(r: &OwnerReference, o: &Owners) -> bool {
    refers_to_version::<StatefulSet>(r) && r.name == o.set.name()
}

fn matches_pod(r: &OwnerReference, o: &Owners) -> bool {
    refers_to_version::<Pod>(r) && r.name == o.pod_name
}

fn refs(claim: &PersistentVolumeClaim) -> &[OwnerReference] {
    claim
        .metadata
        .owner_references
        .as_deref()
        .unwrap_or_default()
}

fn has_ref(claim: &PersistentVolumeClaim, uid: &str) -> bool {
    !uid.is_empty() && refs(claim).iter().any(|r| r.uid == uid)
}

/// ST-36 and the stale half of ST-35: a reference with our set's or pod's name and kind but
/// another UID (the first such reference decides, as upstream).
fn stale_ref(claim: &PersistentVolumeClaim, o: &Owners, pod: bool) -> bool {
    refs(claim)
        .iter()
        .find(|r| {
            if pod {
                matches_pod(r, o)
            } else {
                matches_set(r, o)
            }
        })
        .is_some_and(|r| r.uid != if pod { o.pod_uid } else { o.set.uid() })
}

/// ST-36: with whenScaled Delete, a claim still owned by an earlier pod of the same name is
/// being collected: the pod must not be created on it.
pub fn claim_is_stale(claim: &PersistentVolumeClaim, o: &Owners) -> bool {
    o.set.retention().1 == Policy::Delete && stale_ref(claim, o, true)
}

/// ST-35: another controller owns the claim (only under a non-Retain policy).
pub fn has_unexpected_controller(claim: &PersistentVolumeClaim, o: &Owners) -> bool {
    if o.set.retention() == (Policy::Retain, Policy::Retain) {
        return false;
    }
    refs(claim).iter().any(|r| {
        if matches_set(r, o) {
            r.uid != o.set.uid()
        } else if matches_pod(r, o) {
            r.uid != o.pod_uid
        } else {
            r.controller == Some(true)
        }
    })
}

/// ST-34 (upstream `isClaimOwnerUpToDate`).
pub fn claim_refs_up_to_date(claim: &PersistentVolumeClaim, o: &Owners) -> bool {
    if stale_ref(claim, o, false) || stale_ref(claim, o, true) {
        return true;
    }
    let (set_uid, pod_uid) = (o.set.uid(), o.pod_uid);
    if has_unexpected_controller(claim, o) {
        return !(has_ref(claim, set_uid) || has_ref(claim, pod_uid));
    }
    let non_controller = refs(claim).iter().any(|r| {
        (r.uid == set_uid || (!pod_uid.is_empty() && r.uid == pod_uid))
            && r.controller != Some(true)
    });
    if non_controller {
        return false;
    }
    let (set_has, pod_has) = (has_ref(claim, set_uid), has_ref(claim, pod_uid));
    match o.set.retention() {
        (Policy::Retain, Policy::Retain) => !set_has && !pod_has,
        (Policy::Delete, Policy::Retain) => set_has && !pod_has,
        (Policy::Retain, Policy::Delete) => !set_has && o.condemned == pod_has,
        (Policy::Delete, Policy::Delete) => o.condemned != set_has && o.condemned == pod_has,
    }
}

/// ST-34/ST-35 (upstream `updateClaimOwnerRefForSetAndPod`): the references the claim should
/// carry. Our references are dropped and re-added per policy; another controller's presence
/// leaves ours out.
pub fn claim_refs(claim: &PersistentVolumeClaim, o: &Owners) -> Vec<OwnerReference> {
    let unexpected = has_unexpected_controller(claim, o);
    let mut out: Vec<OwnerReference> = refs(claim)
        .iter()
        .filter(|r| !matches_set(r, o) && !matches_pod(r, o))
        .cloned()
        .collect();
    if unexpected {
        return out;
    }
    let add = |out: &mut Vec<OwnerReference>, r: OwnerReference| {
        if !out.iter().any(|x| x.uid == r.uid) {
            out.push(r);
        }
    };
    match o.set.retention() {
        (Policy::Retain, Policy::Retain) => {}
        (Policy::Delete, Policy::Retain) => add(&mut out, set_ref(o.set)),
        (Policy::Retain, Policy::Delete) => {
            if o.condemned && !o.pod_uid.is_empty() {
                add(&mut out, pod_ref(o.pod_name, o.pod_uid));
            }
        }
        (Policy::Delete, Policy::Delete) => {
            if o.condemned {
                if !o.pod_uid.is_empty() {
                    add(&mut out, pod_ref(o.pod_name, o.pod_uid));
                }
            } else {
                add(&mut out, set_ref(o.set));
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::Spec;
    use k8s_openapi::api::apps::v1::StatefulSetPersistentVolumeClaimRetentionPolicy;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta};

    fn set(policy: (&str, &str)) -> StatefulSet {
        StatefulSet {
            metadata: ObjectMeta {
                name: Some("web".into()),
                namespace: Some("ns".into()),
                uid: Some("set-uid".into()),
                ..Default::default()
            },
            spec: Some(Spec {
                replicas: Some(3),
                service_name: Some("web".into()),
                selector: Some(LabelSelector {
                    match_labels: Some([("app".to_string(), "web".to_string())].into()),
                    ..Default::default()
                }),
                persistent_volume_claim_retention_policy: Some(
                    StatefulSetPersistentVolumeClaimRetentionPolicy {
                        when_deleted: Some(policy.0.into()),
                        when_scaled: Some(policy.1.into()),
                    },
                ),
                volume_claim_templates: Some(vec![json!({
                    "metadata": {"name": "data", "labels": {"tier": "db"}, "annotations": {"a": "b"}},
                    "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}},
                    "status": {"phase": "Pending"}
                })]),
                template: json!({
                    "metadata": {"labels": {"app": "web"}, "annotations": {"x": "y"}, "creationTimestamp": null},
                    "spec": {"containers": [{"name": "c", "image": "i", "resources": {}}],
                             "volumes": [{"name": "data", "emptyDir": {}}, {"name": "cfg", "configMap": {"name": "c"}}],
                             "futureField": {"kept": true}}
                }),
                ..Default::default()
            }),
            status: None,
        }
    }

    #[test]
    fn st6_ordinals_from_names() {
        for (name, want) in [
            ("web-0", ("web", 0)),
            ("web-12", ("web", 12)),
            ("my-web-3", ("my-web", 3)),
            ("web-01", ("web", 1)),
            ("web-", ("", -1)),
            ("web", ("", -1)),
            ("web-x1", ("", -1)),
            ("web-2147483647", ("web", i32::MAX)),
            ("web-2147483648", ("web", -1)),
            ("web-99999999999999999999999", ("web", -1)),
        ] {
            assert_eq!(parent_and_ordinal(name), want, "{name}");
        }
    }

    #[test]
    fn st7_new_pod_from_the_template_as_served() {
        let s = set(("Retain", "Retain"));
        let tpl = s.spec.as_ref().unwrap().template.clone();
        let pod = new_pod(&s, &tpl, 2, "web-abc");
        assert_eq!(pod["metadata"]["name"], "web-2");
        assert_eq!(pod["metadata"]["generateName"], "web-");
        assert_eq!(pod["metadata"]["namespace"], "ns");
        assert_eq!(
            pod["metadata"]["labels"],
            json!({"app": "web", POD_NAME_LABEL: "web-2", POD_INDEX_LABEL: "2", REVISION_LABEL: "web-abc"})
        );
        assert_eq!(pod["metadata"]["annotations"], json!({"x": "y"}));
        assert_eq!(pod["metadata"]["ownerReferences"][0]["uid"], "set-uid");
        assert_eq!(pod["metadata"]["ownerReferences"][0]["controller"], true);
        assert_eq!(pod["spec"]["hostname"], "web-2");
        assert_eq!(pod["spec"]["subdomain"], "web");
        // ST-8: unknown fields survive.
        assert_eq!(pod["spec"]["futureField"], json!({"kept": true}));
        // The claim volume replaces the template's volume of the same name.
        assert_eq!(
            pod["spec"]["volumes"],
            json!([{"name": "data", "persistentVolumeClaim": {"claimName": "data-web-2"}},
                   {"name": "cfg", "configMap": {"name": "c"}}])
        );
        let cached: Pod = serde_json::from_value(pod).unwrap();
        assert!(identity_matches(&s, &cached));
        assert!(storage_matches(&s, &cached));
    }

    #[test]
    fn st10_identity_and_storage_mismatches() {
        let s = set(("Retain", "Retain"));
        let tpl = s.spec.as_ref().unwrap().template.clone();
        let good: Pod = serde_json::from_value(new_pod(&s, &tpl, 1, "r")).unwrap();
        let mut no_label = good.clone();
        no_label
            .metadata
            .labels
            .as_mut()
            .unwrap()
            .remove(POD_NAME_LABEL);
        assert!(!identity_matches(&s, &no_label));
        let mut other_ns = good.clone();
        other_ns.metadata.namespace = Some("x".into());
        assert!(!identity_matches(&s, &other_ns));
        let mut no_volume = good.clone();
        no_volume.spec.as_mut().unwrap().volumes = None;
        assert!(!storage_matches(&s, &no_volume));
    }

    #[test]
    fn st32_claims_take_template_and_selector_labels() {
        let s = set(("Retain", "Retain"));
        let claims = new_claims(&s, 4);
        assert_eq!(claims.len(), 1);
        let (name, body) = &claims[0];
        assert_eq!(name, "data-web-4");
        assert_eq!(
            body["metadata"]["labels"],
            json!({"tier": "db", "app": "web"})
        );
        assert_eq!(body["metadata"]["annotations"], json!({"a": "b"}));
        assert_eq!(body["metadata"]["namespace"], "ns");
        assert!(body.get("status").is_none());
    }

    fn claim(refs: Vec<OwnerReference>) -> PersistentVolumeClaim {
        PersistentVolumeClaim {
            metadata: ObjectMeta {
                name: Some("data-web-1".into()),
                owner_references: Some(refs),
                ..Default::default()
            },
            ..Default::default()
        }
    }

    #[test]
    fn st34_desired_refs_per_policy() {
        // (policy, condemned) -> (set ref, pod ref)
        for (policy, condemned, want) in [
            (("Retain", "Retain"), false, (false, false)),
            (("Retain", "Retain"), true, (false, false)),
            (("Delete", "Retain"), false, (true, false)),
            (("Delete", "Retain"), true, (true, false)),
            (("Retain", "Delete"), false, (false, false)),
            (("Retain", "Delete"), true, (false, true)),
            (("Delete", "Delete"), false, (true, false)),
            (("Delete", "Delete"), true, (false, true)),
        ] {
            let s = set(policy);
            let o = Owners {
                set: &s,
                pod_name: "web-1",
                pod_uid: "pod-uid",
                condemned,
            };
            let c = claim(vec![]);
            let refs = claim_refs(&c, &o);
            let has = |uid: &str| {
                refs.iter()
                    .any(|r| r.uid == uid && r.controller == Some(true))
            };
            assert_eq!(
                (has("set-uid"), has("pod-uid")),
                want,
                "{policy:?} {condemned}"
            );
            let fixed = claim(refs.clone());
            assert!(claim_refs_up_to_date(&fixed, &o), "{policy:?} {condemned}");
            assert_eq!(claim_refs_up_to_date(&c, &o), want == (false, false));
        }
    }

    #[test]
    fn st35_a_foreign_controller_strips_ours_and_adds_none() {
        let s = set(("Delete", "Delete"));
        let o = Owners {
            set: &s,
            pod_name: "web-1",
            pod_uid: "pod-uid",
            condemned: false,
        };
        let foreign = OwnerReference {
            api_version: "x/v1".into(),
            kind: "Other".into(),
            name: "o".into(),
            uid: "o-uid".into(),
            controller: Some(true),
            block_owner_deletion: None,
        };
        let c = claim(vec![foreign.clone(), set_ref(&s)]);
        assert!(has_unexpected_controller(&c, &o));
        assert!(!claim_refs_up_to_date(&c, &o));
        assert_eq!(claim_refs(&c, &o), vec![foreign.clone()]);
        assert!(claim_refs_up_to_date(&claim(vec![foreign]), &o));
        // Retain/Retain never reports a conflict.
        let r = set(("Retain", "Retain"));
        let o = Owners { set: &r, ..o };
        assert!(!has_unexpected_controller(&c, &o));
    }

    #[test]
    fn st36_a_claim_of_an_earlier_pod_is_stale_under_when_scaled_delete() {
        let s = set(("Retain", "Delete"));
        let o = Owners {
            set: &s,
            pod_name: "web-1",
            pod_uid: "",
            condemned: false,
        };
        let old = claim(vec![pod_ref("web-1", "old-pod")]);
        assert!(claim_is_stale(&old, &o));
        assert!(claim_refs_up_to_date(&old, &o), "stale refs are left alone");
        let r = set(("Retain", "Retain"));
        assert!(!claim_is_stale(&old, &Owners { set: &r, ..o }));
    }
}
