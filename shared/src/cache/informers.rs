//! Shared caches: one LIST+WATCH per resource type for the whole process, created only when an
//! enabled controller asks for that type, shared by every controller that does.
//!
//! Each informer keeps a store of `Arc<K>` (managedFields stripped, never mutated in place),
//! named indexes (e.g. pods by node, by controlling owner UID) maintained on every event, and a
//! list of handlers called with add/update/delete (old and new). Handlers run on the watch task
//! and must only map the event to keys and enqueue them: nothing blocks, so no consumer can stall
//! the watch (unlike a bounded broadcast).

use crate::cache::decoded::Decoded;
use crate::meta::keys::{ObjectKey, object_key, shrink_meta};
use crate::metrics::ResourceLabel;
use futures::StreamExt;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::Api;
use kube::runtime::WatchStreamExt;
use kube::runtime::watcher::{self, Event};
use kube::{Client, Resource, ResourceExt};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use serde::Serialize;
use serde::de::DeserializeOwned;
use std::any::{Any, TypeId};
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::fmt::Debug;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;
use tokio::sync::watch as tokio_watch;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

pub trait Watched:
    Resource<DynamicType = ()> + Clone + DeserializeOwned + Serialize + Debug + Send + Sync + 'static
{
}
impl<K> Watched for K where
    K: Resource<DynamicType = ()>
        + Clone
        + DeserializeOwned
        + Serialize
        + Debug
        + Send
        + Sync
        + 'static
{
}

/// A change seen by an informer.
#[derive(Debug)]
pub enum Change<K> {
    Added(Arc<K>),
    Updated {
        old: Arc<K>,
        new: Arc<K>,
    },
    /// The last state seen. After a re-list this may be older than the real final state.
    Deleted(Arc<K>),
}

impl<K> Change<K> {
    /// The newest state this change carries.
    pub fn object(&self) -> &Arc<K> {
        match self {
            Change::Added(o) | Change::Deleted(o) => o,
            Change::Updated { new, .. } => new,
        }
    }
}

type Handler<K> = Box<dyn Fn(&Change<K>) + Send + Sync>;
type IndexFn<K> = Box<dyn Fn(&K) -> Vec<String> + Send + Sync>;

struct Index<K> {
    func: IndexFn<K>,
    entries: HashMap<String, BTreeSet<ObjectKey>>,
}

struct StoreState<K> {
    objects: HashMap<ObjectKey, Arc<K>>,
    indexes: HashMap<&'static str, Index<K>>,
    /// Index functions that panicked (their values counted as none), with the registry's
    /// `pilothouse_informer_panics_total` series of this resource.
    panics: u64,
    panics_counter: Counter,
}

/// An index function's values for `obj`; none if it panics. It runs under the store's write
/// lock: a panic must neither leave the indexes half-updated nor end the watch.
fn index_values<K>(func: &IndexFn<K>, obj: &K, panics: &mut u64, counter: &Counter) -> Vec<String> {
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| func(obj))).unwrap_or_else(|_| {
        tracing::error!("an index function panicked; the object is left out of that index");
        *panics = panics.saturating_add(1);
        counter.inc();
        Vec::new()
    })
}

impl<K> StoreState<K> {
    fn index_insert(&mut self, key: &ObjectKey, obj: &K) {
        let (panics, counter) = (&mut self.panics, &self.panics_counter);
        for index in self.indexes.values_mut() {
            for v in index_values(&index.func, obj, panics, counter) {
                index.entries.entry(v).or_default().insert(key.clone());
            }
        }
    }

    fn index_remove(&mut self, key: &ObjectKey, obj: &K) {
        let (panics, counter) = (&mut self.panics, &self.panics_counter);
        for index in self.indexes.values_mut() {
            for v in index_values(&index.func, obj, panics, counter) {
                if let Some(set) = index.entries.get_mut(&v) {
                    set.remove(key);
                    if set.is_empty() {
                        index.entries.remove(&v);
                    }
                }
            }
        }
    }
}

/// One resource type's shared cache.
pub struct Informer<K> {
    resource: String,
    state: RwLock<StoreState<K>>,
    handlers: RwLock<Vec<Handler<K>>>,
    synced: AtomicBool,
    synced_tx: tokio_watch::Sender<bool>,
    /// What every object goes through before it is cached (shared with the registry).
    transforms: Arc<Transforms>,
    /// The highest resourceVersion the watch has delivered (read-your-writes: a write returning
    /// a lower or equal one is in the cache).
    newest: AtomicU64,
    /// Objects skipped because they did not decode, by key, with the reason (until an event for
    /// the key decodes or deletes it).
    undecodable: Mutex<BTreeMap<ObjectKey, String>>,
    undecodable_total: AtomicU64,
    /// `pilothouse_undecodable_objects_total{resource}`, shared by the registry's informers.
    undecodable_counter: Counter,
    /// Events skipped because taking them panicked; `pilothouse_informer_panics_total`.
    panics_total: AtomicU64,
    panics_counter: Counter,
    /// Set while the watch is failing (read on every event, so the lock is taken only then).
    failing: AtomicBool,
    watch_health: Mutex<WatchHealth>,
}

/// A watch fails quietly: the stream retries with backoff (at most 30 s apart) and the cache
/// serves its last state meanwhile. This is what `/readyz` says about it.
#[derive(Default)]
struct WatchHealth {
    /// When the current run of errors began, and how many (any event ends the run).
    since: Option<Instant>,
    errors: u64,
    /// The last error and when.
    last: Option<(Instant, String)>,
    /// The watch task ended abnormally and waits to be started again.
    restarting: bool,
}

/// An error more recent than this (longer than the watch's longest backoff) means the watch
/// is failing now.
const WATCH_ERROR_FRESH: Duration = Duration::from_secs(45);
/// A run of errors this long makes the cache not ready (shorter ones are an API server
/// restarting, which every watch rides out).
const WATCH_FAILING_UNREADY: Duration = Duration::from_secs(60);

/// What is wrong with one watch now.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WatchTrouble {
    pub resource: String,
    pub message: String,
    /// Long enough, or bad enough, to make the process not ready.
    pub unready: bool,
}

