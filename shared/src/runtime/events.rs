//! Events as kube-controller-manager writes them: core/v1 Events from a source component named
//! after the upstream controller, passed through the same correlation as client-go's recorder
//! (`tools/record`), so an operator sees the same objects and an event storm is held back the
//! same way:
//!
//! - an identical event (same object, type, reason and message) bumps the existing event's count;
//! - from the 10th distinct message with one reason about one object within 10 minutes, events
//!   are folded into one "(combined from similar events): …" event;
//! - per object and type, a token bucket (burst 25, one more every 5 minutes) drops the excess.
//!
//! kube's `Recorder` does none of this and folds events that differ in their note into a series
//! that keeps only the first note.

use crate::api::writer::{PatchKind, Writer};
use k8s_openapi::api::core::v1::{Event, EventSource, ObjectReference};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, Time};
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use kube::api::ObjectMeta;
use serde_json::{Value, json};
use std::collections::{HashMap, HashSet};
use std::hash::Hash;
use std::sync::{Arc, Mutex};

/// client-go's correlator constants (`events_cache.go`).
const CACHE_ENTRIES: usize = 4096;
const AGGREGATE_MAX_EVENTS: usize = 10;
const AGGREGATE_INTERVAL: SignedDuration = SignedDuration::from_secs(600);
const SPAM_BURST: f64 = 25.0;
const SPAM_PER_SECOND: f64 = 1.0 / 300.0;
const COMBINED_PREFIX: &str = "(combined from similar events): ";
/// Longer messages are cut, as the API server would reject them.
const MAX_MESSAGE: usize = 1024;

/// A reference to a core/v1 object (`Pod`, `Node`, ...) by its cache key (`namespace/name`, or
/// `name` when cluster-scoped), for events about objects that may already be gone.
pub fn core_ref(kind: &str, key: &str) -> ObjectReference {
    let (namespace, name) = crate::meta::keys::split_key(key);
    ObjectReference {
        api_version: Some("v1".into()),
        kind: Some(kind.into()),
        namespace: (!namespace.is_empty()).then(|| namespace.into()),
        name: Some(name.into()),
        ..Default::default()
    }
}

/// The object an event is about and the event's type: client-go's spam key.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
struct About {
    kind: Option<String>,
    namespace: Option<String>,
    name: Option<String>,
    uid: Option<String>,
    api_version: Option<String>,
    field_path: Option<String>,
    type_: &'static str,
}

/// One event as a controller reports it.
#[derive(Clone, Debug, PartialEq)]
struct Occurrence {
    about: About,
    reason: String,
    message: String,
}

/// What to send for one occurrence.
#[derive(Clone, Debug, PartialEq)]
enum Write {
    /// A new event object with this name, message and count 1.
    Create { name: String, message: String },
    /// The existing event `name` now has `count`, with this message.
    Patch {
        name: String,
        message: String,
        count: i32,
        first: Timestamp,
    },
    /// Held back by the spam filter.
    Skip,
}

/// A map that forgets its least recently used entry beyond `CACHE_ENTRIES` (client-go's LRU).
#[derive(Debug)]
struct Lru<K, V> {
    entries: HashMap<K, (V, u64)>,
    tick: u64,
}

impl<K: Eq + Hash + Clone, V> Default for Lru<K, V> {
    fn default() -> Self {
        Lru {
            entries: HashMap::new(),
            tick: 0,
        }
    }
}

impl<K: Eq + Hash + Clone, V> Lru<K, V> {
    fn get_mut(&mut self, k: &K) -> Option<&mut V> {
        self.tick += 1;
        let tick = self.tick;
        self.entries.get_mut(k).map(|(v, t)| {
            *t = tick;
            v
        })
    }

    fn insert(&mut self, k: K, v: V) {
        self.tick += 1;
        self.entries.insert(k, (v, self.tick));
        if self.entries.len() > CACHE_ENTRIES
            && let Some(oldest) = self
                .entries
                .iter()
                .min_by_key(|(_, (_, t))| *t)
                .map(|(k, _)| k.clone())
        {
            self.entries.remove(&oldest);
        }
    }
}

