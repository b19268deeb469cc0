//! Sync tests: the whole controller (its real `init`, handlers, queue and syncs) against the test
//! kit's caches and recording writer, on tokio's paused clock. Writes reach the caches only when
//! a test lets the watch catch up (`Kit::observe`).

use crate::model::StatefulSet;
use crate::{DECLARATION, StatefulSetOptions, init};
use k8s_openapi::api::apps::v1::ControllerRevision;
use serde_json::{Value, json};
use shared::api::writer::Call;
use shared::cache::pod::Pod;
use shared::testkit::{Kit, Running, eventually, settle};
use std::time::Duration;

fn set(replicas: i32, policy: &str) -> StatefulSet {
    serde_json::from_value(json!({
        "apiVersion": "apps/v1", "kind": "StatefulSet",
        "metadata": {"name": "web", "namespace": "ns", "uid": "uid-web", "resourceVersion": "1", "generation": 1},
        "spec": {
            "replicas": replicas,
            "serviceName": "web",
            "podManagementPolicy": policy,
            "selector": {"matchLabels": {"app": "web"}},
            "updateStrategy": {"type": "RollingUpdate", "rollingUpdate": {"partition": 0}},
            "revisionHistoryLimit": 10,
            "template": {
                "metadata": {"labels": {"app": "web"}},
                "spec": {"containers": [{"name": "c", "image": "nginx:1", "resources": {}}]}
            }
        }
    }))
    .unwrap()
}

/// The controller under test, built by its real `init` on the kit.
fn controller(kit: &Kit) -> Box<dyn shared::runtime::controller::Controller> {
    init(
        StatefulSetOptions {
            concurrent_statefulset_syncs: 5,
        },
        kit.setup(DECLARATION.name, DECLARATION.event_source),
    )
    .unwrap()
}

fn start(kit: &Kit, sets: Vec<StatefulSet>, pods: Vec<Pod>) -> Running {
    let ctl = controller(kit);
    kit.seed(sets);
    kit.seed(pods);
    kit.seed(Vec::<ControllerRevision>::new());
    kit.seed(Vec::<k8s_openapi::api::core::v1::PersistentVolumeClaim>::new());
    kit.start(ctl)
}

fn creates(kit: &Kit, plural: &str) -> Vec<Value> {
    kit.api
        .calls()
        .into_iter()
        .filter_map(|c| match c {
            Call::Create(t, v) if t.plural == plural => Some(v),
            Call::CreateRaw(t, b) if t.plural == plural => serde_json::from_slice(&b).ok(),
            _ => None,
        })
        .collect()
}

fn pod_names(kit: &Kit) -> Vec<String> {
    creates(kit, "pods")
        .iter()
        .map(|p| {
            p["metadata"]["name"]
                .as_str()
                .unwrap_or_default()
                .to_string()
        })
        .collect()
}

fn status_writes(kit: &Kit) -> Vec<Value> {
    kit.api
        .calls()
        .into_iter()
        .filter_map(|c| match c {
            Call::Replace(t, v)
                if t.plural == "statefulsets" && t.subresource.as_deref() == Some("status") =>
            {
                Some(v["status"].clone())
            }
            _ => None,
        })
        .collect()
}

/// ST-11, ST-14 (d), ST-20, ST-40: a new OrderedReady set gets its first revision, then web-0
/// only, labelled with that revision; the status names it as both revisions.
#[tokio::test(start_paused = true)]
async fn st20_a_new_ordered_set_creates_its_revision_then_web_0_only() {
    let kit = Kit::new();
    let running = start(&kit, vec![set(3, "OrderedReady")], vec![]);
    assert!(eventually(Duration::from_secs(1), || !status_writes(&kit).is_empty()).await);
    let revs = creates(&kit, "controllerrevisions");
    assert_eq!(revs.len(), 1, "{revs:?}");
    let rev_name = revs[0]["metadata"]["name"].as_str().unwrap().to_string();
    assert!(rev_name.starts_with("web-"), "{rev_name}");
    assert_eq!(pod_names(&kit), ["web-0"]);
    let pod = &creates(&kit, "pods")[0];
    assert_eq!(
        pod["metadata"]["labels"]["controller-revision-hash"],
        rev_name.as_str()
    );
    assert_eq!(
        pod["metadata"]["labels"]["apps.kubernetes.io/pod-index"],
        "0"
    );
    let status = status_writes(&kit).pop().unwrap();
    assert_eq!(status["updateRevision"], rev_name.as_str());
    assert_eq!(status["currentRevision"], rev_name.as_str());
    assert_eq!(status["collisionCount"], 0);
    assert_eq!(status["observedGeneration"], 1);
    // Events as upstream's (ST-43; the verb title-cased, as 1.37 prints it).
    assert!(
        kit.api
            .events()
            .iter()
            .any(|(_, reason, msg)| reason == "SuccessfulCreate"
                && msg == "Create Pod web-0 in StatefulSet web successful"),
        "{:?}",
        kit.api.events()
    );
    running.stop().await;
}

