//! Object helpers for end-to-end tests: kwok nodes, pods pinned to nodes, taints, events.

use crate::wait;
use anyhow::{Context, Result};
use k8s_openapi::api::core::v1::{Node, Pod, ServiceAccount, Taint};
use k8s_openapi::api::events::v1::Event;
use k8s_openapi::jiff::Timestamp;
use kube::Client;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use serde_json::{Value, json};
use std::time::Duration;

/// Waits for the namespace's `default` ServiceAccount (pods cannot be created before it exists).
pub async fn wait_service_account(client: &Client, ns: &str) -> Result<()> {
    let sa: Api<ServiceAccount> = Api::namespaced(client.clone(), ns);
    wait::until(
        "the default service account",
        Duration::from_secs(30),
        Duration::from_millis(100),
        || async { Ok(sa.get_opt("default").await?.map(|_| ())) },
    )
    .await
}

/// Creates a node managed by the shared kwok (Lease renewed every 2 s) in `zone`, and waits until
/// it is Ready with no taint but kwok's own.
pub async fn create_kwok_node(client: &Client, name: &str, zone: &str) -> Result<Node> {
    let nodes: Api<Node> = Api::all(client.clone());
    let node: Node = serde_json::from_value(json!({
        "metadata": {
            "name": name,
            "labels": {
                "kubernetes.io/hostname": name,
                "kubernetes.io/os": "linux",
                "kubernetes.io/arch": "amd64",
                "type": "kwok",
                "pilothouse.test/kwok": "shared",
                "topology.kubernetes.io/zone": zone
            },
            "annotations": {"kwok.x-k8s.io/node": "fake"}
        },
        "spec": {"taints": [{"key": "kwok.x-k8s.io/node", "value": "fake", "effect": "NoSchedule"}]}
    }))?;
    nodes
        .create(&PostParams::default(), &node)
        .await
        .with_context(|| format!("creating node {name}"))?;
    wait::until(
        &format!("node {name} Ready and untainted"),
        Duration::from_secs(60),
        Duration::from_millis(200),
        || async {
            let n = nodes.get(name).await?;
            let ready = n
                .status
                .as_ref()
                .and_then(|s| s.conditions.as_ref())
                .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"));
            let only_kwok = taints(&n).iter().all(|t| t.key == "kwok.x-k8s.io/node");
            Ok((ready && only_kwok).then_some(n))
        },
    )
    .await
}

pub async fn delete_node(client: &Client, name: &str) -> Result<()> {
    let nodes: Api<Node> = Api::all(client.clone());
    let _ = nodes.delete(name, &DeleteParams::default()).await;
    Ok(())
}

pub fn taints(node: &Node) -> Vec<Taint> {
    node.spec
        .as_ref()
        .and_then(|s| s.taints.clone())
        .unwrap_or_default()
}

/// Read-modify-write of a node's taints with the resourceVersion as precondition (retried on
/// conflict), so no other writer's taint is lost.
pub async fn modify_taints(
    client: &Client,
    name: &str,
    f: impl Fn(&mut Vec<Taint>),
) -> Result<Node> {
    let nodes: Api<Node> = Api::all(client.clone());
    for _ in 0..20 {
        let mut node = nodes.get(name).await?;
        let mut ts = taints(&node);
        f(&mut ts);
        node.spec.get_or_insert_with(Default::default).taints = Some(ts);
        match nodes.replace(name, &PostParams::default(), &node).await {
            Ok(n) => return Ok(n),
            Err(kube::Error::Api(e)) if e.code == 409 => continue,
            Err(e) => return Err(e.into()),
        }
    }
    anyhow::bail!("node {name}: taint update kept conflicting")
}

pub fn taint(key: &str, value: &str, effect: &str) -> Taint {
    Taint {
        key: key.into(),
        value: (!value.is_empty()).then(|| value.into()),
        effect: effect.into(),
        time_added: None,
    }
}

/// A pod bound to `node` (no scheduler), with `tolerations` (JSON list) and a finalizer that
/// keeps the object visible after deletion (remove with [`release_pods`]).
pub fn pod_on_node(name: &str, node: &str, tolerations: Value) -> Result<Pod> {
    Ok(serde_json::from_value(json!({
        "metadata": {"name": name, "finalizers": ["pilothouse.test/hold"]},
        "spec": {
            "nodeName": node,
            "terminationGracePeriodSeconds": 1,
            "tolerations": tolerations,
            "containers": [{"name": "c", "image": "busybox"}]
        }
    }))?)
}

/// A kwok node of its own (`<ns>-n`, in `zone`) tainted `key:NoExecute` before anything can
/// land on it, and a pod `victim` bound to it tolerating that taint for `seconds`; returns when
/// the pod was created.
pub async fn tolerating_pod_on_tainted_node(
    client: &Client,
    ns: &str,
    zone: &str,
    key: &str,
    seconds: i64,
) -> Result<Timestamp> {
    let node = format!("{ns}-n");
    create_kwok_node(client, &node, zone).await?;
    modify_taints(client, &node, |ts| ts.push(taint(key, "", "NoExecute"))).await?;
    let tolerations = json!([
        {"key": key, "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": seconds},
        {"key": "kwok.x-k8s.io/node", "operator": "Exists", "effect": "NoSchedule"}
    ]);
    Api::<Pod>::namespaced(client.clone(), ns)
        .create(
            &PostParams::default(),
            &pod_on_node("victim", &node, tolerations)?,
        )
        .await?;
    Ok(Timestamp::now())
}

