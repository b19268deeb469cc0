//! End-to-end tests of `statefulset-controller` (spec §2, scenarios S1..S17), against a local
//! control plane whose kube-controller-manager runs everything but the StatefulSet controller,
//! with one Pilothouse running only that controller as the `kube-system/pilothouse`
//! ServiceAccount with the shipped RBAC. Each test owns a namespace; pods run on the shared kwok
//! nodes, which turn them Running and Ready.

use anyhow::{Context, Result, ensure};
use futures::StreamExt;
use k8s_openapi::api::apps::v1::{ControllerRevision, StatefulSet};
use k8s_openapi::api::core::v1::Pod;
use kube::Client;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::runtime::{WatchStreamExt, watcher};
use pilothouse_tests::cluster::ClusterOptions;
use pilothouse_tests::harness::{SuitePilothouse, cluster, trial};
use pilothouse_tests::webhook::{Match, Webhook};
use pilothouse_tests::{audit, k8s, wait};
use serde_json::{Value, json};
use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

struct Ns {
    client: Client,
    ns: String,
    sets: Api<StatefulSet>,
    pods: Api<Pod>,
    revisions: Api<ControllerRevision>,
}

async fn ns(prefix: &str) -> Result<Ns> {
    let client = cluster().client().await?;
    let ns = cluster().namespace(prefix).await?;
    k8s::wait_service_account(&client, &ns).await?;
    Ok(Ns {
        sets: Api::namespaced(client.clone(), &ns),
        pods: Api::namespaced(client.clone(), &ns),
        revisions: Api::namespaced(client.clone(), &ns),
        client,
        ns,
    })
}

fn set(name: &str, replicas: i32, extra: Value) -> Result<StatefulSet> {
    let mut v = k8s::stateful_set(name, replicas);
    k8s::merge_json(&mut v["spec"], &extra);
    Ok(serde_json::from_value(v)?)
}

impl Ns {
    async fn create(&self, s: &StatefulSet) -> Result<()> {
        self.sets.create(&PostParams::default(), s).await?;
        Ok(())
    }

    /// Pods of the set by name, with their revision label.
    async fn pods_of(&self, set: &str) -> Result<Vec<(String, String, bool)>> {
        let mut out: Vec<_> = self
            .pods
            .list(&ListParams::default().labels(&format!("app={set}")))
            .await?
            .items
            .into_iter()
            .map(|p| {
                let rev = p
                    .metadata
                    .labels
                    .as_ref()
                    .and_then(|l| l.get("controller-revision-hash").cloned())
                    .unwrap_or_default();
                (
                    p.metadata.name.clone().unwrap_or_default(),
                    rev,
                    p.metadata.deletion_timestamp.is_some(),
                )
            })
            .collect();
        out.sort();
        Ok(out)
    }

    async fn status(&self, set: &str) -> Result<Value> {
        Ok(serde_json::to_value(self.sets.get(set).await?.status)?)
    }

    /// Waits until the set's status satisfies `ok`.
    async fn until_status(
        &self,
        set: &str,
        what: &str,
        secs: u64,
        ok: impl Fn(&Value) -> bool,
    ) -> Result<Value> {
        wait::until(
            what,
            Duration::from_secs(secs),
            Duration::from_millis(200),
            || async {
                let s = self.status(set).await?;
                Ok(ok(&s).then_some(s))
            },
        )
        .await
        .with_context(|| format!("{set}: {what}"))
    }

    async fn patch_spec(&self, set: &str, spec: Value) -> Result<()> {
        self.sets
            .patch(
                set,
                &PatchParams::default(),
                &Patch::Merge(json!({"spec": spec})),
            )
            .await?;
        Ok(())
    }

    async fn revision_names(&self, set: &str) -> Result<Vec<(String, i64)>> {
        let mut out: Vec<_> = self
            .revisions
            .list(&ListParams::default().labels(&format!("app={set}")))
            .await?
            .items
            .into_iter()
            .map(|r| (r.metadata.name.unwrap_or_default(), r.revision.unwrap_or(0)))
            .collect();
        out.sort_by_key(|r| r.1);
        Ok(out)
    }
}

fn all_ready(want: i64) -> impl Fn(&Value) -> bool {
    move |s| {
        s["readyReplicas"].as_i64() == Some(want)
            && s["availableReplicas"].as_i64() == Some(want)
            && s["currentRevision"] == s["updateRevision"]
            && s["updatedReplicas"].as_i64() == Some(want)
    }
}

/// S1 (the parts kwok's always-Ready pods allow): OrderedReady creates web-0, web-1, web-2 in
/// order, each after the previous is Ready; scaling to 0 deletes 2, 1, 0, each after the
/// previous is gone.
async fn s1_ordered() -> Result<()> {
    let n = ns("s1").await?;
    n.create(&set("web", 3, json!({}))?).await?;
    // While they come up: the pods are always web-0..k with at most the last one not Ready.
    let bad = std::cell::RefCell::new(None);
    wait::until(
        "3 ready, one at a time",
        Duration::from_secs(60),
        Duration::from_millis(50),
        || async {
            let views = n.views("web").await?;
            let prefix = views
                .iter()
                .enumerate()
                .all(|(i, v)| v.name == format!("web-{i}"));
            let unready = views.iter().filter(|v| v.ready_since.is_none()).count();
            let last_unready = views.last().is_some_and(|v| v.ready_since.is_none());
            if !prefix || unready > 1 || (unready == 1 && !last_unready) {
                *bad.borrow_mut() = Some(format!("{views:#?}"));
                return Ok(Some(()));
            }
            Ok((views.len() == 3 && unready == 0).then_some(()))
        },
    )
    .await?;
    if let Some(v) = bad.into_inner() {
        anyhow::bail!("not one at a time: {v}");
    }
    n.until_status("web", "3 ready", 60, all_ready(3)).await?;
    let pods = n
        .pods
        .list(&ListParams::default().labels("app=web"))
        .await?
        .items;
    let mut created: Vec<(String, k8s_openapi::jiff::Timestamp)> = pods
        .iter()
        .map(|p| {
            (
                p.metadata.name.clone().unwrap(),
                p.metadata.creation_timestamp.clone().unwrap().0,
            )
        })
        .collect();
    created.sort_by_key(|c| c.1);
    let order: Vec<&str> = created.iter().map(|c| c.0.as_str()).collect();
    ensure!(
        order == ["web-0", "web-1", "web-2"],
        "creation order {order:?}"
    );
    for p in &pods {
        let name = p.metadata.name.clone().unwrap();
        let labels = p.metadata.labels.clone().unwrap_or_default();
        ensure!(
            labels.get("statefulset.kubernetes.io/pod-name") == Some(&name),
            "{labels:?}"
        );
        ensure!(
            labels.contains_key("apps.kubernetes.io/pod-index"),
            "{labels:?}"
        );
        let spec = p.spec.clone().unwrap();
        ensure!(spec.hostname.as_deref() == Some(name.as_str()));
        ensure!(spec.subdomain.as_deref() == Some("web"));
    }
    n.patch_spec("web", json!({"replicas": 0})).await?;
    // Scale-down order: each pod goes only after the higher one is gone.
    let gone_order = std::cell::RefCell::new(Vec::new());
    let two_going = std::cell::RefCell::new(None);
    wait::until(
        "all pods gone",
        Duration::from_secs(90),
        Duration::from_millis(100),
        || async {
            let pods = n.pods_of("web").await?;
            if pods.iter().filter(|p| p.2).count() > 1 {
                *two_going.borrow_mut() = Some(format!("{pods:?}"));
                return Ok(Some(()));
            }
            let now: Vec<String> = pods.into_iter().map(|p| p.0).collect();
            let mut gone = gone_order.borrow_mut();
            for name in ["web-2", "web-1", "web-0"] {
                if !now.contains(&name.to_string()) && !gone.contains(&name.to_string()) {
                    gone.push(name.to_string());
                }
            }
            Ok(now.is_empty().then_some(()))
        },
    )
    .await?;
    if let Some(p) = two_going.into_inner() {
        anyhow::bail!("more than one pod going at once: {p}");
    }
    let gone_order = gone_order.into_inner();
    ensure!(
        gone_order == ["web-2", "web-1", "web-0"],
        "deletion order {gone_order:?}"
    );
    n.until_status("web", "replicas 0", 30, |s| {
        s["replicas"].as_i64().unwrap_or(0) == 0
    })
    .await?;
    Ok(())
}

