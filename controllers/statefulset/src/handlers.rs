//! ST-2: which sets a change concerns. Pure functions of the change and the set cache.

use crate::model::StatefulSet;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use shared::cache::informers::{Change, INDEX_NAMESPACE, Informer};
use shared::cache::pod::Pod;
use shared::meta::keys::object_key;
use shared::meta::refs::controller_of;
use std::time::Duration;

/// A set to sync, now or after a delay.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Enqueue {
    pub key: String,
    pub after: Option<Duration>,
}

fn now(key: String) -> Enqueue {
    Enqueue { key, after: None }
}

/// Upstream `resolveControllerRef`: the cached set a controller reference names, if its UID
/// matches.
fn resolve(
    sets: &Informer<StatefulSet>,
    ns: &str,
    r: &OwnerReference,
) -> Option<std::sync::Arc<StatefulSet>> {
    if !shared::meta::refs::names_kind::<StatefulSet>(r) {
        return None;
    }
    sets.get(&format!("{ns}/{}", r.name))
        .filter(|s| s.metadata.uid.as_deref() == Some(r.uid.as_str()))
}

/// Upstream `GetPodStatefulSets`: the sets of the pod's namespace whose selector matches it.
fn selecting(sets: &Informer<StatefulSet>, pod: &Pod) -> Vec<Enqueue> {
    let ns = pod.metadata.namespace.as_deref().unwrap_or_default();
    sets.by_index(INDEX_NAMESPACE, ns)
        .iter()
        .filter(|s| {
            let selector = s.spec.as_ref().and_then(|sp| sp.selector.as_ref());
            // An empty selector selects nothing here, as upstream's lister.
            selector.is_some_and(|sel| {
                (sel.match_labels.as_ref().is_some_and(|m| !m.is_empty())
                    || sel
                        .match_expressions
                        .as_ref()
                        .is_some_and(|m| !m.is_empty()))
                    && shared::meta::selector::matches(Some(sel), pod.metadata.labels.as_ref())
                        .unwrap_or(false)
            })
        })
        .map(|s| now(object_key(s.as_ref())))
        .collect()
}

fn owner_of(sets: &Informer<StatefulSet>, pod: &Pod) -> Option<std::sync::Arc<StatefulSet>> {
    let ns = pod.metadata.namespace.as_deref().unwrap_or_default();
    controller_of(&pod.metadata).and_then(|r| resolve(sets, ns, r))
}

/// ST-2 for pods.
pub fn pod_keys(sets: &Informer<StatefulSet>, change: &Change<Pod>) -> Vec<Enqueue> {
    match change {
        Change::Added(pod) if pod.metadata.deletion_timestamp.is_none() => {
            match controller_of(&pod.metadata) {
                Some(_) => owner_of(sets, pod)
                    .map(|s| now(object_key(s.as_ref())))
                    .into_iter()
                    .collect(),
                None => selecting(sets, pod),
            }
        }
        Change::Added(pod) | Change::Deleted(pod) => owner_of(sets, pod)
            .map(|s| now(object_key(s.as_ref())))
            .into_iter()
            .collect(),
        Change::Updated { old, new } => {
            if old.metadata.resource_version == new.metadata.resource_version {
                return vec![];
            }
            let (old_ref, new_ref) = (controller_of(&old.metadata), controller_of(&new.metadata));
            let ref_changed = old_ref != new_ref;
            let mut out = Vec::new();
            if ref_changed && old_ref.is_some() {
                out.extend(owner_of(sets, old).map(|s| now(object_key(s.as_ref()))));
            }
            if new_ref.is_some() {
                if let Some(set) = owner_of(sets, new) {
                    let key = object_key(set.as_ref());
                    out.push(now(key.clone()));
                    let min_ready = set
                        .spec
                        .as_ref()
                        .and_then(|s| s.min_ready_seconds)
                        .unwrap_or(0);
                    // A pod turning Ready is Available minReadySeconds later (ST-2, ST-30).
                    if min_ready > 0 && !old.is_ready() && new.is_ready() {
                        out.push(Enqueue {
                            key,
                            after: Some(Duration::from_secs(min_ready.unsigned_abs().into())),
                        });
                    }
                }
                return out;
            }
            if old.metadata.labels != new.metadata.labels || ref_changed {
                out.extend(selecting(sets, new));
            }
            out
        }
    }
}

/// ST-2 for sets: every change of a set syncs it.
pub fn set_keys(change: &Change<StatefulSet>) -> Vec<String> {
    vec![object_key(change.object().as_ref())]
}
