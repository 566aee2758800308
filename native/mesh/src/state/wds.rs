//! istio.workload.Address resources (WDS), decoded in the dataplane: the control side hands over each xDS
//! `Resource` still encoded, and gets back what applied and what was refused, so the mesh lives once, here
//! (ARCHITECTURE.md). Message types use prost's derive; the field numbers are those of
//! `proto/istio/workload/workload.proto` and `proto/envoy/service/discovery/v3/discovery.proto` (fields the
//! dataplane does not use are left out: prost skips unknown fields, as every protobuf reader must).
//!
//! A wire record becomes the same `Workload` (and `Service`) record the control side sends for a local config
//! file, and is validated by the same code, so both sources are judged alike. Istio's defaults are one table,
//! `model::defaults`.
//! Every error is a NACK reason: the field and the problem, without the resource name (the caller prefixes it).

use std::collections::HashMap;

use super::intern::{intern, Str};
use std::net::IpAddr;

use prost::Message;

use super::model::{
    AppTunnelProtocol, ApplicationTunnel, GatewayAddressJson, HealthPolicy, IpFamilies, LbMode, LbScope, LoadBalancer,
    Locality, NetworkMode, PortMap, Protocol, Service, ServiceKey, Visibility, Workload, WorkloadStatus,
};

pub const ADDRESS_TYPE_URL: &str = "type.googleapis.com/istio.workload.Address";

/// envoy.service.discovery.v3.Resource
#[derive(Clone, PartialEq, Message)]
pub struct Resource {
    #[prost(string, tag = "1")]
    pub version: String,
    #[prost(message, optional, tag = "2")]
    pub resource: Option<Any>,
    #[prost(string, tag = "3")]
    pub name: String,
}

/// google.protobuf.Any
#[derive(Clone, PartialEq, Message)]
pub struct Any {
    #[prost(string, tag = "1")]
    pub type_url: String,
    #[prost(bytes = "vec", tag = "2")]
    pub value: Vec<u8>,
}

#[derive(Clone, PartialEq, Message)]
pub struct Address {
    #[prost(oneof = "AddressType", tags = "1, 2")]
    pub r#type: Option<AddressType>,
}

// Short-lived, one per resource: boxing would add an allocation per resource for nothing.
#[allow(clippy::large_enum_variant)]
#[derive(Clone, PartialEq, prost::Oneof)]
pub enum AddressType {
    #[prost(message, tag = "1")]
    Workload(WireWorkload),
    #[prost(message, tag = "2")]
    Service(WireService),
}

#[derive(Clone, PartialEq, Message)]
pub struct WireWorkload {
    #[prost(string, tag = "1")]
    pub name: String,
    #[prost(string, tag = "2")]
    pub namespace: String,
    #[prost(bytes = "vec", repeated, tag = "3")]
    pub addresses: Vec<Vec<u8>>,
    #[prost(string, tag = "4")]
    pub network: String,
    #[prost(int32, tag = "5")]
    pub tunnel_protocol: i32,
    #[prost(string, tag = "6")]
    pub trust_domain: String,
    #[prost(string, tag = "7")]
    pub service_account: String,
    #[prost(message, optional, tag = "8")]
    pub waypoint: Option<WireGateway>,
    #[prost(string, tag = "9")]
    pub node: String,
    #[prost(string, tag = "10")]
    pub canonical_name: String,
    #[prost(string, tag = "11")]
    pub canonical_revision: String,
    #[prost(int32, tag = "12")]
    pub workload_type: i32,
    #[prost(string, tag = "13")]
    pub workload_name: String,
    #[prost(bool, tag = "14")]
    pub native_tunnel: bool,
    #[prost(string, repeated, tag = "16")]
    pub authorization_policies: Vec<String>,
    #[prost(int32, tag = "17")]
    pub status: i32,
    #[prost(string, tag = "18")]
    pub cluster_id: String,
    #[prost(message, optional, tag = "19")]
    pub network_gateway: Option<WireGateway>,
    #[prost(string, tag = "20")]
    pub uid: String,
    #[prost(string, tag = "21")]
    pub hostname: String,
    #[prost(map = "string, message", tag = "22")]
    pub services: HashMap<String, PortList>,
    #[prost(message, optional, tag = "23")]
    pub application_tunnel: Option<WireAppTunnel>,
    #[prost(message, optional, tag = "24")]
    pub locality: Option<WireLocality>,
    #[prost(int32, tag = "25")]
    pub network_mode: i32,
    #[prost(message, optional, tag = "27")]
    pub capacity: Option<UInt32Value>,
}