#[derive(Debug)]
struct Aggregate {
    messages: HashSet<String>,
    last: Timestamp,
}

#[derive(Debug, Clone)]
struct Seen {
    name: String,
    count: i32,
    first: Timestamp,
}

#[derive(Debug)]
struct Bucket {
    tokens: f64,
    at: Timestamp,
}

/// client-go's `EventCorrelator`: aggregate, then de-duplicate, then filter spam.
#[derive(Debug, Default)]
struct Correlator {
    aggregates: Lru<(About, String), Aggregate>,
    seen: Lru<(About, String, String), Seen>,
    buckets: Lru<About, Bucket>,
}

/// `<object name>.<nanoseconds in hex>`, as client-go names events.
fn event_name(about: &About, now: Timestamp) -> String {
    format!(
        "{}.{:x}",
        about.name.as_deref().unwrap_or_default(),
        now.as_nanosecond()
    )
}

impl Correlator {
    fn correlate(&mut self, o: Occurrence, now: Timestamp) -> Write {
        // Aggregation: from the 10th distinct message of one reason about one object.
        let group = (o.about.clone(), o.reason.clone());
        let mut message = o.message;
        let mut combined = false;
        match self.aggregates.get_mut(&group) {
            Some(a) if now.duration_since(a.last) <= AGGREGATE_INTERVAL => {
                a.messages.insert(message.clone());
                a.last = now;
                if a.messages.len() >= AGGREGATE_MAX_EVENTS {
                    // client-go keeps the set below the limit by dropping an arbitrary member.
                    if let Some(any) = a.messages.iter().next().cloned() {
                        a.messages.remove(&any);
                    }
                    combined = true;
                }
            }
            _ => self.aggregates.insert(
                group,
                Aggregate {
                    messages: HashSet::from([message.clone()]),
                    last: now,
                },
            ),
        }
        if combined {
            message = format!("{COMBINED_PREFIX}{message}");
        }
        // De-duplication: the combined event is one key per reason, whatever its message.
        let key = (
            o.about.clone(),
            o.reason,
            if combined {
                String::new()
            } else {
                message.clone()
            },
        );
        let write = match self.seen.get_mut(&key) {
            Some(s) => {
                s.count += 1;
                Write::Patch {
                    name: s.name.clone(),
                    message,
                    count: s.count,
                    first: s.first,
                }
            }
            None => {
                let name = event_name(&o.about, now);
                self.seen.insert(
                    key,
                    Seen {
                        name: name.clone(),
                        count: 1,
                        first: now,
                    },
                );
                Write::Create { name, message }
            }
        };
        // Spam filter, per object and type, after the count was noted (as client-go does).
        let bucket = match self.buckets.get_mut(&o.about) {
            Some(b) => b,
            None => {
                self.buckets.insert(
                    o.about.clone(),
                    Bucket {
                        tokens: SPAM_BURST,
                        at: now,
                    },
                );
                self.buckets.get_mut(&o.about).expect("just inserted")
            }
        };
        let refill = now.duration_since(bucket.at).as_secs_f64().max(0.0) * SPAM_PER_SECOND;
        bucket.tokens = (bucket.tokens + refill).min(SPAM_BURST);
        bucket.at = now;
        if bucket.tokens < 1.0 {
            return Write::Skip;
        }
        bucket.tokens -= 1.0;
        write
    }
}

/// Event writes waiting for the controller's budget at most (client-go's broadcaster queues
/// 1,000 and drops beyond).
pub const MAX_PENDING_EVENTS: usize = 1000;

/// One queued event write; its slot is given back when dropped.
struct PendingSlot(Arc<std::sync::atomic::AtomicUsize>);

impl Drop for PendingSlot {
    fn drop(&mut self) {
        self.0.fetch_sub(1, std::sync::atomic::Ordering::AcqRel);
    }
}

