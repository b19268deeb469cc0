//! ES-18/ES-19: topology aware hints for `service.kubernetes.io/topology-mode: Auto`
//! (upstream `k8s.io/endpointslice/topologycache`).
//!
//! Upstream iterates Go maps (random order) in a few places; here every map is a `BTreeMap`,
//! so ties are broken by zone name (the first in byte order wins). Each such spot is marked
//! "Determinism" and yields a result upstream can also produce.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use k8s_openapi::api::core::v1::Node;
use k8s_openapi::api::discovery::v1::{Endpoint, EndpointHints, EndpointSlice, ForZone};
use shared::meta::quantity::{self, nano_to_milli};

/// Deprecated Service annotation; when present it decides alone (ES-18).
pub const DEPRECATED_ANNOTATION_TOPOLOGY_AWARE_HINTS: &str =
    "service.kubernetes.io/topology-aware-hints";
/// Service annotation selecting the topology mode (ES-18).
pub const ANNOTATION_TOPOLOGY_MODE: &str = "service.kubernetes.io/topology-mode";
/// Node label naming the zone.
pub const LABEL_TOPOLOGY_ZONE: &str = "topology.kubernetes.io/zone";
/// Nodes carrying either label (any value) are left out of the capacity inventory.
pub const EXCLUDED_NODE_LABELS: [&str; 2] = [
    "node-role.kubernetes.io/control-plane",
    "node-role.kubernetes.io/master",
];

/// Event reason when hints are (re)enabled (type Normal).
pub const REASON_TOPOLOGY_AWARE_HINTS_ENABLED: &str = "TopologyAwareHintsEnabled";
/// Event reason when hints are removed (type Warning).
pub const REASON_TOPOLOGY_AWARE_HINTS_DISABLED: &str = "TopologyAwareHintsDisabled";

// Upstream event messages (topologycache/event.go).
/// Some ready endpoint has no zone.
pub const NO_ZONE_SPECIFIED: &str = "One or more endpoints do not have a zone specified";
/// Allocation produced no zone at all.
pub const NO_ALLOCATED_HINTS_FOR_ZONES: &str = "No hints allocated for zones";
/// Hints written for the first time.
pub const TOPOLOGY_AWARE_HINTS_ENABLED: &str = "Topology Aware Hints has been enabled";
/// Auto mode dropped while hints existed (emitted by the reconciler, not by this module).
pub const TOPOLOGY_AWARE_HINTS_DISABLED: &str = "Topology Aware Hints has been disabled";
/// Some eligible node lacks a zone or allocatable CPU, or fewer than 2 zones.
pub const INSUFFICIENT_NODE_INFO: &str =
    "Insufficient Node information: allocatable CPU or zone not specified on one or more nodes";
/// Only reachable before the first `set_nodes` (upstream starts with an empty, non-nil map).
pub const NODES_READY_IN_ONE_ZONE_ONLY: &str = "Nodes only ready in one zone";
/// More zones than ready endpoints.
pub const INSUFFICIENT_NUMBER_OF_ENDPOINTS: &str = "Insufficient number of endpoints";
/// The per-zone minimums add up to more than the endpoints.
pub const MIN_ALLOCATION_EXCEEDS_OVERLOAD_THRESHOLD: &str = "Unable to allocate minimum required endpoints to each zone without exceeding overload threshold";

/// Maximum overload any endpoint should be exposed to (upstream `overloadThreshold`).
const OVERLOAD_THRESHOLD: f64 = 0.2;

/// Upstream `FormatWithAddressType`: `"<s>, addressType: <type>"`.
pub fn format_with_address_type(s: &str, address_type: &str) -> String {
    format!("{s}, addressType: {address_type}")
}

/// ES-18: upstream `hintsEnabled`. The deprecated `topology-aware-hints` key, when present,
/// decides even if its value is not Auto; otherwise `topology-mode`. Only `Auto`/`auto` enable.
pub fn hints_enabled(annotations: Option<&BTreeMap<String, String>>) -> bool {
    let Some(annotations) = annotations else {
        return false;
    };
    let value = annotations
        .get(DEPRECATED_ANNOTATION_TOPOLOGY_AWARE_HINTS)
        .or_else(|| annotations.get(ANNOTATION_TOPOLOGY_MODE));
    matches!(value.map(String::as_str), Some("Auto" | "auto"))
}

/// What one address type of one Service would write, before hints (upstream `SliceInfo`).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct SliceInfo {
    /// `"namespace/name"`.
    pub service_key: String,
    /// `"IPv4"` | `"IPv6"`.
    pub address_type: String,
    pub to_create: Vec<EndpointSlice>,
    pub to_update: Vec<EndpointSlice>,
    pub unchanged: Vec<EndpointSlice>,
}

/// An event the reconciler records on the Service (upstream `EventBuilder`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HintEvent {
    /// `true` → type Warning, `false` → type Normal.
    pub warning: bool,
    pub reason: &'static str,
    pub message: String,
}

impl HintEvent {
    fn disabled(message: String) -> Self {
        HintEvent {
            warning: true,
            reason: REASON_TOPOLOGY_AWARE_HINTS_DISABLED,
            message,
        }
    }
}

/// Hints (or endpoints) counted per zone (upstream `EndpointZoneInfo`).
type ZoneCounts = BTreeMap<String, i64>;

/// Endpoints a zone should be allocated (upstream `allocation`).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
struct Allocation {
    minimum: i64,
    maximum: i64,
    desired: f64,
}

#[derive(Debug)]
struct CacheState {
    sufficient_node_info: bool,
    /// Exact allocatable CPU per zone, in nano-cores. Kept for parity with upstream (tests).
    #[allow(dead_code, reason = "mirrors upstream cpuByZone; only tests read it")]
    cpu_by_zone: Option<BTreeMap<String, i128>>,
    /// `None` after a `set_nodes` with insufficient information. Starts as `Some(empty)`,
    /// like upstream's non-nil empty map, which selects a different event before the first
    /// `set_nodes`.
    cpu_ratios_by_zone: Option<BTreeMap<String, f64>>,
    endpoints_by_service: BTreeMap<String, BTreeMap<String, ZoneCounts>>,
    hints_populated_by_service: BTreeSet<String>,
}

/// Upstream `TopologyCache`: node CPU distribution by zone plus the hints allocated per Service
/// and address type. Internally synchronised; share it (e.g. in an `Arc`) among all workers.
#[derive(Debug)]
pub struct TopologyCache {
    state: Mutex<CacheState>,
}

impl Default for TopologyCache {
    fn default() -> Self {
        Self::new()
    }
}

impl TopologyCache {
    /// Upstream `NewTopologyCache`.
    pub fn new() -> Self {
        TopologyCache {
            state: Mutex::new(CacheState {
                sufficient_node_info: false,
                cpu_by_zone: Some(BTreeMap::new()),
                cpu_ratios_by_zone: Some(BTreeMap::new()),
                endpoints_by_service: BTreeMap::new(),
                hints_populated_by_service: BTreeSet::new(),
            }),
        }
    }

    fn lock(&self) -> MutexGuard<'_, CacheState> {
        // Every critical section leaves the state consistent, so a poisoned lock is usable.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// ES-19: upstream `GetOverloadedServices`: keys of Services whose allocation for some
    /// address type leaves a zone below its minimum under the current CPU ratios.
    /// Determinism: sorted by key (upstream returns Go map order).
    pub fn overloaded_services(&self) -> Vec<String> {
        let state = self.lock();
        state
            .endpoints_by_service
            .iter()
            .filter(|(_, by_type)| {
                by_type
                    .values()
                    .any(|ezi| service_overloaded(ezi, state.cpu_ratios_by_zone.as_ref()))
            })
            .map(|(key, _)| key.clone())
            .collect()
    }

    /// ES-19: upstream `SetNodes`. Inventory of ready, non-control-plane nodes: CPU per zone and
    /// each zone's share. One eligible node without zone or allocatable CPU, zero total CPU or
    /// fewer than two zones leaves the cache without ratios (hints disabled everywhere).
    pub fn set_nodes(&self, nodes: &[Arc<Node>]) {
        let mut cpu_by_zone: BTreeMap<String, i128> = BTreeMap::new();
        let mut sufficient_node_info = true;
        let mut total_cpu: i128 = 0;

        for node in nodes {
            let name = node.metadata.name.as_deref().unwrap_or_default();
            let labels = node.metadata.labels.as_ref();
            if has_excluded_labels(labels) {
                tracing::trace!(
                    node = name,
                    "ignoring node because it has an excluded label"
                );
                continue;
            }
            if !is_node_ready(node) {
                tracing::trace!(node = name, "ignoring node because it is not ready");
                continue;
            }
            let zone = labels
                .and_then(|l| l.get(LABEL_TOPOLOGY_ZONE))
                .filter(|z| !z.is_empty());
            // A missing or unparseable quantity counts as zero, like upstream's `Cpu()`.
            let cpu = node_allocatable_cpu_nano(node).unwrap_or(0);
            let Some(zone) = zone.filter(|_| cpu != 0) else {
                // Bail out entirely, as upstream does: partial information would skew ratios.
                cpu_by_zone.clear();
                sufficient_node_info = false;
                tracing::info!(node = name, "can't get CPU or zone information for node");
                break;
            };
            total_cpu = total_cpu.saturating_add(cpu);
            let zone_cpu = cpu_by_zone.entry(zone.clone()).or_insert(0);
            *zone_cpu = zone_cpu.saturating_add(cpu);
        }

        let mut state = self.lock();
        if total_cpu == 0 || !sufficient_node_info || cpu_by_zone.len() < 2 {
            tracing::debug!(
                total_zones = cpu_by_zone.len(),
                total_cpu_nano = %total_cpu,
                sufficient_node_info,
                "insufficient node info for topology hints"
            );
            state.sufficient_node_info = false;
            state.cpu_by_zone = None;
            state.cpu_ratios_by_zone = None;
        } else {
            // Ratios of milli-values (rounded up), exactly as upstream's
            // `float64(cpu.MilliValue()) / float64(totalCPU.MilliValue())`.
            let total_milli = nano_to_milli(total_cpu) as f64;
            let ratios = cpu_by_zone
                .iter()
                .map(|(zone, cpu)| (zone.clone(), nano_to_milli(*cpu) as f64 / total_milli))
                .collect();
            state.sufficient_node_info = true;
            state.cpu_by_zone = Some(cpu_by_zone);
            state.cpu_ratios_by_zone = Some(ratios);
        }
    }

