//! The state model as it crosses the native boundary (camelCase JSON), and its validated form.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use super::intern::{intern, read_str, Str};
use super::{NetworkAddr, StateError};
use crate::identity::Identity;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize, Default)]
#[cfg_attr(any(test, feature = "ts"), derive(ts_rs::TS), ts(export, rename = "WorkloadProtocol"))]
pub enum Protocol {
    #[serde(rename = "HBONE")]
    Hbone,
    #[default]
    #[serde(rename = "TCP")]
    Tcp,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize, Default)]
#[cfg_attr(any(test, feature = "ts"), derive(ts_rs::TS), ts(export, rename = "HealthStatus"))]
pub enum WorkloadStatus {
    #[default]
    Healthy,
    Unhealthy,
}

#[derive(Debug, Clone, Default, Deserialize, Serialize, PartialEq, Eq)]
#[cfg_attr(any(test, feature = "ts"), derive(ts_rs::TS), ts(export))]
#[serde(default, deny_unknown_fields)]
pub struct Locality {
    /// Shared: a few values across the whole mesh.
    #[cfg_attr(any(test, feature = "ts"), ts(as = "String"))]
    pub region: Str,
    #[cfg_attr(any(test, feature = "ts"), ts(as = "String"))]
    pub zone: Str,
    #[cfg_attr(any(test, feature = "ts"), ts(as = "String"))]
    pub subzone: Str,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ServiceKey {
    pub namespace: Str,
    pub hostname: Str,
}

impl ServiceKey {
    pub fn new(namespace: &str, hostname: &str) -> ServiceKey {
        ServiceKey { namespace: intern(namespace), hostname: intern(hostname) }
    }

    pub fn parse(s: &str) -> Option<ServiceKey> {
        let (ns, host) = s.split_once('/')?;
        if ns.is_empty() || host.is_empty() {
            return None;
        }
        Some(ServiceKey::new(ns, host))
    }
}

/// An endpoint's service port → target port map: sorted pairs, shared by the workload record and the service's
/// endpoint index (a one- or two-entry map; a HashMap would cost a few hundred bytes each).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct PortMap(Arc<[(u16, u16)]>);

impl PortMap {
    pub fn new(mut pairs: Vec<(u16, u16)>) -> PortMap {
        pairs.sort_unstable();
        pairs.dedup_by_key(|p| p.0);
        PortMap(pairs.into())
    }

    pub fn get(&self, port: &u16) -> Option<&u16> {
        self.0.binary_search_by_key(port, |p| p.0).ok().map(|i| &self.0[i].1)
    }

    pub fn contains_key(&self, port: &u16) -> bool {
        self.get(port).is_some()
    }

    /// (service port, target port), by service port.
    pub fn iter(&self) -> impl Iterator<Item = (&u16, &u16)> {
        self.0.iter().map(|(k, v)| (k, v))
    }

    pub fn len(&self) -> usize {
        self.0.len()
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

impl std::fmt::Display for ServiceKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.namespace, self.hostname)
    }
}

/// Where a waypoint or network gateway is, as TS sends it: `destination` is "<network>/<ip>" or
/// "<namespace>/<hostname>".
#[derive(Debug, Clone, Deserialize, Serialize, Default)]
#[cfg_attr(any(test, feature = "ts"), derive(ts_rs::TS), ts(export, rename = "GatewayAddress"))]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct GatewayAddressJson {
    pub destination: String,
    /// 0 or absent: Istio's default (`defaults::HBONE_MTLS_PORT`).
    #[serde(default)]
    #[cfg_attr(any(test, feature = "ts"), ts(as = "Option<u32>", optional))]
    pub hbone_mtls_port: u32,
}

/// A waypoint or network gateway: a workload or service by address, or a service (or workload) by hostname.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum GatewayDestination {
    Address(NetworkAddr),
    Hostname(ServiceKey),
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GatewayAddress {
    pub destination: GatewayDestination,
    pub hbone_mtls_port: u16,
}

impl GatewayAddressJson {
    /// The address this names; a port of 0 is Istio's default (`defaults::HBONE_MTLS_PORT`).
    pub fn parse(&self) -> Result<GatewayAddress, String> {
        let bad = || format!("{:?} is not <network>/<ip> or <namespace>/<hostname>", self.destination);
        let (head, rest) = self.destination.split_once('/').ok_or_else(bad)?;
        let destination = match rest.parse::<IpAddr>() {
            Ok(ip) => GatewayDestination::Address((head.to_string(), ip)),
            Err(_) if !head.is_empty() && !rest.is_empty() && !rest.contains('/') => {
                GatewayDestination::Hostname(ServiceKey::new(head, rest))
            }
            Err(_) => return Err(bad()),
        };
        let hbone_mtls_port = match self.hbone_mtls_port {
            0 => defaults::HBONE_MTLS_PORT,
            p => u16::try_from(p).map_err(|_| format!("port {p} is out of range"))?,
        };
        Ok(GatewayAddress { destination, hbone_mtls_port })
    }
}

