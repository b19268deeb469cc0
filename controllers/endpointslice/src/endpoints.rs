//! What a Service's slices should hold (ES-9..ES-13): which pods, which addresses, which ports,
//! and the endpoint each pod becomes. Pure functions of the cached Service, pods and nodes.

use k8s_openapi::api::core::v1::{Node, ObjectReference, Service, ServicePort};
use k8s_openapi::api::discovery::v1::{Endpoint, EndpointConditions, EndpointPort};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use shared::cache::pod::Pod;
use std::collections::{BTreeMap, BTreeSet};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

pub const IPV4: &str = "IPv4";
pub const IPV6: &str = "IPv6";
pub const LABEL_SERVICE_NAME: &str = "kubernetes.io/service-name";
pub const LABEL_MANAGED_BY: &str = "endpointslice.kubernetes.io/managed-by";
pub const LABEL_HEADLESS: &str = "service.kubernetes.io/headless";
pub const LABEL_ZONE: &str = "topology.kubernetes.io/zone";
pub const ANNOTATION_TRIGGER_TIME: &str = "endpoints.kubernetes.io/last-change-trigger-time";

/// ES-9 [getAddressTypesForService]: the families of `spec.ipFamilies`; without them, a Service
/// with a cluster IP uses that IP's family and a headless one both.
pub fn address_types(svc: &Service) -> BTreeSet<&'static str> {
    let spec = svc.spec.as_ref();
    let mut out = BTreeSet::new();
    for family in spec
        .and_then(|s| s.ip_families.as_ref())
        .into_iter()
        .flatten()
    {
        match family.as_str() {
            "IPv4" => {
                out.insert(IPV4);
            }
            "IPv6" => {
                out.insert(IPV6);
            }
            _ => {}
        }
    }
    if !out.is_empty() {
        return out;
    }
    if is_service_ip_set(svc) {
        let ip = spec
            .and_then(|s| s.cluster_ip.as_deref())
            .unwrap_or_default();
        out.insert(match parse_ip_sloppy(ip) {
            Some(IpAddr::V6(_)) => IPV6,
            _ => IPV4,
        });
        return out;
    }
    out.insert(IPV4);
    out.insert(IPV6);
    out
}

/// A cluster IP other than `None` (ES-7's headless label is its negation).
pub fn is_service_ip_set(svc: &Service) -> bool {
    let ip = svc
        .spec
        .as_ref()
        .and_then(|s| s.cluster_ip.as_deref())
        .unwrap_or_default();
    !ip.is_empty() && ip != "None"
}

/// Go's `netutils.ParseIPSloppy`: IPv4 octets may carry leading zeros (read as decimal), and an
/// IPv4-mapped IPv6 address is an IPv4 address (Go's `To4`), as upstream types and prints it.
pub fn parse_ip_sloppy(s: &str) -> Option<IpAddr> {
    if s.contains(':') {
        let v6 = parse_ipv6_sloppy(s)?;
        return Some(match v6.to_ipv4_mapped() {
            Some(v4) => IpAddr::V4(v4),
            None => IpAddr::V6(v6),
        });
    }
    parse_ipv4_sloppy(s).map(IpAddr::V4)
}

/// Decimal fields of any length (Go's `dtoi` stops at 0xFFFFFF), each at most 255.
fn parse_ipv4_sloppy(s: &str) -> Option<Ipv4Addr> {
    let mut octets = [0u8; 4];
    let mut parts = s.split('.');
    for o in &mut octets {
        let part = parts.next()?;
        if part.is_empty() || !part.bytes().all(|b| b.is_ascii_digit()) {
            return None;
        }
        let mut n: u32 = 0;
        for b in part.bytes() {
            n = n * 10 + u32::from(b - b'0');
            if n >= 0xFF_FFFF {
                return None;
            }
        }
        *o = u8::try_from(n).ok()?;
    }
    if parts.next().is_some() {
        return None;
    }
    Some(Ipv4Addr::from(octets))
}

