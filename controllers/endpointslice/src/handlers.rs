//! ES-4: which Services a change concerns, and when to sync them. Pure functions of the change
//! and the caches.

use crate::endpoints::LABEL_MANAGED_BY;
use crate::plan::{MANAGED_BY, slice_labels};
use crate::tracker::SliceTracker;
use k8s_openapi::api::core::v1::{Node, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use shared::cache::informers::{Change, INDEX_NAMESPACE, Informer};
use shared::cache::pod::Pod;
use shared::meta::keys::object_key;
use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

/// Slice events wait at least this long (upstream `endpointSliceChangeMinSyncDelay`).
pub const SLICE_MIN_DELAY: Duration = Duration::from_secs(1);

/// The Service's selector, if it has one that selects (ES-1: absent and empty are alike).
pub fn selector(svc: &Service) -> Option<&BTreeMap<String, String>> {
    svc.spec
        .as_ref()
        .and_then(|s| s.selector.as_ref())
        .filter(|s| !s.is_empty())
}

/// `labels.Set(selector).AsSelectorPreValidated().Matches`: every pair present.
pub fn selects(
    selector: &BTreeMap<String, String>,
    labels: Option<&BTreeMap<String, String>>,
) -> bool {
    selector
        .iter()
        .all(|(k, v)| labels.and_then(|l| l.get(k)) == Some(v))
}

/// Keys of the Services in `namespace` selecting `labels` [getServicesForPod].
fn services_for(
    services: &Informer<Service>,
    namespace: &str,
    labels: Option<&BTreeMap<String, String>>,
) -> BTreeSet<String> {
    services
        .by_index(INDEX_NAMESPACE, namespace)
        .iter()
        .filter(|s| selector(s).is_some_and(|sel| selects(sel, labels)))
        .map(|s| object_key(s.as_ref()))
        .collect()
}

fn terminal(pod: &Pod) -> bool {
    matches!(
        pod.status.as_ref().and_then(|s| s.phase.as_deref()),
        Some("Succeeded" | "Failed")
    )
}

fn pod_ips(pod: &Pod) -> Vec<&str> {
    pod.status
        .as_ref()
        .and_then(|s| s.pod_ips.as_ref())
        .into_iter()
        .flatten()
        .map(|ip| ip.ip.as_str())
        .collect()
}

/// [podEndpointsChanged]: (what the pod's endpoint shows changed, what selects it changed).
/// Upstream compares deletionTimestamp pointers, so any update of a terminating pod counts; we
/// compare values. A pod turning Succeeded or Failed leaves the slices, so that counts too
/// (upstream misses it when Ready was already false).
fn pod_endpoint_changed(old: &Pod, new: &Pod) -> (bool, bool) {
    let spec = |p: &Pod| {
        p.spec
            .as_ref()
            .map(|s| (s.hostname.clone(), s.subdomain.clone()))
    };
    let membership = old.metadata.labels != new.metadata.labels || spec(old) != spec(new);
    let changed = old.metadata.deletion_timestamp != new.metadata.deletion_timestamp
        || old.is_ready() != new.is_ready()
        || pod_ips(old) != pod_ips(new)
        || terminal(old) != terminal(new);
    (changed, membership)
}

/// ES-4 for pods [GetPodUpdateProjectionKey, GetServicesToUpdate].
pub fn pod_services(services: &Informer<Service>, change: &Change<Pod>) -> BTreeSet<String> {
    match change {
        Change::Added(p) | Change::Deleted(p) => services_for(
            services,
            p.metadata.namespace.as_deref().unwrap_or_default(),
            p.metadata.labels.as_ref(),
        ),
        Change::Updated { old, new } => {
            if old.metadata.resource_version == new.metadata.resource_version {
                return BTreeSet::new();
            }
            let (changed, membership) = pod_endpoint_changed(old, new);
            let ns = new.metadata.namespace.as_deref().unwrap_or_default();
            let now = || services_for(services, ns, new.metadata.labels.as_ref());
            match (changed, membership) {
                (false, false) => BTreeSet::new(),
                (true, false) => now(),
                (changed, true) => {
                    let before = services_for(services, ns, old.metadata.labels.as_ref());
                    let after = now();
                    if changed {
                        before.union(&after).cloned().collect()
                    } else {
                        before.symmetric_difference(&after).cloned().collect()
                    }
                }
            }
        }
    }
}

fn managed(slice: &EndpointSlice) -> bool {
    slice
        .metadata
        .labels
        .as_ref()
        .and_then(|l| l.get(LABEL_MANAGED_BY))
        .is_some_and(|m| m == MANAGED_BY)
}

/// The Service a slice belongs to [ServiceControllerKey]; none without a service-name label.
pub fn service_of(slice: &EndpointSlice) -> Option<String> {
    let name = slice
        .metadata
        .labels
        .as_ref()?
        .get(crate::endpoints::LABEL_SERVICE_NAME)
        .filter(|n| !n.is_empty())?;
    Some(format!(
        "{}/{name}",
        slice.metadata.namespace.as_deref().unwrap_or_default()
    ))
}

/// ES-4 and ES-15 for slices [onEndpointSliceAdd/Update/Delete]: the Services to sync. SB-12: a
/// managed slice whose labels drifted from its Service's is news although its generation did
/// not move.
pub fn slice_services(
    tracker: &SliceTracker,
    services: &Informer<Service>,
    change: &Change<EndpointSlice>,
) -> Vec<String> {
    let mut keys = slice_change_services(tracker, services, change);
    // A Service held back by a stale cache is synced again as soon as its slices move.
    if let Some(owner) = service_of(change.object())
        && !keys.contains(&owner)
        && tracker.release(&owner)
    {
        keys.push(owner);
    }
    keys
}

fn slice_change_services(
    tracker: &SliceTracker,
    services: &Informer<Service>,
    change: &Change<EndpointSlice>,
) -> Vec<String> {
    match change {
        Change::Added(s) => {
            if managed(s) && tracker.should_sync(s) {
                return service_of(s).into_iter().collect();
            }
            Vec::new()
        }
        Change::Updated { old, new } => {
            let (was, is) = (service_of(old), service_of(new));
            if was != is {
                return is.into_iter().chain(was).collect();
            }
            let drifted = || {
                managed(new)
                    && old.metadata.labels != new.metadata.labels
                    && is
                        .as_deref()
                        .and_then(|k| services.get(k))
                        .is_some_and(|svc| slice_labels(new.metadata.labels.as_ref(), &svc).1)
            };
            if managed(old) != managed(new)
                || (managed(new) && tracker.should_sync(new))
                || drifted()
            {
                return is.into_iter().collect();
            }
            Vec::new()
        }
        Change::Deleted(s) => {
            if managed(s) && tracker.has(s) && !tracker.handle_deletion(s) {
                return service_of(s).into_iter().collect();
            }
            Vec::new()
        }
    }
}

fn node_ready(node: &Node) -> bool {
    node.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .and_then(|cs| cs.iter().find(|c| c.type_ == "Ready"))
        .is_some_and(|c| c.status == "True")
}

fn zone(node: &Node) -> Option<&String> {
    node.metadata
        .labels
        .as_ref()
        .and_then(|l| l.get(crate::endpoints::LABEL_ZONE))
}

/// ES-4 for nodes [addNode, updateNode, deleteNode]: whether the topology inventory must be
/// rebuilt.
pub fn node_topology_changed(change: &Change<Node>) -> bool {
    match change {
        Change::Added(_) | Change::Deleted(_) => true,
        Change::Updated { old, new } => {
            node_ready(old) != node_ready(new) || zone(old) != zone(new)
        }
    }
}
