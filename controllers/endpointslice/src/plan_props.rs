//! PX-1: the EndpointSlice plan at the API-valid extremes, as properties. Services with
//! ports 1..65535 (the same number under several protocols, target ports as numbers or names that
//! no container declares), pods with IPs that do not parse, IPs of the other family, no IP,
//! duplicate container port names, nodes that do not exist, any phase and readiness; slices of
//! 1 to 1000 endpoints.

use super::*;
use crate::endpoints::{IPV4, IPV6, desired};
use k8s_openapi::api::core::v1::{Node, Service};
use proptest::prelude::*;
use serde_json::{Value, json};
use shared::cache::pod::Pod;

fn port_number() -> impl Strategy<Value = i64> {
    prop_oneof![Just(1i64), Just(65535), 1..=65535i64]
}

fn service_port() -> impl Strategy<Value = Value> {
    (
        0..3usize,
        port_number(),
        prop_oneof![
            port_number().prop_map(|p| json!(p)),
            Just(json!("http")),
            Just(json!("missing")),
            Just(Value::Null),
        ],
        prop::sample::select(vec!["TCP", "UDP", "SCTP"]),
    )
        .prop_map(|(name, port, target, protocol)| {
            let mut p = json!({"name": format!("p{name}"), "port": port, "protocol": protocol});
            if !target.is_null() {
                p["targetPort"] = target;
            }
            p
        })
}

fn service(ports: Vec<Value>, dual: bool, publish: bool) -> Service {
    // Port names are unique in a Service (validation): the last of a name wins.
    let mut by_name = std::collections::BTreeMap::new();
    for p in ports {
        by_name.insert(p["name"].as_str().unwrap().to_string(), p);
    }
    let families = if dual {
        json!(["IPv4", "IPv6"])
    } else {
        json!(["IPv4"])
    };
    serde_json::from_value(json!({
        "metadata": {"name": "web", "namespace": "ns", "uid": "uid-svc"},
        "spec": {"selector": {"app": "web"}, "clusterIP": "10.0.0.10", "ipFamilies": families,
                 "publishNotReadyAddresses": publish,
                 "ports": by_name.into_values().collect::<Vec<_>>()}
    }))
    .unwrap()
}

fn ip() -> impl Strategy<Value = Option<String>> {
    prop_oneof![
        Just(None),
        Just(Some(String::new())),
        Just(Some("not-an-ip".to_string())),
        Just(Some("010.001.002.003".to_string())),
        Just(Some("::ffff:10.1.2.3".to_string())),
        Just(Some("fd00::1".to_string())),
        any::<[u8; 4]>().prop_map(|b| Some(std::net::Ipv4Addr::from(b).to_string())),
        (0u8..4).prop_map(|b| Some(format!("10.1.0.{b}"))),
    ]
}

fn pod(i: usize, ip: Option<String>, phase: &str, ready: bool, node: usize, port: i64) -> Pod {
    let ips: Vec<Value> = ip.iter().map(|ip| json!({"ip": ip})).collect();
    let full: k8s_openapi::api::core::v1::Pod = serde_json::from_value(json!({
        "metadata": {"name": format!("web-{i}"), "namespace": "ns", "uid": format!("uid-{i}"),
                     "labels": {"app": "web"}},
        "spec": {"nodeName": format!("node-{node}"),
                 "containers": [{"name": "c", "ports": [
                     {"name": "http", "containerPort": port, "protocol": "TCP"},
                     {"name": "http", "containerPort": 1, "protocol": "UDP"}]}]},
        "status": {"phase": phase, "podIP": ip, "podIPs": ips,
                   "conditions": [{"type": "Ready", "status": if ready { "True" } else { "False" }}]}
    }))
    .unwrap();
    full.into()
}

fn node(name: &str) -> Node {
    serde_json::from_value(json!({
        "metadata": {"name": name, "labels": {"topology.kubernetes.io/zone": "z"}},
    }))
    .unwrap()
}

fn count(slices: &[EndpointSlice]) -> usize {
    slices.iter().map(|s| endpoints_of(s).len()).sum()
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    /// ES-10..ES-14: never panics; no slice over the maximum; every desired endpoint is written
    /// exactly once; planning again over what was written changes nothing.
    #[test]
    fn plan_total_and_stable_at_extremes(
        ports in prop::collection::vec(service_port(), 0..4),
        dual in any::<bool>(),
        publish in any::<bool>(),
        pods in prop::collection::vec(
            (ip(), prop::sample::select(vec!["Pending", "Running", "Succeeded", "Failed", ""]),
             any::<bool>(), 0..4usize, port_number()),
            0..12,
        ),
        max in prop_oneof![Just(1usize), Just(1000), 1..5usize],
    ) {
        let svc = service(ports, dual, publish);
        let pods: Vec<Pod> = pods
            .into_iter()
            .enumerate()
            .map(|(i, (ip, phase, ready, node, port))| pod(i, ip, phase, ready, node, port))
            .collect();
        // node-3 does not exist (a pod on a deleted node).
        let lookup = |n: &str| (n != "node-3").then(|| std::sync::Arc::new(node(n)));
        for family in [IPV4, IPV6] {
            let want = desired(&svc, pods.iter(), lookup, family);
            let total: usize = want.groups.values().map(|g| g.endpoints.len()).sum();
            let first = plan_address_type(&svc, &[], want.clone(), max, family);
            prop_assert!(first.to_update.is_empty() && first.to_delete.is_empty());
            prop_assert!(first.to_create.iter().all(|s| endpoints_of(s).len() <= max));
            prop_assert_eq!(count(&first.to_create), total);
            let existing: Vec<Arc<EndpointSlice>> = first
                .to_create
                .iter()
                .enumerate()
                .map(|(i, s)| {
                    let mut s = s.clone();
                    s.metadata.name = Some(format!("web-{family}-{i}"));
                    Arc::new(s)
                })
                .collect();
            let again = plan_address_type(&svc, &existing, want, max, family);
            prop_assert!(
                again.to_create.is_empty() && again.to_update.is_empty() && again.to_delete.is_empty(),
                "a second plan over its own writes changed something"
            );
        }
    }
}