/// IPv6 with Go's tolerance: hex groups of any length up to 0xFFFF and a sloppy trailing IPv4.
fn parse_ipv6_sloppy(s: &str) -> Option<Ipv6Addr> {
    if let Ok(ip) = s.parse::<Ipv6Addr>() {
        return Some(ip);
    }
    // Normalise the groups (strip leading zeros, rewrite a trailing dotted quad) and re-parse.
    let (head, tail_v4) = match s.rfind(':') {
        Some(i) if s[i + 1..].contains('.') => (&s[..=i], Some(parse_ipv4_sloppy(&s[i + 1..])?)),
        _ => (s, None),
    };
    let mut out = String::with_capacity(s.len());
    for (i, group) in head.split(':').enumerate() {
        if i > 0 {
            out.push(':');
        }
        if group.is_empty() {
            continue;
        }
        if !group.bytes().all(|b| b.is_ascii_hexdigit()) {
            return None;
        }
        let trimmed = group.trim_start_matches('0');
        if trimmed.len() > 4 {
            return None;
        }
        out.push_str(if trimmed.is_empty() { "0" } else { trimmed });
    }
    if let Some(v4) = tail_v4 {
        out.push_str(&v4.to_string());
    }
    out.parse().ok()
}

/// ES-11 [ShouldPodBeInEndpoints with terminating pods included]: not Succeeded or Failed, and
/// with an IP.
pub fn should_pod_be_in_endpoints(pod: &Pod) -> bool {
    let Some(status) = pod.status.as_ref() else {
        return false;
    };
    if matches!(status.phase.as_deref(), Some("Succeeded" | "Failed")) {
        return false;
    }
    status.pod_ip.as_deref().is_some_and(|ip| !ip.is_empty())
        || status.pod_ips.as_ref().is_some_and(|ips| !ips.is_empty())
}

/// ES-9 [getEndpointAddresses]: the pod's IPs of one family, canonical. An IP that does not parse
/// is skipped: upstream writes Go's nil IP as `<nil>`, a slice the API server refuses, so the
/// whole Service would fail to sync (the API server validates pod IPs, so this is defence only).
pub fn endpoint_addresses(pod: &Pod, address_type: &str) -> Vec<String> {
    let ips = pod.status.as_ref().and_then(|s| s.pod_ips.as_ref());
    let mut out = Vec::new();
    for ip in ips.into_iter().flatten() {
        let Some(parsed) = parse_ip_sloppy(&ip.ip) else {
            continue;
        };
        if parsed.is_ipv6() == (address_type == IPV6) {
            out.push(parsed.to_string());
        }
    }
    out
}

/// ES-10 [FindPort]: a numeric target port as is; a named one is the first port with that name
/// and protocol in the containers, then in sidecar (`restartPolicy: Always`) init containers.
pub fn find_port(pod: &Pod, port: &ServicePort) -> Option<i32> {
    let protocol = port.protocol.as_deref().unwrap_or("TCP");
    match port.target_port.as_ref() {
        Some(IntOrString::Int(n)) => Some(*n),
        // The API server defaults targetPort to the port; a reader without defaults does too.
        None => Some(port.port),
        Some(IntOrString::String(name)) => {
            let spec = pod.spec.as_ref()?;
            let sidecars = spec
                .init_containers
                .iter()
                .flatten()
                .filter(|c| c.restart_policy.as_deref() == Some("Always"));
            spec.containers
                .iter()
                .chain(sidecars)
                .flat_map(|c| c.ports.iter().flatten())
                .find(|p| {
                    p.name.as_deref().unwrap_or_default() == name.as_str()
                        && p.protocol.as_deref().unwrap_or("TCP") == protocol
                })
                .map(|p| p.container_port)
        }
    }
}

/// ES-10 [getEndpointPorts]: one endpoint port per Service port the pod resolves; a headless
/// Service without ports gets none.
pub fn endpoint_ports(svc: &Service, pod: &Pod) -> Vec<EndpointPort> {
    let ports = svc.spec.as_ref().and_then(|s| s.ports.as_ref());
    ports
        .into_iter()
        .flatten()
        .filter_map(|p| {
            Some(EndpointPort {
                name: Some(p.name.clone().unwrap_or_default()),
                port: Some(find_port(pod, p)?),
                protocol: Some(p.protocol.clone().unwrap_or_else(|| "TCP".into())),
                app_protocol: p.app_protocol.clone(),
            })
        })
        .collect()
}

