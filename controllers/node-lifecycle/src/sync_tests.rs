//! Sync tests: the whole controller (its real `init`, handlers, queues, timers, full pass and
//! tainter) against the test kit's caches and recording writer, on tokio's paused clock (the
//! kit's wall clock follows it, so grace periods elapse in virtual time).
//!
//! A small simulated cluster runs beside the controller: a watch that delivers the tracker's
//! nodes to the cache 10 ms after they change (pausable, to model a lagging watch), and kubelets
//! that renew the Leases of the nodes still alive every 10 s.

use crate::{DECLARATION, NODE_LEASE_NAMESPACE, NodeLifecycleOptions, init, plan};
use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::api::core::v1::{Node, Taint};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use kube::api::ObjectMeta;
use serde_json::{Value, json};
use shared::api::writer::{Call, PatchKind};
use shared::cache::informers::Informer;
use shared::cache::pod::Pod;
use shared::testkit::{Kit, Running, eventually, settle};
use std::collections::BTreeSet;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::time::Instant;

const GRACE: Duration = Duration::from_secs(50);
const UNREACHABLE: &str = plan::UNREACHABLE;

fn opts() -> NodeLifecycleOptions {
    NodeLifecycleOptions {
        node_monitor_period: Duration::from_secs(5),
        node_monitor_grace_period: GRACE,
        node_startup_grace_period: Duration::from_secs(60),
        node_eviction_rate: 0.1,
        secondary_node_eviction_rate: 0.01,
        large_cluster_size_threshold: 50,
        unhealthy_zone_threshold: 0.55,
    }
}

static NEXT_RV: AtomicU64 = AtomicU64::new(1);

/// A resourceVersion no tracker write uses (the tracker counts from 1001).
fn kubelet_rv() -> String {
    format!("k{}", NEXT_RV.fetch_add(1, Ordering::Relaxed))
}

fn conditions(ready: &str, others: &str, heartbeat: Timestamp) -> Value {
    let c = |t: &str, s: &str| {
        json!({"type": t, "status": s, "reason": "Kubelet", "lastHeartbeatTime": heartbeat.to_string(),
               "lastTransitionTime": "2025-12-31T00:00:00Z"})
    };
    json!([
        c("Ready", ready),
        c("MemoryPressure", others),
        c("DiskPressure", others),
        c("PIDPressure", others),
        c("NetworkUnavailable", "False"),
    ])
}

/// A registered node in `zone`, Ready with a heartbeat a little before the kit's epoch.
fn node(name: &str, zone: &str) -> Node {
    serde_json::from_value(json!({
        "metadata": {
            "name": name, "uid": format!("uid-{name}"), "resourceVersion": "1",
            "creationTimestamp": "2025-12-31T00:00:00Z",
            "labels": {"topology.kubernetes.io/zone": zone},
        },
        "spec": {},
        "status": {"conditions": conditions("True", "False", "2025-12-31T23:59:50Z".parse().unwrap())},
    }))
    .unwrap()
}

fn pod(name: &str, node: &str) -> Pod {
    serde_json::from_value(json!({
        "metadata": {"name": name, "namespace": "ns", "uid": format!("uid-{name}"), "resourceVersion": "1"},
        "spec": {"nodeName": node, "containers": [{"name": "c"}]},
        "status": {"conditions": [{"type": "Ready", "status": "True", "reason": "PodReady"}]},
    }))
    .unwrap()
}

fn lease(node: &str, renew: Timestamp) -> Lease {
    Lease {
        metadata: ObjectMeta {
            name: Some(node.into()),
            namespace: Some(NODE_LEASE_NAMESPACE.into()),
            resource_version: Some(kubelet_rv()),
            ..Default::default()
        },
        spec: Some(LeaseSpec {
            holder_identity: Some(node.into()),
            lease_duration_seconds: Some(40),
            renew_time: Some(MicroTime(renew)),
            ..Default::default()
        }),
    }
}

fn lease_cache(kit: &Kit) -> Arc<Informer<Lease>> {
    kit.informers.get_namespaced::<Lease>(NODE_LEASE_NAMESPACE)
}

