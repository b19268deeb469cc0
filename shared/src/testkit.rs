//! The test kit for sync tests: a whole reconcile through a controller's real `init` and sync
//! code, without an API server (upstream's `TestControllerSyncJob` with fake clients is the
//! model). It gives:
//!
//! - caches built from objects ([`Kit::seed`], [`Kit::apply`], [`Kit::remove`]) that run the
//!   controller's handlers and indexes exactly as a watch would;
//! - a recording writer ([`FakeApi`]) that keeps every call in order and answers it from an
//!   in-memory object tracker (creates get a UID and resourceVersion, `generateName` is honoured,
//!   resourceVersion and UID preconditions are enforced), with scripted failures;
//! - a wall clock that follows tokio's paused time ([`crate::meta::clock::FollowingClock`]).
//!
//! Writes do not reach the caches by themselves, as on a real cluster where the watch lags:
//! [`Kit::observe`] delivers the tracker's state of one object to the cache, when a test wants
//! the watch to catch up.
//!
//! The tracker's strategic merge patch knows the merge keys the controllers' patches rely on
//! (`conditions` by `type`, `ownerReferences` by `uid`, `finalizers` as a set, and the
//! `$deleteFromPrimitiveList`, `$setElementOrder` and `$patch: delete` directives); any other list
//! is replaced. Sync tests are for decisions and the calls they make; behaviour against the API
//! server's own semantics is proven end to end.

use crate::api::writer::{Call, PatchKind, Target, Transport, Writer};
use crate::cache::informers::{Informer, Informers, Watched};
use crate::meta::clock::{Clock, FollowingClock};
use crate::meta::keys::object_key;
use crate::metrics::Metrics;
use crate::runtime::controller::Setup;
use crate::runtime::events::EventRecorder;
use crate::runtime::gates::FeatureGates;
use futures::FutureExt;
use futures::future::BoxFuture;
use k8s_openapi::jiff::Timestamp;
use serde::Serialize;
use serde_json::{Map, Value, json};
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use tokio_util::sync::CancellationToken;

type Rule = Box<dyn FnMut(&Call) -> Option<Result<Value, kube::Error>> + Send>;
type Defaulter = Box<dyn Fn(&mut Value) + Send>;

#[derive(Default)]
struct Tracker {
    /// (plural, namespace, name) -> object.
    objects: BTreeMap<(String, String, String), Value>,
    calls: Vec<Call>,
    rules: Vec<Rule>,
    /// What a dry-run create does to its body (the API server's defaulting); none by default.
    defaulter: Option<Defaulter>,
    next_rv: u64,
    next_uid: u64,
}

/// The recording writer: keeps every call and answers from an object tracker.
#[derive(Default)]
pub struct FakeApi {
    state: Mutex<Tracker>,
}

/// An API error as the server sends it.
pub fn api_error(code: u16, reason: &str, message: &str) -> kube::Error {
    kube::Error::Api(Box::new(kube::core::Status {
        code,
        reason: reason.to_string(),
        message: message.to_string(),
        ..kube::core::Status::failure(message, reason)
    }))
}

fn id(t: &Target) -> (String, String, String) {
    (t.plural.clone(), t.namespace.clone(), t.name.clone())
}

fn meta_str<'a>(v: &'a Value, field: &str) -> Option<&'a str> {
    v.get("metadata")?.get(field)?.as_str()
}

fn set_meta(v: &mut Value, field: &str, value: Value) {
    if !v.get("metadata").is_some_and(Value::is_object) {
        v["metadata"] = json!({});
    }
    v["metadata"][field] = value;
}

fn not_found(t: &Target) -> kube::Error {
    api_error(
        404,
        "NotFound",
        &format!("{} \"{}\" not found", t.plural, t.name),
    )
}

fn conflict(t: &Target, why: &str) -> kube::Error {
    api_error(
        409,
        "Conflict",
        &format!(
            "Operation cannot be fulfilled on {} \"{}\": {why}",
            t.plural, t.name
        ),
    )
}

