//! MR-5, MR-6: from an Endpoints' desired groups and its mirrored slices to the slices to
//! create, update and delete [reconciler.go: reconcile, reconcileByPortMapping;
//! reconciler_helpers.go: recycleSlices]. Pure.

use crate::desired::{Desired, SliceKey};
use endpointslice::endpoints::{
    ANNOTATION_TRIGGER_TIME, EndpointKey, LABEL_MANAGED_BY, LABEL_SERVICE_NAME, equal_beyond_key,
};
use endpointslice::plan::{endpoints_of, name_of, slice_prefix};
use k8s_openapi::api::core::v1::Endpoints;
use k8s_openapi::api::discovery::v1::{Endpoint, EndpointPort, EndpointSlice};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

/// The `managed-by` value this controller writes (MR-5).
pub const MANAGED_BY: &str = "endpointslicemirroring-controller.k8s.io";
/// Never mirrored (MR-5).
pub const ANNOTATION_LAST_APPLIED: &str = "kubectl.kubernetes.io/last-applied-configuration";

/// Endpoints added, updated and removed (`endpoints_*_per_sync`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Totals {
    pub added: usize,
    pub updated: usize,
    pub removed: usize,
}

impl Totals {
    fn add(&mut self, o: Totals) {
        self.added = self.added.saturating_add(o.added);
        self.updated = self.updated.saturating_add(o.updated);
        self.removed = self.removed.saturating_add(o.removed);
    }
}

/// One Endpoints' writes, in the order they are sent (MR-6: creates, updates, deletes).
#[derive(Clone, Debug, Default)]
pub struct Plan {
    pub create: Vec<EndpointSlice>,
    pub update: Vec<EndpointSlice>,
    pub delete: Vec<Arc<EndpointSlice>>,
    /// Unchanged slices the tracker must know (upstream tracks them as it skips them).
    pub track: Vec<Arc<EndpointSlice>>,
    pub totals: Totals,
    /// Per key: (endpoints desired, slices once written), for the efficiency gauges.
    pub efficiency: BTreeMap<SliceKey, (usize, usize)>,
}

fn without(map: Option<&BTreeMap<String, String>>, keys: &[&str]) -> BTreeMap<String, String> {
    map.into_iter()
        .flatten()
        .filter(|(k, _)| !keys.contains(&k.as_str()))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect()
}

/// MR-5: the Endpoints' annotations a slice carries.
fn mirrored_annotations(endpoints: &Endpoints) -> BTreeMap<String, String> {
    without(
        endpoints.metadata.annotations.as_ref(),
        &[ANNOTATION_TRIGGER_TIME, ANNOTATION_LAST_APPLIED],
    )
}

/// MR-5 [utils.go: newEndpointSlice]: labels = the Endpoints' labels, then service-name and
/// managed-by; annotations = the Endpoints' but trigger-time and last-applied; one controller
/// reference to the Endpoints; `generateName` `<endpoints>-` (no dash if that is not a valid
/// DNS subdomain) unless it replaces the slice `name`.
pub fn new_slice(
    endpoints: &Endpoints,
    ports: Vec<EndpointPort>,
    address_type: &str,
    name: Option<&str>,
) -> EndpointSlice {
    let owner = endpoints.metadata.name.clone().unwrap_or_default();
    let mut labels = without(endpoints.metadata.labels.as_ref(), &[]);
    labels.insert(LABEL_SERVICE_NAME.into(), owner.clone());
    labels.insert(LABEL_MANAGED_BY.into(), MANAGED_BY.into());
    let annotations = mirrored_annotations(endpoints);
    EndpointSlice {
        metadata: ObjectMeta {
            name: name.map(str::to_string),
            generate_name: name.is_none().then(|| slice_prefix(&owner)),
            namespace: endpoints.metadata.namespace.clone(),
            labels: Some(labels),
            // Go's empty map is omitted on the wire.
            annotations: (!annotations.is_empty()).then_some(annotations),
            owner_references: Some(vec![shared::meta::refs::controller_ref(endpoints)]),
            ..ObjectMeta::default()
        },
        address_type: address_type.to_string(),
        endpoints: Some(Vec::new()),
        ports: Some(ports),
    }
}

