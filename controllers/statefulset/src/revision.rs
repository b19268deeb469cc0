//! ControllerRevisions (ST-11..ST-17): the bytes a revision stores, its hash and name,
//! the object created for it, the per-sync choice between reusing, rolling back to or creating a
//! revision, the semantic comparison guarding against spurious rollouts (SB-2), and history
//! truncation. Everything here is pure; the sync does the I/O.
//!
//! Upstream: `pkg/controller/statefulset/stateful_set_utils.go` (getPatch, newRevision,
//! nextRevision), `stateful_set_control.go` (getStatefulSetRevisions,
//! setMatchesLatestExistingRevision, truncateHistory) and `pkg/controller/history/
//! controller_history.go` (NewControllerRevision, HashControllerRevision, ControllerRevisionName,
//! EqualRevision, SortControllerRevisions, CreateControllerRevision).

use k8s_openapi::api::apps::v1::{ControllerRevision, StatefulSet};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use k8s_openapi::apimachinery::pkg::runtime::RawExtension;
use k8s_openapi::jiff::Timestamp;
use serde_json::{Map, Value};
use std::collections::{BTreeMap, HashSet};

/// Label on a ControllerRevision carrying its bare hash (upstream `ControllerRevisionHashLabel`).
pub const HASH_LABEL: &str = "controller.kubernetes.io/hash";
/// Label on a pod naming its ControllerRevision (`<set>-<hash>`, upstream
/// `StatefulSetRevisionLabel`).
pub const POD_REVISION_LABEL: &str = "controller-revision-hash";
/// `revisionHistoryLimit` when the set has none: the API server defaults it to 10
/// (`SetDefaults_StatefulSet`), so a nil limit only reaches us from a hand-built object.
pub const DEFAULT_REVISION_HISTORY_LIMIT: i32 = 10;
/// Create attempts per sync before giving up on name collisions (ST-14; upstream loops without
/// bound).
pub const MAX_CREATE_ATTEMPTS: u32 = 10;

// ---------------------------------------------------------------------------------------------
// ST-12: Go's encoding/json, as getPatch uses it.

/// ST-12: `value` in the bytes upstream's getPatch marshals it to (see
/// [`shared::meta::gojson::marshal`]); what revision data is hashed and compared as.
pub fn go_json(value: &Value) -> Vec<u8> {
    shared::meta::gojson::marshal(value)
}

/// ST-12: the `data` of a revision for `template` (the set's `spec.template`, as served):
/// `{"spec":{"template":T}}` with T = the template plus `"$patch":"replace"`, in Go's encoding
/// (upstream getPatch). A template that is not an object is stored as it is, under `template`
/// (upstream would panic; the API server never serves one).
pub fn patch_data(template: &Value) -> Vec<u8> {
    let mut t = template.clone();
    if let Value::Object(m) = &mut t {
        m.insert("$patch".into(), Value::String("replace".into()));
    }
    let mut spec = Map::new();
    spec.insert("template".into(), t);
    let mut root = Map::new();
    root.insert("spec".into(), Value::Object(spec));
    go_json(&Value::Object(root))
}

// ---------------------------------------------------------------------------------------------
// ST-13 and ST-11: hash and name.

/// ST-13: 32-bit FNV-1 (not 1a) over `data` and then, when given, the decimal collision count;
/// the decimal sum passed through `rand.SafeEncodeString` (upstream HashControllerRevision).
/// StatefulSet revisions always pass the count (`status.collisionCount`, 0 when unset); `None`
/// (nothing appended) is only how upstream re-hashes a revision it reconstructs for ST-15.
pub fn hash(data: &[u8], collision_count: Option<i32>) -> String {
    let mut h: u32 = 0x811c_9dc5;
    let count = collision_count.map(|c| c.to_string());
    let tail = count.as_deref().unwrap_or("").as_bytes();
    for &b in data.iter().chain(tail) {
        h = h.wrapping_mul(0x0100_0193);
        h ^= u32::from(b);
    }
    safe_encode(&h.to_string())
}

/// `rand.SafeEncodeString`: each character mapped into `bcdfghjklmnpqrstvwxz2456789` by its code
/// point modulo 27 (digits become `4 5 6 7 8 9 b c d f`).
pub fn safe_encode(s: &str) -> String {
    const ALPHANUMS: &[u8; 27] = b"bcdfghjklmnpqrstvwxz2456789";
    s.chars()
        .map(|c| ALPHANUMS[(c as u32 % 27) as usize] as char)
        .collect()
}

/// ST-11: `<set>-<hash>`, the set name cut to its first 223 bytes (upstream
/// ControllerRevisionName slices bytes; a cut inside a multi-byte character cannot happen for a
/// valid set name, and is moved back to a character boundary here).
pub fn revision_name(set_name: &str, hash: &str) -> String {
    let mut end = set_name.len().min(223);
    while !set_name.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}-{hash}", &set_name[..end])
}

// ---------------------------------------------------------------------------------------------
// ST-11: the object.

/// What a revision is built from, whatever the cached set looks like.
#[derive(Clone, Copy, Debug)]
pub struct SetSource<'a> {
    pub name: &'a str,
    pub namespace: &'a str,
    pub uid: &'a str,
    /// The set's `metadata.annotations`, all copied to the revision.
    pub annotations: Option<&'a BTreeMap<String, String>>,
    /// The set's `spec.template` as served (ST-8).
    pub template: &'a Value,
}

