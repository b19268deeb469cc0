//! PX-1: the mirroring plan at the API-valid extremes, as properties. Endpoints are the
//! user's (selectorless Services): subsets with the same address twice, in both the ready and
//! not-ready lists, IPs that do not parse (the API server checks them, but objects written before
//! that check exist), ports 1..65535 with names clashing across protocols, empty subsets; the
//! per-subset maximum from 1 to 1000 (`--mirroring-max-endpoints-per-subset`).

use super::*;
use crate::desired::desired;
use k8s_openapi::api::core::v1::{EndpointAddress, EndpointPort as CorePort, EndpointSubset};
use proptest::prelude::*;

fn ip() -> impl Strategy<Value = String> {
    prop_oneof![
        Just(String::new()),
        Just("not-an-ip".to_string()),
        Just("fd00::1".to_string()),
        Just("::ffff:10.1.2.3".to_string()),
        (0u8..4).prop_map(|b| format!("10.1.0.{b}")),
        any::<[u8; 4]>().prop_map(|b| std::net::Ipv4Addr::from(b).to_string()),
    ]
}

fn subset() -> impl Strategy<Value = EndpointSubset> {
    (
        prop::collection::vec(ip(), 0..5),
        prop::collection::vec(ip(), 0..3),
        prop::collection::vec(
            (
                prop::sample::select(vec!["", "a", "b"]),
                prop_oneof![Just(1i32), Just(65535), 1..=65535i32],
                prop::sample::select(vec!["TCP", "UDP", "SCTP"]),
            ),
            0..3,
        ),
    )
        .prop_map(|(ready, not_ready, ports)| {
            let addr = |ip: String| EndpointAddress {
                ip,
                ..Default::default()
            };
            EndpointSubset {
                addresses: Some(ready.into_iter().map(addr).collect()),
                not_ready_addresses: Some(not_ready.into_iter().map(addr).collect()),
                ports: Some(
                    ports
                        .into_iter()
                        .map(|(name, port, protocol)| CorePort {
                            name: Some(name.into()),
                            port,
                            protocol: Some(protocol.into()),
                            app_protocol: None,
                        })
                        .collect(),
                ),
            }
        })
}

fn endpoints() -> Endpoints {
    Endpoints {
        metadata: ObjectMeta {
            name: Some("web".into()),
            namespace: Some("ns".into()),
            uid: Some("uid-ep".into()),
            ..Default::default()
        },
        subsets: None,
    }
}

fn count(slices: &[EndpointSlice]) -> usize {
    slices.iter().map(|s| endpoints_of(s).len()).sum()
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    /// MR-3..MR-6: never panics; the skipped count never exceeds the addresses of the canonical
    /// subsets; no slice
    /// holds more than the maximum; every desired endpoint is written once; planning again over
    /// what was written changes nothing.
    #[test]
    fn plan_total_and_stable_at_extremes(
        subsets in prop::collection::vec(subset(), 0..4),
        max in prop_oneof![Just(1usize), Just(1000), 1..4usize],
    ) {
        // Counted per canonical subset (MR-3): an address listed under two port sets counts in
        // each.
        let given: usize = crate::desired::repack(&subsets)
            .iter()
            .map(|s| {
                s.addresses.as_ref().map_or(0, Vec::len)
                    + s.not_ready_addresses.as_ref().map_or(0, Vec::len)
            })
            .sum();
        let want = desired(&subsets, max);
        prop_assert!(want.invalid <= want.skipped && want.skipped <= given);
        let total: usize = want.groups.values().map(|g| g.endpoints.len()).sum();
        let ep = endpoints();
        let first = plan(&ep, &[], want.clone(), max);
        prop_assert!(first.update.is_empty() && first.delete.is_empty());
        prop_assert!(first.create.iter().all(|s| endpoints_of(s).len() <= max));
        prop_assert_eq!(count(&first.create), total);
        let existing: Vec<Arc<EndpointSlice>> = first
            .create
            .iter()
            .enumerate()
            .map(|(i, s)| {
                let mut s = s.clone();
                s.metadata.name = Some(format!("web-{i}"));
                Arc::new(s)
            })
            .collect();
        let again = plan(&ep, &existing, want, max);
        prop_assert!(
            again.create.is_empty() && again.update.is_empty() && again.delete.is_empty(),
            "a second plan over its own writes changed something"
        );
    }
}
