//! A guard against running a controller twice: while this replica leads, a write by
//! kube-controller-manager to what one of our running controllers owns (seen in the objects'
//! `managedFields`, before the caches drop them) means kcm still runs that controller. It is said
//! loudly instead of fought silently: an error log, a Warning event on the object
//! ([`REASON`]), `pilothouse_conflicting_writes_total`, and `/readyz` failing with the
//! controller, object and time for 10 minutes after the last one.

use crate::cache::informers::{MetaObserver, Part};
use crate::meta::clock::unix_now;
use crate::runtime::events::EventRecorder;
use k8s_openapi::api::core::v1::ObjectReference;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use std::collections::HashMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicI64, Ordering};

/// kube-controller-manager's field manager (client-go names it after the binary).
pub const KCM_MANAGER: &str = "kube-controller-manager";
/// The reason of the Warning event on the object kube-controller-manager wrote.
pub const REASON: &str = "ConflictingWrite";
/// How long `/readyz` reports a conflict after the last write seen.
pub const REPORT_SECONDS: i64 = 600;
/// How often the per-object record is pruned of writes older than [`REPORT_SECONDS`].
const PRUNE_SECONDS: i64 = 60;
/// managedFields times have one-second resolution: a kcm write in the second we took over is
/// kcm finishing, not kcm running.
const GRACE_SECONDS: i64 = 2;
/// How far ahead of this replica's clock a managedFields time may be (clock skew between API
/// servers and us); a later one is not a write that happened.
const FUTURE_SKEW_SECONDS: i64 = 60;

/// What one of our controllers owns, as kcm's counterpart writes it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Owned {
    pub controller: &'static str,
    pub resource: &'static str,
    /// `""` for the object itself.
    pub subresource: &'static str,
    /// A field the entry must own (its `fieldsV1` mentions it): tells kcm's controllers apart
    /// when several write the same subresource.
    pub field: Option<&'static str>,
    /// A label the object must carry (`managed-by` on EndpointSlices).
    pub label: Option<(&'static str, &'static str)>,
}

/// What kcm's counterpart of `controller` writes and no other kcm controller does. The
/// taint-eviction controller has no such mark (kcm's pod GC and node lifecycle write the same pod
/// conditions), so it is not guarded.
pub fn owned_by(controller: &'static str) -> Vec<Owned> {
    let own = |resource, subresource, field, label| Owned {
        controller,
        resource,
        subresource,
        field,
        label,
    };
    match controller {
        "job-controller" => vec![own("jobs", "status", None, None)],
        "cronjob-controller" => vec![own("cronjobs", "status", None, None)],
        "statefulset-controller" => vec![own("statefulsets", "status", None, None)],
        "endpointslice-controller" => vec![own(
            "endpointslices",
            "",
            None,
            Some((
                "endpointslice.kubernetes.io/managed-by",
                "endpointslice-controller.k8s.io",
            )),
        )],
        "endpointslice-mirroring-controller" => vec![own(
            "endpointslices",
            "",
            None,
            Some((
                "endpointslice.kubernetes.io/managed-by",
                "endpointslicemirroring-controller.k8s.io",
            )),
        )],
        // The node conditions it sets to Unknown (attach-detach writes other status fields).
        "node-lifecycle-controller" => {
            vec![own("nodes", "status", Some("f:conditions"), None)]
        }
        _ => Vec::new(),
    }
}

/// `resource` or `resource/subresource`, as the counter and the messages name it.
fn subject_of(o: &Owned) -> String {
    if o.subresource.is_empty() {
        o.resource.to_string()
    } else {
        format!("{}/{}", o.resource, o.subresource)
    }
}

/// The apiVersion and kind of a guarded resource.
fn kind_of(resource: &str) -> Option<(&'static str, &'static str)> {
    Some(match resource {
        "jobs" => ("batch/v1", "Job"),
        "cronjobs" => ("batch/v1", "CronJob"),
        "statefulsets" => ("apps/v1", "StatefulSet"),
        "endpointslices" => ("discovery.k8s.io/v1", "EndpointSlice"),
        "nodes" => ("v1", "Node"),
        _ => return None,
    })
}

