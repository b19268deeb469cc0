//! Per-Service memory between syncs: the slices this controller wrote (ES-15, read-your-writes
//! against a stale cache) and the readiness times already reported (ES-17, the trigger-time
//! annotation). Shared by the mirroring controller, keyed by Endpoints name there.

use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::jiff::Timestamp;
use std::collections::HashMap;
use std::sync::Mutex;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Expect {
    Generation(i64),
    Deletion,
}

/// [util/endpointslice_tracker.go]: per owner key (`namespace/name` from the slice's
/// service-name label), the generation of each slice as written, or that its deletion is
/// expected.
#[derive(Debug, Default)]
pub struct SliceTracker {
    by_owner: Mutex<HashMap<String, HashMap<String, Expect>>>,
    /// Owners whose last sync was held back by a stale cache: the next slice event for them
    /// (the watch catching up) syncs them again at once instead of after their backoff.
    held: Mutex<std::collections::HashSet<String>>,
}

fn owner_key(slice: &EndpointSlice) -> String {
    let svc = slice
        .metadata
        .labels
        .as_ref()
        .and_then(|l| l.get(crate::endpoints::LABEL_SERVICE_NAME))
        .map(String::as_str)
        .unwrap_or_default();
    format!(
        "{}/{svc}",
        slice.metadata.namespace.as_deref().unwrap_or_default()
    )
}

fn uid(slice: &EndpointSlice) -> String {
    slice.metadata.uid.clone().unwrap_or_default()
}

fn generation(slice: &EndpointSlice) -> i64 {
    slice.metadata.generation.unwrap_or(0)
}

impl SliceTracker {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, HashMap<String, Expect>>> {
        self.by_owner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Whether the slice is tracked.
    pub fn has(&self, slice: &EndpointSlice) -> bool {
        self.lock()
            .get(&owner_key(slice))
            .is_some_and(|m| m.contains_key(&uid(slice)))
    }

    /// A slice event is news unless it is a write of ours already known (same or older
    /// generation) [ShouldSync].
    pub fn should_sync(&self, slice: &EndpointSlice) -> bool {
        match self
            .lock()
            .get(&owner_key(slice))
            .and_then(|m| m.get(&uid(slice)))
        {
            // Upstream stores deletion as generation -1, so any update of it is news.
            None | Some(Expect::Deletion) => true,
            Some(Expect::Generation(g)) => generation(slice) > *g,
        }
    }

    /// ES-15 [StaleSlices]: the cache is behind our writes for this owner: a slice older than
    /// written, one expected deleted still there, or one written not there yet.
    pub fn stale(&self, owner: &str, cached: &[std::sync::Arc<EndpointSlice>]) -> bool {
        let all = self.lock();
        let Some(tracked) = all.get(owner) else {
            return false;
        };
        let mut seen = std::collections::HashSet::new();
        for s in cached {
            let id = uid(s);
            match tracked.get(&id) {
                Some(Expect::Deletion) => return true,
                Some(Expect::Generation(g)) if *g > generation(s) => return true,
                _ => {}
            }
            seen.insert(id);
        }
        tracked
            .iter()
            .any(|(id, e)| matches!(e, Expect::Generation(_)) && !seen.contains(id))
    }

    /// Records a slice as the API server answered a create or update [Update].
    pub fn update(&self, slice: &EndpointSlice) {
        self.lock()
            .entry(owner_key(slice))
            .or_default()
            .insert(uid(slice), Expect::Generation(generation(slice)));
    }

    /// Records a delete we sent [ExpectDeletion].
    pub fn expect_deletion(&self, slice: &EndpointSlice) {
        self.lock()
            .entry(owner_key(slice))
            .or_default()
            .insert(uid(slice), Expect::Deletion);
    }

    /// A delete event: forgets the slice; `false` when the delete was not ours, so the owner is
    /// synced again and the slice recreated [HandleDeletion].
    pub fn handle_deletion(&self, slice: &EndpointSlice) -> bool {
        let mut all = self.lock();
        let Some(tracked) = all.get_mut(&owner_key(slice)) else {
            return true;
        };
        !matches!(tracked.remove(&uid(slice)), Some(Expect::Generation(_)))
    }

    /// The owner is gone [DeleteService].
    pub fn forget(&self, owner: &str) {
        self.lock().remove(owner);
        self.held_lock().remove(owner);
    }

    fn held_lock(&self) -> std::sync::MutexGuard<'_, std::collections::HashSet<String>> {
        self.held.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A sync of `owner` was held back because the cache is behind our writes.
    pub fn hold(&self, owner: &str) {
        self.held_lock().insert(owner.to_string());
    }

    /// Whether `owner` was held back (and no longer is): a slice event for it means the watch
    /// moved, so it is worth syncing now. Upstream waits for the key's backoff (up to 1000 s).
    pub fn release(&self, owner: &str) -> bool {
        self.held_lock().remove(owner)
    }