impl WatchHealth {
    fn trouble(&self, resource: &str, now: Instant) -> Option<WatchTrouble> {
        if self.restarting {
            return Some(WatchTrouble {
                resource: resource.to_string(),
                message: "the watch ended abnormally and is being started again".into(),
                unready: true,
            });
        }
        let (at, error) = self.last.as_ref()?;
        let since = self.since?;
        let ago = now.saturating_duration_since(*at);
        if ago > WATCH_ERROR_FRESH {
            return None;
        }
        let span = at.saturating_duration_since(since);
        Some(WatchTrouble {
            resource: resource.to_string(),
            message: format!(
                "the watch is failing: {} error(s) in a row over {} s, the last {} s ago: {error}",
                self.errors,
                span.as_secs(),
                ago.as_secs()
            ),
            unready: span >= WATCH_FAILING_UNREADY,
        })
    }
}

impl<K: Watched> Informer<K> {
    fn new(transforms: Arc<Transforms>, counters: &InformerCounters) -> Self {
        let label = ResourceLabel {
            resource: K::plural(&()).into_owned(),
        };
        let (synced_tx, _) = tokio_watch::channel(false);
        Informer {
            transforms,
            resource: K::plural(&()).into_owned(),
            state: RwLock::new(StoreState {
                objects: HashMap::new(),
                indexes: HashMap::new(),
                panics: 0,
                panics_counter: counters.panics.get_or_create(&label).clone(),
            }),
            handlers: RwLock::new(Vec::new()),
            synced: AtomicBool::new(false),
            synced_tx,
            newest: AtomicU64::new(0),
            undecodable: Mutex::new(BTreeMap::new()),
            undecodable_total: AtomicU64::new(0),
            undecodable_counter: counters.undecodable.get_or_create(&label).clone(),
            panics_total: AtomicU64::new(0),
            panics_counter: counters.panics.get_or_create(&label).clone(),
            failing: AtomicBool::new(false),
            watch_health: Mutex::new(WatchHealth::default()),
        }
    }

    /// What is wrong with the watch now, if anything.
    pub fn watch_trouble(&self) -> Option<WatchTrouble> {
        crate::lock(&self.watch_health).trouble(&self.resource, Instant::now())
    }

    fn watch_failed(&self, error: String) {
        let now = Instant::now();
        let mut h = crate::lock(&self.watch_health);
        // A watch that reconnected quietly delivers nothing to end its run of errors: an error
        // after a stale one starts a new run.
        if h.last
            .as_ref()
            .is_some_and(|(at, _)| now.saturating_duration_since(*at) > WATCH_ERROR_FRESH)
        {
            h.since = None;
            h.errors = 0;
        }
        h.since.get_or_insert(now);
        h.errors = h.errors.saturating_add(1);
        h.last = Some((now, error));
        self.failing.store(true, Ordering::Release);
    }

    /// An event arrived: the watch works (again).
    fn watch_delivered(&self) {
        if self.failing.swap(false, Ordering::AcqRel) {
            let mut h = crate::lock(&self.watch_health);
            h.since = None;
            h.errors = 0;
            h.last = None;
        }
    }

    fn watch_restarting(&self, restarting: bool) {
        crate::lock(&self.watch_health).restarting = restarting;
    }

    /// The resource's plural name (e.g. `pods`).
    pub fn resource(&self) -> &str {
        &self.resource
    }

    /// Registers a handler. Handlers must be cheap and non-blocking (map to keys, enqueue).
    pub fn on_change(&self, handler: impl Fn(&Change<K>) + Send + Sync + 'static) {
        crate::write(&self.handlers).push(Box::new(handler));
    }

    /// Adds a named index. Adding the same name twice keeps the first (indexes are shared).
    pub fn add_index(
        &self,
        name: &'static str,
        func: impl Fn(&K) -> Vec<String> + Send + Sync + 'static,
    ) {
        let mut s = crate::write(&self.state);
        if s.indexes.contains_key(name) {
            return;
        }
        let mut index = Index {
            func: Box::new(func),
            entries: HashMap::new(),
        };
        let (mut panics, counter) = (0, s.panics_counter.clone());
        for (key, obj) in &s.objects {
            for v in index_values(&index.func, obj, &mut panics, &counter) {
                index.entries.entry(v).or_default().insert(key.clone());
            }
        }
        s.panics = s.panics.saturating_add(panics);
        s.indexes.insert(name, index);
    }

    pub fn get(&self, key: &str) -> Option<Arc<K>> {
        crate::read(&self.state).objects.get(key).cloned()
    }

    pub fn list(&self) -> Vec<Arc<K>> {
        crate::read(&self.state).objects.values().cloned().collect()
    }