/// The simulated cluster around the controller.
struct Cluster {
    kit: Kit,
    /// Nodes whose kubelet still renews its Lease.
    alive: Arc<Mutex<BTreeSet<String>>>,
    /// The watch delivers nothing while set (a lagging watch).
    watch_paused: Arc<AtomicBool>,
    running: Option<Running>,
    sim: tokio::task::JoinHandle<()>,
}

impl Cluster {
    /// Builds the controller with its real `init`, seeds nodes (all alive), their Leases and
    /// pods after it, then starts the controller and the simulation.
    fn start(nodes: Vec<Node>, pods: Vec<Pod>) -> Cluster {
        Cluster::start_with(nodes, pods, true)
    }

    /// [`Cluster::start`] with NodeControllerLeaseCircuitBreaker on or off.
    fn start_with(nodes: Vec<Node>, pods: Vec<Pod>, circuit_breaker: bool) -> Cluster {
        let mut kit = Kit::new();
        kit.gates.node_controller_lease_circuit_breaker = circuit_breaker;
        let controller = init(
            opts(),
            kit.setup(DECLARATION.name, DECLARATION.event_source),
        )
        .expect("init");
        let names: BTreeSet<String> = nodes
            .iter()
            .map(|n| n.metadata.name.clone().unwrap())
            .collect();
        kit.seed(nodes);
        kit.seed(names.iter().map(|n| lease(n, kit.clock.now())));
        let leases = lease_cache(&kit);
        kit.seed(pods);
        let running = Some(kit.start(controller));
        let alive = Arc::new(Mutex::new(names));
        let watch_paused = Arc::new(AtomicBool::new(false));
        let sim = tokio::spawn(simulate(
            Arc::clone(&kit.api),
            kit.informers.get::<Node>(),
            leases,
            Arc::clone(&kit.clock),
            Arc::clone(&alive),
            Arc::clone(&watch_paused),
        ));
        Cluster {
            kit,
            alive,
            watch_paused,
            running,
            sim,
        }
    }

    /// The node's kubelet stops: no more Lease renewals.
    fn fail(&self, name: &str) {
        self.alive.lock().unwrap().remove(name);
    }

    /// The node's kubelet is back: it posts Ready=True with a fresh heartbeat (on the server;
    /// the watch brings it) and renews its Lease.
    fn recover(&self, name: &str) {
        let mut n = self.node(name);
        n.metadata.resource_version = Some(kubelet_rv());
        n.status.as_mut().unwrap().conditions =
            serde_json::from_value(conditions("True", "False", self.kit.clock.now())).unwrap();
        self.kit.api.insert(&n);
        let l = lease(name, self.kit.clock.now());
        self.kit.api.insert(&l);
        self.kit.apply(l);
        self.alive.lock().unwrap().insert(name.to_string());
    }

    /// The server's state of a node.
    fn node(&self, name: &str) -> Node {
        self.kit
            .api
            .object::<Node>("", name)
            .expect("node on the server")
    }

    fn taints(&self, name: &str) -> Vec<Taint> {
        plan::taints(&self.node(name))
    }

    fn has_taint(&self, name: &str, key: &str, effect: &str) -> bool {
        self.taints(name)
            .iter()
            .any(|t| t.key == key && t.effect == effect)
    }

    fn no_execute_added(&self, name: &str) -> Option<Timestamp> {
        self.taints(name)
            .into_iter()
            .find(|t| t.key == UNREACHABLE && t.effect == "NoExecute")
            .and_then(|t| t.time_added)
            .map(|t| t.0)
    }

    fn ready(&self, name: &str) -> String {
        plan::ready_status(&self.node(name))
            .unwrap_or_default()
            .to_string()
    }

    /// Node and pod writes (not events, not reads), as "verb plural[/sub] name".
    fn writes(&self) -> Vec<String> {
        self.kit
            .api
            .writes()
            .iter()
            .map(|c| {
                let t = c.target();
                let sub = t
                    .subresource
                    .as_deref()
                    .map(|s| format!("/{s}"))
                    .unwrap_or_default();
                format!("{} {}{sub} {}", c.verb(), t.plural, t.name)
            })
            .collect()
    }

    fn metric(&self, line_start: &str) -> Option<f64> {
        self.kit
            .metrics
            .encode()
            .lines()
            .find_map(|l| l.strip_prefix(line_start)?.strip_prefix(' ')?.parse().ok())
    }