/// One conflicting write.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Conflict {
    pub controller: &'static str,
    pub resource: String,
    pub key: String,
    pub manager: String,
    /// The write's time (Unix seconds, from managedFields).
    pub at: i64,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ConflictLabels {
    pub controller: String,
    pub manager: String,
    pub resource: String,
}

#[derive(Default)]
struct Counted {
    seen: HashMap<(&'static str, String), Seen>,
    pruned_at: i64,
}

impl Counted {
    /// Forgets, once a minute, the objects with neither a write nor a report in the last ten
    /// minutes (keeping the reported ones keeps "once per ten minutes" true).
    fn prune(&mut self, now: i64) {
        if now.saturating_sub(self.pruned_at) < PRUNE_SECONDS {
            return;
        }
        let horizon = now.saturating_sub(REPORT_SECONDS);
        self.seen
            .retain(|_, s| s.at >= horizon || s.reported > horizon);
        self.pruned_at = now;
    }
}

#[derive(Clone, Copy)]
struct Seen {
    /// The newest write counted (Unix seconds, from managedFields).
    at: i64,
    /// When the last error log and Warning event for it were made (Unix seconds, our clock).
    reported: i64,
}

#[derive(Default)]
pub struct Conflicts {
    owned: Mutex<Vec<Owned>>,
    /// Each guarded controller's event recorder (its source and budget).
    recorders: Mutex<HashMap<&'static str, EventRecorder>>,
    /// Unix seconds since which our controllers run (0: not leading, nothing is a conflict).
    armed_since: AtomicI64,
    /// Per (controller, object): the newest conflicting write counted, so each is counted once,
    /// and when one was last reported. Pruned each minute of objects with neither in the last
    /// [`REPORT_SECONDS`], so it holds only what kcm wrote lately.
    counted: Mutex<Counted>,
    latest: Mutex<Option<Conflict>>,
    pub counter: Family<ConflictLabels, Counter>,
}

impl Conflicts {
    /// Guards what `controller` owns (when it is enabled), reporting through `events`.
    pub fn guard(&self, controller: &'static str, events: Option<EventRecorder>) {
        // Each guarded series exists at 0 from the start, so a scrape shows it before any
        // conflict and an alert's increase() sees the first one.
        for o in owned_by(controller) {
            let _zero = self.counter.get_or_create(&ConflictLabels {
                controller: controller.to_string(),
                manager: KCM_MANAGER.to_string(),
                resource: subject_of(&o),
            });
        }
        crate::lock(&self.owned).extend(owned_by(controller));
        if let Some(events) = events {
            crate::lock(&self.recorders).insert(controller, events);
        }
    }

    /// Our controllers run from `now` (Unix seconds) on; `None` when they stop.
    pub fn arm(&self, now: Option<i64>) {
        self.armed_since.store(now.unwrap_or(0), Ordering::Release);
    }

    /// Looks at an object of `resource` as the watch delivered it, managedFields included;
    /// `changed` says whether this event changed a part of it since the cached copy.
    pub fn observe(&self, resource: &str, meta: &ObjectMeta, changed: &dyn Fn(Part) -> bool) {
        self.observe_at(resource, meta, changed, unix_now());
    }