    pub fn len(&self) -> usize {
        crate::read(&self.state).objects.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Objects whose index `name` yields `value`. An unknown index name is a programming error.
    pub fn by_index(&self, name: &str, value: &str) -> Vec<Arc<K>> {
        let s = crate::read(&self.state);
        let index = s
            .indexes
            .get(name)
            .unwrap_or_else(|| panic!("no index {name:?} on {}", self.resource));
        index
            .entries
            .get(value)
            .map(|keys| {
                keys.iter()
                    .filter_map(|k| s.objects.get(k).cloned())
                    .collect()
            })
            .unwrap_or_default()
    }

    pub fn has_synced(&self) -> bool {
        self.synced.load(Ordering::Acquire)
    }

    pub async fn wait_synced(&self) {
        let mut rx = self.synced_tx.subscribe();
        let _ = rx.wait_for(|s| *s).await;
    }

    /// The highest resourceVersion delivered so far (0 before any; non-numeric versions, which
    /// no Kubernetes API server sends, are ignored).
    pub fn newest_resource_version(&self) -> u64 {
        self.newest.load(Ordering::Acquire)
    }

    fn saw(&self, obj: &impl Resource) {
        if let Some(rv) = obj.meta().resource_version.as_deref().and_then(parse_rv) {
            self.newest.fetch_max(rv, Ordering::AcqRel);
        }
    }

    /// Objects skipped now because they did not decode (`namespace/name: reason`), and how
    /// many times one was skipped since start.
    /// Events skipped since start because taking them into the cache panicked.
    pub fn panics(&self) -> u64 {
        self.panics_total
            .load(Ordering::Relaxed)
            .saturating_add(crate::read(&self.state).panics)
    }

    pub fn undecodable(&self) -> (Vec<String>, u64) {
        let now = crate::lock(&self.undecodable)
            .iter()
            .map(|(k, e)| format!("{k}: {e}"))
            .collect();
        (now, self.undecodable_total.load(Ordering::Relaxed))
    }

    /// An object off the wire: decoded and stripped, or skipped (counted, logged, its key kept
    /// for `/readyz`), in which case the cache keeps whatever it had for the key.
    fn decoded(&self, obj: Decoded<K>) -> Result<K, ObjectKey> {
        self.saw(&obj);
        let key = object_key(&obj);
        match obj {
            Decoded::Ok(k) => {
                if !crate::lock(&self.undecodable).is_empty() {
                    crate::lock(&self.undecodable).remove(&key);
                }
                Ok(self.strip(k))
            }
            Decoded::Undecodable { error, .. } => {
                tracing::warn!(resource = %self.resource, key = %key, error = %error, "skipping an object that does not decode; the cache keeps its previous state");
                self.undecodable_total.fetch_add(1, Ordering::Relaxed);
                self.undecodable_counter.inc();
                crate::lock(&self.undecodable).insert(key.clone(), error);
                Err(key)
            }
        }
    }

    /// One event of the watch into the store (or the listing under way).
    fn take(
        &self,
        event: Event<Decoded<K>>,
        listing: &mut Option<HashMap<ObjectKey, K>>,
        listed_once: &mut bool,
    ) {
        match event {
            Event::Init => {
                *listing = Some(HashMap::new());
                // The re-list says again which keys do not decode; a key gone meanwhile must not
                // stay reported for ever.
                crate::lock(&self.undecodable).clear();
            }
            Event::InitApply(obj) => {
                let listing = listing.get_or_insert_with(HashMap::new);
                match self.decoded(obj) {
                    Ok(obj) => {
                        listing.insert(object_key(&obj), obj);
                    }
                    // Skipped, not deleted: the re-list keeps what the cache had.
                    Err(key) => self.keep_listed(listing, key),
                }
            }
            Event::InitDone => {
                let listed = listing.take().unwrap_or_default();
                tracing::debug!(resource = %self.resource, objects = listed.len(), "listed");
                self.replace(listed);
                *listed_once = true;
            }
            Event::Apply(obj) => {
                if let Ok(obj) = self.decoded(obj) {
                    self.apply(obj);
                }
            }
            Event::Delete(obj) => match self.decoded(obj) {
                Ok(obj) => self.delete(obj),
                Err(key) => self.delete_key(&key),
            },
        }
    }

    /// A re-list keeps the cached state of a key it could not take.
    fn keep_listed(&self, listing: &mut HashMap<ObjectKey, K>, key: ObjectKey) {
        if let Some(old) = self.get(&key) {
            listing.insert(key, (*old).clone());
        }
    }

    /// A transform, an observer or an index function panicked on one event: the event is
    /// skipped (counted, logged with its key) and the watch goes on, so the only watch of the
    /// type never ends on one object.
    fn panicked(
        &self,
        key: Option<&str>,
        initial: bool,
        listing: &mut Option<HashMap<ObjectKey, K>>,
        panic: &(dyn Any + Send),
    ) {
        let what = panic
            .downcast_ref::<&str>()
            .map(|s| s.to_string())
            .or_else(|| panic.downcast_ref::<String>().cloned())
            .unwrap_or_default();
        tracing::error!(resource = %self.resource, key = key.unwrap_or_default(), panic = %what, "taking a watch event into the cache panicked; skipping it");
        self.panics_total.fetch_add(1, Ordering::Relaxed);
        self.panics_counter.inc();
        if let (true, Some(key), Some(listing)) = (initial, key, listing.as_mut()) {
            self.keep_listed(listing, key.to_string());
        }
    }

    /// A delete whose last state did not decode: the key is all it takes.
    fn delete_key(&self, key: &ObjectKey) {
        crate::lock(&self.undecodable).remove(key);
        let removed = {
            let mut s = crate::write(&self.state);
            let removed = s.objects.remove(key);
            if let Some(o) = &removed {
                s.index_remove(key, o);
            }
            removed
        };
        if let Some(old) = removed {
            self.notify(Change::Deleted(old));
        }
    }

    fn notify(&self, change: Change<K>) {
        for h in crate::read(&self.handlers).iter() {
            h(&change);
        }
    }

    fn apply(&self, obj: K) {
        self.saw(&obj);
        let key = object_key(&obj);
        let new = Arc::new(obj);
        let old = {
            let mut s = crate::write(&self.state);
            let old = s.objects.insert(key.clone(), Arc::clone(&new));
            if let Some(o) = &old {
                s.index_remove(&key, o);
            }
            s.index_insert(&key, &new);
            old
        };
        match old {
            None => self.notify(Change::Added(new)),
            Some(old) => self.notify(Change::Updated { old, new }),
        }
    }

    fn delete(&self, obj: K) {
        self.saw(&obj);
        let key = object_key(&obj);
        let removed = {
            let mut s = crate::write(&self.state);
            let removed = s.objects.remove(&key);
            if let Some(o) = &removed {
                s.index_remove(&key, o);
            }
            removed
        };
        if removed.is_some() {
            self.notify(Change::Deleted(Arc::new(obj)));
        }
    }

    /// Replaces the whole store after a (re-)list, emitting only real differences.
    fn replace(&self, listed: HashMap<ObjectKey, K>) {
        let mut changes = Vec::new();
        {
            let mut s = crate::write(&self.state);
            let gone: Vec<ObjectKey> = s
                .objects
                .keys()
                .filter(|k| !listed.contains_key(*k))
                .cloned()
                .collect();
            for key in gone {
                if let Some(old) = s.objects.remove(&key) {
                    s.index_remove(&key, &old);
                    changes.push(Change::Deleted(old));
                }
            }
            for (key, obj) in listed {
                self.saw(&obj);
                let new = Arc::new(obj);
                match s.objects.insert(key.clone(), Arc::clone(&new)) {
                    Some(old) if old.resource_version() == new.resource_version() => {
                        // Unchanged: keep the old Arc so readers holding it see the same object.
                        s.objects.insert(key, old);
                    }
                    Some(old) => {
                        s.index_remove(&key, &old);
                        s.index_insert(&key, &new);
                        changes.push(Change::Updated { old, new });
                    }
                    None => {
                        s.index_insert(&key, &new);
                        changes.push(Change::Added(new));
                    }
                }
            }
        }
        for c in changes {
            self.notify(c);
        }
        self.synced.store(true, Ordering::Release);
        self.synced_tx.send_replace(true);
    }

    /// Watches until `stop`. The initial state comes as a streaming list (KEP-3157, on by default
    /// since Kubernetes 1.34): object by object over a watch, so a start never holds a whole list
    /// response and its deserialized copy beside the cache, which is most of a large cluster's
    /// peak memory. A server with the WatchList feature off refuses `sendInitialEvents`; the
    /// informer then lists and watches as client-go's reflector falls back.
    async fn run(
        self: Arc<Self>,
        api: Api<Decoded<K>>,
        config: watcher::Config,
        stop: CancellationToken,
    ) {
        let streaming = config.clone().streaming_lists();
        if let Watch::Refused = self.watch(api.clone(), streaming, true, &stop).await {
            tracing::warn!(resource = %self.resource, "the API server refuses streaming lists; listing and watching instead");
            self.watch(api, config, false, &stop).await;
        }
    }

    async fn watch(
        &self,
        api: Api<Decoded<K>>,
        config: watcher::Config,
        streaming: bool,
        stop: &CancellationToken,
    ) -> Watch {
        let stream = watcher::watcher(api, config).default_backoff();
        futures::pin_mut!(stream);
        let mut listing: Option<HashMap<ObjectKey, K>> = None;
        let mut listed_once = false;
        loop {
            let next = tokio::select! {
                _ = stop.cancelled() => return Watch::Stopped,
                n = stream.next() => n,
            };
            let Some(event) = next else {
                return Watch::Stopped;
            };
            match event {
                Ok(event) => {
                    self.watch_delivered();
                    let key = match &event {
                        Event::InitApply(o) | Event::Apply(o) | Event::Delete(o) => {
                            Some(object_key(o))
                        }
                        Event::Init | Event::InitDone => None,
                    };
                    let initial = matches!(event, Event::InitApply(_));
                    let taken = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                        self.take(event, &mut listing, &mut listed_once);
                    }));
                    if let Err(panic) = taken {
                        self.panicked(key.as_deref(), initial, &mut listing, &*panic);
                    }
                }
                Err(e) if streaming && !listed_once && streaming_refused(&e) => {
                    return Watch::Refused;
                }
                Err(e) => {
                    tracing::warn!(resource = %self.resource, error = %e, "watch failed; retrying with backoff");
                    self.watch_failed(e.to_string());
                }
            }
        }
    }
}