    fn zone_metric(&self, name: &str, zone: &str) -> Option<f64> {
        self.metric(&format!("{name}{{zone=\":\0:{zone}\"}}"))
    }

    async fn stop(mut self) {
        self.sim.abort();
        if let Some(r) = self.running.take() {
            r.stop().await;
        }
    }
}

/// The watch (nodes from the server to the cache, 10 ms behind) and the live kubelets (a Lease
/// renewal every 10 s).
async fn simulate(
    api: Arc<shared::testkit::FakeApi>,
    nodes: Arc<Informer<Node>>,
    leases: Arc<Informer<Lease>>,
    clock: Arc<dyn shared::meta::clock::Clock>,
    alive: Arc<Mutex<BTreeSet<String>>>,
    watch_paused: Arc<AtomicBool>,
) {
    let mut renewed = Instant::now();
    loop {
        tokio::time::sleep(Duration::from_millis(10)).await;
        if !watch_paused.load(Ordering::SeqCst) {
            for n in api.objects::<Node>() {
                let cached = nodes.get(n.metadata.name.as_deref().unwrap_or_default());
                if cached.is_none_or(|c| c.metadata.resource_version != n.metadata.resource_version)
                {
                    nodes.testkit_apply(n);
                }
            }
        }
        if renewed.elapsed() >= Duration::from_secs(10) {
            renewed = Instant::now();
            let names: Vec<String> = alive.lock().unwrap().iter().cloned().collect();
            for n in names {
                let l = lease(&n, clock.now());
                api.insert(&l);
                leases.testkit_apply(l);
            }
        }
    }
}