/// RFC 7386 merge patch, or (with `strategic`) the strategic subset described in the module
/// docs.
fn merge(target: &mut Value, patch: &Value, strategic: bool, field: &str) {
    let Value::Object(patch) = patch else {
        *target = patch.clone();
        return;
    };
    if !target.is_object() {
        *target = Value::Object(Map::new());
    }
    let map = target.as_object_mut().expect("object");
    for (k, v) in patch {
        if strategic {
            if let Some(list) = k.strip_prefix("$deleteFromPrimitiveList/") {
                if let (Some(Value::Array(have)), Value::Array(gone)) = (map.get_mut(list), v) {
                    have.retain(|x| !gone.contains(x));
                }
                continue;
            }
            if k.starts_with('$') {
                continue;
            }
        }
        match v {
            Value::Null => {
                map.remove(k);
            }
            Value::Array(items) if strategic => {
                let have = map.entry(k.clone()).or_insert(Value::Array(vec![]));
                merge_list(have, items, k);
            }
            Value::Object(_) => merge(map.entry(k.clone()).or_insert(Value::Null), v, strategic, k),
            _ => {
                map.insert(k.clone(), v.clone());
            }
        }
    }
    let _ = field;
}

fn merge_key(field: &str) -> Option<&'static str> {
    match field {
        "conditions" => Some("type"),
        "ownerReferences" => Some("uid"),
        "containerStatuses" | "initContainerStatuses" => Some("name"),
        _ => None,
    }
}

fn merge_list(have: &mut Value, items: &[Value], field: &str) {
    if !have.is_array() {
        *have = Value::Array(vec![]);
    }
    let list = have.as_array_mut().expect("array");
    if field == "finalizers" {
        for item in items {
            if !list.contains(item) {
                list.push(item.clone());
            }
        }
        return;
    }
    let Some(key) = merge_key(field) else {
        *list = items.to_vec();
        return;
    };
    for item in items {
        let k = item.get(key);
        let pos = list.iter().position(|x| x.get(key) == k);
        let delete = item.get("$patch").and_then(Value::as_str) == Some("delete");
        match (pos, delete) {
            (Some(i), true) => {
                list.remove(i);
            }
            (None, true) => {}
            (Some(i), false) => merge(&mut list[i], item, true, field),
            (None, false) => list.push(item.clone()),
        }
    }
}

impl FakeApi {
    fn lock(&self) -> std::sync::MutexGuard<'_, Tracker> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Puts an object in the tracker (as if it existed on the server).
    pub fn insert<K: Watched + Serialize>(&self, obj: &K) {
        let v = serde_json::to_value(obj).expect("serializable");
        let t = Target::of::<K>(
            obj.meta().namespace.as_deref().unwrap_or_default(),
            obj.meta().name.as_deref().unwrap_or_default(),
        );
        self.lock().objects.insert(id(&t), v);
    }

    /// The tracker's current state of an object.
    pub fn object<K: Watched>(&self, namespace: &str, name: &str) -> Option<K> {
        let t = Target::of::<K>(namespace, name);
        let v = self.lock().objects.get(&id(&t)).cloned()?;
        serde_json::from_value(v).ok()
    }

    /// Every object of a kind the tracker holds.
    pub fn objects<K: Watched>(&self) -> Vec<K> {
        let plural = K::plural(&()).into_owned();
        self.lock()
            .objects
            .iter()
            .filter(|((p, _, _), _)| *p == plural)
            .filter_map(|(_, v)| serde_json::from_value(v.clone()).ok())
            .collect()
    }

    /// Every call so far, in order.
    pub fn calls(&self) -> Vec<Call> {
        self.lock().calls.clone()
    }

    /// Calls that change something: not event writes, reads or dry runs.
    pub fn writes(&self) -> Vec<Call> {
        self.calls()
            .into_iter()
            .filter(|c| {
                c.target().plural != "events" && !matches!(c, Call::Get(_) | Call::DryRunCreate(..))
            })
            .collect()
    }

    /// Makes dry-run creates answer with their body as `defaults` leaves it, as the API
    /// server's defaulting would.
    pub fn default_dry_runs(&self, defaults: impl Fn(&mut Value) + Send + 'static) {
        self.lock().defaulter = Some(Box::new(defaults));
    }

    /// The events written so far as (type, reason, message), in order (creates and count bumps).
    pub fn events(&self) -> Vec<(String, String, String)> {
        self.calls()
            .into_iter()
            .filter_map(|c| match c {
                Call::Create(t, v) if t.plural == "events" => Some((
                    v["type"].as_str().unwrap_or_default().to_string(),
                    v["reason"].as_str().unwrap_or_default().to_string(),
                    v["message"].as_str().unwrap_or_default().to_string(),
                )),
                _ => None,
            })
            .collect()
    }