    /// ES-19: upstream `AddHints`. Returns `(to_create, to_update, events)`.
    ///
    /// Unchanged slices whose hints are still consistent with the allocation stay out of both
    /// lists; inconsistent ones join `to_update` (after the caller's). When hints cannot be
    /// allocated, the cache entry is dropped and every hint is stripped
    /// ([`remove_hints_from_slices`]), with a Warning event suffixed by the address type.
    pub fn add_hints(
        &self,
        si: SliceInfo,
    ) -> (Vec<EndpointSlice>, Vec<EndpointSlice>, Vec<HintEvent>) {
        let mut si = si;
        let mut events = Vec::new();
        let total_endpoints = si.total_ready_endpoints();

        let allocations = match self.allocations(total_endpoints) {
            Ok(allocations) => allocations,
            Err(mut event) => {
                tracing::info!(
                    key = %si.service_key,
                    address_type = %si.address_type,
                    "{}, removing hints",
                    event.message
                );
                event.message = format_with_address_type(&event.message, &si.address_type);
                events.push(event);
                return self.disable(si, events);
            }
        };

        let mut allocated_hints_by_zone = si.allocated_hints_by_zone(&allocations);

        // Step 1: every ready endpoint starts hinted to its own zone.
        // (Upstream's `endpoint.Hints = nil` for not-ready endpoints writes to a loop copy, so
        // their hints are left untouched; reproduced by skipping them.)
        let mut zoneless = false;
        'slices: for slice in si.to_create.iter_mut().chain(si.to_update.iter_mut()) {
            for ep in slice.endpoints.iter_mut().flatten() {
                if !endpoint_ready(ep) {
                    continue;
                }
                let Some(zone) = ep.zone.as_ref().filter(|z| !z.is_empty()) else {
                    zoneless = true;
                    break 'slices;
                };
                let count = allocated_hints_by_zone.entry(zone.clone()).or_insert(0);
                *count = count.saturating_add(1);
                ep.hints = Some(zone_hint(zone));
            }
        }
        if zoneless {
            tracing::info!(
                key = %si.service_key,
                address_type = %si.address_type,
                "endpoint found without zone specified, removing hints"
            );
            events.push(HintEvent::disabled(format_with_address_type(
                NO_ZONE_SPECIFIED,
                &si.address_type,
            )));
            return self.disable(si, events);
        }

        // Step 2: which zones give endpoints away and which receive them.
        let (giving, receiving) =
            giving_and_receiving_zones(&allocations, &allocated_hints_by_zone);

        // Step 3: move whole endpoints accordingly.
        let redistributions = redistribute_hints(
            si.to_create.iter_mut().chain(si.to_update.iter_mut()),
            giving,
            receiving,
        );
        for (zone, diff) in redistributions {
            let count = allocated_hints_by_zone.entry(zone).or_insert(0);
            *count = count.saturating_add(diff);
        }

        if allocated_hints_by_zone.is_empty() {
            tracing::debug!(
                key = %si.service_key,
                address_type = %si.address_type,
                "no hints allocated for zones, removing them"
            );
            events.push(HintEvent::disabled(format_with_address_type(
                NO_ALLOCATED_HINTS_FOR_ZONES,
                &si.address_type,
            )));
            return self.disable(si, events);
        }

        let mut state = self.lock();
        let hints_were_enabled = state.hints_populated_by_service.contains(&si.service_key);
        state.set_hints(&si.service_key, &si.address_type, allocated_hints_by_zone);
        drop(state);

        if !hints_were_enabled {
            tracing::info!(
                key = %si.service_key,
                address_type = %si.address_type,
                "topology aware hints has been enabled, adding hints"
            );
            events.push(HintEvent {
                warning: false,
                reason: REASON_TOPOLOGY_AWARE_HINTS_ENABLED,
                message: format_with_address_type(TOPOLOGY_AWARE_HINTS_ENABLED, &si.address_type),
            });
        }
        (si.to_create, si.to_update, events)
    }

    /// Upstream's disabling path in `AddHints`: forget the allocation, strip every hint.
    fn disable(
        &self,
        si: SliceInfo,
        events: Vec<HintEvent>,
    ) -> (Vec<EndpointSlice>, Vec<EndpointSlice>, Vec<HintEvent>) {
        self.remove_hints(&si.service_key, &si.address_type);
        let (to_create, to_update) = remove_hints_from_slices(si);
        (to_create, to_update, events)
    }

    /// Upstream `SetHints`: record the hints allocated per zone for a Service address type.
    pub fn set_hints(
        &self,
        service_key: &str,
        address_type: &str,
        allocated_hints_by_zone: BTreeMap<String, i64>,
    ) {
        self.lock()
            .set_hints(service_key, address_type, allocated_hints_by_zone);
    }

    /// ES-18/ES-19: upstream `RemoveHints`: forget the address type's allocation; the Service no longer
    /// counts as having populated hints (even if another address type still has some).
    pub fn remove_hints(&self, service_key: &str, address_type: &str) {
        let mut state = self.lock();
        if let Some(by_type) = state.endpoints_by_service.get_mut(service_key) {
            by_type.remove(address_type);
            if by_type.is_empty() {
                state.endpoints_by_service.remove(service_key);
            }
        }
        state.hints_populated_by_service.remove(service_key);
    }

    /// ES-18: upstream `HasPopulatedHints` (the reconciler warns "has been disabled" when Auto
    /// is dropped while this holds).
    pub fn has_populated_hints(&self, service_key: &str) -> bool {
        self.lock().hints_populated_by_service.contains(service_key)
    }

    /// Upstream `getAllocations`: minimum/maximum/desired endpoints per zone for
    /// `num_endpoints` ready endpoints, or the Warning event (message without the address
    /// type) explaining why hints cannot be allocated.
    fn allocations(&self, num_endpoints: i64) -> Result<BTreeMap<String, Allocation>, HintEvent> {
        let state = self.lock();
        let Some(ratios) = state.cpu_ratios_by_zone.as_ref() else {
            return Err(HintEvent::disabled(INSUFFICIENT_NODE_INFO.to_owned()));
        };
        if ratios.len() < 2 {
            return Err(HintEvent::disabled(NODES_READY_IN_ONE_ZONE_ONLY.to_owned()));
        }
        let zones = i64::try_from(ratios.len()).unwrap_or(i64::MAX);
        if zones > num_endpoints {
            return Err(HintEvent::disabled(format!(
                "{INSUFFICIENT_NUMBER_OF_ENDPOINTS} ({num_endpoints} endpoints, {zones} zones)"
            )));
        }

        let mut remaining_min_endpoints = num_endpoints;
        let mut min_total: i64 = 0;
        let mut allocations = BTreeMap::new();
        // Determinism: the outcome does not depend on the order (minimums are never
        // negative for non-negative ratios, and the sum is compared either way).
        for (zone, ratio) in ratios {
            let desired = ratio * num_endpoints as f64;
            let minimum = f64_to_i64((desired * overload_factor()).ceil());
            allocations.insert(
                zone.clone(),
                Allocation {
                    minimum,
                    maximum: 0,
                    desired: desired.max(minimum as f64),
                },
            );
            min_total = min_total.saturating_add(minimum);
            remaining_min_endpoints = remaining_min_endpoints.saturating_sub(minimum);
            if remaining_min_endpoints < 0 {
                return Err(HintEvent::disabled(format!(
                    "{MIN_ALLOCATION_EXCEEDS_OVERLOAD_THRESHOLD} ({num_endpoints} endpoints, {zones} zones)"
                )));
            }
        }
        let spare = num_endpoints.saturating_sub(min_total);
        for allocation in allocations.values_mut() {
            allocation.maximum = allocation.minimum.saturating_add(spare);
        }
        Ok(allocations)
    }
}

impl CacheState {
    fn set_hints(&mut self, service_key: &str, address_type: &str, counts: ZoneCounts) {
        self.endpoints_by_service
            .entry(service_key.to_owned())
            .or_default()
            .insert(address_type.to_owned(), counts);
        self.hints_populated_by_service
            .insert(service_key.to_owned());
    }
}

impl SliceInfo {
    /// Upstream `getTotalReadyEndpoints`.
    fn total_ready_endpoints(&self) -> i64 {
        let ready = self
            .to_create
            .iter()
            .chain(&self.to_update)
            .chain(&self.unchanged)
            .flat_map(|s| s.endpoints.iter().flatten())
            .filter(|ep| endpoint_ready(ep))
            .count();
        i64::try_from(ready).unwrap_or(i64::MAX)
    }