#[derive(Clone, PartialEq, Message)]
pub struct UInt32Value {
    #[prost(uint32, tag = "1")]
    pub value: u32,
}

#[derive(Clone, PartialEq, Message)]
pub struct WireLocality {
    #[prost(string, tag = "1")]
    pub region: String,
    #[prost(string, tag = "2")]
    pub zone: String,
    #[prost(string, tag = "3")]
    pub subzone: String,
}

#[derive(Clone, PartialEq, Message)]
pub struct WireAppTunnel {
    #[prost(int32, tag = "1")]
    pub protocol: i32,
    #[prost(uint32, tag = "2")]
    pub port: u32,
}

#[derive(Clone, PartialEq, Message)]
pub struct PortList {
    #[prost(message, repeated, tag = "1")]
    pub ports: Vec<WirePort>,
}

#[derive(Clone, PartialEq, Message)]
pub struct WirePort {
    #[prost(uint32, tag = "1")]
    pub service_port: u32,
    #[prost(uint32, tag = "2")]
    pub target_port: u32,
}

#[derive(Clone, PartialEq, Message)]
pub struct WireGateway {
    #[prost(oneof = "GatewayDestinationWire", tags = "1, 2")]
    pub destination: Option<GatewayDestinationWire>,
    #[prost(uint32, tag = "3")]
    pub hbone_mtls_port: u32,
}

#[derive(Clone, PartialEq, prost::Oneof)]
pub enum GatewayDestinationWire {
    #[prost(message, tag = "1")]
    Hostname(NamespacedHostname),
    #[prost(message, tag = "2")]
    Address(NetworkAddress),
}

#[derive(Clone, PartialEq, Message)]
pub struct NamespacedHostname {
    #[prost(string, tag = "1")]
    pub namespace: String,
    #[prost(string, tag = "2")]
    pub hostname: String,
}

#[derive(Clone, PartialEq, Message)]
pub struct NetworkAddress {
    #[prost(string, tag = "1")]
    pub network: String,
    #[prost(bytes = "vec", tag = "2")]
    pub address: Vec<u8>,
    #[prost(uint32, optional, tag = "3")]
    pub length: Option<u32>,
}

#[derive(Clone, PartialEq, Message)]
pub struct WireService {
    #[prost(string, tag = "1")]
    pub name: String,
    #[prost(string, tag = "2")]
    pub namespace: String,
    #[prost(string, tag = "3")]
    pub hostname: String,
    #[prost(message, repeated, tag = "4")]
    pub addresses: Vec<NetworkAddress>,
    #[prost(message, repeated, tag = "5")]
    pub ports: Vec<WirePort>,
    #[prost(string, repeated, tag = "6")]
    pub subject_alt_names: Vec<String>,
    #[prost(message, optional, tag = "7")]
    pub waypoint: Option<WireGateway>,
    #[prost(message, optional, tag = "8")]
    pub load_balancing: Option<WireLoadBalancing>,
    #[prost(int32, tag = "9")]
    pub ip_families: i32,
    #[prost(bool, tag = "11")]
    pub canonical: bool,
    #[prost(message, repeated, tag = "13")]
    pub weighted_waypoints: Vec<WireWeightedWaypoint>,
    #[prost(int32, tag = "14")]
    pub visibility: i32,
}

#[derive(Clone, PartialEq, Message)]
pub struct WireLoadBalancing {
    #[prost(int32, repeated, tag = "1")]
    pub routing_preference: Vec<i32>,
    #[prost(int32, tag = "2")]
    pub mode: i32,
    #[prost(int32, tag = "3")]
    pub health_policy: i32,
}

#[derive(Clone, PartialEq, Message)]
pub struct WireWeightedWaypoint {
    #[prost(message, optional, tag = "1")]
    pub destination: Option<WireGateway>,
    #[prost(uint32, tag = "2")]
    pub weight: u32,
}

/// A decoded Address resource, in the model the control side also sends.
// Short-lived, one per resource: boxing would add an allocation per resource for nothing.
#[allow(clippy::large_enum_variant)]
#[derive(Debug)]
pub enum AddressRecord {
    Workload(Workload),
    Service(Service),
}