/// A resourceVersion as the number etcd makes it (comparable since Kubernetes 1.34, KEP-5504).
pub fn parse_rv(rv: &str) -> Option<u64> {
    rv.parse().ok()
}

/// How a watch ended.
enum Watch {
    Stopped,
    /// The server does not serve streaming lists.
    Refused,
}

/// Whether the server refused a streaming list: with the WatchList feature off it rejects
/// `sendInitialEvents` as invalid (422), or as a bad request from older versions (400).
fn streaming_refused(e: &watcher::Error) -> bool {
    match e {
        watcher::Error::WatchStartFailed(kube::Error::Api(s)) => s.code == 422 || s.code == 400,
        watcher::Error::WatchError(s) => s.code == 422 || s.code == 400,
        _ => false,
    }
}

/// The test kit's way in: the same store updates, indexes and handlers a watch drives.
#[cfg(any(test, feature = "testkit"))]
impl<K: Watched> Informer<K> {
    pub fn testkit_apply(&self, obj: K) {
        self.apply(self.strip(obj));
    }

    pub fn testkit_delete(&self, obj: K) {
        self.delete(self.strip(obj));
    }

    pub fn testkit_mark_synced(&self) {
        self.synced.store(true, Ordering::Release);
        self.synced_tx.send_replace(true);
    }
}

impl<K: Watched> Informer<K> {
    /// What the cache keeps of an object: the observers see it whole, then it loses its
    /// managedFields and goes through its type's transform (e.g. the pod projection).
    fn strip(&self, mut obj: K) -> K {
        let observers = crate::read(&self.transforms.observers);
        if !observers.is_empty() {
            let changed = |part: Part| self.changed_since_cached(&obj, part);
            for o in observers.iter() {
                o.observe(&self.resource, obj.meta(), &changed);
            }
        }
        drop(observers);
        obj.meta_mut().managed_fields = None;
        shrink_meta(obj.meta_mut());
        if let Some(f) = self.transforms.of::<K>() {
            f(&mut obj);
        }
        obj
    }

    /// Whether `part` of `obj` differs from the cached copy of its key (the state before this
    /// event). An object the cache does not hold yet has nothing to differ from: `false`.
    /// Serializes both, so it is for the rare caller (an observer that found something to check).
    fn changed_since_cached(&self, obj: &K, part: Part) -> bool {
        let Some(old) = self.get(&object_key(obj)) else {
            return false;
        };
        let view = |o: &K| {
            let serde_json::Value::Object(mut m) = serde_json::to_value(o).unwrap_or_default()
            else {
                return serde_json::Value::Null;
            };
            match part {
                Part::Status => m.remove("status").unwrap_or_default(),
                Part::Content => {
                    m.remove("metadata");
                    m.remove("status");
                    serde_json::Value::Object(m)
                }
            }
        };
        view(&old) != view(obj)
    }
}

