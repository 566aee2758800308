//! The mesh state rendered back in the control side's JSON shape: config_dump's `workloads`, `services` and
//! `stagedServices` (ztunnel's keys, in ztunnel's order), and the workload records a state change hands back to the
//! control side (the same shape as the `Workload` it sends, docs/native-api.md). The dataplane's state is the only
//! copy of the mesh (README "Architecture"), so this is the one place it is written out.

use std::collections::BTreeMap;

use serde::Serialize;

use super::intern::Str;
use super::model::{
    ApplicationTunnel, GatewayAddress, GatewayDestination, LoadBalancer, Locality, NetworkMode, Protocol, Service,
    ServiceKey, Visibility, Workload, WorkloadStatus,
};
use super::State;

/// "<network>/<ip>" or "<namespace>/<hostname>", as the control side writes a gateway's destination.
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
pub struct GatewayOut {
    destination: String,
    hbone_mtls_port: u16,
}

fn gateway(g: Option<&GatewayAddress>) -> Option<GatewayOut> {
    g.map(gateway_of)
}

fn gateway_of(g: &GatewayAddress) -> GatewayOut {
    let destination = match &g.destination {
        GatewayDestination::Address((net, ip)) => format!("{net}/{ip}"),
        GatewayDestination::Hostname(k) => k.to_string(),
    };
    GatewayOut { destination, hbone_mtls_port: g.hbone_mtls_port }
}

/// A port map with ports as keys in ascending order (JSON object keys are strings).
fn ports<'a>(m: impl IntoIterator<Item = (&'a u16, &'a u16)>) -> BTreeMap<String, u16> {
    let mut sorted: Vec<_> = m.into_iter().collect();
    sorted.sort();
    sorted.into_iter().map(|(k, v)| (k.to_string(), *v)).collect()
}

/// A workload, keys in config_dump's order.
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
pub struct WorkloadOut<'a> {
    uid: &'a str,
    workload_ips: Vec<String>,
    waypoint: Option<GatewayOut>,
    network_gateway: Option<GatewayOut>,
    protocol: Protocol,
    network_mode: NetworkMode,
    name: &'a str,
    namespace: &'a str,
    trust_domain: &'a str,
    service_account: &'a str,
    network: &'a str,
    workload_name: &'a str,
    workload_type: &'a str,
    canonical_name: &'a str,
    canonical_revision: &'a str,
    hostname: &'a str,
    node: &'a str,
    native_tunnel: bool,
    application_tunnel: &'a Option<ApplicationTunnel>,
    authorization_policies: &'a [Str],
    status: WorkloadStatus,
    cluster_id: &'a str,
    locality: &'a Locality,
    services: BTreeMap<String, BTreeMap<String, u16>>,
    capacity: u32,
}

pub fn workload(w: &Workload) -> WorkloadOut<'_> {
    WorkloadOut {
        uid: &w.uid,
        workload_ips: w.ips.iter().map(|ip| ip.to_string()).collect(),
        waypoint: gateway(w.waypoint.as_deref()),
        network_gateway: gateway(w.network_gateway.as_deref()),
        protocol: w.protocol,
        network_mode: w.network_mode,
        name: &w.name,
        namespace: &w.namespace,
        trust_domain: &w.trust_domain,
        service_account: &w.service_account,
        network: &w.network,
        workload_name: &w.workload_name,
        workload_type: &w.workload_type,
        canonical_name: &w.canonical_name,
        canonical_revision: &w.canonical_revision,
        hostname: &w.hostname,
        node: &w.node,
        native_tunnel: w.native_tunnel,
        application_tunnel: &w.application_tunnel,
        authorization_policies: &w.authorization_policies,
        status: w.status,
        cluster_id: &w.cluster_id,
        locality: &w.locality,
        services: w.service_ports.iter().map(|(k, m)| (k.to_string(), ports(m.iter()))).collect(),
        capacity: w.capacity,
    }
}

/// One endpoint of a service, keyed by workload uid in `endpoints` and `stagedServices`.
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
pub struct EndpointOut<'a> {
    workload_uid: &'a str,
    port: BTreeMap<String, u16>,
    status: WorkloadStatus,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
pub struct WeightedOut {
    waypoint: GatewayOut,
    weight: u32,
}

/// A service, keys in config_dump's order.
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ServiceOut<'a> {
    name: &'a str,
    namespace: &'a str,
    hostname: &'a str,
    vips: Vec<String>,
    cidr_vips: Vec<String>,
    ports: BTreeMap<String, u16>,
    endpoints: BTreeMap<&'a str, EndpointOut<'a>>,
    subject_alt_names: &'a [String],
    waypoint: Option<GatewayOut>,
    weighted_waypoints: Vec<WeightedOut>,
    load_balancer: &'a Option<LoadBalancer>,
    ip_families: Option<super::model::IpFamilies>,
    canonical: bool,
    visibility: Visibility,
}