/// ST-21: Parallel creates every pod in one sync.
#[tokio::test(start_paused = true)]
async fn st21_parallel_creates_every_pod_at_once() {
    let kit = Kit::new();
    let running = start(&kit, vec![set(4, "Parallel")], vec![]);
    assert!(eventually(Duration::from_secs(1), || pod_names(&kit).len() == 4).await);
    let mut names = pod_names(&kit);
    names.sort();
    assert_eq!(names, ["web-0", "web-1", "web-2", "web-3"]);
    running.stop().await;
}

/// ST-44, SB-8: until the watch shows this set's own writes (its new revision and pods), another
/// sync writes nothing: no second revision, no duplicate pod.
#[tokio::test(start_paused = true)]
async fn st44_a_sync_waits_for_the_caches_to_show_its_own_writes() {
    let kit = Kit::new();
    let s = set(2, "Parallel");
    let running = start(&kit, vec![s.clone()], vec![]);
    assert!(eventually(Duration::from_secs(1), || pod_names(&kit).len() == 2).await);
    let writes = kit.api.writes().len();
    // The set changes (a label), the watch has not delivered the pods or the revision yet.
    let mut touched = s.clone();
    touched.metadata.resource_version = Some("2".into());
    touched.metadata.labels = Some([("x".to_string(), "y".to_string())].into());
    kit.apply(touched);
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(kit.api.writes().len(), writes, "{:?}", kit.api.writes());
    assert_eq!(creates(&kit, "controllerrevisions").len(), 1);
    assert!(
        kit.metrics
            .encode()
            .contains("statefulset_controller_stale_sync_skips_total{group=\"apps\",resource=\"controllerrevisions\"}"),
        "{}",
        kit.metrics.encode()
    );
    running.stop().await;
}

/// Bad input: a selector the API would not produce gets a Warning naming the field, no writes.
#[tokio::test(start_paused = true)]
async fn an_invalid_selector_is_a_warning_naming_the_field() {
    let kit = Kit::new();
    let mut s = set(2, "Parallel");
    s.spec.as_mut().unwrap().selector = serde_json::from_value(json!({
        "matchExpressions": [{"key": "app", "operator": "Within", "values": ["web"]}]
    }))
    .unwrap();
    let running = start(&kit, vec![s], vec![]);
    assert!(
        eventually(Duration::from_secs(1), || kit.api.events().iter().any(
            |(_, reason, msg)| reason == "InvalidSelector" && msg.contains("spec.selector")
        ))
        .await,
        "{:?}",
        kit.api.events()
    );
    assert!(
        kit.api
            .writes()
            .iter()
            .all(|c| c.target().plural == "events")
    );
    running.stop().await;
}

/// SB-6 bad input: an opt-in that is not a duration is a Warning naming the annotation; the set
/// is still synced as upstream would.
#[tokio::test(start_paused = true)]
async fn b6_an_invalid_opt_in_is_a_warning_naming_the_annotation() {
    let kit = Kit::new();
    let mut s = set(1, "OrderedReady");
    s.metadata.annotations = Some(
        [(
            crate::plan::REPLACE_UNAVAILABLE_AFTER.to_string(),
            "forever".to_string(),
        )]
        .into(),
    );
    let running = start(&kit, vec![s], vec![]);
    assert!(eventually(Duration::from_secs(1), || pod_names(&kit) == ["web-0"]).await);
    assert!(
        kit.api
            .events()
            .iter()
            .any(|(t, reason, msg)| t == "Warning"
                && reason == "InvalidAnnotation"
                && msg.contains(crate::plan::REPLACE_UNAVAILABLE_AFTER)),
        "{:?}",
        kit.api.events()
    );
    running.stop().await;
}

/// A revision written before the API server defaulted `imagePullPolicy`: its template lacks
/// the member the set's (served, defaulted) template has.
fn revision_without_a_default() -> ControllerRevision {
    serde_json::from_value(json!({
        "apiVersion": "apps/v1", "kind": "ControllerRevision",
        "metadata": {
            "name": "web-older", "namespace": "ns", "uid": "uid-rev", "resourceVersion": "5",
            "labels": {"app": "web", "controller.kubernetes.io/hash": "older"},
            "ownerReferences": [{"apiVersion": "apps/v1", "kind": "StatefulSet", "name": "web",
                                 "uid": "uid-web", "controller": true, "blockOwnerDeletion": true}]
        },
        "data": {"spec": {"template": {"$patch": "replace",
            "metadata": {"labels": {"app": "web"}},
            "spec": {"containers": [{"name": "c", "image": "nginx:1", "resources": {}}]}}}},
        "revision": 1
    }))
    .unwrap()
}