    pub fn clear_calls(&self) {
        self.lock().calls.clear();
    }

    /// Answers calls `rule` picks with its error, for as long as the rule stays (it is kept;
    /// make it count down to fail a few times only).
    pub fn fail_when(&self, mut rule: impl FnMut(&Call) -> Option<kube::Error> + Send + 'static) {
        self.lock()
            .rules
            .push(Box::new(move |c: &Call| rule(c).map(Err)));
    }

    /// Answers calls `rule` picks with its answer, success or error, without touching the
    /// tracker (e.g. a 2xx body that is a `Status` saying `Failure`); kept like `fail_when`'s.
    pub fn answer_when(
        &self,
        rule: impl FnMut(&Call) -> Option<Result<Value, kube::Error>> + Send + 'static,
    ) {
        self.lock().rules.push(Box::new(rule));
    }

    /// Fails the next `times` calls of `verb` on `plural` with `code`/`reason`.
    pub fn fail(
        &self,
        verb: &'static str,
        plural: &'static str,
        times: usize,
        code: u16,
        reason: &'static str,
    ) {
        let mut left = times;
        self.fail_when(move |c| {
            if left > 0 && c.verb() == verb && c.target().plural == plural {
                left -= 1;
                Some(api_error(
                    code,
                    reason,
                    &format!("injected {code} {reason}"),
                ))
            } else {
                None
            }
        });
    }

    fn answer(&self, call: Call) -> Result<Value, kube::Error> {
        let mut s = self.lock();
        s.calls.push(call.clone());
        // A raw create is a create of the JSON it carries (the bytes are what tests inspect).
        let call = match call {
            Call::CreateRaw(t, bytes) => match serde_json::from_slice(&bytes) {
                Ok(v) => Call::Create(t, v),
                Err(e) => {
                    return Err(api_error(
                        400,
                        "BadRequest",
                        &format!("invalid JSON body: {e}"),
                    ));
                }
            },
            other => other,
        };
        // A graceful delete is a delete to the tracker (the object goes at once).
        let call = match call {
            Call::DeleteGraceful {
                target,
                uid,
                resource_version,
                propagation,
                ..
            } => Call::Delete {
                target,
                uid,
                resource_version,
                propagation,
            },
            other => other,
        };
        let mut rules = std::mem::take(&mut s.rules);
        let injected = rules.iter_mut().find_map(|r| r(&call));
        s.rules = rules;
        if let Some(answer) = injected {
            return answer;
        }
        s.next_rv += 1;
        let rv = (1000 + s.next_rv).to_string();
        match call {
            Call::CreateRaw(..) | Call::DeleteGraceful { .. } => unreachable!("converted above"),
            Call::DryRunCreate(_, mut v) => {
                if let Some(d) = &s.defaulter {
                    d(&mut v);
                }
                Ok(v)
            }
            Call::Get(t) => s.objects.get(&id(&t)).cloned().ok_or_else(|| not_found(&t)),
            Call::Create(t, v) if t.subresource.is_none() => s.create(t, v, rv),
            Call::Create(t, v) => Ok(v).and_then(|v| {
                // A subresource create (eviction): the object is deleted.
                s.objects.remove(&id(&t)).ok_or_else(|| not_found(&t))?;
                Ok(v)
            }),
            Call::Replace(t, v) => s.replace(&t, &v, rv),
            Call::Patch(t, kind, patch) => s.patch(&t, kind, &patch, rv),
            Call::Delete {
                target,
                uid,
                resource_version,
                ..
            } => s.delete(&target, uid.as_deref(), resource_version.as_deref()),
        }
    }
}

