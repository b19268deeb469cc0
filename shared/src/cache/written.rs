//! Read-your-writes: the one record of what a controller wrote, per owner.
//!
//! The caches lag our own writes. A sync that acts on a cache not yet showing its last writes
//! would double a create or a delete, or undo a status it just wrote. Each controller keeps one
//! [`Written`]; each write it makes is noted under the owner whose sync made it (the owner key
//! is the controller's choice: its queue key, or a UID where a recreated object is another
//! owner). The record answers three questions, and one [`Written::forget`] drops all of it:
//!
//! - [`Written::behind`]: does every informer this owner wrote through show that write yet?
//!   Each note is the resourceVersion the API server returned, typed by the informer it must
//!   reach (KEP-5647's consistency check, widened to every type a controller writes). The sync
//!   answers `Next::Stale { resource }` and the runtime counts it and runs the key again.
//! - [`Written::freshest`]: the object our last write returned, while the cache still holds a
//!   version our writes replaced (for controllers that act on their own status at once).
//! - [`Written::satisfied`]: client-go's `ControllerExpectations`, the creates and deletes this
//!   owner still expects to observe.
//!
//! A note unconfirmed for [`GIVE_UP`] is dropped, and expectations expire after
//! [`EXPECTATIONS_TTL`]: a lost watch event must not stall an owner forever.

use crate::cache::informers::{Informer, Watched, parse_rv};
use kube::Resource;
use std::any::{Any, TypeId};
use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::Duration;
use tokio::time::Instant;

/// How long an unconfirmed write holds its owner back.
pub const GIVE_UP: Duration = Duration::from_secs(30);

/// client-go's `ExpectationsTimeout`.
pub const EXPECTATIONS_TTL: Duration = Duration::from_secs(5 * 60);

/// A handful of back-to-back writes of one object at most; older versions are long cached.
const REMEMBERED: usize = 8;

/// What a note needs of the informer it waits on.
trait Delivered: Send + Sync {
    fn newest(&self) -> u64;
}

impl<K: Watched> Delivered for Informer<K> {
    fn newest(&self) -> u64 {
        self.newest_resource_version()
    }
}

