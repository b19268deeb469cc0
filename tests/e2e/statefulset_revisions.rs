//! Differential test of `statefulset::revision` (spec ST-11..ST-17) against the real thing: on a
//! reference control plane (upstream kube-controller-manager 1.37 running all its controllers),
//! StatefulSets whose templates stress the encoding are created, updated and rolled back; the
//! ControllerRevisions upstream writes are then compared with what Pilothouse's pure functions
//! compute from the set as served: names and `status.updateRevision` (hash of the Go-encoded
//! template and the collision count), the stored `data` bytes (exactly as served, and re-encoded
//! by `go_json`), labels, annotations, the owner reference and the `revision` numbers, and the
//! history kept under `revisionHistoryLimit`.
//!
//! Sets have 0 replicas: upstream still writes their revisions on every sync.

use anyhow::{Context, Result, bail, ensure};
use k8s_openapi::api::apps::v1::{ControllerRevision, StatefulSet};
use kube::Client;
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
use kube::core::Request;
use kube::core::params::GetParams;
use pilothouse_tests::cluster::ClusterOptions;
use pilothouse_tests::harness::{cluster, trial};
use pilothouse_tests::wait;
use serde_json::{Value, json};
use statefulset::revision::{
    Existing, SetSource, go_json, hash, history_to_delete, new_revision, patch_data,
    renamed_for_collision, revision_name,
};
use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

const SETTLE: Duration = Duration::from_secs(60);

struct Ns {
    client: Client,
    ns: String,
    sets: Api<StatefulSet>,
    revisions: Api<ControllerRevision>,
}

async fn ns(prefix: &str) -> Result<Ns> {
    let client = cluster().client().await?;
    let ns = cluster().namespace(prefix).await?;
    Ok(Ns {
        sets: Api::namespaced(client.clone(), &ns),
        revisions: Api::namespaced(client.clone(), &ns),
        client,
        ns,
    })
}

/// A StatefulSet named `name` with 0 replicas and `template` (selector `app: name`).
fn set(name: &str, template: Value, annotations: Value) -> Value {
    json!({
        "apiVersion": "apps/v1",
        "kind": "StatefulSet",
        "metadata": {"name": name, "annotations": annotations},
        "spec": {
            "replicas": 0,
            "serviceName": name,
            "selector": {"matchLabels": {"app": name}},
            "template": template,
        }
    })
}

fn container(name: &str, image: &str) -> Value {
    json!({"name": name, "image": image})
}

fn plain_template(name: &str, image: &str) -> Value {
    json!({
        "metadata": {"labels": {"app": name}},
        "spec": {"containers": [container("main", image)]}
    })
}

/// Strings Go escapes in every way it has: HTML-unsafe characters, U+2028/U+2029, the short
/// control escapes (`\b` and `\f` since Go 1.22), other control characters, DEL, quotes and
/// backslashes, non-ASCII.
const NASTY: &str =
    "<b>&amp;</b> \u{2028}\u{2029} \u{8}\u{c}\n\r\t \u{1}\u{1f}\u{7f} \"q\" \\ / é中😀";

/// Raw GET of one object: the exact text the API server served.
async fn get_raw(n: &Ns, resource: &str, name: &str) -> Result<String> {
    let req = Request::new(format!("/apis/apps/v1/namespaces/{}/{resource}", n.ns))
        .get(name, &GetParams::default())?;
    Ok(n.client.request_text(req).await?)
}

async fn get_json(n: &Ns, resource: &str, name: &str) -> Result<Value> {
    Ok(serde_json::from_str(&get_raw(n, resource, name).await?)?)
}