/// Polls every 10 ms (virtual time) for up to `limit` and returns when each node first had
/// its `unreachable:NoExecute` taint (`timeAdded` has whole seconds only), sorted.
async fn no_execute_seen(c: &Cluster, nodes: &[String], limit: Duration) -> Vec<Instant> {
    let end = Instant::now() + limit;
    let mut seen: Vec<Option<Instant>> = vec![None; nodes.len()];
    while Instant::now() < end && seen.iter().any(Option::is_none) {
        settle().await;
        for (i, n) in nodes.iter().enumerate() {
            if seen[i].is_none() && c.has_taint(n, UNREACHABLE, "NoExecute") {
                seen[i] = Some(Instant::now());
            }
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let mut seen: Vec<Instant> = seen
        .into_iter()
        .map(|s| s.expect("every node tainted in time"))
        .collect();
    seen.sort();
    seen
}

fn gaps(seen: &[Instant]) -> Vec<f64> {
    seen.windows(2)
        .map(|w| w[1].duration_since(w[0]).as_secs_f64())
        .collect()
}

fn since(start: Instant) -> Duration {
    Instant::now().duration_since(start)
}

fn secs(t: Timestamp, start: Timestamp) -> f64 {
    t.duration_since(start).as_secs_f64()
}

/// N1 — NL-3, NL-4, NL-5 (NB-2 timer), NL-6, NL-8, NL-9, NL-11, NL-12 gauges: a node whose Lease
/// stops is marked Unknown by a `nodes/status` patch guarded by its resourceVersion right after
/// probe + 50 s, its pod is marked NotReady, it gets `unreachable:NoSchedule` and then (its zone's
/// token) `unreachable:NoExecute`; events `RegisteredNode`, `NodeNotReady` (node) and
/// `NodeNotReady` (pod Warning) from `node-controller`.
#[tokio::test(start_paused = true)]
async fn nl4_nl5_n1_grace_expiry_marks_unknown_and_taints() {
    let names = ["n1", "n2", "n3", "n4"];
    let c = Cluster::start(
        names.iter().map(|n| node(n, "z1")).collect(),
        vec![pod("p1", "n1")],
    );
    let start = Instant::now();
    let wall = c.kit.clock.now();
    c.fail("n1");
    // Nothing is written while the grace runs.
    assert!(!eventually(GRACE - Duration::from_millis(10), || !c.writes().is_empty()).await);
    assert!(eventually(Duration::from_secs(1), || c.ready("n1") == "Unknown").await);
    let unknown_after = since(start);
    assert!(
        unknown_after > GRACE && unknown_after <= GRACE + Duration::from_millis(100),
        "Unknown written {unknown_after:?} after the last probe"
    );
    let seen = no_execute_seen(&c, &["n1".to_string()], Duration::from_secs(2)).await;
    let late = seen[0].duration_since(start) - GRACE;
    assert!(
        late >= Duration::from_millis(250) && late <= Duration::from_secs(1),
        "NoExecute {late:?} after expiry (a 250 ms batch window, then NB-2: ≤ 1 s)"
    );
    assert_eq!(
        c.writes(),
        [
            "patch nodes/status n1",
            "patch pods/status p1",
            "patch nodes n1",
            "patch nodes n1"
        ]
    );
    let writes = c.kit.api.writes();
    let Call::Patch(_, PatchKind::Strategic, status) = &writes[0] else {
        panic!("{:?}", writes[0])
    };
    assert_eq!(
        status["metadata"]["resourceVersion"], "1",
        "guarded by the read version"
    );
    let conds = status["status"]["conditions"].as_array().unwrap();
    for t in ["Ready", "MemoryPressure", "DiskPressure", "PIDPressure"] {
        let c = conds.iter().find(|c| c["type"] == t).unwrap();
        assert_eq!(
            (c["status"].as_str(), c["reason"].as_str()),
            (Some("Unknown"), Some("NodeStatusUnknown")),
            "{t}"
        );
        assert_eq!(
            c["lastHeartbeatTime"], "2025-12-31T23:59:50Z",
            "{t}: heartbeat kept"
        );
    }
    let network = conds
        .iter()
        .find(|c| c["type"] == "NetworkUnavailable")
        .unwrap();
    assert_eq!(network["status"], "False", "NetworkUnavailable untouched");
    let Call::Patch(_, PatchKind::Strategic, pod_patch) = &writes[1] else {
        panic!("{:?}", writes[1])
    };
    assert_eq!(pod_patch["status"]["conditions"][0]["status"], "False");
    assert!(
        pod_patch["status"]["conditions"][0].get("reason").is_none(),
        "reason kept"
    );
    // Both taint writes replace spec.taints under the version the previous write returned.
    for w in &writes[2..] {
        let Call::Patch(_, PatchKind::Merge, body) = w else {
            panic!("{w:?}")
        };
        assert!(
            body["metadata"]["resourceVersion"]
                .as_str()
                .unwrap()
                .parse::<u64>()
                .unwrap()
                > 1000
        );
    }
    let expired = wall
        .checked_add(SignedDuration::try_from(GRACE).unwrap())
        .unwrap();
    for t in c.taints("n1") {
        let added = t.time_added.as_ref().expect("timeAdded set").0;
        assert!(secs(added, expired).abs() <= 1.0, "{t:?}");
    }
    assert!(c.has_taint("n1", UNREACHABLE, "NoSchedule"));
    let p1 = c.kit.api.object::<Pod>("ns", "p1").unwrap();
    let ready = p1.status.unwrap().conditions.unwrap();
    assert_eq!(
        (ready[0].type_.as_str(), ready[0].status.as_str()),
        ("Ready", "False")
    );
    settle().await;
    let events = c.kit.api.events();
    let registered = events
        .iter()
        .filter(|(_, r, _)| r == "RegisteredNode")
        .count();
    assert_eq!(registered, 4, "{events:?}");
    assert!(events.contains(&(
        "Normal".into(),
        "NodeNotReady".into(),
        "Node n1 status is now: NodeNotReady".into()
    )));
    assert!(events.contains(&(
        "Warning".into(),
        "NodeNotReady".into(),
        "Node is not ready".into()
    )));
    let sources: BTreeSet<String> = c
        .kit
        .api
        .calls()
        .iter()
        .filter_map(|call| match call {
            Call::Create(t, v) if t.plural == "events" => Some(
                v["source"]["component"]
                    .as_str()
                    .unwrap_or_default()
                    .to_string(),
            ),
            _ => None,
        })
        .collect();
    assert_eq!(sources, BTreeSet::from(["node-controller".to_string()]));
    // The zone's gauges (NL-12) and evictions counter (NL-11); the detection latencies (NB-2).
    assert_eq!(c.zone_metric("node_collector_zone_size", "z1"), Some(4.0));
    assert_eq!(
        c.zone_metric("node_collector_zone_health", "z1"),
        Some(75.0)
    );
    assert_eq!(
        c.zone_metric("node_collector_unhealthy_nodes_in_zone", "z1"),
        Some(1.0)
    );
    assert_eq!(
        c.zone_metric("node_collector_evictions_total", "z1"),
        Some(1.0)
    );
    for kind in ["condition", "noschedule", "noexecute"] {
        assert_eq!(
            c.metric(&format!(
                "pilothouse_node_lifecycle_detection_latency_seconds_count{{kind=\"{kind}\"}}"
            )),
            Some(1.0),
            "{kind}"
        );
    }
    // The other nodes were never touched, and later passes write nothing more.
    tokio::time::sleep(Duration::from_secs(30)).await;
    assert_eq!(c.writes().len(), 4, "{:?}", c.writes());
    assert!(
        c.metric("node_collector_update_all_nodes_health_duration_seconds_count")
            .unwrap()
            >= 10.0
    );
    c.stop().await;
}

/// NL-11 with read-your-own-writes: while the watch lags, the tainter's NoExecute write starts
/// from what the NoSchedule write returned: no read, no conflict.
#[tokio::test(start_paused = true)]
async fn nl11_tainting_pick_writes_from_our_last_write_while_the_watch_lags() {
    let c = Cluster::start(vec![node("n1", "z1"), node("n2", "z1")], vec![]);
    c.fail("n1");
    tokio::time::sleep(GRACE - Duration::from_secs(1)).await;
    c.watch_paused.store(true, Ordering::SeqCst);
    assert!(
        eventually(Duration::from_secs(3), || c.has_taint(
            "n1",
            UNREACHABLE,
            "NoExecute"
        ))
        .await
    );
    assert_eq!(
        c.writes(),
        ["patch nodes/status n1", "patch nodes n1", "patch nodes n1"]
    );
    assert!(
        !c.kit
            .api
            .calls()
            .iter()
            .any(|call| matches!(call, Call::Get(t) if t.plural == "nodes")),
        "no re-read of the node (the live Lease read is NL-LB's): {:?}",
        c.kit.api.calls()
    );
    let writes = c.kit.api.writes();
    let (Call::Patch(_, _, no_schedule), Call::Patch(_, _, no_execute)) = (&writes[1], &writes[2])
    else {
        unreachable!()
    };
    let returned = c.kit.api.object::<Node>("", "n1").unwrap();
    assert_ne!(
        no_schedule["metadata"]["resourceVersion"],
        no_execute["metadata"]["resourceVersion"]
    );
    assert_eq!(no_execute["spec"]["taints"].as_array().unwrap().len(), 2);
    assert!(
        returned
            .metadata
            .resource_version
            .unwrap()
            .parse::<u64>()
            .unwrap()
            > 1000
    );
    assert_eq!(
        c.zone_metric("node_collector_evictions_total", "z1"),
        Some(1.0)
    );
    c.stop().await;
}

/// N10 — NL-12, NL-13, NL-15: three nodes of a 10-node zone fail in one tick; the zone stays
/// Normal (3/10 < 55 %), all three are Unknown at once and their NoExecute taints are spaced by
/// the zone's token bucket (0.1/s → 10 s apart); gauges 10 / 70 / 3, evictions 3.
#[tokio::test(start_paused = true)]
async fn nl13_nl15_n10_normal_zone_taints_are_spaced_by_the_zone_bucket() {
    let names: Vec<String> = (0..10).map(|i| format!("z10-{i}")).collect();
    let c = Cluster::start(names.iter().map(|n| node(n, "z10")).collect(), vec![]);
    let failing = &names[..3];
    for n in failing {
        c.fail(n);
    }
    assert!(
        eventually(GRACE + Duration::from_secs(1), || failing
            .iter()
            .all(|n| c.ready(n) == "Unknown"))
        .await
    );
    let seen = no_execute_seen(&c, failing, Duration::from_secs(25)).await;
    let gaps = gaps(&seen);
    for g in &gaps {
        assert!((10.0..10.3).contains(g), "taints {gaps:?} apart");
    }
    assert!(
        failing
            .iter()
            .all(|n| c.has_taint(n, UNREACHABLE, "NoSchedule"))
    );
    assert_eq!(c.zone_metric("node_collector_zone_size", "z10"), Some(10.0));
    assert_eq!(
        c.zone_metric("node_collector_zone_health", "z10"),
        Some(70.0)
    );
    assert_eq!(
        c.zone_metric("node_collector_unhealthy_nodes_in_zone", "z10"),
        Some(3.0)
    );
    assert_eq!(
        c.zone_metric("node_collector_evictions_total", "z10"),
        Some(3.0)
    );
    c.stop().await;
}

/// N11 — NL-12, NL-13, NL-15: 4 of a 6-node zone fail in one tick (next to a healthy zone): the
/// zone is PartialDisruption (≥ 55 %, small zone → rate 0), so all four are Unknown with
/// `unreachable:NoSchedule` but none gets a NoExecute taint; when 2 recover the zone is Normal
/// again and the other 2 are tainted from an empty bucket: the first ≥ 10 s after the change,
/// the second 10 s later.
#[tokio::test(start_paused = true)]
async fn nl12_n11_partial_disruption_stops_a_small_zone_until_it_recovers() {
    let names: Vec<String> = (0..6).map(|i| format!("z11-{i}")).collect();
    let mut nodes: Vec<Node> = names.iter().map(|n| node(n, "z11")).collect();
    nodes.extend([node("z11b-0", "z11b"), node("z11b-1", "z11b")]);
    let c = Cluster::start(nodes, vec![]);
    let failing = &names[..4];
    for n in failing {
        c.fail(n);
    }
    assert!(
        eventually(GRACE + Duration::from_secs(1), || failing
            .iter()
            .all(
                |n| c.ready(n) == "Unknown" && c.has_taint(n, UNREACHABLE, "NoSchedule")
            ))
        .await
    );
    let health = c.zone_metric("node_collector_zone_health", "z11").unwrap();
    assert!((health - 100.0 / 3.0).abs() < 0.01, "{health}");
    assert_eq!(
        c.zone_metric("node_collector_unhealthy_nodes_in_zone", "z11"),
        Some(4.0)
    );
    tokio::time::sleep(Duration::from_secs(120)).await;
    assert!(
        failing.iter().all(|n| c.no_execute_added(n).is_none()),
        "no NoExecute taint in a PartialDisruption zone of ≤ 50 nodes"
    );
    assert_eq!(
        c.zone_metric("node_collector_evictions_total", "z11"),
        Some(0.0)
    );
    assert_eq!(
        c.zone_metric("pilothouse_node_lifecycle_taint_queue_depth", "z11"),
        Some(4.0)
    );
    let recovered_at = Instant::now();
    c.recover(&failing[0]);
    c.recover(&failing[1]);
    assert!(
        eventually(Duration::from_secs(2), || c.taints(&failing[0]).is_empty()
            && c.taints(&failing[1]).is_empty())
        .await,
        "the recovered nodes lose their NoSchedule taints"
    );
    let rest = &failing[2..];
    let seen = no_execute_seen(&c, rest, Duration::from_secs(25)).await;
    let first = seen[0].duration_since(recovered_at).as_secs_f64();
    assert!(
        (10.0..10.5).contains(&first),
        "first taint {first:.2}s after the change"
    );
    assert!((10.0..10.3).contains(&gaps(&seen)[0]), "{:?}", gaps(&seen));
    assert_eq!(
        c.zone_metric("node_collector_zone_health", "z11"),
        Some(100.0 * 4.0 / 6.0)
    );
    assert_eq!(
        c.zone_metric("node_collector_evictions_total", "z11"),
        Some(2.0)
    );
    c.stop().await;
}

/// N13 — NL-12, NL-14: every zone fully disrupted (master disruption mode): no NoExecute taint
/// while it lasts (and none are queued); when one zone recovers, the other (FullDisruption next
/// to a Normal zone) is tainted at the normal rate, the first ≥ 10 s after the exit.
#[tokio::test(start_paused = true)]
async fn nl14_n13_master_disruption_stops_tainting_until_a_zone_recovers() {
    let a: Vec<String> = (0..3).map(|i| format!("z13a-{i}")).collect();
    let b: Vec<String> = (0..3).map(|i| format!("z13b-{i}")).collect();
    let nodes = a
        .iter()
        .map(|n| node(n, "z13a"))
        .chain(b.iter().map(|n| node(n, "z13b")));
    let c = Cluster::start(nodes.collect(), vec![]);
    for n in a.iter().chain(&b) {
        c.fail(n);
    }
    assert!(
        eventually(GRACE + Duration::from_secs(1), || a.iter().chain(&b).all(
            |n| c.ready(n) == "Unknown" && c.has_taint(n, UNREACHABLE, "NoSchedule")
        ))
        .await
    );
    tokio::time::sleep(Duration::from_secs(90)).await;
    assert!(a.iter().chain(&b).all(|n| c.no_execute_added(n).is_none()));
    assert_eq!(
        c.zone_metric("node_collector_zone_health", "z13a"),
        Some(0.0)
    );
    assert_eq!(
        c.zone_metric("node_collector_zone_health", "z13b"),
        Some(0.0)
    );
    let exit = Instant::now();
    for n in &b {
        c.recover(n);
    }
    let seen = no_execute_seen(&c, &a, Duration::from_secs(40)).await;
    let first = seen[0].duration_since(exit).as_secs_f64();
    assert!(
        (10.0..10.5).contains(&first),
        "first taint {first:.2}s after the exit"
    );
    assert!(
        gaps(&seen).iter().all(|g| (10.0..10.3).contains(g)),
        "{:?}",
        gaps(&seen)
    );
    assert!(b.iter().all(|n| c.taints(n).is_empty()));
    c.stop().await;
}

/// N6 — NL-9, NL-1: renewals resume and the kubelet posts Ready=True: both unreachable taints
/// are removed (never rate limited) and the zone is healthy again.
#[tokio::test(start_paused = true)]
async fn nl9_n6_recovery_removes_the_taints() {
    let c = Cluster::start(
        ["n1", "n2", "n3"].iter().map(|n| node(n, "z6")).collect(),
        vec![],
    );
    c.fail("n1");
    assert!(
        eventually(GRACE + Duration::from_secs(2), || c.has_taint(
            "n1",
            UNREACHABLE,
            "NoExecute"
        ))
        .await
    );
    tokio::time::sleep(Duration::from_secs(20)).await;
    c.kit.api.clear_calls();
    let start = Instant::now();
    c.recover("n1");
    assert!(eventually(Duration::from_secs(2), || c.taints("n1").is_empty()).await);
    assert!(
        since(start) < Duration::from_millis(500),
        "{:?}",
        since(start)
    );
    assert_eq!(
        c.writes(),
        ["patch nodes n1", "patch nodes n1"],
        "NoSchedule, then NoExecute"
    );
    assert_eq!(c.ready("n1"), "True");
    tokio::time::sleep(Duration::from_secs(60)).await;
    assert!(c.taints("n1").is_empty(), "healthy: never tainted again");
    assert_eq!(c.writes().len(), 2, "{:?}", c.writes());
    assert_eq!(
        c.zone_metric("node_collector_zone_health", "z6"),
        Some(100.0)
    );
    assert_eq!(
        c.zone_metric("node_collector_evictions_total", "z6"),
        Some(1.0)
    );
    c.stop().await;
}

/// N15 — NL-17, NB-3: a controller starting while a node is Unknown and tainted counts it as
/// added (`RegisteredNode`, fresh grace) and keeps its taints: no write at all, `timeAdded`
/// kept, nothing added to `evictions_total`.
#[tokio::test(start_paused = true)]
async fn nl17_b3_n15_a_restart_keeps_matching_taints() {
    let mut down = node("n15", "z15");
    down.status.as_mut().unwrap().conditions = serde_json::from_value(conditions(
        "Unknown",
        "Unknown",
        "2025-12-31T23:00:00Z".parse().unwrap(),
    ))
    .unwrap();
    let taint = |effect: &str| Taint {
        key: UNREACHABLE.into(),
        effect: effect.into(),
        value: None,
        time_added: Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
            "2025-12-31T23:01:00Z".parse().unwrap(),
        )),
    };
    down.spec.as_mut().unwrap().taints = Some(vec![taint("NoSchedule"), taint("NoExecute")]);
    let c = Cluster::start(
        vec![down.clone(), node("m1", "z15"), node("m2", "z15")],
        vec![pod("p", "n15")],
    );
    c.fail("n15");
    tokio::time::sleep(Duration::from_secs(120)).await;
    assert!(c.writes().is_empty(), "{:?}", c.writes());
    assert_eq!(c.taints("n15"), plan::taints(&down));
    assert_eq!(
        c.zone_metric("node_collector_evictions_total", "z15"),
        Some(0.0)
    );
    let registered = c
        .kit
        .api
        .events()
        .into_iter()
        .filter(|(_, r, _)| r == "RegisteredNode")
        .count();
    assert_eq!(registered, 3);
    c.stop().await;
}