impl GatewayAddress {
    /// As the control side writes one (`GatewayAddressJson`).
    pub fn to_json(&self) -> GatewayAddressJson {
        let destination = match &self.destination {
            GatewayDestination::Address((net, ip)) => format!("{net}/{ip}"),
            GatewayDestination::Hostname(k) => k.to_string(),
        };
        GatewayAddressJson { destination, hbone_mtls_port: u32::from(self.hbone_mtls_port) }
    }
}

#[derive(Debug, Clone, Deserialize, Serialize, Default)]
#[cfg_attr(any(test, feature = "ts"), derive(ts_rs::TS), ts(export, rename = "WeightedWaypoint"))]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct WeightedWaypointJson {
    pub waypoint: GatewayAddressJson,
    pub weight: u32,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize, Default)]
#[cfg_attr(any(test, feature = "ts"), derive(ts_rs::TS), ts(export))]
pub enum NetworkMode {
    #[default]
    Standard,
    /// Shares the node's IP: never indexed by IP.
    HostNetwork,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize, Default)]
#[cfg_attr(any(test, feature = "ts"), derive(ts_rs::TS), ts(export, rename = "ApplicationTunnelProtocol"))]
pub enum AppTunnelProtocol {
    #[default]
    #[serde(rename = "NONE")]
    None,
    #[serde(rename = "PROXY")]
    Proxy,
}

#[derive(Debug, Clone, Deserialize, Serialize, Default, PartialEq, Eq)]
#[cfg_attr(any(test, feature = "ts"), derive(ts_rs::TS), ts(export))]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct ApplicationTunnel {
    pub protocol: AppTunnelProtocol,
    /// None, null or 0: the workload's own port (as WDS's 0 is read).
    #[serde(deserialize_with = "zero_is_none")]
    pub port: Option<u16>,
}

fn zero_is_none<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<u16>, D::Error> {
    Ok(Option::<u16>::deserialize(d)?.filter(|p| *p != 0))
}

/// Load balancing scopes, in the order a service lists them (`routingPreferences`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize)]
#[cfg_attr(any(test, feature = "ts"), derive(ts_rs::TS), ts(export, rename = "RoutingPreference"))]
pub enum LbScope {
    Region,
    Zone,
    Subzone,
    Node,
    Cluster,
    Network,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize, Default)]
#[cfg_attr(any(test, feature = "ts"), derive(ts_rs::TS), ts(export, rename = "LoadBalancerMode"))]
pub enum LbMode {
    /// Every endpoint (UNSPECIFIED_MODE).
    #[default]
    Standard,
    /// Only endpoints matching every routing preference.
    Strict,
    /// The endpoints matching the most consecutive routing preferences.
    Failover,
    /// The original destination, not an endpoint.
    Passthrough,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize, Default)]
#[cfg_attr(any(test, feature = "ts"), derive(ts_rs::TS), ts(export))]
pub enum HealthPolicy {
    #[default]
    OnlyHealthy,
    AllowAll,
}

#[derive(Debug, Clone, Deserialize, Serialize, Default, PartialEq, Eq)]
#[cfg_attr(any(test, feature = "ts"), derive(ts_rs::TS), ts(export))]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct LoadBalancer {
    pub routing_preferences: Vec<LbScope>,
    pub mode: LbMode,
    pub health_policy: HealthPolicy,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize)]
#[cfg_attr(any(test, feature = "ts"), derive(ts_rs::TS), ts(export))]
pub enum IpFamilies {
    Dual,
    IPv4,
    IPv6,
}

impl IpFamilies {
    pub fn accepts(self, ip: IpAddr) -> bool {
        match self {
            IpFamilies::Dual => true,
            IpFamilies::IPv4 => ip.is_ipv4(),
            IpFamilies::IPv6 => ip.is_ipv6(),
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize, Default)]
#[cfg_attr(any(test, feature = "ts"), derive(ts_rs::TS), ts(export))]
pub enum Visibility {
    #[default]
    Public,
    /// Only resolvable from the service's own namespace.
    Namespace,
}

#[derive(Debug, Clone, Deserialize, Default)]
#[cfg_attr(any(test, feature = "ts"), derive(ts_rs::TS), ts(export))]
#[serde(rename_all = "camelCase", default)]
pub struct StateDelta {
    /// true: replace the whole state with what follows.
    #[cfg_attr(any(test, feature = "ts"), ts(as = "Option<bool>", optional))]
    pub full: bool,
    #[cfg_attr(any(test, feature = "ts"), ts(as = "Option<Vec<super::dump::WorkloadFull<'static>>>", optional))]
    pub workloads: Vec<Workload>,
    /// Workload uids.
    #[cfg_attr(any(test, feature = "ts"), ts(as = "Option<Vec<String>>", optional))]
    pub removed_workloads: Vec<String>,
    #[cfg_attr(any(test, feature = "ts"), ts(as = "Option<Vec<Service>>", optional))]
    pub services: Vec<Service>,
    /// "namespace/hostname"
    #[cfg_attr(any(test, feature = "ts"), ts(as = "Option<Vec<String>>", optional))]
    pub removed_services: Vec<String>,
    /// Compiled authorization policies (ts/policy/compile.ts), upserts by namespace/name.
    #[cfg_attr(any(test, feature = "ts"), ts(as = "Option<Vec<super::policy::PolicyJson>>", optional))]
    pub policies: Vec<super::policy::PolicyJson>,
    /// "namespace/name"
    #[cfg_attr(any(test, feature = "ts"), ts(as = "Option<Vec<String>>", optional))]
    pub removed_policies: Vec<String>,
}

/// A delta whose every resource validated.
#[derive(Debug, Default)]
pub struct ValidDelta {
    pub full: bool,
    pub workloads: Vec<Workload>,
    pub removed_workloads: Vec<String>,
    pub services: Vec<Service>,
    pub removed_services: Vec<String>,
    pub policies: Vec<super::policy::Policy>,
    pub removed_policies: Vec<String>,
}

impl ValidDelta {
    /// Adds `other` to this delta (the chunks of one local config load, applied as one).
    pub fn absorb(&mut self, other: ValidDelta) {
        self.full |= other.full;
        self.workloads.extend(other.workloads);
        self.removed_workloads.extend(other.removed_workloads);
        self.services.extend(other.services);
        self.removed_services.extend(other.removed_services);
        self.policies.extend(other.policies);
        self.removed_policies.extend(other.removed_policies);
    }