/// [reconciler.go: totalChanges]: what turning `slice` into `desired` changes.
fn total_changes(slice: &EndpointSlice, desired: &BTreeMap<EndpointKey, Endpoint>) -> Totals {
    let mut t = Totals::default();
    let mut matches = 0usize;
    for ep in endpoints_of(slice) {
        match desired.get(&EndpointKey::of(ep)) {
            None => t.removed += 1,
            Some(want) => {
                matches += 1;
                if !equal_beyond_key(want, ep) {
                    t.updated += 1;
                }
            }
        }
    }
    t.added = desired.len().saturating_sub(matches);
    t
}

/// [reconciler.go: needRebuildExistingSlices]: the slice names an Endpoints of this name with
/// another UID (a recreated Endpoints).
fn owned_by_predecessor(endpoints: &Endpoints, slice: &EndpointSlice) -> bool {
    let name = endpoints.metadata.name.as_deref().unwrap_or_default();
    let uid = endpoints.metadata.uid.as_deref().unwrap_or_default();
    slice
        .metadata
        .owner_references
        .iter()
        .flatten()
        .any(|o| shared::meta::refs::names_kind::<Endpoints>(o) && o.name == name && o.uid != uid)
}

/// MR-6's "no write" test for the slice kept for a key: endpoints (ES-13), labels (minus
/// service-name and managed-by; absent = empty) and annotations as mirrored, and a current
/// owner.
fn up_to_date(endpoints: &Endpoints, slice: &EndpointSlice, totals: Totals) -> bool {
    let labels = without(
        slice.metadata.labels.as_ref(),
        &[LABEL_MANAGED_BY, LABEL_SERVICE_NAME],
    );
    totals == Totals::default()
        && without(endpoints.metadata.labels.as_ref(), &[]) == labels
        && mirrored_annotations(endpoints) == without(slice.metadata.annotations.as_ref(), &[])
        && !owned_by_predecessor(endpoints, slice)
}

/// Upstream takes the lister's first slice, in Go map order; we take the oldest (then by
/// name), so that the same cache gives the same writes.
fn oldest_first(slices: &mut [Arc<EndpointSlice>]) {
    slices.sort_by(|a, b| {
        let created = |s: &EndpointSlice| s.metadata.creation_timestamp.as_ref().map(|t| t.0);
        created(a)
            .cmp(&created(b))
            .then_with(|| name_of(a).cmp(name_of(b)))
    });
}

/// MR-6 [reconciler.go: reconcile, second half]: one slice per key. Without desired endpoints
/// its slices go; without slices one is created; otherwise the first is kept (and rewritten
/// unless up to date) and the rest deleted. Keys no longer desired lose their slices; a create
/// and a delete of one address type become an update (recycle).
pub fn plan(
    endpoints: &Endpoints,
    existing: &[Arc<EndpointSlice>],
    desired: Desired,
    max_per_subset: usize,
) -> Plan {
    let mut by_key: BTreeMap<SliceKey, Vec<Arc<EndpointSlice>>> = BTreeMap::new();
    for slice in existing {
        by_key
            .entry(SliceKey::of(&slice.address_type, slice.ports.as_deref()))
            .or_default()
            .push(Arc::clone(slice));
    }
    let mut out = Plan::default();
    for (key, group) in desired.groups {
        let mut mine = by_key.get(&key).cloned().unwrap_or_default();
        oldest_first(&mut mine);
        let (creates, deletes_before) = (out.create.len(), out.delete.len());
        let wanted = group.endpoints.len();
        by_port_set(endpoints, &mine, group, &key, max_per_subset, &mut out);
        let created = out.create.len() - creates;
        let deleted = out.delete.len() - deletes_before;
        out.efficiency.insert(
            key,
            (
                wanted,
                mine.len().saturating_add(created).saturating_sub(deleted),
            ),
        );
    }
    // Keys no longer desired (including other address types, such as FQDN).
    for (key, slices) in &by_key {
        if !out.efficiency.contains_key(key) {
            out.delete.extend(slices.iter().cloned());
        }
    }
    recycle(&mut out);
    out
}

