//! TEMPORARY compile stand-in until the real module lands (same API); not to be committed.
use k8s_openapi::api::discovery::v1::EndpointSlice;
pub fn valid(_t: Option<&str>) -> bool {
    false
}
pub fn reconcile_hints(
    _t: Option<&str>,
    c: Vec<EndpointSlice>,
    u: Vec<EndpointSlice>,
    n: Vec<EndpointSlice>,
) -> (Vec<EndpointSlice>, Vec<EndpointSlice>, Vec<EndpointSlice>) {
    (c, u, n)
}