    /// The removals of workloads and services this delta does not also upsert, taken out of it `n` at a time (a
    /// large batch applies them with the state lock released between parts: `Dataplane::apply_valid`). A removal of a
    /// key the delta upserts stays in it, so that key changes once (the upsert wins, as in one batch).
    pub fn take_removal_chunks(&mut self, n: usize) -> Vec<ValidDelta> {
        let upserted_uids: std::collections::HashSet<&str> = self.workloads.iter().map(|w| &*w.uid).collect();
        let upserted_services: std::collections::HashSet<ServiceKey> = self.services.iter().map(|s| s.key()).collect();
        let (workloads, kept): (Vec<String>, Vec<String>) =
            std::mem::take(&mut self.removed_workloads).into_iter().partition(|u| !upserted_uids.contains(u.as_str()));
        self.removed_workloads = kept;
        let (services, kept): (Vec<String>, Vec<String>) = std::mem::take(&mut self.removed_services)
            .into_iter()
            .partition(|k| ServiceKey::parse(k).is_none_or(|k| !upserted_services.contains(&k)));
        self.removed_services = kept;
        let mut parts = Vec::new();
        for chunk in workloads.chunks(n.max(1)) {
            parts.push(ValidDelta { removed_workloads: chunk.to_vec(), ..ValidDelta::default() });
        }
        for chunk in services.chunks(n.max(1)) {
            parts.push(ValidDelta { removed_services: chunk.to_vec(), ..ValidDelta::default() });
        }
        parts
    }
}

/// A workload: the one record type of the mesh. Read from a JSON delta (the control side's camelCase form: what
/// this derives), built by the WDS decoder (wds.rs) and the local file's reader (local.rs), checked and completed by
/// `validate` (Istio's defaults, `defaults`), held by the state, and written out by config_dump's views
/// (dump.rs: `WorkloadFull`, the form it is read in, and `WorkloadDump`, ztunnel's). Its keys are in ztunnel's
/// config_dump order, a default value left out as ztunnel does; the views add `services` and `capacity`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(any(test, feature = "ts"), derive(ts_rs::TS), ts(export, rename = "WorkloadRecord"))]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Workload {
    /// Shared by the state's indexes (not interned: unique).
    #[serde(deserialize_with = "unique")]
    #[cfg_attr(any(test, feature = "ts"), ts(as = "String"))]
    pub uid: Str,
    #[serde(default, rename = "workloadIps", deserialize_with = "ips_serde")]
    #[cfg_attr(any(test, feature = "ts"), ts(as = "Vec<String>"))]
    pub ips: Vec<IpAddr>,
    /// Boxed: most workloads have neither, and an inline address costs 64 bytes each.
    #[serde(default, skip_serializing_if = "Option::is_none", with = "gateway_serde")]
    #[cfg_attr(any(test, feature = "ts"), ts(as = "Option<GatewayAddressJson>", optional = nullable))]
    pub waypoint: Option<Box<GatewayAddress>>,
    #[serde(default, skip_serializing_if = "Option::is_none", with = "gateway_serde")]
    #[cfg_attr(any(test, feature = "ts"), ts(as = "Option<GatewayAddressJson>", optional = nullable))]
    pub network_gateway: Option<Box<GatewayAddress>>,
    #[serde(default)]
    pub protocol: Protocol,
    /// HostNetwork workloads share the node's IP and are not found by it.
    #[serde(default)]
    pub network_mode: NetworkMode,
    /// Shared with the (namespace, name) index (not interned: nearly unique).
    #[serde(deserialize_with = "unique")]
    #[cfg_attr(any(test, feature = "ts"), ts(as = "String"))]
    pub name: Str,
    #[cfg_attr(any(test, feature = "ts"), ts(as = "String"))]
    pub namespace: Str,
    /// Never empty once valid (Istio's default).
    #[serde(default, skip_serializing_if = "str_empty")]
    #[cfg_attr(any(test, feature = "ts"), ts(as = "String"))]
    pub trust_domain: Str,
    /// Never empty once valid (Istio's default).
    #[serde(default, skip_serializing_if = "str_empty")]
    #[cfg_attr(any(test, feature = "ts"), ts(as = "String"))]
    pub service_account: Str,
    #[serde(default, skip_serializing_if = "str_empty")]
    #[cfg_attr(any(test, feature = "ts"), ts(as = "Option<String>", optional))]
    pub network: Str,
    #[serde(default, skip_serializing_if = "str_empty")]
    #[cfg_attr(any(test, feature = "ts"), ts(as = "Option<String>", optional))]
    pub workload_name: Str,
    /// "deployment", "cronjob", "pod" or "job"; never empty once valid (Istio's default).
    #[serde(default, deserialize_with = "workload_type_serde", skip_serializing_if = "str_empty")]
    #[cfg_attr(any(test, feature = "ts"), ts(as = "String"))]
    pub workload_type: Str,
    #[serde(default, skip_serializing_if = "str_empty")]
    #[cfg_attr(any(test, feature = "ts"), ts(as = "Option<String>", optional))]
    pub canonical_name: Str,
    #[serde(default, skip_serializing_if = "str_empty")]
    #[cfg_attr(any(test, feature = "ts"), ts(as = "Option<String>", optional))]
    pub canonical_revision: Str,
    #[serde(default, skip_serializing_if = "str_empty")]
    #[cfg_attr(any(test, feature = "ts"), ts(as = "Option<String>", optional))]
    pub hostname: Str,
    #[serde(default, skip_serializing_if = "str_empty")]
    #[cfg_attr(any(test, feature = "ts"), ts(as = "Option<String>", optional))]
    pub node: Str,
    #[serde(default, skip_serializing_if = "is_false")]
    #[cfg_attr(any(test, feature = "ts"), ts(as = "Option<bool>", optional))]
    pub native_tunnel: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(any(test, feature = "ts"), ts(optional = nullable))]
    pub application_tunnel: Option<ApplicationTunnel>,
    /// "namespace/name" of each policy selecting this workload.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[cfg_attr(any(test, feature = "ts"), ts(as = "Option<Vec<String>>", optional))]
    pub authorization_policies: Vec<Str>,
    #[serde(default)]
    pub status: WorkloadStatus,
    #[cfg_attr(any(test, feature = "ts"), ts(as = "String"))]
    #[serde(default)]
    pub cluster_id: Str,
    #[serde(default, skip_serializing_if = "is_default")]
    #[cfg_attr(any(test, feature = "ts"), ts(as = "Option<Locality>", optional))]
    pub locality: Locality,
    /// service → (service port → target port) for this endpoint: "namespace/hostname" → { "<service port>": target
    /// port } as read. Written by the views (config_dump lists only the keys).
    #[serde(default, rename = "services", skip_serializing, deserialize_with = "service_ports_serde")]
    #[cfg_attr(any(test, feature = "ts"), ts(skip))]
    pub service_ports: Vec<(ServiceKey, PortMap)>,
    /// Load-balancing weight; null (or absent) is 1. Written by the views.
    #[serde(default = "defaults::capacity", skip_serializing, deserialize_with = "capacity_serde")]
    #[cfg_attr(any(test, feature = "ts"), ts(skip))]
    pub capacity: u32,
}