/// The fake API server's answers, one per kind of call, on the tracker's objects.
impl Tracker {
    fn create(&mut self, mut t: Target, mut v: Value, rv: String) -> Result<Value, kube::Error> {
        let s = self;
        if t.name.is_empty() {
            t.name = match meta_str(&v, "name") {
                Some(n) if !n.is_empty() => n.to_string(),
                // A generated name never meets an object seeded by the test (the API
                // server's random suffixes practically never collide).
                _ => loop {
                    s.next_uid += 1;
                    let name = format!(
                        "{}{:05}",
                        meta_str(&v, "generateName").unwrap_or_default(),
                        s.next_uid
                    );
                    let mut probe = t.clone();
                    probe.name = name.clone();
                    if !s.objects.contains_key(&id(&probe)) {
                        break name;
                    }
                },
            };
        }
        if s.objects.contains_key(&id(&t)) {
            return Err(api_error(
                409,
                "AlreadyExists",
                &format!("{} \"{}\" already exists", t.plural, t.name),
            ));
        }
        s.next_uid += 1;
        set_meta(&mut v, "name", t.name.clone().into());
        if !t.namespace.is_empty() {
            set_meta(&mut v, "namespace", t.namespace.clone().into());
        }
        set_meta(&mut v, "uid", format!("uid-{}", s.next_uid).into());
        set_meta(&mut v, "resourceVersion", rv.into());
        set_meta(&mut v, "generation", 1.into());
        s.objects.insert(id(&t), v.clone());
        Ok(v)
    }

    fn replace(&mut self, t: &Target, v: &Value, rv: String) -> Result<Value, kube::Error> {
        let s = self;
        let stored = s.objects.get(&id(t)).cloned().ok_or_else(|| not_found(t))?;
        if let Some(want) = meta_str(v, "resourceVersion")
            && Some(want) != meta_str(&stored, "resourceVersion")
        {
            return Err(conflict(
                t,
                "the object has been modified; please apply your changes to the latest version and try again",
            ));
        }
        let mut next = if t.subresource.as_deref() == Some("status") {
            let mut n = stored.clone();
            n["status"] = v.get("status").cloned().unwrap_or(Value::Null);
            n
        } else {
            // As the API server: identity and generation are the server's; the
            // generation moves when anything outside metadata and status changes.
            let mut n = v.clone();
            n["status"] = stored.get("status").cloned().unwrap_or(Value::Null);
            for key in ["uid", "creationTimestamp"] {
                if let Some(kept) = stored["metadata"].get(key).cloned() {
                    set_meta(&mut n, key, kept);
                }
            }
            let content = |o: &Value| {
                let mut o = o.clone();
                if let Some(m) = o.as_object_mut() {
                    // apiVersion and kind are the request's framing, not content:
                    // a seeded object stored without them must not move generation.
                    for k in ["metadata", "status", "apiVersion", "kind"] {
                        m.remove(k);
                    }
                    m.retain(|_, v| !v.is_null());
                }
                o
            };
            let generation = stored["metadata"]["generation"].as_i64().unwrap_or(0);
            let bump = i64::from(content(&stored) != content(&n));
            set_meta(&mut n, "generation", generation.saturating_add(bump).into());
            n
        };
        set_meta(&mut next, "resourceVersion", rv.into());
        s.objects.insert(id(t), next.clone());
        Ok(next)
    }

    fn patch(
        &mut self,
        t: &Target,
        kind: PatchKind,
        patch: &Value,
        rv: String,
    ) -> Result<Value, kube::Error> {
        let s = self;
        let mut next = s.objects.get(&id(t)).cloned().ok_or_else(|| not_found(t))?;
        if let Some(want) = meta_str(patch, "resourceVersion")
            && Some(want) != meta_str(&next, "resourceVersion")
        {
            return Err(conflict(t, "the object has been modified"));
        }
        if let Some(want) = meta_str(patch, "uid")
            && Some(want) != meta_str(&next, "uid")
        {
            // As the API server: the UID is an immutable field, so a patch meeting
            // another object of the same name fails validation (422), not with 409.
            return Err(api_error(
                422,
                "Invalid",
                &format!(
                    "{} \"{}\" is invalid: metadata.uid: Invalid value: \"{want}\": field is immutable",
                    t.plural, t.name
                ),
            ));
        }
        match kind {
            PatchKind::Merge => merge(&mut next, patch, false, ""),
            PatchKind::Strategic => merge(&mut next, patch, true, ""),
            PatchKind::Json => {
                return Err(api_error(
                    415,
                    "UnsupportedMediaType",
                    "JSON patch is not supported by the test kit",
                ));
            }
        }
        set_meta(&mut next, "resourceVersion", rv.into());
        s.objects.insert(id(t), next.clone());
        Ok(next)
    }