/// A part of an object an observer may ask about: did this event change it?
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Part {
    /// `.status`: what a write to the status subresource changes.
    Status,
    /// Everything but `metadata` and `status`: what a write to the object itself changes.
    Content,
}

/// Sees every object's metadata as a watch delivers it, managedFields included, before the
/// cache drops them (the kube-controller-manager double-run guard is one). `changed` says whether
/// this event changed a part of the object since the cached copy: managedFields are whatever a
/// writer sent, the change itself is the API server's.
pub trait MetaObserver: Send + Sync {
    fn observe(&self, resource: &str, meta: &ObjectMeta, changed: &dyn Fn(Part) -> bool);
}

/// A type's transform: changes an object in place before it is cached.
pub type TransformFn<K> = Arc<dyn Fn(&mut K) + Send + Sync>;

/// The observers and per-type transforms of the registry, read by every informer.
#[derive(Default)]
pub struct Transforms {
    observers: RwLock<Vec<Arc<dyn MetaObserver>>>,
    /// `TypeId` of `K` → `TransformFn<K>`.
    by_type: RwLock<HashMap<TypeId, Arc<dyn Any + Send + Sync>>>,
    /// State a transform keeps per registry, by its type (see [`Informers::extension`]).
    extensions: Mutex<HashMap<TypeId, Arc<dyn Any + Send + Sync>>>,
}

impl Transforms {
    fn of<K: 'static>(&self) -> Option<TransformFn<K>> {
        crate::read(&self.by_type)
            .get(&TypeId::of::<K>())
            .and_then(|f| f.downcast_ref::<TransformFn<K>>().cloned())
    }
}

/// Index function: the object's namespace.
pub fn by_namespace<K: Resource>(obj: &K) -> Vec<String> {
    obj.meta().namespace.clone().into_iter().collect()
}

/// Index function: the UID of the object's controlling owner.
pub fn by_controller_uid<K: Resource>(obj: &K) -> Vec<String> {
    obj.meta()
        .owner_references
        .iter()
        .flatten()
        .filter(|o| o.controller == Some(true))
        .map(|o| o.uid.clone())
        .collect()
}

/// Index function: the namespace of an object without a controlling owner (the candidates for
/// adoption there).
pub fn orphan_by_namespace<K: Resource>(obj: &K) -> Vec<String> {
    if crate::meta::refs::controller_of(obj.meta()).is_some() {
        Vec::new()
    } else {
        by_namespace(obj)
    }
}

pub const INDEX_NAMESPACE: &str = "namespace";
pub const INDEX_CONTROLLER_UID: &str = "controller-uid";
pub const INDEX_ORPHAN_NAMESPACE: &str = "orphan-namespace";

trait AnyInformer: Send + Sync {
    fn as_any(&self) -> Arc<dyn Any + Send + Sync>;
    fn resource(&self) -> String;
    fn has_synced(&self) -> bool;
    fn start(&self, client: Client, stop: CancellationToken);
    fn namespace(&self) -> Option<String>;
    fn undecodable(&self) -> (Vec<String>, u64);
    fn panics(&self) -> u64;
    fn watch_trouble(&self) -> Option<WatchTrouble>;
}

struct Entry<K> {
    informer: Arc<Informer<K>>,
    started: AtomicBool,
    /// `Some(ns)`: the watch covers only that namespace.
    namespace: Option<String>,
    api: ApiFn<K>,
}

/// Counters shared by every informer of a registry, by resource.
#[derive(Clone, Default)]
pub struct InformerCounters {
    /// `pilothouse_undecodable_objects_total`.
    pub undecodable: Family<ResourceLabel, Counter>,
    /// `pilothouse_informer_panics_total`.
    pub panics: Family<ResourceLabel, Counter>,
}

type ApiFn<K> = Box<dyn Fn(Client) -> Api<Decoded<K>> + Send + Sync>;

impl<K: Watched> AnyInformer for Entry<K> {
    fn as_any(&self) -> Arc<dyn Any + Send + Sync> {
        Arc::clone(&self.informer) as Arc<dyn Any + Send + Sync>
    }
    fn resource(&self) -> String {
        self.informer.resource.clone()
    }
    fn has_synced(&self) -> bool {
        self.informer.has_synced()
    }
    fn namespace(&self) -> Option<String> {
        self.namespace.clone()
    }
    fn undecodable(&self) -> (Vec<String>, u64) {
        self.informer.undecodable()
    }
    fn panics(&self) -> u64 {
        self.informer.panics()
    }
    fn watch_trouble(&self) -> Option<WatchTrouble> {
        self.informer.watch_trouble()
    }
    fn start(&self, client: Client, stop: CancellationToken) {
        if self.started.swap(true, Ordering::AcqRel) {
            return;
        }
        let api = (self.api)(client);
        // resourceVersion=0 lists from the API server's watch cache, as client-go informers do.
        let config = watcher::Config::default().any_semantic();
        tokio::spawn(supervise(Arc::clone(&self.informer), api, config, stop));
    }
}

/// Runs an informer's watch until `stop`, starting it again (after a second) if its task ever
/// ends otherwise: it is the only watch of its type, and a cache that silently froze would keep
/// serving its last state as current.
async fn supervise<K: Watched>(
    informer: Arc<Informer<K>>,
    api: Api<Decoded<K>>,
    config: watcher::Config,
    stop: CancellationToken,
) {
    loop {
        let run = Arc::clone(&informer).run(api.clone(), config.clone(), stop.clone());
        match tokio::spawn(run).await {
            Ok(()) => return,
            Err(e) => {
                tracing::error!(resource = %informer.resource, error = %e, "the watch ended abnormally; starting it again in 1s");
                informer.panics_total.fetch_add(1, Ordering::Relaxed);
                informer.panics_counter.inc();
                informer.watch_restarting(true);
            }
        }
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tokio::time::sleep(std::time::Duration::from_secs(1)) => {}
        }
        informer.watch_restarting(false);
    }
}

/// The process's informer registry.
pub struct Informers {
    client: Client,
    transforms: Arc<Transforms>,
    counters: InformerCounters,
    stop: CancellationToken,
    entries: Mutex<Vec<(TypeId, Box<dyn AnyInformer>)>>,
    started: AtomicBool,
}