fn with_pull_policy(s: StatefulSet) -> StatefulSet {
    let mut v = serde_json::to_value(s).unwrap();
    v["spec"]["template"]["spec"]["containers"][0]["imagePullPolicy"] = json!("IfNotPresent");
    serde_json::from_value(v).unwrap()
}

fn start_with_revision(kit: &Kit) -> Running {
    let ctl = controller(kit);
    kit.seed(vec![with_pull_policy(set(1, "Parallel"))]);
    kit.seed(Vec::<Pod>::new());
    kit.seed(vec![revision_without_a_default()]);
    kit.seed(Vec::<k8s_openapi::api::core::v1::PersistentVolumeClaim>::new());
    kit.start(ctl)
}

/// The one default the test API server applies to a dry-run PodTemplate.
fn pull_policy_default(v: &mut Value) {
    for c in v["template"]["spec"]["containers"]
        .as_array_mut()
        .into_iter()
        .flatten()
    {
        if let Some(c) = c.as_object_mut() {
            c.entry("imagePullPolicy").or_insert(json!("IfNotPresent"));
        }
    }
}

fn dry_runs(kit: &Kit) -> usize {
    kit.api
        .calls()
        .iter()
        .filter(|c| matches!(c, Call::DryRunCreate(t, _) if t.plural == "podtemplates"))
        .count()
}

/// ST-15 with defaults: the newest revision lacks only a member API-server defaulting adds; once
/// the API server has defaulted it (a dry-run PodTemplate create), it is the set's template:
/// reused, no new revision (no rollout).
#[tokio::test(start_paused = true)]
async fn st15_a_revision_missing_only_defaults_is_reused() {
    let kit = Kit::new();
    kit.api.default_dry_runs(pull_policy_default);
    let running = start_with_revision(&kit);
    assert!(eventually(Duration::from_secs(1), || !status_writes(&kit).is_empty()).await);
    assert!(creates(&kit, "controllerrevisions").is_empty());
    assert_eq!(dry_runs(&kit), 1);
    let status = status_writes(&kit).pop().unwrap();
    assert_eq!(status["updateRevision"], "web-older");
    assert_eq!(
        creates(&kit, "pods")[0]["metadata"]["labels"]["controller-revision-hash"],
        "web-older"
    );
    running.stop().await;
}

/// ST-15: when defaulting does not explain the difference, or the dry run fails (no
/// `create podtemplates` permission), a new revision is created, as without defaults.
#[tokio::test(start_paused = true)]
async fn st15_without_matching_defaults_a_new_revision_is_created() {
    for forbidden in [false, true] {
        let kit = Kit::new();
        if forbidden {
            kit.api.fail("create", "podtemplates", 1, 403, "Forbidden");
        }
        let running = start_with_revision(&kit);
        assert!(
            eventually(Duration::from_secs(1), || {
                creates(&kit, "controllerrevisions").len() == 1
            })
            .await
        );
        assert_eq!(dry_runs(&kit), 1);
        running.stop().await;
    }
}

/// ST-15: a dry run that may succeed later (a 503) fails the sync, which is retried: no new
/// revision in between (that would roll every pod).
#[tokio::test(start_paused = true)]
async fn st15_a_failing_dry_run_is_retried_not_taken_for_a_change() {
    let kit = Kit::new();
    kit.api.default_dry_runs(pull_policy_default);
    kit.api
        .fail("create", "podtemplates", 1, 503, "ServiceUnavailable");
    let running = start_with_revision(&kit);
    assert!(eventually(Duration::from_secs(5), || !status_writes(&kit).is_empty()).await);
    assert!(creates(&kit, "controllerrevisions").is_empty());
    assert_eq!(dry_runs(&kit), 2);
    assert_eq!(
        status_writes(&kit).pop().unwrap()["updateRevision"],
        "web-older"
    );
    running.stop().await;
}