/// The text of a top-level member's value in a JSON object, byte for byte: how upstream's
/// stored `data` is compared without any re-encoding.
fn raw_member<'a>(json: &'a str, key: &str) -> Option<&'a str> {
    let b = json.as_bytes();
    let mut i = 0;
    let ws = |i: &mut usize| {
        while *i < b.len() && b[*i].is_ascii_whitespace() {
            *i += 1;
        }
    };
    // The end of the value starting at `i` (strings, containers, literals).
    let skip = |mut i: usize| -> Option<usize> {
        let mut depth = 0usize;
        let mut in_str = false;
        while i < b.len() {
            let c = b[i];
            if in_str {
                match c {
                    b'\\' => i += 1,
                    b'"' => {
                        in_str = false;
                        if depth == 0 {
                            return Some(i + 1);
                        }
                    }
                    _ => {}
                }
            } else {
                match c {
                    b'"' => in_str = true,
                    b'{' | b'[' => depth += 1,
                    b'}' | b']' if depth == 0 => return Some(i),
                    b'}' | b']' => {
                        depth -= 1;
                        if depth == 0 {
                            return Some(i + 1);
                        }
                    }
                    b',' if depth == 0 => return Some(i),
                    _ => {}
                }
            }
            i += 1;
        }
        None
    };
    ws(&mut i);
    if b.get(i) != Some(&b'{') {
        return None;
    }
    i += 1;
    loop {
        ws(&mut i);
        let key_end = skip(i)?;
        let k: String = serde_json::from_str(&json[i..key_end]).ok()?;
        i = key_end;
        ws(&mut i);
        if b.get(i) != Some(&b':') {
            return None;
        }
        i += 1;
        ws(&mut i);
        let end = skip(i)?;
        if k == key {
            return Some(json[i..end].trim_end());
        }
        i = end;
        ws(&mut i);
        match b.get(i) {
            Some(b',') => i += 1,
            _ => return None,
        }
    }
}

/// Fails with the first differing byte and some context on both sides.
fn same_bytes(what: &str, want: &[u8], got: &[u8]) -> Result<()> {
    if want == got {
        return Ok(());
    }
    let at = want
        .iter()
        .zip(got)
        .position(|(a, b)| a != b)
        .unwrap_or(want.len().min(got.len()));
    let ctx = |s: &[u8]| {
        let from = at.saturating_sub(60);
        let to = (at + 60).min(s.len());
        String::from_utf8_lossy(&s[from..to]).into_owned()
    };
    bail!(
        "{what}: differs at byte {at} (lengths {} computed, {} upstream)\n  computed: …{}…\n  upstream: …{}…\n  computed in full: {}\n  upstream in full: {}",
        want.len(),
        got.len(),
        ctx(want),
        ctx(got),
        String::from_utf8_lossy(want),
        String::from_utf8_lossy(got)
    )
}

/// The set as served once upstream has synced its current generation.
async fn synced(n: &Ns, name: &str) -> Result<Value> {
    wait::until(
        &format!("upstream to sync {}/{name}", n.ns),
        SETTLE,
        Duration::from_millis(200),
        || async {
            let s = get_json(n, "statefulsets", name).await?;
            let observed = s["status"]["observedGeneration"].as_i64();
            let update = s["status"]["updateRevision"].as_str().unwrap_or("");
            Ok(
                (observed == s["metadata"]["generation"].as_i64() && !update.is_empty())
                    .then_some(s),
            )
        },
    )
    .await
}

fn string_map(v: &Value) -> Option<BTreeMap<String, String>> {
    let m: BTreeMap<String, String> = v
        .as_object()?
        .iter()
        .map(|(k, v)| (k.clone(), v.as_str().unwrap_or_default().to_owned()))
        .collect();
    (!m.is_empty()).then_some(m)
}

/// What `revision` computes for the set as served: the update revision's name, its data bytes
/// and the object upstream should have written, with `revision` number `number`.
struct Expected {
    name: String,
    data: Vec<u8>,
    object: ControllerRevision,
}

fn expected(set: &Value, number: i64, first_count: i32) -> Result<Expected> {
    let name = set["metadata"]["name"].as_str().context("name")?;
    let template = &set["spec"]["template"];
    let count = set["status"]["collisionCount"].as_i64().unwrap_or(0) as i32;
    let annotations = string_map(&set["metadata"]["annotations"]);
    let src = SetSource {
        name,
        namespace: set["metadata"]["namespace"].as_str().context("namespace")?,
        uid: set["metadata"]["uid"].as_str().context("uid")?,
        annotations: annotations.as_ref(),
        template,
    };
    // Built with the count of the first attempt, renamed for the count that succeeded
    // (upstream keeps the first hash label across collisions).
    let mut rev = new_revision(&src, number, first_count);
    renamed_for_collision(&mut rev, name, count);
    let data = patch_data(template);
    let want_name = revision_name(name, &hash(&data, Some(count)));
    ensure!(
        rev.object.metadata.name.as_deref() == Some(want_name.as_str()),
        "new_revision and revision_name disagree: {:?} vs {want_name}",
        rev.object.metadata.name
    );
    Ok(Expected {
        name: want_name,
        data,
        object: rev.object,
    })
}

