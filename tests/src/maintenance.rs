//! NodeMaintenance fixtures (issue 16, spec §6 M*): the CRD from `crds/`, the scenarios' node
//! shape (kwok nodes w1..w3, Deployment `web` one replica per node behind PDB `web-pdb`
//! `maxUnavailable: 1`, DaemonSet `logship`), and reads and waits on a NodeMaintenance's status,
//! conditions and events, and on the eviction requests the audit log saw.

use crate::cluster::Cluster;
use crate::{audit, k8s, unique, wait};
use anyhow::{Context, Result, ensure};
use k8s_openapi::api::apps::v1::{DaemonSet, Deployment};
use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::api::events::v1::Event;
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use k8s_openapi::jiff::Timestamp;
use kube::Client;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use serde_json::{Value, json};
use std::path::Path;
use std::time::Duration;

pub use node_maintenance::types::{self as api, NodeMaintenance};

/// The generated CRD (`pilothouse crd`), relative to the repository root.
pub const CRD_FILE: &str = "crds/nodemaintenances.pilothouse.dev.yaml";
pub const CRD_NAME: &str = "nodemaintenances.pilothouse.dev";
/// The user the audit log names for Pilothouse running as its ServiceAccount.
pub const PILOTHOUSE_USER: &str = "system:serviceaccount:kube-system:pilothouse";
/// The user agent of the node-maintenance controller's requests (Pilothouse's other controllers
/// run as the same user).
pub const NMC_AGENT: &str = "pilothouse/node-maintenance-controller";
/// Label on a shape's nodes (value: the shape's name), selecting its DaemonSet and Deployments.
pub const SHAPE_LABEL: &str = "pilothouse.test/nm-shape";
/// Where events about cluster-scoped objects (NodeMaintenances, Nodes) are written.
pub const CLUSTER_EVENTS_NS: &str = "default";

/// Applies the CRD from `crds/` and waits until the API server has established it.
pub async fn install_crd(cluster: &Cluster) -> Result<()> {
    let path = crate::repo_root().join(CRD_FILE);
    ensure!(
        path.exists(),
        "{} is missing: generate it with `pilothouse crd`",
        path.display()
    );
    // Server-side: the schema is too large for kubectl's last-applied annotation.
    cluster.kubectl(&[
        "apply",
        "--server-side",
        "--force-conflicts",
        "-f",
        &path.to_string_lossy(),
    ])?;
    let crds: Api<CustomResourceDefinition> = Api::all(cluster.client().await?);
    wait::until(
        "the NodeMaintenance CRD Established",
        Duration::from_secs(30),
        Duration::from_millis(100),
        || async {
            let crd = crds.get(CRD_NAME).await?;
            let established = crd
                .status
                .and_then(|s| s.conditions)
                .into_iter()
                .flatten()
                .any(|c| c.type_ == "Established" && c.status == "True");
            Ok(established.then_some(()))
        },
    )
    .await?;
    // The discovery cache of a fresh client may lag the CRD: wait until a list is served.
    let nms: Api<NodeMaintenance> = Api::all(cluster.client().await?);
    wait::until(
        "nodemaintenances served",
        Duration::from_secs(30),
        Duration::from_millis(100),
        || async { Ok(nms.list(&ListParams::default()).await.ok().map(|_| ())) },
    )
    .await
}

/// The kwok taint every pod of the shape tolerates.
pub fn kwok_toleration() -> Value {
    json!({"key": "kwok.x-k8s.io/node", "operator": "Exists", "effect": "NoSchedule"})
}

/// Options of a [`Shape`].
#[derive(Clone, Debug)]
pub struct ShapeOptions {
    /// `terminationGracePeriodSeconds` of `web`'s pods (kwok keeps a deleted pod that long).
    pub web_grace: i64,
    /// Whether to create `web`, `web-pdb` and `logship` at all (the nodes alone otherwise).
    pub workload: bool,
    /// A `NoSchedule` taint key the shape's nodes carry and only its own pods tolerate, to keep
    /// a plane's other workloads off them (the chaos suite's Jobs).
    pub taint: Option<&'static str>,
}

