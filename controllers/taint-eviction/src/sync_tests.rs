//! Sync tests: the whole controller (its real `init`, handlers, queue and sync) against the test
//! kit's caches and recording writer, on tokio's paused clock.

use crate::{DECLARATION, init};
use k8s_openapi::api::core::v1::{Node, NodeSpec, Taint, Toleration};
use kube::api::ObjectMeta;
use shared::api::writer::Call;
use shared::cache::pod::Pod;
use shared::cache::pod::PodSpec;
use shared::testkit::{Kit, eventually};
use std::time::Duration;

fn node(name: &str, taints: &[(&str, &str)]) -> Node {
    Node {
        metadata: ObjectMeta {
            name: Some(name.into()),
            uid: Some(format!("uid-{name}")),
            resource_version: Some("1".into()),
            ..Default::default()
        },
        spec: Some(NodeSpec {
            taints: Some(
                taints
                    .iter()
                    .map(|(k, e)| Taint {
                        key: k.to_string(),
                        effect: e.to_string(),
                        ..Default::default()
                    })
                    .collect(),
            ),
            ..Default::default()
        }),
        ..Default::default()
    }
}

fn pod(name: &str, node: &str, toleration_seconds: Option<i64>) -> Pod {
    Pod {
        metadata: ObjectMeta {
            name: Some(name.into()),
            namespace: Some("ns".into()),
            uid: Some(format!("uid-{name}")),
            resource_version: Some("1".into()),
            ..Default::default()
        },
        spec: Some(PodSpec {
            node_name: Some(node.into()),
            tolerations: toleration_seconds.map(|s| {
                vec![Toleration {
                    key: Some("dead".into()),
                    operator: Some("Exists".into()),
                    effect: Some("NoExecute".into()),
                    toleration_seconds: Some(s),
                    ..Default::default()
                }]
            }),
            containers: vec![],
            ..Default::default()
        }),
        ..Default::default()
    }
}

fn kit() -> Kit {
    let kit = Kit::new();
    kit.seed(Vec::<Node>::new());
    kit.seed(Vec::<Pod>::new());
    kit
}

fn deleted(kit: &Kit, name: &str) -> bool {
    kit.api.calls().iter().any(|c| {
        matches!(c, Call::Delete { target, uid, .. }
            if target.name == name && uid.as_deref() == Some(&format!("uid-{name}")))
    })
}

fn event_reasons(kit: &Kit) -> Vec<String> {
    kit.api
        .events()
        .into_iter()
        .map(|(_, r, m)| format!("{r}: {m}"))
        .collect()
}

/// TE-3, TE-6, TE-9: an untolerated taint deletes at once: "Marking for deletion", GET, the
/// DisruptionTarget status patch, then a delete with a UID precondition.
#[tokio::test(start_paused = true)]
async fn untolerated_taint_evicts_at_once_with_condition_and_uid_precondition() {
    let kit = kit();
    let running = kit.start(init(kit.setup(DECLARATION.name, DECLARATION.event_source)).unwrap());
    kit.seed([pod("p", "n1", None)]);
    kit.apply(node("n1", &[("dead", "NoExecute")]));
    assert!(eventually(Duration::from_secs(1), || deleted(&kit, "p")).await);
    let writes: Vec<_> = kit
        .api
        .writes()
        .iter()
        .map(|c| format!("{} {:?}", c.verb(), c.target().subresource))
        .collect();
    assert_eq!(writes, ["patch Some(\"status\")", "delete None"]);
    let Call::Patch(_, _, body) = &kit.api.writes()[0] else {
        unreachable!()
    };
    assert_eq!(body["status"]["conditions"][0]["type"], "DisruptionTarget");
    assert_eq!(body["metadata"]["uid"], "uid-p");
    assert_eq!(
        event_reasons(&kit),
        ["TaintManagerEviction: Marking for deletion Pod ns/p"]
    );
    assert!(
        kit.metrics
            .encode()
            .contains("taint_eviction_controller_pod_deletions_total 1")
    );
    running.stop().await;
}

/// TE-3, TE-4: a tolerated taint with tolerationSeconds waits exactly that long.
#[tokio::test(start_paused = true)]
async fn toleration_seconds_delay_the_deletion() {
    let kit = kit();
    let running = kit.start(init(kit.setup(DECLARATION.name, DECLARATION.event_source)).unwrap());
    kit.seed([pod("p", "n1", Some(30))]);
    kit.apply(node("n1", &[("dead", "NoExecute")]));
    let start = tokio::time::Instant::now();
    assert!(!eventually(Duration::from_secs(29), || deleted(&kit, "p")).await);
    assert!(eventually(Duration::from_secs(2), || deleted(&kit, "p")).await);
    let waited = start.elapsed();
    assert!(
        waited >= Duration::from_secs(30) && waited < Duration::from_secs(31),
        "{waited:?}"
    );
    running.stop().await;
}

/// TE-5: the taint goes before the deadline: "Cancelling deletion", nothing deleted.
#[tokio::test(start_paused = true)]
async fn removing_the_taint_cancels_a_pending_deletion() {
    let kit = kit();
    let running = kit.start(init(kit.setup(DECLARATION.name, DECLARATION.event_source)).unwrap());
    kit.seed([pod("p", "n1", Some(30))]);
    kit.apply(node("n1", &[("dead", "NoExecute")]));
    tokio::time::sleep(Duration::from_secs(10)).await;
    kit.apply(node("n1", &[]));
    assert!(
        eventually(Duration::from_secs(1), || event_reasons(&kit)
            == ["TaintManagerEviction: Cancelling deletion of Pod ns/p"])
        .await,
        "{:?}",
        event_reasons(&kit)
    );
    tokio::time::sleep(Duration::from_secs(60)).await;
    assert!(kit.api.writes().is_empty(), "{:?}", kit.api.writes());
    running.stop().await;
}