/// A name of `K` for the stale-skip metrics' labels. Every type the API server serves names its
/// group and plural statically; an owned name (none today) is leaked once per note, which a
/// note's dedup per informer bounds.
fn name(n: std::borrow::Cow<'static, str>) -> &'static str {
    match n {
        std::borrow::Cow::Borrowed(s) => s,
        std::borrow::Cow::Owned(s) => Box::leak(s.into_boxed_str()),
    }
}

struct Note {
    informer: TypeId,
    group: &'static str,
    resource: &'static str,
    via: Weak<dyn Delivered>,
    rv: u64,
    at: Instant,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Expected {
    add: i64,
    del: i64,
    at: Instant,
}

#[derive(Default)]
struct Owner {
    notes: Vec<Note>,
    expected: Option<Expected>,
}

impl Owner {
    fn is_empty(&self) -> bool {
        self.notes.is_empty() && self.expected.is_none()
    }
}

/// One object our writes replaced: the versions they replaced and what the last returned.
struct Object {
    owner: String,
    replaced: Vec<String>,
    last: Arc<dyn Any + Send + Sync>,
}

#[derive(Default)]
struct State {
    owners: HashMap<String, Owner>,
    /// By informer type and UID: a recreated object with the same name is another object.
    objects: HashMap<(TypeId, String), Object>,
}

/// The owner's caches do not yet show one of its writes (see [`Written::behind`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Behind {
    /// The API group of the informer that is behind (`""` for the core group).
    pub group: &'static str,
    /// The plural name of the informer that is behind, e.g. `pods`.
    pub resource: &'static str,
    /// The resourceVersion the write returned and the newest the informer delivered (both 0
    /// from [`Behind::of`]).
    pub wrote: u64,
    pub seen: u64,
}

impl Behind {
    /// `K`'s cache is behind by a check of the controller's own that is not by resourceVersion
    /// (upstream's EndpointSlice tracker compares generations, ES-15).
    pub fn of<K: Watched>() -> Behind {
        Behind {
            group: name(K::group(&())),
            resource: name(K::plural(&())),
            wrote: 0,
            seen: 0,
        }
    }
}

/// One controller's record of its own writes (see the module documentation).
#[derive(Default)]
pub struct Written {
    state: Mutex<State>,
    expectations_ttl: Option<Duration>,
}

fn uid<K: Resource>(obj: &K) -> &str {
    obj.meta().uid.as_deref().unwrap_or_default()
}

fn rv<K: Resource>(obj: &K) -> Option<&str> {
    obj.meta().resource_version.as_deref()
}

impl Written {
    pub fn new() -> Self {
        Written {
            state: Mutex::default(),
            expectations_ttl: Some(EXPECTATIONS_TTL),
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        crate::lock(&self.state)
    }

    /// A write for `owner` of `via`'s resource returned `version` (a create's or update's
    /// object's, a delete's): the owner's next sync waits until `via` has delivered it. A version
    /// absent or not numeric (no Kubernetes API server sends one) is nothing to wait for.
    pub fn wrote<K: Watched>(&self, owner: &str, via: &Arc<Informer<K>>, version: Option<&str>) {
        let Some(version) = version.and_then(parse_rv) else {
            return;
        };
        let via: Arc<dyn Delivered> = Arc::clone(via) as Arc<dyn Delivered>;
        let via = Arc::downgrade(&via);
        let informer = TypeId::of::<K>();
        let mut state = self.lock();
        let notes = &mut state.owners.entry(owner.to_string()).or_default().notes;
        match notes.iter_mut().find(|n| n.informer == informer) {
            Some(n) if n.rv >= version => {}
            Some(n) => {
                n.rv = version;
                n.at = Instant::now();
            }
            None => notes.push(Note {
                informer,
                group: name(K::group(&())),
                resource: name(K::plural(&())),
                via,
                rv: version,
                at: Instant::now(),
            }),
        }
    }

    /// Our write for `owner` turned `before` (the version we wrote from) into `after` (what the
    /// API server returned): [`Self::freshest`] serves `after` until the cache moves past
    /// `before`. (A controller that would rather wait for the cache notes [`Self::wrote`].)
    pub fn replaced<K: Watched>(&self, owner: &str, before: &K, after: K) {
        let Some(replaced) = rv(before) else { return };
        let id = (TypeId::of::<K>(), uid(before).to_string());
        let after: Arc<dyn Any + Send + Sync> = Arc::new(after);
        let mut state = self.lock();
        let object = state.objects.entry(id).or_insert_with(|| Object {
            owner: owner.to_string(),
            replaced: Vec::new(),
            last: Arc::clone(&after),
        });
        if object.replaced.len() >= REMEMBERED {
            object.replaced.remove(0);
        }
        object.replaced.push(replaced.to_string());
        object.owner = owner.to_string();
        object.last = after;
    }

    /// The freshest copy known of `cached`: the object our last write returned while the cache
    /// still holds a version our writes replaced, else the cached one (and what was remembered
    /// of it is dropped: the cache has caught up, or someone else wrote since).
    pub fn freshest<K: Watched>(&self, cached: Arc<K>) -> Arc<K> {
        let id = (TypeId::of::<K>(), uid(cached.as_ref()).to_string());
        let mut state = self.lock();
        let Some(object) = state.objects.get(&id) else {
            return cached;
        };
        let ours = rv(cached.as_ref()).is_some_and(|v| object.replaced.iter().any(|r| r == v));
        if ours && let Ok(last) = Arc::clone(&object.last).downcast::<K>() {
            return last;
        }
        state.objects.remove(&id);
        cached
    }

    /// Whether a cache is behind one of `owner`'s writes: the first informer that has not yet
    /// delivered the version a write returned. Confirmed notes, expired ones (logged) and
    /// notes of an informer that is gone are dropped.
    pub fn behind(&self, owner: &str) -> Option<Behind> {
        let mut state = self.lock();
        let record = state.owners.get_mut(owner)?;
        let now = Instant::now();
        let mut behind = None;
        record.notes.retain(|n| {
            let Some(via) = n.via.upgrade() else {
                return false;
            };
            let seen = via.newest();
            if seen >= n.rv {
                return false;
            }
            if now.saturating_duration_since(n.at) >= GIVE_UP {
                tracing::warn!(
                    owner,
                    resource = n.resource,
                    wrote = n.rv,
                    seen,
                    "a write was never seen by the watch; acting anyway"
                );
                return false;
            }
            behind.get_or_insert(Behind {
                group: n.group,
                resource: n.resource,
                wrote: n.rv,
                seen,
            });
            true
        });
        if record.is_empty() {
            state.owners.remove(owner);
        }
        behind
    }

    /// client-go `SetExpectations`: `owner` now expects to observe `add` creations and `del`
    /// deletions.
    pub fn expect(&self, owner: &str, add: i64, del: i64) {
        let mut state = self.lock();
        state.owners.entry(owner.to_string()).or_default().expected = Some(Expected {
            add,
            del,
            at: Instant::now(),
        });
    }

    /// client-go `LowerExpectations` (a negative count raises, without resetting the clock, as
    /// `RaiseExpectations`); nothing when `owner` expects nothing.
    pub fn lower(&self, owner: &str, add: i64, del: i64) {
        let mut state = self.lock();
        if let Some(e) = state
            .owners
            .get_mut(owner)
            .and_then(|o| o.expected.as_mut())
        {
            e.add -= add;
            e.del -= del;
        }
    }

    /// A creation for `owner` was observed in the cache, or one it expected failed.
    pub fn creation_observed(&self, owner: &str) {
        self.lower(owner, 1, 0);
    }

    /// A deletion for `owner` was observed in the cache, or one it expected failed.
    pub fn deletion_observed(&self, owner: &str) {
        self.lower(owner, 0, 1);
    }

    /// client-go `SatisfiedExpectations`: no expectations, all observed, or expired.
    pub fn satisfied(&self, owner: &str) -> bool {
        let state = self.lock();
        match state.owners.get(owner).and_then(|o| o.expected) {
            None => true,
            Some(e) => {
                (e.add <= 0 && e.del <= 0)
                    || self
                        .expectations_ttl
                        .is_some_and(|ttl| e.at.elapsed() > ttl)
            }
        }
    }

    /// The creations and deletions `owner` still expects, if it expects any.
    pub fn expected(&self, owner: &str) -> Option<(i64, i64)> {
        let state = self.lock();
        state
            .owners
            .get(owner)
            .and_then(|o| o.expected)
            .map(|e| (e.add, e.del))
    }

    /// Drops everything remembered for `owner`: its notes, its expectations and the objects
    /// its writes replaced (the owner is gone, or finished with).
    pub fn forget(&self, owner: &str) {
        let mut state = self.lock();
        state.owners.remove(owner);
        state.objects.retain(|_, o| o.owner != owner);
    }

    /// How many owners and objects are remembered (a bound the tests check).
    pub fn len(&self) -> usize {
        let state = self.lock();
        state.owners.len() + state.objects.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cache::informers::Informers;
    use k8s_openapi::api::core::v1::{Node, Pod};
    use kube::api::ObjectMeta;

    fn meta(uid: &str, rv: &str) -> ObjectMeta {
        ObjectMeta {
            name: Some("n".into()),
            uid: Some(uid.into()),
            resource_version: Some(rv.into()),
            ..Default::default()
        }
    }

    fn node(uid: &str, rv: &str) -> Node {
        Node {
            metadata: meta(uid, rv),
            ..Default::default()
        }
    }

    fn pod(rv: &str) -> Pod {
        Pod {
            metadata: meta("p", rv),
            ..Default::default()
        }
    }

    fn informers() -> Arc<Informers> {
        Informers::new(
            kube::Client::try_from(kube::Config::new("http://127.0.0.1:1".parse().unwrap()))
                .unwrap(),
            tokio_util::sync::CancellationToken::new(),
        )
    }

    #[tokio::test(start_paused = true)]
    async fn an_owner_is_behind_until_each_informer_it_wrote_through_delivered_its_write() {
        let reg = informers();
        let (pods, nodes) = (reg.testkit_get::<Pod>(), reg.testkit_get::<Node>());
        let w = Written::new();
        w.wrote("ns/web", &pods, Some("10"));
        w.wrote("ns/web", &pods, Some("7"));
        w.wrote("ns/web", &nodes, Some("12"));
        w.wrote("ns/web", &pods, None);
        pods.testkit_apply(pod("9"));
        let b = w.behind("ns/web").unwrap();
        assert_eq!((b.resource, b.wrote, b.seen), ("pods", 10, 9));
        pods.testkit_apply(pod("10"));
        assert_eq!(w.behind("ns/web").unwrap().resource, "nodes");
        nodes.testkit_apply(node("n", "12"));
        assert_eq!(w.behind("ns/web"), None);
        assert!(w.is_empty(), "a confirmed owner is dropped");
        assert_eq!(w.behind("ns/other"), None);
    }

    #[tokio::test(start_paused = true)]
    async fn an_unconfirmed_write_stops_holding_its_owner_back() {
        let reg = informers();
        let pods = reg.testkit_get::<Pod>();
        let w = Written::new();
        w.wrote("ns/web", &pods, Some("10"));
        assert!(w.behind("ns/web").is_some());
        tokio::time::advance(GIVE_UP).await;
        assert_eq!(w.behind("ns/web"), None);
        w.wrote("ns/web", &pods, Some("11"));
        w.forget("ns/web");
        assert_eq!(w.behind("ns/web"), None);
        // An informer that is gone holds nobody back.
        w.wrote("ns/web", &pods, Some("12"));
        drop((pods, reg));
        assert_eq!(w.behind("ns/web"), None);
    }

    #[tokio::test(start_paused = true)]
    async fn freshest_serves_our_write_until_the_cache_catches_up() {
        let w = Written::new();
        w.replaced("u", &node("u", "1"), node("u", "2"));
        w.replaced("u", &node("u", "2"), node("u", "3"));
        let rv_of = |n: Arc<Node>| n.metadata.resource_version.clone().unwrap();
        assert_eq!(rv_of(w.freshest(Arc::new(node("u", "1")))), "3");
        assert_eq!(rv_of(w.freshest(Arc::new(node("u", "2")))), "3");
        // Another object with the same name is not ours.
        assert_eq!(rv_of(w.freshest(Arc::new(node("other", "1")))), "1");
        // Caught up: the cache wins and the object is dropped.
        assert_eq!(rv_of(w.freshest(Arc::new(node("u", "3")))), "3");
        assert!(w.is_empty());
    }

    #[tokio::test(start_paused = true)]
    async fn forget_drops_the_objects_an_owner_replaced() {
        let w = Written::new();
        w.replaced("nm-a", &node("u", "1"), node("u", "2"));
        w.forget("nm-a");
        assert!(w.is_empty());
        assert_eq!(
            w.freshest(Arc::new(node("u", "1")))
                .metadata
                .resource_version
                .as_deref(),
            Some("1")
        );
    }

    #[test]
    fn no_expectations_are_satisfied() {
        assert!(Written::new().satisfied("ns/a"));
    }

    #[test]
    fn creations_must_be_observed() {
        let w = Written::new();
        w.expect("ns/a", 2, 0);
        assert!(!w.satisfied("ns/a"));
        w.creation_observed("ns/a");
        assert!(!w.satisfied("ns/a"));
        w.creation_observed("ns/a");
        assert!(w.satisfied("ns/a"));
        // Extra observations (pods adopted later) keep it satisfied.
        w.creation_observed("ns/a");
        assert!(w.satisfied("ns/a"));
        assert_eq!(w.expected("ns/a"), Some((-1, 0)));
    }

    #[test]
    fn deletions_raise_and_lower() {
        let w = Written::new();
        w.expect("k", 0, 1);
        w.lower("k", -1, 0);
        assert_eq!(w.expected("k"), Some((1, 1)));
        w.deletion_observed("k");
        assert!(!w.satisfied("k"));
        w.creation_observed("k");
        assert!(w.satisfied("k"));
        // Lowering without a record does nothing (as client-go).
        w.lower("other", -5, 0);
        assert!(w.satisfied("other"));
        assert_eq!(w.expected("other"), None);
    }

    #[tokio::test(start_paused = true)]
    async fn expectations_expire() {
        let w = Written::new();
        w.expect("k", 3, 0);
        tokio::time::advance(Duration::from_secs(299)).await;
        assert!(!w.satisfied("k"));
        tokio::time::advance(Duration::from_secs(2)).await;
        assert!(w.satisfied("k"));
        w.forget("k");
        assert_eq!(w.expected("k"), None);
    }
}
