//! ES-14: from a Service's desired endpoints and its existing slices to the slices to create,
//! update and delete, with upstream's reuse-and-fill algorithm so that the same change costs the
//! same writes [reconciler.go: reconcileByAddressType, reconcileByPortMapping, finalize]. Pure.

use crate::endpoints::{
    Desired, EndpointKey, LABEL_HEADLESS, LABEL_MANAGED_BY, LABEL_SERVICE_NAME, PortKey,
    equal_beyond_key, is_service_ip_set,
};
use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::discovery::v1::{Endpoint, EndpointPort, EndpointSlice};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

/// The `managed-by` value this controller writes (ES-7).
pub const MANAGED_BY: &str = "endpointslice-controller.k8s.io";

/// What one address type of a Service needs written, before hints (upstream's `SliceInfo`
/// inputs plus the deletes).
#[derive(Clone, Debug, Default)]
pub struct TypePlan {
    pub address_type: &'static str,
    pub to_create: Vec<EndpointSlice>,
    pub to_update: Vec<EndpointSlice>,
    pub to_delete: Vec<Arc<EndpointSlice>>,
    /// Existing slices neither updated nor deleted (hints may still move them to updates).
    pub unchanged: Vec<EndpointSlice>,
    /// Endpoints added and removed (`endpoints_added_per_sync`, `_removed_per_sync`).
    pub added: usize,
    pub removed: usize,
    /// Per port set: (endpoints, slices) once written (the efficiency gauges).
    pub efficiency: BTreeMap<PortKey, (usize, usize)>,
}

/// ES-14 steps 2-8 for one address type.
pub fn plan_address_type(
    svc: &Service,
    existing: &[Arc<EndpointSlice>],
    desired: Desired,
    max_per_slice: usize,
    address_type: &'static str,
) -> TypePlan {
    let max = max_per_slice.max(1);
    let mut plan = TypePlan {
        address_type,
        ..TypePlan::default()
    };
    // Step 2: slices of another Service with the same name are deleted, never reused.
    let mut by_key: BTreeMap<PortKey, Vec<Arc<EndpointSlice>>> = BTreeMap::new();
    for slice in existing {
        if owned_by(slice, svc) {
            by_key
                .entry(PortKey::of(slice.ports.as_deref()))
                .or_default()
                .push(Arc::clone(slice));
        } else {
            plan.to_delete.push(Arc::clone(slice));
        }
    }
    for (key, group) in desired.groups {
        let endpoints = group.endpoints.len();
        let mine = by_key.get(&key).map(Vec::as_slice).unwrap_or_default();
        let r = by_port_set(svc, mine, group.endpoints, &group.ports, max, address_type);
        plan.added += r.added;
        plan.removed += r.removed;
        let slices = (mine.len() + r.create.len()).saturating_sub(r.delete.len());
        plan.efficiency.insert(key, (endpoints, slices));
        plan.to_create.extend(r.create);
        plan.to_update.extend(r.update);
        plan.to_delete.extend(r.delete);
    }
    // Step 7: port sets no longer desired.
    let desired_keys: BTreeSet<&PortKey> = plan.efficiency.keys().collect();
    let gone: Vec<Arc<EndpointSlice>> = by_key
        .iter()
        .filter(|(k, _)| !desired_keys.contains(k))
        .flat_map(|(_, v)| v.iter().cloned())
        .collect();
    plan.to_delete.extend(gone);
    // Step 8: a Service always has a slice per address type.
    if existing.len() == plan.to_delete.len() && plan.to_create.is_empty() {
        let placeholder = new_slice(svc, Vec::new(), address_type);
        if plan.to_delete.len() == 1 && is_same_placeholder(&plan.to_delete[0], &placeholder) {
            plan.to_delete.clear();
        } else {
            plan.to_create.push(placeholder);
        }
        plan.efficiency.insert(PortKey::default(), (0, 1));
    }
    let changed: BTreeSet<&str> = plan
        .to_update
        .iter()
        .map(name_of)
        .chain(plan.to_delete.iter().map(|s| name_of(s)))
        .collect();
    plan.unchanged = existing
        .iter()
        .filter(|s| !changed.contains(name_of(s)))
        .map(|s| (**s).clone())
        .collect();
    plan
}

struct PortSetResult {
    create: Vec<EndpointSlice>,
    update: Vec<EndpointSlice>,
    delete: Vec<Arc<EndpointSlice>>,
    added: usize,
    removed: usize,
}