/// [reconciler.go: reconcileByPortMapping] for one key.
fn by_port_set(
    endpoints: &Endpoints,
    existing: &[Arc<EndpointSlice>],
    group: crate::desired::Group,
    key: &SliceKey,
    max: usize,
    out: &mut Plan,
) {
    if group.endpoints.is_empty() {
        for slice in existing {
            out.totals.removed = out.totals.removed.saturating_add(endpoints_of(slice).len());
            out.delete.push(Arc::clone(slice));
        }
        return;
    }
    let kept = match existing.split_first() {
        None => {
            out.totals.added = out.totals.added.saturating_add(group.endpoints.len());
            None
        }
        Some((first, rest)) => {
            out.delete.extend(rest.iter().cloned());
            let totals = total_changes(first, &group.endpoints);
            out.totals.add(totals);
            if up_to_date(endpoints, first, totals) {
                out.track.push(Arc::clone(first));
                return;
            }
            Some(first)
        }
    };
    let mut slice = new_slice(
        endpoints,
        group.ports,
        &key.address_type,
        kept.map(|s| name_of(s)),
    );
    slice.endpoints = Some(group.endpoints.into_values().take(max.max(1)).collect());
    match kept {
        Some(first) => {
            // SB-13: a PUT carrying the cached resourceVersion cannot overwrite a change this
            // replica has not seen (upstream sends none).
            slice.metadata.resource_version = first.metadata.resource_version.clone();
            out.update.push(slice);
        }
        None => out.create.push(slice),
    }
}

/// MR-6 [reconciler_helpers.go: recycleSlices]: per address type, each create takes the name
/// (and, SB-13, the resourceVersion) of a slice being deleted and becomes an update. Upstream
/// removes creates by name, and every create's name is empty, so with creates of both types it
/// can drop the wrong one; we pair them by identity.
fn recycle(plan: &mut Plan) {
    let types: BTreeSet<String> = plan.create.iter().map(|s| s.address_type.clone()).collect();
    for address_type in types {
        let of_type = |s: &EndpointSlice| s.address_type == address_type;
        while let (Some(c), Some(d)) = (
            plan.create.iter().position(of_type),
            plan.delete.iter().position(|s| of_type(s)),
        ) {
            let mut slice = plan.create.remove(c);
            let doomed = plan.delete.remove(d);
            slice.metadata.name = doomed.metadata.name.clone();
            slice.metadata.generate_name = None;
            slice.metadata.resource_version = doomed.metadata.resource_version.clone();
            plan.update.push(slice);
        }
    }
}

#[cfg(test)]
// Table rows are tuples on purpose.
#[allow(clippy::type_complexity)]
mod tests {
    use super::*;
    use crate::desired::desired;
    use k8s_openapi::api::core::v1::{EndpointAddress, EndpointPort as CorePort, EndpointSubset};
    use k8s_openapi::api::discovery::v1::EndpointConditions;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;

    const UID: &str = "d8f2c1f6-5285-4b3c-b3c1-9b89f9e7ed7a";

    fn endpoints(subsets: Vec<EndpointSubset>) -> Endpoints {
        Endpoints {
            metadata: ObjectMeta {
                name: Some("test-ep".into()),
                namespace: Some("test".into()),
                uid: Some(UID.into()),
                ..ObjectMeta::default()
            },
            subsets: Some(subsets),
        }
    }

    fn http_subset(ips: &[&str]) -> EndpointSubset {
        EndpointSubset {
            addresses: Some(
                ips.iter()
                    .map(|ip| EndpointAddress {
                        ip: ip.to_string(),
                        hostname: Some("pod-1".into()),
                        ..EndpointAddress::default()
                    })
                    .collect(),
            ),
            not_ready_addresses: None,
            ports: Some(vec![CorePort {
                name: Some("http".into()),
                port: 80,
                protocol: Some("TCP".into()),
                app_protocol: None,
            }]),
        }
    }

    fn http_ports() -> Vec<EndpointPort> {
        vec![EndpointPort {
            name: Some("http".into()),
            port: Some(80),
            protocol: Some("TCP".into()),
            app_protocol: None,
        }]
    }