type Reason = String;

/// 4 or 16 bytes → an address; anything else is refused.
fn ip(bytes: &[u8], field: &str) -> Result<IpAddr, Reason> {
    match bytes.len() {
        4 => Ok(IpAddr::from(<[u8; 4]>::try_from(bytes).expect("4 bytes"))),
        16 => Ok(IpAddr::from(<[u8; 16]>::try_from(bytes).expect("16 bytes"))),
        n => Err(format!("{field}: {n} bytes is not an IPv4 (4) or IPv6 (16) address")),
    }
}

fn port(field: &str, n: u32, allow_zero: bool) -> Result<u32, Reason> {
    if n > 65535 || (!allow_zero && n == 0) {
        return Err(format!("{field}: {n} is not a port"));
    }
    Ok(n)
}

fn unknown(field: &str, v: i32) -> Reason {
    format!("{field}: unknown enum value {v}")
}

fn gateway(g: &Option<WireGateway>, field: &str) -> Result<Option<GatewayAddressJson>, Reason> {
    let Some(g) = g else { return Ok(None) };
    let hbone_mtls_port = match g.hbone_mtls_port {
        0 => u32::from(super::model::defaults::HBONE_MTLS_PORT),
        p => port(&format!("{field}.hboneMtlsPort"), p, false)?,
    };
    let destination = match &g.destination {
        Some(GatewayDestinationWire::Hostname(h)) => format!("{}/{}", h.namespace, h.hostname),
        Some(GatewayDestinationWire::Address(a)) => {
            format!("{}/{}", a.network, ip(&a.address, &format!("{field}.address"))?)
        }
        None => return Err(format!("{field}: neither a hostname nor an address")),
    };
    Ok(Some(GatewayAddressJson { destination, hbone_mtls_port }))
}

fn workload(w: WireWorkload) -> Result<Workload, Reason> {
    if w.uid.is_empty() {
        return Err("workload has no uid".into());
    }
    let protocol = match w.tunnel_protocol {
        0 => Protocol::Tcp,
        1 => Protocol::Hbone,
        2 => return Err("tunnelProtocol LEGACY_ISTIO_MTLS is not supported (only NONE and HBONE)".into()),
        v => return Err(unknown("tunnelProtocol", v)),
    };
    let mut service_ports = Vec::with_capacity(w.services.len());
    for (key, list) in &w.services {
        let well_formed =
            key.split_once('/').is_some_and(|(ns, h)| !ns.is_empty() && !h.is_empty() && !h.contains('/'));
        let Some(service) = ServiceKey::parse(key).filter(|_| well_formed) else {
            return Err(format!("services: key {key:?} is not <namespace>/<hostname>"));
        };
        let mut ports = Vec::with_capacity(list.ports.len());
        for (i, p) in list.ports.iter().enumerate() {
            let sp = port(&format!("services[{key:?}].ports[{i}].servicePort"), p.service_port, false)?;
            let tp = port(&format!("services[{key:?}].ports[{i}].targetPort"), p.target_port, true)?;
            ports.push((sp as u16, tp as u16));
        }
        service_ports.push((service, PortMap::new(ports)));
    }
    let workload_type =
        match usize::try_from(w.workload_type).ok().and_then(|i| super::model::defaults::WORKLOAD_TYPES.get(i)) {
            Some(t) => *t,
            None => return Err(unknown("workloadType", w.workload_type)),
        };
    let status = match w.status {
        0 => WorkloadStatus::Healthy,
        1 => WorkloadStatus::Unhealthy,
        v => return Err(unknown("status", v)),
    };
    let network_mode = match w.network_mode {
        0 => NetworkMode::Standard,
        1 => NetworkMode::HostNetwork,
        v => return Err(unknown("networkMode", v)),
    };
    let application_tunnel = match &w.application_tunnel {
        None => None,
        Some(t) => Some(ApplicationTunnel {
            protocol: match t.protocol {
                0 => AppTunnelProtocol::None,
                1 => AppTunnelProtocol::Proxy,
                v => return Err(unknown("applicationTunnel.protocol", v)),
            },
            port: match t.port {
                0 => None,
                p => Some(port("applicationTunnel.port", p, false)? as u16),
            },
        }),
    };
    let ips = w
        .addresses
        .iter()
        .enumerate()
        .map(|(i, a)| ip(a, &format!("addresses[{i}]")))
        .collect::<Result<Vec<_>, _>>()?;
    let gateway = |g: &Option<WireGateway>, field: &str| -> Result<Option<Box<super::model::GatewayAddress>>, Reason> {
        gateway(g, field)?.map(|g| g.parse().map(Box::new).map_err(|e| format!("{field}: {e}"))).transpose()
    };
    let waypoint = gateway(&w.waypoint, "waypoint")?;
    let network_gateway = gateway(&w.network_gateway, "networkGateway")?;
    let locality = w
        .locality
        .map(|l| Locality { region: intern(&l.region), zone: intern(&l.zone), subzone: intern(&l.subzone) })
        .unwrap_or_default();
    Ok(Workload {
        uid: Str::from(w.uid.as_str()),
        name: Str::from(w.name.as_str()),
        namespace: intern(&w.namespace),
        service_account: intern(&w.service_account),
        trust_domain: intern(&w.trust_domain),
        ips,
        network: intern(&w.network),
        protocol,
        node: intern(&w.node),
        status,
        capacity: w.capacity.map_or(super::model::defaults::CAPACITY, |c| c.value),
        canonical_name: intern(&w.canonical_name),
        canonical_revision: intern(&w.canonical_revision),
        workload_name: intern(&w.workload_name),
        workload_type: intern(workload_type),
        cluster_id: intern(&w.cluster_id),
        locality,
        service_ports,
        authorization_policies: w.authorization_policies.iter().map(|k| intern(k)).collect(),
        hostname: intern(&w.hostname),
        network_mode,
        waypoint,
        network_gateway,
        application_tunnel,
        native_tunnel: w.native_tunnel,
    })
}