/// ST-15: a real template change is not worth a request: no dry run.
#[tokio::test(start_paused = true)]
async fn st15_a_changed_template_costs_no_request() {
    let kit = Kit::new();
    let ctl = controller(&kit);
    let mut v = serde_json::to_value(with_pull_policy(set(1, "Parallel"))).unwrap();
    v["spec"]["template"]["spec"]["containers"][0]["image"] = json!("nginx:2");
    kit.seed(vec![serde_json::from_value::<StatefulSet>(v).unwrap()]);
    kit.seed(Vec::<Pod>::new());
    kit.seed(vec![revision_without_a_default()]);
    kit.seed(Vec::<k8s_openapi::api::core::v1::PersistentVolumeClaim>::new());
    let running = kit.start(ctl);
    assert!(
        eventually(Duration::from_secs(1), || {
            creates(&kit, "controllerrevisions").len() == 1
        })
        .await
    );
    assert_eq!(dry_runs(&kit), 0);
    running.stop().await;
}

/// ST-43: a failed write's event carries the API server's message, as upstream's Go error prints
/// it, not the client's debug form.
#[tokio::test(start_paused = true)]
async fn a_failed_create_is_an_event_with_the_api_message() {
    let kit = Kit::new();
    kit.api.fail("create", "pods", 1, 403, "Forbidden");
    let running = start(&kit, vec![set(1, "Parallel")], vec![]);
    let want = "Create Pod web-0 in StatefulSet web failed error: injected 403 Forbidden";
    assert!(
        eventually(Duration::from_secs(2), || kit.api.events().iter().any(
            |(t, r, m)| t == "Warning" && r == "FailedCreate" && m == want
        ))
        .await,
        "{:?}",
        kit.api.events()
    );
    running.stop().await;
}

/// `s` with `spec.template.spec.terminationGracePeriodSeconds` set to `grace`, or absent.
fn with_grace(s: StatefulSet, grace: Option<i64>) -> StatefulSet {
    let mut v = serde_json::to_value(s).unwrap();
    let spec = v["spec"]["template"]["spec"].as_object_mut().unwrap();
    match grace {
        Some(g) => {
            spec.insert("terminationGracePeriodSeconds".into(), json!(g));
        }
        None => {
            spec.remove("terminationGracePeriodSeconds");
        }
    }
    serde_json::from_value(v).unwrap()
}

/// `s` renamed (name, UID, selector and pod labels), to run beside another set.
fn renamed(s: StatefulSet, name: &str) -> StatefulSet {
    let mut v = serde_json::to_value(s).unwrap();
    v["metadata"]["name"] = json!(name);
    v["metadata"]["uid"] = json!(format!("uid-{name}"));
    v["spec"]["serviceName"] = json!(name);
    v["spec"]["selector"]["matchLabels"]["app"] = json!(name);
    v["spec"]["template"]["metadata"]["labels"]["app"] = json!(name);
    serde_json::from_value(v).unwrap()
}

/// The watch catches up with every object of one kind: each whose stored resourceVersion differs
/// from the cached one (or that is gone from the tracker) is delivered.
fn catch_up_kind<K: shared::cache::informers::Watched>(kit: &Kit) {
    let key = |m: &kube::api::ObjectMeta| {
        (
            m.namespace.clone().unwrap_or_default(),
            m.name.clone().unwrap_or_default(),
            m.resource_version.clone(),
        )
    };
    let stored: Vec<_> = kit
        .api
        .objects::<K>()
        .iter()
        .map(|o| key(o.meta()))
        .collect();
    let cached: Vec<_> = kit
        .informers
        .testkit_get::<K>()
        .list()
        .iter()
        .map(|o| key(o.meta()))
        .collect();
    for (ns, name, rv) in stored.iter().chain(&cached) {
        let same = |(n, m, r): &(String, String, Option<String>)| n == ns && m == name && r == rv;
        if !(stored.iter().any(same) && cached.iter().any(same)) {
            kit.observe::<K>(ns, name);
        }
    }
}

/// The watch catches up with everything the set's syncs wrote (ST-44 lets the next sync act).
fn catch_up(kit: &Kit) {
    catch_up_kind::<StatefulSet>(kit);
    catch_up_kind::<Pod>(kit);
    catch_up_kind::<ControllerRevision>(kit);
}

/// Status writes (attempted, failed ones included) carrying `observedGeneration: generation`:
/// each is one whole sync of that generation (a sync writes status at most once).
fn status_attempts(kit: &Kit, generation: i64) -> usize {
    status_writes(kit)
        .iter()
        .filter(|s| s["observedGeneration"] == generation)
        .count()
}

/// Fails the next `times` status writes of the set with a 500 (each fails its sync, which is
/// retried: another whole sync of the same generation).
fn fail_status_writes(kit: &Kit, times: usize) {
    let mut left = times;
    kit.api.fail_when(move |c| match c {
        Call::Replace(t, _)
            if left > 0
                && t.plural == "statefulsets"
                && t.subresource.as_deref() == Some("status") =>
        {
            left -= 1;
            Some(shared::testkit::api_error(
                500,
                "InternalError",
                "injected 500 InternalError",
            ))
        }
        _ => None,
    });
}

