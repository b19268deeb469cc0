//! An in-test heartbeat writer: nodes outside kwok whose Ready condition is posted once and
//! whose Leases the test renews every 2 s (as kwok does here; benchmarks use a kubelet's 10 s), so
//! a set of nodes can fail "in one tick" (their last renewals coincide) and recover on demand.

use anyhow::Result;
use futures::future::join_all;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, Time};
use k8s_openapi::jiff::Timestamp;
use kube::Client;
use kube::api::{Api, Patch, PatchParams, PostParams};
use serde_json::json;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio_util::sync::CancellationToken;

pub struct Heartbeats {
    client: Client,
    alive: Arc<Mutex<BTreeSet<String>>>,
    /// The renewTime each node's Lease last got.
    last: Arc<Mutex<BTreeMap<String, Timestamp>>>,
    /// The renewTime each Lease was created with.
    created: Mutex<BTreeMap<String, Timestamp>>,
    stop: CancellationToken,
    interval: Duration,
}

impl Heartbeats {
    pub fn start(client: Client) -> Heartbeats {
        Heartbeats::every(client, Duration::from_secs(2))
    }

    /// Renews every `interval` (a kubelet renews its 40 s Lease every 10 s).
    pub fn every(client: Client, interval: Duration) -> Heartbeats {
        let alive: Arc<Mutex<BTreeSet<String>>> = Arc::default();
        let last: Arc<Mutex<BTreeMap<String, Timestamp>>> = Arc::default();
        let stop = CancellationToken::new();
        let (a, l, s, c) = (
            Arc::clone(&alive),
            Arc::clone(&last),
            stop.clone(),
            client.clone(),
        );
        tokio::spawn(async move {
            let leases: Api<Lease> = Api::namespaced(c, "kube-node-lease");
            let mut tick = tokio::time::interval(interval);
            loop {
                tokio::select! {
                    _ = s.cancelled() => return,
                    _ = tick.tick() => {}
                }
                let names: Vec<String> = a.lock().expect("alive lock").iter().cloned().collect();
                let now = Timestamp::now();
                let writes = names.iter().map(|n| {
                    let leases = leases.clone();
                    async move {
                        let patch = json!({"spec": {"renewTime": MicroTime(now)}});
                        leases
                            .patch(n, &PatchParams::default(), &Patch::Merge(patch))
                            .await
                            .map(|_| n.clone())
                    }
                });
                // A write that landed is a renewal, even if the node was failed meanwhile.
                for done in join_all(writes).await.into_iter().flatten() {
                    l.lock().expect("last lock").insert(done, now);
                }
            }
        });
        Heartbeats {
            client,
            alive,
            last,
            created: Mutex::default(),
            stop,
            interval,
        }
    }

    /// Posts healthy conditions, as a kubelet does on start and on recovery.
    async fn post_ready(&self, name: &str) -> Result<()> {
        let nodes: Api<Node> = Api::all(self.client.clone());
        let now = Time(Timestamp::now());
        let cond = |t: &str, s: &str, r: &str| json!({"type": t, "status": s, "reason": r, "message": "posted by the test", "lastHeartbeatTime": now, "lastTransitionTime": now});
        let status = json!({"status": {"conditions": [
            cond("Ready", "True", "KubeletReady"),
            cond("MemoryPressure", "False", "KubeletHasSufficientMemory"),
            cond("DiskPressure", "False", "KubeletHasNoDiskPressure"),
            cond("PIDPressure", "False", "KubeletHasSufficientPID")
        ]}});
        nodes
            .patch_status(name, &PatchParams::default(), &Patch::Strategic(status))
            .await?;
        Ok(())
    }

    /// Creates a Ready node in `zone` with a Lease, and keeps renewing it.
    pub async fn add_node(&self, name: &str, zone: &str) -> Result<()> {
        let nodes: Api<Node> = Api::all(self.client.clone());
        let node: Node = serde_json::from_value(json!({
            "metadata": {"name": name, "labels": {"topology.kubernetes.io/zone": zone, "kubernetes.io/hostname": name}}
        }))?;
        nodes.create(&PostParams::default(), &node).await?;
        self.post_ready(name).await?;
        let leases: Api<Lease> = Api::namespaced(self.client.clone(), "kube-node-lease");
        let renewed = Timestamp::now();
        let lease: Lease = serde_json::from_value(json!({
            "metadata": {"name": name},
            "spec": {"holderIdentity": name, "leaseDurationSeconds": 40, "renewTime": MicroTime(renewed)}
        }))?;
        leases.create(&PostParams::default(), &lease).await?;
        self.last
            .lock()
            .expect("last lock")
            .insert(name.to_string(), renewed);
        self.created
            .lock()
            .expect("created lock")
            .insert(name.to_string(), renewed);
        self.alive
            .lock()
            .expect("alive lock")
            .insert(name.to_string());
        Ok(())
    }

    /// Stops renewing `names` right after a tick that renewed all of them, so their last
    /// renewals coincide (a Lease's creation is not such a tick); returns that renewal time.
    pub async fn fail(&self, names: &[String]) -> Timestamp {
        let deadline = tokio::time::Instant::now() + self.interval * 2 + Duration::from_secs(1);
        loop {
            let times: BTreeSet<Timestamp> = {
                let last = self.last.lock().expect("last lock");
                names.iter().filter_map(|n| last.get(n).copied()).collect()
            };
            // One shared renewal: for several nodes equal times imply a tick (creations differ).
            let shared = times.len() == 1 && (names.len() > 1 || self.ticked(names));
            if shared || tokio::time::Instant::now() > deadline {
                let mut alive = self.alive.lock().expect("alive lock");
                for n in names {
                    alive.remove(n);
                }
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        // A renewal in flight may still land: let it, then read the record.
        tokio::time::sleep(Duration::from_millis(1200)).await;
        let last = self.last.lock().expect("last lock");
        names
            .iter()
            .filter_map(|n| last.get(n).copied())
            .max()
            .unwrap_or_else(Timestamp::now)
    }

    /// Whether a tick (not only the Lease's creation) renewed these nodes.
    fn ticked(&self, names: &[String]) -> bool {
        let created = self.created.lock().expect("created lock");
        let last = self.last.lock().expect("last lock");
        names.iter().all(|n| last.get(n) != created.get(n))
    }

    /// The kubelets come back: Leases renewed again and Ready=True posted.
    pub async fn recover(&self, names: &[String]) -> Result<()> {
        {
            let mut alive = self.alive.lock().expect("alive lock");
            for n in names {
                alive.insert(n.clone());
            }
        }
        for n in names {
            self.post_ready(n).await?;
        }
        Ok(())
    }
}

impl Drop for Heartbeats {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}
