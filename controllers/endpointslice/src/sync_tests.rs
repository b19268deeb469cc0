//! Sync tests: the whole controller (its real `init`, handlers, queues and syncs) against the
//! test kit's caches and recording writer, on tokio's paused clock. Writes reach the caches only
//! when a test lets the watch catch up (`Kit::observe`).

use crate::endpoints::ANNOTATION_TRIGGER_TIME;
use crate::{DECLARATION, EndpointSliceOptions, init};
use k8s_openapi::api::core::v1::{Node, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use serde_json::{Value, json};
use shared::api::writer::Call;
use shared::cache::pod::Pod;
use shared::testkit::{Kit, Running, eventually, settle};
use std::time::Duration;

fn options(max: u32) -> EndpointSliceOptions {
    EndpointSliceOptions {
        concurrent_service_endpoint_syncs: 5,
        max_endpoints_per_slice: max,
        endpointslice_updates_batch_period: crate::batching::BatchPeriod::Fixed(Duration::ZERO),
        endpointslice_delete_on_selector_removal: false,
    }
}

fn service(extra: Value) -> Service {
    let mut v = json!({
        "apiVersion": "v1", "kind": "Service",
        "metadata": {"name": "web", "namespace": "ns", "uid": "uid-svc", "resourceVersion": "1",
                     "creationTimestamp": "2026-01-01T00:00:00Z", "labels": {"a": "b"}},
        "spec": {
            "selector": {"app": "web"},
            "clusterIP": "10.0.0.10", "ipFamilies": ["IPv4"],
            "ports": [
                {"name": "plain", "port": 80, "targetPort": 8080, "protocol": "TCP"},
                {"name": "named", "port": 81, "targetPort": "http", "protocol": "TCP"}
            ]
        }
    });
    merge(&mut v, extra);
    serde_json::from_value(v).unwrap()
}

fn merge(base: &mut Value, extra: Value) {
    match (base, extra) {
        (Value::Object(b), Value::Object(e)) => {
            for (k, v) in e {
                merge(b.entry(k).or_insert(Value::Null), v);
            }
        }
        (b, e) => *b = e,
    }
}

fn node(name: &str, zone: &str) -> Node {
    serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Node",
        "metadata": {"name": name, "resourceVersion": "1", "labels": {"topology.kubernetes.io/zone": zone}},
        "status": {"conditions": [{"type": "Ready", "status": "True"}], "allocatable": {"cpu": "4"}}
    }))
    .unwrap()
}

fn pod(i: usize, ready: bool) -> Pod {
    let full: k8s_openapi::api::core::v1::Pod = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": format!("web-{i}"), "namespace": "ns", "uid": format!("uid-pod-{i}"),
                     "resourceVersion": "1", "labels": {"app": "web"}},
        "spec": {"nodeName": format!("node-{}", i % 3),
                 "containers": [{"name": "c", "ports": [{"name": "http", "containerPort": 9000, "protocol": "TCP"}]}]},
        "status": {"phase": "Running",
                   "podIP": ip(i), "podIPs": [{"ip": ip(i)}],
                   "conditions": [{"type": "Ready", "status": if ready { "True" } else { "False" },
                                   "lastTransitionTime": "2026-01-01T00:00:05Z"}]}
    }))
    .unwrap();
    full.into()
}

fn ip(i: usize) -> String {
    format!("10.1.{}.{}", i / 250, i % 250 + 1)
}

fn nodes() -> Vec<Node> {
    vec![
        node("node-0", "a"),
        node("node-1", "b"),
        node("node-2", "c"),
    ]
}

fn start(kit: &Kit, opts: EndpointSliceOptions, services: Vec<Service>, pods: Vec<Pod>) -> Running {
    start_with(kit, opts, services, pods, Vec::new())
}