/// ES-14 steps 4-6 for one port set [reconcileByPortMapping].
fn by_port_set(
    svc: &Service,
    existing: &[Arc<EndpointSlice>],
    mut desired: crate::endpoints::EndpointSet,
    ports: &[EndpointPort],
    max: usize,
    address_type: &'static str,
) -> PortSetResult {
    // Slices by name: the cached one until it is changed, then the copy being written.
    let mut to_update: BTreeMap<String, EndpointSlice> = BTreeMap::new();
    let mut unchanged: BTreeMap<String, Arc<EndpointSlice>> = BTreeMap::new();
    let mut delete = Vec::new();
    let mut removed = 0usize;
    // Step 4.
    for slice in existing {
        let mut kept = Vec::new();
        let mut endpoint_changed = false;
        for ep in endpoints_of(slice) {
            if let Some(want) = desired.remove(&EndpointKey::of(ep)) {
                endpoint_changed |= !equal_beyond_key(&want, ep);
                kept.push(want);
            }
        }
        let (labels, labels_changed) = slice_labels(slice.metadata.labels.as_ref(), svc);
        let had = endpoints_of(slice).len();
        if endpoint_changed || kept.len() != had {
            removed += had.saturating_sub(kept.len());
            if kept.is_empty() {
                delete.push(Arc::clone(slice));
            } else {
                let mut copy = (**slice).clone();
                copy.endpoints = Some(kept);
                copy.metadata.labels = Some(labels);
                to_update.insert(name_of(slice).to_string(), copy);
            }
        } else if labels_changed {
            let mut copy = (**slice).clone();
            copy.metadata.labels = Some(labels);
            to_update.insert(name_of(slice).to_string(), copy);
        } else {
            unchanged.insert(name_of(slice).to_string(), Arc::clone(slice));
        }
    }
    let added = desired.len();
    // Step 5: fill the slices being updated anyway, fullest first.
    if !desired.is_empty() && !to_update.is_empty() {
        let mut order: Vec<(usize, String)> = to_update
            .iter()
            .map(|(n, s)| (endpoints_of(s).len(), n.clone()))
            .collect();
        order.sort_by(|a, b| b.0.cmp(&a.0).then_with(|| a.1.cmp(&b.1)));
        for (_, name) in order {
            if let Some(slice) = to_update.get_mut(&name) {
                fill(slice, &mut desired, max);
            }
        }
    }
    // Step 6.
    let mut create = Vec::new();
    while !desired.is_empty() {
        let reuse = if desired.len() < max && !unchanged.is_empty() {
            slice_to_fill(unchanged.values(), desired.len(), max)
        } else {
            None
        };
        match reuse {
            Some(name) => {
                let Some(cached) = unchanged.remove(&name) else {
                    break;
                };
                let mut copy = (*cached).clone();
                fill(&mut copy, &mut desired, max);
                to_update.insert(name, copy);
            }
            None => {
                let mut slice = new_slice(svc, ports.to_vec(), address_type);
                fill(&mut slice, &mut desired, max);
                create.push(slice);
            }
        }
    }
    PortSetResult {
        create,
        update: to_update.into_values().collect(),
        delete,
        added,
        removed,
    }
}

fn fill(slice: &mut EndpointSlice, desired: &mut crate::endpoints::EndpointSet, max: usize) {
    let endpoints = slice.endpoints.get_or_insert_with(Vec::new);
    while endpoints.len() < max {
        let Some((_, ep)) = desired.pop_first() else {
            break;
        };
        endpoints.push(ep);
    }
}

/// A slice's endpoints (absent reads as none).
pub fn endpoints_of(slice: &EndpointSlice) -> &[Endpoint] {
    slice.endpoints.as_deref().unwrap_or_default()
}

/// [getSliceToFill]: the unchanged slice that ends closest to full without exceeding `max`; the
/// first such in name order on ties (upstream's order is a Go map's).
fn slice_to_fill<'a>(
    slices: impl Iterator<Item = &'a Arc<EndpointSlice>>,
    wanted: usize,
    max: usize,
) -> Option<String> {
    let mut best: Option<(usize, &str)> = None;
    for s in slices {
        let Some(room) = max.checked_sub(wanted.saturating_add(endpoints_of(s).len())) else {
            continue;
        };
        if room < best.map_or(max, |b| b.0) {
            best = Some((room, name_of(s)));
            if room == 0 {
                break;
            }
        }
    }
    best.map(|(_, n)| n.to_string())
}

/// ES-6 [newEndpointSlice].
pub fn new_slice(svc: &Service, ports: Vec<EndpointPort>, address_type: &str) -> EndpointSlice {
    let name = svc.metadata.name.as_deref().unwrap_or_default();
    let (labels, _) = slice_labels(None, svc);
    EndpointSlice {
        metadata: ObjectMeta {
            generate_name: Some(slice_prefix(name)),
            namespace: svc.metadata.namespace.clone(),
            labels: Some(labels),
            owner_references: Some(vec![shared::meta::refs::controller_ref(svc)]),
            ..ObjectMeta::default()
        },
        address_type: address_type.to_string(),
        endpoints: Some(Vec::new()),
        ports: Some(ports),
    }
}