/// ES-12 [ShouldSetHostname].
pub fn should_set_hostname(pod: &Pod, svc: &Service) -> bool {
    let spec = pod.spec.as_ref();
    let hostname = spec.and_then(|s| s.hostname.as_deref()).unwrap_or_default();
    let subdomain = spec
        .and_then(|s| s.subdomain.as_deref())
        .unwrap_or_default();
    !hostname.is_empty()
        && subdomain == svc.metadata.name.as_deref().unwrap_or_default()
        && svc.metadata.namespace == pod.metadata.namespace
}

fn publish_not_ready(svc: &Service) -> bool {
    svc.spec
        .as_ref()
        .and_then(|s| s.publish_not_ready_addresses)
        .unwrap_or(false)
}

/// ES-12 [podToEndpoint]. `node` is the pod's node if cached.
pub fn pod_to_endpoint(
    pod: &Pod,
    node: Option<&Node>,
    svc: &Service,
    address_type: &str,
) -> Endpoint {
    let serving = pod.is_ready();
    let terminating = pod.metadata.deletion_timestamp.is_some();
    let ready = publish_not_ready(svc) || (serving && !terminating);
    let node_name = pod
        .spec
        .as_ref()
        .and_then(|s| s.node_name.clone())
        .filter(|n| !n.is_empty());
    let zone = node
        .and_then(|n| n.metadata.labels.as_ref())
        .and_then(|l| l.get(LABEL_ZONE))
        .filter(|z| !z.is_empty())
        .cloned();
    Endpoint {
        addresses: endpoint_addresses(pod, address_type),
        conditions: Some(EndpointConditions {
            ready: Some(ready),
            serving: Some(serving),
            terminating: Some(terminating),
        }),
        target_ref: Some(ObjectReference {
            kind: Some("Pod".into()),
            namespace: pod.metadata.namespace.clone(),
            name: pod.metadata.name.clone(),
            uid: pod.metadata.uid.clone(),
            ..ObjectReference::default()
        }),
        node_name,
        zone,
        hostname: should_set_hostname(pod, svc)
            .then(|| pod.spec.as_ref().and_then(|s| s.hostname.clone()))
            .flatten(),
        ..Endpoint::default()
    }
}

/// A port set, order-free (ES-10 [NewPortMapKey]): absent ports are the empty set (#136502).
#[derive(Clone, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct PortKey(Vec<PortEntry>);

type PortEntry = (Option<String>, Option<i32>, Option<String>, Option<String>);

impl PortKey {
    pub fn of(ports: Option<&[EndpointPort]>) -> PortKey {
        let mut v: Vec<PortEntry> = ports
            .unwrap_or_default()
            .iter()
            .map(|p| {
                (
                    p.name.clone(),
                    p.port,
                    p.protocol.clone(),
                    p.app_protocol.clone(),
                )
            })
            .collect();
        v.sort();
        PortKey(v)
    }
}

/// An endpoint's identity (ES-13 [hashEndpoint]): sorted addresses, hostname, and the target's
/// namespace and name.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct EndpointKey {
    addresses: Vec<String>,
    hostname: String,
    namespace: String,
    name: String,
}

impl EndpointKey {
    pub fn of(ep: &Endpoint) -> EndpointKey {
        let mut addresses = ep.addresses.clone();
        addresses.sort();
        let target = ep.target_ref.as_ref();
        EndpointKey {
            addresses,
            hostname: ep.hostname.clone().unwrap_or_default(),
            namespace: target.and_then(|t| t.namespace.clone()).unwrap_or_default(),
            name: target.and_then(|t| t.name.clone()).unwrap_or_default(),
        }
    }
}

/// ES-13 [EndpointsEqualBeyondHash]: nodeName, zone, the three conditions and the target
/// (ignoring its resourceVersion); hints are not compared.
pub fn equal_beyond_key(a: &Endpoint, b: &Endpoint) -> bool {
    let cond = |e: &Endpoint| {
        let c = e.conditions.clone().unwrap_or_default();
        (c.ready, c.serving, c.terminating)
    };
    let target = |e: &Endpoint| {
        e.target_ref.clone().map(|mut t| {
            t.resource_version = None;
            t
        })
    };
    a.node_name == b.node_name && a.zone == b.zone && cond(a) == cond(b) && target(a) == target(b)
}