impl Default for ShapeOptions {
    fn default() -> Self {
        ShapeOptions {
            web_grace: 2,
            workload: true,
            taint: None,
        }
    }
}

/// The scenarios' shape, in a namespace and on nodes of its own: nodes w1..w3 (named
/// `<shape>-w1`..), Deployment `web` (3 replicas, one per node), PDB `web-pdb`
/// (`maxUnavailable: 1`) and DaemonSet `logship`.
pub struct Shape {
    pub client: Client,
    pub name: String,
    pub ns: String,
    /// w1, w2, w3.
    pub nodes: Vec<String>,
    pub pods: Api<Pod>,
    pub node_api: Api<Node>,
    taint: Option<&'static str>,
}

impl Shape {
    pub async fn new(cluster: &Cluster, prefix: &str, opts: ShapeOptions) -> Result<Shape> {
        let client = cluster.client().await?;
        let name = unique(prefix);
        let ns = cluster.namespace(prefix).await?;
        k8s::wait_service_account(&client, &ns).await?;
        let nodes: Vec<String> = (1..=3).map(|i| format!("{name}-w{i}")).collect();
        let shape = Shape {
            pods: Api::namespaced(client.clone(), &ns),
            node_api: Api::all(client.clone()),
            client,
            name,
            ns,
            nodes,
            taint: opts.taint,
        };
        futures::future::try_join_all(shape.nodes.iter().map(|n| shape.add_node(n))).await?;
        if opts.workload {
            shape.create_workload(opts.web_grace).await?;
        }
        Ok(shape)
    }

    /// A kwok node of this shape (labelled [`SHAPE_LABEL`]), Ready, with no taint but kwok's and
    /// the shape's own (added once it is Ready: nothing else may be scheduled meanwhile).
    pub async fn add_node(&self, node: &str) -> Result<()> {
        k8s::create_kwok_node(&self.client, node, "zone-nm").await?;
        let patch = json!({"metadata": {"labels": {SHAPE_LABEL: self.name}}});
        self.node_api
            .patch(node, &PatchParams::default(), &Patch::Merge(patch))
            .await?;
        if let Some(key) = self.taint {
            k8s::modify_taints(&self.client, node, |ts| {
                ts.push(k8s::taint(key, "", "NoSchedule"))
            })
            .await?;
        }
        Ok(())
    }

    /// What every pod of the shape tolerates: kwok's taint, and the shape's own if it has one.
    pub fn tolerations(&self) -> Vec<Value> {
        let mut ts = vec![kwok_toleration()];
        if let Some(key) = self.taint {
            ts.push(json!({"key": key, "operator": "Exists", "effect": "NoSchedule"}));
        }
        ts
    }

    pub fn w(&self, i: usize) -> &str {
        &self.nodes[i - 1]
    }

    async fn create_workload(&self, web_grace: i64) -> Result<()> {
        let spread = json!([{
            "maxSkew": 1, "topologyKey": "kubernetes.io/hostname",
            "whenUnsatisfiable": "DoNotSchedule", "nodeTaintsPolicy": "Honor",
            "labelSelector": {"matchLabels": {"app": "web"}}
        }]);
        self.deployment(
            "web",
            3,
            json!({
                "terminationGracePeriodSeconds": web_grace,
                "nodeSelector": {SHAPE_LABEL: self.name},
                "topologySpreadConstraints": spread,
            }),
        )
        .await?;
        self.pdb("web-pdb", json!({"maxUnavailable": 1}), "web")
            .await?;
        let ds: DaemonSet = serde_json::from_value(json!({
            "metadata": {"name": "logship"},
            "spec": {
                "selector": {"matchLabels": {"app": "logship"}},
                "template": {
                    "metadata": {"labels": {"app": "logship"}},
                    "spec": {
                        "nodeSelector": {SHAPE_LABEL: self.name},
                        "tolerations": self.tolerations(),
                        "terminationGracePeriodSeconds": 1,
                        "containers": [{"name": "c", "image": "busybox"}]
                    }
                }
            }
        }))?;
        Api::<DaemonSet>::namespaced(self.client.clone(), &self.ns)
            .create(&PostParams::default(), &ds)
            .await?;
        // web: one ready replica per node; logship: one running pod per node.
        wait::until(
            "web on w1, w2, w3 and logship on each",
            Duration::from_secs(90),
            Duration::from_millis(250),
            || async {
                let pods = self.pods.list(&ListParams::default()).await?.items;
                let on = |app: &str| -> Vec<String> {
                    let mut v: Vec<String> = pods
                        .iter()
                        .filter(|p| label(p, "app") == Some(app) && is_ready(p))
                        .filter_map(|p| p.spec.as_ref()?.node_name.clone())
                        .collect();
                    v.sort();
                    v
                };
                Ok((on("web") == self.nodes && on("logship") == self.nodes).then_some(()))
            },
        )
        .await?;
        self.wait_pdb_allows("web-pdb", 1).await?;
        Ok(())
    }

