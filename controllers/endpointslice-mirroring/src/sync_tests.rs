//! Sync tests: the whole controller (its real `init`, handlers, queue and syncs) against the
//! test kit's caches and recording writer, on tokio's paused clock. Writes reach the caches only
//! when a test lets the watch catch up (`observe_slices`).

use crate::handlers::{ANNOTATION_LEADER, LABEL_SKIP_MIRROR};
use crate::plan::MANAGED_BY;
use crate::{DECLARATION, EndpointSliceMirroringOptions, init};
use k8s_openapi::api::core::v1::{Endpoints, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use serde_json::{Value, json};
use shared::api::writer::Call;
use shared::testkit::{Kit, Running, eventually, settle};
use std::collections::BTreeMap;
use std::time::Duration;

const WAIT: Duration = Duration::from_secs(3);

fn service(selector: Option<Value>) -> Service {
    let mut v = json!({
        "apiVersion": "v1", "kind": "Service",
        "metadata": {"name": "web", "namespace": "ns", "uid": "uid-svc", "resourceVersion": "1"},
        "spec": {"ports": [{"name": "http", "port": 80, "protocol": "TCP"}]}
    });
    if let Some(sel) = selector {
        v["spec"]["selector"] = sel;
    }
    serde_json::from_value(v).unwrap()
}

fn endpoints(rv: &str, subsets: Value, labels: Value, annotations: Value) -> Endpoints {
    serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Endpoints",
        "metadata": {"name": "web", "namespace": "ns", "uid": "uid-ep", "resourceVersion": rv,
                     "labels": labels, "annotations": annotations},
        "subsets": subsets
    }))
    .unwrap()
}

fn http(addresses: Vec<Value>) -> Value {
    json!({"addresses": addresses, "ports": [{"name": "http", "port": 80, "protocol": "TCP"}]})
}

fn address(ip: &str) -> Value {
    json!({"ip": ip})
}

fn simple(rv: &str) -> Endpoints {
    endpoints(
        rv,
        json!([http(vec![address("10.0.0.1"), address("10.0.0.2")])]),
        json!({}),
        json!({}),
    )
}

fn start(kit: &Kit, svc: Vec<Service>, eps: Vec<Endpoints>, slices: Vec<EndpointSlice>) -> Running {
    let ctl = init(
        EndpointSliceMirroringOptions::default(),
        kit.setup(DECLARATION.name, DECLARATION.event_source),
    )
    .unwrap();
    kit.seed(svc);
    kit.seed(eps);
    kit.seed(slices);
    kit.start(ctl)
}

fn slice_writes(kit: &Kit) -> Vec<Call> {
    kit.api
        .writes()
        .into_iter()
        .filter(|c| c.target().plural == "endpointslices")
        .collect()
}

fn count(kit: &Kit, verb: &str) -> usize {
    slice_writes(kit)
        .iter()
        .filter(|c| c.verb() == verb)
        .count()
}

fn stored(kit: &Kit) -> Vec<EndpointSlice> {
    let mut v: Vec<EndpointSlice> = kit.api.objects();
    v.sort_by(|a, b| a.address_type.cmp(&b.address_type));
    v
}

fn cached(kit: &Kit) -> Vec<EndpointSlice> {
    kit.informers
        .testkit_get::<EndpointSlice>()
        .list()
        .iter()
        .map(|s| (**s).clone())
        .collect()
}

/// Lets the watch deliver every slice the tracker holds, and drop the deleted ones.
fn observe_slices(kit: &Kit) {
    for s in cached(kit) {
        kit.observe::<EndpointSlice>("ns", s.metadata.name.as_deref().unwrap_or_default());
    }
    for s in stored(kit) {
        kit.observe::<EndpointSlice>("ns", s.metadata.name.as_deref().unwrap_or_default());
    }
}

fn eps(s: &EndpointSlice) -> usize {
    s.endpoints.as_ref().map_or(0, Vec::len)
}

/// Starts mirroring `simple` and waits for its one slice, then lets the watch catch up.
async fn mirrored(kit: &Kit) -> Running {
    let r = start(kit, vec![service(None)], vec![simple("1")], vec![]);
    assert!(eventually(WAIT, || count(kit, "create") == 1).await);
    observe_slices(kit);
    kit.api.clear_calls();
    r
}