    /// Owners tracked (tests and leak checks).
    pub fn len(&self) -> usize {
        self.lock().len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[derive(Debug, Default)]
struct TriggerState {
    service: Option<Timestamp>,
    pods: HashMap<String, Timestamp>,
}

/// ES-17 [util/trigger_time_tracker.go]: the earliest change not yet reported, from the pods'
/// Ready transition times and the Service's creation.
#[derive(Debug, Default)]
pub struct TriggerTimes {
    by_service: Mutex<HashMap<String, TriggerState>>,
}

impl TriggerTimes {
    /// The trigger time of this sync (None = the annotation is removed); the times seen are
    /// remembered whatever the sync then writes, as upstream does.
    pub fn compute<'a>(
        &self,
        service_key: &str,
        service_created: Option<Timestamp>,
        pods: impl IntoIterator<Item = (&'a str, Option<Timestamp>)>,
    ) -> Option<Timestamp> {
        let mut all = self.by_service.lock().unwrap_or_else(|p| p.into_inner());
        let known = all.contains_key(service_key);
        let state = all.entry(service_key.to_string()).or_default();
        let mut earliest: Option<Timestamp> = None;
        let mut times = HashMap::new();
        for (name, t) in pods {
            let Some(t) = t else { continue };
            if state.pods.get(name).is_none_or(|last| t > *last) {
                earliest = Some(earliest.map_or(t, |e| e.min(t)));
            }
            times.insert(name.to_string(), t);
        }
        if let Some(t) = service_created
            && state.service.is_none_or(|last| t > last)
        {
            earliest = Some(earliest.map_or(t, |e| e.min(t)));
        }
        state.pods = times;
        state.service = service_created;
        if known { earliest } else { service_created }
    }

    pub fn forget(&self, service_key: &str) {
        self.by_service
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(service_key);
    }
}

/// Go's `time.RFC3339Nano` in UTC: fractional seconds without trailing zeros.
pub fn rfc3339_nano(t: Timestamp) -> String {
    let s = t.to_string();
    // jiff prints the shortest fraction already; pin the format so a change there shows up.
    debug_assert!(s.ends_with('Z'));
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
    use std::collections::BTreeMap;
    use std::sync::Arc;

    fn slice(uid: &str, generation: i64) -> EndpointSlice {
        EndpointSlice {
            metadata: ObjectMeta {
                namespace: Some("ns".into()),
                uid: Some(uid.into()),
                generation: Some(generation),
                labels: Some(BTreeMap::from([(
                    crate::endpoints::LABEL_SERVICE_NAME.to_string(),
                    "svc".to_string(),
                )])),
                ..ObjectMeta::default()
            },
            ..EndpointSlice::default()
        }
    }

    #[test]
    fn es15_stale_when_cache_is_behind_a_write() {
        let t = SliceTracker::default();
        t.update(&slice("a", 2));
        assert!(
            t.stale("ns/svc", &[Arc::new(slice("a", 1))]),
            "older generation"
        );
        assert!(!t.stale("ns/svc", &[Arc::new(slice("a", 2))]));
        assert!(t.stale("ns/svc", &[]), "written slice missing");
        t.expect_deletion(&slice("a", 2));
        assert!(
            t.stale("ns/svc", &[Arc::new(slice("a", 2))]),
            "deleted still cached"
        );
        assert!(!t.stale("ns/svc", &[]));
        assert!(
            !t.stale("ns/other", &[Arc::new(slice("x", 1))]),
            "untracked owner"
        );
    }

    #[test]
    fn es15_unexpected_delete_resyncs_and_own_writes_do_not() {
        let t = SliceTracker::default();
        t.update(&slice("a", 1));
        assert!(!t.should_sync(&slice("a", 1)), "our own write echoed");
        assert!(t.should_sync(&slice("a", 2)), "someone else's edit");
        assert!(t.should_sync(&slice("b", 1)), "untracked");
        assert!(!t.handle_deletion(&slice("a", 1)), "not ours: resync");
        t.expect_deletion(&slice("b", 1));
        assert!(t.handle_deletion(&slice("b", 1)), "ours");
        assert!(t.handle_deletion(&slice("c", 1)), "untracked");
    }

    fn ts(s: i64) -> Timestamp {
        Timestamp::from_second(s).expect("in range")
    }

    #[test]
    fn es17_first_sync_reports_creation_then_earliest_new_readiness() {
        let t = TriggerTimes::default();
        assert_eq!(
            t.compute("ns/svc", Some(ts(100)), [("a", Some(ts(150)))]),
            Some(ts(100))
        );
        assert_eq!(
            t.compute("ns/svc", Some(ts(100)), [("a", Some(ts(150)))]),
            None
        );
        assert_eq!(
            t.compute(
                "ns/svc",
                Some(ts(100)),
                [("a", Some(ts(170))), ("b", Some(ts(160))), ("c", None)]
            ),
            Some(ts(160))
        );
    }

    #[test]
    fn es17_rfc3339_nano_trims_zeros() {
        assert_eq!(rfc3339_nano(ts(0)), "1970-01-01T00:00:00Z");
        let t = Timestamp::new(1, 500_000_000).expect("in range");
        assert_eq!(rfc3339_nano(t), "1970-01-01T00:00:01.5Z");
    }
}