impl Default for Workload {
    fn default() -> Workload {
        Workload {
            uid: Str::default(),
            ips: Vec::new(),
            waypoint: None,
            network_gateway: None,
            protocol: Protocol::default(),
            network_mode: NetworkMode::default(),
            name: Str::default(),
            namespace: Str::default(),
            trust_domain: Str::default(),
            service_account: Str::default(),
            network: Str::default(),
            workload_name: Str::default(),
            workload_type: Str::default(),
            canonical_name: Str::default(),
            canonical_revision: Str::default(),
            hostname: Str::default(),
            node: Str::default(),
            native_tunnel: false,
            application_tunnel: None,
            authorization_policies: Vec::new(),
            status: WorkloadStatus::default(),
            cluster_id: Str::default(),
            locality: Locality::default(),
            service_ports: Vec::new(),
            capacity: defaults::CAPACITY,
        }
    }
}

fn str_empty(s: &Str) -> bool {
    s.is_empty()
}

pub(super) fn is_false(b: &bool) -> bool {
    !*b
}

fn is_default<T: Default + PartialEq>(v: &T) -> bool {
    *v == T::default()
}

/// A string kept as its own copy (not interned): for values nearly unique to a record.
fn unique<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Str, D::Error> {
    read_str(d, |s| Ok(Str::from(s)))
}

fn capacity_serde<'de, D: serde::Deserializer<'de>>(d: D) -> Result<u32, D::Error> {
    Ok(Option::<u32>::deserialize(d)?.unwrap_or(defaults::CAPACITY))
}

/// A waypoint or network gateway in its JSON form, `GatewayAddressJson`.
mod gateway_serde {
    use super::{GatewayAddress, GatewayAddressJson};
    use serde::{Deserialize, Deserializer, Serialize, Serializer};