    fn delete(
        &mut self,
        target: &Target,
        uid: Option<&str>,
        resource_version: Option<&str>,
    ) -> Result<Value, kube::Error> {
        let s = self;
        let stored = s
            .objects
            .get(&id(target))
            .cloned()
            .ok_or_else(|| not_found(target))?;
        if uid.is_some_and(|u| Some(u) != meta_str(&stored, "uid")) {
            return Err(conflict(
                target,
                "Precondition failed: UID in precondition does not match",
            ));
        }
        if resource_version.is_some_and(|r| Some(r) != meta_str(&stored, "resourceVersion")) {
            return Err(conflict(
                target,
                "Precondition failed: resourceVersion in precondition does not match",
            ));
        }
        s.objects.remove(&id(target));
        Ok(stored)
    }
}

impl Transport for FakeApi {
    fn call(&self, call: Call) -> BoxFuture<'_, Result<Value, kube::Error>> {
        let answer = self.answer(call);
        async move { answer }.boxed()
    }
}

/// Everything a sync test needs: caches, the recording writer, a clock and metrics.
pub struct Kit {
    pub informers: Arc<Informers>,
    pub metrics: Arc<Metrics>,
    pub api: Arc<FakeApi>,
    pub clock: Arc<dyn Clock>,
    pub gates: FeatureGates,
}

/// A fixed, readable start for the kit's wall clock.
pub const EPOCH: &str = "2026-01-01T00:00:00Z";

impl Kit {
    /// A kit whose wall clock starts at [`EPOCH`] and follows tokio's time (pause it with
    /// `#[tokio::test(start_paused = true)]` to drive it).
    pub fn new() -> Kit {
        let config = kube::Config::new("http://127.0.0.1:9".parse().expect("static url"));
        let client = kube::Client::try_from(config).expect("a client for no server");
        Kit {
            informers: crate::cache::registry(client, CancellationToken::new()),
            metrics: Metrics::new(),
            api: Arc::new(FakeApi::default()),
            clock: Arc::new(FollowingClock::starting_at(
                EPOCH.parse::<Timestamp>().expect("static time"),
            )),
            gates: FeatureGates::default(),
        }
    }

    pub fn writer(&self) -> Writer {
        Writer::new(Arc::clone(&self.api) as Arc<dyn Transport>)
    }

    /// Syncs that panicked, over every controller (each series exists at 0 from its start).
    pub fn panics(&self) -> f64 {
        self.metrics
            .encode()
            .lines()
            .filter(|l| l.starts_with("pilothouse_reconcile_panics_total{"))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum()
    }

    /// The `Setup` a controller's `init` receives, wired to this kit.
    pub fn setup(&self, name: &'static str, event_source: &str) -> Setup {
        Setup {
            name,
            writer: self.writer(),
            informers: Arc::clone(&self.informers),
            metrics: Arc::clone(&self.metrics),
            events: EventRecorder::new(self.writer(), event_source, "testkit"),
            gates: self.gates,
            clock: Arc::clone(&self.clock),
        }
    }

    /// Puts objects in both the cache (running handlers) and the tracker, and marks the cache
    /// synced. Call it after the controller's `init`: pods are projected to the fields declared
    /// by then, as in production where every declaration precedes the first list.
    pub fn seed<K: Watched + Serialize>(&self, objects: impl IntoIterator<Item = K>) {
        let informer = self.informers.testkit_get::<K>();
        for obj in objects {
            self.api.insert(&obj);
            informer.testkit_apply(obj);
        }
        informer.testkit_mark_synced();
    }

    /// A change delivered by the watch: the cache only (the tracker is left as it is).
    pub fn apply<K: Watched>(&self, obj: K) {
        self.informers.testkit_get::<K>().testkit_apply(obj);
    }

    /// A deletion delivered by the watch: the cache only.
    pub fn remove<K: Watched>(&self, obj: K) {
        self.informers.testkit_get::<K>().testkit_delete(obj);
    }

    /// The watch catches up with one object: the tracker's state (or its absence) reaches the
    /// cache.
    pub fn observe<K: Watched>(&self, namespace: &str, name: &str) {
        let informer: Arc<Informer<K>> = self.informers.testkit_get::<K>();
        match self.api.object::<K>(namespace, name) {
            Some(obj) => informer.testkit_apply(obj),
            None => {
                let key = if namespace.is_empty() {
                    name.to_string()
                } else {
                    format!("{namespace}/{name}")
                };
                if let Some(cached) = informer.get(&key) {
                    informer.testkit_delete((*cached).clone());
                }
            }
        }
    }

    /// The cache key of an object, for calling a sync directly.
    pub fn key<K: Watched>(obj: &K) -> String {
        object_key(obj)
    }
}