    fn existing(name: &str, owner_uid: Option<&str>, ips: &[&str]) -> EndpointSlice {
        EndpointSlice {
            metadata: ObjectMeta {
                name: Some(name.into()),
                namespace: Some("test".into()),
                resource_version: Some(format!("rv-{name}")),
                owner_references: owner_uid.map(|uid| {
                    vec![OwnerReference {
                        api_version: "v1".into(),
                        kind: "Endpoints".into(),
                        name: "test-ep".into(),
                        uid: uid.into(),
                        ..OwnerReference::default()
                    }]
                }),
                ..ObjectMeta::default()
            },
            address_type: "IPv4".into(),
            ports: Some(http_ports()),
            endpoints: Some(
                ips.iter()
                    .map(|ip| Endpoint {
                        addresses: vec![ip.to_string()],
                        hostname: Some("pod-1".into()),
                        conditions: Some(EndpointConditions {
                            ready: Some(true),
                            ..EndpointConditions::default()
                        }),
                        ..Endpoint::default()
                    })
                    .collect(),
            ),
        }
    }

    fn run(ep: &Endpoints, slices: Vec<EndpointSlice>) -> Plan {
        let slices: Vec<Arc<EndpointSlice>> = slices.into_iter().map(Arc::new).collect();
        plan(
            ep,
            &slices,
            desired(ep.subsets.as_deref().unwrap_or_default(), 1000),
            1000,
        )
    }

    fn counts(p: &Plan) -> (usize, usize, usize) {
        (p.create.len(), p.update.len(), p.delete.len())
    }

    #[test]
    fn mr5_new_slice_metadata() {
        let mut ep = endpoints(vec![]);
        ep.metadata.labels = Some(BTreeMap::from([
            ("foo".into(), "bar".into()),
            (LABEL_SERVICE_NAME.into(), "spoof".into()),
            (LABEL_MANAGED_BY.into(), "someone".into()),
        ]));
        ep.metadata.annotations = Some(BTreeMap::from([
            ("keep".into(), "me".into()),
            (
                ANNOTATION_TRIGGER_TIME.into(),
                "2026-01-01T00:00:00Z".into(),
            ),
            (ANNOTATION_LAST_APPLIED.into(), "{}".into()),
        ]));
        let s = new_slice(&ep, http_ports(), "IPv4", None);
        let m = &s.metadata;
        assert_eq!(
            (m.name.as_deref(), m.generate_name.as_deref()),
            (None, Some("test-ep-"))
        );
        assert_eq!(m.namespace.as_deref(), Some("test"));
        assert_eq!(
            m.labels.clone().unwrap(),
            BTreeMap::from([
                ("foo".to_string(), "bar".to_string()),
                (LABEL_SERVICE_NAME.to_string(), "test-ep".to_string()),
                (LABEL_MANAGED_BY.to_string(), MANAGED_BY.to_string()),
            ])
        );
        assert_eq!(
            m.annotations.clone().unwrap(),
            BTreeMap::from([("keep".to_string(), "me".to_string())])
        );
        let owner = &m.owner_references.as_ref().unwrap()[0];
        assert_eq!(
            (
                owner.api_version.as_str(),
                owner.kind.as_str(),
                owner.name.as_str(),
                owner.uid.as_str()
            ),
            ("v1", "Endpoints", "test-ep", UID)
        );
        assert_eq!(
            (owner.controller, owner.block_owner_deletion),
            (Some(true), Some(true))
        );
        let named = new_slice(&ep, vec![], "IPv6", Some("test-ep-abc"));
        assert_eq!(
            (
                named.metadata.name.as_deref(),
                named.metadata.generate_name.as_deref()
            ),
            (Some("test-ep-abc"), None)
        );
        // Only last-applied: nothing left, nothing sent (Go's empty map).
        ep.metadata.annotations = Some(BTreeMap::from([(
            ANNOTATION_LAST_APPLIED.into(),
            String::new(),
        )]));
        assert_eq!(
            new_slice(&ep, vec![], "IPv4", None).metadata.annotations,
            None
        );
        // MR-5: a name whose prefix is no valid DNS subdomain gets no dash.
        ep.metadata.name = Some("a".repeat(253));
        assert_eq!(
            new_slice(&ep, vec![], "IPv4", None)
                .metadata
                .generate_name
                .map(|g| g.len()),
            Some(253)
        );
    }