    pub fn serialize<S: Serializer>(g: &Option<Box<GatewayAddress>>, s: S) -> Result<S::Ok, S::Error> {
        g.as_ref().map(|g| g.to_json()).serialize(s)
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Box<GatewayAddress>>, D::Error> {
        let Some(json) = Option::<GatewayAddressJson>::deserialize(d)? else { return Ok(None) };
        json.parse().map(|g| Some(Box::new(g))).map_err(serde::de::Error::custom)
    }
}

/// "namespace/hostname" → { "<service port>": target port }.
fn service_ports_serde<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Vec<(ServiceKey, PortMap)>, D::Error> {
    struct Ports(Vec<(u16, u16)>);
    impl<'de> Deserialize<'de> for Ports {
        fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Ports, D::Error> {
            port_pairs(d).map(Ports)
        }
    }
    let written: Vec<(std::borrow::Cow<'de, str>, Ports)> =
        d.deserialize_map(PairsVisitor(std::marker::PhantomData))?;
    let mut out: Vec<(ServiceKey, PortMap)> = Vec::with_capacity(written.len());
    for (k, Ports(pairs)) in written {
        let key = ServiceKey::parse(&k)
            .filter(|k| !k.hostname.contains('/'))
            .ok_or_else(|| serde::de::Error::custom(format!("{k:?} is not <namespace>/<hostname>")))?;
        if out.iter().any(|(seen, _)| *seen == key) {
            return Err(serde::de::Error::custom(format!("the service {k:?} is given twice")));
        }
        out.push((key, PortMap::new(pairs)));
    }
    Ok(out)
}

/// A list of values each read from its text (a bad one is named by its index: `workloadIps[1]`).
fn each<'de, D: serde::Deserializer<'de>, T>(d: D, read: fn(&str) -> Result<T, String>) -> Result<Vec<T>, D::Error> {
    struct Item<T>(T);
    struct Seed<T>(fn(&str) -> Result<T, String>);
    impl<'de, T> serde::de::DeserializeSeed<'de> for Seed<T> {
        type Value = Item<T>;
        fn deserialize<D: serde::Deserializer<'de>>(self, d: D) -> Result<Item<T>, D::Error> {
            read_str(d, self.0).map(Item)
        }
    }
    struct List<T>(fn(&str) -> Result<T, String>);
    impl<'de, T> serde::de::Visitor<'de> for List<T> {
        type Value = Vec<T>;
        fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str("a list")
        }
        fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut seq: A) -> Result<Vec<T>, A::Error> {
            let mut out = Vec::with_capacity(seq.size_hint().unwrap_or(0).min(64));
            while let Some(Item(v)) = seq.next_element_seed(Seed(self.0))? {
                out.push(v);
            }
            Ok(exact(out))
        }
    }
    d.deserialize_seq(List(read))
}

fn ips_serde<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Vec<IpAddr>, D::Error> {
    each(d, |s| s.parse().map_err(|_| format!("{s:?} is not an IP address")))
}

/// One of `defaults::WORKLOAD_TYPES` in any case (Kubernetes' kinds are capitalized), held in lower case.
fn workload_type_serde<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Str, D::Error> {
    read_str(d, |written| {
        let lower = written.to_ascii_lowercase();
        match written.is_empty() || defaults::WORKLOAD_TYPES.contains(&lower.as_str()) {
            true => Ok(intern(&lower)),
            false => Err(format!("{written:?} is not one of {} (any case)", defaults::WORKLOAD_TYPES.join("|"))),
        }
    })
}

impl Workload {
    /// A Kubernetes pod (its uid names the Pod kind): wins an IP shared with other kinds of workload.
    pub fn is_pod(&self) -> bool {
        self.uid.contains("//Pod/")
    }

    pub fn identity(&self) -> Identity {
        Identity::new(&self.trust_domain, &self.namespace, &self.service_account)
    }
}

