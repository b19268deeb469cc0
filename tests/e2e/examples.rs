//! The demo's progress checks (`examples/<name>/progress`, run by `tests/demo`) against fixtures
//! of objects rather than live controllers, so that what they decide is pinned down whatever the
//! clock: the control plane runs none of the replaced controllers and no Pilothouse, so the
//! objects in `tests/e2e/examples/` stay exactly as written, status included.
//!
//! All examples share one namespace in the demo. For each example the suite applies its
//! converged objects next to every other example's objects in flight (a CronJob's Job pod still
//! holding its tracking finalizer, a drain half done) and expects its check to pass; then its
//! objects in flight next to every other's converged ones, and expects its check to fail. A check
//! that read another example's objects fails one of the two.

use anyhow::{Context, Result, bail, ensure};
use kube::Client;
use kube::api::{Api, DeleteParams, DynamicObject, Patch, PatchParams, PostParams};
use kube::core::{ApiResource, GroupVersionKind};
use kube::discovery::{self, Scope};
use pilothouse_tests::cluster::ClusterOptions;
use pilothouse_tests::harness::{cluster, trial};
use pilothouse_tests::{k8s, maintenance, wait};
use serde_json::{Value, json};
use std::path::PathBuf;
use std::time::Duration;

/// Cluster-scoped fixtures (nodes, the NodeMaintenance) have the examples' fixed names: one
/// example's scenarios at a time.
static ONE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// The examples `tests/demo` runs: one per built controller, and node-maintenance.
fn examples() -> Result<Vec<String>> {
    let list = std::fs::read_to_string(
        pilothouse_tests::repo_root().join("tests/cluster/replaced-controllers"),
    )?;
    let mut names: Vec<String> = list
        .lines()
        .map(|l| l.split('#').next().unwrap_or_default().trim().to_string())
        .filter(|l| !l.is_empty())
        .collect();
    names.push("node-maintenance".to_string());
    Ok(names)
}

fn fixture_path(example: &str, state: &str) -> PathBuf {
    pilothouse_tests::repo_root()
        .join("tests/e2e/examples")
        .join(example)
        .join(format!("{state}.yaml"))
}

fn fixture(example: &str, state: &str) -> Result<Vec<Value>> {
    let path = fixture_path(example, state);
    let text = std::fs::read_to_string(&path).with_context(|| {
        format!(
            "{} is missing: every example needs converged.yaml and in-flight.yaml",
            path.display()
        )
    })?;
    let docs: Vec<Value> = serde_saphyr::from_multiple(&text)
        .with_context(|| format!("parsing {}", path.display()))?;
    Ok(docs.into_iter().filter(|d| !d.is_null()).collect())
}

async fn resource(client: &Client, api_version: &str, kind: &str) -> Result<(ApiResource, Scope)> {
    let (group, version) = api_version.rsplit_once('/').unwrap_or(("", api_version));
    let gvk = GroupVersionKind::gvk(group, version, kind);
    let (ar, caps) = discovery::pinned_kind(client, &gvk)
        .await
        .with_context(|| format!("discovering {api_version} {kind}"))?;
    Ok((ar, caps.scope))
}

fn api(client: &Client, ar: &ApiResource, scope: &Scope, ns: &str) -> Api<DynamicObject> {
    match scope {
        Scope::Cluster => Api::all_with(client.clone(), ar),
        Scope::Namespaced => Api::namespaced_with(client.clone(), ns, ar),
    }
}

/// What a scenario created outside its namespace, to delete before the next one.
type ClusterScoped = Vec<(ApiResource, String)>;