/// S2: Parallel creates all pods without waiting; scaling to 0 deletes them all.
async fn s2_parallel() -> Result<()> {
    let n = ns("s2").await?;
    n.create(&set("web", 5, json!({"podManagementPolicy": "Parallel"}))?)
        .await?;
    n.until_status("web", "5 ready", 60, all_ready(5)).await?;
    n.patch_spec("web", json!({"replicas": 0})).await?;
    wait::until(
        "all pods gone",
        Duration::from_secs(60),
        Duration::from_millis(200),
        || async { Ok(n.pods_of("web").await?.is_empty().then_some(())) },
    )
    .await?;
    Ok(())
}

/// S3: partition 3 of 5 updates web-4 and web-3 only; a deleted web-1 returns at the old
/// revision; partition 0 finishes; reverting the template reuses the old revision (rollback:
/// its number bumps, no new revision).
async fn s3_partition_and_rollback() -> Result<()> {
    let n = ns("s3").await?;
    n.create(&set(
        "web",
        5,
        json!({"updateStrategy": {"type": "RollingUpdate", "rollingUpdate": {"partition": 3}}}),
    )?)
    .await?;
    let first = n.until_status("web", "5 ready", 90, all_ready(5)).await?;
    let old = first["updateRevision"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    n.patch_spec(
        "web",
        json!({"template": {"spec": {"containers": [{"name": "c", "image": "nginx:2"}]}}}),
    )
    .await?;
    let s = n
        .until_status("web", "2 updated", 90, |s| {
            s["updatedReplicas"].as_i64() == Some(2) && s["readyReplicas"].as_i64() == Some(5)
        })
        .await?;
    let new = s["updateRevision"].as_str().unwrap_or_default().to_string();
    ensure!(new != old && s["currentRevision"] == old.as_str(), "{s}");
    let pods = n.pods_of("web").await?;
    for (name, rev, _) in &pods {
        let want = if name == "web-3" || name == "web-4" {
            &new
        } else {
            &old
        };
        ensure!(rev == want, "{name} at {rev}, want {want}: {pods:?}");
    }
    // Below the partition a deleted pod returns at the current (old) revision.
    n.pods.delete("web-1", &DeleteParams::default()).await?;
    wait::until(
        "web-1 back at the old revision",
        Duration::from_secs(60),
        Duration::from_millis(200),
        || async {
            let p = n.pods.get_opt("web-1").await?;
            Ok(p.filter(|p| {
                p.metadata.deletion_timestamp.is_none()
                    && p.metadata
                        .labels
                        .as_ref()
                        .and_then(|l| l.get("controller-revision-hash"))
                        == Some(&old)
            })
            .map(|_| ()))
        },
    )
    .await?;
    n.patch_spec(
        "web",
        json!({"updateStrategy": {"rollingUpdate": {"partition": 0}}}),
    )
    .await?;
    let done = n
        .until_status("web", "rollout complete", 120, all_ready(5))
        .await?;
    ensure!(done["currentRevision"] == new.as_str(), "{done}");
    // Revert: the old revision is reused with a bumped number, nothing new is created.
    let before = n.revision_names("web").await?;
    n.patch_spec(
        "web",
        json!({"template": {"spec": {"containers": [{"name": "c", "image": "nginx:1"}]}}}),
    )
    .await?;
    let back = n
        .until_status("web", "back on the old revision", 60, |s| {
            s["updateRevision"] == old.as_str()
        })
        .await?;
    let after = n.revision_names("web").await?;
    ensure!(
        after.len() == before.len(),
        "revisions {before:?} -> {after:?}"
    );
    let max_before = before.iter().map(|r| r.1).max().unwrap_or(0);
    ensure!(
        after
            .iter()
            .any(|(name, num)| *name == old && *num == max_before + 1),
        "rollback did not bump {old}: {after:?} ({back})"
    );
    n.until_status("web", "rolled back", 120, all_ready(5))
        .await?;
    Ok(())
}

/// S4: OrderedReady with maxUnavailable 2: an image change replaces two pods at a time, never
/// more than 2 unavailable (missing, going or not yet Ready), and the rollout completes.
async fn s4_ordered_budget() -> Result<()> {
    let n = ns("s4").await?;
    n.create(&set("web", 5, json!({"updateStrategy": {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": 2}}}))?)
        .await?;
    let first = n.until_status("web", "5 ready", 90, all_ready(5)).await?;
    let old = first["updateRevision"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    n.patch_spec(
        "web",
        json!({"template": {"spec": {"containers": [{"name": "c", "image": "nginx:2"}]}}}),
    )
    .await?;
    n.until_status("web", "a new update revision", 30, |s| {
        s["updateRevision"] != old.as_str()
    })
    .await?;
    // Down = missing, going, or not Ready (a recreated pod counts until it is Ready).
    let all = ["web-0", "web-1", "web-2", "web-3", "web-4"];
    let (most, _) = follow_rollout(&n, "web", &all, 0.0, 5, &old).await?;
    // Two pods at a time (M = 2), never more; with M = 1 never two.
    ensure!(most == 2, "{most} pods down at once, budget 2");
    Ok(())
}

/// S8: OnDelete: a template change deletes nothing; a deleted pod returns at the update
/// revision; the current revision stays.
async fn s8_on_delete() -> Result<()> {
    let n = ns("s8").await?;
    n.create(&set(
        "web",
        3,
        json!({"updateStrategy": {"type": "OnDelete"}}),
    )?)
    .await?;
    let first = n.until_status("web", "3 ready", 60, all_ready(3)).await?;
    let old = first["currentRevision"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    n.patch_spec(
        "web",
        json!({"template": {"spec": {"containers": [{"name": "c", "image": "nginx:2"}]}}}),
    )
    .await?;
    let s = n
        .until_status("web", "new update revision", 30, |s| {
            s["updateRevision"] != old.as_str()
        })
        .await?;
    let new = s["updateRevision"].as_str().unwrap_or_default().to_string();
    tokio::time::sleep(Duration::from_secs(3)).await;
    let pods = n.pods_of("web").await?;
    ensure!(
        pods.iter().all(|p| p.1 == old && !p.2),
        "OnDelete replaced pods: {pods:?}"
    );
    n.pods.delete("web-2", &DeleteParams::default()).await?;
    let s = n
        .until_status("web", "web-2 back updated", 60, |s| {
            s["updatedReplicas"].as_i64() == Some(1) && s["readyReplicas"].as_i64() == Some(3)
        })
        .await?;
    ensure!(s["currentRevision"] == old.as_str(), "{s}");
    let pods = n.pods_of("web").await?;
    ensure!(
        pods.iter().any(|p| p.0 == "web-2" && p.1 == new),
        "{pods:?}"
    );
    Ok(())
}

/// ST-R (KEP-3541; the plane's API server and this suite's Pilothouse have
/// StatefulSetRecreateStrategy on): a template change of a `Recreate` set deletes its three old
/// pods, and no pod of the new revision exists until every old one is gone. Seen on a watch, in
/// the API server's order. The set then completes on the new revision with Progressing False
/// `RecreateCompleted`.
async fn s_r_recreate() -> Result<()> {
    let n = ns("sr").await?;
    n.create(&set(
        "web",
        3,
        json!({"updateStrategy": {"type": "Recreate"}}),
    )?)
    .await?;
    let first = n.until_status("web", "3 ready", 60, all_ready(3)).await?;
    let old = first["currentRevision"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    // Every pod event from now on, in order: (pod, revision, deleted).
    let seen: Arc<Mutex<Vec<(String, String, bool)>>> = Arc::default();
    let watch = {
        let (seen, api) = (Arc::clone(&seen), n.pods.clone());
        tokio::spawn(async move {
            let stream = watcher::watcher(api, watcher::Config::default()).default_backoff();
            futures::pin_mut!(stream);
            while let Some(ev) = stream.next().await {
                let (p, gone) = match ev {
                    Ok(watcher::Event::Apply(p) | watcher::Event::InitApply(p)) => (p, false),
                    Ok(watcher::Event::Delete(p)) => (p, true),
                    _ => continue,
                };
                let rev = p
                    .metadata
                    .labels
                    .as_ref()
                    .and_then(|l| l.get("controller-revision-hash").cloned())
                    .unwrap_or_default();
                let name = p.metadata.name.clone().unwrap_or_default();
                seen.lock().expect("seen").push((name, rev, gone));
            }
        })
    };
    tokio::time::sleep(Duration::from_secs(1)).await;
    n.patch_spec(
        "web",
        json!({"template": {"spec": {"containers": [{"name": "c", "image": "nginx:2"}]}}}),
    )
    .await?;
    let done = n
        .until_status("web", "recreated on the new revision", 90, |s| {
            all_ready(3)(s) && s["currentRevision"] != old.as_str()
        })
        .await?;
    watch.abort();
    let events = seen.lock().expect("seen").clone();
    let mut old_left: BTreeSet<String> = ["web-0", "web-1", "web-2"]
        .iter()
        .map(|s| s.to_string())
        .collect();
    for (name, rev, gone) in &events {
        if rev == &old && *gone {
            old_left.remove(name);
        } else if rev != &old && !rev.is_empty() {
            ensure!(
                old_left.is_empty(),
                "{name} of the new revision appeared while {old_left:?} of the old one remained: {events:?}"
            );
        }
    }
    ensure!(old_left.is_empty(), "old pods never deleted: {old_left:?}");
    let progressing = done["conditions"]
        .as_array()
        .and_then(|cs| cs.iter().find(|c| c["type"] == "Progressing"))
        .cloned()
        .unwrap_or_default();
    ensure!(
        progressing["status"] == "False" && progressing["reason"] == "RecreateCompleted",
        "Progressing: {progressing}"
    );
    Ok(())
}

/// S12: an orphan `web-3` matching the selector is adopted, `foo-0` (another name) is not;
/// web-0 losing a selector label is released.
async fn s12_adoption() -> Result<()> {
    let n = ns("s12").await?;
    let orphan = |name: &str| -> Result<Pod> {
        Ok(serde_json::from_value(json!({
            "metadata": {"name": name, "labels": {"app": "web"}},
            "spec": {
                "tolerations": [{"key": "kwok.x-k8s.io/node", "operator": "Exists", "effect": "NoSchedule"}],
                "containers": [{"name": "c", "image": "nginx:1"}]
            }
        }))?)
    };
    n.pods
        .create(&PostParams::default(), &orphan("web-3")?)
        .await?;
    n.pods
        .create(&PostParams::default(), &orphan("foo-0")?)
        .await?;
    n.create(&set("web", 4, json!({"podManagementPolicy": "Parallel"}))?)
        .await?;
    let owner = |p: &Pod| {
        p.metadata
            .owner_references
            .iter()
            .flatten()
            .find(|r| r.controller == Some(true))
            .map(|r| r.name.clone())
    };
    wait::until(
        "web-3 adopted",
        Duration::from_secs(60),
        Duration::from_millis(200),
        || async {
            let p = n.pods.get("web-3").await?;
            Ok((owner(&p).as_deref() == Some("web")).then_some(()))
        },
    )
    .await?;
    n.until_status("web", "4 ready", 60, |s| {
        s["readyReplicas"].as_i64() == Some(4)
    })
    .await?;
    ensure!(
        owner(&n.pods.get("foo-0").await?).is_none(),
        "foo-0 was adopted"
    );
    // Release: web-0 stops matching.
    n.relabel_until("web-0", "other", "released", |p| owner(p).is_none())
        .await?;
    // The name is taken: recreating web-0 hits AlreadyExists (no event, as upstream), and the
    // released pod is left alone.
    let released = n.pods.get("web-0").await?.metadata.uid;
    tokio::time::sleep(Duration::from_secs(3)).await;
    let still = n.pods.get("web-0").await?;
    ensure!(
        still.metadata.uid == released
            && owner(&still).is_none()
            && still.metadata.deletion_timestamp.is_none(),
        "the released web-0 was touched: {:?}",
        still.metadata
    );
    // The label returns: adopted again, same pod.
    n.relabel_until("web-0", "web", "re-adopted", |p| {
        owner(p).as_deref() == Some("web") && p.metadata.uid == released
    })
    .await?;
    n.until_status("web", "4 ready again", 60, |s| {
        s["readyReplicas"].as_i64() == Some(4)
    })
    .await?;
    // Events yield to object writes: with the suite's sets syncing at once they may come
    // seconds after the pods (at most a tenth of a saturated budget).
    k8s::wait_events(
        &n.client,
        &n.ns,
        "web",
        "SuccessfulCreate",
        Duration::from_secs(60),
        |e| !e.is_empty(),
    )
    .await?;
    let failed = k8s::events(&n.client, &n.ns, "web", "FailedCreate").await?;
    ensure!(failed.is_empty(), "AlreadyExists drew an event: {failed:?}");
    Ok(())
}

/// S10 (retention, ST-32..ST-34): claims precede their pods with the template's and the
/// selector's labels and no owner under Retain, bind (the test provisioner) and their pods turn
/// Ready; a deleted pod returns on the same claim; whenScaled Delete gives a condemned pod's claims a reference to
/// it before it goes, so they go with it; whenDeleted Delete gives in-range claims a reference
/// to the set.
async fn s10_claim_retention() -> Result<()> {
    let n = ns("s10").await?;
    let claims: Api<k8s_openapi::api::core::v1::PersistentVolumeClaim> =
        Api::namespaced(n.client.clone(), &n.ns);
    let template = json!({"volumeClaimTemplates": [{
        "metadata": {"name": "data", "labels": {"tier": "db"}},
        "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}}
    }], "podManagementPolicy": "Parallel"});
    let mut scaled = template.clone();
    scaled["persistentVolumeClaimRetentionPolicy"] =
        json!({"whenDeleted": "Retain", "whenScaled": "Delete"});
    n.create(&set("web", 3, scaled)?).await?;
    let owners = |c: &k8s_openapi::api::core::v1::PersistentVolumeClaim| -> Vec<String> {
        c.metadata
            .owner_references
            .iter()
            .flatten()
            .map(|r| format!("{}/{}", r.kind, r.name))
            .collect()
    };
    wait::until(
        "3 claims and pods",
        Duration::from_secs(60),
        Duration::from_millis(200),
        || async {
            let c = claims.list(&ListParams::default()).await?.items;
            let p = n.pods_of("web").await?;
            Ok((c.len() == 3 && p.len() == 3).then_some(()))
        },
    )
    .await?;
    for i in 0..3 {
        let c = claims.get(&format!("data-web-{i}")).await?;
        let labels = c.metadata.labels.clone().unwrap_or_default();
        ensure!(
            labels.get("tier").map(String::as_str) == Some("db")
                && labels.get("app").map(String::as_str) == Some("web"),
            "{labels:?}"
        );
        ensure!(
            owners(&c).is_empty(),
            "in-range claim owned: {:?}",
            owners(&c)
        );
        let pod = n.pods.get(&format!("web-{i}")).await?;
        ensure!(
            c.metadata.creation_timestamp <= pod.metadata.creation_timestamp,
            "data-web-{i} was created after its pod"
        );
        let vols = serde_json::to_value(pod.spec.unwrap_or_default().volumes)?;
        ensure!(
            vols.to_string().contains(&format!("data-web-{i}")),
            "web-{i} volumes {vols}"
        );
    }
    // The test provisioner binds the claims: the pods schedule and turn Ready.
    n.until_status("web", "3 ready on bound claims", 60, |s| {
        s["readyReplicas"].as_i64() == Some(3)
    })
    .await?;
    for c in claims.list(&ListParams::default()).await?.items {
        let phase = c.status.and_then(|s| s.phase);
        ensure!(
            phase.as_deref() == Some("Bound"),
            "{:?} {phase:?}",
            c.metadata.name
        );
    }
    // Deleting a pod keeps its claim: web-0 returns on the same one.
    let claim0 = claims.get("data-web-0").await?.metadata.uid;
    let pod0 = n.pods.get("web-0").await?.metadata.uid;
    n.pods.delete("web-0", &DeleteParams::default()).await?;
    n.until_pod("web-0", "replaced and ready", |v| {
        Some(&v.uid) != pod0.as_ref() && v.ready_since.is_some()
    })
    .await?;
    ensure!(
        claims.get("data-web-0").await?.metadata.uid == claim0,
        "data-web-0 was replaced with its pod"
    );
    // Scale to 1: data-web-1 and -2 get a reference to their pod, and go with it.
    n.patch_spec("web", json!({"replicas": 1})).await?;
    wait::until(
        "condemned claims gone",
        Duration::from_secs(90),
        Duration::from_millis(200),
        || async {
            let names: Vec<String> = claims
                .list(&ListParams::default())
                .await?
                .items
                .into_iter()
                .filter(|c| c.metadata.deletion_timestamp.is_none())
                .filter_map(|c| c.metadata.name)
                .collect();
            Ok((names == ["data-web-0"]).then_some(()))
        },
    )
    .await?;
    // whenDeleted Delete: the remaining in-range claim gets a reference to the set.
    n.patch_spec(
        "web",
        json!({"persistentVolumeClaimRetentionPolicy": {"whenDeleted": "Delete", "whenScaled": "Delete"}}),
    )
    .await?;
    wait::until(
        "set reference",
        Duration::from_secs(60),
        Duration::from_millis(200),
        || async {
            let c = claims.get("data-web-0").await?;
            Ok((owners(&c) == ["StatefulSet/web"]).then_some(()))
        },
    )
    .await?;
    Ok(())
}

/// A template change that leaves pods unschedulable (a node selector no node has): they stay
/// Pending and never turn Ready, as a broken image would.
fn broken() -> Value {
    json!({"template": {"spec": {"nodeSelector": {"pilothouse.test/no-such-node": "true"}}}})
}

fn fixed() -> Value {
    json!({"template": {"spec": {"nodeSelector": null, "containers": [{"name": "c", "image": "nginx:3"}]}}})
}

/// S6 (#137409, SB-1): a Parallel set whose first template never turns Ready is rolled forward
/// unaided once the template is fixed (maxUnavailable unset), for 1 and 3 replicas.
async fn s6_broken_first_template_is_replaced() -> Result<()> {
    let n = ns("s6").await?;
    for (name, replicas) in [("one", 1), ("three", 3)] {
        let mut s = set(name, replicas, json!({"podManagementPolicy": "Parallel"}))?;
        let mut spec = serde_json::to_value(&s.spec)?;
        k8s::merge_json(&mut spec, &broken());
        s.spec = serde_json::from_value(spec)?;
        n.create(&s).await?;
        n.until_status(name, "pods created", 30, |s| {
            s["replicas"].as_i64() == Some(i64::from(replicas))
        })
        .await?;
        tokio::time::sleep(Duration::from_secs(2)).await;
        ensure!(
            n.status(name).await?["readyReplicas"].as_i64().unwrap_or(0) == 0,
            "the broken template ran"
        );
        n.patch_spec(name, fixed()).await?;
        n.until_status(name, "rolled forward", 60, all_ready(i64::from(replicas)))
            .await?;
    }
    Ok(())
}

/// S7: Parallel, 5 replicas, maxUnavailable 2, a broken template: 2 pods are replaced, then the
/// rollout stops; fixing the template resumes it.
async fn s7_bad_template_stops_after_the_budget() -> Result<()> {
    let n = ns("s7").await?;
    n.create(&set(
        "web",
        5,
        json!({"podManagementPolicy": "Parallel",
               "updateStrategy": {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": 2}}}),
    )?)
    .await?;
    let first = n.until_status("web", "5 ready", 60, all_ready(5)).await?;
    let old = first["updateRevision"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    n.patch_spec("web", broken()).await?;
    let s = n
        .until_status("web", "2 replaced", 60, |s| {
            s["updateRevision"] != old.as_str() && s["updatedReplicas"].as_i64() == Some(2)
        })
        .await?;
    let new = s["updateRevision"].as_str().unwrap_or_default().to_string();
    // Stays there: 3 old pods keep running.
    tokio::time::sleep(Duration::from_secs(5)).await;
    let pods = n.pods_of("web").await?;
    let at_new = pods.iter().filter(|p| p.1 == new).count();
    let old_live = pods.iter().filter(|p| p.1 == old && !p.2).count();
    ensure!(at_new == 2 && old_live == 3, "{pods:?}");
    n.patch_spec("web", fixed()).await?;
    n.until_status("web", "resumed and complete", 90, |s| {
        all_ready(5)(s) && s["updateRevision"] != new.as_str()
    })
    .await?;
    Ok(())
}

/// One pod as the scenarios look at it.
#[derive(Debug, Clone)]
struct PodView {
    name: String,
    uid: String,
    revision: String,
    deleting: bool,
    /// When it last turned Ready, if it is Ready.
    ready_since: Option<k8s_openapi::jiff::Timestamp>,
    resource_version: String,
}

impl PodView {
    fn of(p: &Pod) -> PodView {
        let ready = k8s::condition(p, "Ready").filter(|c| c.status == "True");
        PodView {
            name: p.metadata.name.clone().unwrap_or_default(),
            uid: p.metadata.uid.clone().unwrap_or_default(),
            revision: p
                .metadata
                .labels
                .as_ref()
                .and_then(|l| l.get("controller-revision-hash").cloned())
                .unwrap_or_default(),
            deleting: p.metadata.deletion_timestamp.is_some(),
            ready_since: ready.and_then(|c| c.last_transition_time.as_ref().map(|t| t.0)),
            resource_version: p.metadata.resource_version.clone().unwrap_or_default(),
        }
    }

    /// Available as the controller judges it: Ready for at least `min_ready` seconds, by the
    /// same (second-granular) transition time it reads.
    fn available(&self, min_ready: f64) -> bool {
        !self.deleting && self.ready_since.is_some_and(|t| k8s::since(t) >= min_ready)
    }
}

/// The kwok hook (tests/cluster/kwok/stages.yaml): pods of this template run but stay unready
/// until the annotation is removed from them.
fn unready_template() -> Value {
    json!({"template": {"metadata": {"annotations": {"pilothouse.test/not-ready": "true"}}}})
}

fn claim_template() -> Value {
    json!([{
        "metadata": {"name": "data"},
        "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}}
    }])
}

impl Ns {
    async fn views(&self, set: &str) -> Result<Vec<PodView>> {
        let mut v: Vec<PodView> = self
            .pods
            .list(&ListParams::default().labels(&format!("app={set}")))
            .await?
            .items
            .iter()
            .map(PodView::of)
            .collect();
        v.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(v)
    }

    /// Makes a pod Ready or unready through the kwok hook.
    async fn set_ready(&self, pod: &str, ready: bool) -> Result<()> {
        let value = if ready { Value::Null } else { json!("true") };
        self.pods
            .patch(
                pod,
                &PatchParams::default(),
                &Patch::Merge(
                    json!({"metadata": {"annotations": {"pilothouse.test/not-ready": value}}}),
                ),
            )
            .await?;
        Ok(())
    }

    async fn until_pod(
        &self,
        pod: &str,
        what: &str,
        ok: impl Fn(&PodView) -> bool,
    ) -> Result<PodView> {
        wait::until(
            &format!("{pod}: {what}"),
            Duration::from_secs(60),
            Duration::from_millis(100),
            || async {
                Ok(match self.pods.get_opt(pod).await? {
                    Some(p) => Some(PodView::of(&p)).filter(|v| ok(v)),
                    None => None,
                })
            },
        )
        .await
    }

    /// Sets pod `pod`'s `app` label, then waits until `ok` holds for it.
    async fn relabel_until(
        &self,
        pod: &str,
        app: &str,
        what: &str,
        ok: impl Fn(&Pod) -> bool,
    ) -> Result<()> {
        self.pods
            .patch(
                pod,
                &PatchParams::default(),
                &Patch::Merge(json!({"metadata": {"labels": {"app": app}}})),
            )
            .await?;
        wait::until(
            &format!("{pod} {what}"),
            Duration::from_secs(60),
            Duration::from_millis(200),
            || async { Ok(ok(&self.pods.get(pod).await?).then_some(())) },
        )
        .await
    }

    fn names(views: &[PodView]) -> Vec<&str> {
        views.iter().map(|v| v.name.as_str()).collect()
    }
}

/// S1 (halt): OrderedReady, 3 replicas, web-1 never turns Ready (kwok hook) → no web-2,
/// `replicas` 2, `readyReplicas` 1; web-1 Ready → web-2. With web-0 unready, a scale-down
/// 3 → 1 deletes nothing until web-0 is Ready again.
async fn s1_ordered_halt() -> Result<()> {
    let n = ns("s1h").await?;
    n.create(&set("web", 3, unready_template())?).await?;
    n.until_pod("web-0", "created", |_| true).await?;
    n.set_ready("web-0", true).await?;
    n.until_pod("web-1", "created", |_| true).await?;
    n.until_status("web", "web-1 counted", 30, |s| {
        s["replicas"].as_i64() == Some(2) && s["readyReplicas"].as_i64() == Some(1)
    })
    .await?;
    // Long enough for several syncs (every pod change requeues the set).
    tokio::time::sleep(Duration::from_secs(3)).await;
    let views = n.views("web").await?;
    ensure!(Ns::names(&views) == ["web-0", "web-1"], "{views:#?}");
    let s = n.status("web").await?;
    ensure!(
        s["replicas"].as_i64() == Some(2) && s["readyReplicas"].as_i64() == Some(1),
        "{s}"
    );
    n.set_ready("web-1", true).await?;
    n.until_pod("web-2", "created", |_| true).await?;
    n.set_ready("web-2", true).await?;
    n.until_status("web", "3 ready", 60, all_ready(3)).await?;
    // Unready web-0 halts a scale-down.
    n.set_ready("web-0", false).await?;
    n.until_status("web", "web-0 unready seen", 30, |s| {
        s["readyReplicas"].as_i64() == Some(2)
    })
    .await?;
    n.patch_spec("web", json!({"replicas": 1})).await?;
    n.until_status("web", "scale-down seen", 30, |s| {
        s["observedGeneration"].as_i64() == Some(2)
    })
    .await?;
    tokio::time::sleep(Duration::from_secs(3)).await;
    let views = n.views("web").await?;
    ensure!(
        Ns::names(&views) == ["web-0", "web-1", "web-2"] && views.iter().all(|v| !v.deleting),
        "scaled down past an unready web-0: {views:#?}"
    );
    n.set_ready("web-0", true).await?;
    n.until_status("web", "scaled to 1", 60, |s| {
        s["replicas"].as_i64() == Some(1) && s["readyReplicas"].as_i64() == Some(1)
    })
    .await?;
    ensure!(Ns::names(&n.views("web").await?) == ["web-0"]);
    Ok(())
}

/// Follows a rollout of `set` to completion, returning the most pods unavailable at once among
/// `watched` ordinals' names (a missing pod is unavailable) and the time it took.
async fn follow_rollout(
    n: &Ns,
    set: &str,
    watched: &[&str],
    min_ready: f64,
    replicas: i64,
    old: &str,
) -> Result<(usize, Duration)> {
    let started = std::time::Instant::now();
    let most = std::cell::Cell::new(0usize);
    wait::until(
        "rollout complete",
        Duration::from_secs(240),
        Duration::from_millis(100),
        || async {
            let views = n.views(set).await?;
            let down = watched
                .iter()
                .filter(|w| {
                    !views
                        .iter()
                        .any(|v| v.name == **w && v.available(min_ready))
                })
                .count();
            most.set(most.get().max(down));
            let s = n.status(set).await?;
            Ok((all_ready(replicas)(&s) && s["updateRevision"] != old).then_some(()))
        },
    )
    .await?;
    Ok((most.get(), started.elapsed()))
}

/// S5: Parallel, 6 replicas, maxUnavailable 2 (then `50%`, which is 3 of 6), minReadySeconds
/// 10: never more pods unavailable than the budget, so the rollout takes at least three
/// windows of 10 s (two for 50%).
async fn s5_parallel_budget(max_unavailable: Value, budget: usize, at_least: u64) -> Result<()> {
    let n = ns("s5").await?;
    n.create(&set(
        "web",
        6,
        json!({"podManagementPolicy": "Parallel", "minReadySeconds": 10,
               "updateStrategy": {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": max_unavailable}}}),
    )?)
    .await?;
    let first = n
        .until_status("web", "6 available", 90, all_ready(6))
        .await?;
    let old = first["updateRevision"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    n.patch_spec(
        "web",
        json!({"template": {"spec": {"containers": [{"name": "c", "image": "nginx:2"}]}}}),
    )
    .await?;
    let all = ["web-0", "web-1", "web-2", "web-3", "web-4", "web-5"];
    let (most, took) = follow_rollout(&n, "web", &all, 10.0, 6, &old).await?;
    ensure!(
        most == budget,
        "{most} pods unavailable at once, budget {budget}"
    );
    ensure!(
        took >= Duration::from_secs(at_least),
        "rollout took {took:?}, less than {at_least} s"
    );
    Ok(())
}

async fn s5_max_unavailable_2() -> Result<()> {
    s5_parallel_budget(json!(2), 2, 30).await
}

async fn s5_max_unavailable_50_percent() -> Result<()> {
    s5_parallel_budget(json!("50%"), 3, 20).await
}

/// S5 (partition): web-0 old and unready, partition 1, maxUnavailable 2 → web-0 is kept (same
/// pod, old revision) and, one pod of the budget being spent on it, at most one healthy pod is
/// down at a time.
async fn s5_partition_with_an_unready_old_pod() -> Result<()> {
    let n = ns("s5p").await?;
    n.create(&set(
        "web",
        6,
        json!({"podManagementPolicy": "Parallel", "minReadySeconds": 10,
               "updateStrategy": {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": 2}}}),
    )?)
    .await?;
    let first = n
        .until_status("web", "6 available", 90, all_ready(6))
        .await?;
    let old = first["updateRevision"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    let web0 = n.until_pod("web-0", "exists", |_| true).await?;
    n.set_ready("web-0", false).await?;
    n.until_status("web", "web-0 unavailable seen", 30, |s| {
        s["availableReplicas"].as_i64() == Some(5)
    })
    .await?;
    n.patch_spec(
        "web",
        json!({"updateStrategy": {"rollingUpdate": {"partition": 1}},
               "template": {"spec": {"containers": [{"name": "c", "image": "nginx:2"}]}}}),
    )
    .await?;
    let healthy = ["web-1", "web-2", "web-3", "web-4", "web-5"];
    let most = std::cell::Cell::new(0usize);
    wait::until(
        "web-1..5 updated and available",
        Duration::from_secs(240),
        Duration::from_millis(100),
        || async {
            let views = n.views("web").await?;
            let down = healthy
                .iter()
                .filter(|w| !views.iter().any(|v| v.name == **w && v.available(10.0)))
                .count();
            most.set(most.get().max(down));
            let s = n.status("web").await?;
            Ok((s["updateRevision"] != old.as_str()
                && s["updatedReplicas"].as_i64() == Some(5)
                && s["availableReplicas"].as_i64() == Some(5))
            .then_some(()))
        },
    )
    .await?;
    ensure!(most.get() == 1, "{} healthy pods down at once", most.get());
    let now0 = n.until_pod("web-0", "exists", |_| true).await?;
    ensure!(
        now0.uid == web0.uid && now0.revision == old,
        "web-0 was replaced: {now0:?}"
    );
    Ok(())
}

/// S11: web-1 terminating `Failed`, then `Succeeded` (kwok exit-code hook) is replaced under
/// the same name with a new UID, mounting the same claim.
async fn s11_failed_and_succeeded_are_replaced() -> Result<()> {
    let n = ns("s11").await?;
    n.create(&set(
        "web",
        3,
        json!({"volumeClaimTemplates": claim_template()}),
    )?)
    .await?;
    n.until_status("web", "3 ready", 120, all_ready(3)).await?;
    let claims: Api<k8s_openapi::api::core::v1::PersistentVolumeClaim> =
        Api::namespaced(n.client.clone(), &n.ns);
    let claim_uid = claims.get("data-web-1").await?.metadata.uid;
    for code in ["1", "0"] {
        let before = n
            .until_pod("web-1", "ready", |v| v.ready_since.is_some())
            .await?;
        n.pods
            .patch(
                "web-1",
                &PatchParams::default(),
                &Patch::Merge(
                    json!({"metadata": {"annotations": {"pilothouse.test/exit-code": code}}}),
                ),
            )
            .await?;
        let after = n
            .until_pod("web-1", "replaced and ready", |v| {
                v.uid != before.uid && v.ready_since.is_some()
            })
            .await?;
        let pod = n.pods.get("web-1").await?;
        let claim_names: Vec<String> = pod
            .spec
            .iter()
            .flat_map(|s| s.volumes.iter().flatten())
            .filter_map(|v| {
                v.persistent_volume_claim
                    .as_ref()
                    .map(|c| c.claim_name.clone())
            })
            .collect();
        ensure!(claim_names == ["data-web-1"], "{claim_names:?}");
        ensure!(
            claims.get("data-web-1").await?.metadata.uid == claim_uid,
            "the claim was replaced"
        );
        ensure!(after.name == "web-1");
    }
    n.until_status("web", "3 ready", 60, all_ready(3)).await?;
    Ok(())
}

/// S13: `ordinals.start` 5 → web-5..7 with data-web-5..7; partition 1 protects web-5 only;
/// start 6 → web-8 is Ready before web-5 goes.
async fn s13_start_ordinal() -> Result<()> {
    let n = ns("s13").await?;
    n.create(&set(
        "web",
        3,
        json!({"ordinals": {"start": 5}, "volumeClaimTemplates": claim_template()}),
    )?)
    .await?;
    let first = n.until_status("web", "3 ready", 120, all_ready(3)).await?;
    let old = first["updateRevision"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    ensure!(Ns::names(&n.views("web").await?) == ["web-5", "web-6", "web-7"]);
    let claims: Api<k8s_openapi::api::core::v1::PersistentVolumeClaim> =
        Api::namespaced(n.client.clone(), &n.ns);
    let mut claim_names: Vec<String> = claims
        .list(&ListParams::default())
        .await?
        .items
        .into_iter()
        .filter_map(|c| c.metadata.name)
        .collect();
    claim_names.sort();
    ensure!(
        claim_names == ["data-web-5", "data-web-6", "data-web-7"],
        "{claim_names:?}"
    );
    n.patch_spec(
        "web",
        json!({"updateStrategy": {"type": "RollingUpdate", "rollingUpdate": {"partition": 1}},
               "template": {"spec": {"containers": [{"name": "c", "image": "nginx:2"}]}}}),
    )
    .await?;
    let s = n
        .until_status("web", "web-6, web-7 updated", 120, |s| {
            s["updatedReplicas"].as_i64() == Some(2) && s["readyReplicas"].as_i64() == Some(3)
        })
        .await?;
    let views = n.views("web").await?;
    let revs: Vec<(&str, bool)> = views
        .iter()
        .map(|v| (v.name.as_str(), v.revision == old))
        .collect();
    ensure!(
        revs == [("web-5", true), ("web-6", false), ("web-7", false)],
        "{revs:?} (status {s})"
    );
    n.patch_spec("web", json!({"ordinals": {"start": 6}}))
        .await?;
    // web-5 is deleted only once web-8 is Ready, and readiness does not flip back: whenever
    // web-5 is seen going, web-8 must be Ready.
    let violation = std::cell::RefCell::new(None);
    wait::until(
        "web-5 gone",
        Duration::from_secs(120),
        Duration::from_millis(100),
        || async {
            let views = n.views("web").await?;
            let web5 = views.iter().find(|v| v.name == "web-5");
            let web8_ready = views
                .iter()
                .any(|v| v.name == "web-8" && v.ready_since.is_some());
            if web5.is_none_or(|v| v.deleting) && !web8_ready {
                *violation.borrow_mut() = Some(format!("{views:#?}"));
                return Ok(Some(()));
            }
            Ok(web5.is_none().then_some(()))
        },
    )
    .await?;
    if let Some(v) = violation.into_inner() {
        anyhow::bail!("web-5 went before web-8 was Ready: {v}");
    }
    n.until_status("web", "3 ready at 6..8", 60, |s| {
        s["replicas"].as_i64() == Some(3) && s["readyReplicas"].as_i64() == Some(3)
    })
    .await?;
    ensure!(Ns::names(&n.views("web").await?) == ["web-6", "web-7", "web-8"]);
    Ok(())
}

/// S15: minReadySeconds 20, OrderedReady, 2 replicas: web-1 is created ≥ 20 s after web-0 turned
/// Ready; `availableReplicas` reaches 2 with no further pod change (a timed requeue); in a
/// rollout `currentRevision` advances only once every pod is Available (SB-3).
async fn s15_min_ready_seconds() -> Result<()> {
    let n = ns("s15").await?;
    n.create(&set("web", 2, json!({"minReadySeconds": 20}))?)
        .await?;
    // until_pod waits 60 s; web-1 comes after ~21 s.
    n.until_pod("web-1", "created", |_| true).await?;
    let web0 = n.pods.get("web-0").await?;
    let ready0 = k8s::condition(&web0, "Ready")
        .and_then(|c| c.last_transition_time.as_ref())
        .map(|t| t.0)
        .context("web-0 Ready time")?;
    let created1 = n
        .pods
        .get("web-1")
        .await?
        .metadata
        .creation_timestamp
        .context("web-1 creation")?
        .0;
    let gap = ready0.duration_until(created1).as_secs_f64();
    ensure!(
        gap >= 20.0,
        "web-1 created {gap} s after web-0 turned Ready"
    );
    let ready1 = n
        .until_pod("web-1", "ready", |v| v.ready_since.is_some())
        .await?;
    n.until_status("web", "2 available", 60, all_ready(2))
        .await?;
    let views = n.views("web").await?;
    let rv1 = views
        .iter()
        .find(|v| v.name == "web-1")
        .map(|v| v.resource_version.clone());
    ensure!(
        rv1.as_deref() == Some(ready1.resource_version.as_str()),
        "web-1 changed after it turned Ready: {views:#?}"
    );
    // SB-3.
    let old = n.status("web").await?["currentRevision"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    n.patch_spec(
        "web",
        json!({"template": {"spec": {"containers": [{"name": "c", "image": "nginx:2"}]}}}),
    )
    .await?;
    let window_seen = std::cell::Cell::new(false);
    wait::until(
        "rollout complete",
        Duration::from_secs(180),
        Duration::from_millis(200),
        || async {
            let s = n.status("web").await?;
            let current_is_update = s["currentRevision"] == s["updateRevision"];
            let available = s["availableReplicas"].as_i64() == Some(2);
            let updated = s["updatedReplicas"].as_i64() == Some(2);
            if s["updateRevision"] != old.as_str() {
                if current_is_update && !(available && updated) {
                    anyhow::bail!("currentRevision advanced before all were Available: {s}");
                }
                if updated && s["readyReplicas"].as_i64() == Some(2) && !available {
                    window_seen.set(true);
                }
            }
            Ok(
                (current_is_update && s["currentRevision"] != old.as_str() && available)
                    .then_some(()),
            )
        },
    )
    .await?;
    ensure!(
        window_seen.get(),
        "never saw every pod updated and Ready but not yet Available"
    );
    Ok(())
}

/// Issue 17 §2: a webhook refuses the set's first 4 pod creations and times out every status
/// write for 15 s. The set still ends with `web-0`..`web-2`, each created once (the audit log's
/// accepted creations), ready, and its status exact; a set in a namespace the webhook does not
/// cover converges during the faults (one bad object never stalls the others).
async fn webhook_faults_converge_exactly() -> Result<()> {
    const USER: &str = "system:serviceaccount:kube-system:pilothouse";
    let n = ns("sts-hook").await?;
    let free = ns("sts-free").await?;
    // The API server waits 2 s for an answer; a 3 s delay is a timeout.
    let hook = Webhook::start_with_timeout(
        n.client.clone(),
        &n.ns,
        &["pods", "statefulsets/status"],
        &["CREATE", "UPDATE"],
        2,
    )
    .await?;
    let by = |resource: &str, sub: &str, op: &str| Match::by(resource, sub, op, USER);
    hook.reject(
        by("pods", "", "CREATE"),
        4,
        "pilothouse test: pod creation refused",
    );
    hook.delay(
        by("statefulsets", "status", "UPDATE"),
        Duration::from_secs(3),
    );
    n.create(&set("web", 3, json!({}))?).await?;
    free.create(&set("web", 3, json!({}))?).await?;
    let faults = tokio::time::Instant::now();
    free.until_status("web", "the free set's 3 ready", 30, all_ready(3))
        .await?;
    let free_done = faults.elapsed();
    // Not held behind web's failing syncs (each waits 2 s on a status write).
    ensure!(
        free_done < Duration::from_secs(10),
        "the free set was ready only {free_done:?} into the faults"
    );
    // The faults last 15 s, and until the 4th refusal (each refused sync also waits out a
    // status write).
    tokio::time::sleep(Duration::from_secs(15).saturating_sub(free_done)).await;
    wait::until(
        "the 4th refused pod creation",
        Duration::from_secs(60),
        Duration::from_millis(200),
        || async {
            let refused = hook
                .seen()
                .iter()
                .filter(|s| s.resource == "pods" && s.operation == "CREATE" && !s.allowed)
                .count();
            Ok((refused >= 4).then_some(()))
        },
    )
    .await?;
    // Every status write seen so far was delayed past the API server's wait: timed out.
    let during = hook.seen();
    hook.clear();
    let cleared = faults.elapsed();
    let st = n
        .until_status("web", "web's 3 ready after the faults", 120, all_ready(3))
        .await?;
    let set_now = n.sets.get("web").await?;
    ensure!(
        st["replicas"].as_i64() == Some(3)
            && st["currentReplicas"].as_i64() == Some(3)
            && st["observedGeneration"].as_i64() == set_now.metadata.generation,
        "web's status {st}"
    );
    let names: Vec<String> = n.views("web").await?.into_iter().map(|v| v.name).collect();
    ensure!(names == ["web-0", "web-1", "web-2"], "web's pods {names:?}");
    let refused = hook
        .seen()
        .iter()
        .filter(|s| s.resource == "pods" && s.operation == "CREATE" && s.user == USER && !s.allowed)
        .count();
    let timed_out = during
        .iter()
        .filter(|s| s.resource == "statefulsets" && s.sub_resource == "status" && s.user == USER)
        .count();
    ensure!(
        refused == 4 && timed_out >= 1,
        "the faults did not all happen: {refused} creations refused, {timed_out} status writes delayed"
    );
    hook.remove().await?;
    // Each pod created once: the audit log's accepted creations in the namespace (the log is
    // written in batches, so wait for the last to land).
    tokio::time::sleep(Duration::from_secs(2)).await;
    let created: Vec<String> = audit::read(&cluster().audit_log())?
        .into_iter()
        .filter(|e| {
            e.stage == "ResponseComplete"
                && e.verb == "create"
                && e.user.username == USER
                && e.response_status.as_ref().and_then(|s| s.code) == Some(201)
        })
        .filter_map(|e| e.object_ref)
        .filter(|o| o.resource == "pods" && o.namespace == n.ns && o.subresource.is_empty())
        .map(|o| o.name)
        .collect();
    ensure!(
        created.len() == 3,
        "accepted pod creations in {}: {created:?}",
        n.ns
    );
    println!(
        "MEASURE statefulset webhook faults: {refused} pod creations refused and {timed_out} status writes timed out over {:.1}s; the free set was ready {:.1}s into the faults; web ready {:.1}s after they stopped",
        cleared.as_secs_f64(),
        free_done.as_secs_f64(),
        faults.elapsed().saturating_sub(cleared).as_secs_f64()
    );
    Ok(())
}

/// S16 (SB-4): Parallel under a pod quota of 21, scaled 2 → 32 (21 pods); the quota shrinks to
/// 20 and web-3 is deleted, so it cannot return; scaled to 10, one pod is missing below the new
/// size and 11 are condemned above it with no quota left: upstream tries the create first, is
/// refused every time and never deletes (#140858); Pilothouse deletes the condemned first,
/// which frees the quota, and converges to web-0..9.
async fn s16_quota() -> Result<()> {
    let n = ns("s16").await?;
    let quotas: Api<k8s_openapi::api::core::v1::ResourceQuota> =
        Api::namespaced(n.client.clone(), &n.ns);
    let quota_is = |pods: &'static str| {
        let quotas = quotas.clone();
        async move {
            wait::until(
                "quota status",
                Duration::from_secs(60),
                Duration::from_millis(200),
                || async {
                    let q = quotas.get("pods").await?;
                    Ok(q.status
                        .and_then(|s| s.hard)
                        .and_then(|h| h.get("pods").cloned())
                        .is_some_and(|v| v.0 == pods)
                        .then_some(()))
                },
            )
            .await
        }
    };
    quotas
        .create(
            &PostParams::default(),
            &serde_json::from_value(
                json!({"metadata": {"name": "pods"}, "spec": {"hard": {"pods": "21"}}}),
            )?,
        )
        .await?;
    // Admission refuses pods until the quota controller has filled in the status.
    quota_is("21").await?;
    n.create(&set("web", 2, json!({"podManagementPolicy": "Parallel"}))?)
        .await?;
    n.until_status("web", "2 ready", 60, all_ready(2)).await?;
    n.patch_spec("web", json!({"replicas": 32})).await?;
    wait::until(
        "21 pods",
        Duration::from_secs(60),
        Duration::from_millis(200),
        || async { Ok((n.views("web").await?.len() == 21).then_some(())) },
    )
    .await?;
    // The quota shrinks by one and web-3 goes: it cannot come back (20 of 20 used), so below
    // the new size of 10 one pod is missing, above it 11 are condemned.
    quotas
        .patch(
            "pods",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"hard": {"pods": "20"}}})),
        )
        .await?;
    quota_is("20").await?;
    n.pods.delete("web-3", &DeleteParams::default()).await?;
    wait::until(
        "web-3 gone",
        Duration::from_secs(30),
        Duration::from_millis(100),
        || async { Ok(n.pods.get_opt("web-3").await?.is_none().then_some(())) },
    )
    .await?;
    tokio::time::sleep(Duration::from_secs(2)).await;
    ensure!(
        n.pods.get_opt("web-3").await?.is_none(),
        "web-3 came back: the quota did not hold it"
    );
    n.patch_spec("web", json!({"replicas": 10})).await?;
    let want: Vec<String> = (0..10).map(|i| format!("web-{i}")).collect();
    wait::until(
        "web-0..9 ready",
        Duration::from_secs(120),
        Duration::from_millis(200),
        || async {
            let views = n.views("web").await?;
            let mut names: Vec<String> = views.iter().map(|v| v.name.clone()).collect();
            names.sort_by_key(|n| n.trim_start_matches("web-").parse::<u32>().unwrap_or(0));
            let s = n.status("web").await?;
            Ok((names == want
                && s["replicas"].as_i64() == Some(10)
                && s["readyReplicas"].as_i64() == Some(10))
            .then_some(()))
        },
    )
    .await?;
    Ok(())
}

/// ST-15 with defaults (SB-2): an orphan revision written before the API server defaulted some
/// fields (its template lacks `imagePullPolicy`, `terminationMessagePath`, ...) is adopted and,
/// once the API server has defaulted it (a dry-run PodTemplate create the shipped RBAC allows),
/// reused for the set whose template it is: no new revision.
async fn st15_revision_missing_defaults_is_reused() -> Result<()> {
    let n = ns("st15").await?;
    let template = json!({
        "metadata": {"labels": {"app": "web"}},
        "spec": {
            "terminationGracePeriodSeconds": 1,
            "tolerations": [{"key": "kwok.x-k8s.io/node", "operator": "Exists", "effect": "NoSchedule"}],
            "containers": [{"name": "c", "image": "nginx:1"}]
        }
    });
    let mut data = json!({"spec": {"template": template.clone()}});
    data["spec"]["template"]["$patch"] = json!("replace");
    n.revisions
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({
                "metadata": {"name": "web-written-long-ago",
                             "labels": {"app": "web", "controller.kubernetes.io/hash": "written-long-ago"}},
                "data": data,
                "revision": 1
            }))?,
        )
        .await?;
    n.create(&set("web", 2, json!({"template": template}))?)
        .await?;
    let s = n.until_status("web", "2 ready", 60, all_ready(2)).await?;
    ensure!(
        s["updateRevision"] == "web-written-long-ago",
        "a new revision for an unchanged template: {s}"
    );
    let revs = n.revision_names("web").await?;
    ensure!(
        revs == [("web-written-long-ago".to_string(), 1)],
        "{revs:?}"
    );
    Ok(())
}

/// S9 (ST-11, ST-12, ST-17): revisionHistoryLimit 2 over 8 rollouts → at most 2 revisions besides
/// the live one, numbered in order, each shaped as upstream's: the template under
/// `spec.template` with `$patch: replace`, the selector's and template's labels, the hash label,
/// the set as controller; every pod (ST-7) at the live revision.
async fn s9_history() -> Result<()> {
    let n = ns("s9").await?;
    n.create(&set(
        "web",
        2,
        json!({"podManagementPolicy": "Parallel", "revisionHistoryLimit": 2}),
    )?)
    .await?;
    n.until_status("web", "2 ready", 60, all_ready(2)).await?;
    for tag in 2..=9 {
        n.patch_spec(
            "web",
            json!({"template": {"spec": {"containers": [{"name": "c", "image": format!("nginx:{tag}")}]}}}),
        )
        .await?;
        let generation = i64::from(tag);
        n.until_status("web", "rolled out", 90, move |s| {
            all_ready(2)(s) && s["observedGeneration"].as_i64() == Some(generation)
        })
        .await?;
    }
    let s = n.status("web").await?;
    let live = s["updateRevision"].as_str().unwrap_or_default().to_string();
    // History is cut after the sync that rolled out: give it one more pass.
    let revisions = wait::until(
        "history cut to 2",
        Duration::from_secs(30),
        Duration::from_millis(200),
        || async {
            let r = n
                .revisions
                .list(&ListParams::default().labels("app=web"))
                .await?
                .items;
            Ok((r.len() <= 3).then_some(r))
        },
    )
    .await?;
    let mut numbers: Vec<i64> = revisions.iter().filter_map(|r| r.revision).collect();
    numbers.sort();
    ensure!(numbers == [7, 8, 9], "revision numbers {numbers:?}");
    for r in &revisions {
        let name = r.metadata.name.clone().unwrap_or_default();
        let labels = r.metadata.labels.clone().unwrap_or_default();
        let hash = labels
            .get("controller.kubernetes.io/hash")
            .cloned()
            .unwrap_or_default();
        ensure!(name == format!("web-{hash}"), "{name} vs hash label {hash}");
        ensure!(
            labels.get("app").map(String::as_str) == Some("web"),
            "{labels:?}"
        );
        let owner = r
            .metadata
            .owner_references
            .iter()
            .flatten()
            .find(|o| o.controller == Some(true));
        ensure!(
            owner.is_some_and(|o| o.kind == "StatefulSet" && o.name == "web"),
            "{name}: owner {owner:?}"
        );
        let data = &r.data.0;
        ensure!(
            data["spec"]["template"]["$patch"] == "replace"
                && data["spec"].as_object().is_some_and(|m| m.len() == 1),
            "{name}: data {data}"
        );
    }
    let pods = n.pods_of("web").await?;
    ensure!(
        pods.iter().all(|p| p.1 == live),
        "pods not at the live revision {live}: {pods:?}"
    );
    Ok(())
}

fn main() -> ! {
    let trials = vec![
        trial("s1_ordered", s1_ordered),
        trial("s2_parallel", s2_parallel),
        trial("s3_partition_and_rollback", s3_partition_and_rollback),
        trial("s4_ordered_budget", s4_ordered_budget),
        trial(
            "s6_broken_first_template_is_replaced",
            s6_broken_first_template_is_replaced,
        ),
        trial(
            "s7_bad_template_stops_after_the_budget",
            s7_bad_template_stops_after_the_budget,
        ),
        trial("s8_on_delete", s8_on_delete),
        trial("s_r_recreate", s_r_recreate),
        trial("s10_claim_retention", s10_claim_retention),
        trial("s12_adoption", s12_adoption),
        trial("s1_ordered_halt", s1_ordered_halt),
        trial("s5_max_unavailable_2", s5_max_unavailable_2),
        trial(
            "s5_max_unavailable_50_percent",
            s5_max_unavailable_50_percent,
        ),
        trial(
            "s5_partition_with_an_unready_old_pod",
            s5_partition_with_an_unready_old_pod,
        ),
        trial(
            "s11_failed_and_succeeded_are_replaced",
            s11_failed_and_succeeded_are_replaced,
        ),
        trial("s13_start_ordinal", s13_start_ordinal),
        trial("s15_min_ready_seconds", s15_min_ready_seconds),
        trial("s16_quota", s16_quota),
        trial(
            "webhook_faults_converge_exactly",
            webhook_faults_converge_exactly,
        ),
        trial("s9_history", s9_history),
        trial(
            "st15_revision_missing_defaults_is_reused",
            st15_revision_missing_defaults_is_reused,
        ),
    ];
    pilothouse_tests::harness::main(
        "statefulset",
        ClusterOptions {
            replace: Some(vec!["statefulset-controller"]),
            ..Default::default()
        },
        Some(SuitePilothouse {
            args: vec![
                "--controllers=statefulset-controller".to_string(),
                "--feature-gates=StatefulSetRecreateStrategy=true".to_string(),
            ],
            as_service_account: true,
        }),
        trials,
    )
}
