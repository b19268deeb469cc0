//! What an Endpoints' mirrored slices should hold (MR-3, MR-4): its subsets in canonical form,
//! each address turned into an endpoint of its family, grouped by (address type, port set).
//! Pure functions of the cached Endpoints.

use endpointslice::endpoints::{EndpointKey, IPV4, IPV6, PortKey, parse_ip_sloppy};
use k8s_openapi::api::core::v1::{EndpointAddress, EndpointSubset};
use k8s_openapi::api::discovery::v1::{Endpoint, EndpointConditions, EndpointPort};
use std::collections::{BTreeMap, HashMap};
use std::net::IpAddr;

/// A core/v1 port by value: (name, port, protocol, appProtocol), absent strings read as Go's "".
type PortId = (String, i32, String, Option<String>);

fn port_id(p: &k8s_openapi::api::core::v1::EndpointPort) -> PortId {
    (
        p.name.clone().unwrap_or_default(),
        p.port,
        p.protocol.clone().unwrap_or_default(),
        p.app_protocol.clone(),
    )
}

fn port_of(id: &PortId) -> k8s_openapi::api::core::v1::EndpointPort {
    k8s_openapi::api::core::v1::EndpointPort {
        name: Some(id.0.clone()),
        port: id.1,
        protocol: Some(id.2.clone()),
        app_protocol: id.3.clone(),
    }
}

/// An address's identity in a repack: its IP as written and its target's UID ("" without one).
fn address_id(a: &EndpointAddress) -> (&str, &str) {
    let uid = a
        .target_ref
        .as_ref()
        .and_then(|t| t.uid.as_deref())
        .unwrap_or_default();
    (a.ip.as_str(), uid)
}

/// [pkg/api/v1/endpoints: LessEndpointAddress]: IP bytes, then no target before a target, then
/// target UID.
fn address_order(a: &EndpointAddress) -> (&[u8], Option<&str>) {
    let uid = a
        .target_ref
        .as_ref()
        .map(|t| t.uid.as_deref().unwrap_or_default());
    (a.ip.as_bytes(), uid)
}

/// MR-3 [pkg/api/v1/endpoints: RepackSubsets]: the subsets expanded to (port, address) pairs
/// and packed again, so that equal port sets are merged and addresses deduplicated:
/// - an address is identified by IP and target UID; the first occurrence's fields are kept;
/// - per port, an address not ready anywhere is not ready;
/// - ports serving the same addresses (with the same readiness) form one subset; subsets
///   without ports share one port-less subset, which disappears into a subset with ports that
///   serves exactly the same addresses;
/// - addresses are sorted by IP bytes, then target UID.
///
/// Upstream orders ports and subsets by a hash of their Go dump; we keep first-seen order (the
/// port set, not its order, decides which slice a subset goes to). Upstream also keys ports by
/// their `appProtocol` pointer, so equal ports with an `appProtocol` are never merged and can
/// come out twice in one subset (a slice the API server refuses); we compare values.
pub fn repack(subsets: &[EndpointSubset]) -> Vec<EndpointSubset> {
    let mut addresses: Vec<&EndpointAddress> = Vec::new();
    let mut address_index: HashMap<(&str, &str), usize> = HashMap::new();
    // Per port (None: the port-less sentinel), first-seen order: address index -> ready.
    let mut port_order: Vec<Option<PortId>> = Vec::new();
    let mut by_port: HashMap<Option<PortId>, BTreeMap<usize, bool>> = HashMap::new();
    for subset in subsets {
        let ports: Vec<Option<PortId>> = match subset.ports.as_deref() {
            None | Some([]) => vec![None],
            Some(ports) => ports.iter().map(|p| Some(port_id(p))).collect(),
        };
        let ready = subset.addresses.iter().flatten().map(|a| (a, true));
        let not_ready = subset
            .not_ready_addresses
            .iter()
            .flatten()
            .map(|a| (a, false));
        let all: Vec<(&EndpointAddress, bool)> = ready.chain(not_ready).collect();
        // A port is recorded through its addresses: one without any vanishes.
        if all.is_empty() {
            continue;
        }
        for port in ports {
            let set = by_port.entry(port.clone()).or_insert_with(|| {
                port_order.push(port);
                BTreeMap::new()
            });
            for &(a, ready) in &all {
                let i = *address_index.entry(address_id(a)).or_insert_with(|| {
                    addresses.push(a);
                    addresses.len() - 1
                });
                // Not ready wins over ready.
                let was = set.entry(i).or_insert(ready);
                *was = *was && ready;
            }
        }
    }
    // Ports grouped by the exact (address, readiness) set they serve.
    let mut groups: Vec<(Vec<PortId>, &BTreeMap<usize, bool>)> = Vec::new();
    let mut group_of: HashMap<&BTreeMap<usize, bool>, usize> = HashMap::new();
    for port in &port_order {
        let Some(set) = by_port.get(port) else {
            continue;
        };
        let g = *group_of.entry(set).or_insert_with(|| {
            groups.push((Vec::new(), set));
            groups.len() - 1
        });
        if let (Some(port), Some(group)) = (port, groups.get_mut(g)) {
            group.0.push(port.clone());
        }
    }
    groups
        .into_iter()
        .map(|(ports, set)| {
            let mut ready: Vec<EndpointAddress> = Vec::new();
            let mut not_ready: Vec<EndpointAddress> = Vec::new();
            for (&i, &is_ready) in set {
                let a = (*addresses[i]).clone();
                if is_ready {
                    ready.push(a);
                } else {
                    not_ready.push(a);
                }
            }
            ready.sort_by(|a, b| address_order(a).cmp(&address_order(b)));
            not_ready.sort_by(|a, b| address_order(a).cmp(&address_order(b)));
            EndpointSubset {
                addresses: (!ready.is_empty()).then_some(ready),
                not_ready_addresses: (!not_ready.is_empty()).then_some(not_ready),
                ports: (!ports.is_empty()).then(|| ports.iter().map(port_of).collect()),
            }
        })
        .collect()
}

