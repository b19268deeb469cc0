//! One StatefulSet's sync (upstream `sync` → `UpdateStatefulSet`): read-your-writes check
//! (ST-44), adoption of revisions and pods (ST-4), the current and update revisions (ST-14),
//! the plan (ST-18..ST-31) and its writes, the status (ST-40..ST-42) and the history (ST-17).
//! The writes to pods and claims are [`crate::pod_control`]'s.

use crate::identity::{self, Owners};
use crate::metrics::{Metrics, SetLabels, ZeroGraceLabels};
use crate::model::StatefulSet;
use crate::plan::{self, Action, Management, PodView, SetView, Strategy, Which};
use crate::revision::{self, Current, Decision, Existing, OnAlreadyExists, SetSource, Update};
use crate::{Error, act, api, status};
use k8s_openapi::api::apps::v1::ControllerRevision;
use k8s_openapi::api::core::v1::PersistentVolumeClaim;
use serde_json::Value;
use shared::api::writer::Writer;
use shared::cache::informers::{INDEX_CONTROLLER_UID, INDEX_ORPHAN_NAMESPACE, Informer};
use shared::cache::pod::Pod;
use shared::cache::written::Written;
use shared::meta::clock::Clock;
use shared::meta::keys::object_key;
use shared::meta::refs::controller_of;
use shared::runtime::claim;
use shared::runtime::controller::Ctx;
use shared::runtime::events::EventRecorder;
use shared::runtime::queue::{Next, Queue};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

pub struct Caches {
    pub sets: Arc<Informer<StatefulSet>>,
    pub pods: Arc<Informer<Pod>>,
    pub claims: Arc<Informer<PersistentVolumeClaim>>,
    pub revisions: Arc<Informer<ControllerRevision>>,
}

pub struct StatefulSetController {
    pub c: Caches,
    pub queue: Arc<Queue<String>>,
    pub writer: Writer,
    pub events: EventRecorder,
    pub clock: Arc<dyn Clock>,
    pub metrics: Metrics,
    /// ST-44: this controller's writes, by set key, that its caches must show before it acts.
    pub(crate) written: Written,
    /// SB-7, per set key: the (UID, generation) last warned about (SB-7).
    zero_grace_warned: Mutex<HashMap<String, (String, i64)>>,
    /// ST-15: (set UID, generation, revision resourceVersion) → equal once defaulted.
    defaulted_matches: Mutex<HashMap<(String, i64, String), bool>>,
    /// StatefulSetRecreateStrategy (alpha in 1.37, off by default).
    recreate_gate: bool,
}

use shared::lock;

/// The revisions of a set as the sync sees them: the cached objects and their data bytes.
struct Revisions {
    objects: Vec<Arc<ControllerRevision>>,
    data: Vec<Vec<u8>>,
}

impl Revisions {
    fn existing(&self) -> Vec<Existing<'_>> {
        self.objects
            .iter()
            .zip(&self.data)
            .map(|(r, d)| Existing {
                name: r.metadata.name.as_deref().unwrap_or_default(),
                revision: r.revision.unwrap_or(0),
                created: r.metadata.creation_timestamp.as_ref().map(|t| t.0),
                hash_label: r
                    .metadata
                    .labels
                    .as_ref()
                    .and_then(|l| l.get(revision::HASH_LABEL))
                    .map(String::as_str),
                data: d,
            })
            .collect()
    }

    fn template(&self, name: &str) -> Option<Value> {
        self.objects
            .iter()
            .find(|r| r.metadata.name.as_deref() == Some(name))
            .and_then(|r| revision::template_from_data(&r.data.0))
    }
}

/// What the revision step settled.
pub(crate) struct Revs {
    pub current: String,
    pub update: String,
    pub current_template: Value,
    pub update_template: Value,
    pub collision_count: i32,
}

impl StatefulSetController {
    pub fn new(c: Caches, queue: Arc<Queue<String>>, ctx: Ctx<Metrics>) -> StatefulSetController {
        let Ctx {
            writer,
            events,
            clock,
            metrics,
            gates,
        } = ctx;
        StatefulSetController {
            recreate_gate: gates.stateful_set_recreate_strategy,
            c,
            queue,
            writer,
            events,
            clock,
            metrics,
            written: Written::new(),
            zero_grace_warned: Mutex::new(HashMap::new()),
            defaulted_matches: Mutex::new(HashMap::new()),
        }
    }