    /// A Deployment `name` (`app: name`) whose pods tolerate kwok; `pod_spec` is merged into the
    /// template's spec (a container `c` is added).
    pub async fn deployment(&self, name: &str, replicas: i32, pod_spec: Value) -> Result<()> {
        let mut spec = pod_spec;
        spec["containers"] = json!([{"name": "c", "image": "busybox"}]);
        let mut tolerations = spec["tolerations"].as_array().cloned().unwrap_or_default();
        tolerations.extend(self.tolerations());
        spec["tolerations"] = Value::Array(tolerations);
        let d: Deployment = serde_json::from_value(json!({
            "metadata": {"name": name},
            "spec": {
                "replicas": replicas,
                "selector": {"matchLabels": {"app": name}},
                "template": {"metadata": {"labels": {"app": name}}, "spec": spec}
            }
        }))?;
        Api::<Deployment>::namespaced(self.client.clone(), &self.ns)
            .create(&PostParams::default(), &d)
            .await
            .with_context(|| format!("creating Deployment {name}"))?;
        Ok(())
    }

    /// Pod spec pieces placing a pod on this shape's nodes, preferring `node`.
    pub fn prefer(&self, node: &str) -> Value {
        json!({
            "nodeSelector": {SHAPE_LABEL: self.name},
            "affinity": {"nodeAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [{
                "weight": 100,
                "preference": {"matchExpressions": [
                    {"key": "kubernetes.io/hostname", "operator": "In", "values": [node]}]}
            }]}}
        })
    }

    pub async fn scale(&self, name: &str, replicas: i32) -> Result<()> {
        Api::<Deployment>::namespaced(self.client.clone(), &self.ns)
            .patch(
                name,
                &PatchParams::default(),
                &Patch::Merge(json!({"spec": {"replicas": replicas}})),
            )
            .await?;
        Ok(())
    }

    /// A PodDisruptionBudget `name` over `app: <app>`; `spec` holds minAvailable/maxUnavailable.
    pub async fn pdb(&self, name: &str, spec: Value, app: &str) -> Result<()> {
        let mut spec = spec;
        spec["selector"] = json!({"matchLabels": {"app": app}});
        let pdb: PodDisruptionBudget =
            serde_json::from_value(json!({"metadata": {"name": name}, "spec": spec}))?;
        self.pdbs().create(&PostParams::default(), &pdb).await?;
        Ok(())
    }

    pub fn pdbs(&self) -> Api<PodDisruptionBudget> {
        Api::namespaced(self.client.clone(), &self.ns)
    }

    /// Waits until the disruption controller has observed `name` and allows `allowed`.
    pub async fn wait_pdb_allows(&self, name: &str, allowed: i32) -> Result<PodDisruptionBudget> {
        let pdbs = self.pdbs();
        wait::until(
            &format!("PDB {name} observed with disruptionsAllowed={allowed}"),
            Duration::from_secs(60),
            Duration::from_millis(100),
            || async {
                let pdb = pdbs.get(name).await?;
                let generation = pdb.metadata.generation;
                let st = pdb.status.clone().unwrap_or_default();
                Ok((st.observed_generation == generation
                    && st.disruptions_allowed == Some(allowed))
                .then_some(pdb))
            },
        )
        .await
    }

    /// A pod bound to `node` without a controller (kubectl's "unreplicated"); `extra` is merged
    /// into its spec (a container `c` and the kwok toleration are added).
    pub async fn bare_pod(&self, name: &str, node: &str, extra: Value) -> Result<Pod> {
        self.bare_pod_with(name, node, json!({}), extra).await
    }

    /// [`Shape::bare_pod`] with `metadata` merged in (labels, annotations).
    pub async fn bare_pod_with(
        &self,
        name: &str,
        node: &str,
        metadata: Value,
        extra: Value,
    ) -> Result<Pod> {
        let mut spec = extra;
        spec["nodeName"] = json!(node);
        spec["tolerations"] = json!(self.tolerations());
        if spec.get("containers").is_none() {
            spec["containers"] = json!([{"name": "c", "image": "busybox"}]);
        }
        if spec.get("terminationGracePeriodSeconds").is_none() {
            spec["terminationGracePeriodSeconds"] = json!(2);
        }
        let mut meta = metadata;
        meta["name"] = json!(name);
        let pod: Pod = serde_json::from_value(json!({"metadata": meta, "spec": spec}))?;
        Ok(self.pods.create(&PostParams::default(), &pod).await?)
    }

    /// Waits until pod `name` is Running and Ready.
    pub async fn wait_pod_ready(&self, name: &str) -> Result<Pod> {
        wait::until(
            &format!("pod {name} ready"),
            Duration::from_secs(60),
            Duration::from_millis(100),
            || async { Ok(self.pods.get_opt(name).await?.filter(is_ready)) },
        )
        .await
    }

    /// The namespace's pods on `node` (terminating ones included).
    pub async fn pods_on(&self, node: &str) -> Result<Vec<Pod>> {
        Ok(self
            .pods
            .list(&ListParams::default().fields(&format!("spec.nodeName={node}")))
            .await?
            .items)
    }

    /// The pods of `app` on `node`.
    pub async fn app_on(&self, app: &str, node: &str) -> Result<Vec<Pod>> {
        Ok(self
            .pods_on(node)
            .await?
            .into_iter()
            .filter(|p| label(p, "app") == Some(app))
            .collect())
    }

    /// The one ready pod of `app` on `node`.
    pub async fn wait_app_on(&self, app: &str, node: &str) -> Result<Pod> {
        wait::until(
            &format!("a ready {app} pod on {node}"),
            Duration::from_secs(60),
            Duration::from_millis(200),
            || async {
                Ok(self
                    .app_on(app, node)
                    .await?
                    .into_iter()
                    .find(|p| is_ready(p) && p.metadata.deletion_timestamp.is_none()))
            },
        )
        .await
    }

    pub async fn node(&self, name: &str) -> Result<Node> {
        Ok(self.node_api.get(name).await?)
    }

    /// Removes the namespace and the nodes (best effort: a failed test keeps its objects).
    pub async fn cleanup(self, cluster: &Cluster) -> Result<()> {
        for n in &self.nodes {
            k8s::delete_node(&self.client, n).await?;
        }
        cluster.delete_namespace(&self.ns).await
    }
}