/// A revision ready to create, with the exact bytes its `data` must be sent as.
#[derive(Clone, Debug)]
pub struct NewRevision {
    pub object: ControllerRevision,
    /// [`patch_data`] of the template: send with [`request_body`], never re-serialised.
    pub data: Vec<u8>,
    /// The hash in the name and in the [`HASH_LABEL`] label.
    pub hash: String,
}

/// ST-11: the revision upstream's newRevision/NewControllerRevision builds: name
/// `<set>-<hash>`; labels = template labels plus [`HASH_LABEL`]; annotations = the set's; one
/// controller ownerRef to the set (apps/v1 StatefulSet); `revision`; `data` per ST-12; the set's
/// namespace. After an AlreadyExists collision upstream renames the revision only (the hash
/// label keeps the first count's hash): use [`renamed_for_collision`].
pub fn new_revision(set: &SetSource<'_>, revision: i64, collision_count: i32) -> NewRevision {
    let data = patch_data(set.template);
    let h = hash(&data, Some(collision_count));
    let mut labels: BTreeMap<String, String> = set
        .template
        .pointer("/metadata/labels")
        .and_then(Value::as_object)
        .map(|m| {
            m.iter()
                .filter_map(|(k, v)| v.as_str().map(|v| (k.clone(), v.to_owned())))
                .collect()
        })
        .unwrap_or_default();
    labels.insert(HASH_LABEL.into(), h.clone());
    let owner = StatefulSet {
        metadata: ObjectMeta {
            name: Some(set.name.into()),
            uid: Some(set.uid.into()),
            ..Default::default()
        },
        ..Default::default()
    };
    let object = ControllerRevision {
        metadata: ObjectMeta {
            name: Some(revision_name(set.name, &h)),
            namespace: Some(set.namespace.into()),
            labels: Some(labels),
            annotations: set.annotations.filter(|a| !a.is_empty()).cloned(),
            owner_references: Some(vec![shared::meta::refs::controller_ref(&owner)]),
            ..Default::default()
        },
        data: RawExtension(serde_json::from_slice(&data).expect("go_json output is JSON")),
        revision: Some(revision),
    };
    NewRevision {
        object,
        data,
        hash: h,
    }
}

/// The next name to try after an AlreadyExists collision (upstream CreateControllerRevision):
/// only the name changes, to `<set>-<hash(data, count)>`; labels stay as first built.
pub fn renamed_for_collision(rev: &mut NewRevision, set_name: &str, collision_count: i32) {
    rev.object.metadata.name = Some(revision_name(
        set_name,
        &hash(&rev.data, Some(collision_count)),
    ));
}

/// The JSON body for creating `rev`, with `data` spliced in as the exact bytes `data` (the API
/// server stores the bytes it receives; serialising the `Value` would lose Go's escaping and
/// number format, and the stored bytes would no longer match the hash).
pub fn request_body(rev: &ControllerRevision, data: &[u8]) -> Vec<u8> {
    let mut without = rev.clone();
    without.data = RawExtension(Value::Null);
    let mut v = serde_json::to_value(&without).expect("a ControllerRevision serialises");
    if let Value::Object(m) = &mut v {
        m.remove("data");
    }
    let mut body = serde_json::to_vec(&v).expect("a Value serialises");
    // `v` is an object with at least apiVersion and kind: replace its closing brace.
    body.pop();
    body.extend_from_slice(b",\"data\":");
    body.extend_from_slice(data);
    body.push(b'}');
    body
}

// ---------------------------------------------------------------------------------------------
// ST-14: the per-sync decision.

/// An existing revision owned by (or adoptable into) the set, as the decision needs it.
#[derive(Clone, Copy, Debug)]
pub struct Existing<'a> {
    pub name: &'a str,
    pub revision: i64,
    /// `metadata.creationTimestamp` (second precision as served); `None` sorts first, like
    /// Go's zero time.
    pub created: Option<Timestamp>,
    /// Its [`HASH_LABEL`] label.
    pub hash_label: Option<&'a str>,
    /// Its `data` bytes: [`go_json`] of the served value (equal to the stored bytes for every
    /// revision a controller wrote, since those are in that encoding already).
    pub data: &'a [u8],
}

/// Which revision is the update revision after this sync.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Update {
    /// (a) The newest revision equals the candidate: nothing to write.
    Newest { name: String },
    /// (b) An older revision equals the candidate: set its `revision` to `revision`
    /// (newest + 1), nothing else.
    Rollback { name: String, revision: i64 },
    /// (c) ST-15: the newest revision is semantically the candidate: reuse it, nothing to write.
    SemanticMatch { name: String },
    /// (d) Create [`new_revision`] with this `revision` and `collision_count` (then
    /// [`on_already_exists`] on AlreadyExists).
    Create { revision: i64, collision_count: i32 },
}

/// Which revision is the current one.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Current {
    /// The revision `status.currentRevision` names, found among the existing ones.
    Named(String),
    /// None found: the update revision, whatever it ends up named.
    Update,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Decision {
    pub update: Update,
    pub current: Current,
}