    /// [`Self::observe`] at `now` (Unix seconds). Writes older than [`REPORT_SECONDS`] are not
    /// counted: a relist delivers them again long after they were seen, and the record of what
    /// was counted keeps only the last ten minutes.
    ///
    /// managedFields are whatever a writer sent: anyone who may update a Job can send an entry
    /// naming kube-controller-manager and the status subresource. What only a real write to the
    /// subresource does is change that part of the object, which a write to the object itself
    /// cannot (the API server keeps the old status). So a kcm entry counts only in the event
    /// that brings it (newer than any seen for the object) together with a change of the part it
    /// claims; one that comes without is remembered as seen, logged at debug, and never counted.
    fn observe_at(
        &self,
        resource: &str,
        meta: &ObjectMeta,
        changed: &dyn Fn(Part) -> bool,
        now: i64,
    ) {
        let armed = self.armed_since.load(Ordering::Acquire);
        // Pruned on every object seen, not only on a conflict, so the record empties once kcm
        // stops writing.
        if armed > 0 {
            crate::lock(&self.counted).prune(now);
        }
        let Some(entries) = meta.managed_fields.as_ref().filter(|_| armed > 0) else {
            return;
        };
        let owned: Vec<Owned> = crate::lock(&self.owned)
            .iter()
            .filter(|o| o.resource == resource)
            .copied()
            .collect();
        for o in owned {
            if let Some((k, v)) = o.label {
                let labels = meta.labels.as_ref();
                if labels.and_then(|l| l.get(k)).map(String::as_str) != Some(v) {
                    continue;
                }
            }
            for e in entries {
                let Some(at) = e.time.as_ref().map(|t| t.0.as_second()) else {
                    continue;
                };
                // A time in the future is no write yet made: a forged entry dated ahead would
                // otherwise wait for our own next write to the part and count then.
                if e.manager.as_deref() != Some(KCM_MANAGER)
                    || e.subresource.as_deref().unwrap_or("") != o.subresource
                    || at < armed.saturating_add(GRACE_SECONDS)
                    || at < now.saturating_sub(REPORT_SECONDS)
                    || at > now.saturating_add(FUTURE_SKEW_SECONDS)
                {
                    continue;
                }
                if let Some(field) = o.field {
                    let mentions = e
                        .fields_v1
                        .as_ref()
                        .is_some_and(|f| f.0.to_string().contains(field));
                    if !mentions {
                        continue;
                    }
                }
                let part = if o.subresource == "status" {
                    Part::Status
                } else {
                    Part::Content
                };
                self.record(o, meta, at, now, || changed(part));
            }
        }
    }

    /// Counts one conflicting write; the error log and the Warning event come at most once per
    /// object every [`REPORT_SECONDS`], so kcm writing an object in a loop cannot flood either.
    /// The write counts only if `corroborated` (asked once the write is known to be new).
    fn record(
        &self,
        o: Owned,
        meta: &ObjectMeta,
        at: i64,
        now: i64,
        corroborated: impl FnOnce() -> bool,
    ) {
        let key = match (&meta.namespace, &meta.name) {
            (Some(ns), Some(n)) => format!("{ns}/{n}"),
            (None, Some(n)) => n.clone(),
            _ => return,
        };
        let report = {
            let mut counted = crate::lock(&self.counted);
            counted.prune(now);
            let seen = counted
                .seen
                .entry((o.controller, key.clone()))
                .or_insert(Seen {
                    at: i64::MIN,
                    reported: i64::MIN,
                });
            if seen.at >= at {
                return;
            }
            // Seen either way: a claim that came without its change must not count later, when
            // another writer's change to the same part arrives with the claim still in place.
            seen.at = at;
            if !corroborated() {
                tracing::debug!(
                    controller = o.controller,
                    object = %key,
                    written_at = at,
                    "a managedFields entry names {KCM_MANAGER} but the write changed nothing it claims: another client wrote the entry; not counted"
                );
                return;
            }
            let report = now.saturating_sub(seen.reported) >= REPORT_SECONDS;
            if report {
                seen.reported = now;
            }
            report
        };
        let subject = subject_of(&o);
        if report {
            tracing::error!(
                controller = o.controller,
                object = %key,
                resource = %subject,
                manager = KCM_MANAGER,
                written_at = at,
                "kube-controller-manager is still running this controller: it wrote an object this replica's controller owns; turn it off in kube-controller-manager (--controllers=...,-{})",
                o.controller
            );
            let recorder = crate::lock(&self.recorders).get(o.controller).cloned();
            if let (Some(events), Some((api_version, kind))) = (recorder, kind_of(o.resource)) {
                let regarding = ObjectReference {
                    api_version: Some(api_version.to_string()),
                    kind: Some(kind.to_string()),
                    namespace: meta.namespace.clone(),
                    name: meta.name.clone(),
                    uid: meta.uid.clone(),
                    resource_version: meta.resource_version.clone(),
                    ..Default::default()
                };
                events.warning(
                    &regarding,
                    REASON,
                    "Conflict",
                    format!(
                        "{KCM_MANAGER} wrote {subject} while {} runs in Pilothouse: it still runs that controller; turn it off there (--controllers=...,-{})",
                        o.controller, o.controller
                    ),
                );
            }
        }
        self.counter
            .get_or_create(&ConflictLabels {
                controller: o.controller.to_string(),
                manager: KCM_MANAGER.to_string(),
                resource: subject.clone(),
            })
            .inc();
        // The newest write is what `/readyz` reports (a relist may deliver an older one later).
        let mut latest = crate::lock(&self.latest);
        if latest.as_ref().is_none_or(|l| l.at <= at) {
            *latest = Some(Conflict {
                controller: o.controller,
                resource: subject,
                key,
                manager: KCM_MANAGER.to_string(),
                at,
            });
        }
    }