/// Bad input at its extreme (tolerationSeconds = int64 max) neither panics nor stalls another
/// pod on the same node.
#[tokio::test(start_paused = true)]
async fn int64_max_toleration_seconds_is_a_wait_not_a_panic() {
    let kit = kit();
    let running = kit.start(init(kit.setup(DECLARATION.name, DECLARATION.event_source)).unwrap());
    kit.seed([
        pod("forever", "n1", Some(i64::MAX)),
        pod("now", "n1", Some(0)),
    ]);
    kit.apply(node("n1", &[("dead", "NoExecute")]));
    assert!(eventually(Duration::from_secs(1), || deleted(&kit, "now")).await);
    tokio::time::sleep(Duration::from_secs(3600)).await;
    assert!(!deleted(&kit, "forever"));
    assert_eq!(kit.panics(), 0.0, "{}", kit.metrics.encode());
    running.stop().await;
}

/// TE-7, TE-10: failing deletes retry with backoff (100 ms doubling); after the 5th consecutive
/// failure a Warning `TaintEvictionFailed` names the pod; the failures are counted by reason.
#[tokio::test(start_paused = true)]
async fn repeated_failures_warn_and_keep_retrying() {
    let kit = kit();
    kit.api.fail("delete", "pods", 6, 500, "InternalError");
    let running = kit.start(init(kit.setup(DECLARATION.name, DECLARATION.event_source)).unwrap());
    kit.seed([pod("p", "n1", None)]);
    kit.apply(node("n1", &[("dead", "NoExecute")]));
    assert!(
        eventually(Duration::from_secs(30), || kit
            .api
            .object::<Pod>("ns", "p")
            .is_none())
        .await
    );
    let deletes = kit
        .api
        .calls()
        .iter()
        .filter(|c| c.verb() == "delete")
        .count();
    assert_eq!(deletes, 7);
    let reasons = event_reasons(&kit);
    assert_eq!(reasons.len(), 2, "{reasons:?}");
    assert!(
        reasons[1].starts_with("TaintEvictionFailed: Failed to delete pod ns/p after 5 attempts"),
        "{reasons:?}"
    );
    let text = kit.metrics.encode();
    assert!(
        text.contains("pilothouse_taint_eviction_failures_total{reason=\"500\"} 6"),
        "{text}"
    );
    assert!(text.contains("result=\"server_error\""), "{text}");
    running.stop().await;
}

/// TE-11: on taking over, pods on nodes tainted before the start are processed.
#[tokio::test(start_paused = true)]
async fn taking_over_processes_already_tainted_nodes() {
    let kit = Kit::new();
    let controller = init(kit.setup(DECLARATION.name, DECLARATION.event_source)).unwrap();
    kit.seed([node("n1", &[("dead", "NoExecute")]), node("n2", &[])]);
    kit.seed([pod("p", "n1", None), pod("q", "n2", None)]);
    let running = kit.start(controller);
    assert!(eventually(Duration::from_secs(1), || deleted(&kit, "p")).await);
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert!(!deleted(&kit, "q"));
    running.stop().await;
}

/// TE-7: the pod was replaced by another of the same name before firing: nothing is deleted.
#[tokio::test(start_paused = true)]
async fn a_replaced_pod_is_not_deleted() {
    let kit = kit();
    let running = kit.start(init(kit.setup(DECLARATION.name, DECLARATION.event_source)).unwrap());
    kit.seed([pod("p", "n1", None)]);
    // The server already holds a successor with another UID.
    let mut successor = pod("p", "n1", None);
    successor.metadata.uid = Some("uid-successor".into());
    kit.api.insert(&successor);
    kit.apply(node("n1", &[("dead", "NoExecute")]));
    assert!(eventually(Duration::from_secs(1), || !kit.api.calls().is_empty()).await);
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert!(kit.api.writes().is_empty(), "{:?}", kit.api.writes());
    assert!(kit.api.object::<Pod>("ns", "p").is_some());
    running.stop().await;
}

/// TE-7: replaced between the read and the condition write. The patch carries the UID, which the
/// API server rejects as a changed immutable field (422 on metadata.uid, as a real one answers):
/// the pod is gone for this controller, nothing is deleted and nothing is retried.
#[tokio::test(start_paused = true)]
async fn a_pod_replaced_before_the_condition_write_is_not_deleted() {
    let kit = kit();
    kit.api.fail_when(|c| {
        matches!(c, Call::Patch(t, _, _) if t.name == "p").then(|| {
            shared::testkit::api_error(
                422,
                "Invalid",
                "pods \"p\" is invalid: metadata.uid: Invalid value: \"uid-p\": field is immutable",
            )
        })
    });
    let running = kit.start(init(kit.setup(DECLARATION.name, DECLARATION.event_source)).unwrap());
    kit.seed([pod("p", "n1", None)]);
    kit.apply(node("n1", &[("dead", "NoExecute")]));
    assert!(
        eventually(Duration::from_secs(1), || kit
            .api
            .calls()
            .iter()
            .any(|c| matches!(c, Call::Patch(..))))
        .await
    );
    tokio::time::sleep(Duration::from_secs(30)).await;
    let calls = kit.api.calls();
    assert!(
        !calls.iter().any(|c| matches!(c, Call::Delete { .. })),
        "{calls:?}"
    );
    assert_eq!(
        calls
            .iter()
            .filter(|c| matches!(c, Call::Patch(..)))
            .count(),
        1,
        "{calls:?}"
    );
    running.stop().await;
}