fn service(s: WireService) -> Result<Service, Reason> {
    if s.namespace.is_empty() {
        return Err("service has no namespace".into());
    }
    if s.hostname.is_empty() {
        return Err("service has no hostname".into());
    }
    let mut vips = Vec::new();
    let mut cidr_vips = Vec::new();
    for (i, a) in s.addresses.iter().enumerate() {
        let addr = ip(&a.address, &format!("addresses[{i}].address"))?;
        let host = if addr.is_ipv4() { 32 } else { 128 };
        match a.length {
            None => vips.push((a.network.clone(), addr)),
            Some(len) if len == host => vips.push((a.network.clone(), addr)),
            Some(len) if len > host => return Err(format!("addresses[{i}].length: /{len} is too long for {addr}")),
            Some(len) => cidr_vips.push((a.network.clone(), super::policy::Cidr::of(addr, len as u8))),
        }
    }
    let mut ports = HashMap::with_capacity(s.ports.len());
    for (i, p) in s.ports.iter().enumerate() {
        let sp = port(&format!("ports[{i}].servicePort"), p.service_port, false)?;
        ports.insert(sp as u16, port(&format!("ports[{i}].targetPort"), p.target_port, true)? as u16);
    }
    let parsed = |g: GatewayAddressJson| g.parse();
    let waypoint = gateway(&s.waypoint, "waypoint")?.map(parsed).transpose()?.map(Box::new);
    let weighted_waypoints = s
        .weighted_waypoints
        .iter()
        .enumerate()
        .map(|(i, w)| {
            let field = format!("weightedWaypoints[{i}].destination");
            let waypoint =
                gateway(&w.destination, &field)?.ok_or_else(|| format!("weightedWaypoints[{i}]: no destination"))?;
            Ok((waypoint.parse()?, w.weight))
        })
        .collect::<Result<Vec<_>, Reason>>()?;
    let load_balancer = match &s.load_balancing {
        None => None,
        Some(lb) => Some(LoadBalancer {
            routing_preferences: lb
                .routing_preference
                .iter()
                .enumerate()
                .map(|(i, p)| match p {
                    1 => Ok(LbScope::Region),
                    2 => Ok(LbScope::Zone),
                    3 => Ok(LbScope::Subzone),
                    4 => Ok(LbScope::Node),
                    5 => Ok(LbScope::Cluster),
                    6 => Ok(LbScope::Network),
                    v => Err(unknown(&format!("loadBalancing.routingPreference[{i}]"), *v)),
                })
                .collect::<Result<Vec<_>, _>>()?,
            mode: match lb.mode {
                0 => LbMode::Standard,
                1 => LbMode::Strict,
                2 => LbMode::Failover,
                3 => LbMode::Passthrough,
                v => return Err(unknown("loadBalancing.mode", v)),
            },
            health_policy: match lb.health_policy {
                0 => HealthPolicy::OnlyHealthy,
                1 => HealthPolicy::AllowAll,
                v => return Err(unknown("loadBalancing.healthPolicy", v)),
            },
        }),
    };
    let ip_families = match s.ip_families {
        0 => None,
        1 => Some(IpFamilies::IPv4),
        2 => Some(IpFamilies::IPv6),
        3 => Some(IpFamilies::Dual),
        v => return Err(unknown("ipFamilies", v)),
    };
    Ok(Service {
        name: s.name,
        namespace: intern(&s.namespace),
        hostname: Str::from(s.hostname.as_str()),
        vips,
        cidr_vips,
        ports,
        subject_alt_names_given: s.subject_alt_names,
        subject_alt_names: Vec::new(),
        waypoint,
        weighted_waypoints,
        load_balancer,
        ip_families,
        canonical: s.canonical,
        // An unknown visibility is PUBLIC, as ztunnel reads it: newer istiods may add values.
        visibility: if s.visibility == 1 { Visibility::Namespace } else { Visibility::Public },
    })
}