/// MR-1, E12: each switch deletes the mirrored slice; undoing it mirrors again.
#[tokio::test(start_paused = true)]
async fn mr1_each_switch_deletes_and_undoing_restores() {
    type Switch = (&'static str, fn(&Kit), fn(&Kit));
    let switches: [Switch; 5] = [
        (
            "skip-mirror label",
            |k| {
                k.apply(endpoints(
                    "2",
                    json!([http(vec![address("10.0.0.1"), address("10.0.0.2")])]),
                    json!({LABEL_SKIP_MIRROR: "true"}),
                    json!({}),
                ))
            },
            |k| k.apply(simple("3")),
        ),
        (
            "leader annotation",
            |k| {
                k.apply(endpoints(
                    "2",
                    json!([http(vec![address("10.0.0.1"), address("10.0.0.2")])]),
                    json!({}),
                    json!({ANNOTATION_LEADER: "{}"}),
                ))
            },
            |k| k.apply(simple("3")),
        ),
        (
            "Service with a selector",
            |k| {
                let mut s = service(Some(json!({"app": "web"})));
                s.metadata.resource_version = Some("2".into());
                k.apply(s)
            },
            |k| {
                let mut s = service(None);
                s.metadata.resource_version = Some("3".into());
                k.apply(s)
            },
        ),
        (
            "no Service",
            |k| k.remove(service(None)),
            |k| k.apply(service(None)),
        ),
        (
            "Endpoints deleted",
            |k| k.remove(simple("1")),
            |k| k.apply(simple("3")),
        ),
    ];
    for (name, switch, undo) in switches {
        let kit = Kit::new();
        let _r = mirrored(&kit).await;
        let slice = stored(&kit).remove(0);
        switch(&kit);
        assert!(
            eventually(WAIT, || count(&kit, "delete") == 1).await,
            "{name}: {:?}",
            slice_writes(&kit)
        );
        match &slice_writes(&kit)[0] {
            Call::Delete { target, .. } => {
                assert_eq!(Some(&target.name), slice.metadata.name.as_ref(), "{name}")
            }
            other => panic!("{name}: {other:?}"),
        }
        assert!(stored(&kit).is_empty(), "{name}");
        observe_slices(&kit);
        kit.api.clear_calls();
        undo(&kit);
        assert!(
            eventually(WAIT, || count(&kit, "create") == 1).await,
            "{name}: {:?}",
            slice_writes(&kit)
        );
        tokio::time::sleep(Duration::from_secs(2)).await;
        assert_eq!(
            slice_writes(&kit).len(),
            1,
            "{name}: {:?}",
            slice_writes(&kit)
        );
        assert_eq!(eps(&stored(&kit)[0]), 2, "{name}");
    }
}

/// MR-1: a Service that never existed, or has a selector, gets nothing mirrored.
#[tokio::test(start_paused = true)]
async fn mr1_nothing_mirrored_without_a_selectorless_service() {
    for svc in [vec![], vec![service(Some(json!({"app": "web"})))]] {
        let kit = Kit::new();
        let _r = start(&kit, svc, vec![simple("1")], vec![]);
        tokio::time::sleep(Duration::from_secs(2)).await;
        settle().await;
        assert_eq!(slice_writes(&kit), []);
    }
}

/// E11, MR-3..MR-5, MR-7: two subsets (one IPv6), custom label and annotation, last-applied
/// and trigger time, 1,200 addresses and one invalid IP in one subset.
#[tokio::test(start_paused = true)]
async fn e11_mirroring_shape_limits_and_warnings() {
    let kit = Kit::new();
    // "1.2.3.999" sorts before every "10.…" address, so it is met before the maximum.
    let mut big: Vec<Value> = vec![address("1.2.3.999")];
    big.extend((0..1200).map(|i| address(&format!("10.1.{}.{}", i / 250, i % 250 + 1))));
    let ep = endpoints(
        "1",
        json!([
            http(big),
            {"addresses": [{"ip": "fd00::0001", "hostname": "h1", "nodeName": "n1",
                            "targetRef": {"kind": "Pod", "namespace": "ns", "name": "p1", "uid": "u1"}}],
             "notReadyAddresses": [{"ip": "fd00::2"}],
             "ports": [{"name": "https", "port": 443, "protocol": "TCP"}]}
        ]),
        json!({"team": "a"}),
        json!({
            "note": "kept",
            "kubectl.kubernetes.io/last-applied-configuration": "{}",
            "endpoints.kubernetes.io/last-change-trigger-time": "2026-01-01T00:00:00Z"
        }),
    );
    let _r = start(&kit, vec![service(None)], vec![ep], vec![]);
    assert!(eventually(WAIT, || count(&kit, "create") == 2).await);
    let slices = stored(&kit);
    let (v4, v6) = (&slices[0], &slices[1]);
    assert_eq!((v4.address_type.as_str(), eps(v4)), ("IPv4", 1000));
    assert_eq!((v6.address_type.as_str(), eps(v6)), ("IPv6", 2));
    for s in &slices {
        let m = &s.metadata;
        assert_eq!(m.generate_name.as_deref(), Some("web-"));
        assert_eq!(
            m.labels.clone().unwrap(),
            BTreeMap::from([
                ("team".to_string(), "a".to_string()),
                ("kubernetes.io/service-name".to_string(), "web".to_string()),
                (
                    "endpointslice.kubernetes.io/managed-by".to_string(),
                    MANAGED_BY.to_string()
                ),
            ])
        );
        assert_eq!(
            m.annotations.clone().unwrap(),
            BTreeMap::from([("note".to_string(), "kept".to_string())])
        );
        let owner = &m.owner_references.as_ref().unwrap()[0];
        assert_eq!(
            (
                owner.kind.as_str(),
                owner.name.as_str(),
                owner.uid.as_str(),
                owner.controller
            ),
            ("Endpoints", "web", "uid-ep", Some(true))
        );
    }
    let e = v6
        .endpoints
        .iter()
        .flatten()
        .find(|e| e.addresses == ["fd00::1"])
        .expect("canonical IPv6");
    assert_eq!(e.hostname.as_deref(), Some("h1"));
    assert_eq!(e.node_name.as_deref(), Some("n1"));
    assert_eq!(e.target_ref.as_ref().unwrap().uid.as_deref(), Some("u1"));
    let ports: Vec<_> = v6.ports.iter().flatten().map(|p| p.port).collect();
    assert_eq!(ports, [Some(443)]);
    settle().await;
    let events = kit.api.events();
    assert!(
        events.contains(&(
            "Warning".into(),
            "InvalidIPAddress".into(),
            "Skipped 1 invalid IP addresses when mirroring to EndpointSlices".into()
        )),
        "{events:?}"
    );
    assert!(
        events.contains(&(
            "Warning".into(),
            "TooManyAddressesToMirror".into(),
            "A max of 1000 addresses can be mirrored to EndpointSlices per Endpoints subset. 201 addresses were skipped".into()
        )),
        "{events:?}"
    );
    let text = kit.metrics.encode();
    assert!(
        text.contains("endpoint_slice_mirroring_controller_changes{operation=\"create\"} 2"),
        "{text}"
    );
    assert!(
        text.contains("endpoint_slice_mirroring_controller_endpoints_desired 1002"),
        "{text}"
    );
    assert!(
        text.contains("endpoint_slice_mirroring_controller_num_endpoint_slices 2"),
        "{text}"
    );
}

/// MR-3: odd but API-valid input: empty and malformed IPs, duplicates, no ports, no
/// addresses — never a panic, the valid rest mirrored.
#[tokio::test(start_paused = true)]
async fn mr3_odd_input_is_mirrored_without_panic() {
    let kit = Kit::new();
    let ep = endpoints(
        "1",
        json!([
            {"addresses": [{"ip": ""}, {"ip": "10.0.0.1"}, {"ip": "10.0.0.1"}, {"ip": "010.0.0.1"}]},
            {"ports": [{"port": 81}]},
            {"notReadyAddresses": [{"ip": "::ffff:10.0.0.9"}], "ports": [{"port": 82}]}
        ]),
        json!({}),
        json!({}),
    );
    let _r = start(&kit, vec![service(None)], vec![ep], vec![]);
    assert!(eventually(WAIT, || count(&kit, "create") == 2).await);
    let mut sizes: Vec<(usize, usize)> = stored(&kit)
        .iter()
        .map(|s| (s.ports.as_ref().map_or(0, Vec::len), eps(s)))
        .collect();
    sizes.sort_unstable();
    assert_eq!(sizes, [(0, 1), (1, 1)]);
    settle().await;
    assert!(kit.api.events().iter().any(|e| e.1 == "InvalidIPAddress"));
    assert!(
        !kit.api
            .events()
            .iter()
            .any(|e| e.1 == "TooManyAddressesToMirror")
    );
}

/// MR-5: a label change is mirrored by one update; a change of the annotations never mirrored
/// (last-applied, trigger time) writes nothing.
#[tokio::test(start_paused = true)]
async fn mr5_label_change_updates_and_unmirrored_annotations_do_not() {
    let kit = Kit::new();
    let _r = mirrored(&kit).await;
    kit.apply(endpoints(
        "2",
        json!([http(vec![address("10.0.0.1"), address("10.0.0.2")])]),
        json!({}),
        json!({
            "kubectl.kubernetes.io/last-applied-configuration": "{\"x\":1}",
            "endpoints.kubernetes.io/last-change-trigger-time": "2026-01-01T00:00:09Z"
        }),
    ));
    tokio::time::sleep(Duration::from_secs(2)).await;
    settle().await;
    assert_eq!(slice_writes(&kit), []);
    kit.apply(endpoints(
        "3",
        json!([http(vec![address("10.0.0.1"), address("10.0.0.2")])]),
        json!({"team": "b"}),
        json!({}),
    ));
    assert!(eventually(WAIT, || count(&kit, "update") == 1).await);
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(slice_writes(&kit).len(), 1);
    assert_eq!(
        stored(&kit)[0].metadata.labels.as_ref().unwrap()["team"],
        "b"
    );
}

/// MR-6, ES-16: a restart over up-to-date slices writes nothing.
#[tokio::test(start_paused = true)]
async fn mr6_nothing_changed_no_write() {
    let kit = Kit::new();
    let r = mirrored(&kit).await;
    let slices = stored(&kit);
    r.stop().await;
    let kit2 = Kit::new();
    let _r = start(&kit2, vec![service(None)], vec![simple("1")], slices);
    tokio::time::sleep(Duration::from_secs(5)).await;
    settle().await;
    assert_eq!(slice_writes(&kit2), []);
}

/// MR-6: a new port set drops the old key and creates the new one: written as one update of
/// the old slice, carrying its resourceVersion (SB-13).
#[tokio::test(start_paused = true)]
async fn mr6_same_type_create_and_delete_is_one_update() {
    let kit = Kit::new();
    let _r = mirrored(&kit).await;
    let old = stored(&kit).remove(0);
    kit.apply(endpoints(
        "2",
        json!([{"addresses": [{"ip": "10.0.0.1"}, {"ip": "10.0.0.2"}],
                "ports": [{"name": "http", "port": 8080, "protocol": "TCP"}]}]),
        json!({}),
        json!({}),
    ));
    assert!(eventually(WAIT, || count(&kit, "update") == 1).await);
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!((count(&kit, "create"), count(&kit, "delete")), (0, 0));
    match &slice_writes(&kit)[0] {
        Call::Replace(t, body) => {
            assert_eq!(Some(&t.name), old.metadata.name.as_ref());
            assert_eq!(
                body["metadata"]["resourceVersion"].as_str(),
                old.metadata.resource_version.as_deref()
            );
            assert_eq!(body["ports"][0]["port"], 8080);
        }
        other => panic!("{other:?}"),
    }
}

/// MR-7, E8: a slice cache behind our own create: no write, the stale skip counted; once the
/// watch catches up the change goes through as one update.
#[tokio::test(start_paused = true)]
async fn mr7_stale_cache_no_write() {
    let kit = Kit::new();
    let _r = start(&kit, vec![service(None)], vec![simple("1")], vec![]);
    assert!(eventually(WAIT, || count(&kit, "create") == 1).await);
    kit.api.clear_calls();
    // The create has not reached the cache: a sync now would create a duplicate.
    kit.apply(endpoints(
        "2",
        json!([http(vec![
            address("10.0.0.1"),
            address("10.0.0.2"),
            address("10.0.0.3")
        ])]),
        json!({}),
        json!({}),
    ));
    // The sync answers `Next::Stale`: the runtime counts it and looks again, without backoff.
    assert!(
        eventually(WAIT, || kit.metrics.encode().contains(
            "pilothouse_stale_cache_skips_total{controller=\"endpointslice-mirroring-controller\",resource=\"endpointslices\"}"
        ) && kit.metrics.encode().contains(
            "pilothouse_reconcile_total{controller=\"endpointslice-mirroring-controller\",queue=\"endpoint_slice_mirroring\",result=\"stale\"}"
        ))
        .await,
        "{}",
        kit.metrics.encode()
    );
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(slice_writes(&kit), []);
    observe_slices(&kit);
    assert!(eventually(Duration::from_secs(120), || count(&kit, "update") == 1).await);
    assert_eq!(count(&kit, "create"), 0);
    assert_eq!(eps(&stored(&kit)[0]), 3);
}

/// MR-7: a mirrored slice deleted by someone else comes back; our own deletes do not trigger.
#[tokio::test(start_paused = true)]
async fn mr7_foreign_delete_recreates() {
    let kit = Kit::new();
    let _r = mirrored(&kit).await;
    let slice = stored(&kit).remove(0);
    kit.api.clear_calls();
    kit.remove(slice);
    assert!(
        eventually(WAIT, || count(&kit, "create") == 1).await,
        "{:?}",
        slice_writes(&kit)
    );
}

/// MR-6: a failed write fails the sync, which is retried until it goes through.
#[tokio::test(start_paused = true)]
async fn mr6_failed_create_is_retried() {
    let kit = Kit::new();
    kit.api
        .fail("create", "endpointslices", 2, 500, "InternalError");
    let _r = start(&kit, vec![service(None)], vec![simple("1")], vec![]);
    assert!(eventually(Duration::from_secs(30), || stored(&kit).len() == 1).await);
    assert_eq!(count(&kit, "create"), 3);
}