    /// The last conflict, if it is at most [`REPORT_SECONDS`] old at `now` (Unix seconds).
    pub fn recent(&self, now: i64) -> Option<Conflict> {
        crate::lock(&self.latest)
            .clone()
            .filter(|c| now.saturating_sub(c.at) <= REPORT_SECONDS)
    }
}

/// The caches show the guard every object as it arrives, managedFields included.
impl MetaObserver for Conflicts {
    fn observe(&self, resource: &str, meta: &ObjectMeta, changed: &dyn Fn(Part) -> bool) {
        Conflicts::observe(self, resource, meta, changed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{FieldsV1, ManagedFieldsEntry, Time};
    use k8s_openapi::jiff::Timestamp;

    /// The tests' clock (Unix seconds): their writes are within the last ten minutes of it.
    const NOW: i64 = 2_000;

    /// An event that changed what its entries claim (a real write to that part).
    fn changed(c: &Conflicts, resource: &str, m: &ObjectMeta, now: i64) {
        c.observe_at(resource, m, &|_| true, now);
    }

    fn entry(manager: &str, sub: &str, at: i64, fields: serde_json::Value) -> ManagedFieldsEntry {
        ManagedFieldsEntry {
            manager: Some(manager.into()),
            operation: Some("Update".into()),
            subresource: (!sub.is_empty()).then(|| sub.to_string()),
            time: Some(Time(Timestamp::from_second(at).unwrap())),
            fields_v1: Some(FieldsV1(fields)),
            ..Default::default()
        }
    }

    fn meta(entries: Vec<ManagedFieldsEntry>, labels: &[(&str, &str)]) -> ObjectMeta {
        ObjectMeta {
            namespace: Some("ns".into()),
            name: Some("x".into()),
            managed_fields: Some(entries),
            labels: Some(
                labels
                    .iter()
                    .map(|(k, v)| (k.to_string(), v.to_string()))
                    .collect(),
            ),
            ..Default::default()
        }
    }

    /// A guarded controller's series is there at 0 before any conflict.
    #[test]
    fn guarded_series_exist_at_zero() {
        let c = Conflicts::default();
        c.guard("job-controller", None);
        let n = c
            .counter
            .get_or_create(&ConflictLabels {
                controller: "job-controller".into(),
                manager: KCM_MANAGER.into(),
                resource: "jobs/status".into(),
            })
            .get();
        assert_eq!(n, 0);
        let mut text = String::new();
        let mut reg = prometheus_client::registry::Registry::default();
        reg.register("pilothouse_conflicting_writes", "h", c.counter.clone());
        prometheus_client::encoding::text::encode(&mut text, &reg).unwrap();
        assert!(
            text.contains("pilothouse_conflicting_writes_total{controller=\"job-controller\",manager=\"kube-controller-manager\",resource=\"jobs/status\"} 0"),
            "{text}"
        );
    }

    #[test]
    fn only_kcm_writes_after_taking_over_count() {
        let c = Conflicts::default();
        c.guard("job-controller", None);
        let status = serde_json::json!({"f:status": {"f:active": {}}});
        // Not leading: nothing counts.
        changed(
            &c,
            "jobs",
            &meta(
                vec![entry(KCM_MANAGER, "status", 2_000, status.clone())],
                &[],
            ),
            NOW,
        );
        assert_eq!(c.recent(2_000), None);
        c.arm(Some(1_000));
        // Before the take-over (plus the grace), another manager, another subresource: no.
        changed(
            &c,
            "jobs",
            &meta(
                vec![entry(KCM_MANAGER, "status", 1_001, status.clone())],
                &[],
            ),
            NOW,
        );
        changed(
            &c,
            "jobs",
            &meta(
                vec![entry("pilothouse", "status", 2_000, status.clone())],
                &[],
            ),
            NOW,
        );
        changed(
            &c,
            "jobs",
            &meta(vec![entry(KCM_MANAGER, "", 2_000, status.clone())], &[]),
            NOW,
        );
        changed(
            &c,
            "pods",
            &meta(
                vec![entry(KCM_MANAGER, "status", 2_000, status.clone())],
                &[],
            ),
            NOW,
        );
        assert_eq!(c.recent(2_000), None);
        // kcm's job controller writing a Job's status while we run it: counted once.
        let m = meta(vec![entry(KCM_MANAGER, "status", 1_500, status)], &[]);
        changed(&c, "jobs", &m, NOW);
        changed(&c, "jobs", &m, NOW);
        let got = c.recent(1_600).expect("conflict");
        assert_eq!(
            (got.controller, got.key.as_str(), got.resource.as_str()),
            ("job-controller", "ns/x", "jobs/status")
        );
        let labels = ConflictLabels {
            controller: "job-controller".into(),
            manager: KCM_MANAGER.into(),
            resource: "jobs/status".into(),
        };
        assert_eq!(c.counter.get_or_create(&labels).get(), 1);
        // Reported for ten minutes after the write.
        assert!(c.recent(1_500 + REPORT_SECONDS).is_some());
        assert!(c.recent(1_501 + REPORT_SECONDS).is_none());
        // Disarmed: nothing more.
        c.arm(None);
        changed(
            &c,
            "jobs",
            &meta(
                vec![entry(KCM_MANAGER, "status", 1_900, serde_json::json!({}))],
                &[],
            ),
            NOW,
        );
        assert_eq!(c.counter.get_or_create(&labels).get(), 1);
    }

    /// A tenant's update of the Job itself carrying a kcm status entry changes no
    /// status, so it is not counted, neither then nor when our own status write arrives with the
    /// forged entry still there; kcm's next real status write (a newer entry that comes with a
    /// status change) is.
    #[test]
    fn a_forged_entry_without_its_change_never_counts() {
        let c = Conflicts::default();
        c.guard("job-controller", None);
        c.arm(Some(1_000));
        let status = serde_json::json!({"f:status": {"f:active": {}}});
        let forged = meta(
            vec![entry(KCM_MANAGER, "status", 1_500, status.clone())],
            &[],
        );
        let asked = std::cell::RefCell::new(Vec::new());
        c.observe_at(
            "jobs",
            &forged,
            &|p| {
                asked.borrow_mut().push(p);
                false
            },
            NOW,
        );
        assert_eq!(
            *asked.borrow(),
            vec![Part::Status],
            "asked about the status"
        );
        assert_eq!(c.recent(NOW), None, "a forged entry counted");
        // Our controller writes the status next: the status changed, the entry did not.
        changed(&c, "jobs", &forged, NOW);
        assert_eq!(c.recent(NOW), None, "a forged entry counted later");
        // Dated ahead of the clock: not counted, even with a change.
        let ahead = meta(
            vec![entry(KCM_MANAGER, "status", NOW + 3_600, status.clone())],
            &[],
        );
        changed(&c, "jobs", &ahead, NOW);
        assert_eq!(c.recent(NOW), None, "a future-dated entry counted");
        // kcm's real write: a newer entry that comes with its change.
        let real = meta(vec![entry(KCM_MANAGER, "status", 1_600, status)], &[]);
        changed(&c, "jobs", &real, NOW);
        assert_eq!(c.recent(NOW).map(|c| c.at), Some(1_600));
    }

    /// EndpointSlices have no status: a claim on the object itself needs a change outside
    /// metadata.
    #[test]
    fn a_slice_claim_asks_about_the_content() {
        let c = Conflicts::default();
        c.guard("endpointslice-controller", None);
        c.arm(Some(1_000));
        let m = meta(
            vec![entry(
                KCM_MANAGER,
                "",
                1_500,
                serde_json::json!({"f:endpoints": {}}),
            )],
            &[(
                "endpointslice.kubernetes.io/managed-by",
                "endpointslice-controller.k8s.io",
            )],
        );
        let asked = std::cell::RefCell::new(Vec::new());
        c.observe_at(
            "endpointslices",
            &m,
            &|p| {
                asked.borrow_mut().push(p);
                false
            },
            NOW,
        );
        assert_eq!(*asked.borrow(), vec![Part::Content]);
        assert_eq!(c.recent(NOW), None);
    }

    #[tokio::test]
    async fn a_conflict_is_a_warning_event_on_the_object() {
        let kit = crate::testkit::Kit::new();
        let c = Conflicts::default();
        let events = kit.setup("job-controller", "job-controller").events;
        c.guard("job-controller", Some(events));
        c.arm(Some(1_000));
        let mut m = meta(
            vec![entry(
                KCM_MANAGER,
                "status",
                1_500,
                serde_json::json!({"f:status": {}}),
            )],
            &[],
        );
        m.uid = Some("uid-1".into());
        changed(&c, "jobs", &m, NOW);
        // Events are written in the background.
        let mut written = Vec::new();
        for _ in 0..200 {
            written = kit
                .api
                .calls()
                .into_iter()
                .filter_map(|call| match call {
                    crate::api::writer::Call::Create(t, v) if t.plural == "events" => Some(v),
                    _ => None,
                })
                .collect();
            if !written.is_empty() {
                break;
            }
            tokio::time::sleep(std::time::Duration::from_millis(5)).await;
        }
        assert_eq!(written.len(), 1, "{written:?}");
        let e = &written[0];
        assert_eq!(
            (&e["type"], &e["reason"]),
            (&"Warning".into(), &REASON.into())
        );
        assert_eq!(
            (
                &e["involvedObject"]["kind"],
                &e["involvedObject"]["name"],
                &e["involvedObject"]["uid"]
            ),
            (&"Job".into(), &"x".into(), &"uid-1".into())
        );
        let message = e["message"].as_str().unwrap_or_default();
        assert!(
            message.contains("jobs/status") && message.contains("-job-controller"),
            "{message}"
        );
    }

    /// kcm writing one object in a loop: every write is counted, the log and the Warning event
    /// come once per object every ten minutes, writes older than that are not counted, and the
    /// record forgets objects with no write in the last ten minutes.
    #[tokio::test]
    async fn a_looping_write_is_counted_each_time_and_reported_once_per_ten_minutes() {
        let kit = crate::testkit::Kit::new();
        let c = Conflicts::default();
        let events = kit.setup("job-controller", "job-controller").events;
        c.guard("job-controller", Some(events));
        c.arm(Some(1_000));
        let status = serde_json::json!({"f:status": {}});
        let write = |at: i64| meta(vec![entry(KCM_MANAGER, "status", at, status.clone())], &[]);
        for at in [1_500, 1_510, 1_520, 1_530] {
            changed(&c, "jobs", &write(at), at);
        }
        // Ten minutes after the first report, the next write is reported again.
        changed(&c, "jobs", &write(2_100), 2_100);
        // Written more than ten minutes ago (a relist delivering it late): not counted.
        let mut other = write(1_400);
        other.name = Some("y".into());
        changed(&c, "jobs", &other, 2_100);
        let labels = ConflictLabels {
            controller: "job-controller".into(),
            manager: KCM_MANAGER.into(),
            resource: "jobs/status".into(),
        };
        assert_eq!(c.counter.get_or_create(&labels).get(), 5);
        let event_writes = || {
            kit.api
                .calls()
                .into_iter()
                .filter(|call| match call {
                    crate::api::writer::Call::Create(t, _)
                    | crate::api::writer::Call::Patch(t, _, _) => t.plural == "events",
                    _ => false,
                })
                .count()
        };
        // Events are written in the background: wait for two, then make sure no third comes.
        for _ in 0..200 {
            if event_writes() >= 2 {
                break;
            }
            tokio::time::sleep(std::time::Duration::from_millis(5)).await;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        assert_eq!(event_writes(), 2);
        // "y" was never recorded; "x" is forgotten once its last write is ten minutes old.
        assert_eq!(crate::lock(&c.counted).seen.len(), 1);
        let mut third = write(2_800);
        third.name = Some("z".into());
        changed(&c, "jobs", &third, 2_800);
        let seen = crate::lock(&c.counted);
        assert_eq!(
            seen.seen
                .keys()
                .map(|(_, k)| k.as_str())
                .collect::<Vec<_>>(),
            ["ns/z"]
        );
    }

    #[test]
    fn fields_and_labels_tell_kcm_controllers_apart() {
        let c = Conflicts::default();
        c.guard("node-lifecycle-controller", None);
        c.guard("endpointslice-controller", None);
        c.arm(Some(1_000));
        // attach-detach writes volumesAttached in nodes/status: not node lifecycle.
        changed(
            &c,
            "nodes",
            &meta(
                vec![entry(
                    KCM_MANAGER,
                    "status",
                    1_500,
                    serde_json::json!({"f:status": {"f:volumesAttached": {}}}),
                )],
                &[],
            ),
            NOW,
        );
        // The mirroring controller's slices are not the EndpointSlice controller's.
        let mirrored = [(
            "endpointslice.kubernetes.io/managed-by",
            "endpointslicemirroring-controller.k8s.io",
        )];
        changed(
            &c,
            "endpointslices",
            &meta(
                vec![entry(KCM_MANAGER, "", 1_500, serde_json::json!({}))],
                &mirrored,
            ),
            NOW,
        );
        assert_eq!(c.recent(1_500), None);
        changed(
            &c,
            "nodes",
            &meta(
                vec![entry(
                    KCM_MANAGER,
                    "status",
                    1_500,
                    serde_json::json!({"f:status": {"f:conditions": {}}}),
                )],
                &[],
            ),
            NOW,
        );
        assert_eq!(
            c.recent(1_500).map(|c| c.controller),
            Some("node-lifecycle-controller")
        );
        let ours = [(
            "endpointslice.kubernetes.io/managed-by",
            "endpointslice-controller.k8s.io",
        )];
        changed(
            &c,
            "endpointslices",
            &meta(
                vec![entry(KCM_MANAGER, "", 1_600, serde_json::json!({}))],
                &ours,
            ),
            NOW,
        );
        assert_eq!(
            c.recent(1_600).map(|c| c.controller),
            Some("endpointslice-controller")
        );
    }
}