impl Informers {
    pub fn new(client: Client, stop: CancellationToken) -> Arc<Self> {
        Arc::new(Informers {
            client,
            transforms: Arc::default(),
            counters: InformerCounters::default(),
            stop,
            entries: Mutex::new(Vec::new()),
            started: AtomicBool::new(false),
        })
    }

    /// The shared informer for `K`, created on first request. Its watch starts with
    /// [`Informers::start`] (or at once if the registry already started).
    pub fn get<K: Watched>(&self) -> Arc<Informer<K>> {
        self.get_scoped(None, Box::new(Api::all))
    }

    /// The shared informer for `K` restricted to one namespace (e.g. node Leases in
    /// `kube-node-lease`), so the process neither lists nor needs RBAC for the rest.
    ///
    /// # Panics
    /// If `K` was already requested with another scope: there is one watch per type, and that
    /// is a wiring mistake found at start-up.
    pub fn get_namespaced<K>(&self, namespace: &str) -> Arc<Informer<K>>
    where
        K: Watched + Resource<Scope = k8s_openapi::NamespaceResourceScope>,
    {
        let ns = namespace.to_string();
        self.get_scoped(Some(ns.clone()), Box::new(move |c| Api::namespaced(c, &ns)))
    }

    /// The informer for `K` in whatever scope the controller under test requested it
    /// (cluster-wide if it has not).
    #[cfg(any(test, feature = "testkit"))]
    pub fn testkit_get<K: Watched>(&self) -> Arc<Informer<K>> {
        let existing = crate::lock(&self.entries)
            .iter()
            .find(|(t, _)| *t == TypeId::of::<K>())
            .map(|(_, e)| {
                e.as_any()
                    .downcast::<Informer<K>>()
                    .expect("type id matches")
            });
        existing.unwrap_or_else(|| self.get::<K>())
    }

    fn get_scoped<K: Watched>(&self, namespace: Option<String>, api: ApiFn<K>) -> Arc<Informer<K>> {
        let mut entries = crate::lock(&self.entries);
        let id = TypeId::of::<K>();
        if let Some((_, e)) = entries.iter().find(|(t, _)| *t == id) {
            assert_eq!(
                e.namespace(),
                namespace,
                "{} requested with two scopes; one watch per type",
                e.resource()
            );
            return e
                .as_any()
                .downcast::<Informer<K>>()
                .expect("type id matches");
        }
        let entry = Entry {
            informer: Arc::new(Informer::<K>::new(
                Arc::clone(&self.transforms),
                &self.counters,
            )),
            started: AtomicBool::new(false),
            namespace,
            api,
        };
        let informer = Arc::clone(&entry.informer);
        if self.started.load(Ordering::Acquire) {
            entry.start(self.client.clone(), self.stop.clone());
        }
        entries.push((id, Box::new(entry)));
        informer
    }

    /// Adds an observer of every object of every type (before the caches start).
    pub fn observe(&self, observer: Arc<dyn MetaObserver>) {
        crate::write(&self.transforms.observers).push(observer);
    }

    /// Sets `K`'s transform (before the caches start); a later one replaces it.
    pub fn transform<K: Watched>(&self, f: TransformFn<K>) {
        crate::write(&self.transforms.by_type).insert(TypeId::of::<K>(), Arc::new(f));
    }