pub fn label<'a>(p: &'a Pod, key: &str) -> Option<&'a str> {
    p.metadata.labels.as_ref()?.get(key).map(String::as_str)
}

pub fn is_ready(p: &Pod) -> bool {
    k8s::condition(p, "Ready").is_some_and(|c| c.status == "True")
}

pub fn name_of(p: &Pod) -> String {
    p.metadata.name.clone().unwrap_or_default()
}

/// The node fields a maintenance writes: (`spec.unschedulable`, maintenance taint present,
/// pre-maintenance annotation).
pub fn cordon_state(node: &Node) -> (bool, bool, Option<String>) {
    let unschedulable = node
        .spec
        .as_ref()
        .and_then(|s| s.unschedulable)
        .unwrap_or(false);
    let tainted = k8s::has_taint(node, api::TAINT_MAINTENANCE, "NoSchedule");
    let annotation = node
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(api::ANNOTATION_PRE_MAINTENANCE_UNSCHEDULABLE))
        .cloned();
    (unschedulable, tainted, annotation)
}

/// NodeMaintenance objects: create, read, wait, and their events.
#[derive(Clone)]
pub struct Maintenances {
    pub client: Client,
    pub api: Api<NodeMaintenance>,
}

impl Maintenances {
    pub fn new(client: Client) -> Maintenances {
        Maintenances {
            api: Api::all(client.clone()),
            client,
        }
    }