    /// Cases after upstream's TestReconcile.
    #[test]
    fn mr6_reconcile_table() {
        let with_labels = |mut ep: Endpoints| {
            ep.metadata.labels = Some(BTreeMap::from([("foo".into(), "bar".into())]));
            ep
        };
        let with_annotation = |mut s: EndpointSlice| {
            s.metadata.annotations = Some(BTreeMap::from([("foo".into(), "bar".into())]));
            s
        };
        let one = endpoints(vec![http_subset(&["10.0.0.1"])]);
        let cases: Vec<(&str, Endpoints, Vec<EndpointSlice>, (usize, usize, usize))> = vec![
            ("no subsets", endpoints(vec![]), vec![], (0, 0, 0)),
            ("one address, no slice", one.clone(), vec![], (1, 0, 0)),
            (
                "same fields",
                one.clone(),
                vec![existing("s1", Some(UID), &["10.0.0.1"])],
                (0, 0, 0),
            ),
            (
                "same fields, no owner",
                one.clone(),
                vec![existing("s1", None, &["10.0.0.1"])],
                (0, 0, 0),
            ),
            (
                "same fields, owner of another UID",
                one.clone(),
                vec![existing("s1", Some("other"), &["10.0.0.1"])],
                (0, 1, 0),
            ),
            (
                "slice has an extra annotation",
                one.clone(),
                vec![with_annotation(existing("s1", Some(UID), &["10.0.0.1"]))],
                (0, 1, 0),
            ),
            (
                "Endpoints has a label the slice lacks",
                with_labels(one.clone()),
                vec![existing("s1", Some(UID), &["10.0.0.1"])],
                (0, 1, 0),
            ),
            (
                "one address added",
                endpoints(vec![http_subset(&["10.0.0.1", "10.0.0.2"])]),
                vec![existing("s1", Some(UID), &["10.0.0.1"])],
                (0, 1, 0),
            ),
            (
                "duplicate slices for one key: keep one, delete the rest",
                one.clone(),
                vec![
                    existing("s1", Some(UID), &["10.0.0.1"]),
                    existing("s2", Some(UID), &["10.0.0.1"]),
                ],
                (0, 0, 1),
            ),
            (
                "no addresses any more",
                endpoints(vec![]),
                vec![existing("s1", Some(UID), &["10.0.0.1"])],
                (0, 0, 1),
            ),
        ];
        for (name, ep, slices, want) in cases {
            assert_eq!(counts(&run(&ep, slices)), want, "{name}");
        }
    }

    #[test]
    fn mr6_unchanged_slice_is_tracked_and_totals_counted() {
        let ep = endpoints(vec![http_subset(&["10.0.0.1", "10.0.0.3"])]);
        let p = run(&ep, vec![existing("s1", Some(UID), &["10.0.0.1"])]);
        assert_eq!(
            p.totals,
            Totals {
                added: 1,
                updated: 0,
                removed: 0
            }
        );
        let p = run(
            &ep,
            vec![existing("s1", Some(UID), &["10.0.0.1", "10.0.0.3"])],
        );
        assert_eq!(p.track.len(), 1);
        assert_eq!(counts(&p), (0, 0, 0));
        // The IPv4 key is still desired (the subset's ports), but empty: its endpoints count as
        // removed. A key no longer desired at all is deleted without counting (as upstream).
        let p = run(
            &endpoints(vec![http_subset(&["fd00::1"])]),
            vec![existing("s1", Some(UID), &["10.0.0.1", "10.0.0.2"])],
        );
        assert_eq!(
            p.totals,
            Totals {
                added: 1,
                updated: 0,
                removed: 2
            }
        );
        assert_eq!(counts(&p), (1, 0, 1), "another address type: no recycling");
        let p = run(
            &endpoints(vec![]),
            vec![existing("s1", Some(UID), &["10.0.0.1", "10.0.0.2"])],
        );
        assert_eq!(p.totals, Totals::default());
        assert_eq!(counts(&p), (0, 0, 1));
    }