/// Decodes one Address body (the `value` of the resource's Any).
pub fn decode_address(body: &[u8]) -> Result<AddressRecord, Reason> {
    let addr = Address::decode(body).map_err(|e| format!("cannot decode istio.workload.Address: {e}"))?;
    match addr.r#type {
        Some(AddressType::Workload(w)) => workload(w).map(AddressRecord::Workload),
        Some(AddressType::Service(s)) => service(s).map(AddressRecord::Service),
        None => Err("Address has neither a workload nor a service".into()),
    }
}

/// One encoded envoy Resource carrying an Address: its name, version and record (or why it is refused; the name is
/// `resources[i]` when even the envelope cannot be read).
pub struct DecodedResource {
    pub name: String,
    pub version: String,
    pub record: Result<AddressRecord, Reason>,
}

pub fn decode_resource(index: usize, bytes: &[u8]) -> DecodedResource {
    let r = match Resource::decode(bytes) {
        Ok(r) => r,
        Err(e) => {
            return DecodedResource {
                name: format!("resources[{index}]"),
                version: String::new(),
                record: Err(format!("cannot decode envoy.service.discovery.v3.Resource: {e}")),
            }
        }
    };
    let record = match &r.resource {
        None => Err("resource has no body".to_string()),
        Some(any) if any.type_url != ADDRESS_TYPE_URL => {
            Err(format!("type {:?} is not {ADDRESS_TYPE_URL}", any.type_url))
        }
        Some(any) => decode_address(&any.value),
    };
    DecodedResource { name: r.name, version: r.version, record }
}

/// One WDS response judged resource by resource, before any lock is taken: the valid records as one delta, each
/// accepted resource's name and key (the removals the names imply are read from the state the batch applies to), the
/// accepted (name, version) pairs, and each rejected resource as "<name>: <reason>" (the control side NACKs those
/// while the good ones apply).
#[derive(Debug, Default)]
pub struct Judged {
    pub delta: super::ValidDelta,
    pub names: Vec<(String, super::AddrKey)>,
    pub accepted: Vec<(String, String)>,
    pub rejected: Vec<String>,
    /// How many resources the response carried.
    pub resources: usize,
}

/// Judges a packed response (`unpack`'s layout): each resource decoded and validated alone.
pub fn judge(packed: &[u8]) -> Result<Judged, String> {
    let parts = unpack(packed)?;
    let mut j = Judged { resources: parts.len(), ..Judged::default() };
    j.accepted.reserve(parts.len());
    j.names.reserve(parts.len());
    for (i, bytes) in parts.iter().enumerate() {
        let r = decode_resource(i, bytes);
        let valid = r.record.and_then(|rec| match rec {
            AddressRecord::Workload(w) => w.validate().map(Valid::Workload).map_err(problem),
            AddressRecord::Service(s) => s.validate().map(Valid::Service).map_err(problem),
        });
        match valid {
            Err(reason) => j.rejected.push(format!("{}: {reason}", r.name)),
            Ok(Valid::Workload(w)) => {
                j.names.push((r.name.clone(), super::AddrKey::Workload(w.uid.to_string())));
                j.delta.workloads.push(w);
                j.accepted.push((r.name, r.version));
            }
            Ok(Valid::Service(s)) => {
                j.names.push((r.name.clone(), super::AddrKey::Service(s.key())));
                j.delta.services.push(s);
                j.accepted.push((r.name, r.version));
            }
        }
    }
    Ok(j)
}