/// A service: the one record type of the mesh's services, as `Workload` is of its workloads. Read from a JSON delta
/// or a local document (its serde shape, strict: an unknown key is refused), built by the WDS decoder (wds.rs),
/// checked and completed by `validate`, held by the state, and written out: as it is read (the hand-back and
/// config_dump's `staticConfig`) and, with its endpoints from the state, as config_dump's service
/// (`dump::ServiceDump`). Its keys are in ztunnel's config_dump order; a default value is left out as ztunnel does
/// (`visibility` always, as ztunnel shows `Public`; `cidrVips`, `weightedWaypoints` and `canonical`, which ztunnel's
/// dump lacks, only when set).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(any(test, feature = "ts"), derive(ts_rs::TS), ts(export))]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Service {
    pub name: String,
    #[cfg_attr(any(test, feature = "ts"), ts(as = "String"))]
    pub namespace: Str,
    #[serde(deserialize_with = "unique")]
    #[cfg_attr(any(test, feature = "ts"), ts(as = "String"))]
    pub hostname: Str,
    /// "<network>/<ip>"
    #[serde(default, with = "vips_serde")]
    #[cfg_attr(any(test, feature = "ts"), ts(as = "Option<Vec<String>>", optional))]
    pub vips: Vec<NetworkAddr>,
    /// CIDR VIPs (a whole range addresses the service): (network, range); "<network>/<ip>/<prefix>", or a bare
    /// CIDR for network "".
    #[serde(default, skip_serializing_if = "Vec::is_empty", with = "cidr_vips_serde")]
    #[cfg_attr(any(test, feature = "ts"), ts(as = "Option<Vec<String>>", optional))]
    pub cidr_vips: Vec<(String, super::policy::Cidr)>,
    /// service port → target port (0: not set here; each endpoint's own port map must name the port).
    #[serde(default, with = "ports_serde")]
    #[cfg_attr(any(test, feature = "ts"), ts(as = "Option<HashMap<String, u32>>", optional))]
    pub ports: HashMap<u16, u16>,
    /// The SANs as istiod sent them (config_dump shows them all, as ztunnel does).
    #[serde(default, rename = "subjectAltNames")]
    #[cfg_attr(any(test, feature = "ts"), ts(as = "Option<Vec<String>>", optional))]
    pub subject_alt_names_given: Vec<String>,
    /// The SPIFFE identities among the SANs (what a TLS peer is checked against): made by `validate`.
    #[serde(skip)]
    #[cfg_attr(any(test, feature = "ts"), ts(skip))]
    pub subject_alt_names: Vec<Identity>,
    #[serde(default, skip_serializing_if = "Option::is_none", with = "gateway_serde")]
    #[cfg_attr(any(test, feature = "ts"), ts(as = "Option<GatewayAddressJson>", optional = nullable))]
    pub waypoint: Option<Box<GatewayAddress>>,
    /// Waypoints sharing the traffic by weight (a weight of 0 is described but gets none); all zero → `waypoint`.
    #[serde(default, skip_serializing_if = "Vec::is_empty", with = "weighted_serde")]
    #[cfg_attr(any(test, feature = "ts"), ts(as = "Option<Vec<WeightedWaypointJson>>", optional))]
    pub weighted_waypoints: Vec<(GatewayAddress, u32)>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(any(test, feature = "ts"), ts(optional = nullable))]
    pub load_balancer: Option<LoadBalancer>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(any(test, feature = "ts"), ts(optional = nullable))]
    pub ip_families: Option<IpFamilies>,
    /// Wins a VIP or hostname shared with services of other namespaces. Always written, as ztunnel writes it.
    #[serde(default)]
    #[cfg_attr(any(test, feature = "ts"), ts(as = "Option<bool>", optional))]
    pub canonical: bool,
    /// null (or absent) is `Public`.
    #[serde(default, deserialize_with = "null_default")]
    #[cfg_attr(any(test, feature = "ts"), ts(as = "Option<Visibility>", optional = nullable))]
    pub visibility: Visibility,
}

impl Service {
    pub fn key(&self) -> ServiceKey {
        ServiceKey { namespace: self.namespace.clone(), hostname: self.hostname.clone() }
    }
}

fn null_default<'de, D: serde::Deserializer<'de>, T: Default + Deserialize<'de>>(d: D) -> Result<T, D::Error> {
    Ok(Option::<T>::deserialize(d)?.unwrap_or_default())
}

/// "<network>/<ip>" (the network may be empty: "/10.0.0.1").
mod vips_serde {
    use super::NetworkAddr;
    use serde::{Deserializer, Serializer};
    use std::net::IpAddr;

    pub fn serialize<S: Serializer>(vips: &[NetworkAddr], s: S) -> Result<S::Ok, S::Error> {
        s.collect_seq(vips.iter().map(|(net, ip)| format!("{net}/{ip}")))
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<NetworkAddr>, D::Error> {
        super::each(d, |v| match v.split_once('/').map(|(net, ip)| (net, ip.parse::<IpAddr>())) {
            Some((net, Ok(ip))) => Ok((net.to_string(), ip)),
            _ => Err(format!("{v:?} is not <network>/<ip> (e.g. \"/10.0.0.1\")")),
        })
    }
}

/// "<network>/<ip>/<prefix>", or a bare CIDR for network "".
mod cidr_vips_serde {
    use super::super::policy::Cidr;
    use serde::{Deserializer, Serializer};

    pub fn serialize<S: Serializer>(cidrs: &[(String, Cidr)], s: S) -> Result<S::Ok, S::Error> {
        s.collect_seq(cidrs.iter().map(|(net, c)| format!("{net}/{}/{}", c.addr, c.prefix)))
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<(String, Cidr)>, D::Error> {
        super::each(d, |v| {
            // "10.0.0.0/8" alone has no network; "net/10.0.0.0/8" has one.
            let (net, range) = match v.matches('/').count() {
                1 => ("", v),
                _ => v.split_once('/').unwrap_or(("", v)),
            };
            match Cidr::parse(range).filter(|_| range.contains('/')) {
                Some(c) => Ok((net.to_string(), c)),
                None => Err(format!("{v:?} is not a CIDR (e.g. 10.0.0.0/24 or net/10.0.0.0/24)")),
            }
        })
    }
}

/// "<service port>" (1-65535) → target port (0-65535), written with the ports in ascending order.
mod ports_serde {
    use serde::{Deserializer, Serializer};
    use std::collections::HashMap;