    pub async fn sync(&self, key: &str) -> Result<Next, Error> {
        // ST-44: act only on caches that show this set's own writes (SB-8: revisions too).
        if let Some(behind) = self.written.behind(key) {
            return Ok(Next::Stale(behind));
        }
        let Some(set) = self.c.sets.get(key) else {
            self.written.forget(key);
            self.forget_set(key);
            return Ok(Next::Done);
        };
        let selector = set.spec.as_ref().and_then(|s| s.selector.as_ref());
        if let Err(e) = shared::meta::selector::matches(selector, None) {
            // Upstream logs and drops the key; an operator gets told which field.
            self.events.warning(
                &shared::meta::refs::object_reference(set.as_ref()),
                "InvalidSelector",
                "Sync",
                format!("spec.selector: {e}"),
            );
            return Ok(Next::Done);
        }
        self.adopt_orphan_revisions(&set).await?;
        let pods = self.claim_pods(&set).await?;
        self.update_set(key, &set, pods).await
    }

    /// ST-4: the set's revisions from the cache: its own and orphans matching its selector
    /// (upstream `ListControllerRevisions`).
    fn revisions_of(&self, set: &StatefulSet) -> Vec<Arc<ControllerRevision>> {
        let selector = set.spec.as_ref().and_then(|s| s.selector.as_ref());
        let matches = |r: &ControllerRevision| {
            shared::meta::selector::matches(selector, r.metadata.labels.as_ref()).unwrap_or(false)
        };
        self.c
            .revisions
            .by_index(INDEX_CONTROLLER_UID, set.uid())
            .into_iter()
            .chain(
                self.c
                    .revisions
                    .by_index(INDEX_ORPHAN_NAMESPACE, set.namespace()),
            )
            .filter(|r| matches(r))
            .collect()
    }

    /// ST-4 (upstream `adoptOrphanRevisions`): orphans matching the selector are adopted after a
    /// live re-read of the set.
    async fn adopt_orphan_revisions(&self, set: &StatefulSet) -> Result<(), Error> {
        let orphans: Vec<_> = self
            .revisions_of(set)
            .into_iter()
            .filter(|r| controller_of(&r.metadata).is_none())
            .collect();
        if orphans.is_empty() || set.metadata.deletion_timestamp.is_some() {
            return Ok(());
        }
        self.can_adopt(set).await?;
        for r in orphans {
            let name = r.metadata.name.as_deref().unwrap_or_default();
            let uid = r.metadata.uid.as_deref().unwrap_or_default();
            match act::adopt::<ControllerRevision>(&self.writer, set, set.namespace(), name, uid)
                .await
            {
                Ok(()) => {}
                Err(e) if claim::adopt_error_ignored(&e) => {}
                Err(e) => return Err(api(format!("adopting revision {name}"))(e)),
            }
        }
        Ok(())
    }

    async fn can_adopt(&self, set: &StatefulSet) -> Result<(), Error> {
        let fresh = act::get_set(&self.writer, set.namespace(), set.name())
            .await
            .map_err(api(format!("re-reading statefulset {}", object_key(set))))?;
        claim::can_adopt(set, &fresh).map_err(|e| Error::Claim(e.to_string()))
    }

    /// ST-4 (upstream `getPodsForStatefulSet`): owned pods and orphans of this set's name that
    /// match its selector; owned pods that stopped matching are released.
    async fn claim_pods(&self, set: &StatefulSet) -> Result<Vec<Arc<Pod>>, Error> {
        let selector = set.spec.as_ref().and_then(|s| s.selector.as_ref());
        let member = |p: &Pod| {
            identity::parent_and_ordinal(p.metadata.name.as_deref().unwrap_or_default()).0
                == set.name()
        };
        let matches = |p: &Pod| {
            member(p)
                && shared::meta::selector::matches(selector, p.metadata.labels.as_ref())
                    .unwrap_or(false)
        };
        let candidates = self
            .c
            .pods
            .by_index(INDEX_CONTROLLER_UID, set.uid())
            .into_iter()
            .chain(
                self.c
                    .pods
                    .by_index(INDEX_ORPHAN_NAMESPACE, set.namespace()),
            );
        let claims = claim::partition::<Pod, _>(&set.metadata, candidates, matches);
        let mut failed: Option<Error> = None;
        for p in &claims.release {
            let (name, uid) = (pod_name(p), pod_uid(p));
            if let Err(e) = act::release::<k8s_openapi::api::core::v1::Pod>(
                &self.writer,
                set,
                set.namespace(),
                name,
                uid,
            )
            .await
                && !claim::release_error_ignored(&e)
            {
                failed.get_or_insert(api(format!("releasing pod {name}"))(e));
            }
        }
        let mut claimed = claims.owned;
        if !claims.adopt.is_empty() {
            self.can_adopt(set).await?;
            for p in claims.adopt {
                let (name, uid) = (pod_name(&p), pod_uid(&p));
                match act::adopt::<k8s_openapi::api::core::v1::Pod>(
                    &self.writer,
                    set,
                    set.namespace(),
                    name,
                    uid,
                )
                .await
                {
                    Ok(()) => {
                        let mut copy = (*p).clone();
                        copy.metadata.owner_references = Some(vec![identity::set_ref(set)]);
                        claimed.push(Arc::new(copy));
                    }
                    Err(e) if claim::adopt_error_ignored(&e) => {}
                    Err(e) => {
                        failed.get_or_insert(api(format!("adopting pod {name}"))(e));
                    }
                }
            }
        }
        match failed {
            Some(e) => Err(e),
            None => Ok(claimed),
        }
    }