/// MR-4 [utils.go: addressToEndpoint]: the endpoint an address becomes and its address type;
/// none when the IP does not parse (leniently, as Go's `ParseIPSloppy`).
pub fn address_to_endpoint(
    address: &EndpointAddress,
    ready: bool,
) -> Option<(Endpoint, &'static str)> {
    let ip = parse_ip_sloppy(&address.ip)?;
    let address_type = match ip {
        IpAddr::V4(_) => IPV4,
        IpAddr::V6(_) => IPV6,
    };
    let endpoint = Endpoint {
        // Re-serialised: the canonical form of an irregularly written IP.
        addresses: vec![ip.to_string()],
        conditions: Some(EndpointConditions {
            ready: Some(ready),
            serving: None,
            terminating: None,
        }),
        target_ref: address.target_ref.clone(),
        node_name: address.node_name.clone(),
        hostname: address.hostname.clone().filter(|h| !h.is_empty()),
        ..Endpoint::default()
    };
    Some((endpoint, address_type))
}

/// [utils.go: epPortsToEpsPorts]: name and protocol are always set (Go's "" when absent).
pub fn slice_ports(
    ports: Option<&[k8s_openapi::api::core::v1::EndpointPort]>,
) -> Vec<EndpointPort> {
    ports
        .unwrap_or_default()
        .iter()
        .map(|p| EndpointPort {
            name: Some(p.name.clone().unwrap_or_default()),
            port: Some(p.port),
            protocol: Some(p.protocol.clone().unwrap_or_default()),
            app_protocol: p.app_protocol.clone(),
        })
        .collect()
}

/// A mirrored slice's key (MR-3): address type and port set.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct SliceKey {
    pub address_type: String,
    pub ports: PortKey,
}

impl SliceKey {
    pub fn of(address_type: &str, ports: Option<&[EndpointPort]>) -> SliceKey {
        SliceKey {
            address_type: address_type.to_string(),
            ports: PortKey::of(ports),
        }
    }
}

/// The endpoints one key should hold, by identity (ES-13), and its ports.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Group {
    pub ports: Vec<EndpointPort>,
    pub endpoints: BTreeMap<EndpointKey, Endpoint>,
}

/// MR-3's result: the groups (every subset's port set for both address types, possibly empty),
/// and the addresses left out.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Desired {
    pub groups: BTreeMap<SliceKey, Group>,
    /// Addresses whose IP did not parse.
    pub invalid: usize,
    /// Addresses not mirrored: the invalid ones and those beyond the per-subset maximum.
    pub skipped: usize,
}