/// NL-7: a pod added to a node evaluated not-Ready is marked `Ready=False` with a pod Warning.
#[tokio::test(start_paused = true)]
async fn nl7_a_pod_bound_to_a_not_ready_node_is_marked() {
    let c = Cluster::start(vec![node("n1", "z7"), node("n2", "z7")], vec![]);
    c.fail("n1");
    assert!(
        eventually(GRACE + Duration::from_secs(1), || c.ready("n1")
            == "Unknown")
        .await
    );
    c.kit.api.clear_calls();
    c.kit.seed([pod("late", "n1"), pod("fine", "n2")]);
    assert!(
        eventually(Duration::from_secs(1), || c.writes()
            == ["patch pods/status late"])
        .await,
        "{:?}",
        c.writes()
    );
    settle().await;
    assert_eq!(
        c.kit.api.events(),
        [(
            "Warning".into(),
            "NodeNotReady".into(),
            "Node is not ready".into()
        )]
    );
    c.stop().await;
}

/// NL-LB, kcm 1.37's NodeControllerLeaseCircuitBreaker (beta, on): the kubelet renews on the
/// server while the Lease watch lags. When the grace runs out on the cached Lease, the live one is
/// read (one GET), found newer than the cache, and the node is not marked: the skip is counted as
/// a stale cache. Once the cache delivers that Lease the node is fresh, and nothing was ever
/// written. With the gate off, the same lag marks the node Unknown after the grace.
#[tokio::test(start_paused = true)]
async fn nl_lb_a_lagging_lease_cache_marks_no_node() {
    for breaker in [true, false] {
        let c = Cluster::start_with(vec![node("n1", "z1")], vec![], breaker);
        let start = Instant::now();
        // The simulated kubelet stops renewing through the watch; it renews on the server only.
        c.fail("n1");
        let mut live = lease("n1", c.kit.clock.now());
        for (i, at) in [10u64, 20, 30, 40, 50].into_iter().enumerate() {
            tokio::time::sleep_until(start + Duration::from_secs(at)).await;
            live = lease("n1", c.kit.clock.now());
            live.metadata.resource_version = Some((5_000 + i).to_string());
            c.kit.api.insert(&live);
        }
        tokio::time::sleep_until(start + GRACE + Duration::from_secs(2)).await;
        settle().await;
        let gets = c
            .kit
            .api
            .calls()
            .iter()
            .filter(|call| matches!(call, Call::Get(t) if t.plural == "leases" && t.name == "n1"))
            .count();
        if !breaker {
            assert_eq!(
                c.ready("n1"),
                "Unknown",
                "gate off: marked from the cached Lease"
            );
            assert_eq!(gets, 0, "gate off: no live read");
            c.stop().await;
            continue;
        }
        assert_eq!(
            c.ready("n1"),
            "True",
            "marked although its live Lease is renewed"
        );
        assert!(c.writes().is_empty(), "{:?}", c.writes());
        assert_eq!(gets, 1, "one live read; the fence spares the others");
        let skips = c
            .metric("pilothouse_stale_cache_skips_total{controller=\"node-lifecycle-controller\",resource=\"leases\"}")
            .unwrap_or(0.0);
        assert!(skips >= 1.0, "stale skips counted: {skips}");
        // The watch catches up: the node is fresh, and stays unmarked.
        c.kit.apply(live.clone());
        tokio::time::sleep(Duration::from_secs(2)).await;
        settle().await;
        assert_eq!(c.ready("n1"), "True");
        assert!(c.writes().is_empty(), "{:?}", c.writes());
        c.stop().await;
    }
}