    #[test]
    fn mr6_update_keeps_name_and_carries_resource_version() {
        let ep = endpoints(vec![http_subset(&["10.0.0.1", "10.0.0.2"])]);
        let p = run(&ep, vec![existing("s1", Some(UID), &["10.0.0.1"])]);
        let u = &p.update[0];
        assert_eq!(u.metadata.name.as_deref(), Some("s1"));
        assert_eq!(u.metadata.generate_name, None);
        assert_eq!(u.metadata.resource_version.as_deref(), Some("rv-s1"));
        assert_eq!(endpoints_of(u).len(), 2);
    }

    #[test]
    fn mr6_same_type_create_and_delete_recycle_into_an_update() {
        // The port changes: the old key's slice is deleted and a new key's created, so it is
        // one update of the old slice instead.
        let mut ep = endpoints(vec![http_subset(&["10.0.0.1"])]);
        if let Some(ports) = ep.subsets.as_mut().and_then(|s| s[0].ports.as_mut()) {
            ports[0].port = 8080;
        }
        let p = run(&ep, vec![existing("s1", Some(UID), &["10.0.0.1"])]);
        assert_eq!(counts(&p), (0, 1, 0));
        let u = &p.update[0];
        assert_eq!(u.metadata.name.as_deref(), Some("s1"));
        assert_eq!(u.metadata.resource_version.as_deref(), Some("rv-s1"));
        assert_eq!(u.ports.as_ref().unwrap()[0].port, Some(8080));
        // Another address type is not recycled.
        let mut v6 = ep.clone();
        if let Some(a) = v6.subsets.as_mut().and_then(|s| s[0].addresses.as_mut()) {
            a[0].ip = "fd00::1".into();
        }
        let p = run(&v6, vec![existing("s1", Some(UID), &["10.0.0.1"])]);
        assert_eq!(counts(&p), (1, 0, 1));
        assert_eq!(p.create[0].address_type, "IPv6");
    }

    #[test]
    fn mr6_recycle_pairs_by_type_whatever_the_create_order() {
        // Upstream's removeSlice matches creates by their (empty) name and may drop the IPv4
        // create when recycling the IPv6 one.
        let mut p = Plan::default();
        let ep = endpoints(vec![]);
        p.create.push(new_slice(&ep, vec![], "IPv4", None));
        p.create.push(new_slice(&ep, vec![], "IPv6", None));
        let mut doomed = existing("old6", Some(UID), &[]);
        doomed.address_type = "IPv6".into();
        p.delete.push(Arc::new(doomed));
        recycle(&mut p);
        assert_eq!(counts(&p), (1, 1, 0));
        assert_eq!(p.create[0].address_type, "IPv4");
        assert_eq!(p.create[0].metadata.name, None);
        assert_eq!(
            (
                p.update[0].address_type.as_str(),
                p.update[0].metadata.name.as_deref()
            ),
            ("IPv6", Some("old6"))
        );
    }

    #[test]
    fn mr6_foreign_address_types_are_deleted() {
        let ep = endpoints(vec![http_subset(&["10.0.0.1"])]);
        let mut fqdn = existing("f", Some(UID), &[]);
        fqdn.address_type = "FQDN".into();
        let p = run(&ep, vec![existing("s1", Some(UID), &["10.0.0.1"]), fqdn]);
        assert_eq!(counts(&p), (0, 0, 1));
        assert_eq!(name_of(&p.delete[0]), "f");
    }

    #[test]
    fn mr6_efficiency_counts_slices_once_written() {
        let ep = endpoints(vec![http_subset(&["10.0.0.1", "10.0.0.2"]), {
            let mut s = http_subset(&["fd00::1"]);
            s.ports = None;
            s
        }]);
        let p = run(&ep, vec![]);
        let got: Vec<(String, usize, usize)> = p
            .efficiency
            .iter()
            .map(|(k, (e, s))| (k.address_type.clone(), *e, *s))
            .collect();
        assert_eq!(got.len(), 4, "{got:?}");
        let total: (usize, usize) = got.iter().fold((0, 0), |a, g| (a.0 + g.1, a.1 + g.2));
        assert_eq!(total, (3, 2));
    }
}

#[cfg(test)]
#[path = "plan_props.rs"]
mod props;