/// Upstream's bound on its semantic-comparison cache (an LRU of 10,000); ours is cleared
/// when full.
pub const SEMANTIC_CACHE_SIZE: usize = 10_000;

/// The newest revision in ST-14 order.
pub fn newest<'a, 'b>(existing: &'a [Existing<'b>]) -> Option<&'a Existing<'b>> {
    existing
        .iter()
        .max_by(|a, b| (a.revision, a.created, a.name).cmp(&(b.revision, b.created, b.name)))
}

/// ST-14 order: `revision`, then `creationTimestamp`, then name (upstream byRevision, stable).
pub fn sort_revisions(revisions: &mut [Existing<'_>]) {
    revisions.sort_by(|a, b| (a.revision, a.created, a.name).cmp(&(b.revision, b.created, b.name)));
}

/// Upstream EqualRevision on two revisions: if both hash labels parse as int32 decimals
/// (`strconv.ParseInt(s, 10, 32)`: possible when a hash maps to digits only) and differ, they
/// differ; otherwise their data bytes decide.
pub fn equal_revision(
    a_label: Option<&str>,
    a_data: &[u8],
    b_label: Option<&str>,
    b_data: &[u8],
) -> bool {
    let parse = |l: Option<&str>| l.and_then(|s| s.parse::<i32>().ok());
    if let (Some(a), Some(b)) = (parse(a_label), parse(b_label))
        && a != b
    {
        return false;
    }
    a_data == b_data
}

/// ST-14: the decision of upstream getStatefulSetRevisions for a set whose candidate data is
/// `candidate` (= [`patch_data`] of its template) and whose status carries `collision_count`
/// (0 when unset) and `current_revision`.
///
/// `semantic` is asked, only when no revision is byte-equal, whether the newest revision is
/// semantically the candidate (ST-15: [`semantically_equal`] of [`template_from_data`], with
/// API-server defaults applied by the caller if it has them, and cached).
pub fn choose(
    existing: &[Existing<'_>],
    candidate: &[u8],
    collision_count: i32,
    current_revision: Option<&str>,
    semantic: impl FnOnce(&Existing<'_>) -> bool,
) -> Decision {
    let mut sorted = existing.to_vec();
    sort_revisions(&mut sorted);
    let candidate_label = hash(candidate, Some(collision_count));
    let next = sorted.last().map_or(1, |r| r.revision.wrapping_add(1));
    let equal: Vec<&Existing<'_>> = sorted
        .iter()
        .filter(|r| equal_revision(r.hash_label, r.data, Some(&candidate_label), candidate))
        .collect();
    let update = match (sorted.last(), equal.last()) {
        (Some(newest), Some(eq))
            if equal_revision(newest.hash_label, newest.data, eq.hash_label, eq.data) =>
        {
            Update::Newest {
                name: newest.name.into(),
            }
        }
        (_, Some(eq)) => Update::Rollback {
            name: eq.name.into(),
            revision: next,
        },
        (Some(newest), None)
            if semantic(newest)
                // Upstream compares the candidate (hashed with the count) with the
                // reconstruction (hashed without one) through EqualRevision: same bytes, but
                // the hash-label test still applies.
                && equal_revision(
                    Some(&candidate_label),
                    candidate,
                    Some(&hash(candidate, None)),
                    candidate,
                ) =>
        {
            Update::SemanticMatch {
                name: newest.name.into(),
            }
        }
        _ => Update::Create {
            revision: next,
            collision_count,
        },
    };
    let current = current_revision
        .and_then(|c| sorted.iter().find(|r| r.name == c))
        .map_or(Current::Update, |r| Current::Named(r.name.into()));
    Decision { update, current }
}

/// What an AlreadyExists on create means (upstream CreateControllerRevision).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum OnAlreadyExists {
    /// The existing object holds the same bytes: it is the update revision.
    Reuse,
    /// A different revision has that name: retry with this count (persisted to
    /// `status.collisionCount`) and [`renamed_for_collision`].
    Collision { next_count: i32 },
}

/// Given the `data` of the object found on AlreadyExists ([`go_json`] of the served value), the
/// candidate's bytes and the count just tried.
pub fn on_already_exists(existing_data: &[u8], candidate: &[u8], count: i32) -> OnAlreadyExists {
    if existing_data == candidate {
        OnAlreadyExists::Reuse
    } else {
        // Go's int32 `++` wraps.
        OnAlreadyExists::Collision {
            next_count: count.wrapping_add(1),
        }
    }
}

// ---------------------------------------------------------------------------------------------
// ST-15: semantic equality.

/// The template a revision restores: `spec.template` of its data without the `$patch`
/// directive (upstream ApplyRevision merges the data into the set with a strategic merge patch
/// whose `replace` directive swaps the whole template). `None` when the data has another shape.
pub fn template_from_data(data: &Value) -> Option<Value> {
    let mut t = data.pointer("/spec/template")?.as_object()?.clone();
    if t.get("$patch").and_then(Value::as_str) != Some("replace") {
        return None;
    }
    t.remove("$patch");
    Some(Value::Object(t))
}

/// ST-15: whether two pod templates are the same template once decoded into Go's typed
/// PodTemplateSpec and re-encoded by getPatch, as upstream setMatchesLatestExistingRevision
/// compares them (it decodes the revision, applies defaults, re-encodes and compares bytes).
///
/// Compared: member order is irrelevant; an object member whose value is `null` counts as absent
/// (Go decodes `null` to the zero value, which encodes as absent for every pointer, map, slice
/// and omitempty field; this is what makes the 1.33 `"creationTimestamp":null` disappear,
/// #134773); numbers compare as Go's float64. Everything else must match exactly: empty
/// objects or arrays are not the same as absent (`"securityContext":{}` is a non-nil pointer to
/// Go), `false`/`0`/`""` are not the same as absent, `null` array elements are kept. Defaults
/// are not applied here: a template missing a field the API server would default differs from
/// one that has it, unless the caller defaults both first.
pub fn semantically_equal(a: &Value, b: &Value) -> bool {
    go_json(&without_nulls(a)) == go_json(&without_nulls(b))
}

/// Whether `set_template` differs from `revision_template` only by members the revision lacks
/// (recursively; arrays element by element, same length; `null` members count as absent):
/// the only differences API-server defaulting can explain. When it holds, and only then, ST-15
/// asks the API server to default the revision's template before comparing again, so a real
/// template change never costs a request.
pub fn differs_only_by_missing(revision_template: &Value, set_template: &Value) -> bool {
    fn sub(a: &Value, b: &Value) -> bool {
        match (a, b) {
            (Value::Object(x), Value::Object(y)) => {
                x.iter().all(|(k, v)| y.get(k).is_some_and(|w| sub(v, w)))
            }
            (Value::Array(x), Value::Array(y)) => {
                x.len() == y.len() && x.iter().zip(y).all(|(v, w)| sub(v, w))
            }
            (Value::Number(x), Value::Number(y)) => x.as_f64() == y.as_f64(),
            (x, y) => x == y,
        }
    }
    sub(
        &without_nulls(revision_template),
        &without_nulls(set_template),
    )
}

fn without_nulls(v: &Value) -> Value {
    match v {
        Value::Object(m) => Value::Object(
            m.iter()
                .filter(|(_, e)| !e.is_null())
                .map(|(k, e)| (k.clone(), without_nulls(e)))
                .collect(),
        ),
        Value::Array(a) => Value::Array(a.iter().map(without_nulls).collect()),
        other => other.clone(),
    }
}

// ---------------------------------------------------------------------------------------------
// ST-17: history.

/// ST-17 (upstream truncateHistory): the revisions to delete, oldest first. Live = `current`,
/// `update` and every name in `pod_revisions` (the [`POD_REVISION_LABEL`] of each owned pod);
/// the others are deleted in ST-14 order until `revision_history_limit` remain. A negative limit
/// keeps all; `None` is the API server's default, 10.
pub fn history_to_delete<'a>(
    revisions: &[Existing<'_>],
    current: Option<&str>,
    update: Option<&str>,
    pod_revisions: impl IntoIterator<Item = &'a str>,
    revision_history_limit: Option<i32>,
) -> Vec<String> {
    let limit = revision_history_limit.unwrap_or(DEFAULT_REVISION_HISTORY_LIMIT);
    if limit < 0 {
        return Vec::new();
    }
    let mut live: HashSet<&str> = pod_revisions.into_iter().collect();
    live.extend(current);
    live.extend(update);
    let mut sorted = revisions.to_vec();
    sort_revisions(&mut sorted);
    let old: Vec<&Existing<'_>> = sorted.iter().filter(|r| !live.contains(r.name)).collect();
    let excess = old.len().saturating_sub(limit as usize);
    old[..excess].iter().map(|r| r.name.to_owned()).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn st15_differs_only_by_missing() {
        let served = json!({"metadata": {"labels": {"app": "web"}}, "spec": {"containers": [
            {"name": "c", "image": "nginx:1", "imagePullPolicy": "IfNotPresent"}],
            "restartPolicy": "Always"}});
        // A revision written before a default existed: only missing members.
        let older = json!({"metadata": {"labels": {"app": "web"}, "creationTimestamp": null},
            "spec": {"containers": [{"name": "c", "image": "nginx:1"}]}});
        assert!(differs_only_by_missing(&older, &served));
        assert!(differs_only_by_missing(&served, &served));
        // A real change: no request is worth making.
        let changed = json!({"metadata": {"labels": {"app": "web"}},
            "spec": {"containers": [{"name": "c", "image": "nginx:2"}]}});
        assert!(!differs_only_by_missing(&changed, &served));
        // A member the set no longer has.
        let removed = json!({"metadata": {"labels": {"app": "web", "old": "x"}}, "spec": {}});
        assert!(!differs_only_by_missing(&removed, &served));
        // A container more or fewer.
        let two = json!({"spec": {"containers": [{"name": "c"}, {"name": "d"}]}});
        assert!(!differs_only_by_missing(&two, &served));
    }

    // Upstream fixtures (pkg/controller/statefulset/testdata, 1.37): a set's template as the
    // API server served it in 1.33 (with `creationTimestamp: null`) and in 1.34, and the data
    // of the revisions upstream wrote for them.
    fn template_1_33() -> Value {
        json!({
            "metadata": {"annotations": {"test": "value"}, "creationTimestamp": null, "labels": {"app": "foo"}},
            "spec": {
                "containers": [{"image": "test", "imagePullPolicy": "Always", "name": "test", "resources": {},
                    "terminationMessagePath": "/dev/termination-log", "terminationMessagePolicy": "File"}],
                "dnsPolicy": "ClusterFirst", "restartPolicy": "Always", "schedulerName": "default-scheduler",
                "securityContext": {}, "terminationGracePeriodSeconds": 30
            }
        })
    }
    fn template_1_34() -> Value {
        let mut t = template_1_33();
        t["metadata"]
            .as_object_mut()
            .unwrap()
            .remove("creationTimestamp");
        t
    }
    const DATA_1_33: &str = r#"{"spec":{"template":{"$patch":"replace","metadata":{"annotations":{"test":"value"},"creationTimestamp":null,"labels":{"app":"foo"}},"spec":{"containers":[{"image":"test","imagePullPolicy":"Always","name":"test","resources":{},"terminationMessagePath":"/dev/termination-log","terminationMessagePolicy":"File"}],"dnsPolicy":"ClusterFirst","restartPolicy":"Always","schedulerName":"default-scheduler","securityContext":{},"terminationGracePeriodSeconds":30}}}}"#;
    const DATA_1_34: &str = r#"{"spec":{"template":{"$patch":"replace","metadata":{"annotations":{"test":"value"},"labels":{"app":"foo"}},"spec":{"containers":[{"image":"test","imagePullPolicy":"Always","name":"test","resources":{},"terminationMessagePath":"/dev/termination-log","terminationMessagePolicy":"File"}],"dnsPolicy":"ClusterFirst","restartPolicy":"Always","schedulerName":"default-scheduler","securityContext":{},"terminationGracePeriodSeconds":30}}}}"#;

    fn s(b: &[u8]) -> &str {
        std::str::from_utf8(b).unwrap()
    }

    #[test]
    fn st12_patch_data_equals_upstream_fixture_bytes() {
        assert_eq!(s(&patch_data(&template_1_33())), DATA_1_33);
        assert_eq!(s(&patch_data(&template_1_34())), DATA_1_34);
    }

    #[test]
    fn st12_go_json_is_a_fixed_point() {
        // Revisions are compared as go_json of the served value: re-encoding upstream's bytes
        // must give them back.
        for data in [DATA_1_33, DATA_1_34] {
            let v: Value = serde_json::from_str(data).unwrap();
            assert_eq!(s(&go_json(&v)), data);
        }
    }

    #[test]
    fn st13_hash_matches_upstream_vectors() {
        // stateful_set_compatibility_test.go / testdata: revisions test-c77f6d978 (1.33) and
        // test-776999688b (1.34), written with collisionCount 0.
        assert_eq!(hash(DATA_1_33.as_bytes(), Some(0)), "c77f6d978");
        assert_eq!(hash(DATA_1_34.as_bytes(), Some(0)), "776999688b");
        assert_eq!(hash(&patch_data(&template_1_34()), Some(0)), "776999688b");
        assert_eq!(revision_name("test", "c77f6d978"), "test-c77f6d978");
    }

    #[test]
    fn st13_fnv1_not_1a_and_count_appended() {
        // FNV-1 32 published values: "" = 2166136261, "a" = 0x050c5d7e (FNV-1a would give
        // 0xe40c292c).
        assert_eq!(hash(b"", None), safe_encode("2166136261"));
        assert_eq!(hash(b"a", None), safe_encode(&0x050c_5d7e_u32.to_string()));
        // The count is hashed as its decimal text after the data.
        assert_eq!(hash(b"x", Some(12)), hash(b"x12", None));
        assert_eq!(hash(b"x", Some(-3)), hash(b"x-3", None));
        assert_ne!(hash(b"x", Some(0)), hash(b"x", None));
    }

    #[test]
    fn st13_safe_encode_digits() {
        assert_eq!(safe_encode("0123456789"), "456789bcdf");
    }

    #[test]
    fn names_truncate_set_to_223_bytes() {
        let long = "a".repeat(300);
        let name = revision_name(&long, "h");
        assert_eq!(name, format!("{}-h", "a".repeat(223)));
        assert_eq!(revision_name(&"b".repeat(223), "h").len(), 225);
    }

    #[test]
    fn st11_new_revision_shape() {
        let annotations = BTreeMap::from([("a/b".to_string(), "<&>".to_string())]);
        let mut template = template_1_34();
        template["metadata"]["labels"][HASH_LABEL] = json!("spoofed");
        let set = SetSource {
            name: "web",
            namespace: "ns",
            uid: "uid-1",
            annotations: Some(&annotations),
            template: &template,
        };
        let r = new_revision(&set, 7, 2);
        assert_eq!(r.data, patch_data(&template));
        assert_eq!(r.hash, hash(&r.data, Some(2)));
        let m = &r.object.metadata;
        assert_eq!(m.name.as_deref(), Some(format!("web-{}", r.hash).as_str()));
        assert_eq!(m.namespace.as_deref(), Some("ns"));
        let labels = m.labels.clone().unwrap();
        assert_eq!(labels.get("app").map(String::as_str), Some("foo"));
        assert_eq!(
            labels.get(HASH_LABEL),
            Some(&r.hash),
            "hash label overrides a template label"
        );
        assert_eq!(m.annotations.as_ref(), Some(&annotations));
        let owners = m.owner_references.clone().unwrap();
        assert_eq!(owners.len(), 1);
        let o = &owners[0];
        assert_eq!(
            (
                o.api_version.as_str(),
                o.kind.as_str(),
                o.name.as_str(),
                o.uid.as_str()
            ),
            ("apps/v1", "StatefulSet", "web", "uid-1")
        );
        assert_eq!(
            (o.controller, o.block_owner_deletion),
            (Some(true), Some(true))
        );
        assert_eq!(r.object.revision, Some(7));
        assert_eq!(go_json(&r.object.data.0), r.data);
        // No annotations on the set: none on the revision.
        let bare = SetSource {
            annotations: None,
            ..set
        };
        assert_eq!(new_revision(&bare, 1, 0).object.metadata.annotations, None);
    }

    #[test]
    fn st11_collision_renames_but_keeps_first_hash_label() {
        let t = template_1_34();
        let set = SetSource {
            name: "web",
            namespace: "ns",
            uid: "u",
            annotations: None,
            template: &t,
        };
        let mut r = new_revision(&set, 1, 0);
        let first = r.hash.clone();
        renamed_for_collision(&mut r, "web", 1);
        assert_eq!(
            r.object.metadata.name,
            Some(revision_name("web", &hash(&r.data, Some(1))))
        );
        assert_eq!(r.object.metadata.labels.unwrap()[HASH_LABEL], first);
    }

    #[test]
    fn st12_request_body_carries_exact_bytes() {
        let t = json!({"metadata": {"annotations": {"x": "<\u{2028}>"}}, "spec": {"n": 9007199254740993u64}});
        let set = SetSource {
            name: "web",
            namespace: "ns",
            uid: "u",
            annotations: None,
            template: &t,
        };
        let r = new_revision(&set, 3, 0);
        let body = request_body(&r.object, &r.data);
        let text = s(&body);
        let needle = format!(",\"data\":{}}}", s(&r.data));
        assert!(text.ends_with(&needle), "{text}");
        let v: Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(v["kind"], "ControllerRevision");
        assert_eq!(v["revision"], 3);
        assert_eq!(
            v["metadata"]["name"],
            r.object.metadata.name.clone().unwrap()
        );
    }

    fn rev<'a>(name: &'a str, revision: i64, created: i64, data: &'a [u8]) -> Existing<'a> {
        Existing {
            name,
            revision,
            created: Some(Timestamp::from_second(created).unwrap()),
            hash_label: None,
            data,
        }
    }

    #[test]
    fn st14_choose_table() {
        let a: &[u8] = b"A";
        let b: &[u8] = b"B";
        let c: &[u8] = b"C";
        let never = |_: &Existing<'_>| false;
        struct Case<'a> {
            name: &'static str,
            existing: Vec<Existing<'a>>,
            candidate: &'a [u8],
            current: Option<&'a str>,
            semantic: bool,
            want: Update,
            want_current: Current,
        }
        let cases = vec![
            Case {
                name: "no revisions: create revision 1",
                existing: vec![],
                candidate: a,
                current: None,
                semantic: false,
                want: Update::Create {
                    revision: 1,
                    collision_count: 5,
                },
                want_current: Current::Update,
            },
            Case {
                name: "(a) newest byte-equal",
                existing: vec![rev("s-2", 2, 10, a), rev("s-1", 1, 5, b)],
                candidate: a,
                current: Some("s-1"),
                semantic: false,
                want: Update::Newest { name: "s-2".into() },
                want_current: Current::Named("s-1".into()),
            },
            Case {
                name: "(b) older byte-equal: rollback to max+1",
                existing: vec![rev("s-a", 1, 5, a), rev("s-b", 4, 10, b)],
                candidate: a,
                current: Some("s-b"),
                semantic: true,
                want: Update::Rollback {
                    name: "s-a".into(),
                    revision: 5,
                },
                want_current: Current::Named("s-b".into()),
            },
            Case {
                name: "(a) duplicates of the candidate: the newest wins, no rollback",
                existing: vec![rev("s-x", 1, 5, a), rev("s-y", 2, 6, a)],
                candidate: a,
                current: None,
                semantic: false,
                want: Update::Newest { name: "s-y".into() },
                want_current: Current::Update,
            },
            Case {
                name: "(c) newest semantically equal",
                existing: vec![rev("s-a", 1, 5, a), rev("s-b", 2, 6, b)],
                candidate: c,
                current: Some("gone"),
                semantic: true,
                want: Update::SemanticMatch { name: "s-b".into() },
                want_current: Current::Update,
            },
            Case {
                name: "(d) nothing equal: create max+1",
                existing: vec![rev("s-a", 3, 5, a), rev("s-b", 1, 6, b)],
                candidate: c,
                current: Some("s-a"),
                semantic: false,
                want: Update::Create {
                    revision: 4,
                    collision_count: 5,
                },
                want_current: Current::Named("s-a".into()),
            },
            Case {
                name: "ties on revision: creationTimestamp then name decide the newest",
                existing: vec![
                    rev("s-z", 2, 5, b),
                    rev("s-b", 2, 9, a),
                    rev("s-a", 2, 9, c),
                ],
                candidate: a,
                current: None,
                semantic: false,
                want: Update::Newest { name: "s-b".into() },
                want_current: Current::Update,
            },
        ];
        for case in cases {
            let semantic = case.semantic;
            let d = choose(&case.existing, case.candidate, 5, case.current, |_| {
                semantic
            });
            assert_eq!(d.update, case.want, "{}", case.name);
            assert_eq!(d.current, case.want_current, "{}", case.name);
        }
        // The semantic check is not consulted when bytes decide.
        let existing = [rev("s-a", 1, 5, a)];
        let d = choose(&existing, a, 0, None, |_| panic!("consulted"));
        assert_eq!(d.update, Update::Newest { name: "s-a".into() });
        let d = choose(&[], a, 0, None, never);
        assert_eq!(
            d.update,
            Update::Create {
                revision: 1,
                collision_count: 0
            }
        );
    }

    #[test]
    fn st14_hash_label_quirk_of_equal_revision() {
        // Labels that parse as int32 and differ make byte-equal revisions unequal; any label
        // that does not parse leaves it to the bytes.
        assert!(!equal_revision(Some("45"), b"d", Some("46"), b"d"));
        assert!(equal_revision(Some("45"), b"d", Some("45"), b"d"));
        assert!(equal_revision(Some("4b"), b"d", Some("46"), b"d"));
        assert!(equal_revision(None, b"d", Some("46"), b"d"));
        assert!(
            equal_revision(Some("9999999999"), b"d", Some("46"), b"d"),
            "beyond int32"
        );
        assert!(!equal_revision(None, b"d", None, b"e"));
        // So a byte-equal revision whose numeric label disagrees is no match: b"x-239" hashes
        // to the all-digit 559688758 with count 0.
        assert_eq!(hash(b"x-239", Some(0)), "559688758");
        let existing = [Existing {
            hash_label: Some("44"),
            ..rev("s-a", 1, 5, b"x-239")
        }];
        let d = choose(&existing, b"x-239", 0, None, |_| false);
        assert_eq!(
            d.update,
            Update::Create {
                revision: 2,
                collision_count: 0
            }
        );
        let existing = [Existing {
            hash_label: Some("4b"),
            ..rev("s-a", 1, 5, b"x-239")
        }];
        let d = choose(&existing, b"x-239", 0, None, |_| false);
        assert_eq!(d.update, Update::Newest { name: "s-a".into() });
        // The semantic path compares the candidate hashed with the count against the same
        // bytes hashed without one: b"d119420" gives 898495944 and 589946768, both int32, so
        // upstream creates a revision even though the templates match.
        assert_eq!(hash(b"d119420", Some(0)), "898495944");
        assert_eq!(hash(b"d119420", None), "589946768");
        let existing = [rev("s-a", 1, 5, b"other")];
        let d = choose(&existing, b"d119420", 0, None, |_| true);
        assert_eq!(
            d.update,
            Update::Create {
                revision: 2,
                collision_count: 0
            }
        );
        let d = choose(&existing, b"x-239", 0, None, |_| true);
        assert_eq!(d.update, Update::SemanticMatch { name: "s-a".into() });
    }

    #[test]
    fn st15_upgrade_from_1_33_reuses_the_revision() {
        // #134773: the 1.33 revision holds `"creationTimestamp":null`, the 1.37 template does
        // not; the bytes differ, the newest revision is reused, no rollout.
        let data133: Value = serde_json::from_str(DATA_1_33).unwrap();
        let existing = [Existing {
            hash_label: Some("c77f6d978"),
            ..rev("test-c77f6d978", 1, 5, DATA_1_33.as_bytes())
        }];
        let template = template_1_34();
        let candidate = patch_data(&template);
        assert_ne!(candidate, DATA_1_33.as_bytes());
        let d = choose(&existing, &candidate, 0, Some("test-c77f6d978"), |_| {
            semantically_equal(&template_from_data(&data133).unwrap(), &template)
        });
        assert_eq!(
            d.update,
            Update::SemanticMatch {
                name: "test-c77f6d978".into()
            }
        );
        assert_eq!(d.current, Current::Named("test-c77f6d978".into()));
        // And with both the 1.33 and 1.34 revisions, the 1.34 one matches by bytes.
        let both = [
            existing[0],
            Existing {
                hash_label: Some("776999688b"),
                ..rev("test-776999688b", 2, 6, DATA_1_34.as_bytes())
            },
        ];
        let d = choose(&both, &candidate, 0, None, |_| false);
        assert_eq!(
            d.update,
            Update::Newest {
                name: "test-776999688b".into()
            }
        );
    }

    #[test]
    fn st15_semantic_equality_table() {
        let base = template_1_34();
        let with = |f: &dyn Fn(&mut Value)| {
            let mut t = base.clone();
            f(&mut t);
            t
        };
        let equal: Vec<(&str, Value)> = vec![
            ("1.33 creationTimestamp null", template_1_33()),
            (
                "member order",
                serde_json::from_str(&serde_json::to_string(&base).unwrap()).unwrap(),
            ),
            (
                "explicit null member",
                with(&|t| t["spec"]["nodeName"] = Value::Null),
            ),
            (
                "nested null member",
                with(&|t| t["spec"]["containers"][0]["args"] = Value::Null),
            ),
            (
                "number as float",
                with(&|t| t["spec"]["terminationGracePeriodSeconds"] = json!(30.0)),
            ),
        ];
        for (name, t) in &equal {
            assert!(semantically_equal(&base, t), "{name}");
            assert!(semantically_equal(t, &base), "{name}");
        }
        let different: Vec<(&str, Value)> = vec![
            (
                "image",
                with(&|t| t["spec"]["containers"][0]["image"] = json!("other")),
            ),
            (
                "label value",
                with(&|t| t["metadata"]["labels"]["app"] = json!("bar")),
            ),
            (
                "empty object vs absent",
                with(&|t| {
                    t["spec"]["containers"][0]
                        .as_object_mut()
                        .unwrap()
                        .remove("resources")
                        .map(drop)
                        .unwrap()
                }),
            ),
            (
                "empty array vs absent",
                with(&|t| t["spec"]["volumes"] = json!([])),
            ),
            (
                "false vs absent",
                with(&|t| t["spec"]["hostNetwork"] = json!(false)),
            ),
            (
                "zero vs absent",
                with(&|t| t["spec"]["activeDeadlineSeconds"] = json!(0)),
            ),
            (
                "empty string vs absent",
                with(&|t| t["spec"]["nodeName"] = json!("")),
            ),
            (
                "array order",
                with(&|t| {
                    t["spec"]["containers"] =
                        json!([t["spec"]["containers"][0].clone(), {"name": "b", "image": "b"}]);
                }),
            ),
            (
                "number",
                with(&|t| t["spec"]["terminationGracePeriodSeconds"] = json!(31)),
            ),
            (
                "string vs number",
                with(&|t| t["spec"]["terminationGracePeriodSeconds"] = json!("30")),
            ),
            (
                "null array element vs none",
                with(&|t| {
                    t["spec"]["containers"] = json!([t["spec"]["containers"][0].clone(), null])
                }),
            ),
        ];
        for (name, t) in &different {
            assert!(!semantically_equal(&base, t), "{name}");
            assert!(!semantically_equal(t, &base), "{name}");
        }
        // Integers beyond 2^53 compare as Go's float64, as getPatch re-encodes both sides.
        assert!(semantically_equal(
            &json!({"n": 9007199254740993u64}),
            &json!({"n": 9007199254740992u64})
        ));
    }

    #[test]
    fn st15_template_from_data() {
        let v: Value = serde_json::from_str(DATA_1_33).unwrap();
        assert_eq!(template_from_data(&v), Some(template_1_33()));
        assert_eq!(
            template_from_data(&json!({"spec": {"template": {"a": 1}}})),
            None
        );
        assert_eq!(template_from_data(&json!({"spec": {}})), None);
    }

    #[test]
    fn st14_on_already_exists() {
        assert_eq!(on_already_exists(b"a", b"a", 3), OnAlreadyExists::Reuse);
        assert_eq!(
            on_already_exists(b"a", b"b", 3),
            OnAlreadyExists::Collision { next_count: 4 }
        );
        assert_eq!(
            on_already_exists(b"a", b"b", i32::MAX),
            OnAlreadyExists::Collision {
                next_count: i32::MIN
            }
        );
    }

    #[test]
    fn st17_history_to_delete_table() {
        let d: &[u8] = b"";
        let revs = vec![
            rev("r5", 5, 50, d),
            rev("r1", 1, 10, d),
            rev("r3", 3, 30, d),
            rev("r2", 2, 20, d),
            rev("r4", 4, 40, d),
            rev("r6", 6, 60, d),
        ];
        struct Case {
            name: &'static str,
            current: Option<&'static str>,
            update: Option<&'static str>,
            pods: Vec<&'static str>,
            limit: Option<i32>,
            want: Vec<&'static str>,
        }
        let cases = vec![
            Case {
                name: "limit 2, live current and update",
                current: Some("r5"),
                update: Some("r6"),
                pods: vec![],
                limit: Some(2),
                want: vec!["r1", "r2"],
            },
            Case {
                name: "pods keep their revisions",
                current: Some("r5"),
                update: Some("r6"),
                pods: vec!["r1", "r1", ""],
                limit: Some(1),
                want: vec!["r2", "r3"],
            },
            Case {
                name: "limit 0 deletes every non-live",
                current: Some("r6"),
                update: Some("r6"),
                pods: vec![],
                limit: Some(0),
                want: vec!["r1", "r2", "r3", "r4", "r5"],
            },
            Case {
                name: "negative keeps all",
                current: None,
                update: None,
                pods: vec![],
                limit: Some(-1),
                want: vec![],
            },
            Case {
                name: "nil is the default 10",
                current: None,
                update: None,
                pods: vec![],
                limit: None,
                want: vec![],
            },
            Case {
                name: "under the limit",
                current: Some("r6"),
                update: Some("r6"),
                pods: vec![],
                limit: Some(5),
                want: vec![],
            },
        ];
        for c in cases {
            let got =
                history_to_delete(&revs, c.current, c.update, c.pods.iter().copied(), c.limit);
            assert_eq!(got, c.want, "{}", c.name);
        }
        let many: Vec<String> = (0..12).map(|i| format!("m{i:02}")).collect();
        let many: Vec<Existing<'_>> = many
            .iter()
            .enumerate()
            .map(|(i, n)| rev(n, i as i64, 0, d))
            .collect();
        assert_eq!(
            history_to_delete(&many, None, None, [], None),
            vec!["m00", "m01"]
        );
    }
}
