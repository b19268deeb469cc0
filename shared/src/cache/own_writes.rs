//! Read-your-own-writes: the caches lag our own writes, and a sync that acts on a version our
//! last write replaced would undo or repeat it. One store per controller and type, keyed by the
//! object's UID (a recreated object with the same name is another object), remembers the
//! versions our writes replaced and the object the last write returned.

use kube::Resource;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};

/// A handful of back-to-back writes at most; older versions are long in the cache.
const REMEMBERED: usize = 8;

struct Written<K> {
    replaced: Vec<String>,
    last: Arc<K>,
}

pub struct OwnWrites<K> {
    map: Mutex<HashMap<String, Written<K>>>,
}

impl<K> Default for OwnWrites<K> {
    fn default() -> Self {
        OwnWrites {
            map: Mutex::new(HashMap::new()),
        }
    }
}

fn uid<K: Resource>(obj: &K) -> &str {
    obj.meta().uid.as_deref().unwrap_or_default()
}

fn rv<K: Resource>(obj: &K) -> Option<&str> {
    obj.meta().resource_version.as_deref()
}

impl<K: Resource> OwnWrites<K> {
    pub fn new() -> Self {
        Self::default()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Written<K>>> {
        self.map.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Our write turned `before` (the version we wrote from) into `after` (what the API server
    /// returned).
    pub fn record(&self, before: &K, after: K) {
        let Some(replaced) = rv(before) else { return };
        let mut map = self.lock();
        let after = Arc::new(after);
        let w = map
            .entry(uid(before).to_string())
            .or_insert_with(|| Written {
                replaced: Vec::new(),
                last: Arc::clone(&after),
            });
        if w.replaced.len() >= REMEMBERED {
            w.replaced.remove(0);
        }
        w.replaced.push(replaced.to_string());
        w.last = after;
    }

    /// Whether `cached` is a version one of our writes replaced.
    pub fn is_stale(&self, cached: &K) -> bool {
        let map = self.lock();
        match (map.get(uid(cached)), rv(cached)) {
            (Some(w), Some(v)) => w.replaced.iter().any(|r| r == v),
            _ => false,
        }
    }

    /// The freshest copy known: the object our last write returned while the cache still holds
    /// a version our writes replaced, else the cached one (and the record is dropped: the cache
    /// has caught up, or someone else wrote since).
    pub fn freshest(&self, cached: Arc<K>) -> Arc<K> {
        let mut map = self.lock();
        let id = uid(cached.as_ref()).to_string();
        match map.get(&id) {
            Some(w) if rv(cached.as_ref()).is_some_and(|v| w.replaced.iter().any(|r| r == v)) => {
                Arc::clone(&w.last)
            }
            Some(_) => {
                map.remove(&id);
                cached
            }
            None => cached,
        }
    }

    /// Drops what is remembered of one object (deleted, or finished with).
    pub fn forget(&self, uid: &str) {
        self.lock().remove(uid);
    }

    pub fn len(&self) -> usize {
        self.lock().len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::Node;
    use kube::api::ObjectMeta;

    fn node(uid: &str, rv: &str) -> Node {
        Node {
            metadata: ObjectMeta {
                name: Some("n".into()),
                uid: Some(uid.into()),
                resource_version: Some(rv.into()),
                ..Default::default()
            },
            ..Default::default()
        }
    }

    #[test]
    fn serves_our_write_until_the_cache_catches_up() {
        let w = OwnWrites::new();
        w.record(&node("u", "1"), node("u", "2"));
        w.record(&node("u", "2"), node("u", "3"));
        assert!(w.is_stale(&node("u", "1")));
        assert!(w.is_stale(&node("u", "2")));
        assert_eq!(
            w.freshest(Arc::new(node("u", "1")))
                .metadata
                .resource_version
                .as_deref(),
            Some("3")
        );
        // Another object with the same name is not ours.
        assert!(!w.is_stale(&node("other", "1")));
        // Caught up: the cache wins and the record goes.
        assert_eq!(
            w.freshest(Arc::new(node("u", "3")))
                .metadata
                .resource_version
                .as_deref(),
            Some("3")
        );
        assert!(w.is_empty());
    }
}