/// Compares upstream's update revision of `set` with what Pilothouse computes.
async fn check_update_revision(n: &Ns, set: &Value, number: i64, first_count: i32) -> Result<()> {
    let want = expected(set, number, first_count)?;
    let update = set["status"]["updateRevision"].as_str().unwrap_or("");
    ensure!(
        update == want.name,
        "status.updateRevision is {update:?}, computed {:?} (collisionCount {}) from the served template {}",
        want.name,
        set["status"]["collisionCount"],
        set["spec"]["template"]
    );
    check_revision(n, &want).await
}

/// Compares the revision named as computed with what `new_revision` builds.
async fn check_revision(n: &Ns, want: &Expected) -> Result<()> {
    let raw = get_raw(n, "controllerrevisions", &want.name).await?;
    let served: Value = serde_json::from_str(&raw)?;
    let data_text = raw_member(&raw, "data").context("no data member in the served revision")?;
    same_bytes(
        "stored data as served vs patch_data",
        &want.data,
        data_text.as_bytes(),
    )?;
    same_bytes(
        "go_json(served data) vs patch_data",
        &want.data,
        &go_json(&served["data"]),
    )?;
    let meta = &served["metadata"];
    let want_meta = serde_json::to_value(&want.object.metadata)?;
    for field in [
        "name",
        "namespace",
        "labels",
        "annotations",
        "ownerReferences",
    ] {
        let got = meta.get(field).cloned().unwrap_or(Value::Null);
        let exp = want_meta.get(field).cloned().unwrap_or(Value::Null);
        ensure!(
            got == exp,
            "revision {}: metadata.{field} is {got}, new_revision built {exp}",
            want.name
        );
    }
    ensure!(
        served["revision"].as_i64() == want.object.revision,
        "revision {}: revision is {}, expected {:?}",
        want.name,
        served["revision"],
        want.object.revision
    );
    Ok(())
}

/// Names and `revision` numbers of the set's revisions.
async fn revisions_of(n: &Ns) -> Result<BTreeMap<String, i64>> {
    Ok(n.revisions
        .list(&ListParams::default())
        .await?
        .items
        .into_iter()
        .map(|r| (r.metadata.name.unwrap_or_default(), r.revision.unwrap_or(0)))
        .collect())
}

async fn create(n: &Ns, body: Value) -> Result<()> {
    let s: StatefulSet = serde_json::from_value(body)?;
    n.sets.create(&PostParams::default(), &s).await?;
    Ok(())
}

async fn patch_template(n: &Ns, name: &str, template: Value) -> Result<()> {
    // The templates here differ only inside `containers`, which a merge patch replaces whole.
    let p = json!({"spec": {"template": template}});
    n.sets
        .patch(name, &PatchParams::default(), &Patch::Merge(&p))
        .await?;
    Ok(())
}

/// One set, one template: its first revision.
async fn single(prefix: &str, template: impl Fn(&str) -> Value, annotations: Value) -> Result<()> {
    let n = ns(prefix).await?;
    let name = "web";
    create(&n, set(name, template(name), annotations)).await?;
    let s = synced(&n, name).await?;
    check_update_revision(&n, &s, 1, 0).await?;
    let all = revisions_of(&n).await?;
    ensure!(
        all.len() == 1,
        "one revision expected, upstream has {all:?}"
    );
    cluster().delete_namespace(&n.ns).await
}

async fn plain() -> Result<()> {
    single("sts-rev-plain", |n| plain_template(n, "nginx:1"), json!({})).await
}

async fn escapes() -> Result<()> {
    let template = |name: &str| {
        json!({
            "metadata": {
                "labels": {"app": name, "tier": "a-b_c.d"},
                "annotations": {"x.example/nasty": NASTY, "x.example/empty": "", "x.example/lt": "<>"},
            },
            "spec": {"containers": [{
                "name": "main",
                "image": "busybox",
                "command": ["sh", "-c", "echo '<&>' && printf '\\t\\n'"],
                "env": [
                    {"name": "NASTY", "value": NASTY},
                    {"name": "JSON", "value": "{\"a\":[1,2,{\"b\":null}]}"},
                    {"name": "EMPTY", "value": ""},
                ],
            }]}
        })
    };
    // The set's own annotations go to the revision as they are.
    let annotations = json!({"set.example/nasty": NASTY, "kubectl.kubernetes.io/last-applied-configuration": "{\"x\":\"<\u{2028}>\"}"});
    single("sts-rev-escapes", template, annotations).await
}