    /// ST-15: whether revision `name`'s template, defaulted by the API server (a dry-run
    /// PodTemplate create in the set's namespace), is semantically the set's template. Asked
    /// only when the two differ by members the revision lacks; answers cached per (set UID,
    /// generation, revision resourceVersion), bounded as upstream's LRU. A dry run that may
    /// succeed later (throttled, timed out, server error, no connection) fails the sync, to be
    /// retried: a new revision would roll every pod. One refused for good (no
    /// `create podtemplates` permission, a webhook or quota refusing PodTemplates) counts as "not
    /// equal" — a new revision, as without defaults — with a warning in the log.
    async fn equal_once_defaulted(
        &self,
        set: &StatefulSet,
        revs: &Revisions,
        name: &str,
    ) -> Result<bool, Error> {
        let spec = set.spec();
        let Some(template) = revs.template(name) else {
            return Ok(false);
        };
        if !revision::differs_only_by_missing(&template, &spec.template) {
            return Ok(false);
        }
        let rv = revs
            .objects
            .iter()
            .find(|r| r.metadata.name.as_deref() == Some(name))
            .and_then(|r| r.metadata.resource_version.clone())
            .unwrap_or_default();
        let key = (
            set.uid().to_string(),
            set.metadata.generation.unwrap_or(0),
            rv,
        );
        if let Some(hit) = lock(&self.defaulted_matches).get(&key) {
            return Ok(*hit);
        }
        let equal = match act::defaulted_template(&self.writer, set.namespace(), template).await {
            Ok(t) => revision::semantically_equal(&t, &spec.template),
            Err(e) => {
                use shared::api::apierr::ErrorKind as K;
                match shared::api::apierr::classify(&e) {
                    K::TooManyRequests
                    | K::Timeout
                    | K::ServerError
                    | K::Transport
                    | K::NotLeading => {
                        return Err(api(format!("defaulting the template of revision {name}"))(
                            e,
                        ));
                    }
                    _ => {
                        tracing::warn!(revision = name, error = %shared::api::apierr::message(&e),
                            "the API server would not default a revision's template (ST-15): comparing without defaults");
                        false
                    }
                }
            }
        };
        let mut cache = lock(&self.defaulted_matches);
        if cache.len() >= revision::SEMANTIC_CACHE_SIZE {
            cache.clear();
        }
        cache.insert(key, equal);
        Ok(equal)
    }

    /// ST-14 (upstream `getStatefulSetRevisions`): the current and update revisions, creating or
    /// rolling back to one as needed.
    async fn revisions(&self, key: &str, set: &StatefulSet) -> Result<Revs, Error> {
        let revs = self.cached_revisions(set);
        let spec = set.spec();
        let decision = self
            .decide(set, &revs, &revision::patch_data(&spec.template))
            .await?;
        let mut count = set.status().collision_count.unwrap_or(0);
        let update = match decision.update {
            Update::Newest { name } | Update::SemanticMatch { name } => name,
            Update::Rollback { name, revision } => {
                self.roll_back(key, &revs, name, revision).await?
            }
            Update::Create {
                revision,
                collision_count,
            } => {
                let (name, used) = self
                    .create_revision(key, set, revision, collision_count)
                    .await?;
                count = used;
                name
            }
        };
        let current = match decision.current {
            Current::Named(n) => n,
            Current::Update => update.clone(),
        };
        let update_template = spec.template.clone();
        let current_template = if current == update {
            update_template.clone()
        } else {
            revs.template(&current)
                .unwrap_or_else(|| update_template.clone())
        };
        Ok(Revs {
            current,
            update,
            current_template,
            update_template,
            collision_count: count,
        })
    }

