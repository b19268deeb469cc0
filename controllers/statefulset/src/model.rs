//! The StatefulSet as the cache holds it: the fields the controller reads, typed, and the pod
//! template and claim templates as the API server's JSON (ST-8: pods, claims and revision data
//! are built from it losslessly, so fields unknown to k8s-openapi are never dropped and revision
//! bytes equal upstream's, ST-12).

use k8s_openapi::api::apps::v1 as apps;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use std::borrow::Cow;

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct StatefulSet {
    #[serde(default)]
    pub metadata: ObjectMeta,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub spec: Option<Spec>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<apps::StatefulSetStatus>,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Spec {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replicas: Option<i32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub selector: Option<LabelSelector>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub service_name: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod_management_policy: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub update_strategy: Option<apps::StatefulSetUpdateStrategy>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub revision_history_limit: Option<i32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub min_ready_seconds: Option<i32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub persistent_volume_claim_retention_policy:
        Option<apps::StatefulSetPersistentVolumeClaimRetentionPolicy>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ordinals: Option<apps::StatefulSetOrdinals>,
    /// As served (ST-8).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub volume_claim_templates: Option<Vec<Value>>,
    /// As served (ST-8, ST-12).
    #[serde(default)]
    pub template: Value,
}

impl k8s_openapi::Resource for StatefulSet {
    const API_VERSION: &'static str = <apps::StatefulSet as k8s_openapi::Resource>::API_VERSION;
    const GROUP: &'static str = <apps::StatefulSet as k8s_openapi::Resource>::GROUP;
    const KIND: &'static str = <apps::StatefulSet as k8s_openapi::Resource>::KIND;
    const VERSION: &'static str = <apps::StatefulSet as k8s_openapi::Resource>::VERSION;
    const URL_PATH_SEGMENT: &'static str =
        <apps::StatefulSet as k8s_openapi::Resource>::URL_PATH_SEGMENT;
    type Scope = k8s_openapi::NamespaceResourceScope;
}

impl k8s_openapi::Metadata for StatefulSet {
    type Ty = ObjectMeta;
    fn metadata(&self) -> &ObjectMeta {
        &self.metadata
    }
    fn metadata_mut(&mut self) -> &mut ObjectMeta {
        &mut self.metadata
    }
}

impl StatefulSet {
    pub fn name(&self) -> &str {
        self.metadata.name.as_deref().unwrap_or_default()
    }

    pub fn namespace(&self) -> &str {
        self.metadata.namespace.as_deref().unwrap_or_default()
    }

    pub fn uid(&self) -> &str {
        self.metadata.uid.as_deref().unwrap_or_default()
    }

    pub fn spec(&self) -> Cow<'_, Spec> {
        match &self.spec {
            Some(s) => Cow::Borrowed(s),
            None => Cow::Owned(Spec::default()),
        }
    }

    /// `spec.replicas`; the API server defaults it to 1.
    pub fn replicas(&self) -> i32 {
        self.spec.as_ref().and_then(|s| s.replicas).unwrap_or(1)
    }

    pub fn start_ordinal(&self) -> i32 {
        self.spec
            .as_ref()
            .and_then(|s| s.ordinals.as_ref())
            .and_then(|o| o.start)
            .unwrap_or(0)
    }

    pub fn service_name(&self) -> &str {
        self.spec
            .as_ref()
            .and_then(|s| s.service_name.as_deref())
            .unwrap_or_default()
    }

    /// The claim templates' names, in spec order.
    pub fn claim_template_names(&self) -> Vec<&str> {
        self.spec
            .as_ref()
            .and_then(|s| s.volume_claim_templates.as_ref())
            .map(|ts| ts.iter().filter_map(template_name).collect())
            .unwrap_or_default()
    }

    pub fn retention(&self) -> (Policy, Policy) {
        let p = self
            .spec
            .as_ref()
            .and_then(|s| s.persistent_volume_claim_retention_policy.as_ref());
        let of = |v: Option<&String>| match v.map(String::as_str) {
            Some("Delete") => Policy::Delete,
            _ => Policy::Retain,
        };
        (
            of(p.and_then(|p| p.when_deleted.as_ref())),
            of(p.and_then(|p| p.when_scaled.as_ref())),
        )
    }

    pub fn status(&self) -> apps::StatefulSetStatus {
        self.status.clone().unwrap_or_default()
    }
}

/// A PVC retention policy (anything but `Delete` is treated as `Retain`, as upstream does).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Policy {
    Retain,
    Delete,
}

pub fn template_name(t: &Value) -> Option<&str> {
    t.get("metadata")?.get("name")?.as_str()
}