/// MR-3 [reconciler.go: reconcile, first half; reconciler_helpers.go: desiredCalc]: per
/// canonical subset, ready then not-ready addresses until `max_per_subset` are accepted; an
/// invalid IP is skipped without counting against the maximum.
pub fn desired(subsets: &[EndpointSubset], max_per_subset: usize) -> Desired {
    let mut out = Desired::default();
    for subset in repack(subsets) {
        let ports = slice_ports(subset.ports.as_deref());
        let keys = [IPV4, IPV6].map(|t| SliceKey::of(t, Some(&ports)));
        for key in &keys {
            out.groups.entry(key.clone()).or_default().ports = ports.clone();
        }
        let ready = subset.addresses.iter().flatten().map(|a| (a, true));
        let not_ready = subset
            .not_ready_addresses
            .iter()
            .flatten()
            .map(|a| (a, false));
        let mut total = 0usize;
        let mut accepted = 0usize;
        for (address, is_ready) in ready.chain(not_ready) {
            total = total.saturating_add(1);
            if accepted >= max_per_subset {
                continue;
            }
            match address_to_endpoint(address, is_ready) {
                Some((endpoint, address_type)) => {
                    let key = if address_type == IPV4 {
                        &keys[0]
                    } else {
                        &keys[1]
                    };
                    if let Some(group) = out.groups.get_mut(key) {
                        group.endpoints.insert(EndpointKey::of(&endpoint), endpoint);
                    }
                    accepted += 1;
                }
                None => {
                    out.invalid = out.invalid.saturating_add(1);
                    tracing::info!(ip = %address.ip, "address in Endpoints is not a valid IP, it will not be mirrored to an EndpointSlice");
                }
            }
        }
        out.skipped = out.skipped.saturating_add(total.saturating_sub(accepted));
    }
    out
}