    /// Upstream `getAllocatedHintsByZone`: counts hints of unchanged slices that remain
    /// consistent and moves the others (in order) to the end of `to_update`.
    fn allocated_hints_by_zone(
        &mut self,
        allocations: &BTreeMap<String, Allocation>,
    ) -> ZoneCounts {
        let mut allocated = ZoneCounts::new();
        let unchanged = std::mem::take(&mut self.unchanged);
        for slice in unchanged {
            match hints_by_zone(&slice, &allocated, allocations) {
                Some(hints) => {
                    for (zone, n) in hints {
                        let count = allocated.entry(zone).or_insert(0);
                        *count = count.saturating_add(n);
                    }
                    self.unchanged.push(slice);
                }
                None => self.to_update.push(slice),
            }
        }
        allocated
    }
}

/// ES-18/ES-19: upstream `RemoveHintsFromSlices`: strips every hint from the slices to create and update,
/// and moves (in order, after the caller's) the unchanged slices that carried any hint — even
/// on a not-ready endpoint — to `to_update`. Returns `(to_create, to_update)`.
pub fn remove_hints_from_slices(si: SliceInfo) -> (Vec<EndpointSlice>, Vec<EndpointSlice>) {
    let SliceInfo {
        mut to_create,
        mut to_update,
        unchanged,
        ..
    } = si;
    for slice in to_create.iter_mut().chain(to_update.iter_mut()) {
        strip_hints(slice);
    }
    for mut slice in unchanged {
        let hinted = slice
            .endpoints
            .iter()
            .flatten()
            .any(|ep| ep.hints.is_some());
        if hinted {
            strip_hints(&mut slice);
            to_update.push(slice);
        }
    }
    (to_create, to_update)
}

fn strip_hints(slice: &mut EndpointSlice) {
    for ep in slice.endpoints.iter_mut().flatten() {
        ep.hints = None;
    }
}

fn zone_hint(zone: &str) -> EndpointHints {
    EndpointHints {
        for_zones: Some(vec![ForZone {
            name: zone.to_owned(),
        }]),
        for_nodes: None,
    }
}

/// Upstream `EndpointReady`: the Ready condition is explicitly true.
fn endpoint_ready(ep: &Endpoint) -> bool {
    ep.conditions.as_ref().and_then(|c| c.ready) == Some(true)
}

/// `1 / (1 + overloadThreshold)`: a minimum of ⌈desired/1.2⌉ keeps any zone's endpoints at
/// most 20 % over their share.
fn overload_factor() -> f64 {
    1.0 / (1.0 + OVERLOAD_THRESHOLD)
}

/// Go's `int(f)` for the values reachable here; saturating (and NaN → 0) instead of
/// implementation-defined.
fn f64_to_i64(f: f64) -> i64 {
    // `as` saturates at the bounds and maps NaN to 0.
    f as i64
}

/// Upstream `redistributeHints`: moves ready endpoints whose zone is giving to a receiving
/// zone, rewriting their hint, and returns the change of allocated hints per zone.
/// Determinism: receiving zones are tried in name order (upstream: Go map order).
fn redistribute_hints<'a>(
    slices: impl Iterator<Item = &'a mut EndpointSlice>,
    mut giving: ZoneCounts,
    mut receiving: ZoneCounts,
) -> ZoneCounts {
    let mut redistributions = ZoneCounts::new();
    for slice in slices {
        for ep in slice.endpoints.iter_mut().flatten() {
            if !endpoint_ready(ep) {
                continue;
            }
            if giving.is_empty() || receiving.is_empty() {
                return redistributions;
            }
            // Zoneless ready endpoints were rejected by AddHints before this point.
            let Some(giving_zone) = ep.zone.clone().filter(|z| !z.is_empty()) else {
                continue;
            };
            let Some(num_to_give) = giving.get(&giving_zone).copied().filter(|n| *n > 0) else {
                continue;
            };
            let Some((receiving_zone, num_to_receive)) = receiving
                .iter()
                .find(|(_, n)| **n > 0)
                .map(|(z, n)| (z.clone(), *n))
            else {
                continue;
            };
            ep.hints = Some(zone_hint(&receiving_zone));
            if num_to_give == 1 {
                giving.remove(&giving_zone);
            } else {
                giving.insert(giving_zone.clone(), num_to_give.saturating_sub(1));
            }
            if num_to_receive == 1 {
                receiving.remove(&receiving_zone);
            } else {
                receiving.insert(receiving_zone.clone(), num_to_receive.saturating_sub(1));
            }
            let received = redistributions.entry(receiving_zone).or_insert(0);
            *received = received.saturating_add(1);
            let given = redistributions.entry(giving_zone).or_insert(0);
            *given = given.saturating_sub(1);
        }
    }
    redistributions
}

/// Upstream `getGivingAndReceivingZones`: whole endpoints each zone should give away and
/// receive, from the desired (fractional) allocation and the hints currently allocated.
fn giving_and_receiving_zones(
    allocations: &BTreeMap<String, Allocation>,
    allocated_hints_by_zone: &ZoneCounts,
) -> (ZoneCounts, ZoneCounts) {
    let mut giving_desired: BTreeMap<String, f64> = BTreeMap::new();
    let mut receiving_desired: BTreeMap<String, f64> = BTreeMap::new();
    for (zone, allocation) in allocations {
        let allocated = allocated_hints_by_zone.get(zone).copied().unwrap_or(0) as f64;
        let target = allocation.desired;
        if allocated > target {
            giving_desired.insert(zone.clone(), allocated - target);
        } else if allocated < target {
            receiving_desired.insert(zone.clone(), target - allocated);
        }
    }

    let mut giving = ZoneCounts::new();
    let mut receiving = ZoneCounts::new();
    // No zone left on either side also ends the loop (upstream: an empty zone name).
    while let (Some((giving_zone, to_give)), Some((receiving_zone, to_receive))) =
        (most(&giving_desired), most(&receiving_desired))
    {
        // Stop when both sides need less than one endpoint, or either less than half of one.
        if (to_give < 1.0 && to_receive < 1.0) || to_give < 0.5 || to_receive < 0.5 {
            break;
        }
        let g = giving.entry(giving_zone.clone()).or_insert(0);
        *g = g.saturating_add(1);
        let r = receiving.entry(receiving_zone.clone()).or_insert(0);
        *r = r.saturating_add(1);
        giving_desired.insert(giving_zone, to_give - 1.0);
        receiving_desired.insert(receiving_zone, to_receive - 1.0);
    }
    (giving, receiving)
}

/// Upstream `getMost`: the zone with the greatest strictly positive value.
/// Determinism: among equal values the first zone by name wins (upstream: Go map order).
fn most(zones: &BTreeMap<String, f64>) -> Option<(String, f64)> {
    let mut best: Option<(&String, f64)> = None;
    for (zone, n) in zones {
        if *n > best.map_or(0.0, |(_, b)| b) {
            best = Some((zone, *n));
        }
    }
    best.map(|(z, n)| (z.clone(), n))
}

/// Upstream `getHintsByZone`: hints per zone of a slice's ready endpoints, or `None` when the
/// slice must be rewritten: a ready endpoint without zone hints, a hint for a zone without
/// allocation, or hints exceeding a zone's maximum given what is already allocated.
fn hints_by_zone(
    slice: &EndpointSlice,
    allocated_hints_by_zone: &ZoneCounts,
    allocations: &BTreeMap<String, Allocation>,
) -> Option<ZoneCounts> {
    let mut hints = ZoneCounts::new();
    for ep in slice.endpoints.iter().flatten() {
        if !endpoint_ready(ep) {
            continue;
        }
        let for_zones = ep.hints.as_ref().and_then(|h| h.for_zones.as_deref());
        let for_zones = for_zones.filter(|z| !z.is_empty())?;
        for hint in for_zones {
            if !allocations.contains_key(&hint.name) {
                return None;
            }
            let count = hints.entry(hint.name.clone()).or_insert(0);
            *count = count.saturating_add(1);
        }
    }
    for (zone, n) in &hints {
        let already = allocated_hints_by_zone.get(zone).copied().unwrap_or(0);
        let allocation = allocations.get(zone)?;
        if n.saturating_add(already) > allocation.maximum {
            return None;
        }
    }
    Some(hints)
}

/// Upstream `serviceOverloaded`: some zone with CPU has fewer allocated endpoints than its
/// minimum. An allocation but no ratios (insufficient node info) counts as overloaded.
fn service_overloaded(ezi: &ZoneCounts, zone_ratios: Option<&BTreeMap<String, f64>>) -> bool {
    if ezi.is_empty() {
        return false;
    }
    let Some(zone_ratios) = zone_ratios.filter(|r| !r.is_empty()) else {
        return true;
    };
    let total_endpoints: f64 = ezi.values().map(|n| *n as f64).sum();
    zone_ratios.iter().any(|(zone, ratio)| match ezi.get(zone) {
        None => true,
        Some(n) => {
            let min_endpoints = (total_endpoints * ratio * overload_factor()).ceil();
            *n < f64_to_i64(min_endpoints)
        }
    })
}

/// Upstream `hasExcludedLabels`: control-plane nodes (any value) are not capacity.
fn has_excluded_labels(labels: Option<&BTreeMap<String, String>>) -> bool {
    labels.is_some_and(|l| EXCLUDED_NODE_LABELS.iter().any(|k| l.contains_key(*k)))
}

/// Upstream `isNodeReady`: the first `Ready` condition decides; none means not ready.
fn is_node_ready(node: &Node) -> bool {
    node.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .and_then(|cs| cs.iter().find(|c| c.type_ == "Ready"))
        .is_some_and(|c| c.status == "True")
}