    /// The set's revisions from the cache, with their data in Go's encoding (ST-12), the bytes
    /// revisions are compared by.
    fn cached_revisions(&self, set: &StatefulSet) -> Revisions {
        let objects = self.revisions_of(set);
        let data = objects
            .iter()
            .map(|r| revision::go_json(&r.data.0))
            .collect();
        Revisions { objects, data }
    }

    /// ST-14's decision for the set's `candidate` data: byte-equal revisions first, then the
    /// newest one semantically equal (ST-15), asking the API server for defaults only when they
    /// alone could explain the difference.
    async fn decide(
        &self,
        set: &StatefulSet,
        revs: &Revisions,
        candidate: &[u8],
    ) -> Result<Decision, Error> {
        let existing = revs.existing();
        let spec = set.spec();
        let status = set.status();
        let count = status.collision_count.unwrap_or(0);
        let decision = revision::choose(
            &existing,
            candidate,
            count,
            status.current_revision.as_deref(),
            |newest| {
                revs.template(newest.name)
                    .is_some_and(|t| revision::semantically_equal(&t, &spec.template))
            },
        );
        // ST-15 with defaults: a newest revision missing only members the set's (defaulted)
        // template has, e.g. one written before the API server defaulted a new field, is
        // compared again once the API server has defaulted it.
        if matches!(decision.update, Update::Create { .. })
            && let Some(newest) = revision::newest(&existing)
            && self.equal_once_defaulted(set, revs, newest.name).await?
        {
            return Ok(revision::choose(
                &existing,
                candidate,
                count,
                status.current_revision.as_deref(),
                |_| true,
            ));
        }
        Ok(decision)
    }

    /// ST-14 (b): the older revision equal to the template gets the next `revision` number,
    /// nothing else. Its name, the update revision.
    async fn roll_back(
        &self,
        key: &str,
        revs: &Revisions,
        name: String,
        revision: i64,
    ) -> Result<String, Error> {
        let obj = revs
            .objects
            .iter()
            .find(|r| r.metadata.name.as_deref() == Some(name.as_str()))
            .expect("chosen among these");
        let after = act::set_revision_number(&self.writer, obj, revision)
            .await
            .map_err(api(format!("rolling back to revision {name}")))?;
        self.written.wrote(
            key,
            &self.c.revisions,
            after.metadata.resource_version.as_deref(),
        );
        Ok(name)
    }

    /// ST-14 (d) (upstream `CreateControllerRevision`): the new revision, renamed with the next
    /// collision count while its name is taken by a different revision; one with the same data
    /// under that name is reused. The update revision's name and the collision count it took.
    async fn create_revision(
        &self,
        key: &str,
        set: &StatefulSet,
        revision: i64,
        collision_count: i32,
    ) -> Result<(String, i32), Error> {
        let spec = set.spec();
        let source = SetSource {
            name: set.name(),
            namespace: set.namespace(),
            uid: set.uid(),
            annotations: set.metadata.annotations.as_ref(),
            template: &spec.template,
        };
        let mut new = revision::new_revision(&source, revision, collision_count);
        let mut count = collision_count;
        let mut attempts = 0;
        loop {
            attempts += 1;
            let body = revision::request_body(&new.object, &new.data);
            match self
                .writer
                .create_raw::<ControllerRevision>(set.namespace(), body)
                .await
            {
                Ok(created) => {
                    self.written.wrote(
                        key,
                        &self.c.revisions,
                        created.metadata.resource_version.as_deref(),
                    );
                    return Ok((created.metadata.name.unwrap_or_default(), count));
                }
                Err(e) if shared::api::apierr::is_already_exists(&e) => {}
                Err(e) => return Err(api("creating a ControllerRevision")(e)),
            }
            // The name is taken: by this very revision (a retry), or by another one.
            let name = new.object.metadata.name.clone().unwrap_or_default();
            let found = self
                .writer
                .get::<ControllerRevision>(set.namespace(), &name)
                .await
                .map_err(api(format!("reading revision {name}")))?;
            match revision::on_already_exists(&revision::go_json(&found.data.0), &new.data, count) {
                OnAlreadyExists::Reuse => return Ok((name, count)),
                OnAlreadyExists::Collision { next_count } => {
                    count = next_count;
                    if attempts >= revision::MAX_CREATE_ATTEMPTS {
                        // The count is persisted so the next sync goes on from it.
                        self.write_collision_count(key, set, count).await?;
                        return Err(Error::Revision(format!(
                            "{attempts} ControllerRevision name collisions for {}",
                            object_key(set)
                        )));
                    }
                    revision::renamed_for_collision(&mut new, set.name(), count);
                }
            }
        }
    }