impl Default for Kit {
    fn default() -> Self {
        Kit::new()
    }
}

/// A controller started by [`Kit::start`].
pub struct Running {
    stop: CancellationToken,
    handle: tokio::task::JoinHandle<()>,
}

impl Running {
    /// Stops the controller and waits for its workers to drain.
    pub async fn stop(self) {
        self.stop.cancel();
        let _ = self.handle.await;
    }
}

impl Kit {
    /// Runs a controller as the runtime does once this replica leads (starters, then workers).
    pub fn start(&self, controller: Box<dyn crate::runtime::controller::Controller>) -> Running {
        let stop = CancellationToken::new();
        let handle = tokio::spawn(controller.run(stop.clone()));
        Running { stop, handle }
    }
}

/// Polls `done` every 10 ms (of tokio time: paused tests advance at once) for up to `limit`;
/// true if it held.
pub async fn eventually(limit: std::time::Duration, mut done: impl FnMut() -> bool) -> bool {
    let end = crate::meta::clock::far_or(tokio::time::Instant::now(), limit);
    loop {
        settle().await;
        if done() {
            return true;
        }
        if tokio::time::Instant::now() >= end {
            return false;
        }
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
}

/// Lets spawned tasks (event writes) run: call after a sync before reading events.
pub async fn settle() {
    for _ in 0..20 {
        tokio::task::yield_now().await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::Pod;
    use kube::api::ObjectMeta;

    fn pod(name: &str) -> Pod {
        Pod {
            metadata: ObjectMeta {
                name: Some(name.into()),
                namespace: Some("ns".into()),
                uid: Some(format!("uid-{name}")),
                resource_version: Some("1".into()),
                finalizers: Some(vec!["a".into(), "b".into()]),
                ..Default::default()
            },
            ..Default::default()
        }
    }

    #[tokio::test]
    async fn tracker_enforces_preconditions_and_applies_strategic_patches() {
        let kit = Kit::new();
        kit.seed([pod("p")]);
        let w = kit.writer();
        let patched: Pod = w
            .patch(
                "ns",
                "p",
                PatchKind::Strategic,
                json!({"metadata": {"$deleteFromPrimitiveList/finalizers": ["a"]},
                       "status": {"conditions": [{"type": "Ready", "status": "False"}]}}),
            )
            .await
            .unwrap();
        assert_eq!(patched.metadata.finalizers, Some(vec!["b".to_string()]));
        let stale = w
            .patch::<Pod>(
                "ns",
                "p",
                PatchKind::Merge,
                json!({"metadata": {"resourceVersion": "1"}}),
            )
            .await;
        assert!(crate::api::apierr::is_conflict(&stale.unwrap_err()));
        let replaced = w
            .patch::<Pod>(
                "ns",
                "p",
                PatchKind::Merge,
                json!({"metadata": {"uid": "other"}}),
            )
            .await;
        assert!(crate::api::apierr::is_uid_mismatch(&replaced.unwrap_err()));
        let wrong_uid = w
            .delete::<Pod>("ns", "p", crate::api::writer::Delete::with_uid("other"))
            .await;
        assert!(crate::api::apierr::is_conflict(&wrong_uid.unwrap_err()));
        w.delete::<Pod>("ns", "p", crate::api::writer::Delete::with_uid("uid-p"))
            .await
            .unwrap();
        assert!(kit.api.object::<Pod>("ns", "p").is_none());
        assert_eq!(
            kit.api.calls().iter().map(Call::verb).collect::<Vec<_>>(),
            ["patch", "patch", "patch", "delete", "delete"]
        );
        // The cache still holds the pod until the watch catches up.
        assert!(kit.informers.get::<Pod>().get("ns/p").is_some());
        kit.observe::<Pod>("ns", "p");
        assert!(kit.informers.get::<Pod>().get("ns/p").is_none());
    }

    #[tokio::test]
    async fn generate_name_and_scripted_failures() {
        let kit = Kit::new();
        let w = kit.writer();
        kit.api.fail("create", "pods", 1, 500, "InternalError");
        let mut p = pod("");
        p.metadata.name = None;
        p.metadata.generate_name = Some("job-".into());
        assert!(w.create("ns", &p).await.is_err());
        let made = w.create("ns", &p).await.unwrap();
        assert!(made.metadata.name.unwrap().starts_with("job-"));
        assert!(made.metadata.uid.is_some());
    }
}