    pub fn serialize<S: Serializer>(ports: &HashMap<u16, u16>, s: S) -> Result<S::Ok, S::Error> {
        serde::Serialize::serialize(&super::PortsJson::of(ports), s)
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<HashMap<u16, u16>, D::Error> {
        Ok(super::port_pairs(d)?.into_iter().collect())
    }
}

/// A port map as it is written: `{ "<port>": target }`, the ports in ascending order (as numbers: 80 before 443).
pub struct PortsJson<'a>(Vec<(&'a u16, &'a u16)>);

impl<'a> PortsJson<'a> {
    pub fn of(m: impl IntoIterator<Item = (&'a u16, &'a u16)>) -> PortsJson<'a> {
        let mut sorted: Vec<_> = m.into_iter().collect();
        sorted.sort_unstable();
        PortsJson(sorted)
    }
}

impl Serialize for PortsJson<'_> {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_map(self.0.iter().map(|(k, v)| (k.to_string(), **v)))
    }
}

/// A port map as written: `{ "<port 1-65535>": <target 0-65535> }`.
fn port_pairs<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Vec<(u16, u16)>, D::Error> {
    let m: Vec<(std::borrow::Cow<'de, str>, u32)> = d.deserialize_map(PairsVisitor(std::marker::PhantomData))?;
    m.into_iter()
        .map(|(k, t)| {
            let port = match k.parse::<u16>() {
                Ok(p) if p >= 1 && k.len() <= 5 && k.bytes().all(|b| b.is_ascii_digit()) => p,
                _ => return Err(format!("{k:?} is not a port (1-65535)")),
            };
            let target = u16::try_from(t).map_err(|_| format!("{t} is not a port (0-65535)"))?;
            Ok((port, target))
        })
        .collect::<Result<Vec<_>, String>>()
        .map_err(serde::de::Error::custom)
}

/// A mapping read as its (key, value) pairs in order (a key given twice is then seen, not overwritten).
struct PairsVisitor<K, V>(std::marker::PhantomData<(K, V)>);

impl<'de, K: Deserialize<'de>, V: Deserialize<'de>> serde::de::Visitor<'de> for PairsVisitor<K, V> {
    type Value = Vec<(K, V)>;

    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("a mapping")
    }

    fn visit_map<A: serde::de::MapAccess<'de>>(self, mut m: A) -> Result<Self::Value, A::Error> {
        let mut out = Vec::with_capacity(m.size_hint().unwrap_or(0));
        while let Some(kv) = m.next_entry()? {
            out.push(kv);
        }
        Ok(out)
    }
}