/// How many times `UnsafeZeroGracePeriod` was reported, and the stored events carrying it:
/// the recorder writes a repeat as a count bump of the same Event, so the counts are summed.
fn zero_grace_events(kit: &Kit) -> (i32, Vec<k8s_openapi::api::core::v1::Event>) {
    let events: Vec<k8s_openapi::api::core::v1::Event> = kit
        .api
        .objects::<k8s_openapi::api::core::v1::Event>()
        .into_iter()
        .filter(|e| e.reason.as_deref() == Some("UnsafeZeroGracePeriod"))
        .collect();
    (events.iter().map(|e| e.count.unwrap_or(1)).sum(), events)
}

/// The value of one series in the kit's metrics text, if present.
fn series(kit: &Kit, series: &str) -> Option<String> {
    kit.metrics.encode().lines().find_map(|l| {
        l.strip_prefix(series)
            .and_then(|rest| rest.strip_prefix(' '))
            .map(str::to_string)
    })
}

fn zero_grace_gauge(kit: &Kit, set: &str) -> Option<String> {
    series(
        kit,
        &format!(
            "pilothouse_statefulset_zero_grace_period{{namespace=\"ns\",statefulset=\"{set}\"}}"
        ),
    )
}

/// SB-7, ST-39: `terminationGracePeriodSeconds: 0` gets one Warning `UnsafeZeroGracePeriod`
/// on the set, naming the field, per generation: several syncs of one generation (each status
/// write fails, so each retry is a whole sync) add nothing; a new generation, still zero, warns
/// once more; a new generation with a positive grace period does not, and the gauge follows
/// (1, then 0).
#[tokio::test(start_paused = true)]
async fn b7_zero_grace_period_warns_once_per_generation() {
    let kit = Kit::new();
    fail_status_writes(&kit, 3);
    let running = start(&kit, vec![with_grace(set(1, "Parallel"), Some(0))], vec![]);
    // Generation 1: four whole syncs (three failed status writes, then one that succeeds).
    assert!(
        eventually(Duration::from_secs(30), || {
            catch_up(&kit);
            status_attempts(&kit, 1) >= 4
        })
        .await,
        "{:?}",
        status_writes(&kit)
    );
    tokio::time::sleep(Duration::from_secs(5)).await;
    catch_up(&kit);
    tokio::time::sleep(Duration::from_secs(5)).await;
    settle().await;
    let (count, events) = zero_grace_events(&kit);
    assert_eq!(count, 1, "{events:?}");
    let e = &events[0];
    assert_eq!(e.type_.as_deref(), Some("Warning"));
    assert_eq!(e.involved_object.kind.as_deref(), Some("StatefulSet"));
    assert_eq!(e.involved_object.name.as_deref(), Some("web"));
    assert_eq!(e.involved_object.uid.as_deref(), Some("uid-web"));
    assert!(
        e.message
            .as_deref()
            .unwrap_or_default()
            .contains("spec.template.spec.terminationGracePeriodSeconds"),
        "{e:?}"
    );
    assert_eq!(zero_grace_gauge(&kit, "web").as_deref(), Some("1"));

    // Generation 2, still zero (a new image): one more warning over three whole syncs.
    fail_status_writes(&kit, 2);
    let mut next = kit.api.object::<StatefulSet>("ns", "web").unwrap();
    next.spec.as_mut().unwrap().template["spec"]["containers"][0]["image"] = json!("nginx:2");
    let next = kit.writer().replace(&next).await.unwrap();
    assert_eq!(next.metadata.generation, Some(2));
    kit.observe::<StatefulSet>("ns", "web");
    assert!(
        eventually(Duration::from_secs(30), || {
            catch_up(&kit);
            status_attempts(&kit, 2) >= 3
        })
        .await,
        "{:?}",
        status_writes(&kit)
    );
    tokio::time::sleep(Duration::from_secs(5)).await;
    settle().await;
    let (count, events) = zero_grace_events(&kit);
    assert_eq!(count, 2, "{events:?}");
    assert_eq!(zero_grace_gauge(&kit, "web").as_deref(), Some("1"));

    // Generation 3 with a positive grace period: no warning, the gauge drops to 0.
    let next = with_grace(
        kit.api.object::<StatefulSet>("ns", "web").unwrap(),
        Some(30),
    );
    let next = kit.writer().replace(&next).await.unwrap();
    assert_eq!(next.metadata.generation, Some(3));
    kit.observe::<StatefulSet>("ns", "web");
    assert!(
        eventually(Duration::from_secs(30), || {
            catch_up(&kit);
            status_attempts(&kit, 3) >= 1
        })
        .await,
        "{:?}",
        status_writes(&kit)
    );
    settle().await;
    assert_eq!(zero_grace_events(&kit).0, 2, "{:?}", kit.api.events());
    assert_eq!(zero_grace_gauge(&kit, "web").as_deref(), Some("0"));
    running.stop().await;
}