    async fn write_collision_count(
        &self,
        key: &str,
        set: &StatefulSet,
        count: i32,
    ) -> Result<(), Error> {
        let mut status = set.status();
        status.collision_count = Some(count);
        let after = act::write_status(&self.writer, set, &status)
            .await
            .map_err(api("writing status.collisionCount"))?;
        self.written.wrote(
            key,
            &self.c.sets,
            after.metadata.resource_version.as_deref(),
        );
        Ok(())
    }

    /// SB-7: a Warning once per generation, and the gauge.
    fn warn_zero_grace(&self, set: &StatefulSet) {
        let zero = set
            .spec()
            .template
            .pointer("/spec/terminationGracePeriodSeconds")
            .and_then(Value::as_i64)
            == Some(0);
        let labels = ZeroGraceLabels {
            namespace: set.namespace().into(),
            statefulset: set.name().into(),
        };
        self.metrics
            .zero_grace
            .get_or_create(&labels)
            .set(i64::from(zero));
        if !zero {
            return;
        }
        let seen = (set.uid().to_string(), set.metadata.generation.unwrap_or(0));
        let key = format!("{}/{}", set.namespace(), set.name());
        let mut warned = lock(&self.zero_grace_warned);
        if warned.get(&key) == Some(&seen) {
            return;
        }
        warned.insert(key, seen);
        self.events.warning(
            &shared::meta::refs::object_reference(set),
            "UnsafeZeroGracePeriod",
            "Sync",
            "spec.template.spec.terminationGracePeriodSeconds is 0: a replacement pod may start while the old one still runs on the same volume (kubernetes#120671)".to_string(),
        );
    }

    /// A deleted set leaves no series and no memory behind (upstream keeps its gauges until
    /// the process restarts).
    fn forget_set(&self, key: &str) {
        let Some((namespace, name)) = key.split_once('/') else {
            return;
        };
        for policy in ["OrderedReady", "Parallel"] {
            let labels = SetLabels {
                statefulset_namespace: namespace.into(),
                statefulset_name: name.into(),
                pod_management_policy: policy.into(),
            };
            self.metrics.max_unavailable.remove(&labels);
            self.metrics.unavailable.remove(&labels);
        }
        self.metrics.zero_grace.remove(&ZeroGraceLabels {
            namespace: namespace.into(),
            statefulset: name.into(),
        });
        lock(&self.zero_grace_warned).remove(key);
    }

    fn set_gauges(&self, set: &StatefulSet, max_unavailable: i64, unavailable: i64) {
        let labels = SetLabels {
            statefulset_namespace: set.namespace().into(),
            statefulset_name: set.name().into(),
            pod_management_policy: set
                .spec
                .as_ref()
                .and_then(|s| s.pod_management_policy.clone())
                .unwrap_or_else(|| "OrderedReady".into()),
        };
        // A set recreated under the same name with the other policy (the field is immutable)
        // between two syncs leaves no series of the old one.
        let other = SetLabels {
            pod_management_policy: if labels.pod_management_policy == "Parallel" {
                "OrderedReady".into()
            } else {
                "Parallel".into()
            },
            ..labels.clone()
        };
        self.metrics.max_unavailable.remove(&other);
        self.metrics.unavailable.remove(&other);
        self.metrics
            .max_unavailable
            .get_or_create(&labels)
            .set(max_unavailable);
        self.metrics
            .unavailable
            .get_or_create(&labels)
            .set(unavailable);
    }
}

pub(crate) fn pod_name(p: &Pod) -> &str {
    p.metadata.name.as_deref().unwrap_or_default()
}

pub(crate) fn pod_uid(p: &Pod) -> &str {
    p.metadata.uid.as_deref().unwrap_or_default()
}

/// The claim owners of `ordinal` (ST-34).
pub(crate) fn owners<'a>(
    set: &'a StatefulSet,
    pod_name: &'a str,
    pod_uid: &'a str,
    ordinal: i32,
) -> Owners<'a> {
    // In i64, as the plan's range (ST-6): saturating in i32 would condemn the last ordinal
    // of a set starting at i32::MAX, and its claim would go with its pod.
    let start = i64::from(set.start_ordinal());
    let end = start + i64::from(set.replicas()) - 1;
    Owners {
        set,
        pod_name,
        pod_uid,
        condemned: !(start..=end).contains(&i64::from(ordinal)),
    }
}