fn endpoints<'a>(st: &'a State, key: &ServiceKey) -> BTreeMap<&'a str, EndpointOut<'a>> {
    st.endpoints(key)
        .map(|(w, p)| (&*w.uid, EndpointOut { workload_uid: &w.uid, port: ports(p.iter()), status: w.status }))
        .collect()
}

/// A service with its endpoints in `st` (none without a state).
pub fn service<'a>(st: Option<&'a State>, s: &'a Service) -> ServiceOut<'a> {
    ServiceOut {
        name: &s.name,
        namespace: &s.key.namespace,
        hostname: &s.key.hostname,
        vips: s.vips.iter().map(|(net, ip)| format!("{net}/{ip}")).collect(),
        cidr_vips: s.cidr_vips.iter().map(|(net, c)| format!("{net}/{}/{}", c.addr, c.prefix)).collect(),
        ports: ports(&s.ports),
        endpoints: st.map(|st| endpoints(st, &s.key)).unwrap_or_default(),
        subject_alt_names: &s.subject_alt_names_given,
        waypoint: gateway(s.waypoint.as_ref()),
        weighted_waypoints: s
            .weighted_waypoints
            .iter()
            .map(|(g, weight)| WeightedOut { waypoint: gateway_of(g), weight: *weight })
            .collect(),
        load_balancer: &s.load_balancer,
        ip_families: s.ip_families,
        canonical: s.canonical,
        visibility: s.visibility,
    }
}

/// config_dump's mesh part: `{ workloads, services, stagedServices }`. Workloads sorted by uid, services by hostname
/// then namespace; staged services are endpoints naming a service the state does not have (yet).
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
pub struct MeshDump<'a> {
    workloads: Vec<WorkloadOut<'a>>,
    services: Vec<ServiceOut<'a>>,
    staged_services: BTreeMap<String, BTreeMap<&'a str, EndpointOut<'a>>>,
}

pub fn mesh(st: &State) -> MeshDump<'_> {
    let mut ws: Vec<&Workload> = st.workloads.values().map(|w| w.as_ref()).collect();
    ws.sort_by(|a, b| a.uid.cmp(&b.uid));
    let mut ss: Vec<&Service> = st.services.values().map(|s| s.as_ref()).collect();
    ss.sort_by(|a, b| a.key.hostname.cmp(&b.key.hostname).then_with(|| a.key.namespace.cmp(&b.key.namespace)));
    let staged = st
        .endpoints
        .keys()
        .filter(|k| !st.services.contains_key(*k))
        .map(|k| (k.to_string(), endpoints(st, k)))
        .filter(|(_, eps)| !eps.is_empty())
        .collect();
    MeshDump {
        workloads: ws.into_iter().map(workload).collect(),
        services: ss.into_iter().map(|s| service(Some(st), s)).collect(),
        staged_services: staged,
    }
}

#[derive(Serialize)]
pub struct TransitionOut<'a> {
    uid: &'a str,
    before: Option<WorkloadOut<'a>>,
    after: Option<WorkloadOut<'a>>,
}

/// A policy reference that became unresolved.
#[derive(Serialize)]
pub struct MissingOut<'a> {
    uid: &'a str,
    policy: &'a str,
}

/// What one apply changed, for the control side: the transitions of workloads on this node (before or after: the
/// local-workload reconciler's input), how many workloads changed in all, the policy references it made missing
/// (warned of) and how many are missing in all, and the state's sizes. For a WDS batch, also the
/// (name, version) of each resource that applied and "<name>: <reason>" of each that did not.
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
pub struct AppliedOut<'a> {
    workloads: Vec<TransitionOut<'a>>,
    changed_workloads: usize,
    services: usize,
    policies: usize,
    /// [workloads, services, policies] held after the change.
    counts: [usize; 3],
    missing: Vec<MissingOut<'a>>,
    missing_references: usize,
    accepted: Vec<(String, String)>,
    rejected: Vec<String>,
}

pub fn applied<'a>(
    a: &'a super::Applied,
    node: &str,
    accepted: Vec<(String, String)>,
    rejected: Vec<String>,
    counts: [usize; 3],
    missing_references: usize,
) -> AppliedOut<'a> {
    let local = |w: &Option<std::sync::Arc<Workload>>| w.as_ref().is_some_and(|w| !node.is_empty() && w.node == node);
    let workloads = a
        .workloads
        .iter()
        .filter(|t| local(&t.before) || local(&t.after))
        .map(|t| TransitionOut {
            uid: &t.uid,
            before: t.before.as_deref().map(workload),
            after: t.after.as_deref().map(workload),
        })
        .collect();
    AppliedOut {
        missing: a.missing.iter().map(|(uid, policy)| MissingOut { uid, policy }).collect(),
        missing_references,
        workloads,
        changed_workloads: a.workloads.len(),
        services: a.services,
        policies: a.policies,
        counts,
        accepted,
        rejected,
    }
}