async fn large_numbers() -> Result<()> {
    // Go decodes every number to float64: 2^53+1 is stored as 2^53, the int64 maximum as
    // 9223372036854775808 printed in 'f' form.
    let template = |name: &str| {
        let mut c = container("main", "busybox");
        c["livenessProbe"] = json!({
            "exec": {"command": ["true"]},
            // 2^62+1: rounded by float64 and printed padded with zeros. (The int64 maximum
            // itself breaks upstream: see int64_max_breaks_upstream_sync.)
            "terminationGracePeriodSeconds": 4_611_686_018_427_387_905_i64,
            "periodSeconds": i32::MAX,
        });
        c["ports"] = json!([{"containerPort": 65535, "hostPort": 1, "protocol": "UDP"}]);
        json!({
            "metadata": {"labels": {"app": name}},
            "spec": {
                "containers": [c],
                // (activeDeadlineSeconds would be the other wide field: forbidden in sets.)
                "terminationGracePeriodSeconds": 9_007_199_254_740_993_i64,
                "securityContext": {"runAsUser": 2_147_483_647, "fsGroup": 0},
            }
        })
    };
    single("sts-rev-numbers", template, json!({})).await
}

async fn resources_and_many_containers() -> Result<()> {
    let template = |name: &str| {
        let containers: Vec<Value> = (0..12)
            .map(|i| {
                let mut c = container(&format!("c{i:02}"), &format!("registry.example/img{i}:v{i}"));
                c["resources"] = json!({
                    "requests": {"cpu": format!("{}m", 100 + i), "memory": "64Mi", "ephemeral-storage": "1Gi"},
                    "limits": {"cpu": "1500m", "memory": format!("{}Gi", i + 1)},
                });
                c["ports"] = json!([{"name": format!("p{i}"), "containerPort": 8000 + i}]);
                c["env"] = json!([{"name": "I", "value": i.to_string()},
                    {"name": "POD", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}}]);
                c
            })
            .collect();
        json!({
            "metadata": {"labels": {"app": name, "z": "1", "a": "2"}},
            "spec": {
                "initContainers": [container("init", "busybox")],
                "containers": containers,
                "nodeSelector": {"kubernetes.io/os": "linux"},
                "tolerations": [{"key": "k", "operator": "Exists", "effect": "NoSchedule"}],
                "volumes": [{"name": "scratch", "emptyDir": {"sizeLimit": "1Gi"}}],
            }
        })
    };
    single("sts-rev-many", template, json!({"a": "b"})).await
}

/// Upstream writes the revision of a template holding the int64 maximum, then fails every sync
/// (its data, printed from a float64 as 9223372036854776000, no longer decodes into an int64):
/// the revision exists under the computed name with the computed bytes, the status never
/// advances.
async fn int64_max_breaks_upstream_sync() -> Result<()> {
    let n = ns("sts-rev-int64max").await?;
    let name = "web";
    let mut c = container("main", "busybox");
    c["livenessProbe"] =
        json!({"exec": {"command": ["true"]}, "terminationGracePeriodSeconds": i64::MAX});
    let template = json!({"metadata": {"labels": {"app": name}}, "spec": {"containers": [c]}});
    create(&n, set(name, template, json!({}))).await?;
    let s = get_json(&n, "statefulsets", name).await?;
    let want = expected(&s, 1, 0)?;
    ensure!(
        s["spec"]["template"]["spec"]["containers"][0]["livenessProbe"]["terminationGracePeriodSeconds"]
            == i64::MAX,
        "the API server changed the value: {}",
        s["spec"]["template"]
    );
    wait::until(
        &format!("upstream to create {}", want.name),
        SETTLE,
        Duration::from_millis(200),
        || async { Ok(n.revisions.get_opt(&want.name).await?) },
    )
    .await?;
    check_revision(&n, &want).await?;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let s = get_json(&n, "statefulsets", name).await?;
    ensure!(
        s["status"]["updateRevision"]
            .as_str()
            .unwrap_or("")
            .is_empty(),
        "upstream synced the set after all (status {}): the int64 quirk is gone",
        s["status"]
    );
    cluster().delete_namespace(&n.ns).await
}