/// What the sync reads of one cached pod for the plan.
pub(crate) struct Observed {
    pub ready: bool,
    /// The Ready condition's lastTransitionTime when Ready.
    pub ready_since: Option<k8s_openapi::jiff::Timestamp>,
    pub phase: Option<String>,
    pub terminating: bool,
    pub revision: String,
    /// ST-10.
    pub identity_ok: bool,
    /// ST-34.
    pub claim_refs_ok: bool,
    /// SB-6.
    pub unready_since: Option<k8s_openapi::jiff::Timestamp>,
}

impl StatefulSetController {
    pub(crate) fn observe_pod(&self, set: &StatefulSet, pod: &Pod) -> Observed {
        let ready_cond = pod
            .status
            .as_ref()
            .and_then(|s| s.conditions.as_ref())
            .and_then(|cs| cs.iter().find(|c| c.type_ == "Ready"));
        let ready = ready_cond.is_some_and(|c| c.status == "True");
        let (name, uid) = (pod_name(pod), pod_uid(pod));
        let ordinal = identity::ordinal(name);
        let o = owners(set, name, uid, ordinal);
        let claims: Vec<_> = set
            .claim_template_names()
            .into_iter()
            .filter_map(|t| {
                self.c.claims.get(&format!(
                    "{}/{}",
                    set.namespace(),
                    identity::claim_name(t, set.name(), ordinal)
                ))
            })
            .collect();
        Observed {
            ready,
            ready_since: ready_cond
                .filter(|_| ready)
                .and_then(|c| c.last_transition_time.as_ref())
                .map(|t| t.0),
            phase: pod.status.as_ref().and_then(|s| s.phase.clone()),
            terminating: pod.metadata.deletion_timestamp.is_some(),
            revision: identity::label(pod, identity::REVISION_LABEL)
                .unwrap_or_default()
                .to_string(),
            identity_ok: identity::identity_matches(set, pod)
                && identity::storage_matches(set, pod),
            claim_refs_ok: claims
                .iter()
                .all(|c| identity::claim_refs_up_to_date(c, &o)),
            unready_since: if ready {
                None
            } else {
                ready_cond
                    .and_then(|c| c.last_transition_time.as_ref())
                    .or(pod.metadata.creation_timestamp.as_ref())
                    .map(|t| t.0)
            },
        }
    }
}

impl StatefulSetController {
    /// ST-36 for a slot without a pod: a claim of that ordinal still owned by an earlier pod.
    fn slot_claim_stale(&self, set: &StatefulSet, ordinal: i32) -> bool {
        let name = identity::pod_name(set.name(), ordinal);
        let o = owners(set, &name, "", ordinal);
        set.claim_template_names().into_iter().any(|t| {
            self.c
                .claims
                .get(&format!(
                    "{}/{}",
                    set.namespace(),
                    identity::claim_name(t, set.name(), ordinal)
                ))
                .is_some_and(|c| identity::claim_is_stale(&c, &o))
        })
    }

    /// ST-17: non-live revisions beyond the history limit are deleted, oldest first.
    async fn truncate_history(
        &self,
        set: &StatefulSet,
        pods: &[Arc<Pod>],
        revs: &Revs,
    ) -> Result<(), Error> {
        let all = self.cached_revisions(set);
        let existing = all.existing();
        let doomed = revision::history_to_delete(
            &existing,
            Some(revs.current.as_str()),
            Some(revs.update.as_str()),
            pods.iter()
                .filter_map(|p| identity::label(p, identity::REVISION_LABEL)),
            set.spec.as_ref().and_then(|s| s.revision_history_limit),
        );
        for name in doomed {
            match act::delete_revision(&self.writer, set.namespace(), &name).await {
                Ok(()) => {}
                Err(e) if shared::api::apierr::is_not_found(&e) => {}
                Err(e) => return Err(api(format!("deleting revision {name}"))(e)),
            }
        }
        Ok(())
    }
}

