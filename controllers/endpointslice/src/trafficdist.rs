//! ES-20: hints driven by `spec.trafficDistribution` (upstream `k8s.io/endpointslice/trafficdist`).
//!
//! Pure functions over owned slices: the caller hands in clones, nothing shared is mutated.
//! No events, no CPU weighting: every ready endpoint is simply hinted to where it runs.

use k8s_openapi::api::discovery::v1::{Endpoint, EndpointHints, EndpointSlice, ForNode, ForZone};

/// `spec.trafficDistribution` value: prefer endpoints topologically close to the client.
pub const PREFER_CLOSE: &str = "PreferClose";
/// `spec.trafficDistribution` value: same as `PreferClose` (the newer, explicit name).
pub const PREFER_SAME_ZONE: &str = "PreferSameZone";
/// `spec.trafficDistribution` value: zone hints plus node hints.
pub const PREFER_SAME_NODE: &str = "PreferSameNode";

/// ES-18/ES-20: whether `spec.trafficDistribution` selects hints (upstream
/// `Reconciler.validTrafficDistribution` with PreferSameTrafficDistribution on, GA in 1.37, and
/// the `closeTrafficDistribution` set of `trafficdist.go`).
pub fn valid(traffic_distribution: Option<&str>) -> bool {
    matches!(
        traffic_distribution,
        Some(PREFER_CLOSE | PREFER_SAME_ZONE | PREFER_SAME_NODE)
    )
}

/// ES-20: upstream `trafficdist.ReconcileHints`. Returns `(to_create, to_update, unchanged)`.
///
/// Unchanged slices whose hints disagree with the heuristic move (in order) to the end of
/// `to_update`; every slice to create or update then gets its hints rewritten. Any value other
/// than the three "close" ones (including `None`) selects the default heuristic, which strips
/// all hints.
pub fn reconcile_hints(
    traffic_distribution: Option<&str>,
    mut to_create: Vec<EndpointSlice>,
    mut to_update: Vec<EndpointSlice>,
    unchanged: Vec<EndpointSlice>,
) -> (Vec<EndpointSlice>, Vec<EndpointSlice>, Vec<EndpointSlice>) {
    let heuristic = Heuristic::for_distribution(traffic_distribution);

    let mut still_unchanged = Vec::with_capacity(unchanged.len());
    for slice in unchanged {
        if heuristic.needs_update(&slice) {
            to_update.push(slice);
        } else {
            still_unchanged.push(slice);
        }
    }

    for slice in to_create.iter_mut().chain(to_update.iter_mut()) {
        heuristic.update(slice);
    }
    (to_create, to_update, still_unchanged)
}

/// Upstream's `heuristic` interface: `defaultHeuristic` or `preferCloseHeuristic`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Heuristic {
    /// Cluster-wide routing: no hints at all.
    Default,
    /// Same-zone hints, plus same-node hints when `node_hints` (PreferSameNode).
    PreferClose { node_hints: bool },
}

impl Heuristic {
    fn for_distribution(traffic_distribution: Option<&str>) -> Self {
        if valid(traffic_distribution) {
            Heuristic::PreferClose {
                node_hints: traffic_distribution == Some(PREFER_SAME_NODE),
            }
        } else {
            Heuristic::Default
        }
    }

    /// Upstream `needsUpdate`: does any endpoint carry a missing, wrong or stale hint?
    fn needs_update(self, slice: &EndpointSlice) -> bool {
        let endpoints = slice.endpoints.as_deref().unwrap_or_default();
        match self {
            // Any hints object at all (even an empty one) is stale, ready or not.
            Heuristic::Default => endpoints.iter().any(|ep| ep.hints.is_some()),
            Heuristic::PreferClose { node_hints } => endpoints
                .iter()
                // Not-ready endpoints are left as they are, so they never force a write.
                .filter(|ep| endpoint_ready(ep))
                .any(|ep| prefer_close_wrong(ep, node_hints)),
        }
    }

    /// Upstream `update`: rewrite hints of the slice in place.
    fn update(self, slice: &mut EndpointSlice) {
        let Some(endpoints) = slice.endpoints.as_mut() else {
            return;
        };
        match self {
            Heuristic::Default => endpoints.iter_mut().for_each(|ep| ep.hints = None),
            Heuristic::PreferClose { node_hints } => {
                for ep in endpoints.iter_mut().filter(|ep| endpoint_ready(ep)) {
                    ep.hints = prefer_close_hints(ep, node_hints);
                }
            }
        }
    }
}