/// Endpoints by identity; ordered, so that where upstream takes "any" endpoint from a Go map we
/// take the smallest, deterministically.
pub type EndpointSet = BTreeMap<EndpointKey, Endpoint>;

/// The endpoints one port set should hold, and its ports.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct PortGroup {
    pub ports: Vec<EndpointPort>,
    pub endpoints: EndpointSet,
}

/// What one address type of a Service should hold.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Desired {
    pub groups: BTreeMap<PortKey, PortGroup>,
    /// Pods skipped because their node is not cached (ES-11): the sync writes the rest and
    /// fails, so it is retried.
    pub missing_nodes: Vec<String>,
}

/// ES-10..ES-12 for one address type [reconcileByAddressType, first half].
pub fn desired<'a>(
    svc: &Service,
    pods: impl IntoIterator<Item = &'a Pod>,
    node: impl Fn(&str) -> Option<std::sync::Arc<Node>>,
    address_type: &str,
) -> Desired {
    let mut out = Desired::default();
    for pod in pods {
        if !should_pod_be_in_endpoints(pod) {
            continue;
        }
        let ports = endpoint_ports(svc, pod);
        let group = out
            .groups
            .entry(PortKey::of(Some(&ports)))
            .or_insert_with(|| PortGroup {
                ports,
                endpoints: EndpointSet::new(),
            });
        let node_name = pod
            .spec
            .as_ref()
            .and_then(|s| s.node_name.as_deref())
            .unwrap_or_default();
        let node = node(node_name);
        if node.is_none() && !publish_not_ready(svc) {
            out.missing_nodes.push(format!(
                "skipping Pod {} for Service {}: Node {node_name} Not Found",
                pod.metadata.name.as_deref().unwrap_or_default(),
                service_key(svc),
            ));
            continue;
        }
        let ep = pod_to_endpoint(pod, node.as_deref(), svc, address_type);
        if !ep.addresses.is_empty() {
            group.endpoints.insert(EndpointKey::of(&ep), ep);
        }
    }
    out
}

/// `namespace/name` of a Service.
pub fn service_key(svc: &Service) -> String {
    format!(
        "{}/{}",
        svc.metadata.namespace.as_deref().unwrap_or_default(),
        svc.metadata.name.as_deref().unwrap_or_default()
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn es9_sloppy_ips_are_canonical() {
        let cases = [
            ("10.1.2.3", Some("10.1.2.3")),
            ("010.001.002.003", Some("10.1.2.3")),
            ("0000010.1.2.3", Some("10.1.2.3")),
            ("256.1.2.3", None),
            ("1.2.3", None),
            ("1.2.3.4.5", None),
            ("", None),
            ("a.b.c.d", None),
            ("fd00::1", Some("fd00::1")),
            ("FD00:0:0:0:0:0:0:0001", Some("fd00::1")),
            ("fd00::00001", Some("fd00::1")),
            ("::ffff:1.2.3.4", Some("1.2.3.4")),
            ("::ffff:001.002.003.004", Some("1.2.3.4")),
            ("fd00::1::2", None),
            ("fd00::10000", None),
        ];
        for (input, want) in cases {
            assert_eq!(
                parse_ip_sloppy(input).map(|ip| ip.to_string()).as_deref(),
                want,
                "{input}"
            );
        }
    }

    #[test]
    fn es9_mapped_ipv6_is_ipv4() {
        assert!(matches!(
            parse_ip_sloppy("::ffff:10.0.0.1"),
            Some(IpAddr::V4(_))
        ));
        assert!(matches!(parse_ip_sloppy("fd00::a"), Some(IpAddr::V6(_))));
    }

    #[test]
    fn es10_port_key_is_order_free_and_absent_is_empty() {
        let p = |name: &str, port| EndpointPort {
            name: Some(name.into()),
            port: Some(port),
            protocol: Some("TCP".into()),
            app_protocol: None,
        };
        assert_eq!(
            PortKey::of(Some(&[p("a", 1), p("b", 2)])),
            PortKey::of(Some(&[p("b", 2), p("a", 1)]))
        );
        assert_eq!(PortKey::of(None), PortKey::of(Some(&[])));
        assert_ne!(
            PortKey::of(Some(&[p("a", 1)])),
            PortKey::of(Some(&[p("a", 2)]))
        );
    }
}