impl StatefulSetController {
    /// Upstream `UpdateStatefulSet`: revisions, the plan and its writes, status, history.
    async fn update_set(
        &self,
        key: &str,
        set: &StatefulSet,
        pods: Vec<Arc<Pod>>,
    ) -> Result<Next, Error> {
        self.warn_zero_grace(set);
        let revs = self.revisions(key, set).await?;
        // ST-R with the gate off, as upstream: a Warning, an error (retried with backoff), and
        // nothing done, not even the status.
        let spec = set.spec();
        let strategy = spec.update_strategy.as_ref();
        if strategy.and_then(|u| u.type_.as_deref()) == Some("Recreate") && !self.recreate_gate {
            let message = format!(
                "statefulset {} uses Recreate strategy but feature gate StatefulSetRecreateStrategy is disabled",
                object_key(set)
            );
            self.events.warning(
                &shared::meta::refs::object_reference(set),
                "UnknownStrategy",
                "Sync",
                message.clone(),
            );
            return Err(Error::UnknownStrategy(message));
        }
        let now = self.clock.now();
        let views: Vec<plan::PodView> = pods.iter().map(|p| self.pod_view(set, p)).collect();
        let set_view = self.set_view(set, &revs);
        let planned = plan::plan(&set_view, &views, now);
        self.set_gauges(
            set,
            i64::from(planned.max_unavailable),
            i64::from(planned.unavailable),
        );
        let acted = self.execute(key, set, &revs, &planned).await;
        // ST-41/42: the status from the pods as cached (new pods count once the watch shows
        // them), written also when the actions failed.
        let status = status::compute(
            &status::Inputs {
                set: &set_view,
                generation: set.metadata.generation,
                old: &set.status(),
                collision_count: revs.collision_count,
                now,
                progressing: planned.progressing,
            },
            &views,
        );
        let written = if status::needs_write(&set.status(), &status) {
            match act::write_status(&self.writer, set, &status).await {
                Ok(after) => {
                    self.written.wrote(
                        key,
                        &self.c.sets,
                        after.metadata.resource_version.as_deref(),
                    );
                    Ok(())
                }
                Err(e) => Err(api("updating the status")(e)),
            }
        } else {
            Ok(())
        };
        // ST-17: history is cut after every sync, a failed one too (upstream aggregates the
        // three errors).
        let cut = self.truncate_history(set, &pods, &revs).await;
        acted?;
        written?;
        cut?;
        Ok(match planned.requeue_after {
            Some(d) => Next::After(d),
            None => Next::Done,
        })
    }
}

impl StatefulSetController {
    fn set_view(&self, set: &StatefulSet, revs: &Revs) -> SetView {
        let spec = set.spec();
        let strategy = match spec.update_strategy.as_ref() {
            Some(u) if u.type_.as_deref() == Some("OnDelete") => Strategy::OnDelete,
            // `Recreate` is served where the API server has StatefulSetRecreateStrategy on;
            // with the gate off here, `update_set` stopped before this (ST-R).
            Some(u) if u.type_.as_deref() == Some("Recreate") => Strategy::Recreate,
            // The API server accepts no other type; should one come, nothing is updated
            // automatically (OnDelete's rules), said in the log.
            Some(u) if u.type_.as_deref().is_some_and(|t| t != "RollingUpdate") => {
                tracing::warn!(
                    statefulset = %shared::meta::keys::object_key(set),
                    update_strategy = u.type_.as_deref().unwrap_or_default(),
                    "unknown updateStrategy.type: pods are not updated automatically"
                );
                Strategy::OnDelete
            }
            Some(u) => match &u.rolling_update {
                Some(r) => Strategy::RollingUpdate {
                    partition: r.partition.unwrap_or(0),
                    max_unavailable: r.max_unavailable.clone(),
                },
                None => Strategy::RollingUpdateBare,
            },
            None => Strategy::RollingUpdateBare,
        };
        let start = set.start_ordinal();
        // Only slots the plan may create are looked at (see plan::MAX_MISSING).
        let looked_at = i32::try_from(plan::MAX_MISSING)
            .unwrap_or(i32::MAX)
            .saturating_add(i32::try_from(self.c.pods.len()).unwrap_or(i32::MAX));
        let stale_claims = (0..set.replicas().clamp(0, looked_at))
            .filter_map(|i| start.checked_add(i))
            .filter(|ord| {
                !set.claim_template_names().is_empty() && self.slot_claim_stale(set, *ord)
            })
            .collect();
        SetView {
            replicas: set.replicas(),
            start,
            management: if spec.pod_management_policy.as_deref() == Some("Parallel") {
                Management::Parallel
            } else {
                Management::OrderedReady
            },
            strategy,
            min_ready_seconds: spec.min_ready_seconds.unwrap_or(0),
            deleting: set.metadata.deletion_timestamp.is_some(),
            current_revision: revs.current.clone(),
            update_revision: revs.update.clone(),
            status_current_replicas: set.status().current_replicas.unwrap_or(0),
            stale_claims,
            replace_unavailable_after: self.replace_unavailable_after(set),
        }
    }