/// Upstream `endpointReady`: the Ready condition is explicitly true.
fn endpoint_ready(ep: &Endpoint) -> bool {
    ep.conditions.as_ref().and_then(|c| c.ready) == Some(true)
}

/// The hints preferCloseHeuristic wants on a ready endpoint.
///
/// Like upstream, a zone is hinted whenever `zone` is set. The reconciler never sets an empty
/// zone (it filters `""` when building endpoints), which is what keeps `forZones: [{name: ""}]`
/// out of written slices.
fn prefer_close_hints(ep: &Endpoint, node_hints: bool) -> Option<EndpointHints> {
    let for_zones = ep.zone.as_ref().map(|z| vec![ForZone { name: z.clone() }]);
    let for_nodes = ep
        .node_name
        .as_ref()
        .filter(|_| node_hints)
        .map(|n| vec![ForNode { name: n.clone() }]);
    if for_zones.is_none() && for_nodes.is_none() {
        return None;
    }
    Some(EndpointHints {
        for_zones,
        for_nodes,
    })
}

/// preferCloseHeuristic's per-endpoint check of `needsUpdate` (ready endpoints only).
fn prefer_close_wrong(ep: &Endpoint, node_hints: bool) -> bool {
    let zones = ep
        .hints
        .as_ref()
        .and_then(|h| h.for_zones.as_deref())
        .unwrap_or_default();
    let nodes = ep
        .hints
        .as_ref()
        .and_then(|h| h.for_nodes.as_deref())
        .unwrap_or_default();
    let zone_wrong = match &ep.zone {
        // Exactly one zone hint naming the endpoint's own zone.
        Some(zone) => !matches!(zones, [only] if only.name == *zone),
        None => !zones.is_empty(),
    };
    if zone_wrong {
        return true;
    }
    match ep.node_name.as_ref().filter(|_| node_hints) {
        Some(node) => !matches!(nodes, [only] if only.name == *node),
        None => !nodes.is_empty(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::discovery::v1::EndpointConditions;

    /// Endpoint builder: (zone, node, ready, hinted zones, hinted nodes).
    fn ep(
        zone: Option<&str>,
        node: Option<&str>,
        ready: Option<bool>,
        hint_zones: Option<&[&str]>,
        hint_nodes: Option<&[&str]>,
    ) -> Endpoint {
        let hints = (hint_zones.is_some() || hint_nodes.is_some()).then(|| EndpointHints {
            for_zones: hint_zones.map(|zs| {
                zs.iter()
                    .map(|z| ForZone {
                        name: (*z).to_owned(),
                    })
                    .collect()
            }),
            for_nodes: hint_nodes.map(|ns| {
                ns.iter()
                    .map(|n| ForNode {
                        name: (*n).to_owned(),
                    })
                    .collect()
            }),
        });
        Endpoint {
            addresses: vec!["10.0.0.1".into()],
            zone: zone.map(str::to_owned),
            node_name: node.map(str::to_owned),
            conditions: Some(EndpointConditions {
                ready,
                ..Default::default()
            }),
            hints,
            ..Default::default()
        }
    }

    fn slice(endpoints: Vec<Endpoint>) -> EndpointSlice {
        EndpointSlice {
            address_type: "IPv4".into(),
            endpoints: Some(endpoints),
            ..Default::default()
        }
    }

    /// Ready endpoint with zone and node, no hints.
    fn rdy(zone: &str, node: &str) -> Endpoint {
        ep(Some(zone), Some(node), Some(true), None, None)
    }
    /// Ready endpoint with zone and node, zone hint only.
    fn rdy_z(zone: &str, node: &str, hint: &str) -> Endpoint {
        ep(Some(zone), Some(node), Some(true), Some(&[hint]), None)
    }
    /// Ready endpoint with zone and node hints.
    fn rdy_zn(zone: &str, node: &str) -> Endpoint {
        ep(
            Some(zone),
            Some(node),
            Some(true),
            Some(&[zone]),
            Some(&[node]),
        )
    }
    fn rdy_nozone(node: &str) -> Endpoint {
        ep(None, Some(node), Some(true), None, None)
    }
    fn rdy_nozone_n(node: &str) -> Endpoint {
        ep(None, Some(node), Some(true), None, Some(&[node]))
    }

    struct Case {
        name: &'static str,
        dist: Option<&'static str>,
        create: Vec<EndpointSlice>,
        update: Vec<EndpointSlice>,
        unchanged: Vec<EndpointSlice>,
        want_create: Vec<EndpointSlice>,
        want_update: Vec<EndpointSlice>,
        want_unchanged: Vec<EndpointSlice>,
    }

    fn input_8() -> (Vec<EndpointSlice>, Vec<EndpointSlice>) {
        (
            vec![
                slice(vec![rdy("zone-a", "node-1"), rdy("zone-b", "node-2")]),
                slice(vec![rdy("zone-a", "node-3"), rdy("zone-b", "node-4")]),
            ],
            vec![
                slice(vec![rdy("zone-a", "node-5"), rdy("zone-a", "node-6")]),
                slice(vec![rdy("zone-b", "node-7"), rdy("zone-c", "node-8")]),
            ],
        )
    }

    fn zone_hinted_8() -> (Vec<EndpointSlice>, Vec<EndpointSlice>) {
        (
            vec![
                slice(vec![
                    rdy_z("zone-a", "node-1", "zone-a"),
                    rdy_z("zone-b", "node-2", "zone-b"),
                ]),
                slice(vec![
                    rdy_z("zone-a", "node-3", "zone-a"),
                    rdy_z("zone-b", "node-4", "zone-b"),
                ]),
            ],
            vec![
                slice(vec![
                    rdy_z("zone-a", "node-5", "zone-a"),
                    rdy_z("zone-a", "node-6", "zone-a"),
                ]),
                slice(vec![
                    rdy_z("zone-b", "node-7", "zone-b"),
                    rdy_z("zone-c", "node-8", "zone-c"),
                ]),
            ],
        )
    }

    fn cases() -> Vec<Case> {
        let (c8, u8_) = input_8();
        let (zc8, zu8) = zone_hinted_8();
        vec![
            Case {
                name: "es20_prefer_close_sets_zone_hints",
                dist: Some(PREFER_CLOSE),
                create: c8.clone(),
                update: u8_.clone(),
                unchanged: vec![],
                want_create: zc8.clone(),
                want_update: zu8.clone(),
                want_unchanged: vec![],
            },
            Case {
                name: "es20_prefer_same_zone_sets_zone_hints",
                dist: Some(PREFER_SAME_ZONE),
                create: c8.clone(),
                update: u8_.clone(),
                unchanged: vec![],
                want_create: zc8,
                want_update: zu8,
                want_unchanged: vec![],
            },
            Case {
                name: "es20_prefer_same_node_sets_zone_and_node_hints",
                dist: Some(PREFER_SAME_NODE),
                create: c8,
                update: u8_,
                unchanged: vec![],
                want_create: vec![
                    slice(vec![rdy_zn("zone-a", "node-1"), rdy_zn("zone-b", "node-2")]),
                    slice(vec![rdy_zn("zone-a", "node-3"), rdy_zn("zone-b", "node-4")]),
                ],
                want_update: vec![
                    slice(vec![rdy_zn("zone-a", "node-5"), rdy_zn("zone-a", "node-6")]),
                    slice(vec![rdy_zn("zone-b", "node-7"), rdy_zn("zone-c", "node-8")]),
                ],
                want_unchanged: vec![],
            },
            Case {
                name: "es20_prefer_close_corrects_incorrect_hints",
                dist: Some(PREFER_CLOSE),
                create: vec![],
                update: vec![slice(vec![rdy_z("zone-a", "node-1", "zone-b")])],
                unchanged: vec![
                    slice(vec![rdy_z("zone-b", "node-2", "zone-c")]),
                    slice(vec![rdy("zone-c", "node-3")]),
                ],
                want_create: vec![],
                want_update: vec![
                    slice(vec![rdy_z("zone-a", "node-1", "zone-a")]),
                    slice(vec![rdy_z("zone-b", "node-2", "zone-b")]),
                    slice(vec![rdy_z("zone-c", "node-3", "zone-c")]),
                ],
                want_unchanged: vec![],
            },
            Case {
                name: "es20_prefer_close_no_zones_no_hints",
                dist: Some(PREFER_CLOSE),
                create: vec![slice(vec![rdy_nozone("node-1"), rdy_nozone("node-2")])],
                update: vec![slice(vec![rdy_nozone("node-5")])],
                unchanged: vec![],
                want_create: vec![slice(vec![rdy_nozone("node-1"), rdy_nozone("node-2")])],
                want_update: vec![slice(vec![rdy_nozone("node-5")])],
                want_unchanged: vec![],
            },
            Case {
                name: "es20_prefer_same_node_no_zones_node_hints_only",
                dist: Some(PREFER_SAME_NODE),
                create: vec![slice(vec![rdy_nozone("node-1"), rdy_nozone("node-2")])],
                update: vec![slice(vec![rdy_nozone("node-5")])],
                unchanged: vec![],
                want_create: vec![slice(vec![rdy_nozone_n("node-1"), rdy_nozone_n("node-2")])],
                want_update: vec![slice(vec![rdy_nozone_n("node-5")])],
                want_unchanged: vec![],
            },
            Case {
                name: "es20_unready_endpoints_do_not_trigger_updates",
                dist: Some(PREFER_CLOSE),
                create: vec![],
                update: vec![],
                unchanged: vec![slice(vec![ep(
                    Some("zone-b"),
                    Some("node-2"),
                    Some(false),
                    None,
                    None,
                )])],
                want_create: vec![],
                want_update: vec![],
                want_unchanged: vec![slice(vec![ep(
                    Some("zone-b"),
                    Some("node-2"),
                    Some(false),
                    None,
                    None,
                )])],
            },
            Case {
                name: "es20_unrecognized_distribution_removes_hints",
                dist: Some("Unknown"),
                create: vec![
                    slice(vec![
                        rdy_z("zone-a", "node-1", "zone-a"),
                        rdy_z("zone-b", "node-2", "zone-b"),
                    ]),
                    slice(vec![rdy_z("zone-a", "node-3", "zone-a")]),
                ],
                update: vec![slice(vec![rdy_z("zone-a", "node-5", "zone-a")])],
                unchanged: vec![],
                want_create: vec![
                    slice(vec![rdy("zone-a", "node-1"), rdy("zone-b", "node-2")]),
                    slice(vec![rdy("zone-a", "node-3")]),
                ],
                want_update: vec![slice(vec![rdy("zone-a", "node-5")])],
                want_unchanged: vec![],
            },
            Case {
                name: "es20_unset_distribution_removes_hints_and_moves_unchanged",
                dist: None,
                create: vec![],
                update: vec![slice(vec![rdy_z("zone-a", "node-5", "zone-a")])],
                unchanged: vec![
                    slice(vec![rdy_z("zone-b", "node-6", "zone-b")]),
                    slice(vec![rdy("zone-c", "node-7")]),
                ],
                want_create: vec![],
                want_update: vec![
                    slice(vec![rdy("zone-a", "node-5")]),
                    slice(vec![rdy("zone-b", "node-6")]),
                ],
                want_unchanged: vec![slice(vec![rdy("zone-c", "node-7")])],
            },
            // E9: not-ready and zoneless endpoints get no hints; ready ones get their own zone.
            Case {
                name: "es20_e9_prefer_close_not_ready_and_zoneless_get_none",
                dist: Some(PREFER_CLOSE),
                create: vec![slice(vec![
                    rdy("zone-a", "node-1"),
                    ep(Some("zone-b"), Some("node-2"), Some(false), None, None),
                    ep(Some("zone-b"), Some("node-2"), None, None, None),
                    rdy_nozone("node-3"),
                ])],
                update: vec![],
                unchanged: vec![],
                want_create: vec![slice(vec![
                    rdy_z("zone-a", "node-1", "zone-a"),
                    ep(Some("zone-b"), Some("node-2"), Some(false), None, None),
                    ep(Some("zone-b"), Some("node-2"), None, None, None),
                    rdy_nozone("node-3"),
                ])],
                want_update: vec![],
                want_unchanged: vec![],
            },
            // PreferClose drops stale node hints (e.g. after switching from PreferSameNode).
            Case {
                name: "es20_prefer_close_drops_stale_node_hints",
                dist: Some(PREFER_CLOSE),
                create: vec![],
                update: vec![],
                unchanged: vec![
                    slice(vec![rdy_zn("zone-a", "node-1")]),
                    slice(vec![rdy_z("zone-a", "node-2", "zone-a")]),
                    slice(vec![ep(None, Some("node-3"), Some(true), Some(&[]), None)]),
                ],
                want_create: vec![],
                want_update: vec![slice(vec![rdy_z("zone-a", "node-1", "zone-a")])],
                want_unchanged: vec![
                    slice(vec![rdy_z("zone-a", "node-2", "zone-a")]),
                    // An empty forZones list is not a stale zone hint (len 0), so it stays.
                    slice(vec![ep(None, Some("node-3"), Some(true), Some(&[]), None)]),
                ],
            },
            // PreferSameNode wants exactly one node hint naming the endpoint's node.
            Case {
                name: "es20_prefer_same_node_fixes_missing_or_wrong_node_hints",
                dist: Some(PREFER_SAME_NODE),
                create: vec![],
                update: vec![],
                unchanged: vec![
                    slice(vec![rdy_zn("zone-a", "node-1")]),
                    slice(vec![rdy_z("zone-a", "node-2", "zone-a")]),
                    slice(vec![ep(
                        Some("zone-a"),
                        Some("node-3"),
                        Some(true),
                        Some(&["zone-a"]),
                        Some(&["node-9"]),
                    )]),
                ],
                want_create: vec![],
                want_update: vec![
                    slice(vec![rdy_zn("zone-a", "node-2")]),
                    slice(vec![rdy_zn("zone-a", "node-3")]),
                ],
                want_unchanged: vec![slice(vec![rdy_zn("zone-a", "node-1")])],
            },
            // Upstream skips not-ready endpoints in `update`, so a stale hint on one survives
            // when its slice is rewritten for another reason (ES-20's "not-ready endpoints carry
            // none" holds for endpoints the reconciler builds, which never carry hints).
            Case {
                name: "es20_not_ready_endpoint_hints_left_as_they_are",
                dist: Some(PREFER_CLOSE),
                create: vec![],
                update: vec![slice(vec![
                    rdy("zone-a", "node-1"),
                    ep(
                        Some("zone-a"),
                        Some("node-2"),
                        Some(false),
                        Some(&["zone-a"]),
                        None,
                    ),
                ])],
                unchanged: vec![],
                want_create: vec![],
                want_update: vec![slice(vec![
                    rdy_z("zone-a", "node-1", "zone-a"),
                    ep(
                        Some("zone-a"),
                        Some("node-2"),
                        Some(false),
                        Some(&["zone-a"]),
                        None,
                    ),
                ])],
                want_unchanged: vec![],
            },
            Case {
                name: "es20_slices_without_endpoints",
                dist: Some(PREFER_SAME_NODE),
                create: vec![EndpointSlice::default()],
                update: vec![],
                unchanged: vec![EndpointSlice::default()],
                want_create: vec![EndpointSlice::default()],
                want_update: vec![],
                want_unchanged: vec![EndpointSlice::default()],
            },
        ]
    }

    #[test]
    fn es20_reconcile_hints_table() {
        for c in cases() {
            let (create, update, unchanged) =
                reconcile_hints(c.dist, c.create, c.update, c.unchanged);
            assert_eq!(create, c.want_create, "{}: to_create", c.name);
            assert_eq!(update, c.want_update, "{}: to_update", c.name);
            assert_eq!(unchanged, c.want_unchanged, "{}: unchanged", c.name);
        }
    }

    #[test]
    fn es20_prefer_close_serialises_without_empty_zone() {
        // E9: a zoneless ready endpoint must not serialise as `forZones: [{name: ""}]`.
        let (create, _, _) = reconcile_hints(
            Some(PREFER_CLOSE),
            vec![slice(vec![rdy_nozone("node-1")])],
            vec![],
            vec![],
        );
        let json = serde_json::to_value(&create).unwrap();
        assert!(json[0]["endpoints"][0].get("hints").is_none(), "{json}");
    }

    #[test]
    fn es20_valid_values() {
        for (value, want) in [
            (None, false),
            (Some("PreferClose"), true),
            (Some("PreferSameZone"), true),
            (Some("PreferSameNode"), true),
            (Some("preferClose"), false),
            (Some(""), false),
            (Some("Unknown"), false),
        ] {
            assert_eq!(valid(value), want, "{value:?}");
        }
    }
}
