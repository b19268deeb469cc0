//! MR-1, MR-2: whether an Endpoints is mirrored, and which Endpoints keys a change concerns.
//! Pure functions of the change (and the slice tracker).

use crate::plan::MANAGED_BY;
use endpointslice::endpoints::LABEL_MANAGED_BY;
use endpointslice::handlers::service_of;
use endpointslice::tracker::SliceTracker;
use k8s_openapi::api::core::v1::{Endpoints, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use shared::cache::informers::Change;
use shared::meta::keys::object_key;

/// Set by the Endpoints controller on every Endpoints it manages.
pub const LABEL_SKIP_MIRROR: &str = "endpointslice.kubernetes.io/skip-mirror";
/// client-go's `LeaderElectionRecordAnnotationKey`: an Endpoints used as a lock.
pub const ANNOTATION_LEADER: &str = "control-plane.alpha.kubernetes.io/leader";

/// MR-1 [shouldMirror]: no `skip-mirror: "true"` label and no leader-election annotation. The
/// Service checks are the sync's.
pub fn should_mirror(endpoints: &Endpoints) -> bool {
    let meta = &endpoints.metadata;
    let skip = meta
        .labels
        .as_ref()
        .and_then(|l| l.get(LABEL_SKIP_MIRROR))
        .is_some_and(|v| v == "true");
    let leader = meta
        .annotations
        .as_ref()
        .is_some_and(|a| a.contains_key(ANNOTATION_LEADER));
    !skip && !leader
}

/// Whether the Service has a selector (MR-1). Upstream tests the map against nil; the API
/// server never returns an empty one (absent and empty round-trip alike), so empty is none.
pub fn has_selector(svc: &Service) -> bool {
    endpointslice::handlers::selector(svc).is_some()
}

/// MR-2 [onEndpointsAdd/Update/Delete]: when the old or the new state is mirrorable.
pub fn endpoints_keys(change: &Change<Endpoints>) -> Vec<String> {
    let relevant = match change {
        Change::Added(e) | Change::Deleted(e) => should_mirror(e),
        Change::Updated { old, new } => should_mirror(old) || should_mirror(new),
    };
    if relevant {
        vec![object_key(change.object().as_ref())]
    } else {
        Vec::new()
    }
}

/// MR-2 [onServiceAdd/Update/Delete]: the same-named Endpoints, when the Service has no
/// selector, or when an update adds or removes it.
pub fn service_keys(change: &Change<Service>) -> Vec<String> {
    let relevant = match change {
        Change::Added(s) | Change::Deleted(s) => !has_selector(s),
        Change::Updated { old, new } => has_selector(old) != has_selector(new),
    };
    if relevant {
        vec![object_key(change.object().as_ref())]
    } else {
        Vec::new()
    }
}

/// A slice this controller manages (by its managed-by label).
pub fn mirrored(slice: &EndpointSlice) -> bool {
    slice
        .metadata
        .labels
        .as_ref()
        .and_then(|l| l.get(LABEL_MANAGED_BY))
        .is_some_and(|m| m == MANAGED_BY)
}

/// MR-2, MR-7 [onEndpointSliceAdd/Update/Delete]: the Endpoints to sync after a slice change:
/// news unless it is a write of ours already known; a changed service-name label concerns
/// both names; a delete we did not expect brings the slice back.
pub fn slice_keys(tracker: &SliceTracker, change: &Change<EndpointSlice>) -> Vec<String> {
    match change {
        Change::Added(s) => {
            if mirrored(s) && tracker.should_sync(s) {
                return service_of(s).into_iter().collect();
            }
            Vec::new()
        }
        Change::Updated { old, new } => {
            let (was, is) = (service_of(old), service_of(new));
            if was != is {
                return is.into_iter().chain(was).collect();
            }
            if mirrored(old) != mirrored(new) || (mirrored(new) && tracker.should_sync(new)) {
                return is.into_iter().collect();
            }
            Vec::new()
        }
        Change::Deleted(s) => {
            if mirrored(s) && tracker.has(s) && !tracker.handle_deletion(s) {
                return service_of(s).into_iter().collect();
            }
            Vec::new()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
    use std::collections::BTreeMap;
    use std::sync::Arc;

    fn ep(labels: &[(&str, &str)], annotations: &[(&str, &str)]) -> Endpoints {
        let map = |kv: &[(&str, &str)]| {
            Some(
                kv.iter()
                    .map(|(k, v)| (k.to_string(), v.to_string()))
                    .collect::<BTreeMap<_, _>>(),
            )
        };
        Endpoints {
            metadata: ObjectMeta {
                name: Some("e".into()),
                namespace: Some("ns".into()),
                labels: map(labels),
                annotations: map(annotations),
                ..ObjectMeta::default()
            },
            subsets: None,
        }
    }

    #[test]
    fn mr1_should_mirror() {
        let cases = [
            ("plain", ep(&[], &[]), true),
            (
                "skip-mirror true",
                ep(&[(LABEL_SKIP_MIRROR, "true")], &[]),
                false,
            ),
            (
                "skip-mirror false",
                ep(&[(LABEL_SKIP_MIRROR, "false")], &[]),
                true,
            ),
            (
                "skip-mirror empty",
                ep(&[(LABEL_SKIP_MIRROR, "")], &[]),
                true,
            ),
            (
                "leader annotation",
                ep(&[], &[(ANNOTATION_LEADER, "")]),
                false,
            ),
            ("other annotation", ep(&[], &[("foo", "bar")]), true),
        ];
        for (name, e, want) in cases {
            assert_eq!(should_mirror(&e), want, "{name}");
        }
    }

    fn svc(selector: Option<&[(&str, &str)]>) -> Arc<Service> {
        let mut s = Service::default();
        s.metadata.name = Some("e".into());
        s.metadata.namespace = Some("ns".into());
        s.spec = Some(k8s_openapi::api::core::v1::ServiceSpec {
            selector: selector.map(|kv| {
                kv.iter()
                    .map(|(k, v)| (k.to_string(), v.to_string()))
                    .collect()
            }),
            ..Default::default()
        });
        Arc::new(s)
    }

    #[test]
    fn mr2_service_triggers() {
        let with = || svc(Some(&[("a", "b")]));
        let without = || svc(None);
        let cases = [
            ("add without selector", Change::Added(without()), 1),
            ("add with selector", Change::Added(with()), 0),
            ("add with empty selector", Change::Added(svc(Some(&[]))), 1),
            ("delete without selector", Change::Deleted(without()), 1),
            ("delete with selector", Change::Deleted(with()), 0),
            (
                "selector removed",
                Change::Updated {
                    old: with(),
                    new: without(),
                },
                1,
            ),
            (
                "selector added",
                Change::Updated {
                    old: without(),
                    new: with(),
                },
                1,
            ),
            (
                "selector kept",
                Change::Updated {
                    old: with(),
                    new: with(),
                },
                0,
            ),
            (
                "still none",
                Change::Updated {
                    old: without(),
                    new: without(),
                },
                0,
            ),
        ];
        for (name, change, want) in cases {
            assert_eq!(service_keys(&change).len(), want, "{name}");
        }
    }

    #[test]
    fn mr2_endpoints_triggers() {
        let yes = || Arc::new(ep(&[], &[]));
        let no = || Arc::new(ep(&[(LABEL_SKIP_MIRROR, "true")], &[]));
        let cases = [
            ("add mirrorable", Change::Added(yes()), 1),
            ("add skipped", Change::Added(no()), 0),
            ("delete mirrorable", Change::Deleted(yes()), 1),
            ("delete skipped", Change::Deleted(no()), 0),
            (
                "becomes skipped",
                Change::Updated {
                    old: yes(),
                    new: no(),
                },
                1,
            ),
            (
                "becomes mirrorable",
                Change::Updated {
                    old: no(),
                    new: yes(),
                },
                1,
            ),
            (
                "stays skipped",
                Change::Updated {
                    old: no(),
                    new: no(),
                },
                0,
            ),
        ];
        for (name, change, want) in cases {
            assert_eq!(
                endpoints_keys(&change),
                vec!["ns/e".to_string(); want],
                "{name}"
            );
        }
    }

    fn slice(service: &str, managed: &str, uid: &str, generation: i64) -> Arc<EndpointSlice> {
        let mut s = EndpointSlice::default();
        s.metadata.namespace = Some("ns".into());
        s.metadata.name = Some(format!("s-{uid}"));
        s.metadata.uid = Some(uid.into());
        s.metadata.generation = Some(generation);
        s.metadata.labels = Some(BTreeMap::from([
            (
                endpointslice::endpoints::LABEL_SERVICE_NAME.to_string(),
                service.to_string(),
            ),
            (LABEL_MANAGED_BY.to_string(), managed.to_string()),
        ]));
        Arc::new(s)
    }

    #[test]
    fn mr7_slice_triggers() {
        let t = SliceTracker::default();
        let other = "endpointslice-controller.k8s.io";
        assert_eq!(
            slice_keys(&t, &Change::Added(slice("e", MANAGED_BY, "a", 1))),
            ["ns/e"]
        );
        assert!(slice_keys(&t, &Change::Added(slice("e", other, "a", 1))).is_empty());
        t.update(&slice("e", MANAGED_BY, "a", 1));
        assert!(
            slice_keys(&t, &Change::Added(slice("e", MANAGED_BY, "a", 1))).is_empty(),
            "our own write"
        );
        let renamed = Change::Updated {
            old: slice("e", MANAGED_BY, "a", 1),
            new: slice("f", MANAGED_BY, "a", 1),
        };
        assert_eq!(slice_keys(&t, &renamed), ["ns/f", "ns/e"]);
        let taken = Change::Updated {
            old: slice("e", MANAGED_BY, "a", 1),
            new: slice("e", other, "a", 1),
        };
        assert_eq!(slice_keys(&t, &taken), ["ns/e"]);
        let edited = Change::Updated {
            old: slice("e", MANAGED_BY, "a", 1),
            new: slice("e", MANAGED_BY, "a", 2),
        };
        assert_eq!(slice_keys(&t, &edited), ["ns/e"]);
        assert_eq!(
            slice_keys(&t, &Change::Deleted(slice("e", MANAGED_BY, "a", 1))),
            ["ns/e"],
            "deleted by someone else"
        );
        t.expect_deletion(&slice("e", MANAGED_BY, "b", 1));
        assert!(slice_keys(&t, &Change::Deleted(slice("e", MANAGED_BY, "b", 1))).is_empty());
        assert!(slice_keys(&t, &Change::Added(slice("", MANAGED_BY, "c", 1))).is_empty());
    }
}