#[cfg(test)]
// Table rows are tuples on purpose, and literal address lists read better than `from_ref`.
#[allow(clippy::type_complexity, clippy::cloned_ref_to_slice_refs)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{EndpointPort as CorePort, ObjectReference};

    fn addr(ip: &str) -> EndpointAddress {
        EndpointAddress {
            ip: ip.into(),
            ..EndpointAddress::default()
        }
    }

    fn addr_uid(ip: &str, uid: &str, host: &str) -> EndpointAddress {
        EndpointAddress {
            ip: ip.into(),
            hostname: Some(host.into()),
            target_ref: Some(ObjectReference {
                kind: Some("Pod".into()),
                namespace: Some("ns".into()),
                name: Some(host.into()),
                uid: Some(uid.into()),
                ..ObjectReference::default()
            }),
            ..EndpointAddress::default()
        }
    }

    fn port(name: &str, n: i32) -> CorePort {
        CorePort {
            name: Some(name.into()),
            port: n,
            protocol: Some("TCP".into()),
            app_protocol: None,
        }
    }

    fn subset(
        ready: &[EndpointAddress],
        not_ready: &[EndpointAddress],
        ports: &[CorePort],
    ) -> EndpointSubset {
        EndpointSubset {
            addresses: (!ready.is_empty()).then(|| ready.to_vec()),
            not_ready_addresses: (!not_ready.is_empty()).then(|| not_ready.to_vec()),
            ports: (!ports.is_empty()).then(|| ports.to_vec()),
        }
    }

    fn ips(list: &Option<Vec<EndpointAddress>>) -> Vec<&str> {
        list.iter().flatten().map(|a| a.ip.as_str()).collect()
    }

    fn port_names(s: &EndpointSubset) -> Vec<&str> {
        s.ports
            .iter()
            .flatten()
            .map(|p| p.name.as_deref().unwrap_or_default())
            .collect()
    }

    #[test]
    fn mr3_repack_merges_equal_address_sets_and_splits_others() {
        // Cases after upstream's RepackSubsets tests.
        let a = addr("10.0.0.1");
        let b = addr("10.0.0.2");
        // Same addresses, two subsets with different ports: one subset with both ports.
        let out = repack(&[
            subset(&[a.clone()], &[], &[port("p", 80)]),
            subset(&[a.clone()], &[], &[port("q", 81)]),
        ]);
        assert_eq!(out.len(), 1);
        assert_eq!(port_names(&out[0]), ["p", "q"]);
        // Same port, different addresses: one subset with both addresses, sorted.
        let out = repack(&[
            subset(&[b.clone()], &[], &[port("p", 80)]),
            subset(&[a.clone()], &[], &[port("p", 80)]),
        ]);
        assert_eq!(out.len(), 1);
        assert_eq!(ips(&out[0].addresses), ["10.0.0.1", "10.0.0.2"]);
        // One port with more addresses than the other: two subsets.
        let out = repack(&[
            subset(
                &[a.clone(), b.clone()],
                &[],
                &[port("p", 80), port("q", 81)],
            ),
            subset(&[], &[], &[]),
        ]);
        assert_eq!(out.len(), 1);
        let out = repack(&[
            subset(&[a.clone(), b.clone()], &[], &[port("p", 80)]),
            subset(&[a.clone()], &[], &[port("q", 81)]),
        ]);
        assert_eq!(out.len(), 2);
        // Duplicates collapse; not ready wins.
        let out = repack(&[subset(
            &[a.clone(), a.clone()],
            &[a.clone()],
            &[port("p", 80)],
        )]);
        assert_eq!(out.len(), 1);
        assert_eq!(ips(&out[0].addresses), Vec::<&str>::new());
        assert_eq!(ips(&out[0].not_ready_addresses), ["10.0.0.1"]);
    }

    #[test]
    fn mr3_repack_portless_subsets_share_one_and_vanish_into_an_equal_one() {
        let a = addr("10.0.0.1");
        let b = addr("10.0.0.2");
        let out = repack(&[
            subset(&[a.clone()], &[], &[]),
            subset(&[b.clone()], &[], &[]),
        ]);
        assert_eq!(out.len(), 1);
        assert_eq!(out[0].ports, None);
        assert_eq!(ips(&out[0].addresses), ["10.0.0.1", "10.0.0.2"]);
        let out = repack(&[
            subset(&[a.clone()], &[], &[port("p", 80)]),
            subset(&[a.clone()], &[], &[]),
        ]);
        assert_eq!(out.len(), 1);
        assert_eq!(port_names(&out[0]), ["p"]);
    }

    #[test]
    fn mr3_repack_identity_is_ip_and_uid_and_sorts_bytes_then_uid() {
        let out = repack(&[subset(
            &[
                addr_uid("10.0.0.9", "b", "pod-b"),
                addr_uid("10.0.0.10", "x", "pod-x"),
                addr_uid("10.0.0.9", "a", "pod-a"),
                addr("10.0.0.9"),
                addr_uid("10.0.0.9", "a", "first-kept"),
            ],
            &[],
            &[port("p", 80)],
        )]);
        let got: Vec<(String, Option<String>)> = out[0]
            .addresses
            .iter()
            .flatten()
            .map(|a| (a.ip.clone(), a.hostname.clone()))
            .collect();
        // "10.0.0.10" < "10.0.0.9" byte-wise; no target before a target; uid a before b.
        assert_eq!(
            got,
            [
                ("10.0.0.10".to_string(), Some("pod-x".to_string())),
                ("10.0.0.9".to_string(), None),
                ("10.0.0.9".to_string(), Some("pod-a".to_string())),
                ("10.0.0.9".to_string(), Some("pod-b".to_string())),
            ]
        );
    }

    #[test]
    fn mr3_repack_equal_app_protocol_ports_merge_by_value() {
        let mut p = port("h", 80);
        p.app_protocol = Some("h2".into());
        let a = addr("10.0.0.1");
        let out = repack(&[
            subset(&[a.clone()], &[], &[p.clone()]),
            subset(&[a], &[], &[p]),
        ]);
        assert_eq!(out.len(), 1);
        assert_eq!(port_names(&out[0]), ["h"], "never the same port twice");
    }

    #[test]
    fn mr4_address_to_endpoint() {
        let mut a = addr_uid("010.000.000.001", "u", "pod-1");
        a.node_name = Some("node-1".into());
        let (ep, t) = address_to_endpoint(&a, true).unwrap();
        assert_eq!(t, IPV4);
        assert_eq!(ep.addresses, ["10.0.0.1"]);
        assert_eq!(ep.hostname.as_deref(), Some("pod-1"));
        assert_eq!(ep.node_name.as_deref(), Some("node-1"));
        assert_eq!(ep.target_ref, a.target_ref);
        let c = ep.conditions.unwrap();
        assert_eq!(
            (c.ready, c.serving, c.terminating),
            (Some(true), None, None)
        );
        assert_eq!((ep.zone, ep.hints), (None, None));

        let mut empty_host = addr("FD00::0001");
        empty_host.hostname = Some(String::new());
        let (ep, t) = address_to_endpoint(&empty_host, false).unwrap();
        assert_eq!(
            (t, ep.addresses[0].as_str(), ep.hostname),
            (IPV6, "fd00::1", None)
        );
        assert_eq!(ep.conditions.unwrap().ready, Some(false));
        assert_eq!(
            address_to_endpoint(&addr("::ffff:1.2.3.4"), true)
                .unwrap()
                .1,
            IPV4
        );

        for bad in ["", "not-an-ip", "1.2.3", "256.0.0.1", "fd00::1::2"] {
            assert!(address_to_endpoint(&addr(bad), true).is_none(), "{bad:?}");
        }
    }

    fn count(d: &Desired, t: &str) -> usize {
        d.groups
            .iter()
            .filter(|(k, _)| k.address_type == t)
            .map(|(_, g)| g.endpoints.len())
            .sum()
    }

    #[test]
    fn mr3_per_subset_maximum_ready_first_invalid_not_counted() {
        let cases: &[(&str, Vec<EndpointSubset>, usize, usize, usize, usize, usize)] = &[
            // name, subsets, max, v4 mirrored, v6 mirrored, invalid, skipped
            ("no subsets", vec![], 1000, 0, 0, 0, 0),
            (
                "1,200 in one subset",
                vec![subset(
                    &(0..1200)
                        .map(|i| addr(&format!("10.0.{}.{}", i / 250, i % 250 + 1)))
                        .collect::<Vec<_>>(),
                    &[],
                    &[port("p", 80)],
                )],
                1000,
                1000,
                0,
                0,
                200,
            ),
            (
                "an invalid IP before the maximum is counted, and does not count against it",
                vec![subset(
                    &[addr("1.2.3.999"), addr("10.0.0.1"), addr("10.0.0.2")],
                    &[addr("x")],
                    &[port("p", 80)],
                )],
                2,
                2,
                0,
                1,
                2,
            ),
            (
                // Addresses are sorted first: "bad" comes after the maximum is reached.
                "an invalid IP past the maximum is skipped, not counted invalid",
                vec![subset(
                    &[addr("bad"), addr("10.0.0.1"), addr("10.0.0.2")],
                    &[addr("x")],
                    &[port("p", 80)],
                )],
                2,
                2,
                0,
                0,
                2,
            ),
            (
                "two subsets, each its own maximum",
                vec![
                    subset(
                        &[addr("10.0.0.1"), addr("10.0.0.2"), addr("10.0.0.3")],
                        &[],
                        &[port("p", 80)],
                    ),
                    subset(&[addr("10.0.1.1")], &[addr("10.0.1.2")], &[port("q", 81)]),
                ],
                2,
                4,
                0,
                0,
                1,
            ),
            (
                "dual stack in one subset",
                vec![subset(
                    &[addr("10.0.0.1"), addr("fd00::1")],
                    &[addr("fd00::2")],
                    &[port("p", 80)],
                )],
                1000,
                1,
                2,
                0,
                0,
            ),
            (
                "all invalid",
                vec![subset(
                    &[addr("a"), addr("b")],
                    &[addr("c")],
                    &[port("p", 80)],
                )],
                1000,
                0,
                0,
                3,
                3,
            ),
        ];
        for (name, subsets, max, v4, v6, invalid, skipped) in cases {
            let d = desired(subsets, *max);
            assert_eq!(
                (count(&d, IPV4), count(&d, IPV6), d.invalid, d.skipped),
                (*v4, *v6, *invalid, *skipped),
                "{name}"
            );
        }
    }

    #[test]
    fn mr3_ready_addresses_are_taken_before_not_ready() {
        let d = desired(
            &[subset(
                &[addr("10.0.0.9")],
                &[addr("10.0.0.1"), addr("10.0.0.2")],
                &[port("p", 80)],
            )],
            2,
        );
        let g = &d.groups[&SliceKey::of(IPV4, Some(&slice_ports(Some(&[port("p", 80)]))))];
        let mut got: Vec<(String, Option<bool>)> = g
            .endpoints
            .values()
            .map(|e| {
                (
                    e.addresses[0].clone(),
                    e.conditions.as_ref().and_then(|c| c.ready),
                )
            })
            .collect();
        got.sort();
        assert_eq!(
            got,
            [
                ("10.0.0.1".to_string(), Some(false)),
                ("10.0.0.9".to_string(), Some(true))
            ]
        );
    }

    #[test]
    fn mr3_every_subset_keys_both_families() {
        let d = desired(
            &[
                subset(&[addr("10.0.0.1")], &[], &[port("p", 80)]),
                subset(&[], &[], &[]),
            ],
            1000,
        );
        let keys: Vec<(&str, usize)> = d
            .groups
            .iter()
            .map(|(k, g)| (k.address_type.as_str(), g.ports.len()))
            .collect();
        assert_eq!(
            keys.len(),
            2,
            "{keys:?}: the empty subset has no addresses, so no port-less group"
        );
        assert!(keys.contains(&(IPV4, 1)) && keys.contains(&(IPV6, 1)));
    }

    #[test]
    fn mr3_canonical_duplicates_collapse_into_one_endpoint() {
        let d = desired(
            &[subset(
                &[addr("10.0.0.1"), addr("010.0.0.1")],
                &[],
                &[port("p", 80)],
            )],
            1000,
        );
        assert_eq!(count(&d, IPV4), 1);
        assert_eq!(d.skipped, 0);
    }
}
