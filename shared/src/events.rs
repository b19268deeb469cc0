//! Events through `events.k8s.io/v1` (kube's recorder, which also aggregates repeats into series),
//! reported as the controller's upstream name so `kubectl events` reads as it did under
//! kube-controller-manager.

use k8s_openapi::api::core::v1::ObjectReference;
use kube::Client;
use kube::runtime::events::{Event, EventType, Recorder, Reporter};

/// A reference to a core/v1 object (`Pod`, `Node`, ...) by its cache key (`namespace/name`, or
/// `name` when cluster-scoped), for events about objects that may already be gone.
pub fn core_ref(kind: &str, key: &str) -> ObjectReference {
    let (namespace, name) = crate::informers::split_key(key);
    ObjectReference {
        api_version: Some("v1".into()),
        kind: Some(kind.into()),
        namespace: (!namespace.is_empty()).then(|| namespace.into()),
        name: Some(name.into()),
        ..Default::default()
    }
}

#[derive(Clone)]
pub struct EventRecorder {
    recorder: Recorder,
}

impl std::fmt::Debug for EventRecorder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("EventRecorder")
    }
}

impl EventRecorder {
    /// `controller` is the upstream reporting name, e.g. `job-controller`; `instance` this replica.
    pub fn new(client: Client, controller: &str, instance: &str) -> Self {
        let reporter = Reporter {
            controller: controller.to_string(),
            instance: Some(instance.to_string()),
        };
        EventRecorder {
            recorder: Recorder::new(client, reporter),
        }
    }

    pub fn normal(
        &self,
        regarding: &ObjectReference,
        reason: &str,
        action: &str,
        note: impl Into<String>,
    ) {
        self.emit(EventType::Normal, regarding, reason, action, note.into());
    }

    pub fn warning(
        &self,
        regarding: &ObjectReference,
        reason: &str,
        action: &str,
        note: impl Into<String>,
    ) {
        self.emit(EventType::Warning, regarding, reason, action, note.into());
    }

    /// Fire and forget, as client-go's broadcaster: an event write never delays a sync, and a
    /// failed one is logged, not retried.
    fn emit(
        &self,
        type_: EventType,
        regarding: &ObjectReference,
        reason: &str,
        action: &str,
        note: String,
    ) {
        let recorder = self.recorder.clone();
        let regarding = regarding.clone();
        let event = Event {
            type_,
            reason: reason.to_string(),
            note: Some(note),
            action: action.to_string(),
            secondary: None,
        };
        tokio::spawn(async move {
            if let Err(e) = recorder.publish(&event, &regarding).await {
                tracing::warn!(reason = %event.reason, error = %e, "failed to write event");
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use super::core_ref;

    #[test]
    fn references_by_cache_key() {
        let p = core_ref("Pod", "ns/p");
        assert_eq!(
            (p.kind.as_deref(), p.namespace.as_deref(), p.name.as_deref()),
            (Some("Pod"), Some("ns"), Some("p"))
        );
        assert_eq!(p.api_version.as_deref(), Some("v1"));
        let n = core_ref("Node", "node-1");
        assert_eq!((n.namespace, n.name.as_deref()), (None, Some("node-1")));
    }
}
