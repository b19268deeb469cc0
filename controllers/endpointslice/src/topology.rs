//! TEMPORARY compile stand-in until the real module lands (same API); not to be committed.
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::api::discovery::v1::EndpointSlice;
pub struct SliceInfo {
    pub service_key: String,
    pub address_type: String,
    pub to_create: Vec<EndpointSlice>,
    pub to_update: Vec<EndpointSlice>,
    pub unchanged: Vec<EndpointSlice>,
}
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HintEvent {
    pub warning: bool,
    pub reason: &'static str,
    pub message: String,
}
pub const TOPOLOGY_AWARE_HINTS_DISABLED: &str = "Topology Aware Hints has been disabled";
pub fn format_with_address_type(m: &str, t: &str) -> String {
    format!("{m}, addressType: {t}")
}
#[derive(Default)]
pub struct TopologyCache;
impl TopologyCache {
    pub fn new() -> Self {
        TopologyCache
    }
    pub fn set_nodes(&self, _n: &[std::sync::Arc<Node>]) {}
    pub fn add_hints(
        &self,
        si: SliceInfo,
    ) -> (Vec<EndpointSlice>, Vec<EndpointSlice>, Vec<HintEvent>) {
        (si.to_create, si.to_update, vec![])
    }
    pub fn remove_hints(&self, _k: &str, _t: &str) {}
    pub fn has_populated_hints(&self, _k: &str) -> bool {
        false
    }
    pub fn overloaded_services(&self) -> Vec<String> {
        vec![]
    }
}
pub fn remove_hints_from_slices(si: SliceInfo) -> (Vec<EndpointSlice>, Vec<EndpointSlice>) {
    (si.to_create, si.to_update)
}
pub fn hints_enabled(_a: Option<&std::collections::BTreeMap<String, String>>) -> bool {
    false
}