fn start_with(
    kit: &Kit,
    opts: EndpointSliceOptions,
    services: Vec<Service>,
    pods: Vec<Pod>,
    slices: Vec<EndpointSlice>,
) -> Running {
    let ctl = init(opts, kit.setup(DECLARATION.name, DECLARATION.event_source)).unwrap();
    kit.seed(nodes());
    kit.seed(services);
    kit.seed(pods);
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

/// Lets the watch deliver every slice the tracker holds (and drop the deleted ones).
fn observe_slices(kit: &Kit) {
    let stored: Vec<EndpointSlice> = kit.api.objects();
    let cached = kit.informers_slices();
    for s in &cached {
        let name = s.metadata.name.clone().unwrap_or_default();
        if !stored
            .iter()
            .any(|x| x.metadata.name.as_deref() == Some(&name))
        {
            kit.observe::<EndpointSlice>("ns", &name);
        }
    }
    for s in stored {
        kit.observe::<EndpointSlice>("ns", s.metadata.name.as_deref().unwrap_or_default());
    }
}

trait SliceCache {
    fn informers_slices(&self) -> Vec<EndpointSlice>;
}

impl SliceCache for Kit {
    fn informers_slices(&self) -> Vec<EndpointSlice> {
        self.informers
            .testkit_get::<EndpointSlice>()
            .list()
            .iter()
            .map(|s| (**s).clone())
            .collect()
    }
}

fn stored(kit: &Kit) -> Vec<EndpointSlice> {
    let mut v: Vec<EndpointSlice> = kit.api.objects();
    v.sort_by_key(|s| s.metadata.name.clone());
    v
}

fn eps(s: &EndpointSlice) -> &[k8s_openapi::api::discovery::v1::Endpoint] {
    crate::plan::endpoints_of(s)
}

fn sizes(kit: &Kit) -> Vec<usize> {
    let mut v: Vec<usize> = stored(kit).iter().map(|s| eps(s).len()).collect();
    v.sort_unstable();
    v
}

/// ES-6, ES-7, ES-10, ES-12, ES-17: one slice with upstream's shape.
#[tokio::test(start_paused = true)]
async fn es6_one_slice_with_upstreams_shape() {
    let kit = Kit::new();
    let _r = start(
        &kit,
        options(100),
        vec![service(
            json!({"metadata": {"labels": {"kubernetes.io/service-name": "spoof"}}}),
        )],
        (0..3).map(|i| pod(i, true)).collect(),
    );
    assert!(eventually(Duration::from_secs(2), || count(&kit, "create") == 1).await);
    let s = &stored(&kit)[0];
    let meta = &s.metadata;
    assert_eq!(meta.generate_name.as_deref(), Some("web-"));
    let labels = meta.labels.clone().unwrap();
    assert_eq!(labels["a"], "b");
    assert_eq!(
        labels["kubernetes.io/service-name"], "web",
        "reserved key ignored"
    );
    assert_eq!(
        labels["endpointslice.kubernetes.io/managed-by"],
        "endpointslice-controller.k8s.io"
    );
    assert!(!labels.contains_key("service.kubernetes.io/headless"));
    let owner = &meta.owner_references.as_ref().unwrap()[0];
    assert_eq!(
        (
            owner.kind.as_str(),
            owner.uid.as_str(),
            owner.controller,
            owner.block_owner_deletion
        ),
        ("Service", "uid-svc", Some(true), Some(true))
    );
    assert_eq!(
        meta.annotations.as_ref().unwrap()[ANNOTATION_TRIGGER_TIME],
        "2026-01-01T00:00:00Z",
        "first sync: the Service's creation"
    );
    assert_eq!(s.address_type, "IPv4");
    let mut ports: Vec<(String, i32)> = s
        .ports
        .iter()
        .flatten()
        .map(|p| (p.name.clone().unwrap(), p.port.unwrap()))
        .collect();
    ports.sort();
    assert_eq!(
        ports,
        [("named".to_string(), 9000), ("plain".to_string(), 8080)]
    );
    assert_eq!(eps(s).len(), 3);
    let ep = eps(s)
        .iter()
        .find(|e| e.target_ref.as_ref().unwrap().name.as_deref() == Some("web-1"))
        .unwrap();
    assert_eq!(ep.addresses, [ip(1)]);
    assert_eq!(ep.node_name.as_deref(), Some("node-1"));
    assert_eq!(ep.zone.as_deref(), Some("b"));
    let c = ep.conditions.clone().unwrap();
    assert_eq!(
        (c.ready, c.serving, c.terminating),
        (Some(true), Some(true), Some(false))
    );
    assert_eq!(ep.hints, None);
}

/// ES-14 step 8, ES-16: a selector matching nothing gets one placeholder; a restart with
/// nothing changed writes nothing.
#[tokio::test(start_paused = true)]
async fn es14_placeholder_then_restart_writes_nothing() {
    let kit = Kit::new();
    let r = start(&kit, options(100), vec![service(json!({}))], vec![]);
    assert!(eventually(Duration::from_secs(2), || count(&kit, "create") == 1).await);
    let placeholder = stored(&kit).remove(0);
    assert!(eps(&placeholder).is_empty());
    assert_eq!(placeholder.endpoints, Some(vec![]));
    assert_eq!(placeholder.ports, Some(vec![]));
    r.stop().await;
    let kit2 = Kit::new();
    let _r = start_with(
        &kit2,
        options(100),
        vec![service(json!({}))],
        vec![],
        vec![placeholder],
    );
    tokio::time::sleep(Duration::from_secs(5)).await;
    settle().await;
    assert_eq!(slice_writes(&kit2), []);
}

/// ES-16: one readiness flip is exactly one slice update.
#[tokio::test(start_paused = true)]
async fn es16_one_flip_one_update() {
    let kit = Kit::new();
    let _r = start(
        &kit,
        options(100),
        vec![service(json!({}))],
        (0..5).map(|i| pod(i, true)).collect(),
    );
    assert!(eventually(Duration::from_secs(2), || count(&kit, "create") == 1).await);
    observe_slices(&kit);
    kit.api.clear_calls();
    let mut flipped = pod(2, false);
    flipped.metadata.resource_version = Some("2".into());
    kit.apply(flipped);
    assert!(eventually(Duration::from_secs(2), || count(&kit, "update") == 1).await);
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert_eq!(slice_writes(&kit).len(), 1, "{:?}", slice_writes(&kit));
    let ep = eps(&stored(&kit)[0])
        .iter()
        .find(|e| e.target_ref.as_ref().unwrap().name.as_deref() == Some("web-2"))
        .cloned()
        .unwrap();
    assert_eq!(ep.conditions.unwrap().ready, Some(false));
}

/// E5 / ES-8 / ES-14: 250 pods at max 100 → 100/100/50; one pod gone → one update; 30 more →
/// the partial slice is filled first; scale to 0 → one placeholder, written as an update of a
/// doomed slice plus deletes.
#[tokio::test(start_paused = true)]
async fn e5_churn_costs_upstreams_writes() {
    let kit = Kit::new();
    let _r = start(
        &kit,
        options(100),
        vec![service(json!({}))],
        (0..250).map(|i| pod(i, true)).collect(),
    );
    assert!(eventually(Duration::from_secs(2), || count(&kit, "create") == 3).await);
    assert_eq!(sizes(&kit), [50, 100, 100]);
    observe_slices(&kit);
    kit.api.clear_calls();
    kit.remove(pod(7, true));
    assert!(eventually(Duration::from_secs(2), || count(&kit, "update") == 1).await);
    settle().await;
    assert_eq!((count(&kit, "create"), count(&kit, "delete")), (0, 0));
    let after = sizes(&kit);
    assert!(
        after == [49, 100, 100] || after == [50, 99, 100],
        "{after:?}"
    );
    observe_slices(&kit);
    kit.api.clear_calls();
    for i in 250..280 {
        kit.apply(pod(i, true));
    }
    // The 30 fit only in the least-full slice (getSliceToFill): one update, no create.
    let want = [after[0] + 30, after[1], after[2]];
    assert!(
        eventually(Duration::from_secs(2), || sizes(&kit) == want).await,
        "{:?}",
        sizes(&kit)
    );
    assert_eq!((count(&kit, "create"), count(&kit, "update")), (0, 1));
    observe_slices(&kit);
    kit.api.clear_calls();
    let live: Vec<usize> = (0..280).filter(|i| *i != 7).collect();
    for i in live {
        kit.remove(pod(i, true));
    }
    assert!(eventually(Duration::from_secs(2), || stored(&kit).len() == 1).await);
    let left = stored(&kit).remove(0);
    assert!(eps(&left).is_empty() && left.ports == Some(vec![]));
    assert_eq!(
        (
            count(&kit, "create"),
            count(&kit, "update"),
            count(&kit, "delete")
        ),
        (0, 1, 2)
    );
}

/// ES-15: a sync whose slice cache has not caught up with its own create writes nothing and
/// counts a stale sync.
#[tokio::test(start_paused = true)]
async fn es15_no_write_from_a_stale_cache() {
    let kit = Kit::new();
    let _r = start(
        &kit,
        options(100),
        vec![service(json!({}))],
        (0..2).map(|i| pod(i, true)).collect(),
    );
    assert!(eventually(Duration::from_secs(2), || count(&kit, "create") == 1).await);
    // A pod changes before the created slice reached the cache.
    let mut p = pod(0, false);
    p.metadata.resource_version = Some("2".into());
    kit.apply(p);
    tokio::time::sleep(Duration::from_secs(3)).await;
    settle().await;
    assert_eq!(slice_writes(&kit).len(), 1, "{:?}", slice_writes(&kit));
    assert!(
        kit.metrics
            .encode()
            .contains("endpoint_slice_controller_syncs{result=\"stale\"}")
    );
    // Held back long enough for the key's backoff to grow past 16 s: the watch catching up
    // syncs it again within the slice delay, not at its next backoff.
    tokio::time::sleep(Duration::from_secs(40)).await;
    assert_eq!(slice_writes(&kit).len(), 1);
    observe_slices(&kit);
    assert!(eventually(Duration::from_secs(2), || count(&kit, "update") == 1).await);
}

/// ES-14 step 2, E7: slices of an older Service with the same name are deleted, never updated.
#[tokio::test(start_paused = true)]
async fn es14_slices_of_a_recreated_service_are_replaced() {
    let kit = Kit::new();
    let r = start(
        &kit,
        options(100),
        vec![service(json!({}))],
        vec![pod(0, true)],
    );
    assert!(eventually(Duration::from_secs(2), || count(&kit, "create") == 1).await);
    let old = stored(&kit).remove(0);
    r.stop().await;
    let kit2 = Kit::new();
    let _r = start_with(
        &kit2,
        options(100),
        vec![service(json!({"metadata": {"uid": "uid-svc-2"}}))],
        vec![pod(0, true)],
        vec![old.clone()],
    );
    assert!(eventually(Duration::from_secs(2), || count(&kit2, "delete") == 1).await);
    assert_eq!(
        (count(&kit2, "create"), count(&kit2, "update")),
        (1, 0),
        "{:#?}",
        slice_writes(&kit2)
    );
    let new = stored(&kit2).remove(0);
    assert_eq!(new.metadata.owner_references.unwrap()[0].uid, "uid-svc-2");
}

/// SB-13: a doomed slice reused for a create is replaced under its cached resourceVersion.
#[tokio::test(start_paused = true)]
async fn b13_recycled_slice_carries_its_resource_version() {
    let kit = Kit::new();
    let _r = start(
        &kit,
        options(100),
        vec![service(json!({}))],
        vec![pod(0, true)],
    );
    assert!(eventually(Duration::from_secs(2), || count(&kit, "create") == 1).await);
    observe_slices(&kit);
    let rv = stored(&kit)[0].metadata.resource_version.clone();
    kit.api.clear_calls();
    // The only pod moves to another port set: its slice is doomed and the new one absorbed.
    let mut moved: Pod = pod(0, true);
    moved.metadata.resource_version = Some("2".into());
    moved
        .metadata
        .labels
        .as_mut()
        .unwrap()
        .insert("x".into(), "y".into());
    kit.apply(service_with_other_ports());
    assert!(eventually(Duration::from_secs(2), || count(&kit, "update") == 1).await);
    let update = slice_writes(&kit).remove(0);
    let Call::Replace(_, body) = update else {
        panic!("{update:?}")
    };
    assert_eq!(body["metadata"]["resourceVersion"].as_str(), rv.as_deref());
    assert_eq!(body["ports"][0]["port"], 7000);
}

fn service_with_other_ports() -> Service {
    let mut s = service(json!({}));
    s.metadata.resource_version = Some("2".into());
    s.spec.as_mut().unwrap().ports = Some(vec![
        serde_json::from_value(
            json!({"name": "other", "port": 70, "targetPort": 7000, "protocol": "TCP"}),
        )
        .unwrap(),
    ]);
    s
}

/// SB-12: a label added to a managed slice by someone else is removed, although the slice's
/// generation did not move.
#[tokio::test(start_paused = true)]
async fn b12_label_drift_is_reverted() {
    let kit = Kit::new();
    let _r = start(
        &kit,
        options(100),
        vec![service(json!({}))],
        vec![pod(0, true)],
    );
    assert!(eventually(Duration::from_secs(2), || count(&kit, "create") == 1).await);
    observe_slices(&kit);
    kit.api.clear_calls();
    let mut edited = stored(&kit).remove(0);
    edited
        .metadata
        .labels
        .as_mut()
        .unwrap()
        .insert("foreign".into(), "x".into());
    edited.metadata.resource_version = Some("9999".into());
    kit.api.insert(&edited);
    kit.apply(edited);
    assert!(eventually(Duration::from_secs(3), || count(&kit, "update") == 1).await);
    assert!(
        !stored(&kit)[0]
            .metadata
            .labels
            .clone()
            .unwrap()
            .contains_key("foreign")
    );
}

/// SB-10: a Service losing its selector keeps its slices, with a Warning and the gauge.
#[tokio::test(start_paused = true)]
async fn b10_selector_removal_keeps_slices_and_warns() {
    let kit = Kit::new();
    let _r = start(
        &kit,
        options(100),
        vec![service(json!({}))],
        vec![pod(0, true)],
    );
    assert!(eventually(Duration::from_secs(2), || count(&kit, "create") == 1).await);
    observe_slices(&kit);
    kit.api.clear_calls();
    let mut s = service(json!({}));
    s.metadata.resource_version = Some("2".into());
    s.spec.as_mut().unwrap().selector = None;
    kit.apply(s);
    assert!(
        eventually(Duration::from_secs(2), || kit.api.events().iter().any(
            |(t, r, _)| t == "Warning" && r == "StaleEndpointSlicesRetained"
        ))
        .await
    );
    assert_eq!(slice_writes(&kit), []);
    assert!(
        kit.metrics.encode().contains(
            "pilothouse_endpointslice_retained_slices{namespace=\"ns\",service=\"web\"} 1"
        )
    );
}

/// SB-10 with `--endpointslice-delete-on-selector-removal`: the slices are deleted.
#[tokio::test(start_paused = true)]
async fn b10_flag_deletes_slices_of_a_selectorless_service() {
    let kit = Kit::new();
    let mut opts = options(100);
    opts.endpointslice_delete_on_selector_removal = true;
    let _r = start(&kit, opts, vec![service(json!({}))], vec![pod(0, true)]);
    assert!(eventually(Duration::from_secs(2), || count(&kit, "create") == 1).await);
    observe_slices(&kit);
    let mut s = service(json!({}));
    s.metadata.resource_version = Some("2".into());
    s.spec.as_mut().unwrap().selector = Some(Default::default());
    kit.apply(s);
    assert!(eventually(Duration::from_secs(2), || stored(&kit).is_empty()).await);
}

/// ES-9, E6: a dual-stack Service gets a slice per family with canonical addresses; dropping a
/// family deletes its slices.
#[tokio::test(start_paused = true)]
async fn es9_dual_stack_slices_per_family() {
    let kit = Kit::new();
    let mut p = pod(0, true);
    p.status.as_mut().unwrap().pod_ips = Some(vec![
        serde_json::from_value(json!({"ip": "010.001.000.001"})).unwrap(),
        serde_json::from_value(json!({"ip": "FD00:0::0001"})).unwrap(),
    ]);
    let svc = service(json!({"spec": {"ipFamilies": ["IPv4", "IPv6"]}}));
    let _r = start(&kit, options(100), vec![svc], vec![p]);
    assert!(eventually(Duration::from_secs(2), || count(&kit, "create") == 2).await);
    let mut got: Vec<(String, Vec<String>)> = stored(&kit)
        .into_iter()
        .map(|s| (s.address_type.clone(), eps(&s)[0].addresses.clone()))
        .collect();
    got.sort();
    assert_eq!(
        got,
        [
            ("IPv4".to_string(), vec!["10.1.0.1".to_string()]),
            ("IPv6".to_string(), vec!["fd00::1".to_string()])
        ]
    );
    observe_slices(&kit);
    kit.api.clear_calls();
    let mut single = service(json!({}));
    single.metadata.resource_version = Some("2".into());
    kit.apply(single);
    assert!(eventually(Duration::from_secs(2), || count(&kit, "delete") == 1).await);
    assert_eq!(stored(&kit).len(), 1);
    assert_eq!(stored(&kit)[0].address_type, "IPv4");
}

/// ES-10, E3: pods group by resolved port set; a named port resolves on a sidecar; a pod
/// without the named port gets a slice of its own port set.
#[tokio::test(start_paused = true)]
async fn es10_port_sets_and_sidecar_ports() {
    let kit = Kit::new();
    let mut sidecar = pod(1, true);
    let spec = sidecar.spec.as_mut().unwrap();
    spec.init_containers = spec.containers.pop().map(|mut c| {
        c.restart_policy = Some("Always".into());
        vec![c]
    });
    spec.containers = vec![shared::cache::pod::Container {
        name: "main".into(),
        ..Default::default()
    }];
    let mut none = pod(2, true);
    none.spec.as_mut().unwrap().containers[0].ports = None;
    let _r = start(
        &kit,
        options(100),
        vec![service(json!({}))],
        vec![pod(0, true), sidecar, none],
    );
    assert!(eventually(Duration::from_secs(2), || count(&kit, "create") == 2).await);
    let mut by_ports: Vec<(usize, usize)> = stored(&kit)
        .iter()
        .map(|s| (s.ports.as_ref().map_or(0, Vec::len), eps(s).len()))
        .collect();
    by_ports.sort_unstable();
    assert_eq!(by_ports, [(1, 1), (2, 2)]);
}

/// ES-11: a pod whose node is not cached is skipped, the rest written, and the sync fails with
/// upstream's event so it is retried.
#[tokio::test(start_paused = true)]
async fn es11_pod_on_unknown_node_is_skipped_and_retried() {
    let kit = Kit::new();
    let mut lost = pod(3, true);
    lost.spec.as_mut().unwrap().node_name = Some("node-x".into());
    let _r = start(
        &kit,
        options(100),
        vec![service(json!({}))],
        vec![pod(0, true), lost],
    );
    assert!(eventually(Duration::from_secs(2), || count(&kit, "create") == 1).await);
    assert_eq!(eps(&stored(&kit)[0]).len(), 1);
    assert!(
        eventually(Duration::from_secs(2), || kit.api.events().iter().any(|(t, r, m)| t
            == "Warning"
            && r == "FailedToUpdateEndpointSlices"
            && m == "Error updating Endpoint Slices for Service ns/web: skipping Pod web-3 for Service ns/web: Node node-x Not Found"))
        .await,
        "{:?}",
        kit.api.events()
    );
    observe_slices(&kit);
    kit.apply(node("node-x", "a"));
    assert!(eventually(Duration::from_secs(5), || eps(&stored(&kit)[0]).len() == 2).await);
}

/// ES-1: ExternalName and selectorless Services get no slices.
#[tokio::test(start_paused = true)]
async fn es1_no_slices_without_selector_or_for_external_name() {
    let kit = Kit::new();
    let mut external = service(
        json!({"metadata": {"name": "ext", "uid": "uid-ext"}, "spec": {"type": "ExternalName", "externalName": "x.example"}}),
    );
    external.spec.as_mut().unwrap().cluster_ip = None;
    let mut bare = service(json!({"metadata": {"name": "bare", "uid": "uid-bare"}}));
    bare.spec.as_mut().unwrap().selector = None;
    let _r = start(&kit, options(100), vec![external, bare], vec![pod(0, true)]);
    tokio::time::sleep(Duration::from_secs(3)).await;
    settle().await;
    assert_eq!(slice_writes(&kit), []);
}

/// The adaptive batch period: an isolated flip is written at once; a burst of 50 flips within
/// 200 ms costs the leading write and one coalesced write at the window's end.
#[tokio::test(start_paused = true)]
async fn adaptive_batching_isolated_at_once_burst_coalesced() {
    let kit = Kit::new();
    let mut opts = options(100);
    opts.endpointslice_updates_batch_period = crate::batching::BatchPeriod::Adaptive;
    let _r = start(
        &kit,
        opts,
        vec![service(json!({}))],
        (0..60).map(|i| pod(i, true)).collect(),
    );
    assert!(eventually(Duration::from_secs(2), || count(&kit, "create") == 1).await);
    observe_slices(&kit);
    kit.api.clear_calls();
    tokio::time::sleep(Duration::from_secs(5)).await;
    let flip = |i: usize, rv: &str| {
        let mut p = pod(i, false);
        p.metadata.resource_version = Some(rv.into());
        p
    };
    let t0 = tokio::time::Instant::now();
    kit.apply(flip(0, "2"));
    assert!(eventually(Duration::from_secs(2), || count(&kit, "update") == 1).await);
    assert!(
        t0.elapsed() < Duration::from_millis(20),
        "isolated change delayed {:?}",
        t0.elapsed()
    );
    observe_slices(&kit);
    kit.api.clear_calls();
    tokio::time::sleep(Duration::from_secs(5)).await;
    for i in 1..51 {
        kit.apply(flip(i, "2"));
        tokio::time::sleep(Duration::from_millis(4)).await;
        observe_slices(&kit);
    }
    tokio::time::sleep(Duration::from_secs(3)).await;
    observe_slices(&kit);
    settle().await;
    assert!(
        count(&kit, "update") <= 2,
        "{} updates for one burst",
        count(&kit, "update")
    );
    let ready = eps(&stored(&kit)[0])
        .iter()
        .filter(|e| e.conditions.as_ref().and_then(|c| c.ready) == Some(true))
        .count();
    assert_eq!(ready, 9, "every flip written");
}

/// Inputs at their extremes (odd IPs, a huge port list, extreme port numbers, long names) are
/// written or skipped without a panic, and a bad Service never stalls a good one.
#[tokio::test(start_paused = true)]
async fn extremes_never_panic_or_stall_others() {
    let kit = Kit::new();
    let mut odd = service(
        json!({"metadata": {"name": "odd", "uid": "uid-odd"}, "spec": {"selector": {"app": "odd"}}}),
    );
    let ports: Vec<Value> = (0..300)
        .map(|i| json!({"name": format!("p{i}"), "port": i + 1, "targetPort": if i % 2 == 0 { json!(i32::MAX) } else { json!(format!("n{i}")) }, "protocol": if i % 3 == 0 { "UDP" } else { "TCP" }}))
        .collect();
    odd.spec.as_mut().unwrap().ports = Some(serde_json::from_value(json!(ports)).unwrap());
    let mut weird = pod(9, true);
    weird.metadata.labels = Some([("app".to_string(), "odd".to_string())].into());
    weird.metadata.name = Some("x".repeat(253));
    let spec = weird.spec.as_mut().unwrap();
    spec.hostname = Some("h".repeat(63));
    spec.subdomain = Some("odd".into());
    weird.status.as_mut().unwrap().pod_ips = Some(
        [
            "",
            "garbage",
            "::",
            "0.0.0.0",
            "255.255.255.255",
            "1.2.3.4.5",
            "fe80::1%eth0",
        ]
        .iter()
        .map(|ip| serde_json::from_value(json!({"ip": ip})).unwrap())
        .collect(),
    );
    let _r = start(
        &kit,
        options(1),
        vec![odd, service(json!({}))],
        vec![weird, pod(0, true), pod(1, true)],
    );
    // The good Service gets its two slices of one endpoint (max 1).
    assert!(
        eventually(Duration::from_secs(5), || stored(&kit)
            .iter()
            .filter(|s| s.metadata.labels.as_ref().unwrap()["kubernetes.io/service-name"] == "web")
            .count()
            == 2)
        .await
    );
    assert!(
        eventually(Duration::from_secs(5), || stored(&kit).iter().any(|s| s
            .metadata
            .labels
            .as_ref()
            .unwrap()["kubernetes.io/service-name"]
            == "odd"))
        .await
    );
    assert_eq!(kit.panics(), 0.0, "{}", kit.metrics.encode());
}

/// The value of one series in the kit's metrics text (0 when absent).
fn series_value(kit: &Kit, series: &str) -> f64 {
    kit.metrics
        .encode()
        .lines()
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
        .unwrap_or(0.0)
}

/// SB-11, ES-3: a Service whose sync keeps failing (every slice create answered 500) is never
/// dropped. Through the real reconcile, the runtime's workers and the queue as `init` declares
/// it, each of 22 consecutive failing syncs is followed by another attempt, the per-item
/// backoff doubling from 1 s (1, 2, …, 512 s) and then staying at the 1000 s cap; once the API
/// accepts the write, the slice is created. kube-controller-manager stops after 15 retries
/// (maxRetries) and forgets the Service until its next event: here the 16th and later retries
/// must happen.
#[tokio::test(start_paused = true)]
async fn b11_a_failing_service_is_retried_forever_at_the_cap() {
    use std::sync::{Arc, Mutex};
    use tokio::time::Instant;
    const FAILURES: usize = 22;
    const CAP: Duration = Duration::from_secs(1000);
    let kit = Kit::new();
    let attempts: Arc<Mutex<Vec<Instant>>> = Arc::default();
    let seen = Arc::clone(&attempts);
    kit.api.fail_when(move |c| {
        if c.verb() != "create" || c.target().plural != "endpointslices" {
            return None;
        }
        let mut seen = seen.lock().unwrap();
        seen.push(Instant::now());
        (seen.len() <= FAILURES)
            .then(|| shared::testkit::api_error(500, "InternalError", "injected 500 InternalError"))
    });
    let _r = start(
        &kit,
        options(100),
        vec![service(json!({}))],
        vec![pod(0, true)],
    );
    let n = || attempts.lock().unwrap().len();
    // 1 + 2 + … + 512 s, then 1000 s per failure: about 13,000 s of (paused) time.
    let limit = Instant::now() + Duration::from_secs(20_000);
    while (n() <= FAILURES || count(&kit, "create") < FAILURES + 1) && Instant::now() < limit {
        tokio::time::sleep(Duration::from_secs(1)).await;
        settle().await;
    }
    let at = attempts.lock().unwrap().clone();
    assert_eq!(
        at.len(),
        FAILURES + 1,
        "the Service was not retried after {} failures",
        at.len()
    );
    let gaps: Vec<Duration> = at.windows(2).map(|w| w[1] - w[0]).collect();
    for (i, gap) in gaps.iter().enumerate() {
        let want = Duration::from_secs(1u64 << i.min(20)).min(CAP);
        assert!(
            *gap >= want && *gap < want + Duration::from_millis(50),
            "retry {}: waited {gap:?}, want {want:?}; all: {gaps:?}",
            i + 1
        );
    }
    // Retries 11 to 22 all wait the cap: the backoff neither grows past it nor resets.
    assert_eq!(
        gaps.iter().filter(|g| g.as_secs() == CAP.as_secs()).count(),
        FAILURES - 10
    );
    // Every failure was a failed sync re-queued with backoff; then the write went through.
    assert_eq!(
        series_value(&kit, "endpoint_slice_controller_syncs{result=\"error\"}"),
        FAILURES as f64
    );
    assert_eq!(
        series_value(&kit, "workqueue_retries_total{name=\"endpoint_slice\"}"),
        FAILURES as f64
    );
    assert_eq!(stored(&kit).len(), 1);
    assert_eq!(eps(&stored(&kit)[0]).len(), 1);
    assert!(
        kit.api
            .events()
            .iter()
            .any(|(t, r, _)| t == "Warning" && r == "FailedToUpdateEndpointSlices"),
        "{:?}",
        kit.api.events()
    );
}