/// Whether a write failed because its low-priority wait for the budget ran out.
fn gave_up(e: &kube::Error) -> bool {
    let kube::Error::Service(s) = e else {
        return false;
    };
    let mut cur: Option<&(dyn std::error::Error + 'static)> = Some(s.as_ref());
    while let Some(err) = cur {
        if err.is::<crate::api::client::BudgetExhausted>() {
            return true;
        }
        cur = err.source();
    }
    false
}

#[derive(Clone)]
pub struct EventRecorder {
    writer: Writer,
    controller: String,
    instance: String,
    correlator: Arc<Mutex<Correlator>>,
    /// Writes queued or in flight, shared by every source of one controller.
    pending: Arc<std::sync::atomic::AtomicUsize>,
    dropped: prometheus_client::metrics::counter::Counter,
}

impl std::fmt::Debug for EventRecorder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("EventRecorder")
    }
}

/// Cuts `message` to at most `MAX_MESSAGE` bytes on a character boundary.
fn truncate_message(mut message: String) -> String {
    if message.len() > MAX_MESSAGE {
        let mut end = MAX_MESSAGE;
        while !message.is_char_boundary(end) {
            end -= 1;
        }
        message.truncate(end);
    }
    message
}

impl EventRecorder {
    /// `controller` is the upstream source component, e.g. `job-controller`; `instance` this
    /// replica (the reporting instance, so an event names the replica that wrote it).
    pub fn new(writer: Writer, controller: &str, instance: &str) -> Self {
        EventRecorder {
            writer,
            controller: controller.to_string(),
            instance: instance.to_string(),
            correlator: Arc::default(),
            pending: Arc::default(),
            dropped: Default::default(),
        }
    }

    /// Counts dropped events in `dropped` (registered by the runtime).
    pub fn with_drops(mut self, dropped: prometheus_client::metrics::counter::Counter) -> Self {
        self.dropped = dropped;
        self
    }

    /// The same writer, budget and replica reporting under another source component
    /// (node-lifecycle reports as `node-controller`), with a correlator of its own.
    pub fn for_source(&self, controller: &str) -> Self {
        EventRecorder {
            controller: controller.to_string(),
            correlator: Arc::default(),
            ..self.clone()
        }
    }

    /// `action` is kept for call sites written against events.k8s.io; core/v1 events written by
    /// kube-controller-manager carry none, so neither do ours.
    pub fn normal(
        &self,
        regarding: &ObjectReference,
        reason: &str,
        _action: &str,
        note: impl Into<String>,
    ) {
        self.emit("Normal", regarding, reason, note.into());
    }

    pub fn warning(
        &self,
        regarding: &ObjectReference,
        reason: &str,
        _action: &str,
        note: impl Into<String>,
    ) {
        self.emit("Warning", regarding, reason, note.into());
    }

    /// Correlated in call order, then written in the background: an event write never delays a
    /// sync, and a failed one is logged, not retried.
    fn emit(&self, type_: &'static str, regarding: &ObjectReference, reason: &str, note: String) {
        let about = About {
            kind: regarding.kind.clone(),
            namespace: regarding.namespace.clone(),
            name: regarding.name.clone(),
            uid: regarding.uid.clone(),
            api_version: regarding.api_version.clone(),
            field_path: regarding.field_path.clone(),
            type_,
        };
        let now = Timestamp::now();
        let write = self
            .correlator
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .correlate(
                Occurrence {
                    about,
                    reason: reason.to_string(),
                    message: truncate_message(note),
                },
                now,
            );
        if write == Write::Skip {
            tracing::debug!(reason, "event held back by the spam filter");
            return;
        }
        use std::sync::atomic::Ordering;
        // Events wait for tokens the controller's writes leave free; when too many wait, the
        // newest are dropped (and counted) rather than queued without bound.
        if self.pending.fetch_add(1, Ordering::AcqRel) >= MAX_PENDING_EVENTS {
            self.pending.fetch_sub(1, Ordering::AcqRel);
            self.dropped.inc();
            tracing::debug!(reason, "event dropped: too many waiting for the API budget");
            return;
        }
        let this = self.clone();
        let (regarding, reason) = (regarding.clone(), reason.to_string());
        let slot = PendingSlot(Arc::clone(&self.pending));
        tokio::spawn(async move {
            // Released however the write ends (a panic or a cancelled task included).
            let _slot = slot;
            if let Err(e) = this.write(write, &regarding, type_, &reason, now).await {
                if gave_up(&e) {
                    this.dropped.inc();
                    tracing::debug!(reason = %reason, "event dropped: the API budget stayed taken");
                } else {
                    tracing::warn!(reason = %reason, error = %e, "failed to write event");
                }
            }
        });
    }