/// Whether the pod has been deleted (deletionTimestamp set, or gone).
pub async fn deleted(pods: &Api<Pod>, name: &str) -> Result<bool> {
    Ok(pods
        .get_opt(name)
        .await?
        .is_none_or(|p| p.metadata.deletion_timestamp.is_some()))
}

/// Removes the test finalizer from every pod in the namespace.
pub async fn release_pods(client: &Client, ns: &str) -> Result<()> {
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
    for p in pods.list(&ListParams::default()).await? {
        let name = p.metadata.name.clone().unwrap_or_default();
        let _ = pods
            .patch(
                &name,
                &PatchParams::default(),
                &Patch::Merge(json!({"metadata": {"finalizers": null}})),
            )
            .await;
    }
    Ok(())
}

/// events.k8s.io events about `name` in `ns` with `reason`.
pub async fn events(client: &Client, ns: &str, name: &str, reason: &str) -> Result<Vec<Event>> {
    let api: Api<Event> = Api::namespaced(client.clone(), ns);
    let list = api
        .list(&ListParams::default().fields(&format!("regarding.name={name}")))
        .await?;
    Ok(list
        .items
        .into_iter()
        .filter(|e| e.reason.as_deref() == Some(reason))
        .collect())
}

/// Waits until `name`'s events of `reason` satisfy `done` (events are written asynchronously,
/// after the object writes they report), and returns them.
pub async fn wait_events(
    client: &Client,
    ns: &str,
    name: &str,
    reason: &str,
    timeout: Duration,
    done: impl Fn(&[Event]) -> bool,
) -> Result<Vec<Event>> {
    wait::until(
        &format!("{reason} events on {ns}/{name}"),
        timeout,
        Duration::from_millis(200),
        || async {
            let ev = events(client, ns, name, reason).await?;
            Ok(done(&ev).then_some(ev))
        },
    )
    .await
}

pub fn condition<'a>(
    pod: &'a Pod,
    type_: &str,
) -> Option<&'a k8s_openapi::api::core::v1::PodCondition> {
    pod.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .and_then(|cs| cs.iter().find(|c| c.type_ == type_))
}

pub fn has_taint(node: &Node, key: &str, effect: &str) -> bool {
    taints(node)
        .iter()
        .any(|t| t.key == key && t.effect == effect)
}

/// The node profile the node-lifecycle suites run (spec §6: P=1s, G=10s, startup grace 20s).
pub fn accelerated_node_args(controllers: &str) -> Vec<String> {
    [
        format!("--controllers={controllers}"),
        "--node-monitor-period=1s".to_string(),
        "--node-monitor-grace-period=10s".to_string(),
        "--node-startup-grace-period=20s".to_string(),
    ]
    .to_vec()
}

/// A node condition's (status, reason).
pub fn node_condition(node: &Node, t: &str) -> Option<(String, String)> {
    node.status
        .as_ref()?
        .conditions
        .as_ref()?
        .iter()
        .find(|c| c.type_ == t)
        .map(|c| (c.status.clone(), c.reason.clone().unwrap_or_default()))
}

/// `timeAdded` of a node's NoExecute taint `key`.
pub async fn no_execute_added(
    nodes: &Api<Node>,
    name: &str,
    key: &str,
) -> Result<Option<Timestamp>> {
    Ok(taints(&nodes.get(name).await?)
        .into_iter()
        .find(|t| t.key == key && t.effect == "NoExecute")
        .and_then(|t| t.time_added)
        .map(|t| t.0))
}

/// Wall-clock time until `deadline` (zero once past).
pub fn until(deadline: Timestamp) -> Duration {
    Timestamp::now()
        .duration_until(deadline)
        .try_into()
        .unwrap_or(Duration::ZERO)
}

/// Seconds from `t` to now (negative if `t` is ahead).
pub fn since(t: Timestamp) -> f64 {
    t.duration_until(Timestamp::now()).as_secs_f64()
}

/// A StatefulSet `name` (selector and pod label `app: name`, Service `name`) of `replicas` pods
/// for kwok, with a grace of 1 s: kwok keeps a deleted pod that long, so rollouts stay short (0
/// would draw SB-7's warning).
pub fn stateful_set(name: &str, replicas: i32) -> Value {
    json!({
        "apiVersion": "apps/v1", "kind": "StatefulSet",
        "metadata": {"name": name},
        "spec": {
            "replicas": replicas,
            "serviceName": name,
            "selector": {"matchLabels": {"app": name}},
            "template": {
                "metadata": {"labels": {"app": name}},
                "spec": {
                    "terminationGracePeriodSeconds": 1,
                    "tolerations": [{"key": "kwok.x-k8s.io/node", "operator": "Exists", "effect": "NoSchedule"}],
                    "containers": [{"name": "c", "image": "nginx:1"}]
                }
            }
        }
    })
}

/// Deep-merges `from` into `into`: objects key by key, anything else replaced (a JSON merge
/// patch without deletions), for building test objects from a base and the fields a trial sets.
pub fn merge_json(into: &mut serde_json::Value, from: &serde_json::Value) {
    use serde_json::Value;
    match (into, from) {
        (Value::Object(a), Value::Object(b)) => {
            for (k, v) in b {
                merge_json(a.entry(k.clone()).or_insert(Value::Null), v);
            }
        }
        (a, b) => *a = b.clone(),
    }
}