/// `status.allocatable["cpu"]` in nano-cores; `None` when absent or unparseable.
fn node_allocatable_cpu_nano(node: &Node) -> Option<i128> {
    let q = node.status.as_ref()?.allocatable.as_ref()?.get("cpu")?;
    quantity::parse_nano(&q.0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{NodeCondition, NodeStatus};
    use k8s_openapi::api::discovery::v1::EndpointConditions;
    use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

    // ----- helpers -------------------------------------------------------------------

    fn ep(addr: &str, zone: Option<&str>, ready: Option<bool>, hint: Option<&[&str]>) -> Endpoint {
        Endpoint {
            addresses: vec![addr.to_owned()],
            zone: zone.map(str::to_owned),
            conditions: Some(EndpointConditions {
                ready,
                ..Default::default()
            }),
            hints: hint.map(|zs| EndpointHints {
                for_zones: Some(
                    zs.iter()
                        .map(|z| ForZone {
                            name: (*z).to_owned(),
                        })
                        .collect(),
                ),
                for_nodes: None,
            }),
            ..Default::default()
        }
    }
    /// Ready endpoint in `zone`, no hints.
    fn r(addr: &str, zone: &str) -> Endpoint {
        ep(addr, Some(zone), Some(true), None)
    }
    /// Ready endpoint in `zone`, hinted to `hint`.
    fn rh(addr: &str, zone: &str, hint: &str) -> Endpoint {
        ep(addr, Some(zone), Some(true), Some(&[hint]))
    }
    fn slice(name: &str, endpoints: Vec<Endpoint>) -> EndpointSlice {
        EndpointSlice {
            address_type: "IPv4".into(),
            endpoints: Some(endpoints),
            metadata: ObjectMeta {
                name: Some(name.to_owned()),
                ..Default::default()
            },
            ..Default::default()
        }
    }
    fn si(
        to_create: Vec<EndpointSlice>,
        to_update: Vec<EndpointSlice>,
        unchanged: Vec<EndpointSlice>,
    ) -> SliceInfo {
        SliceInfo {
            service_key: "ns/svc".into(),
            address_type: "IPv4".into(),
            to_create,
            to_update,
            unchanged,
        }
    }
    fn cache_with_ratios(ratios: Option<&[(&str, f64)]>) -> TopologyCache {
        let cache = TopologyCache::new();
        cache.lock().cpu_ratios_by_zone =
            ratios.map(|rs| rs.iter().map(|(z, r)| ((*z).to_owned(), *r)).collect());
        cache
    }
    fn counts(pairs: &[(&str, i64)]) -> ZoneCounts {
        pairs.iter().map(|(z, n)| ((*z).to_owned(), *n)).collect()
    }
    fn enabled_event() -> HintEvent {
        HintEvent {
            warning: false,
            reason: REASON_TOPOLOGY_AWARE_HINTS_ENABLED,
            message: "Topology Aware Hints has been enabled, addressType: IPv4".into(),
        }
    }
    fn disabled_event(message: &str) -> HintEvent {
        HintEvent {
            warning: true,
            reason: REASON_TOPOLOGY_AWARE_HINTS_DISABLED,
            message: message.to_owned(),
        }
    }
    fn node(
        zone: Option<&str>,
        cpu: Option<&str>,
        ready: &str,
        extra: &[(&str, &str)],
    ) -> Arc<Node> {
        let mut labels: BTreeMap<String, String> = extra
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect();
        if let Some(z) = zone {
            labels.insert(LABEL_TOPOLOGY_ZONE.into(), z.into());
        }
        Arc::new(Node {
            metadata: ObjectMeta {
                name: Some("n".into()),
                labels: Some(labels),
                ..Default::default()
            },
            status: Some(NodeStatus {
                allocatable: cpu.map(|c| BTreeMap::from([("cpu".to_owned(), Quantity(c.into()))])),
                conditions: Some(vec![NodeCondition {
                    type_: "Ready".into(),
                    status: ready.into(),
                    ..Default::default()
                }]),
                ..Default::default()
            }),
            ..Default::default()
        })
    }
    fn ready_node(zone: &str, cpu: &str) -> Arc<Node> {
        node(Some(zone), Some(cpu), "True", &[])
    }
    fn stored(cache: &TopologyCache, key: &str) -> Option<BTreeMap<String, ZoneCounts>> {
        cache.lock().endpoints_by_service.get(key).cloned()
    }
    fn ratios_of(cache: &TopologyCache) -> Option<BTreeMap<String, f64>> {
        cache.lock().cpu_ratios_by_zone.clone()
    }

    // ----- AddHints (upstream TestAddHints + E9) -------------------------------------

    struct AddHintsCase {
        name: &'static str,
        ratios: Option<&'static [(&'static str, f64)]>,
        si: SliceInfo,
        want_stored: Option<ZoneCounts>,
        want_create: Vec<EndpointSlice>,
        want_update: Vec<EndpointSlice>,
        want_events: Vec<HintEvent>,
    }

    fn add_hints_cases() -> Vec<AddHintsCase> {
        let insufficient = "Insufficient Node information: allocatable CPU or zone not specified on one or more nodes, addressType: IPv4";
        vec![
            AddHintsCase {
                name: "es19_empty_no_ratios",
                ratios: None,
                si: si(vec![], vec![], vec![]),
                want_stored: None,
                want_create: vec![],
                want_update: vec![],
                want_events: vec![disabled_event(insufficient)],
            },
            AddHintsCase {
                name: "es19_slice_to_create_no_ratios",
                ratios: None,
                si: si(
                    vec![slice("a", vec![r("10.1.2.3", "zone-a")])],
                    vec![],
                    vec![],
                ),
                want_stored: None,
                want_create: vec![slice("a", vec![r("10.1.2.3", "zone-a")])],
                want_update: vec![],
                want_events: vec![disabled_event(insufficient)],
            },
            AddHintsCase {
                name: "es19_two_endpoints_three_zones",
                ratios: Some(&[("zone-a", 0.3), ("zone-b", 0.4), ("zone-c", 0.3)]),
                si: si(
                    vec![slice(
                        "a",
                        vec![r("10.1.2.3", "zone-a"), r("10.1.2.4", "zone-b")],
                    )],
                    vec![],
                    vec![],
                ),
                want_stored: None,
                want_create: vec![slice(
                    "a",
                    vec![r("10.1.2.3", "zone-a"), r("10.1.2.4", "zone-b")],
                )],
                want_update: vec![],
                want_events: vec![disabled_event(
                    "Insufficient number of endpoints (2 endpoints, 3 zones), addressType: IPv4",
                )],
            },
            AddHintsCase {
                name: "es19_two_endpoints_two_zones",
                ratios: Some(&[("zone-a", 0.45), ("zone-b", 0.55)]),
                si: si(
                    vec![slice(
                        "a",
                        vec![r("10.1.2.3", "zone-a"), r("10.1.2.4", "zone-b")],
                    )],
                    vec![],
                    vec![],
                ),
                want_stored: Some(counts(&[("zone-a", 1), ("zone-b", 1)])),
                want_create: vec![slice(
                    "a",
                    vec![
                        rh("10.1.2.3", "zone-a", "zone-a"),
                        rh("10.1.2.4", "zone-b", "zone-b"),
                    ],
                )],
                want_update: vec![],
                want_events: vec![enabled_event()],
            },
            AddHintsCase {
                name: "es19_not_ready_and_unknown_endpoints_get_no_hints",
                ratios: Some(&[("zone-a", 0.45), ("zone-b", 0.55)]),
                si: si(
                    vec![slice(
                        "a",
                        vec![
                            r("10.1.2.3", "zone-a"),
                            r("10.1.2.4", "zone-b"),
                            ep("10.1.2.5", Some("zone-b"), Some(false), None),
                            ep("10.1.2.6", Some("zone-b"), None, None),
                        ],
                    )],
                    vec![],
                    vec![],
                ),
                want_stored: Some(counts(&[("zone-a", 1), ("zone-b", 1)])),
                want_create: vec![slice(
                    "a",
                    vec![
                        rh("10.1.2.3", "zone-a", "zone-a"),
                        rh("10.1.2.4", "zone-b", "zone-b"),
                        ep("10.1.2.5", Some("zone-b"), Some(false), None),
                        ep("10.1.2.6", Some("zone-b"), None, None),
                    ],
                )],
                want_update: vec![],
                want_events: vec![enabled_event()],
            },
            AddHintsCase {
                name: "es19_create_and_update_within_three_zone_threshold",
                ratios: Some(&[("zone-a", 0.35), ("zone-b", 0.35), ("zone-c", 0.30)]),
                si: si(
                    vec![
                        slice("c1", vec![r("10.1.2.3", "zone-a"), r("10.1.2.4", "zone-b")]),
                        slice(
                            "c2",
                            vec![
                                r("10.1.3.3", "zone-c"),
                                r("10.1.3.4", "zone-c"),
                                r("10.1.3.4", "zone-a"),
                            ],
                        ),
                    ],
                    vec![
                        slice("u1", vec![r("10.2.2.3", "zone-a"), r("10.2.2.4", "zone-a")]),
                        slice(
                            "u2",
                            vec![
                                r("10.2.3.3", "zone-b"),
                                r("10.2.3.4", "zone-c"),
                                r("10.2.3.4", "zone-a"),
                            ],
                        ),
                    ],
                    vec![],
                ),
                want_stored: Some(counts(&[("zone-a", 4), ("zone-b", 3), ("zone-c", 3)])),
                want_create: vec![
                    slice(
                        "c1",
                        vec![
                            rh("10.1.2.3", "zone-a", "zone-b"),
                            rh("10.1.2.4", "zone-b", "zone-b"),
                        ],
                    ),
                    slice(
                        "c2",
                        vec![
                            rh("10.1.3.3", "zone-c", "zone-c"),
                            rh("10.1.3.4", "zone-c", "zone-c"),
                            rh("10.1.3.4", "zone-a", "zone-a"),
                        ],
                    ),
                ],
                want_update: vec![
                    slice(
                        "u1",
                        vec![
                            rh("10.2.2.3", "zone-a", "zone-a"),
                            rh("10.2.2.4", "zone-a", "zone-a"),
                        ],
                    ),
                    slice(
                        "u2",
                        vec![
                            rh("10.2.3.3", "zone-b", "zone-b"),
                            rh("10.2.3.4", "zone-c", "zone-c"),
                            rh("10.2.3.4", "zone-a", "zone-a"),
                        ],
                    ),
                ],
                want_events: vec![enabled_event()],
            },
            // E9: three equal zones, six endpoints 2/2/2 → same-zone hints, Enabled event.
            AddHintsCase {
                name: "es19_three_equal_zones_six_endpoints",
                ratios: Some(&[
                    ("zone-a", 1.0 / 3.0),
                    ("zone-b", 1.0 / 3.0),
                    ("zone-c", 1.0 / 3.0),
                ]),
                si: si(
                    vec![slice(
                        "a",
                        vec![
                            r("10.0.0.1", "zone-a"),
                            r("10.0.0.2", "zone-a"),
                            r("10.0.0.3", "zone-b"),
                            r("10.0.0.4", "zone-b"),
                            r("10.0.0.5", "zone-c"),
                            r("10.0.0.6", "zone-c"),
                        ],
                    )],
                    vec![],
                    vec![],
                ),
                want_stored: Some(counts(&[("zone-a", 2), ("zone-b", 2), ("zone-c", 2)])),
                want_create: vec![slice(
                    "a",
                    vec![
                        rh("10.0.0.1", "zone-a", "zone-a"),
                        rh("10.0.0.2", "zone-a", "zone-a"),
                        rh("10.0.0.3", "zone-b", "zone-b"),
                        rh("10.0.0.4", "zone-b", "zone-b"),
                        rh("10.0.0.5", "zone-c", "zone-c"),
                        rh("10.0.0.6", "zone-c", "zone-c"),
                    ],
                )],
                want_update: vec![],
                want_events: vec![enabled_event()],
            },
            // A ready endpoint without zone disables hints for the whole address type.
            AddHintsCase {
                name: "es19_zoneless_ready_endpoint_disables",
                ratios: Some(&[("zone-a", 0.5), ("zone-b", 0.5)]),
                si: si(
                    vec![slice(
                        "a",
                        vec![
                            r("10.0.0.1", "zone-a"),
                            ep("10.0.0.2", Some(""), Some(true), None),
                            r("10.0.0.3", "zone-b"),
                        ],
                    )],
                    vec![],
                    vec![slice("u", vec![rh("10.0.0.4", "zone-b", "zone-b")])],
                ),
                want_stored: None,
                want_create: vec![slice(
                    "a",
                    vec![
                        r("10.0.0.1", "zone-a"),
                        ep("10.0.0.2", Some(""), Some(true), None),
                        r("10.0.0.3", "zone-b"),
                    ],
                )],
                want_update: vec![slice("u", vec![r("10.0.0.4", "zone-b")])],
                want_events: vec![disabled_event(
                    "One or more endpoints do not have a zone specified, addressType: IPv4",
                )],
            },
            // Consistent unchanged slices stay out; inconsistent ones move to update.
            AddHintsCase {
                name: "es19_consistent_unchanged_stay_inconsistent_move",
                ratios: Some(&[("zone-a", 0.5), ("zone-b", 0.5)]),
                si: si(
                    vec![],
                    vec![],
                    vec![
                        slice("ok", vec![rh("10.0.0.1", "zone-a", "zone-a")]),
                        slice("missing", vec![r("10.0.0.2", "zone-b")]),
                        slice("gone-zone", vec![rh("10.0.0.3", "zone-b", "zone-z")]),
                        slice("ok2", vec![rh("10.0.0.4", "zone-b", "zone-b")]),
                    ],
                ),
                want_stored: Some(counts(&[("zone-a", 2), ("zone-b", 2)])),
                want_create: vec![],
                want_update: vec![
                    // 4 endpoints, desired 2/2: one zone-b endpoint is re-hinted to zone-a.
                    slice("missing", vec![rh("10.0.0.2", "zone-b", "zone-a")]),
                    slice("gone-zone", vec![rh("10.0.0.3", "zone-b", "zone-b")]),
                ],
                want_events: vec![enabled_event()],
            },
            // Only reachable before the first set_nodes: upstream starts with an empty map.
            AddHintsCase {
                name: "es19_fresh_cache_one_zone_only",
                ratios: Some(&[]),
                si: si(
                    vec![slice("a", vec![rh("10.0.0.1", "zone-a", "zone-a")])],
                    vec![],
                    vec![],
                ),
                want_stored: None,
                want_create: vec![slice("a", vec![r("10.0.0.1", "zone-a")])],
                want_update: vec![],
                want_events: vec![disabled_event(
                    "Nodes only ready in one zone, addressType: IPv4",
                )],
            },
            AddHintsCase {
                name: "es19_min_allocation_exceeds_overload_threshold",
                // Minimums ⌈1.5/1.2⌉ = 2, ⌈0.75/1.2⌉ = 1, 1: 4 > 3 endpoints.
                ratios: Some(&[("zone-a", 0.5), ("zone-b", 0.25), ("zone-c", 0.25)]),
                si: si(
                    vec![slice(
                        "a",
                        vec![
                            r("10.0.0.1", "zone-a"),
                            r("10.0.0.2", "zone-b"),
                            r("10.0.0.3", "zone-c"),
                        ],
                    )],
                    vec![],
                    vec![],
                ),
                want_stored: None,
                want_create: vec![slice(
                    "a",
                    vec![
                        r("10.0.0.1", "zone-a"),
                        r("10.0.0.2", "zone-b"),
                        r("10.0.0.3", "zone-c"),
                    ],
                )],
                want_update: vec![],
                want_events: vec![disabled_event(
                    "Unable to allocate minimum required endpoints to each zone without exceeding overload threshold (3 endpoints, 3 zones), addressType: IPv4",
                )],
            },
            // Not-ready endpoints keep whatever hints they carried: upstream clears a loop copy.
            AddHintsCase {
                name: "es19_not_ready_endpoint_hint_left_untouched",
                ratios: Some(&[("zone-a", 0.5), ("zone-b", 0.5)]),
                si: si(
                    vec![],
                    vec![slice(
                        "u",
                        vec![
                            r("10.0.0.1", "zone-a"),
                            r("10.0.0.2", "zone-b"),
                            ep("10.0.0.3", Some("zone-b"), Some(false), Some(&["zone-b"])),
                        ],
                    )],
                    vec![],
                ),
                want_stored: Some(counts(&[("zone-a", 1), ("zone-b", 1)])),
                want_create: vec![],
                want_update: vec![slice(
                    "u",
                    vec![
                        rh("10.0.0.1", "zone-a", "zone-a"),
                        rh("10.0.0.2", "zone-b", "zone-b"),
                        ep("10.0.0.3", Some("zone-b"), Some(false), Some(&["zone-b"])),
                    ],
                )],
                want_events: vec![enabled_event()],
            },
            // Endpoints in a zone without nodes keep their own-zone hint (upstream counts them
            // but never redistributes zones absent from the allocation).
            AddHintsCase {
                name: "es19_endpoint_in_zone_without_nodes",
                ratios: Some(&[("zone-a", 0.5), ("zone-b", 0.5)]),
                si: si(
                    vec![slice(
                        "a",
                        vec![
                            r("10.0.0.1", "zone-a"),
                            r("10.0.0.2", "zone-b"),
                            r("10.0.0.3", "zone-x"),
                            r("10.0.0.4", "zone-x"),
                        ],
                    )],
                    vec![],
                    vec![],
                ),
                want_stored: Some(counts(&[("zone-a", 1), ("zone-b", 1), ("zone-x", 2)])),
                want_create: vec![slice(
                    "a",
                    vec![
                        rh("10.0.0.1", "zone-a", "zone-a"),
                        rh("10.0.0.2", "zone-b", "zone-b"),
                        rh("10.0.0.3", "zone-x", "zone-x"),
                        rh("10.0.0.4", "zone-x", "zone-x"),
                    ],
                )],
                want_update: vec![],
                want_events: vec![enabled_event()],
            },
            // Imbalance: 4 endpoints in zone-a, 0 in zone-b, equal CPU → 2 move to zone-b.
            AddHintsCase {
                name: "es19_redistributes_whole_endpoints",
                ratios: Some(&[("zone-a", 0.5), ("zone-b", 0.5)]),
                si: si(
                    vec![slice(
                        "a",
                        vec![
                            r("10.0.0.1", "zone-a"),
                            r("10.0.0.2", "zone-a"),
                            r("10.0.0.3", "zone-a"),
                            r("10.0.0.4", "zone-a"),
                        ],
                    )],
                    vec![],
                    vec![],
                ),
                want_stored: Some(counts(&[("zone-a", 2), ("zone-b", 2)])),
                want_create: vec![slice(
                    "a",
                    vec![
                        rh("10.0.0.1", "zone-a", "zone-b"),
                        rh("10.0.0.2", "zone-a", "zone-b"),
                        rh("10.0.0.3", "zone-a", "zone-a"),
                        rh("10.0.0.4", "zone-a", "zone-a"),
                    ],
                )],
                want_update: vec![],
                want_events: vec![enabled_event()],
            },
        ]
    }

    #[test]
    fn es19_add_hints_table() {
        for c in add_hints_cases() {
            let cache = cache_with_ratios(c.ratios);
            let (create, update, events) = cache.add_hints(c.si);
            assert_eq!(create, c.want_create, "{}: to_create", c.name);
            assert_eq!(update, c.want_update, "{}: to_update", c.name);
            assert_eq!(events, c.want_events, "{}: events", c.name);
            let want_stored = c
                .want_stored
                .map(|z| BTreeMap::from([("IPv4".to_owned(), z)]));
            assert_eq!(stored(&cache, "ns/svc"), want_stored, "{}: cache", c.name);
            assert_eq!(
                cache.has_populated_hints("ns/svc"),
                stored(&cache, "ns/svc").is_some(),
                "{}: populated",
                c.name
            );
        }
    }

    #[test]
    fn es19_enabled_event_only_first_time() {
        let cache = cache_with_ratios(Some(&[("zone-a", 0.5), ("zone-b", 0.5)]));
        let input = || {
            si(
                vec![slice(
                    "a",
                    vec![r("10.0.0.1", "zone-a"), r("10.0.0.2", "zone-b")],
                )],
                vec![],
                vec![],
            )
        };
        let (_, _, events) = cache.add_hints(input());
        assert_eq!(events, vec![enabled_event()]);
        let (_, _, events) = cache.add_hints(input());
        assert_eq!(events, vec![]);
        // Another address type of the same Service: hints already populated, no event.
        let mut v6 = input();
        v6.address_type = "IPv6".into();
        let (_, _, events) = cache.add_hints(v6);
        assert_eq!(events, vec![]);
        assert!(cache.has_populated_hints("ns/svc"));
        // Removing one address type clears "populated" for the whole Service.
        cache.remove_hints("ns/svc", "IPv6");
        assert!(!cache.has_populated_hints("ns/svc"));
        assert!(stored(&cache, "ns/svc").is_some());
        cache.remove_hints("ns/svc", "IPv4");
        assert!(stored(&cache, "ns/svc").is_none());
        let (_, _, events) = cache.add_hints(input());
        assert_eq!(events, vec![enabled_event()]);
    }

    /// E9 end to end through set_nodes: three equal zones, 2 endpoints → no hints.
    #[test]
    fn es19_e9_two_endpoints_three_zones_via_nodes() {
        let cache = TopologyCache::new();
        cache.set_nodes(&[
            ready_node("zone-a", "2"),
            ready_node("zone-b", "2"),
            ready_node("zone-c", "2"),
        ]);
        let (create, update, events) = cache.add_hints(si(
            vec![slice(
                "a",
                vec![rh("10.0.0.1", "zone-a", "zone-a"), r("10.0.0.2", "zone-b")],
            )],
            vec![],
            vec![slice("u", vec![rh("10.0.0.3", "zone-c", "zone-c")]).tap_not_ready()],
        ));
        assert_eq!(
            create,
            vec![slice(
                "a",
                vec![r("10.0.0.1", "zone-a"), r("10.0.0.2", "zone-b")]
            )]
        );
        // The unchanged slice carried a (not-ready) hint: stripped and moved to update.
        assert_eq!(
            update,
            vec![slice(
                "u",
                vec![ep("10.0.0.3", Some("zone-c"), Some(false), None)]
            )]
        );
        assert_eq!(
            events,
            vec![disabled_event(
                "Insufficient number of endpoints (2 endpoints, 3 zones), addressType: IPv4"
            )]
        );
        assert!(!cache.has_populated_hints("ns/svc"));
    }

    /// E9 through set_nodes: 3 equal zones, 6 endpoints 2/2/2.
    #[test]
    fn es19_e9_three_equal_zones_six_endpoints_via_nodes() {
        let cache = TopologyCache::new();
        cache.set_nodes(&[
            ready_node("zone-a", "4"),
            ready_node("zone-b", "4"),
            ready_node("zone-c", "4"),
        ]);
        let eps: Vec<_> = ["a", "a", "b", "b", "c", "c"]
            .iter()
            .enumerate()
            .map(|(i, z)| r(&format!("10.0.0.{i}"), &format!("zone-{z}")))
            .collect();
        let (create, update, events) = cache.add_hints(si(vec![slice("s", eps)], vec![], vec![]));
        assert!(update.is_empty());
        for e in create[0].endpoints.iter().flatten() {
            assert_eq!(e.hints, Some(zone_hint(e.zone.as_deref().unwrap())));
        }
        assert_eq!(events, vec![enabled_event()]);
        assert!(cache.overloaded_services().is_empty());

        // Same slices again, now unchanged: nothing to write, no event.
        let (create2, update2, events2) = cache.add_hints(si(vec![], vec![], create));
        assert!(create2.is_empty() && update2.is_empty() && events2.is_empty());

        // Zone-c loses its nodes' CPU share: the Service becomes overloaded.
        cache.set_nodes(&[
            ready_node("zone-a", "4"),
            ready_node("zone-b", "4"),
            ready_node("zone-c", "4"),
            ready_node("zone-c", "8"),
        ]);
        assert_eq!(cache.overloaded_services(), vec!["ns/svc".to_owned()]);
    }

    trait TapNotReady {
        fn tap_not_ready(self) -> Self;
    }
    impl TapNotReady for EndpointSlice {
        fn tap_not_ready(mut self) -> Self {
            for e in self.endpoints.iter_mut().flatten() {
                e.conditions = Some(EndpointConditions {
                    ready: Some(false),
                    ..Default::default()
                });
            }
            self
        }
    }

    // ----- RemoveHintsFromSlices ------------------------------------------------------

    #[test]
    fn es19_remove_hints_from_slices() {
        let (create, update) = remove_hints_from_slices(si(
            vec![slice("c", vec![rh("1", "zone-a", "zone-a")])],
            vec![slice("u", vec![rh("2", "zone-a", "zone-b")])],
            vec![
                slice("plain", vec![r("3", "zone-a")]),
                slice(
                    "hinted",
                    vec![
                        r("4", "zone-a"),
                        ep("5", Some("zone-a"), Some(false), Some(&[])),
                    ],
                ),
            ],
        ));
        assert_eq!(create, vec![slice("c", vec![r("1", "zone-a")])]);
        assert_eq!(
            update,
            vec![
                slice("u", vec![r("2", "zone-a")]),
                slice(
                    "hinted",
                    vec![r("4", "zone-a"), ep("5", Some("zone-a"), Some(false), None)]
                ),
            ]
        );
    }

    // ----- hintsEnabled ---------------------------------------------------------------

    #[test]
    fn es18_hints_enabled_table() {
        let dep = DEPRECATED_ANNOTATION_TOPOLOGY_AWARE_HINTS;
        let mode = ANNOTATION_TOPOLOGY_MODE;
        type Case<'a> = (&'a str, &'a [(&'a str, &'a str)], bool);
        let cases: &[Case] = &[
            ("es18_none", &[], false),
            ("es18_mode_auto", &[(mode, "Auto")], true),
            ("es18_mode_lower_auto", &[(mode, "auto")], true),
            ("es18_mode_upper_auto", &[(mode, "AUTO")], false),
            ("es18_mode_disabled", &[(mode, "Disabled")], false),
            ("es18_mode_empty", &[(mode, "")], false),
            ("es18_deprecated_auto", &[(dep, "Auto")], true),
            (
                "es18_deprecated_wins_when_disabled",
                &[(dep, "Disabled"), (mode, "Auto")],
                false,
            ),
            (
                "es18_deprecated_empty_wins",
                &[(dep, ""), (mode, "Auto")],
                false,
            ),
            (
                "es18_deprecated_auto_beats_mode",
                &[(dep, "auto"), (mode, "Disabled")],
                true,
            ),
        ];
        for (name, pairs, want) in cases {
            let map: BTreeMap<String, String> = pairs
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect();
            assert_eq!(hints_enabled(Some(&map)), *want, "{name}");
        }
        assert!(!hints_enabled(None));
    }

    #[test]
    fn es19_format_with_address_type() {
        assert_eq!(
            format_with_address_type(TOPOLOGY_AWARE_HINTS_DISABLED, "IPv6"),
            "Topology Aware Hints has been disabled, addressType: IPv6"
        );
    }

    // ----- SetNodes (upstream TestSetNodes) -------------------------------------------

    #[test]
    fn es19_set_nodes_table() {
        let cp = &[("node-role.kubernetes.io/control-plane", "")][..];
        let master = &[("node-role.kubernetes.io/master", "true")][..];
        type Want = Option<&'static [(&'static str, f64, i128)]>;
        let cases: Vec<(&str, Vec<Arc<Node>>, Want)> = vec![
            ("es19_nodes_empty", vec![], None),
            (
                "es19_nodes_single",
                vec![ready_node("zone-a", "1000m")],
                None,
            ),
            (
                "es19_nodes_single_zone",
                vec![ready_node("zone-a", "1000m"), ready_node("zone-a", "1000m")],
                None,
            ),
            (
                "es19_nodes_two_zones",
                vec![ready_node("zone-a", "1000m"), ready_node("zone-b", "1000m")],
                Some(&[
                    ("zone-a", 0.5, 1_000_000_000),
                    ("zone-b", 0.5, 1_000_000_000),
                ]),
            ),
            (
                "es19_nodes_unready_in_one_zone",
                vec![
                    node(Some("zone-a"), Some("1000m"), "False", &[]),
                    ready_node("zone-b", "1000m"),
                ],
                None,
            ),
            (
                "es19_nodes_control_plane_in_one_zone",
                vec![
                    ready_node("zone-a", "1000m"),
                    node(Some("zone-b"), Some("1000m"), "True", cp),
                ],
                None,
            ),
            (
                "es19_nodes_unready_extra_node_ignored",
                vec![
                    ready_node("zone-a", "1000m"),
                    ready_node("zone-b", "1000m"),
                    node(Some("zone-b"), Some("1000m"), "Unknown", &[]),
                ],
                Some(&[
                    ("zone-a", 0.5, 1_000_000_000),
                    ("zone-b", 0.5, 1_000_000_000),
                ]),
            ),
            (
                "es19_nodes_master_extra_node_ignored",
                vec![
                    ready_node("zone-a", "1000m"),
                    ready_node("zone-b", "1000m"),
                    node(Some("zone-b"), Some("1000m"), "True", master),
                    node(None, None, "True", cp),
                ],
                Some(&[
                    ("zone-a", 0.5, 1_000_000_000),
                    ("zone-b", 0.5, 1_000_000_000),
                ]),
            ),
            (
                "es19_nodes_three_zones_weighted",
                vec![
                    ready_node("zone-a", "1000m"),
                    ready_node("zone-a", "1000m"),
                    ready_node("zone-a", "1000m"),
                    ready_node("zone-a", "2000m"),
                    ready_node("zone-b", "3000m"),
                    ready_node("zone-b", "1500m"),
                    ready_node("zone-c", "500m"),
                ],
                Some(&[
                    ("zone-a", 0.5, 5_000_000_000),
                    ("zone-b", 0.45, 4_500_000_000),
                    ("zone-c", 0.05, 500_000_000),
                ]),
            ),
            (
                "es19_nodes_zoneless_node_disables",
                vec![
                    ready_node("zone-a", "1"),
                    ready_node("zone-b", "1"),
                    node(None, Some("1"), "True", &[]),
                ],
                None,
            ),
            (
                "es19_nodes_empty_zone_label_disables",
                vec![
                    ready_node("zone-a", "1"),
                    ready_node("zone-b", "1"),
                    ready_node("", "1"),
                ],
                None,
            ),
            (
                "es19_nodes_missing_cpu_disables",
                vec![
                    ready_node("zone-a", "1"),
                    node(Some("zone-b"), None, "True", &[]),
                    ready_node("zone-c", "1"),
                ],
                None,
            ),
            (
                "es19_nodes_zero_cpu_disables",
                vec![ready_node("zone-a", "1"), ready_node("zone-b", "0")],
                None,
            ),
            (
                "es19_nodes_unparseable_cpu_disables",
                vec![ready_node("zone-a", "1"), ready_node("zone-b", "one")],
                None,
            ),
            (
                "es19_nodes_no_conditions_not_ready",
                vec![
                    ready_node("zone-a", "1"),
                    ready_node("zone-b", "1"),
                    Arc::new(Node::default()),
                ],
                Some(&[
                    ("zone-a", 0.5, 1_000_000_000),
                    ("zone-b", 0.5, 1_000_000_000),
                ]),
            ),
            (
                // Ratios are of milli-values rounded up: 1n → 1m, 1 → 1000m.
                "es19_nodes_tiny_cpu_rounds_up_to_one_milli",
                vec![ready_node("zone-a", "1n"), ready_node("zone-b", "999m")],
                Some(&[
                    ("zone-a", 1.0 / 1000.0, 1),
                    ("zone-b", 999.0 / 1000.0, 999_000_000),
                ]),
            ),
        ];
        for (name, nodes, want) in cases {
            let cache = TopologyCache::new();
            cache.set_nodes(&nodes);
            let state = cache.lock();
            match want {
                None => {
                    assert!(!state.sufficient_node_info, "{name}");
                    assert_eq!(state.cpu_ratios_by_zone, None, "{name}");
                    assert_eq!(state.cpu_by_zone, None, "{name}");
                }
                Some(want) => {
                    assert!(state.sufficient_node_info, "{name}");
                    let ratios: BTreeMap<String, f64> =
                        want.iter().map(|(z, r, _)| ((*z).to_owned(), *r)).collect();
                    let cpu: BTreeMap<String, i128> =
                        want.iter().map(|(z, _, c)| ((*z).to_owned(), *c)).collect();
                    assert_eq!(state.cpu_ratios_by_zone.as_ref(), Some(&ratios), "{name}");
                    assert_eq!(state.cpu_by_zone.as_ref(), Some(&cpu), "{name}");
                }
            }
        }
    }

    #[test]
    fn es19_set_nodes_after_bad_node_forgets_ratios() {
        let cache = TopologyCache::new();
        cache.set_nodes(&[ready_node("zone-a", "1"), ready_node("zone-b", "1")]);
        assert!(ratios_of(&cache).is_some());
        cache.set_nodes(&[ready_node("zone-a", "1")]);
        assert!(ratios_of(&cache).is_none());
    }

    #[test]
    fn es19_cache_is_send_and_sync_and_survives_concurrency() {
        fn assert_send_sync<T: Send + Sync>() {}
        assert_send_sync::<TopologyCache>();
        let cache = Arc::new(TopologyCache::new());
        let nodes = vec![ready_node("zone-a", "1"), ready_node("zone-b", "1")];
        std::thread::scope(|s| {
            s.spawn(|| cache.set_nodes(&nodes));
            s.spawn(|| {
                cache.add_hints(si(
                    vec![slice("a", vec![r("1", "zone-a"), r("2", "zone-b")])],
                    vec![],
                    vec![],
                ))
            });
            s.spawn(|| cache.has_populated_hints("ns/svc"));
            s.spawn(|| cache.overloaded_services());
        });
    }

    // ----- GetOverloadedServices / serviceOverloaded ----------------------------------

    #[test]
    fn es19_service_overloaded_table() {
        let half: BTreeMap<String, f64> =
            [("zone-a".to_owned(), 0.5), ("zone-b".to_owned(), 0.5)].into();
        type Case<'a> = (&'a str, ZoneCounts, Option<&'a BTreeMap<String, f64>>, bool);
        let cases: Vec<Case> = vec![
            ("es19_overload_empty_allocation", counts(&[]), None, false),
            (
                "es19_overload_no_ratios",
                counts(&[("zone-a", 1)]),
                None,
                true,
            ),
            (
                "es19_overload_balanced",
                counts(&[("zone-a", 2), ("zone-b", 2)]),
                Some(&half),
                false,
            ),
            // 6 endpoints, min ⌈6·0.5/1.2⌉ = 3: 3/3 fine, 4/2 overloaded.
            (
                "es19_overload_within",
                counts(&[("zone-a", 3), ("zone-b", 3)]),
                Some(&half),
                false,
            ),
            (
                "es19_overload_below_min",
                counts(&[("zone-a", 4), ("zone-b", 2)]),
                Some(&half),
                true,
            ),
            (
                "es19_overload_missing_zone",
                counts(&[("zone-a", 4)]),
                Some(&half),
                true,
            ),
        ];
        for (name, ezi, ratios, want) in cases {
            assert_eq!(service_overloaded(&ezi, ratios), want, "{name}");
        }
    }

    #[test]
    fn es19_overloaded_services_sorted() {
        let cache = TopologyCache::new();
        cache.set_hints("ns/b", "IPv4", counts(&[("zone-a", 1)]));
        cache.set_hints("ns/a", "IPv6", counts(&[("zone-a", 1)]));
        cache.set_hints("ns/c", "IPv4", counts(&[]));
        // Fresh cache: empty ratios → every non-empty allocation is overloaded.
        assert_eq!(
            cache.overloaded_services(),
            vec!["ns/a".to_owned(), "ns/b".to_owned()]
        );
    }

    // ----- internals (upstream utils_test.go, sliceinfo_test.go) ----------------------

    fn alloc_desired(pairs: &[(&str, f64)]) -> BTreeMap<String, Allocation> {
        pairs
            .iter()
            .map(|(z, d)| {
                (
                    (*z).to_owned(),
                    Allocation {
                        desired: *d,
                        ..Default::default()
                    },
                )
            })
            .collect()
    }
    fn alloc_max(pairs: &[(&str, i64)]) -> BTreeMap<String, Allocation> {
        pairs
            .iter()
            .map(|(z, m)| {
                (
                    (*z).to_owned(),
                    Allocation {
                        maximum: *m,
                        ..Default::default()
                    },
                )
            })
            .collect()
    }

    #[test]
    fn es19_redistribute_hints_table() {
        let a = || rh("", "zone-a", "zone-a");
        let cases: Vec<(&str, Vec<EndpointSlice>, ZoneCounts, ZoneCounts, ZoneCounts)> = vec![
            ("empty", vec![], counts(&[]), counts(&[]), counts(&[])),
            (
                "single endpoint",
                vec![slice("s", vec![a()])],
                counts(&[("zone-a", 1)]),
                counts(&[("zone-b", 1)]),
                counts(&[("zone-a", -1), ("zone-b", 1)]),
            ),
            (
                "one zone to two others",
                vec![slice("s", vec![a(), a(), a()])],
                counts(&[("zone-a", 2)]),
                counts(&[("zone-b", 1), ("zone-c", 1)]),
                counts(&[("zone-a", -2), ("zone-b", 1), ("zone-c", 1)]),
            ),
        ];
        for (name, mut slices, giving, receiving, want) in cases {
            let got = redistribute_hints(slices.iter_mut(), giving, receiving);
            assert_eq!(got, want, "{name}");
        }
        // The moved endpoints are re-hinted, receiving zones in name order.
        let mut slices = vec![slice("s", vec![a(), a(), a()])];
        redistribute_hints(
            slices.iter_mut(),
            counts(&[("zone-a", 2)]),
            counts(&[("zone-b", 1), ("zone-c", 1)]),
        );
        assert_eq!(
            slices,
            vec![slice(
                "s",
                vec![rh("", "zone-a", "zone-b"), rh("", "zone-a", "zone-c"), a()]
            )]
        );
    }

    #[test]
    fn es19_giving_and_receiving_zones_table() {
        type Case = (
            &'static str,
            Vec<(&'static str, f64)>,
            ZoneCounts,
            ZoneCounts,
            ZoneCounts,
        );
        let cases: Vec<Case> = vec![
            ("empty", vec![], counts(&[]), counts(&[]), counts(&[])),
            (
                "no rebalancing needed",
                vec![("zone-a", 1.2), ("zone-b", 1.1), ("zone-c", 1.0)],
                counts(&[("zone-a", 1), ("zone-b", 1), ("zone-c", 1)]),
                counts(&[]),
                counts(&[]),
            ),
            (
                "prefer same zone over slightly better distribution",
                vec![("zone-a", 5.1), ("zone-b", 5.1), ("zone-c", 5.8)],
                counts(&[("zone-a", 16)]),
                counts(&[("zone-a", 10)]),
                counts(&[("zone-b", 5), ("zone-c", 5)]),
            ),
            (
                "two zones need < 1, give to the neediest",
                vec![("zone-a", 5.0), ("zone-b", 5.6), ("zone-c", 5.4)],
                counts(&[("zone-a", 16)]),
                counts(&[("zone-a", 11)]),
                counts(&[("zone-b", 6), ("zone-c", 5)]),
            ),
            (
                "two zones with extra, give from the richest",
                vec![("zone-a", 5.0), ("zone-b", 5.6), ("zone-c", 5.4)],
                counts(&[("zone-b", 8), ("zone-c", 8)]),
                counts(&[("zone-b", 2), ("zone-c", 3)]),
                counts(&[("zone-a", 5)]),
            ),
            (
                "more allocated than allocations",
                vec![("zone-a", 5.0), ("zone-b", 5.0), ("zone-c", 5.0)],
                counts(&[("zone-a", 6), ("zone-b", 6), ("zone-c", 6)]),
                counts(&[]),
                counts(&[]),
            ),
            (
                "negative allocations",
                vec![("zone-a", -5.0), ("zone-b", -5.0), ("zone-c", -5.0)],
                counts(&[("zone-a", 6), ("zone-b", 6), ("zone-c", 6)]),
                counts(&[]),
                counts(&[]),
            ),
            (
                "negative allocated",
                vec![("zone-a", 5.0), ("zone-b", 5.0), ("zone-c", 5.0)],
                counts(&[("zone-a", -4), ("zone-b", -3), ("zone-c", -2)]),
                counts(&[]),
                counts(&[]),
            ),
            (
                "negative for one zone",
                vec![("zone-a", 5.0), ("zone-b", 5.0), ("zone-c", 5.0)],
                counts(&[("zone-a", -40), ("zone-b", 20), ("zone-c", 20)]),
                counts(&[("zone-b", 15), ("zone-c", 15)]),
                counts(&[("zone-a", 30)]),
            ),
        ];
        for (name, allocations, allocated, want_giving, want_receiving) in cases {
            let (giving, receiving) =
                giving_and_receiving_zones(&alloc_desired(&allocations), &allocated);
            assert_eq!(giving, want_giving, "{name}: giving");
            assert_eq!(receiving, want_receiving, "{name}: receiving");
        }
    }

    #[test]
    fn es19_hints_by_zone_table() {
        type Case = (
            &'static str,
            EndpointSlice,
            ZoneCounts,
            BTreeMap<String, Allocation>,
            Option<ZoneCounts>,
        );
        let cases: Vec<Case> = vec![
            (
                "empty",
                EndpointSlice::default(),
                counts(&[]),
                alloc_max(&[]),
                Some(counts(&[])),
            ),
            (
                "single zone hint",
                slice("s", vec![rh("", "zone-a", "zone-a")]),
                counts(&[("zone-a", 1)]),
                alloc_max(&[("zone-a", 3)]),
                Some(counts(&[("zone-a", 1)])),
            ),
            (
                "unready and unknown endpoints ignored",
                slice(
                    "s",
                    vec![
                        rh("", "zone-a", "zone-a"),
                        ep("", Some("zone-a"), Some(false), Some(&["zone-a"])),
                        ep("", Some("zone-a"), None, Some(&["zone-a"])),
                    ],
                ),
                counts(&[("zone-a", 1)]),
                alloc_max(&[("zone-a", 3)]),
                Some(counts(&[("zone-a", 1)])),
            ),
            (
                "multiple zone hints",
                slice(
                    "s",
                    vec![
                        rh("", "zone-a", "zone-a"),
                        rh("", "zone-a", "zone-b"),
                        rh("", "zone-b", "zone-b"),
                    ],
                ),
                counts(&[("zone-a", 1), ("zone-b", 1), ("zone-c", 1)]),
                alloc_max(&[("zone-a", 3), ("zone-b", 3), ("zone-c", 3)]),
                Some(counts(&[("zone-a", 1), ("zone-b", 2)])),
            ),
            (
                "zone no longer allocated",
                slice("s", vec![rh("", "zone-a", "zone-non-existent")]),
                counts(&[("zone-a", 1), ("zone-b", 1), ("zone-c", 1)]),
                alloc_max(&[("zone-a", 3)]),
                None,
            ),
            (
                "nil hints",
                slice("s", vec![r("", "zone-a")]),
                counts(&[]),
                alloc_max(&[("zone-a", 3)]),
                None,
            ),
            (
                "empty zone hints",
                slice("s", vec![ep("", Some("zone-a"), Some(true), Some(&[]))]),
                counts(&[]),
                alloc_max(&[("zone-a", 3)]),
                None,
            ),
            (
                "hints beyond maximum",
                slice(
                    "s",
                    vec![rh("", "zone-a", "zone-a"), rh("", "zone-a", "zone-a")],
                ),
                counts(&[("zone-a", 1)]),
                alloc_max(&[("zone-a", 2)]),
                None,
            ),
        ];
        for (name, s, allocated, allocations, want) in cases {
            assert_eq!(hints_by_zone(&s, &allocated, &allocations), want, "{name}");
        }
    }

    fn slice_with_n(ready: usize, unready: usize) -> EndpointSlice {
        let eps = (0..ready)
            .map(|i| ep(&format!("10.1.2.{i}"), None, Some(true), None))
            .chain((0..unready).map(|i| ep(&format!("10.1.3.{i}"), None, Some(false), None)))
            .collect();
        slice("s", eps)
    }

    #[test]
    fn es19_total_ready_endpoints_table() {
        let cases: Vec<(&str, SliceInfo, i64)> = vec![
            ("empty", si(vec![], vec![], vec![]), 0),
            (
                "empty slice",
                si(vec![slice_with_n(0, 0)], vec![], vec![]),
                0,
            ),
            (
                "multiple slices",
                si(
                    vec![slice_with_n(15, 0), slice_with_n(8, 0)],
                    vec![],
                    vec![],
                ),
                23,
            ),
            (
                "slices for all",
                si(
                    vec![slice_with_n(15, 0), slice_with_n(8, 0)],
                    vec![slice_with_n(2, 0)],
                    vec![slice_with_n(100, 0), slice_with_n(90, 0)],
                ),
                215,
            ),
            (
                "some unready",
                si(
                    vec![slice_with_n(15, 3), slice_with_n(5, 4)],
                    vec![slice_with_n(3, 8)],
                    vec![slice_with_n(98, 2), slice_with_n(90, 6)],
                ),
                211,
            ),
        ];
        for (name, s, want) in cases {
            assert_eq!(s.total_ready_endpoints(), want, "{name}");
        }
    }

    #[test]
    fn es19_allocations_minimum_and_maximum() {
        // 3 equal zones, 6 endpoints: desired 2, minimum ⌈2/1.2⌉ = 2, maximum 2 + 6 − 6 = 2.
        let cache = cache_with_ratios(Some(&[
            ("zone-a", 1.0 / 3.0),
            ("zone-b", 1.0 / 3.0),
            ("zone-c", 1.0 / 3.0),
        ]));
        let got = cache.allocations(6).unwrap();
        for a in got.values() {
            assert_eq!((a.minimum, a.maximum), (2, 2));
            assert!((a.desired - 2.0).abs() < 1e-12);
        }
        // 0.45/0.55 with 10: minimums ⌈3.75⌉=4, ⌈4.583⌉=5, maximum + 1.
        let cache = cache_with_ratios(Some(&[("zone-a", 0.45), ("zone-b", 0.55)]));
        let got = cache.allocations(10).unwrap();
        assert_eq!((got["zone-a"].minimum, got["zone-a"].maximum), (4, 5));
        assert_eq!((got["zone-b"].minimum, got["zone-b"].maximum), (5, 6));
        assert_eq!(got["zone-a"].desired, 4.5);
    }
}