/// `[{ waypoint, weight }]`
mod weighted_serde {
    use super::{GatewayAddress, WeightedWaypointJson};
    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(w: &[(GatewayAddress, u32)], s: S) -> Result<S::Ok, S::Error> {
        s.collect_seq(w.iter().map(|(g, weight)| WeightedWaypointJson { waypoint: g.to_json(), weight: *weight }))
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<(GatewayAddress, u32)>, D::Error> {
        Vec::<WeightedWaypointJson>::deserialize(d)?
            .into_iter()
            .map(|w| Ok((w.waypoint.parse().map_err(serde::de::Error::custom)?, w.weight)))
            .collect()
    }
}

/// Istio's defaults for a workload record, the one table: a record from any source (WDS, `wds.rs`; a JSON delta or
/// the local file, whose schema is the record's serde shape) is completed by `Workload::validate` from here. An
/// empty string or absent field means "not said".
pub mod defaults {
    pub const TRUST_DOMAIN: &str = "cluster.local";
    pub const SERVICE_ACCOUNT: &str = "default";
    /// The workload types, in the wire's order (WorkloadType 0, 1, 2, 3).
    pub const WORKLOAD_TYPES: [&str; 4] = ["deployment", "cronjob", "pod", "job"];
    /// WorkloadType 0 on the wire.
    pub const WORKLOAD_TYPE: &str = WORKLOAD_TYPES[0];
    /// An absent capacity (the wire's UInt32Value wrapper lets istiod say 0 explicitly).
    pub const CAPACITY: u32 = 1;
    /// `CAPACITY`, for serde's `default = "..."`.
    pub fn capacity() -> u32 {
        CAPACITY
    }
    /// A gateway or waypoint address whose hbone_mtls_port is 0.
    pub const HBONE_MTLS_PORT: u16 = crate::HBONE_PORT;
}

/// A kept list at its exact length. Collecting through a `Result` or a filter starts a Vec at four elements (the
/// iterator's lower bound is 0), so a one-address workload held 4 IPs' and 4 service entries' worth of heap: about
/// 19 MiB at 100k workloads.
fn exact<T>(mut v: Vec<T>) -> Vec<T> {
    v.shrink_to_fit();
    v
}

/// A value that ends up in an HTTP header (baggage, forwarded, x-forwarded-network) or in a SPIFFE identity:
/// printable ASCII without spaces and without the separators of those formats (`,` `;` `=` `"` `\\`). Kubernetes
/// names and label values always are; anything else would break the header (or, with `,k8s.namespace.name=...`,
/// forge another baggage key at the peer), so it is refused when the record is accepted, not met on a connection.
/// A value that becomes one segment of a SPIFFE identity (`spiffe://<td>/ns/<ns>/sa/<sa>`) or of a
/// `<namespace>/<hostname>` key: a '/' would make it two.
pub fn segment_safe(field: &str, v: &str) -> Result<(), String> {
    match v.contains('/') {
        false => Ok(()),
        true => Err(format!(
            "{field}: {v:?} has the character \"/\", which cannot go into an identity or a namespace/hostname key"
        )),
    }
}

pub fn header_safe(field: &str, v: &str) -> Result<(), String> {
    match v.bytes().find(|b| !(0x21..=0x7e).contains(b) || b",;=\"\\".contains(b)) {
        None => Ok(()),
        Some(b) => Err(format!(
            "{field}: {v:?} has the character {:?}, which cannot go into a header",
            (b as char).to_string()
        )),
    }
}

impl Workload {
    /// Checks what every source must hold to (values that go into headers and identities) and completes the record:
    /// Istio's defaults for what it leaves empty, lists at their exact length.
    pub fn validate(mut self) -> Result<Workload, StateError> {
        if self.uid.is_empty() {
            return Err(StateError::Invalid {
                what: "workload",
                name: self.name.to_string(),
                problem: "uid is empty".into(),
            });
        }
        let bad = |problem: String| StateError::Invalid { what: "workload", name: self.uid.to_string(), problem };
        for (field, v) in [
            ("namespace", &*self.namespace),
            ("serviceAccount", &self.service_account),
            ("trustDomain", &self.trust_domain),
            ("network", &self.network),
            ("workloadName", &self.workload_name),
            ("workloadType", &self.workload_type),
            ("canonicalName", &self.canonical_name),
            ("canonicalRevision", &self.canonical_revision),
            ("clusterId", &self.cluster_id),
            ("locality.region", &self.locality.region),
            ("locality.zone", &self.locality.zone),
            ("locality.subzone", &self.locality.subzone),
        ] {
            header_safe(field, v).map_err(bad)?;
        }
        for (field, v) in [
            ("namespace", &*self.namespace),
            ("serviceAccount", &self.service_account),
            ("trustDomain", &self.trust_domain),
        ] {
            segment_safe(field, v).map_err(bad)?;
        }
        // Istio's defaults for an empty field.
        for (v, d) in [
            (&mut self.service_account, defaults::SERVICE_ACCOUNT),
            (&mut self.trust_domain, defaults::TRUST_DOMAIN),
            (&mut self.workload_type, defaults::WORKLOAD_TYPE),
        ] {
            if v.is_empty() {
                *v = intern(d);
            }
        }
        self.ips.shrink_to_fit();
        self.service_ports.shrink_to_fit();
        self.authorization_policies.shrink_to_fit();
        Ok(self)
    }
}

impl Service {
    /// Checks what every source must hold to (values that go into headers and identities) and completes the record:
    /// the SPIFFE identities among its SANs (like ztunnel, a SAN that is not one is kept for config_dump, not fatal).
    pub fn validate(mut self) -> Result<Service, StateError> {
        let name = format!("{}/{}", self.namespace, self.hostname);
        let bad = |problem: String| StateError::Invalid { what: "service", name: name.clone(), problem };
        if self.namespace.is_empty() || self.hostname.is_empty() {
            return Err(bad("namespace and hostname are required".into()));
        }
        segment_safe("namespace", &self.namespace).map_err(bad)?;
        segment_safe("hostname", &self.hostname).map_err(bad)?;
        header_safe("namespace", &self.namespace).map_err(bad)?;
        header_safe("hostname", &self.hostname).map_err(bad)?;
        if let Some(p) = self.ports.keys().find(|p| **p == 0) {
            return Err(bad(format!("{p} is not a service port (1-65535)")));
        }
        self.subject_alt_names = exact(self.subject_alt_names_given.iter().filter_map(|s| s.parse().ok()).collect());
        self.vips.shrink_to_fit();
        self.cidr_vips.shrink_to_fit();
        self.subject_alt_names_given.shrink_to_fit();
        Ok(self)
    }
}

/// A record (or several) from JSON text; a field that cannot be read is named by its path.
pub fn from_json<T: serde::de::DeserializeOwned>(json: &[u8]) -> Result<T, StateError> {
    let d = &mut serde_json::Deserializer::from_slice(json);
    let value = serde_path_to_error::deserialize(&mut *d)
        .map_err(|e| StateError::Field { path: e.path().to_string(), error: e.into_inner() })?;
    d.end()?;
    Ok(value)
}

impl StateDelta {
    /// A delta from its JSON text; a field that cannot be read is named by its path in the delta
    /// (`INVALID_STATE: workloads[1].workloadIps[0]: invalid IP address syntax ...`).
    pub fn from_json(json: &[u8]) -> Result<StateDelta, StateError> {
        from_json(json)
    }

    /// Validate every resource; the delta applies whole or not at all.
    /// Validate every resource, without touching any state: the delta applies whole or not at all.
    pub fn validate(self) -> Result<ValidDelta, StateError> {
        let workloads = self.workloads.into_iter().map(Workload::validate).collect::<Result<Vec<_>, _>>()?;
        let services = self.services.into_iter().map(Service::validate).collect::<Result<Vec<_>, _>>()?;
        let policies = self.policies.iter().map(super::policy::PolicyJson::validate).collect::<Result<Vec<_>, _>>()?;
        Ok(ValidDelta {
            full: self.full,
            workloads,
            removed_workloads: self.removed_workloads,
            services,
            removed_services: self.removed_services,
            policies,
            removed_policies: self.removed_policies,
        })
    }
}