/// An update makes revision 2; reverting the template rolls back to revision 1's object, whose
/// `revision` becomes 3, and no revision is created.
async fn update_and_rollback() -> Result<()> {
    let n = ns("sts-rev-rollback").await?;
    let name = "web";
    create(&n, set(name, plain_template(name, "nginx:1"), json!({}))).await?;
    let s1 = synced(&n, name).await?;
    check_update_revision(&n, &s1, 1, 0).await?;
    let first = s1["status"]["updateRevision"]
        .as_str()
        .unwrap_or("")
        .to_owned();

    patch_template(&n, name, plain_template(name, "nginx:2")).await?;
    let s2 = wait_generation(&n, name, 2).await?;
    check_update_revision(&n, &s2, 2, 0).await?;
    let second = s2["status"]["updateRevision"]
        .as_str()
        .unwrap_or("")
        .to_owned();
    ensure!(first != second, "the update kept revision {first}");

    patch_template(&n, name, plain_template(name, "nginx:1")).await?;
    let s3 = wait_generation(&n, name, 3).await?;
    check_update_revision(&n, &s3, 3, 0).await?;
    ensure!(
        s3["status"]["updateRevision"] == first.as_str(),
        "rollback: update revision {} instead of {first}",
        s3["status"]["updateRevision"]
    );
    let all = revisions_of(&n).await?;
    let want = BTreeMap::from([(first, 3), (second, 2)]);
    ensure!(
        all == want,
        "after rollback upstream has {all:?}, expected {want:?}"
    );
    cluster().delete_namespace(&n.ns).await
}

async fn wait_generation(n: &Ns, name: &str, generation: i64) -> Result<Value> {
    wait::until(
        &format!("{}/{name} at generation {generation} synced", n.ns),
        SETTLE,
        Duration::from_millis(200),
        || async {
            let s = synced(n, name).await?;
            Ok((s["metadata"]["generation"].as_i64() == Some(generation)).then_some(s))
        },
    )
    .await
}

/// `revisionHistoryLimit` 1 over four templates: after each, the revisions upstream keeps are
/// those `history_to_delete` leaves.
async fn history_limit() -> Result<()> {
    let n = ns("sts-rev-history").await?;
    let name = "web";
    let mut body = set(name, plain_template(name, "img:0"), json!({}));
    body["spec"]["revisionHistoryLimit"] = json!(1);
    create(&n, body).await?;
    let mut kept: BTreeMap<String, i64> = BTreeMap::new();
    for step in 0..4i64 {
        if step > 0 {
            patch_template(&n, name, plain_template(name, &format!("img:{step}"))).await?;
        }
        let s = wait_generation(&n, name, step + 1).await?;
        check_update_revision(&n, &s, step + 1, 0).await?;
        let update = s["status"]["updateRevision"]
            .as_str()
            .unwrap_or("")
            .to_owned();
        kept.insert(update.clone(), step + 1);
        // Settled: the set's pods are none, current = update after the status write.
        let entries: Vec<Existing<'_>> = kept
            .iter()
            .map(|(k, r)| Existing {
                name: k,
                revision: *r,
                created: None,
                hash_label: None,
                data: &[],
            })
            .collect();
        let gone: BTreeSet<String> =
            history_to_delete(&entries, Some(&update), Some(&update), [], Some(1))
                .into_iter()
                .collect();
        let want: BTreeSet<String> = kept
            .keys()
            .filter(|k| !gone.contains(*k))
            .cloned()
            .collect();
        let got = wait::until(
            &format!("history after step {step} to be {want:?}"),
            SETTLE,
            Duration::from_millis(200),
            || async {
                let got: BTreeSet<String> = revisions_of(&n).await?.into_keys().collect();
                Ok((got == want).then_some(got))
            },
        )
        .await?;
        kept.retain(|k, _| got.contains(k));
    }
    cluster().delete_namespace(&n.ns).await
}