/// ES-6 [getEndpointSlicePrefix]: `<service>-`, or the bare name if that is not a valid DNS
/// subdomain (too long).
pub fn slice_prefix(service: &str) -> String {
    let prefix = format!("{service}-");
    if is_dns_subdomain(&prefix) {
        prefix
    } else {
        service.to_string()
    }
}

/// apimachinery's `NameIsDNSSubdomain` with prefix=true: the trailing `-` is allowed because
/// generated characters follow it.
fn is_dns_subdomain(prefix: &str) -> bool {
    let checked = format!("{prefix}a");
    checked.len() <= 253
        && checked.split('.').all(|label| {
            !label.is_empty()
                && label
                    .bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
                && label
                    .as_bytes()
                    .first()
                    .is_some_and(u8::is_ascii_alphanumeric)
                && label
                    .as_bytes()
                    .last()
                    .is_some_and(u8::is_ascii_alphanumeric)
        })
}

fn is_reserved_label(key: &str) -> bool {
    key == LABEL_SERVICE_NAME || key == LABEL_MANAGED_BY || key == LABEL_HEADLESS
}

/// ES-7 [setEndpointSliceLabels]: the Service's labels minus reserved keys, then service-name,
/// managed-by and headless; `true` when the slice's non-reserved labels differ from the
/// Service's.
pub fn slice_labels(
    current: Option<&BTreeMap<String, String>>,
    svc: &Service,
) -> (BTreeMap<String, String>, bool) {
    let mine: BTreeMap<&String, &String> = current
        .into_iter()
        .flatten()
        .filter(|(k, _)| !is_reserved_label(k))
        .collect();
    let mut labels: BTreeMap<String, String> = svc
        .metadata
        .labels
        .iter()
        .flatten()
        .filter(|(k, _)| !is_reserved_label(k))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    let changed =
        mine.len() != labels.len() || mine.iter().any(|(k, v)| labels.get(k.as_str()) != Some(*v));
    if !is_service_ip_set(svc) {
        labels.insert(LABEL_HEADLESS.into(), String::new());
    }
    labels.insert(
        LABEL_SERVICE_NAME.into(),
        svc.metadata.name.clone().unwrap_or_default(),
    );
    labels.insert(LABEL_MANAGED_BY.into(), MANAGED_BY.into());
    (labels, changed)
}

/// [ownedBy]: an owner reference with the Service's UID, kind Service and apiVersion v1.
pub fn owned_by(slice: &EndpointSlice, svc: &Service) -> bool {
    let uid = svc.metadata.uid.as_deref().unwrap_or_default();
    slice
        .metadata
        .owner_references
        .iter()
        .flatten()
        .any(|o| o.uid == uid && shared::meta::refs::refers_to_version::<Service>(o))
}

/// ES-14 step 8 [placeholderSliceCompare]: upstream's comparison looks at the namespace and
/// labels of the metadata (its ObjectMeta equality replaces the owner references' one), the
/// address type, and empty (or absent) ports and endpoints.
fn is_same_placeholder(slice: &EndpointSlice, placeholder: &EndpointSlice) -> bool {
    let labels = |s: &EndpointSlice| s.metadata.labels.clone().unwrap_or_default();
    slice.metadata.namespace == placeholder.metadata.namespace
        && labels(slice) == labels(placeholder)
        && slice.address_type == placeholder.address_type
        && endpoints_of(slice).is_empty()
        && slice.ports.as_ref().is_none_or(Vec::is_empty)
}

pub fn name_of(s: &EndpointSlice) -> &str {
    s.metadata.name.as_deref().unwrap_or_default()
}

/// The writes of one address type, in order (ES-14 step 10).
#[derive(Clone, Debug, Default)]
pub struct Writes {
    pub create: Vec<EndpointSlice>,
    pub update: Vec<EndpointSlice>,
    pub delete: Vec<Arc<EndpointSlice>>,
}

/// ES-14 step 10 [finalize]: each doomed slice of the Service absorbs a create of its address
/// type, written as an update under the doomed name. SB-13: that update carries the doomed
/// slice's cached resourceVersion, so it cannot overwrite a change this replica has not seen.
pub fn finalize(
    svc: &Service,
    mut create: Vec<EndpointSlice>,
    mut update: Vec<EndpointSlice>,
    mut delete: Vec<Arc<EndpointSlice>>,
) -> Writes {
    let mut i = 0;
    while i < delete.len() {
        let doomed = &delete[i];
        let absorbs = create
            .last()
            .is_some_and(|last| doomed.address_type == last.address_type && owned_by(doomed, svc));
        if create.is_empty() {
            break;
        }
        if absorbs && let Some(mut slice) = create.pop() {
            slice.metadata.name = doomed.metadata.name.clone();
            slice.metadata.resource_version = doomed.metadata.resource_version.clone();
            update.push(slice);
            delete.remove(i);
        } else {
            i += 1;
        }
    }
    Writes {
        create,
        update,
        delete,
    }
}

#[cfg(test)]
#[path = "plan_props.rs"]
mod props;