/// SB-7: a positive or absent grace period (the API's default is 30 s) is not warned about; the
/// gauge says 0 for each set.
#[tokio::test(start_paused = true)]
async fn b7_a_positive_or_absent_grace_period_is_not_warned() {
    let kit = Kit::new();
    let positive = with_grace(set(1, "Parallel"), Some(30));
    let absent = with_grace(renamed(set(1, "Parallel"), "db"), None);
    let running = start(&kit, vec![positive, absent], vec![]);
    assert!(
        eventually(Duration::from_secs(10), || {
            catch_up(&kit);
            status_attempts(&kit, 1) >= 2
        })
        .await,
        "{:?}",
        status_writes(&kit)
    );
    tokio::time::sleep(Duration::from_secs(5)).await;
    settle().await;
    assert_eq!(zero_grace_events(&kit).0, 0, "{:?}", kit.api.events());
    assert!(
        kit.api
            .events()
            .iter()
            .all(|(_, reason, _)| reason != "UnsafeZeroGracePeriod"),
        "{:?}",
        kit.api.events()
    );
    assert_eq!(zero_grace_gauge(&kit, "web").as_deref(), Some("0"));
    assert_eq!(zero_grace_gauge(&kit, "db").as_deref(), Some("0"));
    running.stop().await;
}

/// A deleted set's series are removed and its SB-7 memory dropped (upstream keeps its gauges
/// until the process restarts).
#[tokio::test(start_paused = true)]
async fn a_deleted_set_leaves_no_series() {
    let kit = Kit::new();
    let running = start(&kit, vec![with_grace(set(1, "Parallel"), Some(0))], vec![]);
    assert!(
        eventually(Duration::from_secs(10), || {
            catch_up(&kit);
            zero_grace_gauge(&kit, "web").as_deref() == Some("1")
        })
        .await
    );
    let text = kit.metrics.encode();
    assert!(
        text.contains("statefulset_controller_statefulset_max_unavailable{statefulset_namespace=\"ns\",statefulset_name=\"web\""),
        "{text}"
    );
    kit.remove(kit.api.object::<StatefulSet>("ns", "web").unwrap());
    assert!(
        eventually(Duration::from_secs(10), || {
            zero_grace_gauge(&kit, "web").is_none()
        })
        .await,
        "{}",
        kit.metrics.encode()
    );
    let text = kit.metrics.encode();
    assert!(!text.contains("statefulset_name=\"web\""), "{text}");
    running.stop().await;
}