    /// SB-6: the opt-in annotation; an invalid value is a Warning naming it, and off.
    fn replace_unavailable_after(&self, set: &StatefulSet) -> Option<Duration> {
        let raw = set
            .metadata
            .annotations
            .as_ref()?
            .get(plan::REPLACE_UNAVAILABLE_AFTER)?;
        match shared::meta::gocompat::parse_duration(raw) {
            Ok(ns) if ns > 0 => Some(Duration::from_nanos(ns.unsigned_abs())),
            Ok(_) | Err(_) => {
                self.events.warning(
                    &shared::meta::refs::object_reference(set),
                    "InvalidAnnotation",
                    "Sync",
                    format!(
                        "metadata.annotations[{}]: {raw:?} is not a positive duration (e.g. \"10m\"); old pods are not replaced",
                        plan::REPLACE_UNAVAILABLE_AFTER
                    ),
                );
                None
            }
        }
    }

    fn pod_view(&self, set: &StatefulSet, pod: &Pod) -> PodView {
        let o = self.observe_pod(set, pod);
        PodView {
            name: pod_name(pod).to_string(),
            ordinal: identity::ordinal(pod_name(pod)),
            revision: o.revision,
            phase: o.phase,
            ready: o.ready,
            ready_since: o.ready_since,
            terminating: o.terminating,
            identity_ok: o.identity_ok,
            claim_refs_ok: o.claim_refs_ok,
            unready_since: o.unready_since,
        }
    }

    /// Performs the plan's phases in order; an error stops the phases after it. Concurrent
    /// phases run in slow-start batches of 1, 2, 4, ... up to 500 (ST-21).
    async fn execute(
        &self,
        key: &str,
        set: &StatefulSet,
        revs: &Revs,
        planned: &plan::Plan,
    ) -> Result<(), Error> {
        if let Some(e) = &planned.invalid {
            self.events.warning(
                &shared::meta::refs::object_reference(set),
                "InvalidMaxUnavailable",
                "Update",
                e.clone(),
            );
        }
        if let Some(e) = &planned.beyond_ordinals {
            // Every sync sees it; the event's correlation counts the repeats, the log need not.
            tracing::debug!(set = key, "{e}");
            self.events.warning(
                &shared::meta::refs::object_reference(set),
                "OrdinalsOutOfRange",
                "Create",
                e.clone(),
            );
        }
        for phase in &planned.phases {
            if phase.concurrent {
                let mut rest = phase.actions.as_slice();
                let mut batch = 1usize;
                while !rest.is_empty() {
                    let n = batch.min(rest.len());
                    let (now, later) = rest.split_at(n);
                    let results = futures::future::join_all(
                        now.iter().map(|a| self.perform(key, set, revs, a)),
                    )
                    .await;
                    let mut errors = results.into_iter().filter_map(Result::err);
                    if let Some(first) = errors.next() {
                        let more = errors.count();
                        return Err(if more == 0 {
                            first
                        } else {
                            Error::Many {
                                first: Box::new(first),
                                more,
                            }
                        });
                    }
                    rest = later;
                    batch = (batch * 2).min(MAX_BATCH);
                }
            } else {
                for a in &phase.actions {
                    self.perform(key, set, revs, a).await?;
                }
            }
        }
        Ok(())
    }

    /// One action of the plan, through pod control.
    async fn perform(
        &self,
        key: &str,
        set: &StatefulSet,
        revs: &Revs,
        action: &Action,
    ) -> Result<(), Error> {
        match action {
            Action::CreatePod { ordinal, which } => {
                let (template, revision) = match which {
                    Which::Current => (&revs.current_template, revs.current.as_str()),
                    Which::Update => (&revs.update_template, revs.update.as_str()),
                };
                self.create_pod(key, set, *ordinal, template, revision)
                    .await
            }
            Action::CreateMissingClaims { ordinal } => {
                self.create_missing_claims(key, set, *ordinal).await
            }
            Action::Repair { name } => self.update_pod(key, set, name).await,
            Action::FixClaimRefs { name } => self.fix_pod_claim_refs(key, set, name).await,
            Action::DeletePod { name, .. } => self.delete_pod(key, set, name).await,
        }
    }
}

/// Upstream's `MaxBatchSize` for Parallel's slow-start batches.
const MAX_BATCH: usize = 500;
