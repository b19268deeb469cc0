//! End-to-end tests of `statefulset-controller` (spec §2, scenarios S1..S17), against a local
//! control plane whose kube-controller-manager runs everything but the StatefulSet controller,
//! with one Pilothouse running only that controller as the `kube-system/pilothouse`
//! ServiceAccount with the shipped RBAC. Each test owns a namespace; pods run on the shared kwok
//! nodes, which turn them Running and Ready.

use anyhow::{Context, Result, ensure};
use k8s_openapi::api::apps::v1::{ControllerRevision, StatefulSet};
use k8s_openapi::api::core::v1::Pod;
use kube::Client;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use pilothouse_tests::cluster::ClusterOptions;
use pilothouse_tests::harness::{SuitePilothouse, cluster, trial};
use pilothouse_tests::{k8s, wait};
use serde_json::{Value, json};
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
    let mut v = json!({
        "apiVersion": "apps/v1", "kind": "StatefulSet",
        "metadata": {"name": name},
        "spec": {
            "replicas": replicas,
            "serviceName": name,
            "selector": {"matchLabels": {"app": name}},
            "template": {
                "metadata": {"labels": {"app": name}},
                "spec": {
                    // kwok keeps a deleted pod for its grace period: 1 s keeps rollouts short
                    // (0 would draw B-7's warning).
                    "terminationGracePeriodSeconds": 1,
                    "tolerations": [{"key": "kwok.x-k8s.io/node", "operator": "Exists", "effect": "NoSchedule"}],
                    "containers": [{"name": "c", "image": "nginx:1"}]
                }
            }
        }
    });
    merge(&mut v["spec"], &extra);
    Ok(serde_json::from_value(v)?)
}

fn merge(into: &mut Value, from: &Value) {
    match (into, from) {
        (Value::Object(a), Value::Object(b)) => {
            for (k, v) in b {
                merge(a.entry(k.clone()).or_insert(Value::Null), v);
            }
        }
        (a, b) => *a = b.clone(),
    }
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
    wait::until(
        "all pods gone",
        Duration::from_secs(90),
        Duration::from_millis(100),
        || async {
            let now: Vec<String> = n.pods_of("web").await?.into_iter().map(|p| p.0).collect();
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

/// S4: OrderedReady with maxUnavailable 2: an image change takes web-4 and web-3 down together
/// (never more than 2 unavailable), and the rollout completes.
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
    let seen = std::cell::RefCell::new(Vec::<Vec<String>>::new());
    let most_down = std::cell::Cell::new(0usize);
    wait::until(
        "rollout complete",
        Duration::from_secs(120),
        Duration::from_millis(50),
        || async {
            let pods = n.pods_of("web").await?;
            let live: Vec<&str> = pods.iter().filter(|p| !p.2).map(|p| p.0.as_str()).collect();
            {
                let mut seen = seen.borrow_mut();
                let now: Vec<String> = pods
                    .iter()
                    .map(|p| format!("{}{}@{}", p.0, if p.2 { "(going)" } else { "" }, p.1))
                    .collect();
                if seen.last() != Some(&now) {
                    seen.push(now);
                }
            }
            let down = 5 - live.len();
            most_down.set(most_down.get().max(down));

            let s = n.status("web").await?;
            Ok(all_ready(5)(&s).then_some(()))
        },
    )
    .await?;
    ensure!(
        most_down.get() <= 2,
        "{} pods down at once",
        most_down.get()
    );
    // Two pods at a time (M = 2): the first pair can go and return before the first poll, the
    // next pair (web-2, web-1) is seen down together; with M = 1 never two.
    ensure!(
        most_down.get() == 2,
        "never two pods replaced together: {:#?}",
        seen.borrow()
    );
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
    n.pods
        .patch(
            "web-0",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"labels": {"app": "other"}}})),
        )
        .await?;
    wait::until(
        "web-0 released",
        Duration::from_secs(60),
        Duration::from_millis(200),
        || async {
            let p = n.pods.get("web-0").await?;
            Ok(owner(&p).is_none().then_some(()))
        },
    )
    .await?;
    let events = k8s::events(&n.client, &n.ns, "web", "SuccessfulCreate").await?;
    ensure!(!events.is_empty(), "no SuccessfulCreate events on the set");
    Ok(())
}

/// S10 (retention, ST-32..ST-34; claims stay Pending here, which the controller does not wait
/// for under Parallel): claims precede their pods with the template's and the selector's labels
/// and no owner under Retain; whenScaled Delete gives a condemned pod's claims a reference to
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
        let vols = serde_json::to_value(pod.spec.unwrap_or_default().volumes)?;
        ensure!(
            vols.to_string().contains(&format!("data-web-{i}")),
            "web-{i} volumes {vols}"
        );
    }
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

/// S6 (#137409, B-1): a Parallel set whose first template never turns Ready is rolled forward
/// unaided once the template is fixed (maxUnavailable unset), for 1 and 3 replicas.
async fn s6_broken_first_template_is_replaced() -> Result<()> {
    let n = ns("s6").await?;
    for (name, replicas) in [("one", 1), ("three", 3)] {
        let mut s = set(name, replicas, json!({"podManagementPolicy": "Parallel"}))?;
        let mut spec = serde_json::to_value(&s.spec)?;
        merge(&mut spec, &broken());
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
        trial("s10_claim_retention", s10_claim_retention),
        trial("s12_adoption", s12_adoption),
    ];
    pilothouse_tests::harness::main(
        "statefulset",
        ClusterOptions {
            replace: Some(vec!["statefulset-controller"]),
            ..Default::default()
        },
        Some(SuitePilothouse {
            args: vec!["--controllers=statefulset-controller".to_string()],
            as_service_account: true,
        }),
        trials,
    )
}