/// Creates `objects` in order (in `ns` where namespaced), then writes each one's `status`
/// through the status subresource; an owner reference without `uid` gets the named owner's.
async fn create_all(client: &Client, ns: &str, objects: Vec<Value>) -> Result<ClusterScoped> {
    let mut cluster_scoped = Vec::new();
    for mut obj in objects {
        let kind = obj["kind"]
            .as_str()
            .context("a fixture without kind")?
            .to_string();
        let av = obj["apiVersion"]
            .as_str()
            .context("a fixture without apiVersion")?
            .to_string();
        let name = obj["metadata"]["name"]
            .as_str()
            .context("a fixture without name")?
            .to_string();
        let status = obj.as_object_mut().and_then(|o| o.remove("status"));
        if let Some(refs) = obj["metadata"]["ownerReferences"].as_array_mut() {
            for r in refs.iter_mut().filter(|r| r.get("uid").is_none()) {
                let (oar, oscope) = resource(
                    client,
                    r["apiVersion"].as_str().unwrap_or_default(),
                    r["kind"].as_str().unwrap_or_default(),
                )
                .await?;
                let owner = api(client, &oar, &oscope, ns)
                    .get(r["name"].as_str().unwrap_or_default())
                    .await
                    .with_context(|| {
                        format!("{kind} {name}: its owner {r} (created earlier in the fixture?)")
                    })?;
                r["uid"] = json!(owner.metadata.uid);
            }
        }
        let (ar, scope) = resource(client, &av, &kind).await?;
        let a = api(client, &ar, &scope, ns);
        a.create(&PostParams::default(), &serde_json::from_value(obj)?)
            .await
            .with_context(|| format!("creating {kind} {name}"))?;
        if let Scope::Cluster = scope {
            cluster_scoped.push((ar, name.clone()));
        }
        if let Some(status) = status {
            a.patch_status(
                &name,
                &PatchParams::default(),
                &Patch::Merge(json!({ "status": status })),
            )
            .await
            .with_context(|| format!("writing the status of {kind} {name}"))?;
        }
    }
    Ok(cluster_scoped)
}

/// Runs `examples/<example>/progress` as `tests/demo` does; its exit status and its line.
async fn progress(example: &str, ns: &str) -> Result<(bool, String)> {
    let script = pilothouse_tests::repo_root()
        .join("examples")
        .join(example)
        .join("progress");
    let kubectl = format!(
        "{} --kubeconfig={}",
        cluster().bin_dir()?.join("kubectl").display(),
        cluster().kubeconfig.display()
    );
    let ns = ns.to_string();
    let out = tokio::task::spawn_blocking(move || {
        std::process::Command::new("bash")
            .arg(&script)
            .env("KUBECTL", kubectl)
            .env("NS", ns)
            .output()
    })
    .await??;
    let line = String::from_utf8_lossy(&out.stdout).trim().to_string();
    Ok((out.status.success(), line))
}

/// One scenario in a fresh namespace: `own` of `example`, `others` of every other example.
async fn scenario(example: &str, own: &str, others: &str) -> Result<(bool, String)> {
    let client = cluster().client().await?;
    let ns = cluster().namespace("ex").await?;
    k8s::wait_service_account(&client, &ns).await?;
    let mut objects = fixture(example, own)?;
    for other in examples()?.iter().filter(|o| o.as_str() != example) {
        objects.extend(fixture(other, others)?);
    }
    let created = create_all(&client, &ns, objects).await;
    let result = match &created {
        Ok(_) => progress(example, &ns).await,
        Err(e) => Err(anyhow::anyhow!("{e:#}")),
    };
    // Clean up whatever was made, also after a failure: the next scenario reuses the names.
    k8s::release_pods(&client, &ns).await?;
    cluster().delete_namespace(&ns).await?;
    for (ar, name) in created.unwrap_or_default() {
        let a: Api<DynamicObject> = Api::all_with(client.clone(), &ar);
        let _ = a.delete(&name, &DeleteParams::default()).await;
        wait::until(
            &format!("{} {name} gone", ar.kind),
            Duration::from_secs(30),
            Duration::from_millis(100),
            || async { Ok(a.get_opt(&name).await?.is_none().then_some(())) },
        )
        .await?;
    }
    result
}

async fn check(example: String) -> Result<()> {
    let _one = ONE_AT_A_TIME.lock().await;
    let (ok, line) = scenario(&example, "converged", "in-flight").await?;
    ensure!(
        ok,
        "{example}: converged, with every other example in flight, yet progress says not \
         converged: {line}"
    );
    let (ok, line) = scenario(&example, "in-flight", "converged").await?;
    if ok {
        bail!(
            "{example}: in flight, with every other example converged, yet progress says \
             converged: {line}"
        );
    }
    Ok(())
}

fn install_crd(c: &pilothouse_tests::Cluster) -> Result<()> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?
        .block_on(maintenance::install_crd(c))
}

fn main() {
    let names = examples().expect("tests/cluster/replaced-controllers");
    let trials = names
        .into_iter()
        .map(|name| {
            let label: &'static str = Box::leak(name.clone().into_boxed_str());
            trial(label, move || check(name))
        })
        .collect();
    pilothouse_tests::harness::main_with_setup(
        "examples",
        // No kwok node and none of the replaced controllers: nothing moves the fixtures.
        ClusterOptions {
            nodes: 0,
            ..Default::default()
        },
        install_crd,
        None,
        trials,
    )
}