    /// Creates `name` with `spec` (JSON, as a user writes it; the API server defaults the rest).
    pub async fn create(&self, name: &str, spec: Value) -> Result<NodeMaintenance> {
        let obj = json!({
            "apiVersion": "pilothouse.dev/v1alpha1", "kind": "NodeMaintenance",
            "metadata": {"name": name}, "spec": spec
        });
        // Posted as written, so that fields the user leaves out are defaulted by the API server.
        let ar = kube::core::ApiResource::erase::<NodeMaintenance>(&());
        let dynamic: Api<kube::core::DynamicObject> = Api::all_with(self.client.clone(), &ar);
        let created = dynamic
            .create(&PostParams::default(), &serde_json::from_value(obj)?)
            .await
            .with_context(|| format!("creating NodeMaintenance {name}"))?;
        Ok(serde_json::from_value(serde_json::to_value(created)?)?)
    }

    pub async fn get(&self, name: &str) -> Result<NodeMaintenance> {
        Ok(self.api.get(name).await?)
    }

    pub async fn get_opt(&self, name: &str) -> Result<Option<NodeMaintenance>> {
        Ok(self.api.get_opt(name).await?)
    }

    /// Merge-patches the spec.
    pub async fn patch_spec(&self, name: &str, spec: Value) -> Result<NodeMaintenance> {
        Ok(self
            .api
            .patch(
                name,
                &PatchParams::default(),
                &Patch::Merge(json!({"spec": spec})),
            )
            .await?)
    }

    pub async fn delete(&self, name: &str) -> Result<()> {
        self.api.delete(name, &DeleteParams::default()).await?;
        Ok(())
    }

    /// Polls `name` (every 100 ms) until `f` returns `Some`.
    pub async fn wait<T>(
        &self,
        name: &str,
        what: &str,
        timeout: Duration,
        f: impl Fn(&NodeMaintenance) -> Option<T>,
    ) -> Result<T> {
        let last = std::sync::Mutex::new(None);
        let r = wait::until(
            &format!("NodeMaintenance {name}: {what}"),
            timeout,
            Duration::from_millis(100),
            || async {
                let nm = self.api.get(name).await?;
                let v = f(&nm);
                *last.lock().expect("last lock") = Some(nm);
                Ok(v)
            },
        )
        .await;
        let last = last.into_inner().expect("last lock");
        r.with_context(|| format!("last seen: {}", describe(last.as_ref())))
    }

    /// Waits until condition `type_` has `status` and `reason`.
    pub async fn wait_condition(
        &self,
        name: &str,
        type_: &str,
        status: &str,
        reason: &str,
        timeout: Duration,
    ) -> Result<NodeMaintenance> {
        self.wait(name, &format!("{type_}={status}/{reason}"), timeout, |nm| {
            condition(nm, type_)
                .is_some_and(|c| c.status == status && c.reason == reason)
                .then(|| nm.clone())
        })
        .await
    }

    pub async fn wait_phase(
        &self,
        name: &str,
        phase: api::Phase,
        timeout: Duration,
    ) -> Result<NodeMaintenance> {
        self.wait(name, &format!("phase {}", phase.as_str()), timeout, |nm| {
            (phase_of(nm) == Some(phase)).then(|| nm.clone())
        })
        .await
    }

    pub async fn wait_gone(&self, name: &str, timeout: Duration) -> Result<()> {
        wait::until(
            &format!("NodeMaintenance {name} gone"),
            timeout,
            Duration::from_millis(100),
            || async { Ok(self.api.get_opt(name).await?.is_none().then_some(())) },
        )
        .await
    }

    /// Events with `reason` about `name` (an object in `ns`, or a cluster-scoped one in
    /// [`CLUSTER_EVENTS_NS`]) of `kind`.
    pub async fn events(
        &self,
        ns: &str,
        kind: &str,
        name: &str,
        reason: &str,
    ) -> Result<Vec<Event>> {
        Ok(k8s::events(&self.client, ns, name, reason)
            .await?
            .into_iter()
            .filter(|e| e.regarding.as_ref().and_then(|r| r.kind.as_deref()) == Some(kind))
            .collect())
    }