    async fn write(
        &self,
        write: Write,
        regarding: &ObjectReference,
        type_: &str,
        reason: &str,
        now: Timestamp,
    ) -> kube::Result<()> {
        let namespace = regarding.namespace.as_deref().unwrap_or("default");
        let (name, message, count, first) = match write {
            Write::Skip => return Ok(()),
            Write::Create { name, message } => (name, message, 1, now),
            Write::Patch {
                name,
                message,
                count,
                first,
            } => {
                let patch: Value =
                    json!({"count": count, "lastTimestamp": Time(now), "message": message});
                match self
                    .writer
                    .patch::<Event>(namespace, &name, PatchKind::Merge, patch)
                    .await
                {
                    // Gone (expired): write it anew, as client-go does.
                    Err(e) if crate::api::apierr::is_not_found(&e) => (name, message, count, first),
                    other => return other.map(drop),
                }
            }
        };
        let event = Event {
            metadata: ObjectMeta {
                name: Some(name),
                namespace: Some(namespace.to_string()),
                ..Default::default()
            },
            involved_object: regarding.clone(),
            reason: Some(reason.to_string()),
            message: Some(message),
            type_: Some(type_.to_string()),
            count: Some(count),
            first_timestamp: Some(Time(first)),
            last_timestamp: Some(Time(now)),
            event_time: None::<MicroTime>,
            source: Some(EventSource {
                component: Some(self.controller.clone()),
                host: None,
            }),
            reporting_component: Some(self.controller.clone()),
            reporting_instance: Some(self.instance.clone()),
            ..Default::default()
        };
        match self.writer.create(namespace, &event).await {
            Err(e) if crate::api::apierr::is_already_exists(&e) => Ok(()),
            other => other.map(drop),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn about(name: &str) -> About {
        About {
            kind: Some("Job".into()),
            namespace: Some("ns".into()),
            name: Some(name.into()),
            uid: Some(format!("uid-{name}")),
            api_version: Some("batch/v1".into()),
            field_path: None,
            type_: "Normal",
        }
    }

    fn occ(name: &str, reason: &str, message: &str) -> Occurrence {
        Occurrence {
            about: about(name),
            reason: reason.into(),
            message: message.into(),
        }
    }

    fn at(s: i64) -> Timestamp {
        Timestamp::from_second(1_700_000_000 + s).unwrap()
    }

    #[test]
    fn references_by_cache_key() {
        let p = core_ref("Pod", "ns/p");
        assert_eq!(
            (p.kind.as_deref(), p.namespace.as_deref(), p.name.as_deref()),
            (Some("Pod"), Some("ns"), Some("p"))
        );
        assert_eq!(core_ref("Node", "n").namespace, None);
    }

    #[test]
    fn identical_events_count_up_on_one_object() {
        let mut c = Correlator::default();
        let Write::Create { name, .. } = c.correlate(occ("j", "Completed", "done"), at(0)) else {
            panic!("first one is created")
        };
        match c.correlate(occ("j", "Completed", "done"), at(5)) {
            Write::Patch {
                name: n,
                count,
                first,
                message,
            } => {
                assert_eq!(
                    (n, count, first, message.as_str()),
                    (name, 2, at(0), "done")
                );
            }
            other => panic!("{other:?}"),
        }
        // Another message is another event.
        assert!(matches!(
            c.correlate(occ("j", "Completed", "other"), at(6)),
            Write::Create { .. }
        ));
    }

    #[test]
    fn the_tenth_distinct_message_is_combined() {
        let mut c = Correlator::default();
        for i in 0..9 {
            let w = c.correlate(
                occ("j", "SuccessfulCreate", &format!("Created pod: p{i}")),
                at(i),
            );
            assert!(
                matches!(w, Write::Create { ref message, .. } if !message.starts_with('(')),
                "{i}: {w:?}"
            );
        }
        let Write::Create { name, message } =
            c.correlate(occ("j", "SuccessfulCreate", "Created pod: p9"), at(9))
        else {
            panic!("the combined event is created once")
        };
        assert_eq!(message, "(combined from similar events): Created pod: p9");
        match c.correlate(occ("j", "SuccessfulCreate", "Created pod: p10"), at(10)) {
            Write::Patch {
                name: n,
                count,
                message,
                ..
            } => {
                assert_eq!((n, count), (name, 2));
                assert_eq!(message, "(combined from similar events): Created pod: p10");
            }
            other => panic!("{other:?}"),
        }
        // Other reasons and other objects are untouched.
        assert!(matches!(
            c.correlate(occ("j", "Completed", "done"), at(11)),
            Write::Create { ref message, .. } if message == "done"
        ));
        // Ten quiet minutes start a fresh group.
        let mut fresh = Correlator::default();
        for i in 0..9 {
            fresh.correlate(occ("k", "R", &format!("m{i}")), at(i));
        }
        assert!(matches!(
            fresh.correlate(occ("k", "R", "m9"), at(9 + 601)),
            Write::Create { ref message, .. } if message == "m9"
        ));
    }

    #[test]
    fn spam_filter_allows_a_burst_of_25_then_one_per_five_minutes() {
        let mut c = Correlator::default();
        let written = (0..40)
            .filter(|i| c.correlate(occ("j", &format!("R{i}"), "m"), at(0)) != Write::Skip)
            .count();
        assert_eq!(written, 25);
        assert_eq!(c.correlate(occ("j", "R99", "m"), at(299)), Write::Skip);
        assert_ne!(c.correlate(occ("j", "R99", "m"), at(301)), Write::Skip);
        // Per object: another Job is not held back.
        assert_ne!(c.correlate(occ("other", "R", "m"), at(1)), Write::Skip);
    }

    #[test]
    fn the_cache_forgets_the_least_recently_used() {
        let mut l: Lru<usize, usize> = Lru::default();
        for i in 0..CACHE_ENTRIES {
            l.insert(i, i);
        }
        l.get_mut(&0);
        l.insert(CACHE_ENTRIES, 0);
        assert!(l.get_mut(&0).is_some());
        assert!(l.get_mut(&1).is_none());
    }

    #[test]
    fn messages_are_cut_on_a_character_boundary() {
        let cut = truncate_message("é".repeat(MAX_MESSAGE));
        assert!(
            cut.len() <= MAX_MESSAGE && cut.len() > MAX_MESSAGE - 2,
            "{}",
            cut.len()
        );
        assert_eq!(truncate_message("short".into()), "short");
    }

    /// A writer whose calls never complete (a budget that never frees a token).
    struct Stuck;

    impl crate::api::writer::Transport for Stuck {
        fn call(
            &self,
            _call: crate::api::writer::Call,
        ) -> futures::future::BoxFuture<'_, Result<Value, kube::Error>> {
            Box::pin(std::future::pending())
        }
    }

    #[tokio::test]
    async fn events_beyond_the_pending_limit_are_dropped_and_counted() {
        let dropped = prometheus_client::metrics::counter::Counter::<u64>::default();
        let rec = EventRecorder::new(crate::api::writer::Writer::new(Arc::new(Stuck)), "c", "i")
            .with_drops(dropped.clone());
        let other = rec.for_source("other");
        for i in 0..MAX_PENDING_EVENTS + 5 {
            let r = ObjectReference {
                kind: Some("Job".into()),
                namespace: Some("ns".into()),
                name: Some(format!("j-{i}")),
                ..Default::default()
            };
            // Both sources share one queue (one controller, one budget).
            let rec = if i % 2 == 0 { &rec } else { &other };
            rec.warning(&r, "Reason", "", "message");
        }
        assert_eq!(dropped.get(), 5);
        assert_eq!(
            rec.pending.load(std::sync::atomic::Ordering::Acquire),
            MAX_PENDING_EVENTS
        );
    }
}