/// PX-1: a real StatefulSet object at the API's extremes, through the whole controller
/// (its conversion into the plan's view included): replicas, partition, minReadySeconds and
/// revisionHistoryLimit at i32::MAX, maxUnavailable 100%, a claim template with both retention
/// policies, the SB-6 annotation at Go's longest duration, and `ordinals.start` at i32::MAX - 1
/// (so only two ordinals fit in an int32). No panic, every created name a valid ordinal, and the
/// ordered set creates its first pod only.
#[tokio::test(start_paused = true)]
async fn a_set_at_the_apis_extremes_creates_only_valid_ordinals() {
    let kit = Kit::new();
    let extreme = |name: &str, policy: &str, start: i32| -> StatefulSet {
        let mut s = set(i32::MAX, policy);
        let mut v = serde_json::to_value(&s).unwrap();
        v["metadata"]["name"] = json!(name);
        v["metadata"]["uid"] = json!(format!("uid-{name}"));
        v["metadata"]["annotations"] = json!({
            crate::plan::REPLACE_UNAVAILABLE_AFTER: "2562047h47m16.854775807s"
        });
        v["spec"]["serviceName"] = json!(name);
        v["spec"]["selector"]["matchLabels"]["app"] = json!(name);
        v["spec"]["template"]["metadata"]["labels"]["app"] = json!(name);
        v["spec"]["ordinals"] = json!({"start": start});
        v["spec"]["minReadySeconds"] = json!(i32::MAX);
        v["spec"]["revisionHistoryLimit"] = json!(i32::MAX);
        v["spec"]["updateStrategy"] = json!({"type": "RollingUpdate", "rollingUpdate": {"partition": i32::MAX, "maxUnavailable": "100%"}});
        v["spec"]["persistentVolumeClaimRetentionPolicy"] =
            json!({"whenDeleted": "Delete", "whenScaled": "Delete"});
        v["spec"]["volumeClaimTemplates"] = json!([{
            "metadata": {"name": "data"},
            "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}}
        }]);
        s = serde_json::from_value(v).unwrap();
        s
    };
    let running = start(
        &kit,
        vec![
            extreme("top", "Parallel", i32::MAX - 1),
            extreme("big", "OrderedReady", 0),
        ],
        vec![],
    );
    assert!(
        eventually(Duration::from_secs(2), || {
            let names = pod_names(&kit);
            names.iter().any(|n| n.starts_with("big-"))
                && names.iter().any(|n| n.starts_with("top-"))
        })
        .await,
        "{:?}",
        pod_names(&kit)
    );
    tokio::time::sleep(Duration::from_secs(5)).await;
    settle().await;
    let mut names = pod_names(&kit);
    names.sort();
    assert_eq!(
        names,
        ["big-0", "top-2147483646", "top-2147483647"],
        "each valid ordinal created once"
    );
    // Each pod's claim came first: named after the template, the set and the ordinal.
    let order: Vec<String> = kit
        .api
        .calls()
        .into_iter()
        .filter_map(|c| match c {
            Call::Create(t, v) if t.plural == "pods" || t.plural == "persistentvolumeclaims" => {
                v["metadata"]["name"].as_str().map(String::from)
            }
            _ => None,
        })
        .collect();
    for pod in ["big-0", "top-2147483646", "top-2147483647"] {
        let claim = format!("data-{pod}");
        let at = |n: &str| order.iter().position(|o| o == n);
        assert!(
            at(&claim).is_some() && at(&claim) < at(pod),
            "{claim} before {pod}: {order:?}"
        );
        assert_eq!(
            order.iter().filter(|o| **o == claim).count(),
            1,
            "{order:?}"
        );
    }
    assert_eq!(order.len(), 6, "{order:?}");
    let panics = series(
        &kit,
        "pilothouse_reconcile_panics_total{controller=\"statefulset-controller\"}",
    );
    assert!(matches!(panics.as_deref(), None | Some("0")), "{panics:?}");
    running.stop().await;
}

/// A `Recreate` set of two Parallel pods, both Running and Ready at the old revision `web-older`,
/// whose template has changed since (nginx:2), seeded with the older revision.
fn recreate_set(kit: &Kit) {
    let mut v = serde_json::to_value(with_pull_policy(set(2, "Parallel"))).unwrap();
    v["spec"]["updateStrategy"] = json!({"type": "Recreate"});
    v["spec"]["template"]["spec"]["containers"][0]["image"] = json!("nginx:2");
    v["status"] = json!({"replicas": 2, "currentReplicas": 2, "currentRevision": "web-older",
                         "updateRevision": "web-older", "observedGeneration": 1});
    kit.seed(vec![serde_json::from_value::<StatefulSet>(v).unwrap()]);
    kit.seed((0..2).map(|o| pod_at(o, "web-older", "nginx:1")));
    kit.seed(vec![revision_without_a_default()]);
    kit.seed(Vec::<k8s_openapi::api::core::v1::PersistentVolumeClaim>::new());
}

/// Pod `web-<ordinal>` of the set, Running and Ready, at `revision`.
fn pod_at(ordinal: i32, revision: &str, image: &str) -> Pod {
    serde_json::from_value(json!({
        "metadata": {
            "name": format!("web-{ordinal}"), "namespace": "ns", "uid": format!("uid-{ordinal}-{revision}"),
            "resourceVersion": "3",
            "labels": {"app": "web", "controller-revision-hash": revision,
                       "statefulset.kubernetes.io/pod-name": format!("web-{ordinal}"),
                       "apps.kubernetes.io/pod-index": ordinal.to_string()},
            "ownerReferences": [{"apiVersion": "apps/v1", "kind": "StatefulSet", "name": "web",
                                 "uid": "uid-web", "controller": true, "blockOwnerDeletion": true}]
        },
        "spec": {"containers": [{"name": "c", "image": image}]},
        "status": {"phase": "Running",
                   "conditions": [{"type": "Ready", "status": "True",
                                   "lastTransitionTime": "2020-01-01T00:00:00Z"}]}
    }))
    .unwrap()
}

fn pod_deletes(kit: &Kit) -> Vec<String> {
    kit.api
        .calls()
        .into_iter()
        .filter_map(|c| match c {
            Call::Delete { target, .. } if target.plural == "pods" => Some(target.name),
            _ => None,
        })
        .collect()
}