    /// The registry's one `T`, made on first use: state a transform shares with the code that
    /// configures it (e.g. the union of declared pod fields).
    pub fn extension<T: Default + Send + Sync + 'static>(&self) -> Arc<T> {
        let any = Arc::clone(
            crate::lock(&self.transforms.extensions)
                .entry(TypeId::of::<T>())
                .or_insert_with(|| Arc::new(T::default())),
        );
        any.downcast::<T>()
            .unwrap_or_else(|_| unreachable!("extensions are keyed by their own type"))
    }

    pub fn start(&self) {
        self.started.store(true, Ordering::Release);
        for (_, e) in crate::lock(&self.entries).iter() {
            e.start(self.client.clone(), self.stop.clone());
        }
    }

    /// The resources being watched (plural names).
    pub fn resources(&self) -> Vec<String> {
        crate::lock(&self.entries)
            .iter()
            .map(|(_, e)| e.resource())
            .collect()
    }

    /// The counters every informer of the registry shares (register them once).
    pub fn counters(&self) -> InformerCounters {
        self.counters.clone()
    }

    /// Per resource with objects skipped now: how many now, and how many skips since start.
    pub fn undecodable(&self) -> Vec<(String, usize, u64)> {
        crate::lock(&self.entries)
            .iter()
            .filter_map(|(_, e)| {
                let (now, total) = e.undecodable();
                (total > 0).then(|| (e.resource(), now.len(), total))
            })
            .collect()
    }

    /// Per resource whose watch skipped events because taking them panicked: how many.
    pub fn panics(&self) -> Vec<(String, u64)> {
        crate::lock(&self.entries)
            .iter()
            .filter_map(|(_, e)| {
                let n = e.panics();
                (n > 0).then(|| (e.resource(), n))
            })
            .collect()
    }

    /// Watches failing now or being started again.
    pub fn watch_troubles(&self) -> Vec<WatchTrouble> {
        crate::lock(&self.entries)
            .iter()
            .filter_map(|(_, e)| e.watch_trouble())
            .collect()
    }

    /// Resources whose first list has not completed.
    pub fn unsynced(&self) -> Vec<String> {
        crate::lock(&self.entries)
            .iter()
            .filter(|(_, e)| !e.has_synced())
            .map(|(_, e)| e.resource())
            .collect()
    }

    pub fn all_synced(&self) -> bool {
        self.unsynced().is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cache::pod::{INDEX_POD_NODE, pod_by_node};
    use crate::cache::projection::PodFields;
    use crate::meta::keys::split_key;

    #[test]
    fn a_refused_streaming_list_is_told_from_other_watch_errors() {
        let status = |code| {
            Box::new(kube::core::Status {
                code,
                ..kube::core::Status::failure("m", "Invalid")
            })
        };
        let start = |code| watcher::Error::WatchStartFailed(kube::Error::Api(status(code)));
        assert!(streaming_refused(&start(422)));
        assert!(streaming_refused(&start(400)));
        assert!(streaming_refused(&watcher::Error::WatchError(status(422))));
        assert!(!streaming_refused(&start(403)));
        assert!(!streaming_refused(&start(500)));
        assert!(!streaming_refused(&watcher::Error::WatchError(status(410))));
    }
    use crate::cache::pod::{Pod, PodSpec};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{
        ManagedFieldsEntry, ObjectMeta, OwnerReference,
    };

    fn pod(name: &str, rv: &str, node: Option<&str>, owner: Option<&str>) -> Pod {
        Pod {
            metadata: ObjectMeta {
                name: Some(name.into()),
                namespace: Some("ns".into()),
                resource_version: Some(rv.into()),
                managed_fields: Some(vec![ManagedFieldsEntry::default()]),
                owner_references: owner.map(|uid| {
                    vec![OwnerReference {
                        uid: uid.into(),
                        controller: Some(true),
                        ..Default::default()
                    }]
                }),
                ..Default::default()
            },
            spec: Some(PodSpec {
                node_name: node.map(Into::into),
                ..Default::default()
            }),
            status: None,
        }
    }

    fn recorded(inf: &Informer<Pod>) -> Arc<Mutex<Vec<String>>> {
        let log = Arc::new(Mutex::new(Vec::new()));
        let l = Arc::clone(&log);
        inf.on_change(move |c| {
            let s = match c {
                Change::Added(p) => format!("add {}", p.name_any()),
                Change::Updated { old, new } => {
                    format!(
                        "update {} {}->{}",
                        new.name_any(),
                        old.resource_version().unwrap(),
                        new.resource_version().unwrap()
                    )
                }
                Change::Deleted(p) => format!("delete {}", p.name_any()),
            };
            l.lock().unwrap().push(s);
        });
        log
    }

    /// A run of watch errors is told while fresh, fails readiness once it spans a minute, and is
    /// forgotten 45 s after the last (a quiet watch that reconnected delivers nothing to end it).
    #[test]
    fn a_failing_watch_is_told_and_unready_after_a_minute() {
        let t0 = Instant::now();
        let at = |s: u64| t0 + Duration::from_secs(s);
        let mut h = WatchHealth::default();
        assert_eq!(h.trouble("leases", at(0)), None);
        h.since = Some(at(0));
        h.errors = 1;
        h.last = Some((at(0), "connection refused".into()));
        let t = h.trouble("leases", at(10)).expect("failing");
        assert!(!t.unready, "{t:?}");
        assert!(
            t.message
                .contains("1 error(s) in a row over 0 s, the last 10 s ago: connection refused"),
            "{t:?}"
        );
        assert_eq!(
            h.trouble("leases", at(46)),
            None,
            "an old error is not a failing watch"
        );
        h.errors = 4;
        h.last = Some((at(61), "connection refused".into()));
        assert!(h.trouble("leases", at(70)).expect("failing").unready);
        h.restarting = true;
        assert!(h.trouble("leases", at(500)).expect("restarting").unready);
    }

    /// An error long after the last one starts a new run: a watch that reconnected quietly
    /// must not look as if it had failed all along.
    #[tokio::test(start_paused = true)]
    async fn a_new_error_after_a_quiet_spell_starts_a_new_run() {
        use k8s_openapi::api::batch::v1::Job;
        let informers = crate::cache::offline_registry();
        let jobs = informers.get::<Job>();
        jobs.watch_failed("connection refused".into());
        tokio::time::advance(Duration::from_secs(3_600)).await;
        assert_eq!(
            jobs.watch_trouble(),
            None,
            "an hour-old error is not a failing watch"
        );
        jobs.watch_failed("connection refused".into());
        let t = jobs.watch_trouble().expect("failing again");
        assert!(!t.unready, "{t:?}");
        assert!(t.message.contains("1 error(s) in a row over 0 s"), "{t:?}");
    }

    /// What the observers are told changed: against the cached copy, by part, and nothing for
    /// an object the cache does not hold.
    #[test]
    fn observers_are_told_which_part_an_event_changed() {
        use k8s_openapi::api::batch::v1::{Job, JobSpec, JobStatus};
        struct Told(Mutex<Vec<(bool, bool)>>);
        impl MetaObserver for Told {
            fn observe(&self, _: &str, _: &ObjectMeta, changed: &dyn Fn(Part) -> bool) {
                crate::lock(&self.0).push((changed(Part::Status), changed(Part::Content)));
            }
        }
        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        let _guard = rt.enter();
        let informers = crate::cache::offline_registry();
        let told = Arc::new(Told(Mutex::new(Vec::new())));
        informers.observe(Arc::clone(&told) as Arc<dyn MetaObserver>);
        let jobs = informers.get::<Job>();
        let job = |rv: &str, parallelism: i32, active: i32| Job {
            metadata: ObjectMeta {
                namespace: Some("ns".into()),
                name: Some("j".into()),
                resource_version: Some(rv.into()),
                managed_fields: Some(vec![ManagedFieldsEntry {
                    manager: Some(rv.into()),
                    ..Default::default()
                }]),
                ..Default::default()
            },
            spec: Some(JobSpec {
                parallelism: Some(parallelism),
                ..Default::default()
            }),
            status: Some(JobStatus {
                active: Some(active),
                ..Default::default()
            }),
        };
        jobs.testkit_apply(job("1", 1, 0));
        jobs.testkit_apply(job("2", 1, 1));
        jobs.testkit_apply(job("3", 2, 1));
        jobs.testkit_apply(job("4", 2, 1));
        assert_eq!(
            *crate::lock(&told.0),
            vec![(false, false), (true, false), (false, true), (false, false)],
            "new; status; spec; only metadata"
        );
    }

    #[test]
    fn the_pod_cache_keeps_the_union_of_declared_fields() {
        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        let _guard = rt.enter();
        let informers = crate::cache::offline_registry();
        informers.read_pod_fields(PodFields::TOLERATIONS);
        informers.read_pod_fields(PodFields::CONTAINER_STATUSES);
        let pods = informers.get::<Pod>();
        let mut p = pod("a", "1", Some("n1"), None);
        p.spec.as_mut().unwrap().tolerations = Some(vec![Default::default()]);
        p.spec.as_mut().unwrap().volumes = Some(vec![Default::default()]);
        pods.testkit_apply(p);
        let cached = pods.get("ns/a").unwrap();
        let spec = cached.spec.as_ref().unwrap();
        assert!(spec.tolerations.is_some(), "declared by one controller");
        assert!(spec.volumes.is_none(), "declared by none");
        assert_eq!(
            informers.pod_fields(),
            PodFields::TOLERATIONS | PodFields::CONTAINER_STATUSES
        );
    }

    #[test]
    fn events_indexes_and_stripping() {
        let inf = Informer::<Pod>::new(Arc::default(), &InformerCounters::default());
        inf.add_index(INDEX_POD_NODE, pod_by_node);
        inf.add_index(INDEX_CONTROLLER_UID, by_controller_uid);
        let log = recorded(&inf);
        inf.apply(inf.strip(pod("a", "1", Some("n1"), Some("u1"))));
        inf.apply(inf.strip(pod("b", "1", Some("n1"), None)));
        inf.apply(inf.strip(pod("a", "2", Some("n2"), Some("u1"))));
        assert!(inf.get("ns/a").unwrap().metadata.managed_fields.is_none());
        let names = |v: Vec<Arc<Pod>>| {
            let mut n: Vec<String> = v.iter().map(|p| p.name_any()).collect();
            n.sort();
            n
        };
        assert_eq!(names(inf.by_index(INDEX_POD_NODE, "n1")), vec!["b"]);
        assert_eq!(names(inf.by_index(INDEX_POD_NODE, "n2")), vec!["a"]);
        assert_eq!(names(inf.by_index(INDEX_CONTROLLER_UID, "u1")), vec!["a"]);
        inf.delete(pod("a", "3", Some("n2"), Some("u1")));
        assert!(inf.by_index(INDEX_POD_NODE, "n2").is_empty());
        assert!(inf.by_index(INDEX_CONTROLLER_UID, "u1").is_empty());
        // Deleting an unknown object emits nothing.
        inf.delete(pod("zzz", "1", None, None));
        assert_eq!(
            *log.lock().unwrap(),
            vec!["add a", "add b", "update a 1->2", "delete a"]
        );
    }

    #[test]
    fn relist_emits_only_differences_and_marks_synced() {
        let inf = Informer::<Pod>::new(Arc::default(), &InformerCounters::default());
        inf.add_index(INDEX_NAMESPACE, by_namespace);
        let log = recorded(&inf);
        assert!(!inf.has_synced());
        inf.replace(HashMap::from([
            ("ns/a".to_string(), pod("a", "1", None, None)),
            ("ns/b".to_string(), pod("b", "1", None, None)),
        ]));
        assert!(inf.has_synced());
        let before = inf.get("ns/a").unwrap();
        inf.replace(HashMap::from([
            ("ns/a".to_string(), pod("a", "1", None, None)),
            ("ns/c".to_string(), pod("c", "1", None, None)),
        ]));
        assert!(
            Arc::ptr_eq(&before, &inf.get("ns/a").unwrap()),
            "unchanged object replaced"
        );
        let mut got = log.lock().unwrap().clone();
        got[..2].sort();
        got[2..].sort();
        assert_eq!(got, vec!["add a", "add b", "add c", "delete b"]);
        assert_eq!(inf.by_index(INDEX_NAMESPACE, "ns").len(), 2);
    }

    #[test]
    fn an_undecodable_object_is_skipped_counted_and_forgotten_once_it_decodes() {
        let counters = InformerCounters::default();
        let inf = Informer::<Pod>::new(Arc::default(), &counters);
        inf.apply(pod("a", "5", None, None));
        let bad = Decoded::<Pod>::from_json(
            r#"{"metadata":{"name":"a","namespace":"ns","resourceVersion":"6"},"spec":{"containers":7}}"#,
        )
        .unwrap();
        assert_eq!(inf.decoded(bad).unwrap_err(), "ns/a");
        assert_eq!(inf.newest_resource_version(), 6, "its version still counts");
        assert_eq!(
            inf.get("ns/a").unwrap().resource_version().as_deref(),
            Some("5")
        );
        let (now, total) = inf.undecodable();
        assert_eq!((now.len(), total), (1, 1));
        let metric = counters.undecodable.get_or_create(&ResourceLabel {
            resource: "pods".into(),
        });
        assert_eq!(metric.get(), 1);
        assert!(inf.decoded(Decoded::Ok(pod("a", "7", None, None))).is_ok());
        assert_eq!(inf.undecodable(), (vec![], 1));
    }

    #[test]
    fn a_panicking_index_function_leaves_one_object_out_of_its_index_only() {
        let inf = Informer::<Pod>::new(Arc::default(), &InformerCounters::default());
        inf.add_index("by-name", |p: &Pod| {
            let name = p.metadata.name.clone().unwrap_or_default();
            assert!(name != "bad", "index function panics");
            vec![name]
        });
        inf.apply(pod("bad", "1", None, None));
        inf.apply(pod("good", "2", None, None));
        assert_eq!(inf.len(), 2, "both cached");
        assert_eq!(inf.by_index("by-name", "good").len(), 1);
        assert!(inf.by_index("by-name", "bad").is_empty());
        assert_eq!(inf.panics(), 1);
        inf.delete(pod("bad", "3", None, None));
        assert_eq!(inf.len(), 1);
        assert_eq!(inf.panics(), 2, "its removal ran the function again");
    }

    #[test]
    fn keys() {
        let p = pod("a", "1", None, None);
        assert_eq!(object_key(&p), "ns/a");
        assert_eq!(split_key("ns/a"), ("ns", "a"));
        assert_eq!(split_key("node-1"), ("", "node-1"));
    }
}
