//! Cache keys (`namespace/name`, or `name` when cluster-scoped) and what every cached object's
//! metadata gets.

use kube::Resource;

/// `namespace/name`, or `name` for cluster-scoped objects (client-go's MetaNamespaceKey).
pub type ObjectKey = String;

pub fn object_key<K: Resource>(obj: &K) -> ObjectKey {
    let meta = obj.meta();
    let name = meta.name.as_deref().unwrap_or_default();
    match meta.namespace.as_deref() {
        Some(ns) if !ns.is_empty() => format!("{ns}/{name}"),
        _ => name.to_string(),
    }
}

/// Splits a key into (namespace, name); namespace is empty for cluster-scoped keys.
pub fn split_key(key: &str) -> (&str, &str) {
    key.split_once('/').unwrap_or(("", key))
}

/// Gives back the spare capacity of the metadata's lists (deserialized `Vec`s keep room for
/// four elements), as every cached object has them.
pub fn shrink_meta(meta: &mut k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta) {
    if let Some(v) = meta.finalizers.as_mut() {
        v.shrink_to_fit();
    }
    if let Some(v) = meta.owner_references.as_mut() {
        v.shrink_to_fit();
    }
}