fn progressing(status: &Value) -> (String, String, String) {
    let c = status["conditions"]
        .as_array()
        .and_then(|cs| cs.iter().find(|c| c["type"] == "Progressing"))
        .cloned()
        .unwrap_or_default();
    let s = |k: &str| c[k].as_str().unwrap_or_default().to_string();
    (s("status"), s("reason"), s("message"))
}

/// ST-R with StatefulSetRecreateStrategy off (its default), as upstream: a Warning
/// `UnknownStrategy` naming the gate, and nothing done: no pod deleted or created, no status
/// written. (Handled as a bare rolling update, each new pod once got the current revision and
/// was deleted and created again without end.)
#[tokio::test(start_paused = true)]
async fn st_r_with_the_gate_off_a_recreate_set_is_warned_about_and_left_alone() {
    let kit = Kit::new();
    let ctl = controller(&kit);
    recreate_set(&kit);
    let running = kit.start(ctl);
    tokio::time::sleep(Duration::from_secs(5)).await;
    settle().await;
    assert!(
        creates(&kit, "pods").is_empty(),
        "{:?}",
        creates(&kit, "pods")
    );
    assert!(pod_deletes(&kit).is_empty(), "{:?}", pod_deletes(&kit));
    assert!(status_writes(&kit).is_empty(), "{:?}", status_writes(&kit));
    let warned = creates(&kit, "events").into_iter().any(|e| {
        e["reason"] == "UnknownStrategy"
            && e["type"] == "Warning"
            && e["message"].as_str() == Some(
                "statefulset ns/web uses Recreate strategy but feature gate StatefulSetRecreateStrategy is disabled",
            )
    });
    assert!(warned, "{:?}", creates(&kit, "events"));
    running.stop().await;
}

/// ST-R with the gate on (upstream `recreateDeleteAndWait`): every old pod is deleted at once
/// and nothing is created while one remains (Progressing `RecreateInProgress`, "Deleting old
/// revision pods"); once they are gone the new revision's pods are created ("Waiting for
/// new-revision pods to be created"); once those are Running and Ready the rollout completes
/// (currentRevision moves, Progressing False `RecreateCompleted`).
#[tokio::test(start_paused = true)]
async fn st_r_recreate_deletes_every_old_pod_then_creates_the_new_revision() {
    let mut kit = Kit::new();
    kit.gates.stateful_set_recreate_strategy = true;
    let ctl = controller(&kit);
    recreate_set(&kit);
    let running = kit.start(ctl);
    assert!(eventually(Duration::from_secs(2), || pod_deletes(&kit).len() == 2).await);
    settle().await;
    let mut deleted = pod_deletes(&kit);
    deleted.sort();
    assert_eq!(deleted, ["web-0", "web-1"]);
    assert!(
        creates(&kit, "pods").is_empty(),
        "created before the old pods were gone"
    );
    let statuses = status_writes(&kit);
    let last = statuses.last().expect("a status write");
    assert_eq!(
        progressing(last),
        (
            "True".into(),
            "RecreateInProgress".into(),
            "Deleting old revision pods".into()
        )
    );
    let new_rev = creates(&kit, "controllerrevisions")[0]["metadata"]["name"]
        .as_str()
        .unwrap()
        .to_string();
    // The old pods are gone from the caches: the new revision's pods come, all at once.
    catch_up(&kit);
    assert!(eventually(Duration::from_secs(2), || creates(&kit, "pods").len() == 2).await);
    settle().await;
    for p in creates(&kit, "pods") {
        assert_eq!(
            p["metadata"]["labels"]["controller-revision-hash"],
            new_rev.as_str()
        );
    }
    assert_eq!(pod_deletes(&kit).len(), 2, "no further delete");
    catch_up(&kit);
    assert!(
        eventually(Duration::from_secs(2), || status_writes(&kit)
            .last()
            .is_some_and(
                |s| progressing(s).2 == "Waiting for new-revision pods to be created"
            ))
        .await,
        "{:?}",
        status_writes(&kit)
    );
    // The kubelet runs them: the rollout is complete.
    for o in 0..2 {
        let mut p = pod_at(o, &new_rev, "nginx:2");
        p.metadata.resource_version = Some("9000".into());
        kit.api.insert(&p);
    }
    catch_up(&kit);
    assert!(
        eventually(Duration::from_secs(2), || status_writes(&kit)
            .last()
            .is_some_and(|s| s["currentRevision"] == new_rev.as_str()))
        .await,
        "{:?}",
        status_writes(&kit)
    );
    let last = status_writes(&kit).last().cloned().unwrap();
    assert_eq!(
        progressing(&last),
        (
            "False".into(),
            "RecreateCompleted".into(),
            "All pods recreated successfully".into()
        )
    );
    assert_eq!(pod_deletes(&kit).len(), 2, "no further delete");
    running.stop().await;
}