    /// Waits until at least `n` events with `reason` about `name` exist (events may trail the
    /// writes they describe by seconds under the shared budget).
    pub async fn wait_events(
        &self,
        ns: &str,
        kind: &str,
        name: &str,
        reason: &str,
        n: usize,
    ) -> Result<Vec<Event>> {
        wait::until(
            &format!("{n} {reason} event(s) about {kind} {name}"),
            Duration::from_secs(60),
            Duration::from_millis(250),
            || async {
                let ev = self.events(ns, kind, name, reason).await?;
                Ok((ev.len() >= n).then_some(ev))
            },
        )
        .await
    }
}

pub fn condition<'a>(nm: &'a NodeMaintenance, type_: &str) -> Option<&'a Condition> {
    nm.status
        .as_ref()?
        .conditions
        .iter()
        .find(|c| c.type_ == type_)
}

pub fn phase_of(nm: &NodeMaintenance) -> Option<api::Phase> {
    nm.status.as_ref()?.phase
}

pub fn progress(nm: &NodeMaintenance) -> api::Progress {
    nm.status
        .as_ref()
        .and_then(|s| s.progress.clone())
        .unwrap_or_default()
}

/// The `targetedPods` entry of `ns/name`.
pub fn target<'a>(nm: &'a NodeMaintenance, ns: &str, name: &str) -> Option<&'a api::TargetedPod> {
    nm.status
        .as_ref()?
        .targeted_pods
        .iter()
        .find(|t| t.namespace == ns && t.name == name)
}

pub fn has_finalizer(nm: &NodeMaintenance) -> bool {
    nm.metadata
        .finalizers
        .iter()
        .flatten()
        .any(|f| f == api::FINALIZER)
}

/// A short account of a status for failure messages.
pub fn describe(nm: Option<&NodeMaintenance>) -> String {
    match nm {
        None => "never read".into(),
        Some(nm) => serde_json::to_string(&json!({
            "finalizers": nm.metadata.finalizers,
            "deletionTimestamp": nm.metadata.deletion_timestamp,
            "status": nm.status,
        }))
        .unwrap_or_default(),
    }
}

/// An eviction request the audit log saw: when, by whom, answered with what.
#[derive(Clone, Debug)]
pub struct EvictionRequest {
    pub received: Timestamp,
    pub user: String,
    pub code: u16,
}

/// Every eviction request for pod `ns/name` in the audit log, oldest first (the log is written
/// in batches: a request of the last second or so may not be there yet).
pub fn eviction_requests(log: &Path, ns: &str, name: &str) -> Result<Vec<EvictionRequest>> {
    let uri = format!("/api/v1/namespaces/{ns}/pods/{name}/eviction");
    Ok(audit::read(log)?
        .into_iter()
        .filter(|e| e.stage == "ResponseComplete" && e.verb == "create")
        .filter(|e| e.request_uri.split('?').next() == Some(uri.as_str()))
        .filter_map(|e| {
            Some(EvictionRequest {
                received: e.received()?,
                user: e.user.username.clone(),
                code: e.response_status.as_ref()?.code?,
            })
        })
        .collect())
}

/// Requests of Pilothouse's node-maintenance controller (user [`PILOTHOUSE_USER`], agent
/// [`NMC_AGENT`]) to `path` or below it (e.g. a node, a pod's status), with their verb, oldest
/// first.
pub fn controller_requests(log: &Path, path: &str) -> Result<Vec<(Timestamp, String)>> {
    Ok(audit::read(log)?
        .into_iter()
        .filter(|e| e.stage == "ResponseComplete" && e.user.username == PILOTHOUSE_USER)
        .filter(|e| e.user_agent.contains(NMC_AGENT))
        .filter(|e| {
            let p = e.request_uri.split('?').next().unwrap_or_default();
            p == path || p.starts_with(&format!("{path}/"))
        })
        .filter_map(|e| Some((e.received()?, e.verb.clone())))
        .collect())
}