// Short-lived, one per resource: boxing would add an allocation per resource for nothing.
#[allow(clippy::large_enum_variant)]
enum Valid {
    Workload(super::Workload),
    Service(super::Service),
}

/// A validation error as a NACK reason (the resource name is said by the caller).
fn problem(e: super::StateError) -> Reason {
    match e {
        super::StateError::Invalid { problem, .. } => problem,
        other => other.to_string(),
    }
}

/// Splits the control side's packing of a response's resources: each one a little-endian u32 length, then that many
/// bytes (an encoded Resource).
pub fn unpack(packed: &[u8]) -> Result<Vec<&[u8]>, String> {
    let mut out = Vec::new();
    let mut rest = packed;
    while !rest.is_empty() {
        if rest.len() < 4 {
            return Err("truncated resource length".into());
        }
        let n = u32::from_le_bytes(rest[..4].try_into().expect("4 bytes")) as usize;
        rest = &rest[4..];
        if rest.len() < n {
            return Err("truncated resource".into());
        }
        out.push(&rest[..n]);
        rest = &rest[n..];
    }
    Ok(out)
}

/// One Address body decoded, validated and rendered as the control side's JSON (`{"workload": {...}}` or
/// `{"service": {...}}`), or the NACK reason: the debugging and test face of the decoder.
pub fn decode_address_json(body: &[u8]) -> Result<String, String> {
    let reason = |e: super::StateError| match e {
        super::StateError::Invalid { problem, .. } => problem,
        other => other.to_string(),
    };
    match decode_address(body)? {
        AddressRecord::Workload(w) => {
            let w = w.validate().map_err(reason)?;
            Ok(format!(r#"{{"workload":{}}}"#, serde_json::to_string(&super::dump::workload(&w)).expect("serializes")))
        }
        AddressRecord::Service(s) => {
            let s = s.validate().map_err(reason)?;
            Ok(format!(r#"{{"service":{}}}"#, serde_json::to_string(&s).expect("serializes")))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::state::{AddrKey, State};

    fn workload(uid: &str, ip: [u8; 4]) -> WireWorkload {
        WireWorkload {
            uid: uid.into(),
            name: uid.into(),
            namespace: "ns".into(),
            addresses: vec![ip.to_vec()],
            ..Default::default()
        }
    }

    fn resource(name: &str, body: Address) -> Vec<u8> {
        Resource {
            name: name.into(),
            version: "v1".into(),
            resource: Some(Any { type_url: ADDRESS_TYPE_URL.into(), value: body.encode_to_vec() }),
        }
        .encode_to_vec()
    }

    fn wl(uid: &str, ip: [u8; 4]) -> Address {
        Address { r#type: Some(AddressType::Workload(workload(uid, ip))) }
    }

    /// A response is judged resource by resource: the good ones make the delta, each bad one is rejected by name with
    /// its reason, and a packing that cannot be read refuses the whole response.
    #[test]
    fn a_response_is_judged_resource_by_resource() {
        let mut packed = Vec::new();
        for r in [
            resource("ns/u1", wl("u1", [10, 0, 0, 1])),
            b"not a resource".to_vec(),
            resource("ns/u2", {
                let mut bad = workload("u2", [10, 0, 0, 2]);
                bad.addresses = vec![vec![10, 0]];
                Address { r#type: Some(AddressType::Workload(bad)) }
            }),
        ] {
            packed.extend((r.len() as u32).to_le_bytes());
            packed.extend(r);
        }
        let j = judge(&packed).unwrap();
        assert_eq!(j.resources, 3);
        assert_eq!(j.accepted, [("ns/u1".to_string(), "v1".to_string())]);
        assert_eq!(j.names, [("ns/u1".to_string(), AddrKey::Workload("u1".into()))]);
        assert_eq!(j.delta.workloads.len(), 1);
        assert_eq!(j.rejected.len(), 2, "{:?}", j.rejected);
        assert!(j.rejected[0].starts_with("resources[1]: cannot decode"), "{}", j.rejected[0]);
        assert!(j.rejected[1].starts_with("ns/u2: "), "{}", j.rejected[1]);
        assert!(judge(&packed[..packed.len() - 1]).is_err(), "a truncated packing");
    }

    #[test]
    fn wire_defaults_and_refusals_follow_istio() {
        let AddressRecord::Workload(w) = decode_address(&wl("u1", [10, 0, 0, 1]).encode_to_vec()).unwrap() else {
            panic!("a workload")
        };
        let w = w.validate().unwrap();
        assert_eq!((w.trust_domain.as_str(), w.service_account.as_str(), w.capacity), ("cluster.local", "default", 1));
        let bad =
            |w: WireWorkload| match decode_address(&Address { r#type: Some(AddressType::Workload(w)) }.encode_to_vec())
            {
                Err(e) => e,
                Ok(_) => panic!("refused"),
            };
        assert_eq!(
            bad(WireWorkload { tunnel_protocol: 2, ..workload("u", [1, 1, 1, 1]) }),
            "tunnelProtocol LEGACY_ISTIO_MTLS is not supported (only NONE and HBONE)"
        );
        assert_eq!(
            bad(WireWorkload { addresses: vec![vec![1, 2, 3]], ..workload("u", [1, 1, 1, 1]) }),
            "addresses[0]: 3 bytes is not an IPv4 (4) or IPv6 (16) address"
        );
        assert_eq!(bad(WireWorkload { uid: String::new(), ..workload("u", [1, 1, 1, 1]) }), "workload has no uid");
        assert_eq!(
            decode_address(&Address { r#type: None }.encode_to_vec()).unwrap_err(),
            "Address has neither a workload nor a service"
        );
    }

    #[test]
    fn unpack_splits_and_refuses_truncation() {
        let mut packed = Vec::new();
        for part in [&b"ab"[..], &b""[..], &b"xyz"[..]] {
            packed.extend_from_slice(&(part.len() as u32).to_le_bytes());
            packed.extend_from_slice(part);
        }
        assert_eq!(unpack(&packed).unwrap(), vec![&b"ab"[..], &b""[..], &b"xyz"[..]]);
        assert!(unpack(&packed[..packed.len() - 1]).is_err());
        assert!(unpack(&[1, 0]).is_err());
    }

    #[test]
    fn a_resource_of_the_wrong_type_or_without_a_body_is_named() {
        let r = Resource { name: "x".into(), version: "1".into(), resource: None }.encode_to_vec();
        let d = decode_resource(0, &r);
        assert_eq!((d.name.as_str(), d.record.unwrap_err().as_str()), ("x", "resource has no body"));
        let r = Resource {
            name: "y".into(),
            version: "1".into(),
            resource: Some(Any { type_url: "type.googleapis.com/other".into(), value: vec![] }),
        }
        .encode_to_vec();
        assert!(decode_resource(0, &r)
            .record
            .unwrap_err()
            .contains("is not type.googleapis.com/istio.workload.Address"));
        assert_eq!(decode_resource(3, &[0xff]).name, "resources[3]");
        // A good one decodes with its name and version.
        let d = decode_resource(0, &resource("w1", wl("w1", [10, 0, 0, 1])));
        assert_eq!((d.name.as_str(), d.version.as_str()), ("w1", "v1"));
    }

    #[test]
    fn removals_by_name_follow_what_the_name_denotes() {
        let st = State::default();
        let up = vec![("w1".to_string(), AddrKey::Workload("w1".into()))];
        // An unknown name is tried as a uid and as a namespace/hostname; a key the batch upserts is never removed.
        let (w, s) = st.wds_removals(&up, &["ns/h".to_string(), "w1".to_string()]);
        assert_eq!(w, vec!["ns/h".to_string()]);
        assert_eq!(s, vec!["ns/h".to_string()]);
        // A name renamed in place drops the key it used to denote.
        let mut st = State::default();
        st.wds_record(vec![("n".to_string(), AddrKey::Workload("old".into()))], &[]);
        let (w, _) = st.wds_removals(&[("n".to_string(), AddrKey::Workload("new".into()))], &[]);
        assert_eq!(w, vec!["old".to_string()]);
        // A removal by a known name removes its key, not the name.
        let (w, s) = st.wds_removals(&[], &["n".to_string()]);
        assert_eq!((w, s.len()), (vec!["old".to_string()], 0));
    }
}