/// A revision squatting on the name upstream would pick makes it count a collision: the
/// revision is created under the next count's name, `status.collisionCount` is 1, and the hash
/// label stays the first attempt's.
async fn collision() -> Result<()> {
    let name = "web";
    let template = plain_template(name, "nginx:collide");
    // The served template (with the API server's defaults) decides the name: learn it from a
    // first namespace, then squat on it in a second one.
    let probe = ns("sts-rev-coll-probe").await?;
    create(&probe, set(name, template.clone(), json!({}))).await?;
    let s = synced(&probe, name).await?;
    check_update_revision(&probe, &s, 1, 0).await?;
    let squat_name = s["status"]["updateRevision"]
        .as_str()
        .unwrap_or("")
        .to_owned();

    let n = ns("sts-rev-coll").await?;
    // No labels: the selector does not match it, so upstream neither adopts nor reuses it.
    let squatter: ControllerRevision = serde_json::from_value(json!({
        "metadata": {"name": squat_name},
        "data": {"squatter": true},
        "revision": 1,
    }))?;
    n.revisions
        .create(&PostParams::default(), &squatter)
        .await?;
    create(&n, set(name, template, json!({}))).await?;
    let s = synced(&n, name).await?;
    ensure!(
        s["status"]["collisionCount"] == 1,
        "collisionCount is {}, expected 1 after one collision",
        s["status"]["collisionCount"]
    );
    check_update_revision(&n, &s, 1, 0).await?;
    // The squatter is untouched.
    let after = n.revisions.get(&squat_name).await?;
    ensure!(
        after.data.0 == json!({"squatter": true}),
        "squatter changed: {:?}",
        after.data
    );
    // Once the count is persisted the next sync re-finds the same revision (bytes equal).
    let all = revisions_of(&n).await?;
    ensure!(
        all.len() == 2,
        "expected squatter + one revision, got {all:?}"
    );
    cluster().delete_namespace(&probe.ns).await?;
    cluster().delete_namespace(&n.ns).await
}

/// The 1.33-era fixture (upstream's stateful_set_compatibility_test): a 1.37 control plane
/// serves its template without `creationTimestamp`, so upstream writes the 1.34 bytes, whose
/// hash is upstream's published `776999688b`.
async fn upstream_fixture() -> Result<()> {
    let n = ns("sts-rev-fixture").await?;
    let template = json!({
        "metadata": {"annotations": {"test": "value"}, "creationTimestamp": null, "labels": {"app": "foo"}},
        "spec": {"containers": [{"image": "test", "name": "test"}]}
    });
    let mut body = set("test", template, json!({}));
    body["spec"]["selector"] = json!({"matchLabels": {"app": "foo"}});
    create(&n, body).await?;
    let s = synced(&n, "test").await?;
    check_update_revision(&n, &s, 1, 0).await?;
    ensure!(
        s["status"]["updateRevision"] == "test-776999688b",
        "update revision {}, upstream's fixture says test-776999688b",
        s["status"]["updateRevision"]
    );
    cluster().delete_namespace(&n.ns).await
}

/// The scanner that extracts upstream's bytes, on a tricky object (a broken scanner would also
/// fail the comparisons, less readably).
async fn raw_member_scanner() -> Result<()> {
    let j = r#" {"a" : {"x":"}\"","y":[1,{}]} , "data":{"k":"\u003c"} ,"z":1}"#;
    ensure!(raw_member(j, "a") == Some(r#"{"x":"}\"","y":[1,{}]}"#));
    ensure!(raw_member(j, "data") == Some(r#"{"k":"\u003c"}"#));
    ensure!(raw_member(j, "z") == Some("1"));
    ensure!(raw_member(j, "q").is_none());
    Ok(())
}

fn main() {
    let trials = vec![
        trial("raw_member_scanner", raw_member_scanner),
        trial("st12_st13_plain", plain),
        trial("st12_escapes", escapes),
        trial("st12_large_numbers", large_numbers),
        trial(
            "st12_int64_max_breaks_upstream_sync",
            int64_max_breaks_upstream_sync,
        ),
        trial(
            "st12_resources_and_many_containers",
            resources_and_many_containers,
        ),
        trial("st14_update_and_rollback", update_and_rollback),
        trial("st17_history_limit", history_limit),
        trial("st14_collision", collision),
        trial("st13_upstream_fixture", upstream_fixture),
    ];
    let opts = ClusterOptions {
        reference: true,
        ..Default::default()
    };
    pilothouse_tests::harness::main("statefulset-revisions", opts, None, trials)
}
