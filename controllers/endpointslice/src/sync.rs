//! One Service's sync [endpointslice_controller.go: syncService; reconciler.go: Reconcile]:
//! observe the caches, plan per address type, add hints, write, report.

use crate::act::Act;
use crate::endpoints::{self, LABEL_MANAGED_BY};
use crate::handlers::{selector, selects};
use crate::metrics::{ChangedLabels, Metrics, ServiceLabels};
use crate::plan::{self, MANAGED_BY, name_of};
use crate::topology::{self, SliceInfo, TopologyCache};
use crate::tracker::{SliceTracker, TriggerTimes};
use crate::{Error, trafficdist};
use k8s_openapi::api::core::v1::{Node, ObjectReference, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::jiff::Timestamp;
use shared::api::writer::Writer;
use shared::cache::informers::{INDEX_NAMESPACE, Informer};
use shared::cache::pod::Pod;
use shared::cache::written::Behind;
use shared::meta::keys::split_key;
use shared::meta::refs::object_reference;
use shared::runtime::controller::Ctx;
use shared::runtime::events::EventRecorder;
use shared::runtime::queue::Next;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::{Arc, Mutex};

/// Slices by the Service their service-name label names (`namespace/name`).
pub const INDEX_SERVICE: &str = "endpointslice-service";

pub fn slice_by_service(slice: &EndpointSlice) -> Vec<String> {
    crate::handlers::service_of(slice).into_iter().collect()
}

pub struct Caches {
    pub services: Arc<Informer<Service>>,
    pub pods: Arc<Informer<Pod>>,
    pub slices: Arc<Informer<EndpointSlice>>,
    pub nodes: Arc<Informer<Node>>,
}

/// Settings from the flags.
#[derive(Clone, Debug)]
pub struct Config {
    pub max_endpoints_per_slice: usize,
    /// SB-10: delete the slices of a Service whose selector was removed.
    pub delete_on_selector_removal: bool,
}

pub struct EndpointSliceController {
    caches: Caches,
    writer: Writer,
    events: EventRecorder,
    metrics: Metrics,
    config: Config,
    tracker: Arc<SliceTracker>,
    triggers: TriggerTimes,
    topology: Arc<TopologyCache>,
    /// SB-10: slices retained per selectorless Service, as last reported.
    retained: Mutex<HashMap<String, usize>>,
}

impl EndpointSliceController {
    pub fn new(
        caches: Caches,
        ctx: Ctx<Metrics>,
        config: Config,
        tracker: Arc<SliceTracker>,
        topology: Arc<TopologyCache>,
    ) -> Self {
        let Ctx {
            writer,
            events,
            metrics,
            ..
        } = ctx;
        EndpointSliceController {
            caches,
            writer,
            events,
            metrics,
            config,
            tracker,
            triggers: TriggerTimes::default(),
            topology,
            retained: Mutex::new(HashMap::new()),
        }
    }

    pub async fn sync(&self, key: &str) -> Result<Next, Error> {
        let result = self.sync_service(key).await;
        // [trackSync]
        self.metrics.sync(match &result {
            Ok(Next::Stale(_)) => "stale",
            Ok(_) => "success",
            Err(_) => "error",
        });
        result
    }

    /// The topology worker [checkNodeTopologyDistribution]: rebuild the zone inventory and
    /// resync the Auto Services it overloads.
    pub fn topology_changed(&self) -> Vec<String> {
        self.topology.set_nodes(&self.caches.nodes.list());
        self.topology.overloaded_services()
    }

    async fn sync_service(&self, key: &str) -> Result<Next, Error> {
        let Some(svc) = self.caches.services.get(key) else {
            self.forget_service(key);
            return Ok(Next::Done);
        };
        let spec = svc.spec.as_ref();
        if spec.and_then(|s| s.type_.as_deref()) == Some("ExternalName") {
            return Ok(Next::Done);
        }
        let Some(selector) = selector(&svc) else {
            return self.selector_removed(&svc, key).await;
        };
        self.set_retained(key, 0);
        let (namespace, _) = split_key(key);
        let pods = self.selected_pods(namespace, selector);
        let slices = match self.current_slices(key) {
            Ok(slices) => slices,
            Err(stale) => return Ok(stale),
        };
        let trigger = self.trigger_time(key, &svc, &pods);
        let mut errors = Vec::new();
        let mut events = Vec::new();
        let families = endpoints::address_types(&svc);
        let unused = self.unused_address_types(key, &slices, &families);
        let act = Act {
            writer: &self.writer,
            tracker: &self.tracker,
            metrics: &self.metrics,
            owner: key,
            namespace,
            owner_deleting: svc.metadata.deletion_timestamp.is_some(),
        };
        for family in families {
            let existing: Vec<Arc<EndpointSlice>> = slices
                .iter()
                .filter(|s| s.address_type == family)
                .cloned()
                .collect();
            let (typed, skipped) = self.plan_address_type(&svc, key, &pods, &existing, family);
            errors.extend(skipped);
            let (writes, topology_label, distribution) =
                self.hints(&svc, key, &existing, typed, &mut events);
            if let Err(e) = self
                .write_address_type(&act, writes, trigger, topology_label, distribution)
                .await
            {
                errors.push(e.to_string());
            }
        }
        self.delete_unused(&act, key, &unused, &mut errors).await;
        let about = object_reference(svc.as_ref());
        self.record_hint_events(&about, events);
        self.outcome(&about, key, errors)
    }

    /// ES-1: the Service is gone; its slices are the garbage collector's, what we remember of
    /// it is ours to drop.
    fn forget_service(&self, key: &str) {
        self.triggers.forget(key);
        self.metrics.forget_service(key);
        self.tracker.forget(key);
        self.set_retained(key, 0);
    }

    /// ES-2: the cached pods of the namespace that the selector selects.
    fn selected_pods(&self, namespace: &str, selector: &BTreeMap<String, String>) -> Vec<Arc<Pod>> {
        self.caches
            .pods
            .by_index(INDEX_NAMESPACE, namespace)
            .into_iter()
            .filter(|p| selects(selector, p.metadata.labels.as_ref()))
            .collect()
    }

    /// ES-2 and ES-15: the Service's slices, or `Next::Stale` when the cache has not caught up
    /// with our writes (a lagging slice cache stops the sync before it writes anything).
    fn current_slices(&self, key: &str) -> Result<Vec<Arc<EndpointSlice>>, Next> {
        // Held before the cache is read: a slice event landing between the read and a later
        // hold would find nothing to release, and the Service would wait for the runtime's
        // recheck.
        self.tracker.hold(key);
        let slices = self.managed_slices(key);
        if self.tracker.stale(key, &slices) {
            return Err(Next::Stale(Behind::of::<EndpointSlice>()));
        }
        self.tracker.release(key);
        Ok(slices)
    }

    /// ES-17: the trigger time this sync stamps on its writes, from the Service's creation and
    /// its pods' readiness transitions.
    fn trigger_time(&self, key: &str, svc: &Service, pods: &[Arc<Pod>]) -> Option<Timestamp> {
        self.triggers.compute(
            key,
            svc.metadata.creation_timestamp.as_ref().map(|t| t.0),
            pods.iter().map(|p| {
                (
                    p.metadata.name.as_deref().unwrap_or_default(),
                    p.condition("Ready")
                        .and_then(|c| c.last_transition_time.as_ref())
                        .map(|t| t.0),
                )
            }),
        )
    }

    /// ES-14 step 1: slices of an address type the Service no longer has; their hints and
    /// metrics are dropped now, the slices deleted after the used types are written.
    fn unused_address_types(
        &self,
        key: &str,
        slices: &[Arc<EndpointSlice>],
        families: &BTreeSet<&'static str>,
    ) -> Vec<Arc<EndpointSlice>> {
        let mut unused = Vec::new();
        for slice in slices {
            if !families.contains(slice.address_type.as_str()) {
                self.topology.remove_hints(key, &slice.address_type);
                self.metrics.forget_family(key, &slice.address_type);
                unused.push(Arc::clone(slice));
            }
        }
        unused
    }

    /// ES-9..ES-14 steps 2-8 for one address type: the desired endpoints, the plan against
    /// `existing` and its metrics; also the pods skipped for an uncached node (ES-11), which
    /// fail the sync once the rest is written.
    fn plan_address_type(
        &self,
        svc: &Service,
        key: &str,
        pods: &[Arc<Pod>],
        existing: &[Arc<EndpointSlice>],
        family: &'static str,
    ) -> (plan::TypePlan, Vec<String>) {
        let desired = endpoints::desired(
            svc,
            pods.iter().map(AsRef::as_ref),
            |node| self.caches.nodes.get(node),
            family,
        );
        if !desired.missing_nodes.is_empty() {
            tracing::info!(service = key, skipped = ?desired.missing_nodes, "skipping pods whose Node is not cached");
        }
        let skipped = desired.missing_nodes.clone();
        let mut typed = plan::plan_address_type(
            svc,
            existing,
            desired,
            self.config.max_endpoints_per_slice,
            family,
        );
        self.metrics.added_per_sync.observe(typed.added as f64);
        self.metrics.removed_per_sync.observe(typed.removed as f64);
        self.metrics
            .set_efficiency(key, family, std::mem::take(&mut typed.efficiency));
        (typed, skipped)
    }

    /// ES-14 step 10 for one address type; a success is counted in the per-sync histogram
    /// under the hint labels.
    async fn write_address_type(
        &self,
        act: &Act<'_>,
        writes: plan::Writes,
        trigger: Option<Timestamp>,
        topology_label: &'static str,
        distribution: String,
    ) -> Result<(), Error> {
        let changed = writes.create.len() + writes.update.len() + writes.delete.len();
        act.write(writes, trigger).await?;
        self.metrics
            .changed_per_sync
            .get_or_create(&ChangedLabels {
                topology: topology_label.into(),
                traffic_distribution: distribution,
            })
            .observe(changed as f64);
        Ok(())
    }

    /// ES-14: the unused address types' slices, each attempted even after a failure, as
    /// upstream does.
    async fn delete_unused(
        &self,
        act: &Act<'_>,
        key: &str,
        unused: &[Arc<EndpointSlice>],
        errors: &mut Vec<String>,
    ) {
        for slice in unused {
            if let Err(e) = act.delete(std::slice::from_ref(slice)).await {
                errors.push(format!(
                    "error deleting {} EndpointSlice for Service {key}: {e}",
                    name_of(slice)
                ));
            }
        }
    }

    /// ES-19: the hint events of every address type, on the Service, in the order they arose.
    fn record_hint_events(&self, about: &ObjectReference, events: Vec<topology::HintEvent>) {
        for e in events {
            if e.warning {
                self.events.warning(about, e.reason, "", e.message);
            } else {
                self.events.normal(about, e.reason, "", e.message);
            }
        }
    }

    /// The sync's result: done, or Go's aggregate error, also as a Warning on the Service.
    fn outcome(
        &self,
        about: &ObjectReference,
        key: &str,
        mut errors: Vec<String>,
    ) -> Result<Next, Error> {
        if errors.is_empty() {
            return Ok(Next::Done);
        }
        // Go's aggregate error text, which drops repeated messages (a pod skipped for a
        // missing node is reported once, not per address family).
        let mut seen = std::collections::HashSet::new();
        errors.retain(|e| seen.insert(e.clone()));
        let message = if errors.len() == 1 {
            errors.remove(0)
        } else {
            format!("[{}]", errors.join(", "))
        };
        self.events.warning(
            about,
            "FailedToUpdateEndpointSlices",
            "",
            format!("Error updating Endpoint Slices for Service {key}: {message}"),
        );
        Err(Error::Sync(message))
    }

    /// ES-2: this controller's slices of the Service, minus those being deleted.
    fn managed_slices(&self, key: &str) -> Vec<Arc<EndpointSlice>> {
        self.caches
            .slices
            .by_index(INDEX_SERVICE, key)
            .into_iter()
            .filter(|s| {
                s.metadata
                    .labels
                    .as_ref()
                    .and_then(|l| l.get(LABEL_MANAGED_BY))
                    .is_some_and(|m| m == MANAGED_BY)
                    && s.metadata.deletion_timestamp.is_none()
            })
            .collect()
    }

    /// ES-18..ES-20 and ES-14 step 10: hints for one address type, then the final writes;
    /// also the `topology` and `traffic_distribution` labels of the per-sync histogram.
    fn hints(
        &self,
        svc: &Service,
        key: &str,
        existing: &[Arc<EndpointSlice>],
        typed: plan::TypePlan,
        events: &mut Vec<topology::HintEvent>,
    ) -> (plan::Writes, &'static str, String) {
        let auto = topology::hints_enabled(svc.metadata.annotations.as_ref());
        let distribution = svc
            .spec
            .as_ref()
            .and_then(|s| s.traffic_distribution.as_deref());
        let use_distribution = trafficdist::valid(distribution) && !auto;
        let plan::TypePlan {
            address_type,
            to_create,
            to_update,
            to_delete,
            unchanged,
            ..
        } = typed;
        let info = SliceInfo {
            service_key: key.to_string(),
            address_type: address_type.to_string(),
            to_create,
            to_update,
            unchanged,
        };
        let (mut create, mut update) = if auto {
            let (c, u, e) = self.topology.add_hints(info);
            events.extend(e);
            (c, u)
        } else {
            if self.topology.has_populated_hints(key) {
                events.push(topology::HintEvent {
                    warning: true,
                    reason: topology::REASON_TOPOLOGY_AWARE_HINTS_DISABLED,
                    message: topology::format_with_address_type(
                        topology::TOPOLOGY_AWARE_HINTS_DISABLED,
                        address_type,
                    ),
                });
            }
            self.topology.remove_hints(key, address_type);
            if use_distribution {
                (info.to_create, info.to_update)
            } else {
                topology::remove_hints_from_slices(info)
            }
        };
        if use_distribution {
            self.metrics.set_distribution(key, distribution);
            let changed: BTreeSet<&str> = update
                .iter()
                .map(name_of)
                .chain(to_delete.iter().map(|s| name_of(s)))
                .collect();
            let unchanged = existing
                .iter()
                .filter(|s| !changed.contains(name_of(s)))
                .map(|s| (**s).clone())
                .collect();
            let (c, u, _) = trafficdist::reconcile_hints(distribution, create, update, unchanged);
            (create, update) = (c, u);
        } else {
            self.metrics.set_distribution(key, None);
        }
        let label = if auto { "Auto" } else { "Disabled" };
        let distribution = if use_distribution {
            distribution.unwrap_or_default().to_string()
        } else {
            String::new()
        };
        (
            plan::finalize(svc, create, update, to_delete),
            label,
            distribution,
        )
    }

    /// ES-21 and SB-10: a Service without a selector keeps the slices it had, frozen, as
    /// upstream does; we say so on the Service and in a gauge, or delete them when asked to.
    async fn selector_removed(&self, svc: &Service, key: &str) -> Result<Next, Error> {
        let slices = self.managed_slices(key);
        if slices.is_empty() || !self.config.delete_on_selector_removal {
            let before = self.set_retained(key, slices.len());
            if !slices.is_empty() && before != slices.len() {
                self.events.warning(
                    &object_reference(svc),
                    "StaleEndpointSlicesRetained",
                    "",
                    format!(
                        "Service {key} has no selector: its {} EndpointSlices managed by {MANAGED_BY} are kept as they are and no longer follow its Pods (--endpointslice-delete-on-selector-removal deletes them)",
                        slices.len()
                    ),
                );
            }
            return Ok(Next::Done);
        }
        if self.tracker.stale(key, &slices) {
            return Ok(Next::Stale(Behind::of::<EndpointSlice>()));
        }
        self.set_retained(key, 0);
        let (namespace, _) = split_key(key);
        Act {
            writer: &self.writer,
            tracker: &self.tracker,
            metrics: &self.metrics,
            owner: key,
            namespace,
            owner_deleting: true,
        }
        .delete(&slices)
        .await?;
        Ok(Next::Done)
    }

    /// Records the retained count (SB-10 gauge); returns the previous one.
    fn set_retained(&self, key: &str, count: usize) -> usize {
        let mut all = self.retained.lock().unwrap_or_else(|p| p.into_inner());
        let before = if count == 0 {
            all.remove(key)
        } else {
            all.insert(key.to_string(), count)
        }
        .unwrap_or(0);
        if before != count {
            let (namespace, service) = split_key(key);
            let labels = ServiceLabels {
                namespace: namespace.to_string(),
                service: service.to_string(),
            };
            if count == 0 {
                self.metrics.retained.remove(&labels);
            } else {
                self.metrics
                    .retained
                    .get_or_create(&labels)
                    .set(i64::try_from(count).unwrap_or(i64::MAX));
            }
        }
        before
    }
}
